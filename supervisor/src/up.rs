//! `flock-supervisor up`: open the store, start the actors and the two sockets, spawn every agent
//! in order, then wait for Ctrl-C, SIGTERM or `flockctl down` and stop everything in reverse.
//! Restarting after a crash (even `kill -9` of this process) takes the same path: all state that
//! matters is in SQLite.

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use flock_actors::channels::ChannelsArgs;
use flock_actors::gateway::GatewayArgs;
use flock_actors::messages::{AgentOp, AgentOps, ChannelsMsg};
use flock_actors::router::Clock;
use flock_actors::{ConnKind, ConnLimits, ControlSink, Durability, EventSink, RouterArgs, Store};
use flock_config::{ModelSpec, SwarmSpec};
use flock_ipc::{Transport, UnixTransport};
use flock_journal::Journal;
use flock_llm::Secret;
use ractor::{Actor, ActorRef};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::children::{ChildArgs, ChildMsg, ChildSupervisor, StopReason};
use crate::control::{self, ControlCtx};
use crate::logs::LogHub;
use crate::model::ModelProcess;
use crate::paths::StateDir;
use crate::spawn::Spawner;

/// Finds the `flock-agent` binary: `$FLOCK_AGENT_BIN`, else next to this executable.
pub fn agent_binary() -> Result<PathBuf> {
    crate::spawn::sibling_binary("flock-agent", "FLOCK_AGENT_BIN", crate::spawn::BUILD_HINT)
}

/// Holds the state dir's lock for the life of the supervisor: one supervisor per state dir.
pub struct StateLock {
    _file: nix::fcntl::Flock<std::fs::File>,
}

pub fn lock_state_dir(state: &StateDir) -> Result<StateLock> {
    let path = state.lock_file();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let mut file = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
    {
        Ok(f) => f,
        Err((file, _)) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            let _ = file.as_raw_fd();
            bail!(
                "another flock-supervisor (pid {}) is running with state dir {}; stop it with `flockctl --state-dir {} down`, or choose another --state-dir",
                pid.trim(),
                state.root.display(),
                state.root.display()
            );
        }
    };
    use std::io::{Seek, Write};
    file.set_len(0)?;
    file.seek(std::io::SeekFrom::Start(0))?;
    write!(file, "{}", std::process::id())?;
    Ok(StateLock { _file: file })
}

/// The swarm file's agents, less the decommissioned ones, plus those created at run time
/// (`flock_create_agent`): a restarted supervisor brings back the swarm as it was.
fn with_registry(mut spec: SwarmSpec, store: &Store) -> Result<SwarmSpec> {
    let gone = store.decommissioned_agents().context("read decommissioned agents")?;
    spec.agents.retain(|a| !gone.contains(&a.key()));
    let (created, unreadable) = store.created_agent_specs().context("read created agents")?;
    if unreadable > 0 {
        tracing::warn!(
            "flock: skipping {unreadable} created agent(s) whose spec this build cannot read"
        );
    }
    for a in created {
        if spec.agent(&a.key()).is_none() {
            spec.agents.push(a);
        }
    }
    Ok(spec)
}

/// Descriptors the supervisor holds per agent: its connection, its stdout and stderr pipes, the
/// pidfd its exit is awaited on, and one spare (a restart overlaps the old connection's close).
const FDS_PER_AGENT: u64 = 5;

/// Raises the soft limit on open files to the hard limit (at most 65 536): each agent holds a
/// socket, two pipes and a pidfd here, and each `flockctl` a socket; a default soft limit of
/// 1 024 runs out at ~200 agents. Says so when even the hard limit is too low for `agents`.
/// Returns the soft limit now in force.
fn raise_fd_limit(agents: usize) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((mut soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return 1024 };
    let want = hard.min(65_536);
    if soft < want && setrlimit(Resource::RLIMIT_NOFILE, want, hard).is_ok() {
        soft = want;
    }
    let needed = agents as u64 * FDS_PER_AGENT + 256;
    if soft < needed {
        tracing::warn!(
            soft,
            hard,
            needed,
            "flock: the open-files limit ({soft}, hard limit {hard}) is too low for {agents} agents \
             (~{FDS_PER_AGENT} each, {needed} in all): agents beyond it will fail to start; raise \
             the hard limit (`ulimit -Hn`, or LimitNOFILE= in a systemd unit) before `up`"
        );
    }
    soft
}

