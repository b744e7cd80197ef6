//! Throughput and latency: routed sends and requests through a real swarm, the raw relay
//! baseline, the observer's pace, the web UI's latency.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_ipc::Connection;
use serde_json::{Map, Value, json};

use crate::proto::{self, percentile};

use super::fixture::{
    Bins, CpuMeter, Ctl, Procs, RunArgs, Swarm, bench_agent, f, http_get, latency, num,
    request_cpu, round3, swarm_yaml, throughput, vm_rss, wait_result,
};

pub(super) fn routed_go(args: &RunArgs, round: usize, out_prefix: &str) -> String {
    let warm = (args.routed_count / 10).max(1);
    proto::go(&[
        ("target", "sink".into()),
        ("mode", "at_most_once".into()),
        ("count", (args.routed_count + warm).to_string()),
        ("warm", warm.to_string()),
        ("window", args.window.to_string()),
        ("every", "1024".into()),
        ("frame", args.frame_bytes.to_string()),
        ("out", format!("{out_prefix}-{round}.json")),
    ])
}

pub(super) fn request_go(args: &RunArgs) -> String {
    proto::go(&[
        ("target", "echo".into()),
        ("count", args.requests.to_string()),
        ("warm", (args.requests / 10).max(1).to_string()),
        ("frame", args.frame_bytes.to_string()),
        ("out", "requests.json".into()),
    ])
}

/// Routed at_most_once throughput and request round trips, on one swarm of bench agents.
pub(super) async fn io_swarm(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
    routed: bool,
    request: bool,
) -> Result<()> {
    let agents = vec![
        ("sink".to_string(), bench_agent(bins, "sink")),
        ("sender".to_string(), bench_agent(bins, "sender")),
        ("echo".to_string(), bench_agent(bins, "echo")),
        ("requester".to_string(), bench_agent(bins, "requester")),
    ];
    let mut swarm = Swarm::start(bins, &root.join("io"), &swarm_yaml("bench-io", &agents))?;
    let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
    if routed {
        let rows = ctl.ps().await?;
        let pid_of = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.pid);
        let pids = [Some(swarm.child.id()), pid_of("sender"), pid_of("sink")];
        let mut rounds = Vec::new();
        for round in 0..args.rounds {
            let cpu = CpuMeter::start(&pids);
            ctl.send("sender", routed_go(args, round, "routed")).await?;
            let path = swarm.workspace("sender").join(format!("routed-{round}.json"));
            let mut r =
                wait_result(&path, Duration::from_secs(150), || swarm.check_alive()).await?;
            cpu.finish(&mut r);
            say!(
                "routed at_most_once round {}: {:.0} msg/s ({} dropped)",
                round + 1,
                f(&r, "msgs_per_sec"),
                f(&r, "dropped")
            );
            rounds.push(r);
        }
        throughput(out, "routed_send", &rounds);
        let dropped: f64 = rounds.iter().map(|r| f(r, "dropped")).sum();
        out.insert("routed_send_dropped".into(), json!(dropped));
    }
    if request {
        let rows = ctl.ps().await?;
        let pid_of = |name: &str| rows.iter().find(|r| r.name == name).and_then(|r| r.pid);
        let rss_before = vm_rss(swarm.child.id())?;
        let cpu = CpuMeter::start(&[Some(swarm.child.id()), pid_of("requester"), pid_of("echo")]);
        ctl.send("requester", request_go(args)).await?;
        let path = swarm.workspace("requester").join("requests.json");
        let mut r = wait_result(&path, Duration::from_secs(120), || swarm.check_alive()).await?;
        cpu.finish(&mut r);
        // The router's memory for requests that were answered (pending deadline timers, …).
        let grown = vm_rss(swarm.child.id())?.saturating_sub(rss_before);
        out.insert("request_supervisor_rss_growth_bytes".into(), json!(grown));
        say!("request round trip: p50 {:.1} µs, p99 {:.1} µs", f(&r, "p50_us"), f(&r, "p99_us"));
        latency(out, "request_rtt", &r);
        request_cpu(out, "request", &r);
        out.insert("request_count".into(), json!(f(&r, "count")));
        out.insert("request_errors".into(), json!(f(&r, "errors")));
        out.insert("request_frame_bytes".into(), json!(f(&r, "request_frame_bytes")));
    }
    swarm.down(Some(ctl)).await
}

