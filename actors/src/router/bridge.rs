//! The router's side of chat bridges (issue #9). A `flock-bridge` process connects to the
//! agents' socket with `BridgeHello` and the per-spawn token the supervisor announced with
//! [`RouterMsg::ExpectBridge`]; its connection is then of kind [`ConnKind::Bridge`]: it may
//! heartbeat, call the `bridge__*` tools (run by the channels actor, with the bridge's name from
//! the connection) and report its state with `bridge__status`. Nothing else: a bridge cannot
//! send to agents, call models or act as the operator.

use flock_config::BridgeSpec;
use flock_ipc::{Body, ErrorCode, Frame, Hello, Outbox, PROTOCOL_VERSION, ROUTER, Welcome};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{ConnId, ConnInfo, ConnKind, RouterState, same_secret, unix_ms};
use crate::messages::{BridgeInfo, ChannelsMsg, MappingReport, ToolReply};
use flock_journal::{JournalEvent, Status};

/// The most mappings of one bridge whose reports are kept.
const MAX_MAPPING_REPORTS: usize = 256;

/// A configured bridge: the token its next process must show, its connection, what it reports.
pub(super) struct BridgeSlot {
    spec: BridgeSpec,
    expected_token: Option<String>,
    conn: Option<ConnId>,
    info: BridgeInfo,
}

impl BridgeSlot {
    pub(super) fn new(spec: &BridgeSpec) -> BridgeSlot {
        let info = BridgeInfo {
            name: spec.name.clone(),
            platform: spec.platform.as_str().to_owned(),
            state: "down".into(),
            ..Default::default()
        };
        BridgeSlot { spec: spec.clone(), expected_token: None, conn: None, info }
    }
}

impl RouterState {
    /// The supervisor is about to spawn bridge `name` with `token`.
    pub(super) fn expect_bridge(&mut self, name: &str, token: String) {
        if let Some(slot) = self.bridges.get_mut(name) {
            slot.expected_token = Some(token);
        }
    }

    /// The first frame of a connection was `BridgeHello`.
    pub(super) fn open_bridge(
        &mut self,
        conn: ConnId,
        first: &Frame,
        hello: &Hello,
        outbox: Outbox,
        closer: oneshot::Sender<()>,
    ) {
        let reject = |code: ErrorCode, reason: String| {
            let _ = outbox.try_send(Frame::answer(first, ROUTER, Body::Reject { code, reason }));
        };
        if let Err(e) = flock_ipc::identity::check_version(hello) {
            return reject(e.code, e.message);
        }
        let Some(slot) = self.bridges.get_mut(&hello.agent_id) else {
            return reject(
                ErrorCode::AgentNotFound,
                format!("no bridge `{}` in this swarm", hello.agent_id),
            );
        };
        let token_ok = slot.expected_token.as_ref().is_some_and(|t| same_secret(t, &hello.token));
        if !token_ok {
            return reject(
                ErrorCode::Forbidden,
                "wrong or expired token: bridges are started by the supervisor".into(),
            );
        }
        let spec_json = match serde_json::to_string(&slot.spec) {
            Ok(j) => j,
            Err(e) => return reject(ErrorCode::Internal, format!("bridge spec: {e}")),
        };
        let old = slot.conn.replace(conn);
        slot.expected_token = None;
        slot.info.connected = true;
        slot.info.pid = hello.pid;
        slot.info.state = "connecting".into();
        slot.info.last_seen_ms = unix_ms();
        let name = hello.agent_id.clone();
        if let Some(old) = old {
            self.conns.remove(&old);
        }
        let welcome = Welcome {
            protocol_version: PROTOCOL_VERSION,
            swarm: self.spec.name.clone(),
            agent_spec_json: spec_json,
            heartbeat_interval_ms: self.spec.supervision.heartbeat_interval_ms,
            max_frame_bytes: self.spec.delivery.max_frame_bytes,
        };
        let _ = outbox.try_send(Frame::answer(first, ROUTER, Body::Welcome(welcome)));
        self.conns.insert(
            conn,
            ConnInfo { identity: name, kind: ConnKind::Bridge, outbox, _closer: closer },
        );
        self.counters.connections += 1;
    }

