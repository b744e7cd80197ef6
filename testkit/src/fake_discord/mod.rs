//! A fake Discord for tests: one real server on 127.0.0.1 speaking the REST API v10 (HTTP/1.1,
//! JSON) and the Gateway v10 (WebSocket, JSON encoding, no transport compression) on the same
//! port, for one bot in one guild, scripted from the test ([`FakeDiscord::post`],
//! [`FakeDiscord::rate_limit_next`], [`FakeDiscord::drop_gateway`], …) and recording what the bot
//! did. The wire formats are Discord's (<https://discord.com/developers/docs>), so the real
//! `serenity` 0.12.5 client runs against it:
//!
//! ```ignore
//! let http = HttpBuilder::new(token).proxy(fake.base_url()).ratelimiter_disabled(true).build();
//! ```
//!
//! (`proxy` replaces `https://discord.com` in every REST URL, so requests arrive as
//! `/api/v10/...`; the gateway URL comes from `GET /api/v10/gateway` and is
//! [`FakeDiscord::ws_url`]; serenity's own rate limiter ignores the proxy, hence
//! `ratelimiter_disabled`.)
//!
//! It follows the real service where a client can get it wrong: Hello → Identify → READY with
//! close codes 4004 (bad token), 4013/4014 (invalid / disallowed intents), 4003/4005, heartbeats
//! acknowledged, sessions that buffer dispatches while their connection is gone and replay them
//! on Resume (else op 9), op 7 / op 9 / dropped sockets on demand; `MESSAGE_CREATE` for every
//! message including the bot's and its webhooks' own (a client must drop them itself), content
//! emptied without the privileged MESSAGE_CONTENT intent; edits and deletions — people's
//! ([`FakeDiscord::edit`], [`FakeDiscord::delete`]) and the bot's through REST (its own messages,
//! its webhooks' through the webhook, recorded by [`FakeDiscord::edits`]) — dispatched as
//! `MESSAGE_UPDATE` (the whole message) and `MESSAGE_DELETE`; `Authorization: Bot` on bot routes
//! (401), Discord's JSON error bodies and codes (10003, 10004, 10008, 10009, 10015, 50005, 50006,
//! 50008, 50013, 50035), the 2000-character limit, webhook name rules, newest-first history with
//! `after`/`before`/`limit`, and scripted 429s with Discord's rate-limit headers.
//!
//! Direct messages: [`FakeDiscord::add_dm`] opens a DM channel (type 1, `recipients: [person]`,
//! no `guild_id`) between the bot and a person. Messages there (the person's through
//! [`FakeDiscord::post`], the bot's through `POST /channels/{id}/messages`, replies included)
//! and their edits and deletions are dispatched without `guild_id` and `member`, only to sessions
//! that identified with the DIRECT_MESSAGES intent ([`INTENT_DIRECT_MESSAGES`]), and with their
//! content even without MESSAGE_CONTENT (Discord never empties DMs to the app). Webhooks, channel
//! changes and deleting the person's message there answer 403 (50003 "Cannot execute action on
//! a DM channel"). `POST /channels/{id}/typing` (204) is recorded for every channel
//! ([`FakeDiscord::typings`]).
//!
//! Channels are text channels (type 0) and categories (type 4) with `parent_id` and
//! `permission_overwrites` (`{id, type: 0 role | 1 member, allow, deny}`, bitfields as decimal
//! strings; @everyone is the role whose id is [`GUILD_ID`]). The bot may list them
//! (`GET /guilds/{id}/channels`), create them (`POST /guilds/{id}/channels`, 201; names of 1–100
//! characters, a category has no parent, a parent is a category of the guild holding fewer than
//! 50 channels, a new channel in a category without `permission_overwrites` gets the category's),
//! modify them (`PATCH /channels/{id}`: `name`, `parent_id`, `position`, `permission_overwrites`,
//! all or nothing), and set or delete one overwrite (`PUT`/`DELETE
//! /channels/{id}/permissions/{overwrite id}`, 204; `allow`/`deny` as strings or numbers; 10009
//! for deleting one that is not there), each change dispatched as `CHANNEL_CREATE` /
//! `CHANNEL_UPDATE` (GUILDS intent). On Discord the first three need MANAGE_CHANNELS and the
//! overwrites MANAGE_ROLES; the fake's bot has both until [`FakeDiscord::deny_manage_channels`],
//! which makes all of them answer 403 (50013). `X-Audit-Log-Reason` is accepted and ignored.
//!
//! It shares no code with the client it tests. It runs on its own thread and tokio runtime, so
//! sync and async tests can use it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::http1::{self, Conn, Request, Server};
use crate::random_string;

mod gateway;
mod rest;
mod state;
use gateway::*;
use rest::*;
use state::*;

/// The bot's user id (also its application id, as for every Discord bot).
pub const BOT_ID: u64 = 1_180_000_000_000_000_001;
/// The bot's application id (= [`BOT_ID`]).
pub const APPLICATION_ID: u64 = BOT_ID;
/// `username` of the bot.
pub const BOT_USERNAME: &str = "flock-bot";
/// The one guild (server) the bot is in; every channel belongs to it.
pub const GUILD_ID: u64 = 1_180_000_000_000_000_002;
/// The guild's name.
pub const GUILD_NAME: &str = "Flock Test";
/// The guild's owner (a person, not the bot).
pub const GUILD_OWNER_ID: u64 = 1_180_000_000_000_000_003;
/// `heartbeat_interval` of Hello unless [`FakeDiscord::set_heartbeat_interval`] changed it.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 41_250;
/// Longest message content, in characters.
pub const MAX_MESSAGE_CHARS: usize = 2000;
/// Most webhooks a channel may have.
pub const MAX_WEBHOOKS_PER_CHANNEL: usize = 15;
/// Channel type GUILD_TEXT.
pub const CHANNEL_TYPE_TEXT: u8 = 0;
/// Channel type GUILD_CATEGORY.
pub const CHANNEL_TYPE_CATEGORY: u8 = 4;
/// Channel type DM: a direct message between the bot and one person.
pub const CHANNEL_TYPE_DM: u8 = 1;
/// Longest channel (and category) name, in characters.
pub const MAX_CHANNEL_NAME_CHARS: usize = 100;
/// Most channels a category may hold.
pub const MAX_CHANNELS_PER_CATEGORY: usize = 50;
/// Permission bit SEND_MESSAGES (as in a permission overwrite's `allow`/`deny`).
pub const PERMISSION_SEND_MESSAGES: u64 = 1 << 11;
/// Permission overwrite type of a role (`@everyone` is the role whose id is [`GUILD_ID`]).
pub const OVERWRITE_ROLE: u8 = 0;
/// Permission overwrite type of a member.
pub const OVERWRITE_MEMBER: u8 = 1;

/// Gateway intent GUILDS (`GUILD_CREATE` after READY).
pub const INTENT_GUILDS: u64 = 1;
/// Gateway intent GUILD_MESSAGES (`MESSAGE_CREATE`/`MESSAGE_UPDATE` in guild channels).
pub const INTENT_GUILD_MESSAGES: u64 = 1 << 9;
/// The privileged gateway intent MESSAGE_CONTENT.
pub const INTENT_MESSAGE_CONTENT: u64 = 1 << 15;
/// Gateway intent DIRECT_MESSAGES (`MESSAGE_CREATE`/`MESSAGE_UPDATE`/`MESSAGE_DELETE` in DMs).
pub const INTENT_DIRECT_MESSAGES: u64 = 1 << 12;
/// Every intent bit Discord defines lies below this one.
const INTENTS_END: u64 = 1 << 26;

/// First second of 2015, the epoch of Discord snowflakes (ms since the Unix epoch).
const DISCORD_EPOCH_MS: u64 = 1_420_070_400_000;
/// Application flag GATEWAY_MESSAGE_CONTENT_LIMITED: the intent is enabled for the app.
const APP_FLAG_MESSAGE_CONTENT_LIMITED: u64 = 1 << 19;

/// A message as the fake stores it.
#[derive(Debug, Clone)]
pub struct DiscordMessage {
    pub id: u64,
    pub channel_id: u64,
    /// The person's id, [`BOT_ID`], or for webhook messages the webhook's id (as Discord does).
    pub author_id: u64,
    /// The author's username (for webhook messages the `username` given, else the webhook name).
    pub username: String,
    /// The content as written (never emptied by intents).
    pub content: String,
    pub webhook_id: Option<u64>,
    /// `allowed_mentions` as the bot sent it (`None` when absent, and for people's messages).
    pub allowed_mentions: Option<Value>,
    /// The message a reply of the bot answers (`message_reference.message_id`), else `None`.
    pub reply_to: Option<u64>,
}

/// An answer the REST API refused, in Discord's JSON error format.
#[derive(Debug, Clone)]
struct Refusal {
    status: u16,
    body: Value,
    headers: Vec<(String, String)>,
}

impl Refusal {
    fn new(status: u16, code: u64, message: &str) -> Refusal {
        Refusal { status, body: json!({"message": message, "code": code}), headers: Vec::new() }
    }

    fn not_found() -> Refusal {
        Refusal::new(404, 0, "404: Not Found")
    }

    fn unauthorized() -> Refusal {
        Refusal::new(401, 0, "401: Unauthorized")
    }

    fn unknown_channel() -> Refusal {
        Refusal::new(404, 10003, "Unknown Channel")
    }

    fn unknown_message() -> Refusal {
        Refusal::new(404, 10008, "Unknown Message")
    }

    fn unknown_webhook() -> Refusal {
        Refusal::new(404, 10015, "Unknown Webhook")
    }

    fn unknown_guild() -> Refusal {
        Refusal::new(404, 10004, "Unknown Guild")
    }

    fn unknown_overwrite() -> Refusal {
        Refusal::new(404, 10009, "Unknown Overwrite")
    }

    fn dm_channel() -> Refusal {
        Refusal::new(403, 50003, "Cannot execute action on a DM channel")
    }

    fn missing_permissions() -> Refusal {
        Refusal::new(403, 50013, "Missing Permissions")
    }

    /// 400 "Invalid Form Body" (50035) with one error on `field`; a dotted field
    /// (`permission_overwrites.0.type`) nests the way Discord does.
    fn form(field: &str, code: &str, message: &str) -> Refusal {
        let mut error = json!({"_errors": [{"code": code, "message": message}]});
        let mut parts: Vec<&str> = field.split('.').collect();
        let first = parts.remove(0);
        for part in parts.into_iter().rev() {
            let mut outer = Map::new();
            outer.insert(part.into(), error);
            error = Value::Object(outer);
        }
        let mut errors = Map::new();
        errors.insert(first.into(), error);
        Refusal {
            status: 400,
            body: json!({"message": "Invalid Form Body", "code": 50035, "errors": errors}),
            headers: Vec::new(),
        }
    }

    fn message(&self) -> String {
        self.body["message"].as_str().unwrap_or_default().to_string()
    }
}

/// A REST answer: status, JSON body (none for 204) and extra headers.
#[derive(Debug)]
struct Reply {
    status: u16,
    body: Option<Value>,
    headers: Vec<(String, String)>,
}

impl Reply {
    fn ok(body: Value) -> Reply {
        Reply { status: 200, body: Some(body), headers: Vec::new() }
    }

    fn no_content() -> Reply {
        Reply { status: 204, body: None, headers: Vec::new() }
    }
}

#[derive(Debug)]
struct Channel {
    name: String,
    /// [`CHANNEL_TYPE_TEXT`] or [`CHANNEL_TYPE_CATEGORY`].
    kind: u8,
    position: usize,
    /// The category the channel is in (never set on a category).
    parent_id: Option<u64>,
    overwrites: Vec<Overwrite>,
    webhook_permission: bool,
    /// The person at the other end of a DM channel: `(user id, username)`.
    recipient: Option<(u64, String)>,
}

impl Channel {
    fn new(name: &str, kind: u8, position: usize) -> Channel {
        Channel {
            name: name.to_string(),
            kind,
            position,
            parent_id: None,
            overwrites: Vec::new(),
            webhook_permission: true,
            recipient: None,
        }
    }

    fn is_dm(&self) -> bool {
        self.kind == CHANNEL_TYPE_DM
    }
}

/// A permission overwrite of a channel: `allow`/`deny` bits for a role or a member.
#[derive(Debug, Clone, PartialEq)]
struct Overwrite {
    /// The role's or member's id (the guild id for @everyone).
    id: u64,
    /// 0 role, 1 member.
    kind: u8,
    allow: u64,
    deny: u64,
}

impl Overwrite {
    /// As Discord sends it: the bitfields as strings of decimal numbers.
    fn to_json(&self) -> Value {
        json!({
            "id": self.id.to_string(),
            "type": self.kind,
            "allow": self.allow.to_string(),
            "deny": self.deny.to_string(),
        })
    }
}

#[derive(Debug)]
struct StoredMessage {
    meta: DiscordMessage,
    /// The message object as the REST API returns it (no `guild_id`, no `member`).
    json: Value,
    /// Posted by the bot or one of its webhooks.
    by_bot: bool,
}

#[derive(Debug, Clone)]
struct Webhook {
    id: u64,
    token: String,
    channel_id: u64,
    name: String,
    deleted: bool,
}

impl Webhook {
    fn to_json(&self, with_token: bool) -> Value {
        let mut hook = json!({
            "id": self.id.to_string(),
            "type": 1,
            "guild_id": GUILD_ID.to_string(),
            "channel_id": self.channel_id.to_string(),
            "name": self.name,
            "avatar": null,
            "application_id": APPLICATION_ID.to_string(),
        });
        if with_token {
            hook["token"] = json!(self.token);
            hook["user"] = bot_user();
        }
        hook
    }
}

/// A gateway session: survives its connection (for Resume) until invalidated.
#[derive(Debug)]
struct Session {
    intents: u64,
    seq: u64,
    /// Every dispatch of the session as sent: `(seq, payload text)`.
    events: Vec<(u64, String)>,
    /// The connection the session is attached to, if any.
    conn: Option<u64>,
}

/// What a gateway connection task is told to do.
#[derive(Debug)]
enum Out {
    Text(String),
    /// Send a close frame with this code and reason, then end the connection.
    Close(u16, String),
    /// Close the socket without a close frame.
    Drop,
}

#[derive(Debug)]
struct GatewayConn {
    tx: mpsc::UnboundedSender<Out>,
    session: Option<String>,
}

