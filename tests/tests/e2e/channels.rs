//! Channels with real processes (DESIGN.md §8–9): the kick-off story of `examples/kickoff.yaml`
//! played by scripted agents and told by the journal; deltas reach agent members and never humans;
//! nothing is replayed after `kill -9` of the supervisor; a worker cannot create a channel.

use flock_testkit::{Swarm, count_lines, repo_root};
use serde_json::Value;

use crate::{LONG, SHORT};

/// The shipped example with delta delays set to 0 (the transcripts are the shipped ones, copied
/// beside the rewritten swarm file).
fn kickoff_swarm() -> Swarm {
    let examples = repo_root().join("examples");
    let text = std::fs::read_to_string(examples.join("kickoff.yaml")).expect("read kickoff.yaml");
    let mut replaced = 0;
    let yaml: String = text
        .lines()
        .map(|line| {
            let key = line.trim_start().split(':').next().unwrap_or_default();
            if matches!(key, "delta_delay_min_ms" | "delta_delay_max_ms") {
                replaced += 1;
                format!("  {key}: 0\n")
            } else {
                format!("{line}\n")
            }
        })
        .collect();
    assert_eq!(replaced, 2, "examples/kickoff.yaml no longer sets both delta delays:\n{text}");
    let mut builder = Swarm::builder(&yaml);
    let transcripts = std::fs::read_dir(examples.join("transcripts")).expect("list transcripts");
    for entry in transcripts.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("kickoff-") {
            let text = std::fs::read_to_string(entry.path()).expect("read a transcript");
            builder = builder.file(format!("transcripts/{name}"), &text);
        }
    }
    builder.start()
}

/// Every journal event, oldest first (`flockctl journal read --json`).
fn journal(swarm: &Swarm) -> Vec<Value> {
    let out = swarm.ctl_ok(&["journal", "read", "--last", "100000", "--json"]);
    match serde_json::from_str(&out) {
        Ok(Value::Array(events)) => events,
        other => panic!("journal read --json printed no array ({other:?}):\n{out}"),
    }
}

/// `flockctl journal query EXPR --json`.
fn journal_query(swarm: &Swarm, expr: &str) -> Vec<Value> {
    let out = swarm.ctl_ok(&["journal", "query", expr, "--json"]);
    match serde_json::from_str(&out) {
        Ok(Value::Array(events)) => events,
        other => panic!("journal query --json printed no array ({other:?}):\n{out}"),
    }
}

/// The row of `#id` in `flockctl channels --json`, if it exists.
fn channel(swarm: &Swarm, id: &str) -> Option<Value> {
    let out = swarm.ctl_ok(&["channels", "--json"]);
    let list: Value = serde_json::from_str(&out).expect("channels --json is JSON");
    list.as_array()?.iter().find(|c| c["channel"] == id).cloned()
}

/// The messages of `#id` (`flockctl read --json`: one JSON object per line).
fn messages(swarm: &Swarm, id: &str) -> Vec<Value> {
    swarm
        .ctl_ok(&["read", &format!("#{id}"), "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).expect("read --json prints JSON lines"))
        .collect()
}

/// Channel deltas `agent` has received from `#channel`, as logged turn lines.
fn deltas(swarm: &Swarm, agent: &str, channel: &str) -> Vec<String> {
    let needle = format!("from #{channel} (channel delta");
    swarm.log(agent).lines().filter(|l| l.contains(&needle)).map(str::to_owned).collect()
}

fn kind(e: &Value) -> &str {
    e["action"]["type"].as_str().unwrap_or_default()
}

fn arg<'a>(e: &'a Value, key: &str) -> &'a Value {
    &e["action"]["params"]["arguments"][key]
}

/// Index of the first event after `from` that `pred` accepts; panics with the journal if none.
fn find(events: &[Value], from: usize, what: &str, pred: impl Fn(&Value) -> bool) -> usize {
    match events.iter().skip(from).position(pred) {
        Some(i) => from + i,
        None => {
            let lines: Vec<String> = events.iter().map(Value::to_string).collect();
            panic!("the journal has no {what} after event {from}:\n{}", lines.join("\n"))
        }
    }
}

