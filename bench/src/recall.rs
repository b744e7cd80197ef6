//! Retrieval quality on a LongMemEval-style fixture (issue #10): chat sessions with timestamps,
//! questions, and the ids of the sessions that hold each answer ("evidence"). The fixture is
//! generated here, deterministically from [`SEED`]: 600 sessions over 300 days, 120 questions.
//! Most sessions are filler about the same topics (distractors that share words with the
//! questions); each question's fact is stated in one evidence session, in words that overlap the
//! question only partly (a question asks about "my pet", the session says "dog"), as real
//! questions do. Each session is indexed as one observation; recall@k is the share of questions
//! whose evidence session is among the first k results.
//!
//! `flock-bench --only recall --keep` leaves the fixture as `longmemeval-fixture.json` (the
//! LongMemEval layout: `haystack_sessions`, `haystack_dates`, `question`, `answer_session_ids`).

use std::path::Path;

use anyhow::{Result, anyhow};
use flock_memory::index::{Index, Query};
use flock_memory::records::{date_of, days_of};
use serde_json::{Map, Value, json};

/// The fixture's seed: the same seed, the same fixture.
pub const SEED: u64 = 20_261_125;
const SESSIONS: usize = 600;
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
    Template {
        fact: "I finally adopted a dog, we named him {x}.",
        question: "What is the name of my pet?",
        distractor: "My neighbour's cat keeps visiting; pets are a lot of work.",
    },
    Template {
        fact: "My sister {x} is getting married in June.",
        question: "Which sibling has a wedding coming up?",
        distractor: "Weddings are expensive, a colleague said.",
    },
    Template {
        fact: "I switched our billing service to {x} last week.",
        question: "What database does the billing service run on now?",
        distractor: "The billing dashboard was slow again today.",
    },
    Template {
        fact: "The dentist moved my appointment to {x}.",
        question: "When is my dental check-up?",
        distractor: "I should floss more, my teeth hurt.",
    },
    Template {
        fact: "I'm training for the {x} marathon in the spring.",
        question: "Which race am I preparing for?",
        distractor: "Running in the rain is not fun.",
    },
    Template {
        fact: "Our new office is on {x} street, third floor.",
        question: "Where is the new workplace located?",
        distractor: "The office coffee machine is broken.",
    },
    Template {
        fact: "I bought a {x} laptop for the team.",
        question: "Which computer brand did I pick for the team?",
        distractor: "My laptop battery dies quickly.",
    },
    Template {
        fact: "The flight to {x} leaves at 7 in the morning.",
        question: "Where am I flying to?",
        distractor: "Airports are always crowded in summer.",
    },
    Template {
        fact: "My daughter started violin lessons with teacher {x}.",
        question: "Who teaches my kid music?",
        distractor: "The school concert was lovely.",
    },
    Template {
        fact: "We chose {x} as the name for the new product.",
        question: "What did we call the product we launched?",
        distractor: "Naming things is hard, the marketing team says.",
    },
    Template {
        fact: "I'm allergic to {x}, please remember that.",
        question: "What food should I avoid?",
        distractor: "The restaurant menu had many options.",
    },
    Template {
        fact: "The quarterly budget was capped at {x} dollars.",
        question: "How much money can we spend this quarter?",
        distractor: "Finance wants the report by Friday.",
    },
];

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

struct Question {
    text: String,
    evidence: String,
}

fn generate() -> (Vec<Session>, Vec<Question>) {
    let mut rng = fastrand::Rng::with_seed(SEED);
    let start = days_of("2026-01-29").unwrap_or(0);
    let mut sessions: Vec<Session> = (0..SESSIONS)
        .map(|i| {
            let day = start + (i as i64 * DAYS) / SESSIONS as i64;
            let mut lines: Vec<String> =
                (0..3).map(|_| FILLER[rng.usize(..FILLER.len())].to_owned()).collect();
            // A distractor: the words of some question, about something else.
            if rng.bool() {
                lines.push(TEMPLATES[rng.usize(..TEMPLATES.len())].distractor.to_owned());
            }
            Session { id: format!("s{i:04}"), day, text: lines.join(" ") }
        })
        .collect();
    let mut questions = Vec::new();
    let mut used = std::collections::HashSet::new();
    while questions.len() < QUESTIONS {
        let s = rng.usize(..SESSIONS);
        if !used.insert(s) {
            continue;
        }
        let t = &TEMPLATES[rng.usize(..TEMPLATES.len())];
        let detail = DETAILS[rng.usize(..DETAILS.len())];
        let session = &mut sessions[s];
        session.text = format!("{} {}", t.fact.replace("{x}", detail), session.text);
        questions.push(Question { text: t.question.to_owned(), evidence: session.id.clone() });
    }
    (sessions, questions)
}

pub fn run(root: &Path, keep: bool, out: &mut Map<String, Value>) -> Result<()> {
    let (sessions, questions) = generate();
    let dir = root.join("recall-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("observations"))?;
    let mut by_day: std::collections::BTreeMap<String, String> = Default::default();
    for s in &sessions {
        by_day
            .entry(date_of(s.day))
            .or_default()
            .push_str(&format!("## 12:00\n{}\n<!-- id: {} -->\n---\n\n", s.text, s.id));
    }
    for (date, text) in &by_day {
        std::fs::write(dir.join("observations").join(format!("{date}.md")), text)?;
    }
    let mut index = Index::open(&dir).map_err(|e| anyhow!(e))?;
    index.rebuild().map_err(|e| anyhow!(e))?;
    let today = sessions.iter().map(|s| s.day).max().unwrap_or(0) + 1;
    let (mut at5, mut at10) = (0usize, 0usize);
    for q in &questions {
        let hits = index
            .search(&Query { text: &q.text, limit: 10, all: true, kinds: Vec::new(), today })
            .map_err(|e| anyhow!(e))?;
        if let Some(rank) = hits.iter().position(|h| h.record.id == q.evidence) {
            at10 += 1;
            if rank < 5 {
                at5 += 1;
            }
        }
    }
    let n = questions.len() as f64;
    out.insert("recall_questions".into(), json!(questions.len()));
    out.insert("recall_sessions".into(), json!(sessions.len()));
    out.insert("recall_bm25_at5".into(), json!((at5 as f64 / n * 1000.0).round() / 1000.0));
    out.insert("recall_bm25_at10".into(), json!((at10 as f64 / n * 1000.0).round() / 1000.0));
    if keep {
        let fixture: Vec<Value> = questions
            .iter()
            .enumerate()
            .map(|(i, q)| {
                json!({
                    "question_id": format!("q{i:03}"),
                    "question": q.text,
                    "answer_session_ids": [q.evidence],
                })
            })
            .collect();
        let haystack = json!({
            "seed": SEED,
            "haystack_session_ids": sessions.iter().map(|s| s.id.clone()).collect::<Vec<_>>(),
            "haystack_dates": sessions.iter().map(|s| date_of(s.day)).collect::<Vec<_>>(),
            "haystack_sessions": sessions.iter().map(|s| json!([{"role": "user", "content": s.text}])).collect::<Vec<_>>(),
            "questions": fixture,
        });
        std::fs::write(
            root.join("longmemeval-fixture.json"),
            serde_json::to_string_pretty(&haystack)?,
        )?;
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
