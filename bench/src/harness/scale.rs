//! `--only scale` (issue #28): `--agents` bench agents (real processes, caged like any agent) on
//! one host, beside 10 in the same run so the growth shows: `up` → all ready, `ps` latency, the
//! supervisor's resident memory at rest, and a restart storm (`kill -9` of a tenth of the agents
//! at once → every one ready again).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::proto::percentile;

use super::fixture::Bins;
use super::fixture::{Ctl, RunArgs, Swarm, bench_agent, swarm_yaml, tail, vm_rss};

/// The small swarm every figure is set beside.
const BASE: usize = 10;

pub(super) async fn scale(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let parallel = args.parallel.max(1);
    for n in [BASE, args.agents] {
        say!("scale: {n} agents, supervision.parallel {parallel}");
        let dir = root.join(format!("scale-{n}"));
        let mut swarm = Swarm::start(bins, &dir, &scale_yaml(bins, n, parallel))?;
        let wait = wait_for(n);
        let (mut ctl, up) = swarm.wait_ready_within(n, wait).await?;
        let up_ms = up.as_secs_f64() * 1000.0;

        // `ps` as `flockctl ps --json` asks it, 20 times.
        let mut ps_us = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            let rows = ctl.ps().await?;
            ps_us.push(t.elapsed().as_micros() as u64);
            if rows.len() < n {
                bail!("ps listed {} rows for {n} agents", rows.len());
            }
        }
        ps_us.sort_unstable();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss = vm_rss(swarm.child.id())?;
        let sup = swarm.child.id();
        let idle_cpu = cpu_share(sup, Duration::from_secs(2)).await;
        let (routed, busy_cpu) = routed_pairs(&mut swarm, &mut ctl, n, args).await?;

        let storm_ms = restart_storm(&mut swarm, &mut ctl, n.div_ceil(10), wait).await?;
        let ps_ms = percentile(&ps_us, 50.0) as f64 / 1000.0;
        let down_ms = down_ms(swarm, ctl, wait).await?;
        say!(
            "scale {n}: up → all ready {up_ms:.0} ms; ps p50 {ps_ms:.1} ms; supervisor RSS {:.1} MiB; \
             kill -9 of {} at once → all ready {storm_ms:.0} ms; down {down_ms:.0} ms; \
             routed {routed:.0} msg/s over {} pairs; supervisor CPU {:.1} % at rest, {:.0} % under load",
            rss as f64 / 1048576.0,
            n.div_ceil(10),
            pairs_of(n),
            idle_cpu * 100.0,
            busy_cpu * 100.0
        );
        let key = |what: &str| format!("scale_{n}_{what}");
        out.insert(key("up_ms"), json!(up_ms.round()));
        out.insert(key("ps_p50_ms"), json!(ps_ms));
        out.insert(key("ps_max_ms"), json!(ps_us.last().copied().unwrap_or(0) as f64 / 1000.0));
        out.insert(key("supervisor_rss_bytes"), json!(rss));
        out.insert(key("storm_ms"), json!(storm_ms.round()));
        out.insert(key("down_ms"), json!(down_ms.round()));
        out.insert(key("routed_msgs_per_sec"), json!(routed.round()));
        out.insert(key("routed_pairs"), json!(pairs_of(n)));
        out.insert(key("supervisor_cpu_idle_pct"), json!((idle_cpu * 1000.0).round() / 10.0));
        out.insert(key("supervisor_cpu_load_pct"), json!((busy_cpu * 100.0).round()));
    }
    if parallel > 1 {
        // The same start in OTP order (`parallel: 1`), so the gain shows.
        let n = args.agents;
        say!("scale: {n} agents, supervision.parallel 1");
        let dir = root.join(format!("scale-{n}-ordered"));
        let mut swarm = Swarm::start(bins, &dir, &scale_yaml(bins, n, 1))?;
        let (ctl, up) = swarm.wait_ready_within(n, wait_for(n)).await?;
        let down_ms = down_ms(swarm, ctl, wait_for(n)).await?;
        say!(
            "scale {n}, parallel 1: up → all ready {:.0} ms; down {down_ms:.0} ms",
            up.as_secs_f64() * 1e3
        );
        out.insert(format!("scale_{n}_ordered_up_ms"), json!((up.as_secs_f64() * 1e3).round()));
        out.insert(format!("scale_{n}_ordered_down_ms"), json!(down_ms.round()));
    }
    out.insert("scale_agents".into(), json!(args.agents));
    out.insert("scale_parallel".into(), json!(parallel));
    Ok(())
}

/// Sender → sink pairs the routed figure uses among `n` agents: one pair beside the small swarm
/// (the 2-agent figure), every agent in a pair in the large one.
fn pairs_of(n: usize) -> usize {
    if n <= BASE { 1 } else { n / 2 }
}

/// `n` bench agents, `parallel` of them starting at once: the routed pairs (`s0000` sends to
/// `k0000`, …) first, echoing agents after them.
fn scale_yaml(bins: &Bins, n: usize, parallel: u32) -> String {
    let pairs = pairs_of(n);
    let mut agents: Vec<(String, Option<Vec<String>>)> = Vec::new();
    for i in 0..pairs {
        agents.push((format!("s{i:04}"), bench_agent(bins, "sender")));
        agents.push((format!("k{i:04}"), bench_agent(bins, "sink")));
    }
    agents.extend((2 * pairs..n).map(|i| (format!("a{i:04}"), bench_agent(bins, "echo"))));
    swarm_yaml("bench-scale", &agents).replacen(
        "supervision:\n",
        &format!("supervision:\n  parallel: {parallel}\n"),
        1,
    )
}

