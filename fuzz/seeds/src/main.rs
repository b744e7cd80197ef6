//! Writes seed inputs for the fuzz targets: valid, length-prefixed frame streams as each side of a
//! connection sends them, under `CORPUS_DIR/<target>/seed-*` (overwritten on every run, so they
//! follow the wire format). Usage: `flock-fuzz-seeds CORPUS_DIR`.

use std::path::{Path, PathBuf};

use flock_ipc::{
    Body, ChainEnd, ChainOutcome, ChainRow, ControlReply, ControlRequest, DeadLetter, Delivery,
    DeliveryKind, ErrorCode, Frame, Hello, MsgId, OPERATOR, PROTOCOL_VERSION, PsRow, ROUTER,
    SendMode, SourcedLine, Welcome,
};

/// Same as `flock_ipc_fuzz::{KNOWN_AGENT, KNOWN_TOKEN}` (the agent the mirrored router knows).
const AGENT: &str = "worker";
const TOKEN: &str = "0123456789abcdef";
/// Same as `flock_ipc_fuzz::KNOWN_BRIDGE`.
const BRIDGE: &str = "tg";

/// A small valid swarm, for a real `AgentSpec` in the `Welcome` seeds.
const SWARM: &str = "swarm:
  name: fuzz
models:
  echo:
    provider: scripted
    rules:
      - reply: \"echo {input}\"
agents:
  - name: worker
    role: worker
    model: echo
    can_call: [helper]
  - name: helper
    role: worker
    model: echo
";

const CHAIN: MsgId = 0x0193_0000_0000_0000_0000_0000_0000_00c4;

fn frame(n: u128, from: &str, to: &str, correlation: Option<u128>, body: Body) -> Frame {
    Frame {
        id: 0x0193_0000_0000_0000_0000_0000_0000_0000 + n,
        from: from.into(),
        to: to.into(),
        correlation_id: correlation.map(|c| 0x0193_0000_0000_0000_0000_0000_0000_0000 + c),
        deadline_ms: if n.is_multiple_of(2) { Some(1_760_000_000_000) } else { None },
        body,
    }
}

fn stream(frames: &[Frame]) -> Vec<u8> {
    let mut buf = Vec::new();
    for f in frames {
        flock_ipc::encode_frame(f, &mut buf).expect("a seed frame encodes");
    }
    buf
}

struct Out {
    dir: PathBuf,
    count: usize,
}

impl Out {
    fn new(root: &Path, target: &str) -> Out {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        Out { dir, count: 0 }
    }

    fn write(&mut self, name: &str, bytes: &[u8]) {
        let path = self.dir.join(format!("seed-{name}"));
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        self.count += 1;
    }
}

fn hello(version: u32, agent: &str, instance: &str, token: &str) -> Frame {
    let hello = Hello {
        protocol_version: version,
        agent_id: agent.into(),
        instance: instance.into(),
        pid: 4242,
        token: token.into(),
    };
    frame(1, agent, ROUTER, None, Body::Hello(hello))
}

fn welcome(spec_json: String) -> Frame {
    let welcome = Welcome {
        protocol_version: PROTOCOL_VERSION,
        swarm: "fuzz".into(),
        agent_spec_json: spec_json,
        heartbeat_interval_ms: 1000,
        max_frame_bytes: 16 << 20,
    };
    frame(2, ROUTER, AGENT, Some(1), Body::Welcome(welcome))
}

fn bridge_hello(version: u32, bridge: &str, token: &str) -> Frame {
    let hello = Hello {
        protocol_version: version,
        agent_id: bridge.into(),
        instance: String::new(),
        pid: 4343,
        token: token.into(),
    };
    frame(1, bridge, ROUTER, None, Body::BridgeHello(hello))
}

