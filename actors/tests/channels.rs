//! The channels actor behind the real router, store and sockets, with test clients as agents:
//! roles enforced in code, delta notifications (content, caps, cursors, rollback, coalescing, no
//! replay), mentions and agent states, the archive protocol.

mod common;

use std::time::Duration;

use common::{Node, ack, delta, next, nothing_for, tool, tool_as};
use flock_actors::caller::Caller;
use flock_actors::messages::ChannelsMsg;
use flock_ipc::{Body, Connection, DeliveryKind, Frame, ROUTER};
use serde_json::{Value, json};

struct Harness {
    _tmp: Option<tempfile::TempDir>,
    node: Node,
}

impl std::ops::Deref for Harness {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

const AGENTS: &str = "agents:
  - {name: orchestrator, role: orchestrator}
  - {name: sysadmin, role: sysadmin}
  - {name: dev, role: worker}
  - {name: dev-code, role: worker}
  - {name: qa, role: worker}
";

/// Starts store, channels and router over the files in `dir` (a second call on the same dir is a
/// supervisor restart); `life` names the socket so lives do not collide.
async fn harness_at(dir: &std::path::Path, life: u32, channels_yaml: &str) -> Harness {
    let yaml = format!(
        "swarm: {{name: t}}\nchannels: {channels_yaml}\nmodels:\n  s: {{provider: scripted, rules: [{{reply: ok}}]}}\ndefaults: {{model: s}}\n{AGENTS}"
    );
    Harness { _tmp: None, node: common::start(dir, life, &yaml, true).await }
}

async fn harness(channels_yaml: &str) -> Harness {
    let tmp = tempfile::tempdir().unwrap();
    let mut h = harness_at(tmp.path(), 0, channels_yaml).await;
    h._tmp = Some(tmp);
    h
}

const NO_DELAY: &str = "{delta_delay_min_ms: 0, delta_delay_max_ms: 0}";

impl Harness {
    /// A tool call as a human through flockctl.
    async fn human(&self, name: &str, tool: &str, args: Value) -> Result<Value, String> {
        let caller = Caller { id: format!("human:{name}"), role: None };
        let channels = self.channels.as_ref().unwrap();
        let r = ractor::call!(channels, |reply| ChannelsMsg::Human {
            caller,
            name: tool.into(),
            arguments: args.to_string(),
            reply
        })
        .unwrap();
        r.map(|s| serde_json::from_str(&s).unwrap()).map_err(|(code, msg)| format!("{code}: {msg}"))
    }

