//! From a chat to model text and back: the ChatML prompt Qwen2.5 expects (tools described in the
//! system message, tool results as `<tool_response>` user turns), the JSON schema that constrains a
//! tool-using answer to `{"tool": …, "arguments": …}`, and the reading of that answer into a tool
//! call or a final text. No model and no I/O here.
//!
//! Why not the GGUF's own template: llama.cpp's `llama_chat_apply_template` (all `llama-cpp-2`
//! exposes) has no notion of tools, and the answer format here is not Qwen's `<tool_call>` but
//! the constrained object above, so we render ChatML ourselves, laid out like Qwen2.5's template.

use serde_json::{Map, Value, json};

/// The pseudo-tool a constrained model uses to answer in text.
pub const FINAL_ANSWER: &str = "final_answer";

/// The system text Qwen2.5's template uses when a chat has none.
const DEFAULT_SYSTEM: &str = "You are a helpful assistant.";

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments (an object schema).
    pub parameters: Value,
}

/// A tool call as it appears in the conversation; `arguments` is JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq)]
pub enum Msg {
    System(String),
    User(String),
    Assistant {
        text: Option<String>,
        calls: Vec<Call>,
    },
    /// A tool result (OpenAI role `tool`).
    Tool(String),
}

/// Which answers the constraint allows (OpenAI `tool_choice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// A tool call or a final answer.
    Auto,
    /// A tool call, no final answer.
    Required,
    /// Only this tool.
    Named(String),
    /// Plain text: tools are not offered.
    None,
}

/// What one request asks the model for.
#[derive(Debug, Clone, PartialEq)]
pub struct Chat {
    pub messages: Vec<Msg>,
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
}

impl Chat {
    /// Whether the answer is constrained to the tool-call object.
    pub fn constrained(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }

    /// Whether `final_answer` is our pseudo-tool (not one of the caller's tools, not excluded).
    fn offers_final_answer(&self) -> bool {
        self.choice == ToolChoice::Auto && !self.tools.iter().any(|t| t.name == FINAL_ANSWER)
    }
}

