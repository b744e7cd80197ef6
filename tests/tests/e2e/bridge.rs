//! Chat bridges (issue #9) against `FakeTelegram`, a real HTTP server that speaks the Telegram Bot
//! API wire format (protocol-fake tests: green here is not "works with Telegram"; see
//! `scripts/bridge-smoke` for a live check with a real token). The real `flock-bridge` process
//! runs under the real supervisor: a person's message reaches the channel once, wakes the agent
//! it mentions, the agent's post goes back to the chat under its name, nothing echoes, and a
//! `kill -9` of the bridge loses nothing.

use std::collections::HashMap;
use std::time::Duration;

use flock_testkit::Swarm;
use flock_testkit::fake_telegram::FakeTelegram;
use serde_json::Value;

use crate::{LONG, SHORT};

const TOKEN: &str = "123456:TEST-token-must-never-leak";
const CHAT: i64 = -100_200_300;

fn swarm_yaml(api_url: &str, allow: Option<&str>) -> String {
    let allow = allow.map(|a| format!("\n        allow: [\"{a}\"]")).unwrap_or_default();
    format!(
        r#"swarm:
  name: bridged
channels:
  delta_delay_min_ms: 0
  delta_delay_max_ms: 0
models:
  builder:
    provider: scripted
    rules:
      - match: "build"
        steps:
          - tool: flock_channel_post
            args: {{ channel: "team", text: "Built it. Tests pass (3/3)!" }}
        reply: "done"
      - reply: "noted"
agents:
  - {{ name: worker, role: worker, model: builder }}
bridges:
  - name: tg
    platform: telegram
    token_env: TG_TOKEN
    api_url: {api_url}
    max_posts_per_minute: 600
    channels:
      - flock: team
        external: "{CHAT}"{allow}
"#
    )
}

fn start(fake: &FakeTelegram, allow: Option<&str>) -> Swarm {
    fake.add_chat(CHAT, "Team");
    Swarm::builder(&swarm_yaml(&fake.base_url(), allow)).env("TG_TOKEN", TOKEN).start()
}

fn bridge_row(swarm: &Swarm) -> Value {
    swarm
        .ps()
        .into_iter()
        .find(|r| r["name"] == "bridge-tg")
        .unwrap_or_else(|| panic!("no bridge-tg row in ps: {}", swarm.report("ps")))
}

/// The posts of `#team`, oldest first (every page).
fn posts(swarm: &Swarm) -> Vec<Value> {
    let mut all = Vec::new();
    loop {
        let after = all.last().map_or(0, |p: &Value| p["seq"].as_u64().unwrap_or(0));
        let out = swarm.ctl_ok(&[
            "read",
            "#team",
            "--after",
            &after.to_string(),
            "--limit",
            "200",
            "--json",
        ]);
        let page: Vec<Value> =
            out.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

fn wait_connected(swarm: &Swarm) {
    swarm.wait_until(|| bridge_row(swarm)["state"] == "connected", LONG, "the bridge is connected");
}

#[test]
fn a_person_on_telegram_wakes_the_agent_and_its_post_comes_back_under_its_name_without_echo() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, None);
    wait_connected(&swarm);
    // The bridge created its channel; a person adds the worker.
    swarm.ctl_ok(&["channel", "members", "#team", "--add", "worker", "--as", "bob"]);

    fake.post(CHAT, 42, "Alice", Some("alice"), "@worker build the login page");
    let sent = fake.wait_sent(CHAT, 1, LONG);
    assert_eq!(sent[0].parse_mode.as_deref(), Some("MarkdownV2"));
    assert_eq!(sent[0].plain, "[worker] Built it. Tests pass (3/3)!", "raw: {}", sent[0].text);

    let posts = posts(&swarm);
    assert_eq!(posts.len(), 2, "{posts:#?}");
    assert_eq!(posts[0]["author"], "human:telegram:alice");
    assert_eq!(posts[0]["text"], "@worker build the login page");
    assert_eq!(posts[1]["author"], "worker");
    // Alice's own message never went back to her chat.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fake.sent_to(CHAT).len(), 1, "an echo: {:#?}", fake.sent_to(CHAT));
    assert!(fake.rejected().is_empty(), "the fake refused a call: {:?}", fake.rejected());
    assert_eq!(fake.pending_updates(), 0, "every update was confirmed once handled");

    let row = bridge_row(&swarm);
    assert_eq!(row["kind"], "bridge");
    assert_eq!(row["role"], "telegram");
    assert!(row["pid"].as_u64().is_some(), "{row}");
    swarm.wait_until(|| bridge_row(&swarm)["turns_total"] == 2, SHORT, "1 in + 1 out counted");
    // Nor is it in the bridge's environment, where /proc would show it between exec and the
    // moment the bridge makes itself non-dumpable: it came over the inherited socket.
    let pid = row["pid"].as_u64().unwrap();
    if let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) {
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains(TOKEN), "the platform token is in the bridge's environment");
        assert!(!environ.contains("FLOCK_TOKEN"), "the spawn token is in the environment");
        assert!(environ.contains("FLOCK_SECRETS_FD="), "{environ}");
    }

    // The token is in no log, no ps output, no journal and not in the supervisor's output.
    let mut seen = swarm.supervisor_output();
    seen += &swarm.ctl_ok(&["ps", "--json"]);
    seen += &swarm.ctl_ok(&["logs", "bridge-tg", "--lines", "1000"]);
    for dir in ["logs", "journal"] {
        for entry in std::fs::read_dir(swarm.state_dir().join(dir)).into_iter().flatten().flatten()
        {
            seen += &std::fs::read_to_string(entry.path()).unwrap_or_default();
        }
    }
    assert!(seen.contains("bridge `tg` (telegram) connected"), "the bridge's log is there");
    assert!(!seen.contains("TEST-token"), "the bot token leaked");

    // Markdown as agents write it arrives as Telegram entities (parsed by the fake's MarkdownV2
    // parser, modelled on tdlib's), not as literal stars and backticks.
    let md = "**Done**: run `cargo test -p x` and see [the PR](https://x.io/pr/1) (v1.2)!\n```rust\nlet a = b * 2;\n```";
    swarm.ctl_ok(&["post", "#team", md, "--as", "bob"]);
    let sent = fake.wait_sent(CHAT, 2, LONG);
    assert!(fake.rejected().is_empty(), "Telegram refused it: {:?}", fake.rejected());
    let m = &sent[1];
    assert_eq!(
        m.plain, "[bob] Done: run cargo test -p x and see the PR (v1.2)!\nlet a = b * 2;",
        "raw: {}",
        m.text
    );
    let entity = |kind: &str, covers: &str| {
        let at = m.plain.find(covers).unwrap_or_else(|| panic!("{covers:?} in {:?}", m.plain));
        m.entities.iter().find(|e| {
            e["type"] == kind
                && e["offset"].as_u64() == Some(at as u64)
                && e["length"].as_u64() == Some(covers.len() as u64)
        })
    };
    assert!(entity("bold", "[bob]").is_some(), "{:#?}", m.entities);
    assert!(entity("bold", "Done").is_some(), "{:#?}", m.entities);
    assert!(entity("code", "cargo test -p x").is_some(), "{:#?}", m.entities);
    let link = entity("text_link", "the PR").unwrap_or_else(|| panic!("{:#?}", m.entities));
    assert_eq!(link["url"], "https://x.io/pr/1");
    let pre = entity("pre", "let a = b * 2;").unwrap_or_else(|| panic!("{:#?}", m.entities));
    assert_eq!(pre["language"], "rust");
    assert_eq!(m.entities.len(), 5, "nothing else: {:#?}", m.entities);
}