/// Routed at_most_once throughput with observability off (`RUST_LOG=off`, no metrics) and on
/// (tracing at its default level, `--metrics` scraped every second), alternating swarms in the
/// same run; the bound is a ratio ≥ 0.95.
pub(super) async fn observe(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let agents = vec![
        ("sink".to_string(), bench_agent(bins, "sink")),
        ("sender".to_string(), bench_agent(bins, "sender")),
    ];
    let yaml = swarm_yaml("bench-observe", &agents);
    let mut rates: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds.max(2) {
        for (i, on) in [false, true].into_iter().enumerate() {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let addr = format!("127.0.0.1:{port}");
            let (env, up_args): (Vec<(&str, &str)>, Vec<&str>) = if on {
                (vec![("RUST_LOG", "info")], vec!["--metrics", addr.as_str()])
            } else {
                (vec![("RUST_LOG", "off")], vec![])
            };
            let dir = root.join(format!("observe-{round}-{i}"));
            let mut swarm = Swarm::start_full(bins, &dir, &yaml, &env, &up_args)?;
            let (mut ctl, _) = swarm.wait_ready(agents.len()).await?;
            let scraper = on.then(|| {
                let addr = addr.clone();
                tokio::spawn(async move {
                    let mut scrapes = 0u64;
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        if http_get(&addr, "/metrics", "").await.is_ok_and(|(s, _)| s == 200) {
                            scrapes += 1;
                        }
                        if scrapes == u64::MAX {
                            return;
                        }
                    }
                })
            });
            ctl.send("sender", routed_go(args, round, "observe")).await?;
            let path = swarm.workspace("sender").join(format!("observe-{round}.json"));
            let r = wait_result(&path, Duration::from_secs(150), || swarm.check_alive()).await?;
            if let Some(s) = scraper {
                s.abort();
            }
            say!(
                "observe round {} ({}): {:.0} msg/s",
                round + 1,
                if on { "tracing info + metrics" } else { "tracing off" },
                f(&r, "msgs_per_sec")
            );
            rates[i].push(r);
            swarm.down(Some(ctl)).await?;
        }
    }
    throughput(out, "observe_off", &rates[0]);
    throughput(out, "observe_on", &rates[1]);
    if let (Some(off), Some(on)) =
        (num(out, "observe_off_msgs_per_sec"), num(out, "observe_on_msgs_per_sec"))
    {
        out.insert("observe_on_vs_off".into(), json!(round3(on / off)));
    }
    Ok(())
}

/// The dashboard's update latency: `kill -9` of an agent → the event on `/api/events` (what the
/// page renders from) that shows its restart. The bound is p95 ≤ 1 s.
pub(super) async fn ui_latency(
    bins: &Bins,
    root: &Path,
    n: usize,
    out: &mut Map<String, Value>,
) -> Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let agents = vec![("victim".to_string(), bench_agent(bins, "sink"))];
    let yaml = swarm_yaml("bench-ui", &agents);
    let dir = root.join("ui");
    let mut swarm = Swarm::start_full(bins, &dir, &yaml, &[], &["--ui", "127.0.0.1:0"])?;
    let (mut ctl, _) = swarm.wait_ready(1).await?;
    let url = std::fs::read_to_string(swarm.state.join("run/ui-url"))?;
    let rest = url.trim().trim_start_matches("http://");
    let (addr, token) = rest.split_once("/?token=").context("the dashboard URL has no token")?;
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!(
        "GET /api/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await?;
    let mut lines = BufReader::new(s).lines();
    // The victim's (restarts, state) in the newest event.
    let mut next_state = async || -> Result<(u64, String)> {
        loop {
            let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .context("no event within 30 s")??
                .context("the event stream ended")?;
            let Some(data) = line.strip_prefix("data: ") else { continue };
            let v: Value = serde_json::from_str(data)?;
            let row = v["ps"].as_array().and_then(|r| r.iter().find(|r| r["name"] == "victim"));
            if let Some(row) = row {
                let restarts = row["restarts"].as_u64().unwrap_or(0);
                return Ok((restarts, row["state"].as_str().unwrap_or("").to_owned()));
            }
        }
    };
    say!("ui: {n} kill -9s of an agent, each timed until the dashboard's event stream shows it");
    let mut us = Vec::new();
    for _ in 0..n {
        // Wait until the page would show it ready again.
        let (before, _) = loop {
            let (r, state) = next_state().await?;
            if state == "ready" {
                break (r, state);
            }
        };
        let pid = ctl.ps().await?.iter().find(|r| r.name == "victim").and_then(|r| r.pid);
        let pid = pid.context("the victim has no pid")?;
        let t0 = Instant::now();
        super::fixture::kill9(pid)?;
        loop {
            let (r, _) = next_state().await?;
            if r > before {
                break;
            }
        }
        us.push(t0.elapsed().as_micros() as u64);
    }
    us.sort_unstable();
    let ms = |p: f64| percentile(&us, p) as f64 / 1000.0;
    let (p50, p95) = (ms(50.0), ms(95.0));
    say!("ui: kill -9 → restart on the event stream p50 {p50:.0} ms, p95 {p95:.0} ms");
    out.insert("ui_update_p50_ms".into(), json!(round3(p50)));
    out.insert("ui_update_p95_ms".into(), json!(round3(p95)));
    out.insert("ui_update_max_ms".into(), json!(round3(ms(100.0))));
    swarm.down(Some(ctl)).await
}

