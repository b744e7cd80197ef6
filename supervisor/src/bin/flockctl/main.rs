//! `flockctl`: drive a running swarm over its control socket.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use flock_ipc::{Body, Connection, ControlReply, ControlRequest, Frame, PsRow, ROUTER, SendMode};
use flock_supervisor::paths::StateDir;
use flock_supervisor::{journal_cli, live, memory_cli};
use serde_json::json;

mod args;
mod bridge;

use args::*;
use bridge::{bridge_status_text, slack_manifest};

/// The text as given, or standard input for `-`.
fn text_or_stdin(text: String) -> Result<String> {
    if text != "-" {
        return Ok(text);
    }
    let mut buf = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut buf)
        .context("read the text from standard input (it must be UTF-8)")?;
    Ok(buf)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flockctl: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("flockctl: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn connect(state: &StateDir) -> Result<Connection> {
    let socket = state.control_socket();
    if !socket.exists() {
        bail!(
            "no swarm is running with state dir {} (no {}); start one with `flock-supervisor up FILE`{}",
            state.root.display(),
            socket.display(),
            if std::env::var_os("FLOCK_HOME").is_none() {
                " or pass --state-dir / FLOCK_HOME"
            } else {
                ""
            }
        );
    }
    match Connection::client(&socket, "flockctl").await {
        Ok(conn) => Ok(conn),
        Err(flock_ipc::conn::ConnectError::Io { source, .. })
            if source.kind() == std::io::ErrorKind::ConnectionRefused =>
        {
            bail!(
                "no supervisor answers at {} (it was stopped or killed); start it again with `flock-supervisor up FILE --state-dir {}`",
                socket.display(),
                state.root.display()
            )
        }
        Err(e) => {
            Err(e).with_context(|| format!("connect to the supervisor at {}", socket.display()))
        }
    }
}

/// Sends one control request and returns the first answer.
async fn control(conn: &mut Connection, request: ControlRequest) -> Result<ControlReply> {
    let frame = Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(request));
    conn.outbox.send(frame).await.map_err(|_| anyhow!("the supervisor closed the connection"))?;
    next_reply(conn).await
}

async fn next_reply(conn: &mut Connection) -> Result<ControlReply> {
    loop {
        match conn.reader.read_frame().await? {
            Some(Frame { body: Body::ControlReply(r), .. }) => return Ok(r),
            Some(Frame { body: Body::Error { code, message }, .. }) => bail!("{code}: {message}"),
            Some(_) => continue,
            None => bail!("the supervisor closed the connection"),
        }
    }
}

async fn ps(conn: &mut Connection) -> Result<Vec<PsRow>> {
    match control(conn, ControlRequest::Ps).await? {
        ControlReply::Ps(rows) => Ok(rows),
        other => bail!("unexpected answer to ps: {other:?}"),
    }
}

