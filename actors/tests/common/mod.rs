//! Shared by the actor integration tests: the store, router and (optionally) channels actors
//! in-process over real SQLite and a real Unix socket, and test clients playing the agents.
#![allow(dead_code)] // each test binary uses its own subset

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use flock_actors::RouterMsg;
use flock_actors::channels::{Channels, ChannelsArgs};
use flock_actors::messages::ChannelsMsg;
use flock_actors::{
    ConnKind, ConnLimits, Durability, Router, RouterArgs, Store, StoreActor, StoreMsg, serve,
};
use flock_ipc::{
    Body, Connection, DeliveryKind, Frame, Hello, PROTOCOL_VERSION, ROUTER, Transport,
    UnixTransport,
};
use flock_journal::Journal;
use ractor::{Actor, ActorRef};
use serde_json::Value;

pub struct Node {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub db: PathBuf,
    pub router: ActorRef<RouterMsg>,
    pub store: ActorRef<StoreMsg>,
    pub channels: Option<ActorRef<ChannelsMsg>>,
    /// This node's place among the swarm's hosts (with [`start_on`]).
    pub hosts: Option<flock_actors::router::HostLink>,
}

/// Starts the actors over the files in `dir` from the swarm file text `yaml` (a second start on
/// the same dir is a supervisor restart); `life` names the socket so lives do not collide.
pub async fn start(dir: &Path, life: u32, yaml: &str, with_channels: bool) -> Node {
    start_on(dir, life, yaml, with_channels, None).await
}

/// [`start`] as host `host` of a swarm across hosts (its agents only; the others' through a
/// [`flock_actors::router::HostLink`] no broker feeds: a test hands messages over itself).
pub async fn start_on(
    dir: &Path,
    life: u32,
    yaml: &str,
    with_channels: bool,
    host: Option<&str>,
) -> Node {
    let path = dir.join("swarm.yaml");
    std::fs::write(&path, yaml).unwrap();
    let whole = flock_config::load(&path).unwrap();
    let hosts = host.map(|h| flock_actors::router::HostLink::new(&whole, h));
    // The leader's channels know every host's agents (as `up` starts them).
    let elsewhere = match host {
        Some(h) if h == whole.leader() => whole.agents_elsewhere(h),
        _ => Vec::new(),
    };
    let taken: Vec<String> = host
        .map(|h| whole.agents_elsewhere(h).iter().map(|a| a.key()).collect())
        .unwrap_or_default();
    let spec = Arc::new(match host {
        Some(h) => whole.for_host(h).unwrap(),
        None => whole,
    });
    let db = dir.join("flock.db");
    let store = Store::open(&db, Durability::Normal).unwrap();
    let (store, _) = Actor::spawn(None, StoreActor, store).await.unwrap();
    let journal = Arc::new(Journal::open(dir.join("journal"), 1 << 20).unwrap());
    let channels = if with_channels {
        let args = ChannelsArgs {
            spec: spec.clone(),
            store: store.clone(),
            journal: Some(journal.clone()),
            agent_ops: None,
            elsewhere,
            taken,
        };
        Some(Actor::spawn(None, Channels, args).await.unwrap().0)
    } else {
        None
    };
    let liveness: HashMap<_, _> = spec.agents.iter().map(|a| (a.key(), Arc::default())).collect();
    let args = RouterArgs {
        operator_key: None,
        hosts: hosts.clone(),
        spec,
        store: store.clone(),
        events: Arc::new(|_| {}),
        control: Arc::new(|_| {}),
        liveness,
        channels: channels.clone(),
        gateway: None,
        journal: Some(flock_journal::JournalWriter::spawn(journal)),
        memory: Some(
            flock_actors::memory::MemoryService::start(dir.join("memory"), Default::default())
                .unwrap(),
        ),
        clock: Default::default(),
    };
    let (router, _) = Actor::spawn(None, Router, args).await.unwrap();
    if let Some(c) = &channels {
        c.cast(ChannelsMsg::SetRouter(router.clone())).unwrap();
    }
    let socket = dir.join(format!("router-{life}.sock"));
    let listener = UnixTransport::new(&socket).bind().unwrap();
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    let limits =
        ConnLimits { max_frame_bytes: 1 << 20, outbox_frames: 1024, uid, max_connections: 1024 };
    serve::<UnixTransport>(listener, ConnKind::Agent, router.clone(), limits);
    Node { dir: dir.to_path_buf(), socket, db, router, store, channels, hosts }
}

impl Node {
    /// Connects as agent `name` with a token the router was told to expect (as the supervisor
    /// does before a spawn).
    pub async fn agent(&self, name: &str) -> Connection {
        let token = format!("tok-{name}-{}", fastrand::u64(..));
        self.router.cast(RouterMsg::Expect { agent: name.into(), token: token.clone() }).unwrap();
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_id: name.into(),
            instance: "default".into(),
            pid: 1,
            token,
        };
        Connection::agent(&self.socket, hello, 1024).await.unwrap()
    }
}

/// The next frame that is not a heartbeat answer (5 s at most).
pub async fn next(conn: &mut Connection) -> Frame {
    loop {
        let f = tokio::time::timeout(Duration::from_secs(5), conn.reader.read_frame())
            .await
            .expect("a frame within 5 s")
            .unwrap()
            .expect("connection open");
        if !matches!(f.body, Body::HeartbeatAck) {
            return f;
        }
    }
}

/// A tool call from an agent connection; answers `Ok(json)` or `Err("CODE: msg")`.
pub async fn tool(conn: &mut Connection, name: &str, args: Value) -> Result<Value, String> {
    let content = tool_as(conn, flock_ipc::id::new_id(), name, args).await?;
    Ok(serde_json::from_str(&content).unwrap())
}

/// A tool call with its frame id chosen by the caller (as a hostile agent may); answers the
/// result's text or `Err("CODE: msg")`.
pub async fn tool_as(
    conn: &mut Connection,
    id: u128,
    name: &str,
    args: Value,
) -> Result<String, String> {
    let body = Body::ToolCall { name: name.into(), arguments: args.to_string() };
    let f = Frame { id, ..Frame::new("ignored", ROUTER, body) };
    conn.outbox.send(f).await.unwrap();
    loop {
        let r = next(conn).await;
        if r.correlation_id == Some(id) {
            return match r.body {
                Body::ToolResult { ok: true, content } => Ok(content),
                Body::ToolResult { ok: false, content } => Err(content),
                // Refused at the router (unknown tool, a role that may not call it).
                Body::Error { code, message } => Err(format!("{code}: {message}")),
                other => panic!("unexpected {other:?}"),
            };
        }
    }
}

/// The next delta delivered to `conn`.
pub async fn delta(conn: &mut Connection) -> (Frame, String) {
    loop {
        let f = next(conn).await;
        if let Body::Deliver(d) = &f.body
            && d.kind == DeliveryKind::Delta
        {
            let text = d.text.clone();
            return (f, text);
        }
    }
}

pub async fn nothing_for(conn: &mut Connection, ms: u64) {
    let r = tokio::time::timeout(Duration::from_millis(ms), conn.reader.read_frame()).await;
    assert!(r.is_err(), "expected silence, got {r:?}");
}

pub async fn ack(conn: &Connection, f: &Frame) {
    let ack =
        Frame { correlation_id: Some(f.id), ..Frame::new("x", ROUTER, Body::Ack { reply: None }) };
    conn.outbox.send(ack).await.unwrap();
}
