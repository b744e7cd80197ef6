//! The channels' side of chat bridges (issue #9): what a `flock-bridge` process may do, with its
//! identity from its connection and its powers from the swarm file's `bridges:` mappings.
//!
//! - `bridge__post {external, message_id, user_id, user_name, text}`: a person's message from a
//!   mapped platform chat becomes a post by `human:<platform>:<name>` in the mapped channel,
//!   exactly once: its origin (`<bridge>/<external>/<message_id>`) is a unique key of the post,
//!   so a message the bridge hands over again (after a crash, a reconnect, a replayed update)
//!   answers the first post's seq with `duplicate: true`.
//! - `bridge__pull {external, wait_ms}`: the channel's posts after the mapping's durable cursor
//!   (at most [`PULL_MAX`]), leaving out those that came from this very chat (no echo). With
//!   nothing new, the call waits up to `wait_ms` for a post (long poll, no polling storm).
//! - `bridge__last {external}`: the platform id of the newest message brought in from that chat
//!   (a restarted Discord bridge fetches what was written after it).
//! - `bridge__sent {external, seq, external_id}`: everything up to `seq` reached the chat; the
//!   cursor moves (never back) and the platform's message id is remembered.
//! - Archive: once the channel is archived and the mapping's cursor has reached its last post
//!   (every earlier post went out first, in order), `bridge__pull` answers at once with
//!   `archived: true` and `mirrored` (whether the bridge already mirrored the archive to the
//!   chat). `bridge__archived {external}` records that it did (durably, so a restarted bridge
//!   does not do it again).
//!
//! The channel log is the outbox: a post leaves it only when the bridge says it was delivered,
//! so a bridge killed at any moment resumes at its cursor and loses nothing.

use std::sync::Arc;

use flock_config::{BridgeMapping, BridgeSpec};
use flock_ipc::ErrorCode;
use ractor::ActorRef;
use rusqlite::{OptionalExtension, params};
use serde_json::{Value, json};

use super::store::{ChannelRow, ChannelState, UniqueKey};
use super::{ChannelsMsg, ChannelsState, ToolReply, ToolResult, bad, str_arg};
use crate::journal::{JournalEvent, Status};
use crate::store::{Store, StoreError, now_ms};

/// Migration 5: where each bridge mapping stands, and which platform message each post became.
pub const SCHEMA: &str = "
    ALTER TABLE channel_messages ADD COLUMN origin TEXT;
    CREATE UNIQUE INDEX channel_messages_origin ON channel_messages (origin)
        WHERE origin IS NOT NULL;
    CREATE TABLE bridge_cursors (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        channel TEXT NOT NULL,
        seq INTEGER NOT NULL,
        PRIMARY KEY (bridge, external)
    );
    CREATE TABLE bridge_messages (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        seq INTEGER NOT NULL,
        external_id TEXT NOT NULL,
        PRIMARY KEY (bridge, external, seq)
    );";

/// Migration 6: when a mapping mirrored its channel's archive to its chat.
pub const SCHEMA_ARCHIVE: &str = "ALTER TABLE bridge_cursors ADD COLUMN archived_at INTEGER;";

/// Migration 7: people's edits and deletions followed. A post keeps its current text (a
/// deleted one keeps none); `channel_edits` is the log of changes each mapping works through
/// after its own `edit_id` cursor; `channel_posts` is a channel's messages as readers see them.
pub const SCHEMA_EDITS: &str = "
    ALTER TABLE channel_messages ADD COLUMN edited_at INTEGER;
    ALTER TABLE channel_messages ADD COLUMN deleted_at INTEGER;
    CREATE TABLE channel_edits (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        channel TEXT NOT NULL,
        seq INTEGER NOT NULL,
        origin TEXT NOT NULL,
        at INTEGER NOT NULL
    );
    CREATE INDEX channel_edits_by_channel ON channel_edits (channel, id);
    ALTER TABLE bridge_cursors ADD COLUMN edit_id INTEGER NOT NULL DEFAULT 0;
    CREATE VIEW channel_posts AS
        SELECT channel, seq, author, created_at,
               CASE WHEN deleted_at IS NOT NULL THEN '(deleted by its author)'
                    WHEN edited_at IS NOT NULL THEN text || ' (edited)'
                    ELSE text END AS text
        FROM channel_messages;";

/// Migration 8: mappings changed at run time (`flockctl bridge map|unmap`), over the swarm
/// file's: `flock` NULL means the chat is unmapped.
pub const SCHEMA_MAPPINGS: &str = "
    CREATE TABLE bridge_mappings (
        bridge TEXT NOT NULL,
        external TEXT NOT NULL,
        flock TEXT,
        allow TEXT,
        changed_by TEXT NOT NULL,
        at INTEGER NOT NULL,
        PRIMARY KEY (bridge, external)
    );";

/// The `external` of a mapping whose platform channel is still to be made (a bridge with
/// `mirror_new_channels` and a channel just created in Flock): `new:<channel>`.
pub const PENDING_PREFIX: &str = "new:";

/// A mapping made or removed at run time: chat `external` of `bridge` now goes to channel
/// `flock` (with who may post), or (`flock: None`) to none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingChange {
    pub bridge: String,
    pub external: String,
    pub flock: Option<String>,
    pub allow: Option<Vec<String>>,
}

/// The swarm file's mappings with the run-time changes applied, in order of change.
pub fn apply_mapping_changes(bridges: &mut [BridgeSpec], changes: &[MappingChange]) {
    for c in changes {
        let Some(b) = bridges.iter_mut().find(|b| b.name == c.bridge) else { continue };
        let removed = b.channels.iter().position(|m| m.external == c.external);
        let removed = removed.map(|i| b.channels.remove(i));
        if let Some(flock) = &c.flock {
            // A run-time mapping keeps the responder the file gave that chat, if any.
            let (responder, replies) =
                removed.map(|m| (m.responder, m.replies)).unwrap_or_default();
            b.channels.push(BridgeMapping {
                flock: flock.clone(),
                external: c.external.clone(),
                allow: c.allow.clone(),
                responder,
                replies,
            });
        }
    }
}

/// A person's `/approve ID [reason]` or `/deny ID [reason]` in a chat (Telegram's
/// `/approve@botname ID` too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalCommand {
    pub approve: bool,
    pub id: i64,
    pub reason: String,
}

impl ApprovalCommand {
    pub fn parse(text: &str) -> Option<ApprovalCommand> {
        let mut words = text.trim().splitn(3, char::is_whitespace);
        let verb = words.next()?.to_ascii_lowercase();
        let approve = match verb.split('@').next()? {
            "/approve" => true,
            "/deny" => false,
            _ => return None,
        };
        let id = words.next()?.trim_start_matches('#').parse().ok()?;
        let reason = words.next().unwrap_or_default().trim().to_owned();
        Some(ApprovalCommand { approve, id, reason })
    }
}

/// Posts per pull answer.
pub const PULL_MAX: usize = 50;
/// Direct chats one bridge maps at most (a public bot is reachable by anyone).
pub const MAX_DM_CHATS: usize = 500;
/// The longest a pull may wait for a post.
const PULL_WAIT_MAX_MS: u64 = 60_000;

/// Names of the tools a bridge connection may call.
pub fn is_bridge_tool(name: &str) -> bool {
    matches!(
        name,
        "bridge__post"
            | "bridge__mappings"
            | "bridge__made"
            | "bridge__edit"
            | "bridge__pull"
            | "bridge__sent"
            | "bridge__last"
            | "bridge__archived"
    )
}

/// A pull waiting for a post in its channel.
pub(super) struct ParkedPull {
    channel: String,
    reply: ToolReply,
}

/// Where a mapping's way out stands (see [`Store::bridge_outbox`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappingOutbox {
    pub cursor: Option<u64>,
    pub newest: u64,
    pub waiting: u64,
    /// The channel's archive was mirrored to the chat.
    pub archived: bool,
}

/// One post as a bridge gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgePost {
    pub seq: u64,
    pub author: String,
    pub text: String,
    /// The platform message it replies to in this chat (see [`Store::reply_target`]).
    pub reply_to: Option<String>,
}

/// A post a mapping already delivered that was edited or deleted since: what the chat's copy
/// must become (the post's text now, or gone), and the platform ids of that copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeEdit {
    pub seq: u64,
    pub author: String,
    pub text: String,
    pub deleted: bool,
    pub ids: Vec<String>,
}

