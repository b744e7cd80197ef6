//! Durability and process life: durable delivery across kills, chat bridges, spawn and restart
//! times, memory per agent.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Map, Value, json};

use crate::proto::{self, median_f64, percentile};

use super::fixture::{
    Bins, Ctl, RunArgs, Swarm, bench_agent, f, round3, swarm_yaml, tail, throughput, vm_rss,
    wait_result,
};

/// Durable `agents__send`: the acceptance rate, and the rate at which the receiver has them
/// delivered and acknowledged (from the first send until its mailbox is empty), with the
/// receiver's delivery window at `--delivery-window` (a fresh swarm and database per round), and
/// once at window 1 as the baseline of the same run.
pub(super) async fn durable(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let agents = vec![
        ("dsink".to_string(), bench_agent(bins, "echo")),
        ("sender".to_string(), bench_agent(bins, "sender")),
    ];
    let mut rounds = Vec::new();
    let mut drains = Vec::new();
    for round in 0..args.rounds {
        let dir = root.join(format!("durable-{round}"));
        let (r, drain) = durable_round(bins, &dir, &agents, args, args.delivery_window).await?;
        say!(
            "durable round {} (window {}): {:.0} accepted/s ({} errors); delivered + acked {:.0}/s",
            round + 1,
            args.delivery_window,
            f(&r, "msgs_per_sec"),
            f(&r, "errors"),
            drain
        );
        drains.push(drain);
        rounds.push(r);
    }
    throughput(out, "durable_send", &rounds);
    out.insert("durable_delivered_msgs_per_sec".into(), json!(median_f64(&drains).round()));
    out.insert("durable_delivery_window".into(), json!(args.delivery_window));
    if args.delivery_window > 1 {
        let dir = root.join("durable-window-1");
        let (r, drain) = durable_round(bins, &dir, &agents, args, 1).await?;
        say!(
            "durable baseline (window 1): {:.0} accepted/s; delivered + acked {:.0}/s",
            f(&r, "msgs_per_sec"),
            drain
        );
        out.insert("durable_delivered_window1_msgs_per_sec".into(), json!(drain.round()));
    }

    // One durable send at a time, as a turn's `agents__send` tool call makes it.
    if args.durable_sequential > 0 {
        let mut swarm =
            Swarm::start(bins, &root.join("durable-seq"), &swarm_yaml("bench-durable", &agents))?;
        let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
        let go = proto::go(&[
            ("target", "dsink".into()),
            ("mode", "durable".into()),
            ("count", (args.durable_sequential * 11 / 10).to_string()),
            ("warm", (args.durable_sequential / 10).to_string()),
            ("window", "1".into()),
            ("frame", args.frame_bytes.to_string()),
            ("out", "durable-seq.json".into()),
        ]);
        ctl.send("sender", go).await?;
        let path = swarm.workspace("sender").join("durable-seq.json");
        let r = wait_result(&path, Duration::from_secs(120), || swarm.check_alive()).await?;
        say!(
            "durable send, one at a time: p50 {:.1} µs, p99 {:.1} µs",
            f(&r, "latency_p50_us"),
            f(&r, "latency_p99_us")
        );
        out.insert("durable_send_latency_p50_us".into(), json!(round3(f(&r, "latency_p50_us"))));
        out.insert("durable_send_latency_p99_us".into(), json!(round3(f(&r, "latency_p99_us"))));
        swarm.down(Some(ctl)).await?;
    }
    let errors: f64 = rounds.iter().map(|r| f(r, "errors")).sum();
    out.insert("durable_send_errors".into(), json!(errors));
    Ok(())
}

