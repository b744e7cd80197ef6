//! The NATS side of failover (docs/cluster.md, "Failover"; the lease itself is in
//! `crate::failover`): a standby waiting for its host to be lost ([`stand_by`]), what it says of
//! itself meanwhile ([`StandbyWord`]), and handing what a state dir holds undelivered to the run
//! that took its host ([`hand_over`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use flock_actors::store::PendingMessage;
use flock_cluster::Link;
use flock_ipc::id::MsgId;

/// What a handed-over message's broker id ends with: the stream may still remember the
/// message's own id (it keeps ids two minutes), and would drop it as a repeat.
pub const HANDED: &str = ".handed";

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
            let lost = lost_for >= super::LOST_AFTER;
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
        tokio::time::sleep(super::HEARTBEAT).await;
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
    for entry in super::wire::entries(pending, host_of) {
        let id = if entry.host == me { format!("{}{HANDED}", entry.id()) } else { entry.id() };
        match link.send_entry(&entry.host, &id, entry.messages.len(), entry.payload()).await {
            Ok(_) => sent.extend(entry.sent()),
            Err(e) => return (sent, Some(e)),
        }
    }
    (sent, None)
}
