//! One swarm on several hosts (issue #26): two supervisors with their own state dirs, linked by a
//! real `nats-server -js`, each running the agents the swarm file places on it. A person's
//! request to the coordinator on one host is answered by the worker on the other; durable
//! messages between hosts arrive once and in order when either supervisor is killed with
//! `kill -9` while they flow; `flockctl ps` on any host shows every host and its agents, and a
//! host that died as lost, with the mail waiting for it.

use flock_testkit::Swarm;
use flock_testkit::fake_telegram::FakeTelegram;
use flock_testkit::nats::{Broker, available};

use crate::{LONG, SHORT};

/// Both hosts' secret (`cluster.secret_env`'s default variable).
const SECRET: (&str, &str) = ("FLOCK_CLUSTER_SECRET", "e2e-cluster-secret");

/// Host `host` (`None`: the leader) of the swarm file `yaml`, with the swarm's secret.
fn host(yaml: &str, host: Option<&str>) -> Swarm {
    let b = Swarm::builder(yaml).env(SECRET.0, SECRET.1);
    match host {
        Some(h) => b.up_args(&["--host", h]).start(),
        None => b.start(),
    }
}

/// The same swarm file on both hosts: `main` (the leader) and `gpu`.
fn two_hosts(url: &str, models: &str, agents: &str) -> String {
    format!(
        "swarm: {{ name: two-hosts }}\ncluster: {{ nats: \"{url}\" }}\nmodels:\n{models}agents:\n{agents}"
    )
}

/// A coordinator on `main` that hands every request to a worker on `gpu`, which answers
/// `worker_reply`.
fn coordinator_and_worker(url: &str, worker_reply: &str) -> String {
    two_hosts(
        url,
        &format!(
            "  coord:\n    provider: scripted\n    rules:\n      - reply: \"the coordinator's own answer\"\n  \
             work:\n    provider: scripted\n    rules:\n      - reply: \"{worker_reply}\"\n"
        ),
        "  - { name: coordinator, role: coordinator, model: coord, can_call: [worker], delegate: always }\n  \
         - { name: worker, role: worker, model: work, host: gpu }\n",
    )
}