/// The ChatML prompt, ending with the open assistant turn.
pub fn render(chat: &Chat) -> String {
    let constrained = chat.constrained();
    let mut out = String::new();
    let mut rest = chat.messages.as_slice();
    let system = match rest.first() {
        Some(Msg::System(text)) => {
            rest = &rest[1..];
            text.as_str()
        }
        _ => DEFAULT_SYSTEM,
    };
    out.push_str("<|im_start|>system\n");
    out.push_str(system);
    if constrained {
        out.push_str(&tools_section(chat));
    }
    out.push_str("<|im_end|>\n");
    let mut in_tool_results = false;
    for msg in rest {
        if in_tool_results && !matches!(msg, Msg::Tool(_)) {
            out.push_str("<|im_end|>\n");
            in_tool_results = false;
        }
        match msg {
            // Later system messages stay in place, as their own turn (none is dropped).
            Msg::System(text) => turn(&mut out, "system", text),
            Msg::User(text) => turn(&mut out, "user", text),
            Msg::Assistant { text, calls } => {
                let body = if calls.is_empty() {
                    let text = text.as_deref().unwrap_or("");
                    // In the constrained format a text answer was a `final_answer` call: show it
                    // the way the model wrote it, so the prompt extends what is in the KV cache.
                    if constrained && chat.offers_final_answer() {
                        answer_json(FINAL_ANSWER, &json!({ "text": text }))
                    } else {
                        text.to_string()
                    }
                } else {
                    let lines: Vec<String> = calls
                        .iter()
                        .map(|c| match serde_json::from_str::<Value>(&c.arguments) {
                            Ok(args) => answer_json(&c.name, &args),
                            // Malformed arguments are shown as they were (the agent fed the error
                            // back as a tool result, which follows).
                            Err(_) => format!(
                                "{{\"tool\": {}, \"arguments\": {}}}",
                                Value::String(c.name.clone()),
                                c.arguments
                            ),
                        })
                        .collect();
                    lines.join("\n")
                };
                turn(&mut out, "assistant", &body);
            }
            Msg::Tool(content) => {
                // Consecutive results share one user turn, as in Qwen2.5's template.
                if !in_tool_results {
                    out.push_str("<|im_start|>user");
                    in_tool_results = true;
                }
                out.push_str("\n<tool_response>\n");
                out.push_str(content);
                out.push_str("\n</tool_response>");
            }
        }
    }
    if in_tool_results {
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

/// The prompt's parts whose token counts are logged: `system` (the first system message: rules
/// and catalog), `tools` (the tool list and answer format), `context` (later system messages:
/// memory, hints, time), `history` (earlier turns) and `turn` (the last user message and what
/// followed it). Texts only; the chat template's few tokens per message are not counted.
pub fn parts(chat: &Chat) -> Vec<(&'static str, String)> {
    let text = |m: &Msg| match m {
        Msg::System(t) | Msg::User(t) | Msg::Tool(t) => t.clone(),
        Msg::Assistant { text, calls } => {
            let calls: Vec<String> =
                calls.iter().map(|c| format!("{} {}", c.name, c.arguments)).collect();
            format!("{}{}", text.clone().unwrap_or_default(), calls.join("\n"))
        }
    };
    let (first, rest) = match chat.messages.split_first() {
        Some((Msg::System(t), rest)) => (t.clone(), rest),
        _ => (String::new(), chat.messages.as_slice()),
    };
    let last_user = rest.iter().rposition(|m| matches!(m, Msg::User(_))).unwrap_or(rest.len());
    let mut context = String::new();
    let mut history = String::new();
    let mut turn = String::new();
    for (i, m) in rest.iter().enumerate() {
        let into = match m {
            Msg::System(_) => &mut context,
            _ if i < last_user => &mut history,
            _ => &mut turn,
        };
        into.push_str(&text(m));
        into.push('\n');
    }
    let tools = if chat.constrained() { tools_section(chat) } else { String::new() };
    vec![
        ("system", first),
        ("tools", tools),
        ("context", context),
        ("history", history),
        ("turn", turn),
    ]
}

fn turn(out: &mut String, role: &str, text: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(text);
    out.push_str("<|im_end|>\n");
}

/// The tool list, the answer format and two few-shot examples (a call and a final answer),
/// appended to the system text.
fn tools_section(chat: &Chat) -> String {
    let offered: Vec<&Tool> = offered_tools(chat);
    let mut s = String::from(
        "\n\n# Tools\n\nYou may call one of these functions. Their signatures are within \
         <tools></tools> XML tags:\n<tools>",
    );
    for t in &offered {
        s.push('\n');
        s.push_str(&spaced_json(&json!({
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        })));
    }
    s.push_str(
        "\n</tools>\n\n# Answer format\n\nReply with exactly one JSON object and nothing else.\n",
    );
    s.push_str(
        "To call a function: {\"tool\": <function-name>, \"arguments\": <args-json-object>}\n",
    );
    if chat.offers_final_answer() {
        s.push_str(
            "To answer in words, when no function is needed or the work is done: \
             {\"tool\": \"final_answer\", \"arguments\": {\"text\": <your answer>}}\n",
        );
    }
    // Two few-shot examples: a call of the first offered tool and a final answer. A 0.5B model
    // copies examples closely, so they read like real requests and answers.
    if let Some(first) = offered.first() {
        let args = example_arguments(&first.parameters);
        let recipient = args.as_object().and_then(|a| {
            a.iter().find_map(|(k, v)| {
                let enumerated =
                    first.parameters.pointer(&format!("/properties/{k}/enum")).is_some();
                enumerated.then(|| v.as_str()).flatten()
            })
        });
        let request = match recipient {
            Some(who) => format!("Ask {who} to check the build."),
            None => "Please check the build.".to_string(),
        };
        s.push_str("\n# Examples\n\nUser: ");
        s.push_str(&request);
        s.push_str("\nAssistant: ");
        s.push_str(&answer_json(&first.name, &args));
        s.push('\n');
        if chat.offers_final_answer() {
            s.push_str("\nUser: Which time zone do we use?\nAssistant: ");
            s.push_str(&answer_json(FINAL_ANSWER, &json!({"text": "We use UTC."})));
            s.push('\n');
        }
    }
    s
}

fn offered_tools(chat: &Chat) -> Vec<&Tool> {
    match &chat.choice {
        ToolChoice::Named(name) => chat.tools.iter().filter(|t| &t.name == name).collect(),
        _ => chat.tools.iter().collect(),
    }
}

/// Plausible arguments for an example call (required properties, or all when none are marked
/// required): the first enum value, an instruction for text-like fields, 1, true, [] or {}.
fn example_arguments(schema: &Value) -> Value {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return json!({});
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Map::new();
    for (name, prop) in props {
        if !required.is_empty() && !required.contains(&name.as_str()) {
            continue;
        }
        let value = if let Some(first) = prop.get("enum").and_then(|e| e.get(0)) {
            first.clone()
        } else if let Some(c) = prop.get("const") {
            c.clone()
        } else {
            match prop.get("type").and_then(Value::as_str) {
                Some("integer" | "number") => json!(1),
                Some("boolean") => json!(true),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => json!(example_text(name)),
            }
        };
        out.insert(name.clone(), value);
    }
    Value::Object(out)
}

fn example_text(property: &str) -> &'static str {
    match property {
        "channel" | "channel_id" => "general",
        "path" | "file" | "filename" => "notes.md",
        "query" | "q" | "search" => "build status",
        "name" | "id" | "agent" | "to" | "recipient" => "worker-1",
        "url" => "https://example.com",
        _ => "Please check the build and report back.",
    }
}

/// `{"tool": name, "arguments": args}` exactly as the constrained model writes it.
pub fn answer_json(name: &str, arguments: &Value) -> String {
    format!(
        "{{\"tool\": {}, \"arguments\": {}}}",
        Value::String(name.into()),
        spaced_json(arguments)
    )
}

/// JSON with `", "` and `": "` separators (Python's `json.dumps` style, which Qwen saw in
/// training and which the grammar enforces), keys in their given order.
pub fn spaced_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::String(k.clone()), spaced_json(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Array(a) => {
            let parts: Vec<String> = a.iter().map(spaced_json).collect();
            format!("[{}]", parts.join(", "))
        }
        other => other.to_string(),
    }
}

