//! `flock-supervisor`: start a swarm (`up`) or check a swarm file (`validate`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flock_supervisor::paths::StateDir;

#[derive(Parser)]
#[command(
    name = "flock-supervisor",
    version,
    about = "Run a team of LLM agents as supervised OS processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start every agent of a swarm file and supervise them until Ctrl-C, SIGTERM or `flockctl down`.
    Up {
        /// The swarm file (YAML), e.g. examples/office.yaml.
        file: PathBuf,
        /// Run in the background; returns once the swarm is ready. Output: <state-dir>/logs/supervisor.log.
        #[arg(long)]
        detach: bool,
        /// Where the swarm keeps its database, sockets, logs and workspaces [default: $FLOCK_HOME or ~/.flock].
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Run every embedded-model agent on this local model instead of the swarm file's
        /// (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b; fetch with `scripts/setup --model NAME`).
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// Log lines as `text` (readable) or `json` (one object per line), for the supervisor and
        /// every process it spawns; which events: RUST_LOG (default `info`). See
        /// docs/observability.md.
        #[arg(long, value_name = "FORMAT", env = "FLOCK_LOG_FORMAT", default_value = "text",
              value_parser = ["text", "json"], ignore_case = true)]
        log_format: String,
    },
    /// Check a swarm file and print every problem at once, with line and column.
    Validate {
        /// The swarm file (YAML).
        file: PathBuf,
        /// Print only the name of the local model the swarm needs (nothing if none): for scripts
        /// that fetch and build the embedded model only when it is used.
        #[arg(long)]
        local_model: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { file, local_model } => match flock_config::load(&file) {
            Ok(spec) => {
                let local = match spec.local_model() {
                    Ok(l) => l,
                    Err(e) => {
                        eprintln!("{}: {e}", file.display());
                        return ExitCode::from(1);
                    }
                };
                if local_model {
                    if let Some(m) = local {
                        println!("{}", m.path.map_or(m.model, |p| p.display().to_string()));
                    }
                    return ExitCode::SUCCESS;
                }
                let model = match local {
                    Some(m) => match &m.path {
                        Some(p) => format!("; embedded model {}", p.display()),
                        None => format!(
                            "; embedded model {} ({} KV-cache slots of {} tokens)",
                            m.model, m.slots, m.ctx
                        ),
                    },
                    None => String::new(),
                };
                println!(
                    "{}: ok — swarm `{}` with {} agents{model}",
                    file.display(),
                    spec.name,
                    spec.agents.len()
                );
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                eprintln!("{} problem(s) in {}", errors.0.len(), file.display());
                ExitCode::from(1)
            }
        },
        Command::Up { file, detach, state_dir, model, log_format } => {
            let log_format: flock_log::Format = log_format.parse().unwrap_or_default();
            let mut spec = match flock_config::load(&file) {
                Ok(spec) => spec,
                Err(errors) => {
                    eprintln!("{errors}");
                    eprintln!(
                        "{} problem(s) in {}; nothing was started",
                        errors.0.len(),
                        file.display()
                    );
                    return ExitCode::from(1);
                }
            };
            if let Some(name) = &model
                && let Err(e) = spec.use_local_model(name)
            {
                eprintln!("flock-supervisor: --model: {e}");
                return ExitCode::from(2);
            }
            let state = match StateDir::resolve(state_dir.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("flock-supervisor: {e:#}");
                    return ExitCode::from(1);
                }
            };
            if detach {
                return match flock_supervisor::up::detach(
                    &file,
                    &state,
                    model.as_deref(),
                    log_format,
                ) {
                    Ok(pid) => {
                        println!(
                            "swarm `{}` is up in the background (supervisor pid {pid}); `flockctl ps` to look, `flockctl down` to stop",
                            spec.name
                        );
                        ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("flock-supervisor: {e:#}");
                        ExitCode::from(1)
                    }
                };
            }
            flock_log::init_with("flock-supervisor", log_format);
            // API keys leave the environment before any thread starts (an agent's child could
            // read them in /proc otherwise), and the supervisor cannot be inspected or traced.
            #[allow(unsafe_code)]
            // SAFETY: single-threaded still: the runtime is built below.
            let keys = unsafe { flock_supervisor::secrets::take_api_keys(&spec) };
            if let Err(e) = flock_supervisor::secrets::not_dumpable() {
                tracing::warn!(error = %e, "flock-supervisor: cannot make the process non-dumpable");
            }
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "flock-supervisor: cannot start the runtime");
                    return ExitCode::from(1);
                }
            };
            match runtime.block_on(flock_supervisor::up::up(spec, state, keys)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("flock-supervisor: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}