/// `flockctl send AGENT TEXT --wait --json` on `swarm`: (exit code, how the chain ended).
fn send_wait(swarm: &Swarm, agent: &str, text: &str) -> (Option<i32>, serde_json::Value) {
    let out = swarm.ctl(&["send", agent, text, "--wait", "--json", "--timeout", "60"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let end = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    (out.status.code(), end)
}

#[test]
fn a_request_on_one_host_is_answered_by_a_worker_on_another() {
    let Some(bin) = available("cluster: request across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = coordinator_and_worker(&broker.url(), "the gpu host did: {input}");
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));
    // Each host runs its own agents only (and shows the other's, on the other host).
    let placed = |s: &Swarm| -> Vec<String> {
        let field = |a: &serde_json::Value, k: &str| a[k].as_str().unwrap_or_default().to_owned();
        s.agents().iter().map(|a| format!("{}@{}", field(a, "name"), field(a, "host"))).collect()
    };
    assert_eq!(placed(&main), ["coordinator@main", "worker@gpu"]);
    assert_eq!(placed(&gpu), ["worker@gpu", "coordinator@main"]);

    let (code, end) = send_wait(&main, "coordinator", "what is 2 + 2?");
    assert_eq!(code, Some(0), "{end}");
    let text = end["text"].as_str().unwrap_or_default();
    assert!(text.contains("the gpu host did:") && text.contains("what is 2 + 2?"), "{end}");
    assert_eq!(gpu.turns_total("worker"), 1, "one turn on the gpu host");
    // One chain across both hosts: the person's send, the hand-over, the worker's result.
    assert_eq!(end["hops"], 3, "{end}");
    // The person's DM on the host they asked holds the answer once.
    let dm = main.ctl_ok(&["read", "dm-coordinator--human-operator", "--json"]);
    assert_eq!(dm.matches("the gpu host did:").count(), 1, "{dm}");
    // The leader's journal tells the whole chain, the hops run on gpu included (marked so).
    let chain = end["chain"].as_str().unwrap_or_default().to_owned();
    let story = || main.ctl_ok(&["journal", "query", &format!("corr={chain}"), "--json"]);
    main.wait_until(
        || {
            let events: Vec<serde_json::Value> = serde_json::from_str(&story()).unwrap_or_default();
            events.iter().any(|e| e["agent"] == "worker" && e["action"]["params"]["host"] == "gpu")
        },
        SHORT,
        "the worker's hop on gpu in the leader's journal",
    );
    let story = story();
    assert!(story.contains("\"type\":\"DELEGATE\""), "{story}");
}

/// `flockctl` on the leader drives an agent on another host as if it ran there: a send (with
/// `--wait`), `stop`, `start`, `restart`, `logs`; the other host's `flockctl` drives only its
/// own agents unless `cluster.operators` lists it.
#[test]
fn flockctl_on_the_leader_drives_an_agent_on_another_host_and_another_host_only_its_own() {
    let Some(bin) = available("cluster: flockctl across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = coordinator_and_worker(&broker.url(), "the gpu worker read: {input}");
    let main =
        Swarm::builder(&yaml).env(SECRET.0, SECRET.1).up_args(&["--ui", "127.0.0.1:0"]).start();
    let gpu = host(&yaml, Some("gpu"));

    // A send from main to the worker on gpu: stored there, answered there, heard here.
    let (code, end) = send_wait(&main, "worker", "hello from main");
    assert_eq!(code, Some(0), "{end}");
    assert_eq!(end["text"], "the gpu worker read: hello from main", "{end}");
    assert_eq!((end["by"].as_str(), end["hops"].as_u64()), (Some("worker"), Some(1)), "{end}");
    assert_eq!(gpu.turns_total("worker"), 1, "one turn, on gpu");
    // Its answer is in the operator's DM, which the leader holds.
    let dm = main.ctl_ok(&["read", "dm-human-operator--worker", "--json"]);
    assert_eq!(dm.matches("the gpu worker read: hello from main").count(), 1, "{dm}");
    // Without --wait: accepted there, answered there.
    main.ctl_ok(&["send", "worker", "second"]);
    gpu.wait_until(|| gpu.turns_total("worker") == 2, SHORT, "the second send's turn on gpu");

    // Its log, read from main.
    let log = main.ctl_ok(&["logs", "worker", "--lines", "50"]);
    assert!(log.contains("hello from main"), "{log}");
    // Followed from main: its last lines, then each new one as gpu writes it.
    let live =
        crate::live_view::Live::spawn(crate::live_view::ctl(&main, &["logs", "worker", "-f"]));
    live.wait_for("the worker's last lines, from gpu", |t| t.contains("hello from main"));
    main.ctl_ok(&["send", "worker", "third, while followed"]);
    live.wait_for("the new turn's lines, from gpu", |t| t.contains("third, while followed"));
    drop(live);

    // Stop, start, restart from main: the process on gpu goes and comes back.
    let pid = gpu.pid_of("worker").expect("the worker runs on gpu");
    main.ctl_ok(&["stop", "worker"]);
    gpu.wait_until(|| gpu.state_of("worker") == "stopped", SHORT, "the worker stopped on gpu");
    main.ctl_ok(&["start", "worker"]);
    gpu.wait_until(|| gpu.state_of("worker") == "ready", LONG, "the worker ready again");
    let started = gpu.pid_of("worker");
    assert!(started.is_some() && started != Some(pid), "a new process: {started:?} vs {pid}");
    main.ctl_ok(&["restart", "worker"]);
    gpu.wait_until(
        || gpu.state_of("worker") == "ready" && gpu.pid_of("worker") != started,
        LONG,
        "the worker restarted on gpu",
    );
    // main's dashboard drives it too (its buttons use the same control path).
    let url = std::fs::read_to_string(main.state_dir().join("run/ui-url")).unwrap();
    let (addr, token) = url.trim().trim_start_matches("http://").split_once("/?token=").unwrap();
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, state) = crate::dashboard::get(addr, "/api/state", &bearer);
    assert!(status == 200 && state.contains(r#""drives_other_hosts":true"#), "{state}");
    let before = gpu.pid_of("worker");
    let restart = format!(
        "POST /api/agents/worker/restart HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: 2\r\n{bearer}\r\n{{}}"
    );
    let (status, body) = crate::dashboard::http(addr, &restart);
    assert_eq!(status, 200, "{body}");
    gpu.wait_until(
        || gpu.state_of("worker") == "ready" && gpu.pid_of("worker") != before,
        LONG,
        "the worker restarted on gpu from main's dashboard",
    );
    // The host that ran them journals who asked.
    let journal = gpu.ctl_ok(&["journal", "query", "type=AGENT_RESTART", "--json"]);
    let events: Vec<serde_json::Value> = serde_json::from_str(&journal).unwrap_or_default();
    let asked_by = |e: &serde_json::Value| e["action"]["params"]["from_host"] == "main";
    assert!(
        events.iter().any(|e| asked_by(e) && e["action"]["params"]["agent"] == "worker"),
        "{journal}"
    );

    // An agent the file places nowhere: the usual answer.
    let out = main.ctl(&["stop", "nobody"]);
    assert!(!out.status.success());

    // gpu is not in `cluster.operators` (the leader alone, by default): it drives only its own.
    for args in
        [&["send", "coordinator", "hi"][..], &["stop", "coordinator"], &["logs", "coordinator"]]
    {
        let out = gpu.ctl(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("runs on host `main`") && err.contains("cluster.operators"), "{err}");
    }
    assert_eq!(main.state_of("coordinator"), "ready");
    assert_eq!(main.turns_total("coordinator"), 0);
    // Its own agents it drives as before.
    gpu.ctl_ok(&["restart", "worker"]);
}

/// An agent created at run time on one host (`flockctl agent create` there) is known to the
/// others within seconds (each reads the others' statuses): `ps` on the leader shows it on its
/// host, the leader's flockctl reaches it, the coordinator's delegation too; decommissioned
/// there, it is gone here.
#[test]
fn an_agent_created_at_run_time_on_another_host_is_reached_from_the_others() {
    let Some(bin) = available("cluster: an agent created at run time") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = coordinator_and_worker(&broker.url(), "{input} — answered on gpu");
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));
    gpu.ctl_ok(&[
        "agent", "create", "helper", "--role", "worker", "--model", "work", "--as", "ana",
    ]);
    let on_main = || {
        let ps = main.ps();
        row(&ps, "agent", "helper").map(|r| (r["host"].clone(), r["state"].clone()))
    };
    main.wait_until(
        || on_main() == Some(("gpu".into(), "ready".into())),
        LONG,
        "the helper created on gpu shown ready on main",
    );
    let (code, end) = send_wait(&main, "helper", "hello helper");
    assert_eq!(code, Some(0), "{end}");
    assert_eq!(
        (end["text"].as_str(), end["by"].as_str()),
        (Some("hello helper — answered on gpu"), Some("helper"))
    );
    assert_eq!(gpu.turns_total("helper"), 1);

    gpu.ctl_ok(&["agent", "decommission", "helper", "--as", "ana"]);
    main.wait_until(|| on_main().is_none(), LONG, "the helper gone from main's ps");
    let out = main.ctl(&["send", "helper", "still there?"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no agent named `helper`"), "{err}");
}

/// Requests (`agents__request`) cross hosts as they work on one: the answer comes back to the
/// caller's turn, a deadline times the request out and cancels the callee's turn on the other
/// host, and a request that would close a cycle across hosts is refused.
#[test]
fn requests_cross_hosts_with_their_answer_deadline_and_cycle_check() {
    let Some(bin) = available("cluster: requests across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = two_hosts(
        &broker.url(),
        "  caller:\n    provider: scripted\n    rules:\n      \
         - match: \"slow\"\n        steps:\n          - tool: agents__request\n            args: { to: slowpoke, text: \"take your time\", timeout_ms: 300 }\n        reply: \"caller gave up\"\n      \
         - match: \"ring\"\n        steps:\n          - tool: agents__request\n            args: { to: ring-b, text: \"b, ask me back\" }\n        reply: \"caller done with the ring\"\n      \
         - steps:\n          - tool: agents__request\n            args: { to: echo, text: \"ping\" }\n        reply: \"caller done\"\n  \
         echo:\n    provider: scripted\n    rules:\n      - reply: \"pong from the gpu host\"\n  \
         slow:\n    provider: scripted\n    rules:\n      - steps:\n          - delay_ms: 5000\n        reply: \"too late\"\n  \
         ring:\n    provider: scripted\n    rules:\n      - steps:\n          - tool: agents__request\n            args: { to: caller, text: \"back to you\" }\n        reply: \"ring-b answered\"\n",
        "  - { name: caller, role: worker, model: caller }\n  \
         - { name: echo, role: worker, model: echo, host: gpu }\n  \
         - { name: slowpoke, role: worker, model: slow, host: gpu }\n  \
         - { name: ring-b, role: worker, model: ring, host: gpu }\n",
    );
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));

    // The answer, in the caller's turn on the other host.
    main.ctl_ok(&["send", "caller", "echo"]);
    main.wait_for_log("caller", "reply \"caller done\"", SHORT);
    let log = main.log("caller");
    assert!(
        log.contains("tool agents__request {\"text\":\"ping\",\"to\":\"echo\"} → ok: \"pong from the gpu host\""),
        "{log}"
    );
    assert!(gpu.log("echo").contains("from caller (request, attempt 1): \"ping\""));
    assert_eq!(gpu.turns_total("echo"), 1);

    // A deadline: the caller hears TIMEOUT, the callee's turn on the other host is cancelled.
    main.ctl_ok(&["send", "caller", "slow"]);
    main.wait_for_log("caller", "reply \"caller gave up\"", SHORT);
    let log = main.log("caller");
    assert!(log.contains("→ error: \"TIMEOUT: `slowpoke` did not answer within 300 ms"), "{log}");
    gpu.wait_for_log("slowpoke", "cancelled: the caller's deadline passed", SHORT);

    // caller (main) → ring-b (gpu) → caller again: refused where it would close the cycle.
    main.ctl_ok(&["send", "caller", "ring"]);
    main.wait_for_log("caller", "reply \"caller done with the ring\"", SHORT);
    let b = gpu.log("ring-b");
    assert!(b.contains("\"to\":\"caller\"} → error: \"CIRCULAR_CALL: "), "{b}");
    let log = main.log("caller");
    assert!(log.contains("\"to\":\"ring-b\"} → ok: \"ring-b answered\""), "{log}");
}

#[test]
fn a_chain_whose_hops_run_on_three_hosts_is_answered_once() {
    let Some(bin) = available("cluster: a chain across three hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    // coordinator (main) → worker (gpu) → helper (cpu); the helper's answer goes back to the
    // worker, the worker's to the coordinator, the coordinator's to the person.
    let yaml = two_hosts(
        &broker.url(),
        "  coord:\n    provider: scripted\n    rules:\n      - reply: \"the coordinator's own answer\"\n  \
         work:\n    provider: scripted\n    rules:\n      - match: \"helper did\"\n        reply: \"worker passes on: {input}\"\n      \
         - steps:\n          - tool: agents__delegate\n            args: { to: helper, task: \"{input}\" }\n        reply: \"handed to the helper\"\n  \
         help:\n    provider: scripted\n    rules:\n      - reply: \"helper did: {input}\"\n",
        "  - { name: coordinator, role: coordinator, model: coord, can_call: [worker], delegate: always }\n  \
         - { name: worker, role: worker, model: work, host: gpu }\n  \
         - { name: helper, role: worker, model: help, host: cpu }\n",
    );
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));
    let cpu = host(&yaml, Some("cpu"));
    let (code, end) = send_wait(&main, "coordinator", "sum 2 and 2");
    assert_eq!(code, Some(0), "{end}");
    let text = end["text"].as_str().unwrap_or_default();
    let all = ["worker passes on:", "helper did:", "sum 2 and 2"];
    assert!(all.iter().all(|w| text.contains(w)), "{end}");
    // send, hand-over, delegation, two results: five hops, each once.
    assert_eq!(end["hops"], 5, "{end}");
    assert_eq!((gpu.turns_total("worker"), cpu.turns_total("helper")), (2, 1));
    let dm = main.ctl_ok(&["read", "dm-coordinator--human-operator", "--json"]);
    assert_eq!(dm.matches("worker passes on").count(), 1, "{dm}");
}

