//! The Web API over HTTP: connections kept alive, tokens, parameters from JSON, forms or the query, rate limits and scripted failures, one handler per method.

use super::*;

/// Serves connections until `stop`, and redelivers what was not acknowledged in time.
pub(super) async fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    stop: oneshot::Receiver<()>,
) {
    let accept = http1::accept_until(listener, stop, |stream| {
        connection(Conn::new(stream), Arc::clone(&shared))
    });
    // Every 20 ms: envelopes unacknowledged for the ack timeout become due again.
    let ack_timeouts = async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let changed = shared.state().check_timeouts(Instant::now());
            if changed {
                shared.changed.notify_all();
            }
        }
    };
    tokio::select! {
        () = accept => {}
        () = ack_timeouts => {}
    }
}

/// An HTTP answer: status, body (JSON when `json`) and extra headers.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) body: String,
    pub(super) json: bool,
    pub(super) headers: Vec<(String, String)>,
}

impl Reply {
    pub(super) fn bare(status: u16) -> Reply {
        Reply { status, body: String::new(), json: false, headers: Vec::new() }
    }
}

/// Serves requests on one connection until either side closes it, or hands it to Socket Mode
/// when it asks for a WebSocket upgrade.
pub(super) async fn connection(conn: Conn<TcpStream>, shared: Arc<Shared>) {
    let served = Arc::clone(&shared);
    let upgrade = |conn, request| upgrade_to_socket(conn, request, shared);
    http1::serve(conn, |request| respond(&served, request).answer(), upgrade).await;
}

