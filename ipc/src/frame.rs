//! Wire types: the [`Frame`] envelope and every [`Body`] kind.
//!
//! Addressing: `from`/`to` are agent names, `operator` for `flockctl`, or empty where the frame
//! is addressed to the router itself. The router never trusts `from` on a received frame: it
//! overwrites it with the identity of the connection the frame came in on.

use serde::{Deserialize, Serialize};

use crate::error::{ErrorCode, ToolError};
use crate::id::MsgId;

/// Address of the router/supervisor itself.
pub const ROUTER: &str = "";
/// Identity of `flockctl` clients (control connections).
pub const OPERATOR: &str = "operator";

/// One message on the wire. Encoded as `u32` LE body length + bincode body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    /// Unique per frame (see [`crate::id`]).
    pub id: MsgId,
    pub from: String,
    pub to: String,
    /// The id of the frame this one answers (an `Accepted`, `Reply`, `Ack`, `Error`, …).
    pub correlation_id: Option<MsgId>,
    /// Absolute deadline, Unix milliseconds.
    pub deadline_ms: Option<u64>,
    pub body: Body,
}

impl Frame {
    /// A frame with a fresh id and no correlation or deadline.
    pub fn new(from: impl Into<String>, to: impl Into<String>, body: Body) -> Self {
        Frame {
            id: crate::id::new_id(),
            from: from.into(),
            to: to.into(),
            correlation_id: None,
            deadline_ms: None,
            body,
        }
    }

    /// A frame answering `to_frame` (correlation id = its id, addressed to its sender).
    pub fn answer(to_frame: &Frame, from: impl Into<String>, body: Body) -> Self {
        Frame { correlation_id: Some(to_frame.id), ..Frame::new(from, to_frame.from.clone(), body) }
    }

    /// An `Error` frame answering `to_frame`.
    pub fn error(to_frame: &Frame, code: ErrorCode, message: impl Into<String>) -> Self {
        Frame::answer(to_frame, ROUTER, Body::Error { code, message: message.into() })
    }

    /// Short kind name for logs.
    pub fn kind(&self) -> &'static str {
        self.body.kind()
    }
}

/// What a frame carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Body {
    /// Agent → router, first frame on an agent connection.
    Hello(Hello),
    /// `flockctl` → router, first frame on a control connection.
    ClientHello {
        protocol_version: u32,
        client: String,
        /// The operator key of this run of the supervisor: the contents of `operator.key` beside
        /// the control socket (see [`crate::operator`]). Only the operator can read that file.
        key: String,
    },
    /// Router → agent or client: the handshake succeeded.
    Welcome(Welcome),
    /// Router → peer: the handshake failed; the connection closes after this frame.
    Reject {
        code: ErrorCode,
        reason: String,
    },

    /// Send `text` to agent `to`. Answered by `Accepted` (durable: once it is in the target's
    /// mailbox) or `Error`.
    Send {
        text: String,
        mode: SendMode,
    },
    /// The `Send` with id `correlation_id` was accepted.
    Accepted,
    /// Ask agent `to` and wait for its `Reply` (or `Error`), within `timeout_ms`.
    Request {
        text: String,
        timeout_ms: u64,
    },
    /// Answer to the `Request` with id `correlation_id`.
    Reply {
        text: String,
    },
    /// Agent → router: hand the current input over to agent `to`. Its final answer comes back
    /// to the sender as a [`DeliveryKind::Result`] input, and the sender's own turn gives no
    /// answer. Only allowed while the sender's input has someone waiting for its answer (and it
    /// is not itself a result). Answered by `Accepted` (durable, like `Send`) or `Error`.
    Delegate {
        text: String,
    },

    /// Router → agent: one input to run a turn on. `id` is the message id.
    Deliver(Delivery),
    /// Agent → router: the turn for delivery `correlation_id` is finished and persisted.
    /// `reply` answers a request delivery.
    Ack {
        reply: Option<String>,
    },
    /// Agent → router: the turn for delivery `correlation_id` failed; retry later.
    Nack {
        reason: String,
    },
    /// Router → agent: stop the turn for delivery `correlation_id` (its deadline passed).
    Cancel {
        reason: String,
    },

    /// Agent → router: run a router-side tool (`agents__list`, `agents__catalog`).
    ToolCall {
        name: String,
        arguments: String,
    },
    /// Router → agent: result of `ToolCall` `correlation_id`; `content` is JSON text when `ok`.
    ToolResult {
        ok: bool,
        content: String,
    },

    Heartbeat,
    HeartbeatAck,
    /// Router → agent: finish up and exit.
    Shutdown,
    ShutdownAck,

    /// Agent → router: one model call (`ChatRequest` as JSON text); the gateway answers
    /// `LlmResult` with the same correlation id. The agent never holds a key.
    LlmCall {
        request: String,
    },
    /// Router → agent: `ok` with a `ChatResponse` as JSON text, or an error message.
    LlmResult {
        ok: bool,
        response: String,
    },
    /// Agent → router: append these messages (a JSON array) to the agent's session for
    /// `channel` (`""`: direct messages and requests). Sent before the turn's `Ack`.
    SessionSave {
        channel: String,
        messages: String,
    },
    /// Agent → router: the stored session for `channel`; answered by `SessionData`.
    SessionLoad {
        channel: String,
    },
    /// Router → agent: the newest messages of a session (a JSON array), oldest first.
    SessionData {
        channel: String,
        messages: String,
    },
    /// Router → agent: the channel was archived; close its session.
    SessionClosed {
        channel: String,
    },

    /// Something failed; `correlation_id` names the frame that caused it, if any.
    Error {
        code: ErrorCode,
        message: String,
    },

    /// `flockctl` → router.
    Control(ControlRequest),
    /// Router → `flockctl`.
    ControlReply(ControlReply),
    /// Router → a `flockctl` that asked to `Watch` a chain: the chain ended.
    ChainEnded(ChainEnd),
    /// Chat bridge → router, first frame on a bridge connection (on the agents' socket).
    /// `agent_id` is the bridge's name, `instance` is empty, `token` its per-spawn secret.
    /// A bridge may only call the `bridge__*` tools and heartbeat.
    BridgeHello(Hello),
    /// Router → agent, the answer to every `Nack` (`correlation_id`: the nacked delivery): the
    /// deliveries sent before this frame that the agent has not started went back to its
    /// mailbox, behind the failed one, and come again. An agent that nacked drops every
    /// `Deliver` until this frame, so a window of deliveries keeps its order through a failure.
    Rewind,
}

