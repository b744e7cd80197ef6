//! `flockctl approvals|approve|deny`: permission requests waiting for a person, and a person's
//! verdict on one.

use std::process::ExitCode;

use anyhow::{Result, bail};
use flock_ipc::{Connection, ControlReply, ControlRequest};
use serde_json::json;

use crate::*;

pub(crate) async fn list(conn: &mut Connection, all: bool, json: bool) -> Result<ExitCode> {
    let req = ControlRequest::Channel {
        tool: "permission_list".into(),
        arguments: json!({"all": all}).to_string(),
        as_name: person(None),
    };
    let ControlReply::Json(text) = control(conn, req).await? else {
        bail!("unexpected answer to permission_list");
    };
    if json {
        println!("{text}");
        return Ok(ExitCode::SUCCESS);
    }
    let rows: Vec<serde_json::Value> = serde_json::from_str(&text)?;
    if rows.is_empty() {
        println!("{}", if all { "no permission requests" } else { "nothing waits for a decision" });
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<5} {:<16} {:<9} {:<28} {:<9} REASON / VERDICT",
        "ID", "AGENT", "WANTS", "TARGET", "STATE"
    );
    for r in rows {
        let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
        let verdict = match (r["verdict"].as_str(), r["verdict_reason"].as_str()) {
            (Some(v), Some(why)) => format!(" — {v}: {why}"),
            (None, Some(why)) => format!(" — {why}"),
            _ => String::new(),
        };
        println!(
            "{:<5} {:<16} {:<9} {:<28} {:<9} {}{verdict}",
            r["id"],
            s("agent"),
            s("capability"),
            s("target"),
            s("state"),
            s("reason")
        );
    }
    Ok(ExitCode::SUCCESS)
}
/// `approve` / `deny`: a person's decision on a permission request.
pub(crate) async fn decide(
    conn: &mut Connection,
    id: i64,
    approve: bool,
    reason: Option<String>,
    expires_secs: Option<u64>,
    as_name: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let args = json!({
        "id": id,
        "approve": approve,
        "reason": reason.unwrap_or_default(),
        "expires_secs": expires_secs,
    });
    let req = ControlRequest::Channel {
        tool: "permission_decide".into(),
        arguments: args.to_string(),
        as_name: person(as_name),
    };
    let reply = control(conn, req).await?;
    if !json {
        return done(reply);
    }
    let message = match reply {
        ControlReply::Done(msg) | ControlReply::Json(msg) => msg,
        _ => String::new(),
    };
    let decision = if approve { "approved" } else { "denied" };
    println!("{}", json!({"id": id, "decision": decision, "message": message}));
    Ok(ExitCode::SUCCESS)
}
