//! Tools an agent can call: `agents__send`, `agents__request`, `agents__delegate`,
//! `agents__list`, `agents__catalog` and the channel tools `flock_*`. All go through the router (the `flock_*` ones on to the
//! channels actor), which takes the caller's identity from its connection and checks its role.
//! A malformed call returns an error *result* for the model, never an `Err`.

use flock_ipc::id::derive_id;
use flock_ipc::{Body, Frame, MsgId, SendMode};
use serde_json::Value;

use crate::client::RouterClient;
use crate::commands;
use crate::output::{ToolOutput, answer, forward, forward_as};

use flock_config::tools::{self as table, Owner};

fn arg<'a>(args: &'a Value, key: &str, tool: &str) -> Result<&'a str, ToolOutput> {
    args.get(key).and_then(Value::as_str).ok_or_else(|| {
        ToolOutput::err(format!("BAD_REQUEST: {tool} needs a string argument `{key}`"))
    })
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
        // Everything answered on the supervisor's side: the caller's identity and role come from
        // this connection, never from the arguments.
        other => match table::owner(other) {
            // The memory's writes are filed under the call's id: derived from the turn, so a
            // replayed turn writes nothing twice.
            Some(Owner::Memory) => forward_as(client, derive_id(turn, index), name, &args).await,
            Some(owner) if owner != Owner::Mailbox && !owner.is_local() => {
                forward(client, name, &args).await
            }
            Some(_) => ToolOutput::err(format!(
                "INTERNAL: `{other}` runs in the agent and was not run there"
            )),
            None => ToolOutput::err(format!("BAD_REQUEST: {}", table::unknown_tool_hint(other))),
        },
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
    if table::owner(name) != Some(Owner::Workspace) {
        return None;
    }
    // The same rule the router applies to its tools, here where these run.
    if !role.may_use(name) {
        return Some(ToolOutput::err(format!(
            "FORBIDDEN: a {} may not use {name}: only workers touch files and run commands",
            role.as_str()
        )));
    }
    if name == "text_transform" {
        return Some(crate::data::text_transform(arguments));
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
        "json_query" => crate::data::json_query(ws, &args),
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
        None => {
            tools.retain(|t| table::tool(&t.name).is_some_and(|t| t.offer == table::Offer::Default))
        }
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

/// The tools a model may call, with JSON Schemas of their arguments (sent with every model
/// call): the model tools of the tool table, in its order.
pub fn definitions() -> Vec<flock_ipc::llm::ToolDef> {
    flock_config::tools::TOOLS
        .iter()
        .filter(|t| t.is_model_tool())
        .map(|t| flock_ipc::llm::ToolDef {
            name: t.name.into(),
            description: t.description.into(),
            parameters: (t.params)(),
        })
        .collect()
}

/// The runtime catalog as JSON text, if the router answers (`agents__roster`: the runtime's own
/// call, for every role; a model's is `agents__catalog`).
pub async fn catalog(client: &RouterClient) -> Option<String> {
    let out = forward(client, "agents__roster", &Value::Object(Default::default())).await;
    out.ok.then_some(out.content)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_remember_offers_the_categories_memory_accepts() {
        assert_eq!(flock_config::tools::MEMORY_CATEGORIES, flock_memory::records::CATEGORIES);
    }

    #[test]
    fn a_worker_is_offered_the_data_tools_only_when_its_tools_list_them() {
        use flock_config::Role;
        let names = |allowed: Option<&[String]>| -> Vec<String> {
            offered(Role::Worker, allowed, TurnState::Free, &[], None)
                .into_iter()
                .map(|t| t.name)
                .collect()
        };
        let default = names(None);
        assert!(default.contains(&"fs_read".to_owned()));
        assert!(!default.iter().any(|t| t == "json_query" || t == "text_transform"));
        let listed = ["json_query".to_owned(), "text_transform".to_owned()];
        assert_eq!(names(Some(&listed)), listed);
        // A role that may not use them is not offered them even when listed.
        let coord = offered(Role::Coordinator, Some(&listed), TurnState::Free, &[], None);
        assert!(coord.is_empty());
    }
}
