//! The channels actor: channels, membership, seq numbers, delta notifications, agent states,
//! A2A cards and the archive protocol (DESIGN.md §8). Every `flock_*` tool call lands here with
//! the caller's identity taken from its connection (agents) or from `flockctl` (humans), and the
//! caller's powers are checked here, in code.
//!
//! Deltas: per (agent, channel) a durable cursor `sent_seq` (delivered and acknowledged) and
//! `scheduled_seq` (handed to a notification in flight). A post raises `scheduled_seq` and arms one
//! timer per (agent, channel) — bursts inside the delay coalesce into one notification. When the
//! timer fires, the router delivers the rendered delta as a turn input; the agent's `Ack` moves
//! `sent_seq` up; a failure rolls `scheduled_seq` back and the next post (or the agent becoming
//! ready) retries. Nothing at or below `sent_seq` is ever sent again, across any restart.

pub mod bridge;
pub mod delta;
pub mod store;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use flock_config::{AgentSpec, Role, SwarmSpec};
use flock_ipc::{Body, ErrorCode, Frame, MsgId, Outbox, ROUTER};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde_json::{Value, json};
use tokio::sync::oneshot;

pub use self::bridge::is_bridge_tool;
use self::bridge::{ParkedPull, PostKey};
use self::delta::{dm_channel_id, mentions, strip_hash, valid_channel_id};
use self::store::{Ask, Card, ChannelRow, ChannelState, Cursor, PostExtra, UniqueKey};
use crate::chains::{ChainTag, ReplyPlace};
use crate::journal::{Journal, JournalEvent, Status};
use crate::router::{AnswerPosted, RouterMsg};
use crate::store::{Store, StoreError, now_ms};
use crate::store_actor::{StoreMsg, with_store};

/// Tools this actor answers: those the tool table gives it (`flock_*` and `agents__spawn`).
pub fn is_channel_tool(name: &str) -> bool {
    flock_config::tools::owner(name) == Some(flock_config::Owner::Channels)
}

/// Swarm changes the channels actor asks the supervisor for (it spawns and stops processes).
#[derive(Debug)]
pub enum AgentOp {
    /// Route to and spawn a new agent; answers once it is ready (or could not start).
    Create { spec: Box<AgentSpec>, reply: oneshot::Sender<Result<String, String>> },
    /// Stop an agent for good and stop routing to it.
    Decommission { name: String },
}

pub type AgentOps = Arc<dyn Fn(AgentOp) + Send + Sync>;

/// Page size of `flock_channel_read` when none is asked for, and its maximum.
const READ_DEFAULT: usize = 50;
const READ_MAX: usize = 200;

/// Who is calling, as established by the connection — never by tool arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Agent name, or `human:<name>`.
    pub id: String,
    /// `None` for humans.
    pub role: Option<Role>,
}

impl Caller {
    fn is_human(&self) -> bool {
        self.role.is_none()
    }
    fn may(&self, tool: &str) -> bool {
        self.role.is_none_or(|role| role.may_use(tool))
    }
}

/// Agent attention states (DESIGN.md §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    Awake,
    Sleep,
    Reactive,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Awake => "AWAKE",
            AgentState::Sleep => "SLEEP",
            AgentState::Reactive => "REACTIVE",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s {
            "AWAKE" => Some(AgentState::Awake),
            "SLEEP" => Some(AgentState::Sleep),
            "REACTIVE" => Some(AgentState::Reactive),
            _ => None,
        }
    }
}

/// Where the answer to an agent's tool call goes.
#[derive(Debug, Clone)]
pub struct ToolReply {
    pub outbox: Outbox,
    pub frame_id: MsgId,
    pub to: String,
}

pub type ToolResult = Result<String, (ErrorCode, String)>;

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
    /// as a reply where they asked (`place`), else in their DM (created if needed); the router
    /// hears back through [`RouterMsg::Answered`].
    Answer {
        agent: String,
        human: String,
        text: String,
        chain: MsgId,
        msg: Option<MsgId>,
        place: Option<ReplyPlace>,
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
    /// Wiring: the router, once it exists.
    SetRouter(ActorRef<RouterMsg>),
    /// A `bridge__*` call from the chat bridge `bridge` (identity from its connection).
    Bridge { bridge: String, name: String, arguments: String, reply: ToolReply },
    /// The wait of a parked `bridge__pull` ran out.
    PullExpired { bridge: String, external: String, frame_id: MsgId },
}

pub struct ChannelsArgs {
    pub spec: Arc<SwarmSpec>,
    pub store: ActorRef<StoreMsg>,
    pub journal: Option<Arc<Journal>>,
    /// How to create and decommission agents (`None`: those tools answer INTERNAL).
    pub agent_ops: Option<AgentOps>,
}

pub struct Channels;

pub struct ChannelsState {
    spec: Arc<SwarmSpec>,
    /// Every agent in service: the swarm file's, then those created at run time.
    agents: Vec<AgentSpec>,
    agent_ops: Option<AgentOps>,
    store: ActorRef<StoreMsg>,
    router: Option<ActorRef<RouterMsg>>,
    journal: Option<Arc<Journal>>,
    channels: HashMap<String, ChannelRow>,
    cursors: HashMap<(String, String), Cursor>,
    states: HashMap<String, AgentState>,
    cards: HashMap<String, Card>,
    /// (agent, channel) pairs with a delta timer armed or a delta in flight.
    armed: HashSet<(String, String)>,
    /// Deltas that failed, by (agent, channel): the seq to retry up to when the agent is back.
    retry: HashMap<(String, String), u64>,
    myself: Option<ActorRef<ChannelsMsg>>,
    /// The chain of the tool call being run (set around each agent's call).
    current_chain: Option<(ChainTag, u32)>,
    /// Whether that call's turn owes a person their answer.
    current_answers: bool,
    /// People's posts a chain is working on, per channel (what bridges show as typing).
    working: HashMap<String, std::collections::BTreeSet<u64>>,
    /// Per (agent, channel): the chain of the newest post waiting in its delta.
    delta_chain: HashMap<(String, String), (ChainTag, u32)>,
    /// Bridge pulls waiting for a post, by (bridge, external chat).
    pulls: HashMap<(String, String), ParkedPull>,
    /// Refused platform messages already journaled.
    refused: bridge::Refused,
}