/// `replier` (on gpu) answers "ping" in the channel; `listener` (on main) only reads.
fn room_yaml(url: &str) -> String {
    format!(
        "swarm: {{ name: two-hosts }}\ncluster: {{ nats: \"{url}\" }}\n\
         channels: {{ delta_delay_min_ms: 0, delta_delay_max_ms: 0 }}\nmodels:\n  \
         replier:\n    provider: scripted\n    rules:\n      - match: \"ping\"\n        steps:\n          \
         - tool: flock_channel_post\n            args: {{ channel: \"{{from}}\", text: \"pong from the gpu host\" }}\n        \
         reply: \"ponged\"\n      - reply: \"noted\"\n  \
         listener:\n    provider: scripted\n    rules:\n      - reply: \"noted\"\n\
         agents:\n  - {{ name: listener, role: worker, model: listener }}\n  \
         - {{ name: replier, role: worker, model: replier, host: gpu }}\n"
    )
}

/// The leader holds the channels: an agent on another host is told of a post in a channel the
/// leader holds, its own post there is the leader's, and a person reads both on the leader.
#[test]
fn agents_on_two_hosts_talk_in_one_channel_that_the_leader_holds() {
    let Some(bin) = available("cluster: a channel across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = room_yaml(&broker.url());
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));
    main.ctl_ok(&["channel", "create", "room", "--members", "replier,listener", "--as", "bob"]);
    main.ctl_ok(&["post", "#room", "ping", "--as", "bob"]);
    // The agent on gpu was told of bob's post and answered in the channel; the one on main was
    // told of that answer.
    gpu.wait_for_log("replier", "reply \"ponged\"", SHORT);
    main.wait_for_log("listener", "[seq 2] replier: pong from the gpu host", SHORT);
    let log = gpu.log("replier");
    assert!(log.contains("[seq 1] human:bob: ping"), "{log}");
    assert!(log.contains("tool flock_channel_post"), "{log}");
    let room = main.ctl_ok(&["read", "room", "--json"]);
    assert_eq!(room.matches("pong from the gpu host").count(), 1, "{room}");
    assert_eq!(room.matches("\"author\":\"replier\"").count(), 1, "{room}");
    // Told once, and never of its own post.
    main.wait_until(|| main.agent("listener")["turns_total"] == 2, SHORT, "listener's two turns");
    assert_eq!(gpu.turns_total("replier"), 1, "{}", gpu.log("replier"));
    // A person posts where the channels are: on another host, a clear refusal.
    let out = gpu.ctl(&["post", "#room", "hello", "--as", "bob"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("held by host `main`"), "{err}");
}

