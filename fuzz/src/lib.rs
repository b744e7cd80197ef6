//! Helpers shared by the fuzz targets (`fuzz_targets/*.rs`).
//!
//! Everything here decodes with flock-ipc's public API exactly as the servers do
//! (`FrameReader::read_frame` for the first frame, `read_batch` after it, `decode_frame` for a body).
//! The checks that need only the frame are the real ones, from `flock_ipc::identity` (the
//! protocol version, the address a Hello claims, the secret compared, a platform user's id). What
//! the router and the control handler do with their own state is private (in flock-actors /
//! flock-supervisor, which pull ractor, rusqlite, …), so that part is *mirrored* here in a few
//! lines, marked `mirror of`, to keep those paths (error messages built from peer data, the answer
//! frame encoded back) under the fuzzer too.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use flock_ipc::identity;
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
    /// The router socket: agents (first frame `Hello`) and chat bridges (`BridgeHello`).
    Agent,
    /// The control socket: `flockctl`, first frame `ClientHello`.
    Control,
}

/// The one agent the mirrored router knows, and the token its spawn was given.
pub const KNOWN_AGENT: &str = "worker";
pub const KNOWN_TOKEN: &str = "0123456789abcdef";
/// The one chat bridge it knows (its spawn was given [`KNOWN_TOKEN`] too).
pub const KNOWN_BRIDGE: &str = "tg";

/// The bridge's spec as the swarm file would give it: a Telegram bridge with two mappings, one
/// of them with an allow list.
pub fn bridge_spec() -> flock_config::BridgeSpec {
    use flock_config::{BridgeMapping, BridgeSpec, Platform};
    BridgeSpec {
        name: KNOWN_BRIDGE.into(),
        platform: Platform::Telegram,
        token_env: "TG_TOKEN".into(),
        app_token_env: None,
        api_url: None,
        channels: vec![
            BridgeMapping {
                flock: "team".into(),
                external: "-100200300".into(),
                allow: None,
                responder: None,
                replies: Default::default(),
            },
            BridgeMapping {
                flock: "ops".into(),
                external: "-100400500".into(),
                allow: Some(vec!["42".into()]),
                responder: None,
                replies: Default::default(),
            },
        ],
        max_posts_per_minute: 20,
        mirror_new_channels: false,
        dm: None,
        approvals: None,
        approvers: Vec::new(),
    }
}

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
    let bridge = matches!(first.body, Body::BridgeHello(_));
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
        // A bridge's frames are answered by the router itself (mirror of `bridge_frame`).
        if bridge && let Some(answer) = bridge_frame(f) {
            encode(&answer);
        }
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
        (ConnKind::Agent, Body::BridgeHello(hello)) => match check_bridge_hello(hello) {
            // Mirror of `open_bridge`: the Welcome carries the bridge's spec as JSON.
            Ok(()) => match serde_json::to_string(&bridge_spec()) {
                Ok(json) => welcome(json),
                Err(e) => reject(ErrorCode::Internal, format!("bridge spec: {e}")),
            },
            Err((code, reason)) => reject(code, reason),
        },
        (ConnKind::Control, Body::ClientHello { protocol_version, key, .. }) => {
            // The router's own check, [`KNOWN_TOKEN`] being the operator key here.
            match identity::check_client_hello(*protocol_version, key, Some(KNOWN_TOKEN)) {
                Ok(()) => welcome(String::new()),
                Err(e) => reject(e.code, e.message),
            }
        }
        (_, body) => reject(
            ErrorCode::BadRequest,
            format!("the first frame must be a handshake, got {}", body.kind()),
        ),
    }
}

/// `Router::check_hello` with a swarm of one agent, [`KNOWN_AGENT`], whose spawn was announced
/// with [`KNOWN_TOKEN`]: the version, address and secret checks are the router's own
/// (`flock_ipc::identity`); only the swarm is a stand-in.
pub fn check_hello(hello: &Hello) -> Result<(), (ErrorCode, String)> {
    identity::check_version(hello).map_err(|e| (e.code, e.message))?;
    let key = identity::hello_address(hello);
    if key != KNOWN_AGENT {
        return Err((ErrorCode::AgentNotFound, format!("no agent `{key}` in this swarm")));
    }
    if identity::same_secret(KNOWN_TOKEN, &hello.token) {
        Ok(())
    } else {
        Err((ErrorCode::Forbidden, "wrong or expired token".into()))
    }
}

