//! Validation of a whole swarm file: walks the raw YAML tree section by section, reports every
//! problem to the [`Report`], and builds the [`SwarmSpec`] (which the caller discards if anything
//! was reported).
//!
//! Cross-references (`can_call`, `model`, `args.to` in transcripts) are checked after the names
//! they point to have been collected, so their order in the file does not matter.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use crate::error::Pos;
use crate::error::{Report, closest, list};
use crate::section::{self, Field, boolean, uint};
use crate::spec::{
    AgentSpec, BridgeMapping, BridgeSpec, BudgetSpec, ChannelsSpec, Delegate, DeliverySpec, DmSpec,
    ExtensionSpec, MaskRule, ModelSpec, Platform, Replies, RestartPolicy, Role, SandboxKind,
    Strategy, SupervisionSpec, SwarmSpec, TiersSpec,
};
use crate::transcript::{self, Target};
use crate::valid_agent_name;
use crate::yaml::{self, Node, Scalar, Value, lookup};

mod agents;
mod bridges;
mod cluster;
mod models;

use agents::*;

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
    "cluster",
];
/// `supervision:` — how children are restarted and watched.
const SUPERVISION: &[Field<SupervisionSpec>] = &[
    Field {
        key: "strategy",
        read: |r, v, what, s| {
            if let Some(strategy) = r.choice(v, what, "strategy", STRATEGIES) {
                s.strategy = strategy;
            }
        },
    },
    uint!("max_restarts", 0, U32_MAX, max_restarts),
    // A zero-second window would never count two restarts together: intensity would be off.
    uint!("max_seconds", 1, U64_MAX, max_seconds),
    uint!("backoff_initial_ms", 0, U64_MAX, backoff_initial_ms),
    uint!("backoff_max_ms", 0, U64_MAX, backoff_max_ms),
    uint!("backoff_reset_secs", 0, U64_MAX, backoff_reset_secs),
    boolean!("escalate", escalate),
    // Below 10 ms heartbeats would be most of what the supervisor does.
    uint!("heartbeat_interval_ms", 10, U64_MAX, heartbeat_interval_ms),
    uint!("heartbeat_misses", 1, U32_MAX, heartbeat_misses),
    uint!("parallel", 1, MAX_PARALLEL, parallel),
];

/// `delivery:` — durable mailboxes, requests and frames.
const DELIVERY: &[Field<DeliverySpec>] = &[
    uint!("max_delivery_attempts", 1, U32_MAX, max_delivery_attempts),
    uint!("request_timeout_ms", 1, U64_MAX, request_timeout_ms),
    // A frame must hold at least a small message; above 1 GiB one frame could exhaust memory.
    uint!("max_frame_bytes", 1024, GIB, max_frame_bytes),
    uint!("outbox_frames", 16, U32_MAX, outbox_frames),
    uint!("window", 1, MAX_WINDOW, window),
];

/// `channels:` — delta notifications, the archive deadline and the quiet notice.
const CHANNELS: &[Field<ChannelsSpec>] = &[
    uint!("delta_delay_min_ms", 0, U64_MAX, delta_delay_min_ms),
    uint!("delta_delay_max_ms", 0, U64_MAX, delta_delay_max_ms),
    uint!("archive_deadline_secs", 1, U64_MAX, archive_deadline_secs),
    uint!("quiet_secs", 0, U64_MAX, quiet_secs),
];

/// `budget:` — what one chain of turns may use.
const BUDGET: &[Field<BudgetSpec>] = &[
    uint!("max_hops", 1, U32_MAX, max_hops),
    uint!("max_tokens", 1, U64_MAX, max_tokens),
    uint!("max_wall_secs", 1, U64_MAX, max_wall_secs),
];

/// `memory.tiers` — when memory day files move (days; at most 100 years).
const TIERS: &[Field<TiersSpec>] = &[
    uint!("warm_after_days", 1, 36_500, warm_after_days),
    uint!("cold_after_days", 1, 36_500, cold_after_days),
];

