//! The README's first-hour blocks, run as a person runs them: every line of each block marked
//! `<!-- run as written by tests/tests/e2e/readme.rs -->`, in order, in `bash`, in a fresh home
//! (`HOME` a temp folder: `scripts/install` puts Flock in its `~/.local/bin`, which is first on
//! `PATH`; the state dir is its `~/.flock`). Only two things differ from a person's machine:
//! `scripts/install` copies the binaries this test run built (`FLOCK_INSTALL_BIN_DIR`) instead of
//! a release build, and the model files of this machine are linked into the fresh home rather
//! than fetched again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use flock_testkit::{bin, repo_root, try_run};

use crate::SHORT;

const MARK: &str = "<!-- run as written by tests/tests/e2e/readme.rs -->";

/// The `sh` blocks under [`MARK`], each as its command lines.
fn marked_blocks(readme: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut lines = readme.lines();
    while let Some(line) = lines.next() {
        if line.trim() != MARK {
            continue;
        }
        assert_eq!(lines.next().map(str::trim), Some("```sh"), "a marked block is an sh block");
        let block: Vec<String> = lines
            .by_ref()
            .take_while(|l| l.trim() != "```")
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        blocks.push(block);
    }
    blocks
}

/// The marked block whose first line starts with `first`.
fn block<'a>(blocks: &'a [Vec<String>], first: &str) -> &'a [String] {
    blocks
        .iter()
        .find(|b| b.first().is_some_and(|l| l.starts_with(first)))
        .unwrap_or_else(|| panic!("no marked block starts with `{first}`"))
}

fn readme_blocks() -> Vec<Vec<String>> {
    marked_blocks(&std::fs::read_to_string(repo_root().join("README.md")).unwrap())
}

/// What the first line starting with `prefix` printed.
fn output_of(said: &[(String, String)], prefix: &str) -> String {
    said.iter()
        .find(|(l, _)| l.starts_with(prefix))
        .map(|(_, out)| out.clone())
        .unwrap_or_else(|| panic!("the block has no `{prefix}` line"))
}

/// A fresh home for the README's commands; `down` on drop, so a failed step leaves no swarm.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        // The commands run where a person has the repository: its scripts and examples.
        for part in ["scripts", "examples"] {
            std::os::unix::fs::symlink(repo_root().join(part), work.join(part)).unwrap();
        }
        // What the scripts keep in a temp folder (scripts/kickoff's state dir) goes with the home.
        std::fs::create_dir_all(dir.path().join("tmp")).unwrap();
        // This machine's models (scripts/setup fetched them), as the fresh home's.
        let models = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".flock/models"));
        if let Some(models) = models.filter(|m| m.is_dir()) {
            std::fs::create_dir_all(dir.path().join(".flock")).unwrap();
            std::os::unix::fs::symlink(models, dir.path().join(".flock/models")).unwrap();
        }
        Home { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, line: &str) -> Command {
        let home = self.path();
        let path = format!(
            "{}:{}",
            home.join(".local/bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", line])
            .current_dir(home.join("work"))
            .env("HOME", home)
            .env("TMPDIR", home.join("tmp"))
            .env("PATH", path)
            .env("FLOCK_INSTALL_BIN_DIR", bin("flockctl").parent().unwrap())
            .env_remove("CARGO_TARGET_DIR");
        // Only what was installed runs: no test's pointers to the build's binaries.
        for var in ["FLOCK_HOME"].iter().chain(&crate::BIN_OVERRIDES) {
            cmd.env_remove(var);
        }
        cmd
    }

    /// Runs one README line; its stdout, or a panic with what it printed.
    fn run(&self, line: &str) -> String {
        let started = Instant::now();
        let out = try_run(&mut self.command(line), Duration::from_secs(600))
            .unwrap_or_else(|e| panic!("`{line}`: {e}"));
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "`{line}` failed ({}):\n{stdout}\n{stderr}", out.status);
        eprintln!("readme: `{line}` took {:.1} s", started.elapsed().as_secs_f64());
        stdout.into_owned()
    }
}

impl Home {
    /// Agent `name`'s row in `bin/flockctl ps --json` (in the work folder), if it is there.
    fn agent_row(&self, name: &str) -> Option<serde_json::Value> {
        let out = try_run(&mut self.command("bin/flockctl ps --json"), SHORT).ok()?;
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        rows.as_array()?.iter().find(|r| r["name"] == name).cloned()
    }

    /// The state of `#id` in `bin/flockctl channels --json` (in the work folder), if it exists.
    fn channel_state(&self, id: &str) -> Option<String> {
        let out = try_run(&mut self.command("bin/flockctl channels --json"), SHORT).ok()?;
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let row = list.as_array()?.iter().find(|c| c["channel"] == id)?;
        row["state"].as_str().map(str::to_owned)
    }
}

