//! The shared workspace journal (DESIGN.md §9): an append-only JSON Lines file of everything that
//! matters, in the shared-journal schema, safe with concurrent writers in several processes.
//!
//! It is a library over a directory, not an actor: callers (the router, `flockctl journal`) append
//! and read directly. It is not the store — nothing here is transactional with SQLite.
//!
//! ```text
//! <dir>/journal.jsonl        current file, one event per line
//! <dir>/journal.1.jsonl      rotated files, .1 newest .. .5 oldest (older ones are deleted)
//! <dir>/journal.lock         flock(2) target: exclusive for append + rotation, shared for reads
//! ```
//!
//! Guarantees:
//! - Every line written is a whole event: an append takes the exclusive lock, opens the current
//!   file with `O_APPEND` and writes `line + "\n"` in one `write`. Writers in other processes and
//!   threads (each `Journal` holds its own lock descriptor; one `Journal` serializes its own
//!   threads with a mutex) never interleave.
//! - A torn last line (a writer killed mid-write, a full disk) is skipped on read and reported in
//!   [`ReadOutcome::skipped`]; the next append first writes the missing `'\n'`, so the torn bytes
//!   stay a line of their own and never corrupt the next event.
//! - Rotation is by size: once the current file exceeds `max_bytes` it becomes `journal.1.jsonl`
//!   (older files shift up, [`KEEP_ROTATED`] are kept). Readers take the shared lock, so they see
//!   either the files before a rotation or after it, never half of one.
//! - No fsync: an appended event survives `kill -9` of any process (it is in the page cache); a
//!   power cut may lose the last events or tear the last line.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};

use serde::Serialize;
use serde_json::{Map, Value};

/// Size at which the current file is rotated, unless [`Journal::open`] is given another.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Rotated files kept (`journal.1.jsonl` .. `journal.5.jsonl`).
pub const KEEP_ROTATED: usize = 5;
/// Largest serialized event accepted by [`Journal::append`]: events are summaries; big content
/// belongs in a file named in `result.artifacts`.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;
/// The current file's name inside the journal directory.
pub const FILE_NAME: &str = "journal.jsonl";
/// The lock file's name inside the journal directory.
pub const LOCK_FILE_NAME: &str = "journal.lock";

/// Read granularity when scanning a file backwards from its end.
const CHUNK_BYTES: u64 = 64 * 1024;

/// Why a journal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file system refused (directory, lock file or journal file).
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The event does not satisfy the schema; nothing was written.
    #[error("invalid journal event: {0}")]
    Invalid(String),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> JournalError {
    let path = path.to_path_buf();
    move |source| JournalError::Io { action, path, source }
}

/// The final state of the action an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Status {
    Success,
    Failed,
    InProgress,
}

impl Status {
    pub const ALL: [Status; 3] = [Status::Success, Status::Failed, Status::InProgress];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Success => "SUCCESS",
            Status::Failed => "FAILED",
            Status::InProgress => "IN_PROGRESS",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = String;

    /// Exact schema spelling (`SUCCESS`, `FAILED`, `IN_PROGRESS`), case-insensitively.
    fn from_str(s: &str) -> Result<Self, String> {
        Status::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("status must be one of SUCCESS, FAILED, IN_PROGRESS, got {s:?}"))
    }
}

/// What was done: `action {type, input?, params}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Action {
    /// UPPER_SNAKE_CASE kind of action (`CHANNEL_POST`, `TOOL_CALL`, `FILE_CREATE`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// The prompt or input that triggered the action, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The parameters the action used (always an object, possibly empty).
    pub params: Map<String, Value>,
}

/// What came of it: `result {message, artifacts?}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    /// A human-readable summary.
    pub message: String,
    /// Paths or names of resources created or changed (omitted from the line when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
}

/// Links to other events or work: `trace {correlation_id?, parent_id?}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Trace {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<String>,
}

impl Trace {
    pub fn is_empty(&self) -> bool {
        self.correlation_id.is_none() && self.parent_id.is_none()
    }
}

/// One journal line. Serialize with `serde_json`; parse with [`validate_line`] (there is
/// deliberately no `Deserialize`, so nothing reads an event without checking the schema).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JournalEvent {
    /// `evt_<yyyymmddHHMMSS>_<8 lowercase hex>`.
    pub id: String,
    /// ISO 8601 UTC with milliseconds: `2026-11-21T21:00:00.007Z`.
    pub timestamp: String,
    /// Who did it: an agent id, `human:NAME`, or `system`.
    pub agent: String,
    pub status: Status,
    pub action: Action,
    pub result: Outcome,
    /// Omitted from the line when empty.
    #[serde(skip_serializing_if = "Trace::is_empty")]
    pub trace: Trace,
}

impl JournalEvent {
    /// A new event stamped now, with a fresh id, empty params and no trace.
    pub fn new(
        agent: impl Into<String>,
        action_type: impl Into<String>,
        status: Status,
        message: impl Into<String>,
    ) -> Self {
        let timestamp = format_timestamp(unix_ms_now());
        JournalEvent {
            id: event_id_for(&timestamp),
            timestamp,
            agent: agent.into(),
            status,
            action: Action { kind: action_type.into(), input: None, params: Map::new() },
            result: Outcome { message: message.into(), artifacts: Vec::new() },
            trace: Trace::default(),
        }
    }

    pub fn input(mut self, input: impl Into<String>) -> Self {
        self.action.input = Some(input.into());
        self
    }

    pub fn param(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.action.params.insert(key.into(), value.into());
        self
    }

    pub fn artifacts<I, S>(mut self, artifacts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.result.artifacts.extend(artifacts.into_iter().map(Into::into));
        self
    }

    pub fn correlation(mut self, correlation_id: impl Into<String>) -> Self {
        self.trace.correlation_id = Some(correlation_id.into());
        self
    }

    pub fn parent(mut self, parent_id: impl Into<String>) -> Self {
        self.trace.parent_id = Some(parent_id.into());
        self
    }

