//! A fake Slack for tests: one real server on 127.0.0.1 speaking the Web API
//! (<https://api.slack.com/methods>: HTTP/1.1, `GET` with a query or `POST` with a JSON or
//! form-encoded body, `Authorization: Bearer <token>`, answers `200 {"ok": …}`) and Socket Mode
//! (<https://api.slack.com/apis/socket-mode>: WebSocket, JSON text frames) on the same port, for
//! one app with an app-level token ([`APP_TOKEN`]) and a bot token ([`BOT_TOKEN`]) in one
//! workspace, scripted from the test ([`FakeSlack::post`], [`FakeSlack::rate_limit_next`],
//! [`FakeSlack::drop_socket`], …) and recording what the app did. The wire formats are Slack's,
//! so the real `slack-morphism` 2.31 client runs against it:
//!
//! ```ignore
//! let connector = SlackClientHyperConnector::with_connector(HttpConnector::new())
//!     .with_slack_api_url(&fake.api_url());
//! ```
//!
//! (`hyper_util::client::legacy::connect::HttpConnector` with hyper-util's `http1` feature on:
//! slack-morphism builds its client without HTTP/1, which plain `http://` needs. The
//! production connector type works too: `HttpsConnectorBuilder::new().with_native_roots()?
//! .https_or_http().enable_http1().enable_http2().build()`.) `apps.connections.open` answers
//! `ws://127.0.0.1:PORT/link/?ticket=…`, which slack-morphism's tungstenite client accepts.
//!
//! It follows the real service where a client can get it wrong: `hello` on connect, every
//! event in an `events_api` envelope that must be acknowledged with `{"envelope_id": …}` within
//! the ack timeout (3 s) or is sent again with `retry_attempt` + 1 and `retry_reason: "timeout"`
//! (3 retries, then dropped), envelopes spread over the open connections and queued while there
//! is none, events only from channels the bot is a member of, the bot's own posts delivered back
//! as events (`bot_id`, and `subtype: "bot_message"` when posted under a custom `username`),
//! edits and deletions as `message_changed` / `message_deleted`, `disconnect` / dropped sockets
//! on demand; on the Web API the token types (`not_allowed_token_type`, `invalid_auth`,
//! `not_authed`), `channel_not_found`, `not_in_channel`, `conversations.archive` (with
//! `already_archived`, `missing_scope` ([`FakeSlack::deny_archive`], [`FakeSlack::deny_scope`])
//! and `is_archived` for a post to an archived channel), `conversations.create` (name rules,
//! `name_taken`, `missing_scope`), `no_text`, `msg_too_long` (over 40 000
//! characters), a `username` silently ignored without the `chat:write.customize` scope
//! ([`FakeSlack::deny_customize`]), newest-first history, and scripted `429`s with
//! `Retry-After`; `reactions.add` / `reactions.remove` of the bot's reactions (recorded by
//! [`FakeSlack::reactions`] and [`FakeSlack::reaction_log`], shown in the message's `reactions`,
//! with `no_item_specified`, `invalid_name` (empty, or with colons), `channel_not_found`,
//! `bad_timestamp`, `message_not_found`, `is_archived`, `already_reacted` and `no_reaction`).
//! IMs ([`FakeSlack::add_im`]: a `D…` conversation with `is_im: true` and `user`, the bot in it)
//! take the person's messages as `message` events with `channel_type: "im"` (public channels
//! carry `"channel"`, private ones `"group"`, as on Slack), and the bot's posts (also when
//! `chat.postMessage` names the person's user id as `channel`), updates, deletions and
//! reactions; `conversations.join` and `conversations.archive` answer
//! `method_not_supported_for_channel_type` there. It shares no code with the client it tests. It
//! runs on its own thread and tokio runtime, so sync and async tests can use it.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::frame::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::http1::{self, Conn, Request, Server};
use crate::random_string;

mod socket_mode;
mod state;
mod web_api;
use socket_mode::*;
use state::*;
use web_api::*;

/// The app-level token: the only one `apps.connections.open` takes.
pub const APP_TOKEN: &str = "xapp-1-A1-fake";
/// The bot token: every other method.
pub const BOT_TOKEN: &str = "xoxb-fake";
/// The workspace (team).
pub const TEAM_ID: &str = "T1";
/// The workspace's name.
pub const TEAM_NAME: &str = "Fake";
/// The app.
pub const APP_ID: &str = "A1";
/// The bot's user id.
pub const BOT_USER_ID: &str = "U_BOT";
/// The bot's bot id (`bot_id` of its messages).
pub const BOT_ID: &str = "B_BOT";
/// The bot user's name.
pub const BOT_NAME: &str = "flock";
/// Longest `text` `chat.postMessage` and `chat.update` take, in characters.
pub const MAX_TEXT_CHARS: usize = 40_000;
/// How long Slack waits for an envelope's acknowledgement before sending it again.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(3);
/// How many times an envelope is sent again when not acknowledged (then it is dropped).
pub const MAX_RETRIES: u64 = 3;
/// `token` of event payloads (the deprecated verification token).
const VERIFICATION_TOKEN: &str = "fake-verification-token";
/// `created` of every channel added with [`FakeSlack::add_channel`].
const CHANNEL_CREATED: u64 = 1_700_000_000;
/// `creator` of every channel added with [`FakeSlack::add_channel`].
const CHANNEL_CREATOR: &str = "U_CREATOR";
/// Longest channel name `conversations.create` takes, in characters.
pub const MAX_CHANNEL_NAME_CHARS: usize = 80;

/// A `chat.postMessage` call the fake accepted.
#[derive(Debug, Clone)]
pub struct SlackSent {
    /// The channel id (also when the call named the channel).
    pub channel: String,
    pub ts: String,
    /// `text` as sent (empty when the message had only blocks or attachments).
    pub text: String,
    /// `username` as sent.
    pub username: Option<String>,
    /// Whether the message shows under `username` (`false` without `chat:write.customize`,
    /// see [`FakeSlack::deny_customize`], and when no username was given).
    pub username_applied: bool,
    pub mrkdwn: Option<bool>,
    pub icon_emoji: Option<String>,
    pub icon_url: Option<String>,
    pub unfurl_links: Option<bool>,
    pub unfurl_media: Option<bool>,
    pub thread_ts: Option<String>,
}

/// A `chat.update` (`text: Some`) or `chat.delete` (`text: None`) the fake accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlackChange {
    pub channel: String,
    pub ts: String,
    pub text: Option<String>,
}

/// A Web API answer other than `ok: true`: HTTP status, `error` and extra headers.
#[derive(Debug)]
struct Refusal {
    status: u16,
    error: String,
    headers: Vec<(String, String)>,
}

impl Refusal {
    /// `200 {"ok": false, "error": error}`, the way Slack refuses nearly everything.
    fn api(error: &str) -> Refusal {
        Refusal { status: 200, error: error.to_string(), headers: Vec::new() }
    }
}

#[derive(Debug)]
struct Channel {
    name: String,
    bot_member: bool,
    /// Archived (`conversations.archive`): read-only, posts answer `is_archived`.
    archived: bool,
    /// A private channel (`conversations.create` with `is_private`).
    private: bool,
    /// The person of an IM (a direct message conversation with the bot); `None` for channels.
    im_user: Option<String>,
    created: u64,
    creator: String,
}

#[derive(Debug)]
struct StoredMessage {
    channel: String,
    ts: String,
    /// The message as `conversations.history` returns it.
    json: Value,
    /// Posted by the bot (`chat.postMessage`).
    by_bot: bool,
    deleted: bool,
}

/// An `events_api` envelope and its delivery state.
#[derive(Debug)]
struct Envelope {
    id: String,
    payload: Value,
    /// `retry_attempt` of its next (or last) delivery.
    attempt: u64,
    /// Waiting to be sent (first time, or again after a timeout).
    due: bool,
    sent_at: Option<Instant>,
    sent_count: u64,
    acked: bool,
    /// Not acknowledged after [`MAX_RETRIES`] retries: never sent again.
    abandoned: bool,
}

impl Envelope {
    fn frame(&self) -> String {
        json!({
            "envelope_id": self.id,
            "payload": self.payload,
            "type": "events_api",
            "accepts_response_payload": false,
            "retry_attempt": self.attempt,
            "retry_reason": if self.attempt == 0 { "" } else { "timeout" },
        })
        .to_string()
    }
}

/// What a Socket Mode connection task is told to do.
#[derive(Debug)]
enum Out {
    Text(String),
    /// Send a close frame (1000), then end the connection.
    Close,
    /// Close the socket without a close frame.
    Drop,
}

#[derive(Debug)]
struct SocketConn {
    tx: mpsc::UnboundedSender<Out>,
    /// Told to disconnect or dropped: gets no more envelopes, no longer counts as open.
    closing: bool,
}

#[derive(Debug)]
struct State {
    channels: BTreeMap<String, Channel>,
    /// Every message of every channel, oldest first.
    messages: Vec<StoredMessage>,
    /// Known people: user id → name.
    users: BTreeMap<String, String>,
    last_ts_micros: u64,
    /// Scopes the app lacks ([`FakeSlack::deny_scope`]).
    denied_scopes: BTreeSet<String>,
    /// Channels archived through `conversations.archive`, in order.
    archived: Vec<String>,
    /// Tickets `apps.connections.open` gave out and no socket used yet.
    tickets: HashSet<String>,
    connections_opened: usize,
    conns: BTreeMap<u64, SocketConn>,
    next_conn: u64,
    /// Round-robin position over the open connections.
    next_pick: usize,
    envelopes: Vec<Envelope>,
    ack_timeout: Duration,
    acks: Vec<(String, Instant)>,
    /// `(envelope_id, retry_attempt)` of every envelope frame sent, in order.
    deliveries: Vec<(String, u64)>,
    redeliveries: usize,
    /// Text frames from clients that are no acknowledgement.
    bad_frames: Vec<String>,
    rate_limits: VecDeque<u64>,
    failures: VecDeque<String>,
    requests: Vec<(String, Value)>,
    refused: Vec<(String, String)>,
    sent: Vec<SlackSent>,
    changes: Vec<SlackChange>,
    /// `(method, channel, ts, name)` of every accepted `reactions.add` / `reactions.remove`.
    reaction_log: Vec<(String, String, String, String)>,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    state: Mutex<State>,
    /// Notified on every change (messages, connections, acknowledgements).
    changed: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A running fake Slack for one app; stops when dropped.
#[derive(Debug)]
pub struct FakeSlack {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    _server: Server,
}

impl FakeSlack {
    /// [`APP_TOKEN`].
    pub const APP_TOKEN: &str = APP_TOKEN;
    /// [`BOT_TOKEN`].
    pub const BOT_TOKEN: &str = BOT_TOKEN;

