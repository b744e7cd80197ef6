//! The host-to-host transport against a real `nats-server -js` (Debian's package, which
//! `scripts/setup` installs): delivery once and in order, de-duplication by message id,
//! redelivery of what was not acknowledged, and nothing acknowledged lost when the broker is
//! killed with `kill -9`. `scripts/test` sets `FLOCK_REQUIRE_NATS=1`: there a missing server
//! fails instead of skipping.

use std::time::Duration;

use bytes::Bytes;
use flock_cluster::{Delivery, Inbox, Link, Options};
use flock_testkit::nats::{Broker, available};

/// Host `host` of swarm `team`.
fn options(broker: &Broker, host: &str, ack_wait: Duration) -> Options {
    Options { ack_wait, ..Options::new(broker.url(), "team", host) }
}

async fn next(inbox: &mut Inbox) -> Delivery {
    tokio::time::timeout(Duration::from_secs(10), inbox.next())
        .await
        .expect("a delivery within 10 s")
        .expect("the inbox is open")
        .expect("a Flock message")
}

async fn nothing_for(inbox: &mut Inbox, ms: u64) {
    let got = tokio::time::timeout(Duration::from_millis(ms), inbox.next()).await;
    assert!(got.is_err(), "expected nothing, got {:?}", got.ok().flatten());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_gets_what_was_sent_to_it_once_in_order_and_the_queue_empties_as_it_acks() {
    let Some(bin) = available("in order, once") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let link = Link::connect(&options(&broker, "a", Duration::from_secs(30))).await.unwrap();
    let b = Link::connect(&options(&broker, "b", Duration::from_secs(30))).await.unwrap();
    for i in 0..200 {
        let sent =
            link.send("b", &format!("m{i}"), Bytes::from(format!("body {i}"))).await.unwrap();
        assert!(!sent.duplicate);
    }
    // The outbox sends again after a crash: the stream stores an id once.
    let again = link.send("b", "m5", Bytes::from("body 5")).await.unwrap();
    assert!(again.duplicate, "{again:?}");
    let mut inbox = b.inbox().await.unwrap();
    for i in 0..200 {
        let d = next(&mut inbox).await;
        assert_eq!(
            (d.msg_id.as_str(), d.payload.as_ref(), d.from_host.as_str()),
            (format!("m{i}").as_str(), format!("body {i}").as_bytes(), "a")
        );
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 500).await;
    // Another host's inbox holds none of it.
    let mut other = link.inbox().await.unwrap();
    nothing_for(&mut other, 300).await;
    // Acknowledged messages are gone: a new inbox (the host restarted) starts empty.
    drop(inbox);
    let mut again = b.inbox().await.unwrap();
    nothing_for(&mut again, 500).await;
    // Names that would break a subject are refused before anything is sent.
    let err = link.send("b.*", "x", Bytes::new()).await.unwrap_err();
    assert!(err.to_string().contains("a-z, 0-9 and -"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_dead_receiver_left_unacknowledged_comes_back_first_and_in_order() {
    let Some(bin) = available("redelivery") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    // A long ack_wait: what comes back must not wait for it.
    let opts = options(&broker, "b", Duration::from_secs(30));
    let link = Link::connect(&options(&broker, "a", Duration::from_secs(30))).await.unwrap();
    for i in 1..=6 {
        link.send("b", &format!("m{i}"), Bytes::from(format!("body {i}"))).await.unwrap();
    }
    {
        // The receiving supervisor takes a window of six, stores and acknowledges two, and dies.
        let receiver = Link::connect(&opts).await.unwrap();
        let mut inbox = receiver.inbox().await.unwrap();
        let mut got = Vec::new();
        while got.len() < 6 {
            let batch = tokio::time::timeout(Duration::from_secs(10), inbox.next_batch(16))
                .await
                .expect("a batch within 10 s")
                .expect("the inbox is open")
                .expect("Flock messages");
            got.extend(batch);
        }
        let ids: Vec<&str> = got.iter().map(|d| d.msg_id.as_str()).collect();
        assert_eq!(ids, ["m1", "m2", "m3", "m4", "m5", "m6"]);
        flock_cluster::ack_prefix(&got[..2]).await.unwrap();
    }
    // Newer messages arrive meanwhile; they must not overtake m3..m6.
    for i in 7..=8 {
        link.send("b", &format!("m{i}"), Bytes::from(format!("body {i}"))).await.unwrap();
    }
    let receiver = Link::connect(&opts).await.unwrap();
    let mut inbox = receiver.inbox().await.unwrap();
    for want in ["m3", "m4", "m5", "m6", "m7", "m8"] {
        let d = next(&mut inbox).await;
        assert_eq!(d.msg_id, want);
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_broker_acknowledged_survives_its_kill_9() {
    let Some(bin) = available("broker kill -9") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(&bin, dir.path(), None);
    let link = Link::connect(&options(&broker, "a", Duration::from_secs(30))).await.unwrap();
    for i in 0..50 {
        link.send("b", &format!("m{i}"), Bytes::from(vec![b'x'; 1024])).await.unwrap();
    }
    broker.kill9_and_restart();
    let link = Link::connect(&options(&broker, "b", Duration::from_secs(30))).await.unwrap();
    let mut inbox = link.inbox().await.unwrap();
    for i in 0..50 {
        let d = next(&mut inbox).await;
        assert_eq!(d.msg_id, format!("m{i}"));
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_sender_with_the_swarms_secret_makes_an_authentic_message() {
    let Some(bin) = available("authenticity") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let with = |host: &str, secret: Option<&str>| Options {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        ..options(&broker, host, Duration::from_secs(30))
    };
    let honest = Link::connect(&with("a", Some("s3cret"))).await.unwrap();
    let stranger = Link::connect(&with("a", None)).await.unwrap();
    let wrong = Link::connect(&with("a", Some("guess"))).await.unwrap();
    honest.send("b", "m1", Bytes::from("from a host")).await.unwrap();
    stranger.send("b", "m2", Bytes::from("from an agent with the broker's address")).await.unwrap();
    wrong.send("b", "m3", Bytes::from("from a wrong secret")).await.unwrap();
    // A host with the secret claiming to be another host: the MAC covers the sending host.
    let replayed = Link::connect(&with("c", Some("s3cret"))).await.unwrap();
    replayed.send("b", "m4", Bytes::from("from c")).await.unwrap();
    let receiver = Link::connect(&with("b", Some("s3cret"))).await.unwrap();
    let mut inbox = receiver.inbox().await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let d = next(&mut inbox).await;
        seen.push((d.msg_id.clone(), d.from_host.clone(), d.authentic));
        d.ack().await.unwrap();
    }
    assert_eq!(
        seen,
        [
            ("m1".into(), "a".into(), true),
            ("m2".into(), "a".into(), false),
            ("m3".into(), "a".into(), false),
            ("m4".into(), "c".into(), true),
        ]
    );
}

/// A request between hosts: answered by the host asked, under its MAC; a call without the
/// swarm's secret is marked as such; a cancel arrives as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_is_answered_by_the_host_asked_and_only_the_secret_makes_one_authentic() {
    let Some(bin) = available("calls") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let with = |host: &str, secret: Option<&str>| Options {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        ..options(&broker, host, Duration::from_secs(30))
    };
    let a = Link::connect(&with("a", Some("s3cret"))).await.unwrap();
    let b = Link::connect(&with("b", Some("s3cret"))).await.unwrap();
    let mut calls = b.calls().await.unwrap();
    let answering = tokio::spawn(async move {
        let mut seen = Vec::new();
        for _ in 0..3 {
            let call = calls.next().await.expect("a call");
            seen.push((call.id.clone(), call.from_host.clone(), call.authentic, call.cancel));
            if call.authentic && !call.cancel {
                let text = format!("b answers {}", String::from_utf8_lossy(&call.payload));
                call.answer(Bytes::from(text)).await.unwrap();
            }
        }
        seen
    });
    let answer = a.call("b", "c1", Bytes::from("hello"), Duration::from_secs(5)).await.unwrap();
    assert_eq!(answer, Bytes::from("b answers hello"));
    let stranger = Link::connect(&with("a", None)).await.unwrap();
    let refused = stranger.call("b", "c2", Bytes::from("forged"), Duration::from_millis(300)).await;
    assert!(refused.is_err(), "an unauthenticated call got an answer: {refused:?}");
    a.cancel("b", "c1").await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), answering).await.unwrap().unwrap();
    assert_eq!(
        seen,
        [
            ("c1".into(), "a".into(), true, false),
            ("c2".into(), "a".into(), false, false),
            ("c1".into(), "a".into(), true, true),
        ]
    );
    // Nobody serves host `c`: the caller learns it at once, not at its timeout.
    let started = std::time::Instant::now();
    assert!(a.call("c", "c3", Bytes::new(), Duration::from_secs(5)).await.is_err());
    assert!(started.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_reads_what_another_wrote_of_itself_and_whether_the_swarm_s_secret_made_it() {
    let Some(bin) = available("host status") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let with = |host: &str, secret: Option<&str>| Options {
        secret: secret.map(|s| s.as_bytes().to_vec()),
        ..options(&broker, host, Duration::from_secs(30))
    };
    let gpu = Link::connect(&with("gpu", Some("s3cret"))).await.unwrap();
    let main = Link::connect(&with("main", Some("s3cret"))).await.unwrap();
    assert!(main.status_of("gpu").await.unwrap().is_none(), "nothing written yet");
    let now = || {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis()
            as u64
    };
    let before = now();
    gpu.put_status(b"{\"rows\":[1]}").await.unwrap();
    gpu.put_status(b"{\"rows\":[2]}").await.unwrap();
    let s = main.status_of("gpu").await.unwrap().expect("gpu's status");
    assert_eq!(
        (&s.body[..], s.authentic),
        (&b"{\"rows\":[2]}"[..], true),
        "the last one, made by a host"
    );
    assert!(s.written_ms + 1_000 >= before && s.written_ms <= now() + 1_000, "the broker's time");
    // Written by someone without the secret (an agent that found the broker): not authentic.
    let forger = Link::connect(&with("gpu", Some("guess"))).await.unwrap();
    forger.put_status(b"{\"rows\":[]}").await.unwrap();
    assert!(!main.status_of("gpu").await.unwrap().unwrap().authentic);
    assert!(main.status_of("no such host!").await.is_err(), "names are checked");
    // What waits in the broker for a host until it acknowledges it.
    assert_eq!(main.queued_for("gpu").await.unwrap(), 0);
    for id in ["q1", "q2"] {
        main.send("gpu", id, Bytes::from("for gpu")).await.unwrap();
    }
    assert_eq!(
        (main.queued_for("gpu").await.unwrap(), main.queued_for("main").await.unwrap()),
        (2, 0)
    );
    let mut inbox = gpu.inbox().await.unwrap();
    next(&mut inbox).await.ack().await.unwrap();
    assert_eq!(main.queued_for("gpu").await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_is_held_by_one_process_and_a_process_it_was_taken_from_learns_it_at_its_next_write()
{
    let Some(bin) = available("host lease") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let run = |instance: &str| Options {
        secret: Some(b"s3cret".to_vec()),
        instance: instance.into(),
        ..options(&broker, "gpu", Duration::from_secs(30))
    };
    let fresh = Duration::from_millis(800);
    let first = Link::connect(&run("machine-a")).await.unwrap();
    first.claim(b"{}", fresh).await.unwrap();
    first.put_status(b"{}").await.unwrap();
    // Another machine starting as `gpu` while the first writes: refused.
    let second = Link::connect(&run("machine-b")).await.unwrap();
    match second.claim(b"{}", fresh).await {
        Err(flock_cluster::Error::HostTaken { host, .. }) => assert_eq!(host, "gpu"),
        other => panic!("expected HostTaken, got {other:?}"),
    }
    // The first's own next run (same state dir: same holder) takes over at once.
    let again = Link::connect(&run("machine-a")).await.unwrap();
    again.claim(b"{}", fresh).await.unwrap();
    // The first run was cut off: its status goes stale and the other machine takes the host.
    tokio::time::sleep(fresh + Duration::from_millis(200)).await;
    second.claim(b"{}", fresh).await.unwrap();
    second.put_status(b"{}").await.unwrap();
    // The run it was taken from learns it at its next write, and must stop.
    match again.put_status(b"{}").await {
        Err(flock_cluster::Error::Fenced { host }) => assert_eq!(host, "gpu"),
        other => panic!("expected Fenced, got {other:?}"),
    }
    // Someone without the secret writing under the host's name cannot fence it.
    let forger =
        Link::connect(&Options { secret: Some(b"guess".to_vec()), ..run("agent") }).await.unwrap();
    forger.claim(b"{}", Duration::ZERO).await.unwrap();
    second.put_status(b"{}").await.expect("a forged status is written over");
    assert_eq!(second.status_of("gpu").await.unwrap().unwrap().instance, "machine-b");
}

/// docs/cluster.md's per-host broker users, as written there (swarm `team`).
const USERS: &str = r#"
authorization {
  users = [
    { user: main, password: "pm", permissions: {
        publish:   ["flock.team.inbox.*.main.*", "flock.team.call.*.main",
                    "$KV.flock-team-hosts.main", "$KV.flock-team-hosts.main.standby",
                    "$JS.API.>", "$JS.ACK.FLOCK-team.>"],
        subscribe: ["_INBOX.>", "flock.team.call.main.*"],
        allow_responses: true } }
    { user: gpu,  password: "pg", permissions: {
        publish:   ["flock.team.inbox.*.gpu.*", "flock.team.call.*.gpu",
                    "$KV.flock-team-hosts.gpu", "$KV.flock-team-hosts.gpu.standby",
                    "$JS.API.>", "$JS.ACK.FLOCK-team.>"],
        subscribe: ["_INBOX.>", "flock.team.call.gpu.*"],
        allow_responses: true } }
  ]
}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_documented_users_a_host_does_its_work_and_cannot_speak_as_another() {
    let Some(bin) = available("broker users") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::with_config(&bin, dir.path(), USERS);
    let port = broker.url().rsplit(':').next().unwrap().to_owned();
    let as_user = |user: &str, password: &str, host: &str| Options {
        secret: Some(b"s3cret".to_vec()),
        ..Options::new(format!("nats://{user}:{password}@127.0.0.1:{port}"), "team", host)
    };
    let main = Link::connect(&as_user("main", "pm", "main")).await.unwrap();
    let gpu = Link::connect(&as_user("gpu", "pg", "gpu")).await.unwrap();
    // Everything a host does, under its own user.
    main.claim(b"{}", Duration::from_secs(5)).await.unwrap();
    gpu.claim(b"{}", Duration::from_secs(5)).await.unwrap();
    main.put_status(b"{}").await.unwrap();
    main.send("gpu", "m1", Bytes::from("to gpu")).await.unwrap();
    assert_eq!(main.queued_for("gpu").await.unwrap(), 1);
    // A request from main to gpu, answered under gpu's user.
    let mut calls = gpu.calls().await.unwrap();
    let serve = tokio::spawn(async move {
        let call = calls.next().await.unwrap();
        call.answer(Bytes::from("gpu's answer")).await.unwrap();
    });
    let answer = main.call("gpu", "r1", Bytes::from("q"), Duration::from_secs(5)).await.unwrap();
    assert_eq!(answer, Bytes::from("gpu's answer"));
    serve.await.unwrap();
    let mut inbox = gpu.inbox().await.unwrap();
    let d = next(&mut inbox).await;
    assert_eq!((d.msg_id.as_str(), d.from_host.as_str(), d.authentic), ("m1", "main", true));
    flock_cluster::ack_prefix(std::slice::from_ref(&d)).await.unwrap();
    assert!(main.status_of("gpu").await.unwrap().is_some());
    // A standby for gpu (under gpu's user) says it waits; every host reads it; it is no status.
    gpu.put_standby(b"{\"pid\":1}").await.unwrap();
    let word = main.standby_of("gpu").await.unwrap().expect("the standby's word");
    assert!(word.authentic && word.body == "{\"pid\":1}", "{word:?}");
    assert_ne!(main.status_of("gpu").await.unwrap().unwrap().body, word.body);
    gpu.clear_standby().await.unwrap();
    assert!(main.standby_of("gpu").await.unwrap().is_none());
    // gpu's user posing as host `main`: it may neither send as main nor write main's status.
    let before = main.status_of("main").await.unwrap().unwrap();
    let impostor = Link::connect(&as_user("gpu", "pg", "main")).await.unwrap();
    let sent = tokio::time::timeout(
        Duration::from_secs(10),
        impostor.send("gpu", "m2", Bytes::from("as main")),
    )
    .await;
    assert!(!matches!(sent, Ok(Ok(_))), "published as main: {sent:?}");
    let wrote = tokio::time::timeout(Duration::from_secs(10), impostor.put_status(b"{}")).await;
    assert!(!matches!(wrote, Ok(Ok(()))), "wrote main's status");
    let said = tokio::time::timeout(Duration::from_secs(10), impostor.put_standby(b"{}")).await;
    assert!(!matches!(said, Ok(Ok(()))), "spoke as main's standby");
    let after = main.status_of("main").await.unwrap().unwrap();
    assert_eq!((after.instance, after.body), (before.instance, before.body), "main's own");
    nothing_for(&mut inbox, 300).await;
}

/// A stream an older build made (one message per stream entry, subjects `inbox.<to>.<from>`)
/// takes the subjects entries go on when it holds nothing; with mail still in it, connecting
/// says what to do instead of losing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_an_older_build_made_is_brought_up_to_date_when_empty_and_refused_when_not() {
    let Some(bin) = available("older stream") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let js = async_nats::jetstream::new(async_nats::connect(broker.url()).await.unwrap());
    let old = |swarm: &str| async_nats::jetstream::stream::Config {
        name: format!("FLOCK-{swarm}"),
        subjects: vec![format!("flock.{swarm}.inbox.*.*")],
        retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    };
    js.create_stream(old("team")).await.unwrap();
    let a = Link::connect(&options(&broker, "a", Duration::from_secs(30))).await.unwrap();
    let b = Link::connect(&options(&broker, "b", Duration::from_secs(30))).await.unwrap();
    a.send("b", "m1", Bytes::from("after the upgrade")).await.unwrap();
    let mut inbox = b.inbox().await.unwrap();
    assert_eq!(next(&mut inbox).await.payload.as_ref(), b"after the upgrade");

    js.create_stream(old("busy")).await.unwrap();
    js.publish("flock.busy.inbox.b.a", Bytes::from("old mail")).await.unwrap().await.unwrap();
    let refused = Link::connect(&Options::new(broker.url(), "busy", "a")).await.unwrap_err();
    let why = refused.to_string();
    assert!(why.contains("older Flock") && why.contains("1 message(s)"), "{why}");
}
