//! The supervisor's HTTP side, both off by default:
//! - `--metrics ADDR`: `GET /metrics` in the Prometheus/OpenMetrics text format ([`metrics`]);
//! - `--ui ADDR`: the live dashboard — one page (embedded in the binary, no build step) fed by
//!   Server-Sent Events, acting through a control connection as `flockctl` does ([`ctl`]).
//!
//! The dashboard is guarded by a token made for each run: the URL printed at `up` (and by
//! `flockctl ui`) carries it once, the page trades it for an HttpOnly, SameSite=Strict cookie;
//! scripts may send `Authorization: Bearer TOKEN`. Requests whose `Host` is not this server's
//! address or `localhost` are refused (a web page elsewhere cannot reach it by DNS rebinding), and
//! so is an action (any method but GET) that a browser says comes from another site (`Origin`,
//! `Sec-Fetch-Site`): the cookie is SameSite=Strict and the actions take JSON only, and this is
//! the third lock on the door.

mod actions;
pub mod ctl;
pub mod metrics;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use flock_ipc::identity::same_secret;
use flock_ipc::{ControlReply, ControlRequest};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::control::ControlCtx;
use crate::paths::StateDir;
use ctl::{Ctl, CtlFactory};

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// The cookie that carries the token after the first visit.
const COOKIE: &str = "flock_ui";
/// How often the state behind the page is sampled while a page is open. A change reaches the
/// page within this (plus the time to read `ps`), the bound being 1 s at p95.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// What `up` was asked to serve.
#[derive(Debug, Clone, Default)]
pub struct WebOptions {
    pub metrics: Option<SocketAddr>,
    pub ui: Option<SocketAddr>,
}

/// What is being served, for `up` to print.
#[derive(Debug, Default)]
pub struct Served {
    pub metrics: Option<SocketAddr>,
    /// The dashboard's URL with its token.
    pub ui_url: Option<String>,
}

/// The file `flockctl ui` reads the dashboard's URL from (0600, removed at `down`).
pub fn ui_url_file(state: &StateDir) -> std::path::PathBuf {
    state.run_dir().join("ui-url")
}

/// The file `up --detach` reads the metrics URL from (removed at `down`).
pub fn metrics_url_file(state: &StateDir) -> std::path::PathBuf {
    state.run_dir().join("metrics-url")
}

/// Binds what `opts` asks for and serves it until the process ends.
pub async fn start(opts: &WebOptions, state: &StateDir, ctx: Arc<ControlCtx>) -> Result<Served> {
    let mut served = Served::default();
    if let Some(addr) = opts.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--metrics {addr}: cannot listen there"))?;
        let bound = listener.local_addr()?;
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(healthz))
            .with_state(ctx.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        served.metrics = Some(bound);
        let file = metrics_url_file(state);
        std::fs::write(&file, format!("http://{bound}/metrics\n"))
            .with_context(|| format!("write {}", file.display()))?;
    }
    if let Some(addr) = opts.ui {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("--ui {addr}: cannot listen there"))?;
        let bound = listener.local_addr()?;
        let token = new_token()?;
        let (tx, rx) = watch::channel(Arc::new(String::new()));
        let ui = Arc::new(Ui {
            token: token.clone(),
            bound,
            ctl: CtlFactory { socket: state.control_socket() },
            journal_dir: state.journal_dir(),
            state: rx,
            drives_other_hosts: ctx.cluster.as_ref().is_some_and(|h| h.drives_other_hosts()),
        });
        // Agents of other hosts get buttons where this host's operator drives them
        // (`cluster.operators`): the control path the buttons use crosses hosts.
        tokio::spawn(sampler(ui.ctl.clone(), tx, ui.drives_other_hosts));
        let app = Router::new()
            .route("/", get(index))
            .route("/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
            .route("/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
            .route("/api/state", get(state_now))
            .route("/api/events", get(events))
            .route("/api/channels/{name}", get(channel))
            .route("/api/agents/{name}", get(agent))
            .route("/api/journal", get(journal))
            .route("/api/post", post(post_message))
            .route("/api/send", post(send_message))
            .route("/api/agents/{name}/{action}", post(actions::agent_action))
            .route("/api/approvals", get(actions::approvals))
            .route("/api/approvals/{id}", post(actions::decide))
            .route("/api/dead-letters", get(actions::dead_letters))
            .route("/api/memory", get(actions::memory))
            .route("/api/memory/stats", get(actions::memory_stats))
            .route("/healthz", get(healthz))
            .layer(middleware::from_fn_with_state(ui.clone(), guard))
            .with_state(ui);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let host = match bound {
            SocketAddr::V4(a) if a.ip().is_loopback() => format!("127.0.0.1:{}", a.port()),
            other => other.to_string(),
        };
        let url = format!("http://{host}/?token={token}");
        let file = ui_url_file(state);
        std::fs::write(&file, format!("{url}\n"))
            .with_context(|| format!("write {}", file.display()))?;
        served.ui_url = Some(url);
    }
    Ok(served)
}

