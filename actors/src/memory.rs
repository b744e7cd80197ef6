//! The swarm's memory on the supervisor's side: one thread owns the memory index
//! (`flock_memory::index`, the one writer of `memory/index.db`) and is the one writer of the memory
//! files (`flock_memory::files`). Agents see `memory/` read-only in their cage; what they want
//! written comes here as a tool call, written under the caller's name from its connection, so no
//! agent can change or delete what another observed, remembered or reflected. The router never
//! waits for this thread.
//!
//! - `memory__search` — the runtime's (the unconscious's recall)
//! - after a sync that changed something, `active_memory.md` is rewritten (this thread is its
//!   one writer): what matters most, within [`ACTIVE_MEMORY_CHARS`]
//! - `memory_search {query, limit?, all?, kinds?, agent?}`, `memory_get {id}` — a model's, where its
//!   agent lists them in `tools:`
//! - writes, each under the call's id (derived from the turn: a replayed turn writes nothing
//!   twice): `memory_remember`, `knowledge_append` (a model's); `memory__journal` (a worker's
//!   turn), `memory__observe` (the observer), `memory__reflect` (reflection), `memory__dream`
//!   (dream) — the runtime's, each role-gated by the tool table
//! - tiers (`flock_memory::tiers`): `memory__ttl` (the router's daily job: hot → warm, and what
//!   is due for cold) and `memory__archive` (a person's move, either way, and a cold move a
//!   person approved) — neither is in the tool table, so no agent can call them

use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;

use flock_ipc::ToolError;
use flock_ipc::time::unix_ms_now;
use flock_memory::files::{Memory as Files, degenerate};
use flock_memory::index::{Filter, Index, Mode, Query, today};
use flock_memory::tiers::{self, Ages, Moved, Pick, Tier, Ttl};
use flock_memory::{Kind, Record};
use serde_json::{Value, json};

type Reply = Box<dyn FnOnce(Result<String, ToolError>) + Send>;

/// One call to the memory thread.
#[derive(Debug, Clone)]
pub struct Call {
    pub tool: String,
    pub arguments: String,
    /// The calling agent, from its connection: the name its writes are filed under.
    pub caller: String,
    /// The call's id: a write already made under it is not made again.
    pub key: String,
}

struct Job {
    call: Call,
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
    /// Starts the memory thread for the memory dir `dir`, with its index opened (or created).
    /// The index is rebuildable from the files: if it cannot be opened, searches fail with the
    /// reason and writes go on.
    pub fn start(dir: PathBuf, ages: Ages) -> Result<MemoryService, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let mut index = match Index::open(&dir) {
            Ok(index) => Ok(index),
            Err(e) => {
                tracing::warn!(error = %e, "flock: memory search is off");
                Err(e)
            }
        };
        if let Ok(index) = &mut index {
            resync(index, &dir);
        }
        let files = Files::new(&dir);
        let (tx, rx) = std_mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("flock-memory".into())
            .spawn(move || {
                // The embedding model (90 MB) is loaded on the first search, not at start: most
                // swarms search rarely, and a test swarm never.
                let mut embedder_tried = false;
                // Records without vectors may be left: embedded a few at a time while no call
                // waits, so a search never waits for a backlog (only for the newest few).
                let mut backlog = false;
                loop {
                    let job = if backlog {
                        match rx.try_recv() {
                            Ok(job) => job,
                            Err(std_mpsc::TryRecvError::Empty) => {
                                backlog = embed_idle(&mut index);
                                continue;
                            }
                            Err(std_mpsc::TryRecvError::Disconnected) => break,
                        }
                    } else {
                        match rx.recv() {
                            Ok(job) => job,
                            Err(_) => break,
                        }
                    };
                    let result = if let Some(result) = tiers_call(&files, ages, &job.call) {
                        // The index follows a move at once (stats, the dashboard).
                        if let (Ok(index), Ok(_)) = (&mut index, &result)
                            && job.call.tool != "memory__config"
                        {
                            resync(index, &dir);
                        }
                        result
                    } else if let Some(result) = write(&files, &job.call) {
                        result
                    } else {
                        match &mut index {
                            Ok(index) => {
                                if !embedder_tried {
                                    embedder_tried = true;
                                    load_embedder(index);
                                }
                                backlog = true;
                                run(index, &dir, &job.call)
                            }
                            Err(e) => Err(ToolError::internal(format!(
                                "memory search is off: the index did not open ({e}); \
                                 `flockctl memory rebuild` makes it again"
                            ))),
                        }
                    };
                    (job.reply)(result);
                }
            })
            .map_err(|e| format!("start the memory thread: {e}"))?;
        Ok(MemoryService { tx })
    }

    /// Runs `call`; `reply` gets the JSON or text result, or a coded error.
    pub fn call(&self, call: Call, reply: Reply) {
        let job = Job { call, reply };
        if let Err(std_mpsc::SendError(job)) = self.tx.send(job) {
            (job.reply)(Err(ToolError::internal("the memory thread has stopped")));
        }
    }
}

