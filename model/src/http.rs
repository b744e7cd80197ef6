//! A small HTTP/1.1 server on tokio's TCP, enough for OpenAI clients on loopback: keep-alive,
//! `Content-Length` bodies, `Expect: 100-continue`; no chunked requests, no TLS, no pipelining
//! beyond buffering. While a request waits for the model it keeps reading its socket, so a client
//! that disconnects cancels its generation. The head is parsed by `httparse` (hyper's parser);
//! the connection handling around it is ours, for the limits below, which hyper's server does
//! not offer (a token check before the body, a deadline on every wait, a lingering close).
//!
//! Any local user can connect, so: the route, method and bearer token are checked from the
//! request head, before a byte of body is read (a refused request is answered and its connection
//! closed, the body unread); every wait on a client has a deadline ([`Limits`]); at most
//! [`MAX_CONNECTIONS`] connections are served at once; an accept error (out of descriptors…) is
//! logged and waited out, never the end of [`serve`].

use std::collections::HashSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Semaphore, oneshot};
use tokio::time::{Instant, timeout, timeout_at};

use crate::engine::{Engine, GenerateError, Job, ModelInfo};
use crate::prompt;
use crate::wire::{self, CompletionRequest};

const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// The most headers a request may carry (an OpenAI client sends about a dozen).
const MAX_HEADERS: usize = 64;

/// The whole request head (request line and headers) must arrive within this of the connection
/// being accepted, or, on a kept-alive connection, of the next request's first byte. The gateway
/// writes a head in one go; 10 s is slack for a loaded 2-core machine. It is also the longest a
/// client that sends nothing, or dribbles its head (slowloris), holds a connection slot.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// A kept-alive connection with no new request for this long is closed (the gateway's client then
/// opens a new one). Only connections whose last request carried the right token are kept alive.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The body of a request (only read once its head passed the token check) must arrive within
/// this plus [`BODY_TIMEOUT_PER_MIB`] for each MiB it announces: 5 s + 32 s for the largest
/// (32 MiB), that is no slower than 1 MiB/s, which loopback beats a hundredfold.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// See [`BODY_TIMEOUT`].
pub const BODY_TIMEOUT_PER_MIB: Duration = Duration::from_secs(1);

/// Writing one response (or a `100 Continue`) must finish within this: a client that stops
/// reading is dropped instead of holding its slot.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// After answering a request whose body (or the rest of whose head) was not read, the server
/// shuts its side and discards what still comes for at most this long (and [`LINGER_MAX_BYTES`])
/// before closing: closing with unread input makes the kernel send a reset, which can destroy
/// the answer before the client has read it.
pub const LINGER_TIMEOUT: Duration = Duration::from_secs(2);

/// See [`LINGER_TIMEOUT`].
const LINGER_MAX_BYTES: usize = 1024 * 1024;

/// At most this many connections are served at once. The clients are the supervisor's gateway on
/// loopback (one connection per request in flight, a handful). When all slots are taken the
/// server *waits to accept*: new connections queue in the kernel's listen backlog, costing this
/// process neither a descriptor nor memory, and are served in arrival order as slots free, where
/// accept-and-close would turn a burst into errors the gateway has to retry. A slot held by a
/// client that sends nothing frees after [`HEAD_TIMEOUT`]; unauthenticated clients can make the
/// server buffer at most a head each (64 KiB, 128 KiB of capacity), 8 MiB for all slots.
pub const MAX_CONNECTIONS: usize = 64;

/// After an accept error that is not about the one connection (out of descriptors — EMFILE,
/// ENFILE —, memory or buffers), wait this long before accepting again rather than spin or exit:
/// meanwhile open connections finish and give their descriptors back.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The deadlines and the connection cap; [`Limits::default`] are the constants above (tests
/// shorten them).
#[derive(Debug, Clone)]
pub struct Limits {
    /// [`HEAD_TIMEOUT`]
    pub head: Duration,
    /// [`IDLE_TIMEOUT`]
    pub idle: Duration,
    /// [`BODY_TIMEOUT`]
    pub body: Duration,
    /// [`BODY_TIMEOUT_PER_MIB`]
    pub body_per_mib: Duration,
    /// [`WRITE_TIMEOUT`]
    pub write: Duration,
    /// [`LINGER_TIMEOUT`]
    pub linger: Duration,
    /// [`MAX_CONNECTIONS`]
    pub max_connections: usize,
    /// [`ACCEPT_BACKOFF`]
    pub accept_backoff: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            head: HEAD_TIMEOUT,
            idle: IDLE_TIMEOUT,
            body: BODY_TIMEOUT,
            body_per_mib: BODY_TIMEOUT_PER_MIB,
            write: WRITE_TIMEOUT,
            linger: LINGER_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            accept_backoff: ACCEPT_BACKOFF,
        }
    }
}

