//! The guild's state and its rules (snowflakes, channels, permission overwrites, webhooks, messages, rate limits), and the JSON Discord answers with.

use super::*;

impl State {
    /// A new snowflake: the current time since the Discord epoch, strictly increasing.
    pub(super) fn snowflake(&mut self) -> u64 {
        let ms = now_ms().saturating_sub(DISCORD_EPOCH_MS);
        let id = (ms << 22).max(self.last_snowflake + 1);
        self.last_snowflake = id;
        id
    }

    /// The position a new channel of type `kind` gets: after the others of its type (Discord
    /// sorts categories and text channels apart).
    pub(super) fn next_position(&self, kind: u8) -> usize {
        self.channels.values().filter(|c| c.kind == kind).count()
    }

    /// A DM channel (else a guild channel, or none).
    pub(super) fn is_dm(&self, channel_id: u64) -> bool {
        self.channels.get(&channel_id).is_some_and(Channel::is_dm)
    }

    /// The guild's channels (and categories), DM channels left out, in id order.
    pub(super) fn guild_channels(&self) -> impl Iterator<Item = (&u64, &Channel)> {
        self.channels.iter().filter(|(_, c)| !c.is_dm())
    }

    /// The channel object as the REST API returns it (with `guild_id`; a DM without).
    pub(super) fn channel_json(&self, channel_id: u64, channel: &Channel) -> Value {
        let last =
            self.messages.iter().rev().find(|m| m.meta.channel_id == channel_id).map(|m| m.meta.id);
        channel_json(channel_id, channel, last)
    }

    /// Dispatches `kind` (`CHANNEL_CREATE`, `CHANNEL_UPDATE`) with the channel object to every
    /// session with the GUILDS intent.
    pub(super) fn dispatch_channel(&mut self, kind: &str, channel_id: u64) {
        let Some(channel) = self.channels.get(&channel_id) else { return };
        let json = self.channel_json(channel_id, channel);
        self.dispatch(kind, INTENT_GUILDS, |_| json.clone());
    }

    pub(super) fn sent(&self, channel_id: u64) -> Vec<DiscordMessage> {
        self.messages
            .iter()
            .filter(|m| m.meta.channel_id == channel_id && m.by_bot)
            .map(|m| m.meta.clone())
            .collect()
    }

    pub(super) fn edits_in(&self, channel_id: u64) -> Vec<(u64, Option<String>)> {
        self.edits
            .iter()
            .filter(|(channel, _, _)| *channel == channel_id)
            .map(|(_, message, content)| (*message, content.clone()))
            .collect()
    }

    /// `(mentions, mention_roles, mention_everyone)` of `content` under `allowed_mentions`
    /// (absent: everything parsed). Only known users (people who posted, the bot) are listed.
    pub(super) fn mentions(
        &self,
        content: &str,
        allowed: Option<&Value>,
    ) -> (Vec<Value>, Vec<Value>, bool) {
        let parse = |kind: &str| match allowed {
            None => true,
            Some(a) => a["parse"].as_array().is_some_and(|p| p.iter().any(|v| v == kind)),
        };
        let listed = |field: &str, id: u64| {
            allowed.and_then(|a| a[field].as_array()).is_some_and(|ids| {
                ids.iter().any(|v| v.as_str() == Some(&id.to_string()) || v.as_u64() == Some(id))
            })
        };
        let (mut users, mut roles): (Vec<Value>, Vec<Value>) = (Vec::new(), Vec::new());
        let mut rest = content;
        while let Some(start) = rest.find("<@") {
            rest = &rest[start + 2..];
            let Some(end) = rest.find('>') else { break };
            let inner = &rest[..end];
            if let Some(role) = inner.strip_prefix('&').and_then(|r| r.parse::<u64>().ok()) {
                if (parse("roles") || listed("roles", role))
                    && !roles.contains(&json!(role.to_string()))
                {
                    roles.push(json!(role.to_string()));
                }
            } else if let Ok(user) = inner.trim_start_matches('!').parse::<u64>() {
                let known = if user == BOT_ID {
                    Some(bot_user())
                } else {
                    self.people.get(&user).map(|name| {
                        json!({"id": user.to_string(), "username": name, "avatar": null,
                               "discriminator": "0", "public_flags": 0, "flags": 0,
                               "global_name": name})
                    })
                };
                if let Some(u) = known.filter(|_| parse("users") || listed("users", user))
                    && !users.iter().any(|x| x["id"] == u["id"])
                {
                    users.push(u);
                }
            }
            rest = &rest[end..];
        }
        let everyone =
            (content.contains("@everyone") || content.contains("@here")) && parse("everyone");
        (users, roles, everyone)
    }

