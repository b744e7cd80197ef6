//! The model behind an agent's turns. [`LlmProvider`] is the seam: this issue ships the
//! `scripted` provider (a deterministic transcript), real providers come through the gateway.

use std::time::Duration;

use flock_config::{Matcher, ScriptRule, ScriptStep, Transcript};
pub use flock_ipc::llm::{ToolCall, ToolDef};
use serde_json::Value;

/// One message of a turn's conversation (stored in sessions as JSON).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMessage {
    System {
        text: String,
    },
    User {
        from: String,
        text: String,
        /// When it arrived (Unix ms), shown to the model with `date_helper`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<u64>,
    },
    /// A tool call the model made.
    ToolCall {
        #[serde(default)]
        id: String,
        name: String,
        arguments: String,
    },
    /// The result fed back to the model (`ok == false` for errors, which are data, not `Err`).
    ToolResult {
        #[serde(default)]
        call_id: String,
        name: String,
        ok: bool,
        content: String,
    },
    Assistant {
        text: String,
    },
}

/// What the model wants next.
#[derive(Debug, Clone, PartialEq)]
pub enum LlmStep {
    /// Call these tools, then ask again with their results appended.
    ToolCalls(Vec<ToolCall>),
    /// The turn's final answer.
    Final(String),
}

/// A model. `next` sees the whole conversation so far and the tools offered for this step (none:
/// answer in text), and returns the next step; `required`: it must call one of the tools.
pub trait LlmProvider {
    fn next(
        &mut self,
        conversation: &[ChatMessage],
        tools: &[ToolDef],
        required: bool,
    ) -> impl std::future::Future<Output = Result<LlmStep, String>>;
}

/// Replays a transcript: the first rule matching the turn's input runs its steps in order.
#[derive(Debug, Clone)]
pub struct ScriptedProvider {
    transcript: Transcript,
}

impl ScriptedProvider {
    pub fn new(transcript: Transcript) -> Self {
        ScriptedProvider { transcript }
    }

    fn rule(&self, input: &str) -> Option<&ScriptRule> {
        self.transcript.rule_for(input)
    }
}

/// Replaces `{input}` and `{from}` in a template.
pub fn fill(template: &str, input: &str, from: &str) -> String {
    template.replace("{input}", input).replace("{from}", from)
}

/// Replaces placeholders inside every string of a JSON document (so the input is escaped
/// correctly wherever it lands).
pub fn fill_json(arguments: &str, input: &str, from: &str) -> String {
    fn walk(v: &mut Value, input: &str, from: &str) {
        match v {
            Value::String(s) => *s = fill(s, input, from),
            Value::Array(items) => items.iter_mut().for_each(|i| walk(i, input, from)),
            Value::Object(map) => map.values_mut().for_each(|i| walk(i, input, from)),
            _ => {}
        }
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(mut v) => {
            walk(&mut v, input, from);
            v.to_string()
        }
        Err(_) => arguments.to_owned(),
    }
}

