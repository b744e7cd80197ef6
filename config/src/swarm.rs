//! Validation of a whole swarm file: walks the raw YAML tree section by section, reports every
//! problem to the [`Report`], and builds the [`SwarmSpec`] (which the caller discards if anything
//! was reported).
//!
//! Cross-references (`can_call`, `model`, `args.to` in transcripts) are checked after the names
//! they point to have been collected, so their order in the file does not matter.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::{Report, closest, list};
use crate::spec::{
    AgentSpec, BridgeMapping, BridgeSpec, BudgetSpec, ChannelsSpec, DeliverySpec, DmSpec,
    ExtensionSpec, MaskRule, ModelSpec, Platform, Replies, RestartPolicy, Role, SandboxKind,
    Strategy, SupervisionSpec, SwarmSpec,
};
use crate::transcript::{self, Target};
use crate::valid_agent_name;
use crate::yaml::{self, Node, Pos, Scalar, Value, lookup};

const TOP_KEYS: &[&str] = &[
    "swarm",
    "supervision",
    "delivery",
    "budget",
    "channels",
    "memory",
    "models",
    "defaults",
    "agents",
    "bridges",
];
const BUDGET_KEYS: &[&str] = &["max_hops", "max_tokens", "max_wall_secs"];
const CHANNELS_KEYS: &[&str] =
    &["delta_delay_min_ms", "delta_delay_max_ms", "archive_deadline_secs"];
const SWARM_KEYS: &[&str] = &["name"];
const SUPERVISION_KEYS: &[&str] = &[
    "strategy",
    "max_restarts",
    "max_seconds",
    "backoff_initial_ms",
    "backoff_max_ms",
    "backoff_reset_secs",
    "escalate",
    "heartbeat_interval_ms",
    "heartbeat_misses",
];
const DELIVERY_KEYS: &[&str] =
    &["max_delivery_attempts", "request_timeout_ms", "max_frame_bytes", "outbox_frames"];
const MODEL_KEYS: &[&str] = &[
    "provider",
    "transcript",
    "rules",
    "base_url",
    "model",
    "api_key_env",
    "timeout_secs",
    "max_tokens",
    "retry_base_ms",
    "path",
    "threads",
    "ctx",
    "slots",
];
/// Keys only the embedded model takes.
const LOCAL_KEYS: &[&str] = &["path", "threads", "ctx", "slots"];
/// Keys only a remote (HTTP) model takes.
const REMOTE_KEYS: &[&str] =
    &["base_url", "model", "api_key_env", "timeout_secs", "max_tokens", "retry_base_ms"];
const DEFAULTS_KEYS: &[&str] = &["model", "restart", "stop_timeout_secs", "ready_timeout_secs"];
const AGENT_KEYS: &[&str] = &[
    "name",
    "role",
    "archetype",
    "description",
    "restart",
    "stop_timeout_secs",
    "ready_timeout_secs",
    "workspace",
    "command",
    "env",
    "can_call",
    "tools",
    "sandbox",
    "unconfined",
    "model",
    "extensions",
];

const BRIDGE_KEYS: &[&str] = &[
    "name",
    "platform",
    "token_env",
    "app_token_env",
    "api_url",
    "max_posts_per_minute",
    "mirror_new_channels",
    "channels",
    "dm",
    "approvals",
    "approvers",
];
const BRIDGE_CHANNEL_KEYS: &[&str] = &["flock", "external", "allow", "responder", "replies"];
const BRIDGE_DM_KEYS: &[&str] = &["agent", "allow"];
/// Every platform a bridge may name, in the order messages list them.
const PLATFORMS: &[Platform] = &[Platform::Discord, Platform::Slack, Platform::Telegram];
/// The platforms this version has a bridge for.
const BUILT_PLATFORMS: &[Platform] = &[Platform::Discord, Platform::Slack, Platform::Telegram];
/// The longest bridge name (`[a-z0-9][a-z0-9-]{0,30}`).
const MAX_BRIDGE_NAME: usize = 31;
/// The longest `token_env` (a variable name; anything longer is likely the token itself).
const MAX_TOKEN_ENV: usize = 64;
const MAX_API_URL_BYTES: usize = 2048;
/// The longest platform chat or user id, in characters.
const MAX_PLATFORM_ID: usize = 128;
const DEFAULT_POSTS_PER_MINUTE: u32 = 20;
const BRIDGE_CHANNELS_EXAMPLE: &str =
    "e.g. `channels: [{ flock: general, external: \"-1001234567890\" }]`";

const STRATEGIES: &[(&str, Strategy)] = &[
    ("one_for_one", Strategy::OneForOne),
    ("one_for_all", Strategy::OneForAll),
    ("rest_for_one", Strategy::RestForOne),
];
const SANDBOXES: &[(&str, SandboxKind)] =
    &[("native", SandboxKind::Native), ("docker", SandboxKind::Docker)];
const RESTART_POLICIES: &[(&str, RestartPolicy)] = &[
    ("permanent", RestartPolicy::Permanent),
    ("transient", RestartPolicy::Transient),
    ("temporary", RestartPolicy::Temporary),
];
#[derive(Clone, Copy, PartialEq, Eq)]
enum Provider {
    Scripted,
    OpenAi,
    Anthropic,
    Local,
}
const PROVIDERS: &[(&str, Provider)] = &[
    ("scripted", Provider::Scripted),
    ("openai", Provider::OpenAi),
    ("anthropic", Provider::Anthropic),
    ("local", Provider::Local),
];

const AGENTS_EMPTY: &str =
    "`agents` is empty; list at least one agent (`- name: worker-1` and `role: worker`)";

const U32_MAX: i128 = u32::MAX as i128;
const U64_MAX: i128 = u64::MAX as i128;
const GIB: i128 = 1 << 30;

/// Validates a parsed swarm file. `origin` is the swarm file's path as given; relative paths in
/// the file are resolved against its folder.
pub(crate) fn build(root: &Node, origin: &Path, report: Report<'_>) -> Option<SwarmSpec> {
    let dir = origin.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut loader = Loader {
        report,
        dir,
        models: HashMap::new(),
        transcripts: HashMap::new(),
        targets: Vec::new(),
        agent_names: Vec::new(),
    };
    loader.swarm(root, origin)
}

/// A model definition: validated, or broken (already reported, so agents using it stay quiet).
enum Model {
    Ready(ModelSpec),
    Broken,
}

/// `defaults:` — applied to agents that omit these keys.
struct Defaults {
    /// The default model's name and, if it is defined and valid, its spec.
    model: Option<(String, Option<ModelSpec>)>,
    restart: RestartPolicy,
    stop_timeout_secs: u64,
    ready_timeout_secs: u64,
}

struct Loader<'e> {
    report: Report<'e>,
    /// The swarm file's folder as the user wrote it (`""` for a bare file name): transcript paths
    /// are joined to it, so messages name them the way the user would.
    dir: PathBuf,
    models: HashMap<String, Model>,
    /// Transcript files already read, by path, so a file shared by several models is read (and
    /// its errors reported) once.
    transcripts: HashMap<PathBuf, Option<crate::spec::Transcript>>,
    targets: Vec<Target>,
    /// Every validly named agent, in file order (set by `agents`).
    agent_names: Vec<String>,
}

