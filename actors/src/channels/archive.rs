//! The archive protocol (DESIGN.md §8): a channel asked to archive waits for its members to say
//! they are ready (or for its deadline), then is archived for good; sessions on it are closed.

use std::time::Duration;

use flock_ipc::ErrorCode;
use flock_ipc::channel::{QUIET_NOTICE, SYSTEM_AUTHOR};
use ractor::ActorRef;
use serde_json::json;

use super::state::{ChannelsState, PostKey, internal, iso};
use crate::caller::Caller;
use crate::messages::{ChannelsMsg, RouterMsg};
use crate::store::channels::ChannelState;
use crate::store::now_ms;
use flock_journal::{JournalEvent, Status};

impl ChannelsState {
    pub(super) async fn start_archive(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        caller: &Caller,
        channel: &str,
    ) -> Result<(), (ErrorCode, String)> {
        let started = now_ms();
        let deadline = started + (self.spec.channels.archive_deadline_secs as i64) * 1000;
        let c = channel.to_owned();
        self.db(move |s| {
            s.set_channel_state(&c, ChannelState::Archiving, Some(started), Some(deadline))
        })
        .await?;
        let agents: Vec<String> = {
            let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
            ch.state = ChannelState::Archiving;
            ch.archiving_started_at = Some(started);
            ch.archive_deadline_at = Some(deadline);
            ch.ready.clear();
            if ch.members.contains(&caller.id) && caller.role.is_some() {
                ch.ready.push(caller.id.clone()); // whoever starts the archive is ready
            }
            ch.members.iter().filter(|m| !m.starts_with("human:")).cloned().collect()
        };
        if caller.role.is_some() && agents.contains(&caller.id) {
            let (c, who) = (channel.to_owned(), caller.id.clone());
            self.db(move |s| s.mark_archive_ready(&c, &who)).await?;
        }
        self.journal(
            JournalEvent::new(
                &caller.id,
                "CHANNEL_ARCHIVE_START",
                Status::InProgress,
                format!("archiving #{channel}; deadline {}", iso(deadline)),
            )
            .param("channel", json!(channel))
            .param("members", json!(agents)),
        );
        // The notice mentions every agent member, so sleeping and REACTIVE members wake for it.
        let roll: Vec<String> =
            agents.iter().filter(|a| **a != caller.id).map(|a| format!("@{a}")).collect();
        let notice = format!(
            "{ARCHIVE_NOTICE}#{channel} is being archived. {} please review the history, write what you learned to memory, update your card (flock_update_card), then call flock_archive_ready(channel=\"{channel}\"). Deadline: {}.",
            roll.join(" "),
            iso(deadline),
            ARCHIVE_NOTICE = flock_ipc::channel::ARCHIVE_NOTICE
        );
        // A notice, not the person's words: nobody is asked to answer it.
        self.post_keyed(myself, channel, &caller.id, &notice, PostKey::None, None, false).await?;
        let wait = Duration::from_millis((deadline - started).max(0) as u64);
        let ch = channel.to_owned();
        myself.send_after(wait, move || ChannelsMsg::ArchiveDeadline { channel: ch });
        self.evaluate_archive(channel).await;
        Ok(())
    }

    /// Archives the channel once every agent member is ready.
    pub(super) async fn evaluate_archive(&mut self, channel: &str) {
        let Some(ch) = self.channels.get(channel) else { return };
        if ch.state != ChannelState::Archiving {
            return;
        }
        let all_ready =
            ch.members.iter().filter(|m| self.is_agent(m)).all(|m| ch.ready.contains(m));
        if all_ready {
            let _ = self.archive_now(channel, "every member is ready").await;
        }
    }

    pub(super) async fn archive_deadline(&mut self, channel: &str) {
        let Some(ch) = self.channels.get(channel) else { return };
        if ch.state != ChannelState::Archiving
            || ch.archive_deadline_at.is_some_and(|d| d > now_ms() + 50)
        {
            return;
        }
        let missing: Vec<String> = ch
            .members
            .iter()
            .filter(|m| self.is_agent(m) && !ch.ready.contains(m))
            .cloned()
            .collect();
        let reason = format!(
            "deadline passed; not ready: {}",
            if missing.is_empty() { "nobody".into() } else { missing.join(", ") }
        );
        let _ = self.archive_now(channel, &reason).await;
    }

