//! Delivery semantics (DESIGN.md §5) with real processes: request round trips and their error
//! codes, redelivery after `kill -9` of an agent or of the supervisor, idempotent replays, and
//! dead letters.

use flock_testkit::{Swarm, alive, count_lines};

use crate::{LONG, SHORT, answer_model};

/// `caller` requests whatever agent its input names; `echo` answers.
fn caller_swarm() -> Swarm {
    let yaml = format!(
        r#"swarm:
  name: requests
delivery:
  request_timeout_ms: 5000
models:
  caller:
    provider: scripted
    rules:
      - steps:
          - tool: agents__request
            args: {{ to: "{{input}}", text: "ping" }}
        reply: "caller done with {{input}}"
{}agents:
  - {{ name: caller, role: worker, model: caller }}
  - {{ name: echo, role: worker, model: echo }}
"#,
        answer_model("echo", "pong from echo")
    );
    Swarm::start(&yaml)
}

#[test]
fn request_round_trip_returns_the_reply_and_unknown_agents_fail_with_agent_not_found() {
    let swarm = caller_swarm();

    swarm.ctl_ok(&["send", "caller", "echo"]);
    swarm.wait_for_log("caller", "reply \"caller done with echo\"", SHORT);
    let log = swarm.log("caller");
    assert!(
        log.contains(
            "tool agents__request {\"text\":\"ping\",\"to\":\"echo\"} → ok: \"pong from echo\""
        ),
        "{log}"
    );
    assert!(swarm.log("echo").contains("from caller (request, attempt 1): \"ping\""));

    // From an agent: the tool result carries the code; the turn still completes.
    swarm.ctl_ok(&["send", "caller", "ghost"]);
    swarm.wait_for_log("caller", "reply \"caller done with ghost\"", SHORT);
    let log = swarm.log("caller");
    assert!(
        log.contains("\"to\":\"ghost\"} → error: \"AGENT_NOT_FOUND: no agent named `ghost`"),
        "{log}"
    );

    // From the operator: flockctl fails with the code on stderr.
    let out = swarm.ctl(&["send", "ghost", "hello?"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("AGENT_NOT_FOUND"), "{stderr}");
    assert_eq!(swarm.turns_total("echo"), 1, "only the first request reached echo");
}

#[test]
fn request_cycle_is_refused_with_circular_call_and_the_caller_still_gets_a_reply() {
    let yaml = r#"swarm:
  name: ring
delivery:
  request_timeout_ms: 5000
models:
  ask-b:
    provider: scripted
    rules:
      - steps:
          - tool: agents__request
            args: { to: ring-b, text: "a asks b: {input}" }
        reply: "ring-a finished"
  ask-a:
    provider: scripted
    rules:
      - steps:
          - tool: agents__request
            args: { to: ring-a, text: "b asks a back" }
        reply: "ring-b answered"
agents:
  - { name: ring-a, role: worker, model: ask-b }
  - { name: ring-b, role: worker, model: ask-a }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "ring-a", "go"]);
    swarm.wait_for_log("ring-a", "reply \"ring-a finished\"", SHORT);

    let b = swarm.log("ring-b");
    assert!(b.contains("\"to\":\"ring-a\"} → error: \"CIRCULAR_CALL: "), "{b}");
    assert!(b.contains("ring-a@default → ring-b@default"), "the error names the chain: {b}");
    let a = swarm.log("ring-a");
    assert!(a.contains("\"to\":\"ring-b\"} → ok: \"ring-b answered\""), "{a}");
    // The refused request never reached ring-a: its only turn is the operator's.
    assert_eq!(count_lines(&a, &["turn ", " from ", "attempt"]), 1, "{a}");
    swarm.wait_until(|| swarm.turns_total("ring-b") == 1, SHORT, "ring-b's turn is counted");
    assert_eq!(swarm.turns_total("ring-a"), 1);
}

