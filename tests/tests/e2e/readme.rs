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
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let blocks = marked_blocks(&readme);
    assert_eq!(blocks.len(), 3, "the instant start, `flockctl init` and the kick-off by hand");
    let needs_model = blocks.iter().flatten().any(|l| l.starts_with("scripts/setup"));
    if needs_model && !crate::local_model::model_available("the README's first hour") {
        return;
    }

    // The instant start: installed, four scripted agents ready, a job through both workers.
    let home = Home::new();
    let mut said = Vec::new();
    for line in &blocks[0] {
        said.push((line.clone(), home.run(line)));
    }
    let output = |prefix: &str| {
        said.iter()
            .find(|(l, _)| l.starts_with(prefix))
            .map(|(_, out)| out.clone())
            .unwrap_or_else(|| panic!("the block has no `{prefix}` line"))
    };
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
    for line in &blocks[1] {
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
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let blocks = marked_blocks(&readme);
    // The kick-off story by hand, with `scripts/up` (linking this run's binaries into ./bin):
    // after the person's post, the next lines wait as a person reading along would, until the
    // project channel is archived, so `channels` and `read` show the story the README tells.
    let home = Home::new();
    let mut said = Vec::new();
    for line in &blocks[2] {
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
    let output = |prefix: &str| {
        said.iter()
            .find(|(l, _)| l.starts_with(prefix))
            .map(|(_, out)| out.clone())
            .unwrap_or_else(|| panic!("the block has no `{prefix}` line"))
    };
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
