//! `flock-llm`: the HTTP clients the supervisor's LLM gateway uses to reach model providers —
//! OpenAI-compatible chat completions (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp server, the
//! embedded `flock-model`) and Anthropic Messages — with per-attempt timeouts, retries with
//! backoff, and API keys that never reach a log line or an error message.
//!
//! It speaks the neutral types of [`flock_ipc::llm`] on one side and each provider's wire format on
//! the other. It holds no policy beyond one call: which endpoint an agent uses, token accounting
//! and cancellation of a turn belong to the gateway (cancel a call by dropping its future).

mod anthropic;
mod client;
mod error;
mod openai;
mod retry;
mod strict;

use std::fmt;
use std::time::Duration;

pub use client::{LlmClient, Retrying};
pub use error::LlmError;
pub use flock_ipc::llm::*;
pub use retry::{RetryPolicy, parse_retry_after, retry_delay};

/// An API key: never printed (`Debug` and `Display` show `***`), never in an error message
/// ([`LlmClient::complete`] scrubs it from provider texts that echo it).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }

    /// The key itself, for the one place that needs it: the request header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Which wire format an endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// `POST {base_url}/chat/completions` (OpenAI, OpenRouter, Ollama, vLLM, llama.cpp server).
    OpenAi,
    /// `POST {base_url}/v1/messages` (Anthropic Messages API).
    Anthropic,
}

impl ProviderKind {
    /// The name errors use.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "OpenAI-compatible endpoint",
            ProviderKind::Anthropic => "Anthropic",
        }
    }
}

/// One model behind one provider, and how to call it.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub kind: ProviderKind,
    /// OpenAI-compatible: up to and including the version segment (`https://api.openai.com/v1`,
    /// `http://127.0.0.1:11434/v1`); Anthropic: the host (`https://api.anthropic.com`; a trailing
    /// `/v1` is tolerated).
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer …` (OpenAI-compatible) or `x-api-key` (Anthropic); local
    /// servers usually need none.
    pub api_key: Option<Secret>,
    /// Per attempt: connecting, sending and reading the whole answer.
    pub timeout: Duration,
    pub max_tokens: u32,
    pub retry: RetryPolicy,
    /// Ask for the provider's strict tool mode (OpenAI `strict: true`, Anthropic strict tool
    /// use): the provider holds a call's arguments to the tool's schema. A server that refuses
    /// it (HTTP 400/422) is asked again without, and not asked again by this client.
    pub strict_tools: bool,
}

impl Endpoint {
    /// Default per-attempt timeout: generous, because a local model on two cores is slow.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    pub const DEFAULT_MAX_TOKENS: u32 = 4096;

    /// An endpoint without a key, with the default timeout, token limit and retry policy.
    pub fn new(kind: ProviderKind, base_url: impl Into<String>, model: impl Into<String>) -> Self {
        Endpoint {
            kind,
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            max_tokens: Self::DEFAULT_MAX_TOKENS,
            retry: RetryPolicy::default(),
            strict_tools: true,
        }
    }

    pub fn with_key(mut self, key: Secret) -> Self {
        self.api_key = Some(key);
        self
    }

    /// The URL a call is posted to.
    pub fn url(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        match self.kind {
            ProviderKind::OpenAi => format!("{base}/chat/completions"),
            // Accept a base URL with the version segment too (a common slip).
            ProviderKind::Anthropic => {
                format!("{}/v1/messages", base.strip_suffix("/v1").unwrap_or(base))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_and_endpoint_debug_hide_the_key() {
        let ep = Endpoint::new(ProviderKind::OpenAi, "http://h/v1", "m")
            .with_key(Secret::new("sk-very-secret"));
        assert!(!format!("{ep:?}").contains("very-secret"));
        assert_eq!(format!("{}", Secret::new("k")), "***");
        assert_eq!(format!("{:?}", Secret::new("k")), "***");
    }

    #[test]
    fn url_joins_base_and_path_without_double_slash() {
        let o = Endpoint::new(ProviderKind::OpenAi, "http://h:1/v1/", "m");
        assert_eq!(o.url(), "http://h:1/v1/chat/completions");
        for base in ["https://api.anthropic.com", "https://api.anthropic.com/v1/"] {
            let a = Endpoint::new(ProviderKind::Anthropic, base, "m");
            assert_eq!(a.url(), "https://api.anthropic.com/v1/messages");
        }
    }
}
