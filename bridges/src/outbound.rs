//! Out: per mapping, posts pulled after the mapping's durable cursor are sent to the chat
//! (in parts where a platform's limit asks for it), then confirmed (`bridge__sent`); edits and
//! deletions follow; an archived channel is mirrored; a chain working on a person's post shows.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::discord::{self};
use crate::link::CallError;
use crate::{
    Chat, ECHO_MAX, MAX_BACKOFF, PULL_WAIT_MS, PlatformError, Refused, Relay, WORKING_REACTION,
    Working, archive_notice, echo_key,
};

impl Relay {
    /// Flock → platform, for one mapped chat.
    pub(super) async fn outbound(self: Arc<Self>, external: String) {
        // What the chat shows as being worked on; a task of its own keeps it shown.
        let (working, shown) = tokio::sync::watch::channel(Working::new());
        tokio::spawn(self.clone().show_working(external.clone(), shown));
        let thread = self
            .spec
            .channels
            .iter()
            .find(|m| m.external == external)
            .is_none_or(|m| m.replies == flock_config::Replies::Thread);
        loop {
            if self.link.stopping() {
                return;
            }
            let seqs: Vec<u64> = working.borrow().iter().map(|(seq, _)| *seq).collect();
            let args = json!({"external": external, "wait_ms": PULL_WAIT_MS, "working": seqs});
            let pulled = self.link.call_json("bridge__pull", args).await;
            let page = match pulled {
                Ok(v) => v,
                Err(CallError::Gone) => return,
                Err(CallError::Refused(why)) => {
                    tracing::warn!("flock-bridge: pull for chat {external} refused: {why}");
                    self.mapping_broken(&external, Some(&why));
                    self.set_state("broken", Some(why));
                    tokio::time::sleep(MAX_BACKOFF).await;
                    continue;
                }
            };
            self.mapping_broken(&external, None);
            let now: Working = page["working"]
                .as_array()
                .map(|w| {
                    w.iter()
                        .filter_map(|w| {
                            Some((w["seq"].as_u64()?, w["reply_to"].as_str().map(str::to_owned)))
                        })
                        .collect()
                })
                .unwrap_or_default();
            working.send_if_modified(|w| {
                let changed = *w != now;
                *w = now;
                changed
            });
            let posts = page["posts"].as_array().cloned().unwrap_or_default();
            let upto = page["upto"].as_u64().unwrap_or(0);
            let newest = page["newest"].as_u64().unwrap_or(upto);
            let mut done = 0;
            for post in &posts {
                if self.link.stopping() {
                    return;
                }
                let seq = post["seq"].as_u64().unwrap_or(0);
                self.outbox_is(&external, newest.saturating_sub(done.max(seq.saturating_sub(1))));
                let author = post["author"].as_str().unwrap_or("?");
                let text = post["text"].as_str().unwrap_or_default();
                let reply_to = post["reply_to"].as_str().filter(|_| thread);
                let Some(id) = self.deliver(&external, author, text, reply_to).await else {
                    return;
                };
                // An answer whose question is no longer worked on: its "working" mark goes (a
                // bridge restarted meanwhile does not know it put one there).
                if let (Chat::Slack(slack), Some(asked)) = (&self.chat, post["reply_to"].as_str())
                    && !working.borrow().iter().any(|(_, id)| id.as_deref() == Some(asked))
                    && let Err(e) = slack.react(&external, asked, WORKING_REACTION, false).await
                {
                    tracing::debug!(
                        "flock-bridge: chat {external}: mark on {asked} not taken off: {e}"
                    );
                }
                let sent = json!({"external": external, "seq": seq, "external_id": id});
                if self.link.call("bridge__sent", sent).await.is_err() {
                    return;
                }
                self.stats.outbound.fetch_add(1, Ordering::Relaxed);
                tracing::info!(seq, author = %author, chat = %external, "out: seq {seq} by {author} → chat {external} message {id}");
                done = seq;
            }
            let edits = page["edits"].as_array().cloned().unwrap_or_default();
            let edits_upto = page["edits_upto"].as_u64().unwrap_or(0);
            if edits_upto > page["edit_after"].as_u64().unwrap_or(0) {
                for edit in &edits {
                    let Some(changed) = self.follow_edit(&external, edit).await else { return };
                    if let Some(ids) = changed {
                        let seq = edit["seq"].as_u64().unwrap_or(0);
                        let sent = json!({"external": external, "seq": seq, "external_id": ids,
                                          "edit": 0});
                        if self.link.call("bridge__sent", sent).await.is_err() {
                            return;
                        }
                    }
                }
                let sent = json!({"external": external, "edit": edits_upto});
                if self.link.call("bridge__sent", sent).await.is_err() {
                    return;
                }
            }
            // Posts that were this chat's own (not sent back): move the cursor past them.
            if upto > done {
                let sent = json!({"external": external, "seq": upto});
                if self.link.call("bridge__sent", sent).await.is_err() {
                    return;
                }
            }
            self.outbox_is(&external, newest.saturating_sub(upto));
            if page["archived"].as_bool() == Some(true) {
                // Every post before the archive went out: mirror it, once, and stop here.
                self.archived.lock().unwrap_or_else(|p| p.into_inner()).insert(external.clone());
                let channel = page["channel"].as_str().unwrap_or("?");
                if page["mirrored"].as_bool() != Some(true)
                    && !self.mirror_archive(&external, channel).await
                {
                    return;
                }
                tracing::info!(
                    "#{channel} is archived: nothing more is relayed with chat {external}"
                );
                return;
            }
        }
    }

