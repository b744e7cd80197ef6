//! Helpers shared by the fuzz targets (`fuzz_targets/*.rs`).
//!
//! Everything here decodes with flock-ipc's public API exactly as the servers do
//! (`FrameReader::read_frame` for the first frame, `read_batch` after it, `decode_frame` for a body).
//! The router's and the control handler's own checks on a decoded handshake or request are private
//! (in flock-actors / flock-supervisor, which pull ractor, rusqlite, …), so what they do with the
//! peer's strings is *mirrored* here in a few lines, marked `mirror of`, to keep those paths (error
//! messages built from peer data, the answer frame encoded back) under the fuzzer too.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use flock_ipc::{Body, ErrorCode, Frame, FrameReader, Hello, PROTOCOL_VERSION, ROUTER, Welcome};

/// Mirror of `flock_actors::server::HANDSHAKE_MAX_FRAME`: the largest first frame a peer may send.
pub const HANDSHAKE_MAX_FRAME: u32 = 4096;

/// The swarm's frame limit after the handshake (`delivery.max_frame_bytes`, default 16 MiB).
pub fn swarm_max_frame() -> u32 {
    flock_config::DeliverySpec::default().max_frame_bytes
}

/// Runs a future that never waits: every read here is from a byte slice, which is always ready.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a read from a byte slice returned Pending"),
    }
}

/// Encodes a frame we built; that must never fail, whatever peer strings it carries.
pub fn encode(frame: &Frame) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Err(e) = flock_ipc::encode_frame(frame, &mut buf) {
        panic!("a {} frame built from decoded input failed to encode: {e}", frame.kind());
    }
    buf
}

/// Every frame that decodes must survive an encode/decode round trip unchanged: otherwise what
/// the router forwards is not what the peer sent.
pub fn check_roundtrip(frame: &Frame) {
    let buf = encode(frame);
    match flock_ipc::decode_frame(&buf[4..]) {
        Ok(back) => assert_eq!(&back, frame, "a decoded frame changed on re-encoding"),
        Err(e) => panic!("a re-encoded {} frame does not decode: {e}", frame.kind()),
    }
}

/// Which socket a connection came in on (mirror of `flock_actors::router::ConnKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnKind {
    /// The router socket: agents, first frame `Hello`.
    Agent,
    /// The control socket: `flockctl`, first frame `ClientHello`.
    Control,
}

/// The one agent the mirrored router knows, and the token its spawn was given.
pub const KNOWN_AGENT: &str = "worker";
pub const KNOWN_TOKEN: &str = "0123456789abcdef";

/// Mirror of `flock_actors::server::connection` plus `Router::open`: reads the first frame with
/// the handshake limit, answers it, then reads every further frame with the swarm's limit.
/// Returns the frames after the handshake (empty if it was rejected or malformed).
pub fn serve(kind: ConnKind, data: &[u8]) -> Vec<Frame> {
    let mut reader = FrameReader::new(data, HANDSHAKE_MAX_FRAME);
    let first = match block_on(reader.read_frame()) {
        Ok(Some(first)) => first,
        Ok(None) => return Vec::new(),
        Err(e) => {
            let msg = format!("malformed handshake: {e}; closing this connection");
            encode(&error_frame(msg));
            return Vec::new();
        }
    };
    check_roundtrip(&first);
    let answer = open(kind, &first);
    encode(&answer);
    if !matches!(answer.body, Body::Welcome(_)) {
        return Vec::new();
    }
    reader.set_max_frame(swarm_max_frame());
    let mut frames = Vec::new();
    loop {
        let mut batch = Vec::new();
        match block_on(reader.read_batch(&mut batch)) {
            Ok(0) => break,
            Ok(_) => frames.append(&mut batch),
            Err(e) => {
                let msg = format!("malformed frame: {e}; closing this connection");
                encode(&error_frame(msg));
                break;
            }
        }
    }
    for f in &frames {
        check_roundtrip(f);
    }
    frames
}

