//! Supervision (DESIGN.md §6) with real processes and signals: crash loops with backoff and the
//! intensity limit, the one_for_all and rest_for_one strategies, and hung-agent detection.

use std::collections::HashMap;

use flock_testkit::{Swarm, alive, count_lines};
use nix::sys::signal::Signal;

use crate::{SHORT, answer_model};

fn pids(swarm: &Swarm) -> HashMap<String, Option<u32>> {
    swarm
        .agents()
        .iter()
        .map(|a| (a["name"].as_str().unwrap().to_owned(), a["pid"].as_u64().map(|p| p as u32)))
        .collect()
}

#[test]
fn crash_loop_backs_off_then_marks_the_agent_failed_and_spares_the_others() {
    let yaml = format!(
        r#"swarm:
  name: crashy
supervision:
  max_restarts: 3
  max_seconds: 60
  backoff_initial_ms: 100
models:
{}agents:
  - {{ name: steady, role: worker, model: m }}
  - {{ name: crasher, role: worker, model: m, command: ["/bin/sh", "-c", "exit 3"] }}
  - {{ name: after, role: worker, model: m }}
"#,
        answer_model("m", "ok")
    );
    let swarm = Swarm::builder(&yaml).not_ready("crasher").start();
    let before = pids(&swarm);

    swarm.wait_until(|| swarm.state_of("crasher") == "failed", SHORT, "crasher is failed");
    let row = swarm.agent("crasher");
    assert_eq!(row["restarts"], 3, "{row}");
    assert_eq!(row["last_exit"], "code 3", "{row}");
    assert!(row["pid"].is_null(), "{row}");

    // Backoff: an immediate first restart, then initial × 2^n, each within ±20 % jitter.
    let log = swarm.log("crasher");
    let delays: Vec<u64> = log
        .lines()
        .filter_map(|l| l.split("restarting in ").nth(1))
        .map(|rest| rest.trim_end_matches(" ms").parse().expect("a delay in ms"))
        .collect();
    assert_eq!(delays.len(), 3, "{log}");
    assert_eq!(delays[0], 0, "{log}");
    assert!((80..=120).contains(&delays[1]), "second restart after ~100 ms: {log}");
    assert!((160..=240).contains(&delays[2]), "third restart after ~200 ms: {log}");
    assert_eq!(count_lines(&log, &["exited: code 3"]), 4, "{log}");
    assert!(log.contains("failed: more than 3 restarts in 60 s"), "{log}");

    // The others never noticed.
    for name in ["steady", "after"] {
        let row = swarm.agent(name);
        assert_eq!(row["state"], "ready", "{row}");
        assert_eq!(row["restarts"], 0, "{row}");
        assert_eq!(row["pid"].as_u64().map(|p| p as u32), before[name], "{row}");
    }

    // A failed agent can be restarted by hand: it gets a fresh intensity budget, crash-loops
    // through it again, and `restart` reports that it did not come up.
    let spawned = count_lines(&log, &["spawned pid"]);
    let out = swarm.ctl(&["restart", "crasher"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(
        stderr.contains("TARGET_UNAVAILABLE: crasher failed: more than 3 restarts"),
        "{stderr}"
    );
    let log = swarm.log("crasher");
    assert_eq!(count_lines(&log, &["spawned pid"]), spawned + 4, "{log}");
    let row = swarm.agent("crasher");
    assert_eq!(row["state"], "failed", "{row}");
    assert_eq!(row["restarts"], 7, "3 automatic, 1 by hand, 3 automatic again: {row}");
    assert_eq!(swarm.state_of("steady"), "ready");
}

fn three_agents(strategy: &str) -> Swarm {
    let name = strategy.replace('_', "-");
    let yaml = format!(
        "swarm:\n  name: {name}\nsupervision:\n  strategy: {strategy}\nmodels:\n{}agents:\n  - \
         {{ name: first, role: worker, model: m }}\n  - {{ name: middle, role: worker, model: m }}\n  - \
         {{ name: last, role: worker, model: m }}\n",
        answer_model("m", "ok")
    );
    Swarm::start(&yaml)
}

/// Kills `middle` and waits until `restarted` have new pids and every agent is ready again.
fn kill_middle(swarm: &Swarm, restarted: &[&str]) -> HashMap<String, Option<u32>> {
    let before = pids(swarm);
    let killed = swarm.kill9("middle");
    swarm.wait_until(
        || {
            let rows = swarm.agents();
            rows.iter().all(|r| r["state"] == "ready")
                && restarted.iter().all(|name| {
                    let row = rows.iter().find(|r| r["name"] == *name).unwrap();
                    let pid = row["pid"].as_u64().map(|p| p as u32);
                    pid.is_some() && pid != before[*name]
                })
        },
        SHORT,
        &format!("{restarted:?} run again with new pids"),
    );
    assert!(!alive(killed));
    before
}

#[test]
fn one_for_all_restarts_every_sibling_when_one_dies() {
    let swarm = three_agents("one_for_all");
    let before = kill_middle(&swarm, &["first", "middle", "last"]);
    let after = pids(&swarm);
    for name in ["first", "middle", "last"] {
        let old = before[name].unwrap();
        assert!(!alive(old), "{name}'s old process (pid {old}) still runs");
        let row = swarm.agent(name);
        assert_eq!(row["restarts"], 1, "{row}");
        assert_ne!(after[name], before[name]);
    }
    assert_eq!(swarm.agent("middle")["last_exit"], "signal SIGKILL");
    // The siblings were stopped gracefully (Shutdown frame → exit 0), not killed.
    assert_eq!(swarm.agent("first")["last_exit"], "code 0");
    assert_eq!(swarm.agent("last")["last_exit"], "code 0");
}

#[test]
fn rest_for_one_restarts_the_dead_agent_and_those_started_after_it() {
    let swarm = three_agents("rest_for_one");
    let before = kill_middle(&swarm, &["middle", "last"]);
    let first = swarm.agent("first");
    assert_eq!(
        first["pid"].as_u64().map(|p| p as u32),
        before["first"],
        "first was restarted: {first}"
    );
    assert_eq!(first["restarts"], 0, "{first}");
    assert!(first["last_exit"].is_null(), "{first}");
    for name in ["middle", "last"] {
        assert_eq!(swarm.agent(name)["restarts"], 1);
        assert!(!alive(before[name].unwrap()));
    }
}

#[test]
fn hung_agent_is_killed_for_missed_heartbeats_and_restarted() {
    let yaml = format!(
        r#"swarm:
  name: hung
supervision:
  heartbeat_interval_ms: 100
  heartbeat_misses: 3
models:
{}agents:
  - {{ name: sleepy, role: worker, model: m }}
  - {{ name: bystander, role: worker, model: m }}
"#,
        answer_model("m", "awake: {input}")
    );
    let swarm = Swarm::start(&yaml);
    let bystander = swarm.pid_of("bystander");
    let frozen = swarm.signal("sleepy", Signal::SIGSTOP);

    swarm.wait_for_log("sleepy", "killed: no heartbeat for", SHORT);
    swarm.wait_until(
        || {
            let row = swarm.agent("sleepy");
            row["state"] == "ready" && row["pid"].as_u64().is_some_and(|p| p as u32 != frozen)
        },
        SHORT,
        "sleepy runs again with a new pid",
    );
    assert!(!alive(frozen), "the hung process (pid {frozen}) is still there");
    let row = swarm.agent("sleepy");
    assert_eq!(row["restarts"], 1, "{row}");
    assert!(row["last_exit"].as_str().unwrap_or("").starts_with("killed: no heartbeat"), "{row}");

    // The new incarnation works, and the other agent was never touched.
    swarm.ctl_ok(&["send", "sleepy", "hello"]);
    swarm.wait_for_log("sleepy", "reply \"awake: hello\"", SHORT);
    let row = swarm.agent("bystander");
    assert_eq!(
        (row["pid"].as_u64().map(|p| p as u32), row["restarts"].as_u64()),
        (bystander, Some(0)),
        "{row}"
    );
}

#[test]
fn restart_policies_decide_which_exits_are_restarted() {
    let yaml = format!(
        r#"swarm:
  name: policies
supervision:
  backoff_initial_ms: 20
models:
{}agents:
  - {{ name: done-ok, role: worker, model: m, restart: transient, command: ["/bin/sh", "-c", "exit 0"] }}
  - {{ name: done-bad, role: worker, model: m, restart: transient, command: ["/bin/sh", "-c", "exit 4"] }}
  - {{ name: one-shot, role: worker, model: m, restart: temporary, command: ["/bin/sh", "-c", "exit 5"] }}
  - {{ name: steady, role: worker, model: m }}
"#,
        answer_model("m", "ok")
    );
    let swarm = Swarm::builder(&yaml)
        .not_ready("done-ok")
        .not_ready("done-bad")
        .not_ready("one-shot")
        .start();
    // transient: a clean exit ends it; a failing one is restarted (until the intensity limit).
    swarm.wait_until(|| swarm.state_of("done-ok") == "exited(code 0)", SHORT, "done-ok exited");
    swarm.wait_until(|| swarm.state_of("done-bad") == "failed", SHORT, "done-bad gave up");
    // temporary: never restarted, whatever the exit.
    swarm.wait_until(|| swarm.state_of("one-shot") == "exited(code 5)", SHORT, "one-shot exited");
    for (name, restarts) in [("done-ok", 0), ("done-bad", 5), ("one-shot", 0), ("steady", 0)] {
        assert_eq!(swarm.agent(name)["restarts"], restarts, "{}", swarm.agent(name));
    }
    assert_eq!(count_lines(&swarm.log("done-ok"), &["spawned pid"]), 1);
    assert_eq!(count_lines(&swarm.log("one-shot"), &["spawned pid"]), 1);
    assert_eq!(swarm.state_of("steady"), "ready");
}

#[test]
fn agent_that_never_says_hello_is_killed_after_its_ready_timeout() {
    let yaml = format!(
        r#"swarm:
  name: mute
supervision:
  max_restarts: 1
models:
{}agents:
  - {{ name: mute, role: worker, model: m, ready_timeout_secs: 1, stop_timeout_secs: 0, command: ["/bin/sleep", "60"] }}
"#,
        answer_model("m", "ok")
    );
    // (stop_timeout_secs: 0 only makes the teardown quick: `sleep` cannot answer Shutdown.)
    let swarm = Swarm::builder(&yaml).not_ready("mute").start();
    swarm.wait_for_log("mute", "killed: no Hello within 1 s (ready_timeout_secs)", SHORT);
    swarm.wait_until(|| swarm.agent("mute")["restarts"] == 1, SHORT, "mute is restarted");
    let row = swarm.agent("mute");
    assert!(row["last_exit"].as_str().unwrap_or("").starts_with("killed: no Hello"), "{row}");
}

#[test]
fn stop_escalates_to_sigkill_when_the_agent_ignores_shutdown() {
    let yaml = format!(
        "swarm:\n  name: stubborn\nmodels:\n{}agents:\n  - {{ name: stubborn, role: worker, model: m, \
         stop_timeout_secs: 1 }}\n",
        answer_model("m", "ok")
    );
    let swarm = Swarm::start(&yaml);
    // A stopped process reads no Shutdown frame and holds SIGTERM pending: only SIGKILL ends it.
    let pid = swarm.signal("stubborn", Signal::SIGSTOP);
    let started = std::time::Instant::now();
    let out = swarm.ctl_ok(&["stop", "stubborn"]);
    let took = started.elapsed();
    assert!(out.contains("stubborn stopped (signal SIGKILL)"), "{out}");
    // Grace (min of 2 s and stop_timeout_secs), then SIGTERM, then stop_timeout_secs.
    assert!(took >= std::time::Duration::from_millis(1900), "stopped after only {took:?}");
    assert!(!alive(pid));
    let log = swarm.log("stubborn");
    assert!(log.contains("did not stop in time: SIGKILL"), "{log}");
    let row = swarm.agent("stubborn");
    assert_eq!(
        (row["state"].as_str(), row["last_exit"].as_str()),
        (Some("stopped"), Some("signal SIGKILL")),
        "{row}"
    );
}

#[test]
fn escalate_stops_the_whole_swarm_when_a_child_exceeds_its_intensity() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("swarm.yaml");
    let yaml = format!(
        r#"swarm:
  name: escalating
supervision:
  max_restarts: 1
  backoff_initial_ms: 10
  escalate: true
models:
{}agents:
  - {{ name: fine, role: worker, model: m }}
  - {{ name: crasher, role: worker, model: m, command: ["/bin/sh", "-c", "exit 3"] }}
"#,
        answer_model("m", "ok")
    );
    std::fs::write(&file, yaml).unwrap();
    let state = dir.path().join("state");
    let mut up = std::process::Command::new(flock_testkit::bin("flock-supervisor"));
    up.arg("up").arg(&file).arg("--state-dir").arg(&state);
    // The supervisor ends on its own; `run` bounds how long that may take.
    let out = flock_testkit::run(&mut up, SHORT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("crasher exceeded its restart intensity and escalate is set"),
        "{stderr}"
    );
    assert!(stderr.contains("swarm `escalating` stopped"), "{stderr}");
    // A give-up is not a requested stop: the supervisor exits non-zero, naming why.
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("the swarm was stopped because agent crasher exceeded"), "{stderr}");
    let fine = std::fs::read_to_string(state.join("logs/fine.log")).unwrap();
    assert!(fine.contains("shutdown requested by the supervisor"), "{fine}");
    assert!(fine.contains("exited: code 0"), "{fine}");
    let socket = format!("FLOCK_SOCKET={}", state.join("run/router.sock").display());
    assert!(flock_testkit::proc::pids_with_env(&socket).is_empty(), "agents outlived the swarm");
}