    /// Stores a message and, when `dispatch`, sends `MESSAGE_CREATE` to the sessions (with
    /// GUILD_MESSAGES, or DIRECT_MESSAGES in a DM).
    pub(super) fn store(&mut self, message: StoredMessage, dispatch: bool) {
        if dispatch {
            let dm = self.is_dm(message.meta.channel_id);
            let event = gateway_message(&message, dm);
            self.dispatch("MESSAGE_CREATE", message_intent(dm), |intents| {
                gated(&event, dm || intents & INTENT_MESSAGE_CONTENT != 0)
            });
        }
        self.messages.push(message);
    }

    /// The stored message `message_id` of the channel, if any.
    pub(super) fn find(&self, channel_id: u64, message_id: u64) -> Option<&StoredMessage> {
        self.messages.iter().find(|m| m.meta.id == message_id && m.meta.channel_id == channel_id)
    }

    /// Gives a stored message new content (and, when `allowed` is given, new `allowed_mentions`,
    /// its mentions parsed again under them) and an `edited_timestamp`, and dispatches
    /// `MESSAGE_UPDATE` with the whole message, as Discord does; `false` when there is none.
    pub(super) fn edit(
        &mut self,
        channel_id: u64,
        message_id: u64,
        content: &str,
        allowed: Option<Value>,
    ) -> bool {
        let Some(i) = self.message_at(channel_id, message_id) else { return false };
        if allowed.is_some() {
            self.messages[i].meta.allowed_mentions = allowed;
        }
        let allowed = self.messages[i].meta.allowed_mentions.clone();
        let (users, roles, everyone) = self.mentions(content, allowed.as_ref());
        let message = &mut self.messages[i];
        message.meta.content = content.to_string();
        message.json["content"] = json!(content);
        message.json["mentions"] = Value::Array(users);
        message.json["mention_roles"] = Value::Array(roles);
        message.json["mention_everyone"] = json!(everyone);
        message.json["edited_timestamp"] = json!(iso8601(now_ms()));
        let dm = self.is_dm(channel_id);
        let update = gateway_message(&self.messages[i], dm);
        self.dispatch("MESSAGE_UPDATE", message_intent(dm), |intents| {
            gated(&update, dm || intents & INTENT_MESSAGE_CONTENT != 0)
        });
        true
    }

    /// Where message `message_id` of channel `channel_id` is stored.
    fn message_at(&self, channel_id: u64, message_id: u64) -> Option<usize> {
        self.messages
            .iter()
            .position(|m| m.meta.id == message_id && m.meta.channel_id == channel_id)
    }

    /// Removes a stored message and dispatches `MESSAGE_DELETE`; `false` when there is none.
    pub(super) fn delete(&mut self, channel_id: u64, message_id: u64) -> bool {
        let Some(i) = self.message_at(channel_id, message_id) else { return false };
        self.messages.remove(i);
        let dm = self.is_dm(channel_id);
        let mut event = json!({"id": message_id.to_string(), "channel_id": channel_id.to_string()});
        if !dm {
            event["guild_id"] = json!(GUILD_ID.to_string());
        }
        self.dispatch("MESSAGE_DELETE", message_intent(dm), |_| event.clone());
        true
    }

    /// Sends dispatch `kind` to every live session having all of `needs` intents (buffered for
    /// those without a connection); `make` builds `d` from the session's intents.
    pub(super) fn dispatch(&mut self, kind: &str, needs: u64, make: impl Fn(u64) -> Value) {
        for session in self.sessions.values_mut() {
            if session.intents & needs == needs {
                let d = make(session.intents);
                push_event(session, &self.conns, kind, d);
            }
        }
    }
}

/// The intent message events of a channel need: DIRECT_MESSAGES in a DM, else GUILD_MESSAGES.
pub(super) fn message_intent(dm: bool) -> u64 {
    if dm { INTENT_DIRECT_MESSAGES } else { INTENT_GUILD_MESSAGES }
}

/// A stored message as `MESSAGE_CREATE` / `MESSAGE_UPDATE` carry it: the REST object with
/// `guild_id`, and `member` unless a webhook wrote it; in a DM (`dm`) the REST object as it is.
pub(super) fn gateway_message(message: &StoredMessage, dm: bool) -> Value {
    let mut event = message.json.clone();
    if dm {
        return event;
    }
    event["guild_id"] = json!(GUILD_ID.to_string());
    if message.meta.webhook_id.is_none() {
        event["member"] = json!({
            "avatar": null,
            "banner": null,
            "communication_disabled_until": null,
            "deaf": false,
            "flags": 0,
            "joined_at": event["timestamp"],
            "mute": false,
            "nick": null,
            "pending": false,
            "premium_since": null,
            "roles": [],
        });
    }
    event
}

/// Appends a dispatch to a session's log and sends it when the session has a connection.
pub(super) fn push_event(
    session: &mut Session,
    conns: &HashMap<u64, GatewayConn>,
    kind: &str,
    d: Value,
) {
    session.seq += 1;
    let payload = json!({"op": 0, "t": kind, "s": session.seq, "d": d}).to_string();
    if let Some(conn) = session.conn.and_then(|c| conns.get(&c)) {
        let _ = conn.tx.send(Out::Text(payload.clone()));
    }
    session.events.push((session.seq, payload));
}

