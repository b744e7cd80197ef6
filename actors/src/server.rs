//! Accept loops and per-connection tasks. A connection task reads and decodes frames, hands them
//! to the router in batches, and writes through its bounded outbox. A malformed frame closes that
//! one connection (after an `Error` frame); nothing a peer sends can reach the router undecoded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flock_ipc::{
    Body, ErrorCode, Frame, FrameError, FrameReader, ROUTER, ReadBudget, Transport, spawn_writer,
};
use ractor::ActorRef;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::messages::{ConnKind, Opened, RouterMsg};

/// The largest frame a peer may send before its handshake.
pub const HANDSHAKE_MAX_FRAME: u32 = 4096;
/// A peer must complete its handshake within this time.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections one listener serves at once (each agent holds one; `flockctl` one per command).
/// Past it a new peer gets a `Reject` and is closed: a flood of connections costs the supervisor
/// a bounded amount of memory and file descriptors, never the router.
pub const MAX_CONNECTIONS: usize = 1024;
/// Connections the processes of one agent (the process the supervisor started and everything
/// under it) may hold at once on a socket. An agent needs one; the budget keeps one hostile
/// agent from taking the slots another's restart needs.
pub const MAX_CONNECTIONS_PER_AGENT: usize = 16;
/// Frames (at the frame limit) that the unfinished frames of one agent's connections may hold at
/// once, beyond a read chunk each ([`flock_ipc::ReadBudget`]): an agent sends one at a time.
pub const READ_BUDGET_FRAMES_PER_AGENT: usize = 2;
/// The same for every peer outside an agent's tree together (the operator's `flockctl`, tests).
pub const READ_BUDGET_FRAMES_SHARED: usize = 4;
/// Frames one connection may have waiting in the router's mailbox before its reader pauses.
const MAX_QUEUED_FRAMES: u32 = 8192;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// Limits applied to every connection of a listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_frame_bytes: u32,
    pub outbox_frames: usize,
    /// Only peers running as this uid are served.
    pub uid: u32,
    /// At most this many connections at once ([`MAX_CONNECTIONS`] in the supervisor).
    pub max_connections: usize,
}

/// Serves `listener` until the router stops. Each peer gets its own task.
pub fn serve<T: Transport>(
    listener: T::Listener,
    kind: ConnKind,
    router: ActorRef<RouterMsg>,
    limits: ConnLimits,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(limits.max_connections));
        let per_agent = PerAgent::default();
        let frame = limits.max_frame_bytes as usize;
        let shared_budget = ReadBudget::new(READ_BUDGET_FRAMES_SHARED * frame);
        let me = std::process::id() as i32;
        loop {
            let (r, w, peer) = match T::accept(&listener).await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "flock server: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if peer.uid != limits.uid {
                tracing::warn!(
                    uid = peer.uid,
                    pid = ?peer.pid,
                    "flock server: refused a connection from uid {} (pid {:?}); only uid {} may connect",
                    peer.uid,
                    peer.pid,
                    limits.uid
                );
                continue;
            }
            if kind == ConnKind::Control
                && let Err(reason) = operator_peer(&peer, std::process::id() as i32)
            {
                tracing::warn!(pid = ?peer.pid, "flock server: refused a control connection: {reason}");
                refuse::<T>(w, ErrorCode::Forbidden, reason);
                continue;
            }
            // An agent's processes share one small budget, charged to the process the
            // supervisor started (connections from outside its tree share the socket's). The
            // ancestry counts only if the opener still lives (its pidfd): a pid read after it
            // exited may be another process's.
            let root = peer
                .pid
                .and_then(|pid| tree_root(pid, me))
                .filter(|_| peer.pidfd.as_deref().is_none_or(pidfd_alive));
            let agent_slot = match root {
                Some(root) => match per_agent.take(root, frame) {
                    Ok(slot) => Some(slot),
                    Err(refused) => {
                        let reason = format!(
                            "too many connections from one agent's processes ({MAX_CONNECTIONS_PER_AGENT} at once; pid {root} and its children)"
                        );
                        // A hog retries in a loop: the log says so at 1, 4, 16, 64… refusals.
                        if refused.is_power_of_two() && refused.trailing_zeros() % 2 == 0 {
                            tracing::warn!(pid = ?peer.pid, root, refused, "flock server: {reason} ({refused} refused)");
                        }
                        refuse::<T>(w, ErrorCode::RateLimited, reason);
                        continue;
                    }
                },
                None => None,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                let reason = format!(
                    "too many connections ({} at once); try again when some have closed",
                    limits.max_connections
                );
                refuse::<T>(w, ErrorCode::RateLimited, reason);
                continue;
            };
            let router = router.clone();
            let budget =
                agent_slot.as_ref().map_or_else(|| shared_budget.clone(), |s| s.read.clone());
            tokio::spawn(async move {
                let opener = Opener { cred: peer, root: root.map(|r| r as u32), budget };
                connection::<T>(r, w, opener, kind, router, limits).await;
                drop((slot, agent_slot));
            });
        }
    })
}