/// A post for an agent whose host was killed waits on the leader and reaches the agent once the
/// host is back; the leader killed with `kill -9` keeps its cursors: nothing is told twice.
#[test]
fn a_post_for_an_agent_whose_host_was_killed_reaches_it_once_the_host_is_back() {
    let Some(bin) = available("cluster: a channel across a kill -9") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = room_yaml(&broker.url());
    let mut main = host(&yaml, None);
    let mut gpu = host(&yaml, Some("gpu"));
    main.ctl_ok(&["channel", "create", "room", "--members", "replier,listener", "--as", "bob"]);
    gpu.kill9_supervisor();
    main.ctl_ok(&["post", "#room", "ping", "--as", "bob"]);
    main.wait_for_log("listener", "[seq 1] human:bob: ping", SHORT);
    gpu.restart_supervisor();
    gpu.wait_for_log("replier", "reply \"ponged\"", LONG);
    main.wait_for_log("listener", "[seq 2] replier: pong from the gpu host", SHORT);

    // The leader dies and comes back: a new post is told, the old ones are not told again.
    main.kill9_supervisor();
    main.restart_supervisor();
    main.ctl_ok(&["post", "#room", "ping again", "--as", "bob"]);
    main.wait_for_log("listener", "[seq 4] replier: pong from the gpu host", LONG);
    let log = gpu.log("replier");
    assert_eq!(log.matches("[seq 1] human:bob: ping").count(), 1, "{log}");
    assert_eq!(log.matches("[seq 3] human:bob: ping again").count(), 1, "{log}");
    assert_eq!(gpu.turns_total("replier"), 2, "{log}");
}

