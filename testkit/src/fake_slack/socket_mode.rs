//! Socket Mode: `apps.connections.open` tickets and the WebSocket that carries envelopes and their acks.

use super::*;

/// Answers the WebSocket handshake of `request` (a ticket from `apps.connections.open`, used
/// once) and runs Socket Mode on the connection.
pub(super) async fn upgrade_to_socket(
    mut conn: Conn<TcpStream>,
    request: Request,
    shared: Arc<Shared>,
) {
    let ticket =
        http1::form_pairs(&request.query).into_iter().find(|(n, _)| n == "ticket").map(|(_, v)| v);
    let valid = request.path.trim_end_matches('/') == "/link"
        && ticket.is_some_and(|t| shared.state().tickets.remove(&t));
    let key = request.header("sec-websocket-key");
    let Some(key) = key.filter(|_| valid) else {
        conn.reply(&Reply::bare(if valid { 400 } else { 401 }).answer(), false).await;
        return;
    };
    if let Some(ws) = conn.accept_websocket(key).await {
        socket(ws, shared).await;
    }
}

pub(super) async fn socket(mut ws: WebSocketStream<TcpStream>, shared: Arc<Shared>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let conn_id = {
        let mut state = shared.state();
        let id = state.next_conn;
        state.next_conn += 1;
        let hello = json!({
            "type": "hello",
            "num_connections": state.open_sockets() + 1,
            "debug_info": {
                "host": "fake",
                "build_number": 1,
                "approximate_connection_time": 18060,
            },
            "connection_info": {"app_id": APP_ID},
        });
        let _ = tx.send(Out::Text(hello.to_string()));
        state.conns.insert(id, SocketConn { tx, closing: false });
        state.deliver();
        id
    };
    shared.changed.notify_all();
    loop {
        tokio::select! {
            incoming = ws.next() => match incoming {
                None | Some(Err(_)) => break,
                Some(Ok(WsMessage::Text(text))) => {
                    shared.state().on_frame(&text);
                    shared.changed.notify_all();
                }
                Some(Ok(WsMessage::Binary(bytes))) => {
                    shared.state().bad_frames.push(String::from_utf8_lossy(&bytes).into_owned());
                }
                // Polling on lets tungstenite answer pings and the client's close frame.
                Some(Ok(_)) => {}
            },
            out = rx.recv() => match out {
                Some(Out::Text(text)) => {
                    if ws.send(WsMessage::Text(text)).await.is_err() {
                        break;
                    }
                }
                Some(Out::Close) => {
                    close(&mut ws).await;
                    break;
                }
                Some(Out::Drop) | None => break,
            },
        }
    }
    drop(ws);
    shared.state().conns.remove(&conn_id);
    shared.changed.notify_all();
}

/// Sends a close frame (1000), then waits (briefly) for the client's answer.
pub(super) async fn close(ws: &mut WebSocketStream<TcpStream>) {
    let frame = CloseFrame { code: CloseCode::Normal, reason: "".into() };
    if ws.close(Some(frame)).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
    }
}
