//! `flockctl journal read|query|log`: the text in and out of the journal (DESIGN.md §9). Each
//! function takes an open [`Journal`] and returns what the command prints; argument parsing
//! stays in the binary, the journal itself in `flock_actors::journal`.

use anyhow::{Context, Result, bail};
use flock_journal::{
    Filter, Journal, JournalEvent, ReadOutcome, Status, event_id_for, is_timestamp_prefix,
    now_timestamp, validate_value,
};
use serde_json::Value;

/// Query keys, in the order the error message lists them.
const QUERY_KEYS: &str = "agent, type, status, since, until, corr, limit";
const QUERY_EXAMPLE: &str =
    "agent=worker-1 type=TOOL_CALL status=FAILED since=2026-11-21 corr=p1 limit=20";

/// `flockctl journal read --last N [--json]`: the newest `last` events, oldest first.
///
/// Human format: one line per event, `timestamp agent status action.type: result.message
/// [correlation_id]` (newlines in the message shown as `\n`), then one `# skipped` line per
/// damaged line met. `--json`: a JSON array of the events, one per line, nothing else.
pub fn read(journal: &Journal, last: usize, json: bool) -> Result<String> {
    let out = journal.read_last(last).context("read the journal")?;
    Ok(render(&out, json))
}

/// `flockctl journal query EXPR [--json]`: the events matching `expr`, oldest first, in the
/// same formats as [`read`]. See [`parse_query`] for the language.
pub fn query(journal: &Journal, expr: &str, json: bool) -> Result<String> {
    let filter = parse_query(expr)?;
    let out = journal.query(&filter).context("query the journal")?;
    Ok(render(&out, json))
}

/// `flockctl journal log JSON`: checks one event against the schema and appends it; returns
/// its id and a newline.
///
/// `id` and `timestamp` may be left out: `timestamp` is then set to now and `id` to a fresh
/// `evt_…` id for the event's timestamp. Every other required field must be given, and nothing
/// outside the schema is accepted. The JSON may span several lines; it is stored as one.
pub fn log(journal: &Journal, json_text: &str) -> Result<String> {
    let mut value: Value = serde_json::from_str(json_text).map_err(|e| {
        anyhow::anyhow!(
            "the event is not valid JSON ({e}); pass one JSON object, e.g. \
             '{{\"agent\":\"human:ana\",\"status\":\"SUCCESS\",\"action\":{{\"type\":\"NOTE\",\
             \"params\":{{}}}},\"result\":{{\"message\":\"hello\"}}}}'"
        )
    })?;
    if let Value::Object(obj) = &mut value {
        if !obj.contains_key("timestamp") {
            obj.insert("timestamp".into(), Value::String(now_timestamp()));
        }
        if !obj.contains_key("id") {
            let ts = obj.get("timestamp").and_then(Value::as_str).unwrap_or_default();
            obj.insert("id".into(), Value::String(event_id_for(ts)));
        }
    }
    let event = validate_value(&value)
        .map_err(|why| anyhow::anyhow!("the event does not match the journal schema: {why}"))?;
    // A person writes as a person: entries of agents and of the supervisor come from them
    // (under the identity of their connection), never from this command.
    let author = event.agent.as_str();
    if author.strip_prefix("human:").is_none_or(|name| name.trim().is_empty()) {
        bail!(
            "`agent` is `{author}`: a person's journal entries are written as `human:<your name>` \
             (e.g. \"agent\":\"human:ana\"); only agents and the supervisor write under their own names"
        );
    }
    journal.append(&event).context("append to the journal")?;
    Ok(format!("{}\n", event.id))
}

