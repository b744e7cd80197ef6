//! The router's clock, in Unix milliseconds: request deadlines, chain start times and wall
//! budgets read it. The supervisor runs it on the system's wall clock; tests run it on tokio's
//! clock, which `#[tokio::test(start_paused = true)]` stops and `tokio::time::advance` moves, so
//! a 30 s deadline or a 300 s budget is tested in microseconds and to the millisecond.
//! (An agent's `last_seen`, read by the supervisor's heartbeat check, stays on the wall clock.)

use flock_ipc::time::unix_ms_now;

#[derive(Debug, Clone, Copy, Default)]
pub enum Clock {
    /// The system's wall clock.
    #[default]
    Wall,
    /// Tokio's clock, counted from the wall time when it was made.
    Tokio { at_ms: u64, since: tokio::time::Instant },
}

impl Clock {
    /// Tokio's clock, starting now (paused if the runtime's clock is).
    pub fn tokio() -> Clock {
        Clock::Tokio { at_ms: unix_ms_now(), since: tokio::time::Instant::now() }
    }

    pub fn now_ms(&self) -> u64 {
        match self {
            Clock::Wall => unix_ms_now(),
            Clock::Tokio { at_ms, since } => at_ms + since.elapsed().as_millis() as u64,
        }
    }
}
