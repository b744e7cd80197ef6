//! The search index: `memory/index.db`, SQLite with FTS5, rebuilt from the files whenever asked
//! and kept in step with them by [`Index::sync`] (a file whose size or mtime changed is read
//! again, a file that went away takes its records with it). Deleting `index.db` loses nothing.
//!
//! Ranking: FTS5's BM25 over the record text (porter stemming) and, with an embedder (feature
//! `vectors`), the cosine similarity of all-MiniLM-L6-v2 vectors, fused by reciprocal rank; then
//! boosted by priority (high ×1.5, low ×0.75) and, gently, recency (×1 today, falling to ×0.9
//! over months: relevance leads). A record's tier is where its file lives ([`crate::tiers`]:
//! `warm/…`, `cold/…`, else hot); a default search leaves cold records out, `all` finds them
//! too, and `active_memory.md` is built from hot records only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use rusqlite::{Connection, OptionalExtension, params};

use crate::records::{FOLDERS, Kind, Priority, Record, days_of, parse_file};
use crate::tiers::Tier;

pub use crate::filter::Filter;

/// Candidates each list (BM25, vectors) brings to the fusion.
const CANDIDATES: usize = 200;
/// The `k` of reciprocal rank fusion: a record's share from a list is `1 / (k + rank)`. Small,
/// because there are two lists that are good at different things (exact words, meaning): a
/// record either list is sure of (its first few) must beat one both place half-way. Measured on
/// the LongMemEval-style fixture (`flock-bench --only recall`): recall@5 0.90 at the usual 60,
/// 0.96 at 10, 1.00 from 2 to 6.
const RRF_K: f64 = 5.0;

/// Bumped on any change of [`SCHEMA`].
const SCHEMA_VERSION: i64 = 3;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (
    rid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    hash TEXT NOT NULL,
    kind TEXT NOT NULL,
    date TEXT NOT NULL,
    time TEXT NOT NULL,
    priority INTEGER NOT NULL,
    category TEXT NOT NULL,
    agent TEXT NOT NULL,
    path TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_path ON records(path);
CREATE INDEX IF NOT EXISTS records_hash ON records(hash);
CREATE INDEX IF NOT EXISTS records_agent ON records(agent);
CREATE VIRTUAL TABLE IF NOT EXISTS records_fts USING fts5(
    text, content='records', content_rowid='rid', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS records_ai AFTER INSERT ON records BEGIN
    INSERT INTO records_fts(rowid, text) VALUES (new.rid, new.text);
END;
CREATE TRIGGER IF NOT EXISTS records_ad AFTER DELETE ON records BEGIN
    INSERT INTO records_fts(records_fts, rowid, text) VALUES ('delete', old.rid, old.text);
END;
-- A vector is a function of the text alone: keyed by its hash, it outlives rebuilds.
CREATE TABLE IF NOT EXISTS vectors (hash TEXT PRIMARY KEY, v BLOB NOT NULL);
";

/// Words too common to tell memories apart (left out of a query).
const STOPWORDS: &[&str] = &[
    "a", "about", "after", "again", "all", "also", "an", "and", "any", "are", "as", "at", "be",
    "because", "been", "but", "by", "can", "could", "did", "do", "does", "for", "from", "give",
    "had", "has", "have", "he", "her", "here", "his", "how", "i", "if", "in", "into", "is", "it",
    "its", "just", "make", "me", "more", "must", "my", "no", "not", "of", "on", "or", "our",
    "please", "she", "should", "so", "some", "than", "that", "the", "their", "them", "then",
    "there", "these", "they", "this", "to", "us", "was", "we", "were", "what", "when", "where",
    "which", "while", "who", "why", "will", "with", "would", "write", "you", "your",
];

/// What to search.
#[derive(Debug, Clone)]
pub struct Query<'a> {
    pub text: &'a str,
    pub limit: usize,
    /// Cold records too.
    pub all: bool,
    /// Only these kinds (empty: every kind).
    pub kinds: Vec<Kind>,
    /// Only what this agent did or was observed doing (`None`: everyone's).
    pub agent: Option<&'a str>,
    /// Today, in days since the epoch (tiers and recency are relative to it).
    pub today: i64,
    /// Words, meaning, or both (both without an embedder is words only).
    pub mode: Mode,
    /// Only what clearly matches: a record found by its words must have at least half of the
    /// query's words, one found by its meaning a cosine similarity of [`PRECISE_SIMILARITY`].
    /// For context put in front of a model unasked (the unconscious's recall), where a weak
    /// match costs time and misleads.
    pub precise: bool,
    /// Only records that pass these (priority, category, dates).
    pub filter: Filter,
}

/// The cosine similarity (all-MiniLM-L6-v2) a match by meaning needs in a precise search.
pub const PRECISE_SIMILARITY: f32 = 0.5;

/// How a search finds candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// BM25 and vectors, fused by reciprocal rank (BM25 only without an embedder).
    Hybrid,
    Bm25,
    /// Vectors only (nothing without an embedder).
    Vector,
}

/// A found record and its score (higher is better).
#[derive(Debug, Clone)]
pub struct Hit {
    pub record: Record,
    pub score: f64,
    pub tier: &'static str,
}

/// Counts for `flockctl memory stats`.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub files: u64,
    /// `(kind, records)`.
    pub by_kind: Vec<(String, u64)>,
    /// `(tier, records)`: hot, warm, cold.
    pub by_tier: Vec<(String, u64)>,
    pub index_bytes: u64,
    /// Distinct texts of the records, and how many of them have their vectors (search by
    /// meaning finds only those; the rest are embedded in the background, newest first).
    pub texts: u64,
    pub embedded: u64,
}

/// What a sync did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Synced {
    pub files_read: usize,
    pub files_dropped: usize,
    pub records: usize,
}

#[derive(Debug)]
pub struct Index {
    dir: PathBuf,
    conn: Connection,
    #[cfg(feature = "vectors")]
    vectors: Option<Vectors>,
}

/// The embedder and the vectors of every record, kept in memory for the scan (int8: 388 bytes
/// a passage, ~12 MB at 10 000 records of three sentences).
#[cfg(feature = "vectors")]
#[derive(Debug)]
struct Vectors {
    embedder: std::sync::Arc<crate::embed::Embedder>,
    /// Loaded from `vectors` on first use, extended as texts are embedded.
    cache: Option<crate::scan::Matrix>,
}

type Result<T> = std::result::Result<T, String>;

fn err(what: &str) -> impl Fn(rusqlite::Error) -> String + '_ {
    move |e| format!("memory index: {what}: {e}")
}

