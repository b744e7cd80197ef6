//! The journal's files: appends under the lock, rotation, and reads (newest first, or filtered).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::ops::ControlFlow;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, MutexGuard};

use crate::event::{JournalEvent, Status};
use crate::schema::validate_line;
use crate::{
    CHUNK_BYTES, FILE_NAME, JournalError, KEEP_ROTATED, LOCK_FILE_NAME, MAX_EVENT_BYTES, io_err,
};

/// Events appended by this process (see [`crate::appended_total`]).
pub(crate) static APPENDED: AtomicU64 = AtomicU64::new(0);

/// A line that was not a valid event and was left out of a read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedLine {
    pub file: PathBuf,
    /// Byte offset of the line's first byte in `file`.
    pub offset: u64,
    /// True for a last line with no trailing newline (a writer died mid-append).
    pub torn: bool,
    pub reason: String,
}

/// Events read (oldest first) and the damaged lines met on the way.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadOutcome {
    pub events: Vec<JournalEvent>,
    /// Lines skipped among those scanned (a read that stops early does not see older ones).
    pub skipped: Vec<SkippedLine>,
}

/// Which events [`Journal::query`] returns; every `Some` must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    pub agent: Option<String>,
    pub action_type: Option<String>,
    pub status: Option<Status>,
    /// Inclusive lower bound, compared as strings with `timestamp` (a prefix such as
    /// `2026-11-21` works: the fixed format sorts like time).
    pub since: Option<String>,
    /// Exclusive upper bound, compared the same way (`until=2026-11-22` means before that day).
    pub until: Option<String>,
    pub correlation_id: Option<String>,
    /// Keep only the newest `limit` matches.
    pub limit: Option<usize>,
}

impl Filter {
    pub fn matches(&self, e: &JournalEvent) -> bool {
        self.agent.as_ref().is_none_or(|a| *a == e.agent)
            && self.action_type.as_ref().is_none_or(|t| *t == e.action.kind)
            && self.status.is_none_or(|s| s == e.status)
            && self.since.as_ref().is_none_or(|s| e.timestamp.as_str() >= s.as_str())
            && self.until.as_ref().is_none_or(|u| e.timestamp.as_str() < u.as_str())
            && self
                .correlation_id
                .as_ref()
                .is_none_or(|c| e.trace.correlation_id.as_deref() == Some(c.as_str()))
    }
}

/// A journal directory. Cheap to open; holds one descriptor on the lock file. Open one per
/// process (or several: each has its own lock descriptor, so they exclude each other too).
pub struct Journal {
    dir: PathBuf,
    max_bytes: u64,
    /// flock(2) locks belong to an open file description, which the threads of this `Journal`
    /// share; the mutex makes them take turns before asking the kernel.
    lock: Mutex<File>,
    /// Where a copy of every appended line goes (a host's journal copied to the swarm's leader).
    copy: std::sync::OnceLock<CopyHook>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .field("copied", &self.copy.get().is_some())
            .finish_non_exhaustive()
    }
}

/// Takes the lines a journal appended (each a valid event), after they are written.
pub type CopyHook = Box<dyn Fn(&[String]) + Send + Sync>;

/// Holds the flock until dropped (then the mutex).
struct LockGuard<'a> {
    file: MutexGuard<'a, File>,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

