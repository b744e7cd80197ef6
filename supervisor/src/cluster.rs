//! This host's link to the swarm's other hosts (issue #26, docs/cluster.md): two tasks over
//! `flock-cluster`'s JetStream transport.
//!
//! - **Outbox**: messages the router stored for agents on other hosts wait in this host's SQLite
//!   mailbox (the source of truth). The publisher sends them in the order they were accepted,
//!   each under its message id (`Nats-Msg-Id`), and marks them forwarded once the stream has
//!   stored them. A crash between the two sends them again: the stream and the receiving
//!   store each keep an id once.
//! - **Inbox**: what other hosts sent here comes in batches (a window of 256 in flight) and is
//!   handed to the router ([`RouterMsg::FromHost`]), which checks that the sending host runs the
//!   sender, stores the message (by id: once) and queues it; only then is the stored prefix
//!   acknowledged to the broker. A message the router refuses is logged and
//!   acknowledged with the rest, never stored; one it could not store (or a router that is
//!   stopping) is left unacknowledged with everything after it, and the broker delivers them
//!   again, in order.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, anyhow};
use flock_actors::messages::FromHost;
use flock_actors::store::PendingMessage;
use flock_actors::{RouterMsg, StoreMsg};
use flock_cluster::{Delivery, Link, Options};
use flock_config::SwarmSpec;
use flock_ipc::id::{fmt_id, parse_id};
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, oneshot};

/// How many stored messages the publisher reads at a time.
const BATCH: usize = 256;
/// Longest wait between two attempts after the broker failed.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// A message on the wire between hosts (JSON: the route is already JSON text).
#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    id: String,
    sender: String,
    target: String,
    text: String,
    #[serde(default)]
    route: String,
    enqueued_at: u64,
}

fn encode(m: &PendingMessage) -> Vec<u8> {
    let wire = Wire {
        id: fmt_id(m.id),
        sender: m.sender.clone(),
        target: m.target.clone(),
        text: m.text.clone(),
        route: m.route.clone(),
        enqueued_at: m.enqueued_at,
    };
    serde_json::to_vec(&wire).unwrap_or_default()
}

/// The message a delivery carries, if it is one and its id is the one the broker de-duplicated.
fn decode(d: &Delivery) -> Result<PendingMessage, String> {
    if !d.authentic {
        return Err(
            "it carries no valid MAC made with this swarm's secret: not sent by a host of \
                    this swarm (is `cluster.secret_env` set to the same value on every host?)"
                .into(),
        );
    }
    let wire: Wire =
        serde_json::from_slice(&d.payload).map_err(|e| format!("not a Flock message: {e}"))?;
    let id = parse_id(&wire.id).ok_or_else(|| format!("bad message id `{}`", wire.id))?;
    if wire.id != d.msg_id {
        return Err(format!("its id {} is not its Nats-Msg-Id {}", wire.id, d.msg_id));
    }
    Ok(PendingMessage {
        id,
        sender: wire.sender,
        target: wire.target,
        text: wire.text,
        attempts: 0,
        route: wire.route,
        enqueued_at: wire.enqueued_at,
    })
}

/// Connects this host to the swarm's broker (before anything starts: a swarm across hosts does
/// not start without it).
pub async fn connect(
    spec: &SwarmSpec,
    host: &str,
    secret: Option<flock_llm::Secret>,
) -> Result<Option<Link>> {
    let Some(cluster) = &spec.cluster else { return Ok(None) };
    let options = Options {
        credentials_file: cluster.credentials_file.clone(),
        secret: secret.map(|s| s.expose().as_bytes().to_vec()),
        ..Options::new(&cluster.nats, &spec.name, host)
    };
    let link = Link::connect(&options).await.map_err(|e| anyhow!("cluster: {e}"))?;
    let nats = flock_cluster::redacted(&cluster.nats);
    tracing::info!(host, nats = %nats, "flock: host `{host}` joined swarm `{}` on NATS", spec.name);
    Ok(Some(link))
}

/// Starts the outbox publisher and the inbox reader; they run as long as the process.
pub fn spawn(
    link: Link,
    store: ActorRef<StoreMsg>,
    router: ActorRef<RouterMsg>,
    remote: HashMap<String, String>,
    wake: Arc<Notify>,
) {
    tokio::spawn(publish(link.clone(), store, remote, wake));
    tokio::spawn(receive(link, router));
}