impl Loader<'_> {
    fn swarm(&mut self, root: &Node, origin: &Path) -> Option<SwarmSpec> {
        if root.is_null() {
            self.report.error(
                root.pos,
                "the swarm file is empty; it needs at least `swarm:` (with `name:`) and `agents:`",
            );
            return None;
        }
        let Some(top) = root.entries() else {
            self.report.error(
                root.pos,
                format!(
                    "the swarm file must be a mapping with `swarm:` and `agents:` at the top, \
                     found {}",
                    root.describe()
                ),
            );
            return None;
        };
        self.report.unknown_keys(top, TOP_KEYS, "the swarm file");

        let name = self.swarm_name(top);
        let supervision = match lookup(top, "supervision") {
            Some((_, node)) => self.supervision(node),
            None => SupervisionSpec::default(),
        };
        let delivery = match lookup(top, "delivery") {
            Some((_, node)) => self.delivery(node),
            None => DeliverySpec::default(),
        };
        let channels = match lookup(top, "channels") {
            Some((_, node)) => self.channels(node),
            None => ChannelsSpec::default(),
        };
        let budget = match lookup(top, "budget") {
            Some((_, node)) => self.budget(node),
            None => BudgetSpec::default(),
        };
        let mask = match lookup(top, "memory") {
            Some((_, node)) => self.memory(node),
            None => Vec::new(),
        };
        if let Some((_, node)) = lookup(top, "models") {
            self.models(node);
        }
        let defaults = self.defaults(lookup(top, "defaults").map(|(_, v)| v));
        let agents = self.agents(lookup(top, "agents"), &defaults);
        let mut bridges = match lookup(top, "bridges") {
            Some((_, node)) => self.bridges(node, &written_agent_names(top)),
            None => Vec::new(),
        };
        // A bridge's DMs go to the swarm's entry agent unless `dm.agent` names one; a swarm
        // with neither a coordinator nor an orchestrator answers none.
        let entry = crate::spec::entry_agent(&agents);
        for b in &mut bridges {
            if b.dm.as_ref().is_some_and(|d| d.agent.is_empty()) {
                b.dm = entry
                    .clone()
                    .and_then(|agent| b.dm.take().map(|d| DmSpec { agent, allow: d.allow }));
            }
        }

        self.check_targets();

        let models: std::collections::BTreeMap<String, ModelSpec> = self
            .models
            .iter()
            .filter_map(|(k, m)| match m {
                Model::Ready(spec) => Some((k.clone(), spec.clone())),
                Model::Broken => None,
            })
            .collect();
        let default_model = defaults.model.as_ref().map(|(n, _)| n.clone());
        Some(SwarmSpec {
            name: name?,
            models,
            default_model,
            default_restart: defaults.restart,
            default_stop_timeout_secs: defaults.stop_timeout_secs,
            default_ready_timeout_secs: defaults.ready_timeout_secs,
            source: Some(std::path::absolute(origin).unwrap_or_else(|_| origin.to_path_buf())),
            supervision,
            delivery,
            budget,
            channels,
            agents,
            mask,
            bridges,
        })
    }

    /// `memory: { mask: [{name, pattern}, …] }`: the swarm's own masking rules, each a regular
    /// expression that compiles and cannot match nothing (it would mask between every letter).
    fn memory(&mut self, node: &Node) -> Vec<MaskRule> {
        let mut rules = Vec::new();
        if node.is_null() {
            return rules;
        }
        let Some(entries) = self.report.mapping(node, "memory") else { return rules };
        let r = &mut self.report;
        r.unknown_keys(entries, &["mask"], "`memory`");
        let Some((_, list)) = lookup(entries, "mask") else { return rules };
        let items = r.list(list, "memory.mask").unwrap_or_default();
        for (i, item) in items.iter().enumerate() {
            let what = format!("memory.mask[{i}]");
            let Some(fields) = r.mapping(item, &what) else { continue };
            r.unknown_keys(fields, &["name", "pattern"], &format!("`{what}`"));
            let name =
                lookup(fields, "name").and_then(|(_, v)| r.string(v, &format!("{what}.name")));
            let pattern = lookup(fields, "pattern")
                .and_then(|(_, v)| Some((v, r.string(v, &format!("{what}.pattern"))?)));
            let (Some(name), Some((at, pattern))) = (name, pattern) else {
                r.error(item.pos, format!("`{what}` needs `name` and `pattern`, e.g. {{ name: employee_id, pattern: \"EMP-[0-9]{{6}}\" }}"));
                continue;
            };
            if name.is_empty()
                || name.len() > 32
                || !name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            {
                r.error(
                    item.pos,
                    format!("`{what}.name` must be 1–32 of a-z, 0-9 and _, got `{name}`"),
                );
                continue;
            }
            match regex::Regex::new(&pattern) {
                Ok(re) if re.is_match("") => r.error(
                    at.pos,
                    format!("`{what}.pattern` matches the empty string, so it would mask between every letter: `{pattern}`"),
                ),
                Ok(_) => rules.push(MaskRule { name, pattern }),
                Err(e) => r.error(at.pos, format!("`{what}.pattern` is not a valid regular expression: {e}")),
            }
        }
        rules
    }

    /// `bridges: [{name, platform, token_env, api_url, max_posts_per_minute, channels}, …]`: chat
    /// bridges. `agents` are the agents' names as written, which no bridge may take.
    fn bridges(&mut self, node: &Node, agents: &[(String, Pos)]) -> Vec<BridgeSpec> {
        let mut bridges = Vec::new();
        if node.is_null() {
            return bridges;
        }
        let r = &mut self.report;
        let Some(items) = r.list(node, "bridges") else { return bridges };
        let mut names: HashMap<String, Pos> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            if let Some(bridge) = bridge(r, item, i, agents, &mut names) {
                bridges.push(bridge);
            }
        }
        bridges
    }

    fn budget(&mut self, node: &Node) -> BudgetSpec {
        let mut spec = BudgetSpec::default();
        if node.is_null() {
            return spec;
        }
        let Some(entries) = self.report.mapping(node, "budget") else {
            return spec;
        };
        let r = &mut self.report;
        r.unknown_keys(entries, BUDGET_KEYS, "`budget`");
        let field = |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("budget.{key}")));
        if let Some((v, what)) = field("max_hops")
            && let Some(n) = r.uint(v, &what, 1, U32_MAX)
        {
            spec.max_hops = n;
        }
        if let Some((v, what)) = field("max_tokens")
            && let Some(n) = r.uint(v, &what, 1, U64_MAX)
        {
            spec.max_tokens = n;
        }
        if let Some((v, what)) = field("max_wall_secs")
            && let Some(n) = r.uint(v, &what, 1, U64_MAX)
        {
            spec.max_wall_secs = n;
        }
        spec
    }

    fn swarm_name(&mut self, top: &[(Node, Node)]) -> Option<String> {
        let Some((key, node)) = lookup(top, "swarm") else {
            self.report.error(
                Pos::START,
                "missing `swarm:` section; add `swarm:` with `name: my-swarm` indented under it",
            );
            return None;
        };
        if node.is_null() {
            self.report.error(key.pos, "`swarm` is empty; add `name: my-swarm` indented under it");
            return None;
        }
        let entries = self.report.mapping(node, "swarm")?;
        self.report.unknown_keys(entries, SWARM_KEYS, "`swarm`");
        let Some((_, value)) = lookup(entries, "name") else {
            self.report.error(node.pos, "`swarm.name` is missing; add `name: my-swarm`");
            return None;
        };
        let name = self.report.string(value, "swarm.name")?;
        if name.trim().is_empty() {
            self.report.error(value.pos, "`swarm.name` is blank; give the swarm a name");
            return None;
        }
        Some(name)
    }

    fn supervision(&mut self, node: &Node) -> SupervisionSpec {
        let mut spec = SupervisionSpec::default();
        if node.is_null() {
            return spec;
        }
        let Some(entries) = self.report.mapping(node, "supervision") else {
            return spec;
        };
        let r = &mut self.report;
        r.unknown_keys(entries, SUPERVISION_KEYS, "`supervision`");
        let field =
            |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("supervision.{key}")));

        if let Some((v, what)) = field("strategy")
            && let Some(strategy) = r.choice(v, &what, "strategy", STRATEGIES)
        {
            spec.strategy = strategy;
        }
        if let Some((v, what)) = field("max_restarts")
            && let Some(n) = r.uint(v, &what, 0, U32_MAX)
        {
            spec.max_restarts = n;
        }
        // A zero-second window would never count two restarts together: intensity would be off.
        if let Some((v, what)) = field("max_seconds")
            && let Some(n) = r.uint(v, &what, 1, U64_MAX)
        {
            spec.max_seconds = n;
        }
        if let Some((v, what)) = field("backoff_initial_ms")
            && let Some(n) = r.uint(v, &what, 0, U64_MAX)
        {
            spec.backoff_initial_ms = n;
        }
        let backoff_max = field("backoff_max_ms");
        if let Some((v, what)) = &backoff_max
            && let Some(n) = r.uint(v, what, 0, U64_MAX)
        {
            spec.backoff_max_ms = n;
            if n < spec.backoff_initial_ms {
                r.error(
                    v.pos,
                    format!(
                        "`supervision.backoff_max_ms` ({n}) is below `backoff_initial_ms` ({}); \
                         the cap must be at least the first step",
                        spec.backoff_initial_ms
                    ),
                );
            }
        }
        if let Some((v, what)) = field("backoff_reset_secs")
            && let Some(n) = r.uint(v, &what, 0, U64_MAX)
        {
            spec.backoff_reset_secs = n;
        }
        if let Some((v, what)) = field("escalate")
            && let Some(b) = r.boolean(v, &what)
        {
            spec.escalate = b;
        }
        // Below 10 ms heartbeats would be most of what the supervisor does.
        if let Some((v, what)) = field("heartbeat_interval_ms")
            && let Some(n) = r.uint(v, &what, 10, U64_MAX)
        {
            spec.heartbeat_interval_ms = n;
        }
        if let Some((v, what)) = field("heartbeat_misses")
            && let Some(n) = r.uint(v, &what, 1, U32_MAX)
        {
            spec.heartbeat_misses = n;
        }
        spec
    }

    fn delivery(&mut self, node: &Node) -> DeliverySpec {
        let mut spec = DeliverySpec::default();
        if node.is_null() {
            return spec;
        }
        let Some(entries) = self.report.mapping(node, "delivery") else {
            return spec;
        };
        let r = &mut self.report;
        r.unknown_keys(entries, DELIVERY_KEYS, "`delivery`");
        let field = |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("delivery.{key}")));

        if let Some((v, what)) = field("max_delivery_attempts")
            && let Some(n) = r.uint(v, &what, 1, U32_MAX)
        {
            spec.max_delivery_attempts = n;
        }
        if let Some((v, what)) = field("request_timeout_ms")
            && let Some(n) = r.uint(v, &what, 1, U64_MAX)
        {
            spec.request_timeout_ms = n;
        }
        // A frame must hold at least a small message; above 1 GiB one frame could exhaust memory.
        if let Some((v, what)) = field("max_frame_bytes")
            && let Some(n) = r.uint(v, &what, 1024, GIB)
        {
            spec.max_frame_bytes = n;
        }
        if let Some((v, what)) = field("outbox_frames")
            && let Some(n) = r.uint(v, &what, 16, U32_MAX)
        {
            spec.outbox_frames = n;
        }
        spec
    }

    fn channels(&mut self, node: &Node) -> ChannelsSpec {
        let mut spec = ChannelsSpec::default();
        if node.is_null() {
            return spec;
        }
        let Some(entries) = self.report.mapping(node, "channels") else {
            return spec;
        };
        let r = &mut self.report;
        r.unknown_keys(entries, CHANNELS_KEYS, "`channels`");
        let field = |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("channels.{key}")));
        if let Some((v, what)) = field("delta_delay_min_ms")
            && let Some(n) = r.uint(v, &what, 0, U64_MAX)
        {
            spec.delta_delay_min_ms = n;
        }
        if let Some((v, what)) = field("delta_delay_max_ms")
            && let Some(n) = r.uint(v, &what, 0, U64_MAX)
        {
            spec.delta_delay_max_ms = n;
        }
        if spec.delta_delay_max_ms < spec.delta_delay_min_ms
            && let Some((v, _)) = field("delta_delay_max_ms")
        {
            r.error(
                v.pos,
                format!(
                    "`channels.delta_delay_max_ms` ({}) is below `delta_delay_min_ms` ({}); raise it or lower the minimum",
                    spec.delta_delay_max_ms, spec.delta_delay_min_ms
                ),
            );
        }
        if let Some((v, what)) = field("archive_deadline_secs")
            && let Some(n) = r.uint(v, &what, 1, U64_MAX)
        {
            spec.archive_deadline_secs = n;
        }
        spec
    }

    fn models(&mut self, node: &Node) {
        if node.is_null() {
            return;
        }
        let Some(entries) = self.report.mapping(node, "models") else {
            return;
        };
        for (key, def) in entries {
            let Some(name) = key.text() else {
                self.report.error(
                    key.pos,
                    format!("model names must be plain names, found {}", key.describe()),
                );
                continue;
            };
            let model = match self.model(name, def) {
                Some(spec) => Model::Ready(spec),
                None => Model::Broken,
            };
            // Duplicate names were reported by the YAML reader; the first one wins.
            self.models.entry(name.to_owned()).or_insert(model);
        }
    }

    /// One model definition; `None` if it has a problem (reported).
    fn model(&mut self, name: &str, node: &Node) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        if node.is_null() {
            self.report.error(
                node.pos,
                format!("model `{name}` is empty; add `provider: scripted` and a `transcript:`"),
            );
            return None;
        }
        let entries = self.report.mapping(node, &what)?;
        let before = self.report.count();
        self.report.unknown_keys(entries, MODEL_KEYS, &format!("`{what}`"));
        let provider = match lookup(entries, "provider") {
            Some((_, v)) => {
                self.report.choice(v, &format!("{what}.provider"), "model provider", PROVIDERS)
            }
            None => {
                self.report.error(
                    node.pos,
                    format!(
                        "model `{name}` has no `provider`; add `provider: local`, `scripted`, `openai` or `anthropic`"
                    ),
                );
                None
            }
        };
        match provider {
            Some(Provider::OpenAi) => return self.remote(name, node, entries, before, false),
            Some(Provider::Anthropic) => return self.remote(name, node, entries, before, true),
            Some(Provider::Local) => return self.local(name, entries, before),
            Some(Provider::Scripted) | None => {
                for (k, _) in entries {
                    let Some(key) = k.text() else { continue };
                    let owner = if REMOTE_KEYS.contains(&key) {
                        "`provider: openai` or `anthropic` models"
                    } else if LOCAL_KEYS.contains(&key) {
                        "`provider: local` models"
                    } else {
                        continue;
                    };
                    self.report
                        .error(k.pos, format!("`{key}` is for {owner}, not `scripted`; remove it"));
                }
            }
        }
        let transcript = match (lookup(entries, "transcript"), lookup(entries, "rules")) {
            (Some(_), Some((rules_key, _))) => {
                self.report.error(
                    rules_key.pos,
                    format!(
                        "model `{name}` has both `transcript` and `rules`; keep exactly one \
                         (a transcript file, or inline rules)"
                    ),
                );
                None
            }
            (None, None) => {
                self.report.error(
                    node.pos,
                    format!(
                        "model `{name}` has no rules; add `transcript: path/to/file.yaml` or an \
                         inline `rules:` list"
                    ),
                );
                None
            }
            (Some((_, path)), None) => self.transcript_file(path, &what),
            (None, Some((_, rules))) => Some(transcript::rules(
                rules,
                &format!("{what}.rules"),
                &mut self.report,
                &mut self.targets,
            )),
        };
        // Only a model without any problem is usable; a broken one stays out of the spec.
        (self.report.count() == before).then_some(transcript).flatten().map(ModelSpec::Scripted)
    }

    /// The embedded model (`provider: local`): every key is optional.
    fn local(&mut self, name: &str, entries: &[(Node, Node)], before: usize) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        for (k, _) in entries {
            let Some(key) = k.text() else { continue };
            if ["transcript", "rules", "base_url", "api_key_env", "retry_base_ms"].contains(&key) {
                self.report.error(
                    k.pos,
                    format!(
                        "`{key}` is not for `provider: local` models (the embedded model takes \
                         `model`, `path`, `threads`, `ctx`, `slots`, `timeout_secs`, `max_tokens`); \
                         remove it from `{what}`"
                    ),
                );
            }
        }
        let field = |key: &str| lookup(entries, key).map(|(_, v)| v);
        let defaults = crate::spec::LocalModel::default();
        let r = &mut self.report;
        let path = field("path").and_then(|v| r.string(v, &format!("{what}.path"))).map(|p| {
            let p = PathBuf::from(p);
            // Relative to the swarm file, like transcripts.
            if p.is_absolute() { p } else { std::path::absolute(self.dir.join(&p)).unwrap_or(p) }
        });
        let r = &mut self.report;
        let model = match field("model") {
            Some(v) => match r.string(v, &format!("{what}.model")) {
                Some(m) if crate::spec::KnownModel::find(&m).is_some() => m,
                Some(m) => {
                    r.error(
                        v.pos,
                        format!(
                            "`{what}.model`: no local model named `{m}`; known: {} (fetch one with \
                             `scripts/setup --model NAME`), or give `path:` to another GGUF file",
                            crate::spec::KnownModel::names().join(", ")
                        ),
                    );
                    defaults.model.clone()
                }
                None => defaults.model.clone(),
            },
            None => defaults.model.clone(),
        };
        if let (Some(v), Some(_)) = (field("model"), field("path")) {
            r.error(v.pos, format!("`{what}` has both `model` and `path`; keep one"));
        }
        let threads =
            field("threads").and_then(|v| r.uint::<u32>(v, &format!("{what}.threads"), 1, 256));
        let slots = field("slots")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.slots"), 1, 64))
            .unwrap_or(defaults.slots);
        let ctx = field("ctx")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.ctx"), 256, 131_072))
            .unwrap_or(defaults.ctx);
        let timeout_secs = field("timeout_secs")
            .and_then(|v| r.uint(v, &format!("{what}.timeout_secs"), 1, 3600))
            .unwrap_or(defaults.timeout_secs);
        let max_tokens = field("max_tokens")
            .and_then(|v| r.uint::<u32>(v, &format!("{what}.max_tokens"), 1, 32_768))
            .unwrap_or(defaults.max_tokens);
        (self.report.count() == before).then_some(ModelSpec::Local(crate::spec::LocalModel {
            model,
            path,
            threads,
            ctx,
            slots,
            timeout_secs,
            max_tokens,
        }))
    }

    /// An HTTP model: OpenAI-compatible chat completions or Anthropic Messages. The key is named,
    /// never written: `api_key_env` says which environment variable of the supervisor holds it.
    fn remote(
        &mut self,
        name: &str,
        node: &Node,
        entries: &[(Node, Node)],
        before: usize,
        anthropic: bool,
    ) -> Option<ModelSpec> {
        let what = format!("models.{name}");
        for key in ["transcript", "rules"] {
            if let Some((k, _)) = lookup(entries, key) {
                self.report.error(
                    k.pos,
                    format!("`{key}` is for `provider: scripted` models; remove it from `{what}`"),
                );
            }
        }
        let field = |key: &str| lookup(entries, key).map(|(_, v)| v);
        let model = match field("model") {
            Some(v) => self.report.string(v, &format!("{what}.model")),
            None => {
                self.report.error(
                    node.pos,
                    format!("model `{name}` has no `model:`; name the provider's model, e.g. `model: gpt-4o-mini`"),
                );
                None
            }
        };
        let base_url = match field("base_url") {
            Some(v) => self.report.string(v, &format!("{what}.base_url")),
            None => Some(
                if anthropic { "https://api.anthropic.com" } else { "https://api.openai.com/v1" }
                    .to_owned(),
            ),
        };
        if let (Some(url), Some(v)) = (&base_url, field("base_url"))
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            self.report.error(
                v.pos,
                format!("`{what}.base_url` must start with http:// or https://, got `{url}`"),
            );
        }
        let api_key_env = match field("api_key_env") {
            Some(v) => {
                let env = self.report.string(v, &format!("{what}.api_key_env"));
                if let Some(e) = &env
                    && !valid_env_name(e)
                {
                    self.report.error(
                        v.pos,
                        format!("`{what}.api_key_env` must name an environment variable like `OPENAI_API_KEY`, got `{e}`"),
                    );
                }
                env
            }
            None if anthropic => {
                self.report.error(
                    node.pos,
                    format!("model `{name}` needs `api_key_env: ANTHROPIC_API_KEY` (the variable that holds the key)"),
                );
                None
            }
            None => None,
        };
        let r = &mut self.report;
        let timeout_secs = field("timeout_secs")
            .and_then(|v| r.uint(v, &format!("{what}.timeout_secs"), 1, 3600))
            .unwrap_or(60);
        let max_tokens = field("max_tokens")
            .and_then(|v| r.uint(v, &format!("{what}.max_tokens"), 1, 1_000_000))
            .unwrap_or(1024);
        let retry_base_ms = field("retry_base_ms")
            .and_then(|v| r.uint(v, &format!("{what}.retry_base_ms"), 1, 600_000))
            .unwrap_or(2000);
        if self.report.count() != before {
            return None;
        }
        let remote = crate::spec::RemoteModel {
            base_url: base_url?,
            model: model?,
            api_key_env,
            timeout_secs,
            max_tokens,
            retry_base_ms,
        };
        Some(if anthropic { ModelSpec::Anthropic(remote) } else { ModelSpec::OpenAi(remote) })
    }

    /// Reads and validates a transcript file named by `models.x.transcript` (`node`).
    fn transcript_file(&mut self, node: &Node, what: &str) -> Option<crate::spec::Transcript> {
        let written = self.report.string(node, &format!("{what}.transcript"))?;
        let path = self.dir.join(&written);
        if let Some(cached) = self.transcripts.get(&path) {
            return cached.clone();
        }
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) => {
                self.report.error(
                    node.pos,
                    format!(
                        "cannot read transcript `{}`: {error}; paths are relative to the swarm \
                         file's folder",
                        path.display()
                    ),
                );
                self.transcripts.insert(path, None);
                return None;
            }
        };
        let file = path.display().to_string();
        let mut report = self.report.for_file(&file);
        let before = report.count();
        let transcript = yaml::parse(&text, &mut report)
            .map(|root| transcript::file(&root, &mut report, &mut self.targets));
        let transcript = transcript.filter(|_| report.count() == before);
        self.transcripts.insert(path, transcript.clone());
        transcript
    }

    fn defaults(&mut self, node: Option<&Node>) -> Defaults {
        let mut defaults = Defaults {
            model: None,
            restart: RestartPolicy::Permanent,
            stop_timeout_secs: 10,
            ready_timeout_secs: 10,
        };
        let Some(node) = node.filter(|n| !n.is_null()) else {
            return defaults;
        };
        let Some(entries) = self.report.mapping(node, "defaults") else {
            return defaults;
        };
        self.report.unknown_keys(entries, DEFAULTS_KEYS, "`defaults`");
        if let Some((_, v)) = lookup(entries, "model")
            && let Some(name) = self.report.string(v, "defaults.model")
        {
            let spec = self.model_ref(&name, v, "defaults.model");
            defaults.model = Some((name, spec));
        }
        if let Some((_, v)) = lookup(entries, "restart")
            && let Some(policy) =
                self.report.choice(v, "defaults.restart", "restart policy", RESTART_POLICIES)
        {
            defaults.restart = policy;
        }
        if let Some((_, v)) = lookup(entries, "stop_timeout_secs")
            && let Some(n) = self.report.uint(v, "defaults.stop_timeout_secs", 0, U64_MAX)
        {
            defaults.stop_timeout_secs = n;
        }
        if let Some((_, v)) = lookup(entries, "ready_timeout_secs")
            && let Some(n) = self.report.uint(v, "defaults.ready_timeout_secs", 1, U64_MAX)
        {
            defaults.ready_timeout_secs = n;
        }
        defaults
    }

    /// Resolves a model name used at `node`; reports it if it is not defined.
    fn model_ref(&mut self, name: &str, node: &Node, what: &str) -> Option<ModelSpec> {
        match self.models.get(name) {
            Some(Model::Ready(spec)) => Some(spec.clone()),
            Some(Model::Broken) => None,
            None => {
                let hint = match closest(name, self.models.keys().map(String::as_str)) {
                    Some(best) => format!("did you mean `{best}`? "),
                    None => String::new(),
                };
                let mut defined: Vec<&str> = self.models.keys().map(String::as_str).collect();
                defined.sort_unstable();
                let fix = if defined.is_empty() {
                    "define it under `models:`".to_owned()
                } else {
                    format!("{hint}define it under `models:` or use one of {}", list(defined))
                };
                self.report
                    .error(node.pos, format!("`{what}`: model `{name}` is not defined; {fix}"));
                None
            }
        }
    }

    fn agents(&mut self, entry: Option<(&Node, &Node)>, defaults: &Defaults) -> Vec<AgentSpec> {
        let Some((key, node)) = entry else {
            self.report.error(
                Pos::START,
                "missing `agents:` list; add one with at least one agent \
                 (`- name: worker-1` and `role: worker`)",
            );
            return Vec::new();
        };
        if node.is_null() {
            self.report.error(key.pos, AGENTS_EMPTY);
            return Vec::new();
        }
        let Some(items) = self.report.list(node, "agents") else {
            return Vec::new();
        };
        if items.is_empty() {
            self.report.error(node.pos, AGENTS_EMPTY);
            return Vec::new();
        }

        // First pass: names, so `can_call` may name agents defined further down.
        let names: Vec<Option<String>> =
            items.iter().enumerate().map(|(i, item)| self.agent_name(item, i)).collect();
        let mut first_seen: HashMap<&str, Pos> = HashMap::new();
        for (item, name) in items.iter().zip(&names) {
            let Some(name) = name else { continue };
            let pos = name_pos(item);
            if let Some(first) = first_seen.get(name.as_str()) {
                self.report.error(
                    pos,
                    format!(
                        "duplicate agent name `{name}` (first at line {}); agent names must be \
                         unique: rename one of them",
                        first.line
                    ),
                );
            } else {
                first_seen.insert(name, pos);
            }
        }
        let known: Vec<&str> = names.iter().flatten().map(String::as_str).collect();
        self.agent_names = known.iter().map(|n| (*n).to_owned()).collect();
        // Names with their roles, for extensions' default peers (roles are reported by `agent`).
        let peers: Vec<(String, Role)> = items
            .iter()
            .zip(&names)
            .filter_map(|(item, name)| {
                let role = lookup(item.entries()?, "role")?.1.text()?;
                let role = roles().into_iter().find(|(n, _)| *n == role)?.1;
                Some((name.clone()?, role))
            })
            .collect();

        let mut agents = Vec::new();
        for (i, (item, name)) in items.iter().zip(&names).enumerate() {
            if let Some(agent) = self.agent(item, i, name.as_deref(), &known, &peers, defaults) {
                agents.push(agent);
            }
        }
        self.check_workspaces(items, &agents);
        agents
    }

    /// No agent's workspace may hold another agent's (it could read and change its files): a
    /// relative workspace (under the state dir's workspaces/, the default being the agent's
    /// name) may equal another's — a shared one — but not contain it.
    fn check_workspaces(&mut self, items: &[Node], agents: &[AgentSpec]) {
        let relative = |a: &AgentSpec| match &a.workspace {
            Some(p) if p.is_absolute() => None,
            Some(p) => Some(p.components().collect::<PathBuf>()),
            None => Some(PathBuf::from(a.key())),
        };
        for a in agents {
            let Some(outer) = relative(a) else { continue };
            for b in agents.iter().filter(|b| b.name != a.name) {
                let Some(inner) = relative(b) else { continue };
                if inner != outer && inner.starts_with(&outer) {
                    let pos = items
                        .iter()
                        .find(|item| {
                            item.entries()
                                .and_then(|e| lookup(e, "name"))
                                .and_then(|(_, v)| v.text())
                                == Some(a.name.as_str())
                        })
                        .and_then(|item| item.entries().and_then(|e| lookup(e, "workspace")))
                        .map_or(Pos::START, |(_, v)| v.pos);
                    self.report.error(
                        pos,
                        format!(
                            "agent `{}`'s workspace `{}` holds agent `{}`'s (`{}`): it could read \
                             and change that agent's files; give each agent a folder of its own",
                            a.name,
                            outer.display(),
                            b.name,
                            inner.display()
                        ),
                    );
                }
            }
        }
    }

    /// The agent's `name`, if it is present and valid (otherwise reported).
    fn agent_name(&mut self, item: &Node, index: usize) -> Option<String> {
        // A non-mapping item is reported by `agent`; here it just has no name.
        let entries = item.entries()?;
        let Some((_, value)) = lookup(entries, "name") else {
            self.report.error(
                item.pos,
                "this agent has no `name`; add `name: worker-1` (lowercase letters, digits, `-`)",
            );
            return None;
        };
        let name = self.report.string(value, &format!("agents[{index}].name"))?;
        if !valid_agent_name(&name) {
            self.report.error(
                value.pos,
                format!(
                    "invalid agent name `{name}`; use 1 to 63 lowercase letters, digits and `-`, \
                     starting with a letter or digit (e.g. `{}`)",
                    suggest_name(&name)
                ),
            );
            return None;
        }
        if crate::reserved_agent_name(&name) {
            self.report.error(
                value.pos,
                format!(
                    "`{name}` is reserved: Flock uses it for itself (the operator, the supervisor \
                     and its actors, people); choose another name, e.g. `{name}-agent`"
                ),
            );
            return None;
        }
        Some(name)
    }

    fn agent(
        &mut self,
        item: &Node,
        index: usize,
        name: Option<&str>,
        known: &[&str],
        peers: &[(String, Role)],
        defaults: &Defaults,
    ) -> Option<AgentSpec> {
        let path = match name {
            Some(name) => format!("agents.{name}"),
            None => format!("agents[{index}]"),
        };
        let entries = self.report.mapping(item, &path)?;
        let r = &mut self.report;
        r.unknown_keys(entries, AGENT_KEYS, &format!("`{path}`"));
        let field = |key: &str| lookup(entries, key).map(|(_, v)| (v, format!("{path}.{key}")));

        let role = match field("role") {
            Some((v, what)) => r.choice(v, &what, "role", &roles()),
            None => {
                r.error(
                    item.pos,
                    format!(
                        "`{path}` has no `role`; add `role: worker` (one of {})",
                        list(roles().iter().map(|(n, _)| *n))
                    ),
                );
                None
            }
        };
        let archetype = field("archetype")
            .filter(|(v, _)| !v.is_null())
            .and_then(|(v, what)| r.string(v, &what));
        let description = field("description")
            .filter(|(v, _)| !v.is_null())
            .and_then(|(v, what)| {
                r.string_of_at_most(v, &what, crate::fields::MAX_DESCRIPTION_BYTES)
            })
            .unwrap_or_default();
        let restart = field("restart")
            .and_then(|(v, what)| r.choice(v, &what, "restart policy", RESTART_POLICIES))
            .unwrap_or(defaults.restart);
        let stop_timeout_secs = field("stop_timeout_secs")
            .and_then(|(v, what)| r.uint(v, &what, 0, U64_MAX))
            .unwrap_or(defaults.stop_timeout_secs);
        let ready_timeout_secs = field("ready_timeout_secs")
            .and_then(|(v, what)| r.uint(v, &what, 1, U64_MAX))
            .unwrap_or(defaults.ready_timeout_secs);
        let workspace = field("workspace").filter(|(v, _)| !v.is_null()).and_then(|(v, what)| {
            let path = PathBuf::from(r.string(v, &what)?);
            // A relative workspace lives under the state dir's `workspaces/`; `..` would take
            // it out (into the state dir itself, or anywhere). An absolute path is the user's
            // own choice.
            // `.` (or nothing) is the workspaces/ folder itself: every agent's workspace.
            if path.is_relative()
                && !path.components().any(|c| matches!(c, std::path::Component::Normal(_)))
            {
                r.error(
                    v.pos,
                    format!(
                        "`{what}`: `{}` is the state dir's workspaces/ folder itself, which holds \
                         every other agent's workspace; give a name (e.g. `shared`) or an \
                         absolute path",
                        path.display()
                    ),
                );
                return None;
            }
            if path.is_relative() && path.components().any(|c| c == std::path::Component::ParentDir)
            {
                r.error(
                    v.pos,
                    format!(
                        "`{what}`: `{}` leaves the state dir's workspaces/ folder (`..`); give a \
                         plain relative name (e.g. `shared`) or an absolute path",
                        path.display()
                    ),
                );
                return None;
            }
            Some(path)
        });
        let env = field("env").map(|(v, what)| env(r, v, &what)).unwrap_or_default();
        let can_call =
            field("can_call").map(|(v, what)| can_call(r, v, &what, known)).unwrap_or_default();
        let tools = field("tools").map(|(v, what)| tools(r, v, &what, role));
        let sandbox = field("sandbox")
            .and_then(|(v, what)| r.choice(v, &what, "sandbox backend", SANDBOXES))
            .unwrap_or_default();
        let unconfined =
            field("unconfined").and_then(|(v, what)| r.boolean(v, &what)).unwrap_or(false);
        let command = field("command").and_then(|(v, what)| self.command(v, &what));
        let extensions = match field("extensions") {
            Some((v, what)) => crate::extensions::parse(&mut self.report, v, &what, peers),
            None => role.map(|role| ExtensionSpec::defaults(role, peers)).unwrap_or_default(),
        };
        // The pipeline's peers are callable by the agent (a restricted `can_call` lists whom its
        // model may address; the pipeline is part of the agent).
        let mut can_call = can_call;
        if !can_call.is_empty() {
            for peer in extensions.iter().flat_map(ExtensionSpec::peers) {
                if !can_call.contains(&peer) {
                    can_call.push(peer);
                }
            }
        }

        let model = match field("model") {
            Some((v, what)) => match self.report.string(v, &what) {
                Some(model) => self.model_ref(&model, v, &what),
                None => None,
            },
            None => match &defaults.model {
                Some((_, spec)) => spec.clone(),
                // No model named anywhere: the embedded local model (DESIGN.md §7).
                None => Some(ModelSpec::Local(crate::spec::LocalModel::default())),
            },
        };

        Some(AgentSpec {
            name: name?.to_owned(),
            role: role?,
            archetype,
            description,
            restart,
            stop_timeout_secs,
            ready_timeout_secs,
            workspace,
            command,
            env,
            can_call,
            tools,
            sandbox,
            unconfined,
            model: model?,
            instance: None,
            extensions,
        })
    }

    /// `command: [program, args…]`. A relative program path with a `/` is resolved against the
    /// swarm file's folder (the process runs in its workspace, where it would mean something
    /// else); a bare name like `python3` is left for `PATH`.
    fn command(&mut self, node: &Node, what: &str) -> Option<Vec<String>> {
        let items = self.report.list(node, what)?;
        if items.is_empty() {
            self.report.error(
                node.pos,
                format!(
                    "`{what}` is empty; give the program and its arguments, e.g. \
                     [\"./bin/agent\", \"--flag\"], or remove it to run the bundled flock-agent"
                ),
            );
            return None;
        }
        let mut command = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            command.push(self.report.string(item, &format!("{what}[{i}]"))?);
        }
        let program = &command[0];
        if program.is_empty() {
            self.report
                .error(items[0].pos, format!("`{what}[0]` is empty; name the program to run"));
            return None;
        }
        if program.contains('/') && Path::new(program).is_relative() {
            let joined = self.dir.join(program);
            let resolved = std::path::absolute(&joined).unwrap_or(joined);
            match resolved.to_str() {
                Some(resolved) => command[0] = resolved.to_owned(),
                None => {
                    self.report.error(
                        items[0].pos,
                        format!(
                            "`{what}[0]` resolves to a path that is not valid UTF-8; use an \
                             absolute path"
                        ),
                    );
                    return None;
                }
            }
        }
        Some(command)
    }

    /// Checks the `args.to` names collected from transcripts. Every validly named agent counts,
    /// even one with other problems: its own errors already say what is wrong with it.
    fn check_targets(&mut self) {
        let names: HashSet<&str> = self.agent_names.iter().map(String::as_str).collect();
        for target in &self.targets {
            // `name@instance` addresses an instance spawned at run time (`agents__spawn`).
            let agent = target.name.split_once('@').map_or(target.name.as_str(), |(a, _)| a);
            if names.contains(agent) {
                continue;
            }
            let message = unknown_agent(&target.what, &target.name, names.iter().copied());
            self.report.for_file(&target.file).error(target.pos, message);
        }
    }
}

