//! The `flock-sandbox` helper's side: builds the sandbox and runs the command in it.
//!
//! Three processes, so that each step has the privileges it needs and no more:
//!
//! - the **helper** (outside): hands the workspace to the sandbox user when Flock runs as
//!   root, writes the new user namespace's id maps (only a process outside may), then waits
//!   for the sandbox and kills it if the workspace outgrows its quota;
//! - the **namespace child**: enters the new namespaces and waits for its init;
//! - the sandbox's **init** (PID 1 of the new PID namespace): builds a new root from bind
//!   mounts (system folders read-only, a few `/etc` files, `/dev` nodes, a fresh `/proc`, a
//!   private `/tmp`, the workspace at `/workspace`), pivots into it, and runs the command as an
//!   unprivileged user under rlimits, Landlock and seccomp. When the command ends, init exits,
//!   and the kernel kills whatever the command left behind.
//!
//! Every process below the helper dies with its parent (`PR_SET_PDEATHSIG`), so killing the
//! helper (the caller's timeout) takes the whole sandbox down.

#![allow(unsafe_code)] // fork(2), ioctl(2) and pidfd_open(2) in a single-threaded helper.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use nix::sys::prctl;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::{Signal, kill};
use nix::sys::statvfs::{FsFlags, statvfs};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Gid, Pid, Uid, fork, getppid, pipe, read, write};

use crate::{INNER_ID, Policy, ROOT_SANDBOX_UID, SETUP_FAILED};

/// Where the workspace appears inside the sandbox.
pub const WORKSPACE: &str = "/workspace";

/// System folders bound read-only (those that exist; merged-/usr links are recreated as links).
const SYSTEM: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];
/// The files and folders of `/etc` programs need, and nothing else (no shadow, no keys).
const ETC: &[&str] = &[
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ssl",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/mime.types",
    "/etc/magic",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/profile",
    "/etc/bash.bashrc",
    "/etc/inputrc",
    "/etc/locale.alias",
    "/etc/python3",
    "/etc/perl",
];
/// Device nodes bound into the sandbox's `/dev`.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
const PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
const MIB: u64 = 1024 * 1024;

type Result<T> = std::result::Result<T, String>;

fn err(what: &str) -> impl Fn(nix::errno::Errno) -> String + '_ {
    move |e| format!("{what}: {}", e.desc())
}

/// The helper's `main`: `flock-sandbox POLICY_JSON`. Exits with the command's status (128 +
/// signal when a signal ended it), or [`SETUP_FAILED`] with a `flock-sandbox:` line on stderr.
pub fn main() -> ! {
    let code = match std::env::args().nth(1).as_deref().map(serde_json::from_str::<Policy>) {
        Some(Ok(policy)) => helper(&policy).unwrap_or_else(|e| fail(&e)),
        Some(Err(e)) => fail(&format!("the policy is not valid JSON: {e}")),
        None => fail("usage: flock-sandbox POLICY_JSON (flock-agent starts it for `exec`)"),
    };
    std::process::exit(code)
}

fn fail(msg: &str) -> i32 {
    eprintln!("flock-sandbox: {msg}");
    SETUP_FAILED
}

fn status_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

fn helper(p: &Policy) -> Result<i32> {
    if !p.workspace.is_absolute() || !p.workspace.is_dir() {
        return Err(format!("the workspace {} is not an existing folder", p.workspace.display()));
    }
    let root = Uid::effective().is_root();
    let (uid, gid) = if root {
        (ROOT_SANDBOX_UID, ROOT_SANDBOX_UID)
    } else {
        (Uid::effective().as_raw(), Gid::effective().as_raw())
    };
    if root {
        hand_over(&p.workspace, uid, gid)?;
    }
    let baseline = disk_usage(&p.workspace);
    let (ready_r, ready_w) = pipe().map_err(err("pipe"))?;
    let (go_r, go_w) = pipe().map_err(err("pipe"))?;
    let helper_pid = Pid::this();
    // SAFETY: the helper is single-threaded; the child only calls async-signal-safe system
    // calls and Rust code that does not depend on other threads' locks.
    match unsafe { fork() }.map_err(err("fork"))? {
        ForkResult::Child => {
            drop((ready_r, go_w));
            let code =
                namespace_child(p, helper_pid, root, ready_w, go_r).unwrap_or_else(|e| fail(&e));
            std::process::exit(code)
        }
        ForkResult::Parent { child } => {
            drop((ready_w, go_r));
            let mut b = [0u8; 1];
            if read(&ready_r, &mut b).unwrap_or(0) == 0 {
                // The child failed before entering the namespaces; it said why on stderr.
                return Ok(waitpid(child, None).ok().and_then(status_code).unwrap_or(SETUP_FAILED));
            }
            if let Err(e) = write_id_maps(child, uid, gid) {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Err(e);
            }
            write(&go_w, b"g").map_err(err("signal the sandbox"))?;
            watch(child, p, baseline)
        }
    }
}

