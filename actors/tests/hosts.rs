//! The router's side of a swarm across hosts (issue #26), in-process over real SQLite and a real
//! socket, with the test in the place of the cluster link: what is sent to another host's agent
//! waits in the store for the link, and what arrives from another host is taken only from the
//! host the swarm file places its sender on, stored once, and delivered.

mod common;

use common::{Node, next};
use flock_actors::messages::{FromHost, HostAsk, HostCall, HostReply, OperatorAsk, OutCall};
use flock_actors::store::PendingMessage;
use flock_actors::store_actor::with_store;
use flock_actors::{RouterMsg, StoreMsg};
use flock_ipc::{Body, DeliveryKind, ErrorCode, Frame, SendMode};
use tokio::sync::oneshot;

const YAML: &str = "swarm: {name: t}\ncluster: {nats: \"nats://127.0.0.1:4222\"}\n\
models:\n  s: {provider: scripted, rules: [{reply: ok}]}\ndefaults: {model: s}\nagents:\n  \
- {name: c, role: worker}\n  - {name: w, role: worker, host: gpu}\n  - {name: x, role: worker, host: cpu}\n";

async fn from_host(node: &Node, host: &str, id: u128, sender: &str, target: &str) -> FromHost {
    let msg = PendingMessage {
        id,
        sender: sender.into(),
        target: target.into(),
        text: format!("{sender} to {target}"),
        attempts: 0,
        route: String::new(),
        enqueued_at: 1,
    };
    let (tx, rx) = oneshot::channel();
    node.router.cast(RouterMsg::FromHost { host: host.into(), msg, reply: tx }).unwrap();
    rx.await.expect("the router answers")
}