/// `ps --watch`: on a terminal, a live view redrawn in place; piped, a table (or a line of
/// JSON) every `interval`, with no escape codes.
async fn watch_ps(
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
            screen.draw(&format!("{header}  ({hint})\n\n{}", live::table(&rows, colour)))
        } else {
            let mut out = std::io::stdout().lock();
            let gap = if first { "" } else { "\n" };
            write!(out, "{gap}{header}\n{}", live::table(&rows, false)).and_then(|()| out.flush())
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

/// `flockctl logs [AGENT]` with no swarm running: the files.
fn logs_without_swarm(state: &StateDir, agent: Option<&str>, lines: usize) -> Result<ExitCode> {
    let dir = state.logs_dir();
    let mut out = std::io::stdout().lock();
    if let Some(agent) = agent {
        let path = state.agent_log(agent);
        if !path.exists() {
            bail!("no log for `{agent}` in {} and no swarm is running", dir.display());
        }
        eprintln!("(no swarm is running; showing {})", path.display());
        for line in flock_supervisor::logs::tail_lines(&path, lines) {
            writeln!(out, "{line}")?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Every `NAME.log` (rotated ones end in .log.N) but the supervisor's own output.
    let mut logs = Vec::new();
    for entry in std::fs::read_dir(&dir)
        .with_context(|| format!("no logs in {} and no swarm is running", dir.display()))?
    {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()?.strip_suffix(".log")) else {
            continue;
        };
        if name != "supervisor" {
            let tail = flock_supervisor::logs::tail_lines(&path, lines);
            logs.push((name.to_owned(), tail.into_iter().collect()));
        }
    }
    logs.sort();
    eprintln!("(no swarm is running; showing the logs in {})", dir.display());
    let mut prefix =
        live::Prefixer::new(logs.iter().map(|(n, _)| n.as_str()), live::colour_wanted());
    for (source, line) in flock_supervisor::logs::merge(logs) {
        writeln!(out, "{}", prefix.line(&source, &line))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `flockctl man`: the manual pages of both commands, one per subcommand too.
fn man_pages(dir: &std::path::Path) -> Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for cmd in [
        <Cli as clap::CommandFactory>::command(),
        <flock_supervisor::cli::Cli as clap::CommandFactory>::command(),
    ] {
        let name = cmd.get_name().to_owned();
        clap_mangen::generate_to(cmd, dir)
            .with_context(|| format!("write the manual pages of {name} to {}", dir.display()))?;
    }
    let mut pages: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("flock") && n.ends_with(".1"))
        .collect();
    pages.sort();
    println!("wrote {} manual pages to {}: {}", pages.len(), dir.display(), pages.join(" "));
    Ok(ExitCode::SUCCESS)
}

/// The DM of the operator with `agent` (where its answers are posted).
fn dm_of(agent: &str) -> String {
    flock_actors::channels::delta::dm_channel_id(agent, "human:operator")
}

/// Waits for chain `id` to end (`send --wait`), printing progress to stderr every 10 s.
async fn wait_for_end(
    conn: &mut Connection,
    id: flock_ipc::MsgId,
    timeout: u64,
    json: bool,
) -> Result<ExitCode> {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let deadline = started + Duration::from_secs(timeout);
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(10),
        Duration::from_secs(10),
    );
    loop {
        tokio::select! {
            frame = conn.reader.read_frame() => match frame? {
                Some(Frame { body: Body::ChainEnded(end), .. }) if end.chain == id => {
                    let code = match end.outcome {
                        flock_ipc::ChainOutcome::Answered => 0,
                        flock_ipc::ChainOutcome::Stopped => 3,
                        flock_ipc::ChainOutcome::Ended => 4,
                    };
                    if json {
                        println!("{}", serde_json::to_string_pretty(&json!({
                            "chain": flock_ipc::id::fmt_id(end.chain), "outcome": end.outcome.as_str(),
                            "text": end.text, "by": end.by, "channel": end.channel, "seq": end.seq,
                            "hops": end.hops, "tokens": end.tokens, "elapsed_ms": end.elapsed_ms,
                        }))?);
                    } else {
                        println!("{}", end.text);
                        eprintln!(
                            "({} by {} in {:.1} s: {} hops, {} tokens{})",
                            end.outcome.as_str(),
                            end.by,
                            end.elapsed_ms as f64 / 1000.0,
                            end.hops,
                            end.tokens,
                            if end.channel.is_empty() { String::new() } else { format!("; #{} seq {}", end.channel, end.seq) }
                        );
                    }
                    return Ok(ExitCode::from(code));
                }
                Some(Frame { body: Body::ControlReply(ControlReply::Chains(rows)), .. }) => {
                    if let Some(r) = rows.iter().find(|r| r.id == id) {
                        eprintln!(
                            "… {} s: {} hops, {} tokens, {}",
                            started.elapsed().as_secs(), r.hops, r.tokens, r.state
                        );
                    }
                }
                Some(Frame { body: Body::Error { code, message }, .. }) => bail!("{code}: {message}"),
                Some(_) => continue,
                None => bail!("the supervisor closed the connection before the answer came"),
            },
            _ = tokio::time::sleep_until(deadline.into()) => {
                eprintln!(
                    "no answer within {timeout} s; the work goes on (flockctl chains; flockctl journal query corr={})",
                    flock_ipc::id::fmt_id(id)
                );
                return Ok(ExitCode::from(5));
            }
            _ = tick.tick() => {
                let ask = Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(ControlRequest::Chains));
                conn.outbox.send(ask).await.map_err(|_| anyhow!("the supervisor closed the connection"))?;
            }
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    // Needs no state dir and no swarm.
    if let Command::Bridge { command: BridgeCommand::Manifest { name, .. } } = &cli.command {
        print!("{}", slack_manifest(name));
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Completions { shell } = &cli.command {
        let mut cmd = <Cli as clap::CommandFactory>::command();
        clap_complete::generate(*shell, &mut cmd, "flockctl", &mut std::io::stdout());
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Man { dir } = &cli.command {
        return man_pages(dir);
    }
    let state = StateDir::resolve(cli.state_dir.as_deref())?;
    if let Command::Ui { open } = &cli.command {
        return ui(&state, *open);
    }
    // Memory is files and a rebuildable index: no running swarm needed either.
    if let Command::Memory { command } = &cli.command {
        state.existing()?;
        let dir = state.memory_dir();
        let out = match command {
            MemoryCommand::Search { query, limit, all, kind, mode, agent, json } => {
                let ask = memory_cli::Search {
                    text: query,
                    limit: *limit,
                    all: *all,
                    kinds: kind,
                    mode: memory_cli::mode(mode)?,
                    agent: agent.as_deref(),
                };
                memory_cli::search(&dir, &ask, *json)?
            }
            MemoryCommand::Show { id, json } => memory_cli::show(&dir, id, *json)?,
            MemoryCommand::Stats { json } => memory_cli::stats(&dir, *json)?,
            MemoryCommand::Rebuild => memory_cli::rebuild(&dir)?,
        };
        print!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    // The journal is a file: it is read and written without a running swarm.
    if let Command::Journal { command } = &cli.command {
        state.existing()?;
        let journal = flock_actors::journal::Journal::open(
            state.journal_dir(),
            flock_actors::journal::DEFAULT_MAX_BYTES,
        )?;
        let out = match command {
            JournalCommand::Read { last, json } => journal_cli::read(&journal, *last, *json)?,
            JournalCommand::Query { expr, json } => journal_cli::query(&journal, expr, *json)?,
            JournalCommand::Log { json } => journal_cli::log(&journal, json)?,
        };
        print!("{out}");
        if !out.is_empty() && !out.ends_with('\n') {
            println!();
        }
        return Ok(ExitCode::SUCCESS);
    }
    // Logs outlive the swarm: read the files when no supervisor is running.
    if let Command::Logs { agent, follow: false, lines } = &cli.command
        && std::os::unix::net::UnixStream::connect(state.control_socket()).is_err()
    {
        return logs_without_swarm(&state, agent.as_deref(), *lines as usize);
    }
    let mut conn = connect(&state).await?;
    match cli.command {
        Command::Ps { json, watch: false, .. } => {
            let rows = ps(&mut conn).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                print!("{}", live::table(&rows, live::colour_wanted()));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Ps { json, watch: true, interval } => {
            let interval = std::time::Duration::from_secs(interval);
            // Ctrl-C (or SIGTERM) ends the view cleanly: the terminal is given back as it was.
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
            let stop = async {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            };
            tokio::select! {
                r = watch_ps(&mut conn, json, interval) => r,
                _ = stop => Ok(ExitCode::SUCCESS),
            }
        }
        Command::Send { agent, text, at_most_once, wait, timeout, json } => {
            let text = text_or_stdin(text)?;
            let mode = if at_most_once { SendMode::AtMostOnce } else { SendMode::Durable };
            let frame = Frame::new(flock_ipc::OPERATOR, &agent, Body::Send { text, mode });
            let id = frame.id;
            conn.outbox
                .send(frame)
                .await
                .map_err(|_| anyhow!("the supervisor closed the connection"))?;
            if at_most_once {
                // Only a failure is answered; wait briefly for one.
                let answer = tokio::time::timeout(
                    std::time::Duration::from_millis(300),
                    conn.reader.read_frame(),
                )
                .await;
                if let Ok(Ok(Some(Frame { body: Body::Error { code, message }, .. }))) = answer {
                    bail!("{code}: {message}");
                }
                println!("routed to {agent} (at_most_once)");
                return Ok(ExitCode::SUCCESS);
            }
            // The message id is its chain's id: watch it before anything can end it.
            let watch = Frame::new(
                flock_ipc::OPERATOR,
                ROUTER,
                Body::Control(ControlRequest::Watch { chain: id }),
            );
            if wait {
                conn.outbox
                    .send(watch)
                    .await
                    .map_err(|_| anyhow!("the supervisor closed the connection"))?;
            }
            loop {
                match conn.reader.read_frame().await? {
                    Some(f) if f.correlation_id == Some(id) => match f.body {
                        Body::Accepted => {
                            let chain = flock_ipc::id::fmt_id(id);
                            if !wait {
                                println!(
                                    "accepted into {agent}'s mailbox (chain {chain}); the answer will be in your DM: flockctl read {}",
                                    dm_of(&agent)
                                );
                                return Ok(ExitCode::SUCCESS);
                            }
                            eprintln!(
                                "accepted into {agent}'s mailbox (chain {chain}); waiting for the answer…"
                            );
                            break;
                        }
                        Body::Error { code, message } => bail!("{code}: {message}"),
                        other => bail!("unexpected {} answer", other.kind()),
                    },
                    Some(_) => continue,
                    None => {
                        bail!("the supervisor closed the connection before accepting the message")
                    }
                }
            }
            wait_for_end(&mut conn, id, timeout, json).await
        }
        Command::Bridge { command: BridgeCommand::Ls { json } } => {
            let ControlReply::Json(text) = control(&mut conn, ControlRequest::Bridges).await?
            else {
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
                    "no bridges: add a `bridges:` section to the swarm file (README \"Chat bridges\")"
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
        Command::Bridge {
            command: BridgeCommand::Map { name, external, channel, allow, json },
        } => {
            let args = json!({"bridge": name, "external": external, "channel": channel,
                              "allow": allow});
            let v = channel_tool(&mut conn, "bridge_map", args, None).await?;
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
        Command::Bridge { command: BridgeCommand::Unmap { name, external, json } } => {
            let args = json!({"bridge": name, "external": external});
            let v = channel_tool(&mut conn, "bridge_map", args, None).await?;
            if json {
                println!("{v}");
            } else {
                println!("bridge {name}: chat {external} unmapped; the bridge restarts without it");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bridge { command: BridgeCommand::Status { name, json } } => {
            let ControlReply::Json(text) = control(&mut conn, ControlRequest::Bridges).await?
            else {
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
        Command::Chains { json } => {
            let ControlReply::Chains(rows) = control(&mut conn, ControlRequest::Chains).await?
            else {
                bail!("unexpected answer to chains");
            };
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&flock_supervisor::control::chain_rows_json(
                        &rows
                    ))?
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
        Command::Logs { agent, follow, lines } => {
            // Without an agent, lines carry the name of their log: line them up from the start
            // with the names of every process.
            let mut prefix = if agent.is_none() {
                let rows = ps(&mut conn).await?;
                // Agents, the model, the bridges: the rows that have a log.
                let logged = |r: &&PsRow| matches!(r.kind.as_str(), "agent" | "process" | "bridge");
                let names = rows.iter().filter(logged).map(|r| r.name.as_str());
                Some(live::Prefixer::new(names, live::colour_wanted()))
            } else {
                None
            };
            let req = ControlRequest::Logs { agent, lines, follow };
            let mut reply = control(&mut conn, req).await?;
            let mut out = std::io::stdout().lock();
            loop {
                let written = match (&reply, &mut prefix) {
                    (ControlReply::LogLines(lines), _) => {
                        lines.iter().try_for_each(|l| writeln!(out, "{l}"))
                    }
                    (ControlReply::SourcedLogLines(lines), Some(p)) => lines
                        .iter()
                        .try_for_each(|l| writeln!(out, "{}", p.line(&l.source, &l.line))),
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
                reply = next_reply(&mut conn).await?;
            }
        }
        Command::Stop { agent } => done(control(&mut conn, ControlRequest::Stop { agent }).await?),
        Command::Start { agent } => {
            done(control(&mut conn, ControlRequest::Start { agent }).await?)
        }
        Command::Restart { agent } => {
            done(control(&mut conn, ControlRequest::Restart { agent }).await?)
        }
        Command::DeadLetters { limit, offset, json } => {
            let limit = limit.clamp(1, 500);
            let ControlReply::DeadLetters(letters) =
                control(&mut conn, ControlRequest::DeadLetters { offset, limit }).await?
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
                    println!(
                        "(more may follow: flockctl dead-letters --offset {})",
                        offset + limit
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Journal { .. }
        | Command::Memory { .. }
        | Command::Completions { .. }
        | Command::Ui { .. }
        | Command::Man { .. }
        | Command::Bridge { command: BridgeCommand::Manifest { .. } } => {
            unreachable!("handled before connecting")
        }
        Command::Approvals { all, json } => {
            let req = ControlRequest::Channel {
                tool: "permission_list".into(),
                arguments: json!({"all": all}).to_string(),
                as_name: person(None),
            };
            let ControlReply::Json(text) = control(&mut conn, req).await? else {
                bail!("unexpected answer to permission_list");
            };
            if json {
                println!("{text}");
                return Ok(ExitCode::SUCCESS);
            }
            let rows: Vec<serde_json::Value> = serde_json::from_str(&text)?;
            if rows.is_empty() {
                println!(
                    "{}",
                    if all { "no permission requests" } else { "nothing waits for a decision" }
                );
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
        Command::Approve { id, reason, expires, as_name } => {
            decide(&mut conn, id, true, reason, expires, as_name).await
        }
        Command::Deny { id, reason, as_name } => {
            decide(&mut conn, id, false, reason, None, as_name).await
        }
        Command::Post { channel, text, as_name } => {
            let text = text_or_stdin(text)?;
            let args = json!({"channel": channel, "text": text});
            let r = channel_tool(&mut conn, "flock_channel_post", args, as_name).await?;
            println!("posted to #{} as seq {}", r["channel"].as_str().unwrap_or(""), r["seq"]);
            Ok(ExitCode::SUCCESS)
        }
        Command::Read { channel, after, limit, follow, json } => {
            let mut after = after;
            loop {
                let mut args = json!({"channel": channel, "limit": limit});
                if let Some(a) = after {
                    args["after"] = json!(a);
                }
                let r = channel_tool(&mut conn, "flock_channel_read", args, None).await?;
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
        Command::Channels { json } => {
            let r = channel_tool(&mut conn, "flock_channel_list", json!({}), None).await?;
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
        Command::Session { command: SessionCommand::Show { agent, channel, json } } => {
            let listing = channel.is_none();
            let reply = control(&mut conn, ControlRequest::Session { agent, channel }).await?;
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
        Command::Agent { command } => {
            let (tool, args, as_name) = match command {
                AgentCommand::Create { name, role, archetype, description, model, as_name } => {
                    let mut args = json!({"name": name, "role": role, "description": description});
                    if let Some(a) = archetype {
                        args["archetype"] = json!(a);
                    }
                    if let Some(m) = model {
                        args["model"] = json!(m);
                    }
                    ("flock_create_agent", args, as_name)
                }
                AgentCommand::Decommission { name, as_name } => {
                    ("flock_decommission_agent", json!({"name": name}), as_name)
                }
            };
            let r = channel_tool(&mut conn, tool, args, as_name).await?;
            println!("{r}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Channel { command } => {
            let (tool, args, as_name) = match command {
                ChannelCommand::Create { channel, topic, name, members, as_name } => {
                    let mut args = json!({"channel": channel, "topic": topic, "members": members});
                    if let Some(n) = name {
                        args["name"] = json!(n);
                    }
                    ("flock_channel_create", args, as_name)
                }
                ChannelCommand::Archive { channel, force, as_name } => {
                    ("flock_channel_archive", json!({"channel": channel, "force": force}), as_name)
                }
                ChannelCommand::Members { channel, add, remove, as_name } => {
                    if add.is_empty() && remove.is_empty() {
                        let r =
                            channel_tool(&mut conn, "flock_channel_list", json!({}), None).await?;
                        let id = channel.trim_start_matches('#');
                        let Some(c) =
                            r.as_array().and_then(|l| l.iter().find(|c| c["channel"] == id))
                        else {
                            bail!("no channel `#{id}`; `flockctl channels` lists them");
                        };
                        for m in c["members"].as_array().cloned().unwrap_or_default() {
                            println!("{}", m.as_str().unwrap_or(""));
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                    let args = json!({"channel": channel, "add": add, "remove": remove});
                    ("flock_assign_members", args, as_name)
                }
            };
            let r = channel_tool(&mut conn, tool, args, as_name).await?;
            println!("{r}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Down => {
            let reply = control(&mut conn, ControlRequest::Down).await?;
            if let ControlReply::Done(msg) = reply {
                println!("{msg}");
            }
            // Wait until the supervisor has gone (its socket closes).
            while conn.reader.read_frame().await.ok().flatten().is_some() {}
            println!("swarm stopped");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `approve` / `deny`: a person's decision on a permission request.
async fn decide(
    conn: &mut Connection,
    id: i64,
    approve: bool,
    reason: Option<String>,
    expires_secs: Option<u64>,
    as_name: Option<String>,
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
    done(control(conn, req).await?)
}

/// The person `flockctl` acts as: --as, else $USER, else operator.
/// `flockctl ui`: the URL the running supervisor wrote (its token changes with every run).
fn ui(state: &StateDir, open: bool) -> Result<ExitCode> {
    let file = flock_supervisor::web::ui_url_file(state);
    let url = match std::fs::read_to_string(&file) {
        Ok(u) if std::os::unix::net::UnixStream::connect(state.control_socket()).is_ok() => u,
        _ => bail!(
            "no dashboard is being served for state dir {}: start the swarm with `flock-supervisor up FILE --ui 127.0.0.1:8080` (any free port; 0 picks one)",
            state.root.display()
        ),
    };
    let url = url.trim();
    println!("{url}");
    if open {
        let browser = std::env::var("BROWSER").unwrap_or_else(|_| "xdg-open".into());
        if let Err(e) = std::process::Command::new(&browser).arg(url).status() {
            bail!("cannot run {browser} to open the URL: {e}; open it by hand");
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn person(as_name: Option<String>) -> String {
    as_name
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "operator".into())
}

/// Runs a channel tool as `human:<name>` and returns its JSON result.
async fn channel_tool(
    conn: &mut Connection,
    tool: &str,
    args: serde_json::Value,
    as_name: Option<String>,
) -> Result<serde_json::Value> {
    let req = ControlRequest::Channel {
        tool: tool.into(),
        arguments: args.to_string(),
        as_name: person(as_name),
    };
    match control(conn, req).await? {
        ControlReply::Json(text) => Ok(serde_json::from_str(&text)?),
        other => bail!("unexpected answer {other:?}"),
    }
}

fn done(reply: ControlReply) -> Result<ExitCode> {
    if let ControlReply::Done(msg) = reply {
        println!("{msg}");
    }
    Ok(ExitCode::SUCCESS)
}
