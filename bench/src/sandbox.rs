//! The sandbox figures (issue #11): `exec` of `true` through each backend against a plain
//! fork+exec of `sh -c true` measured in the same run, and the workspace tools' 4 KiB read and
//! write against `std::fs` on the same folder.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Map, Value, json};

use crate::proto::percentile;

fn micros(samples: &mut [u64], p: f64) -> f64 {
    samples.sort_unstable();
    percentile(samples, p) as f64 / 1000.0
}

/// Times `n` runs of `f`: `{key}_p50_us` and `{key}_p95_us` into `out`.
async fn timed<F, Fut>(out: &mut Map<String, Value>, key: &str, n: usize, mut f: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await?;
        samples.push(t.elapsed().as_nanos() as u64);
    }
    for p in [50.0, 95.0] {
        let us = (micros(&mut samples, p) * 10.0).round() / 10.0;
        out.insert(format!("{key}_p{p:.0}_us"), json!(us));
    }
    Ok(())
}

pub async fn run(
    helper: &Path,
    root: &Path,
    runs: usize,
    out: &mut Map<String, Value>,
) -> Result<()> {
    let ws = root.join("sandbox-workspace");
    std::fs::create_dir_all(&ws)?;
    let policy = flock_sandbox::Policy::new(&ws, "true");
    let limit = Duration::from_secs(30);

    timed(out, "exec_baseline", runs, || async {
        let s = tokio::process::Command::new("/bin/sh").args(["-c", "true"]).status().await?;
        if !s.success() {
            bail!("sh -c true failed");
        }
        Ok(())
    })
    .await?;
    timed(out, "exec_native", runs, || async {
        let o = flock_sandbox::run(helper, &policy, limit, 4096).await?;
        if !o.success() {
            bail!("exec true in the native sandbox: {:?} {}", o.status, o.stderr.text);
        }
        Ok(())
    })
    .await?;
    match flock_sandbox::docker::engine().await {
        Ok(_) => {
            timed(out, "exec_docker", runs.min(30), || async {
                let o = flock_sandbox::docker::run(&policy, limit, 4096).await?;
                if !o.success() {
                    bail!("exec true in the docker sandbox: {:?} {}", o.status, o.stderr.text);
                }
                Ok(())
            })
            .await?
        }
        Err(why) => {
            out.insert("exec_docker_skipped".into(), json!(why));
        }
    }

    // The workspace tools (openat2 RESOLVE_BENEATH, atomic write) against std::fs.
    let tools = flock_agent::workspace::Workspace::open(&ws)?;
    let content = "x".repeat(4096);
    let n = runs * 20;
    timed(out, "fs_write_4k", n, || async {
        if !tools.write("bench/file.txt", &content).ok {
            bail!("fs_write failed");
        }
        Ok(())
    })
    .await?;
    timed(out, "fs_read_4k", n, || async {
        if !tools.read("bench/file.txt").ok {
            bail!("fs_read failed");
        }
        Ok(())
    })
    .await?;
    let plain = ws.join("bench/plain.txt");
    timed(out, "std_write_4k", n, || async {
        std::fs::write(&plain, &content)?;
        Ok(())
    })
    .await?;
    timed(out, "std_read_4k", n, || async {
        std::fs::read_to_string(&plain)?;
        Ok(())
    })
    .await?;
    Ok(())
}
