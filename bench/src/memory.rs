//! The memory figures (issue #10): an index of 100 000 observations built from its files
//! (rebuild time), then search latency p50/p95 over 200 queries, against a baseline measured in
//! the same run: a plain scan of the same files for the query's words (what recall did before the
//! index, without its ranking). The corpus is synthetic: 34 topic words and a Zipf-distributed
//! vocabulary of 5 000, twelve words per observation, so common words match tens of thousands of
//! records, as in real memory.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, anyhow};
use std::sync::Arc;

use flock_memory::embed::Embedder;
use flock_memory::index::{Index, Mode, Query};
use flock_memory::records::{date_of, days_of};
use serde_json::{Map, Value, json};

use crate::proto::percentile;

const WORDS: &[&str] = &[
    "deploy",
    "staging",
    "database",
    "backup",
    "invoice",
    "meeting",
    "dentist",
    "report",
    "budget",
    "release",
    "review",
    "kafka",
    "postgres",
    "latency",
    "customer",
    "travel",
    "flight",
    "hotel",
    "garden",
    "recipe",
    "training",
    "marathon",
    "doctor",
    "insurance",
    "contract",
    "lawyer",
    "roadmap",
    "hiring",
    "interview",
    "laptop",
    "printer",
    "network",
    "router",
    "firewall",
];

/// Words of a Zipf-distributed vocabulary of 5 000 (`w17`…), as in real text a few words are
/// everywhere and most are rare.
struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    fn new(n: usize) -> Zipf {
        let mut total = 0.0;
        let cumulative = (0..n)
            .map(|r| {
                total += 1.0 / (r as f64 + 1.0);
                total
            })
            .collect();
        Zipf { cumulative }
    }

    fn word(&self, rng: &mut fastrand::Rng) -> String {
        let x = rng.f64() * self.cumulative.last().copied().unwrap_or(1.0);
        format!("w{}", self.cumulative.partition_point(|&c| c < x))
    }
}

/// `n` observations over `days` daily files, deterministic (seeded): two topic words and ten
/// words of the Zipf vocabulary each, in three sentences (as the observer writes them: three
/// passages, three vectors a record).
pub(crate) fn write_corpus(dir: &Path, n: usize, days: usize) -> Result<()> {
    let mut rng = fastrand::Rng::with_seed(10);
    let zipf = Zipf::new(5_000);
    let folder = dir.join("observations");
    std::fs::create_dir_all(&folder)?;
    let per_day = n.div_ceil(days);
    let start = days_of("2026-11-25").ok_or_else(|| anyhow!("date"))? - days as i64;
    let mut written = 0;
    for d in 0..days {
        let date = date_of(start + d as i64);
        let mut text = String::new();
        for i in 0..per_day.min(n - written) {
            let mut words: Vec<String> =
                (0..2).map(|_| WORDS[rng.usize(..WORDS.len())].to_owned()).collect();
            words.extend((0..10).map(|_| zipf.word(&mut rng)));
            let prio = ["low", "medium", "high"][rng.usize(..3)];
            text.push_str(&format!(
                "## {:02}:{:02}\nAna noted {}. It was about {}. Later {} came up, number {}.\n<!-- id: b{d}-{i} -->\n<!-- priority: {prio} -->\n---\n\n",
                i / 60 % 24,
                i % 60,
                words[..4].join(" "),
                words[4..8].join(" "),
                words[8..].join(" "),
                rng.u32(..1_000_000)
            ));
        }
        written += per_day.min(n - written);
        std::fs::write(folder.join(format!("{date}.md")), text)?;
    }
    Ok(())
}

/// The old recall: read every file, keep entries sharing a word with the query.
fn scan(dir: &Path, words: &[&str]) -> Result<usize> {
    let mut found = 0;
    for entry in std::fs::read_dir(dir.join("observations"))? {
        let text = std::fs::read_to_string(entry?.path())?;
        found += text.split("\n## ").filter(|e| words.iter().any(|w| e.contains(w))).count();
    }
    Ok(found)
}

/// How the records get their vectors before the searches are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vectors {
    /// Random unit vectors, one per passage (a scan's cost does not depend on their values).
    Imported,
    /// Embedded by the model through the index's own background path (`embed_pending`), with
    /// progress and the throughput reported (`flock-bench --only memory_real`).
    Embedded,
}