#[test]
fn kill9_of_the_bridge_during_a_burst_loses_nothing_and_posts_nothing_twice() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, None);
    wait_connected(&swarm);
    const N: usize = 200;
    let person = |i: usize| {
        let user = 1000 + (i % 7) as i64;
        fake.post(CHAT, user, "P", Some(&format!("p{}", i % 7)), &format!("in-{i}"));
    };
    let ins_so_far = |swarm: &Swarm| {
        posts(swarm).iter().filter(|p| p["text"].as_str().unwrap_or("").starts_with("in-")).count()
    };
    // Kill 1: in the middle of a batch of people's messages (some posted, none confirmed yet:
    // Telegram hands the whole batch over again to the next process).
    let mut killed = Vec::new();
    (0..N / 2).for_each(person);
    swarm.wait_until(|| ins_so_far(&swarm) >= 10, LONG, "the bridge is bringing the burst in");
    killed.push(swarm.kill9("bridge-tg"));
    // Kill 2: in the middle of a backlog of posts going out (a 429 held the first one back for
    // 3 s while the rest piled up) and of a second burst of messages coming in.
    swarm.wait_until(|| bridge_row(&swarm)["state"] == "connected", LONG, "the bridge is back");
    fake.fail_sends_with_429(1, 3);
    for i in 0..N / 2 {
        swarm.ctl_ok(&["post", "#team", &format!("out-{i}"), "--as", "bob"]);
    }
    (N / 2..N).for_each(person);
    let _ = fake.wait_sent(CHAT, 10, LONG);
    killed.push(swarm.kill9("bridge-tg"));
    for i in N / 2..N {
        swarm.ctl_ok(&["post", "#team", &format!("out-{i}"), "--as", "bob"]);
    }
    swarm.wait_until(|| ins_so_far(&swarm) >= N, LONG, "every inbound message is in the channel");
    let _ = fake.wait_sent(CHAT, N, LONG);
    std::thread::sleep(Duration::from_millis(500));

    // In: exactly once each, in the platform's order.
    let ins: Vec<String> = posts(&swarm)
        .iter()
        .filter_map(|p| p["text"].as_str().filter(|t| t.starts_with("in-")).map(str::to_owned))
        .collect();
    let want: Vec<String> = (0..N).map(|i| format!("in-{i}")).collect();
    if ins != want {
        let first_bad = ins.iter().zip(&want).position(|(a, b)| a != b);
        panic!("inbound: {} posts for {N} messages, first difference at {first_bad:?}", ins.len());
    }
    // Out: every post, in order. The Bot API has no idempotency key and no history to check,
    // so a kill between Telegram's answer and the cursor's commit may send that one post again
    // (at-least-once for the one in flight); nothing else may repeat.
    let outs: Vec<String> = fake
        .sent_to(CHAT)
        .iter()
        .map(|m| m.plain.trim_start_matches("[bob] ").to_owned())
        .collect();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for o in &outs {
        *counts.entry(o.as_str()).or_default() += 1;
    }
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.len() <= 1 && doubled.iter().all(|(_, n)| **n == 2), "doubled: {doubled:?}");
    let mut deduped = outs.clone();
    deduped.dedup();
    let want: Vec<String> = (0..N).map(|i| format!("out-{i}")).collect();
    assert_eq!(deduped, want, "outbound: lost or reordered");
    // No echo of a person's message went back to the chat.
    assert!(outs.iter().all(|o| !o.contains("in-")), "an echo");
    let row = bridge_row(&swarm);
    assert_eq!(row["restarts"], 2, "the bridge was restarted after each kill: {row}");
    assert!(!killed.contains(&(row["pid"].as_u64().unwrap_or(0) as u32)), "{row}");
    eprintln!("kill -9 x2 during the burst: {} messages sent for {N} posts", outs.len());
}