fn new_token() -> Result<String> {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness for the token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// `GET /metrics`: OpenMetrics to a client that asks for it (Prometheus), the classic text format
/// to everyone else.
async fn scrape(State(ctx): State<Arc<ControlCtx>>, headers: HeaderMap) -> Response {
    let body = metrics::scrape(&ctx).await;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if metrics::wants_openmetrics(accept) {
        ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], body).into_response()
    } else {
        ([(header::CONTENT_TYPE, metrics::CLASSIC_CONTENT_TYPE)], metrics::classic(&body))
            .into_response()
    }
}

/// `GET /healthz`: 200 while the supervisor serves (no token: it tells nothing but that).
async fn healthz() -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], "ok\n").into_response()
}

struct Ui {
    token: String,
    bound: SocketAddr,
    ctl: CtlFactory,
    journal_dir: std::path::PathBuf,
    /// The latest sample of the swarm (JSON), for new pages and the event stream.
    state: watch::Receiver<Arc<String>>,
    /// This host's operator drives other hosts' agents (`cluster.operators`): the page gives
    /// them stop/start/restart buttons.
    drives_other_hosts: bool,
}

type Shared = State<Arc<Ui>>;

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "no-cache")], body)
        .into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, axum::Json(json!({"error": message.into()}))).into_response()
}

/// Every request: the right `Host`, then the token (cookie or bearer) — except the first visit,
/// `/?token=…`, which [`index`] checks and trades for the cookie.
async fn guard(State(ui): Shared, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let port = ui.bound.port();
    let allowed = [
        ui.bound.to_string(),
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    if !allowed.iter().any(|a| a == host) {
        return error(
            StatusCode::FORBIDDEN,
            format!("this dashboard answers to {} only, not to Host `{host}`", ui.bound),
        );
    }
    if request.uri().path() == "/healthz" {
        return next.run(request).await;
    }
    if request.method() != axum::http::Method::GET && request.method() != axum::http::Method::HEAD {
        let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
        let foreign_origin = origin.is_some_and(|o| {
            !allowed.iter().any(|a| o.strip_prefix("http://") == Some(a.as_str()))
        });
        let site = headers.get("sec-fetch-site").and_then(|s| s.to_str().ok());
        if foreign_origin || site == Some("cross-site") {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "a request from another site (Origin `{}`) may not act on this dashboard",
                    origin.unwrap_or("?")
                ),
            );
        }
    }
    let offered = bearer(headers).or_else(|| cookie(headers));
    let first_visit = request.uri().path() == "/" && request.uri().query().is_some();
    match offered {
        Some(t) if same_secret(&ui.token, &t) => next.run(request).await,
        _ if first_visit => next.run(request).await,
        _ if request.uri().path() == "/" => (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            "<!doctype html><title>Flock</title><p>This dashboard needs its token: open the \
             URL that <code>flock-supervisor up</code> printed, or run <code>flockctl ui</code>.",
        )
            .into_response(),
        _ => error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong token: open the URL `flockctl ui` prints",
        ),
    }
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    v.strip_prefix("Bearer ").map(str::to_owned)
}

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        v.split(';').find_map(|kv| {
            let (k, val) = kv.trim().split_once('=')?;
            (k == COOKIE).then(|| val.to_owned())
        })
    })
}