#[test]
fn request_past_its_deadline_times_out_and_cancels_the_callee_turn() {
    let yaml = r#"swarm:
  name: deadlines
models:
  impatient:
    provider: scripted
    rules:
      - steps:
          - tool: agents__request
            args: { to: slowpoke, text: "take your time", timeout_ms: 300 }
        reply: "impatient gave up"
  slow:
    provider: scripted
    rules:
      - steps:
          - delay_ms: 3000
        reply: "too late"
agents:
  - { name: impatient, role: worker, model: impatient }
  - { name: slowpoke, role: worker, model: slow }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "impatient", "go"]);
    swarm.wait_for_log("impatient", "reply \"impatient gave up\"", SHORT);
    let log = swarm.log("impatient");
    assert!(log.contains("→ error: \"TIMEOUT: `slowpoke` did not answer within 300 ms"), "{log}");

    swarm.wait_for_log("slowpoke", "cancelled: the caller's deadline passed", SHORT);
    // Cancelled means the turn stops: slowpoke is free again and never finishes it.
    swarm.wait_until(
        || {
            let row = swarm.agent("slowpoke");
            row["state"] == "ready" && row["mailbox_depth"] == 0
        },
        SHORT,
        "slowpoke is idle again",
    );
    let slow = swarm.log("slowpoke");
    assert!(!slow.contains("too late"), "the cancelled turn ran to its end:\n{slow}");
    assert_eq!(swarm.turns_total("slowpoke"), 0, "a cancelled turn is not a completed one");
}

const SLOW_THEN_SEND: &str = r#"# Think, then pass the result on: a kill during the delay interrupts the turn before the send.
rules:
  - steps:
      - delay_ms: 1500
      - tool: agents__send
        args: { to: sink, text: "result of {input}" }
    reply: "slow done: {input}"
"#;

const SEND_THEN_SLOW: &str = r#"# Pass the result on, then think: a kill during the delay interrupts the turn after the send.
rules:
  - steps:
      - tool: agents__send
        args: { to: sink, text: "result of {input}" }
      - delay_ms: 1500
    reply: "slow done: {input}"
"#;

fn slow_and_sink(transcript: &str) -> Swarm {
    let yaml = format!(
        "swarm:\n  name: redelivery\nmodels:\n  slow:\n    provider: scripted\n    transcript: \
         transcripts/slow.yaml\n{}agents:\n  - {{ name: slow, role: worker, model: slow }}\n  - \
         {{ name: sink, role: worker, model: sink }}\n",
        answer_model("sink", "sunk: {input}")
    );
    Swarm::builder(&yaml).file("transcripts/slow.yaml", transcript).start()
}

/// Kills `slow` while it is busy with attempt 1 of `job`; returns the killed pid.
fn kill_slow_mid_turn(swarm: &Swarm, job: &str, also: impl Fn() -> bool) -> u32 {
    swarm.wait_until(
        || {
            swarm.log("slow").contains(&format!("(message, attempt 1): \"{job}\""))
                && swarm.state_of("slow") == "busy"
                && also()
        },
        SHORT,
        "slow is busy with attempt 1",
    );
    swarm.kill9("slow")
}

/// After the redelivered turn: exactly one completed turn, exactly one message at the sink.
fn assert_completed_once(swarm: &Swarm, job: &str, killed: u32) {
    swarm.wait_for_log("slow", &format!("(message, attempt 2): \"{job}\""), SHORT);
    swarm.wait_for_log("slow", &format!("reply \"slow done: {job}\""), SHORT);
    swarm.wait_until(
        || {
            let slow = swarm.agent("slow");
            let sink = swarm.agent("sink");
            slow["turns_total"] == 1
                && slow["mailbox_depth"] == 0
                && sink["turns_total"] == 1
                && sink["mailbox_depth"] == 0
        },
        SHORT,
        "slow's turn and the sink's are both complete",
    );
    assert!(!alive(killed), "the killed agent (pid {killed}) is still alive");
    let slow = swarm.agent("slow");
    assert_eq!(slow["restarts"], 1, "{slow}");
    assert_eq!(slow["last_exit"], "signal SIGKILL", "{slow}");
    let log = swarm.log("slow");
    assert_eq!(
        count_lines(&log, &["done in", job]),
        1,
        "the turn completed more than once:\n{log}"
    );
    let sink = swarm.log("sink");
    assert_eq!(
        count_lines(&sink, &["turn ", "from slow", &format!("\"result of {job}\"")]),
        1,
        "the sink must get the message exactly once:\n{sink}"
    );
}