impl Actor for Channels {
    type Msg = ChannelsMsg;
    type State = ChannelsState;
    type Arguments = ChannelsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ChannelsMsg>,
        args: ChannelsArgs,
    ) -> Result<ChannelsState, ActorProcessingErr> {
        let (channels, cursors, states, cards) = with_store(&args.store, |s| {
            Ok((s.channels()?, s.cursors()?, s.agent_states()?, s.cards()?))
        })
        .await
        .map_err(|e| format!("load channels: {e}"))?;
        let mut st = ChannelsState {
            agents: args.spec.agents.clone(),
            agent_ops: args.agent_ops,
            spec: args.spec,
            store: args.store,
            router: None,
            journal: args.journal,
            channels: channels.into_iter().map(|c| (c.id.clone(), c)).collect(),
            cursors: cursors.into_iter().map(|(a, c, cur)| ((a, c), cur)).collect(),
            states: states
                .into_iter()
                .filter_map(|(a, s)| AgentState::parse(&s).map(|s| (a, s)))
                .collect(),
            cards: cards.into_iter().map(|c| (c.agent.clone(), c)).collect(),
            armed: HashSet::new(),
            retry: HashMap::new(),
            myself: Some(myself.clone()),
            current_chain: None,
            current_answers: false,
            working: HashMap::new(),
            delta_chain: HashMap::new(),
            pulls: HashMap::new(),
            refused: bridge::Refused::default(),
        };
        // Mappings changed at run time (`flockctl bridge map|unmap`) stand over the file's.
        let changes = st
            .db(|s| s.bridge_mapping_changes())
            .await
            .map_err(|(_, e)| format!("bridge mappings: {e}"))?;
        if !changes.is_empty() {
            bridge::apply_mapping_changes(&mut Arc::make_mut(&mut st.spec).bridges, &changes);
        }
        st.ensure_bridge_channels().await.map_err(|(_, e)| format!("bridge channels: {e}"))?;
        // Requests that wait for a person are announced where people approve from chat (again:
        // an announcement lost in a crash is made now; one made already is not repeated).
        if st.spec.bridges.iter().any(|b| b.approvals.is_some()) {
            let waiting = st.db(|s| s.permissions_waiting()).await.unwrap_or_default();
            for r in waiting {
                let what = format!("{} {}", r.capability, r.target);
                let why = "waits for a person";
                st.announce_permission(&myself, r.id, &r.agent, &what, &r.reason, why).await;
            }
        }
        // Archive deadlines survive restarts.
        let now = now_ms();
        for c in st.channels.values() {
            if let (ChannelState::Archiving, Some(deadline)) = (c.state, c.archive_deadline_at) {
                let wait = Duration::from_millis(deadline.saturating_sub(now).max(0) as u64);
                let channel = c.id.clone();
                myself.send_after(wait, move || ChannelsMsg::ArchiveDeadline { channel });
            }
        }
        // A delta that was in flight when the supervisor stopped was never acknowledged: its
        // messages are still new to the agent (not a replay), so it is scheduled again.
        let unfinished: Vec<(String, String)> = st
            .cursors
            .iter()
            .filter(|(_, c)| c.scheduled_seq > c.sent_seq)
            .map(|(k, _)| k.clone())
            .collect();
        for (agent, channel) in unfinished {
            if let Some(c) = st.cursors.get_mut(&(agent.clone(), channel.clone())) {
                c.scheduled_seq = c.sent_seq;
            }
            let upto = st.channels.get(&channel).map_or(0, |c| c.last_seq);
            st.schedule(&myself, &agent, &channel, upto).await;
        }
        Ok(st)
    }

    async fn handle(
        &self,
        myself: ActorRef<ChannelsMsg>,
        msg: ChannelsMsg,
        st: &mut ChannelsState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChannelsMsg::SetRouter(r) => st.router = Some(r),
            ChannelsMsg::Tool { caller, name, arguments, chain, answers, reply } => {
                st.current_chain = chain;
                st.current_answers = answers;
                let result = st.tool(&myself, &caller, &name, &arguments).await;
                st.current_chain = None;
                st.current_answers = false;
                reply.send(result);
            }
            ChannelsMsg::Human { caller, name, arguments, reply } => {
                // Only people (the control socket) change a bridge's mappings.
                let result = if name == "bridge_map" {
                    st.bridge_map(&caller.id, &arguments).await
                } else {
                    st.tool(&myself, &caller, &name, &arguments).await
                };
                let _ = reply.send(result);
            }
            ChannelsMsg::Working { channel, seq, on } => {
                let seqs = st.working.entry(channel.clone()).or_default();
                let changed = if on { seqs.insert(seq) } else { seqs.remove(&seq) };
                if seqs.is_empty() {
                    st.working.remove(&channel);
                }
                if changed {
                    st.wake_pulls(&channel).await;
                }
            }
            ChannelsMsg::PermissionWaiting { id, agent, what, reason, why } => {
                st.announce_permission(&myself, id, &agent, &what, &reason, &why).await;
            }
            ChannelsMsg::Answer { agent, human, text, chain, msg, place } => {
                let outcome = st.answer(&myself, &agent, &human, &text, chain, place).await;
                let posted = AnswerPosted {
                    chain,
                    agent,
                    human,
                    text,
                    msg,
                    outcome: outcome.map_err(|(code, m)| format!("{code}: {m}")),
                };
                if let Some(r) = &st.router {
                    let _ = r.cast(RouterMsg::Answered(posted));
                }
            }
            ChannelsMsg::DeltaDue { agent, channel } => st.send_delta(&agent, &channel).await,
            ChannelsMsg::DeltaDone { agent, channel, upto, ok } => {
                st.delta_done(&myself, &agent, &channel, upto, ok).await;
            }
            ChannelsMsg::AgentReady { agent } => {
                // Retry deltas that failed while the agent was away; an AWAKE agent also gets
                // whatever its channels received since its cursor.
                let awake = st.state_of(&agent) == AgentState::Awake;
                let mut due: Vec<(String, u64)> = Vec::new();
                for c in st.channels.values().filter(|c| c.members.contains(&agent)) {
                    let key = (agent.clone(), c.id.clone());
                    let sent = st.cursors.get(&key).map_or(0, |cur| cur.sent_seq);
                    if let Some(upto) = st.retry.remove(&key) {
                        due.push((c.id.clone(), upto.max(if awake { c.last_seq } else { 0 })));
                    } else if awake && c.last_seq > sent && c.state != ChannelState::Archived {
                        due.push((c.id.clone(), c.last_seq));
                    }
                }
                for (channel, upto) in due {
                    st.schedule(&myself, &agent, &channel, upto).await;
                }
            }
            ChannelsMsg::ArchiveDeadline { channel } => st.archive_deadline(&channel).await,
            ChannelsMsg::Bridge { bridge, name, arguments, reply } => {
                st.bridge_tool(&myself, &bridge, &name, &arguments, reply).await;
            }
            ChannelsMsg::PullExpired { bridge, external, frame_id } => {
                st.pull_expired(bridge, external, frame_id).await;
            }
        }
        Ok(())
    }
}

/// A description, refused past [`flock_config::MAX_DESCRIPTION_BYTES`] (every catalog shows it).
fn described(text: &str) -> Result<String, (ErrorCode, String)> {
    if text.len() > flock_config::MAX_DESCRIPTION_BYTES {
        return Err(bad(format!(
            "`description` is {} bytes long; at most {} are allowed",
            text.len(),
            flock_config::MAX_DESCRIPTION_BYTES
        )));
    }
    Ok(text.to_owned())
}

fn bad(msg: impl Into<String>) -> (ErrorCode, String) {
    (ErrorCode::BadRequest, msg.into())
}