/// Mirror of `RouterState::open_bridge`'s checks (actors/src/router/bridge.rs), with a swarm of
/// one bridge, [`KNOWN_BRIDGE`], whose spawn was announced with [`KNOWN_TOKEN`].
pub fn check_bridge_hello(hello: &Hello) -> Result<(), (ErrorCode, String)> {
    identity::check_version(hello).map_err(|e| (e.code, e.message))?;
    if hello.agent_id != KNOWN_BRIDGE {
        return Err((
            ErrorCode::AgentNotFound,
            format!("no bridge `{}` in this swarm", hello.agent_id),
        ));
    }
    if identity::same_secret(KNOWN_TOKEN, &hello.token) {
        Ok(())
    } else {
        Err((
            ErrorCode::Forbidden,
            "wrong or expired token: bridges are started by the supervisor".into(),
        ))
    }
}

/// Mirror of `RouterState::bridge_frame` (actors/src/router/bridge.rs) and of what the channels
/// actor does with a `bridge__*` call's arguments (actors/src/channels/bridge.rs: the mapping
/// looked up, the fields read, the allow list checked, the author's name made) — up to the
/// store, which the fuzzer does not run. The answer the router sends back, if any.
pub fn bridge_frame(frame: &Frame) -> Option<Frame> {
    let answer = |body| Some(Frame::answer(frame, ROUTER, body));
    let result = |r: Result<String, (ErrorCode, String)>| match r {
        Ok(content) => answer(Body::ToolResult { ok: true, content }),
        Err((code, message)) => Some(Frame::error(frame, code, message)),
    };
    match &frame.body {
        Body::Heartbeat => answer(Body::HeartbeatAck),
        Body::ShutdownAck | Body::HeartbeatAck => None,
        Body::ToolCall { name, arguments } if name == "bridge__status" => {
            answer(Body::ToolResult { ok: bridge_status(arguments), content: String::new() })
        }
        Body::ToolCall { name, arguments }
            if identity::BRIDGE_TOOLS.contains(&name.as_str()) =>
        {
            result(bridge_tool(name, arguments))
        }
        other => Some(Frame::error(
            frame,
            ErrorCode::Forbidden,
            format!("a bridge may not send {} frames", other.kind()),
        )),
    }
}

/// Mirror of `RouterState::bridge_status`: the bridge's own report, cut to size.
fn bridge_status(arguments: &str) -> bool {
    use serde_json::Value;
    let Ok(v) = serde_json::from_str::<Value>(arguments) else { return false };
    let text = |v: &Value, k: &str, max: usize| {
        v.get(k).and_then(Value::as_str).map(|s| s.chars().take(max).collect::<String>())
    };
    let _ = (text(&v, "state", 120), text(&v, "last_error", 300));
    let _ = ["outbox", "inbound", "outbound"].map(|k| v.get(k).and_then(Value::as_u64));
    if let Some(mappings) = v.get("mappings").and_then(Value::as_object) {
        for (external, r) in mappings.iter().take(256) {
            let _ = external.chars().take(200).collect::<String>();
            let _ = (r.get("outbox").and_then(Value::as_u64), text(r, "broken", 300));
        }
    }
    true
}

