//! Retrieval quality on a LongMemEval-style fixture (issue #10): chat sessions with timestamps,
//! questions, and the ids of the sessions that hold each answer ("evidence"). The fixture is
//! generated here, deterministically from [`SEED`]: 120 questions, each with its own haystack of
//! 50 sessions over 300 days (6 000 sessions). In a haystack one session states the fact; of the
//! others, half carry a distractor that shares the question's words about something else and
//! half state other facts. Nine templates in twelve share a word or two with their question, as
//! people's questions do; three share none ("dental check-up" for "dentist"): those are what
//! vectors are for. Each session is indexed as one observation; recall@k is the share of
//! questions whose evidence session is among the first k results of a search of its haystack.
//!
//! Then the same for eight held-out templates the fusion was not tuned on (80 questions, their
//! own seed), reported apart (`recall_heldout_*`).
//!
//! `flock-bench --only recall --keep` leaves the fixture as `longmemeval-fixture.json` (the
//! LongMemEval layout: `haystack_sessions`, `haystack_dates`, `question`, `answer_session_ids`).

use std::path::Path;

use anyhow::{Result, anyhow};
use std::sync::Arc;
use std::time::Instant;

use flock_memory::embed::Embedder;
use flock_memory::index::{Index, Mode, Query};
use flock_memory::records::{date_of, days_of};
use serde_json::{Map, Value, json};

/// The fixture's seed: the same seed, the same fixture.
pub const SEED: u64 = 20_261_125;
const QUESTIONS: usize = 120;
const DAYS: i64 = 300;

/// A fact template: what the person says (`{x}` is the varying detail), the question that asks
/// for it later, and distractor lines that share the question's words.
struct Template {
    fact: &'static str,
    question: &'static str,
    distractor: &'static str,
}

const TEMPLATES: &[Template] = &[
    // Most questions share a word or two with what was said, as people's questions do …
    Template {
        fact: "I finally adopted a dog, we named him {x}.",
        question: "What did I name my dog?",
        distractor: "My neighbour's dog barks all night long.",
    },
    Template {
        fact: "My sister {x} is getting married in June.",
        question: "When is my sister getting married?",
        distractor: "My sister called about the holidays.",
    },
    Template {
        fact: "I switched our billing service to {x} last week.",
        question: "What does the billing service run on now?",
        distractor: "The billing dashboard was slow again today.",
    },
    Template {
        fact: "I'm training for the {x} marathon in the spring.",
        question: "Which marathon am I training for?",
        distractor: "Training in the rain is not fun.",
    },
    Template {
        fact: "I bought a {x} laptop for the team.",
        question: "Which laptop did I get for the team?",
        distractor: "My laptop battery dies quickly.",
    },
    Template {
        fact: "The flight to {x} leaves at 7 in the morning.",
        question: "Where does my flight go?",
        distractor: "The flight attendant spilled coffee.",
    },
    Template {
        fact: "We chose {x} as the name for the new product.",
        question: "What name did we give the new product?",
        distractor: "Naming a product is hard, marketing says.",
    },
    Template {
        fact: "I'm allergic to {x}, please remember that.",
        question: "What am I allergic to?",
        distractor: "Spring allergies are the worst.",
    },
    Template {
        fact: "The quarterly budget was capped at {x} dollars.",
        question: "What is the cap on the quarterly budget?",
        distractor: "Finance wants the budget report by Friday.",
    },
    // … and some only in other words (a question about "my pet" when the session said "dog").
    Template {
        fact: "The dentist moved my appointment to {x}.",
        question: "When is my dental check-up?",
        distractor: "I should floss more, my teeth hurt.",
    },
    Template {
        fact: "Our new office is on {x} street, third floor.",
        question: "Where is the workplace we moved to?",
        distractor: "The office coffee machine is broken.",
    },
    Template {
        fact: "My daughter started violin lessons with teacher {x}.",
        question: "Who teaches my kid music?",
        distractor: "The school concert was lovely.",
    },
];

