//! What the actors say to each other: the message enum of each actor (router, channels, store,
//! gateway) and the values those messages carry. They live here, apart from the actors that
//! handle them, so that an actor's implementation imports the others' messages and never their
//! implementation: the dependency runs one way, from every actor down to this file.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use flock_config::{AgentSpec, ModelSpec};
use flock_ipc::{
    Body, ControlRequest, DeadLetter, ErrorCode, Frame, MsgId, Outbox, PeerCred, ROUTER, ToolError,
};
use ractor::{ActorRef, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::caller::Caller;
use crate::chains::{ChainTag, ReplyPlace};
use crate::permissions::Logged;
use crate::store::channels::Ask;
use crate::store::{NewMessage, PendingMessage, Store, WriteOp, WriteOutcome};

// ---- The router ----

/// A connection's number, given by the server as it accepts it.
pub type ConnId = u64;

/// Which socket a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    Agent,
    Control,
    /// A chat bridge (it came in on the agents' socket with `BridgeHello`).
    Bridge,
}

/// The router's mailbox: connections and their frames (from the server), commits (the store),
/// spawns and stops (the supervisor), posts and answers (channels), tokens (the gateway).
pub enum RouterMsg {
    /// A new connection and its first frame (the handshake).
    Open(Opened),
    /// Frames read from a connection. The permit bounds how many frames a connection can have
    /// waiting in this mailbox; it is released when the batch has been handled.
    Frames { conn: ConnId, frames: Vec<Frame>, permit: Option<OwnedSemaphorePermit> },
    /// The connection is gone (peer closed, or it sent something malformed).
    Closed { conn: ConnId },
    /// Writes the store has committed.
    Stored(StoredBatch),
    /// A durable message from an agent on another host, brought by the cluster link: `reply` once
    /// it is stored here (then the link acknowledges it to the broker), or why it is refused.
    FromHost { host: String, msg: PendingMessage, reply: oneshot::Sender<FromHost> },
    /// A request from an agent on another host, brought by the cluster link: `reply` gets the
    /// answer (or why there is none), which the link sends back.
    CallFromHost { host: String, call: HostCall, reply: oneshot::Sender<HostReply> },
    /// The caller on host `host` stopped waiting for its request `id`.
    CancelFromHost { host: String, id: MsgId },
    /// The answer to request `id` that this host sent to `callee` on another host (or why
    /// there is none).
    AnswerFromHost { id: MsgId, callee: String, reply: HostReply },
    /// Another host asks this one something besides a request (the channels' calls, which the
    /// leader answers: [`HostAsk`]); `reply` gets the answer, which the link sends back.
    HostAsked { host: String, id: MsgId, ask: HostAsk, reply: oneshot::Sender<Body> },
    /// The answer to what this host asked another ([`OutCall::Ask`] `id`), or why there is none.
    HostAnswered { id: MsgId, body: Body },
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
    Delta { agent: String, span: DeltaSpan, text: String, chain: Option<(ChainTag, u32)> },
    /// Model tokens a chain's turn used (from the gateway).
    Tokens { chain: MsgId, tokens: u64 },
    /// The channels actor posted (or found already posted) a chain's answer to a person.
    Answered(AnswerPosted),
    /// A person's post was handed to the agent that answers it (stored with the post): queue
    /// it, as the first hop of its chain.
    Asked(Ask),
    /// Tell `agent` that `channel` was archived, so it closes that session.
    SessionClosed { agent: String, channel: String },
    /// An agent created at run time (`flock_create_agent`): route to it from now on.
    AddAgent { spec: AgentSpec, liveness: Arc<AtomicU64> },
    /// A decommissioned agent: nothing is routed to it any more (its stored history stays).
    RemoveAgent { name: String },
    /// Host `host` runs these agents created at run time there (its whole list): routed to
    /// from now on (router/hosts.rs `created_elsewhere`).
    CreatedElsewhere { host: String, agents: Vec<AgentSpec> },
    /// Routing facts for `flockctl ps`.
    Snapshot(RpcReplyPort<(Vec<RouteInfo>, RouterCounters)>),
    /// A person's permission tool through `flockctl` (`permission_list`, `permission_decide`).
    PermissionHuman {
        person: String,
        tool: String,
        arguments: String,
        reply: RpcReplyPort<Result<String, ToolError>>,
    },
    /// What a permission job did (from the store actor): journal it, deliver its messages.
    Permission(PermissionEffects),
    /// Run the memory's daily TTL job now (the supervisor sends it at start and every day).
    MemoryTick,
    /// What a memory tier move did (the TTL job's, or one a person approved, `by` them).
    MemoryTiers { by: String, result: Result<String, flock_ipc::ToolError> },
    /// The supervisor is about to spawn chat bridge `bridge` with this token.
    ExpectBridge { bridge: String, token: String },
    /// The supervisor is stopping chat bridge `bridge`: tell it to shut down.
    StopBridge { bridge: String },
    /// What every chat bridge reports, for `flockctl ps` and `flockctl bridge ls`.
    Bridges(RpcReplyPort<Vec<BridgeInfo>>),
}

