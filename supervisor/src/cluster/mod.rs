//! This host's link to the swarm's other hosts (issue #26, docs/cluster.md): two tasks over
//! `flock-cluster`'s JetStream transport.
//!
//! - **Outbox**: messages the router stored for agents on other hosts wait in this host's SQLite
//!   mailbox (the source of truth). The publisher sends them in the order they were accepted —
//!   a host's messages in a row as one stream entry ([`wire`]) — and marks them forwarded once
//!   the stream has stored them. A crash between the two sends them again: the stream keeps an
//!   entry's id once, the receiving store each message's id.
//! - **Inbox**: what other hosts sent here comes in batches (a window of 256 in flight) and is
//!   handed to the router ([`RouterMsg::FromHost`]), which checks that the sending host runs the
//!   sender, stores the message (by id: once) and queues it; only then is the stored prefix
//!   acknowledged to the broker. A message the router refuses is logged and
//!   acknowledged with the rest, never stored; one it could not store (or a router that is
//!   stopping) is left unacknowledged with everything after it, and the broker delivers them
//!   again, in order.
//! - **Status**: every second each host writes its `ps` rows to the broker's key-value bucket
//!   ([`Hosts::publish`]); `flockctl ps` on any host reads the others' ([`Hosts::rows`]) and
//!   shows a host whose status is older than [`LOST_AFTER`] as lost, since the time it last wrote.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use flock_actors::messages::{FromHost, HostAsk, HostReply, OutCall};
use flock_actors::router::CreatedElsewhere;
use flock_actors::{RouterMsg, StoreMsg};
use flock_cluster::{Delivery, HostStatus, Link, Options};
use flock_config::{AgentSpec, SwarmSpec};
use flock_ipc::PsRow;
use flock_ipc::id::{fmt_id, parse_id};
use flock_ipc::{Body, ErrorCode};
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::{Notify, oneshot};

pub(crate) mod takeover;
pub(crate) mod wire;

/// How many stored messages the publisher reads at a time.
const BATCH: usize = 256;
/// Longest wait between two attempts after the broker failed.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long the inbox waits before taking again a message whose sender this host has not
/// learned yet (an agent created at run time on another host).
const LATER: Duration = Duration::from_secs(1);

pub use flock_cluster::Error;

/// Whether `e` says another supervisor took this host over (this one must stop).
pub fn fenced(e: &Error) -> bool {
    matches!(e, Error::Fenced { .. })
}

/// How often a host writes its status.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A host whose last status is older than this is shown as lost (the hosts' clocks are assumed
/// to agree to well within it, as NTP keeps them).
pub const LOST_AFTER: Duration = Duration::from_secs(5);
/// How long `ps` waits for the broker to say how the other hosts are.
const VIEW_TIMEOUT: Duration = Duration::from_secs(2);

/// What a host writes of itself: the `ps` rows of its supervisor, processes, bridges and agents,
/// and the agents created at run time there (the other hosts route to them).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Status {
    rows: Vec<PsRow>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    created: Vec<AgentSpec>,
}

/// The swarm's hosts as this one sees them, for `flockctl ps`.
#[derive(Debug, Clone)]
pub struct Hosts {
    link: Link,
    leader: String,
    /// Every host of the swarm file, the leader first, with the agents placed on it.
    placed: Vec<(String, Vec<(String, String)>)>,
    /// Agents created at run time on other hosts, as the router learned them.
    created: CreatedElsewhere,
    /// The hosts a standby may take over (`cluster.failover`).
    failover: Vec<String>,
    /// This host's `flockctl` drives other hosts' agents (`cluster.operators`).
    operates: bool,
}

impl Hosts {
    pub fn new(link: Link, whole: &SwarmSpec, created: CreatedElsewhere) -> Hosts {
        let placed = whole
            .hosts()
            .into_iter()
            .map(|h| {
                let agents = whole
                    .agents
                    .iter()
                    .filter(|a| whole.host_of(a) == h)
                    .map(|a| (a.key(), a.role.as_str().to_owned()))
                    .collect();
                (h, agents)
            })
            .collect();
        let failover = whole
            .cluster
            .as_ref()
            .map(|c| c.failover.keys().cloned().collect())
            .unwrap_or_default();
        let operates = whole.may_operate(link.host());
        Hosts { link, leader: whole.leader().to_owned(), placed, created, failover, operates }
    }

    /// This host's name.
    pub fn me(&self) -> &str {
        self.link.host()
    }

    /// Whether this host's `flockctl` (and dashboard) drives agents on other hosts.
    pub fn drives_other_hosts(&self) -> bool {
        self.operates
    }