/// The leader keeps the permission records: a worker on another host asks, the sysadmin on the
/// leader triages, a person approves on the leader, and the grant reaches the worker's sandbox on
/// its own host.
#[test]
fn a_worker_on_another_host_asks_the_sysadmin_on_the_leader_and_its_sandbox_gets_the_grant() {
    let Some(bin) = available("cluster: permissions across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    // A service on loopback stands for "the network".
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fetch = format!(
        "python3 -c \\\"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')\\\""
    );
    let yaml = format!(
        r#"swarm: {{ name: two-hosts }}
cluster: {{ nats: "{url}" }}
models:
  builder:
    provider: scripted
    rules:
      - match: "build"
        steps:
          - {{ tool: permission_request, args: {{ capability: network, target: "127.0.0.1", reason: "fetch the dependencies" }} }}
        reply: "asked for network"
      - match: "fetch"
        steps:
          - {{ tool: exec, args: {{ command: "{fetch}" }} }}
        reply: "tried"
      - reply: "noted"
  admin:
    provider: scripted
    rules:
      - match: "[permission_request #1]"
        steps:
          - {{ tool: permission_verdict, args: {{ id: 1, verdict: RED, reason: "network access" }} }}
        reply: "triaged"
      - reply: "nothing to do"
agents:
  - {{ name: sysadmin, role: sysadmin, model: admin }}
  - {{ name: builder, role: worker, model: builder, host: gpu }}
"#,
        url = broker.url(),
    );
    let main = host(&yaml, None);
    let gpu = Swarm::builder(&yaml)
        .env(SECRET.0, SECRET.1)
        .up_args(&["--host", "gpu", "--ui", "127.0.0.1:0"])
        .start();
    gpu.ctl_ok(&["send", "builder", "build it", "--wait"]);
    let log = gpu.log("builder");
    assert!(log.contains("request #1 stored and sent to sysadmin"), "{log}");
    // The sysadmin on the leader triaged it: RED waits for a person, on the leader.
    main.wait_for_log("sysadmin", "reply \"triaged\"", SHORT);
    let open = main.ctl_ok(&["approvals", "--json"]);
    assert!(open.contains("\"agent\":\"builder\"") && open.contains("waiting"), "{open}");
    let out = gpu.ctl(&["approvals"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kept by host `main`"), "{err}");
    // gpu's dashboard still shows its swarm, with no approvals of its own (they are main's).
    let url = std::fs::read_to_string(gpu.state_dir().join("run/ui-url")).unwrap();
    let (addr, token) = url.trim().trim_start_matches("http://").split_once("/?token=").unwrap();
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, state) = crate::dashboard::get(addr, "/api/state", &bearer);
    assert_eq!(status, 200, "{state}");
    assert!(
        state.contains("\"approvals\":[]") && state.contains("\"name\":\"builder\""),
        "{state}"
    );

    // No grant yet: the sandbox on gpu refuses the network.
    gpu.ctl_ok(&["send", "builder", "fetch now", "--wait"]);
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "connected without a grant");
    // A person approves on the leader; the worker on gpu is told, and its sandbox connects.
    let approved = main.ctl_ok(&["approve", "1", "--reason", "ok for this build"]);
    assert!(approved.contains("request #1 granted"), "{approved}");
    gpu.wait_for_log("builder", "[permission #1 granted]", SHORT);
    gpu.ctl_ok(&["send", "builder", "fetch again", "--wait"]);
    let log = gpu.log("builder");
    assert!(log.contains("CONNECTED"), "{log}");
    assert!(listener.accept().is_ok(), "the grant did not reach the sandbox on gpu");
}

/// The chat door across hosts: a person's message in a Telegram group (the bridge runs on the
/// leader) is answered by the agent on another host that the chat's mapping names, in the chat,
/// once, as a reply to the message.
#[test]
fn a_person_in_a_chat_is_answered_there_by_an_agent_on_another_host() {
    const TOKEN: &str = "123456:TEST-token-cluster";
    const CHAT: i64 = -100_700_800;
    let Some(bin) = available("cluster: the chat door across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let fake = FakeTelegram::start(TOKEN);
    fake.add_chat(CHAT, "Team");
    let (url, api) = (broker.url(), fake.base_url());
    let yaml = format!(
        r#"swarm: {{ name: two-hosts }}
cluster: {{ nats: "{url}" }}
channels: {{ delta_delay_min_ms: 0, delta_delay_max_ms: 0 }}
models:
  s:
    provider: scripted
    rules:
      - match: "sum"
        steps: [ {{ delay_ms: 1500 }} ]
        reply: "17 + 25 = 42, from the gpu host"
      - reply: "noted"
agents:
  - {{ name: clerk, role: worker, model: s }}
  - {{ name: helper, role: coordinator, model: s, host: gpu }}
bridges:
  - name: tg
    platform: telegram
    token_env: TG_TOKEN
    api_url: {api}
    channels:
      - {{ flock: team, external: "{CHAT}", responder: helper }}
"#
    );
    let main = Swarm::builder(&yaml).env(SECRET.0, SECRET.1).env("TG_TOKEN", TOKEN).start();
    let gpu = host(&yaml, Some("gpu"));
    main.wait_until(
        || main.ps().iter().any(|r| r["name"] == "bridge-tg" && r["state"] == "connected"),
        LONG,
        "the bridge is connected",
    );
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "what is the sum of 17 and 25?");
    // While the agent on gpu works on it, the chat shows typing (the bridge runs on main).
    main.wait_until(
        || fake.chat_actions(CHAT).iter().any(|a| a == "typing"),
        LONG,
        "the chat shows typing",
    );
    let answers = || -> Vec<_> {
        fake.sent_to(CHAT).into_iter().filter(|m| m.plain.starts_with("[helper]")).collect()
    };
    main.wait_until(|| !answers().is_empty(), LONG, "the answer in the chat");
    let got = answers();
    assert_eq!(got[0].plain, "[helper] 17 + 25 = 42, from the gpu host");
    assert_eq!(got[0].reply_to, Some(asked), "a reply to alice's message: {got:#?}");
    // One turn on the gpu host; its input completed there once the leader posted the answer.
    gpu.wait_until(|| gpu.agent("helper")["mailbox_depth"] == 0, SHORT, "the input completed");
    assert_eq!(gpu.turns_total("helper"), 1, "{}", gpu.log("helper"));
    let team = main.ctl_ok(&["read", "team", "--json"]);
    assert_eq!(team.matches("from the gpu host").count(), 1, "posted once: {team}");
    assert_eq!(answers().len(), 1, "answered once in the chat");
}

/// A relay on `main` passes every message it gets to a sink on `gpu`.
fn relay_yaml(url: &str) -> String {
    two_hosts(
        url,
        "  relay:\n    provider: scripted\n    rules:\n      - steps:\n          - delay_ms: 40\n          \
         - tool: agents__send\n            args: { to: sink, text: \"{input}\" }\n        reply: \"relayed\"\n  \
         sink:\n    provider: scripted\n    rules:\n      - steps:\n          - delay_ms: 60\n        \
         reply: \"got: {input}\"\n",
        "  - { name: relay, role: worker, model: relay }\n  - { name: sink, role: worker, model: sink, host: gpu }\n",
    )
}

/// Sends `job-00`… to the relay on `main`; returns the texts.
fn send_jobs(main: &Swarm, n: usize) -> Vec<String> {
    let texts: Vec<String> = (0..n).map(|i| format!("job-{i:02}")).collect();
    for t in &texts {
        main.ctl_ok(&["send", "relay", t]);
    }
    texts
}

/// Every text reached the sink on `gpu` once (as many turns as texts) and in the order sent.
fn arrived_once_in_order(main: &Swarm, gpu: &Swarm, texts: &[String]) {
    let n = texts.len();
    gpu.wait_until(
        || {
            let row = gpu.agent("sink");
            row["turns_total"] == n && row["mailbox_depth"] == 0
        },
        LONG + std::time::Duration::from_millis(150 * n as u64),
        "every relayed message reaches the sink",
    );
    main.wait_until(|| main.turns_total("relay") == n as u64, SHORT, "the relay finished");
    let log = gpu.log("sink");
    let mut last = 0;
    for t in texts {
        let done = format!("reply \"got: {t}\"");
        let at = log.find(&done).unwrap_or_else(|| panic!("{t} was lost:\n{log}"));
        assert!(at >= last, "{t} arrived out of order:\n{log}");
        last = at;
    }
}

#[test]
fn messages_between_hosts_arrive_once_and_in_order_when_either_supervisor_is_killed() {
    const N: usize = 30;
    let Some(bin) = available("cluster: kill -9 of both hosts' supervisors") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = relay_yaml(&broker.url());
    let mut main = host(&yaml, None);
    let mut gpu = host(&yaml, Some("gpu"));
    let texts = send_jobs(&main, N);
    // Mid-flow: the receiving host dies first, then the sending one.
    gpu.wait_until(|| gpu.turns_total("sink") >= 3, LONG, "the first messages cross");
    assert!(
        gpu.turns_total("sink") < N as u64,
        "all {N} crossed before the kill; nothing was tested"
    );
    gpu.kill9_supervisor();
    main.wait_until(|| main.turns_total("relay") >= 12, LONG, "the relay goes on meanwhile");
    assert!(main.turns_total("relay") < N as u64, "the relay finished before its kill");
    main.kill9_supervisor();
    main.restart_supervisor();
    gpu.restart_supervisor();

    // Once each (a message stored twice would count two turns), and in the order sent.
    arrived_once_in_order(&main, &gpu, &texts);
    drop(broker);
}

#[test]
fn messages_between_hosts_survive_a_kill_9_of_the_broker() {
    const N: usize = 30;
    let Some(bin) = available("cluster: kill -9 of the broker") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(&bin, dir.path(), None);
    let yaml = relay_yaml(&broker.url());
    let main = host(&yaml, None);
    let gpu = host(&yaml, Some("gpu"));
    let texts = send_jobs(&main, N);
    gpu.wait_until(|| gpu.turns_total("sink") >= 3, LONG, "the first messages cross");
    assert!(
        gpu.turns_total("sink") < N as u64,
        "all {N} crossed before the kill; nothing was tested"
    );
    // The broker dies with messages in its stream and in flight, and comes back on its port; both
    // supervisors keep running and reconnect.
    broker.kill9_and_restart();
    arrived_once_in_order(&main, &gpu, &texts);
}

#[test]
fn a_host_without_the_swarms_secret_or_its_broker_does_not_start_and_says_why() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    // Port 1: nothing listens there.
    let yaml = two_hosts(
        "nats://127.0.0.1:1",
        "  work:\n    provider: scripted\n    rules:\n      - reply: ok\n",
        "  - { name: worker, role: worker, model: work }\n",
    );
    let file = dir.path().join("swarm.yaml");
    std::fs::write(&file, yaml).unwrap();
    let up = |secret: Option<&str>, state: &str| {
        let mut cmd = Command::new(flock_testkit::bin("flock-supervisor"));
        cmd.arg("up").arg(&file).arg("--state-dir").arg(dir.path().join(state));
        cmd.env_remove(SECRET.0).env_remove("FLOCK_HOST");
        if let Some(s) = secret {
            cmd.env(SECRET.0, s);
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (code, err) = up(None, "a");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("set FLOCK_CLUSTER_SECRET") && err.contains("same value on every host"),
        "{err}"
    );
    let (code, err) = up(Some("s"), "b");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("cannot reach NATS at nats://127.0.0.1:1"), "{err}");
    // A host the file places nothing on is refused before anything starts.
    let out = Command::new(flock_testkit::bin("flock-supervisor"))
        .arg("up")
        .arg(&file)
        .args(["--host", "gpu", "--state-dir"])
        .arg(dir.path().join("c"))
        .env(SECRET.0, "s")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("places no agent on host `gpu`") && err.contains("its hosts: main"),
        "{err}"
    );
}

