//! The gateway v10 on a WebSocket: hello, identify and resume with their intents, heartbeats, dispatched events, and the closes Discord sends.

use super::*;

/// Answers the WebSocket handshake of `request` and runs the gateway on the connection.
pub(super) async fn upgrade_to_gateway(
    mut conn: Conn<TcpStream>,
    request: Request,
    shared: Arc<Shared>,
) {
    let Some(key) = request.header("sec-websocket-key") else {
        let reply = Reply { status: 400, body: None, headers: Vec::new() };
        conn.reply(&reply.answer(), false).await;
        return;
    };
    let Some(ws) = conn.accept_websocket(key).await else {
        return;
    };
    // Discord's rules for the query: `v=10` here, JSON encoding, no transport compression.
    let params = query_params(&request);
    let refused = if params.get("v").map(String::as_str) != Some("10") {
        Some((4012, "Invalid API version"))
    } else if params.get("encoding").is_some_and(|e| e != "json") {
        Some((4002, "fake Discord: only encoding=json is supported"))
    } else if params.contains_key("compress") {
        Some((4000, "fake Discord: transport compression is not supported"))
    } else {
        None
    };
    gateway(ws, shared, refused).await;
}

pub(super) async fn gateway(
    mut ws: WebSocketStream<TcpStream>,
    shared: Arc<Shared>,
    refused: Option<(u16, &str)>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (conn_id, interval) = {
        let mut state = shared.state();
        let id = state.next_conn;
        state.next_conn += 1;
        state.conns.insert(id, GatewayConn { tx, session: None });
        (id, state.heartbeat_interval)
    };
    shared.changed.notify_all();
    if let Some((code, reason)) = refused {
        close(&mut ws, code, reason).await;
    } else {
        let hello = json!({"heartbeat_interval": interval, "_trace": ["[\"fake-gateway\",{\"micros\":0}]"]});
        if ws.send(WsMessage::Text(op_payload(10, hello))).await.is_ok() {
            loop {
                tokio::select! {
                    incoming = ws.next() => match incoming {
                        None | Some(Err(_)) => break,
                        Some(Ok(WsMessage::Text(text))) => on_payload(&shared, conn_id, &text),
                        Some(Ok(WsMessage::Binary(_))) => {
                            close(&mut ws, 4002, "Error while decoding payload.").await;
                            break;
                        }
                        Some(Ok(WsMessage::Close(frame))) => {
                            // A clean close (1000/1001) ends the session; others keep it
                            // resumable. Polling on lets tungstenite answer the close.
                            let code = frame.map(|f| u16::from(f.code));
                            if matches!(code, Some(1000 | 1001)) {
                                end_session(&shared, conn_id);
                            }
                        }
                        Some(Ok(_)) => {}
                    },
                    out = rx.recv() => match out {
                        Some(Out::Text(text)) => {
                            if ws.send(WsMessage::Text(text)).await.is_err() {
                                break;
                            }
                        }
                        Some(Out::Close(code, reason)) => {
                            close(&mut ws, code, &reason).await;
                            break;
                        }
                        Some(Out::Drop) | None => break,
                    },
                }
            }
        }
    }
    drop(ws);
    detach(&shared, conn_id);
}

/// Sends a close frame, then waits (briefly) for the client's answer.
pub(super) async fn close(ws: &mut WebSocketStream<TcpStream>, code: u16, reason: &str) {
    let frame = CloseFrame { code: CloseCode::from(code), reason: reason.to_string().into() };
    if ws.close(Some(frame)).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
    }
}

/// The connection is gone: its session (if any) stays, without a connection.
pub(super) fn detach(shared: &Shared, conn_id: u64) {
    let mut state = shared.state();
    if let Some(conn) = state.conns.remove(&conn_id)
        && let Some(session) = conn.session.and_then(|s| state.sessions.get_mut(&s))
        && session.conn == Some(conn_id)
    {
        session.conn = None;
    }
    drop(state);
    shared.changed.notify_all();
}

/// The client closed cleanly: its session can no longer be resumed.
pub(super) fn end_session(shared: &Shared, conn_id: u64) {
    let mut state = shared.state();
    if let Some(session) = state.conns.get_mut(&conn_id).and_then(|c| c.session.take()) {
        state.sessions.remove(&session);
    }
    drop(state);
    shared.changed.notify_all();
}

