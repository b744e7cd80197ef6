//! Discord through serenity 0.12: the gateway (GUILD_MESSAGES and the privileged
//! MESSAGE_CONTENT intent) brings people's messages in; posts go out through a channel webhook
//! under each author's own name, or as the bot with a `**[author]**` prefix where the bot may not
//! manage webhooks. Mentions are never parsed (`allowed_mentions` empty): an agent cannot ping
//! `@everyone`. A restarted bridge fetches what was written while it was away (the channel's
//! history after the newest message it had brought in), so a `kill -9` loses nothing.
//! People's edits and deletions (`MESSAGE_UPDATE`, `MESSAGE_DELETE`) are followed while the
//! bridge runs (not backfilled); our copies are edited or deleted through the webhook that sent
//! them (or as the bot, on the prefix route).
//!
//! Webhook tokens live only in this process's memory; no error text carries a URL (a webhook's
//! URL holds its token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serenity::all::{
    Channel, ChannelId, ChannelType, Context, CreateAllowedMentions, CreateChannel, CreateMessage,
    CreateWebhook, EditChannel, EditMessage, EditWebhookMessage, EventHandler, ExecuteWebhook,
    GatewayIntents, GetMessages, GuildId, Message, MessageId, MessageUpdateEvent,
    PermissionOverwrite, PermissionOverwriteType, Permissions, Ready, RoleId, Webhook,
};
use serenity::http::{Http, HttpBuilder};
use tokio::sync::mpsc;

use crate::{Change, Inbound, PlatformError};

/// Discord's limit on a message's content.
pub const LIMIT: usize = 2000;
/// Room kept in each piece for the `**[author]** ` prefix of the fallback.
const PREFIX_ROOM: usize = 100;
/// The webhook's own name (each post overrides it with its author's).
const WEBHOOK_NAME: &str = "Flock";
/// The category archived channels are moved into.
pub const ARCHIVE_CATEGORY: &str = "Flock archive";

/// What the gateway hands the relay.
#[derive(Debug)]
pub enum Event {
    /// (Re)connected: time to fetch what was missed.
    Ready,
    Message(Inbound),
}

/// How posts reach one channel.
#[derive(Clone)]
enum Route {
    Webhook(Arc<Webhook>),
    /// The bot may not manage webhooks here: post as the bot, name in front.
    Prefix,
}

pub struct Discord {
    pub http: Arc<Http>,
    bot_id: u64,
    /// The bot user's name.
    bot_name: String,
    routes: Mutex<HashMap<u64, Route>>,
}

impl std::fmt::Debug for Discord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discord").field("bot_id", &self.bot_id).finish_non_exhaustive()
    }
}

/// The intents the bridge needs; MESSAGE_CONTENT is privileged (enabled per bot in the
/// Developer Portal).
pub fn intents() -> GatewayIntents {
    GatewayIntents::GUILD_MESSAGES
        | GatewayIntents::DIRECT_MESSAGES
        | GatewayIntents::MESSAGE_CONTENT
}

/// A REST client for `api_url` (the real API unless a proxy or a fake is configured). Behind a
/// proxy serenity's own rate limiter must be off (it would call discord.com directly); the
/// proxy limits, and a 429 is waited out by the relay.
pub fn http(api_url: Option<&str>, token: &str) -> Http {
    match api_url {
        // serenity puts `/api/v10` after the base itself.
        Some(url) => HttpBuilder::new(token)
            .proxy(url.trim_end_matches('/').trim_end_matches("/api/v10"))
            .ratelimiter_disabled(true)
            .build(),
        None => Http::new(token),
    }
}

impl Discord {
    /// Checks the token (`GET /users/@me`).
    pub async fn connect(http: Arc<Http>) -> Result<Discord, PlatformError> {
        let me =
            http.get_current_user().await.map_err(|e| classify(&e, "checking the bot token"))?;
        Ok(Discord {
            http,
            bot_id: me.id.get(),
            bot_name: me.name.clone(),
            routes: Mutex::default(),
        })
    }