impl Journal {
    /// Opens (creating if needed) the journal in `dir`; the current file rotates once it exceeds
    /// `max_bytes` ([`DEFAULT_MAX_BYTES`] is the usual value).
    pub fn open(dir: impl AsRef<Path>, max_bytes: u64) -> Result<Journal, JournalError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(io_err("create journal directory", &dir))?;
        let lock_path = dir.join(LOCK_FILE_NAME);
        let lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock_path)
            .map_err(io_err("open journal lock", &lock_path))?;
        Ok(Journal {
            dir,
            max_bytes: max_bytes.max(1),
            lock: Mutex::new(lock),
            copy: std::sync::OnceLock::new(),
        })
    }

    /// From now on every line this journal appends is also handed to `hook` (once set, kept).
    pub fn copy_to(&self, hook: CopyHook) {
        let _ = self.copy.set(hook);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The current file.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Rotated file `i` (1 = newest).
    pub fn rotated_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("journal.{i}.jsonl"))
    }

    /// Every file that may hold events, newest first.
    pub(crate) fn files_newest_first(&self) -> Vec<PathBuf> {
        std::iter::once(self.current_path())
            .chain((1..=KEEP_ROTATED).map(|i| self.rotated_path(i)))
            .collect()
    }

    fn lock(&self, exclusive: bool) -> Result<LockGuard<'_>, JournalError> {
        let file = self.lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let locked = if exclusive { file.lock() } else { file.lock_shared() };
        locked.map_err(io_err("lock", &self.dir.join(LOCK_FILE_NAME)))?;
        Ok(LockGuard { file })
    }

    /// Appends one event (checked against the schema first; an invalid event writes nothing),
    /// then rotates if the current file has grown past `max_bytes`.
    pub fn append(&self, event: &JournalEvent) -> Result<(), JournalError> {
        self.append_all(std::slice::from_ref(event))
    }

    /// Appends several events under one lock and in one `write` (each checked first: if any is
    /// invalid, nothing is written), then rotates if needed.
    pub fn append_all(&self, events: &[JournalEvent]) -> Result<(), JournalError> {
        let mut lines = Vec::new();
        let mut copied = Vec::new();
        for event in events {
            let line = event.to_line();
            validate_line(&line).map_err(JournalError::Invalid)?;
            if line.len() > MAX_EVENT_BYTES {
                return Err(JournalError::Invalid(format!(
                    "the event is {} bytes, more than the {MAX_EVENT_BYTES}-byte limit; put large \
                     content in a file and name it in result.artifacts",
                    line.len()
                )));
            }
            lines.extend_from_slice(line.as_bytes());
            lines.push(b'\n');
            if self.copy.get().is_some() {
                copied.push(line);
            }
        }
        if lines.is_empty() {
            return Ok(());
        }

        let _guard = self.lock(true)?;
        let path = self.current_path();
        // Opened per append, under the lock: after another process rotated, the name points at
        // the new file, and a cached descriptor would still point at the rotated one.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err("open journal", &path))?;
        let len = file.metadata().map_err(io_err("stat journal", &path))?.len();
        let mut buf = Vec::with_capacity(lines.len() + 1);
        if len > 0 {
            let mut last = [0u8; 1];
            file.read_exact_at(&mut last, len - 1).map_err(io_err("read journal", &path))?;
            if last[0] != b'\n' {
                // A torn line from a crashed writer: end it, so this event starts a line.
                buf.push(b'\n');
            }
        }
        buf.extend_from_slice(&lines);
        file.write_all(&buf).map_err(io_err("append to journal", &path))?;
        drop(file);
        APPENDED.fetch_add(events.len() as u64, std::sync::atomic::Ordering::Relaxed);

        if len + buf.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        drop(_guard);
        if let Some(copy) = self.copy.get() {
            copy(&copied);
        }
        Ok(())
    }

    /// Shifts `journal.jsonl` → `.1` → … → `.5`, dropping the oldest. Caller holds the lock.
    fn rotate(&self) -> Result<(), JournalError> {
        let oldest = self.rotated_path(KEEP_ROTATED);
        match std::fs::remove_file(&oldest) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err("remove old journal", &oldest)(e)),
        }
        for i in (1..KEEP_ROTATED).rev() {
            let from = self.rotated_path(i);
            match std::fs::rename(&from, self.rotated_path(i + 1)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("rotate journal", &from)(e)),
            }
        }
        let current = self.current_path();
        std::fs::rename(&current, self.rotated_path(1)).map_err(io_err("rotate journal", &current))
    }

    /// The newest `n` events across the current and rotated files, oldest first.
    pub fn read_last(&self, n: usize) -> Result<ReadOutcome, JournalError> {
        let mut out = ReadOutcome::default();
        if n == 0 {
            return Ok(out);
        }
        out.skipped = self.scan_newest_first(&mut |e| {
            out.events.push(e);
            if out.events.len() >= n { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })?;
        out.events.reverse();
        Ok(out)
    }

    /// Events matching `filter`, oldest first (the newest `filter.limit` when set).
    pub fn query(&self, filter: &Filter) -> Result<ReadOutcome, JournalError> {
        let mut out = ReadOutcome::default();
        if filter.limit == Some(0) {
            return Ok(out);
        }
        out.skipped = self.scan_newest_first(&mut |e| {
            if filter.matches(&e) {
                out.events.push(e);
                if filter.limit.is_some_and(|l| out.events.len() >= l) {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        })?;
        out.events.reverse();
        Ok(out)
    }

    /// Feeds every valid event to `visit`, newest first, until it breaks; returns the damaged
    /// lines met, newest first. Holds the shared lock so no rotation happens underneath.
    fn scan_newest_first(
        &self,
        visit: &mut dyn FnMut(JournalEvent) -> ControlFlow<()>,
    ) -> Result<Vec<SkippedLine>, JournalError> {
        let _guard = self.lock(false)?;
        let mut skipped = Vec::new();
        for path in self.files_newest_first() {
            if scan_file_backwards(&path, visit, &mut skipped)?.is_break() {
                break;
            }
        }
        Ok(skipped)
    }
}

/// Reads `path` from its end in chunks, line by line, newest first. A missing file is empty.
fn scan_file_backwards(
    path: &Path,
    visit: &mut dyn FnMut(JournalEvent) -> ControlFlow<()>,
    skipped: &mut Vec<SkippedLine>,
) -> Result<ControlFlow<()>, JournalError> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ControlFlow::Continue(())),
        Err(e) => return Err(io_err("open journal", path)(e)),
    };
    let len = file.metadata().map_err(io_err("stat journal", path))?.len();

    // `buf` holds bytes [pos, pos + buf.len()) not yet split into lines.
    let mut pos = len;
    let mut buf: Vec<u8> = Vec::new();
    // The first segment handled is whatever follows the last '\n': empty when the file ends
    // with a newline, else a line with no newline — torn.
    let mut last_segment = true;
    loop {
        let (line, offset) = if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            let line = buf.split_off(i + 1);
            buf.truncate(i);
            (line, pos + i as u64 + 1)
        } else if pos == 0 {
            (std::mem::take(&mut buf), 0)
        } else {
            let n = CHUNK_BYTES.min(pos);
            pos -= n;
            let mut chunk = vec![0u8; n as usize];
            file.read_exact_at(&mut chunk, pos).map_err(io_err("read journal", path))?;
            chunk.extend_from_slice(&buf);
            buf = chunk;
            continue;
        };
        let torn = last_segment;
        last_segment = false;
        if !line.iter().all(u8::is_ascii_whitespace) {
            let parsed = std::str::from_utf8(&line)
                .map_err(|e| format!("not UTF-8 ({e})"))
                .and_then(validate_line);
            match parsed {
                Ok(event) => {
                    if visit(event).is_break() {
                        return Ok(ControlFlow::Break(()));
                    }
                }
                Err(reason) => {
                    let reason = if torn {
                        format!(
                            "torn last line (no trailing newline: a writer stopped \
                             mid-append): {reason}"
                        )
                    } else {
                        reason
                    };
                    skipped.push(SkippedLine { file: path.to_path_buf(), offset, torn, reason });
                }
            }
        }
        if offset == 0 {
            return Ok(ControlFlow::Continue(()));
        }
    }
}
