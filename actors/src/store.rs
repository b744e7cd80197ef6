//! The SQLite store: the only code that opens the database. [`Store`] is the synchronous core
//! (testable on its own); [`crate::store_actor`] wraps it as the single-writer actor with group
//! commit.
//!
//! Durability: WAL with `synchronous=NORMAL`. A committed transaction survives `kill -9` of any
//! process (it is in the WAL, in the OS page cache); a power cut may lose the last commits.
//! `Durability::Full` (fsync per commit) closes that gap at a throughput cost.

use std::collections::HashMap;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use flock_ipc::{DeadLetter, MsgId};
use rusqlite::{Connection, OptionalExtension, params};

pub mod bridges;
pub mod channels;
pub(crate) mod schema;
use schema::MIGRATIONS;

/// A dead letter's text is listed up to this many characters (a listing must fit in a frame
/// however large the messages were).
pub const DEAD_LETTER_PREVIEW_CHARS: u32 = 2000;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(
        "database {path} has schema version {found}, newer than this Flock ({known}); upgrade Flock"
    )]
    TooNew { path: String, found: usize, known: usize },
}

/// How hard a commit tries to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Survives any process crash (the default).
    Normal,
    /// Also survives power loss; one fsync per commit.
    Full,
}

/// A message to put in a durable mailbox.
#[derive(Debug, Clone, PartialEq)]
pub struct NewMessage {
    pub id: MsgId,
    pub sender: String,
    pub target: String,
    pub text: String,
    /// The router's routing record (opaque here; '' for none).
    pub route: String,
}

/// A message waiting in a mailbox, as loaded at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingMessage {
    pub id: MsgId,
    pub sender: String,
    pub target: String,
    pub text: String,
    pub attempts: u32,
    pub route: String,
    /// Unix ms when it was accepted.
    pub enqueued_at: u64,
}

/// One write, applied inside a group-commit transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Insert unless the id is known; the outcome says whether it was new.
    Enqueue(NewMessage),
    /// The turn for this durable message finished: mark it done, count the turn.
    Complete { id: MsgId, agent: String },
    /// `n` more finished turns that are not durable messages (requests, deltas, at_most_once).
    AddTurns { agent: String, n: u64 },
    /// Tokens a model call used for `agent`.
    AddTokens { agent: String, tokens_in: u64, tokens_out: u64 },
    /// A delivery of this message failed; `attempts` is the new total.
    FailedAttempt { id: MsgId, attempts: u32 },
    /// Give up on this message.
    DeadLetter { id: MsgId, attempts: u32, reason: String },
    /// This message will never run (its chain was stopped): done, with a reason, no turn counted.
    Discard { id: MsgId, reason: String },
    /// `agent` here was told channel `channel` (born `born`) up to seq `upto`, by the leader on
    /// another host.
    Told { agent: String, channel: String, born: i64, upto: u64 },
}

/// What a [`WriteOp`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteOutcome {
    /// `Enqueue` inserted a new message.
    Inserted,
    /// `Enqueue` found the id already accepted earlier (a replayed send): nothing changed.
    Duplicate,
    /// Any other op applied.
    Applied,
}

/// Accepts a message unless its id is known (a replayed send is a duplicate, not an error).
pub(crate) const INSERT_MESSAGE: &str =
    "INSERT OR IGNORE INTO messages (id, sender, target, text, enqueued_at, route)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

pub struct Store {
    pub(crate) conn: Connection,
}

/// How far each agent here was told each channel held on another host: (agent, channel) →
/// (the channel's `born`, seq). See [`WriteOp::Told`].
pub type DeltasTold = HashMap<(String, String), (i64, u64)>;

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

/// Marks a pending message done (`?1` its id, `?2` now); changes no row when it was done already.
const COMPLETE_MESSAGE: &str =
    "UPDATE messages SET state = 1, finished_at = ?2 WHERE id = ?1 AND state = 0";
/// Counts a turn of agent `?1`.
const COUNT_TURN: &str = "INSERT INTO agent_stats (name, turns_total) VALUES (?1, 1)
     ON CONFLICT (name) DO UPDATE SET turns_total = turns_total + 1";