/// One round of durable sends to `dsink`, whose delivery window is `window`: the sender's result
/// and the delivered + acknowledged rate.
async fn durable_round(
    bins: &Bins,
    dir: &Path,
    agents: &[(String, Option<Vec<String>>)],
    args: &RunArgs,
    window: u32,
) -> Result<(Value, f64)> {
    let yaml = format!("{}delivery:\n  window: {window}\n", swarm_yaml("bench-durable", agents));
    let mut swarm = Swarm::start(bins, dir, &yaml)?;
    let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
    let warm = (args.durable_count / 10).max(1);
    let go = proto::go(&[
        ("target", "dsink".into()),
        ("mode", "durable".into()),
        ("count", (args.durable_count + warm).to_string()),
        ("warm", warm.to_string()),
        ("window", args.durable_window.to_string()),
        ("frame", args.frame_bytes.to_string()),
        ("out", "durable.json".into()),
    ]);
    let t = Instant::now();
    ctl.send("sender", go).await?;
    let path = swarm.workspace("sender").join("durable.json");
    let r = wait_result(&path, Duration::from_secs(150), || swarm.check_alive()).await?;
    // Until dsink has had every one of them (the go message included) and acknowledged it.
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let depth =
            ctl.ps().await?.iter().find(|r| r.name == "dsink").map_or(0, |r| r.mailbox_depth);
        if depth == 0 {
            break;
        }
        if Instant::now() > deadline {
            bail!("dsink still had {depth} durable messages after 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain = f(&r, "accepted") / t.elapsed().as_secs_f64();
    swarm.down(Some(ctl)).await?;
    Ok((r, drain))
}

/// A process's memory from `/proc/PID/smaps_rollup`, in bytes.
struct Rollup {
    /// Pages only this process maps (`Private_Clean` + `Private_Dirty`).
    private: u64,
    /// Its proportional share of every page it maps.
    pss: u64,
    /// Anonymous pages (heap, stacks, written globals).
    anon: u64,
    /// Resident pages of the process's own executable file (code, data, relocated tables).
    binary: u64,
    /// Resident pages of the shared libraries it maps (libc, libm, the dynamic loader, …).
    libs: u64,
}

fn rollup(pid: u32) -> Result<Rollup> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .with_context(|| format!("read /proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    // Which file each resident page belongs to: the executable or a shared library.
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))
        .with_context(|| format!("read /proc/{pid}/smaps"))?;
    let (mut binary, mut libs, mut path) = (0, 0, String::new());
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: `start-end perms offset dev inode [path]`.
            path = words.nth(4).unwrap_or_default().to_owned();
        } else if first == "Rss:" {
            let kb: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            if !path.is_empty() && std::path::Path::new(&path) == exe {
                binary += kb * 1024;
            } else if path.contains(".so") {
                libs += kb * 1024;
            }
        }
    }
    Ok(Rollup {
        private: field("Private_Clean") + field("Private_Dirty"),
        pss: field("Pss"),
        anon: field("Anonymous"),
        binary,
        libs,
    })
}

/// `up` to all-ready, idle RSS and `kill -9` to ready again, with 7 real flock-agent processes.
/// Chat bridge latency: chat A → `#team` → chat B through flock-bridge, against a bare bot.
pub(super) async fn bridge(
    bins: &Bins,
    root: &Path,
    n: usize,
    out: &mut Map<String, Value>,
) -> Result<()> {
    say!("bridge: {n} messages chat A → #team → chat B through flock-bridge, then a bare bot");
    let fake = crate::bridge::fake();
    let yaml = crate::bridge::swarm_yaml(&fake);
    let mut swarm =
        Swarm::start_with(bins, &root.join("bridge"), &yaml, &[crate::bridge::TOKEN_ENV])?;
    let (ctl, _) = swarm.wait_ready(1).await?;
    if let Err(e) = crate::bridge::warm_up(&fake).await {
        bail!("{e}; supervisor log {}:\n{}", swarm.log.display(), tail(&swarm.log));
    }
    let flock = crate::bridge::measure(&fake, n, "flock").await?;
    swarm.down(Some(ctl)).await?;
    let bare = crate::bridge::bare(&fake, n).await?;
    let (p50, p99) = crate::bridge::p50_p99(&flock);
    let (b50, b99) = crate::bridge::p50_p99(&bare);
    say!("bridge: p50/p99 {p50:.2}/{p99:.2} ms; bare bot {b50:.2}/{b99:.2} ms");
    out.insert("bridge_relay_p50_ms".into(), json!(p50));
    out.insert("bridge_relay_p99_ms".into(), json!(p99));
    out.insert("bridge_bare_bot_p50_ms".into(), json!(b50));
    out.insert("bridge_bare_bot_p99_ms".into(), json!(b99));
    out.insert("bridge_messages".into(), json!(n));
    Ok(())
}