/// Connections the agents' socket serves at once: every agent holds one, a restart briefly
/// two, and agents created at run time need theirs; bounded by the descriptors there are.
fn agent_connections(fd_limit: u64) -> usize {
    let by_fds = (fd_limit / FDS_PER_AGENT) as usize * 2;
    by_fds.clamp(flock_actors::server::MAX_CONNECTIONS, 65_536)
}

/// Checks that every model an agent uses has its API key (read from the variable its
/// `api_key_env` names by [`crate::secrets::take_api_keys`]). The keys stay in this process (the
/// gateway); agents are spawned with a cleared environment.
fn check_api_keys(spec: &SwarmSpec, keys: &HashMap<String, Secret>) -> Result<()> {
    let mut missing = Vec::new();
    for agent in &spec.agents {
        let (ModelSpec::OpenAi(m) | ModelSpec::Anthropic(m)) = &agent.model else { continue };
        // Only models an agent uses must have their key now (`flock_create_agent` may pick
        // another model later; its calls then fail with the variable's name).
        if let Some(var) = &m.api_key_env
            && !keys.contains_key(var)
            && !missing.contains(var)
        {
            missing.push(var.clone());
        }
    }
    for bridge in &spec.bridges {
        for var in std::iter::once(&bridge.token_env).chain(&bridge.app_token_env) {
            if !keys.contains_key(var) {
                bail!(
                    "set {var} in the environment of flock-supervisor: bridge `{}` ({}) needs its token there (only the bridge's own process is given it)",
                    bridge.name,
                    bridge.platform.as_str()
                );
            }
        }
    }
    if !missing.is_empty() {
        bail!(
            "set {} in the environment of flock-supervisor: the swarm's models need {} (agents never see the keys)",
            missing.join(", "),
            if missing.len() == 1 { "it" } else { "them" }
        );
    }
    Ok(())
}

/// How the channels actor creates and decommissions agents: through the router (routing) and the
/// child supervisor (processes).
fn agent_ops(
    children: Arc<OnceLock<ractor::ActorRef<ChildMsg>>>,
    router: Arc<OnceLock<ractor::ActorRef<flock_actors::RouterMsg>>>,
) -> AgentOps {
    Arc::new(move |op| match op {
        AgentOp::Create { spec, reply } => {
            let (Some(children), Some(router)) = (children.get(), router.get()) else {
                let _ = reply.send(Err("the supervisor is still starting".into()));
                return;
            };
            let liveness: Arc<AtomicU64> = Arc::default();
            let _ = router.cast(flock_actors::RouterMsg::AddAgent {
                spec: (*spec).clone(),
                liveness: liveness.clone(),
            });
            let _ = children.cast(ChildMsg::Add { spec, liveness, reply: reply.into() });
        }
        AgentOp::Decommission { name } => {
            if let Some(children) = children.get() {
                let _ = children.cast(ChildMsg::Remove { name });
            }
        }
    })
}

/// Everything the supervisor and its agents create is theirs alone: the database and its WAL,
/// logs, the journal, memory files and workspaces hold every message and every secret an agent
/// saw (0600 files, 0700 folders).
fn private_files() {
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
}

/// Runs a swarm until it is told to stop. Returns once every agent has stopped.
/// An absolute workspace may not be the state dir, lie inside it, or contain it: the agent
/// would reach the database, the logs, the sockets and every other agent's workspace.
fn check_workspaces(spec: &SwarmSpec, state: &StateDir) -> Result<()> {
    let root = std::fs::canonicalize(&state.root).unwrap_or_else(|_| state.root.clone());
    for a in &spec.agents {
        let Some(ws) = a.workspace.as_ref().filter(|w| w.is_absolute()) else { continue };
        // Resolved as far as it exists (a symlink to the state dir is the state dir).
        let real = std::fs::canonicalize(ws).unwrap_or_else(|_| ws.clone());
        if real.starts_with(&root) || root.starts_with(&real) {
            bail!(
                "agent `{}`'s workspace {} is {} the state dir {}: the agent would reach the \
                 database, the logs and every other agent's workspace; give it a folder outside \
                 the state dir, or a relative name (a folder under {}/workspaces/)",
                a.key(),
                ws.display(),
                if real.starts_with(&root) { "inside" } else { "around" },
                root.display(),
                root.display()
            );
        }
    }
    Ok(())
}