fn row<'a>(ps: &'a [serde_json::Value], kind: &str, name: &str) -> Option<&'a serde_json::Value> {
    ps.iter().find(|r| r["kind"] == kind && r["name"] == name)
}

fn state_of(ps: &[serde_json::Value], kind: &str, name: &str) -> String {
    row(ps, kind, name).map_or("(no row)".into(), |r| r["state"].as_str().unwrap_or("").into())
}

#[test]
fn ps_on_any_host_shows_every_host_and_one_that_died_as_lost_with_the_mail_waiting_for_it() {
    let Some(bin) = available("cluster: one view") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = relay_yaml(&broker.url());
    let main = host(&yaml, None);
    // A host that never started: down, its agents unknown.
    let ps = main.ps();
    assert_eq!(state_of(&ps, "host", "main"), "up", "{ps:#?}");
    assert_eq!(state_of(&ps, "host", "gpu"), "down", "{ps:#?}");
    assert_eq!(state_of(&ps, "agent", "sink"), "unknown", "{ps:#?}");

    let mut gpu = host(&yaml, Some("gpu"));
    for s in [&main, &gpu] {
        s.wait_until(
            || {
                let ps = s.ps();
                state_of(&ps, "host", "gpu") == "up"
                    && state_of(&ps, "host", "main") == "up"
                    && state_of(&ps, "agent", "sink") == "ready"
                    && state_of(&ps, "agent", "relay") == "ready"
            },
            LONG,
            "every host and every agent, on both hosts",
        );
    }
    let ps = main.ps();
    assert_eq!(row(&ps, "agent", "sink").unwrap()["host"], "gpu");
    assert_eq!(row(&ps, "host", "main").unwrap()["role"], "leader");
    let table = main.ctl_ok(&["ps"]);
    assert!(table.lines().next().unwrap_or("").contains("HOST"), "{table}");

    // gpu's supervisor dies: main shows it lost, since when it last wrote, its agent unknown.
    gpu.kill9_supervisor();
    main.wait_until(
        || state_of(&main.ps(), "host", "gpu") == "lost",
        LONG,
        "the dead host is shown as lost",
    );
    let ps = main.ps();
    let lost = row(&ps, "host", "gpu").unwrap();
    assert!(lost["last_exit"].as_str().unwrap_or("").contains("no status since"), "{lost}");
    let sink = row(&ps, "agent", "sink").unwrap();
    assert_eq!(sink["state"], "unknown", "{sink}");
    assert_eq!(sink["last_exit"], "host lost; last seen ready", "{sink}");

    // Mail for its agent waits here, counted on its row, and flows once it is back.
    let texts = send_jobs(&main, 3);
    main.wait_until(
        || row(&main.ps(), "host", "gpu").is_some_and(|r| r["mailbox_depth"] == 3),
        LONG,
        "the relayed messages wait for the lost host",
    );
    gpu.restart_supervisor();
    arrived_once_in_order(&main, &gpu, &texts);
    main.wait_until(
        || {
            let ps = main.ps();
            state_of(&ps, "host", "gpu") == "up"
                && row(&ps, "host", "gpu").unwrap()["mailbox_depth"] == 0
        },
        LONG,
        "the host is up again and nothing waits for it",
    );
}

