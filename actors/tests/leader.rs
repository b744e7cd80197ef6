//! The channels across hosts (issue #26): the leader holds them. On another host an agent's
//! channel call goes to the leader and its answer comes back to the agent; the leader answers a
//! call only for an agent the swarm file places on the asking host, with that agent's powers;
//! the leader's notifications for another host's agent go to that host, whose answer moves the
//! leader's cursor. In-process over real SQLite and a real socket, the test in the place of the
//! cluster link.

mod common;

use common::{ack, delta, next, tool, tool_as};
use flock_actors::RouterMsg;
use flock_actors::messages::{DeltaSpan, HostAsk, OutCall};
use flock_actors::store_actor::with_store;
use flock_ipc::{Body, DeliveryKind, ErrorCode};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::oneshot;

const YAML: &str = "swarm: {name: t}\ncluster: {nats: \"nats://127.0.0.1:4222\"}\n\
channels: {delta_delay_min_ms: 0, delta_delay_max_ms: 0}\n\
models:\n  s: {provider: scripted, rules: [{reply: ok}]}\ndefaults: {model: s}\nagents:\n  \
- {name: o, role: orchestrator}\n  - {name: w, role: worker, host: gpu}\n  - {name: x, role: worker, host: cpu}\n";

/// What the router asks the link next: (host, id, ask).
async fn asked(calls: &mut UnboundedReceiver<OutCall>) -> (String, u128, HostAsk) {
    let out = tokio::time::timeout(std::time::Duration::from_secs(5), calls.recv()).await;
    match out {
        Ok(Some(OutCall::Ask { host, id, ask, .. })) => (host, id, ask),
        other => panic!("expected an ask for another host, got {other:?}"),
    }
}

/// Host `host` asks the router `ask` (call `id`); its answer.
async fn ask(router: &ractor::ActorRef<RouterMsg>, host: &str, id: u128, ask: HostAsk) -> Body {
    let (tx, rx) = oneshot::channel();
    router.cast(RouterMsg::HostAsked { host: host.into(), id, ask, reply: tx }).unwrap();
    rx.await.expect("the router answers")
}

fn post(caller: &str, name: &str, args: serde_json::Value) -> HostAsk {
    HostAsk::Tool {
        caller: caller.into(),
        name: name.into(),
        arguments: args.to_string(),
        chain: None,
        answers: false,
    }
}

/// A host's answer to the leader's ask (5 s at most).
async fn answer(rx: oneshot::Receiver<Body>) -> Body {
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), rx).await;
    got.expect("answered within 5 s").expect("the router answers")
}

fn span(channel: &str, born: i64, after: u64, upto: u64) -> DeltaSpan {
    DeltaSpan { channel: channel.into(), born, after, upto }
}

