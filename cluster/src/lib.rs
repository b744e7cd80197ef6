//! Flock across hosts (issue #26), the transport: messages between the supervisors of one swarm on
//! several machines go through **NATS JetStream**, never a home-made network layer.
//!
//! One stream per swarm, `FLOCK-<swarm>`, holds the subjects of each pair of hosts,
//! `flock.<swarm>.inbox.<to>.<from>.<count>` (`count`: the messages an entry carries): a work queue, so a message leaves the stream once the
//! receiving host has acknowledged it. The sending host is part of the subject, where the broker's
//! permissions can pin it (a host's NATS user may publish only on `flock.<swarm>.inbox.*.<host>.*`),
//! so a receiver learns who sent a message from the broker, not from the message.
//!
//! - [`Link::send`] publishes a message to a host's inbox with `Nats-Msg-Id` = the message's id and
//!   waits for the stream's acknowledgement: once it returns, the broker has the message on disk.
//!   The same id sent again inside the stream's duplicate window (two minutes) is stored once
//!   ([`Sent::duplicate`]), so the sending host may publish from its outbox again after any crash.
//! - [`Link::inbox`] is a host's durable pull consumer on its subjects, with a window of messages
//!   in flight ([`Options::window`]) read in order ([`Inbox::next_batch`]); a receiver
//!   acknowledges a prefix once it has stored it ([`ack_prefix`]). JetStream redelivers an
//!   unacknowledged message only after `ack_wait`, and delivers newer ones meanwhile, so a
//!   receiver that died with a window in flight would see later messages before the ones it
//!   lost. Opening the inbox therefore starts its consumer afresh: the work queue still holds
//!   every unacknowledged message, and a new consumer delivers them from the oldest, in stream
//!   order — order per host holds with a window. JetStream is at least once: the receiver
//!   de-duplicates by [`Delivery::msg_id`] in its own store before it acknowledges.
//!
//! With a swarm secret ([`Options::secret`], the same on every host), every message carries an
//! HMAC-SHA256 of its sending host, id and payload (`Flock-Mac`); a receiver learns whether it is
//! [`Delivery::authentic`] — anyone who can reach the broker but lacks the secret (an agent
//! process of the same user, a stranger on an open broker) cannot make one.
//!
//! Each host also writes its status (what `flockctl ps` shows of it) every second under its name
//! in the swarm's key-value bucket `flock-<swarm>-hosts` ([`Link::put_status`]), MAC'd like a
//! message; any host reads the others' ([`Link::status_of`]) — one view of the swarm, and a host
//! whose status stopped coming is seen as lost, with the time it last wrote. The status is also
//! the host's lease: a process takes a host's name only when no other process of it wrote
//! lately ([`Link::claim`]), and every write is conditional on the last one it made, so a process
//! that another took its host from learns it at its next write ([`Error::Fenced`]).
//!
//! Requests (`agents__request`) cross hosts as NATS core request–reply ([`Link::call`],
//! [`Link::calls`]): at most once, like a request on one host.
//!
//! The sending host's SQLite mailbox stays the source of truth (a transactional outbox); this crate
//! only moves bytes between hosts and says when they are safe.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
use ring::hmac;

/// The header that carries a message's MAC (hex).
const MAC_HEADER: &str = "Flock-Mac";

/// What a message's MAC covers: the host that sends it (so a message cannot be replayed as
/// another host's), its id and its bytes.
fn signed(from_host: &str, msg_id: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(from_host.len() + msg_id.len() + payload.len() + 2);
    v.extend_from_slice(from_host.as_bytes());
    v.push(0);
    v.extend_from_slice(msg_id.as_bytes());
    v.push(0);
    v.extend_from_slice(payload);
    v
}

/// The MAC (hex) of `payload` sent by `host` as `what` (a message id, `call:<id>`, …); `None`
/// without a secret.
fn mac(key: Option<&hmac::Key>, host: &str, what: &str, payload: &[u8]) -> Option<String> {
    key.map(|k| hex::encode(hmac::sign(k, &signed(host, what, payload)).as_ref()))
}

