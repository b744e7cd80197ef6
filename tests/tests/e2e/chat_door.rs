//! The chat door (issue #21), with scripted models against `FakeTelegram` (a real Bot API server
//! on loopback; the real `flock-bridge` runs under the real supervisor): a person's message in a
//! mapped chat (or a DM with the bot) starts a chain; the runtime — not the model — posts the
//! chain's answer back as a reply to that message, once, whatever crashes happen; the chat
//! shows "typing" while the chain runs; a budget stop, a failing provider and a permission
//! request waiting for a person reach the chat; only approvers decide from it.
//!
//! The same on the embedded model, on all three platforms: `local_model.rs`.

use std::time::Duration;

use flock_testkit::Swarm;
use flock_testkit::fake_llm::{FakeLlm, FakeProvider, Reply};
use flock_testkit::fake_telegram::{FakeTelegram, SentMessage};
use serde_json::Value;

use crate::{LONG, SHORT};

const TOKEN: &str = "123456:TEST-token-chat-door";
const CHAT: i64 = -100_500_600;
/// The person who may approve permission requests from the chat.
const APPROVER: i64 = 7;

/// A swarm behind a Telegram group: #team answered by the coordinator, who delegates file work
/// to the worker; `extra` is appended at the top level (a budget, say).
fn yaml(api_url: &str, coordinator_model: &str, extra: &str) -> String {
    format!(
        r#"swarm:
  name: door
channels: {{ delta_delay_min_ms: 0, delta_delay_max_ms: 0 }}
{extra}
models:
  coord:
    provider: scripted
    rules:
      - match: "sum"
        reply: "17 + 25 = 42"
      - match: "slow"
        steps: [ {{ delay_ms: 2500 }} ]
        reply: "slow answer"
      # A small model's habit: it claims the file instead of handing the work over. The
      # runtime hands a request for a file to the worker without asking it.
      - match: "file"
        reply: "Here is a file named notes.txt in your workspace."
      # A request that names no file, answered with a claim: the runtime hands it over instead.
      - match: "trip"
        reply: "I saved your notes to trip.md."
      - reply: "noted: {{input}}"
  work:
    provider: scripted
    rules:
      # Asked once more when it claims a file it did not write; then it writes it.
      - match: "no file was written"
        steps: [ {{ tool: fs_write, args: {{ path: notes.txt, content: "hello from the chat" }} }} ]
        reply: "I wrote notes.txt"
      - match: "file"
        reply: "Sure! notes.txt is ready."
      - match: "trip"
        steps: [ {{ tool: fs_write, args: {{ path: trip.md, content: "Lisbon, 3 days" }} }} ]
        reply: "Saved trip.md"
      - match: "permission"
        steps:
          - tool: permission_request
            args: {{ capability: network, target: crates.io, reason: "fetch the dependencies" }}
        reply: "asked for crates.io"
      - reply: "ok"
agents:
  - {{ name: coordinator, role: coordinator, model: {coordinator_model}, can_call: [worker] }}
  - {{ name: worker, role: worker, model: work }}
bridges:
  - name: tg
    platform: telegram
    token_env: TG_TOKEN
    api_url: {api_url}
    max_posts_per_minute: 600
    approvals: team
    approvers: ["{APPROVER}"]
    dm: {{ agent: coordinator, allow: ["555"] }}
    channels:
      - {{ flock: team, external: "{CHAT}", responder: coordinator }}
"#
    )
}

fn start(fake: &FakeTelegram, coordinator_model: &str, extra: &str) -> Swarm {
    fake.add_chat(CHAT, "Team");
    let swarm = Swarm::builder(&yaml(&fake.base_url(), coordinator_model, extra))
        .env("TG_TOKEN", TOKEN)
        .start();
    swarm.wait_until(
        || swarm.ps().iter().any(|r| r["name"] == "bridge-tg" && r["state"] == "connected"),
        LONG,
        "the bridge is connected",
    );
    swarm
}

/// The coordinator's messages in the chat (its answers and notices), in order.
fn answers(fake: &FakeTelegram, chat: i64) -> Vec<SentMessage> {
    fake.sent_to(chat).into_iter().filter(|m| m.plain.starts_with("[coordinator]")).collect()
}

/// Waits for the `n`th answer of the coordinator in `chat`.
fn wait_answers(swarm: &Swarm, fake: &FakeTelegram, chat: i64, n: usize) -> Vec<SentMessage> {
    swarm.wait_until(|| answers(fake, chat).len() >= n, LONG, "the coordinator's answer");
    answers(fake, chat)
}