    /// Binds 127.0.0.1:0 and serves on a thread of its own. The workspace has no channels until
    /// [`FakeSlack::add_channel`].
    pub fn start() -> FakeSlack {
        let mut users = BTreeMap::new();
        users.insert(BOT_USER_ID.to_string(), BOT_NAME.to_string());
        let bound = Server::bind("fake-slack");
        let addr = bound.addr;
        let shared = Arc::new(Shared {
            addr,
            state: Mutex::new(State {
                channels: BTreeMap::new(),
                messages: Vec::new(),
                users,
                last_ts_micros: 0,
                denied_scopes: BTreeSet::new(),
                archived: Vec::new(),
                tickets: HashSet::new(),
                connections_opened: 0,
                conns: BTreeMap::new(),
                next_conn: 1,
                next_pick: 0,
                envelopes: Vec::new(),
                ack_timeout: DEFAULT_ACK_TIMEOUT,
                acks: Vec::new(),
                deliveries: Vec::new(),
                redeliveries: 0,
                bad_frames: Vec::new(),
                rate_limits: VecDeque::new(),
                failures: VecDeque::new(),
                requests: Vec::new(),
                refused: Vec::new(),
                sent: Vec::new(),
                changes: Vec::new(),
                reaction_log: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let served = Arc::clone(&shared);
        let server = bound.serve(move |listener, stop| serve(listener, served, stop));
        FakeSlack { addr: server.addr, shared, _server: server }
    }

    /// `http://127.0.0.1:PORT/api`: the Web API base (methods are `/api/<method>`), for
    /// slack-morphism's `with_slack_api_url`.
    pub fn api_url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    /// Adds (or renames) a public channel; the bot is a member.
    pub fn add_channel(&self, id: &str, name: &str) {
        let mut state = self.shared.state();
        let channel = state.channels.entry(id.to_string()).or_insert_with(|| Channel {
            name: String::new(),
            bot_member: true,
            archived: false,
            private: false,
            im_user: None,
            created: CHANNEL_CREATED,
            creator: CHANNEL_CREATOR.to_string(),
        });
        channel.name = name.to_string();
        channel.bot_member = true;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Opens an IM (direct message conversation) `channel_id` (`D…`) between the bot and the
    /// person `user_id` named `name` (known to `users.info` too): `conversations.info` answers it
    /// with `is_im: true` and `user`; the person writes there through [`FakeSlack::post`]
    /// (delivered as a `message` event with `channel_type: "im"`); the bot posts (threads too),
    /// updates, deletes and reacts there like in a channel.
    #[track_caller]
    pub fn add_im(&self, channel_id: &str, user_id: &str, name: &str) {
        assert!(channel_id.starts_with('D'), "fake Slack: IM ids start with D, not {channel_id}");
        let mut state = self.shared.state();
        state.users.insert(user_id.to_string(), name.to_string());
        state.channels.insert(
            channel_id.to_string(),
            Channel {
                name: String::new(),
                bot_member: true,
                archived: false,
                private: true,
                im_user: Some(user_id.to_string()),
                created: CHANNEL_CREATED,
                creator: user_id.to_string(),
            },
        );
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The names of the bot's reactions on message `ts` of `channel` now, in the order added
    /// (empty for a message that is not there).
    pub fn reactions(&self, channel: &str, ts: &str) -> Vec<String> {
        let mut state = self.shared.state();
        state.find_message(channel, ts).map(|m| bot_reactions(&m.json)).unwrap_or_default()
    }

    /// `(method, channel, ts, name)` of every accepted `reactions.add` and `reactions.remove`
    /// (`method` is the method name), in order.
    pub fn reaction_log(&self) -> Vec<(String, String, String, String)> {
        self.shared.state().reaction_log.clone()
    }

    /// The bot is removed from the channel: no more events from it, `chat.postMessage` and
    /// `conversations.history` answer `not_in_channel` until `conversations.join`.
    #[track_caller]
    pub fn kick_bot(&self, channel: &str) {
        let mut state = self.shared.state();
        let found = state.channels.get_mut(channel);
        let found = found.unwrap_or_else(|| panic!("fake Slack: no channel {channel} to kick"));
        found.bot_member = false;
    }

    /// Adds (or renames) a person `users.info` knows (posting through [`FakeSlack::post`]
    /// does this too).
    pub fn add_user(&self, id: &str, name: &str) {
        self.shared.state().users.insert(id.to_string(), name.to_string());
    }

    /// The app lacks the `chat:write.customize` scope: `chat.postMessage` still answers `ok`
    /// but ignores `username`, `icon_emoji` and `icon_url` (the message shows under the bot).
    pub fn deny_customize(&self) {
        self.deny_scope("chat:write.customize");
    }

    /// The app lacks the scopes `conversations.archive` and `conversations.create` need
    /// (`channels:manage`, `groups:write`): they answer `missing_scope`.
    pub fn deny_archive(&self) {
        self.deny_scope("channels:manage");
        self.deny_scope("groups:write");
    }

    /// The app lacks `scope`. The fake checks `chat:write.customize` (see
    /// [`FakeSlack::deny_customize`]), `channels:manage` (`conversations.archive` and
    /// `conversations.create` of a public channel: `missing_scope`) and `groups:write` (the same
    /// for a private channel); other scopes are recorded and ignored.
    pub fn deny_scope(&self, scope: &str) {
        self.shared.state().denied_scopes.insert(scope.to_string());
    }

    /// The id of the channel named `name` (added, or created through `conversations.create`).
    pub fn channel_named(&self, name: &str) -> Option<String> {
        let state = self.shared.state();
        let mut channels = state.channels.iter().filter(|(_, c)| c.im_user.is_none());
        channels.find(|(_, c)| c.name == name).map(|(id, _)| id.clone())
    }

    /// The channels the app archived (`conversations.archive`), in order.
    pub fn archived(&self) -> Vec<String> {
        self.shared.state().archived.clone()
    }

    /// Waits until the app archived `channel`.
    #[track_caller]
    pub fn wait_archived(&self, channel: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.state();
        while !state.archived.iter().any(|c| c == channel) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "fake Slack: {channel} was not archived within {timeout:?}");
            state =
                self.shared.changed.wait_timeout(state, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// How long an envelope may stay unacknowledged before it is sent again (default
    /// [`DEFAULT_ACK_TIMEOUT`]).
    pub fn set_ack_timeout(&self, timeout: Duration) {
        self.shared.state().ack_timeout = timeout;
    }

    /// A person writes `text` in a channel: stored, and when the bot is a member sent as a
    /// `message` event to one open Socket Mode connection (queued until one connects);
    /// returns the message's `ts`. In an IM ([`FakeSlack::add_im`]) only its person writes.
    #[track_caller]
    pub fn post(&self, channel: &str, user: &str, user_name: &str, text: &str) -> String {
        self.post_message(channel, None, user, user_name, text)
    }

    /// A person replies in the thread of message `parent`: as [`FakeSlack::post`], the message
    /// and its event carrying `thread_ts` (the parent's `ts`) and `parent_user_id`, as Slack's.
    #[track_caller]
    pub fn post_in_thread(
        &self,
        channel: &str,
        parent: &str,
        user: &str,
        user_name: &str,
        text: &str,
    ) -> String {
        self.post_message(channel, Some(parent), user, user_name, text)
    }

    #[track_caller]
    fn post_message(
        &self,
        channel: &str,
        parent: Option<&str>,
        user: &str,
        user_name: &str,
        text: &str,
    ) -> String {
        let mut state = self.shared.state();
        let Some(found) = state.channels.get(channel) else {
            panic!("fake Slack: post to channel {channel}, which was never added (add_channel)");
        };
        if let Some(person) = found.im_user.as_deref() {
            assert_eq!(person, user, "fake Slack: only {person} writes in the IM {channel}");
        }
        state.users.insert(user.to_string(), user_name.to_string());
        let ts = state.next_ts();
        let mut json = json!({
            "type": "message",
            "user": user,
            "text": text,
            "ts": ts,
            "team": TEAM_ID,
            "client_msg_id": uuid(),
            "blocks": [],
        });
        if let Some(parent) = parent {
            let Some(first) =
                state.messages.iter().find(|m| m.channel == channel && m.ts == parent)
            else {
                panic!("fake Slack: no message {parent} in {channel} to reply in the thread of");
            };
            let parent_user = first.json["user"].clone();
            json["thread_ts"] = json!(parent);
            json["parent_user_id"] = parent_user;
        }
        let event = message_event(&json, channel, state.channel_type(channel));
        state.messages.push(StoredMessage {
            channel: channel.to_string(),
            ts: ts.clone(),
            json,
            by_bot: false,
            deleted: false,
        });
        state.emit(channel, event);
        drop(state);
        self.shared.changed.notify_all();
        ts
    }

    /// The author edits message `ts`: a `message_changed` event.
    #[track_caller]
    pub fn edit(&self, channel: &str, ts: &str, text: &str) {
        let mut state = self.shared.state();
        let found = state.edit(channel, ts, text);
        assert!(found, "fake Slack: channel {channel} has no message {ts} to edit");
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The author deletes message `ts`: a `message_deleted` event.
    #[track_caller]
    pub fn delete(&self, channel: &str, ts: &str) {
        let mut state = self.shared.state();
        let found = state.delete(channel, ts);
        assert!(found, "fake Slack: channel {channel} has no message {ts} to delete");
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The channel's messages as `conversations.history` shows them, oldest first (deleted
    /// ones left out).
    pub fn messages(&self, channel: &str) -> Vec<Value> {
        let state = self.shared.state();
        state
            .messages
            .iter()
            .filter(|m| m.channel == channel && !m.deleted)
            .map(|m| m.json.clone())
            .collect()
    }

    /// The `chat.postMessage` calls accepted for the channel, in order.
    pub fn sent(&self, channel: &str) -> Vec<SlackSent> {
        self.shared.state().sent(channel)
    }

    /// Waits (real time) until at least `n` posts to the channel were accepted and returns them
    /// all; panics after `timeout` with what it has.
    #[track_caller]
    pub fn wait_sent(&self, channel: &str, n: usize, timeout: Duration) -> Vec<SlackSent> {
        match self.wait_until(timeout, |state| state.sent(channel).len() >= n) {
            Ok(state) => state.sent(channel),
            Err(state) => {
                let got = state.sent(channel);
                let refused = state.refused.clone();
                drop(state);
                panic!(
                    "fake Slack: {} message(s) posted to {channel} after {timeout:?}, expected \
                     {n}: {got:#?}\nrefused calls: {refused:#?}",
                    got.len()
                );
            }
        }
    }

    /// The `chat.update` and `chat.delete` calls accepted, in order.
    pub fn changes(&self) -> Vec<SlackChange> {
        self.shared.state().changes.clone()
    }

    /// Waits (real time) until a Socket Mode connection is open (its `hello` sent); panics
    /// after `timeout`.
    #[track_caller]
    pub fn wait_connected(&self, timeout: Duration) {
        if let Err(state) = self.wait_until(timeout, |state| state.open_sockets() > 0) {
            let (opened, refused) = (state.connections_opened, state.refused.clone());
            drop(state);
            panic!(
                "fake Slack: no Socket Mode connection after {timeout:?}; \
                 apps.connections.open answered {opened} time(s), refused calls: {refused:#?}"
            );
        }
    }

    /// Waits (real time) until every envelope sent was acknowledged (or given up) and none is
    /// queued; panics after `timeout`.
    #[track_caller]
    pub fn wait_acked(&self, timeout: Duration) {
        let settled = |state: &State| state.envelopes.iter().all(|e| e.acked || e.abandoned);
        if let Err(state) = self.wait_until(timeout, settled) {
            let open: Vec<String> = state
                .envelopes
                .iter()
                .filter(|e| !e.acked && !e.abandoned)
                .map(|e| format!("{} (attempt {}, due {})", e.id, e.attempt, e.due))
                .collect();
            drop(state);
            panic!("fake Slack: envelopes still unacknowledged after {timeout:?}: {open:?}");
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

    /// The `envelope_id` of every acknowledgement received, in order (repeats and unknown ids
    /// included).
    pub fn acks(&self) -> Vec<String> {
        self.shared.state().acks.iter().map(|(id, _)| id.clone()).collect()
    }

    /// [`FakeSlack::acks`] with the time each arrived.
    pub fn acks_at(&self) -> Vec<(String, Instant)> {
        self.shared.state().acks.clone()
    }

    /// Envelopes sent at least once and never acknowledged (given-up ones included).
    pub fn unacked(&self) -> usize {
        let state = self.shared.state();
        state.envelopes.iter().filter(|e| e.sent_count > 0 && !e.acked).count()
    }

    /// Envelopes waiting for a connection (never sent yet, or due again).
    pub fn queued(&self) -> usize {
        self.shared.state().envelopes.iter().filter(|e| e.due && !e.acked).count()
    }

    /// How many times an envelope was sent again after an acknowledgement timeout.
    pub fn redeliveries(&self) -> usize {
        self.shared.state().redeliveries
    }

    /// `(envelope_id, retry_attempt)` of every envelope frame sent, in order.
    pub fn deliveries(&self) -> Vec<(String, u64)> {
        self.shared.state().deliveries.clone()
    }

    /// Text frames received that were no acknowledgement (not JSON, or no `envelope_id`).
    pub fn bad_frames(&self) -> Vec<String> {
        self.shared.state().bad_frames.clone()
    }

    /// Socket Mode connections currently open (not counting those [`FakeSlack::disconnect`] or
    /// [`FakeSlack::drop_socket`] is closing).
    pub fn socket_connections(&self) -> usize {
        self.shared.state().open_sockets()
    }

    /// How many times `apps.connections.open` gave out a URL.
    pub fn connections_opened(&self) -> usize {
        self.shared.state().connections_opened
    }

    /// Sends `{"type": "disconnect", "reason": "refresh_requested", …}` on every open
    /// connection, then closes it (close frame 1000). Envelopes in flight stay unacknowledged
    /// until they time out and are sent again.
    pub fn disconnect(&self) {
        let mut state = self.shared.state();
        let frame = json!({
            "type": "disconnect",
            "reason": "refresh_requested",
            "debug_info": {"host": "fake"},
        })
        .to_string();
        for conn in state.conns.values_mut().filter(|c| !c.closing) {
            conn.closing = true;
            let _ = conn.tx.send(Out::Text(frame.clone()));
            let _ = conn.tx.send(Out::Close);
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Closes every Socket Mode TCP connection abruptly (no close frame).
    pub fn drop_socket(&self) {
        let mut state = self.shared.state();
        for conn in state.conns.values_mut() {
            conn.closing = true;
            let _ = conn.tx.send(Out::Drop);
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The next `n` `chat.postMessage` calls answer HTTP 429 with `Retry-After:
    /// retry_after_secs` and `{"ok": false, "error": "ratelimited"}`.
    pub fn rate_limit_next(&self, n: usize, retry_after_secs: u64) {
        self.shared.state().rate_limits.extend(std::iter::repeat_n(retry_after_secs, n));
    }

    /// The next `n` `chat.postMessage` calls (after scripted 429s) answer
    /// `{"ok": false, "error": error}`.
    pub fn fail_next_posts(&self, n: usize, error: &str) {
        self.shared.state().failures.extend(std::iter::repeat_n(error.to_string(), n));
    }

    /// `(method, params)` of every Web API call, in arrival order: the query and the body (JSON
    /// or form-encoded) merged, the token left out.
    pub fn requests(&self) -> Vec<(String, Value)> {
        self.shared.state().requests.clone()
    }

    /// `(method, error)` of every Web API call not answered `ok: true`.
    pub fn refused(&self) -> Vec<(String, String)> {
        self.shared.state().refused.clone()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use hyper_util::client::legacy::connect::{Connect, HttpConnector};
    use slack_morphism::errors::SlackClientError;
    use slack_morphism::prelude::{
        SlackApiAppsConnectionOpenRequest, SlackApiChatDeleteRequest,
        SlackApiChatPostMessageRequest, SlackApiChatUpdateRequest,
        SlackApiConversationsCreateRequest, SlackApiConversationsHistoryRequest,
        SlackApiConversationsInfoRequest, SlackApiReactionsAddRequest,
        SlackApiReactionsRemoveRequest, SlackApiToken, SlackApiTokenType, SlackApiTokenValue,
        SlackApiUsersInfoRequest, SlackBotId, SlackChannelId, SlackClient,
        SlackClientEventsListenerEnvironment, SlackClientEventsUserState, SlackClientHttpConnector,
        SlackClientHyperConnector, SlackClientSocketModeConfig, SlackClientSocketModeListener,
        SlackEventCallbackBody, SlackHyperClient, SlackMessageContent, SlackMessageEventType,
        SlackPushEventCallback, SlackReactionName, SlackSocketModeListenerCallbacks, SlackTs,
        SlackUserId, UserCallbackResult,
    };
    use tokio_tungstenite::tungstenite;

    use super::*;

    const CHANNEL: &str = "C1";
    const ALICE: &str = "U_ALICE";
    const SECS: Duration = Duration::from_secs(10);

    fn fake() -> FakeSlack {
        let fake = FakeSlack::start();
        fake.add_channel(CHANNEL, "general");
        fake
    }

    /// One request on a new connection: `(status, headers in lower case, JSON body or Null)`.
    fn http(
        fake: &FakeSlack,
        verb: &str,
        target: &str,
        token: Option<&str>,
        body: Option<(&str, String)>,
    ) -> (u16, Vec<(String, String)>, Value) {
        let mut stream = std::net::TcpStream::connect(fake.addr).expect("connect");
        let mut head =
            format!("{verb} {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n", fake.addr);
        if let Some(token) = token {
            head.push_str(&format!("Authorization: Bearer {token}\r\n"));
        }
        let body = match body {
            Some((content_type, body)) => {
                head.push_str(&format!("Content-Type: {content_type}\r\n"));
                body
            }
            None => String::new(),
        };
        head.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
        crate::http1::exchange(&mut stream, &head)
    }

    /// A Web API call with a JSON body, answered 200; its body.
    #[track_caller]
    fn api(fake: &FakeSlack, method: &str, token: Option<&str>, params: Value) -> Value {
        let body = Some(("application/json; charset=utf-8", params.to_string()));
        let (status, headers, body) = http(fake, "POST", &format!("/api/{method}"), token, body);
        assert_eq!(status, 200, "{method}: {body}");
        let content_type = headers.iter().find(|(n, _)| n == "content-type").map(|(_, v)| v);
        assert_eq!(content_type.map(String::as_str), Some("application/json; charset=utf-8"));
        body
    }

    /// A Web API call with a form-encoded body, answered 200; its body.
    #[track_caller]
    fn api_form(fake: &FakeSlack, method: &str, token: Option<&str>, form: &str) -> Value {
        let body = Some(("application/x-www-form-urlencoded", form.to_string()));
        let (status, _, body) = http(fake, "POST", &format!("/api/{method}"), token, body);
        assert_eq!(status, 200, "{method}: {body}");
        body
    }

    #[track_caller]
    fn bot(fake: &FakeSlack, method: &str, params: Value) -> Value {
        api(fake, method, Some(BOT_TOKEN), params)
    }

    fn refusal(error: &str) -> Value {
        json!({"ok": false, "error": error})
    }

    fn texts(history: &Value) -> Vec<&str> {
        let messages = history["messages"].as_array().expect("messages");
        messages.iter().map(|m| m["text"].as_str().unwrap_or_default()).collect()
    }

    /// A raw Socket Mode client (tungstenite 0.21, blocking).
    struct RawSocket {
        ws: tungstenite::WebSocket<std::net::TcpStream>,
    }

    impl RawSocket {
        /// `apps.connections.open`, then connects to the URL it answered.
        fn open(fake: &FakeSlack) -> RawSocket {
            let open = api(fake, "apps.connections.open", Some(APP_TOKEN), json!({}));
            let url = open["url"].as_str().expect("a url");
            RawSocket::connect(url).expect("the socket connects")
        }

        /// Connects to a Socket Mode URL; the handshake's error when refused.
        fn connect(url: &str) -> Result<RawSocket, Box<tungstenite::Error>> {
            let host = url.strip_prefix("ws://").and_then(|u| u.split('/').next()).expect("ws://");
            let stream = std::net::TcpStream::connect(host).expect("connect");
            let (ws, _) = tungstenite::client::client(url, stream).map_err(|e| match e {
                tungstenite::HandshakeError::Failure(e) => Box::new(e),
                tungstenite::HandshakeError::Interrupted(_) => panic!("blocking handshake"),
            })?;
            ws.get_ref().set_read_timeout(Some(Duration::from_millis(50))).expect("read timeout");
            Ok(RawSocket { ws })
        }

        /// The next frame, or the error reading it; a timeout error when none came in time.
        fn read(&mut self, timeout: Duration) -> Result<WsMessage, Box<tungstenite::Error>> {
            let deadline = Instant::now() + timeout;
            loop {
                match self.ws.read() {
                    Err(tungstenite::Error::Io(e))
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) && Instant::now() < deadline => {}
                    other => return other.map_err(Box::new),
                }
            }
        }

        /// The next text frame as JSON (pings and pongs skipped); panics after 10 s.
        #[track_caller]
        fn recv(&mut self) -> Value {
            loop {
                match self.read(SECS) {
                    Ok(WsMessage::Text(text)) => return serde_json::from_str(&text).expect("JSON"),
                    Ok(WsMessage::Ping(_) | WsMessage::Pong(_)) => {}
                    other => panic!("expected a text frame, got {other:?}"),
                }
            }
        }

        /// `true` when no text frame comes within `wait`.
        fn silent(&mut self, wait: Duration) -> bool {
            match self.read(wait) {
                Err(e) if matches!(*e, tungstenite::Error::Io(_)) => true,
                Ok(WsMessage::Text(text)) => panic!("unexpected frame {text}"),
                other => panic!("unexpected {other:?}"),
            }
        }

        fn send(&mut self, text: &str) {
            self.ws.send(WsMessage::Text(text.to_string())).expect("send a frame");
        }

        fn ack(&mut self, envelope: &Value) {
            let id = envelope["envelope_id"].as_str().expect("an envelope id");
            self.send(&json!({"envelope_id": id}).to_string());
        }
    }

    // -----------------------------------------------------------------------------------------
    // Raw wire rules.

    #[test]
    fn fake_slack_tokens_auth_test_and_connections_open() {
        let fake = fake();
        let open = |token| api(&fake, "apps.connections.open", token, json!({}));
        assert_eq!(open(Some(BOT_TOKEN)), refusal("not_allowed_token_type"));
        assert_eq!(open(None), refusal("not_authed"));
        assert_eq!(open(Some("xapp-1-A1-wrong")), refusal("invalid_auth"));
        let opened = open(Some(FakeSlack::APP_TOKEN));
        assert_eq!(opened["ok"], json!(true));
        let url = opened["url"].as_str().expect("url");
        assert!(url.starts_with(&format!("ws://{}/link/?ticket=", fake.addr)), "{url}");
        assert_eq!(fake.connections_opened(), 1);

        let expected = json!({
            "ok": true,
            "url": "https://fake.slack.com/",
            "team": "Fake",
            "user": "flock",
            "team_id": "T1",
            "user_id": "U_BOT",
            "bot_id": "B_BOT",
            "is_enterprise_install": false,
        });
        assert_eq!(bot(&fake, "auth.test", json!({})), expected);
        assert_eq!(api_form(&fake, "auth.test", None, "token=xoxb-fake"), expected);
        assert_eq!(
            api(&fake, "auth.test", Some(APP_TOKEN), json!({})),
            refusal("not_allowed_token_type")
        );
        assert_eq!(bot(&fake, "chat.meMessage", json!({})), refusal("unknown_method"));
        let (status, _, user) =
            http(&fake, "GET", "/api/users.info?user=U_BOT", Some(BOT_TOKEN), None);
        assert_eq!(status, 200);
        assert_eq!(
            (user["user"]["name"].clone(), user["user"]["is_bot"].clone()),
            (json!("flock"), json!(true))
        );
        assert_eq!(http(&fake, "GET", "/other", None, None).0, 404);
        assert_eq!(
            fake.refused(),
            [
                ("apps.connections.open".to_string(), "not_allowed_token_type".to_string()),
                ("apps.connections.open".into(), "not_authed".into()),
                ("apps.connections.open".into(), "invalid_auth".into()),
                ("auth.test".into(), "not_allowed_token_type".into()),
                ("chat.meMessage".into(), "unknown_method".into()),
            ]
        );
        let (method, params) = fake.requests().pop().expect("requests");
        assert_eq!((method.as_str(), params), ("users.info", json!({"user": "U_BOT"})));
    }

    #[test]
    fn fake_slack_post_message_rules() {
        let fake = fake();
        let posted = bot(
            &fake,
            "chat.postMessage",
            json!({"channel": CHANNEL, "text": "hello *world*", "mrkdwn": false, "unfurl_links": false}),
        );
        assert_eq!(posted["ok"], json!(true), "{posted}");
        assert_eq!(posted["channel"], json!(CHANNEL));
        let ts = posted["ts"].as_str().expect("ts").to_string();
        assert!(ts_micros(&ts).is_some() && ts.len() == 17, "{ts}");
        let message = &posted["message"];
        assert_eq!(message["text"], json!("hello *world*"));
        assert_eq!(
            (message["user"].clone(), message["bot_id"].clone()),
            (json!("U_BOT"), json!("B_BOT"))
        );
        assert_eq!(message["subtype"], Value::Null);
        assert_eq!(message["ts"], json!(ts));

        let by_name =
            bot(&fake, "chat.postMessage", json!({"channel": "#general", "text": "by name"}));
        assert_eq!(by_name["channel"], json!(CHANNEL));

        let form = "channel=C1&text=a+b%26c&username=alice+%28Telegram%29&icon_emoji=%3Asmile%3A\
                    &mrkdwn=true";
        let custom = api_form(&fake, "chat.postMessage", Some(BOT_TOKEN), form);
        assert_eq!(custom["message"]["text"], json!("a b&c"));
        assert_eq!(custom["message"]["username"], json!("alice (Telegram)"));
        assert_eq!(custom["message"]["subtype"], json!("bot_message"));
        assert_eq!(custom["message"]["icons"], json!({"emoji": ":smile:"}));
        assert_eq!(custom["message"]["user"], Value::Null);

        let post = |params: Value| bot(&fake, "chat.postMessage", params);
        assert_eq!(post(json!({"channel": "C404", "text": "x"})), refusal("channel_not_found"));
        assert_eq!(post(json!({"channel": CHANNEL})), refusal("no_text"));
        assert_eq!(post(json!({"channel": CHANNEL, "text": ""})), refusal("no_text"));
        let too_long = "x".repeat(MAX_TEXT_CHARS + 1);
        assert_eq!(post(json!({"channel": CHANNEL, "text": too_long})), refusal("msg_too_long"));
        let longest = "é".repeat(MAX_TEXT_CHARS);
        assert_eq!(post(json!({"channel": CHANNEL, "text": longest}))["ok"], json!(true));

        fake.kick_bot(CHANNEL);
        assert_eq!(post(json!({"channel": CHANNEL, "text": "x"})), refusal("not_in_channel"));
        let joined = bot(&fake, "conversations.join", json!({"channel": CHANNEL}));
        assert_eq!(joined["channel"]["is_member"], json!(true));
        assert_eq!(joined["warning"], Value::Null);
        let again = bot(&fake, "conversations.join", json!({"channel": CHANNEL}));
        assert_eq!(again["warning"], json!("already_in_channel"));

        fake.deny_customize();
        let plain = post(json!({"channel": CHANNEL, "text": "as bob?", "username": "bob"}));
        assert_eq!(plain["ok"], json!(true), "Slack answers ok without chat:write.customize");
        assert_eq!(plain["message"]["username"], Value::Null);
        assert_eq!(plain["message"]["user"], json!("U_BOT"));

        let sent = fake.sent(CHANNEL);
        let summary: Vec<(String, Option<&str>, bool, Option<bool>)> = sent
            .iter()
            .map(|s| {
                (
                    s.text.chars().take(13).collect(),
                    s.username.as_deref(),
                    s.username_applied,
                    s.mrkdwn,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("hello *world*".into(), None, false, Some(false)),
                ("by name".into(), None, false, None),
                ("a b&c".into(), Some("alice (Telegram)"), true, Some(true)),
                ("é".repeat(13), None, false, None),
                ("as bob?".into(), Some("bob"), false, None),
            ]
        );
        assert_eq!(sent[0].ts, ts);
        assert_eq!(sent[0].unfurl_links, Some(false));
        assert_eq!(sent[2].icon_emoji.as_deref(), Some(":smile:"));
        assert!(sent.iter().all(|s| s.channel == CHANNEL));
        assert!(fake.sent("C2").is_empty());
        let (method, params) = fake.requests().into_iter().nth(2).expect("the form post");
        assert_eq!(method, "chat.postMessage");
        assert_eq!(params["username"], json!("alice (Telegram)"));
        assert_eq!(params.get("token"), None);
    }

    #[test]
    fn fake_slack_conversations_archive_and_its_errors() {
        let fake = fake();
        fake.add_channel("C2", "other");
        let archive =
            |channel: &str| bot(&fake, "conversations.archive", json!({"channel": channel}));
        assert_eq!(archive("C9"), refusal("channel_not_found"));
        fake.kick_bot("C2");
        assert_eq!(archive("C2"), refusal("not_in_channel"));
        fake.deny_archive();
        assert_eq!(archive(CHANNEL), refusal("missing_scope"));
        fake.shared.state().denied_scopes.clear();
        assert_eq!(archive(CHANNEL), json!({"ok": true}));
        assert_eq!(archive(CHANNEL), refusal("already_archived"));
        assert_eq!(fake.archived(), [CHANNEL]);
        fake.wait_archived(CHANNEL, SECS);
        let info = bot(&fake, "conversations.info", json!({"channel": CHANNEL}));
        assert_eq!(info["channel"]["is_archived"], json!(true));
        let post = bot(&fake, "chat.postMessage", json!({"channel": CHANNEL, "text": "late"}));
        assert_eq!(post, refusal("is_archived"));
    }

    #[test]
    fn fake_slack_conversations_create_and_its_errors() {
        let fake = fake();
        let create = |params: Value| bot(&fake, "conversations.create", params);
        assert_eq!(create(json!({})), refusal("invalid_name_required"));
        assert_eq!(create(json!({"name": "Dev"})), refusal("invalid_name_specials"));
        assert_eq!(create(json!({"name": "a b"})), refusal("invalid_name_specials"));
        let long = "x".repeat(MAX_CHANNEL_NAME_CHARS + 1);
        assert_eq!(create(json!({"name": long})), refusal("invalid_name_maxlength"));
        assert_eq!(create(json!({"name": "general"})), refusal("name_taken"));
        fake.deny_scope("channels:manage");
        assert_eq!(create(json!({"name": "pub-1"})), refusal("missing_scope"));
        let private = api_form(
            &fake,
            "conversations.create",
            Some(BOT_TOKEN),
            "name=secret_1&is_private=true",
        );
        assert_eq!(private["ok"], json!(true), "{private}");
        let id = private["channel"]["id"].as_str().expect("an id").to_string();
        assert!(id.starts_with('C') && id != CHANNEL, "{id}");
        assert_eq!(fake.channel_named("secret_1").as_deref(), Some(id.as_str()));
        let channel = &private["channel"];
        assert_eq!(
            (&channel["name"], &channel["is_private"], &channel["is_member"]),
            (&json!("secret_1"), &json!(true), &json!(true))
        );
        assert_eq!(
            (&channel["creator"], &channel["is_channel"]),
            (&json!(BOT_USER_ID), &json!(true))
        );
        assert!(channel["created"].as_u64().is_some_and(|t| t > CHANNEL_CREATED), "{channel}");
        fake.deny_scope("groups:write");
        assert_eq!(
            create(json!({"name": "secret-2", "is_private": true})),
            refusal("missing_scope")
        );
        assert_eq!(
            bot(&fake, "conversations.archive", json!({"channel": id})),
            refusal("missing_scope")
        );
        fake.shared.state().denied_scopes.clear();
        let public = create(json!({"name": "pub-1"}));
        let other = public["channel"]["id"].as_str().expect("an id").to_string();
        assert_ne!(other, id);
        assert_eq!(public["channel"]["is_private"], json!(false));
        let post = bot(&fake, "chat.postMessage", json!({"channel": other, "text": "hi"}));
        assert_eq!(post["ok"], json!(true), "{post}");
        let history = bot(&fake, "conversations.history", json!({"channel": other}));
        assert_eq!(texts(&history), ["hi"]);
        assert_eq!(
            bot(&fake, "conversations.archive", json!({"channel": id})),
            json!({"ok": true})
        );
        assert_eq!(create(json!({"name": "secret_1"})), refusal("name_taken"));
        assert_eq!(fake.channel_named("nope"), None);
    }

    #[test]
    fn fake_slack_rate_limits_and_scripted_failures() {
        let fake = fake();
        fake.rate_limit_next(2, 7);
        fake.fail_next_posts(1, "fatal_error");
        let post = || {
            let body =
                Some(("application/json", json!({"channel": CHANNEL, "text": "x"}).to_string()));
            http(&fake, "POST", "/api/chat.postMessage", Some(BOT_TOKEN), body)
        };
        let (status, headers, body) = post();
        assert_eq!(status, 429);
        assert!(headers.contains(&("retry-after".to_string(), "7".to_string())), "{headers:?}");
        assert_eq!(body, refusal("ratelimited"));
        // Other methods are not limited.
        assert_eq!(bot(&fake, "auth.test", json!({}))["ok"], json!(true));
        assert_eq!(post().0, 429);
        let (status, _, body) = post();
        assert_eq!((status, body), (200, refusal("fatal_error")));
        let (status, _, body) = post();
        assert_eq!((status, body["ok"].clone()), (200, json!(true)));
        assert_eq!(fake.sent(CHANNEL).len(), 1);
        let refused: Vec<String> = fake.refused().into_iter().map(|(_, e)| e).collect();
        assert_eq!(refused, ["ratelimited", "ratelimited", "fatal_error"]);
        assert_eq!(fake.requests().len(), 5, "refused calls are recorded too");
    }

    #[test]
    fn fake_slack_history_info_users_update_delete() {
        let fake = fake();
        let one = fake.post(CHANNEL, ALICE, "alice", "one");
        let two = bot(&fake, "chat.postMessage", json!({"channel": CHANNEL, "text": "two"}));
        let two = two["ts"].as_str().expect("ts").to_string();
        let three = fake.post(CHANNEL, ALICE, "alice", "three");
        assert!(ts_micros(&one) < ts_micros(&two) && ts_micros(&two) < ts_micros(&three));

        let history = |params: Value| {
            let mut params = params;
            params["channel"] = json!(CHANNEL);
            bot(&fake, "conversations.history", params)
        };
        let all = history(json!({}));
        assert_eq!(texts(&all), ["three", "two", "one"]);
        assert_eq!(all["has_more"], json!(false));
        assert_eq!(all["messages"][2]["user"], json!(ALICE));
        assert_eq!(all["messages"][1]["bot_id"], json!(BOT_ID));
        assert_eq!(texts(&history(json!({"oldest": one}))), ["three", "two"]);
        assert_eq!(
            texts(&history(json!({"oldest": one, "inclusive": true}))),
            ["three", "two", "one"]
        );
        let latest = history(json!({"limit": 2}));
        assert_eq!(
            (texts(&latest), latest["has_more"].clone()),
            (vec!["three", "two"], json!(true))
        );
        let paged = history(json!({"oldest": one, "limit": 1}));
        assert_eq!((texts(&paged), paged["has_more"].clone()), (vec!["two"], json!(true)));
        // Form-encoded, as slack-morphism's GET query would be.
        let (_, _, got) = http(
            &fake,
            "GET",
            &format!("/api/conversations.history?channel={CHANNEL}&latest={three}"),
            Some(BOT_TOKEN),
            None,
        );
        assert_eq!(texts(&got), ["two", "one"]);
        fake.kick_bot(CHANNEL);
        assert_eq!(history(json!({})), refusal("not_in_channel"));
        bot(&fake, "conversations.join", json!({"channel": CHANNEL}));

        let info = bot(&fake, "conversations.info", json!({"channel": CHANNEL}));
        assert_eq!(
            (info["channel"]["id"].clone(), info["channel"]["name"].clone()),
            (json!(CHANNEL), json!("general"))
        );
        assert_eq!(info["channel"]["is_member"], json!(true));
        assert_eq!(
            bot(&fake, "conversations.info", json!({"channel": "C9"})),
            refusal("channel_not_found")
        );

        let user = bot(&fake, "users.info", json!({"user": ALICE}));
        assert_eq!(user["user"]["id"], json!(ALICE));
        assert_eq!(user["user"]["name"], json!("alice"));
        assert_eq!(user["user"]["real_name"], json!("alice"));
        assert_eq!(user["user"]["profile"]["display_name"], json!("alice"));
        assert_eq!(user["user"]["profile"]["real_name"], json!("alice"));
        assert_eq!(bot(&fake, "users.info", json!({"user": "U404"})), refusal("user_not_found"));
        fake.add_user("U_BOB", "bob");
        assert_eq!(
            bot(&fake, "users.info", json!({"user": "U_BOB"}))["user"]["name"],
            json!("bob")
        );

        fake.edit(CHANNEL, &one, "one!");
        let edited = history(json!({"oldest": one, "inclusive": true, "latest": one}));
        assert_eq!(texts(&edited), ["one!"]);
        assert_eq!(edited["messages"][0]["edited"]["user"], json!(ALICE));

        let update = |ts: &str, text: &str| {
            bot(&fake, "chat.update", json!({"channel": CHANNEL, "ts": ts, "text": text}))
        };
        assert_eq!(update(&one, "hijacked"), refusal("cant_update_message"));
        let updated = update(&two, "two!");
        assert_eq!((updated["ts"].clone(), updated["text"].clone()), (json!(two), json!("two!")));
        assert_eq!(updated["message"]["edited"]["user"], json!(BOT_USER_ID));
        let delete = |ts: &str| bot(&fake, "chat.delete", json!({"channel": CHANNEL, "ts": ts}));
        assert_eq!(delete(&three), refusal("cant_delete_message"));
        assert_eq!(delete(&two), json!({"ok": true, "channel": CHANNEL, "ts": two}));
        assert_eq!(delete(&two), refusal("message_not_found"));
        assert_eq!(update(&two, "again"), refusal("message_not_found"));
        assert_eq!(texts(&history(json!({}))), ["three", "one!"]);
        fake.delete(CHANNEL, &three);
        assert_eq!(texts(&history(json!({}))), ["one!"]);
        let stored: Vec<Value> =
            fake.messages(CHANNEL).into_iter().map(|m| m["text"].clone()).collect();
        assert_eq!(stored, [json!("one!")]);
        assert_eq!(
            fake.changes(),
            [
                SlackChange { channel: CHANNEL.into(), ts: two.clone(), text: Some("two!".into()) },
                SlackChange { channel: CHANNEL.into(), ts: two.clone(), text: None },
            ]
        );
    }

    #[test]
    fn fake_slack_socket_mode_hello_events_and_acks() {
        let fake = fake();
        let queued_ts = fake.post(CHANNEL, ALICE, "alice", "before anyone listened");
        assert_eq!((fake.queued(), fake.unacked()), (1, 0));
        let mut socket = RawSocket::open(&fake);
        assert_eq!(
            socket.recv(),
            json!({
                "type": "hello",
                "num_connections": 1,
                "debug_info": {"host": "fake", "build_number": 1, "approximate_connection_time": 18060},
                "connection_info": {"app_id": "A1"},
            })
        );
        fake.wait_connected(SECS);
        let envelope = socket.recv();
        let id = envelope["envelope_id"].as_str().expect("envelope_id").to_string();
        assert_eq!(id.len(), 36, "{id}");
        assert_eq!(envelope["type"], json!("events_api"));
        assert_eq!(envelope["accepts_response_payload"], json!(false));
        assert_eq!(
            (envelope["retry_attempt"].clone(), envelope["retry_reason"].clone()),
            (json!(0), json!(""))
        );
        let payload = &envelope["payload"];
        assert_eq!(payload["type"], json!("event_callback"));
        assert_eq!(
            (payload["team_id"].clone(), payload["api_app_id"].clone()),
            (json!("T1"), json!("A1"))
        );
        assert!(payload["event_id"].as_str().is_some_and(|e| e.starts_with("Ev")), "{payload}");
        assert!(payload["event_time"].is_u64());
        assert_eq!(payload["authorizations"][0]["user_id"], json!(BOT_USER_ID));
        let mut event = payload["event"].clone();
        assert_eq!(event["client_msg_id"].as_str().map(str::len), Some(36));
        event.as_object_mut().expect("an object").remove("client_msg_id");
        assert_eq!(
            event,
            json!({
                "type": "message",
                "channel": CHANNEL,
                "user": ALICE,
                "text": "before anyone listened",
                "ts": queued_ts,
                "event_ts": queued_ts,
                "channel_type": "channel",
                "team": "T1",
                "blocks": [],
            })
        );
        assert_eq!((fake.queued(), fake.unacked()), (0, 1));
        socket.ack(&envelope);
        crate::wait_for(|| fake.unacked() == 0, SECS, "the ack is recorded");
        assert_eq!(fake.acks(), std::slice::from_ref(&id));

        let ts = fake.post(CHANNEL, ALICE, "alice", "hi");
        let posted = socket.recv();
        assert_eq!(posted["payload"]["event"]["text"], json!("hi"));
        socket.ack(&posted);
        fake.edit(CHANNEL, &ts, "hi!");
        let changed = socket.recv();
        let event = &changed["payload"]["event"];
        assert_eq!(
            (event["type"].clone(), event["subtype"].clone()),
            (json!("message"), json!("message_changed"))
        );
        assert_eq!(event["message"]["text"], json!("hi!"));
        assert_eq!(event["message"]["ts"], json!(ts));
        assert_eq!(event["message"]["edited"]["user"], json!(ALICE));
        assert_eq!(event["previous_message"]["text"], json!("hi"));
        assert_eq!(
            (event["channel"].clone(), event["hidden"].clone()),
            (json!(CHANNEL), json!(true))
        );
        socket.ack(&changed);
        fake.delete(CHANNEL, &ts);
        let deleted = socket.recv();
        let event = &deleted["payload"]["event"];
        assert_eq!(event["subtype"], json!("message_deleted"));
        assert_eq!(event["deleted_ts"], json!(ts));
        assert_eq!(event["previous_message"]["text"], json!("hi!"));
        socket.ack(&deleted);

        // The bot's own posts come back as events.
        let params = json!({"channel": CHANNEL, "text": "relayed", "username": "alice (Telegram)"});
        bot(&fake, "chat.postMessage", params);
        let echo = socket.recv();
        let event = &echo["payload"]["event"];
        assert_eq!(event["subtype"], json!("bot_message"));
        assert_eq!(
            (event["bot_id"].clone(), event["username"].clone()),
            (json!(BOT_ID), json!("alice (Telegram)"))
        );
        socket.ack(&echo);
        bot(&fake, "chat.postMessage", json!({"channel": CHANNEL, "text": "plain"}));
        let echo = socket.recv();
        let event = &echo["payload"]["event"];
        assert_eq!(
            (event["subtype"].clone(), event["user"].clone()),
            (Value::Null, json!(BOT_USER_ID))
        );
        assert_eq!(event["bot_id"], json!(BOT_ID));
        assert_eq!(event["bot_profile"]["name"], json!(BOT_NAME));
        socket.ack(&echo);

        // Nothing from a channel the bot is not in.
        fake.kick_bot(CHANNEL);
        fake.post(CHANNEL, ALICE, "alice", "unseen");
        assert!(socket.silent(Duration::from_millis(300)));
        socket.send("not json");
        socket.send(r#"{"type":"whatever"}"#);
        crate::wait_for(|| fake.bad_frames().len() == 2, SECS, "bad frames are recorded");
        fake.wait_acked(SECS);
        assert_eq!(fake.acks().len(), 6);
        assert_eq!((fake.unacked(), fake.redeliveries()), (0, 0));
    }

    #[test]
    fn fake_slack_redelivers_unacked_envelopes() {
        let fake = fake();
        fake.set_ack_timeout(Duration::from_millis(150));
        let mut socket = RawSocket::open(&fake);
        assert_eq!(socket.recv()["type"], json!("hello"));
        fake.post(CHANNEL, ALICE, "alice", "ack me");
        let first = socket.recv();
        let id = first["envelope_id"].clone();
        for attempt in 1..=MAX_RETRIES {
            let again = socket.recv();
            assert_eq!(again["envelope_id"], id);
            assert_eq!(again["retry_attempt"], json!(attempt));
            assert_eq!(again["retry_reason"], json!("timeout"));
            assert_eq!(again["payload"], first["payload"], "the same event, same event_id");
        }
        assert!(socket.silent(Duration::from_millis(600)), "given up after {MAX_RETRIES} retries");
        assert_eq!((fake.redeliveries(), fake.unacked()), (3, 1));
        let id = id.as_str().expect("id").to_string();
        let attempts: Vec<u64> = fake
            .deliveries()
            .into_iter()
            .map(|(e, a)| {
                assert_eq!(e, id);
                a
            })
            .collect();
        assert_eq!(attempts, [0, 1, 2, 3]);

        fake.post(CHANNEL, ALICE, "alice", "acked in time");
        let second = socket.recv();
        socket.ack(&second);
        assert!(socket.silent(Duration::from_millis(500)), "an acked envelope is not sent again");
        assert_eq!((fake.redeliveries(), fake.unacked()), (3, 1));
        // A late ack is still recorded.
        socket.ack(&first);
        crate::wait_for(|| fake.unacked() == 0, SECS, "the late ack");
        assert_eq!(fake.acks().len(), 2);
    }

    #[test]
    fn fake_slack_disconnect_drop_socket_and_tickets() {
        let fake = fake();
        let open = api(&fake, "apps.connections.open", Some(APP_TOKEN), json!({}));
        let url = open["url"].as_str().expect("url").to_string();
        let mut socket = RawSocket::connect(&url).expect("connect");
        assert_eq!(socket.recv()["type"], json!("hello"));
        match RawSocket::connect(&url).map_err(|e| *e) {
            Err(tungstenite::Error::Http(response)) => assert_eq!(response.status(), 401),
            Err(other) => panic!("expected HTTP 401, got {other:?}"),
            Ok(_) => panic!("a ticket is good for one connection"),
        }
        fake.wait_connected(SECS);
        assert_eq!(fake.socket_connections(), 1);

        fake.disconnect();
        assert_eq!(
            socket.recv(),
            json!({"type": "disconnect", "reason": "refresh_requested", "debug_info": {"host": "fake"}})
        );
        match socket.read(SECS) {
            Ok(WsMessage::Close(Some(frame))) => assert_eq!(frame.code, CloseCode::Normal),
            other => panic!("expected a close frame, got {other:?}"),
        }
        crate::wait_for(|| fake.socket_connections() == 0, SECS, "the socket is closed");

        fake.set_ack_timeout(Duration::from_millis(200));
        fake.post(CHANNEL, ALICE, "alice", "while nobody listens");
        assert_eq!(fake.queued(), 1);
        let mut socket = RawSocket::open(&fake);
        assert_eq!(socket.recv()["type"], json!("hello"));
        let queued = socket.recv();
        assert_eq!(queued["payload"]["event"]["text"], json!("while nobody listens"));

        fake.drop_socket();
        match socket.read(SECS) {
            Ok(WsMessage::Close(_)) | Ok(WsMessage::Text(_)) => panic!("expected no close frame"),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => {}
        }
        crate::wait_for(|| fake.socket_connections() == 0, SECS, "the socket is dropped");
        // Unacknowledged on the dropped socket: sent again on the next connection.
        let mut socket = RawSocket::open(&fake);
        assert_eq!(socket.recv()["type"], json!("hello"));
        let again = socket.recv();
        assert_eq!(again["envelope_id"], queued["envelope_id"]);
        assert_eq!(again["retry_attempt"], json!(1));
        socket.ack(&again);
        fake.wait_acked(SECS);
        assert_eq!(fake.connections_opened(), 3);
    }

    #[test]
    fn fake_slack_reactions_add_remove_and_their_errors() {
        let fake = fake();
        let ts = fake.post(CHANNEL, ALICE, "alice", "react to me");
        let add = |name: &str| {
            bot(&fake, "reactions.add", json!({"channel": CHANNEL, "timestamp": ts, "name": name}))
        };
        let remove = |name: &str| {
            bot(
                &fake,
                "reactions.remove",
                json!({"channel": CHANNEL, "timestamp": ts, "name": name}),
            )
        };
        assert_eq!(add("eyes"), json!({"ok": true}));
        assert_eq!(add("eyes"), refusal("already_reacted"));
        // Form-encoded, as any call; a skin tone suffix is part of the name.
        let form = format!("channel={CHANNEL}&timestamp={ts}&name=%2B1%3A%3Askin-tone-2");
        assert_eq!(api_form(&fake, "reactions.add", Some(BOT_TOKEN), &form), json!({"ok": true}));
        assert_eq!(add("white_check_mark"), json!({"ok": true}));
        assert_eq!(fake.reactions(CHANNEL, &ts), ["eyes", "+1::skin-tone-2", "white_check_mark"]);
        let history = bot(&fake, "conversations.history", json!({"channel": CHANNEL}));
        assert_eq!(
            history["messages"][0]["reactions"][0],
            json!({"name": "eyes", "users": [BOT_USER_ID], "count": 1})
        );
        assert_eq!(remove("eyes"), json!({"ok": true}));
        assert_eq!(remove("eyes"), refusal("no_reaction"));
        assert_eq!(remove("tada"), refusal("no_reaction"));
        assert_eq!(fake.reactions(CHANNEL, &ts), ["+1::skin-tone-2", "white_check_mark"]);

        // Slack's errors, in its order.
        for name in ["", ":eyes:", "Eyes", "two words", "+1::skin-tone-9", "👀"] {
            assert_eq!(add(name), refusal("invalid_name"), "{name:?}");
        }
        let react = |params: Value| bot(&fake, "reactions.add", params);
        assert_eq!(
            react(json!({"channel": CHANNEL, "name": "eyes"})),
            refusal("no_item_specified")
        );
        assert_eq!(react(json!({"timestamp": ts, "name": "eyes"})), refusal("no_item_specified"));
        assert_eq!(
            react(json!({"channel": "C404", "timestamp": ts, "name": "eyes"})),
            refusal("channel_not_found")
        );
        assert_eq!(
            react(json!({"channel": CHANNEL, "timestamp": "soon", "name": "eyes"})),
            refusal("bad_timestamp")
        );
        assert_eq!(
            react(json!({"channel": CHANNEL, "timestamp": "1.000001", "name": "eyes"})),
            refusal("message_not_found")
        );
        let gone = fake.post(CHANNEL, ALICE, "alice", "gone soon");
        fake.delete(CHANNEL, &gone);
        assert_eq!(
            react(json!({"channel": CHANNEL, "timestamp": gone, "name": "eyes"})),
            refusal("message_not_found")
        );
        assert!(fake.reactions(CHANNEL, &gone).is_empty());
        // A channel named with `#`, and an archived one (no new reactions, removal still works).
        assert_eq!(
            react(json!({"channel": "#general", "timestamp": ts, "name": "tada"})),
            json!({"ok": true})
        );
        bot(&fake, "conversations.archive", json!({"channel": CHANNEL}));
        assert_eq!(add("rocket"), refusal("is_archived"));
        assert_eq!(remove("tada"), json!({"ok": true}));

        let log: Vec<(String, String)> = fake
            .reaction_log()
            .into_iter()
            .map(|(m, c, t, n)| {
                assert_eq!((c.as_str(), t.as_str()), (CHANNEL, ts.as_str()));
                (m, n)
            })
            .collect();
        let entry = |m: &str, n: &str| (m.to_string(), n.to_string());
        assert_eq!(
            log,
            [
                entry("reactions.add", "eyes"),
                entry("reactions.add", "+1::skin-tone-2"),
                entry("reactions.add", "white_check_mark"),
                entry("reactions.remove", "eyes"),
                entry("reactions.add", "tada"),
                entry("reactions.remove", "tada"),
            ]
        );
        assert!(
            fake.changes().is_empty() && fake.sent(CHANNEL).is_empty(),
            "reactions are neither"
        );
    }

    #[test]
    fn fake_slack_ims_info_events_posts_and_reactions() {
        let fake = fake();
        fake.add_im("D1", ALICE, "alice");
        let info = bot(&fake, "conversations.info", json!({"channel": "D1"}));
        let im = &info["channel"];
        assert_eq!(
            (&im["id"], &im["is_im"], &im["user"]),
            (&json!("D1"), &json!(true), &json!(ALICE))
        );
        assert!(im.get("name").is_none(), "{im}");
        assert_eq!(
            bot(&fake, "users.info", json!({"user": ALICE}))["user"]["name"],
            json!("alice")
        );
        assert_eq!(fake.channel_named(""), None, "an IM has no name");
        assert_eq!(
            bot(&fake, "chat.postMessage", json!({"text": "x"})),
            refusal("channel_not_found")
        );

        let mut socket = RawSocket::open(&fake);
        assert_eq!(socket.recv()["type"], json!("hello"));
        let ts = fake.post("D1", ALICE, "alice", "psst");
        let envelope = socket.recv();
        let event = &envelope["payload"]["event"];
        assert_eq!(
            (&event["channel"], &event["channel_type"], &event["user"], &event["text"]),
            (&json!("D1"), &json!("im"), &json!(ALICE), &json!("psst"))
        );
        socket.ack(&envelope);

        // The bot answers in the thread, by the IM's id or by the person's user id.
        let posted =
            bot(&fake, "chat.postMessage", json!({"channel": "D1", "text": "hi", "thread_ts": ts}));
        assert_eq!((&posted["ok"], &posted["channel"]), (&json!(true), &json!("D1")), "{posted}");
        assert_eq!(posted["message"]["thread_ts"], json!(ts));
        let echo = socket.recv();
        assert_eq!(echo["payload"]["event"]["channel_type"], json!("im"));
        socket.ack(&echo);
        let by_user = bot(&fake, "chat.postMessage", json!({"channel": ALICE, "text": "there"}));
        assert_eq!(by_user["channel"], json!("D1"), "{by_user}");
        let echo = socket.recv();
        socket.ack(&echo);
        let sent = fake.sent("D1");
        let summary: Vec<(&str, Option<&str>)> =
            sent.iter().map(|s| (s.text.as_str(), s.thread_ts.as_deref())).collect();
        assert_eq!(summary, [("hi", Some(ts.as_str())), ("there", None)]);

        // Updates, deletions and reactions work there as in a channel; edits carry the type.
        let mine = sent[0].ts.clone();
        let updated =
            bot(&fake, "chat.update", json!({"channel": "D1", "ts": mine, "text": "hi!"}));
        assert_eq!(updated["ok"], json!(true), "{updated}");
        let changed = socket.recv();
        assert_eq!(
            (&changed["payload"]["event"]["subtype"], &changed["payload"]["event"]["channel_type"]),
            (&json!("message_changed"), &json!("im"))
        );
        socket.ack(&changed);
        let reacted =
            bot(&fake, "reactions.add", json!({"channel": "D1", "timestamp": ts, "name": "eyes"}));
        assert_eq!(reacted, json!({"ok": true}));
        assert_eq!(fake.reactions("D1", &ts), ["eyes"]);
        let deleted = bot(&fake, "chat.delete", json!({"channel": "D1", "ts": mine}));
        assert_eq!(deleted["ok"], json!(true));
        let event = socket.recv();
        assert_eq!(event["payload"]["event"]["channel_type"], json!("im"));
        socket.ack(&event);
        let history = bot(&fake, "conversations.history", json!({"channel": "D1"}));
        assert_eq!(texts(&history), ["there", "psst"]);

        // Joining or archiving an IM is no such thing.
        let unsupported = refusal("method_not_supported_for_channel_type");
        assert_eq!(bot(&fake, "conversations.join", json!({"channel": "D1"})), unsupported);
        assert_eq!(bot(&fake, "conversations.archive", json!({"channel": "D1"})), unsupported);

        // A private channel's events carry `group`, a public one's `channel`.
        let private =
            bot(&fake, "conversations.create", json!({"name": "secret", "is_private": true}));
        let private = private["channel"]["id"].as_str().expect("an id").to_string();
        fake.post(&private, ALICE, "alice", "hush");
        let envelope = socket.recv();
        assert_eq!(envelope["payload"]["event"]["channel_type"], json!("group"));
        socket.ack(&envelope);
        fake.post(CHANNEL, ALICE, "alice", "loud");
        let envelope = socket.recv();
        assert_eq!(envelope["payload"]["event"]["channel_type"], json!("channel"));
        socket.ack(&envelope);
        fake.wait_acked(SECS);
    }

    #[test]
    #[should_panic(expected = "only U_ALICE writes in the IM D1")]
    fn fake_slack_only_the_person_writes_in_an_im() {
        let fake = fake();
        fake.add_im("D1", ALICE, "alice");
        fake.post("D1", "U_BOB", "bob", "not mine");
    }

    #[test]
    fn fake_slack_wait_sent_waits_for_another_thread() {
        let fake = Arc::new(fake());
        let sender = Arc::clone(&fake);
        let thread = std::thread::spawn(move || {
            for text in ["one", "two"] {
                std::thread::sleep(Duration::from_millis(100));
                let posted =
                    bot(&sender, "chat.postMessage", json!({"channel": CHANNEL, "text": text}));
                assert_eq!(posted["ok"], json!(true));
            }
        });
        let sent = fake.wait_sent(CHANNEL, 2, SECS);
        assert_eq!(sent.iter().map(|m| m.text.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        thread.join().expect("the sender");
    }

    // -----------------------------------------------------------------------------------------
    // The real slack-morphism 2.31 client against the fake.

    /// The connector recipe: hyper-util's plain `HttpConnector` (its `http1` feature on), the
    /// fake's URL as the API base.
    fn slack_morphism_client_for_tests(
        api_url: &str,
    ) -> Arc<SlackClient<SlackClientHyperConnector<HttpConnector>>> {
        let connector = SlackClientHyperConnector::with_connector(HttpConnector::new())
            .with_slack_api_url(api_url);
        Arc::new(SlackClient::new(connector))
    }

    /// The production client type (`SlackHyperClient`) made to also speak plain http://
    /// (`https_or_http`). Tests use no CA roots; production uses `.with_native_roots()?`.
    fn https_or_http_client(api_url: &str) -> Arc<SlackHyperClient> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        let connector =
            SlackClientHyperConnector::with_connector(https).with_slack_api_url(api_url);
        Arc::new(SlackClient::new(connector))
    }

    fn bot_token() -> SlackApiToken {
        SlackApiToken::new(SlackApiTokenValue(BOT_TOKEN.into()))
            .with_token_type(SlackApiTokenType::Bot)
    }

    fn app_token() -> SlackApiToken {
        SlackApiToken::new(SlackApiTokenValue(APP_TOKEN.into()))
            .with_token_type(SlackApiTokenType::App)
    }

    /// One run of the push-events callback.
    #[derive(Debug)]
    struct Callback {
        event: SlackPushEventCallback,
        /// When the callback was about to return.
        finished: Instant,
        /// It returned an error.
        failed: bool,
    }

    /// The listener's user state: where callbacks report, and how they behave.
    struct Recorder {
        calls: Mutex<std::sync::mpsc::Sender<Callback>>,
        delay: Duration,
        /// Summaries of events whose first callback returns an error.
        fail_first: Mutex<HashSet<String>>,
        /// What the listener's error handler was given (parse errors, socket errors, callback
        /// errors).
        errors: Arc<Mutex<Vec<String>>>,
    }

    /// The listener's error handler: records the error and answers 400, as the default one
    /// does (no acknowledgement for a failed callback).
    fn on_error<SCHC: SlackClientHttpConnector + Send + Sync>(
        error: Box<dyn std::error::Error + Send + Sync>,
        _client: Arc<SlackClient<SCHC>>,
        states: SlackClientEventsUserState,
    ) -> slack_morphism::listener::HttpStatusCode {
        if let Ok(storage) = states.try_read()
            && let Some(recorder) = storage.get_user_state::<Recorder>()
        {
            recorder.errors.lock().unwrap_or_else(|p| p.into_inner()).push(error.to_string());
        }
        slack_morphism::listener::HttpStatusCode::BAD_REQUEST
    }

    /// A short description of an event, to wait for it by.
    fn summary(event: &SlackPushEventCallback) -> String {
        let SlackEventCallbackBody::Message(m) = &event.event else {
            return format!("not a message: {:?}", event.event);
        };
        let text = |c: &Option<SlackMessageContent>| {
            c.as_ref().and_then(|c| c.text.clone()).unwrap_or_default()
        };
        match &m.subtype {
            None => {
                let who = m.sender.user.as_ref().map_or("?", |u| u.0.as_str());
                let kind = if m.sender.bot_id.is_some() { "bot" } else { "person" };
                format!("{kind} {who}: {}", text(&m.content))
            }
            Some(SlackMessageEventType::BotMessage) => {
                format!(
                    "bot_message {}: {}",
                    m.sender.username.as_deref().unwrap_or("?"),
                    text(&m.content)
                )
            }
            Some(SlackMessageEventType::MessageChanged) => {
                let edited = m.message.as_ref().map(|e| text(&e.content)).unwrap_or_default();
                format!("message_changed: {edited}")
            }
            Some(SlackMessageEventType::MessageDeleted) => {
                format!("message_deleted {}", m.deleted_ts.as_ref().map_or("?", |t| t.0.as_str()))
            }
            Some(other) => format!("{other:?}"),
        }
    }

    async fn on_push<SCHC: SlackClientHttpConnector + Send + Sync>(
        event: SlackPushEventCallback,
        _client: Arc<SlackClient<SCHC>>,
        states: SlackClientEventsUserState,
    ) -> UserCallbackResult<()> {
        let (calls, delay, failed) = {
            let storage = states.read().await;
            let recorder = storage.get_user_state::<Recorder>().expect("the recorder");
            let mut fail = recorder.fail_first.lock().unwrap_or_else(|p| p.into_inner());
            let failed = fail.remove(&summary(&event));
            let calls = recorder.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
            (calls, recorder.delay, failed)
        };
        tokio::time::sleep(delay).await;
        let _ = calls.send(Callback { event, finished: Instant::now(), failed });
        if failed { Err("told to fail".into()) } else { Ok(()) }
    }

    /// A Socket Mode listener running on a runtime of its own.
    struct Listener<H: Send + Sync + Clone + Connect + 'static> {
        rt: tokio::runtime::Runtime,
        listener: SlackClientSocketModeListener<SlackClientHyperConnector<H>>,
        calls: std::sync::mpsc::Receiver<Callback>,
        unclaimed: std::cell::RefCell<Vec<Callback>>,
        errors: Arc<Mutex<Vec<String>>>,
    }

    impl<H: Send + Sync + Clone + Connect + 'static> Listener<H> {
        fn start(
            client: Arc<SlackClient<SlackClientHyperConnector<H>>>,
            connections: u32,
            delay: Duration,
            fail_first: &[&str],
        ) -> Self {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime for slack-morphism");
            let (tx, calls) = std::sync::mpsc::channel();
            let errors = Arc::default();
            let recorder = Recorder {
                calls: Mutex::new(tx),
                delay,
                fail_first: Mutex::new(fail_first.iter().map(|s| s.to_string()).collect()),
                errors: Arc::clone(&errors),
            };
            let environment = Arc::new(
                SlackClientEventsListenerEnvironment::new(Arc::clone(&client))
                    .with_error_handler(on_error)
                    .with_user_state(recorder),
            );
            let callbacks = SlackSocketModeListenerCallbacks::new().with_push_events(on_push);
            let config = SlackClientSocketModeConfig::new()
                .with_max_connections_count(connections)
                .with_initial_backoff_in_seconds(0)
                .with_reconnect_timeout_in_seconds(1);
            let listener = SlackClientSocketModeListener::new(&config, environment, callbacks);
            rt.block_on(async {
                listener.listen_for(&app_token()).await.expect("listen_for");
                listener.start().await;
            });
            Listener { rt, listener, calls, unclaimed: Default::default(), errors }
        }

        /// What the error handler got so far.
        fn errors(&self) -> Vec<String> {
            self.errors.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }

        /// The callback run for the event summarised `what` (in any order).
        #[track_caller]
        fn received(&self, what: &str) -> Callback {
            let mut unclaimed = self.unclaimed.borrow_mut();
            if let Some(i) = unclaimed.iter().position(|c| summary(&c.event) == what) {
                return unclaimed.remove(i);
            }
            let deadline = Instant::now() + SECS;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.calls.recv_timeout(left) {
                    Ok(call) if summary(&call.event) == what => return call,
                    Ok(call) => unclaimed.push(call),
                    Err(e) => panic!(
                        "slack-morphism delivered no {what:?}: {e}; got {:?}",
                        unclaimed.iter().map(|c| summary(&c.event)).collect::<Vec<_>>()
                    ),
                }
            }
        }

        fn stop(self) {
            self.rt.block_on(self.listener.shutdown());
            self.rt.shutdown_timeout(Duration::from_secs(1));
        }
    }

    fn message(call: &Callback) -> &slack_morphism::prelude::SlackMessageEvent {
        match &call.event.event {
            SlackEventCallbackBody::Message(m) => m,
            other => panic!("not a message event: {other:?}"),
        }
    }

    #[test]
    fn fake_slack_morphism_socket_mode_receives_acks_and_posts() {
        let fake = fake();
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let listener = Listener::start(Arc::clone(&client), 2, Duration::ZERO, &[]);
        fake.wait_connected(SECS);
        crate::wait_for(|| fake.socket_connections() == 2, SECS, "both connections are open");
        assert_eq!(fake.connections_opened(), 2);
        assert_eq!(fake.requests()[0].0, "apps.connections.open");

        let ts = fake.post(CHANNEL, ALICE, "alice", "hello from a person");
        let call = listener.received("person U_ALICE: hello from a person");
        let m = message(&call);
        assert_eq!(m.origin.ts, SlackTs(ts.clone()));
        assert_eq!(m.origin.channel, Some(SlackChannelId(CHANNEL.into())));
        assert_eq!(m.origin.channel_type.as_ref().map(|t| t.0.as_str()), Some("channel"));
        assert_eq!(m.sender.user, Some(SlackUserId(ALICE.into())));
        assert_eq!((m.sender.bot_id.clone(), m.subtype.clone()), (None, None));
        assert_eq!(call.event.team_id.0, TEAM_ID);
        assert_eq!(call.event.api_app_id.0, APP_ID);
        assert!(call.event.event_id.0.starts_with("Ev"));
        let authorizations = call.event.authorizations.clone().expect("authorizations");
        assert_eq!(authorizations[0].user_id, SlackUserId(BOT_USER_ID.into()));
        fake.wait_acked(SECS);
        assert_eq!(fake.acks().len(), 1);

        // Envelopes go to both connections in turn; both ack.
        for text in ["two", "three"] {
            fake.post(CHANNEL, ALICE, "alice", text);
            listener.received(&format!("person U_ALICE: {text}"));
        }
        fake.edit(CHANNEL, &ts, "hello, edited");
        let changed = listener.received("message_changed: hello, edited");
        let edited = message(&changed).message.as_ref().expect("the edited message");
        assert_eq!(edited.ts, SlackTs(ts.clone()));
        assert_eq!(edited.edited.as_ref().map(|e| e.user.0.as_str()), Some(ALICE));
        let previous = message(&changed).previous_message.as_ref().expect("previous");
        assert_eq!(
            previous.content.as_ref().and_then(|c| c.text.as_deref()),
            Some("hello from a person")
        );
        fake.delete(CHANNEL, &ts);
        listener.received(&format!("message_deleted {ts}"));

        let token = bot_token();
        let session = client.open_session(&token);
        let request = SlackApiChatPostMessageRequest::new(
            SlackChannelId(CHANNEL.into()),
            SlackMessageContent::new().with_text("relayed".into()),
        )
        .with_username("alice (Telegram)".into())
        .with_icon_emoji(":speech_balloon:".into())
        .with_unfurl_links(false);
        let posted =
            listener.rt.block_on(session.chat_post_message(&request)).expect("chat.postMessage");
        assert_eq!(posted.channel, SlackChannelId(CHANNEL.into()));
        assert_eq!(posted.message.sender.username.as_deref(), Some("alice (Telegram)"));
        assert_eq!(posted.message.sender.bot_id, Some(SlackBotId(BOT_ID.into())));
        let sent = fake.wait_sent(CHANNEL, 1, SECS);
        assert_eq!(sent[0].text, "relayed");
        assert_eq!(sent[0].ts, posted.ts.0);
        assert_eq!(
            (sent[0].username.as_deref(), sent[0].username_applied),
            (Some("alice (Telegram)"), true)
        );
        assert_eq!(sent[0].icon_emoji.as_deref(), Some(":speech_balloon:"));
        assert_eq!((sent[0].unfurl_links, sent[0].mrkdwn), (Some(false), None));
        // Slack sends the bot's own post back; a client must drop it itself.
        let echo = listener.received("bot_message alice (Telegram): relayed");
        assert_eq!(message(&echo).sender.bot_id, Some(SlackBotId(BOT_ID.into())));
        let plain = SlackApiChatPostMessageRequest::new(
            SlackChannelId(CHANNEL.into()),
            SlackMessageContent::new().with_text("plain".into()),
        );
        listener.rt.block_on(session.chat_post_message(&plain)).expect("chat.postMessage");
        let echo = listener.received("bot U_BOT: plain");
        let profile = message(&echo).sender.bot_profile.clone().expect("bot_profile");
        assert_eq!((profile.name.as_str(), profile.app_id.as_str()), (BOT_NAME, APP_ID));

        fake.wait_acked(SECS);
        assert_eq!(fake.acks().len(), 7);
        assert_eq!((fake.unacked(), fake.redeliveries()), (0, 0));
        assert!(fake.bad_frames().is_empty(), "{:?}", fake.bad_frames());
        assert!(listener.errors().is_empty(), "every frame parsed: {:?}", listener.errors());
        listener.stop();
    }

    #[test]
    fn fake_slack_morphism_acks_after_the_callback_and_not_on_error() {
        let fake = fake();
        fake.set_ack_timeout(Duration::from_millis(600));
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let failing = "person U_ALICE: fail once";
        let listener = Listener::start(client, 1, Duration::from_millis(300), &[failing]);
        fake.wait_connected(SECS);

        let sent_at = Instant::now();
        fake.post(CHANNEL, ALICE, "alice", "slow");
        let slow = listener.received("person U_ALICE: slow");
        fake.wait_acked(SECS);
        let (_, acked_at) = fake.acks_at()[0].clone();
        assert!(acked_at >= slow.finished, "acked only after the callback returned");
        assert!(acked_at >= sent_at + Duration::from_millis(300));

        fake.post(CHANNEL, ALICE, "alice", "fail once");
        let first = listener.received(failing);
        assert!(first.failed);
        let second = listener.received(failing);
        assert!(!second.failed);
        assert_eq!(first.event.event_id, second.event.event_id, "a redelivery keeps its event_id");
        fake.wait_acked(SECS);
        assert_eq!(fake.redeliveries(), 1);
        let attempts: Vec<u64> = fake.deliveries().into_iter().skip(1).map(|(_, a)| a).collect();
        assert_eq!(attempts, [0, 1]);
        let acks = fake.acks();
        assert_eq!(acks.len(), 2, "the failed callback was not acked: {acks:?}");
        assert_eq!(listener.errors(), ["told to fail"]);
        listener.stop();
    }

    #[test]
    fn fake_slack_morphism_reconnects_after_disconnect_and_dropped_socket() {
        let fake = fake();
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let listener = Listener::start(client, 1, Duration::ZERO, &[]);
        fake.wait_connected(SECS);
        assert_eq!(fake.connections_opened(), 1);

        fake.disconnect();
        crate::wait_for(
            || fake.connections_opened() >= 2 && fake.socket_connections() == 1,
            SECS,
            "slack-morphism reconnects after a disconnect",
        );
        fake.post(CHANNEL, ALICE, "alice", "after disconnect");
        listener.received("person U_ALICE: after disconnect");
        // The callback has run; its ack follows on the socket (dropping the socket before it
        // arrives would have the envelope sent again).
        fake.wait_acked(SECS);

        let opened = fake.connections_opened();
        fake.drop_socket();
        crate::wait_for(
            || fake.connections_opened() > opened && fake.socket_connections() == 1,
            SECS,
            "slack-morphism reconnects after a dropped socket",
        );
        fake.post(CHANNEL, ALICE, "alice", "after drop");
        listener.received("person U_ALICE: after drop");
        fake.wait_acked(SECS);
        assert_eq!(fake.redeliveries(), 0, "{:?}", fake.deliveries());
        // The `disconnect` frame parsed; only the dropped socket is an error.
        let errors = listener.errors();
        assert!(errors.iter().all(|e| e.contains("Slack WSS error")), "{errors:?}");
        listener.stop();
    }

    /// What slack-morphism makes of the fake's Web API answers and errors.
    #[test]
    fn fake_slack_morphism_web_api_calls_and_errors() {
        let fake = fake();
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let token = bot_token();
        let session = client.open_session(&token);
        let channel = SlackChannelId(CHANNEL.into());

        let me = rt.block_on(session.auth_test()).expect("auth.test");
        assert_eq!(
            (me.user_id.0.as_str(), me.team_id.0.as_str(), me.team.as_str()),
            (BOT_USER_ID, TEAM_ID, TEAM_NAME)
        );
        assert_eq!(me.bot_id, Some(SlackBotId(BOT_ID.into())));
        assert_eq!(me.user.as_deref(), Some(BOT_NAME));

        let ts = fake.post(CHANNEL, ALICE, "alice", "from alice");
        let user = rt
            .block_on(session.users_info(&SlackApiUsersInfoRequest::new(SlackUserId(ALICE.into()))))
            .expect("users.info")
            .user;
        assert_eq!(user.name.as_deref(), Some("alice"));
        assert_eq!(user.real_name.as_deref(), Some("alice"));
        let profile = user.profile.expect("a profile");
        assert_eq!(
            (profile.display_name.as_deref(), profile.real_name.as_deref()),
            (Some("alice"), Some("alice"))
        );
        let missing = rt.block_on(
            session.users_info(&SlackApiUsersInfoRequest::new(SlackUserId("U404".into()))),
        );
        assert!(
            matches!(missing, Err(SlackClientError::ApiError(ref e)) if e.code == "user_not_found"),
            "{missing:?}"
        );

        let info = rt
            .block_on(
                session.conversations_info(&SlackApiConversationsInfoRequest::new(channel.clone())),
            )
            .expect("conversations.info")
            .channel;
        assert_eq!((info.name.as_deref(), info.flags.is_member), (Some("general"), Some(true)));

        let post = |text: &str| {
            let request = SlackApiChatPostMessageRequest::new(
                channel.clone(),
                SlackMessageContent::new().with_text(text.into()),
            );
            rt.block_on(session.chat_post_message(&request))
        };
        let mine = post("from the bot").expect("chat.postMessage");
        let history = rt
            .block_on(
                session.conversations_history(
                    &SlackApiConversationsHistoryRequest::new()
                        .with_channel(channel.clone())
                        .with_limit(10),
                ),
            )
            .expect("conversations.history");
        let texts: Vec<Option<&str>> =
            history.messages.iter().map(|m| m.content.text.as_deref()).collect();
        assert_eq!(texts, [Some("from the bot"), Some("from alice")]);
        assert_eq!(history.messages[1].sender.user, Some(SlackUserId(ALICE.into())));
        assert_eq!(history.messages[1].origin.ts, SlackTs(ts));
        assert_eq!(history.messages[0].sender.bot_id, Some(SlackBotId(BOT_ID.into())));
        assert_eq!(history.has_more, Some(false));

        fake.rate_limit_next(1, 7);
        match post("limited") {
            Err(SlackClientError::RateLimitError(e)) => {
                assert_eq!(e.retry_after, Some(Duration::from_secs(7)));
                assert_eq!(e.code.as_deref(), Some("ratelimited"));
            }
            other => panic!("expected a rate limit error, got {other:?}"),
        }
        fake.fail_next_posts(1, "fatal_error");
        let api_error = |result: Result<_, SlackClientError>| match result {
            Err(SlackClientError::ApiError(e)) => e.code,
            other => panic!("expected an API error, got {other:?}"),
        };
        assert_eq!(api_error(post("x").map(drop)), "fatal_error");
        assert_eq!(api_error(post(&"x".repeat(MAX_TEXT_CHARS + 1)).map(drop)), "msg_too_long");
        fake.kick_bot(CHANNEL);
        assert_eq!(api_error(post("x").map(drop)), "not_in_channel");
        fake.add_channel(CHANNEL, "general");
        let elsewhere = SlackApiChatPostMessageRequest::new(
            SlackChannelId("C404".into()),
            SlackMessageContent::new().with_text("x".into()),
        );
        assert_eq!(
            api_error(rt.block_on(session.chat_post_message(&elsewhere)).map(drop)),
            "channel_not_found"
        );
        let opened =
            rt.block_on(session.apps_connections_open(&SlackApiAppsConnectionOpenRequest::new()));
        assert_eq!(api_error(opened.map(drop)), "not_allowed_token_type");

        fake.deny_customize();
        let request = SlackApiChatPostMessageRequest::new(
            channel.clone(),
            SlackMessageContent::new().with_text("as bob?".into()),
        )
        .with_username("bob".into());
        let plain = rt.block_on(session.chat_post_message(&request)).expect("ok without the scope");
        assert_eq!(plain.message.sender.username, None);
        let last = fake.sent(CHANNEL).pop().expect("sent");
        assert_eq!((last.username.as_deref(), last.username_applied), (Some("bob"), false));

        let update = SlackApiChatUpdateRequest::new(
            channel.clone(),
            SlackMessageContent::new().with_text("edited by the bot".into()),
            mine.ts.clone(),
        );
        let updated = rt.block_on(session.chat_update(&update)).expect("chat.update");
        assert_eq!(updated.message.content.text.as_deref(), Some("edited by the bot"));
        rt.block_on(
            session.chat_delete(&SlackApiChatDeleteRequest::new(channel.clone(), mine.ts.clone())),
        )
        .expect("chat.delete");
        let texts: Vec<Option<String>> = fake.changes().into_iter().map(|c| c.text).collect();
        assert_eq!(texts, [Some("edited by the bot".to_string()), None]);
    }

    /// `conversations.create` through slack-morphism: the channel it makes takes posts.
    #[test]
    fn fake_slack_morphism_conversations_create() {
        let fake = fake();
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let token = bot_token();
        let session = client.open_session(&token);
        let request = SlackApiConversationsCreateRequest::new("work-1".into());
        let created =
            rt.block_on(session.conversations_create(&request)).expect("conversations.create");
        let info = created.channel;
        assert_eq!(fake.channel_named("work-1").as_deref(), Some(info.id.0.as_str()));
        assert_eq!(info.name.as_deref(), Some("work-1"));
        assert_eq!(info.creator, Some(SlackUserId(BOT_USER_ID.into())));
        assert_eq!(
            (info.flags.is_channel, info.flags.is_member, info.flags.is_private),
            (Some(true), Some(true), Some(false))
        );

        let post = SlackApiChatPostMessageRequest::new(
            info.id.clone(),
            SlackMessageContent::new().with_text("in the new channel".into()),
        );
        rt.block_on(session.chat_post_message(&post)).expect("chat.postMessage");
        let sent = fake.sent(&info.id.0);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].text, "in the new channel");

        let private =
            SlackApiConversationsCreateRequest::new("work-2".into()).with_is_private(true);
        let private =
            rt.block_on(session.conversations_create(&private)).expect("a private channel").channel;
        assert_eq!(private.flags.is_private, Some(true));
        assert_ne!(private.id, info.id);

        match rt.block_on(session.conversations_create(&request)) {
            Err(SlackClientError::ApiError(e)) => assert_eq!(e.code, "name_taken"),
            other => panic!("expected name_taken, got {other:?}"),
        }
    }

    /// An IM through slack-morphism: the person's message as an `im` event, the IM's info, the
    /// bot's reply in its thread, and reactions on and off (Slack's errors as API errors).
    #[test]
    fn fake_slack_morphism_im_and_reactions() {
        let fake = fake();
        fake.add_im("D1", ALICE, "alice");
        let client = slack_morphism_client_for_tests(&fake.api_url());
        let listener = Listener::start(Arc::clone(&client), 1, Duration::ZERO, &[]);
        fake.wait_connected(SECS);
        let ts = fake.post("D1", ALICE, "alice", "hello bot");
        let call = listener.received("person U_ALICE: hello bot");
        let m = message(&call);
        assert_eq!(m.origin.channel, Some(SlackChannelId("D1".into())));
        assert_eq!(m.origin.channel_type.as_ref().map(|t| t.0.as_str()), Some("im"));

        let token = bot_token();
        let session = client.open_session(&token);
        let channel = SlackChannelId("D1".into());
        let info = listener
            .rt
            .block_on(
                session.conversations_info(&SlackApiConversationsInfoRequest::new(channel.clone())),
            )
            .expect("conversations.info")
            .channel;
        assert_eq!((info.flags.is_im, info.name), (Some(true), None));

        let reply = SlackApiChatPostMessageRequest::new(
            channel.clone(),
            SlackMessageContent::new().with_text("hello alice".into()),
        )
        .with_thread_ts(SlackTs(ts.clone()));
        let posted = listener.rt.block_on(session.chat_post_message(&reply)).expect("a reply");
        assert_eq!(posted.channel, channel);
        listener.received("bot U_BOT: hello alice");
        assert_eq!(fake.sent("D1")[0].thread_ts.as_deref(), Some(ts.as_str()));

        let name = SlackReactionName("eyes".into());
        let add =
            SlackApiReactionsAddRequest::new(channel.clone(), name.clone(), SlackTs(ts.clone()));
        listener.rt.block_on(session.reactions_add(&add)).expect("reactions.add");
        match listener.rt.block_on(session.reactions_add(&add)) {
            Err(SlackClientError::ApiError(e)) => assert_eq!(e.code, "already_reacted"),
            other => panic!("expected already_reacted, got {other:?}"),
        }
        assert_eq!(fake.reactions("D1", &ts), ["eyes"]);
        let remove = SlackApiReactionsRemoveRequest::new(name)
            .with_channel(channel.clone())
            .with_timestamp(SlackTs(ts.clone()));
        listener.rt.block_on(session.reactions_remove(&remove)).expect("reactions.remove");
        match listener.rt.block_on(session.reactions_remove(&remove)) {
            Err(SlackClientError::ApiError(e)) => assert_eq!(e.code, "no_reaction"),
            other => panic!("expected no_reaction, got {other:?}"),
        }
        assert!(fake.reactions("D1", &ts).is_empty());
        assert_eq!(fake.reaction_log().len(), 2);
        fake.wait_acked(SECS);
        assert!(listener.errors().is_empty(), "{:?}", listener.errors());
        listener.stop();
    }

    /// The production client type pointed at http:// through `https_or_http`.
    #[test]
    fn fake_slack_morphism_https_or_http_connector_works_too() {
        let fake = fake();
        let client = https_or_http_client(&fake.api_url());
        let token = bot_token();
        let listener = Listener::start(Arc::clone(&client), 1, Duration::ZERO, &[]);
        let me = listener.rt.block_on(client.open_session(&token).auth_test()).expect("auth.test");
        assert_eq!(me.user_id.0, BOT_USER_ID);
        fake.wait_connected(SECS);
        fake.post(CHANNEL, ALICE, "alice", "over https_or_http");
        listener.received("person U_ALICE: over https_or_http");
        fake.wait_acked(SECS);
        assert!(listener.errors().is_empty(), "{:?}", listener.errors());
        listener.stop();
    }
}
