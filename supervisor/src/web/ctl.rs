//! The dashboard's way into the swarm: a control connection, exactly as `flockctl` has. What the
//! page shows and does is what the operator could see and do from a shell, with the same checks
//! (the page acts as the operator for sends, and as `human:<name>` for channel posts).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow, bail};
use flock_ipc::conn::Connection;
use flock_ipc::{Body, ControlReply, ControlRequest, Frame, MsgId, ROUTER, SendMode};

pub struct Ctl {
    conn: Connection,
}

impl std::fmt::Debug for Ctl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Ctl")
    }
}

impl Ctl {
    pub async fn connect(socket: &Path) -> Result<Ctl> {
        let conn = Connection::client(socket, "dashboard")
            .await
            .map_err(|e| anyhow!("connect to the supervisor at {}: {e}", socket.display()))?;
        Ok(Ctl { conn })
    }

    async fn write(&mut self, frame: Frame) -> Result<()> {
        self.conn
            .outbox
            .send(frame)
            .await
            .map_err(|_| anyhow!("the supervisor closed the connection"))
    }

    /// One request and its answer (requests on one `Ctl` are sequential).
    pub async fn call(&mut self, request: ControlRequest) -> Result<ControlReply> {
        self.write(Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(request))).await?;
        loop {
            match self.conn.reader.read_frame().await? {
                Some(Frame { body: Body::ControlReply(r), .. }) => return Ok(r),
                Some(Frame { body: Body::Error { code, message }, .. }) => {
                    bail!("{code}: {message}")
                }
                Some(_) => continue,
                None => bail!("the supervisor closed the connection"),
            }
        }
    }

    /// A channel tool (`flock_channel_*`) run as `human:<as_name>`; its JSON result.
    pub async fn tool(
        &mut self,
        tool: &str,
        arguments: serde_json::Value,
        as_name: &str,
    ) -> Result<serde_json::Value> {
        let request = ControlRequest::Channel {
            tool: tool.into(),
            arguments: arguments.to_string(),
            as_name: as_name.into(),
        };
        match self.call(request).await? {
            ControlReply::Json(text) => Ok(serde_json::from_str(&text)?),
            ControlReply::Done(text) => Ok(serde_json::Value::String(text)),
            other => bail!("unexpected answer {other:?}"),
        }
    }

    /// A durable message from the operator to `agent` (as `flockctl send`); returns its id, which
    /// is its chain's, once it is accepted. The answer lands in the operator's DM with the agent.
    pub async fn send(&mut self, agent: &str, text: String) -> Result<MsgId> {
        let frame =
            Frame::new(flock_ipc::OPERATOR, agent, Body::Send { text, mode: SendMode::Durable });
        let id = frame.id;
        self.write(frame).await?;
        loop {
            match self.conn.reader.read_frame().await? {
                Some(f) if f.correlation_id == Some(id) => match f.body {
                    Body::Accepted => return Ok(id),
                    Body::Error { code, message } => bail!("{code}: {message}"),
                    other => bail!("unexpected {} answer", other.kind()),
                },
                Some(_) => continue,
                None => bail!("the supervisor closed the connection before accepting the message"),
            }
        }
    }
}

/// Opens a connection per use (the page's actions are rare; the sampler keeps its own).
#[derive(Debug, Clone)]
pub struct CtlFactory {
    pub socket: PathBuf,
}

impl CtlFactory {
    pub async fn open(&self) -> Result<Ctl> {
        Ctl::connect(&self.socket).await
    }
}
