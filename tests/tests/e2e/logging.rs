//! Structured logs (docs/observability.md): with `FLOCK_LOG_FORMAT=json` the supervisor and every
//! process it spawns write one JSON object per line, the per-agent log files included; a turn's
//! events carry the agent, the message id and the chain; and the API key is in no line.

use flock_testkit::Swarm;
use flock_testkit::fake_llm::{FakeLlm, FakeProvider};
use serde_json::Value;

use crate::{SHORT, answer_model};

/// The key the test harness puts in flock-supervisor's environment (testkit/src/swarm.rs).
const KEY: &str = "s3cr3t-must-not-leak";

/// Every line of `text` as a JSON object; panics with the line that is not one.
fn events(what: &str, text: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v @ Value::Object(_)) => v,
            _ => panic!("a line of {what} is not a JSON object: {l}\n---\n{text}"),
        })
        .collect()
}

/// A field of an event, at the top level or in one of the spans it is in.
fn field<'a>(event: &'a Value, name: &str) -> Option<&'a str> {
    let spans = event["spans"].as_array().into_iter().flatten();
    event[name].as_str().or_else(|| spans.filter_map(|s| s[name].as_str()).next())
}

#[test]
fn json_logs_are_one_object_per_line_with_the_turns_fields_and_no_secret() {
    let fake = FakeLlm::start(FakeProvider::OpenAi);
    fake.require_key(KEY);
    fake.push_tool_call("agents__send", r#"{"to": "notes", "text": "remember: login page"}"#);
    fake.push_text("I asked notes to remember it.");
    let yaml = format!(
        r#"swarm: {{ name: json-logs }}
models:
  real:
    provider: openai
    base_url: "{}"
    model: test-model
    api_key_env: FLOCK_TEST_SECRET
    retry_base_ms: 10
{}agents:
  - {{ name: thinker, role: worker, model: real }}
  - {{ name: notes, role: worker, model: m }}
"#,
        fake.base_url(),
        answer_model("m", "noted")
    );
    let swarm =
        Swarm::builder(&yaml).env("FLOCK_LOG_FORMAT", "json").env("RUST_LOG", "info").start();
    swarm.ctl_ok(&["send", "thinker", "please plan the login page"]);
    let done = |agent: &str| {
        events(agent, &swarm.log(agent)).into_iter().any(|e| {
            e["message"].as_str().is_some_and(|m| m.starts_with("turn ") && m.contains(" done in "))
        })
    };
    swarm.wait_until(|| done("thinker") && done("notes"), SHORT, "both turns logged as done");

    let supervisor = events("the supervisor's output", &swarm.supervisor_output());
    let thinker = events("thinker.log", &swarm.log("thinker"));
    let notes = events("notes.log", &swarm.log("notes"));
    for e in supervisor.iter().chain(&thinker).chain(&notes) {
        assert!(e["level"].is_string(), "no level: {e}");
        assert!(e["message"].is_string(), "no message: {e}");
        assert!(e["timestamp"].is_string(), "no timestamp: {e}");
    }
    assert!(
        supervisor.iter().any(|e| e["message"].as_str().is_some_and(|m| m.contains(" up: "))
            && e["swarm"] == "json-logs"),
        "the supervisor logs that the swarm is up, with its name as a field: {supervisor:?}"
    );

    // The turn of thinker: its start, its tool call and its end carry the agent, the message id
    // and the chain (the span of the turn); the model call carries its token counts.
    let turn: Vec<&Value> = thinker
        .iter()
        .filter(|e| {
            field(e, "agent") == Some("thinker")
                && field(e, "msg_id").is_some()
                && field(e, "chain").is_some()
        })
        .collect();
    assert!(
        turn.iter().any(|e| e["message"].as_str().is_some_and(|m| m.contains("from operator"))),
        "the turn's start has agent, msg_id and chain: {thinker:?}"
    );
    let tool = turn.iter().find(|e| e["span"]["tool"] == "agents__send");
    assert!(tool.is_some_and(|e| e["ok"] == true), "the tool call is in a `tool` span: {turn:?}");
    assert!(
        turn.iter().any(|e| e["tokens_in"].is_u64() && e["tokens_out"].is_u64()),
        "the model call has token counts: {turn:?}"
    );
    // The supervisor's own notes in an agent's log are JSON events too, with the agent's name.
    assert!(
        notes.iter().any(|e| e["stream"] == "flock" && e["agent"] == "notes"),
        "the supervisor's notes in notes.log: {notes:?}"
    );

    for text in [swarm.supervisor_output(), swarm.log("thinker"), swarm.log("notes")] {
        assert!(!text.contains(KEY), "the key leaked into a log:\n{text}");
    }
}

#[test]
fn text_logs_stay_readable_and_keep_their_phrases() {
    let yaml = format!(
        "swarm: {{ name: text-logs }}\nmodels:\n{}agents:\n  - {{ name: echo, role: worker, model: m }}\n",
        answer_model("m", "pong")
    );
    let swarm = Swarm::builder(&yaml).env("FLOCK_LOG_FORMAT", "text").start();
    swarm.ctl_ok(&["send", "echo", "ping"]);
    swarm.wait_for_log("echo", "reply \"pong\"", SHORT);
    let log = swarm.log("echo");
    let line = log.lines().find(|l| l.contains("from operator (message, attempt 1): \"ping\""));
    let line = line.unwrap_or_else(|| panic!("the turn's start:\n{log}"));
    assert!(line.contains(" INFO turn{agent=echo msg_id="), "level and span: {line}");
    assert!(!line.contains('\x1b') && !line.trim_start().starts_with('{'), "plain text: {line}");
    // One timestamp a line: the supervisor's, when it read the line (the agent writes none).
    let stamps = line.split_whitespace().filter(|w| w.starts_with("20") && w.contains('T')).count();
    assert_eq!(stamps, 1, "one timestamp: {line}");
    assert!(swarm.supervisor_output().contains("flock: swarm `text-logs` up: 1 agents started"));
}
