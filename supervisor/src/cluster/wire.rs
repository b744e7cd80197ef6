//! Messages between hosts on the wire: the messages one host sends another in a row, in the
//! order they were accepted, travel as **one stream entry** (a JSON array) — one publish and one
//! broker round trip for a burst instead of one per message. Order per pair of hosts holds as
//! before (one entry in flight, entries in order); once holds by the messages' own ids (the
//! receiving store keeps each once, whatever entry brought it).
//!
//! An entry's broker id (`Nats-Msg-Id`) is its first message's id, and `+N` when it carries N > 1
//! (an entry sent again after a failure starts at the same message; if it carries more than the
//! first try, the broker stores both, and the receiver keeps each message once).

use flock_actors::store::PendingMessage;
use flock_cluster::Delivery;
use flock_ipc::id::{MsgId, fmt_id, parse_id};
use serde::{Deserialize, Serialize};

/// At most this many messages in one entry.
pub const MAX_MESSAGES: usize = 64;
/// An entry stops growing past this many bytes of text (a larger message travels alone):
/// well under NATS's default 1 MiB payload.
pub const MAX_BYTES: usize = 256 * 1024;

/// One message on the wire (JSON: the route is already JSON text).
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

/// Messages for one host, in the order accepted: one stream entry.
#[derive(Debug)]
pub struct Entry<'a> {
    pub host: String,
    pub messages: Vec<&'a PendingMessage>,
}

impl Entry<'_> {
    /// The entry's broker id: its first message's id, `+N` when it carries N > 1.
    pub fn id(&self) -> String {
        let ids: Vec<MsgId> = self.messages.iter().map(|m| m.id).collect();
        entry_id(&ids)
    }

    /// Its payload: the messages as a JSON array.
    pub fn payload(&self) -> Vec<u8> {
        let wires: Vec<Wire> = self
            .messages
            .iter()
            .map(|m| Wire {
                id: fmt_id(m.id),
                sender: m.sender.clone(),
                target: m.target.clone(),
                text: m.text.clone(),
                route: m.route.clone(),
                enqueued_at: m.enqueued_at,
            })
            .collect();
        serde_json::to_vec(&wires).unwrap_or_default()
    }

    /// `(id, host)` of each message, for `Store::mark_forwarded`.
    pub fn sent(&self) -> impl Iterator<Item = (MsgId, String)> + '_ {
        self.messages.iter().map(|m| (m.id, self.host.clone()))
    }
}

fn entry_id(ids: &[MsgId]) -> String {
    match ids {
        [] => String::new(),
        [one] => fmt_id(*one),
        [first, ..] => format!("{}+{}", fmt_id(*first), ids.len()),
    }
}

/// `pending` (in the order accepted) as entries: for each host (`host_of` a message's target,
/// `None`: not sent), its messages in order, cut at [`MAX_MESSAGES`] / [`MAX_BYTES`]. Entries
/// for one host come in the order of their messages.
pub fn entries<'a>(
    pending: &'a [PendingMessage],
    host_of: impl Fn(&str) -> Option<String>,
) -> Vec<Entry<'a>> {
    let mut out: Vec<Entry<'a>> = Vec::new();
    // Per host: the index in `out` of its entry still growing, and that entry's bytes.
    let mut open: std::collections::HashMap<String, (usize, usize)> = Default::default();
    for m in pending {
        let Some(host) = host_of(&m.target) else { continue };
        let bytes = m.text.len() + m.route.len();
        match open.get_mut(&host) {
            Some((i, size))
                if out[*i].messages.len() < MAX_MESSAGES && *size + bytes <= MAX_BYTES =>
            {
                out[*i].messages.push(m);
                *size += bytes;
            }
            _ => {
                open.insert(host.clone(), (out.len(), bytes));
                out.push(Entry { host, messages: vec![m] });
            }
        }
    }
    out
}

/// The messages a delivery carries, if it is an entry of this swarm and its id is the one the
/// broker de-duplicated (or, from this host `me` itself, that id handed over:
/// [`super::takeover::hand_over`]).
pub fn decode(d: &Delivery, me: &str) -> Result<Vec<PendingMessage>, String> {
    decode_parts(
        &Sent { msg_id: &d.msg_id, from_host: &d.from_host, authentic: d.authentic },
        &d.payload,
        me,
    )
}

/// What [`decode`] reads of a delivery besides its payload.
struct Sent<'a> {
    msg_id: &'a str,
    from_host: &'a str,
    authentic: bool,
}

