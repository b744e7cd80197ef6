//! The child supervisor actor: OTP supervision for OS processes. One record per agent; every
//! (state, event) pair has an explicit action here, and all timing (ready timeout, backoff,
//! stop escalation, heartbeat checks) is driven by messages the actor sends itself, so nothing
//! blocks and stale timers are recognised by the child's spawn generation.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flock_actors::{RouterEvent, RouterMsg};
use flock_config::{AgentSpec, RestartPolicy, Strategy, SwarmSpec};
use nix::sys::signal::Signal;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::mpsc;
use tracing::Instrument;

use flock_journal::{JournalEvent, Status};

use crate::backoff::{RestartDecision, RestartHistory};
use crate::logs::LogHub;
use crate::paths::StateDir;
use crate::spawn::{Processes, SpawnSpec, describe, new_token};

/// Why the swarm stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Ctrl-C, SIGTERM or `flockctl down`: exit 0.
    Requested(String),
    /// A child exceeded its restart intensity with `escalate: true`: exit 1.
    Escalated(String),
}

/// How long an agent has to exit after a `Shutdown` frame before it gets SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Lifecycle state of a child (DESIGN.md §6). `busy` is added by `ps` from the router's view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildState {
    /// Declared but never started.
    Idle,
    Starting,
    Ready,
    Backoff,
    Stopping,
    Stopped,
    Failed,
    /// Exited and not restarted (its policy said so); the text says how it ended.
    Exited(String),
}

impl ChildState {
    pub fn label(&self) -> String {
        match self {
            ChildState::Idle => "stopped".into(),
            ChildState::Starting => "starting".into(),
            ChildState::Ready => "ready".into(),
            ChildState::Backoff => "backoff".into(),
            ChildState::Stopping => "stopping".into(),
            ChildState::Stopped => "stopped".into(),
            ChildState::Failed => "failed".into(),
            ChildState::Exited(how) => format!("exited({how})"),
        }
    }
}

/// What the supervisor wants to happen when a child's process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Intent {
    /// It should be running: an exit is a crash, handled by its restart policy.
    Run,
    /// It is being stopped on purpose.
    Stop,
    /// It is being stopped so that its group can be restarted (strategy or manual restart).
    StopForRestart,
}

/// One child's facts for `flockctl ps`.
#[derive(Debug, Clone)]
pub struct ChildInfo {
    pub name: String,
    pub role: String,
    pub pid: Option<u32>,
    pub state: String,
    pub uptime_secs: u64,
    pub restarts: u32,
    pub last_exit: Option<String>,
    pub rss_bytes: Option<u64>,
    /// Workers: where their commands run.
    pub sandbox: Option<String>,
    /// Whether the process runs in its cage.
    pub confined: bool,
}

type Reply = RpcReplyPort<Result<String, String>>;

pub enum ChildMsg {
    /// Start every agent in YAML order, each after the previous is ready; reply when done.
    StartAll(RpcReplyPort<()>),
    Exited {
        name: String,
        generation: u64,
        status: std::process::ExitStatus,
    },
    SpawnFailed {
        name: String,
        generation: u64,
        error: String,
    },
    Router(RouterEvent),
    ReadyTimeout {
        name: String,
        generation: u64,
    },
    RestartDue {
        names: Vec<String>,
    },
    Escalate {
        name: String,
        generation: u64,
        kill: bool,
    },
    HeartbeatTick,
    Stop {
        name: String,
        reply: Reply,
    },
    Start {
        name: String,
        reply: Reply,
    },
    Restart {
        name: String,
        reply: Reply,
    },
    /// Stop every agent in reverse YAML order, one after the other.
    StopAll(RpcReplyPort<()>),
    Ps(RpcReplyPort<Vec<ChildInfo>>),
    /// `true`: kill every agent at once and keep them down — this host's lease lapsed
    /// (`cluster.failover`: another machine may take the host over, and an agent must never run
    /// on two); `false`: the lease is held again, start those it killed.
    Fence(bool),
    /// Supervise a new agent (created at run time) and start it; answers once it is ready.
    Add {
        spec: Box<AgentSpec>,
        liveness: Arc<AtomicU64>,
        reply: Reply,
    },
    /// Stop an agent for good and forget it (decommissioned).
    Remove {
        name: String,
    },
}

