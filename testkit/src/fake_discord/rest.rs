//! The REST API v10 over HTTP: connections kept alive, the bot token, routes, rate limits and scripted refusals, one handler per route.

use super::*;

/// The query parameters of `request` (empty pairs skipped: serenity writes `?&after=…`).
pub(super) fn query_params(request: &Request) -> HashMap<String, String> {
    request
        .query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            (n.to_string(), v.to_string())
        })
        .collect()
}

/// Serves requests on one connection until either side closes it, or hands it to the gateway
/// when it asks for a WebSocket upgrade.
pub(super) async fn connection(conn: Conn<TcpStream>, shared: Arc<Shared>) {
    let served = Arc::clone(&shared);
    let upgrade = |conn, request| upgrade_to_gateway(conn, request, shared);
    http1::serve(conn, |request| respond(&served, request).answer(), upgrade).await;
}

impl Reply {
    /// The answer written: a JSON body (none for 204) with its extra headers.
    pub(super) fn answer(&self) -> http1::Answer {
        http1::Answer {
            status: self.status,
            content_type: self.body.is_some().then_some("application/json"),
            headers: self.headers.clone(),
            body: self.body.as_ref().map(Value::to_string).unwrap_or_default(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// REST API v10

/// Answers one REST request, recording it (and the refusal, if any).
pub(super) fn respond(shared: &Shared, request: &Request) -> Reply {
    let body = parse_body(request);
    let mut state = shared.state();
    let recorded = body.as_ref().map_or(Value::Null, Clone::clone);
    state.requests.push((request.method.clone(), request.target.clone(), recorded));
    let result = body.and_then(|body| route(shared, &mut state, request, &body));
    let reply = match result {
        Ok(reply) => reply,
        Err(refusal) => {
            state.rejected.push((
                request.method.clone(),
                request.target.clone(),
                refusal.status,
                refusal.message(),
            ));
            Reply { status: refusal.status, body: Some(refusal.body), headers: refusal.headers }
        }
    };
    drop(state);
    shared.changed.notify_all();
    reply
}

/// The JSON body (`Null` when there is none).
pub(super) fn parse_body(request: &Request) -> Result<Value, Refusal> {
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    let content_type = request.header("content-type").unwrap_or("").to_ascii_lowercase();
    if content_type.starts_with("multipart/") {
        return Err(Refusal::new(
            400,
            50035,
            "fake Discord: multipart bodies (file attachments) are not supported",
        ));
    }
    serde_json::from_slice(&request.body)
        .map_err(|_| Refusal::new(400, 50109, "The request body contains invalid JSON."))
}

/// A snowflake in a path.
pub(super) fn snowflake_param(field: &str, raw: &str) -> Result<u64, Refusal> {
    raw.parse::<u64>().map_err(|_| {
        Refusal::form(field, "NUMBER_TYPE_COERCE", &format!("Value \"{raw}\" is not snowflake."))
    })
}

pub(super) fn route(
    shared: &Shared,
    state: &mut State,
    request: &Request,
    body: &Value,
) -> Result<Reply, Refusal> {
    let Some(rest) = request.path.strip_prefix("/api/v10/") else {
        return Err(Refusal::not_found());
    };
    let segments: Vec<&str> = rest.trim_end_matches('/').split('/').collect();
    let method = request.method.as_str();
    // Routes that need no bot token.
    match segments.as_slice() {
        ["gateway"] if method == "GET" => return Ok(Reply::ok(json!({"url": shared.ws_url()}))),
        ["webhooks", id, token] => return webhook_with_token(state, request, id, token, body),
        ["webhooks", id, token, "messages", message] => {
            return webhook_message(state, request, (id, token), message, body);
        }
        _ => {}
    }
    let authorized = request
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bot "))
        .is_some_and(|t| t.trim() == shared.token);
    if !authorized {
        return Err(Refusal::unauthorized());
    }
    match (method, segments.as_slice()) {
        ("GET", ["gateway", "bot"]) => Ok(Reply::ok(json!({
            "url": shared.ws_url(),
            "shards": 1,
            "session_start_limit": {
                "total": 1000, "remaining": 999, "reset_after": 0, "max_concurrency": 1,
            },
        }))),
        ("GET", ["users", "@me"]) => {
            let mut me = bot_user();
            me["verified"] = json!(true);
            me["mfa_enabled"] = json!(false);
            me["email"] = Value::Null;
            me["locale"] = json!("en-US");
            me["premium_type"] = json!(0);
            Ok(Reply::ok(me))
        }
        ("GET", ["oauth2", "applications", "@me"] | ["applications", "@me"]) => {
            Ok(Reply::ok(application_json(state)))
        }
        ("GET", ["channels", id]) => {
            let id = snowflake_param("channel_id", id)?;
            let channel = state.channels.get(&id).ok_or_else(Refusal::unknown_channel)?;
            Ok(Reply::ok(state.channel_json(id, channel)))
        }
        ("PATCH", ["channels", id]) => modify_channel(state, id, body),
        ("PUT", ["channels", id, "permissions", target]) => {
            edit_permissions(state, id, target, body)
        }
        ("DELETE", ["channels", id, "permissions", target]) => delete_permission(state, id, target),
        ("GET", ["guilds", guild, "channels"]) => {
            guild_param(guild)?;
            let channels: Vec<Value> =
                state.guild_channels().map(|(id, c)| state.channel_json(*id, c)).collect();
            Ok(Reply::ok(Value::Array(channels)))
        }
        ("POST", ["guilds", guild, "channels"]) => create_channel(state, guild, body),
        ("GET", ["channels", id, "messages"]) => history(state, request, id),
        ("POST", ["channels", id, "messages"]) => create_message(state, id, body),
        ("GET", ["channels", id, "messages", message]) => {
            let (channel, message) =
                (snowflake_param("channel_id", id)?, snowflake_param("message_id", message)?);
            state.channels.get(&channel).ok_or_else(Refusal::unknown_channel)?;
            let content_intent = !state.deny_message_content || state.is_dm(channel);
            let found = state
                .messages
                .iter()
                .find(|m| m.meta.channel_id == channel && m.meta.id == message);
            found
                .map(|m| Reply::ok(gated(&m.json, content_intent)))
                .ok_or_else(Refusal::unknown_message)
        }
        ("PATCH", ["channels", id, "messages", message]) => edit_message(state, id, message, body),
        ("DELETE", ["channels", id, "messages", message]) => delete_message(state, id, message),
        ("POST", ["channels", id, "typing"]) => {
            let id = snowflake_param("channel_id", id)?;
            state.channels.get(&id).ok_or_else(Refusal::unknown_channel)?;
            state.typings.push(id);
            Ok(Reply::no_content())
        }
        ("POST", ["channels", id, "webhooks"]) => create_webhook(state, id, body),
        ("GET", ["channels", id, "webhooks"]) => {
            let id = snowflake_param("channel_id", id)?;
            let channel = state.channels.get(&id).ok_or_else(Refusal::unknown_channel)?;
            if channel.is_dm() {
                return Err(Refusal::dm_channel());
            }
            let hooks: Vec<Value> = state
                .webhooks
                .iter()
                .filter(|h| h.channel_id == id && !h.deleted)
                .map(|h| h.to_json(true))
                .collect();
            Ok(Reply::ok(Value::Array(hooks)))
        }
        ("GET", ["webhooks", id]) => {
            let id = snowflake_param("webhook_id", id)?;
            let hook = state.webhooks.iter().find(|h| h.id == id && !h.deleted);
            hook.map(|h| Reply::ok(h.to_json(true))).ok_or_else(Refusal::unknown_webhook)
        }
        ("DELETE", ["webhooks", id]) => {
            let id = snowflake_param("webhook_id", id)?;
            let hook = state.webhooks.iter_mut().find(|h| h.id == id && !h.deleted);
            let hook = hook.ok_or_else(Refusal::unknown_webhook)?;
            hook.deleted = true;
            Ok(Reply::no_content())
        }
        (_, segments) if known_route(segments) => {
            Err(Refusal::new(405, 0, "405: Method Not Allowed"))
        }
        _ => Err(Refusal::not_found()),
    }
}

/// A REST route the fake serves (for some method).
pub(super) fn known_route(segments: &[&str]) -> bool {
    matches!(
        segments,
        ["gateway"]
            | ["gateway", "bot"]
            | ["users", "@me"]
            | ["oauth2", "applications", "@me"]
            | ["applications", "@me"]
            | ["channels", _]
            | ["channels", _, "messages" | "typing" | "webhooks"]
            | ["channels", _, "messages", _]
            | ["channels", _, "permissions", _]
            | ["guilds", _, "channels"]
            | ["webhooks", _]
    )
}

pub(super) fn application_json(state: &State) -> Value {
    let flags = if state.deny_message_content { 0 } else { APP_FLAG_MESSAGE_CONTENT_LIMITED };
    json!({
        "id": APPLICATION_ID.to_string(),
        "name": BOT_USERNAME,
        "icon": null,
        "description": "",
        "type": null,
        "bot": bot_user(),
        "summary": "",
        "bot_public": false,
        "bot_require_code_grant": false,
        "verify_key": "0".repeat(64),
        "flags": flags,
        "owner": {
            "id": GUILD_OWNER_ID.to_string(), "username": "owner", "avatar": null,
            "discriminator": "0", "public_flags": 0, "flags": 0, "global_name": "Owner",
        },
        "team": null,
        "hook": true,
        "is_monetized": false,
        "redirect_uris": [],
        "interactions_endpoint_url": null,
        "role_connections_verification_url": null,
        "tags": [],
        "approximate_guild_count": 1,
    })
}

/// `GET /channels/{id}/messages`: newest first; with `after`, the `limit` messages right after
/// it; with `before`, the `limit` messages right before it; else the latest `limit`.
pub(super) fn history(state: &State, request: &Request, id: &str) -> Result<Reply, Refusal> {
    let id = snowflake_param("channel_id", id)?;
    state.channels.get(&id).ok_or_else(Refusal::unknown_channel)?;
    let params = query_params(request);
    let limit = match params.get("limit") {
        None => 50,
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if (1..=100).contains(&n) => usize::try_from(n).unwrap_or(50),
            Ok(n) if n > 100 => {
                return Err(Refusal::form(
                    "limit",
                    "NUMBER_TYPE_MAX",
                    "int value should be less than or equal to 100.",
                ));
            }
            Ok(_) => {
                return Err(Refusal::form(
                    "limit",
                    "NUMBER_TYPE_MIN",
                    "int value should be greater than or equal to 1.",
                ));
            }
            Err(_) => {
                return Err(Refusal::form(
                    "limit",
                    "NUMBER_TYPE_COERCE",
                    &format!("Value \"{raw}\" is not int."),
                ));
            }
        },
    };
    let after = params.get("after").map(|a| snowflake_param("after", a)).transpose()?;
    let before = params.get("before").map(|b| snowflake_param("before", b)).transpose()?;
    let content_intent = !state.deny_message_content || state.is_dm(id);
    let in_channel = state.messages.iter().filter(|m| m.meta.channel_id == id);
    let mut picked: Vec<&StoredMessage> = match (after, before) {
        (Some(after), _) => {
            in_channel.filter(|m| m.meta.id > after).take(limit).collect::<Vec<_>>()
        }
        (None, Some(before)) => {
            let older: Vec<&StoredMessage> = in_channel.filter(|m| m.meta.id < before).collect();
            older[older.len().saturating_sub(limit)..].to_vec()
        }
        (None, None) => {
            let all: Vec<&StoredMessage> = in_channel.collect();
            all[all.len().saturating_sub(limit)..].to_vec()
        }
    };
    picked.reverse();
    let messages: Vec<Value> = picked.iter().map(|m| gated(&m.json, content_intent)).collect();
    Ok(Reply::ok(Value::Array(messages)))
}

/// Takes the next scripted 429, if any.
pub(super) fn rate_limited(state: &mut State) -> Result<(), Refusal> {
    let Some(retry_after) = state.rate_limits.pop_front() else {
        return Ok(());
    };
    let reset = now_ms() as f64 / 1000.0 + retry_after;
    Err(Refusal {
        status: 429,
        body: json!({
            "message": "You are being rate limited.",
            "retry_after": retry_after,
            "global": false,
        }),
        headers: vec![
            ("Retry-After".into(), format!("{}", retry_after.ceil().max(0.0) as u64)),
            ("X-RateLimit-Limit".into(), "5".into()),
            ("X-RateLimit-Remaining".into(), "0".into()),
            ("X-RateLimit-Reset".into(), format!("{reset:.3}")),
            ("X-RateLimit-Reset-After".into(), format!("{retry_after:.3}")),
            ("X-RateLimit-Bucket".into(), "f0a1b2c3d4e5f60718293a4b5c6d7e8f".into()),
            ("X-RateLimit-Scope".into(), "user".into()),
        ],
    })
}

/// `content` of a message body: at most 2000 characters; the message must not be empty.
pub(super) fn checked_content(body: &Value) -> Result<String, Refusal> {
    let content = match &body["content"] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        _ => {
            return Err(Refusal::form(
                "content",
                "STRING_TYPE_CONVERT",
                "Could not interpret value as string.",
            ));
        }
    };
    if content.chars().count() > MAX_MESSAGE_CHARS {
        return Err(Refusal::form(
            "content",
            "BASE_TYPE_MAX_LENGTH",
            &format!("Must be {MAX_MESSAGE_CHARS} or fewer in length."),
        ));
    }
    let embeds = body["embeds"].as_array().is_some_and(|e| !e.is_empty());
    let stickers = body["sticker_ids"].as_array().is_some_and(|s| !s.is_empty());
    if content.trim().is_empty() && !embeds && !stickers {
        return Err(Refusal::new(400, 50006, "Cannot send an empty message"));
    }
    Ok(content)
}

/// `allowed_mentions` of a body, if present and not null.
pub(super) fn allowed_mentions(body: &Value) -> Option<Value> {
    body.get("allowed_mentions").filter(|a| !a.is_null()).cloned()
}

/// `POST /channels/{id}/messages`: the bot posts.
pub(super) fn create_message(state: &mut State, id: &str, body: &Value) -> Result<Reply, Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let channel = state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    let dm = channel.is_dm();
    if channel.kind != CHANNEL_TYPE_TEXT && !dm {
        return Err(Refusal::new(400, 50008, "Cannot send messages in a non-text channel"));
    }
    rate_limited(state)?;
    let content = checked_content(body)?;
    let allowed = allowed_mentions(body);
    let reference = match body["message_reference"]["message_id"].as_str().map(str::parse::<u64>) {
        None => None,
        Some(Ok(mid)) => {
            let found =
                state.messages.iter().find(|m| m.meta.channel_id == channel_id && m.meta.id == mid);
            let found = found.ok_or_else(|| {
                Refusal::form("message_reference", "REPLIES_UNKNOWN_MESSAGE", "Unknown message")
            })?;
            Some(found.json.clone())
        }
        Some(Err(_)) => {
            return Err(Refusal::form(
                "message_reference",
                "NUMBER_TYPE_COERCE",
                "Value is not snowflake.",
            ));
        }
    };
    let mentions = state.mentions(&content, allowed.as_ref());
    let id = state.snowflake();
    let mut json = message_json(id, channel_id, bot_user(), &content, &mentions, None);
    let reply_to = reference.as_ref().and_then(|r| r["id"].as_str()?.parse::<u64>().ok());
    if let Some(referenced) = reference {
        json["type"] = json!(19);
        json["message_reference"] = json!({
            "type": 0,
            "channel_id": channel_id.to_string(),
            "message_id": referenced["id"],
        });
        if !dm {
            json["message_reference"]["guild_id"] = json!(GUILD_ID.to_string());
        }
        json["referenced_message"] = referenced;
    }
    if let Some(nonce) = body.get("nonce").filter(|n| !n.is_null()) {
        json["nonce"] = nonce.clone();
    }
    let meta = DiscordMessage {
        id,
        channel_id,
        author_id: BOT_ID,
        username: BOT_USERNAME.to_string(),
        content,
        webhook_id: None,
        allowed_mentions: allowed,
        reply_to,
    };
    state.store(StoredMessage { meta, json: json.clone(), by_bot: true }, true);
    Ok(Reply::ok(json))
}

/// The content of an edit: every field of an edit is optional, so without `content` the message
/// keeps its own; a given one follows [`checked_content`] (the edited message must not be empty).
pub(super) fn edited_content(body: &Value, current: &str) -> Result<String, Refusal> {
    if body.get("content").is_none() {
        return Ok(current.to_string());
    }
    checked_content(body)
}

/// Applies a REST edit of a stored message (already found): content and `allowed_mentions` of
/// `body`; records it, dispatches `MESSAGE_UPDATE` and answers the updated message.
pub(super) fn apply_edit(
    state: &mut State,
    channel_id: u64,
    message_id: u64,
    body: &Value,
) -> Result<Reply, Refusal> {
    let current = state.find(channel_id, message_id).map(|m| m.meta.content.clone());
    let content = edited_content(body, &current.unwrap_or_default())?;
    state.edit(channel_id, message_id, &content, allowed_mentions(body));
    state.edits.push((channel_id, message_id, Some(content)));
    let json = state.find(channel_id, message_id).map(|m| m.json.clone());
    Ok(Reply::ok(json.unwrap_or_default()))
}

/// Removes a stored message (already found) for the bot: records it, dispatches
/// `MESSAGE_DELETE`, answers 204.
pub(super) fn apply_delete(state: &mut State, channel_id: u64, message_id: u64) -> Reply {
    state.delete(channel_id, message_id);
    state.edits.push((channel_id, message_id, None));
    Reply::no_content()
}

/// `PATCH /channels/{id}/messages/{id}`: the bot edits its own message (`MESSAGE_UPDATE`).
pub(super) fn edit_message(
    state: &mut State,
    id: &str,
    message: &str,
    body: &Value,
) -> Result<Reply, Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let message_id = snowflake_param("message_id", message)?;
    state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    let found = state.find(channel_id, message_id).ok_or_else(Refusal::unknown_message)?;
    if found.meta.author_id != BOT_ID {
        return Err(Refusal::new(403, 50005, "Cannot edit a message authored by another user"));
    }
    apply_edit(state, channel_id, message_id, body)
}