#[derive(Debug)]
struct State {
    channels: BTreeMap<u64, Channel>,
    /// Every message of every channel, oldest first.
    messages: Vec<StoredMessage>,
    /// Usernames of the people who posted (for `mentions`).
    people: HashMap<u64, String>,
    webhooks: Vec<Webhook>,
    sessions: HashMap<String, Session>,
    conns: HashMap<u64, GatewayConn>,
    next_conn: u64,
    last_snowflake: u64,
    deny_message_content: bool,
    /// [`FakeDiscord::deny_manage_channels`] was called.
    deny_manage_channels: bool,
    heartbeat_interval: u64,
    identifies: Vec<u64>,
    heartbeats: Vec<Option<u64>>,
    resumes: Vec<(String, u64, bool)>,
    rate_limits: VecDeque<f64>,
    requests: Vec<(String, String, Value)>,
    rejected: Vec<(String, String, u16, String)>,
    /// `(channel_id, message_id, new content or None for deleted)` of every edit and deletion
    /// the bot or its webhooks made, in order.
    edits: Vec<(u64, u64, Option<String>)>,
    /// The channel of every accepted `POST /channels/{id}/typing`, in order.
    typings: Vec<u64>,
}

#[derive(Debug)]
struct Shared {
    token: String,
    addr: SocketAddr,
    state: Mutex<State>,
    /// Notified on every change (messages, connections, sessions).
    changed: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn ws_url(&self) -> String {
        format!("ws://{}", self.addr)
    }

    fn token_ok(&self, token: &str) -> bool {
        strip_bot(token) == self.token
    }
}

fn strip_bot(token: &str) -> &str {
    let token = token.trim();
    token.strip_prefix("Bot ").unwrap_or(token).trim()
}

/// A running fake Discord for one bot; stops when dropped.
#[derive(Debug)]
pub struct FakeDiscord {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    _server: Server,
}