/// Where a mapping stands: its post cursor (seq) and its edit cursor (`channel_edits.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BridgeCursor {
    pub seq: u64,
    pub edit_id: u64,
}

impl Store {
    /// Posts `text` by `author` unless a post with this `origin` exists: `(seq, duplicate)`.
    pub fn post_with_origin(
        &mut self,
        channel: &str,
        author: &str,
        text: &str,
        origin: &str,
    ) -> Result<(u64, bool), StoreError> {
        let key = Some(UniqueKey::Origin(origin.to_owned()));
        let (seq, duplicate, _) =
            self.post_unique(channel, author, text, key, Default::default())?;
        Ok((seq, duplicate))
    }

    /// The seq of the post made from `origin` in `channel`, if there is one.
    pub fn post_with_origin_seq(
        &self,
        channel: &str,
        origin: &str,
    ) -> Result<Option<u64>, StoreError> {
        let seq: Option<i64> = self
            .conn
            .query_row(
                "SELECT seq FROM channel_messages WHERE channel = ?1 AND origin = ?2",
                params![channel, origin],
                |r| r.get(0),
            )
            .optional()?;
        Ok(seq.map(|s| s as u64))
    }

    /// The mapping's cursors; a mapping seen for the first time — or whose chat the swarm file
    /// now maps to another channel — starts at `start` (the channel's newest post then: a new
    /// bridge does not flood its chat with the channel's history) and after the channel's last
    /// edit, with no archive mirrored and no platform ids of an old channel's posts.
    pub fn bridge_cursor(
        &mut self,
        bridge: &str,
        external: &str,
        channel: &str,
        start: u64,
    ) -> Result<BridgeCursor, StoreError> {
        let tx = self.conn.transaction()?;
        let moved = tx.execute(
            "DELETE FROM bridge_cursors WHERE bridge = ?1 AND external = ?2 AND channel != ?3",
            params![bridge, external, channel],
        )?;
        if moved > 0 {
            tx.execute(
                "DELETE FROM bridge_messages WHERE bridge = ?1 AND external = ?2",
                params![bridge, external],
            )?;
        }
        tx.execute(
            "INSERT OR IGNORE INTO bridge_cursors (bridge, external, channel, seq, edit_id)
             VALUES (?1, ?2, ?3, ?4,
                     (SELECT COALESCE(MAX(id), 0) FROM channel_edits WHERE channel = ?3))",
            params![bridge, external, channel, start as i64],
        )?;
        let (seq, edit_id): (i64, i64) = tx.query_row(
            "SELECT seq, edit_id FROM bridge_cursors WHERE bridge = ?1 AND external = ?2",
            params![bridge, external],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        tx.commit()?;
        Ok(BridgeCursor { seq: seq as u64, edit_id: edit_id as u64 })
    }

    /// Every run-time mapping change, oldest first.
    pub fn bridge_mapping_changes(&self) -> Result<Vec<MappingChange>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT bridge, external, flock, allow FROM bridge_mappings ORDER BY at, rowid",
        )?;
        let rows = stmt.query_map([], |r| {
            let allow: Option<String> = r.get(3)?;
            Ok(MappingChange {
                bridge: r.get(0)?,
                external: r.get(1)?,
                flock: r.get(2)?,
                allow: allow.and_then(|a| serde_json::from_str(&a).ok()),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets the run-time mapping of chat `external` (a pending one, once made).
    pub fn drop_bridge_mapping(&mut self, bridge: &str, external: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "DELETE FROM bridge_mappings WHERE bridge = ?1 AND external = ?2",
            params![bridge, external],
        )?;
        Ok(())
    }

    /// Records a run-time mapping change (the last one per chat counts).
    pub fn set_bridge_mapping(&mut self, c: &MappingChange, by: &str) -> Result<(), StoreError> {
        let allow = c.allow.as_ref().map(|a| serde_json::to_string(a).unwrap_or_default());
        self.conn.execute(
            "INSERT OR REPLACE INTO bridge_mappings (bridge, external, flock, allow, changed_by, at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![c.bridge, c.external, c.flock, allow, by, now_ms()],
        )?;
        Ok(())
    }

    /// A person edited (`Some(text)`) or deleted (`None`) the platform message that became the
    /// post with `origin`: the post takes the new text (a deleted one keeps none) and the change
    /// is logged for the other mappings. `(channel, seq, changed)`, or `None` if no post has
    /// that origin; a change already made (a replayed event) changes nothing.
    pub fn bridge_edit(
        &mut self,
        origin: &str,
        text: Option<&str>,
    ) -> Result<Option<(String, u64, bool)>, StoreError> {
        let tx = self.conn.transaction()?;
        let found: Option<(String, i64)> = tx
            .query_row(
                "SELECT channel, seq FROM channel_messages WHERE origin = ?1",
                params![origin],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((channel, seq)) = found else { return Ok(None) };
        let now = now_ms();
        let changed = match text {
            Some(t) => tx.execute(
                "UPDATE channel_messages SET text = ?2, edited_at = ?3
                 WHERE origin = ?1 AND deleted_at IS NULL AND text != ?2",
                params![origin, t, now],
            )?,
            None => tx.execute(
                "UPDATE channel_messages SET text = '', deleted_at = ?2
                 WHERE origin = ?1 AND deleted_at IS NULL",
                params![origin, now],
            )?,
        } > 0;
        if changed {
            tx.execute(
                "INSERT INTO channel_edits (channel, seq, origin, at) VALUES (?1, ?2, ?3, ?4)",
                params![channel, seq, origin, now],
            )?;
        }
        tx.commit()?;
        Ok(Some((channel, seq as u64, changed)))
    }

    /// The changes to `channel`'s posts after edit `after` that mapping (`bridge`, `external`)
    /// must make to its chat: posts it delivered (up to its post cursor `sent`, with the
    /// platform ids it recorded), not the chat's own (it shows its change already), one per
    /// post; and the highest edit id looked at, to move the edit cursor past.
    pub fn bridge_edits(
        &self,
        bridge: &str,
        external: &str,
        channel: &str,
        after: u64,
        sent: u64,
        limit: usize,
    ) -> Result<(Vec<BridgeEdit>, u64), StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT e.id, e.seq, e.origin, m.author, m.text, m.deleted_at IS NOT NULL, b.external_id
             FROM channel_edits e
             JOIN channel_messages m ON m.channel = e.channel AND m.seq = e.seq
             LEFT JOIN bridge_messages b ON b.bridge = ?1 AND b.external = ?2 AND b.seq = e.seq
             WHERE e.channel = ?3 AND e.id > ?4 ORDER BY e.id LIMIT ?5",
        )?;
        let rows =
            stmt.query_map(params![bridge, external, channel, after as i64, limit as i64], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, String>(4)?,
                    r.get::<_, bool>(5)?,
                    r.get::<_, Option<String>>(6)?,
                ))
            })?;
        let own = format!("{bridge}/{external}/");
        let mut edits: Vec<BridgeEdit> = Vec::new();
        let mut upto = after;
        for row in rows {
            let (id, seq, origin, author, text, deleted, ids) = row?;
            upto = id;
            let Some(ids) = ids else { continue }; // never delivered here (or not yet)
            if seq > sent || origin.starts_with(&own) {
                continue;
            }
            // The post's text is read now: a later change of the same post is already in it.
            edits.retain(|e| e.seq != seq);
            let ids = ids.split_whitespace().map(str::to_owned).collect();
            edits.push(BridgeEdit { seq, author, text, deleted, ids });
        }
        Ok((edits, upto))
    }

    /// Up to `limit` posts of `channel` after `after`, except deleted ones and those whose origin
    /// starts with `echo_prefix`; and the highest seq looked at (those included), to move the
    /// cursor past.
    pub fn bridge_pull(
        &self,
        channel: &str,
        after: u64,
        limit: usize,
        echo_prefix: &str,
    ) -> Result<(Vec<BridgePost>, u64), StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, author, text, origin, deleted_at IS NOT NULL, reply_to
             FROM channel_messages WHERE channel = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query_map(params![channel, after as i64, limit as i64], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, Option<String>>(3)?,
                r.get::<_, bool>(4)?,
                r.get::<_, Option<i64>>(5)?,
            ))
        })?;
        let rows: Vec<_> = rows.collect::<Result<_, _>>()?;
        let mut posts = Vec::new();
        let mut upto = after;
        for (seq, author, text, origin, deleted, reply_to) in rows {
            upto = seq;
            // A deleted post is not sent at all; nor is a chat's own post sent back to it.
            if deleted || origin.is_some_and(|o| o.starts_with(echo_prefix)) {
                continue;
            }
            let reply_to = match reply_to {
                Some(r) => self.reply_target(echo_prefix, channel, r as u64)?,
                None => None,
            };
            posts.push(BridgePost { seq, author, text, reply_to });
        }
        Ok((posts, upto))
    }

    /// The platform message that stands for post `seq` of `channel` in the chat whose posts'
    /// origins start with `prefix` (`<bridge>/<external>/`): the person's own message when it
    /// came from that chat, else the first message the bridge made of it there (if it did).
    pub fn reply_target(
        &self,
        prefix: &str,
        channel: &str,
        seq: u64,
    ) -> Result<Option<String>, StoreError> {
        let origin: Option<Option<String>> = self
            .conn
            .query_row(
                "SELECT origin FROM channel_messages WHERE channel = ?1 AND seq = ?2",
                params![channel, seq as i64],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(id) = origin.flatten().and_then(|o| o.strip_prefix(prefix).map(str::to_owned)) {
            return Ok(Some(id));
        }
        let Some((bridge, external)) = prefix.strip_suffix('/').and_then(|p| p.split_once('/'))
        else {
            return Ok(None);
        };
        let copy: Option<String> = self
            .conn
            .query_row(
                "SELECT external_id FROM bridge_messages WHERE bridge = ?1 AND external = ?2 AND seq = ?3",
                params![bridge, external, seq as i64],
                |r| r.get(0),
            )
            .optional()?;
        Ok(copy.and_then(|ids| ids.split_whitespace().next().map(str::to_owned)))
    }

    /// The platform message id of the newest post in `channel` whose origin starts with
    /// `prefix` (`<bridge>/<external>/`).
    pub fn last_origin(&self, channel: &str, prefix: &str) -> Result<Option<String>, StoreError> {
        let origin: Option<String> = self
            .conn
            .query_row(
                "SELECT origin FROM channel_messages
                 WHERE channel = ?1 AND substr(origin, 1, length(?2)) = ?2
                 ORDER BY seq DESC LIMIT 1",
                params![channel, prefix],
                |r| r.get(0),
            )
            .optional()?;
        Ok(origin.map(|o| o[prefix.len()..].to_owned()))
    }

    /// Where a mapping's way out stands: its durable cursor (`None` before its first pull), the
    /// channel's newest seq, and the posts waiting to go out (after the cursor, not from that
    /// chat itself). For `flockctl bridge status`.
    pub fn bridge_outbox(
        &self,
        bridge: &str,
        external: &str,
        channel: &str,
    ) -> Result<MappingOutbox, StoreError> {
        let (cursor, archived): (Option<i64>, bool) = self
            .conn
            .query_row(
                "SELECT seq, archived_at IS NOT NULL FROM bridge_cursors WHERE bridge = ?1 AND external = ?2",
                params![bridge, external],
                |r| Ok((Some(r.get(0)?), r.get(1)?)),
            )
            .optional()?
            .unwrap_or((None, false));
        let newest: i64 = self.conn.query_row(
            "SELECT COALESCE(MAX(seq), 0) FROM channel_messages WHERE channel = ?1",
            params![channel],
            |r| r.get(0),
        )?;
        let waiting: i64 = match cursor {
            None => 0,
            Some(after) => self.conn.query_row(
                "SELECT COUNT(*) FROM channel_messages WHERE channel = ?1 AND seq > ?2
                 AND (origin IS NULL OR substr(origin, 1, length(?3)) != ?3)",
                params![channel, after, format!("{bridge}/{external}/")],
                |r| r.get(0),
            )?,
        };
        Ok(MappingOutbox {
            cursor: cursor.map(|c| c as u64),
            newest: newest as u64,
            waiting: waiting as u64,
            archived,
        })
    }

    /// Whether the mapping already mirrored its channel's archive to its chat.
    pub fn bridge_archive_mirrored(
        &self,
        bridge: &str,
        external: &str,
    ) -> Result<bool, StoreError> {
        let at: Option<Option<i64>> = self
            .conn
            .query_row(
                "SELECT archived_at FROM bridge_cursors WHERE bridge = ?1 AND external = ?2",
                params![bridge, external],
                |r| r.get(0),
            )
            .optional()?;
        Ok(at.flatten().is_some())
    }

    /// Records that the mapping mirrored its channel's archive (the first time counts).
    pub fn bridge_mark_archived(&mut self, bridge: &str, external: &str) -> Result<(), StoreError> {
        self.conn.execute(
            "UPDATE bridge_cursors SET archived_at = COALESCE(archived_at, ?3)
             WHERE bridge = ?1 AND external = ?2",
            params![bridge, external, now_ms()],
        )?;
        Ok(())
    }

    /// Moves the mapping's cursor up to `seq` (never back) and records the platform message(s)
    /// the post became (ids separated by spaces: a long post is several messages).
    pub fn bridge_sent(
        &mut self,
        bridge: &str,
        external: &str,
        seq: u64,
        external_id: Option<&str>,
    ) -> Result<u64, StoreError> {
        self.bridge_sent_upto(bridge, external, seq, 0, external_id)
    }

    /// [`Store::bridge_sent`], and the mapping's edit cursor moved up to `edit_id` (never back).
    pub fn bridge_sent_upto(
        &mut self,
        bridge: &str,
        external: &str,
        seq: u64,
        edit_id: u64,
        external_id: Option<&str>,
    ) -> Result<u64, StoreError> {
        let tx = self.conn.transaction()?;
        tx.execute(
            "UPDATE bridge_cursors SET seq = MAX(seq, ?3), edit_id = MAX(edit_id, ?4)
             WHERE bridge = ?1 AND external = ?2",
            params![bridge, external, seq as i64, edit_id as i64],
        )?;
        if let Some(id) = external_id {
            tx.execute(
                "INSERT OR REPLACE INTO bridge_messages (bridge, external, seq, external_id) VALUES (?1, ?2, ?3, ?4)",
                params![bridge, external, seq as i64, id],
            )?;
        }
        let now: i64 = tx.query_row(
            "SELECT seq FROM bridge_cursors WHERE bridge = ?1 AND external = ?2",
            params![bridge, external],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(now as u64)
    }
}

/// `human:<platform>:<name>` for a platform user: the name cut to 40 of a-z, 0-9, `.`, `_` and
/// `-` (lowercase), falling back to the user id — a person can never take an agent's name.
pub fn human_author(platform: &str, user_name: &str, user_id: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .flat_map(char::to_lowercase)
            .map(
                |c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' },
            )
            .collect::<String>()
            .trim_matches('-')
            .chars()
            .take(40)
            .collect()
    };
    let name = clean(user_name);
    let name = if name.is_empty() { clean(user_id) } else { name };
    format!("human:{platform}:{}", if name.is_empty() { "unknown" } else { &name })
}

