//! The real `flock-model` binary, driven over HTTP: startup refusals (always run), and — when
//! the model file is present (`FLOCK_MODEL_PATH`, or `$FLOCK_HOME/models/…` as `scripts/setup`
//! installs it) — the token check, plain and tool-calling completions through `flock-llm`'s
//! client (the gateway's code path), cancellation on disconnect, FIFO service of concurrent
//! requests, and the latency of a ~300-token tool-call turn.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use flock_llm::{
    ChatMsg, ChatRequest, ChatResponse, Endpoint, LlmClient, LlmError, ProviderKind, RetryPolicy,
    Secret, ToolDef,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TOKEN: &str = "test-token-7f3a";
const BIN: &str = env!("CARGO_BIN_EXE_flock-model");

/// The model file, or `None` (and a note on stderr) when it is not on this machine.
fn model_path(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("FLOCK_MODEL_PATH")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(flock_model::default_model_path);
    match path {
        Some(p) if p.is_file() => Some(p),
        other => {
            assert!(
                std::env::var_os("FLOCK_REQUIRE_MODEL").is_none(),
                "FLOCK_REQUIRE_MODEL is set but there is no model file ({other:?}): run scripts/setup"
            );
            println!(
                "skipped {test}: no model file ({}); run scripts/setup or set FLOCK_MODEL_PATH",
                other
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "no FLOCK_HOME/HOME".into())
            );
            None
        }
    }
}

/// A running `flock-model`, killed on drop.
struct ModelServer {
    child: Child,
    port: u16,
}

impl ModelServer {
    fn start(model: &PathBuf) -> ModelServer {
        let mut child = Command::new(BIN)
            .arg("--model")
            .arg(model)
            .args(["--listen", "127.0.0.1:0"])
            .env("FLOCK_MODEL_TOKEN", TOKEN)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn flock-model");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next().and_then(Result::ok));
            // Keep draining so a stray write never blocks the server.
            for _ in lines {}
        });
        let line = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("flock-model printed no readiness line within 120 s")
            .expect("flock-model exited before it was ready");
        let port = line
            .strip_prefix("listening on 127.0.0.1:")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected readiness line: {line:?}"));
        ModelServer { child, port }
    }

    fn endpoint(&self, key: Option<&str>) -> Endpoint {
        let mut ep = Endpoint::new(
            ProviderKind::OpenAi,
            format!("http://127.0.0.1:{}/v1", self.port),
            "qwen2.5-coder-1.5b-instruct",
        );
        ep.retry = RetryPolicy { retries: 0, ..RetryPolicy::default() };
        // As the gateway calls it: the grammar holds calls to their schemas.
        ep.strict_tools = false;
        match key {
            Some(k) => ep.with_key(Secret::new(k)),
            None => ep,
        }
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One raw HTTP/1.1 exchange (`Connection: close`): status and body.
async fn raw(port: u16, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn post(path: &str, token: Option<&str>, body: &Value) -> String {
    let body = body.to_string();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

fn tools() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: "agents__send".into(),
            description: "Send a message to another agent of the team.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "to": {"type": "string", "enum": ["worker-1", "worker-2"]},
                    "text": {"type": "string"},
                },
                "required": ["to", "text"],
            }),
        },
        ToolDef {
            name: "flock_channel_post".into(),
            description: "Post a message to a channel everyone on it can read.".into(),
            parameters: json!({
                "type": "object",
                "properties": {"channel": {"type": "string"}, "text": {"type": "string"}},
                "required": ["channel", "text"],
            }),
        },
    ]
}

/// Whether `args` matches the tool's parameter schema (the subset these tools use: object,
/// required, string types, enums, no extra properties).
fn matches_schema(schema: &Value, args: &Value) -> Result<(), String> {
    let obj = args.as_object().ok_or("arguments are not an object")?;
    let props = schema["properties"].as_object().unwrap();
    for r in schema["required"].as_array().unwrap() {
        if !obj.contains_key(r.as_str().unwrap()) {
            return Err(format!("missing required `{r}`"));
        }
    }
    for (k, v) in obj {
        let p = props.get(k).ok_or(format!("unknown property `{k}`"))?;
        if p["type"] == "string" && !v.is_string() {
            return Err(format!("`{k}` is not a string"));
        }
        if let Some(e) = p.get("enum").and_then(Value::as_array)
            && !e.contains(v)
        {
            return Err(format!("`{k}` = {v} is not one of {e:?}"));
        }
    }
    Ok(())
}