pub struct ChildArgs {
    pub spec: Arc<SwarmSpec>,
    pub state_dir: StateDir,
    pub router: ActorRef<RouterMsg>,
    /// Starts and signals the agents' processes.
    pub processes: Arc<dyn Processes>,
    pub logs: LogHub,
    pub liveness: HashMap<String, Arc<AtomicU64>>,
    pub agent_bin: PathBuf,
    /// Where to ask for the whole swarm to stop (escalation).
    pub shutdown: mpsc::UnboundedSender<StopReason>,
    /// Restarts, give-ups and exits are journaled (DESIGN.md §9).
    pub journal: Option<Arc<flock_journal::Journal>>,
    /// `flock-sandbox`, when this kernel can cage agents (`None`: agents run uncaged).
    pub cage: Option<PathBuf>,
}

impl ChildArgs {
    /// Whether `spec`'s process runs in its cage.
    pub fn caged(&self, spec: &AgentSpec) -> bool {
        self.cage.is_some() && !spec.unconfined
    }
}

struct Child {
    spec: AgentSpec,
    state: ChildState,
    pid: Option<u32>,
    generation: u64,
    spawned_at: Option<Instant>,
    restarts: u32,
    last_exit: Option<String>,
    /// Why the supervisor killed it, reported instead of the bare signal.
    kill_reason: Option<String>,
    history: RestartHistory,
    intent: Intent,
    ready_waiters: Vec<Reply>,
    stop_waiters: Vec<Reply>,
    liveness: Arc<AtomicU64>,
    /// Decommissioned: forget the child once its process has stopped.
    remove_on_stop: bool,
}

impl Child {
    fn new(spec: AgentSpec, liveness: Arc<AtomicU64>) -> Self {
        Child {
            spec,
            state: ChildState::Idle,
            pid: None,
            generation: 0,
            spawned_at: None,
            restarts: 0,
            last_exit: None,
            kill_reason: None,
            history: RestartHistory::default(),
            intent: Intent::Stop,
            ready_waiters: Vec::new(),
            stop_waiters: Vec::new(),
            liveness,
            remove_on_stop: false,
        }
    }
}

/// Siblings being stopped so that a group can restart together (one_for_all, rest_for_one).
struct RestartGroup {
    members: Vec<String>,
    waiting: Vec<String>,
    delay: Duration,
}

pub struct ChildSupervisor;

pub struct ChildSupState {
    args: ChildArgs,
    order: Vec<String>,
    children: HashMap<String, Child>,
    start_queue: VecDeque<String>,
    /// Spawned and not ready yet: at most `supervision.parallel`.
    starting: Vec<String>,
    start_all_waiters: Vec<RpcReplyPort<()>>,
    groups: Vec<RestartGroup>,
    stop_all: Option<(Vec<String>, RpcReplyPort<()>)>,
    /// The agents [`ChildMsg::Fence`] killed, to start again when the lease is held again.
    fenced: Vec<String>,
}

