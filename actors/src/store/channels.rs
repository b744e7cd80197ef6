//! Channel tables in SQLite (their migrations are in `schema.rs`). These run inside the store actor (see
//! `StoreMsg::With`), which stays the only writer; each mutating call is one transaction, and a
//! post's seq is assigned in the same transaction as its insert.

use flock_ipc::MsgId;
use rusqlite::{OptionalExtension, params};

use crate::chains::{ReplyPlace, Route};
use crate::channels::delta::Msg;
use crate::store::{Store, StoreError, now_ms};

/// A person's post handed to the agent that answers it: the durable message stored in the
/// post's own transaction (so the request and the post exist together or not at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub agent: String,
    /// The person's words (the post's text).
    pub text: String,
    /// The message's id (and its chain's).
    pub id: MsgId,
    /// Its route; the post's seq is filled in when it is known (`chain.reply`).
    pub route: Route,
}

/// What a post carries beyond its author and text.
#[derive(Debug, Clone, Default)]
pub struct PostExtra {
    /// The seq of the post it answers, in the same channel.
    pub reply_to: Option<u64>,
    /// A person's post that starts a chain: the message to the agent that answers.
    pub ask: Option<Ask>,
    /// A chain's answer: the input (message id, its agent) whose turn gave it, completed in the
    /// post's transaction — also when the answer was posted before (a replayed turn).
    pub completes: Option<(MsgId, String)>,
}

/// A channel's row plus its members.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRow {
    pub id: String,
    pub name: String,
    pub topic: String,
    pub created_by: String,
    pub created_at: i64,
    pub state: ChannelState,
    pub last_seq: u64,
    pub is_dm: bool,
    pub members: Vec<String>,
    pub archiving_started_at: Option<i64>,
    pub archive_deadline_at: Option<i64>,
    /// Agents that called `flock_archive_ready` during the current archiving.
    pub ready: Vec<String>,
}

impl ChannelRow {
    /// A new, active, empty channel created now by `created_by`.
    pub fn new(
        id: &str,
        name: &str,
        topic: &str,
        created_by: &str,
        is_dm: bool,
        members: Vec<String>,
    ) -> ChannelRow {
        ChannelRow {
            id: id.to_owned(),
            name: name.to_owned(),
            topic: topic.to_owned(),
            created_by: created_by.to_owned(),
            created_at: now_ms(),
            state: ChannelState::Active,
            last_seq: 0,
            is_dm,
            members,
            archiving_started_at: None,
            archive_deadline_at: None,
            ready: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelState {
    Active,
    Archiving,
    Archived,
}

impl ChannelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelState::Active => "active",
            ChannelState::Archiving => "archiving",
            ChannelState::Archived => "archived",
        }
    }
    fn parse(s: &str) -> Self {
        match s {
            "archiving" => ChannelState::Archiving,
            "archived" => ChannelState::Archived,
            _ => ChannelState::Active,
        }
    }
}

/// What makes a post unique (a unique index each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UniqueKey {
    /// The chain a person's answer belongs to (one answer per chain).
    Answers(Vec<u8>),
    /// A platform message a bridge brought in (`<bridge>/<chat>/<message id>`).
    Origin(String),
}

/// A per-(agent, channel) delta cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cursor {
    pub sent_seq: u64,
    pub scheduled_seq: u64,
}

/// An A2A card.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Card {
    pub agent: String,
    pub description: String,
    pub skills: Vec<String>,
    pub tags: Vec<String>,
}