pub async fn up(
    spec: SwarmSpec,
    host: &str,
    standby: bool,
    state: StateDir,
    keys: HashMap<String, Secret>,
    web: crate::web::WebOptions,
) -> Result<()> {
    let started = Instant::now();
    private_files();
    state.create()?;
    let _lock = lock_state_dir(&state)?;
    let agent_bin = agent_binary()?;
    // A swarm across hosts: this host runs its own agents and reaches the others through the
    // broker, which must answer before anything starts.
    let whole = spec;
    let spec = whole.for_host(host).map_err(|e| anyhow!(e))?;
    // Every agent of this host in its cage, where the kernel allows it (cage.rs).
    let cage = {
        let probed = crate::cage::helper()
            .map_err(|e| format!("{e:#}"))
            .and_then(|h| crate::cage::probe(&h, &state).map(|()| h));
        crate::cage::decide(&spec, probed)?
    };
    let mut keys = keys;
    let cluster_secret = match &whole.cluster {
        Some(c) => match keys.remove(&c.secret_env) {
            Some(s) => Some(s),
            None => bail!(
                "set {} in the environment of flock-supervisor: the hosts of a swarm prove their \
                 messages to each other with it (the same value on every host, e.g. from \
                 `openssl rand -hex 32`); agents never see it",
                c.secret_env
            ),
        },
        None => None,
    };
    let link = crate::cluster::connect(&whole, host, cluster_secret, &state, standby).await?;
    // A host that may fail over holds a lease: its agents stop once it cannot renew it.
    let lease =
        whole.failover_after(host).and(link.as_ref()).map(|_| crate::failover::Lease::new());
    // Agents created at run time on other hosts: the router learns them, the link reads them.
    let created_elsewhere = flock_actors::router::CreatedElsewhere::default();
    let cluster_view = link
        .as_ref()
        .map(|l| crate::cluster::Hosts::new(l.clone(), &whole, created_elsewhere.clone()));
    let holding = link.as_ref().map(|l| crate::cluster::hold(l, lease.clone()));
    let store = Store::open(&state.db(), Durability::Normal)
        .with_context(|| format!("open the store {}", state.db().display()))?;
    let spec = Arc::new(with_registry(spec, &store)?);
    check_api_keys(&spec, &keys)?;
    check_workspaces(&spec, &state)?;
    // Bridge tokens go to their bridges only, never to the gateway.
    let bridge_tokens: HashMap<String, Secret> = spec
        .bridges
        .iter()
        .flat_map(|b| std::iter::once(&b.token_env).chain(&b.app_token_env))
        .filter_map(|var| keys.remove(var).map(|t| (var.clone(), t)))
        .collect();
    let bridge_bin =
        if spec.bridges.is_empty() { None } else { Some(crate::bridges::bridge_binary()?) };
    // The swarm's own masking rules, for the gateway's model requests (agents get them at spawn).
    let rules: Vec<(String, String)> =
        spec.mask.iter().map(|r| (r.name.clone(), r.pattern.clone())).collect();
    flock_memory::mask::set_extra_rules(&rules).map_err(|e| anyhow!(e))?;
    let fd_limit = raise_fd_limit(spec.agents.len());
    // Whatever an agent starts stays in our process tree, to be stopped with it (spawn.rs).
    crate::spawn::become_subreaper()?;
    let usage = store.token_totals().context("read token totals")?;
    let store_ref = flock_actors::start::store("store", store)
        .await
        .map_err(|e| anyhow!("start the store actor: {e}"))?;

    // The actors refer to each other; the late-bound ones are reached through these cells.
    let children_cell: Arc<OnceLock<ractor::ActorRef<ChildMsg>>> = Arc::default();
    let router_cell: Arc<OnceLock<ractor::ActorRef<flock_actors::RouterMsg>>> = Arc::default();
    let journal = Arc::new(
        Journal::open(state.journal_dir(), flock_journal::DEFAULT_MAX_BYTES)
            .with_context(|| format!("open the journal in {}", state.journal_dir().display()))?,
    );
    let channels = flock_actors::start::channels(
        "channels",
        ChannelsArgs {
            spec: spec.clone(),
            store: store_ref.clone(),
            journal: Some(journal.clone()),
            agent_ops: Some(agent_ops(children_cell.clone(), router_cell.clone())),
            // The leader holds every host's channels, so it knows every host's agents.
            elsewhere: if host == whole.leader() {
                whole.agents_elsewhere(host)
            } else {
                Vec::new()
            },
            taken: whole.agents_elsewhere(host).iter().map(|a| a.key()).collect(),
        },
    )
    .await
    .map_err(|e| anyhow!("start the channels actor: {e}"))?;

    // The memory thread: the one writer of the memory files, and their index (which it opens
    // itself: an index that will not open costs the searches, not the writes). Only a thread
    // that cannot start costs the memory tools — never the swarm.
    let memory_service = match flock_actors::memory::MemoryService::start(
        state.memory_dir(),
        flock_memory::tiers::Ages {
            warm_after_days: spec.tiers.warm_after_days,
            cold_after_days: spec.tiers.cold_after_days,
        },
    ) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "flock: memory is off (no writes, no search)");
            None
        }
    };

    // The embedded model first: agents' first turns need it.
    let logs = LogHub::new(state.logs_dir());
    // Children start through flock-sandbox (posix_spawn, no copy of this process's memory),
    // which is there wherever the cage is; without it, by fork.
    let launch = match crate::cage::helper() {
        Ok(launcher) if launcher.is_file() => crate::spawn::Launch::Through(launcher),
        found => {
            let why = match found {
                Ok(p) => format!("{} is not there", p.display()),
                Err(e) => format!("{e:#}"),
            };
            tracing::warn!(
                "flock: {why}: children start by fork, which slows down as the swarm grows"
            );
            crate::spawn::Launch::Fork
        }
    };
    let spawner = Spawner::start(tokio::runtime::Handle::current(), launch)?;
    let local = spec.local_model().map_err(|e| anyhow!(e))?;
    let model = match local {
        Some(settings) => {
            let t0 = Instant::now();
            let m = ModelProcess::start(
                settings,
                spec.supervision.clone(),
                spawner.clone(),
                logs.clone(),
                state.workspaces().join(crate::model::NAME),
                state.run_dir().join("model.sock"),
            )
            .await?;
            let ms = t0.elapsed().as_millis() as u64;
            tracing::info!(ms, "flock: embedded model ready in {ms} ms");
            Some(Arc::new(m))
        }
        None => None,
    };
    let gateway = flock_actors::start::gateway(
        "llm-gateway",
        GatewayArgs {
            keys,
            usage,
            store: store_ref.clone(),
            local: model.as_ref().map(|m| m.link()),
        },
    )
    .await
    .map_err(|e| anyhow!("start the LLM gateway: {e}"))?;

    let liveness: HashMap<String, Arc<AtomicU64>> =
        spec.agents.iter().map(|a| (a.key(), Arc::default())).collect();
    let (shutdown_tx, mut shutdown_rx) = mpsc::unbounded_channel::<StopReason>();

    let control_cell: Arc<OnceLock<Arc<ControlCtx>>> = Arc::default();
    let events: EventSink = {
        let cell = children_cell.clone();
        Arc::new(move |ev| {
            if let Some(c) = cell.get() {
                let _ = c.cast(ChildMsg::Router(ev));
            }
        })
    };
    let control_sink: ControlSink = {
        let cell = control_cell.clone();
        Arc::new(move |call| {
            if let Some(ctx) = cell.get() {
                control::handle(ctx.clone(), call);
            }
        })
    };
    // This run's operator key: control clients (flockctl, the dashboard) present it; agents
    // cannot read it (their cage does not show run/).
    let operator_key = crate::spawn::new_token();
    flock_ipc::operator::write_key(&state.control_socket(), &operator_key).with_context(|| {
        format!(
            "write the operator key {}",
            flock_ipc::operator::key_path(&state.control_socket()).display()
        )
    })?;
    let hosts = link.as_ref().map(|_| {
        let mut h = flock_actors::router::HostLink::new(&whole, host);
        h.created = created_elsewhere.clone();
        // The leader decides this host's agents' permission requests: it never grants this
        // host's state dir.
        h.protect = vec![state.root.clone()];
        h
    });
    let router = flock_actors::start::router(
        "router",
        RouterArgs {
            spec: spec.clone(),
            store: store_ref.clone(),
            events,
            control: control_sink,
            liveness: liveness.clone(),
            channels: Some(channels.clone()),
            gateway: Some(gateway.clone()),
            journal: Some(flock_journal::JournalWriter::spawn(journal.clone())),
            memory: memory_service,
            operator_key: Some(operator_key.clone()),
            hosts: hosts.clone(),
            clock: Clock::Wall,
        },
    )
    .await
    .map_err(|e| anyhow!("start the router: {e}"))?;
    // The leader's journal holds every host's events: this host's are copied there.
    if let Some(link) = &link
        && host != whole.leader()
    {
        let (tx, rx) = mpsc::unbounded_channel::<Vec<String>>();
        journal.copy_to(Box::new(move |lines| {
            let _ = tx.send(lines.to_vec());
        }));
        crate::cluster::copy_journal(link.clone(), whole.leader().to_owned(), rx);
    }
    if let (Some(link), Some(h)) = (link, hosts) {
        let held = lease.as_ref().map(|l| l.held());
        crate::cluster::spawn(link, store_ref.clone(), router.clone(), &h, held);
    }
    let _ = router_cell.set(router.clone());
    // The memory's TTL job (docs/swarm-file.md, `memory.tiers`): now, then once a day.
    let daily = router.clone();
    tokio::spawn(async move {
        let mut day = tokio::time::interval(std::time::Duration::from_secs(86_400));
        loop {
            day.tick().await;
            if daily.cast(flock_actors::RouterMsg::MemoryTick).is_err() {
                break;
            }
        }
    });
    channels
        .cast(ChannelsMsg::SetRouter(router.clone()))
        .map_err(|e| anyhow!("wire the channels actor: {e}"))?;

    let bridge_env = bridge_bin.map(|program| {
        Arc::new(crate::bridges::BridgeEnv {
            program,
            socket: state.router_socket(),
            cwd: state.run_dir(),
            supervision: spec.supervision.clone(),
            spawner: spawner.clone(),
            logs: logs.clone(),
            router: router.clone(),
        })
    });
    let (children, _) = Actor::spawn(
        Some("children".into()),
        ChildSupervisor,
        ChildArgs {
            spec: spec.clone(),
            state_dir: state.clone(),
            router: router.clone(),
            processes: Arc::new(spawner),
            logs: logs.clone(),
            liveness,
            agent_bin,
            shutdown: shutdown_tx.clone(),
            journal: Some(journal.clone()),
            cage,
        },
    )
    .await
    .map_err(|e| anyhow!("start the child supervisor: {e}"))?;
    let _ = children_cell.set(children.clone());
    let bridges: Arc<std::sync::Mutex<Vec<Arc<crate::bridges::BridgeProcess>>>> = Arc::default();
    let ctx = Arc::new(ControlCtx {
        bridges: bridges.clone(),
        children: children.clone(),
        router: router.clone(),
        store: store_ref.clone(),
        channels: channels.clone(),
        gateway: gateway.clone(),
        logs,
        shutdown: shutdown_tx.clone(),
        started,
        model: model.clone(),
        max_frame_bytes: spec.delivery.max_frame_bytes,
        cluster: cluster_view,
        journal: Some(journal.clone()),
        lease: lease.clone(),
    });
    let _ = control_cell.set(ctx.clone());
    if let Some(lease) = lease {
        crate::failover::guard(lease, children.clone(), host.to_owned());
    }
    if let Some(h) = holding {
        h.abort();
    }
    crate::control::heartbeat(ctx.clone());

    let limits = ConnLimits {
        max_frame_bytes: spec.delivery.max_frame_bytes,
        outbox_frames: spec.delivery.outbox_frames,
        uid: nix::unistd::getuid().as_raw(),
        max_connections: agent_connections(fd_limit),
    };
    let agents_listener = UnixTransport::new(state.router_socket())
        .bind()
        .with_context(|| format!("listen on {}", state.router_socket().display()))?;
    flock_actors::start::serve_unix(agents_listener, ConnKind::Agent, router.clone(), limits);

    // The metrics endpoint and the dashboard (off unless asked for), before the agents: a busy
    // port fails `up` before anything has started. And before the control socket: once that
    // answers, `up --detach` returns and `flockctl ui` must find the URL. (The dashboard acts
    // through the control socket; it connects on its first page view.)
    let served = crate::web::start(&web, &state, ctx).await?;
    if let Some(addr) = served.metrics {
        tracing::info!(%addr, "flock: metrics at http://{addr}/metrics");
    }
    if let Some(url) = &served.ui_url {
        // The token is this run's key to the dashboard: printed for the operator (the log is
        // theirs alone, 0600), never a field of its own.
        tracing::info!("flock: dashboard at {url}");
    }

    // Agents first: the control socket appearing is the signal that `up` has started them all.
    let t0 = Instant::now();
    let started_all = async {
        ractor::call!(children, ChildMsg::StartAll).map_err(|e| anyhow!("start agents: {e}"))?;
        // Then the chat bridges: people's messages find their agents running.
        if let Some(env) = &bridge_env {
            let started = crate::bridges::start_all(&spec.bridges, &bridge_tokens, env);
            *bridges.lock().unwrap_or_else(|p| p.into_inner()) = started;
        }
        UnixTransport::new(state.control_socket())
            .bind()
            .with_context(|| format!("listen on {}", state.control_socket().display()))
    };
    let control_listener = match started_all.await {
        Ok(listener) => listener,
        Err(e) => {
            // Failing late must not leave what was started running with nobody to stop it.
            tracing::error!("flock: up failed after starting agents ({e:#}); stopping them");
            wind_down(&router, &bridges, &children, model.as_ref(), &state).await;
            return Err(e);
        }
    };
    let control_limits =
        ConnLimits { max_connections: flock_actors::server::MAX_CONNECTIONS, ..limits };
    flock_actors::start::serve_unix(
        control_listener,
        ConnKind::Control,
        router.clone(),
        control_limits,
    );
    let ms = t0.elapsed().as_millis() as u64;
    tracing::info!(
        swarm = %spec.name,
        agents = spec.agents.len(),
        ms,
        state_dir = %state.root.display(),
        pid = std::process::id(),
        "flock: swarm `{}` up: {} agents started in {ms} ms (state dir {})",
        spec.name,
        spec.agents.len(),
        state.root.display()
    );

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let reason = tokio::select! {
        _ = sigterm.recv() => StopReason::Requested("SIGTERM".into()),
        _ = sigint.recv() => StopReason::Requested("Ctrl-C".into()),
        r = shutdown_rx.recv() => r.unwrap_or_else(|| StopReason::Requested("shutdown".into())),
    };
    let (StopReason::Requested(why) | StopReason::Escalated(why)) = &reason;
    tracing::info!(reason = %why, "flock: {why}: stopping agents in reverse order");
    wind_down(&router, &bridges, &children, model.as_ref(), &state).await;
    children.stop(None);
    router.stop(None);
    channels.stop(None);
    gateway.stop(None);
    store_ref.stop(None);
    tracing::info!(swarm = %spec.name, "flock: swarm `{}` stopped", spec.name);
    match reason {
        StopReason::Requested(_) => Ok(()),
        // A give-up is a failure: exit non-zero so a service manager or script can tell.
        StopReason::Escalated(why) => Err(anyhow!("the swarm was stopped because {why}")),
    }
}