impl LlmProvider for ScriptedProvider {
    /// A transcript plays its rule whatever tools are offered (it stands for a model that
    /// knows what it wants; the router and the channels actor still check every call).
    async fn next(
        &mut self,
        conversation: &[ChatMessage],
        _tools: &[ToolDef],
        _required: bool,
    ) -> Result<LlmStep, String> {
        let (from, input) = conversation
            .iter()
            .rev()
            .find_map(|m| match m {
                ChatMessage::User { from, text, .. } => Some((from.as_str(), text.as_str())),
                _ => None,
            })
            .ok_or("the conversation has no input")?;
        // Steps already taken in this turn = its own tool calls since the input (the calls the
        // runtime makes itself at a protocol step are not the transcript's).
        let done = conversation
            .iter()
            .rev()
            .take_while(|m| !matches!(m, ChatMessage::User { .. }))
            .filter(|m| {
                matches!(m, ChatMessage::ToolCall { id, .. } if !id.starts_with(crate::turn::RUNTIME_CALL))
            })
            .count();
        // A note that sent the last answer back (a rewrite request) is answered by the first
        // rule that names it (`match`/`equals`); otherwise the input's rule plays again.
        let note = match conversation {
            [.., ChatMessage::Assistant { .. }, ChatMessage::System { text }] => Some(text),
            _ => None,
        };
        let for_note = note.and_then(|n| {
            self.transcript.rules.iter().find(|r| r.matcher != Matcher::Any && r.matcher.matches(n))
        });
        let Some(rule) = for_note.or_else(|| self.rule(input)) else {
            return Ok(LlmStep::Final(format!("(no scripted rule matches: {input})")));
        };
        let mut tools_seen = 0;
        for step in &rule.steps {
            match step {
                ScriptStep::DelayMs(ms) => {
                    // Delays before a tool call already made were slept through earlier.
                    if tools_seen == done {
                        tokio::time::sleep(Duration::from_millis(*ms)).await;
                    }
                }
                ScriptStep::Tool { name, arguments } => {
                    if tools_seen == done {
                        let args = fill_json(arguments, input, from);
                        let id = format!("call_{done}");
                        return Ok(LlmStep::ToolCalls(vec![ToolCall {
                            id,
                            name: name.clone(),
                            arguments: args,
                        }]));
                    }
                    tools_seen += 1;
                }
            }
        }
        Ok(LlmStep::Final(fill(&rule.reply, input, from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript() -> Transcript {
        Transcript {
            rules: vec![
                ScriptRule {
                    matcher: Matcher::Contains("build".into()),
                    steps: vec![
                        ScriptStep::Tool {
                            name: "agents__send".into(),
                            arguments: r#"{"to":"w","text":"do {input}"}"#.into(),
                        },
                        ScriptStep::DelayMs(1),
                        ScriptStep::Tool { name: "agents__list".into(), arguments: "{}".into() },
                    ],
                    reply: "done {input} for {from}".into(),
                },
                ScriptRule { matcher: Matcher::Any, steps: vec![], reply: "ack".into() },
            ],
        }
    }

    #[tokio::test]
    async fn scripted_turn_emits_steps_in_order_then_the_reply() {
        let mut p = ScriptedProvider::new(transcript());
        let mut conv =
            vec![ChatMessage::User { from: "op".into(), text: "build \"x\"".into(), at: None }];
        let LlmStep::ToolCalls(calls) = p.next(&conv, &[], false).await.unwrap() else { panic!() };
        assert_eq!(calls[0].name, "agents__send");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args["text"], "do build \"x\"");
        conv.push(ChatMessage::ToolCall {
            id: calls[0].id.clone(),
            name: calls[0].name.clone(),
            arguments: calls[0].arguments.clone(),
        });
        conv.push(ChatMessage::ToolResult {
            call_id: calls[0].id.clone(),
            name: "agents__send".into(),
            ok: true,
            content: "ok".into(),
        });
        let LlmStep::ToolCalls(calls) = p.next(&conv, &[], false).await.unwrap() else { panic!() };
        assert_eq!(calls[0].name, "agents__list");
        conv.push(ChatMessage::ToolCall {
            id: calls[0].id.clone(),
            name: calls[0].name.clone(),
            arguments: calls[0].arguments.clone(),
        });
        assert_eq!(
            p.next(&conv, &[], false).await.unwrap(),
            LlmStep::Final("done build \"x\" for op".into())
        );
    }

    #[tokio::test]
    async fn unmatched_input_falls_through_to_the_catch_all() {
        let mut p = ScriptedProvider::new(transcript());
        let conv = vec![ChatMessage::User { from: "op".into(), text: "hello".into(), at: None }];
        assert_eq!(p.next(&conv, &[], false).await.unwrap(), LlmStep::Final("ack".into()));
    }

    #[tokio::test]
    async fn a_note_that_sends_the_answer_back_is_answered_by_the_rule_that_names_it() {
        let mut t = transcript();
        let rewrite = ScriptRule {
            matcher: Matcher::Contains("Write it again".into()),
            steps: vec![],
            reply: "shorter".into(),
        };
        t.rules.insert(0, rewrite);
        let mut p = ScriptedProvider::new(t);
        let mut conv =
            vec![ChatMessage::User { from: "op".into(), text: "hello".into(), at: None }];
        conv.push(ChatMessage::Assistant { text: "ack".into() });
        conv.push(ChatMessage::System { text: "[note] too long. Write it again".into() });
        assert_eq!(p.next(&conv, &[], false).await.unwrap(), LlmStep::Final("shorter".into()));
        // A note no rule names: the input's rule plays again (the catch-all does not take it).
        conv.pop();
        conv.push(ChatMessage::System { text: "[note] something else".into() });
        assert_eq!(p.next(&conv, &[], false).await.unwrap(), LlmStep::Final("ack".into()));
    }
}