impl Index {
    /// The index of the memory dir `dir` (`dir/index.db`, created if missing).
    pub fn open(dir: &Path) -> Result<Index> {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let path = dir.join("index.db");
        let conn = Connection::open(&path).map_err(err("open"))?;
        conn.pragma_update(None, "journal_mode", "WAL").map_err(err("WAL"))?;
        conn.pragma_update(None, "synchronous", "NORMAL").map_err(err("synchronous"))?;
        conn.busy_timeout(std::time::Duration::from_secs(5)).map_err(err("busy timeout"))?;
        // The index is rebuildable: an older layout is dropped and rebuilt, never migrated.
        let version: i64 =
            conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(err("version"))?;
        if version != SCHEMA_VERSION {
            conn.execute_batch(
                "DROP TABLE IF EXISTS records_fts; DROP TABLE IF EXISTS records;
                 DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS vectors;",
            )
            .map_err(err("drop an old layout"))?;
            conn.pragma_update(None, "user_version", SCHEMA_VERSION).map_err(err("version"))?;
        }
        conn.execute_batch(SCHEMA).map_err(err("schema"))?;
        Ok(Index {
            dir: dir.to_owned(),
            conn,
            #[cfg(feature = "vectors")]
            vectors: None,
        })
    }

    /// Reads again every file that changed since the last sync, drops the records of files that
    /// are gone. Cheap when nothing changed (one `stat` per file).
    pub fn sync(&mut self) -> Result<Synced> {
        let mut done = Synced::default();
        // Every file of every tier: (path relative to the memory dir, entry).
        let mut on_disk = Vec::new();
        for tier in Tier::ALL {
            for folder in FOLDERS {
                let Ok(entries) = std::fs::read_dir(self.dir.join(tier.prefix()).join(folder))
                else {
                    continue;
                };
                let mut files: Vec<_> = entries
                    .filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "md"))
                    .collect();
                files.sort_by_key(|e| e.file_name());
                for entry in files {
                    let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                        continue;
                    };
                    on_disk.push((format!("{}{folder}/{name}", tier.prefix()), entry));
                }
            }
        }
        let seen: std::collections::HashSet<&str> =
            on_disk.iter().map(|(rel, _)| rel.as_str()).collect();
        let tx = self.conn.transaction().map_err(err("begin"))?;
        // Files that went away first: a file moved to another tier brings its records' ids
        // along, and they must be free when it is read at its new place.
        let known: Vec<String> = {
            let mut stmt = tx.prepare("SELECT path FROM files").map_err(err("files"))?;
            stmt.query_map([], |r| r.get(0))
                .map_err(err("files"))?
                .collect::<std::result::Result<_, _>>()
                .map_err(err("files"))?
        };
        for gone in known.iter().filter(|p| !seen.contains(p.as_str())) {
            tx.execute("DELETE FROM records WHERE path = ?1", [gone]).map_err(err("delete"))?;
            tx.execute("DELETE FROM files WHERE path = ?1", [gone]).map_err(err("delete"))?;
            done.files_dropped += 1;
        }
        {
            for (rel, entry) in &on_disk {
                let rel = rel.clone();
                let Ok(meta) = entry.metadata() else { continue };
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos() as i64);
                let size = meta.len() as i64;
                let known: Option<(i64, i64)> = tx
                    .query_row("SELECT mtime_ns, size FROM files WHERE path = ?1", [&rel], |r| {
                        Ok((r.get(0)?, r.get(1)?))
                    })
                    .optional()
                    .map_err(err("read files"))?;
                if known == Some((mtime, size)) {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(entry.path()) else { continue };
                let records = parse_file(&rel, &text);
                tx.execute("DELETE FROM records WHERE path = ?1", [&rel]).map_err(err("delete"))?;
                {
                    let mut insert = tx
                        .prepare_cached(
                            "INSERT OR IGNORE INTO records (id, hash, kind, date, time, priority, category, agent, path, text)
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                        )
                        .map_err(err("prepare"))?;
                    for r in &records {
                        insert
                            .execute(params![
                                r.id,
                                text_hash(&r.text),
                                r.kind.as_str(),
                                r.date,
                                r.time,
                                r.priority as i64,
                                r.category,
                                r.agent,
                                r.path,
                                r.text
                            ])
                            .map_err(err("insert"))?;
                    }
                }
                tx.execute(
                    "INSERT OR REPLACE INTO files (path, mtime_ns, size) VALUES (?1, ?2, ?3)",
                    params![rel, mtime, size],
                )
                .map_err(err("files"))?;
                done.files_read += 1;
                done.records += records.len();
            }
        }
        tx.commit().map_err(err("commit"))?;
        Ok(done)
    }

    /// Forgets everything and reads every file again. Vectors stay (they depend on the text
    /// alone); those of texts no record has any more go.
    pub fn rebuild(&mut self) -> Result<Synced> {
        self.conn
            .execute_batch("DELETE FROM records; DELETE FROM files; INSERT INTO records_fts(records_fts) VALUES ('rebuild');")
            .map_err(err("clear"))?;
        let synced = self.sync()?;
        self.conn
            .execute("DELETE FROM vectors WHERE hash NOT IN (SELECT hash FROM records)", [])
            .map_err(err("prune vectors"))?;
        Ok(synced)
    }

    /// The best records for `q`, best first: BM25 over the words, and, with an embedder (feature
    /// `vectors`), the cosine similarity of the meaning, fused by reciprocal rank; then boosted by
    /// priority and recency.
    pub fn search(&mut self, q: &Query<'_>) -> Result<Vec<Hit>> {
        let asked = query_words(q.text);
        let words: Vec<(i64, usize)> = match (q.mode, fts_query(q.text)) {
            (Mode::Vector, _) | (_, None) => Vec::new(),
            (_, Some(fts)) => self
                .bm25(&fts, q.agent)?
                .into_iter()
                .map(|(rid, found)| {
                    // A match has at least one of the words, whatever its spelling there.
                    let has = asked.iter().filter(|a| found.iter().any(|f| same_word(a, f)));
                    (rid, has.count().max(usize::from(!found.is_empty())))
                })
                .collect(),
        };
        let terms = asked.len();
        let words: Vec<(i64, usize)> = if q.precise {
            words.into_iter().filter(|(_, has)| has * 2 >= terms.max(1)).collect()
        } else {
            words
        };
        let meaning: Vec<i64> = if q.mode == Mode::Bm25 {
            Vec::new()
        } else {
            self.nearest(q.text, q.agent)?
                .into_iter()
                .filter(|(_, sim)| !q.precise || *sim >= PRECISE_SIMILARITY)
                .map(|(rid, _)| rid)
                .collect()
        };
        let fused = fuse(&words, terms, &meaning);
        // Equal fused scores (one list's first is the other's second, and back) go to the
        // better match of the words: exact words beat a near meaning, and the order is stable.
        let word_rank: HashMap<i64, usize> =
            words.iter().enumerate().map(|(rank, (rid, _))| (*rid, rank)).collect();
        let mut hits = Vec::new();
        for (rid, relevance) in fused {
            let Some(record) = self.record(rid)? else { continue };
            if !q.kinds.is_empty() && !q.kinds.contains(&record.kind) {
                continue;
            }
            if q.agent.is_some_and(|a| record.agent != a) {
                continue;
            }
            let day = days_of(&record.date);
            if !q.filter.passes(&record, day) {
                continue;
            }
            let age = day.map(|d| (q.today - d).max(0));
            let tier = Tier::of_path(&record.path);
            if tier == Tier::Cold && !q.all {
                continue;
            }
            let tier = tier.as_str();
            let priority = match record.priority {
                Priority::High => 1.5,
                Priority::Medium => 1.0,
                Priority::Low => 0.75,
            };
            let recency = age.map_or(0.9, |a| 0.9 + 0.1 * (-(a as f64) / 90.0).exp());
            let by_words = word_rank.get(&rid).copied().unwrap_or(usize::MAX);
            hits.push((
                by_words,
                Hit { score: relevance * 1000.0 * priority * recency, record, tier },
            ));
        }
        hits.sort_by(|(wa, a), (wb, b)| {
            b.score
                .total_cmp(&a.score)
                .then_with(|| wa.cmp(wb))
                .then_with(|| a.record.id.cmp(&b.record.id))
        });
        hits.truncate(q.limit);
        Ok(hits.into_iter().map(|(_, hit)| hit).collect())
    }

    /// The rids of the records nearest in meaning to `text`, best first, with their cosine
    /// similarity (none without an embedder).
    #[cfg(not(feature = "vectors"))]
    fn nearest(&mut self, _text: &str, _agent: Option<&str>) -> Result<Vec<(i64, f32)>> {
        Ok(Vec::new())
    }

    #[cfg(feature = "vectors")]
    fn nearest(&mut self, text: &str, agent: Option<&str>) -> Result<Vec<(i64, f32)>> {
        if self.vectors.is_none() {
            return Ok(Vec::new());
        }
        self.load_vectors()?;
        // With an agent, only the texts of its records are candidates.
        let only: Option<std::collections::HashSet<String>> = match agent {
            None => None,
            Some(a) => {
                let mut stmt = self
                    .conn
                    .prepare_cached("SELECT hash FROM records WHERE agent = ?1")
                    .map_err(err("agent's records"))?;
                let rows = stmt.query_map([a], |r| r.get(0)).map_err(err("agent's records"))?;
                Some(rows.collect::<std::result::Result<_, _>>().map_err(err("agent's records"))?)
            }
        };
        let Some(v) = &self.vectors else { return Ok(Vec::new()) };
        let Some(matrix) = &v.cache else { return Ok(Vec::new()) };
        let query = v.embedder.embed(&[text])?.pop().unwrap_or_default();
        // A record is as near as its nearest passage.
        let scored =
            matrix.nearest(&query, CANDIDATES, |h| only.as_ref().is_none_or(|o| o.contains(h)));
        let mut stmt = self
            .conn
            .prepare_cached("SELECT rid FROM records WHERE hash = ?1")
            .map_err(err("vector hits"))?;
        let mut rids = Vec::new();
        for (sim, hash) in scored {
            let rows =
                stmt.query_map([hash], |r| r.get::<_, i64>(0)).map_err(err("vector hits"))?;
            for rid in rows {
                rids.push((rid.map_err(err("vector hits"))?, sim));
            }
        }
        Ok(rids)
    }

    /// Searches by meaning too from now on (and embeds what is not embedded yet, a batch per
    /// [`Index::sync`]).
    #[cfg(feature = "vectors")]
    pub fn set_embedder(&mut self, embedder: std::sync::Arc<crate::embed::Embedder>) {
        self.vectors = Some(Vectors { embedder, cache: None });
    }

    /// Whether this index searches by meaning (it has an embedder: [`Index::set_embedder`]).
    pub fn by_meaning(&self) -> bool {
        #[cfg(feature = "vectors")]
        return self.vectors.is_some();
        #[cfg(not(feature = "vectors"))]
        false
    }

    #[cfg(feature = "vectors")]
    fn load_vectors(&mut self) -> Result<()> {
        let Some(v) = self.vectors.as_mut() else { return Ok(()) };
        if v.cache.is_some() {
            return Ok(());
        }
        let mut stmt = self.conn.prepare("SELECT hash, v FROM vectors").map_err(err("vectors"))?;
        let mut rows = stmt.query([]).map_err(err("vectors"))?;
        let mut matrix = crate::scan::Matrix::default();
        while let Some(row) = rows.next().map_err(err("vectors"))? {
            let hash: String = row.get(0).map_err(err("vectors"))?;
            let blob = row
                .get_ref(1)
                .map_err(err("vectors"))?
                .as_blob()
                .map_err(|e| format!("memory index: vectors: {e}"))?;
            matrix.push(hash, &from_blob(blob));
        }
        v.cache = Some(matrix);
        Ok(())
    }

    /// Stores vectors computed elsewhere for texts that have none (`f` maps a record's text to
    /// its unit vectors, one per [`passages`] entry, end to end): for importing, and for the
    /// benchmark, which times the search over
    /// 100 000 vectors without spending an hour embedding them. Returns how many it stored.
    #[cfg(feature = "vectors")]
    pub fn import_vectors(&mut self, mut f: impl FnMut(&str) -> Vec<f32>) -> Result<usize> {
        let pending: Vec<(String, String)> = {
            let mut stmt = self
                .conn
                .prepare(
                    "SELECT hash, MIN(text) FROM records WHERE hash NOT IN (SELECT hash FROM vectors)
                     GROUP BY hash",
                )
                .map_err(err("pending vectors"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(err("pending vectors"))?;
            rows.collect::<std::result::Result<_, _>>().map_err(err("pending vectors"))?
        };
        let tx = self.conn.transaction().map_err(err("begin"))?;
        for (hash, text) in &pending {
            tx.execute(
                "INSERT OR REPLACE INTO vectors (hash, v) VALUES (?1, ?2)",
                params![hash, to_blob(&f(text))],
            )
            .map_err(err("store vector"))?;
        }
        tx.commit().map_err(err("commit"))?;
        if let Some(v) = self.vectors.as_mut() {
            v.cache = None;
        }
        Ok(pending.len())
    }

    /// Embeds texts that have no vector yet, newest first, up to `max_passages` passages in all
    /// (at least one text; a text is as slow to embed as it has sentences); returns how many
    /// texts.
    #[cfg(feature = "vectors")]
    pub fn embed_pending(&mut self, max_passages: usize) -> Result<usize> {
        if self.vectors.is_none() {
            return Ok(0);
        }
        self.load_vectors()?;
        let pending: Vec<(String, String)> = {
            let mut stmt = self
                .conn
                .prepare(
                    "SELECT hash, MIN(text) FROM records WHERE hash NOT IN (SELECT hash FROM vectors)
                     GROUP BY hash ORDER BY MAX(rid) DESC LIMIT ?1",
                )
                .map_err(err("pending vectors"))?;
            let rows = stmt
                .query_map([max_passages.max(1) as i64], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(err("pending vectors"))?;
            let mut budget = max_passages;
            let mut pending = Vec::new();
            for row in rows {
                let (hash, text): (String, String) = row.map_err(err("pending vectors"))?;
                let n = passages(&text).len();
                if n > budget && !pending.is_empty() {
                    break;
                }
                budget = budget.saturating_sub(n);
                pending.push((hash, text));
            }
            pending
        };
        let Some(v) = self.vectors.as_mut() else { return Ok(0) };
        let tx = self.conn.transaction().map_err(err("begin"))?;
        // Every passage of every pending text, embedded 16 at a time; a text's vectors are its
        // passages' vectors end to end.
        let passages: Vec<(usize, &str)> = pending
            .iter()
            .enumerate()
            .flat_map(|(i, (_, text))| passages(text).into_iter().map(move |p| (i, p)))
            .collect();
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); pending.len()];
        for batch in passages.chunks(16) {
            let texts: Vec<&str> = batch.iter().map(|(_, p)| *p).collect();
            for ((i, _), vec) in batch.iter().zip(v.embedder.embed(&texts)?) {
                vectors[*i].extend(vec);
            }
        }
        for ((hash, _), vec) in pending.iter().zip(vectors) {
            tx.execute(
                "INSERT OR REPLACE INTO vectors (hash, v) VALUES (?1, ?2)",
                params![hash, to_blob(&vec)],
            )
            .map_err(err("store vector"))?;
            if let Some(cache) = v.cache.as_mut() {
                cache.push(hash.clone(), &vec);
            }
        }
        tx.commit().map_err(err("commit"))?;
        Ok(pending.len())
    }

    /// The rids of the best BM25 matches, best first, each with the words FTS5 matched in it (as
    /// they are written there, lowercased: "migrated" for the query's "migration").
    fn bm25(&self, fts: &str, agent: Option<&str>) -> Result<Vec<(i64, Vec<String>)>> {
        // The join costs a lookup per match (common words match tens of thousands): only when
        // the search is for one agent.
        let sql = match agent {
            None => {
                "SELECT rowid, highlight(records_fts, 0, char(1), char(2)) FROM records_fts
                 WHERE records_fts MATCH ?1 ORDER BY bm25(records_fts) LIMIT ?2"
            }
            Some(_) => {
                "SELECT records_fts.rowid, highlight(records_fts, 0, char(1), char(2))
                 FROM records_fts JOIN records ON records.rid = records_fts.rowid
                 WHERE records_fts MATCH ?1 AND records.agent = ?3
                 ORDER BY bm25(records_fts) LIMIT ?2"
            }
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(err("prepare search"))?;
        let limit = CANDIDATES as i64;
        let rid = |r: &rusqlite::Row<'_>| {
            let marked: String = r.get(1)?;
            let mut found: Vec<String> = marked
                .split('\u{1}')
                .skip(1)
                .filter_map(|m| m.split_once('\u{2}').map(|(word, _)| word.to_lowercase()))
                .collect();
            found.sort_unstable();
            found.dedup();
            Ok((r.get::<_, i64>(0)?, found))
        };
        let rows = match agent {
            None => stmt.query_map(params![fts, limit], rid),
            Some(a) => stmt.query_map(params![fts, limit, a], rid),
        }
        .map_err(err("search"))?;
        rows.collect::<std::result::Result<_, _>>().map_err(err("search"))
    }

    fn record(&self, rid: i64) -> Result<Option<Record>> {
        self.conn
            .prepare_cached(
                "SELECT id, kind, date, time, priority, category, agent, path, text FROM records WHERE rid = ?1",
            )
            .map_err(err("record"))?
            .query_row([rid], row_record)
            .optional()
            .map_err(err("record"))
    }

    /// One record by id.
    pub fn get(&self, id: &str) -> Result<Option<Record>> {
        self.conn
            .query_row(
                "SELECT id, kind, date, time, priority, category, agent, path, text FROM records WHERE id = ?1",
                [id],
                row_record,
            )
            .optional()
            .map_err(err("get"))
    }

    /// The newest records (not journals), newest day first and, within a day, the most important
    /// first: what the dashboard shows before anything is searched.
    pub fn recent(&self, limit: usize, kinds: &[Kind], filter: &Filter) -> Result<Vec<Hit>> {
        self.newest(limit, kinds, filter, false)
    }

    /// Every record that passes, journals too, newest first (`flockctl memory export`).
    pub fn export(&self, kinds: &[Kind], filter: &Filter) -> Result<Vec<Hit>> {
        self.newest(usize::MAX, kinds, filter, true)
    }

    fn newest(
        &self,
        limit: usize,
        kinds: &[Kind],
        filter: &Filter,
        journals: bool,
    ) -> Result<Vec<Hit>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, kind, date, time, priority, category, agent, path, text FROM records
                 WHERE ?1 OR kind != 'journal' ORDER BY date DESC, priority DESC, time DESC, rid DESC",
            )
            .map_err(err("recent"))?;
        let rows = stmt.query_map([journals], row_record).map_err(err("recent"))?;
        let mut hits = Vec::new();
        for row in rows {
            let record = row.map_err(err("recent"))?;
            let day = days_of(&record.date);
            if (!kinds.is_empty() && !kinds.contains(&record.kind)) || !filter.passes(&record, day)
            {
                continue;
            }
            let tier = Tier::of_path(&record.path).as_str();
            hits.push(Hit { record, score: 0.0, tier });
            if hits.len() >= limit {
                break;
            }
        }
        Ok(hits)
    }

    pub fn stats(&self) -> Result<Stats> {
        let count = |sql: &str| -> Result<u64> {
            self.conn
                .query_row(sql, [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(err("stats"))
        };
        let mut stats = Stats { files: count("SELECT COUNT(*) FROM files")?, ..Stats::default() };
        let mut stmt = self
            .conn
            .prepare("SELECT kind, COUNT(*) FROM records GROUP BY kind ORDER BY kind")
            .map_err(err("stats"))?;
        stats.by_kind = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
            .map_err(err("stats"))?
            .collect::<std::result::Result<_, _>>()
            .map_err(err("stats"))?;
        let mut tiers = [(Tier::Hot, 0u64), (Tier::Warm, 0), (Tier::Cold, 0)];
        let mut stmt = self
            .conn
            .prepare("SELECT path, COUNT(*) FROM records GROUP BY path")
            .map_err(err("stats"))?;
        let files = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)? as u64)))
            .map_err(err("stats"))?;
        for row in files {
            let (path, n) = row.map_err(err("stats"))?;
            let t = Tier::of_path(&path);
            if let Some(slot) = tiers.iter_mut().find(|(tier, _)| *tier == t) {
                slot.1 += n;
            }
        }
        stats.by_tier = tiers.iter().map(|(t, n)| (t.as_str().to_string(), *n)).collect();
        stats.texts = count("SELECT COUNT(DISTINCT hash) FROM records")?;
        stats.embedded = count(
            "SELECT COUNT(DISTINCT hash) FROM records WHERE hash IN (SELECT hash FROM vectors)",
        )?;
        stats.index_bytes = ["index.db", "index.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(self.dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        Ok(stats)
    }
}

