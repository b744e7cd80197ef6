//! The tool table: every tool an agent can call, in one place.
//!
//! One [`ToolSpec`] per tool says where the call is answered ([`Owner`]), which roles may call
//! it ([`Access`]), whether models see it by default ([`Offer`]), and what its model is told
//! (description and JSON Schema of the arguments). Everything else is derived from this table:
//! the names a swarm file's `tools:` and a scripted transcript may use, [`Role::may_use`], the
//! schemas the agent offers its model, and where the router and the agent send a call.
//!
//! Adding a tool is one entry here and one handler in the part its [`Owner`] names.

use serde_json::{Value, json};

use crate::Role;

/// Where a tool call is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// Not a `ToolCall`: the agent sends a mailbox frame (`Send`, `Request`, `Delegate`).
    Mailbox,
    /// The router, from its own tables (agents, the caller's chain).
    Router,
    /// The channels actor (channels, cards, agents created and spawned).
    Channels,
    /// The permissions actor (requests, verdicts, grants).
    Permissions,
    /// The swarm's memory, on the supervisor's side: its index, and the one writer of its files
    /// (agents see them read-only).
    Memory,
    /// The journal (an agent's own recent events).
    Journal,
    /// The agent itself, in its workspace and sandbox (files, commands, data).
    Workspace,
}

impl Owner {
    /// Whether the call runs inside the agent's process, not on the supervisor's side.
    pub fn is_local(self) -> bool {
        self == Owner::Workspace
    }
}

/// Which agents may call a tool. People (through `flockctl`) are checked by the owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Every role.
    Everyone,
    /// Every role but the sysadmin, which triages and talks in channels and does nothing else.
    NotSysadmin,
    /// Only these roles.
    Only(&'static [Role]),
    /// No agent: people only, through `flockctl`.
    People,
}

impl Access {
    pub fn allows(self, role: Role) -> bool {
        match self {
            Access::Everyone => true,
            Access::NotSysadmin => role != Role::Sysadmin,
            Access::Only(roles) => roles.contains(&role),
            Access::People => false,
        }
    }

    /// Who may call, in words for an error message.
    pub fn who(self) -> String {
        match self {
            Access::Everyone => "every role may".into(),
            Access::NotSysadmin => "every role but the sysadmin may".into(),
            Access::Only(roles) => {
                let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
                format!("only the {} may", names.join(" and the "))
            }
            Access::People => "only people may, through flockctl".into(),
        }
    }
}

/// Whether a model sees a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Offered to every agent whose role may call it.
    Default,
    /// Offered only when the agent's `tools:` lists it (it would lengthen every prompt of a
    /// small model for little use by default).
    OptIn,
    /// The runtime's own call (or a person's): never offered, not a name for `tools:`.
    Internal,
}

/// One tool.
#[derive(Debug, Clone, Copy)]
pub struct ToolSpec {
    pub name: &'static str,
    pub owner: Owner,
    pub access: Access,
    pub offer: Offer,
    /// What the model is told the tool does.
    pub description: &'static str,
    /// The JSON Schema of the arguments (an object).
    pub params: fn() -> Value,
}

impl ToolSpec {
    /// Whether a model may be offered this tool and a swarm file may name it.
    pub fn is_model_tool(&self) -> bool {
        self.offer != Offer::Internal
    }
}

/// The memory record categories `memory_remember` accepts (the memory crate's `CATEGORIES`;
/// a test in the agent checks they agree).
pub const MEMORY_CATEGORIES: &[&str] =
    &["state", "decision", "preference", "task", "fact", "event", "relationship", "skill"];

const WORKERS: Access = Access::Only(&[Role::Worker]);
const ORCHESTRATOR: Access = Access::Only(&[Role::Orchestrator]);
const SYSADMIN: Access = Access::Only(&[Role::Sysadmin]);

