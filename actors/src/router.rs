//! The router actor: every frame between agents passes through here. Its handler is O(1) per
//! frame and never awaits an agent: socket I/O happens in per-connection tasks, SQLite in the
//! store actor, process control in the supervisor. It owns the in-memory view of every mailbox
//! (the durable copy is in SQLite) and hands each agent one turn at a time.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flock_config::{AgentSpec, SwarmSpec};
use flock_ipc::id::{derive_id, fmt_id, new_id};
use flock_ipc::identity::{DEFAULT_INSTANCE, hello_address, same_secret};
use flock_ipc::{
    Body, ChainEnd, ChainOutcome, ControlReply, ControlRequest, Delivery, DeliveryKind, ErrorCode,
    Frame, Hello, MsgId, OPERATOR, Outbox, PROTOCOL_VERSION, PeerCred, ROUTER, SendMode, Welcome,
};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;

use crate::chains::{self, ChainTag, Chains, Route, StopKind};
use crate::messages::{
    AnswerPosted, ChannelsMsg, ConnId, ConnKind, GatewayMsg, Opened, Origin, RouteInfo,
    RouterCounters, RouterMsg, StoreMsg, StoredBatch,
};
use crate::store::{NewMessage, WriteOp, WriteOutcome};
use crate::text::{clip, too_long};
use flock_journal::{JournalEvent, JournalWriter, Status};

mod answers;
mod bridge;
mod clock;
mod handshake;
mod hosts;
mod leader;
mod mailbox;
mod operator;
mod permit;
mod sessions;
#[cfg(test)]
mod tests;
mod tiers;
mod tools;

pub use clock::Clock;
pub use hosts::{CreatedElsewhere, HostLink};
pub use permit::PermissionReply;

/// Index under which a turn's routed answer is derived from its input's id (a replayed turn
/// re-derives the same id, so the durable mailbox drops the duplicate).
const RESULT_INDEX: u32 = u32::MAX - 16;
/// The identity of the operator (`flockctl`) as a chain participant: answers go to their DM.
pub const OPERATOR_HUMAN: &str = "human:operator";

/// The connection of a write nobody waits to hear about (a routed result).
const NO_CONN: ConnId = u64::MAX;

/// Facts the supervisor needs from the router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterEvent {
    /// The agent completed its handshake: it is ready.
    Ready { agent: String, pid: u32 },
    /// The agent's connection closed.
    Disconnected { agent: String },
}

/// A `flockctl` request for the supervisor, with where to send the answer.
#[derive(Debug)]
pub struct ControlCall {
    pub request: ControlRequest,
    /// Id of the request frame: answers carry it as their correlation id.
    pub frame_id: MsgId,
    pub outbox: Outbox,
    /// The host whose operator asked, when it is another host's (`cluster.operators`).
    pub from_host: Option<String>,
}

pub type EventSink = Arc<dyn Fn(RouterEvent) + Send + Sync>;
pub type ControlSink = Arc<dyn Fn(ControlCall) + Send + Sync>;

pub struct RouterArgs {
    pub spec: Arc<SwarmSpec>,
    pub store: ActorRef<StoreMsg>,
    pub events: EventSink,
    pub control: ControlSink,
    /// Per agent: Unix ms of the last frame received from it (read by the heartbeat check).
    pub liveness: HashMap<String, Arc<AtomicU64>>,
    /// The channels actor (`flock_*` tools, deltas), if channels are enabled.
    pub channels: Option<ActorRef<ChannelsMsg>>,
    /// The LLM gateway (`LlmCall`), if remote models are enabled.
    pub gateway: Option<ActorRef<GatewayMsg>>,
    /// Where chain hops are journaled (`None`: not journaled).
    pub journal: Option<JournalWriter>,
    /// The memory tools (`memory_search`…), if the swarm has a memory dir.
    pub memory: Option<crate::memory::MemoryService>,
    /// The operator key a control connection must present (`flock_ipc::operator`); `None`
    /// serves control connections without one (in-process tests and benches only).
    pub operator_key: Option<String>,
    /// The swarm runs on several hosts: this one's name and where the others' agents run
    /// (`None`: one host).
    pub hosts: Option<HostLink>,
    /// What deadlines and chain budgets are measured on: the wall clock, or tokio's in tests.
    pub clock: Clock,
}

