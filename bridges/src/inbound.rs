//! In: a person's message on a platform becomes a post in its mapped channel, exactly once
//! (`bridge__post`), or an edit of one (`bridge__edit`) — after the rate limit, the echo check
//! and the approver commands.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::discord::{self};
use crate::link::CallError;
use crate::slack;
use crate::{
    Change, Chat, ECHO_TTL, EXIT_CONFIG, Inbound, MAX_BACKOFF, PlatformError, Relay, echo_key,
};

impl Relay {
    /// Runs serenity's gateway; a refused intent or token is fatal (exit 78), anything else
    /// exits the process (the supervisor restarts it).
    pub(super) async fn discord_gateway(self: Arc<Self>, mut client: serenity::Client) {
        use serenity::gateway::GatewayError;
        let err = match client.start().await {
            Ok(()) => return,
            Err(e) => e,
        };
        let (fatal, why) = match &err {
            serenity::Error::Gateway(GatewayError::DisallowedGatewayIntents) => (
                true,
                "Discord refused the gateway intents (close 4014): enable \"Message Content Intent\" for the bot in the Developer Portal (Bot → Privileged Gateway Intents)".to_owned(),
            ),
            serenity::Error::Gateway(GatewayError::InvalidGatewayIntents) => {
                (true, "Discord says the gateway intents are invalid (close 4013)".to_owned())
            }
            serenity::Error::Gateway(GatewayError::InvalidAuthentication) => (
                true,
                "Discord refused the bot token on the gateway (close 4004): check the variable `token_env` names".to_owned(),
            ),
            other => (false, format!("the Discord gateway stopped: {other}")),
        };
        self.set_state("failed", Some(why.clone()));
        tracing::error!("flock-bridge: error: {why}");
        // Let the status reach the router before the process ends.
        tokio::time::sleep(Duration::from_millis(200)).await;
        std::process::exit(if fatal { i32::from(EXIT_CONFIG) } else { 1 });
    }

