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
use crate::messages::{FromHost, HostCall, HostReply, OutCall};

/// Agents created at run time on other hosts (`flock_create_agent` there) and their host, as
/// this host learned them from those hosts' statuses: the router keeps it, the cluster link reads
/// it (it forwards their mail, hands it over, counts it in `ps`).
pub type CreatedElsewhere = Arc<std::sync::RwLock<HashMap<String, String>>>;

/// This router's place among the swarm's hosts.
#[derive(Debug, Clone)]
pub struct HostLink {
    /// This host's name.
    pub host: String,
    /// The host that holds the channels and the permission records (`cluster.leader`).
    pub leader: String,
    /// Paths on this host never granted to an agent (its state dir), for the leader's checks.
    pub protect: Vec<std::path::PathBuf>,
    /// Agents placed on other hosts, and their host.
    pub remote: HashMap<String, String>,
    /// Those agents, in the swarm file's order (for the roster).
    pub agents: Vec<AgentSpec>,
    /// Agents created at run time on other hosts (also in `remote` and `agents`).
    pub created: CreatedElsewhere,
    /// Claims of another host's agent this host refused already (said once each).
    refused: std::collections::HashSet<(String, String)>,
    /// Agents created at run time on other hosts and decommissioned there since (a late message
    /// from one is refused at once, not waited for).
    gone: std::collections::HashSet<String>,
    /// Woken when a message for another host is stored.
    pub outbox: Arc<tokio::sync::Notify>,
    /// Requests for agents on other hosts, and cancels, for the cluster link to send.
    pub calls: tokio::sync::mpsc::UnboundedSender<OutCall>,
    /// Their receiving end, until the link takes it ([`HostLink::take_calls`]).
    calls_rx: Arc<std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<OutCall>>>>,
}

impl HostLink {
    /// Host `host` of the swarm `whole` (every host's agents).
    pub fn new(whole: &SwarmSpec, host: &str) -> HostLink {
        let agents = whole.agents_elsewhere(host);
        let remote = agents.iter().map(|a| (a.key(), whole.host_of(a).to_owned())).collect();
        let (calls, rx) = tokio::sync::mpsc::unbounded_channel();
        let calls_rx = Arc::new(std::sync::Mutex::new(Some(rx)));
        HostLink {
            host: host.to_owned(),
            leader: whole.leader().to_owned(),
            protect: Vec::new(),
            remote,
            agents,
            created: Arc::default(),
            refused: Default::default(),
            gone: Default::default(),
            outbox: Arc::default(),
            calls,
            calls_rx,
        }
    }

    /// The requests and cancels the router sends to other hosts (once: the link's).
    pub fn take_calls(&self) -> Option<tokio::sync::mpsc::UnboundedReceiver<OutCall>> {
        self.calls_rx.lock().ok()?.take()
    }
}

/// How many request ids from other hosts a host remembers, to take each once: a call copied off
/// an open broker and sent again is refused (its MAC is valid, its id is not new).
const CALLS_REMEMBERED: usize = 65_536;

/// The ids of the requests other hosts sent here lately (at most [`CALLS_REMEMBERED`]).
#[derive(Debug, Default)]
pub(super) struct SeenCalls {
    ids: std::collections::HashSet<MsgId>,
    order: VecDeque<MsgId>,
}

impl SeenCalls {
    /// Whether `id` is new (then it is remembered).
    pub(super) fn first(&mut self, id: MsgId) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > CALLS_REMEMBERED
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        true
    }
}

/// A request waiting for an agent on another host: where it went, and its chain (the hop this
/// host counted for it ends when the answer comes or the caller stops waiting).
#[derive(Debug)]
pub(super) struct RemoteCall {
    host: String,
    chain: MsgId,
}

/// Where the answer to a request from another host goes, and what its chain had used here when
/// it arrived (the answer carries what it used since).
#[derive(Debug)]
pub(super) struct HostCallReply {
    reply: oneshot::Sender<HostReply>,
    chain: MsgId,
    tokens_at_start: u64,
}

/// The origin of a write that stores a message from another host.
pub(super) const FROM_HOST: ConnId = u64::MAX - 1;

