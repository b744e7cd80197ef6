//! Processes: running a command with a deadline, asking whether a pid is still alive, and finding
//! the processes that belong to one swarm (by the router socket in their environment).

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Runs `cmd` to completion (stdin closed, output captured); panics if it takes over `timeout`.
#[track_caller]
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    match try_run(cmd, timeout) {
        Ok(out) => out,
        Err(e) => panic!("{e}"),
    }
}

/// [`run`] without panicking: a spawn failure or a timeout (the command is then killed) is `Err`.
pub fn try_run(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("cannot spawn {cmd:?}: {e}"))?;
    let readers = [child.stdout.take().map(drain), child.stderr.take().map(drain)];
    let status = match wait_timeout(&mut child, timeout) {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{cmd:?} did not finish within {timeout:?}; killed it"));
        }
    };
    let [stdout, stderr] =
        readers.map(|r| r.map(|h| h.join().unwrap_or_default()).unwrap_or_default());
    Ok(Output { status, stdout, stderr })
}

fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// Waits for `child` to exit, at most `timeout`; `None` if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

/// Whether `pid` names a live process (a zombie counts as dead: it has exited, only its parent
/// has not collected the status yet).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) S ...`: the state follows the last `)` (comm may contain one).
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Live processes of this user whose environment contains `entry` (e.g.
/// `FLOCK_SOCKET=/tmp/…/run/router.sock`, which names exactly the agents of one swarm).
pub fn pids_with_env(entry: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for d in dir.flatten() {
        let Some(pid) = d.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if env.split(|b| *b == 0).any(|var| var == entry.as_bytes()) && alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Sends `signal` to `pid`; false if there is no such process.
pub fn signal(pid: u32, signal: Signal) -> bool {
    kill(Pid::from_raw(pid as i32), signal).is_ok()
}
