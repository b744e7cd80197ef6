//! The agent cage: `flock-sandbox cage CAGE_JSON PROGRAM [ARGS…]` confines an agent process
//! (built-in or a custom `command:`), then becomes it (`exec`, same pid, same descriptors).
//!
//! An agent runs as the swarm's owner, so the kernel's usual checks (same uid) let it do what the
//! owner can. The cage takes away what matters to Flock:
//!
//! - **the state dir**: a new mount namespace covers it with an empty, read-only tmpfs, and
//!   binds back only what this agent needs, at the same paths — its workspace, the router
//!   socket, and the shared memory folder read-only (the supervisor writes it for the agents). The database, the journal, the logs, `run/` (the control
//!   socket, the dashboard's URL and token, the supervisor's pid) and the other agents'
//!   workspaces are not there. Without root, the namespaces belong to a new user namespace, and a
//!   second one on top makes the mounts *locked*: nothing inside can unmount them to look under;
//! - **other processes**: the agent is PID 1 of a PID namespace of its own, with its own `/proc`:
//!   it sees no process but its own, and when it ends — or when the process the supervisor
//!   started, its stand-in, is killed — the kernel kills everything it started, however
//!   detached. A Landlock domain scoped for signals and abstract Unix sockets (ABI 6, Linux 6.12;
//!   where the kernel has it) adds to that; `/proc/<pid>/environ`,
//!   `mem` and descriptors of processes outside are closed to it by its user namespace (as root:
//!   by the capabilities it lost).
//!
//! The process the supervisor starts stays as the agent's stand-in: it waits for the agent and
//! ends as the agent ended (same exit code, or killed by the same signal), and anything that
//! kills it kills the agent (its parent-death signal).
//!
//! The network, the system folders and the rest of the filesystem stay as they are: workers'
//! commands get their own, much tighter sandbox (`helper`). As root, no user namespace is made
//! (root may make a mount namespace by itself); instead the agent loses every capability but
//! those over files and ids ([`ROOT_KEEPS`]), so it can neither take the cover off nor trace,
//! signal or inspect other processes. Swarms are meant to run as an unprivileged user.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::unistd::{Gid, Uid};
use serde::{Deserialize, Serialize};

use crate::SETUP_FAILED;

/// What an agent's cage hides and what it shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cage {
    /// Hidden (an empty read-only tmpfs over it), but for `show`.
    pub hidden: PathBuf,
    /// Paths under `hidden` shown again, read-write, at their own paths (folders, files or
    /// sockets; each must exist).
    pub show: Vec<PathBuf>,
    /// Paths under `hidden` shown again read-only (the swarm's memory folder: another process
    /// writes it). The second user namespace locks the flag: it cannot be remounted writable.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
}

type Result<T> = std::result::Result<T, String>;

/// The flags of the mount `path` is on that a bind remount must keep (nosuid, nodev, noexec and
/// the atime rule).
fn kept_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::{FsFlags, statvfs};
    let Ok(st) = statvfs(path) else { return MsFlags::MS_NOSUID | MsFlags::MS_NODEV };
    let f = st.flags();
    let pairs = [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ];
    pairs.iter().filter(|(st, _)| f.contains(*st)).fold(MsFlags::empty(), |acc, (_, ms)| acc | *ms)
}

/// `flock-sandbox cage CAGE_JSON PROGRAM [ARGS…]`: never returns; on a setup error, exits
/// [`SETUP_FAILED`] with a `flock-sandbox: cage:` line on stderr.
pub fn main(args: &[String]) -> ! {
    let (Some(json), Some(program)) = (args.first(), args.get(1)) else {
        eprintln!("flock-sandbox: cage: usage: flock-sandbox cage CAGE_JSON PROGRAM [ARGS…]");
        std::process::exit(SETUP_FAILED)
    };
    let e = match serde_json::from_str::<Cage>(json) {
        Ok(cage) => match enter(&cage) {
            Ok(()) => exec(program, &args[1..]),
            Err(e) => e,
        },
        Err(e) => format!("the cage is not valid JSON: {e}"),
    };
    eprintln!("flock-sandbox: cage: {e}");
    std::process::exit(SETUP_FAILED)
}

