//! The model thread: one llama.cpp model and context, owned by one dedicated OS thread that
//! serves [`Job`]s one at a time in arrival order (a FIFO channel). The context holds several
//! sequences — KV-cache *slots* — and each client key (an agent) keeps its own: a job decodes
//! only the part of its prompt that differs from what its slot holds, so every agent's stable
//! prefix (rules, tools, history) is processed once, not once per turn of whoever ran last. A new
//! key takes a free slot or the least recently used one. It samples greedily, through the
//! llguidance matcher when a job carries a JSON schema; it stops early when the job's cancel flag
//! is raised (the client went away). Not here: HTTP, prompts, JSON.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::wire::Finish;

/// Prompt tokens per `llama_decode` call: big enough for throughput, small enough that a
/// cancelled request stops within about a second.
const PROMPT_CHUNK: usize = 128;
/// Prompt tokens a background job processes between two chances to give way.
const BACKGROUND_CHUNK: usize = 16;
/// Tokens a background job that gave way before generates in each run before it may give way
/// again (a person waits for at most this many).
const RESUMED_QUANTUM: usize = 4;
/// How long a background job gives way: past this it runs to its end, once (under a steady
/// stream of requests a person waits for one background answer now and then, and the memory
/// roles' notes are never held back for longer).
const BACKGROUND_PATIENCE: Duration = Duration::from_secs(60);

/// How the model is loaded.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub model_path: PathBuf,
    pub threads: usize,
    /// Context of each slot, in tokens (prompt plus answer).
    pub n_ctx: u32,
    /// KV-cache slots (sequences): one per client key, least recently used evicted first.
    pub slots: u32,
    /// Keep llama.cpp's own log lines (on stderr); otherwise they are silenced.
    pub verbose: bool,
}

/// What the loaded model is.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// `general.name` from the GGUF metadata, or the file name.
    pub name: String,
    /// Context of each slot.
    pub n_ctx: u32,
    pub slots: u32,
    pub threads: usize,
    pub load_time: Duration,
}

/// One generation request.
#[derive(Debug)]
pub struct Job {
    /// The rendered prompt, special tokens written out (`<|im_start|>` …).
    pub prompt: String,
    /// Whose KV-cache slot to use (an agent's name); jobs without one share a slot.
    pub key: String,
    /// Background work: served only when no other job waits.
    pub background: bool,
    /// Named parts of the prompt to count tokens for, in the log (`system`, `tools`, …).
    pub parts: Vec<(&'static str, String)>,
    /// When set, the output must match this JSON schema (llguidance).
    pub schema: Option<Value>,
    /// When the schema does not compile: a looser one to try instead.
    pub fallback_schema: Option<Value>,
    /// At most this many new tokens (also bounded by the context).
    pub max_tokens: Option<u32>,
    /// `None` or ≤ 0: greedy. Ignored under a schema (constrained answers are greedy).
    pub temperature: Option<f32>,
    pub seed: Option<u32>,
    /// Raised when the client has gone: the job stops at the next token.
    pub cancel: Arc<AtomicBool>,
    pub reply: oneshot::Sender<Result<Generation, GenerateError>>,
    /// When it was handed to the engine (its time in the queue is reported).
    pub submitted: Instant,
    /// Times a background job gave way to a job that came in while it ran.
    pub preempted: u32,
    /// What a background job had generated when it gave way: it goes on from there.
    pub resume: Vec<LlamaToken>,
}

/// What a job produced.
#[derive(Debug, Clone)]
pub struct Generation {
    pub text: String,
    pub finish: Finish,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// Prompt tokens whose KV state was reused from the slot's previous job.
    pub reused_tokens: u32,
    /// The slot used.
    pub slot: u32,
    /// Tokens of each named part of the prompt (as the job listed them).
    pub part_tokens: Vec<(&'static str, u32)>,
    pub prompt_time: Duration,
    pub total_time: Duration,
    /// From submission to the start of the run that produced it (waiting for other jobs, and
    /// for a background job the runs it gave up).
    pub queued: Duration,
    /// Times a background job gave way (its prompt stays in its slot; the answer is redone).
    pub preempted: u32,
    /// Tokens of a dropped span the cache left out (the rest was shifted down and reused).
    pub shifted_tokens: u32,
}

/// Why a job produced nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GenerateError {
    #[error(
        "the prompt is {prompt_tokens} tokens but the context holds {n_ctx}; shorten the \
         conversation or start flock-model with a larger --ctx"
    )]
    ContextExceeded { prompt_tokens: usize, n_ctx: u32 },
    #[error("the tool schema cannot be compiled into a grammar: {0}")]
    Grammar(String),
    #[error("llama.cpp failed: {0}")]
    Decode(String),
    #[error("cancelled: the client went away")]
    Cancelled,
    /// A background job gave way to a job that came in (it goes on later from the tokens it
    /// had generated).
    #[error("gave way to a foreground job")]
    Preempted(Vec<LlamaToken>),
}