    pub fn bot_id(&self) -> u64 {
        self.bot_id
    }

    pub fn bot_name(&self) -> &str {
        &self.bot_name
    }

    /// Pieces of a post, each leaving room for the fallback's prefix; code blocks cut in two
    /// are closed at the end of one piece and reopened at the start of the next.
    pub fn messages(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut open = false;
        for piece in crate::render::split(text, LIMIT - PREFIX_ROOM - 8, |_| 1) {
            let mut p = if open { format!("```\n{piece}") } else { piece };
            if p.matches("```").count() % 2 == 1 {
                p.push_str("\n```");
                open = true;
            } else {
                open = false;
            }
            out.push(p);
        }
        out
    }

    /// Sends one piece by `author` to channel `external`; returns the message id and the text as
    /// people see it, with the name (what the echo record compares with).
    pub async fn send(
        &self,
        external: &str,
        author: &str,
        piece: &str,
        reply_to: Option<&str>,
    ) -> Result<(String, String), PlatformError> {
        let channel = channel_id(external)?;
        let label = crate::render::author_label(author);
        // A webhook cannot reply: a reply is the bot's own message, with a reference to the
        // person's (sent anyway if that message is gone) and the author's name in front.
        let reply_to = reply_to.and_then(|r| r.parse::<u64>().ok()).filter(|r| *r != 0);
        if let Some(to) = reply_to {
            let text = format!("**[{label}]** {piece}");
            let reference = serenity::model::channel::MessageReference::from((
                channel,
                serenity::model::id::MessageId::new(to),
            ))
            .fail_if_not_exists(false);
            let builder = CreateMessage::new()
                .content(&text)
                .reference_message(reference)
                .allowed_mentions(CreateAllowedMentions::new());
            return match channel.send_message(&self.http, builder).await {
                Ok(m) => Ok((m.id.get().to_string(), text)),
                Err(e) => Err(classify(&e, "replying as the bot")),
            };
        }
        let mut recreated = false;
        loop {
            match self.route(channel).await? {
                Route::Webhook(hook) => {
                    let builder = ExecuteWebhook::new()
                        .content(piece)
                        .username(webhook_username(&label))
                        .allowed_mentions(CreateAllowedMentions::new());
                    match hook.execute(&self.http, true, builder).await {
                        Ok(m) => {
                            let id = m.map(|m| m.id.get().to_string()).unwrap_or_default();
                            // As people see it: the webhook's name, then the text.
                            return Ok((id, format!("[{label}] {piece}")));
                        }
                        // The webhook was deleted (or its token changed): make a new one, once;
                        // if that fails too, post as the bot.
                        Err(e) if is_code(&e, 10015) || is_status(&e, 404) => {
                            self.routes
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .remove(&channel.get());
                            if recreated {
                                self.set_route(channel, Route::Prefix);
                            }
                            recreated = true;
                        }
                        Err(e) => return Err(classify(&e, "posting through the webhook")),
                    }
                }
                Route::Prefix => {
                    let text = format!("**[{label}]** {piece}");
                    let builder = CreateMessage::new()
                        .content(&text)
                        .allowed_mentions(CreateAllowedMentions::new());
                    return match channel.send_message(&self.http, builder).await {
                        Ok(m) => Ok((m.id.get().to_string(), text)),
                        Err(e) => Err(classify(&e, "posting as the bot")),
                    };
                }
            }
        }
    }

