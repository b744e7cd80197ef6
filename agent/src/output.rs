//! A tool call's outcome as the model sees it ([`ToolOutput`]), and the calls the router answers
//! ([`forward`]): every tool module returns one, so it lives apart from all of them.

use flock_ipc::{Body, Frame, MsgId};
use serde_json::Value;

use crate::client::RouterClient;

/// Result of one tool call as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub ok: bool,
    pub content: String,
}

impl ToolOutput {
    pub(crate) fn ok(content: impl Into<String>) -> Self {
        ToolOutput { ok: true, content: content.into() }
    }
    pub(crate) fn err(content: impl Into<String>) -> Self {
        ToolOutput { ok: false, content: content.into() }
    }
}

pub(crate) fn answer(frame: Frame, what: impl FnOnce(Body) -> ToolOutput) -> ToolOutput {
    match frame.body {
        Body::Error { code, message } => ToolOutput::err(format!("{code}: {message}")),
        other => what(other),
    }
}

/// Runs a tool on the supervisor's side: `ToolCall` → `ToolResult`.
pub(crate) async fn forward(client: &RouterClient, name: &str, args: &Value) -> ToolOutput {
    forward_as(client, flock_ipc::id::new_id(), name, args).await
}

/// [`forward`] with the call's id given: one derived from the turn makes a replayed call the
/// same call.
pub(crate) async fn forward_as(
    client: &RouterClient,
    id: MsgId,
    name: &str,
    args: &Value,
) -> ToolOutput {
    let frame = Frame {
        id,
        ..Frame::new(
            &client.name,
            flock_ipc::ROUTER,
            Body::ToolCall { name: name.into(), arguments: args.to_string() },
        )
    };
    match client.call(frame).await {
        Ok(f) => answer(f, |b| match b {
            Body::ToolResult { ok, content } => ToolOutput { ok, content },
            other => ToolOutput::err(format!("INTERNAL: unexpected {} answer", other.kind())),
        }),
        Err(e) => ToolOutput::err(format!("INTERNAL: {e}")),
    }
}
