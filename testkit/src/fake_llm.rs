//! A fake LLM provider for tests: a real HTTP/1.1 server on 127.0.0.1 that speaks the OpenAI
//! chat-completions or the Anthropic Messages wire format, answers from a script
//! ([`FakeLlm::push_text`], [`FakeLlm::push_status`], …) and records every request it receives.
//!
//! It checks requests the way the real APIs do (roles, alternation, tool-result pairing, headers)
//! and answers a violation with the provider's 400, so a client that passes against it speaks the
//! real format. It shares no code with the client it tests. It is not a model: it says what it is
//! told. It runs on its own thread and tokio runtime, so sync and async tests can use it, and its
//! delays keep real time while a test pauses its own clock.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::http1::{self, Server};

/// Which wire format the fake speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FakeProvider {
    /// `POST /v1/chat/completions`; [`FakeLlm::base_url`] is `http://127.0.0.1:PORT/v1`.
    OpenAi,
    /// `POST /v1/messages`; [`FakeLlm::base_url`] is `http://127.0.0.1:PORT`.
    Anthropic,
}

/// Token usage every successful answer reports (prompt / input side).
pub const FAKE_TOKENS_IN: u64 = 17;
/// Token usage every successful answer reports (completion / output side).
pub const FAKE_TOKENS_OUT: u64 = 5;
/// Prompt tokens every successful answer reports as served from the provider's cache.
pub const FAKE_TOKENS_CACHED: u64 = 12;

/// How long [`FakeLlm::wait_requests`] waits (real time) before failing the test.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(20);

/// One scripted answer; each request that passes validation consumes one.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A plain text answer.
    Text(String),
    /// A tool call; `arguments` is JSON text (Anthropic gets it as an object).
    ToolCall { name: String, arguments: String },
    /// A non-2xx answer with the provider's error body and an optional `retry-after` header.
    Error { status: u16, message: String, retry_after: Option<String> },
    /// 200 with a body that is not JSON.
    Malformed,
    /// Exactly this status and body.
    Raw { status: u16, body: String },
    /// The inner reply after a real-time pause (longer than the client's timeout: a timeout).
    Delayed(Duration, Box<Reply>),
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON (`Null` when it was not JSON).
    pub body: Value,
    pub raw_body: String,
    /// When the request was complete (real time).
    pub at: Instant,
}

impl Received {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
struct Shared {
    provider: FakeProvider,
    script: Mutex<VecDeque<Reply>>,
    received: Mutex<Vec<Received>>,
    count: watch::Sender<usize>,
    required_key: Mutex<Option<String>>,
    next_id: Mutex<u64>,
    /// Answered when the script is empty (`None`: an error saying so).
    always: Mutex<Option<Reply>>,
    /// A server that does not know strict tools: a request with one is refused (400).
    no_strict: Mutex<bool>,
    /// What `GET /v1/models` lists (OpenAI-compatible servers; `flockctl init` probes it).
    models: Mutex<Vec<String>>,
}

/// A running fake provider; stops when dropped.
#[derive(Debug)]
pub struct FakeLlm {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: Server,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FakeLlm {
    /// Binds 127.0.0.1:0 and serves on a thread of its own.
    pub fn start(provider: FakeProvider) -> FakeLlm {
        let shared = Arc::new(Shared {
            always: Mutex::new(None),
            no_strict: Mutex::new(false),
            models: Mutex::new(vec!["m".to_owned()]),
            provider,
            script: Mutex::new(VecDeque::new()),
            received: Mutex::new(Vec::new()),
            count: watch::Sender::new(0),
            required_key: Mutex::new(None),
            next_id: Mutex::new(0),
        });
        let served = Arc::clone(&shared);
        let server = Server::start("fake-llm", move |listener, stop| {
            http1::accept_until(listener, stop, move |stream| {
                connection(stream, Arc::clone(&served))
            })
        });
        FakeLlm { addr: server.addr, shared, server }
    }