    /// Replaces the content of our message `id` in `external` with a piece by `author`;
    /// returns the text as people see it.
    pub async fn edit(
        &self,
        external: &str,
        id: &str,
        author: &str,
        piece: &str,
    ) -> Result<String, PlatformError> {
        let (channel, message) = (channel_id(external)?, message_id(id)?);
        let label = crate::render::author_label(author);
        match self.route(channel).await? {
            Route::Webhook(hook) => {
                let builder = EditWebhookMessage::new()
                    .content(piece)
                    .allowed_mentions(CreateAllowedMentions::new());
                hook.edit_message(&self.http, message, builder)
                    .await
                    .map_err(|e| classify(&e, "editing a webhook message"))?;
                Ok(format!("[{label}] {piece}"))
            }
            Route::Prefix => {
                let text = format!("**[{label}]** {piece}");
                let builder = EditMessage::new()
                    .content(&text)
                    .allowed_mentions(CreateAllowedMentions::new());
                channel
                    .edit_message(&self.http, message, builder)
                    .await
                    .map_err(|e| classify(&e, "editing the bot's message"))?;
                Ok(text)
            }
        }
    }

    /// Shows "typing…" in channel `external` (Discord shows it for 10 s, or until the bot's next
    /// message).
    pub async fn typing(&self, external: &str) -> Result<(), PlatformError> {
        let channel = channel_id(external)?;
        channel.broadcast_typing(&self.http).await.map_err(|e| classify(&e, "showing typing"))
    }

    /// Deletes our message `id` in `external`; one already gone counts as done.
    pub async fn delete(&self, external: &str, id: &str) -> Result<(), PlatformError> {
        let (channel, message) = (channel_id(external)?, message_id(id)?);
        let done = match self.route(channel).await? {
            Route::Webhook(hook) => hook.delete_message(&self.http, None, message).await,
            Route::Prefix => channel.delete_message(&self.http, message).await,
        };
        match done {
            Ok(()) => Ok(()),
            Err(e) if is_code(&e, 10008) => Ok(()),
            Err(e) => Err(classify(&e, "deleting a message")),
        }
    }

    /// Makes a text channel named `name` in the server of channel `beside` (a mapped one);
    /// returns its id (the bot needs Manage Channels).
    pub async fn create_channel(
        &self,
        beside: Option<&str>,
        name: &str,
    ) -> Result<String, PlatformError> {
        let Some(beside) = beside else {
            return Err(PlatformError::Permanent(
                "no mapped channel to tell which server to make it in".into(),
            ));
        };
        let guild = match channel_id(beside)?.to_channel(&self.http).await {
            Ok(Channel::Guild(c)) => c.guild_id,
            Ok(_) => {
                return Err(PlatformError::Permanent(format!("{beside} is not a server channel")));
            }
            Err(e) => return Err(classify(&e, "reading the channel")),
        };
        let made = guild
            .create_channel(&self.http, CreateChannel::new(name).kind(ChannelType::Text))
            .await
            .map_err(|e| match classify(&e, "creating a channel") {
                PlatformError::Permanent(m) if is_code(&e, 50013) || is_status(&e, 403) => {
                    PlatformError::Permanent(format!("{m}: give the bot \"Manage Channels\""))
                }
                other => other,
            })?;
        Ok(made.id.get().to_string())
    }

