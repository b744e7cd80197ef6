//! The turn pipeline (DESIGN.md §7): built-in extensions, in the order the agent's spec lists
//! them, hooked at `turn.pre`, `step.pre`, `tool_call.pre`, `tool_call.post` and `turn.post`.
//! `*.pre` hooks run in list order and `*.post` hooks in reverse, like middleware unwinding.
//!
//! What is guaranteed here in code, not asked of a prompt: the session window and compaction
//! (the turn's input is never compacted: it is not in the session yet), the unconscious lookup
//! failing open on its timeout, the turn summary reaching the observer, the observer's files and
//! the size trigger of reflection (its own chain), reflection marking what it read, dream's knowledge
//! files, and the idle timer that fires with no turn at all.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use flock_config::{AgentSpec, ExtensionSpec, Role};
use flock_ipc::MsgId;
use flock_ipc::time::{format_timestamp, unix_ms_now};
use tokio::sync::Notify;

use crate::client::RouterClient;
use crate::memory::Memory;
use crate::output::ToolOutput;
use crate::provider::{ChatMessage, ToolCall};
use crate::tools;

mod reflection;
mod session;

use reflection::*;
pub use reflection::{degenerate, fit_reflection};
pub(crate) use session::chars_of;
use session::*;
pub use session::{compact, resume_point, window};

/// Tag of the system message compaction leaves in place of what it summarised.
pub const SUMMARY_TAG: &str = "[conversation_summary]";
/// Tool-call indexes the pipeline uses for its own sends (ids derived from the turn's id, so a
/// replayed turn re-sends the same ids and the router drops the duplicates).
const OBSERVER_SEND: u32 = u32::MAX - 1;
const REFLECT_SEND: u32 = u32::MAX - 2;
/// The call index of a worker turn's journal line (`memory__journal`).
const JOURNAL_WRITE: u32 = u32::MAX - 3;
/// The call index of a memory role's write (`memory__observe`, `memory__reflect`, `memory__dream`).
const MEMORY_WRITE: u32 = u32::MAX - 4;
/// `[output]` of a turn summary is cut to this many characters (seeds/004).
const SUMMARY_OUTPUT_CHARS: usize = 500;

/// The turn being run, as extensions see it.
#[derive(Debug, Clone)]
pub struct TurnInput<'a> {
    pub id: MsgId,
    pub from: &'a str,
    pub text: &'a str,
    /// The input is a delegated agent's result (its work was already remembered and observed
    /// in that agent's own turn).
    pub result: bool,
}

/// What `turn.pre` produced.
#[derive(Debug, Default)]
pub struct TurnPre {
    /// System messages placed after the prompt, before the session and the input.
    pub context: Vec<String>,
    /// Messages to store ahead of the turn's own (a compaction summary and what it kept), so a
    /// restarted agent resumes from the same compacted session.
    pub persist_first: Vec<ChatMessage>,
    /// The turn's answer, found without the model (the unconscious's recall): no model call.
    pub reply: Option<String>,
}

enum Ext {
    Window { max: usize },
    Compaction { max_messages: usize, max_chars: usize, keep: usize },
    ContextInjector,
    DateHelper,
    Idle { activity: Arc<AtomicU64>, wake: Arc<Notify>, task: tokio::task::JoinHandle<()> },
    Lifecycle { unconscious: Option<String>, observer: Option<String>, timeout: Duration },
    Memory { trigger: Trigger, reflection: Option<String>, reflecting: Reflecting },
    Journal { last: usize },
}

/// What the reflection agent is reflecting on in this turn.
#[derive(Debug, Default)]
struct Reflecting {
    /// The unreflected observations it was given, marked reflected once a reflection is written
    /// (a `[high]` one only if the reflection carries it), and what they say.
    ids: Vec<String>,
    observed: Vec<Observed>,
    /// Their characters, and the length the reflection is asked to keep within.
    chars: usize,
    budget: usize,
    /// The first answer, when it was sent back to be rewritten (the shorter usable one is kept).
    draft: Option<String>,
    /// Unreflected observations left for a later batch (a backlog larger than one reflection
    /// reads): once this one is written, reflection tells itself the rest is due.
    rest: usize,
}

impl Drop for Ext {
    fn drop(&mut self) {
        if let Ext::Idle { task, .. } = self {
            task.abort();
        }
    }
}

impl Ext {
    fn name(&self) -> &'static str {
        match self {
            Ext::Window { .. } => "message_window",
            Ext::Compaction { .. } => "message_compaction",
            Ext::ContextInjector => "context_injector",
            Ext::DateHelper => "date_helper",
            Ext::Journal { .. } => "journal_context",
            Ext::Idle { .. } => "idle_monitor",
            Ext::Lifecycle { .. } => "worker_lifecycle",
            Ext::Memory { .. } => "memory_files",
        }
    }
}

/// The pipeline of one agent.
pub struct Pipeline {
    exts: Vec<Ext>,
    /// The agents the extensions talk to.
    peers: Vec<String>,
    role: Role,
    client: RouterClient,
    memory: Option<Memory>,
    /// Hooks run in the current turn, as `point:extension` (for logs and tests).
    pub trace: Vec<String>,
    /// Tools called in the current turn (`[tools]` of the observer's summary).
    tools_used: Vec<String>,
}

