//! The memory tools, answered on the supervisor's side from the swarm's memory index
//! (`flock_memory::index`): one thread owns the index (the one writer of `memory/index.db`),
//! brings it in step with the files before each search, and answers; the router never waits for
//! it.
//!
//! - `memory__search` — the runtime's (the unconscious's recall)
//! - after a sync that changed something, `active_memory.md` is rewritten (this thread is its
//!   one writer): what matters most, within [`ACTIVE_MEMORY_CHARS`]
//! - `memory_search {query, limit?, all?, kinds?, agent?}`, `memory_get {id}` — a model's, where its
//!   agent lists them in `tools:`

use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;

use flock_ipc::ToolError;
use flock_memory::index::{Index, Mode, Query, today};
use flock_memory::{Kind, Record};
use serde_json::{Value, json};

type Reply = Box<dyn FnOnce(Result<String, ToolError>) + Send>;

struct Job {
    tool: String,
    arguments: String,
    reply: Reply,
}

/// Handle to the memory thread.
#[derive(Clone)]
pub struct MemoryService {
    tx: std_mpsc::Sender<Job>,
}

impl std::fmt::Debug for MemoryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryService")
    }
}

impl MemoryService {
    /// Opens (or creates) the index of the memory dir `dir` and starts its thread.
    pub fn start(dir: PathBuf) -> Result<MemoryService, String> {
        let mut index = Index::open(&dir)?;
        match index.sync() {
            Ok(_) => refresh_active_memory(&index, &dir),
            Err(e) => tracing::warn!(error = %e, "flock: memory index failed to sync"),
        }
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("flock-memory".into())
            .spawn(move || {
                // The embedding model (90 MB) is loaded on the first call, not at start: most
                // swarms search rarely, and a test swarm never.
                let mut embedder_tried = false;
                for job in rx {
                    if !embedder_tried {
                        embedder_tried = true;
                        load_embedder(&mut index);
                    }
                    let result = run(&mut index, &dir, &job.tool, &job.arguments);
                    (job.reply)(result);
                }
            })
            .map_err(|e| format!("start the memory thread: {e}"))?;
        Ok(MemoryService { tx })
    }

    /// Runs `tool`; `reply` gets the JSON result or a coded error (`BAD_REQUEST: …`).
    pub fn call(&self, tool: &str, arguments: &str, reply: Reply) {
        let job = Job { tool: tool.to_owned(), arguments: arguments.to_owned(), reply };
        if let Err(std_mpsc::SendError(job)) = self.tx.send(job) {
            (job.reply)(Err(ToolError::internal("the memory thread has stopped")));
        }
    }
}

/// Passages (sentences) embedded per call at most (~84 a second on 2 cores: about 1.2 s): a
/// backlog (a memory dir indexed before the model was fetched, or re-embedded after an index
/// layout change) is worked off a slice at a time, never holding up a search for long.
const EMBED_PER_CALL: usize = 96;

/// Gives the index the embedding model if `scripts/setup` fetched it; words only otherwise.
fn load_embedder(index: &mut Index) {
    let Some(dir) = flock_memory::embed::default_dir() else { return };
    if !dir.join("model.safetensors").exists() {
        tracing::info!(
            dir = %dir.display(),
            "flock: memory search by words only: no embedding model in {} (scripts/setup fetches it)",
            dir.display()
        );
        return;
    }
    match flock_memory::embed::Embedder::load(&dir) {
        Ok(e) => index.set_embedder(std::sync::Arc::new(e)),
        Err(e) => tracing::warn!(error = %e, "flock: memory search by words only"),
    }
}

/// `active_memory.md` of the memory dir, at most this many characters (about 4 000 tokens).
pub const ACTIVE_MEMORY_CHARS: usize = 16_000;

/// Rewrites `active_memory.md` from the index (temp file + rename: a reader sees the old file or
/// the new one). This thread is its only writer.
fn refresh_active_memory(index: &Index, dir: &std::path::Path) {
    let text = match index.active_memory(today(), ACTIVE_MEMORY_CHARS) {
        Ok(t) => t,
        Err(e) => return tracing::warn!(error = %e, "flock: active memory not built"),
    };
    let path = dir.join("active_memory.md");
    if std::fs::read_to_string(&path).is_ok_and(|old| old == text) {
        return;
    }
    let tmp = dir.join(".active_memory.md.tmp");
    if let Err(e) = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &path)) {
        tracing::warn!(path = %path.display(), error = %e, "flock: active memory not written");
    }
}

fn run(
    index: &mut Index,
    dir: &std::path::Path,
    tool: &str,
    arguments: &str,
) -> Result<String, ToolError> {
    let args: Value =
        serde_json::from_str(if arguments.trim().is_empty() { "{}" } else { arguments })
            .map_err(|e| ToolError::bad_request(format!("arguments are not JSON: {e}")))?;
    let synced = index.sync().map_err(|e| ToolError::internal(e.to_string()))?;
    if synced.files_read + synced.files_dropped > 0 {
        refresh_active_memory(index, dir);
    }
    if let Err(e) = index.embed_pending(EMBED_PER_CALL) {
        tracing::warn!(error = %e, "flock: memory vectors not computed");
    }
    match tool {
        "memory__search" | "memory_search" => {
            let text = args["query"]
                .as_str()
                .filter(|q| !q.trim().is_empty())
                .ok_or(ToolError::bad_request("`query` is required (the words to look for)"))?;
            let mut kinds = Vec::new();
            for k in args["kinds"].as_array().into_iter().flatten() {
                let name = k.as_str().unwrap_or_default();
                kinds.push(Kind::parse(name).ok_or_else(|| {
                    ToolError::bad_request(format!(
                        "no memory kind `{name}`; kinds: journal, observation, reflection, knowledge"
                    ))
                })?);
            }
            let query = Query {
                text,
                limit: args["limit"].as_u64().map_or(5, |l| l.clamp(1, 20) as usize),
                all: args["all"].as_bool().unwrap_or(false),
                kinds,
                agent: args["agent"].as_str().filter(|a| !a.is_empty()),
                today: today(),
                mode: Mode::Hybrid,
                // The unconscious's recall asks for clear matches only.
                precise: args["precise"].as_bool().unwrap_or(false),
            };
            let hits = index.search(&query).map_err(|e| ToolError::internal(e.to_string()))?;
            let hits: Vec<Value> = hits
                .iter()
                .map(|h| {
                    let mut v = record_json(&h.record);
                    v["tier"] = json!(h.tier);
                    v["score"] = json!((h.score * 1000.0).round() / 1000.0);
                    v
                })
                .collect();
            Ok(json!({"hits": hits}).to_string())
        }
        "memory_get" => {
            let id = args["id"].as_str().ok_or(ToolError::bad_request("`id` is required"))?;
            match index.get(id).map_err(|e| ToolError::internal(e.to_string()))? {
                Some(r) => Ok(record_json(&r).to_string()),
                None => Err(ToolError::bad_request(format!(
                    "no memory with id `{id}` (memory_search lists ids)"
                ))),
            }
        }
        other => Err(ToolError::bad_request(format!("`{other}` is not a memory tool"))),
    }
}

/// A record as the tools show it.
pub fn record_json(r: &Record) -> Value {
    json!({
        "id": r.id, "kind": r.kind.as_str(), "date": r.date, "time": r.time,
        "priority": r.priority.as_str(), "category": r.category, "agent": r.agent,
        "path": r.path, "text": r.text,
    })
}