    /// What a client's `base_url` should be: `http://127.0.0.1:PORT/v1` for OpenAI-compatible,
    /// `http://127.0.0.1:PORT` for Anthropic.
    pub fn base_url(&self) -> String {
        match self.shared.provider {
            FakeProvider::OpenAi => format!("http://{}/v1", self.addr),
            FakeProvider::Anthropic => format!("http://{}", self.addr),
        }
    }

    pub fn provider(&self) -> FakeProvider {
        self.shared.provider
    }

    /// From now on, answer 401 (without consuming the script) unless the request carries `key`
    /// (`Authorization: Bearer` or `x-api-key`). The 401 text echoes the key it got, as some
    /// providers do, so tests can check that clients scrub it.
    pub fn require_key(&self, key: &str) {
        *lock(&self.shared.required_key) = Some(key.to_string());
    }

    /// From now on, refuse (400, without consuming the script) a request with a strict tool,
    /// as a server that does not know the field does.
    pub fn refuse_strict(&self) {
        *lock(&self.shared.no_strict) = true;
    }

    /// The model ids `GET /v1/models` lists (default: `m`).
    pub fn serve_models(&self, ids: &[&str]) {
        *lock(&self.shared.models) = ids.iter().map(|i| i.to_string()).collect();
    }

    pub fn push(&self, reply: Reply) {
        lock(&self.shared.script).push_back(reply);
    }

    /// Answers `reply` to every request once the script is used up (a model that never stops).
    pub fn always(&self, reply: Reply) {
        *lock(&self.shared.always) = Some(reply);
    }

    pub fn push_text(&self, text: &str) {
        self.push(Reply::Text(text.to_string()));
    }

    /// A tool call; `args_json` must be JSON text (an object, for Anthropic).
    pub fn push_tool_call(&self, name: &str, args_json: &str) {
        let parsed: Value = serde_json::from_str(args_json).expect("push_tool_call wants JSON");
        if self.shared.provider == FakeProvider::Anthropic {
            assert!(parsed.is_object(), "Anthropic tool inputs are objects: {args_json}");
        }
        self.push(Reply::ToolCall { name: name.to_string(), arguments: args_json.to_string() });
    }

    /// An error status with a stock provider message and an optional `retry-after` value.
    pub fn push_status(&self, status: u16, retry_after: Option<&str>) {
        let message = match status {
            401 => "invalid api key (fake)",
            429 => "rate limit reached (fake)",
            529 => "overloaded (fake)",
            s if s >= 500 => "the server had an error processing your request (fake)",
            _ => "request rejected (fake)",
        };
        self.push(Reply::Error {
            status,
            message: message.to_string(),
            retry_after: retry_after.map(str::to_string),
        });
    }

    /// An error status with the provider error text `message`.
    pub fn push_error(&self, status: u16, message: &str) {
        self.push(Reply::Error { status, message: message.to_string(), retry_after: None });
    }

    pub fn push_malformed(&self) {
        self.push(Reply::Malformed);
    }

    pub fn push_raw(&self, status: u16, body: &str) {
        self.push(Reply::Raw { status, body: body.to_string() });
    }

    /// Answers the next request only after `delay` (then with the text "too late").
    pub fn push_delay(&self, delay: Duration) {
        self.push(Reply::Delayed(delay, Box::new(Reply::Text("too late".into()))));
    }

