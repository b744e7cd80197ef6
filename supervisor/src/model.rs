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
use std::time::Duration;

use anyhow::{Context, Result, bail};
use flock_actors::gateway::LocalLink;
use flock_config::{LocalModel, SupervisionSpec};
use flock_llm::Secret;
use tokio::sync::watch;

use crate::keeper::{Kept, KeptProcess};
use crate::logs::LogHub;
use crate::spawn::{SpawnSpec, Spawner};

/// Its name in `flockctl ps` and `flockctl logs`.
pub const NAME: &str = "flock-model";
/// Loading a 0.5 GB model (and hashing it the first time) takes seconds, not minutes.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

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
        "the swarm uses the embedded local model: `scripts/install` (or `scripts/up`) builds it \
         beside the others, or give the agents a remote model (`provider: openai` or `anthropic`, see README \"Models\")",
    )
}

/// What `flockctl ps` shows of the process.
pub use crate::keeper::ProcessStatus as ModelStatus;

/// The running `flock-model` and its keeper.
pub struct ModelProcess {
    process: KeptProcess,
    link: LocalLink,
}

/// What the keeper needs to (re)start the process.
struct Model {
    program: PathBuf,
    model: PathBuf,
    /// The sha256 to check the file against (known models); `None`: `path:` files, unchecked.
    sha256: Option<&'static str>,
    settings: LocalModel,
    cwd: PathBuf,
    /// Where it serves (`run/model.sock`).
    socket: PathBuf,
    token: Secret,
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
        let kept = Model {
            program,
            model,
            sha256: known.map(|k| k.sha256),
            settings,
            cwd,
            socket,
            token: token.clone(),
            url,
        };
        let (process, ready_rx) = KeptProcess::start(kept, supervision, spawner, logs);
        let link = LocalLink { base_url: url_rx, token, client };
        let process = ModelProcess { process, link };
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
        self.process.status()
    }

    /// SIGTERM, then SIGKILL if it lingers; returns once the process is gone.
    pub async fn stop(&self) {
        self.process.stop().await
    }
}

/// `FLOCK_MODEL_NO_GRAMMAR=1` where `up` runs: the embedded model writes tool calls without the
/// grammar of the offered tools, and logs each malformed one (`scripts/eval --no-grammar`).
pub const NO_GRAMMAR_ENV: &str = "FLOCK_MODEL_NO_GRAMMAR";

impl Kept for Model {
    fn name(&self) -> String {
        NAME.to_owned()
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
        // A measurement switch (what the grammar saves; docs/benchmarks.md), never for real use.
        if std::env::var_os(NO_GRAMMAR_ENV).is_some_and(|v| v == "1") {
            args.push("--no-grammar".into());
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

    /// Its `listening on ADDR` line: printed once the model is loaded and the socket bound.
    fn says_when_ready(&self) -> bool {
        true
    }

    fn ready_line(&self, line: &str) -> Option<String> {
        line.strip_prefix("listening on ").map(|addr| format!("on {}", addr.trim()))
    }

    fn up(&self) {
        // The host is a name only: the link's client connects to the socket.
        let _ = self.url.send(Some("http://flock-model/v1".to_owned()));
    }

    fn down(&self) {
        let _ = self.url.send(None);
    }
}