#[test]
fn sigkill_mid_turn_redelivers_message() {
    let swarm = slow_and_sink(SLOW_THEN_SEND);
    swarm.ctl_ok(&["send", "slow", "job-1"]);
    let killed = kill_slow_mid_turn(&swarm, "job-1", || true);
    assert_completed_once(&swarm, "job-1", killed);
}

#[test]
fn sigkill_after_a_send_replays_the_turn_without_sending_twice() {
    let swarm = slow_and_sink(SEND_THEN_SLOW);
    swarm.ctl_ok(&["send", "slow", "job-2"]);
    // Kill only once the sink has the message: the replayed turn sends it again, with the same
    // derived id, and the durable mailbox must drop it.
    let killed = kill_slow_mid_turn(&swarm, "job-2", || swarm.turns_total("sink") == 1);
    assert_completed_once(&swarm, "job-2", killed);
    let log = swarm.log("slow");
    assert_eq!(
        count_lines(&log, &["tool agents__send", "→ ok: \"delivered to sink's mailbox;"]),
        2,
        "both attempts sent (the second one as a duplicate):\n{log}"
    );
}

#[test]
fn supervisor_sigkill_then_up_delivers_pending_messages() {
    const N: usize = 20;
    let yaml = r#"swarm:
  name: crash-recovery
models:
  plodding:
    provider: scripted
    rules:
      - steps:
          - delay_ms: 100
        reply: "done: {input}"
agents:
  - { name: plodder, role: worker, model: plodding }
  - { name: idler, role: worker, model: plodding }
"#;
    let mut swarm = Swarm::start(yaml);
    let texts: Vec<String> = (0..N).map(|i| format!("msg-{i:02}")).collect();
    for t in &texts {
        swarm.ctl_ok(&["send", "plodder", t]);
    }
    let before = swarm.agent("plodder");
    let done_before = before["turns_total"].as_u64().unwrap();
    assert!(done_before < N as u64, "all {N} turns finished before the kill; nothing was tested");
    let agent_pids: Vec<u32> =
        swarm.agents().iter().filter_map(|a| a["pid"].as_u64()).map(|p| p as u32).collect();
    assert_eq!(agent_pids.len(), 2);

    swarm.kill9_supervisor();
    swarm.wait_until(
        // The pids `ps` shows are the processes the supervisor started (for a caged agent, its
        // stand-in); the agent itself dies an instant after, so every process of the swarm is
        // waited for.
        || agent_pids.iter().all(|p| !alive(*p)) && swarm.live_agent_pids().is_empty(),
        SHORT,
        "the agents die with their supervisor (PR_SET_PDEATHSIG)",
    );

    swarm.restart_supervisor();
    swarm.wait_until(
        || {
            let row = swarm.agent("plodder");
            row["turns_total"] == N && row["mailbox_depth"] == 0
        },
        LONG,
        "every accepted message is processed after the restart",
    );
    let log = swarm.log("plodder");
    let mut last = 0;
    for t in &texts {
        let done = format!("reply \"done: {t}\"");
        let at = log.find(&done).unwrap_or_else(|| panic!("{t} was lost:\n{log}"));
        assert!(at >= last, "{t} completed out of order:\n{log}");
        last = at;
    }
    assert_eq!(swarm.turns_total("idler"), 0);
}

