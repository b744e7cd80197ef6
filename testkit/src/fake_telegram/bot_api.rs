//! The Bot API over HTTP: connections kept alive, routing by token and method, parameters from JSON, forms or the query, and one handler per method.

use super::*;

/// Serves requests on one connection until either side closes it (keep-alive).
pub(super) async fn connection(mut conn: Conn<TcpStream>, shared: Arc<Shared>) {
    while let Some(request) = conn.next_request(&response(400, "Bad Request")).await {
        {
            let mut state = shared.state();
            if state.drop_requests > 0 {
                state.drop_requests -= 1;
                state.dropped += 1;
                return;
            }
        }
        let Some((status, body)) = respond(&shared, &mut conn, &request).await else {
            return; // the client went away while its long poll was held
        };
        if !conn.answer(&response(status, &body), request.keep_alive).await {
            return;
        }
    }
}

/// The answer as the real server (nginx in front of the Bot API) sends it.
pub(super) fn response(status: u16, body: &str) -> Response<'_> {
    let content_type = if body.starts_with('{') { "application/json" } else { "text/plain" };
    Response {
        status,
        reason: http1::reason(status),
        headers: vec![("Server", "nginx/1.18.0"), ("Content-Type", content_type)],
        body,
    }
}

// ---------------------------------------------------------------------------------------------
// The Bot API

/// Routes one request and renders Telegram's answer; `None` when the client left while its
/// long poll was held (nothing to answer).
pub(super) async fn respond(
    shared: &Shared,
    conn: &mut Conn<TcpStream>,
    request: &Request,
) -> Option<(u16, String)> {
    let (method, result) = match route(shared, request) {
        Err((method, refusal)) => (method, Err(refusal)),
        Ok(method) => {
            shared.state().calls.push(method.clone());
            let result = match parse_params(request) {
                Err(refusal) => Err(refusal),
                Ok(params) => match method.to_ascii_lowercase().as_str() {
                    "getme" => Ok(get_me(shared)),
                    "getupdates" => get_updates(shared, conn, &params).await?,
                    "sendmessage" => send_message(shared, &params),
                    "editmessagetext" => edit_message_text(shared, &params),
                    "deletemessage" => delete_message(shared, &params),
                    "sendchataction" => send_chat_action(shared, &params),
                    "deletewebhook" => delete_webhook(shared, &params),
                    "getwebhookinfo" => Ok(webhook_info(shared)),
                    _ => Err(Refusal::new(404, "Not Found")),
                },
            };
            (method, result)
        }
    };
    Some(match result {
        Ok(value) => (200, json!({"ok": true, "result": value}).to_string()),
        Err(refusal) => {
            shared.state().rejected.push((method, refusal.status, refusal.description.clone()));
            (refusal.status, refusal.body().to_string())
        }
    })
}

/// `/bot<TOKEN>/<method>` → the method name; a wrong token is 401, anything else 404.
/// Telegram answers GET and POST alike: the HTTP method is not checked.
pub(super) fn route(shared: &Shared, request: &Request) -> Result<String, (String, Refusal)> {
    let not_found = |name: &str| Err((name.to_string(), Refusal::new(404, "Not Found")));
    let Some(rest) = request.path.strip_prefix("/bot") else {
        return not_found(&request.path);
    };
    let Some((token, method)) = rest.split_once('/') else {
        return not_found(&request.path);
    };
    if token != shared.token {
        return Err((method.to_string(), Refusal::new(401, "Unauthorized")));
    }
    if method.is_empty() || method.contains('/') {
        return not_found(method);
    }
    Ok(method.to_string())
}

/// The query string and the body (JSON object or form-encoded) as one map; the body wins.
pub(super) fn parse_params(request: &Request) -> Result<Map<String, Value>, Refusal> {
    let mut params = Map::new();
    parse_form(&request.query, &mut params);
    let content_type = request.header("content-type").unwrap_or("").to_ascii_lowercase();
    if request.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(params);
    }
    if content_type.starts_with("application/json") {
        match serde_json::from_slice::<Value>(&request.body) {
            Ok(Value::Object(body)) => params.extend(body),
            Ok(_) => return Err(Refusal::bad("JSON object expected in the request body")),
            Err(_) => return Err(Refusal::bad("can't parse JSON in the request body")),
        }
    } else if content_type.starts_with("application/x-www-form-urlencoded") {
        parse_form(&String::from_utf8_lossy(&request.body), &mut params);
    } else if content_type.starts_with("multipart/form-data") {
        return Err(Refusal::bad("multipart/form-data is not supported by the fake"));
    }
    Ok(params)
}

