//! Flock's long-term memory (issue #10, first part).
//!
//! - [`mask`]: secrets (API keys, tokens, passwords, private keys, e-mail addresses, card
//!   numbers) replaced by `[masked:KIND]` before any memory write and before any text reaches a
//!   model.
//! - [`files`]: the memory files written (by the supervisor's one writer) and read (by agents).
//! - [`records`]: the memory files (`journals/`, `observations/`, `reflections/`, `knowledge/`,
//!   the brain-persona formats) read as records with ids, dates, priority and category. The files
//!   are the truth.
//! - [`index`] (feature `index`): a SQLite FTS5 index of those records, kept in step with the
//!   files (re-read when a file's size or mtime changes) and rebuildable from them at any time;
//!   BM25 ranking with recency and priority boosts.
//! - [`tiers`]: hot, warm and cold day files (where a file lives is its tier), the daily TTL
//!   job that moves them, and the one mover.
//! - [`embed`] (feature `vectors`): all-MiniLM-L6-v2 in-process with candle; the index embeds
//!   each sentence of a record and scans the passage vectors (int8, in memory) by meaning.

pub mod files;
#[cfg(feature = "index")]
pub mod filter;
pub mod mask;
pub mod records;
pub mod tiers;

#[cfg(feature = "index")]
mod embedding;
#[cfg(feature = "index")]
pub mod index;
#[cfg(feature = "index")]
pub use embedding::Embedding;

#[cfg(feature = "vectors")]
pub mod embed;
#[cfg(feature = "vectors")]
mod scan;

pub use mask::mask;
pub use records::{Kind, Priority, Record};
