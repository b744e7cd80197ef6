//! An agent is a child subreaper: orphans of what it runs are reparented to it. The reaper must
//! reap them all, and never the children the agent waits for itself.
//! (Its own test binary: it makes the whole test process a subreaper.)

use std::time::{Duration, Instant};

use flock_sandbox::children;

fn zombie_children() -> Vec<i32> {
    let me = std::process::id().to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let rest: Vec<&str> = stat[stat.rfind(')').unwrap() + 1..].split_whitespace().collect();
        if rest[0] == "Z" && rest[1] == me {
            out.push(pid);
        }
    }
    out
}

/// Runs a shell script as an owned child and waits for it.
async fn sh(script: &str) {
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args(["-c", script]);
    let (mut child, _owned) = children::spawn(&mut cmd).unwrap();
    assert!(child.wait().await.unwrap().success(), "{script}");
}

async fn until_no_zombies_but(keep: Option<u32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<i32> =
            zombie_children().into_iter().filter(|p| Some(*p as u32) != keep).collect();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "zombies left: {left:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// One test (one process, run in order): the subreaper setting and the reaper are process-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orphans_are_reaped_and_owned_children_keep_their_exit_status() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();

    // A child the caller owns, which exits at once and is waited for only at the end.
    let mut cmd = tokio::process::Command::new("sh");
    cmd.args(["-c", "exit 3"]);
    let (mut owned, guard) = children::spawn(&mut cmd).unwrap();

    // Fifty orphans: each shell starts a short sleep in the background and exits; the sleeps
    // are reparented to this process and die as zombies.
    for _ in 0..50 {
        sh("(sleep 0.1) & exit 0").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = zombie_children().len();
    assert!(before >= 50, "the orphans are zombies until reaped ({before})");
    let reaped = children::reap_orphans();
    assert_eq!(reaped, 50, "exactly the orphans were reaped");
    until_no_zombies_but(owned.id()).await;

    // The owned child was not stolen: its owner still gets its exit status.
    let status = owned.wait().await.unwrap();
    assert_eq!(status.code(), Some(3));
    drop(guard);

    // In the background, on SIGCHLD: a shell that leaves 300 orphans behind, as hostile code
    // in an agent would, leaves no zombie.
    let _reaper = children::spawn_reaper().unwrap();
    sh("i=0; while [ $i -lt 300 ]; do (exit 0) & i=$((i+1)); done; exit 0").await;
    until_no_zombies_but(None).await;
}
