//! Sessions and channel deltas: an agent's saved conversation per channel, and the channel
//! notifications delivered to it as turns.

use super::*;
use crate::messages::DeltaSpan;

impl RouterState {
    /// Appends a finished turn to the agent's session (before its `Ack` is handled: same
    /// connection, same store queue).
    pub(super) fn save_session(&self, agent: &str, channel: &str, messages: &str) {
        let items: Vec<String> = match serde_json::from_str::<serde_json::Value>(messages) {
            Ok(serde_json::Value::Array(items)) => items.iter().map(|v| v.to_string()).collect(),
            _ => {
                tracing::warn!(
                    agent,
                    channel,
                    "flock router: `{agent}` sent a session that is not a JSON array; ignored"
                );
                return;
            }
        };
        let (agent, channel) = (agent.to_owned(), channel.to_owned());
        let job: crate::messages::StoreJob = Box::new(move |s| {
            if let Err(e) = s.append_session(&agent, &channel, &items) {
                tracing::error!(agent = %agent, channel = %channel, error = %e, "flock store: saving the session of {agent} failed");
            }
        });
        let _ = self.store.cast(StoreMsg::With(job));
    }

    /// Answers `SessionLoad` from the store, straight to the agent's outbox.
    pub(super) fn load_session(&self, conn: ConnId, agent: &str, frame: &Frame, channel: &str) {
        let Some(outbox) = self.conns.get(&conn).map(|i| i.outbox.clone()) else { return };
        let (agent, channel, id) = (agent.to_owned(), channel.to_owned(), frame.id);
        // Half a frame: the rest of it is room for the frame's own fields.
        let max_bytes = self.spec.delivery.max_frame_bytes as usize / 2;
        let job: crate::messages::StoreJob = Box::new(move |s| {
            let window = flock_config::SESSION_WINDOW;
            let messages = match s.load_session(&agent, &channel, window, max_bytes) {
                Ok(items) => format!("[{}]", items.join(",")),
                Err(e) => {
                    tracing::error!(agent = %agent, channel = %channel, error = %e, "flock store: loading the session of {agent} failed");
                    "[]".into()
                }
            };
            let reply = Frame {
                correlation_id: Some(id),
                ..Frame::new(ROUTER, agent, Body::SessionData { channel, messages })
            };
            let _ = outbox.try_send(reply);
        });
        let _ = self.store.cast(StoreMsg::With(job));
    }

    /// Queues a channel notification as a turn input of `agent` (sent to its host when it runs
    /// on another).
    pub(super) fn delta(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: String,
        span: DeltaSpan,
        text: String,
        chain: Option<(ChainTag, u32)>,
    ) {
        if !self.slots.contains_key(&agent)
            && let Some(host) = self.remote_host(&agent).map(str::to_owned)
        {
            return self.delta_to_host(host, agent, span, text, chain);
        }
        self.queue_delta(myself, agent, span, text, chain, None);
    }

    /// Queues a channel notification for `agent` here; its outcome goes to the channels actor,
    /// or to `host` — the leader that sent it.
    pub(super) fn queue_delta(
        &mut self,
        myself: &ActorRef<RouterMsg>,
        agent: String,
        span: DeltaSpan,
        text: String,
        chain: Option<(ChainTag, u32)>,
        host: Option<oneshot::Sender<Body>>,
    ) {
        let id = new_id();
        let from = format!("#{}", span.channel);
        let mut route = match chain {
            Some((tag, hops)) => Route {
                answer_path: Vec::new(),
                result: false,
                chain: tag,
                hop: hops + 1,
                parent: None,
                tokens: 0,
                by_host: BTreeMap::new(),
            },
            None => Route::root(id, &from, &agent, &text, self.now(), None),
        };
        let known = self.slots.contains_key(&agent);
        let admitted = known && self.admit(&mut route, "DELTA", &from, &agent, &text).is_ok();
        let Some(slot) = self.slots.get_mut(&agent).filter(|_| admitted) else {
            // An unknown agent's delta is retried when it is back; one refused by a stopped
            // chain counts as handled (the messages stay readable with flock_channel_read).
            if let Some(reply) = host {
                let _ = reply.send(leader::delta_outcome(&agent, known));
            } else if let Some(ch) = &self.channels {
                let (channel, upto, ok) = (span.channel, span.upto, known);
                let _ = ch.cast(ChannelsMsg::DeltaDone { agent, channel, upto, ok });
            }
            return;
        };
        let mut q = Queued::new(id, DeliveryKind::Delta, from, text, route);
        q.channel = Some(span);
        slot.queue.push_back(q);
        if let Some(reply) = host {
            self.host_deltas.insert(id, reply);
        }
        self.deliver_next(myself, &agent);
    }

    /// Reports a delta's outcome to the channels actor (or to the leader that sent it: an agent
    /// here told a channel the leader holds is remembered, see [`Self::told_already`]).
    pub(super) fn delta_done(&mut self, agent: &str, q: &Queued, ok: bool) {
        if let Some(reply) = self.host_deltas.remove(&q.id) {
            if let (true, Some(span)) = (ok, &q.channel) {
                self.told.insert((agent.to_owned(), span.channel.clone()), (span.born, span.upto));
                let op = WriteOp::Told {
                    agent: agent.to_owned(),
                    channel: span.channel.clone(),
                    born: span.born,
                    upto: span.upto,
                };
                let _ = self.store.cast(StoreMsg::Write { op, origin: None, notify: None });
            }
            let _ = reply.send(leader::delta_outcome(agent, ok));
            return;
        }
        if let (Some(ch), Some(span)) = (&self.channels, &q.channel) {
            let msg = ChannelsMsg::DeltaDone {
                agent: agent.to_owned(),
                channel: span.channel.clone(),
                upto: span.upto,
                ok,
            };
            let _ = ch.cast(msg);
        }
    }

    /// How far `agent` here was already told what a notification from the leader covers, when
    /// it was told some of it: the leader sends a notification again when it lost the answer to
    /// the first (it was killed before the answer reached it), and the agent must not take the
    /// same messages twice. `None` for the notifications of this host's own channels.
    /// (An associated function: the caller holds a mailbox slot borrowed.)
    pub(super) fn told_already(
        told: &crate::store::DeltasTold,
        host_deltas: &HashMap<MsgId, oneshot::Sender<Body>>,
        agent: &str,
        q: &Queued,
    ) -> Option<u64> {
        let span = q.channel.as_ref().filter(|_| host_deltas.contains_key(&q.id))?;
        let &(born, upto) = told.get(&(agent.to_owned(), span.channel.clone()))?;
        (born == span.born && upto > span.after).then_some(upto)
    }

    /// Answers a notification from the leader without a turn: `agent` was already told the
    /// channel up to `told`.
    pub(super) fn told_before(&mut self, agent: &str, q: Queued, told: u64) {
        let upto = q.channel.as_ref().map_or(0, |s| s.upto);
        if let Some(reply) = self.host_deltas.remove(&q.id) {
            tracing::debug!(agent = %agent, told, upto, "flock cluster: a notification the leader sent again was already told");
            let _ = reply.send(leader::delta_told(agent, told, upto));
        }
        self.leave(q.chain());
    }
}
