//! Answers `flockctl` requests. Each request runs in its own task, so a slow one (a `logs -f`,
//! a `stop` waiting for a process to exit) never holds up the router.

use std::sync::Arc;

use flock_actors::caller::Caller;
use flock_actors::messages::{ChannelsMsg, GatewayMsg};
use flock_actors::{ControlCall, RouterMsg, StoreMsg};
use flock_ipc::{
    Body, ControlReply, ControlRequest, ErrorCode, Frame, Outbox, PsRow, ROUTER, SourcedLine,
};
use ractor::ActorRef;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use crate::children::ChildMsg;
use crate::logs::LogHub;

#[derive(Clone)]
pub struct ControlCtx {
    pub children: ActorRef<ChildMsg>,
    pub router: ActorRef<RouterMsg>,
    pub store: ActorRef<StoreMsg>,
    pub channels: ActorRef<ChannelsMsg>,
    pub gateway: ActorRef<GatewayMsg>,
    pub logs: LogHub,
    pub shutdown: mpsc::UnboundedSender<crate::children::StopReason>,
    pub started: std::time::Instant,
    /// The embedded model's process, if the swarm runs one.
    pub model: Option<Arc<crate::model::ModelProcess>>,
    /// The chat bridges' processes (set once they are started).
    pub bridges: Arc<std::sync::Mutex<Vec<Arc<crate::bridges::BridgeProcess>>>>,
    /// The swarm's frame limit (an answer must fit in one frame).
    pub max_frame_bytes: u32,
    /// The swarm's other hosts, in a swarm across hosts.
    pub cluster: Option<crate::cluster::Hosts>,
    /// Where what the operator does to agents is journaled.
    pub journal: Option<Arc<flock_journal::Journal>>,
    /// This run's lease on its host, when the host may fail over (failover.rs).
    pub lease: Option<Arc<crate::failover::Lease>>,
}

impl std::fmt::Debug for ControlCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlCtx")
    }
}

pub fn handle(ctx: Arc<ControlCtx>, call: ControlCall) {
    tokio::spawn(async move {
        let ControlCall { request, frame_id, outbox, from_host } = call;
        let reply = |body: Body| Frame {
            correlation_id: Some(frame_id),
            ..Frame::new(ROUTER, flock_ipc::OPERATOR, body)
        };
        let result = run(&ctx, request, from_host.as_deref(), &outbox, &reply).await;
        let body = match result {
            Ok(r) => Body::ControlReply(r),
            Err((code, message)) => Body::Error { code, message },
        };
        let _ = outbox.send(reply(body)).await;
    });
}

/// The most dead letters one answer lists (each text is a preview, so a page fits in a frame).
const MAX_DEAD_LETTERS_PAGE: u32 = 500;

pub(crate) type CtlResult = Result<ControlReply, (ErrorCode, String)>;

fn internal(e: impl std::fmt::Display) -> (ErrorCode, String) {
    (ErrorCode::Internal, e.to_string())
}