impl Index {
    /// `active_memory.md`: what matters most now, within `max_chars` — every hot or warm
    /// observation, reflection and knowledge section ranked by priority and recency (journals
    /// are the workers' logs, not memory), best first. Empty when there is nothing to keep.
    pub fn active_memory(&self, today: i64, max_chars: usize, updated: &str) -> Result<String> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT id, kind, date, time, priority, category, agent, path, text FROM records
                 WHERE kind != 'journal'",
            )
            .map_err(err("active memory"))?;
        let rows = stmt.query_map([], row_record).map_err(err("active memory"))?;
        let mut ranked: Vec<(f64, Record)> = Vec::new();
        for row in rows {
            let r = row.map_err(err("active memory"))?;
            if Tier::of_path(&r.path) != Tier::Hot {
                continue;
            }
            let age = days_of(&r.date).map(|d| (today - d).max(0));
            let weight = match r.priority {
                Priority::High => 3.0,
                Priority::Medium => 1.0,
                Priority::Low => 0.3,
            };
            let recency = age.map_or(0.5, |a| (-(a as f64) / 30.0).exp());
            // Reflections and knowledge are already condensed: they count double.
            let kind = if r.kind == Kind::Observation { 1.0 } else { 2.0 };
            ranked.push((weight * kind * (0.2 + recency), r));
        }
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| b.1.date.cmp(&a.1.date)));
        // The header (its figures included) fits in this many characters.
        const HEADER: usize = 320;
        let budget = max_chars.saturating_sub(HEADER);
        let mut body = String::new();
        let (mut counts, mut first, mut last) = ([0usize; 3], String::new(), String::new());
        for (_, r) in ranked {
            let category =
                if r.category.is_empty() { String::new() } else { format!(" [{}]", r.category) };
            let line = format!(
                "- {} {}{category}: {}\n",
                r.date,
                r.priority.as_str(),
                r.text.replace('\n', " ")
            );
            if body.len() + line.len() > budget {
                continue;
            }
            body.push_str(&line);
            counts[match r.kind {
                Kind::Observation => 0,
                Kind::Reflection => 1,
                _ => 2,
            }] += 1;
            if first.is_empty() || r.date < first {
                first = r.date.clone();
            }
            if r.date > last {
                last = r.date;
            }
        }
        if body.is_empty() {
            return Ok(String::new());
        }
        let n = counts.iter().sum::<usize>();
        let header = format!(
            "# Active memory\n\n> Last updated: {updated}\n> Tokens: ~{} (characters ÷ 4; at most {})\n\
             > Records: {n} ({} observations, {} reflections, {} knowledge)\n> Period: {first} … {last}\n\n\
             What matters most now, best first (rebuilt from the memory files; do not edit).\n\n",
            // The header's own characters counted as about HEADER.
            (body.len() + HEADER).div_ceil(4),
            max_chars / 4,
            counts[0],
            counts[1],
            counts[2],
        );
        Ok(header + &body)
    }
}

