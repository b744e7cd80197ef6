//! `--only cluster` (issue #26): durable messages from an agent on one host to an agent on
//! another, through a real `nats-server -js` on loopback, beside the same messages on one host
//! and beside the engine's own limit on this machine — a bare JetStream publish-with-ack loop
//! (`flock-cluster`'s `Link::send`, one in flight, as the supervisor's outbox sends).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use flock_cluster::{Link, Options};
use flock_testkit::nats::{Broker, server_bin};
use serde_json::{Map, Value, json};

use super::fixture::{Ctl, RunArgs, Swarm, bench_agent, f, round3, swarm_yaml};
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

    let agents = vec![
        ("sender".to_string(), bench_agent(bins, "sender")),
        ("dsink".to_string(), bench_agent(bins, "echo")),
    ];
    // The same messages on one host: accepted, delivered and acknowledged.
    let one = {
        let mut swarm =
            Swarm::start(bins, &root.join("cluster-one"), &swarm_yaml("bench-one", &agents))?;
        let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
        let r = run(args, &mut ctl, None, &swarm.workspace("sender"), n).await?;
        swarm.down(Some(ctl)).await?;
        r
    };
    say!("cluster: one host, delivered + acked {:.0} msg/s", f(&one, "delivered"));

    // Across hosts: the sender on `main`, the sink on `b`.
    let yaml = swarm_yaml("bench-cluster", &agents)
        .replace("agents:\n", &format!("cluster:\n  nats: \"{}\"\nagents:\n", broker.url()))
        .replace(
            "  - name: dsink\n    role: worker\n",
            "  - name: dsink\n    role: worker\n    host: b\n",
        );
    let secret = [("FLOCK_CLUSTER_SECRET", "bench-cluster-secret")];
    let mut main = Swarm::start_with(bins, &root.join("cluster-main"), &yaml, &secret)?;
    let mut b = Swarm::start_full(bins, &root.join("cluster-b"), &yaml, &secret, &["--host", "b"])?;
    let (mut ctl_main, _) = main.wait_ready(1).await?;
    let (mut ctl_b, _) = b.wait_ready(1).await?;
    let across = run(args, &mut ctl_main, Some(&mut ctl_b), &main.workspace("sender"), n).await?;
    main.down(Some(ctl_main)).await?;
    b.down(Some(ctl_b)).await?;
    say!(
        "cluster: across hosts, accepted {:.0} msg/s, delivered + acked {:.0} msg/s",
        f(&across, "accepted"),
        f(&across, "delivered")
    );

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
