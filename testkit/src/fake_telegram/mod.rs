//! A fake Telegram Bot API server for tests: a real HTTP/1.1 server on 127.0.0.1 that speaks the
//! Bot API wire format (<https://core.telegram.org/bots/api>) for one bot, scripted from the test
//! ([`FakeTelegram::post`], [`FakeTelegram::fail_sends_with_429`], …), recording what the bot did.
//!
//! It follows the real server's rules where a client can get them wrong: the token in the path
//! (401), `getUpdates` offsets that confirm and delete updates, long polls held open and answered
//! as soon as an update arrives, a newer `getUpdates` terminating a held one with 409, the
//! 4096-character limit and the MarkdownV2 escaping rules of `sendMessage` (and of
//! `editMessageText`), `retry_after` on 429, a bot never receiving its own messages, edits
//! delivered as `edited_message` when `allowed_updates` lets them through, and the bot editing
//! (`editMessageText`) and deleting (`deleteMessage`) only what it may, with Telegram's errors
//! ("message to edit not found", "message can't be edited", "message is not modified", …),
//! recorded by [`FakeTelegram::edits`]. Besides supergroups ([`FakeTelegram::add_chat`]) it has
//! private chats ([`FakeTelegram::post_private`]): the chat's id is the person's user id, its
//! `chat` object is `{"id", "type": "private", "first_name", "username"?}` (no title), message ids
//! come from the bot's one message box shared by all its private chats (not numbered per chat as
//! in a supergroup), and the bot may delete the person's messages there (incoming messages in a
//! private chat), not only its own. `sendChatAction` is recorded ([`FakeTelegram::chat_actions`]).
//! It accepts JSON bodies, form-encoded bodies and query strings, and keeps connections alive
//! like the real server (reqwest reuses them). It shares no code with the client it tests. It
//! runs on its own thread and tokio runtime, so sync and async tests can use it, and its long
//! polls keep real time while a test pauses its clock.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::http1::{self, Conn, Request, Response, Server};

mod bot_api;
mod entities;
use bot_api::*;
pub use entities::markdown_v2_as_sent;
use entities::*;

/// The bot's user id when the token does not start with one (real tokens are `<bot id>:<secret>`).
pub const DEFAULT_BOT_ID: i64 = 7_000_000_001;
/// `first_name` of the bot in `getMe` and in the `from` of the messages it sends.
pub const BOT_FIRST_NAME: &str = "Flock";
/// `username` of the bot.
pub const BOT_USERNAME: &str = "flock_test_bot";
/// The `update_id` of the first update (real ones are large numbers, never 0 or 1).
pub const FIRST_UPDATE_ID: i64 = 100_000_001;
/// Longest message text, in characters after entity parsing.
pub const MAX_MESSAGE_CHARS: usize = 4096;
/// The description Telegram gives a `getUpdates` terminated by a newer one.
pub const CONFLICT: &str = concat!(
    "Conflict: terminated by other getUpdates request; ",
    "make sure that only one bot instance is running"
);