/// Why the model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot initialise llama.cpp: {0}")]
    Backend(String),
    #[error("cannot load the model {path}: {message}")]
    Model { path: PathBuf, message: String },
    #[error("cannot create a llama.cpp context of {n_ctx} tokens: {message}")]
    Context { n_ctx: u32, message: String },
    #[error("cannot prepare the grammar engine: {0}")]
    Grammar(String),
    #[error("the model thread stopped during loading")]
    ThreadDied,
}

/// The way to the model thread; cheap to clone.
#[derive(Debug, Clone)]
pub struct Engine {
    jobs: mpsc::Sender<Job>,
}

impl Engine {
    /// Starts the model thread and waits until the model is loaded.
    pub fn start(config: EngineConfig) -> Result<(Engine, ModelInfo), LoadError> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("flock-model-llama".into())
            .spawn(move || model_thread(config, rx, ready_tx))
            .map_err(|e| LoadError::Backend(format!("cannot start the model thread: {e}")))?;
        let info = ready_rx.recv().map_err(|_| LoadError::ThreadDied)??;
        Ok((Engine { jobs }, info))
    }

    /// Queues a job behind those already waiting; `Err` hands it back if the thread is gone.
    #[allow(clippy::result_large_err, reason = "hands the unsent job back, like a SendError")]
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)
    }

    /// An engine whose model thread is gone (every `submit` fails, a 503): for HTTP tests that
    /// need no model.
    #[cfg(test)]
    pub(crate) fn stopped() -> Engine {
        let (jobs, _) = mpsc::channel();
        Engine { jobs }
    }
}

fn model_thread(
    config: EngineConfig,
    jobs: mpsc::Receiver<Job>,
    ready: mpsc::Sender<Result<ModelInfo, LoadError>>,
) {
    let started = Instant::now();
    if !config.verbose {
        llama_cpp_2::send_logs_to_tracing(
            llama_cpp_2::LogOptions::default().with_logs_enabled(false),
        );
    }
    let backend = match LlamaBackend::init() {
        Ok(b) => b,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Backend(e.to_string())));
            return;
        }
    };
    let model = match LlamaModel::load_from_file(
        &backend,
        &config.model_path,
        &LlamaModelParams::default(),
    ) {
        Ok(m) => m,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Model {
                path: config.model_path.clone(),
                message: e.to_string(),
            }));
            return;
        }
    };
    let threads = i32::try_from(config.threads.max(1)).unwrap_or(1);
    let slots = config.slots.max(1);
    // One sequence per slot, each with its own cells (not unified): a slot's attention covers
    // only its own tokens, and one agent's long prompt never evicts another's.
    let params = LlamaContextParams::default()
        .with_n_ctx(NonZeroU32::new(config.n_ctx.saturating_mul(slots)))
        .with_n_seq_max(slots)
        .with_kv_unified(false)
        .with_n_batch(PROMPT_CHUNK as u32)
        .with_n_ubatch(PROMPT_CHUNK as u32)
        .with_n_threads(threads)
        .with_n_threads_batch(threads);
    let mut ctx = match model.new_context(&backend, params) {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Context {
                n_ctx: config.n_ctx.saturating_mul(slots),
                message: e.to_string(),
            }));
            return;
        }
    };
    // Walking the whole vocabulary takes a moment: once per process, not per request.
    let tok_env = LlamaSampler::llguidance_tok_env(&model);
    let mut factory = match ParserFactory::new_simple(&tok_env) {
        Ok(f) => f,
        Err(e) => {
            let _ = ready.send(Err(LoadError::Grammar(e.to_string())));
            return;
        }
    };
    factory.quiet();
    let name =
        model.meta_val_str("general.name").ok().filter(|n| !n.is_empty()).unwrap_or_else(|| {
            config
                .model_path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "local".into())
        });
    let info = ModelInfo {
        name,
        n_ctx: ctx.n_ctx() / slots,
        slots,
        threads: config.threads.max(1),
        load_time: started.elapsed(),
    };
    let n_ctx_slot = info.n_ctx;
    if ready.send(Ok(info)).is_err() {
        return;
    }
    let closers = closing_tokens(&model);
    let mut state = State {
        model: &model,
        factory: &factory,
        closers: &closers,
        slots: (0..slots).map(|_| Slot::default()).collect(),
        n_ctx: n_ctx_slot,
        clock: 0,
    };
    // Arrival order within a tier; background jobs wait while any other job does, and give way
    // (between a few tokens) to one that comes in while they run — until they have waited
    // `BACKGROUND_PATIENCE`, then they run to their end.
    let (mut now, mut later) = (VecDeque::new(), VecDeque::new());
    loop {
        while let Ok(job) = jobs.try_recv() {
            if job.background { later.push_back(job) } else { now.push_back(job) }
        }
        let mut job = match now.pop_front().or_else(|| later.pop_front()) {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => break,
            },
        };
        let result = if job.cancel.load(Ordering::Relaxed) {
            Err(GenerateError::Cancelled)
        } else if job.background && job.submitted.elapsed() < BACKGROUND_PATIENCE {
            let mut foreground_waits = || {
                while let Ok(j) = jobs.try_recv() {
                    if j.background { later.push_back(j) } else { now.push_back(j) }
                }
                !now.is_empty()
            };
            state.generate(&mut ctx, &job, &mut foreground_waits)
        } else {
            state.generate(&mut ctx, &job, &mut || false)
        };
        match result {
            Err(GenerateError::Preempted(generated)) => {
                job.preempted += 1;
                job.resume = generated;
                later.push_front(job);
            }
            result => {
                let result = result.map(|mut g| {
                    g.preempted = job.preempted;
                    g
                });
                let _gone = job.reply.send(result);
            }
        }
    }
}

