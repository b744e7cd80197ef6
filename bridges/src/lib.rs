//! `flock-bridge`: one process per chat bridge of the swarm file (issue #9). It connects to the
//! router like an agent (identity from its connection, token from the supervisor) and relays:
//!
//! - **in**: a person's message in a mapped chat → `bridge__post`, which the router turns into a
//!   `human:<platform>:<name>` post in the mapped channel, exactly once (the platform's message
//!   id is the post's unique origin). The platform is told the message was handled (Telegram's
//!   offset) only after that post is durable.
//! - **out**: per mapping, `bridge__pull` long-polls the channel's posts after the mapping's
//!   durable cursor; each is sent to the chat, then `bridge__sent` moves the cursor. The channel
//!   log is the outbox: a killed bridge resumes at its cursor.
//! - **no echo**, in three layers: the bot's own messages are dropped by platform identity; the
//!   router never hands a mapping the posts that came from its own chat; a short-lived record of
//!   what was just sent drops a message that comes back anyway.
//!
//! - **edits and deletions**: a person's edit or deletion changes the post it became
//!   (`bridge__edit`); every other chat that got the post has its copy edited or deleted (the
//!   pull hands each mapping the changes after its durable edit cursor, with the platform ids
//!   `bridge__sent` recorded for the copy).
//!
//! - **archive**: once a mapped channel is archived and every post before it went out, the
//!   pull says so: a Slack conversation is archived (`conversations.archive`); Telegram and
//!   Discord get one final notice (recorded with `bridge__archived`, so a restarted bridge does
//!   not repeat it); nothing more is relayed either way.
//!
//! Platforms: Telegram (`telegram.rs`, Bot API long polling), Discord (`discord.rs`,
//! serenity's gateway and webhooks) and Slack (`slack.rs`, slack-morphism's Socket Mode and
//! `chat.postMessage`); the relay is platform-neutral: `inbound.rs` brings people's messages in,
//! `outbound.rs` takes posts out, this file runs the process (connect, mappings, status).

pub mod discord;
mod inbound;
pub mod link;
pub mod markdown;
mod outbound;
pub mod render;
pub mod slack;
pub mod telegram;

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use flock_config::{BridgeSpec, Platform};
use serde_json::{Value, json};

use crate::discord::Discord;
use crate::link::{CallError, Link};
use crate::telegram::Telegram;

/// Exit code for a problem a restart cannot fix (the platform refused the token).
pub const EXIT_CONFIG: u8 = 78;

/// A person's message from a platform chat: a new one, or a change to one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    pub external: String,
    pub message_id: String,
    pub user_id: String,
    pub user_name: String,
    /// The text (the new text of an edit; empty for a deletion).
    pub text: String,
    pub change: Change,
    /// Written to the bot directly (Telegram private chat, Discord DM, Slack IM), not in a
    /// group the bot is in.
    pub direct: bool,
}

/// What happened to a person's message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Change {
    #[default]
    New,
    Edited,
    Deleted,
}

/// What went wrong talking to a platform, by what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlatformError {
    /// Wait this long, then try again (HTTP 429 `retry_after`).
    RateLimited(Duration),
    /// Try again with backoff (network, 5xx, a competing poller).
    Transient(String),
    /// This request will never succeed as it is (chat not found, bot removed, bad request).
    Permanent(String),
    /// Nothing will work until a person fixes the configuration (token refused).
    Fatal(String),
}

impl std::fmt::Display for PlatformError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PlatformError::RateLimited(d) => write!(f, "rate-limited for {} s", d.as_secs()),
            PlatformError::Transient(m) | PlatformError::Permanent(m) | PlatformError::Fatal(m) => {
                f.write_str(m)
            }
        }
    }
}

/// `flock-bridge check PLATFORM [API_URL]` (`flockctl init` runs it): the bot `token` belongs
/// to, asked of the platform by the bridge's own clients — Telegram `getMe`, Discord
/// `/users/@me`, Slack `auth.test` — exactly as a bridge checks its token when it starts.
pub async fn whoami(
    platform: Platform,
    api_url: Option<&str>,
    token: &str,
) -> Result<String, PlatformError> {
    match platform {
        Platform::Telegram => {
            let api = api_url.unwrap_or(platform.default_api_url());
            Telegram::connect(api, token).await.map(|t| t.bot_name().to_owned())
        }
        Platform::Discord => {
            let http = Arc::new(discord::http(api_url, token));
            Discord::connect(http).await.map(|d| d.bot_name().to_owned())
        }
        Platform::Slack => {
            let client = slack::client(api_url)?;
            slack::Slack::connect(client, token).await.map(|s| s.bot_name().to_owned())
        }
    }
}

