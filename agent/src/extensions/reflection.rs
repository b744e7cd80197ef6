//! The memory roles' text, read by code: the observer's tag (`[high decision]`) and "nothing",
//! the reflection's shape (headings and bullets under its budget, cut to it when the model runs
//! over, refused when degenerate), and the token estimates that size a reflection's batch.

/// Characters per token in the estimates of memory sizes.
pub(super) const CHARS_PER_TOKEN: usize = 4;

/// The estimated tokens of `observations` (their texts, [`CHARS_PER_TOKEN`] characters each).
pub(super) fn estimated_tokens(observations: &[crate::memory::Observation]) -> usize {
    observations.iter().map(|o| o.text.chars().count() / CHARS_PER_TOKEN).sum()
}

/// The observer's way of saying an exchange holds nothing worth remembering.
/// An observation's leading tag, `[high decision]` (priority, then an optional category of
/// `flock_memory::records::CATEGORIES`), and the text after it. No tag, or one that is not
/// recognised: `None` and the whole text.
pub(super) fn observation_tag(reply: &str) -> (Option<(&'static str, &str)>, &str) {
    let trimmed = reply.trim_start();
    let Some((tag, rest)) = trimmed.strip_prefix('[').and_then(|t| t.split_once(']')) else {
        return (None, reply);
    };
    let mut words = tag.split([' ', ',', '/']).filter(|w| !w.is_empty());
    let priority = match words.next().map(str::to_ascii_lowercase).as_deref() {
        Some("high") => "high",
        Some("medium") => "medium",
        Some("low") => "low",
        _ => return (None, reply),
    };
    let category = words
        .next()
        .and_then(|c| flock_memory::records::CATEGORIES.iter().find(|k| k.eq_ignore_ascii_case(c)))
        .copied()
        .unwrap_or("");
    (Some((priority, category)), rest.trim_start())
}

pub use flock_memory::files::degenerate;
pub(super) use flock_memory::files::is_nothing;

/// A reflection cut to the shape its prompt asks for (prompts/roles/reflection.md), whatever the
/// model wrote: at most three items under Patterns and Learned rules, two under Suggestions and
/// Summary (three under a heading it does not know), no item twice, none over
/// [`REFLECTION_LINE_CHARS`] (cut at a word, `…`). A heading is a Markdown heading of any level
/// or a line that is bold alone (`**Patterns**`); an indented sub-item joins its item's line
/// (`1. Migration: moved; backups nightly`) instead of being dropped. What is cut stays in the
/// observations' files, searchable; a small model restates every observation instead of
/// condensing (1.1× on Qwen2.5-Coder 1.5B with the prompt alone). `None` when nothing but
/// headings would be left (then the reflection is refused, like a degenerate one).
pub fn fit_reflection(reply: &str) -> Option<String> {
    // Items: a heading, or a top-level line with its sub-items joined.
    let mut items: Vec<(bool, String)> = Vec::new();
    for line in reply.lines().map(str::trim_end) {
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if let Some(name) = heading(text) {
            items.push((true, name));
            continue;
        }
        let sub = line.starts_with("  ") || line.starts_with('\t');
        match items.last_mut() {
            Some((false, item)) if sub => {
                let part = text.trim_start_matches(['-', '*', '+', '•']).trim();
                let sep = if item.ends_with(':') { " " } else { "; " };
                item.push_str(sep);
                item.push_str(part);
            }
            _ => items.push((false, text.to_owned())),
        }
    }
    let mut out: Vec<String> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    let (mut cap, mut kept, mut content) = (REFLECTION_LINES_UNDER_UNKNOWN, 0, 0);
    for (is_heading, text) in items {
        if is_heading {
            let name = text.trim_matches(|c: char| c == '#' || c == '*' || c == ':' || c == ' ');
            cap = match name.to_lowercase().as_str() {
                "patterns" | "learned rules" => 3,
                "suggestions" | "summary" | "summary of observations" => 2,
                _ => REFLECTION_LINES_UNDER_UNKNOWN,
            };
            kept = 0;
            out.push(format!("### {name}"));
            continue;
        }
        let key: String =
            text.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect();
        if kept >= cap || key.is_empty() || seen.contains(&key) {
            continue;
        }
        seen.push(key);
        kept += 1;
        content += 1;
        out.push(cut_at_word(&text, REFLECTION_LINE_CHARS));
    }
    (content > 0).then(|| out.join("\n"))
}

/// A reflection as it would be written ([`fit_reflection`]), or why it would be refused.
pub(super) fn fit_or_refuse(reply: &str) -> Result<String, &'static str> {
    match degenerate(reply) {
        Some(why) => Err(why),
        None => fit_reflection(reply).ok_or("nothing but headings"),
    }
}

