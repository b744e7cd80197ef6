//! The embedded local model: an agent with no `model:` runs on `flock-model`, which the
//! supervisor starts before the agents, shows in `ps`, restarts after a crash and stops last.
//!
//! The real-turn test needs the model file (`scripts/setup`) and the `flock-model` binary
//! (`cargo build --manifest-path model/Cargo.toml`). `scripts/test` provides both and sets
//! `FLOCK_REQUIRE_MODEL=1`, so in CI their absence is a failure, not a skip.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use flock_testkit::{Swarm, bin};

const MODEL_FILE: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

fn model_path() -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".flock/models").join(MODEL_FILE))
}

/// The tests that run the model take turns: two llama.cpp processes on 2 cores would each run
/// at a fraction of their speed.
static ONE_MODEL_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_model_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_MODEL_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether the model and its binary are here; panics if CI promised them and they are not.
fn model_available(test: &str) -> bool {
    let here = model_path().is_some_and(|p| p.is_file()) && bin("flock-model").is_file();
    if !here {
        assert!(
            std::env::var_os("FLOCK_REQUIRE_MODEL").is_none(),
            "FLOCK_REQUIRE_MODEL is set but the model file or flock-model is missing: run \
             scripts/setup"
        );
        eprintln!("{test}: skipped (no model: run scripts/setup)");
    }
    here
}

#[test]
fn a_missing_model_file_is_refused_with_the_command_that_fetches_it() {
    let dir = tempfile::tempdir().unwrap();
    let swarm = dir.path().join("swarm.yaml");
    std::fs::write(&swarm, "swarm: { name: local }\nagents:\n  - { name: a, role: worker }\n")
        .unwrap();
    let out = Command::new(bin("flock-supervisor"))
        .arg("up")
        .arg(&swarm)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("FLOCK_HOME", dir.path().join("empty-home"))
        .env("FLOCK_AGENT_BIN", bin("flock-agent"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("scripts/setup"), "{stderr}");
    assert!(stderr.contains("empty-home/models/qwen2.5-coder"), "names the file: {stderr}");
}

#[test]
fn an_agent_without_a_model_answers_on_the_embedded_model_which_is_supervised() {
    if !model_available("embedded model turn") {
        return;
    }
    let _turn = one_model_at_a_time();
    let swarm = Swarm::start(
        "swarm: { name: local }\nagents:\n  - { name: helper, role: worker, description: \"answers briefly\" }\n",
    );
    let model = |s: &Swarm| s.ps().into_iter().find(|r| r["name"] == "flock-model").unwrap();
    let row = model(&swarm);
    assert_eq!(row["state"], "ready", "{row}");
    assert_eq!(row["kind"], "process", "{row}");
    let first_pid = row["pid"].as_u64().expect("a pid");

    // One real turn: the gateway → flock-model → back to the agent.
    swarm.ctl_ok(&["send", "helper", "Reply with one short sentence: what is 2 + 2?"]);
    let slow = Duration::from_secs(240);
    swarm.wait_until(|| swarm.turns_total("helper") == 1, slow, "one turn on the local model");
    let log = swarm.log("helper");
    assert!(log.contains(" done in ") && log.contains("reply \""), "{log}");
    assert!(!log.contains("turn failed"), "{log}");
    let helper = swarm.agent("helper");
    assert!(helper["tokens_in"].as_u64().unwrap() > 100, "the prompt was counted: {helper}");
    assert!(helper["tokens_out"].as_u64().unwrap() > 0, "{helper}");

    // kill -9 of the model process: restarted on the same port, ready again.
    flock_testkit::proc::signal(first_pid as u32, nix::sys::signal::Signal::SIGKILL);
    swarm.wait_until(
        || {
            let r = model(&swarm);
            r["state"] == "ready" && r["pid"].as_u64() != Some(first_pid) && r["restarts"] == 1
        },
        Duration::from_secs(60),
        "flock-model restarted",
    );
    swarm.ctl_ok(&["send", "helper", "Say OK."]);
    swarm.wait_until(|| swarm.turns_total("helper") == 2, slow, "a turn after the restart");
}

/// The README's main job, as a user runs it: the brain-persona swarm on the embedded model, one
/// question with `flockctl send … --wait`. The answer is printed, is right, reaches the person's
/// DM exactly once, and the journal tells the chain's story under its id.
#[test]
fn the_readme_main_job_answers_on_the_embedded_model_once_with_its_story_in_the_journal() {
    if !model_available("the README main job") {
        return;
    }
    let _turn = one_model_at_a_time();
    let file = flock_testkit::repo_root().join("examples/brain-persona-local.yaml");
    let swarm = Swarm::builder_from_file(&file).start();
    let args = [
        "send",
        "coordinator",
        "What is the capital of France?",
        "--wait",
        "--json",
        "--timeout",
        "600",
    ];
    let out = swarm.ctl_within(&args, Duration::from_secs(630));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let end: serde_json::Value = serde_json::from_str(&stdout).expect("JSON outcome");
    let answer = end["text"].as_str().unwrap_or_default();
    assert_eq!(end["outcome"], "answered", "{end}");
    assert!(answer.contains("Paris"), "a right answer: {end}");
    assert_eq!(end["channel"], "dm-coordinator--human-operator", "{end}");

    // Exactly one answer in the DM, once the chain has nothing left to do.
    swarm.wait_until(
        || swarm.ps().iter().any(|r| r["name"] == "chains" && r["mailbox_depth"] == 0),
        Duration::from_secs(240),
        "the chain's background turns (observer) finished",
    );
    let dm = swarm.ctl_ok(&["read", "dm-coordinator--human-operator", "--json"]);
    let posts: Vec<serde_json::Value> =
        dm.lines().map(|l| serde_json::from_str(l).expect("a JSON line per message")).collect();
    assert_eq!(posts.len(), 1, "{dm}");
    assert_eq!(posts[0]["author"], "coordinator", "{dm}");
    assert_eq!(posts[0]["text"], answer, "{dm}");

    let chain = end["chain"].as_str().unwrap();
    let story = swarm.ctl_ok(&["journal", "query", &format!("corr={chain}"), "--json"]);
    for action in ["\"type\":\"SEND\"", "\"type\":\"TURN\"", "\"type\":\"ANSWER\""] {
        assert!(story.contains(action), "{action} missing: {story}");
    }
    assert_eq!(story.matches("\"type\":\"ANSWER\"").count(), 1, "{story}");
}