async fn run(
    ctx: &ControlCtx,
    request: ControlRequest,
    from_host: Option<&str>,
    outbox: &Outbox,
    reply: &impl Fn(Body) -> Frame,
) -> CtlResult {
    match request {
        ControlRequest::Ps => ps(ctx).await,
        // The router answers these itself (it owns the chains).
        ControlRequest::Watch { .. } | ControlRequest::Chains | ControlRequest::Memory { .. } => {
            Err((ErrorCode::Internal, "chains and memory reads are answered by the router".into()))
        }
        ControlRequest::Logs { agent, lines, follow } => {
            let children = ractor::call!(ctx.children, ChildMsg::Ps).map_err(internal)?;
            let mut names: Vec<String> = children.into_iter().map(|c| c.name).collect();
            if ctx.model.is_some() {
                names.push(crate::model::NAME.into());
            }
            names.extend(
                ctx.bridges
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter()
                    .map(|b| crate::bridges::log_name(&b.name)),
            );
            match agent {
                Some(agent) => logs_of(ctx, &names, agent, lines, follow, outbox, reply).await,
                None => all_logs(ctx, &names, lines, follow, outbox, reply).await,
            }
        }
        ControlRequest::LogPage { agent, after, lines } => {
            let children = ractor::call!(ctx.children, ChildMsg::Ps).map_err(internal)?;
            if !children.iter().any(|c| c.name == agent) {
                return Err((ErrorCode::AgentNotFound, format!("no agent named `{agent}` here")));
            }
            let (lines, next) = ctx.logs.page(&agent, after, lines as usize);
            Ok(ControlReply::LogPage { lines, next })
        }
        ControlRequest::Stop { agent } => {
            let done = child_call(ctx, |reply| ChildMsg::Stop { name: agent.clone(), reply });
            journal_operator(ctx, "AGENT_STOP", &agent, from_host, done.await)
        }
        ControlRequest::Start { agent } => {
            let done = child_call(ctx, |reply| ChildMsg::Start { name: agent.clone(), reply });
            journal_operator(ctx, "AGENT_START", &agent, from_host, done.await)
        }
        ControlRequest::Restart { agent } => {
            let done = child_call(ctx, |reply| ChildMsg::Restart { name: agent.clone(), reply });
            journal_operator(ctx, "AGENT_RESTART", &agent, from_host, done.await)
        }
        ControlRequest::DeadLetters { offset, limit } => {
            let limit = limit.clamp(1, MAX_DEAD_LETTERS_PAGE);
            let letters =
                ractor::call!(ctx.store, |reply| StoreMsg::DeadLetters { offset, limit, reply })
                    .map_err(internal)?
                    .map_err(internal)?;
            Ok(ControlReply::DeadLetters(letters))
        }
        ControlRequest::Session { agent, channel } => {
            let max_bytes = ctx.max_frame_bytes as usize / 2;
            let children = ractor::call!(ctx.children, ChildMsg::Ps).map_err(internal)?;
            let names: Vec<String> = children.into_iter().map(|c| c.name).collect();
            let known = names.contains(&agent);
            let who = agent.clone();
            let result = flock_actors::store_actor::with_store(&ctx.store, move |s| {
                let sessions = s.sessions_of(&agent)?;
                // A decommissioned agent's sessions stay readable; a name nobody had is an error.
                if !known && sessions.is_empty() {
                    return Ok(None);
                }
                Ok(Some(match channel {
                    Some(c) => {
                        let c = c.trim_start_matches('#').to_owned();
                        let items = s.load_session(&agent, &c, usize::MAX >> 1, max_bytes)?;
                        format!("{{\"agent\":{:?},\"channel\":{:?},\"messages\":[{}]}}", agent, c, items.join(","))
                    }
                    None => {
                        let list: Vec<serde_json::Value> = sessions
                            .into_iter()
                            .map(|(c, n, closed)| serde_json::json!({"channel": c, "messages": n, "closed": closed}))
                            .collect();
                        serde_json::json!({"agent": agent, "sessions": list}).to_string()
                    }
                }))
            })
            .await
            .map_err(internal)?;
            match result {
                Some(json) => Ok(ControlReply::Json(json)),
                None => Err((
                    ErrorCode::AgentNotFound,
                    format!(
                        "no agent named `{who}` (and no saved sessions of one); agents: {}",
                        names.join(", ")
                    ),
                )),
            }
        }
        ControlRequest::Bridges => Ok(ControlReply::Json(bridges_json(ctx).await.to_string())),
        ControlRequest::Channel { tool, arguments, as_name } => {
            let name = as_name.trim();
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err((
                    ErrorCode::BadRequest,
                    format!("`{as_name}` is not a usable name for --as: one word, e.g. --as alice"),
                ));
            }
            // The leader keeps the permission records and answers a person's approvals.
            if let Some(leader) = ctx.cluster.as_ref().and_then(|h| h.leader_elsewhere())
                && flock_config::tools::owner(&tool) == Some(flock_config::Owner::Permissions)
            {
                return Err((
                    ErrorCode::BadRequest,
                    format!(
                        "the swarm's permission requests are {KEPT_BY} `{leader}` \
                         (cluster.leader): run this flockctl command there"
                    ),
                ));
            }
            if tool == "permission_list" {
                // A read: from the store directly, not through the router (the dashboard samples
                // it five times a second while a page is open).
                let args: serde_json::Value = serde_json::from_str(&arguments).unwrap_or_default();
                let Some(args) = args.as_object() else {
                    return Err((ErrorCode::BadRequest, "arguments must be a JSON object".into()));
                };
                let all = args.get("all").and_then(serde_json::Value::as_bool).unwrap_or(false);
                let rows = flock_actors::store_actor::with_store(&ctx.store, move |s| {
                    Ok(s.permissions_list(all))
                })
                .await
                .map_err(internal)?
                .map_err(|e| (e.code, e.message))?;
                return serde_json::to_string(&rows).map(ControlReply::Json).map_err(internal);
            }
            if flock_config::tools::owner(&tool) == Some(flock_config::Owner::Permissions) {
                let answer = ractor::call!(ctx.router, |reply| RouterMsg::PermissionHuman {
                    person: format!("human:{name}"),
                    tool,
                    arguments,
                    reply
                })
                .map_err(internal)?;
                return answer.map(ControlReply::Done).map_err(|e| (e.code, e.message));
            }
            // The leader holds the swarm's channels; a host keeps only its operator's DMs with
            // its own agents (read here), and creates and decommissions its own agents.
            let here = ["flock_channel_read", "flock_channel_list", "flock_discover"];
            let lifecycle = ["flock_create_agent", "flock_decommission_agent", "agents__spawn"];
            if let Some(leader) = ctx.cluster.as_ref().and_then(|h| h.leader_elsewhere())
                && !here.contains(&tool.as_str())
                && !lifecycle.contains(&tool.as_str())
            {
                return Err((
                    ErrorCode::BadRequest,
                    format!(
                        "the swarm's channels are held by host `{leader}` (cluster.leader): run \
                         this flockctl command there; this host keeps only its own DMs"
                    ),
                ));
            }
            let caller = Caller { id: format!("human:{name}"), role: None };
            let result = ractor::call!(ctx.channels, |reply| ChannelsMsg::Human {
                caller,
                name: tool,
                arguments,
                reply
            })
            .map_err(internal)?;
            result.map(ControlReply::Json)
        }
        ControlRequest::Down => {
            let _ =
                ctx.shutdown.send(crate::children::StopReason::Requested("flockctl down".into()));
            Ok(ControlReply::Done("stopping every agent, then the supervisor".into()))
        }
    }
}