impl FakeDiscord {
    /// Binds 127.0.0.1:0 and serves the bot `token` (with or without a `Bot ` prefix) on a thread
    /// of its own. The bot is [`BOT_ID`] in guild [`GUILD_ID`], which has no channels until
    /// [`FakeDiscord::add_channel`].
    pub fn start(token: &str) -> FakeDiscord {
        let bound = Server::bind("fake-discord");
        let addr = bound.addr;
        let shared = Arc::new(Shared {
            token: strip_bot(token).to_string(),
            addr,
            state: Mutex::new(State {
                channels: BTreeMap::new(),
                messages: Vec::new(),
                people: HashMap::new(),
                webhooks: Vec::new(),
                sessions: HashMap::new(),
                conns: HashMap::new(),
                next_conn: 1,
                last_snowflake: 0,
                deny_message_content: false,
                deny_manage_channels: false,
                heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL_MS,
                identifies: Vec::new(),
                heartbeats: Vec::new(),
                resumes: Vec::new(),
                rate_limits: VecDeque::new(),
                requests: Vec::new(),
                rejected: Vec::new(),
                edits: Vec::new(),
                typings: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let served = Arc::clone(&shared);
        let server = bound.serve(move |listener, stop| {
            http1::accept_until(listener, stop, move |stream| {
                connection(Conn::new(stream), Arc::clone(&served))
            })
        });
        FakeDiscord { addr: server.addr, shared, _server: server }
    }

    /// `http://127.0.0.1:PORT`: the base for serenity's `HttpBuilder::proxy` (REST paths are
    /// `/api/v10/...`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `ws://127.0.0.1:PORT`: the gateway URL `GET /api/v10/gateway` answers.
    pub fn ws_url(&self) -> String {
        self.shared.ws_url()
    }

    /// The bot token (without `Bot `).
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// Adds (or renames) a text channel of the guild, in no category and without permission
    /// overwrites.
    #[track_caller]
    pub fn add_channel(&self, channel_id: u64, name: &str) {
        self.add(channel_id, name, CHANNEL_TYPE_TEXT);
    }

    /// Adds (or renames) a category of the guild (as someone made it in Discord's UI).
    #[track_caller]
    pub fn add_category(&self, category_id: u64, name: &str) {
        self.add(category_id, name, CHANNEL_TYPE_CATEGORY);
    }

    #[track_caller]
    fn add(&self, channel_id: u64, name: &str, kind: u8) {
        let mut state = self.shared.state();
        let position = state.next_position(kind);
        let channel =
            state.channels.entry(channel_id).or_insert_with(|| Channel::new(name, kind, position));
        assert_eq!(
            channel.kind, kind,
            "fake Discord: channel {channel_id} exists with another type"
        );
        channel.name = name.to_string();
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Opens a DM channel (type 1, no guild) between the bot and the person `user_id`: `GET
    /// /channels/{id}` answers it with `recipients: [person]`; the person writes there through
    /// [`FakeDiscord::post`] (dispatched to DIRECT_MESSAGES sessions, without `guild_id` and
    /// `member`); the bot may post (replies too), edit and delete its messages and show typing
    /// there, while webhooks answer 403 (50003). It is no channel of the guild (not in `GET
    /// /guilds/{id}/channels` nor `GUILD_CREATE`).
    #[track_caller]
    pub fn add_dm(&self, channel_id: u64, user_id: u64, username: &str) {
        let mut state = self.shared.state();
        let channel = state
            .channels
            .entry(channel_id)
            .or_insert_with(|| Channel::new("", CHANNEL_TYPE_DM, 0));
        assert!(channel.is_dm(), "fake Discord: channel {channel_id} exists with another type");
        channel.recipient = Some((user_id, username.to_string()));
        state.people.insert(user_id, username.to_string());
        drop(state);
        self.shared.changed.notify_all();
    }

    /// How many `POST /channels/{id}/typing` (typing indicators) the channel got, accepted ones.
    pub fn typings(&self, channel_id: u64) -> usize {
        self.shared.state().typings.iter().filter(|c| **c == channel_id).count()
    }

    /// The bot lacks MANAGE_CHANNELS and MANAGE_ROLES in the guild: creating a channel, modifying
    /// one, and editing or deleting a permission overwrite answer 403 (50013).
    pub fn deny_manage_channels(&self) {
        self.shared.state().deny_manage_channels = true;
    }

    /// The channel (or category) object as `GET /channels/{id}` answers it now, if it exists.
    pub fn channel(&self, channel_id: u64) -> Option<Value> {
        let state = self.shared.state();
        state.channels.get(&channel_id).map(|c| state.channel_json(channel_id, c))
    }

    /// `(id, name)` of every category of the guild, in id (creation) order.
    pub fn categories(&self) -> Vec<(u64, String)> {
        let state = self.shared.state();
        state
            .channels
            .iter()
            .filter(|(_, c)| c.kind == CHANNEL_TYPE_CATEGORY)
            .map(|(id, c)| (*id, c.name.clone()))
            .collect()
    }

    /// The app does not have the privileged MESSAGE_CONTENT intent enabled: an Identify asking
    /// for it is closed with 4014, and REST reads empty the content of other people's messages.
    pub fn deny_message_content(&self) {
        self.shared.state().deny_message_content = true;
    }

    /// `heartbeat_interval` (ms) of the Hello of later connections.
    pub fn set_heartbeat_interval(&self, ms: u64) {
        self.shared.state().heartbeat_interval = ms;
    }

    /// A person writes `content` in a channel: stored and dispatched as `MESSAGE_CREATE` to every
    /// live session with GUILD_MESSAGES (buffered for sessions whose connection is down);
    /// returns the new message id. In a DM channel ([`FakeDiscord::add_dm`]) only its person
    /// writes, and it goes to sessions with DIRECT_MESSAGES, without `guild_id` and `member`.
    #[track_caller]
    pub fn post(&self, channel_id: u64, user_id: u64, username: &str, content: &str) -> u64 {
        self.person_message(channel_id, user_id, username, content, true)
    }

    /// Like [`FakeDiscord::post`], but only stored in the channel's history, never dispatched
    /// (the bridge was down and had no session).
    #[track_caller]
    pub fn post_while_offline(
        &self,
        channel_id: u64,
        user_id: u64,
        username: &str,
        content: &str,
    ) -> u64 {
        self.person_message(channel_id, user_id, username, content, false)
    }

    #[track_caller]
    fn person_message(
        &self,
        channel_id: u64,
        user_id: u64,
        username: &str,
        content: &str,
        dispatch: bool,
    ) -> u64 {
        let mut state = self.shared.state();
        let channel = state.channels.get(&channel_id);
        assert!(
            channel.is_some_and(|c| c.kind == CHANNEL_TYPE_TEXT || c.is_dm()),
            "fake Discord: post to channel {channel_id}, which is no text channel (add_channel) \
             nor DM (add_dm)"
        );
        if let Some((recipient, _)) = channel.and_then(|c| c.recipient.as_ref()) {
            assert_eq!(
                *recipient, user_id,
                "fake Discord: only user {recipient} writes in the DM channel {channel_id}"
            );
        }
        state.people.insert(user_id, username.to_string());
        let id = state.snowflake();
        let author = person_user(user_id, username);
        let mentions = state.mentions(content, None);
        let json = message_json(id, channel_id, author, content, &mentions, None);
        let meta = DiscordMessage {
            id,
            channel_id,
            author_id: user_id,
            username: username.to_string(),
            content: content.to_string(),
            webhook_id: None,
            allowed_mentions: None,
            reply_to: None,
        };
        state.store(StoredMessage { meta, json: json.clone(), by_bot: false }, dispatch);
        drop(state);
        self.shared.changed.notify_all();
        id
    }

    /// The author of message `message_id` edits it: stored with its new content and an
    /// `edited_timestamp`, and dispatched as `MESSAGE_UPDATE` carrying the whole message (with
    /// `guild_id` and `member`, as `MESSAGE_CREATE`; in a DM without them, to DIRECT_MESSAGES
    /// sessions).
    #[track_caller]
    pub fn edit(&self, channel_id: u64, message_id: u64, content: &str) {
        let mut state = self.shared.state();
        let found = state.edit(channel_id, message_id, content, None);
        assert!(found, "fake Discord: channel {channel_id} has no message {message_id} to edit");
        drop(state);
        self.shared.changed.notify_all();
    }

    /// A person (its author, or a moderator) deletes message `message_id`, whoever wrote it:
    /// it leaves the channel's history and `MESSAGE_DELETE` (`id`, `channel_id`, `guild_id`; in a
    /// DM no `guild_id`) is dispatched. Not recorded in [`FakeDiscord::edits`], which holds the
    /// bot's doings.
    #[track_caller]
    pub fn delete(&self, channel_id: u64, message_id: u64) {
        let mut state = self.shared.state();
        let found = state.delete(channel_id, message_id);
        assert!(found, "fake Discord: channel {channel_id} has no message {message_id} to delete");
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Every message of the channel as it is now, oldest first (people's, the bot's, its
    /// webhooks'): edits applied, deleted messages gone.
    pub fn messages(&self, channel_id: u64) -> Vec<DiscordMessage> {
        let state = self.shared.state();
        state
            .messages
            .iter()
            .filter(|m| m.meta.channel_id == channel_id)
            .map(|m| m.meta.clone())
            .collect()
    }

    /// What the bot or its webhooks posted in the channel and is still there, oldest first, with
    /// edits applied (deleted messages gone; [`FakeDiscord::edits`] has the history).
    pub fn sent(&self, channel_id: u64) -> Vec<DiscordMessage> {
        self.shared.state().sent(channel_id)
    }

    /// Waits (real time) until the bot or its webhooks posted at least `n` messages in the
    /// channel (not counting deleted ones) and returns them all ([`FakeDiscord::sent`]); panics
    /// after `timeout` with what it has.
    #[track_caller]
    pub fn wait_sent(&self, channel_id: u64, n: usize, timeout: Duration) -> Vec<DiscordMessage> {
        let state = self.wait_until(timeout, |state| state.sent(channel_id).len() >= n);
        match state {
            Ok(state) => state.sent(channel_id),
            Err(state) => {
                let got = state.sent(channel_id);
                let rejected = state.rejected.clone();
                drop(state);
                panic!(
                    "fake Discord: {} message(s) sent to channel {channel_id} after {timeout:?}, \
                     expected {n}: {got:#?}\nrefused requests: {rejected:#?}",
                    got.len()
                );
            }
        }
    }

    /// `(message_id, new content)` of every edit, and `(message_id, None)` of every deletion,
    /// the bot or its webhooks made in the channel through the REST API, in order.
    pub fn edits(&self, channel_id: u64) -> Vec<(u64, Option<String>)> {
        self.shared.state().edits_in(channel_id)
    }

    /// Waits (real time) until the bot or its webhooks made at least `n` edits or deletions in
    /// the channel and returns them all ([`FakeDiscord::edits`]); panics after `timeout` with
    /// what it has.
    #[track_caller]
    pub fn wait_edits(
        &self,
        channel_id: u64,
        n: usize,
        timeout: Duration,
    ) -> Vec<(u64, Option<String>)> {
        match self.wait_until(timeout, |state| state.edits_in(channel_id).len() >= n) {
            Ok(state) => state.edits_in(channel_id),
            Err(state) => {
                let (got, rejected) = (state.edits_in(channel_id), state.rejected.clone());
                drop(state);
                panic!(
                    "fake Discord: {} edit(s)/deletion(s) in channel {channel_id} after \
                     {timeout:?}, expected {n}: {got:#?}\nrefused requests: {rejected:#?}",
                    got.len()
                );
            }
        }
    }

    /// Waits (real time) until a client has identified (READY sent) or resumed on an open
    /// gateway connection; panics after `timeout`.
    #[track_caller]
    pub fn wait_connected(&self, timeout: Duration) {
        let ready = |state: &State| state.conns.values().any(|c| c.session.is_some());
        if let Err(state) = self.wait_until(timeout, ready) {
            let (identifies, rejected) = (state.identifies.clone(), state.rejected.clone());
            drop(state);
            panic!(
                "fake Discord: no gateway session after {timeout:?}; identifies: {identifies:?}, \
                 refused requests: {rejected:#?}"
            );
        }
    }

    /// Blocks until `cond` holds (`Ok`) or `timeout` passed (`Err`), with the state locked.
    fn wait_until(
        &self,
        timeout: Duration,
        cond: impl Fn(&State) -> bool,
    ) -> Result<MutexGuard<'_, State>, MutexGuard<'_, State>> {
        crate::wait_on(&self.shared.state, &self.shared.changed, timeout, cond)
    }

    /// The `intents` of every Identify received, in order (refused ones included).
    pub fn identifies(&self) -> Vec<u64> {
        self.shared.state().identifies.clone()
    }

    /// The `d` (last sequence number, `None` for null) of every heartbeat received.
    pub fn heartbeats(&self) -> Vec<Option<u64>> {
        self.shared.state().heartbeats.clone()
    }

    /// `(session_id, seq, accepted)` of every Resume received.
    pub fn resumes(&self) -> Vec<(String, u64, bool)> {
        self.shared.state().resumes.clone()
    }

    /// Gateway WebSocket connections currently open.
    pub fn gateway_connections(&self) -> usize {
        self.shared.state().conns.len()
    }

    /// Sends op 7 Reconnect to every connected client (the session stays resumable).
    pub fn reconnect(&self) {
        let state = self.shared.state();
        for conn in state.conns.values() {
            let _ = conn.tx.send(Out::Text(op_payload(7, Value::Null)));
        }
    }

    /// Sends op 9 Invalid Session (`d: false`) to every connected client and forgets their
    /// sessions: a later Resume of them gets op 9 too.
    pub fn invalidate_session(&self) {
        let mut guard = self.shared.state();
        let state = &mut *guard;
        for conn in state.conns.values_mut() {
            let _ = conn.tx.send(Out::Text(op_payload(9, json!(false))));
            if let Some(session) = conn.session.take() {
                state.sessions.remove(&session);
            }
        }
        drop(guard);
        self.shared.changed.notify_all();
    }

    /// Closes every gateway TCP connection abruptly (no close frame); sessions stay resumable.
    pub fn drop_gateway(&self) {
        let state = self.shared.state();
        for conn in state.conns.values() {
            let _ = conn.tx.send(Out::Drop);
        }
    }

    /// The next `n` message-creating POSTs (`POST /channels/{id}/messages` and webhook
    /// executes) answer 429 with `retry_after` = `retry_after_secs` and Discord's headers.
    pub fn rate_limit_next(&self, n: usize, retry_after_secs: f64) {
        self.shared.state().rate_limits.extend(std::iter::repeat_n(retry_after_secs, n));
    }

    /// Someone deletes every webhook of the channel: executing them answers 404 (10015).
    pub fn delete_webhooks(&self, channel_id: u64) {
        let mut state = self.shared.state();
        for hook in state.webhooks.iter_mut().filter(|h| h.channel_id == channel_id) {
            hook.deleted = true;
        }
    }

    /// The bot lacks MANAGE_WEBHOOKS in the channel: creating a webhook answers 403 (50013).
    pub fn missing_webhook_permission(&self, channel_id: u64) {
        if let Some(channel) = self.shared.state().channels.get_mut(&channel_id) {
            channel.webhook_permission = false;
        }
    }

    /// The live webhooks of the channel as `(id, token, name)`.
    pub fn webhooks(&self, channel_id: u64) -> Vec<(u64, String, String)> {
        let state = self.shared.state();
        state
            .webhooks
            .iter()
            .filter(|h| h.channel_id == channel_id && !h.deleted)
            .map(|h| (h.id, h.token.clone(), h.name.clone()))
            .collect()
    }

    /// `(method, path with query, JSON body or Null)` of every REST request, in arrival order.
    pub fn requests(&self) -> Vec<(String, String, Value)> {
        self.shared.state().requests.clone()
    }

    /// `(method, path with query, HTTP status, message)` of every refused REST request.
    pub fn rejected(&self) -> Vec<(String, String, u16, String)> {
        self.shared.state().rejected.clone()
    }
}

#[cfg(test)]
mod tests {

    use serenity::all::{
        ChannelId, ChannelType, ClientBuilder, Context, CreateAllowedMentions, CreateChannel,
        CreateMessage, CreateWebhook, EditChannel, EditMessage, EditWebhookMessage, EventHandler,
        ExecuteWebhook, GatewayIntents, GetMessages, GuildId, HttpBuilder, Message, MessageId,
        MessageUpdateEvent, PermissionOverwrite, PermissionOverwriteType, Permissions, Ready,
        RoleId, ShardManager,
    };
    use serenity::http::{Http, HttpError};
    use serenity::model::event::GatewayEvent;
    use tokio_tungstenite::MaybeTlsStream;

    use super::*;
    use std::time::Instant;

    const TOKEN: &str = "MTE4MDAwMDAwMDAwMDAwMDAwMQ.GfakeX.fake-discord-token-for-tests";
    const CHANNEL: u64 = 1_180_000_000_000_001_000;
    const ALICE: u64 = 1_180_000_000_000_002_000;
    const CATEGORY: u64 = 1_180_000_000_000_001_100;
    const SECS: Duration = Duration::from_secs(10);
    const MESSAGES: u64 = INTENT_GUILD_MESSAGES | INTENT_MESSAGE_CONTENT;

    fn fake() -> FakeDiscord {
        let fake = FakeDiscord::start(TOKEN);
        fake.add_channel(CHANNEL, "general");
        fake
    }

    /// One request on a new connection: `(status, headers in lower case, JSON body or Null)`.
    fn http(
        fake: &FakeDiscord,
        method: &str,
        path: &str,
        auth: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Vec<(String, String)>, Value) {
        let mut stream = std::net::TcpStream::connect(fake.addr).expect("connect");
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut head =
            format!("{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", fake.addr);
        if let Some(auth) = auth {
            head.push_str(&format!("Authorization: {auth}\r\n"));
        }
        if !body.is_empty() {
            head.push_str("Content-Type: application/json\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        crate::http1::exchange(&mut stream, &head)
    }

    /// A request with the bot's `Authorization`.
    fn bot(fake: &FakeDiscord, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let (status, _, body) =
            http(fake, method, path, Some(&format!("Bot {TOKEN}")), body.as_ref());
        (status, body)
    }

    fn say(fake: &FakeDiscord, content: &str) -> (u16, Value) {
        let path = format!("/api/v10/channels/{CHANNEL}/messages");
        bot(fake, "POST", &path, Some(json!({"content": content})))
    }

    fn create_hook(fake: &FakeDiscord, name: &str) -> (u16, Value) {
        bot(
            fake,
            "POST",
            &format!("/api/v10/channels/{CHANNEL}/webhooks"),
            Some(json!({"name": name})),
        )
    }

    fn execute(fake: &FakeDiscord, hook: &Value, body: Value) -> (u16, Value) {
        let path = format!(
            "/api/v10/webhooks/{}/{}?wait=true",
            hook["id"].as_str().expect("an id"),
            hook["token"].as_str().expect("a token")
        );
        let (status, _, body) = http(fake, "POST", &path, None, Some(&body));
        (status, body)
    }

    /// A raw gateway client.
    struct Gateway {
        ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    }

    impl Gateway {
        /// Connects and reads Hello; returns it too.
        async fn connect(fake: &FakeDiscord) -> (Gateway, Value) {
            let url = format!("{}/?v=10&encoding=json", fake.ws_url());
            let (ws, _) = tokio_tungstenite::connect_async(url).await.expect("gateway connect");
            let mut gateway = Gateway { ws };
            let hello = gateway.recv().await;
            assert_eq!(hello["op"], json!(10), "{hello}");
            (gateway, hello)
        }

        async fn send(&mut self, payload: Value) {
            self.ws.send(WsMessage::Text(payload.to_string())).await.expect("gateway send");
        }

        /// The next payload (text frames only); panics on anything else or after 5 s.
        async fn recv(&mut self) -> Value {
            match tokio::time::timeout(Duration::from_secs(5), self.ws.next()).await {
                Ok(Some(Ok(WsMessage::Text(text)))) => serde_json::from_str(&text).expect("JSON"),
                other => panic!("expected a gateway payload, got {other:?}"),
            }
        }

        /// The close frame the server sends next: `(code, reason)`.
        async fn closed(&mut self) -> (u16, String) {
            match tokio::time::timeout(Duration::from_secs(5), self.ws.next()).await {
                Ok(Some(Ok(WsMessage::Close(Some(frame))))) => {
                    (u16::from(frame.code), frame.reason.to_string())
                }
                other => panic!("expected a close frame, got {other:?}"),
            }
        }

        /// `true` once the connection ended without a close frame.
        async fn dropped(&mut self) -> bool {
            match tokio::time::timeout(Duration::from_secs(5), self.ws.next()).await {
                Ok(None | Some(Err(_))) => true,
                other => panic!("expected the connection to drop, got {other:?}"),
            }
        }

        async fn identify(&mut self, token: &str, intents: u64) {
            let identify = json!({"op": 2, "d": {
                "token": token,
                "intents": intents,
                "properties": {"os": "linux", "browser": "test", "device": "test"},
            }});
            self.send(identify).await;
        }

        /// Identifies and returns READY's `d`.
        async fn ready(fake: &FakeDiscord, intents: u64) -> (Gateway, Value) {
            let (mut gateway, _) = Gateway::connect(fake).await;
            gateway.identify(&format!("Bot {TOKEN}"), intents).await;
            let ready = gateway.recv().await;
            assert_eq!(
                (ready["t"].as_str(), ready["s"].as_u64()),
                (Some("READY"), Some(1)),
                "{ready}"
            );
            (gateway, ready["d"].clone())
        }
    }

    /// Every payload the fake sends parses as serenity's gateway event.
    #[track_caller]
    fn serenity_parses(payload: &Value) -> GatewayEvent {
        serde_json::from_value::<GatewayEvent>(payload.clone())
            .unwrap_or_else(|e| panic!("serenity cannot parse {payload}: {e}"))
    }

    #[tokio::test]
    async fn fake_discord_gateway_hello_identify_ready_heartbeat() {
        let fake = fake();
        fake.set_heartbeat_interval(500);
        let (mut gw, hello) = Gateway::connect(&fake).await;
        assert_eq!(hello["d"]["heartbeat_interval"], json!(500));
        assert!(matches!(serenity_parses(&hello), GatewayEvent::Hello(500)));
        gw.send(json!({"op": 1, "d": null})).await;
        let ack = gw.recv().await;
        assert_eq!(ack["op"], json!(11));
        assert!(matches!(serenity_parses(&ack), GatewayEvent::HeartbeatAck));

        let intents = INTENT_GUILDS | MESSAGES;
        gw.identify(TOKEN, intents).await; // without "Bot " works too
        let ready = gw.recv().await;
        assert_eq!(ready["t"], json!("READY"));
        assert_eq!(ready["s"], json!(1));
        let d = &ready["d"];
        assert_eq!(d["v"], json!(10));
        assert_eq!(d["user"]["id"], json!(BOT_ID.to_string()));
        assert_eq!(d["user"]["bot"], json!(true));
        assert_eq!(d["guilds"], json!([{"id": GUILD_ID.to_string(), "unavailable": true}]));
        assert_eq!(d["resume_gateway_url"], json!(fake.ws_url()));
        assert_eq!(d["application"]["id"], json!(APPLICATION_ID.to_string()));
        match serenity_parses(&ready) {
            GatewayEvent::Dispatch(1, serenity::model::event::Event::Ready(ready)) => {
                assert_eq!(ready.ready.user.id.get(), BOT_ID);
                assert_eq!(ready.ready.guilds[0].id.get(), GUILD_ID);
            }
            other => panic!("not READY: {other:?}"),
        }
        let guild = gw.recv().await;
        assert_eq!((guild["t"].as_str(), guild["s"].as_u64()), (Some("GUILD_CREATE"), Some(2)));
        if let Err(e) = serde_json::from_value::<serenity::model::guild::Guild>(guild["d"].clone())
        {
            panic!("GUILD_CREATE is not a serenity Guild: {e}");
        }
        match serenity_parses(&guild) {
            GatewayEvent::Dispatch(2, serenity::model::event::Event::GuildCreate(create)) => {
                assert_eq!(create.guild.id.get(), GUILD_ID);
                let channel = &create.guild.channels[&ChannelId::new(CHANNEL)];
                assert_eq!(channel.name, "general");
            }
            other => panic!("not GUILD_CREATE: {other:?}"),
        }
        gw.send(json!({"op": 1, "d": 2})).await;
        assert_eq!(gw.recv().await["op"], json!(11));
        assert_eq!(fake.identifies(), [intents]);
        assert_eq!(fake.heartbeats(), [None, Some(2)]);
        assert_eq!(fake.gateway_connections(), 1);
        // A second Identify on the same connection is refused.
        gw.identify(TOKEN, intents).await;
        assert_eq!(gw.closed().await, (4005, "Already authenticated.".into()));
    }

    #[tokio::test]
    async fn fake_discord_message_create_deserializes_into_serenity_message() {
        let fake = fake();
        let (mut gw, _) = Gateway::ready(&fake, MESSAGES).await;
        let id = fake.post(CHANNEL, ALICE, "alice", "hello <@1180000000000000001>");
        let event = gw.recv().await;
        assert_eq!((event["t"].as_str(), event["s"].as_u64()), (Some("MESSAGE_CREATE"), Some(2)));
        let d = event["d"].clone();
        assert_eq!(d["id"], json!(id.to_string()));
        assert_eq!(d["guild_id"], json!(GUILD_ID.to_string()));
        let message: Message = serde_json::from_value(d).expect("a serenity Message");
        assert_eq!(message.id.get(), id);
        assert_eq!(message.channel_id.get(), CHANNEL);
        assert_eq!(message.guild_id.map(|g| g.get()), Some(GUILD_ID));
        assert_eq!(message.author.id.get(), ALICE);
        assert_eq!(message.author.name, "alice");
        assert!(!message.author.bot);
        assert_eq!(message.content, "hello <@1180000000000000001>");
        assert_eq!(message.mentions.iter().map(|u| u.id.get()).collect::<Vec<_>>(), [BOT_ID]);
        assert!(message.webhook_id.is_none() && message.edited_timestamp.is_none());
        assert!(message.member.is_some());
        assert!(matches!(serenity_parses(&event), GatewayEvent::Dispatch(2, _)));

        // The bot's own messages and its webhooks' come back as MESSAGE_CREATE too.
        let (status, sent) = say(&fake, "from the bot");
        assert_eq!(status, 200, "{sent}");
        let own = gw.recv().await;
        assert_eq!(own["d"]["author"]["bot"], json!(true));
        assert_eq!(own["d"]["id"], sent["id"]);
        let own: Message = serde_json::from_value(own["d"].clone()).expect("the bot's message");
        assert_eq!(own.author.id.get(), BOT_ID);
        let rest: Message = serde_json::from_value(sent).expect("REST answer is a Message");
        assert_eq!(rest.id, own.id);

        let (_, hook) = create_hook(&fake, "Flock relay");
        let (status, executed) =
            execute(&fake, &hook, json!({"content": "relayed", "username": "bob"}));
        assert_eq!(status, 200, "{executed}");
        let relayed = gw.recv().await;
        let relayed: Message =
            serde_json::from_value(relayed["d"].clone()).expect("a webhook message");
        assert_eq!(
            relayed.webhook_id.map(|w| w.to_string()),
            hook["id"].as_str().map(String::from)
        );
        assert_eq!(relayed.author.name, "bob");
        assert!(relayed.author.bot);
        let rest: Message = serde_json::from_value(executed).expect("execute answer is a Message");
        assert_eq!(rest.id, relayed.id);

        // Edits are MESSAGE_UPDATEs carrying the whole message.
        fake.edit(CHANNEL, id, "hello again");
        let update = gw.recv().await;
        assert_eq!(update["t"], json!("MESSAGE_UPDATE"));
        assert_eq!(update["d"]["content"], json!("hello again"));
        assert!(update["d"]["edited_timestamp"].is_string());
        match serenity_parses(&update) {
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageUpdate(update)) => {
                assert_eq!(update.id.get(), id);
                assert_eq!(update.content.as_deref(), Some("hello again"));
            }
            other => panic!("not MESSAGE_UPDATE: {other:?}"),
        }
        let contents: Vec<String> = fake.messages(CHANNEL).into_iter().map(|m| m.content).collect();
        assert_eq!(contents, ["hello again", "from the bot", "relayed"]);
        let sent = fake.sent(CHANNEL);
        assert_eq!(sent.len(), 2);
        assert_eq!((sent[1].username.as_str(), sent[1].webhook_id.is_some()), ("bob", true));
    }

    #[tokio::test]
    async fn fake_discord_content_is_empty_without_message_content_intent() {
        let fake = fake();
        let (mut gw, _) = Gateway::ready(&fake, INTENT_GUILD_MESSAGES).await;
        fake.post(CHANNEL, ALICE, "alice", "secret");
        assert_eq!(gw.recv().await["d"]["content"], json!(""));
        fake.post(CHANNEL, ALICE, "alice", "<@1180000000000000001> ping");
        assert_eq!(gw.recv().await["d"]["content"], json!("<@1180000000000000001> ping"));
        // Without GUILD_MESSAGES there is no MESSAGE_CREATE at all.
        let (mut quiet, _) = Gateway::ready(&fake, INTENT_GUILDS).await;
        assert_eq!(quiet.recv().await["t"], json!("GUILD_CREATE"));
        fake.post(CHANNEL, ALICE, "alice", "unseen");
        assert_eq!(gw.recv().await["d"]["content"], json!(""));
        quiet.send(json!({"op": 1, "d": 2})).await;
        assert_eq!(quiet.recv().await["op"], json!(11), "no dispatch before the ack");
    }

    #[tokio::test]
    async fn fake_discord_wrong_token_closes_4004() {
        let fake = fake();
        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.identify("Bot not-the-token", MESSAGES).await;
        assert_eq!(gw.closed().await, (4004, "Authentication failed.".into()));
        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.send(json!({"op": 3, "d": {"status": "online"}})).await;
        assert_eq!(gw.closed().await, (4003, "Not authenticated.".into()));
        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.send(json!({"op": 42, "d": null})).await;
        assert_eq!(gw.closed().await, (4001, "Unknown opcode.".into()));
        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.identify(TOKEN, 1 << 40).await;
        assert_eq!(gw.closed().await, (4013, "Invalid intent(s).".into()));
    }

    #[tokio::test]
    async fn fake_discord_denied_message_content_closes_4014() {
        let fake = fake();
        fake.deny_message_content();
        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.identify(TOKEN, MESSAGES).await;
        assert_eq!(gw.closed().await, (4014, "Disallowed intent(s).".into()));
        // Without the privileged bit the bot connects, and sees no content.
        let (mut gw, _) = Gateway::ready(&fake, INTENT_GUILD_MESSAGES).await;
        fake.post(CHANNEL, ALICE, "alice", "secret");
        assert_eq!(gw.recv().await["d"]["content"], json!(""));
        // REST reads are gated the same way.
        let (_, history) =
            bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/messages"), None);
        assert_eq!(history[0]["content"], json!(""));
        assert_eq!(fake.messages(CHANNEL)[0].content, "secret");
        assert_eq!(fake.identifies(), [MESSAGES, INTENT_GUILD_MESSAGES]);
    }

    #[tokio::test]
    async fn fake_discord_resume_replays_missed_dispatches() {
        let fake = fake();
        let (mut gw, ready) = Gateway::ready(&fake, MESSAGES).await;
        let session = ready["session_id"].as_str().expect("a session id").to_string();
        fake.post(CHANNEL, ALICE, "alice", "one");
        assert_eq!(gw.recv().await["s"], json!(2));
        fake.drop_gateway();
        assert!(gw.dropped().await);
        fake.post(CHANNEL, ALICE, "alice", "two");
        fake.post(CHANNEL, ALICE, "alice", "three");
        let offline = fake.post_while_offline(CHANNEL, ALICE, "alice", "history only");

        let (mut gw, _) = Gateway::connect(&fake).await;
        gw.send(json!({"op": 6, "d": {"token": format!("Bot {TOKEN}"), "session_id": session, "seq": 2}}))
            .await;
        let two = gw.recv().await;
        let three = gw.recv().await;
        let resumed = gw.recv().await;
        assert_eq!((two["s"].as_u64(), two["d"]["content"].as_str()), (Some(3), Some("two")));
        assert_eq!((three["s"].as_u64(), three["d"]["content"].as_str()), (Some(4), Some("three")));
        assert_eq!((resumed["t"].as_str(), resumed["s"].as_u64()), (Some("RESUMED"), Some(5)));
        assert!(matches!(serenity_parses(&resumed), GatewayEvent::Dispatch(5, _)));
        assert_eq!(fake.resumes(), [(session.clone(), 2, true)]);
        assert_eq!(fake.messages(CHANNEL).last().map(|m| m.id), Some(offline));
        // The resumed connection gets new dispatches.
        fake.post(CHANNEL, ALICE, "alice", "four");
        assert_eq!(gw.recv().await["s"], json!(6));

        // An unknown session cannot be resumed.
        let (mut other, _) = Gateway::connect(&fake).await;
        other.send(json!({"op": 6, "d": {"token": TOKEN, "session_id": "nope", "seq": 1}})).await;
        let invalid = other.recv().await;
        assert_eq!((invalid["op"].as_u64(), invalid["d"].as_bool()), (Some(9), Some(false)));
        assert!(matches!(serenity_parses(&invalid), GatewayEvent::InvalidateSession(false)));
    }

    #[tokio::test]
    async fn fake_discord_reconnect_and_invalidate_session() {
        let fake = fake();
        let (mut gw, ready) = Gateway::ready(&fake, MESSAGES).await;
        fake.reconnect();
        let reconnect = gw.recv().await;
        assert_eq!(reconnect["op"], json!(7));
        assert!(matches!(serenity_parses(&reconnect), GatewayEvent::Reconnect));
        fake.invalidate_session();
        let invalid = gw.recv().await;
        assert_eq!((invalid["op"].as_u64(), invalid["d"].as_bool()), (Some(9), Some(false)));
        // The session is gone: resuming it fails.
        let (mut again, _) = Gateway::connect(&fake).await;
        again
            .send(json!({"op": 6, "d": {"token": TOKEN, "session_id": ready["session_id"], "seq": 1}}))
            .await;
        assert_eq!(again.recv().await["op"], json!(9));
        assert_eq!(fake.gateway_connections(), 2);
    }

    #[test]
    fn fake_discord_rest_requires_the_bot_token() {
        let fake = fake();
        let unauthorized = json!({"message": "401: Unauthorized", "code": 0});
        let (status, _, body) = http(&fake, "GET", "/api/v10/users/@me", None, None);
        assert_eq!((status, body), (401, unauthorized.clone()));
        let (status, _, body) = http(&fake, "GET", "/api/v10/users/@me", Some("Bot wrong"), None);
        assert_eq!((status, body), (401, unauthorized));
        let (status, me) = bot(&fake, "GET", "/api/v10/users/@me", None);
        assert_eq!(status, 200);
        assert_eq!(me["id"], json!(BOT_ID.to_string()));
        // `GET /gateway` needs no token; `/gateway/bot` does.
        let (status, _, gateway) = http(&fake, "GET", "/api/v10/gateway", None, None);
        assert_eq!((status, gateway), (200, json!({"url": fake.ws_url()})));
        let (status, gateway) = bot(&fake, "GET", "/api/v10/gateway/bot", None);
        assert_eq!(status, 200);
        assert_eq!(gateway["url"], json!(fake.ws_url()));
        assert_eq!(gateway["shards"], json!(1));
        assert_eq!(gateway["session_start_limit"]["max_concurrency"], json!(1));
        let (status, app) = bot(&fake, "GET", "/api/v10/oauth2/applications/@me", None);
        assert_eq!((status, &app["id"]), (200, &json!(APPLICATION_ID.to_string())));
        assert_eq!(bot(&fake, "GET", "/api/v10/nothing", None).0, 404);
        assert_eq!(bot(&fake, "DELETE", "/api/v10/users/@me", None).0, 405);
        let statuses: Vec<u16> = fake.rejected().iter().map(|r| r.2).collect();
        assert_eq!(statuses, [401, 401, 404, 405]);
        assert_eq!(fake.requests().len(), 8);
    }

    #[test]
    fn fake_discord_unknown_channel_is_10003() {
        let fake = fake();
        let unknown = json!({"message": "Unknown Channel", "code": 10003});
        assert_eq!(bot(&fake, "GET", "/api/v10/channels/42", None), (404, unknown.clone()));
        let (status, body) =
            bot(&fake, "POST", "/api/v10/channels/42/messages", Some(json!({"content": "x"})));
        assert_eq!((status, body), (404, unknown));
        let (status, channel) = bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}"), None);
        assert_eq!(status, 200);
        assert_eq!(channel["type"], json!(0));
        assert_eq!(channel["name"], json!("general"));
        assert_eq!(channel["guild_id"], json!(GUILD_ID.to_string()));
        let channel: serenity::model::channel::Channel =
            serde_json::from_value(channel).expect("a serenity Channel");
        assert!(channel.guild().is_some());
        assert_eq!(
            fake.rejected()[0],
            ("GET".into(), "/api/v10/channels/42".into(), 404, "Unknown Channel".into())
        );
    }

    #[test]
    fn fake_discord_message_limits_and_allowed_mentions() {
        let fake = fake();
        let path = format!("/api/v10/channels/{CHANNEL}/messages");
        let (status, body) = say(&fake, &"x".repeat(MAX_MESSAGE_CHARS + 1));
        assert_eq!(status, 400);
        assert_eq!(body["code"], json!(50035));
        assert_eq!(body["message"], json!("Invalid Form Body"));
        assert_eq!(body["errors"]["content"]["_errors"][0]["code"], json!("BASE_TYPE_MAX_LENGTH"));
        assert_eq!(
            say(&fake, "").1,
            json!({"message": "Cannot send an empty message", "code": 50006})
        );
        assert_eq!(say(&fake, &"é".repeat(MAX_MESSAGE_CHARS)).0, 200, "characters, not bytes");
        let allowed = json!({"parse": []});
        let body =
            json!({"content": "hi <@1180000000000000001> @everyone", "allowed_mentions": allowed});
        let (status, sent) = bot(&fake, "POST", &path, Some(body.clone()));
        assert_eq!(status, 200, "{sent}");
        assert_eq!((&sent["mentions"], &sent["mention_everyone"]), (&json!([]), &json!(false)));
        let sent = fake.sent(CHANNEL);
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[1].allowed_mentions, Some(allowed));
        assert_eq!((sent[1].author_id, sent[1].username.as_str()), (BOT_ID, BOT_USERNAME));
        assert_eq!(fake.requests().last().expect("a request"), &("POST".into(), path, body));
    }

    #[test]
    fn fake_discord_history_after_is_newest_first() {
        let fake = fake();
        let ids: Vec<u64> = (0..5)
            .map(|i| fake.post_while_offline(CHANNEL, ALICE, "alice", &format!("m{i}")))
            .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "snowflakes increase: {ids:?}");
        let history = |query: &str| {
            let (status, body) =
                bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/messages{query}"), None);
            assert_eq!(status, 200, "{body}");
            let contents: Vec<String> = body
                .as_array()
                .expect("an array")
                .iter()
                .map(|m| m["content"].as_str().expect("content").to_string())
                .collect();
            contents
        };
        assert_eq!(history(""), ["m4", "m3", "m2", "m1", "m0"]);
        assert_eq!(history(&format!("?after={}", ids[1])), ["m4", "m3", "m2"]);
        // The `limit` messages right after `after`, newest first (serenity writes `?&`).
        assert_eq!(history(&format!("?&after={}&limit=2", ids[1])), ["m3", "m2"]);
        assert_eq!(history(&format!("?before={}&limit=2", ids[3])), ["m2", "m1"]);
        assert_eq!(history("?limit=1"), ["m4"]);
        assert!(history(&format!("?after={}", ids[4])).is_empty());
        let (status, body) =
            bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/messages?limit=101"), None);
        assert_eq!((status, &body["code"]), (400, &json!(50035)));
        let (_, body) = bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/messages"), None);
        let messages: Vec<Message> = serde_json::from_value(body).expect("serenity Messages");
        assert_eq!(messages[0].id.get(), ids[4]);
    }

    #[test]
    fn fake_discord_webhook_rules() {
        let fake = fake();
        let (status, hook) = create_hook(&fake, "Flock relay");
        assert_eq!(status, 200, "{hook}");
        assert_eq!(hook["type"], json!(1));
        assert_eq!(hook["channel_id"], json!(CHANNEL.to_string()));
        assert_eq!(hook["name"], json!("Flock relay"));
        assert!(hook["token"].as_str().is_some_and(|t| t.len() == 68));
        let parsed: serenity::model::webhook::Webhook =
            serde_json::from_value(hook.clone()).expect("a serenity Webhook");
        assert!(parsed.token.is_some());
        for name in ["My Discord hook", "clyde", &"n".repeat(81), ""] {
            let (status, body) = create_hook(&fake, name);
            assert_eq!((status, &body["code"]), (400, &json!(50035)), "{name}: {body}");
        }
        let (_, refused) = create_hook(&fake, "discord relay");
        assert_eq!(
            refused["errors"]["name"]["_errors"][0],
            json!({"code": "USERNAME_INVALID_CONTAINS", "message": "Username cannot contain \"discord\""})
        );
        let (status, list) =
            bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/webhooks"), None);
        assert_eq!((status, list.as_array().map(Vec::len)), (200, Some(1)));

        let (status, message) =
            execute(&fake, &hook, json!({"content": "hi", "username": "alice (Telegram)"}));
        assert_eq!(status, 200, "{message}");
        assert_eq!(message["author"]["username"], json!("alice (Telegram)"));
        assert_eq!(message["author"]["id"], hook["id"]);
        assert_eq!(message["webhook_id"], hook["id"]);
        let (status, body) =
            execute(&fake, &hook, json!({"content": "hi", "username": "Discord fan"}));
        assert_eq!((status, &body["code"]), (400, &json!(50035)), "{body}");
        assert!(body["errors"]["username"].is_object(), "{body}");
        // Without `wait=true`: 204.
        let path = format!(
            "/api/v10/webhooks/{}/{}",
            hook["id"].as_str().unwrap_or(""),
            hook["token"].as_str().unwrap_or("")
        );
        let (status, _, _) = http(&fake, "POST", &path, None, Some(&json!({"content": "no wait"})));
        assert_eq!(status, 204);
        let sent = fake.sent(CHANNEL);
        assert_eq!(
            sent.iter().map(|m| m.username.as_str()).collect::<Vec<_>>(),
            ["alice (Telegram)", "Flock relay"]
        );
    }

    #[test]
    fn fake_discord_unknown_webhook_is_10015() {
        let fake = fake();
        let unknown = json!({"message": "Unknown Webhook", "code": 10015});
        let (_, hook) = create_hook(&fake, "Flock relay");
        let mut wrong = hook.clone();
        wrong["token"] = json!("not-the-token");
        assert_eq!(execute(&fake, &wrong, json!({"content": "x"})), (404, unknown.clone()));
        let mut missing = hook.clone();
        missing["id"] = json!("42");
        assert_eq!(execute(&fake, &missing, json!({"content": "x"})), (404, unknown.clone()));
        assert_eq!(execute(&fake, &hook, json!({"content": "x"})).0, 200);
        fake.delete_webhooks(CHANNEL);
        assert_eq!(execute(&fake, &hook, json!({"content": "x"})), (404, unknown));
        assert!(fake.webhooks(CHANNEL).is_empty());
        let codes: Vec<u16> = fake.rejected().iter().map(|r| r.2).collect();
        assert_eq!(codes, [404, 404, 404]);

        fake.missing_webhook_permission(CHANNEL);
        let (status, body) = create_hook(&fake, "Flock relay");
        assert_eq!((status, body), (403, json!({"message": "Missing Permissions", "code": 50013})));
    }

    #[test]
    fn fake_discord_rate_limit_answers_429_with_retry_after() {
        let fake = fake();
        let (_, hook) = create_hook(&fake, "Flock relay");
        fake.rate_limit_next(2, 0.5);
        let path = format!("/api/v10/channels/{CHANNEL}/messages");
        let auth = format!("Bot {TOKEN}");
        let (status, headers, body) =
            http(&fake, "POST", &path, Some(&auth), Some(&json!({"content": "x"})));
        assert_eq!(status, 429);
        assert_eq!(
            body,
            json!({"message": "You are being rate limited.", "retry_after": 0.5, "global": false})
        );
        let header = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
        assert_eq!(header("retry-after"), Some("1"));
        assert_eq!(header("x-ratelimit-remaining"), Some("0"));
        assert_eq!(header("x-ratelimit-reset-after"), Some("0.500"));
        assert_eq!(header("x-ratelimit-scope"), Some("user"));
        assert!(header("x-ratelimit-limit").is_some() && header("x-ratelimit-bucket").is_some());
        assert!(header("x-ratelimit-reset").is_some());
        assert_eq!(execute(&fake, &hook, json!({"content": "x"})).0, 429);
        assert_eq!(execute(&fake, &hook, json!({"content": "x"})).0, 200);
        assert_eq!(say(&fake, "x").0, 200);
        assert_eq!(fake.sent(CHANNEL).len(), 2);
        let refused: Vec<(u16, String)> = fake.rejected().into_iter().map(|r| (r.2, r.3)).collect();
        assert_eq!(
            refused,
            [
                (429, "You are being rate limited.".into()),
                (429, "You are being rate limited.".into())
            ]
        );
    }

    #[test]
    fn fake_discord_wait_sent_waits_for_another_thread() {
        let fake = Arc::new(fake());
        let sender = Arc::clone(&fake);
        let thread = std::thread::spawn(move || {
            for text in ["one", "two"] {
                std::thread::sleep(Duration::from_millis(100));
                assert_eq!(say(&sender, text).0, 200);
            }
        });
        let sent = fake.wait_sent(CHANNEL, 2, SECS);
        assert_eq!(sent.iter().map(|m| m.content.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        thread.join().expect("the sender");
    }

    // -----------------------------------------------------------------------------------------
    // The real serenity 0.12.5 client against the fake.

    /// An edit or a deletion serenity handed to the event handler.
    #[derive(Debug)]
    enum Change {
        Updated(Box<MessageUpdateEvent>),
        /// `(channel_id, message_id, guild_id)`.
        Deleted(ChannelId, MessageId, Option<GuildId>),
    }

    impl Change {
        fn message_id(&self) -> MessageId {
            match self {
                Change::Updated(update) => update.id,
                Change::Deleted(_, id, _) => *id,
            }
        }
    }

    /// Records every message, edit and deletion serenity hands to the event handler.
    struct Recorder {
        messages: std::sync::mpsc::Sender<Message>,
        ready: std::sync::mpsc::Sender<Ready>,
        changes: std::sync::mpsc::Sender<Change>,
    }

    #[serenity::async_trait]
    impl EventHandler for Recorder {
        async fn message(&self, _ctx: Context, message: Message) {
            let _ = self.messages.send(message);
        }

        async fn message_update(
            &self,
            _ctx: Context,
            _old: Option<Message>,
            _new: Option<Message>,
            event: MessageUpdateEvent,
        ) {
            let _ = self.changes.send(Change::Updated(Box::new(event)));
        }

        async fn message_delete(
            &self,
            _ctx: Context,
            channel_id: ChannelId,
            message_id: MessageId,
            guild_id: Option<GuildId>,
        ) {
            let _ = self.changes.send(Change::Deleted(channel_id, message_id, guild_id));
        }

        async fn ready(&self, _ctx: Context, ready: Ready) {
            let _ = self.ready.send(ready);
        }
    }

    /// A serenity client pointed at the fake, started on a runtime of its own.
    struct Bot {
        rt: tokio::runtime::Runtime,
        http: Arc<Http>,
        shards: Arc<ShardManager>,
        running: tokio::task::JoinHandle<serenity::Result<()>>,
        messages: std::sync::mpsc::Receiver<Message>,
        ready: std::sync::mpsc::Receiver<Ready>,
        changes: std::sync::mpsc::Receiver<Change>,
        /// Messages delivered but not asked for yet (serenity runs every event handler call as
        /// a task of its own, so they may arrive out of order).
        unclaimed: std::cell::RefCell<Vec<Message>>,
        /// The same for edits and deletions.
        unclaimed_changes: std::cell::RefCell<Vec<Change>>,
    }

    impl Bot {
        fn start(fake: &FakeDiscord, token: &str, intents: GatewayIntents) -> Bot {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for serenity");
            let (messages_tx, messages) = std::sync::mpsc::channel();
            let (ready_tx, ready) = std::sync::mpsc::channel();
            let (changes_tx, changes) = std::sync::mpsc::channel();
            let http =
                HttpBuilder::new(token).proxy(fake.base_url()).ratelimiter_disabled(true).build();
            let recorder = Recorder { messages: messages_tx, ready: ready_tx, changes: changes_tx };
            let mut client = rt
                .block_on(async {
                    ClientBuilder::new_with_http(http, intents).event_handler(recorder).await
                })
                .expect("a serenity client");
            let http = Arc::clone(&client.http);
            let shards = Arc::clone(&client.shard_manager);
            let running = rt.spawn(async move { client.start().await });
            let (unclaimed, unclaimed_changes) = Default::default();
            Bot {
                rt,
                http,
                shards,
                running,
                messages,
                ready,
                changes,
                unclaimed,
                unclaimed_changes,
            }
        }

        /// The edit or deletion of message `id` serenity delivered (in any order) that `wanted`
        /// accepts.
        #[track_caller]
        fn change(&self, id: MessageId, wanted: impl Fn(&Change) -> bool) -> Change {
            let mut unclaimed = self.unclaimed_changes.borrow_mut();
            let matches = |c: &Change| c.message_id() == id && wanted(c);
            if let Some(i) = unclaimed.iter().position(matches) {
                return unclaimed.remove(i);
            }
            let deadline = Instant::now() + SECS;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.changes.recv_timeout(left) {
                    Ok(change) if matches(&change) => return change,
                    Ok(change) => unclaimed.push(change),
                    Err(e) => {
                        panic!("serenity delivered no such change of {id}: {e}; got {unclaimed:?}")
                    }
                }
            }
        }

        /// The `MESSAGE_UPDATE` of message `id` serenity delivered.
        #[track_caller]
        fn updated(&self, id: MessageId) -> MessageUpdateEvent {
            match self.change(id, |c| matches!(c, Change::Updated(_))) {
                Change::Updated(update) => *update,
                Change::Deleted(..) => unreachable!("only updates are picked"),
            }
        }

        /// The `MESSAGE_DELETE` of message `id` serenity delivered: `(channel, guild)`.
        #[track_caller]
        fn deleted(&self, id: MessageId) -> (ChannelId, Option<GuildId>) {
            match self.change(id, |c| matches!(c, Change::Deleted(..))) {
                Change::Deleted(channel, _, guild) => (channel, guild),
                Change::Updated(_) => unreachable!("only deletions are picked"),
            }
        }

        /// The message with content `content` serenity delivered (in any order).
        #[track_caller]
        fn received(&self, content: &str) -> Message {
            let mut unclaimed = self.unclaimed.borrow_mut();
            if let Some(i) = unclaimed.iter().position(|m| m.content == content) {
                return unclaimed.remove(i);
            }
            let deadline = Instant::now() + SECS;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.messages.recv_timeout(left) {
                    Ok(message) if message.content == content => return message,
                    Ok(message) => unclaimed.push(message),
                    Err(e) => panic!(
                        "serenity delivered no message {content:?}: {e}; got {:?}",
                        unclaimed.iter().map(|m| &m.content).collect::<Vec<_>>()
                    ),
                }
            }
        }

        /// The error `Client::start` returned (within 10 s), if any.
        fn outcome(self) -> Option<serenity::Error> {
            let Bot { rt, running, .. } = self;
            let result = rt
                .block_on(async { tokio::time::timeout(SECS, running).await })
                .expect("Client::start returned in time")
                .expect("the client task did not panic");
            rt.shutdown_timeout(Duration::from_secs(1));
            result.err()
        }

        fn stop(self) {
            self.rt.block_on(self.shards.shutdown_all());
            let _ = self.outcome();
        }
    }

    fn serenity_intents() -> GatewayIntents {
        GatewayIntents::GUILD_MESSAGES | GatewayIntents::MESSAGE_CONTENT
    }

    #[test]
    fn fake_discord_serenity_client_receives_posts_and_executes_webhooks() {
        let fake = fake();
        let bot = Bot::start(&fake, TOKEN, serenity_intents());
        let ready = bot.ready.recv_timeout(SECS).expect("serenity got READY");
        assert_eq!(ready.user.id.get(), BOT_ID);
        fake.wait_connected(SECS);
        assert_eq!(fake.identifies(), [serenity_intents().bits()]);
        assert_eq!(fake.gateway_connections(), 1);

        let id = fake.post(CHANNEL, ALICE, "alice", "hello from a person");
        let message = bot.received("hello from a person");
        assert_eq!(message.id.get(), id);
        assert_eq!(message.author.id.get(), ALICE);
        assert_eq!(message.author.name, "alice");
        assert_eq!(message.guild_id.map(|g| g.get()), Some(GUILD_ID));

        let channel = ChannelId::new(CHANNEL);
        let (hook, executed, said, history) = bot.rt.block_on(async {
            let hook = channel
                .create_webhook(&bot.http, CreateWebhook::new("Flock relay"))
                .await
                .expect("create webhook");
            let builder =
                ExecuteWebhook::new().content("relayed by webhook").username("alice (Telegram)");
            let executed = hook.execute(&bot.http, true, builder).await.expect("execute webhook");
            let said = channel.say(&bot.http, "said by the bot").await.expect("say");
            let history = channel
                .messages(&bot.http, GetMessages::new().after(id).limit(10))
                .await
                .expect("history");
            (hook, executed, said, history)
        });
        let executed = executed.expect("wait=true answers the message");
        assert_eq!(executed.author.name, "alice (Telegram)");
        assert_eq!(executed.webhook_id, Some(hook.id));
        assert_eq!(said.author.id.get(), BOT_ID);
        // Discord echoes the bot's and its webhooks' messages on the gateway.
        assert!(bot.received("relayed by webhook").author.bot);
        assert_eq!(bot.received("said by the bot").author.id.get(), BOT_ID);
        assert_eq!(history.iter().map(|m| m.id).collect::<Vec<_>>(), [said.id, executed.id]);

        let sent = fake.wait_sent(CHANNEL, 2, SECS);
        assert_eq!(sent[0].content, "relayed by webhook");
        assert_eq!(sent[0].username, "alice (Telegram)");
        assert_eq!(sent[0].webhook_id, Some(hook.id.get()));
        assert_eq!((sent[1].author_id, sent[1].content.as_str()), (BOT_ID, "said by the bot"));
        let requests = fake.requests();
        let paths: Vec<String> = requests.iter().map(|(m, p, _)| format!("{m} {p}")).collect();
        assert_eq!(
            paths[0], "GET /api/v10/gateway",
            "serenity asks for the gateway first: {paths:#?}"
        );
        assert!(
            paths.contains(&format!("POST /api/v10/channels/{CHANNEL}/webhooks")),
            "{paths:#?}"
        );
        let (_, token, _) = fake.webhooks(CHANNEL).pop().expect("the webhook");
        assert!(
            paths.contains(&format!("POST /api/v10/webhooks/{}/{token}?&wait=true", hook.id)),
            "{paths:#?}"
        );
        let execute = requests
            .iter()
            .find(|(_, p, _)| p.starts_with("/api/v10/webhooks/"))
            .expect("the execute");
        assert_eq!(execute.2["username"], json!("alice (Telegram)"));
        assert_eq!(execute.2["content"], json!("relayed by webhook"));
        assert!(fake.rejected().is_empty(), "{:#?}", fake.rejected());
        bot.stop();
    }

    #[test]
    fn fake_discord_serenity_reports_disallowed_intents_on_4014() {
        let fake = fake();
        fake.deny_message_content();
        let bot = Bot::start(&fake, TOKEN, serenity_intents());
        let error = bot.outcome().expect("4014 stops the client");
        assert!(
            matches!(
                error,
                serenity::Error::Gateway(serenity::gateway::GatewayError::DisallowedGatewayIntents)
            ),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "Disallowed gateway intents were provided");
        assert_eq!(fake.identifies(), [serenity_intents().bits()]);
    }

    #[test]
    fn fake_discord_serenity_reports_invalid_authentication_on_4004() {
        let fake = fake();
        let bot = Bot::start(&fake, "not-the-token", serenity_intents());
        let error = bot.outcome().expect("4004 stops the client");
        assert!(
            matches!(
                error,
                serenity::Error::Gateway(serenity::gateway::GatewayError::InvalidAuthentication)
            ),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "Sent invalid authentication");
    }

    /// What serenity (rate limiter disabled) makes of the fake's answers and errors.
    #[test]
    fn fake_discord_serenity_rest_calls_and_errors() {
        let fake = fake();
        let http =
            HttpBuilder::new(TOKEN).proxy(fake.base_url()).ratelimiter_disabled(true).build();
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let channel = ChannelId::new(CHANNEL);
        let me = rt.block_on(http.get_current_user()).expect("users/@me");
        assert_eq!((me.id.get(), me.name.as_str(), me.bot), (BOT_ID, BOT_USERNAME, true));
        let app = rt.block_on(http.get_current_application_info()).expect("applications/@me");
        assert_eq!(app.id.get(), APPLICATION_ID);
        let gateway = rt.block_on(http.get_bot_gateway()).expect("gateway/bot");
        assert_eq!((gateway.url, gateway.shards), (fake.ws_url(), 1));
        assert_eq!(rt.block_on(http.get_gateway()).expect("gateway").url, fake.ws_url());
        let general = rt.block_on(channel.to_channel(&http)).expect("a channel");
        assert_eq!(general.guild().map(|c| c.name), Some("general".to_string()));
        let error = |result: serenity::Result<()>| match result {
            Err(serenity::Error::Http(HttpError::UnsuccessfulRequest(response))) => response,
            other => panic!("expected an unsuccessful request, got {other:?}"),
        };
        fake.rate_limit_next(1, 0.25);
        let limited = error(rt.block_on(channel.say(&http, "x")).map(drop));
        assert_eq!(limited.status_code.as_u16(), 429);
        // Discord's 429 body has no `code`: serenity reports -1 and a decoding message, and
        // drops the Retry-After headers (with its rate limiter disabled).
        assert_eq!(limited.error.code, -1);
        assert!(
            limited.error.message.contains("Could not decode json"),
            "{}",
            limited.error.message
        );

        let hook = rt
            .block_on(channel.create_webhook(&http, CreateWebhook::new("Flock relay")))
            .expect("webhook");
        fake.delete_webhooks(CHANNEL);
        let gone = error(
            rt.block_on(hook.execute(&http, true, ExecuteWebhook::new().content("x"))).map(drop),
        );
        assert_eq!((gone.status_code.as_u16(), gone.error.code), (404, 10015));
        assert_eq!(gone.error.message, "Unknown Webhook");

        let refused = error(
            rt.block_on(channel.create_webhook(&http, CreateWebhook::new("my discord"))).map(drop),
        );
        assert_eq!((refused.status_code.as_u16(), refused.error.code), (400, 50035));
        assert_eq!(refused.error.errors[0].path, "name");
        assert_eq!(refused.error.errors[0].code, "USERNAME_INVALID_CONTAINS");

        fake.missing_webhook_permission(CHANNEL);
        let denied = error(
            rt.block_on(channel.create_webhook(&http, CreateWebhook::new("Flock relay"))).map(drop),
        );
        assert_eq!((denied.status_code.as_u16(), denied.error.code), (403, 50013));

        let missing = error(rt.block_on(ChannelId::new(42).to_channel(&http)).map(drop));
        assert_eq!((missing.status_code.as_u16(), missing.error.code), (404, 10003));
    }

    /// `Err(UnsuccessfulRequest)` of a serenity call, whatever it returns on success.
    #[track_caller]
    fn refused<T: std::fmt::Debug>(result: serenity::Result<T>) -> serenity::http::ErrorResponse {
        match result {
            Err(serenity::Error::Http(HttpError::UnsuccessfulRequest(response))) => response,
            other => panic!("expected an unsuccessful request, got {other:?}"),
        }
    }

    /// What a bridge does to archive a channel, through serenity: find or create the category
    /// "Flock archive", move the channel into it, deny SEND_MESSAGES to @everyone.
    #[test]
    fn fake_discord_serenity_moves_a_channel_into_a_category_and_denies_sending() {
        let fake = fake();
        let http =
            HttpBuilder::new(TOKEN).proxy(fake.base_url()).ratelimiter_disabled(true).build();
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let (guild, channel) = (GuildId::new(GUILD_ID), ChannelId::new(CHANNEL));

        let before = rt.block_on(guild.channels(&http)).expect("guild channels");
        assert_eq!(before.len(), 1);
        let general = &before[&channel];
        assert_eq!((general.kind, general.parent_id), (ChannelType::Text, None));
        assert!(general.permission_overwrites.is_empty());
        assert!(fake.categories().is_empty());

        let create = CreateChannel::new("Flock archive")
            .kind(ChannelType::Category)
            .audit_log_reason("Flock: archive");
        let category = rt.block_on(guild.create_channel(&http, create)).expect("a category");
        assert_eq!(
            (category.kind, category.name.as_str()),
            (ChannelType::Category, "Flock archive")
        );
        assert_eq!((category.guild_id, category.parent_id), (guild, None));
        assert_eq!(fake.categories(), [(category.id.get(), "Flock archive".to_string())]);

        let moved = rt
            .block_on(channel.edit(
                &http,
                EditChannel::new().category(Some(category.id)).audit_log_reason("Flock: archive"),
            ))
            .expect("moved");
        assert_eq!((moved.id, moved.parent_id), (channel, Some(category.id)));

        let everyone = PermissionOverwriteType::Role(RoleId::new(GUILD_ID));
        let deny = |deny: Permissions| PermissionOverwrite {
            allow: Permissions::empty(),
            deny,
            kind: everyone,
        };
        rt.block_on(channel.create_permission(&http, deny(Permissions::SEND_MESSAGES)))
            .expect("overwrite");
        assert_eq!(Permissions::SEND_MESSAGES.bits(), PERMISSION_SEND_MESSAGES);

        let after = rt.block_on(guild.channels(&http)).expect("guild channels");
        assert_eq!(after.len(), 2);
        let general = &after[&channel];
        assert_eq!(general.parent_id, Some(category.id));
        let overwrites: Vec<_> =
            general.permission_overwrites.iter().map(|o| (o.kind, o.allow, o.deny)).collect();
        assert_eq!(overwrites, [(everyone, Permissions::empty(), Permissions::SEND_MESSAGES)]);
        assert_eq!(after[&category.id].kind, ChannelType::Category);

        let json = fake.channel(CHANNEL).expect("the channel");
        assert_eq!(json["parent_id"], json!(category.id.to_string()));
        assert_eq!(
            json["permission_overwrites"],
            json!([{"id": GUILD_ID.to_string(), "type": 0, "allow": "0", "deny": "2048"}])
        );
        let category_json = fake.channel(category.id.get()).expect("the category");
        assert_eq!(
            (&category_json["type"], &category_json["parent_id"]),
            (&json!(4), &Value::Null)
        );
        assert!(category_json.get("last_message_id").is_none());
        assert_eq!(
            rt.block_on(channel.to_channel(&http)).expect("a channel").guild().map(|c| c.parent_id),
            Some(Some(category.id))
        );

        // Another PUT for @everyone replaces the overwrite; DELETE removes it.
        let both = Permissions::SEND_MESSAGES | Permissions::ADD_REACTIONS;
        rt.block_on(channel.create_permission(&http, deny(both))).expect("overwrite");
        let json = fake.channel(CHANNEL).expect("the channel");
        let deny_bits = both.bits().to_string();
        assert_eq!(json["permission_overwrites"].as_array().map(Vec::len), Some(1));
        assert_eq!(json["permission_overwrites"][0]["deny"], json!(deny_bits));
        rt.block_on(channel.delete_permission(&http, everyone)).expect("deleted");
        assert_eq!(fake.channel(CHANNEL).expect("the channel")["permission_overwrites"], json!([]));
        let gone = refused(rt.block_on(channel.delete_permission(&http, everyone)));
        assert_eq!((gone.status_code.as_u16(), gone.error.code), (404, 10009));

        // Out of the category again.
        let back =
            rt.block_on(channel.edit(&http, EditChannel::new().category(None))).expect("moved");
        assert_eq!(back.parent_id, None);
        assert_eq!(fake.rejected().len(), 1, "only the second DELETE: {:?}", fake.rejected());
        assert!(fake.channel(42).is_none());
    }

    /// Without MANAGE_CHANNELS / MANAGE_ROLES every step answers 403 (50013); reading works.
    #[test]
    fn fake_discord_serenity_missing_manage_channels_is_50013() {
        let fake = fake();
        fake.add_category(CATEGORY, "Flock archive");
        fake.deny_manage_channels();
        let http =
            HttpBuilder::new(TOKEN).proxy(fake.base_url()).ratelimiter_disabled(true).build();
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let (guild, channel) = (GuildId::new(GUILD_ID), ChannelId::new(CHANNEL));
        assert_eq!(rt.block_on(guild.channels(&http)).expect("guild channels").len(), 2);

        let create = CreateChannel::new("Flock archive 2").kind(ChannelType::Category);
        let denied = refused(rt.block_on(guild.create_channel(&http, create)));
        assert_eq!((denied.status_code.as_u16(), denied.error.code), (403, 50013));
        assert_eq!(denied.error.message, "Missing Permissions");
        let edit = EditChannel::new().category(Some(ChannelId::new(CATEGORY)));
        let denied = refused(rt.block_on(channel.edit(&http, edit)));
        assert_eq!((denied.status_code.as_u16(), denied.error.code), (403, 50013));
        let overwrite = PermissionOverwrite {
            allow: Permissions::empty(),
            deny: Permissions::SEND_MESSAGES,
            kind: PermissionOverwriteType::Role(RoleId::new(GUILD_ID)),
        };
        let denied = refused(rt.block_on(channel.create_permission(&http, overwrite)));
        assert_eq!((denied.status_code.as_u16(), denied.error.code), (403, 50013));

        assert_eq!(fake.categories(), [(CATEGORY, "Flock archive".to_string())]);
        let json = fake.channel(CHANNEL).expect("the channel");
        assert_eq!(
            (&json["parent_id"], &json["permission_overwrites"]),
            (&Value::Null, &json!([]))
        );
        assert_eq!(fake.rejected().len(), 3);
    }

    /// Discord's validation of Create Guild Channel, Modify Channel and Edit Channel
    /// Permissions, on the raw wire.
    #[test]
    fn fake_discord_channel_management_rules() {
        let fake = fake();
        fake.add_category(CATEGORY, "Flock archive");
        let channels = format!("/api/v10/guilds/{GUILD_ID}/channels");
        let channel = format!("/api/v10/channels/{CHANNEL}");
        let error_path = |body: &Value| {
            let errors = &body["errors"];
            let key = errors.as_object().and_then(|e| e.keys().next().cloned()).unwrap_or_default();
            (body["code"].clone(), key)
        };

        // Names: 1–100 characters.
        for name in [json!(""), json!("x".repeat(101)), Value::Null] {
            let (status, body) =
                bot(&fake, "POST", &channels, Some(json!({"name": name, "type": 4})));
            assert_eq!((status, error_path(&body)), (400, (json!(50035), "name".into())), "{body}");
        }
        let (status, body) =
            bot(&fake, "POST", &channels, Some(json!({"name": "x".repeat(100), "type": 4})));
        assert_eq!(status, 201, "{body}");
        // A category has no parent; a parent must be a category of the guild.
        let (status, body) = bot(
            &fake,
            "POST",
            &channels,
            Some(json!({"name": "nested", "type": 4, "parent_id": CATEGORY.to_string()})),
        );
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "parent_id".into())));
        let (status, body) = bot(
            &fake,
            "POST",
            &channels,
            Some(json!({"name": "in-a-channel", "type": 0, "parent_id": CHANNEL.to_string()})),
        );
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "parent_id".into())));
        let (status, body) =
            bot(&fake, "POST", "/api/v10/guilds/42/channels", Some(json!({"name": "x"})));
        assert_eq!((status, &body["code"]), (404, &json!(10004)));