/// A `records` row (`id, kind, date, time, priority, category, agent, path, text`) as a
/// [`Record`].
fn row_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<Record> {
    Ok(Record {
        id: r.get(0)?,
        kind: Kind::parse(&r.get::<_, String>(1)?).unwrap_or(Kind::Observation),
        date: r.get(2)?,
        time: r.get(3)?,
        priority: Priority::from_level(r.get(4)?),
        category: r.get(5)?,
        agent: r.get(6)?,
        path: r.get(7)?,
        text: r.get(8)?,
    })
}

/// Reciprocal rank fusion (k = [`RRF_K`]) of the matches of the words (each with how many of the
/// query's `terms` words it has) and of the meaning; a list alone keeps its own order. A match
/// of the words counts by the share of the query's words it has (Lucene's classic `coord`): a
/// record with one word of four ("apartment" for "how much do I pay for my apartment now?") is
/// weak evidence beside a near meaning; one with all of them is not.
fn fuse(words: &[(i64, usize)], terms: usize, meaning: &[i64]) -> HashMap<i64, f64> {
    let mut fused: HashMap<i64, f64> = HashMap::new();
    for (rank, (rid, matched)) in words.iter().enumerate() {
        let coord = if meaning.is_empty() {
            1.0
        } else {
            (*matched).min(terms) as f64 / terms.max(1) as f64
        };
        *fused.entry(*rid).or_default() += coord / (RRF_K + rank as f64 + 1.0);
    }
    for (rank, rid) in meaning.iter().enumerate() {
        *fused.entry(*rid).or_default() += 1.0 / (RRF_K + rank as f64 + 1.0);
    }
    fused
}