/// Whether `tag` (hex) is the MAC of `payload` sent by `host` as `what`; always `true` without a
/// secret.
fn verify(
    key: Option<&hmac::Key>,
    tag: Option<&str>,
    host: &str,
    what: &str,
    payload: &[u8],
) -> bool {
    let Some(key) = key else { return true };
    tag.and_then(|t| hex::decode(t).ok())
        .is_some_and(|tag| hmac::verify(key, &signed(host, what, payload), &tag).is_ok())
}
use bytes::Bytes;
use futures_util::StreamExt;

mod calls;
pub use calls::{Call, Calls};

/// How to reach the broker, and whose messages these are.
#[derive(Debug, Clone)]
pub struct Options {
    /// `nats://host:port` (several, comma-separated, for a NATS cluster).
    pub url: String,
    /// A NATS credentials file (`.creds`: a user JWT and its nkey seed), if the broker asks for
    /// one.
    pub credentials_file: Option<PathBuf>,
    /// The swarm's name (`[a-z0-9-]`): its stream and subjects.
    pub swarm: String,
    /// This host's name (`[a-z0-9-]`): the inbox it reads, and the sender of what it sends.
    pub host: String,
    /// A delivery not acknowledged this long is delivered again.
    pub ack_wait: Duration,
    /// How many messages this host's inbox may hold delivered but unacknowledged.
    pub window: i64,
    /// The swarm's secret: messages are sent with its MAC and checked against it (`None`: neither).
    pub secret: Option<Vec<u8>>,
    /// Who holds this host's name ([`Link::claim`]): the same for every run from one place (a
    /// supervisor keeps it in its state dir, whose lock allows one run at a time), so a run may
    /// take over from a dead run of its own at once, and from anyone else only once their status
    /// is stale. Random by default.
    pub instance: String,
}

impl Options {
    pub fn new(
        url: impl Into<String>,
        swarm: impl Into<String>,
        host: impl Into<String>,
    ) -> Options {
        Options {
            url: url.into(),
            credentials_file: None,
            swarm: swarm.into(),
            host: host.into(),
            ack_wait: Duration::from_secs(30),
            window: 256,
            secret: None,
            instance: instance_id(),
        }
    }
}

/// One NATS address cut at its login: `(scheme, login, host and path)`; `None` without `://`.
fn address_parts(u: &str) -> Option<(&str, Option<&str>, &str)> {
    let (scheme, rest) = u.split_once("://")?;
    let at = rest[..rest.find('/').unwrap_or(rest.len())].rfind('@');
    Some(match at {
        Some(i) => (scheme, Some(&rest[..i]), &rest[i + 1..]),
        None => (scheme, None, rest),
    })
}

/// Each of `url`'s comma-separated addresses, trimmed, through `f`, joined again.
fn each_address(url: &str, mut f: impl FnMut(&str) -> String) -> String {
    url.split(',').map(|u| f(u.trim())).collect::<Vec<_>>().join(",")
}

/// `url` (one or several comma-separated NATS addresses) without the passwords or tokens in
/// them (`nats://user:secret@host` → `nats://user:***@host`): for logs and errors.
pub fn redacted(url: &str) -> String {
    each_address(url, |u| match address_parts(u) {
        Some((scheme, Some(info), rest)) => {
            let user = info.split_once(':').map_or("", |(user, _)| user);
            let shown = if user.is_empty() { "***".to_owned() } else { format!("{user}:***") };
            format!("{scheme}://{shown}@{rest}")
        }
        _ => u.to_owned(),
    })
}

/// A login written into a NATS address.
#[derive(Debug, PartialEq, Eq)]
enum Login {
    User(String, String),
    Token(String),
}

/// `url` (one or several comma-separated addresses) without the logins in them, and the first
/// login (`nats://user:password@host` or `nats://token@host`).
fn split_login(url: &str) -> (String, Option<Login>) {
    let mut login = None;
    let addresses = each_address(url, |u| match address_parts(u) {
        Some((scheme, Some(info), rest)) => {
            login.get_or_insert_with(|| match info.split_once(':') {
                Some((user, password)) => Login::User(user.to_owned(), password.to_owned()),
                None => Login::Token(info.to_owned()),
            });
            format!("{scheme}://{rest}")
        }
        _ => u.to_owned(),
    });
    (addresses, login)
}