/// Role names for `choice`, from the one list in `spec.rs`.
fn roles() -> [(&'static str, Role); 8] {
    Role::ALL.map(|role| (role.as_str(), role))
}

/// Where an agent's name is written (the agent itself if `name` is missing).
fn name_pos(item: &Node) -> Pos {
    item.entries().and_then(|e| lookup(e, "name")).map_or(item.pos, |(_, v)| v.pos)
}

/// `env:` — a mapping of variable names to values.
fn env(r: &mut Report<'_>, node: &Node, what: &str) -> Vec<(String, String)> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(entries) = r.mapping(node, what) else {
        return Vec::new();
    };
    let mut env = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        let Some(name) = key.text() else {
            r.error(
                key.pos,
                format!("keys in `{what}` must be variable names, found {}", key.describe()),
            );
            continue;
        };
        if !valid_env_name(name) {
            r.error(
                key.pos,
                format!(
                    "`{what}`: `{name}` is not a valid variable name; use capital letters, digits \
                     and `_`, not starting with a digit (e.g. `{}`)",
                    suggest_env_name(name)
                ),
            );
            continue;
        }
        if name.starts_with("FLOCK_") {
            r.error(
                key.pos,
                format!(
                    "`{what}`: `{name}` is reserved (Flock sets `FLOCK_*` variables itself); \
                     rename it"
                ),
            );
            continue;
        }
        // Values are free text: `PORT: 8080` means the text "8080".
        if let Some(value) = r.string(value, &format!("{what}.{name}")) {
            env.push((name.to_owned(), value));
        }
    }
    env
}