/// The longest `memory_remember` text (characters): remember the gist.
pub const REMEMBER_CHARS: usize = 2_000;
/// The longest observation, reflection or knowledge document an agent may have written
/// (characters): far over what the memory roles are asked for, a bound on a hostile caller.
pub const DOCUMENT_CHARS: usize = 32_000;
/// The most observations one reflection may mark reflected.
pub const REFLECT_IDS: usize = 2_000;

/// A write, if `call` is one: `None` for the searches.
fn write(files: &Files, call: &Call) -> Option<Result<String, ToolError>> {
    let writes = [
        "memory_remember",
        "knowledge_append",
        "memory__journal",
        "memory__observe",
        "memory__reflect",
        "memory__dream",
    ];
    if !writes.contains(&call.tool.as_str()) {
        return None;
    }
    let args: Value = match serde_json::from_str(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => return Some(Err(ToolError::bad_request("arguments are not a JSON object"))),
    };
    let (now, key, caller) = (unix_ms_now(), call.key.as_str(), call.caller.as_str());
    let io = |e: std::io::Error| ToolError::internal(format!("memory not written: {e}"));
    let text = |field: &str, max: usize| -> Result<String, ToolError> {
        let t = args[field].as_str().unwrap_or_default().trim();
        if t.chars().count() > max {
            return Err(ToolError::bad_request(format!(
                "`{field}` is over {max} characters: keep the gist"
            )));
        }
        Ok(t.to_owned())
    };
    let result = (|| match call.tool.as_str() {
        "memory_remember" => {
            let text = text("text", REMEMBER_CHARS)?;
            if let Some(why) = degenerate(&text) {
                return Err(ToolError::bad_request(format!(
                    "`text` is {why}: write what to remember"
                )));
            }
            let priority = match args["priority"].as_str().unwrap_or("medium") {
                p @ ("high" | "medium" | "low") => p,
                other => {
                    return Err(ToolError::bad_request(format!(
                        "`priority` is high, medium or low, not `{other}`"
                    )));
                }
            };
            let category = args["category"].as_str().unwrap_or_default();
            if !category.is_empty() && !flock_memory::records::CATEGORIES.contains(&category) {
                return Err(ToolError::bad_request(format!(
                    "`category` is one of {}",
                    flock_memory::records::CATEGORIES.join(", ")
                )));
            }
            let tag = Some((priority, category));
            Ok(match files.append_observation_tagged(now, key, Some(caller), &text, tag) {
                Ok(true) => format!(
                    "remembered ({priority}{}), id {key}",
                    if category.is_empty() { String::new() } else { format!(", {category}") }
                ),
                Ok(false) => format!("already remembered, id {key}"),
                Err(e) => return Err(io(e)),
            })
        }
        "knowledge_append" => {
            let text = text("text", REMEMBER_CHARS)?;
            if let Some(why) = degenerate(&text) {
                return Err(ToolError::bad_request(format!("`text` is {why}: write what to add")));
            }
            let topic = args["topic"].as_str().unwrap_or_default().trim();
            if topic.is_empty() || topic.chars().count() > 80 {
                return Err(ToolError::bad_request("`topic` is a short title (1–80 characters)"));
            }
            let path = files.merge_knowledge(now, &format!("# {topic}\n\n{text}")).map_err(io)?;
            Ok(format!("merged into knowledge/{}", file_name(&path)))
        }
        "memory__journal" => {
            let field = |f: &str| args[f].as_str().unwrap_or_default();
            let (request, done, result) = (field("request"), field("done"), field("result"));
            let written = files.append_journal(now, key, caller, request, done, result);
            once(written.map_err(io)?, "journaled", "already journaled")
        }
        "memory__observe" => {
            let text = text("text", DOCUMENT_CHARS)?;
            if text.is_empty() {
                return Err(ToolError::bad_request("`text` is empty: nothing to observe"));
            }
            let about = args["about"].as_str().filter(|a| !a.is_empty());
            let priority =
                args["priority"].as_str().filter(|p| ["high", "medium", "low"].contains(p));
            let category = args["category"].as_str().unwrap_or_default();
            let category =
                if flock_memory::records::CATEGORIES.contains(&category) { category } else { "" };
            let tag = priority.map(|p| (p, category));
            let written = files.append_observation_tagged(now, key, about, &text, tag);
            once(written.map_err(io)?, "observation appended", "observation already there")
        }
        "memory__reflect" => {
            let text = text("text", DOCUMENT_CHARS)?;
            if text.is_empty() {
                return Err(ToolError::bad_request("`text` is empty: nothing reflected"));
            }
            let ids: Vec<String> = args["ids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect();
            if ids.is_empty() || ids.len() > REFLECT_IDS {
                return Err(ToolError::bad_request(format!(
                    "`ids` names the observations the reflection read (1–{REFLECT_IDS})"
                )));
            }
            files.append_reflection(now, key, &text).map_err(io)?;
            let marked = files.mark_reflected(now, &ids).map_err(io)?;
            Ok(json!({"marked": marked}).to_string())
        }
        "memory__dream" => {
            let document = text("document", DOCUMENT_CHARS)?;
            if document.is_empty() {
                return Err(ToolError::bad_request("`document` is empty"));
            }
            let path = files.merge_knowledge(now, &document).map_err(io)?;
            Ok(format!("knowledge merged into knowledge/{}", file_name(&path)))
        }
        other => Err(ToolError::bad_request(format!("`{other}` is not a memory write"))),
    })();
    Some(result)
}

/// The answer to a write made once per key: `new` when it was written now, `old` when an entry
/// with its key was there already (a replayed turn).
fn once(written: bool, new: &str, old: &str) -> Result<String, ToolError> {
    Ok(if written { new } else { old }.to_owned())
}

fn file_name(path: &std::path::Path) -> String {
    path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned()
}

/// Brings the index in step with the files, and `active_memory.md` with the index.
fn resync(index: &mut Index, dir: &std::path::Path) {
    match index.sync() {
        Ok(_) => refresh_active_memory(index, dir),
        Err(e) => tracing::warn!(error = %e, "flock: memory index failed to sync"),
    }
}

/// The tier moves, if `call` is one: `memory__ttl {}` (the daily job) and `memory__archive
/// {to, from?, since?, until?, older_than_days?, dry_run?}`.
fn tiers_call(files: &Files, ages: Ages, call: &Call) -> Option<Result<String, ToolError>> {
    let io = |e: std::io::Error| ToolError::internal(format!("memory files: {e}"));
    match call.tool.as_str() {
        "memory__ttl" => Some(
            tiers::ttl(files, today(), ages).map(|t| ttl_json(&t, ages).to_string()).map_err(io),
        ),
        "memory__archive" => Some((|| {
            let args: Value = serde_json::from_str(&call.arguments)
                .map_err(|e| ToolError::bad_request(format!("arguments are not JSON: {e}")))?;
            let from: Vec<String> = args["from"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect();
            let ask = tiers::Ask {
                to: args["to"].as_str().unwrap_or_default(),
                from: &from,
                since: args["since"].as_str(),
                until: args["until"].as_str(),
                older_than_days: args["older_than_days"].as_u64().map(|n| n.min(36_500) as u32),
            };
            let (pick, to) = Pick::ask(&ask, today(), ages).map_err(ToolError::bad_request)?;
            let dry_run = args["dry_run"].as_bool().unwrap_or(false);
            let moved = tiers::move_days(files, &pick, to, dry_run).map_err(io)?;
            Ok(moved_json(&moved, dry_run).to_string())
        })()),
        "memory__config" => Some(Ok(config_json(files.dir(), ages).to_string())),
        _ => None,
    }
}

/// `flockctl memory config`: where the memory lives and when its files move.
pub fn config_json(dir: &std::path::Path, ages: Ages) -> Value {
    json!({
        "dir": dir.display().to_string(),
        "tiers": {
            "warm_after_days": ages.warm_after_days,
            "cold_after_days": ages.cold_after_days,
            "hot": "journals/, observations/, reflections/, knowledge/",
            "warm": "warm/",
            "cold": "cold/ (searched only with --all; a person approves each move there)",
        },
        "active_memory_tokens": ACTIVE_MEMORY_CHARS / 4,
    })
}

/// A move as the tools answer it: `{to, dry_run, files: [{from, to}], records, skipped: [{file,
/// why}]}`.
pub fn moved_json(m: &Moved, dry_run: bool) -> Value {
    json!({
        "to": m.to.as_str(),
        "dry_run": dry_run,
        "files": m.files.iter().map(|(from, to)| json!({"from": from, "to": to})).collect::<Vec<_>>(),
        "records": m.records,
        "skipped": m.skipped.iter().map(|(file, why)| json!({"file": file, "why": why})).collect::<Vec<_>>(),
    })
}

/// A run of the TTL job: `{to_warm: <a move>, cold_due: {until, first, files, records,
/// cold_after_days} | null}`.
pub fn ttl_json(t: &Ttl, ages: Ages) -> Value {
    let due = t.cold_due.as_ref().map(|d| {
        json!({"until": d.until, "first": d.first, "files": d.files, "records": d.records,
               "cold_after_days": ages.cold_after_days})
    });
    json!({"to_warm": moved_json(&t.to_warm, false), "cold_due": due})
}

/// The warm files up to `until` that a person approved for cold: the arguments of
/// `memory__archive` that move them.
pub fn approved_cold_move(until: &str) -> String {
    json!({"to": Tier::Cold.as_str(), "from": [Tier::Warm.as_str()], "until": until}).to_string()
}

/// Passages (sentences) embedded per call at most, newest first (~84 a second on 2 cores: about
/// 0.1 s), so what was written just before a search has its vectors; a backlog (a memory dir
/// indexed before the model was fetched, or re-embedded after an index layout change) is worked
/// off between calls ([`EMBED_WHEN_IDLE`]), never holding up a search.
const EMBED_PER_CALL: usize = 8;
/// Passages embedded at a time while the memory thread is idle (~50 ms on 2 cores: the most a
/// call that arrives meanwhile waits).
const EMBED_WHEN_IDLE: usize = 4;

/// Embeds a few records that have no vectors yet; whether any were left.
fn embed_idle(index: &mut Result<Index, String>) -> bool {
    let Ok(index) = index else { return false };
    match index.embed_pending(EMBED_WHEN_IDLE) {
        Ok(n) => n > 0,
        Err(e) => {
            tracing::warn!(error = %e, "flock: memory vectors not computed");
            false
        }
    }
}

/// Gives the index the embedding model if `scripts/setup` fetched it; words only otherwise.
fn load_embedder(index: &mut Index) {
    let loaded = index.use_installed_embedder();
    if let Some(why) = loaded.words_only_because() {
        match loaded {
            flock_memory::Embedding::Failed(_) => {
                tracing::warn!("flock: memory search by words only: {why}")
            }
            _ => tracing::info!("flock: memory search by words only: {why}"),
        }
    }
}

/// `active_memory.md` of the memory dir, at most this many characters (about 4 000 tokens).
pub const ACTIVE_MEMORY_CHARS: usize = 16_000;

/// Rewrites `active_memory.md` from the index (temp file + rename: a reader sees the old file or
/// the new one). This thread is its only writer.
fn refresh_active_memory(index: &Index, dir: &std::path::Path) {
    let path = dir.join("active_memory.md");
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    // Rewritten (with a new time in its header) only when what it holds changed.
    let stamp = |text: &str| {
        text.lines().find_map(|l| l.strip_prefix("> Last updated: ")).unwrap_or("").to_owned()
    };
    let built = |updated: &str| index.active_memory(today(), ACTIVE_MEMORY_CHARS, updated);
    match built(&stamp(&old)) {
        Ok(same) if same == old => return,
        Ok(_) => {}
        Err(e) => return tracing::warn!(error = %e, "flock: active memory not built"),
    }
    let now = jiff::Timestamp::now().strftime("%Y-%m-%d %H:%M UTC").to_string();
    let text = match built(&now) {
        Ok(t) => t,
        Err(e) => return tracing::warn!(error = %e, "flock: active memory not built"),
    };
    let tmp = dir.join(".active_memory.md.tmp");
    if let Err(e) = std::fs::write(&tmp, &text).and_then(|()| std::fs::rename(&tmp, &path)) {
        tracing::warn!(path = %path.display(), error = %e, "flock: active memory not written");
    }
}

/// The `kinds` a call names, checked.
fn kinds_of(args: &Value) -> Result<Vec<Kind>, ToolError> {
    let mut kinds = Vec::new();
    for k in args["kinds"].as_array().into_iter().flatten() {
        let name = k.as_str().unwrap_or_default();
        kinds.push(Kind::parse(name).ok_or_else(|| {
            ToolError::bad_request(format!(
                "no memory kind `{name}`; kinds: journal, observation, reflection, knowledge"
            ))
        })?);
    }
    Ok(kinds)
}

/// The priority, category and dates a call names, checked.
fn filter_of(args: &Value) -> Result<Filter, ToolError> {
    let field = |k: &str| args[k].as_str();
    Filter::parse(field("priority"), field("category"), field("since"), field("until"))
        .map_err(ToolError::bad_request)
}

/// Hits as the tools answer them: each record with its tier and score.
fn hits_json(hits: &[flock_memory::index::Hit]) -> String {
    let hits: Vec<Value> = hits
        .iter()
        .map(|h| {
            let mut v = record_json(&h.record);
            v["tier"] = json!(h.tier);
            v["score"] = json!((h.score * 1000.0).round() / 1000.0);
            v
        })
        .collect();
    json!({"hits": hits}).to_string()
}

fn run(index: &mut Index, dir: &std::path::Path, call: &Call) -> Result<String, ToolError> {
    let (tool, arguments) = (call.tool.as_str(), call.arguments.as_str());
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
            // A model reads a few; the operator's `flockctl memory search --limit` up to 1 000.
            let max_hits = if call.caller == flock_ipc::OPERATOR { 1000 } else { 20 };
            let kinds = kinds_of(&args)?;
            let query = Query {
                text,
                limit: args["limit"].as_u64().map_or(5, |l| l.clamp(1, max_hits) as usize),
                all: args["all"].as_bool().unwrap_or(false),
                kinds,
                agent: args["agent"].as_str().filter(|a| !a.is_empty()),
                today: today(),
                mode: match args["mode"].as_str().unwrap_or("hybrid") {
                    "hybrid" => Mode::Hybrid,
                    "bm25" => Mode::Bm25,
                    "vector" => Mode::Vector,
                    other => {
                        return Err(ToolError::bad_request(format!(
                            "no search mode `{other}`; modes: hybrid, bm25, vector"
                        )));
                    }
                },
                // The unconscious's recall asks for clear matches only.
                precise: args["precise"].as_bool().unwrap_or(false),
                filter: filter_of(&args)?,
            };
            let hits = index.search(&query).map_err(|e| ToolError::internal(e.to_string()))?;
            Ok(hits_json(&hits))
        }
        // The dashboard's memory view (the operator's only: not in the tool table).
        "memory__recent" => {
            let limit = args["limit"].as_u64().map_or(50, |l| l.clamp(1, 500) as usize);
            let (kinds, filter) = (kinds_of(&args)?, filter_of(&args)?);
            let hits = index
                .recent(limit, &kinds, &filter)
                .map_err(|e| ToolError::internal(e.to_string()))?;
            Ok(hits_json(&hits))
        }
        "memory__stats" => {
            let s = index.stats().map_err(|e| ToolError::internal(e.to_string()))?;
            let counts = |v: &[(String, u64)]| {
                v.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>()
            };
            Ok(json!({
                "files": s.files,
                "kinds": counts(&s.by_kind),
                "tiers": counts(&s.by_tier),
                "index_bytes": s.index_bytes,
                "texts": s.texts,
                "embedded": s.embedded,
                "by_meaning": index.by_meaning(),
            })
            .to_string())
        }
        "memory_get" => {
            let id = args["id"].as_str().ok_or(ToolError::bad_request("`id` is required"))?;
            match index.get(id).map_err(|e| ToolError::internal(e.to_string()))? {
                Some(r) => Ok(record_json(&r).to_string()),
                None => Err(ToolError::bad_request(format!(
                    "no memory with id `{id}` (a search lists ids: memory_search; for a person, \
                     `flockctl memory search WORDS`)"
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str, caller: &str, key: &str, arguments: &str) -> Call {
        Call {
            tool: tool.into(),
            arguments: arguments.into(),
            caller: caller.into(),
            key: key.into(),
        }
    }

    #[test]
    fn active_memory_is_rewritten_with_a_new_time_only_when_what_it_holds_changed() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let remember = |key: &str, text: &str| {
            let args = json!({"text": text, "priority": "high"}).to_string();
            write(&files, &call("memory_remember", "w", key, &args)).unwrap().unwrap();
        };
        remember("k1", "Ana ships on Fridays.");
        let mut index = Index::open(dir.path()).unwrap();
        index.sync().unwrap();
        refresh_active_memory(&index, dir.path());
        let path = dir.path().join("active_memory.md");
        let first = std::fs::read_to_string(&path).unwrap();
        assert!(first.contains("> Last updated: 20") && first.contains("Ana ships"), "{first}");
        // Nothing new: the file (and the time it gives) stays as it is.
        let old = first.replace(
            &first.lines().find(|l| l.starts_with("> Last updated:")).unwrap().to_owned(),
            "> Last updated: 2000-01-01 00:00 UTC",
        );
        std::fs::write(&path, &old).unwrap();
        refresh_active_memory(&index, dir.path());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), old);
        // Something new: rebuilt, and dated now.
        remember("k2", "Ben prefers tea.");
        index.sync().unwrap();
        refresh_active_memory(&index, dir.path());
        let now = std::fs::read_to_string(&path).unwrap();
        assert!(now.contains("Ben prefers tea") && !now.contains("2000-01-01"), "{now}");
        assert!(now.contains("> Records: 2 (2 observations,"), "{now}");
    }

    #[test]
    fn a_write_is_filed_under_the_caller_once_per_call_and_refuses_what_it_cannot_keep() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let w = |c: Call| write(&files, &c).expect("a write");
        // The caller's name comes from its connection: an `agent` in the arguments is ignored.
        let args = r#"{"text": "Ana chose Postgres for billing.", "priority": "high", "category": "decision", "agent": "sysadmin"}"#;
        let first = w(call("memory_remember", "w", "k7", args)).unwrap();
        assert!(first.starts_with("remembered (high, decision)"), "{first}");
        // The same call of a replayed turn (same derived id): nothing new.
        let again = w(call("memory_remember", "w", "k7", args)).unwrap();
        assert!(again.starts_with("already remembered"), "{again}");
        let obs = std::fs::read_dir(dir.path().join("observations")).unwrap().next().unwrap();
        let text = std::fs::read_to_string(obs.unwrap().path()).unwrap();
        assert_eq!(text.matches("Ana chose Postgres").count(), 1, "{text}");
        assert!(text.contains("<!-- priority: high; category: decision; agent: w -->"), "{text}");
        assert!(!text.contains("sysadmin"), "{text}");
        for (bad, why) in [
            (r#"{"text": "x", "priority": "urgent"}"#, "`priority`"),
            (r#"{"text": "x", "category": "gossip"}"#, "`category`"),
            (r#"{"text": "  "}"#, "empty"),
            ("[1, 2]", "JSON object"),
        ] {
            let err = w(call("memory_remember", "w", "k8", bad)).unwrap_err();
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
        let long = format!(r#"{{"text": "{}"}}"#, "word ".repeat(REMEMBER_CHARS));
        let err = w(call("memory_remember", "w", "k8", &long)).unwrap_err();
        assert!(err.to_string().contains("over 2000 characters"), "{err}");
        let k = w(call(
            "knowledge_append",
            "w",
            "k9",
            r#"{"topic": "Deploys", "text": "Blue-green."}"#,
        ));
        assert_eq!(k.unwrap(), "merged into knowledge/deploys.md");
        let k = w(call(
            "knowledge_append",
            "w",
            "k10",
            r#"{"topic": "Deploys", "text": "Keep two images."}"#,
        ));
        assert!(k.is_ok());
        let doc = std::fs::read_to_string(dir.path().join("knowledge/deploys.md")).unwrap();
        assert!(doc.contains("Blue-green.") && doc.contains("Keep two images."), "{doc}");
        // Searches are not writes.
        assert!(write(&files, &call("memory_search", "w", "k11", "{}")).is_none());
    }

    #[test]
    fn the_runtime_writes_journal_observe_reflect_and_dream() {
        let dir = tempfile::tempdir().unwrap();
        let files = Files::new(dir.path());
        let w = |c: Call| write(&files, &c).expect("a write");
        let j = r#"{"request": "add two numbers", "done": "tools: (none)", "result": "4"}"#;
        assert_eq!(w(call("memory__journal", "dev", "t1", j)).unwrap(), "journaled");
        assert_eq!(w(call("memory__journal", "dev", "t1", j)).unwrap(), "already journaled");
        let journal = std::fs::read_dir(dir.path().join("journals")).unwrap().next().unwrap();
        let line = std::fs::read_to_string(journal.unwrap().path()).unwrap();
        assert!(
            line.contains("| add two numbers | tools: (none) | 4 <!-- id: t1; agent: dev -->"),
            "{line}"
        );
        let o = r#"{"text": "Dev added two numbers.", "about": "dev", "priority": "low"}"#;
        assert_eq!(
            w(call("memory__observe", "observer", "o1", o)).unwrap(),
            "observation appended"
        );
        let o2 = r#"{"text": "Dev likes tea."}"#;
        assert_eq!(
            w(call("memory__observe", "observer", "o2", o2)).unwrap(),
            "observation appended"
        );
        assert_eq!(files.unreflected().unwrap().len(), 2);
        let r = &json!({"text": "### Patterns\n- dev does arithmetic", "ids": ["o1"]}).to_string();
        assert_eq!(w(call("memory__reflect", "reflection", "r1", r)).unwrap(), r#"{"marked":1}"#);
        let left: Vec<String> = files.unreflected().unwrap().into_iter().map(|o| o.id).collect();
        assert_eq!(left, ["o2"]);
        let err = w(call("memory__reflect", "reflection", "r2", r#"{"text": "x", "ids": []}"#));
        assert!(err.unwrap_err().to_string().contains("`ids`"));
        let d = &json!({"document": "# Arithmetic\n\nDev adds numbers."}).to_string();
        let done = w(call("memory__dream", "dream", "d1", d)).unwrap();
        assert_eq!(done, "knowledge merged into knowledge/arithmetic.md");
        let huge = format!(r#"{{"document": "{}"}}"#, "a".repeat(DOCUMENT_CHARS + 1));
        assert!(w(call("memory__dream", "dream", "d2", &huge)).is_err());
    }
}
