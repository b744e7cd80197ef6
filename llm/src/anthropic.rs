//! The Anthropic Messages wire format: neutral request → JSON body (one system text, content
//! blocks, strictly alternating roles), JSON answer → neutral response. No I/O here.

use serde_json::{Map, Value, json};

use crate::{ChatMsg, ChatRequest, ChatResponse, Endpoint, ToolCall};

/// The `anthropic-version` header this format follows.
pub(crate) const API_VERSION: &str = "2023-06-01";

/// The beta that strict tool use needs (sent only with strict tools).
pub(crate) const STRICT_BETA: &str = "structured-outputs-2025-11-13";

/// The body of `POST {base_url}/v1/messages`; `strict`: each tool whose schema has a strict
/// form is sent with `strict: true` and that form.
pub(crate) fn request_body(ep: &Endpoint, req: &ChatRequest, strict: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(ep.model));
    let limit = req.max_tokens.map_or(ep.max_tokens, |m| m.min(ep.max_tokens));
    body.insert("max_tokens".into(), json!(limit));
    // Anthropic takes one system text: every system message goes into it, in order.
    let system: Vec<&str> = req
        .messages
        .iter()
        .filter_map(|m| match m {
            ChatMsg::System { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages(&req.messages)));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| crate::strict::tool_object(t, "input_schema", strict))
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        if req.required {
            body.insert("tool_choice".into(), json!({"type": "any"}));
        }
    }
    Value::Object(body)
}

/// A tool's parameter schema, or an empty object schema when it has none (both providers want
/// an object schema; Anthropic rejects anything else).
pub(crate) fn object_schema(parameters: &Value) -> Value {
    match parameters {
        Value::Null => json!({"type": "object", "properties": {}}),
        p => p.clone(),
    }
}

/// The non-system messages as content blocks, consecutive messages of one role merged into one
/// (Anthropic requires user and assistant to alternate; tool results are user blocks).
fn messages(msgs: &[ChatMsg]) -> Vec<Value> {
    let mut out: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for msg in msgs {
        let (role, blocks) = match msg {
            ChatMsg::System { .. } => continue,
            ChatMsg::User { text } => ("user", vec![json!({"type": "text", "text": text})]),
            ChatMsg::Assistant { text, tool_calls } => {
                let mut blocks = Vec::new();
                // Anthropic rejects empty or whitespace-only text blocks.
                if let Some(t) = text.as_deref().filter(|t| !t.trim().is_empty()) {
                    blocks.push(json!({"type": "text", "text": t}));
                }
                for c in tool_calls {
                    blocks.push(json!({
                        "type": "tool_use",
                        "id": c.id,
                        "name": c.name,
                        "input": tool_input(&c.arguments),
                    }));
                }
                ("assistant", blocks)
            }
            ChatMsg::Tool { call_id, name: _, content } => (
                "user",
                vec![json!({"type": "tool_result", "tool_use_id": call_id, "content": content})],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => out.push((role, blocks)),
        }
    }
    out.into_iter().map(|(role, content)| json!({"role": role, "content": content})).collect()
}

/// A tool call's arguments as the object Anthropic requires; text that is not a JSON object is
/// kept, wrapped as `{"_raw": text}`, so the conversation stays valid and nothing is lost.
fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({"_raw": arguments}),
    }
}

/// Reads `content[]` blocks and `usage` from a 2xx answer; `Err` names what is missing.
pub(crate) fn parse_response(body: &Value) -> Result<ChatResponse, String> {
    let blocks =
        body.get("content").and_then(Value::as_array).ok_or("no `content` list in the answer")?;
    let mut texts = Vec::new();
    let mut tool_calls = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => {
                let t = block.get("text").and_then(Value::as_str);
                texts.push(t.ok_or(format!("`content[{i}]` is a text block without text"))?);
            }
            Some("tool_use") => {
                let field = |f: &str| {
                    block
                        .get(f)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or(format!("`content[{i}]` is a tool_use block without `{f}`"))
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                tool_calls.push(ToolCall {
                    id: field("id")?,
                    name: field("name")?,
                    arguments: input.to_string(),
                });
            }
            // thinking, redacted_thinking, server tool blocks…: nothing the agent acts on.
            _ => {}
        }
    }
    let texts: Vec<&str> = texts.into_iter().filter(|t| !t.is_empty()).collect();
    let usage = body.get("usage");
    let count = |field: &str| usage.and_then(|u| u.get(field)).and_then(Value::as_u64).unwrap_or(0);
    Ok(ChatResponse {
        text: (!texts.is_empty()).then(|| texts.join("\n")),
        tool_calls,
        tokens_in: count("input_tokens"),
        tokens_out: count("output_tokens"),
        // Anthropic's prompt cache reads (`cache_read_input_tokens`).
        tokens_cached: count("cache_read_input_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProviderKind;

    fn call(id: &str, args: &str) -> ToolCall {
        ToolCall { id: id.into(), name: "f".into(), arguments: args.into() }
    }

    #[test]
    fn consecutive_same_role_messages_merge_and_systems_join() {
        let ep = Endpoint::new(ProviderKind::Anthropic, "http://x", "claude");
        let req = ChatRequest {
            messages: vec![
                ChatMsg::System { text: "one".into() },
                ChatMsg::User { text: "hi".into() },
                ChatMsg::User { text: "again".into() },
                ChatMsg::System { text: "two".into() },
                ChatMsg::Assistant {
                    text: Some("  ".into()),
                    tool_calls: vec![call("a", r#"{"x":1}"#), call("b", "not json")],
                },
                ChatMsg::Tool { call_id: "a".into(), name: "f".into(), content: "r1".into() },
                ChatMsg::Tool { call_id: "b".into(), name: "f".into(), content: "r2".into() },
                ChatMsg::User { text: "and?".into() },
                ChatMsg::Assistant { text: None, tool_calls: vec![] },
            ],
            tools: vec![],
            ..Default::default()
        };
        assert_eq!(
            request_body(&ep, &req, false),
            json!({
                "model": "claude",
                "max_tokens": 4096,
                "system": "one\n\ntwo",
                "messages": [
                    {"role": "user", "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "text", "text": "again"},
                    ]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "a", "name": "f", "input": {"x": 1}},
                        {"type": "tool_use", "id": "b", "name": "f", "input": {"_raw": "not json"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "a", "content": "r1"},
                        {"type": "tool_result", "tool_use_id": "b", "content": "r2"},
                        {"type": "text", "text": "and?"},
                    ]},
                ],
            })
        );
    }

    #[test]
    fn non_object_arguments_are_wrapped_raw() {
        assert_eq!(tool_input("[1,2]"), json!({"_raw": "[1,2]"}));
        assert_eq!(tool_input(""), json!({"_raw": ""}));
    }

    #[test]
    fn answers_join_text_blocks_and_skip_unknown_blocks() {
        let r = parse_response(&json!({
            "content": [
                {"type": "thinking", "thinking": "hmm"},
                {"type": "text", "text": "a"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"k": "v"}},
                {"type": "text", "text": "b"},
            ],
            "usage": {"input_tokens": 5, "output_tokens": 2},
        }))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("a\nb"));
        assert_eq!(
            r.tool_calls,
            vec![ToolCall { id: "t1".into(), name: "f".into(), arguments: r#"{"k":"v"}"#.into() }]
        );
        assert_eq!((r.tokens_in, r.tokens_out), (5, 2));
        assert!(parse_response(&json!({"type": "message"})).is_err());
    }
}
