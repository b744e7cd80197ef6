//! The child supervisor as a state machine: real actor, real messages, real timers on a paused
//! tokio clock — and fake processes. [`FakeProcesses`] records every spawn and signal and lets
//! the test decide when a process exits; a recording router stands in for the real one. Each
//! test walks one OTP path (restart with backoff, restart intensity, group strategies, the stop
//! escalation, the ready timeout, a missed heartbeat) and checks what a user sees in `ps`.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flock_actors::{RouterEvent, RouterMsg};
use nix::sys::signal::Signal;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::*;
use crate::spawn::{Processes, SpawnSpec, Started};

/// What the child supervisor did to the outside world, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Call {
    Spawned {
        agent: String,
        pid: u32,
    },
    Signal {
        pid: u32,
        signal: Signal,
    },
    /// The router was told to send `Shutdown` to the agent.
    RouterStop(String),
}

#[derive(Default)]
struct Fake {
    next_pid: u32,
    /// Pid → the agent it runs and how to end it.
    running: HashMap<u32, (String, oneshot::Sender<ExitStatus>)>,
    /// Processes that ignore SIGTERM (they die of SIGKILL only).
    stubborn: bool,
}

/// Processes that exist only here: a spawn gets the next pid; a process exits when the test
/// says so, or when it is sent SIGKILL (or SIGTERM, unless stubborn).
struct FakeProcesses {
    state: Mutex<Fake>,
    calls: mpsc::UnboundedSender<Call>,
}

impl FakeProcesses {
    fn fake(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends `pid` with `status`, as the kernel would.
    fn end(&self, pid: u32, status: ExitStatus) {
        if let Some((_, exit)) = self.fake().running.remove(&pid) {
            let _ = exit.send(status);
        }
    }
}

impl Processes for FakeProcesses {
    fn spawn(
        &self,
        spec: SpawnSpec,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<Started>> + Send + '_>>
    {
        Box::pin(async move {
            let agent = spec
                .env
                .iter()
                .find(|(k, _)| k == flock_ipc::env::AGENT)
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let (tx, rx) = oneshot::channel();
            let pid = {
                let mut fake = self.fake();
                fake.next_pid += 1;
                let pid = 1000 + fake.next_pid;
                fake.running.insert(pid, (agent.clone(), tx));
                pid
            };
            let _ = self.calls.send(Call::Spawned { agent, pid });
            Ok(Started {
                pid,
                stdout: None,
                stderr: None,
                exit: Box::pin(async move {
                    rx.await.map_err(|_| std::io::Error::other("the fake process vanished"))
                }),
            })
        })
    }

    fn signal(&self, pid: u32, signal: Signal) {
        let _ = self.calls.send(Call::Signal { pid, signal });
        let dies =
            signal == Signal::SIGKILL || (signal == Signal::SIGTERM && !self.fake().stubborn);
        if dies {
            self.end(pid, ExitStatus::from_raw(signal as i32));
        }
    }

    fn rss(&self, _pid: u32) -> Option<u64> {
        Some(4 << 20)
    }

    fn sweep(&self) -> usize {
        0
    }
}

/// The router's part: records what it is told about agents.
struct Router;

impl Actor for Router {
    type Msg = RouterMsg;
    type State = mpsc::UnboundedSender<Call>;
    type Arguments = mpsc::UnboundedSender<Call>;

    async fn pre_start(
        &self,
        _: ActorRef<RouterMsg>,
        calls: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(calls)
    }

