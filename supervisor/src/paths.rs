//! Where a swarm keeps its state: `--state-dir`, else `$FLOCK_HOME`, else `~/.flock`.
//!
//! ```text
//! <state>/flock.db                 SQLite store (mailboxes, counters)
//! <state>/run/ (0700)              router.sock, control.sock, supervisor.lock
//! <state>/logs/<agent>.log         per-agent logs (rotated: .1 .. .3), supervisor.log
//! <state>/workspaces/<agent>/      each agent's working directory
//! <state>/journal/journal.jsonl    the shared journal (rotated: journal.1.jsonl …)
//! ```

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    /// Resolves the state dir from a flag value, `FLOCK_HOME`, or the home directory.
    pub fn resolve(flag: Option<&Path>) -> Result<Self> {
        let root = match flag {
            Some(p) => p.to_path_buf(),
            None => match std::env::var_os("FLOCK_HOME") {
                Some(p) if !p.is_empty() => PathBuf::from(p),
                _ => {
                    let home = std::env::var_os("HOME").context(
                        "cannot find the state dir: neither --state-dir, FLOCK_HOME nor HOME is set",
                    )?;
                    PathBuf::from(home).join(".flock")
                }
            },
        };
        let root = if root.is_absolute() { root } else { std::env::current_dir()?.join(root) };
        Ok(StateDir { root })
    }

    /// Checks that a swarm's state is here, for the commands that only read (or add to) what a
    /// swarm left: a mistyped `--state-dir` is an error that names it, never a new empty folder.
    pub fn existing(&self) -> Result<()> {
        match std::fs::metadata(&self.root) {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => anyhow::bail!(
                "{} is a file, not a state dir: pass --state-dir DIR (or set FLOCK_HOME) to the \
                 folder `flock-supervisor up` made",
                self.root.display()
            ),
            Err(_) => anyhow::bail!(
                "no swarm state at {}: check --state-dir (or FLOCK_HOME); `flock-supervisor up` \
                 makes it when a swarm first starts",
                self.root.display()
            ),
        }
    }

    pub fn run_dir(&self) -> PathBuf {
        self.root.join("run")
    }
    pub fn router_socket(&self) -> PathBuf {
        self.run_dir().join("router.sock")
    }
    pub fn control_socket(&self) -> PathBuf {
        self.run_dir().join("control.sock")
    }
    pub fn lock_file(&self) -> PathBuf {
        self.run_dir().join("supervisor.lock")
    }
    pub fn db(&self) -> PathBuf {
        self.root.join("flock.db")
    }
    pub fn logs_dir(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn agent_log(&self, agent: &str) -> PathBuf {
        self.logs_dir().join(format!("{agent}.log"))
    }
    /// The shared journal (DESIGN.md §9): append-only JSONL, written by the supervisor and by
    /// `flockctl journal log`.
    pub fn journal_dir(&self) -> PathBuf {
        self.root.join("journal")
    }
    /// The swarm's shared memory files (brain-persona: journals, observations, reflections,
    /// knowledge).
    pub fn memory_dir(&self) -> PathBuf {
        self.root.join("memory")
    }
    pub fn workspaces(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    /// Creates the layout; the state dir and the run dir are 0700: only this user reaches the
    /// database, the logs and the sockets.
    pub fn create(&self) -> Result<()> {
        if self.root.exists() && !self.root.is_dir() {
            anyhow::bail!(
                "{} is a file, not a state dir: pass --state-dir DIR (or set FLOCK_HOME) to a \
                 folder (it is made if it does not exist)",
                self.root.display()
            );
        }
        // (The memory folder too: an agent's cage shows it at start, so it must be there.)
        for d in [self.root.clone(), self.logs_dir(), self.workspaces(), self.memory_dir()] {
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        }
        // The state dir itself too, in case it existed with wider permissions: nothing in it is
        // for other users.
        std::fs::set_permissions(&self.root, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 {}", self.root.display()))?;
        let run = self.run_dir();
        if !run.exists() {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&run)
                .with_context(|| format!("create {}", run.display()))?;
        }
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("chmod 0700 {}", run.display()))?;
        Ok(())
    }
}