pub struct Router;

/// One queued input of an agent.
#[derive(Debug, Clone)]
struct Queued {
    id: MsgId,
    kind: DeliveryKind,
    sender: String,
    text: String,
    /// Failed deliveries so far (durable messages only).
    attempts: u32,
    call_chain: Vec<String>,
    /// For deltas: the messages of the channel it covers.
    channel: Option<crate::messages::DeltaSpan>,
    /// Its chain and who waits for the answer of its turn.
    route: Route,
    /// The turn handed this input over (`Delegate`): its own answer is not routed.
    delegated: bool,
}

impl Queued {
    fn new(id: MsgId, kind: DeliveryKind, sender: String, text: String, route: Route) -> Queued {
        Queued {
            id,
            kind,
            sender,
            text,
            attempts: 0,
            call_chain: Vec::new(),
            channel: None,
            route,
            delegated: false,
        }
    }

    /// Durable in SQLite (messages and results), as opposed to in memory only.
    fn durable(&self) -> bool {
        matches!(self.kind, DeliveryKind::Message | DeliveryKind::Result)
    }

    fn chain(&self) -> MsgId {
        self.route.chain.id
    }
}

struct Slot {
    spec: AgentSpec,
    spec_json: String,
    conn: Option<ConnId>,
    expected_token: Option<String>,
    /// The token of the spawn that said Hello: a second Hello with it means two processes had
    /// it, and one of them is not the agent.
    used_token: Option<String>,
    /// The process the supervisor started for the current spawn, once it is known.
    spawned_pid: Option<u32>,
    /// The process tree (the supervisor's child it descends from) the connection said Hello from.
    conn_root: Option<u32>,
    stopping: bool,
    queue: VecDeque<Queued>,
    /// The input the agent is working on: the oldest one handed over and not yet acknowledged.
    in_flight: Option<Queued>,
    /// Durable messages handed over behind `in_flight`, not started yet (at most the agent's
    /// delivery window − 1), oldest first: the agent runs them in this order.
    window: VecDeque<Queued>,
    /// The `Nack` (its delivery id) whose `Rewind` could not be queued yet: nothing else is
    /// handed over before it.
    rewind_owed: Option<MsgId>,
    /// When the input in flight was handed over (its turn's duration, for the metrics).
    delivered_at: Option<Instant>,
    turns_total: u64,
    last_seen: Arc<AtomicU64>,
    retry_scheduled: bool,
}

impl Slot {
    fn new(
        spec: AgentSpec,
        last_seen: Arc<AtomicU64>,
        turns_total: u64,
    ) -> Result<Self, serde_json::Error> {
        Ok(Slot {
            spec_json: serde_json::to_string(&spec)?,
            spec,
            conn: None,
            expected_token: None,
            used_token: None,
            spawned_pid: None,
            conn_root: None,
            stopping: false,
            queue: VecDeque::new(),
            in_flight: None,
            window: VecDeque::new(),
            rewind_owed: None,
            delivered_at: None,
            turns_total,
            last_seen,
            retry_scheduled: false,
        })
    }
}

struct ConnInfo {
    /// Agent name, or `operator` for control connections.
    identity: String,
    kind: ConnKind,
    outbox: Outbox,
    _closer: oneshot::Sender<()>,
}

struct PendingRequest {
    caller: String,
    caller_conn: ConnId,
    target: String,
    timeout_ms: u64,
    /// Absolute deadline, Unix ms (its key in `RouterState::deadlines`).
    deadline: u64,
}

