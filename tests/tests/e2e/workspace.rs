//! Workspace tools (issue #11 item 1): a worker writes, reads, lists, searches and patches files
//! in its own workspace; the kernel (openat2 RESOLVE_BENEATH) keeps it there; every write is
//! journaled with its path and size in the chain of the request; other roles may not touch files.

use flock_testkit::Swarm;

#[test]
fn a_worker_writes_and_reads_its_workspace_and_nothing_outside_it() {
    let yaml = r#"swarm: { name: files }
models:
  writer:
    provider: scripted
    rules:
      - steps:
          - tool: fs_write
            args: { path: notes/plan.md, content: "1. install Go\n2. hello world\n" }
          - tool: fs_patch
            args: { path: notes/plan.md, diff: "@@ -1,2 +1,3 @@\n 1. install Go\n 2. hello world\n+3. a small CLI\n" }
          - tool: fs_read
            args: { path: notes/plan.md }
          - tool: fs_read
            args: { path: ../../flock.db }
          - tool: fs_write
            args: { path: /tmp/flock-escape.txt, content: "x" }
          - tool: fs_search
            args: { query: "hello" }
        reply: "done"
  boss:
    provider: scripted
    rules:
      - steps: [ { tool: fs_write, args: { path: boss.txt, content: "x" } } ]
        reply: "tried"
agents:
  - { name: writer, role: worker, model: writer }
  - { name: boss, role: coordinator, model: boss }
"#;
    let swarm = Swarm::start(yaml);
    let out = swarm.ctl(&["send", "writer", "plan learning Go", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let end: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let file = swarm.state_dir().join("workspaces/writer/notes/plan.md");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "1. install Go\n2. hello world\n3. a small CLI\n"
    );
    let log = swarm.log("writer");
    assert!(log.contains("tool fs_read {\"path\":\"notes/plan.md\"} → ok"), "{log}");
    assert!(
        log.contains("tool fs_read {\"path\":\"../../flock.db\"} → error: \"FORBIDDEN"),
        "{log}"
    );
    assert!(log.contains("/tmp/flock-escape.txt\"} → error: \"FORBIDDEN"), "{log}");
    assert!(log.contains("notes/plan.md:2: 2. hello world"), "{log}");
    assert!(!std::path::Path::new("/tmp/flock-escape.txt").exists());

    // Every write is in the journal, in the request's chain, with its path and size.
    let chain = end["chain"].as_str().unwrap();
    let writes =
        swarm.ctl_ok(&["journal", "query", &format!("corr={chain} type=FILE_WRITE"), "--json"]);
    assert_eq!(writes.matches("\"type\":\"FILE_WRITE\"").count(), 2, "{writes}");
    assert!(
        writes.contains("\"path\":\"notes/plan.md\"")
            && writes.contains("\"bytes\":29")
            && writes.contains("\"bytes\":44"),
        "{writes}"
    );

    // A coordinator may not touch files, whatever its model asks. (A request that names a file
    // would be handed to the worker by the runtime before its model is asked: this one does not.)
    swarm.ctl_ok(&["send", "boss", "do it now", "--wait"]);
    assert!(swarm.log("boss").contains("FORBIDDEN: a coordinator may not use fs_write"));
    assert!(!swarm.state_dir().join("workspaces/boss/boss.txt").exists());
}

/// The data tools (issue #24): added as one entry of the tool table plus a handler, they run
/// in the worker on its workspace, only when its `tools:` lists them, and a model that calls one
/// it was not given is refused by the agent, whatever it asks.
#[test]
fn a_worker_queries_json_and_transforms_text_when_its_tools_list_them() {
    let yaml = r#"swarm: { name: data }
models:
  analyst:
    provider: scripted
    rules:
      - steps:
          - tool: fs_write
            args: { path: orders.json, content: "{\"orders\": [{\"id\": 7, \"total\": 12.5}, {\"id\": 9, \"total\": 30}]}" }
          - tool: json_query
            args: { path: orders.json, query: "orders[*].total" }
          - tool: text_transform
            args: { text: "Quarterly Report: Q3!", op: slug }
        reply: "done"
  plain:
    provider: scripted
    rules:
      - steps: [ { tool: json_query, args: { json: "{}", query: "" } } ]
        reply: "tried"
agents:
  - { name: analyst, role: worker, model: analyst, tools: [fs_write, json_query, text_transform] }
  - { name: plain, role: coordinator, model: plain }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "analyst", "sum the orders", "--wait"]);
    let log = swarm.log("analyst");
    assert!(
        log.contains("tool json_query") && log.contains("→ ok: \"[\\n  12.5,\\n  30\\n]\""),
        "{log}"
    );
    assert!(log.contains("→ ok: \"quarterly-report-q3\""), "{log}");
    swarm.ctl_ok(&["send", "plain", "look", "--wait"]);
    let log = swarm.log("plain");
    assert!(log.contains("FORBIDDEN: a coordinator may not use json_query"), "{log}");
}

