//! The native sandbox: runs one command of a worker confined by the kernel, not by a prompt.
//!
//! The agent never runs a command itself. It starts the `flock-sandbox` helper (a small,
//! single-threaded binary installed beside `flock-agent`) with a [`Policy`]; the helper
//!
//! 1. forks a child that enters new **user, mount, PID, IPC, UTS and network namespaces** (no
//!    network at all unless the policy grants it: the new network namespace has no interface
//!    but a downed loopback);
//! 2. maps one unprivileged user into it (the caller's own uid, or [`ROOT_SANDBOX_UID`] when
//!    Flock runs as root — the workspace is then handed to that uid first);
//! 3. starts a PID 1 for the namespace that mounts a fresh `/proc` (only the sandbox's own
//!    processes are visible) and a private, size-bounded `/tmp`, and whose exit takes every
//!    process of the namespace with it — nothing outlives the command;
//! 4. runs the command as that user under **rlimits** (CPU, address space, processes, file
//!    size, open files, no core dumps), **Landlock** (read-only system folders and a handful of
//!    `/etc` files, read-write workspace and `/tmp`, nothing else; no signals or abstract
//!    sockets outside) and a **seccomp** filter (no ptrace, mount, modules, kexec, BPF,
//!    namespaces, keyrings, raw or Unix sockets…), with a clean environment and no inherited
//!    descriptors;
//! 5. watches the workspace's size and kills the sandbox when it grows past the disk quota.
//!
//! [`run`] is the caller's side: it starts the helper, enforces the wall-clock timeout, and
//! keeps a bounded head and tail of the output.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

pub mod cage;
pub mod children;
pub mod docker;
pub mod helper;
pub mod launch;
mod seccomp;

/// The uid a sandboxed command runs as (outside the namespace) when Flock itself runs as root:
/// `nobody`. A non-root Flock runs commands as its own uid (the only one it may map).
pub const ROOT_SANDBOX_UID: u32 = 65534;
/// The uid and gid the command sees inside the sandbox.
pub const INNER_ID: u32 = 1000;
/// Exit status of the helper when the sandbox itself could not be set up (as `docker run`).
pub const SETUP_FAILED: i32 = 125;
/// The helper's file name, installed beside `flock-agent`.
pub const HELPER: &str = "flock-sandbox";

/// Resource limits of one command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU seconds (RLIMIT_CPU).
    pub cpu_secs: u64,
    /// Address space in MiB (RLIMIT_AS).
    pub memory_mib: u64,
    /// Processes and threads at once (RLIMIT_NPROC, counted inside the sandbox only).
    pub processes: u64,
    /// Largest file the command may write, in MiB (RLIMIT_FSIZE).
    pub file_mib: u64,
    /// How much the workspace may grow during the command, in MiB.
    pub disk_mib: u64,
    /// Size of the private `/tmp`, in MiB.
    pub tmp_mib: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cpu_secs: 60,
            memory_mib: 2048,
            processes: 128,
            file_mib: 64,
            disk_mib: 256,
            tmp_mib: 64,
        }
    }
}

/// What a command may do. Everything not listed here is refused by the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The agent's workspace: the command's working directory and its only writable folder
    /// (besides a private `/tmp`). Must be absolute.
    pub workspace: PathBuf,
    /// The shell command line (`/bin/sh -c`).
    pub command: String,
    /// Folders readable (and executable) beyond the system ones, e.g. a toolchain a grant gave.
    #[serde(default)]
    pub read_only: Vec<PathBuf>,
    /// Network access (the host's network namespace). Off unless granted.
    #[serde(default)]
    pub network: bool,
    #[serde(default)]
    pub limits: Limits,
    /// Extra environment variables for the command (the environment is otherwise clean).
    #[serde(default)]
    pub env: Vec<(String, String)>,
}

impl Policy {
    pub fn new(workspace: impl Into<PathBuf>, command: impl Into<String>) -> Self {
        Policy {
            workspace: workspace.into(),
            command: command.into(),
            read_only: Vec::new(),
            network: false,
            limits: Limits::default(),
            env: Vec::new(),
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it (e.g. SIGKILL from a limit, SIGXCPU from the CPU limit).
    Signaled(i32),
    /// The wall-clock timeout passed; the whole sandbox was killed.
    TimedOut,
    /// The sandbox could not be set up (the message says why); the command did not run.
    SetupFailed(String),
}

/// A stream's output, bounded: the head and the tail when it was longer than the cap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Captured {
    pub text: String,
    /// Bytes left out of the middle.
    pub omitted: u64,
}

/// The result of [`run`].
#[derive(Debug, Clone)]
pub struct Output {
    pub status: Status,
    pub stdout: Captured,
    pub stderr: Captured,
    pub elapsed: Duration,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status == Status::Exited(0)
    }
}

