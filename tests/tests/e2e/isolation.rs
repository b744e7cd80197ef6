//! What an agent's processes cannot do, even with a custom `command:` running as the same user:
//! in its cage, see the state dir beyond its own workspace, the memory folder and the router
//! socket, nor signal or read any process outside it; caged or not, read the API keys the
//! supervisor was given, outlive the agent or the swarm by detaching, use the control socket as
//! the operator, or lock another agent out by holding connections.

use std::path::Path;

use flock_testkit::Swarm;
use flock_testkit::proc::alive;

use crate::{LONG, SHORT, answer_model};

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
fn an_uncaged_agents_children_cannot_read_the_key_outlive_it_or_act_as_the_operator() {
    let yaml = format!(
        r#"swarm: {{ name: isolation }}
models:
{}  remote: {{ provider: openai, base_url: "http://127.0.0.1:9/v1", model: x, api_key_env: FLOCK_TEST_SECRET }}
agents:
  - name: spy
    role: worker
    model: m
    stop_timeout_secs: 2
    unconfined: true
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
    // A person's flockctl is served as always; ps says this agent runs uncaged.
    assert_eq!(swarm.state_of("spy"), "ready");
    assert_eq!(swarm.agent("spy")["confined"], false);

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

/// The hog's shell: a background Python that keeps about 1,100 connections open on the router
/// socket — each one the supervisor closes (refused, or past the handshake deadline) is opened
/// again at once — then the agent itself.
const HOG: &str = r#"
python3 - "$PWD/../../run/router.sock" > hog.txt 2>&1 <<'PY' &
import resource, select, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
poll, held, opened = select.poll(), {}, 0
def open_one():
    global opened
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(0.2)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close()
        return
    held[s.fileno()] = s
    poll.register(s, select.POLLIN | select.POLLHUP)
    opened += 1
end, said = time.time() + 120, 0
while time.time() < end:
    while len(held) < 1100:
        open_one()
    for fd, _ in poll.poll(100):
        poll.unregister(fd)
        held.pop(fd).close()
    if time.time() - said > 0.5:
        print(opened, flush=True)
        said = time.time()
PY
exec "$0"
"#;

#[test]
fn one_agent_holding_connections_cannot_lock_another_out_of_its_restart() {
    let yaml = format!(
        r#"swarm: {{ name: lockout }}
models:
{}agents:
  - name: hog
    role: worker
    model: m
    stop_timeout_secs: 2
    command: ["/bin/sh", "-c", {:?}, "{}"]
  - name: victim
    role: worker
    model: m
"#,
        answer_model("m", "ok"),
        HOG,
        flock_testkit::bin("flock-agent").display(),
    );
    let swarm = Swarm::start(&yaml);
    let workspace = swarm.state_dir().join("workspaces/hog");
    // The hog is at it: more than the socket's 1,024 connections tried.
    swarm.wait_until(
        || {
            std::fs::read_to_string(workspace.join("hog.txt"))
                .is_ok_and(|t| t.lines().filter_map(|l| l.parse::<u64>().ok()).any(|n| n > 2000))
        },
        LONG,
        "the hog opened two rounds of connections",
    );
    // The victim restarts (twice, while the hog keeps going) and is served each time.
    for _ in 0..2 {
        let before = swarm.pid_of("victim");
        swarm.ctl_ok(&["restart", "victim"]);
        swarm.wait_until(
            || swarm.state_of("victim") == "ready" && swarm.pid_of("victim") != before,
            SHORT,
            "the victim is back",
        );
    }
    // The hog was told why it was refused, and the supervisor logged it.
    assert!(
        swarm.supervisor_output().contains("too many connections from one agent's processes"),
        "no refusal logged"
    );
    assert_eq!(swarm.state_of("hog"), "ready");
}

#[test]
fn an_up_that_fails_on_a_busy_port_leaves_nothing_running() {
    let dir = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = busy.local_addr().unwrap().port();
    let file = dir.path().join("swarm.yaml");
    let daemon = dir.path().join("daemon.pid");
    // The agent would leave a detached daemon behind if it ever started.
    let yaml = format!(
        r#"swarm: {{ name: late }}
models:
{}agents:
  - name: w
    role: worker
    model: m
    command: ["/bin/sh", "-c", "( setsid sleep 600 < /dev/null > /dev/null 2>&1 & echo $! > {} ); exec \"$0\"", "{}"]
"#,
        answer_model("m", "ok"),
        daemon.display(),
        flock_testkit::bin("flock-agent").display(),
    );
    std::fs::write(&file, yaml).unwrap();
    let state = dir.path().join("state");
    let out = std::process::Command::new(flock_testkit::bin("flock-supervisor"))
        .arg("up")
        .arg(&file)
        .arg("--state-dir")
        .arg(&state)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .env("FLOCK_AGENT_BIN", flock_testkit::bin("flock-agent"))
        .env_remove("FLOCK_HOME")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "up succeeded on a busy port:\n{stderr}");
    assert!(stderr.contains(&port.to_string()), "the error names the port:\n{stderr}");
    // Nothing it started outlives it: no agent, no daemon of an agent.
    let socket = format!("FLOCK_SOCKET={}", state.join("run/router.sock").display());
    assert!(flock_testkit::proc::pids_with_env(&socket).is_empty(), "an agent outlived up");
    // The port is checked before any agent starts: none ever ran.
    assert!(!daemon.exists(), "an agent started before up found its port busy");
}

/// The caged agent's shell, before it becomes the agent: looks at the state dir, the database,
/// the processes it can see and `flockctl`; leaves a detached daemon; then, in the background,
/// waits for the test to tell it the supervisor's pid and tries to signal it and read its
/// environment.
const CAGED: &str = r#"
ls -A ../.. > state-view.txt; ls -A ../../run > run-view.txt; ls -A ../../workspaces > ws-view.txt
cat ../../flock.db > /dev/null 2>&1 && echo read > db.txt || echo denied > db.txt
ls /proc | grep -c '^[0-9]' > procs.txt; echo $$ > own-pid.txt
{ mkdir -p ../../memory/observations && echo poison >> ../../memory/observations/2020-01-01.md; } 2>/dev/null && echo wrote > mem.txt || echo denied > mem.txt
{ rm ../../memory/index.db || touch ../../memory/x; } 2>/dev/null && echo wrote >> mem.txt || echo denied >> mem.txt
"$1" --state-dir "$PWD/../.." ps > ctl.txt 2>&1; echo "exit $?" >> ctl.txt
( setsid sleep 600 < /dev/null > /dev/null 2>&1 & )
( while [ ! -s supervisor.pid ]; do sleep 0.05; done; s=$(cat supervisor.pid)
  kill -0 "$s" 2>/dev/null && echo signalled > kill.txt || echo denied > kill.txt
  tr '\0' '\n' < /proc/$s/environ > environ.txt 2>/dev/null || echo unreadable > environ.txt ) &
exec "$0"
"#;

#[test]
fn a_caged_agent_sees_only_its_part_of_the_state_dir_and_no_process_outside() {
    let yaml = format!(
        r#"swarm: {{ name: caged }}
models:
{}agents:
  - name: other
    role: worker
    model: m
  - name: spy
    role: worker
    model: m
    stop_timeout_secs: 2
    command: ["/bin/sh", "-c", {:?}, "{}", "{}"]
"#,
        answer_model("m", "ok"),
        CAGED,
        flock_testkit::bin("flock-agent").display(),
        flock_testkit::bin("flockctl").display(),
    );
    let mut swarm = Swarm::start(&yaml);
    let workspace = swarm.state_dir().join("workspaces/spy");
    let read = |f: &str| std::fs::read_to_string(workspace.join(f)).unwrap_or_default();
    // The agent is ready: its workspace and the router socket are there, and ps says caged.
    assert_eq!(swarm.state_of("spy"), "ready");
    for row in swarm.agents() {
        assert_eq!(row["confined"], true, "{row}");
    }
    // Of the state dir, it sees what it needs and nothing else.
    let mut state: Vec<&str> = Vec::new();
    let view = read("state-view.txt");
    state.extend(view.lines());
    state.sort();
    assert_eq!(state, ["memory", "run", "workspaces"], "the state dir as the agent sees it");
    assert_eq!(read("run-view.txt").trim(), "router.sock", "no control socket, lock or URL");
    assert_eq!(read("ws-view.txt").trim(), "spy", "no other agent's workspace");
    assert_eq!(read("db.txt").trim(), "denied");
    // The team's memory is there to read, not to change: the supervisor writes it.
    assert_eq!(read("mem.txt"), "denied\ndenied\n", "memory/ is read-only in the cage");
    assert!(!swarm.state_dir().join("memory/observations/2020-01-01.md").exists());
    assert!(swarm.state_dir().join("memory/index.db").exists());
    // …while the state dir is all there for everyone else.
    assert!(swarm.state_dir().join("flock.db").exists());
    assert!(swarm.state_dir().join("workspaces/other").exists());
    // It is PID 1 of a namespace of its own and sees only its own processes.
    assert_eq!(read("own-pid.txt").trim(), "1");
    let seen: u32 = read("procs.txt").trim().parse().unwrap_or(u32::MAX);
    assert!(seen < 10, "the agent sees {seen} processes");
    // flockctl finds no swarm to drive.
    let ctl = read("ctl.txt");
    assert!(ctl.contains("exit ") && !ctl.contains("exit 0"), "{ctl}");
    // Told the supervisor's pid, it can neither signal it nor read its environment.
    let supervisor = swarm.supervisor_pid().expect("the supervisor's pid");
    std::fs::write(workspace.join("supervisor.pid"), supervisor.to_string()).unwrap();
    swarm.wait_until(|| !read("environ.txt").is_empty(), SHORT, "the spy tried");
    assert_eq!(read("kill.txt").trim(), "denied");
    assert_eq!(read("environ.txt").trim(), "unreadable");
    // Nothing it started outlives it: its detached daemon dies with its namespace.
    let pid = swarm.pid_of("spy").unwrap();
    let in_cage = |p: u32| std::fs::read_to_string(format!("/proc/{p}/task/{p}/children"));
    let agent: u32 = in_cage(pid).unwrap().trim().parse().expect("the agent under its stand-in");
    let daemons = || {
        in_cage(agent)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
            .filter(|c| {
                std::fs::read_to_string(format!("/proc/{c}/cmdline"))
                    .is_ok_and(|l| l.starts_with("sleep"))
            })
            .collect::<Vec<_>>()
    };
    let before = daemons();
    assert_eq!(before.len(), 1, "the daemon runs under the agent");
    swarm.kill9_supervisor();
    swarm.wait_until(|| !alive(before[0]), SHORT, "the daemon died with the killed supervisor");
}

/// An uncaged agent's shell: reads the environment of its supervisor's parent — the `up
/// --detach` launcher, still waiting for the swarm to be ready — then becomes the agent.
const LAUNCHER_SPY: &str = r#"
launcher=$(awk '{print $4}' /proc/$PPID/stat)
tr '\0' '\n' < /proc/$launcher/environ > launcher-env.txt 2>/dev/null || echo unreadable > launcher-env.txt
tr '\0' '\n' < /proc/$PPID/environ > supervisor-env.txt 2>/dev/null || echo unreadable > supervisor-env.txt
exec "$0"
"#;

#[test]
fn up_detach_hands_the_keys_over_without_leaving_them_in_any_environment() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = dir.path().join("swarm.yaml");
    let yaml = format!(
        r#"swarm: {{ name: detached }}
models:
  remote: {{ provider: openai, base_url: "http://127.0.0.1:9/v1", model: x, api_key_env: FLOCK_TEST_SECRET }}
agents:
  - name: spy
    role: worker
    model: remote
    unconfined: true
    command: ["/bin/sh", "-c", {:?}, "{}"]
"#,
        LAUNCHER_SPY,
        flock_testkit::bin("flock-agent").display(),
    );
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(flock_testkit::bin("flock-supervisor"))
        .arg("up")
        .arg(&file)
        .arg("--detach")
        .arg("--state-dir")
        .arg(&state)
        .env("FLOCK_AGENT_BIN", flock_testkit::bin("flock-agent"))
        .env("FLOCK_TEST_SECRET", "s3cr3t-must-not-leak")
        .env_remove("FLOCK_HOME")
        .output()
        .unwrap();
    let down = || {
        std::process::Command::new(flock_testkit::bin("flockctl"))
            .arg("--state-dir")
            .arg(&state)
            .arg("down")
            .output()
            .unwrap()
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let workspace = state.join("workspaces/spy");
    let read = |f: &str| std::fs::read_to_string(workspace.join(f)).unwrap_or_default();
    let launcher = read("launcher-env.txt");
    let supervisor = read("supervisor-env.txt");
    down();
    // The agent ran while the launcher waited, and looked (root may read even non-dumpable
    // processes' environments, so what protects the key is that it is not there).
    assert!(!launcher.is_empty() && !supervisor.is_empty(), "the spy did not look");
    assert!(!launcher.contains("s3cr3t-must-not-leak"), "the launcher's environment:\n{launcher}");
    assert!(!supervisor.contains("s3cr3t-must-not-leak"), "the supervisor's environment");
}