/// What went wrong, in words that name the broker's side of it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{0}` is not a name Flock gives a swarm or host: use a-z, 0-9 and -")]
    Name(String),
    #[error("cannot reach NATS at {url}: {why} (is nats-server running with -js?)")]
    Connect { url: String, why: String },
    #[error("NATS JetStream stream {stream}: {why}")]
    Stream { stream: String, why: String },
    #[error("publish to {subject}: {why}")]
    Publish { subject: String, why: String },
    #[error("a request to host `{host}`: {why}")]
    Call { host: String, why: String },
    #[error("host inbox {subject}: {why}")]
    Inbox { subject: String, why: String },
    #[error("hosts' status bucket {bucket}: {why}")]
    Status { bucket: String, why: String },
    #[error(
        "host `{host}` is running already (its supervisor wrote its status {age_ms} ms ago, on \
         this machine or another): stop it first (`flockctl down` there), or start this one as \
         another host; a host that died is free again 5 s after its last status"
    )]
    HostTaken { host: String, age_ms: u64 },
    #[error(
        "another supervisor took host `{host}` over (this one could not write its status for \
         longer than the others wait): this one stops, so the host's agents never run twice"
    )]
    Fenced { host: String },
}

/// How often the link lost its connection to the broker. A broker that restarted holds the
/// consumer's old deliveries as pending until `ack_wait` and delivers newer ones meanwhile, so an
/// inbox opened before a loss must be opened again (afresh) to keep order.
#[derive(Debug, Default)]
struct Losses {
    count: AtomicU64,
    notify: tokio::sync::Notify,
}

impl Losses {
    /// Returns once the connection has been lost since `epoch`.
    async fn since(&self, epoch: u64) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.count.load(Ordering::SeqCst) != epoch {
                return;
            }
            notified.await;
        }
    }
}

/// One swarm's link to the broker.
#[derive(Clone)]
pub struct Link {
    js: jetstream::Context,
    swarm: String,
    host: String,
    stream: String,
    ack_wait: Duration,
    window: i64,
    key: Option<hmac::Key>,
    losses: Arc<Losses>,
    status: kv::Store,
    /// Who holds this host's name ([`Options::instance`]), and the revision of the status this
    /// link wrote last.
    instance: String,
    revision: Arc<AtomicU64>,
    /// How young another run's status must be to hold the host (set by [`Link::claim`]).
    fresh_ms: Arc<AtomicU64>,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("stream", &self.stream).finish_non_exhaustive()
    }
}

/// The stream's answer to a [`Link::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// Its place in the swarm's stream.
    pub sequence: u64,
    /// The stream had this message id already (a send repeated after a crash): stored once.
    pub duplicate: bool,
}

fn valid_name(name: &str) -> Result<(), Error> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok { Ok(()) } else { Err(Error::Name(name.to_owned())) }
}

