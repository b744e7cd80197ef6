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

        let storm_ms = restart_storm(&mut swarm, &mut ctl, n.div_ceil(10), wait).await?;
        let ps_ms = percentile(&ps_us, 50.0) as f64 / 1000.0;
        let down_ms = down_ms(swarm, ctl, wait).await?;
        say!(
            "scale {n}: up → all ready {up_ms:.0} ms; ps p50 {ps_ms:.1} ms; supervisor RSS {:.1} MiB; \
             kill -9 of {} at once → all ready {storm_ms:.0} ms; down {down_ms:.0} ms",
            rss as f64 / 1048576.0,
            n.div_ceil(10)
        );
        let key = |what: &str| format!("scale_{n}_{what}");
        out.insert(key("up_ms"), json!(up_ms.round()));
        out.insert(key("ps_p50_ms"), json!(ps_ms));
        out.insert(key("ps_max_ms"), json!(ps_us.last().copied().unwrap_or(0) as f64 / 1000.0));
        out.insert(key("supervisor_rss_bytes"), json!(rss));
        out.insert(key("storm_ms"), json!(storm_ms.round()));
        out.insert(key("down_ms"), json!(down_ms.round()));
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

/// `n` echoing bench agents, `parallel` of them starting at once.
fn scale_yaml(bins: &Bins, n: usize, parallel: u32) -> String {
    let agents: Vec<(String, Option<Vec<String>>)> =
        (0..n).map(|i| (format!("a{i:04}"), bench_agent(bins, "echo"))).collect();
    swarm_yaml("bench-scale", &agents).replacen(
        "supervision:\n",
        &format!("supervision:\n  parallel: {parallel}\n"),
        1,
    )
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
