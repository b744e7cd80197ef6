//! The command line as a user meets it: the README flow on the shipped example, `validate` and
//! `up` on broken files, and `stop` / `start` / `down`.

use std::collections::HashSet;
use std::process::Command;

use flock_testkit::{Swarm, alive, bin, count_lines, repo_root, run};

use crate::{SHORT, answer_model};

#[test]
fn readme_flow_office_example_routes_a_job_through_both_workers() {
    let swarm = Swarm::builder_from_file(repo_root().join("examples/office.yaml")).start();

    // The human table lists the four agents, ready, each its own process.
    let table = swarm.ctl_ok(&["ps"]);
    let agents: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.get(1) == Some(&"agent"))
        .collect();
    let names: Vec<&str> = agents.iter().map(|c| c[0]).collect();
    assert_eq!(names, ["orchestrator", "sysadmin", "worker-1", "worker-2"], "ps:\n{table}");
    // NAME KIND ROLE SANDBOX CAGE PID STATE …: every agent process is in its cage.
    for cols in &agents {
        assert_eq!(cols[4], "caged", "ps:\n{table}");
        assert_eq!(cols[6], "ready", "ps:\n{table}");
    }
    let pids: HashSet<&str> = agents.iter().map(|c| c[5]).collect();
    assert_eq!(pids.len(), 4, "every agent is its own process; ps:\n{table}");
    // In an 80-column terminal no row wraps, and what matters stays.
    let narrow = Command::new(bin("flockctl"))
        .arg("--state-dir")
        .arg(swarm.state_dir())
        .arg("ps")
        .env("COLUMNS", "80")
        .output()
        .unwrap();
    let narrow = String::from_utf8_lossy(&narrow.stdout);
    assert!(narrow.lines().all(|l| l.chars().count() <= 80), "ps at 80 columns:\n{narrow}");
    assert!(narrow.starts_with("NAME") && narrow.contains("STATE") && narrow.contains("worker-2"));
    // The JSON form agrees, and those pids are live processes.
    for row in swarm.agents() {
        let pid = row["pid"].as_u64().expect("a ready agent has a pid") as u32;
        assert!(alive(pid), "{} (pid {pid}) is not running", row["name"]);
        assert!(table.contains(&pid.to_string()));
    }

    // A Tab completes the running swarm's agents and channels.
    let names = tab(swarm.state_dir(), &["restart", "w"]);
    let names: Vec<&str> = names.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(names, ["worker-1", "worker-2"]);

    let sent = swarm.ctl_ok(&["send", "orchestrator", "build the login page"]);
    assert!(sent.contains("accepted into orchestrator's mailbox"), "{sent}");

    swarm.wait_for_log("orchestrator", "reply \"orchestrator: job dispatched\"", SHORT);
    let logs = swarm.ctl_ok(&["logs", "orchestrator"]);
    assert!(
        logs.contains("from operator (message, attempt 1): \"build the login page\""),
        "{logs}"
    );
    assert!(logs.contains("reply \"orchestrator: job dispatched\""), "{logs}");
    // The request to worker-1 came back with its answer before the orchestrator finished.
    assert!(logs.contains("→ ok: \"worker done: build: build the login page\""), "{logs}");

    let w1 = swarm.ctl_ok(&["logs", "worker-1"]);
    assert!(
        w1.contains("from orchestrator (request, attempt 1): \"build: build the login page\""),
        "{w1}"
    );
    swarm.wait_for_log(
        "worker-2",
        "reply \"worker done: please test: build the login page\"",
        SHORT,
    );
    let w2 = swarm.ctl_ok(&["logs", "worker-2"]);
    assert!(
        w2.contains(
            "from orchestrator (message, attempt 1): \"please test: build the login page\""
        ),
        "{w2}"
    );
    swarm.wait_until(
        || swarm.agents().iter().all(|a| a["mailbox_depth"] == 0),
        SHORT,
        "every mailbox is empty",
    );
    let turns: Vec<u64> =
        swarm.agents().iter().map(|a| a["turns_total"].as_u64().unwrap_or(99)).collect();
    assert_eq!(turns, [1, 0, 1, 1], "orchestrator, sysadmin, worker-1, worker-2");
    // With --json and no --wait: one document saying where the answer will be.
    let json = swarm.ctl_ok(&["send", "sysadmin", "status", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["accepted"], true, "{json}");
    assert_eq!(json["dm"], "dm-human-operator--sysadmin", "{json}");

    // "Try a crash": worker-1 is back with a new pid, one restart, and the signal as last exit.
    let killed = swarm.kill9("worker-1");
    swarm.wait_until(
        || {
            let row = swarm.agent("worker-1");
            row["state"] == "ready" && row["pid"].as_u64().is_some_and(|p| p as u32 != killed)
        },
        SHORT,
        "worker-1 is back with a new pid",
    );
    let row = swarm.agent("worker-1");
    assert_eq!(
        (row["restarts"].as_u64(), row["last_exit"].as_str()),
        (Some(1), Some("signal SIGKILL")),
        "{row}"
    );
    // (A topic is anyone's text: a line break in it does not make a second candidate.)
    let topic = "Requests\nworker-3";
    swarm.ctl_ok(&["channel", "create", "lobby", "--topic", topic, "--members", "orchestrator"]);
    let channels = tab(swarm.state_dir(), &["read", "#lo"]);
    assert_eq!(channels, "#lobby\tRequests worker-3\n");
}

