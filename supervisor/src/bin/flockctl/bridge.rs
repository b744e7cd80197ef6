//! `flockctl bridge ls|status|map|unmap|manifest`: the chat bridges as the router sees them,
//! run-time mappings, a bridge's status as text, and the Slack app manifest.

use std::process::ExitCode;

use anyhow::{Result, bail};
use flock_ipc::{Connection, ControlReply, ControlRequest};
use serde_json::json;

use crate::*;

/// `flockctl bridge status NAME` as text, from its `bridge ls --json` object.
pub(crate) fn bridge_status_text(b: &serde_json::Value) -> String {
    use std::fmt::Write;
    let str_or = |v: &serde_json::Value, d: &str| v.as_str().unwrap_or(d).to_owned();
    let mut out = String::new();
    let _ = writeln!(out, "bridge {} ({})", str_or(&b["name"], "?"), str_or(&b["platform"], "?"));
    let _ = writeln!(out, "  state       {}", str_or(&b["state"], "?"));
    let pid = b["pid"].as_u64().map_or("-".to_owned(), |p| p.to_string());
    let _ = writeln!(
        out,
        "  pid         {pid} (up {} s, {} restarts)",
        b["uptime_secs"].as_u64().unwrap_or(0),
        b["restarts"].as_u64().unwrap_or(0)
    );
    let _ = writeln!(
        out,
        "  messages    {} in, {} out; {} posts waiting",
        b["inbound"], b["outbound"], b["outbox"]
    );
    let _ = writeln!(out, "  last error  {}", str_or(&b["last_error"], "-"));
    let _ = writeln!(
        out,
        "  token       from ${} (api {})",
        str_or(&b["token_env"], "?"),
        str_or(&b["api_url"], "?")
    );
    let maps = b["channels"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "  mappings    {}", maps.len());
    for m in &maps {
        let allow = match m["allow"].as_array() {
            None => "everyone may post".to_owned(),
            Some(a) if a.len() == 1 => "1 person may post".to_owned(),
            Some(a) => format!("{} people may post", a.len()),
        };
        let cursor = match m["cursor"].as_u64() {
            Some(c) => format!("sent up to seq {c} of {}", m["newest"].as_u64().unwrap_or(0)),
            None => "nothing pulled yet".to_owned(),
        };
        let health = match m["broken"].as_str() {
            Some(why) => format!("BROKEN: {why}"),
            None if m["archived"].as_bool() == Some(true) => "archived (mirrored)".to_owned(),
            None => "ok".to_owned(),
        };
        let _ = writeln!(
            out,
            "    #{} ↔ {}: {allow}; {cursor}, {} waiting; {health}",
            str_or(&m["flock"], "?"),
            str_or(&m["external"], "?"),
            m["waiting"].as_u64().unwrap_or(0)
        );
    }
    out
}

/// The Slack app manifest: Socket Mode, the bot scopes the bridge uses (`chat:write.customize`
/// to post under each agent's name, `channels:manage`/`groups:write` to archive a conversation
/// whose Flock channel was archived, `reactions:write` to mark a message being worked on,
/// `im:history` for direct messages), the message events of channels and of DMs with the bot
/// (the app's Messages tab on).
pub(crate) fn slack_manifest(name: &str) -> String {
    format!(
        r#"# Slack app manifest for a Flock bridge. Create the app from it, install it to the
# workspace (the Bot User OAuth Token, xoxb-…, goes in the variable `token_env` names), then
# Basic Information → App-Level Tokens → Generate with scope connections:write (the xapp-…
# token goes in the variable `app_token_env` names). Invite the bot to each mapped channel.
display_information:
  name: {name}
  description: Your Flock agents in Slack
features:
  app_home:
    home_tab_enabled: false
    messages_tab_enabled: true
    messages_tab_read_only_enabled: false
  bot_user:
    display_name: {name}
    always_online: true
oauth_config:
  scopes:
    bot:
      - channels:history
      - channels:manage
      - channels:read
      - groups:history
      - groups:read
      - groups:write
      - chat:write
      - chat:write.customize
      - im:history
      - reactions:write
      - users:read
settings:
  event_subscriptions:
    bot_events:
      - message.channels
      - message.groups
      - message.im
  interactivity:
    is_enabled: false
  org_deploy_enabled: false
  socket_mode_enabled: true
  token_rotation_enabled: false
"#
    )
}

