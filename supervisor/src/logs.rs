//! Per-agent logs: every line an agent prints goes to `<state>/logs/<agent>.log` (rotated by
//! size, 3 old files kept), into an in-memory ring buffer for `flockctl logs`, and to live
//! followers (`flockctl logs -f`).

use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::broadcast;

/// Lines kept in memory per agent.
pub const RING_LINES: usize = 2000;
/// Size at which a log file is rotated.
pub const MAX_LOG_BYTES: u64 = 10 * 1024 * 1024;
const KEEP_ROTATED: usize = 3;

struct AgentLog {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    ring: VecDeque<String>,
    live: broadcast::Sender<String>,
}

impl AgentLog {
    fn open(path: PathBuf) -> Self {
        let file = OpenOptions::new().create(true).append(true).open(&path).ok();
        let size = file.as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len());
        let ring = tail_lines(&path, RING_LINES);
        AgentLog { path, file, size, ring, live: broadcast::channel(1024).0 }
    }

    fn push(&mut self, line: String) {
        if self.size >= MAX_LOG_BYTES {
            self.rotate();
        }
        if let Some(f) = &mut self.file
            && writeln!(f, "{line}").is_ok()
        {
            self.size += line.len() as u64 + 1;
        }
        if self.ring.len() == RING_LINES {
            self.ring.pop_front();
        }
        let _ = self.live.send(line.clone());
        self.ring.push_back(line);
    }

    fn rotate(&mut self) {
        self.file = None;
        for i in (1..KEEP_ROTATED).rev() {
            let _ = std::fs::rename(rotated(&self.path, i), rotated(&self.path, i + 1));
        }
        let _ = std::fs::rename(&self.path, rotated(&self.path, 1));
        self.file = OpenOptions::new().create(true).append(true).open(&self.path).ok();
        self.size = 0;
    }
}

fn rotated(path: &std::path::Path, i: usize) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{i}"));
    PathBuf::from(s)
}

/// The last `n` lines of a file (used to seed the ring buffer after a supervisor restart).
pub fn tail_lines(path: &std::path::Path, n: usize) -> VecDeque<String> {
    let Ok(text) = std::fs::read_to_string(path) else { return VecDeque::new() };
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].iter().map(|s| s.to_string()).collect()
}

/// All agents' logs.
#[derive(Clone, Default)]
pub struct LogHub {
    inner: Arc<Mutex<HashMap<String, AgentLog>>>,
    dir: PathBuf,
}

impl std::fmt::Debug for LogHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogHub").field("dir", &self.dir).finish()
    }
}

impl LogHub {
    pub fn new(dir: PathBuf) -> Self {
        LogHub { inner: Arc::default(), dir }
    }

    fn with<T>(&self, agent: &str, f: impl FnOnce(&mut AgentLog) -> T) -> T {
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let log = map
            .entry(agent.to_owned())
            .or_insert_with(|| AgentLog::open(self.dir.join(format!("{agent}.log"))));
        f(log)
    }

    /// Appends one line, stamped with the time and the stream it came from (`out`, `err`, or
    /// `flock` for the supervisor's own notes). In JSON mode (`--log-format json`) every line of
    /// the file is a JSON object: a child's own JSON events as they are, anything else wrapped.
    pub fn line(&self, agent: &str, stream: &str, text: &str) {
        let line = match flock_log::format() {
            flock_log::Format::Text => format!("{} {stream} {text}", utc_now()),
            flock_log::Format::Json => json_line(agent, stream, text),
        };
        self.with(agent, |l| l.push(line));
    }

    /// The last `n` lines and a receiver for the lines after them.
    pub fn tail(&self, agent: &str, n: usize) -> (Vec<String>, broadcast::Receiver<String>) {
        self.with(agent, |l| {
            let skip = l.ring.len().saturating_sub(n);
            (l.ring.iter().skip(skip).cloned().collect(), l.live.subscribe())
        })
    }

    /// Copies a child's output stream into the agent's log until it closes.
    pub fn capture(
        &self,
        agent: String,
        stream: &'static str,
        out: impl AsyncRead + Unpin + Send + 'static,
    ) {
        let hub = self.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                hub.line(&agent, stream, &line);
            }
        });
    }
}

/// `text` as one JSON line: as it is if it already is a JSON object (a child logging in JSON),
/// else an event of our own with the agent and the stream as fields.
fn json_line(agent: &str, stream: &str, text: &str) -> String {
    let text = text.trim_end();
    if text.starts_with('{') && text.ends_with('}') {
        return text.to_owned();
    }
    serde_json::json!({
        "timestamp": utc_now(),
        "level": if stream == "err" { "WARN" } else { "INFO" },
        "message": text,
        "agent": agent,
        "stream": stream,
    })
    .to_string()
}

/// The message of a log line: the `message` of a JSON event, else the line itself.
pub fn message_of(line: &str) -> std::borrow::Cow<'_, str> {
    if line.starts_with('{')
        && let Ok(serde_json::Value::Object(map)) = serde_json::from_str(line)
        && let Some(serde_json::Value::String(m)) = map.get("message")
    {
        return std::borrow::Cow::Owned(m.clone());
    }
    std::borrow::Cow::Borrowed(line)
}

/// Current UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the journal's format).
pub fn utc_now() -> String {
    flock_actors::journal::now_timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_rotate_and_ring_keeps_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let hub = LogHub::new(dir.path().to_path_buf());
        for i in 0..(RING_LINES + 5) {
            hub.line("a", "out", &format!("line {i}"));
        }
        let (tail, _) = hub.tail("a", 3);
        assert_eq!(tail.len(), 3);
        assert!(tail[2].ends_with(&format!("line {}", RING_LINES + 4)));
        hub.with("a", |l| l.size = MAX_LOG_BYTES);
        hub.line("a", "out", "after rotation");
        assert!(dir.path().join("a.log.1").exists());
        let fresh = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
        assert_eq!(fresh.lines().count(), 1);
    }

    #[test]
    fn json_lines_keep_a_childs_events_and_wrap_the_rest() {
        let own = r#"{"timestamp":"t","level":"INFO","message":"turn done","agent":"a"}"#;
        assert_eq!(json_line("a", "err", own), own);
        let wrapped: serde_json::Value =
            serde_json::from_str(&json_line("a", "flock", "spawned pid 7")).unwrap();
        assert_eq!(wrapped["message"], "spawned pid 7");
        assert_eq!(wrapped["agent"], "a");
        assert_eq!(wrapped["stream"], "flock");
        assert_eq!(wrapped["level"], "INFO");
        assert_eq!(
            message_of(r#"{"level":"ERROR","message":"flock-model: error: gone"}"#),
            "flock-model: error: gone"
        );
        assert_eq!(message_of("plain error: x"), "plain error: x");
    }
}
