//! The OpenAI chat-completions wire format (also spoken by OpenRouter, Ollama, vLLM, the
//! llama.cpp server and `flock-model`): neutral request → JSON body, JSON answer → neutral
//! response. No I/O here.

use serde_json::{Map, Value, json};

use crate::{ChatMsg, ChatRequest, ChatResponse, Endpoint, ToolCall};

/// The body of `POST {base_url}/chat/completions`.
/// `strict`: each tool whose schema has a strict form is sent with `strict: true` and that form.
pub(crate) fn request_body(ep: &Endpoint, req: &ChatRequest, strict: bool) -> Value {
    let messages: Vec<Value> = req.messages.iter().map(message).collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(ep.model));
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        let tools = req
            .tools
            .iter()
            .map(|t| {
                let function = crate::strict::tool_object(t, "parameters", strict);
                json!({"type": "function", "function": function})
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
        if req.required {
            body.insert("tool_choice".into(), json!("required"));
        }
    }
    let limit = req.max_tokens.map_or(ep.max_tokens, |m| m.min(ep.max_tokens));
    body.insert("max_tokens".into(), json!(limit));
    if let Some(user) = &req.user {
        body.insert("user".into(), json!(user));
    }
    if let Some(tier) = &req.service_tier {
        body.insert("service_tier".into(), json!(tier));
    }
    Value::Object(body)
}

fn message(msg: &ChatMsg) -> Value {
    match msg {
        // Every system message goes out, in place: the runtime we replace dropped them.
        ChatMsg::System { text } => json!({"role": "system", "content": text}),
        ChatMsg::User { text } => json!({"role": "user", "content": text}),
        ChatMsg::Assistant { text, tool_calls } => {
            let mut m = Map::new();
            m.insert("role".into(), json!("assistant"));
            // Servers reject an assistant message with neither content nor tool calls.
            let content = match text {
                Some(t) => json!(t),
                None if tool_calls.is_empty() => json!(""),
                None => Value::Null,
            };
            m.insert("content".into(), content);
            if !tool_calls.is_empty() {
                let calls = tool_calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments},
                        })
                    })
                    .collect();
                m.insert("tool_calls".into(), Value::Array(calls));
            }
            Value::Object(m)
        }
        ChatMsg::Tool { call_id, name: _, content } => {
            json!({"role": "tool", "tool_call_id": call_id, "content": content})
        }
    }
}

/// Reads `choices[0].message` and `usage` from a 2xx answer; `Err` names what is missing.
pub(crate) fn parse_response(body: &Value) -> Result<ChatResponse, String> {
    let message = body
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .ok_or("no `choices[0].message` in the answer")?;
    let text = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // Some servers send content parts: [{"type": "text", "text": "…"}].
        Some(Value::Array(parts)) => {
            Some(parts.iter().filter_map(|p| p.get("text")?.as_str()).collect::<String>())
        }
        Some(other) => return Err(format!("`message.content` is neither text nor null: {other}")),
    }
    .filter(|t| !t.is_empty());
    let mut tool_calls = Vec::new();
    match message.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            for (i, call) in calls.iter().enumerate() {
                tool_calls.push(tool_call(call).map_err(|e| format!("`tool_calls[{i}]`: {e}"))?);
            }
        }
        Some(other) => return Err(format!("`message.tool_calls` is not a list: {other}")),
    }
    let usage = body.get("usage");
    let count = |field: &str| usage.and_then(|u| u.get(field)).and_then(Value::as_u64).unwrap_or(0);
    let cached = usage
        .and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Ok(ChatResponse {
        text,
        tool_calls,
        tokens_in: count("prompt_tokens"),
        tokens_out: count("completion_tokens"),
        tokens_cached: cached,
    })
}