async fn publish(
    link: Link,
    store: ActorRef<StoreMsg>,
    remote: HashMap<String, String>,
    wake: Arc<Notify>,
) {
    let targets: Vec<String> = remote.keys().cloned().collect();
    let mut backoff = Duration::from_millis(50);
    loop {
        let wanted = targets.clone();
        let batch =
            flock_actors::store_actor::with_store(&store, move |s| s.pending_for(&wanted, BATCH))
                .await;
        let batch = match batch {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "flock cluster: cannot read the outbox");
                tokio::time::sleep(MAX_BACKOFF).await;
                continue;
            }
        };
        if batch.is_empty() {
            // Woken by the router when it stores one; the timer is a safety net.
            let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
            continue;
        }
        let mut sent = Vec::with_capacity(batch.len());
        let mut failed = false;
        for m in &batch {
            let Some(host) = remote.get(&m.target) else { continue };
            match link.send(host, &fmt_id(m.id), encode(m)).await {
                Ok(_) => sent.push((m.id, host.clone())),
                Err(e) => {
                    // Stop here: what follows waits, so order per host holds.
                    tracing::warn!(error = %e, to = %host, "flock cluster: send to host `{host}` failed; retrying");
                    failed = true;
                    break;
                }
            }
        }
        if !sent.is_empty() {
            let mark =
                flock_actors::store_actor::with_store(&store, move |s| s.mark_forwarded(&sent))
                    .await;
            if let Err(e) = mark {
                // Sent again later; the ids keep it once.
                tracing::error!(error = %e, "flock cluster: cannot mark messages forwarded");
            }
        }
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        } else {
            backoff = Duration::from_millis(50);
        }
    }
}

async fn receive(link: Link, router: ActorRef<RouterMsg>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let mut inbox = match link.inbox().await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "flock cluster: cannot open this host's inbox; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        while let Some(next) = inbox.next_batch(BATCH).await {
            let batch = match next {
                Ok(b) => b,
                // Opened again, afresh: what the broker holds comes in order from the oldest.
                Err(e) => {
                    tracing::warn!(error = %e, "flock cluster: inbox; opening it again");
                    break;
                }
            };
            match hand_over(&router, &batch).await {
                Handed::All => {}
                // Stopping, or a message that could not be stored: what follows the stored
                // prefix stays unacknowledged and comes again, in order, after `ack_wait`.
                Handed::Stopping => return,
                Handed::Failed => break,
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

enum Handed {
    All,
    Stopping,
    Failed,
}

/// Hands a batch to the router (the store commits it together), then acknowledges the longest
/// prefix of it that is stored or refused.
async fn hand_over(router: &ActorRef<RouterMsg>, batch: &[Delivery]) -> Handed {
    let mut waits = Vec::with_capacity(batch.len());
    for d in batch {
        match decode(d) {
            Ok(msg) => {
                let (tx, rx) = oneshot::channel();
                let ask = RouterMsg::FromHost { host: d.from_host.clone(), msg, reply: tx };
                if router.cast(ask).is_err() {
                    break;
                }
                waits.push(Some(rx));
            }
            Err(why) => {
                refused(d, &why);
                waits.push(None);
            }
        }
    }
    let mut handled = 0;
    let mut outcome = Handed::All;
    for (d, wait) in batch.iter().zip(waits.iter_mut()) {
        let Some(rx) = wait.take() else {
            handled += 1;
            continue;
        };
        match rx.await {
            Ok(FromHost::Stored) => {}
            Ok(FromHost::Refused(why)) => refused(d, &why),
            Ok(FromHost::Failed(why)) => {
                tracing::error!(from = %d.from_host, msg_id = %d.msg_id, "flock cluster: a message from host `{}` was not stored: {why}; it comes again", d.from_host);
                outcome = Handed::Failed;
                break;
            }
            Err(_) => {
                outcome = Handed::Stopping;
                break;
            }
        }
        handled += 1;
    }
    if waits.len() < batch.len() && matches!(outcome, Handed::All) {
        outcome = Handed::Stopping; // the router is gone
    }
    if let Err(e) = flock_cluster::ack_prefix(&batch[..handled]).await {
        // Delivered again; the store keeps each id once.
        tracing::warn!(error = %e, "flock cluster: acknowledge failed");
    }
    outcome
}

/// A message this host will not take: logged, and acknowledged with the rest (never stored).
fn refused(d: &Delivery, why: &str) {
    tracing::warn!(from = %d.from_host, msg_id = %d.msg_id, "flock cluster: refused a message from host `{}`: {why}", d.from_host);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_crosses_as_json_and_must_carry_its_broker_id() {
        let m = PendingMessage {
            id: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
            sender: "c".into(),
            target: "w".into(),
            text: "hello".into(),
            attempts: 3,
            route: "{\"hop\":2}".into(),
            enqueued_at: 7,
        };
        let wire: Wire = serde_json::from_slice(&encode(&m)).unwrap();
        assert_eq!(wire.id, fmt_id(m.id));
        assert_eq!((wire.sender.as_str(), wire.route.as_str()), ("c", "{\"hop\":2}"));
    }
}
