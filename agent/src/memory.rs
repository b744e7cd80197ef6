//! The swarm's memory files, as an agent sees them: read-only in its cage (the supervisor's memory
//! thread is their one writer, `flock_actors::memory`), read with [`Memory`]; what an agent wants
//! written goes to the supervisor as a tool call, under an id derived from its turn, so a
//! replayed turn writes nothing twice.

pub use flock_memory::files::{Memory, Observation};

/// Whether `tool` is a model's memory write (`memory_remember`, `knowledge_append`).
pub fn is_memory_write(tool: &str) -> bool {
    matches!(tool, "memory_remember" | "knowledge_append")
}

/// Journals a memory write (`MEMORY_WRITE`, in the chain the agent works in): the story of a
/// team's work shows what each member remembered. The text is masked and cut like any journal
/// line; the journal is best effort, the memory is already written.
pub async fn journal_write(client: &crate::client::RouterClient, tool: &str, arguments: &str) {
    let args: serde_json::Value = serde_json::from_str(arguments).unwrap_or_default();
    let text = flock_memory::mask::mask(args["text"].as_str().unwrap_or_default());
    let text: String = text.chars().take(160).collect();
    let event = serde_json::json!({
        "type": "MEMORY_WRITE",
        "message": format!("remembered: {text}"),
        "params": {"tool": tool, "priority": args["priority"], "category": args["category"]},
    });
    let _ = crate::output::forward(client, "journal__event", &event).await;
}
