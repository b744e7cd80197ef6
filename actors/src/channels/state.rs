//! What the channels actor holds (channels, cursors, agent states, cards, timers, parked bridge
//! pulls) and how its tools read it; the argument helpers every tool uses.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use flock_config::{AgentSpec, Role, SwarmSpec};
use flock_ipc::ErrorCode;
use ractor::ActorRef;
use serde_json::Value;

use crate::chains::ChainTag;
use crate::channels::delta::strip_hash;
use crate::messages::AgentOps;
use crate::messages::{ChannelsMsg, RouterMsg, StoreMsg, ToolReply};
use crate::store::channels::{Card, ChannelRow, Cursor};
use crate::store::{Store, StoreError};
use crate::store_actor::with_store;
use flock_journal::{Journal, JournalEvent};

/// Agent attention states (DESIGN.md §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    Awake,
    Sleep,
    Reactive,
}

impl AgentState {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::Awake => "AWAKE",
            AgentState::Sleep => "SLEEP",
            AgentState::Reactive => "REACTIVE",
        }
    }
    pub(super) fn parse(s: &str) -> Option<Self> {
        match s {
            "AWAKE" => Some(AgentState::Awake),
            "SLEEP" => Some(AgentState::Sleep),
            "REACTIVE" => Some(AgentState::Reactive),
            _ => None,
        }
    }
}

pub struct ChannelsState {
    pub(super) spec: Arc<SwarmSpec>,
    /// Every agent in service: the swarm file's, then those created at run time.
    pub(super) agents: Vec<AgentSpec>,
    /// On the leader: the agents the file places on other hosts, by name.
    pub(super) elsewhere: HashMap<String, AgentSpec>,
    /// The names the swarm file places on other hosts (never created here).
    pub(super) taken: std::collections::HashSet<String>,
    pub(super) agent_ops: Option<AgentOps>,
    pub(super) store: ActorRef<StoreMsg>,
    pub(super) router: Option<ActorRef<RouterMsg>>,
    pub(super) journal: Option<Arc<Journal>>,
    pub(super) channels: HashMap<String, ChannelRow>,
    pub(super) cursors: HashMap<(String, String), Cursor>,
    pub(super) states: HashMap<String, AgentState>,
    pub(super) cards: HashMap<String, Card>,
    /// (agent, channel) pairs with a delta timer armed or a delta in flight.
    pub(super) armed: HashSet<(String, String)>,
    /// Deltas that failed, by (agent, channel): the seq to retry up to when the agent is back.
    pub(super) retry: HashMap<(String, String), u64>,
    pub(super) myself: Option<ActorRef<ChannelsMsg>>,
    /// The chain of the tool call being run (set around each agent's call).
    pub(super) current_chain: Option<(ChainTag, u32)>,
    /// Whether that call's turn owes a person their answer.
    pub(super) current_answers: bool,
    /// People's posts a chain is working on, per channel (what bridges show as typing).
    pub(super) working: HashMap<String, std::collections::BTreeSet<u64>>,
    /// Per (agent, channel): the chain of the newest post waiting in its delta.
    pub(super) delta_chain: HashMap<(String, String), (ChainTag, u32)>,
    /// Bridge pulls waiting for a post, by (bridge, external chat).
    pub(super) pulls: HashMap<(String, String), ParkedPull>,
    /// Refused platform messages already journaled.
    pub(super) refused: Refused,
    /// Channels an agent opened: when each last had a post (ms), for the quiet notice.
    pub(super) last_post_at: HashMap<String, i64>,
    /// Channels with a quiet timer armed.
    pub(super) quiet_armed: HashSet<String>,
}

/// A description, refused past [`flock_config::MAX_DESCRIPTION_BYTES`] (every catalog shows it).
pub(super) fn described(text: &str) -> Result<String, (ErrorCode, String)> {
    if text.len() > flock_config::MAX_DESCRIPTION_BYTES {
        return Err(bad(format!(
            "`description` is {} bytes long; at most {} are allowed",
            text.len(),
            flock_config::MAX_DESCRIPTION_BYTES
        )));
    }
    Ok(text.to_owned())
}

pub(super) fn bad(msg: impl Into<String>) -> (ErrorCode, String) {
    (ErrorCode::BadRequest, msg.into())
}

pub(super) fn internal(msg: impl std::fmt::Display) -> (ErrorCode, String) {
    (ErrorCode::Internal, msg.to_string())
}

pub(super) fn str_arg<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

pub(super) fn list_arg(args: &Value, key: &str) -> Result<Vec<String>, (ErrorCode, String)> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("`{key}` must be a list of strings")))
            })
            .collect(),
        Some(_) => Err(bad(format!("`{key}` must be a list of strings"))),
    }
}

pub(super) fn iso(ms: i64) -> String {
    flock_journal::format_timestamp(ms.max(0) as u64)
}

