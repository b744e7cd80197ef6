//! A small HTTP/1.1 server on tokio's TCP, enough for OpenAI clients on loopback: keep-alive,
//! `Content-Length` bodies, `Expect: 100-continue`; no chunked requests, no TLS, no pipelining
//! beyond buffering. While a request waits for the model it keeps reading its socket, so a client
//! that disconnects cancels its generation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::engine::{Engine, GenerateError, Job, ModelInfo};
use crate::prompt;
use crate::wire::{self, CompletionRequest};

const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// What every connection shares.
#[derive(Debug)]
pub struct Server {
    pub engine: Engine,
    pub info: ModelInfo,
    /// The bearer token every `/v1/*` request must carry.
    pub token: String,
}

/// Accepts connections until the listener fails.
pub async fn serve(listener: TcpListener, server: Arc<Server>) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let server = server.clone();
        tokio::spawn(async move {
            let _closed = connection(stream, server).await;
        });
    }
}

#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    keep_alive: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

struct Response {
    status: u16,
    body: Value,
}

impl Response {
    fn json(status: u16, body: Value) -> Self {
        Response { status, body }
    }

    fn error(status: u16, message: &str, kind: &str, code: Option<&str>) -> Self {
        Response { status, body: wire::error_body(message, kind, code) }
    }
}

async fn connection(mut stream: TcpStream, server: Arc<Server>) -> std::io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    loop {
        let request = match read_request(&mut stream, &mut buf).await? {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(bad) => {
                write_response(&mut stream, &bad, false).await?;
                return Ok(());
            }
        };
        let keep_alive = request.keep_alive;
        let response = match route(&request, &server, &mut stream, &mut buf).await {
            Some(r) => r,
            // The client went away while its request waited: nothing to answer.
            None => return Ok(()),
        };
        write_response(&mut stream, &response, keep_alive).await?;
        if !keep_alive {
            return Ok(());
        }
    }
}