#[test]
fn a_chain_waiting_on_a_host_that_is_down_ends_at_its_time_budget() {
    let Some(bin) = available("cluster: a chain waiting on a lost host") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = format!(
        "budget: {{ max_wall_secs: 2 }}\n{}",
        coordinator_and_worker(&broker.url(), "done")
    );
    // `gpu` never starts: the hand-over waits here for it.
    let main = host(&yaml, None);
    let (code, end) = send_wait(&main, "coordinator", "what is 2 + 2?");
    assert_eq!(code, Some(3), "stopped by its budget: {end}");
    let text = end["text"].as_str().unwrap_or_default();
    assert!(text.contains("time budget"), "{end}");
    // Nothing here waits for the lost hop any more: the chain ends (it stayed in flight before).
    let live = |s: &Swarm| {
        s.ps()
            .iter()
            .find(|r| r["kind"] == "chains")
            .map_or(99, |r| r["mailbox_depth"].as_u64().unwrap_or(99))
    };
    main.wait_until(|| live(&main) == 0, SHORT, "the stopped chain ends");
    let host_row =
        main.ps().into_iter().find(|r| r["kind"] == "host" && r["name"] == "gpu").unwrap();
    assert_eq!(
        (host_row["state"].as_str(), host_row["mailbox_depth"].as_u64()),
        (Some("down"), Some(1))
    );
}

