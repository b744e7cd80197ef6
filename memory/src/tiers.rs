//! Tiers that move (seed 002, FR-P1-003/004): a day file of journals, observations or reflections
//! lives in one of three places under the memory dir, and where it lives is its tier:
//!
//! - **hot** — `journals/`, `observations/`, `reflections/` (and `knowledge/`, always hot): what
//!   agents read, what `active_memory.md` is built from, searched by default;
//! - **warm** — `warm/<folder>/`: the markdown archive, still searched by default;
//! - **cold** — `cold/<folder>/`: out of the default search (`--all` finds it), a folder a person
//!   may open as an Obsidian vault or copy elsewhere.
//!
//! The daily TTL job ([`ttl`]) moves hot day files older than [`Ages::warm_after_days`] to warm
//! on its own, and says which warm files are past [`Ages::cold_after_days`]: moving those to cold
//! waits for a person (the supervisor asks through a permission request). [`move_days`] is the one
//! mover (the job, an approved request, `flockctl memory archive` in any direction — the way
//! back too). A move is a `rename` per file under the memory lock, so a crash leaves each file
//! whole in one place; a file whose destination exists is left where it is and named in
//! [`Moved::skipped`]. Records keep their ids across tiers (an id never names its tier).

use std::io;
use std::path::Path;

use crate::files::Memory;
use crate::records::{date_of, days_of, parse_file};

/// Where a day file lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    Hot,
    Warm,
    Cold,
}

impl Tier {
    pub const ALL: [Tier; 3] = [Tier::Hot, Tier::Warm, Tier::Cold];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Hot => "hot",
            Tier::Warm => "warm",
            Tier::Cold => "cold",
        }
    }

    pub fn parse(s: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.as_str() == s.trim())
    }

    /// The folder a tier's files live under, relative to the memory dir (`""` for hot).
    pub fn prefix(self) -> &'static str {
        match self {
            Tier::Hot => "",
            Tier::Warm => "warm/",
            Tier::Cold => "cold/",
        }
    }

    /// The tier of a file by its path relative to the memory dir.
    pub fn of_path(rel: &str) -> Tier {
        split_tier(rel).0
    }
}

/// `warm/observations/2025-01-02.md` → (warm, `observations/2025-01-02.md`).
pub fn split_tier(rel: &str) -> (Tier, &str) {
    for tier in [Tier::Warm, Tier::Cold] {
        if let Some(rest) = rel.strip_prefix(tier.prefix()) {
            return (tier, rest);
        }
    }
    (Tier::Hot, rel)
}

/// The folders whose files are one day each, and move between tiers (knowledge stays hot).
pub const DAY_FOLDERS: [&str; 3] = ["journals", "observations", "reflections"];

/// When day files move on (a swarm file's `memory.tiers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ages {
    /// A hot day file older than this many days moves to warm (no one asked).
    pub warm_after_days: u32,
    /// A warm day file older than this many days is due for cold (a person approves).
    pub cold_after_days: u32,
}

impl Default for Ages {
    fn default() -> Self {
        Ages { warm_after_days: 90, cold_after_days: 365 }
    }
}

/// One day file somewhere in the tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayFile {
    pub tier: Tier,
    pub folder: &'static str,
    /// `YYYY-MM-DD`, the file's name.
    pub date: String,
    /// The same, in days since the Unix epoch.
    pub day: i64,
}

impl DayFile {
    /// Its path relative to the memory dir.
    pub fn rel(&self) -> String {
        self.rel_in(self.tier)
    }

    fn rel_in(&self, tier: Tier) -> String {
        format!("{}{}/{}.md", tier.prefix(), self.folder, self.date)
    }
}

/// Every day file in every tier, oldest first (files not named `YYYY-MM-DD.md` are not day
/// files: they stay where they are).
pub fn day_files(dir: &Path) -> io::Result<Vec<DayFile>> {
    let mut out = Vec::new();
    for tier in Tier::ALL {
        for folder in DAY_FOLDERS {
            let entries = match std::fs::read_dir(dir.join(tier.prefix()).join(folder)) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                let name = entry?.file_name();
                let Some(date) = name.to_str().and_then(|n| n.strip_suffix(".md")) else {
                    continue;
                };
                let Some(day) = days_of(date).filter(|_| date.len() == 10) else { continue };
                out.push(DayFile { tier, folder, date: date.to_owned(), day });
            }
        }
    }
    out.sort_by(|a, b| (a.day, a.folder, a.tier).cmp(&(b.day, b.folder, b.tier)));
    Ok(out)
}