/// Handles one payload from a client; answers go through the connection's queue, in order.
pub(super) fn on_payload(shared: &Shared, conn_id: u64, text: &str) {
    let mut guard = shared.state();
    let state = &mut *guard;
    let Some(conn) = state.conns.get(&conn_id) else { return };
    let tx = conn.tx.clone();
    let identified = conn.session.is_some();
    let close = |code: u16, reason: &str| {
        let _ = tx.send(Out::Close(code, reason.to_string()));
    };
    let payload: Value = match serde_json::from_str(text) {
        Ok(payload @ Value::Object(_)) => payload,
        _ => return close(4002, "Error while decoding payload."),
    };
    let d = &payload["d"];
    match payload["op"].as_u64() {
        Some(1) => {
            state.heartbeats.push(d.as_u64());
            let _ = tx.send(Out::Text(op_payload(11, Value::Null)));
        }
        Some(2) => {
            if identified {
                return close(4005, "Already authenticated.");
            }
            if let Some(intents) = d["intents"].as_u64() {
                state.identifies.push(intents);
            }
            if !d["token"].as_str().is_some_and(|t| shared.token_ok(t)) {
                return close(4004, "Authentication failed.");
            }
            let Some(intents) = d["intents"].as_u64().filter(|i| *i < INTENTS_END) else {
                return close(4013, "Invalid intent(s).");
            };
            if intents & INTENT_MESSAGE_CONTENT != 0 && state.deny_message_content {
                return close(4014, "Disallowed intent(s).");
            }
            let shard = match &d["shard"] {
                Value::Null => None,
                Value::Array(s) => {
                    match (s.first().and_then(Value::as_u64), s.get(1).and_then(Value::as_u64)) {
                        (Some(id), Some(total)) if s.len() == 2 && id < total => Some((id, total)),
                        _ => return close(4010, "Invalid shard."),
                    }
                }
                _ => return close(4010, "Invalid shard."),
            };
            let in_shard = shard.is_none_or(|(id, total)| (GUILD_ID >> 22) % total == id);
            let session_id = random_string(32, b"0123456789abcdef");
            let mut session = Session { intents, seq: 0, events: Vec::new(), conn: Some(conn_id) };
            if let Some(c) = state.conns.get_mut(&conn_id) {
                c.session = Some(session_id.clone());
            }
            let flags = APP_FLAG_MESSAGE_CONTENT_LIMITED;
            let mut ready = json!({
                "v": 10,
                "user_settings": {},
                "user": ready_user(),
                "guilds": if in_shard { json!([{"id": GUILD_ID.to_string(), "unavailable": true}]) } else { json!([]) },
                "session_id": session_id,
                "session_type": "normal",
                "resume_gateway_url": shared.ws_url(),
                "application": {"id": APPLICATION_ID.to_string(), "flags": flags},
                "private_channels": [],
                "relationships": [],
                "presences": [],
                "guild_join_requests": [],
                "geo_ordered_rtc_regions": ["us-east", "us-central"],
                "_trace": ["[\"fake-gateway\",{\"micros\":0}]"],
            });
            if let Some((id, total)) = shard {
                ready["shard"] = json!([id, total]);
            }
            push_event(&mut session, &state.conns, "READY", ready);
            if in_shard && intents & INTENT_GUILDS != 0 {
                push_event(&mut session, &state.conns, "GUILD_CREATE", guild_create(state));
            }
            state.sessions.insert(session_id, session);
        }
        Some(6) => {
            if identified {
                return close(4005, "Already authenticated.");
            }
            if !d["token"].as_str().is_some_and(|t| shared.token_ok(t)) {
                return close(4004, "Authentication failed.");
            }
            let session_id = d["session_id"].as_str().unwrap_or_default().to_string();
            let seq = d["seq"].as_u64().unwrap_or(0);
            let resumable = state.sessions.get(&session_id).is_some_and(|s| seq <= s.seq);
            state.resumes.push((session_id.clone(), seq, resumable));
            if !resumable {
                let _ = tx.send(Out::Text(op_payload(9, json!(false))));
                return;
            }
            let Some(session) = state.sessions.get_mut(&session_id) else { return };
            if let Some(old) = session.conn.replace(conn_id)
                && old != conn_id
                && let Some(old) = state.conns.get_mut(&old)
            {
                old.session = None;
            }
            if let Some(c) = state.conns.get_mut(&conn_id) {
                c.session = Some(session_id);
            }
            for (_, missed) in session.events.iter().filter(|(s, _)| *s > seq) {
                let _ = tx.send(Out::Text(missed.clone()));
            }
            let resumed = json!({"_trace": ["[\"fake-gateway\",{\"micros\":0}]"]});
            push_event(session, &state.conns, "RESUMED", resumed);
        }
        // Presence update, voice state update, request guild members, …: accepted silently.
        Some(3 | 4 | 8 | 31) if identified => {}
        Some(3 | 4 | 8 | 31) => close(4003, "Not authenticated."),
        _ => close(4001, "Unknown opcode."),
    }
    drop(guard);
    shared.changed.notify_all();
}

