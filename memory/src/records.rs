//! The memory files, read as records. The formats are the brain-persona ones the agents write
//! (`flock-agent`'s `memory.rs`):
//!
//! - `journals/YYYY-MM-DD.md`: one line per worker turn, `HH:MM | request | done | result`
//! - `observations/YYYY-MM-DD.md`: `## HH:MM`, the text, `<!-- id: … -->`, optionally
//!   `<!-- priority: high; category: decision -->` and `<!-- reflected: … -->`, then `---`
//! - `reflections/YYYY-MM-DD.md`: `## Reflection - HH:MM`, the text, `---`
//! - `knowledge/<topic>.md`: `# Topic`, sections (`## …`), `Last updated: YYYY-MM-DD HH:MM`
//!
//! Every record has an id that stays the same when the file is read again: the observation's
//! own id, else `<file>#<n>` (the files only grow by appends, knowledge by merges at the end).

use std::path::Path;

/// The folders of the memory dir that hold records, in the order they are read.
pub const FOLDERS: [&str; 4] = ["journals", "observations", "reflections", "knowledge"];

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Journal,
    Observation,
    Reflection,
    Knowledge,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Journal => "journal",
            Kind::Observation => "observation",
            Kind::Reflection => "reflection",
            Kind::Knowledge => "knowledge",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "journal" | "journals" => Kind::Journal,
            "observation" | "observations" => Kind::Observation,
            "reflection" | "reflections" => Kind::Reflection,
            "knowledge" => Kind::Knowledge,
            _ => return None,
        })
    }
}

/// How much a record matters (observations carry it; others are `Medium`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Priority {
    Low = 0,
    Medium = 1,
    High = 2,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Medium => "medium",
            Priority::High => "high",
        }
    }

    pub fn parse(s: &str) -> Option<Priority> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "low" => Priority::Low,
            "medium" => Priority::Medium,
            "high" => Priority::High,
            _ => return None,
        })
    }

    pub fn from_level(level: i64) -> Priority {
        match level {
            ..=0 => Priority::Low,
            1 => Priority::Medium,
            _ => Priority::High,
        }
    }
}

/// Categories an observation may carry (the PRD's set).
pub const CATEGORIES: &[&str] =
    &["state", "decision", "preference", "task", "fact", "event", "relationship", "skill"];

/// One memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: String,
    pub kind: Kind,
    /// `YYYY-MM-DD` (from the file name, or a knowledge file's `Last updated:`; empty if none).
    pub date: String,
    /// `HH:MM`, empty if none.
    pub time: String,
    pub priority: Priority,
    /// One of [`CATEGORIES`], empty if none.
    pub category: String,
    /// The agent whose work it records (a journal line's writer, an observation's subject),
    /// empty if none (reflections, knowledge, older entries).
    pub agent: String,
    /// The file, relative to the memory dir (`observations/2026-11-25.md`; its tier's folder
    /// first when it is not hot: `warm/observations/2026-08-25.md`).
    pub path: String,
    pub text: String,
}