/// A connection the server accepted, with its first frame (the handshake).
pub struct Opened {
    pub conn: ConnId,
    pub kind: ConnKind,
    pub first: Frame,
    pub outbox: Outbox,
    /// Dropping or firing it closes the connection.
    pub closer: oneshot::Sender<()>,
    pub peer: PeerCred,
    /// The process the supervisor started that the opener descends from (or is), read by the
    /// accept loop: an agent's Hello must come from its own spawn's tree.
    pub root: Option<u32>,
}

/// Writes committed by the store, handed back so the router can answer and deliver.
#[derive(Debug, Default)]
pub struct StoredBatch {
    pub items: Vec<(WriteOp, Option<Origin>, StoredOutcome)>,
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

/// What `flockctl ps` and `flockctl bridge ls` show of a bridge, as its process reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BridgeInfo {
    pub name: String,
    pub platform: String,
    pub connected: bool,
    /// `connecting`, `connected`, `reconnecting`, `rate-limited until …`, `broken: …` (its own
    /// words), or `down` while no process is connected.
    pub state: String,
    /// Posts waiting to go out to the platform, summed over its mappings.
    pub outbox: u64,
    pub last_error: Option<String>,
    /// Messages brought in from the platform and posts delivered to it, since the start.
    pub inbound: u64,
    pub outbound: u64,
    pub pid: u32,
    /// Unix ms of the last frame received from it.
    pub last_seen_ms: u64,
    /// Per mapped chat (its `external` id), as the bridge reports it.
    pub mappings: BTreeMap<String, MappingReport>,
}

/// What a bridge reports of one mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingReport {
    /// Posts waiting to go out to that chat (as of the bridge's last pull).
    pub outbox: u64,
    /// Why the chat refuses posts, while it does.
    pub broken: Option<String>,
}

/// What a permission job hands back to the router.
pub struct PermissionEffects {
    pub journal: Vec<Logged>,
    pub stored: Vec<NewMessage>,
    /// A person approved moving warm memory dated up to this day to cold: (the day, who).
    pub archive: Option<(String, String)>,
}

// ---- The channels actor ----

/// The channels actor's mailbox: tool calls (agents through the router, people through
/// `flockctl`, chat bridges), chain answers to post, its own timers.
pub enum ChannelsMsg {
    /// A `flock_*` call from an agent connection; `chain`: the chain of the turn making it (and
    /// its hops so far), carried on to the deltas its posts cause; `answers`: that turn owes a
    /// person their answer (a post of it where they asked is that answer).
    Tool {
        caller: Caller,
        name: String,
        arguments: String,
        chain: Option<(ChainTag, u32)>,
        answers: bool,
        reply: ToolReply,
    },
    /// Post a chain's answer (or stop notice) from `agent` to `human`, at most once per chain:
    /// as a reply where they asked (`place`), else in their DM (created if needed); `msg`, the
    /// input whose turn gave the answer, is completed in the post's transaction. The router
    /// hears back through [`RouterMsg::Answered`].
    Answer {
        agent: String,
        human: String,
        text: String,
        chain: MsgId,
        msg: Option<MsgId>,
        place: Option<ReplyPlace>,
        /// Where the outcome goes instead of the router: an answer from another host's agent,
        /// whose host completes its input.
        to_host: Option<oneshot::Sender<AnswerPosted>>,
    },
    /// A chain started (`on`) or stopped working on a person's post (`channel`, `seq`): the
    /// bridges of that channel show it (typing).
    Working { channel: String, seq: u64, on: bool },
    /// Permission request `id` waits for a person: announce it in every bridge's `approvals`
    /// channel (once per request and channel).
    PermissionWaiting { id: i64, agent: String, what: String, reason: String, why: String },
    /// The same tools for a human through `flockctl`.
    Human { caller: Caller, name: String, arguments: String, reply: RpcReplyPort<ToolResult> },
    /// The coalescing delay of (agent, channel) passed: send its delta.
    DeltaDue { agent: String, channel: String },
    /// The router's verdict on a delta: acknowledged by the agent's turn, or failed.
    DeltaDone { agent: String, channel: String, upto: u64, ok: bool },
    /// An agent (re)connected: retry deltas that failed while it was away.
    AgentReady { agent: String },
    /// The archive deadline of a channel passed.
    ArchiveDeadline { channel: String },
    /// A channel's quiet timer fired (`channels.quiet_secs`).
    Quiet { channel: String },
    /// Wiring: the router, once it exists.
    SetRouter(ActorRef<RouterMsg>),
    /// On the leader: agents created at run time on other hosts (`added`), and those
    /// decommissioned there (`gone`).
    Elsewhere { added: Vec<AgentSpec>, gone: Vec<String> },
    /// A `bridge__*` call from the chat bridge `bridge` (identity from its connection).
    Bridge { bridge: String, name: String, arguments: String, reply: ToolReply },
    /// The wait of a parked `bridge__pull` ran out.
    PullExpired { bridge: String, external: String, frame_id: MsgId },
}

