//! End-to-end tests: the real `flock-supervisor`, `flockctl` and `flock-agent` binaries, real OS
//! processes, real signals. Each test runs its own swarm in its own temp state dir, so tests run
//! in parallel; every wait is a deadline-bound poll (`wait_until`), never a bare sleep.
//!
//! The binaries must be built first: `cargo build --workspace --bins` (scripts/test does).

mod brain_persona;
mod bridge;
mod chains;
mod channels;
mod chat_door;
mod cli;
mod cluster;
mod dashboard;
mod delivery;
mod eval;
mod isolation;
mod live_view;
mod llm;
mod local_model;
mod logging;
mod permissions;
mod readme;
mod sessions;
mod spawn;
mod supervision;
mod swarm_management;
mod tidy;
mod wire;
mod workspace;

use std::time::Duration;

/// Generous deadlines: they bound how long a *failing* test takes, not how long a passing one
/// does, and a loaded 2-core CI machine must not turn slowness into failures.
pub const SHORT: Duration = Duration::from_secs(10);
pub const LONG: Duration = Duration::from_secs(30);

/// The variables that point a test's supervisor at this build's binaries: removed where a test
/// runs only what `scripts/install` installed.
pub const BIN_OVERRIDES: [&str; 4] =
    ["FLOCK_AGENT_BIN", "FLOCK_MODEL_BIN", "FLOCK_SANDBOX_HELPER", "FLOCK_BRIDGE_BIN"];

/// A scripted model whose every turn answers `reply` at once (`{input}`, `{from}` are filled in).
pub fn answer_model(name: &str, reply: &str) -> String {
    format!("  {name}:\n    provider: scripted\n    rules:\n      - reply: \"{reply}\"\n")
}