/// Makes ring the process-wide rustls provider, once (reqwest is built without one).
pub(crate) fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _already = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The longest a failing platform call waits before it is tried again.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long a sent text is remembered to drop it if it comes back.
const ECHO_TTL: Duration = Duration::from_secs(120);
/// How many sent texts are remembered at most.
const ECHO_MAX: usize = 1024;
/// How long a pull waits in the router for a post.
const PULL_WAIT_MS: u64 = 20_000;

/// What `flockctl ps` shows, kept here and sent to the router when it changes.
#[derive(Default)]
struct Stats {
    inbound: AtomicU64,
    outbound: AtomicU64,
    state: Mutex<String>,
    last_error: Mutex<Option<String>>,
    /// Posts waiting per mapping.
    outbox: Mutex<HashMap<String, u64>>,
    /// Mappings whose chat refuses posts, with why.
    broken: Mutex<HashMap<String, String>>,
}

/// The platform a bridge talks to.
enum Chat {
    Telegram(Telegram),
    Discord(Discord),
    Slack(Arc<slack::Slack>),
}

impl Chat {
    /// A post as the platform's messages (each within its limit).
    fn messages(&self, author: &str, text: &str) -> Vec<String> {
        match self {
            Chat::Telegram(_) => render::telegram_messages(author, text),
            Chat::Discord(_) => Discord::messages(text),
            Chat::Slack(_) => slack::Slack::messages(text),
        }
    }

    /// Sends one message of a post by `author` (a reply to platform message `reply_to`, when
    /// given): its platform id and the text as people see it (with the author's name: the echo
    /// record compares with it).
    async fn send(
        &self,
        external: &str,
        author: &str,
        message: &str,
        reply_to: Option<&str>,
    ) -> Result<(String, String), PlatformError> {
        match self {
            Chat::Telegram(t) => {
                let shown = markdown::plain(message);
                match t.send(external, message, reply_to).await {
                    // Telegram could not read the message as we wrote it: never stall the chat
                    // on it; send what it shows as plain text instead.
                    Err(PlatformError::Permanent(e))
                        if e.contains("can't parse entities") || e.contains("too long") =>
                    {
                        tracing::warn!(
                            "flock-bridge: Telegram refused a formatted message ({e}); sending it as plain text"
                        );
                        let plain = markdown::escaped_plain(&shown, 4096);
                        t.send(external, &plain, reply_to).await.map(|id| (id, shown))
                    }
                    sent => sent.map(|id| (id, shown)),
                }
            }
            Chat::Discord(d) => d.send(external, author, message, reply_to).await,
            Chat::Slack(s) => s.send(external, author, message, reply_to).await,
        }
    }

    /// How often "working" must be shown again while the swarm works (Telegram's typing lasts
    /// 5 s, Discord's 10 s); `None`: shown once per message (Slack: a reaction).
    fn typing_every(&self) -> Option<Duration> {
        match self {
            Chat::Telegram(_) => Some(Duration::from_secs(4)),
            Chat::Discord(_) => Some(Duration::from_secs(8)),
            Chat::Slack(_) => None,
        }
    }

    /// Shows that the swarm works on something asked in `external` (the platforms that have a
    /// typing indicator).
    async fn typing(&self, external: &str) -> Result<(), PlatformError> {
        match self {
            Chat::Telegram(t) => t.typing(external).await,
            Chat::Discord(d) => d.typing(external).await,
            Chat::Slack(_) => Ok(()),
        }
    }

    /// Replaces the text of message `id` (one piece of a post by `author`) in `external`;
    /// returns the text as people see it.
    async fn edit(
        &self,
        external: &str,
        id: &str,
        author: &str,
        message: &str,
    ) -> Result<String, PlatformError> {
        match self {
            Chat::Telegram(t) => {
                t.edit(external, id, message).await.map(|()| markdown::plain(message))
            }
            Chat::Discord(d) => d.edit(external, id, author, message).await,
            Chat::Slack(s) => s.edit(external, id, author, message).await,
        }
    }

    /// Deletes message `id` in `external`.
    async fn delete(&self, external: &str, id: &str) -> Result<(), PlatformError> {
        match self {
            Chat::Telegram(t) => t.delete(external, id).await,
            Chat::Discord(d) => d.delete(external, id).await,
            Chat::Slack(s) => s.delete(external, id).await,
        }
    }
}

