//! Per-agent logs: every line an agent prints goes to `<state>/logs/<agent>.log` (rotated by
//! size, 3 old files kept), into an in-memory ring buffer for `flockctl logs`, and to live
//! followers (`flockctl logs -f`): those of that agent, and those of every log (`flockctl logs
//! -f` without an agent), who also see the lines of agents created after they began.

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
    /// Lines pushed since the log was opened (the ring's last line is number `pushed`).
    pushed: u64,
    /// Output streams of the agent's process still being copied in.
    captures: usize,
    /// The agent is gone for good: let go of the file and the lines once `captures` is 0.
    retired: bool,
}

impl AgentLog {
    fn open(path: PathBuf) -> Self {
        let file = OpenOptions::new().create(true).append(true).open(&path).ok();
        let size = file.as_ref().and_then(|f| f.metadata().ok()).map_or(0, |m| m.len());
        let ring = tail_lines(&path, RING_LINES);
        AgentLog {
            path,
            file,
            size,
            // The lines read back from the file are the first ones.
            pushed: ring.len() as u64,
            ring,
            live: broadcast::channel(1024).0,
            captures: 0,
            retired: false,
        }
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
        self.pushed += 1;
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

/// A line of any log, with the name of its log (what followers of every log receive).
pub type Sourced = (Arc<str>, String);

/// Lines of every log a follower of all of them may fall behind by before it skips some.
const ALL_CAPACITY: usize = 4096;

#[derive(Default)]
struct Logs {
    agents: HashMap<String, AgentLog>,
    /// Every line of every log; created with the first follower of all logs.
    all: Option<broadcast::Sender<Sourced>>,
}

/// All agents' logs.
#[derive(Clone, Default)]
pub struct LogHub {
    inner: Arc<Mutex<Logs>>,
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Logs> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn open<'a>(&self, logs: &'a mut Logs, agent: &str) -> &'a mut AgentLog {
        logs.agents
            .entry(agent.to_owned())
            .or_insert_with(|| AgentLog::open(self.dir.join(format!("{agent}.log"))))
    }

    fn with<T>(&self, agent: &str, f: impl FnOnce(&mut AgentLog) -> T) -> T {
        let mut logs = self.lock();
        f(self.open(&mut logs, agent))
    }

    /// Appends one line, stamped with the time and the stream it came from (`out`, `err`, or
    /// `flock` for the supervisor's own notes) — except a child's own log event on stderr, which
    /// carries its level instead (`… INFO flock_agent: …`, not `… err  INFO …`). In JSON mode
    /// (`--log-format json`) every line of the file is a JSON object: a child's own JSON events as
    /// they are, anything else wrapped.
    pub fn line(&self, agent: &str, stream: &str, text: &str) {
        let line = match flock_log::format() {
            flock_log::Format::Text if stream == "err" && is_log_event(text) => {
                format!("{} {}", utc_now(), text.trim_start())
            }
            flock_log::Format::Text => format!("{} {stream} {text}", utc_now()),
            flock_log::Format::Json => json_line(agent, stream, text),
        };
        let mut logs = self.lock();
        if let Some(all) = &logs.all
            && all.receiver_count() > 0
        {
            let _ = all.send((Arc::from(agent), line.clone()));
        }
        self.open(&mut logs, agent).push(line);
    }

    /// The lines after line number `after` still held (`None`: the last `n`; lines that left
    /// the ring meanwhile are said to be skipped), and the number of the last line.
    pub fn page(&self, agent: &str, after: Option<u64>, n: usize) -> (Vec<String>, u64) {
        self.with(agent, |l| {
            // The ring holds lines `first..=pushed` (numbered from 1).
            let first = (l.pushed + 1).saturating_sub(l.ring.len() as u64);
            let mut lines = Vec::new();
            let skip = match after {
                None => l.ring.len().saturating_sub(n),
                Some(a) if a + 1 >= first => (a + 1 - first).min(l.ring.len() as u64) as usize,
                Some(a) => {
                    lines.push(format!("… {} lines skipped (client too slow) …", first - a - 1));
                    0
                }
            };
            lines.extend(l.ring.iter().skip(skip).cloned());
            (lines, l.pushed)
        })
    }