#[test]
fn kickoff_story_runs_from_one_human_post_to_an_archived_channel_and_the_journal_tells_it() {
    let swarm = kickoff_swarm();
    swarm.ctl_ok(&[
        "channel",
        "create",
        "lobby",
        "--topic",
        "Project requests",
        "--members",
        "orchestrator",
        "--as",
        "alice",
    ]);
    swarm.ctl_ok(&["post", "#lobby", "New project: a login page", "--as", "alice"]);

    // The only human action is behind us: the agents play the rest.
    swarm.wait_until(
        || !journal_query(&swarm, "type=CHANNEL_ARCHIVED").is_empty(),
        LONG,
        "a channel is archived",
    );

    // The channel: its topic, its members, archived.
    let ch = channel(&swarm, "project-login").expect("#project-login exists");
    assert_eq!(ch["state"], "archived", "{ch}");
    // The runtime wrote into the topic who asked where: the outcome goes back there.
    let topic = "Login page for the web app: plan, build, test (asked by alice in #lobby)";
    assert_eq!(ch["topic"], topic, "{ch}");
    assert_eq!(ch["members"], serde_json::json!(["orchestrator", "pm", "dev", "qa"]), "{ch}");

    // Its history: a kick-off mentioning a worker, one post by each worker in story order, the
    // archive notice last.
    let msgs = messages(&swarm, "project-login");
    let authors: Vec<&str> = msgs.iter().map(|m| m["author"].as_str().unwrap_or("?")).collect();
    assert_eq!(authors, ["orchestrator", "pm", "dev", "qa", "orchestrator"], "{msgs:?}");
    let kickoff = msgs[0]["text"].as_str().unwrap_or_default();
    assert!(kickoff.starts_with("Kick-off:") && kickoff.contains("@pm "), "{kickoff}");
    assert!(msgs[1]["text"].as_str().unwrap_or_default().starts_with("Plan:"), "{msgs:?}");
    assert!(msgs[3]["text"].as_str().unwrap_or_default().contains("QA sign-off:"), "{msgs:?}");
    assert!(msgs[4]["text"].as_str().unwrap_or_default().starts_with("[archive] "), "{msgs:?}");

    // Read-only now: a post is rejected with a clear error.
    let out = swarm.ctl(&["post", "#project-login", "one more thing", "--as", "alice"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "a post to an archived channel succeeded: {stderr}");
    assert!(stderr.contains("#project-login is archived and read-only"), "{stderr}");
    assert_eq!(messages(&swarm, "project-login").len(), 5, "the rejected post was stored");

    // The journal tells the story, in order.
    let events = journal(&swarm);
    let by = |agent: &'static str, ty: &'static str| {
        move |e: &Value| e["agent"] == agent && kind(e) == ty && e["status"] == "SUCCESS"
    };
    let request = find(&events, 0, "alice's request", |e| {
        by("human:alice", "FLOCK_CHANNEL_POST")(e) && arg(e, "text") == "New project: a login page"
    });
    let discover = find(&events, request, "the orchestrator's discover", |e| {
        by("orchestrator", "FLOCK_DISCOVER")(e)
    });
    let create = find(&events, discover, "the channel's creation", |e| {
        by("orchestrator", "FLOCK_CHANNEL_CREATE")(e) && arg(e, "channel") == "project-login"
    });
    assert_eq!(arg(&events[create], "topic"), topic);
    assert_eq!(arg(&events[create], "members"), &serde_json::json!(["pm", "dev", "qa"]));
    let post_in = |agent: &'static str| {
        move |e: &Value| by(agent, "FLOCK_CHANNEL_POST")(e) && arg(e, "channel") != "lobby"
    };
    let kick = find(&events, create, "the kick-off post", post_in("orchestrator"));
    assert!(arg(&events[kick], "text").as_str().unwrap_or_default().contains("@pm "));
    let plan = find(&events, kick, "pm's plan", post_in("pm"));
    let build = find(&events, plan, "dev's implementation note", post_in("dev"));
    let test = find(&events, build, "qa's test note", post_in("qa"));
    let start = find(&events, test, "the archive start", |e| {
        e["agent"] == "orchestrator"
            && kind(e) == "CHANNEL_ARCHIVE_START"
            && e["status"] == "IN_PROGRESS"
            && e["action"]["params"]["channel"] == "project-login"
    });
    let archived = find(&events, start, "CHANNEL_ARCHIVED", |e| {
        kind(e) == "CHANNEL_ARCHIVED" && e["action"]["params"]["channel"] == "project-login"
    });
    // One chain id tells the story: alice's post started it, and every step of the project
    // (tool calls, posts, the archive) is journaled under it.
    let send = find(&events, request, "alice's chain", |e| by("human:alice", "SEND")(e));
    let story = &events[send]["trace"]["correlation_id"];
    assert!(story.is_string(), "{}", events[send]);
    for (what, i) in
        [("discover", discover), ("create", create), ("kick-off", kick), ("plan", plan)]
            .into_iter()
            .chain([
                ("build", build),
                ("test", test),
                ("archive start", start),
                ("archived", archived),
            ])
    {
        assert_eq!(&events[i]["trace"]["correlation_id"], story, "{what}: {}", events[i]);
    }
    // Every worker answered the notice: what it learned to memory, its card, then ready. (The
    // router and the channels actor journal side by side: the order is the timestamps'.)
    for worker in ["pm", "dev", "qa"] {
        let at = |i: usize| events[i]["timestamp"].as_str().unwrap_or_default().to_owned();
        let memory =
            find(&events, start, &format!("{worker}'s memory"), by(worker, "MEMORY_WRITE"));
        let card =
            find(&events, start, &format!("{worker}'s card"), by(worker, "FLOCK_UPDATE_CARD"));
        let ready =
            find(&events, start, &format!("{worker}'s ready"), by(worker, "FLOCK_ARCHIVE_READY"));
        assert!(at(memory) <= at(card) && at(card) <= at(ready), "{worker}: memory, card, ready");
    }
    // The person hears the outcome where they asked, after their answer.
    let lobby = messages(&swarm, "lobby");
    let said: Vec<(&str, &str)> = lobby
        .iter()
        .map(|m| (m["author"].as_str().unwrap_or("?"), m["text"].as_str().unwrap_or("?")))
        .collect();
    assert_eq!(said.len(), 3, "{said:?}");
    assert_eq!(said[0], ("human:alice", "New project: a login page"));
    assert_eq!(said[1].0, "orchestrator");
    assert!(said[1].1.starts_with("On it: #project-login is open with pm, dev, qa."), "{said:?}");
    assert_eq!(said[2].0, "orchestrator");
    assert!(said[2].1.starts_with("Update: #project-login is done"), "{said:?}");
    assert!(said[2].1.contains("\nqa: Test note: 14 checks pass"), "{said:?}");
    let params = &events[archived]["action"]["params"];
    assert_eq!(params["not_ready"], serde_json::json!([]), "{}", events[archived]);
    for member in ["orchestrator", "pm", "dev", "qa"] {
        assert!(
            params["ready"].as_array().is_some_and(|r| r.iter().any(|m| m == member)),
            "{member} is not in the ready list: {}",
            events[archived]
        );
    }
    assert!(
        events[archived]["result"]["message"]
            .as_str()
            .is_some_and(|m| m.ends_with("every member is ready")),
        "{}",
        events[archived]
    );
    // Each worker said ready once, after the archive started; only the "ready" that completed
    // the archive may be journaled after CHANNEL_ARCHIVED (a call is journaled once it is done).
    let mut late = Vec::new();
    for worker in ["pm", "dev", "qa"] {
        let readies: Vec<usize> =
            (0..events.len()).filter(|i| by(worker, "FLOCK_ARCHIVE_READY")(&events[*i])).collect();
        assert_eq!(readies.len(), 1, "{worker} said ready {} times", readies.len());
        assert!(readies[0] > start, "{worker} was ready before the archive started");
        if readies[0] > archived {
            late.push(worker);
        }
    }
    assert!(late.len() <= 1, "archived before {late:?} were all ready");
    // The story has no failures but the rejected post.
    let failed: Vec<&Value> = events.iter().filter(|e| e["status"] == "FAILED").collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(kind(failed[0]), "FLOCK_CHANNEL_POST");
    assert_eq!(failed[0]["agent"], "human:alice");

    // The agents' side: every rule fired once, nobody looped, every session closed.
    let orch = swarm.log("orchestrator");
    assert_eq!(count_lines(&orch, &["reply \"On it: #project-login is open"]), 1, "{orch}");
    assert_eq!(count_lines(&orch, &["reply \"archiving #project-login\""]), 1, "{orch}");
    for worker in ["pm", "dev", "qa"] {
        let log = swarm.log(worker);
        assert_eq!(count_lines(&log, &["reply \"posted my part in #project-login\""]), 1, "{log}");
        let ready = "reply \"ready for the archive of #project-login\"";
        assert_eq!(count_lines(&log, &[ready]), 1, "{log}");
        assert_eq!(count_lines(&log, &["from #lobby"]), 0, "{worker} is not in #lobby: {log}");
        let received = deltas(&swarm, worker, "project-login");
        assert!((2..=5).contains(&received.len()), "{worker}: {received:#?}");
        swarm.wait_for_log(worker, "session #project-login closed", SHORT);
    }
    assert!(swarm.log("sysadmin").lines().all(|l| !l.contains(" turn ")), "the sysadmin slept");
}

