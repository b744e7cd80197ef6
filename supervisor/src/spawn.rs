//! Spawning agent processes. All spawns happen on one long-lived thread because
//! `PR_SET_PDEATHSIG` fires when the *thread* that started the child exits, not the process: a
//! tokio blocking thread would retire after ten idle seconds and take the children with it.
//!
//! Every child gets its own session (`setsid`, so its process group is its pid and signals to the
//! group reach everything it started), dies with the supervisor (`PR_SET_PDEATHSIG`), an
//! environment cleared to an allowlist, and its workspace as working directory.
//!
//! Children start with `posix_spawn` ([`Launch::Through`]): a vfork, which copies nothing of
//! the supervisor — a fork copies its page tables, which with 1 000 agents running made each
//! spawn cost several milliseconds and every spawn wait on the last. No code of ours may run in
//! a vforked child, so the set-up above runs first thing in `flock-sandbox`
//! (`flock_sandbox::launch`), which starts every child: as its cage, or as `flock-sandbox
//! launch PROGRAM`.
//!
//! Nothing a child starts outlives it: the supervisor and every child are *subreapers*
//! (`PR_SET_CHILD_SUBREAPER`), so a process that detaches (double fork, `setsid`, `nohup`) stays
//! in the tree — adopted by the agent while the agent lives, by the supervisor once it is gone.
//! After a child exits, [`sweep_orphans`] kills whatever the supervisor adopted: a process group
//! alone would miss the ones that left it.

#![allow(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::sync::mpsc as std_mpsc;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitStatus;

use anyhow::{Context, Result, anyhow};
use nix::sys::signal::Signal;
use tokio::sync::oneshot;

/// Variables copied from the supervisor's environment; everything else is dropped.
pub const ENV_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "RUST_BACKTRACE",
    "RUST_LOG",
];

/// What to run.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// Set after the allowlist (FLOCK_* identity, the agent's own `env:`).
    pub env: Vec<(String, String)>,
    /// Handed over an inherited socket (`flock_ipc::handoff`), never the environment: the
    /// spawn's router token, a bridge's platform tokens.
    pub secrets: BTreeMap<String, String>,
}

/// A process the child supervisor started: its pid, its output, and its exit to wait for.
pub struct Started {
    pub pid: u32,
    pub stdout: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>,
    /// Resolves when the process has exited (and been reaped).
    pub exit: Pin<Box<dyn Future<Output = std::io::Result<ExitStatus>> + Send>>,
}

/// What the child supervisor does to processes: start one, signal its group, read its memory,
/// clean up after an exit. [`Spawner`] does it to real processes; the child supervisor's
/// state-machine tests use a fake that records the calls and decides when processes exit.
pub trait Processes: Send + Sync + 'static {
    fn spawn(&self, spec: SpawnSpec) -> Pin<Box<dyn Future<Output = Result<Started>> + Send + '_>>;
    /// Sends `signal` to the process group led by `pid`.
    fn signal(&self, pid: u32, signal: Signal);
    fn rss(&self, pid: u32) -> Option<u64>;
    /// After a child exited: kills what it left behind; how many it killed.
    fn sweep(&self) -> usize;
}

impl Processes for Spawner {
    fn spawn(&self, spec: SpawnSpec) -> Pin<Box<dyn Future<Output = Result<Started>> + Send + '_>> {
        Box::pin(async move {
            let mut child = Spawner::spawn(self, spec).await?;
            Ok(Started {
                pid: child.id().unwrap_or(0),
                stdout: child.stdout.take().map(|o| Box::new(o) as _),
                stderr: child.stderr.take().map(|e| Box::new(e) as _),
                exit: Box::pin(async move { child.wait().await }),
            })
        })
    }

    fn signal(&self, pid: u32, signal: Signal) {
        signal_group(pid, signal);
    }

    fn rss(&self, pid: u32) -> Option<u64> {
        rss_bytes(pid)
    }

    fn sweep(&self) -> usize {
        sweep_after_exit()
    }
}

struct Job {
    spec: SpawnSpec,
    reply: oneshot::Sender<Result<tokio::process::Child>>,
}

/// Handle to the spawning thread.
#[derive(Clone)]
pub struct Spawner {
    tx: std_mpsc::Sender<Job>,
}