/// What every connection shares.
#[derive(Debug)]
pub struct Server {
    pub engine: Engine,
    pub info: ModelInfo,
    /// The bearer token every `/v1/*` request must carry.
    pub token: String,
    pub limits: Limits,
    /// Tool calls under the grammar of the offered tools; off only to measure what it saves
    /// (`--no-grammar`: each malformed call is logged).
    pub grammar: bool,
}

impl Server {
    /// A server with the default [`Limits`], tool calls under the grammar.
    pub fn new(engine: Engine, info: ModelInfo, token: String) -> Server {
        Server { engine, info, token, limits: Limits::default(), grammar: true }
    }
}

/// Accepts connections forever, at most `limits.max_connections` at a time. Accept errors do
/// not end it: each kind is logged once, and those about the process rather than one connection
/// (out of descriptors…) are waited out for `limits.accept_backoff`.
pub async fn serve(listener: TcpListener, server: Arc<Server>) -> Infallible {
    let listener = &listener;
    let accept = move || async move {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    };
    serve_with(accept, server).await
}

/// [`serve`] on a Unix socket: how flock-supervisor runs it, in its private `run/` folder, where
/// no agent can reach it (their cage does not show `run/`).
pub async fn serve_unix(listener: UnixListener, server: Arc<Server>) -> Infallible {
    let listener = &listener;
    serve_with(move || async move { Ok(listener.accept().await?.0) }, server).await
}

/// A connection's byte stream (TCP or Unix).
pub trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// [`serve`] with the accept call passed in, so tests can make it fail.
async fn serve_with<A, F, S>(mut accept: A, server: Arc<Server>) -> Infallible
where
    A: FnMut() -> F,
    F: Future<Output = io::Result<S>>,
    S: Stream,
{
    let slots = Arc::new(Semaphore::new(server.limits.max_connections));
    let mut logged = HashSet::new();
    loop {
        // A slot first, then accept (see MAX_CONNECTIONS): while every slot is taken, new
        // connections wait in the listen backlog.
        let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        match accept().await {
            Ok(stream) => {
                let server = server.clone();
                tokio::spawn(async move {
                    let _closed = connection(stream, server).await;
                    // Also given back if the task panics: the future, slot included, is dropped.
                    drop(slot);
                });
            }
            Err(e) => {
                drop(slot);
                let back_off = accept_error_backs_off(&e);
                if logged.insert((e.raw_os_error(), e.kind())) {
                    tracing::warn!(
                        "flock-model: accept failed: {e}; {} (each kind of accept error is \
                         logged once)",
                        if back_off {
                            format!("accepting again in {:?}", server.limits.accept_backoff)
                        } else {
                            "accepting the next connection".to_string()
                        }
                    );
                }
                if back_off {
                    tokio::time::sleep(server.limits.accept_backoff).await;
                }
            }
        }
    }
}

/// Whether an accept error is about the process or the listener (out of descriptors, memory,
/// buffers; anything unknown), to be waited out, rather than about the one connection that
/// failed before it was accepted (aborted, reset, interrupted), after which the next one can be
/// accepted at once.
fn accept_error_backs_off(e: &io::Error) -> bool {
    !matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

#[derive(Debug)]
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    /// The announced `Content-Length` (at most `MAX_BODY_BYTES`).
    content_length: usize,
    /// `Expect: 100-continue`.
    expect_continue: bool,
    /// Empty until [`read_body`].
    body: Vec<u8>,
    keep_alive: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

#[derive(Debug)]
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

/// What a request may do, decided from its head alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Health,
    Models,
    ChatCompletions,
}

/// When the next request head is due.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// A new connection: the whole head by then.
    First(Instant),
    /// A kept-alive connection: the next request may start until then; its whole head is then
    /// due `limits.head` after its first byte.
    Idle(Instant),
}

async fn connection<S: Stream>(mut stream: S, server: Arc<Server>) -> io::Result<()> {
    let limits = &server.limits;
    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    let mut wait = Wait::First(Instant::now() + limits.head);
    loop {
        let mut request = match read_head(&mut stream, &mut buf, limits, wait).await? {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(bad) => {
                answer_and_close(stream, &bad, limits).await;
                return Ok(());
            }
        };
        // Route, method and token from the head: a refused request's body is never read.
        let route = match gate(&request, &server.token) {
            Ok(route) => route,
            Err(refusal) => {
                answer_and_close(stream, &refusal, limits).await;
                return Ok(());
            }
        };
        // Only a client with the token may keep its connection (and its slot) between requests.
        let keep_alive = request.keep_alive && authorized(&request, &server.token);
        let response = match route {
            Route::Health => {
                Response::json(200, json!({"status": "ok", "model": server.info.name}))
            }
            Route::Models => Response::json(
                200,
                json!({"object": "list", "data": [{"id": server.info.name, "object": "model", "owned_by": "flock"}]}),
            ),
            Route::ChatCompletions => {
                read_body(&mut stream, &mut buf, &mut request, limits).await?;
                match chat_completion(&request, &server, &mut stream, &mut buf).await {
                    Some(r) => r,
                    // The client went away while its request waited: nothing to answer.
                    None => return Ok(()),
                }
            }
        };
        if route != Route::ChatCompletions && request.content_length > 0 {
            // A body no route reads (a GET with one): answered, and the connection closed unread.
            answer_and_close(stream, &response, limits).await;
            return Ok(());
        }
        write_response(&mut stream, &response, keep_alive, limits.write).await?;
        if !keep_alive {
            return Ok(());
        }
        wait = Wait::Idle(Instant::now() + limits.idle);
    }
}

