//! A helper process kept running — the embedded model (`flock-model`) and each chat bridge: it
//! is spawned, its output goes to its log, it is restarted with the swarm's backoff when it
//! exits, and stopped on request. What differs per kind — what to spawn, when it is ready, how
//! it is asked to stop — is its [`Kept`]; the loop is this one.
//!
//! Exit code [`EXIT_CONFIG`] (78) means "a restart cannot fix this" (a missing model file, a
//! token the platform refused): no restart. A process that exits before it was ever ready fails
//! its start: `up` reports why rather than retrying.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock_config::SupervisionSpec;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{oneshot, watch};

use crate::backoff::{RestartDecision, RestartHistory};
use crate::logs::LogHub;
use crate::spawn::{SpawnSpec, Spawner, signal_group};

/// The exit code of a kept process for a problem a restart cannot fix.
pub const EXIT_CONFIG: i32 = 78;
/// How long a process asked to stop may take before it gets SIGTERM, then SIGKILL 2 s later.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What `flockctl ps` shows of a kept process.
#[derive(Debug, Clone, Default)]
pub struct ProcessStatus {
    pub pid: Option<u32>,
    pub state: String,
    pub started: Option<Instant>,
    pub restarts: u32,
    pub last_exit: Option<String>,
}

/// One kind of kept process.
pub trait Kept: Send + Sync + 'static {
    /// Its name in the logs (`flockctl logs NAME`) and in the supervisor's events.
    fn name(&self) -> String;
    /// What to run, for each start (called again for every restart: a fresh token each time).
    fn spawn_spec(&self) -> SpawnSpec;
    /// Whether it announces readiness on stdout ([`Kept::ready_line`]); if not, it is
    /// `running` (and ready) once spawned.
    fn says_when_ready(&self) -> bool {
        false
    }
    /// Whether this line of its stdout says it is ready; if so, what to log after "ready ".
    fn ready_line(&self, _line: &str) -> Option<String> {
        None
    }
    /// Called when it became ready.
    fn up(&self) {}
    /// Called when it is gone or going (exited, stopping).
    fn down(&self) {}
    /// Asks the process (pid `pid`, its group's leader) to stop; it then has [`STOP_GRACE`].
    fn ask_to_stop(&self, pid: u32) {
        signal_group(pid, Signal::SIGTERM);
    }
}

