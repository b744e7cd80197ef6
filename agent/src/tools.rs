//! Tools an agent can call: `agents__send`, `agents__request`, `agents__delegate`,
//! `agents__list`, `agents__catalog` and the channel tools `flock_*`. All go through the router (the `flock_*` ones on to the
//! channels actor), which takes the caller's identity from its connection and checks its role.
//! A malformed call returns an error *result* for the model, never an `Err`.

use flock_ipc::id::derive_id;
use flock_ipc::{Body, Frame, MsgId, SendMode};
use serde_json::Value;

use crate::client::RouterClient;
use crate::commands;

pub use flock_config::KNOWN_TOOLS as TOOLS;

/// Result of one tool call as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub ok: bool,
    pub content: String,
}

impl ToolOutput {
    pub(crate) fn ok(content: impl Into<String>) -> Self {
        ToolOutput { ok: true, content: content.into() }
    }
    pub(crate) fn err(content: impl Into<String>) -> Self {
        ToolOutput { ok: false, content: content.into() }
    }
}

fn arg<'a>(args: &'a Value, key: &str, tool: &str) -> Result<&'a str, ToolOutput> {
    args.get(key).and_then(Value::as_str).ok_or_else(|| {
        ToolOutput::err(format!("BAD_REQUEST: {tool} needs a string argument `{key}`"))
    })
}

fn answer(frame: Frame, what: impl FnOnce(Body) -> ToolOutput) -> ToolOutput {
    match frame.body {
        Body::Error { code, message } => ToolOutput::err(format!("{code}: {message}")),
        other => what(other),
    }
}

/// The runtime's own durable message that starts a chain of its own ([`SendMode::Upkeep`]): the
/// observer waking reflection, which is not charged to the request whose observation crossed
/// the threshold. Not a tool: a model cannot send it. `turn` and `index` derive its id, so a
/// replayed turn sends it once.
pub async fn send_upkeep(
    client: &RouterClient,
    turn: MsgId,
    index: u32,
    to: &str,
    text: &str,
) -> ToolOutput {
    let body = Body::Send { text: text.into(), mode: SendMode::Upkeep };
    let frame = Frame { id: derive_id(turn, index), ..Frame::new(&client.name, to, body) };
    delivered(client, frame, to).await
}

/// Sends a durable message and says whether it is in `to`'s mailbox.
async fn delivered(client: &RouterClient, frame: Frame, to: &str) -> ToolOutput {
    match client.call(frame).await {
        Ok(f) => answer(f, |_| {
            ToolOutput::ok(format!(
                "delivered to {to}'s mailbox; {to} answers with a message of its own \
                 later, so do not send it again"
            ))
        }),
        Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
    }
}