/// The JSON schema the answer must match: one `anyOf` branch per offered tool, `"tool"` first
/// (the model picks the tool before it writes arguments), each branch with that tool's own
/// argument schema (enums of recipients or channels kept), plus `final_answer` when allowed.
/// Separators are fixed and free whitespace is off, so the output is compact and cannot loop on
/// blanks.
pub fn answer_schema(chat: &Chat) -> Value {
    answer_schema_with(chat, |t| closed_object(&t.parameters))
}

/// [`answer_schema`] with every tool's arguments loosened to any object: the fallback when a
/// caller's argument schema uses something the grammar compiler does not support.
pub fn loose_answer_schema(chat: &Chat) -> Value {
    answer_schema_with(chat, |_| json!({"type": "object"}))
}

fn answer_schema_with(chat: &Chat, arguments: impl Fn(&Tool) -> Value) -> Value {
    let mut branches: Vec<Value> =
        offered_tools(chat).into_iter().map(|t| branch(&t.name, arguments(t))).collect();
    if chat.offers_final_answer() {
        branches.push(branch(
            FINAL_ANSWER,
            json!({
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": false,
            }),
        ));
    }
    json!({
        "anyOf": branches,
        "x-guidance": {
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        },
    })
}

fn branch(name: &str, arguments: Value) -> Value {
    // Key order matters: `"tool"` must come before `"arguments"` (serde_json's `preserve_order`,
    // which llguidance turns on for the whole build, keeps this insertion order).
    json!({
        "type": "object",
        "properties": {
            "tool": {"const": name},
            "arguments": arguments,
        },
        "required": ["tool", "arguments"],
        "additionalProperties": false,
    })
}