impl Body {
    /// A tool call's answer: its result, or the `Error` it was refused with (the code kept).
    pub fn tool_answer(answer: Result<String, ToolError>) -> Body {
        match answer {
            Ok(content) => Body::ToolResult { ok: true, content },
            Err(ToolError { code, message }) => Body::Error { code, message },
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            Body::Hello(_) => "Hello",
            Body::ClientHello { .. } => "ClientHello",
            Body::Welcome(_) => "Welcome",
            Body::Reject { .. } => "Reject",
            Body::Send { .. } => "Send",
            Body::Accepted => "Accepted",
            Body::Request { .. } => "Request",
            Body::Reply { .. } => "Reply",
            Body::Delegate { .. } => "Delegate",
            Body::Deliver(_) => "Deliver",
            Body::Ack { .. } => "Ack",
            Body::Nack { .. } => "Nack",
            Body::Cancel { .. } => "Cancel",
            Body::ToolCall { .. } => "ToolCall",
            Body::ToolResult { .. } => "ToolResult",
            Body::Heartbeat => "Heartbeat",
            Body::HeartbeatAck => "HeartbeatAck",
            Body::Shutdown => "Shutdown",
            Body::ShutdownAck => "ShutdownAck",
            Body::LlmCall { .. } => "LlmCall",
            Body::LlmResult { .. } => "LlmResult",
            Body::SessionSave { .. } => "SessionSave",
            Body::SessionLoad { .. } => "SessionLoad",
            Body::SessionData { .. } => "SessionData",
            Body::SessionClosed { .. } => "SessionClosed",
            Body::Error { .. } => "Error",
            Body::Control(_) => "Control",
            Body::ControlReply(_) => "ControlReply",
            Body::ChainEnded(_) => "ChainEnded",
            Body::BridgeHello(_) => "BridgeHello",
            Body::Rewind => "Rewind",
        }
    }
}

/// The agent's half of the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub agent_id: String,
    pub instance: String,
    pub pid: u32,
    /// The per-spawn secret from the agent's environment.
    pub token: String,
}

/// The router's half of the handshake.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    /// The swarm's name.
    pub swarm: String,
    /// The agent's validated spec as JSON text (`flock_config::AgentSpec`); empty for clients.
    pub agent_spec_json: String,
    /// How often the agent must send `Heartbeat`.
    pub heartbeat_interval_ms: u64,
    /// The swarm's frame limit (`delivery.max_frame_bytes`): the router sends no larger frame,
    /// and the peer reads with this limit from here on.
    pub max_frame_bytes: u32,
}