/// `replier` answers "ping" in the channel; `listener` and `watcher` only read.
const ROOM: &str = r#"swarm:
  name: room
channels:
  delta_delay_min_ms: 0
  delta_delay_max_ms: 0
models:
  replier:
    provider: scripted
    rules:
      - match: "ping"
        steps:
          - tool: flock_channel_post
            args: { channel: "{from}", text: "pong from replier" }
        reply: "ponged"
      - reply: "noted"
  listener:
    provider: scripted
    rules:
      - reply: "noted"
agents:
  - { name: replier, role: worker, model: replier }
  - { name: listener, role: worker, model: listener }
  - { name: watcher, role: worker, model: listener }
"#;

#[test]
fn post_from_flockctl_wakes_the_agent_members_and_never_the_humans() {
    let swarm = Swarm::start(ROOM);
    swarm.ctl_ok(&[
        "channel",
        "create",
        "room",
        "--members",
        "replier,listener,human:carol",
        "--as",
        "bob",
    ]);
    let members = channel(&swarm, "room").expect("#room exists")["members"].clone();
    assert_eq!(
        members,
        serde_json::json!(["human:bob", "replier", "listener", "human:carol"]),
        "the human creator is a member"
    );
    swarm.ctl_ok(&["post", "#room", "ping", "--as", "bob"]);

    swarm.wait_for_log("listener", "[seq 2] replier: pong from replier", SHORT);
    swarm.wait_until(
        || {
            let (r, l) = (swarm.agent("replier"), swarm.agent("listener"));
            r["turns_total"] == 1
                && l["turns_total"] == 2
                && r["mailbox_depth"] == 0
                && l["mailbox_depth"] == 0
        },
        SHORT,
        "both members' turns are complete",
    );
    // Both agent members got bob's post as a delta with the channel's name and the message.
    let replier = deltas(&swarm, "replier", "room");
    assert_eq!(replier.len(), 1, "replier never gets its own post back: {replier:#?}");
    assert!(replier[0].contains("[seq 1] human:bob: ping"), "{}", replier[0]);
    assert!(
        replier[0].contains("(channel delta, attempt 1): \"[Channel: #room]"),
        "{}",
        replier[0]
    );
    let listener = deltas(&swarm, "listener", "room");
    assert_eq!(listener.len(), 2, "{listener:#?}");
    assert!(listener[0].contains("New messages: seq 1..1 (1)"), "{}", listener[0]);
    assert!(listener[1].contains("New messages: seq 2..2 (1)"), "{}", listener[1]);
    // Non-members, and the humans (author or not), get nothing: no turns, no delivery attempts.
    assert_eq!(swarm.turns_total("watcher"), 0);
    assert_eq!(count_lines(&swarm.log("watcher"), &[" turn "]), 0);
    let dead = swarm.ctl_ok(&["dead-letters", "--json"]);
    assert_eq!(dead.trim(), "[]", "a delivery failed: {dead}");
    let logs: Vec<String> = std::fs::read_dir(swarm.state_dir().join("logs"))
        .expect("the logs folder")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(logs.iter().all(|l| !l.contains("human")), "{logs:?}");
    assert_eq!(channel(&swarm, "room").expect("#room")["last_seq"], 2);
}

