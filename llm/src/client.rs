//! [`LlmClient`]: one pooled HTTP client that posts a chat request to an [`Endpoint`], retries
//! what is worth retrying, and turns every failure into an [`LlmError`] without the key in it.
//! The wire formats live in `openai.rs` and `anthropic.rs`; the backoff schedule in `retry.rs`.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, SystemTime};

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use serde_json::Value;

use crate::error::excerpt;
use crate::{
    ChatRequest, ChatResponse, Endpoint, LlmError, ProviderKind, anthropic, openai, retry_delay,
    strict,
};

/// Makes ring the process-wide rustls crypto provider, once (reqwest is built with
/// `rustls-no-provider`, so nothing else picks one; if another part of the process installed a
/// provider first, that one is kept).
fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _already_installed = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A retry about to happen, as told to [`LlmClient::complete_observed`]'s hook (for the
/// gateway's log: which attempt failed, why, and how long until the next).
#[derive(Debug)]
pub struct Retrying<'a> {
    /// The attempt that failed, 1-based.
    pub attempt: u32,
    /// The wait before the next attempt.
    pub delay: Duration,
    /// Why it failed (already scrubbed of the key).
    pub error: &'a LlmError,
}

/// Calls LLM providers. Holds one `reqwest::Client`, so connections are pooled and reused across
/// calls and endpoints; cloning is cheap and shares the pool.
#[derive(Debug, Clone)]
pub struct LlmClient {
    http: reqwest::Client,
    /// Endpoints (URL and model) that refused strict tools: asked without from then on.
    strict_refused: Arc<Mutex<HashSet<(String, String)>>>,
}

/// One failed attempt and whether another may follow.
struct Failure {
    error: LlmError,
    retry: bool,
    retry_after: Option<Duration>,
}

impl Failure {
    fn fatal(error: LlmError) -> Self {
        Failure { error, retry: false, retry_after: None }
    }
}

impl LlmClient {
    pub fn new() -> Result<Self, LlmError> {
        Self::build(reqwest::Client::builder())
    }

    /// A client whose every connection goes to the Unix socket at `path`, whatever the URL's
    /// host (the embedded model, served in the supervisor's private `run/` folder).
    pub fn over_unix_socket(path: &std::path::Path) -> Result<Self, LlmError> {
        Self::build(reqwest::Client::builder().unix_socket(path))
    }

    fn build(builder: reqwest::ClientBuilder) -> Result<Self, LlmError> {
        install_crypto_provider();
        let http =
            builder.user_agent(concat!("flock/", env!("CARGO_PKG_VERSION"))).build().map_err(
                |e| LlmError::Transport(format!("cannot build the HTTP client: {}", chain(&e))),
            )?;
        Ok(LlmClient { http, strict_refused: Arc::default() })
    }

    /// One chat completion with retries: 429 and 5xx (honouring a `retry-after` of seconds or an
    /// HTTP-date, or `retry-after-ms`, capped at `max_retry_after`), timeouts and connection
    /// errors are retried `ep.retry.retries` times with `base * 2^n` backoff ±jitter; other 4xx
    /// and malformed answers fail at once. Cancel by dropping the future (also mid-backoff).
    pub async fn complete(
        &self,
        ep: &Endpoint,
        req: &ChatRequest,
    ) -> Result<ChatResponse, LlmError> {
        self.complete_observed(ep, req, |_| {}).await
    }

    /// The model ids an OpenAI-compatible server lists (`GET {base_url}/models`, one attempt
    /// within `timeout`): what a person checks a server by before pointing a swarm at it.
    pub async fn list_models(
        &self,
        base_url: &str,
        timeout: Duration,
    ) -> Result<Vec<String>, LlmError> {
        let url = format!("{}/models", base_url.trim_end_matches('/'));
        let answer = self.http.get(&url).timeout(timeout).send().await.map_err(|e| {
            if e.is_timeout() {
                LlmError::Timeout { provider: "openai", url: url.clone(), timeout, attempts: 1 }
            } else {
                LlmError::Transport(format!("GET {url}: {}", chain(&e)))
            }
        })?;
        let status = answer.status().as_u16();
        let body = answer.text().await.map_err(|e| LlmError::Transport(chain(&e)))?;
        if status != 200 {
            let message = crate::error::excerpt(&body);
            return Err(LlmError::Http { status, provider: "openai", message });
        }
        let listed: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| LlmError::Malformed(format!("GET {url}: {e}")))?;
        let data = listed["data"]
            .as_array()
            .ok_or_else(|| LlmError::Malformed(format!("GET {url}: no `data` list of models")))?;
        Ok(data.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
    }

