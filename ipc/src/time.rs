//! Wall-clock formatting without a date crate: UTC timestamps for the journal and the memory
//! files (`YYYY-MM-DD`, `HH:MM`).

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn unix_ms_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn format_timestamp(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (year, month, day) = civil_from_days(secs / 86_400);
    let rem = secs % 86_400;
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        unix_ms % 1000
    )
}

/// `(YYYY-MM-DD, HH:MM)` of a Unix time in milliseconds, UTC.
pub fn date_and_minute(unix_ms: u64) -> (String, String) {
    let t = format_timestamp(unix_ms);
    (t[..10].to_owned(), t[11..16].to_owned())
}

/// Days since 1970-01-01 to a (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`, restricted to dates after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00.000Z");
        // 2024-02-29T23:59:59.999Z, a leap day.
        assert_eq!(format_timestamp(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(
            date_and_minute(1_709_251_199_999),
            ("2024-02-29".to_owned(), "23:59".to_owned())
        );
    }
}
