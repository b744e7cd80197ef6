//! `flockctl`: drive a running swarm over its control socket.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use flock_ipc::{Body, Connection, ControlReply, ControlRequest, Frame, PsRow, ROUTER, SendMode};
use flock_supervisor::journal_cli;
use flock_supervisor::paths::StateDir;

#[derive(Parser)]
#[command(name = "flockctl", version, about = "Drive a running Flock swarm")]
struct Cli {
    /// State dir of the swarm [default: $FLOCK_HOME or ~/.flock].
    #[arg(long, global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List every process and actor: state, pid, uptime, restarts, last exit, mailbox, turns, memory.
    Ps {
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// Redraw every second until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Send a message to an agent; exits 0 once it is in the agent's durable mailbox.
    Send {
        agent: String,
        text: String,
        /// Route in memory only (lost if the agent is down); no acceptance is awaited.
        #[arg(long)]
        at_most_once: bool,
    },
    /// Show an agent's log (spawns, exits, turns, tool calls).
    Logs {
        agent: String,
        /// Keep printing new lines.
        #[arg(short, long)]
        follow: bool,
        /// How many past lines to show.
        #[arg(short = 'n', long, default_value_t = 100)]
        lines: u32,
    },
    /// Stop an agent (it stays stopped until `start`).
    Stop { agent: String },
    /// Start a stopped or failed agent; waits until it is ready.
    Start { agent: String },
    /// Restart an agent; waits until it is ready again.
    Restart { agent: String },
    /// List messages that exhausted their delivery attempts.
    DeadLetters {
        #[arg(long)]
        json: bool,
    },
    /// Stop every agent in reverse start order, then the supervisor.
    Down,
    /// The shared journal: what happened, who did it, how it ended (works without a running swarm).
    Journal {
        #[command(subcommand)]
        command: JournalCommand,
    },
}

#[derive(Subcommand)]
enum JournalCommand {
    /// The newest events, oldest first.
    Read {
        /// How many events.
        #[arg(long, default_value_t = 20)]
        last: usize,
        /// Print a JSON array of schema events.
        #[arg(long)]
        json: bool,
    },
    /// Events matching space-separated terms: agent= type= status= since= until= corr= limit=
    /// (e.g. `flockctl journal query "agent=worker-1 status=FAILED since=2026-11-21"`).
    Query {
        expr: String,
        #[arg(long)]
        json: bool,
    },
    /// Append one event given as JSON (validated against the schema; id and timestamp are filled
    /// in when absent).
    Log { json: String },
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

async fn run(cli: Cli) -> Result<ExitCode> {
    let state = StateDir::resolve(cli.state_dir.as_deref())?;
    // The journal is a file: it is read and written without a running swarm.
    if let Command::Journal { command } = &cli.command {
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
    // Logs outlive the swarm: read the file when no supervisor is running.
    if let Command::Logs { agent, follow: false, lines } = &cli.command
        && std::os::unix::net::UnixStream::connect(state.control_socket()).is_err()
    {
        let path = state.agent_log(agent);
        if !path.exists() {
            bail!("no log for `{agent}` in {} and no swarm is running", state.logs_dir().display());
        }
        eprintln!("(no swarm is running; showing {})", path.display());
        for line in flock_supervisor::logs::tail_lines(&path, *lines as usize) {
            println!("{line}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut conn = connect(&state).await?;
    match cli.command {
        Command::Ps { json, watch } => loop {
            let ControlReply::Ps(rows) = control(&mut conn, ControlRequest::Ps).await? else {
                bail!("unexpected answer to ps");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                if watch {
                    print!("\x1b[2J\x1b[H");
                }
                print!("{}", table(&rows));
            }
            if !watch {
                return Ok(ExitCode::SUCCESS);
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        },
        Command::Send { agent, text, at_most_once } => {
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
            loop {
                match conn.reader.read_frame().await? {
                    Some(f) if f.correlation_id == Some(id) => match f.body {
                        Body::Accepted => {
                            println!(
                                "accepted into {agent}'s mailbox (id {})",
                                flock_ipc::id::fmt_id(id)
                            );
                            return Ok(ExitCode::SUCCESS);
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
        }
        Command::Logs { agent, follow, lines } => {
            let req = ControlRequest::Logs { agent, lines, follow };
            let mut reply = control(&mut conn, req).await?;
            loop {
                if let ControlReply::LogLines(lines) = &reply {
                    for l in lines {
                        println!("{l}");
                    }
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
        Command::DeadLetters { json } => {
            let ControlReply::DeadLetters(letters) =
                control(&mut conn, ControlRequest::DeadLetters).await?
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
                println!("no dead letters");
            } else {
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
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Journal { .. } => unreachable!("handled before connecting"),
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

fn done(reply: ControlReply) -> Result<ExitCode> {
    if let ControlReply::Done(msg) = reply {
        println!("{msg}");
    }
    Ok(ExitCode::SUCCESS)
}

fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        Some(b) => format!("{}K", b >> 10),
    }
}

fn human_secs(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s / 60) % 60),
    }
}

fn table(rows: &[PsRow]) -> String {
    let header = [
        "NAME",
        "KIND",
        "ROLE",
        "PID",
        "STATE",
        "UPTIME",
        "RESTARTS",
        "LAST EXIT",
        "MAILBOX",
        "TURNS",
        "RSS",
    ];
    let cells: Vec<[String; 11]> = rows
        .iter()
        .map(|r| {
            [
                r.name.clone(),
                r.kind.clone(),
                r.role.clone(),
                r.pid.map_or("-".into(), |p| p.to_string()),
                r.state.clone(),
                if r.pid.is_some() { human_secs(r.uptime_secs) } else { "-".into() },
                r.restarts.to_string(),
                r.last_exit.clone().unwrap_or_else(|| "-".into()),
                r.mailbox_depth.to_string(),
                r.turns_total.to_string(),
                human_bytes(r.rss_bytes),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cols: Vec<&str>, out: &mut String| {
        let parts: Vec<String> =
            cols.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(parts.join("  ").trim_end());
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in &cells {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}