impl Actor for ChildSupervisor {
    type Msg = ChildMsg;
    type State = ChildSupState;
    type Arguments = ChildArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ChildMsg>,
        args: ChildArgs,
    ) -> Result<ChildSupState, ActorProcessingErr> {
        let mut children = HashMap::new();
        for spec in &args.spec.agents {
            let key = spec.key();
            let liveness = args.liveness.get(&key).cloned().unwrap_or_default();
            children.insert(key, Child::new(spec.clone(), liveness));
        }
        let tick = args.spec.supervision.heartbeat_interval();
        myself.send_interval(tick, || ChildMsg::HeartbeatTick);
        Ok(ChildSupState {
            order: args.spec.agents.iter().map(AgentSpec::key).collect(),
            args,
            children,
            start_queue: VecDeque::new(),
            starting: Vec::new(),
            start_all_waiters: Vec::new(),
            groups: Vec::new(),
            stop_all: None,
            fenced: Vec::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ChildMsg>,
        msg: ChildMsg,
        st: &mut ChildSupState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            ChildMsg::StartAll(reply) => {
                for name in st.order.clone() {
                    if let Some(c) = st.children.get_mut(&name) {
                        c.intent = Intent::Run;
                    }
                    st.start_queue.push_back(name);
                }
                st.start_all_waiters.push(reply);
                st.start_next(&myself).await;
            }
            ChildMsg::Exited { name, generation, status } => {
                // One span per exit: the restart decision and what follows carry the agent.
                let span = tracing::info_span!("child_exit", agent = %name, generation);
                st.exited(&myself, &name, generation, status).instrument(span).await;
            }
            ChildMsg::SpawnFailed { name, generation, error } => {
                st.spawn_failed(&myself, &name, generation, error).await;
            }
            ChildMsg::Router(RouterEvent::Ready { agent, pid }) => {
                let Some(c) = st.children.get_mut(&agent) else { return Ok(()) };
                if c.state != ChildState::Starting {
                    return Ok(());
                }
                c.state = ChildState::Ready;
                let ms = c.spawned_at.map_or(0, |t| t.elapsed().as_millis());
                tracing::debug!(agent = %agent, pid, ms = ms as u64, "agent ready");
                st.args.logs.line(
                    &agent,
                    "flock",
                    &format!("ready (pid {pid}, {ms} ms after spawn)"),
                );
                for w in c.ready_waiters.drain(..) {
                    let _ = w.send(Ok(format!("{agent} is ready (pid {pid})")));
                }
                if st.started(&agent) {
                    st.start_next(&myself).await;
                }
            }
            // The process's exit, not its socket, decides what happens next; a process that
            // lingers without its connection stops sending heartbeats and is killed for it.
            ChildMsg::Router(RouterEvent::Disconnected { .. }) => {}
            ChildMsg::ReadyTimeout { name, generation } => {
                let Some(c) = st.children.get_mut(&name) else { return Ok(()) };
                if c.generation == generation
                    && c.state == ChildState::Starting
                    && let Some(pid) = c.pid
                {
                    let why = format!(
                        "killed: no Hello within {} s (ready_timeout_secs)",
                        c.spec.ready_timeout_secs
                    );
                    st.args.logs.line(&name, "flock", &why);
                    c.kill_reason = Some(why);
                    st.args.processes.signal(pid, Signal::SIGKILL);
                }
            }
            ChildMsg::RestartDue { names } => {
                for name in names {
                    let Some(c) = st.children.get_mut(&name) else { continue };
                    if c.state == ChildState::Backoff && c.intent == Intent::Run {
                        st.start_queue.push_back(name);
                    }
                }
                st.start_next(&myself).await;
            }
            ChildMsg::Escalate { name, generation, kill } => {
                let Some(c) = st.children.get(&name) else { return Ok(()) };
                if c.generation != generation || c.state != ChildState::Stopping {
                    return Ok(());
                }
                let Some(pid) = c.pid else { return Ok(()) };
                if kill {
                    st.args.logs.line(&name, "flock", "did not stop in time: SIGKILL");
                    st.args.processes.signal(pid, Signal::SIGKILL);
                } else {
                    st.args.processes.signal(pid, Signal::SIGTERM);
                    let timeout = c.spec.stop_timeout();
                    myself.send_after(timeout, move || ChildMsg::Escalate {
                        name,
                        generation,
                        kill: true,
                    });
                }
            }
            ChildMsg::HeartbeatTick => st.check_heartbeats(),
            ChildMsg::Stop { name, reply } => {
                let Some(c) = st.children.get_mut(&name) else {
                    let _ = reply.send(Err(st.unknown(&name)));
                    return Ok(());
                };
                st.start_queue.retain(|n| n != &name);
                if c.pid.is_none() {
                    c.intent = Intent::Stop;
                    if matches!(c.state, ChildState::Backoff | ChildState::Starting) {
                        c.state = ChildState::Stopped;
                    }
                    let _ = reply.send(Ok(format!("{name} is not running ({})", c.state.label())));
                    return Ok(());
                }
                c.stop_waiters.push(reply);
                st.begin_stop(&myself, &name, Intent::Stop);
            }
            ChildMsg::Start { name, reply } => {
                let Some(c) = st.children.get_mut(&name) else {
                    let _ = reply.send(Err(st.unknown(&name)));
                    return Ok(());
                };
                if c.pid.is_some() {
                    let _ = reply.send(Ok(format!("{name} is already running")));
                    return Ok(());
                }
                c.history.reset();
                c.intent = Intent::Run;
                c.ready_waiters.push(reply);
                c.state = ChildState::Backoff;
                st.start_queue.push_back(name);
                st.start_next(&myself).await;
            }
            ChildMsg::Restart { name, reply } => {
                let Some(c) = st.children.get_mut(&name) else {
                    let _ = reply.send(Err(st.unknown(&name)));
                    return Ok(());
                };
                c.history.reset();
                c.ready_waiters.push(reply);
                if c.pid.is_some() {
                    st.groups.push(RestartGroup {
                        members: vec![name.clone()],
                        waiting: vec![name.clone()],
                        delay: Duration::ZERO,
                    });
                    st.begin_stop(&myself, &name, Intent::StopForRestart);
                } else {
                    c.intent = Intent::Run;
                    c.state = ChildState::Backoff;
                    c.restarts += 1;
                    st.start_queue.push_back(name);
                    st.start_next(&myself).await;
                }
            }
            ChildMsg::StopAll(reply) => {
                st.start_queue.clear();
                st.groups.clear();
                let mut remaining = st.order.clone();
                for name in &remaining {
                    if let Some(c) = st.children.get_mut(name) {
                        c.intent = Intent::Stop;
                        if c.pid.is_none() && c.state == ChildState::Backoff {
                            c.state = ChildState::Stopped;
                        }
                    }
                }
                remaining.reverse();
                st.stop_all = Some((remaining, reply));
                st.continue_stop_all(&myself);
            }
            ChildMsg::Fence(true) => {
                st.start_queue.clear();
                st.groups.clear();
                for name in st.order.clone() {
                    let Some(c) = st.children.get_mut(&name) else { continue };
                    if c.intent != Intent::Run {
                        continue;
                    }
                    c.intent = Intent::Stop;
                    st.fenced.push(name.clone());
                    match c.pid {
                        Some(pid) => {
                            let why = "killed: this host's lease lapsed (cluster.failover)";
                            st.args.logs.line(&name, "flock", why);
                            c.kill_reason = Some(why.into());
                            c.state = ChildState::Stopping;
                            st.args.processes.signal(pid, Signal::SIGKILL);
                        }
                        None => c.state = ChildState::Stopped,
                    }
                }
            }
            ChildMsg::Fence(false) => {
                for name in std::mem::take(&mut st.fenced) {
                    let Some(c) = st.children.get_mut(&name) else { continue };
                    if c.intent == Intent::Stop {
                        c.intent = Intent::Run;
                        c.history.reset();
                        if c.pid.is_none() {
                            c.state = ChildState::Backoff;
                            st.start_queue.push_back(name);
                        }
                    }
                }
                st.start_next(&myself).await;
            }
            ChildMsg::Add { spec, liveness, reply } => {
                let name = spec.key();
                if st.children.contains_key(&name) {
                    let _ =
                        reply.send(Err(format!("an agent named `{name}` is already supervised")));
                    return Ok(());
                }
                let mut child = Child::new(*spec, liveness);
                child.intent = Intent::Run;
                child.state = ChildState::Backoff;
                child.ready_waiters.push(reply);
                st.children.insert(name.clone(), child);
                st.order.push(name.clone());
                st.args.logs.line(&name, "flock", "created at run time");
                st.start_queue.push_back(name);
                st.start_next(&myself).await;
            }
            ChildMsg::Remove { name } => {
                st.start_queue.retain(|n| n != &name);
                let Some(c) = st.children.get_mut(&name) else { return Ok(()) };
                c.remove_on_stop = true;
                if c.pid.is_some() {
                    st.begin_stop(&myself, &name, Intent::Stop);
                } else {
                    st.forget(&name);
                }
            }
            ChildMsg::Ps(reply) => {
                let infos = st
                    .order
                    .iter()
                    .filter_map(|n| st.children.get(n))
                    .map(|c| ChildInfo {
                        name: c.spec.key(),
                        role: c.spec.role.as_str().into(),
                        sandbox: (c.spec.role == flock_config::Role::Worker)
                            .then(|| c.spec.sandbox.as_str().to_string()),
                        confined: st.args.caged(&c.spec),
                        pid: c.pid,
                        state: c.state.label(),
                        uptime_secs: match (c.pid, c.spawned_at) {
                            (Some(_), Some(t)) => t.elapsed().as_secs(),
                            _ => 0,
                        },
                        restarts: c.restarts,
                        last_exit: c.last_exit.clone(),
                        rss_bytes: c.pid.and_then(|pid| st.args.processes.rss(pid)),
                    })
                    .collect();
                let _ = reply.send(infos);
            }
        }
        Ok(())
    }
}

