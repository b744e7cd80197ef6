//! The brain-persona flow (issue #3 item 7, issue #8), wired in code and run with scripted
//! models: every input enters the coordinator, which delegates it to the worker; the worker's
//! pipeline asks the unconscious and tells the observer; the worker's answer comes back to the
//! coordinator as a result, and the coordinator's answer reaches the person's DM by the runtime;
//! the observer writes observation files; at the threshold the runtime wakes reflection, which
//! writes its file and marks what it read; an idle coordinator wakes dream, which writes
//! knowledge. The person gets exactly one answer, even when the worker is killed mid-turn.

use std::path::Path;

use flock_testkit::Swarm;

use crate::{LONG, SHORT};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// All `*.md` files of a memory folder, concatenated.
fn folder(swarm: &Swarm, sub: &str) -> String {
    let dir = swarm.state_dir().join("memory").join(sub);
    let mut files: Vec<_> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => return String::new(),
    };
    files.sort();
    files.iter().filter(|p| p.extension().is_some_and(|e| e == "md")).map(|p| read(p)).collect()
}

const DM: &str = "dm-coordinator--human-operator";

/// `examples/brain-persona.yaml` after `edits` (text replacements), with its transcripts, in a
/// temp dir; `worker` replaces the worker's transcript if given.
fn persona(edits: &[(&str, &str)], worker: Option<&str>) -> Swarm {
    let root = flock_testkit::repo_root().join("examples");
    let mut yaml = read(&root.join("brain-persona.yaml"));
    for (from, to) in edits {
        assert!(yaml.contains(from), "the example no longer has {from:?}");
        yaml = yaml.replace(from, to);
    }
    let worker =
        worker.map_or_else(|| read(&root.join("transcripts/brain-worker.yaml")), str::to_owned);
    Swarm::builder(&yaml)
        .file(
            "transcripts/brain-coordinator.yaml",
            &read(&root.join("transcripts/brain-coordinator.yaml")),
        )
        .file("transcripts/brain-worker.yaml", &worker)
        .start()
}

#[test]
fn a_message_to_the_coordinator_runs_the_worker_writes_memory_and_answers_once_despite_kill9() {
    // The worker "thinks" long enough to be killed mid-turn, before its Ack.
    let worker = r#"rules:
  - steps:
      - delay_ms: 2500
    reply: "worker did: {input}"
"#;
    let swarm = persona(&[], Some(worker));
    let sent = swarm.ctl_ok(&["send", "coordinator", "plan my week"]);
    let chain = sent
        .split("chain ")
        .nth(1)
        .map(|s| s.chars().take_while(char::is_ascii_hexdigit).collect::<String>())
        .unwrap_or_default();
    assert_eq!(chain.len(), 32, "send names the chain: {sent}");
    swarm.wait_for_log("worker", "turn ", SHORT);
    swarm.wait_for_log("coordinator", "tool agents__delegate", SHORT);
    let pid = swarm.kill9("worker");
    swarm.wait_until(
        || swarm.pid_of("worker").is_some_and(|p| p != pid) && swarm.turns_total("worker") >= 1,
        LONG,
        "the worker restarted and finished the redelivered turn",
    );
    swarm.wait_until(
        || String::from_utf8_lossy(&swarm.ctl(&["read", DM]).stdout).contains("worker did: "),
        SHORT,
        "the coordinator passed the worker's answer on to the human",
    );
    // Exactly one answer, from the coordinator's turn on the worker's result. Wait until the
    // coordinator has nothing left to do (a duplicate would be in its mailbox).
    swarm.wait_until(
        || {
            let c = swarm.agent("coordinator");
            c["turns_total"].as_u64() >= Some(2) && c["mailbox_depth"] == 0 && c["state"] == "ready"
        },
        SHORT,
        "the coordinator has nothing left to do",
    );
    let answers = swarm.ctl_ok(&["read", DM]);
    // The hand-over said whose request it was; the worker's answer was passed on as it is.
    let relayed = "worker did: human:operator asks: plan my week";
    assert_eq!(answers.matches(relayed).count(), 1, "{answers}");
    assert_eq!(swarm.turns_total("coordinator"), 2, "input + result, nothing twice");

    // The journal tells the chain's whole story under its correlation id.
    let story = swarm.ctl_ok(&["journal", "query", &format!("corr={chain}"), "--json"]);
    for action in ["SEND", "DELEGATE", "REQUEST", "RESULT", "TURN", "ANSWER"] {
        assert!(story.contains(&format!("\"type\":\"{action}\"")), "{action} missing: {story}");
    }
    assert_eq!(story.matches("\"type\":\"ANSWER\"").count(), 1, "{story}");

    // The worker's pipeline asked the unconscious before its turn (both attempts) …
    let unconscious = swarm.log("unconscious");
    assert!(unconscious.contains("from worker (request"), "{unconscious}");
    // … and told the observer once (only the finished turn did).
    swarm.wait_until(
        || folder(&swarm, "observations").contains("Bren handled a request"),
        SHORT,
        "an observation",
    );
    let observations = folder(&swarm, "observations");
    assert_eq!(observations.matches("## ").count(), 1, "{observations}");
    assert!(observations.contains("[input] human:operator asks: plan my week"), "{observations}");
    assert!(observations.contains("[tools] (none)"), "{observations}");
    let journal = folder(&swarm, "journals");
    assert_eq!(journal.lines().count(), 1, "{journal}");
    assert!(
        journal
            .contains(&format!("| human:operator asks: plan my week | tools: (none) | {relayed}")),
        "{journal}"
    );
    assert_eq!(swarm.turns_total("observer"), 1);
}

