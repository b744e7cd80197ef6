//! The strict check of one line against the shared-journal schema: every problem at once, each
//! saying what is wrong and how to fix it.

use serde_json::{Map, Value};

use crate::event::{Action, JournalEvent, Outcome, Status, Trace};

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

pub(crate) fn check_timestamp(s: &str) -> Result<(), String> {
    if s.len() != TIMESTAMP_TEMPLATE.len() || !is_timestamp_prefix(s) {
        return Err("wrong shape".to_string());
    }
    let n = |r: std::ops::Range<usize>| digits(&s[r]).unwrap_or(0);
    check_date_time(n(0..4), n(5..7), n(8..10), n(11..13), n(14..16), n(17..19))
}

pub(crate) fn check_id(s: &str) -> Result<(), String> {
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