/// `tools: [name, …]`: the tools offered to this agent's model (a subset of its role's).
fn tools(r: &mut Report<'_>, node: &Node, what: &str, role: Option<Role>) -> Vec<String> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(items) = r.list(node, what) else {
        return Vec::new();
    };
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(name) = r.string(item, &format!("{what}[{i}]")) else { continue };
        let spec = crate::tools::tool(&name).filter(|t| t.is_model_tool());
        if spec.is_none() {
            r.error(item.pos, format!("`{what}[{i}]`: {}", crate::tools::unknown_tool_hint(&name)));
        } else if let Some(role) = role.filter(|r| !r.may_use(&name)) {
            r.error(
                item.pos,
                format!(
                    "`{what}[{i}]`: a {} may not use `{name}` ({}); remove it",
                    role.as_str(),
                    spec.map(|t| t.access.who()).unwrap_or_default()
                ),
            );
        } else {
            names.push(name);
        }
    }
    names
}

fn can_call(r: &mut Report<'_>, node: &Node, what: &str, known: &[&str]) -> Vec<String> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(items) = r.list(node, what) else {
        return Vec::new();
    };
    let mut names = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let Some(name) = r.string(item, &format!("{what}[{i}]")) else { continue };
        if known.contains(&name.as_str()) {
            names.push(name);
        } else {
            r.error(item.pos, unknown_agent(what, &name, known.iter().copied()));
        }
    }
    names
}