#[test]
fn validate_reports_every_problem_with_file_line_and_column() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let syntax = dir.join("syntax.yaml");
    std::fs::write(
        &syntax,
        "swarm:\n  name: broken\nagents:\n  - name: a\n    role: worker\n    model: [unclosed\n",
    )
    .unwrap();
    let out = validate(&syntax);
    assert_eq!(out.0, Some(1), "stderr: {}", out.1);
    assert!(out.1.contains(&format!("{}:6:12: YAML syntax error", syntax.display())), "{}", out.1);

    let semantic = dir.join("semantic.yaml");
    std::fs::write(
        &semantic,
        "swarm:\n  name: broken\nsupervision:\n  strategy: one_for_none\nmodels:\n  m:\n    \
         provider: scripted\n    rules:\n      - reply: hi\nagents:\n  - name: a\n    role: wrker\n    \
         model: m\n",
    )
    .unwrap();
    let out = validate(&semantic);
    assert_eq!(out.0, Some(1), "stderr: {}", out.1);
    let file = semantic.display();
    assert!(
        out.1.contains(&format!(
            "{file}:4:13: `supervision.strategy`: unknown strategy `one_for_none`"
        )),
        "{}",
        out.1
    );
    assert!(
        out.1.contains(&format!("{file}:12:11: `agents.a.role`: unknown role `wrker`")),
        "{}",
        out.1
    );
    assert!(out.1.contains("2 problem(s)"), "{}", out.1);

    // A good file passes.
    let out = validate(&repo_root().join("examples/office.yaml"));
    assert_eq!(out.0, Some(0), "stderr: {}", out.1);

    // `up` on the broken file starts nothing: no state dir, exit 1, the same report.
    let state = dir.join("state");
    let mut up = Command::new(bin("flock-supervisor"));
    up.arg("up").arg(&semantic).arg("--state-dir").arg(&state);
    let out = run(&mut up, SHORT);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("nothing was started"), "{stderr}");
    assert!(stderr.contains(&format!("{file}:12:11:")), "{stderr}");
    assert!(!state.exists(), "up created {} for a broken file", state.display());
}

#[test]
fn validate_says_which_named_secret_is_not_set_here_unless_asked_for_the_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.yaml");
    let var = "FLOCK_E2E_NEVER_SET_KEY";
    std::fs::write(
        &file,
        format!(
            "swarm:\n  name: keys\nmodels:\n  gpt: {{provider: openai, model: gpt-4o-mini, \
             api_key_env: {var}}}\ndefaults: {{model: gpt}}\nagents:\n  - {{name: w, role: worker}}\n"
        ),
    )
    .unwrap();
    let out = validate(&file);
    assert_eq!(out.0, Some(1), "{}", out.1);
    assert!(out.1.contains(&format!("`{var}` (models.gpt.api_key_env) is not set")), "{}", out.1);
    assert!(out.1.contains("the file is valid, but 1 secret(s)"), "{}", out.1);

    let mut cmd = Command::new(bin("flock-supervisor"));
    cmd.arg("validate").arg("--file-only").arg(&file);
    let out = run(&mut cmd, SHORT);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // Kept in the .env beside the file instead: found there — but only in a private file.
    use std::os::unix::fs::PermissionsExt;
    let env = dir.path().join(".env");
    std::fs::write(&env, format!("# keys of this swarm\n{var}=sk-from-the-file\n")).unwrap();
    std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = validate(&file);
    assert_eq!(out.0, Some(0), "{}", out.1);
    std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = validate(&file);
    assert_eq!(out.0, Some(1), "{}", out.1);
    assert!(
        out.1.contains("may be read by other users") && out.1.contains("chmod 600"),
        "{}",
        out.1
    );
}