    fn journal(&self) -> String {
        std::fs::read_to_string(self.node.dir.join("journal/journal.jsonl")).unwrap_or_default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_orchestrator_and_humans_create_archive_and_assign() {
    let h = harness(NO_DELAY).await;
    let mut dev = h.agent("dev").await;
    for (t, args) in [
        ("flock_channel_create", json!({"channel": "x"})),
        ("flock_channel_archive", json!({"channel": "x"})),
        ("flock_assign_members", json!({"channel": "x", "add": ["qa"]})),
    ] {
        let err = tool(&mut dev, t, args).await.unwrap_err();
        assert!(err.starts_with("FORBIDDEN"), "{t}: {err}");
    }
    let mut orch = h.agent("orchestrator").await;
    tool(
        &mut orch,
        "flock_channel_create",
        json!({"channel": "x", "topic": "t", "members": ["dev"]}),
    )
    .await
    .unwrap();
    h.human("alice", "flock_channel_create", json!({"channel": "y"})).await.unwrap();
    // Forbidden calls are journaled.
    let journal = h.journal();
    assert!(
        journal.lines().any(|l| l.contains("\"agent\":\"dev\"") && l.contains("FORBIDDEN")),
        "{journal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_argument_can_change_who_the_caller_is() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["dev", "qa"]}))
        .await
        .unwrap();
    let mut dev = h.agent("dev").await;
    let r = tool(
        &mut dev,
        "flock_channel_post",
        json!({"channel": "c", "text": "hi", "agentId": "orchestrator", "author": "orchestrator"}),
    )
    .await
    .unwrap();
    let seq = r["seq"].as_u64().unwrap();
    let read = tool(&mut dev, "flock_channel_read", json!({"channel": "c"})).await.unwrap();
    let msg = &read["messages"][(seq - 1) as usize];
    assert_eq!(msg["author"], "dev");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_get_deltas_with_channel_and_topic_and_never_a_replay() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut qa = h.agent("qa").await;
    tool(
        &mut orch,
        "flock_channel_create",
        json!({"channel": "proj", "topic": "Logging", "members": ["qa"]}),
    )
    .await
    .unwrap();
    tool(&mut orch, "flock_channel_post", json!({"channel": "proj", "text": "first"}))
        .await
        .unwrap();
    let (f, text) = delta(&mut qa).await;
    assert!(text.starts_with("[Channel: #proj]\nTopic: Logging\n"), "{text}");
    assert!(text.contains("[seq 1] orchestrator: first"));
    let Body::Deliver(d) = &f.body else { unreachable!() };
    assert_eq!(d.channel.as_deref(), Some("proj"));
    ack(&qa, &f).await;
    tool(&mut orch, "flock_channel_post", json!({"channel": "proj", "text": "second"}))
        .await
        .unwrap();
    let (f2, text2) = delta(&mut qa).await;
    assert!(text2.contains("[seq 2] orchestrator: second") && !text2.contains("first"), "{text2}");
    ack(&qa, &f2).await;
    // The author is not notified of its own post, and humans are never notified.
    nothing_for(&mut orch, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delta_is_rolled_back_and_retried_when_the_agent_returns() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["qa"]}))
        .await
        .unwrap();
    let mut qa = h.agent("qa").await;
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "one"})).await.unwrap();
    let _ = delta(&mut qa).await;
    drop(qa); // dies mid-turn: no ack
    tokio::time::sleep(Duration::from_millis(50)).await;
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "two"})).await.unwrap();
    let mut qa = h.agent("qa").await;
    let (f, text) = delta(&mut qa).await;
    assert!(
        text.contains("[seq 1] orchestrator: one") && text.contains("[seq 2] orchestrator: two"),
        "{text}"
    );
    ack(&qa, &f).await;
    nothing_for(&mut qa, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_replayed_after_a_supervisor_restart() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let h = harness_at(tmp.path(), 1, NO_DELAY).await;
        let mut orch = h.agent("orchestrator").await;
        let mut qa = h.agent("qa").await;
        tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["qa"]}))
            .await
            .unwrap();
        tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "old"}))
            .await
            .unwrap();
        let (f, _) = delta(&mut qa).await;
        ack(&qa, &f).await;
        // Wait until the cursor is committed (the next tool call goes through the same actor).
        tool(&mut orch, "flock_channel_list", json!({})).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.router.stop(None);
        if let Some(c) = &h.channels {
            c.stop(None);
        }
    }
    let h = harness_at(tmp.path(), 2, NO_DELAY).await;
    let mut qa = h.agent("qa").await;
    nothing_for(&mut qa, 300).await;
    let mut orch = h.agent("orchestrator").await;
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "new"})).await.unwrap();
    let (_, text) = delta(&mut qa).await;
    assert!(text.contains("[seq 2] orchestrator: new") && !text.contains("old"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_inside_the_delay_coalesces_into_one_notification() {
    let h = harness("{delta_delay_min_ms: 300, delta_delay_max_ms: 300}").await;
    let mut orch = h.agent("orchestrator").await;
    let mut qa = h.agent("qa").await;
    tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["qa"]}))
        .await
        .unwrap();
    for i in 1..=5 {
        tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": format!("m{i}")}))
            .await
            .unwrap();
    }
    let (f, text) = delta(&mut qa).await;
    assert!(text.contains("seq 1..5 (5)"), "{text}");
    ack(&qa, &f).await;
    nothing_for(&mut qa, 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mentions_wake_sleepers_and_reactive_agents_wake_only_on_mention_or_dm() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut dev = h.agent("dev").await;
    let mut dev_code = h.agent("dev-code").await;
    let mut sys = h.agent("sysadmin").await;
    tool(
        &mut orch,
        "flock_channel_create",
        json!({"channel": "c", "members": ["dev", "dev-code", "sysadmin"]}),
    )
    .await
    .unwrap();
    tool(&mut dev, "flock_sleep", json!({})).await.unwrap();
    tool(&mut dev_code, "flock_sleep", json!({})).await.unwrap();
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "status update"}))
        .await
        .unwrap();
    nothing_for(&mut dev, 200).await;
    nothing_for(&mut sys, 50).await;
    // `@dev` is an exact token: dev-code stays asleep.
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "@DEV please look"}))
        .await
        .unwrap();
    let (f, text) = delta(&mut dev).await;
    assert!(text.contains("@DEV please look"));
    ack(&dev, &f).await;
    nothing_for(&mut dev_code, 200).await;
    nothing_for(&mut sys, 50).await;
    tool(&mut orch, "flock_channel_post", json!({"channel": "c", "text": "@sysadmin disk?"}))
        .await
        .unwrap();
    let (f, _) = delta(&mut sys).await;
    ack(&sys, &f).await;
    // A DM reaches a REACTIVE agent.
    tool(&mut dev, "flock_message", json!({"to": "sysadmin", "text": "can I get network?"}))
        .await
        .unwrap();
    let (f, text) = delta(&mut sys).await;
    assert!(text.contains("dev: can I get network?"), "{text}");
    ack(&sys, &f).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_completes_when_every_member_is_ready_and_the_channel_turns_read_only() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut dev = h.agent("dev").await;
    let mut qa = h.agent("qa").await;
    tool(
        &mut orch,
        "flock_channel_create",
        json!({"channel": "c", "members": ["dev", "qa", "human:alice"]}),
    )
    .await
    .unwrap();
    let r = tool(&mut orch, "flock_channel_archive", json!({"channel": "c"})).await.unwrap();
    assert_eq!(r["state"], "archiving");
    let (f, notice) = delta(&mut dev).await;
    assert!(notice.contains("[archive]") && notice.contains("flock_archive_ready"), "{notice}");
    ack(&dev, &f).await;
    tool(&mut dev, "flock_archive_ready", json!({"channel": "c"})).await.unwrap();
    // A repeated ready re-checks and changes nothing.
    let r = tool(&mut dev, "flock_archive_ready", json!({"channel": "c"})).await.unwrap();
    assert_eq!(r["state"], "archiving");
    // Removing the member who is not ready completes the archive.
    tool(&mut orch, "flock_assign_members", json!({"channel": "c", "remove": ["qa"]}))
        .await
        .unwrap();
    let list = tool(&mut qa, "flock_channel_list", json!({})).await.unwrap();
    assert_eq!(list[0]["state"], "archived");
    let err = tool(&mut dev, "flock_channel_post", json!({"channel": "c", "text": "late"}))
        .await
        .unwrap_err();
    assert!(err.contains("archived and read-only"), "{err}");
    let read = tool(&mut qa, "flock_channel_read", json!({"channel": "c"})).await.unwrap();
    assert!(!read["messages"].as_array().unwrap().is_empty(), "archived channels stay readable");
    assert!(h.journal().contains("CHANNEL_ARCHIVED"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_deadline_archives_anyway_and_names_who_was_not_ready() {
    let h =
        harness("{delta_delay_min_ms: 0, delta_delay_max_ms: 0, archive_deadline_secs: 1}").await;
    let mut orch = h.agent("orchestrator").await;
    tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["dev", "qa"]}))
        .await
        .unwrap();
    tool(&mut orch, "flock_channel_archive", json!({"channel": "c"})).await.unwrap();
    let mut state = String::new();
    for _ in 0..100 {
        let list = tool(&mut orch, "flock_channel_list", json!({})).await.unwrap();
        state = list[0]["state"].as_str().unwrap().to_owned();
        if state == "archived" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(state, "archived");
    let journal = h.journal();
    let line = journal.lines().find(|l| l.contains("CHANNEL_ARCHIVED")).unwrap();
    assert!(line.contains("deadline passed; not ready: dev, qa"), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_an_agent_opened_that_goes_quiet_tells_its_opener_once() {
    let h = harness("{delta_delay_min_ms: 0, delta_delay_max_ms: 0, quiet_secs: 1}").await;
    let mut orch = h.agent("orchestrator").await;
    let members = json!({"channel": "project-x", "members": ["orchestrator", "dev"]});
    tool(&mut orch, "flock_channel_create", members).await.unwrap();
    // A channel a person opened is theirs to watch: no notice there.
    h.human("alice", "flock_channel_create", json!({"channel": "y", "members": ["orchestrator"]}))
        .await
        .unwrap();
    tool(&mut orch, "flock_channel_post", json!({"channel": "project-x", "text": "kick-off @dev"}))
        .await
        .unwrap();
    // A second of silence: the opener is @mentioned by Flock in the channel, as a delta.
    let (f, text) = delta(&mut orch).await;
    assert!(
        text.contains("flock: [quiet] #project-x has had no post for 1 s. @orchestrator"),
        "{text}"
    );
    ack(&orch, &f).await;
    // Once per quiet spell: the notice starts no new one.
    nothing_for(&mut orch, 2_500).await;
    let read =
        tool(&mut orch, "flock_channel_read", json!({"channel": "project-x"})).await.unwrap();
    let quiet =
        read["messages"].as_array().unwrap().iter().filter(|m| m["author"] == "flock").count();
    assert_eq!(quiet, 1, "{read}");
    let journal = h.journal();
    assert_eq!(journal.matches("CHANNEL_QUIET").count(), 1, "{journal}");
    assert!(!journal.contains("#y: no post"), "{journal}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_is_written_by_the_supervisor_under_the_callers_name_and_role() {
    let h = harness(NO_DELAY).await;
    let (mut dev, mut qa) = (h.agent("dev").await, h.agent("qa").await);
    let fact = |who: &str| json!({"text": format!("{who} owns the billing service."), "agent": "orchestrator"});
    let first = tool_as(&mut dev, 42, "memory_remember", fact("Ana")).await.unwrap();
    assert!(first.starts_with("remembered (medium), id dev-"), "{first}");
    // The same call id from another agent is another entry: ids are the caller's own.
    let other = tool_as(&mut qa, 42, "memory_remember", fact("Bo")).await.unwrap();
    assert!(other.starts_with("remembered"), "{other}");
    let again = tool_as(&mut dev, 42, "memory_remember", fact("Ana")).await.unwrap();
    assert!(again.starts_with("already remembered"), "{again}");
    let day = std::fs::read_dir(h.dir.join("memory/observations")).unwrap().next().unwrap();
    let text = std::fs::read_to_string(day.unwrap().path()).unwrap();
    assert!(text.contains("agent: dev -->") && text.contains("agent: qa -->"), "{text}");
    assert!(!text.contains("orchestrator"), "the caller comes from the connection: {text}");
    // The memory roles' writes are theirs alone; the sysadmin remembers nothing.
    for t in ["memory__observe", "memory__reflect", "memory__dream"] {
        let err = tool_as(&mut dev, 7, t, json!({"text": "x", "ids": ["a"], "document": "x"}))
            .await
            .unwrap_err();
        assert!(err.starts_with("FORBIDDEN"), "{t}: {err}");
    }
    let mut sysadmin = h.agent("sysadmin").await;
    let err = tool_as(&mut sysadmin, 8, "memory_remember", fact("Cy")).await.unwrap_err();
    assert!(err.starts_with("FORBIDDEN"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_an_agent_without_a_model_in_a_swarm_without_a_default_says_to_name_one() {
    let tmp = tempfile::tempdir().unwrap();
    let yaml = "swarm: {name: t}\nmodels:\n  s: {provider: scripted, rules: [{reply: ok}]}\n\
                agents:\n  - {name: orchestrator, role: orchestrator, model: s}\n";
    let h = Harness { _tmp: None, node: common::start(tmp.path(), 0, yaml, true).await };
    let err = h
        .human("alice", "flock_create_agent", json!({"name": "helper", "role": "worker"}))
        .await
        .unwrap_err();
    assert!(
        err.contains("say which model the agent runs") && err.contains("its models: s"),
        "{err}"
    );
    assert!(!err.contains("no model ``"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_archives_at_once() {
    let h = harness(NO_DELAY).await;
    h.human("alice", "flock_channel_create", json!({"channel": "c", "members": ["dev"]}))
        .await
        .unwrap();
    let r = h
        .human("alice", "flock_channel_archive", json!({"channel": "c", "force": true}))
        .await
        .unwrap();
    assert_eq!(r["state"], "archived");
    let err = h
        .human("alice", "flock_channel_post", json!({"channel": "c", "text": "x"}))
        .await
        .unwrap_err();
    assert!(err.starts_with("BAD_REQUEST") && err.contains("read-only"), "{err}");
    // Told to a person, the way out is a command they have, not an agent's tool.
    assert!(err.contains("`flockctl channels`") && !err.contains("flock_channel"), "{err}");
    let err = h.human("alice", "flock_channel_read", json!({"channel": "nope"})).await.unwrap_err();
    assert!(err.contains("no channel `#nope`; `flockctl channels` shows the channels"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cards_persist_and_discover_searches_text_role_and_skill() {
    let h = harness(NO_DELAY).await;
    let mut qa = h.agent("qa").await;
    tool(
        &mut qa,
        "flock_update_card",
        json!({"description": "tests everything", "skills": ["playwright"]}),
    )
    .await
    .unwrap();
    let found = tool(&mut qa, "flock_discover", json!({"skill": "playwright"})).await.unwrap();
    assert_eq!(found.as_array().unwrap().len(), 1);
    assert_eq!(found[0]["name"], "qa");
    let workers = tool(&mut qa, "flock_discover", json!({"role": "worker"})).await.unwrap();
    assert_eq!(workers.as_array().unwrap().len(), 3);
    let text = tool(&mut qa, "flock_discover", json!({"query": "EVERYTHING"})).await.unwrap();
    assert_eq!(text[0]["name"], "qa");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_author_never_gets_its_own_posts_back() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut dev = h.agent("dev").await;
    let mut qa = h.agent("qa").await;
    tool(&mut orch, "flock_channel_create", json!({"channel": "c", "members": ["dev", "qa"]}))
        .await
        .unwrap();
    tool(&mut dev, "flock_channel_post", json!({"channel": "c", "text": "dev speaks"}))
        .await
        .unwrap();
    let (f, text) = delta(&mut qa).await;
    ack(&qa, &f).await;
    assert!(text.contains("dev speaks"));
    tool(&mut qa, "flock_channel_post", json!({"channel": "c", "text": "qa answers"}))
        .await
        .unwrap();
    let (f, text) = delta(&mut dev).await;
    assert!(text.contains("qa answers") && !text.contains("dev speaks"), "{text}");
    assert!(text.contains("seq 2..2 (1)"), "{text}");
    ack(&dev, &f).await;
}

/// The next turn input of kind `kind` delivered to `conn`.
async fn input(conn: &mut Connection, kind: DeliveryKind) -> (Frame, flock_ipc::Delivery) {
    loop {
        let f = next(conn).await;
        if let Body::Deliver(d) = &f.body
            && d.kind == kind
        {
            let d = d.clone();
            return (f, d);
        }
    }
}

async fn ack_with(conn: &Connection, f: &Frame, reply: &str) {
    let body = Body::Ack { reply: Some(reply.into()) };
    let ack = Frame { correlation_id: Some(f.id), ..Frame::new("x", ROUTER, body) };
    conn.outbox.send(ack).await.unwrap();
}

/// The posts of `channel` as (author, text), oldest first.
async fn posts(h: &Harness, channel: &str) -> Vec<(String, String)> {
    let read = h.human("op", "flock_channel_read", json!({"channel": channel})).await.unwrap();
    read["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["author"].as_str().unwrap().into(), m["text"].as_str().unwrap().into()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_post_goes_to_one_responder_as_a_request_and_the_others_see_it_in_deltas() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut dev = h.agent("dev").await;
    let mut qa = h.agent("qa").await;
    let members = json!(["orchestrator", "dev", "qa", "human:alice"]);
    h.human("alice", "flock_channel_create", json!({"channel": "c", "members": members}))
        .await
        .unwrap();
    h.human("alice", "flock_channel_post", json!({"channel": "c", "text": "is the build green?"}))
        .await
        .unwrap();
    // No mention: the orchestrator member answers; the message says whom and where.
    let (f, d) = input(&mut orch, DeliveryKind::Message).await;
    assert_eq!((d.sender.as_str(), d.text.as_str()), ("human:alice", "is the build green?"));
    assert_eq!(d.answer_to.as_deref(), Some("human:alice"));
    assert_eq!(d.channel.as_deref(), Some("c"), "it runs in the channel's session");
    for other in [&mut dev, &mut qa] {
        let (df, text) = delta(other).await;
        assert!(text.contains("human:alice: is the build green?"), "{text}");
        ack(other, &df).await;
    }
    // The runtime posts the answer in the channel, once.
    ack_with(&orch, &f, "yes, all green").await;
    for other in [&mut dev, &mut qa] {
        let (df, text) = delta(other).await;
        assert!(text.contains("orchestrator: yes, all green"), "{text}");
        ack(other, &df).await;
    }
    nothing_for(&mut orch, 200).await;

    // A mention picks the agent that answers.
    h.human("alice", "flock_channel_post", json!({"channel": "c", "text": "@qa did it pass?"}))
        .await
        .unwrap();
    let (f, d) = input(&mut qa, DeliveryKind::Message).await;
    assert_eq!(d.text, "@qa did it pass?");
    let (df, _) = delta(&mut orch).await;
    ack(&orch, &df).await;
    let (df, _) = delta(&mut dev).await;
    ack(&dev, &df).await;
    // An explicit post where the person asked is the answer: the runtime adds no second one.
    tool(&mut qa, "flock_channel_post", json!({"channel": "c", "text": "14/14 pass"}))
        .await
        .unwrap();
    ack_with(&qa, &f, "14/14 pass (said in the channel)").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = posts(&h, "c").await;
    let by_qa: Vec<_> = all.iter().filter(|(a, _)| a == "qa").collect();
    assert_eq!(by_qa.len(), 1, "{all:?}");
    assert_eq!(all.len(), 4, "{all:?}");
    let journal = h.journal();
    assert!(journal.contains("ANSWER_DUPLICATE"), "the runtime's answer was not posted twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_request_is_stored_with_the_post_and_survives_a_supervisor_restart() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let h = harness_at(tmp.path(), 1, NO_DELAY).await;
        let members = json!(["orchestrator", "human:alice"]);
        h.human("alice", "flock_channel_create", json!({"channel": "c", "members": members}))
            .await
            .unwrap();
        // The orchestrator is not connected: the request waits in its durable mailbox.
        h.human("alice", "flock_channel_post", json!({"channel": "c", "text": "plan my week"}))
            .await
            .unwrap();
        h.router.stop(None);
        if let Some(c) = &h.channels {
            c.stop(None);
        }
    }
    let h = harness_at(tmp.path(), 2, NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let (f, d) = input(&mut orch, DeliveryKind::Message).await;
    assert_eq!((d.text.as_str(), d.answer_to.as_deref()), ("plan my week", Some("human:alice")));
    assert_eq!(d.channel.as_deref(), Some("c"));
    ack_with(&orch, &f, "Monday: talks; Tuesday: release").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = posts(&h, "c").await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[1], ("orchestrator".into(), "Monday: talks; Tuesday: release".into()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_flock_posts_for_people_start_no_chain() {
    let h = harness(NO_DELAY).await;
    let mut orch = h.agent("orchestrator").await;
    let mut dev = h.agent("dev").await;
    let members = json!(["orchestrator", "dev", "human:alice"]);
    h.human("alice", "flock_channel_create", json!({"channel": "c", "members": members}))
        .await
        .unwrap();
    // Archiving by a person posts a notice mentioning every agent: a notice, not a request.
    h.human("alice", "flock_channel_archive", json!({"channel": "c"})).await.unwrap();
    for conn in [&mut orch, &mut dev] {
        let (f, text) = delta(conn).await;
        assert!(text.contains("[archive]"), "{text}");
        ack(conn, &f).await;
    }
    nothing_for(&mut orch, 200).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_grown_by_huge_valid_messages_still_loads_in_one_frame() {
    // Twelve messages just under the message limit (an eighth of the frame) make a session of
    // 1.5 frames: loading all of it would be a frame nobody can read, on every start of the
    // agent. It loads its newest part, within half a frame. (A 1 MiB frame here, as the test
    // sockets have; the same holds at the default 16 MiB with 2 MiB messages.)
    let tmp = tempfile::tempdir().unwrap();
    let yaml = format!(
        "swarm: {{name: t}}\ndelivery: {{max_frame_bytes: 1048576}}\nmodels:\n  s: {{provider: scripted, rules: [{{reply: ok}}]}}\ndefaults: {{model: s}}\n{AGENTS}"
    );
    let node = common::start(tmp.path(), 0, &yaml, true).await;
    let mut dev = node.agent("dev").await;
    let big = |i: usize| format!("\"{}{}\"", i, "x".repeat(130_000));
    for i in 0..12 {
        let save = Frame::new(
            "dev",
            ROUTER,
            Body::SessionSave { channel: "c".into(), messages: format!("[{}]", big(i)) },
        );
        dev.outbox.send(save).await.unwrap();
    }
    let load = Frame::new("dev", ROUTER, Body::SessionLoad { channel: "c".into() });
    dev.outbox.send(load.clone()).await.unwrap();
    let reply = loop {
        let f = next(&mut dev).await;
        if f.correlation_id == Some(load.id) {
            break f;
        }
    };
    let Body::SessionData { messages, .. } = reply.body else { panic!("{:?}", reply.body) };
    assert!(messages.len() <= 512 * 1024, "{} bytes", messages.len());
    let items: Vec<String> = serde_json::from_str(&messages).unwrap();
    assert!((1..12).contains(&items.len()), "{} messages", items.len());
    assert!(items.last().unwrap().starts_with("11x"), "the newest is kept");
}
