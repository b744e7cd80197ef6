//! Chains of turns: everything one outside input sets off (a person's message, a timer, an
//! agent's send made outside any turn). The router keeps one [`Chain`] per live chain, charges it
//! every hop (a delivery: message, request, delegation, result) and every model token, and stops
//! it at its budget (`budget:` in the swarm file). Routing records ([`Route`]) travel with each
//! message, in memory and in its SQLite row, so a restarted supervisor resumes a chain where it
//! was (its hop count and start time; model tokens spent before the restart are not recovered).
//!
//! Nothing here does I/O: the router applies the decisions.

use std::collections::{BTreeMap, HashMap};

use flock_config::BudgetSpec;
use flock_ipc::id::fmt_id;
use flock_ipc::{ChainRow, MsgId};
use serde::{Deserialize, Serialize};

use crate::text::clip;

/// A chain's identity and what the router needs to rebuild it after a restart. Carried by every
/// message of the chain (so a chain survives its root message's completion).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTag {
    #[serde(with = "hex_id")]
    pub id: MsgId,
    /// Who started it (`human:NAME`, or the agent whose send began it).
    pub origin: String,
    /// Whom the outside input addressed.
    pub entry: String,
    /// The start of the outside input's text (for the person's notice when it is stopped).
    pub text: String,
    pub started_ms: u64,
    /// Where the person asked, when it was a post in a channel (a chat, `flockctl post`): the
    /// chain's answer, stop notice or failure goes there, as a reply to that post. `None`: a
    /// direct message (`flockctl send`), answered in the person's DM with the agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<ReplyPlace>,
}

/// A person's post that started a chain: its channel and seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyPlace {
    pub channel: String,
    pub seq: u64,
}

/// The routing record of one message: who waits for the answer of the turn it starts, and
/// where it sits in its chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// Who waits for answers, outermost first; the last one gets this turn's final answer
    /// (`human:NAME`, or an agent that delegated). Empty: nobody waits.
    #[serde(default)]
    pub answer_path: Vec<String>,
    /// The message is a delegated agent's final answer (a `Result` input).
    #[serde(default)]
    pub result: bool,
    pub chain: ChainTag,
    /// 1 for the outside input, +1 per delivery after it.
    pub hop: u32,
    /// The message whose turn sent this one.
    #[serde(default, with = "opt_hex_id")]
    pub parent: Option<MsgId>,
    /// The model tokens the chain had used when this message left for another host (0 on one
    /// host): the receiving host counts on from there, so one chain keeps one token budget
    /// wherever its hops run.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens: u64,
    /// The tokens the chain had used on each host, as far as the sending host knew (its own
    /// count included): a grow-only count per host, merged by taking each host's highest, so
    /// branches of one chain that ran on several hosts at once add up instead of each counting
    /// from the fork (empty on one host).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub by_host: BTreeMap<String, u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Route {
    /// A message that starts its own chain.
    pub fn root(
        id: MsgId,
        origin: &str,
        entry: &str,
        text: &str,
        now_ms: u64,
        answer_to: Option<String>,
    ) -> Route {
        Route {
            answer_path: answer_to.into_iter().collect(),
            result: false,
            chain: ChainTag {
                id,
                origin: origin.to_owned(),
                entry: entry.to_owned(),
                text: clip(text, 80),
                started_ms: now_ms,
                reply: None,
            },
            hop: 1,
            parent: None,
            tokens: 0,
            by_host: BTreeMap::new(),
        }
    }

    /// Who gets this turn's final answer.
    pub fn answer_to(&self) -> Option<&str> {
        self.answer_path.last().map(String::as_str)
    }

    /// Whether this turn's answer goes to a person (not to an agent that delegated).
    pub fn answers_a_person(&self) -> bool {
        self.answer_to().is_some_and(|to| to.starts_with("human:"))
    }

    /// The channel whose conversation this message belongs to: where the person asked, for
    /// every turn that works towards their answer (the session it runs in). `None` for a DM,
    /// and for what runs beside the answer (an observer's summary, upkeep).
    pub fn conversation(&self) -> Option<&str> {
        if self.answer_path.is_empty() && !self.result {
            return None;
        }
        self.chain.reply.as_ref().map(|r| r.channel.as_str())
    }

    /// The stored form; `""` for a root that nobody waits on (the common case of an agent's send
    /// outside any turn), which [`Route::load`] rebuilds from the message itself.
    pub fn store(&self, id: MsgId) -> String {
        let plain_root = self.chain.id == id
            && self.hop == 1
            && self.answer_path.is_empty()
            && !self.result
            && self.parent.is_none()
            && self.tokens == 0
            && self.by_host.is_empty();
        if plain_root { String::new() } else { serde_json::to_string(self).unwrap_or_default() }
    }

    /// The route of a stored message (see [`Route::store`]); a record this version cannot read
    /// makes the message a root of its own.
    pub fn load(stored: &str, id: MsgId, sender: &str, target: &str, text: &str, at: u64) -> Route {
        let root = || Route::root(id, sender, target, text, at, None);
        if stored.is_empty() {
            return root();
        }
        serde_json::from_str(stored).unwrap_or_else(|_| root())
    }
}

