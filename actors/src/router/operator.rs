//! `flockctl` on one host for an agent placed on another (issue #26, docs/cluster.md). The
//! operator's durable send, its `--wait`, `stop`/`start`/`restart` and `logs` go to the agent's
//! host as [`HostAsk::Operator`]; that host runs each as its own operator's (the send is stored
//! and its chain runs there, its answer goes to the operator's DM like any) and answers what its
//! own `flockctl` would have been answered. Only hosts the swarm file lists in
//! `cluster.operators` may ask (the leader alone by default): both hosts check it, the asked one
//! against the calling host the broker's subject names.
//!
//! On the host asked, the asking host's operator is one more connection of the router:
//! [`REMOTE_OPERATOR`], whose answers (a send stored, a chain ended) go back through the call
//! that asked, by correlation id.

use super::leader::{Asked, answered_through};
use super::*;
use crate::messages::{HostAsk, OperatorAsk};

/// The connection of another host's operator: its answers go to [`OperatorState::answers`].
pub(super) const REMOTE_OPERATOR: ConnId = u64::MAX - 2;

/// How many ends of chains another host's operator started are kept for a `--wait` that asks
/// after the chain ended (a fast answer can end it before the asking host hears it was stored).
const ENDS_KEPT: usize = 64;

/// How many chains this host's operator sent to other hosts are remembered for `--wait`.
const SENT_KEPT: usize = 1024;

/// What the router keeps for operators across hosts.
#[derive(Debug, Default)]
pub(super) struct OperatorState {
    /// Asking side: sends not answered yet, their host, and the `--wait`s that came meanwhile
    /// (connection, watch frame id).
    sending: HashMap<MsgId, (String, Vec<(ConnId, MsgId)>)>,
    /// Asking side: chains this host's operator started on another host, and that host (the
    /// newest [`SENT_KEPT`], oldest first in `sent_order`).
    sent: HashMap<MsgId, String>,
    sent_order: VecDeque<MsgId>,
    /// Asked side: where each answer to another host's operator goes, by correlation id.
    answers: HashMap<MsgId, oneshot::Sender<Body>>,
    /// Asked side: chains another host's operator started here, and that host (their answer
    /// is posted there, their end is kept here).
    chains: HashMap<MsgId, String>,
    /// Asked side: the last ends of those chains.
    ends: VecDeque<ChainEnd>,
}

impl RouterState {
    /// Whether `flockctl` here may drive `agent`, placed on host `host`; else why not.
    fn operator_may(&self, agent: &str, host: &str) -> Result<(), (ErrorCode, String)> {
        let here = self.hosts.as_ref().map_or("", |l| l.host.as_str());
        if self.spec.may_operate(here) {
            return Ok(());
        }
        let listed = self.spec.operator_hosts().join(", ");
        Err((
            ErrorCode::Forbidden,
            format!(
                "`{agent}` runs on host `{host}`: flockctl on host `{here}` drives only this \
                 host's agents (`cluster.operators` lists the hosts whose flockctl drives every \
                 host's: {listed}); run it on `{host}`"
            ),
        ))
    }

    /// `flockctl send AGENT TEXT` for an agent on host `host`: stored there (its answer to this
    /// connection says so), its chain runs there.
    pub(super) fn operator_send_to_host(&mut self, conn: ConnId, host: String, frame: &Frame) {
        let Body::Send { text, .. } = &frame.body else { return };
        if self.draining {
            let msg = "the swarm is shutting down".to_owned();
            return self.answer(conn, Frame::error(frame, ErrorCode::Draining, msg));
        }
        if let Err((code, msg)) = self.operator_may(&frame.to, &host) {
            return self.answer(conn, Frame::error(frame, code, msg));
        }
        let ask = OperatorAsk::Send { id: frame.id, to: frame.to.clone(), text: text.clone() };
        self.operator.sending.insert(frame.id, (host.clone(), Vec::new()));
        let asked = Asked::OperatorSend { conn, id: frame.id, host: host.clone() };
        self.ask_host(host, HostAsk::Operator(ask), asked, OPERATOR_TIMEOUT_MS);
    }

    /// `flockctl send --wait` for chain `chain`, when it runs on another host (else `false`):
    /// that host tells how it ended.
    pub(super) fn operator_watch_elsewhere(
        &mut self,
        conn: ConnId,
        frame_id: MsgId,
        chain: MsgId,
    ) -> bool {
        if let Some((_, waiting)) = self.operator.sending.get_mut(&chain) {
            waiting.push((conn, frame_id));
            return true;
        }
        let Some(host) = self.operator.sent.get(&chain).cloned() else { return false };
        self.watch_on_host(host, conn, frame_id, chain);
        true
    }

