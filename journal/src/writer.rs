//! The writer task the actors hand events to, and the recent events that concern an agent.

use crate::JournalError;
use crate::event::JournalEvent;
use crate::file::Journal;

/// Appends events on a task of its own, in batches (one lock and one `write` for everything
/// queued): an actor hands an event over and goes on, never waiting on the file. Events are
/// lost only if the supervisor dies before the task writes them (milliseconds).
#[derive(Debug, Clone)]
pub struct JournalWriter {
    tx: tokio::sync::mpsc::UnboundedSender<JournalEvent>,
    journal: std::sync::Arc<Journal>,
}

impl JournalWriter {
    /// Starts the writer task on the current tokio runtime.
    pub fn spawn(journal: std::sync::Arc<Journal>) -> JournalWriter {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<JournalEvent>();
        let writer = JournalWriter { tx, journal: journal.clone() };
        tokio::spawn(async move {
            let mut batch = Vec::new();
            while rx.recv_many(&mut batch, 4096).await > 0 {
                let events = std::mem::take(&mut batch);
                let j = journal.clone();
                // One invalid event must not cost the others their line: on a refusal the batch
                // is written event by event.
                let written = tokio::task::spawn_blocking(move || match j.append_all(&events) {
                    Err(JournalError::Invalid(_)) => {
                        events.iter().map(|e| j.append(e)).find(Result::is_err).unwrap_or(Ok(()))
                    }
                    other => other,
                })
                .await;
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "flock journal: append failed"),
                    Err(e) => tracing::error!(error = %e, "flock journal: the writer failed"),
                }
            }
        });
        writer
    }

    pub fn log(&self, event: JournalEvent) {
        let _ = self.tx.send(event);
    }

    /// The last `n` events that concern `agent` (written by it, or naming it in a parameter), as
    /// one line each, oldest first, handed to `reply` from a blocking task (the caller never
    /// waits on the file). Looks at the newest [`RECENT_SCAN`] events.
    pub fn recent_for(&self, agent: &str, n: usize, reply: impl FnOnce(String) + Send + 'static) {
        let (journal, agent) = (self.journal.clone(), agent.to_owned());
        tokio::task::spawn_blocking(move || {
            let lines = match journal.read_last(RECENT_SCAN) {
                Ok(read) => concerning(&read.events, &agent, n),
                Err(e) => format!("(the journal could not be read: {e})"),
            };
            reply(lines);
        });
    }
}

/// How many of the newest events [`JournalWriter::recent_for`] looks through.
pub const RECENT_SCAN: usize = 2_000;

/// The last `n` of `events` (oldest first) that `agent` wrote or that name it in a parameter:
/// `HH:MM:SS AGENT TYPE STATUS: message`.
pub fn concerning(events: &[JournalEvent], agent: &str, n: usize) -> String {
    let mine: Vec<&JournalEvent> = events
        .iter()
        .filter(|e| e.agent == agent || e.action.params.values().any(|v| v.as_str() == Some(agent)))
        .collect();
    mine[mine.len().saturating_sub(n)..]
        .iter()
        .map(|e| {
            let time = e.timestamp.get(11..19).unwrap_or(&e.timestamp);
            let message: String = e.result.message.chars().take(200).collect();
            format!("{time} {} {} {}: {message}", e.agent, e.action.kind, e.status.as_str())
        })
        .collect::<Vec<_>>()
        .join("\n")
}
