//! The raw relay: the baseline the router is compared with. Same socket type, same codec
//! ([`FrameReader`] in, [`spawn_writer`] out with the same bounded outbox and batching), same
//! handshake and the same `Send` → `Deliver` rewrite, but no actors, no store and no checks: each
//! connection's reader task decodes a batch and pushes every frame straight into the target
//! connection's outbox (`try_send`, refused with `TARGET_UNAVAILABLE` when full, like the router's
//! at_most_once path). Durable sends are not stored: they only wait for room instead of being
//! refused (the bench uses one as an end marker). Requests are forwarded as `Deliver`s of kind
//! `Request`, and the callee's `Ack { reply }` goes back to the caller as `Reply` (no deadline,
//! no call chain, no turn counting).
//!
//! Its runtime is the supervisor's (multi-threaded, 2 workers).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use flock_ipc::{
    Body, ControlReply, ControlRequest, Delivery, DeliveryKind, ErrorCode, Frame, FrameReader,
    OPERATOR, Outbox, PROTOCOL_VERSION, PsRow, ROUTER, SendMode, Welcome, spawn_writer,
};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;

/// Connected peers by name, and the callers of requests in flight (request id → caller).
#[derive(Default)]
struct Routes {
    peers: HashMap<String, Outbox>,
    requests: HashMap<flock_ipc::MsgId, String>,
}

type Table = Arc<Mutex<Routes>>;

/// Serves the relay socket at `path` until killed.
pub fn main(path: &Path, outbox_frames: usize) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let _ = std::fs::remove_file(path);
        let listener =
            UnixListener::bind(path).with_context(|| format!("listen on {}", path.display()))?;
        let table: Table = Arc::default();
        loop {
            let (stream, _) = listener.accept().await?;
            tokio::spawn(connection(stream, table.clone(), outbox_frames));
        }
    })
}

async fn connection(stream: UnixStream, table: Table, outbox_frames: usize) {
    let (r, w) = stream.into_split();
    let (tx, rx) = mpsc::channel(outbox_frames.max(16));
    let writer = spawn_writer(w, rx);
    let mut reader = FrameReader::new(r, flock_ipc::DEFAULT_MAX_FRAME_BYTES);
    let identity = match reader.read_frame().await {
        Ok(Some(first)) => {
            let identity = match &first.body {
                Body::Hello(h) => h.agent_id.clone(),
                Body::ClientHello { .. } => OPERATOR.to_owned(),
                _ => return,
            };
            let welcome = Welcome {
                protocol_version: PROTOCOL_VERSION,
                swarm: "relay".into(),
                agent_spec_json: String::new(),
                heartbeat_interval_ms: 5_000,
                max_frame_bytes: flock_ipc::DEFAULT_MAX_FRAME_BYTES,
            };
            let _ = tx.send(Frame::answer(&first, ROUTER, Body::Welcome(welcome))).await;
            if identity != OPERATOR {
                lock(&table).peers.insert(identity.clone(), tx.clone());
            }
            identity
        }
        _ => return,
    };
    let mut batch = Vec::new();
    let mut waiting: Vec<(Outbox, Frame)> = Vec::new();
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        {
            let mut guard = lock(&table);
            let Routes { peers: routes, requests } = &mut *guard;
            for frame in batch.drain(..) {
                let Frame { id, to, body, deadline_ms, correlation_id, .. } = frame;
                match body {
                    Body::Request { text, .. } => {
                        let Some(target) = routes.get(&to) else {
                            let _ = tx.try_send(refusal(id, &identity));
                            continue;
                        };
                        requests.insert(id, identity.clone());
                        let deliver =
                            Delivery::raw(DeliveryKind::Request, identity.clone(), text, false)
                                .frame(id, to, deadline_ms);
                        if target.try_send(deliver).is_err() {
                            requests.remove(&id);
                            let _ = tx.try_send(refusal(id, &identity));
                        }
                    }
                    Body::Ack { reply: Some(text) } => {
                        let Some(caller) = correlation_id.and_then(|c| requests.remove(&c)) else {
                            continue;
                        };
                        if let Some(out) = routes.get(&caller) {
                            let reply = Frame {
                                id: flock_ipc::id::new_id(),
                                from: identity.clone(),
                                to: caller,
                                correlation_id,
                                deadline_ms: None,
                                body: Body::Reply { text },
                            };
                            let _ = out.try_send(reply);
                        }
                    }
                    Body::Send { text, mode } => {
                        let Some(target) = routes.get(&to) else {
                            let _ = tx.try_send(refusal(id, &identity));
                            continue;
                        };
                        let durable = mode != SendMode::AtMostOnce;
                        let deliver =
                            Delivery::raw(DeliveryKind::Message, identity.clone(), text, durable)
                                .frame(id, to, deadline_ms);
                        match mode {
                            SendMode::AtMostOnce => {
                                if target.try_send(deliver).is_err() {
                                    let _ = tx.try_send(refusal(id, &identity));
                                }
                            }
                            SendMode::Durable | SendMode::Upkeep => {
                                waiting.push((target.clone(), deliver))
                            }
                        }
                    }
                    Body::Control(ControlRequest::Ps) => {
                        let rows = routes.keys().map(|name| ps_row(name)).collect();
                        let reply = Frame {
                            correlation_id: Some(id),
                            ..Frame::new(
                                ROUTER,
                                OPERATOR,
                                Body::ControlReply(ControlReply::Ps(rows)),
                            )
                        };
                        let _ = tx.try_send(reply);
                    }
                    Body::Heartbeat => {
                        let ack = Frame {
                            correlation_id: Some(id),
                            ..Frame::new(ROUTER, &identity, Body::HeartbeatAck)
                        };
                        let _ = tx.try_send(ack);
                    }
                    _ => {}
                }
            }
        }
        for (target, frame) in waiting.drain(..) {
            let _ = target.send(frame).await;
        }
    }
    {
        let routes = &mut lock(&table).peers;
        if routes.get(&identity).is_some_and(|o| o.same_channel(&tx)) {
            routes.remove(&identity);
        }
    }
    drop(tx);
    let _ = writer.await;
}

fn lock(table: &Table) -> std::sync::MutexGuard<'_, Routes> {
    table.lock().unwrap_or_else(|p| p.into_inner())
}

fn refusal(id: flock_ipc::MsgId, to: &str) -> Frame {
    Frame {
        correlation_id: Some(id),
        ..Frame::new(
            ROUTER,
            to,
            Body::Error { code: ErrorCode::TargetUnavailable, message: "outbox full".into() },
        )
    }
}

fn ps_row(name: &str) -> PsRow {
    PsRow {
        name: name.to_owned(),
        kind: "agent".into(),
        role: "worker".into(),
        state: "ready".into(),
        ..Default::default()
    }
}
