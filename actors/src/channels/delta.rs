//! Pure channel logic: delta notification text, `@mention` matching, channel ids. No I/O, so every
//! rule is pinned by a unit test.

pub use flock_ipc::channel::mentions;
use flock_ipc::channel::{END_NEW_MESSAGES, NEW_MESSAGES, SEQ};

/// At most this many messages in one notification.
pub const DELTA_MAX_MESSAGES: usize = 20;
/// Each message is cut to this many characters in a notification.
pub const DELTA_MAX_CHARS: usize = 400;

/// One channel message as a notification shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    pub seq: u64,
    pub author: String,
    pub text: String,
}

/// Renders the notification for `messages` (ascending seq, all new to the reader).
/// Keeps the *newest* [`DELTA_MAX_MESSAGES`] and points at `flock_channel_read` for the rest.
pub fn render(channel: &str, name: &str, topic: &str, messages: &[Msg]) -> String {
    let Some(first) = messages.first() else { return render_page(channel, name, topic, 0, 0, &[]) };
    let newest = &messages[messages.len().saturating_sub(DELTA_MAX_MESSAGES)..];
    render_page(channel, name, topic, first.seq, messages.len(), newest)
}

/// Renders a notification from its newest page: `total` new messages starting at `first_seq`,
/// of which `newest` (ascending, at most [`DELTA_MAX_MESSAGES`]) are shown.
pub fn render_page(
    channel: &str,
    name: &str,
    topic: &str,
    first_seq: u64,
    total: usize,
    newest: &[Msg],
) -> String {
    let mut out = String::new();
    let title =
        if name.is_empty() || name == channel { String::new() } else { format!(" ({name})") };
    out.push_str(&format!("[Channel: #{channel}]{title}\n"));
    if !topic.is_empty() {
        out.push_str(&format!("Topic: {topic}\n"));
    }
    let Some(last) = newest.last() else {
        return out;
    };
    let skipped = total.saturating_sub(newest.len());
    out.push_str(&format!("New messages: seq {first_seq}..{} ({total})\n", last.seq));
    if skipped > 0 {
        out.push_str(&format!(
            "({skipped} older new messages not shown: flock_channel_read(channel=\"{channel}\", after={}))\n",
            first_seq.saturating_sub(1)
        ));
    }
    out.push_str(NEW_MESSAGES);
    out.push('\n');
    let mut cut = false;
    for m in newest {
        let chars = m.text.chars().count();
        let text: String = m.text.chars().take(DELTA_MAX_CHARS).collect();
        // A cut message keeps its @mentions: whoever it hands over to learns it (a hand-over
        // often ends a long post).
        let ellipsis = if chars > DELTA_MAX_CHARS {
            cut = true;
            let shown = mentions(&text);
            let hidden: Vec<String> =
                mentions(&m.text).into_iter().filter(|n| !shown.contains(n)).collect();
            if hidden.is_empty() {
                "…".to_owned()
            } else {
                let named: Vec<String> = hidden.iter().map(|n| format!("@{n}")).collect();
                format!("… (mentions {})", named.join(" "))
            }
        } else {
            String::new()
        };
        out.push_str(&format!("{SEQ}{}] {}: {text}{ellipsis}\n", m.seq, m.author));
    }
    out.push_str(END_NEW_MESSAGES);
    out.push('\n');
    if cut {
        out.push_str("(long messages were cut to 400 characters)\n");
    }
    out.push_str(&format!("Full history: flock_channel_read(channel=\"{channel}\")"));
    out
}

/// `[a-z0-9][a-z0-9-]{0,62}` (DESIGN.md §8).
pub fn valid_channel_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

/// Accepts `#name` or `name`.
pub fn strip_hash(channel: &str) -> &str {
    channel.strip_prefix('#').unwrap_or(channel)
}

/// The channel id of the DM between two participants: order-independent.
pub fn dm_channel_id(a: &str, b: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' })
            .collect()
    };
    let (x, y) = if a <= b { (a, b) } else { (b, a) };
    let mut id = format!("{}{}--{}", flock_ipc::channel::DM_PREFIX, clean(x), clean(y));
    id.truncate(63);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(n: u64, len: usize) -> Vec<Msg> {
        (1..=n).map(|seq| Msg { seq, author: "pm".into(), text: "x".repeat(len) }).collect()
    }

    #[test]
    fn delta_names_channel_and_topic_and_lists_new_messages() {
        let m = vec![
            Msg { seq: 15, author: "pm".into(), text: "roadmap draft".into() },
            Msg { seq: 16, author: "human:alice".into(), text: "scope?".into() },
        ];
        let d = render("project-logging", "project-logging", "Structured logging", &m);
        assert!(d.starts_with("[Channel: #project-logging]\nTopic: Structured logging\n"));
        assert!(d.contains("New messages: seq 15..16 (2)"));
        assert!(d.contains("[seq 16] human:alice: scope?"));
        assert!(d.ends_with("Full history: flock_channel_read(channel=\"project-logging\")"));
    }

    #[test]
    fn delta_caps_at_twenty_newest_messages_with_a_read_pointer() {
        let d = render("c", "c", "", &msgs(45, 5));
        assert_eq!(d.matches("[seq ").count(), 20);
        assert!(d.contains("[seq 26]") && d.contains("[seq 45]") && !d.contains("[seq 25]"));
        assert!(d.contains(
            "25 older new messages not shown: flock_channel_read(channel=\"c\", after=0)"
        ));
    }

    #[test]
    fn delta_cuts_each_message_at_400_chars() {
        let d = render("c", "c", "", &msgs(1, 1000));
        let line = d.lines().find(|l| l.starts_with("[seq 1]")).unwrap();
        assert_eq!(line.chars().filter(|c| *c == 'x').count(), 400);
        assert!(line.ends_with('…'));
        assert!(d.contains("cut to 400 characters"));
    }

    #[test]
    fn a_cut_message_keeps_the_mentions_it_lost() {
        let long = format!("{} over to you @dev, cc @qa", "plan ".repeat(100));
        let d = render("p", "p", "", &[Msg { seq: 1, author: "pm".into(), text: long }]);
        let line = d.lines().find(|l| l.starts_with("[seq 1]")).expect("the message");
        assert!(line.ends_with("… (mentions @dev @qa)"), "{line}");
        assert_eq!(mentions(line), ["dev", "qa"]);
    }

    #[test]
    fn channel_ids_follow_the_pattern() {
        assert!(valid_channel_id("project-login"));
        assert!(valid_channel_id("0"));
        assert!(!valid_channel_id("-x") && !valid_channel_id("Upper") && !valid_channel_id(""));
        assert!(!valid_channel_id(&"a".repeat(64)));
        assert_eq!(
            dm_channel_id("worker-2", "human:alice"),
            dm_channel_id("human:alice", "worker-2")
        );
        assert!(valid_channel_id(&dm_channel_id("worker-2", "human:alice")));
    }
}