/// Delivery guarantee asked for by a `Send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SendMode {
    /// In the target's SQLite mailbox before `Accepted`; redelivered until acked (the default).
    Durable,
    /// Routed in memory; lost if the target dies before handling it (telemetry-like traffic).
    AtMostOnce,
    /// Durable, and the start of a chain of its own: the runtime's upkeep (the observer waking
    /// reflection), which is not charged to the input its sender happens to be working on.
    /// Models cannot ask for it (`agents__send` takes `durable` or `at_most_once`); a program
    /// that sends between turns starts a chain anyway.
    Upkeep,
}

/// Whether a delivery is a plain message or a request that expects a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryKind {
    Message,
    Request,
    /// A channel notification: the messages new to this agent since its cursor.
    Delta,
    /// The final answer of an agent this one delegated to (`Delegate`); this turn's own answer
    /// goes on to whoever waits for it.
    Result,
}

/// One input handed to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    pub kind: DeliveryKind,
    /// Who sent it (agent name or `operator`), as established by the router.
    pub sender: String,
    pub text: String,
    /// 1 on first delivery; higher when redelivered after a crash.
    pub attempt: u32,
    /// False for `at_most_once` messages (no `Ack` expected).
    pub durable: bool,
    /// `agent@instance` of every agent whose request led to this one, oldest first.
    pub call_chain: Vec<String>,
    /// The channel this input belongs to (deltas), so it lands in that channel's session.
    pub channel: Option<String>,
    /// Who gets this turn's final answer, delivered by the router (an agent as a `Result`
    /// input, or `human:NAME` as a post in their DM with this agent); `None`: nobody waits.
    pub answer_to: Option<String>,
    /// The chain of turns this input belongs to: the id of the outside input that started it.
    pub chain: Option<MsgId>,
}

impl Delivery {
    /// A first delivery outside any chain and conversation (the raw `at_most_once` path).
    pub fn raw(kind: DeliveryKind, sender: String, text: String, durable: bool) -> Delivery {
        Delivery {
            kind,
            sender,
            text,
            attempt: 1,
            durable,
            call_chain: Vec::new(),
            channel: None,
            answer_to: None,
            chain: None,
        }
    }

    /// The frame that hands this input to agent `to`, from its sender, as message `id`.
    pub fn frame(self, id: MsgId, to: String, deadline_ms: Option<u64>) -> Frame {
        Frame {
            id,
            from: self.sender.clone(),
            to,
            correlation_id: None,
            deadline_ms,
            body: Body::Deliver(self),
        }
    }
}

/// How a chain of turns ended (see [`Body::ChainEnded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChainOutcome {
    /// The person who started it got their answer.
    Answered,
    /// The router stopped it at a budget (hops, tokens, wall time); the person was told.
    Stopped,
    /// Every turn finished and nobody was waiting for an answer (or none could be given).
    Ended,
}

impl ChainOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            ChainOutcome::Answered => "answered",
            ChainOutcome::Stopped => "stopped",
            ChainOutcome::Ended => "ended",
        }
    }
}

/// The end of a chain, for whoever watches it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainEnd {
    pub chain: MsgId,
    pub outcome: ChainOutcome,
    /// The answer, or what the person was told when the chain was stopped.
    pub text: String,
    /// The agent that answered (or that the person addressed).
    pub by: String,
    /// The DM channel the answer was posted in and its seq (empty / 0 when nothing was posted).
    pub channel: String,
    pub seq: u64,
    pub hops: u32,
    pub tokens: u64,
    pub elapsed_ms: u64,
}

/// One chain of turns in flight, for `flockctl chains`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainRow {
    pub id: MsgId,
    /// Who started it: `human:NAME`, or the agent whose send began it outside any turn.
    pub origin: String,
    /// Whom the outside input addressed.
    pub entry: String,
    /// The start of the input's text.
    pub text: String,
    /// `running`, `answered` (still finishing background turns), or `stopped: REASON`.
    pub state: String,
    pub hops: u32,
    pub max_hops: u32,
    pub tokens: u64,
    pub max_tokens: u64,
    pub age_ms: u64,
    pub max_wall_ms: u64,
    /// Deliveries of the chain queued or in progress.
    pub live: u32,
}

