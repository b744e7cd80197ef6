//! Real model providers behind the supervisor's LLM gateway, against local fake servers that
//! speak the real OpenAI and Anthropic wire formats: tool calls run, answers come back, tokens are
//! counted, and the API key never leaves the supervisor (not in frames to agents, logs, the
//! journal, `ps`, or an agent's environment).

use flock_testkit::Swarm;
use flock_testkit::fake_llm::{FAKE_TOKENS_IN, FAKE_TOKENS_OUT, FakeLlm, FakeProvider};

use crate::{SHORT, answer_model};

/// The key the test harness puts in flock-supervisor's environment (testkit/src/swarm.rs).
const KEY: &str = "s3cr3t-must-not-leak";

fn run(provider: FakeProvider, kind: &str) {
    let fake = FakeLlm::start(provider);
    fake.require_key(KEY);
    fake.push_tool_call("agents__send", r#"{"to": "notes", "text": "remember: login page"}"#);
    fake.push_text("I asked notes to remember it.");
    let yaml = format!(
        r#"swarm: {{ name: llm-{kind} }}
models:
  real:
    provider: {kind}
    base_url: "{}"
    model: test-model
    api_key_env: FLOCK_TEST_SECRET
    retry_base_ms: 10
{}agents:
  - {{ name: thinker, role: worker, archetype: qa, model: real }}
  - {{ name: notes, role: worker, model: m }}
"#,
        fake.base_url(),
        answer_model("m", "noted")
    );
    let swarm = Swarm::start(&yaml);
    swarm.ctl_ok(&["send", "thinker", "please plan the login page"]);
    swarm.wait_for_log("thinker", "reply \"I asked notes to remember it.\"", SHORT);
    swarm.wait_for_log("notes", "remember: login page", SHORT);

    // What reached the provider: the key in its header, the system message with the runtime
    // catalog, the human-priority rule, the tools, the user input.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2, "one call for the tool, one for the answer");
    let first = &requests[0];
    let auth = first.header("authorization").or(first.header("x-api-key")).unwrap_or_default();
    assert!(auth.contains(KEY));
    let body = first.raw_body.clone();
    assert!(body.contains("[runtime_catalog]") && body.contains("notes (worker)"), "{body}");
    assert!(body.contains("human:") && body.contains("please plan the login page"), "{body}");
    assert!(body.contains("agents__send") && body.contains("flock_channel_post"), "{body}");
    assert!(requests[1].raw_body.contains("delivered to notes"), "the tool result went back");

    // Tokens are counted per agent.
    let row = swarm.agent("thinker");
    assert_eq!(row["tokens_in"], 2 * FAKE_TOKENS_IN, "{row}");
    assert_eq!(row["tokens_out"], 2 * FAKE_TOKENS_OUT, "{row}");

    // The key is nowhere an agent or a user could read it.
    let pid = swarm.pid_of("thinker").unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    assert!(!String::from_utf8_lossy(&environ).contains(KEY), "the key is in the agent's env");
    for text in [
        swarm.log("thinker"),
        swarm.log("notes"),
        swarm.supervisor_output(),
        swarm.ctl_ok(&["ps", "--json"]),
        swarm.ctl_ok(&["journal", "read", "--last", "100", "--json"]),
        swarm.ctl_ok(&["session", "show", "thinker", "--channel", "", "--json"]),
    ] {
        assert!(!text.contains(KEY), "the key leaked:\n{text}");
    }
}

#[test]
fn an_openai_compatible_model_runs_tool_calls_through_the_gateway_and_the_key_stays_put() {
    run(FakeProvider::OpenAi, "openai");
}

#[test]
fn an_anthropic_model_runs_tool_calls_through_the_gateway_and_the_key_stays_put() {
    run(FakeProvider::Anthropic, "anthropic");
}

#[test]
fn a_missing_key_stops_up_with_the_variable_to_set() {
    let yaml = r#"swarm: { name: nokey }
models:
  real: { provider: anthropic, model: x, api_key_env: FLOCK_NO_SUCH_KEY }
agents:
  - { name: a, role: worker, model: real }
"#;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("swarm.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut up = std::process::Command::new(flock_testkit::bin("flock-supervisor"));
    up.arg("up").arg(&file).arg("--state-dir").arg(dir.path().join("state"));
    let out = flock_testkit::run(&mut up, SHORT);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set FLOCK_NO_SUCH_KEY in the environment of flock-supervisor"), "{err}");
}