impl ChannelsState {
    fn bridge_spec(&self, bridge: &str) -> Result<&BridgeSpec, (ErrorCode, String)> {
        self.spec.bridges.iter().find(|b| b.name == bridge).ok_or_else(|| {
            (ErrorCode::Forbidden, format!("`{bridge}` is not a bridge of this swarm"))
        })
    }

    /// The Flock channel `external` is mapped to for `bridge`.
    fn mapped(&self, bridge: &str, args: &Value) -> Result<(String, String), (ErrorCode, String)> {
        let external = str_arg(args, "external").ok_or_else(|| bad("`external` is required"))?;
        let spec = self.bridge_spec(bridge)?;
        let m = spec.channels.iter().find(|m| m.external == external).ok_or_else(|| {
            (ErrorCode::Forbidden, format!("chat `{external}` is not mapped by bridge `{bridge}`"))
        })?;
        Ok((m.flock.clone(), external.to_owned()))
    }

    /// Creates the channels the bridges map that do not exist yet (by `bridge:<name>`, with no
    /// members: people or the orchestrator add them), and makes each mapping's `responder` a
    /// member of its channel.
    pub(super) async fn ensure_bridge_channels(&mut self) -> Result<(), (ErrorCode, String)> {
        let wanted: Vec<(String, String, &'static str, Option<String>)> = self
            .spec
            .bridges
            .iter()
            .flat_map(|b| {
                b.channels.iter().map(|m| {
                    (m.flock.clone(), b.name.clone(), b.platform.as_str(), m.responder.clone())
                })
            })
            .collect();
        for (id, bridge, platform, responder) in wanted {
            if !self.channels.contains_key(&id) {
                let topic = format!("bridged to {platform}");
                let by = format!("bridge:{bridge}");
                self.add_channel(ChannelRow::new(&id, &id, &topic, &by, false, Vec::new())).await?;
            }
            let Some(responder) = responder.filter(|r| self.is_agent(r)) else { continue };
            if self.channels.get(&id).is_some_and(|c| !c.members.contains(&responder)) {
                let (c, add) = (id.clone(), vec![responder.clone()]);
                self.db(move |s| s.change_members(&c, &add, &[])).await?;
                if let Some(c) = self.channels.get_mut(&id) {
                    c.members.push(responder);
                }
            }
        }
        Ok(())
    }

    /// One `bridge__*` call of `bridge`; a pull with nothing new is parked (answered later).
    pub(super) async fn bridge_tool(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        bridge: &str,
        name: &str,
        arguments: &str,
        reply: ToolReply,
    ) {
        let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        let result = match name {
            "bridge__post" => self.bridge_post(myself, bridge, &args).await,
            "bridge__edit" => self.bridge_edit(bridge, &args).await,
            "bridge__made" => self.bridge_made(bridge, &args).await,
            "bridge__mappings" => self.bridge_spec(bridge).map(|b| {
                let channels: Vec<Value> = b
                    .channels
                    .iter()
                    .map(|m| {
                        json!({"flock": m.flock, "external": m.external, "allow": m.allow,
                               "replies": m.replies})
                    })
                    .collect();
                json!({"channels": channels}).to_string()
            }),
            "bridge__sent" => self.bridge_sent(bridge, &args).await,
            "bridge__last" => match self.mapped(bridge, &args) {
                Ok((channel, external)) => {
                    let prefix = format!("{bridge}/{external}/");
                    self.db(move |s| s.last_origin(&channel, &prefix))
                        .await
                        .map(|id| json!({"message_id": id}).to_string())
                }
                Err(e) => Err(e),
            },
            "bridge__pull" => {
                let wait_ms = args.get("wait_ms").and_then(Value::as_u64).unwrap_or(0);
                // What the bridge shows as being worked on: a change answers at once.
                let shown: Vec<u64> = args
                    .get("working")
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_u64).collect())
                    .unwrap_or_default();
                match self.bridge_pull(bridge, &args).await {
                    Ok(p)
                        if p.is_empty()
                            && wait_ms > 0
                            && p.archived.is_none()
                            && p.working.iter().map(|(s, _)| *s).eq(shown.iter().copied()) =>
                    {
                        let channel = p.channel;
                        // Park it: the next post or edit in the channel (or the wait running
                        // out) answers. A newer pull of the same mapping replaces an older one.
                        let Ok((_, external)) = self.mapped(bridge, &args) else { return };
                        let key = (bridge.to_owned(), external.clone());
                        let frame_id = reply.frame_id;
                        self.pulls.insert(key, ParkedPull { channel, reply });
                        let (b, wait) = (bridge.to_owned(), wait_ms.min(PULL_WAIT_MAX_MS));
                        myself.send_after(std::time::Duration::from_millis(wait), move || {
                            ChannelsMsg::PullExpired { bridge: b, external, frame_id }
                        });
                        return;
                    }
                    Ok(p) => Ok(self.pull_answer(&p)),
                    Err(e) => Err(e),
                }
            }
            "bridge__archived" => self.bridge_archived(bridge, &args).await,
            other => Err(bad(format!("unknown bridge tool `{other}`"))),
        };
        reply.send(result);
    }

    async fn bridge_post(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        bridge: &str,
        args: &Value,
    ) -> ToolResult {
        let spec = self.bridge_spec(bridge)?.clone();
        let field = |k: &str| -> Result<String, (ErrorCode, String)> {
            match args.get(k) {
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(Value::Number(n)) => Ok(n.to_string()),
                _ => Err(bad(format!("`{k}` is required"))),
            }
        };
        let (message_id, user_id) = (field("message_id")?, field("user_id")?);
        let user_name = str_arg(args, "user_name").unwrap_or_default();
        let author = human_author(spec.platform.as_str(), user_name, &user_id);
        // A person writing to the bot directly: their chat becomes a DM with the agent that
        // answers DMs, mapped (durably) on their first message.
        let direct = args.get("dm").and_then(Value::as_bool) == Some(true);
        let (channel, external) = match self.mapped(bridge, args) {
            Ok(m) => m,
            Err(_) if direct => {
                let external = field("external")?;
                match self.map_direct(&spec, &external, &user_id, &author).await {
                    Ok(m) => m,
                    Err((code, why)) => {
                        let origin = format!("{bridge}/{external}/{message_id}");
                        let reason = "a direct message the bridge does not take";
                        self.refuse_once(&spec, &origin, &why, reason, "", args);
                        return Err((code, why));
                    }
                }
            }
            Err(e) => return Err(e),
        };
        let origin = format!("{bridge}/{external}/{message_id}");
        // Who may speak is decided here (the bridge hands over a refused person's message
        // without its text): the refusal is journaled, once per platform message.
        let mapping = spec.channels.iter().find(|m| m.external == external);
        let allow = match mapping {
            Some(m) => m.allow.clone(),
            // A DM mapped a moment ago (not in this copy of the spec yet) is its person's.
            None => Some(vec![user_id.clone()]),
        };
        if let Some(allow) = allow
            && !allow.contains(&user_id)
        {
            let why = format!("user {user_id} may not post in #{channel} through `{bridge}`");
            self.refuse_once(&spec, &origin, &why, "not on the allow list", &channel, args);
            return Err((ErrorCode::Forbidden, why));
        }
        let text = str_arg(args, "text").ok_or_else(|| bad("`text` is required"))?;
        if let Some(command) = ApprovalCommand::parse(text) {
            return self
                .chat_approval(myself, &spec, &channel, &author, &user_id, text, origin, command)
                .await;
        }
        let (seq, duplicate) = self
            .post_keyed(myself, &channel, &author, text, PostKey::Origin(origin), None, true)
            .await?;
        Ok(json!({"channel": channel, "seq": seq, "author": author, "duplicate": duplicate})
            .to_string())
    }

    /// Journals a refused platform message, once per message (`reason` says why in a word).
    fn refuse_once(
        &mut self,
        spec: &BridgeSpec,
        origin: &str,
        why: &str,
        reason: &str,
        channel: &str,
        args: &Value,
    ) {
        if !self.refused.first_time(origin) {
            return;
        }
        let text = |k: &str| args.get(k).map(|v| v.to_string().trim_matches('"').to_owned());
        let name: String = text("user_name").unwrap_or_default().chars().take(80).collect();
        self.journal(
            JournalEvent::new(
                format!("bridge:{}", spec.name),
                "BRIDGE_POST_REFUSED",
                Status::Failed,
                format!("{why}: {reason}"),
            )
            .param("bridge", json!(spec.name))
            .param("platform", json!(spec.platform.as_str()))
            .param("chat", json!(text("external")))
            .param("channel", json!(channel))
            .param("message_id", json!(text("message_id")))
            .param("user_id", json!(text("user_id")))
            .param("user_name", json!(name))
            .param("reason", json!(reason)),
        );
    }

    /// The DM channel of a person's direct chat with the bot (`external`), made and mapped on
    /// their first message: a two-member channel of the bridge's `dm.agent` and the person,
    /// keyed by their platform id (two people with one display name never share it). Refused
    /// when the bridge takes no DMs or the person is not on `dm.allow`.
    async fn map_direct(
        &mut self,
        spec: &BridgeSpec,
        external: &str,
        user_id: &str,
        author: &str,
    ) -> Result<(String, String), (ErrorCode, String)> {
        let bridge = &spec.name;
        let Some(dm) = &spec.dm else {
            return Err((
                ErrorCode::Forbidden,
                format!("bridge `{bridge}` takes no direct messages (`dm: false`)"),
            ));
        };
        if dm.allow.as_ref().is_some_and(|a| !a.iter().any(|u| u == user_id)) {
            return Err((
                ErrorCode::Forbidden,
                format!(
                    "user {user_id} may not write to bridge `{bridge}`'s bot (not on `dm.allow`)"
                ),
            ));
        }
        if !self.is_agent(&dm.agent) {
            return Err((
                ErrorCode::TargetUnavailable,
                format!("`{}`, who answers bridge `{bridge}`'s DMs, is not in service", dm.agent),
            ));
        }
        // A bot anyone can find must not grow without bound: each DM is a channel, a mapping
        // and a relay loop.
        let open = spec
            .channels
            .iter()
            .filter(|m| self.channels.get(&m.flock).is_some_and(|c| c.is_dm))
            .count();
        if open >= MAX_DM_CHATS {
            return Err((
                ErrorCode::RateLimited,
                format!(
                    "bridge `{bridge}` already has {MAX_DM_CHATS} direct chats; a new one is not \
                     taken (set `dm.allow` to the people who may write to the bot)"
                ),
            ));
        }
        let key = format!("human:{bridge}:{user_id}");
        let channel = super::delta::dm_channel_id(&dm.agent, &key);
        if !self.channels.contains_key(&channel) {
            let name = format!("DM {} / {author}", dm.agent);
            let topic = format!("direct messages with {author} through {}", spec.platform.as_str());
            let members = vec![dm.agent.clone(), author.to_owned()];
            let by = format!("bridge:{bridge}");
            self.add_channel(ChannelRow::new(&channel, &name, &topic, &by, true, members)).await?;
        }
        let change = MappingChange {
            bridge: bridge.clone(),
            external: external.to_owned(),
            flock: Some(channel.clone()),
            allow: Some(vec![user_id.to_owned()]),
        };
        let (c, by) = (change.clone(), format!("bridge:{bridge}"));
        // From the first post of the DM on: the answer to this very message goes out.
        let (b, e, ch) = (bridge.clone(), external.to_owned(), channel.clone());
        self.db(move |s| {
            s.set_bridge_mapping(&c, &by)?;
            s.bridge_cursor(&b, &e, &ch, 0).map(|_| ())
        })
        .await?;
        apply_mapping_changes(
            &mut Arc::make_mut(&mut self.spec).bridges,
            std::slice::from_ref(&change),
        );
        let what = format!("direct chat {external} with {author} ↔ #{channel}");
        self.journal_mapped(bridge, external, &channel, &what);
        Ok((channel, external.to_owned()))
    }

    /// `/approve ID [reason]` or `/deny ID [reason]` from a person in a chat: decided (durably,
    /// as `human:<platform>:<name>`) when they are on the bridge's `approvers`, refused and
    /// journaled otherwise. The command and the outcome are posts of the channel (the outcome
    /// a reply to the command), once per platform message.
    #[allow(clippy::too_many_arguments)]
    async fn chat_approval(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        spec: &BridgeSpec,
        channel: &str,
        author: &str,
        user_id: &str,
        text: &str,
        origin: String,
        command: ApprovalCommand,
    ) -> ToolResult {
        let (c, o) = (channel.to_owned(), origin.clone());
        let posted = self.db(move |s| s.post_with_origin_seq(&c, &o)).await?;
        if let Some(seq) = posted {
            // Handed over again after a crash: the decision was made with the first one.
            return Ok(
                json!({"channel": channel, "seq": seq, "author": author, "duplicate": true})
                    .to_string(),
            );
        }
        let verb = if command.approve { "approve" } else { "deny" };
        let outcome = if !spec.approvers.iter().any(|a| a == user_id) {
            self.refuse_once(
                spec,
                &origin,
                &format!(
                    "user {user_id} may not {verb} permission requests through `{}`",
                    spec.name
                ),
                "not on the bridge's approvers",
                channel,
                &json!({"user_id": user_id, "user_name": author}),
            );
            format!(
                "Only the people on bridge `{}`'s `approvers` list can {verb} permission \
                 requests; request #{} is unchanged. Ask one of them, or the operator \
                 (`flockctl {verb} {}`).",
                spec.name, command.id, command.id
            )
        } else {
            match self.decide_permission(author, &command).await {
                Ok(done) => format!("Done: {done}."),
                Err(why) => format!("Not done: {why}"),
            }
        };
        let (seq, duplicate) = self
            .post_keyed(myself, channel, author, text, PostKey::Origin(origin), None, false)
            .await?;
        if !duplicate {
            let key = PostKey::Origin(format!("flock/decision/{channel}/{seq}"));
            self.post_keyed(myself, channel, "flock", &outcome, key, Some(seq), false).await?;
        }
        Ok(json!({"channel": channel, "seq": seq, "author": author, "duplicate": duplicate})
            .to_string())
    }

    /// Announces permission request `id` (waiting for a person) in the `approvals` channel of
    /// every bridge that has one, once per channel (a unique origin: a repeat posts nothing).
    pub(super) async fn announce_permission(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        id: i64,
        agent: &str,
        what: &str,
        reason: &str,
        why: &str,
    ) {
        let mut places: Vec<String> =
            self.spec.bridges.iter().filter_map(|b| b.approvals.clone()).collect();
        places.sort();
        places.dedup();
        let reason = if reason.trim().is_empty() {
            "no reason given".into()
        } else {
            reason.trim().to_owned()
        };
        let text = format!(
            "[approval needed] #{id}: {agent} asks for {what} — \"{reason}\" ({why}). \
             Approvers: reply `/approve {id}` or `/deny {id} <why>`."
        );
        for channel in places {
            let key = PostKey::Origin(format!("flock/permission/{id}/{channel}"));
            if let Err((_, e)) =
                self.post_keyed(myself, &channel, "flock", &text, key, None, false).await
            {
                tracing::warn!("flock channels: permission #{id} not announced in #{channel}: {e}");
            }
        }
    }

    /// A person's decision on a permission request, through the router (the record and the
    /// messages to the requester commit together there): what was done, or why not.
    async fn decide_permission(
        &self,
        person: &str,
        command: &ApprovalCommand,
    ) -> Result<String, String> {
        let Some(router) = &self.router else { return Err("the router is not running".into()) };
        let arguments = json!({"id": command.id, "approve": command.approve,
                               "reason": command.reason})
        .to_string();
        let asked = ractor::call!(router, |reply| crate::router::RouterMsg::PermissionHuman {
            person: person.to_owned(),
            tool: "permission_decide".into(),
            arguments,
            reply,
        });
        match asked {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(refused)) => Err(refused.message),
            Err(e) => Err(format!("the router did not answer ({e})")),
        }
    }

    /// `flockctl bridge map|unmap` (a person through the control socket): `{bridge, external,
    /// channel, allow}` maps chat `external` to `channel` (replacing its mapping, if any);
    /// without `channel` the chat is unmapped. Kept in the store over the swarm file's
    /// mappings; the bridge is restarted to take it up (nothing is lost: cursors are durable).
    pub(super) async fn bridge_map(&mut self, caller: &str, arguments: &str) -> ToolResult {
        let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
        let bridge = str_arg(&args, "bridge").ok_or_else(|| bad("`bridge` is required"))?;
        let names: Vec<&str> = self.spec.bridges.iter().map(|b| b.name.as_str()).collect();
        let spec = self.bridge_spec(bridge).map_err(|(code, m)| {
            (
                code,
                format!(
                    "{m}; bridges: {}",
                    if names.is_empty() { "none".into() } else { names.join(", ") }
                ),
            )
        })?;
        let external = str_arg(&args, "external")
            .map(str::trim)
            .filter(|e| !e.is_empty() && e.len() <= 200 && !e.chars().any(char::is_control))
            .ok_or_else(|| bad("`external` is required: the platform's chat or channel id"))?
            .to_owned();
        let channel = match str_arg(&args, "channel").map(|c| c.trim().trim_start_matches('#')) {
            Some(c) if super::delta::valid_channel_id(c) => Some(c.to_owned()),
            Some(c) => {
                return Err(bad(format!(
                    "`{c}` is not a channel id: 1–63 of a-z, 0-9 and -, starting with a letter or digit"
                )));
            }
            None => None,
        };
        let allow: Option<Vec<String>> = match args.get("allow") {
            None | Some(Value::Null) => None,
            Some(Value::Array(ids)) => Some(
                ids.iter()
                    .map(|v| match v {
                        Value::String(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
                        Value::Number(n) => Ok(n.to_string()),
                        _ => Err(bad("`allow` holds platform user ids (text or numbers)")),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Some(_) => return Err(bad("`allow` is a list of platform user ids")),
        };
        let current = spec.channels.iter().find(|m| m.external == external);
        match (&channel, current) {
            (None, None) => {
                return Err(bad(format!("chat `{external}` is not mapped by bridge `{bridge}`")));
            }
            (Some(c), Some(m)) if m.flock == *c && m.allow == allow => {
                return Ok(json!({"bridge": bridge, "external": external, "channel": c,
                                 "changed": false})
                .to_string());
            }
            _ => {}
        }
        if channel.is_none() && spec.channels.len() == 1 {
            return Err(bad(format!(
                "chat `{external}` is the only mapping of bridge `{bridge}`: a bridge needs one; map another chat first, or remove the bridge from the swarm file"
            )));
        }
        let change = MappingChange {
            bridge: bridge.to_owned(),
            external: external.clone(),
            flock: channel.clone(),
            allow,
        };
        let (c, by) = (change.clone(), caller.to_owned());
        self.db(move |s| s.set_bridge_mapping(&c, &by)).await?;
        apply_mapping_changes(
            &mut Arc::make_mut(&mut self.spec).bridges,
            std::slice::from_ref(&change),
        );
        self.ensure_bridge_channels().await?;
        self.journal(
            JournalEvent::new(
                caller.to_owned(),
                if channel.is_some() { "BRIDGE_MAPPED" } else { "BRIDGE_UNMAPPED" },
                Status::Success,
                match &channel {
                    Some(c) => format!("bridge `{bridge}`: chat {external} ↔ #{c}"),
                    None => format!("bridge `{bridge}`: chat {external} unmapped"),
                },
            )
            .param("bridge", json!(bridge))
            .param("chat", json!(external))
            .param("channel", json!(channel)),
        );
        // The bridge takes its mappings up when it connects: restart it (a clean stop; its
        // keeper starts it again).
        if let Some(router) = &self.router {
            let _ = router.cast(crate::router::RouterMsg::StopBridge { bridge: bridge.to_owned() });
        }
        Ok(json!({"bridge": bridge, "external": external, "channel": channel, "changed": true})
            .to_string())
    }

    /// A channel was created in Flock: every bridge with `mirror_new_channels` that does not map
    /// it yet gets a pending mapping (`new:<channel>`) and is restarted; at start it makes the
    /// platform channel and answers `bridge__made`.
    pub(super) async fn mirror_new_channel(&mut self, channel: &str) {
        let bridges: Vec<String> = self
            .spec
            .bridges
            .iter()
            .filter(|b| b.mirror_new_channels && !b.channels.iter().any(|m| m.flock == channel))
            .map(|b| b.name.clone())
            .collect();
        for bridge in bridges {
            let change = MappingChange {
                bridge: bridge.clone(),
                external: format!("{PENDING_PREFIX}{channel}"),
                flock: Some(channel.to_owned()),
                allow: None,
            };
            let c = change.clone();
            if let Err((_, e)) = self.db(move |s| s.set_bridge_mapping(&c, "flock")).await {
                tracing::warn!("bridge `{bridge}`: cannot record #{channel} to mirror: {e}");
                continue;
            }
            apply_mapping_changes(
                &mut Arc::make_mut(&mut self.spec).bridges,
                std::slice::from_ref(&change),
            );
            if let Some(router) = &self.router {
                let _ = router.cast(crate::router::RouterMsg::StopBridge { bridge });
            }
        }
    }

    /// Journals a mapping the bridge itself made (`BRIDGE_MAPPED`, by `bridge:<name>`).
    fn journal_mapped(&self, bridge: &str, external: &str, channel: &str, what: &str) {
        self.journal(
            JournalEvent::new(
                format!("bridge:{bridge}"),
                "BRIDGE_MAPPED",
                Status::Success,
                format!("bridge `{bridge}`: {what}"),
            )
            .param("bridge", json!(bridge))
            .param("chat", json!(external))
            .param("channel", json!(channel)),
        );
    }

    /// `bridge__made {channel, external}`: the bridge made platform chat `external` for the
    /// pending mapping of `channel`; the mapping is now to it, from the channel's first post.
    async fn bridge_made(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let channel = str_arg(args, "channel").ok_or_else(|| bad("`channel` is required"))?;
        let external = str_arg(args, "external")
            .filter(|e| !e.is_empty() && !e.starts_with(PENDING_PREFIX))
            .ok_or_else(|| bad("`external` is required"))?
            .to_owned();
        let pending = format!("{PENDING_PREFIX}{channel}");
        let spec = self.bridge_spec(bridge)?;
        if !spec.channels.iter().any(|m| m.external == pending) {
            return Err(bad(format!("bridge `{bridge}` has no channel to make for #{channel}")));
        }
        let change = MappingChange {
            bridge: bridge.to_owned(),
            external: external.clone(),
            flock: Some(channel.to_owned()),
            allow: None,
        };
        let (b, c, ch) = (bridge.to_owned(), change.clone(), channel.to_owned());
        self.db(move |s| {
            s.drop_bridge_mapping(&b, &pending)?;
            s.set_bridge_mapping(&c, &format!("bridge:{b}"))?;
            // Every post of the new channel goes out, also those made before the chat was.
            s.bridge_cursor(&b, &c.external, &ch, 0).map(|_| ())
        })
        .await?;
        let bridges = &mut Arc::make_mut(&mut self.spec).bridges;
        let unpend = MappingChange {
            bridge: bridge.to_owned(),
            external: format!("{PENDING_PREFIX}{channel}"),
            flock: None,
            allow: None,
        };
        apply_mapping_changes(bridges, &[unpend, change]);
        self.journal_mapped(
            bridge,
            &external,
            channel,
            &format!("made chat {external} for #{channel}"),
        );
        Ok(json!({"channel": channel, "external": external}).to_string())
    }

    /// `bridge__edit {external, message_id, text}` (a person edited their message) or
    /// `{external, message_id, deleted: true}` (it was deleted): the post it became changes,
    /// and the bridges that relayed it follow. A message that never became a post (refused, or
    /// from before the mapping) is answered `found: false`.
    async fn bridge_edit(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        let message_id = match args.get("message_id") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => return Err(bad("`message_id` is required")),
        };
        let deleted = args.get("deleted").and_then(Value::as_bool) == Some(true);
        let text = match (deleted, str_arg(args, "text")) {
            (true, _) => None,
            (false, Some(t)) => Some(t.to_owned()),
            (false, None) => return Err(bad("`text` is required (or `deleted: true`)")),
        };
        let limit = flock_ipc::max_message_bytes(self.spec.delivery.max_frame_bytes);
        if let Some(t) = &text
            && t.len() > limit
        {
            return Err(bad(crate::router::too_long("the edited post", t.len(), limit)));
        }
        if self.channels.get(&channel).is_some_and(|c| c.state == ChannelState::Archived) {
            return Err(bad(format!("#{channel} is archived and read-only")));
        }
        let origin = format!("{bridge}/{external}/{message_id}");
        let found = self.db(move |s| s.bridge_edit(&origin, text.as_deref())).await?;
        let Some((posted_in, seq, changed)) = found else {
            return Ok(json!({"channel": channel, "found": false}).to_string());
        };
        if changed {
            self.wake_pulls(&posted_in).await;
        }
        Ok(json!({"channel": posted_in, "seq": seq, "found": true, "changed": changed,
                  "deleted": deleted})
        .to_string())
    }

    async fn bridge_pull(
        &mut self,
        bridge: &str,
        args: &Value,
    ) -> Result<Pulled, (ErrorCode, String)> {
        let (channel, external) = self.mapped(bridge, args)?;
        let (start, is_archived) = self
            .channels
            .get(&channel)
            .map_or((0, false), |c| (c.last_seq, c.state == ChannelState::Archived));
        let echo = format!("{bridge}/{external}/");
        let (b, c) = (bridge.to_owned(), channel.clone());
        let working_seqs: Vec<u64> =
            self.working.get(&channel).map(|w| w.iter().copied().collect()).unwrap_or_default();
        let (posts, cursor, upto, edits, edits_upto, mirrored, working) = self
            .db(move |s| {
                let cursor = s.bridge_cursor(&b, &external, &c, start)?;
                let (posts, upto) = s.bridge_pull(&c, cursor.seq, PULL_MAX, &echo)?;
                let (edits, edits_upto) =
                    s.bridge_edits(&b, &external, &c, cursor.edit_id, cursor.seq, PULL_MAX)?;
                let mirrored = is_archived && s.bridge_archive_mirrored(&b, &external)?;
                let working = working_seqs
                    .into_iter()
                    .map(|seq| Ok((seq, s.reply_target(&echo, &c, seq)?)))
                    .collect::<Result<Vec<_>, StoreError>>()?;
                Ok((posts, cursor, upto, edits, edits_upto, mirrored, working))
            })
            .await?;
        // Archived (nothing can be posted any more) and every post is behind the cursor.
        let archived = (is_archived && cursor.seq >= start).then_some(mirrored);
        Ok(Pulled {
            channel,
            posts,
            after: cursor.seq,
            upto,
            edits,
            edit_after: cursor.edit_id,
            edits_upto,
            archived,
            working,
        })
    }

    /// `bridge__archived {external}`: the bridge mirrored the channel's archive to the chat.
    async fn bridge_archived(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        if self.channels.get(&channel).is_none_or(|c| c.state != ChannelState::Archived) {
            return Err(bad(format!("#{channel} is not archived")));
        }
        let b = bridge.to_owned();
        self.db(move |s| s.bridge_mark_archived(&b, &external)).await?;
        Ok(json!({"channel": channel, "archived": true}).to_string())
    }

    fn pull_answer(&self, p: &Pulled) -> String {
        let posts: Vec<Value> = p
            .posts
            .iter()
            .map(|p| {
                let mut post = json!({"seq": p.seq, "author": p.author, "text": p.text});
                if let Some(id) = &p.reply_to {
                    post["reply_to"] = json!(id);
                }
                post
            })
            .collect();
        let working: Vec<Value> =
            p.working.iter().map(|(seq, id)| json!({"seq": seq, "reply_to": id})).collect();
        let edits: Vec<Value> = p
            .edits
            .iter()
            .map(|e| {
                json!({"seq": e.seq, "author": e.author, "text": e.text, "deleted": e.deleted,
                       "ids": e.ids})
            })
            .collect();
        let mut v = json!({"channel": p.channel, "posts": posts, "upto": p.upto,
                           "newest": self.newest(&p.channel), "edits": edits,
                           "edit_after": p.edit_after, "edits_upto": p.edits_upto,
                           "working": working});
        if let Some(mirrored) = p.archived {
            v["archived"] = json!(true);
            v["mirrored"] = json!(mirrored);
        }
        v.to_string()
    }

    /// `bridge__sent {external, seq, external_id}`: post `seq` (and all before it) reached the
    /// chat as message(s) `external_id`; `{external, edit}`: the changes up to edit id `edit`
    /// were made in the chat (with `seq` and `external_id` when the post's copy changed ids).
    async fn bridge_sent(&mut self, bridge: &str, args: &Value) -> ToolResult {
        let (channel, external) = self.mapped(bridge, args)?;
        let edit = args.get("edit").and_then(Value::as_u64).unwrap_or(0);
        let seq = match args.get("seq").and_then(Value::as_u64) {
            Some(seq) => seq,
            None if edit > 0 => 0,
            None => return Err(bad("`seq` is required")),
        };
        let last = self.channels.get(&channel).map_or(0, |c| c.last_seq);
        if seq > last {
            return Err(bad(format!("#{channel} has no post {seq} yet (its newest is {last})")));
        }
        let id = str_arg(args, "external_id").map(str::to_owned);
        let b = bridge.to_owned();
        let cursor =
            self.db(move |s| s.bridge_sent_upto(&b, &external, seq, edit, id.as_deref())).await?;
        Ok(json!({"channel": channel, "cursor": cursor}).to_string())
    }

    fn newest(&self, channel: &str) -> u64 {
        self.channels.get(channel).map_or(0, |c| c.last_seq)
    }

    /// A post landed in `channel`: answer the pulls parked on it.
    pub(super) async fn wake_pulls(&mut self, channel: &str) {
        let keys: Vec<(String, String)> = self
            .pulls
            .iter()
            .filter(|(_, p)| p.channel == channel)
            .map(|(k, _)| k.clone())
            .collect();
        for (bridge, external) in keys {
            let Some(parked) = self.pulls.remove(&(bridge.clone(), external.clone())) else {
                continue;
            };
            let args = json!({"external": external});
            let result = self.bridge_pull(&bridge, &args).await.map(|p| self.pull_answer(&p));
            parked.reply.send(result);
        }
    }

    /// The wait of a parked pull ran out: it answers with what there is (nothing new, most
    /// likely; the posts being worked on).
    pub(super) async fn pull_expired(
        &mut self,
        bridge: String,
        external: String,
        frame_id: flock_ipc::MsgId,
    ) {
        let key = (bridge, external);
        if self.pulls.get(&key).is_some_and(|p| p.reply.frame_id == frame_id)
            && let Some(parked) = self.pulls.remove(&key)
        {
            let args = json!({"external": key.1});
            let result = self.bridge_pull(&key.0, &args).await.map(|p| self.pull_answer(&p));
            parked.reply.send(result);
        }
    }
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
    /// A message from a platform (at most one per platform message).
    Origin(String),
}

/// What a pull found. Its answer: the posts, the highest seq they cover (`upto`: the cursor
/// may move there once they are delivered), the channel's newest seq (what is still waiting),
/// the edits to make to posts already delivered and the highest edit id they cover
/// (`edits_upto`), and, once the channel is archived and the cursor at its end, `archived` and
/// `mirrored`.
struct Pulled {
    channel: String,
    posts: Vec<BridgePost>,
    after: u64,
    upto: u64,
    edits: Vec<BridgeEdit>,
    edit_after: u64,
    edits_upto: u64,
    /// `Some(mirrored)`: archived, and nothing is left to send.
    archived: Option<bool>,
    /// People's posts a chain is working on: (seq, the platform message it is in this chat).
    working: Vec<(u64, Option<String>)>,
}

impl Pulled {
    /// Nothing new: no post and no edit was looked at.
    fn is_empty(&self) -> bool {
        self.upto == self.after && self.edits_upto == self.edit_after
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Durability;

    #[test]
    fn approval_commands_are_read_with_or_without_the_bots_name() {
        let cmd = |approve: bool, id: i64, reason: &str| {
            Some(ApprovalCommand { approve, id, reason: reason.into() })
        };
        assert_eq!(ApprovalCommand::parse("/approve 12"), cmd(true, 12, ""));
        assert_eq!(
            ApprovalCommand::parse("  /deny #3 not now, thanks "),
            cmd(false, 3, "not now, thanks")
        );
        assert_eq!(ApprovalCommand::parse("/Approve@flock_bot 7 ok"), cmd(true, 7, "ok"));
        for not in ["/approve", "/approve x", "approve 1", "please /approve 1", "/approved 1"] {
            assert_eq!(ApprovalCommand::parse(not), None, "{not}");
        }
    }

    fn team_row() -> ChannelRow {
        ChannelRow {
            id: "team".into(),
            name: "team".into(),
            topic: String::new(),
            created_by: "bridge:tg".into(),
            created_at: 0,
            state: ChannelState::Active,
            last_seq: 0,
            is_dm: false,
            members: Vec::new(),
            archiving_started_at: None,
            archive_deadline_at: None,
            ready: Vec::new(),
        }
    }

    fn store_with_channel() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("flock.db"), Durability::Normal).unwrap();
        store.create_channel(&team_row()).unwrap();
        (dir, store)
    }

    #[test]
    fn a_platform_message_is_posted_once_whatever_replays() {
        let (_dir, mut s) = store_with_channel();
        let a = s.post_with_origin("team", "human:telegram:alice", "hi", "tg/-1/7").unwrap();
        let b = s.post_with_origin("team", "human:telegram:alice", "hi", "tg/-1/7").unwrap();
        let c = s.post_with_origin("team", "human:telegram:alice", "again", "tg/-1/8").unwrap();
        assert_eq!((a, b, c), ((1, false), (1, true), (2, false)));
        // The same message id from another chat is another message.
        assert_eq!(s.post_with_origin("team", "x", "y", "tg/-2/7").unwrap(), (3, false));
    }

    #[test]
    fn a_mapping_pulls_from_its_cursor_without_its_own_chats_posts() {
        let (_dir, mut s) = store_with_channel();
        s.post_message("team", "worker", "before the bridge").unwrap();
        // A new mapping starts at the channel's newest post: no flood of history.
        assert_eq!(s.bridge_cursor("tg", "-1", "team", 1).unwrap().seq, 1);
        s.post_with_origin("team", "human:telegram:alice", "from -1", "tg/-1/5").unwrap();
        s.post_message("team", "worker", "answer").unwrap();
        s.post_with_origin("team", "human:telegram:bob", "from -2", "tg/-2/5").unwrap();
        let (posts, upto) = s.bridge_pull("team", 1, PULL_MAX, "tg/-1/").unwrap();
        let texts: Vec<&str> = posts.iter().map(|p| p.text.as_str()).collect();
        assert_eq!(texts, ["answer", "from -2"], "the chat's own post is not sent back");
        assert_eq!(upto, 4);
        // The cursor moves forward only, and the platform id is kept.
        assert_eq!(s.bridge_sent("tg", "-1", 3, Some("m-3")).unwrap(), 3);
        assert_eq!(s.bridge_sent("tg", "-1", 2, None).unwrap(), 3, "never back");
        assert_eq!(s.bridge_cursor("tg", "-1", "team", 0).unwrap().seq, 3, "kept across calls");
        let (posts, _) = s.bridge_pull("team", 3, PULL_MAX, "tg/-1/").unwrap();
        assert_eq!(posts.len(), 1);
        assert_eq!(posts[0].author, "human:telegram:bob");
        // What `bridge status` shows: one post waiting (bob's; alice's own is not sent back).
        let out = s.bridge_outbox("tg", "-1", "team").unwrap();
        assert_eq!(out, MappingOutbox { cursor: Some(3), newest: 4, waiting: 1, archived: false });
        s.post_with_origin("team", "human:telegram:carol", "from -1", "tg/-1/6").unwrap();
        assert_eq!(s.bridge_outbox("tg", "-1", "team").unwrap().waiting, 1, "own chat's post");
        let fresh = s.bridge_outbox("tg", "-9", "team").unwrap();
        assert_eq!(fresh, MappingOutbox { cursor: None, newest: 5, waiting: 0, archived: false });
    }

    #[test]
    fn an_edit_reaches_every_chat_that_got_the_post_but_its_own() {
        let (_dir, mut s) = store_with_channel();
        let cursor = |s: &mut Store, ext: &str| s.bridge_cursor("tg", ext, "team", 0).unwrap();
        cursor(&mut s, "-1");
        cursor(&mut s, "-2");
        let (seq, _) = s.post_with_origin("team", "human:telegram:alice", "hi", "tg/-1/7").unwrap();
        s.post_message("team", "worker", "answer").unwrap();
        // Chat -2 got both posts (the second as two messages); chat -1 only the answer.
        s.bridge_sent("tg", "-2", 1, Some("20")).unwrap();
        s.bridge_sent("tg", "-2", 2, Some("21 22")).unwrap();
        s.bridge_sent("tg", "-1", 2, Some("11")).unwrap();
        // An edit of a message nobody posted changes nothing.
        assert_eq!(s.bridge_edit("tg/-1/99", Some("x")).unwrap(), None);
        assert_eq!(
            s.bridge_edit("tg/-1/7", Some("hello")).unwrap(),
            Some(("team".into(), seq, true))
        );
        assert_eq!(
            s.bridge_edit("tg/-1/7", Some("hello")).unwrap(),
            Some(("team".into(), seq, false)),
            "a replayed edit changes nothing"
        );
        // Readers see the post as it is now.
        let shown = s.messages_after("team", 0, 10).unwrap();
        assert_eq!(shown[0].text, "hello (edited)");
        let c2 = cursor(&mut s, "-2");
        let (edits, upto) = s.bridge_edits("tg", "-2", "team", c2.edit_id, c2.seq, 50).unwrap();
        assert_eq!(upto, 1);
        assert_eq!(
            edits,
            [BridgeEdit {
                seq,
                author: "human:telegram:alice".into(),
                text: "hello".into(),
                deleted: false,
                ids: vec!["20".into()],
            }]
        );
        // The chat where the person edited shows it already.
        let c1 = cursor(&mut s, "-1");
        let (edits, upto) = s.bridge_edits("tg", "-1", "team", c1.edit_id, c1.seq, 50).unwrap();
        assert_eq!((edits.len(), upto), (0, 1));
        // Two changes of one post since the cursor: one edit, with the text of now.
        assert_eq!(s.bridge_edit("tg/-1/7", None).unwrap(), Some(("team".into(), seq, true)));
        assert_eq!(s.bridge_edit("tg/-1/7", Some("back")).unwrap().map(|e| e.2), Some(false));
        let (edits, upto) = s.bridge_edits("tg", "-2", "team", 0, c2.seq, 50).unwrap();
        assert_eq!(upto, 2);
        assert_eq!(edits.len(), 1);
        assert!(edits[0].deleted && edits[0].text.is_empty(), "the words are gone from disk");
        assert_eq!(s.messages_after("team", 0, 10).unwrap()[0].text, "(deleted by its author)");
        // The edit cursor moves forward only; a mapping made later starts after the last edit.
        s.bridge_sent_upto("tg", "-2", 0, 2, None).unwrap();
        s.bridge_sent_upto("tg", "-2", 0, 1, None).unwrap();
        assert_eq!(cursor(&mut s, "-2"), BridgeCursor { seq: 2, edit_id: 2 });
        assert_eq!(cursor(&mut s, "-3").edit_id, 2);
        // Chat -2 mapped to another channel: it starts afresh there, with no ids of #team's.
        s.create_channel(&ChannelRow { id: "ops".into(), name: "ops".into(), ..team_row() })
            .unwrap();
        s.post_message("ops", "worker", "o-1").unwrap();
        let moved = s.bridge_cursor("tg", "-2", "ops", 1).unwrap();
        assert_eq!(moved, BridgeCursor { seq: 1, edit_id: 0 });
        let (edits, _) = s.bridge_edits("tg", "-2", "ops", 0, 1, 50).unwrap();
        assert!(edits.is_empty());
        let ids: i64 = s
            .conn
            .query_row("SELECT COUNT(*) FROM bridge_messages WHERE external = '-2'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(ids, 0, "the platform ids of #team's posts are gone with the old mapping");
        // A deleted post is never sent to a chat that did not get it yet.
        let (posts, upto) = s.bridge_pull("team", 0, PULL_MAX, "tg/-9/").unwrap();
        assert_eq!((posts.len(), upto), (1, 2), "only the answer");
    }

    #[test]
    fn a_mirrored_archive_is_recorded_once_per_mapping() {
        let (_dir, mut s) = store_with_channel();
        assert!(!s.bridge_archive_mirrored("tg", "-1").unwrap(), "no cursor yet");
        s.bridge_cursor("tg", "-1", "team", 0).unwrap();
        s.bridge_cursor("tg", "-2", "team", 0).unwrap();
        assert!(!s.bridge_archive_mirrored("tg", "-1").unwrap());
        s.bridge_mark_archived("tg", "-1").unwrap();
        s.bridge_mark_archived("tg", "-1").unwrap();
        assert!(s.bridge_archive_mirrored("tg", "-1").unwrap());
        assert!(!s.bridge_archive_mirrored("tg", "-2").unwrap(), "per mapping");
        assert!(s.bridge_outbox("tg", "-1", "team").unwrap().archived);
        assert!(!s.bridge_outbox("tg", "-2", "team").unwrap().archived);
        assert!(!s.bridge_outbox("tg", "-9", "team").unwrap().archived);
    }

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

    #[test]
    fn a_person_never_gets_an_agents_name() {
        assert_eq!(human_author("telegram", "Alice Smith", "42"), "human:telegram:alice-smith");
        assert_eq!(human_author("telegram", "", "42"), "human:telegram:42");
        assert_eq!(human_author("discord", "!!!", ""), "human:discord:unknown");
        assert_eq!(human_author("slack", "worker-1", "U1"), "human:slack:worker-1");
        assert!(human_author("slack", &"x".repeat(500), "U1").len() < 60);
    }
}
