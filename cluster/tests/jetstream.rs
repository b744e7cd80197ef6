//! The host-to-host transport against a real `nats-server -js` (Debian's package, which
//! `scripts/setup` installs): delivery once and in order, de-duplication by message id,
//! redelivery of what was not acknowledged, and nothing acknowledged lost when the broker is
//! killed with `kill -9`. `scripts/test` sets `FLOCK_REQUIRE_NATS=1`: there a missing server
//! fails instead of skipping.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flock_cluster::{Delivery, Inbox, Link, Options};

/// The `nats-server` binary: `FLOCK_NATS_SERVER`, else on PATH, else Debian's `/usr/sbin`.
fn server_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLOCK_NATS_SERVER") {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/sbin")])
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
}

fn available(test: &str) -> Option<PathBuf> {
    let bin = server_bin();
    if bin.is_none() {
        assert!(
            std::env::var_os("FLOCK_REQUIRE_NATS").is_none(),
            "FLOCK_REQUIRE_NATS is set but there is no nats-server: run scripts/setup"
        );
        eprintln!("{test}: skipped (no nats-server: run scripts/setup)");
    }
    bin
}

/// A real broker with JetStream, its store in `dir`, on a loopback port.
struct Broker {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl Broker {
    /// A new broker on a port it picks itself (`-p -1`, read back from its ports file: a port
    /// picked here and handed over could be taken by a test running beside it), or again on
    /// `port` after a kill.
    fn start(bin: &Path, dir: &Path, port: Option<u16>) -> Broker {
        let ports_dir = dir.join("ports");
        std::fs::create_dir_all(&ports_dir).unwrap();
        let mut child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p"])
            .arg(port.map_or("-1".to_owned(), |p| p.to_string()))
            .arg("--ports_file_dir")
            .arg(&ports_dir)
            .arg("-sd")
            .arg(dir.join("jetstream"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        let ports_file = ports_dir.join(format!(
            "{}_{}.ports",
            bin.file_name().unwrap_or_default().to_string_lossy(),
            child.id()
        ));
        let deadline = Instant::now() + Duration::from_secs(10);
        let port = loop {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("nats-server exited at start ({status}): port {port:?} taken?");
            }
            // `{"nats":["nats://127.0.0.1:46449"]}`
            let listed = std::fs::read_to_string(&ports_file).unwrap_or_default();
            let port = listed.split("nats://127.0.0.1:").nth(1).and_then(|rest| {
                rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u16>().ok()
            });
            if let Some(port) = port
                && TcpStream::connect(("127.0.0.1", port)).is_ok()
            {
                break port;
            }
            assert!(Instant::now() < deadline, "nats-server did not listen within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        };
        Broker { bin: bin.to_owned(), dir: dir.to_owned(), port, child }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// `kill -9`, then the same server again on the same store and port.
    fn kill9_and_restart(&mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
        *self = Broker::start(&self.bin.clone(), &self.dir.clone(), Some(self.port));
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn options(broker: &Broker, ack_wait: Duration) -> Options {
    Options { ack_wait, ..Options::new(broker.url(), "team") }
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
    let link = Link::connect(&options(&broker, Duration::from_secs(30))).await.unwrap();
    for i in 0..200 {
        let sent =
            link.send("b", &format!("m{i}"), Bytes::from(format!("body {i}"))).await.unwrap();
        assert!(!sent.duplicate);
    }
    // The outbox sends again after a crash: the stream stores an id once.
    let again = link.send("b", "m5", Bytes::from("body 5")).await.unwrap();
    assert!(again.duplicate, "{again:?}");
    let mut inbox = link.inbox("b").await.unwrap();
    for i in 0..200 {
        let d = next(&mut inbox).await;
        assert_eq!(
            (d.msg_id.as_str(), d.payload.as_ref()),
            (format!("m{i}").as_str(), format!("body {i}").as_bytes())
        );
        assert!(!d.redelivered);
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 500).await;
    // Another host's inbox holds none of it.
    let mut other = link.inbox("a").await.unwrap();
    nothing_for(&mut other, 300).await;
    // Acknowledged messages are gone: a new inbox (the host restarted) starts empty.
    drop(inbox);
    let mut again = link.inbox("b").await.unwrap();
    nothing_for(&mut again, 500).await;
    // Names that would break a subject are refused before anything is sent.
    let err = link.send("b.*", "x", Bytes::new()).await.unwrap_err();
    assert!(err.to_string().contains("a-z, 0-9 and -"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_receiving_host_never_acknowledged_comes_back_in_order() {
    let Some(bin) = available("redelivery") else { return };
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start(&bin, dir.path(), None);
    let opts = options(&broker, Duration::from_secs(1));
    let link = Link::connect(&opts).await.unwrap();
    for i in 1..=3 {
        link.send("b", &format!("m{i}"), Bytes::from(format!("body {i}"))).await.unwrap();
    }
    {
        // The receiving supervisor takes m1 and dies before it stored (and acknowledged) it.
        let receiver = Link::connect(&opts).await.unwrap();
        let mut inbox = receiver.inbox("b").await.unwrap();
        assert_eq!(next(&mut inbox).await.msg_id, "m1");
    }
    let receiver = Link::connect(&opts).await.unwrap();
    let mut inbox = receiver.inbox("b").await.unwrap();
    let first = next(&mut inbox).await;
    assert_eq!((first.msg_id.as_str(), first.redelivered), ("m1", true));
    first.ack().await.unwrap();
    for want in ["m2", "m3"] {
        let d = next(&mut inbox).await;
        assert_eq!(d.msg_id, want);
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 1_500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_broker_acknowledged_survives_its_kill_9() {
    let Some(bin) = available("broker kill -9") else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut broker = Broker::start(&bin, dir.path(), None);
    let opts = options(&broker, Duration::from_secs(30));
    let link = Link::connect(&opts).await.unwrap();
    for i in 0..50 {
        link.send("b", &format!("m{i}"), Bytes::from(vec![b'x'; 1024])).await.unwrap();
    }
    broker.kill9_and_restart();
    let link = Link::connect(&opts).await.unwrap();
    let mut inbox = link.inbox("b").await.unwrap();
    for i in 0..50 {
        let d = next(&mut inbox).await;
        assert_eq!(d.msg_id, format!("m{i}"));
        d.ack().await.unwrap();
    }
    nothing_for(&mut inbox, 500).await;
}