/// Runs tool `name`. `turn` and `index` derive the ids of messages it sends, so a replayed turn
/// re-sends the same ids and the durable mailbox drops the duplicates.
pub async fn execute(
    client: &RouterClient,
    turn: MsgId,
    index: u32,
    name: &str,
    arguments: &str,
) -> ToolOutput {
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return ToolOutput::err("BAD_REQUEST: tool arguments must be a JSON object"),
        Err(e) => {
            return ToolOutput::err(format!("BAD_REQUEST: arguments are not valid JSON: {e}"));
        }
    };
    match name {
        "agents__send" => {
            let (to, text) = match (arg(&args, "to", name), arg(&args, "text", name)) {
                (Ok(to), Ok(text)) => (to, text),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            let mode = match args.get("mode").and_then(Value::as_str) {
                None | Some("durable") => SendMode::Durable,
                Some("at_most_once") => SendMode::AtMostOnce,
                Some(other) => {
                    return ToolOutput::err(format!(
                        "BAD_REQUEST: mode `{other}` is not one of: durable, at_most_once"
                    ));
                }
            };
            let frame = Frame {
                id: derive_id(turn, index),
                ..Frame::new(&client.name, to, Body::Send { text: text.into(), mode })
            };
            if mode == SendMode::AtMostOnce {
                return match client.send(frame).await {
                    Ok(()) => ToolOutput::ok(format!("routed to {to} (at_most_once)")),
                    Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
                };
            }
            delivered(client, frame, to).await
        }
        "agents__delegate" => {
            let (to, text) = match (arg(&args, "to", name), arg(&args, "task", name)) {
                (Ok(to), Ok(text)) => (to, text),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            let frame = Frame {
                id: derive_id(turn, index),
                ..Frame::new(&client.name, to, Body::Delegate { text: text.into() })
            };
            match client.call(frame).await {
                Ok(f) => answer(f, |_| {
                    ToolOutput::ok(format!(
                        "delegated to {to}; its answer comes back to you as a [result]"
                    ))
                }),
                Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
            }
        }
        "agents__request" => {
            let (to, text) = match (arg(&args, "to", name), arg(&args, "text", name)) {
                (Ok(to), Ok(text)) => (to, text),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            let timeout_ms = args.get("timeout_ms").and_then(Value::as_u64).unwrap_or(0);
            let frame =
                Frame::new(&client.name, to, Body::Request { text: text.into(), timeout_ms });
            match client.call(frame).await {
                Ok(f) => answer(f, |b| match b {
                    Body::Reply { text } => ToolOutput::ok(text),
                    other => {
                        ToolOutput::err(format!("INTERNAL: unexpected {} answer", other.kind()))
                    }
                }),
                Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
            }
        }
        // Stored once per call: the id derives from the turn, so a replayed turn finds its
        // request instead of filing a second one.
        "permission_request" => forward_as(client, derive_id(turn, index), name, &args).await,
        "permission_verdict" | "permission_list" => forward(client, name, &args).await,
        // Router tools and the channels actor's tools: the caller's identity and role come from
        // this connection, never from the arguments.
        "agents__list" | "agents__catalog" | "agents__spawn" => forward(client, name, &args).await,
        // Answered from the swarm's memory index on the supervisor's side.
        "memory_search" | "memory_get" => forward(client, name, &args).await,
        other if other.starts_with("flock_") && TOOLS.contains(&other) => {
            forward(client, name, &args).await
        }
        other => ToolOutput::err(format!(
            "BAD_REQUEST: no tool named `{other}`; available: {}",
            TOOLS.join(", ")
        )),
    }
}

/// Runs a workspace tool (`fs_*`) in `ws`; `None` for any other tool. A write is journaled
/// through the router (path and bytes), in the chain of the turn.
pub async fn workspace_tool(
    client: &RouterClient,
    role: flock_config::Role,
    sandbox: flock_config::SandboxKind,
    ws: Option<&crate::workspace::Workspace>,
    name: &str,
    arguments: &str,
) -> Option<ToolOutput> {
    if !name.starts_with("fs_") && !matches!(name, "exec" | "http_fetch") {
        return None;
    }
    // The same rule the router applies to its tools, here where these run.
    if !role.may_use(name) {
        return Some(ToolOutput::err(format!(
            "FORBIDDEN: a {} may not use {name}: only workers touch files and run commands",
            role.as_str()
        )));
    }
    let Some(ws) = ws else {
        return Some(ToolOutput::err("INTERNAL: this agent has no workspace"));
    };
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => return Some(ToolOutput::err("BAD_REQUEST: tool arguments must be a JSON object")),
    };
    let text = |key: &str| args.get(key).and_then(Value::as_str).unwrap_or_default();
    let timeout = args.get("timeout_secs").and_then(Value::as_u64);
    match name {
        "exec" => return Some(commands::exec(client, sandbox, ws, text("command"), timeout).await),
        "http_fetch" => return Some(commands::http_fetch(client, sandbox, ws, &args).await),
        _ => {}
    }
    let out = match name {
        "fs_read" => ws.read(text("path")),
        "fs_write" => ws.write(text("path"), text("content")),
        "fs_list" => ws.list(text("path")),
        "fs_search" => ws.search(text("query"), text("path")),
        "fs_patch" => ws.patch(text("path"), text("diff")),
        other => ToolOutput::err(format!("BAD_REQUEST: no tool named `{other}`")),
    };
    if out.ok && matches!(name, "fs_write" | "fs_patch") {
        let bytes = match name {
            "fs_write" => text("content").len(),
            _ => ws.read(text("path")).content.len(),
        };
        let event = serde_json::json!({
            "type": "FILE_WRITE",
            "message": format!("{} {} ({bytes} bytes)", if name == "fs_write" { "wrote" } else { "patched" }, text("path")),
            "params": {"path": text("path"), "bytes": bytes, "tool": name},
        });
        let _ = forward(client, "journal__event", &event).await;
    }
    Some(out)
}

/// The tools an agent of `role` may call (the memory roles answer in text: none).
pub fn definitions_for(role: flock_config::Role) -> Vec<flock_ipc::llm::ToolDef> {
    if role.answers_in_text() {
        return Vec::new();
    }
    definitions().into_iter().filter(|d| role.may_use(&d.name)).collect()
}

/// What the input of a turn asks of the agent, which decides the choices its model is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnState {
    /// Someone waits for this turn's answer and it may be handed over (`agents__delegate`).
    Owed,
    /// A delegated agent's result: the answer goes to whoever waits; nothing more to hand over.
    Result,
    /// A request: the caller waits for this turn's answer.
    Request,
    /// A channel notification: channel work.
    Channel,
    /// A message nobody waits on.
    Free,
}