fn refusal(body: Body) -> (ErrorCode, String) {
    match body {
        Body::Error { code, message } => (code, message),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_answers_another_hosts_agent_with_its_own_powers_and_notifies_it_through_its_host()
 {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("main")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let mut o = node.agent("o").await;
    // The leader's channels know the other hosts' agents: `w` (on gpu) can be made a member.
    let made = tool(&mut o, "flock_channel_create", json!({"channel": "room", "members": ["w"]}));
    made.await.expect("created with an agent of another host");

    // `w`'s post, from its host: posted as `w`'s, and `o` is told.
    let body = ask(
        &node.router,
        "gpu",
        1,
        post("w", "flock_channel_post", json!({"channel": "room", "text": "from gpu"})),
    )
    .await;
    assert!(matches!(&body, Body::ToolResult { ok: true, .. }), "{body:?}");
    let (f, text) = delta(&mut o).await;
    assert!(text.contains("w: from gpu"), "{text}");
    ack(&o, &f).await;

    // `o`'s post: the notification for `w` goes to its host; its answer moves the cursor.
    tool(&mut o, "flock_channel_post", json!({"channel": "room", "text": "to gpu"})).await.unwrap();
    let (host, id, what) = asked(&mut calls).await;
    assert_eq!(host, "gpu");
    let HostAsk::Delta { agent, span: covers, text, .. } = what else { panic!("{what:?}") };
    let upto = covers.upto;
    assert_eq!((agent.as_str(), covers.channel.as_str()), ("w", "room"));
    assert!(
        text.contains("o: to gpu") && !text.contains("from gpu"),
        "w's own post is not news to it: {text}"
    );
    node.router.cast(RouterMsg::HostAnswered { id, body: Body::Accepted }).unwrap();
    let store = node.store.clone();
    let mut sent = 0;
    for _ in 0..100 {
        let cursors = with_store(&store, |s| s.cursors()).await.unwrap();
        sent = cursors
            .iter()
            .find(|(a, c, _)| a == "w" && c == "room")
            .map_or(0, |(_, _, c)| c.sent_seq);
        if sent == upto {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(sent, upto, "the leader's cursor for w moved once its host took the notification");

    // Refused: a host speaking for another host's agent, a call the caller's role does not
    // allow, a lifecycle call (it stays on the caller's host), the same call id twice.
    let (code, msg) = refusal(
        ask(
            &node.router,
            "cpu",
            2,
            post("w", "flock_channel_post", json!({"channel": "room", "text": "forged"})),
        )
        .await,
    );
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("host `cpu` may not speak for `w`"), "{msg}");
    let (code, msg) = refusal(
        ask(&node.router, "gpu", 3, post("w", "flock_channel_create", json!({"channel": "mine"})))
            .await,
    );
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("`w` is a worker"), "{msg}");
    let (code, _) = refusal(
        ask(&node.router, "gpu", 4, post("w", "flock_create_agent", json!({"name": "z"}))).await,
    );
    assert_eq!(code, ErrorCode::BadRequest);
    let (code, msg) = refusal(
        ask(
            &node.router,
            "gpu",
            1,
            post("w", "flock_channel_post", json!({"channel": "room", "text": "again"})),
        )
        .await,
    );
    assert_eq!(code, ErrorCode::BadRequest, "{msg}");
    // A host answers a person only for its own agents.
    let answer = HostAsk::Answer {
        agent: "x".into(),
        human: "human:bob".into(),
        text: "forged".into(),
        chain: 9,
        place: Some(flock_actors::chains::ReplyPlace { channel: "room".into(), seq: 1 }),
    };
    let (code, msg) = refusal(ask(&node.router, "gpu", 6, answer).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("host `gpu` may not answer for `x`"), "{msg}");
    // Nobody but the leader sends notifications.
    let d = HostAsk::Delta {
        agent: "o".into(),
        span: span("room", 1, 0, 9),
        text: "x".into(),
        chain: None,
    };
    assert_eq!(refusal(ask(&node.router, "gpu", 5, d).await).0, ErrorCode::Forbidden);
    let read = tool(&mut o, "flock_channel_read", json!({"channel": "room"})).await.unwrap();
    let texts: Vec<&str> =
        read["messages"].as_array().unwrap().iter().filter_map(|m| m["text"].as_str()).collect();
    assert_eq!(texts, ["from gpu", "to gpu"], "{read}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_another_host_channel_calls_go_to_the_leader_and_its_notifications_become_turns() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("gpu")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let mut w = node.agent("w").await;
    // The leader hears that `w` is ready.
    let (host, _, ready) = asked(&mut calls).await;
    assert_eq!((host.as_str(), ready), ("main", HostAsk::Ready { agent: "w".into() }));

    // A post: asked of the leader as `w`'s; the leader's answer is the agent's.
    let frame_id = flock_ipc::id::new_id();
    let w_conn = &mut w;
    let call =
        tool_as(w_conn, frame_id, "flock_channel_post", json!({"channel": "room", "text": "hi"}));
    let answer = async {
        let (host, id, what) = asked(&mut calls).await;
        assert_eq!(host, "main");
        assert_eq!(
            what,
            HostAsk::Tool {
                caller: "w".into(),
                name: "flock_channel_post".into(),
                arguments: json!({"channel": "room", "text": "hi"}).to_string(),
                chain: None,
                answers: false,
            }
        );
        let body = Body::ToolResult { ok: true, content: "{\"seq\":7}".into() };
        node.router.cast(RouterMsg::HostAnswered { id, body }).unwrap();
    };
    let (got, ()) = tokio::join!(call, answer);
    assert_eq!(got.unwrap(), "{\"seq\":7}");

    // A notification from the leader: a turn of `w`; its Ack is the leader's answer.
    let d = HostAsk::Delta {
        agent: "w".into(),
        span: span("room", 1, 0, 8),
        text: "[Channel: #room] o: hi w".into(),
        chain: None,
    };
    let (tx, rx) = oneshot::channel();
    node.router
        .cast(RouterMsg::HostAsked { host: "main".into(), id: 50, ask: d.clone(), reply: tx })
        .unwrap();
    let f = next(&mut w).await;
    let Body::Deliver(delivery) = &f.body else { panic!("{f:?}") };
    assert_eq!(
        (delivery.kind, delivery.text.as_str()),
        (DeliveryKind::Delta, "[Channel: #room] o: hi w")
    );
    ack(&w, &f).await;
    assert_eq!(rx.await.unwrap(), Body::Accepted);
    // Not from a host that is not the leader; not twice; no channel calls answered here.
    assert_eq!(refusal(ask(&node.router, "cpu", 51, d.clone()).await).0, ErrorCode::Forbidden);
    assert_eq!(refusal(ask(&node.router, "main", 50, d).await).0, ErrorCode::BadRequest);
    let (code, msg) = refusal(
        ask(&node.router, "cpu", 52, post("x", "flock_channel_read", json!({"channel": "room"})))
            .await,
    );
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("does not keep the channels"), "{msg}");
}

/// A person who asked in a channel (their post reached this host from the leader) is answered
/// through the leader; the input is completed here only once the leader posted the answer, and
/// a leader that cannot be reached is asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_question_from_the_leader_is_answered_through_it_and_completed_once_posted() {
    use flock_actors::chains::{ReplyPlace, Route};
    use flock_actors::messages::FromHost;
    use flock_actors::store::PendingMessage;
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("gpu")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let mut w = node.agent("w").await;
    asked(&mut calls).await; // w is ready
    let person = "human:telegram:alice";
    let mut route = Route::root(77, person, "w", "sum?", 1, Some(person.into()));
    route.chain.reply = Some(ReplyPlace { channel: "team".into(), seq: 4 });
    let msg = |sender: &str| PendingMessage {
        id: 77,
        sender: sender.into(),
        target: "w".into(),
        text: "what is 17 + 25?".into(),
        attempts: 0,
        route: route.store(77),
        enqueued_at: 1,
    };
    let from = |host: &str, m: PendingMessage| {
        let (tx, rx) = oneshot::channel();
        node.router.cast(RouterMsg::FromHost { host: host.into(), msg: m, reply: tx }).unwrap();
        rx
    };
    // Only the leader brings a person's words.
    assert!(matches!(from("cpu", msg(person)).await.unwrap(), FromHost::Refused(_)));
    assert_eq!(from("main", msg(person)).await.unwrap(), FromHost::Stored);
    // The leader's chat shows that an agent here works on alice's post.
    let (_, _, working) = asked(&mut calls).await;
    assert_eq!(working, HostAsk::Working { channel: "team".into(), seq: 4, on: true });
    let f = next(&mut w).await;
    assert!(matches!(&f.body, Body::Deliver(d) if d.text == "what is 17 + 25?"), "{f:?}");
    let done = flock_ipc::Frame {
        correlation_id: Some(f.id),
        ..flock_ipc::Frame::new("w", "router", Body::Ack { reply: Some("42".into()) })
    };
    w.outbox.send(done).await.unwrap();
    // The answer goes to the leader, for where alice asked; the first ask finds no leader.
    let (host, id, what) = asked(&mut calls).await;
    assert_eq!(host, "main");
    let expected = HostAsk::Answer {
        agent: "w".into(),
        human: person.into(),
        text: "42".into(),
        chain: 77,
        place: Some(ReplyPlace { channel: "team".into(), seq: 4 }),
    };
    assert_eq!(what, expected);
    let down = Body::Error { code: ErrorCode::TargetUnavailable, message: "no responders".into() };
    node.router.cast(RouterMsg::HostAnswered { id, body: down }).unwrap();
    let pending = |store: ractor::ActorRef<flock_actors::StoreMsg>| async move {
        with_store(&store, |s| s.pending_for(&["w".to_owned()], 10)).await.unwrap().len()
    };
    assert_eq!(pending(node.store.clone()).await, 1, "not completed before it is posted");
    // Asked again a while later; posted this time: the input is completed.
    let (host, id, again) = asked(&mut calls).await;
    assert_eq!((host.as_str(), &again), ("main", &expected));
    let posted = json!({"channel": "team", "seq": 5, "duplicate": false}).to_string();
    node.router
        .cast(RouterMsg::HostAnswered { id, body: Body::ToolResult { ok: true, content: posted } })
        .unwrap();
    let mut left = 1;
    for _ in 0..100 {
        left = pending(node.store.clone()).await;
        if left == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(left, 0, "completed once the leader posted the answer");
    let (_, _, working) = asked(&mut calls).await;
    assert_eq!(working, HostAsk::Working { channel: "team".into(), seq: 4, on: false });
}

/// The leader keeps the permission records: another host's worker asks there, with that
/// worker's powers only, and the asking host's own protected paths are never granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_decides_another_hosts_permission_calls_and_protects_that_hosts_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("main")).await;
    let permission = |caller: &str, name: &str, args: serde_json::Value| HostAsk::Permission {
        caller: caller.into(),
        name: name.into(),
        arguments: args.to_string(),
        key: flock_ipc::id::new_id(),
        protected: vec!["/srv/gpu-state".into()],
    };
    let text = |body: Body| match body {
        Body::ToolResult { ok, content } => (ok, content),
        other => panic!("expected a tool result, got {other:?}"),
    };
    let asked = json!({"capability": "network", "target": "example.com", "reason": "deps"});
    let (ok, content) =
        text(ask(&node.router, "gpu", 60, permission("w", "permission_request", asked)).await);
    assert!(ok && content.contains("request #1"), "{content}");
    let state = json!({"capability": "read", "target": "/srv/gpu-state/flock.db", "reason": "x"});
    let asked = permission("w", "permission_request", state);
    let (code, msg) = refusal(ask(&node.router, "gpu", 61, asked).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("is Flock's state") && msg.contains("/srv/gpu-state"), "{msg}");
    let verdict = json!({"id": 1, "verdict": "GREEN", "reason": "me"});
    let (code, msg) =
        refusal(ask(&node.router, "gpu", 62, permission("w", "permission_verdict", verdict)).await);
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    let (code, msg) =
        refusal(ask(&node.router, "cpu", 63, permission("w", "permission_list", json!({}))).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("host `cpu` may not speak for `w`"), "{msg}");
}

/// An instance an agent of another host spawned there (`w@job-1`) runs where its agent is placed:
/// the leader answers its channel calls from that host only, with its agent's role, and tells it
/// of posts through that host; the leader does not spawn it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_spawned_on_another_host_is_that_hosts_and_has_its_agents_powers() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("main")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let mut o = node.agent("o").await;
    let made =
        tool(&mut o, "flock_channel_create", json!({"channel": "jobs", "members": ["w@job-1"]}));
    made.await.expect("an instance of gpu's agent is a member");
    let body = ask(
        &node.router,
        "gpu",
        1,
        post("w@job-1", "flock_channel_post", json!({"channel": "jobs", "text": "job done"})),
    )
    .await;
    assert!(matches!(&body, Body::ToolResult { ok: true, .. }), "{body:?}");
    let (f, text) = delta(&mut o).await;
    assert!(text.contains("w@job-1: job done"), "{text}");
    ack(&o, &f).await;
    // Its role is its agent's: a worker creates no channel.
    let create = post("w@job-1", "flock_channel_create", json!({"channel": "mine"}));
    let (code, msg) = refusal(ask(&node.router, "gpu", 2, create).await);
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    // Another host does not speak for it.
    let forged = post("w@job-1", "flock_channel_post", json!({"channel": "jobs", "text": "x"}));
    let (code, msg) = refusal(ask(&node.router, "cpu", 3, forged).await);
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("host `cpu` may not speak for `w@job-1`"), "{msg}");
    // A post for it goes to its host.
    tool(&mut o, "flock_channel_post", json!({"channel": "jobs", "text": "next job"}))
        .await
        .unwrap();
    let (host, _, what) = asked(&mut calls).await;
    let HostAsk::Delta { agent, .. } = what else { panic!("{what:?}") };
    assert_eq!((host.as_str(), agent.as_str()), ("gpu", "w@job-1"));
    // The leader does not start gpu's agent here.
    let spawned = tool(&mut o, "agents__spawn", json!({"agent": "w", "instance": "job-2"})).await;
    let msg = spawned.expect_err("refused");
    assert!(msg.contains("FORBIDDEN") && msg.contains("runs on another host"), "{msg}");
}