/// Maps [`INNER_ID`] inside to `uid`/`gid` outside. Unprivileged, a process may map only its
/// own ids (and must give up `setgroups` first); as root it maps the sandbox user.
fn write_id_maps(child: Pid, uid: u32, gid: u32) -> Result<()> {
    let proc = PathBuf::from(format!("/proc/{child}"));
    let w = |file: &str, text: String| {
        std::fs::write(proc.join(file), text).map_err(|e| format!("write {file}: {e}"))
    };
    w("uid_map", format!("{INNER_ID} {uid} 1\n"))?;
    w("setgroups", "deny".into())?;
    w("gid_map", format!("{INNER_ID} {gid} 1\n"))
}

/// Waits for the sandbox; kills it if the workspace grows past its quota.
fn watch(child: Pid, p: &Policy, baseline: u64) -> Result<i32> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, child.as_raw(), 0) } as i32;
    let quota = p.limits.disk_mib * MIB;
    let mut over = false;
    if fd >= 0 {
        loop {
            let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            let n = unsafe { libc::poll(&mut pfd, 1, 100) };
            if n != 0 {
                break; // exited (or poll failed: fall back to a plain wait)
            }
            if disk_usage(&p.workspace).saturating_sub(baseline) > quota {
                over = true;
                let _ = kill(child, Signal::SIGKILL);
                break;
            }
        }
        // SAFETY: fd is ours and closed once.
        unsafe { libc::close(fd) };
    }
    let status = waitpid(child, None).map_err(err("wait for the sandbox"))?;
    if over {
        eprintln!(
            "flock-sandbox: killed: the workspace grew by more than its {} MiB quota",
            p.limits.disk_mib
        );
    }
    Ok(status_code(status).unwrap_or(SETUP_FAILED))
}