/// Appends a supervision event to the journal (a journal failure never stops supervision).
fn journal(args: &ChildArgs, agent: &str, kind: &str, status: Status, message: &str, exit: &str) {
    if let Some(j) = &args.journal {
        let event = JournalEvent::new("flock-supervisor", kind, status, message)
            .param("agent", agent)
            .param("last_exit", exit);
        if let Err(e) = j.append(&event) {
            tracing::error!(agent, kind, error = %e, "flock: journal append failed");
        }
    }
}

impl ChildSupState {
    fn unknown(&self, name: &str) -> String {
        format!("no agent named `{name}`; agents: {}", self.order.join(", "))
    }

    /// Forgets a decommissioned child, and tells the router to stop routing to it. Nothing of
    /// it stays open here: its log is retired, and an instance's own workspace goes if the
    /// instance left nothing in it (a workspace with files is the work's result: it stays).
    fn forget(&mut self, name: &str) {
        let Some(c) = self.children.remove(name) else { return };
        self.order.retain(|n| n != name);
        self.args.logs.line(name, "flock", "decommissioned");
        self.args.logs.retire(name);
        if c.spec.instance.is_some() && c.spec.workspace.is_none() {
            // `remove_dir` removes an empty folder only.
            let _ = std::fs::remove_dir(self.args.state_dir.workspaces().join(name));
        }
        let _ = self.args.router.cast(RouterMsg::RemoveAgent { name: name.into() });
    }