/// `Ok(name)` for a schema-valid call of one of `tools()`, else what is wrong.
fn valid_call(r: &ChatResponse) -> Result<String, String> {
    let [call] = r.tool_calls.as_slice() else {
        return Err(format!("expected one tool call, got {:?} / text {:?}", r.tool_calls, r.text));
    };
    let tool = tools().into_iter().find(|t| t.name == call.name);
    let tool = tool.ok_or(format!("`{}` is not an offered tool", call.name))?;
    let args: Value = serde_json::from_str(&call.arguments)
        .map_err(|e| format!("arguments are not JSON ({e}): {}", call.arguments))?;
    matches_schema(&tool.parameters, &args)?;
    Ok(call.name.clone())
}

const SYSTEM: &str = "You are the coordinator of a small software team (worker-1 and worker-2). \
    Route every task to the right worker with agents__send, post team-wide news to a channel \
    with flock_channel_post, and answer simple questions yourself. Keep messages short and \
    concrete. Never do a worker's job yourself.";

fn tool_request(system: &str, user: &str) -> ChatRequest {
    ChatRequest {
        messages: vec![
            ChatMsg::System { text: system.into() },
            ChatMsg::User { text: user.into() },
        ],
        tools: tools(),
        ..Default::default()
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_model_serves_the_gateway_client() {
    let Some(model) = model_path("embedded_model_serves_the_gateway_client") else { return };
    let server = ModelServer::start(&model);
    let client = LlmClient::new().unwrap();
    let ep = server.endpoint(Some(TOKEN));

    // Health needs no token; everything under /v1 does.
    let (status, body) =
        raw(server.port, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
    assert_eq!(status, 200, "{body}");

    // (1) No token, or a wrong one: 401, and the client reports it as such.
    let hello = ChatRequest {
        messages: vec![ChatMsg::User { text: "Say hello in five words.".into() }],
        tools: vec![],
        ..Default::default()
    };
    for key in [None, Some("wrong-token")] {
        match client.complete(&server.endpoint(key), &hello).await {
            Err(LlmError::Http { status: 401, .. }) => {}
            other => panic!("expected 401 with key {key:?}, got {other:?}"),
        }
    }
    let (status, _) = raw(
        server.port,
        &post(
            "/v1/chat/completions",
            None,
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        ),
    )
    .await;
    assert_eq!(status, 401);

    // (2) A plain completion.
    let started = Instant::now();
    let r = client.complete(&ep, &hello).await.expect("plain completion");
    let text = r.text.clone().unwrap_or_default();
    println!(
        "plain: {text:?} ({} in / {} out, {:?})",
        r.tokens_in,
        r.tokens_out,
        started.elapsed()
    );
    assert!(!text.trim().is_empty(), "{r:?}");
    assert!(r.tool_calls.is_empty());
    assert!(r.tokens_in > 0 && r.tokens_out > 0, "{r:?}");

    // (3) Tool calls, five turns: all must be valid calls. The system prompt and tools are the
    // same each time (as for one agent), so turns after the first reuse the KV cache.
    let asks = [
        ("Tell worker-1 to write the login page", "worker-1"),
        ("Tell worker-2 to add tests for the signup form", "worker-2"),
        ("Ask worker-1 to fix the broken build on main", "worker-1"),
        ("Have worker-2 update the README with the new setup steps", "worker-2"),
        ("Tell worker-1 to review the database migration", "worker-1"),
    ];
    let mut warm = Vec::new();
    let (mut valid, mut sensible, mut prompt_tokens) = (0, 0, 0);
    for (ask, worker) in asks {
        let started = Instant::now();
        let r = client.complete(&ep, &tool_request(SYSTEM, ask)).await.expect("tool completion");
        let took = started.elapsed();
        warm.push(took);
        prompt_tokens = r.tokens_in;
        let verdict = valid_call(&r);
        println!("tool call {ask:?} → {:?} {:?} ({took:?})", verdict, r.tool_calls.first());
        if verdict.is_ok() {
            valid += 1;
            let c = &r.tool_calls[0];
            if c.name == "agents__send" && c.arguments.contains(worker) {
                sensible += 1;
            }
        }
    }
    println!(
        "valid tool calls: {valid}/5, sensible (agents__send to the named worker): {sensible}/5"
    );
    assert_eq!(valid, 5, "every constrained answer must be a valid tool call");

    // (4) Latency: warm turns above (shared prefix, as an agent's turns are) and cold turns
    // (a different first line each time, so nothing is reused).
    let mut cold = Vec::new();
    for (i, (ask, _)) in asks.iter().take(3).enumerate() {
        let system = format!("Session {i}. {SYSTEM}");
        let started = Instant::now();
        let r = client.complete(&ep, &tool_request(&system, ask)).await.expect("cold completion");
        cold.push(started.elapsed());
        assert!(valid_call(&r).is_ok(), "{r:?}");
    }
    println!(
        "latency for a {prompt_tokens}-token tool-call prompt: p50 warm {:?} (first turn {:?}), \
         p50 cold {:?}",
        p50(warm.clone()),
        warm[0],
        p50(cold)
    );

    // A final answer comes back as text, not a tool call.
    let r = client.complete(&ep, &tool_request(SYSTEM, "What is 2 + 2?")).await.unwrap();
    println!("final answer: {:?} {:?}", r.text, r.tool_calls);
    assert!(r.tool_calls.len() + usize::from(r.text.is_some()) == 1, "{r:?}");

    // A call the token limit would cut mid-argument is closed in time: still a valid call.
    let mut cut_ep = ep.clone();
    cut_ep.max_tokens = 32;
    let mut long = tool_request(
        SYSTEM,
        "Tell worker-1 to build the login page, and in the message spell out every one of the \
         twenty steps in full detail, one paragraph per step.",
    );
    long.required = true;
    let r = client.complete(&cut_ep, &long).await.expect("a call at the token limit");
    println!("a call closed at the limit: {:?} ({} tokens)", r.tool_calls, r.tokens_out);
    assert!(r.tokens_out <= 32, "{r:?}");
    assert!(valid_call(&r).is_ok(), "{:?}: {r:?}", valid_call(&r));

    // The wire shape itself.
    let body = json!({
        "model": "m",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": asks[0].0}],
        "tools": tools().iter().map(|t| json!({"type": "function", "function": {
            "name": t.name, "description": t.description, "parameters": t.parameters}})).collect::<Vec<_>>(),
    });
    let (status, body) = raw(server.port, &post("/v1/chat/completions", Some(TOKEN), &body)).await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().unwrap().starts_with("call_"));
    assert!(call["function"]["arguments"].is_string());
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);

    // Cancellation: a long generation whose client disconnects must not hold up the queue.
    let long = json!({
        "messages": [{"role": "user", "content": "Count from 1 to 2000, one number per line."}],
        "max_tokens": 3000,
    });
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).await.unwrap();
    s.write_all(post("/v1/chat/completions", Some(TOKEN), &long).as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    drop(s);
    let started = Instant::now();
    let r = client.complete(&ep, &hello).await.expect("completion after a cancelled one");
    let after_cancel = started.elapsed();
    println!("a request behind a cancelled 3000-token generation took {after_cancel:?}");
    assert!(r.text.is_some());
    assert!(after_cancel < Duration::from_secs(30), "the abandoned generation was not cancelled");

    // Concurrent requests are queued and all served.
    let short = ChatRequest {
        messages: vec![ChatMsg::User { text: "Name one colour.".into() }],
        tools: vec![],
        ..Default::default()
    };
    let mut short_ep = ep.clone();
    short_ep.max_tokens = 8;
    let (a, b, c) = tokio::join!(
        client.complete(&short_ep, &short),
        client.complete(&short_ep, &short),
        client.complete(&short_ep, &short),
    );
    for r in [a, b, c] {
        assert!(r.expect("queued completion").tokens_out > 0);
    }
}

#[test]
fn startup_refuses_missing_model_bad_hash_and_no_token() {
    let dir = std::env::temp_dir().join(format!("flock-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |model: &PathBuf, token: Option<&str>, extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.arg("--model").arg(model).args(extra).env_remove("FLOCK_MODEL_TOKEN");
        if let Some(t) = token {
            cmd.env("FLOCK_MODEL_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned(), out.stdout)
    };

    let missing = dir.join("absent.gguf");
    let (code, err, stdout) = run(&missing, Some(TOKEN), &[]);
    assert_eq!(code, Some(flock_model::EXIT_CONFIG), "{err}");
    assert!(err.contains("absent.gguf") && err.contains("scripts/setup"), "{err}");
    assert!(stdout.is_empty());

    let wrong = dir.join("wrong.gguf");
    std::fs::write(&wrong, b"not a model").unwrap();
    let (code, err, _) = run(&wrong, Some(TOKEN), &[]);
    assert_eq!(code, Some(flock_model::EXIT_CONFIG), "{err}");
    assert!(err.contains("wrong.gguf") && err.contains("sha256"), "{err}");
    assert!(err.contains("scripts/setup") && err.contains("--no-verify"), "{err}");

    let (code, err, _) = run(&wrong, None, &[]);
    assert_eq!(code, Some(flock_model::EXIT_CONFIG), "{err}");
    assert!(err.contains("FLOCK_MODEL_TOKEN"), "{err}");

    let (code, err, _) = run(&wrong, Some(TOKEN), &["--listen", "0.0.0.0:0"]);
    assert_eq!(code, Some(flock_model::EXIT_CONFIG), "{err}");
    assert!(err.contains("loopback"), "{err}");

    // --no-verify skips the hash, so loading is what fails (not a configuration refusal).
    let (code, err, stdout) = run(&wrong, Some(TOKEN), &["--no-verify"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("wrong.gguf"), "{err}");
    assert!(stdout.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Each client (`user`) keeps its prompt prefix in its own KV-cache slot: two agents taking
/// turns no longer evict each other, so after its first request an agent's prompt is served
/// mostly from cache (OpenAI's `cached_tokens`), and a background (`flex`) request still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_keeps_its_prompt_prefix_in_its_own_slot() {
    let Some(model) = model_path("every_agent_keeps_its_prompt_prefix_in_its_own_slot") else {
        return;
    };
    let server = ModelServer::start(&model);
    let client = LlmClient::new().unwrap();
    let mut ep = server.endpoint(Some(TOKEN));
    ep.max_tokens = 8;
    let long = |who: &str| {
        format!("You are {who}. {}", "Keep every answer to one short sentence. ".repeat(60))
    };
    let ask = |who: &str, question: &str| ChatRequest {
        messages: vec![
            ChatMsg::System { text: long(who) },
            ChatMsg::User { text: question.into() },
        ],
        user: Some(who.into()),
        service_tier: (who == "observer").then(|| "flex".into()),
        ..Default::default()
    };
    let mut shares = Vec::new();
    for (round, q) in ["Name a colour.", "Name a fruit.", "Name a city."].iter().enumerate() {
        for who in ["coordinator", "worker", "observer"] {
            let r = client.complete(&ep, &ask(who, q)).await.expect("completion");
            assert!(r.tokens_in > 400, "{who}: {} prompt tokens", r.tokens_in);
            if round > 0 {
                shares.push(r.tokens_cached as f64 / r.tokens_in as f64);
            }
        }
    }
    // Rounds 2 and 3 reuse the whole system prompt of each agent despite the interleaving.
    assert!(shares.iter().all(|s| *s > 0.8), "cached shares of the prompt: {shares:?}");
}

/// A background (`flex`) job gives way to a person's request that comes in while it runs: the
/// request waits at most about one token, not the whole background generation, and the
/// background job still finishes afterwards (its prompt kept in its slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_job_gives_way_to_a_request_that_comes_in_while_it_runs() {
    let Some(model) = model_path("a_background_job_gives_way_to_a_request") else {
        return;
    };
    let server = ModelServer::start(&model);
    let client = LlmClient::new().unwrap();
    // 100 tokens: many seconds on a CPU, and within the client's 120 s even at ~1 token/s,
    // which this machine gives when the suite runs two model servers at once.
    let mut long = server.endpoint(Some(TOKEN));
    long.max_tokens = 100;
    let mut short = server.endpoint(Some(TOKEN));
    short.max_tokens = 4;
    let background = ChatRequest {
        messages: vec![ChatMsg::User {
            text: "Count from 1 to 100, one number per line, and nothing else.".into(),
        }],
        user: Some("observer".into()),
        service_tier: Some("flex".into()),
        ..Default::default()
    };
    let person = ChatRequest {
        messages: vec![ChatMsg::User { text: "Say OK.".into() }],
        user: Some("coordinator".into()),
        ..Default::default()
    };
    let (c, ep) = (client.clone(), long.clone());
    let slow = tokio::spawn(async move {
        let r = c.complete(&ep, &background).await;
        (r, Instant::now())
    });
    // While the background job generates (100 tokens take many seconds on a CPU), a person asks.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    client.complete(&short, &person).await.expect("the request during the background job");
    let answered = Instant::now();
    let (done, finished) = slow.await.unwrap();
    let done = done.expect("the background job still finishes");
    assert!(done.tokens_out > 20, "{} tokens", done.tokens_out);
    // Served first-come, the person would get their answer only after the 100 tokens.
    assert!(answered < finished, "the person's request waited for the background job");
    // It went on where it gave way: one count, not a count started over.
    let text = done.text.unwrap_or_default();
    // Whole lines only: `max_tokens` may cut the last number short ("3" of "37").
    let numbers: Vec<u32> = text
        .split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    assert!(numbers.len() > 10, "{text:?}");
    assert!(
        numbers.iter().enumerate().all(|(i, n)| *n == i as u32 + 1),
        "the count restarted or skipped: {text:?}"
    );
}

/// An agent that drops the oldest part of its history (as the runtime trims a long conversation)
/// does not pay for the rest again: the dropped span leaves the slot's cache and what follows it
/// is shifted down and reused — and the model still answers right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_oldest_history_reuses_the_rest_of_the_cache() {
    let Some(model) = model_path("dropping_the_oldest_history_reuses_the_rest_of_the_cache") else {
        return;
    };
    let server = ModelServer::start(&model);
    let client = LlmClient::new().unwrap();
    let mut ep = server.endpoint(Some(TOKEN));
    ep.max_tokens = 8;
    let exchange = |i: usize| {
        [
            ChatMsg::User {
                text: format!("Remember item {i}: a box of {i} red apples and pears."),
            },
            ChatMsg::Assistant {
                text: Some(format!("Noted: item {i} is a box of {i} red apples and pears.")),
                tool_calls: Vec::new(),
            },
        ]
    };
    let conversation = |from: usize, question: &str| {
        let mut m = vec![ChatMsg::System { text: "You answer in a few words.".into() }];
        for i in from..8 {
            m.extend(exchange(i));
        }
        m.push(ChatMsg::User { text: question.into() });
        ChatRequest { messages: m, user: Some("coordinator".into()), ..Default::default() }
    };
    let first = client.complete(&ep, &conversation(0, "Say OK.")).await.expect("first");
    assert!(first.tokens_in > 200, "{} prompt tokens", first.tokens_in);
    // The three oldest exchanges are dropped; the rest and a new question follow.
    let second = client.complete(&ep, &conversation(3, "What is 2 + 2?")).await.expect("second");
    let share = second.tokens_cached as f64 / second.tokens_in as f64;
    assert!(share > 0.8, "only {share:.2} of the prompt came from the cache: {second:?}");
    let text = second.text.clone().unwrap_or_default();
    assert!(text.contains('4'), "a right answer after the shift: {text:?}");
}