fn internal(msg: impl std::fmt::Display) -> (ErrorCode, String) {
    (ErrorCode::Internal, msg.to_string())
}

fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

fn list_arg(args: &Value, key: &str) -> Result<Vec<String>, (ErrorCode, String)> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("`{key}` must be a list of strings")))
            })
            .collect(),
        Some(_) => Err(bad(format!("`{key}` must be a list of strings"))),
    }
}

/// One line for the journal saying what a successful tool call did.
fn summary(tool: &str, args: &Value, result: &str) -> String {
    let r: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    let quote = |text: &str| {
        let mut t: String = text.chars().take(120).collect();
        if text.chars().count() > 120 {
            t.push('…');
        }
        format!("{t:?}")
    };
    match tool {
        "flock_channel_post" | "flock_message" => format!(
            "#{} seq {}: {}",
            s(&r["channel"]),
            r["seq"],
            quote(args["text"].as_str().unwrap_or_default())
        ),
        "flock_channel_create" => {
            format!("created #{} {:?} members {}", s(&r["channel"]), s(&r["topic"]), r["members"])
        }
        "flock_assign_members" => format!("#{} members now {}", s(&r["channel"]), r["members"]),
        "flock_channel_archive" => format!("#{} {}", s(&r["channel"]), s(&r["state"])),
        "flock_archive_ready" => {
            format!("ready to archive #{} (now {})", s(&r["channel"]), s(&r["state"]))
        }
        "flock_update_card" => {
            format!("card: {} skills {}", quote(&s(&r["description"])), r["skills"])
        }
        "flock_sleep" => "asleep until mentioned".into(),
        "flock_channel_read" => format!(
            "read #{} ({} messages)",
            s(&r["channel"]),
            r["messages"].as_array().map_or(0, Vec::len)
        ),
        "flock_channel_list" => format!("listed {} channels", r.as_array().map_or(0, Vec::len)),
        "flock_discover" => format!("found {} agents", r.as_array().map_or(0, Vec::len)),
        "flock_create_agent" => format!("created agent {} ({})", s(&r["name"]), s(&r["role"])),
        "flock_decommission_agent" => format!("decommissioned {}", s(&r["name"])),
        "agents__spawn" => format!("spawned {}", s(&r["address"])),
        _ => result.chars().take(200).collect(),
    }
}

fn iso(ms: i64) -> String {
    crate::journal::format_timestamp(ms.max(0) as u64)
}

impl ChannelsState {
    /// The swarm file's agents with their roles (default peers of a created agent's extensions).
    fn peers(&self) -> Vec<(String, flock_config::Role)> {
        self.spec.agents.iter().map(|a| (a.key(), a.role)).collect()
    }

    async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, (ErrorCode, String)> {
        with_store(&self.store, f).await.map_err(internal)
    }

    fn journal(&self, event: JournalEvent) {
        if let Some(j) = &self.journal
            && let Err(e) = j.append(&event)
        {
            tracing::error!(error = %e, "flock channels: journal append failed");
        }
    }

