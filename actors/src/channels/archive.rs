//! The archive protocol (DESIGN.md §8): a channel asked to archive waits for its members to say
//! they are ready (or for its deadline), then is archived for good; sessions on it are closed.

use std::time::Duration;

use flock_ipc::ErrorCode;
use ractor::ActorRef;
use serde_json::json;

use super::state::{ChannelsState, PostKey, internal, iso};
use crate::caller::Caller;
use crate::journal::{JournalEvent, Status};
use crate::messages::{ChannelsMsg, RouterMsg};
use crate::store::channels::ChannelState;
use crate::store::now_ms;

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
