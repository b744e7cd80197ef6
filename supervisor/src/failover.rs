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
//!   (`cluster::takeover::hand_over`): those for the host's own agents go to the host's own
//!   inbox, which the run that holds the host reads; the rest to their hosts. The old run does
//!   this when it learns it was taken over, and `up` does it from a state dir that finds its host
//!   taken.
//!
//! This file is the lease, which needs no broker code; what talks to NATS (the standby's wait,
//! the hand-over) is in `cluster/takeover.rs`, built only with the `cluster` feature.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ractor::ActorRef;
use tokio::sync::watch;

use crate::children::ChildMsg;

/// A run that could not renew its host's lease this long kills its agents.
pub const FENCE_AFTER: Duration = Duration::from_secs(flock_config::FENCE_AFTER_SECS);
/// How often the guard looks at the lease.
const GUARD_TICK: Duration = Duration::from_millis(200);

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
