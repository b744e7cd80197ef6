//! The sandbox conformance suite: the escape attempts a prompt-injected worker would make, each
//! run for real through the `flock-sandbox` helper, each of which must fail (issue #11). The
//! layout is Flock's: a state dir with the database, the control socket and every agent's
//! workspace; the command runs in one of those workspaces.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flock_sandbox::{Limits, Output, Policy, Status, run};

fn helper() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flock-sandbox"))
}

/// The backend a test runs against.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Native,
    Docker,
}

/// Every attempt runs against both backends. The Docker one needs an engine: where none
/// answers it says so and passes as skipped; where one answers, the image must be there
/// (`scripts/setup` builds it with scripts/sandbox-image).
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn native() {
                super::$name(super::Backend::Native).await
            }
            #[tokio::test]
            async fn docker() {
                if let Err(why) = flock_sandbox::docker::engine().await {
                    eprintln!("SKIPPED (docker backend): {why}");
                    return;
                }
                super::$name(super::Backend::Docker).await
            }
        }
    )*};
}

on_both_backends!(
    a_command_runs_in_its_workspace_and_its_writes_stay,
    secrets_of_the_host_and_the_state_dir_cannot_be_read,
    nothing_outside_the_workspace_can_be_written,
    no_network_and_no_unix_sockets,
    privileged_calls_are_refused,
    the_callers_environment_does_not_leak,
    a_fork_bomb_is_contained_and_cleaned_up,
    no_process_outlives_the_command_or_its_timeout,
    the_disk_cannot_be_filled,
    memory_and_cpu_are_bounded,
    output_is_bounded_and_setup_errors_are_clear,
);

/// A state dir like Flock's (0700): `flock.db` with a secret, `control.sock`, two workspaces.
struct State {
    _dir: tempfile::TempDir,
    root: PathBuf,
    workspace: PathBuf,
    backend: Backend,
}

impl State {
    fn new(backend: Backend) -> State {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        std::fs::write(root.join("flock.db"), "SECRET-DATABASE-ROW").unwrap();
        std::fs::create_dir_all(root.join("workspaces/other")).unwrap();
        std::fs::write(root.join("workspaces/other/notes.md"), "SECRET-OTHER-AGENT").unwrap();
        let workspace = root.join("workspaces/me");
        std::fs::create_dir_all(&workspace).unwrap();
        std::fs::write(workspace.join("hello.txt"), "hello from the workspace\n").unwrap();
        // As Flock makes it: nobody else may walk into the state dir.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).unwrap();
        State { _dir: dir, root, workspace, backend }
    }

    fn policy(&self, command: &str) -> Policy {
        Policy::new(&self.workspace, command)
    }

    async fn sh(&self, command: &str) -> Output {
        self.run(self.policy(command), Duration::from_secs(30)).await
    }

    async fn run(&self, policy: Policy, timeout: Duration) -> Output {
        self.run_capped(policy, timeout, 64 * 1024).await
    }

    async fn run_capped(&self, policy: Policy, timeout: Duration, cap: usize) -> Output {
        let out = match self.backend {
            Backend::Native => run(&helper(), &policy, timeout, cap).await,
            Backend::Docker => flock_sandbox::docker::run(&policy, timeout, cap).await,
        };
        out.expect("the sandbox starts")
    }
}

fn show(o: &Output) -> String {
    format!("{:?}\nstdout: {}\nstderr: {}", o.status, o.stdout.text, o.stderr.text)
}

/// Whether the planted secrets reached the output.
fn leaked(o: &Output) -> bool {
    ["SECRET-DATABASE-ROW", "SECRET-OTHER-AGENT"].iter().any(|s| o.stdout.text.contains(s))
}

/// Processes whose command line contains `marker`, anywhere on the machine.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().chars().all(|c| c.is_ascii_digit()))
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .count()
}

async fn a_command_runs_in_its_workspace_and_its_writes_stay(b: Backend) {
    let s = State::new(b);
    let o = s
        .sh("pwd; cat hello.txt; echo made > made.txt; mkdir -p src && echo fn > src/a.rs; exit 3")
        .await;
    assert_eq!(o.status, Status::Exited(3), "{}", show(&o));
    assert_eq!(o.stdout.text, "/workspace\nhello from the workspace\n");
    assert_eq!(std::fs::read_to_string(s.workspace.join("made.txt")).unwrap(), "made\n");
    assert_eq!(std::fs::read_to_string(s.workspace.join("src/a.rs")).unwrap(), "fn\n");
    // A test command of a real project passes.
    let o = s.sh("printf 'print(2+2)\\n' > t.py && python3 t.py").await;
    assert!(o.success(), "{}", show(&o));
    assert_eq!(o.stdout.text.trim(), "4");
}