/// Where the answer to an agent's tool call goes.
#[derive(Debug, Clone)]
pub struct ToolReply {
    pub outbox: Outbox,
    pub frame_id: MsgId,
    pub to: String,
}

impl ToolReply {
    /// Answers the tool call with `result` (a refusal as `CODE: message`).
    pub fn send(self, result: ToolResult) {
        let (ok, content) = match result {
            Ok(c) => (true, c),
            Err((code, msg)) => (false, format!("{code}: {msg}")),
        };
        let frame = Frame {
            correlation_id: Some(self.frame_id),
            ..Frame::new(ROUTER, self.to, Body::ToolResult { ok, content })
        };
        let _ = self.outbox.try_send(frame);
    }
}

pub type ToolResult = Result<String, (ErrorCode, String)>;

// ---- The supervisor, as the channels actor sees it ----

/// Swarm changes the channels actor asks the supervisor for (it spawns and stops processes).
#[derive(Debug)]
pub enum AgentOp {
    /// Route to and spawn a new agent; answers once it is ready (or could not start).
    Create { spec: Box<AgentSpec>, reply: oneshot::Sender<Result<String, String>> },
    /// Stop an agent for good and stop routing to it.
    Decommission { name: String },
}

/// How the channels actor hands an [`AgentOp`] to the supervisor.
pub type AgentOps = Arc<dyn Fn(AgentOp) + Send + Sync>;

// ---- The store actor ----

/// The store actor's mailbox: mailbox writes (group-committed), reads, and jobs of other actors.
pub enum StoreMsg {
    /// A write; when `notify` is set, the router hears the outcome after the commit.
    Write {
        op: WriteOp,
        origin: Option<Origin>,
        notify: Option<ActorRef<RouterMsg>>,
    },
    /// Commit everything queued (sent by the actor to itself).
    Flush,
    Pending(RpcReplyPort<Result<Vec<PendingMessage>, String>>),
    TurnsTotals(RpcReplyPort<Result<HashMap<String, u64>, String>>),
    /// One page of dead letters, oldest first.
    DeadLetters {
        offset: u32,
        limit: u32,
        reply: RpcReplyPort<Result<Vec<DeadLetter>, String>>,
    },
    /// Run a closure on the store (channel operations): the store actor stays the only writer,
    /// and queued mailbox writes are committed first so the closure sees them.
    With(StoreJob),
}

/// A request crossing to another host: what the callee's router needs to run it as its own.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostCall {
    #[serde(with = "crate::chains::hex_id")]
    pub id: MsgId,
    pub from: String,
    pub to: String,
    pub text: String,
    pub timeout_ms: u64,
    /// Who is serving whom so far (cycle detection), the caller last.
    pub calls: Vec<String>,
    /// The request's route (its chain, its hop), as stored.
    pub route: String,
}

/// What a channel notification covers: the messages of channel `channel` after seq `after` up to
/// seq `upto`. `born`: when the channel was created (ms) — a channel made again under the same
/// name (a leader whose state was wiped) is another channel, with seqs of its own.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeltaSpan {
    pub channel: String,
    pub born: i64,
    pub after: u64,
    pub upto: u64,
}