#[test]
fn observations_trigger_reflection_at_the_threshold_and_an_idle_coordinator_wakes_dream() {
    // Small numbers for a test: reflect at 3, idle after 3 s, and a slow unconscious whose
    // answer the worker stops waiting for after 300 ms.
    let swarm = persona(
        &[
            (
                "    model: observer-script\n",
                "    model: observer-script\n    extensions: [message_window, {memory_files: {reflect_after: 3}}]\n",
            ),
            (
                "    model: coordinator-script\n",
                "    model: coordinator-script\n    extensions: [{idle_monitor: {after_secs: 3, notify: [dream]}}]\n",
            ),
            (
                "      - reply: \"no relevant memory yet for: {input}\"",
                "      - steps: [{ delay_ms: 1000 }]\n        reply: \"remembered: {input}\"",
            ),
            // A slow model behind the unconscious (not its recall, which answers at once).
            (
                "    model: unconscious-script\n",
                "    model: unconscious-script\n    extensions: [message_window]\n",
            ),
            (
                "    model: worker-script\n",
                "    model: worker-script\n    extensions: [context_injector, {worker_lifecycle: {timeout_ms: 300}}]\n",
            ),
        ],
        None,
    );
    for task in ["one", "two", "three"] {
        swarm.ctl_ok(&["send", "coordinator", task]);
    }
    swarm.wait_until(|| swarm.turns_total("worker") == 3, LONG, "three worker turns");
    let worker = swarm.log("worker");
    // Fail open: the router timed the request out at 300 ms and the turns went on without it.
    assert_eq!(worker.matches("unconscious did not answer").count(), 3, "{worker}");
    assert!(worker.contains("within 300 ms") && worker.contains("going on without it"), "{worker}");

    // The third observation crosses the threshold: reflection runs, writes, marks all three.
    swarm.wait_until(
        || folder(&swarm, "observations").matches("<!-- reflected: ").count() == 3,
        LONG,
        "three observations marked reflected",
    );
    let reflections = folder(&swarm, "reflections");
    assert!(reflections.starts_with("## Reflection - "), "{reflections}");
    assert!(reflections.contains("### Patterns"), "{reflections}");
    assert!(swarm.log("reflection").contains("[reflect] 3 unreflected observations"));
    // Reflection is upkeep: a chain of its own, not charged to the request whose observation
    // crossed the threshold (whose chain the observer's turn is in).
    let chains = |log: String| -> Vec<String> {
        log.match_indices(" chain=")
            .map(|(i, _)| log[i + 7..].chars().take_while(char::is_ascii_hexdigit).collect())
            .collect()
    };
    let (reflection, observer) = (chains(swarm.log("reflection")), chains(swarm.log("observer")));
    assert!(!reflection.is_empty() && !observer.is_empty(), "{reflection:?} {observer:?}");
    assert!(reflection.iter().all(|c| !observer.contains(c)), "{reflection:?} in {observer:?}");

    // Nobody talks to the coordinator now: its idle timer wakes dream, with no incoming turn.
    let knowledge = swarm.state_dir().join("memory/knowledge/work-habits.md");
    swarm.wait_until(|| knowledge.exists(), LONG, "dream wrote knowledge");
    let text = read(&knowledge);
    assert!(text.starts_with("# Work Habits\n") && text.contains("Last updated: "), "{text}");
    assert!(swarm.log("dream").contains("[idle_detected]"));
}