pub(super) fn parse_form(form: &str, params: &mut Map<String, Value>) {
    for (name, value) in http1::form_pairs(form) {
        params.insert(name, Value::String(value));
    }
}

/// An integer parameter: a JSON number or a string holding one (as Telegram accepts).
pub(super) fn int_param(params: &Map<String, Value>, name: &str) -> Option<i64> {
    match params.get(name)? {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(super) fn bool_param(params: &Map<String, Value>, name: &str) -> bool {
    match params.get(name) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => matches!(s.trim(), "true" | "True" | "1"),
        Some(Value::Number(n)) => n.as_i64().is_some_and(|n| n != 0),
        _ => false,
    }
}

/// A JSON-serialized parameter: an object/array, or (form values, or JSON bodies alike) a string
/// holding its JSON text. `Some(Err)` when present but not JSON.
pub(super) fn json_param(params: &Map<String, Value>, name: &str) -> Option<Result<Value, ()>> {
    match params.get(name)? {
        Value::Null => None,
        Value::String(s) => Some(serde_json::from_str(s).map_err(|_| ())),
        other => Some(Ok(other.clone())),
    }
}

pub(super) fn get_me(shared: &Shared) -> Value {
    let mut me = shared.bot_user();
    me["can_join_groups"] = json!(true);
    me["can_read_all_group_messages"] = json!(true); // privacy mode off: it sees every message
    me["supports_inline_queries"] = json!(false);
    me["can_connect_to_business"] = json!(false);
    me["has_main_web_app"] = json!(false);
    me
}

/// `getUpdates`: confirms with `offset`, answers what is queued, or holds the request up to
/// `timeout` seconds until an update arrives, a newer `getUpdates` terminates it (409), or the
/// client leaves (`None`).
pub(super) async fn get_updates(
    shared: &Shared,
    conn: &mut Conn<TcpStream>,
    params: &Map<String, Value>,
) -> Option<Result<Value, Refusal>> {
    let offset = int_param(params, "offset");
    let limit = match int_param(params, "limit") {
        Some(n) if n >= 1 => usize::try_from(n.min(100)).unwrap_or(100),
        _ => 100,
    };
    let timeout =
        Duration::from_secs(int_param(params, "timeout").unwrap_or(0).max(0).unsigned_abs());
    let allowed = match json_param(params, "allowed_updates") {
        None => None,
        Some(Ok(Value::Array(types))) => {
            Some(types.iter().filter_map(Value::as_str).map(str::to_string).collect::<Vec<_>>())
        }
        Some(_) => return Some(Err(Refusal::bad("can't parse allowed updates"))),
    };
    let me = {
        let mut state = shared.state();
        state.offsets.push(offset);
        if let Some(offset) = offset {
            state.confirm(offset);
        }
        if let Some(types) = allowed {
            state.allowed_updates = if types.is_empty() { None } else { Some(types) };
        }
        state.poll_seq += 1;
        let me = state.poll_seq;
        state.active_poll = Some(me); // terminates any held older poll
        me
    };
    shared.bump();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut changes = shared.changes.subscribe();
        {
            let mut state = shared.state();
            if state.active_poll != Some(me) {
                return Some(Err(Refusal::new(409, CONFLICT)));
            }
            let updates: Vec<Value> =
                state.updates.iter().take(limit).map(Update::to_json).collect();
            if !updates.is_empty() || tokio::time::Instant::now() >= deadline {
                state.active_poll = None;
                return Some(Ok(Value::Array(updates)));
            }
        }
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep_until(deadline) => {}
            more = conn.fill() => {
                if !more {
                    let mut state = shared.state();
                    if state.active_poll == Some(me) {
                        state.active_poll = None;
                    }
                    return None;
                }
            }
        }
    }
}

/// `chat_id`: an integer, or a string holding one (`@channelusername` finds nothing here).
pub(super) fn chat_param(state: &State, params: &Map<String, Value>) -> Result<i64, Refusal> {
    let id = match params.get("chat_id") {
        None | Some(Value::Null) => return Err(Refusal::bad("chat_id is empty")),
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(Refusal::bad("chat_id is empty"));
        }
        Some(_) => int_param(params, "chat_id"),
    };
    id.filter(|id| state.chats.contains_key(id)).ok_or_else(|| Refusal::bad("chat not found"))
}