/// `DELETE /channels/{id}/messages/{id}`: the bot deletes a message (`MESSAGE_DELETE`). Its own
/// it may always delete; anyone else's (its webhooks' included) needs MANAGE_MESSAGES, which the
/// bot does not have here: 403 (50013); in a DM nobody may delete the other's messages: 403
/// (50003).
pub(super) fn delete_message(state: &mut State, id: &str, message: &str) -> Result<Reply, Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let message_id = snowflake_param("message_id", message)?;
    state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    let found = state.find(channel_id, message_id).ok_or_else(Refusal::unknown_message)?;
    if found.meta.author_id != BOT_ID && state.is_dm(channel_id) {
        return Err(Refusal::dm_channel());
    }
    if found.meta.author_id != BOT_ID {
        return Err(Refusal::new(403, 50013, "Missing Permissions"));
    }
    Ok(apply_delete(state, channel_id, message_id))
}

/// A webhook name or username override: 1–80 characters, neither "clyde" nor "discord".
pub(super) fn check_webhook_name(field: &str, name: &str) -> Result<(), Refusal> {
    let length = name.trim().chars().count();
    if !(1..=80).contains(&length) {
        return Err(Refusal::form(
            field,
            "BASE_TYPE_BAD_LENGTH",
            "Must be between 1 and 80 in length.",
        ));
    }
    let lower = name.to_lowercase();
    for banned in ["clyde", "discord"] {
        if lower.contains(banned) {
            return Err(Refusal::form(
                field,
                "USERNAME_INVALID_CONTAINS",
                &format!("Username cannot contain \"{banned}\""),
            ));
        }
    }
    Ok(())
}