impl Pipeline {
    /// Builds the pipeline of `spec` (the idle timer starts now). `memory`: the swarm's memory
    /// folder, if the supervisor named one.
    pub fn new(spec: &AgentSpec, client: RouterClient, memory: Option<Memory>) -> Pipeline {
        let exts = spec
            .extensions
            .iter()
            .map(|e| match e.clone() {
                ExtensionSpec::MessageWindow { max } => Ext::Window { max },
                ExtensionSpec::MessageCompaction { max_messages, max_chars, keep } => {
                    Ext::Compaction { max_messages, max_chars, keep }
                }
                ExtensionSpec::ContextInjector => Ext::ContextInjector,
                ExtensionSpec::DateHelper => Ext::DateHelper,
                ExtensionSpec::JournalContext { last } => Ext::Journal { last },
                ExtensionSpec::IdleMonitor { after_secs, notify } => {
                    let activity = Arc::new(AtomicU64::new(0));
                    let wake = Arc::new(Notify::new());
                    let c = client.clone();
                    let after = Duration::from_secs(after_secs);
                    let task = tokio::spawn(idle_timer(after, activity.clone(), wake.clone(), {
                        move |idle: Duration| {
                            let (c, notify) = (c.clone(), notify.clone());
                            tokio::spawn(async move {
                                let text = format!(
                                    "[idle_detected] idle_duration={} min, last_activity={}",
                                    idle.as_secs() / 60,
                                    format_timestamp(
                                        unix_ms_now().saturating_sub(idle.as_millis() as u64)
                                    )
                                );
                                for to in notify {
                                    let args = serde_json::json!({"to": to, "text": text});
                                    let id = flock_ipc::id::new_id();
                                    let out = tools::execute(
                                        &c,
                                        id,
                                        0,
                                        "agents__send",
                                        &args.to_string(),
                                    )
                                    .await;
                                    tracing::info!(
                                        "idle_monitor: told {to} [idle_detected]: {}",
                                        out.content
                                    );
                                }
                            });
                        }
                    }));
                    Ext::Idle { activity, wake, task }
                }
                ExtensionSpec::WorkerLifecycle { unconscious, observer, timeout_ms } => {
                    Ext::Lifecycle {
                        unconscious,
                        observer,
                        timeout: Duration::from_millis(timeout_ms),
                    }
                }
                ExtensionSpec::MemoryFiles { reflect_after, reflect_tokens, reflection } => {
                    Ext::Memory {
                        trigger: Trigger::new(reflect_after, reflect_tokens),
                        reflection,
                        reflecting: Reflecting::default(),
                    }
                }
            })
            .collect();
        Pipeline {
            exts,
            peers: spec.extensions.iter().flat_map(ExtensionSpec::peers).collect(),
            role: spec.role,
            client,
            memory,
            trace: Vec::new(),
            tools_used: Vec::new(),
        }
    }

    /// Agents the pipeline talks to on its own: the prompt's catalog leaves them out and the
    /// model cannot address them (a worker does not know its unconscious and observer exist; a
    /// coordinator does not hand a request to dream).
    pub fn hidden_peers(&self) -> Vec<String> {
        self.peers.clone()
    }

    /// Whether `context_injector` is on (the prompt then carries `[runtime_catalog]`).
    pub fn injects_catalog(&self) -> bool {
        self.exts.iter().any(|e| matches!(e, Ext::ContextInjector))
    }

    /// `turn.pre`, in list order: shapes the session and gathers context for the turn.
    pub async fn turn_pre(
        &mut self,
        turn: &TurnInput<'_>,
        session: &mut Vec<ChatMessage>,
    ) -> TurnPre {
        self.trace.clear();
        self.tools_used.clear();
        let mut pre = TurnPre::default();
        for i in 0..self.exts.len() {
            self.trace.push(format!("turn.pre:{}", self.exts[i].name()));
            match &mut self.exts[i] {
                Ext::Window { max } => window(session, *max),
                Ext::Compaction { max_messages, max_chars, keep } => {
                    if let Some(n) = compact(session, *max_messages, *max_chars, *keep) {
                        tracing::info!("message_compaction: {n} messages summarised");
                        pre.persist_first = session.clone();
                    }
                }
                // The catalog itself is rendered into the system prompt (prompts.rs).
                Ext::ContextInjector => {}
                Ext::DateHelper => {}
                Ext::Journal { last } => {
                    let args = serde_json::json!({"last": *last});
                    let out = crate::output::forward(&self.client, "journal__recent", &args).await;
                    if out.ok && !out.content.trim().is_empty() {
                        pre.context.push(format!("[journal]\n{}", out.content));
                    }
                }
                Ext::Idle { activity, wake, .. } => {
                    activity.store(unix_ms_now(), Ordering::Relaxed);
                    wake.notify_one();
                }
                Ext::Lifecycle { unconscious: Some(to), timeout, .. } if !turn.result => {
                    let (to, timeout) = (to.clone(), *timeout);
                    if let Some(active) = self.active_memory() {
                        pre.context.push(format!("[active_memory]\n{active}"));
                    }
                    if let Some(ctx) = self.ask_unconscious(&to, turn, timeout).await {
                        tracing::info!(
                            "worker_lifecycle: [unconscious_context] {}",
                            clip(&ctx.replace('\n', " "), 300)
                        );
                        pre.context.push(format!("[unconscious_context]\n{ctx}"));
                    }
                }
                Ext::Lifecycle { .. } => {}
                Ext::Memory { .. } if self.role == Role::Unconscious => {
                    pre.reply = Some(recall(&self.client, turn.text).await);
                }
                Ext::Memory { reflecting, .. } => {
                    if let Some(c) = memory_context(self.role, self.memory.as_ref(), reflecting) {
                        pre.context.push(c);
                    }
                }
            }
        }
        pre
    }

    /// `step.pre`, before each model call (none of the built-ins changes the conversation here:
    /// `date_helper` dates the prompt and each input instead, see [`Pipeline::wants_time`]).
    pub fn step_pre(&mut self, _step: usize, _conversation: &mut [ChatMessage]) {
        for e in &self.exts {
            self.trace.push(format!("step.pre:{}", e.name()));
        }
    }

    /// Whether `date_helper` is on: the prompt says today's date and each input its time.
    pub fn wants_time(&self) -> bool {
        self.exts.iter().any(|e| matches!(e, Ext::DateHelper))
    }

    /// `tool_call.pre`: may answer a call itself (none of the built-ins refuses one today).
    pub fn tool_call_pre(&mut self, call: &ToolCall) -> Option<ToolOutput> {
        for e in &self.exts {
            self.trace.push(format!("tool_call.pre:{}", e.name()));
        }
        self.tools_used.push(call.name.clone());
        None
    }

    /// `tool_call.post`, in reverse order.
    pub fn tool_call_post(&mut self, _call: &ToolCall, _out: &ToolOutput) {
        for e in self.exts.iter().rev() {
            self.trace.push(format!("tool_call.post:{}", e.name()));
        }
    }