/// The update types delivered when the bot never chose (or reset with `[]`) `allowed_updates`.
const DEFAULT_UPDATE_TYPES: [&str; 2] = ["message", "edited_message"];
/// Actions `sendChatAction` accepts.
const CHAT_ACTIONS: [&str; 11] = [
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

/// A `sendMessage` the fake accepted.
#[derive(Debug, Clone)]
pub struct SentMessage {
    pub chat_id: i64,
    pub message_id: i64,
    /// The text exactly as sent (escapes and entity markers included).
    pub text: String,
    /// The `parse_mode` as sent (`None` when absent or empty).
    pub parse_mode: Option<String>,
    /// The message text as Telegram stores it: escapes and entity markers removed, leading and
    /// trailing whitespace trimmed.
    pub plain: String,
    /// The entities Telegram found in it (`{"type", "offset", "length", "url"?, "language"?}`,
    /// offsets in UTF-16 units), as the message's `entities` field shows them.
    pub entities: Vec<Value>,
    /// The `message_id` of the message it replies to (`reply_parameters`, or the older
    /// `reply_to_message_id`); `None` when it replies to nothing, also when the message named was
    /// not found and `allow_sending_without_reply` let it go out as a plain message.
    pub reply_to: Option<i64>,
    /// Every parameter of the call (query string and body merged; form values are strings).
    pub params: Value,
}

/// One answer the fake was scripted to give to a `sendMessage`.
#[derive(Debug, Clone)]
struct Fault {
    status: u16,
    description: String,
    retry_after: Option<u64>,
}

/// A refused call: the HTTP status equals Telegram's `error_code`.
#[derive(Debug, Clone)]
struct Refusal {
    status: u16,
    description: String,
    retry_after: Option<u64>,
}

impl Refusal {
    fn new(status: u16, description: impl Into<String>) -> Refusal {
        Refusal { status, description: description.into(), retry_after: None }
    }

    fn bad(description: impl std::fmt::Display) -> Refusal {
        Refusal::new(400, format!("Bad Request: {description}"))
    }

    fn body(&self) -> Value {
        let mut body = json!({
            "ok": false,
            "error_code": self.status,
            "description": self.description,
        });
        if let Some(secs) = self.retry_after {
            body["parameters"] = json!({"retry_after": secs});
        }
        body
    }
}

#[derive(Debug)]
struct Chat {
    /// The `chat` object of its messages.
    json: Value,
    /// A private chat with a person (else a supergroup).
    private: bool,
    /// The next `message_id` of a supergroup (private chats number from the bot's message box).
    next_message_id: i64,
    /// Every message of the chat (posted by people or sent by the bot), for edits and replies.
    messages: HashMap<i64, Value>,
}

#[derive(Debug)]
struct Update {
    update_id: i64,
    kind: &'static str,
    message: Value,
}

impl Update {
    fn to_json(&self) -> Value {
        let mut update = json!({"update_id": self.update_id});
        update[self.kind] = self.message.clone();
        update
    }
}

#[derive(Debug)]
struct State {
    chats: HashMap<i64, Chat>,
    /// Updates not confirmed yet, oldest first.
    updates: VecDeque<Update>,
    next_update_id: i64,
    /// `None`: the default types (never set, or reset with an empty list).
    allowed_updates: Option<Vec<String>>,
    /// Every `getUpdates` gets a number; the one that may still answer is `active_poll`.
    poll_seq: u64,
    active_poll: Option<u64>,
    offsets: Vec<Option<i64>>,
    sent: Vec<SentMessage>,
    /// `(chat_id, message_id, text as shown or None for deleted)` of every accepted
    /// `editMessageText` and `deleteMessage`, in order.
    edits: Vec<(i64, i64, Option<String>)>,
    /// `(chat_id, action)` of every accepted `sendChatAction`, in order.
    chat_actions: Vec<(i64, String)>,
    /// The next `message_id` of the bot's message box, which numbers the messages of all its
    /// private chats together.
    next_private_message_id: i64,
    rejected: Vec<(String, u16, String)>,
    calls: Vec<String>,
    faults: VecDeque<Fault>,
    drop_requests: usize,
    dropped: usize,
}

#[derive(Debug)]
struct Shared {
    token: String,
    bot_id: i64,
    state: Mutex<State>,
    /// Bumped on every change a waiter may care about: updates, polls, sends.
    changes: watch::Sender<u64>,
    /// Notified on every accepted `sendMessage`, `editMessageText` and `deleteMessage` (for
    /// [`FakeTelegram::wait_sent`] and [`FakeTelegram::wait_edits`]).
    sent_cv: Condvar,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn bot_user(&self) -> Value {
        json!({
            "id": self.bot_id,
            "is_bot": true,
            "first_name": BOT_FIRST_NAME,
            "username": BOT_USERNAME,
        })
    }
}

/// A running fake Telegram Bot API for one bot; stops when dropped.
#[derive(Debug)]
pub struct FakeTelegram {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: Server,
}

impl FakeTelegram {
    /// Binds 127.0.0.1:0 and serves the bot `token` on a thread of its own. The bot's id is the
    /// number before the `:` of the token (as in real tokens), else [`DEFAULT_BOT_ID`].
    pub fn start(token: &str) -> FakeTelegram {
        let bot_id = token
            .split_once(':')
            .and_then(|(id, _)| id.parse::<i64>().ok())
            .filter(|id| *id > 0)
            .unwrap_or(DEFAULT_BOT_ID);
        let shared = Arc::new(Shared {
            token: token.to_string(),
            bot_id,
            state: Mutex::new(State {
                chats: HashMap::new(),
                updates: VecDeque::new(),
                next_update_id: FIRST_UPDATE_ID,
                allowed_updates: None,
                poll_seq: 0,
                active_poll: None,
                offsets: Vec::new(),
                sent: Vec::new(),
                edits: Vec::new(),
                chat_actions: Vec::new(),
                next_private_message_id: 1,
                rejected: Vec::new(),
                calls: Vec::new(),
                faults: VecDeque::new(),
                drop_requests: 0,
                dropped: 0,
            }),
            changes: watch::Sender::new(0),
            sent_cv: Condvar::new(),
        });
        let served = Arc::clone(&shared);
        let server = Server::start("fake-telegram", move |listener, stop| {
            http1::accept_until(listener, stop, move |stream| {
                connection(Conn::new(stream), Arc::clone(&served))
            })
        });
        FakeTelegram { addr: server.addr, shared, server }
    }

    /// `http://127.0.0.1:PORT`, without a trailing slash: clients append `/bot<TOKEN>/<method>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The bot's user id (the `id` of `getMe` and the `from` of its messages).
    pub fn bot_id(&self) -> i64 {
        self.shared.bot_id
    }

    /// Registers (or renames) a supergroup the bot is a member of. Chats not registered are
    /// "not found" for `sendMessage`.
    #[track_caller]
    pub fn add_chat(&self, chat_id: i64, title: &str) {
        let mut state = self.shared.state();
        let chat = state.chats.entry(chat_id).or_insert_with(|| Chat {
            json: Value::Null,
            private: false,
            next_message_id: 1,
            messages: HashMap::new(),
        });
        assert!(!chat.private, "fake Telegram: chat {chat_id} is a private chat, not a supergroup");
        chat.json = json!({"id": chat_id, "title": title, "type": "supergroup"});
    }

    /// A person posts `text` in a registered chat: queues a `message` update (unless the bot's
    /// `allowed_updates` excludes messages); returns the new `message_id`.
    #[track_caller]
    pub fn post(
        &self,
        chat_id: i64,
        user_id: i64,
        first_name: &str,
        username: Option<&str>,
        text: &str,
    ) -> i64 {
        let from = person_json(user_id, first_name, username);
        let message_id = {
            let mut state = self.shared.state();
            let Some(chat) = state.chats.get(&chat_id) else {
                panic!("fake Telegram: post to chat {chat_id}, which was never added (add_chat)");
            };
            assert!(
                !chat.private || chat_id == user_id,
                "fake Telegram: only user {chat_id} writes in the private chat {chat_id}"
            );
            state.person_message(chat_id, from, text)
        };
        self.shared.bump();
        message_id
    }

    /// A person writes `text` to the bot directly: opens (or updates the name of) the private
    /// chat between them — its id is `user_id`, its `chat` object `{"id": user_id, "type":
    /// "private", "first_name", "username"?}` — and queues a `message` update as
    /// [`FakeTelegram::post`] does; returns the new `message_id` (from the bot's message box,
    /// which numbers all its private chats together). The bot can then `sendMessage`,
    /// `sendChatAction`, `editMessageText` and `deleteMessage` there, and [`FakeTelegram::post`],
    /// [`FakeTelegram::edit`], [`FakeTelegram::sent_to`], … take `user_id` as the chat id.
    #[track_caller]
    pub fn post_private(
        &self,
        user_id: i64,
        first_name: &str,
        username: Option<&str>,
        text: &str,
    ) -> i64 {
        assert!(user_id > 0, "fake Telegram: user ids (and so private chat ids) are positive");
        let mut chat_object = json!({"id": user_id, "type": "private", "first_name": first_name});
        if let Some(username) = username {
            chat_object["username"] = json!(username);
        }
        let message_id = {
            let mut state = self.shared.state();
            let chat = state.chats.entry(user_id).or_insert_with(|| Chat {
                json: Value::Null,
                private: true,
                next_message_id: 1,
                messages: HashMap::new(),
            });
            assert!(chat.private, "fake Telegram: chat {user_id} is a supergroup (add_chat)");
            chat.json = chat_object;
            state.person_message(user_id, person_json(user_id, first_name, username), text)
        };
        self.shared.bump();
        message_id
    }

    /// The `action` of every accepted `sendChatAction` to `chat_id` ("typing", …), in order.
    pub fn chat_actions(&self, chat_id: i64) -> Vec<String> {
        let state = self.shared.state();
        state.chat_actions.iter().filter(|(c, _)| *c == chat_id).map(|(_, a)| a.clone()).collect()
    }

    /// The author of message `message_id` edits it: queues an `edited_message` update carrying
    /// the whole message with its new text and an `edit_date`.
    #[track_caller]
    pub fn edit(&self, chat_id: i64, message_id: i64, new_text: &str) {
        {
            let mut state = self.shared.state();
            let Some(chat) = state.chats.get_mut(&chat_id) else {
                panic!("fake Telegram: edit in chat {chat_id}, which was never added (add_chat)");
            };
            let Some(message) = chat.messages.get_mut(&message_id) else {
                panic!("fake Telegram: chat {chat_id} has no message {message_id} to edit");
            };
            assert!(
                message["from"]["is_bot"] != json!(true),
                "fake Telegram: message {message_id} in chat {chat_id} was sent by the bot; \
                 people cannot edit it"
            );
            message["text"] = json!(new_text);
            message["edit_date"] = json!(unix_now().max(message["date"].as_i64().unwrap_or(0)));
            match detect_entities(new_text) {
                entities if entities.is_empty() => {
                    if let Some(m) = message.as_object_mut() {
                        m.remove("entities");
                    }
                }
                entities => message["entities"] = Value::Array(entities),
            }
            let message = message.clone();
            state.queue("edited_message", message);
        }
        self.shared.bump();
    }

    /// `(message_id, text)` of every accepted `editMessageText` in `chat_id` — the text as
    /// Telegram shows it, like [`SentMessage::plain`] — and `(message_id, None)` of every
    /// accepted `deleteMessage`, in order. ([`FakeTelegram::sent_to`] keeps the messages as
    /// sent.)
    pub fn edits(&self, chat_id: i64) -> Vec<(i64, Option<String>)> {
        self.shared.state().edits_in(chat_id)
    }

    /// Waits (real time) until the bot made at least `n` edits or deletions in `chat_id` and
    /// returns them all ([`FakeTelegram::edits`]); panics after `timeout` with what it has.
    #[track_caller]
    pub fn wait_edits(
        &self,
        chat_id: i64,
        n: usize,
        timeout: Duration,
    ) -> Vec<(i64, Option<String>)> {
        match crate::wait_on(&self.shared.state, &self.shared.sent_cv, timeout, |s| {
            s.edits_in(chat_id).len() >= n
        }) {
            Ok(state) => state.edits_in(chat_id),
            Err(state) => {
                let (got, rejected) = (state.edits_in(chat_id), state.rejected.clone());
                drop(state);
                panic!(
                    "fake Telegram: {} edit(s)/deletion(s) in chat {chat_id} after {timeout:?}, \
                     expected {n}: {got:#?}\nrefused calls: {rejected:?}",
                    got.len()
                );
            }
        }
    }

    /// Message `message_id` of the chat as it is now (a Message object: edits applied, with
    /// `edit_date`), or `None` if it never existed or was deleted.
    pub fn message(&self, chat_id: i64, message_id: i64) -> Option<Value> {
        self.shared.state().chats.get(&chat_id)?.messages.get(&message_id).cloned()
    }

    /// Every accepted `sendMessage`, in order.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.state().sent.clone()
    }

    /// The accepted `sendMessage`s to `chat_id`, in order.
    pub fn sent_to(&self, chat_id: i64) -> Vec<SentMessage> {
        self.shared.state().sent.iter().filter(|m| m.chat_id == chat_id).cloned().collect()
    }

    /// Waits (real time) until at least `n` messages were sent to `chat_id` and returns them
    /// all; panics after `timeout` with what it has. It blocks the calling thread: in an async
    /// test running on a single thread use [`FakeTelegram::wait_sent_async`].
    #[track_caller]
    pub fn wait_sent(&self, chat_id: i64, n: usize, timeout: Duration) -> Vec<SentMessage> {
        let matching = |state: &State| -> Vec<SentMessage> {
            state.sent.iter().filter(|m| m.chat_id == chat_id).cloned().collect()
        };
        match crate::wait_on(&self.shared.state, &self.shared.sent_cv, timeout, |s| {
            matching(s).len() >= n
        }) {
            Ok(state) => matching(&state),
            Err(state) => {
                let (got, rejected) = (matching(&state), state.rejected.clone());
                drop(state);
                panic!(
                    "fake Telegram: {} message(s) sent to chat {chat_id} after {timeout:?}, \
                     expected {n}: {got:#?}\nrefused calls: {rejected:?}",
                    got.len()
                );
            }
        }
    }

    /// [`FakeTelegram::wait_sent`] for async tests: the deadline runs on the fake's own clock,
    /// so it keeps real time even when the test pauses its clock.
    pub async fn wait_sent_async(
        &self,
        chat_id: i64,
        n: usize,
        timeout: Duration,
    ) -> Vec<SentMessage> {
        let shared = Arc::clone(&self.shared);
        let waited = self
            .server
            .rt
            .spawn(async move {
                let deadline = tokio::time::Instant::now() + timeout;
                loop {
                    let mut changes = shared.changes.subscribe();
                    let count = shared.state().sent.iter().filter(|m| m.chat_id == chat_id).count();
                    if count >= n {
                        return true;
                    }
                    if tokio::time::timeout_at(deadline, changes.changed()).await.is_err() {
                        return false;
                    }
                }
            })
            .await
            .unwrap_or(false);
        let got = self.sent_to(chat_id);
        assert!(
            waited,
            "fake Telegram: {} message(s) sent to chat {chat_id} after {timeout:?}, expected \
             {n}: {got:#?}\nrefused calls: {:?}",
            got.len(),
            self.rejected()
        );
        got
    }

    /// The `offset` of every `getUpdates` call, in arrival order (`None`: no offset given).
    pub fn offsets(&self) -> Vec<Option<i64>> {
        self.shared.state().offsets.clone()
    }

    /// Updates queued and not yet confirmed by an offset.
    pub fn pending_updates(&self) -> usize {
        self.shared.state().updates.len()
    }

    /// The `update_id` the next update will get (one more than the last one queued).
    pub fn next_update_id(&self) -> i64 {
        self.shared.state().next_update_id
    }

    /// `(method, HTTP status, description)` of every refused call, in order (dropped
    /// connections are not calls: see [`FakeTelegram::dropped`]).
    pub fn rejected(&self) -> Vec<(String, u16, String)> {
        self.shared.state().rejected.clone()
    }

    /// The method name (as written in the path) of every request that carried the right token,
    /// answered or refused, in arrival order.
    pub fn calls(&self) -> Vec<String> {
        self.shared.state().calls.clone()
    }

    /// The next `n` `sendMessage` calls answer 429 with `retry_after` = `retry_after_secs`.
    pub fn fail_sends_with_429(&self, n: usize, retry_after_secs: u64) {
        let fault = Fault {
            status: 429,
            description: format!("Too Many Requests: retry after {retry_after_secs}"),
            retry_after: Some(retry_after_secs),
        };
        self.shared.state().faults.extend(std::iter::repeat_n(fault, n));
    }

    /// The next `n` `sendMessage` calls answer `status` with `description` (e.g. 403 "Forbidden:
    /// bot was kicked from the supergroup chat", or 500 "Internal Server Error"). Faults queue
    /// up behind the ones scripted earlier.
    pub fn fail_next_sends(&self, n: usize, status: u16, description: &str) {
        let fault = Fault { status, description: description.to_string(), retry_after: None };
        self.shared.state().faults.extend(std::iter::repeat_n(fault, n));
    }

    /// The next `n` requests — on a new or a kept-alive connection, whatever their method — are
    /// read and then the connection is closed without an answer (a network failure; the call
    /// has no effect).
    pub fn drop_next_connections(&self, n: usize) {
        self.shared.state().drop_requests += n;
    }

    /// How many requests [`FakeTelegram::drop_next_connections`] dropped so far.
    pub fn dropped(&self) -> usize {
        self.shared.state().dropped
    }
}