/// The reflection to write, cut to shape, and the answer it was cut from: of the answer and the
/// first draft (when the draft was sent back to be rewritten), the one the model wrote shorter,
/// of those that can be written (so a draft that restated every observation, and would only look
/// short once cut, loses to a real rewrite); why neither can, otherwise.
pub(super) fn settle_reflection<'a>(
    reply: &'a str,
    draft: Option<&'a str>,
) -> Result<(String, &'a str), &'static str> {
    let raw = |t: &str| t.trim().chars().count();
    match (fit_or_refuse(reply), draft.map(|d| (fit_or_refuse(d), d))) {
        (Ok(_), Some((Ok(b), d))) if raw(d) < raw(reply) => Ok((b, d)),
        (Err(_), Some((Ok(b), d))) => Ok((b, d)),
        (answer, _) => answer.map(|a| (a, reply)),
    }
}

/// Why a reflection draft goes back to the model once, as the note that says so: it would be
/// refused (empty, repeating, nothing but headings), or the model wrote more than its budget
/// (measured before [`fit_reflection`] cuts it: a small model restates every observation, and
/// the first three of them would pass for a short reflection). `None`: it may be written.
pub(super) fn reflection_review(draft: &str, budget: usize) -> Option<String> {
    let len = draft.trim().chars().count();
    match fit_or_refuse(draft) {
        Err(why) => Some(format!(
            "[note] Your reflection cannot be written: {why}. Write it again in the shape asked \
             for: what the observations add up to, each line once."
        )),
        Ok(_) if len > budget => Some(format!(
            "[note] Your reflection is {len} characters; the budget is {budget}. Write it again \
             within the budget, in the same shape: one short line per pattern or rule, merge \
             lines that say the same kind of thing, leave out details (the observations keep \
             them, searchable), keep the [high] items."
        )),
        Ok(_) => None,
    }
}

/// The name of a heading line (`## Patterns`, `**Patterns:**`), or `None` for other lines.
pub(super) fn heading(line: &str) -> Option<String> {
    if let Some(h) = line.strip_prefix('#') {
        return Some(h.trim_start_matches('#').trim().to_owned());
    }
    let inner = line
        .strip_prefix("**")?
        .strip_suffix("**")
        .or_else(|| line.strip_prefix("**")?.strip_suffix(':')?.strip_suffix("**"))?;
    (!inner.contains("**") && !inner.trim().is_empty() && inner.len() <= 40)
        .then(|| inner.trim().trim_end_matches(':').to_owned())
}

/// Lines kept under a heading the prompt does not name (or before any heading).
pub(super) const REFLECTION_LINES_UNDER_UNKNOWN: usize = 3;
/// The longest line a reflection keeps.
pub(super) const REFLECTION_LINE_CHARS: usize = 200;

/// `text` cut to at most `max` characters at a word boundary, `…` added when cut.
pub(super) fn cut_at_word(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let head: String = text.chars().take(max.saturating_sub(1)).collect();
    let head = match head.rfind(char::is_whitespace) {
        Some(i) if i > max / 2 => &head[..i],
        _ => head.as_str(),
    };
    format!("{}…", head.trim_end_matches(|c: char| c.is_whitespace() || c == ',' || c == ';'))
}

/// How many times shorter than its observations a reflection should be (the length it is asked
/// for; `scripts/reflection-ratio` measures what a model does).
pub(super) const REFLECTION_COMPRESSION: usize = 5;
/// The most of the unreflected observations one reflection reads, in estimated tokens (their
/// lines): with the prompt (~450), a draft sent back (≤ 512) and the answer (≤ 512) it stays
/// within the embedded model's 4 096-token context.
pub(super) const REFLECTION_BATCH_TOKENS: usize = 2_000;
/// The shortest budget a reflection is given (a few observations still get a whole reflection).
pub(super) const REFLECTION_MIN_CHARS: usize = 200;