/// `POST /channels/{id}/webhooks` (403 with 50003 in a DM: webhooks live in guild channels).
pub(super) fn create_webhook(state: &mut State, id: &str, body: &Value) -> Result<Reply, Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let channel = state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    if channel.is_dm() {
        return Err(Refusal::dm_channel());
    }
    if !channel.webhook_permission {
        return Err(Refusal::new(403, 50013, "Missing Permissions"));
    }
    let Some(name) = body["name"].as_str() else {
        return Err(Refusal::form("name", "BASE_TYPE_REQUIRED", "This field is required"));
    };
    check_webhook_name("name", name)?;
    let live = state.webhooks.iter().filter(|h| h.channel_id == channel_id && !h.deleted).count();
    if live >= MAX_WEBHOOKS_PER_CHANNEL {
        return Err(Refusal::new(400, 30007, "Maximum number of webhooks reached (15)"));
    }
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let hook = Webhook {
        id: state.snowflake(),
        token: random_string(68, alphabet),
        channel_id,
        name: name.to_string(),
        deleted: false,
    };
    let json = hook.to_json(true);
    state.webhooks.push(hook);
    Ok(Reply::ok(json))
}

/// The guild id of a path: [`GUILD_ID`], else 10004.
pub(super) fn guild_param(raw: &str) -> Result<(), Refusal> {
    if snowflake_param("guild_id", raw)? == GUILD_ID {
        Ok(())
    } else {
        Err(Refusal::unknown_guild())
    }
}