/// How children are started.
#[derive(Debug, Clone)]
pub enum Launch {
    /// `posix_spawn` (a vfork: none of the supervisor's memory is copied, so a spawn costs the
    /// same beside 1 000 agents as beside one) through `flock-sandbox` at this path, which sets
    /// the child up before it becomes the program (`flock_sandbox::launch`).
    Through(PathBuf),
    /// fork, the set-up between fork and exec, exec: when `flock-sandbox` is not there. Each
    /// fork copies the supervisor's page tables, so spawns slow down as the swarm grows.
    Fork,
}

impl std::fmt::Debug for Spawner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Spawner")
    }
}

impl Spawner {
    /// Starts the spawning thread; it lives as long as the process (or until every handle drops).
    pub fn start(runtime: tokio::runtime::Handle, launch: Launch) -> Result<Self> {
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("flock-spawner".into())
            .spawn(move || {
                // tokio's child reaping needs the runtime context on the forking thread.
                let _guard = runtime.enter();
                for job in rx {
                    // Registered under the lock, so a sweep never takes a newborn for an orphan.
                    let mut spawned = lock_spawned();
                    let child = match &launch {
                        Launch::Through(launcher) => spawn_launched(&job.spec, launcher),
                        Launch::Fork => spawn_forked(&job.spec),
                    };
                    if let Ok(c) = &child
                        && let Some(pid) = c.id()
                    {
                        spawned.register(pid);
                    }
                    drop(spawned);
                    let _ = job.reply.send(child);
                }
            })
            .context("start the spawner thread")?;
        Ok(Spawner { tx })
    }

    pub async fn spawn(&self, spec: SpawnSpec) -> Result<tokio::process::Child> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job { spec, reply }).map_err(|_| anyhow!("the spawner thread is gone"))?;
        rx.await.map_err(|_| anyhow!("the spawner thread dropped the request"))?
    }
}

/// The command for `spec`: its program, arguments, workspace, output piped, environment
/// cleared to the allowlist plus the spec's own.
fn command(
    spec: &SpawnSpec,
    program: &std::path::Path,
    args: &[String],
) -> Result<std::process::Command> {
    std::fs::create_dir_all(&spec.cwd)
        .with_context(|| format!("create workspace {}", spec.cwd.display()))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .current_dir(&spec.cwd)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for key in ENV_ALLOWLIST {
        if let Some(v) = std::env::var_os(key) {
            cmd.env(key, v);
        }
    }
    // The child logs as the supervisor does (RUST_LOG, when set, came with the allowlist), and
    // in text mode leaves the timestamp to the log hub, which stamps each line as it arrives.
    for (key, value) in flock_log::child_env() {
        cmd.env(key, value);
    }
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    Ok(cmd)
}

/// Starts `spec` with `posix_spawn` through `launcher` (`flock-sandbox`): the program itself
/// when it is the launcher (an agent's cage), else `launcher launch PROGRAM ARGS…`. No code of
/// ours runs in the child before exec (std takes `posix_spawn` only then): the launcher does
/// the set-up (`flock_sandbox::launch`), and the secrets go in on standard input.
fn spawn_launched(spec: &SpawnSpec, launcher: &std::path::Path) -> Result<tokio::process::Child> {
    let mut cmd = if spec.program == launcher {
        command(spec, launcher, &spec.args)?
    } else {
        let mut args = vec!["launch".to_owned(), spec.program.display().to_string()];
        args.extend(spec.args.iter().cloned());
        command(spec, launcher, &args)?
    };
    cmd.env(LAUNCHED_BY, std::process::id().to_string());
    if !spec.secrets.is_empty() {
        cmd.stdin(Stdio::from(std::os::fd::OwnedFd::from(secrets_socket(&spec.secrets)?)));
    }
    let child =
        tokio::process::Command::from(cmd).kill_on_drop(false).spawn().with_context(|| {
            format!("spawn {} through {}", spec.program.display(), launcher.display())
        })?;
    Ok(child)
}

/// `flock_sandbox::launch::LAUNCHED_BY` (written here to keep the sandbox's dependencies out of
/// the supervisor).
const LAUNCHED_BY: &str = "FLOCK_LAUNCHED_BY";

