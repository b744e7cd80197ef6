//! `flock-sandbox launch PROGRAM [ARGS…]`, and the set-up every process `flock-supervisor`
//! starts gets first.
//!
//! The supervisor starts its children with `posix_spawn` (a `vfork`: nothing of its own memory
//! is copied, so a spawn costs the same with 1 000 agents running as with one). A vforked child
//! can run no code of ours before `exec`, so what used to run between fork and exec runs here,
//! first thing in `flock-sandbox`, which every child is started through — as its cage, or
//! with `launch` when it runs uncaged:
//!
//! - its own session (`setsid`: its process group is its pid, so signals to the group reach
//!   everything it starts);
//! - death with the supervisor (`PR_SET_PDEATHSIG`, kept across `exec`), and a check that the
//!   supervisor did not die before that took effect;
//! - it becomes a subreaper (`PR_SET_CHILD_SUBREAPER`, kept across `exec`): whatever it starts
//!   and abandons stays in its tree;
//! - the secrets the supervisor hands over come in on standard input (a socket): they move to
//!   a descriptor above 2, named in [`flock_ipc`'s `FLOCK_SECRETS_FD`](SECRETS_FD), and standard
//!   input becomes `/dev/null`.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::os::fd::AsRawFd;

/// Set by the supervisor to its pid: this process was started by it and sets itself up.
pub const LAUNCHED_BY: &str = "FLOCK_LAUNCHED_BY";
/// Where the receiving process finds the secrets' socket (the name `flock_ipc::handoff` reads;
/// written here to keep the sandbox free of the wire crate).
pub const SECRETS_FD: &str = "FLOCK_SECRETS_FD";

/// Exit code when the set-up fails (the supervisor reports it as the child's exit).
const SETUP_FAILED: i32 = 125;

/// The set-up above, if the supervisor started this process; nothing otherwise. Call it first
/// in `main`, while the process has one thread (it changes the environment).
pub fn set_up_if_launched() {
    let Some(parent) = std::env::var_os(LAUNCHED_BY) else { return };
    if let Err(e) = set_up(parent.to_str().and_then(|p| p.parse().ok())) {
        eprintln!("flock-sandbox: {e}");
        std::process::exit(SETUP_FAILED)
    }
}

fn set_up(parent: Option<libc::pid_t>) -> Result<(), String> {
    let parent = parent.ok_or_else(|| format!("{LAUNCHED_BY} is not a pid"))?;
    let os = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    // SAFETY: plain system calls on this process; no memory is handed to the kernel.
    unsafe {
        if libc::setsid() < 0 {
            return Err(os("setsid"));
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0) < 0 {
            return Err(os("prctl(PR_SET_PDEATHSIG)"));
        }
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) < 0 {
            return Err(os("prctl(PR_SET_CHILD_SUBREAPER)"));
        }
        // The supervisor may have died before the death signal was armed.
        if libc::getppid() != parent {
            std::process::exit(1);
        }
    }
    let stdin = std::io::stdin();
    let is_socket = std::fs::metadata("/proc/self/fd/0").is_ok_and(|m| {
        use std::os::unix::fs::FileTypeExt;
        m.file_type().is_socket()
    });
    if is_socket {
        // SAFETY: duplicates descriptor 0 (open: checked above) to the lowest free one ≥ 3,
        // without close-on-exec so the program this becomes inherits it.
        let fd = unsafe { libc::fcntl(stdin.as_raw_fd(), libc::F_DUPFD, 3) };
        if fd < 0 {
            return Err(os("move the secrets' socket off standard input"));
        }
        let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
        // SAFETY: both descriptors are open; dup2 replaces standard input atomically.
        if unsafe { libc::dup2(null.as_raw_fd(), 0) } < 0 {
            return Err(os("standard input from /dev/null"));
        }
        // SAFETY: single-threaded (the caller's contract): nothing reads the environment
        // concurrently.
        unsafe { std::env::set_var(SECRETS_FD, fd.to_string()) };
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var(LAUNCHED_BY) };
    Ok(())
}

/// `launch PROGRAM [ARGS…]`: becomes `PROGRAM` (after [`set_up_if_launched`] ran).
pub fn main(args: &[String]) -> ! {
    let Some(program) = args.first() else {
        eprintln!("flock-sandbox: launch: usage: flock-sandbox launch PROGRAM [ARGS…]");
        std::process::exit(SETUP_FAILED)
    };
    let c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
    let argv: Vec<CString> = args.iter().map(|a| c(a)).collect();
    let e = match nix::unistd::execvp(&c(program), &argv) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    eprintln!("flock-sandbox: launch: exec {program}: {}", e.desc());
    // 127: what a shell answers for a command it cannot run.
    std::process::exit(127)
}
