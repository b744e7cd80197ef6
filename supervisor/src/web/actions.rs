//! What the dashboard does besides posting and sending: stop, start or restart an agent, decide a
//! permission request, read the dead letters. Each goes through a control connection, exactly as
//! the matching `flockctl` command (`stop|start|restart`, `approve|deny`, `dead-letters`), so the
//! same checks apply and the same things are journaled (as `human:operator`). The guard in
//! `mod.rs` has already checked the token, the `Host` and, for these POSTs, the `Origin`.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flock_ipc::{ControlReply, ControlRequest};
use serde_json::json;

use super::{Shared, error, open_and};

/// `POST /api/agents/{name}/{stop|start|restart}`: `{"message"}` as `flockctl` prints it.
pub(super) async fn agent_action(
    State(ui): Shared,
    Path((name, action)): Path<(String, String)>,
) -> Response {
    let request = match action.as_str() {
        "stop" => ControlRequest::Stop { agent: name },
        "start" => ControlRequest::Start { agent: name },
        "restart" => ControlRequest::Restart { agent: name },
        other => {
            return error(
                StatusCode::NOT_FOUND,
                format!("no action `{other}`: an agent can be stopped, started or restarted"),
            );
        }
    };
    match open_and(&ui, |mut c| async move { c.call(request).await }).await {
        Ok(ControlReply::Done(message)) => axum::Json(json!({"message": message})).into_response(),
        Ok(other) => error(StatusCode::BAD_GATEWAY, format!("unexpected answer {other:?}")),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct ApprovalsQuery {
    /// Every request, decided ones too (default: those waiting for a person).
    #[serde(default)]
    all: bool,
}

/// `GET /api/approvals[?all=true]`: the permission requests, as `flockctl approvals --json`.
pub(super) async fn approvals(State(ui): Shared, Query(q): Query<ApprovalsQuery>) -> Response {
    let args = json!({"all": q.all});
    match open_and(&ui, |mut c| async move { c.tool("permission_list", args, "operator").await })
        .await
    {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct Decision {
    approve: bool,
    #[serde(default)]
    reason: String,
}

/// `POST /api/approvals/{id}` `{"approve": bool, "reason"}`: the operator's verdict, as
/// `flockctl approve|deny ID --reason …`.
pub(super) async fn decide(
    State(ui): Shared,
    Path(id): Path<i64>,
    axum::Json(d): axum::Json<Decision>,
) -> Response {
    let args = json!({"id": id, "approve": d.approve, "reason": d.reason});
    match open_and(&ui, |mut c| async move { c.tool("permission_decide", args, "operator").await })
        .await
    {
        Ok(v) => axum::Json(json!({"id": id, "message": v})).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// `GET /api/dead-letters`: the first 100 messages that exhausted their delivery attempts, oldest
/// first (as `flockctl dead-letters`).
pub(super) async fn dead_letters(State(ui): Shared) -> Response {
    let request = ControlRequest::DeadLetters { offset: 0, limit: 100 };
    match open_and(&ui, |mut c| async move { c.call(request).await }).await {
        Ok(ControlReply::DeadLetters(letters)) => {
            let rows: Vec<_> = letters
                .iter()
                .map(|l| {
                    json!({
                        "id": flock_ipc::id::fmt_id(l.id),
                        "sender": l.sender,
                        "target": l.target,
                        "text": l.text,
                        "attempts": l.attempts,
                        "reason": l.reason,
                    })
                })
                .collect();
            axum::Json(rows).into_response()
        }
        Ok(other) => error(StatusCode::BAD_GATEWAY, format!("unexpected answer {other:?}")),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// `GET /api/memory?q=&kind=&priority=`: the memory view — a search when `q` has words, else
/// the newest records (most important first within a day); each with its tier. Answered by the
/// swarm's memory thread, as `flockctl memory search`.
pub(super) async fn memory(
    State(ui): Shared,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let field = |k: &str| q.get(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    let kinds: Vec<String> = field("kind").into_iter().collect();
    let (tool, args) = match field("q") {
        Some(words) => (
            "memory_search",
            json!({"query": words, "limit": 50, "kinds": kinds, "priority": field("priority")}),
        ),
        None => {
            ("memory__recent", json!({"limit": 50, "kinds": kinds, "priority": field("priority")}))
        }
    };
    memory_read(&ui, tool, args).await
}

/// `GET /api/memory/stats`: records per kind and tier, files, index size.
pub(super) async fn memory_stats(State(ui): Shared) -> Response {
    memory_read(&ui, "memory__stats", json!({})).await
}

async fn memory_read(ui: &super::Ui, tool: &str, args: serde_json::Value) -> Response {
    let request = ControlRequest::Memory { tool: tool.into(), arguments: args.to_string() };
    match open_and(ui, |mut c| async move { c.call(request).await }).await {
        Ok(ControlReply::Json(text)) => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(v) => axum::Json(v).into_response(),
            Err(e) => error(StatusCode::BAD_GATEWAY, format!("the memory answer is not JSON: {e}")),
        },
        Ok(other) => error(StatusCode::BAD_GATEWAY, format!("unexpected answer {other:?}")),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}