    /// Keeps chat `external` showing that the swarm works on what people asked there, while it
    /// does: the typing indicator, refreshed before it fades (Telegram, Discord), or a reaction
    /// on each message being worked on, taken off when it is answered (Slack). A failure to show
    /// it is logged and passed over: it never holds up a message.
    pub(super) async fn show_working(
        self: Arc<Self>,
        external: String,
        mut working: tokio::sync::watch::Receiver<Working>,
    ) {
        let mut marked: HashSet<String> = HashSet::new();
        loop {
            let now: Working = working.borrow_and_update().clone();
            if let Chat::Slack(slack) = &self.chat {
                let ids: HashSet<String> = now.iter().filter_map(|(_, id)| id.clone()).collect();
                for (id, on) in ids
                    .difference(&marked)
                    .map(|id| (id.clone(), true))
                    .chain(marked.difference(&ids).map(|id| (id.clone(), false)))
                    .collect::<Vec<_>>()
                {
                    match slack.react(&external, &id, WORKING_REACTION, on).await {
                        Ok(()) if on => drop(marked.insert(id)),
                        Ok(()) => drop(marked.remove(&id)),
                        Err(e) => tracing::warn!(
                            "flock-bridge: chat {external}: cannot mark message {id} as worked on: {e}"
                        ),
                    }
                }
            }
            let wait = match self.chat.typing_every() {
                Some(every) if !now.is_empty() => {
                    if let Err(e) = self.chat.typing(&external).await {
                        tracing::debug!("flock-bridge: chat {external}: typing not shown: {e}");
                    }
                    Some(every)
                }
                _ => None,
            };
            let changed = match wait {
                Some(every) => {
                    tokio::select! {
                        _ = tokio::time::sleep(every) => Ok(()),
                        c = working.changed() => c,
                    }
                }
                None => working.changed().await,
            };
            // The outbound loop ended (the bridge stops, or the channel was archived).
            if changed.is_err() || self.link.stopping() {
                return;
            }
        }
    }

