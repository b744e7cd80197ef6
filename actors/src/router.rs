//! The router actor: every frame between agents passes through here. Its handler is O(1) per
//! frame and never awaits an agent: socket I/O happens in per-connection tasks, SQLite in the
//! store actor, process control in the supervisor. It owns the in-memory view of every mailbox
//! (the durable copy is in SQLite) and hands each agent one turn at a time.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flock_config::{AgentSpec, SwarmSpec};
use flock_ipc::id::{derive_id, fmt_id, new_id};
use flock_ipc::{
    Body, ChainEnd, ChainOutcome, ControlReply, ControlRequest, Delivery, DeliveryKind, ErrorCode,
    Frame, Hello, MsgId, OPERATOR, Outbox, PROTOCOL_VERSION, PeerCred, ROUTER, SendMode, Welcome,
};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::chains::{self, ChainTag, Chains, Route, StopKind, clip};
use crate::channels::{Caller, ChannelsMsg, ToolReply};
use crate::gateway::GatewayMsg;
use crate::journal::{JournalEvent, JournalWriter, Status};
use crate::store::{NewMessage, WriteOp, WriteOutcome};
use crate::store_actor::{Origin, StoreMsg, StoredOutcome};

mod bridge;
mod permit;

pub use bridge::BridgeInfo;
pub use permit::{PermissionEffects, PermissionReply};

/// Index under which a turn's routed answer is derived from its input's id (a replayed turn
/// re-derives the same id, so the durable mailbox drops the duplicate).
const RESULT_INDEX: u32 = u32::MAX - 16;
/// The identity of the operator (`flockctl`) as a chain participant: answers go to their DM.
pub const OPERATOR_HUMAN: &str = "human:operator";

pub type ConnId = u64;

/// The connection of a write nobody waits to hear about (a routed result).
const NO_CONN: ConnId = u64::MAX;

/// Which socket a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    Agent,
    Control,
    /// A chat bridge (it came in on the agents' socket with `BridgeHello`).
    Bridge,
}

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
}

pub type EventSink = Arc<dyn Fn(RouterEvent) + Send + Sync>;
pub type ControlSink = Arc<dyn Fn(ControlCall) + Send + Sync>;

/// Routing facts about one agent, for `flockctl ps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteInfo {
    pub name: String,
    pub connected: bool,
    pub busy: bool,
    pub mailbox_depth: u64,
    pub turns_total: u64,
}

/// Router-wide counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouterCounters {
    pub routed: u64,
    pub dropped: u64,
    pub late_replies: u64,
    pub connections: u64,
    /// Chains of turns in flight now, and those stopped by a budget since the start.
    pub chains_live: u64,
    pub chains_stopped: u64,
}

/// Writes committed by the store, handed back so the router can answer and deliver.
#[derive(Debug, Default)]
pub struct StoredBatch {
    pub items: Vec<(WriteOp, Option<Origin>, StoredOutcome)>,
}

pub enum RouterMsg {
    /// A new connection and its first frame (the handshake).
    Open {
        conn: ConnId,
        kind: ConnKind,
        first: Frame,
        outbox: Outbox,
        closer: oneshot::Sender<()>,
        peer: PeerCred,
        /// The process the supervisor started that the opener descends from (or is), read by
        /// the accept loop: an agent's Hello must come from its own spawn's tree.
        root: Option<u32>,
    },
    /// Frames read from a connection. The permit bounds how many frames a connection can have
    /// waiting in this mailbox; it is released when the batch has been handled.
    Frames { conn: ConnId, frames: Vec<Frame>, permit: Option<OwnedSemaphorePermit> },
    /// The connection is gone (peer closed, or it sent something malformed).
    Closed { conn: ConnId },
    /// Writes the store has committed.
    Stored(StoredBatch),
    /// The earliest request deadline may have passed: time out what is due, re-arm for the next.
    CheckDeadlines,
    /// Persist the turn counts accumulated since the last flush (sent to itself every second).
    FlushTurns,
    /// Retry handing work to an agent whose outbox was full.
    RetryDeliver(String),
    /// The supervisor is about to spawn `agent` with this token; only it may say `Hello`.
    Expect { agent: String, token: String },
    /// The supervisor spawned `agent` as `pid`: only a process of that tree may be `agent`
    /// (a connection from elsewhere that said Hello with the token is closed).
    Spawned { agent: String, pid: u32 },
    /// The supervisor is stopping `agent` on purpose: tell it to shut down; losing its current
    /// delivery does not count as a failed delivery.
    Stop { agent: String },
    /// Refuse new sends: the swarm is shutting down.
    Drain,
    /// Hand a channel notification to `agent` as a turn input (from the channels actor); the
    /// channels actor hears back through `ChannelsMsg::DeltaDone`. `chain`: the chain of the
    /// newest post it covers and that post's hop (a person's post starts a new chain).
    Delta {
        agent: String,
        channel: String,
        upto: u64,
        text: String,
        chain: Option<(ChainTag, u32)>,
    },
    /// Model tokens a chain's turn used (from the gateway).
    Tokens { chain: MsgId, tokens: u64 },
    /// The channels actor posted (or found already posted) a chain's answer to a person.
    Answered(AnswerPosted),
    /// A person's post was handed to the agent that answers it (stored with the post): queue
    /// it, as the first hop of its chain.
    Asked(crate::channels::store::Ask),
    /// Tell `agent` that `channel` was archived, so it closes that session.
    SessionClosed { agent: String, channel: String },
    /// An agent created at run time (`flock_create_agent`): route to it from now on.
    AddAgent { spec: AgentSpec, liveness: Arc<AtomicU64> },
    /// A decommissioned agent: nothing is routed to it any more (its stored history stays).
    RemoveAgent { name: String },
    /// Routing facts for `flockctl ps`.
    Snapshot(RpcReplyPort<(Vec<RouteInfo>, RouterCounters)>),
    /// A person's permission tool through `flockctl` (`permission_list`, `permission_decide`).
    PermissionHuman {
        person: String,
        tool: String,
        arguments: String,
        reply: RpcReplyPort<(bool, String)>,
    },
    /// What a permission job did (from the store actor): journal it, deliver its messages.
    Permission(PermissionEffects),
    /// The supervisor is about to spawn chat bridge `bridge` with this token.
    ExpectBridge { bridge: String, token: String },
    /// The supervisor is stopping chat bridge `bridge`: tell it to shut down.
    StopBridge { bridge: String },
    /// What every chat bridge reports, for `flockctl ps` and `flockctl bridge ls`.
    Bridges(RpcReplyPort<Vec<BridgeInfo>>),
}

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
}