    /// Archives channel `external` the way a Discord server can: moves it into the
    /// [`ARCHIVE_CATEGORY`] category (found or created) and denies @everyone Send Messages there
    /// (the bot needs Manage Channels and Manage Roles; a refusal says so).
    pub async fn archive(&self, external: &str) -> Result<(), PlatformError> {
        let channel = channel_id(external)?;
        let refused = |e: &serenity::Error, doing: &str| match classify(e, doing) {
            PlatformError::Permanent(m) if is_code(e, 50013) || is_status(e, 403) => {
                PlatformError::Permanent(format!(
                    "{m}: give the bot \"Manage Channels\" and \"Manage Roles\" to archive channels"
                ))
            }
            other => other,
        };
        let guild = match channel.to_channel(&self.http).await {
            Ok(Channel::Guild(c)) => c.guild_id,
            Ok(_) => {
                return Err(PlatformError::Permanent(format!(
                    "channel {external} is not a server channel"
                )));
            }
            Err(e) => return Err(classify(&e, "reading the channel")),
        };
        let all = guild.channels(&self.http).await.map_err(|e| classify(&e, "listing channels"))?;
        let category = all
            .values()
            .find(|c| c.kind == ChannelType::Category && c.name == ARCHIVE_CATEGORY)
            .map(|c| c.id);
        let category = match category {
            Some(id) => id,
            None => {
                let new = CreateChannel::new(ARCHIVE_CATEGORY).kind(ChannelType::Category);
                let made = guild.create_channel(&self.http, new).await;
                made.map_err(|e| refused(&e, "creating the archive category"))?.id
            }
        };
        if all.get(&channel).and_then(|c| c.parent_id) != Some(category) {
            channel
                .edit(&self.http, EditChannel::new().category(Some(category)))
                .await
                .map_err(|e| refused(&e, "moving the channel into the archive category"))?;
        }
        let read_only = PermissionOverwrite {
            allow: Permissions::empty(),
            deny: Permissions::SEND_MESSAGES,
            kind: PermissionOverwriteType::Role(RoleId::new(guild.get())),
        };
        channel
            .create_permission(&self.http, read_only)
            .await
            .map_err(|e| refused(&e, "making the channel read-only"))
    }

    fn set_route(&self, channel: ChannelId, route: Route) {
        self.routes.lock().unwrap_or_else(|p| p.into_inner()).insert(channel.get(), route);
    }

    /// The channel's route: our webhook (found or created), or the prefix if webhooks are not
    /// allowed to the bot there.
    async fn route(&self, channel: ChannelId) -> Result<Route, PlatformError> {
        if let Some(r) = self.routes.lock().unwrap_or_else(|p| p.into_inner()).get(&channel.get()) {
            return Ok(r.clone());
        }
        let existing = match channel.webhooks(&self.http).await {
            Ok(hooks) => hooks.into_iter().find(|h| {
                h.name.as_deref() == Some(WEBHOOK_NAME)
                    && h.token.is_some()
                    && h.user.as_ref().is_none_or(|u| u.id.get() == self.bot_id)
            }),
            // A DM has no webhooks (50003): the bot posts with the author's name in front.
            Err(e) if is_code(&e, 50003) => {
                self.set_route(channel, Route::Prefix);
                return Ok(Route::Prefix);
            }
            Err(e) if is_code(&e, 50013) || is_status(&e, 403) => {
                tracing::warn!(
                    "flock-bridge: no permission to manage webhooks in channel {channel}: posting as the bot with the author's name in front (give the bot \"Manage Webhooks\" to post under each agent's name)"
                );
                self.set_route(channel, Route::Prefix);
                return Ok(Route::Prefix);
            }
            Err(e) => return Err(classify(&e, "listing the channel's webhooks")),
        };
        let hook = match existing {
            Some(h) => h,
            None => {
                match channel.create_webhook(&self.http, CreateWebhook::new(WEBHOOK_NAME)).await {
                    Ok(h) => h,
                    Err(e) if is_code(&e, 50013) || is_status(&e, 403) => {
                        tracing::warn!(
                            "flock-bridge: cannot create a webhook in channel {channel}: posting as the bot with the author's name in front"
                        );
                        self.set_route(channel, Route::Prefix);
                        return Ok(Route::Prefix);
                    }
                    Err(e) => return Err(classify(&e, "creating the channel's webhook")),
                }
            }
        };
        let route = Route::Webhook(Arc::new(hook));
        self.set_route(channel, route.clone());
        Ok(route)
    }