    fn watch_on_host(&mut self, host: String, conn: ConnId, frame_id: MsgId, chain: MsgId) {
        // A chain ends within its wall budget: the answer comes by then.
        let timeout_ms = self.spec.budget.max_wall_secs.saturating_mul(1000) + WATCH_GRACE_MS;
        let asked = Asked::Operator { conn, frame_id };
        self.ask_host(host, HostAsk::Operator(OperatorAsk::Watch { chain }), asked, timeout_ms);
    }

    /// `flockctl stop|start|restart|logs AGENT` for an agent on another host (else `false`):
    /// that host runs it.
    pub(super) fn operator_control_elsewhere(
        &mut self,
        conn: ConnId,
        frame: &Frame,
        request: &ControlRequest,
    ) -> bool {
        let Some(ask) = OperatorAsk::control(request) else { return false };
        let agent = ask.agent().to_owned();
        let Some(host) = self.remote_host(&agent).map(str::to_owned) else { return false };
        if let Err((code, msg)) = self.operator_may(&agent, &host) {
            self.answer(conn, Frame::error(frame, code, msg));
            return true;
        }
        let follow = matches!(request, ControlRequest::Logs { follow: true, .. });
        let asked = match &ask {
            OperatorAsk::Logs { .. } => {
                Asked::OperatorLogs { conn, frame_id: frame.id, host: host.clone(), agent, follow }
            }
            _ => Asked::Operator { conn, frame_id: frame.id },
        };
        self.ask_host(host, HostAsk::Operator(ask), asked, OPERATOR_TIMEOUT_MS);
        true
    }

    /// A page of another host's agent's log for `flockctl logs` here: its lines to the
    /// operator's connection; following it, the lines after them are asked for a second later,
    /// as long as the connection is open.
    fn log_page(&mut self, asked: Asked, body: Body) {
        let Asked::OperatorLogs { conn, frame_id, host, agent, follow } = asked else { return };
        if !self.conns.contains_key(&conn) {
            return; // `flockctl logs -f` went away
        }
        let (reply, next) = match body {
            Body::ControlReply(ControlReply::LogPage { lines, next }) => {
                (Body::ControlReply(ControlReply::LogLines(lines)), Some(next))
            }
            other => (other, None),
        };
        let quiet = matches!(&reply, Body::ControlReply(ControlReply::LogLines(l)) if l.is_empty());
        if !(follow && quiet) {
            let frame =
                Frame { correlation_id: Some(frame_id), ..Frame::new(ROUTER, OPERATOR, reply) };
            self.answer(conn, frame);
        }
        let (Some(after), true) = (next, follow) else { return };
        let ask = HostAsk::Operator(OperatorAsk::Logs {
            agent: agent.clone(),
            lines: 0,
            after: Some(after),
        });
        let asked = Asked::OperatorLogs { conn, frame_id, host: host.clone(), agent, follow };
        self.ask_host_later(host, ask, asked, OPERATOR_TIMEOUT_MS, FOLLOW_EVERY);
    }

    /// The answer of the host asked, for this host's operator (`send`: once stored there, the
    /// `--wait`s that came meanwhile are asked on).
    pub(super) fn operator_answered(&mut self, asked: Asked, body: Body) {
        let (conn, frame_id) = match asked {
            Asked::Operator { conn, frame_id } => (conn, frame_id),
            logs @ Asked::OperatorLogs { .. } => return self.log_page(logs, body),
            Asked::OperatorSend { conn, id, host } => {
                let waiting = self.operator.sending.remove(&id).map(|s| s.1).unwrap_or_default();
                if matches!(body, Body::Accepted) {
                    if self.operator.sent_order.len() == SENT_KEPT
                        && let Some(old) = self.operator.sent_order.pop_front()
                    {
                        self.operator.sent.remove(&old);
                    }
                    self.operator.sent_order.push_back(id);
                    self.operator.sent.insert(id, host.clone());
                    for (conn, frame_id) in waiting {
                        self.watch_on_host(host.clone(), conn, frame_id, id);
                    }
                }
                (conn, id)
            }
            _ => return,
        };
        let frame = Frame { correlation_id: Some(frame_id), ..Frame::new(ROUTER, OPERATOR, body) };
        self.answer(conn, frame);
    }