    /// Scripted replies not consumed yet.
    pub fn pending_replies(&self) -> usize {
        lock(&self.shared.script).len()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Received> {
        lock(&self.shared.received).clone()
    }

    pub fn request_count(&self) -> usize {
        *self.shared.count.borrow()
    }

    /// Waits until at least `n` requests have arrived and returns them all; panics after
    /// [`WAIT_TIMEOUT`] of real time (the deadline runs on the fake's clock, so it also works in
    /// a test whose own clock is paused).
    pub async fn wait_requests(&self, n: usize) -> Vec<Received> {
        let mut count = self.shared.count.subscribe();
        let waited = self
            .server
            .rt
            .spawn(async move {
                tokio::time::timeout(WAIT_TIMEOUT, count.wait_for(|c| *c >= n)).await.is_ok()
            })
            .await
            .unwrap_or(false);
        assert!(
            waited,
            "fake LLM: {} request(s) after {WAIT_TIMEOUT:?}, expected {n}",
            self.request_count()
        );
        self.requests()
    }
}

/// One request, one answer, then close (`Connection: close`: no keep-alive to get wrong). The
/// request must have a `Content-Length` body (a model client that streams its request chunked
/// is answered 400).
async fn connection(stream: TcpStream, shared: Arc<Shared>) {
    const JSON: Option<&str> = Some("application/json");
    let mut conn = http1::Conn::new(stream);
    let malformed = http1::Response::new(400, JSON, &[], "{}");
    let Some(request) = conn.next_request(&malformed).await else { return };
    if request.header("transfer-encoding").is_some() {
        conn.answer(&malformed, false).await;
        return;
    }
    let raw_body = String::from_utf8_lossy(&request.body).into_owned();
    let received = Received {
        method: request.method,
        path: request.target,
        headers: request.headers,
        body: serde_json::from_str(&raw_body).unwrap_or(Value::Null),
        raw_body,
        at: Instant::now(),
    };
    let (status, headers, body) = answer(&shared, &received).await;
    conn.answer(&http1::Response::new(status, JSON, &headers, &body), false).await;
}

type Answer = (u16, Vec<(String, String)>, String);

/// Records the request, checks it, and renders the next scripted reply.
async fn answer(shared: &Shared, request: &Received) -> Answer {
    // The model list of an OpenAI-compatible server: not a model call, not recorded.
    if shared.provider == FakeProvider::OpenAi
        && request.method == "GET"
        && request.path == "/v1/models"
    {
        let data: Vec<Value> = lock(&shared.models)
            .iter()
            .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "flock-fake"}))
            .collect();
        return (200, Vec::new(), serde_json::json!({"object": "list", "data": data}).to_string());
    }
    {
        let mut received = lock(&shared.received);
        received.push(request.clone());
        shared.count.send_replace(received.len());
    }
    let provider = shared.provider;
    let required = lock(&shared.required_key).clone();
    if let Some(key) = required {
        let got = match provider {
            FakeProvider::OpenAi => request
                .header("authorization")
                .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).to_string()),
            FakeProvider::Anthropic => request.header("x-api-key").map(str::to_string),
        };
        if got.as_deref() != Some(key.as_str()) {
            let message = match got {
                Some(k) => format!("Incorrect API key provided: {k}"),
                None => "no API key provided".to_string(),
            };
            return error(provider, 401, &message, None);
        }
    }
    let check = match provider {
        FakeProvider::OpenAi => check_openai(request),
        FakeProvider::Anthropic => check_anthropic(request),
    };
    let check = check.and_then(|()| check_strict(request, provider, *lock(&shared.no_strict)));
    if let Err((status, message)) = check {
        return error(provider, status, &format!("fake {provider:?}: {message}"), None);
    }
    let next = lock(&shared.script).pop_front().or_else(|| lock(&shared.always).clone());
    let Some(mut reply) = next else {
        let n = *shared.count.borrow();
        return error(
            provider,
            400,
            &format!("fake LLM has no scripted reply left (request {n})"),
            None,
        );
    };
    while let Reply::Delayed(delay, inner) = reply {
        tokio::time::sleep(delay).await;
        reply = *inner;
    }
    let id = {
        let mut next = lock(&shared.next_id);
        *next += 1;
        *next
    };
    let model = request.body.get("model").cloned().unwrap_or(Value::Null);
    match reply {
        Reply::Text(text) => (200, vec![], render_text(provider, id, &model, &text).to_string()),
        Reply::ToolCall { name, arguments } => {
            (200, vec![], render_tool_call(provider, id, &model, &name, &arguments).to_string())
        }
        Reply::Error { status, message, retry_after } => {
            error(provider, status, &message, retry_after)
        }
        Reply::Malformed => (
            200,
            vec![],
            match provider {
                FakeProvider::OpenAi => {
                    r#"{"id": "chatcmpl-x", "choices": [{"message": "#.to_string()
                }
                FakeProvider::Anthropic => r#"{"id": "msg_x", "content": [{"type": "#.to_string(),
            },
        ),
        Reply::Raw { status, body } => (status, vec![], body),
        Reply::Delayed(..) => unreachable!("delays were unwrapped above"),
    }
}