impl Link {
    /// Connects and makes sure the swarm's stream exists (file storage, work-queue retention,
    /// a two-minute duplicate window).
    pub async fn connect(options: &Options) -> Result<Link, Error> {
        valid_name(&options.swarm)?;
        valid_name(&options.host)?;
        let connect_error = |why: String| Error::Connect { url: redacted(&options.url), why };
        let losses = Arc::new(Losses::default());
        let on_event = losses.clone();
        let mut connect = async_nats::ConnectOptions::new()
            .event_callback(move |event| {
                let losses = on_event.clone();
                async move {
                    if matches!(event, async_nats::Event::Disconnected) {
                        losses.count.fetch_add(1, Ordering::SeqCst);
                        losses.notify.notify_waiters();
                    }
                }
            })
            .name(format!("flock-{}-{}", options.swarm, options.host))
            .connection_timeout(Duration::from_secs(5));
        if let Some(creds) = &options.credentials_file {
            connect = connect
                .credentials_file(creds)
                .await
                .map_err(|e| connect_error(format!("credentials file {}: {e}", creds.display())))?;
        }
        // The client does not read a user, password or token from the address: they are passed
        // as options, and the addresses without them.
        let (addresses, login) = split_login(&options.url);
        connect = match login {
            Some(Login::User(user, password)) => connect.user_and_password(user, password),
            Some(Login::Token(token)) => connect.token(token),
            None => connect,
        };
        let client =
            connect.connect(addresses.as_str()).await.map_err(|e| connect_error(e.to_string()))?;
        let js = jetstream::new(client);
        let name = format!("FLOCK-{}", options.swarm);
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("flock.{}.inbox.*.*.*", options.swarm)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        let stream_error = |why: String| Error::Stream { stream: name.clone(), why };
        let stream = js
            .get_or_create_stream(config.clone())
            .await
            .map_err(|e| stream_error(e.to_string()))?;
        // A stream an older build made (one message per entry: `inbox.<to>.<from>`) takes the
        // subjects entries go on, when it holds nothing; with mail in it, say what to do.
        let info = stream.cached_info();
        if info.config.subjects != config.subjects {
            if info.state.messages > 0 {
                return Err(stream_error(format!(
                    "it was made by an older Flock (subjects {}) and still holds {} message(s) \
                     for hosts: run the older build until every host has taken its mail, or \
                     delete the stream (`nats stream rm {name}`) to drop them",
                    info.config.subjects.join(", "),
                    info.state.messages
                )));
            }
            js.update_stream(&config).await.map_err(|e| stream_error(e.to_string()))?;
        }
        // The bucket's stream made as async-nats makes a key-value bucket's (one value per key,
        // rollups, direct reads), but without its account query, which servers before 2.10
        // (Debian 12 ships 2.9) answer in a shape the client cannot read.
        let bucket = status_bucket(&options.swarm);
        let status_error = |why: String| Error::Status { bucket: bucket.clone(), why };
        js.get_or_create_stream(stream::Config {
            name: format!("KV_{bucket}"),
            description: Some(format!(
                "the hosts of swarm {}: what each last said of itself",
                options.swarm
            )),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            ..Default::default()
        })
        .await
        .map_err(|e| status_error(e.to_string()))?;
        let status = js.get_key_value(&bucket).await.map_err(|e| status_error(e.to_string()))?;
        Ok(Link {
            js,
            swarm: options.swarm.clone(),
            host: options.host.clone(),
            stream: name,
            ack_wait: options.ack_wait,
            window: options.window.max(1),
            key: options.secret.as_deref().map(|s| hmac::Key::new(hmac::HMAC_SHA256, s)),
            losses,
            status,
            instance: options.instance.clone(),
            revision: Arc::default(),
            fresh_ms: Arc::default(),
        })
    }