async fn index(State(ui): Shared, Query(q): Query<HashMap<String, String>>) -> Response {
    if let Some(t) = q.get("token") {
        if !same_secret(&ui.token, t) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
                "<!doctype html><title>Flock</title><p>Wrong token. This run's URL is printed by \
                 <code>flockctl ui</code> (a token lasts one run of the supervisor).",
            )
                .into_response();
        }
        // Trade the token for a cookie and drop it from the address bar and the history.
        let mut r = Redirect::to("/").into_response();
        let c = format!("{COOKIE}={}; HttpOnly; SameSite=Strict; Path=/", ui.token);
        if let Ok(v) = HeaderValue::from_str(&c) {
            r.headers_mut().insert(header::SET_COOKIE, v);
        }
        return r;
    }
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// The swarm now (read for this request: the sampler runs only while a page streams events).
async fn state_now(State(ui): Shared) -> Response {
    let drives = ui.drives_other_hosts;
    match open_and(&ui, |mut c| async move { sample(&mut c, drives).await }).await {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}")),
    }
}

/// `text/event-stream`: the swarm's state now, then each time it changes (`event: state`).
async fn events(
    State(ui): Shared,
) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut rx = ui.state.clone();
    rx.mark_changed();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let body = rx.borrow_and_update().clone();
            if !body.is_empty() {
                return Some((Ok(Event::default().event("state").data(body.as_str())), rx));
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// Samples `ps`, chains and channels while a page is open, and publishes a change.
async fn sampler(factory: CtlFactory, tx: watch::Sender<Arc<String>>, drives: bool) {
    let mut conn: Option<Ctl> = None;
    let mut last = String::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if tx.is_closed() {
            return;
        }
        // Nobody looking (only the server's own receiver): read nothing.
        if tx.receiver_count() <= 1 {
            continue;
        }
        if conn.is_none() {
            conn = factory.open().await.ok();
        }
        let Some(c) = conn.as_mut() else { continue };
        match sample(c, drives).await {
            Ok(v) => {
                let text = v.to_string();
                if text != last {
                    last.clone_from(&text);
                    let _ = tx.send(Arc::new(text));
                }
            }
            Err(_) => conn = None,
        }
    }
}

/// The swarm's state for the page; `drives`: this host's operator drives other hosts' agents.
async fn sample(c: &mut Ctl, drives: bool) -> Result<Value> {
    let ps = match c.call(ControlRequest::Ps).await? {
        ControlReply::Ps(rows) => serde_json::to_value(rows)?,
        _ => Value::Null,
    };
    let chains = match c.call(ControlRequest::Chains).await? {
        ControlReply::Chains(rows) => crate::control::chain_rows_json(&rows),
        _ => Value::Null,
    };
    let channels = c.tool("flock_channel_list", json!({}), "operator").await?;
    // The permission requests waiting for a person (the page decides them). A host that is not
    // its swarm's leader keeps none (the leader's page shows them).
    let approvals = match c.tool("permission_list", json!({"all": false}), "operator").await {
        Ok(v) => v,
        Err(e) if format!("{e:#}").contains(crate::control::KEPT_BY) => json!([]),
        Err(e) => return Err(e),
    };
    Ok(json!({
        "ps": ps, "chains": chains, "channels": channels, "approvals": approvals,
        "drives_other_hosts": drives,
    }))
}

