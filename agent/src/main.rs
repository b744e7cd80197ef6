//! `flock-agent`: started by `flock-supervisor`, one process per agent.

use std::process::ExitCode;

fn main() -> ExitCode {
    flock_log::init("flock-agent");
    let env = match flock_agent::AgentEnv::from_env() {
        Ok(env) => env,
        Err(e) => {
            tracing::error!("flock-agent: {e:#}");
            return ExitCode::from(2);
        }
    };
    // One thread: an idle agent should cost little memory (DESIGN.md §14: ≤ 15 MB).
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "flock-agent: cannot start the runtime");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(flock_agent::run(env)) {
        Ok(flock_agent::ExitReason::Shutdown) => ExitCode::SUCCESS,
        Ok(flock_agent::ExitReason::Disconnected) => ExitCode::from(1),
        Err(e) => {
            tracing::error!("flock-agent: {e:#}");
            ExitCode::from(1)
        }
    }
}
