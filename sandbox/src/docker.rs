//! The Docker backend: the same [`Policy`] enforced by a container instead of the native helper.
//!
//! The image (`flock-sandbox:2`) is built on this machine from its own files by
//! `scripts/sandbox-image` (no registry: nothing is pulled). Each command runs in a fresh
//! container with no network (unless granted), a read-only root, the workspace as its one
//! writable bind mount at `/workspace`, a private size-bounded `/tmp`, every capability dropped,
//! `no-new-privileges`, memory/CPU/process limits, file-size and CPU ulimits, and a seccomp
//! profile with the native filter's rules. The container is removed afterwards; the workspace's
//! growth is watched like the native backend's.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptions, KillContainerOptions, LogsOptions, RemoveContainerOptions,
    WaitContainerOptions,
};
use futures_util::StreamExt;

use crate::helper::{WORKSPACE, disk_usage, hand_over};
use crate::{Captured, Output, Policy, ROOT_SANDBOX_UID, Status};

/// The image the Docker backend runs (built by `scripts/sandbox-image`).
pub const IMAGE: &str = "flock-sandbox:2";
const MIB: i64 = 1024 * 1024;

/// Whether a Docker engine answers here (`Err`: why not, for a clear skip or error).
pub async fn engine() -> Result<Docker, String> {
    let docker =
        Docker::connect_with_unix_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| format!("the Docker engine does not answer: {e}"))?;
    docker.ping().await.map_err(|e| format!("the Docker engine does not answer: {e}"))?;
    Ok(docker)
}

/// Runs `policy.command` in a container; the same contract as [`crate::run`].
pub async fn run(policy: &Policy, timeout: Duration, cap: usize) -> std::io::Result<Output> {
    let started = Instant::now();
    let failed = |why: String| Output {
        status: Status::SetupFailed(format!("flock-sandbox (docker): {why}")),
        stdout: Captured::default(),
        stderr: Captured::default(),
        elapsed: started.elapsed(),
    };
    if !policy.workspace.is_absolute() || !policy.workspace.is_dir() {
        let ws = policy.workspace.display();
        return Ok(failed(format!("the workspace {ws} is not an existing folder")));
    }
    let docker = match engine().await {
        Ok(d) => d,
        Err(e) => return Ok(failed(e)),
    };
    if docker.inspect_image(IMAGE).await.is_err() {
        return Ok(failed(format!(
            "the image {IMAGE} is not built here; run scripts/sandbox-image (it builds it from \
             this machine's files, no registry)"
        )));
    }
    let root = nix::unistd::Uid::effective().is_root();
    let (uid, gid) = if root {
        (ROOT_SANDBOX_UID, ROOT_SANDBOX_UID)
    } else {
        (nix::unistd::Uid::effective().as_raw(), nix::unistd::Gid::effective().as_raw())
    };
    if root && let Err(e) = hand_over(&policy.workspace, uid, gid) {
        return Ok(failed(e));
    }
    let baseline = disk_usage(&policy.workspace);
    let l = &policy.limits;
    let ulimit = |name: &str, soft: i64, hard: i64| ResourcesUlimits {
        name: Some(name.into()),
        soft: Some(soft),
        hard: Some(hard),
    };
    let mut binds = vec![format!("{}:{WORKSPACE}:rw", policy.workspace.display())];
    binds.extend(policy.read_only.iter().map(|p| format!("{0}:{0}:ro", p.display())));
    let host = HostConfig {
        network_mode: Some(if policy.network { "bridge" } else { "none" }.into()),
        readonly_rootfs: Some(true),
        binds: Some(binds),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec![
            "no-new-privileges".into(),
            format!("seccomp={}", crate::seccomp::docker_profile()),
        ]),
        memory: Some(l.memory_mib as i64 * MIB),
        memory_swap: Some(l.memory_mib as i64 * MIB),
        nano_cpus: Some(1_000_000_000),
        pids_limit: Some(l.processes as i64),
        tmpfs: Some(HashMap::from([(
            "/tmp".to_string(),
            format!("rw,nosuid,nodev,size={}m,mode=1777", l.tmp_mib.max(1)),
        )])),
        ulimits: Some(vec![
            ulimit("cpu", l.cpu_secs as i64, l.cpu_secs as i64 + 1),
            ulimit("fsize", l.file_mib as i64 * MIB, l.file_mib as i64 * MIB),
            ulimit("nofile", 1024, 1024),
            ulimit("core", 0, 0),
        ]),
        ..Default::default()
    };
    let mut env = vec![
        "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
        format!("HOME={WORKSPACE}"),
        "TMPDIR=/tmp".into(),
        "LANG=C.UTF-8".into(),
        "USER=flock".into(),
    ];
    env.extend(policy.env.iter().map(|(k, v)| format!("{k}={v}")));
    let body = ContainerCreateBody {
        image: Some(IMAGE.into()),
        cmd: Some(vec!["/bin/sh".into(), "-c".into(), policy.command.clone()]),
        working_dir: Some(WORKSPACE.into()),
        user: Some(format!("{uid}:{gid}")),
        env: Some(env),
        hostname: Some("flock-sandbox".into()),
        network_disabled: Some(!policy.network),
        labels: Some(HashMap::from([("flock.sandbox".to_string(), "1".to_string())])),
        host_config: Some(host),
        ..Default::default()
    };
    let id = match docker.create_container(None::<CreateContainerOptions>, body).await {
        Ok(c) => c.id,
        Err(e) => return Ok(failed(format!("cannot create the container: {e}"))),
    };
    let outcome = supervise(&docker, &id, policy, timeout, baseline).await;
    let (stdout, mut stderr) = logs(&docker, &id, cap).await;
    let _ = docker
        .remove_container(&id, Some(RemoveContainerOptions { force: true, ..Default::default() }))
        .await;
    let status = match outcome {
        Err(e) => return Ok(failed(e)),
        Ok(Watched::TimedOut) => Status::TimedOut,
        Ok(Watched::OverQuota) => {
            stderr.text.push_str(&format!(
                "flock-sandbox: killed: the workspace grew by more than its {} MiB quota\n",
                l.disk_mib
            ));
            Status::Signaled(9)
        }
        Ok(Watched::Exited(code)) if code > 128 && code < 128 + 65 => {
            Status::Signaled(code as i32 - 128)
        }
        Ok(Watched::Exited(code)) => Status::Exited(code as i32),
    };
    Ok(Output { status, stdout, stderr, elapsed: started.elapsed() })
}