/// The raw relay baseline: the same sender and sink programs, connected through `flock-bench relay`.
pub(super) async fn raw_relay(
    bins: &Bins,
    root: &Path,
    args: &RunArgs,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let dir = root.join("relay");
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("relay.sock");
    let mut procs = Procs::default();
    let log = |name: &str| -> Result<(Stdio, Stdio)> {
        let f = std::fs::File::create(dir.join(format!("{name}.log")))?;
        Ok((Stdio::from(f.try_clone()?), Stdio::from(f)))
    };
    let (o, e) = log("relay")?;
    procs.0.push(
        Command::new(&bins.bench)
            .args(["relay", "--socket"])
            .arg(&sock)
            .stdin(Stdio::null())
            .stdout(o)
            .stderr(e)
            .spawn()?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        if Instant::now() > deadline {
            bail!("the relay did not listen on {} within 10 s", sock.display());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let names =
        [("sink", "sink"), ("sender", "sender"), ("echo", "echo"), ("requester", "requester")];
    for (name, mode) in names {
        let cwd = dir.join(name);
        std::fs::create_dir_all(&cwd)?;
        let (o, e) = log(name)?;
        procs.0.push(
            Command::new(&bins.bench)
                .args(["agent", mode])
                .current_dir(&cwd)
                .env(flock_ipc::env::SOCKET, &sock)
                .env(flock_ipc::env::AGENT, name)
                .env(flock_ipc::env::INSTANCE, "default")
                .env(flock_ipc::env::TOKEN, "relay")
                .stdin(Stdio::null())
                .stdout(o)
                .stderr(e)
                .spawn()?,
        );
    }
    let mut ctl = Ctl { conn: Connection::client(&sock, "flock-bench").await? };
    loop {
        let rows = ctl.ps().await?;
        if rows.len() >= names.len() {
            break;
        }
        procs.check_alive(&dir)?;
        if Instant::now() > deadline {
            bail!("the bench agents did not connect to the relay within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // Started in this order: relay, sink, sender, echo, requester.
    let pids: Vec<Option<u32>> = [0, 2, 1].iter().map(|&i| Some(procs.0[i].id())).collect();
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        let cpu = CpuMeter::start(&pids);
        ctl.send_at_most_once("sender", routed_go(args, round, "raw")).await?;
        let path = dir.join("sender").join(format!("raw-{round}.json"));
        let mut r =
            wait_result(&path, Duration::from_secs(150), || procs.check_alive(&dir)).await?;
        cpu.finish(&mut r);
        say!(
            "raw relay round {}: {:.0} msg/s ({} dropped)",
            round + 1,
            f(&r, "msgs_per_sec"),
            f(&r, "dropped")
        );
        rounds.push(r);
    }
    throughput(out, "raw_relay", &rounds);
    if args.requests > 0 {
        // Started in this order: relay, sink, sender, echo, requester.
        let cpu = CpuMeter::start(&[0, 4, 3].map(|i| Some(procs.0[i].id())));
        ctl.send_at_most_once("requester", request_go(args)).await?;
        let path = dir.join("requester").join("requests.json");
        let mut r =
            wait_result(&path, Duration::from_secs(120), || procs.check_alive(&dir)).await?;
        cpu.finish(&mut r);
        request_cpu(out, "raw_relay_request", &r);
        say!(
            "raw relay request round trip: p50 {:.1} µs, p99 {:.1} µs",
            f(&r, "p50_us"),
            f(&r, "p99_us")
        );
        latency(out, "raw_relay_request_rtt", &r);
    }
    Ok(())
}
