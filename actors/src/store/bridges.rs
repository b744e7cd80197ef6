//! Bridge tables in SQLite (their migrations are in `schema.rs`): where each mapping's cursor
//! stands, which platform message each post became, people's edits, mappings changed at run
//! time. These run inside the store actor, the only writer; `channels::bridge` holds the rules.

use rusqlite::{OptionalExtension, params};

use crate::store::channels::UniqueKey;
use crate::store::{Store, StoreError, now_ms};

/// A mapping made or removed at run time: chat `external` of `bridge` now goes to channel
/// `flock` (with who may post), or (`flock: None`) to none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingChange {
    pub bridge: String,
    pub external: String,
    pub flock: Option<String>,
    pub allow: Option<Vec<String>>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channels::bridge::PULL_MAX;
    use crate::store::Durability;
    use crate::store::channels::{ChannelRow, ChannelState};

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
}