fn render_text(provider: FakeProvider, id: u64, model: &Value, text: &str) -> Value {
    match provider {
        FakeProvider::OpenAi => json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }],
            "usage": openai_usage(),
        }),
        FakeProvider::Anthropic => json!({
            "id": format!("msg_fake_{id}"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": null,
            "usage": anthropic_usage(),
        }),
    }
}

fn render_tool_call(
    provider: FakeProvider,
    id: u64,
    model: &Value,
    name: &str,
    args: &str,
) -> Value {
    match provider {
        FakeProvider::OpenAi => json!({
            "id": format!("chatcmpl-fake-{id}"),
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": null,
                    "tool_calls": [{
                        "id": format!("call_fake_{id}"),
                        "type": "function",
                        "function": {"name": name, "arguments": args},
                    }],
                },
                "finish_reason": "tool_calls",
            }],
            "usage": openai_usage(),
        }),
        // Claude usually says a word before it calls a tool: a text block, then tool_use.
        FakeProvider::Anthropic => json!({
            "id": format!("msg_fake_{id}"),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [
                {"type": "text", "text": format!("I'll use {name}.")},
                {
                    "type": "tool_use",
                    "id": format!("toolu_fake_{id}"),
                    "name": name,
                    "input": serde_json::from_str::<Value>(args).unwrap_or(Value::Null),
                },
            ],
            "stop_reason": "tool_use",
            "stop_sequence": null,
            "usage": anthropic_usage(),
        }),
    }
}

fn openai_usage() -> Value {
    json!({
        "prompt_tokens": FAKE_TOKENS_IN,
        "completion_tokens": FAKE_TOKENS_OUT,
        "total_tokens": FAKE_TOKENS_IN + FAKE_TOKENS_OUT,
        "prompt_tokens_details": {"cached_tokens": FAKE_TOKENS_CACHED},
    })
}

fn anthropic_usage() -> Value {
    json!({"input_tokens": FAKE_TOKENS_IN, "output_tokens": FAKE_TOKENS_OUT,
           "cache_read_input_tokens": FAKE_TOKENS_CACHED})
}

