//! Chat bridges' processes (`flock-bridge`, issue #9): one per `bridges:` entry of the swarm
//! file, started after the agents, restarted with the swarm's backoff when it exits, stopped
//! before the agents. Each spawn gets a fresh token, announced to the router first
//! ([`RouterMsg::ExpectBridge`]), and the platform token read from the variable `token_env`
//! names — in no other process's environment, never in a log line.
//! Exit code 78 means "a restart cannot fix this" (the platform refused the token): no restart.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use flock_actors::RouterMsg;
use flock_config::{BridgeSpec, SupervisionSpec};
use flock_llm::Secret;
use nix::sys::signal::Signal;
use ractor::ActorRef;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::watch;

use crate::backoff::{RestartDecision, RestartHistory};
use crate::logs::LogHub;
use crate::spawn::{SpawnSpec, Spawner, signal_group};

/// The binary's name.
pub const BINARY: &str = "flock-bridge";
/// flock-bridge's exit code for a problem a restart cannot fix.
const EXIT_CONFIG: i32 = 78;
/// How long a bridge may take to finish what it is sending after `Shutdown`.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Finds `flock-bridge`: `$FLOCK_BRIDGE_BIN`, else next to this executable.
pub fn bridge_binary() -> Result<PathBuf> {
    crate::spawn::sibling_binary(
        BINARY,
        "FLOCK_BRIDGE_BIN",
        "the swarm has chat bridges; build it with `cargo build --release --bins` (scripts/setup does)",
    )
}

/// Its log name: `bridge-<name>` (`flockctl logs bridge-<name>`).
pub fn log_name(bridge: &str) -> String {
    format!("bridge-{bridge}")
}

/// What `flockctl ps` shows of a helper process (a bridge, `flock-model`).
#[derive(Debug, Clone, Default)]
pub struct ProcessStatus {
    pub pid: Option<u32>,
    pub state: String,
    pub started: Option<Instant>,
    pub restarts: u32,
    pub last_exit: Option<String>,
}