/// Parses a query: space-separated `key=value` terms, all of which must match.
///
/// - `agent=NAME` — exact agent id (`worker-1`, `human:ana`, `system`)
/// - `type=ACTION_TYPE` — action type, case-insensitive (`tool_call` means `TOOL_CALL`)
/// - `status=SUCCESS|FAILED|IN_PROGRESS` — case-insensitive
/// - `since=TS` — at or after TS; `until=TS` — strictly before TS. TS is a timestamp or a prefix
///   of one: `2026-11-21`, `2026-11-21T21:00`, `2026-11-21T21:00:00.007Z`
/// - `corr=ID` — `trace.correlation_id`
/// - `limit=N` — only the newest N matches
///
/// An empty query matches everything. Each key may appear once.
pub fn parse_query(expr: &str) -> Result<Filter> {
    let mut filter = Filter::default();
    let mut seen: Vec<&str> = Vec::new();
    for term in expr.split_whitespace() {
        let Some((key, value)) = term.split_once('=') else {
            bail!(
                "query term `{term}` is not key=value; known keys: {QUERY_KEYS} \
                 (e.g. `{QUERY_EXAMPLE}`)"
            );
        };
        if value.is_empty() {
            bail!("query term `{term}` has no value; write {key}=VALUE");
        }
        if seen.contains(&key) {
            bail!("query key `{key}` is given twice; each key may appear once");
        }
        match key {
            "agent" => filter.agent = Some(value.to_string()),
            "type" => filter.action_type = Some(value.to_ascii_uppercase()),
            "status" => {
                filter.status = Some(value.parse::<Status>().map_err(|e| anyhow::anyhow!(e))?);
            }
            "since" | "until" => {
                if !is_timestamp_prefix(value) {
                    bail!(
                        "`{key}={value}` is not a UTC timestamp or a prefix of one; write e.g. \
                         {key}=2026-11-21, {key}=2026-11-21T21:00 or \
                         {key}=2026-11-21T21:00:00.007Z"
                    );
                }
                let bound = Some(value.to_string());
                if key == "since" { filter.since = bound } else { filter.until = bound }
            }
            "corr" => filter.correlation_id = Some(value.to_string()),
            "limit" => match value.parse::<usize>() {
                Ok(n) if n > 0 => filter.limit = Some(n),
                _ => bail!("`limit={value}` must be a positive whole number, e.g. limit=20"),
            },
            _ => bail!(
                "unknown query key `{key}`; known keys: {QUERY_KEYS} (e.g. `{QUERY_EXAMPLE}`)"
            ),
        }
        seen.push(key);
    }
    Ok(filter)
}

fn render(out: &ReadOutcome, json: bool) -> String {
    if json {
        return json_array(&out.events);
    }
    let mut text = String::new();
    for e in &out.events {
        text.push_str(&human_line(e));
        text.push('\n');
    }
    for s in &out.skipped {
        text.push_str(&format!(
            "# skipped a damaged line at {} byte {}: {}\n",
            s.file.display(),
            s.offset,
            s.reason
        ));
    }
    text
}

/// `timestamp agent status action.type: result.message [corr]`.
fn human_line(e: &JournalEvent) -> String {
    let message = e.result.message.replace('\r', "\\r").replace('\n', "\\n");
    let mut line =
        format!("{} {} {} {}: {}", e.timestamp, e.agent, e.status, e.action.kind, message);
    if let Some(corr) = &e.trace.correlation_id {
        line.push_str(&format!(" [{corr}]"));
    }
    line
}