    /// `name` is no longer starting (ready, exited or failed to spawn); whether it was.
    fn started(&mut self, name: &str) -> bool {
        let before = self.starting.len();
        self.starting.retain(|n| n != name);
        self.starting.len() < before
    }

    /// How many children may be starting, or stopping during `down`, at once.
    fn parallel(&self) -> usize {
        self.args.spec.supervision.parallel.max(1) as usize
    }

    /// Spawns queued children, in order, while fewer than `supervision.parallel` are starting.
    async fn start_next(&mut self, myself: &ActorRef<ChildMsg>) {
        while self.starting.len() < self.parallel() {
            let Some(name) = self.start_queue.pop_front() else {
                // Every queued child has started once none is still starting.
                if self.starting.is_empty() {
                    for w in self.start_all_waiters.drain(..) {
                        let _ = w.send(());
                    }
                }
                return;
            };
            let runnable = self
                .children
                .get(&name)
                .is_some_and(|c| c.pid.is_none() && c.intent == Intent::Run);
            if runnable {
                self.spawn(myself, &name).await;
            }
        }
    }

    async fn spawn(&mut self, myself: &ActorRef<ChildMsg>, name: &str) {
        let Some(c) = self.children.get_mut(name) else { return };
        c.generation += 1;
        let generation = c.generation;
        let token = new_token();
        let _ =
            self.args.router.cast(RouterMsg::Expect { agent: name.into(), token: token.clone() });
        let spec = spawn_spec(&self.args, &c.spec, &token);
        c.state = ChildState::Starting;
        c.kill_reason = None;
        self.starting.push(name.to_owned());
        match self.args.processes.spawn(spec).await {
            Ok(child) => {
                let pid = child.pid;
                let _ = self.args.router.cast(RouterMsg::Spawned { agent: name.into(), pid });
                c.pid = Some(pid);
                c.spawned_at = Some(Instant::now());
                c.liveness.store(crate::unix_ms(), Ordering::Relaxed);
                tracing::debug!(agent = name, pid, generation, "agent spawned");
                self.args.logs.line(name, "flock", &format!("spawned pid {pid}"));
                if let Some(out) = child.stdout {
                    self.args.logs.capture(name.into(), "out", out);
                }
                if let Some(err) = child.stderr {
                    self.args.logs.capture(name.into(), "err", err);
                }
                let me = myself.clone();
                let n = name.to_owned();
                tokio::spawn(async move {
                    let msg = match child.exit.await {
                        Ok(status) => ChildMsg::Exited { name: n, generation, status },
                        Err(e) => {
                            ChildMsg::SpawnFailed { name: n, generation, error: e.to_string() }
                        }
                    };
                    let _ = me.cast(msg);
                });
                let n = name.to_owned();
                myself.send_after(c.spec.ready_timeout(), move || ChildMsg::ReadyTimeout {
                    name: n,
                    generation,
                });
            }
            Err(e) => {
                let _ = myself.cast(ChildMsg::SpawnFailed {
                    name: name.into(),
                    generation,
                    error: format!("{e:#}"),
                });
            }
        }
    }