/// Requests `flockctl` makes on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Every live actor and process.
    Ps,
    /// Last `lines` log lines of an agent (answered with `LogLines`); with `follow`, keep
    /// streaming. Without an agent: the last `lines` of every log (agents, the model, the
    /// bridges), in order of time, then with `follow` every new line of any of them, agents
    /// created later included (answered with `SourcedLogLines`).
    Logs {
        agent: Option<String>,
        lines: u32,
        follow: bool,
    },
    Stop {
        agent: String,
    },
    Start {
        agent: String,
    },
    Restart {
        agent: String,
    },
    /// Messages that exhausted their delivery attempts, oldest first: `limit` of them after the
    /// first `offset` (texts cut to a preview).
    DeadLetters {
        offset: u32,
        limit: u32,
    },
    /// Stop every agent (reverse order) and then the supervisor.
    Down,
    /// An agent's stored sessions: one channel's messages, or a list of its sessions.
    Session {
        agent: String,
        channel: Option<String>,
    },
    /// Run a channel tool (`flock_channel_post`, …) as `human:<as_name>`; `arguments` is JSON.
    Channel {
        tool: String,
        arguments: String,
        as_name: String,
    },
    /// Tell this connection when chain `chain` ends (`Body::ChainEnded`, correlated to this
    /// request's frame id); an unknown chain is an `Error`.
    Watch {
        chain: MsgId,
    },
    /// The chains of turns in flight, with their budgets.
    Chains,
    /// The chat bridges: state, process, mappings, counters (a JSON array in `Json`).
    Bridges,
    /// A memory read (`memory_search` or `memory_get`, `arguments` as JSON) answered by the
    /// running swarm's memory thread, which holds the index and the embedding model warm: the
    /// tool's JSON in `Json`.
    Memory {
        tool: String,
        arguments: String,
    },
    /// The lines of an agent's log after its line number `after` that the supervisor still
    /// holds (`None`: its last `lines`), answered with `LogPage`: how another host follows the
    /// log (`flockctl logs AGENT -f` there).
    LogPage {
        agent: String,
        after: Option<u64>,
        lines: u32,
    },
}

/// Answers on the control socket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControlReply {
    Ps(Vec<PsRow>),
    /// Log lines, oldest first; more may follow when following.
    LogLines(Vec<String>),
    /// Log lines of several logs, each with the log it comes from, oldest first; more may follow
    /// when following.
    SourcedLogLines(Vec<SourcedLine>),
    DeadLetters(Vec<DeadLetter>),
    /// The request was carried out; a human-readable confirmation.
    Done(String),
    /// A tool's JSON result.
    Json(String),
    Chains(Vec<ChainRow>),
    /// Lines of a log (`ControlRequest::LogPage`), and the number of the last line of that log
    /// so far (ask for the lines after it next).
    LogPage {
        lines: Vec<String>,
        next: u64,
    },
}

/// A line of one of the swarm's logs (`flockctl logs` without an agent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourcedLine {
    /// The log's name: an agent, the model, a bridge; empty for a note of the supervisor's
    /// (e.g. lines skipped for a slow client).
    pub source: String,
    pub line: String,
}

/// One row of `flockctl ps`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PsRow {
    pub name: String,
    /// `agent` for agent processes, `actor` for the orchestrator's actors, `supervisor` for itself.
    pub kind: String,
    pub role: String,
    pub pid: Option<u32>,
    /// `starting|ready|busy|backoff|stopping|stopped|failed|exited(…)`; `running` for actors.
    pub state: String,
    pub uptime_secs: u64,
    pub restarts: u32,
    pub last_exit: Option<String>,
    /// Messages waiting for (or being handled by) this agent.
    pub mailbox_depth: u64,
    /// Completed turns, persisted across restarts.
    pub turns_total: u64,
    pub rss_bytes: Option<u64>,
    /// Model tokens used (prompt / completion), persisted across restarts.
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Where a worker's commands run (`native`, `docker`); `None` for everything else.
    pub sandbox: Option<String>,
    /// Agents: whether the process runs in its cage (`false`: `unconfined: true`, or a kernel
    /// that cannot cage it); `None` for everything else.
    pub confined: Option<bool>,
    /// The host it runs on, in a swarm across hosts (`None` on one host).
    pub host: Option<String>,
}

/// A message that could not be delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub id: MsgId,
    pub sender: String,
    pub target: String,
    pub text: String,
    pub attempts: u32,
    pub reason: String,
}
