//! `--only cluster` (issue #26): durable messages from an agent on one host to an agent on
//! another, through a real `nats-server -js` on loopback, beside the same messages on one host
//! and beside the engine's own limit on this machine — a bare JetStream publish-with-ack loop
//! (`flock-cluster`'s `Link::send`, one in flight, as the supervisor's outbox sends). Then
//! requests (`agents__request`) from an agent on one host to one on another, round trip, beside
//! the same on one host and a bare NATS request–reply loop (`Link::call` against a task that
//! answers at once).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use flock_cluster::{Link, Options};
use flock_testkit::nats::{Broker, server_bin};
use serde_json::{Map, Value, json};

use super::fixture::{Ctl, RunArgs, Swarm, bench_agent, f, latency, round3, swarm_yaml};
use crate::proto;

pub(super) async fn cluster(
    bins: &super::fixture::Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let Some(bin) = server_bin() else {
        bail!("--only cluster needs nats-server (Debian's package): run scripts/setup");
    };
    let n = args.cluster_count;
    let broker = Broker::start(&bin, &root.join("nats"), None);

    // The engine's limit: publish, wait for the stream's ack, next.
    let link = Link::connect(&Options::new(broker.url(), "bench-bare", "a")).await?;
    let payload = vec![b'x'; args.frame_bytes];
    let t = Instant::now();
    for i in 0..n {
        link.send("b", &format!("bare-{i}"), payload.clone()).await?;
    }
    let bare = n as f64 / t.elapsed().as_secs_f64();
    say!("cluster: bare JetStream publish-with-ack loop {bare:.0} msg/s");
    out.insert("cluster_bare_publish_msgs_per_sec".into(), json!(bare.round()));
    let bare_rtt = bare_calls(&broker, args.requests).await?;
    say!(
        "cluster: bare NATS request-reply p50 {:.1} µs, p99 {:.1} µs",
        f(&bare_rtt, "p50_us"),
        f(&bare_rtt, "p99_us")
    );
    latency(out, "cluster_bare_request_rtt", &bare_rtt);

    let agents = vec![
        ("sender".to_string(), bench_agent(bins, "sender")),
        ("dsink".to_string(), bench_agent(bins, "echo")),
        ("requester".to_string(), bench_agent(bins, "requester")),
        ("echo".to_string(), bench_agent(bins, "echo")),
    ];
    // The same messages on one host: accepted, delivered and acknowledged.
    let one = {
        let mut swarm =
            Swarm::start(bins, &root.join("cluster-one"), &swarm_yaml("bench-one", &agents))?;
        let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
        let r = run(args, &mut ctl, None, &swarm.workspace("sender"), n).await?;
        let rtt = requests(args, &mut ctl, &swarm.workspace("requester")).await?;
        swarm.down(Some(ctl)).await?;
        (r, rtt)
    };
    let (one, one_rtt) = one;
    say!("cluster: one host, delivered + acked {:.0} msg/s", f(&one, "delivered"));

    // Across hosts: the sender on `main`, the sink on `b`.
    let yaml = swarm_yaml("bench-cluster", &agents)
        .replace("agents:\n", &format!("cluster:\n  nats: \"{}\"\nagents:\n", broker.url()))
        .replace(
            "  - name: dsink\n    role: worker\n",
            "  - name: dsink\n    role: worker\n    host: b\n",
        )
        .replace(
            "  - name: echo\n    role: worker\n",
            "  - name: echo\n    role: worker\n    host: b\n",
        );
    let secret = [("FLOCK_CLUSTER_SECRET", "bench-cluster-secret")];
    let mut main = Swarm::start_with(bins, &root.join("cluster-main"), &yaml, &secret)?;
    let mut b = Swarm::start_full(bins, &root.join("cluster-b"), &yaml, &secret, &["--host", "b"])?;
    let (mut ctl_main, _) = main.wait_ready(2).await?;
    let (mut ctl_b, _) = b.wait_ready(2).await?;
    let across = run(args, &mut ctl_main, Some(&mut ctl_b), &main.workspace("sender"), n).await?;
    let across_rtt = requests(args, &mut ctl_main, &main.workspace("requester")).await?;
    main.down(Some(ctl_main)).await?;
    b.down(Some(ctl_b)).await?;
    say!(
        "cluster: across hosts, accepted {:.0} msg/s, delivered + acked {:.0} msg/s",
        f(&across, "accepted"),
        f(&across, "delivered")
    );

    say!(
        "cluster: request round trip across hosts p50 {:.1} µs, p99 {:.1} µs (one host: p50 {:.1} µs, p99 {:.1} µs)",
        f(&across_rtt, "p50_us"),
        f(&across_rtt, "p99_us"),
        f(&one_rtt, "p50_us"),
        f(&one_rtt, "p99_us")
    );
    latency(out, "cluster_request_rtt", &across_rtt);
    latency(out, "cluster_one_host_request_rtt", &one_rtt);
    out.insert("cluster_request_errors".into(), json!(f(&across_rtt, "errors")));
    out.insert("cluster_messages".into(), json!(n));
    out.insert(
        "cluster_one_host_delivered_msgs_per_sec".into(),
        json!(f(&one, "delivered").round()),
    );
    out.insert("cluster_accepted_msgs_per_sec".into(), json!(f(&across, "accepted").round()));
    out.insert("cluster_delivered_msgs_per_sec".into(), json!(f(&across, "delivered").round()));
    out.insert(
        "cluster_vs_bare_publish".into(),
        json!(round3(f(&across, "delivered") / bare.max(1.0))),
    );
    out.insert(
        "cluster_vs_one_host".into(),
        json!(round3(f(&across, "delivered") / f(&one, "delivered").max(1.0))),
    );
    drop(broker);
    Ok(())
}