    /// The event as one JSON line, without the trailing newline.
    pub fn to_line(&self) -> String {
        // Serializing plain strings, maps of `Value` and a unit enum cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Time and ids

fn unix_ms_now() -> u64 {
    flock_ipc::time::unix_ms_now()
}

/// The current time as a journal timestamp.
pub fn now_timestamp() -> String {
    format_timestamp(unix_ms_now())
}

pub use flock_ipc::time::format_timestamp;

/// A fresh event id whose date part is the second of `timestamp` (a valid journal timestamp;
/// anything else gets the current second).
pub fn event_id_for(timestamp: &str) -> String {
    let digits: String = if check_timestamp(timestamp).is_ok() {
        timestamp[..19].chars().filter(char::is_ascii_digit).collect()
    } else {
        now_timestamp()[..19].chars().filter(char::is_ascii_digit).collect()
    };
    format!("evt_{digits}_{:08x}", fastrand::u32(..))
}

/// Checks `YYYY MM DD HH MM SS` numbers (already known to be digits) for calendar sense.
fn check_date_time(y: u32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> Result<(), String> {
    if !(1..=12).contains(&mo) {
        return Err(format!("month {mo:02} is not 01-12"));
    }
    let real = |y: u32, mo: u32, d: u32| {
        let n = |v: u32| i8::try_from(v).unwrap_or(i8::MAX);
        jiff::civil::Date::new(i16::try_from(y).unwrap_or(i16::MAX), n(mo), n(d)).is_ok()
    };
    if !real(y, mo, d) {
        return Err(format!("day {d:02} does not exist in {y:04}-{mo:02}"));
    }
    if h > 23 || mi > 59 || s > 59 {
        return Err(format!("time {h:02}:{mi:02}:{s:02} is out of range"));
    }
    Ok(())
}

fn digits(s: &str) -> Option<u32> {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) { s.parse().ok() } else { None }
}

/// The timestamp template: `D` is a digit, anything else is literal.
const TIMESTAMP_TEMPLATE: &str = "DDDD-DD-DDTDD:DD:DD.DDDZ";

/// True when `s` matches the first `s.len()` characters of the timestamp template (a
/// prefix such as `2026-11-21` or `2026-11-21T21:00`), used for query bounds.
pub fn is_timestamp_prefix(s: &str) -> bool {
    s.len() <= TIMESTAMP_TEMPLATE.len()
        && s.bytes().zip(TIMESTAMP_TEMPLATE.bytes()).all(|(c, t)| match t {
            b'D' => c.is_ascii_digit(),
            _ => c == t,
        })
}

fn check_timestamp(s: &str) -> Result<(), String> {
    if s.len() != TIMESTAMP_TEMPLATE.len() || !is_timestamp_prefix(s) {
        return Err("wrong shape".to_string());
    }
    let n = |r: std::ops::Range<usize>| digits(&s[r]).unwrap_or(0);
    check_date_time(n(0..4), n(5..7), n(8..10), n(11..13), n(14..16), n(17..19))
}

fn check_id(s: &str) -> Result<(), String> {
    let Some(rest) = s.strip_prefix("evt_") else { return Err("it must start with evt_".into()) };
    let (stamp, hex) = rest.split_once('_').ok_or("the _ before the hex part is missing")?;
    if stamp.len() != 14 || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the date part must be 14 digits (UTC yyyymmddHHMMSS)".into());
    }
    let n = |r: std::ops::Range<usize>| digits(&stamp[r]).unwrap_or(0);
    check_date_time(n(0..4), n(4..6), n(6..8), n(8..10), n(10..12), n(12..14))?;
    if hex.len() != 8 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err("the random part must be 8 lowercase hex digits".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Parses one journal line and checks it strictly against the schema. The error lists every
/// problem found, each saying what is wrong and how to fix it.
pub fn validate_line(line: &str) -> Result<JournalEvent, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| {
        format!("not valid JSON ({e}); a journal line must be exactly one JSON object")
    })?;
    validate_value(&value)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Collects every schema problem of one event.
struct Checker {
    problems: Vec<String>,
}

impl Checker {
    fn unknown_fields(&mut self, obj: &Map<String, Value>, at: &str, allowed: &[&str]) {
        for key in obj.keys().filter(|k| !allowed.contains(&k.as_str())) {
            self.problems.push(format!(
                "unknown field `{key}` in {at} (allowed: {}); remove it or fix its spelling",
                allowed.join(", ")
            ));
        }
    }

    fn object<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        path: &str,
        key: &str,
        hint: &str,
    ) -> Option<&'v Map<String, Value>> {
        match obj.get(key) {
            None => {
                self.problems.push(format!("missing required object `{path}` ({hint})"));
                None
            }
            Some(Value::Object(o)) => Some(o),
            Some(other) => {
                self.problems.push(format!(
                    "`{path}` must be a JSON object ({hint}), got {}",
                    kind_of(other)
                ));
                None
            }
        }
    }

    fn string<'v>(
        &mut self,
        obj: &'v Map<String, Value>,
        path: &str,
        key: &str,
        required: bool,
        hint: &str,
    ) -> Option<&'v str> {
        match obj.get(key) {
            None if required => {
                self.problems.push(format!("missing required field `{path}` ({hint})"));
                None
            }
            None => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => {
                let fix = if required { "" } else { "; omit it when there is none" };
                self.problems.push(format!(
                    "`{path}` must be a string ({hint}), got {}{fix}",
                    kind_of(other)
                ));
                None
            }
        }
    }
}

