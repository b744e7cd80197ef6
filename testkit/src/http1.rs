//! The HTTP/1.1 server side the chat fakes ([`crate::fake_telegram`], [`crate::fake_discord`],
//! [`crate::fake_slack`]) share: the accept loop, reading requests off a connection (keep-alive,
//! `Content-Length` and chunked bodies, size limits), writing answers, and handing the connection
//! over to a WebSocket after an upgrade. What a fake answers, with which headers, and how it
//! answers a malformed request stays with the fake. ([`crate::fake_llm`] reads one request per
//! connection with it and refuses a chunked one.)
//!
//! [`Conn`] is generic over the stream (its tests drive it over an in-memory pipe).

use std::future::Future;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// Longest request head (request line and headers).
const MAX_HEAD: usize = 64 * 1024;
/// Longest request body, and longest sum of the chunks of a chunked one.
const MAX_BODY: usize = 50 * 1024 * 1024;
/// Longest line of a chunked body (a chunk size, a trailer).
const MAX_LINE: usize = 64 * 1024;
/// Most headers in one request head.
const MAX_HEADERS: usize = 128;

/// A client connection and the bytes read from it that no request consumed yet.
pub(crate) struct Conn<S> {
    stream: S,
    buf: Vec<u8>,
}

/// One request as read off the connection.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) method: String,
    /// The request target as sent (path and query).
    pub(crate) target: String,
    /// The target before the first `?`.
    pub(crate) path: String,
    /// The target after the first `?` (empty without one), not decoded.
    pub(crate) query: String,
    /// Header names in lower case, values trimmed, in arrival order.
    pub(crate) headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub(crate) body: Vec<u8>,
    /// Whether the connection stays open after the answer (HTTP/1.1 unless `Connection: close`,
    /// HTTP/1.0 only with `Connection: keep-alive`).
    pub(crate) keep_alive: bool,
}

impl Request {
    /// The first value of header `name` (lower case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Whether the request asks for a WebSocket upgrade (`Upgrade: websocket`, any case).
    pub(crate) fn wants_websocket(&self) -> bool {
        self.header("upgrade").is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
    }
}

/// What [`Conn::read_request`] found.
enum Incoming {
    Request(Request),
    /// The client closed the connection between requests.
    Closed,
    /// Not HTTP/1.1 as the fakes understand it (a bad head, an unknown version, a bad length or
    /// chunk, a body cut short, a limit exceeded): answered with the fake's 400, then closed.
    Malformed,
}

/// An answer, written as `HTTP/1.1 <status> <reason>`, then `headers` in order, then
/// `Content-Length` and `Connection`, then the body.
pub(crate) struct Response<'a> {
    pub(crate) status: u16,
    /// The reason phrase: [`reason`] unless the fake names statuses its own way.
    pub(crate) reason: &'a str,
    pub(crate) headers: Vec<(&'a str, &'a str)>,
    pub(crate) body: &'a str,
}

impl<'a> Response<'a> {
    /// An answer with `Content-Type: content_type` (when there is one), then `headers`.
    pub(crate) fn new(
        status: u16,
        content_type: Option<&'a str>,
        headers: &'a [(String, String)],
        body: &'a str,
    ) -> Response<'a> {
        let content_type = content_type.map(|t| ("Content-Type", t));
        let headers = headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        Response {
            status,
            reason: reason(status),
            headers: content_type.into_iter().chain(headers).collect(),
            body,
        }
    }
}

/// An answer a fake made, owned (see [`serve`]).
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) content_type: Option<&'static str>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: String,
}