/// Stops everything `up` started, in order: bridges (nobody new comes in), agents in reverse
/// order, the sockets, the model (a stopping agent may still finish a call), and whatever the
/// agents left running.
async fn wind_down(
    router: &ActorRef<flock_actors::RouterMsg>,
    bridges: &std::sync::Mutex<Vec<Arc<crate::bridges::BridgeProcess>>>,
    children: &ActorRef<ChildMsg>,
    model: Option<&Arc<ModelProcess>>,
    state: &StateDir,
) {
    let _ = router.cast(flock_actors::RouterMsg::Drain);
    let running: Vec<_> = bridges.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for b in &running {
        b.stop().await;
    }
    if let Err(e) = ractor::call!(children, ChildMsg::StopAll) {
        tracing::error!(error = %e, "flock: stopping agents failed");
    }
    // A second Ctrl-C during the stop is not needed: StopAll escalates to SIGKILL by itself.
    let _ = std::fs::remove_file(state.control_socket());
    let _ = std::fs::remove_file(flock_ipc::operator::key_path(&state.control_socket()));
    let _ = std::fs::remove_file(state.router_socket());
    let _ = std::fs::remove_file(crate::web::ui_url_file(state));
    let _ = std::fs::remove_file(crate::web::metrics_url_file(state));
    if let Some(model) = model {
        model.stop().await;
        let _ = std::fs::remove_file(state.run_dir().join("model.sock"));
    }
    let leftovers = tokio::task::spawn_blocking(crate::spawn::sweep_orphans).await.unwrap_or(0);
    if leftovers > 0 {
        tracing::warn!(
            killed = leftovers,
            "flock: killed {leftovers} process(es) the agents had left running"
        );
    }
}