/// The words of the refusal a host that is not its swarm's leader gives a permission call (the
/// dashboard's sampler shows no approvals there instead).
pub const KEPT_BY: &str = "kept by host";

/// `flockctl logs AGENT [-f]`.
async fn logs_of(
    ctx: &ControlCtx,
    names: &[String],
    agent: String,
    lines: u32,
    follow: bool,
    outbox: &Outbox,
    reply: &impl Fn(Body) -> Frame,
) -> CtlResult {
    if !names.contains(&agent) {
        return Err((
            ErrorCode::AgentNotFound,
            format!("no agent named `{agent}`; agents: {}", names.join(", ")),
        ));
    }
    let (tail, mut live) = ctx.logs.tail(&agent, lines as usize);
    if !follow {
        return Ok(ControlReply::LogLines(tail));
    }
    outbox.send(reply(Body::ControlReply(ControlReply::LogLines(tail)))).await.map_err(internal)?;
    // Stream until the client goes away (its outbox closes).
    loop {
        let lines = match live.recv().await {
            Ok(line) => vec![line],
            Err(RecvError::Lagged(n)) => vec![format!("… {n} lines skipped (client too slow) …")],
            Err(RecvError::Closed) => return Ok(ControlReply::Done(String::new())),
        };
        if outbox.send(reply(Body::ControlReply(ControlReply::LogLines(lines)))).await.is_err() {
            return Ok(ControlReply::Done(String::new()));
        }
    }
}

