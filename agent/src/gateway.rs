//! `openai` and `anthropic` models, reached through the supervisor's LLM gateway: the agent sends
//! the conversation and its tool definitions in an `LlmCall` and gets the model's answer back. The
//! agent never sees an API key or a provider URL it could leak.

use flock_ipc::llm::{ChatMsg, ChatRequest, ChatResponse, ToolDef};
use flock_ipc::{Body, Frame, ROUTER};

use crate::client::RouterClient;
use crate::provider::{ChatMessage, LlmProvider, LlmStep};

#[derive(Debug)]
pub struct GatewayProvider {
    client: RouterClient,
    /// The longest answer this agent needs (`None`: the model's limit).
    max_tokens: Option<u32>,
}

impl GatewayProvider {
    pub fn new(client: RouterClient, role: flock_config::Role) -> Self {
        // An observation is one sentence: a model that goes on would hold the shared model
        // for tens of seconds.
        let max_tokens = (role == flock_config::Role::Observer).then_some(OBSERVATION_TOKENS);
        GatewayProvider { client, max_tokens }
    }
}

/// The answer limit of an observer's model call.
const OBSERVATION_TOKENS: u32 = 96;

/// The conversation in the provider-neutral form. Every system message is kept; who wrote a
/// user message is shown to the model (humans' messages take priority, and the model must know).
pub fn to_neutral(conversation: &[ChatMessage]) -> Vec<ChatMsg> {
    conversation
        .iter()
        .map(|m| match m {
            ChatMessage::System { text } => ChatMsg::System { text: text.clone() },
            ChatMessage::User { from, text, at: None } => {
                ChatMsg::User { text: format!("[from {from}] {text}") }
            }
            // The time of day on the input itself (`date_helper`), where a small model reads it
            // as part of the message instead of copying a timestamp line into its answer.
            ChatMessage::User { from, text, at: Some(ms) } => {
                let stamp = flock_ipc::time::format_timestamp(*ms);
                ChatMsg::User { text: format!("[from {from}, {} UTC] {text}", &stamp[11..16]) }
            }
            ChatMessage::ToolCall { id, name, arguments } => ChatMsg::Assistant {
                text: None,
                tool_calls: vec![flock_ipc::llm::ToolCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }],
            },
            ChatMessage::ToolResult { call_id, name, ok, content } => ChatMsg::Tool {
                call_id: call_id.clone(),
                name: name.clone(),
                content: if *ok { content.clone() } else { format!("ERROR {content}") },
            },
            ChatMessage::Assistant { text } => {
                ChatMsg::Assistant { text: Some(text.clone()), tool_calls: Vec::new() }
            }
        })
        .collect()
}

impl LlmProvider for GatewayProvider {
    async fn next(
        &mut self,
        conversation: &[ChatMessage],
        tools: &[ToolDef],
        required: bool,
    ) -> Result<LlmStep, String> {
        let request = ChatRequest {
            messages: to_neutral(conversation),
            tools: tools.to_vec(),
            max_tokens: self.max_tokens,
            required: required && !tools.is_empty(),
            ..Default::default()
        };
        let request = serde_json::to_string(&request).map_err(|e| e.to_string())?;
        let frame = Frame::new(&self.client.name, ROUTER, Body::LlmCall { request });
        match self.client.call(frame).await?.body {
            Body::LlmResult { ok: true, response } => {
                let r: ChatResponse = serde_json::from_str(&response)
                    .map_err(|e| format!("the gateway sent an unreadable answer: {e}"))?;
                tracing::info!(
                    tokens_in = r.tokens_in,
                    tokens_cached = r.tokens_cached,
                    tokens_out = r.tokens_out,
                    tools = tools.len(),
                    "  model: {} prompt tokens ({} cached, {} processed), {} generated, {} tools offered",
                    r.tokens_in,
                    r.tokens_cached,
                    r.tokens_in.saturating_sub(r.tokens_cached),
                    r.tokens_out,
                    tools.len()
                );
                if r.tool_calls.is_empty() {
                    Ok(LlmStep::Final(r.text.unwrap_or_default()))
                } else {
                    Ok(LlmStep::ToolCalls(r.tool_calls))
                }
            }
            Body::LlmResult { ok: false, response } => {
                Err(format!("model call failed: {response}"))
            }
            Body::Error { code, message } => Err(format!("model call failed: {code}: {message}")),
            other => Err(format!("unexpected {} answer to LlmCall", other.kind())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_kind_maps_and_system_messages_stay() {
        let conv = vec![
            ChatMessage::System { text: "be brief".into() },
            ChatMessage::System { text: "[unconscious_context] none".into() },
            ChatMessage::User { from: "human:alice".into(), text: "hi".into(), at: None },
            ChatMessage::User {
                from: "coordinator".into(),
                text: "plan".into(),
                at: Some(1_764_000_000_000),
            },
            ChatMessage::ToolCall {
                id: "c1".into(),
                name: "agents__list".into(),
                arguments: "{}".into(),
            },
            ChatMessage::ToolResult {
                call_id: "c1".into(),
                name: "agents__list".into(),
                ok: false,
                content: "BAD_REQUEST: x".into(),
            },
            ChatMessage::Assistant { text: "done".into() },
        ];
        let n = to_neutral(&conv);
        assert_eq!(n.iter().filter(|m| matches!(m, ChatMsg::System { .. })).count(), 2);
        assert_eq!(n[2], ChatMsg::User { text: "[from human:alice] hi".into() });
        assert_eq!(n[3], ChatMsg::User { text: "[from coordinator, 16:00 UTC] plan".into() });
        assert!(
            matches!(&n[5], ChatMsg::Tool { call_id, content, .. } if call_id == "c1" && content.starts_with("ERROR"))
        );
    }
}
