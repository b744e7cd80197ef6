//! `flockctl memory search` as a person runs it, end to end (process start, connection, search,
//! output): on a running swarm, answered by its memory thread with the index and the embedding
//! model warm (issue #29), and, as the baseline in the same run, with no swarm, where flockctl
//! opens the index and loads the model itself. The memory is 1 000 observations in 30 daily
//! files, embedded before the swarm starts (as a memory a swarm has been writing is).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use flock_memory::index::Index;
use serde_json::{Map, Value, json};

use super::fixture::{Bins, Swarm, bench_agent, swarm_yaml};
use crate::proto::percentile;

/// What a person asks: a topic and a word or two.
const QUERIES: [&str; 8] = [
    "what about the staging database?",
    "when is the dentist?",
    "who is the lawyer for the contract?",
    "the marathon training plan",
    "hotel for the flight",
    "latency of postgres",
    "the printer on the network",
    "invoice and budget review",
];

/// One `flockctl memory search` (hybrid, the default): its wall time and its output.
fn search(flockctl: &Path, state: &Path, query: &str) -> Result<(Duration, String)> {
    let t = Instant::now();
    let out = Command::new(flockctl)
        .args(["memory", "search", query, "--state-dir"])
        .arg(state)
        .output()?;
    let took = t.elapsed();
    if !out.status.success() {
        bail!("flockctl memory search failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok((took, String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

pub(super) async fn memory_cli(
    bins: &Bins,
    root: &Path,
    searches: usize,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let dir = root.join("memory-cli");
    let state = dir.join("state");
    let memory = state.join("memory");
    crate::memory::write_corpus(&memory, 1_000, 30)?;
    let Some(model) = flock_memory::embed::installed_dir() else {
        say!("memory search: skipped (no embedding model; scripts/setup fetches it)");
        return Ok(());
    };
    let embedder = flock_memory::embed::Embedder::load(&model).map_err(|e| anyhow!(e))?;
    let mut index = Index::open(&memory).map_err(|e| anyhow!(e))?;
    index.sync().map_err(|e| anyhow!(e))?;
    index.set_embedder(std::sync::Arc::new(embedder));
    let t = Instant::now();
    while index.embed_pending(256).map_err(|e| anyhow!(e))? > 0 {}
    say!("memory search: 1 000 observations embedded in {:.0} s", t.elapsed().as_secs_f64());
    drop(index);

    let flockctl = bins.supervisor.with_file_name("flockctl");
    let yaml = swarm_yaml("memory-cli", &[("sink".to_owned(), bench_agent(bins, "sink"))]);
    let mut swarm = Swarm::start(bins, &dir, &yaml)?;
    let (ctl, _) = swarm.wait_ready(1).await?;
    let (first, text) = search(&flockctl, &state, QUERIES[0])?;
    if !text.contains("(searched by the running swarm)") {
        bail!("the running swarm did not answer the search:\n{text}");
    }
    let mut warm = Vec::with_capacity(searches);
    for i in 0..searches {
        let (took, _) = search(&flockctl, &state, QUERIES[(i + 1) % QUERIES.len()])?;
        warm.push(took.as_micros() as u64);
    }
    warm.sort_unstable();
    swarm.down(Some(ctl)).await?;
    // The baseline: no swarm, flockctl loads the model for every search.
    let mut cold = Vec::new();
    for q in &QUERIES[..5] {
        let (took, text) = search(&flockctl, &state, q)?;
        if text.contains("running swarm") {
            bail!("a search with no swarm running was answered by one:\n{text}");
        }
        cold.push(took.as_micros() as u64);
    }
    cold.sort_unstable();
    let ms = |us: u64| (us as f64 / 100.0).round() / 10.0;
    out.insert("memory_cli_first_ms".into(), json!(millis(first)));
    out.insert("memory_cli_p50_ms".into(), json!(ms(percentile(&warm, 50.0))));
    out.insert("memory_cli_p95_ms".into(), json!(ms(percentile(&warm, 95.0))));
    out.insert("memory_cli_no_swarm_p50_ms".into(), json!(ms(percentile(&cold, 50.0))));
    Ok(())
}