/// The smallest run of tokens a dropped span must leave behind to be worth shifting.
const SHIFT_MIN: usize = 16;

/// A span `cached[keep..at]` that the prompt no longer has, followed in the cache by a run of
/// `len` tokens that the prompt continues with after `keep` (at least [`SHIFT_MIN`], and not
/// the whole rest of the prompt: its last token must be decoded for the logits): `(at, len)`.
fn dropped_span(
    cached: &[LlamaToken],
    prompt: &[LlamaToken],
    keep: usize,
) -> Option<(usize, usize)> {
    let probe = prompt.get(keep..keep + SHIFT_MIN)?;
    let at = (keep + 1..cached.len().saturating_sub(SHIFT_MIN - 1))
        .find(|&j| cached[j..j + SHIFT_MIN] == *probe)?;
    let room = prompt.len() - 1 - keep;
    let len = cached[at..].iter().zip(&prompt[keep..]).take_while(|(a, b)| a == b).count();
    let len = len.min(room);
    (len >= SHIFT_MIN).then_some((at, len))
}

/// Whether the output ends in a loop: its last 32 characters (numbers aside, so "12. Move the
/// boxes" and "13. Move the boxes" are the same) already came four times in the text before.
fn repeating(out: &[u8]) -> bool {
    const WINDOW: usize = 32;
    let tail = &out[out.len().saturating_sub(3_000)..];
    let text: Vec<char> =
        String::from_utf8_lossy(tail).chars().filter(|c| !c.is_ascii_digit()).collect();
    if text.len() < WINDOW * 5 {
        return false;
    }
    let needle = &text[text.len() - WINDOW..];
    if needle.iter().all(|c| c.is_whitespace()) {
        return false;
    }
    let before = &text[..text.len() - WINDOW];
    before.windows(WINDOW).filter(|w| *w == needle).count() >= 4
}

/// Whether a token's text only closes what is open in a JSON answer: it starts with `"`, `}` or
/// `]`, goes on with closers and spaces only, and may end with the comma before a key the
/// grammar still requires (`"`, `"}`, `"}}`, `",`, `]}` …).
fn closes(piece: &[u8]) -> bool {
    let body = piece.strip_suffix(b",").unwrap_or(piece);
    matches!(body.first(), Some(b'"' | b'}' | b']'))
        && body[1..].iter().all(|b| matches!(b, b'}' | b']' | b' ' | b'\n'))
}