/// A sink reports its count to its sender every this many messages.
const REPORT_EVERY: u64 = 256;

/// Routed at_most_once throughput of every sender → sink pair at once: the messages the sinks
/// received after their warm-ups (`--routed-count` sent in all, shared among the pairs, each
/// with a warm-up of a tenth more), over the interval from the first pair's warm-up to the last
/// pair's last message. Also the supervisor's CPU share from the first `go` to the last result.
async fn routed_pairs(
    swarm: &mut Swarm,
    ctl: &mut Ctl,
    n: usize,
    args: &RunArgs,
) -> Result<(f64, f64)> {
    let pairs = pairs_of(n);
    let per_pair = (args.routed_count / pairs as u64).max(1_000);
    let warm = (per_pair / 10).max(1);
    // Messages in flight per sender: the single pair's window, shared (the router holds them),
    // but at least 8 progress reports' worth: a sender whose window is one report (256, as
    // before) stops and waits for every report — a round trip through 1 000 busy processes —
    // and measures that wait, not routing (500 pairs: 50 % of one pair at 256, 75 % at 2 048).
    let window = (args.window / pairs as u64).max(8 * REPORT_EVERY);
    let sup = swarm.child.id();
    let before = super::fixture::cpu_ticks(sup);
    let t = Instant::now();
    for i in 0..pairs {
        let go = crate::proto::go(&[
            ("target", format!("k{i:04}")),
            ("mode", "at_most_once".into()),
            ("count", (per_pair + warm).to_string()),
            ("warm", warm.to_string()),
            ("window", window.to_string()),
            ("every", REPORT_EVERY.to_string()),
            ("frame", args.frame_bytes.to_string()),
            ("out", "scale-routed.json".into()),
        ]);
        ctl.send(&format!("s{i:04}"), go).await?;
    }
    // Every sink counts the messages after its warm-up and says when its first and last of
    // them came (wall clock, one for every process): the figure is all of them over the interval
    // from the first pair's warm-up to the last pair's last message — the `go`s reaching the
    // senders and the closing handshakes are outside it.
    let (mut measured, mut first, mut last) = (0u64, u64::MAX, 0u64);
    for i in 0..pairs {
        let path = swarm.workspace(&format!("s{i:04}")).join("scale-routed.json");
        let r =
            super::fixture::wait_result(&path, Duration::from_secs(300), || swarm.check_alive())
                .await?;
        let at = |key: &str| r.get(key).and_then(serde_json::Value::as_u64).unwrap_or(0);
        measured += at("measured");
        first = first.min(at("warm_at_ns"));
        last = last.max(at("last_at_ns"));
    }
    let wall = t.elapsed().as_secs_f64();
    let cpu = match (before, super::fixture::cpu_ticks(sup)) {
        // /proc reports USER_HZ ticks, 100 per second.
        (Some(b), Some(a)) => (a - b) as f64 / 100.0 / wall,
        _ => 0.0,
    };
    let span = last.saturating_sub(first).max(1) as f64 / 1e9;
    Ok((measured as f64 / span, cpu))
}

/// The share of one CPU `pid` uses over `window` (1.0 = one core busy).
async fn cpu_share(pid: u32, window: Duration) -> f64 {
    let before = super::fixture::cpu_ticks(pid);
    tokio::time::sleep(window).await;
    match (before, super::fixture::cpu_ticks(pid)) {
        (Some(b), Some(a)) => (a - b) as f64 / 100.0 / window.as_secs_f64(),
        _ => 0.0,
    }
}

/// How long `n` agents may take to start, or to stop.
fn wait_for(n: usize) -> Duration {
    Duration::from_secs(30 + n as u64 / 10)
}

/// `flockctl down` → the supervisor has exited, in milliseconds.
async fn down_ms(swarm: Swarm, ctl: Ctl, within: Duration) -> Result<f64> {
    match swarm.down_within(Some(ctl), within).await? {
        Some(took) => Ok(took.as_secs_f64() * 1000.0),
        None => bail!("flock-supervisor did not stop within {} s of `down`", within.as_secs()),
    }
}

/// `kill -9` of `count` agents at once (every tenth); milliseconds until each is ready again
/// in a new process.
async fn restart_storm(
    swarm: &mut Swarm,
    ctl: &mut Ctl,
    count: usize,
    wait: Duration,
) -> Result<f64> {
    let rows = ctl.ps().await?;
    let victims: Vec<(String, u32)> = rows
        .iter()
        .filter(|r| r.kind == "agent" && r.state == "ready")
        .step_by(10)
        .take(count)
        .map(|r| Ok((r.name.clone(), r.pid.context("a ready agent has no pid")?)))
        .collect::<Result<_>>()?;
    let t = Instant::now();
    for (_, pid) in &victims {
        super::fixture::kill9(*pid)?;
    }
    loop {
        let rows = ctl.ps().await?;
        let back = victims
            .iter()
            .filter(|(name, pid)| {
                rows.iter().any(|r| {
                    &r.name == name && r.state == "ready" && r.pid.is_some_and(|p| p != *pid)
                })
            })
            .count();
        if back == victims.len() {
            return Ok(t.elapsed().as_secs_f64() * 1000.0);
        }
        if t.elapsed() > wait {
            bail!(
                "{back} of {} agents ready again {} s after kill -9; log:\n{}",
                victims.len(),
                wait.as_secs(),
                tail(&swarm.log)
            );
        }
        swarm.check_alive()?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
