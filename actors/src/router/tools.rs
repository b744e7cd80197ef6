//! Agents' tool calls at the router: one check of the caller's role against the tool table
//! (`flock_config::tools`), then the call goes where the table says it is answered — the
//! channels actor, the permissions store job, the memory index, the journal — or is answered
//! here from the router's own tables.

use flock_config::AgentSpec;
use flock_config::tools::{self as table, Owner};
use flock_ipc::id::fmt_id;
use flock_ipc::{Body, ControlReply, ErrorCode, Frame, OPERATOR, ROUTER, ToolError};
use ractor::ActorRef;

use super::permit::PermissionCall;
use super::{PermissionReply, RouterState};
use crate::caller::Caller;
use crate::chains;
use crate::messages::{ChannelsMsg, ConnId, HostAsk, RouterMsg, ToolReply};
use crate::text::clip;
use flock_journal::{JournalEvent, Status};

impl RouterState {
    /// `flockctl memory search|show|archive|config` on a running swarm: the memory thread, which
    /// holds the index and the embedding model warm, answers. The operator reads, and moves day
    /// files between tiers (journaled as theirs); it writes no memory.
    pub(super) fn operator_memory(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        conn: ConnId,
        frame: &Frame,
        tool: String,
        arguments: String,
    ) {
        let tools = [
            "memory_search",
            "memory_get",
            "memory__recent",
            "memory__stats",
            "memory__archive",
            "memory__config",
        ];
        if !tools.contains(&tool.as_str()) {
            let msg = format!("`{tool}` is not a memory call for a person ({})", tools.join(", "));
            return self.answer(conn, Frame::error(frame, ErrorCode::BadRequest, msg));
        }
        // A move is journaled as the person's (a dry run moves nothing).
        let moves = tool == "memory__archive"
            && !serde_json::from_str::<serde_json::Value>(&arguments)
                .is_ok_and(|a| a["dry_run"].as_bool() == Some(true));
        let router = moves.then(|| myself.clone());
        let Some(memory) = &self.memory else {
            let msg = "this swarm keeps no memory";
            return self.answer(conn, Frame::error(frame, ErrorCode::Internal, msg));
        };
        let Some(outbox) = self.conns.get(&conn).map(|i| i.outbox.clone()) else { return };
        let asked = Frame { body: Body::HeartbeatAck, ..frame.clone() };
        let call = crate::memory::Call {
            tool,
            arguments,
            caller: OPERATOR.to_owned(),
            key: format!("{OPERATOR}-{}", fmt_id(frame.id)),
        };
        memory.call(
            call,
            Box::new(move |answer| {
                if let Some(router) = router {
                    let by = format!("human:{OPERATOR}");
                    let _ = router.cast(RouterMsg::MemoryTiers { by, result: answer.clone() });
                }
                let frame = match answer {
                    Ok(json) => {
                        Frame::answer(&asked, ROUTER, Body::ControlReply(ControlReply::Json(json)))
                    }
                    Err(e) => Frame::error(&asked, e.code, e.message),
                };
                let _ = outbox.blocking_send(frame);
            }),
        );
    }