/// What one host asks another over NATS request–reply (the payload of a call; docs/cluster.md).
/// The leader holds the channels: other hosts send it their agents' channel calls, and it sends
/// them their agents' channel notifications.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HostAsk {
    /// An agent's request to an agent on the host asked.
    Request(HostCall),
    /// An agent's channel tool call (`flock_*`), to the leader; answered with the tool's
    /// `Body::ToolResult`.
    Tool {
        caller: String,
        name: String,
        arguments: String,
        /// The chain the caller works in and its hops (a post carries it on to its deltas).
        chain: Option<(ChainTag, u32)>,
        /// The caller's turn owes a person an answer (its post there is that answer).
        answers: bool,
    },
    /// A channel notification for an agent on the host asked, from the leader; answered
    /// `Body::Accepted` once the agent's turn took it, an error when it did not, and
    /// `Body::Reply` with a seq when the agent was already told the channel up to that seq (the
    /// leader lost the answer to an earlier notification: it moves its cursor there and sends
    /// only the rest). See `router::leader::delta_outcome`.
    Delta { agent: String, span: DeltaSpan, text: String, chain: Option<(ChainTag, u32)> },
    /// An agent of the asking host is ready: the leader sends it what its channels hold for it.
    Ready { agent: String },
    /// Events the asking host journaled (one line each): the leader's journal holds every
    /// host's, each marked with the host that wrote it (`params.host`).
    Journal { lines: Vec<String> },
    /// A chain on the asking host started (`on`) or stopped working on a person's post: the
    /// leader's bridges show it (typing).
    Working { channel: String, seq: u64, on: bool },
    /// An agent's permission call (`permission_request`, `permission_verdict`, `permission_list`,
    /// `permissions__grants`), to the leader, which keeps the swarm's permission records;
    /// answered like the tool. `key`: the agent's call id (a replayed turn gets the same record);
    /// `protected`: paths on the asking host never granted (its state dir, its agents'
    /// workspaces).
    Permission {
        caller: String,
        name: String,
        arguments: String,
        #[serde(with = "crate::chains::hex_id")]
        key: MsgId,
        protected: Vec<std::path::PathBuf>,
    },
    /// A chain's answer (or stop notice) from an agent of the asking host to a person who asked
    /// in a channel, to the leader, which posts it once per chain; answered with
    /// `Body::ToolResult` (ok: `{"channel", "seq", "duplicate"}`; else why not).
    Answer {
        agent: String,
        human: String,
        text: String,
        #[serde(with = "crate::chains::hex_id")]
        chain: MsgId,
        /// Where the person asked; `None`: the operator's DM (an operator's send from the host
        /// asked).
        #[serde(default)]
        place: Option<ReplyPlace>,
    },
    /// What `flockctl` on the asking host does to an agent placed on the host asked; taken only
    /// from a host the swarm file lists in `cluster.operators`.
    Operator(OperatorAsk),
}

/// `flockctl` on one host for an agent on another ([`HostAsk::Operator`]): the host asked runs it
/// as its own operator's, and answers what its own `flockctl` would have been answered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum OperatorAsk {
    /// `flockctl send AGENT TEXT` (durable): the operator's message, stored on the agent's host
    /// under `id` (its chain's id, as on one host); answered `Body::Accepted` once stored.
    Send {
        #[serde(with = "crate::chains::hex_id")]
        id: MsgId,
        to: String,
        text: String,
    },
    /// `flockctl send --wait`: answered with `Body::ChainEnded` once chain `chain` (a send made
    /// this way) ends there.
    Watch {
        #[serde(with = "crate::chains::hex_id")]
        chain: MsgId,
    },
    /// `flockctl stop|start|restart AGENT`; answered with the control reply.
    Stop {
        agent: String,
    },
    Start {
        agent: String,
    },
    Restart {
        agent: String,
    },
    /// `flockctl logs AGENT [-f]`: its last `lines` (`after: None`), or the lines after line
    /// `after` (following it); answered with `ControlReply::LogPage`.
    Logs {
        agent: String,
        lines: u32,
        after: Option<u64>,
    },
}

impl OperatorAsk {
    /// The ask that runs `request` on the host of its agent, when it is one that crosses hosts
    /// (a log is asked for its last lines; following it asks again for the lines after them).
    pub fn control(request: &ControlRequest) -> Option<OperatorAsk> {
        Some(match request.clone() {
            ControlRequest::Stop { agent } => OperatorAsk::Stop { agent },
            ControlRequest::Start { agent } => OperatorAsk::Start { agent },
            ControlRequest::Restart { agent } => OperatorAsk::Restart { agent },
            ControlRequest::Logs { agent: Some(agent), lines, .. } => {
                OperatorAsk::Logs { agent, lines, after: None }
            }
            _ => return None,
        })
    }