#[test]
fn supervisor_sigkill_then_up_replays_no_delivered_message() {
    let mut swarm = Swarm::start(ROOM);
    swarm.ctl_ok(&["channel", "create", "room", "--members", "listener,watcher", "--as", "bob"]);
    for text in ["first", "second"] {
        swarm.ctl_ok(&["post", "#room", text, "--as", "bob"]);
    }
    let third = swarm.ctl_ok(&["post", "#room", "third", "--as", "bob", "--json"]);
    let third: serde_json::Value = serde_json::from_str(&third).unwrap();
    assert_eq!((third["channel"].as_str(), third["seq"].as_u64()), (Some("room"), Some(3)));
    for agent in ["listener", "watcher"] {
        swarm.wait_for_log(agent, "[seq 3] human:bob: third", SHORT);
    }
    // Every delta is acknowledged: the router counted the turns (it reports each to the channels
    // actor as it counts it), and a channels call afterwards has waited for those cursor writes.
    swarm.wait_until(
        || {
            ["listener", "watcher"].iter().all(|a| {
                let row = swarm.agent(a);
                row["mailbox_depth"] == 0
                    && row["turns_total"].as_u64() == Some(deltas(&swarm, a, "room").len() as u64)
            })
        },
        SHORT,
        "every delta is acknowledged",
    );
    swarm.ctl_ok(&["channels"]);
    let before: Vec<(usize, usize)> = ["listener", "watcher"]
        .iter()
        .map(|a| (deltas(&swarm, a, "room").len(), swarm.log(a).len()))
        .collect();

    swarm.kill9_supervisor();
    swarm.restart_supervisor();
    swarm.ctl_ok(&["post", "#room", "fourth", "--as", "bob"]);

    for (agent, (count, log_len)) in ["listener", "watcher"].iter().zip(before) {
        swarm.wait_for_log(agent, "[seq 4] human:bob: fourth", SHORT);
        let after = deltas(&swarm, agent, "room");
        assert_eq!(after.len(), count + 1, "{agent} got an old message again: {after:#?}");
        let last = after.last().expect("a delta");
        assert!(last.contains("New messages: seq 4..4 (1)"), "{agent}: {last}");
        let since_restart = &swarm.log(agent)[log_len..];
        for old in ["[seq 1]", "[seq 2]", "[seq 3]"] {
            assert!(!since_restart.contains(old), "{agent} got {old} again:\n{since_restart}");
        }
    }
}

