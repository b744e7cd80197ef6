//! `flock-ipc`: the one wire protocol of Flock — frames, the codec, the handshake, error codes and
//! the socket transport. Every process (supervisor, agents, `flockctl`, bench tools) speaks it.
//!
//! This crate defines wire types and moves bytes; it knows nothing about actors, SQLite or swarm
//! files. Wire types obey bincode's rules (DESIGN.md §4): no `serde_json::Value`, no flatten, no
//! untagged enums, no `skip_serializing_if`; JSON travels as `String`.

pub mod channel;
pub mod codec;
pub mod conn;
pub mod error;
pub mod frame;
pub mod handoff;
pub mod id;
pub mod identity;
pub mod llm;
pub mod operator;
pub mod time;

pub use codec::{FrameError, FrameReader, ReadBudget, decode_frame, encode_frame};
pub use conn::{Connection, Outbox, PeerCred, Transport, UnixTransport, spawn_writer};
pub use error::{ErrorCode, ToolError};
pub use frame::*;
pub use id::MsgId;

/// Bumped on any incompatible change of [`Frame`]; the router rejects other versions.
pub const PROTOCOL_VERSION: u32 = 11;

/// Default largest frame (length prefix excluded) accepted on any socket: 16 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;

/// The largest message text (a send, request, delegation, answer or channel post) a swarm with
/// frames of at most `max_frame_bytes` accepts: an eighth of a frame. What a message becomes on
/// its way (a delivery with its chain, a delegated result, a page of a channel) must still fit
/// in one frame at the reader, so the limit is enforced where the text comes in, never later.
pub const fn max_message_bytes(max_frame_bytes: u32) -> usize {
    max_frame_bytes as usize / 8
}

/// "2.0 MiB"-style size for error messages.
pub fn human_bytes(n: usize) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} bytes") } else { format!("{v:.1} {}", UNITS[unit]) }
}

/// Environment variables through which the supervisor hands a spawned agent its identity.
pub mod env {
    /// Path of the router socket to connect to.
    pub const SOCKET: &str = "FLOCK_SOCKET";
    /// The agent's name (`AgentSpec::name`).
    pub const AGENT: &str = "FLOCK_AGENT";
    /// The instance key (`default` unless spawned per conversation).
    pub const INSTANCE: &str = "FLOCK_INSTANCE";
    /// The per-spawn secret the agent must present in `Hello` (a key of the secrets handed
    /// over by [`crate::handoff`], never an environment variable).
    pub const TOKEN: &str = "FLOCK_TOKEN";
    /// The swarm's shared memory folder (`memory/journals`, `observations`, `reflections`,
    /// `knowledge`).
    pub const MEMORY_DIR: &str = "FLOCK_MEMORY_DIR";
    /// A chat bridge's platform token (bot token); only that bridge's process gets it, through
    /// [`crate::handoff`].
    pub const PLATFORM_TOKEN: &str = "FLOCK_PLATFORM_TOKEN";
    /// Slack bridges: the app-level token Socket Mode connects with.
    pub const PLATFORM_APP_TOKEN: &str = "FLOCK_PLATFORM_APP_TOKEN";
}