/// `flockctl logs [-f]` without an agent: every log (agents, the model, the bridges) on one
/// stream, each line with the name of its log.
async fn all_logs(
    ctx: &ControlCtx,
    names: &[String],
    lines: u32,
    follow: bool,
    outbox: &Outbox,
    reply: &impl Fn(Body) -> Frame,
) -> CtlResult {
    let sourced = |lines: Vec<crate::logs::Sourced>| {
        let lines = lines
            .into_iter()
            .map(|(source, line)| SourcedLine { source: source.to_string(), line })
            .collect();
        ControlReply::SourcedLogLines(lines)
    };
    let (tail, mut live) = ctx.logs.tail_all(names, lines as usize);
    if !follow {
        return Ok(sourced(tail));
    }
    outbox.send(reply(Body::ControlReply(sourced(tail)))).await.map_err(internal)?;
    loop {
        let line = match live.recv().await {
            Ok(line) => line,
            Err(RecvError::Lagged(n)) => {
                ("".into(), format!("… {n} lines skipped (client too slow) …"))
            }
            Err(RecvError::Closed) => return Ok(ControlReply::Done(String::new())),
        };
        if outbox.send(reply(Body::ControlReply(sourced(vec![line])))).await.is_err() {
            return Ok(ControlReply::Done(String::new()));
        }
    }
}

/// Journals what the operator did to an agent (`flockctl stop|start|restart`, the dashboard's
/// buttons) and how it went, as `human:operator` (with `from_host` when it was another host's
/// `flockctl`); hands `result` back.
fn journal_operator(
    ctx: &ControlCtx,
    kind: &str,
    agent: &str,
    from_host: Option<&str>,
    result: CtlResult,
) -> CtlResult {
    if let Some(journal) = ctx.journal.clone() {
        let (status, message) = match &result {
            Ok(ControlReply::Done(m)) => (flock_journal::Status::Success, m.clone()),
            Ok(_) => (flock_journal::Status::Success, format!("{agent}: done")),
            Err((code, m)) => (flock_journal::Status::Failed, format!("{code}: {m}")),
        };
        let mut event = flock_journal::JournalEvent::new("human:operator", kind, status, message)
            .param("agent", agent);
        if let Some(host) = from_host {
            event = event.param("from_host", host);
        }
        tokio::task::spawn_blocking(move || {
            if let Err(e) = journal.append(&event) {
                tracing::error!(error = %e, "flock: journal append failed");
            }
        });
    }
    result
}

async fn child_call(
    ctx: &ControlCtx,
    msg: impl FnOnce(ractor::RpcReplyPort<Result<String, String>>) -> ChildMsg,
) -> CtlResult {
    let (tx, rx) = ractor::concurrency::oneshot();
    ctx.children.cast(msg(tx.into())).map_err(internal)?;
    match rx.await {
        Ok(Ok(done)) => Ok(ControlReply::Done(done)),
        Ok(Err(e)) if e.starts_with("no agent named") => Err((ErrorCode::AgentNotFound, e)),
        Ok(Err(e)) => Err((ErrorCode::TargetUnavailable, e)),
        Err(_) => Err(internal("the child supervisor stopped")),
    }
}

/// The rows of `flockctl ps` (also read by the dashboard's metrics): this host's, and in a swarm
/// across hosts every other host's as it last wrote them.
pub(crate) async fn ps(ctx: &ControlCtx) -> CtlResult {
    let rows = local_rows(ctx).await?;
    let Some(hosts) = &ctx.cluster else { return Ok(ControlReply::Ps(rows)) };
    let remote = hosts.remote_agents();
    let waiting =
        flock_actors::store_actor::with_store(&ctx.store, move |s| s.pending_counts(&remote))
            .await
            .unwrap_or_default();
    let mut rows = hosts.rows(rows, &waiting).await;
    // A run whose lease lapsed says so on its own row (failover.rs).
    if let Some(lease) = &ctx.lease
        && !*lease.held().borrow()
        && let Some(me) = rows.first_mut()
    {
        me.state = "fenced".into();
        me.last_exit = Some(format!(
            "could not renew its lease for {} s: its agents are stopped until it can",
            crate::failover::FENCE_AFTER.as_secs()
        ));
    }
    Ok(ControlReply::Ps(rows))
}

