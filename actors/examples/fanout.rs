//! Channel post fan-out: time from `flock_channel_post` to the delta arriving at each of 20
//! member agents (real router, channels and store actors, real SQLite, real Unix sockets; test
//! clients play the agents and ack at once). DESIGN.md §14 target: delta enqueued for 20 members
//! p99 ≤ 5 ms without the configured delay — this measures further, to the agents' sockets.
//!
//! Run: `cargo run --release -p flock-actors --example fanout [-- --posts 300]`

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flock_actors::RouterMsg;
use flock_actors::channels::{Channels, ChannelsArgs};
use flock_actors::messages::ChannelsMsg;
use flock_actors::{
    ConnKind, ConnLimits, Durability, Router, RouterArgs, Store, StoreActor, serve,
};
use flock_ipc::{
    Body, Connection, DeliveryKind, Frame, Hello, PROTOCOL_VERSION, ROUTER, Transport,
    UnixTransport,
};
use ractor::Actor;

const MEMBERS: usize = 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let posts: usize = args
        .iter()
        .position(|a| a == "--posts")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut yaml = String::from(
        "swarm: {name: fanout}\nchannels: {delta_delay_min_ms: 0, delta_delay_max_ms: 0}\nmodels:\n  s: {provider: scripted, rules: [{reply: ok}]}\ndefaults: {model: s}\nagents:\n  - {name: orchestrator, role: orchestrator}\n",
    );
    for i in 0..MEMBERS {
        yaml.push_str(&format!("  - {{name: w{i}, role: worker}}\n"));
    }
    let path = dir.path().join("swarm.yaml");
    std::fs::write(&path, yaml).expect("write swarm");
    let spec = Arc::new(flock_config::load(&path).expect("valid swarm"));
    let store = Store::open(&dir.path().join("flock.db"), Durability::Normal).expect("store");
    let (store, _) = Actor::spawn(None, StoreActor, store).await.expect("store actor");
    let (channels, _) = Actor::spawn(
        None,
        Channels,
        ChannelsArgs {
            spec: spec.clone(),
            store: store.clone(),
            journal: None,
            agent_ops: None,
            elsewhere: Vec::new(),
            taken: Vec::new(),
        },
    )
    .await
    .expect("channels actor");
    let liveness: HashMap<_, _> = spec.agents.iter().map(|a| (a.key(), Arc::default())).collect();
    let (router, _) = Actor::spawn(
        None,
        Router,
        RouterArgs {
            operator_key: None,
            hosts: None,
            spec: spec.clone(),
            store,
            events: Arc::new(|_| {}),
            control: Arc::new(|_| {}),
            liveness,
            channels: Some(channels.clone()),
            gateway: None,
            journal: None,
            memory: None,
            clock: Default::default(),
        },
    )
    .await
    .expect("router");
    channels.cast(ChannelsMsg::SetRouter(router.clone())).expect("wire");
    let socket = dir.path().join("router.sock");
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("proc"));
    let limits =
        ConnLimits { max_frame_bytes: 1 << 20, outbox_frames: 4096, uid, max_connections: 4096 };
    serve::<UnixTransport>(
        UnixTransport::new(&socket).bind().expect("bind"),
        ConnKind::Agent,
        router.clone(),
        limits,
    );

    let connect = |name: String| {
        let router = router.clone();
        let socket = socket.clone();
        async move {
            let token = format!("t-{name}");
            router
                .cast(RouterMsg::Expect { agent: name.clone(), token: token.clone() })
                .expect("expect");
            let hello = Hello {
                protocol_version: PROTOCOL_VERSION,
                agent_id: name,
                instance: "default".into(),
                pid: 1,
                token,
            };
            Connection::agent(&socket, hello, 4096).await.expect("connect")
        }
    };
    let mut orch = connect("orchestrator".into()).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let members: Vec<String> = (0..MEMBERS).map(|i| format!("w{i}")).collect();
    for name in &members {
        let mut conn = connect(name.clone()).await;
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(f)) = conn.reader.read_frame().await {
                if let Body::Deliver(d) = &f.body
                    && d.kind == DeliveryKind::Delta
                {
                    let _ = tx.send(Instant::now());
                    let ack = Frame {
                        correlation_id: Some(f.id),
                        ..Frame::new("x", ROUTER, Body::Ack { reply: None })
                    };
                    let _ = conn.outbox.send(ack).await;
                }
            }
        });
    }
    let call = |conn: &Connection, name: &str, args: serde_json::Value| {
        let f = Frame::new(
            "x",
            ROUTER,
            Body::ToolCall { name: name.into(), arguments: args.to_string() },
        );
        let outbox = conn.outbox.clone();
        async move { outbox.send(f).await.expect("send") }
    };
    call(&orch, "flock_channel_create", serde_json::json!({"channel": "big", "members": members}))
        .await;
    let _ = orch.reader.read_frame().await;

    let mut first = Vec::with_capacity(posts);
    let mut last = Vec::with_capacity(posts);
    for i in 0..posts {
        let t0 = Instant::now();
        call(
            &orch,
            "flock_channel_post",
            serde_json::json!({"channel": "big", "text": format!("message {i}")}),
        )
        .await;
        let mut times = Vec::with_capacity(MEMBERS);
        while times.len() < MEMBERS {
            let t = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .expect("a delta within 5 s")
                .expect("open");
            times.push(t.duration_since(t0));
        }
        let _ = orch.reader.read_frame().await; // the post's own ToolResult
        times.sort();
        first.push(times[0]);
        last.push(times[MEMBERS - 1]);
        // Let each member's ack land before the next post, so every post is its own delta.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let pct = |v: &mut Vec<Duration>, p: f64| {
        v.sort();
        v[((v.len() as f64 - 1.0) * p).round() as usize].as_secs_f64() * 1e6
    };
    let (f50, f99) = (pct(&mut first, 0.5), pct(&mut first, 0.99));
    let (l50, l99) = (pct(&mut last, 0.5), pct(&mut last, 0.99));
    println!("fan-out of one post to {MEMBERS} members ({posts} posts, delay 0):");
    println!("  first member has its delta   p50 {f50:>7.0} µs   p99 {f99:>7.0} µs");
    println!(
        "  all {MEMBERS} members have it      p50 {l50:>7.0} µs   p99 {l99:>7.0} µs   (target: enqueued p99 ≤ 5 000 µs)"
    );
    println!(
        "{{\"members\":{MEMBERS},\"posts\":{posts},\"all_delivered_p50_us\":{l50:.0},\"all_delivered_p99_us\":{l99:.0},\"first_delivered_p50_us\":{f50:.0}}}"
    );
}
