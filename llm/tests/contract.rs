//! Provider contract tests: `LlmClient` against fake OpenAI-compatible and Anthropic servers
//! (`flock_testkit::fake_llm`) that speak the real HTTP wire formats and reject requests the real
//! APIs would reject. Every behaviour runs against both providers (`openai::…`, `anthropic::…`);
//! the backoff schedule runs under paused time (`paused::…`).

use std::time::{Duration, Instant};

use flock_llm::{
    ChatMsg, ChatRequest, ChatResponse, Endpoint, LlmClient, LlmError, ProviderKind, RetryPolicy,
    Secret, ToolCall, ToolDef,
};
use flock_testkit::fake_llm::{
    FAKE_TOKENS_CACHED, FAKE_TOKENS_IN, FAKE_TOKENS_OUT, FakeLlm, FakeProvider,
};
use serde_json::{Value, json};

const KEY: &str = "sk-test-0123456789-DO-NOT-LEAK";

fn fake(kind: ProviderKind) -> FakeLlm {
    FakeLlm::start(match kind {
        ProviderKind::OpenAi => FakeProvider::OpenAi,
        ProviderKind::Anthropic => FakeProvider::Anthropic,
    })
}

/// The default policy's shape with millisecond waits, so retry tests take no time.
fn fast_retry() -> RetryPolicy {
    RetryPolicy { base: Duration::from_millis(5), ..RetryPolicy::default() }
}

fn endpoint(kind: ProviderKind, fake: &FakeLlm) -> Endpoint {
    Endpoint {
        timeout: Duration::from_secs(10),
        max_tokens: 256,
        retry: fast_retry(),
        ..Endpoint::new(kind, fake.base_url(), "test-model").with_key(Secret::new(KEY))
    }
}

fn client() -> LlmClient {
    LlmClient::new().expect("build the LLM client")
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest { messages: vec![ChatMsg::User { text: text.into() }], ..Default::default() }
}

fn json_args(call: &ToolCall) -> Value {
    serde_json::from_str(&call.arguments).expect("tool arguments are JSON text")
}

/// Display and Debug of an error, for "never shows the key" checks.
fn shown(e: &LlmError) -> String {
    format!("{e} | {e:?}")
}

#[track_caller]
fn assert_no_key(text: &str) {
    assert!(!text.contains(KEY), "the API key leaked: {text}");
    assert!(!text.contains("DO-NOT-LEAK"), "part of the API key leaked: {text}");
}

async fn plain_answer_returns_text_and_usage(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_text("Hello from the fake.");
    let r = client().complete(&endpoint(kind, &fake), &ask("hi")).await.expect("answer");
    assert_eq!(
        r,
        ChatResponse {
            text: Some("Hello from the fake.".into()),
            tool_calls: vec![],
            tokens_in: FAKE_TOKENS_IN,
            tokens_out: FAKE_TOKENS_OUT,
            tokens_cached: FAKE_TOKENS_CACHED,
        }
    );
    let sent = fake.requests();
    assert_eq!(sent.len(), 1);
    let req = &sent[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.body["model"], "test-model");
    assert_eq!(req.body["max_tokens"], 256);
    assert!(req.body.get("tools").is_none(), "no tools, no `tools` field: {}", req.body);
    match kind {
        ProviderKind::OpenAi => {
            assert_eq!(req.path, "/v1/chat/completions");
            assert_eq!(req.header("authorization"), Some(format!("Bearer {KEY}").as_str()));
            assert_eq!(req.body["messages"], json!([{"role": "user", "content": "hi"}]));
        }
        ProviderKind::Anthropic => {
            assert_eq!(req.path, "/v1/messages");
            assert_eq!(req.header("x-api-key"), Some(KEY));
            assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
            assert_eq!(req.header("authorization"), None);
            assert_eq!(
                req.body["messages"],
                json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
            );
        }
    }
}

async fn endpoint_without_key_sends_no_key_header(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_text("local model here");
    let ep = Endpoint { api_key: None, ..endpoint(kind, &fake) };
    let r = client().complete(&ep, &ask("hi")).await.expect("answer");
    assert_eq!(r.text.as_deref(), Some("local model here"));
    let req = &fake.requests()[0];
    assert_eq!(req.header("authorization"), None);
    assert_eq!(req.header("x-api-key"), None);
}

