//! `flock-fake-chat`: the Telegram protocol fake (`flock_testkit::fake_telegram`) as a process of
//! its own, for scripts that measure the chat path (`scripts/eval --via telegram`). It serves
//! the Bot API on 127.0.0.1 with one group chat and speaks JSON lines:
//!
//! - stdout, first line: `{"ready": {"api_url": …, "token": …, "chat": …}}`;
//! - stdin: `{"post": {"user_id": 42, "name": "alice", "text": "…"}}` — a person writes in the
//!   group; answered on stdout with `{"posted": {"message_id": N, "at_ms": …}}`;
//! - stdout: `{"sent": {"message_id", "plain", "reply_to", "at_ms"}}` for every message the bot
//!   sends to the group (seen within 5 ms), `{"typing": {"at_ms": …}}` for every chat action.
//!
//! It ends when stdin closes. Not a product binary: a test double with a real socket, so the
//! real `flock-bridge` runs against it.

use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use flock_testkit::fake_telegram::FakeTelegram;
use serde_json::{Value, json};

const CHAT: i64 = -100_424_242;
const TOKEN: &str = "4242:fake-chat-token";

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn main() {
    let fake = Arc::new(FakeTelegram::start(TOKEN));
    fake.add_chat(CHAT, "Eval");
    let out = Arc::new(Mutex::new(std::io::stdout()));
    let say = {
        let out = out.clone();
        move |v: Value| {
            let mut o = out.lock().unwrap_or_else(|p| p.into_inner());
            let _ = writeln!(o, "{v}");
            let _ = o.flush();
        }
    };
    say(json!({"ready": {"api_url": fake.base_url(), "token": TOKEN, "chat": CHAT.to_string()}}));
    {
        let (fake, say) = (fake.clone(), say.clone());
        std::thread::spawn(move || {
            let (mut seen, mut typed) = (0, 0);
            loop {
                let sent = fake.sent_to(CHAT);
                for m in sent.iter().skip(seen) {
                    say(json!({"sent": {"message_id": m.message_id, "plain": m.plain,
                                        "reply_to": m.reply_to, "at_ms": now_ms()}}));
                }
                seen = sent.len();
                let actions = fake.chat_actions(CHAT).len();
                for _ in typed..actions {
                    say(json!({"typing": {"at_ms": now_ms()}}));
                }
                typed = actions;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
    }
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let Ok(cmd) = serde_json::from_str::<Value>(&line) else {
            say(json!({"error": format!("not JSON: {line}")}));
            continue;
        };
        if let Some(p) = cmd.get("post") {
            let user = p["user_id"].as_i64().unwrap_or(42);
            let name = p["name"].as_str().unwrap_or("person");
            let text = p["text"].as_str().unwrap_or_default();
            let at_ms = now_ms();
            let id = fake.post(CHAT, user, name, Some(name), text);
            say(json!({"posted": {"message_id": id, "at_ms": at_ms}}));
        } else {
            say(json!({"error": format!("unknown command: {line}")}));
        }
    }
}