#[test]
fn message_killed_on_every_delivery_is_dead_lettered_after_5_attempts() {
    let yaml = r#"swarm:
  name: dead-letters
supervision:
  max_restarts: 20
  backoff_initial_ms: 20
models:
  fragile:
    provider: scripted
    rules:
      - equals: poison
        steps:
          - delay_ms: 60000
        reply: "survived the poison"
      - reply: "fine: {input}"
agents:
  - { name: doomed, role: worker, model: fragile }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "doomed", "poison"]);
    swarm.ctl_ok(&["send", "doomed", "after"]);
    for attempt in 1..=5 {
        let line = format!("(message, attempt {attempt}): \"poison\"");
        swarm.wait_until(
            || swarm.log("doomed").contains(&line) && swarm.state_of("doomed") == "busy",
            SHORT,
            &format!("doomed is busy with attempt {attempt} of the poison"),
        );
        swarm.kill9("doomed");
    }

    // The message that was queued behind it is handled normally by the next incarnation.
    swarm.wait_for_log("doomed", "reply \"fine: after\"", SHORT);
    let out = swarm.ctl_ok(&["dead-letters", "--json"]);
    let letters: serde_json::Value =
        serde_json::from_str(&out).expect("dead-letters --json is JSON");
    let letters = letters.as_array().expect("an array");
    assert_eq!(letters.len(), 1, "{out}");
    let dl = &letters[0];
    assert_eq!(
        (dl["target"].as_str(), dl["sender"].as_str()),
        (Some("doomed"), Some("operator")),
        "{out}"
    );
    assert_eq!((dl["text"].as_str(), dl["attempts"].as_u64()), (Some("poison"), Some(5)), "{out}");
    assert!(dl["reason"].as_str().unwrap_or("").contains("5 failed deliveries"), "{out}");

    let log = swarm.log("doomed");
    assert!(!log.contains("attempt 6"), "a dead letter was delivered again:\n{log}");
    swarm.wait_until(
        || swarm.agent("doomed")["mailbox_depth"] == 0,
        SHORT,
        "doomed's mailbox is empty",
    );
    let row = swarm.agent("doomed");
    assert_eq!(
        (row["turns_total"].as_u64(), row["restarts"].as_u64()),
        (Some(1), Some(5)),
        "{row}"
    );
    assert_eq!(row["state"], "ready", "{row}");
    let human = swarm.ctl_ok(&["dead-letters"]);
    assert!(human.contains("operator → doomed (5 attempts"), "{human}");
}

#[test]
fn at_most_once_send_reaches_only_a_connected_agent_and_is_never_queued() {
    let yaml = format!(
        "swarm:\n  name: routed\nmodels:\n{}agents:\n  - {{ name: listener, role: worker, model: m }}\n",
        answer_model("m", "heard: {input}")
    );
    let swarm = Swarm::start(&yaml);

    let out = swarm.ctl_ok(&["send", "--at-most-once", "listener", "live"]);
    assert!(out.contains("routed to listener (at_most_once)"), "{out}");
    swarm.wait_for_log("listener", "reply \"heard: live\"", SHORT);
    swarm.wait_until(|| swarm.turns_total("listener") == 1, SHORT, "the routed turn is counted");

    // Down: refused at once, not kept for later.
    swarm.ctl_ok(&["stop", "listener"]);
    let out = swarm.ctl(&["send", "--at-most-once", "listener", "lost"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("TARGET_UNAVAILABLE"), "{stderr}");
    assert_eq!(swarm.agent("listener")["mailbox_depth"], 0);

    // A durable message sent after it is delivered on start; the routed one never is.
    swarm.ctl_ok(&["send", "listener", "kept"]);
    swarm.ctl_ok(&["start", "listener"]);
    swarm.wait_for_log("listener", "reply \"heard: kept\"", SHORT);
    swarm.wait_until(
        || swarm.agent("listener")["mailbox_depth"] == 0,
        SHORT,
        "the mailbox is empty",
    );
    assert!(!swarm.log("listener").contains("\"lost\""), "an at_most_once message was queued");
    assert_eq!(swarm.turns_total("listener"), 2);
}

#[test]
fn stop_mid_turn_requeues_the_message_without_counting_a_failed_delivery() {
    let yaml = r#"swarm:
  name: polite-stop
models:
  thinker:
    provider: scripted
    rules:
      - steps:
          - delay_ms: 1500
        reply: "thought about {input}"
agents:
  - { name: thinker, role: worker, model: thinker }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "thinker", "deep question"]);
    swarm.wait_until(
        || {
            swarm.log("thinker").contains("(message, attempt 1): \"deep question\"")
                && swarm.state_of("thinker") == "busy"
        },
        SHORT,
        "thinker is busy with the question",
    );
    swarm.ctl_ok(&["stop", "thinker"]);
    let row = swarm.agent("thinker");
    assert_eq!(
        (row["state"].as_str(), row["last_exit"].as_str()),
        (Some("stopped"), Some("code 0")),
        "{row}"
    );
    assert_eq!(
        (row["mailbox_depth"].as_u64(), row["turns_total"].as_u64()),
        (Some(1), Some(0)),
        "{row}"
    );

    swarm.ctl_ok(&["start", "thinker"]);
    swarm.wait_for_log("thinker", "reply \"thought about deep question\"", SHORT);
    let log = swarm.log("thinker");
    // Handed out again as a first attempt: a deliberate stop is not a failed delivery.
    assert_eq!(count_lines(&log, &["(message, attempt 1): \"deep question\""]), 2, "{log}");
    assert!(!log.contains("attempt 2"), "{log}");
    swarm.wait_until(|| swarm.turns_total("thinker") == 1, SHORT, "the turn is counted once");
}