/// The child's end of a socket pair holding `secrets` (the supervisor's end is closed).
fn secrets_socket(secrets: &BTreeMap<String, String>) -> Result<std::os::unix::net::UnixStream> {
    use std::io::Write;
    let (mut ours, theirs) =
        std::os::unix::net::UnixStream::pair().context("a socket pair for the secrets")?;
    let bytes = flock_ipc::handoff::encode(secrets);
    anyhow::ensure!(bytes.len() <= flock_ipc::handoff::MAX_SECRETS_BYTES, "too many secrets");
    ours.write_all(&bytes).context("hand over the secrets")?;
    Ok(theirs)
}

/// Starts `spec` the old way: fork, the set-up in the child, exec.
fn spawn_forked(spec: &SpawnSpec) -> Result<tokio::process::Child> {
    let mut cmd = command(spec, &spec.program, &spec.args)?;
    let _handoff = hand_over(&mut cmd, &spec.secrets)?;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe libc
    // functions (setsid, prctl, getppid, _exit); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Kept across exec: whatever the child starts and abandons stays its own.
            if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let child = tokio::process::Command::from(cmd)
        .kill_on_drop(false)
        .spawn()
        .with_context(|| format!("spawn {}", spec.program.display()))?;
    Ok(child)
}

/// Hands `secrets` to the child `cmd` will start over an inherited socket (`flock_ipc::handoff`),
/// never its environment: they go into one end of a socket pair, which is closed; the child
/// inherits the other end (close-on-exec cleared in the child only) and reads them once. Keep
/// the returned end until the child is spawned.
pub fn hand_over(
    cmd: &mut std::process::Command,
    secrets: &BTreeMap<String, String>,
) -> Result<Option<std::os::unix::net::UnixStream>> {
    use std::os::fd::AsRawFd;
    if secrets.is_empty() {
        return Ok(None);
    }
    let theirs = secrets_socket(secrets)?;
    let fd = theirs.as_raw_fd();
    cmd.env(flock_ipc::handoff::SECRETS_FD, fd.to_string());
    // SAFETY: fcntl is async-signal-safe; the closure allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(Some(theirs))
}

/// Pids this process spawned and has not seen go: everything else among its children is an
/// orphan it adopted. Each pid carries the number of the spawn that registered it, so a sweep
/// that read the process table without the lock forgets only pids registered before it began.
static SPAWNED: Mutex<Spawned> = Mutex::new(Spawned { pids: BTreeMap::new(), spawns: 0 });

struct Spawned {
    /// Pid → the spawn count when it was registered.
    pids: BTreeMap<u32, u64>,
    spawns: u64,
}

impl Spawned {
    fn register(&mut self, pid: u32) {
        self.spawns += 1;
        self.pids.insert(pid, self.spawns);
    }
}

fn lock_spawned() -> std::sync::MutexGuard<'static, Spawned> {
    SPAWNED.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Makes this process the reaper of its descendants' orphans (see the module docs).
pub fn become_subreaper() -> Result<()> {
    // SAFETY: prctl with these arguments only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error()).context("prctl(PR_SET_CHILD_SUBREAPER)");
    }
    Ok(())
}

/// Kills and reaps every child of this process it did not spawn itself: what exited agents (or
/// the model server) left behind. Repeats until none is left, since killing one hands its own
/// children to us. Returns how many it killed. Blocking: call it from a blocking task.
///
/// It reads the whole process table (`/proc`) without holding the spawn lock, so spawning goes
/// on meanwhile; see [`sweep_after_exit`] for many exits at once.
pub fn sweep_orphans() -> usize {
    let me = std::process::id() as i32;
    let mut killed = 0;
    // Bounded: a fork bomb racing the sweep is stopped by the next sweep, not by this loop.
    for _ in 0..200 {
        let began = lock_spawned().spawns;
        let children: BTreeSet<u32> = children_of(me).into_iter().map(|p| p as u32).collect();
        let orphans: Vec<u32> = {
            let mut spawned = lock_spawned();
            // Gone: registered before this read of the table and not in it. A pid registered
            // since is kept (the read may have missed it); one seen in the table but spawned
            // meanwhile was registered before the lock was free again.
            spawned.pids.retain(|pid, n| *n > began || children.contains(pid));
            children.into_iter().filter(|pid| !spawned.pids.contains_key(pid)).collect()
        };
        if orphans.is_empty() {
            break;
        }
        for &pid in &orphans {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            // A killed process is ours to reap (it is no tokio child: nobody else waits for it).
            let _ = nix::sys::wait::waitpid(pid, None);
            killed += 1;
        }
    }
    killed
}