fn namespace_child(
    p: &Policy,
    helper: Pid,
    root: bool,
    ready: OwnedFd,
    go: OwnedFd,
) -> Result<i32> {
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(err("PR_SET_PDEATHSIG"))?;
    if getppid() != helper {
        return Err("the helper exited".into());
    }
    if root {
        // Root's supplementary groups would follow it into the namespace.
        nix::unistd::setgroups(&[]).map_err(err("setgroups"))?;
    }
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if !p.network {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    unshare(flags).map_err(|e| {
        format!(
            "cannot create namespaces ({}); unprivileged user namespaces may be disabled \
             (sysctl kernel.unprivileged_userns_clone / user.max_user_namespaces)",
            e.desc()
        )
    })?;
    write(&ready, b"u").map_err(err("signal the helper"))?;
    let mut b = [0u8; 1];
    if read(&go, &mut b).unwrap_or(0) == 0 {
        return Err("the helper could not map the sandbox user".into());
    }
    drop((ready, go));
    // SAFETY: single-threaded, as above. The first child is PID 1 of the new namespace.
    match unsafe { fork() }.map_err(err("fork"))? {
        ForkResult::Child => {
            let code = init(p).unwrap_or_else(|e| fail(&e));
            std::process::exit(code)
        }
        ForkResult::Parent { child } => loop {
            match waitpid(child, None) {
                Ok(s) => {
                    if let Some(code) = status_code(s) {
                        return Ok(code);
                    }
                }
                Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(format!("wait for the sandbox's init: {}", e.desc())),
            }
        },
    }
}

/// PID 1 of the sandbox: builds the root, starts the command, reaps, exits with its status.
fn init(p: &Policy) -> Result<i32> {
    // Become the mapped user (files it creates need an owner the namespace knows); a change
    // between ids that are not the namespace's root keeps the capabilities the mounts need.
    // The parent-death signal comes after: a change of user clears it.
    let parent = getppid();
    let carried = gather(p)?;
    become_inner()?;
    prctl::set_pdeathsig(Signal::SIGKILL).map_err(err("PR_SET_PDEATHSIG"))?;
    if getppid() != parent {
        return Err("the sandbox's parent exited".into());
    }
    build_root(p, carried)?;
    let _ = nix::unistd::sethostname("flock-sandbox");
    if !p.network {
        loopback_up();
    }
    // SAFETY: single-threaded, as above.
    match unsafe { fork() }.map_err(err("fork"))? {
        ForkResult::Child => {
            let e = command(p);
            std::process::exit(fail(&e))
        }
        ForkResult::Parent { child } => loop {
            match waitpid(None::<Pid>, None) {
                Ok(s) if s.pid() == Some(child) => {
                    if let Some(code) = status_code(s) {
                        return Ok(code);
                    }
                }
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => return Err(format!("wait for the command: {}", e.desc())),
            }
        },
    }
}

/// The flags a read-only remount must keep: a user namespace may not clear the ones the
/// original mount has (nosuid, nodev, noexec, atime).
fn locked_flags(path: &Path) -> MsFlags {
    let mut f = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if let Ok(s) = statvfs(path) {
        let has = |x: FsFlags| s.flags().contains(x);
        if has(FsFlags::ST_NOEXEC) {
            f |= MsFlags::MS_NOEXEC;
        }
        if has(FsFlags::ST_NOATIME) {
            f |= MsFlags::MS_NOATIME;
        }
        if has(FsFlags::ST_NODIRATIME) {
            f |= MsFlags::MS_NODIRATIME;
        }
        if has(FsFlags::ST_RELATIME) {
            f |= MsFlags::MS_RELATIME;
        }
    }
    f
}

fn bind(src: &Path, dst: &Path, read_only: bool) -> Result<()> {
    let what = || format!("bind {} at {}", src.display(), dst.display());
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
        .map_err(|e| format!("{}: {}", what(), e.desc()))?;
    let mut flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | locked_flags(src);
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    mount(None::<&str>, dst, None::<&str>, flags, None::<&str>)
        .map_err(|e| format!("{} (remount): {}", what(), e.desc()))
}

/// Creates `dst` as a mount point like `src` (a folder or an empty file) with its parents.
fn mount_point(src: &Path, dst: &Path) -> Result<()> {
    let io = |e: std::io::Error| format!("create {}: {e}", dst.display());
    if src.is_dir() {
        std::fs::create_dir_all(dst).map_err(io)
    } else {
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(dst, b"").map_err(io)
    }
}

/// A host path held open (`O_PATH`) before the new root covers it (the workspace may live
/// under `/tmp`, where the new root is mounted); mounts use it through `/proc/self/fd`.
struct Held {
    path: PathBuf,
    fd: std::fs::File,
}

impl Held {
    fn open(path: &Path) -> Result<Option<Held>> {
        use std::os::unix::fs::OpenOptionsExt;
        match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_PATH).open(path) {
            Ok(fd) => Ok(Some(Held { path: path.to_path_buf(), fd })),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("open {}: {e}", path.display())),
        }
    }

    fn source(&self) -> PathBuf {
        use std::os::fd::AsRawFd;
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }

    /// Binds it at its own path under `new_root` (or at `at`).
    fn carry(&self, new_root: &Path, at: Option<&Path>, read_only: bool) -> Result<()> {
        let at = at.unwrap_or(&self.path);
        let dst = new_root.join(at.strip_prefix("/").unwrap_or(at));
        mount_point(&self.source(), &dst)?;
        bind(&self.source(), &dst, read_only).map_err(|e| {
            e.replace(&self.source().display().to_string(), &self.path.display().to_string())
        })
    }
}

/// What the new root carries over from the host, held open (`O_PATH`) by the sandbox's init
/// while it still has the caller's identity: the sandbox user may not be able to walk to the
/// workspace (a 0700 state dir), and the new root covers `/tmp`, where a workspace may live.
struct Carried {
    /// Merged-/usr links at the top (/bin -> usr/bin), recreated as links.
    links: Vec<(PathBuf, PathBuf)>,
    held: Vec<Held>,
    workspace: Held,
    devices: Vec<Held>,
}