pub struct RouterState {
    spec: Arc<SwarmSpec>,
    memory: Option<crate::memory::MemoryService>,
    store: ActorRef<StoreMsg>,
    events: EventSink,
    control: ControlSink,
    slots: HashMap<String, Slot>,
    conns: HashMap<ConnId, ConnInfo>,
    requests: HashMap<MsgId, PendingRequest>,
    draining: bool,
    counters: RouterCounters,
    channels: Option<ActorRef<ChannelsMsg>>,
    /// Agent names in start order (file order, then agents created at run time).
    order: Vec<String>,
    gateway: Option<ActorRef<GatewayMsg>>,
    /// Pending request deadlines, earliest first: one timer for all of them, not one per request.
    deadlines: std::collections::BTreeSet<(u64, MsgId)>,
    /// The deadline the one armed timer fires at, if any.
    deadline_armed: Option<u64>,
    /// Turns finished since the last flush, per agent (requests, deltas, at_most_once messages;
    /// durable messages count in their own completion write).
    unflushed_turns: HashMap<String, u64>,
    /// Live chains of turns and their budgets.
    chains: Chains,
    journal: Option<JournalWriter>,
    /// The swarm's chat bridges, by name.
    bridges: HashMap<String, bridge::BridgeSlot>,
    /// Chains working on a person's post, and where it is (told to the channels actor).
    working: HashMap<MsgId, chains::ReplyPlace>,
    operator_key: Option<String>,
    hosts: Option<HostLink>,
    /// Messages forwarded to another host whose result an agent here waits for, and their chain.
    awaiting: HashMap<MsgId, MsgId>,
    /// Messages from other hosts being stored, and who acknowledges them once they are.
    host_acks: HashMap<MsgId, oneshot::Sender<crate::messages::FromHost>>,
    /// Requests sent to agents on other hosts, not answered yet.
    remote_calls: HashMap<MsgId, hosts::RemoteCall>,
    /// Requests from other hosts running here, and where their answer goes.
    host_calls: HashMap<MsgId, hosts::HostCallReply>,
    seen_calls: hosts::SeenCalls,
    /// What this host asked other hosts (channel calls, deltas), not answered yet.
    asked: HashMap<MsgId, leader::Asked>,
    /// Channel notifications from the leader queued here, and where their outcome goes.
    host_deltas: HashMap<MsgId, oneshot::Sender<Body>>,
    /// How far each agent here was told each channel the leader holds on another host (seq,
    /// and the channel's `born`), kept in the store: a notification the leader sends again
    /// because it lost the answer is not told twice.
    told: crate::store::DeltasTold,
    /// Operators' commands across hosts (operator.rs).
    operator: operator::OperatorState,
    clock: Clock,
}

/// The wall clock, Unix ms: an agent's `last_seen` (the supervisor's heartbeat check reads it).
fn unix_ms() -> u64 {
    flock_ipc::time::unix_ms_now()
}

impl RouterState {
    /// Now on the router's clock, Unix ms: deadlines, chain starts and budgets.
    fn now(&self) -> u64 {
        self.clock.now_ms()
    }
}

/// `agent@instance` of an address (`name` is the default instance).
fn chain_entry(address: &str) -> String {
    if address.contains('@') { address.to_owned() } else { format!("{address}@{DEFAULT_INSTANCE}") }
}

