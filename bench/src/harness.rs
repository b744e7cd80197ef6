//! The harness: starts real supervisors, agents and the raw relay, drives the load, collects the
//! figures and prints them (a table, or one JSON object with `--json`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use flock_ipc::{
    Body, Connection, ControlReply, ControlRequest, Frame, OPERATOR, PsRow, ROUTER, SendMode,
};
use serde_json::{Map, Value, json};

use crate::proto::{self, median_f64, percentile};

/// Options of a benchmark run. Defaults take about a minute on 2 cores.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Rounds of each throughput figure; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Measured at_most_once messages per round (after the warm-up).
    #[arg(long, default_value_t = 1_000_000)]
    pub routed_count: u64,
    /// Measured durable sends per round (after the warm-up).
    #[arg(long, default_value_t = 150_000)]
    pub durable_count: u64,
    /// Measured one-at-a-time durable sends (after the warm-up); 0 skips them.
    #[arg(long, default_value_t = 5_000)]
    pub durable_sequential: u64,
    /// Measured sequential requests (after the warm-up).
    #[arg(long, default_value_t = 20_000)]
    pub requests: u64,
    /// Times `up` is run to all-ready (fresh state dir each time); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub up_rounds: usize,
    /// `kill -9`s of an agent (round robin over the 7); the median is reported.
    #[arg(long, default_value_t = 15)]
    pub kills: usize,
    /// Messages an at_most_once sender may have unaccounted for (not yet counted by the sink).
    #[arg(long, default_value_t = 16_384)]
    pub window: u64,
    /// Durable sends a sender may have unanswered.
    #[arg(long, default_value_t = 4_096)]
    pub durable_window: u64,
    /// Encoded size of each sent frame, length prefix included.
    #[arg(long, default_value_t = 150)]
    pub frame_bytes: usize,
    /// Runs of `exec true` per sandbox backend (the Docker one at most 30).
    #[arg(long, default_value_t = 100)]
    pub exec_runs: usize,
    /// Messages relayed one at a time through a chat bridge (and through the bare bot).
    #[arg(long, default_value_t = 1_000)]
    pub bridge_messages: usize,
    /// `kill -9`s whose restart the dashboard's event stream must show (the `ui` figure).
    #[arg(long, default_value_t = 40)]
    pub ui_changes: usize,
    /// Only these figures (comma-separated): routed,raw,durable,request,up,restart,rss,sandbox,
    /// memory,recall,bridge,observe,ui.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Where flock-supervisor and flock-agent are [default: next to this executable].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Keep the temporary state dirs (their path is printed).
    #[arg(long)]
    pub keep: bool,
}

pub fn main(args: RunArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(args))
}

struct Bins {
    supervisor: PathBuf,
    bench: PathBuf,
}

impl Bins {
    fn find(dir: Option<&Path>) -> Result<Self> {
        let bench = std::env::current_exe().context("locate flock-bench")?;
        let dir = match dir {
            Some(d) => d.to_path_buf(),
            None => bench.parent().context("flock-bench has no folder")?.to_path_buf(),
        };
        let supervisor = dir.join("flock-supervisor");
        for bin in [&supervisor, &dir.join("flock-agent")] {
            if !bin.exists() {
                bail!(
                    "{} is missing: build with `cargo build --release --workspace --bins` (scripts/bench does), or pass --bin-dir",
                    bin.display()
                );
            }
        }
        Ok(Bins { supervisor, bench })
    }
}

/// Progress goes to stderr so that `--json` keeps stdout clean.
macro_rules! say {
    ($($t:tt)*) => { eprintln!("flock-bench: {}", format!($($t)*)) };
}