/// Checks an already parsed JSON value against the schema (see [`validate_line`]).
pub fn validate_value(value: &Value) -> Result<JournalEvent, String> {
    let Value::Object(top) = value else {
        return Err(format!(
            "a journal event must be a JSON object with id, timestamp, agent, status, action \
             and result, got {}",
            kind_of(value)
        ));
    };
    let mut c = Checker { problems: Vec::new() };
    c.unknown_fields(
        top,
        "the event",
        &["id", "timestamp", "agent", "status", "action", "result", "trace"],
    );

    let id = c.string(top, "id", "id", true, "like evt_20261121210000_1a2b3c4d");
    if let Some(id) = id
        && let Err(why) = check_id(id)
    {
        c.problems.push(format!(
            "`id` {id:?} is malformed: {why}; use evt_<UTC yyyymmddHHMMSS>_<8 lowercase hex>, \
             like evt_20261121210000_1a2b3c4d"
        ));
    }
    let timestamp = c.string(top, "timestamp", "timestamp", true, "like 2026-11-21T21:00:00.007Z");
    if let Some(ts) = timestamp
        && let Err(why) = check_timestamp(ts)
    {
        c.problems.push(format!(
            "`timestamp` {ts:?} is malformed ({why}); use ISO 8601 UTC with milliseconds, \
             like 2026-11-21T21:00:00.007Z"
        ));
    }
    let agent = c.string(top, "agent", "agent", true, "the agent id, human:NAME or system");
    if let Some(a) = agent
        && (a.trim().is_empty() || a.chars().any(char::is_control))
    {
        c.problems.push(format!(
            "`agent` {a:?} must be a non-empty name without control characters, like worker-1"
        ));
    }
    let status_hint = "one of SUCCESS, FAILED, IN_PROGRESS";
    let status = c.string(top, "status", "status", true, status_hint).and_then(|s| {
        let st = Status::ALL.into_iter().find(|st| st.as_str() == s);
        if st.is_none() {
            c.problems
                .push(format!("`status` must be {status_hint} (upper case, exactly), got {s:?}"));
        }
        st
    });

    let action =
        c.object(top, "action", "action", "{\"type\": …, \"params\": {…}}").and_then(|a| {
            c.unknown_fields(a, "`action`", &["type", "input", "params"]);
            let kind = c.string(a, "action.type", "type", true, "UPPER_SNAKE_CASE like TOOL_CALL");
            if let Some(k) = kind {
                let mut bytes = k.bytes();
                let ok = bytes.next().is_some_and(|b| b.is_ascii_uppercase())
                    && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
                if !ok {
                    c.problems.push(format!(
                        "`action.type` must be UPPER_SNAKE_CASE like TOOL_CALL or CHANNEL_POST, \
                         got {k:?}"
                    ));
                }
            }
            let input =
                c.string(a, "action.input", "input", false, "the triggering prompt or input");
            let params = match a.get("params") {
                None => {
                    c.problems.push(
                    "missing required field `action.params`; use {} when there are no parameters"
                        .to_string(),
                );
                    None
                }
                Some(Value::Object(p)) => Some(p),
                Some(other) => {
                    c.problems.push(format!(
                        "`action.params` must be a JSON object (use {{}} when there are no \
                     parameters), got {}",
                        kind_of(other)
                    ));
                    None
                }
            };
            Some(Action {
                kind: kind?.to_string(),
                input: input.map(str::to_string),
                params: params?.clone(),
            })
        });

    let result = c.object(top, "result", "result", "{\"message\": …}").and_then(|r| {
        c.unknown_fields(r, "`result`", &["message", "artifacts"]);
        let message = c.string(r, "result.message", "message", true, "a human-readable summary");
        let artifacts = match r.get("artifacts") {
            None => Some(Vec::new()),
            Some(Value::Array(items)) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) => out.push(s.clone()),
                        other => c.problems.push(format!(
                            "`result.artifacts[{i}]` must be a string (a path or resource name), \
                             got {}",
                            kind_of(other)
                        )),
                    }
                }
                Some(out)
            }
            Some(other) => {
                c.problems.push(format!(
                    "`result.artifacts` must be an array of strings (paths or resource names), \
                     got {}; omit it when there are none",
                    kind_of(other)
                ));
                None
            }
        };
        Some(Outcome { message: message?.to_string(), artifacts: artifacts? })
    });

    let trace = match top.get("trace") {
        None => Some(Trace::default()),
        Some(Value::Object(t)) => {
            c.unknown_fields(t, "`trace`", &["correlation_id", "parent_id"]);
            let corr =
                c.string(t, "trace.correlation_id", "correlation_id", false, "groups related work");
            let parent = c.string(t, "trace.parent_id", "parent_id", false, "the parent event id");
            Some(Trace {
                correlation_id: corr.map(str::to_string),
                parent_id: parent.map(str::to_string),
            })
        }
        Some(other) => {
            c.problems.push(format!(
                "`trace` must be a JSON object with correlation_id and/or parent_id, got {}; \
                 omit it when there is no trace",
                kind_of(other)
            ));
            None
        }
    };

    if !c.problems.is_empty() {
        return Err(c.problems.join("; "));
    }
    match (id, timestamp, agent, status, action, result, trace) {
        (
            Some(id),
            Some(ts),
            Some(agent),
            Some(status),
            Some(action),
            Some(result),
            Some(trace),
        ) => Ok(JournalEvent {
            id: id.to_string(),
            timestamp: ts.to_string(),
            agent: agent.to_string(),
            status,
            action,
            result,
            trace,
        }),
        // Every `None` above pushed a problem.
        _ => Err("invalid journal event".to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Reading results and filters

/// A line that was not a valid event and was left out of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    pub file: PathBuf,
    /// Byte offset of the line's first byte in `file`.
    pub offset: u64,
    /// True for a last line with no trailing newline (a writer died mid-append).
    pub torn: bool,
    pub reason: String,
}

/// Events read (oldest first) and the damaged lines met on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadOutcome {
    pub events: Vec<JournalEvent>,
    /// Lines skipped among those scanned (a read that stops early does not see older ones).
    pub skipped: Vec<SkippedLine>,
}

/// Which events [`Journal::query`] returns; every `Some` must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub agent: Option<String>,
    pub action_type: Option<String>,
    pub status: Option<Status>,
    /// Inclusive lower bound, compared as strings with `timestamp` (a prefix such as
    /// `2026-11-21` works: the fixed format sorts like time).
    pub since: Option<String>,
    /// Exclusive upper bound, compared the same way (`until=2026-11-22` means before that day).
    pub until: Option<String>,
    pub correlation_id: Option<String>,
    /// Keep only the newest `limit` matches.
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, e: &JournalEvent) -> bool {
        self.agent.as_ref().is_none_or(|a| *a == e.agent)
            && self.action_type.as_ref().is_none_or(|t| *t == e.action.kind)
            && self.status.is_none_or(|s| s == e.status)
            && self.since.as_ref().is_none_or(|s| e.timestamp.as_str() >= s.as_str())
            && self.until.as_ref().is_none_or(|u| e.timestamp.as_str() < u.as_str())
            && self
                .correlation_id
                .as_ref()
                .is_none_or(|c| e.trace.correlation_id.as_deref() == Some(c.as_str()))
    }
}

// ---------------------------------------------------------------------------------------------
// The writer task

/// Appends events on a task of its own, in batches (one lock and one `write` for everything
/// queued): an actor hands an event over and goes on, never waiting on the file. Events are
/// lost only if the supervisor dies before the task writes them (milliseconds).
#[derive(Debug, Clone)]
pub struct JournalWriter {
    tx: tokio::sync::mpsc::UnboundedSender<JournalEvent>,
    journal: std::sync::Arc<Journal>,
}

impl JournalWriter {
    /// Starts the writer task on the current tokio runtime.
    pub fn spawn(journal: std::sync::Arc<Journal>) -> JournalWriter {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<JournalEvent>();
        let writer = JournalWriter { tx, journal: journal.clone() };
        tokio::spawn(async move {
            let mut batch = Vec::new();
            while rx.recv_many(&mut batch, 4096).await > 0 {
                let events = std::mem::take(&mut batch);
                let j = journal.clone();
                // One invalid event must not cost the others their line: on a refusal the batch
                // is written event by event.
                let written = tokio::task::spawn_blocking(move || match j.append_all(&events) {
                    Err(JournalError::Invalid(_)) => {
                        events.iter().map(|e| j.append(e)).find(Result::is_err).unwrap_or(Ok(()))
                    }
                    other => other,
                })
                .await;
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "flock journal: append failed"),
                    Err(e) => tracing::error!(error = %e, "flock journal: the writer failed"),
                }
            }
        });
        writer
    }

    pub fn log(&self, event: JournalEvent) {
        let _ = self.tx.send(event);
    }

    /// The last `n` events that concern `agent` (written by it, or naming it in a parameter), as
    /// one line each, oldest first, handed to `reply` from a blocking task (the caller never
    /// waits on the file). Looks at the newest [`RECENT_SCAN`] events.
    pub fn recent_for(&self, agent: &str, n: usize, reply: impl FnOnce(String) + Send + 'static) {
        let (journal, agent) = (self.journal.clone(), agent.to_owned());
        tokio::task::spawn_blocking(move || {
            let lines = match journal.read_last(RECENT_SCAN) {
                Ok(read) => concerning(&read.events, &agent, n),
                Err(e) => format!("(the journal could not be read: {e})"),
            };
            reply(lines);
        });
    }
}

/// How many of the newest events [`JournalWriter::recent_for`] looks through.
pub const RECENT_SCAN: usize = 2_000;