#[test]
fn a_429_storm_delays_posts_but_loses_none() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, None);
    wait_connected(&swarm);
    fake.fail_sends_with_429(3, 1);
    for i in 0..5 {
        swarm.ctl_ok(&["post", "#team", &format!("msg {i}"), "--as", "bob"]);
    }
    let sent = fake.wait_sent(CHAT, 5, LONG);
    let texts: Vec<&str> = sent.iter().map(|m| m.plain.as_str()).collect();
    assert_eq!(texts, ["[bob] msg 0", "[bob] msg 1", "[bob] msg 2", "[bob] msg 3", "[bob] msg 4"]);
    let refused = fake.rejected();
    assert_eq!(refused.iter().filter(|(_, status, _)| *status == 429).count(), 3, "{refused:?}");

    // `bridge status`: the mapping's durable cursor caught up, nothing waiting, not broken.
    let status = |swarm: &Swarm| -> Value {
        serde_json::from_str(&swarm.ctl_ok(&["bridge", "status", "tg", "--json"])).expect("JSON")
    };
    let caught_up = |b: &Value| {
        let m = &b["channels"][0];
        m["cursor"] == 5 && m["newest"] == 5 && m["waiting"] == 0
    };
    swarm.wait_until(|| caught_up(&status(&swarm)), SHORT, "the cursor is at seq 5");
    let b = status(&swarm);
    assert_eq!(b["name"], "tg");
    assert_eq!(b["state"], "connected", "{b:#}");
    assert!(b["pid"].as_u64().is_some_and(|p| p > 0), "{b:#}");
    assert_eq!(b["restarts"], 0);
    let m = &b["channels"][0];
    assert_eq!((m["flock"].as_str(), m["external"].as_str()), (Some("team"), Some("-100200300")));
    assert!(m["allow"].is_null() && m["broken"].is_null(), "{m:#}");
    let text = swarm.ctl_ok(&["bridge", "status", "tg"]);
    assert!(
        text.contains(
            "#team ↔ -100200300: everyone may post; sent up to seq 5 of 5, 0 waiting; ok"
        ),
        "{text}"
    );
    // An unknown name: a clear error that lists the bridges there are.
    let out = swarm.ctl(&["bridge", "status", "nope"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no bridge `nope` in this swarm; its bridges: tg"), "{err}");

    // The chat starts refusing posts (the bot was removed): the mapping shows broken, with why,
    // and the post waits in the channel (the cursor does not move).
    fake.fail_next_sends(1, 403, "Forbidden: bot was kicked from the group chat");
    swarm.ctl_ok(&["post", "#team", "msg 5", "--as", "bob"]);
    swarm.wait_until(
        || status(&swarm)["channels"][0]["broken"].as_str().is_some_and(|w| w.contains("kicked")),
        LONG,
        "the mapping is reported broken",
    );
    let m = status(&swarm)["channels"][0].clone();
    assert_eq!(
        (m["cursor"].as_u64(), m["newest"].as_u64(), m["waiting"].as_u64()),
        (Some(5), Some(6), Some(1)),
        "{m:#}"
    );
    let text = swarm.ctl_ok(&["bridge", "status", "tg"]);
    assert!(
        text.contains("1 waiting; BROKEN: sendMessage: 403 Forbidden: bot was kicked"),
        "{text}"
    );
}

#[test]
fn only_allowed_people_post_and_a_refused_token_stops_the_bridge_with_a_clear_error() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, Some("42"));
    wait_connected(&swarm);
    fake.post(CHAT, 7, "Mallory", Some("mallory"), "let me in");
    fake.post(CHAT, 42, "Alice", Some("alice"), "hello from alice");
    swarm.wait_until(|| posts(&swarm).len() == 1, SHORT, "alice's post arrives");
    std::thread::sleep(Duration::from_millis(300));
    let posts = posts(&swarm);
    assert_eq!(posts.len(), 1, "{posts:#?}");
    assert_eq!(posts[0]["author"], "human:telegram:alice");
    assert!(swarm.log("bridge-tg").contains("user 7"), "the refusal is logged");
    assert_eq!(fake.pending_updates(), 0, "the refused message is confirmed too (not retried)");
    // The router, which decides, journals the refusal: who, where, why — never the words.
    let out = swarm.ctl_ok(&["journal", "query", "type=BRIDGE_POST_REFUSED", "--json"]);
    let events: Vec<Value> = match serde_json::from_str(&out) {
        Ok(Value::Array(events)) => events,
        other => panic!("journal query --json printed no array ({other:?}):\n{out}"),
    };
    assert_eq!(events.len(), 1, "{out}");
    let e = &events[0];
    assert_eq!(e["agent"], "bridge:tg");
    assert_eq!(e["status"], "FAILED");
    let p = &e["action"]["params"];
    assert_eq!(p["bridge"], "tg");
    assert_eq!(p["platform"], "telegram");
    assert_eq!(p["chat"], CHAT.to_string());
    assert_eq!(p["channel"], "team");
    assert_eq!(p["user_id"], "7");
    assert_eq!(p["user_name"], "mallory");
    assert_eq!(p["reason"], "not on the allow list");
    let journal = swarm.ctl_ok(&["journal", "read", "--last", "1000", "--json"]);
    assert!(!journal.contains("let me in"), "a refused person's words reached the journal");
    // `bridge status` counts who may post.
    let text = swarm.ctl_ok(&["bridge", "status", "tg"]);
    assert!(text.contains("1 person may post"), "{text}");
    drop(swarm);

    // A token Telegram refuses: exit 78, not restarted, the reason in ps, the token nowhere.
    let other = FakeTelegram::start("999:other");
    other.add_chat(CHAT, "Team");
    let swarm = Swarm::builder(&swarm_yaml(&other.base_url(), None)).env("TG_TOKEN", TOKEN).start();
    swarm.wait_until(|| bridge_row(&swarm)["state"] == "failed", LONG, "the bridge gave up");
    let row = bridge_row(&swarm);
    let why = row["last_exit"].as_str().unwrap_or_default();
    assert!(why.contains("refused the bot token"), "{row}");
    assert_eq!(row["restarts"], 0, "{row}");
    assert!(!row.to_string().contains("TEST-token"), "{row}");
    assert!(!swarm.log("bridge-tg").contains("TEST-token"));
}

// ---------------------------------------------------------------------------------------------
// Discord, through the real serenity client against `FakeDiscord` (REST v10 + gateway).

use flock_testkit::fake_discord::{self, FakeDiscord};

const DISCORD_TOKEN: &str = "MTIz.discord-token-must-never-leak";
const DC: u64 = 900_000_000_000_000_001;

fn discord_bridge(api_url: &str) -> String {
    format!(
        r#"  - name: dc
    platform: discord
    token_env: DC_TOKEN
    api_url: {api_url}
    max_posts_per_minute: 600
    channels:
      - flock: team
        external: "{DC}"
"#
    )
}

/// The worker, a Discord bridge on #team and (optionally) the Telegram bridge on #team too.
fn discord_swarm(discord: &FakeDiscord, telegram: Option<&FakeTelegram>) -> Swarm {
    discord.add_channel(DC, "team");
    let mut yaml = match telegram {
        Some(tg) => {
            tg.add_chat(CHAT, "Team");
            swarm_yaml(&tg.base_url(), None)
        }
        None => {
            swarm_yaml("http://127.0.0.1:9", None)
                .split("bridges:\n")
                .next()
                .expect("the yaml has bridges")
                .to_owned()
                + "bridges:\n"
        }
    };
    yaml.push_str(&discord_bridge(&discord.base_url()));
    Swarm::builder(&yaml).env("TG_TOKEN", TOKEN).env("DC_TOKEN", DISCORD_TOKEN).start()
}

/// Waits until the Discord bridge and the Telegram bridge are both connected.
fn wait_discord_and_telegram(discord: &FakeDiscord, swarm: &Swarm) {
    discord.wait_connected(LONG);
    swarm.wait_until(
        || {
            row_named(swarm, "bridge-dc")["state"] == "connected"
                && bridge_row(swarm)["state"] == "connected"
        },
        LONG,
        "both bridges are connected",
    );
}

fn row_named(swarm: &Swarm, name: &str) -> Value {
    swarm.ps().into_iter().find(|r| r["name"] == name).unwrap_or(Value::Null)
}