/// The running relay of one bridge.
struct Relay {
    spec: BridgeSpec,
    link: Link,
    chat: Chat,
    stats: Stats,
    /// Hashes of texts just sent, with when (the echo backstop).
    echoes: Mutex<VecDeque<(Instant, u64)>>,
    /// Per platform user: when their recent posts came in (rate limit).
    recent_posts: Mutex<HashMap<String, VecDeque<Instant>>>,
    /// Chats whose Flock channel is archived: nothing is relayed from them any more.
    archived: Mutex<HashSet<String>>,
    /// Chats with an outbound loop running (the mapped ones, and DMs once they are mapped).
    relayed: Mutex<HashSet<String>>,
}

/// People's posts the swarm is working on, for one chat: (seq, their platform message there).
type Working = Vec<(u64, Option<String>)>;

/// The Slack reaction that says "working on it" on a person's message.
const WORKING_REACTION: &str = "hourglass_flowing_sand";

/// Runs the bridge until the router closes the connection or asks it to stop; returns the
/// process's exit code.
pub async fn run() -> u8 {
    // Every token comes over the socket the supervisor left us, never the environment.
    let mut secrets = match flock_ipc::handoff::receive() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("flock-bridge: error: cannot read the handed-over tokens: {e}");
            return EXIT_CONFIG;
        }
    };
    let app_token = secrets.remove(flock_ipc::env::PLATFORM_APP_TOKEN);
    let session = secrets.remove(flock_ipc::env::TOKEN).unwrap_or_default();
    let token = match secrets.remove(flock_ipc::env::PLATFORM_TOKEN) {
        Some(t) if !t.trim().is_empty() => t.trim().to_owned(),
        _ => {
            tracing::error!(
                "flock-bridge: error: no platform token: flock-bridge is started by flock-supervisor, which reads it from the variable `token_env` names"
            );
            return EXIT_CONFIG;
        }
    };
    let (link, mut spec) = match Link::connect(session).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("flock-bridge: error: {e:#}");
            return 1;
        }
    };
    // The mappings as they are now (`flockctl bridge map|unmap` may have changed the file's).
    match link.call_json("bridge__mappings", json!({})).await {
        Ok(v) => match serde_json::from_value(v["channels"].clone()) {
            Ok(channels) => spec.channels = channels,
            Err(e) => tracing::warn!(
                "flock-bridge: the router's mappings do not parse ({e}); using the swarm file's"
            ),
        },
        Err(CallError::Gone) => return 1,
        Err(CallError::Refused(why)) => {
            tracing::warn!("flock-bridge: no current mappings ({why}); using the swarm file's")
        }
    }
    tracing::info!(
        bridge = %spec.name,
        platform = spec.platform.as_str(),
        "bridge `{}` ({}) connected to the router",
        spec.name,
        spec.platform.as_str()
    );
    link.status(json!({"state": "connecting"}));
    let mut tasks = tokio::task::JoinSet::new();
    let chat = match spec.platform {
        Platform::Telegram => {
            let api_url =
                spec.api_url.clone().unwrap_or_else(|| spec.platform.default_api_url().to_owned());
            match until_connected(&link, || Telegram::connect(&api_url, &token)).await {
                Ok(t) => {
                    tracing::info!(
                        "telegram: bot {} ready; {} chat(s) mapped",
                        t.bot_id(),
                        spec.channels.len()
                    );
                    Chat::Telegram(t)
                }
                Err(code) => return code,
            }
        }
        Platform::Discord => {
            let http = Arc::new(discord::http(spec.api_url.as_deref(), &token));
            match until_connected(&link, || Discord::connect(http.clone())).await {
                Ok(d) => {
                    tracing::info!(
                        "discord: bot {} ready; {} channel(s) mapped",
                        d.bot_id(),
                        spec.channels.len()
                    );
                    Chat::Discord(d)
                }
                Err(code) => return code,
            }
        }
        Platform::Slack => {
            let client = match slack::client(spec.api_url.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("flock-bridge: error: {e}");
                    return 1;
                }
            };
            match until_connected(&link, || slack::Slack::connect(client.clone(), &token)).await {
                Ok(s) => {
                    tracing::info!(
                        "slack: bot user {} ready; {} channel(s) mapped",
                        s.bot_user(),
                        spec.channels.len()
                    );
                    Chat::Slack(Arc::new(s))
                }
                Err(code) => return code,
            }
        }
    };
    let unmade = make_pending_channels(&link, &chat, &mut spec).await;
    let relay = Arc::new(Relay {
        spec,
        link: link.clone(),
        chat,
        stats: Stats::default(),
        echoes: Mutex::default(),
        recent_posts: Mutex::default(),
        archived: Mutex::default(),
        relayed: Mutex::default(),
    });
    // Kept alive as long as the bridge runs (Socket Mode's connections belong to it).
    let mut _slack_listener = None;
    match &relay.chat {
        Chat::Telegram(_) => {
            tasks.spawn(relay.clone().telegram_inbound());
        }
        Chat::Slack(s) => {
            let Some(app_token) = app_token else {
                tracing::error!(
                    "flock-bridge: error: no app-level token: Slack bridges need `app_token_env` (an xapp-… token with connections:write)"
                );
                return EXIT_CONFIG;
            };
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let listen = || slack::listen(s.clone(), app_token.trim(), tx.clone());
            match until_connected(&link, listen).await {
                Ok(l) => _slack_listener = Some(l),
                Err(code) => return code,
            }
            tasks.spawn(relay.clone().slack_inbound(rx));
        }
        Chat::Discord(d) => {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let handler = discord::Handler { tx, bot_id: d.bot_id() };
            // The gateway's own REST client, to the same API as the relay's.
            let http = discord::http(relay.spec.api_url.as_deref(), &token);
            let builder = serenity::client::ClientBuilder::new_with_http(http, discord::intents())
                .event_handler(handler);
            let client = match builder.await {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!("flock-bridge: error: cannot set up the Discord client: {e}");
                    return 1;
                }
            };
            tasks.spawn(relay.clone().discord_gateway(client));
            tasks.spawn(relay.clone().discord_inbound(rx));
        }
    }
    relay.set_state("connected", None);
    for (external, why) in &unmade {
        relay.mapping_broken(external, Some(why));
    }
    for m in relay.spec.channels.clone() {
        if !m.external.starts_with(PENDING_PREFIX) {
            relay.relayed.lock().unwrap_or_else(|p| p.into_inner()).insert(m.external.clone());
            tasks.spawn(relay.clone().outbound(m.external.clone()));
        }
    }
    tokio::select! {
        _ = link.gone() => {
            tracing::warn!("flock-bridge: the router closed the connection; exiting");
            1
        }
        _ = link.shutdown_requested() => {
            // Let a send in progress finish (the loops stop between posts), briefly.
            let _ = tokio::time::timeout(Duration::from_secs(3), async {
                while tasks.join_next().await.is_some() {}
            })
            .await;
            link.shutdown_ack().await;
            tracing::info!("stopped");
            0
        }
    }
}