    /// A frame from a bridge connection.
    pub(super) fn bridge_frame(&mut self, conn: ConnId, bridge: &str, frame: Frame) {
        if let Some(slot) = self.bridges.get_mut(bridge) {
            slot.info.last_seen_ms = unix_ms();
        }
        match &frame.body {
            Body::Heartbeat => {
                self.answer(conn, Frame::answer(&frame, ROUTER, Body::HeartbeatAck));
            }
            Body::ShutdownAck | Body::HeartbeatAck => {}
            Body::ToolCall { name, arguments } if name == "bridge__status" => {
                let ok = self.bridge_status(bridge, arguments);
                let body = Body::ToolResult { ok, content: String::new() };
                self.answer(conn, Frame::answer(&frame, ROUTER, body));
            }
            Body::ToolCall { name, arguments } if crate::channels::bridge::is_bridge_tool(name) => {
                let (Some(ch), Some(outbox)) =
                    (&self.channels, self.conns.get(&conn).map(|i| i.outbox.clone()))
                else {
                    let err = Frame::error(&frame, ErrorCode::Internal, "channels are not running");
                    return self.answer(conn, err);
                };
                let msg = ChannelsMsg::Bridge {
                    bridge: bridge.to_owned(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                    reply: ToolReply { outbox, frame_id: frame.id, to: bridge.to_owned() },
                };
                if ch.cast(msg).is_err() {
                    let err = Frame::error(&frame, ErrorCode::Internal, "channels are not running");
                    self.answer(conn, err);
                }
            }
            other => {
                let msg = format!("a bridge may not send {} frames", other.kind());
                self.answer(conn, Frame::error(&frame, ErrorCode::Forbidden, msg));
            }
        }
    }

    /// `bridge__status {state, outbox, last_error, inbound, outbound}` from the bridge itself.
    fn bridge_status(&mut self, bridge: &str, arguments: &str) -> bool {
        let Some(slot) = self.bridges.get_mut(bridge) else { return false };
        let Ok(v) = serde_json::from_str::<Value>(arguments) else { return false };
        let text = |k: &str, max: usize| {
            v.get(k).and_then(Value::as_str).map(|s| s.chars().take(max).collect::<String>())
        };
        if let Some(state) = text("state", 120) {
            slot.info.state = state;
        }
        if let Some(n) = v.get("outbox").and_then(Value::as_u64) {
            slot.info.outbox = n;
        }
        if let Some(n) = v.get("inbound").and_then(Value::as_u64) {
            slot.info.inbound = n;
        }
        if let Some(n) = v.get("outbound").and_then(Value::as_u64) {
            slot.info.outbound = n;
        }
        if v.get("last_error").is_some() {
            slot.info.last_error = text("last_error", 300);
        }
        // Its mappings (the swarm file's, or changed at run time): bounded in number and size.
        let mut changed = Vec::new();
        if let Some(mappings) = v.get("mappings").and_then(Value::as_object) {
            for (external, r) in mappings.iter().take(MAX_MAPPING_REPORTS) {
                let external: String = external.chars().take(200).collect();
                let report = MappingReport {
                    outbox: r.get("outbox").and_then(Value::as_u64).unwrap_or(0),
                    broken: r
                        .get("broken")
                        .and_then(Value::as_str)
                        .map(|s| s.chars().take(300).collect()),
                };
                let was = slot.info.mappings.get(&external).and_then(|m| m.broken.clone());
                if was != report.broken {
                    changed.push((external.clone(), report.broken.clone()));
                }
                slot.info.mappings.insert(external, report);
            }
        }
        // A chat that starts or stops refusing posts is journaled, once per change.
        if let Some(journal) = &self.journal {
            for (chat, broken) in changed {
                let event = match &broken {
                    Some(why) => JournalEvent::new(
                        format!("bridge:{bridge}"),
                        "BRIDGE_MAPPING_BROKEN",
                        Status::Failed,
                        format!("bridge `{bridge}`: chat {chat} refuses: {why}"),
                    ),
                    None => JournalEvent::new(
                        format!("bridge:{bridge}"),
                        "BRIDGE_MAPPING_RESTORED",
                        Status::Success,
                        format!("bridge `{bridge}`: chat {chat} takes posts again"),
                    ),
                };
                journal.log(event.param("bridge", json!(bridge)).param("chat", json!(chat)));
            }
        }
        true
    }

    /// A bridge connection closed.
    pub(super) fn bridge_closed(&mut self, conn: ConnId, bridge: &str) {
        if let Some(slot) = self.bridges.get_mut(bridge)
            && slot.conn == Some(conn)
        {
            slot.conn = None;
            slot.info.connected = false;
            slot.info.state = "down".into();
            slot.info.mappings.clear();
        }
    }

    /// Tells bridge `name` to shut down (the supervisor is stopping it).
    pub(super) fn stop_bridge(&mut self, name: &str) {
        if let Some(slot) = self.bridges.get_mut(name) {
            slot.expected_token = None;
            if let Some(info) = slot.conn.and_then(|c| self.conns.get(&c)) {
                let _ = info.outbox.try_send(Frame::new(ROUTER, name, Body::Shutdown));
            }
        }
    }

    pub(super) fn bridge_infos(&self) -> Vec<BridgeInfo> {
        let mut infos: Vec<BridgeInfo> = self.bridges.values().map(|s| s.info.clone()).collect();
        infos.sort_by(|a, b| a.name.cmp(&b.name));
        infos
    }
}