/// Writes this host's rows for the other hosts every [`crate::cluster::HEARTBEAT`], as long as the
/// process runs (a failed write is retried at the next beat; the others see this host as lost
/// after [`crate::cluster::LOST_AFTER`]).
pub fn heartbeat(ctx: Arc<ControlCtx>) {
    let Some(hosts) = ctx.cluster.clone() else { return };
    tokio::spawn(learn_created(ctx.clone(), hosts.clone()));
    tokio::spawn(async move {
        let mut beat = tokio::time::interval(crate::cluster::HEARTBEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            beat.tick().await;
            let Ok(rows) = local_rows(&ctx).await else { return };
            let created = created_here(&ctx).await;
            let issued = std::time::Instant::now();
            match hosts.publish(&rows, created).await {
                Ok(()) => {
                    failing = false;
                    if let Some(lease) = &ctx.lease {
                        lease.renewed(issued, &ctx.children);
                    }
                }
                Err(e) if crate::cluster::fenced(&e) => {
                    tracing::error!("flock cluster: {e}");
                    if ctx.lease.is_some() {
                        hand_over(&ctx, &hosts).await;
                    }
                    let _ =
                        ctx.shutdown.send(crate::children::StopReason::Escalated(e.to_string()));
                    return;
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "flock cluster: cannot write this host's status; the other hosts will see it as lost until it can");
                }
                Err(_) => {}
            }
        }
    });
}

/// The agents created at run time on this host (`flock_create_agent`) and not decommissioned:
/// the other hosts route to them once they read this host's status.
async fn created_here(ctx: &ControlCtx) -> Vec<flock_config::AgentSpec> {
    flock_actors::store_actor::with_store(&ctx.store, |s| s.created_agent_specs())
        .await
        .map(|(specs, _)| specs)
        .unwrap_or_default()
}

/// How often a host reads the other hosts' statuses for the agents created at run time there.
const LEARN_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Tells the router which agents each other host created at run time, whenever that changes
/// (read from their statuses every [`LEARN_EVERY`]).
async fn learn_created(ctx: Arc<ControlCtx>, hosts: crate::cluster::Hosts) {
    let mut last: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut tick = tokio::time::interval(LEARN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for host in hosts.others() {
            let Some(agents) = hosts.created_on(&host).await else { continue };
            let names: Vec<String> = agents.iter().map(|a| a.key()).collect();
            if last.get(&host) == Some(&names) {
                continue;
            }
            if ctx.router.cast(RouterMsg::CreatedElsewhere { host: host.clone(), agents }).is_err()
            {
                return;
            }
            last.insert(host, names);
        }
    }
}

/// A run taken over by a standby hands what its store holds undelivered to it (and to the
/// other hosts) before it stops: nothing accepted is lost (failover.rs).
async fn hand_over(ctx: &ControlCtx, hosts: &crate::cluster::Hosts) {
    let _ = ctx.children.cast(ChildMsg::Fence(true));
    let pending = flock_actors::store_actor::with_store(&ctx.store, |s| s.pending()).await;
    let pending = match pending {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "flock cluster: cannot read the mailbox to hand it over; start `up` from this state dir again to hand it over");
            return;
        }
    };
    let (sent, failed) = hosts.hand_over(&pending).await;
    let n = sent.len();
    let marked =
        flock_actors::store_actor::with_store(&ctx.store, move |s| s.mark_forwarded(&sent));
    if let Err(e) = marked.await {
        tracing::error!(error = %e, "flock cluster: cannot mark the handed-over messages (the ids keep them once)");
    }
    match failed {
        None => tracing::warn!(
            "flock cluster: handed {n} undelivered message(s) over to the run that holds this host now"
        ),
        Some(e) => tracing::error!(
            "flock cluster: handed {n} of {} undelivered message(s) over; the rest could not be \
             ({e}): start `up` from this state dir again to hand them over",
            pending.len()
        ),
    }
}