/// The `external` of a mapping whose platform channel is still to be made (see
/// `mirror_new_channels`): `new:<channel>`.
const PENDING_PREFIX: &str = "new:";

/// Makes the platform channel of every pending mapping (a channel created in Flock, for a bridge
/// with `mirror_new_channels`), tells the router (`bridge__made`) and maps it in `spec`; returns
/// the pending mappings it could not make, with why (tried again at the next start).
async fn make_pending_channels(
    link: &Link,
    chat: &Chat,
    spec: &mut BridgeSpec,
) -> Vec<(String, String)> {
    let mut unmade = Vec::new();
    let existing: Vec<String> = spec
        .channels
        .iter()
        .map(|m| m.external.clone())
        .filter(|e| !e.starts_with(PENDING_PREFIX))
        .collect();
    for m in spec.channels.iter_mut().filter(|m| m.external.starts_with(PENDING_PREFIX)) {
        let made = match chat {
            Chat::Telegram(_) => {
                Err(PlatformError::Permanent("a Telegram bot cannot create groups".into()))
            }
            Chat::Slack(s) => s.create_channel(&m.flock).await,
            Chat::Discord(d) => {
                d.create_channel(existing.first().map(String::as_str), &m.flock).await
            }
        };
        match made {
            Ok(external) => {
                let args = json!({"channel": m.flock, "external": external});
                match link.call("bridge__made", args).await {
                    Ok(_) => {
                        tracing::info!("made chat {external} for #{} and mapped it", m.flock);
                        m.external = external;
                    }
                    Err(e) => {
                        let why = format!("made chat {external} but could not map it: {e:?}");
                        tracing::warn!("flock-bridge: #{}: {why}", m.flock);
                        unmade.push((m.external.clone(), why));
                    }
                }
            }
            Err(e) => {
                let why = format!("cannot make a chat for #{}: {e}", m.flock);
                tracing::warn!("flock-bridge: {why}");
                unmade.push((m.external.clone(), why));
            }
        }
    }
    unmade
}

