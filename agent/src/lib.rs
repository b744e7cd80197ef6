//! `flock-agent`: one agent as one OS process. It connects to the router with the identity the
//! supervisor gave it, then runs one turn at a time from what the router delivers, heartbeating
//! all along. It holds no API keys and talks to nobody but the router.
//!
//! Delivery contract (docs/semantics.md): a durable delivery is `Ack`ed only after its turn has
//! finished; a redelivered id this process already completed is acked again without a new turn.

pub mod client;
mod commands;
mod data;
pub mod extensions;
pub mod gateway;
pub mod memory;
pub mod output;
pub mod prompts;
pub mod provider;
pub mod tools;
pub mod turn;
pub mod workflow;
pub mod workspace;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use flock_config::{AgentSpec, ModelSpec};
use flock_ipc::id::fmt_id;
use flock_ipc::{Body, Connection, DeliveryKind, Frame, Hello, MsgId, PROTOCOL_VERSION, ROUTER};
use tokio::sync::{Notify, mpsc};
use tracing::Instrument;

use crate::client::RouterClient;
use crate::extensions::Pipeline;
use crate::gateway::GatewayProvider;
use crate::provider::{ChatMessage, LlmProvider, LlmStep, ScriptedProvider, ToolDef};

/// Steps (model calls) a turn may take before it is ended (DESIGN.md §7).
pub const MAX_STEPS: usize = 24;
use flock_config::SESSION_WINDOW;
/// Delivery ids remembered (completed turns, early cancels): at most this many of each.
const REMEMBERED_IDS: usize = 4096;

/// The last [`REMEMBERED_IDS`] delivery ids of some kind, looked up in O(1).
#[derive(Default)]
struct RecentIds {
    set: HashSet<MsgId>,
    order: VecDeque<MsgId>,
}

impl RecentIds {
    fn insert(&mut self, id: MsgId) {
        if self.set.insert(id) {
            self.order.push_back(id);
        }
        if self.order.len() > REMEMBERED_IDS
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
    }

    fn contains(&self, id: MsgId) -> bool {
        self.set.contains(&id)
    }

    /// Forgets `id`; whether it was there.
    fn take(&mut self, id: MsgId) -> bool {
        let found = self.set.remove(&id);
        if found {
            self.order.retain(|o| *o != id);
        }
        found
    }
}

/// What the supervisor put in the environment.
#[derive(Debug, Clone)]
pub struct AgentEnv {
    pub socket: PathBuf,
    pub agent: String,
    pub instance: String,
    pub token: String,
    /// The swarm's memory folder (`FLOCK_MEMORY_DIR`), if the supervisor set one.
    pub memory_dir: Option<PathBuf>,
}

impl AgentEnv {
    pub fn from_env() -> Result<Self> {
        // The swarm's own masking rules, if any (before anything could be written).
        if let Ok(json) = std::env::var(flock_memory::mask::RULES_ENV) {
            let rules: Vec<flock_config::MaskRule> =
                serde_json::from_str(&json).with_context(|| {
                    format!("{} is not a list of rules", flock_memory::mask::RULES_ENV)
                })?;
            let pairs: Vec<(String, String)> =
                rules.into_iter().map(|r| (r.name, r.pattern)).collect();
            flock_memory::mask::set_extra_rules(&pairs).map_err(anyhow::Error::msg)?;
        }
        // The token comes over the socket the supervisor left us, never the environment.
        let mut secrets =
            flock_ipc::handoff::receive().context("read the secrets the supervisor handed over")?;
        let get = |k: &str| {
            std::env::var(k).with_context(|| {
                format!("{k} is not set: flock-agent is started by flock-supervisor, not by hand")
            })
        };
        Ok(AgentEnv {
            socket: PathBuf::from(get(flock_ipc::env::SOCKET)?),
            agent: get(flock_ipc::env::AGENT)?,
            instance: get(flock_ipc::env::INSTANCE)?,
            token: secrets.remove(flock_ipc::env::TOKEN).with_context(|| {
                format!(
                    "no {} was handed over: flock-agent is started by flock-supervisor, not by hand",
                    flock_ipc::env::TOKEN
                )
            })?,
            memory_dir: std::env::var_os(flock_ipc::env::MEMORY_DIR)
                .filter(|d| !d.is_empty())
                .map(PathBuf::from),
        })
    }
}