/// The records of one file. `rel` is its path relative to the memory dir (`folder/name.md`, or
/// `warm/folder/name.md`, `cold/folder/name.md`: [`crate::tiers`]).
pub fn parse_file(rel: &str, text: &str) -> Vec<Record> {
    // A file in `warm/` or `cold/` holds the same records, with the same ids, as it did hot.
    let (_, inner) = crate::tiers::split_tier(rel);
    let Some((folder, name)) = inner.split_once('/') else { return Vec::new() };
    let Some(kind) = Kind::parse(folder) else { return Vec::new() };
    let stem = Path::new(name).file_stem().and_then(|s| s.to_str()).unwrap_or_default();
    let base = |n: usize, date: &str, time: &str, body: String| Record {
        id: format!("{inner}#{n}"),
        kind,
        date: date.to_owned(),
        time: time.to_owned(),
        priority: Priority::Medium,
        category: String::new(),
        agent: String::new(),
        path: rel.to_owned(),
        text: body,
    };
    match kind {
        Kind::Journal => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(n, line)| {
                let time = line.split(" | ").next().filter(|t| is_hhmm(t)).unwrap_or_default();
                // A trailing `<!-- id: …; agent: … -->` (the turn's id, its agent).
                let tail = line.trim_end().strip_suffix("-->").and_then(|l| l.rsplit_once("<!--"));
                let notes = tail.map(|(_, c)| notes(c)).unwrap_or_default();
                let text = match (tail, notes.id.is_some()) {
                    (Some((text, _)), true) => text.trim_end(),
                    _ => line.trim(),
                };
                let mut r = base(n, stem, time, text.to_owned());
                if let Some(id) = notes.id {
                    r.id = id;
                    r.agent = notes.agent.unwrap_or_default();
                }
                r
            })
            .collect(),
        Kind::Observation | Kind::Reflection => entries(text)
            .into_iter()
            .enumerate()
            .map(|(n, entry)| {
                let time = entry
                    .heading
                    .trim_start_matches("Reflection - ")
                    .trim()
                    .get(..5)
                    .filter(|t| is_hhmm(t))
                    .unwrap_or_default()
                    .to_owned();
                let mut r = base(n, stem, &time, entry.body);
                if let Some(id) = entry.notes.id {
                    r.id = id;
                }
                r.priority = entry.notes.priority.unwrap_or(Priority::Medium);
                r.category = entry.notes.category.unwrap_or_default();
                r.agent = entry.notes.agent.unwrap_or_default();
                r
            })
            .collect(),
        Kind::Knowledge => {
            let date = text
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("Last updated:"))
                .and_then(|d| d.trim().get(..10))
                .unwrap_or_default()
                .to_owned();
            let title = text
                .lines()
                .find_map(|l| l.strip_prefix("# "))
                .map(str::trim)
                .unwrap_or(stem)
                .to_owned();
            let mut sections = Vec::new();
            let mut current = String::new();
            for line in text.lines() {
                if line.starts_with("# ") || line.starts_with("Last updated:") {
                    continue;
                }
                if line.starts_with("## ") && !current.trim().is_empty() {
                    sections.push(std::mem::take(&mut current));
                }
                current.push_str(line);
                current.push('\n');
            }
            if !current.trim().is_empty() {
                sections.push(current);
            }
            sections
                .into_iter()
                .enumerate()
                .map(|(n, s)| base(n, &date, "", format!("{title}: {}", s.trim())))
                .collect()
        }
    }
}

/// One `## …` entry of an observations or reflections file.
struct Entry {
    heading: String,
    body: String,
    notes: Notes,
}

/// What an entry's comments say: `<!-- id: …; priority: …; category: …; agent: … -->`.
#[derive(Default)]
struct Notes {
    id: Option<String>,
    priority: Option<Priority>,
    category: Option<String>,
    agent: Option<String>,
}

impl Notes {
    /// Adds the `key: value` parts of one comment's inside.
    fn add(&mut self, comment: &str) {
        for part in comment.split(';') {
            let Some((key, value)) = part.split_once(':') else { continue };
            let value = value.trim();
            match key.trim() {
                "id" => self.id = Some(value.to_owned()),
                "priority" => self.priority = Priority::parse(value),
                "category" => self.category = Some(value.to_owned()),
                "agent" => self.agent = Some(value.to_owned()),
                _ => {}
            }
        }
    }
}

/// The notes of one comment's inside.
fn notes(comment: &str) -> Notes {
    let mut n = Notes::default();
    n.add(comment);
    n
}

fn entries(text: &str) -> Vec<Entry> {
    let mut out = Vec::new();
    let mut current: Option<Entry> = None;
    let flush = |e: Option<Entry>, out: &mut Vec<Entry>| {
        if let Some(mut e) = e {
            e.body = e.body.trim().to_owned();
            if !e.body.is_empty() {
                out.push(e);
            }
        }
    };
    for line in text.lines() {
        if let Some(heading) = line.strip_prefix("## ") {
            flush(current.take(), &mut out);
            current = Some(Entry {
                heading: heading.to_owned(),
                body: String::new(),
                notes: Notes::default(),
            });
            continue;
        }
        let Some(e) = current.as_mut() else { continue };
        if line == "---" {
            flush(current.take(), &mut out);
        } else if let Some(comment) =
            line.strip_prefix("<!--").and_then(|c| c.trim_end().strip_suffix("-->"))
        {
            e.notes.add(comment);
        } else {
            e.body.push_str(line);
            e.body.push('\n');
        }
    }
    flush(current, &mut out);
    out
}

fn is_hhmm(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 5 && b[2] == b':' && [0, 1, 3, 4].iter().all(|&i| b[i].is_ascii_digit())
}

/// The Unix epoch's date.
const EPOCH: jiff::civil::Date = jiff::civil::Date::constant(1970, 1, 1);