    /// The last `n` lines and a receiver for the lines after them.
    pub fn tail(&self, agent: &str, n: usize) -> (Vec<String>, broadcast::Receiver<String>) {
        self.with(agent, |l| {
            let skip = l.ring.len().saturating_sub(n);
            (l.ring.iter().skip(skip).cloned().collect(), l.live.subscribe())
        })
    }

    /// The last `n` lines of each of `names`' logs and of every log written since the
    /// supervisor started, merged (see [`merge`]), and a receiver for every line of every log
    /// after them, logs created later included.
    pub fn tail_all(
        &self,
        names: &[String],
        n: usize,
    ) -> (Vec<Sourced>, broadcast::Receiver<Sourced>) {
        let mut logs = self.lock();
        let mut all: Vec<String> = logs.agents.keys().cloned().collect();
        all.extend(names.iter().cloned());
        all.sort();
        all.dedup();
        let tails = all
            .into_iter()
            .map(|name| {
                let log = self.open(&mut logs, &name);
                let skip = log.ring.len().saturating_sub(n);
                let lines = log.ring.iter().skip(skip).cloned().collect();
                (name, lines)
            })
            .collect();
        let live = logs.all.get_or_insert_with(|| broadcast::channel(ALL_CAPACITY).0).subscribe();
        (merge(tails), live)
    }

    /// Copies a child's output stream into the agent's log until it closes.
    pub fn capture(
        &self,
        agent: String,
        stream: &'static str,
        out: impl AsyncRead + Unpin + Send + 'static,
    ) {
        let hub = self.clone();
        hub.with(&agent, |l| l.captures += 1);
        tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                hub.line(&agent, stream, &line);
            }
            let mut logs = hub.lock();
            if let Some(l) = logs.agents.get_mut(&agent) {
                l.captures = l.captures.saturating_sub(1);
                if l.retired && l.captures == 0 {
                    logs.agents.remove(&agent);
                }
            }
        });
    }

    /// The agent is gone for good (decommissioned): its log file is closed and its lines leave
    /// memory once the last of its output is in (the file stays; `flockctl logs` reads it
    /// again if asked). Followers of its log see it end.
    pub fn retire(&self, agent: &str) {
        let mut logs = self.lock();
        if let Some(l) = logs.agents.get_mut(agent) {
            if l.captures == 0 {
                logs.agents.remove(agent);
            } else {
                l.retired = true;
            }
        }
    }
}

/// Several logs' lines as one list: in order of time when every line starts with a timestamp
/// (as [`LogHub::line`] writes them; lines of the same time keep their log's order), else log
/// by log.
pub fn merge(logs: Vec<(String, Vec<String>)>) -> Vec<Sourced> {
    let mut lines: Vec<Sourced> = logs
        .into_iter()
        .flat_map(|(name, lines)| {
            let name: Arc<str> = Arc::from(name);
            lines.into_iter().map(move |l| (name.clone(), l))
        })
        .collect();
    if lines.iter().all(|(_, l)| timestamp(l).is_some()) {
        lines.sort_by(|a, b| timestamp(&a.1).cmp(&timestamp(&b.1)));
    }
    lines
}

/// The `YYYY-MM-DDTHH:MM:SS.mmmZ` a log line starts with, if it does.
fn timestamp(line: &str) -> Option<&str> {
    let stamp = line.split(' ').next()?;
    let b = stamp.as_bytes();
    let ok = b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && stamp.ends_with('Z')
        && b[..4].iter().all(u8::is_ascii_digit);
    ok.then_some(stamp)
}