    /// `turn.answer`, on a final answer before it is taken: the note that sends it back to the
    /// model once, if an extension wants it rewritten (the turn asks only once). Reflection sends
    /// back a draft that would be refused or is over its length budget, and keeps the draft: of
    /// the two, the shorter one that can be written is written.
    pub fn review_answer(&mut self, answer: &str) -> Option<String> {
        if self.role != Role::Reflection {
            return None;
        }
        for e in &mut self.exts {
            if let Ext::Memory { reflecting, .. } = e
                && !reflecting.ids.is_empty()
                && reflecting.draft.is_none()
            {
                let note = reflection_review(answer, reflecting.budget, &reflecting.observed)?;
                reflecting.draft = Some(answer.to_owned());
                return Some(note);
            }
        }
        None
    }

    /// `turn.post`, in reverse order, after the final answer (`delegated`: the turn handed its
    /// input over instead). Failures are logged, never fail the turn (a memory write must not
    /// cost the user their answer).
    pub async fn turn_post(&mut self, turn: &TurnInput<'_>, reply: &str, delegated: bool) {
        for i in (0..self.exts.len()).rev() {
            self.trace.push(format!("turn.post:{}", self.exts[i].name()));
            match &mut self.exts[i] {
                Ext::Idle { activity, wake, .. } => {
                    activity.store(unix_ms_now(), Ordering::Relaxed);
                    wake.notify_one();
                }
                // Each piece of work is observed once, in the turn that did it: not a hand-over,
                // not the relaying of a delegate's result.
                Ext::Lifecycle { observer, .. } if !turn.result && !delegated => {
                    let observer = observer.clone();
                    self.after_worker_turn(turn, reply, observer.as_deref()).await;
                }
                Ext::Memory { trigger, reflection, reflecting } => {
                    let (trigger, reflection) = (trigger.clone(), reflection.clone());
                    let read = std::mem::take(reflecting);
                    self.write_memory(turn, reply, trigger, reflection.as_deref(), read).await;
                }
                _ => {}
            }
        }
    }

    /// `active_memory.md` without its header (the supervisor keeps it), if there is any.
    fn active_memory(&self) -> Option<String> {
        let path = self.memory.as_ref()?.dir().join("active_memory.md");
        let text = std::fs::read_to_string(path).ok()?;
        let items: Vec<&str> = text.lines().filter(|l| l.starts_with("- ")).collect();
        (!items.is_empty()).then(|| items.join("\n"))
    }

    /// Asks the unconscious for context; `None` on an empty answer, an error or the timeout
    /// (fail open: the turn goes on without it).
    async fn ask_unconscious(
        &self,
        to: &str,
        turn: &TurnInput<'_>,
        timeout: Duration,
    ) -> Option<String> {
        let args = serde_json::json!({
            "to": to,
            "text": turn.text,
            "timeout_ms": timeout.as_millis() as u64,
        })
        .to_string();
        let call = tools::execute(&self.client, turn.id, 0, "agents__request", &args);
        match tokio::time::timeout(timeout + Duration::from_millis(200), call).await {
            Ok(out) if out.ok && !out.content.trim().is_empty() => Some(out.content),
            Ok(out) if out.ok => None,
            Ok(out) => {
                tracing::info!(
                    "worker_lifecycle: {to} did not answer ({}); going on without it",
                    out.content
                );
                None
            }
            Err(_) => {
                tracing::info!(
                    "worker_lifecycle: {to} did not answer within {} ms; going on without it",
                    timeout.as_millis()
                );
                None
            }
        }
    }

    /// The worker's turn.post: the summary to the observer (fire and forget) and its journal.
    async fn after_worker_turn(&self, turn: &TurnInput<'_>, reply: &str, observer: Option<&str>) {
        let tools_line =
            if self.tools_used.is_empty() { "(none)".into() } else { self.tools_used.join(", ") };
        if let Some(to) = observer {
            let output: String = reply.chars().take(SUMMARY_OUTPUT_CHARS).collect();
            let summary = format!(
                "[input] {}\n[tools] {tools_line}\n[output] {output}\n[agent] {}",
                turn.text, self.client.name
            );
            let args = serde_json::json!({"to": to, "text": summary});
            let out = tools::execute(
                &self.client,
                turn.id,
                OBSERVER_SEND,
                "agents__send",
                &args.to_string(),
            )
            .await;
            if !out.ok {
                tracing::info!(
                    "worker_lifecycle: the turn summary did not reach {to}: {}",
                    out.content
                );
            }
        }
        if self.memory.is_some() {
            // Written by the supervisor under this agent's name (memory/ is read-only here).
            let args = serde_json::json!({
                "request": turn.text, "done": format!("tools: {tools_line}"), "result": reply,
            });
            let out = tools::execute(
                &self.client,
                turn.id,
                JOURNAL_WRITE,
                "memory__journal",
                &args.to_string(),
            )
            .await;
            if !out.ok || out.content != "journaled" {
                tracing::info!("worker_lifecycle: journal line: {}", out.content);
            }
        }
    }

