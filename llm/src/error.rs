//! Why a model call failed, worded for the person who has to fix it: what happened and what to
//! check. Never carries an API key: `LlmClient` scrubs every message before returning it.

use std::time::Duration;

/// Longest slice of a response body an error quotes.
pub(crate) const BODY_EXCERPT_CHARS: usize = 300;

/// A failed model call, after any retries.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// The provider answered with a non-2xx status. `message` is the provider's own error text when
    /// it sent one (else an excerpt of the body) plus a hint at what to check.
    #[error("HTTP {status} from {provider}: {message}")]
    Http { status: u16, provider: &'static str, message: String },
    /// No complete answer within the per-attempt timeout, on every attempt.
    #[error(
        "no answer from {provider} at {url} within {timeout:?} ({attempts} attempt(s)): check that \
         the server is up and the model is loaded, or raise the endpoint's timeout"
    )]
    Timeout { provider: &'static str, url: String, timeout: Duration, attempts: u32 },
    /// The provider answered 2xx with a body that is not the expected JSON (not retried: asking
    /// again rarely helps, and the body says what is wrong).
    #[error("malformed answer: {0}")]
    Malformed(String),
    /// The request never got an answer: bad URL, connection refused or reset, TLS failure.
    #[error("transport error: {0}")]
    Transport(String),
}

impl LlmError {
    /// Replaces every occurrence of `secret` in the error's texts by `***` (providers echo keys:
    /// "Incorrect API key provided: sk-…").
    pub(crate) fn scrub(self, secret: &str) -> Self {
        if secret.is_empty() {
            return self;
        }
        let clean = |s: String| if s.contains(secret) { s.replace(secret, "***") } else { s };
        match self {
            LlmError::Http { status, provider, message } => {
                LlmError::Http { status, provider, message: clean(message) }
            }
            LlmError::Timeout { provider, url, timeout, attempts } => {
                LlmError::Timeout { provider, url: clean(url), timeout, attempts }
            }
            LlmError::Malformed(m) => LlmError::Malformed(clean(m)),
            LlmError::Transport(m) => LlmError::Transport(clean(m)),
        }
    }

    /// Adds "(gave up after N attempts)" to a final error that followed retries.
    pub(crate) fn after_attempts(self, attempts: u32) -> Self {
        if attempts <= 1 {
            return self;
        }
        let note = format!(" (gave up after {attempts} attempts)");
        match self {
            LlmError::Http { status, provider, message } => {
                LlmError::Http { status, provider, message: message + &note }
            }
            LlmError::Transport(m) => LlmError::Transport(m + &note),
            LlmError::Malformed(m) => LlmError::Malformed(m + &note),
            timeout @ LlmError::Timeout { .. } => timeout,
        }
    }
}

/// At most [`BODY_EXCERPT_CHARS`] characters of `text`, marked when cut.
pub(crate) fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(BODY_EXCERPT_CHARS) {
        Some((cut, _)) => format!("{}… ({} bytes in all)", &text[..cut], text.len()),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_cuts_long_bodies_on_a_char_boundary() {
        let long = "é".repeat(1000);
        let e = excerpt(&long);
        assert!(e.starts_with(&"é".repeat(BODY_EXCERPT_CHARS)));
        assert!(e.ends_with("(2000 bytes in all)"), "{e}");
        assert_eq!(excerpt("  short \n"), "short");
    }

    #[test]
    fn scrub_removes_the_key_from_every_text() {
        let key = "sk-abc123";
        let e = LlmError::Http { status: 401, provider: "p", message: format!("bad key {key}") };
        let shown = format!("{} {:?}", e.scrub(key), LlmError::Transport(key.into()).scrub(key));
        assert!(!shown.contains(key), "{shown}");
        assert!(shown.contains("bad key ***"), "{shown}");
    }
}
