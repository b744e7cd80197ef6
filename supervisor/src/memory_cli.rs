//! `flockctl memory …`: the memory index, read and rebuilt from the files without a running
//! swarm (the index is SQLite in WAL mode: a running supervisor's memory thread and this command
//! may use it at the same time).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use flock_actors::memory::{config_json, moved_json, record_json};
use flock_memory::Kind;
use flock_memory::index::{Filter, Index, Mode, Query, today};
use flock_memory::tiers::{self, Ages, Pick};
use serde_json::{Value, json};

fn open(dir: &Path) -> Result<Index> {
    let mut index = Index::open(dir).map_err(|e| anyhow!(e))?;
    index.sync().map_err(|e| anyhow!(e))?;
    Ok(index)
}

/// Passages (sentences) `flockctl memory search` embeds before it searches, at most (~84 a
/// second on 2 cores: up to ~9 s; nothing once the supervisor has caught up).
const EMBED_PER_SEARCH: usize = 768;

/// The search mode a user names: `hybrid` (the default), `bm25` or `vector`.
pub fn mode(name: &str) -> Result<Mode> {
    Ok(match name {
        "hybrid" => Mode::Hybrid,
        "bm25" | "words" => Mode::Bm25,
        "vector" | "meaning" => Mode::Vector,
        other => bail!("no search mode `{other}`; modes: hybrid, bm25, vector"),
    })
}

/// What `memory search` was asked.
pub struct Search<'a> {
    pub text: &'a str,
    pub limit: usize,
    /// Cold records too.
    pub all: bool,
    /// Kind names (empty: every kind).
    pub kinds: &'a [String],
    pub mode: Mode,
    /// Only this agent's records.
    pub agent: Option<&'a str>,
    /// At least this priority, this category, these dates (as typed; checked by [`filter`]).
    pub priority: Option<&'a str>,
    pub category: Option<&'a str>,
    pub since: Option<&'a str>,
    pub until: Option<&'a str>,
}

/// The priority, category and dates a user named, checked.
fn filter(ask: &Search<'_>) -> Result<Filter> {
    Filter::parse(ask.priority, ask.category, ask.since, ask.until).map_err(|e| anyhow!(e))
}

/// What a search found: each hit as JSON (the record, its tier and score), how long the search
/// took, and where it ran.
pub struct Found {
    pub hits: Vec<Value>,
    pub took: Duration,
    /// A line on how it was searched (empty when there is nothing to say).
    pub note: String,
}

/// The kinds a user named, checked.
fn kinds(names: &[String]) -> Result<Vec<Kind>> {
    names
        .iter()
        .map(|k| {
            Kind::parse(k).ok_or_else(|| {
                anyhow!("no memory kind `{k}`; kinds: journal, observation, reflection, knowledge")
            })
        })
        .collect()
}

/// `memory search` as the arguments of the `memory_search` tool, for a running swarm's memory
/// thread (which holds the index and the embedding model warm).
pub fn arguments(ask: &Search<'_>) -> Result<String> {
    kinds(ask.kinds)?;
    filter(ask)?;
    let mode = match ask.mode {
        Mode::Hybrid => "hybrid",
        Mode::Bm25 => "bm25",
        Mode::Vector => "vector",
    };
    Ok(json!({
        "query": ask.text,
        "limit": ask.limit.clamp(1, 1000),
        "all": ask.all,
        "kinds": ask.kinds,
        "agent": ask.agent,
        "mode": mode,
        "priority": ask.priority,
        "category": ask.category,
        "since": ask.since,
        "until": ask.until,
    })
    .to_string())
}

/// A running swarm's answer to [`arguments`], which took `took` there and back.
pub fn found(answer: &str, took: Duration) -> Result<Found> {
    let v: Value = serde_json::from_str(answer)?;
    let hits = v["hits"].as_array().cloned().ok_or_else(|| anyhow!("no hits in {answer}"))?;
    Ok(Found { hits, took, note: "(searched by the running swarm)\n".into() })
}

/// `memory search QUERY` here, without a swarm: opens the index and loads the embedding model.
pub fn search_here(dir: &Path, ask: &Search<'_>) -> Result<Found> {
    let Search { text, limit, all, mode, agent, .. } = *ask;
    let kinds = kinds(ask.kinds)?;
    let mut index = open(dir)?;
    let mut note = String::new();
    if mode != Mode::Bm25 {
        let loaded = index.use_installed_embedder();
        if let flock_memory::Embedding::Failed(e) = &loaded {
            bail!("{e}");
        }
        match loaded.words_only_because() {
            Some(why) => note = format!("(by words only: {why})\n"),
            None => {
                index.embed_pending(EMBED_PER_SEARCH).map_err(|e| anyhow!(e))?;
            }
        }
    }
    let query = Query {
        text,
        limit: limit.clamp(1, 1000),
        all,
        kinds,
        agent,
        today: today(),
        mode,
        precise: false,
        filter: filter(ask)?,
    };
    let started = Instant::now();
    let hits = index.search(&query).map_err(|e| anyhow!(e))?;
    let took = started.elapsed();
    let hits = hits
        .iter()
        .map(|h| {
            let mut v = record_json(&h.record);
            v["tier"] = json!(h.tier);
            v["score"] = json!(h.score);
            v
        })
        .collect();
    Ok(Found { hits, took, note })
}