    /// [`complete`](Self::complete), calling `on_retry` before each backoff wait. With tools and
    /// `ep.strict_tools`, the call asks for the provider's strict tool mode; a server that
    /// answers that with 400 or 422 is asked once more without it, and if that works, this
    /// client does not ask it for strict tools again.
    pub async fn complete_observed(
        &self,
        ep: &Endpoint,
        req: &ChatRequest,
        mut on_retry: impl FnMut(&Retrying<'_>) + Send,
    ) -> Result<ChatResponse, LlmError> {
        let key = (ep.url(), ep.model.clone());
        let refused = || self.strict_refused.lock().map_or(true, |r| r.contains(&key));
        let strict = ep.strict_tools && !req.tools.is_empty() && !refused();
        match self.send(ep, req, strict, &mut on_retry).await {
            Err(LlmError::Http { status: 400 | 422, .. }) if strict => {
                let plain = self.send(ep, req, false, &mut on_retry).await;
                if plain.is_ok()
                    && let Ok(mut r) = self.strict_refused.lock()
                {
                    r.insert(key);
                }
                plain
            }
            Ok(mut response) if strict => {
                for call in &mut response.tool_calls {
                    call.arguments = strict::drop_nulls(&call.arguments);
                }
                Ok(response)
            }
            other => other,
        }
    }

    /// One call with its retries.
    async fn send(
        &self,
        ep: &Endpoint,
        req: &ChatRequest,
        strict: bool,
        on_retry: &mut (impl FnMut(&Retrying<'_>) + Send),
    ) -> Result<ChatResponse, LlmError> {
        let url = ep.url();
        let body = match ep.kind {
            ProviderKind::OpenAi => openai::request_body(ep, req, strict),
            ProviderKind::Anthropic => anthropic::request_body(ep, req, strict),
        };
        let body = body.to_string().into_bytes();
        let mut headers = headers(ep).map_err(|e| scrub(e, ep))?;
        if strict && ep.kind == ProviderKind::Anthropic {
            headers.insert("anthropic-beta", HeaderValue::from_static(anthropic::STRICT_BETA));
        }
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let failure = match self.attempt(ep, &url, headers.clone(), body.clone()).await {
                Ok(response) => return Ok(response),
                Err(f) => f,
            };
            let error = scrub(failure.error, ep);
            if !failure.retry || attempt > ep.retry.retries {
                return Err(match error {
                    LlmError::Timeout { provider, url, timeout, .. } => {
                        LlmError::Timeout { provider, url, timeout, attempts: attempt }
                    }
                    other => other.after_attempts(attempt),
                });
            }
            let delay = retry_delay(&ep.retry, attempt - 1, failure.retry_after, fastrand::f64());
            on_retry(&Retrying { attempt, delay, error: &error });
            tokio::time::sleep(delay).await;
        }
    }

    async fn attempt(
        &self,
        ep: &Endpoint,
        url: &str,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> Result<ChatResponse, Failure> {
        let provider = ep.kind.name();
        let sent = self.http.post(url).timeout(ep.timeout).headers(headers).body(body).send().await;
        let response = sent.map_err(|e| transport_failure(e, ep, url))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let bytes = response.bytes().await.map_err(|e| transport_failure(e, ep, url))?;
        if !status.is_success() {
            let code = status.as_u16();
            let retry = code == 429 || status.is_server_error();
            let message = http_message(code, &bytes, ep, url);
            let error = LlmError::Http { status: code, provider, message };
            return Err(Failure {
                error,
                retry,
                retry_after: retry.then_some(retry_after).flatten(),
            });
        }
        let json: Value = serde_json::from_slice(&bytes).map_err(|e| {
            Failure::fatal(LlmError::Malformed(format!(
                "{provider} at {url} answered {status} with a body that is not JSON ({e}): {}{}",
                excerpt(&String::from_utf8_lossy(&bytes)),
                match ep.kind {
                    ProviderKind::OpenAi => " — does the base URL end in its version, like /v1?",
                    ProviderKind::Anthropic => " — is the base URL the provider's host?",
                }
            )))
        })?;
        let parsed = match ep.kind {
            ProviderKind::OpenAi => openai::parse_response(&json),
            ProviderKind::Anthropic => anthropic::parse_response(&json),
        };
        parsed.map_err(|what| {
            let detail = provider_error_text(&json)
                .map(|m| format!("it says: {m}"))
                .unwrap_or_else(|| excerpt(&json.to_string()));
            Failure::fatal(LlmError::Malformed(format!(
                "{provider} at {url} answered {status} but {what}; {detail}"
            )))
        })
    }
}

/// The request headers, key included (marked sensitive so no HTTP-layer debug output shows it).
fn headers(ep: &Endpoint) -> Result<HeaderMap, LlmError> {
    let mut h = HeaderMap::new();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    // An empty key means none (an unset variable exported as ""), for both providers.
    let key = ep.api_key.as_ref().map(|k| k.expose().trim()).filter(|k| !k.is_empty());
    let secret_header = |value: String| {
        HeaderValue::from_str(&value)
            .map(|mut v| {
                v.set_sensitive(true);
                v
            })
            .map_err(|_| {
                LlmError::Transport(format!(
                    "the API key for {} contains characters an HTTP header cannot carry; check \
                     the key's environment variable (a stray quote or control character?)",
                    ep.kind.name()
                ))
            })
    };
    match ep.kind {
        ProviderKind::OpenAi => {
            if let Some(key) = key {
                h.insert(AUTHORIZATION, secret_header(format!("Bearer {key}"))?);
            }
        }
        ProviderKind::Anthropic => {
            if let Some(key) = key {
                h.insert("x-api-key", secret_header(key.to_string())?);
            }
            h.insert("anthropic-version", HeaderValue::from_static(anthropic::API_VERSION));
        }
    }
    Ok(h)
}

/// The server's requested wait: `retry-after-ms` (OpenAI sends it) or `retry-after`.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let text = |name| headers.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    if let Some(ms) = text("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e12) / 1000.0));
    }
    crate::parse_retry_after(text(RETRY_AFTER.as_str())?, SystemTime::now())
}

/// The provider's own words for a non-2xx answer, plus what to check.
fn http_message(status: u16, body: &[u8], ep: &Endpoint, url: &str) -> String {
    let said = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| provider_error_text(&v))
        .unwrap_or_else(|| excerpt(&String::from_utf8_lossy(body)));
    let said = if said.is_empty() { "(empty body)".to_string() } else { excerpt(&said) };
    let hint = match status {
        401 | 403 => format!(
            "check the API key in the environment variable the swarm YAML names for model `{}`",
            ep.model
        ),
        404 => format!("check the URL {url} and the model name `{}`", ep.model),
        400 | 422 => format!("check the model name `{}` and the request", ep.model),
        429 => "rate limited".to_string(),
        s if s >= 500 => format!("the server at {url} failed"),
        _ => format!("check the URL {url}"),
    };
    format!("{said} ({hint})")
}