/// The tokens [`closes`] accepts, found once per process: those that end what is open, and
/// those that end with a comma (taken only when the grammar wants another key).
struct Closers {
    end: Vec<u32>,
    comma: Vec<u32>,
}

fn closing_tokens(model: &LlamaModel) -> Closers {
    let (mut end, mut comma) = (Vec::new(), Vec::new());
    for (t, piece) in model.tokens(false) {
        if let Ok(id) = u32::try_from(t.0)
            && closes(&piece)
        {
            if piece.ends_with(b",") { comma.push(id) } else { end.push(id) }
        }
    }
    Closers { end, comma }
}

/// Tokens kept back from a constrained answer's limit to close it, at most.
const CLOSE_RESERVE: usize = 24;
/// Tokens a constrained answer may take to close once it must end.
const CLOSE_STEPS: usize = 48;

/// One KV-cache slot: a llama.cpp sequence and who uses it.
#[derive(Default)]
struct Slot {
    key: Option<String>,
    /// The tokens whose KV entries sit in this sequence at positions `0..cached.len()`.
    cached: Vec<LlamaToken>,
    last_used: u64,
}

/// The model thread's state between jobs.
struct State<'m> {
    model: &'m LlamaModel,
    factory: &'m ParserFactory,
    /// See [`closing_tokens`].
    closers: &'m Closers,
    slots: Vec<Slot>,
    /// Context of each slot.
    n_ctx: u32,
    /// Counts jobs, for least-recently-used eviction.
    clock: u64,
}

impl State<'_> {
    /// The slot of `key`: its own, else a free one, else the least recently used (cleared).
    fn slot_for(&mut self, ctx: &mut LlamaContext<'_>, key: &str) -> usize {
        self.clock += 1;
        let found = self.slots.iter().position(|s| s.key.as_deref() == Some(key));
        let i = found.unwrap_or_else(|| {
            let free = self.slots.iter().position(|s| s.key.is_none());
            free.unwrap_or_else(|| {
                (0..self.slots.len()).min_by_key(|&i| self.slots[i].last_used).unwrap_or(0)
            })
        });
        let slot = &mut self.slots[i];
        if slot.key.as_deref() != Some(key) {
            if !slot.cached.is_empty() {
                let _ = ctx.clear_kv_cache_seq(Some(i as u32), None, None);
                slot.cached.clear();
            }
            slot.key = Some(key.to_owned());
        }
        slot.last_used = self.clock;
        i
    }
}