fn unknown_agent<'a>(
    what: &str,
    name: &str,
    known: impl Iterator<Item = &'a str> + Clone,
) -> String {
    let hint = match closest(name, known.clone()) {
        Some(best) => format!("did you mean `{best}`? "),
        None => String::new(),
    };
    let mut names: Vec<&str> = known.collect();
    names.sort_unstable();
    if names.is_empty() {
        return format!(
            "`{what}` names unknown agent `{name}`; this swarm has no valid agent names yet"
        );
    }
    format!("`{what}` names unknown agent `{name}`; {hint}agents in this swarm: {}", list(names))
}

/// `[A-Z_][A-Z0-9_]*`.
fn valid_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

fn suggest_env_name(name: &str) -> String {
    let mut fixed: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' })
        .collect();
    if fixed.is_empty() || fixed.starts_with(|c: char| c.is_ascii_digit()) {
        fixed.insert(0, '_');
    }
    fixed
}

/// A valid agent name close to `name`, for the "e.g." part of the message.
fn suggest_name(name: &str) -> String {
    let mut fixed: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_start_matches('-')
        .chars()
        .take(63)
        .collect();
    if !valid_agent_name(&fixed) {
        fixed = "worker-1".to_owned();
    }
    fixed
}

/// Every agent's `name` as written (valid or not), with where it is written.
fn written_agent_names(top: &[(Node, Node)]) -> Vec<(String, Pos)> {
    let Some((_, Node { value: Value::Seq(items), .. })) = lookup(top, "agents") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let (_, name) = lookup(item.entries()?, "name")?;
            Some((name.text()?.to_owned(), name.pos))
        })
        .collect()
}

/// One entry of `bridges:`; `None` if it has a problem (reported). `names` are the bridge names
/// seen so far, with their positions.
fn bridge(
    r: &mut Report<'_>,
    item: &Node,
    index: usize,
    agents: &[(String, Pos)],
    names: &mut HashMap<String, Pos>,
) -> Option<BridgeSpec> {
    let what = format!("bridges[{index}]");
    let fields = r.mapping(item, &what)?;
    let before = r.count();
    r.unknown_keys(fields, BRIDGE_KEYS, &format!("`{what}`"));
    let field = |key: &str| lookup(fields, key).map(|(_, v)| (v, format!("{what}.{key}")));
    let missing = |r: &mut Report<'_>, key: &str, fix: &str| {
        r.error(item.pos, format!("`{what}` has no `{key}`; add {fix}"));
    };

    let name = match field("name") {
        Some((v, path)) => bridge_name(r, v, &path, agents, names),
        None => {
            missing(r, "name", "`name: team-telegram` (lowercase letters, digits, `-`)");
            None
        }
    };
    let platform = match field("platform") {
        Some((v, path)) => platform(r, v, &path),
        None => {
            missing(r, "platform", "`platform: telegram`");
            None
        }
    };
    let token_env = match field("token_env") {
        Some((v, path)) => token_env(r, v, &path),
        None => {
            missing(
                r,
                "token_env",
                "`token_env: TELEGRAM_BOT_TOKEN`: the environment variable that holds the bot token",
            );
            None
        }
    };
    // Slack's Socket Mode needs an app-level token (`xapp-…`) beside the bot token.
    let app_token_env = match (field("app_token_env"), platform) {
        (Some((v, path)), Some(Platform::Slack)) => self::token_env(r, v, &path),
        (Some((v, path)), Some(_)) => {
            r.error(
                v.pos,
                format!(
                    "`{path}` is for Slack bridges only (Socket Mode's app-level token); remove it"
                ),
            );
            None
        }
        (None, Some(Platform::Slack)) => {
            missing(
                r,
                "app_token_env",
                "`app_token_env: SLACK_APP_TOKEN`: the variable holding the app-level token (`xapp-…`, scope connections:write) Socket Mode needs",
            );
            None
        }
        // No (valid) platform: that error is reported already.
        (Some(_), None) | (None, _) => None,
    };
    let api_url =
        field("api_url").filter(|(v, _)| !v.is_null()).and_then(|(v, path)| api_url(r, v, &path));
    let max_posts_per_minute = field("max_posts_per_minute")
        .and_then(|(v, path)| r.uint(v, &path, 1, 600))
        .unwrap_or(DEFAULT_POSTS_PER_MINUTE);
    // Slack and Discord bots can make channels; a Telegram bot cannot make a group.
    let mirror_new_channels = match (field("mirror_new_channels"), platform) {
        (Some((v, path)), Some(Platform::Telegram)) => {
            r.error(
                v.pos,
                format!(
                    "`{path}`: a Telegram bot cannot create groups; remove it (map chats with `channels:` or `flockctl bridge map`)"
                ),
            );
            false
        }
        (Some((v, path)), _) => r.boolean(v, &path).unwrap_or(false),
        (None, _) => false,
    };
    let channels = match lookup(fields, "channels") {
        Some((key, v)) => bridge_channels(r, key, v, &format!("{what}.channels"), agents),
        None => {
            missing(
                r,
                "channels",
                &format!("the Flock channels it connects to chats, {BRIDGE_CHANNELS_EXAMPLE}"),
            );
            Vec::new()
        }
    };
    // Direct messages with the bot: on by default (answered by the coordinator or orchestrator,
    // filled in once the agents are known), `dm: false` turns them off.
    let dm = match field("dm") {
        None => Some(DmSpec { agent: String::new(), allow: None }),
        Some((v, path)) => bridge_dm(r, v, &path, agents),
    };
    let approvals = field("approvals").and_then(|(v, path)| {
        let id = flock_channel(r, v, &path)?;
        if !channels.is_empty() && !channels.iter().any(|m| m.flock == id) {
            let mapped: Vec<&str> = channels.iter().map(|m| m.flock.as_str()).collect();
            r.error(
                v.pos,
                format!(
                    "`{path}`: `{id}` is not one of this bridge's channels ({}); announce \
                     approvals in a channel the bridge maps",
                    mapped.join(", ")
                ),
            );
            return None;
        }
        Some(id)
    });
    let approvers = match field("approvers") {
        Some((v, path)) => user_ids(
            r,
            v,
            &path,
            "nobody could approve",
            "leave `approvers` out if nobody approves through this bridge",
        )
        .unwrap_or_default(),
        None => Vec::new(),
    };
    if let (Some((v, path)), true) = (field("approvals"), approvers.is_empty()) {
        r.error(
            v.pos,
            format!(
                "`{path}` announces permission requests, but no `approvers` may decide them; add \
                 `approvers: [\"<platform user id>\"]` to the bridge"
            ),
        );
    }
    if r.count() != before {
        return None;
    }
    Some(BridgeSpec {
        name: name?,
        platform: platform?,
        token_env: token_env?,
        app_token_env,
        api_url,
        channels,
        max_posts_per_minute,
        mirror_new_channels,
        dm,
        approvals,
        approvers,
    })
}

/// `bridges[i].dm`: `false`, an agent's name, or `{agent, allow}`.
fn bridge_dm(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
) -> Option<DmSpec> {
    match node.scalar() {
        Some(Scalar::Bool(false)) => return None,
        Some(Scalar::Str(name)) => {
            return agent_ref(r, node, name, what, agents)
                .map(|agent| DmSpec { agent, allow: None });
        }
        _ => {}
    }
    let Some(fields) = node.entries() else {
        r.error(
            node.pos,
            format!(
                "`{what}` must be `false`, the agent that answers (e.g. `dm: coordinator`), or \
                 `{{agent: coordinator, allow: [\"<user id>\"]}}`; found {}",
                node.describe()
            ),
        );
        return None;
    };
    r.unknown_keys(fields, BRIDGE_DM_KEYS, &format!("`{what}`"));
    let agent = match lookup(fields, "agent") {
        Some((_, v)) => match v.text() {
            Some(name) => agent_ref(r, v, name, &format!("{what}.agent"), agents)?,
            None => {
                r.error(v.pos, format!("`{what}.agent` must be an agent's name"));
                return None;
            }
        },
        None => String::new(),
    };
    let allow = match lookup(fields, "allow") {
        Some((_, v)) => Some(user_ids(
            r,
            v,
            &format!("{what}.allow"),
            "nobody could write to the bot",
            "leave `allow` out to let everyone who reaches the bot write to it, or write `dm: false`",
        )?),
        None => None,
    };
    Some(DmSpec { agent, allow })
}

