//! The text contract of channel notifications, shared by the channels actor that writes them and
//! the agent runtime that reads them: the delta's markers, `@mention` matching, the archive
//! notice. Pure text; no I/O.

/// The line before a notification's new messages.
pub const NEW_MESSAGES: &str = "--- New Messages ---";
/// The line after them.
pub const END_NEW_MESSAGES: &str = "--- End New Messages ---";
/// How each new message starts: `[seq N] author: text`.
pub const SEQ: &str = "[seq ";
/// How the id of a direct-message channel (two members) starts.
pub const DM_PREFIX: &str = "dm-";
/// How the notice that starts a channel's archive starts.
pub const ARCHIVE_NOTICE: &str = "[archive] ";
/// How the notice that a channel went quiet starts (`channels.quiet_secs`); it @mentions the
/// channel's opener and is posted by [`SYSTEM_AUTHOR`].
pub const QUIET_NOTICE: &str = "[quiet] ";
/// The author of the notices Flock itself posts.
pub const SYSTEM_AUTHOR: &str = "flock";

/// One message of a notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post<'a> {
    pub seq: u64,
    pub author: &'a str,
    /// Its text as the notification shows it (lines after the first included).
    pub text: String,
}

/// The new messages a notification carries, in order. A message's later lines (a post may hold
/// several) belong to it; text outside the markers is not a message.
pub fn posts(notification: &str) -> Vec<Post<'_>> {
    let mut out: Vec<Post<'_>> = Vec::new();
    let mut inside = false;
    for line in notification.lines() {
        if line == NEW_MESSAGES {
            inside = true;
            continue;
        }
        if line == END_NEW_MESSAGES {
            break;
        }
        if !inside {
            continue;
        }
        let head = line.strip_prefix(SEQ).and_then(|rest| {
            let (seq, rest) = rest.split_once("] ")?;
            let (author, text) = rest.split_once(": ")?;
            Some(Post { seq: seq.parse().ok()?, author, text: text.to_owned() })
        });
        match (head, out.last_mut()) {
            (Some(post), _) => out.push(post),
            (None, Some(last)) => {
                last.text.push('\n');
                last.text.push_str(line);
            }
            (None, None) => {}
        }
    }
    out
}

/// Agent ids mentioned as `@id` in `text`: an exact token, case-insensitive (`@dev` does not
/// mention `dev-code`, and `me@dev` is an address, not a mention). Lowercased, deduplicated.
pub fn mentions(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let is_id = |b: u8| b.is_ascii_alphanumeric() || b == b'-';
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'@' && (i == 0 || !(is_id(bytes[i - 1]) || bytes[i - 1] == b'@')) {
            let start = i + 1;
            let mut end = start;
            while end < bytes.len() && is_id(bytes[end]) {
                end += 1;
            }
            // A trailing '-' is punctuation ("@dev-"), not part of the id.
            let mut id_end = end;
            while id_end > start && bytes[id_end - 1] == b'-' {
                id_end -= 1;
            }
            if id_end > start {
                let id = text[start..id_end].to_ascii_lowercase();
                if !out.contains(&id) {
                    out.push(id);
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_are_exact_tokens_case_insensitive() {
        assert_eq!(mentions("@dev please look"), ["dev"]);
        assert_eq!(mentions("@Dev-Code, and @dev."), ["dev-code", "dev"]);
        assert!(mentions("mail me@dev.example").is_empty());
        assert_eq!(mentions("(@qa) @qa @QA"), ["qa"]);
        assert_eq!(mentions("@dev- done"), ["dev"]);
        assert!(mentions("@ alone @@").is_empty());
    }

    #[test]
    fn posts_are_read_back_with_their_later_lines() {
        let n = "[Channel: #p]\nTopic: t\nNew messages: seq 3..4 (2)\n--- New Messages ---\n\
                 [seq 3] pm: Plan: one\ntwo: with a colon\n[seq 4] human:alice: ok @dev\n\
                 --- End New Messages ---\nFull history: flock_channel_read(channel=\"p\")";
        let p = posts(n);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(
            (p[0].seq, p[0].author, p[0].text.as_str()),
            (3, "pm", "Plan: one\ntwo: with a colon")
        );
        assert_eq!((p[1].author, p[1].text.as_str()), ("human:alice", "ok @dev"));
        assert!(posts("no markers [seq 1] a: b").is_empty());
    }
}
