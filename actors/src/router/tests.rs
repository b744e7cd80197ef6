//! The router's mailbox engine and chain accounting, driven through its messages with no socket:
//! a connection is the channel the router writes to (its `Outbox`), frames come in as
//! `RouterMsg::Frames`, the store is real SQLite in a temporary directory and the channels actor
//! is the real one. The clock is tokio's, paused: a 30 s deadline or a 10 s budget is checked to
//! the millisecond, in no time, and nothing depends on how fast the machine is.

use std::sync::Arc;
use std::time::Duration;

use flock_ipc::{
    Body, ChainEnd, ChainOutcome, ControlRequest, Delivery, DeliveryKind, ErrorCode, Frame, Hello,
    OPERATOR, PROTOCOL_VERSION, PeerCred, ROUTER, SendMode,
};
use ractor::{Actor, ActorRef};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, advance};

use super::{Clock, Router, RouterArgs};
use crate::channels::{Channels, ChannelsArgs};
use crate::messages::{ChannelsMsg, ConnId, ConnKind, Opened, RouterMsg, StoreMsg};
use crate::{Durability, Store, StoreActor};

/// The router with its store and channels actor over a temporary directory.
struct Swarm {
    router: ActorRef<RouterMsg>,
    store: ActorRef<StoreMsg>,
    conns: ConnId,
    _dir: tempfile::TempDir,
}

/// One connection as the router sees it.
struct Peer {
    conn: ConnId,
    router: ActorRef<RouterMsg>,
    rx: mpsc::Receiver<Frame>,
    _closer: oneshot::Receiver<()>,
}

/// Agents `a` and `b` (workers, scripted model), with `settings` (YAML sections) added.
async fn swarm(settings: &str) -> Swarm {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "swarm: {{name: t}}\n{settings}\nmodels:\n  s: {{provider: scripted, rules: [{{reply: ok}}]}}\ndefaults: {{model: s}}\nagents:\n  - {{name: a, role: worker}}\n  - {{name: b, role: worker}}\n"
    );
    let spec = Arc::new(flock_config::parse(&yaml, &dir.path().join("swarm.yaml")).unwrap());
    let store = Store::open(&dir.path().join("flock.db"), Durability::Normal).unwrap();
    let (store, _) = Actor::spawn(None, StoreActor, store).await.unwrap();
    let args = ChannelsArgs {
        spec: spec.clone(),
        store: store.clone(),
        journal: None,
        agent_ops: None,
        elsewhere: Vec::new(),
        taken: Vec::new(),
    };
    let (channels, _) = Actor::spawn(None, Channels, args).await.unwrap();
    let liveness = spec.agents.iter().map(|a| (a.key(), Arc::default())).collect();
    let args = RouterArgs {
        spec,
        store: store.clone(),
        events: Arc::new(|_| {}),
        control: Arc::new(|_| {}),
        liveness,
        channels: Some(channels.clone()),
        gateway: None,
        journal: None,
        memory: None,
        operator_key: None,
        hosts: None,
        clock: Clock::tokio(),
    };
    let (router, _) = Actor::spawn(None, Router, args).await.unwrap();
    channels.cast(ChannelsMsg::SetRouter(router.clone())).unwrap();
    Swarm { router, store, conns: 0, _dir: dir }
}

impl Swarm {
    async fn open(&mut self, kind: ConnKind, first: Frame) -> Peer {
        self.conns += 1;
        let (outbox, rx) = mpsc::channel(1024);
        let (closer, closed) = oneshot::channel();
        let peer = PeerCred { uid: 0, pid: None, pidfd: None };
        let opened = Opened { conn: self.conns, kind, first, outbox, closer, peer, root: None };
        self.router.cast(RouterMsg::Open(opened)).unwrap();
        let mut p = Peer { conn: self.conns, router: self.router.clone(), rx, _closer: closed };
        let welcome = p.next().await;
        assert!(matches!(welcome.body, Body::Welcome(_)), "{welcome:?}");
        p
    }

    /// Agent `name` connects with the token the router was told to expect.
    async fn agent(&mut self, name: &str) -> Peer {
        let token = format!("token-{name}-{}", self.conns);
        let expect = RouterMsg::Expect { agent: name.into(), token: token.clone() };
        self.router.cast(expect).unwrap();
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            agent_id: name.into(),
            instance: "default".into(),
            pid: 1,
            token,
        };
        self.open(ConnKind::Agent, Frame::new(name, ROUTER, Body::Hello(hello))).await
    }

    /// `flockctl`.
    async fn operator(&mut self) -> Peer {
        let hello = Body::ClientHello {
            protocol_version: PROTOCOL_VERSION,
            client: "test".into(),
            key: String::new(),
        };
        self.open(ConnKind::Control, Frame::new(OPERATOR, ROUTER, hello)).await
    }

    /// How many inputs `agent` has queued or in hand, as `flockctl ps` shows it.
    async fn depth(&self, agent: &str) -> u64 {
        let (rows, _) = ractor::call!(self.router, RouterMsg::Snapshot).unwrap();
        rows.iter().find(|r| r.name == agent).unwrap().mailbox_depth
    }

    /// Durable messages still in the store's mailboxes (not completed, not dead letters).
    async fn pending(&self) -> usize {
        ractor::call!(self.store, StoreMsg::Pending).unwrap().unwrap().len()
    }

    async fn dead_letters(&self) -> Vec<flock_ipc::DeadLetter> {
        let ask = |reply| StoreMsg::DeadLetters { offset: 0, limit: 100, reply };
        ractor::call!(self.store, ask).unwrap().unwrap()
    }
}