/// This host's rows of `flockctl ps`.
async fn local_rows(ctx: &ControlCtx) -> Result<Vec<PsRow>, (ErrorCode, String)> {
    let children = ractor::call!(ctx.children, ChildMsg::Ps).map_err(internal)?;
    let (routes, counters) = ractor::call!(ctx.router, RouterMsg::Snapshot).map_err(internal)?;
    let me = std::process::id();
    let uptime = ctx.started.elapsed().as_secs();
    let mut rows = vec![PsRow {
        name: "supervisor".into(),
        kind: "supervisor".into(),
        role: "supervisor".into(),
        pid: Some(me),
        state: "running".into(),
        uptime_secs: uptime,
        rss_bytes: crate::spawn::rss_bytes(me),
        ..Default::default()
    }];
    for (name, actor) in [
        ("router", ctx.router.get_cell()),
        ("store", ctx.store.get_cell()),
        ("channels", ctx.channels.get_cell()),
        ("llm-gateway", ctx.gateway.get_cell()),
        ("children", ctx.children.get_cell()),
    ] {
        rows.push(PsRow {
            name: name.into(),
            kind: "actor".into(),
            role: "actor".into(),
            pid: Some(me),
            state: format!("{:?}", actor.get_status()).to_lowercase(),
            uptime_secs: uptime,
            ..Default::default()
        });
    }
    // Chains of turns (one per outside input) with their budgets: `flockctl chains` for detail.
    rows.push(PsRow {
        name: "chains".into(),
        kind: "chains".into(),
        role: "router".into(),
        state: format!(
            "{} in flight, {} stopped by budget",
            counters.chains_live, counters.chains_stopped
        ),
        uptime_secs: uptime,
        mailbox_depth: counters.chains_live,
        ..Default::default()
    });
    if let Some(model) = &ctx.model {
        let m = model.status();
        rows.push(PsRow {
            name: crate::model::NAME.into(),
            kind: "process".into(),
            role: "model".into(),
            pid: m.pid,
            state: m.state,
            uptime_secs: m.started.filter(|_| m.pid.is_some()).map_or(0, |t| t.elapsed().as_secs()),
            restarts: m.restarts,
            last_exit: m.last_exit,
            rss_bytes: m.pid.and_then(crate::spawn::rss_bytes),
            ..Default::default()
        });
    }
    rows.extend(bridge_rows(ctx).await);
    let usage = ractor::call!(ctx.gateway, GatewayMsg::Usage).unwrap_or_default();
    for c in children {
        let route = routes.iter().find(|r| r.name == c.name);
        let (tokens_in, tokens_out) = usage.get(&c.name).copied().unwrap_or((0, 0));
        let busy = route.is_some_and(|r| r.busy) && c.state == "ready";
        rows.push(PsRow {
            name: c.name,
            kind: "agent".into(),
            role: c.role,
            pid: c.pid,
            state: if busy { "busy".into() } else { c.state },
            uptime_secs: c.uptime_secs,
            restarts: c.restarts,
            last_exit: c.last_exit,
            mailbox_depth: route.map_or(0, |r| r.mailbox_depth),
            turns_total: route.map_or(0, |r| r.turns_total),
            rss_bytes: c.rss_bytes,
            tokens_in,
            tokens_out,
            sandbox: c.sandbox,
            confined: Some(c.confined),
            host: None,
        });
    }
    Ok(rows)
}

/// A row per chat bridge: its process (pid, uptime, restarts, exit) and what it reports through
/// the router (connection state, posts waiting to go out as its mailbox, last error).
async fn bridge_rows(ctx: &ControlCtx) -> Vec<PsRow> {
    let procs: Vec<_> = ctx.bridges.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if procs.is_empty() {
        return Vec::new();
    }
    let infos = ractor::call!(ctx.router, RouterMsg::Bridges).unwrap_or_default();
    procs
        .iter()
        .map(|p| {
            let s = p.status();
            let info = infos.iter().find(|i| i.name == p.name);
            let connected = info.is_some_and(|i| i.connected) && s.pid.is_some();
            let state = match info {
                Some(i) if connected => i.state.clone(),
                _ => s.state.clone(),
            };
            let error = info.and_then(|i| i.last_error.clone());
            PsRow {
                name: crate::bridges::log_name(&p.name),
                kind: "bridge".into(),
                role: p.platform.into(),
                pid: s.pid,
                state,
                uptime_secs: s
                    .started
                    .filter(|_| s.pid.is_some())
                    .map_or(0, |t| t.elapsed().as_secs()),
                restarts: s.restarts,
                last_exit: error.or(s.last_exit),
                mailbox_depth: info.map_or(0, |i| i.outbox),
                turns_total: info.map_or(0, |i| i.inbound + i.outbound),
                rss_bytes: s.pid.and_then(crate::spawn::rss_bytes),
                ..Default::default()
            }
        })
        .collect()
}