/// The tools offered for one turn: only the choices that make sense in this state (a small
/// model picks among them under a schema). `allowed`: the agent's `tools:` (its role's tools
/// when `None`); `callable`: whom it may address right now; `waiting`: who receives this turn's
/// answer (never a recipient: the runtime answers them).
///
/// - answering a delegated result: no tools at all — the answer is the text;
/// - a coordinator owing an answer: `agents__delegate` or the answer, nothing else;
/// - `agents__delegate` only when someone waits for this turn's answer (not for requests);
/// - addressing tools only with someone to address.
pub fn offered(
    role: flock_config::Role,
    allowed: Option<&[String]>,
    state: TurnState,
    callable: &[String],
    waiting: Option<&str>,
) -> Vec<flock_ipc::llm::ToolDef> {
    use flock_config::Role;
    let recipients: Vec<String> =
        callable.iter().filter(|n| Some(n.as_str()) != waiting).cloned().collect();
    let mut tools = definitions_for(role);
    match allowed {
        Some(allowed) => tools.retain(|t| allowed.contains(&t.name)),
        None => tools.retain(|t| !flock_config::OPT_IN_TOOLS.contains(&t.name.as_str())),
    }
    tools.retain(|t| match state {
        TurnState::Result => false,
        TurnState::Owed if role == Role::Coordinator => t.name == "agents__delegate",
        TurnState::Owed => true,
        TurnState::Request | TurnState::Channel | TurnState::Free => t.name != "agents__delegate",
    });
    let addressing = ["agents__send", "agents__request", "agents__delegate"];
    if recipients.is_empty() {
        tools.retain(|t| !addressing.contains(&t.name.as_str()));
    }
    for t in tools.iter_mut().filter(|t| addressing.contains(&t.name.as_str())) {
        if let Some(to) = t.parameters.pointer_mut("/properties/to") {
            to["enum"] = Value::from(recipients.clone());
        }
        // A reflexive role hands over the input as it is: its model only picks the delegate.
        if t.name == "agents__delegate" && role.is_reflexive() {
            t.parameters = serde_json::json!({
                "type": "object",
                "properties": {"to": t.parameters["properties"]["to"].clone()},
                "required": ["to"],
            });
            t.description = "Hand the request, as it is, to another agent when it asks for work \
                             (a plan, a list, writing, a file): its answer goes to the person."
                .into();
        }
    }
    tools
}