    /// Notes a post in `channel` (`None`: the supervisor started) and arms the channel's quiet
    /// timer (`channels.quiet_secs`) if it is an active channel an agent opened and none is armed:
    /// one timer per channel, however busy. Flock's own quiet notice starts no new spell.
    pub(super) fn quiet_arm(
        &mut self,
        myself: &ActorRef<ChannelsMsg>,
        channel: &str,
        post: Option<(&str, &str)>,
    ) {
        let secs = self.spec.channels.quiet_secs;
        if secs == 0 {
            return;
        }
        if post.is_some_and(|(a, t)| a == SYSTEM_AUTHOR && t.starts_with(QUIET_NOTICE)) {
            self.last_post_at.remove(channel);
            return;
        }
        let Some(ch) = self.channels.get(channel) else { return };
        if ch.is_dm || ch.state != ChannelState::Active || !self.is_agent(&ch.created_by) {
            return;
        }
        self.last_post_at.insert(channel.to_owned(), now_ms());
        if self.quiet_armed.insert(channel.to_owned()) {
            let c = channel.to_owned();
            myself.send_after(Duration::from_secs(secs), move || ChannelsMsg::Quiet { channel: c });
        }
    }

    /// A quiet timer fired: if the channel has had no post for `channels.quiet_secs`, its opener
    /// is told with a `[quiet]` notice that @mentions it (once per quiet spell); otherwise the
    /// timer waits for the rest of the spell.
    pub(super) async fn quiet(&mut self, myself: &ActorRef<ChannelsMsg>, channel: &str) {
        self.quiet_armed.remove(channel);
        let secs = self.spec.channels.quiet_secs;
        let (Some(&last), Some(ch)) = (self.last_post_at.get(channel), self.channels.get(channel))
        else {
            return;
        };
        if ch.state != ChannelState::Active {
            self.last_post_at.remove(channel);
            return;
        }
        let (due, now) = (last + secs as i64 * 1000, now_ms());
        if now + 50 < due {
            self.quiet_armed.insert(channel.to_owned());
            let (c, wait) = (channel.to_owned(), Duration::from_millis((due - now) as u64));
            myself.send_after(wait, move || ChannelsMsg::Quiet { channel: c });
            return;
        }
        let opener = ch.created_by.clone();
        let spell = if secs.is_multiple_of(60) {
            format!("{} min", secs / 60)
        } else {
            format!("{secs} s")
        };
        let notice = format!(
            "{QUIET_NOTICE}#{channel} has had no post for {spell}. @{opener}: wrap it up with what is here."
        );
        match self
            .post_keyed(myself, channel, SYSTEM_AUTHOR, &notice, PostKey::None, None, false)
            .await
        {
            Ok(_) => self.journal(
                JournalEvent::new(
                    SYSTEM_AUTHOR,
                    "CHANNEL_QUIET",
                    Status::Success,
                    format!("#{channel}: no post for {spell}; @{opener} told"),
                )
                .param("channel", json!(channel))
                .param("opener", json!(opener)),
            ),
            Err((_, e)) => tracing::warn!(channel, error = %e, "flock: quiet notice not posted"),
        }
    }

    pub(super) async fn archive_now(
        &mut self,
        channel: &str,
        reason: &str,
    ) -> Result<(), (ErrorCode, String)> {
        let c = channel.to_owned();
        self.db(move |s| s.set_channel_state(&c, ChannelState::Archived, None, None)).await?;
        let ch = self.channels.get_mut(channel).ok_or_else(|| internal("channel vanished"))?;
        ch.state = ChannelState::Archived;
        let (ready, members) = (ch.ready.clone(), ch.members.clone());
        let not_ready: Vec<&String> =
            members.iter().filter(|m| !m.starts_with("human:") && !ready.contains(m)).collect();
        let not_ready: Vec<String> = not_ready.into_iter().cloned().collect();
        self.journal(
            JournalEvent::new(
                "flock",
                "CHANNEL_ARCHIVED",
                Status::Success,
                format!("#{channel} archived: {reason}"),
            )
            .param("channel", json!(channel))
            .param("ready", json!(ready))
            .param("not_ready", json!(not_ready)),
        );
        let agents: Vec<String> = members.iter().filter(|m| self.is_agent(m)).cloned().collect();
        let (c, a) = (channel.to_owned(), agents.clone());
        self.db(move |s| s.close_sessions(&c, &a)).await?;
        if let Some(router) = &self.router {
            for m in members.iter().filter(|m| self.is_agent(m)) {
                let _ = router.cast(RouterMsg::SessionClosed {
                    agent: m.clone(),
                    channel: channel.to_owned(),
                });
            }
        }
        // Bridges waiting on this channel learn it is archived (see `bridge__pull`).
        self.wake_pulls(channel).await;
        Ok(())
    }
}
