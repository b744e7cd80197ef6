//! `flockctl memory …`: the memory index, read and rebuilt from the files without a running
//! swarm (the index is SQLite in WAL mode: a running supervisor's memory thread and this command
//! may use it at the same time).

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use flock_actors::memory::record_json;
use flock_memory::Kind;
use flock_memory::index::{Index, Mode, Query, today};
use serde_json::json;

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
}

/// `memory search QUERY`: the best records, best first.
pub fn search(dir: &Path, ask: &Search<'_>, as_json: bool) -> Result<String> {
    let Search { text, limit, all, mode, agent, .. } = *ask;
    let kinds = ask
        .kinds
        .iter()
        .map(|k| {
            Kind::parse(k).ok_or_else(|| {
                anyhow!("no memory kind `{k}`; kinds: journal, observation, reflection, knowledge")
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut index = open(dir)?;
    let mut note = String::new();
    if mode != Mode::Bm25 {
        match flock_memory::embed::installed_dir() {
            Some(model) => {
                let embedder =
                    flock_memory::embed::Embedder::load(&model).map_err(|e| anyhow!(e))?;
                index.set_embedder(std::sync::Arc::new(embedder));
                index.embed_pending(EMBED_PER_SEARCH).map_err(|e| anyhow!(e))?;
            }
            None => note = "(by words only: no embedding model; scripts/setup fetches it)\n".into(),
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
    };
    let started = Instant::now();
    let hits = index.search(&query).map_err(|e| anyhow!(e))?;
    let took = started.elapsed();
    if as_json {
        let v: Vec<_> = hits
            .iter()
            .map(|h| {
                let mut v = record_json(&h.record);
                v["tier"] = json!(h.tier);
                v["score"] = json!(h.score);
                v
            })
            .collect();
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    if hits.is_empty() {
        let scope = if all { "" } else { " (cold records too: --all)" };
        let whose = agent.map(|a| format!(" for agent `{a}`")).unwrap_or_default();
        return Ok(format!("nothing in memory matches `{text}`{whose}{scope}\n"));
    }
    let mut out = String::new();
    for h in &hits {
        let r = &h.record;
        let text: String = r.text.replace('\n', " ").chars().take(160).collect();
        out.push_str(&format!(
            "{:.2}  {} {} {:<11} {:<6} {}  {}\n",
            h.score,
            r.date,
            if r.time.is_empty() { "     " } else { &r.time },
            r.kind.as_str(),
            h.tier,
            r.id,
            text
        ));
    }
    out.push_str(&format!("{} found in {:.1} ms\n{note}", hits.len(), took.as_secs_f64() * 1e3));
    Ok(out)
}

/// `memory show ID`: one record in full.
pub fn show(dir: &Path, id: &str, as_json: bool) -> Result<String> {
    let index = open(dir)?;
    let Some(r) = index.get(id).map_err(|e| anyhow!(e))? else {
        bail!("no memory with id `{id}`; `flockctl memory search WORDS` lists ids");
    };
    if as_json {
        return Ok(serde_json::to_string_pretty(&record_json(&r))? + "\n");
    }
    let category = if r.category.is_empty() { String::new() } else { format!(", {}", r.category) };
    let agent = if r.agent.is_empty() { String::new() } else { format!(", agent {}", r.agent) };
    Ok(format!(
        "{} ({}, {} priority{category}{agent}) {} {}\nfrom {}\n\n{}\n",
        r.id,
        r.kind.as_str(),
        r.priority.as_str(),
        r.date,
        r.time,
        r.path,
        r.text
    ))
}

/// `memory stats`: records per kind and tier, files, index size.
pub fn stats(dir: &Path, as_json: bool) -> Result<String> {
    let index = open(dir)?;
    let s = index.stats(today()).map_err(|e| anyhow!(e))?;
    if as_json {
        let v = json!({
            "files": s.files,
            "kinds": s.by_kind.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "tiers": s.by_tier.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>(),
            "index_bytes": s.index_bytes,
        });
        return Ok(serde_json::to_string_pretty(&v)? + "\n");
    }
    let list = |v: &[(String, u64)]| {
        v.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", ")
    };
    Ok(format!(
        "{} files in {}\nrecords: {}\ntiers: {}\nindex: {:.1} KiB\n",
        s.files,
        dir.display(),
        if s.by_kind.is_empty() { "none yet".into() } else { list(&s.by_kind) },
        list(&s.by_tier),
        s.index_bytes as f64 / 1024.0
    ))
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