    /// The agent or spawned instance at this address (`name` or `name@instance`).
    fn agent(&self, key: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.key() == key)
    }

    fn role_of(&self, agent: &str) -> Option<Role> {
        self.agent(agent).map(|a| a.role)
    }

    fn is_agent(&self, id: &str) -> bool {
        self.agent(id).is_some()
    }

    fn state_of(&self, agent: &str) -> AgentState {
        self.states.get(agent).copied().unwrap_or(match self.role_of(agent) {
            Some(Role::Sysadmin) => AgentState::Reactive,
            _ => AgentState::Awake,
        })
    }

    /// Checks that every name is an agent of the swarm or `human:<name>`.
    fn check_participants(&self, names: &[String]) -> Result<(), (ErrorCode, String)> {
        for n in names {
            let human = n.strip_prefix("human:").is_some_and(|h| !h.is_empty());
            if !human && !self.is_agent(n) {
                let known: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
                return Err((
                    ErrorCode::AgentNotFound,
                    format!("`{n}` is neither an agent ({}) nor `human:<name>`", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    fn channel(&self, arg: Option<&str>) -> Result<&ChannelRow, (ErrorCode, String)> {
        let id = strip_hash(arg.ok_or_else(|| bad("`channel` is required"))?);
        self.channels.get(id).ok_or_else(|| {
            bad(format!("no channel `#{id}`; flock_channel_list shows the channels"))
        })
    }

    /// Runs one tool for `caller`; every call is journaled with its outcome.
    async fn tool(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        name: &str,
        arguments: &str,
    ) -> ToolResult {
        let args: Value = match serde_json::from_str(if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        }) {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(bad("tool arguments must be a JSON object")),
        };
        let result = if !is_channel_tool(name) {
            let tools: Vec<&str> =
                flock_config::tools::model_tools().filter(|t| is_channel_tool(t)).collect();
            Err(bad(format!("no channel tool `{name}`; available: {}", tools.join(", "))))
        } else if !caller.may(name) {
            Err((
                ErrorCode::Forbidden,
                format!(
                    "`{}` is a {} and may not call {name}: only the orchestrator (or a human through flockctl) may",
                    caller.id,
                    caller.role.map_or("human", Role::as_str)
                ),
            ))
        } else {
            self.run(myself, caller, name, &args).await
        };
        // Reads by people (`flockctl read`, `channels`) are not events; everything else is.
        let read_only =
            matches!(name, "flock_channel_read" | "flock_channel_list" | "flock_discover");
        if read_only && caller.is_human() && result.is_ok() {
            return result;
        }
        let (status, message) = match &result {
            Ok(r) => (Status::Success, summary(name, &args, r)),
            Err((code, msg)) => (Status::Failed, format!("{code}: {msg}")),
        };
        let mut event = JournalEvent::new(&caller.id, name.to_ascii_uppercase(), status, &message)
            .param("tool", json!(name))
            .param("arguments", args);
        if matches!(&result, Err((ErrorCode::Forbidden, _))) {
            event = event.param("forbidden", Value::Bool(true));
        }
        self.journal(event);
        result
    }

    async fn run(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        name: &str,
        args: &Value,
    ) -> ToolResult {
        match name {
            "flock_channel_create" => {
                let id = strip_hash(
                    str_arg(args, "channel")
                        .or_else(|| str_arg(args, "id"))
                        .ok_or_else(|| bad("`channel` (the new channel's id) is required"))?,
                )
                .to_owned();
                if !valid_channel_id(&id) {
                    return Err(bad(format!(
                        "`{id}` is not a valid channel id: use 1–63 of a-z, 0-9 and -, starting with a letter or digit"
                    )));
                }
                if self.channels.contains_key(&id) {
                    return Err(bad(format!("channel `#{id}` already exists")));
                }
                let mut members = list_arg(args, "members")?;
                self.check_participants(&members)?;
                if !members.contains(&caller.id) {
                    members.insert(0, caller.id.clone());
                }
                let name = str_arg(args, "name").unwrap_or(&id).to_owned();
                let topic = str_arg(args, "topic").unwrap_or_default();
                let row = ChannelRow::new(&id, &name, topic, &caller.id, false, members);
                self.add_channel(row.clone()).await?;
                self.mirror_new_channel(&id).await;
                Ok(json!({"channel": id, "topic": row.topic, "members": row.members}).to_string())
            }
            "flock_channel_post" => {
                let channel = self.channel(str_arg(args, "channel"))?.id.clone();
                let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
                // The agent that owes a person their answer, posting where they asked: this
                // post is the answer (a reply to theirs), so the runtime posts no second one.
                let answer = self
                    .current_chain
                    .as_ref()
                    .filter(|_| self.current_answers)
                    .and_then(|(tag, _)| Some((tag.id, tag.reply.clone()?)))
                    .filter(|(_, place)| place.channel == channel);
                if let Some((chain, place)) = answer {
                    let key = PostKey::Answer(chain);
                    let (seq, duplicate) = self
                        .post_keyed(myself, &channel, &caller.id, text, key, Some(place.seq), false)
                        .await?;
                    if !duplicate {
                        return Ok(json!({"channel": channel, "seq": seq}).to_string());
                    }
                }
                let (seq, _) = self.post(myself, &channel, &caller.id, text, None).await?;
                Ok(json!({"channel": channel, "seq": seq}).to_string())
            }
            "flock_channel_read" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                let limit = args
                    .get("limit")
                    .and_then(Value::as_u64)
                    .map_or(READ_DEFAULT, |l| (l as usize).clamp(1, READ_MAX));
                let id = ch.id.clone();
                let messages = match args.get("after").and_then(Value::as_u64) {
                    Some(after) => self.db(move |s| s.messages_after(&id, after, limit)).await?,
                    // No cursor: the newest page, so the end of a long channel is one call away.
                    None => {
                        let last = ch.last_seq;
                        self.db(move |s| s.messages_between(&id, 0, last, limit)).await?
                    }
                };
                // A page stays well inside one frame: messages are cut off by bytes as well as
                // by count (always at least one; each is at most a message's limit).
                let budget = self.spec.delivery.max_frame_bytes as usize / 4;
                let mut used = 0;
                let keep = messages
                    .iter()
                    .take_while(|m| {
                        used += m.text.len() + m.author.len();
                        used <= budget
                    })
                    .count()
                    .max(1);
                let mut messages = messages;
                messages.truncate(keep);
                let next_after = messages.last().map(|m| m.seq);
                Ok(json!({
                    "channel": ch.id, "name": ch.name, "topic": ch.topic, "state": ch.state.as_str(),
                    "last_seq": ch.last_seq,
                    "messages": messages.iter().map(|m| json!({"seq": m.seq, "author": m.author, "text": m.text})).collect::<Vec<_>>(),
                    "more_after": next_after.filter(|s| *s < ch.last_seq),
                })
                .to_string())
            }
            "flock_channel_list" => {
                let mut list: Vec<&ChannelRow> = self.channels.values().collect();
                list.sort_by_key(|c| (c.created_at, c.id.clone()));
                let v: Vec<Value> = list
                    .iter()
                    .map(|c| {
                        json!({"channel": c.id, "name": c.name, "topic": c.topic, "state": c.state.as_str(),
                               "members": c.members, "last_seq": c.last_seq, "dm": c.is_dm,
                               "member": c.members.contains(&caller.id)})
                    })
                    .collect();
                Ok(Value::Array(v).to_string())
            }
            "flock_assign_members" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if ch.state == ChannelState::Archived {
                    return Err(bad(format!("#{} is archived; its members cannot change", ch.id)));
                }
                let add = list_arg(args, "add")?;
                let remove = list_arg(args, "remove")?;
                self.check_participants(&add)?;
                let (id, a, r) = (ch.id.clone(), add.clone(), remove.clone());
                self.db(move |s| s.change_members(&id, &a, &r)).await?;
                let c =
                    self.channels.get_mut(&ch.id).ok_or_else(|| internal("channel vanished"))?;
                for m in &add {
                    if !c.members.contains(m) {
                        c.members.push(m.clone());
                    }
                }
                c.members.retain(|m| !remove.contains(m));
                c.ready.retain(|m| !remove.contains(m));
                let members = c.members.clone();
                // Readiness is re-evaluated whenever membership changes.
                if ch.state == ChannelState::Archiving {
                    self.evaluate_archive(&ch.id).await;
                }
                Ok(json!({"channel": ch.id, "members": members}).to_string())
            }
            "flock_channel_archive" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if ch.state == ChannelState::Archived {
                    return Err(bad(format!("#{} is already archived", ch.id)));
                }
                let force = args.get("force").and_then(Value::as_bool).unwrap_or(false);
                if force {
                    self.archive_now(&ch.id, &format!("forced by {}", caller.id)).await?;
                    return Ok(json!({"channel": ch.id, "state": "archived"}).to_string());
                }
                if ch.state == ChannelState::Archiving {
                    return Err(bad(format!("#{} is already being archived", ch.id)));
                }
                self.start_archive(myself, caller, &ch.id).await?;
                let c = &self.channels[&ch.id];
                Ok(json!({"channel": ch.id, "state": c.state.as_str(),
                          "deadline": c.archive_deadline_at.map(iso)})
                .to_string())
            }
            "flock_archive_ready" => {
                let ch = self.channel(str_arg(args, "channel"))?.clone();
                if !ch.members.contains(&caller.id) {
                    return Err(bad(format!("`{}` is not a member of #{}", caller.id, ch.id)));
                }
                if ch.state != ChannelState::Archiving {
                    return Err(bad(format!(
                        "#{} is {}, not being archived",
                        ch.id,
                        ch.state.as_str()
                    )));
                }
                let (id, who) = (ch.id.clone(), caller.id.clone());
                self.db(move |s| s.mark_archive_ready(&id, &who)).await?;
                if let Some(c) = self.channels.get_mut(&ch.id)
                    && !c.ready.contains(&caller.id)
                {
                    c.ready.push(caller.id.clone());
                }
                // A repeated "ready" re-checks completion too.
                self.evaluate_archive(&ch.id).await;
                Ok(json!({"channel": ch.id, "state": self.channels[&ch.id].state.as_str()})
                    .to_string())
            }
            "flock_message" => {
                let to = str_arg(args, "to").ok_or_else(|| bad("`to` is required"))?.to_owned();
                let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
                self.check_participants(std::slice::from_ref(&to))?;
                if to == caller.id {
                    return Err(bad("a DM needs someone else"));
                }
                let id = self.ensure_dm(&caller.id, &to).await?;
                let (seq, _) = self.post(myself, &id, &caller.id, text, None).await?;
                Ok(json!({"channel": id, "seq": seq}).to_string())
            }
            "flock_discover" => {
                let query = str_arg(args, "query").unwrap_or_default().to_lowercase();
                let role = str_arg(args, "role").map(str::to_lowercase);
                let skill = str_arg(args, "skill").map(str::to_lowercase);
                let found: Vec<Value> = self
                    .agents
                    .iter()
                    .filter_map(|a| {
                        let card = self.cards.get(&a.name).cloned().unwrap_or_default();
                        let description = if card.description.is_empty() { a.description.clone() } else { card.description.clone() };
                        let haystack = format!(
                            "{} {} {} {} {} {}",
                            a.name, a.role.as_str(), a.archetype.clone().unwrap_or_default(), description,
                            card.skills.join(" "), card.tags.join(" ")
                        )
                        .to_lowercase();
                        let ok = haystack.contains(&query)
                            && role.as_deref().is_none_or(|r| r == a.role.as_str())
                            && skill.as_deref().is_none_or(|s| card.skills.iter().any(|k| k.to_lowercase() == s));
                        ok.then(|| {
                            json!({"name": a.name, "role": a.role.as_str(), "archetype": a.archetype,
                                   "description": description, "skills": card.skills, "tags": card.tags,
                                   "state": self.state_of(&a.name).as_str()})
                        })
                    })
                    .collect();
                Ok(Value::Array(found).to_string())
            }
            "flock_update_card" => {
                if caller.is_human() {
                    return Err(bad("cards belong to agents"));
                }
                let mut card = self
                    .cards
                    .get(&caller.id)
                    .cloned()
                    .unwrap_or_else(|| Card { agent: caller.id.clone(), ..Card::default() });
                if let Some(d) = str_arg(args, "description") {
                    card.description = described(d)?;
                }
                if args.get("skills").is_some() {
                    card.skills = list_arg(args, "skills")?;
                }
                if args.get("tags").is_some() {
                    card.tags = list_arg(args, "tags")?;
                }
                let c = card.clone();
                self.db(move |s| s.put_card(&c)).await?;
                self.cards.insert(caller.id.clone(), card.clone());
                Ok(json!({"agent": card.agent, "description": card.description, "skills": card.skills, "tags": card.tags}).to_string())
            }
            "flock_sleep" => {
                if caller.is_human() {
                    return Err(bad("humans do not sleep here"));
                }
                self.set_state(&caller.id, AgentState::Sleep).await?;
                Ok(json!({"agent": caller.id, "state": "SLEEP", "wakes_on": "a @mention or a DM"})
                    .to_string())
            }
            "flock_create_agent" => self.create_agent(caller, args).await,
            "agents__spawn" => self.spawn_instance(caller, args).await,
            "flock_decommission_agent" => self.decommission_agent(caller, args).await,
            _ => Err(bad(format!("no channel tool `{name}`"))),
        }
    }

    /// `flock_create_agent {name, role, archetype?, description?, model?}`: a new supervised
    /// agent process, persisted so it comes back after a supervisor restart.
    async fn create_agent(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let name = str_arg(args, "name").ok_or_else(|| bad("`name` is required"))?.to_owned();
        if !flock_config::valid_agent_name(&name) {
            return Err(bad(format!(
                "`{name}` is not a valid agent name: 1–63 of a-z, 0-9 and -, starting with a letter or digit"
            )));
        }
        if flock_config::reserved_agent_name(&name) {
            return Err(bad(format!(
                "`{name}` is reserved: Flock uses it for itself; pick another name"
            )));
        }
        let decommissioned = {
            let n = name.clone();
            self.db(move |s| Ok(s.decommissioned_agents()?.contains(&n))).await?
        };
        if self.is_agent(&name) || decommissioned {
            return Err(bad(format!(
                "an agent named `{name}` exists or existed; pick another name"
            )));
        }
        let role_text = str_arg(args, "role").unwrap_or("worker");
        let Some(role) = Role::ALL.into_iter().find(|r| r.as_str() == role_text) else {
            let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            return Err(bad(format!(
                "unknown role `{role_text}`; use one of {}",
                roles.join(", ")
            )));
        };
        if matches!(role, Role::Orchestrator | Role::Sysadmin) {
            return Err((
                ErrorCode::Forbidden,
                format!("a swarm has one {}; it is declared in the swarm file", role.as_str()),
            ));
        }
        let model_name =
            str_arg(args, "model").map(str::to_owned).or_else(|| self.spec.default_model.clone());
        let Some(model) = model_name.as_ref().and_then(|m| self.spec.models.get(m)).cloned() else {
            let known: Vec<&str> = self.spec.models.keys().map(String::as_str).collect();
            return Err(bad(format!(
                "no model `{}`; models of this swarm: {}",
                model_name.unwrap_or_default(),
                known.join(", ")
            )));
        };
        let spec = AgentSpec {
            name: name.clone(),
            role,
            archetype: str_arg(args, "archetype").map(str::to_owned),
            description: described(str_arg(args, "description").unwrap_or_default())?,
            restart: self.spec.default_restart,
            stop_timeout_secs: self.spec.default_stop_timeout_secs,
            ready_timeout_secs: self.spec.default_ready_timeout_secs,
            workspace: None,
            command: None,
            env: Vec::new(),
            can_call: Vec::new(),
            tools: None,
            sandbox: Default::default(),
            unconfined: false,
            model,
            instance: None,
            extensions: flock_config::ExtensionSpec::defaults(role, &self.peers()),
        };
        let started = self.start_agent(caller, spec, "AGENT_CREATED").await?;
        match started {
            Ok(m) => {
                Ok(json!({"name": name, "role": role.as_str(), "state": "ready", "detail": m})
                    .to_string())
            }
            Err(e) => Err((
                ErrorCode::TargetUnavailable,
                format!("`{name}` was created but did not start: {e}"),
            )),
        }
    }

    /// Persists a new agent (or instance), asks the supervisor to start it and journals the
    /// outcome. The outer error is Flock's; the inner one says why the process did not start.
    async fn start_agent(
        &mut self,
        caller: &Caller,
        spec: AgentSpec,
        event: &str,
    ) -> Result<Result<String, String>, (ErrorCode, String)> {
        let Some(ops) = self.agent_ops.clone() else {
            return Err(internal("this supervisor cannot start agents"));
        };
        let key = spec.key();
        let json_spec = serde_json::to_string(&spec).map_err(internal)?;
        let (k, who) = (key.clone(), caller.id.clone());
        self.db(move |s| s.register_agent(&k, &json_spec, &who)).await?;
        let role = spec.role;
        self.agents.push(spec.clone());
        let (tx, rx) = oneshot::channel();
        ops(AgentOp::Create { spec: Box::new(spec), reply: tx });
        let started = rx.await.map_err(|_| internal("the supervisor dropped the request"))?;
        let (status, message) = match &started {
            Ok(m) => (Status::Success, m.clone()),
            Err(e) => (Status::Failed, e.clone()),
        };
        self.journal(
            JournalEvent::new(&caller.id, event, status, message)
                .param("agent", json!(key))
                .param("role", json!(role.as_str())),
        );
        Ok(started)
    }

    /// `agents__spawn {agent, instance?}`: a new process of a declared agent with its own
    /// instance key, addressed as `agent@instance` (e.g. a worker per conversation). Spawning an
    /// instance that exists answers its address again.
    async fn spawn_instance(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let agent = str_arg(args, "agent").ok_or_else(|| bad("`agent` is required"))?;
        let Some(base) =
            self.agents.iter().find(|a| a.name == agent && a.instance.is_none()).cloned()
        else {
            return Err((ErrorCode::AgentNotFound, format!("no declared agent named `{agent}`")));
        };
        let instance = match str_arg(args, "instance") {
            Some(i) => i.to_owned(),
            None => format!("{:08x}", fastrand::u32(..)),
        };
        if instance == "default" || !flock_config::valid_agent_name(&instance) {
            return Err(bad(format!(
                "`{instance}` is not a valid instance key: 1–63 of a-z, 0-9 and -, not `default`"
            )));
        }
        let key = format!("{agent}@{instance}");
        if self.is_agent(&key) {
            return Ok(json!({"address": key, "state": "ready", "existing": true}).to_string());
        }
        let spec = AgentSpec { instance: Some(instance), ..base };
        match self.start_agent(caller, spec, "AGENT_SPAWNED").await? {
            Ok(_) => Ok(json!({"address": key, "state": "ready"}).to_string()),
            Err(e) => Err((ErrorCode::TargetUnavailable, format!("`{key}` did not start: {e}"))),
        }
    }

    /// `flock_decommission_agent {name}`: stopped for good and removed from every channel; its
    /// messages and journal entries stay.
    async fn decommission_agent(&mut self, caller: &Caller, args: &Value) -> ToolResult {
        let name = str_arg(args, "name").ok_or_else(|| bad("`name` is required"))?.to_owned();
        let Some(role) = self.role_of(&name) else {
            return Err((ErrorCode::AgentNotFound, format!("no agent named `{name}`")));
        };
        if matches!(role, Role::Orchestrator | Role::Sysadmin) || name == caller.id {
            return Err((
                ErrorCode::Forbidden,
                format!("`{name}` ({}) cannot be decommissioned", role.as_str()),
            ));
        }
        let Some(ops) = self.agent_ops.clone() else {
            return Err(internal("this supervisor cannot decommission agents"));
        };
        let n = name.clone();
        self.db(move |s| s.decommission_agent(&n)).await?;
        self.agents.retain(|a| a.key() != name);
        let mut archiving = Vec::new();
        for c in self.channels.values_mut() {
            if c.members.contains(&name) {
                c.members.retain(|m| m != &name);
                c.ready.retain(|m| m != &name);
                if c.state == ChannelState::Archiving {
                    archiving.push(c.id.clone());
                }
            }
        }
        self.cursors.retain(|(a, _), _| a != &name);
        ops(AgentOp::Decommission { name: name.clone() });
        self.journal(
            JournalEvent::new(
                &caller.id,
                "AGENT_DECOMMISSIONED",
                Status::Success,
                format!("{name} decommissioned"),
            )
            .param("agent", json!(name)),
        );
        // Readiness is re-evaluated: the member that left may have been the last one missing.
        for c in archiving {
            self.evaluate_archive(&c).await;
        }
        Ok(json!({"name": name, "state": "decommissioned"}).to_string())
    }

    async fn set_state(
        &mut self,
        agent: &str,
        state: AgentState,
    ) -> Result<(), (ErrorCode, String)> {
        if self.state_of(agent) == state {
            return Ok(());
        }
        let (a, s) = (agent.to_owned(), state.as_str());
        self.db(move |st| st.set_agent_state(&a, s)).await?;
        self.states.insert(agent.to_owned(), state);
        self.journal(JournalEvent::new(
            agent,
            "AGENT_STATE",
            Status::Success,
            format!("{agent} is {}", state.as_str()),
        ));
        Ok(())
    }

    /// The DM channel of `a` and `b`, created (by `a`) if it does not exist yet.
    async fn ensure_dm(&mut self, a: &str, b: &str) -> Result<String, (ErrorCode, String)> {
        let id = dm_channel_id(a, b);
        if !self.channels.contains_key(&id) {
            let members = vec![a.to_owned(), b.to_owned()];
            self.add_channel(ChannelRow::new(&id, &format!("DM {a} / {b}"), "", a, true, members))
                .await?;
        }
        Ok(id)
    }

    /// Stores a new channel and starts keeping it.
    async fn add_channel(&mut self, row: ChannelRow) -> Result<(), (ErrorCode, String)> {
        let r = row.clone();
        self.db(move |s| s.create_channel(&r)).await?;
        self.channels.insert(row.id.clone(), row);
        Ok(())
    }

    /// Posts a chain's answer to a person, once per chain: where they asked, as a reply to
    /// their post (`place`), or in their DM with `agent` (also when the place can no longer
    /// take posts: archived, or gone). Returns the channel, the seq, and whether an answer to
    /// this chain was already there.
    async fn answer(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        human: &str,
        text: &str,
        chain: MsgId,
        place: Option<ReplyPlace>,
    ) -> Result<(String, u64, bool), (ErrorCode, String)> {
        let open = |p: &ReplyPlace| {
            self.channels.get(&p.channel).is_some_and(|c| c.state != ChannelState::Archived)
        };
        if let Some(p) = place.filter(open) {
            let key = PostKey::Answer(chain);
            let (seq, duplicate) =
                self.post_keyed(myself, &p.channel, agent, text, key, Some(p.seq), false).await?;
            return Ok((p.channel, seq, duplicate));
        }
        let id = self.ensure_dm(agent, human).await?;
        let (seq, duplicate) = self.post(myself, &id, agent, text, Some(chain)).await?;
        Ok((id, seq, duplicate))
    }

    /// Appends a message (seq assigned in its insert transaction) and notifies members. With
    /// `answers` (a chain), at most once per chain: a repeat is not posted, and `true` comes
    /// back with the first one's seq.
    async fn post(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        author: &str,
        text: &str,
        answers: Option<MsgId>,
    ) -> Result<(u64, bool), (ErrorCode, String)> {
        let key = answers.map_or(PostKey::None, PostKey::Answer);
        let asks = author.starts_with("human:");
        self.post_keyed(myself, channel, author, text, key, None, asks).await
    }

    /// [`Self::post`] with any [`PostKey`] (a keyed post is made at most once), replying to post
    /// `reply_to` of the channel. With `asks` (a person's own words, not a notice Flock posts
    /// for them), a post that an agent must answer (see [`Self::responder`]) is handed to that
    /// agent as a durable message in the same transaction: the root of a chain whose answer the
    /// runtime posts back here.
    #[allow(clippy::too_many_arguments)]
    async fn post_keyed(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        author: &str,
        text: &str,
        key: PostKey,
        reply_to: Option<u64>,
        asks: bool,
    ) -> Result<(u64, bool), (ErrorCode, String)> {
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        if text.len() > limit {
            return Err(bad(crate::router::too_long("the post", text.len(), limit)));
        }
        let ch =
            self.channels.get(channel).ok_or_else(|| bad(format!("no channel `#{channel}`")))?;
        if ch.state == ChannelState::Archived {
            return Err(bad(format!(
                "#{channel} is archived and read-only: flock_channel_read still works; post in an active channel (flock_channel_list) instead"
            )));
        }
        let ask = (asks && author.starts_with("human:"))
            .then(|| self.responder(ch, text))
            .flatten()
            .map(|agent| {
                let id = flock_ipc::id::new_id();
                let route = crate::chains::Route::root(
                    id,
                    author,
                    &agent,
                    text,
                    now_ms() as u64,
                    Some(author.to_owned()),
                );
                Ask { agent, text: text.to_owned(), id, route }
            });
        let extra = PostExtra { reply_to, ask };
        let (c, a, t) = (channel.to_owned(), author.to_owned(), text.to_owned());
        let (seq, duplicate, ask) = self
            .db(move |s| {
                let key = match key {
                    PostKey::None => None,
                    PostKey::Answer(chain) => {
                        Some(UniqueKey::Answers(chain.to_be_bytes().to_vec()))
                    }
                    PostKey::Origin(origin) => Some(UniqueKey::Origin(origin)),
                };
                s.post_unique(&c, &a, &t, key, extra)
            })
            .await?;
        if duplicate {
            return Ok((seq, true));
        }
        crate::metrics::get().channel_post(channel);
        let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
        ch.last_seq = seq;
        let members = ch.members.clone();
        let is_dm = ch.is_dm;
        let mentioned = mentions(text);
        let asked = ask.as_ref().map(|a| a.agent.clone());
        let mut notify_now = Vec::new();
        for m in members {
            // Humans see the channel through their bridge, never through deltas; the agent a
            // person's post was handed to has it as a message of its own.
            if m == author || !self.is_agent(&m) || asked.as_ref() == Some(&m) {
                continue;
            }
            let is_mentioned = mentioned.contains(&m.to_lowercase());
            let notify = match self.state_of(&m) {
                AgentState::Awake => true,
                AgentState::Sleep => is_mentioned,
                AgentState::Reactive => is_mentioned || is_dm,
            };
            if !notify {
                continue;
            }
            if self.state_of(&m) == AgentState::Sleep {
                let _ = self.set_state(&m, AgentState::Awake).await;
            }
            notify_now.push(m);
        }
        // The deltas carry the poster's chain (a person's post starts a new one).
        for m in &notify_now {
            let key = (m.clone(), channel.to_owned());
            match &self.current_chain {
                Some(c) => self.delta_chain.insert(key, c.clone()),
                None => self.delta_chain.remove(&key),
            };
        }
        if let (Some(ask), Some(router)) = (ask, &self.router) {
            let _ = router.cast(RouterMsg::Asked(ask));
        }
        self.schedule_all(myself, channel, &notify_now, seq).await;
        self.wake_pulls(channel).await;
        Ok((seq, false))
    }

    /// The agent that answers a person's post in `ch`, if any: the first agent member it
    /// @mentions; in a DM, the agent in it; else the responder a bridge mapping names for the
    /// channel; else its coordinator or orchestrator member. One agent, never one per member.
    fn responder(&self, ch: &ChannelRow, text: &str) -> Option<String> {
        let member = |m: &str| ch.members.iter().any(|x| x == m) && self.is_agent(m);
        if let Some(m) = mentions(text).into_iter().find(|m| member(m)) {
            return Some(m);
        }
        if ch.is_dm {
            return ch.members.iter().find(|m| self.is_agent(m)).cloned();
        }
        let mapped = self
            .spec
            .bridges
            .iter()
            .flat_map(|b| &b.channels)
            .filter(|m| m.flock == ch.id)
            .find_map(|m| m.responder.clone())
            .filter(|r| self.is_agent(r));
        mapped.or_else(|| {
            [Role::Coordinator, Role::Orchestrator].into_iter().find_map(|role| {
                self.agents
                    .iter()
                    .find(|a| a.role == role && ch.members.contains(&a.key()))
                    .map(AgentSpec::key)
            })
        })
    }

    /// Raises the scheduled cursor to `upto` and arms the coalescing timer if none is armed.
    async fn schedule(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        channel: &str,
        upto: u64,
    ) {
        self.schedule_all(myself, channel, &[agent.to_owned()], upto).await;
    }

    /// Raises the scheduled cursors of `agents` in `channel` to `upto` (one transaction for all,
    /// so a post to a big channel costs one commit) and arms each coalescing timer not armed yet.
    async fn schedule_all(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        agents: &[String],
        upto: u64,
    ) {
        let raised: Vec<(String, String, Cursor)> = agents
            .iter()
            .filter_map(|a| {
                let cur =
                    self.cursors.get(&(a.clone(), channel.to_owned())).copied().unwrap_or_default();
                (upto > cur.scheduled_seq).then(|| {
                    (
                        a.clone(),
                        channel.to_owned(),
                        Cursor { sent_seq: cur.sent_seq, scheduled_seq: upto },
                    )
                })
            })
            .collect();
        if raised.is_empty() {
            return;
        }
        let batch = raised.clone();
        if let Err(e) = self.db(move |s| s.set_cursors(&batch)).await {
            tracing::error!(error = ?e, "flock channels: cursor write failed");
            return;
        }
        let (min, max) =
            (self.spec.channels.delta_delay_min_ms, self.spec.channels.delta_delay_max_ms);
        for (agent, channel, cursor) in raised {
            let key = (agent, channel);
            self.cursors.insert(key.clone(), cursor);
            if self.armed.insert(key.clone()) {
                let delay = if max > min { fastrand::u64(min..=max) } else { min };
                let (agent, channel) = key;
                if delay == 0 {
                    let _ = myself.cast(ChannelsMsg::DeltaDue { agent, channel });
                } else {
                    myself.send_after(Duration::from_millis(delay), move || {
                        ChannelsMsg::DeltaDue { agent, channel }
                    });
                }
            }
        }
    }

    async fn send_delta(&mut self, agent: &str, channel: &str) {
        let key = (agent.to_owned(), channel.to_owned());
        let cur = self.cursors.get(&key).copied().unwrap_or_default();
        let Some(ch) = self.channels.get(channel) else {
            self.armed.remove(&key);
            return;
        };
        if cur.sent_seq >= cur.scheduled_seq {
            // Stale: everything it would carry was already delivered.
            self.armed.remove(&key);
            return;
        }
        let (name, topic, id, upto, after) =
            (ch.name.clone(), ch.topic.clone(), ch.id.clone(), cur.scheduled_seq, cur.sent_seq);
        let (c, reader) = (id.clone(), agent.to_owned());
        let page = with_store(&self.store, move |s| {
            s.new_for(&c, &reader, after, upto, delta::DELTA_MAX_MESSAGES)
        })
        .await;
        let (total, first, newest) = match page {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(channel = %channel, error = %e, "flock channels: reading #{channel} failed");
                self.armed.remove(&key);
                return;
            }
        };
        if total == 0 {
            // Only the agent's own posts are new: nothing to tell it, no turn spent.
            let done =
                ChannelsMsg::DeltaDone { agent: agent.to_owned(), channel: id, upto, ok: true };
            if let Some(me) = &self.myself {
                let _ = me.cast(done);
            }
            return;
        }
        let text = delta::render_page(&id, &name, &topic, first, total, &newest);
        match &self.router {
            Some(router) => {
                let chain = self.delta_chain.remove(&key);
                crate::metrics::get().deltas.inc();
                let msg =
                    RouterMsg::Delta { agent: agent.to_owned(), channel: id, upto, text, chain };
                if router.cast(msg).is_err() {
                    self.armed.remove(&key);
                }
            }
            None => {
                self.armed.remove(&key);
            }
        }
    }

    async fn delta_done(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        channel: &str,
        upto: u64,
        ok: bool,
    ) {
        let key = (agent.to_owned(), channel.to_owned());
        self.armed.remove(&key);
        let cur = self.cursors.get(&key).copied().unwrap_or_default();
        let new = if ok {
            Cursor { sent_seq: cur.sent_seq.max(upto), scheduled_seq: cur.scheduled_seq.max(upto) }
        } else {
            // Roll back: these messages are still new to the agent and will be sent again.
            Cursor { sent_seq: cur.sent_seq, scheduled_seq: cur.sent_seq }
        };
        let (a, c) = key.clone();
        if self.db(move |s| s.set_cursor(&a, &c, new)).await.is_ok() {
            self.cursors.insert(key, new);
        }
        if !ok {
            let entry = self.retry.entry((agent.to_owned(), channel.to_owned())).or_default();
            *entry = (*entry).max(upto);
        }
        if ok && new.scheduled_seq > new.sent_seq {
            // More arrived while this delta was in flight.
            let upto = new.scheduled_seq;
            let mut retry = new;
            retry.scheduled_seq = new.sent_seq;
            self.cursors.insert((agent.to_owned(), channel.to_owned()), retry);
            self.schedule(myself, agent, channel, upto).await;
        }
    }

    async fn start_archive(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        channel: &str,
    ) -> Result<(), (ErrorCode, String)> {
        let started = now_ms();
        let deadline = started + (self.spec.channels.archive_deadline_secs as i64) * 1000;
        let c = channel.to_owned();
        self.db(move |s| {
            s.set_channel_state(&c, ChannelState::Archiving, Some(started), Some(deadline))
        })
        .await?;
        let agents: Vec<String> = {
            let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
            ch.state = ChannelState::Archiving;
            ch.archiving_started_at = Some(started);
            ch.archive_deadline_at = Some(deadline);
            ch.ready.clear();
            if ch.members.contains(&caller.id) && caller.role.is_some() {
                ch.ready.push(caller.id.clone()); // whoever starts the archive is ready
            }
            ch.members.iter().filter(|m| !m.starts_with("human:")).cloned().collect()
        };
        if caller.role.is_some() && agents.contains(&caller.id) {
            let (c, who) = (channel.to_owned(), caller.id.clone());
            self.db(move |s| s.mark_archive_ready(&c, &who)).await?;
        }
        self.journal(
            JournalEvent::new(
                &caller.id,
                "CHANNEL_ARCHIVE_START",
                Status::InProgress,
                format!("archiving #{channel}; deadline {}", iso(deadline)),
            )
            .param("channel", json!(channel))
            .param("members", json!(agents)),
        );
        // The notice mentions every agent member, so sleeping and REACTIVE members wake for it.
        let roll: Vec<String> =
            agents.iter().filter(|a| **a != caller.id).map(|a| format!("@{a}")).collect();
        let notice = format!(
            "[archive] #{channel} is being archived. {} please review the history, write what you learned to memory, update your card (flock_update_card), then call flock_archive_ready(channel=\"{channel}\"). Deadline: {}.",
            roll.join(" "),
            iso(deadline)
        );
        // A notice, not the person's words: nobody is asked to answer it.
        self.post_keyed(myself, channel, &caller.id, &notice, PostKey::None, None, false).await?;
        let wait = Duration::from_millis((deadline - started).max(0) as u64);
        let ch = channel.to_owned();
        myself.send_after(wait, move || ChannelsMsg::ArchiveDeadline { channel: ch });
        self.evaluate_archive(channel).await;
        Ok(())
    }

    /// Archives the channel once every agent member is ready.
    async fn evaluate_archive(&mut self, channel: &str) {
        let Some(ch) = self.channels.get(channel) else { return };
        if ch.state != ChannelState::Archiving {
            return;
        }
        let all_ready =
            ch.members.iter().filter(|m| self.is_agent(m)).all(|m| ch.ready.contains(m));
        if all_ready {
            let _ = self.archive_now(channel, "every member is ready").await;
        }
    }

    async fn archive_deadline(&mut self, channel: &str) {
        let Some(ch) = self.channels.get(channel) else { return };
        if ch.state != ChannelState::Archiving
            || ch.archive_deadline_at.is_some_and(|d| d > now_ms() + 50)
        {
            return;
        }
        let missing: Vec<String> = ch
            .members
            .iter()
            .filter(|m| self.is_agent(m) && !ch.ready.contains(m))
            .cloned()
            .collect();
        let reason = format!(
            "deadline passed; not ready: {}",
            if missing.is_empty() { "nobody".into() } else { missing.join(", ") }
        );
        let _ = self.archive_now(channel, &reason).await;
    }

    async fn archive_now(
        &mut self,
        channel: &str,
        reason: &str,
    ) -> Result<(), (ErrorCode, String)> {
        let c = channel.to_owned();
        self.db(move |s| s.set_channel_state(&c, ChannelState::Archived, None, None)).await?;
        let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
        ch.state = ChannelState::Archived;
        let (ready, members) = (ch.ready.clone(), ch.members.clone());
        let not_ready: Vec<&String> =
            members.iter().filter(|m| !m.starts_with("human:") && !ready.contains(m)).collect();
        let not_ready: Vec<String> = not_ready.into_iter().cloned().collect();
        self.journal(
            JournalEvent::new(
                "flock",
                "CHANNEL_ARCHIVED",
                Status::Success,
                format!("#{channel} archived: {reason}"),
            )
            .param("channel", json!(channel))
            .param("ready", json!(ready))
            .param("not_ready", json!(not_ready)),
        );
        let agents: Vec<String> = members.iter().filter(|m| self.is_agent(m)).cloned().collect();
        let (c, a) = (channel.to_owned(), agents.clone());
        self.db(move |s| s.close_sessions(&c, &a)).await?;
        if let Some(router) = &self.router {
            for m in members.iter().filter(|m| self.is_agent(m)) {
                let _ = router.cast(RouterMsg::SessionClosed {
                    agent: m.clone(),
                    channel: channel.to_owned(),
                });
            }
        }
        // Bridges waiting on this channel learn it is archived (see `bridge__pull`).
        self.wake_pulls(channel).await;
        Ok(())
    }
}