/// A name the swarm file places on another host is never created here (its host runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_placed_on_another_host_is_not_created_here() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, true, Some("gpu")).await;
    let channels = node.channels.as_ref().expect("gpu's channels (its operator's DMs)");
    let create = |name: &str| {
        let caller = flock_actors::caller::Caller { id: "human:operator".into(), role: None };
        let arguments = json!({"name": name, "role": "worker"}).to_string();
        async move {
            ractor::call!(channels, |reply| flock_actors::messages::ChannelsMsg::Human {
                caller,
                name: "flock_create_agent".into(),
                arguments,
                reply
            })
            .unwrap()
        }
    };
    for placed in ["o", "x"] {
        let (code, msg) = create(placed).await.unwrap_err();
        assert_eq!(code, ErrorCode::BadRequest);
        assert!(
            msg.contains(&format!("places an agent named `{placed}` on another host")),
            "{msg}"
        );
    }
    // Any other name gets past that check (this test's supervisor starts no process).
    let (_, msg) = create("helper").await.unwrap_err();
    assert!(msg.contains("cannot start agents"), "{msg}");
}

/// The leader sends a notification again when it lost the answer to the first (it was killed
/// before the answer reached it): the host, restarted or not, answers from what its agent was
/// told — all of it, or up to a seq — and the agent takes no message twice. A channel made again
/// under the same name is news.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_the_leader_sends_again_is_not_told_twice_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // Host gpu (life `life` of it) with `w` connected; the link's calls are kept open.
    let gpu = |life: u32| {
        let dir = dir.path().to_owned();
        async move {
            let node = common::start_on(&dir, life, YAML, true, Some("gpu")).await;
            let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).unwrap();
            let w = node.agent("w").await;
            asked(&mut calls).await; // ready
            (node, calls, w)
        }
    };
    // The leader's notification `id` for `w`; its answer comes on the receiver.
    let notify = |node: &common::Node, id: u128, span: DeltaSpan, text: &str| {
        let d = HostAsk::Delta { agent: "w".into(), span, text: text.into(), chain: None };
        let (tx, rx) = oneshot::channel();
        node.router
            .cast(RouterMsg::HostAsked { host: "main".into(), id, ask: d, reply: tx })
            .unwrap();
        rx
    };
    {
        let (node, _calls, mut w) = gpu(0).await;
        let rx = notify(&node, 50, span("room", 7, 0, 8), "o: one");
        let (f, text) = delta(&mut w).await;
        assert!(text.contains("o: one"), "{text}");
        ack(&w, &f).await;
        assert_eq!(answer(rx).await, Body::Accepted);
        // The same notification again, before any restart: answered, no turn.
        let rx = notify(&node, 51, span("room", 7, 0, 8), "o: one");
        assert_eq!(answer(rx).await, Body::Accepted);
        common::nothing_for(&mut w, 200).await;
        let told = with_store(&node.store, |s| s.deltas_told()).await.unwrap();
        assert_eq!(told.get(&("w".to_owned(), "room".to_owned())), Some(&(7, 8)));
        node.router.stop(None);
    }
    // The host restarts: what its agent was told is in its store.
    let (node, _calls, mut w) = gpu(1).await;
    let rx = notify(&node, 60, span("room", 7, 0, 8), "o: one");
    assert_eq!(answer(rx).await, Body::Accepted, "told before the restart");
    // More came since: the leader hears how far the agent was told, and sends only the rest.
    let rx = notify(&node, 61, span("room", 7, 0, 10), "o: one\no: two");
    assert_eq!(answer(rx).await, Body::Reply { text: "8".into() });
    common::nothing_for(&mut w, 200).await;
    let rx = notify(&node, 62, span("room", 7, 8, 10), "o: two");
    let (f, text) = delta(&mut w).await;
    assert_eq!(text, "o: two");
    ack(&w, &f).await;
    assert_eq!(answer(rx).await, Body::Accepted);
    // `room` made again on a leader whose state was wiped: its seqs start over, and are news.
    let rx = notify(&node, 63, span("room", 9, 0, 2), "o: anew");
    let (f, text) = delta(&mut w).await;
    assert_eq!(text, "o: anew");
    ack(&w, &f).await;
    assert_eq!(answer(rx).await, Body::Accepted);
}

