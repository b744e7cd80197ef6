//! The bridge's connection to the router: `BridgeHello` with the identity and token the
//! supervisor put in its environment, heartbeats on their own task, and tool calls answered by
//! correlation id. When the router goes away every waiting call fails with [`CallError::Gone`]
//! and [`Link::gone`] fires: the process exits and its supervisor starts a fresh one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use flock_config::BridgeSpec;
use flock_ipc::{Body, Connection, Frame, Hello, MsgId, Outbox, PROTOCOL_VERSION, ROUTER};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

type Pending = Arc<Mutex<HashMap<MsgId, oneshot::Sender<Result<String, CallError>>>>>;

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The router refused it (the message says why: not mapped, not allowed, archived…).
    Refused(String),
    /// The connection to the router is gone.
    Gone,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Refused(m) => f.write_str(m),
            CallError::Gone => f.write_str("the connection to the supervisor closed"),
        }
    }
}

/// A handshaken connection to the router.
#[derive(Clone)]
pub struct Link {
    name: String,
    outbox: Outbox,
    pending: Pending,
    gone: watch::Receiver<bool>,
    shutdown: watch::Receiver<bool>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Link {
    /// Connects with the identity in the environment (`FLOCK_SOCKET`, `FLOCK_AGENT`) and the
    /// spawn's `token` (handed over, never in the environment); returns the link and this
    /// bridge's spec from the `Welcome`.
    pub async fn connect(token: String) -> Result<(Link, BridgeSpec)> {
        let var = |k: &str| {
            std::env::var(k).with_context(|| {
                format!("{k} is not set: flock-bridge is started by flock-supervisor")
            })
        };
        let socket = var(flock_ipc::env::SOCKET)?;
        let name = var(flock_ipc::env::AGENT)?;
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_id: name.clone(),
            instance: String::new(),
            pid: std::process::id(),
            token,
        };
        let conn = Connection::bridge(std::path::Path::new(&socket), hello)
            .await
            .map_err(|e| anyhow!("connect to the router: {e}"))?;
        let spec: BridgeSpec = serde_json::from_str(&conn.welcome.agent_spec_json)
            .context("the router sent no valid bridge spec")?;
        let pending: Pending = Arc::default();
        let (gone_tx, gone) = watch::channel(false);
        let (shutdown_tx, shutdown) = watch::channel(false);
        let interval = Duration::from_millis(conn.welcome.heartbeat_interval_ms.max(100));
        let outbox = conn.outbox.clone();
        tokio::spawn(read_loop(conn, pending.clone(), gone_tx, shutdown_tx));
        let beat = outbox.clone();
        let beat_name = name.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                if beat.send(Frame::new(&beat_name, ROUTER, Body::Heartbeat)).await.is_err() {
                    return;
                }
            }
        });
        Ok((Link { name, outbox, pending, gone, shutdown }, spec))
    }

    /// Calls a `bridge__*` tool and waits for its answer (JSON text).
    pub async fn call(&self, tool: &str, args: Value) -> Result<String, CallError> {
        let frame = Frame::new(
            &self.name,
            ROUTER,
            Body::ToolCall { name: tool.to_owned(), arguments: args.to_string() },
        );
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(frame.id, tx);
        if *self.gone.borrow() || self.outbox.send(frame).await.is_err() {
            return Err(CallError::Gone);
        }
        rx.await.unwrap_or(Err(CallError::Gone))
    }

    /// [`Link::call`], parsed as JSON.
    pub async fn call_json(&self, tool: &str, args: Value) -> Result<Value, CallError> {
        let text = self.call(tool, args).await?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Tells the router how the bridge is doing (for `flockctl ps`); does not wait.
    pub fn status(&self, status: Value) {
        let frame = Frame::new(
            &self.name,
            ROUTER,
            Body::ToolCall { name: "bridge__status".into(), arguments: status.to_string() },
        );
        let _ = self.outbox.try_send(frame);
    }

    /// Resolves when the router connection is gone.
    pub async fn gone(&self) {
        let mut gone = self.gone.clone();
        let _ = gone.wait_for(|g| *g).await;
    }

    /// Resolves when the supervisor asked the bridge to shut down.
    pub async fn shutdown_requested(&self) {
        let mut s = self.shutdown.clone();
        let _ = s.wait_for(|g| *g).await;
    }

    /// Whether a shutdown was asked for.
    pub fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Acknowledges the shutdown (the last frame the bridge sends).
    pub async fn shutdown_ack(&self) {
        let _ = self.outbox.send(Frame::new(&self.name, ROUTER, Body::ShutdownAck)).await;
    }
}

async fn read_loop(
    mut conn: Connection,
    pending: Pending,
    gone: watch::Sender<bool>,
    shutdown: watch::Sender<bool>,
) {
    loop {
        let frame = match conn.reader.read_frame().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::error!("flock-bridge: error: reading from the router: {e}");
                break;
            }
        };
        let waiter = |id: Option<MsgId>| {
            id.and_then(|id| pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id))
        };
        match frame.body {
            Body::ToolResult { ok, content } => {
                if let Some(tx) = waiter(frame.correlation_id) {
                    let _ =
                        tx.send(if ok { Ok(content) } else { Err(CallError::Refused(content)) });
                }
            }
            Body::Error { code, message } => {
                if let Some(tx) = waiter(frame.correlation_id) {
                    let _ = tx.send(Err(CallError::Refused(format!("{code}: {message}"))));
                }
            }
            Body::Shutdown => {
                let _ = shutdown.send(true);
            }
            _ => {}
        }
    }
    let _ = gone.send(true);
    // Every call still waiting fails now rather than hanging.
    pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
}
