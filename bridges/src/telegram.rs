//! The Telegram Bot API (https://core.telegram.org/bots/api) over reqwest: `getMe` to check the
//! token and learn the bot's own id, `getUpdates` long polling with the offset confirming what
//! was handled, `sendMessage` in MarkdownV2; people's edits come as `edited_message` and are
//! followed, and the bot's own copies are changed with `editMessageText` / `deleteMessage`
//! (the Bot API tells a bot of no deletion, so a person's deletion is not followed). The token is part of every URL, so no error text
//! ever carries a URL (`without_url`) or the token.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::{Change, Inbound, PlatformError};

/// How long one `getUpdates` waits on the server for something to arrive.
pub const POLL_SECS: u64 = 25;

pub struct Telegram {
    http: reqwest::Client,
    /// `<api_url>/bot<token>`.
    base: String,
    token: String,
    /// The next `getUpdates` offset: one past the last update handled.
    offset: Mutex<Option<i64>>,
    bot_id: i64,
    /// `@username` from `getMe`.
    bot_name: String,
}

impl std::fmt::Debug for Telegram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telegram").field("bot_id", &self.bot_id).finish_non_exhaustive()
    }
}

impl Telegram {
    /// Checks the token with `getMe`.
    pub async fn connect(api_url: &str, token: &str) -> Result<Telegram, PlatformError> {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| PlatformError::Fatal(format!("HTTP client: {}", e.without_url())))?;
        let mut tg = Telegram {
            http,
            base: format!("{}/bot{token}", api_url.trim_end_matches('/')),
            token: token.to_owned(),
            offset: Mutex::new(None),
            bot_id: 0,
            bot_name: String::new(),
        };
        let me = tg.call("getMe", json!({}), Duration::from_secs(20)).await?;
        tg.bot_id = me["id"].as_i64().unwrap_or(0);
        tg.bot_name =
            me["username"].as_str().map_or_else(|| tg.bot_id.to_string(), |u| format!("@{u}"));
        Ok(tg)
    }

    /// The bot's own user id (its messages are never brought in).
    pub fn bot_id(&self) -> i64 {
        self.bot_id
    }

    /// The bot as people see it: `@username`.
    pub fn bot_name(&self) -> &str {
        &self.bot_name
    }

    /// Waits up to [`POLL_SECS`] for new messages. Updates already handed out stay on the
    /// server until [`Telegram::handled`] moves the offset past them.
    pub async fn receive(&self) -> Result<Vec<(i64, Option<Inbound>)>, PlatformError> {
        let offset = *self.offset.lock().unwrap_or_else(|p| p.into_inner());
        let mut args =
            json!({"timeout": POLL_SECS, "allowed_updates": ["message", "edited_message"]});
        if let Some(o) = offset {
            args["offset"] = json!(o);
        }
        let result = self.call("getUpdates", args, Duration::from_secs(POLL_SECS + 15)).await?;
        let updates = result.as_array().cloned().unwrap_or_default();
        Ok(updates
            .iter()
            .filter_map(|u| Some((u["update_id"].as_i64()?, self.inbound(u))))
            .collect())
    }

    /// Update `update_id` was handled: the next poll confirms it (and everything before it).
    pub fn handled(&self, update_id: i64) {
        let mut offset = self.offset.lock().unwrap_or_else(|p| p.into_inner());
        if offset.is_none_or(|o| o <= update_id) {
            *offset = Some(update_id + 1);
        }
    }

    /// A person's text message or its edit, or `None` for anything else (bots, this bot,
    /// non-text).
    fn inbound(&self, update: &Value) -> Option<Inbound> {
        let (m, change) = match update.get("edited_message") {
            Some(m) => (m, Change::Edited),
            None => (&update["message"], Change::New),
        };
        let from = &m["from"];
        let text = m["text"].as_str()?;
        if from["is_bot"].as_bool().unwrap_or(false) || from["id"].as_i64() == Some(self.bot_id) {
            return None;
        }
        let name = match (from["username"].as_str(), from["first_name"].as_str()) {
            (Some(u), _) => u.to_owned(),
            (None, Some(first)) => match from["last_name"].as_str() {
                Some(last) => format!("{first} {last}"),
                None => first.to_owned(),
            },
            (None, None) => String::new(),
        };
        Some(Inbound {
            external: m["chat"]["id"].as_i64()?.to_string(),
            message_id: m["message_id"].as_i64()?.to_string(),
            user_id: from["id"].as_i64()?.to_string(),
            user_name: name,
            text: text.to_owned(),
            change,
            direct: m["chat"]["type"].as_str() == Some("private"),
        })
    }

    /// Sends one MarkdownV2 message, as a reply to message `reply_to` when given (sent anyway
    /// if that message is gone); returns its message id.
    pub async fn send(
        &self,
        chat: &str,
        text: &str,
        reply_to: Option<&str>,
    ) -> Result<String, PlatformError> {
        let mut args = json!({
            "chat_id": chat_id(chat),
            "text": text,
            "parse_mode": "MarkdownV2",
            "link_preview_options": {"is_disabled": true},
        });
        if let Some(id) = reply_to.and_then(|r| r.parse::<i64>().ok()) {
            args["reply_parameters"] =
                json!({"message_id": id, "allow_sending_without_reply": true});
        }
        let sent = self.call("sendMessage", args, Duration::from_secs(30)).await?;
        Ok(sent["message_id"].as_i64().map(|n| n.to_string()).unwrap_or_default())
    }

    /// Shows "typing…" in `chat` (Telegram shows it for 5 s, or until the bot's next message).
    pub async fn typing(&self, chat: &str) -> Result<(), PlatformError> {
        let args = json!({"chat_id": chat_id(chat), "action": "typing"});
        self.call("sendChatAction", args, Duration::from_secs(10)).await.map(|_| ())
    }

    /// Replaces the text of the bot's message `id` (MarkdownV2); unchanged text counts as done.
    pub async fn edit(&self, chat: &str, id: &str, text: &str) -> Result<(), PlatformError> {
        let args = json!({
            "chat_id": chat_id(chat),
            "message_id": message_id(id)?,
            "text": text,
            "parse_mode": "MarkdownV2",
            "link_preview_options": {"is_disabled": true},
        });
        match self.call("editMessageText", args, Duration::from_secs(30)).await {
            Ok(_) => Ok(()),
            Err(PlatformError::Permanent(m)) if m.contains("message is not modified") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes the bot's message `id`.
    pub async fn delete(&self, chat: &str, id: &str) -> Result<(), PlatformError> {
        let args = json!({"chat_id": chat_id(chat), "message_id": message_id(id)?});
        self.call("deleteMessage", args, Duration::from_secs(30)).await.map(|_| ())
    }

    /// One Bot API call: the `result`, or what went wrong, classified.
    async fn call(
        &self,
        method: &str,
        args: Value,
        timeout: Duration,
    ) -> Result<Value, PlatformError> {
        let url = format!("{}/{method}", self.base);
        let response =
            self.http.post(url).json(&args).timeout(timeout).send().await.map_err(|e| {
                PlatformError::Transient(self.scrub(format!("{method}: {}", e.without_url())))
            })?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if body["ok"].as_bool() == Some(true) {
            return Ok(body["result"].clone());
        }
        let what = self.scrub(format!(
            "{method}: {} {}",
            body["error_code"].as_i64().unwrap_or(i64::from(status)),
            body["description"].as_str().unwrap_or("(no description)")
        ));
        Err(match status {
            429 => {
                let secs = body["parameters"]["retry_after"].as_u64().unwrap_or(5);
                PlatformError::RateLimited(Duration::from_secs(secs.clamp(1, 3600)))
            }
            401 | 404 if method == "getMe" => PlatformError::Fatal(format!(
                "{what}: Telegram refused the bot token (check the variable `token_env` names)"
            )),
            409 => PlatformError::Transient(format!("{what} (another process polls this bot)")),
            400..=499 => PlatformError::Permanent(what),
            _ => PlatformError::Transient(what),
        })
    }

    /// Removes the token from a text (errors of the HTTP stack may quote a URL).
    fn scrub(&self, text: String) -> String {
        if self.token.is_empty() { text } else { text.replace(&self.token, "[token]") }
    }
}

/// A chat id as the Bot API takes it: a number, or an `@channelusername`.
fn chat_id(chat: &str) -> Value {
    chat.parse::<i64>().map_or_else(|_| json!(chat), |n| json!(n))
}

/// A message id the bridge recorded, as the number the Bot API takes.
fn message_id(id: &str) -> Result<i64, PlatformError> {
    id.parse().map_err(|_| PlatformError::Permanent(format!("`{id}` is not a Telegram message id")))
}