/// The journal events matching `query`, oldest first.
fn journal(swarm: &Swarm, query: &str) -> Vec<Value> {
    let out = swarm.ctl_ok(&["journal", "query", query, "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not a JSON array ({e}): {out}"))
}

/// The chain a person's message started: the correlation id of the journal's `SEND` by them.
fn chain_of(swarm: &Swarm, person: &str) -> String {
    let sends = journal(swarm, &format!("type=SEND agent={person}"));
    let last = sends.last().unwrap_or_else(|| panic!("no SEND by {person}"));
    last["trace"]["correlation_id"].as_str().expect("a chain id").to_owned()
}

/// The action types of a chain's journal story, oldest first.
fn story(swarm: &Swarm, chain: &str) -> Vec<String> {
    journal(swarm, &format!("corr={chain}"))
        .iter()
        .filter_map(|e| e["action"]["type"].as_str().map(str::to_owned))
        .collect()
}

#[test]
fn a_question_in_the_chat_is_answered_there_once_as_a_reply_and_the_journal_tells_its_story() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "");
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "what is the sum of 17 and 25?");
    let got = wait_answers(&swarm, &fake, CHAT, 1);
    assert_eq!(got[0].plain, "[coordinator] 17 + 25 = 42");
    assert_eq!(got[0].reply_to, Some(asked), "a reply to alice's message: {got:#?}");

    // The chain, told once: SEND by alice (hop 1), the coordinator's TURN, the ANSWER.
    let chain = chain_of(&swarm, "human:telegram:alice");
    let kinds = story(&swarm, &chain);
    assert_eq!(kinds, ["SEND", "TURN", "ANSWER"], "{kinds:?}");

    // A file: the runtime hands it to the worker (the coordinator's model only claimed it), the
    // worker is asked once more when it claims the file without writing it, and its fs_write
    // does the work; the coordinator relays its result once.
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "please write a file of notes");
    let got = wait_answers(&swarm, &fake, CHAT, 2);
    // (The scripted worker says this after it wrote the file when asked once more.)
    assert_eq!(got[1].plain, "[coordinator] Sure! notes.txt is ready.");
    assert_eq!(got[1].reply_to, Some(asked));
    let file = swarm.state_dir().join("workspaces/worker/notes.txt");
    assert_eq!(std::fs::read_to_string(&file).unwrap_or_default(), "hello from the chat");
    let kinds = story(&swarm, &chain_of(&swarm, "human:telegram:alice"));
    for k in ["SEND", "DELEGATE", "RESULT", "ANSWER"] {
        assert_eq!(kinds.iter().filter(|x| *x == k).count(), 1, "one {k}: {kinds:?}");
    }

    // An answer that claims a file no tool wrote is not sent: the request goes to the worker.
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "keep my trip notes: Lisbon, 3 days");
    let got = wait_answers(&swarm, &fake, CHAT, 3);
    assert_eq!(
        (got[2].plain.as_str(), got[2].reply_to),
        ("[coordinator] Saved trip.md", Some(asked))
    );
    let trip = swarm.state_dir().join("workspaces/worker/trip.md");
    assert_eq!(std::fs::read_to_string(&trip).unwrap_or_default(), "Lisbon, 3 days");

    // Nothing else reached the chat (the person's own messages never come back), and #team
    // holds the three questions and their answers.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fake.sent_to(CHAT).len(), 3, "{:#?}", fake.sent_to(CHAT));
    let posts = swarm.ctl_ok(&["read", "#team", "--json"]);
    assert_eq!(posts.lines().count(), 6, "{posts}");
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
}

#[test]
fn the_chat_shows_typing_while_the_chain_runs_and_flockctl_chains_shows_it() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "");
    fake.post(CHAT, 42, "Alice", Some("alice"), "a slow question");
    swarm.wait_until(
        || swarm.ctl_ok(&["chains", "--json"]).contains("human:telegram:alice"),
        SHORT,
        "the chain is in flight",
    );
    swarm.wait_until(
        || fake.chat_actions(CHAT).iter().any(|a| a == "typing"),
        SHORT,
        "the chat shows typing",
    );
    let got = wait_answers(&swarm, &fake, CHAT, 1);
    assert_eq!(got[0].plain, "[coordinator] slow answer");
    // Once answered, typing is not shown again (it is refreshed every 4 s while the chain runs).
    let typed = fake.chat_actions(CHAT).len();
    std::thread::sleep(Duration::from_millis(5000));
    assert_eq!(fake.chat_actions(CHAT).len(), typed, "typing after the answer");
}