enum Watched {
    Exited(i64),
    TimedOut,
    OverQuota,
}

/// Starts the container and waits for it: its exit, the timeout, or the disk quota.
async fn supervise(
    docker: &Docker,
    id: &str,
    policy: &Policy,
    timeout: Duration,
    baseline: u64,
) -> Result<Watched, String> {
    docker
        .start_container(id, None)
        .await
        .map_err(|e| format!("cannot start the container: {e}"))?;
    let deadline = tokio::time::Instant::now() + timeout;
    let quota = policy.limits.disk_mib * 1024 * 1024;
    let mut wait = docker.wait_container(id, None::<WaitContainerOptions>);
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let kill = || docker.kill_container(id, None::<KillContainerOptions>);
    loop {
        tokio::select! {
            r = wait.next() => {
                return match r {
                    Some(Ok(w)) => Ok(Watched::Exited(w.status_code)),
                    // A non-zero exit arrives as an error carrying the code.
                    Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                        Ok(Watched::Exited(code))
                    }
                    Some(Err(e)) => Err(format!("waiting for the container: {e}")),
                    None => Err("the container's wait ended without a status".into()),
                };
            }
            _ = tokio::time::sleep_until(deadline) => {
                let _ = kill().await;
                return Ok(Watched::TimedOut);
            }
            _ = tick.tick() => {
                if disk_usage(&policy.workspace).saturating_sub(baseline) > quota {
                    let _ = kill().await;
                    return Ok(Watched::OverQuota);
                }
            }
        }
    }
}

/// The container's output, bounded like the native backend's.
async fn logs(docker: &Docker, id: &str, cap: usize) -> (Captured, Captured) {
    let opts = LogsOptions { stdout: true, stderr: true, ..Default::default() };
    let mut stream = docker.logs(id, Some(opts));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let (mut out_total, mut err_total) = (0u64, 0u64);
    while let Some(Ok(chunk)) = stream.next().await {
        let (buf, total) = match &chunk {
            bollard::container::LogOutput::StdErr { .. } => (&mut err, &mut err_total),
            _ => (&mut out, &mut out_total),
        };
        let bytes = chunk.into_bytes();
        *total += bytes.len() as u64;
        buf.extend_from_slice(&bytes);
        // Keep memory bounded: the head, and a tail window twice the cap.
        if buf.len() > 4 * cap.max(1) {
            let keep_head = cap / 2;
            let tail_from = buf.len() - cap;
            let mut trimmed = buf[..keep_head].to_vec();
            trimmed.extend_from_slice(&buf[tail_from..]);
            *buf = trimmed;
        }
    }
    (bounded(&out, out_total, cap), bounded(&err, err_total, cap))
}

fn bounded(kept: &[u8], total: u64, cap: usize) -> Captured {
    if total as usize <= cap && kept.len() as u64 == total {
        return Captured { text: String::from_utf8_lossy(kept).into_owned(), omitted: 0 };
    }
    let half = cap / 2;
    let head = &kept[..half.min(kept.len())];
    let tail = &kept[kept.len().saturating_sub(cap - half)..];
    let omitted = total.saturating_sub((head.len() + tail.len()) as u64);
    let mut text = String::from_utf8_lossy(head).into_owned();
    text.push_str(&format!("\n… {omitted} bytes left out …\n"));
    text.push_str(&String::from_utf8_lossy(tail));
    Captured { text, omitted }
}
