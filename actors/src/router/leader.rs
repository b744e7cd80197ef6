//! The channels across hosts (issue #26, docs/cluster.md): the leader (`cluster.leader`) holds
//! them. An agent's channel tool call on another host goes to the leader ([`HostAsk::Tool`]),
//! whose channels actor answers it as the agent's own; a channel notification for an agent on
//! another host goes to that host ([`HostAsk::Delta`]), whose router queues it as a turn and
//! answers when the turn took it (the leader's cursor moves then, as on one host); an agent that
//! becomes ready on another host is told to the leader ([`HostAsk::Ready`]), which sends it what
//! its channels hold for it. Creating, spawning and decommissioning agents stay on the caller's
//! host: they start and stop processes there.

use super::PermissionReply;
use super::permit::PermissionCall;
use super::*;
use crate::caller::Caller;
use crate::messages::{DeltaSpan, HostAsk, OutCall, ToolReply};
use flock_config::tools::{self as table, Owner};

/// How long a host waits for the leader's answer to a channel tool call.
const TOOL_TIMEOUT_MS: u64 = 30_000;

/// How much longer than a chain's wall budget the leader waits for a notification's turn on
/// another host (past it, the notification counts as not taken and is sent again later).
const DELTA_GRACE_MS: u64 = 30_000;

/// What this host asked another and waits for.
#[derive(Debug)]
pub(super) enum Asked {
    /// An agent's channel tool call: its answer goes to the agent.
    Tool(ToolReply),
    /// A notification for an agent there: its outcome goes to the channels actor.
    Delta { agent: String, channel: String, upto: u64 },
    /// Something the leader is told (an agent ready, a chain working): only a failure is
    /// worth a line.
    Notice,
    /// A chain's answer to a person who asked in a channel.
    Answer(AnswerOut),
    /// A command of this host's operator for an agent there: its answer goes to the operator's
    /// connection, as the answer to frame `frame_id` (operator.rs).
    Operator { conn: ConnId, frame_id: MsgId },
    /// The operator's send `id` to an agent there (operator.rs).
    OperatorSend { conn: ConnId, id: MsgId, host: String },
    /// A page of the log of `agent` there, for `flockctl logs [-f]` (operator.rs).
    OperatorLogs { conn: ConnId, frame_id: MsgId, host: String, agent: String, follow: bool },
}

/// A chain's answer (or stop notice) from an agent here, for the leader to post where the
/// person asked; `msg` (the input whose turn gave it) is completed here once it is posted.
#[derive(Debug)]
pub(super) struct AnswerOut {
    pub agent: String,
    pub human: String,
    pub text: String,
    pub chain: MsgId,
    pub msg: Option<MsgId>,
    /// Where the person asked; `None`: in their DM with the agent (an operator's send from
    /// host `to`, operator.rs).
    pub place: Option<crate::chains::ReplyPlace>,
    /// The host asked to post it: the leader, or the host whose operator sent the input.
    pub to: String,
    /// Asked how often already (a leader that cannot be reached is asked again).
    pub tries: u32,
}

impl AnswerOut {
    /// What the leader is asked to post.
    fn ask(&self) -> HostAsk {
        HostAsk::Answer {
            agent: self.agent.clone(),
            human: self.human.clone(),
            text: self.text.clone(),
            chain: self.chain,
            place: self.place.clone(),
        }
    }
}

/// How often an answer is offered to a leader that cannot be reached (about 3.5 min in all);
/// past it the answer is journaled as not posted and its input completed, as on one host.
const ANSWER_TRIES: u32 = 12;

/// The wait before asking again after `tries` failed asks.
fn answer_backoff(tries: u32) -> std::time::Duration {
    std::time::Duration::from_millis((500u64 << tries.min(6)).min(30_000))
}

/// The channel tools that stay on the caller's host: they start and stop processes.
pub(super) fn stays_here(tool: &str) -> bool {
    matches!(tool, "agents__spawn" | "flock_create_agent" | "flock_decommission_agent")
}

/// The answer to a notification from the leader when `agent` had been told the channel up to
/// `told` before it came: all of it (`Accepted`), or part (`Reply` with the seq: the leader
/// moves its cursor there and sends the rest).
pub(super) fn delta_told(agent: &str, told: u64, upto: u64) -> Body {
    if told >= upto { delta_outcome(agent, true) } else { Body::Reply { text: told.to_string() } }
}