impl Actor for Router {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = RouterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RouterMsg>,
        args: RouterArgs,
    ) -> Result<RouterState, ActorProcessingErr> {
        myself.send_interval(Duration::from_secs(1), || RouterMsg::FlushTurns);
        let pending = ractor::call!(args.store, StoreMsg::Pending)?.map_err(anyhow_like)?;
        let totals = ractor::call!(args.store, StoreMsg::TurnsTotals)?.map_err(anyhow_like)?;
        let told = crate::store_actor::with_store(&args.store, |s| s.deltas_told())
            .await
            .map_err(anyhow_like)?;
        let mut slots = HashMap::new();
        for spec in &args.spec.agents {
            let key = spec.key();
            let last_seen = args.liveness.get(&key).cloned().unwrap_or_default();
            let turns = totals.get(&key).copied().unwrap_or(0);
            slots.insert(key, Slot::new(spec.clone(), last_seen, turns)?);
        }
        let mut orphans = 0;
        let mut chains = Chains::default();
        for m in pending {
            // Mail for another host's agents waits for the cluster link, not for a turn here.
            if args.hosts.as_ref().is_some_and(|h| h.remote.contains_key(&m.target)) {
                continue;
            }
            let Some(slot) = slots.get_mut(&m.target) else {
                // The agent was removed from the swarm file; its mail waits for it to return.
                orphans += 1;
                continue;
            };
            // Chains resume where their messages say they were (hops and start time).
            let route = Route::load(&m.route, m.id, &m.sender, &m.target, &m.text, m.enqueued_at);
            chains.entry(&route.chain, route.hop).live += 1;
            let kind = if route.result { DeliveryKind::Result } else { DeliveryKind::Message };
            let mut q = Queued::new(m.id, kind, m.sender, m.text, route);
            q.attempts = m.attempts;
            slot.queue.push_back(q);
        }
        if orphans > 0 {
            tracing::warn!(
                orphans,
                "flock router: {orphans} pending message(s) are addressed to agents no longer in the swarm file; they stay in the store"
            );
        }
        let order = args.spec.agents.iter().map(AgentSpec::key).collect();
        let bridges = args
            .spec
            .bridges
            .iter()
            .map(|b| (b.name.clone(), bridge::BridgeSlot::new(b)))
            .collect();
        let resumed: Vec<MsgId> = chains.map.keys().copied().collect();
        let mut state = RouterState {
            spec: args.spec,
            store: args.store,
            events: args.events,
            control: args.control,
            slots,
            conns: HashMap::new(),
            requests: HashMap::new(),
            draining: false,
            counters: RouterCounters::default(),
            channels: args.channels,
            gateway: args.gateway,
            order,
            deadlines: std::collections::BTreeSet::new(),
            deadline_armed: None,
            unflushed_turns: HashMap::new(),
            chains,
            journal: args.journal,
            memory: args.memory,
            bridges,
            working: HashMap::new(),
            operator_key: args.operator_key,
            hosts: args.hosts,
            awaiting: HashMap::new(),
            host_acks: HashMap::new(),
            remote_calls: HashMap::new(),
            host_calls: HashMap::new(),
            seen_calls: Default::default(),
            asked: HashMap::new(),
            host_deltas: HashMap::new(),
            told,
            operator: Default::default(),
            clock: args.clock,
        };
        // Chains resumed on people's posts are working on them again: the chats show it.
        for chain in resumed {
            state.sync_working(chain);
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<RouterMsg>,
        msg: RouterMsg,
        state: &mut RouterState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            RouterMsg::Open(opened) => state.open(&myself, opened),
            RouterMsg::Frames { conn, frames, permit } => {
                let Some(info) = state.conns.get(&conn) else { return Ok(()) };
                let identity = info.identity.clone();
                let kind = info.kind;
                if kind == ConnKind::Agent
                    && let Some(slot) = state.slots.get(&identity)
                {
                    slot.last_seen.store(unix_ms(), Ordering::Relaxed);
                }
                for frame in frames {
                    if kind == ConnKind::Bridge {
                        state.bridge_frame(conn, &identity, frame);
                    } else {
                        state.frame(&myself, conn, kind, &identity, frame);
                    }
                }
                drop(permit);
            }
            RouterMsg::Closed { conn } => state.closed(conn),
            RouterMsg::Stored(batch) => state.stored(&myself, batch),
            RouterMsg::CheckDeadlines => {
                state.deadline_armed = None;
                let now = state.now();
                while let Some(&(due, id)) = state.deadlines.first() {
                    if due > now {
                        break;
                    }
                    state.deadlines.pop_first();
                    state.request_timeout(id);
                }
                state.arm_deadline(&myself);
            }
            RouterMsg::FlushTurns => {
                state.flush_turns();
                state.check_wall_budgets();
            }
            RouterMsg::Tokens { chain, tokens } => state.charge_tokens(chain, tokens),
            RouterMsg::PermissionHuman { person, tool, arguments, reply } => {
                let caller = crate::caller::Caller { id: person, role: None };
                let reply = PermissionReply::Human(reply);
                let key = new_id();
                let call =
                    permit::PermissionCall { caller, tool, arguments, key, protected: vec![] };
                state.permission_call(&myself, call, reply);
            }
            RouterMsg::Permission(effects) => state.permission_effects(&myself, effects),
            RouterMsg::MemoryTick => state.memory_tick(&myself),
            RouterMsg::MemoryTiers { by, result } => state.memory_tiers(&myself, by, result),
            RouterMsg::Answered(posted) => state.answered(posted),
            RouterMsg::Asked(ask) => state.asked(&myself, ask),
            RouterMsg::RetryDeliver(agent) => {
                if let Some(slot) = state.slots.get_mut(&agent) {
                    slot.retry_scheduled = false;
                }
                state.deliver_next(&myself, &agent);
            }
            RouterMsg::Expect { agent, token } => {
                if let Some(slot) = state.slots.get_mut(&agent) {
                    slot.expected_token = Some(token);
                    slot.spawned_pid = None;
                    slot.stopping = false;
                }
            }
            RouterMsg::Spawned { agent, pid } => state.spawned(&agent, pid),
            RouterMsg::Stop { agent } => {
                if let Some(slot) = state.slots.get_mut(&agent) {
                    slot.stopping = true;
                    slot.expected_token = None;
                    if let Some(info) = slot.conn.and_then(|c| state.conns.get(&c)) {
                        let _ = info.outbox.try_send(Frame::new(ROUTER, &agent, Body::Shutdown));
                    }
                }
            }
            RouterMsg::Drain => {
                state.draining = true;
                state.flush_turns();
            }
            RouterMsg::Delta { agent, span, text, chain } => {
                state.delta(&myself, agent, span, text, chain);
            }
            RouterMsg::SessionClosed { agent, channel } => {
                if let Some(conn) = state.slots.get(&agent).and_then(|s| s.conn) {
                    let frame = Frame::new(ROUTER, &agent, Body::SessionClosed { channel });
                    state.answer(conn, frame);
                }
            }
            RouterMsg::FromHost { host, msg, reply } => {
                state.arrived_from_host(&myself, host, msg, reply)
            }
            RouterMsg::CallFromHost { host, call, reply } => {
                state.called_from_host(&myself, host, call, reply)
            }
            RouterMsg::CancelFromHost { host, id } => state.cancelled_from_host(&host, id),
            RouterMsg::AnswerFromHost { id, callee, reply } => {
                state.answered_from_host(id, &callee, reply)
            }
            RouterMsg::HostAsked { host, id, ask, reply } => {
                state.asked_by_host(&myself, host, id, ask, reply)
            }
            RouterMsg::HostAnswered { id, body } => state.host_answered(id, body),
            RouterMsg::AddAgent { spec, liveness } => {
                if !state.slots.contains_key(&spec.key()) {
                    let name = spec.key();
                    state.created_here(&name);
                    state.slots.insert(name.clone(), Slot::new(spec, liveness, 0)?);
                    state.order.push(name);
                }
            }
            RouterMsg::RemoveAgent { name } => {
                state.order.retain(|n| n != &name);
                if let Some(slot) = state.slots.remove(&name) {
                    for q in slot.queue.iter().chain(&slot.in_flight).chain(&slot.window) {
                        if q.kind == DeliveryKind::Request {
                            state.reply(
                                q.id,
                                &name,
                                Body::Error {
                                    code: ErrorCode::AgentNotFound,
                                    message: format!("`{name}` was decommissioned"),
                                },
                            );
                        }
                        // Its mail will never be read: dead letters (listed, never silently
                        // dropped); the chains no longer wait for it.
                        if matches!(q.kind, DeliveryKind::Message | DeliveryKind::Result) {
                            crate::metrics::get().dead_letters.inc();
                            let op = WriteOp::DeadLetter {
                                id: q.id,
                                attempts: q.attempts,
                                reason: format!("`{name}` was decommissioned before reading it"),
                            };
                            let _ = state.store.cast(StoreMsg::Write {
                                op,
                                origin: None,
                                notify: None,
                            });
                        }
                        state.leave(q.chain());
                    }
                }
            }
            RouterMsg::CreatedElsewhere { host, agents } => state.created_elsewhere(host, agents),
            RouterMsg::ExpectBridge { bridge, token } => state.expect_bridge(&bridge, token),
            RouterMsg::StopBridge { bridge } => state.stop_bridge(&bridge),
            RouterMsg::Bridges(reply) => {
                let _ = reply.send(state.bridge_infos());
            }
            RouterMsg::Snapshot(reply) => {
                let infos = state
                    .order
                    .iter()
                    .filter_map(|a| state.slots.get(a))
                    .map(|s| RouteInfo {
                        name: s.spec.key(),
                        connected: s.conn.is_some(),
                        busy: s.in_flight.is_some(),
                        mailbox_depth: (s.queue.len() + s.window.len()) as u64
                            + u64::from(s.in_flight.is_some()),
                        turns_total: s.turns_total,
                    })
                    .collect();
                let mut counters = state.counters.clone();
                counters.chains_live = state.chains.map.len() as u64;
                counters.chains_stopped = state.chains.stopped_total;
                let _ = reply.send((infos, counters));
            }
        }
        Ok(())
    }
}