/// What `memory search` prints: a line per hit, best first, or the hits as JSON.
pub fn render(found: &Found, ask: &Search<'_>, as_json: bool) -> Result<String> {
    if as_json {
        return Ok(serde_json::to_string_pretty(&found.hits)? + "\n");
    }
    if found.hits.is_empty() {
        let scope = if ask.all { "" } else { " (cold records too: --all)" };
        let whose = ask.agent.map(|a| format!(" for agent `{a}`")).unwrap_or_default();
        return Ok(format!("nothing in memory matches `{}`{whose}{scope}\n", ask.text));
    }
    let mut out = String::new();
    for h in &found.hits {
        let field = |k: &str| h[k].as_str().unwrap_or_default().to_owned();
        let text: String = field("text").replace('\n', " ").chars().take(160).collect();
        let time = field("time");
        out.push_str(&format!(
            "{:.2}  {} {} {:<11} {:<6} {}  {}\n",
            h["score"].as_f64().unwrap_or_default(),
            field("date"),
            if time.is_empty() { "     " } else { &time },
            field("kind"),
            field("tier"),
            field("id"),
            text
        ));
    }
    out.push_str(&format!(
        "{} found in {:.1} ms\n{}",
        found.hits.len(),
        found.took.as_secs_f64() * 1e3,
        found.note
    ));
    Ok(out)
}

/// `memory show ID` here, without a swarm: the record as JSON.
pub fn show_here(dir: &Path, id: &str) -> Result<Value> {
    let index = open(dir)?;
    match index.get(id).map_err(|e| anyhow!(e))? {
        Some(r) => Ok(record_json(&r)),
        None => bail!("no memory with id `{id}`; `flockctl memory search WORDS` lists ids"),
    }
}

/// What `memory show` prints: one record in full, or as JSON.
pub fn render_record(r: &Value, as_json: bool) -> Result<String> {
    if as_json {
        return Ok(serde_json::to_string_pretty(r)? + "\n");
    }
    let field = |k: &str| r[k].as_str().unwrap_or_default();
    let category = match field("category") {
        "" => String::new(),
        c => format!(", {c}"),
    };
    let agent = match field("agent") {
        "" => String::new(),
        a => format!(", agent {a}"),
    };
    Ok(format!(
        "{} ({}, {} priority{category}{agent}) {} {}\nfrom {}\n\n{}\n",
        field("id"),
        field("kind"),
        field("priority"),
        field("date"),
        field("time"),
        field("path"),
        field("text")
    ))
}