async fn tool_call_round_trip(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_tool_call("write_file", r#"{"path": "b.txt", "text": "hi"}"#);
    fake.push_text("Done: b.txt written.");
    let tools = vec![
        ToolDef {
            name: "read_file".into(),
            description: "Read a file of the workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        },
        ToolDef {
            name: "write_file".into(),
            description: "Write a file of the workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}}),
        },
    ];
    let mut req = ChatRequest {
        messages: vec![
            ChatMsg::System { text: "You are a worker.".into() },
            ChatMsg::User { text: "Copy a.txt to b.txt".into() },
            ChatMsg::Assistant {
                text: Some("Reading it first.".into()),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.txt"}"#.into(),
                }],
            },
            ChatMsg::Tool {
                call_id: "call_1".into(),
                name: "read_file".into(),
                content: "hi".into(),
            },
        ],
        tools,
        ..Default::default()
    };
    let client = client();
    // Without strict tools the schemas go out as given (strict_tools_… below: with them).
    let ep = Endpoint { strict_tools: false, ..endpoint(kind, &fake) };

    let first = client.complete(&ep, &req).await.expect("tool call answer");
    assert_eq!(first.tool_calls.len(), 1, "{first:?}");
    let call = &first.tool_calls[0];
    assert_eq!(call.name, "write_file");
    assert_eq!(json_args(call), json!({"path": "b.txt", "text": "hi"}));
    assert!(!call.id.is_empty());

    let body = &fake.requests()[0].body;
    match kind {
        ProviderKind::OpenAi => {
            assert_eq!(first.text, None);
            assert_eq!(
                body["messages"],
                json!([
                    {"role": "system", "content": "You are a worker."},
                    {"role": "user", "content": "Copy a.txt to b.txt"},
                    {"role": "assistant", "content": "Reading it first.", "tool_calls": [
                        {"id": "call_1", "type": "function",
                         "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "hi"},
                ])
            );
            assert_eq!(
                body["tools"][1],
                json!({"type": "function", "function": {
                    "name": "write_file",
                    "description": "Write a file of the workspace.",
                    "parameters": req.tools[1].parameters,
                }})
            );
        }
        ProviderKind::Anthropic => {
            assert_eq!(first.text.as_deref(), Some("I'll use write_file."));
            assert_eq!(body["system"], "You are a worker.");
            assert_eq!(
                body["messages"],
                json!([
                    {"role": "user", "content": [{"type": "text", "text": "Copy a.txt to b.txt"}]},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Reading it first."},
                        {"type": "tool_use", "id": "call_1", "name": "read_file", "input": {"path": "a.txt"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "call_1", "content": "hi"},
                    ]},
                ])
            );
            assert_eq!(
                body["tools"][1],
                json!({
                    "name": "write_file",
                    "description": "Write a file of the workspace.",
                    "input_schema": req.tools[1].parameters,
                })
            );
        }
    }

    // Second leg: the call the model made goes back with its result; the fake checks the pairing.
    req.messages.push(ChatMsg::Assistant {
        text: first.text.clone(),
        tool_calls: first.tool_calls.clone(),
    });
    req.messages.push(ChatMsg::Tool {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: "ok".into(),
    });
    let second = client.complete(&ep, &req).await.expect("final answer");
    assert_eq!(second.text.as_deref(), Some("Done: b.txt written."));
    assert!(second.tool_calls.is_empty());
}

fn strict_tools() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: "fs_write".into(),
            description: "Write a file.".into(),
            parameters: json!({"type": "object", "properties": {
                "path": {"type": "string", "maxLength": 200},
                "text": {"type": "string"},
                "mode": {"type": "string", "enum": ["replace", "append"]},
            }, "required": ["path", "text"]}),
        },
        // Open to any key: it has no strict form and goes as it is.
        ToolDef {
            name: "set_env".into(),
            description: "Set variables.".into(),
            parameters: json!({"type": "object", "additionalProperties": {"type": "string"}}),
        },
    ]
}