    async fn spawn_failed(
        &mut self,
        myself: &ActorRef<ChildMsg>,
        name: &str,
        generation: u64,
        error: String,
    ) {
        let Some(c) = self.children.get_mut(name) else { return };
        if c.generation != generation {
            return;
        }
        tracing::error!(agent = name, error = %error, "agent {name} could not start");
        self.args.logs.line(name, "flock", &format!("could not start: {error}"));
        c.state = ChildState::Failed;
        c.pid = None;
        c.last_exit = Some(format!("spawn failed: {error}"));
        for w in c.ready_waiters.drain(..) {
            let _ = w.send(Err(format!("{name} could not start: {error}")));
        }
        self.started(name);
        self.start_next(myself).await;
    }

    async fn exited(
        &mut self,
        myself: &ActorRef<ChildMsg>,
        name: &str,
        generation: u64,
        status: std::process::ExitStatus,
    ) {
        let supervision = self.args.spec.supervision.clone();
        let strategy = supervision.strategy;
        let Some(c) = self.children.get_mut(name) else { return };
        if c.generation != generation {
            return;
        }
        let killed_by_us = c.kill_reason.is_some();
        let how = c.kill_reason.take().unwrap_or_else(|| describe(&status));
        let uptime = c.spawned_at.map_or(Duration::ZERO, |t| t.elapsed());
        c.pid = None;
        c.last_exit = Some(how.clone());
        if c.intent == Intent::Run && (killed_by_us || !status.success()) {
            tracing::warn!(agent = name, exit = %how, uptime_ms = uptime.as_millis() as u64, "agent {name} exited: {how}");
        } else {
            tracing::debug!(agent = name, exit = %how, "agent {name} exited: {how}");
        }
        self.args.logs.line(name, "flock", &format!("exited: {how}"));
        // What it started and left behind goes with it (spawn.rs: it is ours to kill now).
        let logs = self.args.logs.clone();
        let n = name.to_owned();
        let processes = Arc::clone(&self.args.processes);
        tokio::task::spawn_blocking(move || {
            let killed = processes.sweep();
            if killed > 0 {
                logs.line(&n, "flock", &format!("killed {killed} process(es) it had left running"));
            }
        });
        self.started(name);
        let Some(c) = self.children.get_mut(name) else { return };
        match c.intent {
            Intent::Stop => {
                c.state = ChildState::Stopped;
                for w in c.stop_waiters.drain(..) {
                    let _ = w.send(Ok(format!("{name} stopped ({how})")));
                }
                for w in c.ready_waiters.drain(..) {
                    let _ = w.send(Err(format!("{name} was stopped")));
                }
                if c.remove_on_stop {
                    self.forget(name);
                }
                self.continue_stop_all(myself);
            }
            Intent::StopForRestart => {
                c.state = ChildState::Stopped;
                self.group_member_stopped(myself, name);
            }
            Intent::Run => {
                let abnormal = killed_by_us || !status.success();
                let restart = match c.spec.restart {
                    RestartPolicy::Permanent => true,
                    RestartPolicy::Transient => abnormal,
                    RestartPolicy::Temporary => false,
                };
                if !restart {
                    c.state = ChildState::Exited(how.clone());
                    c.intent = Intent::Stop;
                    for w in c.ready_waiters.drain(..) {
                        let _ = w.send(Err(format!("{name} exited ({how})")));
                    }
                } else {
                    let jitter = fastrand::f64() * 2.0 - 1.0;
                    match c.history.on_death(&supervision, Instant::now(), uptime, jitter) {
                        RestartDecision::GiveUp => {
                            c.state = ChildState::Failed;
                            c.intent = Intent::Stop;
                            let msg = format!(
                                "failed: more than {} restarts in {} s; `flockctl restart {name}` tries again",
                                supervision.max_restarts, supervision.max_seconds
                            );
                            self.args.logs.line(name, "flock", &msg);
                            tracing::error!(
                                agent = name,
                                restarts = c.restarts,
                                max_restarts = supervision.max_restarts,
                                max_seconds = supervision.max_seconds,
                                "flock: agent {name} {msg}"
                            );
                            journal(&self.args, name, "AGENT_FAILED", Status::Failed, &msg, &how);
                            for w in c.ready_waiters.drain(..) {
                                let _ = w.send(Err(format!("{name} {msg}")));
                            }
                            if supervision.escalate {
                                let _ = self.args.shutdown.send(StopReason::Escalated(format!(
                                    "agent {name} exceeded its restart intensity and escalate is set"
                                )));
                            }
                        }
                        RestartDecision::After(delay) => {
                            let msg = format!("restarting in {} ms", delay.as_millis());
                            tracing::info!(
                                agent = name,
                                restarts = c.restarts + 1,
                                delay_ms = delay.as_millis() as u64,
                                "agent {name} {msg}"
                            );
                            self.args.logs.line(name, "flock", &msg);
                            journal(&self.args, name, "AGENT_RESTART", Status::Success, &msg, &how);
                            let members = self.group_of(name, strategy);
                            let siblings: Vec<String> =
                                members.iter().filter(|m| m.as_str() != name).cloned().collect();
                            let waiting: Vec<String> = siblings
                                .iter()
                                .filter(|s| self.children.get(*s).is_some_and(|c| c.pid.is_some()))
                                .cloned()
                                .collect();
                            self.groups.push(RestartGroup {
                                members,
                                waiting: waiting.clone(),
                                delay,
                            });
                            for s in waiting.iter().rev() {
                                self.begin_stop(myself, s, Intent::StopForRestart);
                            }
                            self.group_member_stopped(myself, name);
                        }
                    }
                }
            }
        }
        self.start_next(myself).await;
    }