/// The words of a query that are searched for: lowercased, two characters or more, no stopwords,
/// each once.
fn query_words(text: &str) -> Vec<String> {
    let mut words: Vec<String> = text
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| w.chars().count() >= 2 && !STOPWORDS.contains(&w.as_str()))
        .collect();
    words.sort();
    words.dedup();
    words
}

/// Whether a word FTS5 matched in a record (`found`, as written there) is the query's word
/// `asked`: the stemmer matched them, so a shared start of four letters (or all of the shorter
/// one) says which query word it was ("migrated" for "migration", "dogs" for "dog").
fn same_word(asked: &str, found: &str) -> bool {
    let shared = asked.chars().zip(found.chars()).take_while(|(a, b)| a == b).count();
    shared >= asked.chars().count().min(found.chars().count()).min(4)
}

/// An FTS5 query from free text: its significant words, each quoted, OR-ed (BM25 ranks records
/// with more of them higher). `None` if no word is left.
fn fts_query(text: &str) -> Option<String> {
    let words = query_words(text);
    (!words.is_empty())
        .then(|| words.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(" OR "))
}

/// Words a passage has at least (a shorter sentence joins the one before it: "Yes." alone means
/// nothing).
#[cfg(feature = "vectors")]
const PASSAGE_MIN_WORDS: usize = 4;
/// Words a passage has at most (the model reads 256 word pieces, about 180 words).
#[cfg(feature = "vectors")]
const PASSAGE_MAX_WORDS: usize = 120;

/// The passages of a record that are embedded, each on its own: its sentences (split after
/// `.`, `!`, `?` before a space, and at line ends), short ones joined to the one before, long
/// ones cut at [`PASSAGE_MAX_WORDS`]. A whole record's vector is an average that a filler
/// sentence dilutes; a question matches the sentence that answers it, so a record is as near
/// as its nearest passage.
#[cfg(feature = "vectors")]
pub fn passages(text: &str) -> Vec<&str> {
    let words = |(s, e): (usize, usize)| text[s..e].split_whitespace().count();
    // The sentences, as trimmed byte ranges.
    let mut sentences = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    for i in 0..=bytes.len() {
        let end = match bytes.get(i) {
            None | Some(b'\n') => i,
            Some(b'.' | b'!' | b'?') if bytes.get(i + 1).is_some_and(u8::is_ascii_whitespace) => {
                i + 1
            }
            _ => continue,
        };
        let piece = &text[start..end];
        let lead = piece.len() - piece.trim_start().len();
        if !piece.trim().is_empty() {
            sentences.push((start + lead, start + lead + piece.trim().len()));
        }
        start = if bytes.get(i) == Some(&b'\n') { i + 1 } else { end };
    }
    // Short ones joined to the one before (or the first to the second).
    let mut joined: Vec<(usize, usize)> = Vec::new();
    for span in sentences {
        match joined.last_mut() {
            Some(last) if words(span) < PASSAGE_MIN_WORDS || words(*last) < PASSAGE_MIN_WORDS => {
                last.1 = span.1;
            }
            _ => joined.push(span),
        }
    }
    // Long ones cut every PASSAGE_MAX_WORDS words.
    let mut out = Vec::new();
    for (s, e) in joined {
        let mut count = 0;
        let mut from = s;
        let mut in_word = false;
        for (i, c) in text[s..e].char_indices() {
            if c.is_whitespace() {
                if in_word && count == PASSAGE_MAX_WORDS {
                    out.push(&text[from..s + i]);
                    from = s + i;
                    count = 0;
                }
                in_word = false;
            } else if !in_word {
                in_word = true;
                count += 1;
            }
        }
        let rest = text[from..e].trim();
        if !rest.is_empty() {
            out.push(rest);
        }
    }
    out.iter().map(|p| p.trim()).collect()
}