    /// The leader (which holds the channels), when it is another host.
    pub fn leader_elsewhere(&self) -> Option<&str> {
        (self.leader != self.me()).then_some(self.leader.as_str())
    }

    /// The agents placed on other hosts, and their host (those created at run time there
    /// included).
    pub fn elsewhere(&self) -> HashMap<String, String> {
        let mut all: HashMap<String, String> = self
            .placed
            .iter()
            .filter(|(h, _)| h != self.me())
            .flat_map(|(h, agents)| agents.iter().map(|(name, _)| (name.clone(), h.clone())))
            .collect();
        let created = self.created.read().unwrap_or_else(|p| p.into_inner());
        all.extend(created.iter().map(|(n, h)| (n.clone(), h.clone())));
        all
    }

    /// The other hosts of the swarm file.
    pub fn others(&self) -> Vec<String> {
        self.placed.iter().map(|(h, _)| h.clone()).filter(|h| h != self.me()).collect()
    }

    /// Sends what this state dir holds undelivered (`pending`) to where it goes now: another
    /// run took this host over ([`takeover::hand_over`]).
    pub async fn hand_over(
        &self,
        pending: &[flock_actors::store::PendingMessage],
    ) -> (Vec<(flock_ipc::id::MsgId, String)>, Option<Error>) {
        takeover::hand_over(&self.link, &self.elsewhere(), pending).await
    }

    /// The agents placed on other hosts (whose mail waits here until it is forwarded).
    pub fn remote_agents(&self) -> Vec<String> {
        self.elsewhere().into_keys().collect()
    }

    /// Writes this host's rows (those worth showing on another host) as its status;
    /// [`flock_cluster::Error::Fenced`] when another supervisor took this host over.
    pub async fn publish(&self, rows: &[PsRow], created: Vec<AgentSpec>) -> Result<(), Error> {
        let rows = rows
            .iter()
            .filter(|r| matches!(r.kind.as_str(), "supervisor" | "agent" | "process" | "bridge"))
            .cloned()
            .collect();
        let body = serde_json::to_vec(&Status { rows, created }).unwrap_or_default();
        self.link.put_status(&body).await
    }

    /// The agents host `host` says it created at run time (its last authentic status); `None`
    /// when its status cannot be read, carries no valid MAC, or is the empty one a host writes
    /// while it starts (it has not said yet).
    pub async fn created_on(&self, host: &str) -> Option<Vec<AgentSpec>> {
        let read = tokio::time::timeout(VIEW_TIMEOUT, self.link.status_of(host)).await;
        let status = read.ok()?.ok()??;
        if !status.authentic {
            return None;
        }
        let status = serde_json::from_slice::<Status>(&status.body).ok()?;
        (!status.rows.is_empty()).then_some(status.created)
    }

    /// The whole swarm's rows: `local` (this host's, tagged with its name) after this host's row,
    /// then each other host's row and the rows it last wrote. `waiting`: messages stored here for
    /// an agent of another host, not forwarded yet; a host's MAILBOX adds those the broker holds
    /// for it, not acknowledged yet.
    pub async fn rows(&self, local: Vec<PsRow>, waiting: &HashMap<String, u64>) -> Vec<PsRow> {
        let now = flock_ipc::time::unix_ms_now();
        let me = self.me().to_owned();
        let mut rows = Vec::with_capacity(local.len() + 8);
        let supervisor = local.iter().find(|r| r.kind == "supervisor");
        rows.push(PsRow {
            name: me.clone(),
            kind: "host".into(),
            role: self.role_of(&me).into(),
            pid: supervisor.and_then(|r| r.pid),
            state: "up".into(),
            uptime_secs: supervisor.map_or(0, |r| r.uptime_secs),
            rss_bytes: supervisor.and_then(|r| r.rss_bytes),
            host: Some(me.clone()),
            ..Default::default()
        });
        rows.extend(local.into_iter().map(|r| PsRow { host: Some(me.clone()), ..r }));
        let others: Vec<&(String, Vec<(String, String)>)> =
            self.placed.iter().filter(|(h, _)| *h != me).collect();
        let late = || format!("the broker did not answer within {VIEW_TIMEOUT:?}");
        let reads = futures_util::future::join_all(others.iter().map(|(h, _)| async move {
            let (status, queued) = tokio::join!(
                tokio::time::timeout(VIEW_TIMEOUT, self.link.status_of(h)),
                tokio::time::timeout(VIEW_TIMEOUT, self.link.queued_for(h)),
            );
            let status = status.map_err(|_| late()).and_then(|r| r.map_err(|e| e.to_string()));
            (status, queued.ok().and_then(Result::ok).unwrap_or(0))
        }))
        .await;
        let created = self.created.read().unwrap_or_else(|p| p.into_inner()).clone();
        for ((host, placed), (read, queued)) in others.into_iter().zip(reads) {
            // With the agents created at run time there that this host took (and routes to).
            let mut agents = placed.clone();
            agents.extend(
                created.iter().filter(|(_, h)| *h == host).map(|(a, _)| (a.clone(), String::new())),
            );
            let here: u64 = agents.iter().map(|(a, _)| waiting.get(a).copied().unwrap_or(0)).sum();
            rows.extend(host_rows(host, self.role_of(host), &agents, read, here + queued, now));
        }
        // The standbys waiting to take a host over (cluster.failover), this one's included.
        for host in &self.failover {
            let read = tokio::time::timeout(VIEW_TIMEOUT, self.link.standby_of(host)).await;
            if let Ok(Ok(Some(word))) = read
                && let Some(row) = standby_row(host, &word, now)
            {
                let after = rows.iter().rposition(|r| r.host.as_deref() == Some(host));
                rows.insert(after.map_or(rows.len(), |i| i + 1), row);
            }
        }
        rows
    }