    /// The memory agents' turn.post: the observer's observation (and the reflection trigger),
    /// reflection's file and marks, dream's knowledge.
    async fn write_memory(
        &self,
        turn: &TurnInput<'_>,
        reply: &str,
        trigger: Trigger,
        reflection: Option<&str>,
        read: Reflecting,
    ) {
        let Some(m) = &self.memory else {
            tracing::info!("memory_files: no memory folder (FLOCK_MEMORY_DIR); nothing written");
            return;
        };
        // The supervisor writes (memory/ is read-only here), under an id derived from the turn.
        let write = |tool: &'static str, args: serde_json::Value| async move {
            let out =
                tools::execute(&self.client, turn.id, MEMORY_WRITE, tool, &args.to_string()).await;
            if out.ok { Ok(out.content) } else { Err(out.content) }
        };
        let result = match self.role {
            // Selective: "nothing" (or an empty answer) is not an observation.
            Role::Observer if is_nothing(reply) => Ok("nothing worth observing".to_owned()),
            Role::Observer => {
                let (tag, text) = observation_tag(reply);
                let (priority, category) = tag.unzip();
                let args = serde_json::json!({
                    "text": text, "about": turn.from, "priority": priority, "category": category,
                });
                let written = write("memory__observe", args).await;
                // A replayed turn (the observation already there) checks again: its `[reflect]`
                // has the id the first attempt's had, so it is delivered once.
                if let (Ok(_), Some(to)) = (&written, reflection) {
                    // Its own chain: a reflection is upkeep, not part of the request whose
                    // observation crossed the threshold (nor of its budget).
                    self.send_reflect(turn, m, &trigger, to, &trigger.describe()).await;
                }
                written
            }
            // A degenerate reflection is refused: nothing is written and the observations stay
            // unreflected, so the next reflection reads them again.
            Role::Reflection if !read.ids.is_empty() => {
                match settle_reflection(reply, read.draft.as_deref(), &read.observed) {
                    Err(why) => {
                        Ok(format!("reflection refused ({why}); observations kept unreflected"))
                    }
                    Ok((fitted, chosen)) => {
                        let ratio = |text: &str| {
                            read.chars as f64 / text.trim().chars().count().max(1) as f64
                        };
                        let rewritten = match read.draft.as_deref() {
                            Some(d) => match fit_or_refuse(d, &read.observed) {
                                Ok(_) => {
                                    format!("; the first draft {:.1}×, sent back once", ratio(d))
                                }
                                Err(why) => format!("; the first draft {why}, sent back once"),
                            },
                            None => String::new(),
                        };
                        // A [high] observation it does not carry stays unreflected: the next
                        // reflection reads it again.
                        let carried = carried(&fitted, &read.observed);
                        let kept_back = carried.iter().filter(|c| !**c).count();
                        let ids: Vec<&String> = read
                            .ids
                            .iter()
                            .zip(&carried)
                            .filter(|(_, c)| **c)
                            .map(|(id, _)| id)
                            .collect();
                        let high = read.observed.iter().filter(|o| o.high).count();
                        let args = serde_json::json!({"text": fitted, "ids": ids});
                        let written = write("memory__reflect", args).await;
                        let marked = |answer: &str| {
                            serde_json::from_str::<serde_json::Value>(answer)
                                .ok()
                                .and_then(|v| v["marked"].as_u64())
                                .unwrap_or(0)
                        };
                        // A backlog is drained batch after batch, without waiting for the next
                        // observation: each batch that marked something leaves less.
                        if let Ok(answer) = &written
                            && marked(answer) > 0
                            && read.rest > 0
                        {
                            let me = self.client.name.clone();
                            self.send_reflect(turn, m, &trigger, &me, "the rest of a backlog")
                                .await;
                        }
                        written.map(|answer| {
                            let n = marked(&answer);
                            format!(
                                    "reflection written ({:.1}× compression; the model's answer {:.1}× before the cut{rewritten}), {n} observations marked reflected; [high] carried {}/{high}{}",
                                    ratio(&fitted),
                                    ratio(chosen),
                                    high - kept_back,
                                    if kept_back > 0 { format!(" ({kept_back} kept unreflected for the next reflection)") } else { String::new() }
                                )
                            })
                    }
                }
            }
            Role::Dream => write("memory__dream", serde_json::json!({"document": reply})).await,
            _ => return,
        };
        match result {
            Ok(what) => tracing::info!("memory_files: {what}"),
            Err(e) => tracing::info!("memory_files: write failed: {e}"),
        }
    }
}

impl Pipeline {
    /// `[reflect]` to `to` when the unreflected observations are over the threshold and it is
    /// due ([`Trigger::due`]): the observer's after an observation, and reflection's own for what
    /// is left of a backlog once a batch was written (`why` says which). Upkeep: its own chain;
    /// the id derives from the turn, so a replayed turn sends it once.
    async fn send_reflect(
        &self,
        turn: &TurnInput<'_>,
        m: &Memory,
        trigger: &Trigger,
        to: &str,
        why: &str,
    ) {
        let un = match m.unreflected() {
            Ok(un) if trigger.due(&un) => un,
            Ok(_) => return,
            Err(e) => return tracing::info!("memory_files: cannot count observations: {e}"),
        };
        let n = un.len();
        let tokens = estimated_tokens(&un);
        let text = format!("[reflect] {n} unreflected observations (~{tokens} tokens; {why})");
        let out = tools::send_upkeep(&self.client, turn.id, REFLECT_SEND, to, &text).await;
        if out.ok {
            trigger.sent(&un);
        }
        tracing::info!(
            "memory_files: {n} unreflected observations ({why}) → {to}: {}",
            out.content
        );
    }
}

/// When the observer wakes reflection: the unreflected observations are over `tokens`
/// estimated tokens, or `after` entries (if set), and either no `[reflect]` was sent for them
/// yet (the oldest unreflected one is not the one it was then: reflection ran since, or this
/// process is new) or they grew by another threshold since (a refused reflection is tried again
/// with more). So a slow reflection is not sent `[reflect]` per new observation, and a threshold
/// crossed by a write the observer did not make (`memory_remember`) or a send that failed is
/// caught at its next observation.
#[derive(Debug, Clone)]
struct Trigger {
    after: Option<usize>,
    tokens: usize,
    /// When the last `[reflect]` went out: the oldest unreflected id, their tokens and count.
    sent: Arc<std::sync::Mutex<Option<(String, usize, usize)>>>,
}

impl Trigger {
    fn new(after: Option<usize>, tokens: usize) -> Self {
        Trigger { after, tokens: tokens.max(1), sent: Default::default() }
    }

    /// Whether `[reflect]` is due for `un`, the unreflected observations.
    fn due(&self, un: &[crate::memory::Observation]) -> bool {
        let Some(oldest) = un.first() else { return false };
        let (tokens, count) = (estimated_tokens(un), un.len());
        let after = self.after.map(|a| a.max(1));
        if tokens < self.tokens && after.is_none_or(|a| count < a) {
            return false;
        }
        match &*self.sent.lock().unwrap_or_else(|p| p.into_inner()) {
            None => true,
            Some((id, _, _)) if *id != oldest.id => true,
            Some((_, t, c)) => tokens >= t + self.tokens || after.is_some_and(|a| count >= c + a),
        }
    }

    /// `[reflect]` went out for `un`.
    fn sent(&self, un: &[crate::memory::Observation]) {
        if let Some(oldest) = un.first() {
            *self.sent.lock().unwrap_or_else(|p| p.into_inner()) =
                Some((oldest.id.clone(), estimated_tokens(un), un.len()));
        }
    }

    fn describe(&self) -> String {
        match self.after {
            Some(a) => format!("threshold {} tokens or {a} observations", self.tokens),
            None => format!("threshold {} tokens", self.tokens),
        }
    }
}

