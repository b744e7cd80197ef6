//! When to retry a failed call and how long to wait first: the backoff schedule and the parsing of
//! a server's `retry-after`. Pure functions; the loop that sleeps lives in `client.rs`.

use std::time::{Duration, SystemTime};

/// How a call is retried after a 429, a 5xx, a timeout or a connection error.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (3: at most 4 attempts).
    pub retries: u32,
    /// The first wait; retry `n` (0-based) waits `base * 2^n` (2 s: 2, 4, 8 s).
    pub base: Duration,
    /// Relative spread of each wait (0.2: ±20 %), so many agents do not retry in lockstep.
    pub jitter: f64,
    /// Cap on a server's `retry-after`, so a bad header cannot stall a turn for hours.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            retries: 3,
            base: Duration::from_secs(2),
            jitter: 0.2,
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// The wait before retry `attempt` (0-based).
///
/// With a server `retry_after` the wait is exactly that, capped at `max_retry_after` (the server
/// knows when it will take us back; no jitter shortens it). Otherwise it is `base * 2^attempt`
/// scaled by `1 + jitter * (2 * jitter_sample - 1)`: `jitter_sample` in `[0, 1]` (clamped) maps
/// to `[-jitter, +jitter]`, 0.5 giving the nominal wait.
pub fn retry_delay(
    policy: &RetryPolicy,
    attempt: u32,
    retry_after: Option<Duration>,
    jitter_sample: f64,
) -> Duration {
    if let Some(after) = retry_after {
        return after.min(policy.max_retry_after);
    }
    let nominal = policy.base.saturating_mul(2u32.saturating_pow(attempt));
    let jitter = if policy.jitter.is_finite() { policy.jitter.clamp(0.0, 1.0) } else { 0.0 };
    let sample = if jitter_sample.is_finite() { jitter_sample.clamp(0.0, 1.0) } else { 0.5 };
    let factor = 1.0 + jitter * (2.0 * sample - 1.0);
    Duration::try_from_secs_f64(nominal.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// A `retry-after` header value as a wait from `now`: delay-seconds (`"1"`, also `"1.5"`) or an
/// IMF-fixdate HTTP-date (`"Sun, 06 Nov 1994 08:49:37 GMT"`; a date in the past means no wait).
/// `None` for anything else, which makes the caller fall back to its own backoff.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn secs(d: Duration) -> f64 {
        d.as_secs_f64()
    }

    #[test]
    fn default_schedule_is_2_4_8_seconds_at_nominal_jitter() {
        let p = RetryPolicy::default();
        let waits: Vec<f64> = (0..3).map(|n| secs(retry_delay(&p, n, None, 0.5))).collect();
        assert_eq!(waits, [2.0, 4.0, 8.0]);
    }

    #[test]
    fn jitter_spreads_each_wait_by_twenty_percent_either_way() {
        let p = RetryPolicy::default();
        for (n, nominal) in [(0, 2.0), (1, 4.0), (2, 8.0)] {
            let lo = secs(retry_delay(&p, n, None, 0.0));
            let hi = secs(retry_delay(&p, n, None, 1.0));
            assert!((lo - nominal * 0.8).abs() < 1e-9, "retry {n}: {lo}");
            assert!((hi - nominal * 1.2).abs() < 1e-9, "retry {n}: {hi}");
            for i in 0..=100 {
                let d = secs(retry_delay(&p, n, None, f64::from(i) / 100.0));
                assert!(d >= lo - 1e-9 && d <= hi + 1e-9, "retry {n}: {d} outside [{lo}, {hi}]");
            }
        }
    }

    #[test]
    fn out_of_range_samples_are_clamped_not_panicking() {
        let p = RetryPolicy::default();
        assert_eq!(retry_delay(&p, 0, None, -3.0), Duration::from_secs_f64(1.6));
        assert_eq!(retry_delay(&p, 0, None, 7.0), Duration::from_secs_f64(2.4));
        assert_eq!(retry_delay(&p, 0, None, f64::NAN), Duration::from_secs(2));
        let wild = RetryPolicy { jitter: 5.0, ..RetryPolicy::default() };
        assert_eq!(retry_delay(&wild, 0, None, 0.0), Duration::ZERO);
        assert!(retry_delay(&p, 200, None, 1.0) >= Duration::from_secs(u64::from(u32::MAX)));
    }

    #[test]
    fn server_retry_after_wins_over_backoff_and_is_capped() {
        let p = RetryPolicy::default();
        let one = Some(Duration::from_secs(1));
        assert_eq!(retry_delay(&p, 2, one, 1.0), Duration::from_secs(1));
        assert_eq!(
            retry_delay(&p, 0, Some(Duration::from_secs(3600)), 0.5),
            Duration::from_secs(60)
        );
        assert_eq!(retry_delay(&p, 0, Some(Duration::ZERO), 0.5), Duration::ZERO);
    }

    #[test]
    fn retry_after_parses_seconds_and_http_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(parse_retry_after("1", now), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 120 ", now), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("0.5", now), Some(Duration::from_millis(500)));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:07 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 2026 00:00:00 GMT", UNIX_EPOCH),
            Some(Duration::from_secs(1_767_225_600))
        );
        for bad in [
            "",
            "-1",
            "soon",
            "inf",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 32 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad:?}");
        }
    }
}