    fn role_of(&self, host: &str) -> &'static str {
        if host == self.leader { "leader" } else { "host" }
    }
}

/// The row of host `host`'s standby from what it last wrote (`word`), while it waits: it says
/// so every second, and a word older than [`LOST_AFTER`] (or without the swarm's MAC) is none.
fn standby_row(host: &str, word: &HostStatus, now: u64) -> Option<PsRow> {
    let fresh = now.saturating_sub(word.written_ms) <= LOST_AFTER.as_millis() as u64;
    let said: takeover::StandbyWord = serde_json::from_slice(&word.body).ok()?;
    (word.authentic && fresh).then(|| PsRow {
        name: host.to_owned(),
        kind: "standby".into(),
        role: "standby".into(),
        pid: Some(said.pid),
        state: "waiting".into(),
        uptime_secs: now.saturating_sub(said.since_ms) / 1000,
        last_exit: Some(format!(
            "takes `{host}` over once it has been lost for {} s",
            said.after_secs
        )),
        host: Some(host.to_owned()),
        ..Default::default()
    })
}

/// Host `host`'s row and its agents' rows, from what it last wrote (`read`) at `now`: up while it
/// writes, lost once its status is older than [`LOST_AFTER`] (its agents then unknown), down if it
/// never wrote. Only rows of agents placed on it are shown: a host speaks for its own agents.
fn host_rows(
    host: &str,
    role: &str,
    agents: &[(String, String)],
    read: Result<Option<HostStatus>, String>,
    waiting: u64,
    now: u64,
) -> Vec<PsRow> {
    let mut row = PsRow {
        name: host.to_owned(),
        kind: "host".into(),
        role: role.to_owned(),
        mailbox_depth: waiting,
        host: Some(host.to_owned()),
        ..Default::default()
    };
    let status = match read {
        Ok(Some(s)) if s.authentic => {
            serde_json::from_slice::<Status>(&s.body).map(|st| (st, s.written_ms)).map_err(|e| {
                format!("its status is not one Flock writes ({e}): a host of another version?")
            })
        }
        Ok(Some(_)) => Err("its status carries no valid MAC of the swarm's secret: not written by                             a host of this swarm"
            .to_owned()),
        Ok(None) => {
            row.state = "down".into();
            Err("never started: it has written no status".to_owned())
        }
        Err(e) => Err(format!("cannot read its status: {e}")),
    };
    let (status, written) = match status {
        Ok(s) => s,
        Err(why) => {
            if row.state.is_empty() {
                row.state = "unknown".into();
            }
            row.last_exit = Some(why);
            let mut rows = vec![row];
            rows.extend(agents.iter().map(|(name, role)| PsRow {
                name: name.clone(),
                kind: "agent".into(),
                role: role.clone(),
                state: "unknown".into(),
                host: Some(host.to_owned()),
                ..Default::default()
            }));
            return rows;
        }
    };
    let age = now.saturating_sub(written);
    let lost = age > LOST_AFTER.as_millis() as u64;
    if let Some(sup) = status.rows.iter().find(|r| r.kind == "supervisor") {
        row.pid = sup.pid;
        row.uptime_secs = sup.uptime_secs + if lost { 0 } else { age / 1000 };
        row.rss_bytes = sup.rss_bytes;
    }
    if lost {
        row.state = "lost".into();
        row.last_exit = Some(format!(
            "no status since {} ({} ago)",
            flock_ipc::time::format_timestamp(written),
            crate::live::human_secs(age / 1000)
        ));
    } else {
        row.state = "up".into();
    }
    let mut rows = vec![row];
    for (name, role) in agents {
        let last = status.rows.iter().find(|r| r.kind == "agent" && r.name == *name);
        let mut r = match last {
            Some(r) => r.clone(),
            None => PsRow {
                name: name.clone(),
                kind: "agent".into(),
                role: role.clone(),
                state: "unknown".into(),
                ..Default::default()
            },
        };
        if lost {
            r.last_exit = Some(format!("host lost; last seen {}", r.state));
            r.state = "unknown".into();
        }
        r.host = Some(host.to_owned());
        rows.push(r);
    }
    // Its own processes and bridges (an agent's row is shown only from the list above).
    rows.extend(
        status.rows.into_iter().filter(|r| matches!(r.kind.as_str(), "process" | "bridge")).map(
            |r| PsRow {
                host: Some(host.to_owned()),
                state: if lost { "unknown".into() } else { r.state },
                ..r
            },
        ),
    );
    rows
}

