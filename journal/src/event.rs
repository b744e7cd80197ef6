//! One journal event: its parts, its builder, and the timestamps and ids it carries.

use std::str::FromStr;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::schema::check_timestamp;

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
