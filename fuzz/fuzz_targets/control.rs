//! Fuzz target: arbitrary bytes as a control connection's byte stream, on both ends.
//!
//! - Supervisor side: the first frame read as `flock_actors::server` reads it (4 KiB limit) and
//!   answered as `Router::open` answers a `ClientHello` (version check, mirrored); then every
//!   further frame read with the swarm's limit (`read_batch`) and each `Control` request looked
//!   at as the router and `supervisor/src/control.rs` do with peer data (mirrored: the chain id
//!   printed for `Watch`, the `--as` name check of `Channel`), the answer frame encoded back.
//!   Each decoded frame must round-trip through `encode_frame`.
//! - `flockctl` side: the same bytes as the supervisor's answers: `Welcome` | `Reject` first
//!   (`Connection::client`), then `ControlReply`, `Error` and `ChainEnded` frames (`next_reply`,
//!   `watch`), a `Json` reply parsed as JSON as flockctl does.
//!
//! Run: `scripts/fuzz` (every target), or `cargo +nightly fuzz run control` from `fuzz/`.
#![no_main]

use flock_ipc::{Body, ControlReply, ControlRequest, ErrorCode, Frame, ROUTER};
use flock_ipc_fuzz::{ConnKind, block_on, check_roundtrip, client_handshake, encode, serve};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for frame in serve(ConnKind::Control, data) {
        if let Some(answer) = control(&frame) {
            encode(&answer);
        }
    }
    if let Some((mut reader, _welcome)) = client_handshake(data) {
        while let Ok(Some(frame)) = block_on(reader.read_frame()) {
            check_roundtrip(&frame);
            flockctl(frame);
        }
    }
});

/// What the supervisor does with a frame on a control connection, as far as it depends only on
/// the frame (mirror of `Router::frame` for control connections and of `control::run`).
fn control(frame: &Frame) -> Option<Frame> {
    let error = |message: String| Some(Frame::error(frame, ErrorCode::BadRequest, message));
    match &frame.body {
        Body::Control(ControlRequest::Watch { chain }) => {
            let id = flock_ipc::id::fmt_id(*chain);
            error(format!("no chain {id} in flight (see `flockctl journal query corr={id}`)"))
        }
        Body::Control(ControlRequest::Channel { as_name, .. }) => {
            let name = as_name.trim();
            if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return error(format!("`{as_name}` is not a usable name for --as: one word"));
            }
            let person = format!("human:{name}");
            let reply = ControlReply::Done(person);
            Some(Frame::answer(frame, ROUTER, Body::ControlReply(reply)))
        }
        Body::Control(_) => None,
        Body::Heartbeat => Some(Frame::answer(frame, ROUTER, Body::HeartbeatAck)),
        other => error(format!("a {} frame is not accepted on this connection", other.kind())),
    }
}

/// What flockctl does with an answer (supervisor/src/bin/flockctl/main.rs).
fn flockctl(frame: Frame) {
    match frame.body {
        Body::ControlReply(ControlReply::Json(text)) => {
            let _ = serde_json::from_str::<serde_json::Value>(&text);
        }
        Body::ControlReply(reply) => {
            let _ = format!("{reply:?}");
        }
        Body::Error { code, message } => {
            let _ = format!("{code}: {message}");
        }
        Body::ChainEnded(end) => {
            let _ = (end.outcome.as_str(), flock_ipc::id::fmt_id(end.chain));
        }
        _ => {}
    }
}