/// `sendMessage`, checking in the order of the Bot API server: the text and its markup, then
/// the chat, then what Telegram checks when it sends (emptiness after trimming, length, the
/// message replied to).
pub(super) fn send_message(shared: &Shared, params: &Map<String, Value>) -> Result<Value, Refusal> {
    let mut state = shared.state();
    if let Some(fault) = state.faults.pop_front() {
        return Err(Refusal {
            status: fault.status,
            description: fault.description,
            retry_after: fault.retry_after,
        });
    }
    let (text, parse_mode, formatted) = message_text(params)?;
    // The message it answers, if any (`reply_parameters`, or the older `reply_to_message_id`).
    let (reply_to, allow_without_reply) = match json_param(params, "reply_parameters") {
        Some(Ok(Value::Object(reply))) => (
            Some(reply.get("message_id").and_then(Value::as_i64).unwrap_or(0)),
            reply.get("allow_sending_without_reply") == Some(&json!(true)),
        ),
        Some(_) => return Err(Refusal::bad("can't parse reply parameters JSON object")),
        None => (
            int_param(params, "reply_to_message_id"),
            bool_param(params, "allow_sending_without_reply"),
        ),
    };
    let chat_id = chat_param(&state, params)?;
    check_length(&formatted)?;
    let bot = shared.bot_user();
    let chat = state.chats.get(&chat_id).expect("chat_param checked the chat exists");
    let replied = reply_to.and_then(|id| chat.messages.get(&id)).cloned();
    if reply_to.is_some() && replied.is_none() && !allow_without_reply {
        return Err(Refusal::bad("message to be replied not found"));
    }
    let message_id = state.new_message_id(chat_id);
    let chat = state.chats.get_mut(&chat_id).expect("chat_param checked the chat exists");
    let mut message = json!({
        "message_id": message_id,
        "from": bot,
        "chat": chat.json,
        "date": unix_now(),
        "text": formatted.text,
    });
    if !formatted.entities.is_empty() {
        message["entities"] =
            Value::Array(formatted.entities.iter().map(Entity::to_json).collect());
    }
    // Kept without `reply_to_message`: Telegram does not nest replies further.
    chat.messages.insert(message_id, message.clone());
    let reply_to = replied.as_ref().and_then(|m| m["message_id"].as_i64());
    if let Some(replied) = replied {
        message["reply_to_message"] = replied;
    }
    state.sent.push(SentMessage {
        chat_id,
        message_id,
        text,
        parse_mode,
        plain: formatted.text,
        entities: formatted.entities.iter().map(Entity::to_json).collect(),
        reply_to,
        params: Value::Object(params.clone()),
    });
    drop(state);
    shared.sent_cv.notify_all();
    shared.bump();
    Ok(message)
}

/// The `text` of `sendMessage` / `editMessageText` with its `parse_mode` (`None` when absent or
/// empty) and what Telegram makes of it (entities parsed, trimmed), after checking
/// `link_preview_options`, as the Bot API server reads them before anything else.
pub(super) fn message_text(
    params: &Map<String, Value>,
) -> Result<(String, Option<String>, Formatted), Refusal> {
    let text = match params.get("text") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(Refusal::bad("message text is empty")),
    };
    let parse_mode = match params.get("parse_mode") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(Refusal::bad("unsupported parse_mode")),
    };
    let formatted = match parse_mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(Formatted::plain(&text)),
        Some("markdownv2") => parse_markdown_v2(&text),
        Some("markdown") => parse_markdown(&text),
        Some("html") => parse_html(&text),
        Some(_) => return Err(Refusal::bad("unsupported parse_mode")),
    }
    .map_err(|e| Refusal::bad(format!("can't parse entities: {e}")))?
    .trimmed();
    match json_param(params, "link_preview_options") {
        None | Some(Ok(Value::Object(_))) => {}
        Some(_) => return Err(Refusal::bad("can't parse link preview options JSON object")),
    }
    Ok((text, parse_mode, formatted))
}

/// What Telegram checks of a text when it sends or edits: not empty after trimming, at most
/// [`MAX_MESSAGE_CHARS`].
pub(super) fn check_length(formatted: &Formatted) -> Result<(), Refusal> {
    if formatted.text.is_empty() {
        return Err(Refusal::bad("message must be non-empty"));
    }
    if formatted.text.chars().count() > MAX_MESSAGE_CHARS {
        return Err(Refusal::bad("message is too long"));
    }
    Ok(())
}

/// A `chat_id` was given at all (the Bot API server tells an empty one from a wrong one).
pub(super) fn chat_given(params: &Map<String, Value>) -> bool {
    match params.get("chat_id") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.trim().is_empty(),
        Some(_) => true,
    }
}