fn s(d: &str) -> Value {
    json!({"type": "string", "description": d})
}
fn list(d: &str) -> Value {
    json!({"type": "array", "items": {"type": "string"}, "description": d})
}
fn obj(props: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": props, "required": required})
}
fn none() -> Value {
    obj(json!({}), &[])
}

macro_rules! tool {
    ($name:literal, $owner:ident, $access:expr, $offer:ident, $desc:expr, $params:expr $(,)?) => {
        ToolSpec {
            name: $name,
            owner: Owner::$owner,
            access: $access,
            offer: Offer::$offer,
            description: $desc,
            params: $params,
        }
    };
}

/// Every tool, in the order models are offered them.
pub static TOOLS: &[ToolSpec] = &[
    tool!(
        "agents__send",
        Mailbox,
        Access::NotSysadmin,
        Default,
        "Send a message to another agent's durable mailbox (no answer awaited).",
        || obj(json!({"to": s("agent name"), "text": s("the message")}), &["to", "text"])
    ),
    tool!(
        "agents__delegate",
        Mailbox,
        Access::NotSysadmin,
        Default,
        "Hand the request to another agent when it asks for work (a plan, a list, writing, a \
         file): it does the work and its answer comes back to you as a [result].",
        || obj(json!({"to": s("agent name"), "task": s("the request, in full")}), &["to", "task"])
    ),
    tool!(
        "agents__request",
        Mailbox,
        Access::NotSysadmin,
        Default,
        "Ask another agent and wait for its answer.",
        || obj(
            json!({"to": s("agent name"), "text": s("the question"), "timeout_ms": {"type": "integer"}}),
            &["to", "text"],
        )
    ),
    tool!("fs_read", Workspace, WORKERS, Default, "Read a text file of your workspace.", || obj(
        json!({"path": s("file path inside your workspace, e.g. notes/plan.md")}),
        &["path"]
    )),
    tool!(
        "fs_write",
        Workspace,
        WORKERS,
        Default,
        "Create or replace a file of your workspace with this content (folders are made).",
        || obj(
            json!({"path": s("file path inside your workspace"), "content": s("the whole new content")}),
            &["path", "content"],
        )
    ),
    tool!(
        "fs_list",
        Workspace,
        WORKERS,
        Default,
        "List the files of your workspace (or of a folder in it).",
        || obj(json!({"path": s("folder inside your workspace; empty for all of it")}), &[])
    ),
    tool!(
        "fs_search",
        Workspace,
        WORKERS,
        Default,
        "Find the lines of your workspace's files that contain a text.",
        || obj(
            json!({"query": s("the text to find"), "path": s("folder to search in; empty for all")}),
            &["query"],
        )
    ),
    tool!(
        "fs_patch",
        Workspace,
        WORKERS,
        Default,
        "Change a file of your workspace with a unified diff (@@ hunks).",
        || obj(
            json!({"path": s("file path inside your workspace"), "diff": s("the unified diff")}),
            &["path", "diff"],
        )
    ),
    tool!(
        "exec",
        Workspace,
        WORKERS,
        Default,
        "Run a shell command in your workspace (a sandbox: no network, no files outside the \
         workspace); returns the exit status and output.",
        || obj(
            json!({"command": s("the shell command, e.g. `sh test.sh`"), "timeout_secs": {"type": "integer"}}),
            &["command"],
        )
    ),
    tool!(
        "json_query",
        Workspace,
        WORKERS,
        OptIn,
        "Pick values out of JSON (a file of your workspace, or JSON text) with a path like \
         `items[0].name`, `items[*].price` or `$.a.b`; returns the values as JSON.",
        || obj(
            json!({
                "query": s("the path: keys with `.`, indexes `[0]` (negative from the end), `[*]` for every element; `` or `$` for all"),
                "path": s("a JSON file of your workspace"),
                "json": s("JSON text, when not reading a file"),
            }),
            &["query"],
        )
    ),
    tool!(
        "text_transform",
        Workspace,
        WORKERS,
        OptIn,
        "Transform text exactly (no model guessing): change case, trim, replace, sort or \
         de-duplicate lines, split, count, slugify, base64.",
        || obj(
            json!({
                "text": s("the input text"),
                "op": {"type": "string", "enum": crate::tools::TEXT_OPS},
                "from": s("for replace: the text to replace"),
                "to": s("for replace: the replacement"),
                "separator": s("for split: where to cut (default: a newline)"),
            }),
            &["text", "op"],
        )
    ),
    tool!(
        "memory_search",
        Memory,
        Access::NotSysadmin,
        OptIn,
        "Search the team's long-term memory (observations, reflections, knowledge, journals) \
         for words; returns the best records with their ids and dates.",
        || obj(
            json!({
                "query": s("the words to look for"),
                "limit": {"type": "integer", "description": "at most this many (default 5)"},
                "all": {"type": "boolean", "description": "include records older than a year"},
                "agent": s("only what this agent did or was observed doing"),
                "kinds": {"type": "array", "items": {"type": "string"},
                          "description": "only these: journal, observation, reflection, knowledge"},
                "priority": s("at least this priority: low, medium or high"),
                "category": s("only this category (decision, preference, …)"),
                "since": s("only records dated on or after this day, YYYY-MM-DD"),
                "until": s("only records dated on or before this day, YYYY-MM-DD"),
            }),
            &["query"],
        )
    ),
    tool!(
        "memory_remember",
        Memory,
        Access::NotSysadmin,
        OptIn,
        "Write something to the team's long-term memory: a fact, decision or preference worth \
         finding later, with how much it matters.",
        || obj(
            json!({
                "text": s("what to remember, in one or two sentences"),
                "priority": {"type": "string", "enum": ["high", "medium", "low"]},
                "category": {"type": "string", "enum": MEMORY_CATEGORIES},
            }),
            &["text"],
        )
    ),
    tool!(
        "knowledge_append",
        Memory,
        Access::NotSysadmin,
        OptIn,
        "Add to the team's shared knowledge on a topic (merged into what is there, never \
         overwriting it).",
        || obj(
            json!({"topic": s("a short title, e.g. Deploys"), "text": s("what to add")}),
            &["topic", "text"]
        )
    ),
    tool!(
        "memory_get",
        Memory,
        Access::NotSysadmin,
        OptIn,
        "Read one long-term memory record in full, by the id memory_search gave.",
        || obj(json!({"id": s("the record's id")}), &["id"])
    ),
    tool!(
        "http_fetch",
        Workspace,
        WORKERS,
        Default,
        "Fetch a URL (GET, or POST with a body) from a host you were granted network access to; \
         returns the status line, headers and body. No redirects are followed.",
        || obj(
            json!({
                "url": s("http:// or https:// URL"),
                "method": {"type": "string", "enum": ["GET", "POST"]},
                "body": s("for POST: the body"),
            }),
            &["url"],
        )
    ),
    tool!(
        "permission_request",
        Permissions,
        WORKERS,
        Default,
        "Ask for more than your sandbox allows: network access to a host, reading a path outside \
         your workspace, or a longer command timeout. The sysadmin (or a person) decides; you get \
         a message with the answer.",
        || obj(
            json!({
                "capability": {"type": "string", "enum": ["network", "read", "timeout"]},
                "target": s("the host (crates.io), the absolute path (/usr/share/dict) or the seconds (900)"),
                "reason": s("why your task needs it"),
            }),
            &["capability", "target", "reason"],
        )
    ),
    tool!(
        "permission_verdict",
        Permissions,
        SYSADMIN,
        Default,
        "Decide a permission request: GREEN (safe, grant), YELLOW (unclear: ask the requester a \
         question) or RED (risky: a person decides).",
        || obj(
            json!({
                "id": {"type": "integer"},
                "verdict": {"type": "string", "enum": ["GREEN", "YELLOW", "RED"]},
                "reason": s("one line: why"),
                "question": s("for YELLOW: the question for the requester"),
            }),
            &["id", "verdict", "reason"],
        )
    ),
    tool!(
        "permission_list",
        Permissions,
        SYSADMIN,
        Default,
        "List the open permission requests (or all with all=true).",
        || obj(json!({"all": {"type": "boolean"}}), &[])
    ),
    tool!(
        "agents__list",
        Router,
        Access::Everyone,
        Default,
        "List the other agents and whether they are ready.",
        none
    ),
    tool!(
        "agents__catalog",
        Router,
        Access::NotSysadmin,
        Default,
        "Describe the other agents: role, archetype, whether you may call them.",
        none
    ),
    tool!(
        "agents__spawn",
        Channels,
        Access::Only(&[Role::Orchestrator, Role::Coordinator]),
        Default,
        "Start a new instance of a declared agent (coordinator/orchestrator only).",
        || obj(
            json!({"agent": s("declared agent name"), "instance": s("instance key, optional")}),
            &["agent"]
        )
    ),
    tool!(
        "flock_channel_create",
        Channels,
        ORCHESTRATOR,
        Default,
        "Create a channel (orchestrator only).",
        || obj(
            json!({"channel": s("id: a-z, 0-9, -"), "topic": s("what the channel is for"), "members": list("agent names or human:NAME")}),
            &["channel"],
        )
    ),
    tool!(
        "flock_channel_post",
        Channels,
        Access::Everyone,
        Default,
        "Post a message to a channel; @name mentions wake that member.",
        || obj(json!({"channel": s("channel id"), "text": s("the message")}), &["channel", "text"])
    ),
    tool!(
        "flock_channel_read",
        Channels,
        Access::Everyone,
        Default,
        "Read a channel: the newest messages, or those after a seq.",
        || obj(
            json!({"channel": s("channel id"), "after": {"type": "integer"}, "limit": {"type": "integer"}}),
            &["channel"],
        )
    ),
    tool!(
        "flock_channel_list",
        Channels,
        Access::Everyone,
        Default,
        "List channels with topic, state and members.",
        none
    ),
    tool!(
        "flock_assign_members",
        Channels,
        ORCHESTRATOR,
        Default,
        "Add or remove channel members (orchestrator only).",
        || obj(
            json!({"channel": s("channel id"), "add": list("members to add"), "remove": list("members to remove")}),
            &["channel"],
        )
    ),
    tool!(
        "flock_channel_archive",
        Channels,
        ORCHESTRATOR,
        Default,
        "Start archiving a channel (orchestrator only); force archives at once.",
        || obj(json!({"channel": s("channel id"), "force": {"type": "boolean"}}), &["channel"])
    ),
    tool!(
        "flock_archive_ready",
        Channels,
        Access::Everyone,
        Default,
        "Say you are ready for a channel being archived to close.",
        || obj(json!({"channel": s("channel id")}), &["channel"])
    ),
    tool!(
        "flock_message",
        Channels,
        Access::Everyone,
        Default,
        "Send a direct message (a two-member channel).",
        || obj(
            json!({"to": s("agent name or human:NAME"), "text": s("the message")}),
            &["to", "text"]
        )
    ),
    tool!(
        "flock_discover",
        Channels,
        Access::NotSysadmin,
        Default,
        "Find agents by text, role or skill.",
        || obj(json!({"query": s("free text"), "role": s("role"), "skill": s("skill")}), &[])
    ),
    tool!(
        "flock_update_card",
        Channels,
        Access::NotSysadmin,
        Default,
        "Update your A2A card: description, skills, tags.",
        || obj(
            json!({"description": s("what you do"), "skills": list("skills"), "tags": list("tags")}),
            &[]
        )
    ),
    tool!(
        "flock_sleep",
        Channels,
        Access::Everyone,
        Default,
        "Sleep until someone mentions you or sends you a DM.",
        none
    ),
    tool!(
        "flock_create_agent",
        Channels,
        ORCHESTRATOR,
        Default,
        "Create a new agent (orchestrator only).",
        || obj(
            json!({"name": s("agent name"), "role": s("role"), "archetype": s("archetype"), "description": s("its job")}),
            &["name"],
        )
    ),
    tool!(
        "flock_decommission_agent",
        Channels,
        ORCHESTRATOR,
        Default,
        "Stop an agent for good (orchestrator only).",
        || obj(json!({"name": s("agent name")}), &["name"])
    ),
    // The runtime's own calls, never offered to a model.
    tool!(
        "journal__event",
        Router,
        Access::Everyone,
        Internal,
        "An agent's record of what it did (a file written), journaled in its chain.",
        none
    ),
    tool!(
        "agents__roster",
        Router,
        Access::Everyone,
        Internal,
        "The catalog the runtime puts in every agent's prompt (`agents__catalog`, for any role).",
        none
    ),
    tool!(
        "journal__recent",
        Journal,
        Access::Everyone,
        Internal,
        "An agent's own recent journal events (`journal_context`).",
        none
    ),
    tool!(
        "memory__search",
        Memory,
        Access::Everyone,
        Internal,
        "The memory search the runtime makes for a turn's recall.",
        none
    ),
    tool!(
        "memory__journal",
        Memory,
        Access::Everyone,
        Internal,
        "The journal line of a worker's turn (`worker_lifecycle`), under the caller's name.",
        || obj(json!({"request": s(""), "done": s(""), "result": s("")}), &["request"])
    ),
    tool!(
        "memory__observe",
        Memory,
        Access::Only(&[Role::Observer]),
        Internal,
        "The observer's observation of a turn (`memory_files`).",
        || obj(
            json!({"text": s(""), "about": s(""), "priority": s(""), "category": s("")}),
            &["text"]
        )
    ),
    tool!(
        "memory__reflect",
        Memory,
        Access::Only(&[Role::Reflection]),
        Internal,
        "A reflection, and the observations it read marked reflected (`memory_files`).",
        || obj(json!({"text": s(""), "ids": list("")}), &["text", "ids"])
    ),
    tool!(
        "memory__dream",
        Memory,
        Access::Only(&[Role::Dream]),
        Internal,
        "Dream's knowledge document, merged into `knowledge/<topic>.md` (`memory_files`).",
        || obj(json!({"document": s("")}), &["document"])
    ),
    tool!(
        "permissions__grants",
        Permissions,
        Access::Everyone,
        Internal,
        "The grants in force for the calling agent.",
        none
    ),
    tool!(
        "permission_decide",
        Permissions,
        Access::People,
        Internal,
        "A person's decision on a permission request (flockctl, chat `/approve`).",
        none
    ),
];

