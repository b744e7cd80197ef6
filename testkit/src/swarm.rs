//! The [`Swarm`] fixture: a swarm file (and its transcripts) in a temp dir, a private state dir,
//! and `flock-supervisor up` running as a child of the test. Dropping it stops the swarm
//! (`flockctl down`), and if that does not work, kills the supervisor and every agent of this
//! state dir, so a failed test never leaves processes behind. The temp dir is removed, except
//! after a failure, when its path is printed instead.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;
use tempfile::TempDir;

use crate::proc::{self, pids_with_env, try_run, wait_timeout};
use crate::{POLL, bin, tail};

/// How long `up` may take until every agent is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one `flockctl` call may take.
const CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a graceful stop may take before the fixture kills everything.
const DOWN_TIMEOUT: Duration = Duration::from_secs(15);

/// Builds a [`Swarm`]: the swarm file text, extra files beside it, agents not expected to become
/// ready (crash loops), then [`SwarmBuilder::start`].
#[derive(Debug)]
pub struct SwarmBuilder {
    yaml: Option<String>,
    source: Option<PathBuf>,
    files: Vec<(PathBuf, String)>,
    not_ready: Vec<String>,
    env: Vec<(String, String)>,
    up_args: Vec<String>,
}

impl SwarmBuilder {
    /// Adds arguments to `flock-supervisor up` (e.g. `--ui 127.0.0.1:0`).
    pub fn up_args(mut self, args: &[&str]) -> Self {
        self.up_args.extend(args.iter().map(|a| (*a).to_owned()));
        self
    }

    /// Sets an environment variable of the supervisor (e.g. a bridge's bot token).
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Writes `text` to `rel` (relative to the swarm file, e.g. `transcripts/slow.yaml`).
    pub fn file(mut self, rel: impl AsRef<Path>, text: &str) -> Self {
        self.files.push((rel.as_ref().to_path_buf(), text.to_owned()));
        self
    }

    /// Does not wait for `agent` to become ready at startup (it is expected to crash).
    pub fn not_ready(mut self, agent: &str) -> Self {
        self.not_ready.push(agent.to_owned());
        self
    }

    /// Starts `flock-supervisor up` and waits until every agent is ready.
    #[track_caller]
    pub fn start(self) -> Swarm {
        let mut swarm = self.spawn();
        swarm.wait_ready();
        swarm
    }

    /// Starts `flock-supervisor up` and returns at once (a standby starts nothing for a while):
    /// [`Swarm::ready`] waits for it.
    #[track_caller]
    pub fn spawn(self) -> Swarm {
        let dir =
            tempfile::Builder::new().prefix("flock-e2e-").tempdir().expect("create a temp dir");
        let file = match (&self.source, &self.yaml) {
            (Some(source), _) => source.clone(),
            (None, Some(yaml)) => {
                let file = dir.path().join("swarm.yaml");
                std::fs::write(&file, yaml).expect("write the swarm file");
                file
            }
            (None, None) => unreachable!("a builder has a swarm file or its text"),
        };
        for (rel, text) in &self.files {
            let path = dir.path().join(rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("create a fixture folder");
            }
            std::fs::write(&path, text).expect("write a fixture file");
        }
        let mut swarm = Swarm {
            state: dir.path().join("state"),
            supervisor_out: dir.path().join("supervisor.out"),
            file,
            dir,
            supervisor: None,
            not_ready: self.not_ready,
            env: self.env,
            up_args: self.up_args,
        };
        swarm.spawn_supervisor();
        swarm
    }
}

/// A running swarm under test. See the module docs.
#[derive(Debug)]
pub struct Swarm {
    dir: TempDir,
    state: PathBuf,
    file: PathBuf,
    supervisor_out: PathBuf,
    supervisor: Option<Child>,
    not_ready: Vec<String>,
    env: Vec<(String, String)>,
    up_args: Vec<String>,
}

impl Swarm {
    /// A swarm from the text of a swarm file (written to `<tmp>/swarm.yaml`).
    pub fn builder(yaml: &str) -> SwarmBuilder {
        SwarmBuilder {
            yaml: Some(yaml.to_owned()),
            source: None,
            files: Vec::new(),
            not_ready: Vec::new(),
            env: Vec::new(),
            up_args: Vec::new(),
        }
    }