    /// Mirrors the archive of `channel` to chat `external` and records it; `false` if the bridge
    /// stopped first. Slack archives the conversation; Telegram and Discord, whose bot APIs
    /// cannot, get a final notice. A refusal is reported on the mapping and retried every half
    /// minute, like a post.
    pub(super) async fn mirror_archive(&self, external: &str, channel: &str) -> bool {
        match &self.chat {
            Chat::Slack(slack) => {
                let archived = self
                    .platform_call(external, "archiving the chat", Refused::Broken, || {
                        slack.archive(external)
                    })
                    .await;
                if archived.is_none() {
                    return false;
                }
                tracing::info!("archived chat {external}: #{channel} was archived in Flock");
            }
            Chat::Telegram(_) | Chat::Discord(_) => {
                let notice = archive_notice(channel);
                if self.deliver(external, "flock", &notice, None).await.is_none() {
                    return false;
                }
                tracing::info!("out: archive notice of #{channel} → chat {external}");
                // A Discord server can show the archive too: the channel goes into the archive
                // category, read-only. Without the permissions for it the notice stands alone.
                if let Chat::Discord(discord) = &self.chat {
                    let archived = self
                        .platform_call(external, "archiving the channel", Refused::PassOver, || {
                            discord.archive(external)
                        })
                        .await;
                    match archived {
                        None => return false,
                        Some(Some(())) => tracing::info!(
                            "archived channel {external}: moved into \"{}\", read-only",
                            discord::ARCHIVE_CATEGORY
                        ),
                        Some(None) => {}
                    }
                }
            }
        }
        match self.link.call("bridge__archived", json!({"external": external})).await {
            Ok(_) => true,
            Err(CallError::Gone) => false,
            Err(CallError::Refused(why)) => {
                tracing::warn!(
                    "flock-bridge: the archive of chat {external} was not recorded: {why}"
                );
                false
            }
        }
    }

    /// Makes a post's change in chat `external`: its copy (messages `ids`) is edited to the
    /// post's text now, or deleted. `None` if the bridge is stopping; `Some(Some(ids))` when the
    /// copy is now other messages (it needed more or fewer pieces than before). A message the
    /// chat no longer has (deleted there, or sent by a webhook since replaced) is passed over.
    pub(super) async fn follow_edit(&self, external: &str, edit: &Value) -> Option<Option<String>> {
        let ids: Vec<&str> = edit["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let author = edit["author"].as_str().unwrap_or("?");
        let seq = edit["seq"].as_u64().unwrap_or(0);
        if edit["deleted"].as_bool() == Some(true) {
            self.delete_messages(external, &ids).await?;
            tracing::info!(seq, chat = %external, "out: seq {seq} deleted → chat {external}");
            return Some(None);
        }
        let parts = self.chat.messages(author, edit["text"].as_str().unwrap_or_default());
        let mut now: Vec<String> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            match ids.get(i) {
                Some(id) => {
                    let shown = self
                        .platform_call(
                            external,
                            &format!("editing message {id}"),
                            Refused::PassOver,
                            || self.chat.edit(external, id, author, part),
                        )
                        .await?;
                    if let Some(shown) = shown {
                        self.remember_sent(external, &shown);
                    }
                    now.push((*id).to_owned());
                }
                // The edit is longer than the copy: the rest follows as new messages.
                None => {
                    let rest = parts[i..].to_vec();
                    let sent = self.deliver_parts(external, author, rest, None).await?;
                    now.extend(sent.split(' ').map(str::to_owned));
                    break;
                }
            }
        }
        // Shorter: the pieces left over go.
        self.delete_messages(external, ids.get(parts.len()..).unwrap_or_default()).await?;
        tracing::info!(seq, chat = %external, "out: seq {seq} edited → chat {external}");
        let same = now.len() == ids.len();
        Some((!same).then(|| now.join(" ")))
    }

    /// Deletes our messages `ids` in chat `external` (one already gone is passed over); `None`
    /// if the bridge is stopping.
    pub(super) async fn delete_messages(&self, external: &str, ids: &[&str]) -> Option<()> {
        for id in ids {
            let doing = format!("deleting message {id}");
            self.platform_call(external, &doing, Refused::PassOver, || {
                self.chat.delete(external, id)
            })
            .await?;
        }
        Some(())
    }