async fn strict_tools_hold_calls_to_the_schema_and_optional_nulls_are_dropped(kind: ProviderKind) {
    let fake = fake(kind);
    // Under strict mode a model writes null for an optional property it leaves out.
    fake.push_tool_call("fs_write", r#"{"path": "a.txt", "text": "hi", "mode": null}"#);
    let req = ChatRequest { tools: strict_tools(), ..ask("write a.txt") };
    let r = client().complete(&endpoint(kind, &fake), &req).await.expect("a strict call");
    assert_eq!(json_args(&r.tool_calls[0]), json!({"path": "a.txt", "text": "hi"}));
    let sent = &fake.requests()[0];
    let (write, env) = match kind {
        ProviderKind::OpenAi => {
            (&sent.body["tools"][0]["function"], &sent.body["tools"][1]["function"])
        }
        ProviderKind::Anthropic => (&sent.body["tools"][0], &sent.body["tools"][1]),
    };
    let schema = match kind {
        ProviderKind::OpenAi => &write["parameters"],
        ProviderKind::Anthropic => &write["input_schema"],
    };
    assert_eq!(write["strict"], true, "{write}");
    assert_eq!(schema["additionalProperties"], false);
    assert_eq!(schema["properties"]["path"], json!({"type": "string"}));
    assert_eq!(
        schema["properties"]["mode"],
        json!({"type": ["string", "null"], "enum": ["replace", "append", null]})
    );
    assert!(env.get("strict").is_none(), "an open object goes without strict: {env}");
    if kind == ProviderKind::Anthropic {
        assert!(sent.header("anthropic-beta").is_some_and(|b| b.contains("structured-outputs")));
    }
}

async fn a_server_that_refuses_strict_tools_is_asked_without_from_then_on(kind: ProviderKind) {
    let fake = fake(kind);
    fake.refuse_strict();
    fake.push_tool_call("fs_write", r#"{"path": "a.txt", "text": "hi"}"#);
    fake.push_text("done");
    let client = client();
    let ep = endpoint(kind, &fake);
    let req = ChatRequest { tools: strict_tools(), ..ask("write a.txt") };
    let r = client.complete(&ep, &req).await.expect("answered without strict tools");
    assert_eq!(json_args(&r.tool_calls[0]), json!({"path": "a.txt", "text": "hi"}));
    assert_eq!(fake.request_count(), 2, "refused once, then asked without");
    let r = client.complete(&ep, &req).await.expect("the next call");
    assert_eq!(r.text.as_deref(), Some("done"));
    let sent = fake.requests();
    assert_eq!(sent.len(), 3, "the next call goes without strict tools at once");
    assert!(!sent[2].body.to_string().contains("\"strict\""), "{}", sent[2].body);
    // A request the server refuses for another reason is still refused, not hidden.
    let other = self::fake(kind);
    other.push_error(400, "model `x` does not exist");
    other.push_error(400, "model `x` does not exist");
    let e = client.complete(&endpoint(kind, &other), &req).await.unwrap_err();
    assert!(matches!(e, LlmError::Http { status: 400, .. }), "{e}");
}

async fn every_system_message_reaches_the_wire(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_text("ok");
    let req = ChatRequest {
        messages: vec![
            ChatMsg::System { text: "S1: you are the coordinator.".into() },
            ChatMsg::User { text: "first".into() },
            ChatMsg::System { text: "S2: [runtime_catalog] worker-1".into() },
            ChatMsg::Assistant { text: Some("noted".into()), tool_calls: vec![] },
            ChatMsg::System { text: "S3: [current_time] 2026-01-01".into() },
            ChatMsg::User { text: "second".into() },
        ],
        tools: vec![],
        ..Default::default()
    };
    client().complete(&endpoint(kind, &fake), &req).await.expect("answer");
    let body = &fake.requests()[0].body;
    match kind {
        ProviderKind::OpenAi => {
            let systems: Vec<&str> = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|m| m["role"] == "system")
                .map(|m| m["content"].as_str().unwrap())
                .collect();
            assert_eq!(
                systems,
                [
                    "S1: you are the coordinator.",
                    "S2: [runtime_catalog] worker-1",
                    "S3: [current_time] 2026-01-01"
                ]
            );
            assert_eq!(body["messages"].as_array().unwrap().len(), 6, "{body}");
        }
        ProviderKind::Anthropic => {
            assert_eq!(
                body["system"],
                "S1: you are the coordinator.\n\nS2: [runtime_catalog] worker-1\n\nS3: [current_time] 2026-01-01"
            );
            assert_eq!(body["messages"].as_array().unwrap().len(), 3, "{body}");
        }
    }
}

async fn rate_limit_honours_retry_after_then_succeeds(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_status(429, Some("1"));
    fake.push_text("after the wait");
    let mut delays = Vec::new();
    let r = client()
        .complete_observed(&endpoint(kind, &fake), &ask("hi"), |r| delays.push(r.delay))
        .await
        .expect("answer after one retry");
    assert_eq!(r.text.as_deref(), Some("after the wait"));
    assert_eq!(delays, [Duration::from_secs(1)], "retry-after wins over the 5 ms backoff");
    let sent = fake.requests();
    assert_eq!(sent.len(), 2);
    let gap = sent[1].at - sent[0].at;
    assert!(gap >= Duration::from_secs(1), "retried after {gap:?}, before retry-after: 1");
    assert!(gap < Duration::from_secs(3), "retried after {gap:?}");
}

async fn server_errors_are_retried_until_success(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_status(500, None);
    fake.push_status(502, None);
    fake.push_text("third time lucky");
    let r = client().complete(&endpoint(kind, &fake), &ask("hi")).await.expect("answer");
    assert_eq!(r.text.as_deref(), Some("third time lucky"));
    assert_eq!(fake.request_count(), 3);
}

async fn persistent_failures_give_up_after_four_attempts(kind: ProviderKind) {
    let fake = fake(kind);
    for _ in 0..4 {
        fake.push_status(503, None);
    }
    fake.push_text("never reached");
    let e = client().complete(&endpoint(kind, &fake), &ask("hi")).await.unwrap_err();
    match &e {
        LlmError::Http { status: 503, message, .. } => {
            assert!(message.contains("the server had an error"), "{message}");
            assert!(message.contains("gave up after 4 attempts"), "{message}");
        }
        other => panic!("expected HTTP 503, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 4, "1 attempt + 3 retries");
    assert_eq!(fake.pending_replies(), 1);
}

async fn timeouts_are_retried_then_reported(kind: ProviderKind) {
    let fake = fake(kind);
    for _ in 0..4 {
        fake.push_delay(Duration::from_millis(800));
    }
    fake.push_text("never reached");
    let ep = Endpoint { timeout: Duration::from_millis(150), ..endpoint(kind, &fake) };
    let started = Instant::now();
    let e = client().complete(&ep, &ask("hi")).await.unwrap_err();
    let took = started.elapsed();
    match &e {
        LlmError::Timeout { timeout, attempts, url, .. } => {
            assert_eq!(*timeout, Duration::from_millis(150));
            assert_eq!(*attempts, 4);
            assert_eq!(*url, ep.url());
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(e.to_string().contains("raise the endpoint's timeout"), "{e}");
    assert_eq!(fake.request_count(), 4);
    assert!(took >= Duration::from_millis(600), "4 attempts of 150 ms took {took:?}");
    assert!(took < Duration::from_millis(3000), "the client waited for the slow answers: {took:?}");
}

async fn a_timed_out_attempt_is_retried_and_can_succeed(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_delay(Duration::from_millis(800));
    fake.push_text("fast this time");
    let ep = Endpoint { timeout: Duration::from_millis(200), ..endpoint(kind, &fake) };
    let r = client().complete(&ep, &ask("hi")).await.expect("answer on the retry");
    assert_eq!(r.text.as_deref(), Some("fast this time"));
    assert_eq!(fake.request_count(), 2);
}

async fn malformed_json_fails_at_once(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_malformed();
    fake.push_text("never reached");
    let e = client().complete(&endpoint(kind, &fake), &ask("hi")).await.unwrap_err();
    match &e {
        LlmError::Malformed(m) => assert!(m.contains("not JSON"), "{m}"),
        other => panic!("expected Malformed, got {other:?}"),
    }
    assert_eq!(fake.request_count(), 1, "malformed answers are not retried");
    assert_eq!(fake.pending_replies(), 1);
}

async fn json_without_the_expected_fields_is_malformed(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_raw(200, r#"{"id": "x", "object": "something else"}"#);
    let e = client().complete(&endpoint(kind, &fake), &ask("hi")).await.unwrap_err();
    assert!(matches!(e, LlmError::Malformed(_)), "{e:?}");
    assert_eq!(fake.request_count(), 1);
}

async fn unauthorized_fails_at_once_with_the_providers_message(kind: ProviderKind) {
    let fake = fake(kind);
    fake.require_key("sk-the-right-one");
    fake.push_text("never reached");
    let e = client().complete(&endpoint(kind, &fake), &ask("hi")).await.unwrap_err();
    match &e {
        LlmError::Http { status: 401, message, .. } => {
            assert!(message.contains("Incorrect API key provided: ***"), "{message}");
            assert!(message.contains("check the API key"), "{message}");
        }
        other => panic!("expected HTTP 401, got {other:?}"),
    }
    assert_no_key(&shown(&e));
    assert_eq!(fake.request_count(), 1, "401 is not retried");
}

async fn other_client_errors_fail_at_once_naming_url_and_model(kind: ProviderKind) {
    let fake = fake(kind);
    fake.push_error(404, "model `test-model` does not exist");
    let ep = endpoint(kind, &fake);
    let e = client().complete(&ep, &ask("hi")).await.unwrap_err();
    let text = e.to_string();
    assert!(text.starts_with("HTTP 404 from "), "{text}");
    assert!(text.contains("model `test-model` does not exist"), "{text}");
    assert!(text.contains(&ep.url()), "{text}");
    assert_eq!(fake.request_count(), 1);
}

async fn connection_refused_is_retried_then_a_transport_error(kind: ProviderKind) {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let base_url = match kind {
        ProviderKind::OpenAi => format!("http://127.0.0.1:{port}/v1"),
        ProviderKind::Anthropic => format!("http://127.0.0.1:{port}"),
    };
    let ep = Endpoint {
        retry: fast_retry(),
        ..Endpoint::new(kind, base_url, "m").with_key(Secret::new(KEY))
    };
    let mut retries = 0;
    let e = client().complete_observed(&ep, &ask("hi"), |_| retries += 1).await.unwrap_err();
    assert_eq!(retries, 3);
    match &e {
        LlmError::Transport(m) => {
            assert!(m.contains("cannot connect"), "{m}");
            assert!(m.contains(&format!("127.0.0.1:{port}")), "{m}");
            assert!(m.contains("gave up after 4 attempts"), "{m}");
        }
        other => panic!("expected a transport error, got {other:?}"),
    }
}

/// Every kind of failure, with a provider that echoes the key: no text a person or a log could
/// see contains it.
async fn the_key_never_appears_in_errors_or_debug_output(kind: ProviderKind) {
    let fake = fake(kind);
    let ep = Endpoint { timeout: Duration::from_millis(300), ..endpoint(kind, &fake) };
    assert_no_key(&format!("{ep:?}"));
    assert_no_key(&format!("{:?} {}", ep.api_key, ep.api_key.as_ref().unwrap()));
    assert_no_key(&format!("{:?}", ep.retry));

    let client = client();
    let mut errors = Vec::new();
    // A 401 and a 400 whose texts quote the key; 5xx, timeout and malformed answers too.
    fake.push_error(401, &format!("Incorrect API key provided: {KEY}."));
    fake.push_error(400, &format!("key {KEY} is not allowed to use this model"));
    for _ in 0..4 {
        fake.push_error(500, &format!("internal error for key {KEY}"));
    }
    for _ in 0..4 {
        fake.push_delay(Duration::from_secs(1));
    }
    fake.push_raw(200, &format!("<html>key={KEY}</html>"));
    fake.push_raw(200, &format!(r#"{{"error": {{"message": "bad key {KEY}"}}}}"#));
    for _ in 0..6 {
        let mut hook_texts = Vec::new();
        let e = client
            .complete_observed(&ep, &ask("hi"), |r| hook_texts.push(shown(r.error)))
            .await
            .unwrap_err();
        for t in &hook_texts {
            assert_no_key(t);
        }
        errors.push(e);
    }
    let unreachable = Endpoint {
        base_url: format!("http://127.0.0.1:1/{KEY}"),
        retry: RetryPolicy { retries: 0, ..fast_retry() },
        ..ep.clone()
    };
    errors.push(client.complete(&unreachable, &ask("hi")).await.unwrap_err());
    assert_eq!(fake.pending_replies(), 0, "every scripted failure was served");
    let kinds: Vec<&str> = errors
        .iter()
        .map(|e| match e {
            LlmError::Http { .. } => "http",
            LlmError::Timeout { .. } => "timeout",
            LlmError::Malformed(_) => "malformed",
            LlmError::Transport(_) => "transport",
        })
        .collect();
    assert_eq!(kinds, ["http", "http", "http", "timeout", "malformed", "malformed", "transport"]);
    for e in &errors {
        assert_no_key(&shown(e));
    }
}

macro_rules! for_both_providers {
    ($($name:ident),* $(,)?) => {
        mod openai {
            $(#[tokio::test]
            async fn $name() {
                super::$name(flock_llm::ProviderKind::OpenAi).await
            })*
        }
        mod anthropic {
            $(#[tokio::test]
            async fn $name() {
                super::$name(flock_llm::ProviderKind::Anthropic).await
            })*
        }
    };
}

for_both_providers!(
    plain_answer_returns_text_and_usage,
    endpoint_without_key_sends_no_key_header,
    tool_call_round_trip,
    strict_tools_hold_calls_to_the_schema_and_optional_nulls_are_dropped,
    a_server_that_refuses_strict_tools_is_asked_without_from_then_on,
    every_system_message_reaches_the_wire,
    rate_limit_honours_retry_after_then_succeeds,
    server_errors_are_retried_until_success,
    persistent_failures_give_up_after_four_attempts,
    timeouts_are_retried_then_reported,
    a_timed_out_attempt_is_retried_and_can_succeed,
    malformed_json_fails_at_once,
    json_without_the_expected_fields_is_malformed,
    unauthorized_fails_at_once_with_the_providers_message,
    other_client_errors_fail_at_once_naming_url_and_model,
    connection_refused_is_retried_then_a_transport_error,
    the_key_never_appears_in_errors_or_debug_output,
);

/// OpenAI-compatible servers differ in small ways; the client takes what real ones send.
mod openai_variants {
    use super::*;

    #[tokio::test]
    async fn object_arguments_and_missing_usage_are_accepted() {
        let fake = fake(ProviderKind::OpenAi);
        // Ollama-style: arguments as an object, no usage, no tool call id.
        fake.push_raw(
            200,
            r#"{"choices": [{"message": {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "agents__send", "arguments": {"to": "worker-1"}}}]}}]}"#,
        );
        let r =
            client().complete(&endpoint(ProviderKind::OpenAi, &fake), &ask("hi")).await.unwrap();
        assert_eq!(r.text, None);
        assert_eq!(r.tool_calls.len(), 1);
        assert_eq!(r.tool_calls[0].name, "agents__send");
        assert_eq!(json_args(&r.tool_calls[0]), json!({"to": "worker-1"}));
        assert!(!r.tool_calls[0].id.is_empty(), "a missing id is made up, so results can pair");
        assert_eq!((r.tokens_in, r.tokens_out), (0, 0));
    }

    #[tokio::test]
    async fn retry_after_as_an_http_date_is_honoured() {
        let fake = fake(ProviderKind::OpenAi);
        // Two seconds from now as an IMF-fixdate, which has whole seconds: a wait of 1–2 s.
        let at = std::time::SystemTime::now() + Duration::from_secs(2);
        fake.push_status(429, Some(&http_date(at)));
        fake.push_text("ok");
        let mut delays = Vec::new();
        client()
            .complete_observed(&endpoint(ProviderKind::OpenAi, &fake), &ask("hi"), |r| {
                delays.push(r.delay)
            })
            .await
            .unwrap();
        assert_eq!(delays.len(), 1);
        assert!(
            delays[0] > Duration::from_millis(500) && delays[0] <= Duration::from_secs(2),
            "{delays:?}"
        );
    }

    /// An IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), computed by hand to stay independent
    /// of the client's parser.
    fn http_date(t: std::time::SystemTime) -> String {
        httpdate::fmt_http_date(t)
    }
}

/// The backoff schedule under paused time. Auto-advance would fire the client's timeout timer
/// while it waits on a real socket, so each test holds auto-advance off (a running
/// `spawn_blocking` task inhibits it) and moves the clock itself with `advance`.
mod paused {
    use super::*;
    use tokio::sync::mpsc;

    /// Holds tokio's auto-advance off until dropped.
    struct ManualClock(Option<std::sync::mpsc::Sender<()>>);

    impl ManualClock {
        fn hold() -> Self {
            let (release, hold) = std::sync::mpsc::channel::<()>();
            tokio::task::spawn_blocking(move || {
                let _ = hold.recv();
            });
            ManualClock(Some(release))
        }
    }

    impl Drop for ManualClock {
        fn drop(&mut self) {
            self.0.take();
        }
    }

    /// Lets real time pass (for sockets) without moving the paused clock.
    async fn settle() {
        tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(50)))
            .await
            .unwrap();
    }

    /// Starts a call with `policy` and returns its task and a stream of announced backoff waits.
    fn start_call(
        kind: ProviderKind,
        fake: &FakeLlm,
        policy: RetryPolicy,
    ) -> (tokio::task::JoinHandle<Result<ChatResponse, LlmError>>, mpsc::UnboundedReceiver<Duration>)
    {
        let (tx, rx) = mpsc::unbounded_channel();
        let ep =
            Endpoint { retry: policy, timeout: Duration::from_secs(30), ..endpoint(kind, fake) };
        let call = tokio::spawn(async move {
            client()
                .complete_observed(&ep, &ask("hi"), |r| {
                    let _ = tx.send(r.delay);
                })
                .await
        });
        (call, rx)
    }

    /// Checks that retry `n` reaches the fake `delay` after the client announced it, to the
    /// millisecond (tokio's timer resolution: a deadline is rounded up to the next whole ms).
    async fn expect_retry_after(fake: &FakeLlm, n: usize, delay: Duration) {
        let tick = Duration::from_millis(1);
        tokio::time::advance(delay - tick).await;
        settle().await;
        assert_eq!(fake.request_count(), n, "retry came before the {delay:?} wait was over");
        tokio::time::advance(2 * tick).await;
        fake.wait_requests(n + 1).await;
    }

    async fn backoff_schedule_is_2_4_8_seconds_with_jitter(kind: ProviderKind) {
        let fake = fake(kind);
        fake.push_status(500, None);
        fake.push_status(429, None); // no retry-after: our own backoff applies
        fake.push_status(503, None);
        fake.push_text("finally");
        let _clock = ManualClock::hold();
        let (call, mut waits) = start_call(kind, &fake, RetryPolicy::default());
        fake.wait_requests(1).await;
        for (n, nominal) in [(1usize, 2.0f64), (2, 4.0), (3, 8.0)] {
            let delay = waits.recv().await.expect("a retry is announced");
            let s = delay.as_secs_f64();
            assert!(
                s >= nominal * 0.8 - 1e-9 && s <= nominal * 1.2 + 1e-9,
                "retry {n}: waited {delay:?}, expected {nominal} s ± 20 %"
            );
            expect_retry_after(&fake, n, delay).await;
        }
        let r = call.await.unwrap().expect("answer after three retries");
        assert_eq!(r.text.as_deref(), Some("finally"));
        assert_eq!(fake.request_count(), 4);
    }

    async fn retry_after_is_waited_exactly_and_capped(kind: ProviderKind) {
        let fake = fake(kind);
        fake.push_status(429, Some("7"));
        fake.push_status(503, Some("3600")); // an hour: capped at max_retry_after (60 s)
        fake.push_text("ok");
        let _clock = ManualClock::hold();
        let (call, mut waits) = start_call(kind, &fake, RetryPolicy::default());
        fake.wait_requests(1).await;
        for (n, expected) in [(1usize, Duration::from_secs(7)), (2, Duration::from_secs(60))] {
            assert_eq!(waits.recv().await, Some(expected));
            expect_retry_after(&fake, n, expected).await;
        }
        assert_eq!(call.await.unwrap().unwrap().text.as_deref(), Some("ok"));
    }

    async fn dropping_the_call_during_backoff_cancels_it(kind: ProviderKind) {
        let fake = fake(kind);
        fake.push_status(500, None);
        fake.push_text("never asked for");
        let _clock = ManualClock::hold();
        let (call, mut waits) = start_call(kind, &fake, RetryPolicy::default());
        waits.recv().await.expect("a retry is announced");
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        tokio::time::advance(Duration::from_secs(30)).await;
        settle().await;
        assert_eq!(fake.request_count(), 1, "a cancelled call sends nothing more");
    }

    macro_rules! paused_for_both_providers {
        ($($name:ident),* $(,)?) => {
            mod openai {
                $(#[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(flock_llm::ProviderKind::OpenAi).await
                })*
            }
            mod anthropic {
                $(#[tokio::test(start_paused = true)]
                async fn $name() {
                    super::$name(flock_llm::ProviderKind::Anthropic).await
                })*
            }
        };
    }

    paused_for_both_providers!(
        backoff_schedule_is_2_4_8_seconds_with_jitter,
        retry_after_is_waited_exactly_and_capped,
        dropping_the_call_during_backoff_cancels_it,
    );
}

/// The fake is only a contract if it rejects what the real APIs reject: these requests are
/// written by hand (not by `LlmClient`) and must come back 400 with the provider's error shape.
mod fake_server {
    use super::*;
    use std::io::{Read, Write};

    /// POSTs `body` with `headers` over a plain socket; returns the status and the JSON answer.
    fn post(fake: &FakeLlm, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
        let mut s = std::net::TcpStream::connect(fake.addr).unwrap();
        let body = body.to_string();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(&body);
        s.write_all(req.as_bytes()).unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let status = answer[9..12].parse().unwrap();
        let json = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, serde_json::from_str(json).unwrap_or(Value::Null))
    }

    #[test]
    fn anthropic_fake_rejects_broken_alternation_and_unpaired_tool_results() {
        let fake = FakeLlm::start(FakeProvider::Anthropic);
        fake.push_text("never reached");
        let h = [("anthropic-version", "2023-06-01")];
        let cases = [
            (
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
                "alternate",
            ),
            (json!([{"role": "assistant", "content": "a"}]), "alternate"),
            (json!([{"role": "system", "content": "a"}]), "alternate"),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": " "}]}]),
                "non-whitespace",
            ),
            (
                json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]),
                "tool_result",
            ),
        ];
        for (messages, why) in cases {
            let body = json!({"model": "m", "max_tokens": 10, "messages": messages});
            let (status, answer) = post(&fake, "/v1/messages", &h, &body);
            assert_eq!(status, 400, "{messages}");
            assert_eq!(answer["type"], "error");
            let text = answer["error"]["message"].as_str().unwrap();
            assert!(text.contains(why), "{messages}: {text}");
        }
        let ok = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let (status, _) = post(&fake, "/v1/messages", &[], &ok);
        assert_eq!(status, 400, "anthropic-version is required");
        let (status, answer) = post(&fake, "/v1/messages", &h, &ok);
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["content"][0]["text"], "never reached");
    }

    #[test]
    fn openai_fake_rejects_unpaired_tool_messages_and_object_arguments() {
        let fake = FakeLlm::start(FakeProvider::OpenAi);
        let cases = [
            (json!([{"role": "tool", "tool_call_id": "x", "content": "r"}]), "answers no earlier"),
            (
                json!([{"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]),
                "a string",
            ),
            (json!([{"role": "assistant", "content": null}]), "null with tool_calls"),
            (json!([]), "non-empty"),
        ];
        for (messages, why) in cases {
            let body = json!({"model": "m", "messages": messages});
            let (status, answer) = post(&fake, "/v1/chat/completions", &[], &body);
            assert_eq!(status, 400, "{messages}");
            let text = answer["error"]["message"].as_str().unwrap();
            assert!(text.contains(why), "{messages}: {text}");
        }
        let (status, _) = post(&fake, "/chat/completions", &[], &json!({"model": "m"}));
        assert_eq!(status, 404, "the OpenAI path includes /v1");
        assert_eq!(fake.request_count(), 5);
    }
}