const SWARM_KEYS: &[&str] = &["name"];
/// Keys every model takes (the scripted model's only); a model's keys are these, the
/// [`REMOTE_KEYS`] and the [`LOCAL_KEYS`].
const MODEL_KEYS: &[&str] = &["provider", "transcript", "rules"];
/// Keys only the embedded model takes.
const LOCAL_KEYS: &[&str] = &["path", "threads", "ctx", "slots"];
/// Keys only a remote (HTTP) model takes.
const REMOTE_KEYS: &[&str] = &[
    "base_url",
    "model",
    "api_key_env",
    "timeout_secs",
    "max_tokens",
    "retry_base_ms",
    "strict_tools",
];
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
    "delegate",
    "host",
    "delivery_window",
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
const DELEGATES: &[(&str, Delegate)] =
    &[("when-needed", Delegate::WhenNeeded), ("always", Delegate::Always)];
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
/// The largest delivery window: past it an agent would hold more of its mailbox in memory than
/// it can work through before a crash throws it away.
const MAX_WINDOW: i128 = 4096;
/// The most agents starting at once: past it the forks, execs and handshakes only queue up on
/// the machine's cores.
const MAX_PARALLEL: i128 = 256;

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
        clustered: false,
        named_hosts: Vec::new(),
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
    /// The file has a `cluster:` section (agents may name a `host:`).
    clustered: bool,
    /// The hosts `cluster.failover` and `cluster.operators` name, where, and which key (checked
    /// once the agents are read).
    named_hosts: Vec<(String, crate::error::Pos, &'static str)>,
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
        let (mask, tiers) = match lookup(top, "memory") {
            Some((_, node)) => self.memory(node),
            None => (Vec::new(), TiersSpec::default()),
        };
        if let Some((_, node)) = lookup(top, "models") {
            self.models(node);
        }
        self.clustered = lookup(top, "cluster").is_some();
        let cluster = lookup(top, "cluster").and_then(|(_, node)| self.cluster(node));
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
        if let Some(c) = &cluster {
            let mut hosts = vec![c.leader.clone()];
            for a in &agents {
                if let Some(h) = &a.host
                    && !hosts.contains(h)
                {
                    hosts.push(h.clone());
                }
            }
            self.check_named_hosts(&hosts);
        }

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
            tiers,
            bridges,
            cluster,
        })
    }

    /// `memory: { mask: …, tiers: … }`.
    fn memory(&mut self, node: &Node) -> (Vec<MaskRule>, TiersSpec) {
        if node.is_null() {
            return (Vec::new(), TiersSpec::default());
        }
        let Some(entries) = self.report.mapping(node, "memory") else {
            return (Vec::new(), TiersSpec::default());
        };
        self.report.unknown_keys(entries, &["mask", "tiers"], "`memory`");
        let tiers = match lookup(entries, "tiers") {
            Some((_, node)) => {
                let tiers = section::read(&mut self.report, node, "memory.tiers", TIERS).0;
                if tiers.cold_after_days <= tiers.warm_after_days {
                    self.report.error(
                        node.pos,
                        format!(
                            "`memory.tiers.cold_after_days` ({}) must be more than \
                             `warm_after_days` ({}): a file is warm before it is cold",
                            tiers.cold_after_days, tiers.warm_after_days
                        ),
                    );
                }
                tiers
            }
            None => TiersSpec::default(),
        };
        (self.mask_rules(entries), tiers)
    }

    /// `memory.mask: [{name, pattern}, …]`: the swarm's own masking rules, each a regular
    /// expression that compiles and cannot match nothing (it would mask between every letter).
    fn mask_rules(&mut self, entries: &[(Node, Node)]) -> Vec<MaskRule> {
        let mut rules = Vec::new();
        let r = &mut self.report;
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
        // The name is shown in logs, `ps` and every agent's Welcome: the agents' rule keeps it
        // one plain word.
        if !valid_agent_name(&name) {
            self.report.error(
                value.pos,
                format!(
                    "`swarm.name` `{name}` is not a valid name: use lowercase letters, digits and `-` \
                     (at most 63), e.g. `{}`",
                    suggest_name(&name)
                ),
            );
            return None;
        }
        Some(name)
    }

    fn supervision(&mut self, node: &Node) -> SupervisionSpec {
        let (spec, entries) = section::read(&mut self.report, node, "supervision", SUPERVISION);
        if spec.backoff_max_ms < spec.backoff_initial_ms
            && let Some(v) = section::read_number(entries, "backoff_max_ms")
        {
            self.report.error(
                v.pos,
                format!(
                    "`supervision.backoff_max_ms` ({}) is below `backoff_initial_ms` ({}); \
                     the cap must be at least the first step",
                    spec.backoff_max_ms, spec.backoff_initial_ms
                ),
            );
        }
        spec
    }

    fn delivery(&mut self, node: &Node) -> DeliverySpec {
        section::read(&mut self.report, node, "delivery", DELIVERY).0
    }

    fn channels(&mut self, node: &Node) -> ChannelsSpec {
        let (spec, entries) = section::read(&mut self.report, node, "channels", CHANNELS);
        if spec.delta_delay_max_ms < spec.delta_delay_min_ms
            && let Some(v) = section::read_number(entries, "delta_delay_max_ms")
        {
            self.report.error(
                v.pos,
                format!(
                    "`channels.delta_delay_max_ms` ({}) is below `delta_delay_min_ms` ({}); raise it or lower the minimum",
                    spec.delta_delay_max_ms, spec.delta_delay_min_ms
                ),
            );
        }
        spec
    }

    fn budget(&mut self, node: &Node) -> BudgetSpec {
        section::read(&mut self.report, node, "budget", BUDGET).0
    }
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