/// `memory stats`: records per kind and tier, files, index size.
pub fn stats(dir: &Path, as_json: bool) -> Result<String> {
    let index = open(dir)?;
    let s = index.stats().map_err(|e| anyhow!(e))?;
    if as_json {
        let v = json!({
            "files": s.files,
            "kinds": s.by_kind.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "tiers": s.by_tier.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "index_bytes": s.index_bytes,
            "texts": s.texts,
            "embedded": s.embedded,
        });
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let list = |v: &[(String, u64)]| {
        v.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    };
    Ok(format!(
        "{} files in {}\nrecords: {}\ntiers: {}\nby meaning: {}\nindex: {:.1} KiB\n",
        s.files,
        dir.display(),
        if s.by_kind.is_empty() { "none yet".into() } else { list(&s.by_kind) },
        list(&s.by_tier),
        embedded(s.embedded, s.texts),
        s.index_bytes as f64 / 1024.0
    ))
}

/// How far the embedding of `texts` has come, for a person: the backlog of a memory written
/// while no swarm (or a swarm without search by meaning) ran is embedded in the background.
pub fn embedded(embedded: u64, texts: u64) -> String {
    if embedded >= texts {
        return format!("all {texts} texts embedded");
    }
    format!(
        "{embedded} of {texts} texts embedded ({}%); a running swarm with search by meaning \
         embeds the rest in the background, newest first",
        embedded * 100 / texts
    )
}

/// `memory export`: every record that passes, newest first, one JSON object a line.
pub fn export(dir: &Path, kind_names: &[String], filter: &Filter) -> Result<String> {
    let kinds = kinds(kind_names)?;
    let index = open(dir)?;
    let mut out = String::new();
    for h in index.export(&kinds, filter).map_err(|e| anyhow!(e))? {
        let mut v = record_json(&h.record);
        v["tier"] = json!(h.tier);
        out.push_str(&v.to_string());
        out.push('\n');
    }
    Ok(out)
}

/// `memory rebuild`: the index from the files, from scratch.
pub fn rebuild(dir: &Path) -> Result<String> {
    let started = Instant::now();
    let mut index = Index::open(dir).map_err(|e| anyhow!(e))?;
    let done = index.rebuild().map_err(|e| anyhow!(e))?;
    Ok(format!(
        "rebuilt the memory index from {} files: {} records in {:.2} s\n",
        done.files_read,
        done.records,
        started.elapsed().as_secs_f64()
    ))
}

/// What `memory archive` asks the running swarm's memory thread (`memory__archive`).
pub fn archive_arguments(ask: &tiers::Ask<'_>, dry_run: bool) -> String {
    json!({
        "to": ask.to,
        "from": ask.from,
        "since": ask.since,
        "until": ask.until,
        "older_than_days": ask.older_than_days,
        "dry_run": dry_run,
    })
    .to_string()
}

/// `memory archive` with no swarm running: the files moved here, under the memory lock, with
/// the default ages (a swarm's own `memory.tiers` apply when it runs).
pub fn archive_here(dir: &Path, ask: &tiers::Ask<'_>, dry_run: bool) -> Result<String> {
    let (pick, to) = Pick::ask(ask, today(), Ages::default()).map_err(|e| anyhow!(e))?;
    let memory = flock_memory::files::Memory::new(dir);
    let moved = tiers::move_days(&memory, &pick, to, dry_run)
        .map_err(|e| anyhow!("move memory files in {}: {e}", dir.display()))?;
    Ok(moved_json(&moved, dry_run).to_string())
}

/// A move, for a person (or `--json`: the answer as it came).
pub fn render_moved(answer: &str, as_json: bool, here: bool) -> Result<String> {
    let v: Value = serde_json::from_str(answer)?;
    if as_json {
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let to = v["to"].as_str().unwrap_or_default();
    let files = v["files"].as_array().cloned().unwrap_or_default();
    let skipped = v["skipped"].as_array().cloned().unwrap_or_default();
    let mut out = if files.is_empty() {
        format!("no day file to move to {to}\n")
    } else if v["dry_run"].as_bool() == Some(true) {
        format!(
            "would move {} day files ({} records) to {to} (dry run: nothing moved)\n",
            files.len(),
            v["records"]
        )
    } else {
        format!("moved {} day files ({} records) to {to}\n", files.len(), v["records"])
    };
    for f in &files {
        out += &format!(
            "  {} -> {}\n",
            f["from"].as_str().unwrap_or(""),
            f["to"].as_str().unwrap_or("")
        );
    }
    if !skipped.is_empty() {
        out += &format!("left where they are ({}):\n", skipped.len());
        for f in &skipped {
            out += &format!(
                "  {}: {}\n",
                f["file"].as_str().unwrap_or(""),
                f["why"].as_str().unwrap_or("")
            );
        }
    }
    if here && v["dry_run"].as_bool() != Some(true) && !files.is_empty() {
        out += "(no swarm running: moved here, with the default ages)\n";
    }
    Ok(out)
}

/// `memory config` with no swarm running: the defaults.
pub fn config_here(dir: &Path) -> String {
    config_json(dir, Ages::default()).to_string()
}

/// `memory config`, for a person (or `--json`).
pub fn render_config(answer: &str, as_json: bool, here: bool) -> Result<String> {
    let mut v: Value = serde_json::from_str(answer)?;
    v["from"] = json!(if here { "defaults (no swarm running)" } else { "the running swarm" });
    if as_json {
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let t = &v["tiers"];
    Ok(format!(
        "memory dir: {}\nhot:  {} (what agents read; active memory is built from it)\nwarm: {} \
         (hot day files move here after {} days, on their own)\ncold: {} — due after {} days\n\
         active memory: at most ~{} tokens\nsettings: {} (set them in the swarm file: \
         memory.tiers.warm_after_days, memory.tiers.cold_after_days)\n",
        v["dir"].as_str().unwrap_or(""),
        t["hot"].as_str().unwrap_or(""),
        t["warm"].as_str().unwrap_or(""),
        t["warm_after_days"],
        t["cold"].as_str().unwrap_or(""),
        t["cold_after_days"],
        v["active_memory_tokens"],
        v["from"].as_str().unwrap_or(""),
    ))
}
