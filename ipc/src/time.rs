//! The wall clock: UTC timestamps for the journal and the memory files (`YYYY-MM-DD`, `HH:MM`),
//! with the calendar arithmetic left to jiff.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn unix_ms_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The UTC date and time of a Unix time in milliseconds (the latest jiff knows past its range).
fn utc(unix_ms: u64) -> jiff::civil::DateTime {
    let at = i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    jiff::tz::Offset::UTC.to_datetime(at)
}

/// The English name of the UTC weekday of a Unix time in milliseconds (`"Wednesday"`).
pub fn weekday(unix_ms: u64) -> &'static str {
    const DAYS: [&str; 7] =
        ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    DAYS[usize::try_from(utc(unix_ms).weekday().to_monday_one_offset() - 1).unwrap_or(0)]
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC).
pub fn format_timestamp(unix_ms: u64) -> String {
    let t = utc(unix_ms);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// `(YYYY-MM-DD, HH:MM)` of a Unix time in milliseconds, UTC.
pub fn date_and_minute(unix_ms: u64) -> (String, String) {
    let t = format_timestamp(unix_ms);
    (t[..10].to_owned(), t[11..16].to_owned())
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
        assert_eq!((weekday(0), weekday(1_709_251_199_999)), ("Thursday", "Thursday"));
        assert_eq!(weekday(1_709_251_200_000), "Friday");
    }
}