/// The tools a model may call, with JSON Schemas of their arguments (sent with every model call).
pub fn definitions() -> Vec<flock_ipc::llm::ToolDef> {
    use serde_json::json;
    let s = |d: &str| json!({"type": "string", "description": d});
    let list = |d: &str| json!({"type": "array", "items": {"type": "string"}, "description": d});
    let def =
        |name: &str, description: &str, props: Value, required: &[&str]| flock_ipc::llm::ToolDef {
            name: name.into(),
            description: description.into(),
            parameters: json!({"type": "object", "properties": props, "required": required}),
        };
    vec![
        def(
            "agents__send",
            "Send a message to another agent's durable mailbox (no answer awaited).",
            json!({"to": s("agent name"), "text": s("the message")}),
            &["to", "text"],
        ),
        def(
            "agents__delegate",
            "Hand the request to another agent when it asks for work (a plan, a list, writing, a \
             file): it does the work and its answer comes back to you as a [result].",
            json!({"to": s("agent name"), "task": s("the request, in full")}),
            &["to", "task"],
        ),
        def(
            "agents__request",
            "Ask another agent and wait for its answer.",
            json!({"to": s("agent name"), "text": s("the question"), "timeout_ms": {"type": "integer"}}),
            &["to", "text"],
        ),
        def(
            "fs_read",
            "Read a text file of your workspace.",
            json!({"path": s("file path inside your workspace, e.g. notes/plan.md")}),
            &["path"],
        ),
        def(
            "fs_write",
            "Create or replace a file of your workspace with this content (folders are made).",
            json!({"path": s("file path inside your workspace"), "content": s("the whole new content")}),
            &["path", "content"],
        ),
        def(
            "fs_list",
            "List the files of your workspace (or of a folder in it).",
            json!({"path": s("folder inside your workspace; empty for all of it")}),
            &[],
        ),
        def(
            "fs_search",
            "Find the lines of your workspace's files that contain a text.",
            json!({"query": s("the text to find"), "path": s("folder to search in; empty for all")}),
            &["query"],
        ),
        def(
            "fs_patch",
            "Change a file of your workspace with a unified diff (@@ hunks).",
            json!({"path": s("file path inside your workspace"), "diff": s("the unified diff")}),
            &["path", "diff"],
        ),
        def(
            "exec",
            "Run a shell command in your workspace (a sandbox: no network, no files outside \
             the workspace); returns the exit status and output.",
            json!({"command": s("the shell command, e.g. `sh test.sh`"), "timeout_secs": {"type": "integer"}}),
            &["command"],
        ),
        def(
            "memory_search",
            "Search the team's long-term memory (observations, reflections, knowledge, journals) \
             for words; returns the best records with their ids and dates.",
            json!({
                "query": s("the words to look for"),
                "limit": {"type": "integer", "description": "at most this many (default 5)"},
                "all": {"type": "boolean", "description": "include records older than a year"},
                "agent": s("only what this agent did or was observed doing"),
            }),
            &["query"],
        ),
        def(
            "memory_remember",
            "Write something to the team's long-term memory: a fact, decision or preference worth \
             finding later, with how much it matters.",
            json!({
                "text": s("what to remember, in one or two sentences"),
                "priority": {"type": "string", "enum": ["high", "medium", "low"]},
                "category": {"type": "string", "enum": flock_memory::records::CATEGORIES},
            }),
            &["text"],
        ),
        def(
            "knowledge_append",
            "Add to the team's shared knowledge on a topic (merged into what is there, never \
             overwriting it).",
            json!({"topic": s("a short title, e.g. Deploys"), "text": s("what to add")}),
            &["topic", "text"],
        ),
        def(
            "memory_get",
            "Read one long-term memory record in full, by the id memory_search gave.",
            json!({"id": s("the record's id")}),
            &["id"],
        ),
        def(
            "http_fetch",
            "Fetch a URL (GET, or POST with a body) from a host you were granted network access \
             to; returns the status line, headers and body. No redirects are followed.",
            json!({
                "url": s("http:// or https:// URL"),
                "method": {"type": "string", "enum": ["GET", "POST"]},
                "body": s("for POST: the body"),
            }),
            &["url"],
        ),
        def(
            "permission_request",
            "Ask for more than your sandbox allows: network access to a host, reading a path \
             outside your workspace, or a longer command timeout. The sysadmin (or a person) \
             decides; you get a message with the answer.",
            json!({
                "capability": {"type": "string", "enum": ["network", "read", "timeout"]},
                "target": s("the host (crates.io), the absolute path (/usr/share/dict) or the seconds (900)"),
                "reason": s("why your task needs it"),
            }),
            &["capability", "target", "reason"],
        ),
        def(
            "permission_verdict",
            "Decide a permission request: GREEN (safe, grant), YELLOW (unclear: ask the \
             requester a question) or RED (risky: a person decides).",
            json!({
                "id": {"type": "integer"},
                "verdict": {"type": "string", "enum": ["GREEN", "YELLOW", "RED"]},
                "reason": s("one line: why"),
                "question": s("for YELLOW: the question for the requester"),
            }),
            &["id", "verdict", "reason"],
        ),
        def(
            "permission_list",
            "List the open permission requests (or all with all=true).",
            json!({"all": {"type": "boolean"}}),
            &[],
        ),
        def("agents__list", "List the other agents and whether they are ready.", json!({}), &[]),
        def(
            "agents__catalog",
            "Describe the other agents: role, archetype, whether you may call them.",
            json!({}),
            &[],
        ),
        def(
            "agents__spawn",
            "Start a new instance of a declared agent (coordinator/orchestrator only).",
            json!({"agent": s("declared agent name"), "instance": s("instance key, optional")}),
            &["agent"],
        ),
        def(
            "flock_channel_create",
            "Create a channel (orchestrator only).",
            json!({"channel": s("id: a-z, 0-9, -"), "topic": s("what the channel is for"), "members": list("agent names or human:NAME")}),
            &["channel"],
        ),
        def(
            "flock_channel_post",
            "Post a message to a channel; @name mentions wake that member.",
            json!({"channel": s("channel id"), "text": s("the message")}),
            &["channel", "text"],
        ),
        def(
            "flock_channel_read",
            "Read a channel: the newest messages, or those after a seq.",
            json!({"channel": s("channel id"), "after": {"type": "integer"}, "limit": {"type": "integer"}}),
            &["channel"],
        ),
        def("flock_channel_list", "List channels with topic, state and members.", json!({}), &[]),
        def(
            "flock_assign_members",
            "Add or remove channel members (orchestrator only).",
            json!({"channel": s("channel id"), "add": list("members to add"), "remove": list("members to remove")}),
            &["channel"],
        ),
        def(
            "flock_channel_archive",
            "Start archiving a channel (orchestrator only); force archives at once.",
            json!({"channel": s("channel id"), "force": {"type": "boolean"}}),
            &["channel"],
        ),
        def(
            "flock_archive_ready",
            "Say you are ready for a channel being archived to close.",
            json!({"channel": s("channel id")}),
            &["channel"],
        ),
        def(
            "flock_message",
            "Send a direct message (a two-member channel).",
            json!({"to": s("agent name or human:NAME"), "text": s("the message")}),
            &["to", "text"],
        ),
        def(
            "flock_discover",
            "Find agents by text, role or skill.",
            json!({"query": s("free text"), "role": s("role"), "skill": s("skill")}),
            &[],
        ),
        def(
            "flock_update_card",
            "Update your A2A card: description, skills, tags.",
            json!({"description": s("what you do"), "skills": list("skills"), "tags": list("tags")}),
            &[],
        ),
        def("flock_sleep", "Sleep until someone mentions you or sends you a DM.", json!({}), &[]),
        def(
            "flock_create_agent",
            "Create a new agent (orchestrator only).",
            json!({"name": s("agent name"), "role": s("role"), "archetype": s("archetype"), "description": s("its job")}),
            &["name"],
        ),
        def(
            "flock_decommission_agent",
            "Stop an agent for good (orchestrator only).",
            json!({"name": s("agent name")}),
            &["name"],
        ),
    ]
}

/// The runtime catalog (`agents__catalog`) as JSON text, if the router answers.
pub async fn catalog(client: &RouterClient) -> Option<String> {
    let out = forward(client, "agents__catalog", &Value::Object(Default::default())).await;
    out.ok.then_some(out.content)
}

/// Runs a tool on the supervisor's side: `ToolCall` → `ToolResult`.
pub(crate) async fn forward(client: &RouterClient, name: &str, args: &Value) -> ToolOutput {
    forward_as(client, flock_ipc::id::new_id(), name, args).await
}

/// [`forward`] with the call's id given: one derived from the turn makes a replayed call the
/// same call.
async fn forward_as(client: &RouterClient, id: MsgId, name: &str, args: &Value) -> ToolOutput {
    let frame = Frame {
        id,
        ..Frame::new(
            &client.name,
            flock_ipc::ROUTER,
            Body::ToolCall { name: name.into(), arguments: args.to_string() },
        )
    };
    match client.call(frame).await {
        Ok(f) => answer(f, |b| match b {
            Body::ToolResult { ok, content } => ToolOutput { ok, content },
            other => ToolOutput::err(format!("INTERNAL: unexpected {} answer", other.kind())),
        }),
        Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
    }
}