/// Serves requests on one connection until either side closes it: a request that asks for a
/// WebSocket is handed, with the connection, to `upgrade`; every other one is answered with what
/// `respond` makes of it. A malformed request is answered 400 and the connection closed.
pub(crate) async fn serve<S, Up, Fut>(
    mut conn: Conn<S>,
    mut respond: impl FnMut(&Request) -> Answer,
    upgrade: Up,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    Up: FnOnce(Conn<S>, Request) -> Fut,
    Fut: Future<Output = ()>,
{
    let malformed = Response::new(400, None, &[], "");
    while let Some(request) = conn.next_request(&malformed).await {
        if request.wants_websocket() {
            upgrade(conn, request).await;
            return;
        }
        if !conn.reply(&respond(&request), request.keep_alive).await {
            return;
        }
    }
}

/// A fake service's server: a listener on 127.0.0.1:0 served on a thread of its own (a
/// current-thread tokio runtime) until the `Server` is dropped, which stops it and joins the
/// thread. Every fake stands on one.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    /// The server thread's runtime, for work a fake must do on it.
    pub(crate) rt: tokio::runtime::Handle,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Binds 127.0.0.1:0 and runs `serve(listener, stop)` on a thread named `<name>-<port>`;
    /// `stop` fires when the server is dropped.
    pub(crate) fn start<F, Fut>(name: &str, serve: F) -> Server
    where
        F: FnOnce(std::net::TcpListener, oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        Server::bind(name).serve(serve)
    }

    /// Binds 127.0.0.1:0 only, for a fake whose state must know its address before it serves.
    pub(crate) fn bind(name: &str) -> Bound {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("{name}: bind 127.0.0.1:0: {e}"));
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("the listener's address");
        Bound { name: name.to_owned(), listener, addr }
    }
}

/// A listener bound for a [`Server`] that does not serve yet.
#[derive(Debug)]
pub(crate) struct Bound {
    name: String,
    listener: std::net::TcpListener,
    pub(crate) addr: SocketAddr,
}

