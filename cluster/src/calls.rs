//! Requests between hosts: NATS core request–reply, at most once — what a request is on one
//! host (it lives in the routers' memory, never in a store; a caller that does not hear back in
//! time gets a timeout).
//!
//! A host's calls come in on `flock.<swarm>.call.<to>.<from>` (the calling host in the subject,
//! where the broker's permissions can pin it, as for messages); a call carries the MAC of the
//! swarm's secret over its calling host, `call:<id>` and its bytes, the answer the MAC over the
//! answering host, `answer:<id>` and its bytes — a caller takes an answer only from the host it
//! asked. A caller that stops waiting tells the host (`cancel:<id>`, same subject, header
//! [`KIND_HEADER`]), which cancels the callee's turn.

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;

use crate::{Error, Link, MAC_HEADER, mac, valid_name, verify};

/// The header saying what a message on a call subject is: `call` or `cancel`.
const KIND_HEADER: &str = "Flock-Kind";
/// The header carrying the call's id.
const ID_HEADER: &str = "Flock-Call";

/// The MAC a call, cancel or answer carries.
fn tag(headers: Option<&HeaderMap>) -> Option<&str> {
    headers.and_then(|h| h.get(MAC_HEADER)).map(|t| t.as_str())
}

impl Link {
    /// The subject of host `to`'s calls from this host.
    fn call_subject(&self, to: &str) -> String {
        format!("flock.{}.call.{to}.{}", self.swarm, self.host)
    }

    fn call_error(&self, to: &str, why: String) -> Error {
        Error::Call { host: to.to_owned(), why }
    }

    /// Asks host `to` (call `id`, `payload`) and waits up to `timeout` for its answer, which must
    /// carry that host's MAC.
    pub async fn call(
        &self,
        to: &str,
        id: &str,
        payload: impl Into<Bytes>,
        timeout: Duration,
    ) -> Result<Bytes, Error> {
        valid_name(to)?;
        let payload = payload.into();
        let mut headers = HeaderMap::new();
        headers.insert(KIND_HEADER, "call");
        headers.insert(ID_HEADER, id);
        if let Some(tag) = mac(self.key.as_ref(), &self.host, &format!("call:{id}"), &payload) {
            headers.insert(MAC_HEADER, tag.as_str());
        }
        let request =
            async_nats::Request::new().headers(headers).payload(payload).timeout(Some(timeout));
        let answer = self
            .js
            .client()
            .send_request(self.call_subject(to), request)
            .await
            .map_err(|e| self.call_error(to, e.to_string()))?;
        let what = format!("answer:{id}");
        if !verify(self.key.as_ref(), tag(answer.headers.as_ref()), to, &what, &answer.payload) {
            return Err(self.call_error(to, "its answer carries no valid MAC".into()));
        }
        Ok(answer.payload)
    }

    /// Tells host `to` that nobody waits for call `id` any more.
    pub async fn cancel(&self, to: &str, id: &str) -> Result<(), Error> {
        valid_name(to)?;
        let mut headers = HeaderMap::new();
        headers.insert(KIND_HEADER, "cancel");
        headers.insert(ID_HEADER, id);
        if let Some(tag) = mac(self.key.as_ref(), &self.host, &format!("cancel:{id}"), b"") {
            headers.insert(MAC_HEADER, tag.as_str());
        }
        self.js
            .client()
            .publish_with_headers(self.call_subject(to), headers, Bytes::new())
            .await
            .map_err(|e| self.call_error(to, e.to_string()))
    }

    /// This host's incoming calls and cancels.
    pub async fn calls(&self) -> Result<Calls, Error> {
        let subject = format!("flock.{}.call.{}.*", self.swarm, self.host);
        let subscriber = self
            .js
            .client()
            .subscribe(subject.clone())
            .await
            .map_err(|e| self.call_error(&self.host, e.to_string()))?;
        // A flush only writes the SUB to the socket; a round trip on the same connection (the
        // broker reads it in order) makes sure the broker holds the subscription before this
        // returns, so a call another host makes after it is heard, not refused for "no
        // responders". The swarm's stream's info is one every host's NATS user may ask for
        // (`$JS.API.>`, docs/cluster.md).
        self.js
            .get_stream(&self.stream)
            .await
            .map_err(|e| self.call_error(&self.host, e.to_string()))?;
        Ok(Calls { subscriber, link: self.clone() })
    }
}

/// A host's incoming calls ([`Link::calls`]).
pub struct Calls {
    subscriber: async_nats::Subscriber,
    link: Link,
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls").finish_non_exhaustive()
    }
}

impl Calls {
    /// The next call or cancel; `None` once the connection is gone for good.
    pub async fn next(&mut self) -> Option<Call> {
        let message = self.subscriber.next().await?;
        // `flock.<swarm>.call.<to>.<from>`: the subscription guarantees the shape.
        let from_host = message.subject.rsplit('.').next().unwrap_or_default().to_owned();
        let header = |name: &str| {
            message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().to_owned())
        };
        let id = header(ID_HEADER).unwrap_or_default();
        let cancel = header(KIND_HEADER).as_deref() == Some("cancel");
        let what = format!("{}:{id}", if cancel { "cancel" } else { "call" });
        let key = self.link.key.as_ref();
        let authentic =
            verify(key, tag(message.headers.as_ref()), &from_host, &what, &message.payload);
        Some(Call {
            id,
            from_host,
            authentic,
            cancel,
            payload: message.payload,
            reply: message.reply,
            link: self.link.clone(),
        })
    }
}

/// One call (or cancel) from another host.
pub struct Call {
    /// The call's id (the request's message id on the calling host).
    pub id: String,
    /// The calling host, from the subject (which the broker's permissions can pin).
    pub from_host: String,
    /// It carries a valid MAC of the swarm's secret (always `true` without a secret). Refuse it
    /// otherwise.
    pub authentic: bool,
    /// The caller stopped waiting for call `id`.
    pub cancel: bool,
    pub payload: Bytes,
    reply: Option<async_nats::Subject>,
    link: Link,
}

impl std::fmt::Debug for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("id", &self.id)
            .field("from_host", &self.from_host)
            .field("authentic", &self.authentic)
            .field("cancel", &self.cancel)
            .finish_non_exhaustive()
    }
}

impl Call {
    /// Answers the call (with this host's MAC); nothing to answer for a cancel.
    pub async fn answer(&self, payload: Bytes) -> Result<(), Error> {
        let Some(reply) = &self.reply else { return Ok(()) };
        let mut headers = HeaderMap::new();
        let me = &self.link.host;
        if let Some(tag) = mac(self.link.key.as_ref(), me, &format!("answer:{}", self.id), &payload)
        {
            headers.insert(MAC_HEADER, tag.as_str());
        }
        self.link
            .js
            .client()
            .publish_with_headers(reply.clone(), headers, payload)
            .await
            .map_err(|e| self.link.call_error(&self.from_host, e.to_string()))
    }
}