fn anyhow_like(e: String) -> ActorProcessingErr {
    e.into()
}

fn send_to(outbox: &Outbox, frame: Frame) -> bool {
    outbox.try_send(frame).is_ok()
}

impl RouterState {
    fn frame(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        conn: ConnId,
        kind: ConnKind,
        identity: &str,
        mut frame: Frame,
    ) {
        // Identity comes from the connection, never from the frame.
        frame.from = identity.to_owned();
        // Message texts are bounded where they come in, so whatever they become further on (a
        // delivery, a delegated result, an answer) still fits in a frame at its reader.
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        match &mut frame.body {
            Body::Send { text, .. } | Body::Request { text, .. } | Body::Delegate { text }
                if text.len() > limit =>
            {
                let msg = too_long("the message", text.len(), limit);
                return self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
            }
            // An answer is never refused (its turn would hang): it is cut, and says so.
            Body::Reply { text } | Body::Ack { reply: Some(text) } if text.len() > limit => {
                cut_to(text, limit);
            }
            _ => {}
        }
        match &frame.body {
            Body::Send { .. } => self.send(myself, conn, frame),
            Body::Request { .. } => self.request(myself, conn, frame),
            Body::Delegate { .. } if kind == ConnKind::Agent => {
                self.delegate(myself, conn, identity, frame)
            }
            Body::Ack { .. } | Body::Nack { .. } if kind == ConnKind::Agent => {
                self.turn_finished(myself, identity, frame)
            }
            Body::ToolCall { .. } if kind == ConnKind::Agent => {
                self.tool_call(myself, conn, identity, frame)
            }
            Body::LlmCall { request } if kind == ConnKind::Agent => {
                let slot = self.slots.get(identity);
                let model = slot.map(|s| s.spec.model.clone());
                // A model call belongs to the chain of the turn that makes it; a stopped chain
                // gets no more model time.
                let current = slot
                    .and_then(|s| s.in_flight.as_ref())
                    .map(|q| (q.route.chain.clone(), q.route.hop));
                // Model tokens are charged: the chain is kept from its first model call on.
                if let Some((tag, hop)) = &current {
                    self.materialize(tag, hop + 1, 1);
                }
                let slot = self.slots.get(identity);
                let chain = current.map(|(tag, _)| tag.id);
                if let Some(reason) =
                    chain.and_then(|c| self.chains.map.get(&c)).and_then(|c| c.stopped.clone())
                {
                    let msg = format!("this chain of turns was stopped: {reason}");
                    return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
                }
                let outbox = self.conns.get(&conn).map(|i| i.outbox.clone());
                match (&self.gateway, model, outbox) {
                    (Some(gw), Some(model), Some(outbox)) => {
                        let call = GatewayMsg::Call {
                            agent: identity.to_owned(),
                            model,
                            request: request.clone(),
                            frame_id: frame.id,
                            outbox,
                            chain: chain.map(|c| (c, myself.clone())),
                            background: slot.is_some_and(|s| s.spec.role.answers_in_text()),
                        };
                        if gw.cast(call).is_err() {
                            let err = Frame::error(
                                &frame,
                                ErrorCode::Internal,
                                "the LLM gateway is not running",
                            );
                            self.answer(conn, err);
                        }
                    }
                    _ => {
                        let err = Frame::error(
                            &frame,
                            ErrorCode::Internal,
                            "no LLM gateway for this agent",
                        );
                        self.answer(conn, err);
                    }
                }
            }
            Body::SessionSave { channel, messages } if kind == ConnKind::Agent => {
                self.save_session(identity, channel, messages);
            }
            Body::SessionLoad { channel } if kind == ConnKind::Agent => {
                self.load_session(conn, identity, &frame, channel);
            }
            Body::Heartbeat => {
                self.answer(conn, Frame::answer(&frame, ROUTER, Body::HeartbeatAck));
            }
            Body::ShutdownAck | Body::HeartbeatAck => {}
            Body::Control(ControlRequest::Watch { chain }) if kind == ConnKind::Control => {
                if let Some(c) = self.chains.map.get_mut(chain) {
                    c.watchers.push((conn, frame.id));
                } else if !self.operator_watch_elsewhere(conn, frame.id, *chain) {
                    let msg = format!(
                        "no chain {} in flight (it may have ended already; see `flockctl journal query corr={}`)",
                        fmt_id(*chain),
                        fmt_id(*chain)
                    );
                    self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
                }
            }
            Body::Control(ControlRequest::Memory { tool, arguments })
                if kind == ConnKind::Control =>
            {
                let (tool, arguments) = (tool.clone(), arguments.clone());
                self.operator_memory(myself, conn, &frame, tool, arguments);
            }
            Body::Control(ControlRequest::Chains) if kind == ConnKind::Control => {
                let now = self.now();
                let budget = &self.spec.budget;
                let mut rows: Vec<_> =
                    self.chains.map.values().map(|c| c.row(budget, now)).collect();
                rows.sort_by_key(|r| std::cmp::Reverse(r.age_ms));
                let reply = Body::ControlReply(ControlReply::Chains(rows));
                self.answer(conn, Frame::answer(&frame, ROUTER, reply));
            }
            Body::Control(request) if kind == ConnKind::Control => {
                if self.operator_control_elsewhere(conn, &frame, request) {
                    return;
                }
                if let Some(info) = self.conns.get(&conn) {
                    (self.control)(ControlCall {
                        request: request.clone(),
                        frame_id: frame.id,
                        outbox: info.outbox.clone(),
                        from_host: None,
                    });
                }
            }
            other => {
                let msg = format!("a {} frame is not accepted on this connection", other.kind());
                self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
            }
        }
    }