/// Mirror of `error_frame` (actors/src/server.rs): what a connection gets before it is closed.
fn error_frame(message: String) -> Frame {
    Frame::new(ROUTER, "", Body::Error { code: ErrorCode::BadRequest, message })
}

/// Mirror of `Router::open` (actors/src/router.rs): the answer to a connection's first frame.
pub fn open(kind: ConnKind, first: &Frame) -> Frame {
    let reject = |code, reason| Frame::answer(first, ROUTER, Body::Reject { code, reason });
    let welcome = |agent_spec_json: String| {
        Frame::answer(
            first,
            ROUTER,
            Body::Welcome(Welcome {
                protocol_version: PROTOCOL_VERSION,
                swarm: "fuzz".into(),
                agent_spec_json,
                heartbeat_interval_ms: 1000,
                max_frame_bytes: swarm_max_frame(),
            }),
        )
    };
    match (kind, &first.body) {
        (ConnKind::Agent, Body::Hello(hello)) => match check_hello(hello) {
            Ok(()) => welcome("{}".into()),
            Err((code, reason)) => reject(code, reason),
        },
        (ConnKind::Control, Body::ClientHello { protocol_version, .. }) => {
            if *protocol_version != PROTOCOL_VERSION {
                return reject(
                    ErrorCode::BadRequest,
                    format!(
                        "protocol version {protocol_version} is not supported (this supervisor speaks {PROTOCOL_VERSION}); use the flockctl that came with it"
                    ),
                );
            }
            welcome(String::new())
        }
        (_, body) => reject(
            ErrorCode::BadRequest,
            format!("the first frame must be a handshake, got {}", body.kind()),
        ),
    }
}

/// Mirror of `hello_key` (actors/src/router.rs): `agent`, or `agent@instance`.
pub fn hello_key(hello: &Hello) -> String {
    if hello.instance.is_empty() || hello.instance == "default" {
        hello.agent_id.clone()
    } else {
        format!("{}@{}", hello.agent_id, hello.instance)
    }
}

/// Mirror of `Router::check_hello`, with a swarm of one agent, [`KNOWN_AGENT`].
pub fn check_hello(hello: &Hello) -> Result<(), (ErrorCode, String)> {
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err((
            ErrorCode::BadRequest,
            format!(
                "protocol version {} is not supported (expected {PROTOCOL_VERSION})",
                hello.protocol_version
            ),
        ));
    }
    let key = hello_key(hello);
    if key != KNOWN_AGENT {
        return Err((ErrorCode::AgentNotFound, format!("no agent `{key}` in this swarm")));
    }
    let (a, b) = (KNOWN_TOKEN.as_bytes(), hello.token.as_bytes());
    if a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0 {
        Ok(())
    } else {
        Err((ErrorCode::Forbidden, "wrong or expired token".into()))
    }
}

/// Mirror of the client half of the handshake (`flock_ipc::Connection::handshake`, private):
/// reads the router's first answer with the default limit; on `Welcome`, switches to the limit it
/// announces. Returns the reader positioned after it and the welcome, if any.
pub fn client_handshake(data: &[u8]) -> Option<(FrameReader<&[u8]>, Welcome)> {
    let mut reader = FrameReader::new(data, flock_ipc::DEFAULT_MAX_FRAME_BYTES);
    match block_on(reader.read_frame()) {
        Ok(Some(Frame { body: Body::Welcome(welcome), .. })) => {
            reader.set_max_frame(welcome.max_frame_bytes.max(flock_ipc::DEFAULT_MAX_FRAME_BYTES));
            Some((reader, welcome))
        }
        Ok(Some(Frame { body: Body::Reject { code, reason }, .. })) => {
            let _ = format!("rejected by the supervisor ({code}): {reason}");
            None
        }
        Ok(Some(other)) => {
            let _ = format!("expected Welcome, got {}", other.kind());
            None
        }
        Ok(None) => None,
        Err(e) => {
            let _ = e.to_string();
            None
        }
    }
}