/// The bot needs MANAGE_CHANNELS (and for overwrites MANAGE_ROLES); one switch denies both.
pub(super) fn manage_channels(state: &State) -> Result<(), Refusal> {
    if state.deny_manage_channels { Err(Refusal::missing_permissions()) } else { Ok(()) }
}

/// A snowflake in a JSON body: a string of digits (as Discord sends them) or a number.
pub(super) fn snowflake_value(field: &str, value: &Value) -> Result<u64, Refusal> {
    let parsed = match value {
        Value::String(s) => s.parse::<u64>().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    };
    parsed.ok_or_else(|| {
        let raw = value.as_str().map_or_else(|| value.to_string(), str::to_string);
        Refusal::form(field, "NUMBER_TYPE_COERCE", &format!("Value \"{raw}\" is not snowflake."))
    })
}

/// A permission bitfield: a string of a decimal number (as Discord sends them) or a number;
/// absent or null is 0.
pub(super) fn permission_bits(field: &str, value: Option<&Value>) -> Result<u64, Refusal> {
    let parsed = match value {
        None | Some(Value::Null) => Some(0),
        Some(Value::String(s)) => s.parse::<u64>().ok(),
        Some(Value::Number(n)) => n.as_u64(),
        Some(_) => None,
    };
    parsed.ok_or_else(|| {
        let raw = value.map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
        let raw = raw.unwrap_or_default();
        Refusal::form(field, "NUMBER_TYPE_COERCE", &format!("Value \"{raw}\" is not int."))
    })
}