impl Reply {
    /// The answer written: its body (Slack's JSON content type when `json`) with its extra
    /// headers.
    pub(super) fn answer(&self) -> http1::Answer {
        http1::Answer {
            status: self.status,
            content_type: self.json.then_some("application/json; charset=utf-8"),
            headers: self.headers.clone(),
            body: self.body.clone(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Web API

/// The token of a request: `Authorization: Bearer …`, else a `token` parameter.
pub(super) fn request_token(request: &Request, params: &Map<String, Value>) -> Option<String> {
    let bearer = request
        .header("authorization")
        .and_then(|a| a.strip_prefix("Bearer ").or_else(|| a.strip_prefix("bearer ")))
        .map(|t| t.trim().to_string());
    bearer.or_else(|| params.get("token").and_then(Value::as_str).map(str::to_string))
}

/// The parameters of a request: the query, then the body (JSON object or form-encoded).
pub(super) fn request_params(request: &Request) -> Result<Map<String, Value>, Refusal> {
    let mut params = Map::new();
    for (name, value) in http1::form_pairs(&request.query) {
        params.insert(name, Value::String(value));
    }
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(params);
    }
    let content_type = request.header("content-type").unwrap_or("").to_ascii_lowercase();
    if content_type.starts_with("application/json") {
        match serde_json::from_slice(&request.body) {
            Ok(Value::Object(body)) => params.extend(body),
            _ => return Err(Refusal::api("invalid_json")),
        }
    } else if content_type.starts_with("multipart/") {
        return Err(Refusal::api("invalid_form_data"));
    } else {
        let body = String::from_utf8_lossy(&request.body);
        for (name, value) in http1::form_pairs(&body) {
            params.insert(name, Value::String(value));
        }
    }
    Ok(params)
}

/// A string parameter (numbers and booleans as their text; empty strings as absent).
pub(super) fn str_param(params: &Map<String, Value>, name: &str) -> Option<String> {
    match params.get(name)? {
        Value::String(s) if s.is_empty() => None,
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A boolean parameter (`true`/`false`, or form-encoded `"true"`, `"1"`, …).
pub(super) fn bool_param(params: &Map<String, Value>, name: &str) -> Option<bool> {
    match params.get(name)? {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "true" | "1" => Some(true),
            "false" | "0" => Some(false),
            _ => None,
        },
        Value::Number(n) => n.as_u64().map(|n| n != 0),
        _ => None,
    }
}

/// A JSON-valued parameter (`blocks`, `attachments`): as sent in a JSON body, parsed when
/// form-encoded.
pub(super) fn json_param(params: &Map<String, Value>, name: &str) -> Option<Value> {
    match params.get(name)? {
        Value::String(s) => serde_json::from_str(s).ok(),
        Value::Null => None,
        other => Some(other.clone()),
    }
}

/// Answers one Web API request, recording it (and the refusal, if any).
pub(super) fn respond(shared: &Shared, request: &Request) -> Reply {
    let Some(method) = request.path.strip_prefix("/api/") else {
        return Reply::bare(404);
    };
    if request.method != "GET" && request.method != "POST" {
        return Reply::bare(405);
    }
    let mut state = shared.state();
    let result = request_params(request).and_then(|mut params| {
        let token = request_token(request, &params);
        params.remove("token");
        state.requests.push((method.to_string(), Value::Object(params.clone())));
        call(shared, &mut state, method, token.as_deref(), &params)
    });
    let reply = match result {
        Ok(fields) => {
            let mut body = Map::new();
            body.insert("ok".into(), json!(true));
            body.extend(fields);
            Reply {
                status: 200,
                body: Value::Object(body).to_string(),
                json: true,
                headers: vec![],
            }
        }
        Err(refusal) => {
            state.refused.push((method.to_string(), refusal.error.clone()));
            Reply {
                status: refusal.status,
                body: json!({"ok": false, "error": refusal.error}).to_string(),
                json: true,
                headers: refusal.headers,
            }
        }
    };
    drop(state);
    shared.changed.notify_all();
    reply
}

pub(super) const METHODS: [&str; 13] = [
    "apps.connections.open",
    "auth.test",
    "chat.delete",
    "chat.postMessage",
    "chat.update",
    "conversations.archive",
    "conversations.create",
    "conversations.history",
    "conversations.info",
    "conversations.join",
    "reactions.add",
    "reactions.remove",
    "users.info",
];

/// One Web API method: the fields of the `ok: true` answer, or the refusal.
pub(super) fn call(
    shared: &Shared,
    state: &mut State,
    method: &str,
    token: Option<&str>,
    params: &Map<String, Value>,
) -> Result<Map<String, Value>, Refusal> {
    if !METHODS.contains(&method) {
        return Err(Refusal::api("unknown_method"));
    }
    let wants_app = method == "apps.connections.open";
    match token {
        None => return Err(Refusal::api("not_authed")),
        Some(APP_TOKEN) if wants_app => {}
        Some(BOT_TOKEN) if !wants_app => {}
        Some(APP_TOKEN | BOT_TOKEN) => return Err(Refusal::api("not_allowed_token_type")),
        Some(_) => return Err(Refusal::api("invalid_auth")),
    }
    let fields = match method {
        "apps.connections.open" => {
            let ticket = uuid();
            state.tickets.insert(ticket.clone());
            state.connections_opened += 1;
            json!({"url": format!("ws://{}/link/?ticket={ticket}&app_id={APP_ID}", shared.addr)})
        }
        "auth.test" => json!({
            "url": "https://fake.slack.com/",
            "team": TEAM_NAME,
            "user": BOT_NAME,
            "team_id": TEAM_ID,
            "user_id": BOT_USER_ID,
            "bot_id": BOT_ID,
            "is_enterprise_install": false,
        }),
        "chat.postMessage" => post_message(state, params)?,
        "chat.update" => update_message(state, params)?,
        "chat.delete" => delete_message(state, params)?,
        "conversations.history" => history(state, params)?,
        "conversations.archive" => {
            // As Slack checks: the channel (no IM), the scope, archived already, the bot a
            // member.
            let id = param_channel(state, params)?;
            state.not_for_ims(&id)?;
            state.need_scope(state.manage_scope(&id))?;
            if state.channels[&id].archived {
                return Err(Refusal::api("already_archived"));
            }
            member(state, &id)?;
            if let Some(c) = state.channels.get_mut(&id) {
                c.archived = true;
            }
            state.archived.push(id);
            json!({})
        }
        "conversations.create" => create_channel(state, params)?,
        "conversations.info" => {
            let id = param_channel(state, params)?;
            json!({"channel": channel_json(&id, &state.channels[&id])})
        }
        "conversations.join" => {
            let id = param_channel(state, params)?;
            state.not_for_ims(&id)?;
            let channel =
                state.channels.get_mut(&id).ok_or_else(|| Refusal::api("channel_not_found"))?;
            let already = std::mem::replace(&mut channel.bot_member, true);
            let mut fields = json!({"channel": channel_json(&id, channel)});
            if already {
                fields["warning"] = json!("already_in_channel");
                fields["response_metadata"] = json!({"warnings": ["already_in_channel"]});
            }
            fields
        }
        "reactions.add" => react(state, params, true)?,
        "reactions.remove" => react(state, params, false)?,
        "users.info" => {
            let user = str_param(params, "user").unwrap_or_default();
            let name = state.users.get(&user).ok_or_else(|| Refusal::api("user_not_found"))?;
            json!({"user": user_json(&user, name)})
        }
        _ => return Err(Refusal::api("unknown_method")),
    };
    match fields {
        Value::Object(fields) => Ok(fields),
        _ => Ok(Map::new()),
    }
}

/// The channel id of the `channel` parameter (`channel_not_found` when unknown).
pub(super) fn param_channel(state: &State, params: &Map<String, Value>) -> Result<String, Refusal> {
    let raw = str_param(params, "channel").unwrap_or_default();
    state.channel_id(&raw).ok_or_else(|| Refusal::api("channel_not_found"))
}

/// The bot must be a member of the channel.
pub(super) fn member(state: &State, channel: &str) -> Result<(), Refusal> {
    if state.channels.get(channel).is_some_and(|c| c.bot_member) {
        Ok(())
    } else {
        Err(Refusal::api("not_in_channel"))
    }
}

/// `text` of a message-writing call: present unless there are blocks or attachments, at most
/// [`MAX_TEXT_CHARS`] characters.
pub(super) fn checked_text(params: &Map<String, Value>) -> Result<String, Refusal> {
    let text = str_param(params, "text").unwrap_or_default();
    let has = |name: &str| {
        json_param(params, name).is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty()))
    };
    if text.is_empty() && !has("blocks") && !has("attachments") {
        return Err(Refusal::api("no_text"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(Refusal::api("msg_too_long"));
    }
    Ok(text)
}

/// `conversations.create`: checks as Slack does (the scope, the name, the name free), then a new
/// channel with the bot (its creator) a member.
pub(super) fn create_channel(
    state: &mut State,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let name = str_param(params, "name").unwrap_or_default();
    let private = bool_param(params, "is_private").unwrap_or(false);
    state.need_scope(if private { "groups:write" } else { "channels:manage" })?;
    if name.is_empty() {
        return Err(Refusal::api("invalid_name_required"));
    }
    if name.chars().count() > MAX_CHANNEL_NAME_CHARS {
        return Err(Refusal::api("invalid_name_maxlength"));
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_';
    if !name.chars().all(allowed) {
        return Err(Refusal::api("invalid_name_specials"));
    }
    if state.channels.values().any(|c| c.name == name) {
        return Err(Refusal::api("name_taken"));
    }
    let id = loop {
        let id = format!("C{}", random_string(10, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"));
        if !state.channels.contains_key(&id) {
            break id;
        }
    };
    let channel = Channel {
        name,
        bot_member: true,
        archived: false,
        private,
        im_user: None,
        created: now_micros() / 1_000_000,
        creator: BOT_USER_ID.to_string(),
    };
    let fields = json!({"channel": channel_json(&id, &channel)});
    state.channels.insert(id, channel);
    Ok(fields)
}

/// `chat.postMessage`.
pub(super) fn post_message(
    state: &mut State,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    if let Some(retry_after) = state.rate_limits.pop_front() {
        return Err(Refusal {
            status: 429,
            error: "ratelimited".into(),
            headers: vec![("Retry-After".into(), retry_after.to_string())],
        });
    }
    if let Some(error) = state.failures.pop_front() {
        return Err(Refusal::api(&error));
    }
    // A person's user id as `channel` posts in the bot's IM with them.
    let raw = str_param(params, "channel").unwrap_or_default();
    let im = state.channels.iter().find(|(_, c)| c.im_user.as_deref() == Some(raw.as_str()));
    let channel = match im {
        Some((id, _)) => id.clone(),
        None => param_channel(state, params)?,
    };
    member(state, &channel)?;
    if state.channels[&channel].archived {
        return Err(Refusal::api("is_archived"));
    }
    let text = checked_text(params)?;
    let username = str_param(params, "username");
    let icon_emoji = str_param(params, "icon_emoji");
    let icon_url = str_param(params, "icon_url");
    let customize = !state.denied_scopes.contains("chat:write.customize");
    let applied = username.as_ref().filter(|_| customize);
    let ts = state.next_ts();
    let blocks = json_param(params, "blocks").unwrap_or_else(|| json!([]));
    let mut message = json!({
        "type": "message",
        "text": text,
        "ts": ts,
        "bot_id": BOT_ID,
        "app_id": APP_ID,
        "blocks": blocks,
    });
    if let Some(name) = applied {
        message["subtype"] = json!("bot_message");
        message["username"] = json!(name);
        let mut icons = Map::new();
        if let Some(emoji) = icon_emoji.as_ref() {
            icons.insert("emoji".into(), json!(emoji));
        }
        if let Some(url) = icon_url.as_ref() {
            icons.insert("image_48".into(), json!(url));
        }
        if !icons.is_empty() {
            message["icons"] = Value::Object(icons);
        }
    } else {
        message["user"] = json!(BOT_USER_ID);
        message["team"] = json!(TEAM_ID);
        message["bot_profile"] = bot_profile();
    }
    if let Some(attachments) = json_param(params, "attachments") {
        message["attachments"] = attachments;
    }
    let thread_ts = str_param(params, "thread_ts");
    if let Some(thread) = thread_ts.as_ref() {
        message["thread_ts"] = json!(thread);
    }
    state.sent.push(SlackSent {
        channel: channel.clone(),
        ts: ts.clone(),
        text,
        username_applied: applied.is_some(),
        username,
        mrkdwn: bool_param(params, "mrkdwn"),
        icon_emoji,
        icon_url,
        unfurl_links: bool_param(params, "unfurl_links"),
        unfurl_media: bool_param(params, "unfurl_media"),
        thread_ts,
    });
    let event = message_event(&message, &channel, state.channel_type(&channel));
    state.messages.push(StoredMessage {
        channel: channel.clone(),
        ts: ts.clone(),
        json: message.clone(),
        by_bot: true,
        deleted: false,
    });
    state.emit(&channel, event);
    Ok(json!({"channel": channel, "ts": ts, "message": message}))
}

/// The bot's own message `ts` of the call's channel, for `chat.update` / `chat.delete`.
pub(super) fn own_message(
    state: &mut State,
    params: &Map<String, Value>,
    not_own: &str,
) -> Result<(String, String), Refusal> {
    let channel = param_channel(state, params)?;
    let ts = str_param(params, "ts").unwrap_or_default();
    let message =
        state.find_message(&channel, &ts).ok_or_else(|| Refusal::api("message_not_found"))?;
    if !message.by_bot {
        return Err(Refusal::api(not_own));
    }
    Ok((channel, ts))
}

/// `chat.update`: the bot edits its own message.
pub(super) fn update_message(
    state: &mut State,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let (channel, ts) = own_message(state, params, "cant_update_message")?;
    let text = checked_text(params)?;
    state.edit(&channel, &ts, &text);
    state.changes.push(SlackChange {
        channel: channel.clone(),
        ts: ts.clone(),
        text: Some(text.clone()),
    });
    let message = state.find_message(&channel, &ts).map(|m| m.json.clone()).unwrap_or_default();
    Ok(json!({"channel": channel, "ts": ts, "text": text, "message": message}))
}

/// `chat.delete`: the bot deletes its own message.
pub(super) fn delete_message(
    state: &mut State,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let (channel, ts) = own_message(state, params, "cant_delete_message")?;
    state.delete(&channel, &ts);
    state.changes.push(SlackChange { channel: channel.clone(), ts: ts.clone(), text: None });
    Ok(json!({"channel": channel, "ts": ts}))
}

/// `reactions.add` (`add`) or `reactions.remove` of the bot's reaction `name` on message
/// `timestamp` of `channel`, checked as Slack does: the item given, the name (not empty, no
/// colons: Slack takes `thumbsup`, not `:thumbsup:`; a `::skin-tone-N` suffix is allowed), the
/// channel, the timestamp, the message, the channel not archived (add), then the reaction
/// there already (`already_reacted`) or not (`no_reaction`). The bot's reactions show in the
/// message's `reactions` (`{name, users, count}`); no `reaction_added` events are sent (the app
/// is not subscribed to them).
pub(super) fn react(
    state: &mut State,
    params: &Map<String, Value>,
    add: bool,
) -> Result<Value, Refusal> {
    let (Some(raw), Some(ts)) = (str_param(params, "channel"), str_param(params, "timestamp"))
    else {
        return Err(Refusal::api("no_item_specified"));
    };
    let name = str_param(params, "name").unwrap_or_default();
    let (base, tone) = name.split_once("::").unwrap_or((name.as_str(), ""));
    let name_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_+-'".contains(c);
    let tone_ok = tone.is_empty()
        || tone
            .strip_prefix("skin-tone-")
            .is_some_and(|n| matches!(n, "2" | "3" | "4" | "5" | "6"));
    if base.is_empty() || !base.chars().all(name_char) || !tone_ok {
        return Err(Refusal::api("invalid_name"));
    }
    let channel = state.channel_id(&raw).ok_or_else(|| Refusal::api("channel_not_found"))?;
    if ts_micros(&ts).is_none() {
        return Err(Refusal::api("bad_timestamp"));
    }
    let archived = state.channels.get(&channel).is_some_and(|c| c.archived);
    let message =
        state.find_message(&channel, &ts).ok_or_else(|| Refusal::api("message_not_found"))?;
    if add && archived {
        return Err(Refusal::api("is_archived"));
    }
    let mut reactions = message.json["reactions"].as_array().cloned().unwrap_or_default();
    let at = reactions.iter().position(|r| r["name"] == json!(name));
    let mine = at.is_some_and(|i| {
        reactions[i]["users"].as_array().is_some_and(|u| u.iter().any(|u| u == BOT_USER_ID))
    });
    match (add, at) {
        (true, _) if mine => return Err(Refusal::api("already_reacted")),
        (false, _) if !mine => return Err(Refusal::api("no_reaction")),
        (true, Some(i)) => {
            if let Some(users) = reactions[i]["users"].as_array_mut() {
                users.push(json!(BOT_USER_ID));
            }
            reactions[i]["count"] = json!(reactions[i]["count"].as_u64().unwrap_or(0) + 1);
        }
        (true, None) => reactions.push(json!({"name": name, "users": [BOT_USER_ID], "count": 1})),
        (false, Some(i)) => {
            if let Some(users) = reactions[i]["users"].as_array_mut() {
                users.retain(|u| u != BOT_USER_ID);
            }
            let count = reactions[i]["count"].as_u64().unwrap_or(1).saturating_sub(1);
            reactions[i]["count"] = json!(count);
            if count == 0 {
                reactions.remove(i);
            }
        }
        (false, None) => return Err(Refusal::api("no_reaction")),
    }
    match message.json.as_object_mut() {
        Some(m) if reactions.is_empty() => {
            m.remove("reactions");
        }
        _ => message.json["reactions"] = Value::Array(reactions),
    }
    let method = if add { "reactions.add" } else { "reactions.remove" };
    state.reaction_log.push((method.to_string(), channel, ts, name));
    Ok(json!({}))
}

/// `conversations.history`: newest first, after `oldest` and before `latest` (both exclusive
/// unless `inclusive`), at most `limit` (default 100, at most 999).
pub(super) fn history(state: &State, params: &Map<String, Value>) -> Result<Value, Refusal> {
    let channel = param_channel(state, params)?;
    member(state, &channel)?;
    let bound = |name: &str| -> Result<Option<u64>, Refusal> {
        match str_param(params, name) {
            None => Ok(None),
            Some(raw) => {
                ts_micros(&raw).map(Some).ok_or_else(|| Refusal::api(&format!("invalid_ts_{name}")))
            }
        }
    };
    let (oldest, latest) = (bound("oldest")?, bound("latest")?);
    let inclusive = bool_param(params, "inclusive").unwrap_or(false);
    let limit = match str_param(params, "limit") {
        None => 100,
        Some(raw) => match raw.parse::<usize>() {
            Ok(0) => 100,
            Ok(n) => n.min(999),
            Err(_) => return Err(Refusal::api("invalid_limit")),
        },
    };
    let matching: Vec<&StoredMessage> = state
        .messages
        .iter()
        .filter(|m| m.channel == channel && !m.deleted)
        .filter(|m| {
            let ts = ts_micros(&m.ts).unwrap_or(0);
            let after = oldest.is_none_or(|o| if inclusive { ts >= o } else { ts > o });
            let before = latest.is_none_or(|l| if inclusive { ts <= l } else { ts < l });
            after && before
        })
        .collect();
    // The newest `limit` of the range (without `oldest`), or the oldest `limit` after `oldest`
    // (Slack pages forward from `oldest`), newest first either way.
    let picked: Vec<&StoredMessage> = if oldest.is_some() && latest.is_none() {
        matching.iter().take(limit).copied().collect()
    } else {
        matching[matching.len().saturating_sub(limit)..].to_vec()
    };
    let messages: Vec<Value> = picked.iter().rev().map(|m| m.json.clone()).collect();
    Ok(json!({
        "messages": messages,
        "has_more": matching.len() > picked.len(),
        "pin_count": 0,
        "channel_actions_ts": null,
        "channel_actions_count": 0,
    }))
}
