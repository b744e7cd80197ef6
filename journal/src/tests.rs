use super::*;
use crate::schema::{check_id, check_timestamp};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::Write;

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
        ("id bad month", |v| v["id"] = json!("evt_20261321210000_1a2b3c4d"), &["`id`", "month 13"]),
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
    assert_eq!(journal(dir.path(), DEFAULT_MAX_BYTES).read_last(1).unwrap().events, events[9..]);
}

#[test]
fn append_rejects_an_invalid_event_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path(), DEFAULT_MAX_BYTES);
    let bad = JournalEvent::new("worker-1", "not upper", Status::Failed, "x");
    let err = j.append(&bad).expect_err("invalid action type");
    assert!(matches!(&err, JournalError::Invalid(m) if m.contains("UPPER_SNAKE_CASE")), "{err}");
    let huge = JournalEvent::new("worker-1", "BIG", Status::Success, "x".repeat(MAX_EVENT_BYTES));
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
        let e =
            validate_line(line).unwrap_or_else(|err| panic!("interleaved line {line:?}: {err}"));
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
                .args(["--exact", "tests::concurrent_writer_child", "--test-threads=1"])
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

#[test]
fn a_copied_journal_hands_over_each_line_it_wrote_and_nothing_it_refused() {
    let dir = tempfile::tempdir().unwrap();
    let j = journal(dir.path(), DEFAULT_MAX_BYTES);
    j.append(&seq_event("before", 0)).unwrap();
    let copied = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = copied.clone();
    j.copy_to(Box::new(move |lines| sink.lock().unwrap().extend_from_slice(lines)));
    j.append_all(&[seq_event("a", 1), seq_event("b", 2)]).unwrap();
    // An invalid event is refused whole: nothing written, nothing copied.
    let bad = JournalEvent::new("", "lower case", Status::Success, "x");
    assert!(j.append(&bad).is_err());
    let copied = copied.lock().unwrap().clone();
    let written = raw_lines(&j);
    assert_eq!(copied, written[1..], "the lines written after copy_to, as written");
    let seqs: Vec<usize> =
        copied.iter().map(|l| seq_of(&validate_line(l).expect("a valid event"))).collect();
    assert_eq!(seqs, [1, 2]);
}