impl State {
    /// A new `message_id` in a registered chat: the supergroup's own numbering, or for a private
    /// chat the bot's message box (one numbering for all its private chats, as on Telegram).
    fn new_message_id(&mut self, chat_id: i64) -> i64 {
        let Some(chat) = self.chats.get_mut(&chat_id) else { return 0 };
        let counter = if chat.private {
            &mut self.next_private_message_id
        } else {
            &mut chat.next_message_id
        };
        let id = *counter;
        *counter += 1;
        id
    }

    /// Stores a person's message in a registered chat and queues its `message` update; returns
    /// its `message_id`.
    fn person_message(&mut self, chat_id: i64, from: Value, text: &str) -> i64 {
        let message_id = self.new_message_id(chat_id);
        let Some(chat) = self.chats.get_mut(&chat_id) else { return 0 };
        let mut message = json!({
            "message_id": message_id,
            "from": from,
            "chat": chat.json,
            "date": unix_now(),
            "text": text,
        });
        let entities = detect_entities(text);
        if !entities.is_empty() {
            message["entities"] = Value::Array(entities);
        }
        chat.messages.insert(message_id, message.clone());
        self.queue("message", message);
        message_id
    }

    fn queue(&mut self, kind: &'static str, message: Value) {
        let allowed = match &self.allowed_updates {
            None => DEFAULT_UPDATE_TYPES.contains(&kind),
            Some(types) => types.iter().any(|t| t == kind),
        };
        if allowed {
            let update_id = self.next_update_id;
            self.next_update_id += 1;
            self.updates.push_back(Update { update_id, kind, message });
        }
    }

    fn edits_in(&self, chat_id: i64) -> Vec<(i64, Option<String>)> {
        self.edits
            .iter()
            .filter(|(chat, _, _)| *chat == chat_id)
            .map(|(_, message, text)| (*message, text.clone()))
            .collect()
    }

    /// What `getUpdates` with `offset` confirms and forgets.
    fn confirm(&mut self, offset: i64) {
        if offset < 0 {
            // -N: only the last N updates are kept; all previous ones are forgotten.
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            while self.updates.len() > keep {
                self.updates.pop_front();
            }
        } else {
            while self.updates.front().is_some_and(|u| u.update_id < offset) {
                self.updates.pop_front();
            }
        }
    }
}