pub(super) async fn lifecycle(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
    up: bool,
    restart: bool,
    rss: bool,
) -> Result<()> {
    const N: usize = 7;
    let agents: Vec<(String, Option<Vec<String>>)> =
        (1..=N).map(|i| (format!("agent-{i}"), None)).collect();
    let yaml = swarm_yaml("bench-seven", &agents);
    let up_rounds = if up { args.up_rounds.max(1) } else { 1 };
    let mut ups = Vec::new();
    let mut kept = None;
    for round in 0..up_rounds {
        let mut swarm = Swarm::start(bins, &root.join(format!("up-{round}")), &yaml)?;
        let (ctl, took) = swarm.wait_ready(N).await?;
        ups.push(took.as_secs_f64() * 1000.0);
        if round + 1 == up_rounds {
            kept = Some((swarm, ctl));
        } else {
            swarm.down(Some(ctl)).await?;
        }
    }
    if up {
        say!("up to all {N} ready: {:?} ms", ups.iter().map(|m| m.round()).collect::<Vec<_>>());
        out.insert("up_to_ready_ms".into(), json!(round3(median_f64(&ups))));
        out.insert(
            "up_to_ready_rounds_ms".into(),
            json!(ups.iter().map(|m| round3(*m)).collect::<Vec<_>>()),
        );
    }
    let Some((mut swarm, mut ctl)) = kept else { return Ok(()) };

    if rss {
        // Every agent runs one turn, then rests; RSS is read from /proc after a second of idleness.
        for (name, _) in &agents {
            ctl.send(name, "hello from flock-bench".into()).await?;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let rows = ctl.ps().await?;
            let done = rows
                .iter()
                .filter(|r| {
                    r.kind == "agent"
                        && r.turns_total >= 1
                        && r.mailbox_depth == 0
                        && r.state == "ready"
                })
                .count();
            if done >= N {
                break;
            }
            if Instant::now() > deadline {
                bail!("the agents did not finish their first turn within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut rss: Vec<u64> = Vec::new();
        let mut parts: Vec<Rollup> = Vec::new();
        let mut stand_ins: Vec<u64> = Vec::new();
        for row in ctl.ps().await?.iter().filter(|r| r.kind == "agent") {
            let pid = row.pid.context("an agent has no pid")?;
            // A caged agent is the child of its cage's stand-in, the pid ps shows.
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            let agent = match children.split_whitespace().next().and_then(|c| c.parse().ok()) {
                Some(child) => {
                    stand_ins.push(vm_rss(pid)?);
                    child
                }
                None => pid,
            };
            rss.push(
                vm_rss(agent)
                    .with_context(|| format!("read the RSS of {} (pid {agent})", row.name))?,
            );
            parts.push(rollup(agent)?);
        }
        rss.sort_unstable();
        stand_ins.sort_unstable();
        if !stand_ins.is_empty() {
            out.insert("cage_stand_in_rss_bytes".into(), json!(percentile(&stand_ins, 50.0)));
        }
        say!("idle flock-agent RSS: {:?} KiB", rss.iter().map(|b| b / 1024).collect::<Vec<_>>());
        out.insert("idle_agent_rss_bytes".into(), json!(percentile(&rss, 50.0)));
        out.insert("idle_agent_rss_max_bytes".into(), json!(rss.last().copied().unwrap_or(0)));
        // What the resident pages are: the agent's own (private: heap, stacks, written data),
        // its share of what every agent maps (PSS: the binary's and libc's pages count once
        // across all of them), and the part of RSS that is the binary's file pages.
        let median = |f: fn(&Rollup) -> u64| {
            let mut v: Vec<u64> = parts.iter().map(f).collect();
            v.sort_unstable();
            percentile(&v, 50.0)
        };
        let (private, pss, anon) = (median(|r| r.private), median(|r| r.pss), median(|r| r.anon));
        say!(
            "idle flock-agent: private {} KiB (anonymous {} KiB), PSS {} KiB over {N} agents",
            private / 1024,
            anon / 1024,
            pss / 1024
        );
        let (binary, libs) = (median(|r| r.binary), median(|r| r.libs));
        say!(
            "idle flock-agent RSS by file: its binary {} KiB, shared libraries {} KiB",
            binary / 1024,
            libs / 1024
        );
        out.insert("idle_agent_binary_rss_bytes".into(), json!(binary));
        out.insert("idle_agent_libs_rss_bytes".into(), json!(libs));
        out.insert("idle_agent_private_bytes".into(), json!(private));
        out.insert("idle_agent_anon_bytes".into(), json!(anon));
        out.insert("idle_agent_pss_bytes".into(), json!(pss));
    }

    if restart {
        let times = kill_restarts(&mut swarm, &mut ctl, &agents, args.kills).await?;
        let mut sorted: Vec<u64> = times.iter().map(|m| (m * 1000.0) as u64).collect();
        sorted.sort_unstable();
        say!("kill -9 → ready: {:?} ms", times.iter().map(|m| round3(*m)).collect::<Vec<_>>());
        out.insert("restart_to_ready_ms".into(), json!(round3(median_f64(&times))));
        out.insert(
            "restart_to_ready_p90_ms".into(),
            json!(percentile(&sorted, 90.0) as f64 / 1000.0),
        );
        out.insert(
            "restart_to_ready_max_ms".into(),
            json!(sorted.last().copied().unwrap_or(0) as f64 / 1000.0),
        );
        out.insert("restart_kills".into(), json!(times.len()));
        swarm.down(Some(ctl)).await?;
        // The baseline, in the same run: the same swarm with its agents out of their cage.
        let yaml = swarm_yaml("bench-seven-uncaged", &agents)
            .replace("    role: worker\n", "    role: worker\n    unconfined: true\n");
        let mut swarm = Swarm::start(bins, &root.join("uncaged"), &yaml)?;
        let (mut ctl, _) = swarm.wait_ready(N).await?;
        let bare = kill_restarts(&mut swarm, &mut ctl, &agents, args.kills).await?;
        say!(
            "uncaged kill -9 → ready: {:?} ms",
            bare.iter().map(|m| round3(*m)).collect::<Vec<_>>()
        );
        let (caged, uncaged) = (median_f64(&times), median_f64(&bare));
        out.insert("restart_to_ready_uncaged_ms".into(), json!(round3(uncaged)));
        if uncaged > 0.0 {
            out.insert("restart_caged_over_uncaged".into(), json!(round3(caged / uncaged)));
        }
        return swarm.down(Some(ctl)).await;
    }
    swarm.down(Some(ctl)).await
}

/// `kill -9`s agents round robin; how long each took to be ready again (a new pid), in ms.
pub(super) async fn kill_restarts(
    swarm: &mut Swarm,
    ctl: &mut Ctl,
    agents: &[(String, Option<Vec<String>>)],
    kills: usize,
) -> Result<Vec<f64>> {
    let n = agents.len();
    let mut times = Vec::new();
    for i in 0..kills {
        let name = &agents[i % n].0;
        let rows = ctl.ps().await?;
        let row = rows.iter().find(|r| &r.name == name).context("agent missing from ps")?;
        let pid =
            row.pid.filter(|_| row.state == "ready").context("agent not ready before the kill")?;
        let t = Instant::now();
        super::fixture::kill9(pid)?;
        loop {
            let rows = ctl.ps().await?;
            let back = rows
                .iter()
                .find(|r| &r.name == name)
                .is_some_and(|r| r.state == "ready" && r.pid.is_some_and(|p| p != pid));
            if back {
                break;
            }
            if t.elapsed() > Duration::from_secs(15) {
                bail!("{name} was not ready again 15 s after kill -9; log:\n{}", tail(&swarm.log));
            }
            swarm.check_alive()?;
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        // Let the new process settle before the next kill.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(times)
}
