//! How fast the journal answers without an index: appends N events (default 100 000) to a fresh
//! journal, then times `read_last(20)` and a `query` by agent and type over all of them.
//!
//! Run: `cargo run --release -p flock-journal --example journal_scan [-- --events 100000]`

use std::time::Instant;

use flock_journal::{Filter, Journal, JournalEvent, Status};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args
        .iter()
        .position(|a| a == "--events")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let journal = Journal::open(dir.path(), 1 << 30).expect("journal");
    let t = Instant::now();
    for i in 0..n {
        let agent = format!("worker-{}", i % 10);
        let event =
            JournalEvent::new(&agent, "FLOCK_CHANNEL_POST", Status::Success, format!("#c seq {i}"))
                .param("channel", "c");
        journal.append(&event).expect("append");
    }
    let append = t.elapsed();
    let t = Instant::now();
    let last = journal.read_last(20).expect("read");
    let read_last = t.elapsed();
    let t = Instant::now();
    let filter = Filter {
        agent: Some("worker-3".into()),
        action_type: Some("FLOCK_CHANNEL_POST".into()),
        ..Filter::default()
    };
    let found = journal.query(&filter).expect("query");
    let query = t.elapsed();
    let bytes = std::fs::metadata(journal.current_path()).map(|m| m.len()).unwrap_or(0);
    println!(
        "{n} events ({:.1} MB): append {:.1} µs/event; read_last(20) {:.2} ms ({} events); query agent+type {:.0} ms ({} matches)",
        bytes as f64 / 1e6,
        append.as_secs_f64() * 1e6 / n as f64,
        read_last.as_secs_f64() * 1e3,
        last.events.len(),
        query.as_secs_f64() * 1e3,
        found.events.len()
    );
}