/// `up --detach`: re-runs `up` in the background, in its own session, with output in
/// `<state>/logs/supervisor.log`; returns once the control socket answers or the child died.
///
/// `keys` (read and erased from this process's environment by the caller, which is
/// non-dumpable) reach the background supervisor over an inherited socket, never its
/// environment.
pub fn detach(
    swarm_file: &Path,
    state: &StateDir,
    model: Option<&str>,
    host: Option<&str>,
    web: &crate::web::WebOptions,
    log_format: flock_log::Format,
    keys: &HashMap<String, Secret>,
) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    private_files();
    state.create()?;
    let log_path = state.logs_dir().join("supervisor.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("open {}", log_path.display()))?;
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    let secrets = keys.iter().map(|(k, v)| (k.clone(), v.expose().to_owned())).collect();
    let _handoff = crate::spawn::hand_over(&mut cmd, &secrets)?;
    let mut child = cmd
        .arg("up")
        .arg(swarm_file)
        .arg("--state-dir")
        .arg(&state.root)
        .args(model.map(|m| ["--model", m]).into_iter().flatten())
        .args(host.map(|h| ["--host", h]).into_iter().flatten())
        .args(web.metrics.map(|a| ["--metrics".to_owned(), a.to_string()]).into_iter().flatten())
        .args(web.ui.map(|a| ["--ui".to_owned(), a.to_string()]).into_iter().flatten())
        .arg("--log-format")
        .arg(log_format.as_str())
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("start the background supervisor")?;
    let pid = child.id();
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let tail = crate::logs::tail_lines(&log_path, 15);
            bail!(
                "the background supervisor exited ({status}) before it was ready; {}:\n{}",
                log_path.display(),
                Vec::from(tail).join("\n")
            );
        }
        // Ready means *this* supervisor holds the state dir (its pid in the lock file) and
        // answers: another one already running there would answer too, while ours exits.
        let holder = std::fs::read_to_string(state.lock_file()).unwrap_or_default();
        if holder.trim() == pid.to_string()
            && std::os::unix::net::UnixStream::connect(state.control_socket()).is_ok()
        {
            return Ok(pid);
        }
        if Instant::now() > deadline {
            bail!(
                "the background supervisor (pid {pid}) is not ready after 60 s; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swarm(workspace: &std::path::Path) -> SwarmSpec {
        let text = format!(
            "swarm: {{name: t}}\nagents:\n  - {{name: w, role: worker, workspace: \"{}\"}}\n",
            workspace.display()
        );
        flock_config::parse(&text, std::path::Path::new("swarm.yaml")).unwrap()
    }

    #[test]
    fn a_workspace_in_around_or_linked_to_the_state_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let state = StateDir { root: tmp.path().join("state") };
        state.create().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&state.root, &link).unwrap();
        for bad in [state.root.clone(), state.root.join("logs"), tmp.path().to_path_buf(), link] {
            let err = check_workspaces(&swarm(&bad), &state).unwrap_err().to_string();
            assert!(err.contains("the state dir"), "{}: {err}", bad.display());
        }
        check_workspaces(&swarm(&outside), &state).unwrap();
    }
}