/// Confines the calling (single-threaded) process as `cage` says.
pub fn enter(cage: &Cage) -> Result<()> {
    if !cage.hidden.is_absolute() {
        return Err(format!("{} is not an absolute path", cage.hidden.display()));
    }
    let root = Uid::effective().is_root();
    if root {
        unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("mount namespace: {}", e.desc()))?;
    } else {
        own_user_namespace(CloneFlags::CLONE_NEWNS)?;
    }
    // Held open (in the new namespace: a bind's source must be in it) before the tmpfs covers
    // them; bound from /proc/self/fd afterwards.
    let mut held = Vec::new();
    let shown = cage.show.iter().map(|p| (p, false));
    for (path, read_only) in shown.chain(cage.read_only.iter().map(|p| (p, true))) {
        if !path.starts_with(&cage.hidden) {
            continue; // outside what is hidden: visible as it is
        }
        use std::os::unix::fs::OpenOptionsExt;
        let fd = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(path)
            .map_err(|e| format!("open {}: {e}", path.display()))?;
        let dir = fd.metadata().map(|m| m.is_dir()).unwrap_or(false);
        held.push((path.clone(), fd, dir, read_only));
    }
    let ms = |what: &str| {
        let what = what.to_owned();
        move |e: nix::errno::Errno| format!("{what}: {}", e.desc())
    };
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(ms("make / private"))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("tmpfs"), &cage.hidden, Some("tmpfs"), flags, Some("size=64k,mode=0700"))
        .map_err(ms(&format!("cover {}", cage.hidden.display())))?;
    for (path, fd, dir, read_only) in &held {
        mount_point(path, *dir)?;
        let source = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        mount(Some(&source), path, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
            .map_err(ms(&format!("show {}", path.display())))?;
        if *read_only {
            // In a user namespace the kernel refuses a remount that changes a locked flag of the
            // mount it came from (its atime rule above all): keep them, add read-only.
            let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | kept_flags(path);
            mount(None::<&str>, path, None::<&str>, ro, None::<&str>)
                .map_err(ms(&format!("show {} read-only", path.display())))?;
        }
    }
    drop(held);
    mount(
        None::<&str>,
        &cage.hidden,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | flags,
        None::<&str>,
    )
    .map_err(ms("make the cover read-only"))?;
    if root {
        // Root keeps no power over other processes or mounts (the cover stays on).
        drop_root_powers()?;
    } else {
        // A second user namespace over the first: the mounts above come into it locked, so not
        // even the namespace's own capabilities can take the cover off.
        own_user_namespace(CloneFlags::CLONE_NEWNS)?;
    }
    // From here on nobody else may attach to this process or take its descriptors (the secrets'
    // socket among them). Not sooner: a non-dumpable process cannot write its own id maps.
    nix::sys::prctl::set_dumpable(false).map_err(|e| format!("PR_SET_DUMPABLE: {}", e.desc()))?;
    // The agent becomes PID 1 of a namespace of its own: it sees no other process, and when it
    // ends — or when this process (the one the supervisor knows, which dies with it) is killed —
    // the kernel kills everything it started, however detached.
    unshare(CloneFlags::CLONE_NEWPID).map_err(|e| format!("PID namespace: {}", e.desc()))?;
    let (alive_r, alive_w) = nix::unistd::pipe().map_err(|e| format!("pipe: {}", e.desc()))?;
    // SAFETY: the cage is single-threaded; the child goes on to exec.
    #[allow(unsafe_code)]
    let forked = unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {}", e.desc()))?;
    match forked {
        nix::unistd::ForkResult::Parent { child } => {
            drop(alive_r);
            close_handed_secrets();
            std::process::exit(stand_in_for(child, alive_w))
        }
        nix::unistd::ForkResult::Child => {
            drop(alive_w);
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(|e| format!("PR_SET_PDEATHSIG: {}", e.desc()))?;
            // The parent may have died before that took effect: then the pipe is closed.
            let mut fds = [nix::poll::PollFd::new(
                std::os::fd::AsFd::as_fd(&alive_r),
                nix::poll::PollFlags::POLLIN,
            )];
            if nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap_or(1) != 0 {
                return Err("the cage's parent exited".into());
            }
            drop(alive_r);
            mount(
                Some("proc"),
                "/proc",
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )
            .map_err(ms("mount this namespace's /proc"))?;
            scope_to_self()
        }
    }
}

/// The stand-in has no use for the socket the supervisor handed the agent's secrets over (the
/// agent reads its own copy): it closes its copy rather than hold it for the agent's life.
fn close_handed_secrets() {
    let fd = std::env::var(SECRETS_FD).ok().and_then(|v| v.trim().parse::<i32>().ok());
    if let Some(fd) = fd.filter(|fd| *fd > 2) {
        // SAFETY: closing a descriptor this process inherited and never uses.
        #[allow(unsafe_code)]
        unsafe {
            libc::close(fd);
        }
    }
}