/// Completes message `id` of `agent` inside the caller's transaction, counting the turn only the
/// first time (as [`WriteOp::Complete`] does).
pub(crate) fn complete_message(
    conn: &rusqlite::Connection,
    id: MsgId,
    agent: &str,
    now: i64,
) -> rusqlite::Result<()> {
    if conn.prepare_cached(COMPLETE_MESSAGE)?.execute(params![id_bytes(id), now])? == 1 {
        conn.prepare_cached(COUNT_TURN)?.execute(params![agent])?;
    }
    Ok(())
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Runs [`INSERT_MESSAGE`] for `m`: 1 if it was new, 0 if its id was accepted before.
fn insert_message(
    insert: &mut rusqlite::CachedStatement<'_>,
    m: &NewMessage,
    now: i64,
) -> rusqlite::Result<usize> {
    insert.execute(params![id_bytes(m.id), m.sender, m.target, m.text, now, m.route])
}

/// A `messages` row read as `id, sender, target, text, attempts, route, enqueued_at`.
fn pending_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PendingMessage> {
    Ok(PendingMessage {
        id: id_from(r.get(0)?),
        sender: r.get(1)?,
        target: r.get(2)?,
        text: r.get(3)?,
        attempts: r.get(4)?,
        route: r.get(5)?,
        enqueued_at: r.get::<_, i64>(6)?.max(0) as u64,
    })
}

fn id_bytes(id: MsgId) -> [u8; 16] {
    id.to_be_bytes()
}

fn id_from(bytes: Vec<u8>) -> MsgId {
    let mut b = [0u8; 16];
    let n = bytes.len().min(16);
    b[16 - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    u128::from_be_bytes(b)
}

impl Store {
    /// Opens (creating if needed) the database at `path` and runs pending migrations.
    pub fn open(path: &Path, durability: Durability) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        let mut store = Store { conn };
        store.migrate(&path.display().to_string())?;
        Ok(store)
    }

    fn migrate(&mut self, path: &str) -> Result<(), StoreError> {
        let version: usize =
            self.conn.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? as usize;
        if version > MIGRATIONS.len() {
            return Err(StoreError::TooNew {
                path: path.into(),
                found: version,
                known: MIGRATIONS.len(),
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version) {
            let tx = self.conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        Ok(())
    }

    /// The state dir: the folder of the database file (`None` in memory).
    pub fn state_dir(&self) -> Option<std::path::PathBuf> {
        let path = self.conn.path().filter(|p| !p.is_empty())?;
        std::path::Path::new(path).parent().map(std::path::Path::to_path_buf)
    }

    /// Runs `f` in one transaction and enqueues the messages it returns in the same one: a
    /// record and the messages that announce it are stored together or not at all. Nothing is
    /// written when `f` fails (the inner `Err`, as `f` gave it) or the store does (the outer).
    #[allow(clippy::type_complexity)]
    pub fn with_messages<T, E>(
        &mut self,
        f: impl FnOnce(&rusqlite::Connection) -> Result<(T, Vec<NewMessage>), E>,
    ) -> Result<Result<(T, Vec<NewMessage>), E>, StoreError> {
        let tx = self.conn.transaction()?;
        let (value, messages) = match f(&tx) {
            Ok(done) => done,
            Err(e) => return Ok(Err(e)),
        };
        {
            let mut insert = tx.prepare_cached(INSERT_MESSAGE)?;
            let now = now_ms();
            for m in &messages {
                insert_message(&mut insert, m, now)?;
            }
        }
        tx.commit()?;
        Ok(Ok((value, messages)))
    }

    /// Applies `ops` in one transaction (group commit). All or nothing.
    pub fn apply<'a>(
        &mut self,
        ops: impl IntoIterator<Item = &'a WriteOp>,
    ) -> Result<Vec<WriteOutcome>, StoreError> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        let ops = ops.into_iter();
        let mut out = Vec::with_capacity(ops.size_hint().0);
        // Turns counted per agent, one row update each at the end (same transaction).
        let mut turns: HashMap<&str, i64> = HashMap::new();
        {
            let mut insert = tx.prepare_cached(INSERT_MESSAGE)?;
            let mut complete = tx.prepare_cached(COMPLETE_MESSAGE)?;
            let mut add = tx.prepare_cached(
                "INSERT INTO agent_stats (name, turns_total) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET turns_total = turns_total + ?2",
            )?;
            let mut tokens = tx.prepare_cached(
                "INSERT INTO agent_stats (name, tokens_in, tokens_out) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name) DO UPDATE SET tokens_in = tokens_in + ?2, tokens_out = tokens_out + ?3",
            )?;
            let mut attempt =
                tx.prepare_cached("UPDATE messages SET attempts = ?2 WHERE id = ?1 AND state = 0")?;
            let mut discard = tx.prepare_cached(
                "UPDATE messages SET state = 1, reason = ?2, finished_at = ?3
                 WHERE id = ?1 AND state = 0",
            )?;
            let mut dead = tx.prepare_cached(
                "UPDATE messages SET state = 2, attempts = ?2, reason = ?3, finished_at = ?4
                 WHERE id = ?1 AND state = 0",
            )?;
            for op in ops {
                let outcome = match op {
                    WriteOp::Enqueue(m) => {
                        let n = insert_message(&mut insert, m, now)?;
                        if n == 1 { WriteOutcome::Inserted } else { WriteOutcome::Duplicate }
                    }
                    WriteOp::Complete { id, agent } => {
                        // Count a turn only the first time a message completes.
                        if complete.execute(params![id_bytes(*id), now])? == 1 {
                            *turns.entry(agent.as_str()).or_default() += 1;
                        }
                        WriteOutcome::Applied
                    }
                    WriteOp::AddTokens { agent, tokens_in, tokens_out } => {
                        tokens.execute(params![agent, *tokens_in as i64, *tokens_out as i64])?;
                        WriteOutcome::Applied
                    }
                    WriteOp::AddTurns { agent, n } => {
                        add.execute(params![agent, *n as i64])?;
                        WriteOutcome::Applied
                    }
                    WriteOp::FailedAttempt { id, attempts } => {
                        attempt.execute(params![id_bytes(*id), attempts])?;
                        WriteOutcome::Applied
                    }
                    WriteOp::DeadLetter { id, attempts, reason } => {
                        dead.execute(params![id_bytes(*id), attempts, reason, now])?;
                        WriteOutcome::Applied
                    }
                    WriteOp::Discard { id, reason } => {
                        discard.execute(params![id_bytes(*id), reason, now])?;
                        WriteOutcome::Applied
                    }
                    WriteOp::Told { agent, channel, born, upto } => {
                        tx.prepare_cached(
                            "INSERT INTO deltas_told (agent, channel, born, upto)
                             VALUES (?1, ?2, ?3, ?4)
                             ON CONFLICT (agent, channel) DO UPDATE SET
                                 upto = CASE WHEN born = excluded.born
                                     THEN max(upto, excluded.upto) ELSE excluded.upto END,
                                 born = excluded.born",
                        )?
                        .execute(params![
                            agent,
                            channel,
                            born,
                            *upto as i64
                        ])?;
                        WriteOutcome::Applied
                    }
                };
                out.push(outcome);
            }
            for (agent, n) in turns {
                add.execute(params![agent, n])?;
            }
        }
        tx.commit()?;
        Ok(out)
    }

    /// Every pending message, oldest first (mailbox order).
    pub fn pending(&self) -> Result<Vec<PendingMessage>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, sender, target, text, attempts, route, enqueued_at
             FROM messages WHERE state = 0 ORDER BY seq",
        )?;
        let rows = stmt.query_map([], pending_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The oldest pending messages to any of `targets` (agents on other hosts), at most
    /// `limit`, in the order they were accepted: what the cluster link sends next.
    pub fn pending_for(
        &self,
        targets: &[String],
        limit: usize,
    ) -> Result<Vec<PendingMessage>, StoreError> {
        if targets.is_empty() {
            return Ok(Vec::new());
        }
        let marks = vec!["?"; targets.len()].join(", ");
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT id, sender, target, text, attempts, route, enqueued_at
             FROM messages WHERE state = 0 AND target IN ({marks}) ORDER BY seq LIMIT {limit}"
        ))?;
        let rows = stmt.query_map(rusqlite::params_from_iter(targets), pending_row)?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How many messages wait here for each of `targets` (agents on other hosts), not forwarded
    /// yet: what `ps` shows waiting for a host that is down.
    pub fn pending_counts(&self, targets: &[String]) -> Result<HashMap<String, u64>, StoreError> {
        if targets.is_empty() {
            return Ok(HashMap::new());
        }
        let marks = vec!["?"; targets.len()].join(", ");
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT target, COUNT(*) FROM messages WHERE state = 0 AND target IN ({marks})
             GROUP BY target"
        ))?;
        let rows = stmt.query_map(rusqlite::params_from_iter(targets), |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// These messages are on another host's queue now (the broker stored them): done here, no
    /// turn counted, their reason names the host they went to.
    pub fn mark_forwarded(&mut self, sent: &[(MsgId, String)]) -> Result<(), StoreError> {
        let now = now_ms();
        let tx = self.conn.transaction()?;
        {
            let mut done = tx.prepare_cached(
                "UPDATE messages SET state = 1, reason = ?2, finished_at = ?3
                 WHERE id = ?1 AND state = 0",
            )?;
            for (id, host) in sent {
                done.execute(params![id_bytes(*id), format!("forwarded to host {host}"), now])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Completed turns per agent.
    pub fn turns_totals(&self) -> Result<HashMap<String, u64>, StoreError> {
        let mut stmt = self.conn.prepare("SELECT name, turns_total FROM agent_stats")?;
        let rows =
            stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// How far each agent here was told each channel held on another host:
    /// (agent, channel) → (born, upto). See [`WriteOp::Told`].
    pub fn deltas_told(&self) -> Result<DeltasTold, StoreError> {
        let mut stmt = self.conn.prepare("SELECT agent, channel, born, upto FROM deltas_told")?;
        let rows = stmt.query_map([], |r| {
            let key = (r.get::<_, String>(0)?, r.get::<_, String>(1)?);
            Ok((key, (r.get::<_, i64>(2)?, r.get::<_, i64>(3)? as u64)))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Tokens used per agent: (in, out).
    pub fn token_totals(&self) -> Result<HashMap<String, (u64, u64)>, StoreError> {
        let mut stmt = self.conn.prepare("SELECT name, tokens_in, tokens_out FROM agent_stats")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, (r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64)))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Messages in the dead-letter state, oldest first.
    pub fn dead_letters(&self, offset: u32, limit: u32) -> Result<Vec<DeadLetter>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, sender, target, substr(text, 1, ?3), length(CAST(text AS BLOB)), attempts,
                    COALESCE(reason, '')
             FROM messages WHERE state = 2 ORDER BY seq LIMIT ?2 OFFSET ?1",
        )?;
        let rows = stmt.query_map(params![offset, limit, DEAD_LETTER_PREVIEW_CHARS], |r| {
            let mut text: String = r.get(3)?;
            let bytes = r.get::<_, i64>(4)? as usize;
            if bytes > text.len() {
                text.push_str(&format!(" … [{bytes} bytes in all]"));
            }
            Ok(DeadLetter {
                id: id_from(r.get(0)?),
                sender: r.get(1)?,
                target: r.get(2)?,
                text,
                attempts: r.get(5)?,
                reason: r.get(6)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// State of one message: `pending`, `done`, `dead`, or `None` if unknown.
    pub fn message_state(&self, id: MsgId) -> Result<Option<&'static str>, StoreError> {
        let state: Option<i64> = self
            .conn
            .query_row("SELECT state FROM messages WHERE id = ?1", params![id_bytes(id)], |r| {
                r.get(0)
            })
            .optional()?;
        Ok(state.map(|s| match s {
            0 => "pending",
            1 => "done",
            _ => "dead",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: MsgId, target: &str) -> NewMessage {
        NewMessage {
            id,
            sender: "a".into(),
            target: target.into(),
            text: format!("m{id}"),
            route: String::new(),
        }
    }

    #[test]
    fn enqueue_is_idempotent_by_id_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flock.db");
        {
            let mut s = Store::open(&path, Durability::Normal).unwrap();
            let out = s
                .apply(&[
                    WriteOp::Enqueue(msg(1, "w")),
                    WriteOp::Enqueue(msg(2, "w")),
                    WriteOp::Enqueue(msg(1, "w")),
                ])
                .unwrap();
            assert_eq!(
                out,
                [WriteOutcome::Inserted, WriteOutcome::Inserted, WriteOutcome::Duplicate]
            );
        }
        let s = Store::open(&path, Durability::Normal).unwrap();
        let ids: Vec<_> = s.pending().unwrap().iter().map(|m| m.id).collect();
        assert_eq!(ids, [1, 2]);
    }

    #[test]
    fn completing_twice_counts_one_turn() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("f.db"), Durability::Normal).unwrap();
        s.apply(&[WriteOp::Enqueue(msg(7, "w"))]).unwrap();
        let done = WriteOp::Complete { id: 7, agent: "w".into() };
        s.apply(&[done.clone(), done]).unwrap();
        assert_eq!(s.turns_totals().unwrap()["w"], 1);
        assert_eq!(s.message_state(7).unwrap(), Some("done"));
        assert!(s.pending().unwrap().is_empty());
    }

    #[test]
    fn dead_letters_leave_the_mailbox_and_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("f.db"), Durability::Normal).unwrap();
        s.apply(&[WriteOp::Enqueue(msg(9, "w")), WriteOp::FailedAttempt { id: 9, attempts: 4 }])
            .unwrap();
        assert_eq!(s.pending().unwrap()[0].attempts, 4);
        s.apply(&[WriteOp::DeadLetter { id: 9, attempts: 5, reason: "crashed".into() }]).unwrap();
        assert!(s.pending().unwrap().is_empty());
        let dl = s.dead_letters(0, 10).unwrap();
        assert_eq!((dl[0].id, dl[0].attempts, dl[0].reason.as_str()), (9, 5, "crashed"));
    }

    #[test]
    fn dead_letters_come_in_pages_with_long_texts_cut_to_a_preview() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Store::open(&dir.path().join("f.db"), Durability::Normal).unwrap();
        let big = "é".repeat(1_000_000);
        let mut ops = Vec::new();
        for id in 1..=3u128 {
            let mut m = msg(id, "w");
            if id == 2 {
                m.text = big.clone();
            }
            ops.push(WriteOp::Enqueue(m));
            ops.push(WriteOp::DeadLetter { id, attempts: 5, reason: "crashed".into() });
        }
        s.apply(&ops).unwrap();
        let first = s.dead_letters(0, 2).unwrap();
        assert_eq!(first.iter().map(|d| d.id).collect::<Vec<_>>(), vec![1, 2]);
        let preview = &first[1].text;
        assert!(preview.starts_with(&"é".repeat(DEAD_LETTER_PREVIEW_CHARS as usize)));
        assert!(
            preview.ends_with(" … [2000000 bytes in all]"),
            "{}",
            &preview[preview.len() - 40..]
        );
        let second = s.dead_letters(2, 2).unwrap();
        assert_eq!(second.iter().map(|d| d.id).collect::<Vec<_>>(), vec![3]);
        assert!(s.dead_letters(3, 2).unwrap().is_empty());
    }

    #[test]
    fn a_newer_schema_is_refused_with_advice() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.db");
        Connection::open(&path).unwrap().pragma_update(None, "user_version", 99).unwrap();
        let err = Store::open(&path, Durability::Normal).unwrap_err().to_string();
        assert!(err.contains("upgrade Flock"), "{err}");
    }
}