    /// Takes this host's name for this process: writes its first status unless a status of
    /// another process is younger than `fresh` ([`Error::HostTaken`]: that host runs already,
    /// here or on another machine). The write is conditional on the status it replaces, so of two
    /// processes starting as the same host at once one wins.
    pub async fn claim(&self, body: &[u8], fresh: Duration) -> Result<(), Error> {
        let current = self.read_status(&self.host).await?;
        let expected = match &current {
            None => 0,
            Some((s, revision)) => {
                let age = now_ms().saturating_sub(s.written_ms);
                if s.authentic && s.instance != self.instance && age < fresh.as_millis() as u64 {
                    return Err(Error::HostTaken { host: self.host.clone(), age_ms: age });
                }
                *revision
            }
        };
        self.fresh_ms.store(fresh.as_millis() as u64, Ordering::SeqCst);
        match self.status.update(&self.host, self.status_value(body), expected).await {
            Ok(revision) => {
                self.revision.store(revision, Ordering::SeqCst);
                Ok(())
            }
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                Err(Error::HostTaken { host: self.host.clone(), age_ms: 0 })
            }
            Err(e) => Err(self.status_error(format!("write {}: {e}", self.host))),
        }
    }

    /// Writes this host's status over the one this process wrote last ([`Link::claim`] first).
    /// [`Error::Fenced`] when another process of this host has written one since: it took the
    /// host over (this one was cut off for longer than the others wait), and this process must
    /// stop so the host's agents never run twice. A status without the swarm's MAC, or older than
    /// `fresh` of [`Link::claim`], is written over (an agent that found the broker cannot fence a
    /// host, by forging a status nor by replaying an old one of another run).
    pub async fn put_status(&self, body: &[u8]) -> Result<(), Error> {
        let value = self.status_value(body);
        let last = self.revision.load(Ordering::SeqCst);
        let revision = match self.status.update(&self.host, value.clone(), last).await {
            Ok(r) => r,
            Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => {
                let current = self.read_status(&self.host).await?;
                let fresh = self.fresh_ms.load(Ordering::SeqCst);
                let revision = match current {
                    Some((s, _))
                        if s.authentic
                            && s.instance != self.instance
                            && now_ms().saturating_sub(s.written_ms) < fresh =>
                    {
                        return Err(Error::Fenced { host: self.host.clone() });
                    }
                    Some((_, revision)) => revision,
                    None => 0,
                };
                self.status
                    .update(&self.host, value, revision)
                    .await
                    .map_err(|e| self.status_error(format!("write {}: {e}", self.host)))?
            }
            Err(e) => return Err(self.status_error(format!("write {}: {e}", self.host))),
        };
        self.revision.store(revision, Ordering::SeqCst);
        Ok(())
    }

    /// Writes that a standby for this host waits (`body`: what `ps` shows of it), under the
    /// swarm's MAC, beside the host's status (key `<host>.standby`; never taken for a status).
    pub async fn put_standby(&self, body: &[u8]) -> Result<(), Error> {
        let key = standby_key(&self.host);
        let value = self.signed_value(STANDBY_ID, body);
        self.status
            .put(&key, value)
            .await
            .map_err(|e| self.status_error(format!("write {key}: {e}")))?;
        Ok(())
    }

    /// Says this host's standby no longer waits (it took the host over, or stops).
    pub async fn clear_standby(&self) -> Result<(), Error> {
        let key = standby_key(&self.host);
        self.status.delete(&key).await.map_err(|e| self.status_error(format!("delete {key}: {e}")))
    }

    /// What the standby of host `host` last wrote; `None` if none waits (or ever did).
    pub async fn standby_of(&self, host: &str) -> Result<Option<HostStatus>, Error> {
        valid_name(host)?;
        Ok(self.read_signed(&standby_key(host), host, STANDBY_ID).await?.map(|(s, _)| s))
    }

    /// `mac \n instance \n written_ms \n body`, the MAC over the rest and the host's name.
    fn status_value(&self, body: &[u8]) -> Bytes {
        self.signed_value(STATUS_ID, body)
    }

    /// A value of the status bucket for `purpose` (a status, a standby's word).
    fn signed_value(&self, purpose: &str, body: &[u8]) -> Bytes {
        let mut signed_part = format!("{}\n{}\n", self.instance, now_ms()).into_bytes();
        signed_part.extend_from_slice(body);
        let mut value = Vec::with_capacity(signed_part.len() + 65);
        if let Some(tag) = mac(self.key.as_ref(), &self.host, purpose, &signed_part) {
            value.extend_from_slice(tag.as_bytes());
        }
        value.push(b'\n');
        value.extend_from_slice(&signed_part);
        value.into()
    }

    fn status_error(&self, why: String) -> Error {
        Error::Status { bucket: self.status.name.clone(), why }
    }

    /// How many messages the stream holds for host `host` that it has not acknowledged yet (what
    /// waits in the broker while that host is down).
    pub async fn queued_for(&self, host: &str) -> Result<u64, Error> {
        valid_name(host)?;
        let stream_error = |why: String| Error::Stream { stream: self.stream.clone(), why };
        let stream =
            self.js.get_stream(&self.stream).await.map_err(|e| stream_error(e.to_string()))?;
        let filter = format!("flock.{}.inbox.{host}.*.*", self.swarm);
        let mut subjects =
            stream.info_with_subjects(&filter).await.map_err(|e| stream_error(e.to_string()))?;
        let mut queued = 0;
        while let Some(subject) = subjects.next().await {
            let (subject, entries) = subject.map_err(|e| stream_error(e.to_string()))?;
            // `….<from>.<count>`: entries of `count` messages each.
            let count = subject.rsplit('.').next().and_then(|c| c.parse::<u64>().ok());
            queued += entries as u64 * count.unwrap_or(1).max(1);
        }
        Ok(queued)
    }

    /// What host `host` last wrote of itself; `None` if it never did.
    pub async fn status_of(&self, host: &str) -> Result<Option<HostStatus>, Error> {
        Ok(self.read_status(host).await?.map(|(s, _)| s))
    }

    async fn read_status(&self, host: &str) -> Result<Option<(HostStatus, u64)>, Error> {
        valid_name(host)?;
        self.read_signed(host, host, STATUS_ID).await
    }

    /// The value under `key` that host `host` wrote for `purpose`, and its revision.
    async fn read_signed(
        &self,
        key: &str,
        host: &str,
        purpose: &str,
    ) -> Result<Option<(HostStatus, u64)>, Error> {
        let entry = self
            .status
            .entry(key)
            .await
            .map_err(|e| self.status_error(format!("read {key}: {e}")))?;
        let Some(entry) = entry.filter(|e| e.operation == kv::Operation::Put) else {
            return Ok(None);
        };
        let value = entry.value;
        let mut parts = value.splitn(4, |&b| b == b'\n');
        let (mac, instance, written, _) = (parts.next(), parts.next(), parts.next(), parts.next());
        let text = |p: Option<&[u8]>| String::from_utf8_lossy(p.unwrap_or_default()).into_owned();
        let mac_len = mac.map_or(0, <[u8]>::len);
        let signed_part = value.slice((mac_len + 1).min(value.len())..);
        let header = instance.map_or(0, <[u8]>::len) + written.map_or(0, <[u8]>::len) + 2;
        let body = signed_part.slice(header.min(signed_part.len())..);
        let tag = std::str::from_utf8(mac.unwrap_or_default()).ok();
        let authentic = verify(self.key.as_ref(), tag, host, purpose, &signed_part);
        let status = HostStatus {
            host: host.to_owned(),
            body,
            authentic,
            instance: text(instance),
            written_ms: text(written).parse().unwrap_or(0),
        };
        Ok(Some((status, entry.revision)))
    }

    /// This host's name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The subject of an entry of `count` messages this host sends to `to`.
    pub fn subject(&self, to: &str, count: usize) -> String {
        format!("flock.{}.inbox.{to}.{}.{count}", self.swarm, self.host)
    }

    /// Publishes `payload` (one message) to host `to`'s inbox under `msg_id` and waits until the
    /// stream has stored it (or found it stored already).
    pub async fn send(
        &self,
        to: &str,
        msg_id: &str,
        payload: impl Into<Bytes>,
    ) -> Result<Sent, Error> {
        self.send_entry(to, msg_id, 1, payload).await
    }

    /// [`Link::send`] for a stream entry that carries `count` messages (the subject says how
    /// many, so [`Link::queued_for`] counts messages, not entries).
    pub async fn send_entry(
        &self,
        to: &str,
        msg_id: &str,
        count: usize,
        payload: impl Into<Bytes>,
    ) -> Result<Sent, Error> {
        valid_name(to)?;
        let subject = self.subject(to, count.max(1));
        let publish_error = |why: String| Error::Publish { subject: subject.clone(), why };
        let payload = payload.into();
        let mut message = jetstream::message::PublishMessage::build();
        if let Some(tag) = mac(self.key.as_ref(), &self.host, msg_id, &payload) {
            message = message.header(MAC_HEADER, tag.as_str());
        }
        let message = message.payload(payload).message_id(msg_id);
        let ack = self
            .js
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| publish_error(e.to_string()))?
            .await
            .map_err(|e| publish_error(e.to_string()))?;
        Ok(Sent { sequence: ack.sequence, duplicate: ack.duplicate })
    }

    /// This host's inbox: its durable consumer, started afresh (the messages stay in the work
    /// queue until acknowledged), delivering in order from the oldest unacknowledged message. One
    /// process per host may read it at a time.
    pub async fn inbox(&self) -> Result<Inbox, Error> {
        let host = &self.host;
        let subject = format!("flock.{}.inbox.{host}.*.*", self.swarm);
        let inbox_error = |why: String| Error::Inbox { subject: subject.clone(), why };
        let epoch = self.losses.count.load(Ordering::SeqCst);
        let stream = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| Error::Stream { stream: self.stream.clone(), why: e.to_string() })?;
        let durable = format!("host-{host}");
        let config = consumer::pull::Config {
            durable_name: Some(durable.clone()),
            filter_subject: subject.clone(),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            max_ack_pending: self.window,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        };
        // What a dead reader left unacknowledged would come back only after `ack_wait`, behind
        // newer messages: a fresh consumer delivers it first. (Gone already is fine.)
        let _ = stream.delete_consumer(&durable).await;
        let consumer: consumer::PullConsumer =
            stream.create_consumer(config).await.map_err(|e| inbox_error(e.to_string()))?;
        let messages = consumer.messages().await.map_err(|e| inbox_error(e.to_string()))?;
        Ok(Inbox { subject, messages, key: self.key.clone(), losses: self.losses.clone(), epoch })
    }
}

