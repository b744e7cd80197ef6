//! The children an agent owns, and the reaping of the ones it does not.
//!
//! Every agent process is a child subreaper (the supervisor sets it, so that whatever an agent
//! starts and abandons stays in the supervisor's tree). A subreaper inherits orphans: a command
//! that daemonises, or hostile code that forks and exits in a loop, leaves its children to the
//! agent, which must reap them or fill the process table with zombies.
//!
//! Reaping must not steal the exit status of a child the agent waits for itself (the sandbox
//! helper, through tokio). So children are spawned through [`spawn`], which records their pid
//! under a lock, and [`reap_orphans`] reaps only zombies whose parent is this process and whose
//! pid is not recorded, with the same lock held. It looks for them in `/proc` rather than with
//! `waitid(P_ALL, WNOWAIT)`, which would report an owned zombie again and again and hide the
//! orphans behind it.

use std::collections::BTreeSet;
use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

static OWNED: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn owned() -> MutexGuard<'static, BTreeSet<i32>> {
    OWNED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spawned child's pid, recorded until this is dropped (after the child has been waited for).
#[derive(Debug)]
pub struct Owned(i32);

impl Drop for Owned {
    fn drop(&mut self) {
        owned().remove(&self.0);
    }
}

/// Spawns `cmd` and records its pid, so [`reap_orphans`] leaves it to its owner. Keep the
/// [`Owned`] until the child has been waited for.
pub fn spawn(cmd: &mut tokio::process::Command) -> io::Result<(tokio::process::Child, Owned)> {
    // Held across spawn and insert: the reaper never sees the new child unrecorded.
    let mut owned = owned();
    let child = cmd.spawn()?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    owned.insert(pid);
    Ok((child, Owned(pid)))
}

/// Reaps every zombie child of this process that was not spawned through [`spawn`] (orphans
/// reparented to it). Returns how many it reaped.
pub fn reap_orphans() -> usize {
    let me = std::process::id() as i32;
    let owned = owned();
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    let mut reaped = 0;
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if owned.contains(&pid) || !is_zombie_child_of(pid, me) {
            continue;
        }
        if matches!(waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)), Ok(s) if s.pid().is_some())
        {
            reaped += 1;
        }
    }
    reaped
}

/// Whether `/proc/<pid>/stat` says a zombie whose parent is `parent`.
fn is_zombie_child_of(pid: i32, parent: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some(close) = stat.rfind(')') else { return false };
    let mut fields = stat[close + 1..].split_whitespace();
    let state = fields.next();
    let ppid = fields.next().and_then(|p| p.parse::<i32>().ok());
    state == Some("Z") && ppid == Some(parent)
}

/// Reaps orphans for as long as the runtime runs: on every SIGCHLD, and once a second in case a
/// signal was coalesced or missed.
pub fn spawn_reaper() -> io::Result<tokio::task::JoinHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut sigchld = signal(SignalKind::child())?;
    Ok(tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = sigchld.recv() => {}
                _ = tick.tick() => {}
            }
            let n = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or(0);
            if n > 0 {
                tracing::debug!(reaped = n, "reaped orphaned child processes");
            }
        }
    }))
}