/// `error.message`, `error` as text, or a top-level `message` — the shapes OpenAI, Anthropic,
/// OpenRouter, Ollama and vLLM use.
fn provider_error_text(v: &Value) -> Option<String> {
    let error = v.get("error");
    let text = error
        .and_then(|e| e.get("message"))
        .or_else(|| error.filter(|e| e.is_string()))
        .or_else(|| v.get("message"))?
        .as_str()?;
    Some(text.to_string())
}

fn transport_failure(e: reqwest::Error, ep: &Endpoint, url: &str) -> Failure {
    let provider = ep.kind.name();
    if e.is_timeout() {
        let error =
            LlmError::Timeout { provider, url: url.to_string(), timeout: ep.timeout, attempts: 1 };
        return Failure { error, retry: true, retry_after: None };
    }
    let (is_builder, is_connect) = (e.is_builder(), e.is_connect());
    let detail = chain(&e.without_url());
    if is_builder {
        return Failure::fatal(LlmError::Transport(format!(
            "cannot send to {provider} at {url}: {detail}; check the endpoint's base URL"
        )));
    }
    let what = if is_connect { "cannot connect to" } else { "lost the connection to" };
    let error = LlmError::Transport(format!(
        "{what} {provider} at {url}: {detail}; check the base URL and that the server is running"
    ));
    Failure { error, retry: true, retry_after: None }
}

/// An error and its sources, joined: reqwest's top-level text alone ("error sending request")
/// hides the cause ("Connection refused").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

fn scrub(error: LlmError, ep: &Endpoint) -> LlmError {
    match &ep.api_key {
        Some(key) => {
            let raw = key.expose();
            error.scrub(raw).scrub(raw.trim())
        }
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn provider_error_text_reads_every_known_shape() {
        let cases = [
            (json!({"error": {"message": "bad key", "type": "x"}}), Some("bad key")),
            (
                json!({"type": "error", "error": {"type": "x", "message": "overloaded"}}),
                Some("overloaded"),
            ),
            (json!({"error": "model 'x' not found"}), Some("model 'x' not found")),
            (json!({"message": "top"}), Some("top")),
            (json!({"detail": "?"}), None),
        ];
        for (v, want) in cases {
            assert_eq!(provider_error_text(&v).as_deref(), want, "{v}");
        }
    }

    #[test]
    fn retry_after_ms_is_preferred_and_bad_values_ignored() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("3"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)));
        h.insert("retry-after-ms", HeaderValue::from_static("soon"));
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3)));
        h.insert("retry-after", HeaderValue::from_static("later"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn keys_with_control_characters_fail_without_showing_the_key() {
        let ep = Endpoint::new(ProviderKind::OpenAi, "http://x/v1", "m")
            .with_key(crate::Secret::new("sk-\u{7}bell"));
        let e = headers(&ep).unwrap_err();
        assert!(!format!("{e} {e:?}").contains("bell"), "{e}");
    }
}
