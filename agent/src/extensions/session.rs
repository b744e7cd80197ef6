//! A stored session's shape: the window of messages kept, where a loaded session resumes, and
//! compaction into one summary (the current input is never compacted: it is not in the session
//! yet).

use super::SUMMARY_TAG;
use crate::provider::ChatMessage;

/// Keeps the last `max` messages, starting at a user message or a summary.
pub fn window(session: &mut Vec<ChatMessage>, max: usize) {
    let excess = session.len().saturating_sub(max);
    session.drain(..excess);
    let start = session.iter().position(is_start).unwrap_or(session.len());
    session.drain(..start);
}

/// Where a stored session may begin: a user message, or a compaction summary (which replaced
/// everything before it).
pub(super) fn is_start(m: &ChatMessage) -> bool {
    match m {
        ChatMessage::User { .. } => true,
        ChatMessage::System { text } => text.starts_with(SUMMARY_TAG),
        _ => false,
    }
}

/// A loaded session resumes at its last compaction summary, if it has one.
pub fn resume_point(session: &mut Vec<ChatMessage>) {
    if let Some(i) = session
        .iter()
        .rposition(|m| matches!(m, ChatMessage::System { text } if text.starts_with(SUMMARY_TAG)))
    {
        session.drain(..i);
    }
}

pub(crate) fn chars_of(m: &ChatMessage) -> usize {
    match m {
        ChatMessage::System { text }
        | ChatMessage::Assistant { text }
        | ChatMessage::User { text, .. } => text.len(),
        ChatMessage::ToolCall { arguments, .. } => arguments.len(),
        ChatMessage::ToolResult { content, .. } => content.len(),
    }
}

/// Past `max_messages` or `max_chars`, replaces all but the last `keep` messages (moved back to
/// a user message so no tool result loses its call) by one summary. Returns how many messages
/// were summarised. Only the stored session is compacted: the current input is never in it.
pub fn compact(
    session: &mut Vec<ChatMessage>,
    max_messages: usize,
    max_chars: usize,
    keep: usize,
) -> Option<usize> {
    let chars: usize = session.iter().map(chars_of).sum();
    if session.len() <= max_messages && chars <= max_chars {
        return None;
    }
    // The kept part starts at a user message, so no tool result loses its call: the first one
    // within the last `keep` messages, else the last one before them.
    let is_user = |m: &ChatMessage| matches!(m, ChatMessage::User { .. });
    let from = session.len().saturating_sub(keep);
    let cut = match session[from..].iter().position(is_user) {
        Some(i) => from + i,
        None => session[..from].iter().rposition(is_user)?,
    };
    if cut == 0 {
        return None;
    }
    let old: Vec<ChatMessage> = session.drain(..cut).collect();
    let mut lines = Vec::new();
    for m in &old {
        let line = match m {
            ChatMessage::System { text } if text.starts_with(SUMMARY_TAG) => {
                text[SUMMARY_TAG.len()..].trim().to_owned()
            }
            ChatMessage::System { .. } => continue,
            ChatMessage::User { from, text, .. } => format!("- {from}: {}", clip(text, 160)),
            ChatMessage::Assistant { text } => format!("- (me): {}", clip(text, 160)),
            ChatMessage::ToolCall { name, arguments, .. } => {
                format!("- (me) called {name} {}", clip(arguments, 80))
            }
            ChatMessage::ToolResult { name, ok, content, .. } => {
                format!("- {name} {}: {}", if *ok { "→" } else { "failed:" }, clip(content, 80))
            }
        };
        lines.push(line);
    }
    // The summary itself stays bounded: the oldest lines go first.
    let mut text = lines.join("\n");
    let budget = max_chars / 4;
    if text.len() > budget {
        let skip = text.len() - budget;
        let at = text.char_indices().map(|(i, _)| i).find(|i| *i >= skip).unwrap_or(text.len());
        text = format!("…{}", &text[at..]);
    }
    session.insert(
        0,
        ChatMessage::System {
            text: format!("{SUMMARY_TAG} {} earlier messages, in short:\n{text}", old.len()),
        },
    );
    Some(old.len())
}

pub(super) fn clip(s: &str, n: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= n {
        flat
    } else {
        format!("{}…", flat.chars().take(n).collect::<String>())
    }
}