    /// An agent's `ToolCall`. Its identity and role come from its connection.
    pub(super) fn tool_call(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        conn: ConnId,
        identity: &str,
        frame: Frame,
    ) {
        let Body::ToolCall { name, arguments } = &frame.body else { return };
        // An agent connection always has a role; one without a slot (decommissioned, still
        // shutting down) has no powers at all — never a human's.
        let Some(role) = self.slots.get(identity).map(|s| s.spec.role) else {
            let msg = format!("`{identity}` is no longer an agent of this swarm");
            return self.answer(conn, Frame::error(&frame, ErrorCode::Forbidden, msg));
        };
        let Some(spec) = table::tool(name) else {
            let msg = table::unknown_tool_hint(name);
            return self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
        };
        if !spec.access.allows(role) {
            let msg = format!(
                "`{identity}` is a {} and may not call {name}: {}",
                role.as_str(),
                spec.access.who()
            );
            // A refused call is an event: someone tried what their role does not allow.
            if let Some(j) = &self.journal {
                let kind = name.to_ascii_uppercase();
                let event =
                    JournalEvent::new(identity, kind, Status::Failed, format!("FORBIDDEN: {msg}"))
                        .param("tool", serde_json::Value::from(name.as_str()))
                        .param("arguments", journaled_arguments(arguments))
                        .param("forbidden", serde_json::Value::Bool(true));
                j.log(event);
            }
            return self.answer(conn, Frame::error(&frame, ErrorCode::Forbidden, msg));
        }
        let Some(outbox) = self.conns.get(&conn).map(|i| i.outbox.clone()) else { return };
        let (name, arguments) = (name.clone(), arguments.clone());
        let (id, to) = (frame.id, identity.to_owned());
        let reply = move |answer: Result<String, ToolError>| Frame {
            correlation_id: Some(id),
            ..Frame::new(ROUTER, to, Body::tool_answer(answer))
        };
        match spec.owner {
            Owner::Channels => {
                // Posts carry the poster's chain on to the deltas they cause, so a conversation
                // between agents in a channel is one budgeted chain.
                let chain = self.current_chain(identity);
                let answers = self
                    .slots
                    .get(identity)
                    .and_then(|s| s.in_flight.as_ref())
                    .is_some_and(|q| !q.delegated && q.route.answers_a_person());
                let reply = ToolReply { outbox, frame_id: frame.id, to: identity.to_owned() };
                // The leader holds the channels: on another host the call goes there.
                if let Some(leader) = self.channels_leader(&name) {
                    let caller = identity.to_owned();
                    let ask = HostAsk::Tool { caller, name, arguments, chain, answers };
                    return self.tool_to_host(leader, ask, reply);
                }
                let msg = ChannelsMsg::Tool {
                    caller: Caller { id: identity.to_owned(), role: Some(role) },
                    name,
                    arguments,
                    chain,
                    answers,
                    reply,
                };
                if self.channels.as_ref().is_none_or(|ch| ch.cast(msg).is_err()) {
                    let err = Frame::error(&frame, ErrorCode::Internal, "channels are not running");
                    self.answer(conn, err);
                }
            }
            // The leader keeps the permission records: on another host the call goes there.
            Owner::Permissions if self.leader_elsewhere().is_some() => {
                let leader = self.leader_elsewhere().unwrap_or_default().to_owned();
                let caller = identity.to_owned();
                let protected = self.protected_paths();
                let ask = HostAsk::Permission { caller, name, arguments, key: frame.id, protected };
                let reply = ToolReply { outbox, frame_id: frame.id, to: identity.to_owned() };
                self.tool_to_host(leader, ask, reply);
            }
            Owner::Permissions => {
                let caller = Caller { id: identity.to_owned(), role: Some(role) };
                let reply =
                    PermissionReply::Agent { outbox, frame_id: frame.id, to: identity.to_owned() };
                // The call's id is the key: a replayed turn re-sends the same one.
                let call = PermissionCall {
                    caller,
                    tool: name,
                    arguments,
                    key: frame.id,
                    protected: Vec::new(),
                };
                self.permission_call(myself, call, reply);
            }
            Owner::Memory => {
                let Some(memory) = &self.memory else {
                    let msg = "this swarm keeps no memory";
                    return self.answer(conn, Frame::error(&frame, ErrorCode::Internal, msg));
                };
                // A write is the caller's, under the call's id: a replayed turn re-sends the
                // same one and writes nothing twice. The key starts with the caller's name, so
                // no agent can pick an id that passes for another's entry and suppress it.
                let call = crate::memory::Call {
                    tool: name,
                    arguments,
                    caller: identity.to_owned(),
                    key: format!("{identity}-{}", fmt_id(frame.id)),
                };
                memory.call(
                    call,
                    Box::new(move |answer| {
                        let _ = outbox.blocking_send(reply(answer));
                    }),
                );
            }
            // The agent's own slice of the journal (`journal_context`).
            Owner::Journal => {
                let n = serde_json::from_str::<serde_json::Value>(&arguments)
                    .ok()
                    .and_then(|a| a["last"].as_u64())
                    .map_or(10, |n| n.clamp(1, 200) as usize);
                let Some(journal) = &self.journal else {
                    return self.answer(conn, reply(Ok(String::new())));
                };
                journal.recent_for(identity, n, move |content| {
                    let _ = outbox.blocking_send(reply(Ok(content)));
                });
            }
            Owner::Router => {
                let answer = self.router_tool(identity, &name, &arguments);
                self.answer(conn, reply(answer));
            }
            Owner::Mailbox | Owner::Workspace => {
                let msg = format!(
                    "`{name}` is not a call to the router: {}",
                    if spec.owner == Owner::Mailbox {
                        "it is sent as a message frame"
                    } else {
                        "it runs in the agent"
                    }
                );
                self.answer(conn, Frame::error(&frame, ErrorCode::BadRequest, msg));
            }
        }
    }

