//! `flock-bridge`: a chat bridge process, started and supervised by `flock-supervisor` (one per
//! `bridges:` entry of the swarm file). Not meant to be run by hand.

use std::process::ExitCode;

fn main() -> ExitCode {
    flock_log::init("flock-bridge");
    // The platform token will be in this process's memory: nobody else may read it.
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!("flock-bridge: warning: cannot make the process non-dumpable: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("flock-bridge: error: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    ExitCode::from(runtime.block_on(flock_bridge::run()))
}