    /// Discord → Flock: people's messages in gateway order; on each (re)connection, first what
    /// was written while the bridge was away (history after the newest message brought in).
    pub(super) async fn discord_inbound(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<discord::Event>,
    ) {
        let Chat::Discord(discord) = &self.chat else { return };
        let mut events = Vec::new();
        while rx.recv_many(&mut events, 256).await > 0 {
            // serenity runs each handler call as its own task, so messages of one burst may be
            // queued out of order: put them back in Discord's order (ids are time-ordered).
            let mut batch: Vec<discord::Event> = std::mem::take(&mut events);
            batch.sort_by_key(|e| match e {
                discord::Event::Ready => (0, 0),
                discord::Event::Message(m) => (1, m.message_id.parse::<u64>().unwrap_or(u64::MAX)),
            });
            for event in batch {
                match event {
                    discord::Event::Ready => {
                        self.set_state("connected", None);
                        for m in self.spec.channels.clone() {
                            let last = match self
                                .link
                                .call_json("bridge__last", json!({"external": m.external}))
                                .await
                            {
                                Ok(v) => {
                                    v["message_id"].as_str().and_then(|s| s.parse::<u64>().ok())
                                }
                                Err(CallError::Gone) => return,
                                Err(CallError::Refused(_)) => None,
                            };
                            // A mapping that never brought anything in does not import history.
                            let Some(last) = last else { continue };
                            match discord.history_after(&m.external, last).await {
                                Ok(missed) => {
                                    if !missed.is_empty() {
                                        tracing::info!(
                                            "in: {} message(s) written in channel {} while the bridge was away",
                                            missed.len(),
                                            m.external
                                        );
                                    }
                                    for msg in missed {
                                        if let Err(CallError::Gone) = self.bring_in(&msg).await {
                                            return;
                                        }
                                    }
                                }
                                Err(e) => {
                                    tracing::warn!(
                                        "flock-bridge: cannot read what was missed in channel {}: {e}",
                                        m.external
                                    );
                                    self.set_state("connected", Some(e.to_string()));
                                }
                            }
                        }
                    }
                    discord::Event::Message(m) => {
                        if let Err(CallError::Gone) = self.bring_in(&m).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Slack → Flock: each message is posted, then its envelope may be acked.
    pub(super) async fn slack_inbound(
        self: Arc<Self>,
        mut rx: tokio::sync::mpsc::UnboundedReceiver<slack::Incoming>,
    ) {
        self.set_state("connected", None);
        while let Some((m, done)) = rx.recv().await {
            if let Err(CallError::Gone) = self.bring_in(&m).await {
                return; // `done` dropped: no ack, Slack sends it again to the next process
            }
            let _ = done.send(());
        }
    }

    /// Telegram → Flock: long polls; an update is confirmed once it is handled.
    pub(super) async fn telegram_inbound(self: Arc<Self>) {
        let Chat::Telegram(telegram) = &self.chat else { return };
        let mut backoff = Duration::from_millis(500);
        loop {
            if self.link.stopping() {
                return;
            }
            let batch = match telegram.receive().await {
                Ok(b) => {
                    backoff = Duration::from_millis(500);
                    b
                }
                Err(PlatformError::RateLimited(d)) => {
                    self.set_state(&format!("rate-limited for {} s", d.as_secs()), None);
                    tokio::time::sleep(d).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!("flock-bridge: receiving: {e}");
                    self.set_state("reconnecting", Some(e.to_string()));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            self.set_state("connected", None);
            for (update_id, message) in batch {
                if let Some(m) = message
                    && let Err(CallError::Gone) = self.bring_in(&m).await
                {
                    // Not handled: the next process gets this update again.
                    return;
                }
                telegram.handled(update_id);
            }
        }
    }

    /// Posts one person's message in its channel (or says why not); `Err(Gone)` only when the
    /// router is gone, so the message is not confirmed to the platform.
    pub(super) async fn bring_in(self: &Arc<Self>, m: &Inbound) -> Result<(), CallError> {
        let mapping = self.spec.channels.iter().find(|c| c.external == m.external);
        // A chat the bot is in but no mapping names is not ours to relay; a person writing to
        // the bot directly reaches the swarm (`dm:`), which maps their chat on the first message.
        let allowed = match (mapping, &self.spec.dm) {
            (Some(mapping), _) => mapping.allow.as_ref().is_none_or(|a| a.contains(&m.user_id)),
            (None, Some(dm)) if m.direct => {
                dm.allow.as_ref().is_none_or(|a| a.contains(&m.user_id))
            }
            (None, _) => return Ok(()),
        };
        if self.archived.lock().unwrap_or_else(|p| p.into_inner()).contains(&m.external) {
            tracing::info!(
                "in: chat {} message {} dropped: #{} is archived",
                m.external,
                m.message_id,
                mapping.map_or("its channel", |m| m.flock.as_str())
            );
            return Ok(());
        }
        if m.change != Change::New {
            return self.bring_in_change(m).await;
        }
        if self.is_echo(&m.external, &m.text) {
            tracing::info!("dropped an echo of our own post in chat {}", m.external);
            return Ok(());
        }
        if !self.within_rate(&m.user_id) {
            tracing::info!(
                "ignored a message from user {} in chat {}: more than {} posts a minute",
                m.user_id,
                m.external,
                self.spec.max_posts_per_minute
            );
            return Ok(());
        }
        let mut args = json!({
            "external": m.external,
            "message_id": m.message_id,
            "user_id": m.user_id,
            "user_name": m.user_name,
        });
        if mapping.is_none() {
            args["dm"] = json!(true);
        }
        // Someone not on the allow list is still handed to the router, which decides and
        // journals the refusal; their words never leave the bridge.
        if allowed {
            args["text"] = json!(m.text);
        } else {
            tracing::info!(
                "refusing a message from user {} in chat {}: not on the allow list",
                m.user_id,
                m.external
            );
        }
        match self.link.call_json("bridge__post", args).await {
            Ok(v) => {
                if v["duplicate"].as_bool() != Some(true) {
                    self.stats.inbound.fetch_add(1, Ordering::Relaxed);
                }
                // A DM the router just mapped: its answers go out from now on.
                if mapping.is_none()
                    && self
                        .relayed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(m.external.clone())
                {
                    tokio::spawn(self.clone().outbound(m.external.clone()));
                }
                tracing::info!(
                    chat = %m.external,
                    channel = v["channel"].as_str().unwrap_or("?"),
                    "in: chat {} message {} → #{} seq {}{}",
                    m.external,
                    m.message_id,
                    v["channel"].as_str().unwrap_or("?"),
                    v["seq"],
                    if v["duplicate"].as_bool() == Some(true) { " (already posted)" } else { "" }
                );
                self.report();
                Ok(())
            }
            Err(CallError::Refused(why)) => {
                tracing::info!("in: chat {} message {} refused: {why}", m.external, m.message_id);
                Ok(())
            }
            Err(CallError::Gone) => Err(CallError::Gone),
        }
    }

    /// A person's edit or deletion → `bridge__edit` (the post it became changes; other chats
    /// follow). Only a message that became a post can change (someone not on the allow list
    /// never made one; platforms do not always say who edits or deletes); edits count against
    /// the person's rate.
    pub(super) async fn bring_in_change(&self, m: &Inbound) -> Result<(), CallError> {
        if m.change == Change::Edited && !self.within_rate(&m.user_id) {
            return Ok(());
        }
        let mut args = json!({"external": m.external, "message_id": m.message_id});
        match m.change {
            Change::Deleted => args["deleted"] = json!(true),
            _ => args["text"] = json!(m.text),
        }
        let what = if m.change == Change::Deleted { "deleted" } else { "edited" };
        match self.link.call_json("bridge__edit", args).await {
            Ok(v) if v["found"].as_bool() == Some(true) => {
                tracing::info!(
                    chat = %m.external,
                    "in: chat {} message {} {what} → #{} seq {}{}",
                    m.external,
                    m.message_id,
                    v["channel"].as_str().unwrap_or("?"),
                    v["seq"],
                    if v["changed"].as_bool() == Some(true) { "" } else { " (no change)" }
                );
                Ok(())
            }
            Ok(_) => {
                tracing::info!(
                    "in: chat {} message {} {what}, but it never became a post: nothing to change",
                    m.external,
                    m.message_id
                );
                Ok(())
            }
            Err(CallError::Refused(why)) => {
                tracing::info!(
                    "in: chat {} message {} {what}: refused: {why}",
                    m.external,
                    m.message_id
                );
                Ok(())
            }
            Err(CallError::Gone) => Err(CallError::Gone),
        }
    }

    /// Counts a post of `user` against the per-minute limit.
    pub(super) fn within_rate(&self, user: &str) -> bool {
        let mut all = self.recent_posts.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let recent = all.entry(user.to_owned()).or_default();
        while recent.front().is_some_and(|t| now.duration_since(*t) > Duration::from_secs(60)) {
            recent.pop_front();
        }
        if recent.len() >= self.spec.max_posts_per_minute as usize {
            return false;
        }
        recent.push_back(now);
        true
    }

    /// Whether `text` arriving in `external` is what this bridge just sent there.
    pub(super) fn is_echo(&self, external: &str, text: &str) -> bool {
        let mut echoes = self.echoes.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while echoes.front().is_some_and(|(t, _)| now.duration_since(*t) > ECHO_TTL) {
            echoes.pop_front();
        }
        // What comes back is the text as shown: compare with the escapes removed.
        let key = echo_key(external, text);
        echoes.iter().any(|(_, k)| *k == key)
    }
}
