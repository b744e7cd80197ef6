//! The OpenAI chat-completions wire format as this server speaks it: request JSON → [`Chat`],
//! generated output → response JSON, and the error body. No I/O here.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::prompt::{Answer, Call, Chat, Msg, Tool, ToolChoice, read_answer};

/// The body of `POST /v1/chat/completions` (fields this server does not use are ignored).
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: Option<String>,
    pub messages: Vec<WireMessage>,
    #[serde(default)]
    pub tools: Option<Vec<WireTool>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub seed: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Who the request is for: requests with the same `user` share a KV-cache slot.
    #[serde(default)]
    pub user: Option<String>,
    /// `flex`: background work, served after every waiting request of another tier.
    #[serde(default)]
    pub service_tier: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct WireMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Value>,
    #[serde(default)]
    pub tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Debug, Deserialize)]
pub struct WireToolCall {
    pub function: WireFunctionCall,
}

#[derive(Debug, Deserialize)]
pub struct WireFunctionCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct WireTool {
    pub function: WireFunction,
}

#[derive(Debug, Deserialize)]
pub struct WireFunction {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

impl CompletionRequest {
    /// The token limit the caller asked for, if any.
    pub fn token_limit(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// The neutral chat; `Err` says what is wrong with the request (a 400).
    pub fn to_chat(&self) -> Result<Chat, String> {
        if self.stream == Some(true) {
            return Err("streaming is not supported by flock-model; send `stream: false`".into());
        }
        if self.messages.is_empty() {
            return Err("`messages` is empty".into());
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let text = content_text(m.content.as_ref())
                .map_err(|e| format!("`messages[{i}].content`: {e}"))?;
            let msg = match m.role.as_str() {
                "system" | "developer" => Msg::System(text.unwrap_or_default()),
                "user" => Msg::User(text.unwrap_or_default()),
                "assistant" => Msg::Assistant {
                    text,
                    calls: m
                        .tool_calls
                        .iter()
                        .flatten()
                        .map(|c| Call {
                            name: c.function.name.clone(),
                            arguments: match &c.function.arguments {
                                Some(Value::String(s)) => s.clone(),
                                None | Some(Value::Null) => "{}".into(),
                                Some(v) => v.to_string(),
                            },
                        })
                        .collect(),
                },
                "tool" | "function" => Msg::Tool(text.unwrap_or_default()),
                other => return Err(format!("`messages[{i}].role` `{other}` is not known")),
            };
            messages.push(msg);
        }
        let tools: Vec<Tool> = self
            .tools
            .iter()
            .flatten()
            .map(|t| Tool {
                name: t.function.name.clone(),
                description: t.function.description.clone().unwrap_or_default(),
                parameters: t.function.parameters.clone().unwrap_or(Value::Null),
            })
            .collect();
        let choice = match &self.tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                "none" => ToolChoice::None,
                other => return Err(format!("`tool_choice` `{other}` is not known")),
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if tools.iter().any(|t| t.name == name) => {
                    ToolChoice::Named(name.to_string())
                }
                Some(name) => return Err(format!("`tool_choice` names `{name}`, not a tool")),
                None => return Err(format!("`tool_choice` is not understood: {v}")),
            },
        };
        Ok(Chat { messages, tools, choice })
    }
}

/// Message content as text: a string, null, or a list of `{"type": "text", "text": …}` parts.
fn content_text(content: Option<&Value>) -> Result<Option<String>, String> {
    match content {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match p.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => return Err("only text parts are supported".into()),
                }
            }
            Ok(Some(text))
        }
        Some(other) => Err(format!("neither text nor a list of parts: {other}")),
    }
}

/// Why generation ended, as OpenAI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

/// 64 bits from the operating system's CSPRNG, for the ids of completions and tool calls: a
/// client must not be able to predict another's ids from its own (fastrand's are predictable).
fn random_u64() -> u64 {
    // getrandom on Linux: it blocks only until the kernel's pool is first seeded, at boot.
    getrandom::u64().expect("the operating system's random source failed")
}

/// The response body for one completion.
pub fn completion_response(
    chat: &Chat,
    model: &str,
    output: &str,
    finish: Finish,
    prompt_tokens: u32,
    completion_tokens: u32,
    cached_tokens: u32,
) -> Value {
    let answer = if chat.constrained() { read_answer(chat, output) } else { None };
    let (message, finish_reason) = match answer {
        Some(Answer::Call(call)) => (
            json!({
                "role": "assistant",
                "content": null,
                "tool_calls": [{
                    "id": format!("call_{:016x}", random_u64()),
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }],
            }),
            "tool_calls",
        ),
        // A text answer the engine closed early (its token limit, or a loop): marked as cut.
        Some(Answer::Text(text)) if finish == Finish::Length => {
            (json!({"role": "assistant", "content": format!("{} …", text.trim_end())}), "length")
        }
        Some(Answer::Text(text)) => (json!({"role": "assistant", "content": text}), "stop"),
        // A text-only request after tool calls: a small model may still write its answer in the
        // constrained form it saw in the history; the text is what it meant.
        None if !chat.constrained() && unconstrained_final(output).is_some() => {
            (json!({"role": "assistant", "content": unconstrained_final(output)}), "stop")
        }
        // A constrained text answer cut off by the token limit: the text so far.
        None if chat.constrained() && truncated_final(output).is_some() => {
            (json!({"role": "assistant", "content": truncated_final(output)}), "length")
        }
        // Plain generation, or a constrained call cut off by the token limit: the raw text.
        None => (
            json!({"role": "assistant", "content": output}),
            match finish {
                Finish::Stop => "stop",
                Finish::Length => "length",
            },
        ),
    };
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json!({
        "id": format!("chatcmpl-{:016x}", random_u64()),
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            // OpenAI's field for prompt tokens served from cache: here, the KV-cache slot.
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        },
    })
}