impl Drop for Home {
    fn drop(&mut self) {
        // Whichever way the block started the swarm: installed, or linked into ./bin.
        let line = "if [ -x bin/flockctl ]; then bin/flockctl down; else flockctl down; fi";
        let _ = try_run(&mut self.command(line), Duration::from_secs(60));
    }
}

#[test]
fn the_readme_first_hour_runs_as_written() {
    let blocks = readme_blocks();
    assert_eq!(
        blocks.len(),
        9,
        "the instant start, the assistant (three blocks), `flockctl init`, the kick-off in one \
         command and by hand, the dashboard and memory: a new marked block needs its test here"
    );
    let init = block(&blocks, "scripts/install  ");
    let needs_model = init.iter().any(|l| l.starts_with("scripts/setup"));
    if needs_model && !crate::local_model::model_available("the README's first hour") {
        return;
    }

    // The instant start: installed, four scripted agents ready, a job through both workers.
    let home = Home::new();
    let mut said = Vec::new();
    for line in block(&blocks, "scripts/install --no-model") {
        said.push((line.clone(), home.run(line)));
    }
    let output = |prefix: &str| output_of(&said, prefix);
    assert!(home.path().join(".local/bin/flock-supervisor").is_file());
    let ps = output("flockctl ps");
    for agent in ["orchestrator", "sysadmin", "worker-1", "worker-2"] {
        assert!(ps.lines().any(|l| l.starts_with(agent) && l.contains("ready")), "{ps}");
    }
    let answer = output("flockctl send orchestrator");
    assert!(answer.contains("job dispatched"), "{answer}");
    let logs = output("flockctl logs worker-1");
    assert!(logs.contains("worker done: build: build the login page"), "{logs}");
    drop(home);

    // `flockctl init`: a swarm file on the embedded model that validate accepts and up starts
    // (its flock-model takes its turn with the other tests that run one).
    let _model = crate::local_model::one_model_at_a_time();
    let home = Home::new();
    let mut said = Vec::new();
    for line in init {
        said.push((line.clone(), home.run(line)));
    }
    let file = home.path().join("work/flock.yaml");
    let text = std::fs::read_to_string(&file).expect("init wrote ./flock.yaml");
    assert!(text.contains("provider: local") && text.contains("role: coordinator"), "{text}");
    let ps = &said.iter().find(|(l, _)| l.starts_with("flockctl ps")).expect("a ps line").1;
    assert!(ps.contains("flock-model") && ps.contains("coordinator"), "{ps}");
}

#[test]
fn the_readme_kickoff_by_hand_runs_as_written() {
    let blocks = readme_blocks();
    // The kick-off story by hand, with `scripts/up` (linking this run's binaries into ./bin):
    // after the person's post, the next lines wait as a person reading along would, until the
    // project channel is archived, so `channels` and `read` show the story the README tells.
    let home = Home::new();
    let mut said = Vec::new();
    for line in block(&blocks, "scripts/up examples/kickoff.yaml") {
        said.push((line.clone(), home.run(line)));
        if line.starts_with("bin/flockctl post") {
            flock_testkit::wait_for(
                || home.channel_state("project-login").as_deref() == Some("archived"),
                Duration::from_secs(120),
                "#project-login is archived",
            );
        }
    }
    assert!(home.path().join("work/bin/flockctl").exists(), "scripts/up links ./bin");
    let output = |prefix: &str| output_of(&said, prefix);
    let channels = output("bin/flockctl channels");
    assert!(
        channels.lines().any(|l| l.contains("project-login") && l.contains("archived")),
        "{channels}"
    );
    let read = output("bin/flockctl read '#project-login'");
    assert!(read.contains("Kick-off:") && read.contains("QA sign-off:"), "{read}");
    let journal = output("bin/flockctl journal read");
    assert!(journal.contains("CHANNEL_ARCHIVED"), "{journal}");
}

#[test]
fn the_readme_kickoff_in_one_command_runs_as_written() {
    let blocks = readme_blocks();
    let home = Home::new();
    let line = block(&blocks, "scripts/kickoff");
    assert_eq!(line.iter().filter(|l| !l.trim_start().starts_with('#')).count(), 1, "{line:?}");
    // The story runs to the archive (the script fails otherwise) and prints the channel.
    let out = home.run(&line[0]);
    assert!(out.contains("== #project-login"), "{out}");
    assert!(out.contains("Kick-off:") && out.contains("QA sign-off:"), "{out}");
    assert!(out.contains("CHANNEL_ARCHIVED"), "the journal: {out}");
    assert!(home.path().join("work/bin/flock-supervisor").exists(), "linked into ./bin");
}

