//! Agents on other hosts (issue #26, docs/cluster.md). A durable message to an agent placed on
//! another host is accepted and stored here like any other; the supervisor's cluster link
//! ([`HostLink::outbox`] wakes it) publishes it through NATS JetStream and marks it forwarded. A
//! message from another host arrives as [`RouterMsg::FromHost`]: it is stored in this host's
//! mailbox (once: by its id) and queued for its agent, and only then does the link acknowledge it
//! to the broker.
//!
//! A chain keeps counting a hop it forwarded while an agent here waits for that hop's result:
//! the result, when it comes back, carries the count on (so `flockctl send --wait` on this host
//! hears how the chain ended). Hops and wall time travel with the message; tokens are counted
//! per host.

use super::*;
use crate::messages::FromHost;

/// This router's place among the swarm's hosts.
#[derive(Debug, Clone)]
pub struct HostLink {
    /// This host's name.
    pub host: String,
    /// Agents placed on other hosts, and their host.
    pub remote: HashMap<String, String>,
    /// Those agents, in the swarm file's order (for the roster).
    pub agents: Vec<AgentSpec>,
    /// Woken when a message for another host is stored.
    pub outbox: Arc<tokio::sync::Notify>,
}

impl HostLink {
    /// Host `host` of the swarm `whole` (every host's agents).
    pub fn new(whole: &SwarmSpec, host: &str) -> HostLink {
        let agents: Vec<AgentSpec> =
            whole.agents.iter().filter(|a| whole.host_of(a) != host).cloned().collect();
        let remote = agents.iter().map(|a| (a.key(), whole.host_of(a).to_owned())).collect();
        HostLink { host: host.to_owned(), remote, agents, outbox: Arc::default() }
    }
}

/// The origin of a write that stores a message from another host.
pub(super) const FROM_HOST: ConnId = u64::MAX - 1;

impl RouterState {
    /// The host of `agent` when it runs on another one.
    pub(super) fn remote_host(&self, agent: &str) -> Option<&str> {
        self.hosts.as_ref()?.remote.get(agent).map(String::as_str)
    }

    /// The refusal of a call that cannot cross to `target`'s host (a request, an at-most-once
    /// message), when `target` runs on another host.
    pub(super) fn not_across_hosts(
        &self,
        caller: &str,
        target: &str,
    ) -> Option<(ErrorCode, String)> {
        let host = self.remote_host(target)?;
        Some((ErrorCode::TargetUnavailable, self.cross_host_refusal(caller, target, host)))
    }

    /// Why `caller` cannot reach `target` on its host `host`: only agents' durable sends and
    /// delegations cross hosts.
    pub(super) fn cross_host_refusal(&self, caller: &str, target: &str, host: &str) -> String {
        if caller == OPERATOR {
            format!(
                "`{target}` runs on host `{host}`: send to it with flockctl on that host, or to an \
                 agent here that delegates to it"
            )
        } else {
            format!(
                "`{target}` runs on host `{host}`: only durable messages (agents__send) and \
                 delegation (agents__delegate) reach agents on other hosts"
            )
        }
    }

    /// A message for an agent on another host is stored: the link sends it. Its chain keeps
    /// counting it while an agent here waits for its result.
    pub(super) fn forwarded(&mut self, id: MsgId, route: &Route) {
        if let Some(link) = &self.hosts {
            link.outbox.notify_one();
        }
        let waits = route.answer_to().is_some_and(|to| self.slots.contains_key(to));
        if waits {
            self.awaiting.insert(id, route.chain.id);
        } else {
            self.leave(route.chain.id);
        }
    }

    /// A message from an agent on host `host`: stored, queued, then `reply` (the link
    /// acknowledges it to the broker). Refused when the swarm file does not place its sender on
    /// that host, or places its target on another host.
    pub(super) fn arrived_from_host(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        host: String,
        m: crate::store::PendingMessage,
        reply: oneshot::Sender<FromHost>,
    ) {
        if self.draining {
            return; // `reply` dropped: unacknowledged, the broker delivers it to the next run
        }
        let placed = self.remote_host(&m.sender);
        if placed != Some(host.as_str()) {
            let msg = match placed {
                Some(p) => {
                    format!("host `{host}` may not speak for `{}`, which runs on `{p}`", m.sender)
                }
                None => format!(
                    "host `{host}` may not speak for `{}`, which runs on no other host",
                    m.sender
                ),
            };
            let _ = reply.send(FromHost::Refused(msg));
            return;
        }
        if let Some(elsewhere) = self.remote_host(&m.target) {
            let msg = format!("`{}` runs on host `{elsewhere}`, not here", m.target);
            let _ = reply.send(FromHost::Refused(msg));
            return;
        }
        // An agent this host does not know (removed from its file, or not created yet): the
        // mail waits in the store for it, as it would on one host.
        self.host_acks.insert(m.id, reply);
        let msg = NewMessage {
            id: m.id,
            sender: m.sender,
            target: m.target,
            text: m.text,
            route: m.route,
        };
        let write = StoreMsg::Write {
            op: WriteOp::Enqueue(msg),
            origin: Some(Origin { conn: FROM_HOST, frame: m.id }),
            notify: Some(myself.clone()),
        };
        if let Err(e) = self.store.cast(write)
            && let Some(reply) = self.host_acks.remove(&m.id)
        {
            let _ = reply.send(FromHost::Failed(format!("the store is not running: {e}")));
        }
    }

    /// The store's answer to a message from another host: queued if new (a message stored
    /// before a crash was queued by the restart), then the link may acknowledge it.
    pub(super) fn stored_from_host(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        msg: NewMessage,
        outcome: crate::messages::StoredOutcome,
    ) {
        let reply = self.host_acks.remove(&msg.id);
        let answer = match outcome {
            Ok(WriteOutcome::Inserted) => {
                crate::metrics::get().durable_messages.inc();
                let route = Route::load(
                    &msg.route,
                    msg.id,
                    &msg.sender,
                    &msg.target,
                    &msg.text,
                    self.now(),
                );
                // The result of a hop this host forwarded carries that hop's count on.
                let carried =
                    route.result && route.parent.and_then(|p| self.awaiting.remove(&p)).is_some();
                // The chain has come this far wherever its earlier hops ran (this one counted).
                let chain = self.chains.entry(&route.chain, route.hop.saturating_add(1));
                if !carried {
                    chain.live += 1;
                }
                let kind = if route.result { DeliveryKind::Result } else { DeliveryKind::Message };
                let target = msg.target.clone();
                match self.slots.get_mut(&target) {
                    Some(slot) => {
                        slot.queue
                            .push_back(Queued::new(msg.id, kind, msg.sender, msg.text, route));
                        self.deliver_next(myself, &target);
                    }
                    None => self.leave(route.chain.id),
                }
                FromHost::Stored
            }
            Ok(_) => FromHost::Stored,
            Err(e) => FromHost::Failed(format!("the message could not be stored: {e}")),
        };
        if let Some(reply) = reply {
            let _ = reply.send(answer);
        }
    }
}