async fn pending_for(store: &ractor::ActorRef<StoreMsg>, agent: &str) -> Vec<PendingMessage> {
    let agents = vec![agent.to_owned()];
    with_store(store, move |s| s.pending_for(&agents, 100)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_speaks_only_for_its_own_agents_and_a_message_is_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, false, Some("main")).await;
    let mut c = node.agent("c").await;
    // `x` runs on cpu, not gpu; `c` runs here; a message for `x` is not this host's to take.
    for (host, sender, target, why) in [
        ("gpu", "x", "c", "which runs on `cpu`"),
        ("gpu", "c", "c", "which runs on no other host"),
        ("gpu", "w", "x", "`x` runs on host `cpu`, not here"),
    ] {
        match from_host(&node, host, 7, sender, target).await {
            FromHost::Refused(msg) => assert!(msg.contains(why), "{msg}"),
            other => panic!("{sender}@{host} → {target}: {other:?}"),
        }
    }
    // For an agent this host does not know (yet): kept, as mail to it is on one host.
    assert_eq!(from_host(&node, "gpu", 8, "w", "ghost").await, FromHost::Stored);
    assert_eq!(pending_for(&node.store, "ghost").await.len(), 1);
    // The real thing, twice (the broker delivered it again after a crash): stored once.
    assert_eq!(from_host(&node, "gpu", 9, "w", "c").await, FromHost::Stored);
    assert_eq!(from_host(&node, "gpu", 9, "w", "c").await, FromHost::Stored);
    let d = next(&mut c).await;
    match &d.body {
        Body::Deliver(del) => {
            assert_eq!(
                (del.kind, del.sender.as_str(), del.text.as_str()),
                (DeliveryKind::Message, "w", "w to c")
            );
        }
        other => panic!("expected a delivery, got {other:?}"),
    }
    let ack = Frame {
        correlation_id: Some(d.id),
        ..Frame::new("c", "router", Body::Ack { reply: None })
    };
    c.outbox.send(ack).await.unwrap();
    let nothing =
        tokio::time::timeout(std::time::Duration::from_millis(300), c.reader.read_frame()).await;
    assert!(
        nothing.is_err() || matches!(nothing, Ok(Ok(Some(Frame { body: Body::HeartbeatAck, .. })))),
        "delivered twice: {nothing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_another_hosts_agent_waits_in_the_store_for_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, false, Some("main")).await;
    let mut c = node.agent("c").await;
    let f = Frame::new("c", "w", Body::Send { text: "to the gpu".into(), mode: SendMode::Durable });
    c.outbox.send(f.clone()).await.unwrap();
    let accepted = next(&mut c).await;
    assert!(matches!(accepted.body, Body::Accepted), "{accepted:?}");
    let waiting = pending_for(&node.store, "w").await;
    assert_eq!(
        waiting.iter().map(|m| (m.id, m.text.as_str())).collect::<Vec<_>>(),
        [(f.id, "to the gpu")]
    );
    // Sent by the link: gone from the outbox, not a turn of anyone here.
    let sent = vec![(f.id, "gpu".to_owned())];
    with_store(&node.store, move |s| s.mark_forwarded(&sent)).await.unwrap();
    assert!(pending_for(&node.store, "w").await.is_empty());

    // An at-most-once message does not cross hosts: refused, saying where the agent runs (an
    // operator's send is refused the same way: the e2e test shows it through flockctl).
    let body = Body::Send { text: "hi".into(), mode: SendMode::AtMostOnce };
    c.outbox.send(Frame::new("c", "w", body)).await.unwrap();
    match next(&mut c).await.body {
        Body::Error { code, message } => {
            assert_eq!(code, ErrorCode::TargetUnavailable);
            assert!(message.contains("runs on host `gpu`"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }

    // A request goes to the link for host `gpu`, with the caller and its call chain; the
    // answer the link brings back is the caller's reply.
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let req = Frame::new("c", "w", Body::Request { text: "hi gpu".into(), timeout_ms: 5_000 });
    c.outbox.send(req.clone()).await.unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(5), calls.recv()).await;
    let Ok(Some(OutCall::Request { host, call })) = out else { panic!("no call: {out:?}") };
    assert_eq!(host, "gpu");
    assert_eq!((call.id, call.from.as_str(), call.to.as_str()), (req.id, "c", "w"));
    assert_eq!((call.text.as_str(), call.timeout_ms), ("hi gpu", 5_000));
    assert_eq!(call.calls, ["c@default"]);
    let reply = HostReply::of(Body::Reply { text: "from gpu".into() });
    node.router.cast(RouterMsg::AnswerFromHost { id: req.id, callee: "w".into(), reply }).unwrap();
    let answer = next(&mut c).await;
    assert_eq!(answer.correlation_id, Some(req.id));
    assert_eq!((answer.from.as_str(), answer.body), ("w", Body::Reply { text: "from gpu".into() }));

    // One whose deadline passes: the caller hears TIMEOUT, the other host is told to cancel.
    let req = Frame::new("c", "w", Body::Request { text: "slow".into(), timeout_ms: 50 });
    c.outbox.send(req.clone()).await.unwrap();
    assert!(matches!(calls.recv().await, Some(OutCall::Request { .. })));
    match next(&mut c).await.body {
        Body::Error { code: ErrorCode::Timeout, .. } => {}
        other => panic!("expected TIMEOUT, got {other:?}"),
    }
    let cancel = calls.recv().await;
    assert_eq!(cancel, Some(OutCall::Cancel { host: "gpu".into(), id: req.id }));
}

/// A request from another host: run here only when that host runs its caller, and the callee's
/// answer goes back to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_from_another_host_runs_here_only_for_that_hosts_own_agent() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, false, Some("gpu")).await;
    let mut w = node.agent("w").await;
    let call = |id: u128, from: &str| HostCall {
        id,
        from: from.into(),
        to: "w".into(),
        text: format!("{from} asks"),
        timeout_ms: 5_000,
        calls: vec![format!("{from}@default")],
        route: String::new(),
    };
    let ask = |host: &str, call: HostCall| {
        let (tx, rx) = oneshot::channel();
        node.router.cast(RouterMsg::CallFromHost { host: host.into(), call, reply: tx }).unwrap();
        rx
    };
    // Host `cpu` posing as `main`'s agent `c`: refused, never delivered.
    let forged = ask("cpu", call(1, "c")).await.unwrap();
    match forged.body {
        Body::Error { code: ErrorCode::Forbidden, message } => {
            assert!(message.contains("host `cpu` may not speak for `c`"), "{message}")
        }
        other => panic!("expected FORBIDDEN, got {other:?}"),
    }
    // A call that would close a cycle back to `w`: refused.
    let mut cycle = call(2, "c");
    cycle.calls = vec!["w@default".into(), "c@default".into()];
    assert!(matches!(
        ask("main", cycle).await.unwrap().body,
        Body::Error { code: ErrorCode::CircularCall, .. }
    ));
    // `main` for its own `c`: delivered as a request; the answer goes back.
    let answer = ask("main", call(3, "c"));
    let d = next(&mut w).await;
    assert_eq!(d.id, 3);
    let Body::Deliver(delivery) = &d.body else { panic!("{d:?}") };
    assert_eq!((delivery.kind, delivery.text.as_str()), (DeliveryKind::Request, "c asks"));
    // `w`'s turn uses 250 tokens of the chain here: the answer carries them back.
    node.router.cast(RouterMsg::Tokens { chain: 3, tokens: 250 }).unwrap();
    w.outbox
        .send(Frame {
            correlation_id: Some(3),
            ..Frame::new("w", "", Body::Ack { reply: Some("done on gpu".into()) })
        })
        .await
        .unwrap();
    let answer = answer.await.unwrap();
    assert_eq!((answer.body, answer.tokens), (Body::Reply { text: "done on gpu".into() }, 250));
    // Per host: what the chain used on gpu (here) — nothing came in with the call.
    assert_eq!(answer.by_host, [("gpu".to_owned(), 250)].into());
    // The same call again (copied off the broker, MAC and all): refused, never delivered.
    match ask("main", call(3, "c")).await.unwrap().body {
        Body::Error { code: ErrorCode::BadRequest, message } => {
            assert!(message.contains("a request runs once"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Host `main` of [`YAML`] with a budget of 1 000 tokens per chain, and its agent `c`.
async fn main_with_budget(dir: &std::path::Path) -> (Node, flock_ipc::Connection) {
    let yaml = YAML.replace("agents:", "budget: {max_tokens: 1000}\nagents:");
    let node = common::start_on(dir, 0, &yaml, false, Some("main")).await;
    let c = node.agent("c").await;
    (node, c)
}

/// Now, Unix ms (a chain's start: its wall budget is counted from it).
fn unix_ms() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    now.as_millis() as u64
}

/// One chain keeps one token budget across hosts: a message that leaves for another host
/// carries the tokens its chain has used, and the host that takes it counts on from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_carries_its_tokens_across_hosts_and_stops_at_one_budget() {
    use flock_actors::chains::Route;
    let dir = tempfile::tempdir().unwrap();
    let (node, mut c) = main_with_budget(dir.path()).await;
    // A delegation from `w` on gpu whose chain has used 600 tokens there.
    let now = unix_ms();
    let mut route =
        Route::root(40, "human:operator", "w", "go", now, Some("human:operator".into()));
    route.hop = 2;
    route.answer_path.push("w".into());
    route.tokens = 600;
    let msg = |id: u128, route: &Route| PendingMessage {
        id,
        sender: "w".into(),
        target: "c".into(),
        text: "your part".into(),
        attempts: 0,
        route: route.store(id),
        enqueued_at: 1,
    };
    let (tx, rx) = oneshot::channel();
    node.router
        .cast(RouterMsg::FromHost { host: "gpu".into(), msg: msg(41, &route), reply: tx })
        .unwrap();
    assert_eq!(rx.await.unwrap(), FromHost::Stored);
    let d = next(&mut c).await;
    assert_eq!(d.id, 41);
    // `c`'s turn uses 300 more (1 000 in all is the budget) and sends on to `w`: the message
    // carries the 900 the chain has used.
    node.router.cast(RouterMsg::Tokens { chain: 40, tokens: 300 }).unwrap();
    let f =
        Frame::new("c", "w", Body::Send { text: "back to gpu".into(), mode: SendMode::Durable });
    c.outbox.send(f.clone()).await.unwrap();
    let accepted = next(&mut c).await;
    assert!(matches!(accepted.body, Body::Accepted), "{accepted:?}");
    let waiting = pending_for(&node.store, "w").await;
    let sent = Route::load(&waiting[0].route, f.id, "c", "w", "back to gpu", 1);
    assert_eq!((sent.chain.id, sent.tokens), (40, 900), "{}", waiting[0].route);
    // 200 more there would pass the budget: the chain stops here, and `c`'s turn is cancelled.
    node.router.cast(RouterMsg::Tokens { chain: 40, tokens: 200 }).unwrap();
    let stop = next(&mut c).await;
    assert!(matches!(stop.body, Body::Cancel { .. }), "{stop:?}");
}

/// A chain that ran on two hosts at once (a fan-out) counts both branches: each host's count
/// is kept apart and merged by its highest, so the branches add up instead of each counting on
/// from the fork — and the sum is what stops the chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn branches_of_one_chain_on_two_hosts_add_up_against_the_one_budget() {
    use flock_actors::chains::Route;
    let dir = tempfile::tempdir().unwrap();
    let (node, mut c) = main_with_budget(dir.path()).await;
    let now = unix_ms();
    // Chain 40 used 100 tokens here, then went to `w` on gpu and `x` on cpu at once; each
    // branch sends its part back with what it knew: main 100, and its own host's count.
    let from = |id: u128, host: &str, sender: &str, own: u64| {
        let mut route =
            Route::root(40, "human:operator", "c", "go", now, Some("human:operator".into()));
        route.hop = 3;
        route.tokens = 100 + own;
        route.by_host = [("main".to_owned(), 100), (host.to_owned(), own)].into();
        let msg = PendingMessage {
            id,
            sender: sender.into(),
            target: "c".into(),
            text: format!("{sender}'s part"),
            attempts: 0,
            route: route.store(id),
            enqueued_at: 1,
        };
        let (tx, rx) = oneshot::channel();
        node.router.cast(RouterMsg::FromHost { host: host.into(), msg, reply: tx }).unwrap();
        rx
    };
    assert_eq!(from(41, "gpu", "w", 400).await.unwrap(), FromHost::Stored);
    assert_eq!(from(42, "cpu", "x", 450).await.unwrap(), FromHost::Stored);
    assert_eq!(next(&mut c).await.id, 41);
    // 100 + 400 + 450 = 950 (each branch alone said 500 or 550): a message sent on now carries
    // every host's count.
    let f = Frame::new("c", "w", Body::Send { text: "more".into(), mode: SendMode::Durable });
    c.outbox.send(f.clone()).await.unwrap();
    let mut accepted = false;
    while !accepted {
        accepted = matches!(next(&mut c).await.body, Body::Accepted);
    }
    let waiting = pending_for(&node.store, "w").await;
    let sent = Route::load(&waiting[0].route, f.id, "c", "w", "more", 1);
    let counts: std::collections::BTreeMap<String, u64> =
        [("main".into(), 100), ("gpu".into(), 400), ("cpu".into(), 450)].into();
    assert_eq!((sent.tokens, &sent.by_host), (950, &counts), "{}", waiting[0].route);
    // The same branch's count again (its message delivered twice) adds nothing; 60 more here
    // passes the budget of 1 000: the chain stops, `c`'s turn is cancelled.
    assert_eq!(from(43, "gpu", "w", 400).await.unwrap(), FromHost::Stored);
    node.router.cast(RouterMsg::Tokens { chain: 40, tokens: 40 }).unwrap();
    nothing_cancelled(&mut c).await;
    node.router.cast(RouterMsg::Tokens { chain: 40, tokens: 20 }).unwrap();
    loop {
        if matches!(next(&mut c).await.body, Body::Cancel { .. }) {
            break;
        }
    }
}

/// No `Cancel` for `conn` within 300 ms (deliveries and answers may come).
async fn nothing_cancelled(conn: &mut flock_ipc::Connection) {
    let until = tokio::time::Instant::now() + std::time::Duration::from_millis(300);
    while let Ok(Ok(Some(f))) = tokio::time::timeout_at(until, conn.reader.read_frame()).await {
        assert!(!matches!(f.body, Body::Cancel { .. }), "cancelled too early: {f:?}");
    }
}

/// A request's answer from another host brings back the tokens its chain used there: the
/// caller's host counts them against the one budget (and stops the chain past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_answer_from_another_host_counts_its_tokens_against_the_one_budget() {
    use flock_actors::chains::Route;
    let dir = tempfile::tempdir().unwrap();
    let (node, mut c) = main_with_budget(dir.path()).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    // `c` works on a chain that has used 600 tokens (on gpu, before).
    let mut route = Route::root(70, "human:operator", "w", "go", unix_ms(), None);
    route.hop = 1;
    route.tokens = 600;
    let msg = PendingMessage {
        id: 71,
        sender: "w".into(),
        target: "c".into(),
        text: "your part".into(),
        attempts: 0,
        route: route.store(71),
        enqueued_at: 1,
    };
    let (tx, rx) = oneshot::channel();
    node.router.cast(RouterMsg::FromHost { host: "gpu".into(), msg, reply: tx }).unwrap();
    assert_eq!(rx.await.unwrap(), FromHost::Stored);
    assert_eq!(next(&mut c).await.id, 71);
    // It asks `w` on gpu; the answer says `w` used 500 there: 1 100 > 1 000, the chain stops.
    let req = Frame::new("c", "w", Body::Request { text: "help".into(), timeout_ms: 5_000 });
    c.outbox.send(req.clone()).await.unwrap();
    let out = tokio::time::timeout(std::time::Duration::from_secs(5), calls.recv()).await;
    let Ok(Some(OutCall::Request { call, .. })) = out else { panic!("no call: {out:?}") };
    assert_eq!(call.id, req.id);
    let reply = HostReply { tokens: 500, ..HostReply::of(Body::Reply { text: "costly".into() }) };
    node.router.cast(RouterMsg::AnswerFromHost { id: req.id, callee: "w".into(), reply }).unwrap();
    let mut cancelled = false;
    for _ in 0..2 {
        let f = next(&mut c).await;
        cancelled |= matches!(f.body, Body::Cancel { .. });
    }
    assert!(cancelled, "the chain went past its budget with the tokens used on gpu");
}

/// What host `host`'s operator asks of this node (as the cluster link hands it over).
async fn operator(node: &Node, host: &str, ask: OperatorAsk) -> Body {
    let (tx, rx) = oneshot::channel();
    let id = flock_ipc::id::new_id();
    let ask = HostAsk::Operator(ask);
    node.router.cast(RouterMsg::HostAsked { host: host.into(), id, ask, reply: tx }).unwrap();
    rx.await.expect("the router answers")
}

/// Another host's `flockctl`: heard only from a host `cluster.operators` lists (the leader, by
/// default), only for this host's own agents; its send is stored and run here as the operator's,
/// and a `--wait` hears how its chain ended, even when it asks after the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_hosts_operator_is_heard_only_from_a_host_cluster_operators_lists() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, false, Some("gpu")).await;
    let mut calls = node.hosts.as_ref().and_then(|h| h.take_calls()).expect("the link's calls");
    let mut w = node.agent("w").await;
    let send = |id: u128, to: &str| OperatorAsk::Send { id, to: to.into(), text: "do it".into() };
    // `cpu` runs agents of this swarm but is no operator.
    for ask in [send(1, "w"), OperatorAsk::Restart { agent: "w".into() }] {
        match operator(&node, "cpu", ask).await {
            Body::Error { code: ErrorCode::Forbidden, message } => {
                assert!(message.contains("`cluster.operators` does not list it"), "{message}")
            }
            other => panic!("expected FORBIDDEN, got {other:?}"),
        }
    }
    // An agent (hostile code on this host) cannot ask for what another host's operator may:
    // control requests are taken on the operator's connection only.
    let body = Body::Control(flock_ipc::ControlRequest::LogPage {
        agent: "w".into(),
        after: None,
        lines: 10,
    });
    w.outbox.send(Frame::new("w", "router", body)).await.unwrap();
    match next(&mut w).await.body {
        Body::Error { code: ErrorCode::BadRequest, message } => {
            assert!(message.contains("not accepted on this connection"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The leader is, for this host's agents only.
    match operator(&node, "main", send(2, "c")).await {
        Body::Error { code: ErrorCode::AgentNotFound, message } => {
            assert!(message.contains("no agent named `c` runs on host `gpu`"), "{message}")
        }
        other => panic!("expected AGENT_NOT_FOUND, got {other:?}"),
    }
    assert_eq!(operator(&node, "main", send(3, "w")).await, Body::Accepted);
    assert_eq!(pending_for(&node.store, "w").await.len(), 1, "stored here, on disk");
    let d = next(&mut w).await;
    let Body::Deliver(delivery) = &d.body else { panic!("{d:?}") };
    assert_eq!((delivery.sender.as_str(), delivery.text.as_str()), (flock_ipc::OPERATOR, "do it"));
    assert!(matches!(
        operator(&node, "main", OperatorAsk::Watch { chain: 99 }).await,
        Body::Error { code: ErrorCode::BadRequest, .. }
    ));
    let watch = {
        let (tx, rx) = oneshot::channel();
        let ask = HostAsk::Operator(OperatorAsk::Watch { chain: 3 });
        let id = flock_ipc::id::new_id();
        node.router.cast(RouterMsg::HostAsked { host: "main".into(), id, ask, reply: tx }).unwrap();
        rx
    };
    let ack = Frame {
        correlation_id: Some(d.id),
        ..Frame::new("w", "router", Body::Ack { reply: Some("done on gpu".into()) })
    };
    w.outbox.send(ack).await.unwrap();
    // The answer goes to the operator's DM, which the leader holds: it says where it posted it.
    let asked = loop {
        let out = tokio::time::timeout(std::time::Duration::from_secs(5), calls.recv()).await;
        match out {
            Ok(Some(OutCall::Ask { id, ask: HostAsk::Answer { text, .. }, .. })) => {
                break (id, text);
            }
            Ok(Some(_)) => continue, // the leader told that `w` is ready
            other => panic!("no answer for the leader: {other:?}"),
        }
    };
    assert_eq!(asked.1, "done on gpu");
    let content = r#"{"channel":"dm-w--human-operator","seq":1,"duplicate":false}"#.to_owned();
    let body = Body::ToolResult { ok: true, content };
    node.router.cast(RouterMsg::HostAnswered { id: asked.0, body }).unwrap();
    let ended = |body: Body| match body {
        Body::ChainEnded(end) => (end.chain, end.text, end.by, end.channel),
        other => panic!("expected the chain's end, got {other:?}"),
    };
    let expected = (3, "done on gpu".to_owned(), "w".to_owned(), "dm-w--human-operator".to_owned());
    assert_eq!(ended(watch.await.unwrap()), expected);
    // A `--wait` that asks only now (the chain was quick) hears the same end.
    assert_eq!(ended(operator(&node, "main", OperatorAsk::Watch { chain: 3 }).await), expected);
}

/// Agents another host created at run time (learned from its status): routed to and taken from
/// once learned; a message from one not learned yet waits (`Later`) instead of being refused;
/// a host's claim of a name the file places, or another host took, is not taken; one it no
/// longer lists is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_another_host_created_at_run_time_are_reached_once_learned() {
    let dir = tempfile::tempdir().unwrap();
    let node = common::start_on(dir.path(), 0, YAML, false, Some("main")).await;
    let mut c = node.agent("c").await;
    let whole = flock_config::load(&node.dir.join("swarm.yaml")).unwrap();
    let spec =
        |name: &str| flock_config::AgentSpec { name: name.into(), ..whole.agents[0].clone() };
    let send = |to: &str| {
        let body = Body::Send { text: format!("to {to}"), mode: SendMode::Durable };
        Frame::new("c", to, body)
    };
    let learned = |host: &str, names: &[&str]| {
        let agents = names.iter().map(|n| spec(n)).collect();
        node.router.cast(RouterMsg::CreatedElsewhere { host: host.into(), agents }).unwrap();
    };
    let created = node.hosts.as_ref().unwrap().created.clone();
    let msg = |id: u128, sender: &str, enqueued_at: u64| PendingMessage {
        id,
        sender: sender.into(),
        target: "c".into(),
        text: format!("from {sender}"),
        attempts: 0,
        route: String::new(),
        enqueued_at,
    };
    let arrive = |m: PendingMessage| {
        let (tx, rx) = oneshot::channel();
        node.router.cast(RouterMsg::FromHost { host: "gpu".into(), msg: m, reply: tx }).unwrap();
        rx
    };
    // Not learned yet: unknown here; its message waits (sent just now) or is refused (old).
    c.outbox.send(send("helper")).await.unwrap();
    assert!(matches!(next(&mut c).await.body, Body::Error { code: ErrorCode::AgentNotFound, .. }));
    let now_ms = unix_ms();
    assert!(matches!(arrive(msg(50, "helper", now_ms)).await.unwrap(), FromHost::Later(_)));
    assert!(matches!(arrive(msg(51, "helper", 1)).await.unwrap(), FromHost::Refused(_)));

    learned("gpu", &["helper"]);
    let f = send("helper");
    c.outbox.send(f.clone()).await.unwrap();
    assert!(matches!(next(&mut c).await.body, Body::Accepted));
    let waiting = pending_for(&node.store, "helper").await;
    assert_eq!(waiting.iter().map(|m| m.id).collect::<Vec<_>>(), [f.id], "for the link to gpu");
    assert_eq!(arrive(msg(50, "helper", now_ms)).await.unwrap(), FromHost::Stored);
    assert_eq!(created.read().unwrap().get("helper").map(String::as_str), Some("gpu"));

    // cpu claims gpu's `w`, this host's `c`, gpu's `helper`: none taken.
    learned("cpu", &["w", "c", "helper"]);
    let (tx, rx) = oneshot::channel();
    let m = PendingMessage { target: "c".into(), ..msg(52, "w", now_ms) };
    node.router.cast(RouterMsg::FromHost { host: "cpu".into(), msg: m, reply: tx }).unwrap();
    assert!(matches!(rx.await.unwrap(), FromHost::Refused(_)));
    assert_eq!(created.read().unwrap().len(), 1, "{:?}", created.read().unwrap());

    // gpu lists it no more (decommissioned there): gone here too.
    learned("gpu", &[]);
    c.outbox.send(send("helper")).await.unwrap();
    loop {
        match next(&mut c).await.body {
            Body::Error { code: ErrorCode::AgentNotFound, .. } => break,
            Body::Deliver(_) => continue, // gpu's message for `c`
            other => panic!("expected AGENT_NOT_FOUND, got {other:?}"),
        }
    }
    assert!(created.read().unwrap().is_empty());
    // A late message from it (sent just before it went): refused at once, not waited for.
    assert!(matches!(arrive(msg(53, "helper", unix_ms())).await.unwrap(), FromHost::Refused(_)));

    // gpu claims `late`, then this host creates an agent of that name: its own wins.
    learned("gpu", &["late"]);
    let liveness = std::sync::Arc::default();
    node.router.cast(RouterMsg::AddAgent { spec: spec("late"), liveness }).unwrap();
    c.outbox.send(send("late")).await.unwrap();
    loop {
        match next(&mut c).await.body {
            Body::Accepted => break,
            Body::Deliver(_) => continue,
            other => panic!("expected the send accepted, got {other:?}"),
        }
    }
    assert!(created.read().unwrap().is_empty(), "{:?}", created.read().unwrap());
}