/// Connects this host to the swarm's broker (before anything starts: a swarm across hosts does
/// not start without it), and takes the host's name: a host that runs already (another state
/// dir wrote its status within [`LOST_AFTER`]) is refused.
pub async fn connect(
    spec: &SwarmSpec,
    host: &str,
    secret: Option<flock_llm::Secret>,
    state: &crate::paths::StateDir,
    standby: bool,
) -> Result<Option<Link>> {
    let Some(cluster) = &spec.cluster else { return Ok(None) };
    let options = Options {
        credentials_file: cluster.credentials_file.clone(),
        secret: secret.map(|s| s.expose().as_bytes().to_vec()),
        instance: holder(state)?,
        ..Options::new(&cluster.nats, &spec.name, host)
    };
    let link = Link::connect(&options).await.map_err(|e| anyhow!("cluster: {e}"))?;
    let body = serde_json::to_vec(&Status::default())?;
    // A host that may fail over is taken from another state dir only once lost that long.
    let failover = spec.failover_after(host);
    if standby && failover.is_none() {
        bail!(
            "--standby: the swarm file does not let host `{host}` fail over; add `cluster: {{ \
             failover: {{ {host}: 30 }} }}` (seconds it must have been lost first, at least {})",
            flock_config::MIN_FAILOVER_SECS
        );
    }
    loop {
        if standby && let Some(after) = failover {
            takeover::stand_by(&link, after).await;
        }
        match link.claim(&body, failover.unwrap_or(LOST_AFTER)).await {
            Ok(()) => break,
            // Another run wrote first: stand by again.
            Err(flock_cluster::Error::HostTaken { .. }) if standby => continue,
            // A standby outlives a broker that does not answer for a while.
            Err(e) if standby => {
                tracing::warn!(error = %e, "flock cluster: standby for host `{host}`: cannot take it over yet; trying again");
                tokio::time::sleep(HEARTBEAT).await;
            }
            Err(e @ flock_cluster::Error::HostTaken { .. }) => {
                let handed = if failover.is_some() {
                    hand_over_from(&link, spec, state).await?
                } else {
                    String::new()
                };
                bail!("cluster: {e}{handed}");
            }
            Err(e) => bail!("cluster: {e}"),
        }
    }
    let nats = flock_cluster::redacted(&cluster.nats);
    tracing::info!(host, nats = %nats, "flock: host `{host}` joined swarm `{}` on NATS", spec.name);
    Ok(Some(link))
}

/// What this state dir holds undelivered, handed over to the run that took its host
/// ([`takeover::hand_over`]); says how many went (or why not).
async fn hand_over_from(
    link: &Link,
    spec: &SwarmSpec,
    state: &crate::paths::StateDir,
) -> Result<String> {
    if !state.db().exists() {
        return Ok(String::new());
    }
    let mut store =
        flock_actors::store::Store::open(&state.db(), flock_actors::store::Durability::Normal)
            .with_context(|| format!("open the store {}", state.db().display()))?;
    let pending = store.pending().context("read the mailbox")?;
    if pending.is_empty() {
        return Ok(String::new());
    }
    let elsewhere = spec
        .agents_elsewhere(link.host())
        .iter()
        .map(|a| (a.key(), spec.host_of(a).to_owned()))
        .collect();
    let (sent, failed) = takeover::hand_over(link, &elsewhere, &pending).await;
    store.mark_forwarded(&sent).context("mark the handed-over messages")?;
    Ok(match failed {
        None => format!(
            "; the {} message(s) this state dir held undelivered were handed over to it",
            sent.len()
        ),
        Some(e) => format!(
            "; {} of the {} message(s) this state dir holds undelivered were handed over to it, \
             the rest could not be ({e}): run this again to hand them over",
            sent.len(),
            pending.len()
        ),
    })
}