/// `message_id` as the Bot API server reads it: 0 when absent or not a positive number.
pub(super) fn message_id_param(params: &Map<String, Value>) -> i64 {
    int_param(params, "message_id").filter(|id| *id > 0).unwrap_or(0)
}

/// `editMessageText` of a chat message (inline messages are not supported), checking in the
/// order of the Bot API server: the text and its markup, the chat, the message (found, the
/// bot's own), then what Telegram checks of the new text (emptiness, length, a change at all).
pub(super) fn edit_message_text(
    shared: &Shared,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let mut state = shared.state();
    let (_, _, formatted) = message_text(params)?;
    let message_id = message_id_param(params);
    if !chat_given(params) && message_id == 0 {
        // Then it is an inline message, by `inline_message_id`.
        return Err(Refusal::bad("message identifier is not specified"));
    }
    let chat_id = chat_param(&state, params)?;
    let bot_id = shared.bot_id;
    let chat = state.chats.get_mut(&chat_id).expect("chat_param checked the chat exists");
    let Some(message) = chat.messages.get_mut(&message_id) else {
        return Err(Refusal::bad("message to edit not found"));
    };
    if message["from"]["id"].as_i64() != Some(bot_id) {
        return Err(Refusal::bad("message can't be edited"));
    }
    check_length(&formatted)?;
    let entities: Vec<Value> = formatted.entities.iter().map(Entity::to_json).collect();
    let old_entities = message.get("entities").cloned().unwrap_or_else(|| json!([]));
    if message["text"] == json!(formatted.text) && old_entities == json!(entities) {
        return Err(Refusal::bad(
            "message is not modified: specified new message content and reply markup are \
             exactly the same as a current content and reply markup of the message",
        ));
    }
    message["text"] = json!(formatted.text);
    message["edit_date"] = json!(unix_now().max(message["date"].as_i64().unwrap_or(0)));
    match message.as_object_mut() {
        Some(m) if entities.is_empty() => {
            m.remove("entities");
        }
        _ => message["entities"] = Value::Array(entities),
    }
    let message = message.clone();
    state.edits.push((chat_id, message_id, Some(formatted.text)));
    drop(state);
    shared.sent_cv.notify_all();
    shared.bump();
    Ok(message)
}

/// `deleteMessage`: `true`, or the Bot API server's errors in its order (chat and message given,
/// the chat, the message, then whether the bot may delete it: its own anywhere, and in a private
/// chat the person's too ("bots can delete incoming messages in private chats"); in a supergroup
/// only its own, as it is no administrator there).
pub(super) fn delete_message(
    shared: &Shared,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let mut state = shared.state();
    if !chat_given(params) {
        return Err(Refusal::bad("chat identifier is not specified"));
    }
    let message_id = message_id_param(params);
    if message_id == 0 {
        return Err(Refusal::bad("message identifier is not specified"));
    }
    let chat_id = chat_param(&state, params)?;
    let bot_id = shared.bot_id;
    let chat = state.chats.get_mut(&chat_id).expect("chat_param checked the chat exists");
    let Some(message) = chat.messages.get(&message_id) else {
        return Err(Refusal::bad("message to delete not found"));
    };
    if message["from"]["id"].as_i64() != Some(bot_id) && !chat.private {
        return Err(Refusal::bad("message can't be deleted"));
    }
    chat.messages.remove(&message_id);
    state.edits.push((chat_id, message_id, None));
    drop(state);
    shared.sent_cv.notify_all();
    shared.bump();
    Ok(json!(true))
}

/// `sendChatAction`: the chat, then the action; recorded ([`FakeTelegram::chat_actions`]).
pub(super) fn send_chat_action(
    shared: &Shared,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    let mut state = shared.state();
    let chat_id = chat_param(&state, params)?;
    match params.get("action").and_then(Value::as_str) {
        Some(action) if CHAT_ACTIONS.contains(&action) => {
            state.chat_actions.push((chat_id, action.to_string()));
            drop(state);
            shared.sent_cv.notify_all();
            shared.bump();
            Ok(json!(true))
        }
        _ => Err(Refusal::bad("wrong parameter action in request")),
    }
}

pub(super) fn delete_webhook(
    shared: &Shared,
    params: &Map<String, Value>,
) -> Result<Value, Refusal> {
    if bool_param(params, "drop_pending_updates") {
        shared.state().updates.clear();
    }
    Ok(json!(true))
}

pub(super) fn webhook_info(shared: &Shared) -> Value {
    json!({
        "url": "",
        "has_custom_certificate": false,
        "pending_update_count": shared.state().updates.len(),
    })
}