/// An agent named in a bridge (`responder`, `dm`): one of the file's agents.
fn agent_ref(
    r: &mut Report<'_>,
    node: &Node,
    name: &str,
    what: &str,
    agents: &[(String, Pos)],
) -> Option<String> {
    if agents.iter().any(|(a, _)| a == name) {
        return Some(name.to_owned());
    }
    let names: Vec<&str> = agents.iter().map(|(a, _)| a.as_str()).collect();
    let hint = crate::error::did_you_mean(name, names.iter().copied());
    r.error(
        node.pos,
        format!("`{what}`: no agent named `{name}` (agents: {}){hint}", names.join(", ")),
    );
    None
}

/// `bridges[i].name`: valid, not a bridge's already, not an agent's.
fn bridge_name(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
    names: &mut HashMap<String, Pos>,
) -> Option<String> {
    let name = r.string(node, what)?;
    if !valid_bridge_name(&name) {
        r.error(
            node.pos,
            format!(
                "`{what}`: invalid bridge name `{name}`; use 1 to {MAX_BRIDGE_NAME} lowercase \
                 letters, digits and `-`, starting with a letter or digit (e.g. `team-telegram`)"
            ),
        );
        return None;
    }
    if let Some(first) = names.get(&name) {
        r.error(
            node.pos,
            format!(
                "duplicate bridge name `{name}` (first at line {}); bridge names must be unique: \
                 rename one of them",
                first.line
            ),
        );
        return None;
    }
    names.insert(name.clone(), node.pos);
    if let Some((_, at)) = agents.iter().find(|(agent, _)| *agent == name) {
        r.error(
            node.pos,
            format!(
                "`{what}`: bridge `{name}` has the same name as agent `{name}` (line {}); a \
                 bridge and an agent may not share a name (both appear as senders in channels): \
                 rename the bridge",
                at.line
            ),
        );
        return None;
    }
    Some(name)
}

/// `[a-z0-9][a-z0-9-]{0,30}`.
fn valid_bridge_name(name: &str) -> bool {
    name.len() <= MAX_BRIDGE_NAME && valid_agent_name(name)
}

/// A Flock channel id: `[a-z0-9][a-z0-9-]{0,62}`, the syntax of agent names (and of the
/// channels actor's own check).
fn valid_channel_id(id: &str) -> bool {
    valid_agent_name(id)
}

/// A valid channel id close to `id`, for the "e.g." part of the message.
fn suggest_channel_id(id: &str) -> String {
    let fixed: String = id
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
        .collect::<String>()
        .trim_matches('-')
        .chars()
        .take(63)
        .collect();
    if valid_channel_id(&fixed) { fixed } else { "general".to_owned() }
}

/// `bridges[i].platform`: a known platform this version has a bridge for.
fn platform(r: &mut Report<'_>, node: &Node, what: &str) -> Option<Platform> {
    let text = r.string(node, what)?;
    let names = || PLATFORMS.iter().map(|p| p.as_str());
    let Some(platform) = PLATFORMS.iter().copied().find(|p| p.as_str() == text) else {
        let hint = match closest(&text, names()) {
            Some(best) => format!(" (did you mean `{best}`?)"),
            None => String::new(),
        };
        r.error(
            node.pos,
            format!(
                "`{what}`: unknown platform `{text}`; known: {}{hint}",
                names().collect::<Vec<_>>().join(", ")
            ),
        );
        return None;
    };
    if !BUILT_PLATFORMS.contains(&platform) {
        let built: Vec<&str> = BUILT_PLATFORMS.iter().map(|p| p.as_str()).collect();
        r.error(
            node.pos,
            format!(
                "`{what}`: `{text}` bridges are not built yet; this version has: {}",
                built.join(", ")
            ),
        );
        return None;
    }
    Some(platform)
}

/// `bridges[i].token_env`: the NAME of the variable that holds the bot token. The value is never
/// repeated in a message: it may be the token itself, pasted in the wrong place.
fn token_env(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    let name = r.string(node, what)?;
    if name.len() > MAX_TOKEN_ENV || name.contains(':') || name.chars().any(char::is_lowercase) {
        r.error(
            node.pos,
            format!(
                "`{what}` must name an environment variable (A-Z, 0-9, _), not hold the token \
                 itself; put the token in an environment variable where you run `up` (e.g. \
                 `export TELEGRAM_BOT_TOKEN=…`) and write that variable's name here"
            ),
        );
        return None;
    }
    if !valid_env_name(&name) {
        r.error(
            node.pos,
            format!(
                "`{what}` must name an environment variable: 1 to {MAX_TOKEN_ENV} of A-Z, 0-9 \
                 and `_`, not starting with a digit (e.g. `TELEGRAM_BOT_TOKEN`)"
            ),
        );
        return None;
    }
    Some(name)
}

/// `bridges[i].api_url`: an http(s) base URL, its trailing `/` trimmed.
fn api_url(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    let url = r.string_of_at_most(node, what, MAX_API_URL_BYTES)?;
    if url.chars().any(char::is_whitespace) {
        r.error(node.pos, format!("`{what}` contains whitespace; write the URL without any"));
        return None;
    }
    // A Telegram API URL carries the token in its path (`/bot<id>:<secret>/`); the base URL must
    // not, and the value is not repeated here.
    let holds_token = url.match_indices("/bot").any(|(i, _)| {
        let after = &url[i + 4..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && after[digits..].starts_with(':')
    });
    if holds_token {
        r.error(
            node.pos,
            format!(
                "`{what}` holds a bot token (`/bot<id>:…`); give only the API's base URL (e.g. \
                 `https://api.telegram.org`) and put the token in the variable `token_env` names"
            ),
        );
        return None;
    }
    let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) else {
        r.error(
            node.pos,
            format!(
                "`{what}` must start with http:// or https://, got `{url}`; e.g. \
                 `http://127.0.0.1:8081`"
            ),
        );
        return None;
    };
    if rest.split('/').next().is_none_or(str::is_empty) {
        r.error(
            node.pos,
            format!("`{what}` has no host after the scheme; e.g. `http://127.0.0.1:8081`"),
        );
        return None;
    }
    Some(url.trim_end_matches('/').to_owned())
}

/// `bridges[i].channels`: at least one mapping; each platform chat at most once.
fn bridge_channels(
    r: &mut Report<'_>,
    key: &Node,
    node: &Node,
    what: &str,
    agents: &[(String, Pos)],
) -> Vec<BridgeMapping> {
    let mut mappings = Vec::new();
    let empty = format!(
        "`{what}` is empty; map at least one Flock channel to a chat, {BRIDGE_CHANNELS_EXAMPLE}"
    );
    if node.is_null() {
        r.error(key.pos, empty);
        return mappings;
    }
    let Some(items) = r.list(node, what) else { return mappings };
    if items.is_empty() {
        r.error(node.pos, empty);
        return mappings;
    }
    // Each platform chat mapped so far: its Flock channel and where the mapping is.
    let mut chats: HashMap<String, (String, Pos)> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let what = format!("{what}[{i}]");
        let Some(fields) = r.mapping(item, &what) else { continue };
        r.unknown_keys(fields, BRIDGE_CHANNEL_KEYS, &format!("`{what}`"));
        let flock = match lookup(fields, "flock") {
            Some((_, v)) => flock_channel(r, v, &format!("{what}.flock")),
            None => {
                r.error(
                    item.pos,
                    format!("`{what}` has no `flock`; add `flock: general`, the Flock channel"),
                );
                None
            }
        };
        let external = match lookup(fields, "external") {
            Some((_, v)) => platform_id(r, v, &format!("{what}.external"), "the chat's id")
                .map(|id| (id, v.pos)),
            None => {
                r.error(
                    item.pos,
                    format!(
                        "`{what}` has no `external`; add the platform chat's id, e.g. \
                         `external: \"-1001234567890\"`"
                    ),
                );
                None
            }
        };
        let allow =
            lookup(fields, "allow").and_then(|(_, v)| allow(r, v, &format!("{what}.allow")));
        let responder = lookup(fields, "responder").and_then(|(_, v)| {
            let path = format!("{what}.responder");
            match v.text() {
                Some(name) => agent_ref(r, v, name, &path, agents),
                None => {
                    r.error(v.pos, format!("`{path}` must be the name of the agent that answers"));
                    None
                }
            }
        });
        let replies = match lookup(fields, "replies") {
            None => Replies::Thread,
            Some((_, v)) => match v.text() {
                Some("thread") => Replies::Thread,
                Some("channel") => Replies::Channel,
                _ => {
                    r.error(
                        v.pos,
                        format!(
                            "`{what}.replies` must be `thread` (answers attached to the person's \
                             message: a reply, or a Slack thread) or `channel` (a plain message \
                             in the chat); found {}",
                            v.describe()
                        ),
                    );
                    Replies::Thread
                }
            },
        };
        let (Some(flock), Some((external, at))) = (flock, external) else { continue };
        match chats.get(&external) {
            Some((first_flock, first)) if *first_flock == flock => r.error(
                item.pos,
                format!(
                    "`{what}` maps `{flock}` to chat `{external}` again (first at line {}); \
                     remove one of them",
                    first.line
                ),
            ),
            Some((first_flock, first)) => r.error(
                at,
                format!(
                    "`{what}.external`: chat `{external}` is already mapped to `{first_flock}` \
                     (line {}); an inbound message from it would not know its channel: map each \
                     chat to one Flock channel",
                    first.line
                ),
            ),
            None => {
                chats.insert(external.clone(), (flock.clone(), item.pos));
                mappings.push(BridgeMapping { flock, external, allow, responder, replies });
            }
        }
    }
    mappings
}

/// `…channels[j].flock`: a Flock channel id.
fn flock_channel(r: &mut Report<'_>, node: &Node, what: &str) -> Option<String> {
    if node.is_null() {
        r.error(
            node.pos,
            format!(
                "`{what}` has no value; write the Flock channel id after the colon (`#` starts a \
                 YAML comment: write `general`, not `#general`)"
            ),
        );
        return None;
    }
    let id = r.string(node, what)?;
    if !valid_channel_id(&id) {
        r.error(
            node.pos,
            format!(
                "`{what}`: `{id}` is not a Flock channel id; use 1 to 63 lowercase letters, \
                 digits and `-`, starting with a letter or digit (e.g. `{}`)",
                suggest_channel_id(&id)
            ),
        );
        return None;
    }
    Some(id)
}

/// `…channels[j].allow`: the platform user ids who may post; `None` if it has a problem
/// (reported).
fn allow(r: &mut Report<'_>, node: &Node, what: &str) -> Option<Vec<String>> {
    user_ids(r, node, what, "nobody could post", "leave `allow` out to let everyone post")
}