    async fn handle(
        &self,
        _: ActorRef<RouterMsg>,
        msg: RouterMsg,
        calls: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let RouterMsg::Stop { agent } = msg {
            let _ = calls.send(Call::RouterStop(agent));
        }
        Ok(())
    }
}

struct Harness {
    sup: ActorRef<ChildMsg>,
    processes: Arc<FakeProcesses>,
    calls: mpsc::UnboundedReceiver<Call>,
    shutdown: mpsc::UnboundedReceiver<StopReason>,
    liveness: HashMap<String, Arc<AtomicU64>>,
    _dir: tempfile::TempDir,
}

/// A swarm of `agents` (names, all `restart: permanent`) under `supervision` (YAML lines).
async fn harness(agents: &[&str], supervision: &str) -> Harness {
    let mut yaml = format!(
        "swarm: {{ name: sm }}\nsupervision:\n  heartbeat_interval_ms: 1000\n  heartbeat_misses: 3\n{supervision}\nmodels:\n  m: {{ provider: scripted, rules: [ {{ reply: ok }} ] }}\nagents:\n"
    );
    for a in agents {
        yaml.push_str(&format!(
            "  - {{ name: {a}, role: worker, model: m, ready_timeout_secs: 5, stop_timeout_secs: 4 }}\n"
        ));
    }
    let spec = flock_config::parse(&yaml, Path::new("sm.yaml")).expect("a valid swarm file");
    let dir = tempfile::tempdir().expect("tempdir");
    let (calls_tx, calls) = mpsc::unbounded_channel();
    let (router, _) = Actor::spawn(None, Router, calls_tx.clone()).await.expect("router");
    let processes = Arc::new(FakeProcesses { state: Mutex::new(Fake::default()), calls: calls_tx });
    let liveness: HashMap<String, Arc<AtomicU64>> =
        agents.iter().map(|a| (a.to_string(), Arc::new(AtomicU64::new(u64::MAX)))).collect();
    let (shutdown_tx, shutdown) = mpsc::unbounded_channel();
    let args = ChildArgs {
        spec: Arc::new(spec),
        state_dir: StateDir { root: dir.path().to_path_buf() },
        router,
        processes: processes.clone(),
        logs: LogHub::new(dir.path().join("logs")),
        liveness: liveness.clone(),
        agent_bin: "/bin/false".into(),
        shutdown: shutdown_tx,
        journal: None,
        cage: None,
    };
    let (sup, _) = Actor::spawn(None, ChildSupervisor, args).await.expect("child supervisor");
    Harness { sup, processes, calls, shutdown, liveness, _dir: dir }
}

impl Harness {
    async fn next_call(&mut self) -> Call {
        tokio::time::timeout(Duration::from_secs(600), self.calls.recv())
            .await
            .expect("a call within ten (paused) minutes")
            .expect("the call channel is open")
    }

    /// The next spawn, skipping nothing: panics on any other call.
    async fn spawned(&mut self, agent: &str) -> u32 {
        match self.next_call().await {
            Call::Spawned { agent: a, pid } if a == agent => pid,
            other => panic!("expected a spawn of {agent}, got {other:?}"),
        }
    }

    /// The agent says Hello: the router reports it ready (its liveness fresh).
    fn ready(&self, agent: &str, pid: u32) {
        self.liveness[agent].store(crate::unix_ms(), Ordering::Relaxed);
        self.sup
            .cast(ChildMsg::Router(RouterEvent::Ready { agent: agent.into(), pid }))
            .expect("cast");
    }

    /// Starts every agent, each spawned and ready in turn.
    async fn start_all(&mut self, agents: &[&str]) -> Vec<u32> {
        let (tx, rx) = oneshot::channel();
        self.sup.cast(ChildMsg::StartAll(tx.into())).expect("cast");
        let mut pids = Vec::new();
        for a in agents {
            let pid = self.spawned(a).await;
            self.ready(a, pid);
            pids.push(pid);
        }
        rx.await.expect("StartAll answers once all are ready");
        pids
    }