#[test]
fn request_outlives_a_callee_killed_mid_turn_and_is_answered_by_its_next_incarnation() {
    let yaml = r#"swarm:
  name: patient
models:
  asker:
    provider: scripted
    rules:
      - steps:
          - tool: agents__request
            args: { to: callee, text: "work on {input}", timeout_ms: 20000 }
        reply: "asker finished {input}"
  worker:
    provider: scripted
    rules:
      - steps:
          - delay_ms: 1000
        reply: "callee answered {input}"
agents:
  - { name: asker, role: worker, model: asker }
  - { name: callee, role: worker, model: worker }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "asker", "x"]);
    swarm.wait_until(
        || {
            swarm.log("callee").contains("from asker (request, attempt 1): \"work on x\"")
                && swarm.state_of("callee") == "busy"
        },
        SHORT,
        "callee is busy with the request",
    );
    swarm.kill9("callee");
    swarm.wait_for_log("asker", "reply \"asker finished x\"", SHORT);
    let asker = swarm.log("asker");
    assert!(asker.contains("→ ok: \"callee answered work on x\""), "{asker}");
    let callee = swarm.log("callee");
    assert_eq!(count_lines(&callee, &["from asker (request", "\"work on x\""]), 2, "{callee}");
    assert_eq!(count_lines(&callee, &["done in", "callee answered work on x"]), 1, "{callee}");
    assert_eq!(swarm.agent("callee")["restarts"], 1);
}

/// The `(text, attempt)` of every turn `log` shows from `sender`, in the order they ran.
fn turns_from(log: &str, sender: &str) -> Vec<(String, u32)> {
    let head = format!("from {sender} (message, attempt ");
    log.lines()
        .filter_map(|line| {
            let rest = &line[line.find(&head)? + head.len()..];
            let (attempt, text) = rest.split_once("): \"")?;
            Some((text.split('"').next()?.to_owned(), attempt.parse().ok()?))
        })
        .collect()
}