    /// The agent it is for.
    pub fn agent(&self) -> &str {
        match self {
            OperatorAsk::Send { to: agent, .. }
            | OperatorAsk::Stop { agent }
            | OperatorAsk::Start { agent }
            | OperatorAsk::Restart { agent }
            | OperatorAsk::Logs { agent, .. } => agent,
            OperatorAsk::Watch { .. } => "",
        }
    }

    /// The control request it stands for on the host asked (`None`: a send or a watch, which
    /// the router runs itself).
    pub fn request(&self) -> Option<ControlRequest> {
        Some(match self.clone() {
            OperatorAsk::Stop { agent } => ControlRequest::Stop { agent },
            OperatorAsk::Start { agent } => ControlRequest::Start { agent },
            OperatorAsk::Restart { agent } => ControlRequest::Restart { agent },
            OperatorAsk::Logs { agent, lines, after } => {
                ControlRequest::LogPage { agent, after, lines }
            }
            OperatorAsk::Send { .. } | OperatorAsk::Watch { .. } => return None,
        })
    }
}

/// A host's answer to a request from another host: the callee's answer (or why there is none)
/// and the tokens its chain used on that host while it ran, with its count per host — the
/// caller's host counts them on, so a chain keeps one token budget through a request across
/// hosts.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostReply {
    pub body: Body,
    #[serde(default)]
    pub tokens: u64,
    /// The chain's tokens per host as the answering host knew them (empty from an older build,
    /// or when nothing was counted): the caller merges them as it merges a route's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_host: BTreeMap<String, u64>,
}

impl HostReply {
    /// An answer that counted no tokens (a refusal, an error on the way).
    pub fn of(body: Body) -> HostReply {
        HostReply { body, tokens: 0, by_host: BTreeMap::new() }
    }
}

/// What the router asks of the cluster link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutCall {
    /// Send request `call` to host `host`; its answer comes back as
    /// [`RouterMsg::AnswerFromHost`].
    Request { host: String, call: HostCall },
    /// Ask host `host` (`id`: this host's, new for each ask); the answer comes back as
    /// [`RouterMsg::HostAnswered`], or a `TargetUnavailable` error after `timeout_ms`.
    Ask { host: String, id: MsgId, ask: HostAsk, timeout_ms: u64 },
    /// Tell host `host` that nobody waits for request `id` any more.
    Cancel { host: String, id: MsgId },
}

/// What became of a message from another host ([`RouterMsg::FromHost`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromHost {
    /// In this host's mailbox (now, or already before: a message is stored once).
    Stored,
    /// Not for this host to take (who may not send it, or to whom): never stored.
    Refused(String),
    /// It could not be stored now; the broker delivers it again.
    Failed(String),
    /// Its sender is not known here yet (an agent created at run time on the sending host,
    /// which this host learns from that host's status within seconds): taken when it comes
    /// again, a little later.
    Later(String),
}

/// Who asked for a write and wants to hear the outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Origin {
    pub conn: u64,
    pub frame: MsgId,
}

/// A unit of store work sent by another actor; it reports its own result (e.g. via a oneshot).
pub type StoreJob = Box<dyn FnOnce(&mut Store) + Send>;

/// The outcome type carried back to the router.
pub type StoredOutcome = Result<WriteOutcome, String>;

// ---- The LLM gateway ----

/// The gateway's mailbox: model calls (through the router), cancels, and its calls' endings.
pub enum GatewayMsg {
    /// A model call from `agent` (its address) with its model; answer on `outbox`. `chain`: the
    /// chain of turns the call belongs to and the router to charge its tokens to.
    Call {
        agent: String,
        model: ModelSpec,
        request: String,
        frame_id: MsgId,
        outbox: Outbox,
        chain: Option<(MsgId, ActorRef<RouterMsg>)>,
        /// Background work (the memory roles): nobody waits on it.
        background: bool,
    },
    /// The agent's turn was cancelled: abort its call in flight.
    Cancel { agent: String },
    /// A call finished (sent by its task).
    Done { agent: String, call: u64, tokens_in: u64, tokens_out: u64 },
    /// Tokens used so far per agent (in, out), for `flockctl ps`.
    Usage(RpcReplyPort<HashMap<String, (u64, u64)>>),
}
