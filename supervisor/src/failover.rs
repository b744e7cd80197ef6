//! Failover (issue #26, docs/cluster.md "Failover"): a host the swarm file lists in
//! `cluster.failover` may be taken over by a **standby** — `flock-supervisor up FILE --host NAME
//! --standby` on another machine, with its own state dir — once it has been lost that long.
//!
//! - **The lease** is the host's status in the broker (written every second, each write
//!   conditional on the last: `flock_cluster::Link::put_status`). A run of such a host that could
//!   not renew it for [`FENCE_AFTER`] kills its agents and closes its inbox ([`Lease`],
//!   [`guard`]); it starts them again when a write gets through, or stops for good when another
//!   run took the host meanwhile. The standby waits far longer (at least
//!   `flock_config::MIN_FAILOVER_SECS`) before it claims the host, so an agent never runs on two
//!   machines at once.
//! - **Nothing accepted is lost**: what a run's state dir still holds when another run took its
//!   host (messages not yet delivered to a turn, or not yet forwarded) is handed over
//!   ([`hand_over`]): those for the host's own agents go to the host's own inbox, which the run
//!   that holds the host reads; the rest to their hosts. The old run does this when it learns it
//!   was taken over, and `up` does it from a state dir that finds its host taken.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock_actors::store::PendingMessage;
use flock_cluster::Link;
use flock_ipc::id::MsgId;
use ractor::ActorRef;
use tokio::sync::watch;

use crate::children::ChildMsg;

/// A run that could not renew its host's lease this long kills its agents.
pub const FENCE_AFTER: Duration = Duration::from_secs(flock_config::FENCE_AFTER_SECS);
/// How often the guard looks at the lease.
const GUARD_TICK: Duration = Duration::from_millis(200);
/// What a handed-over message's broker id ends with: the stream may still remember the
/// message's own id (it keeps ids two minutes), and would drop it as a repeat.
pub const HANDED: &str = ".handed";

/// This run's hold on its host, for a host with `cluster.failover`.
#[derive(Debug)]
pub struct Lease {
    /// When the last status write that got through was issued.
    renewed: Mutex<Instant>,
    held: watch::Sender<bool>,
}

impl Lease {
    /// A lease just taken (the claim wrote the status).
    pub fn new() -> Arc<Lease> {
        Arc::new(Lease { renewed: Mutex::new(Instant::now()), held: watch::channel(true).0 })
    }

    /// Whether this run holds its host now; the inbox reads only while it does.
    pub fn held(&self) -> watch::Receiver<bool> {
        self.held.subscribe()
    }

    /// A status write issued at `issued` got through while the host starts (nothing to start
    /// again yet).
    pub fn touch(&self, issued: Instant) {
        if let Ok(mut renewed) = self.renewed.lock() {
            *renewed = (*renewed).max(issued);
        }
    }

    /// A status write issued at `issued` got through: the lease is renewed, and agents the
    /// guard killed start again.
    pub fn renewed(&self, issued: Instant, children: &ActorRef<ChildMsg>) {
        let Ok(mut renewed) = self.renewed.lock() else { return };
        *renewed = (*renewed).max(issued);
        if !*self.held.borrow() {
            tracing::warn!("flock cluster: this host's lease is renewed: its agents start again");
            self.held.send_replace(true);
            // Under the lock: a fence and an unfence reach the children in the order decided.
            let _ = children.cast(ChildMsg::Fence(false));
        }
    }

    /// Whether the lease has lapsed now (then the agents are killed, the inbox closed).
    fn lapse_if_due(&self, children: &ActorRef<ChildMsg>) -> bool {
        let Ok(renewed) = self.renewed.lock() else { return false };
        if !*self.held.borrow() || renewed.elapsed() < FENCE_AFTER {
            return false;
        }
        self.held.send_replace(false);
        let _ = children.cast(ChildMsg::Fence(true));
        true
    }
}

/// Watches `lease` as long as the process runs: once no status write got through for
/// [`FENCE_AFTER`], this host's agents are killed (another machine may take the host over).
pub fn guard(lease: Arc<Lease>, children: ActorRef<ChildMsg>, host: String) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(GUARD_TICK);
        loop {
            tick.tick().await;
            if lease.lapse_if_due(&children) {
                tracing::error!(
                    "flock cluster: host `{host}` could not renew its lease for {} s: its agents \
                     are stopped so they never run on two machines (cluster.failover); they \
                     start again once it can write its status, unless a standby took the host",
                    FENCE_AFTER.as_secs()
                );
            }
        }
    });
}