#[test]
fn a_person_on_discord_reaches_the_agent_and_telegram_and_the_reply_comes_back_under_its_name() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let telegram = FakeTelegram::start(TOKEN);
    let swarm = discord_swarm(&discord, Some(&telegram));
    wait_discord_and_telegram(&discord, &swarm);
    swarm.ctl_ok(&["channel", "members", "#team", "--add", "worker", "--as", "bob"]);

    let asked = discord.post(DC, 4242, "alice", "@worker build the login page");
    // On Discord: the worker's answer as a reply to alice's message — the bot's own message (a
    // webhook cannot reply) with the worker's name in front, and no mention parsed.
    let sent = discord.wait_sent(DC, 1, LONG);
    assert_eq!(sent[0].reply_to, Some(asked), "{sent:#?}");
    assert!(sent[0].webhook_id.is_none(), "a reply is the bot's: {sent:#?}");
    assert_eq!(sent[0].content, "**[worker]** Built it. Tests pass (3/3)!");
    assert_eq!(
        sent[0].allowed_mentions.as_ref().map(|m| m["parse"].clone()),
        Some(serde_json::json!([])),
        "{sent:#?}"
    );
    // On Telegram: alice's message with her name and platform, then the worker's reply.
    let tg = telegram.wait_sent(CHAT, 2, LONG);
    assert_eq!(tg[0].plain, "[alice (discord)] @worker build the login page");
    assert_eq!(tg[1].plain, "[worker] Built it. Tests pass (3/3)!");
    assert_eq!(tg[1].reply_to, Some(tg[0].message_id), "a reply to the relayed question");

    let before = posts(&swarm);
    assert_eq!(before[0]["author"], "human:discord:alice");
    assert_eq!(before.len(), 2, "{before:#?}");
    // Nothing came back as an echo: the webhook's message (which the gateway dispatches back)
    // was dropped, alice's message never went back to Discord.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(discord.sent(DC).len(), 1, "{:#?}", discord.sent(DC));
    assert_eq!(before.len(), posts(&swarm).len(), "no post was added by an echo");
    assert_eq!(telegram.sent_to(CHAT).len(), 2);

    let mut seen = swarm.supervisor_output();
    seen += &swarm.ctl_ok(&["bridge", "ls", "--json"]);
    seen += &swarm.log("bridge-dc");
    assert!(seen.contains("DC_TOKEN"), "bridge ls names the variable");
    assert!(!seen.contains("discord-token-must"), "the token leaked");
}

#[test]
fn a_discord_bridge_killed_while_people_write_brings_their_messages_in_when_it_is_back() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let swarm = discord_swarm(&discord, None);
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");
    discord.post(DC, 1, "alice", "before the crash");
    swarm.wait_until(|| posts(&swarm).len() == 1, LONG, "the first message is in");

    swarm.kill9("bridge-dc");
    // Written while no bridge listened: only Discord's history has them.
    for i in 0..5 {
        discord.post_while_offline(DC, 2, "bob", &format!("while away {i}"));
    }
    swarm.wait_until(|| posts(&swarm).len() == 6, LONG, "the missed messages are brought in");
    let texts: Vec<String> =
        posts(&swarm).iter().map(|p| p["text"].as_str().unwrap_or("").to_owned()).collect();
    let mut want = vec!["before the crash".to_owned()];
    want.extend((0..5).map(|i| format!("while away {i}")));
    assert_eq!(texts, want);
    // And live traffic goes on, each message once.
    discord.post(DC, 1, "alice", "after the crash");
    swarm.wait_until(|| posts(&swarm).len() == 7, LONG, "a live message after the restart");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(posts(&swarm).len(), 7);
    assert_eq!(row_named(&swarm, "bridge-dc")["restarts"], 1);
}

#[test]
fn without_webhook_permission_posts_carry_the_name_and_a_deleted_webhook_is_recreated() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let swarm = discord_swarm(&discord, None);
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["post", "#team", "first", "--as", "bob"]);
    let sent = discord.wait_sent(DC, 1, LONG);
    assert_eq!(sent[0].username, "bob");
    // A person who writes the very words just relayed is not taken for an echo.
    discord.post(DC, 5, "erin", "first");
    swarm.wait_until(
        || posts(&swarm).iter().any(|p| p["author"] == "human:discord:erin"),
        LONG,
        "erin's \"first\" is brought in",
    );
    // The webhook is deleted behind the bridge's back: a new one is made, nothing is lost.
    discord.delete_webhooks(DC);
    swarm.ctl_ok(&["post", "#team", "second", "--as", "bob"]);
    let sent = discord.wait_sent(DC, 2, LONG);
    assert_eq!((sent[1].username.as_str(), sent[1].content.as_str()), ("bob", "second"));
    assert!(sent[1].webhook_id.is_some() && sent[1].webhook_id != sent[0].webhook_id);

    // A bot that may not manage webhooks posts as itself, with the author's name in front.
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    discord.add_channel(DC, "team");
    discord.missing_webhook_permission(DC);
    let swarm = discord_swarm(&discord, None);
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["post", "#team", "hello @everyone", "--as", "bob"]);
    let sent = discord.wait_sent(DC, 1, LONG);
    assert_eq!(sent[0].content, "**[bob]** hello @everyone");
    assert!(sent[0].webhook_id.is_none());
    let parse = sent[0].allowed_mentions.as_ref().map(|m| m["parse"].clone());
    assert_eq!(parse, Some(serde_json::json!([])), "no @everyone ping: {sent:#?}");
}

#[test]
fn a_discord_app_without_the_message_content_intent_is_told_how_to_fix_it() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    discord.deny_message_content();
    let swarm = discord_swarm(&discord, None);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "failed", LONG, "it gave up");
    let row = row_named(&swarm, "bridge-dc");
    let why = row["last_exit"].as_str().unwrap_or_default();
    assert!(why.contains("Message Content Intent") && why.contains("4014"), "{row}");
    assert_eq!(row["restarts"], 0, "a restart cannot fix it: {row}");
}

// ---------------------------------------------------------------------------------------------
// Slack, through the real slack-morphism client (Socket Mode) against `FakeSlack`.

use flock_testkit::fake_slack::{self, FakeSlack};

const SC: &str = "C0TEAM";

fn slack_bridge(api_url: &str) -> String {
    format!(
        r#"  - name: sl
    platform: slack
    token_env: SL_BOT_TOKEN
    app_token_env: SL_APP_TOKEN
    api_url: {api_url}
    max_posts_per_minute: 600
    channels:
      - flock: team
        external: "{SC}"
"#
    )
}

/// The worker, a Slack bridge on #team and (optionally) the Discord bridge on #team too.
fn slack_swarm(slack: &FakeSlack, discord: Option<&FakeDiscord>) -> Swarm {
    slack.add_channel(SC, "team");
    let mut yaml = swarm_yaml("http://127.0.0.1:9", None)
        .split("bridges:\n")
        .next()
        .expect("the yaml has bridges")
        .to_owned()
        + "bridges:\n";
    yaml.push_str(&slack_bridge(&slack.api_url()));
    if let Some(d) = discord {
        d.add_channel(DC, "team");
        yaml.push_str(&discord_bridge(&d.base_url()));
    }
    Swarm::builder(&yaml)
        .env("SL_BOT_TOKEN", fake_slack::BOT_TOKEN)
        .env("SL_APP_TOKEN", fake_slack::APP_TOKEN)
        .env("DC_TOKEN", DISCORD_TOKEN)
        .start()
}