#[test]
fn a_reflection_over_its_budget_is_sent_back_once_and_the_shorter_one_is_written() {
    // Reflection's model first restates every observation at length (as a small model does);
    // asked again within the budget, it condenses.
    let restated = "          - Bren handled the request one and reported back to the coordinator, \
                    who answered the operator in the direct message as it always does.\n          \
                    - Bren handled the request two and reported back to the coordinator, who \
                    answered the operator in the direct message as it always does.\n";
    let swarm = persona(
        &[
            (
                "    model: observer-script\n",
                "    model: observer-script\n    extensions: [message_window, {memory_files: {reflect_after: 2}}]\n",
            ),
            (
                "  reflection-script:\n    provider: scripted\n    rules:\n",
                "  reflection-script:\n    provider: scripted\n    rules:\n      - match: \"Write it again\"\n        reply: \"### Patterns\\n- Requests reach Bren through the coordinator.\\n### Summary\\nTwo requests.\"\n",
            ),
            (
                "          - Bren is asked for plans and answers through the coordinator.\n",
                restated,
            ),
        ],
        None,
    );
    for task in ["one", "two"] {
        swarm.ctl_ok(&["send", "coordinator", task]);
    }
    swarm.wait_until(
        || folder(&swarm, "observations").matches("<!-- reflected: ").count() == 2,
        LONG,
        "two observations marked reflected",
    );
    let reflections = folder(&swarm, "reflections");
    assert!(
        reflections.contains("- Requests reach Bren through the coordinator."),
        "{reflections}"
    );
    assert!(
        !reflections.contains("Bren handled the request"),
        "the draft is not written: {reflections}"
    );
    // The marks are written before the tool answers; reflection logs what it did after that.
    swarm.wait_for_log("reflection", "observations marked reflected", LONG);
    let log = swarm.log("reflection");
    assert_eq!(log.matches("the answer was sent back once").count(), 1, "{log}");
    assert!(log.contains("characters; the budget is "), "{log}");
    assert!(log.contains("sent back once), 2 observations marked reflected"), "{log}");
}

