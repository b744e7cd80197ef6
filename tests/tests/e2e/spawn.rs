//! `agents__spawn`: a declared agent gets extra instances at run time (a worker per
//! conversation), each its own supervised process addressed as `agent@instance`.

use flock_testkit::Swarm;

use crate::{SHORT, answer_model};

#[test]
fn a_coordinator_spawns_a_worker_instance_per_conversation_and_a_worker_may_not() {
    let yaml = format!(
        r#"swarm: {{ name: spawning }}
models:
{}  coordinate:
    provider: scripted
    rules:
      - steps:
          - tool: agents__spawn
            args: {{ agent: worker, instance: conv-1 }}
          - tool: agents__request
            args: {{ to: "worker@conv-1", text: "{{input}}" }}
        reply: "coordinator: answered"
  sneaky:
    provider: scripted
    rules:
      - steps:
          - tool: agents__spawn
            args: {{ agent: worker }}
        reply: tried
agents:
  - {{ name: coordinator, role: coordinator, model: coordinate }}
  - {{ name: worker, role: worker, model: m }}
  - {{ name: other, role: worker, model: sneaky }}
"#,
        answer_model("m", "instance says: {input}")
    );
    let mut swarm = Swarm::start(&yaml);
    swarm.ctl_ok(&["send", "coordinator", "hello from conversation 1"]);
    swarm.wait_for_log("coordinator", "reply \"coordinator: answered\"", SHORT);
    let log = swarm.log("coordinator");
    assert!(log.contains("instance says: hello from conversation 1"), "{log}");
    // The instance is its own process, next to the declared worker.
    let instance = swarm.pid_of("worker@conv-1").expect("the instance runs");
    assert_ne!(Some(instance), swarm.pid_of("worker"));
    assert!(swarm.log("worker@conv-1").contains("from coordinator (request"));
    assert!(!swarm.log("worker").contains("hello from conversation 1"));
    // Instances are supervised and come back after a supervisor restart.
    swarm.kill9_supervisor();
    swarm.restart_supervisor();
    assert_eq!(swarm.state_of("worker@conv-1"), "ready");
    // Only an orchestrator or coordinator may spawn.
    swarm.ctl_ok(&["send", "other", "go"]);
    swarm.wait_for_log("other", "reply \"tried\"", SHORT);
    assert!(swarm.log("other").contains("FORBIDDEN"), "{}", swarm.log("other"));
}