    /// The children restarted together with `name` under `strategy`, in start order.
    /// Only children meant to be running take part.
    fn group_of(&self, name: &str, strategy: Strategy) -> Vec<String> {
        let pos = self.order.iter().position(|n| n == name).unwrap_or(0);
        self.order
            .iter()
            .enumerate()
            .filter(|(i, n)| match strategy {
                Strategy::OneForOne => n.as_str() == name,
                Strategy::OneForAll => true,
                Strategy::RestForOne => *i >= pos,
            })
            .map(|(_, n)| n.clone())
            .filter(|n| n == name || self.children.get(n).is_some_and(|c| c.intent == Intent::Run))
            .collect()
    }

    /// A member of a restart group is down; once all are, restart the group in order.
    fn group_member_stopped(&mut self, myself: &ActorRef<ChildMsg>, name: &str) {
        for g in &mut self.groups {
            g.waiting.retain(|n| n != name);
        }
        let (ready, rest): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.groups).into_iter().partition(|g| g.waiting.is_empty());
        self.groups = rest;
        for g in ready {
            for m in &g.members {
                if let Some(c) = self.children.get_mut(m) {
                    c.intent = Intent::Run;
                    c.state = ChildState::Backoff;
                    c.restarts += 1;
                }
            }
            let names = g.members;
            if g.delay.is_zero() {
                let _ = myself.cast(ChildMsg::RestartDue { names });
            } else {
                myself.send_after(g.delay, move || ChildMsg::RestartDue { names });
            }
        }
    }

    /// Graceful stop: `Shutdown` frame, then SIGTERM to the group, then SIGKILL.
    fn begin_stop(&mut self, myself: &ActorRef<ChildMsg>, name: &str, intent: Intent) {
        let Some(c) = self.children.get_mut(name) else { return };
        c.intent = intent;
        if c.pid.is_none() {
            c.state = ChildState::Stopped;
            return;
        }
        if c.state == ChildState::Stopping {
            return;
        }
        c.state = ChildState::Stopping;
        let _ = self.args.router.cast(RouterMsg::Stop { agent: name.into() });
        let generation = c.generation;
        let n = name.to_owned();
        let grace = SHUTDOWN_GRACE.min(c.spec.stop_timeout());
        myself.send_after(grace, move || ChildMsg::Escalate { name: n, generation, kill: false });
    }

    fn continue_stop_all(&mut self, myself: &ActorRef<ChildMsg>) {
        // Stop in reverse start order, `supervision.parallel` at a time.
        let parallel = self.parallel();
        let Some((remaining, _)) = &mut self.stop_all else { return };
        remaining.retain(|n| self.children.get(n).is_some_and(|c| c.pid.is_some()));
        let next: Vec<String> = remaining
            .iter()
            .take(parallel)
            .filter(|n| self.children.get(*n).is_some_and(|c| c.state != ChildState::Stopping))
            .cloned()
            .collect();
        if remaining.is_empty()
            && let Some((_, reply)) = self.stop_all.take()
        {
            let _ = reply.send(());
        }
        for name in next {
            self.begin_stop(myself, &name, Intent::Stop);
        }
    }

    fn check_heartbeats(&mut self) {
        let sup = &self.args.spec.supervision;
        let limit = sup.heartbeat_interval_ms * u64::from(sup.heartbeat_misses);
        let now = crate::unix_ms();
        for c in self.children.values_mut() {
            if c.state != ChildState::Ready || c.kill_reason.is_some() {
                continue;
            }
            let Some(pid) = c.pid else { continue };
            let silent = now.saturating_sub(c.liveness.load(Ordering::Relaxed));
            if silent > limit {
                let why = format!(
                    "killed: no heartbeat for {} ms ({} missed)",
                    silent,
                    silent / sup.heartbeat_interval_ms.max(1)
                );
                tracing::warn!(agent = %c.spec.key(), pid, silent_ms = silent, "agent {} {why}", c.spec.key());
                self.args.logs.line(&c.spec.key(), "flock", &why);
                c.kill_reason = Some(why);
                self.args.processes.signal(pid, Signal::SIGKILL);
            }
        }
    }
}