/// What `text_transform` can do.
pub const TEXT_OPS: &[&str] = &[
    "upper",
    "lower",
    "trim",
    "replace",
    "split",
    "lines_sorted",
    "lines_unique",
    "count",
    "slug",
    "base64_encode",
    "base64_decode",
];

/// The tool named `name`, if there is one.
pub fn tool(name: &str) -> Option<&'static ToolSpec> {
    // Looked up for every tool call the router takes: by hash, not by walking the table.
    static BY_NAME: std::sync::LazyLock<
        std::collections::HashMap<&'static str, &'static ToolSpec>,
    > = std::sync::LazyLock::new(|| TOOLS.iter().map(|t| (t.name, t)).collect());
    BY_NAME.get(name).copied()
}

/// Where a call to `name` is answered (`None`: no such tool).
pub fn owner(name: &str) -> Option<Owner> {
    tool(name).map(|t| t.owner)
}

/// The names a model may be offered and a swarm file may list in `tools:`, in table order.
pub fn model_tools() -> impl Iterator<Item = &'static str> {
    TOOLS.iter().filter(|t| t.is_model_tool()).map(|t| t.name)
}

/// `name` when it names a tool a model may call; otherwise what is wrong, with the closest name.
pub fn unknown_tool_hint(name: &str) -> String {
    let all: Vec<&str> = model_tools().collect();
    match crate::error::closest(name, all.iter().copied()) {
        Some(best) => format!("no tool named `{name}` (did you mean `{best}`?)"),
        None => format!("no tool named `{name}`; tools: {}", all.join(", ")),
    }
}