/// The leader told that another host's agent had been told part of a notification (it lost the
/// first answer) moves its cursor there and sends only the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_told_how_far_another_hosts_agent_was_told_sends_only_the_rest() {
    let yaml = YAML.replace(
        "delta_delay_min_ms: 0, delta_delay_max_ms: 0",
        "delta_delay_min_ms: 300, delta_delay_max_ms: 300",
    );
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, &yaml, true, Some("main")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).unwrap();
    let mut o = node.agent("o").await;
    let made = tool(&mut o, "flock_channel_create", json!({"channel": "room", "members": ["w"]}));
    made.await.unwrap();
    for text in ["one", "two"] {
        tool(&mut o, "flock_channel_post", json!({"channel": "room", "text": text})).await.unwrap();
    }
    let (_, id, what) = asked(&mut calls).await;
    let HostAsk::Delta { span: first, text, .. } = what else { panic!("{what:?}") };
    assert_eq!((first.after, first.upto), (0, 2), "{text}");
    assert!(text.contains("o: one") && text.contains("o: two"), "{text}");
    node.router
        .cast(RouterMsg::HostAnswered { id, body: Body::Reply { text: "1".into() } })
        .unwrap();
    let (_, id, what) = asked(&mut calls).await;
    let HostAsk::Delta { span: rest, text, .. } = what else { panic!("{what:?}") };
    assert_eq!((rest.born, rest.after, rest.upto), (first.born, 1, 2));
    assert!(text.contains("o: two") && !text.contains("o: one"), "{text}");
    node.router.cast(RouterMsg::HostAnswered { id, body: Body::Accepted }).unwrap();
    let cursor = || async {
        let all = with_store(&node.store, |s| s.cursors()).await.unwrap();
        all.into_iter().find(|(a, c, _)| a == "w" && c == "room").map(|(_, _, c)| c.sent_seq)
    };
    for _ in 0..100 {
        if cursor().await == Some(2) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(cursor().await, Some(2));
}
