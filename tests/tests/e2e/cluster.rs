//! One swarm on several hosts (issue #26): two supervisors with their own state dirs, linked by a
//! real `nats-server -js`, each running the agents the swarm file places on it. A person's
//! request to the coordinator on one host is answered by the worker on the other; durable
//! messages between hosts arrive once and in order when either supervisor is killed with
//! `kill -9` while they flow.

use flock_testkit::Swarm;
use flock_testkit::nats::{Broker, available};

use crate::{LONG, SHORT};

/// The same swarm file on both hosts: `main` (the leader) and `gpu`.
fn two_hosts(url: &str, models: &str, agents: &str) -> String {
    format!(
        "swarm: {{ name: two-hosts }}\ncluster: {{ nats: \"{url}\" }}\nmodels:\n{models}agents:\n{agents}"
    )
}

#[test]
fn a_request_on_one_host_is_answered_by_a_worker_on_another() {
    let Some(bin) = available("cluster: request across hosts") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = two_hosts(
        &broker.url(),
        "  coord:\n    provider: scripted\n    rules:\n      - reply: \"the coordinator's own answer\"\n  \
         work:\n    provider: scripted\n    rules:\n      - reply: \"the gpu host did: {input}\"\n",
        "  - { name: coordinator, role: coordinator, model: coord, can_call: [worker], delegate: always }\n  \
         - { name: worker, role: worker, model: work, host: gpu }\n",
    );
    let main = Swarm::start(&yaml);
    let gpu = Swarm::builder(&yaml).up_args(&["--host", "gpu"]).start();
    // Each host runs its own agents only.
    let names = |s: &Swarm| -> Vec<String> {
        s.agents().iter().map(|a| a["name"].as_str().unwrap_or_default().to_owned()).collect()
    };
    assert_eq!(names(&main), ["coordinator"]);
    assert_eq!(names(&gpu), ["worker"]);

    let out =
        main.ctl(&["send", "coordinator", "what is 2 + 2?", "--wait", "--json", "--timeout", "60"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let end: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!("no JSON ({e}): {stdout}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    assert_eq!(out.status.code(), Some(0), "{end}");
    let text = end["text"].as_str().unwrap_or_default();
    assert!(text.contains("the gpu host did:") && text.contains("what is 2 + 2?"), "{end}");
    assert_eq!(gpu.turns_total("worker"), 1, "one turn on the gpu host");
    // One chain across both hosts: the person's send, the hand-over, the worker's result.
    assert_eq!(end["hops"], 3, "{end}");
    // The person's DM on the host they asked holds the answer once.
    let dm = main.ctl_ok(&["read", "dm-coordinator--human-operator", "--json"]);
    assert_eq!(dm.matches("the gpu host did:").count(), 1, "{dm}");

    // An operator cannot address the other host's agent from here: a clear refusal.
    let out = main.ctl(&["send", "worker", "hello"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("runs on host `gpu`"), "{err}");
}

#[test]
fn messages_between_hosts_arrive_once_and_in_order_when_either_supervisor_is_killed() {
    const N: usize = 30;
    let Some(bin) = available("cluster: kill -9 of both hosts' supervisors") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let yaml = two_hosts(
        &broker.url(),
        "  relay:\n    provider: scripted\n    rules:\n      - steps:\n          - delay_ms: 40\n          \
         - tool: agents__send\n            args: { to: sink, text: \"{input}\" }\n        reply: \"relayed\"\n  \
         sink:\n    provider: scripted\n    rules:\n      - steps:\n          - delay_ms: 60\n        \
         reply: \"got: {input}\"\n",
        "  - { name: relay, role: worker, model: relay }\n  - { name: sink, role: worker, model: sink, host: gpu }\n",
    );
    let mut main = Swarm::start(&yaml);
    let mut gpu = Swarm::builder(&yaml).up_args(&["--host", "gpu"]).start();
    let texts: Vec<String> = (0..N).map(|i| format!("job-{i:02}")).collect();
    for t in &texts {
        main.ctl_ok(&["send", "relay", t]);
    }
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

    gpu.wait_until(
        || {
            let row = gpu.agent("sink");
            row["turns_total"] == N && row["mailbox_depth"] == 0
        },
        LONG,
        "every relayed message reaches the sink after the restarts",
    );
    main.wait_until(|| main.turns_total("relay") == N as u64, SHORT, "the relay finished");
    // Once each (a message stored twice would count two turns), and in the order sent.
    let log = gpu.log("sink");
    let mut last = 0;
    for t in &texts {
        let done = format!("reply \"got: {t}\"");
        let at = log.find(&done).unwrap_or_else(|| panic!("{t} was lost:\n{log}"));
        assert!(at >= last, "{t} arrived out of order:\n{log}");
        last = at;
    }
    drop(broker);
}