/// An overwrite's `type`, `allow` and `deny` from `body` (fields under `prefix`).
pub(super) fn overwrite_from(prefix: &str, id: u64, body: &Value) -> Result<Overwrite, Refusal> {
    let kind = match body.get("type") {
        None | Some(Value::Null) => {
            return Err(Refusal::form(
                &format!("{prefix}type"),
                "BASE_TYPE_REQUIRED",
                "This field is required",
            ));
        }
        Some(kind) => match kind.as_u64() {
            Some(0) => OVERWRITE_ROLE,
            Some(1) => OVERWRITE_MEMBER,
            _ => {
                return Err(Refusal::form(
                    &format!("{prefix}type"),
                    "BASE_TYPE_CHOICES",
                    "Value must be one of {0, 1}.",
                ));
            }
        },
    };
    let allow = permission_bits(&format!("{prefix}allow"), body.get("allow"))?;
    let deny = permission_bits(&format!("{prefix}deny"), body.get("deny"))?;
    Ok(Overwrite { id, kind, allow, deny })
}

/// A `permission_overwrites` array of a create or modify: each entry `{id, type, allow, deny}`.
pub(super) fn overwrites_from(value: &Value) -> Result<Vec<Overwrite>, Refusal> {
    let Some(entries) = value.as_array() else {
        return Err(Refusal::form("permission_overwrites", "BASE_TYPE_ARRAY", "Must be an array."));
    };
    let mut overwrites: Vec<Overwrite> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let prefix = format!("permission_overwrites.{i}.");
        let id = match entry.get("id") {
            None | Some(Value::Null) => {
                return Err(Refusal::form(
                    &format!("{prefix}id"),
                    "BASE_TYPE_REQUIRED",
                    "This field is required",
                ));
            }
            Some(id) => snowflake_value(&format!("{prefix}id"), id)?,
        };
        let overwrite = overwrite_from(&prefix, id, entry)?;
        overwrites.retain(|o| o.id != id);
        overwrites.push(overwrite);
    }
    Ok(overwrites)
}