/// Connections held per agent process tree (keyed by the pid the supervisor started).
#[derive(Clone, Default)]
struct PerAgent(Arc<std::sync::Mutex<std::collections::HashMap<i32, Held>>>);

struct Held {
    open: usize,
    /// Refused since the last time one was let in.
    refused: u64,
    /// The bytes its connections' unfinished frames may hold.
    read: Arc<ReadBudget>,
}

/// One connection charged to an agent's budget, given back on drop.
struct AgentSlot {
    budget: PerAgent,
    root: i32,
    read: Arc<ReadBudget>,
}

impl PerAgent {
    /// A slot for `root`'s tree, or how many it has been refused in a row.
    fn take(&self, root: i32, max_frame: usize) -> Result<AgentSlot, u64> {
        let mut held = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let h = held.entry(root).or_insert_with(|| Held {
            open: 0,
            refused: 0,
            read: ReadBudget::new(READ_BUDGET_FRAMES_PER_AGENT * max_frame),
        });
        if h.open >= MAX_CONNECTIONS_PER_AGENT {
            h.refused += 1;
            return Err(h.refused);
        }
        h.open += 1;
        h.refused = 0;
        Ok(AgentSlot { budget: self.clone(), root, read: h.read.clone() })
    }
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        let mut held = self.budget.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = held.get_mut(&self.root) {
            h.open -= 1;
            if h.open == 0 {
                held.remove(&self.root);
            }
        }
    }
}

/// The process `ancestor` started that `pid` descends from (or is), if any: the agent (or
/// bridge, or model) a connection is charged to.
pub fn tree_root(pid: i32, ancestor: i32) -> Option<i32> {
    let mut current = pid;
    // A process tree is shallow; the bound only guards against a cycle from pid reuse.
    for _ in 0..128 {
        if current <= 1 {
            return None;
        }
        let parent = parent_pid(current)?;
        if parent == ancestor {
            return Some(current);
        }
        current = parent;
    }
    None
}

/// Sends one `Reject` and closes the connection (the writer task ends after that frame).
fn refuse<T: Transport>(w: T::Write, code: ErrorCode, reason: String) {
    let (tx, rx) = mpsc::channel(1);
    let _ = tx.try_send(Frame::new(ROUTER, "", Body::Reject { code, reason }));
    drop(spawn_writer(w, rx));
}

/// Whether the process that opened a control connection may be served as the operator.
///
/// The operator is a person's shell, never something this supervisor (`me`) started: an agent,
/// or anything it spawned however detached (they stay in our process tree, see `spawn`), cannot
/// use the control socket to act as the operator. The check is on the process that called
/// `connect()`, so it must still be that process when its ancestry is read: one that has exited
/// (a child that connected, handed the socket to a grandchild and died) cannot be placed, and
/// is refused — fail closed. The pidfd pins the process: the ancestry read from `/proc/<pid>`
/// counts only if the process was still alive after it was read.
pub fn operator_peer(peer: &flock_ipc::PeerCred, me: i32) -> Result<(), String> {
    let Some(pid) = peer.pid else {
        return Err("the control socket cannot tell which process connected".into());
    };
    let descends = descends_from(pid, me);
    let alive = match &peer.pidfd {
        Some(fd) => pidfd_alive(fd),
        None => parent_pid(pid).is_some(),
    };
    if !alive {
        return Err(format!(
            "the process that opened this connection (pid {pid}) has exited: the control socket serves a connection only while the process that opened it lives"
        ));
    }
    if descends {
        return Err(format!(
            "the control socket serves the operator, not processes this supervisor started (agents and their children; pid {pid} is one)"
        ));
    }
    Ok(())
}