pub fn run(root: &Path, n: usize, vectors: Vectors, out: &mut Map<String, Value>) -> Result<()> {
    let dir = root.join("memory-bench");
    let _ = std::fs::remove_dir_all(&dir);
    write_corpus(&dir, n, 400)?;
    let t = Instant::now();
    let mut index = Index::open(&dir).map_err(|e| anyhow!(e))?;
    let synced = index.rebuild().map_err(|e| anyhow!(e))?;
    out.insert("memory_records".into(), json!(synced.records));
    out.insert("memory_rebuild_ms".into(), json!(t.elapsed().as_millis() as u64));
    // Embedding throughput on a sample of real records; the search is then timed over 100 000
    // vectors: imported as random unit vectors (a scan's cost does not depend on their values,
    // and embedding 100 000 records of ~60 tokens takes ~40–50 minutes on 2 cores), or
    // embedded for real (`Vectors::Embedded`).
    let embedder = flock_memory::embed::installed_dir()
        .map(|d| Embedder::load(&d).map_err(|e| anyhow!(e)))
        .transpose()?;
    if let Some(e) = embedder {
        let e = Arc::new(e);
        let sample: Vec<String> = std::fs::read_to_string(
            std::fs::read_dir(dir.join("observations"))?
                .next()
                .ok_or_else(|| anyhow!("no file"))??
                .path(),
        )?
        .split("\n## ")
        .take(256)
        .map(str::to_owned)
        .collect();
        // As the index embeds: each record's passages, 16 to a batch.
        let passages: Vec<&str> =
            sample.iter().flat_map(|r| flock_memory::index::passages(r)).collect();
        let t = Instant::now();
        for chunk in passages.chunks(16) {
            e.embed(chunk).map_err(|e| anyhow!(e))?;
        }
        let secs = t.elapsed().as_secs_f64();
        out.insert("memory_embed_per_sec".into(), json!((sample.len() as f64 / secs).round()));
        out.insert(
            "memory_embed_passages_per_sec".into(),
            json!((passages.len() as f64 / secs).round()),
        );
        let t = Instant::now();
        for q in ["what about the staging database?", "when is the dentist?", "who is the lawyer?"]
        {
            e.embed(&[q]).map_err(|e| anyhow!(e))?;
        }
        out.insert(
            "memory_embed_query_ms".into(),
            json!((t.elapsed().as_secs_f64() * 1000.0 / 3.0).round()),
        );
        if vectors == Vectors::Embedded {
            embed_all(&mut index, e, out)?;
        } else {
            let mut vrng = fastrand::Rng::with_seed(12);
            index
                .import_vectors(|text| {
                    // One random unit vector per passage, as many as the index would embed.
                    let mut all = Vec::new();
                    for _ in flock_memory::index::passages(text) {
                        let v: Vec<f32> =
                            (0..flock_memory::embed::DIM).map(|_| vrng.f32() - 0.5).collect();
                        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
                        all.extend(v.into_iter().map(|x| x / n));
                    }
                    all
                })
                .map_err(|e| anyhow!(e))?;
            index.set_embedder(e);
        }
    }
    let today = days_of("2026-11-25").ok_or_else(|| anyhow!("date"))?;
    let mut rng = fastrand::Rng::with_seed(11);
    let zipf = Zipf::new(5_000);
    let mut samples: [Vec<u64>; 3] = Default::default();
    for i in 0..200 {
        // A topic word and one to three others, as a question would have.
        let mut words = vec![WORDS[rng.usize(..WORDS.len())].to_owned()];
        words.extend((0..1 + i % 3).map(|_| zipf.word(&mut rng)));
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let text = format!("what about the {}?", words.join(" and "));
        for (k, mode) in [Mode::Bm25, Mode::Hybrid].into_iter().enumerate() {
            let q = Query {
                text: &text,
                limit: 10,
                all: false,
                kinds: Vec::new(),
                agent: None,
                today,
                mode,
                precise: false,
                filter: Default::default(),
            };
            let t = Instant::now();
            std::hint::black_box(index.search(&q).map_err(|e| anyhow!(e))?);
            samples[k].push(t.elapsed().as_nanos() as u64);
        }
        if i < 20 {
            let t = Instant::now();
            std::hint::black_box(scan(&dir, &words)?);
            samples[2].push(t.elapsed().as_nanos() as u64);
        }
    }
    for (key, s) in ["memory_search", "memory_hybrid", "memory_scan"].iter().zip(samples.iter_mut())
    {
        s.sort_unstable();
        for p in [50.0, 95.0] {
            let ms = percentile(s, p) as f64 / 1e6;
            out.insert(format!("{key}_p{p:.0}_ms"), json!((ms * 100.0).round() / 100.0));
        }
    }
    out.insert("memory_rss_kib".into(), json!(rss_kib()));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Embeds every record through the index (`embed_pending`, as a running swarm's memory thread
/// does in the background), saying how far it has come every 30 s; records the throughput.
fn embed_all(index: &mut Index, e: Arc<Embedder>, out: &mut Map<String, Value>) -> Result<()> {
    index.set_embedder(e);
    let total = index.stats().map_err(|e| anyhow!(e))?.texts;
    let t = Instant::now();
    let mut said = Instant::now();
    let mut done = 0u64;
    loop {
        let n = index.embed_pending(256).map_err(|e| anyhow!(e))? as u64;
        if n == 0 {
            break;
        }
        done += n;
        if said.elapsed().as_secs() >= 30 {
            said = Instant::now();
            let rate = done as f64 / t.elapsed().as_secs_f64();
            let left = total.saturating_sub(done) as f64 / rate.max(0.001);
            eprintln!(
                "flock-bench: memory: {done} of {total} texts embedded ({:.0} a second; ~{:.0} min left)",
                rate,
                left / 60.0
            );
        }
    }
    let secs = t.elapsed().as_secs_f64();
    out.insert("memory_embedded_texts".into(), json!(done));
    out.insert("memory_embed_all_s".into(), json!(secs.round()));
    out.insert("memory_embed_all_per_sec".into(), json!((done as f64 / secs).round()));
    Ok(())
}

/// This process's resident memory (the vectors are held in it).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmRSS:").map(|v| v.trim().trim_end_matches(" kB").trim().to_owned())
            })
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