/// A backlog larger than one reflection reads (reflection was down, or memory was brought in)
/// is reflected on batch after batch, without waiting for new observations, and stops once what
/// is left is under the threshold (the observer's next `[reflect]` takes it).
#[test]
fn a_backlog_is_reflected_on_batch_after_batch_without_new_observations() {
    let swarm = persona(&[], None);
    // 90 observations of 172 characters: a batch takes those whose lines fit 2 000 estimated
    // tokens ((172 + 28) / 4 = 50 each: 40), the threshold is 1 500 (172 / 4 = 43 each: 35).
    // So: 40 reflected, 50 left (over it) → again, 40 more; 10 left (under it) → done.
    let mut text = String::new();
    for i in 0..90 {
        let words = format!(
            "Observation {i:02}: the billing service closed invoice batch {i} of the quarterly run \
             and the worker checked its totals against the ledger export before the nightly close"
        );
        let line: String = format!("{words:.<172}").chars().take(172).collect();
        text += &format!(
            "## 09:{:02}\n{line}\n<!-- id: backlog-{i:02} -->\n<!-- priority: medium; category: state -->\n---\n\n",
            i % 60
        );
    }
    let dir = swarm.state_dir().join("memory").join("observations");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("2026-11-20.md"), text).unwrap();
    swarm.ctl_ok(&["send", "reflection", "[reflect] 90 unreflected observations"]);
    let reflected = || folder(&swarm, "observations").matches("<!-- reflected: ").count();
    swarm.wait_until(|| reflected() == 80, LONG, "two batches of 40 reflected");
    // Reflection logs what it did after the marks are written.
    let batches = || swarm.log("reflection").matches("40 observations marked reflected").count();
    swarm.wait_until(|| batches() == 2, SHORT, "reflection logged both batches");
    let log = swarm.log("reflection");
    assert_eq!(log.matches("(the rest of a backlog) → reflection").count(), 1, "{log}");
    assert_eq!(folder(&swarm, "reflections").matches("### Patterns").count(), 2);
}

#[test]
fn a_fact_from_one_conversation_reaches_the_worker_in_a_later_one_through_the_memory_index() {
    // The unconscious's recall embeds on the CPU within its 10 s: it takes its turn with the tests
    // that run llama.cpp (whose threads spin on both cores) rather than compete with them.
    let _cpu = crate::local_model::one_model_at_a_time();
    // The swarm's own masking rule (memory.mask) on top of the built-in ones.
    let rule = "memory:\n  mask:\n    - { name: locker, pattern: \"LOCKER-[0-9]{4}\" }\nagents:";
    let swarm = persona(&[("\nagents:", &format!("\n{rule}"))], None);
    // A secret said in passing is masked before the observation is written.
    let key = "sk-proj-abcdefghijklmnopqrstuvwxyz012345";
    swarm.ctl_ok(&[
        "send",
        "coordinator",
        &format!(
            "remember that the dentist appointment is Friday at 15:00, key {key}, LOCKER-4711"
        ),
    ]);
    swarm.wait_until(
        || folder(&swarm, "observations").contains("dentist appointment is Friday"),
        LONG,
        "the observer wrote the fact down",
    );
    let observations = folder(&swarm, "observations");
    assert!(
        !observations.contains(key) && observations.contains("[masked:api_key]"),
        "{observations}"
    );
    assert!(
        !observations.contains("LOCKER-4711") && observations.contains("[masked:locker]"),
        "{observations}"
    );

    // A later conversation about it: the unconscious finds the observation in the index and the
    // worker's turn starts with it as context.
    swarm.ctl_ok(&["send", "coordinator", "when is the dentist?"]);
    swarm.wait_for_log("worker", "[unconscious_context] - 20", LONG);
    let worker = swarm.log("worker");
    let context = worker
        .lines()
        .find(|l| l.contains("[unconscious_context]") && l.contains("dentist"))
        .unwrap_or_else(|| panic!("no context with the fact:\n{worker}"));
    assert!(context.contains("Friday at 15:00"), "{context}");
    assert!(swarm.log("unconscious").contains("recalled"), "{}", swarm.log("unconscious"));

    // Active memory (what the supervisor keeps for every worker turn) holds it as well.
    let active = read(&swarm.state_dir().join("memory/active_memory.md"));
    assert!(active.contains("Friday at 15:00") && !active.contains(key), "{active}");
    assert!(active.starts_with("# Active memory\n\n> Last updated: "), "{active}");
    assert!(active.contains("\n> Tokens: ~") && active.contains("\n> Records: "), "{active}");

    // flockctl finds it too, and a rebuild from the files gives the same first answer.
    let found = swarm.ctl_ok(&["memory", "search", "dentist appointment", "--json"]);
    let hits: serde_json::Value = serde_json::from_str(&found).unwrap();
    let first = hits[0]["id"].as_str().expect("a hit").to_owned();
    assert!(hits[0]["text"].as_str().unwrap_or("").contains("Friday at 15:00"), "{found}");
    let rebuilt = swarm.ctl_ok(&["memory", "rebuild"]);
    assert!(rebuilt.contains("rebuilt the memory index"), "{rebuilt}");
    let again = swarm.ctl_ok(&["memory", "search", "dentist appointment", "--json"]);
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again[0]["id"].as_str(), Some(first.as_str()));
    // Whose work it was: the observer's note is about the worker's turn (the router says who
    // sent the summary) and the journal line is the worker's own, so a search for the worker
    // finds them and one for another agent finds nothing.
    let theirs =
        swarm.ctl_ok(&["memory", "search", "dentist appointment", "--agent", "worker", "--json"]);
    let theirs: serde_json::Value = serde_json::from_str(&theirs).unwrap();
    let theirs = theirs.as_array().cloned().unwrap_or_default();
    assert!(!theirs.is_empty() && theirs.iter().all(|h| h["agent"] == "worker"), "{theirs:?}");
    assert!(theirs.iter().any(|h| h["kind"] == "observation"), "{theirs:?}");
    let none = swarm.ctl_ok(&["memory", "search", "dentist appointment", "--agent", "dream"]);
    assert!(none.contains("nothing in memory matches") && none.contains("`dream`"), "{none}");
    let shown = swarm.ctl_ok(&["memory", "show", &first]);
    assert!(shown.starts_with(&first) && shown.contains("Friday at 15:00"), "{shown}");
    let stats = swarm.ctl_ok(&["memory", "stats", "--json"]);
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    assert!(stats["kinds"]["observation"].as_u64() >= Some(1), "{stats}");
    // How far search by meaning has come: the searches above embedded the newest texts.
    let (texts, embedded) = (stats["texts"].as_u64(), stats["embedded"].as_u64());
    assert!(embedded >= Some(1) && embedded <= texts, "{stats}");
    let said = swarm.ctl_ok(&["memory", "stats"]);
    assert!(said.contains("by meaning: ") && said.contains("texts embedded"), "{said}");
}