#[test]
fn a_person_on_discord_is_heard_on_slack_and_the_agents_reply_reaches_both_under_its_name() {
    let slack = FakeSlack::start();
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let swarm = slack_swarm(&slack, Some(&discord));
    slack.wait_connected(LONG);
    discord.wait_connected(LONG);
    swarm.wait_until(
        || {
            row_named(&swarm, "bridge-sl")["state"] == "connected"
                && row_named(&swarm, "bridge-dc")["state"] == "connected"
        },
        LONG,
        "both bridges are connected",
    );
    swarm.ctl_ok(&["channel", "members", "#team", "--add", "worker", "--as", "bob"]);

    let asked = discord.post(DC, 4242, "alice", "@worker build the **login** page");
    // Slack: alice's message under her name (relayed, mrkdwn), then the worker's answer in a
    // thread under it.
    let sent = slack.wait_sent(SC, 2, LONG);
    assert_eq!(sent[0].username.as_deref(), Some("alice (discord)"), "{sent:#?}");
    assert!(sent[0].username_applied);
    assert_eq!(sent[0].text, "@worker build the *login* page");
    assert_eq!(sent[1].username.as_deref(), Some("worker"));
    assert_eq!(sent[1].text, "Built it. Tests pass (3/3)!");
    assert_eq!(sent[1].thread_ts.as_deref(), Some(sent[0].ts.as_str()), "{sent:#?}");
    // Discord: only the worker's answer, a reply to alice (her own message never goes back).
    let dc = discord.wait_sent(DC, 1, LONG);
    assert_eq!(
        (dc[0].content.as_str(), dc[0].reply_to),
        ("**[worker]** Built it. Tests pass (3/3)!", Some(asked))
    );

    // A person on Slack: posted once, acked after the post, relayed to Discord, no echo.
    slack.post(SC, "U42", "carol", "thanks <!channel> & all");
    swarm.wait_until(|| posts(&swarm).len() == 3, LONG, "carol's message is in");
    slack.wait_acked(LONG);
    let p = posts(&swarm);
    assert_eq!(p[2]["author"], "human:slack:carol");
    assert_eq!(p[2]["text"], "thanks <!channel> & all", "Slack's escapes are undone");
    let dc = discord.wait_sent(DC, 2, LONG);
    assert_eq!(dc[1].username, "carol (slack)");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(slack.sent(SC).len(), 2, "nothing echoed back to Slack: {:#?}", slack.sent(SC));
    assert_eq!(discord.sent(DC).len(), 2, "nothing echoed back to Discord");
    assert_eq!(posts(&swarm).len(), 3, "the bots' own messages were not brought back in");
    assert_eq!(slack.unacked(), 0);
}

#[test]
fn slack_without_customize_shows_the_name_in_front_and_escapes_mentions() {
    let slack = FakeSlack::start();
    slack.deny_customize();
    let swarm = slack_swarm(&slack, None);
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["post", "#team", "first", "--as", "bob"]);
    swarm.ctl_ok(&["post", "#team", "hi <!here>, see [docs](https://x.io)", "--as", "bob"]);
    let sent = slack.wait_sent(SC, 2, LONG);
    // The first post went out under the bot's name; from then on the name is in the text.
    assert_eq!(sent[1].text, "*[bob]* hi &lt;!here&gt;, see <https://x.io|docs>", "{sent:#?}");
}

#[test]
fn a_slack_bridge_killed_before_it_posted_a_message_gets_it_again_and_posts_it_once() {
    let slack = FakeSlack::start();
    let swarm = slack_swarm(&slack, None);
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");
    for i in 0..30 {
        slack.post(SC, "U7", "dave", &format!("in-{i}"));
    }
    swarm.wait_until(|| posts(&swarm).len() >= 3, LONG, "the burst is coming in");
    swarm.kill9("bridge-sl");
    swarm.wait_until(|| posts(&swarm).len() >= 30, LONG, "every message is in after the restart");
    slack.wait_acked(LONG);
    std::thread::sleep(Duration::from_millis(300));
    let texts: Vec<String> =
        posts(&swarm).iter().map(|p| p["text"].as_str().unwrap_or("").to_owned()).collect();
    let mut sorted = texts.clone();
    sorted.sort_by_key(|t| t.trim_start_matches("in-").parse::<u32>().unwrap_or(0));
    sorted.dedup();
    assert_eq!(sorted.len(), 30, "lost: {texts:?}");
    assert_eq!(texts.len(), 30, "doubled: {texts:?}");
}

#[test]
fn flockctl_prints_the_slack_app_manifest_with_every_scope_the_bridge_uses() {
    let out = std::process::Command::new(flock_testkit::bin("flockctl"))
        .args(["bridge", "manifest", "slack", "--name", "Team Flock"])
        .output()
        .expect("run flockctl");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for needed in [
        "socket_mode_enabled: true",
        "chat:write.customize",
        "channels:history",
        "users:read",
        "channels:manage",
        "groups:write",
        "message.channels",
        "message.im",
        "im:history",
        "reactions:write",
        "messages_tab_enabled: true",
        "connections:write",
        "display_name: Team Flock",
    ] {
        assert!(text.contains(needed), "missing {needed}:\n{text}");
    }
}

/// `flockctl bridge status NAME --json`.
fn bridge_status(swarm: &Swarm, name: &str) -> Value {
    serde_json::from_str(&swarm.ctl_ok(&["bridge", "status", name, "--json"])).expect("JSON")
}

#[test]
fn archiving_a_channel_archives_its_slack_conversation_after_every_post_went_out() {
    let slack = FakeSlack::start();
    let swarm = slack_swarm(&slack, None);
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");
    for i in 0..5 {
        swarm.ctl_ok(&["post", "#team", &format!("s-{i}"), "--as", "bob"]);
    }
    // Archived at once (no agent is a member): the posts may still be on their way out.
    swarm.ctl_ok(&["channel", "archive", "#team"]);
    slack.wait_archived(SC, LONG);

    // Every post (and the archive protocol's own notice) reached Slack, in order, and only then
    // was the conversation archived.
    let texts: Vec<String> = slack.sent(SC).iter().map(|s| s.text.clone()).collect();
    assert_eq!(texts.len(), 6, "{texts:#?}");
    assert_eq!(texts[..5], ["s-0", "s-1", "s-2", "s-3", "s-4"]);
    assert!(texts[5].contains("is being archived"), "{texts:#?}");
    let calls: Vec<String> = slack
        .requests()
        .into_iter()
        .filter(|(m, p)| {
            p["channel"] == SC && matches!(m.as_str(), "chat.postMessage" | "conversations.archive")
        })
        .map(|(m, _)| m)
        .collect();
    assert_eq!(calls.last().map(String::as_str), Some("conversations.archive"), "{calls:?}");
    assert_eq!(calls.iter().filter(|m| *m == "conversations.archive").count(), 1, "{calls:?}");
    assert_eq!(slack.archived(), [SC]);

    // The mapping shows the archive as mirrored (durably, from the store) and is not broken.
    swarm.wait_until(
        || bridge_status(&swarm, "sl")["channels"][0]["archived"] == true,
        LONG,
        "the mapping records the archive",
    );
    let b = bridge_status(&swarm, "sl");
    assert!(b["channels"][0]["broken"].is_null(), "{b:#}");
    assert!(swarm.ctl_ok(&["bridge", "status", "sl"]).contains("archived (mirrored)"));
    assert!(slack.refused().is_empty(), "{:?}", slack.refused());
}

