//! A model test of the durable store (in the manner of redb's fuzzing against a model): random
//! sequences of accepted sends (some replayed), finished turns, failed deliveries, dead letters,
//! discards, token and turn counts, record-plus-messages jobs that commit or fail, clean reopens
//! and crashes (the files as a killed process leaves them: the database and its WAL, never
//! checkpointed, which the next open must recover) are applied both to a real SQLite store on disk and to a plain in-memory model.
//! After every step the store must say exactly what the model says: the pending mailbox in
//! acceptance order with attempts and routes, each message's state, the dead letters, the totals.

use std::collections::BTreeMap;
use std::path::Path;

use flock_actors::store::{Durability, NewMessage, Store, WriteOp, WriteOutcome};
use proptest::prelude::*;

const AGENTS: [&str; 3] = ["dev", "qa", "pm"];

#[derive(Debug, Clone)]
enum Step {
    /// One group-commit transaction.
    Batch(Vec<WriteOp>),
    /// A record with the messages that announce it (`Store::with_messages`); `fail`: the
    /// record's own write fails, so none of the messages may be stored.
    Job { messages: Vec<NewMessage>, fail: bool },
    /// Close and open again.
    Reopen,
    /// The process dies between two commits (`kill -9`).
    Crash,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Pending,
    Done,
    Dead,
}

#[derive(Debug, Clone)]
struct Msg {
    m: NewMessage,
    state: State,
    attempts: u32,
    reason: Option<String>,
}

#[derive(Debug, Default)]
struct Model {
    /// In acceptance order.
    msgs: Vec<Msg>,
    /// agent → (turns, tokens in, tokens out).
    stats: BTreeMap<String, (u64, u64, u64)>,
}

impl Model {
    fn find(&mut self, id: u128) -> Option<&mut Msg> {
        self.msgs.iter_mut().find(|m| m.m.id == id)
    }

    fn pending(&mut self, id: u128) -> Option<&mut Msg> {
        self.find(id).filter(|m| m.state == State::Pending)
    }

    fn enqueue(&mut self, m: &NewMessage) -> WriteOutcome {
        if self.msgs.iter().any(|x| x.m.id == m.id) {
            return WriteOutcome::Duplicate;
        }
        self.msgs.push(Msg { m: m.clone(), state: State::Pending, attempts: 0, reason: None });
        WriteOutcome::Inserted
    }

    fn apply(&mut self, op: &WriteOp) -> WriteOutcome {
        match op {
            WriteOp::Enqueue(m) => return self.enqueue(m),
            WriteOp::Complete { id, agent } => {
                if let Some(m) = self.pending(*id) {
                    m.state = State::Done;
                    self.stats.entry(agent.clone()).or_default().0 += 1;
                }
            }
            WriteOp::AddTurns { agent, n } => self.stats.entry(agent.clone()).or_default().0 += n,
            WriteOp::AddTokens { agent, tokens_in, tokens_out } => {
                let s = self.stats.entry(agent.clone()).or_default();
                s.1 += tokens_in;
                s.2 += tokens_out;
            }
            WriteOp::FailedAttempt { id, attempts } => {
                if let Some(m) = self.pending(*id) {
                    m.attempts = *attempts;
                }
            }
            WriteOp::DeadLetter { id, attempts, reason } => {
                if let Some(m) = self.pending(*id) {
                    (m.state, m.attempts, m.reason) =
                        (State::Dead, *attempts, Some(reason.clone()));
                }
            }
            WriteOp::Told { .. } => {}
            WriteOp::Discard { id, reason } => {
                if let Some(m) = self.pending(*id) {
                    (m.state, m.reason) = (State::Done, Some(reason.clone()));
                }
            }
        }
        WriteOutcome::Applied
    }
}

fn message() -> impl Strategy<Value = NewMessage> {
    // A small id pool, so replays (duplicates) and operations on known ids are common.
    (0u128..24, 0..AGENTS.len(), 0..AGENTS.len(), "[a-z ]{0,12}", prop::option::of("[a-z]{1,6}"))
        .prop_map(|(id, from, to, text, route)| NewMessage {
            id: id + 1,
            sender: AGENTS[from].into(),
            target: AGENTS[to].into(),
            text,
            route: route.unwrap_or_default(),
        })
}

