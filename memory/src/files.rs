//! The swarm's memory files (the brain-persona formats), under the state dir's `memory/`:
//!
//! - `journals/YYYY-MM-DD.md` (a worker's turns): `HH:MM | request | what was done | result
//!   <!-- id: ID; agent: NAME -->`
//! - `observations/YYYY-MM-DD.md` (the observer, and `memory_remember`): `## HH:MM`, a
//!   third-person line, an id comment, an optional `<!-- priority: …; category: …; agent: … -->`,
//!   `---`; reflection adds `<!-- reflected: YYYY-MM-DD HH:MM -->` to what it read
//! - `reflections/YYYY-MM-DD.md` (reflection): `## Reflection - HH:MM`, the text, `---`
//! - `knowledge/<topic>.md` (dream, and `knowledge_append`): `# Topic`, sections,
//!   `Last updated: YYYY-MM-DD HH:MM`; merged into, never overwritten
//!
//! One writer: the supervisor's memory thread (`flock_actors::memory`) writes on an agent's
//! behalf, with the agent's name from its connection; agents see the folder read-only in their
//! cage and read it with the same type. Every write still holds `memory/.lock` (an exclusive
//! `flock`), so a second writer (`flockctl memory …` on the files) never interleaves; an append is
//! one `write` of a whole entry, and a rewrite (marking observations reflected, merging knowledge)
//! goes to a temporary file renamed over the old one, so a crash leaves either the old file or the
//! new one. Times are UTC. Every entry is masked ([`crate::mask`]: API keys, tokens, passwords,
//! private keys, e-mail and card numbers) before it is written.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

// Secrets never reach the memory files: every entry is masked before it is written.
use crate::mask::mask;

/// One observation entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The id comment (the observer's turn id): unique, and how reflection marks it.
    pub id: String,
    /// `YYYY-MM-DD HH:MM`.
    pub when: String,
    pub text: String,
    pub reflected: bool,
    /// `high`, `medium` or `low`, when the observer tagged it.
    pub priority: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Memory {
    dir: PathBuf,
}

const ID_PREFIX: &str = "<!-- id: ";
const REFLECTED_PREFIX: &str = "<!-- reflected: ";

