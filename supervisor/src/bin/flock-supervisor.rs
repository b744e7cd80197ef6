//! `flock-supervisor`: start a swarm (`up`) or check a swarm file (`validate`).

use std::process::ExitCode;

use clap::Parser;
use flock_supervisor::cli::{Cli, Command};
use flock_supervisor::paths::StateDir;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate { file, local_model, needs, file_only } => {
            validate(&file, local_model, needs, file_only)
        }
        Command::Up { file, detach, state_dir, model, host, standby, metrics, ui, log_format } => {
            let web = flock_supervisor::web::WebOptions { metrics, ui };
            for (flag, addr) in [("--metrics", metrics), ("--ui", ui)] {
                if let Some(a) = addr
                    && !a.ip().is_loopback()
                {
                    eprintln!(
                        "flock-supervisor: warning: {flag} {a} is reachable from other machines; {}",
                        if flag == "--ui" {
                            "the dashboard is guarded by its token only (plain HTTP)"
                        } else {
                            "metrics have no token"
                        }
                    );
                }
            }
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
            let host = host.unwrap_or_else(|| spec.leader().to_owned());
            if spec.cluster.is_none() && host != spec.leader() {
                eprintln!(
                    "flock-supervisor: --host {host}: {} has no `cluster:` section, so it runs on \
                     one host; add `cluster: {{ nats: nats://HOST:4222 }}` and place agents with \
                     `host:` (docs/cluster.md), or leave out --host",
                    file.display()
                );
                return ExitCode::from(2);
            }
            if let Err(e) = spec.for_host(&host) {
                eprintln!("flock-supervisor: --host {host}: {e}");
                return ExitCode::from(2);
            }
            let state = match StateDir::resolve(state_dir.as_deref()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("flock-supervisor: {e:#}");
                    return ExitCode::from(1);
                }
            };
            // Secrets kept in the .env beside the swarm file (the environment wins over it).
            let dotenv = match flock_supervisor::dotenv::read(&file) {
                Ok(vars) => vars,
                Err(e) => {
                    eprintln!("flock-supervisor: {e:#}; nothing was started");
                    return ExitCode::from(1);
                }
            };
            if let Some(agent) = flock_supervisor::dotenv::exposed_to(&spec, &file) {
                eprintln!(
                    "flock-supervisor: the workspace of agent `{agent}` holds {}, the swarm's \
                     secrets: it could read them. Give it another `workspace:`, or keep the \
                     secrets in the environment instead; nothing was started",
                    flock_supervisor::dotenv::path_for(&file).display()
                );
                return ExitCode::from(1);
            }
            if detach {
                // The launcher holds the keys only until the background supervisor has them:
                // out of its environment and not inspectable before it spawns anything.
                if let Err(e) = flock_supervisor::secrets::not_dumpable() {
                    eprintln!(
                        "flock-supervisor: warning: cannot make the process non-dumpable: {e}"
                    );
                }
                #[allow(unsafe_code)]
                // SAFETY: single-threaded: no runtime, no thread started yet.
                let keys = unsafe { flock_supervisor::secrets::take_api_keys(&spec, &dotenv) };
                return match flock_supervisor::up::detach(
                    &file,
                    &state,
                    model.as_deref(),
                    Some(host.as_str()),
                    &web,
                    log_format,
                    &keys,
                ) {
                    Ok(pid) => {
                        println!(
                            "swarm `{}` is up in the background (supervisor pid {pid}); `flockctl ps` to look, `flockctl down` to stop",
                            spec.name
                        );
                        // Every address it serves (a port 0 is the one it got).
                        let served = [
                            ("dashboard", ui.is_some(), flock_supervisor::web::ui_url_file(&state)),
                            (
                                "metrics",
                                web.metrics.is_some(),
                                flock_supervisor::web::metrics_url_file(&state),
                            ),
                        ];
                        for (what, asked, file) in served {
                            if asked && let Ok(url) = std::fs::read_to_string(file) {
                                println!("{what}: {}", url.trim());
                            }
                        }
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
            let mut keys = unsafe { flock_supervisor::secrets::take_api_keys(&spec, &dotenv) };
            // Started by `up --detach`: the launcher handed the keys over a socket instead.
            match flock_ipc::handoff::receive() {
                Ok(handed) => keys
                    .extend(handed.into_iter().map(|(k, v)| (k, flock_llm::Secret::new(v.trim())))),
                Err(e) => {
                    eprintln!("flock-supervisor: cannot read the keys handed over: {e}");
                    return ExitCode::from(1);
                }
            }
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
            match runtime.block_on(flock_supervisor::up::up(spec, &host, standby, state, keys, web))
            {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("flock-supervisor: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

/// `flock-supervisor validate`: every problem of the file, or one of the narrow answers scripts
/// ask for (`--local-model`, `--needs`).
fn validate(file: &std::path::Path, local_model: bool, needs: bool, file_only: bool) -> ExitCode {
    match flock_config::load(file) {
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
            if needs {
                if !spec.bridges.is_empty() {
                    println!("{}", flock_supervisor::bridges::BINARY);
                }
                if local.is_some() {
                    println!("{}", flock_supervisor::model::NAME);
                }
                if spec.searches_memory() {
                    println!("vectors");
                }
                if spec.cluster.is_some() {
                    println!("cluster");
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
            let missing = if file_only {
                Vec::new()
            } else {
                match flock_supervisor::dotenv::read(file) {
                    Ok(dotenv) => flock_supervisor::secrets::missing_secrets(&spec, &dotenv),
                    Err(e) => {
                        eprintln!("{}: {e:#}", file.display());
                        return ExitCode::from(1);
                    }
                }
            };
            if !missing.is_empty() {
                for m in &missing {
                    eprintln!("{}: {m}", file.display());
                }
                eprintln!(
                    "{}: the file is valid, but {} secret(s) it names are not set here \
                 (`--file-only` checks the file alone)",
                    file.display(),
                    missing.len()
                );
                return ExitCode::from(1);
            }
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
    }
}