fn write_op() -> impl Strategy<Value = WriteOp> {
    let id = || 1u128..25;
    let agent = || (0..AGENTS.len()).prop_map(|i| AGENTS[i].to_owned());
    prop_oneof![
        4 => message().prop_map(WriteOp::Enqueue),
        3 => (id(), agent()).prop_map(|(id, agent)| WriteOp::Complete { id, agent }),
        1 => (agent(), 0u64..4).prop_map(|(agent, n)| WriteOp::AddTurns { agent, n }),
        1 => (agent(), 0u64..500, 0u64..500)
            .prop_map(|(agent, tokens_in, tokens_out)| WriteOp::AddTokens { agent, tokens_in, tokens_out }),
        2 => (id(), 1u32..6).prop_map(|(id, attempts)| WriteOp::FailedAttempt { id, attempts }),
        1 => (id(), 1u32..6, "[a-z]{1,8}")
            .prop_map(|(id, attempts, reason)| WriteOp::DeadLetter { id, attempts, reason }),
        1 => (id(), "[a-z]{1,8}").prop_map(|(id, reason)| WriteOp::Discard { id, reason }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => prop::collection::vec(write_op(), 1..6).prop_map(Step::Batch),
        2 => (prop::collection::vec(message(), 0..3), any::<bool>())
            .prop_map(|(messages, fail)| Step::Job { messages, fail }),
        1 => Just(Step::Reopen),
        1 => Just(Step::Crash),
    ]
}

fn open(path: &Path) -> Store {
    Store::open(path, Durability::Normal).expect("the store opens")
}

/// Everything the store says, compared with the model.
fn check(store: &Store, model: &Model) {
    let pending: Vec<_> = store
        .pending()
        .unwrap()
        .into_iter()
        .map(|p| (p.id, p.sender, p.target, p.text, p.attempts, p.route))
        .collect();
    let expected: Vec<_> = model
        .msgs
        .iter()
        .filter(|m| m.state == State::Pending)
        .map(|m| {
            let n = &m.m;
            (n.id, n.sender.clone(), n.target.clone(), n.text.clone(), m.attempts, n.route.clone())
        })
        .collect();
    assert_eq!(pending, expected, "the pending mailboxes, in acceptance order");

    for id in 1u128..25 {
        let want = model.msgs.iter().find(|m| m.m.id == id).map(|m| match m.state {
            State::Pending => "pending",
            State::Done => "done",
            State::Dead => "dead",
        });
        assert_eq!(store.message_state(id).unwrap(), want, "message {id}");
    }

    let dead: Vec<_> = store
        .dead_letters(0, 1000)
        .unwrap()
        .into_iter()
        .map(|d| (d.id, d.text, d.attempts, d.reason))
        .collect();
    let want: Vec<_> = model
        .msgs
        .iter()
        .filter(|m| m.state == State::Dead)
        .map(|m| (m.m.id, m.m.text.clone(), m.attempts, m.reason.clone().unwrap_or_default()))
        .collect();
    assert_eq!(dead, want, "the dead letters");

    let turns: BTreeMap<_, _> = store.turns_totals().unwrap().into_iter().collect();
    let tokens: BTreeMap<_, _> = store.token_totals().unwrap().into_iter().collect();
    let want_turns: BTreeMap<_, _> = model.stats.iter().map(|(a, s)| (a.clone(), s.0)).collect();
    let want_tokens: BTreeMap<_, _> =
        model.stats.iter().map(|(a, s)| (a.clone(), (s.1, s.2))).collect();
    assert_eq!(turns, want_turns, "turns per agent");
    assert_eq!(tokens, want_tokens, "tokens per agent");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_store_says_what_the_model_says(steps in prop::collection::vec(step(), 1..40)) {
        let dir = tempfile::tempdir().unwrap();
        let mut path = dir.path().join("flock.db");
        let mut crashes = 0;
        let mut store = open(&path);
        let mut model = Model::default();
        for step in &steps {
            match step {
                Step::Batch(ops) => {
                    let got = store.apply(ops).unwrap();
                    let want: Vec<_> = ops.iter().map(|op| model.apply(op)).collect();
                    prop_assert_eq!(got, want, "outcomes of {:?}", ops);
                }
                Step::Job { messages, fail } => {
                    let result = store.with_messages(|conn| {
                        // The record's own write, in the same transaction as the messages.
                        conn.execute_batch("CREATE TABLE IF NOT EXISTS model_records (n INTEGER)")
                            .and_then(|()| conn.execute("INSERT INTO model_records VALUES (1)", []))
                            .map_err(|e| e.to_string())?;
                        if *fail {
                            return Err("the record could not be written".to_owned());
                        }
                        Ok(((), messages.clone()))
                    });
                    prop_assert_eq!(result.expect("the store works").is_ok(), !fail);
                    if !fail {
                        for m in messages {
                            model.enqueue(m);
                        }
                    }
                }
                Step::Reopen => {
                    drop(store);
                    store = open(&path);
                }
                Step::Crash => {
                    // What `kill -9` leaves on disk: the database and its WAL as written, with no
                    // checkpoint at close and no shared-memory index (the next open recovers
                    // from the WAL alone). The copy is what the next run opens.
                    crashes += 1;
                    let copy = dir.path().join(format!("crashed-{crashes}.db"));
                    for ext in ["", "-wal"] {
                        let from = format!("{}{ext}", path.display());
                        if Path::new(&from).exists() {
                            std::fs::copy(&from, format!("{}{ext}", copy.display())).unwrap();
                        }
                    }
                    drop(store);
                    path = copy;
                    store = open(&path);
                }
            }
            check(&store, &model);
        }
        drop(store);
        check(&open(&path), &model);
    }
}