/// One running bridge and its keeper task.
pub struct BridgeProcess {
    pub name: String,
    pub platform: &'static str,
    pub spec: BridgeSpec,
    status: Arc<Mutex<ProcessStatus>>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl BridgeProcess {
    pub fn status(&self) -> ProcessStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// `Shutdown` through the router, SIGTERM then SIGKILL if it lingers; returns once it is gone.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// Everything a keeper needs to (re)start its bridge.
pub struct BridgeEnv {
    pub program: PathBuf,
    pub socket: PathBuf,
    pub cwd: PathBuf,
    pub supervision: SupervisionSpec,
    pub spawner: Spawner,
    pub logs: LogHub,
    pub router: ActorRef<RouterMsg>,
}

/// Starts a keeper per bridge. `tokens` maps each bridge's `token_env` to its value (checked
/// by the caller: every bridge has one).
pub fn start_all(
    specs: &[BridgeSpec],
    tokens: &std::collections::HashMap<String, Secret>,
    env: &Arc<BridgeEnv>,
) -> Vec<Arc<BridgeProcess>> {
    let mut out = Vec::new();
    for spec in specs {
        let Some(token) = tokens.get(&spec.token_env).cloned() else { continue };
        if let Some(dm) = spec.dm.as_ref().filter(|d| d.allow.is_none()) {
            tracing::warn!(
                bridge = %spec.name,
                "bridge {}: `{}` answers direct messages from anyone who reaches the bot; set \
                 `dm: {{allow: [user ids]}}` to limit it, or `dm: false`",
                spec.name,
                dm.agent
            );
        }
        let app_token = spec.app_token_env.as_ref().and_then(|v| tokens.get(v).cloned());
        let status =
            Arc::new(Mutex::new(ProcessStatus { state: "starting".into(), ..Default::default() }));
        let (stop, stop_rx) = watch::channel(false);
        let keeper = Keeper {
            name: spec.name.clone(),
            token,
            app_token,
            env: env.clone(),
            status: status.clone(),
        };
        let task = tokio::spawn(keeper.run(stop_rx));
        out.push(Arc::new(BridgeProcess {
            name: spec.name.clone(),
            platform: spec.platform.as_str(),
            spec: spec.clone(),
            status,
            stop,
            task: Mutex::new(Some(task)),
        }));
    }
    out
}

struct Keeper {
    name: String,
    token: Secret,
    /// Slack's app-level token (Socket Mode).
    app_token: Option<Secret>,
    env: Arc<BridgeEnv>,
    status: Arc<Mutex<ProcessStatus>>,
}

impl Keeper {
    fn set(&self, f: impl FnOnce(&mut ProcessStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// A note in the bridge's log, and an event in the supervisor's.
    fn log(&self, line: &str) {
        tracing::info!(bridge = %self.name, "bridge {}: {line}", self.name);
        self.env.logs.line(&log_name(&self.name), "flock", line);
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut history = RestartHistory::default();
        loop {
            self.set(|s| s.state = "starting".into());
            let session = crate::spawn::new_token();
            let _ = self.env.router.cast(RouterMsg::ExpectBridge {
                bridge: self.name.clone(),
                token: session.clone(),
            });
            let env = vec![
                (flock_ipc::env::SOCKET.into(), self.env.socket.display().to_string()),
                (flock_ipc::env::AGENT.into(), self.name.clone()),
            ];
            // The tokens go over the inherited socket, never the environment (which /proc
            // shows other processes of the user until the bridge makes itself non-dumpable).
            let mut secrets = std::collections::BTreeMap::from([
                (flock_ipc::env::TOKEN.to_owned(), session),
                (flock_ipc::env::PLATFORM_TOKEN.to_owned(), self.token.expose().to_owned()),
            ]);
            if let Some(app) = &self.app_token {
                secrets
                    .insert(flock_ipc::env::PLATFORM_APP_TOKEN.to_owned(), app.expose().to_owned());
            }
            let spec = SpawnSpec {
                program: self.env.program.clone(),
                args: Vec::new(),
                cwd: self.env.cwd.clone(),
                env,
                secrets,
            };
            let mut child = match self.env.spawner.spawn(spec).await {
                Ok(child) => child,
                Err(e) => {
                    let why = format!("{e:#}");
                    self.log(&format!("could not start: {why}"));
                    self.set(|s| (s.state, s.last_exit) = ("failed".into(), Some(why)));
                    return;
                }
            };
            let pid = child.id().unwrap_or(0);
            let spawned = Instant::now();
            self.set(|s| {
                (s.pid, s.started, s.state) = (Some(pid), Some(spawned), "running".into())
            });
            self.log(&format!("spawned pid {pid}"));
            let last_error = Arc::new(Mutex::new(String::new()));
            let name = log_name(&self.name);
            let readers = [
                child
                    .stdout
                    .take()
                    .map(|o| spawn_lines(self.env.logs.clone(), name.clone(), "out", o, None)),
                child.stderr.take().map(|e| {
                    spawn_lines(
                        self.env.logs.clone(),
                        name.clone(),
                        "err",
                        e,
                        Some(last_error.clone()),
                    )
                }),
            ];
            let status = tokio::select! {
                status = child.wait() => status,
                _ = stop.changed() => {
                    self.set(|s| s.state = "stopping".into());
                    let _ = self.env.router.cast(RouterMsg::StopBridge { bridge: self.name.clone() });
                    if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_err() {
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
            };
            for task in readers.into_iter().flatten() {
                let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
            }
            let exit = match &status {
                Ok(s) => crate::spawn::describe(s),
                Err(e) => format!("wait failed: {e}"),
            };
            let error = last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            self.log(&format!("exited: {exit}"));
            let detail = if error.is_empty() { exit } else { format!("{exit}: {error}") };
            self.set(|s| (s.pid, s.last_exit) = (None, Some(detail)));
            if status.as_ref().ok().and_then(|s| s.code()) == Some(EXIT_CONFIG) {
                self.log("not restarted: a restart cannot fix this (see the error above)");
                self.set(|s| s.state = "failed".into());
                return;
            }
            let jitter = fastrand::f64() * 2.0 - 1.0;
            let decision =
                history.on_death(&self.env.supervision, Instant::now(), spawned.elapsed(), jitter);
            match decision {
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
                    self.log("too many restarts: given up");
                    self.set(|s| s.state = "failed".into());
                    return;
                }
            }
        }
    }
}

/// Copies a pipe into the log; with `last`, keeps its last `error:` line (the reason of an exit).
fn spawn_lines(
    logs: LogHub,
    name: String,
    stream: &'static str,
    pipe: impl AsyncRead + Unpin + Send + 'static,
    last: Option<Arc<Mutex<String>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            logs.line(&name, stream, &line);
            let message = crate::logs::message_of(&line);
            if let (Some(last), Some(i)) = (&last, message.find("error: ")) {
                *last.lock().unwrap_or_else(|p| p.into_inner()) = message[i + 7..].to_owned();
            }
        }
    })
}
