//! The agent's side of the router connection: sending frames and awaiting the answers that
//! carry their id as correlation id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use flock_ipc::{Frame, MsgId, Outbox};
use tokio::sync::oneshot;

#[derive(Clone)]
pub struct RouterClient {
    pub name: String,
    outbox: Outbox,
    pending: Arc<Mutex<HashMap<MsgId, oneshot::Sender<Frame>>>>,
}

impl std::fmt::Debug for RouterClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterClient").field("name", &self.name).finish()
    }
}

impl RouterClient {
    pub fn new(name: String, outbox: Outbox) -> Self {
        RouterClient { name, outbox, pending: Arc::default() }
    }

    /// Sends a frame without waiting for anything.
    pub async fn send(&self, frame: Frame) -> Result<(), String> {
        self.outbox.send(frame).await.map_err(|_| "the router connection is closed".to_string())
    }

    /// Sends a frame and waits for the frame answering it.
    pub async fn call(&self, frame: Frame) -> Result<Frame, String> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).insert(frame.id, tx);
        let id = frame.id;
        if let Err(e) = self.send(frame).await {
            self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
            return Err(e);
        }
        rx.await.map_err(|_| "the router connection closed before an answer came".to_string())
    }

    /// Hands an incoming answer to whoever awaits it; returns it back if nobody does.
    pub fn resolve(&self, frame: Frame) -> Option<Frame> {
        let Some(id) = frame.correlation_id else { return Some(frame) };
        let waiter = self.pending.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        match waiter {
            Some(tx) => tx.send(frame).err(),
            None => Some(frame),
        }
    }

    /// Fails every pending call (the connection is gone).
    pub fn fail_all(&self) {
        self.pending.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}
