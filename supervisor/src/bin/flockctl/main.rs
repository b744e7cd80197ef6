//! `flockctl`: drive a running swarm over its control socket.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;
use flock_ipc::{Body, Connection, ControlReply, ControlRequest, Frame, ROUTER};
use flock_supervisor::paths::StateDir;
use flock_supervisor::{journal_cli, live, memory_cli};
use serde_json::json;

mod approvals;
mod args;
mod bridge;
mod channels;
mod complete;
mod init;
mod send;
mod views;

use args::*;
use bridge::slack_manifest;

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
    // A shell asking for completions (`COMPLETE=bash flockctl -- …`) is answered here, and the
    // process exits; anything else goes on.
    clap_complete::CompleteEnv::with_factory(<Cli as clap::CommandFactory>::command)
        .bin("flockctl")
        .complete();
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

/// A memory read (`memory_search`, `memory_get`) answered by the swarm running on `state`, if
/// one answers there (`None`: none is running; the caller reads the files itself).
async fn memory_read(state: &StateDir, tool: &str, arguments: String) -> Result<Option<String>> {
    let socket = state.control_socket();
    if !socket.exists() {
        return Ok(None);
    }
    let Ok(mut conn) = Connection::client(&socket, "flockctl").await else { return Ok(None) };
    let request = ControlRequest::Memory { tool: tool.to_owned(), arguments };
    match control(&mut conn, request).await? {
        ControlReply::Json(answer) => Ok(Some(answer)),
        other => bail!("unexpected answer to a memory read: {other:?}"),
    }
}

/// Sends one control request and returns the first answer.
async fn control(conn: &mut Connection, request: ControlRequest) -> Result<ControlReply> {
    let frame = Frame::new(flock_ipc::OPERATOR, ROUTER, Body::Control(request));
    conn.outbox.send(frame).await.map_err(|_| anyhow!("the supervisor closed the connection"))?;
    next_reply(conn).await?.ok_or_else(|| anyhow!("the supervisor closed the connection"))
}

/// The next reply on the control connection; `None` once the supervisor closed it (the swarm
/// stopped).
async fn next_reply(conn: &mut Connection) -> Result<Option<ControlReply>> {
    loop {
        match conn.reader.read_frame().await? {
            Some(Frame { body: Body::ControlReply(r), .. }) => return Ok(Some(r)),
            Some(Frame { body: Body::Error { code, message }, .. }) => bail!("{code}: {message}"),
            Some(_) => continue,
            None => return Ok(None),
        }
    }
}