/// Why the agent process ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// The supervisor asked it to (exit code 0).
    Shutdown,
    /// The router connection closed (exit code 1: the supervisor restarts us if it lives).
    Disconnected,
}

/// The turn currently running, so a `Cancel` can reach it, and the cancels that came for a
/// delivery this agent holds but has not started (a delivery window): it is not run.
#[derive(Default)]
struct Current {
    turn: Mutex<Option<(MsgId, Arc<Notify>)>>,
    early: Mutex<RecentIds>,
}

/// Connects, handshakes and serves until shutdown or disconnection.
pub async fn run(env: AgentEnv) -> Result<ExitReason> {
    // The supervisor makes every agent a child subreaper: orphans of what it starts are its own
    // to reap (a command that daemonises, or a fork loop, would otherwise fill the process table).
    flock_sandbox::children::spawn_reaper().context("watch for orphaned children (SIGCHLD)")?;
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: env.agent.clone(),
        instance: env.instance.clone(),
        pid: std::process::id(),
        token: env.token.clone(),
    };
    let conn = Connection::agent(&env.socket, hello, 4096)
        .await
        .with_context(|| format!("connect to the router as {}", env.agent))?;
    let Connection { mut reader, outbox, welcome, writer: _writer } = conn;
    let spec: AgentSpec = serde_json::from_str(&welcome.agent_spec_json)
        .map_err(|e| anyhow!("the supervisor sent a spec this agent cannot read: {e}"))?;
    tracing::info!(
        agent = %spec.name,
        swarm = %welcome.swarm,
        pid = std::process::id(),
        "agent {} connected to swarm `{}` (pid {})",
        spec.name,
        welcome.swarm,
        std::process::id()
    );

    let client = RouterClient::new(spec.name.clone(), outbox.clone());
    let current = Arc::new(Current::default());
    let (deliveries, inbox) = mpsc::unbounded_channel::<Frame>();

    // Heartbeats run on their own task: a long turn never looks like a hang.
    let heartbeat = {
        let client = client.clone();
        let every = Duration::from_millis(welcome.heartbeat_interval_ms.max(10));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                if client.send(Frame::new(&client.name, ROUTER, Body::Heartbeat)).await.is_err() {
                    break;
                }
            }
        })
    };
    let memory = env.memory_dir.clone().map(memory::Memory::new);
    let worker = tokio::spawn(turns(spec, client.clone(), inbox, current.clone(), memory));

    let mut batch = Vec::new();
    let reason = loop {
        match reader.read_batch(&mut batch).await {
            Ok(0) => break ExitReason::Disconnected,
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "router connection failed");
                break ExitReason::Disconnected;
            }
        }
        let mut shutdown = false;
        for frame in batch.drain(..) {
            match &frame.body {
                // Session changes and rewinds travel with the deliveries, so they apply in order.
                Body::Deliver(_) | Body::SessionClosed { .. } | Body::Rewind => {
                    let _ = deliveries.send(frame);
                }
                Body::Cancel { reason } => {
                    let guard = current.turn.lock().unwrap_or_else(|p| p.into_inner());
                    match guard.as_ref() {
                        Some((id, cancel)) if Some(*id) == frame.correlation_id => {
                            tracing::info!(msg_id = %fmt_id(*id), reason = %reason, "turn {} cancelled: {reason}", short(*id));
                            cancel.notify_one();
                        }
                        _ => {
                            if let Some(id) = frame.correlation_id {
                                let mut early =
                                    current.early.lock().unwrap_or_else(|p| p.into_inner());
                                early.insert(id);
                            }
                        }
                    }
                }
                Body::Shutdown => shutdown = true,
                Body::HeartbeatAck => {}
                _ => {
                    if let Some(unclaimed) = client.resolve(frame)
                        && let Body::Error { code, message } = &unclaimed.body
                    {
                        tracing::warn!(code = %code, "router error {code}: {message}");
                    }
                }
            }
        }
        if shutdown {
            // The turn in progress (if any) is abandoned unacked: the router redelivers it to
            // the next incarnation, without counting it as a failed delivery.
            tracing::info!("shutdown requested by the supervisor");
            let _ = outbox.send(Frame::new(&client.name, ROUTER, Body::ShutdownAck)).await;
            break ExitReason::Shutdown;
        }
    };
    heartbeat.abort();
    worker.abort();
    client.fail_all();
    drop(outbox);
    drop(client);
    // Give the writer a moment to flush the last frames (ShutdownAck).
    let _ = tokio::time::timeout(Duration::from_millis(200), _writer).await;
    Ok(reason)
}