impl Peer {
    fn send(&self, frame: Frame) -> Frame {
        let frames = vec![frame.clone()];
        self.router.cast(RouterMsg::Frames { conn: self.conn, frames, permit: None }).unwrap();
        frame
    }

    /// A durable message to `to`.
    fn send_to(&self, to: &str, text: &str) -> Frame {
        self.send(Frame::new("", to, Body::Send { text: text.into(), mode: SendMode::Durable }))
    }

    fn ack(&self, delivery: &Frame, reply: Option<&str>) {
        let body = Body::Ack { reply: reply.map(Into::into) };
        self.send(Frame { correlation_id: Some(delivery.id), ..Frame::new("", ROUTER, body) });
    }

    fn nack(&self, delivery: &Frame, reason: &str) {
        let body = Body::Nack { reason: reason.into() };
        self.send(Frame { correlation_id: Some(delivery.id), ..Frame::new("", ROUTER, body) });
    }

    /// The next frame the router writes here; the paused clock runs on to the timer it waits
    /// for, if any (an hour at most).
    async fn next(&mut self) -> Frame {
        tokio::time::timeout(Duration::from_secs(3600), self.rx.recv())
            .await
            .expect("a frame within the hour")
            .expect("connection open")
    }

    /// The next frame, which is a delivery: the frame and what it delivers.
    async fn delivery(&mut self) -> (Frame, Delivery) {
        let f = self.next().await;
        match &f.body {
            Body::Deliver(d) => {
                let d = d.clone();
                (f, d)
            }
            other => panic!("expected a delivery, got {other:?}"),
        }
    }

    /// Nothing more has been written here once everything that can run has run (1 ms passes).
    async fn quiet(&mut self) {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if let Ok(f) = self.rx.try_recv() {
            panic!("expected nothing, got {f:?}");
        }
    }
}

fn accepted(f: &Frame, sent: &Frame) {
    assert!(matches!(f.body, Body::Accepted), "{f:?}");
    assert_eq!(f.correlation_id, Some(sent.id));
}

