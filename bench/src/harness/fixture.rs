//! What every scenario stands on: the run's options, the binaries, a real supervisor with its
//! control connection (`Swarm`, `Ctl`), child processes, CPU and memory meters.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use flock_ipc::{
    Body, Connection, ControlReply, ControlRequest, Frame, OPERATOR, PsRow, ROUTER, SendMode,
};
use serde_json::{Map, Value, json};

use crate::proto::median_f64;

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
    /// The durable receiver's delivery window (`delivery.window`): messages handed to it before
    /// it has acknowledged the earlier ones. The durable figure also runs once at 1 (baseline).
    #[arg(long, default_value_t = 256)]
    pub delivery_window: u32,
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
    /// Durable messages sent from one host to another (the `cluster` figure), and on one host
    /// and as bare JetStream publishes beside it.
    #[arg(long, default_value_t = 5_000)]
    pub cluster_count: u64,
    /// Only these figures (comma-separated): routed,raw,durable,request,up,restart,rss,sandbox,
    /// memory,memory_cli,recall,bridge,observe,ui,cluster,scale,memory_real (the last three are
    /// left out unless named: cluster needs nats-server, scale starts `--agents` processes,
    /// memory_real embeds 100 000 records with the model, ~40 min on 2 cores).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Agents of the `scale` figure (beside 10 in the same run).
    #[arg(long, default_value_t = 1_000)]
    pub agents: usize,
    /// `supervision.parallel` of the `scale` figure: agents starting (and stopping) at once.
    /// `up` of `--agents` is also timed once at 1 (each after the previous is ready).
    #[arg(long, default_value_t = 8)]
    pub parallel: u32,
    /// Where flock-supervisor and flock-agent are [default: next to this executable].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Keep the temporary state dirs (their path is printed).
    #[arg(long)]
    pub keep: bool,
}

pub(super) struct Bins {
    pub(super) supervisor: PathBuf,
    pub(super) bench: PathBuf,
}