/// Connects to the platform, retrying what a retry can fix; `Err(exit code)` otherwise (or when
/// the router goes away or asks the bridge to stop meanwhile).
async fn until_connected<T, F, Fut>(link: &Link, connect: F) -> Result<T, u8>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, PlatformError>>,
{
    let mut backoff = Duration::from_millis(500);
    loop {
        match connect().await {
            Ok(t) => return Ok(t),
            Err(PlatformError::Fatal(e)) => {
                link.status(json!({"state": "failed", "last_error": e}));
                tracing::error!("flock-bridge: error: {e}");
                return Err(EXIT_CONFIG);
            }
            Err(e) => {
                link.status(json!({"state": "reconnecting", "last_error": e.to_string()}));
                tracing::warn!("flock-bridge: cannot reach the platform yet: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = link.gone() => return Err(1),
                    _ = link.shutdown_requested() => { link.shutdown_ack().await; return Err(0) }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

impl Relay {
    fn set_state(&self, state: &str, error: Option<String>) {
        let changed = {
            let mut s = self.stats.state.lock().unwrap_or_else(|p| p.into_inner());
            let changed = *s != state || error.is_some();
            *s = state.to_owned();
            changed
        };
        if let Some(e) = &error {
            *self.stats.last_error.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.clone());
        }
        if changed {
            self.report();
        }
    }

    fn report(&self) {
        let outbox: u64 =
            self.stats.outbox.lock().unwrap_or_else(|p| p.into_inner()).values().sum();
        let state = self.stats.state.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let last_error = self.stats.last_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mappings: serde_json::Map<String, Value> = {
            let waiting = self.stats.outbox.lock().unwrap_or_else(|p| p.into_inner());
            let broken = self.stats.broken.lock().unwrap_or_else(|p| p.into_inner());
            self.spec
                .channels
                .iter()
                .map(|m| {
                    let e = &m.external;
                    let v = json!({"outbox": waiting.get(e).copied().unwrap_or(0), "broken": broken.get(e)});
                    (e.clone(), v)
                })
                .collect()
        };
        self.link.status(json!({
            "state": state,
            "outbox": outbox,
            "inbound": self.stats.inbound.load(Ordering::Relaxed),
            "outbound": self.stats.outbound.load(Ordering::Relaxed),
            "last_error": last_error,
            "mappings": mappings,
        }));
    }
}

/// What a platform call does when the chat refuses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// Give up on this call (a change to a message the chat no longer has).
    PassOver,
    /// Mark the mapping broken and try again every half minute (a post, an archive).
    Broken,
}

/// A key for the echo record: the chat and the text as people see it (MarkdownV2 escapes and
/// the bold markers of the name removed).
fn echo_key(external: &str, text: &str) -> u64 {
    let mut shown = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => shown.extend(chars.next()),
            '*' => {}
            c => shown.push(c),
        }
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    external.hash(&mut h);
    shown.trim().hash(&mut h);
    h.finish()
}

/// The last message a chat gets from a channel archived in Flock (where the platform cannot
/// archive the chat itself).
pub fn archive_notice(channel: &str) -> String {
    format!("#{channel} was archived in Flock; nothing more will be relayed here")
}

/// The status a bridge reports, as JSON (for tests of the router side).
pub fn status_json(state: &str) -> Value {
    json!({"state": state})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_echo_is_recognised_with_or_without_markdown() {
        let sent = render::telegram_messages("worker-1", "**done**. see [v1.2](https://x.io)!");
        let sent = markdown::plain(&sent[0]);
        let shown = "[worker-1] done. see v1.2!";
        assert_eq!(echo_key("-100", &sent), echo_key("-100", shown));
        assert_ne!(echo_key("-100", &sent), echo_key("-200", shown), "per chat");
        assert_ne!(echo_key("-100", &sent), echo_key("-100", "[worker-1] done"));
        // The record holds what was shown with its author's name: a person who writes the same
        // short words as an agent just did is not taken for an echo.
        assert_ne!(echo_key("-100", "[worker-1] ok"), echo_key("-100", "ok"));
    }
}