/// Waits, as a standby of the link's host, until that host has been lost for `after` (no
/// status with the swarm's MAC written for that long; a host that never wrote one counts as lost
/// since the standby started watching; a status without the MAC — forged — tells nothing).
/// Says what it sees when it changes.
pub async fn stand_by(link: &Link, after: Duration) {
    let host = link.host().to_owned();
    let watching = Instant::now();
    let mut said: Option<bool> = None;
    // What `ps` on every host shows of this standby while it waits.
    let word = StandbyWord {
        pid: std::process::id(),
        since_ms: flock_ipc::time::unix_ms_now(),
        after_secs: after.as_secs(),
    };
    let word = serde_json::to_vec(&word).unwrap_or_default();
    let mut unheard = false;
    // The newest status with the swarm's MAC seen, when it was written.
    let mut newest: Option<u64> = None;
    loop {
        let lost_for = match link.status_of(&host).await {
            Ok(status) => {
                if let Some(s) = status.filter(|s| s.authentic) {
                    newest = newest.max(Some(s.written_ms));
                }
                Some(match newest {
                    Some(ms) => {
                        Duration::from_millis(flock_ipc::time::unix_ms_now().saturating_sub(ms))
                    }
                    None => watching.elapsed(),
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "flock cluster: standby for host `{host}`: cannot read its status");
                None
            }
        };
        if let Some(lost_for) = lost_for {
            if lost_for >= after {
                tracing::warn!(
                    "flock cluster: host `{host}` has been lost for {} s: this standby takes it over",
                    lost_for.as_secs()
                );
                if let Err(e) = link.clear_standby().await {
                    tracing::debug!(error = %e, "flock cluster: could not clear this standby's word");
                }
                return;
            }
            let lost = lost_for >= crate::cluster::LOST_AFTER;
            if said != Some(lost) {
                said = Some(lost);
                if lost {
                    tracing::warn!(
                        "flock cluster: standby for host `{host}`: lost for {} s; taking it over \
                         once lost for {} s",
                        lost_for.as_secs(),
                        after.as_secs()
                    );
                } else {
                    tracing::info!(
                        "flock cluster: standby for host `{host}`: it is up; this run takes it \
                         over once it has been lost for {} s (cluster.failover)",
                        after.as_secs()
                    );
                }
            }
        }
        match link.put_standby(&word).await {
            Ok(()) => unheard = false,
            Err(e) if !unheard => {
                unheard = true;
                tracing::warn!(error = %e, "flock cluster: standby for host `{host}`: cannot say it waits (`ps` will not show it; a NATS user needs publish on `$KV.flock-<swarm>-hosts.{host}.standby`)");
            }
            Err(_) => {}
        }
        tokio::time::sleep(crate::cluster::HEARTBEAT).await;
    }
}

/// What a waiting standby writes of itself every second (`ps` shows it as a `standby` row).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct StandbyWord {
    pub pid: u32,
    /// When it started waiting, Unix ms.
    pub since_ms: u64,
    /// How long the host must have been lost before it takes it over.
    pub after_secs: u64,
}

/// Sends `pending` (messages this state dir accepted and has not delivered or forwarded, in
/// mailbox order) to where they go now: those for agents of other hosts (`elsewhere`: agent →
/// host) to their hosts, the rest to this host's own inbox. Returns those the broker stored,
/// for the caller to mark, and the error that stopped it, if one did.
pub async fn hand_over(
    link: &Link,
    elsewhere: &HashMap<String, String>,
    pending: &[PendingMessage],
) -> (Vec<(MsgId, String)>, Option<flock_cluster::Error>) {
    let me = link.host().to_owned();
    let mut sent = Vec::with_capacity(pending.len());
    let host_of = |t: &str| Some(elsewhere.get(t).unwrap_or(&me).clone());
    for entry in crate::cluster::wire::entries(pending, host_of) {
        let id = if entry.host == me { format!("{}{HANDED}", entry.id()) } else { entry.id() };
        match link.send_entry(&entry.host, &id, entry.messages.len(), entry.payload()).await {
            Ok(_) => sent.extend(entry.sent()),
            Err(e) => return (sent, Some(e)),
        }
    }
    (sent, None)
}
