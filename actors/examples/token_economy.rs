//! Token economy of delta notifications: characters an agent receives from deltas versus
//! re-sending the channel's whole history on every turn (what a history-replaying design does).
//!
//! Scenario: one channel, 5 agent members, 200 messages posted over time by the members in turn
//! (lengths 40–400 chars, fixed seed). Each member takes a turn for every message it did not
//! write. Deltas are rendered by the real renderer (`channels::delta::render`), so the caps
//! (20 messages, 400 chars each) and the headers are counted. Worst case for deltas: no coalescing
//! (every message is its own notification); `--burst N` coalesces N messages per notification.
//!
//! Run: `cargo run --release -p flock-actors --example token_economy [-- --burst 5]`

use flock_actors::channels::delta::{Msg, render};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let burst: usize = args
        .iter()
        .position(|a| a == "--burst")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let members = ["pm", "dev-code", "dev-prod", "reviewer", "qa"];
    let mut rng = fastrand::Rng::with_seed(42);
    let messages: Vec<Msg> = (1..=200u64)
        .map(|seq| {
            let len = rng.usize(40..=400);
            let text: String = (0..len).map(|_| rng.alphabetic()).collect();
            Msg { seq, author: members[(seq as usize - 1) % members.len()].into(), text }
        })
        .collect();
    let (channel, topic) = ("project-logging", "Structured logging library in TypeScript");

    let mut delta_chars = 0usize;
    let mut history_chars = 0usize;
    let mut delta_turns = 0usize;
    let mut history_turns = 0usize;
    for member in members {
        let mut sent = 0usize; // index of the first message not yet delivered to this member
        for end in (burst..=messages.len())
            .step_by(burst)
            .chain((!messages.len().is_multiple_of(burst)).then_some(messages.len()))
        {
            let new: Vec<Msg> =
                messages[sent..end].iter().filter(|m| m.author != member).cloned().collect();
            sent = end;
            if new.is_empty() {
                continue;
            }
            delta_chars += render(channel, channel, topic, &new).chars().count();
            delta_turns += 1;
            // The replaying design: the same turn, fed the whole channel so far.
            history_chars += history(channel, topic, &messages[..end]).chars().count();
            history_turns += 1;
        }
    }
    let ratio = history_chars as f64 / delta_chars as f64;
    println!("token economy: 1 channel, 5 members, 200 messages, burst {burst}");
    println!("  deltas:          {delta_chars:>10} chars in {delta_turns} turns");
    println!("  full history:    {history_chars:>10} chars in {history_turns} turns");
    println!("  ratio:           {ratio:>10.1}x fewer characters with deltas");
    println!(
        "{{\"burst\":{burst},\"delta_chars\":{delta_chars},\"history_chars\":{history_chars},\"ratio\":{ratio:.2}}}"
    );
}

/// The whole channel as a history-replaying design sends it: same header and line format as a
/// delta, but every message, uncut.
fn history(channel: &str, topic: &str, messages: &[Msg]) -> String {
    let mut out = format!("[Channel: #{channel}]\nTopic: {topic}\n--- History ---\n");
    for m in messages {
        out.push_str(&format!("[seq {}] {}: {}\n", m.seq, m.author, m.text));
    }
    out
}