async fn channel(
    State(ui): Shared,
    Path(name): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let mut args = json!({"channel": name, "limit": 100});
    if let Some(after) = q.get("after").and_then(|a| a.parse::<u64>().ok()) {
        args["after"] = json!(after);
    }
    match open_and(&ui, |mut c| async move { c.tool("flock_channel_read", args, "operator").await })
        .await
    {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// An agent's recent work: its sessions (turns, tool calls and results) and its latest log lines.
async fn agent(State(ui): Shared, Path(name): Path<String>) -> Response {
    let result = open_and(&ui, |mut c| async move {
        let sessions = match c
            .call(ControlRequest::Session { agent: name.clone(), channel: None })
            .await?
        {
            ControlReply::Json(t) => serde_json::from_str::<Value>(&t)?,
            _ => Value::Null,
        };
        // The most recent session's messages (a turn's input, tool calls, results, answer).
        let newest = sessions["sessions"]
            .as_array()
            .and_then(|l| l.iter().find(|s| s["closed"] != json!(true)).or_else(|| l.last()))
            .and_then(|s| s["channel"].as_str())
            .map(str::to_owned);
        let session = match newest {
            Some(channel) => match c
                .call(ControlRequest::Session { agent: name.clone(), channel: Some(channel) })
                .await?
            {
                ControlReply::Json(t) => serde_json::from_str::<Value>(&t)?,
                _ => Value::Null,
            },
            None => Value::Null,
        };
        let logs = match c
            .call(ControlRequest::Logs { agent: Some(name.clone()), lines: 40, follow: false })
            .await
        {
            Ok(ControlReply::LogLines(l)) => l,
            _ => Vec::new(),
        };
        Ok(json!({"agent": name, "sessions": sessions["sessions"], "session": session, "logs": logs}))
    })
    .await;
    // Its turns as the journal tells them (a closed session keeps no messages to show).
    let result = match result {
        Ok(mut v) => {
            let name = v["agent"].as_str().unwrap_or_default().to_owned();
            v["journal"] =
                journal_events(&ui, Some(format!("agent={name}")), 30).await.unwrap_or_default();
            Ok(v)
        }
        Err(e) => Err(e),
    };
    match result {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// The shared journal, newest first: `?q=` a `flockctl journal query` expression, `?last=N`.
async fn journal(State(ui): Shared, Query(q): Query<HashMap<String, String>>) -> Response {
    let last = q.get("last").and_then(|n| n.parse::<usize>().ok()).unwrap_or(100).min(1000);
    let expr = q.get("q").map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    match journal_events(&ui, expr, last).await {
        Ok(events) => axum::Json(events).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

/// The newest `last` journal events (matching `expr`, a `flockctl journal query` expression),
/// newest first.
async fn journal_events(ui: &Ui, expr: Option<String>, last: usize) -> Result<Value> {
    let dir = ui.journal_dir.clone();
    let lines = tokio::task::spawn_blocking(move || -> Result<String> {
        let journal = flock_journal::Journal::open(dir, flock_journal::DEFAULT_MAX_BYTES)?;
        match expr {
            Some(e) => crate::journal_cli::query(&journal, &e, true),
            None => crate::journal_cli::read(&journal, last, true),
        }
    })
    .await??;
    // A JSON array, oldest first.
    let mut events: Vec<Value> = serde_json::from_str(&lines).unwrap_or_default();
    if events.len() > last {
        events.drain(..events.len() - last);
    }
    events.reverse();
    Ok(Value::Array(events))
}

#[derive(serde::Deserialize)]
struct PostForm {
    channel: String,
    text: String,
    /// The person posting (`human:<as>`); "operator" if empty.
    #[serde(default, rename = "as")]
    as_name: String,
}

async fn post_message(State(ui): Shared, axum::Json(f): axum::Json<PostForm>) -> Response {
    let who = if f.as_name.trim().is_empty() { "operator".to_owned() } else { f.as_name };
    let args = json!({"channel": f.channel.trim_start_matches('#'), "text": f.text});
    match open_and(&ui, |mut c| async move { c.tool("flock_channel_post", args, &who).await }).await
    {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

#[derive(serde::Deserialize)]
struct SendForm {
    agent: String,
    text: String,
}

/// As `flockctl send`: the answer comes to the operator's DM with the agent.
async fn send_message(State(ui): Shared, axum::Json(f): axum::Json<SendForm>) -> Response {
    let agent = f.agent.clone();
    match open_and(&ui, |mut c| async move { c.send(&f.agent, f.text).await }).await {
        Ok(id) => axum::Json(json!({
            "chain": flock_ipc::id::fmt_id(id),
            "dm": flock_actors::channels::delta::dm_channel_id(&agent, "human:operator"),
        }))
        .into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
    }
}

async fn open_and<T, F, Fut>(ui: &Ui, f: F) -> Result<T>
where
    F: FnOnce(Ctl) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let c = ui.ctl.open().await?;
    f(c).await
}