/// `requester` asks `echo` `--requests` times, one at a time; its round trips.
async fn requests(args: &RunArgs, ctl: &mut Ctl, workspace: &Path) -> Result<Value> {
    ctl.send("requester", super::io::request_go(args)).await?;
    let path = workspace.join("requests.json");
    super::fixture::wait_result(&path, Duration::from_secs(300), || Ok(())).await
}

/// NATS request–reply alone: host `a` calls host `b`, whose task answers at once; `count`
/// round trips one at a time (after a tenth as warm-up).
async fn bare_calls(broker: &Broker, count: u64) -> Result<Value> {
    let a = Link::connect(&Options::new(broker.url(), "bench-calls", "a")).await?;
    let b = Link::connect(&Options::new(broker.url(), "bench-calls", "b")).await?;
    let mut calls = b.calls().await?;
    let server = tokio::spawn(async move {
        while let Some(call) = calls.next().await {
            let _ = call.answer(call.payload.clone()).await;
        }
    });
    let warm = (count / 10).max(1);
    let payload = vec![b'q'; 150];
    let mut ns = Vec::with_capacity(count as usize);
    for i in 0..warm + count {
        let t = Instant::now();
        a.call("b", &format!("c{i}"), payload.clone(), Duration::from_secs(5)).await?;
        if i >= warm {
            ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    server.abort();
    ns.sort_unstable();
    let at =
        |p: f64| ns[((ns.len() as f64 * p / 100.0) as usize).min(ns.len() - 1)] as f64 / 1000.0;
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1000.0;
    Ok(json!({
        "p50_us": at(50.0), "p90_us": at(90.0), "p99_us": at(99.0), "p999_us": at(99.9),
        "max_us": at(100.0), "mean_us": mean,
    }))
}

/// The sender sends `n` durable messages to `dsink`; returns `accepted` (the sender's rate) and
/// `delivered` (all `n` acknowledged by `dsink`, on `sink_ctl`'s host or else the sender's).
async fn run(
    args: &RunArgs,
    ctl: &mut Ctl,
    mut sink_ctl: Option<&mut Ctl>,
    sender_workspace: &Path,
    n: u64,
) -> Result<Value> {
    let go = proto::go(&[
        ("target", "dsink".into()),
        ("mode", "durable".into()),
        ("count", n.to_string()),
        ("warm", "0".into()),
        ("window", args.durable_window.to_string()),
        ("frame", args.frame_bytes.to_string()),
        ("out", "cluster.json".into()),
    ]);
    let t = Instant::now();
    ctl.send("sender", go).await?;
    let deadline = t + Duration::from_secs(300);
    loop {
        let sink = match sink_ctl.as_deref_mut() {
            Some(c) => c,
            None => &mut *ctl,
        };
        let rows = sink.ps().await?;
        let done = rows.iter().find(|r| r.name == "dsink").map_or(0, |r| r.turns_total);
        if done >= n {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {done} of {n} messages reached dsink within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let delivered = n as f64 / t.elapsed().as_secs_f64();
    let path = sender_workspace.join("cluster.json");
    let r = super::fixture::wait_result(&path, Duration::from_secs(30), || Ok(())).await?;
    Ok(json!({"accepted": f(&r, "msgs_per_sec"), "delivered": delivered}))
}
