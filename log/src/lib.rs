//! Logging of Flock's long-running processes (`flock-supervisor up`, `flock-agent`,
//! `flock-bridge`; `flock-model` has a copy of this in its own workspace): `tracing` events on
//! stderr, one line each, as text or as JSON.
//!
//! - Which events: `RUST_LOG` (`EnvFilter` syntax, e.g. `info,flock_actors=debug`), default
//!   `info`.
//! - Which format: `FLOCK_LOG_FORMAT` = `text` (default: timestamp, level, spans, message,
//!   fields; no colours, the lines land in log files) or `json` (one object per line: `timestamp`,
//!   `level`, `message` and the event's fields at the top level, `target`, the innermost span as
//!   `span`, and every span the event is in, outermost first, as `spans`).
//!   `flock-supervisor up --log-format` sets it, and the supervisor hands it to every process it
//!   spawns.
//!
//! Secrets are never logged: events carry names, ids and counts, never tokens, keys, request
//! bodies or headers.

use std::str::FromStr;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// The variable that selects the format (`text` or `json`).
pub const FORMAT_ENV: &str = "FLOCK_LOG_FORMAT";
/// The variable that selects the events (`EnvFilter` directives).
pub const FILTER_ENV: &str = "RUST_LOG";
/// Set (to `1`) by the supervisor on the processes it spawns in text mode: it stamps every line
/// of theirs with the time it arrived, so they write none of their own (one timestamp a line).
pub const NO_TIME_ENV: &str = "FLOCK_LOG_NO_TIME";
/// The filter when `RUST_LOG` is unset or empty.
pub const DEFAULT_FILTER: &str = "info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// Human-readable: `2025-01-02T03:04:05.678901Z  INFO span{field=..}: message field=value`.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }

    /// The format `value` of [`FORMAT_ENV`] asks for: unset or empty is [`Format::Text`].
    pub fn from_env_value(value: Option<&str>) -> Result<Format, String> {
        match value.map(str::trim) {
            None | Some("") => Ok(Format::Text),
            Some(v) => v.parse(),
        }
    }
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Format, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            other => Err(format!("unknown log format `{other}` (expected `text` or `json`)")),
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

static CHOSEN: OnceLock<Format> = OnceLock::new();

/// Installs the process's logger with the format of `FLOCK_LOG_FORMAT` (text if unset; a bad
/// value is warned about and ignored). `component` names the process in those warnings and in
/// the first debug event. Returns the format in use. A second call changes nothing.
pub fn init(component: &str) -> Format {
    let wanted = Format::from_env_value(std::env::var(FORMAT_ENV).ok().as_deref());
    let format = wanted.clone().unwrap_or_default();
    init_with(component, format);
    if let Err(why) = wanted {
        tracing::warn!(component, "{FORMAT_ENV}: {why}; logging as text");
    }
    format
}

/// [`init`] with the format given (`flock-supervisor up --log-format`).
pub fn init_with(component: &str, format: Format) {
    if CHOSEN.set(format).is_err() {
        return;
    }
    let (filter, bad_filter) = filter_from(std::env::var(FILTER_ENV).ok().as_deref());
    // Fails only if something else installed a logger first; that one stays.
    let stamped = std::env::var_os(NO_TIME_ENV).is_none_or(|v| v != "1");
    let _ = tracing::subscriber::set_global_default(subscriber(
        format,
        filter,
        stamped,
        std::io::stderr,
    ));
    if let Some(why) = bad_filter {
        tracing::warn!(component, "{FILTER_ENV}: {why}; logging at `{DEFAULT_FILTER}`");
    }
    tracing::debug!(component, pid = std::process::id(), format = %format, "logging started");
}

/// The format this process logs in ([`Format::Text`] before [`init`]).
pub fn format() -> Format {
    CHOSEN.get().copied().unwrap_or_default()
}

/// The variables to set on a spawned Flock process whose stderr this process stamps line by
/// line: it logs in this process's format, without a time of its own in text mode (`RUST_LOG`,
/// when set, is passed on by the supervisor's environment allowlist).
pub fn child_env() -> Vec<(&'static str, &'static str)> {
    let mut vars = vec![(FORMAT_ENV, format().as_str())];
    if format() == Format::Text {
        vars.push((NO_TIME_ENV, "1"));
    }
    vars
}