    /// What host `host`'s operator asks of an agent here (`id`: the ask's, taken once).
    pub(super) fn operator_from_host(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        host: String,
        id: MsgId,
        ask: OperatorAsk,
        reply: oneshot::Sender<Body>,
    ) {
        let refused = |code: ErrorCode, message: String| Body::Error { code, message };
        let here = self.hosts.as_ref().map_or(String::new(), |l| l.host.clone());
        if !self.spec.may_operate(&host) || host == here {
            let msg = format!(
                "host `{host}` may not drive agents on host `{here}`: `cluster.operators` does \
                 not list it"
            );
            tracing::warn!(from = %host, "flock cluster: refused an operator's call: {msg}");
            let _ = reply.send(refused(ErrorCode::Forbidden, msg));
            return;
        }
        let agent = ask.agent().to_owned();
        let local = self.remote_host(&agent).is_none() && self.slots.contains_key(&agent);
        if !matches!(ask, OperatorAsk::Watch { .. }) && !local {
            let msg = format!("no agent named `{agent}` runs on host `{here}`");
            let _ = reply.send(refused(ErrorCode::AgentNotFound, msg));
            return;
        }
        if let Some(request) = ask.request() {
            (self.control)(ControlCall {
                request,
                frame_id: id,
                outbox: answered_through(reply),
                from_host: Some(host),
            });
            return;
        }
        match ask {
            OperatorAsk::Send { id: msg_id, to, text } => {
                let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
                if text.len() > limit {
                    let msg = format!("the message is {} bytes; at most {limit}", text.len());
                    let _ = reply.send(refused(ErrorCode::BadRequest, msg));
                    return;
                }
                let operator = Some(OPERATOR_HUMAN.to_owned());
                let now = self.now();
                let mut route = Route::root(msg_id, OPERATOR_HUMAN, &to, &text, now, operator);
                if let Err(msg) = self.admit(&mut route, "SEND", OPERATOR, &to, &text) {
                    let _ = reply.send(refused(ErrorCode::BudgetExceeded, msg));
                    return;
                }
                self.operator.chains.insert(msg_id, host);
                self.operator.answers.insert(msg_id, reply);
                self.enqueue(
                    myself,
                    msg_id,
                    OPERATOR.into(),
                    to,
                    text,
                    &route,
                    Some(REMOTE_OPERATOR),
                );
            }
            OperatorAsk::Watch { chain } => {
                if let Some(c) = self.chains.map.get_mut(&chain) {
                    c.watchers.push((REMOTE_OPERATOR, id));
                    self.operator.answers.insert(id, reply);
                } else if let Some(end) = self.operator.ends.iter().find(|e| e.chain == chain) {
                    let _ = reply.send(Body::ChainEnded(end.clone()));
                } else {
                    let msg = format!("no chain {} in flight on host `{here}`", fmt_id(chain));
                    let _ = reply.send(refused(ErrorCode::BadRequest, msg));
                }
            }
            _ => {}
        }
    }

    /// The host this host's operator sent chain `chain` to, if it did (its answer may come
    /// before the host's word that it stored the send).
    pub(super) fn operator_sent_to(&self, chain: MsgId) -> Option<&str> {
        let sending = self.operator.sending.get(&chain).map(|(h, _)| h.as_str());
        sending.or_else(|| self.operator.sent.get(&chain).map(String::as_str))
    }

    /// An answer for another host's operator ([`REMOTE_OPERATOR`]'s frame): back through the
    /// call that asked.
    pub(super) fn answer_remote_operator(&mut self, frame: Frame) {
        let to = frame.correlation_id.and_then(|id| self.operator.answers.remove(&id));
        if let Some(reply) = to {
            let _ = reply.send(frame.body);
        }
    }

    /// Chain `chain` ended (`end`): kept when another host's operator started it, for a
    /// `--wait` that asks later.
    pub(super) fn operator_chain_ended(&mut self, end: &ChainEnd) {
        if self.operator.chains.remove(&end.chain).is_some() {
            if self.operator.ends.len() == ENDS_KEPT {
                self.operator.ends.pop_front();
            }
            self.operator.ends.push_back(end.clone());
        }
    }
}

impl OperatorState {
    /// Whether another host's operator started chain `chain` (its end is kept).
    pub(super) fn started(&self, chain: &MsgId) -> bool {
        self.chains.contains_key(chain)
    }

    /// The host whose operator started chain `chain` here, if another's.
    pub(super) fn asker(&self, chain: &MsgId) -> Option<&str> {
        self.chains.get(chain).map(String::as_str)
    }
}

/// How long this host waits for another host to run an operator's command (a `stop` waits for
/// the agent's process to exit).
const OPERATOR_TIMEOUT_MS: u64 = 60_000;

/// How often `flockctl logs -f` here asks another host for its agent's new lines.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// How much longer than a chain's wall budget a `--wait` on another host's chain waits.
const WATCH_GRACE_MS: u64 = 30_000;