async fn secrets_of_the_host_and_the_state_dir_cannot_be_read(b: Backend) {
    let s = State::new(b);
    let root = s.root.display();
    for path in [
        "/etc/shadow".to_string(),
        "/etc/gshadow".into(),
        "/root/.ssh/id_rsa".into(),
        format!("{root}/flock.db"),
        format!("{root}/workspaces/other/notes.md"),
        "../other/notes.md".into(),
        "../../flock.db".into(),
        "/proc/1/root/etc/shadow".into(),
    ] {
        let o = s.sh(&format!("cat '{path}'")).await;
        assert!(!o.success(), "read {path}: {}", show(&o));
        assert!(!leaked(&o), "read {path}: {}", show(&o));
    }
    // Not even by listing or searching the whole tree.
    let o = s
        .sh("grep -rls --exclude-dir=proc --exclude-dir=sys -e SECRET-DATABASE -e SECRET-OTHER / \
             2>/dev/null; find / -path /proc -prune -o -name flock.db -print 2>/dev/null")
        .await;
    assert!(!leaked(&o) && !o.stdout.text.contains("flock.db"), "{}", show(&o));
    // A link planted in the workspace does not lead out either.
    std::os::unix::fs::symlink(s.root.join("flock.db"), s.workspace.join("db-link")).unwrap();
    let o = s.sh("cat db-link").await;
    assert!(!o.success() && !leaked(&o), "{}", show(&o));
}

async fn nothing_outside_the_workspace_can_be_written(b: Backend) {
    let s = State::new(b);
    for target in [
        "/usr/evil".to_string(),
        "/etc/evil".into(),
        "/evil".into(),
        format!("{}/evil", s.root.display()),
        "../other/evil".into(),
    ] {
        let o = s.sh(&format!("echo x > '{target}'")).await;
        assert!(!o.success(), "wrote {target}: {}", show(&o));
    }
    assert!(!s.root.join("evil").exists() && !s.root.join("workspaces/other/evil").exists());
    assert!(!Path::new("/usr/evil").exists() && !Path::new("/evil").exists());
    // /tmp is private and gone after the command.
    let marker = format!("flock-sandbox-tmp-{}", std::process::id());
    let o = s.sh(&format!("echo x > /tmp/{marker} && cat /tmp/{marker}")).await;
    assert!(o.success(), "{}", show(&o));
    assert!(!Path::new("/tmp").join(&marker).exists());
}

async fn no_network_and_no_unix_sockets(b: Backend) {
    let s = State::new(b);
    // A listener where the supervisor's control socket lives.
    let sock = s.root.join("control.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    tcp.set_nonblocking(true).unwrap();
    let port = tcp.local_addr().unwrap().port();
    let script = format!(
        r#"
import socket
def attempt(name, f):
    try:
        f(); print(name, "CONNECTED")
    except OSError as e:
        print(name, "refused", e.errno)
attempt("inet", lambda: socket.create_connection(("1.1.1.1", 80), timeout=2))
attempt("host-loopback", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=2))
def unix():
    u = socket.socket(socket.AF_UNIX); u.connect("{sock}")
attempt("unix", unix)
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0))
"#,
        sock = sock.display()
    );
    std::fs::write(s.workspace.join("net.py"), script).unwrap();
    let o = s.sh("python3 net.py").await;
    assert!(o.success(), "{}", show(&o));
    assert!(!o.stdout.text.contains("CONNECTED"), "{}", show(&o));
    assert_eq!(o.stdout.text.matches("refused").count(), 6, "{}", show(&o));
    assert!(listener.accept().is_err(), "the control socket was reached");
    assert!(tcp.accept().is_err(), "the host's loopback was reached");
    // The sandbox's own loopback works (a test server inside may listen on it).
    let o = s
        .sh("python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); c=socket.create_connection(s.getsockname()); print('ok')\"")
        .await;
    assert_eq!(o.stdout.text.trim(), "ok", "{}", show(&o));
}

async fn privileged_calls_are_refused(b: Backend) {
    let s = State::new(b);
    let script = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
def check(name, r):
    print(name, "ALLOWED" if r == 0 else "refused", ctypes.get_errno())
check("ptrace-init", libc.ptrace(16, 1, 0, 0))
check("ptrace-parent", libc.ptrace(16, os.getppid(), 0, 0))
check("mount", libc.mount(b"none", b"/workspace", b"tmpfs", 0, None))
check("unshare-user", libc.unshare(0x10000000))
check("chroot", libc.chroot(b"/tmp"))
check("setuid-root", libc.setuid(0))
check("kill-outside", libc.kill(HOST_PID, 9))
"#
    .replace("HOST_PID", &std::process::id().to_string());
    std::fs::write(s.workspace.join("priv.py"), script).unwrap();
    let o = s.sh("python3 priv.py").await;
    assert!(o.success(), "{}", show(&o));
    assert!(!o.stdout.text.contains("ALLOWED"), "{}", show(&o));
    assert_eq!(o.stdout.text.matches("refused").count(), 7, "{}", show(&o));
    // The supervisor's (here: the test's) processes are not even visible.
    let o = s.sh("ls /proc | grep -c '^[0-9]'").await;
    let visible: u32 = o.stdout.text.trim().parse().unwrap_or(99);
    assert!(visible <= 4, "{visible} processes visible: {}", show(&o));
}