/// The provider's error body for `status`.
fn error(
    provider: FakeProvider,
    status: u16,
    message: &str,
    retry_after: Option<String>,
) -> Answer {
    let headers = retry_after.map(|v| ("retry-after".to_string(), v)).into_iter().collect();
    let body = match provider {
        FakeProvider::OpenAi => {
            let (kind, code) = match status {
                401 => ("invalid_request_error", json!("invalid_api_key")),
                429 => ("requests", json!("rate_limit_exceeded")),
                s if s >= 500 => ("server_error", Value::Null),
                _ => ("invalid_request_error", Value::Null),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        FakeProvider::Anthropic => {
            let kind = match status {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
    };
    (status, headers, body.to_string())
}

type Check = Result<(), (u16, String)>;

fn bad(message: impl Into<String>) -> Check {
    Err((400, message.into()))
}

fn common_checks<'a>(
    request: &'a Received,
    path: &str,
) -> Result<&'a serde_json::Map<String, Value>, (u16, String)> {
    if request.method != "POST" || request.path != path {
        return Err((
            404,
            format!("no route for {} {} (expected POST {path})", request.method, request.path),
        ));
    }
    if !request.header("content-type").is_some_and(|v| v.starts_with("application/json")) {
        return Err((400, "content-type must be application/json".into()));
    }
    let body =
        request.body.as_object().ok_or((400, "the body is not a JSON object".to_string()))?;
    if !body.get("model").is_some_and(Value::is_string) {
        return Err((400, "model: field required".into()));
    }
    Ok(body)
}

/// The rules of the OpenAI chat-completions API that a client can get wrong.
fn check_openai(request: &Received) -> Check {
    let body = common_checks(request, "/v1/chat/completions")?;
    let Some(messages) = body.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty())
    else {
        return bad("messages: a non-empty list is required");
    };
    let mut call_ids = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content");
        match role {
            "system" | "developer" | "user" => {
                if !content.is_some_and(|c| c.is_string() || c.is_array()) {
                    return bad(format!("messages[{i}].content: text required for {role}"));
                }
            }
            "assistant" => {
                let calls = m.get("tool_calls");
                if let Some(calls) = calls {
                    let Some(calls) = calls.as_array().filter(|c| !c.is_empty()) else {
                        return bad(format!(
                            "messages[{i}].tool_calls: a non-empty list or absent"
                        ));
                    };
                    for (j, c) in calls.iter().enumerate() {
                        let id = c.get("id").and_then(Value::as_str);
                        let f = c.get("function");
                        let ok = id.is_some()
                            && c.get("type").and_then(Value::as_str) == Some("function")
                            && f.and_then(|f| f.get("name")).is_some_and(Value::is_string)
                            && f.and_then(|f| f.get("arguments")).is_some_and(Value::is_string);
                        if !ok {
                            return bad(format!(
                                "messages[{i}].tool_calls[{j}]: id, type \"function\", \
                                 function.name and function.arguments (a string) are required"
                            ));
                        }
                        call_ids.insert(id.unwrap_or_default().to_string());
                    }
                }
                let has_text = content.is_some_and(|c| c.is_string() || c.is_array());
                let null_ok = content.is_some_and(Value::is_null) && calls.is_some();
                if !has_text && !null_ok {
                    return bad(format!(
                        "messages[{i}]: assistant content must be text, or null with tool_calls"
                    ));
                }
            }
            "tool" => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                if !call_ids.contains(id) {
                    return bad(format!(
                        "messages[{i}]: tool_call_id {id:?} answers no earlier assistant tool call"
                    ));
                }
                if !content.is_some_and(Value::is_string) {
                    return bad(format!("messages[{i}].content: text required for tool"));
                }
            }
            other => return bad(format!("messages[{i}].role: unknown role {other:?}")),
        }
    }
    if let Some(tools) = body.get("tools") {
        let Some(tools) = tools.as_array().filter(|t| !t.is_empty()) else {
            return bad("tools: a non-empty list or absent");
        };
        for (i, t) in tools.iter().enumerate() {
            let f = t.get("function");
            let ok = t.get("type").and_then(Value::as_str) == Some("function")
                && f.and_then(|f| f.get("name")).is_some_and(Value::is_string)
                && f.and_then(|f| f.get("parameters")).is_none_or(Value::is_object);
            if !ok {
                return bad(format!("tools[{i}]: type \"function\" with function.name required"));
            }
        }
    }
    if body.get("max_tokens").is_some_and(|v| !v.is_u64()) {
        return bad("max_tokens: an integer");
    }
    Ok(())
}

/// The rules of both providers' strict tool modes: a strict tool's schema closes every object
/// (`additionalProperties: false`), requires every property, and uses no keyword the modes
/// reject; Anthropic's needs its beta header. `refuse`: the server does not know strict tools.
fn check_strict(request: &Received, provider: FakeProvider, refuse: bool) -> Check {
    let tools = request.body.get("tools").and_then(Value::as_array).cloned().unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        let (strict, schema) = match provider {
            FakeProvider::OpenAi => (
                t.pointer("/function/strict"),
                t.pointer("/function/parameters").cloned().unwrap_or(Value::Null),
            ),
            FakeProvider::Anthropic => {
                (t.get("strict"), t.get("input_schema").cloned().unwrap_or(Value::Null))
            }
        };
        match strict {
            None | Some(Value::Bool(false)) => continue,
            Some(Value::Bool(true)) => {}
            Some(other) => return bad(format!("tools[{i}].strict: a boolean, got {other}")),
        }
        if refuse {
            return bad(format!("tools[{i}].strict: Extra inputs are not permitted"));
        }
        if provider == FakeProvider::Anthropic
            && !request.header("anthropic-beta").is_some_and(|b| b.contains("structured-outputs"))
        {
            return bad(format!("tools.{i}.strict: requires the structured-outputs beta header"));
        }
        if let Some(problem) = strict_problem(&schema, "") {
            return bad(format!("tools[{i}]: invalid schema for strict mode: {problem}"));
        }
    }
    Ok(())
}