/// Templates the fusion was not tuned on (RRF's k was chosen on [`TEMPLATES`]): a check that it
/// holds beyond them. Four share words with their question, four do not — and there the
/// distractor shares the question's words instead, so words point the wrong way.
const HELD_OUT: &[Template] = &[
    Template {
        fact: "My car is in the shop until {x}.",
        question: "When will my car be back from the shop?",
        distractor: "Car insurance renewal is due soon.",
    },
    Template {
        fact: "Our cabin's wifi network is called {x}.",
        question: "What is the cabin wifi network called?",
        distractor: "The wifi at the office drops every afternoon.",
    },
    Template {
        fact: "I'm reading a novel by {x} this month.",
        question: "Which novel am I reading?",
        distractor: "Reading before bed helps me sleep.",
    },
    Template {
        fact: "The kickoff meeting with the client moved to {x}.",
        question: "When is the client kickoff meeting?",
        distractor: "The client sent another long email.",
    },
    Template {
        fact: "My landlord raised the rent to {x} a month.",
        question: "How much do I pay for my apartment now?",
        distractor: "The apartment next door is being renovated.",
    },
    Template {
        fact: "I started taking {x} lessons on Saturday mornings.",
        question: "What hobby did I pick up for the weekends?",
        distractor: "Weekends are usually busy with chores.",
    },
    Template {
        fact: "The vet said our cat {x} needs a special diet.",
        question: "What did the animal doctor say about my pet?",
        distractor: "My pet fish died last year.",
    },
    Template {
        fact: "We hired {x} as the new backend engineer.",
        question: "Who joined the team to work on the server side?",
        distractor: "The team lunch is on Friday.",
    },
];

/// The held-out fixture's seed and size.
const HELD_OUT_SEED: u64 = 20_261_126;
const HELD_OUT_QUESTIONS: usize = 80;

const DETAILS: &[&str] = &[
    "Rex",
    "Luna",
    "Milo",
    "Postgres",
    "CockroachDB",
    "Clara",
    "Nora",
    "Boston",
    "Berlin",
    "Lisbon",
    "Oak",
    "Maple",
    "Lenovo",
    "Framework",
    "Dell",
    "Ana",
    "Marta",
    "Orbit",
    "Nimbus",
    "peanuts",
    "shellfish",
    "40000",
    "75000",
    "Tokyo",
    "Oslo",
    "Thursday",
    "Monday",
    "Valencia",
    "Kyoto",
    "Ruby",
    "Pepper",
    "Apex",
];

const FILLER: &[&str] = &[
    "We talked about the weather and the weekend plans.",
    "I asked for a recipe with lentils and lemon.",
    "The meeting ran long and nobody took notes.",
    "I need to renew my passport before travelling.",
    "Can you summarise this article about batteries?",
    "We reviewed the release notes for version two.",
    "My back hurts after gardening all afternoon.",
    "The printer on the second floor jams again.",
    "I watched a documentary about octopuses.",
    "Help me write a polite email to the landlord.",
];

struct Session {
    id: String,
    day: i64,
    text: String,
}

/// One question and its own haystack (as in LongMemEval, each question is asked of its own
/// history): the evidence session and [`PER_QUESTION`] − 1 others.
struct Case {
    question: String,
    evidence: String,
    sessions: Vec<Session>,
}

/// Sessions in each question's haystack.
const PER_QUESTION: usize = 50;

/// `questions` cases over `templates`, from `seed`.
fn generate(templates: &[Template], seed: u64, questions: usize) -> Vec<Case> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let start = days_of("2026-01-29").unwrap_or(0);
    (0..questions)
        .map(|q| {
            let t = rng.usize(..templates.len());
            let evidence = rng.usize(..PER_QUESTION);
            let sessions = (0..PER_QUESTION)
                .map(|i| {
                    let day = start + (i as i64 * DAYS) / PER_QUESTION as i64;
                    let mut lines: Vec<String> =
                        (0..3).map(|_| FILLER[rng.usize(..FILLER.len())].to_owned()).collect();
                    if i == evidence {
                        let detail = DETAILS[rng.usize(..DETAILS.len())];
                        lines.insert(0, templates[t].fact.replace("{x}", detail));
                    } else if rng.bool() {
                        // A distractor: the question's words, about something else.
                        lines.push(templates[t].distractor.to_owned());
                    } else {
                        // Another fact, of another kind.
                        let other = (t + 1 + rng.usize(..templates.len() - 1)) % templates.len();
                        let detail = DETAILS[rng.usize(..DETAILS.len())];
                        lines.insert(0, templates[other].fact.replace("{x}", detail));
                    }
                    Session { id: format!("q{q:03}-s{i:02}"), day, text: lines.join(" ") }
                })
                .collect();
            Case {
                question: templates[t].question.to_owned(),
                evidence: format!("q{q:03}-s{evidence:02}"),
                sessions,
            }
        })
        .collect()
}