/// Keeps writing this host's (empty) status while the rest of `up` starts (a slow start would
/// otherwise let the host look lost, and be taken); abort it when the real heartbeat begins.
pub fn hold(link: &Link, lease: Option<Arc<crate::failover::Lease>>) -> tokio::task::AbortHandle {
    let link = link.clone();
    tokio::spawn(async move {
        let body = serde_json::to_vec(&Status::default()).unwrap_or_default();
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            let issued = std::time::Instant::now();
            match link.put_status(&body).await {
                Ok(()) => {
                    if let Some(lease) = &lease {
                        lease.touch(issued);
                    }
                }
                Err(e @ flock_cluster::Error::Fenced { .. }) => {
                    tracing::error!("flock cluster: {e}");
                    return;
                }
                Err(_) => {}
            }
        }
    })
    .abort_handle()
}

/// This state dir's id as a host's holder (made once, kept in `cluster-holder`): runs from the
/// same state dir (one at a time, by its lock) take over from each other at once.
fn holder(state: &crate::paths::StateDir) -> Result<String> {
    let path = state.root.join("cluster-holder");
    if let Ok(id) = std::fs::read_to_string(&path)
        && !id.trim().is_empty()
    {
        return Ok(id.trim().to_owned());
    }
    let id = flock_cluster::instance_id();
    std::fs::write(&path, &id).with_context(|| format!("write {}", path.display()))?;
    Ok(id)
}

/// Starts the outbox publisher and the inbox reader for the router's place `host` among the
/// hosts; they run as long as the process.
pub fn spawn(
    link: Link,
    store: ActorRef<StoreMsg>,
    router: ActorRef<RouterMsg>,
    host: &flock_actors::router::HostLink,
    held: Option<tokio::sync::watch::Receiver<bool>>,
) {
    let (remote, created, wake) = (host.remote.clone(), host.created.clone(), host.outbox.clone());
    tokio::spawn(publish(link.clone(), store, remote, created, wake));
    if let Some(calls) = host.take_calls() {
        tokio::spawn(call_out(link.clone(), router.clone(), calls));
    }
    tokio::spawn(answer_calls(link.clone(), router.clone()));
    tokio::spawn(receive(link, router, held));
}

/// How often a batch of journal lines is offered to the leader before it is dropped (logged).
const JOURNAL_TRIES: u32 = 8;

/// Copies what this host journals to the leader's journal, which holds every host's: batches of
/// up to [`BATCH`] lines, each asked under one id — asked again under the same id after a
/// failure, so the leader takes it once. At most once past [`JOURNAL_TRIES`] (the line stays in
/// this host's own journal).
pub fn copy_journal(link: Link, leader: String, mut lines: UnboundedReceiver<Vec<String>>) {
    tokio::spawn(async move {
        let mut pending: Vec<String> = Vec::new();
        loop {
            if pending.is_empty() {
                match lines.recv().await {
                    Some(l) => pending = l,
                    None => return,
                }
            }
            while pending.len() < BATCH
                && let Ok(more) = lines.try_recv()
            {
                pending.extend(more);
            }
            let batch: Vec<String> = pending.drain(..pending.len().min(BATCH)).collect();
            let count = batch.len();
            let id = fmt_id(flock_ipc::id::new_id());
            let payload =
                serde_json::to_vec(&HostAsk::Journal { lines: batch }).unwrap_or_default();
            let mut wait = Duration::from_millis(100);
            for attempt in 1..=JOURNAL_TRIES {
                match link.call(&leader, &id, payload.clone(), Duration::from_secs(10)).await {
                    Ok(_) => break,
                    Err(e) if attempt == JOURNAL_TRIES => {
                        tracing::warn!(error = %e, "flock cluster: {count} journal line(s) not copied to the leader `{leader}` (they stay in this host's journal)");
                    }
                    Err(_) => {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(MAX_BACKOFF);
                    }
                }
            }
        }
    });
}

/// How much longer than the request's own timeout the link waits for another host's answer
/// (the router times the request out itself; this only ends the wait).
const CALL_GRACE: Duration = Duration::from_secs(2);