#[test]
fn kill9_of_the_bridge_and_of_the_coordinator_mid_chain_still_answer_exactly_once() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "");
    let in_flight = |swarm: &Swarm| swarm.ctl_ok(&["chains", "--json"]).contains("telegram:alice");

    // The bridge dies while the coordinator works: the answer waits in the channel, the
    // restarted bridge delivers it, once.
    let first = fake.post(CHAT, 42, "Alice", Some("alice"), "slow one, please");
    swarm.wait_until(|| in_flight(&swarm), SHORT, "the chain is in flight");
    swarm.kill9("bridge-tg");
    let got = wait_answers(&swarm, &fake, CHAT, 1);
    assert_eq!(
        (got[0].plain.as_str(), got[0].reply_to),
        ("[coordinator] slow answer", Some(first))
    );

    // The coordinator dies mid-turn: its input is redelivered, the answer posted once.
    let second = fake.post(CHAT, 42, "Alice", Some("alice"), "another slow one");
    swarm.wait_until(
        || in_flight(&swarm) && swarm.agent("coordinator")["state"] == "busy",
        SHORT,
        "the coordinator works on it",
    );
    swarm.kill9("coordinator");
    let got = wait_answers(&swarm, &fake, CHAT, 2);
    assert_eq!(got[1].reply_to, Some(second));
    swarm.wait_until(|| !in_flight(&swarm), LONG, "the chain ended");
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(answers(&fake, CHAT).len(), 2, "{:#?}", fake.sent_to(CHAT));
    let posts = swarm.ctl_ok(&["read", "#team", "--json"]);
    assert_eq!(posts.matches("slow answer").count(), 2, "one answer per question: {posts}");
}

#[test]
fn a_budget_stop_is_told_in_the_chat_as_the_answer() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "budget: { max_wall_secs: 1 }");
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "a slow question");
    let got = wait_answers(&swarm, &fake, CHAT, 1);
    assert!(got[0].plain.starts_with("[coordinator] [stopped] I stopped working on"), "{got:#?}");
    assert!(got[0].plain.contains("1 s time budget"), "{}", got[0].plain);
    assert_eq!(got[0].reply_to, Some(asked));
    // The cancelled turn's answer never follows.
    swarm.wait_until(|| swarm.agent("coordinator")["state"] == "ready", SHORT, "idle again");
    std::thread::sleep(Duration::from_millis(3000));
    assert_eq!(answers(&fake, CHAT).len(), 1, "{:#?}", fake.sent_to(CHAT));
}

#[test]
fn a_provider_that_keeps_failing_is_told_to_the_person_in_plain_words() {
    let llm = FakeLlm::start(FakeProvider::OpenAi);
    llm.always(Reply::Error {
        status: 401,
        message: "Incorrect API key provided".into(),
        retry_after: None,
    });
    let fake = FakeTelegram::start(TOKEN);
    let model = format!(
        "models:\n  remote: {{ provider: openai, base_url: \"{}\", model: m, retry_base_ms: 10 }}",
        llm.base_url()
    );
    // The file's `models:` gets the remote one too (the top-level block is merged by name).
    let swarm_yaml = yaml(&fake.base_url(), "remote", "")
        .replace("models:\n", &format!("models:\n{}\n", model.trim_start_matches("models:\n")));
    fake.add_chat(CHAT, "Team");
    let swarm = Swarm::builder(&swarm_yaml).env("TG_TOKEN", TOKEN).start();
    let asked = fake.post(CHAT, 42, "Alice", Some("alice"), "hello?");
    let got = wait_answers(&swarm, &fake, CHAT, 1);
    let text = &got[0].plain;
    assert!(text.starts_with("[coordinator] [failed] I could not get an answer from the model"));
    assert!(text.contains("try again"), "{text}");
    assert_eq!(got[0].reply_to, Some(asked));
    // Told once: the input is done, not retried into a dead letter.
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(answers(&fake, CHAT).len(), 1);
    assert!(swarm.ctl_ok(&["dead-letters", "--json"]).trim().trim_matches(['[', ']']).is_empty());
}