/// The route a request may take, or its refusal: `/health` (GET) is open, everything else needs
/// the bearer token (checked first, so an unauthenticated client learns nothing about routes).
fn gate(req: &Request, token: &str) -> Result<Route, Response> {
    let path = req.path.split('?').next().unwrap_or("");
    if path == "/health" {
        return match req.method.as_str() {
            "GET" => Ok(Route::Health),
            _ => Err(method_not_allowed()),
        };
    }
    if !authorized(req, token) {
        return Err(Response::error(
            401,
            "missing or wrong bearer token (Authorization: Bearer …, the FLOCK_MODEL_TOKEN of this flock-model)",
            "invalid_request_error",
            Some("invalid_api_key"),
        ));
    }
    match (req.method.as_str(), path) {
        ("POST", "/v1/chat/completions") => Ok(Route::ChatCompletions),
        ("GET", "/v1/models") => Ok(Route::Models),
        (_, "/v1/chat/completions" | "/v1/models") => Err(method_not_allowed()),
        _ => Err(Response::error(404, &format!("no route {path}"), "invalid_request_error", None)),
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

async fn chat_completion<S: Stream>(
    req: &Request,
    server: &Server,
    stream: &mut S,
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
    let grammar = constrained && server.grammar;
    let (tx, mut rx) = oneshot::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let key = parsed.user.clone().unwrap_or_default();
    let job_background = parsed.service_tier.as_deref() == Some("flex");
    let job = Job {
        prompt: prompt::render(&chat),
        key: key.clone(),
        background: job_background,
        parts: prompt::parts(&chat),
        schema: grammar.then(|| prompt::answer_schema(&chat)),
        fallback_schema: grammar.then(|| prompt::loose_answer_schema(&chat)),
        max_tokens: parsed.token_limit(),
        temperature: parsed.temperature,
        seed: parsed.seed,
        cancel: cancel.clone(),
        reply: tx,
        submitted: std::time::Instant::now(),
        preempted: 0,
        resume: Vec::new(),
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
    // Structured fields for scripts (`--log-format json`); the message for people.
    let parts = parts.join(" ");
    // A call the caller would have to refuse: none under the grammar unless the token limit cut
    // it off; without it (a measurement) as many as the model writes.
    let malformed = constrained.then(|| prompt::malformed(&chat, &generation.text)).flatten();
    tracing::info!(
        slot = generation.slot,
        agent = if key.is_empty() { "-" } else { key.as_str() },
        background = job_background,
        tokens_in = generation.prompt_tokens,
        tokens_reused = generation.reused_tokens,
        tokens_out = generation.completion_tokens,
        prompt_ms = generation.prompt_time.as_millis() as u64,
        ms = generation.total_time.as_millis() as u64,
        queued_ms = generation.queued.as_millis() as u64,
        preempted = generation.preempted,
        tokens_shifted = generation.shifted_tokens,
        parts = %parts,
        constrained,
        grammar,
        malformed = malformed.as_deref().unwrap_or(""),
        "flock-model: slot {} ({}): prompt {} tokens, reused {}{}, processed {} in {} ms; {} generated; {} ms total{}; queued {} ms{}; parts {}{}",
        generation.slot,
        if key.is_empty() { "-" } else { key.as_str() },
        generation.prompt_tokens,
        generation.reused_tokens,
        if generation.shifted_tokens > 0 {
            format!(" ({} dropped tokens shifted out)", generation.shifted_tokens)
        } else {
            String::new()
        },
        generation.prompt_tokens - generation.reused_tokens,
        generation.prompt_time.as_millis(),
        generation.completion_tokens,
        generation.total_time.as_millis(),
        if grammar {
            ", constrained"
        } else if constrained {
            ", unconstrained (--no-grammar)"
        } else {
            ""
        },
        generation.queued.as_millis(),
        if generation.preempted > 0 {
            format!(", gave way {} time(s)", generation.preempted)
        } else {
            String::new()
        },
        parts,
        malformed.as_deref().map(|why| format!("; malformed call: {why}")).unwrap_or_default(),
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

/// Reads one request head from `buf` plus the socket, by the deadline `wait` sets, and leaves
/// the bytes after it in `buf`; the body is not read (see [`read_body`]). `Ok(Ok(None))` on a
/// clean close between requests or an idle keep-alive connection; `Ok(Err(response))` for a
/// request that must be refused (then the connection closes); `Err` also when the head does not
/// arrive in time.
async fn read_head<S: Stream>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    limits: &Limits,
    wait: Wait,
) -> io::Result<Result<Option<Request>, Response>> {
    // `started`: the head's own deadline is set (from the accept, or from its first byte).
    let (mut deadline, mut started) = match wait {
        Wait::First(due) => (due, true),
        Wait::Idle(_) if !buf.is_empty() => (Instant::now() + limits.head, true),
        Wait::Idle(until) => (until, false),
    };
    // Where the search for the blank line resumes: a head dribbled a byte at a time is scanned
    // once, not once per byte.
    let mut scanned = 0;
    let head_end = loop {
        if let Some(i) = find(&buf[scanned..], b"\r\n\r\n") {
            break scanned + i + 4;
        }
        scanned = buf.len().saturating_sub(3);
        if buf.len() > MAX_HEAD_BYTES {
            return Ok(Err(Response::error(
                431,
                "request head too large",
                "invalid_request_error",
                None,
            )));
        }
        let n = match timeout_at(deadline, stream.read_buf(buf)).await {
            Ok(n) => n?,
            Err(_) if !started => return Ok(Ok(None)),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        };
        if n == 0 {
            return if buf.is_empty() {
                Ok(Ok(None))
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        }
        if !started {
            started = true;
            deadline = Instant::now() + limits.head;
        }
    };
    // The head is complete: httparse reads it (the request line, each header's name and value).
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut slots);
    let refused = |status, message: &str| {
        Ok(Err(Response::error(status, message, "invalid_request_error", None)))
    };
    match parsed.parse(&buf[..head_end]) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => return refused(431, "too many request headers"),
        Ok(httparse::Status::Partial) | Err(_) => return refused(400, "malformed request head"),
    }
    let (Some(method), Some(path), Some(minor)) = (parsed.method, parsed.path, parsed.version)
    else {
        return refused(400, "malformed request line");
    };
    let mut headers = Vec::with_capacity(parsed.headers.len());
    for h in parsed.headers.iter() {
        let Ok(value) = std::str::from_utf8(h.value) else {
            return refused(400, "request head is not UTF-8");
        };
        headers.push((h.name.to_string(), value.trim().to_string()));
    }
    let (method, path) = (method.to_string(), path.to_string());
    let mut req = Request {
        method,
        path,
        headers,
        content_length: 0,
        expect_continue: false,
        body: Vec::new(),
        keep_alive: false,
    };
    let connection = req.header("connection").map(str::to_ascii_lowercase);
    req.keep_alive = match minor {
        0 => connection.as_deref() == Some("keep-alive"),
        _ => connection.as_deref() != Some("close"),
    };
    req.expect_continue =
        req.header("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue"));
    if req.header("transfer-encoding").is_some() {
        return Ok(Err(Response::error(
            411,
            "chunked request bodies are not supported; send Content-Length",
            "invalid_request_error",
            None,
        )));
    }
    req.content_length = match req.header("content-length").map(|v| v.parse::<usize>()) {
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
    buf.drain(..head_end);
    Ok(Ok(Some(req)))
}

/// Reads the body `req`'s head announced into `req.body` (sending `100 Continue` first if asked),
/// leaving what follows in `buf`. Called only for a request the gate let through. `Err` when the
/// client goes away or the body is not in within `limits.body` + `limits.body_per_mib` per MiB.
async fn read_body<S: Stream>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    req: &mut Request,
    limits: &Limits,
) -> io::Result<()> {
    let length = req.content_length;
    if buf.len() < length && req.expect_continue {
        match timeout(limits.write, stream.write_all(b"HTTP/1.1 100 Continue\r\n\r\n")).await {
            Ok(written) => written?,
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    let mib = u32::try_from(length.div_ceil(1024 * 1024)).unwrap_or(u32::MAX);
    let deadline = Instant::now() + limits.body + limits.body_per_mib * mib;
    // The client has the token and its length is at most MAX_BODY_BYTES: room for it at once
    // rather than by doubling (which could reach twice that).
    buf.reserve_exact(length.saturating_sub(buf.len()));
    while buf.len() < length {
        match timeout_at(deadline, stream.read_buf(buf)).await {
            Ok(Ok(0)) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::ErrorKind::TimedOut.into()),
        }
    }
    // The body leaves with the request; `buf` keeps only what follows (a pipelined request).
    let rest = buf.split_off(length);
    req.body = std::mem::replace(buf, rest);
    Ok(())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Answers with `Connection: close` and closes without reading the rest of the request (a body
/// it was refused before, the rest of a bad head). The write side is shut first and further
/// input discarded for at most `limits.linger` and `LINGER_MAX_BYTES`, so the close does not
/// become a reset that destroys the answer before the client reads it.
async fn answer_and_close<S: Stream>(mut stream: S, r: &Response, limits: &Limits) {
    if write_response(&mut stream, r, false, limits.write).await.is_err() {
        return;
    }
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut scratch = [0u8; 8 * 1024];
    let mut left = LINGER_MAX_BYTES;
    let _ = timeout(limits.linger, async {
        while left > 0 {
            match stream.read(&mut scratch).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}

/// Writes one response within `limit`.
async fn write_response<S: Stream>(
    stream: &mut S,
    r: &Response,
    keep_alive: bool,
    limit: Duration,
) -> io::Result<()> {
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
    let write = async {
        stream.write_all(out.as_bytes()).await?;
        stream.flush().await
    };
    match timeout(limit, write).await {
        Ok(written) => written,
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use tokio::net::TcpStream;

    const TOKEN: &str = "s3cret";

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn req(headers: &[(&str, &str)]) -> Request {
        request("POST", "/v1/chat/completions", headers)
    }

    fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request {
        Request {
            method: method.into(),
            path: path.into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            content_length: 0,
            expect_continue: false,
            body: vec![],
            keep_alive: true,
        }
    }

    /// A server without a model: its engine refuses every job (503).
    fn test_server(limits: Limits) -> Arc<Server> {
        let info = ModelInfo {
            name: "test-model".into(),
            n_ctx: 256,
            slots: 1,
            threads: 1,
            load_time: Duration::ZERO,
        };
        Arc::new(Server {
            engine: Engine::stopped(),
            info,
            token: TOKEN.into(),
            limits,
            grammar: true,
        })
    }

    async fn start(limits: Limits) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, test_server(limits)));
        addr
    }

    /// On a Unix socket (how flock-supervisor runs it) the same server answers: the health
    /// check without a token, a chat completion only with it.
    #[tokio::test]
    async fn a_unix_socket_is_served_like_a_port() {
        let dir = std::env::temp_dir().join(format!("flock-model-uds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        tokio::spawn(serve_unix(listener, test_server(quick())));
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
        let out = read_until_close(&mut s, Duration::from_secs(2)).await;
        assert_eq!(status(&out), 200, "{out:?}");
        let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
        let body = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let out = read_until_close(&mut s, Duration::from_secs(2)).await;
        assert_eq!(status(&out), 401, "no token, no completion: {out:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Short deadlines, so the timeout tests take a fraction of a second.
    fn quick() -> Limits {
        Limits {
            head: ms(200),
            idle: ms(300),
            body: ms(200),
            body_per_mib: Duration::ZERO,
            linger: ms(200),
            accept_backoff: ms(20),
            ..Limits::default()
        }
    }

    /// All the server sends until it closes; panics if it has not closed within `within`.
    async fn read_until_close<S: Stream>(s: &mut S, within: Duration) -> String {
        let mut out = Vec::new();
        let closed = timeout(within, async {
            let mut chunk = [0u8; 4096];
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => out.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        let out = String::from_utf8_lossy(&out).into_owned();
        assert!(closed.is_ok(), "the server did not close within {within:?}; it sent {out:?}");
        out
    }

    /// One response (head and `Content-Length` body) on a connection that stays open.
    async fn read_response(s: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        timeout(Duration::from_secs(2), async {
            loop {
                if let Some(end) = find(&buf, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                    let length: usize = head
                        .split("\r\n")
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap();
                    if buf.len() >= end + 4 + length {
                        break;
                    }
                }
                assert!(s.read_buf(&mut buf).await.unwrap() > 0, "closed mid-response");
            }
        })
        .await
        .expect("no complete response within 2 s");
        String::from_utf8(buf).unwrap()
    }

    fn status(response: &str) -> u16 {
        response.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    #[test]
    fn bearer_token_must_match_exactly() {
        assert!(authorized(&req(&[("Authorization", "Bearer s3cret")]), "s3cret"));
        assert!(authorized(&req(&[("authorization", "bearer  s3cret ")]), "s3cret"));
        assert!(!authorized(&req(&[("Authorization", "Bearer s3cre")]), "s3cret"));
        assert!(!authorized(&req(&[("Authorization", "Basic s3cret")]), "s3cret"));
        assert!(!authorized(&req(&[]), "s3cret"));
    }

    #[test]
    fn the_gate_decides_from_the_head_and_asks_for_the_token_before_naming_routes() {
        let auth = [("Authorization", "Bearer s3cret")];
        let gate_status = |method: &str, path: &str, headers: &[(&str, &str)]| {
            gate(&request(method, path, headers), TOKEN).map_err(|r| r.status)
        };
        assert_eq!(gate_status("GET", "/health", &[]), Ok(Route::Health));
        assert_eq!(gate_status("GET", "/health?x=1", &[]), Ok(Route::Health));
        assert_eq!(gate_status("POST", "/health", &[]), Err(405));
        assert_eq!(gate_status("POST", "/v1/chat/completions", &auth), Ok(Route::ChatCompletions));
        assert_eq!(gate_status("GET", "/v1/models", &auth), Ok(Route::Models));
        assert_eq!(gate_status("GET", "/v1/chat/completions", &auth), Err(405));
        assert_eq!(gate_status("POST", "/v1/nope", &auth), Err(404));
        for (method, path) in
            [("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/x")]
        {
            assert_eq!(gate_status(method, path, &[]), Err(401), "{method} {path}");
            let wrong = [("Authorization", "Bearer s3cret!")];
            assert_eq!(gate_status(method, path, &wrong), Err(401), "{method} {path}");
        }
    }

    #[test]
    fn accept_errors_about_one_connection_are_retried_at_once_others_after_a_pause() {
        for errno in [
            24,  /* EMFILE */
            23,  /* ENFILE */
            105, /* ENOBUFS */
            12,  /* ENOMEM */
        ] {
            assert!(accept_error_backs_off(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
        for errno in [103 /* ECONNABORTED */, 104 /* ECONNRESET */, 4 /* EINTR */] {
            assert!(!accept_error_backs_off(&io::Error::from_raw_os_error(errno)), "errno {errno}");
        }
    }

    #[tokio::test]
    async fn requests_are_parsed_across_reads_and_kept_apart() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"POST /x HTTP/1.1\r\nContent-Length: 5\r\n").await.unwrap();
            tokio::time::sleep(ms(20)).await;
            s.write_all(b"\r\nhel").await.unwrap();
            tokio::time::sleep(ms(20)).await;
            s.write_all(b"loGET /health HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
            s
        });
        let (mut s, _) = listener.accept().await.unwrap();
        let limits = Limits::default();
        let first = Wait::First(Instant::now() + limits.head);
        let mut buf = Vec::new();
        let mut a = read_head(&mut s, &mut buf, &limits, first).await.unwrap().unwrap().unwrap();
        assert_eq!((a.method.as_str(), a.path.as_str(), a.content_length), ("POST", "/x", 5));
        assert!(a.keep_alive);
        read_body(&mut s, &mut buf, &mut a, &limits).await.unwrap();
        assert_eq!(a.body, b"hello");
        let idle = Wait::Idle(Instant::now() + limits.idle);
        let b = read_head(&mut s, &mut buf, &limits, idle).await.unwrap().unwrap().unwrap();
        assert_eq!((b.method.as_str(), b.path.as_str()), ("GET", "/health"));
        assert!(!b.keep_alive);
        drop(client.await.unwrap());
        assert!(read_head(&mut s, &mut buf, &limits, idle).await.unwrap().unwrap().is_none());
    }

    /// (a) The 33 MiB-per-connection attack: a request without the right token, or for a wrong
    /// route or method, is answered from its head alone — the client has sent no byte of its
    /// announced 32 MiB body, not even after `Expect: 100-continue` — and its connection closed.
    /// The deadlines are the real ones: a server waiting for the body would not answer in time.
    #[tokio::test]
    async fn a_refused_request_is_answered_from_its_head_without_its_body() {
        let addr = start(Limits::default()).await;
        let big = "Content-Length: 33554432\r\n";
        let auth = "Authorization: Bearer s3cret\r\n";
        let cases = [
            (format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{big}\r\n"), 401),
            (
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\
                     Authorization: Bearer s3cre\r\n{big}\r\n"
                ),
                401,
            ),
            (
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Basic s3cret\r\n\
                     Expect: 100-continue\r\n{big}\r\n"
                ),
                401,
            ),
            (format!("POST /v1/nope HTTP/1.1\r\nHost: x\r\n{auth}{big}\r\n"), 404),
            (format!("PUT /v1/models HTTP/1.1\r\nHost: x\r\n{auth}{big}\r\n"), 405),
            (format!("POST /health HTTP/1.1\r\nHost: x\r\n{big}\r\n"), 405),
            // The open route does not read a body either.
            (format!("GET /health HTTP/1.1\r\nHost: x\r\n{big}\r\n"), 200),
            (
                format!(
                    "POST /v1/chat/completions HTTP/1.1\r\n{auth}Content-Length: 33554433\r\n\r\n"
                ),
                413,
            ),
        ];
        for (head, expected) in cases {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(head.as_bytes()).await.unwrap();
            let sent = Instant::now();
            let out = read_until_close(&mut s, Duration::from_secs(2)).await;
            assert_eq!(status(&out), expected, "{head:?} → {out:?}");
            assert!(out.contains("Connection: close\r\n"), "{out:?}");
            assert!(!out.contains("100 Continue"), "{out:?}");
            assert!(sent.elapsed() < Duration::from_secs(1), "{head:?}: {:?}", sent.elapsed());
        }
        // 401s say how to authenticate.
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET /v1/models HTTP/1.1\r\n{big}\r\n").as_bytes()).await.unwrap();
        let out = read_until_close(&mut s, Duration::from_secs(2)).await;
        assert!(out.contains("WWW-Authenticate: Bearer\r\n"), "{out:?}");
    }

    /// The other side of (a): with the token the body is read (100 Continue when asked) and
    /// answered, and the connection stays open for the next request; without the token even
    /// /health closes the connection after its answer.
    #[tokio::test]
    async fn with_the_token_the_body_is_read_and_the_connection_kept() {
        let addr = start(Limits::default()).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\
              Expect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        )
        .await
        .unwrap();
        let mut cont = [0u8; 25];
        timeout(Duration::from_secs(2), s.read_exact(&mut cont)).await.unwrap().unwrap();
        assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
        s.write_all(b"{}").await.unwrap();
        let out = read_response(&mut s).await;
        assert_eq!(status(&out), 400, "{out}");
        assert!(out.contains("not a chat-completions request"), "{out}");
        assert!(out.contains("Connection: keep-alive\r\n"), "{out}");
        // A valid request reaches the engine (here one without a model thread: 503).
        let body = r#"{"messages": [{"role": "user", "content": "hi"}]}"#;
        s.write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\
                 Content-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(status(&read_response(&mut s).await), 503);
        s.write_all(b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n")
            .await
            .unwrap();
        let out = read_response(&mut s).await;
        assert_eq!(status(&out), 200, "{out}");
        assert!(out.contains("test-model"), "{out}");

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let out = read_until_close(&mut s, Duration::from_secs(2)).await;
        assert_eq!(status(&out), 200, "{out}");
        assert!(out.contains("Connection: close\r\n"), "{out}");
    }

    /// (b) Slow or silent clients lose their connection: one that sends nothing after the head
    /// deadline, one that dribbles a head forever (slowloris) too, an idle kept-alive one after
    /// the idle deadline (but not before), and one whose body stalls after the body deadline.
    #[tokio::test]
    async fn silent_slow_and_idle_clients_are_closed_by_the_deadlines() {
        let limits = quick();
        let addr = start(limits.clone()).await;
        let slack = ms(50);

        let mut silent = TcpStream::connect(addr).await.unwrap();
        let t = Instant::now();
        assert_eq!(read_until_close(&mut silent, ms(900)).await, "");
        assert!(t.elapsed() + slack >= limits.head, "closed after {:?}", t.elapsed());

        let dribbler = TcpStream::connect(addr).await.unwrap();
        let (mut rd, mut wr) = dribbler.into_split();
        let t = Instant::now();
        let drip = tokio::spawn(async move {
            let mut sent = wr.write_all(b"GET /health HTTP/1.1\r\n").await;
            while sent.is_ok() {
                tokio::time::sleep(ms(20)).await;
                sent = wr.write_all(b"X-Slow: 1\r\n").await;
            }
        });
        let mut rest = Vec::new();
        let read = timeout(ms(900), rd.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the dribbling client was not closed");
        assert!(rest.is_empty(), "{:?}", String::from_utf8_lossy(&rest));
        assert!(t.elapsed() + slack >= limits.head, "closed after {:?}", t.elapsed());
        drip.abort();

        let mut kept = TcpStream::connect(addr).await.unwrap();
        let models = b"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n";
        for _ in 0..2 {
            kept.write_all(models).await.unwrap();
            assert_eq!(status(&read_response(&mut kept).await), 200);
            // Idle for less than the idle deadline (but longer than the head one): still open.
            tokio::time::sleep(limits.idle - ms(80)).await;
        }
        kept.write_all(models).await.unwrap();
        assert_eq!(status(&read_response(&mut kept).await), 200);
        let t = Instant::now();
        assert_eq!(read_until_close(&mut kept, ms(900)).await, "");
        assert!(t.elapsed() + slack >= limits.idle, "closed after {:?}", t.elapsed());

        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\
                  Content-Length: 100\r\n\r\n{\"messages\"",
            )
            .await
            .unwrap();
        let t = Instant::now();
        assert_eq!(read_until_close(&mut stalled, ms(900)).await, "");
        assert!(t.elapsed() + slack >= limits.body, "closed after {:?}", t.elapsed());
    }

    /// (c) With a cap of 2, two silent connections take both slots: a third is accepted only
    /// when one of them goes, and then served.
    #[tokio::test]
    async fn no_more_connections_than_the_cap_are_served() {
        let addr = start(Limits { max_connections: 2, ..Limits::default() }).await;
        let mut holders =
            vec![TcpStream::connect(addr).await.unwrap(), TcpStream::connect(addr).await.unwrap()];
        tokio::time::sleep(ms(100)).await;
        let mut third = TcpStream::connect(addr).await.unwrap();
        third.write_all(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut byte = [0u8; 1];
        assert!(
            timeout(ms(300), third.read(&mut byte)).await.is_err(),
            "served beyond the cap of 2 connections"
        );
        // The timed-out read took nothing; one holder leaves and the third is served.
        drop(holders.pop());
        let out = read_until_close(&mut third, Duration::from_secs(2)).await;
        assert_eq!(status(&out), 200, "{out:?}");
        // The remaining holder still has its slot and is served normally.
        holders[0].write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
        assert_eq!(status(&read_until_close(&mut holders[0], Duration::from_secs(2)).await), 200);
    }

    /// (d) Accept errors do not end `serve`: failures are injected before real accepts
    /// (EMFILE, ENFILE, ECONNABORTED, ENOMEM), then a connection is served.
    #[tokio::test]
    async fn accept_errors_do_not_end_serve() {
        let listener = Arc::new(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let addr = listener.local_addr().unwrap();
        let mut errors = [24, 23, 103, 12, 24].map(io::Error::from_raw_os_error).into_iter();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = calls.clone();
        let accept = move || {
            counted.fetch_add(1, Ordering::Relaxed);
            let injected = errors.next();
            let listener = listener.clone();
            async move {
                match injected {
                    Some(e) => Err(e),
                    None => listener.accept().await.map(|(s, _)| s),
                }
            }
        };
        let limits = quick();
        let t = Instant::now();
        tokio::spawn(serve_with(accept, test_server(limits.clone())));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
        let out = read_until_close(&mut s, Duration::from_secs(2)).await;
        assert_eq!(status(&out), 200, "{out:?}");
        // Four of the five errors are waited out; ECONNABORTED is not.
        assert!(t.elapsed() >= limits.accept_backoff * 4, "{:?}", t.elapsed());
        assert!(calls.load(Ordering::Relaxed) >= 6);
    }

    const EMFILE_CHILD: &str = "FLOCK_MODEL_TEST_EMFILE_CHILD";

    /// (d) for real: this test binary again, under `ulimit -n 64`, runs [`emfile_child`], which
    /// drives the server into EMFILE on accept and checks it serves again once descriptors free.
    #[test]
    fn serve_outlives_running_out_of_descriptors() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(
                r#"ulimit -n 64 && exec "$0" --exact http::tests::emfile_child --nocapture --test-threads=1"#,
            )
            .arg(&exe)
            .env(EMFILE_CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) =
            (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
        assert!(stdout.contains("1 passed"), "the child test did not run:\n{stdout}\n{stderr}");
        // The server hit EMFILE and logged it once, however often it retried.
        assert_eq!(
            stderr.matches("accept failed: Too many open files").count(),
            1,
            "stderr:\n{stderr}"
        );
    }

    #[tokio::test]
    async fn emfile_child() {
        if std::env::var_os(EMFILE_CHILD).is_none() {
            return;
        }
        // The accept error is logged through tracing, as in flock-model: to this stderr.
        crate::log::init();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits =
            Limits { max_connections: 10_000, accept_backoff: ms(20), ..Limits::default() };
        tokio::spawn(serve(listener, test_server(limits)));
        // Fill the descriptor table with connections (each takes two: ours and the server's).
        let spare = std::fs::File::open("/dev/null").unwrap();
        let mut clients = Vec::new();
        let full = loop {
            match TcpStream::connect(addr).await {
                Ok(s) => clients.push(s),
                Err(e) => break e,
            }
            assert!(clients.len() < 1000, "no descriptor limit");
        };
        assert_eq!(full.raw_os_error(), Some(24), "{full}");
        assert!(!clients.is_empty());
        // One descriptor back, taken at once (blocking, so the server cannot run in between) by
        // a connection the server must now accept with none left: EMFILE.
        drop(spare);
        let last = std::net::TcpStream::connect(addr).unwrap();
        tokio::time::sleep(ms(200)).await;
        // Free the table: the server accepts `last` on a retry and serves it.
        drop(clients);
        last.set_nonblocking(true).unwrap();
        let mut last = TcpStream::from_std(last).unwrap();
        last.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
        let out = read_until_close(&mut last, Duration::from_secs(5)).await;
        assert_eq!(status(&out), 200, "{out:?}");
    }
}
