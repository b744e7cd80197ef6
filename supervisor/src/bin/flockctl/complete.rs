//! Shell completion of what a running swarm has: agent names where a command takes an agent,
//! channel names where it takes a channel (clap_complete's dynamic completion: the shell asks
//! `flockctl` itself at each Tab, `COMPLETE=bash flockctl -- …`).
//!
//! The names come from the swarm of `$FLOCK_HOME` (or `~/.flock`): a completer sees only the
//! word being completed, not a `--state-dir` earlier on the line. No swarm, or one that does not
//! answer within half a second, completes nothing rather than hang the shell.

use std::time::Duration;

use clap_complete::engine::CompletionCandidate;
use flock_ipc::{ControlReply, ControlRequest};
use flock_supervisor::paths::StateDir;

/// How long a Tab may wait for the supervisor.
const PATIENCE: Duration = Duration::from_millis(500);

/// The agents, the model and the bridges (`flockctl ps`'s processes), each with its state.
pub(crate) fn processes() -> Vec<CompletionCandidate> {
    ask(ControlRequest::Ps)
        .map(|reply| match reply {
            ControlReply::Ps(rows) => rows
                .into_iter()
                .filter(|r| r.kind != "actor" && r.kind != "supervisor")
                .map(|r| {
                    let help = format!("{} {}", r.role, r.state);
                    CompletionCandidate::new(r.name).help(Some(help.trim().to_owned().into()))
                })
                .collect(),
            _ => Vec::new(),
        })
        .unwrap_or_default()
}

/// The channels, as `#name`, each with its topic.
pub(crate) fn channels() -> Vec<CompletionCandidate> {
    let req = ControlRequest::Channel {
        tool: "flock_channel_list".into(),
        arguments: "{}".into(),
        as_name: super::person(None),
    };
    let Some(ControlReply::Json(text)) = ask(req) else { return Vec::new() };
    let list: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let id = c["channel"].as_str()?;
            // A topic is anyone's text: a line break in it would pass for another candidate.
            let topic: String = c["topic"]
                .as_str()
                .unwrap_or("")
                .chars()
                .map(|ch| if ch.is_control() { ' ' } else { ch })
                .collect();
            Some(CompletionCandidate::new(format!("#{id}")).help(Some(topic.into())))
        })
        .collect()
}

/// One control request to the default swarm, if it answers in time.
fn ask(request: ControlRequest) -> Option<ControlReply> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    runtime.block_on(async {
        let state = StateDir::resolve(None).ok()?;
        let work = async {
            let mut conn = super::connect(&state).await.ok()?;
            super::control(&mut conn, request).await.ok()
        };
        tokio::time::timeout(PATIENCE, work).await.ok().flatten()
    })
}