/// Sends this host's requests for agents on other hosts, each on its own task, and hands their
/// answers to the router; tells a host when a caller here stopped waiting.
async fn call_out(link: Link, router: ActorRef<RouterMsg>, mut calls: UnboundedReceiver<OutCall>) {
    while let Some(out) = calls.recv().await {
        let link = link.clone();
        let router = router.clone();
        match out {
            OutCall::Request { host, call } => {
                tokio::spawn(async move {
                    let (id, callee) = (call.id, call.to.clone());
                    let timeout = Duration::from_millis(call.timeout_ms) + CALL_GRACE;
                    let ask = HostAsk::Request(call);
                    let who = format!("`{callee}` on host `{host}`");
                    let reply = ask_host(&link, &host, id, &ask, timeout, &who).await;
                    let _ = router.cast(RouterMsg::AnswerFromHost { id, callee, reply });
                });
            }
            OutCall::Ask { host, id, ask, timeout_ms } => {
                tokio::spawn(async move {
                    let timeout = Duration::from_millis(timeout_ms);
                    let who = format!("host `{host}`");
                    let body = ask_host(&link, &host, id, &ask, timeout, &who).await.body;
                    let _ = router.cast(RouterMsg::HostAnswered { id, body });
                });
            }
            OutCall::Cancel { host, id } => {
                tokio::spawn(async move {
                    if let Err(e) = link.cancel(&host, &fmt_id(id)).await {
                        tracing::warn!(error = %e, "flock cluster: could not tell host `{host}` to cancel a request");
                    }
                });
            }
        }
    }
}

/// Asks host `host` (`id`, `ask`) and waits up to `timeout`: its answer (with the tokens a
/// request's chain used there), or why there is none (`who` names whom, in the error).
async fn ask_host(
    link: &Link,
    host: &str,
    id: flock_ipc::MsgId,
    ask: &HostAsk,
    timeout: Duration,
    who: &str,
) -> HostReply {
    let payload = serde_json::to_vec(ask).unwrap_or_default();
    let body = match link.call(host, &fmt_id(id), payload, timeout).await {
        Ok(answer) => match serde_json::from_slice::<HostReply>(&answer) {
            Ok(reply) => return reply,
            Err(e) => Body::Error {
                code: ErrorCode::Internal,
                message: format!("host `{host}` answered in a form this host cannot read: {e}"),
            },
        },
        Err(e) => Body::Error {
            code: ErrorCode::TargetUnavailable,
            message: format!("{who} could not be asked: {e}"),
        },
    };
    HostReply::of(body)
}

/// The router's answer to another host's call, once it comes.
enum Answering {
    Request(oneshot::Receiver<HostReply>),
    Ask(oneshot::Receiver<Body>),
}

/// Takes the requests other hosts send to agents here: each runs like a request made here, and
/// its answer goes back to the host that asked.
async fn answer_calls(link: Link, router: ActorRef<RouterMsg>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut calls = match link.calls().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "flock cluster: cannot take requests from other hosts; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        while let Some(call) = calls.next().await {
            if !call.authentic {
                tracing::warn!(from = %call.from_host, id = %call.id, "flock cluster: refused a request without the swarm's MAC");
                continue;
            }
            let Some(id) = parse_id(&call.id) else { continue };
            if call.cancel {
                let _ = router.cast(RouterMsg::CancelFromHost { host: call.from_host.clone(), id });
                continue;
            }
            let host = call.from_host.clone();
            let (ask, answering) = match serde_json::from_slice::<HostAsk>(&call.payload) {
                Ok(HostAsk::Request(r)) if r.id == id => {
                    let (tx, rx) = oneshot::channel();
                    (RouterMsg::CallFromHost { host, call: r, reply: tx }, Answering::Request(rx))
                }
                Ok(HostAsk::Request(_)) | Err(_) => {
                    tracing::warn!(from = %call.from_host, "flock cluster: refused a call this host cannot read");
                    continue;
                }
                Ok(ask) => {
                    let (tx, rx) = oneshot::channel();
                    (RouterMsg::HostAsked { host, id, ask, reply: tx }, Answering::Ask(rx))
                }
            };
            if router.cast(ask).is_err() {
                return;
            }
            tokio::spawn(async move {
                let reply = match answering {
                    Answering::Request(rx) => rx.await.ok(),
                    Answering::Ask(rx) => rx.await.ok().map(HostReply::of),
                };
                let reply = reply.unwrap_or_else(|| {
                    HostReply::of(Body::Error {
                        code: ErrorCode::Draining,
                        message: "the swarm on that host is shutting down".into(),
                    })
                });
                let payload = serde_json::to_vec(&reply).unwrap_or_default();
                if let Err(e) = call.answer(payload.into()).await {
                    tracing::warn!(error = %e, "flock cluster: could not answer a request");
                }
            });
        }
        tokio::time::sleep(backoff).await;
    }
}