/// The last `n` of `events` (oldest first) that `agent` wrote or that name it in a parameter:
/// `HH:MM:SS AGENT TYPE STATUS: message`.
pub fn concerning(events: &[JournalEvent], agent: &str, n: usize) -> String {
    let mine: Vec<&JournalEvent> = events
        .iter()
        .filter(|e| e.agent == agent || e.action.params.values().any(|v| v.as_str() == Some(agent)))
        .collect();
    mine[mine.len().saturating_sub(n)..]
        .iter()
        .map(|e| {
            let time = e.timestamp.get(11..19).unwrap_or(&e.timestamp);
            let message: String = e.result.message.chars().take(200).collect();
            format!("{time} {} {} {}: {message}", e.agent, e.action.kind, e.status.as_str())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

// ---------------------------------------------------------------------------------------------
// The journal

/// A journal directory. Cheap to open; holds one descriptor on the lock file. Open one per
/// process (or several: each has its own lock descriptor, so they exclude each other too).
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    max_bytes: u64,
    /// flock(2) locks belong to an open file description, which the threads of this `Journal`
    /// share; the mutex makes them take turns before asking the kernel.
    lock: Mutex<File>,
}

/// Holds the flock until dropped (then the mutex).
struct LockGuard<'a> {
    file: MutexGuard<'a, File>,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`; the current file rotates once it exceeds
    /// `max_bytes` ([`DEFAULT_MAX_BYTES`] is the usual value).
    pub fn open(dir: impl AsRef<Path>, max_bytes: u64) -> Result<Journal, JournalError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io_err("create journal directory", &dir))?;
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err("open journal lock", &lock_path))?;
        Ok(Journal { dir, max_bytes: max_bytes.max(1), lock: Mutex::new(lock) })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current file.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Rotated file `i` (1 = newest).
    pub fn rotated_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("journal.{i}.jsonl"))
    }

    /// Every file that may hold events, newest first.
    fn files_newest_first(&self) -> Vec<PathBuf> {
        std::iter::once(self.current_path())
            .chain((1..=KEEP_ROTATED).map(|i| self.rotated_path(i)))
            .collect()
    }

    fn lock(&self, exclusive: bool) -> Result<LockGuard<'_>, JournalError> {
        let file = self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let locked = if exclusive { file.lock() } else { file.lock_shared() };
        locked.map_err(io_err("lock", &self.dir.join(LOCK_FILE_NAME)))?;
        Ok(LockGuard { file })
    }

    /// Appends one event (checked against the schema first; an invalid event writes nothing),
    /// then rotates if the current file has grown past `max_bytes`.
    pub fn append(&self, event: &JournalEvent) -> Result<(), JournalError> {
        self.append_all(std::slice::from_ref(event))
    }

    /// Appends several events under one lock and in one `write` (each checked first: if any is
    /// invalid, nothing is written), then rotates if needed.
    pub fn append_all(&self, events: &[JournalEvent]) -> Result<(), JournalError> {
        let mut lines = Vec::new();
        for event in events {
            let line = event.to_line();
            validate_line(&line).map_err(JournalError::Invalid)?;
            if line.len() > MAX_EVENT_BYTES {
                return Err(JournalError::Invalid(format!(
                    "the event is {} bytes, more than the {MAX_EVENT_BYTES}-byte limit; put large \
                     content in a file and name it in result.artifacts",
                    line.len()
                )));
            }
            lines.extend_from_slice(line.as_bytes());
            lines.push(b'\n');
        }
        if lines.is_empty() {
            return Ok(());
        }

        let _guard = self.lock(true)?;
        let path = self.current_path();
        // Opened per append, under the lock: after another process rotated, the name points at
        // the new file, and a cached descriptor would still point at the rotated one.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err("open journal", &path))?;
        let len = file.metadata().map_err(io_err("stat journal", &path))?.len();
        let mut buf = Vec::with_capacity(lines.len() + 1);
        if len > 0 {
            let mut last = [0u8; 1];
            file.read_exact_at(&mut last, len - 1).map_err(io_err("read journal", &path))?;
            if last[0] != b'\n' {
                // A torn line from a crashed writer: end it, so this event starts a line.
                buf.push(b'\n');
            }
        }
        buf.extend_from_slice(&lines);
        file.write_all(&buf).map_err(io_err("append to journal", &path))?;
        drop(file);
        crate::metrics::get().journal_appends.inc_by(events.len() as u64);

        if len + buf.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        Ok(())
    }

    /// Shifts `journal.jsonl` → `.1` → … → `.5`, dropping the oldest. Caller holds the lock.
    fn rotate(&self) -> Result<(), JournalError> {
        let oldest = self.rotated_path(KEEP_ROTATED);
        match std::fs::remove_file(&oldest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove old journal", &oldest)(e)),
        }
        for i in (1..KEEP_ROTATED).rev() {
            let from = self.rotated_path(i);
            match std::fs::rename(&from, self.rotated_path(i + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("rotate journal", &from)(e)),
            }
        }
        let current = self.current_path();
        std::fs::rename(&current, self.rotated_path(1)).map_err(io_err("rotate journal", &current))
    }

    /// The newest `n` events across the current and rotated files, oldest first.
    pub fn read_last(&self, n: usize) -> Result<ReadOutcome, JournalError> {
        let mut out = ReadOutcome::default();
        if n == 0 {
            return Ok(out);
        }
        out.skipped = self.scan_newest_first(&mut |e| {
            out.events.push(e);
            if out.events.len() >= n { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })?;
        out.events.reverse();
        Ok(out)
    }

    /// Events matching `filter`, oldest first (the newest `filter.limit` when set).
    pub fn query(&self, filter: &Filter) -> Result<ReadOutcome, JournalError> {
        let mut out = ReadOutcome::default();
        if filter.limit == Some(0) {
            return Ok(out);
        }
        out.skipped = self.scan_newest_first(&mut |e| {
            if filter.matches(&e) {
                out.events.push(e);
                if filter.limit.is_some_and(|l| out.events.len() >= l) {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })?;
        out.events.reverse();
        Ok(out)
    }

    /// Feeds every valid event to `visit`, newest first, until it breaks; returns the damaged
    /// lines met, newest first. Holds the shared lock so no rotation happens underneath.
    fn scan_newest_first(
        &self,
        visit: &mut dyn FnMut(JournalEvent) -> ControlFlow<()>,
    ) -> Result<Vec<SkippedLine>, JournalError> {
        let _guard = self.lock(false)?;
        let mut skipped = Vec::new();
        for path in self.files_newest_first() {
            if scan_file_backwards(&path, visit, &mut skipped)?.is_break() {
                break;
            }
        }
        Ok(skipped)
    }
}

/// Reads `path` from its end in chunks, line by line, newest first. A missing file is empty.
fn scan_file_backwards(
    path: &Path,
    visit: &mut dyn FnMut(JournalEvent) -> ControlFlow<()>,
    skipped: &mut Vec<SkippedLine>,
) -> Result<ControlFlow<()>, JournalError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ControlFlow::Continue(())),
        Err(e) => return Err(io_err("open journal", path)(e)),
    };
    let len = file.metadata().map_err(io_err("stat journal", path))?.len();

    // `buf` holds bytes [pos, pos + buf.len()) not yet split into lines.
    let mut pos = len;
    let mut buf: Vec<u8> = Vec::new();
    // The first segment handled is whatever follows the last '\n': empty when the file ends
    // with a newline, else a line with no newline — torn.
    let mut last_segment = true;
    loop {
        let (line, offset) = if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            let line = buf.split_off(i + 1);
            buf.truncate(i);
            (line, pos + i as u64 + 1)
        } else if pos == 0 {
            (std::mem::take(&mut buf), 0)
        } else {
            let n = CHUNK_BYTES.min(pos);
            pos -= n;
            let mut chunk = vec![0u8; n as usize];
            file.read_exact_at(&mut chunk, pos).map_err(io_err("read journal", path))?;
            chunk.extend_from_slice(&buf);
            buf = chunk;
            continue;
        };
        let torn = last_segment;
        last_segment = false;
        if !line.iter().all(u8::is_ascii_whitespace) {
            let parsed = std::str::from_utf8(&line)
                .map_err(|e| format!("not UTF-8 ({e})"))
                .and_then(validate_line);
            match parsed {
                Ok(event) => {
                    if visit(event).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Err(reason) => {
                    let reason = if torn {
                        format!(
                            "torn last line (no trailing newline: a writer stopped \
                             mid-append): {reason}"
                        )
                    } else {
                        reason
                    };
                    skipped.push(SkippedLine { file: path.to_path_buf(), offset, torn, reason });
                }
            }
        }
        if offset == 0 {
            return Ok(ControlFlow::Continue(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::HashSet;

    fn journal(dir: &Path, max_bytes: u64) -> Journal {
        Journal::open(dir, max_bytes).expect("open journal")
    }

    fn seq_event(agent: &str, seq: usize) -> JournalEvent {
        JournalEvent::new(agent, "TEST_EVENT", Status::Success, format!("event {seq} of {agent}"))
            .param("seq", seq)
    }

    fn seq_of(e: &JournalEvent) -> usize {
        e.action.params["seq"].as_u64().expect("seq param") as usize
    }

    /// Every raw line of every journal file, oldest file first.
    fn raw_lines(j: &Journal) -> Vec<String> {
        let mut files = j.files_newest_first();
        files.reverse();
        files
            .iter()
            .filter_map(|p| std::fs::read_to_string(p).ok())
            .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
            .collect()
    }

    fn good_value() -> Value {
        json!({
            "id": "evt_20261121210000_1a2b3c4d",
            "timestamp": "2026-11-21T21:00:00.007Z",
            "agent": "worker-1",
            "status": "SUCCESS",
            "action": {
                "type": "CHANNEL_POST",
                "input": "say hi",
                "params": {"channel": "#general"}
            },
            "result": {"message": "posted", "artifacts": ["a.txt"]},
            "trace": {"correlation_id": "task-1", "parent_id": "evt_20261121205959_00000000"}
        })
    }

    #[test]
    fn timestamp_formatter_matches_known_instants() {
        assert_eq!(format_timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_timestamp(1_795_294_800_007), "2026-11-21T21:00:00.007Z");
        assert_eq!(format_timestamp(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(format_timestamp(951_868_800_000), "2000-03-01T00:00:00.000Z");
        assert_eq!(format_timestamp(4_102_444_799_000), "2099-12-31T23:59:59.000Z");
        for _ in 0..10_000 {
            let ts = format_timestamp(fastrand::u64(..8_000_000_000_000));
            assert!(check_timestamp(&ts).is_ok(), "{ts}");
        }
    }

    #[test]
    fn new_event_has_well_formed_id_matching_its_timestamp() {
        let e = JournalEvent::new("worker-1", "TOOL_CALL", Status::InProgress, "running");
        check_id(&e.id).expect("id format");
        check_timestamp(&e.timestamp).expect("timestamp format");
        let stamp: String = e.timestamp[..19].chars().filter(char::is_ascii_digit).collect();
        assert_eq!(&e.id[4..18], stamp);
        let other = JournalEvent::new("worker-1", "TOOL_CALL", Status::InProgress, "running");
        assert_ne!(e.id, other.id, "ids carry a random part");
    }

    #[test]
    fn event_round_trips_through_a_json_line() {
        let full = JournalEvent::new("worker-1", "FILE_CREATE", Status::Success, "created a.txt")
            .input("create a file")
            .param("path", "a.txt")
            .param("bytes", 42)
            .param("nested", json!({"k": [1, 2]}))
            .artifacts(["a.txt", "b.txt"])
            .correlation("task-7")
            .parent("evt_20261121205959_0badcafe");
        let line = full.to_line();
        assert!(!line.contains('\n'));
        assert!(line.starts_with("{\"id\":\"evt_"), "id comes first: {line}");
        assert_eq!(validate_line(&line).expect("valid"), full);

        let minimal = JournalEvent::new("system", "SUPERVISOR_START", Status::Success, "up");
        let line = minimal.to_line();
        for absent in ["trace", "artifacts", "input"] {
            assert!(!line.contains(absent), "{absent} omitted when empty: {line}");
        }
        assert!(line.contains("\"params\":{}"), "params always present: {line}");
        assert_eq!(validate_line(&line).expect("valid"), minimal);

        let good = validate_value(&good_value()).expect("valid");
        assert_eq!(serde_json::to_value(&good).expect("serialize"), good_value());
    }

    #[test]
    fn the_shared_journal_spec_example_validates() {
        let line = r#"{"id":"evt_20250903142510_f4a9b1c8","timestamp":"2025-09-03T14:25:10.591Z","agent":"Claude","status":"SUCCESS","action":{"type":"FILE_CREATE","input":"Create a basic express server in server.js","params":{"path":"c:/Users/etlov/agents-workspace/server.js","content_summary":"A simple express server listening on port 3000"}},"result":{"message":"File server.js created successfully with a basic express server setup.","artifacts":["c:/Users/etlov/agents-workspace/server.js"]},"trace":{"correlation_id":"task_abc_123"}}"#;
        let e = validate_line(line).expect("spec example is valid");
        assert_eq!(e.agent, "Claude");
        assert_eq!(e.trace.correlation_id.as_deref(), Some("task_abc_123"));
    }

    #[test]
    fn validate_rejects_each_kind_of_bad_input_with_a_useful_message() {
        type Mutate = fn(&mut Value);
        let cases: Vec<(&str, Mutate, &[&str])> = vec![
            ("not an object", |v| *v = json!([1]), &["must be a JSON object", "an array"]),
            (
                "missing id",
                |v| drop(v.as_object_mut().unwrap().remove("id")),
                &["missing required field `id`", "evt_"],
            ),
            (
                "id prefix",
                |v| v["id"] = json!("event_20261121210000_1a2b3c4d"),
                &["`id`", "start with evt_"],
            ),
            ("id short date", |v| v["id"] = json!("evt_2026_1a2b3c4d"), &["`id`", "14 digits"]),
            (
                "id bad month",
                |v| v["id"] = json!("evt_20261321210000_1a2b3c4d"),
                &["`id`", "month 13"],
            ),
            (
                "id upper hex",
                |v| v["id"] = json!("evt_20261121210000_1A2B3C4D"),
                &["`id`", "8 lowercase hex"],
            ),
            ("id no hex", |v| v["id"] = json!("evt_20261121210000"), &["`id`", "_ before the hex"]),
            ("id number", |v| v["id"] = json!(7), &["`id` must be a string", "a number"]),
            (
                "timestamp no ms",
                |v| v["timestamp"] = json!("2026-11-21T21:00:00Z"),
                &["`timestamp`", "2026-11-21T21:00:00.007Z"],
            ),
            (
                "timestamp offset",
                |v| v["timestamp"] = json!("2026-11-21T21:00:00.007+00:00"),
                &["`timestamp`", "UTC"],
            ),
            (
                "timestamp feb 30",
                |v| v["timestamp"] = json!("2026-02-30T21:00:00.007Z"),
                &["`timestamp`", "day 30 does not exist"],
            ),
            (
                "timestamp hour 24",
                |v| v["timestamp"] = json!("2026-11-21T24:00:00.007Z"),
                &["`timestamp`", "out of range"],
            ),
            (
                "missing timestamp",
                |v| drop(v.as_object_mut().unwrap().remove("timestamp")),
                &["missing required field `timestamp`"],
            ),
            ("empty agent", |v| v["agent"] = json!(""), &["`agent`", "non-empty"]),
            ("agent control char", |v| v["agent"] = json!("a\nb"), &["`agent`", "control"]),
            (
                "status unknown",
                |v| v["status"] = json!("OK"),
                &["`status` must be one of SUCCESS, FAILED, IN_PROGRESS", "\"OK\""],
            ),
            ("status lower case", |v| v["status"] = json!("success"), &["`status`", "upper case"]),
            (
                "missing action",
                |v| drop(v.as_object_mut().unwrap().remove("action")),
                &["missing required object `action`"],
            ),
            (
                "action not object",
                |v| v["action"] = json!("CHANNEL_POST"),
                &["`action` must be a JSON object", "a string"],
            ),
            (
                "type not snake",
                |v| v["action"]["type"] = json!("channel post"),
                &["`action.type` must be UPPER_SNAKE_CASE"],
            ),
            (
                "missing type",
                |v| drop(v["action"].as_object_mut().unwrap().remove("type")),
                &["missing required field `action.type`"],
            ),
            (
                "missing params",
                |v| drop(v["action"].as_object_mut().unwrap().remove("params")),
                &["`action.params`", "use {}"],
            ),
            (
                "params array",
                |v| v["action"]["params"] = json!(["a"]),
                &["`action.params` must be a JSON object", "an array"],
            ),
            (
                "input number",
                |v| v["action"]["input"] = json!(3),
                &["`action.input` must be a string", "omit it"],
            ),
            (
                "input null",
                |v| v["action"]["input"] = json!(null),
                &["`action.input` must be a string", "null"],
            ),
            (
                "missing result",
                |v| drop(v.as_object_mut().unwrap().remove("result")),
                &["missing required object `result`"],
            ),
            (
                "missing message",
                |v| drop(v["result"].as_object_mut().unwrap().remove("message")),
                &["missing required field `result.message`"],
            ),
            (
                "artifacts string",
                |v| v["result"]["artifacts"] = json!("a.txt"),
                &["`result.artifacts` must be an array of strings"],
            ),
            (
                "artifact number",
                |v| v["result"]["artifacts"] = json!(["a", 1]),
                &["`result.artifacts[1]` must be a string", "a number"],
            ),
            (
                "trace string",
                |v| v["trace"] = json!("task-1"),
                &["`trace` must be a JSON object", "omit it"],
            ),
            (
                "trace corr number",
                |v| v["trace"]["correlation_id"] = json!(1),
                &["`trace.correlation_id` must be a string"],
            ),
            (
                "unknown top field",
                |v| v["staus"] = json!("SUCCESS"),
                &["unknown field `staus` in the event", "allowed: id, timestamp"],
            ),
            (
                "unknown action field",
                |v| v["action"]["param"] = json!({}),
                &["unknown field `param` in `action`", "allowed: type, input, params"],
            ),
            (
                "unknown trace field",
                |v| v["trace"]["parent"] = json!("x"),
                &["unknown field `parent` in `trace`"],
            ),
        ];
        for (name, mutate, expected) in cases {
            let mut v = good_value();
            mutate(&mut v);
            let err = validate_value(&v).expect_err(name);
            for needle in expected {
                assert!(err.contains(needle), "{name}: {err:?} should contain {needle:?}");
            }
            // The same through the line API.
            assert_eq!(validate_line(&v.to_string()).expect_err(name), err);
        }

        let err = validate_line("{\"id\": ").expect_err("truncated JSON");
        assert!(err.contains("not valid JSON"), "{err}");
        let err = validate_line("{} {}").expect_err("two objects");
        assert!(err.contains("exactly one JSON object"), "{err}");

        // Several problems are reported at once.
        let mut v = good_value();
        v["status"] = json!("DONE");
        v["action"]["params"] = json!(null);
        let err = validate_value(&v).expect_err("two problems");
        assert!(err.contains("`status`") && err.contains("`action.params`"), "{err}");
    }

    #[test]
    fn an_agents_slice_of_the_journal_holds_what_it_did_and_what_named_it() {
        let events = vec![
            JournalEvent::new("coordinator", "DELEGATE", Status::Success, "to the worker")
                .param("to", "worker"),
            JournalEvent::new("worker", "TOOL_CALL", Status::Failed, "fs_write refused"),
            JournalEvent::new("observer", "NOTE", Status::Success, "unrelated"),
            JournalEvent::new("worker", "ANSWER", Status::Success, "done"),
        ];
        let all = concerning(&events, "worker", 10);
        let lines: Vec<&str> = all.lines().collect();
        assert_eq!(lines.len(), 3, "{all}");
        assert!(lines[0].contains("coordinator DELEGATE SUCCESS: to the worker"), "{all}");
        assert!(lines[1].contains("worker TOOL_CALL FAILED: fs_write refused"), "{all}");
        assert_eq!(concerning(&events, "worker", 1).lines().count(), 1);
        assert!(concerning(&events, "worker", 1).contains("ANSWER"));
        assert_eq!(concerning(&events, "nobody", 5), "");
    }

    #[test]
    fn append_writes_one_line_per_event_and_read_last_returns_newest_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        assert_eq!(j.read_last(5).unwrap(), ReadOutcome::default(), "empty journal");
        let events: Vec<_> = (0..10).map(|i| seq_event("worker-1", i)).collect();
        for e in &events {
            j.append(e).unwrap();
        }
        let text = std::fs::read_to_string(j.current_path()).unwrap();
        assert_eq!(text.lines().count(), 10);
        assert!(text.ends_with('\n'));

        let last3 = j.read_last(3).unwrap();
        assert_eq!(last3.events, events[7..]);
        assert!(last3.skipped.is_empty());
        assert_eq!(j.read_last(100).unwrap().events, events);
        assert!(j.read_last(0).unwrap().events.is_empty());
        // A second handle on the same directory sees the same events.
        assert_eq!(
            journal(dir.path(), DEFAULT_MAX_BYTES).read_last(1).unwrap().events,
            events[9..]
        );
    }

    #[test]
    fn append_rejects_an_invalid_event_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        let bad = JournalEvent::new("worker-1", "not upper", Status::Failed, "x");
        let err = j.append(&bad).expect_err("invalid action type");
        assert!(
            matches!(&err, JournalError::Invalid(m) if m.contains("UPPER_SNAKE_CASE")),
            "{err}"
        );
        let huge =
            JournalEvent::new("worker-1", "BIG", Status::Success, "x".repeat(MAX_EVENT_BYTES));
        let err = j.append(&huge).expect_err("too big");
        assert!(err.to_string().contains("result.artifacts"), "{err}");
        assert_eq!(std::fs::metadata(j.current_path()).map(|m| m.len()).unwrap_or(0), 0);
    }

    #[test]
    fn torn_last_line_is_skipped_and_the_next_append_starts_a_fresh_line() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        let events: Vec<_> = (0..3).map(|i| seq_event("worker-1", i)).collect();
        for e in &events {
            j.append(e).unwrap();
        }
        // A writer killed mid-write: half a line, no newline.
        let half = &seq_event("worker-2", 99).to_line()[..40];
        let mut f = OpenOptions::new().append(true).open(j.current_path()).unwrap();
        f.write_all(half.as_bytes()).unwrap();
        drop(f);
        let size_before = std::fs::metadata(j.current_path()).unwrap().len();

        let read = j.read_last(10).unwrap();
        assert_eq!(read.events, events);
        assert_eq!(read.skipped.len(), 1);
        let skipped = &read.skipped[0];
        assert!(skipped.torn);
        assert_eq!(skipped.offset, size_before - half.len() as u64);
        assert!(skipped.reason.starts_with("torn last line"), "{}", skipped.reason);
        assert_eq!(skipped.file, j.current_path());

        let next = seq_event("worker-1", 3);
        j.append(&next).unwrap();
        let text = std::fs::read_to_string(j.current_path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[3], half, "the torn bytes stay a line of their own");
        assert_eq!(validate_line(lines[4]).unwrap(), next, "the new event is not glued on");

        let read = j.read_last(10).unwrap();
        assert_eq!(read.events.iter().map(seq_of).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(read.skipped.len(), 1);
        assert!(!read.skipped[0].torn, "now a complete but invalid line");
        assert!(read.skipped[0].reason.contains("not valid JSON"), "{}", read.skipped[0].reason);
    }

    #[test]
    fn invalid_complete_lines_are_skipped_and_reported_wherever_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        j.append(&seq_event("a", 0)).unwrap();
        let mut f = OpenOptions::new().append(true).open(j.current_path()).unwrap();
        f.write_all(b"{\"id\":\"evt_1\"}\n\n   \n").unwrap();
        drop(f);
        j.append(&seq_event("a", 1)).unwrap();
        let mut f = OpenOptions::new().append(true).open(j.current_path()).unwrap();
        f.write_all(b"garbage\n").unwrap();
        drop(f);

        let read = j.read_last(10).unwrap();
        assert_eq!(read.events.iter().map(seq_of).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(read.skipped.len(), 2, "blank lines are not counted: {:?}", read.skipped);
        assert!(read.skipped[0].reason.contains("not valid JSON"));
        assert!(read.skipped[1].reason.contains("`id`"), "{}", read.skipped[1].reason);
        assert!(read.skipped.iter().all(|s| !s.torn));
        // Stopping early does not scan (or report) older damage.
        let read = j.read_last(1).unwrap();
        assert_eq!(read.events.iter().map(seq_of).collect::<Vec<_>>(), [1]);
        assert_eq!(read.skipped.len(), 1);
    }

    #[test]
    fn a_valid_last_line_without_newline_is_read_and_then_ended_by_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        let hand = seq_event("human:ana", 0);
        std::fs::write(j.current_path(), hand.to_line()).unwrap();
        let read = j.read_last(5).unwrap();
        assert_eq!(read.events, std::slice::from_ref(&hand));
        assert!(read.skipped.is_empty());
        let next = seq_event("human:ana", 1);
        j.append(&next).unwrap();
        assert_eq!(j.read_last(5).unwrap().events, [hand, next]);
    }

    #[test]
    fn backward_scan_reads_lines_longer_than_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        let big = |i: usize, len: usize| {
            JournalEvent::new("a", "BIG", Status::Success, "é".repeat(len)).param("seq", i)
        };
        let events = vec![big(0, 10), big(1, 150_000), big(2, 3), big(3, 70_000), big(4, 1)];
        for e in &events {
            j.append(e).unwrap();
        }
        let read = j.read_last(10).unwrap();
        assert!(read.skipped.is_empty());
        assert_eq!(read.events, events);
        assert_eq!(j.read_last(2).unwrap().events, events[3..]);
    }

    #[test]
    fn rotation_keeps_events_readable_and_read_last_spans_files() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), 1000);
        let events: Vec<_> = (0..20).map(|i| seq_event("worker-1", i)).collect();
        for e in &events {
            j.append(e).unwrap();
        }
        assert!(j.rotated_path(1).exists() && j.rotated_path(2).exists(), "rotated twice or more");
        for path in j.files_newest_first().iter().filter(|p| p.exists()) {
            let len = std::fs::metadata(path).unwrap().len();
            assert!(len <= 1000 + 300, "{} is {len} bytes", path.display());
        }
        assert_eq!(raw_lines(&j).len(), 20);
        assert_eq!(j.read_last(100).unwrap().events, events);
        let last7 = j.read_last(7).unwrap().events;
        assert_eq!(last7, events[13..]);
        assert_eq!(j.query(&Filter::default()).unwrap().events, events);
    }

    #[test]
    fn rotation_keeps_five_old_files_and_drops_older_ones() {
        let dir = tempfile::tempdir().unwrap();
        // Every append overflows, so every event ends up alone in a rotated file.
        let j = journal(dir.path(), 1);
        for i in 0..9 {
            j.append(&seq_event("worker-1", i)).unwrap();
        }
        assert!(!j.current_path().exists());
        for i in 1..=KEEP_ROTATED {
            assert!(j.rotated_path(i).exists(), "journal.{i}.jsonl");
        }
        assert!(!j.rotated_path(KEEP_ROTATED + 1).exists());
        let read = j.read_last(100).unwrap();
        assert_eq!(read.events.iter().map(seq_of).collect::<Vec<_>>(), [4, 5, 6, 7, 8]);
        j.append(&seq_event("worker-1", 9)).unwrap();
        assert_eq!(j.read_last(1).unwrap().events.iter().map(seq_of).collect::<Vec<_>>(), [9]);
    }

    #[test]
    fn query_filters_on_every_field_and_limit_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        let mk = |i: usize, agent: &str, kind: &str, status: Status, corr: Option<&str>| {
            let mut e = JournalEvent::new(agent, kind, status, format!("m{i}")).param("seq", i);
            e.timestamp = format!("2026-11-2{}T21:00:00.000Z", i / 2);
            e.id = event_id_for(&e.timestamp);
            if let Some(c) = corr {
                e = e.correlation(c);
            }
            e
        };
        let events = [
            mk(0, "orchestrator", "CHANNEL_CREATE", Status::Success, Some("p1")),
            mk(1, "worker-1", "TOOL_CALL", Status::Failed, Some("p1")),
            mk(2, "worker-1", "CHANNEL_POST", Status::Success, Some("p1")),
            mk(3, "worker-2", "TOOL_CALL", Status::InProgress, None),
            mk(4, "worker-1", "TOOL_CALL", Status::Success, Some("p2")),
            mk(5, "orchestrator", "CHANNEL_ARCHIVE", Status::Failed, Some("p1")),
        ];
        for e in &events {
            j.append(e).unwrap();
        }
        let seqs = |f: Filter| j.query(&f).unwrap().events.iter().map(seq_of).collect::<Vec<_>>();
        assert_eq!(seqs(Filter::default()), [0, 1, 2, 3, 4, 5]);
        assert_eq!(seqs(Filter { agent: Some("worker-1".into()), ..Filter::default() }), [1, 2, 4]);
        assert_eq!(
            seqs(Filter { action_type: Some("TOOL_CALL".into()), ..Filter::default() }),
            [1, 3, 4]
        );
        assert_eq!(seqs(Filter { status: Some(Status::Failed), ..Filter::default() }), [1, 5]);
        assert_eq!(
            seqs(Filter { correlation_id: Some("p1".into()), ..Filter::default() }),
            [0, 1, 2, 5]
        );
        // Timestamps: 0,1 → 20th; 2,3 → 21st; 4,5 → 22nd.
        assert_eq!(
            seqs(Filter { since: Some("2026-11-21".into()), ..Filter::default() }),
            [2, 3, 4, 5]
        );
        assert_eq!(seqs(Filter { until: Some("2026-11-21".into()), ..Filter::default() }), [0, 1]);
        assert_eq!(
            seqs(Filter {
                since: Some("2026-11-21T21:00:00.000Z".into()),
                until: Some("2026-11-22".into()),
                ..Filter::default()
            }),
            [2, 3]
        );
        assert_eq!(seqs(Filter { limit: Some(2), ..Filter::default() }), [4, 5]);
        assert_eq!(seqs(Filter { limit: Some(0), ..Filter::default() }), Vec::<usize>::new());
        assert_eq!(
            seqs(Filter {
                agent: Some("worker-1".into()),
                action_type: Some("TOOL_CALL".into()),
                limit: Some(1),
                ..Filter::default()
            }),
            [4]
        );
        assert_eq!(
            seqs(Filter { agent: Some("nobody".into()), ..Filter::default() }),
            Vec::<usize>::new()
        );
    }

    /// Checks what concurrent writers left: exactly `writers * per_writer` valid lines, unique
    /// ids, each writer's events in the order it appended them.
    fn check_concurrent_result(j: &Journal, writers: usize, per_writer: usize) {
        let lines = raw_lines(j);
        assert_eq!(lines.len(), writers * per_writer);
        let mut ids = HashSet::new();
        let mut next = vec![0usize; writers];
        for line in &lines {
            let e = validate_line(line)
                .unwrap_or_else(|err| panic!("interleaved line {line:?}: {err}"));
            assert!(ids.insert(e.id.clone()), "duplicate id {}", e.id);
            let w: usize = e.agent.strip_prefix("writer-").unwrap().parse().unwrap();
            assert_eq!(seq_of(&e), next[w], "writer {w} out of order");
            next[w] += 1;
        }
        assert_eq!(next, vec![per_writer; writers]);
        let read = j.read_last(writers * per_writer + 10).unwrap();
        assert_eq!(read.events.len(), writers * per_writer);
        assert!(read.skipped.is_empty());
    }

    #[test]
    fn concurrent_writer_threads_with_separate_handles_never_interleave_across_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let (writers, per_writer) = (4, 500);
        std::thread::scope(|s| {
            for w in 0..writers {
                let path = dir.path();
                s.spawn(move || {
                    // Its own handle: its own lock descriptor, so flock(2) is what excludes.
                    let j = journal(path, 200_000);
                    for i in 0..per_writer {
                        j.append(&seq_event(&format!("writer-{w}"), i)).unwrap();
                    }
                });
            }
        });
        let j = journal(dir.path(), 200_000);
        assert!(j.rotated_path(1).exists(), "the test should cross a rotation");
        check_concurrent_result(&j, writers, per_writer);
    }

    #[test]
    fn concurrent_threads_sharing_one_handle_never_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        std::thread::scope(|s| {
            for w in 0..4 {
                let j = &j;
                s.spawn(move || {
                    for i in 0..250 {
                        j.append(&seq_event(&format!("writer-{w}"), i)).unwrap();
                    }
                });
            }
        });
        check_concurrent_result(&j, 4, 250);
    }

    /// Set in child processes of the multi-process test: `<dir>|<writer>|<count>`.
    const CHILD_ENV: &str = "FLOCK_JOURNAL_TEST_WRITER";

    /// Not a test on its own: the body of one writer process (a no-op without [`CHILD_ENV`]).
    #[test]
    fn concurrent_writer_child() {
        let Ok(spec) = std::env::var(CHILD_ENV) else { return };
        let parts: Vec<&str> = spec.split('|').collect();
        let (dir, w, count) = (Path::new(parts[0]), parts[1], parts[2].parse::<usize>().unwrap());
        let j = journal(dir, DEFAULT_MAX_BYTES);
        // Start together, so the writers really contend for the lock.
        let go = dir.join("go");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !go.exists() {
            assert!(std::time::Instant::now() < deadline, "parent never said go");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for i in 0..count {
            j.append(&seq_event(&format!("writer-{w}"), i)).unwrap();
        }
    }

    #[test]
    fn concurrent_writer_processes_never_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let exe = std::env::current_exe().unwrap();
        let (writers, per_writer) = (4, 500);
        let children: Vec<_> = (0..writers)
            .map(|w| {
                std::process::Command::new(&exe)
                    .args([
                        "--exact",
                        "journal::tests::concurrent_writer_child",
                        "--test-threads=1",
                    ])
                    .env(CHILD_ENV, format!("{}|{w}|{per_writer}", dir.path().display()))
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::fs::write(dir.path().join("go"), b"").unwrap();
        for mut child in children {
            assert!(child.wait().unwrap().success(), "a writer process failed");
        }
        let j = journal(dir.path(), DEFAULT_MAX_BYTES);
        check_concurrent_result(&j, writers, per_writer);
    }

    #[test]
    fn status_parses_case_insensitively_and_displays_in_schema_spelling() {
        assert_eq!("in_progress".parse::<Status>(), Ok(Status::InProgress));
        assert_eq!("FAILED".parse::<Status>(), Ok(Status::Failed));
        assert!("done".parse::<Status>().unwrap_err().contains("SUCCESS, FAILED, IN_PROGRESS"));
        assert_eq!(Status::InProgress.to_string(), "IN_PROGRESS");
        assert!(is_timestamp_prefix("2026-11-21T21"));
        assert!(!is_timestamp_prefix("21/11/2026"));
    }
}