impl Memory {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Memory { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` holding the memory folder's lock.
    pub(crate) fn locked<T>(&self, f: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        std::fs::create_dir_all(&self.dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join(".lock"))?;
        lock.lock()?;
        let out = f();
        let _ = lock.unlock();
        out
    }

    fn append(&self, sub: &str, file: &str, entry: &str) -> io::Result<PathBuf> {
        let folder = self.dir.join(sub);
        std::fs::create_dir_all(&folder)?;
        let path = folder.join(file);
        let mut f = OpenOptions::new().create(true).append(true).open(&path)?;
        f.write_all(entry.as_bytes())?;
        f.sync_data()?;
        Ok(path)
    }

    /// `journals/DATE.md`: `HH:MM | request | what was done | result <!-- id: ID; agent: NAME -->`
    /// (`agent` wrote it), unless a line with this `id` is already there (today's or yesterday's
    /// file: a turn replayed after a crash, even past midnight, does not journal twice). Returns
    /// whether it was written.
    pub fn append_journal(
        &self,
        now_ms: u64,
        id: &str,
        agent: &str,
        request: &str,
        done: &str,
        result: &str,
    ) -> io::Result<bool> {
        let (_, hm) = date_and_minute(now_ms);
        let line = format!(
            "{hm} | {} | {} | {} {ID_PREFIX}{id}; agent: {} -->\n",
            one_line(request),
            one_line(done),
            one_line(result),
            one_line(agent)
        );
        self.append_once("journals", now_ms, id, &mask(&line))
    }

    /// Appends `entry` to `sub/DATE.md` unless an entry with this `id` is in today's or
    /// yesterday's file already (a replay, even past midnight). Returns whether it was written.
    fn append_once(&self, sub: &str, now_ms: u64, id: &str, entry: &str) -> io::Result<bool> {
        let (date, _) = date_and_minute(now_ms);
        let (yesterday, _) = date_and_minute(now_ms.saturating_sub(86_400_000));
        self.locked(|| {
            for day in [&yesterday, &date] {
                let path = self.dir.join(sub).join(format!("{day}.md"));
                if std::fs::read_to_string(&path).is_ok_and(|t| has_id(&t, id)) {
                    return Ok(false);
                }
            }
            self.append(sub, &format!("{date}.md"), entry)?;
            Ok(true)
        })
    }

    /// `observations/DATE.md`: one entry, unless an entry with this `id` is already there (a
    /// turn replayed after a crash does not observe twice). Returns whether it was written.
    pub fn append_observation(&self, now_ms: u64, id: &str, text: &str) -> io::Result<bool> {
        self.append_observation_tagged(now_ms, id, None, text, None)
    }

    /// [`Memory::append_observation`] about `agent`'s work, with a priority and category
    /// (`high`, `decision`), kept as `<!-- priority: …; category: …; agent: … -->` for the index.
    pub fn append_observation_tagged(
        &self,
        now_ms: u64,
        id: &str,
        agent: Option<&str>,
        text: &str,
        tag: Option<(&str, &str)>,
    ) -> io::Result<bool> {
        let (date, hm) = date_and_minute(now_ms);
        let mut notes = Vec::new();
        if let Some((priority, category)) = tag {
            notes.push(format!("priority: {priority}"));
            if !category.is_empty() {
                notes.push(format!("category: {category}"));
            }
        }
        if let Some(agent) = agent.filter(|a| !a.is_empty()) {
            notes.push(format!("agent: {}", one_line(agent)));
        }
        let mut marker = format!("{ID_PREFIX}{id} -->");
        if !notes.is_empty() {
            marker.push_str(&format!("\n<!-- {} -->", notes.join("; ")));
        }
        self.locked(|| {
            let path = self.dir.join("observations").join(format!("{date}.md"));
            if std::fs::read_to_string(&path).is_ok_and(|t| has_id(&t, id)) {
                return Ok(false);
            }
            let entry = format!("## {hm}\n{}\n{marker}\n---\n\n", mask(text.trim()));
            self.append("observations", &format!("{date}.md"), &entry)?;
            Ok(true)
        })
    }

    /// Every observation of every day, oldest first.
    pub fn observations(&self) -> io::Result<Vec<Observation>> {
        let mut out = Vec::new();
        for (date, path) in dated_files(&self.dir.join("observations"))? {
            out.extend(parse_observations(&date, &std::fs::read_to_string(path)?));
        }
        Ok(out)
    }

    pub fn unreflected(&self) -> io::Result<Vec<Observation>> {
        Ok(self.observations()?.into_iter().filter(|o| !o.reflected).collect())
    }

    /// Marks these observations reflected (`<!-- reflected: … -->` before their `---`), each
    /// file rewritten atomically. Returns how many were marked.
    pub fn mark_reflected(&self, now_ms: u64, ids: &[String]) -> io::Result<usize> {
        let (date, hm) = date_and_minute(now_ms);
        let stamp = format!("{REFLECTED_PREFIX}{date} {hm} -->");
        self.locked(|| {
            let mut marked = 0;
            for (_, path) in dated_files(&self.dir.join("observations"))? {
                let text = std::fs::read_to_string(&path)?;
                let mut out = String::with_capacity(text.len() + 64);
                let mut current: Option<&str> = None;
                let mut reflected = false;
                let mut changed = false;
                for line in text.lines() {
                    if line.starts_with("## ") {
                        (current, reflected) = (None, false);
                    } else if let Some(id) = line.strip_prefix(ID_PREFIX) {
                        current = Some(id.trim_end_matches("-->").trim());
                    } else if line.starts_with(REFLECTED_PREFIX) {
                        reflected = true;
                    } else if line == "---"
                        && !reflected
                        && current.is_some_and(|id| ids.iter().any(|x| x == id))
                    {
                        out.push_str(&stamp);
                        out.push('\n');
                        marked += 1;
                        changed = true;
                    }
                    out.push_str(line);
                    out.push('\n');
                }
                if changed {
                    replace(&path, &out)?;
                }
            }
            Ok(marked)
        })
    }

    /// `reflections/DATE.md`: `## Reflection - HH:MM`, the text, `---`.
    /// `reflections/DATE.md`: `## Reflection - HH:MM`, the text, `<!-- id: … -->`, `---` —
    /// unless a reflection with this `id` (the reflection turn's) is already there, today or
    /// yesterday: a replayed turn does not reflect twice. Returns whether it was written.
    pub fn append_reflection(&self, now_ms: u64, id: &str, text: &str) -> io::Result<bool> {
        let (_, hm) = date_and_minute(now_ms);
        let marker = format!("{ID_PREFIX}{id} -->");
        let entry = format!("## Reflection - {hm}\n{}\n{marker}\n---\n\n", mask(text.trim()));
        self.append_once("reflections", now_ms, id, &entry)
    }