async fn publish(
    link: Link,
    store: ActorRef<StoreMsg>,
    placed: HashMap<String, String>,
    created: CreatedElsewhere,
    wake: Arc<Notify>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        // The swarm file's agents of other hosts, and those created at run time there so far.
        let mut remote = placed.clone();
        remote.extend(created.read().unwrap_or_else(|p| p.into_inner()).clone());
        let wanted: Vec<String> = remote.keys().cloned().collect();
        let batch =
            flock_actors::store_actor::with_store(&store, move |s| s.pending_for(&wanted, BATCH))
                .await;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "flock cluster: cannot read the outbox");
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        if batch.is_empty() {
            // Woken by the router when it stores one; the timer is a safety net.
            let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
            continue;
        }
        let mut sent = Vec::with_capacity(batch.len());
        let mut failed = false;
        // A host's messages in a row go as one stream entry (wire.rs).
        for entry in wire::entries(&batch, |t| remote.get(t).cloned()) {
            let host = &entry.host;
            match link.send_entry(host, &entry.id(), entry.messages.len(), entry.payload()).await {
                Ok(_) => sent.extend(entry.sent()),
                Err(e) => {
                    // Stop here: what follows waits, so order per host holds.
                    tracing::warn!(error = %e, to = %host, "flock cluster: send to host `{host}` failed; retrying");
                    failed = true;
                    break;
                }
            }
        }
        if !sent.is_empty() {
            let mark =
                flock_actors::store_actor::with_store(&store, move |s| s.mark_forwarded(&sent))
                    .await;
            if let Err(e) = mark {
                // Sent again later; the ids keep it once.
                tracing::error!(error = %e, "flock cluster: cannot mark messages forwarded");
            }
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(50);
        }
    }
}

async fn receive(
    link: Link,
    router: ActorRef<RouterMsg>,
    mut held: Option<tokio::sync::watch::Receiver<bool>>,
) {
    let mut backoff = Duration::from_millis(50);
    let mut pause = Duration::ZERO;
    loop {
        // A run whose lease lapsed reads nothing: a standby may hold the host (failover.rs).
        if let Some(held) = &mut held
            && held.wait_for(|h| *h).await.is_err()
        {
            return;
        }
        let mut inbox = match link.inbox().await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "flock cluster: cannot open this host's inbox; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        loop {
            let lapsed = async {
                match &mut held {
                    Some(h) => drop(h.wait_for(|h| !*h).await),
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                next = inbox.next_batch(BATCH) => next,
                // Closed, unacknowledged: what it held comes first to whoever opens it next.
                () = lapsed => break,
            };
            let Some(next) = next else { break };
            let batch = match next {
                Ok(b) => b,
                // Opened again, afresh: what the broker holds comes in order from the oldest.
                Err(e) => {
                    tracing::warn!(error = %e, "flock cluster: inbox; opening it again");
                    break;
                }
            };
            match hand_over(&router, &batch, link.host()).await {
                Handed::All => {}
                // Stopping, or a message that could not be stored: what follows the stored
                // prefix stays unacknowledged and comes again, in order, after `ack_wait`.
                Handed::Stopping => return,
                Handed::Failed => break,
                Handed::Later => {
                    pause = LATER;
                    break;
                }
            }
        }
        tokio::time::sleep(std::mem::take(&mut pause).max(backoff)).await;
    }
}

enum Handed {
    All,
    Stopping,
    Failed,
    /// A message whose sender this host has not learned yet: asked again a little later.
    Later,
}

