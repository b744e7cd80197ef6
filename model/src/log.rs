//! Logging: `tracing` events on stderr, one line each. A copy of the Flock workspace's
//! `flock-log` (this crate is a workspace of its own, see Cargo.toml): `RUST_LOG` picks the
//! events (default `info`), `FLOCK_LOG_FORMAT` the format (`text`, default, or `json`); the
//! supervisor sets both for the processes it spawns. See docs/observability.md.

use tracing_subscriber::EnvFilter;

/// The variable that selects the format (`text` or `json`).
pub const FORMAT_ENV: &str = "FLOCK_LOG_FORMAT";

/// Whether `value` (of [`FORMAT_ENV`]) asks for JSON lines; unset, empty or unknown is text.
pub fn wants_json(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("json"))
}

/// Installs the logger (once; a second call changes nothing).
pub fn init() {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false);
    // Fails only if a logger is installed already; that one stays.
    let _ = if wants_json(std::env::var(FORMAT_ENV).ok().as_deref()) {
        builder.json().flatten_event(true).with_current_span(true).with_span_list(true).try_init()
    } else {
        builder.with_target(false).try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_only_when_asked() {
        assert!(wants_json(Some("json")));
        assert!(wants_json(Some(" JSON ")));
        assert!(!wants_json(Some("text")));
        assert!(!wants_json(Some("")));
        assert!(!wants_json(None));
    }
}
