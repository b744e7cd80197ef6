//! Swarm management at run time: agents created with `flock_create_agent` are supervised
//! processes that survive a supervisor restart; decommissioned ones stop, leave their channels
//! and are not started again; only the orchestrator (and humans) may do either.

use serde_json::Value;

use flock_testkit::Swarm;

use crate::{SHORT, answer_model};

fn yaml() -> String {
    format!(
        r#"swarm: {{ name: managed }}
channels: {{ delta_delay_min_ms: 0, delta_delay_max_ms: 0 }}
models:
{}{}defaults: {{ model: m }}
agents:
  - {{ name: orchestrator, role: orchestrator }}
  - {{ name: dev, role: worker, model: creator }}
"#,
        answer_model("m", "done: {input}"),
        // A worker that tries to create an agent: it must be refused.
        "  creator:\n    provider: scripted\n    rules:\n      - steps:\n          - tool: flock_create_agent\n            args: { name: sneaky, role: worker }\n        reply: tried\n",
    )
}

#[test]
fn created_agents_are_supervised_survive_restarts_and_decommission_cleanly() {
    let mut swarm = Swarm::start(&yaml());
    let out = swarm.ctl_ok(&[
        "agent",
        "create",
        "qa-1",
        "--archetype",
        "qa",
        "--description",
        "tests things",
        "--as",
        "alice",
        "--json",
    ]);
    let created: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(created["state"], "ready", "{out}");
    let pid = swarm.pid_of("qa-1").expect("qa-1 has a process");
    assert_eq!(swarm.state_of("qa-1"), "ready");

    // It works like any agent, and it is restarted like one.
    swarm.ctl_ok(&["send", "qa-1", "check the login page"]);
    swarm.wait_for_log("qa-1", "reply \"done: check the login page\"", SHORT);
    swarm.kill9("qa-1");
    swarm.wait_until(
        || swarm.pid_of("qa-1").is_some_and(|p| p != pid) && swarm.state_of("qa-1") == "ready",
        SHORT,
        "qa-1 restarted after kill -9",
    );

    // It survives a supervisor crash.
    let created =
        swarm.ctl_ok(&["channel", "create", "qa-room", "--members", "qa-1,dev", "--as", "alice"]);
    assert!(created.starts_with("created #qa-room; members: "), "text by default: {created}");
    let members: serde_json::Value =
        serde_json::from_str(&swarm.ctl_ok(&["channel", "members", "qa-room", "--json"])).unwrap();
    assert_eq!(members["channel"], "qa-room", "--json is one JSON document: {members}");
    swarm.kill9_supervisor();
    swarm.restart_supervisor();
    assert_eq!(swarm.state_of("qa-1"), "ready", "created agents come back with the swarm");

    // Decommission: stopped, out of ps, out of its channels, unreachable; history kept.
    let done = swarm.ctl_ok(&["agent", "decommission", "qa-1", "--as", "alice", "--json"]);
    let done: serde_json::Value = serde_json::from_str(&done).unwrap();
    assert_eq!(done["name"], "qa-1", "{done}");
    swarm.wait_until(|| swarm.ps().iter().all(|r| r["name"] != "qa-1"), SHORT, "qa-1 gone from ps");
    let members = swarm.ctl_ok(&["channel", "members", "qa-room"]);
    assert!(!members.contains("qa-1"), "{members}");
    let refused = swarm.ctl(&["send", "qa-1", "anyone?"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("AGENT_NOT_FOUND"));
    assert!(swarm.log("qa-1").contains("check the login page"), "its log stays");
    swarm.kill9_supervisor();
    swarm.restart_supervisor();
    assert!(swarm.ps().iter().all(|r| r["name"] != "qa-1"), "not started again");
    let journal = swarm.ctl_ok(&["journal", "query", "agent=human:alice"]);
    assert!(
        journal.contains("AGENT_CREATED") && journal.contains("AGENT_DECOMMISSIONED"),
        "{journal}"
    );
}

#[test]
fn a_worker_cannot_create_agents() {
    let swarm = Swarm::start(&yaml());
    swarm.ctl_ok(&["send", "dev", "go"]);
    swarm.wait_for_log("dev", "reply \"tried\"", SHORT);
    let log = swarm.log("dev");
    assert!(log.contains("tool flock_create_agent") && log.contains("FORBIDDEN"), "{log}");
    assert!(swarm.ps().iter().all(|r| r["name"] != "sneaky"));
    let journal = swarm.ctl_ok(&["journal", "query", "agent=dev status=FAILED"]);
    assert!(journal.contains("FLOCK_CREATE_AGENT"), "{journal}");
}