    async fn ps(&self) -> HashMap<String, ChildInfo> {
        let infos = ractor::call!(self.sup, ChildMsg::Ps).expect("ps");
        infos.into_iter().map(|i| (i.name.clone(), i)).collect()
    }
}

fn exit_code(code: i32) -> ExitStatus {
    ExitStatus::from_raw(code << 8)
}

#[tokio::test(start_paused = true)]
async fn a_crashed_agent_restarts_at_once_then_after_a_doubling_backoff() {
    let mut h = harness(&["a"], "  backoff_initial_ms: 500\n  backoff_max_ms: 60000").await;
    let pid = h.start_all(&["a"]).await[0];

    // The first crash of a sequence restarts at once.
    let crashed = Instant::now();
    h.processes.end(pid, exit_code(3));
    let pid = h.spawned("a").await;
    assert!(crashed.elapsed() < Duration::from_millis(10), "{:?}", crashed.elapsed());
    let ps = h.ps().await;
    assert_eq!((ps["a"].state.as_str(), ps["a"].restarts), ("starting", 1));
    assert_eq!(ps["a"].last_exit.as_deref(), Some("code 3"));
    h.ready("a", pid);

    // The second waits the initial backoff (±20 % jitter), in state `backoff`.
    let crashed = Instant::now();
    h.processes.end(pid, exit_code(1));
    tokio::task::yield_now().await;
    assert_eq!(h.ps().await["a"].state, "backoff");
    let pid = h.spawned("a").await;
    let waited = crashed.elapsed();
    assert!((400..=600).contains(&waited.as_millis()), "second restart after {waited:?}");
    h.ready("a", pid);

    // The third waits about twice that.
    let crashed = Instant::now();
    h.processes.end(pid, exit_code(1));
    h.spawned("a").await;
    let waited = crashed.elapsed();
    assert!((800..=1200).contains(&waited.as_millis()), "third restart after {waited:?}");
    assert_eq!(h.ps().await["a"].restarts, 3);
}

#[tokio::test(start_paused = true)]
async fn past_its_restart_intensity_an_agent_fails_and_escalate_stops_the_swarm() {
    let supervision =
        "  max_restarts: 2\n  max_seconds: 60\n  backoff_initial_ms: 100\n  escalate: true";
    let mut h = harness(&["a"], supervision).await;
    let mut pid = h.start_all(&["a"]).await[0];
    for _ in 0..2 {
        h.processes.end(pid, exit_code(1));
        pid = h.spawned("a").await;
        h.ready("a", pid);
    }
    assert!(h.shutdown.try_recv().is_err(), "two restarts are within the limit");
    h.processes.end(pid, exit_code(1));
    let reason = tokio::time::timeout(Duration::from_secs(60), h.shutdown.recv())
        .await
        .expect("escalated")
        .expect("open");
    assert!(
        matches!(&reason, StopReason::Escalated(why) if why.contains("agent a exceeded")),
        "{reason:?}"
    );
    let ps = h.ps().await;
    assert_eq!((ps["a"].state.as_str(), ps["a"].pid), ("failed", None));
    // Not restarted: nothing more is spawned.
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert!(h.calls.try_recv().is_err(), "a failed agent stays down");
}

#[tokio::test(start_paused = true)]
async fn one_for_all_stops_the_others_then_restarts_everyone_in_order() {
    let mut h = harness(&["a", "b", "c"], "  strategy: one_for_all").await;
    let pids = h.start_all(&["a", "b", "c"]).await;

    h.processes.end(pids[1], exit_code(1));
    // The survivors are asked to shut down, last started first.
    assert_eq!(h.next_call().await, Call::RouterStop("c".into()));
    assert_eq!(h.next_call().await, Call::RouterStop("a".into()));
    // They do not answer the Shutdown frame: SIGTERM after the grace period ends them.
    let mut termed = vec![h.next_call().await, h.next_call().await];
    termed.sort_by_key(|c| format!("{c:?}"));
    assert_eq!(
        termed,
        vec![
            Call::Signal { pid: pids[0], signal: Signal::SIGTERM },
            Call::Signal { pid: pids[2], signal: Signal::SIGTERM },
        ]
    );
    // Then all three start again in the swarm file's order, each once the one before is ready.
    for a in ["a", "b", "c"] {
        let pid = h.spawned(a).await;
        h.ready(a, pid);
    }
    let ps = h.ps().await;
    assert!(ps.values().all(|c| c.state == "ready" && c.restarts == 1), "{ps:?}");
}

#[tokio::test(start_paused = true)]
async fn rest_for_one_restarts_the_crashed_agent_and_those_started_after_it_only() {
    let mut h = harness(&["a", "b", "c"], "  strategy: rest_for_one").await;
    let pids = h.start_all(&["a", "b", "c"]).await;
    h.processes.end(pids[1], exit_code(1));
    assert_eq!(h.next_call().await, Call::RouterStop("c".into()));
    assert_eq!(h.next_call().await, Call::Signal { pid: pids[2], signal: Signal::SIGTERM });
    for a in ["b", "c"] {
        let pid = h.spawned(a).await;
        h.ready(a, pid);
    }
    let ps = h.ps().await;
    assert_eq!((ps["a"].pid, ps["a"].restarts), (Some(pids[0]), 0), "a is left alone");
    assert_eq!((ps["b"].restarts, ps["c"].restarts), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_stop_goes_from_shutdown_to_sigterm_to_sigkill_on_a_process_that_will_not_die() {
    let mut h = harness(&["a"], "").await;
    let pid = h.start_all(&["a"]).await[0];
    h.processes.fake().stubborn = true;
    let asked = Instant::now();
    let sup = h.sup.clone();
    let stop = tokio::spawn(async move {
        sup.call(|reply| ChildMsg::Stop { name: "a".into(), reply }, None).await
    });
    assert_eq!(h.next_call().await, Call::RouterStop("a".into()));
    assert_eq!(h.next_call().await, Call::Signal { pid, signal: Signal::SIGTERM });
    // The grace before SIGTERM is min(2 s, stop_timeout); SIGKILL follows stop_timeout later.
    assert_eq!(asked.elapsed().as_secs(), 2);
    assert_eq!(h.next_call().await, Call::Signal { pid, signal: Signal::SIGKILL });
    assert_eq!(asked.elapsed().as_secs(), 6);
    let ractor::rpc::CallResult::Success(answer) = stop.await.expect("join").expect("call") else {
        panic!("the stop was not answered");
    };
    let answer = answer.expect("stopped");
    assert_eq!(answer, "a stopped (signal SIGKILL)");
    let ps = h.ps().await;
    assert_eq!((ps["a"].state.as_str(), ps["a"].restarts), ("stopped", 0), "not restarted");
}

#[tokio::test(start_paused = true)]
async fn an_agent_that_never_says_hello_is_killed_at_its_ready_timeout_and_restarted() {
    let mut h = harness(&["a"], "").await;
    let (tx, _rx) = oneshot::channel();
    h.sup.cast(ChildMsg::StartAll(tx.into())).expect("cast");
    let spawned = Instant::now();
    let pid = h.spawned("a").await;
    assert_eq!(h.next_call().await, Call::Signal { pid, signal: Signal::SIGKILL });
    assert_eq!(spawned.elapsed().as_secs(), 5, "ready_timeout_secs");
    let pid = h.spawned("a").await;
    let ps = h.ps().await;
    assert_eq!(
        ps["a"].last_exit.as_deref(),
        Some("killed: no Hello within 5 s (ready_timeout_secs)")
    );
    // A stale timer of the first process does not touch the second.
    h.ready("a", pid);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(h.ps().await["a"].state, "ready");
}

#[tokio::test(start_paused = true)]
async fn an_agent_silent_past_its_heartbeat_misses_is_killed_and_restarted() {
    let mut h = harness(&["a", "b"], "").await;
    let pids = h.start_all(&["a", "b"]).await;
    // b keeps beating; a's last sign of life is ten seconds ago (3 × 1 s are allowed).
    h.liveness["a"].store(crate::unix_ms() - 10_000, Ordering::Relaxed);
    h.liveness["b"].store(u64::MAX, Ordering::Relaxed);
    assert_eq!(h.next_call().await, Call::Signal { pid: pids[0], signal: Signal::SIGKILL });
    let pid = h.spawned("a").await;
    let ps = h.ps().await;
    let why = ps["a"].last_exit.clone().unwrap_or_default();
    assert!(why.starts_with("killed: no heartbeat for "), "{why}");
    assert_eq!((ps["b"].pid, ps["b"].restarts), (Some(pids[1]), 0));
    h.ready("a", pid);
}

#[tokio::test(start_paused = true)]
async fn parallel_starts_keep_file_order_and_at_most_n_starting_at_once() {
    let mut h = harness(&["a", "b", "c", "d"], "  parallel: 2").await;
    let (tx, mut started) = oneshot::channel();
    h.sup.cast(ChildMsg::StartAll(tx.into())).expect("cast");
    // Two start at once, in file order; the third waits for one of them to be ready.
    let a = h.spawned("a").await;
    let b = h.spawned("b").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.calls.try_recv().is_err(), "no third start while two are starting");
    h.ready("b", b);
    let c = h.spawned("c").await;
    h.ready("a", a);
    let d = h.spawned("d").await;
    h.ready("c", c);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(started.try_recv().is_err(), "StartAll answers only once every agent is ready");
    h.ready("d", d);
    started.await.expect("StartAll answers once all are ready");
    let ps = h.ps().await;
    assert!(ps.values().all(|c| c.state == "ready"), "{ps:?}");

    // `down` stops two at a time, last started first.
    let (tx, mut stopped) = oneshot::channel();
    h.sup.cast(ChildMsg::StopAll(tx.into())).expect("cast");
    assert_eq!(h.next_call().await, Call::RouterStop("d".into()));
    assert_eq!(h.next_call().await, Call::RouterStop("c".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(h.calls.try_recv().is_err(), "no third stop while two are stopping");
    h.processes.end(c, exit_code(0));
    assert_eq!(h.next_call().await, Call::RouterStop("b".into()));
    for pid in [d, b] {
        h.processes.end(pid, exit_code(0));
    }
    assert_eq!(h.next_call().await, Call::RouterStop("a".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(stopped.try_recv().is_err(), "StopAll answers only once every agent is gone");
    h.processes.end(a, exit_code(0));
    stopped.await.expect("StopAll answers once all are stopped");
    let ps = h.ps().await;
    assert!(ps.values().all(|c| c.state == "stopped" && c.pid.is_none()), "{ps:?}");
}
