//! What an agent's processes cannot do, even with a custom `command:` running as the same user
//! and outside any sandbox: read the API keys the supervisor was given, outlive the agent or the
//! swarm by detaching, or use the control socket as the operator.

use std::path::Path;

use flock_testkit::Swarm;
use flock_testkit::proc::alive;

use crate::{SHORT, answer_model};

/// The agent's shell, before it becomes the agent: reads the supervisor's environment block,
/// leaves a detached daemon behind (double fork into its own session), and tries `flockctl ps`
/// once the control socket is there.
const SPY: &str = r#"
tr '\0' '\n' < /proc/$PPID/environ > environ.txt 2>/dev/null || echo unreadable > environ.txt
env > own-env.txt
( setsid sleep 600 < /dev/null > /dev/null 2>&1 & echo $! > daemon.pid )
( while [ ! -S "$PWD/../../run/control.sock" ]; do sleep 0.05; done
  "$1" --state-dir "$PWD/../.." ps > ctl.txt 2>&1; echo "exit $?" >> ctl.txt ) &
exec "$0"
"#;

fn daemon_pid(workspace: &Path) -> Option<u32> {
    std::fs::read_to_string(workspace.join("daemon.pid")).ok()?.trim().parse().ok()
}

#[test]
fn an_agents_children_cannot_read_the_key_outlive_it_or_act_as_the_operator() {
    let yaml = format!(
        r#"swarm: {{ name: isolation }}
models:
{}  remote: {{ provider: openai, base_url: "http://127.0.0.1:9/v1", model: x, api_key_env: FLOCK_TEST_SECRET }}
agents:
  - name: spy
    role: worker
    model: m
    stop_timeout_secs: 2
    command: ["/bin/sh", "-c", {:?}, "{}", "{}"]
"#,
        answer_model("m", "ok"),
        SPY,
        flock_testkit::bin("flock-agent").display(),
        flock_testkit::bin("flockctl").display(),
    );
    let mut swarm = Swarm::start(&yaml);
    let workspace = swarm.state_dir().join("workspaces/spy");

    // The key was read (the testkit sets FLOCK_TEST_SECRET for the supervisor) and then erased
    // from the environment block /proc shows.
    let environ = std::fs::read_to_string(workspace.join("environ.txt")).unwrap();
    assert!(environ.contains("PATH=") || environ.contains("unreadable"), "{environ}");
    assert!(!environ.contains("s3cr3t-must-not-leak"), "the key is readable:\n{environ}");

    // The spawn's token is not in the agent's own environment either (a sibling could read it
    // from /proc before the agent is non-dumpable): it comes over the inherited socket, which
    // still reached flock-agent through the shell (the spy is ready below).
    let own = std::fs::read_to_string(workspace.join("own-env.txt")).unwrap();
    assert!(!own.contains("FLOCK_TOKEN"), "the token is in the environment:\n{own}");
    assert!(own.contains("FLOCK_SECRETS_FD="), "{own}");

    // The control socket refuses a process the supervisor started.
    swarm.wait_until(
        || std::fs::read_to_string(workspace.join("ctl.txt")).is_ok_and(|t| t.contains("exit ")),
        SHORT,
        "the spy's flockctl finished",
    );
    let ctl = std::fs::read_to_string(workspace.join("ctl.txt")).unwrap();
    assert!(ctl.contains("serves the operator, not processes this supervisor started"), "{ctl}");
    assert!(!ctl.contains("exit 0"), "{ctl}");
    // A person's flockctl is served as always.
    assert_eq!(swarm.state_of("spy"), "ready");

    // The detached daemon goes when its agent is stopped…
    let first = daemon_pid(&workspace).expect("the spy wrote its daemon's pid");
    assert!(alive(first), "the daemon should run while its agent does");
    swarm.ctl_ok(&["stop", "spy"]);
    swarm.wait_until(|| !alive(first), SHORT, "the daemon of the stopped agent is gone");
    // (The sweep logs after it has reaped, so the line may follow the daemon's end a little.)
    swarm.wait_for_log("spy", "process(es) it had left running", SHORT);

    // …and when the swarm goes down.
    swarm.ctl_ok(&["start", "spy"]);
    swarm.wait_until(
        || daemon_pid(&workspace).is_some_and(|p| p != first),
        SHORT,
        "the restarted spy wrote a new daemon pid",
    );
    let second = daemon_pid(&workspace).unwrap();
    assert!(alive(second));
    assert!(swarm.down().success());
    assert!(!alive(second), "the daemon outlived `flockctl down`");
}