fn short(id: MsgId) -> String {
    // The low digits: the high ones are a millisecond timestamp, shared by ids made together.
    fmt_id(id)[20..].to_owned()
}

pub(crate) fn quote(text: &str) -> String {
    format!("{:?}", clip(text, 200))
}

/// The start of `text`, at most `n` characters (an ellipsis marks a cut).
pub(crate) fn clip(text: &str, n: usize) -> String {
    let mut s: String = text.chars().take(n).collect();
    if text.chars().count() > n {
        s.push('…');
    }
    s
}

/// The model of this agent: in-process (scripted) or through the supervisor's gateway.
enum Model {
    Scripted(ScriptedProvider),
    Gateway(GatewayProvider),
}

impl LlmProvider for Model {
    async fn next(
        &mut self,
        conversation: &[ChatMessage],
        tools: &[ToolDef],
        required: bool,
    ) -> Result<LlmStep, String> {
        match self {
            Model::Scripted(p) => p.next(conversation, tools, required).await,
            Model::Gateway(p) => p.next(conversation, tools, required).await,
        }
    }
}

/// The turn loop: one delivery at a time, in arrival order.
async fn turns(
    spec: AgentSpec,
    client: RouterClient,
    mut inbox: mpsc::UnboundedReceiver<Frame>,
    current: Arc<Current>,
    memory: Option<memory::Memory>,
) {
    let mut pipeline = Pipeline::new(&spec, client.clone(), memory);
    // The workspace tools work in the process's working directory (the supervisor sets it to
    // the agent's workspace), held open from the start.
    let workspace = match crate::workspace::Workspace::open(std::path::Path::new(".")) {
        Ok(ws) => Some(ws),
        Err(e) => {
            tracing::warn!(error = %e, "the workspace cannot be opened ({e}); fs_* tools will fail");
            None
        }
    };
    let mut provider = match spec.model.clone() {
        ModelSpec::Scripted(transcript) => Model::Scripted(ScriptedProvider::new(transcript)),
        ModelSpec::OpenAi(_) | ModelSpec::Anthropic(_) | ModelSpec::Local(_) => {
            Model::Gateway(GatewayProvider::new(client.clone(), spec.role))
        }
    };
    let mut completed = RecentIds::default();
    // One conversation per channel (key: channel id; "" for direct messages and requests).
    let mut sessions: HashMap<String, Vec<ChatMessage>> = HashMap::new();
    // After a Nack, until the router's `Rewind`: the deliveries held went back to the mailbox
    // and come again behind the failed one, so these copies are dropped (docs/semantics.md).
    let mut rewinding = false;
    let mut dropped = 0u32;
    while let Some(frame) = inbox.recv().await {
        let delivery = match &frame.body {
            Body::SessionClosed { channel } => {
                sessions.remove(channel);
                tracing::info!(channel = %channel, "session #{channel} closed: the channel was archived");
                continue;
            }
            Body::Rewind => {
                if dropped > 0 {
                    tracing::info!(
                        held = dropped,
                        "{dropped} held deliveries handed back: they come again after the retry"
                    );
                }
                (rewinding, dropped) = (false, 0);
                continue;
            }
            Body::Deliver(_) if rewinding => {
                dropped += 1;
                continue;
            }
            Body::Deliver(delivery) => delivery,
            _ => continue,
        };
        let id = frame.id;
        let cancelled_early = current.early.lock().unwrap_or_else(|p| p.into_inner()).take(id);
        if cancelled_early {
            tracing::info!(msg_id = %fmt_id(id), "turn {} cancelled before it started", short(id));
            let nack = Body::Nack { reason: "cancelled".into() };
            let frame =
                Frame { correlation_id: Some(id), ..Frame::new(&client.name, ROUTER, nack) };
            if client.send(frame).await.is_err() {
                break;
            }
            rewinding = true;
            continue;
        }
        if completed.contains(id) {
            tracing::info!(msg_id = %fmt_id(id), "turn {} already completed: acknowledged again", short(id));
            let ack = Frame {
                correlation_id: Some(id),
                ..Frame::new(&client.name, ROUTER, Body::Ack { reply: None })
            };
            let _ = client.send(ack).await;
            continue;
        }
        let cancel = Arc::new(Notify::new());
        *current.turn.lock().unwrap_or_else(|p| p.into_inner()) = Some((id, cancel.clone()));
        // Everything this turn logs (model calls, tools, extensions) carries these fields.
        let span = tracing::info_span!(
            "turn",
            agent = %spec.name,
            msg_id = %fmt_id(id),
            chain = tracing::field::Empty,
            channel = tracing::field::Empty,
        );
        if let Some(chain) = delivery.chain {
            span.record("chain", tracing::field::display(fmt_id(chain)));
        }
        if let Some(channel) = &delivery.channel {
            span.record("channel", channel.as_str());
        }
        let kind = match delivery.kind {
            DeliveryKind::Message => "message",
            DeliveryKind::Request => "request",
            DeliveryKind::Delta => "channel delta",
            DeliveryKind::Result => "delegated result",
        };
        span.in_scope(|| {
            tracing::info!(
                from = %delivery.sender,
                kind,
                attempt = delivery.attempt,
                "turn {} from {} ({kind}, attempt {}): {}",
                short(id),
                delivery.sender,
                delivery.attempt,
                quote(&delivery.text)
            )
        });
        let started = Instant::now();
        let key = delivery.channel.clone().unwrap_or_default();
        if !sessions.contains_key(&key) {
            // Resume the conversation this channel had before a restart.
            let loaded = load_session(&client, &key).instrument(span.clone()).await;
            if !loaded.is_empty() {
                span.in_scope(|| {
                    tracing::info!(
                        messages = loaded.len(),
                        "session {} resumed with {} messages",
                        session_name(&key),
                        loaded.len()
                    )
                });
            }
            let mut loaded = loaded;
            extensions::resume_point(&mut loaded);
            extensions::window(&mut loaded, SESSION_WINDOW);
            sessions.insert(key.clone(), loaded);
        }
        let session = sessions.entry(key.clone()).or_default();
        let outcome = tokio::select! {
            r = turn::run(&spec, &client, &mut provider, &mut pipeline, workspace.as_ref(), id, delivery, session).instrument(span.clone()) => Some(r),
            _ = cancel.notified() => None,
        };
        *current.turn.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let body = match outcome {
            Some(Ok(turn::Finished { reply, messages: new })) => {
                // The session is saved before the Ack: a turn counts as done once it is stored.
                let messages = serde_json::to_string(&new).unwrap_or_else(|_| "[]".into());
                let save =
                    Frame::new(&client.name, ROUTER, Body::SessionSave { channel: key, messages });
                if client.send(save).await.is_err() {
                    break;
                }
                let ms = started.elapsed().as_millis() as u64;
                span.in_scope(|| {
                    tracing::info!(
                        ms,
                        "turn {} done in {ms} ms: reply {}",
                        short(id),
                        quote(&reply)
                    )
                });
                // The router routes it: a request's reply, or the answer to whoever waits.
                Body::Ack { reply: Some(reply) }
            }
            // The model provider kept failing (the gateway retried already): whoever waits is
            // told in plain words, once, instead of the input being retried into a dead letter.
            Some(Err(e)) if owes_an_answer(delivery) && provider_failed(&e) => {
                span.in_scope(|| {
                    tracing::warn!(error = %e, "turn {} failed: {e}; telling whoever waits", short(id))
                });
                Body::Ack { reply: Some(provider_failure_answer(&spec.name, &e)) }
            }
            Some(Err(e)) => {
                span.in_scope(|| tracing::warn!(error = %e, "turn {} failed: {e}", short(id)));
                Body::Nack { reason: e }
            }
            None => Body::Nack { reason: "cancelled".into() },
        };
        let acked = matches!(body, Body::Ack { .. });
        // at_most_once deliveries are acked too: the router counts the turn.
        let frame = Frame { correlation_id: Some(id), ..Frame::new(&client.name, ROUTER, body) };
        if client.send(frame).await.is_err() {
            break;
        }
        rewinding = !acked;
        if acked && delivery.durable {
            completed.insert(id);
        }
    }
}