/// The id a status's MAC is made over (in the place of a message id): a status cannot pass for
/// a message, nor a message for a status.
const STATUS_ID: &str = "status";
/// The id a standby's word is made over: it cannot pass for the host's status.
const STANDBY_ID: &str = "standby";

/// A random id (16 bytes, hex): a [`Options::instance`].
pub fn instance_id() -> String {
    use ring::rand::SecureRandom;
    let mut id = [0u8; 16];
    // The system's randomness does not fail on Linux; a zero id would still be one process's.
    let _ = ring::rand::SystemRandom::new().fill(&mut id);
    hex::encode(id)
}

/// The key of host `host`'s standby in the status bucket.
fn standby_key(host: &str) -> String {
    format!("{host}.standby")
}

/// The bucket that holds each host's status.
fn status_bucket(swarm: &str) -> String {
    format!("flock-{swarm}-hosts")
}

/// What a host last wrote of itself ([`Link::status_of`]).
#[derive(Debug, Clone)]
pub struct HostStatus {
    pub host: String,
    pub body: Bytes,
    /// It carries a valid MAC of the swarm's secret over the host's name, the process, the time
    /// and the body (always `true` on a link without a secret). Show it as unknown otherwise.
    pub authentic: bool,
    /// The process that wrote it (a random id per [`Link`]).
    pub instance: String,
    /// When it was written (the writer's clock, under the MAC: a replayed old status stays
    /// old), in milliseconds since the Unix epoch.
    pub written_ms: u64,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A host's inbox, read in order.
pub struct Inbox {
    subject: String,
    messages: consumer::pull::Stream,
    key: Option<hmac::Key>,
    losses: Arc<Losses>,
    /// `losses.count` when it was opened.
    epoch: u64,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("subject", &self.subject).finish_non_exhaustive()
    }
}

