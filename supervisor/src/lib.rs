//! `flock-supervisor`: OTP-style supervision of agent OS processes, and the two binaries
//! (`flock-supervisor`, `flockctl`) as thin layers over it.
//!
//! The orchestrator's actors (router, store) live in `flock-actors`; this crate spawns and
//! watches processes, keeps their logs, answers `flockctl`, and wires everything together in
//! [`up::up`].

pub mod backoff;
pub mod bridges;
pub mod cage;
pub mod children;
pub mod cli;
// Swarms across hosts (NATS): with the `cluster` feature (default); without it, the same names
// with no values, and a file with `cluster:` is refused (cluster_off.rs).
#[cfg(feature = "cluster")]
pub mod cluster;
#[cfg(not(feature = "cluster"))]
#[path = "cluster_off.rs"]
pub mod cluster;
pub mod control;
pub mod dotenv;
pub mod failover;
pub mod journal_cli;
pub mod keeper;
pub mod live;
pub mod logs;
pub mod memory_cli;
pub mod model;
pub mod paths;
pub mod secrets;
pub mod spawn;
pub mod up;
pub mod web;

/// Unix time in milliseconds (the clock heartbeats are compared on).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
