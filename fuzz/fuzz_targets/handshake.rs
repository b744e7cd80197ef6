//! Fuzz target: arbitrary bytes as an agent connection's byte stream, on both ends of the
//! handshake.
//!
//! - Router side: the first frame read the way `flock_actors::server` reads it
//!   (`FrameReader::read_frame` with the 4 KiB pre-handshake limit), answered as `Router::open`
//!   answers a `Hello` (version check, `agent@instance` key, token check — the router's own
//!   `flock_ipc::identity` code, in a swarm of one agent), then every further frame read with
//!   the swarm's limit (`read_batch`), as the connection task does. Each decoded frame must round-trip through `encode_frame`.
//!   A chat bridge's `BridgeHello` comes in on the same socket: answered as `open_bridge`
//!   answers it (version, bridge name, token; the `Welcome` carries its `BridgeSpec`), then each
//!   of its frames answered as `bridge_frame` does (heartbeats, `bridge__status` reports, the
//!   `bridge__*` tools' arguments as the channels actor reads them, anything else refused).
//! - Agent side: the same bytes as the router's answer (`Welcome` | `Reject`), read as
//!   `Connection::agent` reads it, and the `Welcome`'s `agent_spec_json` parsed into
//!   `flock_config::AgentSpec` as `flock-agent` does.
//! - Bridge side: the same bytes read as `flock-bridge`'s link does (the `BridgeSpec` in the
//!   `Welcome`, then tool results whose content is parsed as JSON).
//!
//! Run: `scripts/fuzz` (every target), or `cargo +nightly fuzz run handshake` from `fuzz/`.
#![no_main]

use flock_ipc_fuzz::{ConnKind, bridge_client, client_handshake, serve};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    serve(ConnKind::Agent, data);
    if let Some((_reader, welcome)) = client_handshake(data) {
        // flock-agent: `serde_json::from_str::<AgentSpec>(&welcome.agent_spec_json)`.
        let _ = serde_json::from_str::<flock_config::AgentSpec>(&welcome.agent_spec_json);
        let _ = std::time::Duration::from_millis(welcome.heartbeat_interval_ms.max(10));
    }
    bridge_client(data);
});