/// The answer to a notification from the leader: taken by the agent's turn, or not (then the
/// leader sends it again later).
pub(super) fn delta_outcome(agent: &str, ok: bool) -> Body {
    if ok {
        Body::Accepted
    } else {
        let message =
            format!("`{agent}` did not take the notification (not connected, or its turn failed)");
        Body::Error { code: ErrorCode::TargetUnavailable, message }
    }
}

impl RouterState {
    /// The leader, when it is another host than this one.
    pub(super) fn leader_elsewhere(&self) -> Option<&str> {
        let link = self.hosts.as_ref()?;
        (link.leader != link.host).then_some(link.leader.as_str())
    }

    /// Asks host `host` (`ask`); the answer comes back as [`RouterMsg::HostAnswered`] and goes
    /// where `asked` says.
    pub(super) fn ask_host(&mut self, host: String, ask: HostAsk, asked: Asked, timeout_ms: u64) {
        let id = new_id();
        self.asked.insert(id, asked);
        let sent = self
            .hosts
            .as_ref()
            .is_some_and(|l| l.calls.send(OutCall::Ask { host, id, ask, timeout_ms }).is_ok());
        if !sent {
            let message = "the link to the other hosts is not running".to_owned();
            self.host_answered(id, Body::Error { code: ErrorCode::TargetUnavailable, message });
        }
    }

    /// The leader, when it is another host and answers channel call `tool`.
    pub(super) fn channels_leader(&self, tool: &str) -> Option<String> {
        self.leader_elsewhere().filter(|_| !stays_here(tool)).map(str::to_owned)
    }