/// What a chat bridge sends after its `BridgeHello` (as `flock-bridge` does).
fn bridge_frames() -> Vec<Frame> {
    let call = |n, name: &str, args: &str| {
        let body = Body::ToolCall { name: name.into(), arguments: args.into() };
        frame(n, BRIDGE, ROUTER, None, body)
    };
    vec![
        frame(40, BRIDGE, ROUTER, None, Body::Heartbeat),
        call(
            41,
            "bridge__status",
            r#"{"state":"connected","outbox":2,"inbound":1,"outbound":3,"last_error":null,"mappings":{"-100200300":{"outbox":2,"broken":null},"-100400500":{"outbox":0,"broken":"sendMessage: 403 Forbidden"}}}"#,
        ),
        call(
            42,
            "bridge__post",
            r#"{"external":"-100200300","message_id":"7","user_id":"42","user_name":"Alice Smith","text":"hi @worker"}"#,
        ),
        call(
            43,
            "bridge__post",
            r#"{"external":"-100400500","message_id":8,"user_id":7,"user_name":"mallory"}"#,
        ),
        call(44, "bridge__pull", r#"{"external":"-100200300","wait_ms":20000}"#),
        call(45, "bridge__sent", r#"{"external":"-100200300","seq":4,"external_id":"99"}"#),
        call(46, "bridge__last", r#"{"external":"-100200300"}"#),
        frame(47, BRIDGE, "worker", None, Body::Send { text: "x".into(), mode: SendMode::Durable }),
        frame(48, BRIDGE, ROUTER, None, Body::ShutdownAck),
    ]
}

fn client_hello(version: u32) -> Frame {
    let body = Body::ClientHello {
        protocol_version: version,
        client: "flockctl".into(),
        key: TOKEN.into(),
    };
    frame(1, OPERATOR, ROUTER, None, body)
}

/// What an agent sends after its `Hello`.
fn agent_frames() -> Vec<(&'static str, Frame)> {
    let to = |n, body| frame(n, AGENT, ROUTER, None, body);
    let peer = |n, body| frame(n, AGENT, "helper", None, body);
    let text = |s: &str| s.to_string();
    vec![
        ("heartbeat", to(10, Body::Heartbeat)),
        ("send", peer(11, Body::Send { text: text("hi"), mode: SendMode::Durable })),
        ("send-amo", peer(12, Body::Send { text: text("x"), mode: SendMode::AtMostOnce })),
        ("send-upkeep", peer(12, Body::Send { text: text("x"), mode: SendMode::Upkeep })),
        ("request", peer(13, Body::Request { text: text("2+2?"), timeout_ms: 5000 })),
        ("delegate", peer(14, Body::Delegate { text: text("do it") })),
        ("ack", frame(15, AGENT, ROUTER, Some(3), Body::Ack { reply: Some(text("4")) })),
        ("nack", frame(16, AGENT, ROUTER, Some(3), Body::Nack { reason: text("busy") })),
        ("toolcall", to(17, Body::ToolCall { name: text("agents__list"), arguments: text("{}") })),
        ("llmcall", to(18, Body::LlmCall { request: text(r#"{"messages":[]}"#) })),
        ("session-save", to(19, Body::SessionSave { channel: text(""), messages: text("[]") })),
        ("session-load", to(20, Body::SessionLoad { channel: text("general") })),
        ("shutdown-ack", to(21, Body::ShutdownAck)),
        ("reply", frame(22, AGENT, "helper", Some(13), Body::Reply { text: text("4") })),
    ]
}

/// What the router sends an agent after its `Welcome`.
fn router_frames() -> Vec<(&'static str, Frame)> {
    let delivery = Delivery {
        kind: DeliveryKind::Request,
        sender: "helper".into(),
        text: "what is 2+2?".into(),
        attempt: 1,
        durable: true,
        call_chain: vec!["helper@default".into()],
        channel: Some("general".into()),
        answer_to: Some("human:alice".into()),
        chain: Some(CHAIN),
    };
    let to = |n, c, body| frame(n, ROUTER, AGENT, c, body);
    vec![
        ("deliver", to(3, None, Body::Deliver(delivery))),
        ("cancel", to(30, Some(3), Body::Cancel { reason: "deadline".into() })),
        ("accepted", to(31, Some(11), Body::Accepted)),
        ("toolresult", to(32, Some(17), Body::ToolResult { ok: true, content: "[]".into() })),
        ("llmresult", to(33, Some(18), Body::LlmResult { ok: false, response: "no key".into() })),
        (
            "session-data",
            to(
                34,
                Some(20),
                Body::SessionData { channel: "general".into(), messages: "[]".into() },
            ),
        ),
        ("session-closed", to(35, None, Body::SessionClosed { channel: "general".into() })),
        (
            "error",
            to(36, Some(13), Body::Error { code: ErrorCode::Timeout, message: "late".into() }),
        ),
        ("heartbeat-ack", to(37, Some(10), Body::HeartbeatAck)),
        ("shutdown", to(38, None, Body::Shutdown)),
    ]
}

fn control_requests() -> Vec<(&'static str, ControlRequest)> {
    let agent = || AGENT.to_string();
    vec![
        ("ps", ControlRequest::Ps),
        ("logs", ControlRequest::Logs { agent: Some(agent()), lines: 50, follow: true }),
        ("logs-all", ControlRequest::Logs { agent: None, lines: 20, follow: false }),
        ("stop", ControlRequest::Stop { agent: agent() }),
        ("start", ControlRequest::Start { agent: agent() }),
        ("restart", ControlRequest::Restart { agent: agent() }),
        ("dead-letters", ControlRequest::DeadLetters { offset: 0, limit: 100 }),
        ("down", ControlRequest::Down),
        ("session", ControlRequest::Session { agent: agent(), channel: Some("general".into()) }),
        (
            "channel",
            ControlRequest::Channel {
                tool: "flock_channel_post".into(),
                arguments: r#"{"channel":"general","text":"hello"}"#.into(),
                as_name: "alice".into(),
            },
        ),
        ("watch", ControlRequest::Watch { chain: CHAIN }),
        ("chains", ControlRequest::Chains),
        (
            "memory",
            ControlRequest::Memory {
                tool: "memory_search".into(),
                arguments: r#"{"query":"trip","limit":5}"#.into(),
            },
        ),
    ]
}

fn control_replies() -> Vec<(&'static str, Body)> {
    let ps = PsRow {
        name: AGENT.into(),
        kind: "agent".into(),
        role: "worker".into(),
        pid: Some(4242),
        state: "ready".into(),
        uptime_secs: 12,
        restarts: 1,
        last_exit: Some("exited(1)".into()),
        mailbox_depth: 3,
        turns_total: 7,
        rss_bytes: Some(10 << 20),
        tokens_in: 1000,
        tokens_out: 200,
        sandbox: Some("native".into()),
        confined: Some(true),
        host: None,
    };
    let dead = DeadLetter {
        id: CHAIN + 1,
        sender: "operator".into(),
        target: AGENT.into(),
        text: "lost".into(),
        attempts: 5,
        reason: "crashed".into(),
    };
    let row = ChainRow {
        id: CHAIN,
        origin: "human:alice".into(),
        entry: AGENT.into(),
        text: "what is".into(),
        state: "running".into(),
        hops: 2,
        max_hops: 16,
        tokens: 300,
        max_tokens: 100_000,
        age_ms: 1500,
        max_wall_ms: 600_000,
        live: 1,
    };
    let end = ChainEnd {
        chain: CHAIN,
        outcome: ChainOutcome::Answered,
        text: "4".into(),
        by: AGENT.into(),
        channel: "dm-alice-worker".into(),
        seq: 9,
        hops: 2,
        tokens: 300,
        elapsed_ms: 1500,
    };
    vec![
        ("ps", Body::ControlReply(ControlReply::Ps(vec![ps]))),
        ("loglines", Body::ControlReply(ControlReply::LogLines(vec!["a".into(), "b".into()]))),
        (
            "sourced-loglines",
            Body::ControlReply(ControlReply::SourcedLogLines(vec![
                SourcedLine { source: AGENT.into(), line: "a".into() },
                SourcedLine { source: String::new(), line: "… 3 lines skipped …".into() },
            ])),
        ),
        ("dead-letters", Body::ControlReply(ControlReply::DeadLetters(vec![dead]))),
        ("done", Body::ControlReply(ControlReply::Done("stopped worker".into()))),
        (
            "json",
            Body::ControlReply(ControlReply::Json(r#"{"ok":true,"seq":[1,2.5,null]}"#.into())),
        ),
        ("chains", Body::ControlReply(ControlReply::Chains(vec![row]))),
        ("error", Body::Error { code: ErrorCode::AgentNotFound, message: "no agent".into() }),
        ("chain-ended", Body::ChainEnded(end)),
    ]
}

fn main() {
    let Some(root) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: flock-fuzz-seeds CORPUS_DIR");
        std::process::exit(2);
    };
    let spec = flock_config::parse(SWARM, Path::new("swarm.yaml"))
        .unwrap_or_else(|e| panic!("the seed swarm is invalid:\n{e}"));
    let spec_json = serde_json::to_string(&spec.agents[0]).expect("an AgentSpec serializes");

    // handshake: what each end of an agent connection reads.
    let mut hs = Out::new(&root, "handshake");
    let ok = hello(PROTOCOL_VERSION, AGENT, "default", TOKEN);
    hs.write("hello", &stream(std::slice::from_ref(&ok)));
    let mut session = vec![ok.clone()];
    session.extend(agent_frames().into_iter().map(|(_, f)| f));
    hs.write("hello-session", &stream(&session));
    hs.write("hello-instance", &stream(&[hello(PROTOCOL_VERSION, AGENT, "task-1", TOKEN)]));
    hs.write("hello-old-version", &stream(&[hello(PROTOCOL_VERSION - 1, AGENT, "", TOKEN)]));
    hs.write("hello-bad-token", &stream(&[hello(PROTOCOL_VERSION, AGENT, "", "nope")]));
    hs.write("hello-unknown", &stream(&[hello(PROTOCOL_VERSION, "ghost", "", TOKEN)]));
    hs.write("client-hello", &stream(&[client_hello(PROTOCOL_VERSION)]));
    hs.write("welcome", &stream(&[welcome(spec_json.clone())]));
    let mut delivered = vec![welcome(spec_json.clone())];
    delivered.extend(router_frames().into_iter().map(|(_, f)| f));
    hs.write("welcome-session", &stream(&delivered));
    let reject = Body::Reject { code: ErrorCode::Forbidden, reason: "wrong token".into() };
    hs.write("reject", &stream(&[frame(2, ROUTER, AGENT, Some(1), reject)]));
    // A chat bridge on the same socket: its hello and session, and what it reads back.
    let bridge_ok = bridge_hello(PROTOCOL_VERSION, BRIDGE, TOKEN);
    hs.write("bridge-hello", &stream(std::slice::from_ref(&bridge_ok)));
    let mut session = vec![bridge_ok];
    session.extend(bridge_frames());
    hs.write("bridge-hello-session", &stream(&session));
    hs.write("bridge-hello-bad-token", &stream(&[bridge_hello(PROTOCOL_VERSION, BRIDGE, "nope")]));
    hs.write("bridge-hello-unknown", &stream(&[bridge_hello(PROTOCOL_VERSION, "dc", TOKEN)]));
    let bridge_spec = r#"{"name":"tg","platform":"telegram","token_env":"TG_TOKEN","app_token_env":null,"api_url":null,"channels":[{"flock":"team","external":"-100200300","allow":null},{"flock":"ops","external":"-100400500","allow":["42"]}],"max_posts_per_minute":20}"#;
    let mut back = vec![welcome(bridge_spec.into())];
    let answer = |n, c, body| frame(n, ROUTER, BRIDGE, Some(c), body);
    back.push(answer(50, 40, Body::HeartbeatAck));
    back.push(answer(51, 42, Body::ToolResult {
        ok: true,
        content: r#"{"channel":"team","seq":4,"author":"human:telegram:alice-smith","duplicate":false}"#.into(),
    }));
    back.push(answer(
        52,
        43,
        Body::Error {
            code: ErrorCode::Forbidden,
            message: "user 7 may not post in #ops through `tg`".into(),
        },
    ));
    back.push(answer(53, 44, Body::ToolResult {
        ok: true,
        content: r#"{"channel":"team","posts":[{"seq":5,"author":"worker","text":"**done**"}],"upto":5,"newest":5}"#.into(),
    }));
    back.push(frame(54, ROUTER, BRIDGE, None, Body::Shutdown));
    hs.write("bridge-welcome-session", &stream(&back));

    // control: what the supervisor reads from flockctl, and what flockctl reads back.
    let mut ctl = Out::new(&root, "control");
    let mut all = vec![client_hello(PROTOCOL_VERSION)];
    for (i, (name, req)) in control_requests().into_iter().enumerate() {
        let f = frame(100 + i as u128, OPERATOR, ROUTER, None, Body::Control(req));
        ctl.write(
            &format!("request-{name}"),
            &stream(&[client_hello(PROTOCOL_VERSION), f.clone()]),
        );
        all.push(f);
    }
    all.push(frame(99, OPERATOR, ROUTER, None, Body::Heartbeat));
    ctl.write("request-all", &stream(&all));
    ctl.write("client-hello-old-version", &stream(&[client_hello(PROTOCOL_VERSION - 1)]));
    let mut all = vec![welcome(String::new())];
    for (i, (name, body)) in control_replies().into_iter().enumerate() {
        let f = frame(200 + i as u128, ROUTER, OPERATOR, Some(100 + i as u128), body);
        ctl.write(&format!("reply-{name}"), &stream(&[welcome(String::new()), f.clone()]));
        all.push(f);
    }
    ctl.write("reply-all", &stream(&all));
    let reject = Body::Reject { code: ErrorCode::BadRequest, reason: "old flockctl".into() };
    ctl.write("reject", &stream(&[frame(2, ROUTER, OPERATOR, Some(1), reject)]));

    // decode: every frame above as a bare body (`decode_frame`), plus the streams.
    let mut dec = Out::new(&root, "decode");
    let mut frames: Vec<(String, Frame)> = vec![
        ("hello".into(), ok),
        ("client-hello".into(), client_hello(PROTOCOL_VERSION)),
        ("welcome".into(), welcome(spec_json)),
    ];
    frames.extend(agent_frames().into_iter().map(|(n, f)| (n.to_string(), f)));
    frames.extend(router_frames().into_iter().map(|(n, f)| (n.to_string(), f)));
    for (i, (n, req)) in control_requests().into_iter().enumerate() {
        frames.push((
            format!("request-{n}"),
            frame(100 + i as u128, OPERATOR, ROUTER, None, Body::Control(req)),
        ));
    }
    for (i, (n, body)) in control_replies().into_iter().enumerate() {
        frames.push((format!("reply-{n}"), frame(200 + i as u128, ROUTER, OPERATOR, None, body)));
    }
    for (name, f) in &frames {
        dec.write(&format!("body-{name}"), &stream(std::slice::from_ref(f))[4..]);
    }
    dec.write("stream-session", &stream(&session));
    dec.write("stream-delivered", &stream(&delivered));
    let all: Vec<Frame> = frames.into_iter().map(|(_, f)| f).collect();
    dec.write("stream-all", &stream(&all));

    println!(
        "seeds: {} handshake, {} control, {} decode in {}",
        hs.count,
        ctl.count,
        dec.count,
        root.display()
    );
}
