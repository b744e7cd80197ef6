//! Chains of turns (issue #8): everything one outside input sets off is one chain, charged per
//! hop and per model token and stopped by the router at its budget — however the agents behave.
//! The person who started it is told, in their DM; `flockctl send --wait` says how it ended; the
//! journal tells the chain's story under its correlation id; `ps` counts stopped chains.

use flock_testkit::Swarm;
use flock_testkit::fake_llm::{FAKE_TOKENS_IN, FAKE_TOKENS_OUT, FakeLlm, FakeProvider, Reply};

use crate::{LONG, SHORT};

/// `flockctl send AGENT TEXT --wait --json` (exit code, parsed outcome).
fn send_wait(swarm: &Swarm, agent: &str, text: &str) -> (Option<i32>, serde_json::Value) {
    let out = swarm.ctl(&["send", agent, text, "--wait", "--json", "--timeout", "120"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "send --wait --json printed no JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
}

fn chains_row(swarm: &Swarm) -> serde_json::Value {
    swarm.ps().into_iter().find(|r| r["name"] == "chains").expect("a chains row in ps")
}

#[test]
fn two_agents_handing_work_back_and_forth_are_stopped_at_the_hop_budget_and_the_person_is_told() {
    // Each hands the task to the other: with nothing to stop it, this would run forever.
    let yaml = r#"swarm: { name: pingpong }
budget: { max_hops: 6 }
models:
  to-b:
    provider: scripted
    rules:
      - steps: [ { tool: agents__delegate, args: { to: b, task: "{input}" } } ]
        reply: "handed to b"
  to-a:
    provider: scripted
    rules:
      - steps: [ { tool: agents__delegate, args: { to: a, task: "{input}" } } ]
        reply: "handed to a"
agents:
  - { name: a, role: worker, model: to-b }
  - { name: b, role: worker, model: to-a }
"#;
    let swarm = Swarm::start(yaml);
    let (code, end) = send_wait(&swarm, "a", "settle this between you");
    assert_eq!(code, Some(3), "exit 3: stopped by a budget: {end}");
    assert_eq!(end["outcome"], "stopped", "{end}");
    let text = end["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("[stopped]") && text.contains("hop budget of 6"), "{text}");
    assert!(text.contains("a delegated to b"), "the notice says what was done: {text}");
    assert_eq!(end["channel"], "dm-a--human-operator", "{end}");

    // The person is told once, in their DM; nothing ran past the budget.
    let dm = swarm.ctl_ok(&["read", "dm-a--human-operator", "--json"]);
    assert_eq!(dm.matches("[stopped]").count(), 1, "{dm}");
    swarm.wait_until(
        || swarm.agent("a")["state"] == "ready" && swarm.agent("b")["state"] == "ready",
        SHORT,
        "both agents idle",
    );
    let turns = swarm.turns_total("a") + swarm.turns_total("b");
    assert!(turns <= 6, "{turns} turns for a budget of 6 hops");
    let row = chains_row(&swarm);
    assert_eq!(row["state"], "0 in flight, 1 stopped by budget", "{row}");

    // The journal tells the story: every hand-over, and the stop, under the chain's id.
    let chain = end["chain"].as_str().unwrap();
    let story = swarm.ctl_ok(&["journal", "query", &format!("corr={chain}"), "--json"]);
    assert!(story.matches("\"type\":\"DELEGATE\"").count() >= 4, "{story}");
    assert_eq!(story.matches("\"type\":\"CHAIN_STOPPED\"").count(), 1, "{story}");
    assert!(story.contains("\"parent_id\""), "hops name the message that caused them: {story}");
}

#[test]
fn a_token_budget_stops_a_model_that_never_stops_calling_tools() {
    // A model that answers every call with another tool call.
    let fake = FakeLlm::start(FakeProvider::OpenAi);
    fake.always(Reply::ToolCall { name: "agents__list".into(), arguments: "{}".into() });
    let per_call = FAKE_TOKENS_IN + FAKE_TOKENS_OUT;
    let yaml = format!(
        r#"swarm: {{ name: tokens }}
budget: {{ max_tokens: {} }}
models:
  busy: {{ provider: openai, base_url: "{}", model: m, retry_base_ms: 10 }}
agents:
  - {{ name: busy, role: worker, model: busy }}
"#,
        per_call * 4,
        fake.base_url()
    );
    let swarm = Swarm::start(&yaml);
    let (code, end) = send_wait(&swarm, "busy", "list everyone, forever");
    assert_eq!(code, Some(3), "{end}");
    let text = end["text"].as_str().unwrap_or_default();
    assert!(text.contains(&format!("budget of {} model tokens", per_call * 4)), "{text}");
    // The fifth call crossed the budget; at most one more was already on its way.
    let calls = fake.request_count();
    assert!((5..=6).contains(&calls), "{calls} model calls");
    swarm.wait_until(|| swarm.agent("busy")["state"] == "ready", SHORT, "the turn was cancelled");
    assert_eq!(fake.request_count(), calls, "no model call after the stop");
    assert!(swarm.ctl_ok(&["read", "dm-busy--human-operator"]).contains("[stopped]"));
}

#[test]
fn a_chain_past_its_time_budget_is_cancelled_and_a_waiting_send_says_why() {
    let yaml = r#"swarm: { name: slow }
budget: { max_wall_secs: 2 }
models:
  slow:
    provider: scripted
    rules:
      - steps: [ { delay_ms: 20000 } ]
        reply: "finally"
agents:
  - { name: slow, role: worker, model: slow }
"#;
    let swarm = Swarm::start(yaml);
    let started = std::time::Instant::now();
    let (code, end) = send_wait(&swarm, "slow", "take your time");
    assert_eq!(code, Some(3), "{end}");
    assert!(end["text"].as_str().unwrap_or_default().contains("2 s time budget"), "{end}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "{:?}", started.elapsed());
    // The turn was cancelled, not left running: the agent is free for the next input.
    swarm.wait_until(|| swarm.agent("slow")["state"] == "ready", SHORT, "the turn was cancelled");
    assert!(swarm.log("slow").contains("cancelled"), "{}", swarm.log("slow"));
    assert_eq!(end["channel"], "dm-human-operator--slow", "DM ids sort their two members");
    let dm = swarm.ctl_ok(&["read", "dm-human-operator--slow"]);
    assert!(dm.contains("[stopped]") && !dm.contains("finally"), "{dm}");
}

#[test]
fn a_plain_answer_reaches_the_person_once_and_send_wait_prints_it() {
    let yaml = format!(
        "swarm: {{ name: answer }}\nmodels:\n{}agents:\n  - {{ name: helper, role: worker, model: m }}\n",
        crate::answer_model("m", "the answer to {input} is 42")
    );
    let swarm = Swarm::start(&yaml);
    let out = swarm.ctl(&["send", "helper", "six times seven", "--wait"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "the answer to six times seven is 42");
    let dm = swarm.ctl_ok(&["read", "dm-helper--human-operator"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("dm-helper--human-operator"));
    assert_eq!(dm.matches("is 42").count(), 1, "{dm}");
    // A second request is a second chain with its own answer.
    let (code, end) = send_wait(&swarm, "helper", "again");
    assert_eq!((code, end["outcome"].as_str()), (Some(0), Some("answered")), "{end}");
    assert_eq!(end["hops"], 1, "{end}");
    swarm.wait_until(
        || chains_row(&swarm)["state"] == "0 in flight, 0 stopped by budget",
        LONG,
        "both chains ended",
    );
}

#[test]
fn an_answer_that_answers_another_request_is_asked_again_without_the_history() {
    // A small model copies an earlier answer from its history into the next request's answer
    // (measured: the week plan given for the picnic, the Go plan and the move). The runtime asks
    // once more without the history; an answer that is still not one stays out of the session.
    let fake = FakeLlm::start(FakeProvider::OpenAi);
    let yaml = format!(
        r#"swarm: {{ name: copies }}
models:
  m: {{ provider: openai, base_url: "{}", model: m, retry_base_ms: 10 }}
agents:
  - {{ name: helper, role: worker, model: m }}
"#,
        fake.base_url()
    );
    let swarm = Swarm::start(&yaml);
    let week = "Monday: give the Rust meetup talk. Wednesday: give the PyCon talk. Friday: ship \
                the v3 release.";
    fake.push_text(week);
    let (_, end) = send_wait(
        &swarm,
        "helper",
        "Plan my week: two talks (the Rust meetup and PyCon) and the v3 release. Give each item a day.",
    );
    assert_eq!(end["text"], week, "{end}");

    let picnic = "Picnic checklist: sandwiches, lemonade, a blanket.";
    fake.push_text(week);
    fake.push_text(picnic);
    let (_, end) = send_wait(
        &swarm,
        "helper",
        "Make a short checklist for a picnic with sandwiches, lemonade and a blanket.",
    );
    assert_eq!(end["text"], picnic, "{end}");
    let asked = fake.requests();
    let (copied, again) = (&asked[asked.len() - 2], &asked[asked.len() - 1]);
    assert!(
        copied.raw_body.contains("Wednesday: give the PyCon talk"),
        "the first try had the history"
    );
    assert!(copied.body["tools"].as_array().is_some_and(|t| !t.is_empty()), "and the tools");
    assert!(
        !again.raw_body.contains("Wednesday: give the PyCon") && again.raw_body.contains("picnic"),
        "the second try has the request and not the history: {}",
        again.raw_body
    );
    assert!(again.body["tools"].as_array().is_none_or(|t| t.is_empty()), "nor the tools");

    // Asked again, the model still only says the request: the person gets what it said, and the
    // exchange is not kept for the next turn to copy.
    let haiku = "Write a haiku about the sea at night, with the moon and a lighthouse in it.";
    fake.push_text(haiku);
    fake.push_text(haiku);
    send_wait(&swarm, "helper", haiku);
    fake.push_text("You are welcome.");
    let (_, end) = send_wait(&swarm, "helper", "thanks");
    assert_eq!(end["text"], "You are welcome.", "{end}");
    let last = fake.requests().last().unwrap().raw_body.clone();
    assert!(last.contains(picnic), "the picnic exchange is in the session: {last}");
    assert!(!last.contains("lighthouse"), "the echoed exchange is not: {last}");
    assert!(swarm.log("helper").contains("left out of the session"), "{}", swarm.log("helper"));
}

#[test]
fn a_coordinator_that_routes_every_request_hands_it_over_without_asking_its_model() {
    // The coordinator's model would answer everything itself (a small model's habit); with
    // `delegate: always` the runtime hands each request to the worker instead, and the worker's
    // answer comes back as it is. Without it (the control, same models) the model answers.
    let swarm_yaml = |delegate: &str| {
        format!(
            r#"swarm: {{ name: router }}
models:
  coord:
    provider: scripted
    rules:
      - reply: "the coordinator's own answer"
  work:
    provider: scripted
    rules:
      - reply: "the worker did: {{input}}"
agents:
  - {{ name: coordinator, role: coordinator, model: coord, can_call: [worker]{delegate} }}
  - {{ name: worker, role: worker, model: work }}
"#
        )
    };
    let swarm = Swarm::start(&swarm_yaml(", delegate: always"));
    for ask in ["what is 2 + 2?", "Hello! Just say hi back."] {
        let (code, end) = send_wait(&swarm, "coordinator", ask);
        assert_eq!(code, Some(0), "{end}");
        let text = end["text"].as_str().unwrap_or_default();
        assert!(text.contains("the worker did:") && text.contains(ask), "{end}");
        assert!(end["hops"].as_u64().unwrap_or(0) >= 2, "coordinator → worker: {end}");
    }
    assert_eq!(swarm.turns_total("worker"), 2, "one worker turn per request");
    let story = swarm.ctl_ok(&["journal", "query", "agent=coordinator type=DELEGATE", "--json"]);
    assert_eq!(story.matches("\"type\":\"DELEGATE\"").count(), 2, "{story}");
    drop(swarm);

    let control = Swarm::start(&swarm_yaml(""));
    let (_, end) = send_wait(&control, "coordinator", "what is 2 + 2?");
    assert_eq!(end["text"], "the coordinator's own answer", "{end}");
}