    /// `knowledge/<topic>.md` from a document whose first `# ` line names the topic: a new topic
    /// becomes a file; an existing one gets the new sections merged in (never overwritten) and
    /// its `Last updated:` line renewed.
    pub fn merge_knowledge(&self, now_ms: u64, document: &str) -> io::Result<PathBuf> {
        let (date, hm) = date_and_minute(now_ms);
        let document = mask(document);
        let mut lines = document.trim().lines();
        let title = lines
            .by_ref()
            .find_map(|l| l.strip_prefix("# "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .unwrap_or("notes")
            .to_owned();
        let body: Vec<&str> = lines.filter(|l| !l.starts_with("Last updated:")).collect();
        let body = body.join("\n").trim().to_owned();
        let stamp = format!("Last updated: {date} {hm}");
        let path = self.dir.join("knowledge").join(format!("{}.md", kebab(&title)));
        self.locked(|| {
            std::fs::create_dir_all(self.dir.join("knowledge"))?;
            let text = match std::fs::read_to_string(&path) {
                Ok(old) => {
                    let kept: Vec<&str> = old
                        .trim_end()
                        .lines()
                        .filter(|l| !l.starts_with("Last updated:"))
                        .collect();
                    let kept = kept.join("\n");
                    if kept.contains(&body) {
                        format!("{}\n\n{stamp}\n", kept.trim_end())
                    } else {
                        format!("{}\n\n{body}\n\n{stamp}\n", kept.trim_end())
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    format!("# {title}\n\n{body}\n\n{stamp}\n")
                }
                Err(e) => return Err(e),
            };
            replace(&path, &text)?;
            Ok(path)
        })
    }

    /// What dream reads: recent journals and reflections (newest last, cut to `max_chars`) and
    /// the knowledge topics that exist.
    pub fn digest(&self, max_chars: usize) -> io::Result<String> {
        let mut parts = Vec::new();
        for sub in ["journals", "reflections"] {
            for (date, path) in dated_files(&self.dir.join(sub))? {
                parts.push(format!("### {sub}/{date}.md\n{}", std::fs::read_to_string(path)?));
            }
        }
        let mut text = parts.join("\n");
        if text.chars().count() > max_chars {
            let skip = text.chars().count() - max_chars;
            text = format!("…{}", text.chars().skip(skip).collect::<String>());
        }
        let mut topics: Vec<String> = match std::fs::read_dir(self.dir.join("knowledge")) {
            Ok(rd) => rd
                .filter_map(|e| {
                    e.ok()?.file_name().to_str()?.strip_suffix(".md").map(str::to_owned)
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        topics.sort();
        Ok(format!(
            "{text}\n### knowledge topics\n{}",
            if topics.is_empty() { "(none yet)".into() } else { topics.join(", ") }
        ))
    }
}

/// `(YYYY-MM-DD, path)` of the `*.md` files of a folder, by date.
fn dated_files(folder: &Path) -> io::Result<Vec<(String, PathBuf)>> {
    let rd = match std::fs::read_dir(folder) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files: Vec<(String, PathBuf)> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let date = e.file_name().to_str()?.strip_suffix(".md")?.to_owned();
            Some((date, e.path()))
        })
        .collect();
    files.sort();
    Ok(files)
}

fn parse_observations(date: &str, text: &str) -> Vec<Observation> {
    let mut out = Vec::new();
    let mut cur: Option<Observation> = None;
    for line in text.lines() {
        if let Some(hm) = line.strip_prefix("## ") {
            cur = Some(Observation {
                id: String::new(),
                when: format!("{date} {}", hm.trim()),
                text: String::new(),
                reflected: false,
                priority: None,
            });
        } else if let Some(o) = cur.as_mut() {
            if let Some(id) = line.strip_prefix(ID_PREFIX) {
                o.id = id.trim_end_matches("-->").trim().to_owned();
            } else if line.starts_with(REFLECTED_PREFIX) {
                o.reflected = true;
            } else if let Some(notes) = line.strip_prefix("<!--") {
                // Other annotations (`<!-- priority: high; category: task -->`) are the index's;
                // reflection reads the priority.
                o.priority = notes
                    .trim_end_matches("-->")
                    .split(';')
                    .find_map(|n| n.trim().strip_prefix("priority:"))
                    .map(|p| p.trim().to_owned())
                    .or(o.priority.take());
            } else if line == "---" {
                out.extend(cur.take());
            } else if !line.trim().is_empty() {
                if !o.text.is_empty() {
                    o.text.push('\n');
                }
                o.text.push_str(line);
            }
        }
    }
    out
}

/// Writes `text` to a temporary file beside `path` and renames it over `path`.
fn replace(path: &Path, text: &str) -> io::Result<()> {
    let tmp = path.with_extension("md.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The UTC date (`YYYY-MM-DD`) and minute (`HH:MM`) of a Unix time in milliseconds.
fn date_and_minute(unix_ms: u64) -> (String, String) {
    let at = i64::try_from(unix_ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(jiff::Timestamp::MAX);
    let t = jiff::tz::Offset::UTC.to_datetime(at);
    (
        format!("{:04}-{:02}-{:02}", t.year(), t.month(), t.day()),
        format!("{:02}:{:02}", t.hour(), t.minute()),
    )
}

/// The memory roles' way of saying there is nothing to keep (`nothing`, `none.`, blank).
pub fn is_nothing(reply: &str) -> bool {
    let r = reply.trim().trim_end_matches('.').to_lowercase();
    r.is_empty() || r == "nothing" || r == "none"
}

/// How many different items `items` holds.
pub fn distinct<T: Ord + Clone>(items: &[T]) -> usize {
    let mut unique = items.to_vec();
    unique.sort_unstable();
    unique.dedup();
    unique.len()
}

/// Why a memory text is unusable: empty, or repeating itself (a small model's loop). `None`
/// when it may be written.
pub fn degenerate(text: &str) -> Option<&'static str> {
    if is_nothing(text) {
        return Some("empty");
    }
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if lines.len() >= 4 && distinct(&lines) * 2 < lines.len() {
        return Some("the same lines over and over");
    }
    let words: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
    if words.len() >= 40 && distinct(&words) * 5 < words.len() {
        return Some("the same words over and over");
    }
    None
}

/// `|` and newlines would break a journal line.
fn one_line(s: &str) -> String {
    let flat: String = s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "/");
    let mut out: String = flat.chars().take(200).collect();
    if flat.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// `User Preferences!` → `user-preferences`.
/// Whether `text` holds an entry whose id comment is `id` (`<!-- id: ID -->`, or
/// `<!-- id: ID; agent: … -->` on a journal line).
fn has_id(text: &str, id: &str) -> bool {
    text.contains(&format!("{ID_PREFIX}{id} -->")) || text.contains(&format!("{ID_PREFIX}{id};"))
}

pub fn kebab(title: &str) -> String {
    let mut out = String::new();
    for c in title.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let out = out.trim_end_matches('-').to_owned();
    if out.is_empty() { "notes".into() } else { out.chars().take(64).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_763_720_000_000; // 2025-11-21T10:13:20Z

    #[test]
    fn observations_append_once_per_id_and_are_marked_reflected() {
        let dir = tempfile::tempdir().unwrap();
        let m = Memory::new(dir.path());
        assert!(m.append_observation(T, "a1", "Bren answered a question.").unwrap());
        assert!(!m.append_observation(T, "a1", "Bren answered a question.").unwrap(), "replayed");
        assert!(m.append_observation(T + 60_000, "a2", "Bren wrote a file.\nA habit.").unwrap());
        let text = std::fs::read_to_string(dir.path().join("observations/2025-11-21.md")).unwrap();
        assert_eq!(
            text,
            "## 10:13\nBren answered a question.\n<!-- id: a1 -->\n---\n\n\
             ## 10:14\nBren wrote a file.\nA habit.\n<!-- id: a2 -->\n---\n\n"
        );
        let un = m.unreflected().unwrap();
        assert_eq!(un.len(), 2);
        assert_eq!(un[1].text, "Bren wrote a file.\nA habit.");
        assert_eq!(un[1].when, "2025-11-21 10:14");
        assert_eq!(m.mark_reflected(T + 120_000, &["a1".into()]).unwrap(), 1);
        assert_eq!(m.mark_reflected(T + 120_000, &["a1".into()]).unwrap(), 0, "already marked");
        let un = m.unreflected().unwrap();
        assert_eq!(un.iter().map(|o| o.id.as_str()).collect::<Vec<_>>(), ["a2"]);
        let text = std::fs::read_to_string(dir.path().join("observations/2025-11-21.md")).unwrap();
        assert!(text.contains("<!-- id: a1 -->\n<!-- reflected: 2025-11-21 10:15 -->\n---"));
    }

    #[test]
    fn secrets_are_masked_before_any_memory_file_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let m = Memory::new(dir.path());
        let key = "sk-proj-abcdefghijklmnopqrstuvwxyz012345";
        m.append_observation(T, "s1", &format!("Ana set OPENAI_API_KEY to {key}.")).unwrap();
        m.append_journal(
            T,
            "j1",
            "worker",
            "deploy",
            &format!("used password: hunter2hunter and {key}"),
            "ok",
        )
        .unwrap();
        assert!(
            m.append_reflection(T, "r1", &format!("Mail ana@example.com about {key}")).unwrap()
        );
        assert!(!m.append_reflection(T + 60_000, "r1", "again").unwrap(), "replayed");
        m.merge_knowledge(T, &format!("# Keys\n\nThe key is {key}.")).unwrap();
        for sub in ["observations", "journals", "reflections", "knowledge"] {
            for entry in std::fs::read_dir(dir.path().join(sub)).unwrap() {
                let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
                assert!(!text.contains(key) && !text.contains("hunter2"), "{sub}: {text}");
                assert!(!text.contains("ana@example.com"), "{sub}: {text}");
                assert!(text.contains("[masked:"), "{sub}: {text}");
            }
        }
    }

    #[test]
    fn journal_lines_stay_one_line_and_knowledge_merges() {
        let dir = tempfile::tempdir().unwrap();
        let m = Memory::new(dir.path());
        assert!(m.append_journal(T, "t1", "w", "fix | the\nbuild", "ran tests", "green").unwrap());
        // The same turn replayed, even a day later, is not journaled again; t1's id is not t10's.
        assert!(!m.append_journal(T + 60_000, "t1", "w", "fix", "ran tests", "green").unwrap());
        assert!(!m.append_journal(T + 86_400_000, "t1", "w", "fix", "ran", "green").unwrap());
        assert!(m.append_journal(T + 60_000, "t10", "w", "next", "ran tests", "green").unwrap());
        let j = std::fs::read_to_string(dir.path().join("journals/2025-11-21.md")).unwrap();
        assert_eq!(
            j,
            "10:13 | fix / the build | ran tests | green <!-- id: t1; agent: w -->\n\
             10:14 | next | ran tests | green <!-- id: t10; agent: w -->\n"
        );
        assert!(!dir.path().join("journals/2025-11-22.md").exists());

        let p = m.merge_knowledge(T, "# User Preferences\n## Key knowledge\n- likes Rust").unwrap();
        assert!(p.ends_with("knowledge/user-preferences.md"));
        m.merge_knowledge(
            T + 60_000,
            "# User Preferences\n## Key knowledge\n- prefers short answers",
        )
        .unwrap();
        let k = std::fs::read_to_string(&p).unwrap();
        assert!(k.starts_with("# User Preferences\n"), "{k}");
        assert!(k.contains("- likes Rust") && k.contains("- prefers short answers"), "{k}");
        assert_eq!(k.matches("Last updated:").count(), 1, "{k}");
        assert!(k.trim_end().ends_with("Last updated: 2025-11-21 10:14"), "{k}");
        assert!(m.digest(10_000).unwrap().contains("user-preferences"));
    }

    #[test]
    fn concurrent_appends_from_many_threads_never_interleave() {
        let dir = tempfile::tempdir().unwrap();
        let handles: Vec<_> = (0..8)
            .map(|t| {
                let m = Memory::new(dir.path());
                std::thread::spawn(move || {
                    for i in 0..50 {
                        m.append_observation(T, &format!("{t}-{i}"), &"x".repeat(3000)).unwrap();
                    }
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        let all = Memory::new(dir.path()).observations().unwrap();
        assert_eq!(all.len(), 400);
        assert!(all.iter().all(|o| o.text.len() == 3000));
    }
}