#[test]
fn a_slack_app_that_may_not_archive_shows_why_on_the_mapping_and_keeps_running() {
    let slack = FakeSlack::start();
    slack.deny_archive();
    let swarm = slack_swarm(&slack, None);
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["channel", "archive", "#team", "--force"]);
    swarm.wait_until(
        || {
            bridge_status(&swarm, "sl")["channels"][0]["broken"]
                .as_str()
                .is_some_and(|b| b.contains("missing_scope") && b.contains("channels:manage"))
        },
        LONG,
        "the mapping shows the missing scope",
    );
    let b = bridge_status(&swarm, "sl");
    assert_eq!(b["channels"][0]["archived"], false, "{b:#}");
    assert_eq!(b["restarts"], 0, "the bridge keeps running: {b:#}");
    assert!(slack.archived().is_empty());
    // The journal says so, once, whatever the retries every half minute.
    swarm.wait_until(
        || swarm.ctl_ok(&["journal", "read", "--last", "100"]).contains("BRIDGE_MAPPING_BROKEN"),
        LONG,
        "the broken mapping is journaled",
    );
    let journal = swarm.ctl_ok(&["journal", "read", "--last", "100", "--json"]);
    assert_eq!(journal.matches("BRIDGE_MAPPING_BROKEN").count(), 1, "{journal}");
    assert!(journal.contains(&format!("chat {SC} refuses")), "{journal}");
}

#[test]
fn a_telegram_chat_gets_one_archive_notice_even_across_a_kill9_and_nothing_more_is_relayed() {
    let fake = FakeTelegram::start(TOKEN);
    let swarm = start(&fake, None);
    wait_connected(&swarm);
    swarm.ctl_ok(&["post", "#team", "t-0", "--as", "bob"]);
    swarm.ctl_ok(&["post", "#team", "t-1", "--as", "bob"]);
    swarm.ctl_ok(&["channel", "archive", "#team"]);
    let notice = "[flock] #team was archived in Flock; nothing more will be relayed here";
    let sent = fake.wait_sent(CHAT, 4, LONG);
    let plain: Vec<&str> = sent.iter().map(|m| m.plain.as_str()).collect();
    assert_eq!(plain[..2], ["[bob] t-0", "[bob] t-1"], "{plain:#?}");
    assert!(plain[2].contains("is being archived"), "{plain:#?}");
    assert_eq!(plain[3], notice);
    swarm.wait_until(
        || bridge_status(&swarm, "tg")["channels"][0]["archived"] == true,
        LONG,
        "the notice is recorded",
    );

    // A person writes in the chat: the message is handled (confirmed) but not posted.
    let before = posts(&swarm).len();
    fake.post(CHAT, 42, "Alice", Some("alice"), "anyone still here?");
    swarm.wait_until(|| fake.pending_updates() == 0, LONG, "alice's message is handled");

    // kill -9 and a restart: no second notice, still nothing relayed.
    let old = swarm.kill9("bridge-tg");
    swarm.wait_until(
        || {
            let row = bridge_row(&swarm);
            row["state"] == "connected" && row["pid"].as_u64().is_some_and(|p| p != u64::from(old))
        },
        LONG,
        "the bridge is back",
    );
    // The restarted bridge learns from its first pull that #team is archived (and sends no
    // second notice); a message that came in before that would be refused by the router
    // instead of dropped by the bridge — not posted either way.
    swarm.wait_until(
        || {
            let logs = swarm.ctl_ok(&["logs", "bridge-tg", "--lines", "1000"]);
            logs.matches("#team is archived: nothing more is relayed").count() >= 2
        },
        LONG,
        "the restarted bridge knows #team is archived",
    );
    fake.post(CHAT, 42, "Alice", Some("alice"), "hello?");
    swarm.wait_until(
        || {
            let logs = swarm.ctl_ok(&["logs", "bridge-tg", "--lines", "1000"]);
            // Both of alice's messages, the second by the restarted bridge.
            logs.matches("dropped: #team is archived").count() >= 2
        },
        LONG,
        "the restarted bridge dropped alice's message",
    );
    swarm.wait_until(|| fake.pending_updates() == 0, LONG, "alice's second message is handled");
    std::thread::sleep(Duration::from_millis(1500));
    let plain: Vec<String> = fake.sent_to(CHAT).iter().map(|m| m.plain.clone()).collect();
    assert_eq!(plain.iter().filter(|p| *p == notice).count(), 1, "{plain:#?}");
    assert_eq!(plain.len(), 4, "nothing after the notice: {plain:#?}");
    assert_eq!(posts(&swarm).len(), before, "nothing reached the archived channel");
    assert_eq!(bridge_row(&swarm)["restarts"], 1);
}

#[test]
fn a_discord_channel_gets_one_archive_notice_and_its_messages_stay_out() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let swarm = discord_swarm(&discord, None);
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["post", "#team", "d-0", "--as", "bob"]);
    swarm.ctl_ok(&["channel", "archive", "#team", "--force"]);
    let sent = discord.wait_sent(DC, 2, LONG);
    assert_eq!((sent[0].username.as_str(), sent[0].content.as_str()), ("bob", "d-0"));
    assert_eq!(
        (sent[1].username.as_str(), sent[1].content.as_str()),
        ("flock", "#team was archived in Flock; nothing more will be relayed here")
    );
    swarm.wait_until(
        || bridge_status(&swarm, "dc")["channels"][0]["archived"] == true,
        LONG,
        "the notice is recorded",
    );
    // The channel moved into the archive category, where @everyone may not send.
    let ch = discord.channel(DC).expect("the channel");
    let archive = discord.categories().into_iter().find(|(_, n)| n == "Flock archive");
    let (category, _) = archive.expect("the archive category was created");
    assert_eq!(ch["parent_id"], category.to_string(), "{ch:#}");
    let everyone = fake_discord::GUILD_ID.to_string();
    let overwrite = ch["permission_overwrites"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["id"] == everyone.as_str()).cloned())
        .unwrap_or_else(|| panic!("no overwrite for @everyone: {ch:#}"));
    let deny: u64 = overwrite["deny"].as_str().and_then(|d| d.parse().ok()).unwrap_or(0);
    assert_ne!(deny & fake_discord::PERMISSION_SEND_MESSAGES, 0, "{overwrite:#}");
    let before = posts(&swarm).len();
    discord.post(DC, 1, "alice", "still there?");
    swarm.wait_until(
        || {
            swarm
                .ctl_ok(&["logs", "bridge-dc", "--lines", "1000"])
                .contains("dropped: #team is archived")
        },
        LONG,
        "the bridge dropped alice's message",
    );
    assert_eq!(posts(&swarm).len(), before, "nothing reached the archived channel");
    assert_eq!(discord.sent(DC).len(), 2, "one notice, nothing else");
}

const SC2: &str = "C0OPS";