/// `exec` (issue #11 item 2): a worker writes a test script and runs it in the native sandbox;
/// the exit status and output come back to its model, every command is journaled in the chain
/// and logged; the sandbox refuses what lies outside the workspace.
#[test]
fn a_worker_runs_commands_in_the_sandbox() {
    runs_commands("");
}

/// The same on the Docker backend (`sandbox: docker`), where a Docker engine answers.
#[test]
fn a_worker_runs_commands_in_a_docker_sandbox() {
    let engine = std::process::Command::new("docker").arg("info").output();
    if !engine.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED: no Docker engine answers here (the docker backend is not tested)");
        return;
    }
    runs_commands(", sandbox: docker");
}

fn runs_commands(sandbox: &str) {
    let yaml = r#"swarm: { name: exec }
models:
  builder:
    provider: scripted
    rules:
      - steps:
          - tool: fs_write
            args: { path: test.sh, content: "echo running tests; [ \"$(cat answer.txt)\" = 42 ] && echo PASS" }
          - tool: exec
            args: { command: "echo 42 > answer.txt && sh test.sh" }
          - tool: exec
            args: { command: "cat ../../flock.db; cat /etc/shadow" }
          - tool: exec
            args: { command: "sleep 30", timeout_secs: 1 }
        reply: "done"
agents:
  - { name: builder, role: worker, model: builder SANDBOX }
"#
    .replace(" SANDBOX", sandbox);
    let swarm = Swarm::start(&yaml);
    let backend = if sandbox.is_empty() { "native" } else { "docker" };
    assert_eq!(swarm.agent("builder")["sandbox"], backend);
    let out = swarm.ctl(&["send", "builder", "run the tests", "--wait", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let end: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();

    let log = swarm.log("builder");
    assert!(log.contains("exec `echo 42 > answer.txt && sh test.sh` → exit 0"), "{log}");
    assert!(log.contains("running tests\\nPASS"), "{log}");
    assert!(log.contains("exec `cat ../../flock.db; cat /etc/shadow` → exit 1"), "{log}");
    assert!(log.contains("exec `sleep 30` → timed out after 1 s"), "{log}");
    assert_eq!(
        std::fs::read_to_string(swarm.state_dir().join("workspaces/builder/answer.txt")).unwrap(),
        "42\n"
    );

    let chain = end["chain"].as_str().unwrap();
    let execs = swarm.ctl_ok(&["journal", "query", &format!("corr={chain} type=EXEC"), "--json"]);
    assert_eq!(execs.matches("\"type\":\"EXEC\"").count(), 3, "{execs}");
    assert!(execs.contains("\"exit\":0") && execs.contains("\"exit\":1"), "{execs}");
}

/// The memory tools (issue #24: owned by the memory index in the tool table, errors typed end
/// to end): what a worker remembers is found by its search through the router, and a wrong id
/// comes back to its model as a coded error.
#[test]
fn a_worker_remembers_finds_it_and_gets_a_coded_error_for_a_wrong_id() {
    let yaml = r#"swarm: { name: recall }
models:
  keeper:
    provider: scripted
    rules:
      - steps:
          - tool: memory_remember
            args: { text: "Ana prefers tabs over spaces.", priority: high, category: preference }
          - tool: memory_search
            args: { query: "tabs" }
          - tool: memory_get
            args: { id: "no-such-id" }
        reply: "done"
agents:
  - { name: keeper, role: worker, model: keeper, tools: [memory_remember, memory_search, memory_get] }
"#;
    let swarm = Swarm::start(yaml);
    swarm.ctl_ok(&["send", "keeper", "remember this", "--wait"]);
    let log = swarm.log("keeper");
    // The search finds the record the remember call wrote (by its id: the log clips texts).
    let line = |tool: &str| log.lines().find(|l| l.contains(tool)).unwrap_or_default().to_owned();
    let remembered = line("tool memory_remember");
    let id = remembered.split(", id ").nth(1).and_then(|r| r.get(..32)).expect("an id");
    let search = line("tool memory_search");
    assert!(search.contains("→ ok") && search.contains(id), "{log}");
    assert!(
        log.contains(
            "→ error: \"BAD_REQUEST: no memory with id `no-such-id` (a search lists ids: memory_search; \
             for a person, `flockctl memory search WORDS`)\""
        ),
        "{log}"
    );
}