/// Whether a sweep runs, and whether an exit asked for another pass while it did.
static SWEEPING: Mutex<(bool, bool)> = Mutex::new((false, false));

/// [`sweep_orphans`] after a child's exit. One sweep runs at a time: an exit that comes while
/// one runs asks it for one more pass instead of starting its own, so 100 agents killed at
/// once cost a few reads of the process table, not 100. Returns how many this call killed
/// (0 when it only asked the running sweep for another pass).
pub fn sweep_after_exit() -> usize {
    let lock = || SWEEPING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    {
        let mut s = lock();
        if s.0 {
            s.1 = true;
            return 0;
        }
        *s = (true, false);
    }
    let mut killed = 0;
    loop {
        killed += sweep_orphans();
        let mut s = lock();
        if !s.1 {
            s.0 = false;
            return killed;
        }
        s.1 = false;
    }
}

/// The pids whose parent is `parent`, from `/proc/<pid>/stat`.
fn children_of(parent: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| flock_actors::server::parent_pid(pid) == Some(parent))
        .collect()
}

/// Sends `signal` to the process group led by `pid` (each child leads its own session) — or
/// to `pid` alone while it has no group yet (launched, it makes its session first thing).
pub fn signal_group(pid: u32, signal: Signal) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    if nix::sys::signal::killpg(pid, signal) == Err(nix::errno::Errno::ESRCH) {
        let _ = nix::sys::signal::kill(pid, signal);
    }
}

/// Resident set size of a process and its direct children, from `/proc/<pid>/statm`: a caged
/// agent runs as the child of the process the supervisor started (its stand-in, see
/// `flock_sandbox::cage`), so both count.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let rss = |pid: u32| -> Option<u64> {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * page_size())
    };
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let theirs: u64 =
        children.split_whitespace().filter_map(|c| c.parse().ok()).filter_map(rss).sum();
    Some(rss(pid)? + theirs)
}

/// CPU time (user + system) a process has used, in seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after `(comm)`, which may hold spaces: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Some((utime + stime) as f64 / if ticks > 0 { ticks as f64 } else { 100.0 })
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { 4096 }
}

/// How to get a missing sibling binary: build them all side by side.
pub const BUILD_HINT: &str =
    "`scripts/install` builds it beside the others (or `cargo build --profile dist --bins`)";

/// A Flock binary: the path in `env_var` if set, else `name` next to this executable; the error
/// says where it looked and `hint` (how to get it).
pub fn sibling_binary(name: &str, env_var: &str, hint: &str) -> Result<std::path::PathBuf> {
    if let Some(p) = std::env::var_os(env_var) {
        return Ok(std::path::PathBuf::from(p));
    }
    let exe = std::env::current_exe().context("locate the flock-supervisor executable")?;
    let candidate = exe.with_file_name(name);
    if candidate.exists() {
        return Ok(candidate);
    }
    Err(anyhow!("cannot find {name} next to {}: {hint} (or set {env_var})", exe.display()))
}

/// How a child ended, for logs and `ps` ("code 3", "signal SIGKILL").
pub(crate) fn describe(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("code {code}"),
        (None, Some(sig)) => match nix::sys::signal::Signal::try_from(sig) {
            Ok(s) => format!("signal {}", s.as_str()),
            Err(_) => format!("signal {sig}"),
        },
        _ => "unknown".into(),
    }
}

/// A secret of 128 bits from the operating system's CSPRNG (a per-spawn agent token, the
/// embedded model's bearer token): unguessable, unlike a fast PRNG whose state can be inferred.
pub(crate) fn new_token() -> String {
    let mut bytes = [0u8; 16];
    // getrandom(2) does not fail on Linux once the pool is initialised; fall back loudly.
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