/// Why a chain was stopped.
pub fn describe_stop(kind: StopKind, budget: &BudgetSpec) -> String {
    match kind {
        StopKind::Hops => format!("its hop budget of {} was used up", budget.max_hops),
        StopKind::Tokens => format!("its budget of {} model tokens was used up", budget.max_tokens),
        StopKind::Wall => format!("it ran past its {} s time budget", budget.max_wall_secs),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopKind {
    Hops,
    Tokens,
    Wall,
}

/// One live chain.
#[derive(Debug, Clone)]
pub struct Chain {
    pub tag: ChainTag,
    pub hops: u32,
    pub tokens: u64,
    /// Deliveries queued or in progress, plus answers being posted: the chain ends at 0.
    pub live: u32,
    /// Set once the chain is stopped (the reason).
    pub stopped: Option<String>,
    /// The person got their answer (or the stop notice): nothing more is posted to them.
    pub answered: bool,
    /// What happened, shortest form ("coordinator → worker (delegated)"), for the stop notice.
    pub trail: Vec<String>,
    /// `flockctl send --wait` connections: (connection, request frame id).
    pub watchers: Vec<(u64, MsgId)>,
    /// The tokens other hosts reported this chain used there (included in `tokens`; the rest
    /// of `tokens` was used here).
    pub elsewhere: BTreeMap<String, u64>,
}

/// Trail entries kept per chain (the notice shows the last ones).
const TRAIL: usize = 16;

impl Chain {
    pub fn new(tag: ChainTag) -> Chain {
        Chain {
            tag,
            hops: 0,
            tokens: 0,
            live: 0,
            stopped: None,
            answered: false,
            trail: Vec::new(),
            watchers: Vec::new(),
            elsewhere: BTreeMap::new(),
        }
    }

    pub fn note(&mut self, step: String) {
        if self.trail.len() == TRAIL {
            self.trail.remove(0);
        }
        self.trail.push(step);
    }

    /// Which budget, if any, forbids the chain another hop at `now_ms`.
    pub fn refuses_next_hop(&self, budget: &BudgetSpec, now_ms: u64) -> Option<StopKind> {
        if self.hops >= budget.max_hops {
            Some(StopKind::Hops)
        } else if self.tokens > budget.max_tokens {
            Some(StopKind::Tokens)
        } else if now_ms.saturating_sub(self.tag.started_ms) > budget.max_wall_secs * 1000 {
            Some(StopKind::Wall)
        } else {
            None
        }
    }

    pub fn row(&self, budget: &BudgetSpec, now_ms: u64) -> ChainRow {
        let state = match (&self.stopped, self.answered) {
            (Some(r), _) => format!("stopped: {r}"),
            (None, true) => "answered".into(),
            (None, false) => "running".into(),
        };
        ChainRow {
            id: self.tag.id,
            origin: self.tag.origin.clone(),
            entry: self.tag.entry.clone(),
            text: self.tag.text.clone(),
            state,
            hops: self.hops,
            max_hops: budget.max_hops,
            tokens: self.tokens,
            max_tokens: budget.max_tokens,
            age_ms: now_ms.saturating_sub(self.tag.started_ms),
            max_wall_ms: budget.max_wall_secs * 1000,
            live: self.live,
        }
    }

    /// What the person is told when the chain is stopped.
    pub fn stop_notice(&self, reason: &str) -> String {
        let trail = if self.trail.is_empty() { "nothing".into() } else { self.trail.join("; ") };
        format!(
            "[stopped] I stopped working on \"{}\": {reason}, after {} hops and {} model tokens. \
             What was done: {trail}. Nothing else will be sent for this request; ask again, more \
             specifically, or raise `budget:` in the swarm file.",
            self.tag.text, self.hops, self.tokens
        )
    }
}

/// Every live chain, by id.
#[derive(Debug, Default)]
pub struct Chains {
    pub map: HashMap<MsgId, Chain>,
    /// Chains stopped by a budget since the supervisor started.
    pub stopped_total: u64,
    /// Chains that ended lately (nothing of them was queued or running), with what they had
    /// spent: a chain can come back — a channel post's delta is handed out after a coalescing
    /// delay, when the turn that posted it is long over — and then goes on where it was (its
    /// tokens, its story: the root is not journaled again). The newest [`ENDED_KEPT`].
    ended: HashMap<MsgId, Ended>,
    ended_order: std::collections::VecDeque<MsgId>,
}

/// What an ended chain had spent, and how it ended.
#[derive(Debug, Clone)]
struct Ended {
    hops: u32,
    tokens: u64,
    elsewhere: BTreeMap<String, u64>,
    answered: bool,
    stopped: Option<String>,
}

/// How many ended chains [`Chains`] remembers.
pub const ENDED_KEPT: usize = 4096;

impl Chains {
    /// The chain of `tag`, created (with `hop - 1` hops already spent) if the router does not
    /// know it: the first message of a chain, or a chain resumed after a restart.
    pub fn entry(&mut self, tag: &ChainTag, hop: u32) -> &mut Chain {
        let chain = self.map.entry(tag.id).or_insert_with(|| Chain::new(tag.clone()));
        chain.hops = chain.hops.max(hop.saturating_sub(1));
        chain
    }

    /// Brings back chain `tag` if it ended lately (with what it had spent and how it ended);
    /// whether it did.
    pub fn revive(&mut self, tag: &ChainTag) -> bool {
        let Some(e) = self.ended.remove(&tag.id) else { return false };
        self.ended_order.retain(|id| *id != tag.id);
        let c = self.map.entry(tag.id).or_insert_with(|| Chain::new(tag.clone()));
        c.hops = c.hops.max(e.hops);
        if e.tokens > c.tokens {
            c.tokens = e.tokens;
            c.elsewhere = e.elsewhere;
        }
        c.answered |= e.answered;
        if c.stopped.is_none() {
            c.stopped = e.stopped;
        }
        true
    }

    /// Chain `id` has nothing queued or running: it leaves the live set (remembered a while).
    pub fn end(&mut self, id: MsgId) -> Option<Chain> {
        let c = self.map.remove(&id)?;
        let ended = Ended {
            hops: c.hops,
            tokens: c.tokens,
            elsewhere: c.elsewhere.clone(),
            answered: c.answered,
            stopped: c.stopped.clone(),
        };
        if self.ended.insert(id, ended).is_none() {
            self.ended_order.push_back(id);
        }
        while self.ended_order.len() > ENDED_KEPT {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
        Some(c)
    }
}

/// The journal's correlation id of a chain.
pub fn corr(id: MsgId) -> String {
    fmt_id(id)
}

pub(crate) mod hex_id {
    use flock_ipc::MsgId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &MsgId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&flock_ipc::id::fmt_id(*id))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<MsgId, D::Error> {
        let s = String::deserialize(d)?;
        flock_ipc::id::parse_id(&s).ok_or_else(|| serde::de::Error::custom("not a message id"))
    }
}

mod opt_hex_id {
    use flock_ipc::MsgId;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(id: &Option<MsgId>, s: S) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => s.serialize_some(&flock_ipc::id::fmt_id(*id)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<MsgId>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| {
            flock_ipc::id::parse_id(&s).ok_or_else(|| serde::de::Error::custom("not a message id"))
        })
        .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_root_is_stored_as_nothing_and_everything_else_round_trips() {
        let root = Route::root(7, "w1", "w2", "hi", 1000, None);
        assert_eq!(root.store(7), "");
        assert_eq!(Route::load("", 7, "w1", "w2", "hi", 1000), root);
        let mut r =
            Route::root(7, "operator", "coordinator", "plan", 1000, Some("human:op".into()));
        r.hop = 3;
        r.parent = Some(9);
        r.answer_path.push("coordinator".into());
        let stored = r.store(11);
        assert_eq!(Route::load(&stored, 11, "x", "y", "z", 0), r);
        assert_eq!(r.answer_to(), Some("coordinator"));
    }

    #[test]
    fn budgets_are_checked_in_order_hops_tokens_wall() {
        let b = BudgetSpec { max_hops: 2, max_tokens: 100, max_wall_secs: 10 };
        let mut c = Chain::new(Route::root(1, "a", "b", "t", 0, None).chain);
        c.hops = 1;
        assert_eq!(c.refuses_next_hop(&b, 5_000), None);
        c.tokens = 101;
        assert_eq!(c.refuses_next_hop(&b, 5_000), Some(StopKind::Tokens));
        c.hops = 2;
        assert_eq!(c.refuses_next_hop(&b, 5_000), Some(StopKind::Hops), "the third of 2 hops");
        c.hops = 1;
        c.tokens = 0;
        assert_eq!(c.refuses_next_hop(&b, 10_001), Some(StopKind::Wall));
    }

    #[test]
    fn a_chain_that_ended_comes_back_with_what_it_spent_and_how_it_ended() {
        let mut chains = Chains::default();
        let tag = Route::root(1, "a", "b", "t", 0, None).chain;
        let c = chains.entry(&tag, 3);
        c.tokens = 500;
        c.answered = true;
        assert!(chains.end(1).is_some());
        assert!(chains.map.is_empty());
        assert!(chains.revive(&tag), "it ended lately");
        let c = &chains.map[&1];
        assert_eq!((c.hops, c.tokens, c.answered), (2, 500, true));
        assert!(!chains.revive(&tag), "revived once");
        // Only the newest are remembered.
        for id in 10..(10 + ENDED_KEPT as u128 + 1) {
            chains.entry(&Route::root(id, "a", "b", "t", 0, None).chain, 1);
            chains.end(id);
        }
        assert!(!chains.revive(&Route::root(10, "a", "b", "t", 0, None).chain));
        assert!(chains.revive(&Route::root(11, "a", "b", "t", 0, None).chain));
    }

    #[test]
    fn a_resumed_chain_keeps_the_hops_its_messages_carry() {
        let mut chains = Chains::default();
        let tag = Route::root(1, "a", "b", "t", 0, None).chain;
        assert_eq!(chains.entry(&tag, 5).hops, 4);
        assert_eq!(chains.entry(&tag, 2).hops, 4, "never lowered");
    }
}
