//! Flock across hosts (issue #26), the transport: messages between the supervisors of one swarm on
//! several machines go through **NATS JetStream**, never a home-made network layer.
//!
//! One stream per swarm, `FLOCK-<swarm>`, holds one subject per pair of hosts,
//! `flock.<swarm>.inbox.<to>.<from>`: a work queue, so a message leaves the stream once the
//! receiving host has acknowledged it. The sending host is part of the subject, where the broker's
//! permissions can pin it (a host's NATS user may publish only on `flock.<swarm>.inbox.*.<host>`),
//! so a receiver learns who sent a message from the broker, not from the message.
//!
//! - [`Link::send`] publishes a message to a host's inbox with `Nats-Msg-Id` = the message's id and
//!   waits for the stream's acknowledgement: once it returns, the broker has the message on disk.
//!   The same id sent again inside the stream's duplicate window (two minutes) is stored once
//!   ([`Sent::duplicate`]), so the sending host may publish from its outbox again after any crash.
//! - [`Link::inbox`] is a host's durable pull consumer on its subject, with one message in flight
//!   and acknowledged one at a time ([`Delivery::ack`], a double ack: the broker confirms it). A
//!   message not acknowledged within `ack_wait` — the receiving supervisor died before it stored
//!   the message — is delivered again before any later one, so order per host holds. JetStream is at least once: the receiver de-duplicates by
//!   [`Delivery::msg_id`] in its own store before it acknowledges.
//!
//! The sending host's SQLite mailbox stays the source of truth (a transactional outbox); this crate
//! only moves bytes between hosts and says when they are safe.

use std::path::PathBuf;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures_util::StreamExt;

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
        }
    }
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
    #[error("host inbox {subject}: {why}")]
    Inbox { subject: String, why: String },
    #[error("a message on {subject} has no Nats-Msg-Id: not Flock's")]
    NoId { subject: String },
}

/// One swarm's link to the broker.
#[derive(Clone)]
pub struct Link {
    js: jetstream::Context,
    swarm: String,
    host: String,
    stream: String,
    ack_wait: Duration,
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
        let connect_error = |why: String| Error::Connect { url: options.url.clone(), why };
        let mut connect = async_nats::ConnectOptions::new()
            .name(format!("flock-{}-{}", options.swarm, options.host))
            .connection_timeout(Duration::from_secs(5));
        if let Some(creds) = &options.credentials_file {
            connect = connect
                .credentials_file(creds)
                .await
                .map_err(|e| connect_error(format!("credentials file {}: {e}", creds.display())))?;
        }
        let client =
            connect.connect(&options.url).await.map_err(|e| connect_error(e.to_string()))?;
        let js = jetstream::new(client);
        let name = format!("FLOCK-{}", options.swarm);
        let config = stream::Config {
            name: name.clone(),
            subjects: vec![format!("flock.{}.inbox.*.*", options.swarm)],
            retention: stream::RetentionPolicy::WorkQueue,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        };
        js.get_or_create_stream(config)
            .await
            .map_err(|e| Error::Stream { stream: name.clone(), why: e.to_string() })?;
        Ok(Link {
            js,
            swarm: options.swarm.clone(),
            host: options.host.clone(),
            stream: name,
            ack_wait: options.ack_wait,
        })
    }

    /// This host's name.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The subject of what this host sends to `to`.
    pub fn subject(&self, to: &str) -> String {
        format!("flock.{}.inbox.{to}.{}", self.swarm, self.host)
    }

    /// Publishes `payload` to host `to`'s inbox under `msg_id` and waits until the stream has
    /// stored it (or found it stored already).
    pub async fn send(
        &self,
        to: &str,
        msg_id: &str,
        payload: impl Into<Bytes>,
    ) -> Result<Sent, Error> {
        valid_name(to)?;
        let subject = self.subject(to);
        let publish_error = |why: String| Error::Publish { subject: subject.clone(), why };
        let message =
            jetstream::message::PublishMessage::build().payload(payload.into()).message_id(msg_id);
        let ack = self
            .js
            .send_publish(subject.clone(), message)
            .await
            .map_err(|e| publish_error(e.to_string()))?
            .await
            .map_err(|e| publish_error(e.to_string()))?;
        Ok(Sent { sequence: ack.sequence, duplicate: ack.duplicate })
    }

    /// This host's inbox: its durable consumer (created on first use, kept by the broker across
    /// restarts of either side), delivering in order from the oldest unacknowledged message.
    pub async fn inbox(&self) -> Result<Inbox, Error> {
        let host = &self.host;
        let subject = format!("flock.{}.inbox.{host}.*", self.swarm);
        let inbox_error = |why: String| Error::Inbox { subject: subject.clone(), why };
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
            // One message in flight per host: JetStream delivers a new message before it
            // redelivers an unacknowledged one, so with more in flight a receiver that died
            // would get m2 before m1 again. Order per host comes first; a window with per-sender
            // sequence numbers is the next step when throughput asks for it.
            max_ack_pending: 1,
            deliver_policy: consumer::DeliverPolicy::All,
            ..Default::default()
        };
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(&durable, config)
            .await
            .map_err(|e| inbox_error(e.to_string()))?;
        let messages = consumer.messages().await.map_err(|e| inbox_error(e.to_string()))?;
        Ok(Inbox { subject, messages })
    }
}

/// A host's inbox, read in order.
pub struct Inbox {
    subject: String,
    messages: consumer::pull::Stream,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("subject", &self.subject).finish_non_exhaustive()
    }
}

impl Inbox {
    /// The next message; `None` when the connection is gone for good.
    pub async fn next(&mut self) -> Option<Result<Delivery, Error>> {
        let subject = self.subject.clone();
        let message = match self.messages.next().await? {
            Ok(m) => m,
            Err(e) => return Some(Err(Error::Inbox { subject, why: e.to_string() })),
        };
        let msg_id = message
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned());
        let Some(msg_id) = msg_id else {
            // Not Flock's: taken off the queue so it cannot block the inbox, and reported.
            let _ = message.ack_with(jetstream::AckKind::Term).await;
            return Some(Err(Error::NoId { subject }));
        };
        let delivered = message.info().map(|i| i.delivered).unwrap_or(1);
        // `flock.<swarm>.inbox.<to>.<from>`: the filter guarantees the shape.
        let from_host = message.subject.rsplit('.').next().unwrap_or_default().to_owned();
        Some(Ok(Delivery {
            msg_id,
            from_host,
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

    /// Takes it off the queue for good without storing it (a message this host refuses: it
    /// would otherwise come back after every `ack_wait`).
    pub async fn refuse(&self) -> Result<(), Error> {
        self.message.ack_with(jetstream::AckKind::Term).await.map_err(|e| Error::Inbox {
            subject: self.message.subject.to_string(),
            why: format!("refuse {}: {e}", self.msg_id),
        })
    }
}