    /// People's messages in `external` after message `after`, oldest first.
    pub async fn history_after(
        &self,
        external: &str,
        after: u64,
    ) -> Result<Vec<Inbound>, PlatformError> {
        let Ok(channel) = external.parse::<u64>().map(ChannelId::new) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let page = channel
                .messages(
                    &self.http,
                    GetMessages::new().after(MessageId::new(cursor.max(1))).limit(100),
                )
                .await
                .map_err(|e| classify(&e, "reading the channel's history"))?;
            if page.is_empty() {
                return Ok(out);
            }
            let mut page: Vec<Message> = page;
            page.sort_by_key(|m| m.id);
            cursor = page.last().map_or(cursor, |m| m.id.get());
            out.extend(page.iter().filter_map(|m| inbound(m, self.bot_id)));
            if out.len() > 10_000 {
                return Ok(out);
            }
        }
    }
}

fn channel_id(external: &str) -> Result<ChannelId, PlatformError> {
    let id = external.parse::<u64>().ok().filter(|n| *n > 0);
    id.map(ChannelId::new).ok_or_else(|| {
        PlatformError::Permanent(format!("`{external}` is not a Discord channel id"))
    })
}

fn message_id(id: &str) -> Result<MessageId, PlatformError> {
    let n = id.parse::<u64>().ok().filter(|n| *n > 0);
    n.map(MessageId::new)
        .ok_or_else(|| PlatformError::Permanent(format!("`{id}` is not a Discord message id")))
}

/// A person's edit of their message, or `None` for bots, webhooks (ours among them) and
/// updates that do not change the content (embeds unfurled, pins).
pub fn edited(e: &MessageUpdateEvent, bot_id: u64) -> Option<Inbound> {
    let content = e.content.as_ref().filter(|c| !c.is_empty())?;
    if matches!(e.webhook_id, Some(Some(_)))
        || e.author.as_ref().is_some_and(|a| a.bot || a.id.get() == bot_id)
    {
        return None;
    }
    Some(Inbound {
        external: e.channel_id.get().to_string(),
        message_id: e.id.get().to_string(),
        user_id: e.author.as_ref().map(|a| a.id.get().to_string()).unwrap_or_default(),
        user_name: e
            .author
            .as_ref()
            .map(|a| a.global_name.clone().unwrap_or_else(|| a.name.clone()))
            .unwrap_or_default(),
        text: content.clone(),
        change: Change::Edited,
        direct: e.guild_id.is_none(),
    })
}

/// A person's message, or `None` for bots, webhooks (ours among them) and empty content.
pub fn inbound(m: &Message, bot_id: u64) -> Option<Inbound> {
    if m.author.bot || m.webhook_id.is_some() || m.author.id.get() == bot_id || m.content.is_empty()
    {
        return None;
    }
    Some(Inbound {
        external: m.channel_id.get().to_string(),
        message_id: m.id.get().to_string(),
        user_id: m.author.id.get().to_string(),
        user_name: m.author.global_name.clone().unwrap_or_else(|| m.author.name.clone()),
        text: m.content.clone(),
        change: Change::New,
        direct: m.guild_id.is_none(),
    })
}

/// A webhook username Discord (and serenity) accept: 2–80 characters, without "clyde" or
/// "discord".
pub fn webhook_username(name: &str) -> String {
    let mut n: String = name.chars().take(80).collect();
    for (bad, good) in [("discord", "disc0rd"), ("clyde", "clyd3")] {
        while let Some(i) = n.to_lowercase().find(bad) {
            n.replace_range(i..i + bad.len(), good);
        }
    }
    match n.trim().chars().count() {
        0 => "agent".into(),
        1 => format!("{n}_"),
        _ => n,
    }
}

fn is_code(e: &serenity::Error, code: isize) -> bool {
    matches!(e, serenity::Error::Http(serenity::http::HttpError::UnsuccessfulRequest(r)) if r.error.code == code)
}

fn is_status(e: &serenity::Error, status: u16) -> bool {
    matches!(e, serenity::Error::Http(serenity::http::HttpError::UnsuccessfulRequest(r)) if r.status_code.as_u16() == status)
}