/// `flockctl completions SHELL`: the script that has the shell ask this `flockctl` at each Tab
/// (subcommands, options, and the running swarm's agent and channel names). It is what
/// `COMPLETE=SHELL flockctl` prints, with this executable's path in it.
fn completions(shell: clap_complete::Shell) -> Result<ExitCode> {
    let me = std::env::current_exe().context("find this flockctl's path")?;
    let out = std::process::Command::new(&me)
        .env("COMPLETE", shell.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("run {} for the {shell} script", me.display()))?;
    if !out.status.success() || out.stdout.is_empty() {
        bail!(
            "{shell}: no completion script came out (dynamic completion supports bash, elvish, fish, powershell and zsh)"
        );
    }
    std::io::stdout().write_all(&out.stdout)?;
    Ok(ExitCode::SUCCESS)
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

async fn run(cli: Cli) -> Result<ExitCode> {
    // Needs no state dir and no swarm.
    if let Command::Bridge { command: BridgeCommand::Manifest { name, .. } } = &cli.command {
        print!("{}", slack_manifest(name));
        return Ok(ExitCode::SUCCESS);
    }
    if let Command::Completions { shell } = &cli.command {
        return completions(*shell);
    }
    if let Command::Man { dir } = &cli.command {
        return man_pages(dir);
    }
    if let Command::Init(args) = &cli.command {
        return init::run(args.clone()).await;
    }
    let state = StateDir::resolve(cli.state_dir.as_deref())?;
    if let Command::Ui { open, json } = &cli.command {
        return ui(&state, *open, *json);
    }
    // Memory is files and a rebuildable index: no running swarm needed either. A running swarm
    // answers reads itself: its memory thread holds the index and the embedding model warm.
    if let Command::Memory { command } = &cli.command {
        state.existing()?;
        let dir = state.memory_dir();
        let out = match command {
            MemoryCommand::Search { query, limit, all, mode, agent, filter, json } => {
                let ask = memory_cli::Search {
                    text: query,
                    limit: *limit,
                    all: *all,
                    kinds: &filter.kind,
                    mode: memory_cli::mode(mode)?,
                    agent: agent.as_deref(),
                    priority: filter.priority.as_deref(),
                    category: filter.category.as_deref(),
                    since: filter.since.as_deref(),
                    until: filter.until.as_deref(),
                };
                let arguments = memory_cli::arguments(&ask)?;
                let started = std::time::Instant::now();
                let found = match memory_read(&state, "memory_search", arguments).await? {
                    Some(answer) => memory_cli::found(&answer, started.elapsed())?,
                    None => memory_cli::search_here(&dir, &ask)?,
                };
                memory_cli::render(&found, &ask, *json)?
            }
            MemoryCommand::Show { id, json } => {
                let arguments = serde_json::json!({ "id": id }).to_string();
                let record = match memory_read(&state, "memory_get", arguments).await? {
                    Some(answer) => serde_json::from_str(&answer)?,
                    None => memory_cli::show_here(&dir, id)?,
                };
                memory_cli::render_record(&record, *json)?
            }
            MemoryCommand::Stats { json } => memory_cli::stats(&dir, *json)?,
            MemoryCommand::Archive { to, from, older_than, since, until, dry_run, json } => {
                let ask = flock_memory::tiers::Ask {
                    to,
                    from,
                    since: since.as_deref(),
                    until: until.as_deref(),
                    older_than_days: *older_than,
                };
                let arguments = memory_cli::archive_arguments(&ask, *dry_run);
                let (answer, here) = match memory_read(&state, "memory__archive", arguments).await?
                {
                    Some(answer) => (answer, false),
                    None => (memory_cli::archive_here(&dir, &ask, *dry_run)?, true),
                };
                memory_cli::render_moved(&answer, *json, here)?
            }
            MemoryCommand::Config { json } => {
                let (answer, here) =
                    match memory_read(&state, "memory__config", "{}".into()).await? {
                        Some(answer) => (answer, false),
                        None => (memory_cli::config_here(&dir), true),
                    };
                memory_cli::render_config(&answer, *json, here)?
            }
            MemoryCommand::Rebuild => memory_cli::rebuild(&dir)?,
            MemoryCommand::Export { filter: f } => {
                let filter = flock_memory::index::Filter::parse(
                    f.priority.as_deref(),
                    f.category.as_deref(),
                    f.since.as_deref(),
                    f.until.as_deref(),
                )
                .map_err(|e| anyhow!(e))?;
                memory_cli::export(&dir, &f.kind, &filter)?
            }
        };
        print!("{out}");
        return Ok(ExitCode::SUCCESS);
    }
    // The journal is a file: it is read and written without a running swarm.
    if let Command::Journal { command } = &cli.command {
        state.existing()?;
        let journal =
            flock_journal::Journal::open(state.journal_dir(), flock_journal::DEFAULT_MAX_BYTES)?;
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
    // `down` is idempotent: a state dir whose swarm is not running has nothing to stop (a state
    // dir that is not there is still an error: a mistyped --state-dir must not look stopped).
    if let Command::Down { json } = cli.command
        && std::os::unix::net::UnixStream::connect(state.control_socket()).is_err()
    {
        state.existing()?;
        let msg =
            format!("no swarm is running with state dir {}; nothing to stop", state.root.display());
        if json {
            println!("{}", json!({"stopped": false, "message": msg}));
        } else {
            println!("{msg}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let mut conn = connect(&state).await?;
    match cli.command {
        Command::Ps { json, watch: false, .. } => views::ps_table(&mut conn, json).await,
        Command::Ps { json, watch: true, interval } => {
            views::ps_watch(&mut conn, json, interval).await
        }
        Command::Send { agent, text, at_most_once, wait, timeout, json } => {
            send::send(&mut conn, agent, text, at_most_once, wait, timeout, json).await
        }
        Command::Bridge { command: BridgeCommand::Ls { json } } => {
            bridge::ls(&mut conn, json).await
        }
        Command::Bridge {
            command: BridgeCommand::Map { name, external, channel, allow, json },
        } => bridge::map(&mut conn, name, external, channel, allow, json).await,
        Command::Bridge { command: BridgeCommand::Unmap { name, external, json } } => {
            bridge::unmap(&mut conn, name, external, json).await
        }
        Command::Bridge { command: BridgeCommand::Status { name, json } } => {
            bridge::status(&mut conn, name, json).await
        }
        Command::Chains { json } => views::chains(&mut conn, json).await,
        Command::Logs { agent, follow, lines } => {
            views::logs(&mut conn, agent, follow, lines).await
        }
        Command::Stop { agent, json } => {
            let who = agent.clone();
            acted(control(&mut conn, ControlRequest::Stop { agent }).await?, &who, "stop", json)
        }
        Command::Start { agent, json } => {
            let who = agent.clone();
            acted(control(&mut conn, ControlRequest::Start { agent }).await?, &who, "start", json)
        }
        Command::Restart { agent, json } => {
            let who = agent.clone();
            let reply = control(&mut conn, ControlRequest::Restart { agent }).await?;
            acted(reply, &who, "restart", json)
        }
        Command::DeadLetters { limit, offset, json } => {
            views::dead_letters(&mut conn, limit, offset, json).await
        }
        Command::Journal { .. }
        | Command::Memory { .. }
        | Command::Completions { .. }
        | Command::Ui { .. }
        | Command::Man { .. }
        | Command::Init(_)
        | Command::Bridge { command: BridgeCommand::Manifest { .. } } => {
            unreachable!("handled before connecting")
        }
        Command::Approvals { all, json } => approvals::list(&mut conn, all, json).await,
        Command::Approve { id, reason, expires, as_name, json } => {
            approvals::decide(&mut conn, id, true, reason, expires, as_name, json).await
        }
        Command::Deny { id, reason, as_name, json } => {
            approvals::decide(&mut conn, id, false, reason, None, as_name, json).await
        }
        Command::Post { channel, text, as_name, json } => {
            channels::post(&mut conn, channel, text, as_name, json).await
        }
        Command::Read { channel, after, limit, follow, json } => {
            channels::read(&mut conn, channel, after, limit, follow, json).await
        }
        Command::Channels { json } => channels::list(&mut conn, json).await,
        Command::Session { command: SessionCommand::Show { agent, channel, json } } => {
            views::session(&mut conn, agent, channel, json).await
        }
        Command::Agent { command } => channels::agent(&mut conn, command).await,
        Command::Channel { command } => channels::channel(&mut conn, command).await,
        Command::Down { json } => {
            let reply = control(&mut conn, ControlRequest::Down).await?;
            let msg = match reply {
                ControlReply::Done(msg) => msg,
                _ => String::new(),
            };
            if !json && !msg.is_empty() {
                println!("{msg}");
            }
            // Wait until the supervisor has gone (its socket closes).
            while conn.reader.read_frame().await.ok().flatten().is_some() {}
            if json {
                println!("{}", json!({"stopped": true, "message": msg}));
            } else {
                println!("swarm stopped");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The person `flockctl` acts as: --as, else $USER, else operator.
/// `flockctl ui`: the URL the running supervisor wrote (its token changes with every run).
fn ui(state: &StateDir, open: bool, json: bool) -> Result<ExitCode> {
    let file = flock_supervisor::web::ui_url_file(state);
    let url = match std::fs::read_to_string(&file) {
        Ok(u) if std::os::unix::net::UnixStream::connect(state.control_socket()).is_ok() => u,
        _ => bail!(
            "no dashboard is being served for state dir {}: start the swarm with `flock-supervisor up FILE --ui 127.0.0.1:8080` (any free port; 0 picks one)",
            state.root.display()
        ),
    };
    let url = url.trim();
    if json {
        println!("{}", json!({"url": url}));
    } else {
        println!("{url}");
    }
    if open {
        let browser = std::env::var("BROWSER").unwrap_or_else(|_| "xdg-open".into());
        match std::process::Command::new(&browser).arg(url).status() {
            Ok(status) if status.success() => {}
            // xdg-open exits non-zero when it found no browser: say so, not "done".
            Ok(status) => bail!("{browser} could not open the URL ({status}); open it by hand"),
            Err(e) => bail!("cannot run {browser} to open the URL: {e}; open it by hand"),
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

/// What a stop, start or restart did: its message, or with `json` one document.
fn acted(reply: ControlReply, agent: &str, action: &str, json: bool) -> Result<ExitCode> {
    let msg = match reply {
        ControlReply::Done(msg) => msg,
        _ => String::new(),
    };
    if json {
        println!("{}", json!({"agent": agent, "action": action, "done": true, "message": msg}));
    } else if !msg.is_empty() {
        println!("{msg}");
    }
    Ok(ExitCode::SUCCESS)
}