/// What a strict schema breaks, if anything (at `at`, a JSON pointer).
fn strict_problem(schema: &Value, at: &str) -> Option<String> {
    const REJECTED: &[&str] =
        &["minLength", "maxLength", "minItems", "maxItems", "minimum", "maximum", "default"];
    let obj = schema.as_object()?;
    if let Some(k) = REJECTED.iter().find(|k| obj.contains_key(**k)) {
        return Some(format!("`{k}` is not supported at '{at}'"));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        if obj.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Some(format!("'additionalProperties' is required to be false at '{at}'"));
        }
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(missing) = props.keys().find(|k| !required.contains(&k.as_str())) {
            return Some(format!(
                "'required' must list every property; missing '{missing}' at '{at}'"
            ));
        }
        for (k, p) in props {
            if let Some(problem) = strict_problem(p, &format!("{at}/properties/{k}")) {
                return Some(problem);
            }
        }
    }
    if let Some(items) = obj.get("items") {
        return strict_problem(items, &format!("{at}/items"));
    }
    obj.get("anyOf").and_then(Value::as_array).and_then(|branches| {
        branches.iter().enumerate().find_map(|(i, b)| strict_problem(b, &format!("{at}/anyOf/{i}")))
    })
}

/// The rules of the Anthropic Messages API that a client can get wrong.
fn check_anthropic(request: &Received) -> Check {
    let body = common_checks(request, "/v1/messages")?;
    if request.header("anthropic-version").is_none() {
        return bad("anthropic-version: header is required");
    }
    if !body.get("max_tokens").is_some_and(Value::is_u64) {
        return bad("max_tokens: Field required");
    }
    if body.get("system").is_some_and(|s| !s.is_string() && !s.is_array()) {
        return bad("system: text or a list of text blocks");
    }
    let Some(messages) = body.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty())
    else {
        return bad("messages: at least one message is required");
    };
    let mut previous_tool_uses: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let expected = if i % 2 == 0 { "user" } else { "assistant" };
        if role != expected {
            return bad(format!(
                "messages.{i}.role: roles must alternate user/assistant starting with user; got {role:?}"
            ));
        }
        let blocks = match m.get("content") {
            Some(Value::String(s)) if !s.trim().is_empty() => Vec::new(),
            Some(Value::Array(b)) if !b.is_empty() => b.clone(),
            _ => return bad(format!("messages.{i}.content: non-empty text or blocks required")),
        };
        let mut tool_uses = HashSet::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match b.get("type").and_then(Value::as_str).unwrap_or("") {
                "text" => {
                    if b.get("text").and_then(Value::as_str).is_none_or(|t| t.trim().is_empty()) {
                        return bad(format!(
                            "{at}: text content blocks must contain non-whitespace text"
                        ));
                    }
                }
                "tool_use" if role == "assistant" => {
                    let id = b.get("id").and_then(Value::as_str);
                    let ok = id.is_some()
                        && b.get("name").is_some_and(Value::is_string)
                        && b.get("input").is_some_and(Value::is_object);
                    if !ok {
                        return bad(format!("{at}: tool_use needs id, name and an object input"));
                    }
                    tool_uses.insert(id.unwrap_or_default().to_string());
                }
                "tool_result" if role == "user" => {
                    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                    if !previous_tool_uses.contains(id) {
                        return bad(format!(
                            "{at}: tool_result {id:?} must answer a tool_use in the previous message"
                        ));
                    }
                }
                other => {
                    return bad(format!(
                        "{at}: block type {other:?} not allowed in a {role} message"
                    ));
                }
            }
        }
        previous_tool_uses = tool_uses;
    }
    if let Some(tools) = body.get("tools") {
        let Some(tools) = tools.as_array() else {
            return bad("tools: a list");
        };
        for (i, t) in tools.iter().enumerate() {
            let schema_ok = t
                .get("input_schema")
                .is_some_and(|s| s.get("type").and_then(Value::as_str) == Some("object"));
            if !t.get("name").is_some_and(Value::is_string) || !schema_ok {
                return bad(format!("tools.{i}: name and an input_schema of type object required"));
            }
        }
    }
    Ok(())
}