/// Days since the Unix epoch of a `YYYY-MM-DD` date (`None` if it is not one, e.g. 2024-02-31).
pub fn days_of(date: &str) -> Option<i64> {
    let s = date.get(..10)?;
    if s.get(4..5)? != "-" || s.get(7..8)? != "-" {
        return None;
    }
    let (y, m, d) =
        (s.get(..4)?.parse().ok()?, s.get(5..7)?.parse().ok()?, s.get(8..)?.parse().ok()?);
    let day = jiff::civil::Date::new(y, m, d).ok()?;
    Some(i64::from(day.since(EPOCH).ok()?.get_days()))
}

/// The `YYYY-MM-DD` date of a day count since the Unix epoch (the inverse of [`days_of`]).
pub fn date_of(days: i64) -> String {
    let span = jiff::Span::new().try_days(days).unwrap_or_default();
    let d = EPOCH.checked_add(span).unwrap_or(EPOCH);
    format!("{:04}-{:02}-{:02}", d.year(), d.month(), d.day())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_real_calendar_dates() {
        assert_eq!(days_of("1970-01-01"), Some(0));
        assert_eq!(days_of("2024-03-01").map(date_of).as_deref(), Some("2024-03-01"));
        assert_eq!(days_of("2024-02-29 11:00"), Some(days_of("2024-03-01").unwrap() - 1));
        for bad in [
            "2024-02-31",
            "2023-02-29",
            "2024-13-01",
            "2024-00-10",
            "24-1-1",
            "2024/01/01",
            "2024-01-é1",
        ] {
            assert_eq!(days_of(bad), None, "{bad}");
        }
        assert_eq!(date_of(-1), "1969-12-31");
    }

    #[test]
    fn every_format_becomes_records_with_stable_ids() {
        let obs = "## 09:15\nAna prefers tabs.\n<!-- id: t-42 -->\n<!-- priority: high; category: preference; agent: worker-2 -->\n---\n\n## 10:00\nThe build is green.\n<!-- id: t-43 -->\n<!-- reflected: 2026-11-25 11:00 -->\n---\n";
        let r = parse_file("observations/2026-11-25.md", obs);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].id.as_str(), r[0].time.as_str(), r[0].text.as_str()),
            ("t-42", "09:15", "Ana prefers tabs.")
        );
        assert_eq!(
            (r[0].priority, r[0].category.as_str(), r[0].agent.as_str()),
            (Priority::High, "preference", "worker-2")
        );
        assert_eq!((r[1].priority, r[1].date.as_str()), (Priority::Medium, "2026-11-25"));
        assert_eq!(r[1].agent, "");

        let j = parse_file(
            "journals/2026-11-24.md",
            "08:00 | build X | ran cargo | ok\n\n09:00 | b | c | d <!-- id: t9 -->\n\
             10:00 | e | f | g <!-- id: t10; agent: worker -->\n",
        );
        assert_eq!(
            j.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
            ["journals/2026-11-24.md#0", "t9", "t10"]
        );
        assert_eq!(j[1].text, "09:00 | b | c | d");
        assert_eq!((j[2].text.as_str(), j[2].agent.as_str()), ("10:00 | e | f | g", "worker"));
        assert_eq!(j[1].time, "09:00");

        let refl = parse_file(
            "reflections/2026-11-24.md",
            "## Reflection - 18:00\nA week of builds.\n---\n",
        );
        assert_eq!((refl[0].time.as_str(), refl[0].text.as_str()), ("18:00", "A week of builds."));

        let k = "# Deploys\n\nUse blue-green.\n\n## Rollback\nKeep the last two images.\n\nLast updated: 2026-11-20 10:00\n";
        let k = parse_file("knowledge/deploys.md", k);
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].text, "Deploys: Use blue-green.");
        assert_eq!(k[1].text, "Deploys: ## Rollback\nKeep the last two images.");
        assert_eq!(k[1].date, "2026-11-20");
        assert!(parse_file("elsewhere/x.md", "text").is_empty());
    }

    #[test]
    fn dates_count_days_from_the_epoch() {
        assert_eq!(days_of("1970-01-01"), Some(0));
        assert_eq!(days_of("2026-11-25"), Some(20_782));
        assert_eq!(days_of("2026-13-01"), None);
        assert_eq!(days_of("nope"), None);
        for d in [0, 59, 60, 20_782, 11_016, -1] {
            assert_eq!(days_of(&date_of(d)), Some(d), "{}", date_of(d));
        }
    }
}
