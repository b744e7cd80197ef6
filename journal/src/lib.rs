//! The shared workspace journal (DESIGN.md §9): an append-only JSON Lines file of everything that
//! matters, in the shared-journal schema, safe with concurrent writers in several processes.
//!
//! It is a library over a directory, not an actor: callers (the router, `flockctl journal`) append
//! and read directly. It is not the store — nothing here is transactional with SQLite.
//!
//! Rooms: `event.rs` (an event, its builder, timestamps and ids), `schema.rs` (the strict check
//! of a line against the shared-journal schema), `file.rs` (the files, their lock, rotation,
//! reads and queries), `writer.rs` (the batching writer task the actors hand events to).
//!
//! ```text
//! <dir>/journal.jsonl        current file, one event per line
//! <dir>/journal.1.jsonl      rotated files, .1 newest .. .5 oldest (older ones are deleted)
//! <dir>/journal.lock         flock(2) target: exclusive for append + rotation, shared for reads
//! ```
//!
//! Guarantees:
//! - Every line written is a whole event: an append takes the exclusive lock, opens the current
//!   file with `O_APPEND` and writes `line + "\n"` in one `write`. Writers in other processes and
//!   threads (each `Journal` holds its own lock descriptor; one `Journal` serializes its own
//!   threads with a mutex) never interleave.
//! - A torn last line (a writer killed mid-write, a full disk) is skipped on read and reported in
//!   [`ReadOutcome::skipped`]; the next append first writes the missing `'\n'`, so the torn bytes
//!   stay a line of their own and never corrupt the next event.
//! - Rotation is by size: once the current file exceeds `max_bytes` it becomes `journal.1.jsonl`
//!   (older files shift up, [`KEEP_ROTATED`] are kept). Readers take the shared lock, so they see
//!   either the files before a rotation or after it, never half of one.
//! - No fsync: an appended event survives `kill -9` of any process (it is in the page cache); a
//!   power cut may lose the last events or tear the last line.

mod event;
mod file;
mod schema;
mod writer;

use std::io;
use std::path::{Path, PathBuf};

pub use event::{
    Action, JournalEvent, Outcome, Status, Trace, event_id_for, format_timestamp, now_timestamp,
};
pub use file::{CopyHook, Filter, Journal, ReadOutcome, SkippedLine};
pub use schema::{is_timestamp_prefix, validate_line, validate_value};
pub use writer::{JournalWriter, RECENT_SCAN, concerning};

/// Size at which the current file is rotated, unless [`Journal::open`] is given another.
pub const DEFAULT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Rotated files kept (`journal.1.jsonl` .. `journal.5.jsonl`).
pub const KEEP_ROTATED: usize = 5;
/// Largest serialized event accepted by [`Journal::append`]: events are summaries; big content
/// belongs in a file named in `result.artifacts`.
pub const MAX_EVENT_BYTES: usize = 1024 * 1024;
/// The current file's name inside the journal directory.
pub const FILE_NAME: &str = "journal.jsonl";
/// The lock file's name inside the journal directory.
pub const LOCK_FILE_NAME: &str = "journal.lock";

/// Read granularity when scanning a file backwards from its end.
const CHUNK_BYTES: u64 = 64 * 1024;

/// Why a journal operation failed.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The file system refused (directory, lock file or journal file).
    #[error("{action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The event does not satisfy the schema; nothing was written.
    #[error("invalid journal event: {0}")]
    Invalid(String),
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> JournalError {
    let path = path.to_path_buf();
    move |source| JournalError::Io { action, path, source }
}

/// Events appended by every [`Journal`] of this process (for the `flock_journal_appends` metric).
pub fn appended_total() -> u64 {
    file::APPENDED.load(std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests;