/// A tool's argument schema as an object schema that admits no properties beyond those listed
/// (a small model otherwise invents some), unless the schema says otherwise.
fn closed_object(parameters: &Value) -> Value {
    match parameters {
        Value::Object(m) => {
            let mut m = m.clone();
            if !m.contains_key("type") && !m.contains_key("anyOf") && !m.contains_key("oneOf") {
                m.insert("type".into(), json!("object"));
            }
            if m.get("type") == Some(&json!("object")) && !m.contains_key("additionalProperties") {
                m.insert("additionalProperties".into(), json!(false));
            }
            Value::Object(m)
        }
        _ => json!({"type": "object", "properties": {}, "additionalProperties": false}),
    }
}

/// What a constrained answer meant.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Call(Call),
    Text(String),
}

/// Reads the model's constrained output; `None` when it is not the expected object (cut off by
/// the token limit, or a grammar failure): the caller then returns the raw text.
pub fn read_answer(chat: &Chat, output: &str) -> Option<Answer> {
    let Value::Object(mut obj) = serde_json::from_str::<Value>(output.trim()).ok()? else {
        return None;
    };
    let name = obj.get("tool")?.as_str()?.to_string();
    let arguments = obj.remove("arguments").unwrap_or_else(|| json!({}));
    if name == FINAL_ANSWER && chat.offers_final_answer() {
        let text = match arguments.get("text") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        return Some(Answer::Text(text));
    }
    Some(Answer::Call(Call { name, arguments: arguments.to_string() }))
}

/// Why an answer written without the grammar is not a call the caller can run, if it is not:
/// not the `{"tool", "arguments"}` object, a tool not offered, words where a call was required,
/// or arguments that break the tool's schema (a required one missing, one not in the schema,
/// a value outside its enum or of the wrong type). An answer in plain words is not a call and
/// is fine where words are allowed.
pub fn malformed(chat: &Chat, output: &str) -> Option<String> {
    let words_allowed = chat.offers_final_answer();
    let text = output.trim();
    if !text.starts_with('{') {
        return (!words_allowed).then(|| "words where a tool call was required".to_owned());
    }
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Some("not valid JSON".into());
    };
    let Some(name) = value.get("tool").and_then(Value::as_str) else {
        return Some("no \"tool\" name".into());
    };
    if name == FINAL_ANSWER && words_allowed {
        return None;
    }
    let offered = offered_tools(chat);
    let Some(tool) = offered.iter().find(|t| t.name == name) else {
        return Some(format!("calls `{name}`, which is not offered"));
    };
    let arguments = value.get("arguments").cloned().unwrap_or(json!({}));
    argument_error(&tool.parameters, &arguments).map(|e| format!("`{name}`: {e}"))
}

