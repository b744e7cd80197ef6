//! `flock-agent`: started by `flock-supervisor`, one process per agent.

use std::process::ExitCode;

fn main() -> ExitCode {
    flock_log::init("flock-agent");
    // Before anything else: what this process holds (its token, its session, whatever a tool
    // read) is not for other processes of the user to read from /proc or attach to.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("flock-agent: warning: cannot make the process non-dumpable: {e}");
    }
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