/// A person as the `from` of a message.
fn person_json(user_id: i64, first_name: &str, username: Option<&str>) -> Value {
    let mut from = json!({"id": user_id, "is_bot": false, "first_name": first_name});
    if let Some(username) = username {
        from["username"] = json!(username);
    }
    from
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream as StdStream;
    use std::time::Instant;

    const TOKEN: &str = "123456:TEST-token_abc";
    const CHAT: i64 = -1_001_234_567_890;
    const SECS: Duration = Duration::from_secs(10);

    /// Status, headers (lower-case names) and JSON body.
    type Response = (u16, Vec<(String, String)>, Value);

    /// A plain blocking HTTP/1.1 client on one TCP connection.
    struct Client {
        stream: StdStream,
        buf: Vec<u8>,
    }

    impl Client {
        fn connect(fake: &FakeTelegram) -> Client {
            let stream = StdStream::connect(fake.addr).expect("connect to the fake");
            stream.set_read_timeout(Some(Duration::from_secs(30))).expect("read timeout");
            Client { stream, buf: Vec::new() }
        }

        fn send(&mut self, method: &str, target: &str, content_type: Option<&str>, body: &str) {
            let mut request = format!(
                "{method} {target} HTTP/1.1\r\nHost: api.telegram.org\r\nContent-Length: {}\r\n",
                body.len()
            );
            if let Some(ct) = content_type {
                request.push_str(&format!("Content-Type: {ct}\r\n"));
            }
            request.push_str("\r\n");
            request.push_str(body);
            self.stream.write_all(request.as_bytes()).expect("write the request");
        }

        /// The next response: status, headers (lower-case names) and body; `None` at EOF.
        fn response(&mut self) -> Option<Response> {
            let (head_len, status, headers) = loop {
                if let Some(head) = crate::http1::response_head(&self.buf) {
                    break head;
                }
                if !self.fill() {
                    return None;
                }
            };
            let length: usize = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .expect("the fake always sends Content-Length");
            while self.buf.len() < head_len + length {
                assert!(self.fill(), "connection closed inside a response body");
            }
            let body = serde_json::from_slice(&self.buf[head_len..head_len + length])
                .expect("a JSON body");
            self.buf.drain(..head_len + length);
            Some((status, headers, body))
        }

        fn fill(&mut self) -> bool {
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) | Err(_) => false,
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    true
                }
            }
        }

        /// `POST /bot<token>/<method>` with a JSON body.
        fn call(&mut self, token: &str, method: &str, body: Value) -> (u16, Value) {
            let target = format!("/bot{token}/{method}");
            self.send("POST", &target, Some("application/json"), &body.to_string());
            let (status, _, body) = self.response().expect("an answer");
            (status, body)
        }
    }

    /// One call on a fresh connection.
    fn call(fake: &FakeTelegram, method: &str, body: Value) -> (u16, Value) {
        Client::connect(fake).call(TOKEN, method, body)
    }

    fn fake_with_chat() -> FakeTelegram {
        let fake = FakeTelegram::start(TOKEN);
        fake.add_chat(CHAT, "Team");
        fake
    }

    fn send(fake: &FakeTelegram, text: &str, parse_mode: Option<&str>) -> (u16, Value) {
        let mut body = json!({"chat_id": CHAT, "text": text});
        if let Some(mode) = parse_mode {
            body["parse_mode"] = json!(mode);
        }
        call(fake, "sendMessage", body)
    }

    fn assert_bad_request(answer: (u16, Value), description: &str) {
        let (status, body) = answer;
        assert_eq!(status, 400, "{body}");
        assert_eq!(
            body,
            json!({"ok": false, "error_code": 400, "description": description}),
            "{body}"
        );
    }

    #[test]
    fn get_me_describes_the_bot() {
        let fake = FakeTelegram::start(TOKEN);
        assert!(fake.base_url().starts_with("http://127.0.0.1:"));
        assert!(!fake.base_url().ends_with('/'));
        let (status, body) = call(&fake, "getMe", json!({}));
        assert_eq!(status, 200);
        assert_eq!(body["ok"], json!(true));
        let me = &body["result"];
        assert_eq!(me["id"], json!(123_456));
        assert_eq!(me["is_bot"], json!(true));
        assert_eq!(me["first_name"], json!("Flock"));
        assert_eq!(me["username"], json!("flock_test_bot"));
        assert_eq!(fake.bot_id(), 123_456);
        // GET without a body, method name in any case, works too.
        let mut client = Client::connect(&fake);
        client.send("GET", &format!("/bot{TOKEN}/getme"), None, "");
        let (status, _, body) = client.response().expect("an answer");
        assert_eq!((status, &body["result"]["username"]), (200, &json!("flock_test_bot")));
        assert_eq!(fake.calls(), ["getMe", "getme"]);
    }

    #[test]
    fn wrong_token_is_401_and_unknown_method_404() {
        let fake = FakeTelegram::start(TOKEN);
        let (status, body) = Client::connect(&fake).call("123456:wrong", "getMe", json!({}));
        assert_eq!(status, 401);
        assert_eq!(body, json!({"ok": false, "error_code": 401, "description": "Unauthorized"}));
        let (status, body) = call(&fake, "getMeNow", json!({}));
        assert_eq!(status, 404);
        assert_eq!(body, json!({"ok": false, "error_code": 404, "description": "Not Found"}));
        let mut client = Client::connect(&fake);
        client.send("POST", "/getMe", Some("application/json"), "{}");
        assert_eq!(client.response().expect("an answer").0, 404);
        assert_eq!(
            fake.rejected(),
            [
                ("getMe".to_string(), 401, "Unauthorized".to_string()),
                ("getMeNow".to_string(), 404, "Not Found".to_string()),
                ("/getMe".to_string(), 404, "Not Found".to_string()),
            ]
        );
    }

    #[test]
    fn a_post_arrives_through_get_updates_in_the_real_shape() {
        let fake = fake_with_chat();
        let before = unix_now();
        let first = fake.post(CHAT, 42, "Alice", Some("alice"), "hello bot");
        let second = fake.post(CHAT, 43, "Bob", None, "/status@flock_test_bot now");
        assert_eq!(second, first + 1, "message ids increase per chat");
        let (status, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        assert_eq!(status, 200);
        assert_eq!(body["ok"], json!(true));
        let updates = body["result"].as_array().expect("a list of updates");
        assert_eq!(updates.len(), 2);
        let update = &updates[0];
        assert_eq!(update["update_id"], json!(FIRST_UPDATE_ID));
        let message = &update["message"];
        let date = message["date"].as_i64().expect("a unix date");
        assert!(date >= before && date <= unix_now());
        assert_eq!(
            update,
            &json!({
                "update_id": FIRST_UPDATE_ID,
                "message": {
                    "message_id": first,
                    "from": {"id": 42, "is_bot": false, "first_name": "Alice", "username": "alice"},
                    "chat": {"id": CHAT, "type": "supergroup", "title": "Team"},
                    "date": date,
                    "text": "hello bot",
                },
            })
        );
        let message = &updates[1]["message"];
        assert_eq!(updates[1]["update_id"], json!(FIRST_UPDATE_ID + 1));
        assert_eq!(message["from"], json!({"id": 43, "is_bot": false, "first_name": "Bob"}));
        assert_eq!(
            message["entities"],
            json!([{"offset": 0, "length": 22, "type": "bot_command"}])
        );
        assert_eq!(fake.offsets(), [None]);
        assert_eq!(fake.pending_updates(), 2, "nothing is confirmed without an offset");
    }

    #[test]
    fn an_offset_confirms_updates() {
        let fake = fake_with_chat();
        fake.post(CHAT, 42, "Alice", Some("alice"), "one");
        fake.post(CHAT, 42, "Alice", Some("alice"), "two");
        let (_, body) = call(&fake, "getUpdates", json!({"timeout": 0, "limit": 1}));
        let updates = body["result"].as_array().expect("updates").clone();
        assert_eq!(updates.len(), 1, "limit is honoured");
        let first = updates[0]["update_id"].as_i64().expect("an update id");
        let (_, body) = call(&fake, "getUpdates", json!({"offset": first + 1, "timeout": 0}));
        let updates = body["result"].as_array().expect("updates").clone();
        assert_eq!(updates.len(), 1);
        assert_eq!(updates[0]["message"]["text"], json!("two"));
        let last = updates[0]["update_id"].as_i64().expect("an update id");
        assert_eq!(fake.pending_updates(), 1);
        let (status, body) = call(&fake, "getUpdates", json!({"offset": last + 1, "timeout": 0}));
        assert_eq!((status, body), (200, json!({"ok": true, "result": []})));
        assert_eq!(fake.pending_updates(), 0);
        assert_eq!(fake.offsets(), [None, Some(first + 1), Some(last + 1)]);
        // Form-encoded and query-string parameters are understood as well.
        fake.post(CHAT, 42, "Alice", Some("alice"), "three");
        let mut client = Client::connect(&fake);
        let target = format!("/bot{TOKEN}/getUpdates?timeout=0");
        let form = format!("offset={}", last + 1);
        client.send("POST", &target, Some("application/x-www-form-urlencoded"), &form);
        let (_, _, body) = client.response().expect("an answer");
        assert_eq!(body["result"][0]["message"]["text"], json!("three"));
        assert_eq!(fake.offsets().last(), Some(&Some(last + 1)));
    }

    #[test]
    fn a_long_poll_returns_as_soon_as_a_post_arrives() {
        let fake = Arc::new(fake_with_chat());
        let poster = Arc::clone(&fake);
        let started = Instant::now();
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            poster.post(CHAT, 42, "Alice", Some("alice"), "wake up")
        });
        let (status, body) = call(&fake, "getUpdates", json!({"timeout": 20}));
        let elapsed = started.elapsed();
        let message_id = thread.join().expect("the poster");
        assert_eq!(status, 200);
        assert_eq!(body["result"][0]["message"]["message_id"], json!(message_id));
        assert!(elapsed >= Duration::from_millis(250), "held until the post: {elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "answered early: {elapsed:?}");
        // With nothing to deliver the poll lasts its timeout, then answers an empty list.
        let started = Instant::now();
        let (_, body) =
            call(&fake, "getUpdates", json!({"offset": FIRST_UPDATE_ID + 1, "timeout": 1}));
        assert_eq!(body["result"], json!([]));
        assert!(started.elapsed() >= Duration::from_millis(900), "{:?}", started.elapsed());
    }

    #[test]
    fn a_newer_poll_terminates_the_held_one_with_409() {
        let fake = Arc::new(fake_with_chat());
        let held = {
            let fake = Arc::clone(&fake);
            std::thread::spawn(move || call(&fake, "getUpdates", json!({"timeout": 20})))
        };
        crate::wait_for(|| fake.offsets().len() == 1, SECS, "the first poll arrived");
        let (status, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        assert_eq!((status, body), (200, json!({"ok": true, "result": []})));
        let (status, body) = held.join().expect("the held poll");
        assert_eq!(status, 409);
        assert_eq!(body, json!({"ok": false, "error_code": 409, "description": CONFLICT}));
        assert_eq!(fake.rejected(), [("getUpdates".to_string(), 409, CONFLICT.to_string())]);
    }

    #[test]
    fn send_message_is_recorded_and_not_delivered_to_the_bot() {
        let fake = fake_with_chat();
        let (status, body) = call(
            &fake,
            "sendMessage",
            json!({"chat_id": CHAT, "text": "  hi *all*  ",
                   "link_preview_options": {"is_disabled": true}}),
        );
        assert_eq!(status, 200, "{body}");
        let message = &body["result"];
        assert_eq!(message["message_id"], json!(1));
        assert_eq!(message["from"]["id"], json!(123_456));
        assert_eq!(message["from"]["is_bot"], json!(true));
        assert_eq!(message["chat"], json!({"id": CHAT, "type": "supergroup", "title": "Team"}));
        assert_eq!(message["text"], json!("hi *all*"), "no parse_mode: text kept, trimmed");
        // A chat id as a string, in a form body, shares the chat's message numbering.
        let mut client = Client::connect(&fake);
        let form = format!("chat_id={CHAT}&text=second+one%21");
        let target = format!("/bot{TOKEN}/sendMessage");
        client.send("POST", &target, Some("application/x-www-form-urlencoded"), &form);
        let (status, _, body) = client.response().expect("an answer");
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["text"], json!("second one!"));
        let sent = fake.sent_to(CHAT);
        assert_eq!(sent.len(), 2);
        assert_eq!((sent[0].message_id, sent[1].message_id), (1, 2));
        assert_eq!(sent[0].text, "  hi *all*  ");
        assert_eq!(sent[0].plain, "hi *all*");
        assert_eq!(sent[0].parse_mode, None);
        assert_eq!(sent[0].params["link_preview_options"], json!({"is_disabled": true}));
        assert_eq!(fake.sent().len(), 2);
        let (_, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        assert_eq!(body["result"], json!([]), "a bot does not receive its own messages");
        assert_bad_request(
            call(&fake, "sendMessage", json!({"chat_id": 99, "text": "x"})),
            "Bad Request: chat not found",
        );
        assert_bad_request(
            call(&fake, "sendMessage", json!({"chat_id": CHAT, "text": ""})),
            "Bad Request: message text is empty",
        );
        assert_bad_request(
            call(&fake, "sendMessage", json!({"text": "x"})),
            "Bad Request: chat_id is empty",
        );
        // Replies name a message of the chat.
        let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "question?");
        let (status, body) = call(
            &fake,
            "sendMessage",
            json!({"chat_id": CHAT, "text": "answer", "reply_parameters": {"message_id": asked}}),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["reply_to_message"]["text"], json!("question?"));
        assert_bad_request(
            call(
                &fake,
                "sendMessage",
                json!({"chat_id": CHAT, "text": "x", "reply_parameters": {"message_id": 999}}),
            ),
            "Bad Request: message to be replied not found",
        );
        assert_eq!(fake.sent().len(), 3);
    }

    #[test]
    fn send_message_refuses_4097_characters() {
        let fake = fake_with_chat();
        let long = "é".repeat(MAX_MESSAGE_CHARS + 1);
        assert_bad_request(send(&fake, &long, None), "Bad Request: message is too long");
        let (status, _) = send(&fake, &long[2..], None);
        assert_eq!(status, 200, "4096 characters fit");
        assert_eq!(
            fake.rejected(),
            [("sendMessage".to_string(), 400, "Bad Request: message is too long".to_string())]
        );
        assert_eq!(fake.sent().len(), 1);
    }

    #[test]
    fn markdown_v2_refuses_an_unescaped_reserved_character() {
        let fake = fake_with_chat();
        assert_bad_request(
            send(&fake, "Done. All good", Some("MarkdownV2")),
            "Bad Request: can't parse entities: Character '.' is reserved and must be escaped \
             with the preceding '\\'",
        );
        assert_bad_request(
            send(&fake, "a \\- b - c", Some("MarkdownV2")),
            "Bad Request: can't parse entities: Character '-' is reserved and must be escaped \
             with the preceding '\\'",
        );
        // The same text without a parse_mode is plain text.
        assert_eq!(send(&fake, "Done. All good", None).0, 200);
        // Telegram parses the markup before it looks for the chat.
        let (status, body) = call(
            &fake,
            "sendMessage",
            json!({"chat_id": 999, "text": "v1.0", "parse_mode": "MarkdownV2"}),
        );
        assert_eq!(status, 400);
        assert!(
            body["description"].as_str().is_some_and(|d| d.contains("Character '.'")),
            "{body}"
        );
    }

    #[test]
    fn markdown_v2_accepts_escapes_and_entities() {
        let fake = fake_with_chat();
        let (status, body) = send(&fake, "Done\\. All \\(good\\)\\!", Some("MarkdownV2"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["text"], json!("Done. All (good)!"));
        let text = "*bold* _it_ `co.de` [link](https://e.com/a\\)b) ```rust\nfn x() {}```";
        let (status, body) = send(&fake, text, Some("MarkdownV2"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["text"], json!("bold it co.de link fn x() {}"));
        assert_eq!(
            body["result"]["entities"],
            json!([
                {"offset": 0, "length": 4, "type": "bold"},
                {"offset": 5, "length": 2, "type": "italic"},
                {"offset": 8, "length": 5, "type": "code"},
                {"offset": 14, "length": 4, "type": "text_link", "url": "https://e.com/a)b"},
                {"offset": 19, "length": 9, "type": "pre", "language": "rust"},
            ])
        );
        let sent = fake.sent();
        assert_eq!(sent[1].text, text);
        assert_eq!(sent[1].parse_mode.as_deref(), Some("MarkdownV2"));
        assert_eq!(sent[1].plain, "bold it co.de link fn x() {}");
        let (status, body) = send(&fake, ">quoted\\!\n*bold*", Some("MarkdownV2"));
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["text"], json!("quoted!\nbold"));
    }

    #[test]
    fn markdown_v2_refuses_an_unclosed_entity() {
        let fake = fake_with_chat();
        assert_bad_request(
            send(&fake, "ok *bold", Some("MarkdownV2")),
            "Bad Request: can't parse entities: Can't find end of Bold entity at byte offset 3",
        );
        assert_bad_request(
            send(&fake, "`code", Some("MarkdownV2")),
            "Bad Request: can't parse entities: Can't find end of Code entity at byte offset 0",
        );
        // The legacy Markdown parser words it the old way.
        assert_bad_request(
            send(&fake, "ok _it", Some("Markdown")),
            "Bad Request: can't parse entities: Can't find end of the entity starting at byte \
             offset 3",
        );
        assert_bad_request(
            send(&fake, "<b>bold", Some("HTML")),
            "Bad Request: can't parse entities: Can't find end tag corresponding to start tag \
             \"b\"",
        );
        assert_bad_request(
            send(&fake, "x", Some("Markdown3")),
            "Bad Request: unsupported parse_mode",
        );
        assert_bad_request(
            send(&fake, "*  *", Some("MarkdownV2")),
            "Bad Request: message must be non-empty",
        );
        assert!(fake.sent().is_empty());
    }

    /// Cases from tdlib's own test of its MarkdownV2 parser (`test/message_entities.cpp`), which
    /// the Bot API server runs.
    #[test]
    fn markdown_v2_parses_like_telegram() {
        let reserved = |c: char| {
            format!("Character '{c}' is reserved and must be escaped with the preceding '\\'")
        };
        let unclosed =
            |kind: &str, at: usize| format!("Can't find end of {kind} entity at byte offset {at}");
        let errors: Vec<(&str, String)> = vec![
            ("🏟 🏟_abacaba", unclosed("Italic", 9)),
            ("🏟 🏟_abac * asd ", unclosed("Bold", 15)),
            ("🏟 🏟_abac * asd _", unclosed("Italic", 21)),
            ("🏟 🏟`", unclosed("Code", 9)),
            ("🏟 🏟```", unclosed("Pre", 9)),
            ("🏟 🏟```a", unclosed("Pre", 9)),
            ("🏟 🏟```a ", unclosed("PreCode", 9)),
            ("🏟 🏟__🏟 🏟_", unclosed("Italic", 20)),
            ("🏟 🏟_🏟 🏟__", unclosed("Underline", 19)),
            ("🏟 🏟```🏟 🏟`", unclosed("Code", 21)),
            ("🏟 🏟```🏟 🏟_", unclosed("PreCode", 9)),
            ("🏟 🏟```🏟 🏟\\`", unclosed("PreCode", 9)),
            ("[telegram\\.org](asd\\)", "Can't find end of a URL at byte offset 16".into()),
            ("[telegram\\.org](", "Can't find end of a URL at byte offset 16".into()),
            ("🏟 🏟__🏟 _🏟___", unclosed("Italic", 23)),
            ("🏟 🏟__", unclosed("Underline", 9)),
            ("🏟 🏟||test\\|", unclosed("Spoiler", 9)),
            ("🏟 🏟!", reserved('!')),
            ("🏟 🏟>", reserved('>')),
            ("a.b", reserved('.')),
            ("(x)", reserved('(')),
            ("a|b", reserved('|')),
            ("🏟 🏟![", unclosed("CustomEmoji", 9)),
            ("🏟 🏟![👍]", "Custom emoji entity must contain a tg://emoji URL".into()),
            (
                "🏟 🏟![👍](tg://emoji?id=1234",
                "Can't find end of a custom emoji URL at byte offset 17".into(),
            ),
            ("🏟 🏟![👍](t://emoji?id=1234)", "Custom emoji URL must have scheme tg".into()),
            ("🏟 🏟![👍](tg:emojis?id=1234)", "Custom emoji URL must have host \"emoji\"".into()),
            ("🏟 🏟![👍](tg://emoji#test)", "Custom emoji URL must have an emoji identifier".into()),
            (
                "🏟 🏟![👍](tg://emoji?test=1231&id=025)",
                "Invalid custom emoji identifier specified".into(),
            ),
            (">*b\n>ld \n>bo\nld*\nasd\ndef", unclosed("Bold", 1)),
            (">\n*a*>2", reserved('>')),
            (">asd\n>q||e||w||\n||asdad", unclosed("Spoiler", 16)),
            (">asd\n>q||ew\n||asdad", unclosed("Spoiler", 7)),
            (">asd\n>q||e||w__\n||asdad", unclosed("Underline", 13)),
            (">asd\n>q||e||w||a\n||asdad", unclosed("Spoiler", 13)),
        ];
        for (markdown, error) in errors {
            match parse_markdown_v2(markdown) {
                Err(got) => assert_eq!(got, error, "{markdown:?}"),
                Ok(parsed) => panic!("{markdown:?} parsed as {parsed:?}, expected {error:?}"),
            }
        }
        type Cases<'a> = Vec<(&'a str, &'a str, Vec<(&'a str, usize, usize)>)>;
        let (bq, ebq) = ("blockquote", "expandable_blockquote");
        let parses: Cases = vec![
            ("", "", vec![]),
            ("\\\\", "\\", vec![]),
            ("\\\\\\", "\\\\", vec![]),
            ("\\\\\\\\\\_\\*\\`", "\\\\_*`", vec![]),
            ("🏟 🏟``", "🏟 🏟", vec![]),
            ("🏟 🏟_abac \\* asd _", "🏟 🏟abac * asd ", vec![("italic", 5, 11)]),
            ("🏟 \\.🏟_🏟\\. 🏟_", "🏟 .🏟🏟. 🏟", vec![("italic", 6, 6)]),
            ("\\\\\\a\\b\\c\\d\\e\\f\\1\\2\\3\\4\\➡️\\", "\\abcdef1234\\➡️\\", vec![]),
            ("➡️ ➡️_➡️ ➡️_*➡️ ➡️*", "➡️ ➡️➡️ ➡️➡️ ➡️", vec![("italic", 5, 5), ("bold", 10, 5)]),
            ("🏟 🏟_🏟 *🏟*_", "🏟 🏟🏟 🏟", vec![("italic", 5, 5), ("bold", 8, 2)]),
            ("🏟 🏟_🏟 __🏟___", "🏟 🏟🏟 🏟", vec![("italic", 5, 5), ("underline", 8, 2)]),
            ("🏟 🏟__🏟 _🏟_ __", "🏟 🏟🏟 🏟 ", vec![("underline", 5, 6), ("italic", 8, 2)]),
            ("🏟 🏟__🏟 _🏟_\\___", "🏟 🏟🏟 🏟_", vec![("underline", 5, 6), ("italic", 8, 2)]),
            ("🏟 🏟`🏟 🏟```", "🏟 🏟🏟 🏟", vec![("code", 5, 5)]),
            ("🏟 🏟```🏟 🏟```", "🏟 🏟 🏟", vec![("pre", 5, 3)]),
            ("🏟 🏟```🏟\n🏟```", "🏟 🏟🏟", vec![("pre", 5, 2)]),
            ("🏟 🏟```🏟\r\n🏟```", "🏟 🏟🏟", vec![("pre", 5, 2)]),
            ("🏟 🏟```🏟\n\n🏟```", "🏟 🏟\n🏟", vec![("pre", 5, 3)]),
            ("🏟 🏟```🏟 \\\\\\`🏟```", "🏟 🏟 \\`🏟", vec![("pre", 5, 5)]),
            ("🏟 🏟**", "🏟 🏟", vec![]),
            ("||test||", "test", vec![("spoiler", 0, 4)]),
            ("🏟 🏟``````", "🏟 🏟", vec![]),
            ("🏟 🏟____", "🏟 🏟", vec![]),
            (
                "`_* *_`__*` `*__",
                "_* *_ ",
                vec![("code", 0, 5), ("code", 5, 1), ("bold", 5, 1), ("underline", 5, 1)],
            ),
            ("_* * ` `_", "   ", vec![("italic", 0, 3), ("bold", 0, 1), ("code", 2, 1)]),
            ("[](telegram.org)", "", vec![]),
            ("[ ](telegram.org)", " ", vec![("text_link", 0, 1)]),
            ("[ ](as)", " ", vec![]),
            ("[telegram\\.org]a", "telegram.orga", vec![("text_link", 0, 12)]),
            ("[telegram\\.org](https://telegram.dog?)", "telegram.org", vec![("text_link", 0, 12)]),
            ("[telegram\\.org]()", "telegram.org", vec![]),
            ("[telegram\\.org](asdasd)", "telegram.org", vec![]),
            ("[telegram\\.org](tg:user?id=123456)", "telegram.org", vec![("text_mention", 0, 12)]),
            (
                "🏟 🏟![👍](TG://EMoJI/?test=1231&id=25#id=32)a",
                "🏟 🏟👍a",
                vec![("custom_emoji", 5, 2)],
            ),
            ("> \n> \n>", " \n \n", vec![(bq, 0, 4)]),
            ("> \\>\n \\> \n>", " >\n > \n", vec![(bq, 0, 3)]),
            ("abc\n> \n> \n>\ndef", "abc\n \n \n\ndef", vec![(bq, 4, 5)]),
            (">", "", vec![]),
            ("\r>a", "\ra", vec![(bq, 1, 1)]),
            ("\r\r>\r\ra\r\n\r", "\r\r\r\ra\r\n\r", vec![(bq, 2, 5)]),
            (
                ">*bold _italic bold ~italic bold strikethrough ||italic bold strikethrough \
                 spoiler||~ __underline italic bold___ bold*",
                "bold italic bold italic bold strikethrough italic bold strikethrough spoiler \
                 underline italic bold bold",
                vec![
                    (bq, 0, 103),
                    ("bold", 0, 103),
                    ("italic", 5, 93),
                    ("strikethrough", 17, 59),
                    ("spoiler", 43, 33),
                    ("underline", 77, 21),
                ],
            ),
            (
                ">*b\n>ld \n>bo\n>ld*\nasd\ndef",
                "b\nld \nbo\nld\nasd\ndef",
                vec![(bq, 0, 12), ("bold", 0, 11)],
            ),
            (
                "*a\n>b\n>ld \n>bo\n>ld\nasd*\ndef",
                "a\nb\nld \nbo\nld\nasd\ndef",
                vec![("bold", 0, 17), (bq, 2, 12)],
            ),
            (
                ">`b\n>ld \n>bo\nld`\n>asd\ndef",
                "b\n>ld \n>bo\nld\nasd\ndef",
                vec![(bq, 0, 18), ("code", 0, 13)],
            ),
            (
                "`>b\n>ld \n>bo\nld`\n>asd\ndef",
                ">b\n>ld \n>bo\nld\nasd\ndef",
                vec![("code", 0, 14), (bq, 15, 4)],
            ),
            (">\n1", "\n1", vec![(bq, 0, 1)]),
            (">\n\r>2", "\n\r2", vec![(bq, 0, 1), (bq, 2, 1)]),
            (">\n**>2", "\n2", vec![(bq, 0, 1), (bq, 1, 1)]),
            (">**\n>2", "\n2", vec![(bq, 0, 2)]),
            (">*abcd*\n", "abcd\n", vec![(bq, 0, 5), ("bold", 0, 4)]),
            (
                "abc\n>def\n>def\n\r>ghi2\njkl",
                "abc\ndef\ndef\n\rghi2\njkl",
                vec![(bq, 4, 8), (bq, 13, 5)],
            ),
            (">asd\n>q||e||w||\nasdad", "asd\nqew\nasdad", vec![(ebq, 0, 8), ("spoiler", 5, 1)]),
            (">asd\n>q||ew||\nasdad", "asd\nqew\nasdad", vec![(bq, 0, 8), ("spoiler", 5, 2)]),
            (">asd\r\n>q||e||w||\r\n", "asd\r\nqew\r\n", vec![(ebq, 0, 10), ("spoiler", 6, 1)]),
            (">asd\r\n>q||e||w||", "asd\r\nqew", vec![(ebq, 0, 8), ("spoiler", 6, 1)]),
            (">||", "", vec![]),
        ];
        for (markdown, text, mut want) in parses {
            let parsed =
                parse_markdown_v2(markdown).unwrap_or_else(|e| panic!("{markdown:?} refused: {e}"));
            assert_eq!(parsed.text, text, "{markdown:?}");
            let mut got: Vec<(&str, usize, usize)> =
                parsed.entities.iter().map(|e| (e.kind, e.offset, e.length)).collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "{markdown:?}");
        }
        let url = |markdown: &str| {
            let parsed = parse_markdown_v2(markdown).expect("parses");
            parsed.entities[0].to_json()
        };
        assert_eq!(url("[ ](telegram.org)")["url"], json!("http://telegram.org/"));
        assert_eq!(
            url("[a](https://telegram.dog?\\\\\\()")["url"],
            json!("https://telegram.dog/?\\(")
        );
        assert_eq!(url("```rust\nx```")["language"], json!("rust"));
        assert_eq!(url("![👍](tg://emoji?id=25)")["custom_emoji_id"], json!("25"));
        assert_eq!(url("[x](tg://user?id=7)")["user"]["id"], json!(7));
    }

    #[test]
    fn scripted_429_carries_retry_after_then_sends_succeed() {
        let fake = fake_with_chat();
        fake.fail_sends_with_429(2, 3);
        fake.fail_next_sends(1, 403, "Forbidden: bot was kicked from the supergroup chat");
        let too_many = json!({
            "ok": false,
            "error_code": 429,
            "description": "Too Many Requests: retry after 3",
            "parameters": {"retry_after": 3},
        });
        assert_eq!(send(&fake, "hi", None), (429, too_many.clone()));
        assert_eq!(send(&fake, "hi", None), (429, too_many));
        let (status, body) = send(&fake, "hi", None);
        assert_eq!(status, 403);
        assert_eq!(
            body["description"],
            json!("Forbidden: bot was kicked from the supergroup chat")
        );
        let (status, body) = send(&fake, "hi", None);
        assert_eq!(status, 200, "{body}");
        assert_eq!(fake.sent().len(), 1);
        let statuses: Vec<u16> = fake.rejected().iter().map(|r| r.1).collect();
        assert_eq!(statuses, [429, 429, 403]);
    }

    #[test]
    fn keep_alive_serves_several_requests_on_one_connection() {
        let fake = fake_with_chat();
        let mut client = Client::connect(&fake);
        let (status, _) = client.call(TOKEN, "getMe", json!({}));
        assert_eq!(status, 200);
        let (status, body) =
            client.call(TOKEN, "sendMessage", json!({"chat_id": CHAT, "text": "a"}));
        assert_eq!(status, 200, "{body}");
        // Two pipelined requests in one write are answered in order.
        let target = format!("/bot{TOKEN}/getMe");
        let one = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        client.stream.write_all(format!("{one}{one}").as_bytes()).expect("pipeline");
        let (_, headers, _) = client.response().expect("first answer");
        assert!(headers.contains(&("connection".into(), "keep-alive".into())), "{headers:?}");
        assert_eq!(client.response().expect("second answer").0, 200);
        assert_eq!(fake.calls().len(), 4);
    }

    #[test]
    fn dropped_connections_get_no_answer() {
        let fake = fake_with_chat();
        fake.drop_next_connections(1);
        let mut client = Client::connect(&fake);
        client.send(
            "POST",
            &format!("/bot{TOKEN}/sendMessage"),
            Some("application/json"),
            &json!({"chat_id": CHAT, "text": "lost"}).to_string(),
        );
        assert!(client.response().is_none(), "closed without an answer");
        assert_eq!(fake.dropped(), 1);
        assert!(fake.sent().is_empty() && fake.calls().is_empty());
        assert_eq!(send(&fake, "kept", None).0, 200);
    }

    #[test]
    fn edits_arrive_as_edited_message_updates() {
        let fake = fake_with_chat();
        let id = fake.post(CHAT, 42, "Alice", Some("alice"), "helo");
        fake.edit(CHAT, id, "hello");
        let (_, body) =
            call(&fake, "getUpdates", json!({"allowed_updates": ["message", "edited_message"]}));
        let updates = body["result"].as_array().expect("updates");
        assert_eq!(updates.len(), 2);
        let edited = &updates[1]["edited_message"];
        assert_eq!(edited["message_id"], json!(id));
        assert_eq!(edited["text"], json!("hello"));
        assert!(edited["edit_date"].as_i64() >= edited["date"].as_i64());
        // With edits no longer allowed, later edits are never delivered.
        let next = updates[1]["update_id"].as_i64().expect("an update id") + 1;
        call(&fake, "getUpdates", json!({"offset": next, "allowed_updates": ["message"]}));
        fake.edit(CHAT, id, "hello!");
        assert_eq!(fake.pending_updates(), 0);
    }

    #[test]
    fn edit_message_text_changes_the_bots_message() {
        let fake = fake_with_chat();
        let (status, sent) = send(&fake, "*hi* there", Some("MarkdownV2"));
        assert_eq!(status, 200, "{sent}");
        let id = sent["result"]["message_id"].as_i64().expect("a message id");
        let date = sent["result"]["date"].as_i64().expect("a date");
        let edit = |text: &str| {
            call(
                &fake,
                "editMessageText",
                json!({
                    "chat_id": CHAT,
                    "message_id": id,
                    "text": text,
                    "parse_mode": "MarkdownV2",
                    "link_preview_options": {"is_disabled": true},
                }),
            )
        };
        let (status, body) = edit("*hello* there\\!");
        assert_eq!(status, 200, "{body}");
        let edited = &body["result"];
        assert_eq!(edited["message_id"], json!(id));
        assert_eq!(edited["from"]["id"], json!(fake.bot_id()));
        assert_eq!(edited["chat"], json!({"id": CHAT, "type": "supergroup", "title": "Team"}));
        assert_eq!(edited["date"], json!(date));
        assert!(edited["edit_date"].as_i64().is_some_and(|d| d >= date), "{edited}");
        assert_eq!(edited["text"], json!("hello there!"));
        assert_eq!(edited["entities"], json!([{"offset": 0, "length": 5, "type": "bold"}]));
        assert_eq!(fake.message(CHAT, id).as_ref(), Some(edited));

        // The same text and entities again: "not modified"; other entities are a change.
        assert_bad_request(
            edit("*hello* there\\!"),
            "Bad Request: message is not modified: specified new message content and reply \
             markup are exactly the same as a current content and reply markup of the message",
        );
        let (status, body) = edit("hello there\\!");
        assert_eq!(status, 200, "{body}");
        assert!(body["result"].get("entities").is_none(), "{body}");
        // The text is parsed and checked as for sendMessage.
        assert_bad_request(
            edit("hello there!"),
            "Bad Request: can't parse entities: Character '!' is reserved and must be escaped \
             with the preceding '\\'",
        );
        assert_bad_request(edit("*  *"), "Bad Request: message must be non-empty");
        assert_bad_request(
            edit(&"x".repeat(MAX_MESSAGE_CHARS + 1)),
            "Bad Request: message is too long",
        );
        assert_bad_request(edit(""), "Bad Request: message text is empty");

        // Only the bot's own messages, and only existing ones.
        let person = fake.post(CHAT, 42, "Alice", Some("alice"), "mine");
        let body =
            |message_id: i64| json!({"chat_id": CHAT, "message_id": message_id, "text": "x"});
        assert_bad_request(
            call(&fake, "editMessageText", body(person)),
            "Bad Request: message can't be edited",
        );
        assert_bad_request(
            call(&fake, "editMessageText", body(999)),
            "Bad Request: message to edit not found",
        );
        assert_bad_request(
            call(&fake, "editMessageText", json!({"chat_id": -42, "message_id": id, "text": "x"})),
            "Bad Request: chat not found",
        );
        assert_bad_request(
            call(&fake, "editMessageText", json!({"text": "x"})),
            "Bad Request: message identifier is not specified",
        );
        assert_eq!(fake.message(CHAT, person).map(|m| m["text"].clone()), Some(json!("mine")));

        // A reply shows the message as it is now.
        let reply = json!({"chat_id": CHAT, "text": "re", "reply_parameters": {"message_id": id}});
        let (status, body) = call(&fake, "sendMessage", reply);
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["reply_to_message"]["text"], json!("hello there!"));

        assert_eq!(
            fake.edits(CHAT),
            [(id, Some("hello there!".to_string())), (id, Some("hello there!".to_string()))]
        );
        assert_eq!(fake.wait_edits(CHAT, 2, SECS).len(), 2);
        // sendMessage records stay as sent.
        let sent: Vec<(i64, String)> =
            fake.sent_to(CHAT).into_iter().map(|m| (m.message_id, m.text)).collect();
        assert_eq!(sent, [(id, "*hi* there".to_string()), (id + 2, "re".to_string())]);
        assert_eq!(fake.pending_updates(), 1, "the bot's edits are no updates; Alice's post is");
    }

    #[test]
    fn delete_message_removes_the_bots_message() {
        let fake = fake_with_chat();
        let (_, sent) = send(&fake, "oops", None);
        let id = sent["result"]["message_id"].as_i64().expect("a message id");
        let delete = |body: Value| call(&fake, "deleteMessage", body);
        // Form-encoded, as any other call.
        let mut client = Client::connect(&fake);
        let form = format!("chat_id={CHAT}&message_id={id}");
        let target = format!("/bot{TOKEN}/deleteMessage");
        client.send("POST", &target, Some("application/x-www-form-urlencoded"), &form);
        let (status, _, body) = client.response().expect("an answer");
        assert_eq!((status, body), (200, json!({"ok": true, "result": true})));
        assert!(fake.message(CHAT, id).is_none());
        assert_bad_request(
            delete(json!({"chat_id": CHAT, "message_id": id})),
            "Bad Request: message to delete not found",
        );
        // Gone for edits and replies too.
        assert_bad_request(
            call(&fake, "editMessageText", json!({"chat_id": CHAT, "message_id": id, "text": "x"})),
            "Bad Request: message to edit not found",
        );
        let reply = json!({"chat_id": CHAT, "text": "re", "reply_parameters": {"message_id": id}});
        assert_bad_request(
            call(&fake, "sendMessage", reply),
            "Bad Request: message to be replied not found",
        );
        // A person's message: the bot is no administrator.
        let person = fake.post(CHAT, 42, "Alice", Some("alice"), "mine");
        assert_bad_request(
            delete(json!({"chat_id": CHAT, "message_id": person})),
            "Bad Request: message can't be deleted",
        );
        assert_bad_request(
            delete(json!({"message_id": person})),
            "Bad Request: chat identifier is not specified",
        );
        assert_bad_request(
            delete(json!({"chat_id": CHAT})),
            "Bad Request: message identifier is not specified",
        );
        assert_bad_request(
            delete(json!({"chat_id": -42, "message_id": person})),
            "Bad Request: chat not found",
        );
        assert_eq!(fake.edits(CHAT), [(id, None)]);
        assert!(fake.edits(-42).is_empty());
        assert_eq!(fake.sent_to(CHAT).len(), 1, "sendMessage records stay");
        assert_eq!(
            fake.calls().iter().filter(|c| c.as_str() == "deleteMessage").count(),
            6,
            "{:?}",
            fake.calls()
        );
    }

    #[test]
    fn edited_messages_follow_allowed_updates() {
        let fake = fake_with_chat();
        call(&fake, "getUpdates", json!({"timeout": 0, "allowed_updates": ["message"]}));
        let id = fake.post(CHAT, 42, "Alice", Some("alice"), "helo");
        fake.edit(CHAT, id, "hello");
        let (_, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        let kinds: Vec<bool> = body["result"]
            .as_array()
            .expect("updates")
            .iter()
            .map(|u| u.get("edited_message").is_some())
            .collect();
        assert_eq!(kinds, [false], "only the message: {body}");
        // Allowed again (as a form value holding JSON), later edits are delivered.
        let mut client = Client::connect(&fake);
        let form = "timeout=0&allowed_updates=%5B%22message%22%2C%22edited_message%22%5D";
        client.send(
            "POST",
            &format!("/bot{TOKEN}/getUpdates"),
            Some("application/x-www-form-urlencoded"),
            form,
        );
        client.response().expect("an answer");
        fake.edit(CHAT, id, "hello!");
        let (_, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        let updates = body["result"].as_array().expect("updates");
        let last = updates.last().expect("an update");
        assert_eq!(last["edited_message"]["text"], json!("hello!"), "{body}");
        assert_eq!(last["edited_message"]["message_id"], json!(id));
    }

    #[test]
    fn wait_sent_waits_for_messages_from_another_thread() {
        let fake = Arc::new(fake_with_chat());
        let sender = Arc::clone(&fake);
        let thread = std::thread::spawn(move || {
            for text in ["one", "two"] {
                std::thread::sleep(Duration::from_millis(100));
                assert_eq!(send(&sender, text, None).0, 200);
            }
        });
        let sent = fake.wait_sent(CHAT, 2, SECS);
        assert_eq!(sent.iter().map(|m| m.plain.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        thread.join().expect("the sender");
    }

    #[test]
    fn private_chats_carry_the_person_and_share_the_bots_message_box() {
        let fake = fake_with_chat();
        let group = fake.post(CHAT, 42, "Alice", Some("alice"), "in the group");
        let first = fake.post_private(42, "Alice", Some("alice"), "hello bot");
        let (status, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        assert_eq!(status, 200, "{body}");
        let message = &body["result"][1]["message"];
        let date = message["date"].as_i64().expect("a date");
        assert_eq!(
            message,
            &json!({
                "message_id": first,
                "from": {"id": 42, "is_bot": false, "first_name": "Alice", "username": "alice"},
                "chat": {"id": 42, "type": "private", "first_name": "Alice", "username": "alice"},
                "date": date,
                "text": "hello bot",
            })
        );
        assert_eq!((group, first), (1, 1), "a supergroup numbers its messages on its own");
        // The bot's answer, and the next person's private chat, take the next ids of the bot's
        // one message box; the supergroup keeps its own numbering.
        let (status, sent) = call(&fake, "sendMessage", json!({"chat_id": 42, "text": "hi"}));
        assert_eq!(status, 200, "{sent}");
        assert_eq!(sent["result"]["message_id"], json!(2));
        assert_eq!(
            sent["result"]["chat"],
            json!({"id": 42, "type": "private", "first_name": "Alice", "username": "alice"})
        );
        assert_eq!(fake.post_private(43, "Bob", None, "me too"), 3);
        assert_eq!(fake.post(CHAT, 43, "Bob", None, "group again"), 2);
        let bob = fake.message(43, 3).expect("Bob's message");
        assert_eq!(bob["chat"], json!({"id": 43, "type": "private", "first_name": "Bob"}));
        // Posting again updates the name the chat shows; `post` takes the private chat too.
        fake.post_private(43, "Robert", Some("bob"), "renamed");
        assert_eq!(
            fake.post(43, 43, "Robert", Some("bob"), "via post"),
            5,
            "post writes in a private chat"
        );
        assert_eq!(fake.message(43, 5).expect("a message")["chat"]["first_name"], json!("Robert"));
        assert_eq!(fake.sent_to(42).len(), 1);
        assert_eq!(fake.wait_sent(42, 1, SECS)[0].plain, "hi");
        assert!(fake.sent_to(43).is_empty() && fake.sent_to(CHAT).is_empty());
    }

    #[test]
    fn the_bot_replies_acts_edits_and_deletes_in_a_private_chat() {
        let fake = FakeTelegram::start(TOKEN);
        let asked = fake.post_private(42, "Alice", None, "question?");
        assert_bad_request(
            call(&fake, "sendMessage", json!({"chat_id": 7, "text": "x"})),
            "Bad Request: chat not found",
        );
        // Typing first, then the answer as a reply.
        let (status, body) =
            call(&fake, "sendChatAction", json!({"chat_id": 42, "action": "typing"}));
        assert_eq!((status, body), (200, json!({"ok": true, "result": true})));
        assert_bad_request(
            call(&fake, "sendChatAction", json!({"chat_id": 42, "action": "dancing"})),
            "Bad Request: wrong parameter action in request",
        );
        assert_bad_request(
            call(&fake, "sendChatAction", json!({"chat_id": 7, "action": "typing"})),
            "Bad Request: chat not found",
        );
        let form = "chat_id=42&action=typing";
        let mut client = Client::connect(&fake);
        let target = format!("/bot{TOKEN}/sendChatAction");
        client.send("POST", &target, Some("application/x-www-form-urlencoded"), form);
        assert_eq!(client.response().expect("an answer").0, 200);
        assert_eq!(fake.chat_actions(42), ["typing", "typing"]);
        assert!(fake.chat_actions(7).is_empty());

        let reply =
            json!({"chat_id": 42, "text": "answer", "reply_parameters": {"message_id": asked}});
        let (status, body) = call(&fake, "sendMessage", reply);
        assert_eq!(status, 200, "{body}");
        let answer = body["result"]["message_id"].as_i64().expect("a message id");
        assert_eq!(body["result"]["reply_to_message"]["text"], json!("question?"));
        assert_eq!(body["result"]["reply_to_message"]["chat"]["type"], json!("private"));
        // The older `reply_to_message_id`, and a missing message let through without a reply.
        let (status, _) = call(
            &fake,
            "sendMessage",
            json!({"chat_id": 42, "text": "old style", "reply_to_message_id": asked}),
        );
        assert_eq!(status, 200);
        let lenient = json!({"chat_id": 42, "text": "lenient",
            "reply_parameters": {"message_id": 999, "allow_sending_without_reply": true}});
        let (status, body) = call(&fake, "sendMessage", lenient);
        assert_eq!(status, 200, "{body}");
        assert!(body["result"].get("reply_to_message").is_none(), "{body}");
        let replies: Vec<Option<i64>> = fake.sent_to(42).iter().map(|m| m.reply_to).collect();
        assert_eq!(replies, [Some(asked), Some(asked), None]);

        // Edits of its own messages; the person's cannot be edited, but can be deleted there.
        let edit = json!({"chat_id": 42, "message_id": answer, "text": "answer, edited"});
        let (status, body) = call(&fake, "editMessageText", edit);
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["chat"]["id"], json!(42));
        assert_bad_request(
            call(
                &fake,
                "editMessageText",
                json!({"chat_id": 42, "message_id": asked, "text": "x"}),
            ),
            "Bad Request: message can't be edited",
        );
        let (status, _) = call(&fake, "deleteMessage", json!({"chat_id": 42, "message_id": asked}));
        assert_eq!(status, 200, "bots can delete incoming messages in private chats");
        let (status, _) =
            call(&fake, "deleteMessage", json!({"chat_id": 42, "message_id": answer}));
        assert_eq!(status, 200);
        assert!(fake.message(42, asked).is_none() && fake.message(42, answer).is_none());
        assert_eq!(
            fake.wait_edits(42, 3, SECS),
            [(answer, Some("answer, edited".to_string())), (asked, None), (answer, None)]
        );
        // A person's edit in a private chat arrives as an edited_message.
        let later = fake.post_private(42, "Alice", None, "typo");
        fake.edit(42, later, "fixed");
        let (_, body) = call(&fake, "getUpdates", json!({"timeout": 0}));
        let last = body["result"].as_array().and_then(|u| u.last().cloned()).expect("updates");
        assert_eq!(last["edited_message"]["text"], json!("fixed"));
        assert_eq!(last["edited_message"]["chat"]["type"], json!("private"));
    }

    #[test]
    fn chat_actions_are_recorded_per_chat_in_order() {
        let fake = fake_with_chat();
        fake.post_private(42, "Alice", None, "hi");
        for (chat, action) in [(CHAT, "typing"), (42, "upload_document"), (CHAT, "choose_sticker")]
        {
            let (status, body) =
                call(&fake, "sendChatAction", json!({"chat_id": chat, "action": action}));
            assert_eq!(status, 200, "{body}");
        }
        assert_eq!(fake.chat_actions(CHAT), ["typing", "choose_sticker"]);
        assert_eq!(fake.chat_actions(42), ["upload_document"]);
        assert!(fake.sent().is_empty(), "chat actions are no messages");
        assert_eq!(fake.calls().iter().filter(|c| c.as_str() == "sendChatAction").count(), 3);
    }

    #[test]
    #[should_panic(expected = "is a supergroup")]
    fn a_private_chat_cannot_reuse_a_supergroups_id() {
        let fake = FakeTelegram::start(TOKEN);
        fake.add_chat(42, "Odd");
        fake.post_private(42, "Alice", None, "hi");
    }

    #[tokio::test]
    async fn wait_sent_async_does_not_block_an_async_test() {
        let fake = Arc::new(fake_with_chat());
        let sender = Arc::clone(&fake);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(send(&sender, "async", None).0, 200);
        });
        let sent = fake.wait_sent_async(CHAT, 1, SECS).await;
        assert_eq!(sent[0].plain, "async");
        thread.join().expect("the sender");
    }
}