#[cfg(feature = "vectors")]
fn to_blob(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(feature = "vectors")]
fn from_blob(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// FNV-1a (64 bits) of a record's text, as hex: the key of its vector. Stable across builds,
/// unlike `std`'s hasher.
fn text_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Today in days since the epoch, from the system clock.
pub fn today() -> i64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64 / 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "vectors")]
    #[test]
    fn a_record_is_embedded_sentence_by_sentence_short_ones_joined_long_ones_cut() {
        assert_eq!(
            passages(
                "The dentist moved my appointment to Monday. Ok! I need to renew my passport soon.\nWe talked about the weather today"
            ),
            vec![
                "The dentist moved my appointment to Monday. Ok!",
                "I need to renew my passport soon.",
                "We talked about the weather today"
            ]
        );
        // A lone short text is one passage; version numbers and e.g. do not cut.
        assert_eq!(passages("  Yes.  "), vec!["Yes."]);
        assert_eq!(passages("Upgrade to v2.1 now please"), vec!["Upgrade to v2.1 now please"]);
        assert!(passages(" \n ").is_empty());
        let long = vec!["word"; PASSAGE_MAX_WORDS * 2 + 3].join(" ");
        let cut = passages(&long);
        assert_eq!(
            cut.iter().map(|p| p.split_whitespace().count()).collect::<Vec<_>>(),
            [PASSAGE_MAX_WORDS, PASSAGE_MAX_WORDS, 3]
        );
    }

    /// `stats` says how many texts have their vectors: what a person watches while a backlog is
    /// embedded in the background (vectors imported here: no model needed).
    #[cfg(feature = "vectors")]
    #[test]
    fn stats_count_the_texts_and_those_embedded() {
        let dir = tempfile::tempdir().unwrap();
        let text = obs("09:00", "a", "The dentist moved to Monday.", "")
            + &obs("09:30", "b", "Ana prefers tea.", "")
            + &obs("10:00", "c", "Ana prefers tea.", "");
        write(dir.path(), "observations/2026-11-20.md", &text);
        let mut index = Index::open(dir.path()).unwrap();
        index.sync().unwrap();
        let stats = index.stats().unwrap();
        // Two records with the same words are one text (one vector serves both).
        assert_eq!((stats.texts, stats.embedded), (2, 0));
        assert!(!index.by_meaning());
        let unit = |t: &str| {
            let mut v = vec![0.0; crate::embed::DIM * passages(t).len()];
            v.iter_mut().step_by(crate::embed::DIM).for_each(|x| *x = 1.0);
            v
        };
        assert_eq!(index.import_vectors(unit).unwrap(), 2);
        let stats = index.stats().unwrap();
        assert_eq!((stats.texts, stats.embedded), (2, 2));
    }

    fn write(dir: &Path, rel: &str, text: &str) {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn obs(time: &str, id: &str, text: &str, extra: &str) -> String {
        format!("## {time}\n{text}\n<!-- id: {id} -->\n{extra}---\n\n")
    }

    fn ids(hits: &[Hit]) -> Vec<&str> {
        hits.iter().map(|h| h.record.id.as_str()).collect()
    }

    fn query<'a>(text: &'a str, today: &str) -> Query<'a> {
        Query {
            text,
            limit: 10,
            all: false,
            kinds: Vec::new(),
            agent: None,
            today: days_of(today).unwrap(),
            mode: Mode::Hybrid,
            precise: false,
            filter: Filter::default(),
        }
    }

    #[test]
    fn filters_keep_records_of_at_least_a_priority_of_a_category_and_within_dates() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let tags = |p: &str, c: &str| format!("<!-- priority: {p}; category: {c} -->\n");
        write(
            d,
            "observations/2026-11-10.md",
            &(obs("09:00", "old-high", "The van rental is booked.", &tags("high", "decision"))
                + &obs("10:00", "old-low", "The van rental was discussed.", &tags("low", "fact"))),
        );
        write(
            d,
            "observations/2026-11-20.md",
            &(obs("09:00", "new-med", "The van rental is cheaper now.", &tags("medium", "fact"))
                + &obs(
                    "10:00",
                    "new-high",
                    "The van rental moved to May.",
                    &tags("high", "Decision"),
                )),
        );
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let mut found = |filter: Filter| {
            let q = Query { filter, ..query("van rental", "2026-11-25") };
            let mut got: Vec<String> =
                index.search(&q).unwrap().into_iter().map(|h| h.record.id).collect();
            got.sort();
            got
        };
        let parse = |p, c, s, u| Filter::parse(p, c, s, u).unwrap();
        assert_eq!(found(Filter::default()).len(), 4);
        assert_eq!(found(parse(Some("high"), None, None, None)), ["new-high", "old-high"]);
        assert_eq!(
            found(parse(Some("medium"), None, None, None)),
            ["new-high", "new-med", "old-high"]
        );
        assert_eq!(found(parse(None, Some("decision"), None, None)), ["new-high", "old-high"]);
        assert_eq!(found(parse(None, None, Some("2026-11-15"), None)), ["new-high", "new-med"]);
        assert_eq!(found(parse(None, None, None, Some("2026-11-10"))), ["old-high", "old-low"]);
        assert_eq!(
            found(parse(Some("high"), None, Some("2026-11-20"), Some("2026-11-20"))),
            ["new-high"]
        );
        // Mistakes are named, with what to write instead.
        let err = |p, c, s, u| Filter::parse(p, c, s, u).unwrap_err();
        assert!(err(Some("urgent"), None, None, None).contains("priorities: low, medium, high"));
        assert!(err(None, None, Some("2026-02-31"), None).contains("write YYYY-MM-DD"));
        assert!(err(None, None, Some("last week"), None).contains("`since` \"last week\""));
        assert!(err(None, None, Some("2026-11-20"), Some("2026-11-01")).contains("after `until`"));
    }

    #[test]
    fn recent_lists_the_newest_day_first_most_important_first_without_journals() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let p = |level: &str| format!("<!-- priority: {level} -->\n");
        write(d, "observations/2026-11-20.md", &obs("09:00", "old", "An older fact.", &p("high")));
        write(
            d,
            "observations/2026-11-24.md",
            &(obs("09:00", "low", "A small thing.", &p("low"))
                + &obs("10:00", "high", "A decision.", &p("high"))
                + &obs("11:00", "med", "A plan.", &p("medium"))),
        );
        write(d, "journals/2026-11-24.md", "09:00 | a | b | c\n");
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let ids = |hits: Vec<Hit>| hits.into_iter().map(|h| h.record.id).collect::<Vec<_>>();
        let all = index.recent(10, &[], &Filter::default()).unwrap();
        assert!(all.iter().all(|h| h.tier == "hot"));
        assert_eq!(ids(all), ["high", "med", "low", "old"]);
        assert_eq!(ids(index.recent(2, &[], &Filter::default()).unwrap()), ["high", "med"]);
        let high = Filter::parse(Some("high"), None, None, None).unwrap();
        assert_eq!(ids(index.recent(10, &[], &high).unwrap()), ["high", "old"]);
        let knowledge = index.recent(10, &[Kind::Knowledge], &Filter::default()).unwrap();
        assert!(knowledge.is_empty());
        // An export has the journals too.
        let all = index.export(&[], &Filter::default()).unwrap();
        assert_eq!(all.len(), 5);
        assert!(all.iter().any(|h| h.record.kind == Kind::Journal));
    }

    #[test]
    fn a_precise_search_leaves_out_what_shares_a_word_or_two_with_the_question() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "observations/2026-11-20.md",
            &(obs("09:00", "a", "Dana asked how many boxes the van holds; twelve.", "")
                + &obs("10:00", "b", "The dentist appointment is on Friday at 15:00.", "")),
        );
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        // One word of three ("many") is a match, not a clear one.
        let loose = index.search(&query("How many days in a week?", "2026-11-25")).unwrap();
        assert_eq!(ids(&loose), ["a"]);
        let mut q = query("How many days in a week?", "2026-11-25");
        q.precise = true;
        assert!(index.search(&q).unwrap().is_empty());
        // Half the words or more: found either way.
        let mut q = query("When is the dentist appointment?", "2026-11-25");
        q.precise = true;
        assert_eq!(ids(&index.search(&q).unwrap()), ["b"]);
    }

    #[test]
    fn a_search_for_one_agent_finds_only_what_it_did_or_was_seen_doing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "observations/2026-11-20.md",
            &(obs("09:00", "a", "Deployed the login service.", "<!-- agent: worker-1 -->\n")
                + &obs(
                    "10:00",
                    "b",
                    "Deployed the billing service.",
                    "<!-- priority: high; agent: worker-2 -->\n",
                )
                + &obs("11:00", "c", "Deployed the docs.", "")),
        );
        write(
            d,
            "journals/2026-11-20.md",
            "12:00 | deploy search | ran deploy | ok <!-- id: j1; agent: worker-1 -->\n",
        );
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let everyone = index.search(&query("deployed deploy", "2026-11-25")).unwrap();
        assert_eq!(everyone.len(), 4);
        let mut q = query("deployed deploy", "2026-11-25");
        q.agent = Some("worker-1");
        let mut found =
            ids(&index.search(&q).unwrap()).into_iter().map(str::to_owned).collect::<Vec<_>>();
        found.sort();
        assert_eq!(found, ["a", "j1"]);
        q.agent = Some("worker-2");
        let hits = index.search(&q).unwrap();
        assert_eq!((ids(&hits), hits[0].record.agent.as_str()), (vec!["b"], "worker-2"));
        q.agent = Some("nobody");
        assert!(index.search(&q).unwrap().is_empty());
    }

    #[test]
    fn search_finds_by_words_ranks_by_priority_and_follows_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "observations/2026-11-20.md",
            &(obs("09:00", "a", "The staging database runs on port 5433.", "")
                + &obs(
                    "10:00",
                    "b",
                    "Ana wants the staging database backed up nightly.",
                    "<!-- priority: high; category: task -->\n",
                )
                + &obs("11:00", "c", "Lunch was late.", "")),
        );
        let mut index = Index::open(d).unwrap();
        assert_eq!(index.sync().unwrap(), Synced { files_read: 1, files_dropped: 0, records: 3 });
        let hits = index.search(&query("staging database?", "2026-11-25")).unwrap();
        assert_eq!(ids(&hits), ["b", "a"], "the high-priority one first");
        assert_eq!(hits[0].record.category, "task");
        // Porter stemming: "backing" finds "backed".
        assert_eq!(ids(&index.search(&query("backing", "2026-11-25")).unwrap()), ["b"]);

        // Nothing changed: nothing read. A file that grows is read again; one that goes, goes.
        assert_eq!(index.sync().unwrap().files_read, 0);
        write(
            d,
            "knowledge/ports.md",
            "# Ports\n\nStaging uses 5433.\n\nLast updated: 2026-11-21 08:00\n",
        );
        assert_eq!(index.sync().unwrap().files_read, 1);
        assert_eq!(index.search(&query("5433", "2026-11-25")).unwrap().len(), 2);
        std::fs::remove_file(d.join("observations/2026-11-20.md")).unwrap();
        assert_eq!(index.sync().unwrap().files_dropped, 1);
        assert_eq!(
            ids(&index.search(&query("5433", "2026-11-25")).unwrap()),
            ["knowledge/ports.md#0"]
        );
    }

    #[test]
    fn rebuild_from_the_files_gives_the_same_answers() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for day in 1..=9 {
            let text: String = (0..20)
                .map(|i| {
                    obs(
                        "09:00",
                        &format!("{day}-{i}"),
                        &format!("note {i} about topic{} and day{day}", i % 5),
                        "",
                    )
                })
                .collect();
            write(d, &format!("observations/2026-11-0{day}.md"), &text);
        }
        let answers = |index: &mut Index| -> Vec<Vec<String>> {
            ["topic3", "day4 topic1", "note 7"]
                .iter()
                .map(|q| {
                    let hits = index.search(&query(q, "2026-11-25")).unwrap();
                    ids(&hits).iter().map(|s| s.to_string()).collect()
                })
                .collect()
        };
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let before = answers(&mut index);
        drop(index);
        std::fs::remove_file(d.join("index.db")).unwrap();
        let _ = std::fs::remove_file(d.join("index.db-wal"));
        let mut index = Index::open(d).unwrap();
        assert_eq!(index.rebuild().unwrap().records, 180);
        assert_eq!(before, answers(&mut index));
        assert!(!before[0].is_empty());
    }

    #[test]
    fn cold_records_leave_the_default_scope_but_stay_searchable() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "observations/2026-11-01.md", &obs("09:00", "new", "Acme shipped late.", ""));
        write(d, "observations/2025-01-10.md", &obs("09:00", "old", "The vendor is Acme.", ""));
        write(d, "journals/2025-01-10.md", "09:00 | call Acme | called | ok\n");
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let journal_id = "journals/2025-01-10.md#0";
        assert!(index.get(journal_id).unwrap().is_some());
        let q = query("acme", "2026-11-25");
        // Where a file lives is its tier: old but not moved yet, it is hot.
        let hits = index.search(&q).unwrap();
        assert_eq!(hits.iter().find(|h| h.record.id == "old").map(|h| h.tier), Some("hot"));
        // Moved to warm (the TTL job), it is warm and in scope, under the same ids.
        let memory = crate::files::Memory::new(d);
        let from = |tier| crate::tiers::Pick { from: vec![tier], since: None, until: None };
        let old = crate::tiers::Pick { until: days_of("2025-12-31"), ..from(Tier::Hot) };
        crate::tiers::move_days(&memory, &old, Tier::Warm, false).unwrap();
        index.sync().unwrap();
        let hits = index.search(&q).unwrap();
        assert_eq!(hits.iter().find(|h| h.record.id == "old").map(|h| h.tier), Some("warm"));
        assert_eq!(
            index.get(journal_id).unwrap().map(|r| r.path),
            Some("warm/journals/2025-01-10.md".into())
        );
        // Moved to cold (a person approved): out of the default scope, found with `all`.
        crate::tiers::move_days(&memory, &from(Tier::Warm), Tier::Cold, false).unwrap();
        index.sync().unwrap();
        let hits = index.search(&q).unwrap();
        assert_eq!(ids(&hits), ["new"]);
        assert_eq!(hits[0].tier, "hot");
        let hits = index.search(&Query { all: true, ..q.clone() }).unwrap();
        assert_eq!(ids(&hits), ["new", "old", journal_id]);
        assert_eq!(hits[1].tier, "cold");
        let stats = index.stats().unwrap();
        assert_eq!(stats.by_tier, [("hot".to_string(), 1), ("warm".into(), 0), ("cold".into(), 2)]);
    }

    #[test]
    fn active_memory_keeps_what_matters_most_within_its_budget() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut text = String::new();
        for i in 0..50 {
            text += &obs("09:00", &format!("m{i}"), &format!("medium fact number {i}"), "");
        }
        text += &obs(
            "10:00",
            "h",
            "Ana decided to ship on Fridays.",
            "<!-- priority: high; category: decision -->\n",
        );
        write(d, "observations/2026-11-24.md", &text);
        write(
            d,
            "warm/observations/2024-01-01.md",
            &obs("09:00", "cold", "An old vendor.", "<!-- priority: high -->\n"),
        );
        write(d, "journals/2026-11-24.md", "09:00 | a | b | c\n");
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        let today = days_of("2026-11-25").unwrap();
        let active = index.active_memory(today, 800, "2026-11-25 10:00 UTC").unwrap();
        assert!(active.len() <= 800, "{}", active.len());
        // The header says when, how big, how many and over which days.
        let items = active.lines().filter(|l| l.starts_with("- ")).count();
        assert!(active.starts_with("# Active memory\n\n> Last updated: 2026-11-25 10:00 UTC\n"));
        let tokens: usize = active
            .lines()
            .find_map(|l| l.strip_prefix("> Tokens: ~"))
            .and_then(|l| l.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect("a token count");
        assert!(tokens >= active.len() / 4 && tokens <= 200, "{tokens} for {}", active.len());
        assert!(active.contains(&format!("> Records: {items} ({items} observations,")), "{active}");
        assert!(active.contains("> Period: 2026-11-24 … 2026-11-24\n"), "{active}");
        let first = active.lines().find(|l| l.starts_with("- ")).unwrap();
        assert!(first.contains("high [decision]: Ana decided to ship on Fridays."), "{active}");
        assert!(!active.contains("old vendor"), "only hot records make active memory: {active}");
        assert!(!active.contains("| a |"), "journals are not memory: {active}");
        assert!(active.contains("medium fact number"));
        let empty = Index::open(&d.join("empty")).unwrap();
        assert_eq!(empty.active_memory(today, 800, "now").unwrap(), "");
    }

    /// Runs only where `scripts/setup` fetched the embedding model.
    #[cfg(feature = "vectors")]
    #[test]
    fn a_question_in_other_words_is_found_by_meaning_and_vectors_outlive_a_rebuild() {
        let Some(model) = crate::embed::installed_dir() else {
            eprintln!("skipped: no embedding model (scripts/setup fetches it)");
            return;
        };
        let embedder = std::sync::Arc::new(crate::embed::Embedder::load(&model).unwrap());
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(
            d,
            "observations/2026-11-20.md",
            &(obs("09:00", "dentist", "The dentist moved my appointment to Thursday.", "")
                + &obs("10:00", "printer", "The printer on the second floor jams again.", "")
                + &obs("11:00", "teeth", "I should floss more.", "")),
        );
        let mut index = Index::open(d).unwrap();
        index.sync().unwrap();
        index.set_embedder(embedder.clone());
        assert_eq!(index.embed_pending(1).unwrap(), 1, "the budget counts passages");
        assert_eq!(index.embed_pending(100).unwrap(), 2);
        assert_eq!(index.embed_pending(100).unwrap(), 0, "each text once");
        let q = |mode| Query { mode, ..query("When is my dental check-up?", "2026-11-25") };
        assert!(index.search(&q(Mode::Bm25)).unwrap().is_empty(), "no shared word");
        assert_eq!(ids(&index.search(&q(Mode::Vector)).unwrap())[0], "dentist");
        assert_eq!(ids(&index.search(&q(Mode::Hybrid)).unwrap())[0], "dentist");
        // The vectors are keyed by text: a rebuild finds them all again, nothing is embedded twice.
        index.rebuild().unwrap();
        assert_eq!(index.embed_pending(100).unwrap(), 0);
        assert_eq!(ids(&index.search(&q(Mode::Hybrid)).unwrap())[0], "dentist");
    }

    #[test]
    fn a_match_of_one_word_of_four_weighs_less_than_a_near_meaning() {
        // Record 1 is the words' first match with one of the query's four words, and tenth by
        // meaning; record 2 is the meaning's first and has none of the words.
        let meaning: Vec<i64> = [2, 3, 4, 5, 6, 7, 8, 9, 10, 1].into();
        let best = |fused: HashMap<i64, f64>| {
            fused.into_iter().max_by(|a, b| a.1.total_cmp(&b.1)).map(|(rid, _)| rid)
        };
        assert_eq!(best(fuse(&[(1, 1)], 4, &meaning)), Some(2), "one word of four");
        assert_eq!(best(fuse(&[(1, 4)], 4, &meaning)), Some(1), "all four words");
        // A word FTS5 matched counts for the query word it stems from, once.
        assert!(same_word("migration", "migrated") && same_word("dog", "dogs"));
        assert!(same_word("name", "named") && !same_word("rent", "renovated"));
        // Words alone keep their order whatever they cover.
        let alone = fuse(&[(1, 1), (2, 4)], 4, &[]);
        assert!(alone[&1] > alone[&2]);
    }

    #[test]
    fn queries_of_only_stopwords_or_punctuation_find_nothing() {
        assert_eq!(fts_query("what is the?"), None);
        assert_eq!(fts_query("\"; DROP TABLE x --").as_deref(), Some("\"drop\" OR \"table\""));
    }
}