/// A pull waiting for a post in its channel.
pub(super) struct ParkedPull {
    pub(super) channel: String,
    pub(super) reply: ToolReply,
}

/// The platform messages whose refusal was journaled lately (the newest [`Refused::MAX`]), so
/// a message handed over again (a bridge restarted before confirming it) is journaled once.
/// In memory: after a supervisor restart a redelivered refusal is journaled again.
#[derive(Debug, Default)]
pub(super) struct Refused {
    order: std::collections::VecDeque<String>,
    seen: std::collections::HashSet<String>,
}

impl Refused {
    const MAX: usize = 4096;

    /// Records `origin`; whether it was not recorded yet.
    pub(super) fn first_time(&mut self, origin: &str) -> bool {
        if self.seen.contains(origin) {
            return false;
        }
        self.seen.insert(origin.to_owned());
        self.order.push_back(origin.to_owned());
        if self.order.len() > Self::MAX
            && let Some(old) = self.order.pop_front()
        {
            self.seen.remove(&old);
        }
        true
    }
}

/// How a post is kept from being made twice.
pub(super) enum PostKey {
    None,
    /// A chain's answer to a person (at most one per chain).
    Answer(flock_ipc::MsgId),
    /// A chain's answer posted by the runtime: [`PostKey::Answer`] that also completes the
    /// input whose turn gave it (message id, its agent), in the same transaction.
    Completing(flock_ipc::MsgId, flock_ipc::MsgId, String),
    /// A message from a platform (at most one per platform message).
    Origin(String),
}

impl ChannelsState {
    /// The swarm file's agents with their roles (default peers of a created agent's extensions).
    pub(super) fn peers(&self) -> Vec<(String, flock_config::Role)> {
        self.spec.agents.iter().map(|a| (a.key(), a.role)).collect()
    }

    pub(super) async fn db<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, (ErrorCode, String)> {
        with_store(&self.store, f).await.map_err(internal)
    }

    /// Journals `event`; during an agent's tool call it joins the chain that call works in, so
    /// the journal tells a project's story under one chain id.
    pub(super) fn journal(&self, mut event: JournalEvent) {
        if let Some((chain, _)) = &self.current_chain
            && event.trace.correlation_id.is_none()
        {
            event = event.correlation(crate::chains::corr(chain.id));
        }
        if let Some(j) = &self.journal
            && let Err(e) = j.append(&event)
        {
            tracing::error!(error = %e, "flock channels: journal append failed");
        }
    }

    /// The agent or spawned instance at this address (`name` or `name@instance`).
    pub(super) fn agent(&self, key: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.has_key(key)).or_else(|| {
            // On the leader: an instance an agent of another host spawned there, of an agent
            // placed there (it has that agent's role).
            let (base, _) = key.split_once('@')?;
            self.elsewhere.get(base)
        })
    }

    pub(super) fn role_of(&self, agent: &str) -> Option<Role> {
        self.agent(agent).map(|a| a.role)
    }

    pub(super) fn is_agent(&self, id: &str) -> bool {
        self.agent(id).is_some()
    }

    pub(super) fn state_of(&self, agent: &str) -> AgentState {
        self.states.get(agent).copied().unwrap_or(match self.role_of(agent) {
            Some(Role::Sysadmin) => AgentState::Reactive,
            _ => AgentState::Awake,
        })
    }

    /// Checks that every name is an agent of the swarm or `human:<name>`.
    pub(super) fn check_participants(&self, names: &[String]) -> Result<(), (ErrorCode, String)> {
        for n in names {
            let human = n.strip_prefix("human:").is_some_and(|h| !h.is_empty());
            if !human && !self.is_agent(n) {
                let known: Vec<&str> = self.agents.iter().map(|a| a.name.as_str()).collect();
                return Err((
                    ErrorCode::AgentNotFound,
                    format!("`{n}` is neither an agent ({}) nor `human:<name>`", known.join(", ")),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn channel(&self, arg: Option<&str>) -> Result<&ChannelRow, (ErrorCode, String)> {
        let id = strip_hash(arg.ok_or_else(|| bad("`channel` is required"))?);
        self.channels.get(id).ok_or_else(|| {
            bad(format!("no channel `#{id}`; flock_channel_list shows the channels"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_recorded_once_per_message_and_the_record_is_bounded() {
        let mut r = Refused::default();
        assert!(r.first_time("tg/-1/7"));
        assert!(!r.first_time("tg/-1/7"), "handed over again: not journaled twice");
        assert!(r.first_time("tg/-1/8"));
        for i in 0..Refused::MAX {
            r.first_time(&format!("tg/-2/{i}"));
        }
        assert_eq!(r.order.len(), Refused::MAX);
        assert_eq!(r.seen.len(), Refused::MAX);
        assert!(r.first_time("tg/-1/7"), "long forgotten");
    }
}