impl Inbox {
    /// The next message, and those already here behind it (at most `max` in all), in order;
    /// `None` when the connection is gone for good. An error once the link lost the broker since
    /// this inbox was opened: open it again (what was delivered before comes again, first).
    pub async fn next_batch(&mut self, max: usize) -> Option<Result<Vec<Delivery>, Error>> {
        use futures_util::FutureExt;
        let losses = self.losses.clone();
        let lost = Error::Inbox {
            subject: self.subject.clone(),
            why: "the connection to the broker was lost; open the inbox again".into(),
        };
        let epoch = self.epoch;
        let first = tokio::select! {
            next = self.next() => match next? {
                Ok(d) => d,
                Err(e) => return Some(Err(e)),
            },
            () = losses.since(epoch) => return Some(Err(lost)),
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match self.next().now_or_never() {
                Some(Some(Ok(d))) => batch.push(d),
                // An error or the end shows itself on the next call.
                _ => break,
            }
        }
        Some(Ok(batch))
    }

    /// The next message; `None` when the connection is gone for good.
    pub async fn next(&mut self) -> Option<Result<Delivery, Error>> {
        let subject = self.subject.clone();
        let message = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(Error::Inbox { subject, why: e.to_string() })),
        };
        // Empty when it has none: not Flock's; the receiver refuses it and acknowledges it with
        // the messages around it (in order).
        let msg_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
        // `flock.<swarm>.inbox.<to>.<from>.<count>`: the filter guarantees the shape.
        let from_host = message.subject.rsplit('.').nth(1).unwrap_or_default().to_owned();
        let tag = message.headers.as_ref().and_then(|h| h.get(MAC_HEADER)).map(|t| t.as_str());
        let authentic = verify(self.key.as_ref(), tag, &from_host, &msg_id, &message.payload);
        Some(Ok(Delivery {
            msg_id,
            from_host,
            authentic,
            payload: message.payload.clone(),
            redelivered: delivered > 1,
            message,
        }))
    }
}