/// Memories the unconscious answers a worker's input with: the best matches of the swarm's
/// memory index (`memory__search`: BM25 over observations, reflections and knowledge, with
/// priority and recency boosts), one per line, or nothing (then the worker gets no context at
/// all, not a guess).
async fn recall(client: &RouterClient, input: &str) -> String {
    let args = serde_json::json!({
        "query": input,
        "limit": 5,
        "kinds": ["observation", "reflection", "knowledge"],
        // Unasked context for a model: only what clearly matches the input.
        "precise": true,
    });
    let out = crate::output::forward(client, "memory__search", &args).await;
    if !out.ok {
        tracing::info!("memory_files: recall failed: {}", out.content);
        return String::new();
    }
    let hits: Vec<serde_json::Value> = serde_json::from_str::<serde_json::Value>(&out.content)
        .ok()
        .and_then(|v| v["hits"].as_array().cloned())
        .unwrap_or_default();
    if hits.is_empty() {
        tracing::info!("memory_files: nothing in memory about this");
        return String::new();
    }
    tracing::info!("memory_files: recalled {} memories", hits.len());
    let lines: Vec<String> = hits
        .iter()
        .map(|h| {
            let text: String = h["text"].as_str().unwrap_or_default().replace('\n', " ");
            let text: String = text.chars().take(400).collect();
            let when = format!(
                "{} {}",
                h["date"].as_str().unwrap_or(""),
                h["time"].as_str().unwrap_or("")
            );
            format!("- {}: {text}", when.trim())
        })
        .collect();
    lines.join("\n")
}

/// The memory a memory agent reads before its turn: reflection gets the unreflected
/// observations (and remembers their ids, to mark them after), dream a digest.
fn memory_context(
    role: Role,
    memory: Option<&Memory>,
    reflecting: &mut Reflecting,
) -> Option<String> {
    let m = memory?;
    match role {
        Role::Reflection => {
            let mut un = m.unreflected().ok()?;
            if un.is_empty() {
                return None;
            }
            // A backlog (reflection was down, or refused) is taken oldest first, as much as fits
            // a small model's context beside the prompt and the answer; the rest waits.
            let mut tokens = 0;
            let fits = un
                .iter()
                .take_while(|o| {
                    // Its line: `- YYYY-MM-DD HH:MM [high]: ` and the text.
                    tokens += (o.text.chars().count() + 28) / CHARS_PER_TOKEN;
                    tokens <= REFLECTION_BATCH_TOKENS
                })
                .count();
            let total = un.len();
            un.truncate(fits.max(1));
            let of =
                if un.len() < total { format!(" (the oldest of {total})") } else { String::new() };
            // High-priority items are marked and come first (a small model writes about what it
            // read first): the prompt asks to keep each of them.
            let is_high = |o: &&crate::memory::Observation| o.priority.as_deref() == Some("high");
            let list: Vec<String> = un
                .iter()
                .filter(is_high)
                .chain(un.iter().filter(|o| !is_high(o)))
                .map(|o| {
                    let high = if is_high(&o) { " [high]" } else { "" };
                    format!("- {}{high}: {}", o.when, o.text.replace('\n', " "))
                })
                .collect();
            // The length to aim for: a fifth of what was observed (the compression target).
            let chars: usize = un.iter().map(|o| o.text.chars().count()).sum();
            let budget = (chars / REFLECTION_COMPRESSION).max(REFLECTION_MIN_CHARS);
            *reflecting = Reflecting {
                ids: un.iter().map(|o| o.id.clone()).collect(),
                observed: un
                    .iter()
                    .map(|o| Observed {
                        high: o.priority.as_deref() == Some("high"),
                        text: o.text.clone(),
                    })
                    .collect(),
                chars,
                budget,
                draft: None,
                rest: total - un.len(),
            };
            Some(format!(
                "[observations] {} unreflected{of} ({chars} characters; your reflection: at most {budget} characters):\n{}",
                un.len(),
                list.join("\n")
            ))
        }
        Role::Dream => m.digest(8_000).ok().map(|d| format!("[memory]\n{d}")),
        _ => None,
    }
}