/// Hands a batch to the router (the store commits it together), then acknowledges the longest
/// prefix of it that is stored or refused.
async fn hand_over(router: &ActorRef<RouterMsg>, batch: &[Delivery], me: &str) -> Handed {
    // Per delivery (a stream entry: one or more messages), the router's answer for each.
    let mut waits: Vec<Vec<oneshot::Receiver<FromHost>>> = Vec::with_capacity(batch.len());
    let mut gone = false;
    'entries: for d in batch {
        let messages = match wire::decode(d, me) {
            Ok(m) => m,
            Err(why) => {
                refused(d, &why);
                waits.push(Vec::new());
                continue;
            }
        };
        let mut answers = Vec::with_capacity(messages.len());
        for msg in messages {
            let (tx, rx) = oneshot::channel();
            let ask = RouterMsg::FromHost { host: d.from_host.clone(), msg, reply: tx };
            if router.cast(ask).is_err() {
                gone = true;
                break 'entries;
            }
            answers.push(rx);
        }
        waits.push(answers);
    }
    let mut handled = 0;
    let mut outcome = Handed::All;
    'handled: for (d, answers) in batch.iter().zip(waits) {
        for rx in answers {
            match rx.await {
                Ok(FromHost::Stored) => {}
                Ok(FromHost::Refused(why)) => refused(d, &why),
                Ok(FromHost::Failed(why)) => {
                    tracing::error!(from = %d.from_host, msg_id = %d.msg_id, "flock cluster: a message from host `{}` was not stored: {why}; it comes again", d.from_host);
                    outcome = Handed::Failed;
                    break 'handled;
                }
                Ok(FromHost::Later(why)) => {
                    tracing::info!(from = %d.from_host, msg_id = %d.msg_id, "flock cluster: a message from host `{}` waits: {why}", d.from_host);
                    outcome = Handed::Later;
                    break 'handled;
                }
                Err(_) => {
                    outcome = Handed::Stopping;
                    break 'handled;
                }
            }
        }
        handled += 1;
    }
    if gone && matches!(outcome, Handed::All) {
        outcome = Handed::Stopping; // the router is gone
    }
    if let Err(e) = flock_cluster::ack_prefix(&batch[..handled]).await {
        // Delivered again; the store keeps each id once.
        tracing::warn!(error = %e, "flock cluster: acknowledge failed");
    }
    outcome
}

/// A message this host will not take: logged, and acknowledged with the rest (never stored).
fn refused(d: &Delivery, why: &str) {
    tracing::warn!(from = %d.from_host, msg_id = %d.msg_id, "flock cluster: refused a message from host `{}`: {why}", d.from_host);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(rows: Vec<PsRow>, written_ms: u64, authentic: bool) -> Option<HostStatus> {
        let body = serde_json::to_vec(&Status { rows, created: Vec::new() }).unwrap().into();
        Some(HostStatus { host: "gpu".into(), body, authentic, instance: "i".into(), written_ms })
    }

    fn agent(name: &str, state: &str) -> PsRow {
        PsRow { name: name.into(), kind: "agent".into(), state: state.into(), ..Default::default() }
    }

    #[test]
    fn a_host_is_up_while_it_writes_lost_after_and_speaks_only_for_its_own_agents() {
        let placed = [("w".to_owned(), "worker".to_owned())];
        let sup = PsRow {
            kind: "supervisor".into(),
            pid: Some(7),
            uptime_secs: 30,
            ..Default::default()
        };
        // A host's status names an agent it does not run: not shown.
        let rows = vec![sup, agent("w", "ready"), agent("coordinator", "ready")];
        let t0 = 1_800_000_000_000;
        let up = host_rows("gpu", "host", &placed, Ok(status(rows.clone(), t0, true)), 3, t0 + 900);
        let names: Vec<(&str, &str, &str)> = up
            .iter()
            .map(|r| (r.name.as_str(), r.state.as_str(), r.host.as_deref().unwrap()))
            .collect();
        assert_eq!(names, [("gpu", "up", "gpu"), ("w", "ready", "gpu")]);
        assert_eq!((up[0].pid, up[0].mailbox_depth), (Some(7), 3));

        let late = t0 + LOST_AFTER.as_millis() as u64 + 2_000;
        let lost = host_rows("gpu", "host", &placed, Ok(status(rows.clone(), t0, true)), 0, late);
        assert_eq!((lost[0].state.as_str(), lost[1].state.as_str()), ("lost", "unknown"));
        let since = lost[0].last_exit.as_deref().unwrap();
        assert!(since.contains("2027-01-15T08:00:00.000Z") && since.contains("7s ago"), "{since}");
        assert_eq!(lost[1].last_exit.as_deref(), Some("host lost; last seen ready"));

        let never = host_rows("gpu", "host", &placed, Ok(None), 2, t0);
        assert_eq!((never[0].state.as_str(), never[1].state.as_str()), ("down", "unknown"));
        let forged = host_rows("gpu", "host", &placed, Ok(status(rows, t0, false)), 0, t0);
        assert_eq!(forged[0].state, "unknown");
        assert!(forged[0].last_exit.as_deref().unwrap().contains("no valid MAC"));
        assert_eq!(forged[1].state, "unknown");
        let unreachable = host_rows("gpu", "host", &placed, Err("timed out".into()), 0, t0);
        assert!(unreachable[0].last_exit.as_deref().unwrap().contains("timed out"));
    }
}