/// Which day files a move takes: those in `from`, dated within `since..=until` (days since the
/// epoch; `None`: no bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    pub from: Vec<Tier>,
    pub since: Option<i64>,
    pub until: Option<i64>,
}

/// What a person asks to move (`flockctl memory archive`), as typed.
#[derive(Debug, Clone, Default)]
pub struct Ask<'a> {
    /// `hot`, `warm` or `cold`.
    pub to: &'a str,
    /// Tier names to take from (empty: every other tier).
    pub from: &'a [String],
    /// `YYYY-MM-DD` bounds, both inclusive.
    pub since: Option<&'a str>,
    pub until: Option<&'a str>,
    /// Only files older than this many days.
    pub older_than_days: Option<u32>,
}

impl Pick {
    /// The tier and the files a person's `ask` names, on `today`. With no bound at all, a move
    /// to warm or cold takes what is older than that tier's age in `ages` (a move back to hot
    /// takes everything: the way back from any archiving).
    pub fn ask(ask: &Ask<'_>, today: i64, ages: Ages) -> Result<(Pick, Tier), String> {
        let to = Tier::parse(ask.to)
            .ok_or_else(|| format!("no tier `{}`; tiers: hot, warm, cold", ask.to))?;
        let mut from = Vec::new();
        for name in ask.from {
            let tier = Tier::parse(name)
                .ok_or_else(|| format!("no tier `{name}` to move from; tiers: hot, warm, cold"))?;
            if tier == to {
                return Err(format!(
                    "`--from {name}` is where the files are going (`--to {}`)",
                    ask.to
                ));
            }
            from.push(tier);
        }
        if from.is_empty() {
            from = Tier::ALL.into_iter().filter(|t| *t != to).collect();
        }
        let day = |what: &str, date: Option<&str>| match date {
            None => Ok(None),
            Some(d) => days_of(d)
                .filter(|_| d.len() == 10)
                .map(Some)
                .ok_or_else(|| format!("`{what}` \"{d}\" is not a date: write YYYY-MM-DD")),
        };
        let since = day("since", ask.since)?;
        let mut until = day("until", ask.until)?;
        let older_than = match (ask.older_than_days, to) {
            (Some(n), _) => Some(n),
            (None, _) if since.is_some() || until.is_some() => None,
            (None, Tier::Warm) => Some(ages.warm_after_days),
            (None, Tier::Cold) => Some(ages.cold_after_days),
            (None, Tier::Hot) => None,
        };
        if let Some(n) = older_than {
            let cut = today - i64::from(n) - 1;
            until = Some(until.map_or(cut, |u| u.min(cut)));
        }
        Ok((Pick { from, since, until }, to))
    }

    fn takes(&self, f: &DayFile) -> bool {
        self.from.contains(&f.tier)
            && self.since.is_none_or(|s| f.day >= s)
            && self.until.is_none_or(|u| f.day <= u)
    }
}

/// What a move did (or, dry, would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub to: Tier,
    /// (from, to), relative to the memory dir, oldest first.
    pub files: Vec<(String, String)>,
    /// The records those files hold.
    pub records: usize,
    /// (file, why) of the files left where they were.
    pub skipped: Vec<(String, String)>,
}

impl Moved {
    fn new(to: Tier) -> Self {
        Moved { to, files: Vec::new(), records: 0, skipped: Vec::new() }
    }

    /// The dates of the oldest and newest file moved.
    pub fn span(&self) -> Option<(&str, &str)> {
        fn date(rel: &str) -> Option<&str> {
            rel.rsplit('/').next()?.strip_suffix(".md")
        }
        Some((date(&self.files.first()?.0)?, date(&self.files.last()?.0)?))
    }
}

/// Moves the day files `pick` takes to tier `to` (a file already there is not taken); with
/// `dry_run`, only says what it would move. Holds the memory lock throughout.
pub fn move_days(memory: &Memory, pick: &Pick, to: Tier, dry_run: bool) -> io::Result<Moved> {
    let dir = memory.dir();
    memory.locked(|| {
        let mut moved = Moved::new(to);
        let mut touched = std::collections::BTreeSet::new();
        for file in day_files(dir)?.into_iter().filter(|f| f.tier != to && pick.takes(f)) {
            let (from, dest) = (file.rel(), file.rel_in(to));
            if dir.join(&dest).exists() {
                let why = format!("{dest} exists already; merge the two by hand");
                moved.skipped.push((from, why));
                continue;
            }
            let text = std::fs::read_to_string(dir.join(&from))?;
            moved.records += parse_file(&from, &text).len();
            if !dry_run {
                let parent = dir.join(to.prefix()).join(file.folder);
                std::fs::create_dir_all(&parent)?;
                std::fs::rename(dir.join(&from), dir.join(&dest))?;
                touched.insert(parent);
                touched.insert(dir.join(file.tier.prefix()).join(file.folder));
            }
            moved.files.push((from, dest));
        }
        // The renames last across a power cut once their folders are on disk.
        for folder in touched {
            std::fs::File::open(&folder)?.sync_all()?;
        }
        Ok(moved)
    })
}