fn chain_ended(f: &Frame) -> &ChainEnd {
    match &f.body {
        Body::ChainEnded(end) => end,
        other => panic!("expected ChainEnded, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_window_hands_over_that_many_messages_and_each_ack_moves_it_on_in_order() {
    let mut s = swarm("delivery: {window: 3}").await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let sent: Vec<Frame> = (0..5).map(|i| b.send_to("a", &format!("m{i}"))).collect();
    for f in &sent {
        accepted(&b.next().await, f);
    }
    let mut held = Vec::new();
    for (i, f) in sent.iter().take(3).enumerate() {
        let (frame, d) = a.delivery().await;
        assert_eq!((frame.id, d.text.as_str(), d.attempt), (f.id, format!("m{i}").as_str(), 1));
        held.push(frame);
    }
    // Three handed over and none acknowledged: the fourth waits.
    a.quiet().await;
    assert_eq!(s.depth("a").await, 5);
    a.ack(&held[0], None);
    let (m3, d) = a.delivery().await;
    assert_eq!(d.text, "m3");
    a.quiet().await;
    a.ack(&held[1], None);
    a.ack(&held[2], None);
    let (m4, d) = a.delivery().await;
    assert_eq!(d.text, "m4");
    a.ack(&m3, None);
    a.ack(&m4, None);
    a.quiet().await;
    assert_eq!(s.depth("a").await, 0);
    assert_eq!(s.pending().await, 0, "every acknowledged message is completed in the store");
}

#[tokio::test(start_paused = true)]
async fn a_nack_rewinds_the_window_and_the_message_is_dead_lettered_after_max_attempts() {
    let mut s = swarm("delivery: {window: 2, max_delivery_attempts: 3}").await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let m0 = b.send_to("a", "m0");
    let m1 = b.send_to("a", "m1");
    accepted(&b.next().await, &m0);
    accepted(&b.next().await, &m1);
    let (mut first, d) = a.delivery().await;
    assert_eq!((d.text.as_str(), d.attempt), ("m0", 1));
    let (_, d) = a.delivery().await;
    assert_eq!((d.text.as_str(), d.attempt), ("m1", 1));
    for attempt in 2..=3 {
        a.nack(&first, "tool crashed");
        // The agent drops what it holds, then gets both again, the failed one counted.
        let rewind = a.next().await;
        assert!(matches!(rewind.body, Body::Rewind), "{rewind:?}");
        assert_eq!(rewind.correlation_id, Some(m0.id));
        let (f, d) = a.delivery().await;
        assert_eq!((d.text.as_str(), d.attempt), ("m0", attempt));
        first = f;
        let (_, d) = a.delivery().await;
        assert_eq!(
            (d.text.as_str(), d.attempt),
            ("m1", 1),
            "a message never started is not a failure"
        );
    }
    a.nack(&first, "tool crashed");
    assert!(matches!(a.next().await.body, Body::Rewind));
    // The third failure dead-letters m0: m1 is next, and alone.
    let (m1_again, d) = a.delivery().await;
    assert_eq!((d.text.as_str(), d.attempt), ("m1", 1));
    a.quiet().await;
    let dead = s.dead_letters().await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!((dead[0].id, dead[0].attempts), (m0.id, 3));
    assert!(dead[0].reason.contains("tool crashed"), "{}", dead[0].reason);
    a.ack(&m1_again, None);
    a.quiet().await;
    assert_eq!(s.pending().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_connection_lost_mid_turn_gives_the_window_back_in_order_and_counts_one_failure() {
    let mut s = swarm("delivery: {window: 3}").await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let sent: Vec<Frame> = ["m0", "m1", "m2", "m3"].iter().map(|t| b.send_to("a", t)).collect();
    for f in &sent {
        accepted(&b.next().await, f);
    }
    for text in ["m0", "m1", "m2"] {
        assert_eq!(a.delivery().await.1.text, text);
    }
    s.router.cast(RouterMsg::Closed { conn: a.conn }).unwrap();
    let mut a = s.agent("a").await;
    // m0 was being worked on (attempt 2 now); m1 and m2 had not started; m3 waits for room.
    let mut held = Vec::new();
    for (text, attempt) in [("m0", 2), ("m1", 1), ("m2", 1)] {
        let (f, d) = a.delivery().await;
        assert_eq!((d.text.as_str(), d.attempt), (text, attempt));
        held.push(f);
    }
    a.quiet().await;
    for f in &held {
        a.ack(f, None);
    }
    let (f3, d) = a.delivery().await;
    assert_eq!((d.text.as_str(), d.attempt), ("m3", 1));
    a.ack(&f3, None);
    a.quiet().await;
    assert_eq!(s.pending().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_times_out_at_its_deadline_to_the_millisecond_and_the_callee_is_cancelled() {
    let mut s = swarm("").await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let t0 = Instant::now();
    let req =
        b.send(Frame::new("", "a", Body::Request { text: "slow".into(), timeout_ms: 30_000 }));
    let (d, delivery) = a.delivery().await;
    assert_eq!((d.id, delivery.kind), (req.id, DeliveryKind::Request));
    advance(Duration::from_millis(29_990) - t0.elapsed()).await;
    b.quiet().await;
    a.quiet().await;
    let err = b.next().await;
    let waited = t0.elapsed();
    assert!(matches!(err.body, Body::Error { code: ErrorCode::Timeout, .. }), "{err:?}");
    assert_eq!(err.correlation_id, Some(req.id));
    assert!(
        waited >= Duration::from_millis(30_000) && waited <= Duration::from_millis(30_005),
        "timed out after {waited:?}"
    );
    let cancel = a.next().await;
    assert!(matches!(cancel.body, Body::Cancel { .. }), "{cancel:?}");
    assert_eq!(cancel.correlation_id, Some(req.id));
    // The late answer goes nowhere.
    a.ack(&d, Some("too late"));
    b.quiet().await;
}

#[tokio::test(start_paused = true)]
async fn a_chain_past_its_hop_budget_is_stopped_its_turns_cancelled_and_the_person_told() {
    let mut s = swarm("budget: {max_hops: 3}").await;
    let mut op = s.operator().await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let ask = op.send_to("a", "plan the trip");
    accepted(&op.next().await, &ask);
    let (turn_a, d) = a.delivery().await;
    let chain = d.chain.expect("a person's message starts a chain");
    assert_eq!(d.answer_to.as_deref(), Some("human:operator"));
    let watch = op.send(Frame::new("", ROUTER, Body::Control(ControlRequest::Watch { chain })));
    // Hop 2: a asks b during its turn; hop 3: b writes back to a.
    let hop2 = a.send_to("b", "find flights");
    accepted(&a.next().await, &hop2);
    let (turn_b, d) = b.delivery().await;
    assert_eq!(d.chain, Some(chain));
    let hop3 = b.send_to("a", "found two");
    accepted(&b.next().await, &hop3);
    // Hop 4 is one too many: refused, and the whole chain stops.
    let hop4 = b.send_to("a", "and a third");
    // b's running turn is cancelled first, then its send refused.
    let cancel = b.next().await;
    assert!(matches!(cancel.body, Body::Cancel { .. }), "{cancel:?}");
    assert_eq!(cancel.correlation_id, Some(turn_b.id));
    let refused = b.next().await;
    assert_eq!(refused.correlation_id, Some(hop4.id));
    match &refused.body {
        Body::Error { code: ErrorCode::BudgetExceeded, message } => {
            assert!(message.contains("hop budget of 3"), "{message}")
        }
        other => panic!("expected BUDGET_EXCEEDED, got {other:?}"),
    }
    let cancel = a.next().await;
    assert!(matches!(cancel.body, Body::Cancel { .. }));
    assert_eq!(cancel.correlation_id, Some(turn_a.id));
    // The person hears it once, in their DM with a; hop 3's message is never handed over.
    let end = op.next().await;
    assert_eq!(end.correlation_id, Some(watch.id));
    let end = chain_ended(&end);
    assert_eq!(
        (end.outcome, end.hops, end.channel.as_str()),
        (ChainOutcome::Stopped, 3, "dm-a--human-operator")
    );
    assert!(end.text.contains("hop budget of 3"), "{}", end.text);
    a.ack(&turn_a, Some("too late"));
    b.ack(&turn_b, None);
    a.quiet().await;
    assert_eq!(s.pending().await, 0, "the stopped chain's queued message is discarded");
}

#[tokio::test(start_paused = true)]
async fn a_chain_past_its_time_budget_is_stopped_within_a_second_of_it() {
    let mut s = swarm("budget: {max_wall_secs: 10}").await;
    let mut op = s.operator().await;
    let mut a = s.agent("a").await;
    let mut b = s.agent("b").await;
    let t0 = Instant::now();
    let ask = op.send_to("a", "think long");
    accepted(&op.next().await, &ask);
    let (turn_a, d) = a.delivery().await;
    let chain = d.chain.unwrap();
    op.send(Frame::new("", ROUTER, Body::Control(ControlRequest::Watch { chain })));
    advance(Duration::from_millis(9_900) - t0.elapsed()).await;
    // Within its time, the chain goes on.
    let on_time = a.send_to("b", "still in time");
    accepted(&a.next().await, &on_time);
    let (turn_b, _) = b.delivery().await;
    a.quiet().await;
    op.quiet().await;
    // Past it, its turns are cancelled at the next second's check.
    let cancel = a.next().await;
    let waited = t0.elapsed();
    assert!(matches!(cancel.body, Body::Cancel { .. }), "{cancel:?}");
    assert_eq!(cancel.correlation_id, Some(turn_a.id));
    assert!(
        waited > Duration::from_secs(10) && waited <= Duration::from_millis(11_005),
        "stopped after {waited:?}"
    );
    assert_eq!(b.next().await.correlation_id, Some(turn_b.id));
    let end = op.next().await;
    let end = chain_ended(&end);
    assert_eq!(end.outcome, ChainOutcome::Stopped);
    assert!(end.text.contains("10 s time budget"), "{}", end.text);
    let late = a.send_to("b", "too late");
    let refused = a.next().await;
    assert_eq!(refused.correlation_id, Some(late.id));
    assert!(matches!(refused.body, Body::Error { code: ErrorCode::BudgetExceeded, .. }));
}

#[tokio::test(start_paused = true)]
async fn a_chain_charged_past_its_token_budget_is_stopped_and_its_next_hop_refused() {
    let mut s = swarm("budget: {max_tokens: 1000}").await;
    let mut op = s.operator().await;
    let mut a = s.agent("a").await;
    let ask = op.send_to("a", "summarise");
    accepted(&op.next().await, &ask);
    let (turn_a, d) = a.delivery().await;
    let chain = d.chain.unwrap();
    s.router.cast(RouterMsg::Tokens { chain, tokens: 1000 }).unwrap();
    let within = a.send_to("b", "at the limit");
    accepted(&a.next().await, &within);
    s.router.cast(RouterMsg::Tokens { chain, tokens: 1 }).unwrap();
    let cancel = a.next().await;
    assert_eq!(cancel.correlation_id, Some(turn_a.id));
    let over = a.send_to("b", "over it");
    let refused = a.next().await;
    assert_eq!(refused.correlation_id, Some(over.id));
    match &refused.body {
        Body::Error { code: ErrorCode::BudgetExceeded, message } => {
            assert!(message.contains("1000 model tokens"), "{message}")
        }
        other => panic!("expected BUDGET_EXCEEDED, got {other:?}"),
    }
}
