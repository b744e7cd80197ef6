//! The router's side of permission requests (`crate::permissions` holds the rules): a tool call
//! becomes one job in the store actor — the record and the messages that announce it are
//! committed together — whose answer goes straight back to the caller, and whose effects
//! (messages to deliver, journal events) come back to the router.

use flock_ipc::id::{fmt_id, new_id};
use flock_ipc::{Body, Frame, MsgId, Outbox, ROUTER, ToolError};
use ractor::{ActorRef, RpcReplyPort};

use super::{NO_CONN, RouterState, unix_ms};
use crate::caller::Caller;
use crate::messages::{Origin, PermissionEffects, RouterMsg, StoreJob, StoreMsg, StoredBatch};
use crate::permissions::{self, Invariants};
use crate::store::{NewMessage, Store, WriteOp, WriteOutcome};
use flock_journal::{JournalEvent, Status};

/// Where the answer of a permission tool goes.
pub enum PermissionReply {
    /// An agent's tool call: a `ToolResult` frame on its connection.
    Agent { outbox: Outbox, frame_id: MsgId, to: String },
    /// A person through `flockctl` or a chat bridge.
    Human(RpcReplyPort<Result<String, ToolError>>),
}

impl PermissionReply {
    fn send(self, answer: Result<String, ToolError>) {
        match self {
            PermissionReply::Agent { outbox, frame_id, to } => {
                let body = Body::tool_answer(answer);
                let frame =
                    Frame { correlation_id: Some(frame_id), ..Frame::new(ROUTER, to, body) };
                let _ = outbox.try_send(frame);
            }
            PermissionReply::Human(port) => {
                let _ = port.send(answer);
            }
        }
    }
}

/// One permission call: the tool `caller` calls with `arguments`; `key` identifies it (a
/// replayed turn sends the same key, and gets the same record); `protected`: paths never
/// granted besides this host's own (those of the host that asks, when another host asks).
pub(super) struct PermissionCall {
    pub caller: Caller,
    pub tool: String,
    pub arguments: String,
    pub key: MsgId,
    pub protected: Vec<std::path::PathBuf>,
}

impl RouterState {
    /// The swarm's sysadmin: the first agent of that role (it receives permission requests),
    /// here or, on a leader, on another host.
    fn sysadmin(&self) -> Option<String> {
        let is = |role: flock_config::Role| role == flock_config::Role::Sysadmin;
        self.order
            .iter()
            .find(|n| self.slots.get(*n).is_some_and(|s| is(s.spec.role)))
            .cloned()
            .or_else(|| {
                let link = self.hosts.as_ref().filter(|l| l.leader == l.host)?;
                link.agents.iter().find(|a| is(a.role)).map(|a| a.key())
            })
    }

    /// Paths never opened to a sandbox besides the state dir: workspaces declared outside it
    /// (every host's, on a leader), and what another host asks to protect on it.
    pub(super) fn protected_paths(&self) -> Vec<std::path::PathBuf> {
        let elsewhere = self.hosts.iter().flat_map(|h| h.agents.iter());
        self.slots
            .values()
            .map(|s| &s.spec)
            .chain(elsewhere)
            .filter_map(|s| s.workspace.clone())
            .filter(|w| w.is_absolute())
            .chain(self.hosts.iter().flat_map(|h| h.protect.iter().cloned()))
            .collect()
    }

    /// Runs permission call `call` in the store actor.
    pub(super) fn permission_call(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        call: PermissionCall,
        reply: PermissionReply,
    ) {
        let PermissionCall { caller, tool, arguments, key, protected } = call;
        let args: serde_json::Value = match serde_json::from_str(&arguments) {
            Ok(v @ serde_json::Value::Object(_)) => v,
            _ => return reply.send(Err(ToolError::bad_request("arguments must be a JSON object"))),
        };
        let mut inv =
            Invariants::new(self.protected_paths().into_iter().chain(protected).collect());
        let sysadmin = self.sysadmin();
        let router = myself.clone();
        let job: StoreJob = Box::new(move |store: &mut Store| {
            if let Some(dir) = store.state_dir() {
                inv.protected.push(dir);
            }
            let now = unix_ms() as i64;
            let key = fmt_id(key).into_bytes();
            let result = store.with_messages(|conn| {
                let r = permissions::call(
                    conn,
                    &inv,
                    &caller,
                    sysadmin.as_deref(),
                    &tool,
                    &args,
                    &key,
                    now,
                )?;
                let messages = r
                    .effects
                    .notify
                    .iter()
                    .map(|(from, to, text)| NewMessage {
                        id: new_id(),
                        sender: from.clone(),
                        target: to.clone(),
                        text: text.clone(),
                        route: String::new(),
                    })
                    .collect();
                Ok((r, messages))
            });
            match result {
                Ok(Ok((r, stored))) => {
                    let effects = PermissionEffects {
                        journal: r.effects.journal,
                        stored,
                        archive: r.effects.archive,
                    };
                    let _ = router.cast(RouterMsg::Permission(effects));
                    reply.send(r.answer);
                }
                Ok(Err(refused)) => reply.send(Err(refused)),
                Err(e) => reply.send(Err(ToolError::internal(format!("the store failed: {e}")))),
            }
        });
        if let Err(e) = self.store.cast(StoreMsg::With(job)) {
            tracing::error!(error = %e, "flock router: the store is not running");
        }
    }

    /// Journals what a permission operation did and delivers the messages it stored.
    pub(super) fn permission_effects(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        effects: PermissionEffects,
    ) {
        if let Some((until, by)) = &effects.archive {
            self.archive_approved(myself, until, by);
        }
        // A request that waits for a person is announced where people approve from chat.
        if let Some(ch) = &self.channels {
            for l in effects.journal.iter().filter(|l| l.kind == "PERMISSION_WAITING") {
                let param = |k: &str| {
                    l.params
                        .iter()
                        .find(|(n, _)| *n == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let _ = ch.cast(crate::messages::ChannelsMsg::PermissionWaiting {
                    id: l.request,
                    agent: param("agent"),
                    what: format!("{} {}", param("capability"), param("target")),
                    reason: param("reason"),
                    why: l.message.clone(),
                });
            }
        }
        if let Some(j) = &self.journal {
            for permissions::Logged { who, kind, message, request: id, params } in effects.journal {
                let status = if kind == "PERMISSION_BLOCKED" || kind == "PERMISSION_DENIED" {
                    Status::Failed
                } else {
                    Status::Success
                };
                let mut e = JournalEvent::new(who, kind, status, message)
                    .correlation(format!("permission-{id}"))
                    .param("request", id);
                for (k, v) in params {
                    e = e.param(k, v);
                }
                j.log(e);
            }
        }
        if !effects.stored.is_empty() {
            let items = effects
                .stored
                .into_iter()
                .map(|m| {
                    let origin = Origin { conn: NO_CONN, frame: m.id };
                    (WriteOp::Enqueue(m), Some(origin), Ok(WriteOutcome::Inserted))
                })
                .collect();
            self.stored(myself, StoredBatch { items });
        }
    }
}