#[test]
fn the_readme_dashboard_and_metrics_run_as_written() {
    // The README's fixed ports: only this test uses them.
    let blocks = readme_blocks();
    let home = Home::new();
    let mut said: Vec<(String, String)> = Vec::new();
    let mut before = None;
    for line in block(&blocks, "scripts/up examples/kickoff.yaml --detach --ui") {
        if line.starts_with("kill -9") {
            before = home.agent_row("dev");
        }
        said.push((line.clone(), home.run(line)));
        if line.starts_with("kill -9") {
            // As a person reading along: the next line looks once dev is back.
            let old = before.as_ref().map(|r| r["pid"].clone());
            flock_testkit::wait_for(
                || {
                    home.agent_row("dev").is_some_and(|r| {
                        r["restarts"] == 1 && r["pid"].is_u64() && Some(&r["pid"]) != old.as_ref()
                    })
                },
                Duration::from_secs(30),
                "dev restarted in a new process",
            );
        }
    }
    let ps = output_of(&said, "bin/flockctl ps");
    let dev = ps.lines().find(|l| l.starts_with("dev ")).unwrap_or_default();
    assert!(dev.contains("SIGKILL"), "the last exit is shown: {ps}");
    let ui = output_of(&said, "bin/flockctl ui");
    assert!(ui.contains("http://127.0.0.1:8080/?token="), "{ui}");
    let metrics = output_of(&said, "curl");
    for agent in ["orchestrator", "dev", "qa"] {
        let line = format!("flock_process_up{{name=\"{agent}\"");
        assert!(metrics.lines().any(|l| l.starts_with(&line) && l.ends_with(" 1")), "{metrics}");
    }
}

#[test]
fn the_readme_assistant_on_the_embedded_model_runs_as_written() {
    let blocks = readme_blocks();
    if !crate::local_model::model_available("the README's assistant") {
        return;
    }
    // The two commands: the swarm on the embedded model, and the whole test suite — which is
    // what runs this test, so it is checked to be exactly what CI runs rather than run again.
    let two = block(&blocks, "scripts/up examples/brain-persona-local.yaml");
    assert_eq!(two.len(), 2, "{two:?}");
    assert!(two[1].starts_with("scripts/test "), "{two:?}");
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    assert!(ci.lines().any(|l| l.trim() == "exec scripts/test"), "{ci}");

    let _model = crate::local_model::one_model_at_a_time();
    let home = Home::new();
    home.run(&two[0]);
    // Then the question, what to look at after it, and (once `down` stopped the swarm) what
    // memory kept of it, as the README's memory section asks it.
    let lines = block(&blocks, "bin/flockctl send coordinator")
        .iter()
        .chain(block(&blocks, "bin/flockctl read dm-coordinator"))
        .chain(block(&blocks, "bin/flockctl memory search"));
    let said: Vec<(String, String)> = lines.map(|l| (l.clone(), home.run(l))).collect();
    let output = |prefix: &str| output_of(&said, prefix);

    let answer = output("bin/flockctl send coordinator");
    assert!(answer.trim().len() > 20, "an answer, not `{answer}`");
    let dm = output("bin/flockctl read dm-coordinator");
    let first_words: String = answer.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
    assert!(
        dm.split_whitespace().collect::<Vec<_>>().join(" ").contains(&first_words),
        "the DM holds the answer `{first_words}…`:\n{dm}"
    );
    let ps = output("bin/flockctl ps");
    // The observer may still be writing what it observed: ready or busy, up either way.
    for name in ["flock-model", "coordinator", "worker", "observer"] {
        let up = |l: &&str| l.starts_with(name) && (l.contains(" ready ") || l.contains(" busy "));
        assert!(ps.lines().any(|l| up(&l)), "{name}:\n{ps}");
    }
    let journal = output("bin/flockctl journal query");
    assert!(journal.contains("coordinator"), "{journal}");
    let logs = output("bin/flockctl logs flock-model");
    assert!(logs.contains("processed"), "the model's calls: {logs}");
    // The question was kept: the coordinator's journal holds it, found by meaning and words.
    let found = output("bin/flockctl memory search \"talks this week\"");
    assert!(found.contains("journal") && found.contains("found in"), "{found}");
    let stats = output("bin/flockctl memory stats");
    assert!(stats.contains("journal"), "{stats}");
    // Nothing is 30 days old on a fresh machine: the dry run says so and moves nothing.
    let dry = output("bin/flockctl memory archive");
    assert!(dry.contains("no day file to move to warm"), "{dry}");
    let config = output("bin/flockctl memory config");
    assert!(config.contains("after 90 days") && config.contains("memory.tiers"), "{config}");
    let export = std::fs::read_to_string(home.path().join("work/journal.jsonl")).unwrap();
    let records: Vec<serde_json::Value> =
        export.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert!(
        records.iter().any(|r| r["kind"] == "journal"
            && r["text"].as_str().is_some_and(|t| t.contains("Plan my week"))),
        "{export}"
    );
}