impl Store {
    pub fn create_channel(&mut self, row: &ChannelRow) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "INSERT INTO channels (id, name, topic, created_by, created_at, is_dm) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![row.id, row.name, row.topic, row.created_by, row.created_at, row.is_dm],
        )?;
        for m in &row.members {
            tx.execute(
                "INSERT OR IGNORE INTO channel_members (channel, member, added_at) VALUES (?1, ?2, ?3)",
                params![row.id, m, row.created_at],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Appends a message; its seq is `last_seq + 1`, assigned in the same transaction.
    pub fn post_message(
        &mut self,
        channel: &str,
        author: &str,
        text: &str,
    ) -> Result<u64, StoreError> {
        Ok(self.post_answer(channel, author, text, None)?.0)
    }

    /// Posts like [`Store::post_message`]; with `answers` (a chain id) at most once per chain:
    /// a second answer to the same chain is not posted, and the first one's seq comes back with
    /// `true` (a duplicate).
    pub fn post_answer(
        &mut self,
        channel: &str,
        author: &str,
        text: &str,
        answers: Option<flock_ipc::MsgId>,
    ) -> Result<(u64, bool), StoreError> {
        let key = answers.map(|id| UniqueKey::Answers(id.to_be_bytes().to_vec()));
        let (seq, duplicate, _) =
            self.post_unique(channel, author, text, key, PostExtra::default())?;
        Ok((seq, duplicate))
    }

    /// Appends a post whose `key` (if any) is unique: a post with the same key already there is
    /// not posted again, and its seq comes back with `true`. Seq and insert share a transaction,
    /// and so does `extra.ask`'s message, which comes back with its route's place filled in
    /// (`None` for a duplicate: the first post's message was stored with it).
    pub(crate) fn post_unique(
        &mut self,
        channel: &str,
        author: &str,
        text: &str,
        key: Option<UniqueKey>,
        extra: PostExtra,
    ) -> Result<(u64, bool, Option<Ask>), StoreError> {
        let (answers, origin) = match key {
            Some(UniqueKey::Answers(k)) => (Some(k), None),
            Some(UniqueKey::Origin(o)) => (None, Some(o)),
            None => (None, None),
        };
        let tx = self.conn.transaction()?;
        if answers.is_some() || origin.is_some() {
            let earlier: Option<i64> = tx
                .query_row(
                    "SELECT seq FROM channel_messages WHERE answers = ?1 OR origin = ?2",
                    params![answers, origin],
                    |r| r.get(0),
                )
                .optional()?;
            if let Some(seq) = earlier {
                if let Some((id, agent)) = &extra.completes {
                    crate::store::complete_message(&tx, *id, agent, now_ms())?;
                    tx.commit()?;
                }
                return Ok((seq as u64, true, None));
            }
        }
        let seq: i64 = tx.query_row(
            "UPDATE channels SET last_seq = last_seq + 1 WHERE id = ?1 RETURNING last_seq",
            params![channel],
            |r| r.get(0),
        )?;
        let now = now_ms();
        let mut ask = extra.ask;
        tx.execute(
            "INSERT INTO channel_messages
                 (channel, seq, author, text, created_at, answers, origin, reply_to, addressed_to)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            params![
                channel,
                seq,
                author,
                text,
                now,
                answers,
                origin,
                extra.reply_to.map(|s| s as i64),
                ask.as_ref().map(|a| a.agent.as_str())
            ],
        )?;
        if let Some(a) = &mut ask {
            a.route.chain.reply = Some(ReplyPlace { channel: channel.to_owned(), seq: seq as u64 });
            tx.execute(
                crate::store::INSERT_MESSAGE,
                params![a.id.to_be_bytes(), author, a.agent, text, now, a.route.store(a.id)],
            )?;
        }
        if let Some((id, agent)) = &extra.completes {
            crate::store::complete_message(&tx, *id, agent, now)?;
        }
        tx.commit()?;
        Ok((seq as u64, false, ask))
    }

    /// Messages with `after < seq <= upto`, ascending; at most `limit`, the newest ones.
    pub fn messages_between(
        &self,
        channel: &str,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> Result<Vec<Msg>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, author, text FROM channel_posts
             WHERE channel = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq DESC LIMIT ?4",
        )?;
        let rows = stmt
            .query_map(params![channel, after as i64, upto as i64, limit as i64], |r| {
                Ok(Msg { seq: r.get::<_, i64>(0)? as u64, author: r.get(1)?, text: r.get(2)? })
            })?;
        let mut out: Vec<Msg> = rows.collect::<Result<_, _>>()?;
        out.reverse();
        Ok(out)
    }

    /// What is new to `reader` in `after < seq <= upto`, leaving out its own messages: how many,
    /// the first seq, and the newest `limit` of them (ascending).
    pub fn new_for(
        &self,
        channel: &str,
        reader: &str,
        after: u64,
        upto: u64,
        limit: usize,
    ) -> Result<(usize, u64, Vec<Msg>), StoreError> {
        let (count, first): (i64, Option<i64>) = self.conn.query_row(
            "SELECT COUNT(*), MIN(seq) FROM channel_messages
             WHERE channel = ?1 AND seq > ?2 AND seq <= ?3 AND author != ?4
               AND addressed_to IS NOT ?4",
            params![channel, after as i64, upto as i64, reader],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, author, text FROM channel_posts
             WHERE channel = ?1 AND seq > ?2 AND seq <= ?3 AND author != ?4
               AND addressed_to IS NOT ?4
             ORDER BY seq DESC LIMIT ?5",
        )?;
        let rows = stmt
            .query_map(params![channel, after as i64, upto as i64, reader, limit as i64], |r| {
                Ok(Msg { seq: r.get::<_, i64>(0)? as u64, author: r.get(1)?, text: r.get(2)? })
            })?;
        let mut newest: Vec<Msg> = rows.collect::<Result<_, _>>()?;
        newest.reverse();
        Ok((count as usize, first.unwrap_or(0) as u64, newest))
    }

    /// Messages after `after`, ascending, at most `limit` (the first page after the cursor).
    pub fn messages_after(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<Msg>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, author, text FROM channel_posts
             WHERE channel = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![channel, after as i64, limit as i64], |r| {
            Ok(Msg { seq: r.get::<_, i64>(0)? as u64, author: r.get(1)?, text: r.get(2)? })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn channels(&self) -> Result<Vec<ChannelRow>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, name, topic, created_by, created_at, state, last_seq, is_dm,
                    archiving_started_at, archive_deadline_at FROM channels ORDER BY created_at, id",
        )?;
        let mut rows: Vec<ChannelRow> = stmt
            .query_map([], |r| {
                Ok(ChannelRow {
                    id: r.get(0)?,
                    name: r.get(1)?,
                    topic: r.get(2)?,
                    created_by: r.get(3)?,
                    created_at: r.get(4)?,
                    state: ChannelState::parse(&r.get::<_, String>(5)?),
                    last_seq: r.get::<_, i64>(6)? as u64,
                    is_dm: r.get(7)?,
                    archiving_started_at: r.get(8)?,
                    archive_deadline_at: r.get(9)?,
                    members: Vec::new(),
                    ready: Vec::new(),
                })
            })?
            .collect::<Result<_, _>>()?;
        let mut members = self.conn.prepare(
            "SELECT member FROM channel_members WHERE channel = ?1 ORDER BY added_at, member",
        )?;
        let mut ready =
            self.conn.prepare("SELECT agent FROM archive_ready WHERE channel = ?1 ORDER BY at")?;
        for row in &mut rows {
            row.members =
                members.query_map(params![row.id], |r| r.get(0))?.collect::<Result<_, _>>()?;
            row.ready =
                ready.query_map(params![row.id], |r| r.get(0))?.collect::<Result<_, _>>()?;
        }
        Ok(rows)
    }

    pub fn change_members(
        &mut self,
        channel: &str,
        add: &[String],
        remove: &[String],
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        let now = now_ms();
        for m in add {
            tx.execute(
                "INSERT OR IGNORE INTO channel_members (channel, member, added_at) VALUES (?1, ?2, ?3)",
                params![channel, m, now],
            )?;
        }
        for m in remove {
            tx.execute(
                "DELETE FROM channel_members WHERE channel = ?1 AND member = ?2",
                params![channel, m],
            )?;
            tx.execute(
                "DELETE FROM archive_ready WHERE channel = ?1 AND agent = ?2",
                params![channel, m],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    pub fn set_channel_state(
        &mut self,
        channel: &str,
        state: ChannelState,
        started_at: Option<i64>,
        deadline_at: Option<i64>,
    ) -> Result<(), StoreError> {
        let archived_at = (state == ChannelState::Archived).then(now_ms);
        self.conn.execute(
            "UPDATE channels SET state = ?2, archiving_started_at = ?3, archive_deadline_at = ?4,
                    archived_at = COALESCE(?5, archived_at) WHERE id = ?1",
            params![channel, state.as_str(), started_at, deadline_at, archived_at],
        )?;
        Ok(())
    }

    pub fn mark_archive_ready(&mut self, channel: &str, agent: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT OR IGNORE INTO archive_ready (channel, agent, at) VALUES (?1, ?2, ?3)",
            params![channel, agent, now_ms()],
        )?;
        Ok(())
    }

    pub fn cursors(&self) -> Result<Vec<(String, String, Cursor)>, StoreError> {
        let mut stmt =
            self.conn.prepare("SELECT agent, channel, sent_seq, scheduled_seq FROM cursors")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                Cursor {
                    sent_seq: r.get::<_, i64>(2)? as u64,
                    scheduled_seq: r.get::<_, i64>(3)? as u64,
                },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn set_cursor(&mut self, agent: &str, channel: &str, c: Cursor) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO cursors (agent, channel, sent_seq, scheduled_seq) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (agent, channel) DO UPDATE SET sent_seq = ?3, scheduled_seq = ?4",
            params![agent, channel, c.sent_seq as i64, c.scheduled_seq as i64],
        )?;
        Ok(())
    }

    /// Several cursors in one transaction.
    pub fn set_cursors(&mut self, cursors: &[(String, String, Cursor)]) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO cursors (agent, channel, sent_seq, scheduled_seq) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (agent, channel) DO UPDATE SET sent_seq = ?3, scheduled_seq = ?4",
            )?;
            for (agent, channel, c) in cursors {
                stmt.execute(params![agent, channel, c.sent_seq as i64, c.scheduled_seq as i64])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn agent_states(&self) -> Result<Vec<(String, String)>, StoreError> {
        let mut stmt = self.conn.prepare("SELECT agent, state FROM agent_states")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn set_agent_state(&mut self, agent: &str, state: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO agent_states (agent, state) VALUES (?1, ?2)
             ON CONFLICT (agent) DO UPDATE SET state = ?2",
            params![agent, state],
        )?;
        Ok(())
    }

    pub fn cards(&self) -> Result<Vec<Card>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT agent, description, skills, tags FROM cards ORDER BY agent")?;
        let rows = stmt.query_map([], |r| {
            let skills: String = r.get(2)?;
            let tags: String = r.get(3)?;
            Ok(Card {
                agent: r.get(0)?,
                description: r.get(1)?,
                skills: serde_json::from_str(&skills).unwrap_or_default(),
                tags: serde_json::from_str(&tags).unwrap_or_default(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn put_card(&mut self, card: &Card) -> Result<(), StoreError> {
        let skills = serde_json::to_string(&card.skills).unwrap_or_else(|_| "[]".into());
        let tags = serde_json::to_string(&card.tags).unwrap_or_else(|_| "[]".into());
        self.conn.execute(
            "INSERT INTO cards (agent, description, skills, tags, updated_at) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (agent) DO UPDATE SET description = ?2, skills = ?3, tags = ?4, updated_at = ?5",
            params![card.agent, card.description, skills, tags, now_ms()],
        )?;
        Ok(())
    }

    /// Records an agent created at run time.
    pub fn register_agent(
        &mut self,
        name: &str,
        spec_json: &str,
        created_by: &str,
    ) -> Result<(), StoreError> {
        self.conn.execute(
            "INSERT INTO agents_registry (name, spec_json, created_by, created_at) VALUES (?1, ?2, ?3, ?4)",
            params![name, spec_json, created_by, now_ms()],
        )?;
        Ok(())
    }

    /// Decommissions an agent: it is not started again, and what only a running agent needs
    /// goes (memberships, delta cursors, state, card, archive votes). Its history stays (its
    /// messages, sessions and journal entries). A named agent stays in the registry, marked, so
    /// its name is not given out again; an instance (`name@key`) leaves no row: a key may be
    /// spawned again, and a swarm that spawns a worker per conversation must not grow a row per
    /// conversation.
    pub fn decommission_agent(&mut self, name: &str) -> Result<(), StoreError> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        if name.contains('@') {
            tx.execute("DELETE FROM agents_registry WHERE name = ?1", params![name])?;
        } else {
            tx.execute(
                "INSERT INTO agents_registry (name, created_at, decommissioned_at) VALUES (?1, ?2, ?2)
                 ON CONFLICT (name) DO UPDATE SET decommissioned_at = ?2",
                params![name, now],
            )?;
        }
        tx.execute("DELETE FROM channel_members WHERE member = ?1", params![name])?;
        for table in ["cursors", "agent_states", "cards", "archive_ready"] {
            tx.execute(&format!("DELETE FROM {table} WHERE agent = ?1"), params![name])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Whether `name` was decommissioned.
    pub fn is_decommissioned(&self, name: &str) -> Result<bool, StoreError> {
        let found: Option<i64> = self
            .conn
            .query_row(
                "SELECT 1 FROM agents_registry WHERE name = ?1 AND decommissioned_at IS NOT NULL",
                params![name],
                |r| r.get(0),
            )
            .optional()?;
        Ok(found.is_some())
    }

    /// Agents created at run time and still in service: their specs as JSON.
    pub fn created_agents(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT spec_json FROM agents_registry
             WHERE spec_json IS NOT NULL AND decommissioned_at IS NULL ORDER BY created_at",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Agents created at run time and still in service, read back, and how many of them have
    /// a spec this build cannot read (skipped).
    pub fn created_agent_specs(&self) -> Result<(Vec<flock_config::AgentSpec>, usize), StoreError> {
        let stored = self.created_agents()?;
        let specs: Vec<flock_config::AgentSpec> =
            stored.iter().filter_map(|json| serde_json::from_str(json).ok()).collect();
        let unreadable = stored.len() - specs.len();
        Ok((specs, unreadable))
    }

    /// Names of decommissioned agents.
    pub fn decommissioned_agents(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT name FROM agents_registry WHERE decommissioned_at IS NOT NULL")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Appends messages (JSON texts) to a session.
    pub fn append_session(
        &mut self,
        agent: &str,
        channel: &str,
        messages: &[String],
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        let next: i64 = tx.query_row(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM session_messages WHERE agent = ?1 AND channel = ?2",
            params![agent, channel],
            |r| r.get(0),
        )?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO session_messages (agent, channel, seq, message, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let now = now_ms();
            for (i, m) in messages.iter().enumerate() {
                stmt.execute(params![agent, channel, next + i as i64, m, now])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The newest messages of a session, oldest first: at most `limit` of them and `max_bytes`
    /// in all (what is sent back must fit in one frame, whatever sequence of valid messages
    /// made the session); empty for a closed session.
    pub fn load_session(
        &self,
        agent: &str,
        channel: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<String>, StoreError> {
        let closed: Option<i64> = self
            .conn
            .query_row(
                "SELECT closed_at FROM sessions_closed WHERE agent = ?1 AND channel = ?2",
                params![agent, channel],
                |r| r.get(0),
            )
            .optional()?;
        if closed.is_some() {
            return Ok(Vec::new());
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT message FROM session_messages WHERE agent = ?1 AND channel = ?2 ORDER BY seq DESC LIMIT ?3",
        )?;
        let mut out: Vec<String> = Vec::new();
        let mut used = 0usize;
        for m in stmt.query_map(params![agent, channel, limit as i64], |r| r.get::<_, String>(0))? {
            let m = m?;
            used += m.len() + 1;
            if used > max_bytes {
                break;
            }
            out.push(m);
        }
        out.reverse();
        Ok(out)
    }

    /// An agent's sessions: (channel, messages, closed).
    pub fn sessions_of(&self, agent: &str) -> Result<Vec<(String, u64, bool)>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT m.channel, COUNT(*), c.closed_at IS NOT NULL FROM session_messages m
             LEFT JOIN sessions_closed c ON c.agent = m.agent AND c.channel = m.channel
             WHERE m.agent = ?1 GROUP BY m.channel ORDER BY m.channel",
        )?;
        let rows = stmt.query_map(params![agent], |r| {
            Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get(2)?))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Closes the sessions of a channel (it was archived): they are kept but not resumed.
    pub fn close_sessions(&mut self, channel: &str, agents: &[String]) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        for a in agents {
            tx.execute(
                "INSERT OR IGNORE INTO sessions_closed (agent, channel, closed_at) VALUES (?1, ?2, ?3)",
                params![a, channel, now_ms()],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// The state of one channel, if it exists (for checks that must see committed state).
    pub fn channel_state(&self, channel: &str) -> Result<Option<ChannelState>, StoreError> {
        let s: Option<String> = self
            .conn
            .query_row("SELECT state FROM channels WHERE id = ?1", params![channel], |r| r.get(0))
            .optional()?;
        Ok(s.map(|s| ChannelState::parse(&s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Durability;

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("f.db"), Durability::Normal).unwrap();
        (dir, s)
    }

    fn row(id: &str, members: &[&str]) -> ChannelRow {
        ChannelRow {
            id: id.into(),
            name: id.into(),
            topic: "t".into(),
            created_by: "orchestrator".into(),
            created_at: now_ms(),
            state: ChannelState::Active,
            last_seq: 0,
            is_dm: false,
            members: members.iter().map(|m| m.to_string()).collect(),
            archiving_started_at: None,
            archive_deadline_at: None,
            ready: Vec::new(),
        }
    }

    #[test]
    fn seq_is_assigned_in_the_insert_transaction_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.db");
        {
            let mut s = Store::open(&path, Durability::Normal).unwrap();
            s.create_channel(&row("c", &["a", "b"])).unwrap();
            for i in 1..=3 {
                assert_eq!(s.post_message("c", "a", &format!("m{i}")).unwrap(), i);
            }
        }
        let s = Store::open(&path, Durability::Normal).unwrap();
        let ch = &s.channels().unwrap()[0];
        assert_eq!((ch.last_seq, ch.members.clone()), (3, vec!["a".to_string(), "b".to_string()]));
        let m = s.messages_between("c", 1, 3, 20).unwrap();
        assert_eq!(m.iter().map(|m| m.seq).collect::<Vec<_>>(), [2, 3]);
    }

    #[test]
    fn a_chain_answer_completes_the_input_that_gave_it_in_its_transaction_even_when_repeated() {
        use crate::store::{NewMessage, WriteOp};
        let (_d, mut s) = store();
        s.create_channel(&row("dm", &["coordinator", "human:operator"])).unwrap();
        let input = |id: MsgId| NewMessage {
            id,
            sender: "operator".into(),
            target: "coordinator".into(),
            text: "q".into(),
            route: String::new(),
        };
        s.apply(&[WriteOp::Enqueue(input(7)), WriteOp::Enqueue(input(8))]).unwrap();
        let answer = |msg: MsgId| {
            let key = Some(UniqueKey::Answers(42u64.to_be_bytes().to_vec()));
            let extra =
                PostExtra { completes: Some((msg, "coordinator".into())), ..Default::default() };
            (key, extra)
        };
        let (key, extra) = answer(7);
        let (seq, duplicate, _) = s.post_unique("dm", "coordinator", "4", key, extra).unwrap();
        assert_eq!((seq, duplicate), (1, false));
        let pending: Vec<MsgId> = s.pending().unwrap().iter().map(|m| m.id).collect();
        assert_eq!(pending, [8], "the answered input is done with the post");
        assert_eq!(s.turns_totals().unwrap()["coordinator"], 1);

        // A replayed turn answers again: not posted twice, and its input is completed too.
        let (key, extra) = answer(8);
        let (seq, duplicate, _) = s.post_unique("dm", "coordinator", "4", key, extra).unwrap();
        assert_eq!((seq, duplicate), (1, true));
        assert!(s.pending().unwrap().is_empty());
        assert_eq!(s.turns_totals().unwrap()["coordinator"], 2);
        assert_eq!(s.messages_after("dm", 0, 10).unwrap().len(), 1);

        // A post that fails (no such channel) completes nothing.
        s.apply(&[WriteOp::Enqueue(input(9))]).unwrap();
        let (key, extra) = answer(9);
        let key = key.map(|_| UniqueKey::Answers(43u64.to_be_bytes().to_vec()));
        assert!(s.post_unique("gone", "coordinator", "4", key, extra).is_err());
        assert_eq!(s.pending().unwrap().len(), 1);
    }

    #[test]
    fn posting_to_an_unknown_channel_fails() {
        let (_d, mut s) = store();
        assert!(s.post_message("nope", "a", "x").is_err());
    }

    #[test]
    fn the_newest_page_of_a_long_channel_is_reachable() {
        let (_d, mut s) = store();
        s.create_channel(&row("big", &["a"])).unwrap();
        for i in 0..5000 {
            s.post_message("big", "a", &format!("m{i}")).unwrap();
        }
        let newest = s.messages_between("big", 0, 5000, 50).unwrap();
        assert_eq!((newest[0].seq, newest[49].seq), (4951, 5000));
        let page = s.messages_after("big", 4990, 50).unwrap();
        assert_eq!(page.len(), 10);
    }

    #[test]
    fn members_cursors_states_and_cards_persist() {
        let (_d, mut s) = store();
        s.create_channel(&row("c", &["a"])).unwrap();
        s.change_members("c", &["b".into()], &["a".into()]).unwrap();
        assert_eq!(s.channels().unwrap()[0].members, ["b"]);
        s.set_cursor("b", "c", Cursor { sent_seq: 2, scheduled_seq: 5 }).unwrap();
        assert_eq!(s.cursors().unwrap()[0].2, Cursor { sent_seq: 2, scheduled_seq: 5 });
        s.set_agent_state("b", "SLEEP").unwrap();
        assert_eq!(s.agent_states().unwrap(), [("b".to_string(), "SLEEP".to_string())]);
        let card = Card {
            agent: "b".into(),
            description: "d".into(),
            skills: vec!["rust".into()],
            tags: vec![],
        };
        s.put_card(&card).unwrap();
        assert_eq!(s.cards().unwrap(), [card]);
    }
}
