//! Sessions: one conversation per (agent, channel) and one for direct messages, persisted; a
//! restarted agent resumes it; archiving a channel closes its sessions.

use serde_json::Value;

use flock_testkit::Swarm;

use crate::{SHORT, answer_model};

#[test]
fn a_restarted_agent_resumes_its_channel_session_and_archiving_closes_it() {
    let yaml = format!(
        r#"swarm: {{ name: sessions }}
channels: {{ delta_delay_min_ms: 0, delta_delay_max_ms: 0 }}
models:
{}agents:
  - {{ name: dev, role: worker, model: m }}
"#,
        answer_model("m", "noted")
    );
    let swarm = Swarm::start(&yaml);
    swarm.ctl_ok(&["channel", "create", "work", "--members", "dev", "--as", "alice"]);
    swarm.ctl_ok(&["post", "#work", "first point", "--as", "alice"]);
    swarm.wait_for_log("dev", "reply \"noted\"", SHORT);
    swarm.ctl_ok(&["send", "dev", "a direct word"]);
    swarm.wait_until(|| swarm.turns_total("dev") == 2, SHORT, "two turns done");

    let listing: Value =
        serde_json::from_str(&swarm.ctl_ok(&["session", "show", "dev", "--json"])).unwrap();
    let sessions = listing["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{listing}");
    let work = sessions.iter().find(|s| s["channel"] == "work").unwrap();
    assert_eq!(work["messages"], 2, "the input and the answer: {listing}");

    // kill -9: the next turn in #work starts from the stored session.
    let pid = swarm.kill9("dev");
    swarm.wait_until(
        || swarm.pid_of("dev").is_some_and(|p| p != pid) && swarm.state_of("dev") == "ready",
        SHORT,
        "dev restarted",
    );
    swarm.ctl_ok(&["post", "#work", "second point", "--as", "alice"]);
    swarm.wait_for_log("dev", "session #work resumed with 2 messages", SHORT);
    // The log line opens the turn; the session is saved when the turn ends.
    swarm.wait_until(
        || {
            let shown = swarm.ctl_ok(&["session", "show", "dev", "--channel", "#work"]);
            shown.contains("first point") && shown.contains("second point")
        },
        SHORT,
        "the stored #work session with both points",
    );

    // Archiving closes the channel's sessions.
    swarm.ctl_ok(&["channel", "archive", "work", "--force", "--as", "alice"]);
    swarm.wait_for_log("dev", "session #work closed", SHORT);
    let listing = swarm.ctl_ok(&["session", "show", "dev"]);
    assert!(listing.contains("#work") && listing.contains("closed"), "{listing}");

    // A name nobody had is an error that says who there is, not an empty listing.
    let out = swarm.ctl(&["session", "show", "nobody"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no agent named `nobody`") && err.contains("dev"), "{err}");
}
