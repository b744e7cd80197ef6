//! Chat bridges' processes (`flock-bridge`, issue #9): one per `bridges:` entry of the swarm
//! file, started after the agents, restarted with the swarm's backoff when it exits, stopped
//! before the agents. Each spawn gets a fresh token, announced to the router first
//! ([`RouterMsg::ExpectBridge`]), and the platform token read from the variable `token_env`
//! names — in no other process's environment, never in a log line.
//! Exit code 78 means "a restart cannot fix this" (the platform refused the token): no restart.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use flock_actors::RouterMsg;
use flock_config::{BridgeSpec, SupervisionSpec};
use flock_llm::Secret;
use ractor::ActorRef;

pub use crate::keeper::ProcessStatus;
use crate::keeper::{Kept, KeptProcess};
use crate::logs::LogHub;
use crate::spawn::{SpawnSpec, Spawner};

/// The binary's name.
pub const BINARY: &str = "flock-bridge";

/// Finds `flock-bridge`: `$FLOCK_BRIDGE_BIN`, else next to this executable.
pub fn bridge_binary() -> Result<PathBuf> {
    crate::spawn::sibling_binary(
        BINARY,
        "FLOCK_BRIDGE_BIN",
        "the swarm has chat bridges; `scripts/install` builds it beside the others (or `cargo build --profile dist -p flock-bridge`)",
    )
}

/// Its log name: `bridge-<name>` (`flockctl logs bridge-<name>`).
pub fn log_name(bridge: &str) -> String {
    format!("bridge-{bridge}")
}

/// One running bridge and its keeper task.
pub struct BridgeProcess {
    pub name: String,
    pub platform: &'static str,
    pub spec: BridgeSpec,
    process: KeptProcess,
}

impl BridgeProcess {
    pub fn status(&self) -> ProcessStatus {
        self.process.status()
    }

    /// `Shutdown` through the router, SIGTERM then SIGKILL if it lingers; returns once it is gone.
    pub async fn stop(&self) {
        self.process.stop().await
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
        let kept = Bridge { name: spec.name.clone(), token, app_token, env: env.clone() };
        // A bridge is running once spawned: nothing waits for it.
        let (process, _ready) = KeptProcess::start(
            kept,
            env.supervision.clone(),
            env.spawner.clone(),
            env.logs.clone(),
        );
        out.push(Arc::new(BridgeProcess {
            name: spec.name.clone(),
            platform: spec.platform.as_str(),
            spec: spec.clone(),
            process,
        }));
    }
    out
}

struct Bridge {
    name: String,
    token: Secret,
    /// Slack's app-level token (Socket Mode).
    app_token: Option<Secret>,
    env: Arc<BridgeEnv>,
}

impl Kept for Bridge {
    fn name(&self) -> String {
        log_name(&self.name)
    }

    /// A fresh session token for each spawn, announced to the router first.
    fn spawn_spec(&self) -> SpawnSpec {
        let session = crate::spawn::new_token();
        let _ = self
            .env
            .router
            .cast(RouterMsg::ExpectBridge { bridge: self.name.clone(), token: session.clone() });
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
            secrets.insert(flock_ipc::env::PLATFORM_APP_TOKEN.to_owned(), app.expose().to_owned());
        }
        SpawnSpec {
            program: self.env.program.clone(),
            args: Vec::new(),
            cwd: self.env.cwd.clone(),
            env,
            secrets,
        }
    }

    /// `Shutdown` through the router: it finishes what it is sending, then exits.
    fn ask_to_stop(&self, _pid: u32) {
        let _ = self.env.router.cast(RouterMsg::StopBridge { bridge: self.name.clone() });
    }
}
