//! `flock-ipc`: the one wire protocol of Flock — frames, the codec, the handshake, error codes and
//! the socket transport. Every process (supervisor, agents, `flockctl`, bench tools) speaks it.
//!
//! This crate defines wire types and moves bytes; it knows nothing about actors, SQLite or swarm
//! files. Wire types obey bincode's rules (DESIGN.md §4): no `serde_json::Value`, no flatten, no
//! untagged enums, no `skip_serializing_if`; JSON travels as `String`.

pub mod codec;
pub mod conn;
pub mod error;
pub mod frame;
pub mod id;
pub mod llm;
pub mod time;

pub use codec::{FrameError, FrameReader, decode_frame, encode_frame};
pub use conn::{Connection, Outbox, PeerCred, Transport, UnixTransport, spawn_writer};
pub use error::ErrorCode;
pub use frame::*;
pub use id::MsgId;

/// Bumped on any incompatible change of [`Frame`]; the router rejects other versions.
pub const PROTOCOL_VERSION: u32 = 4;

/// Default largest frame (length prefix excluded) accepted on any socket: 16 MiB.
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 16 * 1024 * 1024;

/// Environment variables through which the supervisor hands a spawned agent its identity.
pub mod env {
    /// Path of the router socket to connect to.
    pub const SOCKET: &str = "FLOCK_SOCKET";
    /// The agent's name (`AgentSpec::name`).
    pub const AGENT: &str = "FLOCK_AGENT";
    /// The instance key (`default` unless spawned per conversation).
    pub const INSTANCE: &str = "FLOCK_INSTANCE";
    /// The per-spawn secret the agent must present in `Hello`.
    pub const TOKEN: &str = "FLOCK_TOKEN";
    /// The swarm's shared memory folder (`memory/journals`, `observations`, `reflections`,
    /// `knowledge`).
    pub const MEMORY_DIR: &str = "FLOCK_MEMORY_DIR";
}