/// A non-dispatch gateway payload.
pub(super) fn op_payload(op: u8, d: Value) -> String {
    json!({"t": null, "s": null, "op": op, "d": d}).to_string()
}

/// The message as an app sees it: without MESSAGE_CONTENT, `content`, `embeds`, `attachments`
/// and `components` are empty unless the bot wrote it or it mentions the bot.
pub(super) fn gated(message: &Value, content_intent: bool) -> Value {
    let mut message = message.clone();
    let own = message["author"]["id"] == json!(BOT_ID.to_string());
    let mentioned = message["mentions"]
        .as_array()
        .is_some_and(|m| m.iter().any(|u| u["id"] == json!(BOT_ID.to_string())));
    if !(content_intent || own || mentioned) {
        for (field, empty) in [
            ("content", json!("")),
            ("embeds", json!([])),
            ("attachments", json!([])),
            ("components", json!([])),
        ] {
            if message.get(field).is_some() {
                message[field] = empty;
            }
        }
    }
    message
}

/// A person as the `author` of a message (and the recipient of a DM channel).
pub(super) fn person_user(user_id: u64, username: &str) -> Value {
    json!({
        "id": user_id.to_string(),
        "username": username,
        "avatar": null,
        "discriminator": "0",
        "public_flags": 0,
        "flags": 0,
        "banner": null,
        "accent_color": null,
        "global_name": username,
        "avatar_decoration_data": null,
        "banner_color": null,
    })
}

pub(super) fn bot_user() -> Value {
    json!({
        "id": BOT_ID.to_string(),
        "username": BOT_USERNAME,
        "avatar": null,
        "discriminator": "0",
        "public_flags": 0,
        "flags": 0,
        "bot": true,
        "banner": null,
        "accent_color": null,
        "global_name": null,
        "avatar_decoration_data": null,
        "banner_color": null,
    })
}

/// A Message object as the REST API returns it.
pub(super) fn message_json(
    id: u64,
    channel_id: u64,
    author: Value,
    content: &str,
    mentions: &(Vec<Value>, Vec<Value>, bool),
    webhook_id: Option<u64>,
) -> Value {
    let mut message = json!({
        "type": 0,
        "content": content,
        "mentions": mentions.0,
        "mention_roles": mentions.1,
        "attachments": [],
        "embeds": [],
        "timestamp": iso8601((id >> 22) + DISCORD_EPOCH_MS),
        "edited_timestamp": null,
        "flags": 0,
        "components": [],
        "id": id.to_string(),
        "channel_id": channel_id.to_string(),
        "author": author,
        "pinned": false,
        "mention_everyone": mentions.2,
        "tts": false,
    });
    if let Some(hook) = webhook_id {
        message["webhook_id"] = json!(hook.to_string());
        message["application_id"] = json!(APPLICATION_ID.to_string());
    }
    message
}

/// A channel object: a text channel (type 0), without the text fields a category (type 4), or a
/// DM channel (type 1: no guild, name or overwrites; the person in `recipients`).
pub(super) fn channel_json(
    channel_id: u64,
    channel: &Channel,
    last_message_id: Option<u64>,
) -> Value {
    if let Some((user_id, username)) = channel.recipient.as_ref().filter(|_| channel.is_dm()) {
        return json!({
            "id": channel_id.to_string(),
            "type": CHANNEL_TYPE_DM,
            "last_message_id": last_message_id.map(|id| id.to_string()),
            "flags": 0,
            "recipients": [person_user(*user_id, username)],
        });
    }
    let overwrites: Vec<Value> = channel.overwrites.iter().map(Overwrite::to_json).collect();
    let mut json = json!({
        "id": channel_id.to_string(),
        "type": channel.kind,
        "guild_id": GUILD_ID.to_string(),
        "name": channel.name,
        "position": channel.position,
        "flags": 0,
        "parent_id": channel.parent_id.map(|id| id.to_string()),
        "nsfw": false,
        "permission_overwrites": overwrites,
    });
    if channel.kind == CHANNEL_TYPE_TEXT {
        json["topic"] = Value::Null;
        json["rate_limit_per_user"] = json!(0);
        json["last_message_id"] = json!(last_message_id.map(|id| id.to_string()));
    }
    json
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `2024-05-01T12:00:00.123000+00:00`, the way Discord writes timestamps.
pub(super) fn iso8601(ms: u64) -> String {
    // The project's own UTC formatter gives `…T12:00:00.123Z`.
    let stamp = flock_ipc::time::format_timestamp(ms);
    format!("{}000+00:00", stamp.trim_end_matches('Z'))
}
