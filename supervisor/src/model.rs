//! The embedded model's process, `flock-model` (DESIGN.md §7): started before the agents when the
//! swarm uses `provider: local` (the default when an agent names no model), restarted with the
//! swarm's backoff when it crashes, stopped after the agents. One process serves every agent.
//!
//! It serves on a Unix socket in the state dir's private `run/` folder (`run/model.sock`), not on
//! a TCP port: no agent can reach it (their cage does not show `run/`), so none can hold its
//! connections to keep the gateway out, and no other user or host can knock. Readiness is its
//! `listening on unix:PATH` line on stdout (printed once the model is loaded and the socket
//! bound). The gateway reaches it through a [`LocalLink`]: the base URL while it is up, the
//! token this supervisor made for it (`FLOCK_MODEL_TOKEN`, handed over an inherited socket, in no
//! process's environment) and a client bound to the socket. A restarted process binds the same
//! path, so calls retried by the gateway find it again.
//! Exit code 78 means "a restart cannot fix this" (missing or wrong model file): no restart.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_actors::gateway::LocalLink;
use flock_config::{LocalModel, SupervisionSpec};
use flock_llm::Secret;
use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::{oneshot, watch};

use crate::backoff::{RestartDecision, RestartHistory};
use crate::logs::LogHub;
use crate::spawn::{SpawnSpec, Spawner, signal_group};

/// Its name in `flockctl ps` and `flockctl logs`.
pub const NAME: &str = "flock-model";
/// flock-model's exit code for a problem a restart cannot fix.
const EXIT_CONFIG: i32 = 78;
/// Loading a 0.5 GB model (and hashing it the first time) takes seconds, not minutes.
const READY_TIMEOUT: Duration = Duration::from_secs(300);
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// `$FLOCK_HOME` (default `~/.flock`): models shared by every state dir.
pub fn flock_home() -> Option<PathBuf> {
    match std::env::var_os("FLOCK_HOME").filter(|h| !h.is_empty()) {
        Some(h) => Some(PathBuf::from(h)),
        None => std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| {
            let mut p = PathBuf::from(h);
            p.push(".flock");
            p
        }),
    }
}

/// Finds the `flock-model` binary: `$FLOCK_MODEL_BIN`, else next to this executable.
pub fn model_binary() -> Result<PathBuf> {
    crate::spawn::sibling_binary(
        NAME,
        "FLOCK_MODEL_BIN",
        "the swarm uses the embedded local model: run `scripts/setup` (it builds it), or give the \
         agents a remote model (`provider: openai` or `anthropic`, see README \"Models\")",
    )
}

/// What `flockctl ps` shows of the process.
pub use crate::bridges::ProcessStatus as ModelStatus;