/// A channel or category name: 1–[`MAX_CHANNEL_NAME_CHARS`] characters.
pub(super) fn channel_name(value: Option<&Value>) -> Result<String, Refusal> {
    let name = match value {
        None | Some(Value::Null) => {
            return Err(Refusal::form("name", "BASE_TYPE_REQUIRED", "This field is required"));
        }
        Some(Value::String(name)) => name,
        Some(other) => {
            return Err(Refusal::form(
                "name",
                "BASE_TYPE_STRING",
                &format!("Could not interpret \"{other}\" as string."),
            ));
        }
    };
    if !(1..=MAX_CHANNEL_NAME_CHARS).contains(&name.trim().chars().count()) {
        return Err(Refusal::form(
            "name",
            "BASE_TYPE_BAD_LENGTH",
            &format!("Must be between 1 and {MAX_CHANNEL_NAME_CHARS} in length."),
        ));
    }
    Ok(name.clone())
}

/// The `parent_id` of a channel of type `kind` (`channel_id` when it exists already): null, or
/// a category of the guild with room for one more channel.
pub(super) fn parent_for(
    state: &State,
    value: &Value,
    kind: u8,
    channel_id: Option<u64>,
) -> Result<Option<u64>, Refusal> {
    if value.is_null() {
        return Ok(None);
    }
    let parent = snowflake_value("parent_id", value)?;
    if kind == CHANNEL_TYPE_CATEGORY {
        return Err(Refusal::form(
            "parent_id",
            "CHANNEL_PARENT_INVALID_TYPE",
            "A category cannot have a parent category.",
        ));
    }
    if state.channels.get(&parent).is_none_or(|c| c.kind != CHANNEL_TYPE_CATEGORY) {
        return Err(Refusal::form(
            "parent_id",
            "CHANNEL_PARENT_INVALID",
            "Category does not exist.",
        ));
    }
    let children = state
        .channels
        .iter()
        .filter(|(id, c)| c.parent_id == Some(parent) && Some(**id) != channel_id)
        .count();
    if children >= MAX_CHANNELS_PER_CATEGORY {
        return Err(Refusal::form(
            "parent_id",
            "CHANNEL_PARENT_MAX_CHANNELS",
            &format!(
                "Maximum number of channels in category reached ({MAX_CHANNELS_PER_CATEGORY})"
            ),
        ));
    }
    Ok(Some(parent))
}

/// A `position`: a non-negative integer.
pub(super) fn position_from(value: &Value) -> Result<usize, Refusal> {
    value.as_u64().and_then(|p| usize::try_from(p).ok()).ok_or_else(|| {
        Refusal::form("position", "NUMBER_TYPE_COERCE", &format!("Value \"{value}\" is not int."))
    })
}

