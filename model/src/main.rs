//! `flock-model`: parse flags, run the server, map failures to exit codes (78 = configuration:
//! do not restart). See the library for what it does.

use std::path::PathBuf;

use clap::Parser;

/// Serves a local GGUF model as an OpenAI-compatible chat-completions endpoint on loopback or a
/// Unix socket.
/// Clients authenticate with `Authorization: Bearer TOKEN`: the token flock-supervisor hands
/// over (an inherited socket), or `$FLOCK_MODEL_TOKEN` when started by hand. Prints
/// `listening on ADDR` on stdout once the model is loaded.
#[derive(Debug, Parser)]
#[command(name = "flock-model", version)]
struct Args {
    /// The GGUF model file [default: $FLOCK_HOME/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf]
    #[arg(long, value_name = "PATH")]
    model: Option<PathBuf>,
    /// Where to serve: a loopback address (port 0 picks a free one), or unix:PATH for a Unix
    /// socket (how flock-supervisor runs it).
    #[arg(long, value_name = "ADDR|unix:PATH", default_value = "127.0.0.1:0")]
    listen: flock_model::Listen,
    /// llama.cpp threads [default: min(2, idle cores)]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Context size of each KV-cache slot, in tokens (prompt plus answer).
    #[arg(long, value_name = "TOKENS", default_value_t = 4096)]
    ctx: u32,
    /// KV-cache slots: each client (an agent, by the request's `user`) keeps its prompt prefix
    /// in its own; memory grows with slots × ctx.
    #[arg(long, value_name = "N", default_value_t = 8)]
    slots: u32,
    /// The sha256 the model file must have [default: the pinned default model's].
    #[arg(long, value_name = "HEX", conflicts_with = "no_verify")]
    sha256: Option<String>,
    /// Skip the sha256 check of the model file (to use a model other than the pinned one).
    #[arg(long)]
    no_verify: bool,
    /// llama.cpp's own logs on stderr (one line per request is always logged).
    #[arg(long, short)]
    verbose: bool,
    /// Let the model write tool calls freely instead of under the grammar of the offered tools:
    /// a measurement switch (each malformed call is logged as `malformed call: WHY`), never for
    /// real use.
    #[arg(long)]
    no_grammar: bool,
}

/// Not dumpable: `/proc/<pid>/environ` (which holds the bearer token), `/proc/<pid>/mem` and
/// ptrace are closed to other processes of the same user (the supervisor does the same).
#[allow(unsafe_code)]
fn not_dumpable() {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } < 0 {
        tracing::warn!("flock-model: warning: cannot make the process non-dumpable");
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    flock_model::log::init();
    not_dumpable();
    // From flock-supervisor: over the socket it left us, never the environment (which /proc
    // would show other processes of the user for the instant before `not_dumpable`). Started by
    // hand: the environment.
    let token = match flock_ipc::handoff::receive() {
        Ok(mut handed) => handed.remove(flock_model::TOKEN_ENV),
        Err(e) => {
            tracing::error!("flock-model: error: cannot read the token handed over: {e}");
            std::process::exit(2);
        }
    }
    .or_else(|| std::env::var(flock_model::TOKEN_ENV).ok())
    .unwrap_or_default();
    let args = Args::parse();
    let Some(model) = args.model.or_else(flock_model::default_model_path) else {
        tracing::error!(
            "flock-model: error: no --model given and neither FLOCK_HOME nor HOME is set"
        );
        std::process::exit(flock_model::EXIT_CONFIG);
    };
    let opts = flock_model::Options {
        model,
        listen: args.listen,
        threads: args.threads,
        n_ctx: args.ctx,
        slots: args.slots,
        verify: !args.no_verify,
        sha256: args.sha256,
        token,
        verbose: args.verbose,
        grammar: !args.no_grammar,
    };
    if let Err(e) = flock_model::run(opts).await {
        tracing::error!("flock-model: error: {:#}", e.error);
        std::process::exit(e.code);
    }
}