/// `None` when the client disconnected before the answer was ready.
async fn route(
    req: &Request,
    server: &Server,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<Response> {
    let path = req.path.split('?').next().unwrap_or("");
    if path == "/health" {
        return Some(match req.method.as_str() {
            "GET" => Response::json(200, json!({"status": "ok", "model": server.info.name})),
            _ => method_not_allowed(),
        });
    }
    if !authorized(req, &server.token) {
        return Some(Response::error(
            401,
            "missing or wrong bearer token (Authorization: Bearer …, the FLOCK_MODEL_TOKEN of this flock-model)",
            "invalid_request_error",
            Some("invalid_api_key"),
        ));
    }
    match (req.method.as_str(), path) {
        ("POST", "/v1/chat/completions") => chat_completion(req, server, stream, buf).await,
        ("GET", "/v1/models") => Some(Response::json(
            200,
            json!({"object": "list", "data": [{"id": server.info.name, "object": "model", "owned_by": "flock"}]}),
        )),
        (_, "/v1/chat/completions" | "/v1/models") => Some(method_not_allowed()),
        _ => Some(Response::error(404, &format!("no route {path}"), "invalid_request_error", None)),
    }
}

fn method_not_allowed() -> Response {
    Response::error(405, "method not allowed", "invalid_request_error", None)
}

/// Constant-time comparison of the bearer token.
fn authorized(req: &Request, token: &str) -> bool {
    let Some(given) = req.header("authorization").and_then(|v| {
        let (scheme, rest) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
    }) else {
        return false;
    };
    let (a, b) = (given.as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn chat_completion(
    req: &Request,
    server: &Server,
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Option<Response> {
    let bad = |m: String| Some(Response::error(400, &m, "invalid_request_error", None));
    let parsed: CompletionRequest = match serde_json::from_slice(&req.body) {
        Ok(r) => r,
        Err(e) => return bad(format!("the body is not a chat-completions request: {e}")),
    };
    let chat = match parsed.to_chat() {
        Ok(c) => c,
        Err(e) => return bad(e),
    };
    let constrained = chat.constrained();
    let (tx, mut rx) = oneshot::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let key = parsed.user.clone().unwrap_or_default();
    let job = Job {
        prompt: prompt::render(&chat),
        key: key.clone(),
        background: parsed.service_tier.as_deref() == Some("flex"),
        parts: prompt::parts(&chat),
        schema: constrained.then(|| prompt::answer_schema(&chat)),
        fallback_schema: constrained.then(|| prompt::loose_answer_schema(&chat)),
        max_tokens: parsed.token_limit(),
        temperature: parsed.temperature,
        seed: parsed.seed,
        cancel: cancel.clone(),
        reply: tx,
    };
    if server.engine.submit(job).is_err() {
        return Some(Response::error(503, "the model thread has stopped", "server_error", None));
    }
    // Wait for the model while watching the socket: EOF or an error means the client is gone.
    let result = loop {
        tokio::select! {
            r = &mut rx => break r,
            n = stream.read_buf(buf) => match n {
                Ok(0) | Err(_) => {
                    cancel.store(true, Ordering::Relaxed);
                    return None;
                }
                Ok(_) if buf.len() > MAX_HEAD_BYTES + MAX_BODY_BYTES => {
                    cancel.store(true, Ordering::Relaxed);
                    return None;
                }
                // A pipelined next request: kept in `buf` for after this answer.
                Ok(_) => {}
            },
        }
    };
    let generation = match result {
        Ok(Ok(g)) => g,
        Ok(Err(e @ GenerateError::ContextExceeded { .. })) => {
            return Some(Response::error(
                400,
                &e.to_string(),
                "invalid_request_error",
                Some("context_length_exceeded"),
            ));
        }
        Ok(Err(e @ GenerateError::Grammar(_))) => return bad(e.to_string()),
        Ok(Err(GenerateError::Cancelled)) => return None,
        Ok(Err(e)) => return Some(Response::error(500, &e.to_string(), "server_error", None)),
        Err(_) => {
            return Some(Response::error(
                503,
                "the model thread has stopped",
                "server_error",
                None,
            ));
        }
    };
    // One line per request (`flockctl logs flock-model`, read by scripts/eval): how much of the
    // prompt the slot reused, what was processed, and the token budget of each part.
    let parts: Vec<String> =
        generation.part_tokens.iter().map(|(name, n)| format!("{name}={n}")).collect();
    eprintln!(
        "flock-model: slot {} ({}): prompt {} tokens, reused {}, processed {} in {} ms; {} generated; {} ms total{}; parts {}",
        generation.slot,
        if key.is_empty() { "-" } else { key.as_str() },
        generation.prompt_tokens,
        generation.reused_tokens,
        generation.prompt_tokens - generation.reused_tokens,
        generation.prompt_time.as_millis(),
        generation.completion_tokens,
        generation.total_time.as_millis(),
        if constrained { ", constrained" } else { "" },
        parts.join(" "),
    );
    let model = parsed.model.as_deref().filter(|m| !m.is_empty()).unwrap_or(&server.info.name);
    Some(Response::json(
        200,
        wire::completion_response(
            &chat,
            model,
            &generation.text,
            generation.finish,
            generation.prompt_tokens,
            generation.completion_tokens,
            generation.reused_tokens,
        ),
    ))
}

/// Reads one request from `buf` plus the socket. `Ok(Ok(None))` on a clean close between
/// requests; `Ok(Err(response))` for a request that must be refused (then the connection closes).
async fn read_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Result<Option<Request>, Response>> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Err(Response::error(
                431,
                "request head too large",
                "invalid_request_error",
                None,
            )));
        }
        if stream.read_buf(buf).await? == 0 {
            return if buf.is_empty() {
                Ok(Ok(None))
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
    };
    let head = match std::str::from_utf8(&buf[..head_end]) {
        Ok(h) => h,
        Err(_) => {
            return Ok(Err(Response::error(
                400,
                "request head is not UTF-8",
                "invalid_request_error",
                None,
            )));
        }
    };
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let (method, path, version) = match (first.next(), first.next(), first.next()) {
        (Some(m), Some(p), Some(v)) if v.starts_with("HTTP/1.") => {
            (m.to_string(), p.to_string(), v)
        }
        _ => {
            return Ok(Err(Response::error(
                400,
                "malformed request line",
                "invalid_request_error",
                None,
            )));
        }
    };
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut req = Request { method, path, headers, body: Vec::new(), keep_alive: false };
    let connection = req.header("connection").map(str::to_ascii_lowercase);
    req.keep_alive = match version {
        "HTTP/1.0" => connection.as_deref() == Some("keep-alive"),
        _ => connection.as_deref() != Some("close"),
    };
    if req.header("transfer-encoding").is_some() {
        return Ok(Err(Response::error(
            411,
            "chunked request bodies are not supported; send Content-Length",
            "invalid_request_error",
            None,
        )));
    }
    let length = match req.header("content-length").map(|v| v.parse::<usize>()) {
        None => 0,
        Some(Ok(n)) if n <= MAX_BODY_BYTES => n,
        Some(Ok(_)) => {
            return Ok(Err(Response::error(
                413,
                "request body too large",
                "invalid_request_error",
                None,
            )));
        }
        Some(Err(_)) => {
            return Ok(Err(Response::error(
                400,
                "bad Content-Length",
                "invalid_request_error",
                None,
            )));
        }
    };
    if length > 0
        && buf.len() < head_end + length
        && req.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
    }
    while buf.len() < head_end + length {
        if stream.read_buf(buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
    }
    req.body = buf[head_end..head_end + length].to_vec();
    buf.drain(..head_end + length);
    Ok(Ok(Some(req)))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn write_response(
    stream: &mut TcpStream,
    r: &Response,
    keep_alive: bool,
) -> std::io::Result<()> {
    let body = r.body.to_string();
    let reason = match r.status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Internal Server Error",
    };
    let mut out = format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        r.status,
        body.len()
    );
    if r.status == 401 {
        out.push_str("WWW-Authenticate: Bearer\r\n");
    }
    out.push_str(if keep_alive {
        "Connection: keep-alive\r\n\r\n"
    } else {
        "Connection: close\r\n\r\n"
    });
    out.push_str(&body);
    stream.write_all(out.as_bytes()).await?;
    stream.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request {
        Request {
            method: "POST".into(),
            path: "/v1/chat/completions".into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: vec![],
            keep_alive: true,
        }
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        assert!(authorized(&req(&[("Authorization", "Bearer s3cret")]), "s3cret"));
        assert!(authorized(&req(&[("authorization", "bearer  s3cret ")]), "s3cret"));
        assert!(!authorized(&req(&[("Authorization", "Bearer s3cre")]), "s3cret"));
        assert!(!authorized(&req(&[("Authorization", "Basic s3cret")]), "s3cret"));
        assert!(!authorized(&req(&[]), "s3cret"));
    }

    #[tokio::test]
    async fn requests_are_parsed_across_reads_and_kept_apart() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n").await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            s.write_all(b"\r\nhel").await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            s.write_all(b"loGET /health HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
            s
        });
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = Vec::new();
        let a = read_request(&mut s, &mut buf).await.unwrap().ok().unwrap().unwrap();
        assert_eq!(
            (a.method.as_str(), a.path.as_str(), a.body.as_slice()),
            ("POST", "/x", &b"hello"[..])
        );
        assert!(a.keep_alive);
        let b = read_request(&mut s, &mut buf).await.unwrap().ok().unwrap().unwrap();
        assert_eq!((b.method.as_str(), b.path.as_str()), ("GET", "/health"));
        assert!(!b.keep_alive);
        drop(client.await.unwrap());
        assert!(read_request(&mut s, &mut buf).await.unwrap().ok().unwrap().is_none());
    }
}
