//! A person in the swarm's channels: `post`, `read` (once or following), `channels`, `channel
//! create|archive|members`, and `agent create|decommission` — the same tools agents call, with
//! the operator's identity.

use std::process::ExitCode;

use anyhow::{Result, bail};
use flock_ipc::Connection;
use serde_json::json;

use crate::args::*;
use crate::*;

pub(crate) async fn post(
    conn: &mut Connection,
    channel: String,
    text: String,
    as_name: Option<String>,
    as_json: bool,
) -> Result<ExitCode> {
    let text = text_or_stdin(text)?;
    let args = json!({"channel": channel, "text": text});
    let r = channel_tool(conn, "flock_channel_post", args, as_name).await?;
    if as_json {
        println!("{r}");
    } else {
        println!("posted to #{} as seq {}", r["channel"].as_str().unwrap_or(""), r["seq"]);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn read(
    conn: &mut Connection,
    channel: String,
    after: Option<u64>,
    limit: u64,
    follow: bool,
    json: bool,
) -> Result<ExitCode> {
    let mut after = after;
    loop {
        let mut args = json!({"channel": channel, "limit": limit});
        if let Some(a) = after {
            args["after"] = json!(a);
        }
        let r = channel_tool(conn, "flock_channel_read", args, None).await?;
        let messages = r["messages"].as_array().cloned().unwrap_or_default();
        if json {
            for m in &messages {
                println!("{m}");
            }
        } else {
            if after.is_none() {
                println!(
                    "#{} ({}) — {}{}",
                    r["channel"].as_str().unwrap_or(""),
                    r["state"].as_str().unwrap_or(""),
                    r["topic"].as_str().unwrap_or(""),
                    if messages.is_empty() { "\n(no messages)" } else { "" }
                );
            }
            for m in &messages {
                println!(
                    "[{}] {}: {}",
                    m["seq"],
                    m["author"].as_str().unwrap_or(""),
                    m["text"].as_str().unwrap_or("")
                );
            }
        }
        let last = messages.last().and_then(|m| m["seq"].as_u64());
        after = last.or(after).or(Some(r["last_seq"].as_u64().unwrap_or(0)));
        let more = r["more_after"].is_u64();
        if more {
            continue;
        }
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

pub(crate) async fn list(conn: &mut Connection, json: bool) -> Result<ExitCode> {
    let r = channel_tool(conn, "flock_channel_list", json!({}), None).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(ExitCode::SUCCESS);
    }
    let list = r.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no channels yet; create one with `flockctl channel create ID --topic …`");
    }
    for c in list {
        let members: Vec<&str> = c["members"]
            .as_array()
            .map(|m| m.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        println!(
            "#{:<24} {:<9} seq {:<5} {}  [{}]",
            c["channel"].as_str().unwrap_or(""),
            c["state"].as_str().unwrap_or(""),
            c["last_seq"],
            c["topic"].as_str().unwrap_or(""),
            members.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn agent(conn: &mut Connection, command: AgentCommand) -> Result<ExitCode> {
    let (tool, args, as_name, as_json) = match command {
        AgentCommand::Create { name, role, archetype, description, model, as_name, json } => {
            let mut args = json!({"name": name, "role": role, "description": description});
            if let Some(a) = archetype {
                args["archetype"] = json!(a);
            }
            if let Some(m) = model {
                args["model"] = json!(m);
            }
            ("flock_create_agent", args, as_name, json)
        }
        AgentCommand::Spawn { agent, instance, as_name, json } => {
            let mut args = json!({"agent": agent});
            if let Some(i) = instance {
                args["instance"] = json!(i);
            }
            ("agents__spawn", args, as_name, json)
        }
        AgentCommand::Decommission { name, as_name, json } => {
            ("flock_decommission_agent", json!({"name": name}), as_name, json)
        }
    };
    let r = channel_tool(conn, tool, args, as_name).await?;
    print_result(tool, &r, as_json);
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn channel(conn: &mut Connection, command: ChannelCommand) -> Result<ExitCode> {
    let (tool, args, as_name, as_json) = match command {
        ChannelCommand::Create { channel, topic, name, members, as_name, json } => {
            let mut args = json!({"channel": channel, "topic": topic, "members": members});
            if let Some(n) = name {
                args["name"] = json!(n);
            }
            ("flock_channel_create", args, as_name, json)
        }
        ChannelCommand::Archive { channel, force, as_name, json } => {
            ("flock_channel_archive", json!({"channel": channel, "force": force}), as_name, json)
        }
        ChannelCommand::Members { channel, add, remove, as_name, json } => {
            if add.is_empty() && remove.is_empty() {
                let r = channel_tool(conn, "flock_channel_list", json!({}), None).await?;
                let id = channel.trim_start_matches('#');
                let Some(c) = r.as_array().and_then(|l| l.iter().find(|c| c["channel"] == id))
                else {
                    bail!("no channel `#{id}`; `flockctl channels` lists them");
                };
                if json {
                    println!("{}", json!({"channel": id, "members": c["members"]}));
                    return Ok(ExitCode::SUCCESS);
                }
                for m in c["members"].as_array().cloned().unwrap_or_default() {
                    println!("{}", m.as_str().unwrap_or(""));
                }
                return Ok(ExitCode::SUCCESS);
            }
            let args = json!({"channel": channel, "add": add, "remove": remove});
            ("flock_assign_members", args, as_name, json)
        }
    };
    let r = channel_tool(conn, tool, args, as_name).await?;
    print_result(tool, &r, as_json);
    Ok(ExitCode::SUCCESS)
}

/// What a channel or agent command did: one line of text, or the tool's result as JSON.
fn print_result(tool: &str, r: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{r}");
        return;
    }
    let s = |k: &str| r[k].as_str().unwrap_or("?").to_owned();
    let list = |k: &str| {
        r[k].as_array()
            .map(|l| l.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    };
    match tool {
        "flock_channel_create" => {
            println!("created #{}; members: {}", s("channel"), list("members"))
        }
        "flock_channel_archive" => println!("#{}: {}", s("channel"), s("state")),
        "flock_assign_members" => println!("#{} members: {}", s("channel"), list("members")),
        "flock_create_agent" => {
            println!("created agent {} ({}), {}", s("name"), s("role"), s("state"))
        }
        "flock_decommission_agent" => println!("decommissioned {}", s("name")),
        "agents__spawn" => println!("spawned {} ({})", s("address"), s("state")),
        _ => println!("{r}"),
    }
}
