//! The memory roles' text, read by code: the observer's tag (`[high decision]`) and "nothing",
//! the reflection's shape (headings and bullets under its budget, cut to it when the model runs
//! over, refused when degenerate or when it restates the observations — by their words, not by
//! its length —), which `[high]` observations a reflection carries, and the token estimates that
//! size a reflection's batch.

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
/// model wrote: at most three items under Patterns, [`REFLECTION_RULES_MAX`] under Learned rules
/// (one per `[high]` item), two under Suggestions and
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
                "patterns" => 3,
                // One line per [high] item (decisions, preferences): the prompt asks for them.
                "learned rules" | "rules" => REFLECTION_RULES_MAX,
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

/// A reflection as it would be written ([`fit_reflection`]), or why it would be refused:
/// degenerate, nothing but headings, or a restatement of `observations` ([`restates`]).
pub(super) fn fit_or_refuse(reply: &str, observations: &[Observed]) -> Result<String, String> {
    if let Some(why) = degenerate(reply) {
        return Err(why.to_owned());
    }
    let fitted = fit_reflection(reply).ok_or("nothing but headings")?;
    match restates(&fitted, observations) {
        Some(why) => Err(why),
        None => Ok(fitted),
    }
}

/// An observation a reflection reads: its text, and whether the observer tagged it `[high]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Observed {
    pub high: bool,
    pub text: String,
}

/// Words too common to say what a line is about.
const STOP_WORDS: &[&str] = &[
    "the", "and", "for", "that", "this", "with", "from", "was", "were", "are", "has", "have",
    "had", "its", "his", "her", "she", "him", "they", "them", "their", "into", "onto", "but",
    "not", "all", "any", "one", "two", "who", "what", "when", "after", "before", "because",
    "which", "then", "than", "only", "also", "asked", "worker", "agent", "user", "said",
];

/// The words that say what `text` is about: lower case, three letters or more (any number of
/// two digits or more), not a [`STOP_WORDS`] word, a plural `s` dropped.
fn content_words(text: &str) -> std::collections::BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| {
            w.chars().count() >= 3 || (w.len() >= 2 && w.chars().all(|c| c.is_ascii_digit()))
        })
        .map(str::to_lowercase)
        .filter(|w| !STOP_WORDS.contains(&w.as_str()))
        .map(|w| match w.strip_suffix('s') {
            Some(stem) if stem.chars().count() >= 4 && !stem.ends_with('s') => stem.to_owned(),
            _ => w,
        })
        .collect()
}

/// Whether a reflection line is one observation said again: most of the line's words are that
/// observation's, and most of the observation's words are in the line.
fn restates_one(
    line: &std::collections::BTreeSet<String>,
    observation: &std::collections::BTreeSet<String>,
) -> bool {
    let shared = line.intersection(observation).count();
    shared >= 4 && shared * 10 >= line.len() * 7 && shared * 10 >= observation.len() * 6
}

/// Why `fitted` (a reflection cut to shape) is no reflection but the observations said again:
/// at least half its item lines (and two or more) each restate one observation ([`restates_one`])
/// that is not `[high]` (those the prompt asks to keep, a line each). A small model lists the
/// observations instead of condensing; cut to shape, such a list looks short, so it is judged by
/// its words, not its length.
pub(super) fn restates(fitted: &str, observations: &[Observed]) -> Option<String> {
    let seen: Vec<_> =
        observations.iter().filter(|o| !o.high).map(|o| content_words(&o.text)).collect();
    let items: Vec<_> =
        fitted.lines().filter(|l| !l.starts_with("### ")).map(content_words).collect();
    let copies = items.iter().filter(|line| seen.iter().any(|o| restates_one(line, o))).count();
    (copies >= 2 && copies * 2 >= items.len()).then(|| {
        format!(
            "{copies} of its {} lines say an observation again instead of what they add up to",
            items.len()
        )
    })
}

/// For each of `observations`, whether `reflection` carries it: every observation that is not
/// `[high]`, and each `[high]` one that a line of the reflection names — the line has at least
/// three of its words and 35 % of them (its subject and the decision or preference, in other
/// words around them; the prompt asks for a line each). A `[high]` observation a reflection does
/// not carry stays unreflected: it is read again by the next reflection, never lost to one.
pub(super) fn carried(reflection: &str, observations: &[Observed]) -> Vec<bool> {
    let lines: Vec<_> = reflection.lines().map(content_words).collect();
    observations
        .iter()
        .map(|o| {
            if !o.high {
                return true;
            }
            let words = content_words(&o.text);
            lines.iter().any(|line| {
                let shared = words.intersection(line).count();
                shared >= 3 && shared * 100 >= words.len() * 35
            })
        })
        .collect()
}

/// The reflection to write, cut to shape, and the answer it was cut from: of the answer and the
/// first draft (when the draft was sent back to be rewritten), of those that can be written (so a
/// draft that restated every observation, and would only look short once cut, loses to a real
/// rewrite), the one that carries more `[high]` observations ([`carried`]), then the one the
/// model wrote shorter; why neither can, otherwise.
pub(super) fn settle_reflection<'a>(
    reply: &'a str,
    draft: Option<&'a str>,
    observations: &[Observed],
) -> Result<(String, &'a str), String> {
    let raw = |t: &str| t.trim().chars().count();
    let fit = |t: &str| fit_or_refuse(t, observations);
    let highs = |fitted: &str| carried(fitted, observations).iter().filter(|c| **c).count();
    match (fit(reply), draft.map(|d| (fit(d), d))) {
        (Ok(a), Some((Ok(b), d)))
            if (highs(&b), std::cmp::Reverse(raw(d)))
                > (highs(&a), std::cmp::Reverse(raw(reply))) =>
        {
            Ok((b, d))
        }
        (Err(_), Some((Ok(b), d))) => Ok((b, d)),
        (answer, _) => answer.map(|a| (a, reply)),
    }
}

/// Why a reflection draft goes back to the model once, as the note that says so: it would be
/// refused (empty, repeating, nothing but headings, the observations said again), it leaves out
/// `[high]` observations (named in the note), or the model wrote more than its budget (measured
/// before [`fit_reflection`] cuts it: a small model restates every observation, and the first
/// three of them would pass for a short reflection). `None`: it may be written.
pub(super) fn reflection_review(
    draft: &str,
    budget: usize,
    observations: &[Observed],
) -> Option<String> {
    let len = draft.trim().chars().count();
    let fitted = fit_or_refuse(draft, observations);
    let dropped: Vec<String> = match &fitted {
        Ok(f) => carried(f, observations)
            .iter()
            .zip(observations)
            .filter(|(kept, _)| !**kept)
            .map(|(_, o)| format!("- {}", cut_at_word(&o.text, 120)))
            .collect(),
        Err(_) => Vec::new(),
    };
    match fitted {
        Err(why) => Some(format!(
            "[note] Your reflection cannot be written: {why}. Write it again in the shape asked \
             for: what the observations add up to, each line once."
        )),
        Ok(_) if !dropped.is_empty() => Some(format!(
            "[note] Your reflection leaves out {} [high] items; a reflection keeps every one of \
             them (a short line each, in your words). Write it again, within {budget} \
             characters, with these too:\n{}",
            dropped.len(),
            dropped.join("\n")
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

/// Lines kept under Learned rules: one per `[high]` item of a batch (11 in the 45 of the
/// bench's fixture), so the cut never drops one the model kept.
pub(super) const REFLECTION_RULES_MAX: usize = 12;
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