/// Whether the process a pidfd refers to is still running (a pidfd polls readable once the
/// process has exited).
fn pidfd_alive(fd: &std::os::fd::OwnedFd) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(0) => true,
        Ok(_) => {
            !fds[0].revents().is_some_and(|r| r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP))
        }
        Err(_) => false,
    }
}

/// Whether `pid` is a strict descendant of `ancestor`, by the parent links in `/proc`.
pub fn descends_from(pid: i32, ancestor: i32) -> bool {
    tree_root(pid, ancestor).is_some()
}

/// The parent pid from `/proc/<pid>/stat` (after the `(comm)`, which may hold spaces).
pub fn parent_pid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn error_frame(code: ErrorCode, message: String) -> Frame {
    Frame::new(ROUTER, "", Body::Error { code, message })
}

/// Who opened a connection, as the accept loop placed it.
struct Opener {
    cred: flock_ipc::PeerCred,
    /// The supervisor's child the opener descends from, if any (see [`tree_root`]).
    root: Option<u32>,
    /// What its unfinished frames may hold: its agent's, or the socket's shared budget.
    budget: Arc<ReadBudget>,
}

async fn connection<T: Transport>(
    r: T::Read,
    w: T::Write,
    opener: Opener,
    kind: ConnKind,
    router: ActorRef<RouterMsg>,
    limits: ConnLimits,
) {
    let Opener { cred: peer, root, budget } = opener;
    let conn = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel(limits.outbox_frames.max(16));
    let writer = spawn_writer(w, rx);
    // Until a peer has said who it is, it may only send a small frame (a hello is a few hundred
    // bytes): a stranger cannot make the supervisor hold megabytes.
    let mut reader = FrameReader::new(r, HANDSHAKE_MAX_FRAME);

    let first = match tokio::time::timeout(HANDSHAKE_TIMEOUT, reader.read_frame()).await {
        Ok(Ok(Some(f))) => Some(f),
        Ok(Ok(None)) => None,
        Ok(Err(e)) => {
            let msg = format!("malformed handshake: {e}; closing this connection");
            let _ = tx.try_send(error_frame(ErrorCode::BadRequest, msg));
            None
        }
        Err(_) => {
            let msg = format!("no handshake within {HANDSHAKE_TIMEOUT:?}; closing this connection");
            let _ = tx.try_send(error_frame(ErrorCode::Timeout, msg));
            None
        }
    };
    if let Some(first) = first {
        reader.set_max_frame(limits.max_frame_bytes);
        reader.set_budget(budget);
        let (closer_tx, mut closer_rx) = oneshot::channel();
        let open = RouterMsg::Open(Opened {
            conn,
            kind,
            first,
            outbox: tx.clone(),
            closer: closer_tx,
            peer,
            root,
        });
        if router.cast(open).is_ok() {
            let permits = Arc::new(Semaphore::new(MAX_QUEUED_FRAMES as usize));
            let mut batch = Vec::new();
            loop {
                tokio::select! {
                    // The router dropped its end: the peer was rejected or must go.
                    _ = &mut closer_rx => break,
                    read = reader.read_batch(&mut batch) => match read {
                        Ok(0) => break,
                        Ok(n) => {
                            let want = (n as u32).min(MAX_QUEUED_FRAMES);
                            let Ok(permit) = permits.clone().acquire_many_owned(want).await else {
                                break;
                            };
                            let frames = std::mem::take(&mut batch);
                            let msg = RouterMsg::Frames { conn, frames, permit: Some(permit) };
                            if router.cast(msg).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            let (code, what) = match e {
                                FrameError::OverBudget { .. } => (ErrorCode::RateLimited, ""),
                                _ => (ErrorCode::BadRequest, "malformed frame: "),
                            };
                            let msg = format!("{what}{e}; closing this connection");
                            let _ = tx.try_send(error_frame(code, msg));
                            break;
                        }
                    }
                }
            }
            let _ = router.cast(RouterMsg::Closed { conn });
        }
    }
    drop(tx);
    let _ = writer.await;
}