#[test]
fn a_dm_with_the_bot_reaches_the_coordinator_and_follow_ups_continue_the_same_conversation() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "");
    let first = fake.post_private(555, "Dana", Some("dana"), "what is the sum of 17 and 25?");
    let got = wait_answers(&swarm, &fake, 555, 1);
    assert_eq!(
        (got[0].plain.as_str(), got[0].reply_to),
        ("[coordinator] 17 + 25 = 42", Some(first))
    );
    let second = fake.post_private(555, "Dana", Some("dana"), "and remember I like tea");
    let got = wait_answers(&swarm, &fake, 555, 2);
    assert_eq!(got[1].reply_to, Some(second));
    assert_eq!(got[1].plain, "[coordinator] noted: and remember I like tea");

    // One DM channel for her, both exchanges in it, and one session with both turns.
    let dm = "dm-coordinator--human-tg-555";
    let posts = swarm.ctl_ok(&["read", dm, "--json"]);
    assert_eq!(posts.lines().count(), 4, "{posts}");
    let session = swarm.ctl_ok(&["session", "show", "coordinator", "--channel", dm, "--json"]);
    assert!(
        session.contains("what is the sum") && session.contains("I like tea"),
        "one session holds the whole conversation: {session}"
    );
    assert!(fake.sent_to(CHAT).is_empty(), "nothing went to the group");

    // Someone not on `dm.allow` is not answered, and the refusal is journaled.
    fake.post_private(666, "Eve", Some("eve"), "hello bot");
    swarm.wait_until(|| fake.pending_updates() == 0, SHORT, "eve's message is handled");
    let refused = swarm.ctl_ok(&["journal", "query", "type=BRIDGE_POST_REFUSED", "--json"]);
    assert!(refused.contains("666"), "{refused}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(fake.sent_to(666).is_empty());
}

#[test]
fn a_waiting_permission_request_is_announced_and_only_an_approver_decides_it_from_the_chat() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, "coord", "");
    swarm.ctl_ok(&["channel", "members", "#team", "--add", "worker", "--as", "bob"]);
    fake.post(CHAT, 42, "Alice", Some("alice"), "@worker do you have permission for crates.io?");
    swarm.wait_until(
        || fake.sent_to(CHAT).iter().any(|m| m.plain.contains("[approval needed] #1")),
        LONG,
        "the request is announced",
    );
    let notice = fake.sent_to(CHAT).into_iter().find(|m| m.plain.contains("#1")).unwrap();
    assert!(notice.plain.contains("worker asks for network crates.io"), "{}", notice.plain);
    assert!(notice.plain.contains("fetch the dependencies"), "why: {}", notice.plain);
    assert!(notice.plain.contains("/approve 1"), "{}", notice.plain);

    // Someone who is not an approver: told, refused, journaled; the request still waits.
    let tried = fake.post(CHAT, 8, "Mallory", Some("mallory"), "/approve 1");
    swarm.wait_until(
        || fake.sent_to(CHAT).iter().any(|m| m.reply_to == Some(tried)),
        LONG,
        "mallory is answered",
    );
    let refusal = fake.sent_to(CHAT).into_iter().find(|m| m.reply_to == Some(tried)).unwrap();
    assert!(refusal.plain.contains("Only the people on bridge tg's approvers list"), "{refusal:?}");
    let refused = swarm.ctl_ok(&["journal", "query", "type=BRIDGE_POST_REFUSED", "--json"]);
    assert!(refused.contains("approvers"), "{refused}");
    let waiting = swarm.ctl_ok(&["approvals", "--json"]);
    assert!(waiting.contains("\"waiting\""), "{waiting}");

    // The approver: decided, durably, as them; the worker is told.
    let approved = fake.post(CHAT, APPROVER, "Ann", Some("ann"), "/approve@flock_bot 1 fine by me");
    swarm.wait_until(
        || fake.sent_to(CHAT).iter().any(|m| m.reply_to == Some(approved)),
        LONG,
        "ann is answered",
    );
    let done = fake.sent_to(CHAT).into_iter().find(|m| m.reply_to == Some(approved)).unwrap();
    assert!(done.plain.contains("Done: request #1 granted"), "{done:?}");
    let all = swarm.ctl_ok(&["approvals", "--all", "--json"]);
    assert!(all.contains("\"granted\"") && all.contains("human:telegram:ann"), "{all}");
    let granted = swarm.ctl_ok(&["journal", "query", "type=PERMISSION_GRANTED", "--json"]);
    assert!(granted.contains("human:telegram:ann"), "{granted}");
    swarm.wait_until(
        || swarm.ctl_ok(&["logs", "worker", "--lines", "200"]).contains("permission #1 granted"),
        LONG,
        "the worker gets the grant",
    );
}

/// The coordinator's scripted model and the agents, with `bridge` (one bridge entry, YAML).
fn platform_yaml(bridge: &str) -> String {
    let base = yaml("http://127.0.0.1:9", "coord", "");
    let head = base.split("bridges:\n").next().expect("the yaml has bridges").to_owned();
    format!("{head}bridges:\n{bridge}")
}

