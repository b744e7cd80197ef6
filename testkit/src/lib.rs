//! `flock-testkit`: what tests (and benchmarks) need to drive the *real* Flock binaries — a
//! [`Swarm`] fixture that runs `flock-supervisor up` in a private state dir and cleans up every
//! process it caused, deadline-bound polling ([`wait_for`], [`Swarm::wait_until`]) instead of
//! sleeps, raw wire access ([`raw`]) for feeding the router bytes no well-behaved client sends,
//! and fake LLM providers speaking the real HTTP wire formats ([`fake_llm`]).
//!
//! It holds no product logic: it only starts processes, reads their outputs and speaks the wire
//! format through `flock-ipc`.

pub mod fake_discord;
pub mod fake_llm;
pub mod fake_slack;
pub mod fake_telegram;
mod http1;
pub mod nats;
pub mod net;
pub mod proc;
pub mod pty;
pub mod raw;
mod swarm;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use proc::{alive, run, try_run};
pub use swarm::{Swarm, SwarmBuilder};

/// The binaries every end-to-end test needs.
pub const BINARIES: [&str; 4] = ["flock-supervisor", "flockctl", "flock-agent", "flock-bridge"];

/// How often [`wait_for`] and [`Swarm::wait_until`] re-check their condition.
pub const POLL: Duration = Duration::from_millis(20);

/// The folder holding the Flock binaries: `$FLOCK_BIN_DIR`, else the cargo profile folder this
/// test executable was built into (`target/<profile>/deps/<test>` → `target/<profile>`).
///
/// Panics with instructions when a binary is missing: `cargo test` does not build the binaries of
/// other packages, so they must be built first.
pub fn bin_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("FLOCK_BIN_DIR") {
            Some(d) if !d.is_empty() => PathBuf::from(d),
            _ => {
                let exe = std::env::current_exe().expect("locate the test executable");
                let deps = exe.parent().expect("the test executable has a folder");
                // Test executables live in `<profile>/deps`; examples and benches one level up.
                if deps.file_name().is_some_and(|n| n == "deps") {
                    deps.parent().expect("deps has a parent").to_path_buf()
                } else {
                    deps.to_path_buf()
                }
            }
        };
        for name in BINARIES {
            let path = dir.join(name);
            assert!(
                path.is_file(),
                "{} not found: run `cargo build --workspace --bins` first (scripts/test does), \
                 or point FLOCK_BIN_DIR at the folder holding {}",
                path.display(),
                BINARIES.join(", ")
            );
        }
        dir
    })
}

/// Path of one Flock binary (see [`bin_dir`]).
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// The repository root (for tests that use the shipped examples).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit lives in the workspace").into()
}

/// Polls `cond` every [`POLL`] until it holds; panics naming `what` after `timeout`.
///
/// [`Swarm::wait_until`] is the same with the swarm's state added to the panic message.
#[track_caller]
pub fn wait_for(mut cond: impl FnMut() -> bool, timeout: Duration, what: &str) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        std::thread::sleep(POLL);
    }
}

/// Counts the lines of `text` containing every one of `needles`.
pub fn count_lines(text: &str, needles: &[&str]) -> usize {
    text.lines().filter(|l| needles.iter().all(|n| l.contains(n))).count()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Blocks on `changed` until `cond` holds for the value behind `mutex` (`Ok`, still locked) or
/// `timeout` passes (`Err`, locked, for the failure message). The fakes' `wait_*` helpers.
pub(crate) fn wait_on<'a, T>(
    mutex: &'a std::sync::Mutex<T>,
    changed: &std::sync::Condvar,
    timeout: Duration,
    cond: impl Fn(&T) -> bool,
) -> Result<std::sync::MutexGuard<'a, T>, std::sync::MutexGuard<'a, T>> {
    let deadline = Instant::now() + timeout;
    let mut guard = mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        if cond(&guard) {
            return Ok(guard);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(guard);
        }
        guard = match changed.wait_timeout(guard, deadline - now) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

/// `n` random characters from `alphabet`.
pub(crate) fn random_string(n: usize, alphabet: &[u8]) -> String {
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let mut out = String::with_capacity(n);
    let mut counter = 0u64;
    while out.len() < n {
        let mut hasher = state.build_hasher();
        hasher.write_u64(counter);
        counter += 1;
        let mut bits = hasher.finish();
        for _ in 0..8 {
            if out.len() == n {
                break;
            }
            let i = usize::try_from(bits % alphabet.len() as u64).unwrap_or(0);
            out.push(char::from(alphabet[i]));
            bits /= alphabet.len() as u64;
        }
    }
    out
}