    /// [`Self::ask_host`] after `wait` (the ask is registered now, sent then).
    pub(super) fn ask_host_later(
        &mut self,
        host: String,
        ask: HostAsk,
        asked: Asked,
        timeout_ms: u64,
        wait: std::time::Duration,
    ) {
        let Some(calls) = self.hosts.as_ref().map(|l| l.calls.clone()) else { return };
        let id = new_id();
        self.asked.insert(id, asked);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = calls.send(OutCall::Ask { host, id, ask, timeout_ms });
        });
    }

    /// An agent's channel tool call, sent to `leader`; its answer goes to the agent.
    pub(super) fn tool_to_host(&mut self, leader: String, ask: HostAsk, reply: ToolReply) {
        self.ask_host(leader, ask, Asked::Tool(reply), TOOL_TIMEOUT_MS);
    }

    /// A notification for `agent`, which runs on host `host`: sent there.
    pub(super) fn delta_to_host(
        &mut self,
        host: String,
        agent: String,
        span: DeltaSpan,
        text: String,
        chain: Option<(ChainTag, u32)>,
    ) {
        let timeout_ms = self.spec.budget.max_wall_secs.saturating_mul(1000) + DELTA_GRACE_MS;
        let (channel, upto) = (span.channel.clone(), span.upto);
        let asked = Asked::Delta { agent: agent.clone(), channel, upto };
        let ask = HostAsk::Delta { agent, span, text, chain };
        self.ask_host(host, ask, asked, timeout_ms);
    }

    /// A chain's answer from an agent here to a person who asked in a channel (or to another
    /// host's operator): `answer.to` posts it (once per chain, so asking again after a crash or
    /// a lost answer posts nothing twice).
    pub(super) fn answer_to_host(&mut self, answer: AnswerOut) {
        let ask = answer.ask();
        self.ask_host(answer.to.clone(), ask, Asked::Answer(answer), TOOL_TIMEOUT_MS);
    }

    /// The leader's answer to [`Self::answer_to_leader`]: the input is completed once the
    /// answer is posted; a leader that could not be reached is asked again, a while later.
    fn answer_posted(&mut self, mut answer: AnswerOut, body: Body) {
        let outcome = match body {
            Body::ToolResult { ok: true, content } => {
                let v: serde_json::Value = serde_json::from_str(&content).unwrap_or_default();
                let channel = v["channel"].as_str().unwrap_or_default().to_owned();
                Ok((
                    channel,
                    v["seq"].as_u64().unwrap_or(0),
                    v["duplicate"].as_bool().unwrap_or(false),
                ))
            }
            Body::ToolResult { ok: false, content } => Err(content),
            Body::Error { code: ErrorCode::TargetUnavailable | ErrorCode::Draining, message }
                if answer.tries + 1 < ANSWER_TRIES =>
            {
                let wait = answer_backoff(answer.tries);
                tracing::warn!(agent = %answer.agent, "flock cluster: the leader did not take an answer ({message}); asking again in {} ms", wait.as_millis());
                answer.tries += 1;
                let (ask, host) = (answer.ask(), answer.to.clone());
                self.ask_host_later(host, ask, Asked::Answer(answer), TOOL_TIMEOUT_MS, wait);
                return;
            }
            Body::Error { code, message } => Err(format!("{code}: {message}")),
            other => Err(format!("the leader answered {other:?}")),
        };
        if let (Ok(_), Some(id)) = (&outcome, answer.msg) {
            let op = WriteOp::Complete { id, agent: answer.agent.clone() };
            let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
        }
        let AnswerOut { agent, human, text, chain, msg, .. } = answer;
        self.answered(AnswerPosted { chain, agent, human, text, msg, outcome });
    }

    /// `agent` (of this host) is ready: the leader, when it is another host, hears it.
    pub(super) fn ready_to_leader(&mut self, agent: &str) {
        if let Some(leader) = self.leader_elsewhere().map(str::to_owned) {
            let ask = HostAsk::Ready { agent: agent.to_owned() };
            self.ask_host(leader, ask, Asked::Notice, TOOL_TIMEOUT_MS);
        }
    }

    /// A chain here started or stopped working on a person's post in `channel` (the leader's).
    pub(super) fn working_to_leader(
        &mut self,
        leader: String,
        channel: String,
        seq: u64,
        on: bool,
    ) {
        let ask = HostAsk::Working { channel, seq, on };
        self.ask_host(leader, ask, Asked::Notice, TOOL_TIMEOUT_MS);
    }

    /// The answer to what this host asked another.
    pub(super) fn host_answered(&mut self, id: MsgId, body: Body) {
        match self.asked.remove(&id) {
            Some(Asked::Tool(reply)) => {
                let frame = Frame {
                    correlation_id: Some(reply.frame_id),
                    ..Frame::new(ROUTER, reply.to, body)
                };
                let _ = reply.outbox.try_send(frame);
            }
            Some(Asked::Delta { agent, channel, upto }) => {
                let ok = matches!(body, Body::Accepted | Body::Reply { .. });
                if let Body::Error { message, .. } = &body {
                    tracing::debug!(agent = %agent, channel = %channel, "flock cluster: a notification was not taken: {message}");
                }
                // Told before up to a seq below `upto`: the cursor moves there, the rest is
                // sent again (`delta_done` on the channels actor sees more scheduled than sent).
                let upto = match &body {
                    Body::Reply { text } => text.parse::<u64>().map_or(0, |told| told.min(upto)),
                    _ => upto,
                };
                if let Some(ch) = &self.channels {
                    let _ = ch.cast(ChannelsMsg::DeltaDone { agent, channel, upto, ok });
                }
            }
            Some(Asked::Answer(answer)) => self.answer_posted(answer, body),
            Some(
                asked @ (Asked::Operator { .. }
                | Asked::OperatorSend { .. }
                | Asked::OperatorLogs { .. }),
            ) => self.operator_answered(asked, body),
            Some(Asked::Notice) => {
                if let Body::Error { message, .. } = &body {
                    tracing::warn!(
                        "flock cluster: the leader was not told (an agent ready, a chain working): {message}"
                    );
                }
            }
            None => {}
        }
    }

    /// What host `host` asks this one (`id`: its own, taken once).
    pub(super) fn asked_by_host(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        host: String,
        id: MsgId,
        ask: HostAsk,
        reply: oneshot::Sender<Body>,
    ) {
        if matches!(ask, HostAsk::Request(_)) {
            // The link brings a request as `CallFromHost` (its answer carries its tokens),
            // never as an ask.
            let message = "a request comes as a call, not as an ask".to_owned();
            let _ = reply.send(Body::Error { code: ErrorCode::BadRequest, message });
            return;
        }
        let refused = |code: ErrorCode, message: String| Body::Error { code, message };
        let Some(link) = self.hosts.as_ref() else { return };
        let leader_here = link.leader == link.host;
        let refusal = if self.draining {
            Some(refused(ErrorCode::Draining, "the swarm is shutting down".into()))
        } else if !self.seen_calls.first(id) {
            Some(refused(ErrorCode::BadRequest, "this call was taken already".into()))
        } else {
            None
        };
        if let Some(body) = refusal {
            let _ = reply.send(body);
            return;
        }
        match ask {
            HostAsk::Request(_) => {}
            HostAsk::Operator(ask) => self.operator_from_host(myself, host, id, ask, reply),
            HostAsk::Tool { .. } | HostAsk::Permission { .. } if !leader_here => {
                let msg = format!(
                    "host `{}` does not keep the channels and permissions: `{}` does",
                    link.host, link.leader
                );
                let _ = reply.send(refused(ErrorCode::Forbidden, msg));
            }
            HostAsk::Tool { caller, name, arguments, chain, answers } => {
                match self.host_tool_caller(&host, &caller, &name, Owner::Channels) {
                    Ok(role) => {
                        let Some(ch) = &self.channels else {
                            let msg = "channels are not running".to_owned();
                            let _ = reply.send(refused(ErrorCode::Internal, msg));
                            return;
                        };
                        let outbox = answered_through(reply);
                        let msg = ChannelsMsg::Tool {
                            caller: Caller { id: caller.clone(), role: Some(role) },
                            name,
                            arguments,
                            chain,
                            answers,
                            reply: ToolReply { outbox, frame_id: id, to: caller },
                        };
                        // Not running: `reply` is dropped, the asking host hears the swarm stops.
                        let _ = ch.cast(msg);
                    }
                    Err((code, msg)) => {
                        tracing::warn!(from = %host, "flock cluster: refused a channel call: {msg}");
                        let _ = reply.send(refused(code, msg));
                    }
                }
            }
            HostAsk::Permission { caller, name, arguments, key, protected } => {
                match self.host_tool_caller(&host, &caller, &name, Owner::Permissions) {
                    Ok(role) => {
                        let outbox = answered_through(reply);
                        let to = caller.clone();
                        let answer = PermissionReply::Agent { outbox, frame_id: id, to };
                        let caller = Caller { id: caller, role: Some(role) };
                        let call = PermissionCall { caller, tool: name, arguments, key, protected };
                        self.permission_call(myself, call, answer);
                    }
                    Err((code, msg)) => {
                        tracing::warn!(from = %host, "flock cluster: refused a permission call: {msg}");
                        let _ = reply.send(refused(code, msg));
                    }
                }
            }
            HostAsk::Delta { agent, span, text, chain } => {
                if host != link.leader || leader_here {
                    let msg =
                        format!("only the leader `{}` sends channel notifications", link.leader);
                    tracing::warn!(from = %host, "flock cluster: refused a notification: {msg}");
                    let _ = reply.send(refused(ErrorCode::Forbidden, msg));
                    return;
                }
                if !self.slots.contains_key(&agent) {
                    let msg = format!("no agent named `{agent}` runs on host `{}`", link.host);
                    let _ = reply.send(refused(ErrorCode::AgentNotFound, msg));
                    return;
                }
                self.queue_delta(myself, agent, span, text, chain, Some(reply));
            }
            HostAsk::Answer { agent, human, text, chain, place } => {
                // A person's post is answered through the leader; an operator's send from
                // here to that host is answered back here, in the operator's DM.
                let may = match &place {
                    Some(_) => leader_here,
                    None => self.operator_sent_to(chain) == Some(host.as_str()),
                };
                if !may || self.remote_host(&agent) != Some(host.as_str()) {
                    let msg = format!("host `{host}` may not answer for `{agent}` here");
                    tracing::warn!(from = %host, "flock cluster: refused an answer: {msg}");
                    let _ = reply.send(refused(ErrorCode::Forbidden, msg));
                    return;
                }
                let (tx, rx) = oneshot::channel::<AnswerPosted>();
                let off = place.as_ref().map(|p| ChannelsMsg::Working {
                    channel: p.channel.clone(),
                    seq: p.seq,
                    on: false,
                });
                let post = ChannelsMsg::Answer {
                    agent,
                    human,
                    text,
                    chain,
                    msg: None,
                    place,
                    to_host: Some(tx),
                };
                if self.channels.as_ref().is_none_or(|ch| ch.cast(post).is_err()) {
                    let msg = "channels are not running".to_owned();
                    let _ = reply.send(refused(ErrorCode::Internal, msg));
                    return;
                }
                // Answered: no more typing for that post, even if the host that worked on it
                // never says so (it was killed).
                if let (Some(ch), Some(off)) = (&self.channels, off) {
                    let _ = ch.cast(off);
                }
                tokio::spawn(async move {
                    let body = match rx.await.map(|p| p.outcome) {
                        Ok(Ok((channel, seq, duplicate))) => Body::ToolResult {
                            ok: true,
                            content: serde_json::json!({"channel": channel, "seq": seq, "duplicate": duplicate}).to_string(),
                        },
                        Ok(Err(why)) => Body::ToolResult { ok: false, content: why },
                        Err(_) => refused(ErrorCode::Draining, "the channels actor stopped".into()),
                    };
                    let _ = reply.send(body);
                });
            }
            HostAsk::Journal { lines } => {
                if !leader_here || !link.remote.values().any(|h| *h == host) {
                    let msg = format!("host `{host}` does not journal here");
                    let _ = reply.send(refused(ErrorCode::Forbidden, msg));
                    return;
                }
                let Some(journal) = &self.journal else {
                    let _ = reply.send(Body::Accepted);
                    return;
                };
                let mut refused_lines = 0;
                for line in lines {
                    match flock_journal::validate_line(&line) {
                        // Who wrote it is part of the record: a host vouches for its own lines.
                        Ok(event) => journal.log(event.param("host", host.as_str())),
                        Err(_) => refused_lines += 1,
                    }
                }
                if refused_lines > 0 {
                    tracing::warn!(from = %host, "flock cluster: {refused_lines} journal line(s) from host `{host}` were not valid events; dropped");
                }
                let _ = reply.send(Body::Accepted);
            }
            HostAsk::Working { channel, seq, on } => {
                if !leader_here || !link.remote.values().any(|h| *h == host) {
                    let msg =
                        format!("host `{host}` does not run agents of this swarm's chats here");
                    let _ = reply.send(refused(ErrorCode::Forbidden, msg));
                    return;
                }
                if let Some(ch) = &self.channels {
                    let _ = ch.cast(ChannelsMsg::Working { channel, seq, on });
                }
                let _ = reply.send(Body::Accepted);
            }
            HostAsk::Ready { agent } => {
                if !leader_here || self.remote_host(&agent) != Some(host.as_str()) {
                    let msg = format!("host `{host}` may not speak for `{agent}` here");
                    let _ = reply.send(refused(ErrorCode::Forbidden, msg));
                    return;
                }
                // A notification still out for it went to a process that is gone (its host
                // restarted): not taken; sent again with what arrived since.
                let lost: Vec<MsgId> = self
                    .asked
                    .iter()
                    .filter(|(_, a)| matches!(a, Asked::Delta { agent: to, .. } if *to == agent))
                    .map(|(id, _)| *id)
                    .collect();
                for id in lost {
                    let message = "its host started it again".to_owned();
                    self.host_answered(
                        id,
                        Body::Error { code: ErrorCode::TargetUnavailable, message },
                    );
                }
                if let Some(ch) = &self.channels {
                    let _ = ch.cast(ChannelsMsg::AgentReady { agent });
                }
                let _ = reply.send(Body::Accepted);
            }
        }
    }

    /// The role of `caller`, an agent of host `host`, when it may make call `tool` (which
    /// `owner` answers) here (the same check its own host's router made, made again: a host
    /// speaks only for its own agents, and only with their powers).
    fn host_tool_caller(
        &self,
        host: &str,
        caller: &str,
        tool: &str,
        owner: Owner,
    ) -> Result<flock_config::Role, (ErrorCode, String)> {
        let forbidden = |m: String| (ErrorCode::Forbidden, m);
        if self.remote_host(caller) != Some(host) {
            return Err(forbidden(format!("host `{host}` may not speak for `{caller}`")));
        }
        // An instance spawned there has its agent's role.
        let base = caller.split_once('@').map_or(caller, |(name, _)| name);
        let spec = self
            .hosts
            .as_ref()
            .and_then(|l| l.agents.iter().find(|a| a.key() == caller || a.key() == base));
        let Some(role) = spec.map(|s| s.role) else {
            return Err(forbidden(format!("`{caller}` is not an agent of this swarm")));
        };
        let Some(t) = table::tool(tool).filter(|t| t.owner == owner && !stays_here(tool)) else {
            return Err((
                ErrorCode::BadRequest,
                format!("`{tool}` is not a call the leader answers here"),
            ));
        };
        if !t.access.allows(role) {
            return Err(forbidden(format!(
                "`{caller}` is a {} and may not call {tool}: {}",
                role.as_str(),
                t.access.who()
            )));
        }
        Ok(role)
    }
}

/// An outbox whose first frame's body goes to `reply`: a call from another host answered by code
/// that answers an agent's connection (the channels actor, the permission job).
pub(super) fn answered_through(reply: oneshot::Sender<Body>) -> flock_ipc::Outbox {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Frame>(1);
    tokio::spawn(async move {
        let body = match rx.recv().await {
            Some(frame) => frame.body,
            None => Body::Error {
                code: ErrorCode::Internal,
                message: "the call was not answered".into(),
            },
        };
        let _ = reply.send(body);
    });
    tx
}