    /// A swarm from an existing swarm file (e.g. one of the repository's examples), used in place.
    pub fn builder_from_file(path: impl AsRef<Path>) -> SwarmBuilder {
        SwarmBuilder {
            yaml: None,
            source: Some(path.as_ref().to_path_buf()),
            files: Vec::new(),
            not_ready: Vec::new(),
            env: Vec::new(),
            up_args: Vec::new(),
        }
    }

    /// `Swarm::builder(yaml).start()`.
    #[track_caller]
    pub fn start(yaml: &str) -> Swarm {
        Swarm::builder(yaml).start()
    }

    /// The temp dir holding the swarm file, fixture files, the state dir and supervisor output.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    pub fn swarm_file(&self) -> &Path {
        &self.file
    }

    pub fn router_socket(&self) -> PathBuf {
        self.state.join("run").join("router.sock")
    }

    pub fn control_socket(&self) -> PathBuf {
        self.state.join("run").join("control.sock")
    }

    /// Pid of the running `flock-supervisor`, if any.
    pub fn supervisor_pid(&self) -> Option<u32> {
        self.supervisor.as_ref().map(Child::id)
    }

    /// Everything the supervisor processes of this fixture printed.
    pub fn supervisor_output(&self) -> String {
        std::fs::read_to_string(&self.supervisor_out).unwrap_or_default()
    }

    /// `flockctl --state-dir <state> ARGS`, with a deadline.
    #[track_caller]
    pub fn ctl(&self, args: &[&str]) -> Output {
        self.ctl_within(args, CTL_TIMEOUT)
    }

    /// [`Swarm::ctl`] with another deadline (`send --wait` on a real model takes longer).
    #[track_caller]
    pub fn ctl_within(&self, args: &[&str], timeout: Duration) -> Output {
        let mut cmd = Command::new(bin("flockctl"));
        // The full tables whatever terminal the tests run in (`ps` fits `COLUMNS`).
        cmd.arg("--state-dir").arg(&self.state).args(args).env_remove("FLOCK_HOME");
        cmd.env_remove("COLUMNS");
        match try_run(&mut cmd, timeout) {
            Ok(out) => out,
            Err(e) => panic!("{}", self.report(&e)),
        }
    }

    /// [`Swarm::ctl`] that must succeed; returns its stdout.
    #[track_caller]
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        if !out.status.success() {
            let msg = format!(
                "`flockctl {}` failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            panic!("{}", self.report(&msg));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `flockctl ps --json`, or why it failed.
    pub fn try_ps(&self) -> Result<Vec<Value>, String> {
        let mut cmd = Command::new(bin("flockctl"));
        cmd.arg("--state-dir").arg(&self.state).args(["ps", "--json"]).env_remove("FLOCK_HOME");
        let out = try_run(&mut cmd, CTL_TIMEOUT)?;
        if !out.status.success() {
            return Err(format!(
                "flockctl ps failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        match serde_json::from_slice(&out.stdout) {
            Ok(Value::Array(rows)) => Ok(rows),
            Ok(other) => Err(format!("flockctl ps --json printed a non-array: {other}")),
            Err(e) => Err(format!("flockctl ps --json printed bad JSON: {e}")),
        }
    }

    /// Every row of `flockctl ps --json` (supervisor, actors, agents).
    #[track_caller]
    pub fn ps(&self) -> Vec<Value> {
        match self.try_ps() {
            Ok(rows) => rows,
            Err(e) => panic!("{}", self.report(&e)),
        }
    }

    /// The agent rows of `ps`, in start order.
    #[track_caller]
    pub fn agents(&self) -> Vec<Value> {
        self.ps().into_iter().filter(|r| r["kind"] == "agent").collect()
    }

    /// The `ps` row of one agent.
    #[track_caller]
    pub fn agent(&self, name: &str) -> Value {
        let rows = self.ps();
        match rows.iter().find(|r| r["kind"] == "agent" && r["name"] == name) {
            Some(row) => row.clone(),
            None => panic!("{}", self.report(&format!("no agent `{name}` in ps"))),
        }
    }

    /// The pid of the agent (or other supervised process: `flock-model`, `bridge-<name>`) of
    /// this name, if it is running.
    #[track_caller]
    pub fn pid_of(&self, name: &str) -> Option<u32> {
        let rows = self.ps();
        let row = rows.iter().find(|r| r["name"] == name && r["kind"] != "actor");
        match row {
            Some(row) => row["pid"].as_u64().map(|p| p as u32),
            None => panic!("{}", self.report(&format!("no process `{name}` in ps"))),
        }
    }

    /// The agent's state (`ready`, `busy`, `backoff`, `failed`, …).
    #[track_caller]
    pub fn state_of(&self, name: &str) -> String {
        self.agent(name)["state"].as_str().unwrap_or_default().to_owned()
    }

    /// The agent's completed turns (persisted across restarts).
    #[track_caller]
    pub fn turns_total(&self, name: &str) -> u64 {
        self.agent(name)["turns_total"].as_u64().unwrap_or_default()
    }

    /// Sends `signal` to the agent's processes — its process group, as the supervisor signals
    /// it: a caged agent runs under its stand-in, the pid `ps` shows (SIGSTOP of the stand-in
    /// alone would not freeze the agent); returns the pid. Panics if it is not running.
    #[track_caller]
    pub fn signal(&self, name: &str, signal: Signal) -> u32 {
        let Some(pid) = self.pid_of(name) else {
            panic!("{}", self.report(&format!("cannot signal `{name}`: it has no pid")));
        };
        assert!(
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), signal).is_ok(),
            "{}",
            self.report(&format!("{signal} to {name} (pid {pid}) failed"))
        );
        pid
    }

    /// `kill -9` the agent's process; returns the pid that was killed.
    #[track_caller]
    pub fn kill9(&self, name: &str) -> u32 {
        self.signal(name, Signal::SIGKILL)
    }

    /// The agent's log file (`<state>/logs/<name>.log`), empty if it does not exist yet.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.state.join("logs").join(format!("{name}.log")))
            .unwrap_or_default()
    }

    /// Polls `cond` every 20 ms until it holds. After `timeout`, panics with `what`, the last
    /// `ps`, the supervisor's output and the tail of every agent log.
    #[track_caller]
    pub fn wait_until(&self, mut cond: impl FnMut() -> bool, timeout: Duration, what: &str) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}",
                    self.report(&format!("timed out after {timeout:?} waiting until {what}"))
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until `name`'s log contains `needle`.
    #[track_caller]
    pub fn wait_for_log(&self, name: &str, needle: &str, timeout: Duration) {
        self.wait_until(
            || self.log(name).contains(needle),
            timeout,
            &format!("{name}'s log shows {needle:?}"),
        );
    }

    /// `kill -9` the supervisor and reap it. Its agents die with it (`PR_SET_PDEATHSIG`).
    #[track_caller]
    pub fn kill9_supervisor(&mut self) {
        let mut sup = self.supervisor.take().expect("the supervisor is running");
        proc::signal(sup.id(), Signal::SIGKILL);
        let _ = sup.wait();
    }

    /// `flock-supervisor up` again with the same file and state dir; waits until it is ready.
    #[track_caller]
    pub fn restart_supervisor(&mut self) {
        if let Some(sup) = &mut self.supervisor {
            assert!(
                matches!(sup.try_wait(), Ok(Some(_))),
                "restart_supervisor: the supervisor (pid {}) is still running",
                sup.id()
            );
        }
        self.spawn_supervisor();
        self.wait_ready();
    }

    /// `flock-supervisor up` again with the same file and state dir, without waiting (it may
    /// stop on its own: [`Swarm::exited_within`]).
    #[track_caller]
    pub fn spawn_again(&mut self) {
        assert!(self.supervisor.is_none(), "spawn_again: the supervisor is running");
        self.spawn_supervisor();
    }

    /// Waits until every agent of a swarm [`SwarmBuilder::spawn`] started is ready.
    #[track_caller]
    pub fn ready(&mut self) {
        self.wait_ready();
    }

    /// Waits up to `timeout` for the supervisor to end on its own; how it ended.
    #[track_caller]
    pub fn exited_within(&mut self, timeout: Duration) -> ExitStatus {
        let mut sup = self.supervisor.take().expect("the supervisor is running");
        match wait_timeout(&mut sup, timeout) {
            Some(status) => status,
            None => {
                self.supervisor = Some(sup);
                panic!(
                    "{}",
                    self.report(&format!("the supervisor did not exit within {timeout:?}"))
                );
            }
        }
    }

    /// `flockctl down`; returns how the supervisor process ended.
    #[track_caller]
    pub fn down(&mut self) -> ExitStatus {
        let out = self.ctl(&["down"]);
        assert!(
            out.status.success(),
            "{}",
            self.report(&format!("flockctl down failed: {}", String::from_utf8_lossy(&out.stderr)))
        );
        let mut sup = self.supervisor.take().expect("the supervisor is running");
        match wait_timeout(&mut sup, DOWN_TIMEOUT) {
            Some(status) => status,
            None => {
                self.supervisor = Some(sup);
                panic!("{}", self.report("the supervisor did not exit after `flockctl down`"));
            }
        }
    }

    /// Pids of live agent processes of this swarm (found by the router socket in their
    /// environment, so agents the supervisor lost track of are found too).
    pub fn live_agent_pids(&self) -> Vec<u32> {
        let entry = format!("{}={}", flock_ipc::env::SOCKET, self.router_socket().display());
        pids_with_env(&entry)
    }

    /// A failure message: `what`, then the swarm's state for diagnosis.
    pub fn report(&self, what: &str) -> String {
        let ps = match self.try_ps() {
            Ok(rows) => {
                let agents: Vec<String> = rows
                    .iter()
                    .filter(|r| r["kind"] == "agent")
                    .map(|r| {
                        format!(
                            "  {:<14} pid={:<8} state={:<12} restarts={} last_exit={} mailbox={} turns={}",
                            r["name"].as_str().unwrap_or("?"),
                            r["pid"],
                            r["state"].as_str().unwrap_or("?"),
                            r["restarts"],
                            r["last_exit"],
                            r["mailbox_depth"],
                            r["turns_total"]
                        )
                    })
                    .collect();
                agents.join("\n")
            }
            Err(e) => format!("  (ps failed: {e})"),
        };
        let mut logs = String::new();
        if let Ok(dir) = std::fs::read_dir(self.state.join("logs")) {
            let mut paths: Vec<PathBuf> = dir.flatten().map(|d| d.path()).collect();
            paths.sort();
            for p in paths {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                logs.push_str(&format!("--- {} (tail)\n{}\n", p.display(), tail(&text, 25)));
            }
        }
        let threads = self.supervisor_pid().map_or_else(|| "  (not running)".into(), threads);
        format!(
            "{what}\n--- ps\n{ps}\n--- supervisor threads (state, kernel wait)\n{threads}\n--- supervisor output (tail)\n{}\n{logs}",
            tail(&self.supervisor_output(), 40)
        )
    }

    fn spawn_supervisor(&mut self) {
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.supervisor_out)
            .expect("open the supervisor output file");
        let mut cmd = Command::new(bin("flock-supervisor"));
        cmd.arg("up")
            .arg(&self.file)
            .arg("--state-dir")
            .arg(&self.state)
            .args(&self.up_args)
            .env("FLOCK_AGENT_BIN", bin("flock-agent"))
            .env("FLOCK_BRIDGE_BIN", bin("flock-bridge"))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            // Must never reach an agent: the environment is cleared to an allowlist.
            .env("FLOCK_TEST_SECRET", "s3cr3t-must-not-leak")
            .env_remove("FLOCK_HOME")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("clone a file handle"))
            .stderr(out)
            // Its own process group: a Ctrl-C meant for the test runner is not its business,
            // and the teardown can kill the group.
            .process_group(0);
        die_with_this_thread(&mut cmd);
        let child = cmd.spawn().expect("spawn flock-supervisor");
        self.supervisor = Some(child);
    }

    /// Waits until the control socket answers and every agent is `ready` (or `busy`).
    #[track_caller]
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("the control socket did not appear");
        loop {
            if let Some(sup) = &mut self.supervisor
                && let Ok(Some(status)) = sup.try_wait()
            {
                let pid = sup.id();
                self.supervisor = None;
                panic!("{}", self.report(&format!("flock-supervisor (pid {pid}) exited with {status} before the swarm was ready")));
            }
            if self.control_socket().exists() {
                match self.try_ps() {
                    Ok(rows) => {
                        // Across hosts `ps` shows every host's agents: this one's is the first
                        // host row, and only its own agents are this supervisor's to start.
                        let here = rows.iter().find(|r| r["kind"] == "host").map(|r| &r["name"]);
                        let waiting: Vec<String> = rows
                            .iter()
                            .filter(|r| r["kind"] == "agent")
                            .filter(|r| here.is_none_or(|h| r["host"] == *h))
                            .filter(|r| !self.not_ready.iter().any(|n| r["name"] == n.as_str()))
                            .filter(|r| r["state"] != "ready" && r["state"] != "busy")
                            .map(|r| format!("{} is {}", r["name"], r["state"]))
                            .collect();
                        if waiting.is_empty() {
                            return;
                        }
                        last = waiting.join(", ");
                    }
                    Err(e) => last = e,
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "{}",
                    self.report(&format!(
                        "the swarm was not ready after {READY_TIMEOUT:?}: {last}"
                    ))
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Stops everything this fixture started; never panics.
    fn teardown(&mut self) {
        if let Some(mut sup) = self.supervisor.take()
            && matches!(sup.try_wait(), Ok(None))
        {
            // After a failure the swarm may be in any state (a SIGSTOPped agent would hold a
            // graceful stop up for its whole stop timeout): kill it, the agents follow.
            let graceful = !std::thread::panicking();
            if graceful {
                // A stopped agent cannot answer Shutdown; let it.
                for pid in self.live_agent_pids() {
                    proc::signal(pid, Signal::SIGCONT);
                }
                let mut down = Command::new(bin("flockctl"));
                down.arg("--state-dir").arg(&self.state).arg("down").env_remove("FLOCK_HOME");
                let _ = try_run(&mut down, DOWN_TIMEOUT);
            }
            if !graceful || wait_timeout(&mut sup, DOWN_TIMEOUT).is_none() {
                if graceful {
                    eprintln!(
                        "flock-testkit: the supervisor did not stop after `flockctl down`; killing it"
                    );
                }
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(sup.id() as i32),
                    Signal::SIGKILL,
                );
                let _ = sup.wait();
            }
        }
        // Agents die with their supervisor (PR_SET_PDEATHSIG); anything left is a bug we report
        // in the test's output, then clean up.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left = self.live_agent_pids();
            if left.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                eprintln!("flock-testkit: agents {left:?} outlived their supervisor; killing them");
                for pid in left {
                    proc::signal(pid, Signal::SIGKILL);
                }
                return;
            }
            std::thread::sleep(POLL);
        }
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        self.teardown();
        // After a failure, keep the state dir (logs, database) for whoever investigates.
        if std::thread::panicking() {
            self.dir.disable_cleanup(true);
            eprintln!("flock-testkit: kept {} for inspection", self.dir.path().display());
        }
    }
}

