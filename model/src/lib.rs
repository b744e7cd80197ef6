//! `flock-model`: the embedded local model. One llama.cpp model (via `llama-cpp-2`) on one
//! dedicated thread, served as an OpenAI-compatible `POST /v1/chat/completions` on loopback behind
//! a bearer token, so the supervisor's LLM gateway reaches local and remote models through one
//! client (`flock-llm`). Requests are served one at a time in arrival order; tool calls are
//! constrained by a JSON schema (llguidance) so a small model always emits a well-formed call.
//!
//! Not here: which agent may use the model, retries, token accounting (the gateway's job), and
//! fetching the model file (`scripts/setup`).

pub mod engine;
pub mod http;
pub mod log;
pub mod prompt;
pub mod threads;
pub mod verify;
pub mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, UnixListener};

pub use engine::{Engine, EngineConfig, ModelInfo};
pub use verify::{MODEL_FILE, MODEL_SHA256, VerifyError, default_model_path};

/// Exit code for a problem a restart cannot fix (no token, missing or wrong model file, bad
/// flags): a supervisor should not restart on it (`EX_CONFIG`).
pub const EXIT_CONFIG: i32 = 78;

/// The environment variable holding the bearer token clients must send.
pub const TOKEN_ENV: &str = "FLOCK_MODEL_TOKEN";

/// Everything `flock-model` needs to start.
#[derive(Debug, Clone)]
pub struct Options {
    pub model: PathBuf,
    pub listen: Listen,
    /// `None`: `min(2, idle cores)`.
    pub threads: Option<usize>,
    /// Context of each KV-cache slot, in tokens.
    pub n_ctx: u32,
    /// KV-cache slots: one per agent (least recently used evicted first).
    pub slots: u32,
    pub verify: bool,
    /// The sha256 the model file must have; `None`: the pinned default model's.
    pub sha256: Option<String>,
    pub token: String,
    /// llama.cpp's own logs on stderr, and one line per request.
    pub verbose: bool,
    /// Tool calls under the grammar of the offered tools (off only to measure what it saves).
    pub grammar: bool,
}

/// Where to serve: a loopback TCP address, or a Unix socket (`unix:PATH`, how flock-supervisor
/// runs it: only processes that can reach the path — never an agent — can connect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for Listen {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.strip_prefix("unix:") {
            Some("") => Err("`unix:` needs a path, e.g. unix:/run/flock/model.sock".into()),
            Some(path) => Ok(Listen::Unix(PathBuf::from(path))),
            None => s.parse().map(Listen::Tcp).map_err(|e| {
                format!("`{s}` is neither an address (127.0.0.1:PORT) nor unix:PATH: {e}")
            }),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Tcp(addr) => write!(f, "{addr}"),
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// A failure with the exit code it maps to.
#[derive(Debug)]
pub struct RunError {
    pub code: i32,
    pub error: anyhow::Error,
}

impl RunError {
    fn config(error: impl Into<anyhow::Error>) -> Self {
        RunError { code: EXIT_CONFIG, error: error.into() }
    }
}

impl<E: Into<anyhow::Error>> From<E> for RunError {
    fn from(e: E) -> Self {
        RunError { code: 1, error: e.into() }
    }
}

/// Checks the model, loads it, binds, prints `listening on ADDR` (the readiness line), serves.
pub async fn run(opts: Options) -> Result<(), RunError> {
    if opts.token.trim().is_empty() {
        return Err(RunError::config(anyhow::anyhow!(
            "{TOKEN_ENV} is not set: clients must send `Authorization: Bearer <token>`, and the \
             token comes from that environment variable"
        )));
    }
    if let Listen::Tcp(addr) = &opts.listen
        && !addr.ip().is_loopback()
    {
        return Err(RunError::config(anyhow::anyhow!(
            "--listen {} is not a loopback address; flock-model serves only this machine",
            opts.listen
        )));
    }
    if opts.n_ctx < 256 {
        return Err(RunError::config(anyhow::anyhow!(
            "--ctx {} is too small (at least 256)",
            opts.n_ctx
        )));
    }
    if !(1..=64).contains(&opts.slots) {
        return Err(RunError::config(anyhow::anyhow!(
            "--slots {} must be between 1 and 64",
            opts.slots
        )));
    }
    let model = opts.model.clone();
    let verify = opts.verify;
    let expected = opts.sha256.clone();
    tokio::task::spawn_blocking(move || match (verify, expected) {
        (false, _) => verify::check_exists(&model),
        (true, None) => verify::verify(&model).map(|_| ()),
        (true, Some(sha)) => verify::verify_sha256(&model, &sha).map(|_| ()),
    })
    .await
    .context("model check")?
    .map_err(RunError::config)?;
    let threads = match opts.threads {
        Some(0) => return Err(RunError::config(anyhow::anyhow!("--threads must be at least 1"))),
        Some(n) => n,
        None => threads::default_threads(Duration::from_millis(100)),
    };
    let config = EngineConfig {
        model_path: opts.model.clone(),
        threads,
        n_ctx: opts.n_ctx,
        slots: opts.slots,
        verbose: opts.verbose,
    };
    let (engine, info) = tokio::task::spawn_blocking(move || Engine::start(config))
        .await
        .context("model thread")?
        .with_context(|| format!("load {}", opts.model.display()))?;
    let listener = match &opts.listen {
        Listen::Tcp(addr) => {
            let l = TcpListener::bind(addr).await.with_context(|| format!("bind {addr}"))?;
            Listener::Tcp(l)
        }
        Listen::Unix(path) => {
            // A socket file left by an earlier run of ours is replaced; anything else is not.
            use std::os::unix::fs::FileTypeExt;
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                let _ = std::fs::remove_file(path);
            }
            let l = UnixListener::bind(path).with_context(|| format!("bind {}", path.display()))?;
            Listener::Unix(l)
        }
    };
    let addr = match &listener {
        Listener::Tcp(l) => Listen::Tcp(l.local_addr()?),
        Listener::Unix(_) => opts.listen.clone(),
    };
    tracing::info!(
        model = %info.name,
        ms = info.load_time.as_millis() as u64,
        threads = info.threads,
        slots = info.slots,
        ctx = info.n_ctx,
        "flock-model: {} loaded in {} ms, {} thread(s), {} KV-cache slots of {} tokens",
        info.name,
        info.load_time.as_millis(),
        info.threads,
        info.slots,
        info.n_ctx
    );
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
    }
    let mut server = http::Server::new(engine, info, opts.token);
    server.grammar = opts.grammar;
    let server = Arc::new(server);
    // Serves until the process is stopped: accept errors are waited out, not returned.
    match listener {
        Listener::Tcp(l) => match http::serve(l, server).await {},
        Listener::Unix(l) => match http::serve_unix(l, server).await {},
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}