pub(crate) async fn ls(conn: &mut Connection, json: bool) -> Result<ExitCode> {
    let ControlReply::Json(text) = control(conn, ControlRequest::Bridges).await? else {
        bail!("unexpected answer to bridge ls");
    };
    let list: serde_json::Value = serde_json::from_str(&text)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    let rows = list.as_array().cloned().unwrap_or_default();
    if rows.is_empty() {
        println!(
            "no bridges: add a `bridges:` section to the swarm file (docs/bridges.md), or run `flockctl init --bridge telegram|discord|slack --chat ID`"
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<16}  {:<9}  {:<22}  {:>7}  {:>6}  {:>6}  {:>6}  MAPPINGS",
        "NAME", "PLATFORM", "STATE", "PID", "OUTBOX", "IN", "OUT"
    );
    for b in &rows {
        let maps: Vec<String> = b["channels"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                format!(
                    "#{} ↔ {}",
                    m["flock"].as_str().unwrap_or("?"),
                    m["external"].as_str().unwrap_or("?")
                )
            })
            .collect();
        println!(
            "{:<16}  {:<9}  {:<22}  {:>7}  {:>6}  {:>6}  {:>6}  {}",
            b["name"].as_str().unwrap_or("?"),
            b["platform"].as_str().unwrap_or("?"),
            b["state"].as_str().unwrap_or("?"),
            b["pid"].as_u64().map_or("-".into(), |p| p.to_string()),
            b["outbox"],
            b["inbound"],
            b["outbound"],
            maps.join(", ")
        );
        if let Some(e) = b["last_error"].as_str() {
            println!("{:<16}  last error: {e}", "");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn map(
    conn: &mut Connection,
    name: String,
    external: String,
    channel: String,
    allow: Option<Vec<String>>,
    json: bool,
) -> Result<ExitCode> {
    let args = json!({"bridge": name, "external": external, "channel": channel,
                      "allow": allow});
    let v = channel_tool(conn, "bridge_map", args, None).await?;
    if json {
        println!("{v}");
    } else if v["changed"] == true {
        println!(
            "bridge {name}: chat {external} ↔ #{}; the bridge restarts to take it up",
            v["channel"].as_str().unwrap_or("?")
        );
    } else {
        println!("bridge {name}: chat {external} is already mapped so; nothing changed");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn unmap(
    conn: &mut Connection,
    name: String,
    external: String,
    json: bool,
) -> Result<ExitCode> {
    let args = json!({"bridge": name, "external": external});
    let v = channel_tool(conn, "bridge_map", args, None).await?;
    if json {
        println!("{v}");
    } else {
        println!("bridge {name}: chat {external} unmapped; the bridge restarts without it");
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn status(conn: &mut Connection, name: String, json: bool) -> Result<ExitCode> {
    let ControlReply::Json(text) = control(conn, ControlRequest::Bridges).await? else {
        bail!("unexpected answer to bridge status");
    };
    let list: serde_json::Value = serde_json::from_str(&text)?;
    let all = list.as_array().cloned().unwrap_or_default();
    let Some(b) = all.iter().find(|b| b["name"] == name.as_str()) else {
        let known: Vec<&str> = all.iter().filter_map(|b| b["name"].as_str()).collect();
        if known.is_empty() {
            bail!(
                "no bridge `{name}`: this swarm has no bridges (add a `bridges:` section to the swarm file)"
            );
        }
        bail!("no bridge `{name}` in this swarm; its bridges: {}", known.join(", "));
    };
    if json {
        println!("{}", serde_json::to_string_pretty(b)?);
    } else {
        print!("{}", bridge_status_text(b));
    }
    Ok(ExitCode::SUCCESS)
}