/// A receiver with a delivery window holds the next messages while a turn runs; when that turn
/// fails, the ones it holds are handed back (`Rewind`) and come again after the retry, so the
/// mailbox keeps its order and each message runs one turn.
#[test]
fn a_failed_turn_in_a_delivery_window_is_retried_before_the_messages_behind_it() {
    use flock_testkit::fake_llm::{FakeLlm, FakeProvider, Reply};
    let fake = FakeLlm::start(FakeProvider::OpenAi);
    // m-1's first model call fails (401: not retried) once m-2…m-5 are with the agent.
    let refused =
        Reply::Error { status: 401, message: "invalid key (fake)".into(), retry_after: None };
    fake.push(Reply::Delayed(std::time::Duration::from_millis(1500), Box::new(refused)));
    fake.always(Reply::Text("done".into()));
    let sends: String = (1..=5)
        .map(|i| {
            format!(
                "          - tool: agents__send\n            args: {{ to: w, text: \"m-{i}\" }}\n"
            )
        })
        .collect();
    let yaml = format!(
        r#"swarm:
  name: window-rewind
delivery:
  window: 8
models:
  real:
    provider: openai
    base_url: "{}"
    model: test-model
    api_key_env: FLOCK_TEST_SECRET
  feeder:
    provider: scripted
    rules:
      - steps:
{sends}        reply: "fed"
agents:
  - {{ name: feeder, role: worker, model: feeder }}
  - {{ name: w, role: worker, model: real }}
"#,
        fake.base_url()
    );
    let swarm = Swarm::start(&yaml);
    swarm.ctl_ok(&["send", "feeder", "go"]);
    swarm.wait_until(
        || swarm.agent("w")["turns_total"] == 5 && swarm.agent("w")["mailbox_depth"] == 0,
        SHORT,
        "w has run a turn on each of the five messages",
    );
    let log = swarm.log("w");
    assert!(
        log.contains("4 held deliveries handed back"),
        "m-2…m-5 were handed over while m-1 ran, and back when it failed:\n{log}"
    );
    let expected: Vec<(String, u32)> =
        [("m-1", 1), ("m-1", 2), ("m-2", 1), ("m-3", 1), ("m-4", 1), ("m-5", 1)]
            .iter()
            .map(|(t, a)| (t.to_string(), *a))
            .collect();
    assert_eq!(turns_from(&log, "feeder"), expected, "{log}");
}

/// With a delivery window of 8, `kill -9` of the agent and then of the supervisor while 20
/// messages are worked through: every message is handled, in order, and its effect (a message
/// to `sink`) happens exactly once.
#[test]
fn a_delivery_window_loses_nothing_and_repeats_no_effect_through_kill_9_of_agent_and_supervisor() {
    const N: usize = 20;
    let yaml = format!(
        r#"swarm:
  name: window-crash
delivery:
  window: 8
models:
  plodding:
    provider: scripted
    rules:
      - steps:
          - delay_ms: 150
          - tool: agents__send
            args: {{ to: sink, text: "result of {{input}}" }}
        reply: "done: {{input}}"
{}agents:
  - {{ name: plodder, role: worker, model: plodding }}
  - {{ name: sink, role: worker, model: sink }}
"#,
        answer_model("sink", "sunk")
    );
    let mut swarm = Swarm::start(&yaml);
    let texts: Vec<String> = (0..N).map(|i| format!("msg-{i:02}")).collect();
    for t in &texts {
        swarm.ctl_ok(&["send", "plodder", t]);
    }
    swarm.wait_until(|| swarm.turns_total("plodder") >= 3, SHORT, "plodder ran 3 turns");
    let killed = swarm.kill9("plodder");
    swarm.wait_until(
        || swarm.turns_total("plodder") >= 8 && !alive(killed),
        LONG,
        "plodder is back and ran 8 turns",
    );
    let done_before = swarm.turns_total("plodder");
    assert!(done_before < N as u64, "all {N} turns finished before the kill; nothing was tested");
    swarm.kill9_supervisor();
    swarm.wait_until(|| swarm.live_agent_pids().is_empty(), SHORT, "the agents died with it");
    swarm.restart_supervisor();
    swarm.wait_until(
        || {
            let row = swarm.agent("plodder");
            row["turns_total"] == N
                && row["mailbox_depth"] == 0
                && swarm.turns_total("sink") == N as u64
        },
        LONG,
        "every accepted message is handled after the restarts",
    );
    let log = swarm.log("plodder");
    let mut last = 0;
    for t in &texts {
        let done = format!("reply \"done: {t}\"");
        let at = log.find(&done).unwrap_or_else(|| panic!("{t} was lost:\n{log}"));
        assert!(at >= last, "{t} was handled out of order:\n{log}");
        last = at;
    }
    let sink = swarm.log("sink");
    let got: Vec<String> = turns_from(&sink, "plodder").into_iter().map(|(t, _)| t).collect();
    let want: Vec<String> = texts.iter().map(|t| format!("result of {t}")).collect();
    assert_eq!(got, want, "the sink gets each result exactly once, in order:\n{sink}");
}