/// The text so far of a `final_answer` the token limit cut off mid-string.
fn truncated_final(output: &str) -> Option<String> {
    let prefix =
        format!("{{\"tool\": \"{}\", \"arguments\": {{\"text\": \"", crate::prompt::FINAL_ANSWER);
    let rest = output.trim_start().strip_prefix(&prefix)?;
    // Up to the closing quote if there is one, else all of it less a dangling escape.
    let mut end = rest.len();
    let mut escaped = false;
    for (i, c) in rest.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let mut body = &rest[..end];
    while body.ends_with('\\') && !body.ends_with("\\\\") {
        body = &body[..body.len() - 1];
    }
    let text: String = serde_json::from_str(&format!("\"{body}\"")).ok()?;
    (!text.trim().is_empty()).then(|| format!("{} …", text.trim_end()))
}

/// The text of `{"tool": "final_answer", "arguments": {"text": …}}` written without a schema.
fn unconstrained_final(output: &str) -> Option<String> {
    let v: Value = serde_json::from_str(output.trim()).ok()?;
    (v.get("tool")?.as_str()? == crate::prompt::FINAL_ANSWER)
        .then(|| v.pointer("/arguments/text")?.as_str().map(str::to_owned))
        .flatten()
}

/// An OpenAI-style error body.
pub fn error_body(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(v: Value) -> CompletionRequest {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_flock_llm_request_shape_is_understood() {
        let r = request(json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}],
            "max_tokens": 4096,
        }));
        let chat = r.to_chat().unwrap();
        assert_eq!(chat.messages[1], Msg::User("ab".into()));
        assert_eq!(
            chat.messages[2],
            Msg::Assistant {
                text: None,
                calls: vec![Call { name: "f".into(), arguments: r#"{"x":1}"#.into() }]
            }
        );
        assert_eq!(chat.messages[3], Msg::Tool("ok".into()));
        assert_eq!(chat.tools[0].name, "f");
        assert_eq!(chat.choice, ToolChoice::Auto);
        assert_eq!(r.token_limit(), Some(4096));
    }

    #[test]
    fn bad_requests_say_what_is_wrong() {
        let e = request(json!({"messages": [{"role": "wizard", "content": "x"}]})).to_chat();
        assert!(e.unwrap_err().contains("wizard"));
        let e = request(json!({"messages": [{"role": "user", "content": "x"}], "stream": true}));
        assert!(e.to_chat().unwrap_err().contains("stream"));
        let e = request(json!({"messages": [], "tool_choice": "auto"})).to_chat();
        assert!(e.unwrap_err().contains("empty"));
    }

    #[test]
    fn constrained_output_becomes_tool_calls_or_content() {
        let chat = request(json!({
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        }))
        .to_chat()
        .unwrap();
        let r = completion_response(
            &chat,
            "m",
            r#"{"tool": "f", "arguments": {"a": 1}}"#,
            Finish::Stop,
            10,
            5,
            0,
        );
        let msg = &r["choices"][0]["message"];
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(msg["tool_calls"][0]["function"]["arguments"], r#"{"a":1}"#);
        assert_eq!(msg["tool_calls"][0]["type"], "function");
        assert_eq!(r["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(r["usage"]["prompt_tokens"], 10);
        let r = completion_response(
            &chat,
            "m",
            r#"{"tool": "final_answer", "arguments": {"text": "hi"}}"#,
            Finish::Stop,
            1,
            1,
            0,
        );
        assert_eq!(r["choices"][0]["message"]["content"], "hi");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
        let r = completion_response(&chat, "m", r#"{"tool": "f", "argu"#, Finish::Length, 1, 1, 0);
        assert_eq!(r["choices"][0]["finish_reason"], "length");
        // A text answer cut off mid-string keeps what was written.
        let cut =
            r#"{"tool": "final_answer", "arguments": {"text": "1. Pack boxes\n2. Book the van\"#;
        let r = completion_response(&chat, "m", cut, Finish::Length, 1, 1, 0);
        assert_eq!(r["choices"][0]["message"]["content"], "1. Pack boxes\n2. Book the van …");
        // One the engine closed early is whole, and still marked as cut.
        let closed = r#"{"tool": "final_answer", "arguments": {"text": "1. Pack boxes"}}"#;
        let r = completion_response(&chat, "m", closed, Finish::Length, 1, 1, 0);
        assert_eq!(r["choices"][0]["message"]["content"], "1. Pack boxes …");
        assert_eq!(r["choices"][0]["finish_reason"], "length");
    }
}