/// One message from a host's inbox. Acknowledge it once it is stored on this host; until then
/// the broker keeps it and delivers it again after `ack_wait`.
pub struct Delivery {
    /// The message's id (`Nats-Msg-Id`): what the receiving store de-duplicates on.
    pub msg_id: String,
    /// The host that sent it, from its subject (which the broker's permissions can pin).
    pub from_host: String,
    /// It carries a valid MAC of the swarm's secret over its sending host, id and payload
    /// (always `true` on a link without a secret). Refuse it otherwise.
    pub authentic: bool,
    pub payload: Bytes,
    /// The broker delivered it before (to this host, which did not acknowledge it).
    pub redelivered: bool,
    message: jetstream::Message,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("msg_id", &self.msg_id)
            .field("from_host", &self.from_host)
            .field("authentic", &self.authentic)
            .field("bytes", &self.payload.len())
            .field("redelivered", &self.redelivered)
            .finish()
    }
}

impl Delivery {
    /// Acknowledges it and waits for the broker to confirm: it is gone from the queue.
    pub async fn ack(&self) -> Result<(), Error> {
        self.message.double_ack().await.map_err(|e| Error::Inbox {
            subject: self.message.subject.to_string(),
            why: format!("acknowledge {}: {e}", self.msg_id),
        })
    }
}

/// Acknowledges `prefix` (messages stored, in the order delivered): each one, the last waiting for
/// the broker's confirmation (which comes after the ones before it on the same connection).
pub async fn ack_prefix(prefix: &[Delivery]) -> Result<(), Error> {
    let Some((last, before)) = prefix.split_last() else { return Ok(()) };
    for d in before {
        d.message.ack().await.map_err(|e| Error::Inbox {
            subject: d.message.subject.to_string(),
            why: format!("acknowledge {}: {e}", d.msg_id),
        })?;
    }
    last.ack().await
}

#[cfg(test)]
mod tests {
    use super::{Login, redacted, split_login};

    #[test]
    fn a_login_in_an_address_is_passed_apart_from_it() {
        assert_eq!(split_login("nats://127.0.0.1:4222"), ("nats://127.0.0.1:4222".into(), None));
        assert_eq!(
            split_login("nats://gpu:p@ss@10.0.0.5:4222, nats://gpu:p@ss@10.0.0.6:4222"),
            (
                "nats://10.0.0.5:4222,nats://10.0.0.6:4222".into(),
                Some(Login::User("gpu".into(), "p@ss".into()))
            )
        );
        assert_eq!(
            split_login("tls://t0ken@h:4222"),
            ("tls://h:4222".into(), Some(Login::Token("t0ken".into())))
        );
    }

    #[test]
    fn a_url_in_a_log_or_error_shows_no_password_or_token() {
        assert_eq!(redacted("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redacted("nats://gpu:hunter2@10.0.0.5:4222"), "nats://gpu:***@10.0.0.5:4222");
        assert_eq!(redacted("tls://s3cr3tt0ken@h:4222"), "tls://***@h:4222");
        assert_eq!(
            redacted("nats://a:p@h1:4222, nats://h2:4222"),
            "nats://a:***@h1:4222,nats://h2:4222"
        );
        assert!(
            !redacted("nats://u:p@ss@h:1").contains("p@ss"),
            "{}",
            redacted("nats://u:p@ss@h:1")
        );
    }
}