/// The running `flock-model` and its keeper task.
pub struct ModelProcess {
    status: Arc<Mutex<ModelStatus>>,
    link: LocalLink,
    stop: watch::Sender<bool>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// Everything the keeper task needs to (re)start the process.
struct Keeper {
    program: PathBuf,
    model: PathBuf,
    /// The sha256 to check the file against (known models); `None`: `path:` files, unchecked.
    sha256: Option<&'static str>,
    settings: LocalModel,
    cwd: PathBuf,
    /// Where it serves (`run/model.sock`).
    socket: PathBuf,
    token: Secret,
    supervision: SupervisionSpec,
    spawner: Spawner,
    logs: LogHub,
    status: Arc<Mutex<ModelStatus>>,
    url: watch::Sender<Option<String>>,
}

impl ModelProcess {
    /// Starts `flock-model` and returns once it is ready, or with the reason it cannot run
    /// (missing binary or model file, wrong hash, a crash while loading).
    pub async fn start(
        settings: LocalModel,
        supervision: SupervisionSpec,
        spawner: Spawner,
        logs: LogHub,
        cwd: PathBuf,
        socket: PathBuf,
    ) -> Result<ModelProcess> {
        let program = model_binary()?;
        let client = flock_llm::LlmClient::over_unix_socket(&socket)
            .map_err(|e| anyhow::anyhow!("the embedded model's HTTP client: {e}"))?;
        let known = match (&settings.path, settings.known()) {
            (Some(_), _) => None,
            (None, Some(k)) => Some(k),
            (None, None) => bail!(
                "no local model named `{}`; known: {}",
                settings.model,
                flock_config::KnownModel::names().join(", ")
            ),
        };
        let model = match (&settings.path, known) {
            (Some(p), _) => p.clone(),
            (None, k) => {
                let home = flock_home().context(
                    "neither FLOCK_HOME nor HOME is set: cannot find the embedded model",
                )?;
                home.join("models").join(k.map_or("", |k| k.file))
            }
        };
        if !model.is_file() {
            bail!(
                "the embedded model file {} is missing; {}",
                model.display(),
                match known {
                    Some(k) if k.name == flock_config::KNOWN_LOCAL_MODELS[0].name => format!(
                        "run `scripts/setup` to fetch it (once per machine, {})",
                        k.description
                    ),
                    Some(k) => format!(
                        "run `scripts/setup --model {}` to fetch it (once per machine, {})",
                        k.name, k.description
                    ),
                    None => "fix `path:` of the swarm's `provider: local` model".to_owned(),
                }
            );
        }
        std::fs::create_dir_all(&cwd).with_context(|| format!("create {}", cwd.display()))?;
        let token = Secret::new(crate::spawn::new_token());
        let (url, url_rx) = watch::channel(None);
        let status =
            Arc::new(Mutex::new(ModelStatus { state: "starting".into(), ..Default::default() }));
        let (stop, stop_rx) = watch::channel(false);
        let (ready_tx, ready_rx) = oneshot::channel();
        let keeper = Keeper {
            program,
            model,
            sha256: known.map(|k| k.sha256),
            settings,
            cwd,
            socket,
            token: token.clone(),
            supervision,
            spawner,
            logs,
            status: status.clone(),
            url,
        };
        let task = tokio::spawn(keeper.run(stop_rx, ready_tx));
        let link = LocalLink { base_url: url_rx, token, client };
        let process = ModelProcess { status, link, stop, task: Mutex::new(Some(task)) };
        match tokio::time::timeout(READY_TIMEOUT, ready_rx).await {
            Ok(Ok(Ok(()))) => Ok(process),
            Ok(Ok(Err(why))) => {
                process.stop().await;
                bail!("the embedded model could not start: {why}")
            }
            Ok(Err(_)) => {
                process.stop().await;
                bail!("the embedded model's keeper stopped before it was ready")
            }
            Err(_) => {
                process.stop().await;
                bail!(
                    "the embedded model is not ready after {} s; see `flockctl logs {NAME}` or \
                     the state dir's logs/{NAME}.log",
                    READY_TIMEOUT.as_secs()
                )
            }
        }
    }

    /// How the gateway reaches it.
    pub fn link(&self) -> LocalLink {
        self.link.clone()
    }