impl State<'_> {
    /// Runs `job`; `give_way` is asked between prompt chunks and tokens whether the job must
    /// stop for another (`Err(Preempted)`: what it processed stays in its slot).
    fn generate(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        job: &Job,
        give_way: &mut dyn FnMut() -> bool,
    ) -> Result<Generation, GenerateError> {
        let started = Instant::now();
        let queued = started.saturating_duration_since(job.submitted);
        let vocab = self.model.vocab();
        let prompt = vocab.tokenize(job.prompt.as_bytes(), false, true);
        // A job that gave way goes on from what it had generated: those tokens follow the
        // prompt (in the slot's cache, if it still holds them).
        let full: Vec<LlamaToken> = prompt.iter().chain(&job.resume).copied().collect();
        let part_tokens = job
            .parts
            .iter()
            .map(|(name, text)| (*name, vocab.tokenize(text.as_bytes(), false, true).len() as u32))
            .collect();
        let n_ctx = self.n_ctx;
        if prompt.is_empty() || prompt.len() >= n_ctx as usize {
            return Err(GenerateError::ContextExceeded { prompt_tokens: prompt.len(), n_ctx });
        }
        let room = n_ctx as usize - prompt.len();
        let max_new = job.max_tokens.map_or(room, |m| (m as usize).min(room));
        if full.len() >= n_ctx as usize {
            return Err(GenerateError::ContextExceeded { prompt_tokens: full.len(), n_ctx });
        }

        // Compile the grammar before touching the cache, so a bad schema costs nothing.
        let mut matcher = match &job.schema {
            None => None,
            Some(schema) => Some(self.matcher(schema, job.fallback_schema.as_ref())?),
        };

        // The key's own slot; reuse the longest common prefix of what it holds (at least one
        // token must be decoded to get logits).
        let slot = self.slot_for(ctx, &job.key);
        let seq = slot as i32;
        let cached = &mut self.slots[slot].cached;
        let mut keep = cached.iter().zip(&full).take_while(|(a, b)| a == b).count();
        keep = keep.min(full.len() - 1);
        // The agent dropped the oldest part of its history (the prompt is the same, less a span
        // after the system prompt): that span leaves the cache and what follows it moves down,
        // instead of being processed again (llama.cpp shifts the positions of a RoPE cache).
        let mut shifted = 0;
        if let Some((at, len)) = dropped_span(cached, &full, keep) {
            let (k, a, n) = (keep as u32, at as u32, len as u32);
            let moved = ctx.kv_cache_seq_rm(seq, Some(k), Some(a)).is_ok()
                && ctx.kv_cache_seq_rm(seq, Some(a + n), None).is_ok()
                && ctx.kv_cache_seq_add(seq, Some(a), Some(a + n), -((a - k) as i32)).is_ok();
            if moved {
                let run = cached[at..at + len].to_vec();
                cached.truncate(keep);
                cached.extend(run);
                shifted = at - keep;
                keep = (keep + len).min(full.len() - 1);
            } else {
                // Half-done: start this slot clean.
                let _ = ctx.clear_kv_cache_seq(Some(slot as u32), None, None);
                cached.clear();
                keep = 0;
            }
        }
        if keep < cached.len() {
            let removed =
                u32::try_from(keep).ok().and_then(|k| ctx.kv_cache_seq_rm(seq, Some(k), None).ok());
            if removed.is_none() {
                let _ = ctx.clear_kv_cache_seq(Some(slot as u32), None, None);
                keep = 0;
            }
            cached.truncate(keep);
        }
        let reused = keep.min(prompt.len());

        let mut batch = LlamaBatch::new(PROMPT_CHUNK, 1);
        let rest = &full[keep..];
        // A background job asks whether to give way between smaller chunks (a person's request
        // waits at most one of them).
        let size = if job.background { BACKGROUND_CHUNK } else { PROMPT_CHUNK };
        let chunks = rest.len().div_ceil(size);
        // Every run moves a job on (a chunk, or a few tokens once it has given way before), so
        // a busy swarm delays background work but never starves it.
        let quantum = if job.preempted > 0 { RESUMED_QUANTUM } else { 1 };
        for (i, chunk) in rest.chunks(size).enumerate() {
            if job.cancel.load(Ordering::Relaxed) {
                return Err(GenerateError::Cancelled);
            }
            if i > 0 && give_way() {
                return Err(GenerateError::Preempted(job.resume.clone()));
            }
            self.decode(ctx, &mut batch, slot, chunk, i + 1 == chunks)?;
        }
        let prompt_time = started.elapsed();

        let mut sampler = match job.temperature {
            Some(t) if t > 0.0 && matcher.is_none() => Some(LlamaSampler::chain_simple([
                LlamaSampler::top_k(40),
                LlamaSampler::top_p(0.95, 1),
                LlamaSampler::temp(t),
                LlamaSampler::dist(job.seed.unwrap_or_else(|| fastrand::u32(..))),
            ])),
            _ => None,
        };
        let mut out: Vec<u8> = Vec::new();
        let mut generated = 0usize;
        let mut tokens: Vec<LlamaToken> = Vec::new();
        if !job.resume.is_empty() {
            let resumed = match &mut matcher {
                Some(m) => m
                    .consume_tokens(&job.resume.iter().map(|t| t.0 as u32).collect::<Vec<_>>())
                    .is_ok(),
                None => true,
            };
            if !resumed {
                return Err(GenerateError::Grammar("a resumed answer left its grammar".into()));
            }
            for &t in &job.resume {
                out.extend(vocab.token_to_piece(t, false, None));
            }
            generated = job.resume.len();
            tokens.extend_from_slice(&job.resume);
        }
        let mut finish = Finish::Length;
        let mut logits_idx = batch.n_tokens() - 1;
        // A constrained answer that must end early (its token limit is near, or it loops) is
        // steered to close what it has open, so it still parses as the call or answer it was:
        // the steps it has left to do so, once it must.
        let mut closing: Option<usize> = None;
        let reserve = CLOSE_RESERVE.min(max_new / 4);
        while generated < max_new {
            if job.cancel.load(Ordering::Relaxed) {
                return Err(GenerateError::Cancelled);
            }
            if generated - job.resume.len() >= quantum && give_way() {
                return Err(GenerateError::Preempted(tokens));
            }
            let token = match (&mut matcher, &mut sampler) {
                (Some(m), _) => {
                    if closing.is_none() && generated + reserve >= max_new {
                        closing = Some(CLOSE_STEPS);
                    }
                    let mask =
                        m.compute_mask().map_err(|e| GenerateError::Grammar(e.to_string()))?;
                    let logits = ctx.get_logits_ith(logits_idx);
                    let best_of = |ids: &mut dyn Iterator<Item = usize>| {
                        ids.filter(|&i| mask.is_allowed(i as u32))
                            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]))
                    };
                    let closer = match closing {
                        Some(_) => best_of(&mut self.closers.end.iter().map(|&t| t as usize))
                            .or_else(|| {
                                best_of(&mut self.closers.comma.iter().map(|&t| t as usize))
                            }),
                        None => None,
                    };
                    match closer.or_else(|| best_of(&mut (0..logits.len()))) {
                        Some(i) => LlamaToken(i as i32),
                        None => {
                            finish = Finish::Stop;
                            break;
                        }
                    }
                }
                (None, Some(s)) => s.sample(ctx, logits_idx),
                (None, None) => {
                    let logits = ctx.get_logits_ith(logits_idx);
                    let best = logits
                        .iter()
                        .enumerate()
                        .max_by(|a, b| a.1.total_cmp(b.1))
                        .map(|(i, _)| i)
                        .unwrap_or(0);
                    LlamaToken(best as i32)
                }
            };
            if vocab.is_eog(token) || vocab.is_control(token) {
                finish = Finish::Stop;
                break;
            }
            let mut step = vec![token];
            if let Some(m) = &mut matcher {
                m.consume_token(token.0 as u32)
                    .map_err(|e| GenerateError::Grammar(e.to_string()))?;
                // Tokens the grammar forces (`"arguments": {"to": "` …) go in one batch.
                let forced = m.compute_ff_tokens();
                let forced = &forced[..forced.len().min(max_new - generated - 1)];
                if !forced.is_empty() && m.consume_tokens(forced).is_ok() {
                    step.extend(forced.iter().map(|&t| LlamaToken(t as i32)));
                }
            }
            for &t in &step {
                out.extend(vocab.token_to_piece(t, false, None));
            }
            tokens.extend_from_slice(&step);
            generated += step.len();
            if matcher.as_ref().is_some_and(Matcher::is_stopped) {
                // An answer closed early reports why it ended.
                finish = if closing.is_some() { Finish::Length } else { Finish::Stop };
                break;
            }
            if generated >= max_new {
                break;
            }
            // Greedy decoding of a small model can fall into a loop of the same lines: stop it
            // (as if the token limit were reached) rather than spend the rest of the budget — a
            // constrained answer by closing what it has open.
            match &mut closing {
                Some(0) => break,
                Some(left) => *left -= 1,
                None if generated.is_multiple_of(8) && repeating(&out) => {
                    if matcher.is_none() {
                        break;
                    }
                    closing = Some(CLOSE_STEPS);
                }
                None => {}
            }
            self.decode(ctx, &mut batch, slot, &step, true)?;
            logits_idx = batch.n_tokens() - 1;
        }
        Ok(Generation {
            text: String::from_utf8_lossy(&out).into_owned(),
            finish,
            prompt_tokens: prompt.len() as u32,
            completion_tokens: generated as u32,
            reused_tokens: reused as u32,
            slot: slot as u32,
            part_tokens,
            prompt_time,
            total_time: started.elapsed(),
            queued,
            preempted: 0,
            shifted_tokens: shifted as u32,
        })
    }

    /// Decodes `tokens` at the next positions (logits for the last one when `logits`), and
    /// records them as cached only once llama.cpp has them.
    fn decode(
        &mut self,
        ctx: &mut LlamaContext<'_>,
        batch: &mut LlamaBatch,
        slot: usize,
        tokens: &[LlamaToken],
        logits: bool,
    ) -> Result<(), GenerateError> {
        let seq = slot as i32;
        for part in tokens.chunks(PROMPT_CHUNK) {
            batch.clear();
            let start = self.slots[slot].cached.len();
            let last = part.len() - 1;
            for (i, &t) in part.iter().enumerate() {
                batch
                    .add(t, (start + i) as i32, &[seq], logits && i == last)
                    .map_err(|e| GenerateError::Decode(e.to_string()))?;
            }
            if let Err(e) = ctx.decode(batch) {
                // The slot may hold part of this batch now: start it clean next time.
                let _ = ctx.clear_kv_cache_seq(Some(slot as u32), None, None);
                self.slots[slot].cached.clear();
                return Err(GenerateError::Decode(e.to_string()));
            }
            self.slots[slot].cached.extend_from_slice(part);
        }
        Ok(())
    }

    fn matcher(&self, schema: &Value, fallback: Option<&Value>) -> Result<Matcher, GenerateError> {
        let create =
            |s: &Value| self.factory.create_parser(TopLevelGrammar::from_json_schema(s.clone()));
        let parser = match (create(schema), fallback) {
            (Ok(p), _) => p,
            (Err(e), Some(f)) => {
                tracing::warn!(
                    "flock-model: tool schema rejected ({e}); using loose argument schemas"
                );
                create(f).map_err(|e| GenerateError::Grammar(e.to_string()))?
            }
            (Err(e), None) => return Err(GenerateError::Grammar(e.to_string())),
        };
        let matcher = Matcher::new(Ok(parser));
        match matcher.get_error() {
            Some(e) => Err(GenerateError::Grammar(e)),
            None => Ok(matcher),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LlamaToken, SHIFT_MIN, closes, dropped_span, repeating};

    #[test]
    fn closing_tokens_only_close_what_is_open() {
        for piece in ["\"", "\"}", "\"}}", "\",", "]}", "}\n", "\"]}", "}"] {
            assert!(closes(piece.as_bytes()), "{piece:?}");
        }
        for piece in ["", ",", " \"", "\"a", "\",\"", "x}", "\"}, {", "\\\""] {
            assert!(!closes(piece.as_bytes()), "{piece:?}");
        }
    }

    fn toks(v: impl IntoIterator<Item = i32>) -> Vec<LlamaToken> {
        v.into_iter().map(LlamaToken).collect()
    }

    #[test]
    fn a_span_dropped_after_the_system_prompt_is_found_and_the_rest_reused() {
        // system 0..10, history 100..150 (the first 20 dropped now), then the new turn.
        let cached = toks((0..10).chain(100..150));
        let prompt = toks((0..10).chain(120..150).chain(900..905));
        assert_eq!(dropped_span(&cached, &prompt, 10), Some((30, 30)));
        // Nothing dropped: nothing to shift.
        let same = toks((0..10).chain(100..150).chain(900..905));
        assert_eq!(dropped_span(&cached, &same, 60), None);
        // A run shorter than SHIFT_MIN is not worth it.
        let short = toks((0..10).chain(145..150).chain(900..920));
        assert_eq!(dropped_span(&cached, &short, 10), None);
        // The last prompt token is always decoded again.
        let all = toks((0..10).chain(120..150));
        assert_eq!(dropped_span(&cached, &all, 10), Some((30, 29)));
        const { assert!(29 >= SHIFT_MIN) };
    }

    #[test]
    fn a_loop_is_seen_in_lines_json_escaped_text_and_numbered_runs() {
        let looping =
            r"- Move all boxes to the van\n  - Check if all boxes are in place\n".repeat(5);
        assert!(repeating(format!(r#"{{"text": "To do:\n{looping}"#).as_bytes()));
        let numbered: String =
            (1..12).map(|i| format!("{i}. Move the boxes to the new location ")).collect();
        assert!(repeating(numbered.as_bytes()));
        let fine = "1. Pack the boxes\n2. Book the van for Saturday morning\n3. Get the new keys \
                    from the agent\n4. Clean the old flat\n5. Hand back the old keys\n6. Unpack\n";
        assert!(!repeating(fine.as_bytes()));
        // Three days with the same time line are a plan, not a loop.
        let plan: String = ["Rust meetup", "PyCon", "v3 release"]
            .iter()
            .map(|e| format!("- {e}\n  - Time: 10:00 AM - 12:00 PM\n  - Where: online\n"))
            .collect();
        assert!(!repeating(plan.as_bytes()));
    }
}