/// A non-empty list of platform user ids; `empty` says what an empty one would mean, `fix` how
/// to do without the key.
fn user_ids(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    empty: &str,
    fix: &str,
) -> Option<Vec<String>> {
    if node.is_null() {
        r.error(node.pos, format!("`{what}` has no value; list the platform user ids, or {fix}"));
        return None;
    }
    let items = r.list(node, what)?;
    if items.is_empty() {
        r.error(node.pos, format!("`{what}` is empty: {empty}; {fix}"));
        return None;
    }
    let mut ids = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        match platform_id(r, item, &format!("{what}[{i}]"), "a user id") {
            Some(id) => ids.push(id),
            None => ok = false,
        }
    }
    ok.then_some(ids)
}

/// A platform's chat or user id: text, or a YAML integer kept as its decimal text; 1 to
/// [`MAX_PLATFORM_ID`] characters.
fn platform_id(r: &mut Report<'_>, node: &Node, what: &str, kind: &str) -> Option<String> {
    let id = match node.scalar() {
        Some(Scalar::Str(text)) => text.to_owned(),
        Some(Scalar::Int(n)) => n.to_string(),
        Some(Scalar::Null) => {
            r.error(node.pos, format!("`{what}` has no value; write {kind} after the colon"));
            return None;
        }
        _ => {
            r.error(
                node.pos,
                format!(
                    "`{what}` must be {kind} as text or a whole number, found {}; put it in quotes",
                    node.describe()
                ),
            );
            return None;
        }
    };
    if id.trim().is_empty() {
        r.error(node.pos, format!("`{what}` is empty; write {kind}"));
        return None;
    }
    let chars = id.chars().count();
    if chars > MAX_PLATFORM_ID {
        r.error(
            node.pos,
            format!("`{what}` is {chars} characters long; {kind} has at most {MAX_PLATFORM_ID}"),
        );
        return None;
    }
    Some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_names_follow_the_shell_rules() {
        assert!(valid_env_name("API_KEY"));
        assert!(valid_env_name("_X1"));
        assert!(!valid_env_name("1X"));
        assert!(!valid_env_name("api_key"));
        assert!(!valid_env_name(""));
        assert_eq!(suggest_env_name("api-key"), "API_KEY");
    }

    #[test]
    fn suggested_agent_names_are_valid() {
        assert_eq!(suggest_name("Worker_1"), "worker-1");
        assert_eq!(suggest_name("_x"), "x");
        assert!(valid_agent_name(&suggest_name("!!!")));
    }

    #[test]
    fn role_table_lists_every_role() {
        assert!(roles().iter().all(|(name, role)| role.as_str() == *name));
    }

    // `bridges:`. Every file below starts with the same four lines (a swarm with one agent named
    // `helper`, at line 4) and `bridges:` at line 5, so the first bridge starts at line 6.

    fn with_bridges(bridges: &str) -> String {
        format!(
            "swarm:\n  name: t\nagents:\n  - {{ name: helper, role: worker }}\nbridges:\n{bridges}"
        )
    }

    fn parse_ok(text: &str) -> SwarmSpec {
        match crate::parse(text, Path::new("swarm.yaml")) {
            Ok(spec) => spec,
            Err(errors) => panic!("expected a valid swarm, got:\n{errors}"),
        }
    }

    /// Asserts the errors, in order: each at `line`, its message containing every part.
    fn assert_errors(text: &str, expected: &[(usize, &[&str])]) -> Vec<crate::ConfigError> {
        let errors = match crate::parse(text, Path::new("swarm.yaml")) {
            Ok(spec) => panic!("expected errors, got a valid swarm: {spec:?}"),
            Err(errors) => errors.0,
        };
        assert_eq!(errors.len(), expected.len(), "got {errors:#?}");
        for (error, (line, parts)) in errors.iter().zip(expected) {
            assert_eq!(error.line, *line, "wrong line for {error:?}");
            for part in *parts {
                assert!(error.message.contains(part), "`{part}` not in: {}", error.message);
            }
        }
        errors
    }

    /// A valid bridge named `name`, five lines.
    fn tg(name: &str) -> String {
        format!(
            "  - name: {name}\n    platform: telegram\n    token_env: TG_TOKEN\n    channels:\n      \
             - {{ flock: general, external: 42 }}\n"
        )
    }

    #[test]
    fn a_valid_bridge_file_parses_to_the_exact_spec_with_defaults_filled() {
        let spec = parse_ok(&with_bridges(
            "  - name: team-telegram
    platform: telegram
    token_env: TELEGRAM_BOT_TOKEN
    api_url: http://127.0.0.1:8081/     # the trailing / is trimmed
    max_posts_per_minute: 600
    channels:
      - flock: general
        external: \"-1001234567890\"
        allow: [\"123456789\", 42]
      - flock: random
        external: -1009
      - flock: general
        external: C0123ABC
  - name: second
    platform: telegram
    token_env: OTHER_TOKEN
    channels:
      - { flock: ops-1, external: 0x10 }
",
        ));
        let mapping = |flock: &str, external: &str, allow: Option<&[&str]>| BridgeMapping {
            flock: flock.to_owned(),
            external: external.to_owned(),
            allow: allow.map(|ids| ids.iter().map(|id| (*id).to_owned()).collect()),
            responder: None,
            replies: Default::default(),
        };
        let expected = vec![
            BridgeSpec {
                name: "team-telegram".to_owned(),
                platform: Platform::Telegram,
                token_env: "TELEGRAM_BOT_TOKEN".to_owned(),
                app_token_env: None,
                api_url: Some("http://127.0.0.1:8081".to_owned()),
                channels: vec![
                    mapping("general", "-1001234567890", Some(&["123456789", "42"])),
                    mapping("random", "-1009", None),
                    mapping("general", "C0123ABC", None),
                ],
                max_posts_per_minute: 600,
                mirror_new_channels: false,
                // No coordinator or orchestrator in the swarm: nobody answers DMs.
                dm: None,
                approvals: None,
                approvers: Vec::new(),
            },
            BridgeSpec {
                name: "second".to_owned(),
                platform: Platform::Telegram,
                token_env: "OTHER_TOKEN".to_owned(),
                app_token_env: None,
                api_url: None,
                // A YAML integer is kept as its decimal text.
                channels: vec![mapping("ops-1", "16", None)],
                max_posts_per_minute: 20,
                mirror_new_channels: false,
                dm: None,
                approvals: None,
                approvers: Vec::new(),
            },
        ];
        assert_eq!(spec.bridges, expected);
    }

    #[test]
    fn a_workspace_may_not_be_the_workspaces_folder_nor_hold_another_agents() {
        let text = "swarm:\n  name: t\nagents:\n  - { name: a, role: worker, workspace: \".\" }\n  \
                    - { name: b, role: worker, workspace: shared }\n  - { name: c, role: worker, \
                    workspace: shared/c }\n  - { name: d, role: worker, workspace: b }\n  - { name: \
                    e, role: worker, workspace: shared }\n";
        assert_errors(
            text,
            &[
                (4, &["`agents.a.workspace`: `.` is the state dir's workspaces/ folder itself"]),
                (5, &["agent `b`'s workspace `shared` holds agent `c`'s (`shared/c`)"]),
                (8, &["agent `e`'s workspace `shared` holds agent `c`'s"]),
            ],
        );
    }

    #[test]
    fn the_chat_door_keys_parse_and_dms_default_to_the_coordinator() {
        let text = "swarm:\n  name: t\nagents:\n  - { name: helper, role: worker }\n  - { name: \
                    coord, role: coordinator }\nbridges:\n  - name: tg\n    platform: telegram\n    \
                    token_env: TG_TOKEN\n    approvals: general\n    approvers: [\"7\", 8]\n    \
                    channels:\n      - { flock: general, external: 42, responder: helper, replies: \
                    channel }\n  - name: tg2\n    platform: telegram\n    token_env: T2\n    dm: \
                    { allow: [\"5\"] }\n    channels:\n      - { flock: ops, external: 43 }\n  - \
                    name: tg3\n    platform: telegram\n    token_env: T3\n    dm: false\n    \
                    channels:\n      - { flock: ops, external: 44 }\n";
        let spec = parse_ok(text);
        let [a, b, c] = &spec.bridges[..] else { panic!("three bridges: {:?}", spec.bridges) };
        assert_eq!(a.channels[0].responder.as_deref(), Some("helper"));
        assert_eq!(a.channels[0].replies, Replies::Channel);
        assert_eq!(a.approvals.as_deref(), Some("general"));
        assert_eq!(a.approvers, ["7", "8"]);
        let coord = DmSpec { agent: "coord".into(), allow: None };
        assert_eq!(a.dm.as_ref(), Some(&coord), "DMs go to the coordinator by default");
        assert_eq!(b.channels[0].replies, Replies::Thread, "replies are threaded by default");
        assert_eq!(b.dm, Some(DmSpec { agent: "coord".into(), allow: Some(vec!["5".into()]) }));
        assert_eq!(c.dm, None, "`dm: false`");
    }

    #[test]
    fn chat_door_mistakes_are_named_with_their_line() {
        let text = with_bridges(
            "  - name: tg\n    platform: telegram\n    token_env: TG_TOKEN\n    approvals: \
             elsewhere\n    approvers: [\"1\"]\n    dm: { agent: helpr }\n    channels:\n      - { flock: general, \
             external: 42, responder: nobody, replies: threaded }\n  - name: tg2\n    platform: \
             telegram\n    token_env: T2\n    approvals: ops\n    channels:\n      - { flock: ops, \
             external: 43 }\n",
        );
        assert_errors(
            &text,
            &[
                (9, &["`bridges[0].approvals`: `elsewhere` is not one of this bridge's channels"]),
                (11, &["`bridges[0].dm.agent`: no agent named `helpr`", "did you mean `helper`?"]),
                (13, &["`bridges[0].channels[0].responder`: no agent named `nobody`"]),
                (13, &["`bridges[0].channels[0].replies` must be `thread`", "or `channel`"]),
                (17, &["`bridges[1].approvals` announces permission requests, but no `approvers`"]),
            ],
        );
    }

    #[test]
    fn a_swarm_without_bridges_has_none() {
        let plain = "swarm:\n  name: t\nagents:\n  - { name: helper, role: worker }\n";
        assert_eq!(parse_ok(plain).bridges, vec![]);
        assert_eq!(parse_ok(&with_bridges("")).bridges, vec![]);
        assert_eq!(parse_ok(&with_bridges("  []\n")).bridges, vec![]);
        // `bridges` is a known top-level key; a typo of it is suggested.
        assert_errors(
            &plain.replace("agents:", "bridgez: []\nagents:"),
            &[(3, &["unknown key `bridgez`", "did you mean `bridges`?"])],
        );
    }

    #[test]
    fn bridges_are_a_list_of_mappings_without_unknown_keys() {
        assert_errors(&with_bridges("  team: {}\n"), &[(6, &["`bridges` must be a list"])]);
        let mut text = with_bridges("  - telegram\n");
        text.push_str(&tg("tg").replace("    token_env", "    tokn_env: X\n    token_env"));
        assert_errors(
            &text,
            &[
                (6, &["`bridges[0]` must be a mapping"]),
                (9, &["unknown key `tokn_env` in `bridges[1]`", "did you mean `token_env`?"]),
            ],
        );
    }

    #[test]
    fn bridge_names_are_valid_unique_and_not_an_agents() {
        let text = with_bridges(&format!(
            "{}{}{}{}{}",
            tg("Team_TG"),
            tg(&"a".repeat(32)),
            tg("tg"),
            tg("tg"),
            tg("helper"),
        )) + "  - { platform: telegram, token_env: T, channels: [{ flock: g, external: 1 }] }\n";
        assert_errors(
            &text,
            &[
                (6, &["`bridges[0].name`: invalid bridge name `Team_TG`", "1 to 31", "e.g."]),
                (11, &["`bridges[1].name`: invalid bridge name", "1 to 31 lowercase"]),
                (21, &["duplicate bridge name `tg` (first at line 16)", "rename one"]),
                (26, &["bridge `helper` has the same name as agent `helper` (line 4)", "rename"]),
                (31, &["`bridges[5]` has no `name`", "add `name: team-telegram`"]),
            ],
        );
    }

    #[test]
    fn platforms_are_known_and_slack_names_its_app_token() {
        let text = with_bridges(&format!(
            "{}{}{}{}",
            tg("a").replace("telegram", "discord"),
            tg("b").replace("telegram", "slack"),
            tg("c").replace("telegram", "irc"),
            tg("d").replace("telegram", "telegarm"),
        )) + "  - { name: e, token_env: T, channels: [{ flock: g, external: 1 }] }\n"
            + "  - { name: f, platform: telegram, token_env: T, app_token_env: A, channels: [{ flock: g, external: 1 }] }\n";
        assert_errors(
            &text,
            &[
                (11, &["`bridges[1]` has no `app_token_env`", "SLACK_APP_TOKEN", "xapp-"]),
                (17, &["unknown platform `irc`; known: discord, slack, telegram"]),
                (22, &["unknown platform `telegarm`", "did you mean `telegram`?"]),
                (26, &["`bridges[4]` has no `platform`", "`platform: telegram`"]),
                (27, &["`bridges[5].app_token_env` is for Slack bridges only"]),
            ],
        );
        let ok = with_bridges(
            &tg("s")
                .replace("telegram", "slack")
                .replace("    token_env", "    app_token_env: SLACK_APP_TOKEN\n    token_env"),
        );
        let spec =
            crate::parse(&ok, std::path::Path::new("swarm.yaml")).expect("a valid slack bridge");
        assert_eq!(spec.bridges[0].app_token_env.as_deref(), Some("SLACK_APP_TOKEN"));
    }

    #[test]
    fn token_env_must_be_a_variable_name() {
        let text = with_bridges(&format!(
            "{}{}",
            tg("a").replace("TG_TOKEN", "1TOKEN"),
            tg("b").replace("TG_TOKEN", "MY-TOKEN"),
        )) + "  - { name: c, platform: telegram, channels: [{ flock: g, external: 1 }] }\n";
        assert_errors(
            &text,
            &[
                (8, &["`bridges[0].token_env` must name an environment variable", "A-Z"]),
                (13, &["`bridges[1].token_env` must name an environment variable"]),
                (16, &["`bridges[2]` has no `token_env`", "TELEGRAM_BOT_TOKEN"]),
            ],
        );
    }

    #[test]
    fn a_token_written_as_token_env_is_refused_without_repeating_it() {
        let tokens =
            ["123456789:AAHs3cr3t-Value_xyz", "xoxb-1234-abcdef", &"SECRET".repeat(11), "Bot abc"];
        for token in tokens {
            let text = with_bridges(&tg("a").replace("TG_TOKEN", &format!("\"{token}\"")));
            let errors = assert_errors(
                &text,
                &[(
                    8,
                    &["`bridges[0].token_env` must name an environment variable (A-Z, 0-9, _), \
                       not hold the token itself"],
                )],
            );
            let shown = crate::ConfigErrors(errors).to_string();
            assert!(!shown.contains(token), "the token is repeated in: {shown}");
            for part in token.split([':', '-', ' ']).filter(|p| p.len() > 3) {
                assert!(!shown.contains(part), "part of the token is repeated in: {shown}");
            }
        }
    }

    #[test]
    fn api_url_is_an_http_base_url() {
        let url = |name: &str, value: &str| {
            tg(name).replace("    channels:", &format!("    api_url: {value}\n    channels:"))
        };
        let long = format!("https://example.com/{}", "a".repeat(2040));
        let text = with_bridges(&format!(
            "{}{}{}{}{}",
            url("a", "ftp://example.com"),
            url("b", "\"http://exa mple.com\""),
            url("c", &long),
            url("d", "http://"),
            url("e", "https://api.telegram.org/bot123456:SECRETtoken/"),
        ));
        let errors = assert_errors(
            &text,
            &[
                (9, &["`bridges[0].api_url` must start with http:// or https://"]),
                (15, &["`bridges[1].api_url` contains whitespace"]),
                (21, &["`bridges[2].api_url` is 2060 bytes long; at most 2048"]),
                (27, &["`bridges[3].api_url` has no host"]),
                (33, &["`bridges[4].api_url` holds a bot token", "token_env"]),
            ],
        );
        assert!(!errors[4].message.contains("SECRETtoken"), "{}", errors[4].message);
        let spec = parse_ok(&with_bridges(&url("x", "https://tg.example.com/api//")));
        assert_eq!(spec.bridges[0].api_url.as_deref(), Some("https://tg.example.com/api"));
    }

    #[test]
    fn only_slack_and_discord_bridges_mirror_new_channels() {
        let text = with_bridges(
            &tg("a").replace("    channels:", "    mirror_new_channels: true\n    channels:"),
        );
        assert_errors(
            &text,
            &[(9, &["`bridges[0].mirror_new_channels`: a Telegram bot cannot create groups"])],
        );
        let spec = parse_ok(&with_bridges(&tg("x")));
        assert!(!spec.bridges[0].mirror_new_channels, "off unless asked for");
    }

    #[test]
    fn max_posts_per_minute_is_1_to_600() {
        let posts = |name: &str, n: &str| {
            tg(name)
                .replace("    channels:", &format!("    max_posts_per_minute: {n}\n    channels:"))
        };
        let text = with_bridges(&format!(
            "{}{}{}",
            posts("a", "0"),
            posts("b", "601"),
            posts("c", "many")
        ));
        assert_errors(
            &text,
            &[
                (9, &["`bridges[0].max_posts_per_minute` must be at least 1"]),
                (15, &["`bridges[1].max_posts_per_minute` must be at most 600"]),
                (21, &["`bridges[2].max_posts_per_minute` must be a whole number"]),
            ],
        );
        let spec = parse_ok(&with_bridges(&posts("x", "1")));
        assert_eq!(spec.bridges[0].max_posts_per_minute, 1);
    }

    #[test]
    fn a_bridge_needs_at_least_one_channel() {
        let head = |name: &str| {
            format!("  - name: {name}\n    platform: telegram\n    token_env: TG_TOKEN\n")
        };
        let text = with_bridges(&format!(
            "{}{}    channels:\n{}    channels: []\n{}    channels: general\n",
            head("a"),
            head("b"),
            head("c"),
            head("d"),
        ));
        assert_errors(
            &text,
            &[
                (6, &["`bridges[0]` has no `channels`", "flock: general"]),
                (12, &["`bridges[1].channels` is empty", "map at least one"]),
                (16, &["`bridges[2].channels` is empty"]),
                (20, &["`bridges[3].channels` must be a list"]),
            ],
        );
    }

    #[test]
    fn channel_mappings_are_checked() {
        let text = with_bridges(
            "  - name: x
    platform: telegram
    token_env: TG_TOKEN
    channels:
      - external: 1
      - { flock: General!, external: 2 }
      - flock: #general
        external: 3
      - flock: ok
      - { flock: ok, external: \"\" }
      - { flock: ok, external: 1.5 }
      - { flock: ok, external: true }
      - flock: ok
        external: 4
        chat: 5
",
        ) + &format!("      - {{ flock: ok, external: \"{}\" }}\n", "9".repeat(129));
        assert_errors(
            &text,
            &[
                (10, &["`bridges[0].channels[0]` has no `flock`", "flock: general"]),
                (
                    11,
                    &[
                        "`bridges[0].channels[1].flock`: `General!` is not a Flock channel id",
                        "general",
                    ],
                ),
                (12, &["`bridges[0].channels[2].flock` has no value", "not `#general`"]),
                (14, &["`bridges[0].channels[3]` has no `external`"]),
                (15, &["`bridges[0].channels[4].external` is empty"]),
                (16, &["`bridges[0].channels[5].external` must be the chat's id", "quotes"]),
                (17, &["`bridges[0].channels[6].external` must be the chat's id"]),
                (20, &["unknown key `chat` in `bridges[0].channels[7]`"]),
                (21, &["`bridges[0].channels[8].external` is 129 characters long", "at most 128"]),
            ],
        );
    }

    #[test]
    fn allow_lists_who_may_post_and_is_never_empty() {
        let allow = |name: &str, value: &str| {
            tg(name).replace(
                "      - { flock: general, external: 42 }",
                &format!("      - flock: general\n        external: 42\n        allow: {value}"),
            )
        };
        let text = with_bridges(&format!(
            "{}{}{}{}{}",
            allow("a", "[]"),
            allow("b", ""),
            allow("c", "[\"7\", \"\"]"),
            allow("d", "[[1]]"),
            allow("e", "everyone"),
        ));
        assert_errors(
            &text,
            &[
                (
                    12,
                    &["`bridges[0].channels[0].allow` is empty: nobody could post; leave \
                         `allow` out to let everyone post"],
                ),
                (19, &["`bridges[1].channels[0].allow` has no value", "leave `allow` out"]),
                (26, &["`bridges[2].channels[0].allow[1]` is empty"]),
                (33, &["`bridges[3].channels[0].allow[0]` must be a user id", "found a list"]),
                (40, &["`bridges[4].channels[0].allow` must be a list"]),
            ],
        );
    }

    #[test]
    fn a_chat_is_mapped_once_per_bridge() {
        let text = with_bridges(
            "  - name: x
    platform: telegram
    token_env: TG_TOKEN
    channels:
      - { flock: general, external: 1 }
      - { flock: random, external: \"1\" }
      - { flock: general, external: 2 }
      - { flock: general, external: 2 }
",
        );
        assert_errors(
            &text,
            &[
                (
                    11,
                    &[
                        "chat `1` is already mapped to `general` (line 10)",
                        "would not know its channel",
                    ],
                ),
                (13, &["maps `general` to chat `2` again (first at line 12)"]),
            ],
        );
        // One Flock channel may reach several chats, and two bridges may share a chat.
        let spec = parse_ok(&with_bridges(&format!(
            "{}{}",
            tg("a").replace(
                "{ flock: general, external: 42 }",
                "{ flock: g, external: 1 }\n      - { flock: g, external: 2 }"
            ),
            tg("b"),
        )));
        assert_eq!(spec.bridges[0].channels.len(), 2);
        assert_eq!(spec.bridges[1].channels[0].external, "42");
    }
}