    /// One platform call for chat `external`, until it is done: rate limits are waited out and
    /// transient failures retried with backoff (0.5 s doubling to 30 s); a refusal either
    /// passes the call over (`Some(None)`) or marks the mapping broken and tries again every
    /// half minute, as `on_refusal` says. `None` if the bridge is stopping.
    pub(super) async fn platform_call<T, F, Fut>(
        &self,
        external: &str,
        doing: &str,
        on_refusal: Refused,
        call: F,
    ) -> Option<Option<T>>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, PlatformError>>,
    {
        let mut backoff = Duration::from_millis(500);
        loop {
            match call().await {
                Ok(t) => {
                    if on_refusal == Refused::Broken {
                        self.mapping_broken(external, None);
                    }
                    self.set_state("connected", None);
                    return Some(Some(t));
                }
                Err(PlatformError::RateLimited(d)) => {
                    self.set_state(&format!("rate-limited for {} s", d.as_secs()), None);
                    tokio::time::sleep(d).await;
                }
                Err(e @ (PlatformError::Permanent(_) | PlatformError::Fatal(_))) => {
                    if on_refusal == Refused::PassOver {
                        tracing::warn!("flock-bridge: chat {external}: {doing}: {e}; passed over");
                        return Some(None);
                    }
                    tracing::warn!("flock-bridge: chat {external} refuses {doing}: {e}");
                    self.mapping_broken(external, Some(&e.to_string()));
                    self.set_state(&format!("broken: chat {external}"), Some(e.to_string()));
                    tokio::time::sleep(MAX_BACKOFF).await;
                }
                Err(PlatformError::Transient(e)) => {
                    self.set_state("reconnecting", Some(e));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
            if self.link.stopping() {
                return None;
            }
        }
    }

    /// Sends one post (in as many messages as it takes); `None` if the bridge is stopping.
    /// A post is never skipped: rate limits are waited out, failures retried with backoff, and
    /// a chat that refuses us is reported broken and retried every half minute.
    /// Returns the platform ids of its messages, separated by spaces.
    pub(super) async fn deliver(
        &self,
        external: &str,
        author: &str,
        text: &str,
        reply_to: Option<&str>,
    ) -> Option<String> {
        self.deliver_parts(external, author, self.chat.messages(author, text), reply_to).await
    }

    /// [`Relay::deliver`] of a post already cut into the platform's messages; the first one
    /// replies to `reply_to`, if given (the rest follow it).
    pub(super) async fn deliver_parts(
        &self,
        external: &str,
        author: &str,
        parts: Vec<String>,
        reply_to: Option<&str>,
    ) -> Option<String> {
        let mut ids: Vec<String> = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            let reply_to = reply_to.filter(|_| i == 0);
            // A post is never passed over: `Broken` retries until the chat takes it.
            let sent = self
                .platform_call(external, "posts", Refused::Broken, || {
                    self.chat.send(external, author, part, reply_to)
                })
                .await?;
            if let Some((id, shown)) = sent {
                self.remember_sent(external, &shown);
                ids.push(id);
            }
        }
        Some(ids.join(" "))
    }

    /// Mapping `external` is broken (`Some(why)`) or works again (`None`); reported if it changed.
    pub(super) fn mapping_broken(&self, external: &str, why: Option<&str>) {
        let changed = {
            let mut broken = self.stats.broken.lock().unwrap_or_else(|p| p.into_inner());
            match why {
                Some(w) => broken.insert(external.to_owned(), w.to_owned()).as_deref() != Some(w),
                None => broken.remove(external).is_some(),
            }
        };
        if changed {
            self.report();
        }
    }

    pub(super) fn outbox_is(&self, external: &str, n: u64) {
        let before = self
            .stats
            .outbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(external.to_owned(), n);
        if before != Some(n) {
            self.report();
        }
    }

    pub(super) fn remember_sent(&self, external: &str, rendered: &str) {
        let mut echoes = self.echoes.lock().unwrap_or_else(|p| p.into_inner());
        echoes.push_back((Instant::now(), echo_key(external, rendered)));
        while echoes.len() > ECHO_MAX {
            echoes.pop_front();
        }
    }
}