/// The filter of `RUST_LOG`'s `value`, and why it was not usable if it was not.
fn filter_from(value: Option<&str>) -> (EnvFilter, Option<String>) {
    match value.map(str::trim) {
        None | Some("") => (EnvFilter::new(DEFAULT_FILTER), None),
        Some(v) => match EnvFilter::try_new(v) {
            Ok(f) => (f, None),
            Err(e) => (EnvFilter::new(DEFAULT_FILTER), Some(e.to_string())),
        },
    }
}

/// The subscriber for `format`, writing to `writer`; text lines begin with the time if
/// `stamped` (JSON objects always carry it).
fn subscriber<W>(
    format: Format,
    filter: EnvFilter,
    stamped: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(false);
    match format {
        Format::Text if stamped => Box::new(builder.with_target(false).finish()),
        Format::Text => Box::new(builder.with_target(false).without_time().finish()),
        Format::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(format: Format, filter: &str) -> String {
        capture_stamped(format, filter, true)
    }

    fn capture_stamped(format: Format, filter: &str, stamped: bool) -> String {
        let buf = Buf::default();
        let out = buf.clone();
        let sub = subscriber(format, EnvFilter::new(filter), stamped, move || out.clone());
        tracing::subscriber::with_default(sub, || {
            let span = tracing::info_span!("turn", agent = "worker", msg_id = "0042");
            let _in = span.enter();
            tracing::info!(tool = "fs_read", tokens_in = 12, "tool called");
            tracing::debug!("not shown at info");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_format_comes_from_the_variable() {
        assert_eq!(Format::from_env_value(None), Ok(Format::Text));
        assert_eq!(Format::from_env_value(Some("")), Ok(Format::Text));
        assert_eq!(Format::from_env_value(Some("json")), Ok(Format::Json));
        assert_eq!(Format::from_env_value(Some(" JSON ")), Ok(Format::Json));
        assert_eq!(Format::from_env_value(Some("text")), Ok(Format::Text));
        assert!(Format::from_env_value(Some("xml")).unwrap_err().contains("`xml`"));
        assert_eq!(format(), Format::Text, "before init");
    }

    #[test]
    fn a_bad_filter_falls_back_to_info() {
        assert!(filter_from(None).1.is_none());
        assert!(filter_from(Some("debug,flock_actors=trace")).1.is_none());
        let (filter, why) = filter_from(Some("[[["));
        assert!(why.is_some());
        assert_eq!(filter.to_string(), DEFAULT_FILTER);
    }

    #[test]
    fn text_lines_have_time_level_span_message_and_fields_without_colours() {
        let text = capture(Format::Text, "info");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line = lines[0];
        assert!(line.starts_with("20") && line.contains('T'), "a timestamp first: {line}");
        assert!(
            line.contains("INFO turn{agent=\"worker\" msg_id=\"0042\"}: tool called"),
            "{line}"
        );
        assert!(line.contains("tool=\"fs_read\" tokens_in=12"), "{line}");
        assert!(!line.contains('\x1b'), "no ANSI colours: {line}");
        assert!(!line.contains("flock_log"), "no target: {line}");
    }

    #[test]
    fn a_child_whose_lines_the_supervisor_stamps_writes_no_time_of_its_own() {
        let text = capture_stamped(Format::Text, "info", false);
        let line = text.lines().next().unwrap_or_default();
        assert!(line.trim_start().starts_with("INFO turn{"), "no timestamp: {line}");
        let json = capture_stamped(Format::Json, "info", false);
        assert!(json.contains("\"timestamp\""), "JSON keeps its time: {json}");
    }

    #[test]
    fn json_lines_are_objects_with_flattened_fields_and_the_span() {
        let text = capture(Format::Json, "info");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("one JSON object");
        assert_eq!(v["level"], "INFO", "{v}");
        assert_eq!(v["message"], "tool called", "{v}");
        assert_eq!(v["tool"], "fs_read", "{v}");
        assert_eq!(v["tokens_in"], 12, "{v}");
        assert_eq!(v["span"]["name"], "turn", "{v}");
        assert_eq!(v["span"]["agent"], "worker", "{v}");
        assert_eq!(v["spans"][0]["msg_id"], "0042", "{v}");
        assert!(v["timestamp"].is_string(), "{v}");
    }

    #[test]
    fn the_filter_selects_the_events() {
        assert_eq!(capture(Format::Text, "debug").lines().count(), 2);
        assert_eq!(capture(Format::Text, "warn").lines().count(), 0);
    }
}