#[test]
fn agents_get_an_allowlisted_environment_and_their_workspace_as_cwd() {
    let agent = flock_testkit::bin("flock-agent");
    let yaml = format!(
        r#"swarm: {{ name: env-check }}
models:
{}agents:
  - name: probe
    role: worker
    model: m
    env: {{ MY_SETTING: visible }}
    command: ["/bin/sh", "-c", "pwd; env | sort; exec \"$0\"", "{}"]
"#,
        answer_model("m", "ok"),
        agent.display()
    );
    let swarm = Swarm::start(&yaml);
    let log = swarm.log("probe");
    assert!(log.contains("FLOCK_AGENT=probe") && log.contains("MY_SETTING=visible"), "{log}");
    assert!(log.contains("PATH="), "{log}");
    assert!(
        !log.contains("FLOCK_TEST_SECRET") && !log.contains("s3cr3t"),
        "the secret leaked:\n{log}"
    );
    let cwd = log.lines().find(|l| l.contains(" out /")).expect("pwd printed");
    assert!(cwd.trim_end().ends_with("workspaces/probe"), "{cwd}");
}

/// The session id of `pid` (field 6 of `/proc/<pid>/stat`, after the command's `)`).
fn session_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(3)?.parse().ok()
}

/// Children start with posix_spawn through `flock-sandbox` (which sets them up: their own
/// session, the death signal, the token's socket off standard input) — and, where
/// `flock-sandbox` is missing, by fork with the same set-up. Either way an agent leads its own
/// session, gets its token (it says Hello and works), sees neither the launcher's variable nor
/// a socket on standard input, and dies with a `kill -9`ed supervisor.
#[test]
fn children_are_set_up_alike_whether_launched_or_forked() {
    let yaml = format!(
        "swarm: {{ name: launched }}\nmodels:\n{}agents:\n  - {{ name: a, role: worker, model: m, unconfined: true }}\n",
        answer_model("m", "done: {input}")
    );
    for forked in [false, true] {
        let mut builder = Swarm::builder(&yaml);
        if forked {
            builder = builder.env("FLOCK_SANDBOX_HELPER", "/nonexistent/flock-sandbox");
        }
        let mut swarm = builder.start();
        let pid = swarm.pid_of("a").expect("a runs");
        assert_eq!(session_of(pid), Some(pid), "forked: {forked}: a leads its own session");
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains("FLOCK_LAUNCHED_BY"), "forked: {forked}: {environ}");
        let stdin = std::fs::read_link(format!("/proc/{pid}/fd/0")).expect("its stdin");
        assert_eq!(stdin, std::path::Path::new("/dev/null"), "forked: {forked}");
        swarm.ctl_ok(&["send", "a", "hi"]);
        swarm.wait_for_log("a", "reply \"done: hi\"", SHORT);
        assert_eq!(
            swarm.supervisor_output().contains("children start by fork"),
            forked,
            "{}",
            swarm.supervisor_output()
        );
        swarm.kill9_supervisor();
        swarm.wait_until(|| !alive(pid), SHORT, "the agent dies with its supervisor");
    }
}