impl Role {
    /// Whether an agent of this role may call `tool` (the router checks it for every call that
    /// reaches it, the agent for the calls it runs itself, and a model is offered only these).
    /// An unknown tool: no.
    pub fn may_use(self, tool: &str) -> bool {
        self::tool(tool).is_some_and(|t| t.access.allows(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_schemas_are_objects_that_require_only_their_own_properties() {
        let mut seen = std::collections::HashSet::new();
        for t in TOOLS {
            assert!(seen.insert(t.name), "{} is in the table twice", t.name);
            let p = (t.params)();
            assert_eq!(p["type"], "object", "{}", t.name);
            for r in p["required"].as_array().unwrap() {
                let r = r.as_str().unwrap();
                assert!(
                    p["properties"].get(r).is_some(),
                    "{} requires {r} it does not describe",
                    t.name
                );
            }
        }
    }

    #[test]
    fn roles_get_what_the_design_gives_them() {
        // Only workers touch files, run commands and ask for more.
        for t in ["fs_read", "exec", "http_fetch", "json_query", "permission_request"] {
            for r in Role::ALL {
                assert_eq!(r.may_use(t), r == Role::Worker, "{} {t}", r.as_str());
            }
        }
        // The sysadmin triages and talks in channels, nothing else.
        let sysadmin: Vec<_> = model_tools().filter(|t| Role::Sysadmin.may_use(t)).collect();
        assert_eq!(
            sysadmin,
            [
                "permission_verdict",
                "permission_list",
                "agents__list",
                "flock_channel_post",
                "flock_channel_read",
                "flock_channel_list",
                "flock_archive_ready",
                "flock_message",
                "flock_sleep",
            ]
        );
        assert!(Role::Coordinator.may_use("agents__spawn"));
        assert!(!Role::Worker.may_use("agents__spawn"));
        assert!(!Role::Worker.may_use("flock_channel_create"));
        assert!(Role::Orchestrator.may_use("flock_channel_create"));
        // Each memory role writes only its own kind of memory file.
        for (tool, role) in [
            ("memory__observe", Role::Observer),
            ("memory__reflect", Role::Reflection),
            ("memory__dream", Role::Dream),
        ] {
            assert!(Role::ALL.iter().all(|r| r.may_use(tool) == (*r == role)), "{tool}");
        }
        // No agent decides a permission; unknown tools are nobody's.
        assert!(Role::ALL.iter().all(|r| !r.may_use("permission_decide") && !r.may_use("fs_reed")));
        assert!(Role::ALL.iter().all(|r| r.may_use("permissions__grants")));
        // The runtime reads the catalog for any role's prompt; the sysadmin's model cannot.
        assert!(Role::Sysadmin.may_use("agents__roster"));
        assert!(!Role::Sysadmin.may_use("agents__catalog"));
    }

    #[test]
    fn internal_tools_are_not_model_tools() {
        assert!(model_tools().all(|t| !t.contains("__") || t.starts_with("agents__")));
        assert!(unknown_tool_hint("fs_reed").contains("did you mean `fs_read`"));
    }

    #[test]
    fn the_user_docs_name_every_tool() {
        let page = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/tools.md");
        let text = std::fs::read_to_string(page).unwrap();
        for t in TOOLS {
            assert!(
                text.contains(&format!("`{}`", t.name)),
                "docs/tools.md does not name {}",
                t.name
            );
        }
        for op in TEXT_OPS {
            assert!(text.contains(&format!("`{op}`")), "docs/tools.md does not name {op}");
        }
    }
}