fn decode_parts(d: &Sent<'_>, payload: &[u8], me: &str) -> Result<Vec<PendingMessage>, String> {
    if !d.authentic {
        return Err("it carries no valid MAC made with this swarm's secret: not sent by a host \
                    of this swarm (is `cluster.secret_env` set to the same value on every host?)"
            .into());
    }
    let wires: Vec<Wire> =
        serde_json::from_slice(payload).map_err(|e| format!("not Flock messages: {e}"))?;
    let mut ids = Vec::with_capacity(wires.len());
    for w in &wires {
        ids.push(parse_id(&w.id).ok_or_else(|| format!("bad message id `{}`", w.id))?);
    }
    let expected = entry_id(&ids);
    if expected.is_empty() {
        return Err("an entry without messages".into());
    }
    let handed = d.from_host == me
        && d.msg_id.strip_suffix(crate::cluster::takeover::HANDED) == Some(expected.as_str());
    if expected != d.msg_id && !handed {
        return Err(format!("its messages' id {expected} is not its Nats-Msg-Id {}", d.msg_id));
    }
    Ok(wires
        .into_iter()
        .zip(ids)
        .map(|(w, id)| PendingMessage {
            id,
            sender: w.sender,
            target: w.target,
            text: w.text,
            attempts: 0,
            route: w.route,
            enqueued_at: w.enqueued_at,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: MsgId, target: &str, text: &str) -> PendingMessage {
        PendingMessage {
            id,
            sender: "c".into(),
            target: target.into(),
            text: text.into(),
            attempts: 3,
            route: "{\"hop\":2}".into(),
            enqueued_at: 7,
        }
    }

    #[test]
    fn messages_for_one_host_go_together_in_order_and_a_large_one_alone() {
        let big = "x".repeat(MAX_BYTES);
        let pending = vec![
            message(1, "w", "a"),
            message(2, "far", "b"),
            message(3, "w", "c"),
            message(4, "w", &big),
            message(5, "w", "d"),
            message(6, "local", "e"),
        ];
        let host_of = |t: &str| match t {
            "w" => Some("gpu".to_owned()),
            "far" => Some("edge".to_owned()),
            _ => None,
        };
        let got: Vec<(String, Vec<MsgId>)> = entries(&pending, host_of)
            .iter()
            .map(|e| (e.host.clone(), e.messages.iter().map(|m| m.id).collect()))
            .collect();
        assert_eq!(
            got,
            [
                ("gpu".to_owned(), vec![1, 3]),
                ("edge".to_owned(), vec![2]),
                ("gpu".to_owned(), vec![4]),
                ("gpu".to_owned(), vec![5]),
            ]
        );
        let many: Vec<PendingMessage> =
            (0..MAX_MESSAGES as MsgId + 1).map(|i| message(i + 1, "w", "m")).collect();
        let cut = entries(&many, host_of);
        assert_eq!((cut.len(), cut[0].messages.len(), cut[1].messages.len()), (2, MAX_MESSAGES, 1));
        assert_eq!(cut[0].id(), format!("{}+{MAX_MESSAGES}", fmt_id(1)));
        assert_eq!(cut[1].id(), fmt_id(MAX_MESSAGES as MsgId + 1));
    }

    fn decode_as(
        entry: &Entry<'_>,
        msg_id: &str,
        from_host: &str,
        authentic: bool,
    ) -> Result<Vec<PendingMessage>, String> {
        decode_parts(&Sent { msg_id, from_host, authentic }, &entry.payload(), "gpu")
    }

    #[test]
    fn an_entry_crosses_as_json_and_must_carry_its_broker_id() {
        let pending = vec![message(0x0123_4567_89ab_cdef, "w", "hello"), message(9, "w", "two")];
        let all = entries(&pending, |_| Some("gpu".into()));
        let entry = &all[0];
        let got = decode_as(entry, &entry.id(), "main", true).unwrap();
        assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), [0x0123_4567_89ab_cdef, 9]);
        assert_eq!((got[0].text.as_str(), got[0].route.as_str()), ("hello", "{\"hop\":2}"));
        // Another id, a forged one, or a hand-over from another host: refused.
        let other = decode_as(entry, &fmt_id(9), "main", true).unwrap_err();
        assert!(other.contains("is not its Nats-Msg-Id"), "{other}");
        assert!(decode_as(entry, &entry.id(), "main", false).is_err());
        let handed = format!("{}{}", entry.id(), crate::cluster::takeover::HANDED);
        assert!(decode_as(entry, &handed, "main", true).is_err());
        assert_eq!(decode_as(entry, &handed, "gpu", true).unwrap().len(), 2);
    }
}