async fn run(args: RunArgs) -> Result<()> {
    let started = Instant::now();
    const FIGURES: [&str; 13] = [
        "routed", "raw", "durable", "request", "up", "restart", "rss", "sandbox", "memory",
        "recall", "bridge", "observe", "ui",
    ];
    if let Some(bad) = args.only.iter().find(|o| !FIGURES.contains(&o.as_str())) {
        bail!("--only {bad}: choose among {}", FIGURES.join(","));
    }
    let bins = Bins::find(args.bin_dir.as_deref())?;
    let root = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let want = |what: &str| args.only.is_empty() || args.only.iter().any(|o| o == what);
    let mut out = Map::new();
    out.insert("cpus".into(), json!(std::thread::available_parallelism().map_or(0, |n| n.get())));
    out.insert("frame_bytes".into(), json!(args.frame_bytes));

    let result = async {
        if want("routed") || want("request") {
            io_swarm(&bins, &root, &args, &mut out, want("routed"), want("request")).await?;
        }
        if want("raw") {
            raw_relay(&bins, &root, &args, &mut out).await?;
        }
        if want("durable") {
            durable(&bins, &root, &args, &mut out).await?;
        }
        if want("sandbox") {
            let helper = bins.supervisor.with_file_name("flock-sandbox");
            crate::sandbox::run(&helper, &root, args.exec_runs, &mut out).await?;
        }
        if want("memory") {
            say!("memory: indexing 100 000 observations, then 200 searches");
            crate::memory::run(&root, 100_000, &mut out)?;
        }
        if want("recall") {
            say!("recall: LongMemEval-style fixture (seed {})", crate::recall::SEED);
            crate::recall::run(&root, args.keep, &mut out)?;
        }
        if want("bridge") {
            bridge(&bins, &root, args.bridge_messages, &mut out).await?;
        }
        if want("observe") {
            observe(&bins, &root, &args, &mut out).await?;
        }
        if want("ui") {
            ui_latency(&bins, &root, args.ui_changes, &mut out).await?;
        }
        if want("up") || want("restart") || want("rss") {
            lifecycle(&bins, &root, &args, &mut out, want("up"), want("restart"), want("rss"))
                .await?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if args.keep {
        say!("state dirs kept in {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    result?;

    if let (Some(r), Some(b)) =
        (num(&out, "routed_send_msgs_per_sec"), num(&out, "raw_relay_msgs_per_sec"))
    {
        out.insert("routed_vs_raw_relay".into(), json!(round3(r / b)));
    }
    out.insert("bench_secs".into(), json!(round3(started.elapsed().as_secs_f64())));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Object(out))?);
    } else {
        print_table(&out);
    }
    Ok(())
}

fn num(m: &Map<String, Value>, key: &str) -> Option<f64> {
    m.get(key).and_then(Value::as_f64)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

// ----------------------------------------------------------------------------------------------
// swarm files and processes

/// A generated swarm file's agents: (name, command). `None` runs the real flock-agent.
fn swarm_yaml(name: &str, agents: &[(String, Option<Vec<String>>)]) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut y = format!(
        "# generated by flock-bench\nswarm:\n  name: {name}\n\
         supervision:\n  max_restarts: 1000\n  max_seconds: 60\n  backoff_reset_secs: 0\n\
         models:\n  scripted:\n    provider: scripted\n    rules:\n      - reply: \"ok: {{input}}\"\n\
         defaults:\n  model: scripted\n  restart: permanent\n  ready_timeout_secs: 10\n  stop_timeout_secs: 2\n\
         agents:\n"
    );
    for (agent, command) in agents {
        y.push_str(&format!("  - name: {agent}\n    role: worker\n"));
        if let Some(cmd) = command {
            let items: Vec<String> = cmd.iter().map(|s| q(s)).collect();
            y.push_str(&format!("    command: [{}]\n", items.join(", ")));
        }
    }
    y
}

fn bench_agent(bins: &Bins, mode: &str) -> Option<Vec<String>> {
    Some(vec![bins.bench.display().to_string(), "agent".into(), mode.into()])
}

/// A running `flock-supervisor up` on a generated swarm file.
struct Swarm {
    child: Child,
    state: PathBuf,
    log: PathBuf,
    spawned: Instant,
}

impl Swarm {
    fn start(bins: &Bins, dir: &Path, yaml: &str) -> Result<Swarm> {
        Swarm::start_with(bins, dir, yaml, &[])
    }

    fn start_with(bins: &Bins, dir: &Path, yaml: &str, env: &[(&str, &str)]) -> Result<Swarm> {
        Swarm::start_full(bins, dir, yaml, env, &[])
    }

    fn start_full(
        bins: &Bins,
        dir: &Path,
        yaml: &str,
        env: &[(&str, &str)],
        up_args: &[&str],
    ) -> Result<Swarm> {
        std::fs::create_dir_all(dir)?;
        let file = dir.join("swarm.yaml");
        std::fs::write(&file, yaml)?;
        if let Err(errors) = flock_config::load(&file) {
            bail!("the generated swarm file {} is invalid:\n{errors}", file.display());
        }
        let state = dir.join("state");
        let log = dir.join("supervisor.log");
        let logf = std::fs::File::create(&log)?;
        let spawned = Instant::now();
        let child = Command::new(&bins.supervisor)
            .arg("up")
            .arg(&file)
            .arg("--state-dir")
            .arg(&state)
            .args(up_args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("start {}", bins.supervisor.display()))?;
        Ok(Swarm { child, state, log, spawned })
    }

    fn control_socket(&self) -> PathBuf {
        self.state.join("run").join("control.sock")
    }

    fn workspace(&self, agent: &str) -> PathBuf {
        self.state.join("workspaces").join(agent)
    }

    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "flock-supervisor exited ({status}); its log {}:\n{}",
                self.log.display(),
                tail(&self.log)
            );
        }
        Ok(())
    }

    /// Polls until the control socket answers and `ps` shows `n` agents ready; returns the
    /// connection and the time since the supervisor was spawned.
    async fn wait_ready(&mut self, n: usize) -> Result<(Ctl, Duration)> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let sock = self.control_socket();
        let mut ctl = loop {
            if let Ok(conn) = Connection::client(&sock, "flock-bench").await {
                break Ctl { conn };
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("the control socket {} did not answer within 30 s", sock.display());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        loop {
            let rows = ctl.ps().await?;
            let ready = rows.iter().filter(|r| r.kind == "agent" && r.state == "ready").count();
            if ready >= n {
                return Ok((ctl, self.spawned.elapsed()));
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "only {ready} of {n} agents ready after 30 s; log {}:\n{}",
                    self.log.display(),
                    tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `flockctl down`, then waits for the supervisor to exit (killing it after 15 s).
    async fn down(mut self, ctl: Option<Ctl>) -> Result<()> {
        if let Some(mut ctl) = ctl {
            let _ = ctl.call(Body::Control(ControlRequest::Down)).await;
        } else {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                say!("flock-supervisor did not stop within 15 s: killing it");
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        // An error path: agents die with the supervisor (PR_SET_PDEATHSIG).
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A control connection (to the supervisor or to the relay).
struct Ctl {
    conn: Connection,
}

impl Ctl {
    /// Sends `body` from the operator and returns the first frame answering it.
    async fn call(&mut self, body: Body) -> Result<Frame> {
        self.call_to(ROUTER, body).await
    }

    async fn call_to(&mut self, to: &str, body: Body) -> Result<Frame> {
        let frame = Frame::new(OPERATOR, to, body);
        let id = frame.id;
        self.conn.outbox.send(frame).await.map_err(|_| anyhow!("control connection closed"))?;
        loop {
            let answer =
                tokio::time::timeout(Duration::from_secs(30), self.conn.reader.read_frame())
                    .await
                    .map_err(|_| anyhow!("no answer on the control connection within 30 s"))??
                    .context("the control connection closed")?;
            if answer.correlation_id == Some(id) {
                return Ok(answer);
            }
        }
    }

    async fn ps(&mut self) -> Result<Vec<PsRow>> {
        match self.call(Body::Control(ControlRequest::Ps)).await?.body {
            Body::ControlReply(ControlReply::Ps(rows)) => Ok(rows),
            Body::Error { code, message } => bail!("ps failed ({code}): {message}"),
            other => bail!("ps answered with {}", other.kind()),
        }
    }

    /// A durable send from the operator; returns once it is accepted.
    async fn send(&mut self, to: &str, text: String) -> Result<()> {
        match self.call_to(to, Body::Send { text, mode: SendMode::Durable }).await?.body {
            Body::Accepted => Ok(()),
            Body::Error { code, message } => bail!("send to {to} failed ({code}): {message}"),
            other => bail!("send to {to} answered with {}", other.kind()),
        }
    }

    /// Like [`Ctl::send`] but at_most_once: nothing to wait for (the relay stores nothing).
    async fn send_at_most_once(&mut self, to: &str, text: String) -> Result<()> {
        let frame = Frame::new(OPERATOR, to, Body::Send { text, mode: SendMode::AtMostOnce });
        self.conn.outbox.send(frame).await.map_err(|_| anyhow!("control connection closed"))
    }
}

/// Waits for a result file an agent writes, while `alive` keeps saying its processes run.
async fn wait_result(
    path: &Path,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        if path.exists() {
            let text = std::fs::read_to_string(path)?;
            return serde_json::from_str(&text)
                .with_context(|| format!("parse {}", path.display()));
        }
        alive()?;
        if Instant::now() > deadline {
            bail!("no result in {} after {} s", path.display(), timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

fn routed_go(args: &RunArgs, round: usize, out_prefix: &str) -> String {
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

fn request_go(args: &RunArgs) -> String {
    proto::go(&[
        ("target", "echo".into()),
        ("count", args.requests.to_string()),
        ("warm", (args.requests / 10).max(1).to_string()),
        ("frame", args.frame_bytes.to_string()),
        ("out", "requests.json".into()),
    ])
}

/// Copies a requester's percentiles into `<key>_p50_us` and friends.
fn latency(out: &mut Map<String, Value>, key: &str, r: &Value) {
    for p in ["p50", "p90", "p99", "p999", "max", "mean"] {
        out.insert(format!("{key}_{p}_us"), json!(round3(f(r, &format!("{p}_us")))));
    }
}

/// Copies a request run's CPU cost per round trip (server, requester, echo) into `<key>_…`.
fn request_cpu(out: &mut Map<String, Value>, key: &str, r: &Value) {
    let Some(cpu) = r.get("cpu_ns_per_msg").and_then(Value::as_array) else { return };
    for (who, v) in ["server", "requester", "echo"].iter().zip(cpu) {
        if let Some(ns) = v.as_f64() {
            out.insert(format!("{key}_{who}_cpu_us_per_rtt"), json!(round3(ns / 1000.0)));
        }
    }
}

/// Summarises at_most_once rounds into `<key>_msgs_per_sec` (median) and friends.
fn throughput(out: &mut Map<String, Value>, key: &str, rounds: &[Value]) {
    let rates: Vec<f64> = rounds.iter().map(|r| f(r, "msgs_per_sec")).collect();
    out.insert(format!("{key}_msgs_per_sec"), json!(median_f64(&rates).round()));
    out.insert(
        format!("{key}_rounds_msgs_per_sec"),
        json!(rates.iter().map(|r| r.round()).collect::<Vec<_>>()),
    );
    for (i, who) in ["server", "sender", "sink"].iter().enumerate() {
        let ns: Vec<f64> = rounds
            .iter()
            .filter_map(|r| r.get("cpu_ns_per_msg").and_then(|c| c.get(i)).and_then(Value::as_f64))
            .collect();
        if !ns.is_empty() {
            out.insert(format!("{key}_{who}_cpu_ns_per_msg"), json!(median_f64(&ns).round()));
        }
    }
    if let Some(first) = rounds.first() {
        for k in ["send_frame_bytes", "window"] {
            if let Some(v) = first.get(k) {
                out.insert(format!("{key}_{k}"), v.clone());
            }
        }
    }
}

/// CPU time (user + system) that processes spend during a load run, per message sent.
struct CpuMeter {
    pids: Vec<Option<u32>>,
    before: Vec<Option<u64>>,
}

impl CpuMeter {
    fn start(pids: &[Option<u32>]) -> Self {
        CpuMeter {
            pids: pids.to_vec(),
            before: pids.iter().map(|p| p.and_then(cpu_ticks)).collect(),
        }
    }

    /// Adds `cpu_ns_per_msg: [server, sender, sink]` to a round's result (`sent` messages).
    fn finish(self, r: &mut Value) {
        let sent = f(r, "sent").max(1.0);
        let per_msg: Vec<Value> = self
            .pids
            .iter()
            .zip(&self.before)
            .map(|(pid, before)| match (pid.and_then(cpu_ticks), before) {
                // /proc reports USER_HZ ticks, 100 per second on Linux.
                (Some(after), Some(before)) => {
                    json!(((after - before) as f64 * 1e7 / sent).round())
                }
                _ => Value::Null,
            })
            .collect();
        if let Some(obj) = r.as_object_mut() {
            obj.insert("cpu_ns_per_msg".into(), Value::Array(per_msg));
        }
    }
}

/// utime + stime of a process (all its threads), in clock ticks, from `/proc/<pid>/stat`.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it are space-separated.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

// ----------------------------------------------------------------------------------------------
// figures

/// Routed at_most_once throughput and request round trips, on one swarm of bench agents.
async fn io_swarm(
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
async fn observe(
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

/// One HTTP/1.1 GET over a plain socket: (status, body).
async fn http_get(addr: &str, path: &str, headers: &str) -> Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    Ok((status, body))
}

/// The dashboard's update latency: `kill -9` of an agent → the event on `/api/events` (what the
/// page renders from) that shows its restart. The bound is p95 ≤ 1 s.
async fn ui_latency(
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
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )?;
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
async fn raw_relay(
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

/// Processes started directly by the harness; killed when dropped.
#[derive(Default)]
struct Procs(Vec<Child>);

impl Procs {
    fn check_alive(&mut self, dir: &Path) -> Result<()> {
        for c in &mut self.0 {
            if let Some(status) = c.try_wait()? {
                bail!("a relay-bench process exited ({status}); logs in {}", dir.display());
            }
        }
        Ok(())
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Durable `agents__send` acceptance rate: a fresh swarm (and database) per round.
async fn durable(
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
        let mut swarm = Swarm::start(
            bins,
            &root.join(format!("durable-{round}")),
            &swarm_yaml("bench-durable", &agents),
        )?;
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
        let elapsed = t.elapsed().as_secs_f64();
        // How far the one-at-a-time delivery to dsink got meanwhile.
        let depth =
            ctl.ps().await?.iter().find(|r| r.name == "dsink").map_or(0, |r| r.mailbox_depth);
        let accepted = f(&r, "accepted");
        let drain = (accepted - depth as f64).max(0.0) / elapsed;
        say!(
            "durable round {}: {:.0} accepted/s ({} errors); delivered+acked meanwhile {:.0}/s",
            round + 1,
            f(&r, "msgs_per_sec"),
            f(&r, "errors"),
            drain
        );
        drains.push(drain);
        rounds.push(r);
        swarm.down(Some(ctl)).await?;
    }
    throughput(out, "durable_send", &rounds);
    out.insert("durable_delivered_msgs_per_sec".into(), json!(median_f64(&drains).round()));

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

/// `up` to all-ready, idle RSS and `kill -9` to ready again, with 7 real flock-agent processes.
/// Chat bridge latency: chat A → `#team` → chat B through flock-bridge, against a bare bot.
async fn bridge(bins: &Bins, root: &Path, n: usize, out: &mut Map<String, Value>) -> Result<()> {
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

async fn lifecycle(
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
        }
        rss.sort_unstable();
        stand_ins.sort_unstable();
        if !stand_ins.is_empty() {
            out.insert("cage_stand_in_rss_bytes".into(), json!(percentile(&stand_ins, 50.0)));
        }
        say!("idle flock-agent RSS: {:?} KiB", rss.iter().map(|b| b / 1024).collect::<Vec<_>>());
        out.insert("idle_agent_rss_bytes".into(), json!(percentile(&rss, 50.0)));
        out.insert("idle_agent_rss_max_bytes".into(), json!(rss.last().copied().unwrap_or(0)));
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
async fn kill_restarts(
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
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .with_context(|| format!("kill -9 {pid}"))?;
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

/// Resident set size from `/proc/<pid>/status` (VmRSS).
fn vm_rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS line")?;
    let kb: u64 = line.split_whitespace().nth(1).context("empty VmRSS")?.parse()?;
    Ok(kb * 1024)
}

// ----------------------------------------------------------------------------------------------
// the table

fn print_table(out: &Map<String, Value>) {
    let get = |k: &str| num(out, k);
    let raw = get("raw_relay_msgs_per_sec");
    let thousands = |x: f64| {
        let s = format!("{:.0}", x);
        let mut r = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                r.push(' ');
            }
            r.push(c);
        }
        r
    };
    let vs_raw = |x: f64| raw.map_or(String::new(), |b| format!("{:.2}× raw relay", x / b));
    let mark = |ok: bool| if ok { "ok" } else { "MISSED" };
    println!(
        "Flock benchmarks ({} CPUs, {}-byte frames, {} s)",
        get("cpus").unwrap_or(0.0),
        get("frame_bytes").unwrap_or(0.0),
        get("bench_secs").unwrap_or(0.0)
    );
    let (figure, measured, target, blank) = ("figure", "measured", "target", "");
    println!("{figure:<38} {measured:>18} {target:>16} {blank:>7}  vs baseline");
    let row = |what: &str, measured: String, target: &str, ok: Option<bool>, cmp: String| {
        println!("{what:<38} {measured:>18} {target:>16} {:>7}  {cmp}", ok.map_or("", mark));
    };
    let ms = |k: &str| {
        let us = |p: &str| get(&format!("{k}_{p}_us")).map(|x| x / 1000.0);
        us("p50").zip(us("p95"))
    };
    let base = ms("exec_baseline").map(|(p50, _)| p50);
    let vs_sh = |p50: f64| {
        base.map_or(String::new(), |b| format!("{:.1}× sh -c true ({b:.2} ms)", p50 / b))
    };
    for (key, what, target) in [
        ("exec_native", "exec true, native sandbox p50/p95", 15.0),
        ("exec_docker", "exec true, docker sandbox p50/p95", 400.0),
    ] {
        if let Some((p50, p95)) = ms(key) {
            let t = format!("p50 ≤ {target} ms");
            row(what, format!("{p50:.2}/{p95:.2} ms"), &t, Some(p50 <= target), vs_sh(p50));
        }
    }
    if let (Some(on), Some(off), Some(ratio)) =
        (get("observe_on_msgs_per_sec"), get("observe_off_msgs_per_sec"), get("observe_on_vs_off"))
    {
        let cmp = format!("{ratio:.3}× tracing off ({} msg/s)", thousands(off));
        let what = "routed, tracing info + metrics on";
        row(what, format!("{} msg/s", thousands(on)), "≥ 0.95× off", Some(ratio >= 0.95), cmp);
    }
    if let (Some(p50), Some(p95)) = (get("ui_update_p50_ms"), get("ui_update_p95_ms")) {
        let what = "dashboard: kill -9 → page event p50/p95";
        row(
            what,
            format!("{p50:.0}/{p95:.0} ms"),
            "p95 ≤ 1 000 ms",
            Some(p95 <= 1000.0),
            String::new(),
        );
    }
    if let (Some(p50), Some(p95)) = (get("memory_search_p50_ms"), get("memory_search_p95_ms")) {
        let cmp = get("memory_scan_p50_ms")
            .map_or(String::new(), |b| format!("{:.3}× file scan ({b:.0} ms)", p50 / b));
        let what = format!(
            "BM25 search, {} records p50/p95",
            thousands(get("memory_records").unwrap_or(0.0))
        );
        row(&what, format!("{p50:.2}/{p95:.2} ms"), "p95 ≤ 150 ms", Some(p95 <= 150.0), cmp);
    }
    for (set, (key, label, target)) in ["recall", "recall_heldout"].into_iter().flat_map(|set| {
        [("bm25", "BM25", ""), ("vector", "vectors", ""), ("hybrid", "hybrid", "@5 ≥ 0.95")]
            .map(|m| (set, m))
    }) {
        let (Some(a5), Some(a10)) =
            (get(&format!("{set}_{key}_at5")), get(&format!("{set}_{key}_at10")))
        else {
            continue;
        };
        let what = format!(
            "recall@5/@10 {label} ({} q{}, {} sessions)",
            get(&format!("{set}_questions")).unwrap_or(0.0),
            if set == "recall" { "" } else { " held-out" },
            get(&format!("{set}_sessions")).unwrap_or(0.0)
        );
        let ok = (!target.is_empty()).then_some(a5 >= 0.95);
        row(&what, format!("{a5:.3}/{a10:.3}"), target, ok, String::new());
    }
    if let (Some(p50), Some(p95)) = (get("memory_hybrid_p50_ms"), get("memory_hybrid_p95_ms")) {
        let what = format!(
            "hybrid search, {} records p50/p95",
            thousands(get("memory_records").unwrap_or(0.0))
        );
        let cmp = get("memory_rss_kib")
            .map_or(String::new(), |k| format!("bench RSS {:.0} MiB", k / 1024.0));
        row(&what, format!("{p50:.2}/{p95:.2} ms"), "p95 ≤ 150 ms", Some(p95 <= 150.0), cmp);
    }
    if let Some(x) = get("memory_embed_per_sec") {
        let mut cmp = get("memory_embed_passages_per_sec")
            .map_or(String::new(), |p| format!("{p:.0} passages/s, "));
        if let Some(q) = get("memory_embed_query_ms") {
            cmp.push_str(&format!("query {q:.0} ms"));
        }
        row("embedding, 3-sentence records (batch 16)", format!("{x:.0} records/s"), "", None, cmp);
    }
    if let Some(ms) = get("memory_rebuild_ms") {
        row(
            "memory index rebuild from files",
            format!("{:.1} s", ms / 1000.0),
            "",
            None,
            String::new(),
        );
    }
    if let (Some(p50), Some(p99)) = (get("bridge_relay_p50_ms"), get("bridge_relay_p99_ms")) {
        let what = format!(
            "bridge chat → channel → chat, {:.0} msgs p50/p99",
            get("bridge_messages").unwrap_or(0.0)
        );
        let cmp = match (get("bridge_bare_bot_p50_ms"), get("bridge_bare_bot_p99_ms")) {
            (Some(b50), Some(b99)) => {
                format!("bare bot {b50:.2}/{b99:.2} ms ({:.1}× p50)", p50 / b50)
            }
            _ => String::new(),
        };
        row(&what, format!("{p50:.2}/{p99:.2} ms"), "", None, cmp);
    }
    for (key, base_key, what) in [
        ("fs_write_4k", "std_write_4k", "fs_write 4 KiB p50"),
        ("fs_read_4k", "std_read_4k", "fs_read 4 KiB p50"),
    ] {
        if let (Some((p50, _)), Some((b, _))) = (ms(key), ms(base_key)) {
            let cmp = format!("{:.1}× std::fs ({:.1} µs)", p50 / b, b * 1000.0);
            row(what, format!("{:.1} µs", p50 * 1000.0), "", None, cmp);
        }
    }
    if let Some(x) = get("routed_send_msgs_per_sec") {
        row(
            "routed at_most_once send",
            format!("{} msg/s", thousands(x)),
            "≥ 300 000",
            Some(x >= 300_000.0),
            vs_raw(x),
        );
    }
    if let Some(x) = raw {
        row(
            "raw socket relay (baseline)",
            format!("{} msg/s", thousands(x)),
            "",
            None,
            "1.00× raw relay".into(),
        );
    }
    if let Some(x) = get("durable_send_msgs_per_sec") {
        row(
            "durable agents__send (accepted)",
            format!("{} msg/s", thousands(x)),
            "≥ 50 000",
            Some(x >= 50_000.0),
            vs_raw(x),
        );
    }
    if let (Some(p50), Some(p99)) =
        (get("durable_send_latency_p50_us"), get("durable_send_latency_p99_us"))
    {
        row(
            "  one at a time: accept latency p50/p99",
            format!("{p50:.0}/{p99:.0} µs"),
            "",
            None,
            String::new(),
        );
    }
    if let Some(x) = get("durable_delivered_msgs_per_sec") {
        row(
            "  delivered + acked meanwhile",
            format!("{} msg/s", thousands(x)),
            "",
            None,
            String::new(),
        );
    }
    if let (Some(p50), Some(p99)) = (get("request_rtt_p50_us"), get("request_rtt_p99_us")) {
        let vs = |k: &str, x: f64| {
            get(k).map_or(String::new(), |b| format!("{:.2}× raw relay ({b:.1} µs)", x / b))
        };
        row(
            "agents__request round trip p50",
            format!("{p50:.1} µs"),
            "≤ 100 µs",
            Some(p50 <= 100.0),
            vs("raw_relay_request_rtt_p50_us", p50),
        );
        row(
            "agents__request round trip p99",
            format!("{p99:.1} µs"),
            "≤ 1 000 µs",
            Some(p99 <= 1000.0),
            vs("raw_relay_request_rtt_p99_us", p99),
        );
    }
    if let Some(x) = get("up_to_ready_ms") {
        row(
            "up → 7 agents ready",
            format!("{x:.1} ms"),
            "≤ 500 ms",
            Some(x <= 500.0),
            String::new(),
        );
    }
    if let Some(x) = get("restart_to_ready_ms") {
        let mut detail =
            get("restart_to_ready_max_ms").map_or(String::new(), |m| format!("max {m:.1} ms"));
        if let (Some(u), Some(r)) =
            (get("restart_to_ready_uncaged_ms"), get("restart_caged_over_uncaged"))
        {
            detail.push_str(&format!("; uncaged {u:.1} ms, caged/uncaged {r:.2}×"));
        }
        row(
            "kill -9 → ready again (median, caged)",
            format!("{x:.1} ms"),
            "≤ 250 ms",
            Some(x <= 250.0),
            detail,
        );
    }
    if let Some(x) = get("idle_agent_rss_bytes") {
        let mb = x / (1024.0 * 1024.0);
        let detail = get("idle_agent_rss_max_bytes")
            .map_or(String::new(), |m| format!("max {:.1} MiB", m / 1048576.0));
        row(
            "idle flock-agent RSS (median of 7)",
            format!("{mb:.1} MiB"),
            "≤ 15 MB",
            Some(x <= 15e6),
            detail,
        );
    }
    if let Some(x) = get("routed_send_dropped")
        && x > 0.0
    {
        println!("note: {x} at_most_once messages were dropped by the router (target outbox full)");
    }
}