    fn answer(&mut self, conn: ConnId, frame: Frame) {
        if conn == operator::REMOTE_OPERATOR {
            return self.answer_remote_operator(frame);
        }
        if let Some(info) = self.conns.get(&conn)
            && !send_to(&info.outbox, frame)
        {
            self.counters.dropped += 1;
        }
    }

    /// Checks that `caller` may address `target`; the error is ready to send.
    fn check_target(&self, caller: &str, target: &str) -> Result<(), (ErrorCode, String)> {
        if self.draining {
            return Err((ErrorCode::Draining, "the swarm is shutting down".into()));
        }
        if let Some(host) = self.remote_host(target) {
            if caller == OPERATOR {
                let msg = self.cross_host_refusal(caller, target, host);
                return Err((ErrorCode::TargetUnavailable, msg));
            }
        } else if !self.slots.contains_key(target) {
            let known: Vec<&str> = self.order.iter().map(String::as_str).collect();
            return Err((
                ErrorCode::AgentNotFound,
                format!("no agent named `{target}`; agents: {}", known.join(", ")),
            ));
        }
        if let Some(slot) = self.slots.get(caller)
            && !slot.spec.can_call.is_empty()
            && !slot.spec.can_call.iter().any(|c| c == target)
        {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "`{caller}` may only call: {} (can_call in the swarm file)",
                    slot.spec.can_call.join(", ")
                ),
            ));
        }
        Ok(())
    }
}

/// A message's text for the journal: one line, at most 200 characters, quoted.
fn quote(text: &str) -> String {
    format!("{:?}", clip(text, 200))
}

/// Cuts `text` to at most `limit` bytes (on a char boundary) and says how much was cut.
fn cut_to(text: &mut String, limit: usize) {
    let note = format!("\n[… cut: the answer was {}]", flock_ipc::human_bytes(text.len()));
    let mut end = limit.saturating_sub(note.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&note);
}

/// Records a finished turn (its duration since delivery) in the metrics.
fn turn_ended(agent: &str, slot: &mut Slot, ok: bool) {
    if let Some(t0) = slot.delivered_at.take() {
        crate::metrics::get().turn(agent, ok, t0.elapsed());
    }
}