/// Warm day files a person may send to cold: those dated up to `until`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdDue {
    /// `YYYY-MM-DD`: the newest date an approval covers.
    pub until: String,
    /// The oldest file's date.
    pub first: String,
    pub files: usize,
    pub records: usize,
}

/// What one run of the TTL job did, and what waits for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ttl {
    pub to_warm: Moved,
    pub cold_due: Option<ColdDue>,
}

/// The daily TTL job for `today` (days since the epoch): hot day files older than
/// `warm_after_days` move to warm; warm ones older than `cold_after_days` (those just moved
/// too) are reported as due for cold, and stay warm.
pub fn ttl(memory: &Memory, today: i64, ages: Ages) -> io::Result<Ttl> {
    let warm_until = today - i64::from(ages.warm_after_days) - 1;
    let pick = Pick { from: vec![Tier::Hot], since: None, until: Some(warm_until) };
    let to_warm = move_days(memory, &pick, Tier::Warm, false)?;
    let cold_until = today - i64::from(ages.cold_after_days) - 1;
    let pick = Pick { from: vec![Tier::Warm], since: None, until: Some(cold_until) };
    let due = move_days(memory, &pick, Tier::Cold, true)?;
    let cold_due = due.span().map(|(first, _)| ColdDue {
        until: date_of(cold_until),
        first: first.to_owned(),
        files: due.files.len(),
        records: due.records,
    });
    Ok(Ttl { to_warm, cold_due })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(id: &str, text: &str) -> String {
        format!("## 09:00\n{text}\n<!-- id: {id} -->\n---\n\n")
    }

    fn put(dir: &Path, rel: &str, text: &str) {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }

    fn day(date: &str) -> i64 {
        days_of(date).unwrap()
    }

    fn tiers_of(dir: &Path) -> Vec<(String, &'static str)> {
        day_files(dir).unwrap().into_iter().map(|f| (f.rel(), f.tier.as_str())).collect()
    }

    #[test]
    fn the_daily_job_moves_hot_to_warm_alone_and_only_reports_what_is_due_for_cold() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let memory = Memory::new(dir);
        put(dir, "observations/2026-11-30.md", &obs("new", "Ana likes tea."));
        put(dir, "observations/2026-09-01.md", &obs("edge", "Exactly 90 days old."));
        put(dir, "observations/2026-08-31.md", &obs("old", "91 days old."));
        put(dir, "journals/2025-06-01.md", "09:00 | a | b | c\n09:05 | d | e | f\n");
        put(dir, "reflections/2025-11-30.md", "## Reflection - 10:00\nA year ago.\n---\n");
        put(dir, "knowledge/tea.md", "# Tea\nLast updated: 2020-01-01 10:00\n");
        put(dir, "observations/notes.md", "not a day file");
        let today = day("2026-11-30");

        let run = ttl(&memory, today, Ages::default()).unwrap();
        let moved: Vec<&str> = run.to_warm.files.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            moved,
            ["journals/2025-06-01.md", "reflections/2025-11-30.md", "observations/2026-08-31.md"]
        );
        assert_eq!(run.to_warm.records, 4);
        // Past 365 days: due for cold, but still warm until a person says so.
        assert_eq!(
            run.cold_due,
            Some(ColdDue {
                until: "2025-11-29".into(),
                first: "2025-06-01".into(),
                files: 1,
                records: 2
            })
        );
        assert_eq!(
            tiers_of(dir),
            [
                ("warm/journals/2025-06-01.md".to_string(), "warm"),
                ("warm/reflections/2025-11-30.md".into(), "warm"),
                ("warm/observations/2026-08-31.md".into(), "warm"),
                ("observations/2026-09-01.md".into(), "hot"),
                ("observations/2026-11-30.md".into(), "hot"),
            ]
        );
        assert!(
            dir.join("knowledge/tea.md").exists() && dir.join("observations/notes.md").exists()
        );

        // The next day: the 90-day file moves, the rest is where it was; the same file is due.
        let run = ttl(&memory, today + 1, Ages::default()).unwrap();
        assert_eq!(
            run.to_warm.files,
            [("observations/2026-09-01.md".into(), "warm/observations/2026-09-01.md".into())]
        );
        assert_eq!(run.cold_due.unwrap().until, "2025-11-30");

        // A person's approval: warm files up to the date asked about go cold, nothing else.
        let pick = Pick { from: vec![Tier::Warm], since: None, until: Some(day("2025-11-29")) };
        let cold = move_days(&memory, &pick, Tier::Cold, false).unwrap();
        assert_eq!(
            cold.files,
            [("warm/journals/2025-06-01.md".into(), "cold/journals/2025-06-01.md".into())]
        );
        assert_eq!(Tier::of_path("cold/journals/2025-06-01.md"), Tier::Cold);
        assert!(
            ttl(&memory, today + 1, Ages::default())
                .unwrap()
                .cold_due
                .is_some_and(|c| c.files == 1)
        );
    }

    #[test]
    fn what_a_person_asks_to_move_is_read_with_the_tiers_ages_as_defaults() {
        let today = day("2026-11-30");
        let ages = Ages::default();
        fn ask<'a>(to: &'a str, from: &'a [String], older: Option<u32>) -> Ask<'a> {
            Ask { to, from, older_than_days: older, ..Ask::default() }
        }
        let (pick, to) = Pick::ask(&ask("warm", &[], None), today, ages).unwrap();
        assert_eq!((to, pick.from.clone()), (Tier::Warm, vec![Tier::Hot, Tier::Cold]));
        assert_eq!(pick.until, Some(today - 91));
        let (pick, _) = Pick::ask(&ask("cold", &[], Some(30)), today, ages).unwrap();
        assert_eq!(pick.until, Some(today - 31));
        let (pick, to) = Pick::ask(&ask("hot", &[], None), today, ages).unwrap();
        assert_eq!((to, pick.until, pick.since), (Tier::Hot, None, None));
        let dated = Ask {
            to: "warm",
            since: Some("2025-01-01"),
            until: Some("2025-02-01"),
            ..Ask::default()
        };
        let (pick, _) = Pick::ask(&dated, today, ages).unwrap();
        assert_eq!((pick.since, pick.until), (Some(day("2025-01-01")), Some(day("2025-02-01"))));
        let err = |a: &Ask<'_>| Pick::ask(a, today, ages).unwrap_err();
        assert!(err(&ask("attic", &[], None)).contains("no tier `attic`; tiers: hot, warm, cold"));
        assert!(err(&ask("warm", &["warm".into()], None)).contains("is where the files are going"));
        let bad = Ask { to: "warm", until: Some("last week"), ..Ask::default() };
        assert!(err(&bad).contains("\"last week\" is not a date: write YYYY-MM-DD"));
    }

    #[test]
    fn a_move_goes_back_too_and_never_overwrites() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path();
        let memory = Memory::new(dir);
        put(dir, "cold/observations/2024-01-01.md", &obs("a", "Old."));
        put(dir, "warm/observations/2025-01-01.md", &obs("b", "Less old."));
        put(dir, "observations/2025-01-01.md", &obs("c", "Written again that day."));
        let back = Pick { from: vec![Tier::Warm, Tier::Cold], since: None, until: None };

        let dry = move_days(&memory, &back, Tier::Hot, true).unwrap();
        assert_eq!(
            dry.files,
            [("cold/observations/2024-01-01.md".into(), "observations/2024-01-01.md".into())]
        );
        assert!(dir.join("cold/observations/2024-01-01.md").exists(), "a dry run moves nothing");
        assert_eq!(dry.skipped.len(), 1);
        assert!(dry.skipped[0].1.contains("exists already"), "{:?}", dry.skipped);

        let done = move_days(&memory, &back, Tier::Hot, false).unwrap();
        assert_eq!(done.files, dry.files);
        assert_eq!(
            std::fs::read_to_string(dir.join("observations/2024-01-01.md")).unwrap(),
            obs("a", "Old.")
        );
        // The file that would have been overwritten is untouched, in both places.
        assert_eq!(
            std::fs::read_to_string(dir.join("observations/2025-01-01.md")).unwrap(),
            obs("c", "Written again that day.")
        );
        assert!(dir.join("warm/observations/2025-01-01.md").exists());
    }
}
