//! Restart policy arithmetic, free of I/O so it can be tested exactly: restart intensity
//! (`max_restarts` in `max_seconds`) and exponential backoff with jitter.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use flock_config::SupervisionSpec;

/// Restart history of one child.
#[derive(Debug, Clone, Default)]
pub struct RestartHistory {
    /// When recent restarts happened (within the intensity window).
    recent: VecDeque<Instant>,
    /// Restarts since the child last ran stably; drives the backoff exponent.
    consecutive: u32,
}

/// What to do after a child died and its policy asks for a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartDecision {
    /// Restart after this delay (zero for the first restart after a stable run).
    After(Duration),
    /// Too many restarts in the window: give up on this child.
    GiveUp,
}

impl RestartHistory {
    /// Records a death at `now` after `uptime`, and decides. `jitter` is in `[-1, 1]`.
    pub fn on_death(
        &mut self,
        spec: &SupervisionSpec,
        now: Instant,
        uptime: Duration,
        jitter: f64,
    ) -> RestartDecision {
        if uptime >= Duration::from_secs(spec.backoff_reset_secs) {
            self.consecutive = 0;
            self.recent.clear();
        }
        let window = Duration::from_secs(spec.max_seconds);
        while self.recent.front().is_some_and(|t| now.duration_since(*t) > window) {
            self.recent.pop_front();
        }
        if self.recent.len() as u32 >= spec.max_restarts {
            return RestartDecision::GiveUp;
        }
        self.recent.push_back(now);
        let delay = backoff(spec, self.consecutive, jitter);
        self.consecutive += 1;
        RestartDecision::After(delay)
    }

    /// Forgets the history (a restart by hand gives a failed child a fresh start).
    pub fn reset(&mut self) {
        *self = RestartHistory::default();
    }
}

/// The delay before restart number `n` (0-based) of a crash sequence: 0, then
/// `initial × 2^(n-1)` capped at `max`, each ±20 % by `jitter ∈ [-1, 1]`.
pub fn backoff(spec: &SupervisionSpec, n: u32, jitter: f64) -> Duration {
    if n == 0 {
        return Duration::ZERO;
    }
    let base = spec.backoff_initial_ms.saturating_mul(1u64 << (n - 1).min(30));
    let capped = base.min(spec.backoff_max_ms) as f64;
    let jittered = capped * (1.0 + 0.2 * jitter.clamp(-1.0, 1.0));
    Duration::from_millis(jittered.max(0.0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SupervisionSpec {
        SupervisionSpec { max_restarts: 3, max_seconds: 60, ..SupervisionSpec::default() }
    }

    #[test]
    fn backoff_doubles_from_500ms_after_an_immediate_first_restart_and_caps() {
        let s = SupervisionSpec::default();
        let ms: Vec<u128> = (0..10).map(|n| backoff(&s, n, 0.0).as_millis()).collect();
        assert_eq!(ms, [0, 500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]);
        assert_eq!(backoff(&s, 1, 1.0).as_millis(), 600);
        assert_eq!(backoff(&s, 1, -1.0).as_millis(), 400);
    }

    #[test]
    fn intensity_limit_gives_up_past_max_restarts_in_window() {
        let s = spec();
        let mut h = RestartHistory::default();
        let t0 = Instant::now();
        let short = Duration::from_millis(10);
        assert_eq!(h.on_death(&s, t0, short, 0.0), RestartDecision::After(Duration::ZERO));
        assert!(matches!(h.on_death(&s, t0, short, 0.0), RestartDecision::After(_)));
        assert!(matches!(h.on_death(&s, t0, short, 0.0), RestartDecision::After(_)));
        assert_eq!(h.on_death(&s, t0, short, 0.0), RestartDecision::GiveUp);
    }

    #[test]
    fn restarts_outside_the_window_do_not_count() {
        let s = spec();
        let mut h = RestartHistory::default();
        let t0 = Instant::now();
        let short = Duration::from_millis(10);
        for _ in 0..3 {
            h.on_death(&s, t0, short, 0.0);
        }
        let later = t0 + Duration::from_secs(61);
        assert!(matches!(h.on_death(&s, later, short, 0.0), RestartDecision::After(_)));
    }

    #[test]
    fn stable_uptime_resets_backoff() {
        let s = spec();
        let mut h = RestartHistory::default();
        let t0 = Instant::now();
        h.on_death(&s, t0, Duration::from_millis(1), 0.0);
        assert_eq!(
            h.on_death(&s, t0, Duration::from_millis(1), 0.0),
            RestartDecision::After(Duration::from_millis(500))
        );
        assert_eq!(
            h.on_death(&s, t0, Duration::from_secs(301), 0.0),
            RestartDecision::After(Duration::ZERO)
        );
    }
}
