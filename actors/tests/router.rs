//! The router and store actors in-process, with real Unix sockets and real SQLite, and test
//! clients playing the agents: ordering, acceptance, dead letters, requests, cycles, handshakes.

mod common;

use std::time::Duration;

use common::{Node, next};
use flock_actors::RouterMsg;
use flock_actors::{Durability, Store, StoreMsg};
use flock_ipc::{
    Body, Connection, DeliveryKind, ErrorCode, Frame, Hello, PROTOCOL_VERSION, ROUTER, SendMode,
};

struct Harness {
    _dir: tempfile::TempDir,
    node: Node,
}

impl std::ops::Deref for Harness {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

async fn harness(extra: &str) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "swarm: {{name: t}}\ndelivery: {{request_timeout_ms: 2000}}\n{extra}\nmodels:\n  s: {{provider: scripted, rules: [{{reply: ok}}]}}\ndefaults: {{model: s}}\nagents:\n  - {{name: a, role: worker}}\n  - {{name: b, role: worker}}\n  - {{name: c, role: worker, can_call: [a]}}\n"
    );
    let node = common::start(dir.path(), 0, &yaml, false).await;
    Harness { _dir: dir, node }
}

async fn send(conn: &Connection, from: &str, to: &str, text: &str) -> Frame {
    let f = Frame::new(from, to, Body::Send { text: text.into(), mode: SendMode::Durable });
    conn.outbox.send(f.clone()).await.unwrap();
    f
}

async fn ack(conn: &Connection, delivery: &Frame, reply: Option<&str>) {
    let ack = Frame {
        correlation_id: Some(delivery.id),
        ..Frame::new("x", ROUTER, Body::Ack { reply: reply.map(Into::into) })
    };
    conn.outbox.send(ack).await.unwrap();
}

