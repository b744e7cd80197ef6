//! The workspace's state and its rules: channels, messages with their ts, users, scopes, envelopes waiting for acks; the JSON Slack answers with.

use super::*;

impl State {
    /// A new message `ts` (`"1700000000.000100"`): the current time, strictly increasing.
    pub(super) fn next_ts(&mut self) -> String {
        let micros = now_micros().max(self.last_ts_micros + 1);
        self.last_ts_micros = micros;
        format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
    }

    pub(super) fn open_sockets(&self) -> usize {
        self.conns.values().filter(|c| !c.closing).count()
    }

    pub(super) fn sent(&self, channel: &str) -> Vec<SlackSent> {
        self.sent.iter().filter(|s| s.channel == channel).cloned().collect()
    }

    /// `missing_scope` unless the app has `scope`.
    pub(super) fn need_scope(&self, scope: &str) -> Result<(), Refusal> {
        if self.denied_scopes.contains(scope) { Err(Refusal::api("missing_scope")) } else { Ok(()) }
    }

    /// The scope managing `channel` needs: `groups:write` when private, else `channels:manage`.
    pub(super) fn manage_scope(&self, channel: &str) -> &'static str {
        if self.channels.get(channel).is_some_and(|c| c.private) {
            "groups:write"
        } else {
            "channels:manage"
        }
    }

    /// The channel id `raw` names: an id, or a channel's name with or without `#`.
    pub(super) fn channel_id(&self, raw: &str) -> Option<String> {
        if self.channels.contains_key(raw) {
            return Some(raw.to_string());
        }
        let name = raw.strip_prefix('#').unwrap_or(raw);
        let mut channels = self.channels.iter().filter(|(_, c)| c.im_user.is_none());
        channels.find(|(_, c)| c.name == name).map(|(id, _)| id.clone())
    }

    /// `channel_type` of the message events of `channel`: `im` for an IM, `group` for a private
    /// channel, `channel` for a public one.
    pub(super) fn channel_type(&self, channel: &str) -> &'static str {
        match self.channels.get(channel) {
            Some(c) if c.im_user.is_some() => "im",
            Some(c) if c.private => "group",
            _ => "channel",
        }
    }

    /// A conversation type that `conversations.join` / `conversations.archive` do not take.
    pub(super) fn not_for_ims(&self, channel: &str) -> Result<(), Refusal> {
        if self.channels.get(channel).is_some_and(|c| c.im_user.is_some()) {
            Err(Refusal::api("method_not_supported_for_channel_type"))
        } else {
            Ok(())
        }
    }

    /// Wraps `event` in an `event_callback` payload and queues its envelope, when the bot is a
    /// member of the channel.
    pub(super) fn emit(&mut self, channel: &str, event: Value) {
        if !self.channels.get(channel).is_some_and(|c| c.bot_member) {
            return;
        }
        let event_time = now_micros() / 1_000_000;
        let payload = json!({
            "token": VERIFICATION_TOKEN,
            "team_id": TEAM_ID,
            "context_team_id": TEAM_ID,
            "context_enterprise_id": null,
            "api_app_id": APP_ID,
            "event": event,
            "type": "event_callback",
            "event_id": format!("Ev{}", random_string(10, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")),
            "event_time": event_time,
            "authorizations": [{
                "enterprise_id": null,
                "team_id": TEAM_ID,
                "user_id": BOT_USER_ID,
                "is_bot": true,
                "is_enterprise_install": false,
            }],
            "is_ext_shared_channel": false,
            "event_context": format!("4-{}", random_string(24, b"abcdefghijklmnopqrstuvwxyz0123456789")),
        });
        self.envelopes.push(Envelope {
            id: uuid(),
            payload,
            attempt: 0,
            due: true,
            sent_at: None,
            sent_count: 0,
            acked: false,
            abandoned: false,
        });
        self.deliver();
    }

    /// Sends every due envelope to an open connection (round robin); leaves them queued when
    /// there is none.
    pub(super) fn deliver(&mut self) {
        let live: Vec<u64> =
            self.conns.iter().filter(|(_, c)| !c.closing).map(|(id, _)| *id).collect();
        if live.is_empty() {
            return;
        }
        let now = Instant::now();
        for envelope in self.envelopes.iter_mut().filter(|e| e.due && !e.acked) {
            let conn = live[self.next_pick % live.len()];
            self.next_pick += 1;
            if let Some(conn) = self.conns.get(&conn) {
                let _ = conn.tx.send(Out::Text(envelope.frame()));
            }
            if envelope.sent_count > 0 {
                self.redeliveries += 1;
            }
            envelope.sent_count += 1;
            envelope.due = false;
            envelope.sent_at = Some(now);
            self.deliveries.push((envelope.id.clone(), envelope.attempt));
        }
    }

    /// Envelopes unacknowledged for the ack timeout become due again with `retry_attempt` + 1,
    /// or are given up after [`MAX_RETRIES`]; `true` when anything changed.
    pub(super) fn check_timeouts(&mut self, now: Instant) -> bool {
        let timeout = self.ack_timeout;
        let mut changed = false;
        for envelope in &mut self.envelopes {
            if envelope.acked || envelope.abandoned || envelope.due {
                continue;
            }
            let Some(at) = envelope.sent_at else { continue };
            if now.duration_since(at) < timeout {
                continue;
            }
            changed = true;
            if envelope.attempt < MAX_RETRIES {
                envelope.attempt += 1;
                envelope.due = true;
            } else {
                envelope.abandoned = true;
            }
        }
        if changed {
            self.deliver();
        }
        changed
    }

    /// A client frame: an acknowledgement, or recorded as a bad frame.
    pub(super) fn on_frame(&mut self, text: &str) {
        let parsed: Option<Value> = serde_json::from_str(text).ok();
        let Some(id) = parsed.as_ref().and_then(|v| v["envelope_id"].as_str()) else {
            self.bad_frames.push(text.to_string());
            return;
        };
        self.acks.push((id.to_string(), Instant::now()));
        if let Some(envelope) = self.envelopes.iter_mut().find(|e| e.id == id) {
            envelope.acked = true;
        }
    }

    pub(super) fn find_message(&mut self, channel: &str, ts: &str) -> Option<&mut StoredMessage> {
        self.messages.iter_mut().find(|m| m.channel == channel && m.ts == ts && !m.deleted)
    }

    /// Changes the text of a stored message and emits `message_changed`; `false` when there is
    /// no such message.
    pub(super) fn edit(&mut self, channel: &str, ts: &str, text: &str) -> bool {
        let edit_ts = self.next_ts();
        let Some(message) = self.find_message(channel, ts) else {
            return false;
        };
        let previous = message.json.clone();
        let editor =
            previous.get("user").and_then(Value::as_str).unwrap_or(BOT_USER_ID).to_string();
        message.json["text"] = json!(text);
        message.json["edited"] = json!({"user": editor, "ts": edit_ts});
        let message = message.json.clone();
        let event = json!({
            "type": "message",
            "subtype": "message_changed",
            "message": message,
            "previous_message": previous,
            "channel": channel,
            "hidden": true,
            "ts": edit_ts,
            "event_ts": edit_ts,
            "channel_type": self.channel_type(channel),
        });
        self.emit(channel, event);
        true
    }

    /// Deletes a stored message and emits `message_deleted`; `false` when there is no such
    /// message.
    pub(super) fn delete(&mut self, channel: &str, ts: &str) -> bool {
        let delete_ts = self.next_ts();
        let Some(message) = self.find_message(channel, ts) else {
            return false;
        };
        message.deleted = true;
        let previous = message.json.clone();
        let event = json!({
            "type": "message",
            "subtype": "message_deleted",
            "hidden": true,
            "deleted_ts": ts,
            "channel": channel,
            "previous_message": previous,
            "ts": delete_ts,
            "event_ts": delete_ts,
            "channel_type": self.channel_type(channel),
        });
        self.emit(channel, event);
        true
    }
}

/// A stored message as a `message` event of `channel` (`channel_type`: `channel`, `group` or
/// `im`).
pub(super) fn message_event(json: &Value, channel: &str, channel_type: &str) -> Value {
    let mut event = json.clone();
    event["channel"] = json!(channel);
    event["event_ts"] = json["ts"].clone();
    event["channel_type"] = json!(channel_type);
    event
}

/// The names of the bot's reactions in a message's `reactions`.
pub(super) fn bot_reactions(message: &Value) -> Vec<String> {
    let Some(reactions) = message["reactions"].as_array() else { return Vec::new() };
    reactions
        .iter()
        .filter(|r| r["users"].as_array().is_some_and(|u| u.iter().any(|u| u == BOT_USER_ID)))
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect()
}

pub(super) fn bot_profile() -> Value {
    json!({
        "id": BOT_ID,
        "deleted": false,
        "name": BOT_NAME,
        "updated": CHANNEL_CREATED,
        "app_id": APP_ID,
        "icons": {
            "image_36": "https://fake.slack.com/bot_36.png",
            "image_48": "https://fake.slack.com/bot_48.png",
            "image_72": "https://fake.slack.com/bot_72.png",
        },
        "team_id": TEAM_ID,
    })
}

/// A conversation object as `conversations.info` answers it: a channel, or an IM.
pub(super) fn channel_json(id: &str, channel: &Channel) -> Value {
    if let Some(user) = &channel.im_user {
        return json!({
            "id": id,
            "created": channel.created,
            "is_archived": channel.archived,
            "is_im": true,
            "is_org_shared": false,
            "context_team_id": TEAM_ID,
            "updated": channel.created * 1000,
            "user": user,
            "is_user_deleted": false,
            "priority": 0,
            "is_open": true,
            "last_read": "0000000000.000000",
            "unread_count": 0,
            "unread_count_display": 0,
        });
    }
    json!({
        "id": id,
        "name": channel.name,
        "is_channel": true,
        "is_group": false,
        "is_im": false,
        "is_mpim": false,
        "is_private": channel.private,
        "created": channel.created,
        "is_archived": channel.archived,
        "is_general": false,
        "unlinked": 0,
        "name_normalized": channel.name,
        "is_shared": false,
        "is_org_shared": false,
        "is_pending_ext_shared": false,
        "pending_shared": [],
        "context_team_id": TEAM_ID,
        "updated": channel.created * 1000,
        "parent_conversation": null,
        "creator": channel.creator,
        "is_ext_shared": false,
        "shared_team_ids": [TEAM_ID],
        "pending_connected_team_ids": [],
        "is_member": channel.bot_member,
        "topic": {"value": "", "creator": "", "last_set": 0},
        "purpose": {"value": "", "creator": "", "last_set": 0},
        "previous_names": [],
    })
}

pub(super) fn user_json(id: &str, name: &str) -> Value {
    let bot = id == BOT_USER_ID;
    json!({
        "id": id,
        "team_id": TEAM_ID,
        "name": name,
        "deleted": false,
        "color": "9f69e7",
        "real_name": name,
        "tz": "Europe/London",
        "tz_label": "British Summer Time",
        "tz_offset": 3600,
        "profile": {
            "title": "",
            "phone": "",
            "skype": "",
            "real_name": name,
            "real_name_normalized": name,
            "display_name": name,
            "display_name_normalized": name,
            "fields": null,
            "status_text": "",
            "status_emoji": "",
            "status_expiration": 0,
            "avatar_hash": "g0123456789a",
            "first_name": name,
            "last_name": "",
            "image_24": format!("https://fake.slack.com/{id}_24.png"),
            "image_48": format!("https://fake.slack.com/{id}_48.png"),
            "image_72": format!("https://fake.slack.com/{id}_72.png"),
            "team": TEAM_ID,
        },
        "is_admin": false,
        "is_owner": false,
        "is_primary_owner": false,
        "is_restricted": false,
        "is_ultra_restricted": false,
        "is_bot": bot,
        "is_app_user": false,
        "updated": CHANNEL_CREATED,
        "is_email_confirmed": !bot,
        "who_can_share_contact_card": "EVERYONE",
    })
}

pub(super) fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A `ts` (`"1700000000.000100"`, or without the fraction) as microseconds, for ordering.
pub(super) fn ts_micros(ts: &str) -> Option<u64> {
    let (secs, fraction) = ts.split_once('.').unwrap_or((ts, ""));
    if fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros = format!("{fraction:0<6}").parse::<u64>().ok()?;
    Some(secs.parse::<u64>().ok()?.checked_mul(1_000_000)? + micros)
}

/// A random UUID-shaped id (envelope ids, `client_msg_id`).
pub(super) fn uuid() -> String {
    let hex = random_string(32, b"0123456789abcdef");
    format!("{}-{}-4{}-a{}-{}", &hex[..8], &hex[8..12], &hex[13..16], &hex[17..20], &hex[20..])
}