/// What the channels actor reports after posting a chain's answer.
#[derive(Debug)]
pub struct AnswerPosted {
    pub chain: MsgId,
    /// The answering agent and the person.
    pub agent: String,
    pub human: String,
    pub text: String,
    /// The durable message whose turn gave the answer: completed only now that the answer is
    /// stored (`None` for a stop notice).
    pub msg: Option<MsgId>,
    /// (channel, seq, whether an answer to this chain was already there), or why it failed.
    pub outcome: Result<(String, u64, bool), String>,
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
    /// For deltas: the channel and the seq the delta covers up to.
    channel: Option<(String, u64)>,
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
    in_flight: Option<Queued>,
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
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The instance key of every agent in this version (one instance per declared agent).
pub const DEFAULT_INSTANCE: &str = "default";

/// `agent@instance` of an address (`name` is the default instance).
fn chain_entry(address: &str) -> String {
    if address.contains('@') { address.to_owned() } else { format!("{address}@{DEFAULT_INSTANCE}") }
}

/// The address a `Hello` claims: `agent`, or `agent@instance` for a spawned instance.
fn hello_key(hello: &Hello) -> String {
    if hello.instance.is_empty() || hello.instance == DEFAULT_INSTANCE {
        hello.agent_id.clone()
    } else {
        format!("{}@{}", hello.agent_id, hello.instance)
    }
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
            RouterMsg::Open { conn, kind, first, outbox, closer, peer, root } => {
                state.open(&myself, conn, kind, first, outbox, closer, peer, root);
            }
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
                let now = unix_ms();
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
                let caller = crate::permissions::Caller { id: person, role: None };
                let reply = PermissionReply::Human(reply);
                state.permission_call(&myself, caller, tool, arguments, new_id(), reply);
            }
            RouterMsg::Permission(effects) => state.permission_effects(&myself, effects),
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
            RouterMsg::Delta { agent, channel, upto, text, chain } => {
                state.delta(&myself, agent, channel, upto, text, chain);
            }
            RouterMsg::SessionClosed { agent, channel } => {
                if let Some(conn) = state.slots.get(&agent).and_then(|s| s.conn) {
                    let frame = Frame::new(ROUTER, &agent, Body::SessionClosed { channel });
                    state.answer(conn, frame);
                }
            }
            RouterMsg::AddAgent { spec, liveness } => {
                if !state.slots.contains_key(&spec.key()) {
                    let name = spec.key();
                    state.slots.insert(name.clone(), Slot::new(spec, liveness, 0)?);
                    state.order.push(name);
                }
            }
            RouterMsg::RemoveAgent { name } => {
                state.order.retain(|n| n != &name);
                if let Some(slot) = state.slots.remove(&name) {
                    for q in slot.queue.iter().chain(slot.in_flight.iter()) {
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
                        // Its mail stays in the store; the chains no longer wait for it.
                        state.leave(q.chain());
                    }
                }
            }
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
                        mailbox_depth: s.queue.len() as u64 + u64::from(s.in_flight.is_some()),
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
    #[allow(clippy::too_many_arguments)]
    fn open(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        conn: ConnId,
        kind: ConnKind,
        first: Frame,
        outbox: Outbox,
        closer: oneshot::Sender<()>,
        peer: PeerCred,
        root: Option<u32>,
    ) {
        let reject = |code: ErrorCode, reason: String| {
            // Dropping `closer` and `outbox` here makes the connection task write this frame
            // and close; the router keeps serving everyone else.
            let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Reject { code, reason }));
        };
        match (kind, &first.body) {
            (ConnKind::Agent, Body::Hello(hello)) => {
                if self.token_reused(hello, &peer) {
                    return reject(
                        ErrorCode::Forbidden,
                        "this spawn's token was already used: both connections are closed and the agent is restarted with a new one".into(),
                    );
                }
                if let Err((code, reason)) = self.check_hello(hello, root) {
                    tracing::warn!(
                        agent = %hello.agent_id,
                        pid = ?peer.pid,
                        reason = %reason,
                        "flock router: rejected Hello from pid {:?} as `{}`",
                        peer.pid,
                        hello.agent_id
                    );
                    return reject(code, reason);
                }
                let name = hello_key(hello);
                // A connection of an earlier incarnation that has not closed yet is superseded:
                // close it first, so its in-flight delivery goes back to the mailbox.
                if let Some(old) = self.slots.get(&name).and_then(|s| s.conn) {
                    self.closed(old);
                }
                let Some(slot) = self.slots.get_mut(&name) else { return };
                slot.used_token = slot.expected_token.take();
                slot.conn = Some(conn);
                slot.conn_root = root;
                slot.last_seen.store(unix_ms(), Ordering::Relaxed);
                let welcome = Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    swarm: self.spec.name.clone(),
                    agent_spec_json: slot.spec_json.clone(),
                    heartbeat_interval_ms: self.spec.supervision.heartbeat_interval_ms,
                    max_frame_bytes: self.spec.delivery.max_frame_bytes,
                };
                let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Welcome(welcome)));
                self.conns.insert(
                    conn,
                    ConnInfo { identity: name.clone(), kind, outbox, _closer: closer },
                );
                self.counters.connections += 1;
                // The pid the connection comes from, not the one the Hello claims (a caged agent
                // is PID 1 of its own namespace).
                let pid = peer.pid.map_or(hello.pid, |p| p as u32);
                (self.events)(RouterEvent::Ready { agent: name.clone(), pid });
                if let Some(ch) = &self.channels {
                    let _ = ch.cast(ChannelsMsg::AgentReady { agent: name.clone() });
                }
                self.deliver_next(myself, &name);
            }
            (ConnKind::Agent, Body::BridgeHello(hello)) => {
                self.open_bridge(conn, &first, hello, outbox, closer);
            }
            (ConnKind::Control, Body::ClientHello { protocol_version, key, .. }) => {
                if *protocol_version != PROTOCOL_VERSION {
                    return reject(
                        ErrorCode::BadRequest,
                        format!(
                            "protocol version {protocol_version} is not supported (this supervisor speaks {PROTOCOL_VERSION}); use the flockctl that came with it"
                        ),
                    );
                }
                if let Some(want) = &self.operator_key
                    && !constant_time_eq(want.as_bytes(), key.as_bytes())
                {
                    let what = if key.is_empty() { "no" } else { "a wrong" };
                    return reject(
                        ErrorCode::Forbidden,
                        format!(
                            "this connection presented {what} operator key: the control socket serves the operator, who can read `{}` beside it (run as the user who started the swarm, with the same --state-dir)",
                            flock_ipc::operator::KEY_FILE
                        ),
                    );
                }
                let welcome = Welcome {
                    protocol_version: PROTOCOL_VERSION,
                    swarm: self.spec.name.clone(),
                    agent_spec_json: String::new(),
                    heartbeat_interval_ms: self.spec.supervision.heartbeat_interval_ms,
                    max_frame_bytes: self.spec.delivery.max_frame_bytes,
                };
                let _ = outbox.try_send(Frame::answer(&first, ROUTER, Body::Welcome(welcome)));
                self.conns.insert(
                    conn,
                    ConnInfo { identity: OPERATOR.into(), kind, outbox, _closer: closer },
                );
                self.counters.connections += 1;
            }
            (_, body) => reject(
                ErrorCode::BadRequest,
                format!("the first frame must be a handshake, got {}", body.kind()),
            ),
        }
    }

    /// Whether `hello` presents the token an earlier Hello already used. A spawn's token is
    /// single-use and the agent never says Hello twice (it exits when its connection closes), so
    /// two processes had it: one read it where it should not have. The connection that used it
    /// first is closed too — it may be the impostor — and the event is journaled; the agent,
    /// refused, exits and is restarted with a fresh token.
    fn token_reused(&mut self, hello: &Hello, peer: &PeerCred) -> bool {
        let key = hello_key(hello);
        let Some(slot) = self.slots.get_mut(&key) else { return false };
        let reused = slot
            .used_token
            .as_ref()
            .is_some_and(|t| constant_time_eq(t.as_bytes(), hello.token.as_bytes()));
        if !reused {
            return false;
        }
        slot.used_token = None;
        let first = slot.conn;
        let message = format!(
            "a second Hello as `{key}` (pid {:?}) presented the token its spawn had already used; both connections are closed",
            peer.pid
        );
        tracing::warn!(agent = %key, pid = ?peer.pid, "flock router: {message}");
        if let Some(j) = &self.journal {
            j.log(
                JournalEvent::new(&key, "TOKEN_REUSED", Status::Failed, message)
                    .param("pid", peer.pid.unwrap_or(0)),
            );
        }
        if let Some(old) = first {
            self.closed(old);
        }
        true
    }

    /// `agent`'s spawn is process `pid`: a connection that said Hello as `agent` from outside
    /// that process's tree (it came in between the token's issue and the spawn's return) is
    /// closed; its in-flight delivery goes back to the mailbox.
    fn spawned(&mut self, agent: &str, pid: u32) {
        let Some(slot) = self.slots.get_mut(agent) else { return };
        slot.spawned_pid = Some(pid);
        // A Hello took this spawn's token (an earlier spawn's connection that has not closed
        // yet is left to be superseded as usual).
        let hello_since_expect = slot.expected_token.is_none();
        if let Some(conn) = slot.conn
            && hello_since_expect
            && slot.conn_root != Some(pid)
        {
            tracing::warn!(
                agent,
                pid,
                from = ?slot.conn_root,
                "flock router: `{agent}` said Hello from outside the process the supervisor started for it (pid {pid}); closing that connection"
            );
            self.closed(conn);
        }
    }

    fn check_hello(&self, hello: &Hello, root: Option<u32>) -> Result<(), (ErrorCode, String)> {
        if hello.protocol_version != PROTOCOL_VERSION {
            return Err((
                ErrorCode::BadRequest,
                format!(
                    "protocol version {} is not supported (expected {PROTOCOL_VERSION})",
                    hello.protocol_version
                ),
            ));
        }
        let key = hello_key(hello);
        let Some(slot) = self.slots.get(&key) else {
            return Err((ErrorCode::AgentNotFound, format!("no agent `{key}` in this swarm")));
        };
        if let Some(pid) = slot.spawned_pid
            && root != Some(pid)
        {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "this Hello does not come from the process the supervisor started for `{key}` (pid {pid}) or one of its children"
                ),
            ));
        }
        match &slot.expected_token {
            Some(t) if constant_time_eq(t.as_bytes(), hello.token.as_bytes()) => Ok(()),
            _ => Err((
                ErrorCode::Forbidden,
                "wrong or expired token: agents are started by the supervisor, which hands each spawn its own token".into(),
            )),
        }
    }

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
            Body::ToolCall { name, arguments }
                if kind == ConnKind::Agent && crate::channels::is_channel_tool(name) =>
            {
                // An agent connection always has a role; one without a slot (decommissioned,
                // still shutting down) has no powers at all — never a human's.
                let Some(role) = self.slots.get(identity).map(|s| s.spec.role) else {
                    let msg = format!("`{identity}` is no longer an agent of this swarm");
                    return self.answer(conn, Frame::error(&frame, ErrorCode::Forbidden, msg));
                };
                let outbox = self.conns.get(&conn).map(|i| i.outbox.clone());
                match (&self.channels, outbox) {
                    (Some(ch), Some(outbox)) => {
                        // Posts carry the poster's chain on to the deltas they cause, so a
                        // conversation between agents in a channel is one budgeted chain.
                        let chain = self.current_chain(identity);
                        let answers = self
                            .slots
                            .get(identity)
                            .and_then(|s| s.in_flight.as_ref())
                            .is_some_and(|q| !q.delegated && q.route.answers_a_person());
                        let msg = ChannelsMsg::Tool {
                            caller: Caller { id: identity.to_owned(), role: Some(role) },
                            name: name.clone(),
                            arguments: arguments.clone(),
                            chain,
                            answers,
                            reply: ToolReply {
                                outbox,
                                frame_id: frame.id,
                                to: identity.to_owned(),
                            },
                        };
                        if ch.cast(msg).is_err() {
                            let err = Frame::error(
                                &frame,
                                ErrorCode::Internal,
                                "channels are not running",
                            );
                            self.answer(conn, err);
                        }
                    }
                    _ => {
                        let err =
                            Frame::error(&frame, ErrorCode::Internal, "channels are not running");
                        self.answer(conn, err);
                    }
                }
            }
            Body::ToolCall { name, arguments }
                if kind == ConnKind::Agent && crate::permissions::is_permission_tool(name) =>
            {
                let Some(role) = self.slots.get(identity).map(|s| s.spec.role) else {
                    let msg = format!("`{identity}` is no longer an agent of this swarm");
                    return self.answer(conn, Frame::error(&frame, ErrorCode::Forbidden, msg));
                };
                let Some(outbox) = self.conns.get(&conn).map(|i| i.outbox.clone()) else {
                    return;
                };
                let caller =
                    crate::permissions::Caller { id: identity.to_owned(), role: Some(role) };
                let reply =
                    PermissionReply::Agent { outbox, frame_id: frame.id, to: identity.to_owned() };
                // The call's id is the key: a replayed turn re-sends the same one.
                let (tool, args) = (name.clone(), arguments.clone());
                self.permission_call(myself, caller, tool, args, frame.id, reply);
            }
            Body::ToolCall { name, arguments }
                if kind == ConnKind::Agent && crate::memory::is_memory_tool(name) =>
            {
                let allowed = self
                    .slots
                    .get(identity)
                    .is_some_and(|s| name.contains("__") || s.spec.role.may_use(name));
                let (Some(memory), Some(outbox), true) =
                    (&self.memory, self.conns.get(&conn).map(|i| i.outbox.clone()), allowed)
                else {
                    let msg = if allowed {
                        "this swarm keeps no memory index".to_owned()
                    } else {
                        format!("`{identity}` may not use {name}")
                    };
                    let code = if allowed { ErrorCode::Internal } else { ErrorCode::Forbidden };
                    return self.answer(conn, Frame::error(&frame, code, msg));
                };
                let (id, to) = (frame.id, identity.to_owned());
                memory.call(
                    name,
                    arguments,
                    Box::new(move |result| {
                        let (ok, content) = match result {
                            Ok(c) => (true, c),
                            Err(e) => (false, e),
                        };
                        let answer = Frame {
                            correlation_id: Some(id),
                            ..Frame::new(ROUTER, to, Body::ToolResult { ok, content })
                        };
                        let _ = outbox.blocking_send(answer);
                    }),
                );
            }
            // The agent's own slice of the journal (`journal_context`), read off the router.
            Body::ToolCall { name, arguments }
                if kind == ConnKind::Agent && name == "journal__recent" =>
            {
                let n = serde_json::from_str::<serde_json::Value>(arguments)
                    .ok()
                    .and_then(|a| a["last"].as_u64())
                    .map_or(10, |n| n.clamp(1, 200) as usize);
                let (Some(journal), Some(outbox)) =
                    (&self.journal, self.conns.get(&conn).map(|i| i.outbox.clone()))
                else {
                    let ok = Body::ToolResult { ok: true, content: String::new() };
                    return self.answer(conn, Frame::answer(&frame, ROUTER, ok));
                };
                let (id, to) = (frame.id, identity.to_owned());
                journal.recent_for(identity, n, move |content| {
                    let answer = Frame {
                        correlation_id: Some(id),
                        ..Frame::new(ROUTER, to, Body::ToolResult { ok: true, content })
                    };
                    let _ = outbox.blocking_send(answer);
                });
            }
            Body::ToolCall { name, arguments } if kind == ConnKind::Agent => {
                let result = self.router_tool(identity, name, arguments);
                let (ok, content) = match result {
                    Ok(c) => (true, c),
                    Err(e) => (false, e),
                };
                self.answer(conn, Frame::answer(&frame, ROUTER, Body::ToolResult { ok, content }));
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
                match self.chains.map.get_mut(chain) {
                    Some(c) => c.watchers.push((conn, frame.id)),
                    None => {
                        let msg = format!(
                            "no chain {} in flight (it may have ended already; see `flockctl journal query corr={}`)",
                            fmt_id(*chain),
                            fmt_id(*chain)
                        );
                        self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
                    }
                }
            }
            Body::Control(ControlRequest::Chains) if kind == ConnKind::Control => {
                let now = unix_ms();
                let budget = &self.spec.budget;
                let mut rows: Vec<_> =
                    self.chains.map.values().map(|c| c.row(budget, now)).collect();
                rows.sort_by_key(|r| std::cmp::Reverse(r.age_ms));
                let reply = Body::ControlReply(ControlReply::Chains(rows));
                self.answer(conn, Frame::answer(&frame, ROUTER, reply));
            }
            Body::Control(request) if kind == ConnKind::Control => {
                if let Some(info) = self.conns.get(&conn) {
                    (self.control)(ControlCall {
                        request: request.clone(),
                        frame_id: frame.id,
                        outbox: info.outbox.clone(),
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
        if !self.slots.contains_key(target) {
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

    fn send(&mut self, myself: &ActorRef<RouterMsg>, conn: ConnId, frame: Frame) {
        let Body::Send { mode, text } = &frame.body else { return };
        if let Err((code, msg)) = self.check_target(&frame.from, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        if *mode == SendMode::AtMostOnce {
            return self.route_at_most_once(conn, frame);
        }
        // A person's message waits for an answer; an agent's send during a turn joins that
        // turn's chain (nobody waits for its answer: delegation is `Delegate`), unless it is the
        // runtime's upkeep, which starts its own.
        let mut route = if *mode == SendMode::Upkeep {
            Route::root(frame.id, &frame.from, &frame.to, text, unix_ms(), None)
        } else if frame.from == OPERATOR {
            Route::root(
                frame.id,
                OPERATOR_HUMAN,
                &frame.to,
                text,
                unix_ms(),
                Some(OPERATOR_HUMAN.to_owned()),
            )
        } else {
            self.child_route(&frame.from, frame.id, &frame.to, text, Vec::new())
        };
        if let Err(msg) = self.admit(&mut route, "SEND", &frame.from, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        self.enqueue(myself, frame.id, frame.from, frame.to, text.clone(), &route, Some(conn));
    }

    /// Hands the caller's current input over to `frame.to`: the callee's answer comes back as a
    /// `Result` input of the caller, whose own turn gives no answer.
    fn delegate(&mut self, myself: &ActorRef<RouterMsg>, conn: ConnId, agent: &str, frame: Frame) {
        let Body::Delegate { text } = &frame.body else { return };
        if let Err((code, msg)) = self.check_target(agent, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        let current = self.slots.get(agent).and_then(|s| s.in_flight.as_ref());
        let refusal = match current {
            None => Some("delegation belongs to a turn: this agent is not working on an input"),
            Some(q) if q.route.answer_to().is_none() => Some(
                "nobody waits for an answer to this input, so there is nothing to delegate; use agents__send",
            ),
            Some(q) if q.kind == DeliveryKind::Result => Some(
                "this input is a delegated agent's result: answer it yourself, it cannot be delegated again",
            ),
            Some(q) if q.kind != DeliveryKind::Message => {
                Some("only a message can be delegated (a request's caller waits for this agent)")
            }
            Some(q) if q.delegated => Some("this turn has already delegated its input"),
            Some(_) => None,
        };
        if let Some(msg) = refusal {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
        }
        let Some(q) = current else { return };
        let mut path = q.route.answer_path.clone();
        path.push(agent.to_owned());
        let mut route = self.child_route(agent, frame.id, &frame.to, text, path);
        if let Err(msg) = self.admit(&mut route, "DELEGATE", agent, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        if let Some(q) = self.slots.get_mut(agent).and_then(|s| s.in_flight.as_mut()) {
            q.delegated = true;
        }
        self.enqueue(
            myself,
            frame.id,
            agent.to_owned(),
            frame.to,
            text.clone(),
            &route,
            Some(conn),
        );
    }

    /// Puts a durable message in its target's SQLite mailbox; it is queued for the target (and
    /// `Accepted` answered on `conn`, if any) once the store has committed it.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        id: MsgId,
        sender: String,
        target: String,
        text: String,
        route: &Route,
        conn: Option<ConnId>,
    ) {
        // Hot path: no event unless `RUST_LOG` asks for trace (the fields are not even formatted).
        tracing::trace!(msg_id = %fmt_id(id), from = %sender, to = %target, chain = %fmt_id(route.chain.id), "enqueue");
        let msg = NewMessage { id, sender, target, text, route: route.store(id) };
        let write = StoreMsg::Write {
            op: WriteOp::Enqueue(msg),
            origin: Some(Origin { conn: conn.unwrap_or(NO_CONN), frame: id }),
            notify: Some(myself.clone()),
        };
        if let Err(e) = self.store.cast(write) {
            tracing::error!(msg_id = %fmt_id(id), error = %e, "flock router: the store is not running");
            self.leave(route.chain.id);
            if let Some(conn) = conn {
                let err = Frame {
                    correlation_id: Some(id),
                    ..Frame::new(
                        ROUTER,
                        "",
                        Body::Error {
                            code: ErrorCode::Internal,
                            message: "the store is not running".into(),
                        },
                    )
                };
                self.answer(conn, err);
            }
        }
    }

    /// The raw path: straight into the target's outbox, no store, no queue. Moves the text.
    fn route_at_most_once(&mut self, conn: ConnId, frame: Frame) {
        let Frame { id, from, to, deadline_ms, body: Body::Send { text, .. }, .. } = frame else {
            return;
        };
        let out = Frame {
            id,
            from: from.clone(),
            to,
            correlation_id: None,
            deadline_ms,
            body: Body::Deliver(Delivery {
                kind: DeliveryKind::Message,
                sender: from,
                text,
                attempt: 1,
                durable: false,
                call_chain: Vec::new(),
                channel: None,
                // The raw path is outside chain budgets (models cannot send at_most_once).
                answer_to: None,
                chain: None,
            }),
        };
        let target = self.slots.get(&out.to).and_then(|s| s.conn).and_then(|c| self.conns.get(&c));
        let result = match target {
            Some(info) => info.outbox.try_send(out).map_err(|e| e.into_inner()),
            None => Err(out),
        };
        match result {
            Ok(()) => self.counters.routed += 1,
            Err(out) => {
                self.counters.dropped += 1;
                let message = format!(
                    "`{}` is not connected or not keeping up; at_most_once messages are not queued",
                    out.to
                );
                let err = Frame {
                    correlation_id: Some(out.id),
                    ..Frame::new(
                        ROUTER,
                        out.from,
                        Body::Error { code: ErrorCode::TargetUnavailable, message },
                    )
                };
                self.answer(conn, err);
            }
        }
    }

    fn request(&mut self, myself: &ActorRef<RouterMsg>, conn: ConnId, frame: Frame) {
        let Body::Request { text, timeout_ms } = &frame.body else { return };
        if let Err((code, msg)) = self.check_target(&frame.from, &frame.to) {
            return self.answer(conn, Frame::error(&frame, code, msg));
        }
        // The call chain is the router's own record of who is serving whom, never the caller's.
        let mut calls = self
            .slots
            .get(&frame.from)
            .and_then(|s| s.in_flight.as_ref())
            .map(|q| q.call_chain.clone())
            .unwrap_or_default();
        if frame.from != OPERATOR {
            calls.push(chain_entry(&frame.from));
        }
        let callee = chain_entry(&frame.to);
        if calls.contains(&callee) {
            let msg =
                format!("calling {callee} would close a cycle: {} → {callee}", calls.join(" → "));
            return self.answer(conn, Frame::error(&frame, ErrorCode::CircularCall, msg));
        }
        // The caller waits for the reply itself: nobody else waits on the callee's turn.
        let mut route = if frame.from == OPERATOR {
            Route::root(frame.id, OPERATOR_HUMAN, &frame.to, text, unix_ms(), None)
        } else {
            self.child_route(&frame.from, frame.id, &frame.to, text, Vec::new())
        };
        if let Err(msg) = self.admit(&mut route, "REQUEST", &frame.from, &frame.to, text) {
            return self.answer(conn, Frame::error(&frame, ErrorCode::BudgetExceeded, msg));
        }
        let timeout_ms =
            if *timeout_ms == 0 { self.spec.delivery.request_timeout_ms } else { *timeout_ms };
        let deadline = unix_ms().saturating_add(timeout_ms);
        self.requests.insert(
            frame.id,
            PendingRequest {
                caller: frame.from.clone(),
                caller_conn: conn,
                target: frame.to.clone(),
                timeout_ms,
                deadline,
            },
        );
        let id = frame.id;
        self.deadlines.insert((deadline, id));
        self.arm_deadline(myself);
        let Some(slot) = self.slots.get_mut(&frame.to) else { return };
        let mut q = Queued::new(id, DeliveryKind::Request, frame.from.clone(), text.clone(), route);
        q.call_chain = calls;
        slot.queue.push_back(q);
        let to = frame.to.clone();
        self.deliver_next(myself, &to);
    }

    /// Hands the next queued input to `agent` if it is connected and idle.
    fn deliver_next(&mut self, myself: &ActorRef<RouterMsg>, agent: &str) {
        let mut dropped = Vec::new();
        if let Some(slot) = self.slots.get_mut(agent)
            && slot.in_flight.is_none()
            && !slot.stopping
            && let Some(info) = slot.conn.and_then(|c| self.conns.get(&c))
        {
            while let Some(q) = slot.queue.pop_front() {
                // Skipped lazily, to keep this O(1): a request whose caller already timed out,
                // and anything of a chain that was stopped.
                let stale = q.kind == DeliveryKind::Request && !self.requests.contains_key(&q.id);
                let stopped = self.chains.map.get(&q.chain()).is_some_and(|c| c.stopped.is_some());
                if stale || stopped {
                    dropped.push(q);
                    continue;
                }
                let frame = Frame {
                    id: q.id,
                    from: q.sender.clone(),
                    to: agent.to_owned(),
                    correlation_id: None,
                    deadline_ms: None,
                    body: Body::Deliver(Delivery {
                        kind: q.kind,
                        sender: q.sender.clone(),
                        text: q.text.clone(),
                        attempt: q.attempts + 1,
                        durable: q.durable(),
                        call_chain: q.call_chain.clone(),
                        channel: match &q.channel {
                            Some((c, _)) => Some(c.clone()),
                            None => q.route.conversation().map(str::to_owned),
                        },
                        answer_to: if q.delegated {
                            None
                        } else {
                            q.route.answer_to().map(str::to_owned)
                        },
                        chain: Some(q.chain()),
                    }),
                };
                match info.outbox.try_send(frame) {
                    Ok(()) => {
                        self.counters.routed += 1;
                        slot.in_flight = Some(q);
                        slot.delivered_at = Some(Instant::now());
                    }
                    Err(_) => {
                        slot.queue.push_front(q);
                        if !slot.retry_scheduled {
                            slot.retry_scheduled = true;
                            let name = agent.to_owned();
                            myself.send_after(Duration::from_millis(10), move || {
                                RouterMsg::RetryDeliver(name)
                            });
                        }
                    }
                }
                break;
            }
        }
        for q in dropped {
            self.discard(agent, q, "its chain of turns was stopped");
        }
    }

    /// Drops an input that will never run (stale request, stopped chain): a durable message is
    /// marked done in the store (not a dead letter, not a turn), a waiting caller is told.
    fn discard(&mut self, agent: &str, q: Queued, reason: &str) {
        match q.kind {
            DeliveryKind::Message | DeliveryKind::Result => {
                let op = WriteOp::Discard { id: q.id, reason: reason.to_owned() };
                let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            }
            DeliveryKind::Request if self.requests.contains_key(&q.id) => {
                let message = format!("`{agent}` will not answer: {reason}");
                self.reply(q.id, agent, Body::Error { code: ErrorCode::BudgetExceeded, message });
            }
            DeliveryKind::Request => {}
            // Handled, as a delta refused at admission is: its messages stay readable.
            DeliveryKind::Delta => self.delta_done(agent, &q, true),
        }
        self.leave(q.chain());
    }

    fn turn_finished(&mut self, myself: &ActorRef<RouterMsg>, agent: &str, frame: Frame) {
        let Some(id) = frame.correlation_id else { return };
        let Some(slot) = self.slots.get_mut(agent) else { return };
        let current = slot.in_flight.as_ref().is_some_and(|q| q.id == id);
        match frame.body {
            Body::Ack { reply } => {
                slot.turns_total += 1;
                if !current {
                    // An at_most_once delivery (not leased): only the turn is counted.
                    *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                    return;
                }
                let Some(done) = slot.in_flight.take() else { return };
                turn_ended(agent, slot, true);
                let reply = reply.unwrap_or_default();
                self.journal_turn(agent, &done, &reply);
                match done.kind {
                    DeliveryKind::Message | DeliveryKind::Result => {
                        // The completion and its turn count commit together: counted exactly
                        // once. An answer to a person completes the message only once it is
                        // posted, so a crash in between replays the turn, never loses the answer.
                        if !self.route_answer(myself, agent, &done, &reply) {
                            let op = WriteOp::Complete { id, agent: agent.into() };
                            let _ =
                                self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
                        }
                    }
                    // Not worth a commit per turn: counted in memory, flushed every second.
                    DeliveryKind::Request => {
                        *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                        self.reply(id, agent, Body::Reply { text: reply });
                    }
                    DeliveryKind::Delta => {
                        *self.unflushed_turns.entry(agent.to_owned()).or_default() += 1;
                        self.delta_done(agent, &done, true);
                    }
                }
                self.leave(done.chain());
            }
            Body::Nack { reason } => {
                if !current {
                    return;
                }
                let Some(failed) = slot.in_flight.take() else { return };
                turn_ended(agent, slot, false);
                let stopped =
                    self.chains.map.get(&failed.chain()).is_some_and(|c| c.stopped.is_some());
                match failed.kind {
                    // Whatever its kind, an input of a stopped chain is over (a waiting caller
                    // hears BUDGET_EXCEEDED, a delta counts as handled).
                    _ if stopped => self.discard(agent, failed, "its chain of turns was stopped"),
                    DeliveryKind::Request => {
                        let msg = format!("`{agent}` could not finish the request: {reason}");
                        self.reply(
                            id,
                            agent,
                            Body::Error { code: ErrorCode::Internal, message: msg },
                        );
                        self.leave(failed.chain());
                    }
                    DeliveryKind::Message | DeliveryKind::Result => {
                        self.failed_delivery(agent, failed, reason)
                    }
                    DeliveryKind::Delta => {
                        self.delta_done(agent, &failed, false);
                        self.leave(failed.chain());
                    }
                }
            }
            _ => return,
        }
        self.deliver_next(myself, agent);
    }

    /// Routes a finished turn's answer to whoever waits for it, once per input: a person gets it
    /// in their DM with `agent`, an agent that delegated gets it as a `Result` input. Returns
    /// whether the input's completion waits for the answer's post.
    fn route_answer(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: &str,
        done: &Queued,
        reply: &str,
    ) -> bool {
        if done.delegated {
            return false;
        }
        let Some(to) = done.route.answer_to().map(str::to_owned) else { return false };
        let text =
            if reply.trim().is_empty() { "(no answer)".to_owned() } else { reply.to_owned() };
        if to.starts_with("human:") {
            let place = done.route.chain.reply.clone();
            self.post_answer(agent, &to, text, done.chain(), Some(done.id), place);
            return true;
        }
        let mut path = done.route.answer_path.clone();
        path.pop();
        let mut route = Route {
            answer_path: path,
            result: true,
            chain: done.route.chain.clone(),
            hop: done.route.hop + 1,
            parent: Some(done.id),
        };
        // A stopped chain's person has been told already; the result goes nowhere.
        if self.admit(&mut route, "RESULT", agent, &to, &text).is_ok() {
            let id = derive_id(done.id, RESULT_INDEX);
            self.enqueue(myself, id, agent.to_owned(), to, text, &route, None);
        }
        false
    }

    /// Asks the channels actor to post a chain's answer (or stop notice) where `human` asked
    /// (`place`, as a reply), or in the DM of `agent` and `human`; it answers with
    /// [`RouterMsg::Answered`]. `msg` is completed after the post.
    fn post_answer(
        &mut self,
        agent: &str,
        human: &str,
        text: String,
        chain: MsgId,
        msg: Option<MsgId>,
        place: Option<chains::ReplyPlace>,
    ) {
        let posted = match &self.channels {
            Some(ch) => {
                let ask = ChannelsMsg::Answer {
                    agent: agent.to_owned(),
                    human: human.to_owned(),
                    text,
                    chain,
                    msg,
                    place,
                };
                ch.cast(ask).is_ok()
            }
            None => false,
        };
        if posted {
            if let Some(c) = self.chains.map.get_mut(&chain) {
                c.live += 1;
            }
        } else {
            tracing::error!(
                agent,
                human,
                chain = %fmt_id(chain),
                "flock router: no channels actor: the answer of {agent} to {human} cannot be posted"
            );
            if let Some(id) = msg {
                let op = WriteOp::Complete { id, agent: agent.into() };
                let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            }
        }
    }

    /// The channels actor stored a chain's answer: complete the input it answers, tell the
    /// watchers.
    fn answered(&mut self, p: AnswerPosted) {
        if let Some(id) = p.msg {
            let op = WriteOp::Complete { id, agent: p.agent.clone() };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        }
        match &p.outcome {
            Ok((channel, seq, duplicate)) => {
                let action = if *duplicate { "ANSWER_DUPLICATE" } else { "ANSWER" };
                let message = if *duplicate {
                    format!(
                        "#{channel} already holds this chain's answer (seq {seq}); not posted again"
                    )
                } else {
                    format!("#{channel} seq {seq}: {}", quote(&p.text))
                };
                self.journal_chain(
                    p.chain,
                    None,
                    &p.agent,
                    action,
                    Status::Success,
                    message,
                    |e| {
                        e.param("to", p.human.clone())
                            .param("channel", channel.clone())
                            .param("seq", *seq)
                    },
                );
                let stopped = match self.chains.map.get_mut(&p.chain) {
                    Some(c) => {
                        c.answered = true;
                        c.stopped.is_some()
                    }
                    None => false,
                };
                self.sync_working(p.chain);
                if !*duplicate {
                    let outcome =
                        if stopped { ChainOutcome::Stopped } else { ChainOutcome::Answered };
                    self.end_watchers(p.chain, outcome, &p.text, &p.agent, channel, *seq);
                }
            }
            Err(e) => {
                tracing::warn!(
                    agent = %p.agent,
                    human = %p.human,
                    chain = %fmt_id(p.chain),
                    error = %e,
                    "flock router: the answer of {} to {} was not posted",
                    p.agent,
                    p.human
                );
                self.journal_chain(
                    p.chain,
                    None,
                    &p.agent,
                    "ANSWER",
                    Status::Failed,
                    e.clone(),
                    |e| e.param("to", p.human.clone()),
                );
            }
        }
        self.leave(p.chain);
    }

    /// Tells every `flockctl send --wait` of a chain how it ended.
    fn end_watchers(
        &mut self,
        chain: MsgId,
        outcome: ChainOutcome,
        text: &str,
        by: &str,
        channel: &str,
        seq: u64,
    ) {
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        let watchers = std::mem::take(&mut c.watchers);
        let end = ChainEnd {
            chain,
            outcome,
            text: text.to_owned(),
            by: by.to_owned(),
            channel: channel.to_owned(),
            seq,
            hops: c.hops,
            tokens: c.tokens,
            elapsed_ms: unix_ms().saturating_sub(c.tag.started_ms),
        };
        for (conn, frame_id) in watchers {
            let frame = Frame {
                correlation_id: Some(frame_id),
                ..Frame::new(ROUTER, OPERATOR, Body::ChainEnded(end.clone()))
            };
            self.answer(conn, frame);
        }
    }

    /// The route of a message `sender` sends now: in the chain of the input it is working on,
    /// or the root of a new chain when it works on none (a timer, a program's own send).
    fn child_route(
        &self,
        sender: &str,
        id: MsgId,
        to: &str,
        text: &str,
        answer_path: Vec<String>,
    ) -> Route {
        match self.slots.get(sender).and_then(|s| s.in_flight.as_ref()) {
            Some(q) => Route {
                answer_path,
                result: false,
                chain: q.route.chain.clone(),
                hop: q.route.hop + 1,
                parent: Some(q.id),
            },
            None => {
                let mut r = Route::root(id, sender, to, text, unix_ms(), None);
                r.answer_path = answer_path;
                r
            }
        }
    }

    /// The chain `agent` is working in, and its hops so far.
    fn current_chain(&self, agent: &str) -> Option<(ChainTag, u32)> {
        let q = self.slots.get(agent)?.in_flight.as_ref()?;
        let hops = self.chains.map.get(&q.chain()).map_or(q.route.hop, |c| c.hops);
        Some((q.route.chain.clone(), hops))
    }

    /// Charges one more hop to `route`'s chain (creating the chain for a root), or refuses it:
    /// a stopped chain takes nothing, and a hop past the budget stops the chain. Sets the hop.
    fn admit(
        &mut self,
        route: &mut Route,
        action: &str,
        from: &str,
        to: &str,
        text: &str,
    ) -> Result<(), String> {
        let budget = self.spec.budget.clone();
        let now = unix_ms();
        let from = if from == OPERATOR { OPERATOR_HUMAN } else { from };
        if !self.chains.map.contains_key(&route.chain.id) {
            let root = route.parent.is_none() && route.hop <= 1;
            if root && route.answer_path.is_empty() {
                // A root nobody waits on costs nothing until it sets something off (a program's
                // message to a sink never does): its chain is made by its first follow-up.
                route.hop = 1;
                return Ok(());
            }
            // A follow-up of such a root counts its parent's turn, which is in flight.
            self.materialize(&route.chain, route.hop, u32::from(route.parent.is_some()));
        }
        let Some(chain) = self.chains.map.get_mut(&route.chain.id) else {
            return Err("internal: the chain vanished".into());
        };
        if let Some(reason) = &chain.stopped {
            return Err(format!("this chain of turns was stopped: {reason}"));
        }
        let over = chain.refuses_next_hop(&budget, now);
        if let Some(kind) = over {
            let id = route.chain.id;
            self.stop_chain(id, kind);
            return Err(format!(
                "this chain of turns was stopped: {}",
                chains::describe_stop(kind, &budget)
            ));
        }
        chain.hops += 1;
        chain.live += 1;
        route.hop = chain.hops;
        let verb = match action {
            "SEND" => "sent to",
            "REQUEST" => "asked",
            "DELEGATE" => "delegated to",
            "RESULT" => "answered",
            "DELTA" => "notified",
            _ => "→",
        };
        chain.note(format!("{from} {verb} {to}"));
        let (id, parent, hop) = (route.chain.id, route.parent, route.hop);
        self.journal_chain(
            id,
            parent,
            from,
            action,
            Status::Success,
            format!("{from} {verb} {to} (hop {hop}): {}", quote(text)),
            |e| e.param("to", to.to_owned()).param("hop", hop),
        );
        Ok(())
    }

    /// Starts keeping chain `tag` (whose next hop is `hop`) with `live` deliveries already in
    /// progress; a chain made after its first hop journals that hop now.
    fn materialize(&mut self, tag: &ChainTag, hop: u32, live: u32) {
        if self.chains.map.contains_key(&tag.id) {
            return;
        }
        // A chain that ended a moment ago and is set off again (a delta handed out after its
        // coalescing delay): it goes on, its root already told.
        if self.chains.revive(tag) {
            let chain = self.chains.entry(tag, hop);
            chain.live = live;
            return;
        }
        let chain = self.chains.entry(tag, hop);
        chain.live = live;
        let late_root = chain.hops >= 1;
        if late_root {
            chain.note(format!("{} sent to {}", tag.origin, tag.entry));
            let message =
                format!("{} sent to {} (hop 1): {}", tag.origin, tag.entry, quote(&tag.text));
            self.journal_chain(tag.id, None, &tag.origin, "SEND", Status::Success, message, |e| {
                e.param("to", tag.entry.clone()).param("hop", 1)
            });
        }
    }

    /// One of the chain's deliveries (or a pending answer) is over; the chain ends at none.
    fn leave(&mut self, chain: MsgId) {
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        c.live = c.live.saturating_sub(1);
        if c.live > 0 {
            return;
        }
        if !c.watchers.is_empty() {
            let by = c.tag.entry.clone();
            let text = match &c.stopped {
                Some(r) => format!("[stopped] {r}"),
                None => "(the chain ended without an answer for you)".to_owned(),
            };
            let outcome =
                if c.stopped.is_some() { ChainOutcome::Stopped } else { ChainOutcome::Ended };
            self.end_watchers(chain, outcome, &text, &by, "", 0);
        }
        self.chains.end(chain);
        self.sync_working(chain);
    }

    /// Tells the channels actor whether `chain` is working on a person's post now (running,
    /// not answered, not stopped), when that changed: the bridges show it as typing.
    fn sync_working(&mut self, chain: MsgId) {
        let now = self
            .chains
            .map
            .get(&chain)
            .filter(|c| c.stopped.is_none() && !c.answered && c.live > 0)
            .and_then(|c| c.tag.reply.clone());
        let before = match &now {
            Some(p) => self.working.insert(chain, p.clone()),
            None => self.working.remove(&chain),
        };
        let change = match (before, now) {
            (None, Some(p)) => Some((p, true)),
            (Some(p), None) => Some((p, false)),
            _ => None,
        };
        if let (Some((p, on)), Some(ch)) = (change, &self.channels) {
            let _ = ch.cast(ChannelsMsg::Working { channel: p.channel, seq: p.seq, on });
        }
    }

    /// A person's post that an agent must answer: the message is stored already (with the
    /// post); it starts its chain here and waits in the agent's queue.
    fn asked(&mut self, myself: &ActorRef<RouterMsg>, ask: crate::channels::store::Ask) {
        let crate::channels::store::Ask { agent, text, id, mut route } = ask;
        let sender = route.chain.origin.clone();
        if !self.slots.contains_key(&agent) {
            return; // decommissioned meanwhile: the mail stays in the store
        }
        if let Err(reason) = self.admit(&mut route, "SEND", &sender, &agent, &text) {
            tracing::warn!(agent, reason = %reason, "flock router: a person's post to {agent} was not admitted: {reason}");
            let op = WriteOp::Discard { id, reason };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            return;
        }
        crate::metrics::get().durable_messages.inc();
        let chain = route.chain.id;
        if let Some(slot) = self.slots.get_mut(&agent) {
            slot.queue.push_back(Queued::new(id, DeliveryKind::Message, sender, text, route));
        }
        self.sync_working(chain);
        self.deliver_next(myself, &agent);
    }

    /// Stops a chain at a budget: nothing more of it runs, its running turns are cancelled, and
    /// the person who started it is told in their DM (once).
    fn stop_chain(&mut self, id: MsgId, kind: StopKind) {
        let reason = chains::describe_stop(kind, &self.spec.budget);
        let Some(chain) = self.chains.map.get_mut(&id) else { return };
        if chain.stopped.is_some() {
            return;
        }
        chain.stopped = Some(reason.clone());
        self.chains.stopped_total += 1;
        let notice = chain.stop_notice(&reason);
        let (origin, entry, answered, place) = (
            chain.tag.origin.clone(),
            chain.tag.entry.clone(),
            chain.answered,
            chain.tag.reply.clone(),
        );
        tracing::warn!(
            chain = %fmt_id(id),
            agent = %entry,
            reason = %reason,
            "flock router: chain {} stopped: {reason}",
            fmt_id(id)
        );
        self.journal_chain(
            id,
            None,
            &entry,
            "CHAIN_STOPPED",
            Status::Failed,
            notice.clone(),
            |e| e.param("reason", reason.clone()).param("origin", origin.clone()),
        );
        let running: Vec<(String, MsgId, Option<ConnId>)> = self
            .slots
            .iter()
            .filter_map(|(name, s)| {
                let q = s.in_flight.as_ref().filter(|q| q.chain() == id)?;
                Some((name.clone(), q.id, s.conn))
            })
            .collect();
        for (agent, delivery, conn) in running {
            if let Some(gw) = &self.gateway {
                let _ = gw.cast(GatewayMsg::Cancel { agent: agent.clone() });
            }
            if let Some(conn) = conn {
                let cancel = Frame {
                    correlation_id: Some(delivery),
                    ..Frame::new(
                        ROUTER,
                        agent,
                        Body::Cancel {
                            reason: format!("its chain of turns was stopped: {reason}"),
                        },
                    )
                };
                self.answer(conn, cancel);
            }
        }
        self.sync_working(id);
        if !answered && origin.starts_with("human:") {
            self.post_answer(&entry, &origin, notice, id, None, place);
        } else {
            self.end_watchers(id, ChainOutcome::Stopped, &notice, &entry, "", 0);
        }
    }

    /// Model tokens a chain used; past its token budget it is stopped.
    fn charge_tokens(&mut self, chain: MsgId, tokens: u64) {
        let budget = &self.spec.budget;
        let Some(c) = self.chains.map.get_mut(&chain) else { return };
        c.tokens += tokens;
        if c.stopped.is_none() && c.tokens > budget.max_tokens {
            self.stop_chain(chain, StopKind::Tokens);
        }
    }

    /// Stops the chains that ran past their time budget (checked every second).
    fn check_wall_budgets(&mut self) {
        let now = unix_ms();
        let limit = self.spec.budget.max_wall_secs * 1000;
        let late: Vec<MsgId> = self
            .chains
            .map
            .values()
            .filter(|c| c.stopped.is_none() && c.live > 0)
            .filter(|c| now.saturating_sub(c.tag.started_ms) > limit)
            .map(|c| c.tag.id)
            .collect();
        for id in late {
            self.stop_chain(id, StopKind::Wall);
        }
    }

    /// A finished turn, journaled in its chain (if the router keeps it: a lone root is not).
    fn journal_turn(&self, agent: &str, done: &Queued, reply: &str) {
        if self.journal.is_none() || !self.chains.map.contains_key(&done.chain()) {
            return;
        }
        let kind = match done.kind {
            DeliveryKind::Message => "message",
            DeliveryKind::Request => "request",
            DeliveryKind::Delta => "delta",
            DeliveryKind::Result => "result",
        };
        let what = if done.delegated { "delegated its input".to_owned() } else { quote(reply) };
        self.journal_chain(
            done.chain(),
            Some(done.id),
            agent,
            "TURN",
            Status::Success,
            format!("{agent} finished a turn on a {kind} from {}: {what}", done.sender),
            |e| {
                e.param("input", kind)
                    .param("from", done.sender.clone())
                    .param("hop", done.route.hop)
            },
        );
    }

    /// Appends a chain event to the journal (if the router journals): `trace.correlation_id`
    /// is the chain, `trace.parent_id` the message whose turn caused it.
    #[allow(clippy::too_many_arguments)]
    fn journal_chain(
        &self,
        chain: MsgId,
        parent: Option<MsgId>,
        agent: &str,
        action: &str,
        status: Status,
        message: String,
        more: impl FnOnce(JournalEvent) -> JournalEvent,
    ) {
        let Some(j) = &self.journal else { return };
        let who = if agent == OPERATOR { OPERATOR_HUMAN } else { agent };
        let mut e =
            JournalEvent::new(who, action, status, message).correlation(chains::corr(chain));
        if let Some(p) = parent {
            e = e.parent(fmt_id(p));
        }
        j.log(more(e));
    }

    /// Arms the one deadline timer for the earliest pending deadline, unless it already fires
    /// by then.
    fn arm_deadline(&mut self, myself: &ActorRef<RouterMsg>) {
        let Some(&(due, _)) = self.deadlines.first() else { return };
        if self.deadline_armed.is_some_and(|armed| armed <= due) {
            return;
        }
        self.deadline_armed = Some(due);
        let wait = Duration::from_millis(due.saturating_sub(unix_ms()));
        myself.send_after(wait, || RouterMsg::CheckDeadlines);
    }

    /// Persists the turn counts gathered since the last flush, in one write per agent.
    fn flush_turns(&mut self) {
        for (agent, n) in self.unflushed_turns.drain() {
            let op = WriteOp::AddTurns { agent, n };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        }
    }

    /// Routes the answer to request `id` back to its caller, if it is still waiting.
    fn reply(&mut self, id: MsgId, callee: &str, body: Body) {
        let Some(req) = self.requests.remove(&id) else {
            self.counters.late_replies += 1;
            return;
        };
        self.deadlines.remove(&(req.deadline, id));
        let frame = Frame {
            id: new_id(),
            from: callee.to_owned(),
            to: req.caller,
            correlation_id: Some(id),
            deadline_ms: None,
            body,
        };
        self.answer(req.caller_conn, frame);
    }

    /// A durable message's delivery failed: count it; requeue it at the head, or dead-letter it.
    fn failed_delivery(&mut self, agent: &str, mut q: Queued, reason: String) {
        let max = self.spec.delivery.max_delivery_attempts;
        let Some(slot) = self.slots.get_mut(agent) else { return };
        q.attempts += 1;
        if q.attempts < max {
            let op = WriteOp::FailedAttempt { id: q.id, attempts: q.attempts };
            slot.queue.push_front(q);
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            return;
        }
        tracing::warn!(
            msg_id = %fmt_id(q.id),
            agent,
            attempts = q.attempts,
            reason = %reason,
            "flock router: message {} to `{agent}` dead-lettered after {} failed deliveries ({reason})",
            fmt_id(q.id),
            q.attempts
        );
        crate::metrics::get().dead_letters.inc();
        let op = WriteOp::DeadLetter {
            id: q.id,
            attempts: q.attempts,
            reason: format!("{} failed deliveries; last: {reason}", q.attempts),
        };
        let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        // A person waiting for this input's answer hears that there will be none.
        if let Some(human) = q.route.answer_to().filter(|to| to.starts_with("human:"))
            && !q.delegated
        {
            let text = format!(
                "[failed] I could not process \"{}\": it failed {} times (last: {reason}). \
                 It is in `flockctl dead-letters`.",
                clip(&q.text, 80),
                q.attempts
            );
            let place = q.route.chain.reply.clone();
            self.post_answer(agent, human, text, q.chain(), None, place);
        }
        self.leave(q.chain());
    }

    /// Appends a finished turn to the agent's session (before its `Ack` is handled: same
    /// connection, same store queue).
    fn save_session(&self, agent: &str, channel: &str, messages: &str) {
        let items: Vec<String> = match serde_json::from_str::<serde_json::Value>(messages) {
            Ok(serde_json::Value::Array(items)) => items.iter().map(|v| v.to_string()).collect(),
            _ => {
                tracing::warn!(
                    agent,
                    channel,
                    "flock router: `{agent}` sent a session that is not a JSON array; ignored"
                );
                return;
            }
        };
        let (agent, channel) = (agent.to_owned(), channel.to_owned());
        let job: crate::store_actor::StoreJob = Box::new(move |s| {
            if let Err(e) = s.append_session(&agent, &channel, &items) {
                tracing::error!(agent = %agent, channel = %channel, error = %e, "flock store: saving the session of {agent} failed");
            }
        });
        let _ = self.store.cast(StoreMsg::With(job));
    }

    /// Answers `SessionLoad` from the store, straight to the agent's outbox.
    fn load_session(&self, conn: ConnId, agent: &str, frame: &Frame, channel: &str) {
        let Some(outbox) = self.conns.get(&conn).map(|i| i.outbox.clone()) else { return };
        let (agent, channel, id) = (agent.to_owned(), channel.to_owned(), frame.id);
        // Half a frame: the rest of it is room for the frame's own fields.
        let max_bytes = self.spec.delivery.max_frame_bytes as usize / 2;
        let job: crate::store_actor::StoreJob = Box::new(move |s| {
            let window = flock_config::SESSION_WINDOW;
            let messages = match s.load_session(&agent, &channel, window, max_bytes) {
                Ok(items) => format!("[{}]", items.join(",")),
                Err(e) => {
                    tracing::error!(agent = %agent, channel = %channel, error = %e, "flock store: loading the session of {agent} failed");
                    "[]".into()
                }
            };
            let reply = Frame {
                correlation_id: Some(id),
                ..Frame::new(ROUTER, agent, Body::SessionData { channel, messages })
            };
            let _ = outbox.try_send(reply);
        });
        let _ = self.store.cast(StoreMsg::With(job));
    }

    /// Queues a channel notification as a turn input of `agent`.
    fn delta(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: String,
        channel: String,
        upto: u64,
        text: String,
        chain: Option<(ChainTag, u32)>,
    ) {
        let id = new_id();
        let from = format!("#{channel}");
        let mut route = match chain {
            Some((tag, hops)) => Route {
                answer_path: Vec::new(),
                result: false,
                chain: tag,
                hop: hops + 1,
                parent: None,
            },
            None => Route::root(id, &from, &agent, &text, unix_ms(), None),
        };
        let known = self.slots.contains_key(&agent);
        let admitted = known && self.admit(&mut route, "DELTA", &from, &agent, &text).is_ok();
        let Some(slot) = self.slots.get_mut(&agent).filter(|_| admitted) else {
            // An unknown agent's delta is retried when it is back; one refused by a stopped
            // chain counts as handled (the messages stay readable with flock_channel_read).
            if let Some(ch) = &self.channels {
                let ok = known;
                let _ = ch.cast(ChannelsMsg::DeltaDone { agent, channel, upto, ok });
            }
            return;
        };
        let mut q = Queued::new(id, DeliveryKind::Delta, from, text, route);
        q.channel = Some((channel, upto));
        slot.queue.push_back(q);
        self.deliver_next(myself, &agent);
    }

    /// Reports a delta's outcome to the channels actor.
    fn delta_done(&self, agent: &str, q: &Queued, ok: bool) {
        if let (Some(ch), Some((channel, upto))) = (&self.channels, &q.channel) {
            let msg = ChannelsMsg::DeltaDone {
                agent: agent.to_owned(),
                channel: channel.clone(),
                upto: *upto,
                ok,
            };
            let _ = ch.cast(msg);
        }
    }

    fn closed(&mut self, conn: ConnId) {
        let Some(info) = self.conns.remove(&conn) else { return };
        if info.kind == ConnKind::Bridge {
            return self.bridge_closed(conn, &info.identity);
        }
        if info.kind != ConnKind::Agent {
            return;
        }
        let agent = info.identity;
        let Some(slot) = self.slots.get_mut(&agent) else { return };
        if slot.conn != Some(conn) {
            return;
        }
        slot.conn = None;
        if let Some(q) = slot.in_flight.take() {
            turn_ended(&agent, slot, false);
            let stopped = self.chains.map.get(&q.chain()).is_some_and(|c| c.stopped.is_some());
            match q.kind {
                _ if stopped => self.discard(&agent, q, "its chain of turns was stopped"),
                // A request is retried within its deadline; a deliberate stop is nobody's fault.
                DeliveryKind::Request => slot.queue.push_front(q),
                DeliveryKind::Message | DeliveryKind::Result if slot.stopping => {
                    slot.queue.push_front(q)
                }
                DeliveryKind::Message | DeliveryKind::Result => {
                    self.failed_delivery(&agent, q, "the agent's connection closed mid-turn".into())
                }
                // The channels actor rolls its cursor back and retries when the agent returns.
                DeliveryKind::Delta => {
                    self.delta_done(&agent, &q, false);
                    self.leave(q.chain());
                }
            }
        }
        (self.events)(RouterEvent::Disconnected { agent: agent.clone() });
    }

    fn stored(&mut self, myself: &ActorRef<RouterMsg>, batch: StoredBatch) {
        for (op, origin, outcome) in batch.items {
            let WriteOp::Enqueue(msg) = op else { continue };
            let Some(origin) = origin else { continue };
            let route =
                Route::load(&msg.route, msg.id, &msg.sender, &msg.target, &msg.text, unix_ms());
            let chain = route.chain.id;
            let answer = match outcome {
                Ok(WriteOutcome::Inserted) => {
                    crate::metrics::get().durable_messages.inc();
                    let target = msg.target.clone();
                    match self.slots.get_mut(&target) {
                        Some(slot) => {
                            let kind = if route.result {
                                DeliveryKind::Result
                            } else {
                                DeliveryKind::Message
                            };
                            slot.queue.push_back(Queued::new(
                                msg.id,
                                kind,
                                msg.sender.clone(),
                                msg.text,
                                route,
                            ));
                            self.deliver_next(myself, &target);
                        }
                        // Decommissioned meanwhile: the mail stays in the store.
                        None => self.leave(chain),
                    }
                    Body::Accepted
                }
                // Accepted before (a replayed turn re-sent it): accepted, not queued or charged
                // twice.
                Ok(_) => {
                    if let Some(c) = self.chains.map.get_mut(&chain) {
                        c.hops = c.hops.saturating_sub(1);
                    }
                    self.leave(chain);
                    Body::Accepted
                }
                Err(e) => {
                    self.leave(chain);
                    Body::Error {
                        code: ErrorCode::Internal,
                        message: format!("the message could not be stored: {e}"),
                    }
                }
            };
            if origin.conn == NO_CONN {
                continue;
            }
            let frame = Frame {
                id: new_id(),
                from: ROUTER.into(),
                to: msg.sender,
                correlation_id: Some(origin.frame),
                deadline_ms: None,
                body: answer,
            };
            self.answer(origin.conn, frame);
        }
    }

    fn request_timeout(&mut self, id: MsgId) {
        let Some(req) = self.requests.remove(&id) else { return };
        let target = req.target.clone();
        let message = format!(
            "`{target}` did not answer within {} ms; its turn was cancelled",
            req.timeout_ms
        );
        let frame = Frame {
            id: new_id(),
            from: ROUTER.into(),
            to: req.caller,
            correlation_id: Some(id),
            deadline_ms: None,
            body: Body::Error { code: ErrorCode::Timeout, message },
        };
        self.answer(req.caller_conn, frame);
        // Cancel the callee's turn if it is working on it; if it is still queued, it is skipped.
        let Some(slot) = self.slots.get(&target) else { return };
        if slot.in_flight.as_ref().is_some_and(|q| q.id == id)
            && let Some(gw) = &self.gateway
        {
            // The callee's model call is wasted work now: stop it.
            let _ = gw.cast(GatewayMsg::Cancel { agent: target.clone() });
        }
        if slot.in_flight.as_ref().is_some_and(|q| q.id == id)
            && let Some(conn) = slot.conn
        {
            let cancel = Frame {
                correlation_id: Some(id),
                ..Frame::new(
                    ROUTER,
                    target.clone(),
                    Body::Cancel { reason: "the caller's deadline passed".into() },
                )
            };
            self.answer(conn, cancel);
        }
    }

    /// Tools the router answers itself.
    fn router_tool(&self, caller: &str, name: &str, arguments: &str) -> Result<String, String> {
        match name {
            // An agent's own record of what it did (a file written), journaled in the chain it is
            // working in, under its own name (from its connection). Not a model's tool.
            "journal__event" => {
                let args: serde_json::Value = serde_json::from_str(arguments)
                    .map_err(|e| format!("BAD_REQUEST: arguments are not JSON: {e}"))?;
                let kind = args["type"].as_str().unwrap_or_default();
                if kind.is_empty()
                    || kind.len() > 40
                    || !kind.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                {
                    return Err("BAD_REQUEST: `type` must be UPPER_SNAKE_CASE".into());
                }
                let message = clip(args["message"].as_str().unwrap_or_default(), 400);
                let params = args["params"].as_object().cloned().unwrap_or_default();
                let q = self.slots.get(caller).and_then(|s| s.in_flight.as_ref());
                let Some(j) = &self.journal else { return Ok("{}".into()) };
                let mut e = JournalEvent::new(caller, kind, Status::Success, message);
                if let Some(q) = q {
                    e = e.correlation(chains::corr(q.chain())).parent(fmt_id(q.id));
                }
                for (k, v) in params.into_iter().take(8) {
                    e = e.param(k, v);
                }
                j.log(e);
                Ok("{}".into())
            }
            "agents__list" => {
                let list: Vec<_> = self
                    .order
                    .iter()
                    .filter_map(|n| self.slots.get(n).map(|s| &s.spec))
                    .filter(|a| a.key() != caller)
                    .map(|a| {
                        let slot = self.slots.get(&a.key());
                        let state = match slot {
                            Some(s) if s.in_flight.is_some() => "busy",
                            Some(s) if s.conn.is_some() => "ready",
                            _ => "offline",
                        };
                        serde_json::json!({"name": a.key(), "role": a.role.as_str(), "state": state})
                    })
                    .collect();
                Ok(serde_json::Value::Array(list).to_string())
            }
            "agents__catalog" => {
                let allowed = self.slots.get(caller).map(|s| &s.spec.can_call);
                let list: Vec<_> = self
                    .order
                    .iter()
                    .filter_map(|n| self.slots.get(n).map(|s| &s.spec))
                    .filter(|a| a.key() != caller)
                    .map(|a| {
                        let callable = allowed.is_none_or(|c| c.is_empty() || c.contains(&a.name));
                        serde_json::json!({
                            "name": a.key(),
                            "role": a.role.as_str(),
                            "archetype": a.archetype,
                            "description": a.description,
                            "callable": callable,
                        })
                    })
                    .collect();
                Ok(serde_json::Value::Array(list).to_string())
            }
            other => Err(format!(
                "BAD_REQUEST: `{other}` is not a router tool; available: agents__list, agents__catalog"
            )),
        }
    }
}

/// A message's text for the journal: one line, at most 200 characters, quoted.
fn quote(text: &str) -> String {
    format!("{:?}", clip(text, 200))
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    subtle::ConstantTimeEq::ct_eq(a, b).into()
}

/// Why a text of `len` bytes is refused; says the limit and how to raise it.
pub fn too_long(what: &str, len: usize, limit: usize) -> String {
    format!(
        "{what} is {} and the limit is {}: send it in parts, or put it in a file and send its path \
         (the limit is an eighth of `delivery.max_frame_bytes` in the swarm file)",
        flock_ipc::human_bytes(len),
        flock_ipc::human_bytes(limit)
    )
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