#[test]
fn worker_calling_flock_channel_create_is_forbidden_and_journaled() {
    let yaml = r#"swarm:
  name: roles
models:
  rogue:
    provider: scripted
    rules:
      - steps:
          # Claiming another identity in the arguments changes nothing.
          - tool: flock_channel_create
            args: { channel: rogue, members: [boss], agentId: boss, caller: boss, as: boss }
        reply: "tried to create #rogue"
  idle:
    provider: scripted
    rules:
      - reply: "noted"
agents:
  - { name: boss, role: orchestrator, model: idle }
  - { name: minion, role: worker, model: rogue }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "minion", "open a channel"]);
    swarm.wait_for_log("minion", "reply \"tried to create #rogue\"", SHORT);

    let log = swarm.log("minion");
    assert_eq!(
        count_lines(
            &log,
            &[
                "tool flock_channel_create ",
                "→ error: \"FORBIDDEN: `minion` is a worker and may not call flock_channel_create"
            ]
        ),
        1,
        "{log}"
    );
    assert!(channel(&swarm, "rogue").is_none(), "the forbidden channel exists");

    let failed = journal_query(&swarm, "agent=minion status=FAILED");
    assert_eq!(failed.len(), 1, "{failed:?}");
    let e = &failed[0];
    assert_eq!(kind(e), "FLOCK_CHANNEL_CREATE", "{e}");
    assert_eq!(e["action"]["params"]["forbidden"], true, "{e}");
    assert_eq!(arg(e, "channel"), "rogue", "{e}");
    assert!(e["result"]["message"].as_str().is_some_and(|m| m.starts_with("FORBIDDEN: ")), "{e}");
    assert!(journal_query(&swarm, "agent=boss").is_empty(), "the call was booked to boss");
}