/// Whether someone waits for this turn's answer (a person, a delegating agent, a caller).
fn owes_an_answer(delivery: &flock_ipc::Delivery) -> bool {
    delivery.answer_to.is_some() || delivery.kind == DeliveryKind::Request
}

/// Whether a turn failed because the model provider did not answer (after the gateway's own
/// retries) — not because its chain was stopped or its turn cancelled.
fn provider_failed(error: &str) -> bool {
    error.starts_with("model call failed")
        && !error.contains("BUDGET_EXCEEDED")
        && !error.contains("cancelled")
}

/// What whoever waits is told when the model provider keeps failing.
fn provider_failure_answer(agent: &str, error: &str) -> String {
    // A provider's error may quote a key or a token: masked like anything written down.
    let why = flock_memory::mask::mask(error.trim_start_matches("model call failed:").trim());
    let why = clip(&why, 200);
    format!(
        "[failed] I could not get an answer from the model ({why}), so nothing was done for this \
         request. Please try again in a few minutes; if it keeps failing, the operator can see \
         why with `flockctl logs {agent}`."
    )
}

/// The stored session of `channel` (`""`: direct), or an empty one if there is none or the
/// store cannot be reached.
async fn load_session(client: &RouterClient, channel: &str) -> Vec<ChatMessage> {
    let ask = Frame::new(&client.name, ROUTER, Body::SessionLoad { channel: channel.into() });
    match client.call(ask).await {
        Ok(Frame { body: Body::SessionData { messages, .. }, .. }) => {
            serde_json::from_str(&messages).unwrap_or_else(|e| {
                tracing::warn!(
                    "session {} could not be read ({e}); starting fresh",
                    session_name(channel)
                );
                Vec::new()
            })
        }
        _ => Vec::new(),
    }
}

fn session_name(channel: &str) -> String {
    if channel.is_empty() { "(direct)".into() } else { format!("#{channel}") }
}

/// A scripted agent named `w` for unit tests.
#[cfg(test)]
pub(crate) fn test_spec(
    role: flock_config::Role,
    extensions: Vec<flock_config::ExtensionSpec>,
) -> AgentSpec {
    AgentSpec {
        extensions,
        ..AgentSpec::new("w", role, ModelSpec::Scripted(flock_config::Transcript::default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_provider_is_told_in_plain_words_without_a_key_it_quoted() {
        let e = "model call failed: 401: Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwxyz0123";
        assert!(provider_failed(e));
        let told = provider_failure_answer("coordinator", e);
        assert!(told.starts_with("[failed] I could not get an answer from the model"), "{told}");
        assert!(told.contains("flockctl logs coordinator"), "{told}");
        assert!(!told.contains("abcdefghijklmnop"), "the key is masked: {told}");
        // A stopped chain or a cancelled turn is not a provider failure.
        assert!(!provider_failed("model call failed: BUDGET_EXCEEDED: this chain was stopped"));
        assert!(!provider_failed("cancelled"));
    }
}
