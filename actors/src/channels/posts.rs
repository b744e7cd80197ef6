//! Posting: a post gets its seq in the store, then its readers' deltas are scheduled; a chain's
//! answer to a person is posted at most once; DMs and new channels are made here.

use flock_config::{AgentSpec, Role};
use flock_ipc::{ErrorCode, MsgId};
use ractor::ActorRef;

use super::delta::{dm_channel_id, mentions};
use super::state::{AgentState, ChannelsState, PostKey, bad, internal};
use crate::chains::ReplyPlace;
use crate::messages::{ChannelsMsg, RouterMsg};
use crate::store::channels::{Ask, ChannelRow, ChannelState, PostExtra, UniqueKey};
use crate::store::now_ms;

impl ChannelsState {
    /// Posts a chain's answer to a person, once per chain: where they asked, as a reply to
    /// their post (`place`), or in their DM with `agent` (also when the place can no longer
    /// take posts: archived, or gone). Returns the channel, the seq, and whether an answer to
    /// this chain was already there.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn answer(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        agent: &str,
        human: &str,
        text: &str,
        chain: MsgId,
        msg: Option<MsgId>,
        place: Option<ReplyPlace>,
    ) -> Result<(String, u64, bool), (ErrorCode, String)> {
        // The input whose turn answered is completed with the post, in one transaction.
        let key = || match msg {
            Some(id) => PostKey::Completing(chain, id, agent.to_owned()),
            None => PostKey::Answer(chain),
        };
        let open = |p: &ReplyPlace| {
            self.channels.get(&p.channel).is_some_and(|c| c.state != ChannelState::Archived)
        };
        if let Some(p) = place.filter(open) {
            let (seq, duplicate) =
                self.post_keyed(myself, &p.channel, agent, text, key(), Some(p.seq), false).await?;
            return Ok((p.channel, seq, duplicate));
        }
        let id = self.ensure_dm(agent, human).await?;
        let (seq, duplicate) =
            self.post_keyed(myself, &id, agent, text, key(), None, false).await?;
        Ok((id, seq, duplicate))
    }

    /// Appends a message (seq assigned in its insert transaction) and notifies members.
    pub(super) async fn post(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        author: &str,
        text: &str,
    ) -> Result<(u64, bool), (ErrorCode, String)> {
        let asks = author.starts_with("human:");
        self.post_keyed(myself, channel, author, text, PostKey::None, None, asks).await
    }

    /// [`Self::post`] with any [`PostKey`] (a keyed post is made at most once), replying to post
    /// `reply_to` of the channel. With `asks` (a person's own words, not a notice Flock posts
    /// for them), a post that an agent must answer (see [`Self::responder`]) is handed to that
    /// agent as a durable message in the same transaction: the root of a chain whose answer the
    /// runtime posts back here.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn post_keyed(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        author: &str,
        text: &str,
        key: PostKey,
        reply_to: Option<u64>,
        asks: bool,
    ) -> Result<(u64, bool), (ErrorCode, String)> {
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        if text.len() > limit {
            return Err(bad(crate::text::too_long("the post", text.len(), limit)));
        }
        let ch =
            self.channels.get(channel).ok_or_else(|| bad(format!("no channel `#{channel}`")))?;
        if ch.state == ChannelState::Archived {
            return Err(bad(format!(
                "#{channel} is archived and read-only: flock_channel_read still works; post in an active channel (flock_channel_list) instead"
            )));
        }
        let ask = (asks && author.starts_with("human:"))
            .then(|| self.responder(ch, text))
            .flatten()
            .map(|agent| {
                let id = flock_ipc::id::new_id();
                let route = crate::chains::Route::root(
                    id,
                    author,
                    &agent,
                    text,
                    now_ms() as u64,
                    Some(author.to_owned()),
                );
                Ask { agent, text: text.to_owned(), id, route }
            });
        let completes = match &key {
            PostKey::Completing(_, id, agent) => Some((*id, agent.clone())),
            _ => None,
        };
        let extra = PostExtra { reply_to, ask, completes };
        let (c, a, t) = (channel.to_owned(), author.to_owned(), text.to_owned());
        let (seq, duplicate, ask) = self
            .db(move |s| {
                let key = match key {
                    PostKey::None => None,
                    PostKey::Answer(chain) | PostKey::Completing(chain, ..) => {
                        Some(UniqueKey::Answers(chain.to_be_bytes().to_vec()))
                    }
                    PostKey::Origin(origin) => Some(UniqueKey::Origin(origin)),
                };
                s.post_unique(&c, &a, &t, key, extra)
            })
            .await?;
        if duplicate {
            return Ok((seq, true));
        }
        crate::metrics::get().channel_post(channel);
        let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
        ch.last_seq = seq;
        let members = ch.members.clone();
        let is_dm = ch.is_dm;
        let mentioned = mentions(text);
        let asked = ask.as_ref().map(|a| a.agent.clone());
        let mut notify_now = Vec::new();
        for m in members {
            // Humans see the channel through their bridge, never through deltas; the agent a
            // person's post was handed to has it as a message of its own.
            if m == author || !self.is_agent(&m) || asked.as_ref() == Some(&m) {
                continue;
            }
            let is_mentioned = mentioned.contains(&m.to_lowercase());
            let notify = match self.state_of(&m) {
                AgentState::Awake => true,
                AgentState::Sleep => is_mentioned,
                AgentState::Reactive => is_mentioned || is_dm,
            };
            if !notify {
                continue;
            }
            if self.state_of(&m) == AgentState::Sleep {
                let _ = self.set_state(&m, AgentState::Awake).await;
            }
            notify_now.push(m);
        }
        // The deltas carry the poster's chain (a person's post starts a new one).
        for m in &notify_now {
            let key = (m.clone(), channel.to_owned());
            match &self.current_chain {
                Some(c) => self.delta_chain.insert(key, c.clone()),
                None => self.delta_chain.remove(&key),
            };
        }
        if let (Some(ask), Some(router)) = (ask, &self.router) {
            let _ = router.cast(RouterMsg::Asked(ask));
        }
        self.schedule_all(myself, channel, &notify_now, seq).await;
        self.wake_pulls(channel).await;
        self.quiet_arm(myself, channel, Some((author, text)));
        Ok((seq, false))
    }

    /// The agent that answers a person's post in `ch`, if any: the first agent member it
    /// @mentions; in a DM, the agent in it; else the responder a bridge mapping names for the
    /// channel; else its coordinator or orchestrator member. One agent, never one per member.
    pub(super) fn responder(&self, ch: &ChannelRow, text: &str) -> Option<String> {
        let member = |m: &str| ch.members.iter().any(|x| x == m) && self.is_agent(m);
        if let Some(m) = mentions(text).into_iter().find(|m| member(m)) {
            return Some(m);
        }
        if ch.is_dm {
            return ch.members.iter().find(|m| self.is_agent(m)).cloned();
        }
        let mapped = self
            .spec
            .bridges
            .iter()
            .flat_map(|b| &b.channels)
            .filter(|m| m.flock == ch.id)
            .find_map(|m| m.responder.clone())
            .filter(|r| self.is_agent(r));
        mapped.or_else(|| {
            [Role::Coordinator, Role::Orchestrator].into_iter().find_map(|role| {
                self.agents
                    .iter()
                    .find(|a| a.role == role && ch.members.contains(&a.key()))
                    .map(AgentSpec::key)
            })
        })
    }

    /// The DM channel of `a` and `b`, created (by `a`) if it does not exist yet.
    pub(super) async fn ensure_dm(
        &mut self,
        a: &str,
        b: &str,
    ) -> Result<String, (ErrorCode, String)> {
        let id = dm_channel_id(a, b);
        if !self.channels.contains_key(&id) {
            // An agent's answer may come in after it was decommissioned: the person still gets
            // it, but a gone agent becomes no member (decommissioning has removed it everywhere).
            let members: Vec<String> = [a, b]
                .into_iter()
                .filter(|m| m.starts_with("human:") || self.is_agent(m))
                .map(str::to_owned)
                .collect();
            self.add_channel(ChannelRow::new(&id, &format!("DM {a} / {b}"), "", a, true, members))
                .await?;
        }
        Ok(id)
    }

    /// Stores a new channel and starts keeping it.
    pub(super) async fn add_channel(&mut self, row: ChannelRow) -> Result<(), (ErrorCode, String)> {
        let r = row.clone();
        self.db(move |s| s.create_channel(&r)).await?;
        self.channels.insert(row.id.clone(), row);
        Ok(())
    }
}