#[test]
fn discord_a_question_and_a_dm_are_answered_as_replies_with_typing_shown() {
    use flock_testkit::fake_discord::FakeDiscord;
    const DC: u64 = 900_000_000_000_000_101;
    const DM: u64 = 900_000_000_000_000_102;
    let discord = FakeDiscord::start("discord-token-chat-door");
    discord.add_channel(DC, "team");
    discord.add_dm(DM, 4343, "dana");
    let bridge = format!(
        "  - name: dc\n    platform: discord\n    token_env: DC_TOKEN\n    api_url: {}\n    \
         max_posts_per_minute: 600\n    channels:\n      - {{ flock: team, external: \"{DC}\", \
         responder: coordinator }}\n",
        discord.base_url()
    );
    let swarm =
        Swarm::builder(&platform_yaml(&bridge)).env("DC_TOKEN", "discord-token-chat-door").start();
    discord.wait_connected(LONG);

    let asked = discord.post(DC, 4242, "alice", "a slow question");
    swarm.wait_until(|| discord.typings(DC) > 0, SHORT, "typing is shown in the channel");
    let sent = discord.wait_sent(DC, 1, LONG);
    assert_eq!(sent[0].content, "**[coordinator]** slow answer");
    assert_eq!(sent[0].reply_to, Some(asked));

    // A DM with the bot: the coordinator answers there, as a reply (no webhook in a DM).
    let dm = discord.post(DM, 4343, "dana", "what is the sum of 17 and 25?");
    let sent = discord.wait_sent(DM, 1, LONG);
    assert_eq!(
        (sent[0].content.as_str(), sent[0].reply_to),
        ("**[coordinator]** 17 + 25 = 42", Some(dm))
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(discord.sent(DC).len(), 1, "{:#?}", discord.sent(DC));
    assert_eq!(discord.sent(DM).len(), 1, "{:#?}", discord.sent(DM));
}

#[test]
fn slack_a_question_is_answered_in_its_thread_marked_while_worked_on_and_an_im_is_answered() {
    use flock_testkit::fake_slack::{self, FakeSlack};
    const SC: &str = "C0DOOR";
    const IM: &str = "D0DANA";
    let slack = FakeSlack::start();
    slack.add_channel(SC, "team");
    slack.add_im(IM, "U55", "dana");
    let bridge = format!(
        "  - name: sl\n    platform: slack\n    token_env: SL_BOT_TOKEN\n    app_token_env: \
         SL_APP_TOKEN\n    api_url: {}\n    max_posts_per_minute: 600\n    channels:\n      - {{ \
         flock: team, external: \"{SC}\", responder: coordinator }}\n",
        slack.api_url()
    );
    let swarm = Swarm::builder(&platform_yaml(&bridge))
        .env("SL_BOT_TOKEN", fake_slack::BOT_TOKEN)
        .env("SL_APP_TOKEN", fake_slack::APP_TOKEN)
        .start();
    slack.wait_connected(LONG);

    let asked = slack.post(SC, "U42", "alice", "a slow question");
    swarm.wait_until(
        || slack.reactions(SC, &asked) == ["hourglass_flowing_sand"],
        SHORT,
        "alice's message is marked as worked on",
    );
    let sent = slack.wait_sent(SC, 1, LONG);
    assert_eq!(sent[0].text, "slow answer");
    assert_eq!(sent[0].username.as_deref(), Some("coordinator"));
    assert_eq!(sent[0].thread_ts.as_deref(), Some(asked.as_str()), "in alice's thread");
    swarm.wait_until(|| slack.reactions(SC, &asked).is_empty(), SHORT, "the mark is taken off");
    // A follow-up in that thread is answered in the same thread (Slack wants the parent's ts).
    slack.post_in_thread(SC, &asked, "U42", "alice", "and the sum of 17 and 25?");
    let sent = slack.wait_sent(SC, 2, LONG);
    assert_eq!(sent[1].text, "17 + 25 = 42");
    assert_eq!(sent[1].thread_ts.as_deref(), Some(asked.as_str()), "in the same thread");

    let im = slack.post(IM, "U55", "dana", "what is the sum of 17 and 25?");
    let sent = slack.wait_sent(IM, 1, LONG);
    assert_eq!(sent[0].text, "17 + 25 = 42");
    assert_eq!(sent[0].thread_ts.as_deref(), Some(im.as_str()));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(slack.sent(SC).len(), 2);
    // Every mark put on is taken off (a question answered within a pull may get none).
    let log = slack.reaction_log();
    let count = |method: &str| log.iter().filter(|(m, ..)| m == method).count();
    assert!(count("reactions.add") >= 2, "{log:#?}");
    assert_eq!(count("reactions.add"), count("reactions.remove"), "{log:#?}");
}