/// The first way `arguments` break a tool's (top-level) argument schema.
fn argument_error(schema: &Value, arguments: &Value) -> Option<String> {
    let Value::Object(args) = arguments else {
        return Some("arguments are not an object".into());
    };
    let props = schema.get("properties").and_then(Value::as_object);
    for key in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
        if let Some(key) = key.as_str()
            && !args.contains_key(key)
        {
            return Some(format!("`{key}` is missing"));
        }
    }
    for (key, v) in args {
        let Some(prop) = props.and_then(|p| p.get(key)) else {
            return Some(format!("`{key}` is not an argument"));
        };
        if let Some(allowed) = prop.get("enum").and_then(Value::as_array)
            && !allowed.contains(v)
        {
            return Some(format!("`{key}` is {v}, not one of {}", Value::Array(allowed.clone())));
        }
        let fits = match prop.get("type").and_then(Value::as_str) {
            Some("string") => v.is_string(),
            Some("integer") => v.is_i64() || v.is_u64(),
            Some("number") => v.is_number(),
            Some("boolean") => v.is_boolean(),
            Some("array") => v.is_array(),
            Some("object") => v.is_object(),
            _ => true,
        };
        if !fits {
            return Some(format!("`{key}` is {v}, not of type {}", prop["type"]));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        vec![
            Tool {
                name: "agents__send".into(),
                description: "Send a message to an agent.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "to": {"type": "string", "enum": ["worker-1", "worker-2"]},
                        "text": {"type": "string"},
                    },
                    "required": ["to", "text"],
                }),
            },
            Tool { name: "noop".into(), description: "Nothing.".into(), parameters: Value::Null },
        ]
    }

    fn chat(messages: Vec<Msg>, choice: ToolChoice) -> Chat {
        Chat { messages, tools: tools(), choice }
    }

    #[test]
    fn plain_chat_renders_chatml_with_every_system_message_in_place() {
        let c = Chat {
            messages: vec![
                Msg::System("Be brief.".into()),
                Msg::User("hi".into()),
                Msg::Assistant { text: Some("hello".into()), calls: vec![] },
                Msg::System("Now in French.".into()),
                Msg::User("again".into()),
            ],
            tools: vec![],
            choice: ToolChoice::Auto,
        };
        assert_eq!(
            render(&c),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n\
             <|im_start|>assistant\nhello<|im_end|>\n<|im_start|>system\nNow in French.<|im_end|>\n\
             <|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tools_go_into_the_system_turn_with_two_examples() {
        let p = render(&chat(vec![Msg::User("go".into())], ToolChoice::Auto));
        assert!(
            p.starts_with("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools"),
            "{p}"
        );
        assert!(p.contains(r#"{"type": "function", "function": {"name": "agents__send""#), "{p}");
        assert!(
            p.contains(
                "User: Ask worker-1 to check the build.\nAssistant: {\"tool\": \"agents__send\", \"arguments\": {\"to\": \"worker-1\", \"text\": \"Please check the build and report back.\"}}"
            ),
            "{p}"
        );
        assert!(p.contains(r#"{"tool": "final_answer", "arguments": {"text": "#), "{p}");
        assert!(p.ends_with("<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"), "{p}");
    }

    #[test]
    fn history_renders_calls_as_the_model_writes_them_and_groups_tool_results() {
        let p = render(&chat(
            vec![
                Msg::User("go".into()),
                Msg::Assistant {
                    text: None,
                    calls: vec![Call {
                        name: "agents__send".into(),
                        arguments: r#"{"to":"worker-1","text":"hi"}"#.into(),
                    }],
                },
                Msg::Tool("sent".into()),
                Msg::Tool("also".into()),
                Msg::Assistant { text: Some("done".into()), calls: vec![] },
            ],
            ToolChoice::Auto,
        ));
        assert!(p.ends_with(
            "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n\
             {\"tool\": \"agents__send\", \"arguments\": {\"to\": \"worker-1\", \"text\": \"hi\"}}<|im_end|>\n\
             <|im_start|>user\n<tool_response>\nsent\n</tool_response>\n<tool_response>\nalso\n</tool_response><|im_end|>\n\
             <|im_start|>assistant\n{\"tool\": \"final_answer\", \"arguments\": {\"text\": \"done\"}}<|im_end|>\n\
             <|im_start|>assistant\n"
        ), "{p}");
    }

    #[test]
    fn schema_puts_tool_first_keeps_enums_and_closes_argument_objects() {
        let s = answer_schema(&chat(vec![], ToolChoice::Auto));
        let text = s.to_string();
        let first = &s["anyOf"][0];
        let keys: Vec<&String> = first["properties"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["tool", "arguments"], "{text}");
        assert_eq!(first["properties"]["tool"]["const"], "agents__send");
        assert_eq!(
            first["properties"]["arguments"]["properties"]["to"]["enum"],
            json!(["worker-1", "worker-2"])
        );
        assert_eq!(first["properties"]["arguments"]["additionalProperties"], false);
        assert_eq!(s["anyOf"][1]["properties"]["arguments"]["type"], "object");
        assert_eq!(s["anyOf"][2]["properties"]["tool"]["const"], FINAL_ANSWER);
        assert_eq!(s["anyOf"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn tool_choice_narrows_the_schema() {
        let required = answer_schema(&chat(vec![], ToolChoice::Required));
        assert_eq!(required["anyOf"].as_array().unwrap().len(), 2);
        let named = answer_schema(&chat(vec![], ToolChoice::Named("noop".into())));
        assert_eq!(named["anyOf"].as_array().unwrap().len(), 1);
        assert_eq!(named["anyOf"][0]["properties"]["tool"]["const"], "noop");
        assert!(!chat(vec![], ToolChoice::None).constrained());
    }

    #[test]
    fn answers_are_read_back_as_calls_or_text() {
        let c = chat(vec![], ToolChoice::Auto);
        assert_eq!(
            read_answer(
                &c,
                r#"{"tool": "agents__send", "arguments": {"to": "worker-1", "text": "x"}}"#
            ),
            Some(Answer::Call(Call {
                name: "agents__send".into(),
                arguments: r#"{"to":"worker-1","text":"x"}"#.into()
            }))
        );
        assert_eq!(
            read_answer(&c, r#"{"tool": "final_answer", "arguments": {"text": "ok"}}"#),
            Some(Answer::Text("ok".into()))
        );
        assert_eq!(read_answer(&c, r#"{"tool": "agents__send", "argu"#), None);
    }

    #[test]
    fn spaced_json_matches_python_style() {
        assert_eq!(
            spaced_json(&json!({"a": [1, {"b": "c"}], "d": {}})),
            r#"{"a": [1, {"b": "c"}], "d": {}}"#
        );
    }

    #[test]
    fn an_answer_without_the_grammar_is_malformed_when_the_caller_could_not_run_it() {
        let auto = chat(vec![], ToolChoice::Auto);
        let call = |s: &str| malformed(&auto, s);
        assert_eq!(call("Sure, here you are."), None);
        assert_eq!(call(r#"{"tool": "final_answer", "arguments": {"text": "hi"}}"#), None);
        assert_eq!(
            call(r#"{"tool": "agents__send", "arguments": {"to": "worker-1", "text": "x"}}"#),
            None
        );
        assert_eq!(
            call(r#"{"tool": "agents__send", "arguments": {"to": "worker-1""#).unwrap(),
            "not valid JSON"
        );
        assert_eq!(
            call(r#"{"tool": "rm_rf", "arguments": {}}"#).unwrap(),
            "calls `rm_rf`, which is not offered"
        );
        assert_eq!(
            call(r#"{"tool": "agents__send", "arguments": {"to": "worker-9", "text": "x"}}"#)
                .unwrap(),
            r#"`agents__send`: `to` is "worker-9", not one of ["worker-1","worker-2"]"#
        );
        assert_eq!(
            call(r#"{"tool": "agents__send", "arguments": {"to": "worker-1"}}"#).unwrap(),
            "`agents__send`: `text` is missing"
        );
        assert_eq!(
            call(r#"{"tool": "agents__send", "arguments": {"to": "worker-1", "text": 3}}"#)
                .unwrap(),
            "`agents__send`: `text` is 3, not of type \"string\""
        );
        let required = chat(vec![], ToolChoice::Required);
        assert_eq!(malformed(&required, "done").unwrap(), "words where a tool call was required");
        assert!(
            malformed(&required, r#"{"tool": "final_answer", "arguments": {"text": "x"}}"#)
                .is_some()
        );
    }
}