/// Where each mode ranks `case`'s evidence session in its haystack (`None`: not in the first
/// 10): BM25, vectors, hybrid.
fn ranks(dir: &Path, case: &Case, embedder: Option<&Arc<Embedder>>) -> Result<[Option<usize>; 3]> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir.join("observations"))?;
    let mut by_day: std::collections::BTreeMap<String, String> = Default::default();
    for s in &case.sessions {
        by_day
            .entry(date_of(s.day))
            .or_default()
            .push_str(&format!("## 12:00\n{}\n<!-- id: {} -->\n---\n\n", s.text, s.id));
    }
    for (date, text) in &by_day {
        std::fs::write(dir.join("observations").join(format!("{date}.md")), text)?;
    }
    let mut index = Index::open(dir).map_err(|e| anyhow!(e))?;
    index.rebuild().map_err(|e| anyhow!(e))?;
    if let Some(e) = embedder {
        index.set_embedder(e.clone());
        while index.embed_pending(256).map_err(|e| anyhow!(e))? > 0 {}
    }
    let today = case.sessions.iter().map(|s| s.day).max().unwrap_or(0) + 1;
    let mut out = [None; 3];
    for (slot, mode) in out.iter_mut().zip([Mode::Bm25, Mode::Vector, Mode::Hybrid]) {
        let q = Query {
            text: &case.question,
            limit: 10,
            all: true,
            kinds: Vec::new(),
            agent: None,
            today,
            mode,
            precise: false,
            filter: Default::default(),
        };
        let hits = index.search(&q).map_err(|e| anyhow!(e))?;
        *slot = hits.iter().position(|h| h.record.id == case.evidence);
    }
    Ok(out)
}

/// Recall@5 and @10 of each mode over `cases`, as `{prefix}_{mode}_at5|10`, with
/// `{prefix}_questions` and `{prefix}_sessions`.
fn score(
    dir: &Path,
    cases: &[Case],
    embedder: Option<&Arc<Embedder>>,
    prefix: &str,
    out: &mut Map<String, Value>,
) -> Result<()> {
    // [mode][@5, @10]
    let mut found = [[0usize; 2]; 3];
    for case in cases {
        for (m, rank) in ranks(dir, case, embedder)?.into_iter().enumerate() {
            if let Some(r) = rank {
                found[m][1] += 1;
                if r < 5 {
                    found[m][0] += 1;
                }
            }
        }
    }
    let n = cases.len() as f64;
    let share = |k: usize| (k as f64 / n * 1000.0).round() / 1000.0;
    out.insert(format!("{prefix}_questions"), json!(cases.len()));
    out.insert(format!("{prefix}_sessions"), json!(cases.len() * PER_QUESTION));
    for (m, name) in ["bm25", "vector", "hybrid"].iter().enumerate() {
        if m > 0 && embedder.is_none() {
            continue;
        }
        out.insert(format!("{prefix}_{name}_at5"), json!(share(found[m][0])));
        out.insert(format!("{prefix}_{name}_at10"), json!(share(found[m][1])));
    }
    Ok(())
}

pub fn run(root: &Path, keep: bool, out: &mut Map<String, Value>) -> Result<()> {
    let cases = generate(TEMPLATES, SEED, QUESTIONS);
    let dir = root.join("recall-bench");
    let embedder = match flock_memory::embed::installed_dir() {
        Some(d) => Some(Arc::new(Embedder::load(&d).map_err(|e| anyhow!(e))?)),
        None => {
            eprintln!("flock-bench: recall: no embedding model (scripts/setup): BM25 only");
            None
        }
    };
    let started = Instant::now();
    score(&dir, &cases, embedder.as_ref(), "recall", out)?;
    out.insert("recall_secs".into(), json!(started.elapsed().as_secs_f64()));
    eprintln!("flock-bench: recall: the held-out templates (seed {HELD_OUT_SEED})");
    let held_out = generate(HELD_OUT, HELD_OUT_SEED, HELD_OUT_QUESTIONS);
    score(&dir, &held_out, embedder.as_ref(), "recall_heldout", out)?;
    let _ = std::fs::remove_dir_all(&dir);
    if keep {
        // The LongMemEval layout: one entry per question with its own haystack.
        let fixture: Vec<Value> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                json!({
                    "question_id": format!("q{i:03}"),
                    "question": c.question,
                    "answer_session_ids": [c.evidence],
                    "haystack_session_ids": c.sessions.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
                    "haystack_dates": c.sessions.iter().map(|s| date_of(s.day)).collect::<Vec<_>>(),
                    "haystack_sessions": c.sessions.iter().map(|s| json!([{"role": "user", "content": s.text}])).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = json!({"seed": SEED, "questions": fixture});
        std::fs::write(root.join("longmemeval-fixture.json"), serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