async fn the_callers_environment_does_not_leak(b: Backend) {
    let s = State::new(b);
    let o = s.sh("env").await;
    assert!(
        o.stdout.text.contains("HOME=/workspace") && !o.stdout.text.contains("FLOCK"),
        "{}",
        show(&o)
    );
    if b == Backend::Docker {
        return; // the container's environment is only what the backend passes
    }
    // Even a helper started with a secret in its environment (run() clears it) keeps it from
    // the command: a clean environment, and the sandbox's init is out of its reach.
    let policy = serde_json::to_string(
        &s.policy("env; for f in /proc/*/environ; do cat $f; done 2>/dev/null | tr '\\0' '\\n'"),
    )
    .unwrap();
    let out = std::process::Command::new(helper())
        .arg(policy)
        .env("FLOCK_TEST_API_KEY", "sk-conformance-secret")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("sk-conformance-secret"), "{text}");
}

async fn a_fork_bomb_is_contained_and_cleaned_up(b: Backend) {
    let s = State::new(b);
    let marker = format!("forkbomb{}{b:?}", std::process::id());
    let mut policy =
        s.policy(&format!("{marker}() {{ {marker} | {marker} & }}; {marker}; sleep 3"));
    policy.limits.processes = 32;
    let started = Instant::now();
    let o = s.run(policy, Duration::from_secs(10)).await;
    assert!(started.elapsed() < Duration::from_secs(12), "{}", show(&o));
    // Nothing of it is left on the machine once the command is over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(processes_with(&marker), 0, "{}", show(&o));
}

async fn no_process_outlives_the_command_or_its_timeout(b: Backend) {
    let s = State::new(b);
    let marker = format!("lingering{}{b:?}", std::process::id());
    let o = s
        .sh(&format!("(sh -c 'sleep 300 # {marker}' &) ; nohup sh -c 'sleep 301 # {marker}' >/dev/null 2>&1 & echo started"))
        .await;
    assert_eq!(o.stdout.text.trim(), "started", "{}", show(&o));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(processes_with(&marker), 0, "a background process survived: {}", show(&o));

    let started = Instant::now();
    let o = s.run(s.policy(&format!("sleep 60 # {marker}")), Duration::from_secs(1)).await;
    assert_eq!(o.status, Status::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(processes_with(&marker), 0, "the timed-out command survived");
}

async fn the_disk_cannot_be_filled(b: Backend) {
    let s = State::new(b);
    // One big file: the file-size limit stops it.
    let o = s.sh("head -c 200M /dev/zero > big.bin; echo done").await;
    let size = std::fs::metadata(s.workspace.join("big.bin")).map(|m| m.len()).unwrap_or(0);
    assert!(size <= 64 * 1024 * 1024, "{size} bytes written: {}", show(&o));
    std::fs::remove_file(s.workspace.join("big.bin")).ok();
    // Many files: the workspace quota kills the sandbox.
    let mut policy =
        s.policy("i=0; while [ $i -lt 100 ]; do i=$((i+1)); head -c 8M /dev/zero > f$i.bin; sleep 0.01; done");
    policy.limits = Limits { disk_mib: 64, ..Limits::default() };
    let o = s.run(policy, Duration::from_secs(30)).await;
    assert!(!o.success(), "{}", show(&o));
    assert!(o.stderr.text.contains("quota"), "{}", show(&o));
    // The private /tmp is bounded too.
    let mut policy = s.policy("head -c 32M /dev/zero > /tmp/fill");
    policy.limits.tmp_mib = 16;
    let o = s.run(policy, Duration::from_secs(30)).await;
    assert!(!o.success() && o.stderr.text.contains("No space"), "{}", show(&o));
}

async fn memory_and_cpu_are_bounded(b: Backend) {
    let s = State::new(b);
    let mut policy = s.policy("python3 -c \"x = bytearray(512*1024*1024); print('allocated')\"");
    policy.limits.memory_mib = 256;
    let o = s.run(policy, Duration::from_secs(30)).await;
    assert!(!o.success() && !o.stdout.text.contains("allocated"), "{}", show(&o));
    let mut policy = s.policy("while :; do :; done");
    policy.limits.cpu_secs = 1;
    let started = Instant::now();
    let o = s.run(policy, Duration::from_secs(30)).await;
    assert!(matches!(o.status, Status::Signaled(_)), "{}", show(&o));
    assert!(started.elapsed() < Duration::from_secs(10));
}

async fn output_is_bounded_and_setup_errors_are_clear(b: Backend) {
    let s = State::new(b);
    let o = s
        .run_capped(s.policy("yes 0123456789 | head -c 1000000"), Duration::from_secs(30), 4096)
        .await;
    assert!(o.success(), "{}", show(&o));
    assert!(o.stdout.omitted > 990_000 && o.stdout.text.contains("bytes left out"));
    let o = s.run(Policy::new("/no/such/workspace", "true"), Duration::from_secs(5)).await;
    match o.status {
        Status::SetupFailed(msg) => assert!(msg.contains("/no/such/workspace"), "{msg}"),
        other => panic!("expected a setup failure, got {other:?}"),
    }
}