#[test]
fn a_persons_edit_and_deletion_change_the_post_and_every_copy_but_their_own() {
    // One Slack bridge maps two conversations to #team: what a person writes in one is copied
    // to the other; their edit and deletion follow it there.
    let slack = FakeSlack::start();
    slack.add_channel(SC, "team");
    slack.add_channel(SC2, "ops");
    let both = format!(
        "{}      - flock: team\n        external: \"{SC2}\"\n",
        slack_bridge(&slack.api_url())
    );
    let head = swarm_yaml("http://127.0.0.1:9", None);
    let head = head.split("bridges:\n").next().expect("the yaml has bridges");
    let swarm = Swarm::builder(&format!("{head}bridges:\n{both}"))
        .env("SL_BOT_TOKEN", fake_slack::BOT_TOKEN)
        .env("SL_APP_TOKEN", fake_slack::APP_TOKEN)
        .start();
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");

    let ts = slack.post(SC, "U42", "carol", "deploy at 5");
    let copy = slack.wait_sent(SC2, 1, LONG);
    assert_eq!(copy[0].text, "deploy at 5");
    slack.wait_acked(LONG);

    // Slack's bold (`*6*`) is Markdown's `**6**` in Flock, and bold again in the copy.
    slack.edit(SC, &ts, "deploy at *6*");
    swarm.wait_until(
        || posts(&swarm).first().is_some_and(|p| p["text"] == "deploy at **6** (edited)"),
        LONG,
        "the post shows the edit",
    );
    swarm.wait_until(|| !slack.changes().is_empty(), LONG, "the copy is edited");
    let change = &slack.changes()[0];
    assert_eq!(
        (change.channel.as_str(), change.ts.as_str(), change.text.as_deref()),
        (SC2, copy[0].ts.as_str(), Some("deploy at *6*")),
        "only the copy in the other conversation changes: {:#?}",
        slack.changes()
    );

    // The worker's post and a person's deletion: the deleted words leave Flock and the copy.
    swarm.ctl_ok(&["post", "#team", "noted", "--as", "bob"]);
    slack.wait_sent(SC2, 2, LONG);
    slack.delete(SC, &ts);
    swarm.wait_until(
        || posts(&swarm).first().is_some_and(|p| p["text"] == "(deleted by its author)"),
        LONG,
        "the post is deleted",
    );
    swarm.wait_until(|| slack.changes().len() >= 2, LONG, "the copy is deleted");
    let changes = slack.changes();
    assert_eq!(
        (changes[1].channel.as_str(), changes[1].ts.as_str(), changes[1].text.as_deref()),
        (SC2, copy[0].ts.as_str(), None)
    );
    assert!(
        slack.messages(SC2).iter().all(|m| m["ts"] != copy[0].ts.as_str()),
        "the copy is gone from the conversation"
    );
    // Our own chat.update / chat.delete come back as events: nothing else changes.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(slack.changes().len(), 2, "{:#?}", slack.changes());
    let p = posts(&swarm);
    assert_eq!(p.len(), 2);
    assert_eq!(p[1]["text"], "noted", "other posts stay as they are");
    let log = swarm.ctl_ok(&["logs", "bridge-sl"]);
    assert!(!log.contains(fake_slack::BOT_TOKEN), "no token in the log");
}

#[test]
fn edits_and_deletions_follow_a_message_from_telegram_to_discord_and_back() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    let telegram = FakeTelegram::start(TOKEN);
    let swarm = discord_swarm(&discord, Some(&telegram));
    wait_discord_and_telegram(&discord, &swarm);

    // Telegram → Discord: alice's edit changes the copy the webhook posted.
    let tg_id = telegram.post(CHAT, 42, "Alice", Some("alice"), "meet at 5");
    let copy = discord.wait_sent(DC, 1, LONG);
    assert_eq!(
        (copy[0].username.as_str(), copy[0].content.as_str()),
        ("alice (telegram)", "meet at 5")
    );
    telegram.edit(CHAT, tg_id, "meet at **6**");
    let edits = discord.wait_edits(DC, 1, LONG);
    assert_eq!(edits[0], (copy[0].id, Some("meet at **6**".to_owned())));
    assert_eq!(posts(&swarm)[0]["text"], "meet at **6** (edited)");

    // Discord → Telegram: bob's edit, then his deletion.
    let dc_id = discord.post(DC, 4243, "bob", "lunch?");
    let tg_copy = telegram.wait_sent(CHAT, 1, LONG);
    assert_eq!(tg_copy[0].plain, "[bob (discord)] lunch?");
    discord.edit(DC, dc_id, "lunch at noon?");
    let changes = telegram.wait_edits(CHAT, 1, LONG);
    assert_eq!(changes[0], (tg_copy[0].message_id, Some("[bob (discord)] lunch at noon?".into())));
    discord.delete(DC, dc_id);
    let changes = telegram.wait_edits(CHAT, 2, LONG);
    assert_eq!(changes[1], (tg_copy[0].message_id, None), "the copy is deleted");
    swarm.wait_until(
        || posts(&swarm).get(1).is_some_and(|p| p["text"] == "(deleted by its author)"),
        LONG,
        "bob's post is deleted in Flock",
    );

    // The gateway dispatches our own webhook edit back: it changes nothing more.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(discord.edits(DC).len(), 1, "{:#?}", discord.edits(DC));
    assert_eq!(telegram.edits(CHAT).len(), 2, "{:#?}", telegram.edits(CHAT));
    assert_eq!(posts(&swarm).len(), 2);
    assert_eq!(discord.sent(DC).len(), 1, "nothing new was posted for an edit");
}

