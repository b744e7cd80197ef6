//! `scripts/eval` itself, end to end on a scripted model (fast, deterministic): it starts the
//! swarm, asks the tasks at the terminal and — `--via telegram` — in a Telegram group through the
//! real bridge and `flock-fake-chat`, checks the answers, and prints a report a script can read.
//! A change that breaks the eval (a log format, a flag, the chat path) fails here, not in the
//! next person's benchmark run.

use std::process::Command;

use flock_testkit::{bin, repo_root};
use serde_json::Value;

#[test]
fn scripts_eval_reports_the_chat_path_beside_the_cli_path_on_a_scripted_model() {
    let bins = bin("flockctl").parent().expect("the binaries' folder").to_owned();
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/eval"))
        .args(["--no-build", "--bin-dir"])
        .arg(&bins)
        .args(["--swarm"])
        .arg(repo_root().join("tests/fixtures/eval-scripted.yaml"))
        .args(["--only", "sum,product,capital", "--via", "telegram", "--timeout", "60", "--json"])
        .output()
        .expect("run scripts/eval (python3)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "scripts/eval failed:\n{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    for via in ["cli", "telegram"] {
        let r = &report["via"][via];
        assert_eq!(r["tasks"], 3, "{via}: {r:#}");
        assert_eq!(r["answered_pct"], 100.0, "{via}: {r:#}");
        // The scripted model knows two of the three: the checks are real.
        assert_eq!(r["correct_pct"], 66.7, "{via}: {r:#}");
        let results = r["results"].as_array().expect("results");
        let correct: Vec<&str> = results
            .iter()
            .filter(|t| t["correct"] == true)
            .map(|t| t["id"].as_str().unwrap())
            .collect();
        assert_eq!(correct, ["sum", "capital"], "{via}");
        assert!(r["time_to_answer_p50_s"].as_f64().is_some(), "{via}: {r:#}");
    }
    assert!(report["chat_vs_cli_p50"].as_f64().is_some(), "{report:#}");
    let adds = &report["via"]["telegram"]["bridge_adds"];
    for k in ["in_ms_p50", "out_ms_p50"] {
        let ms = adds[k].as_i64().unwrap_or_else(|| panic!("{k}: {adds:#}"));
        assert!((0..5_000).contains(&ms), "{k} = {ms} ms: {adds:#}");
    }
    assert!(stderr.contains("[telegram  3/3]"), "progress is printed: {stderr}");
}