/// A kept process and its keeper task.
pub struct KeptProcess {
    status: Arc<Mutex<ProcessStatus>>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl KeptProcess {
    /// Starts keeping `kept`. The receiver answers once the first spawn is ready, or with why it
    /// could not start (it could not be spawned, or exited before it was ready).
    pub fn start<K: Kept>(
        kept: K,
        supervision: SupervisionSpec,
        spawner: Spawner,
        logs: LogHub,
    ) -> (KeptProcess, oneshot::Receiver<Result<(), String>>) {
        let status =
            Arc::new(Mutex::new(ProcessStatus { state: "starting".into(), ..Default::default() }));
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();
        let keeper =
            Keeper { kept: Arc::new(kept), supervision, spawner, logs, status: status.clone() };
        let task = tokio::spawn(keeper.run(stop_rx, ready_tx));
        (KeptProcess { status, stop, task: Mutex::new(Some(task)) }, ready_rx)
    }

    pub fn status(&self) -> ProcessStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Asks it to stop ([`Kept::ask_to_stop`]), SIGTERM then SIGKILL if it lingers; returns once
    /// it is gone.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

struct Keeper<K> {
    kept: Arc<K>,
    supervision: SupervisionSpec,
    spawner: Spawner,
    logs: LogHub,
    status: Arc<Mutex<ProcessStatus>>,
}

impl<K: Kept> Keeper<K> {
    fn set(&self, f: impl FnOnce(&mut ProcessStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// A note in the process's log, and an event in the supervisor's.
    fn log(&self, line: &str) {
        let name = self.kept.name();
        tracing::info!(process = %name, "{name}: {line}");
        self.logs.line(&name, "flock", line);
    }

    async fn run(
        self,
        mut stop: watch::Receiver<bool>,
        ready: oneshot::Sender<Result<(), String>>,
    ) {
        let mut ready = Some(ready);
        let mut history = RestartHistory::default();
        let name = self.kept.name();
        loop {
            self.set(|s| s.state = "starting".into());
            let mut child = match self.spawner.spawn(self.kept.spawn_spec()).await {
                Ok(child) => child,
                Err(e) => {
                    let why = format!("{e:#}");
                    self.log(&format!("could not start: {why}"));
                    self.set(|s| (s.state, s.last_exit) = ("failed".into(), Some(why.clone())));
                    if let Some(r) = ready.take() {
                        let _ = r.send(Err(why));
                    }
                    return;
                }
            };
            let pid = child.id().unwrap_or(0);
            let spawned = Instant::now();
            self.set(|s| (s.pid, s.started) = (Some(pid), Some(spawned)));
            self.log(&format!("spawned pid {pid}"));
            if !self.kept.says_when_ready() {
                self.set(|s| s.state = "running".into());
                self.kept.up();
                if let Some(r) = ready.take() {
                    let _ = r.send(Ok(()));
                }
            }
            let last_error = Arc::new(Mutex::new(String::new()));
            let (said_tx, mut said_rx) = watch::channel(None::<String>);
            let readers = [
                child.stdout.take().map(|out| {
                    let (logs, name, kept) = (self.logs.clone(), name.clone(), self.kept.clone());
                    tokio::spawn(async move {
                        let mut lines = BufReader::new(out).lines();
                        while let Ok(Some(line)) = lines.next_line().await {
                            logs.line(&name, "out", &line);
                            if let Some(said) = kept.ready_line(&line) {
                                let _ = said_tx.send(Some(said));
                            }
                        }
                    })
                }),
                child.stderr.take().map(|err| {
                    let (logs, name, last) = (self.logs.clone(), name.clone(), last_error.clone());
                    tokio::spawn(keep_stderr(logs, name, err, last))
                }),
            ];
            let mut stdout_open = true;
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    changed = said_rx.changed(), if stdout_open => {
                        let said = said_rx.borrow_and_update().clone();
                        match (changed, said) {
                            (Err(_), _) => stdout_open = false,
                            (Ok(()), Some(said)) => {
                                self.set(|s| s.state = "ready".into());
                                self.kept.up();
                                self.log(&format!(
                                    "ready {said} after {} ms",
                                    spawned.elapsed().as_millis()
                                ));
                                if let Some(r) = ready.take() {
                                    let _ = r.send(Ok(()));
                                }
                            }
                            (Ok(()), None) => {}
                        }
                    }
                    _ = stop.changed() => {
                        self.kept.down();
                        self.set(|s| s.state = "stopping".into());
                        self.kept.ask_to_stop(pid);
                        if tokio::time::timeout(STOP_GRACE, child.wait()).await.is_err() {
                            signal_group(pid, Signal::SIGTERM);
                            if tokio::time::timeout(Duration::from_secs(2), child.wait()).await.is_err() {
                                signal_group(pid, Signal::SIGKILL);
                                let _ = child.wait().await;
                            }
                        }
                        self.log("stopped");
                        self.set(|s| (s.state, s.pid) = ("stopped".into(), None));
                        return;
                    }
                }
            };
            self.kept.down();
            // Its last words explain the exit: let the readers finish them.
            for task in readers.into_iter().flatten() {
                let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
            }
            let exit = match &status {
                Ok(s) => crate::spawn::describe(s),
                Err(e) => format!("wait failed: {e}"),
            };
            let error = last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            tracing::warn!(process = %name, pid, exit = %exit, "{name} exited: {exit}");
            self.logs.line(&name, "flock", &format!("exited: {exit}"));
            let detail = if error.is_empty() { exit } else { format!("{exit}: {error}") };
            self.set(|s| (s.pid, s.last_exit) = (None, Some(detail.clone())));
            let config_error = status.as_ref().ok().and_then(|s| s.code()) == Some(EXIT_CONFIG);
            if config_error {
                self.log("not restarted: a restart cannot fix this (see the error above)");
            }
            // Never ready: a restart would fail the same way; the starter reports why.
            if config_error || ready.is_some() {
                self.set(|s| s.state = "failed".into());
                if let Some(r) = ready.take() {
                    let _ = r.send(Err(detail));
                }
                return;
            }
            let jitter = fastrand::f64() * 2.0 - 1.0;
            match history.on_death(&self.supervision, Instant::now(), spawned.elapsed(), jitter) {
                RestartDecision::After(delay) => {
                    self.set(|s| (s.state, s.restarts) = ("restarting".into(), s.restarts + 1));
                    self.log(&format!("restarting in {} ms", delay.as_millis()));
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.changed() => {
                            self.set(|s| s.state = "stopped".into());
                            return;
                        }
                    }
                }
                RestartDecision::GiveUp => {
                    tracing::error!(process = %name, "{name}: too many restarts: given up");
                    self.logs.line(&name, "flock", "too many restarts: given up");
                    self.set(|s| s.state = "failed".into());
                    return;
                }
            }
        }
    }
}

/// Copies stderr into the log and keeps its last `error:` line (the reason of an exit).
async fn keep_stderr(
    logs: LogHub,
    name: String,
    err: impl AsyncRead + Unpin,
    last: Arc<Mutex<String>>,
) {
    let mut lines = BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        logs.line(&name, "err", &line);
        let message = crate::logs::message_of(&line);
        if let Some(i) = message.find("error: ") {
            *last.lock().unwrap_or_else(|p| p.into_inner()) = message[i + 7..].to_owned();
        }
    }
}
