//! What the harness and the bench agents agree on: the text protocol of the load runs, message
//! sizing, result files and a few helpers.
//!
//! The harness starts a run by sending the driving agent (`sender`, `requester`) one durable
//! message from the operator: `go key=value …`. The agent acknowledges it at once, runs, and writes
//! one JSON object to `<its working directory>/<out>`; the harness polls for that file.
//!
//! At-most-once runs (`sender` → `sink`):
//! - data: `d <warm> <every> <padding…>` — the sink parses only the first one after a reset;
//! - `p <count>` (sink → sender, at_most_once): cumulative count received, every `every` messages;
//!   the sender keeps at most `window` messages unaccounted for (not yet counted by the sink nor
//!   refused by the router), so the target's bounded outbox never overflows when it keeps up;
//! - `end` (sender → sink, durable: never dropped, and it cannot overtake the data because the
//!   router handles a connection's frames in order and hands at_most_once frames to the target's
//!   outbox at once) → the sink answers `final <count> <measured> <measured_ns>` (durable) and
//!   resets.

use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use flock_ipc::{Body, Frame, SendMode, encode_frame};

/// Wall-clock nanoseconds; used only for durations measured inside one process.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// `key=value` parameters of a `go` message (the first word is the command).
#[derive(Debug, Clone, Default)]
pub struct Params(HashMap<String, String>);

impl Params {
    pub fn parse(text: &str) -> Self {
        Params(
            text.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    pub fn str(&self, key: &str) -> Result<&str> {
        self.0.get(key).map(String::as_str).with_context(|| format!("`go` has no `{key}=`"))
    }

    pub fn u64(&self, key: &str) -> Result<u64> {
        let v = self.str(key)?;
        v.parse().with_context(|| format!("`{key}={v}` is not a number"))
    }

    pub fn u64_or(&self, key: &str, default: u64) -> Result<u64> {
        if self.0.contains_key(key) { self.u64(key) } else { Ok(default) }
    }
}

/// Builds a `go` message from pairs.
pub fn go(pairs: &[(&str, String)]) -> String {
    let mut s = String::from("go");
    for (k, v) in pairs {
        s.push(' ');
        s.push_str(k);
        s.push('=');
        s.push_str(v);
    }
    s
}

/// The data text of an at_most_once run, padded so that the sender's `Send` frame from `from` to
/// `to` encodes to `frame_bytes` bytes (length prefix included) when possible.
pub fn data_text(from: &str, to: &str, warm: u64, every: u64, frame_bytes: usize) -> String {
    let head = format!("d {warm} {every} ");
    let mut text = head.clone();
    loop {
        let size = send_frame_size(from, to, &text, SendMode::AtMostOnce);
        if size >= frame_bytes {
            return text;
        }
        text.push_str(&"x".repeat(frame_bytes - size));
    }
}

/// Text of the requested length for requests and durable sends, padded like [`data_text`].
pub fn padded_text(
    from: &str,
    to: &str,
    prefix: &str,
    mode: SendMode,
    frame_bytes: usize,
) -> String {
    let mut text = prefix.to_owned();
    loop {
        let size = send_frame_size(from, to, &text, mode);
        if size >= frame_bytes {
            return text;
        }
        text.push_str(&"x".repeat(frame_bytes - size));
    }
}

/// Encoded size (length prefix included) of a `Send` frame with a fresh id.
pub fn send_frame_size(from: &str, to: &str, text: &str, mode: SendMode) -> usize {
    frame_size(&Frame::new(from, to, Body::Send { text: text.to_owned(), mode }))
}

/// Encoded size (length prefix included) of a frame.
pub fn frame_size(frame: &Frame) -> usize {
    let mut buf = Vec::new();
    encode_frame(frame, &mut buf).map(|()| buf.len()).unwrap_or(0)
}

/// Writes `value` to `path` atomically (temporary file, then rename), so a poller never reads half.
pub fn write_result(path: &Path, value: &serde_json::Value) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(value)?)
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))?;
    Ok(())
}

/// Parses a result file name: plain names only, so a `go` cannot write outside the workspace.
pub fn result_name(p: &Params) -> Result<String> {
    let out = p.str("out")?;
    if out.is_empty() || out.contains('/') || out.starts_with('.') {
        bail!("`out={out}` must be a plain file name");
    }
    Ok(out.to_owned())
}

/// Percentile (nearest rank) of sorted values.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Median of values (sorted copy; the lower middle for an even count).
pub fn median_f64(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_text_hits_the_frame_size() {
        let text = data_text("sender", "sink", 100, 1024, 150);
        assert_eq!(send_frame_size("sender", "sink", &text, SendMode::AtMostOnce), 150);
        assert!(text.starts_with("d 100 1024 "));
    }

    #[test]
    fn params_and_percentiles() {
        let p = Params::parse("go count=10 out=r.json");
        assert_eq!(p.u64("count").unwrap(), 10);
        assert_eq!(p.u64_or("warm", 3).unwrap(), 3);
        assert_eq!(result_name(&p).unwrap(), "r.json");
        assert!(result_name(&Params::parse("go out=../x")).is_err());
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(median_f64(&[3.0, 1.0, 2.0]), 2.0);
    }
}
