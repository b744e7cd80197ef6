//! The provider-neutral chat request and response an agent hands the LLM gateway. They travel as
//! JSON text inside `LlmCall`/`LlmResult` frames (not bincode: tool schemas are free-form JSON),
//! and `flock-llm` turns them into each provider's wire format.

use serde::{Deserialize, Serialize};

/// One model call: the conversation so far and the tools the model may call.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<ChatMsg>,
    pub tools: Vec<ToolDef>,
    /// Who the call is for (OpenAI's `user`); the gateway sets it to the agent's address for the
    /// embedded model, which keeps one KV-cache slot per agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// OpenAI's `service_tier`; the gateway sets `flex` for the embedded model's background
    /// work (the memory roles), which then waits behind the turns people wait for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// A shorter answer limit than the model's `max_tokens` (an observer writes one sentence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The model must call one of `tools` — no answer in words (OpenAI `tool_choice:
    /// "required"`, Anthropic `{"type": "any"}`): a step of a protocol the runtime walks the
    /// agent through, where the step *is* a tool call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub required: bool,
}

/// A message of the conversation, in the neutral form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatMsg {
    /// Instructions; every system message reaches the model (several are joined for providers
    /// that take one system text).
    System {
        text: String,
    },
    User {
        text: String,
    },
    /// What the model said before: text and/or the tool calls it made.
    Assistant {
        text: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    /// The result of tool call `call_id`.
    Tool {
        call_id: String,
        name: String,
        content: String,
    },
}

/// A tool the model may call: name, one-line description, JSON Schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

/// A tool call the model made; `arguments` is JSON text as the model wrote it (it may be
/// malformed: that is fed back to the model as a tool error, not raised).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// The model's answer.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatResponse {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Prompt tokens the provider served from its cache (OpenAI's `cached_tokens`; the embedded
    /// model's KV-cache slot).
    #[serde(default)]
    pub tokens_cached: u64,
}