fn tool_call(call: &Value) -> Result<ToolCall, String> {
    let function = call.get("function").ok_or("no `function`")?;
    let name = function.get("name").and_then(Value::as_str).ok_or("no `function.name`")?;
    let arguments = match function.get("arguments") {
        Some(Value::String(s)) => s.clone(),
        // Some servers (Ollama among them) send the arguments as an object, not as text.
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.to_string(),
        None | Some(Value::Null) => "{}".to_string(),
        Some(other) => other.to_string(),
    };
    // A few servers omit the id; the conversation still needs one to pair the tool result.
    let id = match call.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => format!("call_{:016x}", fastrand::u64(..)),
    };
    Ok(ToolCall { id, name: name.to_string(), arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ProviderKind, ToolDef};

    #[test]
    fn body_sends_every_system_message_and_omits_empty_parts() {
        let ep = Endpoint::new(ProviderKind::OpenAi, "http://x/v1", "m");
        let req = ChatRequest {
            messages: vec![
                ChatMsg::System { text: "a".into() },
                ChatMsg::User { text: "hi".into() },
                ChatMsg::System { text: "b".into() },
                ChatMsg::Assistant { text: None, tool_calls: vec![] },
            ],
            tools: vec![],
            ..Default::default()
        };
        assert_eq!(
            request_body(&ep, &req, false),
            json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": "a"},
                    {"role": "user", "content": "hi"},
                    {"role": "system", "content": "b"},
                    {"role": "assistant", "content": ""},
                ],
                "max_tokens": 4096,
            })
        );
        // A call's own limit narrows the endpoint's; the agent and the tier go out as given.
        let req = ChatRequest {
            user: Some("observer".into()),
            service_tier: Some("flex".into()),
            max_tokens: Some(96),
            ..req
        };
        let body = request_body(&ep, &req, false);
        assert_eq!(
            (body["max_tokens"].clone(), body["user"].clone()),
            (json!(96), json!("observer"))
        );
        assert_eq!(body["service_tier"], "flex");
    }

    #[test]
    fn tool_definitions_get_an_object_schema_even_without_parameters() {
        let ep = Endpoint::new(ProviderKind::OpenAi, "http://x/v1", "m");
        let req = ChatRequest {
            messages: vec![],
            tools: vec![ToolDef {
                name: "t".into(),
                description: "d".into(),
                parameters: Value::Null,
            }],
            ..Default::default()
        };
        let body = request_body(&ep, &req, false);
        assert_eq!(
            body["tools"][0]["function"]["parameters"],
            json!({"type": "object", "properties": {}})
        );
        assert!(body.get("tool_choice").is_none(), "{body}");
    }

    #[test]
    fn a_required_step_asks_for_a_tool_call_in_both_wire_formats() {
        let tool = ToolDef { name: "t".into(), description: "d".into(), parameters: Value::Null };
        let req = ChatRequest { tools: vec![tool], required: true, ..Default::default() };
        let openai = Endpoint::new(ProviderKind::OpenAi, "http://x/v1", "m");
        assert_eq!(request_body(&openai, &req, false)["tool_choice"], "required");
        let anthropic = Endpoint::new(ProviderKind::Anthropic, "http://x", "claude");
        let body = crate::anthropic::request_body(&anthropic, &req, false);
        assert_eq!(body["tool_choice"], json!({"type": "any"}));
        // Without tools there is nothing to require: no tool_choice at all.
        let bare = ChatRequest { required: true, ..Default::default() };
        assert!(request_body(&openai, &bare, false).get("tool_choice").is_none());
    }

    #[test]
    fn answers_accept_object_arguments_content_parts_and_missing_usage() {
        let r = parse_response(&json!({"choices": [{"message": {
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"x": 1}}}],
        }}]}))
        .unwrap();
        assert_eq!(r.text.as_deref(), Some("ab"));
        assert_eq!(r.tool_calls[0].arguments, r#"{"x":1}"#);
        assert_eq!((r.tokens_in, r.tokens_out), (0, 0));
    }

    #[test]
    fn answers_without_choices_are_errors() {
        assert!(parse_response(&json!({"id": "x"})).is_err());
        assert!(parse_response(&json!({"choices": []})).is_err());
        let e = parse_response(&json!({"choices": [{"message": {"tool_calls": [{"id": "c"}]}}]}));
        assert!(e.unwrap_err().contains("tool_calls[0]"));
    }
}