/// `POST /guilds/{id}/channels` (Create Guild Channel): a text channel or a category; 201 with
/// the channel, `CHANNEL_CREATE` dispatched. Without `permission_overwrites` a channel created in
/// a category gets the category's (synced), as on Discord.
pub(super) fn create_channel(
    state: &mut State,
    guild: &str,
    body: &Value,
) -> Result<Reply, Refusal> {
    guild_param(guild)?;
    manage_channels(state)?;
    let name = channel_name(body.get("name"))?;
    let kind = match body.get("type") {
        None | Some(Value::Null) => CHANNEL_TYPE_TEXT,
        Some(kind) => match kind.as_u64() {
            Some(0) => CHANNEL_TYPE_TEXT,
            Some(4) => CHANNEL_TYPE_CATEGORY,
            _ => {
                return Err(Refusal::form(
                    "type",
                    "BASE_TYPE_CHOICES",
                    "fake Discord: only channel types 0 (GUILD_TEXT) and 4 (GUILD_CATEGORY) are \
                     supported.",
                ));
            }
        },
    };
    let parent_id = parent_for(state, body.get("parent_id").unwrap_or(&Value::Null), kind, None)?;
    let overwrites = match body.get("permission_overwrites") {
        None | Some(Value::Null) => parent_id
            .and_then(|p| state.channels.get(&p))
            .map(|p| p.overwrites.clone())
            .unwrap_or_default(),
        Some(value) => overwrites_from(value)?,
    };
    let position = match body.get("position") {
        None | Some(Value::Null) => state.next_position(kind),
        Some(value) => position_from(value)?,
    };
    let id = state.snowflake();
    let mut channel = Channel::new(&name, kind, position);
    channel.parent_id = parent_id;
    channel.overwrites = overwrites;
    let json = channel_json(id, &channel, None);
    state.channels.insert(id, channel);
    state.dispatch_channel("CHANNEL_CREATE", id);
    Ok(Reply { status: 201, body: Some(json), headers: Vec::new() })
}

/// `PATCH /channels/{id}` (Modify Channel): `name`, `parent_id`, `position`,
/// `permission_overwrites` (replacing them all) applied together or not at all; other fields
/// are accepted and ignored; `type` cannot change. 200 with the channel, `CHANNEL_UPDATE`
/// dispatched.
pub(super) fn modify_channel(state: &mut State, id: &str, body: &Value) -> Result<Reply, Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let channel = state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    if channel.is_dm() {
        return Err(Refusal::dm_channel());
    }
    manage_channels(state)?;
    if !body.is_object() {
        return Err(Refusal::new(400, 50109, "The request body contains invalid JSON."));
    }
    let kind = channel.kind;
    let wanted = body.get("type").filter(|t| !t.is_null());
    if wanted.is_some_and(|t| t.as_u64() != Some(u64::from(kind))) {
        return Err(Refusal::form(
            "type",
            "BASE_TYPE_CHOICES",
            "fake Discord: a channel's type cannot change.",
        ));
    }
    let name = body.get("name").map(|n| channel_name(Some(n))).transpose()?;
    let parent_id = body.get("parent_id").map(|p| parent_for(state, p, kind, Some(channel_id)));
    let parent_id = parent_id.transpose()?;
    let position = body.get("position").filter(|p| !p.is_null()).map(position_from).transpose()?;
    let overwrites = body.get("permission_overwrites").filter(|o| !o.is_null());
    let overwrites = overwrites.map(overwrites_from).transpose()?;
    let Some(channel) = state.channels.get_mut(&channel_id) else {
        return Err(Refusal::unknown_channel());
    };
    if let Some(name) = name {
        channel.name = name;
    }
    if let Some(parent_id) = parent_id {
        channel.parent_id = parent_id;
    }
    if let Some(position) = position {
        channel.position = position;
    }
    if let Some(overwrites) = overwrites {
        channel.overwrites = overwrites;
    }
    state.dispatch_channel("CHANNEL_UPDATE", channel_id);
    let channel = state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    Ok(Reply::ok(state.channel_json(channel_id, channel)))
}

/// `PUT /channels/{id}/permissions/{overwrite id}` (Edit Channel Permissions): sets (adds or
/// replaces) the overwrite; 204, `CHANNEL_UPDATE` dispatched.
pub(super) fn edit_permissions(
    state: &mut State,
    id: &str,
    target: &str,
    body: &Value,
) -> Result<Reply, Refusal> {
    let (channel_id, target) = overwrite_place(state, id, target)?;
    let overwrite = overwrite_from("", target, body)?;
    let Some(channel) = state.channels.get_mut(&channel_id) else {
        return Err(Refusal::unknown_channel());
    };
    match channel.overwrites.iter_mut().find(|o| o.id == target) {
        Some(existing) => *existing = overwrite,
        None => channel.overwrites.push(overwrite),
    }
    state.dispatch_channel("CHANNEL_UPDATE", channel_id);
    Ok(Reply::no_content())
}

/// The channel and overwrite ids of a permission overwrite's path, once the channel is known to
/// be a guild channel the bot may manage.
fn overwrite_place(state: &State, id: &str, target: &str) -> Result<(u64, u64), Refusal> {
    let channel_id = snowflake_param("channel_id", id)?;
    let target = snowflake_param("overwrite_id", target)?;
    let channel = state.channels.get(&channel_id).ok_or_else(Refusal::unknown_channel)?;
    if channel.is_dm() {
        return Err(Refusal::dm_channel());
    }
    manage_channels(state)?;
    Ok((channel_id, target))
}