#[test]
fn a_chat_mapped_and_unmapped_at_run_time_is_served_at_once_and_after_a_restart() {
    const OPS: i64 = -100_200_301;
    let fake = FakeTelegram::start(TOKEN);
    fake.add_chat(OPS, "Ops");
    let mut swarm = start(&fake, None);
    wait_connected(&swarm);
    let restarts = || bridge_row(&swarm)["restarts"].as_u64().unwrap_or(0);

    // Bad input is told what is wrong.
    let out = swarm.ctl(&["bridge", "map", "nope", &OPS.to_string(), "#ops"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bridges: tg"), "{out:?}");
    let out = swarm.ctl(&["bridge", "unmap", "tg", &CHAT.to_string()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("only mapping"), "{out:?}");
    let out = swarm.ctl(&["bridge", "map", "tg", &OPS.to_string(), "#Not_OK"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a channel id"), "{out:?}");
    assert_eq!(restarts(), 0, "nothing was changed");

    let said = swarm.ctl_ok(&["bridge", "map", "tg", &OPS.to_string(), "#ops"]);
    assert!(said.contains("↔ #ops"), "{said}");
    swarm.wait_until(
        || restarts() == 1 && bridge_row(&swarm)["state"] == "connected",
        LONG,
        "the bridge restarted with the new mapping",
    );
    // Both ways: a post in #ops reaches the chat, a person's message in the chat reaches #ops.
    swarm.ctl_ok(&["post", "#ops", "ops: deploy at 6", "--as", "bob"]);
    assert_eq!(fake.wait_sent(OPS, 1, LONG)[0].plain, "[bob] ops: deploy at 6");
    fake.post(OPS, 42, "Alice", Some("alice"), "on it");
    swarm.wait_until(
        || swarm.ctl_ok(&["read", "#ops", "--json"]).contains("human:telegram:alice"),
        LONG,
        "alice's message is in #ops",
    );

    // The file's mapping removed; kept across a restart of the supervisor.
    swarm.ctl_ok(&["bridge", "unmap", "tg", &CHAT.to_string()]);
    swarm.wait_until(
        || restarts() == 2 && bridge_row(&swarm)["state"] == "connected",
        LONG,
        "the bridge restarted without the team chat",
    );
    swarm.down();
    swarm.restart_supervisor();
    wait_connected(&swarm);
    let status: Value =
        serde_json::from_str(&swarm.ctl_ok(&["bridge", "status", "tg", "--json"])).unwrap();
    let mapped: Vec<(&str, &str)> = status["channels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["external"].as_str().unwrap(), m["flock"].as_str().unwrap()))
        .collect();
    assert_eq!(mapped, [(OPS.to_string().as_str(), "ops")], "{status:#}");
    swarm.ctl_ok(&["post", "#team", "t: not for the team chat any more", "--as", "bob"]);
    swarm.ctl_ok(&["post", "#ops", "ops: second", "--as", "bob"]);
    fake.wait_sent(OPS, 2, LONG);
    std::thread::sleep(Duration::from_millis(500));
    assert!(fake.sent_to(CHAT).is_empty(), "{:#?}", fake.sent_to(CHAT));
    // Both changes are journaled with who made them.
    let journal = swarm.ctl_ok(&["journal", "read", "--last", "200", "--json"]);
    assert!(journal.contains("BRIDGE_MAPPED") && journal.contains("BRIDGE_UNMAPPED"), "{journal}");
}

#[test]
fn a_discord_bot_that_may_not_manage_channels_archives_with_the_notice_alone() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    discord.deny_manage_channels();
    let swarm = discord_swarm(&discord, None);
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["channel", "archive", "#team", "--force"]);
    let sent = discord.wait_sent(DC, 1, LONG);
    assert_eq!(sent[0].content, "#team was archived in Flock; nothing more will be relayed here");
    swarm.wait_until(
        || bridge_status(&swarm, "dc")["channels"][0]["archived"] == true,
        LONG,
        "the archive is recorded all the same",
    );
    let log = swarm.ctl_ok(&["logs", "bridge-dc", "--lines", "1000"]);
    assert!(log.contains("Manage Channels"), "the log says what to give the bot: {log}");
    assert!(discord.categories().is_empty());
    assert_eq!(bridge_status(&swarm, "dc")["channels"][0]["broken"], Value::Null);
}

/// The chat a bridge maps `#channel` to now, from `bridge status --json`.
fn chat_of(swarm: &Swarm, bridge: &str, channel: &str) -> Option<String> {
    let status = bridge_status(swarm, bridge);
    status["channels"].as_array()?.iter().find(|m| m["flock"] == channel)?["external"]
        .as_str()
        .map(str::to_owned)
}

#[test]
fn a_channel_created_in_flock_gets_its_own_discord_channel_with_every_post() {
    let discord = FakeDiscord::start(DISCORD_TOKEN);
    discord.add_channel(DC, "team");
    let yaml = swarm_yaml("http://127.0.0.1:9", None);
    let head = yaml.split("bridges:\n").next().expect("the yaml has bridges");
    let bridge = discord_bridge(&discord.base_url()).replace(
        "    max_posts_per_minute: 600\n",
        "    max_posts_per_minute: 600\n    mirror_new_channels: true\n",
    );
    let swarm =
        Swarm::builder(&format!("{head}bridges:\n{bridge}")).env("DC_TOKEN", DISCORD_TOKEN).start();
    discord.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-dc")["state"] == "connected", LONG, "connected");

    // Created and posted to at once: the post made before the Discord channel exists goes too.
    swarm.ctl_ok(&["channel", "create", "launch", "--as", "bob"]);
    swarm.ctl_ok(&["post", "#launch", "go for launch", "--as", "bob"]);
    swarm.wait_until(
        || chat_of(&swarm, "dc", "launch").is_some_and(|c| !c.starts_with("new:")),
        LONG,
        "the bridge made a Discord channel for #launch",
    );
    let made: u64 = chat_of(&swarm, "dc", "launch").unwrap().parse().expect("a channel id");
    let ch = discord.channel(made).expect("the new channel");
    assert_eq!(ch["name"], "launch");
    let sent = discord.wait_sent(made, 1, LONG);
    assert_eq!((sent[0].username.as_str(), sent[0].content.as_str()), ("bob", "go for launch"));
    // Both ways: a person in the new Discord channel reaches #launch.
    discord.post(made, 77, "carol", "ready here");
    swarm.wait_until(
        || swarm.ctl_ok(&["read", "#launch", "--json"]).contains("human:discord:carol"),
        LONG,
        "carol's message is in #launch",
    );
    // The mapping stands across a restart of the bridge, and nothing is made twice.
    swarm.kill9("bridge-dc");
    swarm.wait_until(
        || {
            row_named(&swarm, "bridge-dc")["state"] == "connected"
                && row_named(&swarm, "bridge-dc")["restarts"].as_u64() >= Some(2)
        },
        LONG,
        "the bridge is back",
    );
    assert_eq!(chat_of(&swarm, "dc", "launch"), Some(made.to_string()));
    let launches = discord
        .requests()
        .iter()
        .filter(|(m, path, _)| {
            m == "POST" && path.ends_with("/channels") && path.contains("/guilds/")
        })
        .count();
    assert_eq!(launches, 1, "one channel made");
}

#[test]
fn a_channel_created_in_flock_gets_its_own_slack_channel() {
    let slack = FakeSlack::start();
    slack.add_channel(SC, "team");
    let yaml = swarm_yaml("http://127.0.0.1:9", None);
    let head = yaml.split("bridges:\n").next().expect("the yaml has bridges");
    let bridge = slack_bridge(&slack.api_url()).replace(
        "    max_posts_per_minute: 600\n",
        "    max_posts_per_minute: 600\n    mirror_new_channels: true\n",
    );
    let swarm = Swarm::builder(&format!("{head}bridges:\n{bridge}"))
        .env("SL_BOT_TOKEN", fake_slack::BOT_TOKEN)
        .env("SL_APP_TOKEN", fake_slack::APP_TOKEN)
        .start();
    slack.wait_connected(LONG);
    swarm.wait_until(|| row_named(&swarm, "bridge-sl")["state"] == "connected", LONG, "connected");
    swarm.ctl_ok(&["channel", "create", "launch", "--as", "bob"]);
    swarm.ctl_ok(&["post", "#launch", "go for launch", "--as", "bob"]);
    swarm.wait_until(|| slack.channel_named("launch").is_some(), LONG, "a Slack channel is made");
    let made = slack.channel_named("launch").unwrap();
    let sent = slack.wait_sent(&made, 1, LONG);
    assert_eq!(sent[0].text, "go for launch");
    assert_eq!(chat_of(&swarm, "sl", "launch"), Some(made));
}