fn gather(p: &Policy) -> Result<Carried> {
    let mut links = Vec::new();
    let mut held = Vec::new();
    for path in
        SYSTEM.iter().chain(ETC).map(Path::new).chain(p.read_only.iter().map(PathBuf::as_path))
    {
        if !path.is_absolute() {
            return Err(format!("read-only path {} is not absolute", path.display()));
        }
        let top_link = path.parent() == Some(Path::new("/"))
            && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        if top_link {
            let target =
                std::fs::read_link(path).map_err(|e| format!("{}: {e}", path.display()))?;
            links.push((path.to_path_buf(), target));
        } else if let Some(h) = Held::open(path)? {
            held.push(h);
        }
    }
    let workspace = Held::open(&p.workspace)?
        .ok_or_else(|| format!("the workspace {} is gone", p.workspace.display()))?;
    let devices: Vec<Held> = DEVICES
        .iter()
        .map(|d| Held::open(&Path::new("/dev").join(d)))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    Ok(Carried { links, held, workspace, devices })
}

fn build_root(p: &Policy, carried: Carried) -> Result<()> {
    let Carried { links, held, workspace, devices } = carried;
    // Nothing mounted here propagates back to the host.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(err("make / private"))?;

    // The new root is a small tmpfs over the host's /tmp (hidden once we pivot).
    let new_root = Path::new("/tmp");
    mount(
        Some("tmpfs"),
        new_root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=1m,mode=0755"),
    )
    .map_err(err("mount the new root"))?;
    for (link, target) in links {
        let dst = new_root.join(link.strip_prefix("/").unwrap_or(&link));
        std::os::unix::fs::symlink(target, &dst)
            .map_err(|e| format!("link {}: {e}", dst.display()))?;
    }
    for h in &held {
        h.carry(new_root, None, true)?;
    }
    // /dev: the harmless nodes, and the usual links.
    let dev = new_root.join("dev");
    std::fs::create_dir_all(&dev).map_err(|e| format!("create /dev: {e}"))?;
    for h in &devices {
        let dst = dev.join(h.path.file_name().unwrap_or_default());
        mount_point(&h.source(), &dst)?;
        mount(Some(&h.source()), &dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(|e| format!("bind {}: {}", h.path.display(), e.desc()))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(target, dev.join(link));
    }
    // A fresh /proc: the sandbox's own processes only.
    let proc = new_root.join("proc");
    std::fs::create_dir_all(&proc).map_err(|e| format!("create /proc: {e}"))?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(err("mount /proc"))?;
    // A private, bounded /tmp.
    let tmp = new_root.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("create /tmp: {e}"))?;
    let size = format!("size={}m,mode=1777", p.limits.tmp_mib.max(1));
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(size.as_str()),
    )
    .map_err(err("mount /tmp"))?;
    // The workspace, the only writable folder that lasts.
    workspace.carry(new_root, Some(Path::new(WORKSPACE)), false)?;
    drop((held, devices, workspace));

    let old = new_root.join("old-root");
    std::fs::create_dir_all(&old).map_err(|e| format!("create old-root: {e}"))?;
    nix::unistd::pivot_root(new_root, &old).map_err(err("pivot_root"))?;
    nix::unistd::chdir("/").map_err(err("chdir /"))?;
    umount2("/old-root", MntFlags::MNT_DETACH).map_err(err("detach the host's root"))?;
    std::fs::remove_dir("/old-root").map_err(|e| format!("remove old-root: {e}"))?;
    // The new root itself becomes read-only.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT
            | MsFlags::MS_BIND
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(err("remount / read-only"))
}

/// Brings up `lo` in the new network namespace, so tests can listen on 127.0.0.1.
fn loopback_up() {
    // SAFETY: a datagram socket, an ifreq with a NUL-terminated name, SIOC[GS]IFFLAGS.
    unsafe {
        let s = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if s < 0 {
            return;
        }
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(s, libc::SIOCGIFFLAGS, &mut req) == 0 {
            req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
            libc::ioctl(s, libc::SIOCSIFFLAGS, &req);
        }
        libc::close(s);
    }
}