/// `DELETE /channels/{id}/permissions/{overwrite id}` (Delete Channel Permission): 204,
/// `CHANNEL_UPDATE` dispatched; 10009 when the channel has no such overwrite.
pub(super) fn delete_permission(
    state: &mut State,
    id: &str,
    target: &str,
) -> Result<Reply, Refusal> {
    let (channel_id, target) = overwrite_place(state, id, target)?;
    let Some(channel) = state.channels.get_mut(&channel_id) else {
        return Err(Refusal::unknown_channel());
    };
    let before = channel.overwrites.len();
    channel.overwrites.retain(|o| o.id != target);
    if channel.overwrites.len() == before {
        return Err(Refusal::unknown_overwrite());
    }
    state.dispatch_channel("CHANNEL_UPDATE", channel_id);
    Ok(Reply::no_content())
}

/// `/webhooks/{id}/{token}`: execute (POST), get (GET) or delete (DELETE) with the token.
pub(super) fn webhook_with_token(
    state: &mut State,
    request: &Request,
    id: &str,
    token: &str,
    body: &Value,
) -> Result<Reply, Refusal> {
    let id = snowflake_param("webhook_id", id)?;
    let hook = state.webhooks.iter().find(|h| h.id == id && h.token == token && !h.deleted);
    let hook = hook.cloned().ok_or_else(Refusal::unknown_webhook)?;
    match request.method.as_str() {
        "GET" => return Ok(Reply::ok(hook.to_json(false))),
        "DELETE" => {
            if let Some(h) = state.webhooks.iter_mut().find(|h| h.id == id) {
                h.deleted = true;
            }
            return Ok(Reply::no_content());
        }
        "POST" => {}
        _ => return Err(Refusal::new(405, 0, "405: Method Not Allowed")),
    }
    rate_limited(state)?;
    let username = match &body["username"] {
        Value::Null => hook.name.clone(),
        Value::String(name) => {
            check_webhook_name("username", name)?;
            name.clone()
        }
        _ => {
            return Err(Refusal::form(
                "username",
                "STRING_TYPE_CONVERT",
                "Could not interpret value as string.",
            ));
        }
    };
    let content = checked_content(body)?;
    let allowed = allowed_mentions(body);
    let mentions = state.mentions(&content, allowed.as_ref());
    let message_id = state.snowflake();
    let author = json!({
        "id": hook.id.to_string(),
        "username": username,
        "avatar": null,
        "discriminator": "0000",
        "public_flags": 0,
        "flags": 0,
        "bot": true,
        "global_name": null,
    });
    let json =
        message_json(message_id, hook.channel_id, author, &content, &mentions, Some(hook.id));
    let meta = DiscordMessage {
        id: message_id,
        channel_id: hook.channel_id,
        author_id: hook.id,
        username,
        content,
        webhook_id: Some(hook.id),
        allowed_mentions: allowed,
        reply_to: None,
    };
    state.store(StoredMessage { meta, json: json.clone(), by_bot: true }, true);
    let wait = query_params(request).get("wait").is_some_and(|w| w.eq_ignore_ascii_case("true"));
    Ok(if wait { Reply::ok(json) } else { Reply::no_content() })
}

/// `/webhooks/{id}/{token}/messages/{message.id}`: get (GET), edit (PATCH) or delete (DELETE) a
/// message the webhook sent. A wrong or deleted webhook or token is 10015; a message it did not
/// send (the bot's, a person's, another webhook's, or none) 10008. `thread_id` (serenity writes
/// `?&thread_id=…`) must name the webhook's channel: the fake has no threads (else 10003).
pub(super) fn webhook_message(
    state: &mut State,
    request: &Request,
    (id, token): (&str, &str),
    message: &str,
    body: &Value,
) -> Result<Reply, Refusal> {
    let id = snowflake_param("webhook_id", id)?;
    let hook = state.webhooks.iter().find(|h| h.id == id && h.token == token && !h.deleted);
    let channel_id = hook.map(|h| h.channel_id).ok_or_else(Refusal::unknown_webhook)?;
    let message_id = snowflake_param("message_id", message)?;
    if let Some(thread) = query_params(request).get("thread_id")
        && snowflake_param("thread_id", thread)? != channel_id
    {
        return Err(Refusal::unknown_channel());
    }
    let found = state.find(channel_id, message_id).filter(|m| m.meta.webhook_id == Some(id));
    let found = found.ok_or_else(Refusal::unknown_message)?;
    match request.method.as_str() {
        "GET" => Ok(Reply::ok(found.json.clone())),
        "PATCH" => apply_edit(state, channel_id, message_id, body),
        "DELETE" => Ok(apply_delete(state, channel_id, message_id)),
        _ => Err(Refusal::new(405, 0, "405: Method Not Allowed")),
    }
}
