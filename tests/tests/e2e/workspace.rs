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

    // A coordinator may not touch files, whatever its model asks.
    swarm.ctl_ok(&["send", "boss", "write a file", "--wait"]);
    assert!(swarm.log("boss").contains("FORBIDDEN: a coordinator may not use fs_write"));
    assert!(!swarm.state_dir().join("workspaces/boss/boss.txt").exists());
}