/// In the command's process: limits, user, confinement, exec. Returns only on failure.
fn command(p: &Policy) -> String {
    match confine(p) {
        Ok(()) => {}
        Err(e) => return e,
    }
    let sh = c("/bin/sh");
    let args = [c("sh"), c("-c"), c(&p.command)];
    let mut env = vec![
        c(&format!("PATH={PATH}")),
        c(&format!("HOME={WORKSPACE}")),
        c("TMPDIR=/tmp"),
        c("LANG=C.UTF-8"),
        c("TERM=dumb"),
        c("USER=flock"),
    ];
    env.extend(p.env.iter().map(|(k, v)| c(&format!("{k}={v}"))));
    match nix::unistd::execve(&sh, &args, &env) {
        Ok(never) => match never {},
        Err(e) => format!("exec /bin/sh: {}", e.desc()),
    }
}

fn become_inner() -> Result<()> {
    let id = Gid::from_raw(INNER_ID);
    nix::unistd::setresgid(id, id, id).map_err(err("setresgid"))?;
    let id = Uid::from_raw(INNER_ID);
    nix::unistd::setresuid(id, id, id).map_err(err("setresuid"))
}

fn c(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

fn confine(p: &Policy) -> Result<()> {
    let l = &p.limits;
    let limit = |r: Resource, v: u64, name: &str| {
        setrlimit(r, v, v).map_err(|e| format!("limit {name}: {}", e.desc()))
    };
    setrlimit(Resource::RLIMIT_CPU, l.cpu_secs, l.cpu_secs + 1).map_err(err("limit CPU time"))?;
    limit(Resource::RLIMIT_AS, l.memory_mib * MIB, "memory")?;
    limit(Resource::RLIMIT_NPROC, l.processes, "processes")?;
    limit(Resource::RLIMIT_FSIZE, l.file_mib * MIB, "file size")?;
    limit(Resource::RLIMIT_NOFILE, 1024, "open files")?;
    limit(Resource::RLIMIT_CORE, 0, "core dumps")?;
    become_inner()?;
    nix::unistd::chdir(WORKSPACE).map_err(err("chdir to the workspace"))?;
    landlock()?;
    prctl::set_no_new_privs().map_err(err("PR_SET_NO_NEW_PRIVS"))?;
    for filter in crate::seccomp::filters()? {
        seccompiler::apply_filter(&filter).map_err(|e| format!("seccomp: {e}"))?;
    }
    // SAFETY: closes every descriptor above stderr; none is in use by this process.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    Ok(())
}

/// Landlock over the new root: read and execute everywhere in it, write only in the
/// workspace, `/tmp` and the harmless devices; no signals or abstract sockets outside.
fn landlock() -> Result<()> {
    use landlock::{
        ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
        path_beneath_rules,
    };
    let abi = ABI::V6;
    let ll = |e: landlock::RulesetError| format!("landlock: {e}");
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let status = Ruleset::default()
        .handle_access(all)
        .map_err(ll)?
        .scope(Scope::from_all(abi))
        .map_err(ll)?
        .create()
        .map_err(ll)?
        .add_rules(path_beneath_rules(["/"], read))
        .map_err(ll)?
        .add_rules(path_beneath_rules([WORKSPACE, "/tmp"], all))
        .map_err(ll)?
        .add_rules(path_beneath_rules(
            ["/dev/null", "/dev/zero", "/dev/full", "/dev/tty"]
                .iter()
                .filter(|d| Path::new(d).exists()),
            AccessFs::from_file(abi),
        ))
        .map_err(ll)?
        .restrict_self()
        .map_err(ll)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err("Landlock is not available on this kernel (5.13 or later with the \
                    landlock LSM enabled); refusing to run a command unconfined"
            .into());
    }
    Ok(())
}

/// Gives the workspace to the sandbox user (when Flock runs as root), without following links.
pub(crate) fn hand_over(dir: &Path, uid: u32, gid: u32) -> Result<()> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .map_err(|e| format!("workspace {}: {e}", path.display()))?;
        if meta.uid() != uid || meta.gid() != gid {
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))
                .map_err(|e| format!("hand {} to the sandbox user: {e}", path.display()))?;
        }
        if meta.is_dir() {
            let entries = std::fs::read_dir(&path)
                .map_err(|e| format!("workspace {}: {e}", path.display()))?;
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    Ok(())
}

/// Bytes the workspace takes on disk (bounded walk: a huge tree counts as what was seen).
pub(crate) fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut seen = 0usize;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        total += meta.blocks() * 512;
        seen += 1;
        if seen > 200_000 {
            break;
        }
        if meta.is_dir()
            && let Ok(entries) = std::fs::read_dir(&path)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}