/// Whether a child's stderr line is one of its own log events (`flock_log`'s text format starts
/// with the level), not something it printed.
fn is_log_event(text: &str) -> bool {
    let level = text.trim_start().split(' ').next().unwrap_or_default();
    matches!(level, "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR")
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
    flock_journal::now_timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_is_paged_by_line_number_and_says_what_a_slow_reader_missed() {
        let dir = tempfile::tempdir().unwrap();
        let hub = LogHub::new(dir.path().to_path_buf());
        for i in 1..=3 {
            hub.line("a", "out", &format!("line {i}"));
        }
        let ends = |lines: &[String]| -> Vec<String> {
            lines.iter().map(|l| l.rsplit(' ').take(2).collect::<Vec<_>>().join(" ")).collect()
        };
        let (last, next) = hub.page("a", None, 2);
        assert_eq!((ends(&last), next), (vec!["2 line".into(), "3 line".into()], 3));
        let (none, next) = hub.page("a", Some(3), 0);
        assert!(none.is_empty() && next == 3);
        hub.line("a", "out", "line 4");
        let (new, next) = hub.page("a", Some(3), 0);
        assert_eq!((ends(&new), next), (vec!["4 line".into()], 4));
        // A reader that fell past the ring is told how many lines it missed.
        for i in 5..(RING_LINES + 10) {
            hub.line("a", "out", &format!("line {i}"));
        }
        let (page, next) = hub.page("a", Some(4), 0);
        assert_eq!(next, (RING_LINES + 9) as u64);
        assert!(page[0].contains("… 5 lines skipped"), "{}", page[0]);
        assert_eq!(page.len(), RING_LINES + 1);
        // A log opened again (a restarted supervisor) numbers the lines it read back first.
        let again = LogHub::new(dir.path().to_path_buf());
        let (_, next) = again.page("a", None, 1);
        assert_eq!(next, RING_LINES as u64);
    }

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
    fn a_childs_own_log_events_carry_their_level_and_other_stderr_its_stream() {
        let dir = tempfile::tempdir().unwrap();
        let hub = LogHub::new(dir.path().to_path_buf());
        hub.line("a", "err", "  INFO flock_agent: turn done agent=a");
        hub.line("a", "err", "thread 'main' panicked at src/main.rs:1:1");
        hub.line("a", "out", "INFO from stdout");
        let (tail, _) = hub.tail("a", 3);
        let rest: Vec<&str> = tail.iter().map(|l| l.split_once(' ').unwrap().1).collect();
        assert_eq!(
            rest,
            [
                "INFO flock_agent: turn done agent=a",
                "err thread 'main' panicked at src/main.rs:1:1",
                "out INFO from stdout"
            ]
        );
    }

    #[test]
    fn following_every_log_sees_logs_created_later() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("old.log"), "2000-01-01T00:00:02.000Z out second\n")
            .unwrap();
        let hub = LogHub::new(dir.path().to_path_buf());
        hub.line("a", "out", "third");
        let (tail, mut live) = hub.tail_all(&["old".into()], 10);
        let tail: Vec<_> = tail.iter().map(|(n, l)| format!("{n}: {l}")).collect();
        assert_eq!(tail.len(), 2, "{tail:?}");
        assert!(tail[0].starts_with("old: ") && tail[1].ends_with("out third"), "{tail:?}");
        hub.line("newcomer", "err", "hello");
        let (name, line) = live.try_recv().unwrap();
        assert_eq!((&*name, line.ends_with("err hello")), ("newcomer", true));
    }

    #[test]
    fn merge_orders_by_time_only_when_every_line_has_one() {
        let t = |s: &str| format!("2026-01-01T00:00:0{s}.000Z out {s}");
        let merged = merge(vec![("a".into(), vec![t("1"), t("3")]), ("b".into(), vec![t("2")])]);
        let order: Vec<&str> = merged.iter().map(|(n, _)| &**n).collect();
        assert_eq!(order, ["a", "b", "a"]);
        let merged =
            merge(vec![("a".into(), vec![t("3"), "plain".into()]), ("b".into(), vec![t("1")])]);
        let order: Vec<&str> = merged.iter().map(|(n, _)| &**n).collect();
        assert_eq!(order, ["a", "a", "b"]);
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