/// How many names of agents decommissioned on other hosts a host remembers.
const GONE_KEPT: usize = 65_536;

/// How long a message from an agent this host does not know yet is asked again for (its host
/// created it at run time; hosts read each other's statuses every 2 s).
const NEW_AGENT_GRACE_MS: u64 = 30_000;

impl RouterState {
    /// The host of `agent` when it runs on another one. An instance (`worker@job-1`) runs where
    /// its agent is placed: only an agent of that host may spawn it there.
    pub(super) fn remote_host(&self, agent: &str) -> Option<&str> {
        let remote = &self.hosts.as_ref()?.remote;
        let placed = remote.get(agent).or_else(|| remote.get(agent.split_once('@')?.0));
        placed.map(String::as_str)
    }

    /// The refusal of a call that cannot cross to `target`'s host (an at-most-once message),
    /// when `target` runs on another host.
    pub(super) fn not_across_hosts(
        &self,
        caller: &str,
        target: &str,
    ) -> Option<(ErrorCode, String)> {
        let host = self.remote_host(target)?;
        Some((ErrorCode::TargetUnavailable, self.cross_host_refusal(caller, target, host)))
    }

    /// Why `caller` cannot reach `target` on its host `host`: agents' durable sends, requests
    /// and delegations cross hosts; a person's and an at-most-once message do not.
    pub(super) fn cross_host_refusal(&self, caller: &str, target: &str, host: &str) -> String {
        if caller == OPERATOR {
            format!(
                "`{target}` runs on host `{host}`: at-most-once messages do not cross hosts; send \
                 it durably (without --at-most-once)"
            )
        } else {
            format!(
                "`{target}` runs on host `{host}`: at-most-once messages do not cross hosts; a \
                 durable message (agents__send), a request (agents__request) or a delegation \
                 (agents__delegate) does"
            )
        }
    }

    /// The stored form of `route` for message `id` to `target`: to an agent on another host it
    /// carries the tokens its chain has used so far, per host (that host counts on from there).
    pub(super) fn route_for(&self, route: &Route, id: MsgId, target: &str) -> String {
        if self.remote_host(target).is_none() {
            return route.store(id);
        }
        let Some(c) = self.chains.map.get(&route.chain.id) else { return route.store(id) };
        let mut carried = route.clone();
        carried.tokens = carried.tokens.max(c.tokens);
        carried.by_host = self.tokens_by_host(route.chain.id);
        carried.store(id)
    }

    /// The tokens chain `chain` has used on each host as far as this host knows, its own count
    /// included (empty for a chain this host does not keep).
    pub(super) fn tokens_by_host(&self, chain: MsgId) -> BTreeMap<String, u64> {
        let (Some(c), Some(link)) = (self.chains.map.get(&chain), &self.hosts) else {
            return BTreeMap::new();
        };
        let mut counts = c.elsewhere.clone();
        let own = c.tokens.saturating_sub(counts.values().sum());
        counts.insert(link.host.clone(), own);
        counts.retain(|_, n| *n > 0);
        counts
    }