fn text_of(f: &Frame) -> &str {
    match &f.body {
        Body::Deliver(d) => &d.text,
        other => panic!("expected Deliver, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_sends_are_accepted_after_commit_and_delivered_fifo_one_at_a_time() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    let mut b = h.agent("b").await;
    for i in 0..50 {
        send(&a, "a", "b", &format!("m{i}")).await;
    }
    for _ in 0..50 {
        assert!(matches!(next(&mut a).await.body, Body::Accepted));
    }
    let store = Store::open(&h.db, Durability::Normal).unwrap();
    assert_eq!(store.pending().unwrap().len(), 50, "accepted means committed");
    for i in 0..50 {
        let d = next(&mut b).await;
        assert_eq!(text_of(&d), format!("m{i}"));
        // One at a time: nothing else arrives before the ack.
        let early = tokio::time::timeout(
            Duration::from_millis(if i == 0 { 50 } else { 0 }),
            b.reader.read_frame(),
        )
        .await;
        assert!(early.is_err(), "a second delivery arrived before the ack");
        ack(&b, &d, None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_send_id_is_accepted_but_queued_once() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    let mut b = h.agent("b").await;
    let f = send(&a, "a", "b", "once").await;
    a.outbox.send(f.clone()).await.unwrap();
    assert!(matches!(next(&mut a).await.body, Body::Accepted));
    assert!(matches!(next(&mut a).await.body, Body::Accepted));
    let d = next(&mut b).await;
    ack(&b, &d, None).await;
    let extra = tokio::time::timeout(Duration::from_millis(200), b.reader.read_frame()).await;
    assert!(extra.is_err(), "the duplicate was delivered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_deliveries_are_retried_then_dead_lettered_after_five() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    send(&a, "a", "b", "poison").await;
    send(&a, "a", "b", "fine").await;
    assert!(matches!(next(&mut a).await.body, Body::Accepted));
    for attempt in 1..=5 {
        let mut b = h.agent("b").await;
        let d = next(&mut b).await;
        assert_eq!(text_of(&d), "poison");
        let Body::Deliver(del) = &d.body else { unreachable!() };
        assert_eq!(del.attempt, attempt);
        drop(b); // the agent "crashes" mid-turn
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let mut b = h.agent("b").await;
    assert_eq!(
        text_of(&next(&mut b).await),
        "fine",
        "the next message flows after the dead letter"
    );
    let dead =
        ractor::call!(h.store, |reply| StoreMsg::DeadLetters { offset: 0, limit: 100, reply })
            .unwrap()
            .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].text.as_str(), dead[0].attempts), ("poison", 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_get_replies_and_cycles_are_refused() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    let mut b = h.agent("b").await;
    let req = Frame::new("a", "b", Body::Request { text: "q".into(), timeout_ms: 0 });
    a.outbox.send(req.clone()).await.unwrap();
    let d = next(&mut b).await;
    let Body::Deliver(del) = &d.body else { panic!() };
    assert_eq!(del.kind, DeliveryKind::Request);
    assert_eq!(del.call_chain, ["a@default"]);
    // While serving a's request, b asks a: a cycle.
    let back = Frame::new("b", "a", Body::Request { text: "back".into(), timeout_ms: 0 });
    b.outbox.send(back.clone()).await.unwrap();
    let err = next(&mut b).await;
    assert_eq!(err.correlation_id, Some(back.id));
    assert!(matches!(err.body, Body::Error { code: ErrorCode::CircularCall, .. }), "{err:?}");
    ack(&b, &d, Some("answer")).await;
    let reply = next(&mut a).await;
    assert_eq!(reply.correlation_id, Some(req.id));
    assert_eq!(reply.body, Body::Reply { text: "answer".into() });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_deadline_times_out_and_cancels_the_callee() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    let mut b = h.agent("b").await;
    let req = Frame::new("a", "b", Body::Request { text: "slow".into(), timeout_ms: 100 });
    a.outbox.send(req.clone()).await.unwrap();
    let d = next(&mut b).await;
    let err = next(&mut a).await;
    assert!(matches!(err.body, Body::Error { code: ErrorCode::Timeout, .. }), "{err:?}");
    let cancel = next(&mut b).await;
    assert!(matches!(cancel.body, Body::Cancel { .. }));
    assert_eq!(cancel.correlation_id, Some(d.id));
    // The late answer goes nowhere.
    ack(&b, &d, Some("too late")).await;
    let nothing = tokio::time::timeout(Duration::from_millis(200), a.reader.read_frame()).await;
    assert!(nothing.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_targets_and_can_call_are_enforced_by_the_router() {
    let h = harness("").await;
    let mut c = h.agent("c").await;
    let f = send(&c, "c", "nobody", "x").await;
    let e = next(&mut c).await;
    assert_eq!(e.correlation_id, Some(f.id));
    assert!(matches!(e.body, Body::Error { code: ErrorCode::AgentNotFound, .. }));
    // c may only call a; claiming to be someone else in `from` changes nothing.
    send(&c, "a", "b", "x").await;
    assert!(matches!(next(&mut c).await.body, Body::Error { code: ErrorCode::Forbidden, .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_rejected_and_garbage_closes_only_that_connection() {
    let h = harness("").await;
    let mut a = h.agent("a").await;
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: "b".into(),
        instance: "default".into(),
        pid: 1,
        token: "guess".into(),
    };
    let err = Connection::agent(&h.socket, hello, 16).await.unwrap_err();
    assert!(err.to_string().contains("FORBIDDEN"), "{err}");
    // Garbage: an error frame, then the connection closes.
    use tokio::io::AsyncWriteExt;
    let mut raw = tokio::net::UnixStream::connect(&h.socket).await.unwrap();
    raw.write_all(&[7, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc, 0xfb, 0xfa, 0xf9]).await.unwrap();
    let mut reader = flock_ipc::FrameReader::new(raw, 1 << 20);
    let f = reader.read_frame().await.unwrap().unwrap();
    assert!(matches!(f.body, Body::Error { code: ErrorCode::BadRequest, .. }));
    assert!(reader.read_frame().await.unwrap().is_none(), "connection closed");
    // The router still serves.
    send(&a, "a", "b", "still here").await;
    assert!(matches!(next(&mut a).await.body, Body::Accepted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawn_token_used_twice_closes_both_connections_and_is_journaled() {
    let h = harness("").await;
    // An impostor read the spawn's token and said Hello first; the real agent comes second.
    let token = "tok-b-stolen".to_string();
    h.router.cast(RouterMsg::Expect { agent: "b".into(), token: token.clone() }).unwrap();
    let hello = |pid| Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: "b".into(),
        instance: "default".into(),
        pid,
        token: token.clone(),
    };
    let mut impostor = Connection::agent(&h.socket, hello(4242), 16).await.unwrap();
    let err = Connection::agent(&h.socket, hello(1), 16).await.unwrap_err();
    assert!(err.to_string().contains("already used"), "{err}");
    // The impostor's connection is closed too: it cannot keep acting as `b`.
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match impostor.reader.read_frame().await {
                Ok(Some(f)) if matches!(f.body, Body::HeartbeatAck) => continue,
                Ok(Some(_)) => continue,
                _ => break,
            }
        }
    });
    closed.await.expect("the first holder of the token was disconnected");
    // The journal says what happened.
    let journal = h.dir.join("journal");
    let journaled =
        || {
            std::fs::read_dir(&journal).into_iter().flatten().flatten().any(|f| {
                std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains("TOKEN_REUSED"))
            })
        };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !journaled() {
        assert!(tokio::time::Instant::now() < deadline, "no TOKEN_REUSED event in the journal");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A fresh spawn of `b` (new token) is served as always.
    let mut fresh = h.agent("b").await;
    send(&fresh, "b", "a", "back").await;
    assert!(matches!(next(&mut fresh).await.body, Body::Accepted));
}

/// A Hello is judged by the process that says it, not only by its token: once the supervisor
/// has said which process it started for `b`, a Hello as `b` from any other process tree is
/// refused even with the right token, and a connection that said Hello before the spawn was
/// known (in the instant between the token's issue and the spawn's return) is closed when the
/// spawn turns out to be another process.
#[tokio::test]
async fn a_hello_from_outside_the_spawned_process_tree_is_refused_even_with_the_token() {
    let h = harness("").await;
    let hello = |token: &str| Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: "b".into(),
        instance: "default".into(),
        pid: 1,
        token: token.into(),
    };
    // This test process is no child of itself: whatever it connects as, it is not the spawn.
    let not_us = 999_999;
    h.router.cast(RouterMsg::Expect { agent: "b".into(), token: "tok-1".into() }).unwrap();
    h.router.cast(RouterMsg::Spawned { agent: "b".into(), pid: not_us }).unwrap();
    let err = Connection::agent(&h.socket, hello("tok-1"), 16).await.unwrap_err();
    assert!(err.to_string().contains("does not come from the process"), "{err}");

    // Hello first (the spawn not known yet), then the spawn is another process: closed.
    h.router.cast(RouterMsg::Expect { agent: "b".into(), token: "tok-2".into() }).unwrap();
    let mut early = Connection::agent(&h.socket, hello("tok-2"), 16).await.unwrap();
    h.router.cast(RouterMsg::Spawned { agent: "b".into(), pid: not_us }).unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = early.reader.read_frame().await {}
    });
    closed.await.expect("the connection from outside the spawn was closed");

    // Without a known spawn (the in-process harness) a Hello with the token is served as always.
    let mut fresh = h.agent("b").await;
    send(&fresh, "b", "a", "back").await;
    assert!(matches!(next(&mut fresh).await.body, Body::Accepted));
}