#[test]
fn validate_needs_names_the_programs_a_swarm_runs_so_scripts_up_builds_only_those() {
    // scripts/up builds flock-bridge and flock-model only when this says so.
    let needs_of = |file: &std::path::Path| {
        let mut cmd = Command::new(bin("flock-supervisor"));
        cmd.arg("validate").arg("--needs").arg(file);
        let out = run(&mut cmd, SHORT);
        let file = file.display();
        assert!(out.status.success(), "{file}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect::<Vec<_>>()
    };
    let needs = |example: &str| needs_of(&repo_root().join("examples").join(example));
    assert_eq!(needs("office.yaml"), Vec::<String>::new(), "scripted models, no chat, no memory");
    assert_eq!(needs("brain-persona-local.yaml"), ["flock-model", "vectors"]);
    assert_eq!(
        needs("telegram.yaml"),
        ["flock-bridge", "flock-model", "vectors"],
        "a chat on the embedded model, with the memory roles"
    );
    assert_eq!(needs("brain-persona.yaml"), ["vectors"], "a remote model, the memory roles");
    assert_eq!(needs("kickoff.yaml"), Vec::<String>::new(), "a team that does not search memory");
    // A swarm across hosts needs the supervisor's NATS link (feature `cluster`).
    let dir = tempfile::tempdir().unwrap();
    let across = dir.path().join("across.yaml");
    std::fs::write(
        &across,
        "swarm: { name: across }\ncluster: { nats: \"nats://127.0.0.1:4222\" }\nmodels:\n  \
         s: { provider: scripted, rules: [ { reply: hi } ] }\nagents:\n  \
         - { name: a, role: worker, model: s }\n  - { name: b, role: worker, model: s, host: gpu }\n",
    )
    .unwrap();
    assert_eq!(needs_of(&across), ["cluster"], "scripted models on two hosts");
}

fn validate(file: &std::path::Path) -> (Option<i32>, String) {
    let mut cmd = Command::new(bin("flock-supervisor"));
    cmd.arg("validate").arg(file);
    let out = run(&mut cmd, SHORT);
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn stop_start_and_down_keep_durable_mail_and_end_every_process() {
    let yaml = format!(
        "swarm:\n  name: lifecycle\nmodels:\n{}agents:\n  - {{name: keeper, role: worker, model: m}}\n  \
         - {{name: napper, role: worker, model: m}}\n",
        answer_model("m", "got: {input}")
    );
    let mut swarm = Swarm::start(&yaml);
    let keeper = swarm.pid_of("keeper").unwrap();
    let napper = swarm.pid_of("napper").unwrap();

    // stop: answered once the process is gone.
    let out = swarm.ctl_ok(&["stop", "napper"]);
    assert!(out.contains("napper stopped"), "{out}");
    let row = swarm.agent("napper");
    assert_eq!(row["state"], "stopped", "{row}");
    assert!(row["pid"].is_null(), "{row}");
    assert!(!alive(napper), "napper (pid {napper}) still runs after `stop` returned");

    // A durable send to a stopped agent is accepted and waits in its mailbox.
    swarm.ctl_ok(&["send", "napper", "while you were out"]);
    let row = swarm.agent("napper");
    assert_eq!(
        (row["mailbox_depth"].as_u64(), row["turns_total"].as_u64()),
        (Some(1), Some(0)),
        "{row}"
    );

    // start: answered once it is ready; the mail is delivered then.
    let out = swarm.ctl_ok(&["start", "napper", "--json"]);
    let out: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((out["agent"].as_str(), out["action"].as_str()), (Some("napper"), Some("start")));
    assert!(out["message"].as_str().unwrap_or_default().contains("napper is ready"), "{out}");
    let new_pid = swarm.pid_of("napper").expect("napper runs again");
    assert_ne!(new_pid, napper);
    swarm.wait_for_log("napper", "reply \"got: while you were out\"", SHORT);
    swarm.wait_until(
        || swarm.agent("napper")["mailbox_depth"] == 0,
        SHORT,
        "napper's mailbox is empty",
    );
    assert_eq!(swarm.turns_total("napper"), 1);
    assert_eq!(count_lines(&swarm.log("napper"), &["while you were out", "attempt"]), 1);
    assert_eq!(swarm.pid_of("keeper"), Some(keeper), "stopping napper touched keeper");

    // down: every agent stops, then the supervisor exits 0 and removes its sockets.
    let pids = [keeper, new_pid];
    let status = swarm.down();
    assert!(status.success(), "the supervisor exited with {status}");
    for pid in pids {
        assert!(!alive(pid), "agent pid {pid} outlived `down`");
    }
    assert!(
        swarm.live_agent_pids().is_empty(),
        "agents outlived `down`: {:?}",
        swarm.live_agent_pids()
    );
    assert!(!swarm.control_socket().exists(), "down left the control socket behind");
    let out = swarm.ctl(&["ps"]);
    assert_eq!(out.status.code(), Some(1), "flockctl ps after down should fail");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no swarm is running"));
}

/// The state dir holds every message and everything agents saw: nobody else may read it
/// (issue #13: the database, WAL, logs and journal used to be 0644).
#[test]
fn the_state_dir_and_its_files_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let swarm = Swarm::start(
        "swarm: { name: private }\nmodels: { m: { provider: scripted, rules: [ { reply: ok } ] } }\nagents:\n  - { name: a, role: worker, model: m }\n",
    );
    swarm.ctl_ok(&["send", "a", "hello", "--wait"]);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let state = swarm.state_dir();
    assert_eq!(mode(state), 0o700, "{}", state.display());
    for entry in ["flock.db", "flock.db-wal", "logs/a.log", "logs"] {
        let p = state.join(entry);
        if p.exists() {
            let m = mode(&p);
            assert_eq!(m & 0o077, 0, "{} is {m:o}", p.display());
        }
    }
    assert!(state.join("flock.db").exists() && state.join("logs/a.log").exists());
}

/// `up --detach` on a state dir another supervisor holds fails with the reason, instead of
/// reporting the other one's answer as its own success (issue #13 item 6).
#[test]
fn up_detach_on_a_held_state_dir_says_who_holds_it() {
    let swarm = Swarm::start(
        "swarm: { name: held }\nmodels: { m: { provider: scripted, rules: [ { reply: ok } ] } }\nagents:\n  - { name: a, role: worker, model: m }\n",
    );
    let out = Command::new(bin("flock-supervisor"))
        .arg("up")
        .arg(swarm.swarm_file())
        .arg("--detach")
        .arg("--state-dir")
        .arg(swarm.state_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains("another flock-supervisor"), "{err}");
    // The running swarm is untouched.
    assert_eq!(swarm.state_of("a"), "ready");
}

/// `up --detach` prints every address it serves, with the port it got for a `:0`, and each
/// answers its health check.
#[test]
fn up_detach_prints_the_dashboard_and_metrics_urls_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("swarm.yaml");
    std::fs::write(
        &file,
        "swarm: { name: urls }\nmodels: { m: { provider: scripted, rules: [ { reply: ok } ] } }\nagents:\n  - { name: a, role: worker, model: m }\n",
    )
    .unwrap();
    let state = dir.path().join("state");
    let up = run(
        Command::new(bin("flock-supervisor"))
            .arg("up")
            .arg(&file)
            .args(["--detach", "--ui", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--state-dir"])
            .arg(&state),
        SHORT * 4,
    );
    let stdout = String::from_utf8_lossy(&up.stdout).into_owned();
    let down =
        || run(Command::new(bin("flockctl")).arg("--state-dir").arg(&state).arg("down"), SHORT * 4);
    let url = |prefix: &str| {
        stdout.lines().find_map(|l| l.strip_prefix(prefix)).map(str::to_owned).unwrap_or_default()
    };
    let (dashboard, metrics) = (url("dashboard: "), url("metrics: "));
    let health = |url: &str| {
        let addr = url.trim_start_matches("http://").split('/').next().unwrap_or_default();
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        use std::io::{Read, Write};
        s.write_all(
            format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out.starts_with("HTTP/1.1 200"))
    };
    let checks = (
        up.status.success(),
        dashboard.starts_with("http://127.0.0.1:") && dashboard.contains("/?token="),
        metrics.starts_with("http://127.0.0.1:") && metrics.ends_with("/metrics"),
        health(&dashboard),
        health(&metrics),
    );
    down();
    assert_eq!(checks, (true, true, true, Some(true), Some(true)), "{stdout}");
}

/// What the shell gets at a Tab after `words` (clap_complete's fish protocol: one candidate per
/// line, its help after a tab), from the swarm of `home`.
fn tab(home: &std::path::Path, words: &[&str]) -> String {
    let mut cmd = Command::new(bin("flockctl"));
    cmd.env("COMPLETE", "fish").env("FLOCK_HOME", home).args(["--", "flockctl"]).args(words);
    let out = run(&mut cmd, SHORT);
    assert!(out.status.success(), "{words:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn flockctl_prints_shell_completions_without_a_swarm() {
    let empty = tempfile::tempdir().unwrap();
    let nowhere = empty.path().join("nowhere");
    for shell in ["bash", "zsh", "fish"] {
        let out = run(
            Command::new(bin("flockctl"))
                .args(["completions", shell])
                // No state dir anywhere: completions need none.
                .env("FLOCK_HOME", &nowhere),
            SHORT,
        );
        assert!(out.status.success(), "{shell}: {}", String::from_utf8_lossy(&out.stderr));
        let script = String::from_utf8_lossy(&out.stdout);
        // The script asks this flockctl at each Tab.
        let me = bin("flockctl").display().to_string();
        assert!(script.contains(&me) && script.contains("COMPLETE"), "{shell}: {script}");
    }
    // Subcommands and options complete without a swarm; names of a swarm that is not there
    // complete to nothing, at once.
    let subs = tab(&nowhere, &["re"]);
    assert!(subs.lines().any(|l| l.starts_with("restart\t")), "{subs}");
    assert!(subs.lines().any(|l| l.starts_with("read\t")), "{subs}");
    let none = tab(&nowhere, &["restart", ""]);
    assert!(none.lines().all(|l| l.starts_with("--")), "only options: {none}");
    assert!(!nowhere.exists(), "a Tab creates no state dir");
    let out = run(Command::new(bin("flockctl")).args(["completions", "tcsh"]), SHORT);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("possible values"),
        "a bad shell names the good ones"
    );
}

/// `scripts/install` into a prefix off `PATH`: it says so, and the installed files alone run a swarm.
#[test]
fn scripts_install_puts_a_flock_on_the_path_that_runs_the_office_example_on_its_own() {
    // `scripts/install` with the binaries this test run built (`--bin-dir`: no release build in
    // a test), then only the installed files: the supervisor finds what it starts next to itself.
    let dir = tempfile::tempdir().unwrap();
    let prefix = dir.path().join("prefix");
    let out = run(
        Command::new(repo_root().join("scripts/install"))
            .arg("--prefix")
            .arg(&prefix)
            .arg("--no-model")
            .arg("--bin-dir")
            .arg(flock_testkit::bin_dir())
            .env("PATH", "/usr/local/bin:/usr/bin:/bin"),
        SHORT * 4,
    );
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{said}");
    assert!(said.contains("is not on your PATH: add"), "a prefix off PATH is named: {said}");
    let installed = prefix.join("bin");
    for b in ["flock-supervisor", "flockctl", "flock-agent", "flock-sandbox", "flock-bridge"] {
        assert!(installed.join(b).is_file(), "{b} installed: {said}");
    }
    assert!(!installed.join("flock-model").exists(), "--no-model leaves the model out");
    // --no-bridge leaves the chat bridge out (a swarm without `bridges:` never starts it).
    let lean = dir.path().join("lean");
    let out = run(
        Command::new(repo_root().join("scripts/install"))
            .args(["--no-model", "--no-bridge", "--bin-dir"])
            .arg(flock_testkit::bin_dir())
            .arg("--prefix")
            .arg(&lean),
        SHORT * 4,
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(lean.join("bin/flock-agent").is_file() && !lean.join("bin/flock-bridge").exists());
    let example = prefix.join("share/flock/examples/office.yaml");
    assert!(example.is_file() && prefix.join("share/flock/examples/transcripts").is_dir());

    let state = dir.path().join("state");
    let bare = |cmd: &mut Command| {
        for var in crate::BIN_OVERRIDES {
            cmd.env_remove(var);
        }
        cmd.env_remove("FLOCK_HOME");
        cmd.env("PATH", format!("{}:/usr/bin:/bin", installed.display()));
    };
    let mut up = Command::new(installed.join("flock-supervisor"));
    up.arg("up").arg(&example).arg("--detach").arg("--state-dir").arg(&state);
    bare(&mut up);
    let up = run(&mut up, SHORT * 4);
    assert!(up.status.success(), "{}", String::from_utf8_lossy(&up.stderr));
    let ctl = |args: &[&str]| {
        let mut c = Command::new(installed.join("flockctl"));
        c.arg("--state-dir").arg(&state).args(args);
        bare(&mut c);
        run(&mut c, SHORT * 4)
    };
    let ps = ctl(&["ps", "--json"]);
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&ps.stdout).unwrap_or_default();
    let agents: Vec<&serde_json::Value> = rows.iter().filter(|r| r["kind"] == "agent").collect();
    assert_eq!(agents.len(), 4, "{}", String::from_utf8_lossy(&ps.stdout));
    for a in &agents {
        assert_eq!(a["state"], "ready", "{a}");
        let exe = std::fs::read_link(format!("/proc/{}/exe", a["pid"])).unwrap_or_default();
        assert!(exe.starts_with(&installed), "{} runs {}", a["name"], exe.display());
    }
    let down = ctl(&["down", "--json"]);
    assert!(down.status.success(), "{}", String::from_utf8_lossy(&down.stderr));
    let said: serde_json::Value = serde_json::from_slice(&down.stdout).unwrap_or_default();
    assert_eq!(said["stopped"], true, "{}", String::from_utf8_lossy(&down.stdout));
}

#[test]
fn flockctl_init_writes_a_swarm_up_starts_edits_it_on_a_rerun_and_never_overwrites_a_hand_edit() {
    use flock_testkit::fake_llm::{FakeLlm, FakeProvider, Reply};
    // An OpenAI-compatible server (the fake speaks its wire format), chosen by URL as a person
    // with an Ollama server would.
    let fake = FakeLlm::start(FakeProvider::OpenAi);
    fake.serve_models(&["qwen2.5:7b", "llama3.2:3b"]);
    fake.always(Reply::Text("Monday: the meetup. Friday: the release.".into()));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("team").join("flock.yaml");
    let init = |extra: &[&str]| {
        let mut cmd = Command::new(bin("flockctl"));
        cmd.arg("init").arg(&file).args(extra).env_remove("FLOCK_HOME");
        run(&mut cmd, SHORT * 2)
    };
    let url = fake.base_url();
    let out =
        init(&["--model", &url, "--model-id", "qwen2.5:7b", "--name", "home", "--yes", "--json"]);
    let said: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("init --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(
        (said["swarm"].as_str(), said["agents"].as_u64()),
        (Some("home"), Some(7)),
        "{said}"
    );
    assert_eq!(said["warnings"], serde_json::json!([]), "the server lists the model: {said}");

    let validate = run(Command::new(bin("flock-supervisor")).arg("validate").arg(&file), SHORT);
    let ok = String::from_utf8_lossy(&validate.stdout);
    assert!(validate.status.success() && ok.contains("swarm `home` with 7 agents"), "{ok}");
    let swarm = Swarm::builder_from_file(&file).start();
    let answer = swarm.ctl_ok(&["send", "coordinator", "Plan my week", "--wait"]);
    assert!(answer.contains("Friday: the release."), "{answer}");
    drop(swarm);

    // A re-run edits the file init wrote: what the flags say changes, the rest stays.
    let again = init(&["--team", "project", "--model", "local", "--yes", "--json"]);
    let said: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap_or_default();
    assert_eq!(said["action"], "changed", "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(
        said["changes"],
        serde_json::json!([
            "team assistant → project",
            format!("model {url} → local"),
            "model id qwen2.5:7b → none"
        ])
    );
    let bak = std::fs::read_to_string(format!("{}.bak", file.display())).unwrap();
    assert!(bak.contains("name: home") && bak.contains(&url), "{bak}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("role: orchestrator") && text.contains("provider: local"), "{text}");
    assert!(text.contains("name: home"), "the name it was not told to change stays: {text}");
    let same = init(&["--yes"]);
    let out = String::from_utf8_lossy(&same.stdout);
    assert!(same.status.success() && out.contains("already says that"), "{out}");

    // Never over a hand edit without --force; with it, the edited one is kept.
    std::fs::write(&file, text.replace("Writes the code", "Writes careful code")).unwrap();
    let again = init(&["--model", "local-small", "--yes"]);
    let err = String::from_utf8_lossy(&again.stderr);
    assert_eq!(again.status.code(), Some(1), "{err}");
    assert!(
        err.contains("was changed since init wrote it: init does not write over it")
            && err.contains("--force"),
        "{err}"
    );
    let forced = init(&["--model", "local-small", "--yes", "--force"]);
    assert!(forced.status.success(), "{}", String::from_utf8_lossy(&forced.stderr));
    let bak = std::fs::read_to_string(format!("{}.bak", file.display())).unwrap();
    assert!(bak.contains("Writes careful code"), "{bak}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("model: qwen2.5-coder-0.5b") && text.contains("name: home"), "{text}");

    // Choices that are not ones say what is; nothing is written.
    let other = dir.path().join("other.yaml");
    for (args, says) in [
        (vec!["--model", "ollama"], "--model http://127.0.0.1:11434/v1"),
        (vec!["--model", &url], "--model-id"),
        (vec!["--name", "Bad_Name"], "use lowercase letters, digits and `-`"),
    ] {
        let mut cmd = Command::new(bin("flockctl"));
        cmd.arg("init").arg(&other).args(&args).arg("--yes");
        let out = run(&mut cmd, SHORT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!other.exists(), "{args:?} wrote a file");
    }
    // A model the server does not list, or a server that is not there, is written with a note.
    let mut cmd = Command::new(bin("flockctl"));
    cmd.arg("init").arg(&other).args(["--model", &url, "--model-id", "qwen3:8b", "--yes"]);
    let out = run(&mut cmd, SHORT);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("does not list `qwen3:8b`; it lists: qwen2.5:7b, llama3.2:3b"), "{said}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let gone = dir.path().join("gone.yaml");
    let mut cmd = Command::new(bin("flockctl"));
    cmd.arg("init").arg(&gone).arg("--model").arg(format!("http://{closed}/v1"));
    let out = run(cmd.args(["--model-id", "m", "--yes"]), SHORT);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && gone.is_file(), "{said}");
    assert!(
        said.contains("could not be asked for its models") && said.contains("refused"),
        "{said}"
    );
}

/// `flockctl init` on a terminal, as a person meets it: it asks for the team (arrow keys), the
/// swarm's name and a chat; the office it writes validates, starts, and answers at once.
#[test]
fn flockctl_init_on_a_terminal_asks_and_the_office_it_writes_answers_at_once() {
    use flock_testkit::pty::{DOWN, ENTER, Pty};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flock.yaml");
    let mut cmd = Command::new(bin("flockctl"));
    cmd.arg("init").arg(&file).env_remove("FLOCK_HOME").env("TERM", "xterm");
    let mut term = Pty::spawn(&mut cmd).expect("start flockctl init on a pseudo-terminal");
    term.expect("writes the swarm file", SHORT);
    term.expect("office", SHORT); // the team list: assistant (chosen), project, office
    term.send(DOWN);
    term.send(DOWN);
    term.send(ENTER);
    term.expect("swarm name", SHORT); // no model question: the office runs scripted models
    term.send("front-desk");
    term.send(ENTER);
    term.expect("chat", SHORT);
    term.expect("slack", SHORT);
    term.send(ENTER); // none
    let (status, said) = term.wait(SHORT * 2);
    assert!(status.success(), "{said}");
    assert!(said.contains("the office team (4 agents) on scripted models (no LLM)"), "{said}");
    assert!(said.contains("flockctl send orchestrator \"build the login page\" --wait"), "{said}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("# flockctl init --team office --model scripted --name front-desk"));
    assert!(!text.contains("bridges:"), "no chat was picked:\n{text}");

    let validate = run(Command::new(bin("flock-supervisor")).arg("validate").arg(&file), SHORT);
    let ok = String::from_utf8_lossy(&validate.stdout);
    assert!(validate.status.success() && ok.contains("swarm `front-desk` with 4 agents"), "{ok}");
    let swarm = Swarm::builder_from_file(&file).start();
    let answer = swarm.ctl_ok(&["send", "orchestrator", "build the login page", "--wait"]);
    assert!(answer.contains("orchestrator: job dispatched"), "{answer}");
}

/// The first hour with a chat: `flockctl init --bridge telegram` checks the bot's token with
/// Telegram (through `flock-bridge check`, the bridge's own client; a refused token writes
/// nothing), keeps it in a private .env, and the swarm it wrote starts with the token taken from
/// that file alone and answers a person in the group.
#[test]
fn flockctl_init_connects_a_chat_checking_its_token_and_up_answers_there_from_the_env_file() {
    use flock_testkit::fake_llm::{FakeLlm, FakeProvider, Reply};
    use flock_testkit::fake_telegram::FakeTelegram;
    use std::os::unix::fs::PermissionsExt;
    const CHAT: i64 = -1001234;
    let tg = FakeTelegram::start("123:right-token");
    tg.add_chat(CHAT, "the team");
    let llm = FakeLlm::start(FakeProvider::OpenAi);
    llm.serve_models(&["m"]);
    llm.always(Reply::Text("Paris.".into()));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("flock.yaml");
    let env_file = dir.path().join(".env");
    let (url, api) = (llm.base_url(), tg.base_url());
    let chat = CHAT.to_string();
    let init = |token: &str| {
        let mut cmd = Command::new(bin("flockctl"));
        cmd.arg("init").arg(&file).args(["--model", &url, "--model-id", "m", "--yes", "--json"]);
        cmd.args(["--bridge", "telegram", "--chat", &chat, "--bridge-url", &api]);
        run(cmd.env("TELEGRAM_BOT_TOKEN", token).env_remove("FLOCK_HOME"), SHORT * 2)
    };

    let refused = init("123:wrong");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{err}");
    assert!(err.contains("telegram refused the token in TELEGRAM_BOT_TOKEN"), "{err}");
    assert!(!file.exists() && !env_file.exists(), "a refused token writes nothing");

    let out = init("123:right-token");
    let said: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("init --json: {e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(said["bridge"]["platform"], "telegram", "{said}");
    assert!(said["bridge"]["bot"].as_str().is_some_and(|b| b.starts_with('@')), "{said}");
    assert_eq!(said["warnings"], serde_json::json!([]), "{said}");
    let kept = std::fs::read_to_string(&env_file).unwrap();
    assert_eq!(kept, "TELEGRAM_BOT_TOKEN=123:right-token\n");
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the token's file is private");
    let yaml = std::fs::read_to_string(&file).unwrap();
    assert!(!yaml.contains("right-token"), "the token stays out of the swarm file: {yaml}");

    // Started without the token in its environment: the .env gives it to the bridge.
    let swarm = Swarm::builder_from_file(&file).start();
    swarm.wait_until(
        || swarm.ctl_ok(&["bridge", "ls", "--json"]).contains("\"connected\""),
        SHORT * 4,
        "the bridge connects with the token from .env",
    );
    let asked = tg.post(CHAT, 42, "Ada", Some("ada"), "What is the capital of France?");
    let sent = tg.wait_sent(CHAT, 1, SHORT * 4);
    assert!(
        sent.iter().any(|m| m.plain == "[coordinator] Paris." && m.reply_to == Some(asked)),
        "the answer, as a reply to the question: {sent:?}"
    );
}

/// Issue #27: a mistyped `--state-dir` for the commands that read what a swarm left (journal,
/// memory) is an error that names the folder; nothing is created there.
#[test]
fn journal_and_memory_refuse_a_state_dir_that_is_not_there() {
    let empty = tempfile::tempdir().unwrap();
    let typo = empty.path().join("flokc");
    let file = empty.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for args in [["journal", "read"], ["memory", "stats"]] {
        let out =
            run(Command::new(bin("flockctl")).arg("--state-dir").arg(&typo).args(args), SHORT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("no swarm state at") && err.contains("flokc"), "{args:?}: {err}");
        assert!(!typo.exists(), "{args:?} created {}", typo.display());
        let out =
            run(Command::new(bin("flockctl")).arg("--state-dir").arg(&file).args(args), SHORT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is a file, not a state dir"), "{args:?}: {err}");
    }
}

/// The README's exit-code table, row by row, on several commands each: 0 done, 1 refused (with
/// `flockctl: …` on stderr and nothing on stdout), 2 a wrong command line (with the usage).
/// (3, 4 and 5 belong to `send --wait`: chains.rs and delivery.rs check them.)
#[test]
fn exit_codes_follow_the_table_on_every_kind_of_command() {
    let yaml = format!(
        "swarm: {{ name: codes }}\nmodels:\n{}agents:\n  - {{ name: worker, role: worker, model: m }}\n",
        answer_model("m", "done: {input}")
    );
    let swarm = Swarm::start(&yaml);
    let code = |args: &[&str]| {
        let out = swarm.ctl(args);
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), stdout.into_owned(), stderr.into_owned())
    };
    for args in [
        &["ps"][..],
        &["ps", "--json"],
        &["channels", "--json"],
        &["dead-letters", "--json"],
        &["approvals", "--json"],
        &["send", "worker", "hello", "--wait"],
        &["restart", "worker"],
    ] {
        let (c, out, err) = code(args);
        assert_eq!(c, Some(0), "{args:?}: {err}");
        if args.contains(&"--json") {
            let doc: Result<serde_json::Value, _> = serde_json::from_str(&out);
            assert!(doc.is_ok(), "{args:?}: one JSON document, got {out:?}");
        }
    }
    for args in [
        &["stop", "nobody"][..],
        &["start", "nobody"],
        &["restart", "nobody", "--json"],
        &["send", "nobody", "hi"],
        &["session", "show", "nobody"],
        &["read", "#nowhere"],
        &["channel", "archive", "#nowhere"],
        &["approve", "999"],
        &["deny", "999", "--json"],
        &["logs", "nobody"],
    ] {
        let (c, out, err) = code(args);
        assert_eq!(c, Some(1), "{args:?}: refused: {err}");
        assert!(err.starts_with("flockctl: ") && err.len() > 20, "{args:?}: why, on stderr: {err}");
        assert!(out.trim().is_empty(), "{args:?}: nothing on stdout: {out}");
    }
    for args in [
        &["ps", "--nope"][..],
        &["send"],
        &["approve", "abc"],
        &["read"],
        &["logs", "--lines", "many"],
    ] {
        let (c, _, err) = code(args);
        assert_eq!(c, Some(2), "{args:?}: a wrong command line: {err}");
        assert!(err.starts_with("error: "), "{args:?}: what is wrong: {err}");
        assert!(err.contains("Usage:") || err.contains("--help"), "{args:?}: where to look: {err}");
    }
    let up = run(Command::new(bin("flock-supervisor")).args(["up", "--nope"]), SHORT);
    assert_eq!(up.status.code(), Some(2), "{}", String::from_utf8_lossy(&up.stderr));
}

/// `flockctl memory search|show` on a running swarm is answered by the swarm's memory thread,
/// which holds the index (and the embedding model) warm (issue #29); with no swarm running,
/// flockctl reads the files itself; both find the same records and refuse the same mistakes.
#[test]
fn memory_reads_are_answered_by_the_running_swarm_and_from_the_files_without_one() {
    let yaml = format!(
        "swarm: {{ name: recall }}\nmodels:\n{}agents:\n  - {{ name: worker, role: worker, model: m }}\n",
        answer_model("m", "done")
    );
    let mut swarm = Swarm::start(&yaml);
    let knowledge = swarm.state_dir().join("memory/knowledge");
    std::fs::create_dir_all(&knowledge).unwrap();
    std::fs::write(
        knowledge.join("trips.md"),
        "# Trips\n\nThe Lisbon trip leaves on the 3rd of May from gate 12.\n",
    )
    .unwrap();
    let search = ["memory", "search", "Lisbon trip", "--mode", "bm25", "--kind", "knowledge"];
    let found = swarm.ctl_ok(&search);
    assert!(
        found.contains("gate 12") && found.contains("(searched by the running swarm)"),
        "{found}"
    );
    let hits = swarm.ctl_ok(&[&search[..], &["--json"]].concat());
    let hits: serde_json::Value = serde_json::from_str(&hits).unwrap();
    let id = hits[0]["id"].as_str().expect("a hit").to_owned();
    let shown = swarm.ctl_ok(&["memory", "show", &id]);
    assert!(shown.starts_with(&id) && shown.contains("gate 12"), "{shown}");
    let refused = |swarm: &Swarm, args: &[&str], why: &str| {
        let out = swarm.ctl(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    };
    refused(&swarm, &["memory", "search", "x", "--kind", "dreams"], "no memory kind `dreams`");
    refused(&swarm, &["memory", "show", "nope"], "no memory with id `nope`");
    refused(&swarm, &["memory", "search", "x", "--mode", "fuzzy"], "no search mode `fuzzy`");
    refused(&swarm, &["memory", "search", "x", "--since", "May"], "write YYYY-MM-DD");
    refused(&swarm, &["memory", "search", "x", "--priority", "urgent"], "no priority `urgent`");
    // Filters: priority (at least), category, dates.
    let observations = swarm.state_dir().join("memory/observations");
    std::fs::create_dir_all(&observations).unwrap();
    std::fs::write(
        observations.join("2026-11-20.md"),
        "## 09:00\nThe Lisbon hotel is booked.\n<!-- id: o-1 -->\n<!-- priority: high; category: decision -->\n---\n\n\
         ## 09:30\nThe Lisbon hotel has a pool.\n<!-- id: o-2 -->\n<!-- priority: low; category: fact -->\n---\n",
    )
    .unwrap();
    let ids = |args: &[&str]| {
        let base = ["memory", "search", "Lisbon hotel", "--mode", "bm25", "--all", "--json"];
        let out = swarm.ctl_ok(&[&base[..], args].concat());
        let hits: serde_json::Value = serde_json::from_str(&out).unwrap();
        let mut ids: Vec<String> =
            hits.as_array().unwrap().iter().map(|h| h["id"].as_str().unwrap().to_owned()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&["--kind", "observation"]), ["o-1", "o-2"]);
    assert_eq!(ids(&["--priority", "high"]), ["o-1"]);
    assert_eq!(ids(&["--category", "fact"]), ["o-2"]);
    assert_eq!(ids(&["--kind", "observation", "--until", "2026-11-20"]), ["o-1", "o-2"]);
    assert!(ids(&["--since", "2026-11-21"]).iter().all(|id| !id.starts_with("o-")));

    swarm.down();
    let here = swarm.ctl_ok(&search);
    assert!(here.contains("gate 12") && !here.contains("running swarm"), "{here}");
    let again = swarm.ctl_ok(&[&search[..], &["--json"]].concat());
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again[0]["id"].as_str(), Some(id.as_str()));
    refused(&swarm, &["memory", "show", "nope"], "no memory with id `nope`");
    // An export: JSON Lines, newest first, with the same filters.
    let export = swarm.ctl_ok(&["memory", "export", "--kind", "observation,knowledge"]);
    let lines: Vec<serde_json::Value> =
        export.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 3, "{export}");
    assert!(lines.iter().any(|l| l["text"].as_str().unwrap_or("").contains("gate 12")));
    let high = swarm.ctl_ok(&["memory", "export", "--priority", "high", "--since", "2026-11-20"]);
    assert_eq!(high.lines().count(), 1, "{high}");
    assert!(high.contains(r#""id":"o-1""#) && high.contains(r#""tier":"#), "{high}");
    refused(&swarm, &["memory", "export", "--until", "soon"], "write YYYY-MM-DD");
}

#[test]
fn memory_day_files_move_to_warm_on_their_own_and_to_cold_when_a_person_approves() {
    use flock_ipc::time::{date_and_minute, unix_ms_now};
    let day = |ago: u64| date_and_minute(unix_ms_now() - ago * 86_400_000).0;
    let (recent, old, ancient) = (day(1), day(120), day(400));
    let obs = |id: &str, text: &str| format!("## 09:00\n{text}\n<!-- id: {id} -->\n---\n\n");
    let yaml = format!(
        "swarm: {{ name: tiers }}\nmodels:\n{}agents:\n  - {{ name: worker, role: worker, model: m }}\n",
        answer_model("m", "done")
    );
    let (hot_obs, old_obs, ancient_journal) = (
        format!("memory/observations/{recent}.md"),
        format!("memory/observations/{old}.md"),
        format!("memory/journals/{ancient}.md"),
    );
    let swarm = Swarm::builder(&yaml)
        .file(format!("state/{hot_obs}"), &obs("o-recent", "The Porto office opens at nine."))
        .file(format!("state/{old_obs}"), &obs("o-old", "The Porto office moved to Rua Nova."))
        .file(format!("state/{ancient_journal}"), "09:00 | find the Porto lease | found | signed\n")
        .start();
    let state = swarm.state_dir().to_path_buf();
    let json = |args: &[&str]| -> serde_json::Value {
        serde_json::from_str(&swarm.ctl_ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let memory = state.join("memory");
    // At start the TTL job moved what is past 90 days to warm, no one asked …
    swarm.wait_until(
        || memory.join("warm/journals").join(format!("{ancient}.md")).exists(),
        SHORT,
        "the old day files move to warm at start",
    );
    assert!(memory.join(format!("warm/observations/{old}.md")).exists());
    assert!(!state.join(&old_obs).exists() && state.join(&hot_obs).exists());
    // … and asked a person about what is past 365 days, which stays warm until then.
    let mut asked = serde_json::Value::Null;
    swarm.wait_until(
        || {
            let open = json(&["approvals", "--json"]);
            asked = open
                .as_array()
                .and_then(|a| a.iter().find(|r| r["capability"] == "archive"))
                .cloned()
                .unwrap_or_default();
            !asked.is_null()
        },
        SHORT,
        "a request to move warm memory to cold",
    );
    assert_eq!(
        (asked["agent"].as_str(), asked["state"].as_str()),
        (Some("flock:memory"), Some("waiting"))
    );
    assert!(asked["reason"].as_str().unwrap().contains("1 day files (1 records"), "{asked}");
    let tiers = || json(&["memory", "stats", "--json"])["tiers"].clone();
    assert_eq!(tiers(), serde_json::json!({"hot": 1, "warm": 2, "cold": 0}));
    let journal = swarm.ctl_ok(&["journal", "read", "--last", "50", "--json"]);
    assert!(
        journal.contains("MEMORY_TIERED") && journal.contains("moved 2 memory day files"),
        "{journal}"
    );

    // A person approves: the file moves to cold, out of the default search.
    let id = asked["id"].to_string();
    let approved = swarm.ctl_ok(&["approve", &id]);
    assert!(approved.contains("granted"), "{approved}");
    swarm.wait_until(
        || memory.join("cold/journals").join(format!("{ancient}.md")).exists(),
        SHORT,
        "the approved file moves to cold",
    );
    assert!(!memory.join(format!("warm/journals/{ancient}.md")).exists());
    assert_eq!(tiers(), serde_json::json!({"hot": 1, "warm": 1, "cold": 1}));
    let found = |extra: &[&str]| -> Vec<String> {
        let base = ["memory", "search", "Porto", "--mode", "bm25", "--json"];
        let hits = json(&[&base[..], extra].concat());
        hits.as_array()
            .unwrap()
            .iter()
            .map(|h| format!("{} {}", h["tier"].as_str().unwrap(), h["kind"].as_str().unwrap()))
            .collect()
    };
    let mut default = found(&[]);
    default.sort();
    assert_eq!(default, ["hot observation", "warm observation"]);
    assert!(found(&["--all"]).contains(&"cold journal".to_string()));

    // The way back, by hand: a dry run moves nothing; then everything comes back hot.
    let dry = swarm.ctl_ok(&["memory", "archive", "--to", "hot", "--from", "cold", "--dry-run"]);
    assert!(dry.contains("would move 1 day files (1 records) to hot"), "{dry}");
    assert!(memory.join(format!("cold/journals/{ancient}.md")).exists());
    let back = json(&["memory", "archive", "--to", "hot", "--json"]);
    assert_eq!(back["files"].as_array().map(Vec::len), Some(2), "{back}");
    assert!(state.join(&ancient_journal).exists() && state.join(&old_obs).exists());
    assert_eq!(tiers(), serde_json::json!({"hot": 3, "warm": 0, "cold": 0}));
    let config = json(&["memory", "config", "--json"]);
    assert_eq!(config["tiers"]["warm_after_days"], 90, "{config}");
    assert_eq!(config["from"], "the running swarm");
    let out = swarm.ctl(&["memory", "archive", "--to", "attic"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no tier `attic`; tiers: hot, warm, cold")
    );
}

#[test]
fn down_with_nothing_running_is_done_but_a_missing_state_dir_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let down = |state: &std::path::Path| {
        run(Command::new(bin("flockctl")).arg("--state-dir").arg(state).arg("down"), SHORT)
    };
    let out = down(dir.path());
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("nothing to stop"));
    let out = run(
        Command::new(bin("flockctl")).arg("--state-dir").arg(dir.path()).args(["down", "--json"]),
        SHORT,
    );
    let said: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(said["stopped"], false, "one JSON document: {said}");
    let typo = dir.path().join("flokc");
    let out = down(&typo);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no swarm state at"), "{err}");
}

#[test]
fn up_refuses_a_state_dir_that_is_a_file_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let mut up = Command::new(bin("flock-supervisor"));
    up.arg("up").arg(repo_root().join("examples/office.yaml")).arg("--state-dir").arg(&file);
    let out = run(&mut up, SHORT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is a file, not a state dir") && !err.contains("os error"), "{err}");
}