/// A JSON array with one event per line (valid JSON, and still greppable).
fn json_array(events: &[JournalEvent]) -> String {
    if events.is_empty() {
        return "[]\n".to_string();
    }
    let lines: Vec<String> = events.iter().map(JournalEvent::to_line).collect();
    format!("[\n{}\n]\n", lines.join(",\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_journal::{DEFAULT_MAX_BYTES, validate_line};
    use std::io::Write;

    fn open(dir: &std::path::Path) -> Journal {
        Journal::open(dir, DEFAULT_MAX_BYTES).unwrap()
    }

    fn at(mut e: JournalEvent, ts: &str) -> JournalEvent {
        e.timestamp = ts.to_string();
        e.id = event_id_for(ts);
        e
    }

    fn sample(j: &Journal) -> Vec<JournalEvent> {
        let events = vec![
            at(
                JournalEvent::new("orchestrator", "CHANNEL_CREATE", Status::Success, "created #p")
                    .correlation("p1"),
                "2026-11-20T10:00:00.000Z",
            ),
            at(
                JournalEvent::new("worker-1", "TOOL_CALL", Status::Failed, "line one\nline two"),
                "2026-11-21T10:00:00.000Z",
            ),
            at(
                JournalEvent::new("worker-1", "CHANNEL_POST", Status::Success, "hi")
                    .correlation("p1"),
                "2026-11-22T10:00:00.000Z",
            ),
        ];
        for e in &events {
            j.append(e).unwrap();
        }
        events
    }

    #[test]
    fn read_prints_one_human_line_per_event_with_correlation() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        assert_eq!(read(&j, 10, false).unwrap(), "");
        sample(&j);
        let text = read(&j, 2, false).unwrap();
        assert_eq!(
            text,
            "2026-11-21T10:00:00.000Z worker-1 FAILED TOOL_CALL: line one\\nline two\n\
             2026-11-22T10:00:00.000Z worker-1 SUCCESS CHANNEL_POST: hi [p1]\n"
        );
    }

    #[test]
    fn read_reports_a_torn_last_line_after_the_events() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        sample(&j);
        let mut f = std::fs::OpenOptions::new().append(true).open(j.current_path()).unwrap();
        f.write_all(b"{\"id\":\"evt_2026").unwrap();
        drop(f);
        let text = read(&j, 10, false).unwrap();
        assert_eq!(text.lines().count(), 4, "{text}");
        let last = text.lines().last().unwrap();
        assert!(
            last.starts_with("# skipped a damaged line at ") && last.contains("torn"),
            "{last}"
        );
        // JSON output stays a plain array.
        let parsed: Value = serde_json::from_str(&read(&j, 10, true).unwrap()).unwrap();
        assert_eq!(parsed.as_array().unwrap().len(), 3);
    }

    #[test]
    fn read_json_is_an_array_of_schema_valid_events() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        assert_eq!(read(&j, 10, true).unwrap(), "[]\n");
        let events = sample(&j);
        let text = read(&j, 10, true).unwrap();
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let items = parsed.as_array().unwrap();
        assert_eq!(items.len(), 3);
        for (item, e) in items.iter().zip(&events) {
            assert_eq!(&validate_value(item).unwrap(), e);
        }
    }

    #[test]
    fn query_filters_by_each_key() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        sample(&j);
        let count = |expr: &str| query(&j, expr, false).unwrap().lines().count();
        assert_eq!(count(""), 3);
        assert_eq!(count("agent=worker-1"), 2);
        assert_eq!(count("type=tool_call"), 1);
        assert_eq!(count("status=success"), 2);
        assert_eq!(count("since=2026-11-21"), 2);
        assert_eq!(count("until=2026-11-21T10:00:00.000Z"), 1);
        assert_eq!(count("corr=p1"), 2);
        assert_eq!(count("corr=p1  agent=worker-1"), 1);
        assert_eq!(count("limit=1"), 1);
        let newest = query(&j, "limit=1", true).unwrap();
        assert!(newest.contains("CHANNEL_POST"), "limit keeps the newest: {newest}");
    }

    #[test]
    fn parse_query_builds_the_filter() {
        let f = parse_query(
            "agent=human:ana type=channel_post status=IN_PROGRESS since=2026-11-21T21 \
             until=2026-11-22 corr=p-1 limit=5",
        )
        .unwrap();
        assert_eq!(
            f,
            Filter {
                agent: Some("human:ana".into()),
                action_type: Some("CHANNEL_POST".into()),
                status: Some(Status::InProgress),
                since: Some("2026-11-21T21".into()),
                until: Some("2026-11-22".into()),
                correlation_id: Some("p-1".into()),
                limit: Some(5),
            }
        );
        assert_eq!(parse_query("  ").unwrap(), Filter::default());
    }

    #[test]
    fn parse_query_rejects_bad_terms_with_a_clear_error() {
        let err = |expr: &str| parse_query(expr).unwrap_err().to_string();
        let e = err("who=worker-1");
        assert!(e.contains("unknown query key `who`"), "{e}");
        assert!(e.contains("agent, type, status, since, until, corr, limit"), "{e}");
        assert!(err("worker-1").contains("not key=value"));
        assert!(err("agent=").contains("has no value"));
        assert!(err("agent=a agent=b").contains("given twice"));
        assert!(err("status=done").contains("SUCCESS, FAILED, IN_PROGRESS"));
        assert!(err("since=yesterday").contains("not a UTC timestamp"));
        assert!(err("until=2026/11/21").contains("not a UTC timestamp"));
        assert!(err("limit=0").contains("positive whole number"));
        assert!(err("limit=x").contains("positive whole number"));
    }

    #[test]
    fn log_fills_id_and_timestamp_and_appends() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        let out = log(
            &j,
            r#"{
                "agent": "human:ana",
                "status": "SUCCESS",
                "action": {"type": "NOTE", "params": {}},
                "result": {"message": "hello"}
            }"#,
        )
        .unwrap();
        let id = out.trim_end();
        let text = std::fs::read_to_string(j.current_path()).unwrap();
        assert_eq!(text.lines().count(), 1, "stored as one line");
        let e = validate_line(text.trim_end()).unwrap();
        assert_eq!(e.id, id);
        assert_eq!(e.agent, "human:ana");
        assert_eq!(e.result.message, "hello");
    }

    #[test]
    fn log_keeps_a_given_id_and_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        let line = r#"{"id":"evt_20250903142510_f4a9b1c8","timestamp":"2025-09-03T14:25:10.591Z","agent":"human:claude","status":"SUCCESS","action":{"type":"FILE_CREATE","params":{"path":"server.js"}},"result":{"message":"created","artifacts":["server.js"]},"trace":{"correlation_id":"task_abc_123"}}"#;
        assert_eq!(log(&j, line).unwrap(), "evt_20250903142510_f4a9b1c8\n");
        let with_ts_only = r#"{"timestamp":"2025-09-03T14:25:11.000Z","agent":"human:claude","status":"FAILED","action":{"type":"CMD_RUN","params":{}},"result":{"message":"no"}}"#;
        let id = log(&j, with_ts_only).unwrap();
        assert!(id.starts_with("evt_20250903142511_"), "id follows the timestamp: {id}");
        assert_eq!(read(&j, 10, false).unwrap().lines().count(), 2);
    }

    #[test]
    fn a_person_cannot_log_as_an_agent_or_the_supervisor() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        for author in ["worker-1", "flock-supervisor", "system", "human:", "human: ", "operator"] {
            let line = format!(
                r#"{{"agent":"{author}","status":"SUCCESS","action":{{"type":"NOTE","params":{{}}}},"result":{{"message":"m"}}}}"#
            );
            let e = log(&j, &line).unwrap_err().to_string();
            assert!(e.contains("written as `human:<your name>`"), "{author}: {e}");
        }
        assert_eq!(read(&j, 10, false).unwrap(), "", "nothing was written");
    }

    #[test]
    fn log_rejects_an_invalid_event_with_the_reason_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let j = open(dir.path());
        let e = log(&j, "{agent: x}").unwrap_err().to_string();
        assert!(e.contains("not valid JSON") && e.contains("\"agent\""), "{e}");
        let e = log(&j, r#"{"agent":"a","status":"DONE","action":{"type":"NOTE","params":[]},"result":{"message":"m"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("journal schema"), "{e}");
        assert!(e.contains("`status`") && e.contains("`action.params`"), "{e}");
        let e = log(&j, "[]").unwrap_err().to_string();
        assert!(e.contains("must be a JSON object"), "{e}");
        let e = log(&j, r#"{"id":"x","agent":"a","status":"SUCCESS","action":{"type":"NOTE","params":{}},"result":{"message":"m"}}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`id`"), "{e}");
        assert_eq!(read(&j, 10, false).unwrap(), "");
    }
}
