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
//! `chat.postMessage`); the relay is platform-neutral.

pub mod discord;
pub mod link;
pub mod markdown;
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
    /// Runs serenity's gateway; a refused intent or token is fatal (exit 78), anything else
    /// exits the process (the supervisor restarts it).
    async fn discord_gateway(self: Arc<Self>, mut client: serenity::Client) {
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
    async fn discord_inbound(
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
    async fn slack_inbound(
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

    /// Telegram → Flock: long polls; an update is confirmed once it is handled.
    async fn telegram_inbound(self: Arc<Self>) {
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
    async fn bring_in(self: &Arc<Self>, m: &Inbound) -> Result<(), CallError> {
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
    async fn bring_in_change(&self, m: &Inbound) -> Result<(), CallError> {
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

    /// Flock → platform, for one mapped chat.
    async fn outbound(self: Arc<Self>, external: String) {
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
    async fn show_working(
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
    async fn mirror_archive(&self, external: &str, channel: &str) -> bool {
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
    async fn follow_edit(&self, external: &str, edit: &Value) -> Option<Option<String>> {
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
    async fn delete_messages(&self, external: &str, ids: &[&str]) -> Option<()> {
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
    async fn platform_call<T, F, Fut>(
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
    async fn deliver(
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
    async fn deliver_parts(
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
    fn mapping_broken(&self, external: &str, why: Option<&str>) {
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

    fn outbox_is(&self, external: &str, n: u64) {
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

    fn remember_sent(&self, external: &str, rendered: &str) {
        let mut echoes = self.echoes.lock().unwrap_or_else(|p| p.into_inner());
        echoes.push_back((Instant::now(), echo_key(external, rendered)));
        while echoes.len() > ECHO_MAX {
            echoes.pop_front();
        }
    }

    /// Whether `text` arriving in `external` is what this bridge just sent there.
    fn is_echo(&self, external: &str, text: &str) -> bool {
        let mut echoes = self.echoes.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        while echoes.front().is_some_and(|(t, _)| now.duration_since(*t) > ECHO_TTL) {
            echoes.pop_front();
        }
        // What comes back is the text as shown: compare with the escapes removed.
        let key = echo_key(external, text);
        echoes.iter().any(|(_, k)| *k == key)
    }

    /// Counts a post of `user` against the per-minute limit.
    fn within_rate(&self, user: &str) -> bool {
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