/// `scripts/cluster-chaos` (not in CI: ~2 min): `FLOCK_CHAOS_MESSAGES` (default 1,000) durable
/// messages relayed from `main` to `gpu` while each part is killed with `kill -9` in turn — the
/// receiving supervisor, the broker, the sending supervisor — and brought back: every message is
/// handed to a turn on `gpu` exactly once (counted) and in the order sent.
#[test]
#[ignore = "long: scripts/cluster-chaos runs it"]
fn a_thousand_messages_cross_once_and_in_order_through_a_kill_9_of_every_part() {
    let n: usize =
        std::env::var("FLOCK_CHAOS_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    let Some(bin) = available("cluster: chaos") else { return };
    let started = std::time::Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(&bin, dir.path(), None);
    let yaml = relay_yaml(&broker.url());
    let mut main = host(&yaml, None);
    let mut gpu = host(&yaml, Some("gpu"));
    let texts = send_jobs(&main, n);
    let long = LONG + std::time::Duration::from_millis(150 * n as u64);
    let sunk = |gpu: &Swarm, at: usize| {
        gpu.wait_until(|| gpu.turns_total("sink") >= at as u64, long, "messages cross");
        assert!(gpu.turns_total("sink") < n as u64, "all {n} crossed before a kill");
    };
    sunk(&gpu, n / 10);
    gpu.kill9_supervisor();
    main.wait_until(|| main.turns_total("relay") >= (n / 4) as u64, long, "the relay goes on");
    gpu.restart_supervisor();
    sunk(&gpu, n * 3 / 10);
    broker.kill9_and_restart();
    sunk(&gpu, n / 2);
    main.kill9_supervisor();
    main.restart_supervisor();
    arrived_once_in_order(&main, &gpu, &texts);
    eprintln!(
        "cluster chaos: {n} messages across hosts through kill -9 of gpu's supervisor, the broker \
         and main's supervisor: each handed to a turn once, in order, in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_host_runs_once_a_second_start_elsewhere_is_refused_until_the_first_is_lost() {
    use std::process::Command;
    let Some(bin) = available("cluster: one process per host") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = relay_yaml(&broker.url());
    let file = dir.path().join("swarm.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let mut gpu = host(&yaml, Some("gpu"));
    // The same host from another state dir (another machine): refused, saying why.
    let elsewhere = || {
        Command::new(flock_testkit::bin("flock-supervisor"))
            .arg("up")
            .arg(&file)
            .args(["--host", "gpu", "--state-dir"])
            .arg(dir.path().join("elsewhere"))
            .env(SECRET.0, SECRET.1)
            .output()
            .unwrap()
    };
    let out = elsewhere();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("host `gpu` is running already"), "{err}");
    assert_eq!(gpu.agent("sink")["state"], "ready", "the running host is untouched");
    // Its own state dir takes it back at once after a crash (the kill tests restart at once)…
    gpu.kill9_supervisor();
    gpu.restart_supervisor();
    // …another only once it is lost: the restarted one holds it, then dies for good.
    let main = host(&yaml, None);
    gpu.kill9_supervisor();
    main.wait_until(|| state_of(&main.ps(), "host", "gpu") == "lost", LONG, "gpu is lost");
    let other = Swarm::builder(&yaml).env(SECRET.0, SECRET.1).up_args(&["--host", "gpu"]).start();
    main.wait_until(
        || state_of(&main.ps(), "host", "gpu") == "up",
        LONG,
        "the host runs again, from the other state dir",
    );
    drop(other);
}

#[test]
fn a_host_cut_off_from_the_broker_is_shown_lost_and_once_healed_delivers_everything_once_in_order()
{
    const N: usize = 30;
    let Some(bin) = available("cluster: a partition healed") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    // `main` reaches the broker through a link that can be cut; `gpu` directly.
    let cable = flock_testkit::net::Relay::start(broker.addr());
    let main = host(&relay_yaml(&cable.url()), None);
    let gpu = host(&relay_yaml(&broker.url()), Some("gpu"));
    let texts = send_jobs(&main, N);
    gpu.wait_until(|| gpu.turns_total("sink") >= 3, LONG, "the first messages cross");
    cable.cut();
    // The other side sees it lost; the cut-off host goes on working on its own.
    gpu.wait_until(
        || state_of(&gpu.ps(), "host", "main") == "lost",
        LONG,
        "the cut-off host is shown as lost",
    );
    assert!(gpu.turns_total("sink") < N as u64, "all {N} crossed before the cut");
    main.wait_until(|| main.turns_total("relay") == N as u64, LONG, "the relay works on, cut off");
    cable.heal();
    arrived_once_in_order(&main, &gpu, &texts);
    gpu.wait_until(
        || state_of(&gpu.ps(), "host", "main") == "up",
        LONG,
        "the healed host is up again (nobody took it over: it was not fenced)",
    );
    assert_eq!(state_of(&main.ps(), "host", "main"), "up");
}

/// `main` with a relay, `gpu` with the sink and a helper; `gpu` may fail over after 15 s.
fn failover_yaml(url: &str) -> String {
    relay_yaml(url).replace("cluster: {", "cluster: { failover: { gpu: 15 },").replace(
        "host: gpu }\n",
        "host: gpu }\n  - { name: helper, role: worker, model: sink, host: gpu }\n",
    )
}

/// `main`, `gpu` (reaching the broker at `gpu_url`) holding `job-held` for its stopped sink,
/// and a standby for `gpu`, waiting.
fn with_a_standby(broker: &Broker, gpu_url: &str) -> (Swarm, Swarm, Swarm) {
    let main = host(&failover_yaml(&broker.url()), None);
    let gpu = host(&failover_yaml(gpu_url), Some("gpu"));
    let standby = Swarm::builder(&failover_yaml(&broker.url()))
        .env(SECRET.0, SECRET.1)
        .up_args(&["--host", "gpu", "--standby"])
        .spawn();
    gpu.wait_until(
        || standby.supervisor_output().contains("standby for host `gpu`: it is up"),
        LONG,
        "the standby waits while gpu is up",
    );
    // Every host's `ps` shows it waiting, after gpu's rows.
    let pid = standby.supervisor_pid().expect("the standby runs");
    main.wait_until(
        || {
            let ps = main.ps();
            row(&ps, "standby", "gpu").is_some_and(|r| r["pid"] == pid && r["state"] == "waiting")
        },
        LONG,
        "main's ps shows gpu's standby waiting",
    );
    // A message accepted on gpu and not delivered there yet: its sink is stopped.
    gpu.ctl_ok(&["stop", "sink"]);
    main.ctl_ok(&["send", "relay", "job-held"]);
    gpu.wait_until(|| gpu.agent("sink")["mailbox_depth"] == 1, LONG, "job-held waits on gpu");
    (main, gpu, standby)
}

/// Waits until `main` sees the standby hold host `gpu` (15 s after gpu's last status), then
/// until the standby's agents are ready.
fn takes_over(main: &Swarm, standby: &mut Swarm) {
    let standby_pid = standby.supervisor_pid().expect("the standby runs");
    main.wait_until(
        || row(&main.ps(), "host", "gpu").is_some_and(|r| r["pid"] == standby_pid),
        LONG + std::time::Duration::from_secs(20),
        "the standby holds host gpu",
    );
    standby.ready();
    // It holds the host now: no longer shown as a standby.
    assert!(row(&main.ps(), "standby", "gpu").is_none(), "{:?}", main.ps());
}

#[test]
fn a_standby_takes_over_a_host_cut_off_whose_agents_stopped_and_gets_what_it_held() {
    let Some(bin) = available("cluster: failover to a standby") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    // `gpu` reaches the broker through a link that can be cut; `main` and the standby directly.
    let cable = flock_testkit::net::Relay::start(broker.addr());
    let (main, mut gpu, mut standby) = with_a_standby(&broker, &cable.url());
    let helper = gpu.pid_of("helper").expect("the helper runs on gpu");

    cable.cut();
    // Cut off, gpu cannot renew its lease: its agents stop (never on two machines at once)…
    gpu.wait_until(
        || gpu.state_of("helper") == "stopped" && !flock_testkit::proc::alive(helper),
        LONG,
        "the cut-off host's agents are killed once its lease lapsed",
    );
    // …and after 15 s lost the standby takes the host over and runs its agents.
    takes_over(&main, &mut standby);
    assert!(gpu.pid_of("helper").is_none(), "the helper runs on one machine only");
    main.ctl_ok(&["send", "relay", "job-after"]);
    standby.wait_for_log("sink", "reply \"got: job-after\"", LONG);

    // Healed: the old run learns it was taken over, hands job-held over and stops.
    cable.heal();
    let status = gpu.exited_within(LONG);
    assert!(!status.success(), "{}", gpu.supervisor_output());
    let out = gpu.supervisor_output();
    assert!(out.contains("handed 1 undelivered message(s) over"), "{out}");
    standby.wait_for_log("sink", "reply \"got: job-held\"", LONG);
    let log = standby.log("sink");
    assert_eq!(log.matches("reply \"got: job-held\"").count(), 1, "{log}");
    assert_eq!(state_of(&main.ps(), "host", "gpu"), "up");
}

#[test]
fn a_host_killed_for_good_is_taken_over_and_its_state_dir_hands_what_it_held_over_when_run_again() {
    let Some(bin) = available("cluster: failover after kill -9") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let (main, mut gpu, mut standby) = with_a_standby(&broker, &broker.url());
    gpu.kill9_supervisor();
    takes_over(&main, &mut standby);
    // The dead machine's state dir, run again: the host is taken, so it hands over and stops.
    gpu.spawn_again();
    let status = gpu.exited_within(LONG);
    let out = gpu.supervisor_output();
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("is running already"), "{out}");
    assert!(
        out.contains("the 1 message(s) this state dir held undelivered were handed over"),
        "{out}"
    );
    standby.wait_for_log("sink", "reply \"got: job-held\"", LONG);
    assert_eq!(standby.log("sink").matches("reply \"got: job-held\"").count(), 1);
    // Handed over once: a second run finds nothing left to hand over.
    gpu.spawn_again();
    assert_eq!(gpu.exited_within(LONG).code(), Some(1));
    assert_eq!(gpu.supervisor_output().matches("were handed over").count(), 1);
}