    pub fn status(&self) -> ModelStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// SIGTERM, then SIGKILL after a few seconds; returns once the process is gone.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl Keeper {
    fn set(&self, f: impl FnOnce(&mut ModelStatus)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn spawn_spec(&self) -> SpawnSpec {
        let mut args = vec![
            "--model".to_owned(),
            self.model.display().to_string(),
            "--listen".into(),
            format!("unix:{}", self.socket.display()),
            "--ctx".into(),
            self.settings.ctx.to_string(),
            "--slots".into(),
            self.settings.slots.to_string(),
        ];
        if let Some(n) = self.settings.threads {
            args.extend(["--threads".into(), n.to_string()]);
        }
        match self.sha256 {
            Some(sha) => args.extend(["--sha256".into(), sha.to_owned()]),
            None => args.push("--no-verify".into()),
        }
        SpawnSpec {
            program: self.program.clone(),
            args,
            cwd: self.cwd.clone(),
            env: Vec::new(),
            // Over the inherited socket, never the environment (flock_ipc::handoff).
            secrets: [("FLOCK_MODEL_TOKEN".to_owned(), self.token.expose().to_owned())].into(),
        }
    }

    async fn run(
        self,
        mut stop: watch::Receiver<bool>,
        ready: oneshot::Sender<Result<(), String>>,
    ) {
        let mut ready = Some(ready);
        let mut history = RestartHistory::default();
        loop {
            self.set(|s| s.state = "starting".into());
            let mut child = match self.spawner.spawn(self.spawn_spec()).await {
                Ok(child) => child,
                Err(e) => {
                    let why = format!("{e:#}");
                    self.logs.line(NAME, "flock", &format!("could not start: {why}"));
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
            self.logs.line(NAME, "flock", &format!("spawned pid {pid}"));
            let last_error = Arc::new(Mutex::new(String::new()));
            let (addr_tx, mut addr_rx) = watch::channel(None::<String>);
            if let Some(out) = child.stdout.take() {
                tokio::spawn(watch_stdout(self.logs.clone(), out, addr_tx));
            }
            let stderr = child
                .stderr
                .take()
                .map(|err| tokio::spawn(keep_stderr(self.logs.clone(), err, last_error.clone())));
            let status = loop {
                tokio::select! {
                    status = child.wait() => break status,
                    changed = addr_rx.changed() => {
                        let addr = addr_rx.borrow_and_update().clone();
                        if changed.is_ok() && let Some(addr) = addr {
                            self.set(|s| s.state = "ready".into());
                            // The host is a name only: the link's client connects to the socket.
                            let _ = self.url.send(Some("http://flock-model/v1".to_owned()));
                            self.logs.line(NAME, "flock", &format!("ready on {addr} after {} ms", spawned.elapsed().as_millis()));
                            if let Some(r) = ready.take() {
                                let _ = r.send(Ok(()));
                            }
                        }
                    }
                    _ = stop.changed() => {
                        let _ = self.url.send(None);
                        self.set(|s| s.state = "stopping".into());
                        signal_group(pid, Signal::SIGTERM);
                        if tokio::time::timeout(STOP_TIMEOUT, child.wait()).await.is_err() {
                            signal_group(pid, Signal::SIGKILL);
                            let _ = child.wait().await;
                        }
                        self.logs.line(NAME, "flock", "stopped");
                        self.set(|s| (s.state, s.pid) = ("stopped".into(), None));
                        return;
                    }
                }
            };
            let _ = self.url.send(None);
            // Its last words explain the exit: let the reader finish them.
            if let Some(task) = stderr {
                let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
            }
            let exit = match &status {
                Ok(s) => crate::spawn::describe(s),
                Err(e) => format!("wait failed: {e}"),
            };
            let error = last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
            tracing::warn!(pid, exit = %exit, "flock-model exited: {exit}");
            self.logs.line(NAME, "flock", &format!("exited: {exit}"));
            let detail = if error.is_empty() { exit.clone() } else { format!("{exit}: {error}") };
            self.set(|s| (s.pid, s.last_exit) = (None, Some(detail.clone())));
            let config_error = status.as_ref().ok().and_then(|s| s.code()) == Some(EXIT_CONFIG);
            // Never ready: a restart would fail the same way; `up` reports why and stops.
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
                    tracing::info!(
                        delay_ms = delay.as_millis() as u64,
                        "flock-model restarting in {} ms",
                        delay.as_millis()
                    );
                    self.logs.line(
                        NAME,
                        "flock",
                        &format!("restarting in {} ms", delay.as_millis()),
                    );
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.changed() => {
                            self.set(|s| s.state = "stopped".into());
                            return;
                        }
                    }
                }
                RestartDecision::GiveUp => {
                    tracing::error!("flock-model: too many restarts: given up");
                    self.logs.line(NAME, "flock", "too many restarts: given up");
                    self.set(|s| s.state = "failed".into());
                    return;
                }
            }
        }
    }
}

/// Copies stdout into the log and reports the address of the `listening on ADDR` line.
async fn watch_stdout(
    logs: LogHub,
    out: impl AsyncRead + Unpin,
    addr: watch::Sender<Option<String>>,
) {
    let mut lines = BufReader::new(out).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        logs.line(NAME, "out", &line);
        if let Some(a) = line.strip_prefix("listening on ") {
            let _ = addr.send(Some(a.trim().to_owned()));
        }
    }
}

/// Copies stderr into the log and keeps its last `error:` line (the reason of an exit).
async fn keep_stderr(logs: LogHub, err: impl AsyncRead + Unpin, last: Arc<Mutex<String>>) {
    let mut lines = BufReader::new(err).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        logs.line(NAME, "err", &line);
        let message = crate::logs::message_of(&line);
        if let Some(i) = message.find("error: ") {
            *last.lock().unwrap_or_else(|p| p.into_inner()) = message[i + 7..].to_owned();
        }
    }
}