/// Where the helper is: `FLOCK_SANDBOX_HELPER`, else beside the running executable.
pub fn helper_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLOCK_SANDBOX_HELPER") {
        return PathBuf::from(p);
    }
    std::env::current_exe()
        .map(|exe| exe.with_file_name(HELPER))
        .unwrap_or_else(|_| PathBuf::from(HELPER))
}

/// Runs `policy.command` in the sandbox through the helper at `helper`, killing it all after
/// `timeout`; each output stream keeps at most `cap` bytes (head and tail).
pub async fn run(
    helper: &Path,
    policy: &Policy,
    timeout: Duration,
    cap: usize,
) -> std::io::Result<Output> {
    let started = Instant::now();
    let spec = serde_json::to_string(policy).map_err(std::io::Error::other)?;
    let mut cmd = tokio::process::Command::new(helper);
    cmd.arg(spec)
        // The helper and everything under it start from nothing: no secret of the agent's
        // environment can be read back from /proc by what runs inside.
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Recorded until it has been waited for: the orphan reaper leaves it alone.
    let (mut child, _owned) = children::spawn(&mut cmd).map_err(|e| {
        std::io::Error::new(e.kind(), format!("cannot start {}: {e}", helper.display()))
    })?;
    let out = tokio::spawn(capture(child.stdout.take(), cap));
    let err = tokio::spawn(capture(child.stderr.take(), cap));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(status) => Some(status?),
        Err(_) => {
            // The helper's death takes the namespace with it (parent-death signals all down).
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    };
    // Whatever runs in the sandbox dies with it, closing the pipes; a short grace in case
    // something held them anyway.
    let grace = Duration::from_secs(1);
    let stdout =
        tokio::time::timeout(grace, out).await.ok().and_then(Result::ok).unwrap_or_default();
    let stderr =
        tokio::time::timeout(grace, err).await.ok().and_then(Result::ok).unwrap_or_default();
    let status = match status {
        None => Status::TimedOut,
        Some(s) => {
            use std::os::unix::process::ExitStatusExt;
            match (s.code(), s.signal()) {
                (Some(SETUP_FAILED), _) if stderr.text.contains("flock-sandbox:") => {
                    Status::SetupFailed(stderr.text.trim().to_string())
                }
                // The helper reports a signalled command as 128 + signal, as shells do.
                (Some(c), _) if c > 128 && c < 128 + 65 => Status::Signaled(c - 128),
                (Some(c), _) => Status::Exited(c),
                (None, Some(sig)) => Status::Signaled(sig),
                (None, None) => Status::Exited(-1),
            }
        }
    };
    Ok(Output { status, stdout, stderr, elapsed: started.elapsed() })
}

/// Reads a stream to its end, keeping the first and the last `cap / 2` bytes.
async fn capture(stream: Option<impl AsyncRead + Unpin + Send>, cap: usize) -> Captured {
    let Some(mut stream) = stream else { return Captured::default() };
    let half = cap / 2;
    let mut head = Vec::new();
    let mut tail = std::collections::VecDeque::new();
    let mut omitted = 0u64;
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for &b in &buf[..n] {
            if head.len() < half {
                head.push(b);
            } else {
                tail.push_back(b);
                if tail.len() > cap - half {
                    tail.pop_front();
                    omitted += 1;
                }
            }
        }
    }
    let mut text = String::from_utf8_lossy(&head).into_owned();
    if omitted > 0 {
        text.push_str(&format!("\n… {omitted} bytes left out …\n"));
    }
    text.push_str(&String::from_utf8_lossy(tail.make_contiguous()));
    Captured { text, omitted }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn capture_keeps_head_and_tail() {
        let data: Vec<u8> = (0..1000).map(|i| b'a' + (i % 26) as u8).collect();
        let c = capture(Some(&data[..]), 100).await;
        assert_eq!(c.omitted, 900);
        assert!(c.text.starts_with(std::str::from_utf8(&data[..50]).unwrap()));
        assert!(c.text.ends_with(std::str::from_utf8(&data[950..]).unwrap()));
        let short = capture(Some(&b"hello"[..]), 100).await;
        assert_eq!((short.text.as_str(), short.omitted), ("hello", 0));
    }
}