    fn router_tool(&self, caller: &str, name: &str, arguments: &str) -> Result<String, ToolError> {
        match name {
            // An agent's own record of what it did (a file written), journaled in the chain it is
            // working in, under its own name (from its connection). Not a model's tool.
            "journal__event" => {
                let args: serde_json::Value = serde_json::from_str(arguments)
                    .map_err(|e| ToolError::bad_request(format!("arguments are not JSON: {e}")))?;
                let kind = args["type"].as_str().unwrap_or_default();
                if kind.is_empty()
                    || kind.len() > 40
                    || !kind.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                {
                    return Err(ToolError::bad_request("`type` must be UPPER_SNAKE_CASE"));
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
                    .others(caller)
                    .map(|a| {
                        let slot = self.slots.get(&a.key());
                        let state = match slot {
                            Some(s) if s.in_flight.is_some() => "busy",
                            Some(s) if s.conn.is_some() => "ready",
                            Some(_) => "offline",
                            None => "on another host",
                        };
                        let mut row = serde_json::json!({"name": a.key(), "role": a.role.as_str(), "state": state});
                        if let Some(host) = self.remote_host(&a.key()) {
                            row["host"] = host.into();
                        }
                        row
                    })
                    .collect();
                Ok(serde_json::Value::Array(list).to_string())
            }
            // The model's tool, and the runtime's own call for the prompt of any role.
            "agents__catalog" | "agents__roster" => {
                let allowed = self.slots.get(caller).map(|s| &s.spec.can_call);
                let list: Vec<_> = self
                    .others(caller)
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
            other => Err(ToolError::internal(format!(
                "the tool table gives `{other}` to the router, which has no handler for it"
            ))),
        }
    }
}

impl RouterState {
    /// Every agent of the swarm but `caller`: this host's in the swarm file's order, then the
    /// other hosts'.
    fn others<'a>(&'a self, caller: &'a str) -> impl Iterator<Item = &'a AgentSpec> + 'a {
        let elsewhere = self.hosts.iter().flat_map(|h| h.agents.iter());
        self.order
            .iter()
            .filter_map(|n| self.slots.get(n).map(|s| &s.spec))
            .chain(elsewhere)
            .filter(move |a| !a.has_key(caller))
    }
}

/// A refused call's arguments for the journal: the JSON object as sent, or — too large or not
/// an object — only its size (the journal is not a place to store what a hostile agent sends).
fn journaled_arguments(arguments: &str) -> serde_json::Value {
    const MAX: usize = 4096;
    match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(v @ serde_json::Value::Object(_)) if arguments.len() <= MAX => v,
        _ => serde_json::json!({"bytes": arguments.len()}),
    }
}