/// `flock_ipc::handoff::SECRETS_FD` (the sandbox does not depend on flock-ipc).
const SECRETS_FD: &str = "FLOCK_SECRETS_FD";

/// The process the supervisor started, standing in for the agent (PID 1 of its namespace):
/// waits for it and ends as it ended (its exit code, or killed by the same signal). Anything
/// that kills this process kills the agent (its parent-death signal) and with it the namespace.
fn stand_in_for(child: nix::unistd::Pid, _alive: std::os::fd::OwnedFd) -> i32 {
    use nix::sys::wait::{WaitStatus, waitpid};
    loop {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                // Mirror the signal, so the supervisor reports it as it would for the agent.
                // SAFETY: resetting a disposition to the default and raising a signal.
                #[allow(unsafe_code)]
                unsafe {
                    libc::signal(sig as i32, libc::SIG_DFL);
                    libc::raise(sig as i32);
                }
                return 128 + sig as i32;
            }
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return SETUP_FAILED,
        }
    }
}

/// What an agent running as root keeps of root's capabilities: file ownership and access (its
/// workspace, and the `exec` sandbox handing it to `nobody`) and changing ids (the sandbox's
/// user mapping). Everything else — among it `CAP_SYS_ADMIN` (mounts: the cover could come
/// off), `CAP_SYS_PTRACE` (other processes' memory, environment, descriptors) and `CAP_KILL` —
/// leaves the bounding set, so the agent's `exec` does not get it back.
const ROOT_KEEPS: &[u32] = &[
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    2,  // CAP_DAC_READ_SEARCH
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    10, // CAP_NET_BIND_SERVICE
];

#[allow(unsafe_code)]
fn drop_root_powers() -> Result<()> {
    for cap in 0..64u32 {
        if ROOT_KEEPS.contains(&cap) {
            continue;
        }
        // SAFETY: prctl(PR_CAPBSET_DROP, cap) only changes this process's bounding set.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break; // past the last capability this kernel knows
            }
            return Err(format!("drop capability {cap}: {e}"));
        }
    }
    Ok(())
}

/// A new user namespace (with `extra` namespaces) in which this process keeps its own uid and
/// gid.
fn own_user_namespace(extra: CloneFlags) -> Result<()> {
    let (uid, gid) = (Uid::effective().as_raw(), Gid::effective().as_raw());
    unshare(CloneFlags::CLONE_NEWUSER | extra).map_err(|e| {
        format!(
            "cannot create a user namespace ({}); unprivileged user namespaces may be disabled \
             (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)",
            e.desc()
        )
    })?;
    let w = |file: &str, text: String| {
        std::fs::write(format!("/proc/self/{file}"), text).map_err(|e| format!("{file}: {e}"))
    };
    w("uid_map", format!("{uid} {uid} 1\n"))?;
    w("setgroups", "deny".into())?;
    w("gid_map", format!("{gid} {gid} 1\n"))
}

/// Creates `path` (a folder, or an empty file for a file or socket) as a mount point in the
/// cover, with its parents.
fn mount_point(path: &Path, dir: bool) -> Result<()> {
    let io = |e: std::io::Error| format!("create {}: {e}", path.display());
    if dir {
        return std::fs::create_dir_all(path).map_err(io);
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, b"").map_err(io)
}

/// A Landlock domain that handles no file access (mounts stay possible for the `exec`
/// sandbox) but scopes signals and abstract Unix sockets to itself (ABI 6, Linux 6.12). Best
/// effort: the PID namespace already leaves the agent no pid outside to signal; what an older
/// kernel loses is the scope on abstract sockets.
fn scope_to_self() -> Result<()> {
    use landlock::{ABI, Access, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope};
    let ll = |e: landlock::RulesetError| format!("landlock: {e}");
    Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .scope(Scope::from_all(ABI::V6))
        .map_err(ll)?
        .create()
        .map_err(ll)?
        .restrict_self()
        .map_err(ll)?;
    Ok(())
}

fn exec(program: &str, argv: &[String]) -> String {
    let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
    let args: Vec<CString> = argv.iter().map(|a| c(a)).collect();
    match nix::unistd::execvp(&c(program), &args) {
        Ok(never) => match never {},
        Err(e) => format!("exec {program}: {}", e.desc()),
    }
}