/// Mirror of `ChannelsState::bridge_tool`'s argument handling, short of the store.
fn bridge_tool(name: &str, arguments: &str) -> Result<String, (ErrorCode, String)> {
    use serde_json::{Value, json};
    let bad = |m: String| (ErrorCode::BadRequest, m);
    let args: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    let str_arg = |k: &str| args.get(k).and_then(Value::as_str);
    let spec = bridge_spec();
    if name == "bridge__mappings" {
        let channels: Vec<Value> = spec
            .channels
            .iter()
            .map(|m| json!({"flock": m.flock, "external": m.external, "allow": m.allow}))
            .collect();
        return Ok(json!({"channels": channels}).to_string());
    }
    let external = str_arg("external").ok_or_else(|| bad("`external` is required".into()))?;
    let mapping = spec.channels.iter().find(|m| m.external == external).ok_or_else(|| {
        (ErrorCode::Forbidden, format!("chat `{external}` is not mapped by bridge `{}`", spec.name))
    })?;
    let channel = &mapping.flock;
    match name {
        "bridge__post" => {
            let field =
                |k: &str| identity::platform_id(&args, k).map_err(|e| (e.code, e.message));
            let (message_id, user_id) = (field("message_id")?, field("user_id")?);
            let user_name = str_arg("user_name").unwrap_or_default();
            if let Some(allow) = &mapping.allow
                && !allow.contains(&user_id)
            {
                let why = format!("user {user_id} may not post in #{channel} through `tg`");
                // The journal event of the refusal: its parameters, and the line it becomes.
                let name: String = user_name.chars().take(80).collect();
                let event = json!({"bridge": "tg", "chat": external, "message_id": message_id,
                    "user_id": user_id, "user_name": name, "message": why});
                let _ = event.to_string();
                return Err((ErrorCode::Forbidden, why));
            }
            let text = str_arg("text").ok_or_else(|| bad("`text` is required".into()))?;
            let author = identity::human_author(spec.platform.as_str(), user_name, &user_id);
            let origin = format!("tg/{external}/{message_id}");
            let _ = (text.len(), origin);
            Ok(json!({"channel": channel, "seq": 1, "author": author, "duplicate": false})
                .to_string())
        }
        "bridge__edit" => {
            let message_id =
                identity::platform_id(&args, "message_id").map_err(|e| (e.code, e.message))?;
            let deleted = args.get("deleted").and_then(Value::as_bool) == Some(true);
            if !deleted && str_arg("text").is_none() {
                return Err(bad("`text` is required (or `deleted: true`)".into()));
            }
            let _ = format!("tg/{external}/{message_id}");
            // The model's store holds no post with that origin.
            Ok(json!({"channel": channel, "found": false}).to_string())
        }
        "bridge__sent" => {
            let edit = args.get("edit").and_then(Value::as_u64).unwrap_or(0);
            let seq = match args.get("seq").and_then(Value::as_u64) {
                Some(seq) => seq,
                None if edit > 0 => 0,
                None => return Err(bad("`seq` is required".into())),
            };
            let _ = str_arg("external_id");
            Ok(json!({"channel": channel, "cursor": seq}).to_string())
        }
        "bridge__pull" => {
            let _ = args.get("wait_ms").and_then(Value::as_u64).unwrap_or(0).min(60_000);
            Ok(json!({"channel": channel, "posts": [], "upto": 0, "newest": 0, "edits": [],
                      "edit_after": 0, "edits_upto": 0})
            .to_string())
        }
        // The model's bridge mirrors no new channel.
        "bridge__made" => Err(bad(format!("bridge `tg` has no channel to make for #{channel}"))),
        // The model's channel is never archived.
        "bridge__archived" => Err(bad(format!("#{channel} is not archived"))),
        _ => Ok(json!({"message_id": null}).to_string()),
    }
}

/// Mirror of the bridge's side after its handshake (`bridges/src/link.rs`): the `Welcome`'s
/// spec parsed as a `BridgeSpec`, then every frame from the router read as `read_loop` does
/// (a tool result's content parsed as JSON, as `Link::call_json` does).
pub fn bridge_client(data: &[u8]) {
    let Some((mut reader, welcome)) = client_handshake(data) else { return };
    let _ = serde_json::from_str::<flock_config::BridgeSpec>(&welcome.agent_spec_json);
    loop {
        match block_on(reader.read_frame()) {
            Ok(Some(f)) => {
                check_roundtrip(&f);
                match f.body {
                    Body::ToolResult { ok: true, content } => {
                        let _ = serde_json::from_str::<serde_json::Value>(&content);
                    }
                    Body::ToolResult { content: m, .. } | Body::Error { message: m, .. } => {
                        let _ = m.len();
                    }
                    _ => {}
                }
            }
            Ok(None) | Err(_) => return,
        }
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