        // A text channel created in a category takes its overwrites (synced).
        let overwrite = json!({"id": GUILD_ID.to_string(), "type": 0, "allow": 0, "deny": 2048});
        let (status, _) = bot(
            &fake,
            "PATCH",
            &format!("/api/v10/channels/{CATEGORY}"),
            Some(json!({"permission_overwrites": [overwrite]})),
        );
        assert_eq!(status, 200);
        let (status, created) = bot(
            &fake,
            "POST",
            &channels,
            Some(json!({"name": "archived", "parent_id": CATEGORY.to_string()})),
        );
        assert_eq!(status, 201, "{created}");
        assert_eq!(
            (&created["type"], &created["parent_id"]),
            (&json!(0), &json!(CATEGORY.to_string()))
        );
        assert_eq!(created["permission_overwrites"][0]["deny"], json!("2048"));

        // Modify Channel: an unknown parent is refused and nothing changes.
        let (status, body) =
            bot(&fake, "PATCH", &channel, Some(json!({"name": "renamed", "parent_id": "42"})));
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "parent_id".into())));
        assert_eq!(fake.channel(CHANNEL).expect("the channel")["name"], json!("general"));
        let (status, body) = bot(&fake, "PATCH", &channel, Some(json!({"parent_id": "x"})));
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "parent_id".into())));
        let (status, body) = bot(
            &fake,
            "PATCH",
            &channel,
            Some(json!({"permission_overwrites": [{"id": GUILD_ID.to_string(), "type": 2}]})),
        );
        assert_eq!(status, 400);
        assert!(
            body["errors"]["permission_overwrites"]["0"]["type"]["_errors"].is_array(),
            "{body}"
        );
        let (status, body) =
            bot(&fake, "PATCH", "/api/v10/channels/42", Some(json!({"name": "x"})));
        assert_eq!((status, &body["code"]), (404, &json!(10003)));

        // Edit Channel Permissions: allow/deny as numbers or strings, `type` required.
        let target = format!("{channel}/permissions/{ALICE}");
        let (status, _) = bot(&fake, "PUT", &target, Some(json!({"type": 1, "allow": 2048})));
        assert_eq!(status, 204);
        let (status, body) = bot(&fake, "PUT", &target, Some(json!({"allow": "2048"})));
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "type".into())));
        let (status, body) = bot(&fake, "PUT", &target, Some(json!({"type": 1, "deny": "lots"})));
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "deny".into())));
        let json = fake.channel(CHANNEL).expect("the channel");
        assert_eq!(
            json["permission_overwrites"],
            json!([{"id": ALICE.to_string(), "type": 1, "allow": "2048", "deny": "0"}])
        );

        // No messages in a category; a category holds at most 50 channels.
        let (status, body) = bot(
            &fake,
            "POST",
            &format!("/api/v10/channels/{CATEGORY}/messages"),
            Some(json!({"content": "x"})),
        );
        assert_eq!((status, &body["code"]), (400, &json!(50008)));
        for i in 1..MAX_CHANNELS_PER_CATEGORY {
            let (status, body) = bot(
                &fake,
                "POST",
                &channels,
                Some(json!({"name": format!("c{i}"), "parent_id": CATEGORY.to_string()})),
            );
            assert_eq!(status, 201, "{body}");
        }
        let (status, body) =
            bot(&fake, "PATCH", &channel, Some(json!({"parent_id": CATEGORY.to_string()})));
        assert_eq!((status, error_path(&body)), (400, (json!(50035), "parent_id".into())));
        assert_eq!(
            body["errors"]["parent_id"]["_errors"][0]["code"],
            json!("CHANNEL_PARENT_MAX_CHANNELS")
        );
        let (status, body) = bot(&fake, "GET", &channels, None);
        assert_eq!(status, 200);
        assert_eq!(body.as_array().map(Vec::len), Some(MAX_CHANNELS_PER_CATEGORY + 3));
    }

    /// Creating and modifying channels and their overwrites dispatch `CHANNEL_CREATE` /
    /// `CHANNEL_UPDATE` (GUILDS intent) with the channel object, as serenity parses them.
    #[tokio::test]
    async fn fake_discord_channel_changes_are_dispatched() {
        let fake = fake();
        let (mut gw, _) = Gateway::ready(&fake, INTENT_GUILDS).await;
        assert_eq!(gw.recv().await["t"], json!("GUILD_CREATE"));
        let channels = format!("/api/v10/guilds/{GUILD_ID}/channels");
        let (status, category) =
            bot(&fake, "POST", &channels, Some(json!({"name": "Flock archive", "type": 4})));
        assert_eq!(status, 201);
        let created = gw.recv().await;
        assert_eq!(
            (&created["t"], &created["d"]["id"]),
            (&json!("CHANNEL_CREATE"), &category["id"])
        );
        assert!(matches!(
            serenity_parses(&created),
            GatewayEvent::Dispatch(_, serenity::model::event::Event::ChannelCreate(_))
        ));

        let path = format!("/api/v10/channels/{CHANNEL}");
        let (status, _) = bot(&fake, "PATCH", &path, Some(json!({"parent_id": category["id"]})));
        assert_eq!(status, 200);
        let moved = gw.recv().await;
        assert_eq!(
            (&moved["t"], &moved["d"]["parent_id"]),
            (&json!("CHANNEL_UPDATE"), &category["id"])
        );
        match serenity_parses(&moved) {
            GatewayEvent::Dispatch(_, serenity::model::event::Event::ChannelUpdate(update)) => {
                let channel = update.channel;
                assert_eq!(
                    channel.parent_id.map(|p| p.get().to_string()),
                    category["id"].as_str().map(str::to_string)
                );
            }
            other => panic!("not CHANNEL_UPDATE: {other:?}"),
        }
        let target = format!("{path}/permissions/{GUILD_ID}");
        let (status, _) = bot(&fake, "PUT", &target, Some(json!({"type": 0, "deny": "2048"})));
        assert_eq!(status, 204);
        let locked = gw.recv().await;
        assert_eq!(locked["t"], json!("CHANNEL_UPDATE"));
        assert_eq!(locked["d"]["permission_overwrites"][0]["deny"], json!("2048"));

        // A new READY's GUILD_CREATE has both, as they are now.
        let (mut again, _) = Gateway::ready(&fake, INTENT_GUILDS).await;
        let guild = again.recv().await;
        assert_eq!(guild["d"]["channels"].as_array().map(Vec::len), Some(2));
        assert!(matches!(
            serenity_parses(&guild),
            GatewayEvent::Dispatch(_, serenity::model::event::Event::GuildCreate(_))
        ));
    }

    #[test]
    fn fake_discord_serenity_resumes_after_a_dropped_gateway() {
        let fake = fake();
        fake.set_heartbeat_interval(200);
        let bot = Bot::start(&fake, TOKEN, serenity_intents());
        bot.ready.recv_timeout(SECS).expect("READY");
        fake.wait_connected(SECS);
        fake.post(CHANNEL, ALICE, "alice", "before");
        bot.received("before");

        fake.drop_gateway();
        fake.post(CHANNEL, ALICE, "alice", "while dropped");
        bot.received("while dropped");
        let resumes = fake.resumes();
        assert_eq!(resumes.len(), 1);
        assert!(resumes[0].2, "serenity resumed its session: {resumes:?}");

        fake.reconnect();
        fake.post(CHANNEL, ALICE, "alice", "after op 7");
        bot.received("after op 7");
        assert_eq!(fake.identifies().len(), 1, "never identified again");
        crate::wait_for(|| !fake.heartbeats().is_empty(), SECS, "serenity heartbeats");
        bot.stop();
    }

    /// Edits and deletions of the bot's messages and its webhooks' through serenity, as a bridge
    /// follows a person's edit or deletion elsewhere.
    #[test]
    fn fake_discord_serenity_edits_and_deletes_webhook_and_bot_messages() {
        let fake = fake();
        let bot = Bot::start(&fake, TOKEN, serenity_intents());
        bot.ready.recv_timeout(SECS).expect("READY");
        fake.wait_connected(SECS);
        let channel = ChannelId::new(CHANNEL);
        let http = &bot.http;
        let (hook, other, relayed, said) = bot.rt.block_on(async {
            let hook = channel.create_webhook(http, CreateWebhook::new("Flock relay")).await;
            let other = channel.create_webhook(http, CreateWebhook::new("Someone else")).await;
            let (hook, other) = (hook.expect("a webhook"), other.expect("another webhook"));
            let builder = ExecuteWebhook::new().content("relayed").username("alice (Telegram)");
            let relayed = hook.execute(http, true, builder).await.expect("execute");
            let said = channel.send_message(http, CreateMessage::new().content("said")).await;
            (hook, other, relayed.expect("wait=true answers"), said.expect("say"))
        });
        bot.received("relayed");
        bot.received("said");

        // Edit the webhook's message through the webhook.
        let builder = EditWebhookMessage::new()
            .content("relayed, edited")
            .allowed_mentions(CreateAllowedMentions::new());
        let edited =
            bot.rt.block_on(hook.edit_message(http, relayed.id, builder)).expect("webhook edit");
        assert_eq!((edited.id, edited.content.as_str()), (relayed.id, "relayed, edited"));
        assert_eq!(edited.author.name, "alice (Telegram)", "the username override stays");
        assert_eq!(edited.webhook_id, Some(hook.id));
        assert!(edited.edited_timestamp.is_some());
        let update = bot.updated(relayed.id);
        assert_eq!(update.content.as_deref(), Some("relayed, edited"));
        assert_eq!(update.webhook_id, Some(Some(hook.id)));
        assert!(update.author.is_some_and(|a| a.bot), "the whole message, author included");
        assert!(update.edited_timestamp.is_some());

        // The bot edits its own message.
        let builder = EditMessage::new().content("said, edited");
        let edited =
            bot.rt.block_on(channel.edit_message(http, said.id, builder)).expect("bot edit");
        assert_eq!(edited.content, "said, edited");
        let update = bot.updated(said.id);
        assert_eq!(update.author.map(|a| a.id.get()), Some(BOT_ID));
        assert_eq!(update.content.as_deref(), Some("said, edited"));

        // Only the webhook that sent a message can edit it: anything else is Unknown Message.
        let error = |result: serenity::Result<()>| match result {
            Err(serenity::Error::Http(HttpError::UnsuccessfulRequest(response))) => {
                (response.status_code.as_u16(), response.error.code, response.error.message)
            }
            other => panic!("expected an unsuccessful request, got {other:?}"),
        };
        let unknown = (404, 10008, "Unknown Message".to_string());
        let edit = |hook: &serenity::model::webhook::Webhook, id: MessageId| {
            let builder = EditWebhookMessage::new().content("nope");
            error(bot.rt.block_on(hook.edit_message(http, id, builder)).map(drop))
        };
        assert_eq!(edit(&other, relayed.id), unknown, "another webhook's message");
        assert_eq!(edit(&hook, said.id), unknown, "the bot's own message");
        assert_eq!(edit(&hook, MessageId::new(42)), unknown, "no such message");
        let person = fake.post(CHANNEL, ALICE, "alice", "a person's");
        bot.received("a person's");
        assert_eq!(edit(&hook, MessageId::new(person)), unknown, "a person's message");
        // Nor can the bot edit or delete a person's message (no MANAGE_MESSAGES here).
        let builder = EditMessage::new().content("nope");
        let refused = error(
            bot.rt.block_on(channel.edit_message(http, MessageId::new(person), builder)).map(drop),
        );
        assert_eq!(refused, (403, 50005, "Cannot edit a message authored by another user".into()));
        let refused = error(bot.rt.block_on(channel.delete_message(http, person)));
        assert_eq!(refused, (403, 50013, "Missing Permissions".into()));

        // Deletions: the webhook's message through the webhook, the bot's own directly.
        bot.rt.block_on(hook.delete_message(http, None, relayed.id)).expect("webhook delete");
        assert_eq!(bot.deleted(relayed.id), (channel, Some(GuildId::new(GUILD_ID))));
        bot.rt.block_on(channel.delete_message(http, said.id)).expect("bot delete");
        assert_eq!(bot.deleted(said.id).0, channel);
        let again = error(bot.rt.block_on(hook.delete_message(http, None, relayed.id)));
        assert_eq!(again, unknown, "already deleted");
        assert_eq!(error(bot.rt.block_on(channel.delete_message(http, said.id))), unknown);

        // A person deletes their message.
        fake.delete(CHANNEL, person);
        assert_eq!(bot.deleted(MessageId::new(person)), (channel, Some(GuildId::new(GUILD_ID))));

        assert_eq!(
            fake.edits(CHANNEL),
            [
                (relayed.id.get(), Some("relayed, edited".to_string())),
                (said.id.get(), Some("said, edited".to_string())),
                (relayed.id.get(), None),
                (said.id.get(), None),
            ]
        );
        assert!(fake.sent(CHANNEL).is_empty(), "{:#?}", fake.sent(CHANNEL));
        assert!(fake.messages(CHANNEL).is_empty(), "{:#?}", fake.messages(CHANNEL));
        let paths: Vec<String> =
            fake.requests().iter().map(|(m, p, _)| format!("{m} {p}")).collect();
        let hooks = fake.webhooks(CHANNEL);
        let token = hooks.iter().find(|h| h.0 == hook.id.get()).map(|h| h.1.clone());
        let token = token.expect("the webhook's token");
        for path in [
            format!("PATCH /api/v10/webhooks/{}/{token}/messages/{}", hook.id, relayed.id),
            format!("DELETE /api/v10/webhooks/{}/{token}/messages/{}", hook.id, relayed.id),
            format!("PATCH /api/v10/channels/{CHANNEL}/messages/{}", said.id),
            format!("DELETE /api/v10/channels/{CHANNEL}/messages/{}", said.id),
        ] {
            assert!(paths.contains(&path), "{path} not in {paths:#?}");
        }
        let edit_body = fake
            .requests()
            .into_iter()
            .find(|(m, p, _)| m == "PATCH" && p.starts_with("/api/v10/webhooks/"))
            .map(|(_, _, body)| body);
        assert_eq!(
            edit_body,
            Some(json!({
                "content": "relayed, edited",
                "allowed_mentions": {"parse": [], "users": [], "roles": []},
            }))
        );
        bot.stop();
    }

    #[tokio::test]
    async fn fake_discord_edits_and_deletions_are_dispatched() {
        let fake = fake();
        let (mut gw, _) = Gateway::ready(&fake, MESSAGES).await;
        let (_, hook) = create_hook(&fake, "Flock relay");
        let (status, sent) = execute(&fake, &hook, json!({"content": "relayed"}));
        assert_eq!(status, 200, "{sent}");
        let mid = sent["id"].as_str().expect("an id").to_string();
        assert_eq!(gw.recv().await["t"], json!("MESSAGE_CREATE"));
        let (hid, token) =
            (hook["id"].as_str().unwrap_or(""), hook["token"].as_str().unwrap_or(""));
        let path = format!("/api/v10/webhooks/{hid}/{token}/messages/{mid}");
        let webhook = |method: &str, path: &str, body: Option<Value>| {
            let (status, _, body) = http(&fake, method, path, None, body.as_ref());
            (status, body)
        };

        // PATCH answers the message and dispatches MESSAGE_UPDATE with all of it.
        let (status, edited) = webhook("PATCH", &path, Some(json!({"content": "relayed, edited"})));
        assert_eq!(status, 200, "{edited}");
        assert_eq!((&edited["id"], &edited["content"]), (&json!(mid), &json!("relayed, edited")));
        assert!(edited["edited_timestamp"].is_string());
        let update = gw.recv().await;
        assert_eq!(update["t"], json!("MESSAGE_UPDATE"));
        let d = &update["d"];
        assert_eq!((&d["id"], &d["content"]), (&json!(mid), &json!("relayed, edited")));
        assert_eq!((&d["guild_id"], &d["webhook_id"]), (&json!(GUILD_ID.to_string()), &hook["id"]));
        assert_eq!(d["author"]["id"], hook["id"]);
        assert!(matches!(
            serenity_parses(&update),
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageUpdate(_))
        ));
        let (status, got) = webhook("GET", &path, None);
        assert_eq!((status, &got["content"]), (200, &json!("relayed, edited")));
        // `thread_id` naming the webhook's channel is accepted (serenity writes `?&`).
        let (status, _) = webhook(
            "PATCH",
            &format!("{path}?&thread_id={CHANNEL}"),
            Some(json!({"content": "x"})),
        );
        assert_eq!(status, 200);
        assert_eq!(gw.recv().await["d"]["content"], json!("x"));
        // Refusals leave the message alone and dispatch nothing.
        let (status, body) = webhook("PATCH", &format!("{path}?thread_id=42"), None);
        assert_eq!((status, &body["code"]), (404, &json!(10003)));
        let too_long = json!({"content": "x".repeat(MAX_MESSAGE_CHARS + 1)});
        let (status, body) = webhook("PATCH", &path, Some(too_long));
        assert_eq!((status, &body["code"]), (400, &json!(50035)), "{body}");
        assert_eq!(body["errors"]["content"]["_errors"][0]["code"], json!("BASE_TYPE_MAX_LENGTH"));
        let (status, body) = webhook("PATCH", &path, Some(json!({"content": ""})));
        assert_eq!(
            (status, body),
            (400, json!({"message": "Cannot send an empty message", "code": 50006}))
        );
        let wrong = format!("/api/v10/webhooks/{hid}/not-the-token/messages/{mid}");
        let unknown_webhook = json!({"message": "Unknown Webhook", "code": 10015});
        let (status, body) = webhook("PATCH", &wrong, Some(json!({"content": "y"})));
        assert_eq!((status, body), (404, unknown_webhook.clone()));
        let unknown = json!({"message": "Unknown Message", "code": 10008});
        let missing = format!("/api/v10/webhooks/{hid}/{token}/messages/42");
        assert_eq!(
            webhook("PATCH", &missing, Some(json!({"content": "y"}))),
            (404, unknown.clone())
        );
        assert_eq!(fake.messages(CHANNEL)[0].content, "x");

        // DELETE answers 204 and dispatches MESSAGE_DELETE with ids only.
        let (status, _) = webhook("DELETE", &path, None);
        assert_eq!(status, 204);
        let deleted = gw.recv().await;
        assert_eq!(deleted["t"], json!("MESSAGE_DELETE"));
        assert_eq!(
            deleted["d"],
            json!({"id": mid, "channel_id": CHANNEL.to_string(), "guild_id": GUILD_ID.to_string()})
        );
        assert!(matches!(
            serenity_parses(&deleted),
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageDelete(_))
        ));
        assert_eq!(webhook("GET", &path, None), (404, unknown.clone()));
        assert_eq!(webhook("DELETE", &path, None), (404, unknown));

        // A person's edit carries author and member; a person's deletion is dispatched too.
        let id = fake.post(CHANNEL, ALICE, "alice", "typo");
        assert_eq!(gw.recv().await["t"], json!("MESSAGE_CREATE"));
        fake.edit(CHANNEL, id, "fixed");
        let update = gw.recv().await;
        assert_eq!(update["d"]["author"]["id"], json!(ALICE.to_string()));
        assert!(update["d"]["member"].is_object());
        fake.delete(CHANNEL, id);
        let deleted = gw.recv().await;
        assert_eq!(
            (deleted["t"].as_str(), &deleted["d"]["id"]),
            (Some("MESSAGE_DELETE"), &json!(id.to_string()))
        );
        let (_, history) =
            bot(&fake, "GET", &format!("/api/v10/channels/{CHANNEL}/messages"), None);
        assert_eq!(history, json!([]));

        // The bot's own message, edited and deleted over REST.
        let (_, said) = say(&fake, "said");
        let sid = said["id"].as_str().expect("an id").to_string();
        assert_eq!(gw.recv().await["t"], json!("MESSAGE_CREATE"));
        let own = format!("/api/v10/channels/{CHANNEL}/messages/{sid}");
        let (status, edited) = bot(&fake, "PATCH", &own, Some(json!({"content": "said again"})));
        assert_eq!((status, &edited["content"]), (200, &json!("said again")));
        let update = gw.recv().await;
        assert_eq!(
            (update["t"].as_str(), &update["d"]["author"]["id"]),
            (Some("MESSAGE_UPDATE"), &json!(BOT_ID.to_string()))
        );
        // Without `content` an edit keeps it.
        let (status, kept) =
            bot(&fake, "PATCH", &own, Some(json!({"allowed_mentions": {"parse": []}})));
        assert_eq!((status, &kept["content"]), (200, &json!("said again")));
        assert_eq!(gw.recv().await["d"]["content"], json!("said again"));
        assert_eq!(bot(&fake, "DELETE", &own, None).0, 204);
        assert_eq!(gw.recv().await["t"], json!("MESSAGE_DELETE"));

        let mid: u64 = mid.parse().expect("a snowflake");
        let sid: u64 = sid.parse().expect("a snowflake");
        assert_eq!(
            fake.edits(CHANNEL),
            [
                (mid, Some("relayed, edited".to_string())),
                (mid, Some("x".to_string())),
                (mid, None),
                (sid, Some("said again".to_string())),
                (sid, Some("said again".to_string())),
                (sid, None),
            ]
        );
        assert_eq!(fake.wait_edits(CHANNEL, 6, SECS).len(), 6);
        assert!(fake.edits(42).is_empty());
        // A deleted webhook can no longer touch its messages.
        let (_, again) = execute(&fake, &hook, json!({"content": "again"}));
        let path = format!(
            "/api/v10/webhooks/{hid}/{token}/messages/{}",
            again["id"].as_str().unwrap_or("")
        );
        fake.delete_webhooks(CHANNEL);
        assert_eq!(webhook("DELETE", &path, None), (404, unknown_webhook));
    }

    const DM: u64 = 1_180_000_000_000_003_000;

    /// A DM channel over REST: the channel object, the bot's replies and typing, and what Discord
    /// refuses there.
    #[test]
    fn fake_discord_dm_channel_rest_rules() {
        let fake = fake();
        fake.add_dm(DM, ALICE, "alice");
        fake.deny_message_content();
        let (status, channel) = bot(&fake, "GET", &format!("/api/v10/channels/{DM}"), None);
        assert_eq!(status, 200, "{channel}");
        assert_eq!(channel["type"], json!(1));
        assert!(channel.get("guild_id").is_none() && channel.get("name").is_none(), "{channel}");
        assert_eq!(channel["recipients"][0]["id"], json!(ALICE.to_string()));
        assert_eq!(channel["last_message_id"], Value::Null);
        match serde_json::from_value::<serenity::model::channel::Channel>(channel.clone()) {
            Ok(serenity::model::channel::Channel::Private(dm)) => {
                assert_eq!((dm.id.get(), dm.recipient.id.get()), (DM, ALICE));
                assert_eq!(dm.recipient.name, "alice");
            }
            other => panic!("not a serenity PrivateChannel: {other:?}"),
        }
        assert_eq!(fake.channel(DM), Some(channel));
        let (_, channels) =
            bot(&fake, "GET", &format!("/api/v10/guilds/{GUILD_ID}/channels"), None);
        let ids: Vec<&Value> =
            channels.as_array().expect("channels").iter().map(|c| &c["id"]).collect();
        assert_eq!(ids, [&json!(CHANNEL.to_string())], "a DM is no channel of the guild");

        // The person writes; the bot reads it (content and all: DMs are never emptied) and answers
        // with a reply.
        let asked = fake.post(DM, ALICE, "alice", "help?");
        let messages = format!("/api/v10/channels/{DM}/messages");
        let (_, history) = bot(&fake, "GET", &messages, None);
        assert_eq!(history[0]["content"], json!("help?"));
        assert!(history[0].get("guild_id").is_none());
        let (_, one) = bot(&fake, "GET", &format!("{messages}/{asked}"), None);
        assert_eq!(one["content"], json!("help?"));
        let (status, _) = bot(&fake, "POST", &format!("/api/v10/channels/{DM}/typing"), None);
        assert_eq!(status, 204);
        let reply =
            json!({"content": "on it", "message_reference": {"message_id": asked.to_string()}});
        let (status, sent) = bot(&fake, "POST", &messages, Some(reply));
        assert_eq!(status, 200, "{sent}");
        assert_eq!(sent["type"], json!(19));
        assert_eq!(
            sent["message_reference"],
            json!({"type": 0, "channel_id": DM.to_string(), "message_id": asked.to_string()})
        );
        assert_eq!(sent["referenced_message"]["content"], json!("help?"));
        let parsed: Message = serde_json::from_value(sent.clone()).expect("a serenity Message");
        assert_eq!(parsed.referenced_message.map(|m| m.id.get()), Some(asked));
        let said: u64 = sent["id"].as_str().and_then(|i| i.parse().ok()).expect("an id");
        let (_, channel) = bot(&fake, "GET", &format!("/api/v10/channels/{DM}"), None);
        assert_eq!(channel["last_message_id"], json!(said.to_string()));
        let dm_sent = fake.sent(DM);
        assert_eq!(dm_sent.len(), 1);
        assert_eq!((dm_sent[0].content.as_str(), dm_sent[0].reply_to), ("on it", Some(asked)));
        assert_eq!(fake.typings(DM), 1);
        assert_eq!(fake.typings(CHANNEL), 0);

        // Webhooks and channel changes are refused there, as is deleting the person's message.
        let dm_refusal = json!({"message": "Cannot execute action on a DM channel", "code": 50003});
        let hooks = format!("/api/v10/channels/{DM}/webhooks");
        let (status, body) = bot(&fake, "POST", &hooks, Some(json!({"name": "Flock relay"})));
        assert_eq!((status, body), (403, dm_refusal.clone()));
        assert_eq!(bot(&fake, "GET", &hooks, None), (403, dm_refusal.clone()));
        let (status, body) =
            bot(&fake, "PATCH", &format!("/api/v10/channels/{DM}"), Some(json!({"name": "x"})));
        assert_eq!((status, body), (403, dm_refusal.clone()));
        let target = format!("/api/v10/channels/{DM}/permissions/{ALICE}");
        assert_eq!(bot(&fake, "PUT", &target, Some(json!({"type": 1}))).0, 403);
        assert_eq!(bot(&fake, "DELETE", &format!("{messages}/{asked}"), None), (403, dm_refusal));
        let (status, edited) =
            bot(&fake, "PATCH", &format!("{messages}/{said}"), Some(json!({"content": "done"})));
        assert_eq!((status, &edited["content"]), (200, &json!("done")));
        assert_eq!(bot(&fake, "DELETE", &format!("{messages}/{said}"), None).0, 204);
        assert_eq!(fake.edits(DM), [(said, Some("done".to_string())), (said, None)]);
        assert!(fake.webhooks(DM).is_empty());
        assert!(fake.channel(DM).is_some());
        let channels = fake.rejected().iter().filter(|r| r.2 == 403).count();
        assert_eq!(channels, 5);

        // Replies in a guild channel carry the guild in their reference.
        let question = fake.post(CHANNEL, ALICE, "alice", "in the guild");
        let reply =
            json!({"content": "here", "message_reference": {"message_id": question.to_string()}});
        let (_, sent) =
            bot(&fake, "POST", &format!("/api/v10/channels/{CHANNEL}/messages"), Some(reply));
        assert_eq!(sent["message_reference"]["guild_id"], json!(GUILD_ID.to_string()));
        assert_eq!(fake.sent(CHANNEL)[0].reply_to, Some(question));
        assert_eq!(say(&fake, "no reply").0, 200);
        assert_eq!(fake.sent(CHANNEL)[1].reply_to, None);
    }

    /// DM messages, edits and deletions reach only sessions with DIRECT_MESSAGES, without
    /// `guild_id` and `member`, with content even without MESSAGE_CONTENT.
    #[tokio::test]
    async fn fake_discord_dm_events_need_the_direct_messages_intent() {
        let fake = fake();
        fake.add_dm(DM, ALICE, "alice");
        let (mut guild, _) = Gateway::ready(&fake, MESSAGES).await;
        let (mut direct, _) = Gateway::ready(&fake, INTENT_DIRECT_MESSAGES).await;
        let id = fake.post(DM, ALICE, "alice", "psst");
        let event = direct.recv().await;
        assert_eq!(event["t"], json!("MESSAGE_CREATE"));
        let d = &event["d"];
        assert_eq!((&d["content"], &d["channel_id"]), (&json!("psst"), &json!(DM.to_string())));
        assert!(d.get("guild_id").is_none() && d.get("member").is_none(), "{d}");
        match serenity_parses(&event) {
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageCreate(create)) => {
                assert_eq!(create.message.guild_id, None);
                assert_eq!(create.message.author.id.get(), ALICE);
                assert_eq!(create.message.id.get(), id);
            }
            other => panic!("not MESSAGE_CREATE: {other:?}"),
        }
        // The bot's own answer comes back too, then the person's edit and deletion.
        let (status, _) = bot(
            &fake,
            "POST",
            &format!("/api/v10/channels/{DM}/messages"),
            Some(json!({"content": "hello"})),
        );
        assert_eq!(status, 200);
        let own = direct.recv().await;
        assert_eq!(own["d"]["author"]["id"], json!(BOT_ID.to_string()));
        assert!(own["d"].get("guild_id").is_none());
        fake.edit(DM, id, "psst!");
        let update = direct.recv().await;
        assert_eq!(
            (update["t"].as_str(), &update["d"]["content"]),
            (Some("MESSAGE_UPDATE"), &json!("psst!"))
        );
        assert!(update["d"].get("guild_id").is_none() && update["d"].get("member").is_none());
        assert!(matches!(
            serenity_parses(&update),
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageUpdate(_))
        ));
        fake.delete(DM, id);
        let deleted = direct.recv().await;
        assert_eq!(deleted["t"], json!("MESSAGE_DELETE"));
        assert_eq!(deleted["d"], json!({"id": id.to_string(), "channel_id": DM.to_string()}));
        match serenity_parses(&deleted) {
            GatewayEvent::Dispatch(_, serenity::model::event::Event::MessageDelete(delete)) => {
                assert_eq!(delete.guild_id, None);
            }
            other => panic!("not MESSAGE_DELETE: {other:?}"),
        }
        // The session without DIRECT_MESSAGES saw none of it: its next event is a guild message,
        // which the DM-only session does not get.
        fake.post(CHANNEL, ALICE, "alice", "in the guild");
        let next = guild.recv().await;
        assert_eq!(
            (next["t"].as_str(), &next["d"]["content"]),
            (Some("MESSAGE_CREATE"), &json!("in the guild"))
        );
        direct.send(json!({"op": 1, "d": 5})).await;
        assert_eq!(direct.recv().await["op"], json!(11), "no guild message for the DM session");
        // Both intents: DMs and guild messages alike.
        let (mut both, _) = Gateway::ready(&fake, MESSAGES | INTENT_DIRECT_MESSAGES).await;
        fake.post(DM, ALICE, "alice", "again");
        assert_eq!(both.recv().await["d"]["content"], json!("again"));
        assert_eq!(direct.recv().await["d"]["content"], json!("again"));
    }

    /// What a bridge does with a DM through serenity: receives it (no guild), shows typing,
    /// answers with a reply; a webhook there is refused (403, 50003).
    #[test]
    fn fake_discord_serenity_dm_typing_reply_and_webhook_refusal() {
        let fake = fake();
        fake.add_dm(DM, ALICE, "alice");
        let intents = serenity_intents() | GatewayIntents::DIRECT_MESSAGES;
        let bot = Bot::start(&fake, TOKEN, intents);
        bot.ready.recv_timeout(SECS).expect("READY");
        fake.wait_connected(SECS);
        assert_eq!(fake.identifies(), [intents.bits()]);
        let id = fake.post(DM, ALICE, "alice", "hi bot");
        let message = bot.received("hi bot");
        assert_eq!((message.id.get(), message.guild_id), (id, None));
        assert_eq!(message.channel_id.get(), DM);
        let http = &bot.http;
        let (channel, typing, reply, hook) = bot.rt.block_on(async {
            let channel = message.channel_id.to_channel(http).await;
            let typing = message.channel_id.broadcast_typing(http).await;
            let builder = CreateMessage::new().content("hello alice").reference_message(&message);
            let reply = message.channel_id.send_message(http, builder).await;
            let hook =
                message.channel_id.create_webhook(http, CreateWebhook::new("Flock relay")).await;
            (channel, typing, reply, hook)
        });
        let channel = channel.expect("the DM channel").private().expect("a PrivateChannel");
        assert_eq!(channel.recipient.id.get(), ALICE);
        typing.expect("typing");
        let reply = reply.expect("the reply");
        assert_eq!(reply.referenced_message.as_ref().map(|m| m.id.get()), Some(id));
        assert_eq!(reply.guild_id, None);
        let refused = refused(hook);
        assert_eq!((refused.status_code.as_u16(), refused.error.code), (403, 50003));
        assert_eq!(refused.error.message, "Cannot execute action on a DM channel");
        assert_eq!(bot.received("hello alice").author.id.get(), BOT_ID);
        let sent = fake.wait_sent(DM, 1, SECS);
        assert_eq!((sent[0].content.as_str(), sent[0].reply_to), ("hello alice", Some(id)));
        assert_eq!(fake.typings(DM), 1);
        bot.stop();
    }

    #[test]
    #[should_panic(expected = "has no message 42 to delete")]
    fn fake_discord_deleting_an_unknown_message_panics() {
        fake().delete(CHANNEL, 42);
    }
}