/// `GUILD_CREATE` for the one guild: its text channels and the bot as its only member.
pub(super) fn guild_create(state: &State) -> Value {
    let joined = iso8601((GUILD_ID >> 22) + DISCORD_EPOCH_MS);
    let channels: Vec<Value> = state
        .guild_channels()
        .map(|(id, channel)| {
            let mut json = state.channel_json(*id, channel);
            if let Some(c) = json.as_object_mut() {
                c.remove("guild_id"); // as in GUILD_CREATE
            }
            json
        })
        .collect();
    let mut guild = json!({
        "id": GUILD_ID.to_string(),
        "name": GUILD_NAME,
        "icon": null,
        "icon_hash": null,
        "splash": null,
        "discovery_splash": null,
        "owner_id": GUILD_OWNER_ID.to_string(),
        "afk_channel_id": null,
        "afk_timeout": 300,
        "widget_enabled": false,
        "widget_channel_id": null,
        "verification_level": 0,
        "default_message_notifications": 1,
        "explicit_content_filter": 0,
        "roles": [{
            "id": GUILD_ID.to_string(),
            "name": "@everyone",
            "description": null,
            "color": 0,
            "colors": {"primary_color": 0, "secondary_color": null, "tertiary_color": null},
            "hoist": false,
            "icon": null,
            "unicode_emoji": null,
            "position": 0,
            "permissions": "2248473465835073",
            "managed": false,
            "mentionable": false,
            "flags": 0,
        }],
        "emojis": [],
        "features": [],
        "mfa_level": 0,
        "application_id": null,
        "system_channel_id": null,
        "system_channel_flags": 0,
        "rules_channel_id": null,
        "max_presences": null,
        "max_members": 500_000,
        "vanity_url_code": null,
        "description": null,
        "banner": null,
        "premium_tier": 0,
        "premium_subscription_count": 0,
        "preferred_locale": "en-US",
        "public_updates_channel_id": null,
        "max_video_channel_users": 25,
        "max_stage_video_channel_users": 50,
        "nsfw_level": 0,
        "stickers": [],
        "premium_progress_bar_enabled": false,
    });
    let extra = json!({
        "safety_alerts_channel_id": null,
        "incidents_data": null,
        "joined_at": joined,
        "large": false,
        "unavailable": false,
        "member_count": 2,
        "voice_states": [],
        "members": [{
            "user": bot_user(),
            "nick": null,
            "avatar": null,
            "banner": null,
            "roles": [],
            "joined_at": joined,
            "premium_since": null,
            "deaf": false,
            "mute": false,
            "flags": 0,
            "pending": false,
            "communication_disabled_until": null,
        }],
        "channels": channels,
        "threads": [],
        "presences": [],
        "stage_instances": [],
        "guild_scheduled_events": [],
        "soundboard_sounds": [],
        "lazy": true,
    });
    if let (Some(guild), Value::Object(extra)) = (guild.as_object_mut(), extra) {
        guild.extend(extra);
    }
    guild
}

/// The bot's user as READY carries it: the user object with the fields only its owner sees.
fn ready_user() -> Value {
    let mut user = bot_user();
    for (key, value) in
        [("verified", json!(true)), ("mfa_enabled", json!(false)), ("email", Value::Null)]
    {
        user[key] = value;
    }
    user
}
