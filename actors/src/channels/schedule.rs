//! Delta notifications: per (agent, channel) a durable cursor `sent_seq` (delivered and
//! acknowledged) and `scheduled_seq` (handed to a notification in flight). A post raises
//! `scheduled_seq` and arms one timer per (agent, channel) — bursts inside the delay coalesce
//! into one notification. When the timer fires, the router delivers the rendered delta as a turn
//! input; the agent's `Ack` moves `sent_seq` up; a failure rolls `scheduled_seq` back and the
//! next post (or the agent becoming ready) retries. Nothing at or below `sent_seq` is ever sent
//! again, across any restart.

use std::time::Duration;

use ractor::ActorRef;

use super::delta::{self};
use super::state::ChannelsState;
use crate::messages::{ChannelsMsg, DeltaSpan, RouterMsg};
use crate::store::channels::Cursor;
use crate::store_actor::with_store;

impl ChannelsState {
    /// Raises the scheduled cursor to `upto` and arms the coalescing timer if none is armed.
    pub(super) async fn schedule(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        channel: &str,
        upto: u64,
    ) {
        self.schedule_all(myself, channel, &[agent.to_owned()], upto).await;
    }

    /// Raises the scheduled cursors of `agents` in `channel` to `upto` (one transaction for all,
    /// so a post to a big channel costs one commit) and arms each coalescing timer not armed yet.
    pub(super) async fn schedule_all(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        agents: &[String],
        upto: u64,
    ) {
        let raised: Vec<(String, String, Cursor)> = agents
            .iter()
            .filter_map(|a| {
                let cur =
                    self.cursors.get(&(a.clone(), channel.to_owned())).copied().unwrap_or_default();
                (upto > cur.scheduled_seq).then(|| {
                    (
                        a.clone(),
                        channel.to_owned(),
                        Cursor { sent_seq: cur.sent_seq, scheduled_seq: upto },
                    )
                })
            })
            .collect();
        if raised.is_empty() {
            return;
        }
        let batch = raised.clone();
        if let Err(e) = self.db(move |s| s.set_cursors(&batch)).await {
            tracing::error!(error = ?e, "flock channels: cursor write failed");
            return;
        }
        let (min, max) =
            (self.spec.channels.delta_delay_min_ms, self.spec.channels.delta_delay_max_ms);
        for (agent, channel, cursor) in raised {
            let key = (agent, channel);
            self.cursors.insert(key.clone(), cursor);
            if self.armed.insert(key.clone()) {
                let delay = if max > min { fastrand::u64(min..=max) } else { min };
                let (agent, channel) = key;
                if delay == 0 {
                    let _ = myself.cast(ChannelsMsg::DeltaDue { agent, channel });
                } else {
                    myself.send_after(Duration::from_millis(delay), move || {
                        ChannelsMsg::DeltaDue { agent, channel }
                    });
                }
            }
        }
    }

    pub(super) async fn send_delta(&mut self, agent: &str, channel: &str) {
        let key = (agent.to_owned(), channel.to_owned());
        let cur = self.cursors.get(&key).copied().unwrap_or_default();
        let Some(ch) = self.channels.get(channel) else {
            self.armed.remove(&key);
            return;
        };
        if cur.sent_seq >= cur.scheduled_seq {
            // Stale: everything it would carry was already delivered.
            self.armed.remove(&key);
            return;
        }
        let (name, topic, id, born, upto, after) = (
            ch.name.clone(),
            ch.topic.clone(),
            ch.id.clone(),
            ch.created_at,
            cur.scheduled_seq,
            cur.sent_seq,
        );
        let (c, reader) = (id.clone(), agent.to_owned());
        let page = with_store(&self.store, move |s| {
            s.new_for(&c, &reader, after, upto, delta::DELTA_MAX_MESSAGES)
        })
        .await;
        let (total, first, newest) = match page {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(channel = %channel, error = %e, "flock channels: reading #{channel} failed");
                self.armed.remove(&key);
                return;
            }
        };
        if total == 0 {
            // Only the agent's own posts are new: nothing to tell it, no turn spent.
            let done =
                ChannelsMsg::DeltaDone { agent: agent.to_owned(), channel: id, upto, ok: true };
            if let Some(me) = &self.myself {
                let _ = me.cast(done);
            }
            return;
        }
        let text = delta::render_page(&id, &name, &topic, first, total, &newest);
        match &self.router {
            Some(router) => {
                let chain = self.delta_chain.remove(&key);
                crate::metrics::get().deltas.inc();
                let span = DeltaSpan { channel: id, born, after, upto };
                let msg = RouterMsg::Delta { agent: agent.to_owned(), span, text, chain };
                if router.cast(msg).is_err() {
                    self.armed.remove(&key);
                }
            }
            None => {
                self.armed.remove(&key);
            }
        }
    }

    pub(super) async fn delta_done(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        channel: &str,
        upto: u64,
        ok: bool,
    ) {
        let key = (agent.to_owned(), channel.to_owned());
        self.armed.remove(&key);
        let cur = self.cursors.get(&key).copied().unwrap_or_default();
        let new = if ok {
            Cursor { sent_seq: cur.sent_seq.max(upto), scheduled_seq: cur.scheduled_seq.max(upto) }
        } else {
            // Roll back: these messages are still new to the agent and will be sent again.
            Cursor { sent_seq: cur.sent_seq, scheduled_seq: cur.sent_seq }
        };
        let (a, c) = key.clone();
        if self.db(move |s| s.set_cursor(&a, &c, new)).await.is_ok() {
            self.cursors.insert(key, new);
        }
        if !ok {
            let entry = self.retry.entry((agent.to_owned(), channel.to_owned())).or_default();
            *entry = (*entry).max(upto);
        }
        if ok && new.scheduled_seq > new.sent_seq {
            // More arrived while this delta was in flight.
            let upto = new.scheduled_seq;
            let mut retry = new;
            retry.scheduled_seq = new.sent_seq;
            self.cursors.insert((agent.to_owned(), channel.to_owned()), retry);
            self.schedule(myself, agent, channel, upto).await;
        }
    }
}