fn spawn_spec(args: &ChildArgs, spec: &AgentSpec, token: &str) -> SpawnSpec {
    let cwd = match &spec.workspace {
        Some(p) if p.is_absolute() => p.clone(),
        Some(p) => args.state_dir.workspaces().join(p),
        None => args.state_dir.workspaces().join(spec.key()),
    };
    let (program, rest) = match &spec.command {
        Some(cmd) if !cmd.is_empty() => (PathBuf::from(&cmd[0]), cmd[1..].to_vec()),
        _ => (args.agent_bin.clone(), Vec::new()),
    };
    let mut env: Vec<(String, String)> = vec![
        (flock_ipc::env::SOCKET.into(), args.state_dir.router_socket().display().to_string()),
        (flock_ipc::env::AGENT.into(), spec.name.clone()),
        (
            flock_ipc::env::INSTANCE.into(),
            spec.instance.clone().unwrap_or_else(|| flock_ipc::identity::DEFAULT_INSTANCE.into()),
        ),
        (flock_ipc::env::MEMORY_DIR.into(), args.state_dir.memory_dir().display().to_string()),
    ];
    // The swarm's own masking rules (memory.mask), for the agent's memory writes.
    if !args.spec.mask.is_empty()
        && let Ok(rules) = serde_json::to_string(&args.spec.mask)
    {
        env.push((flock_memory::mask::RULES_ENV.into(), rules));
    }
    env.extend(spec.env.iter().cloned());
    let secrets = [(flock_ipc::env::TOKEN.to_owned(), token.to_owned())].into();
    let (program, rest) = match &args.cage {
        Some(cage) if args.caged(spec) => {
            // The cage shows this agent its workspace and the router socket of the state dir,
            // the memory folder read-only (the supervisor writes it on the agents' behalf), and
            // nothing else of it.
            let sd = &args.state_dir;
            let show = vec![cwd.clone(), sd.router_socket()];
            let read_only = vec![sd.memory_dir()];
            // (`flock_sandbox::cage::Cage`, written here to keep the sandbox's dependencies
            // out of the supervisor.)
            let json =
                serde_json::json!({ "hidden": sd.root, "show": show, "read_only": read_only })
                    .to_string();
            let mut wrapped = vec!["cage".to_owned(), json, program.display().to_string()];
            wrapped.extend(rest);
            (cage.clone(), wrapped)
        }
        _ => (program, rest),
    };
    SpawnSpec { program, args: rest, cwd, env, secrets }
}

#[cfg(test)]
#[path = "children_tests.rs"]
mod tests;