impl Bins {
    pub(super) fn find(dir: Option<&Path>) -> Result<Self> {
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

pub(super) fn num(m: &Map<String, Value>, key: &str) -> Option<f64> {
    m.get(key).and_then(Value::as_f64)
}

pub(super) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(super) fn f(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// A generated swarm file's agents: (name, command). `None` runs the real flock-agent.
pub(super) fn swarm_yaml(name: &str, agents: &[(String, Option<Vec<String>>)]) -> String {
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

pub(super) fn bench_agent(bins: &Bins, mode: &str) -> Option<Vec<String>> {
    Some(vec![bins.bench.display().to_string(), "agent".into(), mode.into()])
}

/// A running `flock-supervisor up` on a generated swarm file.
pub(super) struct Swarm {
    pub(super) child: Child,
    pub(super) state: PathBuf,
    pub(super) log: PathBuf,
    pub(super) spawned: Instant,
}

impl Swarm {
    pub(super) fn start(bins: &Bins, dir: &Path, yaml: &str) -> Result<Swarm> {
        Swarm::start_with(bins, dir, yaml, &[])
    }

    pub(super) fn start_with(
        bins: &Bins,
        dir: &Path,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Result<Swarm> {
        Swarm::start_full(bins, dir, yaml, env, &[])
    }

    pub(super) fn start_full(
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

    pub(super) fn control_socket(&self) -> PathBuf {
        self.state.join("run").join("control.sock")
    }

    pub(super) fn workspace(&self, agent: &str) -> PathBuf {
        self.state.join("workspaces").join(agent)
    }

    pub(super) fn check_alive(&mut self) -> Result<()> {
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
    pub(super) async fn wait_ready(&mut self, n: usize) -> Result<(Ctl, Duration)> {
        self.wait_ready_within(n, Duration::from_secs(30)).await
    }

    /// [`Swarm::wait_ready`] with a deadline of `wait` (a large swarm takes longer).
    pub(super) async fn wait_ready_within(
        &mut self,
        n: usize,
        wait: Duration,
    ) -> Result<(Ctl, Duration)> {
        let deadline = Instant::now() + wait;
        let sock = self.control_socket();
        let mut ctl = loop {
            if let Ok(conn) = Connection::client(&sock, "flock-bench").await {
                break Ctl { conn };
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "the control socket {} did not answer within {} s",
                    sock.display(),
                    wait.as_secs()
                );
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
                    "only {ready} of {n} agents ready after {} s; log {}:\n{}",
                    wait.as_secs(),
                    self.log.display(),
                    tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// `flockctl down`, then waits for the supervisor to exit (killing it after 15 s).
    pub(super) async fn down(self, ctl: Option<Ctl>) -> Result<()> {
        self.down_within(ctl, Duration::from_secs(15)).await.map(drop)
    }

    /// Stops the swarm; how long the supervisor took to exit (`None`: it was still running
    /// after `within` and was killed).
    pub(super) async fn down_within(
        mut self,
        ctl: Option<Ctl>,
        within: Duration,
    ) -> Result<Option<Duration>> {
        let asked = Instant::now();
        if let Some(mut ctl) = ctl {
            let _ = ctl.call(Body::Control(ControlRequest::Down)).await;
        } else {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        while self.child.try_wait()?.is_none() {
            if asked.elapsed() > within {
                say!("flock-supervisor did not stop within {} s: killing it", within.as_secs());
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(Some(asked.elapsed()))
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

pub(super) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// A control connection (to the supervisor or to the relay).
pub(super) struct Ctl {
    pub(super) conn: Connection,
}

impl Ctl {
    /// Sends `body` from the operator and returns the first frame answering it.
    pub(super) async fn call(&mut self, body: Body) -> Result<Frame> {
        self.call_to(ROUTER, body).await
    }

    pub(super) async fn call_to(&mut self, to: &str, body: Body) -> Result<Frame> {
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

    pub(super) async fn ps(&mut self) -> Result<Vec<PsRow>> {
        match self.call(Body::Control(ControlRequest::Ps)).await?.body {
            Body::ControlReply(ControlReply::Ps(rows)) => Ok(rows),
            Body::Error { code, message } => bail!("ps failed ({code}): {message}"),
            other => bail!("ps answered with {}", other.kind()),
        }
    }

    /// A durable send from the operator; returns once it is accepted.
    pub(super) async fn send(&mut self, to: &str, text: String) -> Result<()> {
        match self.call_to(to, Body::Send { text, mode: SendMode::Durable }).await?.body {
            Body::Accepted => Ok(()),
            Body::Error { code, message } => bail!("send to {to} failed ({code}): {message}"),
            other => bail!("send to {to} answered with {}", other.kind()),
        }
    }

    /// Like [`Ctl::send`] but at_most_once: nothing to wait for (the relay stores nothing).
    pub(super) async fn send_at_most_once(&mut self, to: &str, text: String) -> Result<()> {
        let frame = Frame::new(OPERATOR, to, Body::Send { text, mode: SendMode::AtMostOnce });
        self.conn.outbox.send(frame).await.map_err(|_| anyhow!("control connection closed"))
    }
}

/// Waits for a result file an agent writes, while `alive` keeps saying its processes run.
pub(super) async fn wait_result(
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

/// CPU time (user + system) that processes spend during a load run, per message sent.
pub(super) struct CpuMeter {
    pub(super) pids: Vec<Option<u32>>,
    pub(super) before: Vec<Option<u64>>,
}

impl CpuMeter {
    pub(super) fn start(pids: &[Option<u32>]) -> Self {
        CpuMeter {
            pids: pids.to_vec(),
            before: pids.iter().map(|p| p.and_then(cpu_ticks)).collect(),
        }
    }

    /// Adds `cpu_ns_per_msg: [server, sender, sink]` to a round's result (`sent` messages).
    pub(super) fn finish(self, r: &mut Value) {
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
pub(super) fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it are space-separated.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    // After the name: state is field 3, utime 14, stime 15 (1-based in proc(5)).
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Resident set size from `/proc/<pid>/status` (VmRSS).
pub(super) fn vm_rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).context("no VmRSS line")?;
    let kb: u64 = line.split_whitespace().nth(1).context("empty VmRSS")?.parse()?;
    Ok(kb * 1024)
}

/// One HTTP/1.1 GET over a plain socket: (status, body).
pub(super) async fn http_get(addr: &str, path: &str, headers: &str) -> Result<(u16, String)> {
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

/// Processes started directly by the harness; killed when dropped.
#[derive(Default)]
pub(super) struct Procs(pub(super) Vec<Child>);

impl Procs {
    pub(super) fn check_alive(&mut self, dir: &Path) -> Result<()> {
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

/// Copies a requester's percentiles into `<key>_p50_us` and friends.
pub(super) fn latency(out: &mut Map<String, Value>, key: &str, r: &Value) {
    for p in ["p50", "p90", "p99", "p999", "max", "mean"] {
        out.insert(format!("{key}_{p}_us"), json!(round3(f(r, &format!("{p}_us")))));
    }
}

/// Copies a request run's CPU cost per round trip (server, requester, echo) into `<key>_…`.
pub(super) fn request_cpu(out: &mut Map<String, Value>, key: &str, r: &Value) {
    let Some(cpu) = r.get("cpu_ns_per_msg").and_then(Value::as_array) else { return };
    for (who, v) in ["server", "requester", "echo"].iter().zip(cpu) {
        if let Some(ns) = v.as_f64() {
            out.insert(format!("{key}_{who}_cpu_us_per_rtt"), json!(round3(ns / 1000.0)));
        }
    }
}

/// Summarises at_most_once rounds into `<key>_msgs_per_sec` (median) and friends.
pub(super) fn throughput(out: &mut Map<String, Value>, key: &str, rounds: &[Value]) {
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

/// `kill -9 PID`.
pub(super) fn kill9(pid: u32) -> Result<()> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .with_context(|| format!("kill -9 {pid}"))
}