/// Memory works for a chat the same as for a DM (issue #21): a fact a person gave in a channel
/// the coordinator answers (here by `flockctl post`, as a chat bridge posts) is observed, and a
/// later question in that channel reaches the worker with it as context; the answers go back
/// to the channel, one per question.
#[test]
fn a_fact_given_in_a_channel_is_recalled_for_a_later_question_there() {
    // The unconscious's recall embeds on the CPU within its 10 s: it takes its turn with the tests
    // that run llama.cpp (whose threads spin on both cores) rather than compete with them.
    let _cpu = crate::local_model::one_model_at_a_time();
    let swarm = persona(&[], None);
    swarm.ctl_ok(&["channel", "create", "team", "--members", "coordinator", "--as", "alice"]);
    swarm.ctl_ok(&[
        "post",
        "#team",
        "remember that the dentist appointment is Friday at 15:00",
        "--as",
        "alice",
    ]);
    swarm.wait_until(
        || folder(&swarm, "observations").contains("dentist appointment is Friday"),
        LONG,
        "the observer wrote the fact down",
    );
    swarm.ctl_ok(&["post", "#team", "when is the dentist?", "--as", "alice"]);
    swarm.wait_for_log("worker", "[unconscious_context] - 20", LONG);
    let worker = swarm.log("worker");
    let context = worker
        .lines()
        .find(|l| l.contains("[unconscious_context]") && l.contains("dentist"))
        .unwrap_or_else(|| panic!("no context with the fact:\n{worker}"));
    assert!(context.contains("Friday at 15:00"), "{context}");
    // Two questions, two answers by the coordinator in #team.
    swarm.wait_until(
        || {
            let posts = swarm.ctl_ok(&["read", "#team", "--json"]);
            posts.lines().filter(|l| l.contains("\"author\":\"coordinator\"")).count() == 2
        },
        LONG,
        "both answers are in #team",
    );
}