    /// A chain that came from another host has used `tokens` in all, `by_host` on each host as
    /// far as that host knew: what this host had not counted yet is counted here (each host's
    /// highest count, so two branches that ran at once add up), and the chain is stopped if that
    /// is past its budget. A route of an older build (no counts per host) carries the total.
    pub(super) fn carry_tokens(
        &mut self,
        chain: MsgId,
        tokens: u64,
        by_host: &BTreeMap<String, u64>,
    ) {
        let me = self.hosts.as_ref().map(|l| l.host.clone()).unwrap_or_default();
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        let more = if by_host.is_empty() {
            tokens.saturating_sub(c.tokens)
        } else {
            let own = c.tokens.saturating_sub(c.elsewhere.values().sum());
            let mut more = 0;
            for (host, &count) in by_host {
                if *host == me {
                    // This host's own count as another knew it: more than this host holds
                    // when its record of the chain ended and came back.
                    more += count.saturating_sub(own);
                } else {
                    let seen = c.elsewhere.entry(host.clone()).or_default();
                    more += count.saturating_sub(*seen);
                    *seen = (*seen).max(count);
                }
            }
            more
        };
        if more > 0 {
            self.charge_tokens(chain, more);
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

    /// A message from an agent on host `host` (or a person's, from the leader): stored, queued,
    /// then `reply` (the link acknowledges it to the broker). Refused when the swarm file does
    /// not place its sender on that host, or places its target on another host.
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
        // A person's post that an agent here answers comes from the leader, which holds the
        // channels and the chat bridges.
        let persons = m.sender.starts_with("human:")
            && self.hosts.as_ref().is_some_and(|l| l.leader == host && l.leader != l.host);
        // From this host itself: what another run of it held undelivered when this one took
        // the host over (cluster.failover), checked by that run when it took it.
        let handed = self.hosts.as_ref().is_some_and(|l| l.host == host);
        if placed.is_none() && !persons && !handed && self.may_be_new(&m) {
            let msg = format!(
                "`{}` is not known here yet (created at run time on host `{host}`?)",
                m.sender
            );
            let _ = reply.send(FromHost::Later(msg));
            return;
        }
        if placed != Some(host.as_str()) && !persons && !handed {
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

    /// Whether `m`'s sender may be an agent created at run time on its host that this host has
    /// not learned yet: a name no host of the file runs, not one of this host's, sent within
    /// the last [`NEW_AGENT_GRACE_MS`] (after that it is refused: nothing waits forever).
    fn may_be_new(&self, m: &crate::store::PendingMessage) -> bool {
        let now = self.now();
        let recent = m.enqueued_at <= now.saturating_add(5_000)
            && now.saturating_sub(m.enqueued_at) < NEW_AGENT_GRACE_MS;
        let gone = self.hosts.as_ref().is_some_and(|l| l.gone.contains(&m.sender));
        recent
            && !gone
            && flock_config::valid_agent_name(&m.sender)
            && !self.slots.contains_key(&m.sender)
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
                self.carry_tokens(route.chain.id, route.tokens, &route.by_host);
                let kind = if route.result { DeliveryKind::Result } else { DeliveryKind::Message };
                let target = msg.target.clone();
                match self.slots.get_mut(&target) {
                    Some(slot) => {
                        let chain = route.chain.id;
                        slot.queue
                            .push_back(Queued::new(msg.id, kind, msg.sender, msg.text, route));
                        // A person's post worked on here: the leader's chat shows typing.
                        self.sync_working(chain);
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

impl RouterState {
    /// A request for `target` on host `host`, checked and counted here like any request: the
    /// link sends it, and its answer comes back as [`RouterMsg::AnswerFromHost`].
    pub(super) fn call_remote(&mut self, host: String, call: HostCall, chain: MsgId) {
        let (id, callee) = (call.id, call.to.clone());
        self.remote_calls.insert(id, RemoteCall { host: host.clone(), chain });
        let sent = self
            .hosts
            .as_ref()
            .is_some_and(|l| l.calls.send(OutCall::Request { host, call }).is_ok());
        if !sent {
            let message = "the link to the other hosts is not running".to_owned();
            let body = Body::Error { code: ErrorCode::TargetUnavailable, message };
            self.answered_from_host(id, &callee, HostReply::of(body));
        }
    }

    /// The answer to request `id` from the host that ran it (or why there is none), with the
    /// tokens its chain used there: counted here, against the one budget.
    pub(super) fn answered_from_host(&mut self, id: MsgId, callee: &str, reply: HostReply) {
        let HostReply { mut body, tokens, by_host } = reply;
        if let Some(call) = self.remote_calls.remove(&id) {
            if !by_host.is_empty() {
                self.carry_tokens(call.chain, 0, &by_host);
            } else if tokens > 0 {
                self.charge_tokens(call.chain, tokens);
            }
            self.leave(call.chain);
        }
        // Bounded here as an answer from an agent here is, so it fits its caller's frames.
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        if let Body::Reply { text } | Body::Error { message: text, .. } = &mut body
            && text.len() > limit
        {
            super::cut_to(text, limit);
        }
        self.reply(id, callee, body);
    }

    /// A request that nobody here waits for any more (its deadline passed): the host running it
    /// is told, and the hop this host counted for it ends.
    pub(super) fn remote_call_over(&mut self, id: MsgId) {
        let Some(call) = self.remote_calls.remove(&id) else { return };
        self.leave(call.chain);
        if let Some(link) = &self.hosts {
            let _ = link.calls.send(OutCall::Cancel { host: call.host, id });
        }
    }

    /// A request from an agent on host `host`: checked as the caller's own host checked it
    /// (a host may speak only for its own agents), then run here like one from this host; the
    /// answer goes to `reply`.
    pub(super) fn called_from_host(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        host: String,
        call: HostCall,
        reply: oneshot::Sender<HostReply>,
    ) {
        let refused = |code: ErrorCode, message: String| Body::Error { code, message };
        let placed = self.remote_host(&call.from);
        let caller_spec =
            self.hosts.as_ref().and_then(|l| l.agents.iter().find(|a| a.key() == call.from));
        let callee = chain_entry(&call.to);
        let refusal = if self.draining {
            Some(refused(ErrorCode::Draining, "the swarm is shutting down".into()))
        } else if placed != Some(host.as_str()) {
            let msg = format!("host `{host}` may not speak for `{}`", call.from);
            tracing::warn!(from = %host, "flock cluster: refused a request: {msg}");
            Some(refused(ErrorCode::Forbidden, msg))
        } else if !self.slots.contains_key(&call.to) {
            let msg = format!(
                "no agent named `{}` runs on host `{}`",
                call.to,
                self.hosts.as_ref().map_or("", |l| l.host.as_str())
            );
            Some(refused(ErrorCode::AgentNotFound, msg))
        } else if caller_spec
            .is_some_and(|s| !s.can_call.is_empty() && !s.can_call.contains(&call.to))
        {
            let msg =
                format!("`{}` may not call `{}` (can_call in the swarm file)", call.from, call.to);
            Some(refused(ErrorCode::Forbidden, msg))
        } else if call.calls.contains(&callee) {
            let msg = format!(
                "calling {callee} would close a cycle: {} → {callee}",
                call.calls.join(" → ")
            );
            Some(refused(ErrorCode::CircularCall, msg))
        } else if call.text.len() > flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes)
        {
            let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
            Some(refused(
                ErrorCode::BadRequest,
                super::too_long("the request", call.text.len(), limit),
            ))
        } else if self.requests.contains_key(&call.id) || !self.seen_calls.first(call.id) {
            let msg = "this request was taken already (a request runs once)".to_owned();
            tracing::warn!(from = %host, "flock cluster: refused a request: {msg}");
            Some(refused(ErrorCode::BadRequest, msg))
        } else {
            None
        };
        if let Some(body) = refusal {
            let _ = reply.send(HostReply::of(body));
            return;
        }
        let now = self.now();
        let route = Route::load(&call.route, call.id, &call.from, &call.to, &call.text, now);
        // The hop was counted where the request was made; the chain goes on here from there.
        self.chains.entry(&route.chain, route.hop.saturating_add(1)).live += 1;
        self.carry_tokens(route.chain.id, route.tokens, &route.by_host);
        let tokens_at_start = self.chains.map.get(&route.chain.id).map_or(0, |c| c.tokens);
        let chain = route.chain.id;
        let timeout_ms = call.timeout_ms.max(1);
        let deadline = now.saturating_add(timeout_ms);
        let id = call.id;
        let pending = PendingRequest {
            caller: call.from.clone(),
            caller_conn: FROM_HOST,
            target: call.to.clone(),
            timeout_ms,
            deadline,
        };
        self.requests.insert(id, pending);
        self.host_calls.insert(id, HostCallReply { reply, chain, tokens_at_start });
        self.deadlines.insert((deadline, id));
        self.arm_deadline(myself);
        let Some(slot) = self.slots.get_mut(&call.to) else { return };
        let mut q = Queued::new(id, DeliveryKind::Request, call.from, call.text, route);
        q.call_chain = call.calls;
        slot.queue.push_back(q);
        self.deliver_next(myself, &call.to);
    }

    /// Answers request `id` from another host with `body` and the tokens its chain used here
    /// since it arrived (none if nobody waits for it any more).
    pub(super) fn answer_host_call(&mut self, id: MsgId, body: Body) {
        let Some(call) = self.host_calls.remove(&id) else { return };
        let now = self.chains.map.get(&call.chain).map_or(0, |c| c.tokens);
        let tokens = now.saturating_sub(call.tokens_at_start);
        let by_host = self.tokens_by_host(call.chain);
        let _ = call.reply.send(HostReply { body, tokens, by_host });
    }

    /// The caller on host `host` stopped waiting for request `id`: its callee's turn here is
    /// cancelled as for a caller here whose deadline passed.
    pub(super) fn cancelled_from_host(&mut self, host: &str, id: MsgId) {
        let from_there = self.requests.get(&id).is_some_and(|r| {
            r.caller_conn == FROM_HOST && self.remote_host(&r.caller) == Some(host)
        });
        if from_there {
            self.request_timeout(id);
        }
    }
}

impl RouterState {
    /// Agent `name` was created here: another host's word for that name (it claimed it first,
    /// created at run time there) is no longer taken — this host's own agent is routed to here.
    pub(super) fn created_here(&mut self, name: &str) {
        let Some(link) = self.hosts.as_mut() else { return };
        let mut created = link.created.write().unwrap_or_else(|p| p.into_inner());
        if let Some(host) = created.remove(name) {
            tracing::warn!(agent = %name, "flock cluster: `{name}` was created here and on host `{host}`; this host routes it here");
            link.remote.remove(name);
            link.agents.retain(|a| a.key() != name);
            link.refused.insert((host, name.to_owned()));
        }
    }

    /// Host `host` runs `agents` created at run time there (its whole list, from its status):
    /// routed to from now on, in the roster, and on the leader in the channels; those it no
    /// longer lists (decommissioned) are gone. A name the swarm file places, or an agent of this
    /// host, or one another host claimed first, is never taken from a host's word.
    pub(super) fn created_elsewhere(&mut self, host: String, agents: Vec<AgentSpec>) {
        let Some(link) = self.hosts.as_mut() else { return };
        if host == link.host {
            return;
        }
        let leader_here = link.leader == link.host;
        let listed: std::collections::HashSet<String> = agents.iter().map(|a| a.key()).collect();
        let mut created = link.created.write().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = created
            .iter()
            .filter(|(name, h)| **h == host && !listed.contains(*name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            created.remove(name);
            link.remote.remove(name);
            link.agents.retain(|a| a.key() != *name);
            if link.gone.len() < GONE_KEPT {
                link.gone.insert(name.clone());
            }
        }
        let mut added = Vec::new();
        for spec in agents {
            let name = spec.key();
            if created.get(&name) == Some(&host) {
                continue;
            }
            let why = if link.remote.contains_key(&name) || self.slots.contains_key(&name) {
                Some("an agent of that name runs elsewhere already")
            } else if !flock_config::valid_agent_name(&name) || spec.instance.is_some() {
                Some("it is not an agent's name")
            } else if matches!(
                spec.role,
                flock_config::Role::Orchestrator | flock_config::Role::Sysadmin
            ) {
                Some("a swarm's orchestrator and sysadmin are declared in its file")
            } else {
                None
            };
            if let Some(why) = why {
                if link.refused.insert((host.clone(), name.clone())) {
                    tracing::warn!(from = %host, agent = %name, "flock cluster: host `{host}` says it created `{name}`; not taken: {why}");
                }
                continue;
            }
            link.gone.remove(&name);
            created.insert(name.clone(), host.clone());
            link.remote.insert(name, host.clone());
            link.agents.push(spec.clone());
            added.push(spec);
        }
        drop(created);
        if !added.is_empty() || !gone.is_empty() {
            let names: Vec<String> = added.iter().map(|a| a.key()).collect();
            tracing::info!(host = %host, added = ?names, gone = ?gone, "flock cluster: agents created at run time on host `{host}`");
            if leader_here && let Some(ch) = &self.channels {
                let _ = ch.cast(ChannelsMsg::Elsewhere { added, gone });
            }
        }
    }
}