/// What a serenity error means for the relay; the text never carries a URL.
pub fn classify(e: &serenity::Error, doing: &str) -> PlatformError {
    use serenity::http::HttpError;
    match e {
        serenity::Error::Http(HttpError::UnsuccessfulRequest(r)) => {
            let status = r.status_code.as_u16();
            let what = format!("{doing}: {status} {} (code {})", r.error.message, r.error.code);
            match status {
                429 => PlatformError::RateLimited(Duration::from_secs(1)),
                401 => PlatformError::Fatal(format!(
                    "{what}: Discord refused the bot token (check the variable `token_env` names)"
                )),
                400..=499 => PlatformError::Permanent(what),
                _ => PlatformError::Transient(what),
            }
        }
        other => PlatformError::Transient(format!("{doing}: {}", scrub_urls(&other.to_string()))),
    }
}

/// Cuts anything that looks like a URL out of a text (a webhook URL holds its token).
fn scrub_urls(text: &str) -> String {
    text.split_whitespace()
        .map(|w| if w.contains("://") { "[url]" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The gateway side: hands people's messages (in gateway order) and each (re)connection to the
/// relay through `tx`.
pub struct Handler {
    pub tx: mpsc::UnboundedSender<Event>,
    pub bot_id: u64,
}

#[serenity::async_trait]
impl EventHandler for Handler {
    async fn ready(&self, _ctx: Context, ready: Ready) {
        tracing::info!(
            "discord: gateway ready as {} (session {})",
            ready.user.name,
            ready.session_id
        );
        let _ = self.tx.send(Event::Ready);
    }

    async fn message(&self, _ctx: Context, msg: Message) {
        // First thing, before any await: the order of sends is the gateway's order.
        if let Some(m) = inbound(&msg, self.bot_id) {
            let _ = self.tx.send(Event::Message(m));
        }
    }

    async fn message_update(
        &self,
        _ctx: Context,
        _old: Option<Message>,
        _new: Option<Message>,
        event: MessageUpdateEvent,
    ) {
        if let Some(m) = edited(&event, self.bot_id) {
            let _ = self.tx.send(Event::Message(m));
        }
    }

    async fn message_delete(
        &self,
        _ctx: Context,
        channel_id: ChannelId,
        deleted_message_id: MessageId,
        guild_id: Option<GuildId>,
    ) {
        // Who deleted it is not said; the router only changes a post a person's message became.
        let _ = self.tx.send(Event::Message(Inbound {
            external: channel_id.get().to_string(),
            message_id: deleted_message_id.get().to_string(),
            user_id: String::new(),
            user_name: String::new(),
            text: String::new(),
            change: Change::Deleted,
            direct: guild_id.is_none(),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webhook_names_follow_discords_rules() {
        assert_eq!(webhook_username("worker-1"), "worker-1");
        assert_eq!(webhook_username("Discord-bot"), "disc0rd-bot");
        assert_eq!(webhook_username("clyde"), "clyd3");
        assert_eq!(webhook_username(&"x".repeat(100)).chars().count(), 80);
        assert_eq!(webhook_username("  "), "agent");
        assert_eq!(webhook_username("q"), "q_");
    }

    #[test]
    fn code_blocks_survive_a_split() {
        let text = format!("intro\n```\n{}\n```\nend", "line of code\n".repeat(300));
        let parts = Discord::messages(&text);
        assert!(parts.len() >= 2);
        for p in &parts {
            assert!(p.chars().count() + PREFIX_ROOM <= LIMIT, "{}", p.len());
            assert_eq!(p.matches("```").count() % 2, 0, "every piece has whole code blocks: {p}");
        }
    }

    #[test]
    fn urls_never_reach_an_error_text() {
        let t =
            scrub_urls("error sending request for url (https://discord.com/api/webhooks/1/SECRET)");
        assert!(!t.contains("SECRET"), "{t}");
    }
}