/// Fires `on_idle` once per idle period: `after` since the last activity (turn start or end;
/// the process start counts as activity). A real timer: it needs no incoming turn.
async fn idle_timer(
    after: Duration,
    activity: Arc<AtomicU64>,
    wake: Arc<Notify>,
    on_idle: impl Fn(Duration),
) {
    let mut since = tokio::time::Instant::now();
    let mut seen = activity.load(Ordering::Relaxed);
    let mut fired = false;
    loop {
        let deadline = since + after;
        tokio::select! {
            _ = tokio::time::sleep_until(deadline), if !fired => {
                fired = true;
                on_idle(since.elapsed());
            }
            _ = wake.notified() => {}
        }
        let now_seen = activity.load(Ordering::Relaxed);
        if now_seen != seen {
            (seen, since, fired) = (now_seen, tokio::time::Instant::now(), false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(i: usize, len: usize) -> ChatMessage {
        ChatMessage::User { from: "op".into(), text: format!("{i}:{}", "u".repeat(len)), at: None }
    }
    fn assistant(i: usize) -> ChatMessage {
        ChatMessage::Assistant { text: format!("answer {i}") }
    }

    fn spec(extensions: Vec<ExtensionSpec>) -> AgentSpec {
        crate::test_spec(Role::Worker, extensions)
    }

    /// A client whose router is gone: extensions that need none must not care.
    fn offline_client() -> RouterClient {
        let (tx, _rx) = tokio::sync::mpsc::channel(1);
        RouterClient::new("w".into(), tx)
    }

    #[tokio::test]
    async fn pre_hooks_run_in_list_order_and_post_hooks_in_reverse() {
        let exts = vec![
            ExtensionSpec::MessageWindow { max: 80 },
            ExtensionSpec::MessageCompaction { max_messages: 40, max_chars: 12_000, keep: 8 },
            ExtensionSpec::DateHelper,
        ];
        let mut p = Pipeline::new(&spec(exts), offline_client(), None);
        let input = TurnInput { id: 1, from: "op", text: "hi", result: false };
        let mut session = Vec::new();
        p.turn_pre(&input, &mut session).await;
        let mut conv = vec![ChatMessage::System { text: "prompt".into() }];
        p.step_pre(0, &mut conv);
        let call = ToolCall { id: "c".into(), name: "agents__list".into(), arguments: "{}".into() };
        assert!(p.tool_call_pre(&call).is_none());
        p.tool_call_post(&call, &ToolOutput { ok: true, content: "[]".into() });
        p.turn_post(&input, "done", false).await;
        let names = ["message_window", "message_compaction", "date_helper"];
        let mut expected = Vec::new();
        for point in ["turn.pre", "step.pre", "tool_call.pre"] {
            expected.extend(names.iter().map(|n| format!("{point}:{n}")));
        }
        for point in ["tool_call.post", "turn.post"] {
            expected.extend(names.iter().rev().map(|n| format!("{point}:{n}")));
        }
        assert_eq!(p.trace, expected);
        assert!(p.wants_time());
    }

    #[test]
    fn an_observation_tag_gives_priority_and_category() {
        assert_eq!(
            observation_tag("[high decision] Bren chose Postgres."),
            (Some(("high", "decision")), "Bren chose Postgres.")
        );
        assert_eq!(observation_tag("[Low] Bren said hi."), (Some(("low", "")), "Bren said hi."));
        assert_eq!(observation_tag("[input] Bren did x"), (None, "[input] Bren did x"));
        assert_eq!(observation_tag("Bren did x"), (None, "Bren did x"));
    }

    #[test]
    fn degenerate_memory_texts_are_told_apart_from_real_ones() {
        assert_eq!(degenerate("  "), Some("empty"));
        assert_eq!(degenerate("Nothing."), Some("empty"));
        assert_eq!(degenerate(&"Ana likes tea.\n".repeat(6)), Some("the same lines over and over"));
        assert_eq!(degenerate(&"tea tea coffee ".repeat(20)), Some("the same words over and over"));
        let real = "Ana works on the billing service and prefers short answers.\n\
                    She asked twice about the staging database; it runs on port 5433.\n\
                    The team ships on Fridays.";
        assert_eq!(degenerate(real), None);
    }

    #[test]
    fn a_reflection_is_cut_to_the_shape_its_prompt_asks_for() {
        let long = format!("- {}", "the worker restated an observation word for word ".repeat(8));
        let reply = format!(
            "### Patterns\n\n1. **Migration**:\n   - sub item one\n   - sub item two\n\
             2. Backups\n3. Backups\n4. Release notes\n5. Ports\n{long}\n\
             ### Learned rules\n- UTC everywhere\n\
             ### Suggestions\n- a\n- b\n- c\n### Summary\nA week of moving billing to Postgres."
        );
        let fitted = fit_reflection(&reply);
        assert_eq!(
            fitted.as_deref(),
            Some(
                "### Patterns\n1. **Migration**: sub item one; sub item two\n2. Backups\n\
                 3. Backups\n### Learned rules\n- UTC everywhere\n### Suggestions\n- a\n- b\n\
                 ### Summary\nA week of moving billing to Postgres."
            ),
            "sub-items join their item; each heading keeps its number of items"
        );
        // "2. Backups" and "3. Backups" differ (their numbers); the same line twice does not.
        assert_eq!(
            fit_reflection("### Patterns\n- tea\n- Tea.\n- coffee").as_deref(),
            Some("### Patterns\n- tea\n- coffee")
        );
        // Other heading styles are headings too.
        assert_eq!(
            fit_reflection("## Patterns\n- a\n- b\n- c\n- d\n**Summary:**\nDone.").as_deref(),
            Some("### Patterns\n- a\n- b\n- c\n### Summary\nDone.")
        );
        // Nothing but headings is no reflection.
        assert_eq!(fit_reflection("### Patterns\n\n### Summary\n"), None);
        let cut = fit_reflection(&long).expect("one long line");
        assert!(cut.ends_with('…') && cut.chars().count() <= REFLECTION_LINE_CHARS, "{cut}");
        assert!(!cut.ends_with(" …"), "{cut}");
    }

    #[test]
    fn reflection_is_woken_over_a_threshold_once_per_batch_and_again_when_it_grows_by_another() {
        // 40 characters (10 tokens) an observation; `from` is the oldest unreflected one.
        let obs = |from: usize, to: usize| -> Vec<crate::memory::Observation> {
            (from..to)
                .map(|i| crate::memory::Observation {
                    id: format!("o{i}"),
                    when: "2026-11-26 10:00".into(),
                    text: "x".repeat(40),
                    reflected: false,
                    priority: None,
                })
                .collect()
        };
        // The observer's loop: after each new observation, send if due.
        let run = |t: &Trigger, from: usize, to: usize| -> Vec<usize> {
            (from + 1..=to)
                .filter(|&n| {
                    let due = t.due(&obs(from, n));
                    if due {
                        t.sent(&obs(from, n));
                    }
                    due
                })
                .collect()
        };
        // 100 tokens: at the 10th, then not per observation while reflection is slow, again at
        // the 20th (a refused reflection left them all).
        let t = Trigger::new(None, 100);
        assert_eq!(run(&t, 0, 25), [10, 20]);
        // Reflection ran (o0…o24 reflected): the next batch wakes it at its own 10th.
        assert_eq!(run(&t, 25, 40), [35]);
        // A threshold crossed by a write the observer did not make: caught at its next one.
        let t = Trigger::new(None, 100);
        assert!(t.due(&obs(0, 12)), "over, nothing sent yet");
        // A count as well, whichever comes first.
        let t = Trigger::new(Some(3), 100);
        assert_eq!(run(&t, 0, 10), [3, 6, 9]);
        assert!(!Trigger::new(None, 100).due(&[]), "nothing unreflected");
        assert_eq!(t.describe(), "threshold 100 tokens or 3 observations");
    }

    #[test]
    fn reflection_reads_a_backlog_oldest_first_as_much_as_fits_and_marks_high_items() {
        let dir = tempfile::tempdir().unwrap();
        let m = Memory::new(dir.path());
        // 120 observations of 100 characters (32 tokens a line with its date): over one batch.
        for i in 0..120u64 {
            let text = format!("{i:03} {}", "y".repeat(96));
            let tag = if i == 5 { Some(("high", "decision")) } else { None };
            assert!(
                m.append_observation_tagged(i * 60_000, &format!("o{i}"), None, &text, tag)
                    .unwrap()
            );
        }
        let mut r = Reflecting::default();
        let context = memory_context(Role::Reflection, Some(&m), &mut r).expect("a backlog");
        assert_eq!(r.ids.len(), REFLECTION_BATCH_TOKENS / 32, "as much as fits");
        assert_eq!((r.ids[0].as_str(), r.chars), ("o0", r.ids.len() * 100), "oldest first");
        assert_eq!(r.budget, r.chars / REFLECTION_COMPRESSION);
        assert!(
            context.starts_with("[observations] 62 unreflected (the oldest of 120)"),
            "{context}"
        );
        // The [high] item comes first, the others after it in time order.
        let items: Vec<&str> = context.lines().skip(1).collect();
        assert!(items[0].contains(" [high]: 005 "), "{context}");
        assert!(items[1].contains(": 000 ") && items[5].contains(": 004 "), "{context}");
        assert!(items[6].contains(": 006 "), "{context}");
        assert_eq!(context.matches("[high]").count(), 1, "{context}");
    }

    #[test]
    fn a_reflection_over_its_budget_or_unusable_goes_back_once_and_the_shorter_is_kept() {
        let long = "### Patterns\n- Ana moved billing from MySQL to Postgres 16 with a dual-write \
                    phase of thirty days.\n- Backups run nightly with pg_dump and a restore test.\n\
                    ### Summary\nA week of moving billing to Postgres, with backups and UTC.";
        let short = "### Patterns\n- Billing moves to Postgres; nightly backups.\n### Summary\nMigration week.";
        let over = reflection_review(long, 120, &[]).expect("over 120 characters");
        assert!(over.contains("the budget is 120") && over.contains("[high]"), "{over}");
        assert_eq!(reflection_review(short, 120, &[]), None, "within the budget");
        let repeating = "- same\n- same\n- same\n- same\n- same";
        let refused = reflection_review(repeating, 500, &[]).expect("a repeating draft goes back");
        assert!(refused.contains("the same lines over and over"), "{refused}");
        assert!(
            reflection_review("### Patterns\n### Summary", 500, &[]).is_some(),
            "headings only"
        );

        // Of the rewrite and the draft, the one the model wrote shorter (and can be written).
        let written = |reply, draft| settle_reflection(reply, draft, &[]).map(|(fitted, _)| fitted);
        assert_eq!(written(short, Some(long)).as_deref(), Ok(short));
        assert_eq!(written(long, Some(short)).as_deref(), Ok(short));
        assert_eq!(written(repeating, Some(long)).as_deref(), Ok(long));
        assert_eq!(written(long, None).as_deref(), Ok(long));
        assert_eq!(written(repeating, None), Err("the same lines over and over".into()));
        // A restatement of every observation goes back though the cut would make it short,
        // and loses to a rewrite the model made short itself.
        let restated: String = (1..=12)
            .map(|i| format!("- Observation {i} restated word for word by the model.\n"))
            .collect();
        let restated = format!("### Patterns\n{restated}");
        assert!(fit_reflection(&restated).unwrap().chars().count() < 200, "short once cut");
        assert!(reflection_review(&restated, 200, &[]).is_some(), "the model wrote over 200");
        let (fitted, from) = settle_reflection(long, Some(&restated), &[]).unwrap();
        assert_eq!((fitted.as_str(), from), (fit_reflection(long).unwrap().as_str(), long));
        assert_eq!(written("", Some(repeating)), Err("empty".into()));
    }

    /// Four observations of the bench fixture (bench/fixtures/observations.md), two `[high]`.
    fn fixture_observations() -> Vec<Observed> {
        [
            (true, "Ana asked the worker to move the billing service from MySQL to Postgres 16; the worker wrote a migration plan with a dual-write phase and a rollback step."),
            (false, "The worker ran the billing test suite after the schema change: 412 tests passed, 3 failed on timestamp precision (MySQL DATETIME vs Postgres timestamptz)."),
            (true, "Ana decided that all timestamps in billing are stored in UTC as timestamptz and converted only at the edge; the worker updated the three failing tests accordingly."),
            (false, "The worker set up a nightly pg_dump of the billing database to the backup bucket, kept for 14 days, and tested a restore into a scratch database in 6 minutes."),
        ]
        .into_iter()
        .map(|(high, text)| Observed { high, text: text.into() })
        .collect()
    }

    #[test]
    fn a_reflection_that_says_the_observations_again_is_refused_by_its_words_not_its_length() {
        let seen = fixture_observations();
        // Each line one observation, lightly trimmed: short once cut, still a restatement.
        let restated = "### Patterns\n\
            - Ana asked to move the billing service from MySQL to Postgres 16 with a migration plan, a dual-write phase and a rollback step.\n\
            - The billing test suite ran after the schema change: 412 tests passed, 3 failed on timestamp precision.\n\
            - A nightly pg_dump of the billing database goes to the backup bucket, kept 14 days; a restore took 6 minutes.\n\
            ### Summary\nBilling moved to Postgres.";
        let why = fit_or_refuse(restated, &seen).unwrap_err();
        // The [high] one said again is kept, as the prompt asks; the other two are the problem.
        assert!(why.contains("2 of its 4 lines say an observation again"), "{why}");
        let note = reflection_review(restated, 2_000, &seen).expect("sent back");
        assert!(
            note.contains("cannot be written") && note.contains("say an observation again"),
            "{note}"
        );
        // What they add up to, in other words: written, though it shares their subject.
        let condensed = "### Patterns\n\
            - Billing is moving from MySQL to Postgres 16 behind a dual-write phase with a rollback.\n\
            - Timestamps are UTC timestamptz everywhere, converted only at the edge.\n\
            ### Learned rules\n- Test restores, not only backups (nightly pg_dump, 14 days).";
        assert!(fit_or_refuse(condensed, &seen).is_ok());
        assert_eq!(carried(condensed, &seen), [true, true, true, true]);
        assert_eq!(reflection_review(condensed, 2_000, &seen), None);
    }

    #[test]
    fn a_reflection_that_leaves_out_a_high_item_goes_back_naming_it_and_the_item_stays_unreflected()
    {
        let seen = fixture_observations();
        let without_utc = "### Patterns\n\
            - Billing is moving from MySQL to Postgres 16 behind a dual-write phase with a rollback.\n\
            - Backups run nightly and restores are tested.";
        // Observations that are not [high] need no line of their own; the UTC decision does.
        assert_eq!(carried(without_utc, &seen), [true, true, false, true]);
        let note = reflection_review(without_utc, 2_000, &seen).expect("sent back");
        assert!(note.contains("leaves out 1 [high] items"), "{note}");
        assert!(
            note.contains("- Ana decided that all timestamps in billing are stored in UTC"),
            "{note}"
        );
        assert!(!note.contains("MySQL to Postgres 16; the worker"), "only what is missing: {note}");
        // Written anyway if the rewrite still leaves it out (settle does not refuse it): the
        // runtime then marks every observation but that one reflected.
        assert!(settle_reflection(without_utc, None, &seen).is_ok());
        // Of a draft and its rewrite, the one that carries more [high] items, though longer.
        let with_utc = format!(
            "{without_utc}\n### Learned rules\n- Billing stores timestamps in UTC as timestamptz, converted at the edge."
        );
        let (_, from) = settle_reflection(without_utc, Some(&with_utc), &seen).unwrap();
        assert_eq!(from, with_utc);
        let (_, from) = settle_reflection(&with_utc, Some(without_utc), &seen).unwrap();
        assert_eq!(from, with_utc);
    }

    #[test]
    fn compaction_summarises_the_old_part_and_keeps_the_last_messages_whole() {
        let mut session: Vec<ChatMessage> =
            (0..30).flat_map(|i| [user(i, 10), assistant(i)]).collect();
        let kept: Vec<ChatMessage> = session[52..].to_vec();
        let n = compact(&mut session, 40, 12_000, 8).expect("60 messages > 40");
        assert_eq!(n, 52);
        assert_eq!(session.len(), 9);
        assert_eq!(&session[1..], &kept[..]);
        let ChatMessage::System { text } = &session[0] else { panic!("summary first") };
        assert!(text.starts_with("[conversation_summary] 52 earlier messages"), "{text}");
        assert!(
            text.contains("- op: 0:uuuuuuuuuu") && text.contains("- (me): answer 25"),
            "{text}"
        );
        // Under both limits nothing happens.
        assert_eq!(compact(&mut session, 40, 12_000, 8), None);
    }

    #[test]
    fn compaction_by_size_never_splits_a_tool_call_from_its_result() {
        let mut session = vec![
            user(0, 6_000),
            ChatMessage::ToolCall { id: "1".into(), name: "t".into(), arguments: "{}".into() },
            ChatMessage::ToolResult {
                call_id: "1".into(),
                name: "t".into(),
                ok: true,
                content: "r".repeat(7_000),
            },
            assistant(0),
            user(1, 10),
            assistant(1),
        ];
        // keep 5 would start at the tool call: the cut moves on to the next user message.
        compact(&mut session, 40, 12_000, 5).expect("13 000 chars > 12 000");
        assert!(matches!(&session[1], ChatMessage::User { text, .. } if text.starts_with("1:")));
        assert_eq!(session.len(), 3);
    }

    #[tokio::test]
    async fn compaction_never_touches_the_current_input() {
        // The turn's input goes in after turn.pre: however big, it reaches the model whole.
        let exts =
            vec![ExtensionSpec::MessageCompaction { max_messages: 4, max_chars: 100, keep: 2 }];
        let mut p = Pipeline::new(&spec(exts), offline_client(), None);
        let big = "x".repeat(50_000);
        let input = TurnInput { id: 7, from: "op", text: &big, result: false };
        let mut session: Vec<ChatMessage> =
            (0..5).flat_map(|i| [user(i, 50), assistant(i)]).collect();
        let pre = p.turn_pre(&input, &mut session).await;
        assert!(
            matches!(&session[0], ChatMessage::System { text } if text.starts_with(SUMMARY_TAG))
        );
        assert_eq!(pre.persist_first, session, "the compacted session is stored ahead of the turn");
        assert!(
            session.iter().all(|m| !matches!(m, ChatMessage::User { text, .. } if text == &big))
        );
    }

    #[test]
    fn a_stored_session_resumes_at_its_last_summary_and_window_starts_at_a_user_message() {
        let mut s = vec![
            user(0, 1),
            assistant(0),
            ChatMessage::System { text: format!("{SUMMARY_TAG} 2 earlier messages") },
            user(1, 1),
            assistant(1),
        ];
        resume_point(&mut s);
        assert_eq!(s.len(), 3);
        let mut w = vec![
            assistant(0),
            ChatMessage::ToolResult {
                call_id: "1".into(),
                name: "t".into(),
                ok: true,
                content: "r".into(),
            },
            user(1, 1),
            assistant(1),
        ];
        window(&mut w, 3);
        assert_eq!(w, vec![user(1, 1), assistant(1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_timer_fires_with_no_turn_once_per_idle_period() {
        let activity = Arc::new(AtomicU64::new(0));
        let wake = Arc::new(Notify::new());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let after = Duration::from_secs(30 * 60);
        tokio::spawn(idle_timer(after, activity.clone(), wake.clone(), move |idle| {
            let _ = tx.send(idle);
        }));
        tokio::time::sleep(Duration::from_secs(29 * 60)).await;
        assert!(rx.try_recv().is_err(), "not idle for 30 minutes yet");
        tokio::time::sleep(Duration::from_secs(2 * 60)).await;
        assert_eq!(rx.try_recv().expect("fired at 30 min"), after);
        tokio::time::sleep(Duration::from_secs(3 * 3600)).await;
        assert!(rx.try_recv().is_err(), "once per idle period");
        // Activity starts a new period.
        activity.store(1, Ordering::Relaxed);
        wake.notify_one();
        tokio::time::sleep(Duration::from_secs(20 * 60)).await;
        assert!(rx.try_recv().is_err());
        activity.store(2, Ordering::Relaxed);
        wake.notify_one();
        tokio::time::sleep(Duration::from_secs(29 * 60)).await;
        assert!(rx.try_recv().is_err(), "the turn at 20 min restarted the clock");
        tokio::time::sleep(Duration::from_secs(2 * 60)).await;
        assert!(rx.try_recv().is_ok());
    }
}