impl Bound {
    /// Runs `serve(listener, stop)` on a thread of its own; see [`Server::start`].
    pub(crate) fn serve<F, Fut>(self, serve: F) -> Server
    where
        F: FnOnce(std::net::TcpListener, oneshot::Receiver<()>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let Bound { name, listener, addr } = self;
        let (shutdown, stop) = oneshot::channel();
        let (handle_tx, handle_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("{name}-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a fake's runtime");
                handle_tx.send(rt.handle().clone()).expect("hand over the runtime handle");
                rt.block_on(serve(listener, stop));
            })
            .unwrap_or_else(|e| panic!("{name}: spawn its thread: {e}"));
        let rt = handle_rx.recv().expect("a fake's runtime handle");
        Server { addr, rt, shutdown: Some(shutdown), thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.shutdown.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts connections on `listener` until `stop` fires (or its sender is dropped), serving each
/// on a task of its own with `serve`.
pub(crate) async fn accept_until<F, Fut>(
    listener: std::net::TcpListener,
    mut stop: oneshot::Receiver<()>,
    mut serve: F,
) where
    F: FnMut(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    tokio::spawn(serve(stream));
                }
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    pub(crate) fn new(stream: S) -> Conn<S> {
        Conn { stream, buf: Vec::new() }
    }

    /// Reads more bytes into the buffer; `false` at end of stream or on an error. (A fake holding
    /// a long poll also uses it to notice that the client left.)
    pub(crate) async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match self.stream.read(&mut chunk).await {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Position of the next CRLF at or after `from`, reading as needed.
    async fn line_end(&mut self, from: usize) -> Option<usize> {
        loop {
            if let Some(i) = find(&self.buf[from.min(self.buf.len())..], b"\r\n") {
                return Some(from + i);
            }
            if self.buf.len() > from + MAX_LINE || !self.fill().await {
                return None;
            }
        }
    }

    /// The next request on the connection; `None` when the client closed it between requests,
    /// or sent a malformed one, which is answered with `malformed` (and the connection closed).
    pub(crate) async fn next_request(&mut self, malformed: &Response<'_>) -> Option<Request> {
        match self.read_request().await {
            Incoming::Request(request) => Some(request),
            Incoming::Closed => None,
            Incoming::Malformed => {
                self.answer(malformed, false).await;
                None
            }
        }
    }

    /// Reads one request: a head, then a body of `Content-Length` bytes or chunked. Bytes after
    /// it (a pipelined request) stay buffered for the next call.
    async fn read_request(&mut self) -> Incoming {
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i;
            }
            if self.buf.len() > MAX_HEAD {
                return Incoming::Malformed;
            }
            if !self.fill().await {
                return if self.buf.is_empty() { Incoming::Closed } else { Incoming::Malformed };
            }
        };
        // The head is complete: httparse reads it (request line, header names and values).
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Request::new(&mut slots);
        let Ok(httparse::Status::Complete(_)) = parsed.parse(&self.buf[..head_end + 4]) else {
            return Incoming::Malformed;
        };
        let (Some(method), Some(target), Some(minor)) =
            (parsed.method, parsed.path, parsed.version)
        else {
            return Incoming::Malformed;
        };
        let (method, target) = (method.to_string(), target.to_string());
        let mut headers: Vec<(String, String)> = Vec::with_capacity(parsed.headers.len());
        for h in parsed.headers.iter() {
            let Ok(value) = std::str::from_utf8(h.value) else { return Incoming::Malformed };
            headers.push((h.name.to_ascii_lowercase(), value.trim().to_string()));
        }
        let connection =
            headers.iter().find(|(n, _)| n == "connection").map(|(_, v)| v.to_ascii_lowercase());
        let keep_alive = match minor {
            1 => connection.as_deref() != Some("close"),
            _ => connection.as_deref() == Some("keep-alive"),
        };
        let chunked = headers
            .iter()
            .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
        let mut pos = head_end + 4;
        let body = if chunked {
            let mut body = Vec::new();
            loop {
                let Some(eol) = self.line_end(pos).await else {
                    return Incoming::Malformed;
                };
                let size = match httparse::parse_chunk_size(&self.buf[pos..eol + 2]) {
                    Ok(httparse::Status::Complete((_, size))) => usize::try_from(size).ok(),
                    _ => None,
                };
                let Some(size) = size.filter(|s| body.len() + s <= MAX_BODY) else {
                    return Incoming::Malformed;
                };
                pos = eol + 2;
                if size == 0 {
                    // Trailers, up to an empty line.
                    loop {
                        let Some(eol) = self.line_end(pos).await else {
                            return Incoming::Malformed;
                        };
                        let empty = eol == pos;
                        pos = eol + 2;
                        if empty {
                            break;
                        }
                    }
                    break body;
                }
                while self.buf.len() < pos + size + 2 {
                    if !self.fill().await {
                        return Incoming::Malformed;
                    }
                }
                body.extend_from_slice(&self.buf[pos..pos + size]);
                pos += size + 2;
            }
        } else {
            let length = match headers.iter().find(|(n, _)| n == "content-length") {
                None => 0,
                Some((_, v)) => match v.parse::<usize>() {
                    Ok(n) if n <= MAX_BODY => n,
                    _ => return Incoming::Malformed,
                },
            };
            while self.buf.len() < pos + length {
                if !self.fill().await {
                    return Incoming::Malformed;
                }
            }
            pos += length;
            self.buf[head_end + 4..pos].to_vec()
        };
        self.buf.drain(..pos);
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p.to_string(), q.to_string()),
            None => (target.clone(), String::new()),
        };
        Incoming::Request(Request { method, target, path, query, headers, body, keep_alive })
    }

    /// Writes `response`; without `keep_alive` it says `Connection: close` and shuts the
    /// connection down after it. `true` when the connection stays open for another request (the
    /// answer went out, with `keep_alive`).
    pub(crate) async fn answer(&mut self, response: &Response<'_>, keep_alive: bool) -> bool {
        self.write_response(response, keep_alive).await.is_ok() && keep_alive
    }

    /// [`Conn::answer`] with an owned [`Answer`].
    pub(crate) async fn reply(&mut self, a: &Answer, keep_alive: bool) -> bool {
        self.answer(&Response::new(a.status, a.content_type, &a.headers, &a.body), keep_alive).await
    }

    async fn write_response(
        &mut self,
        response: &Response<'_>,
        keep_alive: bool,
    ) -> std::io::Result<()> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", response.status, response.reason);
        for (name, value) in &response.headers {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: {}\r\n\r\n{}",
            response.body.len(),
            if keep_alive { "keep-alive" } else { "close" },
            response.body,
        ));
        self.stream.write_all(out.as_bytes()).await?;
        self.stream.flush().await?;
        if !keep_alive {
            self.stream.shutdown().await?;
        }
        Ok(())
    }

    /// Answers a WebSocket upgrade whose `Sec-WebSocket-Key` is `key` with 101 and hands the
    /// connection (with any bytes the client sent after its request) to a server-side
    /// WebSocket; `None` when the 101 could not be written.
    pub(crate) async fn accept_websocket(mut self, key: &str) -> Option<WebSocketStream<S>> {
        let accept = derive_accept_key(key.as_bytes());
        let head = format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\n\r\n"
        );
        self.stream.write_all(head.as_bytes()).await.ok()?;
        Some(WebSocketStream::from_partially_read(self.stream, self.buf, Role::Server, None).await)
    }
}