/// `flockctl bridge ls` and `bridge status`: each bridge's process, its own report and its
/// mappings — each with its durable cursor and the posts waiting (from the store, so they show
/// while the bridge is down too) and whether the chat refuses posts (as the bridge reports it) —
/// never its token: only the name of the variable that holds it.
async fn bridges_json(ctx: &ControlCtx) -> serde_json::Value {
    let procs: Vec<_> = ctx.bridges.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let infos = ractor::call!(ctx.router, RouterMsg::Bridges).unwrap_or_default();
    let rows = bridge_rows(ctx).await;
    // The mappings as they are now: the swarm file's with `bridge map|unmap`'s changes.
    let changes = flock_actors::store_actor::with_store(&ctx.store, |s| s.bridge_mapping_changes())
        .await
        .unwrap_or_else(|e| {
            tracing::warn!("bridge status: cannot read the run-time mapping changes: {e:?}");
            Vec::new()
        });
    let mut specs: Vec<flock_config::BridgeSpec> = procs.iter().map(|p| p.spec.clone()).collect();
    flock_actors::channels::bridge::apply_mapping_changes(&mut specs, &changes);
    let wanted: Vec<(String, String, String)> = specs
        .iter()
        .flat_map(|b| {
            b.channels.iter().map(|m| (b.name.clone(), m.external.clone(), m.flock.clone()))
        })
        .collect();
    let outboxes = flock_actors::store_actor::with_store(&ctx.store, move |s| {
        wanted
            .into_iter()
            .map(|(b, e, c)| Ok(((b.clone(), e.clone()), s.bridge_outbox(&b, &e, &c)?)))
            .collect::<Result<std::collections::HashMap<_, _>, _>>()
    })
    .await
    .unwrap_or_else(|e| {
        // Shown as "nothing pulled yet"; the reason goes to the supervisor's log.
        tracing::warn!("bridge status: cannot read the mappings' cursors: {e:?}");
        std::collections::HashMap::new()
    });
    let list: Vec<serde_json::Value> = procs
        .iter()
        .zip(&specs)
        .map(|(p, spec)| {
            let info = infos.iter().find(|i| i.name == p.name);
            let row = rows.iter().find(|r| r.name == crate::bridges::log_name(&p.name));
            let mapping = |m: &flock_config::BridgeMapping| {
                let out = outboxes.get(&(p.name.clone(), m.external.clone()));
                let report = info.and_then(|i| i.mappings.get(&m.external));
                serde_json::json!({
                    "flock": m.flock,
                    "external": m.external,
                    "allow": m.allow,
                    "cursor": out.and_then(|o| o.cursor),
                    "newest": out.map(|o| o.newest),
                    "waiting": out.map_or(0, |o| o.waiting),
                    "broken": report.and_then(|r| r.broken.clone()),
                    "archived": out.is_some_and(|o| o.archived),
                })
            };
            serde_json::json!({
                "name": p.name,
                "platform": p.platform,
                "state": row.map(|r| r.state.clone()),
                "pid": row.and_then(|r| r.pid),
                "uptime_secs": row.map_or(0, |r| r.uptime_secs),
                "restarts": row.map_or(0, |r| r.restarts),
                "outbox": info.map_or(0, |i| i.outbox),
                "inbound": info.map_or(0, |i| i.inbound),
                "outbound": info.map_or(0, |i| i.outbound),
                "last_error": row.and_then(|r| r.last_exit.clone()),
                "token_env": p.spec.token_env,
                "api_url": p.spec.api_url.clone().unwrap_or_else(|| p.spec.platform.default_api_url().to_owned()),
                "channels": spec.channels.iter().map(mapping).collect::<Vec<_>>(),
            })
        })
        .collect();
    serde_json::Value::Array(list)
}

/// Chains as JSON (`flockctl chains --json` and the dashboard).
pub fn chain_rows_json(rows: &[flock_ipc::ChainRow]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({"chain": flock_ipc::id::fmt_id(r.id), "origin": r.origin,
                   "entry": r.entry, "text": r.text, "state": r.state, "hops": r.hops,
                   "max_hops": r.max_hops, "tokens": r.tokens, "max_tokens": r.max_tokens,
                   "age_ms": r.age_ms, "max_wall_ms": r.max_wall_ms, "live": r.live})
        })
        .collect()
}