/// If the test process dies (a harness timeout, Ctrl-C), its supervisors must not live on: they
/// get SIGKILL when the spawning thread ends, and take their agents with them. The fixture's
/// teardown runs on that same thread, before it ends, so a normal test never triggers this.
#[allow(unsafe_code)]
fn die_with_this_thread(cmd: &mut Command) {
    // SAFETY: the hook runs between fork and exec and only makes the prctl and getppid
    // syscalls (async-signal-safe); it allocates nothing.
    let parent = std::process::id();
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if std::os::unix::process::parent_id() != parent {
                return Err(std::io::ErrorKind::Other.into());
            }
            Ok(())
        });
    }
}

/// Each thread of `pid`: its name, scheduler state and where in the kernel it waits (what a
/// report shows when the supervisor stops answering: all workers parked, or one stuck in I/O).
fn threads(pid: u32) -> String {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("  (pid {pid} has no /proc entry)");
    };
    let mut rows: Vec<String> = dir
        .flatten()
        .map(|t| {
            let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
            let stat = read("stat");
            let state = stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next());
            format!(
                "  {:<8} {:<18} {} {}",
                t.file_name().to_string_lossy(),
                read("comm").trim(),
                state.unwrap_or("?"),
                read("wchan")
            )
        })
        .collect();
    rows.sort();
    rows.join("\n")
}