/// The reason phrase of `status` (`Status` for one not listed here).
pub(crate) fn reason(status: u16) -> &'static str {
    match status {
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// Position of the first `needle` in `haystack`.
pub(crate) fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// `application/x-www-form-urlencoded` pairs (also query strings), decoded.
pub(crate) fn form_pairs(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (n, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(n), percent_decode(v))
        })
        .collect()
}

fn percent_decode(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Test client: writes `request` (a whole HTTP/1.1 request, `Connection: close`) and reads the
/// answer to its end: status, headers (names in lower case) and the body as JSON (`Null` if it
/// is not).
#[cfg(test)]
pub(crate) fn exchange(
    stream: &mut std::net::TcpStream,
    request: &str,
) -> (u16, Vec<(String, String)>, serde_json::Value) {
    use std::io::{Read, Write};
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read");
    let (head_len, status, headers) = response_head(&answer).expect("a whole response head");
    let body = serde_json::from_slice(&answer[head_len..]).unwrap_or(serde_json::Value::Null);
    (status, headers, body)
}

/// A response head as test clients read it: its length in bytes, the status, and the headers
/// (names in lower case, values trimmed).
#[cfg(test)]
pub(crate) type ResponseHead = (usize, u16, Vec<(String, String)>);

/// Test clients: the response head at the start of `buf`, read by httparse; `None` until it is
/// complete.
#[cfg(test)]
pub(crate) fn response_head(buf: &[u8]) -> Option<ResponseHead> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let httparse::Status::Complete(len) = parsed.parse(buf).expect("an HTTP/1.1 response head")
    else {
        return None;
    };
    let headers = parsed
        .headers
        .iter()
        .map(|h| {
            let value = String::from_utf8_lossy(h.value).trim().to_string();
            (h.name.to_ascii_lowercase(), value)
        })
        .collect();
    Some((len, parsed.code.expect("a status"), headers))
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, duplex};

    use super::*;

    /// A server-side connection over an in-memory pipe, and the client's end.
    fn pipe() -> (Conn<DuplexStream>, DuplexStream) {
        let (server, client) = duplex(1 << 16);
        (Conn::new(server), client)
    }

    async fn request(conn: &mut Conn<DuplexStream>) -> Request {
        match conn.read_request().await {
            Incoming::Request(request) => request,
            Incoming::Closed => panic!("closed"),
            Incoming::Malformed => panic!("malformed"),
        }
    }

    /// Whether `raw` (then the end of the stream) is malformed.
    async fn malformed(raw: &[u8]) -> bool {
        let (mut conn, mut client) = pipe();
        client.write_all(raw).await.unwrap();
        client.shutdown().await.unwrap();
        matches!(conn.read_request().await, Incoming::Malformed)
    }

    #[tokio::test]
    async fn pipelined_requests_with_length_and_chunked_bodies() {
        let (mut conn, mut client) = pipe();
        client
            .write_all(
                b"POST /a/b?x=1&y HTTP/1.1\r\nContent-Length: 5\r\nX-Name:  Value \r\n\r\nhello\
                  PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
                  3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: t\r\n\r\n\
                  GET /d HTTP/1.0\r\n\r\n\
                  GET /e HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            )
            .await
            .unwrap();
        client.shutdown().await.unwrap();
        let first = request(&mut conn).await;
        assert_eq!(
            (first.method.as_str(), first.target.as_str(), first.path.as_str()),
            ("POST", "/a/b?x=1&y", "/a/b")
        );
        assert_eq!(first.query, "x=1&y");
        assert_eq!(first.header("x-name"), Some("Value"));
        assert_eq!((first.body.as_slice(), first.keep_alive), (&b"hello"[..], true));
        let second = request(&mut conn).await;
        assert_eq!((second.path.as_str(), second.query.as_str()), ("/c", ""));
        assert_eq!((second.body.as_slice(), second.keep_alive), (&b"abcde"[..], false));
        let third = request(&mut conn).await;
        assert_eq!((third.path.as_str(), third.keep_alive), ("/d", false));
        let fourth = request(&mut conn).await;
        assert_eq!((fourth.path.as_str(), fourth.keep_alive), ("/e", true));
        assert!(matches!(conn.read_request().await, Incoming::Closed));
    }

    #[tokio::test]
    async fn malformed_requests() {
        assert!(malformed(b"GARBAGE\r\n\r\n").await);
        assert!(malformed(b"GET / HTTP/2.0\r\n\r\n").await);
        assert!(malformed(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n").await);
        assert!(malformed(b"GET / HTTP/1.1\r\nContent-Length: 9\r\n\r\nshort").await);
        assert!(malformed(b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").await);
        assert!(malformed(b"GET / HTTP/1.1\r\n").await);
        let too_long = format!("GET / HTTP/1.1\r\nContent-Length: {}\r\n\r\n", MAX_BODY + 1);
        assert!(malformed(too_long.as_bytes()).await);
    }

    #[tokio::test]
    async fn a_malformed_request_gets_the_given_answer_and_the_connection_closes() {
        let (mut conn, mut client) = pipe();
        client.write_all(b"GARBAGE\r\n\r\n").await.unwrap();
        let bad = Response { status: 400, reason: "Bad Request", headers: vec![], body: "no" };
        assert!(conn.next_request(&bad).await.is_none());
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert_eq!(
            answer,
            "HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"
        );
    }

    #[tokio::test]
    async fn responses_then_an_upgrade_hands_over_the_connection() {
        let (mut conn, mut client) = pipe();
        let headers = [("Retry-After".to_string(), "3".to_string())];
        let response = Response::new(429, Some("application/json"), &headers, "{}");
        assert!(conn.answer(&response, true).await);
        client
            .write_all(b"GET / HTTP/1.1\r\nUpgrade: WebSocket\r\nSec-WebSocket-Key: k\r\n\r\n")
            .await
            .unwrap();
        let upgrade = request(&mut conn).await;
        assert!(upgrade.wants_websocket());
        let ws = conn.accept_websocket(upgrade.header("sec-websocket-key").unwrap()).await;
        assert!(ws.is_some());
        drop(ws);
        let mut answer = String::new();
        client.read_to_string(&mut answer).await.unwrap();
        assert_eq!(
            answer,
            format!(
                "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\n\
                 Retry-After: 3\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\n{{}}\
                 HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Accept: {}\r\n\r\n",
                derive_accept_key(b"k")
            )
        );
    }
}
