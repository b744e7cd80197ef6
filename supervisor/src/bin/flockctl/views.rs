//! What the running swarm shows: `ps` (once or live), chains in flight, logs, dead letters, a
//! session.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use anyhow::{Result, bail};
use flock_ipc::{Connection, ControlReply, ControlRequest, PsRow};
use flock_supervisor::live;

use crate::*;

pub(crate) async fn ps_table(conn: &mut Connection, json: bool) -> Result<ExitCode> {
    let rows = ps(conn).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", live::table(&rows, live::colour_wanted(), live::terminal_width()));
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn ps_watch(conn: &mut Connection, json: bool, interval: u64) -> Result<ExitCode> {
    let interval = std::time::Duration::from_secs(interval);
    // Ctrl-C (or SIGTERM) ends the view cleanly: the terminal is given back as it was.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let stop = async {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    tokio::select! {
        r = watch_ps(conn, json, interval) => r,
        _ = stop => Ok(ExitCode::SUCCESS),
    }
}

pub(crate) async fn chains(conn: &mut Connection, json: bool) -> Result<ExitCode> {
    let ControlReply::Chains(rows) = control(conn, ControlRequest::Chains).await? else {
        bail!("unexpected answer to chains");
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&flock_supervisor::control::chain_rows_json(&rows))?
        );
    } else if rows.is_empty() {
        println!("no chains in flight");
    } else {
        println!(
            "{:<32}  {:<16}  {:<12}  {:>9}  {:>13}  {:>11}  {:<10}  TEXT",
            "CHAIN", "FROM", "TO", "HOPS", "TOKENS", "TIME", "STATE"
        );
        for r in &rows {
            println!(
                "{:<32}  {:<16}  {:<12}  {:>9}  {:>13}  {:>11}  {:<10}  {}",
                flock_ipc::id::fmt_id(r.id),
                r.origin,
                r.entry,
                format!("{}/{}", r.hops, r.max_hops),
                format!("{}/{}", r.tokens, r.max_tokens),
                format!("{}/{}s", r.age_ms / 1000, r.max_wall_ms / 1000),
                r.state,
                r.text
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn logs(
    conn: &mut Connection,
    agent: Option<String>,
    follow: bool,
    lines: u32,
) -> Result<ExitCode> {
    // Without an agent, lines carry the name of their log: line them up from the start
    // with the names of every process.
    let mut prefix = if agent.is_none() {
        let rows = ps(conn).await?;
        // Agents, the model, the bridges: the rows that have a log.
        let logged = |r: &&PsRow| matches!(r.kind.as_str(), "agent" | "process" | "bridge");
        let names = rows.iter().filter(logged).map(|r| r.name.as_str());
        let prefixer = live::Prefixer::new(names, live::colour_wanted());
        // A person at a terminal reads short ids; a pipe gets them whole.
        Some(if std::io::stdout().is_terminal() { prefixer.short_ids() } else { prefixer })
    } else {
        None
    };
    let req = ControlRequest::Logs { agent, lines, follow };
    let mut reply = control(conn, req).await?;
    let mut out = std::io::stdout().lock();
    loop {
        let written = match (&reply, &mut prefix) {
            (ControlReply::LogLines(lines), _) => {
                lines.iter().try_for_each(|l| writeln!(out, "{l}"))
            }
            (ControlReply::SourcedLogLines(lines), Some(p)) => {
                lines.iter().try_for_each(|l| writeln!(out, "{}", p.line(&l.source, &l.line)))
            }
            _ => Ok(()),
        };
        if let Err(e) = written.and_then(|()| out.flush()) {
            // The reader went away (`| head`): nothing more to show.
            return if e.kind() == std::io::ErrorKind::BrokenPipe {
                Ok(ExitCode::SUCCESS)
            } else {
                Err(e.into())
            };
        }
        if !follow {
            return Ok(ExitCode::SUCCESS);
        }
        reply = match next_reply(conn).await? {
            Some(next) => next,
            // `down` (or a crash) ended the swarm: the lines ended with it, as `docker logs -f`.
            None => {
                eprintln!("flockctl: the swarm stopped; no more lines");
                return Ok(ExitCode::SUCCESS);
            }
        };
    }
}

pub(crate) async fn dead_letters(
    conn: &mut Connection,
    limit: u32,
    offset: u32,
    json: bool,
) -> Result<ExitCode> {
    let limit = limit.clamp(1, 500);
    let ControlReply::DeadLetters(letters) =
        control(conn, ControlRequest::DeadLetters { offset, limit }).await?
    else {
        bail!("unexpected answer");
    };
    if json {
        let v: Vec<_> = letters
            .iter()
            .map(|d| {
                serde_json::json!({"id": flock_ipc::id::fmt_id(d.id), "sender": d.sender,
                "target": d.target, "text": d.text, "attempts": d.attempts, "reason": d.reason})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if letters.is_empty() {
        println!("no dead letters{}", if offset > 0 { " on this page" } else { "" });
    } else {
        let full = letters.len() as u32 == limit;
        for d in letters {
            println!(
                "{} {} → {} ({} attempts: {}): {:?}",
                flock_ipc::id::fmt_id(d.id),
                d.sender,
                d.target,
                d.attempts,
                d.reason,
                d.text
            );
        }
        if full {
            println!("(more may follow: flockctl dead-letters --offset {})", offset + limit);
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn session(
    conn: &mut Connection,
    agent: String,
    channel: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let listing = channel.is_none();
    let reply = control(conn, ControlRequest::Session { agent, channel }).await?;
    let ControlReply::Json(text) = reply else { bail!("unexpected answer") };
    let v: serde_json::Value = serde_json::from_str(&text)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if listing {
        for s in v["sessions"].as_array().cloned().unwrap_or_default() {
            let c = s["channel"].as_str().unwrap_or_default();
            println!(
                "{:<28} {:>5} messages{}",
                if c.is_empty() { "(direct)".to_owned() } else { format!("#{c}") },
                s["messages"],
                if s["closed"].as_bool() == Some(true) {
                    "  (closed: channel archived)"
                } else {
                    ""
                }
            );
        }
    } else {
        for m in v["messages"].as_array().cloned().unwrap_or_default() {
            let text = m["text"].as_str().or(m["content"].as_str()).unwrap_or_default();
            match m["role"].as_str().unwrap_or_default() {
                "user" => println!("[{}] {}", m["from"].as_str().unwrap_or_default(), text),
                "tool_call" => println!(
                    "  → {} {}",
                    m["name"].as_str().unwrap_or_default(),
                    m["arguments"].as_str().unwrap_or_default()
                ),
                "tool_result" => println!("  ← {}", text),
                "assistant" => println!("[assistant] {text}"),
                other => println!("[{other}] {text}"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
pub(crate) async fn ps(conn: &mut Connection) -> Result<Vec<PsRow>> {
    match control(conn, ControlRequest::Ps).await? {
        ControlReply::Ps(rows) => Ok(rows),
        other => bail!("unexpected answer to ps: {other:?}"),
    }
}

/// `ps --watch`: on a terminal, a live view redrawn in place; piped, a table (or a line of
/// JSON) every `interval`, with no escape codes.
pub(crate) async fn watch_ps(
    conn: &mut Connection,
    json: bool,
    interval: std::time::Duration,
) -> Result<ExitCode> {
    let mut screen =
        if !json && live::stdout_is_tty() { Some(live::Screen::enter()?) } else { None };
    let colour = screen.is_some() && live::colour_wanted();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first = true;
    loop {
        tick.tick().await;
        let rows = ps(conn).await?;
        let header = live::header(&rows, &flock_supervisor::logs::utc_now(), colour);
        let written = if json {
            let mut out = std::io::stdout().lock();
            writeln!(out, "{}", serde_json::to_string(&rows)?).and_then(|()| out.flush())
        } else if let Some(screen) = &mut screen {
            let hint = format!("every {} s, Ctrl-C to quit", interval.as_secs());
            let hint = if colour { format!("\x1b[2m{hint}\x1b[0m") } else { hint };
            screen.draw(&format!(
                "{header}  ({hint})\n\n{}",
                live::table(&rows, colour, live::terminal_width())
            ))
        } else {
            let mut out = std::io::stdout().lock();
            let gap = if first { "" } else { "\n" };
            write!(out, "{gap}{header}\n{}", live::table(&rows, false, live::terminal_width()))
                .and_then(|()| out.flush())
        };
        first = false;
        if let Err(e) = written {
            return if e.kind() == std::io::ErrorKind::BrokenPipe {
                Ok(ExitCode::SUCCESS)
            } else {
                Err(e.into())
            };
        }
    }
}
