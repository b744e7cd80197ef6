//! What an operator sees: `GET /metrics` read by a Prometheus-format parser, and the web dashboard
//! driven in a real headless Chromium through chromedriver (WebDriver) — the page shows the
//! running agents, a `kill -9` shows up as a restart within 2 s, a post typed into the page lands
//! in the channel, the operator restarts, stops and starts an agent and approves a permission
//! request from the page (journaled as `human:operator`), and a wrong token, a foreign `Host` or
//! an action from another site is refused.
//!
//! The browser comes from Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/setup-browser` (scripts/test runs it). Without them the browser test says so and
//! passes, unless `FLOCK_REQUIRE_BROWSER=1` (CI), where their absence is a failure.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use flock_testkit::{Swarm, bin, repo_root, run};
use serde_json::json;

use crate::{LONG, SHORT, answer_model};

fn yaml() -> String {
    format!(
        r#"swarm:
  name: seen
supervision:
  backoff_initial_ms: 50
channels:
  delta_delay_min_ms: 50
  delta_delay_max_ms: 100
models:
{}  w:
    provider: scripted
    rules:
      - match: "status please"
        steps:
          - tool: flock_channel_post
            args: {{ channel: "team", text: "worker here: all green" }}
        reply: "posted"
      - match: "need the network"
        steps:
          - tool: permission_request
            args: {{ capability: network, target: "crates.io", reason: "fetch the dependencies" }}
        reply: "asked"
      - reply: "done: {{input}}"
agents:
  - {{ name: coordinator, role: coordinator, model: m }}
  - {{ name: worker, role: worker, model: w }}
"#,
        answer_model("m", "done: {input}")
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 request over a plain socket: (status, headers and body as text).
pub(crate) fn http(addr: &str, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(LONG)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

pub(crate) fn get(addr: &str, path: &str, extra: &str) -> (u16, String) {
    http(addr, &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{extra}\r\n"))
}

#[test]
fn metrics_are_served_in_the_prometheus_format_and_count_what_happened() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let swarm = Swarm::builder(&yaml()).up_args(&["--metrics", &addr]).start();
    swarm.ctl_ok(&["send", "worker", "count me"]);
    swarm.wait_until(|| swarm.turns_total("worker") >= 1, SHORT, "the worker's turn");
    swarm.ctl_ok(&["channel", "create", "team", "--members", "worker", "--as", "alice"]);
    swarm.ctl_ok(&["post", "#team", "hello @worker", "--as", "alice"]);

    // A client that does not ask for OpenMetrics (curl, most tools) gets the classic format.
    let scrape = || {
        let (status, text) = get(&addr, "/metrics", "");
        assert_eq!(status, 200, "{text}");
        let head = text.split("\r\n\r\n").next().unwrap_or_default().to_lowercase();
        assert!(head.contains("content-type: text/plain; version=0.0.4"), "{text}");
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        let lines = body.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("a parsable exposition");
        (scrape, body)
    };
    let number = |v: &prometheus_parse::Value| match v {
        prometheus_parse::Value::Counter(v)
        | prometheus_parse::Value::Gauge(v)
        | prometheus_parse::Value::Untyped(v) => *v,
        _ => f64::NAN,
    };
    let value = |s: &prometheus_parse::Scrape, name: &str, label: (&str, &str)| -> Option<f64> {
        s.samples
            .iter()
            .find(|x| x.metric == name && x.labels.get(label.0) == Some(label.1))
            .map(|x| number(&x.value))
    };
    // The delta to the worker is a turn of its own; wait for both turns to be counted.
    swarm.wait_until(
        || value(&scrape().0, "flock_turns_total", ("agent", "worker")) >= Some(2.0),
        LONG,
        "both of the worker's turns in /metrics",
    );
    let (s, body) = scrape();
    assert!(value(&s, "flock_turns_total", ("agent", "worker")) >= Some(2.0), "{body}");
    // Read as what they are: a counter is a counter for a classic parser, not untyped.
    let turns = s.samples.iter().find(|x| x.metric == "flock_turns_total").map(|x| &x.value);
    assert!(matches!(turns, Some(prometheus_parse::Value::Counter(_))), "{turns:?}\n{body}");
    assert!(!body.contains("# EOF") && !body.contains("# UNIT"), "{body}");
    // Prometheus asks for OpenMetrics and gets it.
    let accept =
        "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n";
    let (status, om) = get(&addr, "/metrics", accept);
    assert_eq!(status, 200, "{om}");
    assert!(om.to_lowercase().contains("content-type: application/openmetrics-text"), "{om}");
    assert!(
        om.trim_end().ends_with("# EOF") && om.contains("# TYPE flock_restarts counter"),
        "{om}"
    );
    // The Grafana dashboard in docs/ asks only for metrics this scrape serves.
    let grafana = std::fs::read_to_string(repo_root().join("docs/grafana-dashboard.json")).unwrap();
    let grafana: serde_json::Value = serde_json::from_str(&grafana).expect("valid JSON");
    let exprs: Vec<&str> = grafana["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter().filter_map(|t| t["expr"].as_str()))
        .collect();
    assert!(exprs.len() >= 16, "{exprs:?}");
    let documented = std::fs::read_to_string(repo_root().join("docs/observability.md")).unwrap();
    let mut served = 0;
    for expr in exprs {
        for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !name.starts_with("flock_") {
                continue;
            }
            // A family without samples yet is not in a scrape (model calls, here): every name
            // is one the metrics table documents, and one counted here is served.
            let family = ["_bucket", "_count", "_sum"]
                .iter()
                .fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
            assert!(
                documented.contains(&format!("| `{family}` |")),
                "the dashboard's `{name}` ({expr}) is not in docs/observability.md's table"
            );
            served += usize::from(body.contains(family));
        }
    }
    assert!(served >= 12, "only {served} of the dashboard's metrics are in this scrape:\n{body}");
    // A health check needs no token.
    let (status, health) = get(&addr, "/healthz", "");
    assert_eq!((status, health.trim_end().ends_with("ok")), (200, true), "{health}");
    assert_eq!(value(&s, "flock_process_up", ("name", "worker")), Some(1.0), "{body}");
    assert_eq!(value(&s, "flock_mailbox_depth", ("name", "coordinator")), Some(0.0), "{body}");
    assert_eq!(value(&s, "flock_restarts_total", ("name", "worker")), Some(0.0), "{body}");
    assert!(value(&s, "flock_channel_posts_total", ("channel", "team")) >= Some(1.0), "{body}");
    assert!(
        value(&s, "flock_process_resident_memory_bytes", ("name", "worker")) > Some(1e5),
        "{body}"
    );
    let durable = s.samples.iter().find(|x| x.metric == "flock_messages_durable_total");
    assert!(durable.map(|d| number(&d.value)) >= Some(1.0), "{body}");
    // The turn-duration histogram has the worker's turns in its count.
    assert!(
        body.lines().any(|l| l.starts_with("flock_turn_duration_seconds_count{agent=\"worker\"}")),
        "{body}"
    );
    // A restart is counted.
    swarm.kill9("worker");
    swarm.wait_until(
        || value(&scrape().0, "flock_restarts_total", ("name", "worker")) == Some(1.0),
        SHORT,
        "the restart in /metrics",
    );
}

/// chromedriver and the Chromium it drives, or why the browser test cannot run here.
fn browser() -> Result<(String, String), String> {
    let find = |names: &[&str]| {
        names.iter().map(|n| format!("/usr/bin/{n}")).find(|p| Path::new(p).exists())
    };
    let driver = find(&["chromedriver"]).ok_or("no /usr/bin/chromedriver")?;
    let chromium = find(&["chromium", "chromium-browser"]).ok_or("no /usr/bin/chromium")?;
    Ok((driver, chromium))
}

struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_driver(driver: &str) -> (Driver, u16) {
    let port = free_port();
    let child = Command::new(driver)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let deadline = Instant::now() + SHORT;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    (Driver(child), port)
}

async fn open_browser(driver_port: u16, chromium: &str) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert("browserName".into(), json!("chrome"));
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium,
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,1100"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .expect("a WebDriver session in headless Chromium")
}

/// The text of the first element `css` selects, read in one script run (the page re-renders
/// parts of itself live, so a found element may be replaced before its text is asked for).
async fn text_of(c: &Client, css: &str) -> Option<String> {
    let script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;";
    let v = c.execute(script, vec![json!(css)]).await.ok()?;
    v.as_str().map(str::to_owned)
}

/// Polls the page until `css` has a text that `ok` accepts; its text, or a panic after `timeout`.
/// Waits until nothing matches `css`; panics after `timeout`.
async fn wait_gone(c: &Client, css: &str, timeout: Duration) {
    let start = Instant::now();
    while c.find(Locator::Css(css)).await.is_ok() {
        assert!(start.elapsed() < timeout, "{css} is still on the page after {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_text(c: &Client, css: &str, ok: impl Fn(&str) -> bool, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let t = text_of(c, css).await;
        if let Some(t) = &t
            && ok(t)
        {
            return t.clone();
        }
        if Instant::now() > deadline {
            let html = c.source().await.unwrap_or_default();
            panic!("`{css}` never matched (last: {t:?}); page:\n{html}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[test]
fn the_dashboard_shows_the_swarm_live_in_a_real_browser() {
    let (driver, chromium) = match browser() {
        Ok(b) => b,
        Err(why) => {
            assert!(
                std::env::var_os("FLOCK_REQUIRE_BROWSER").is_none(),
                "FLOCK_REQUIRE_BROWSER is set but {why}: run scripts/setup-browser"
            );
            eprintln!("skipped: {why} (scripts/setup-browser installs Chromium and chromedriver)");
            return;
        }
    };
    let swarm = Swarm::builder(&yaml()).up_args(&["--ui", "127.0.0.1:0"]).start();
    let url_file = swarm.state_dir().join("run/ui-url");
    let url = std::fs::read_to_string(&url_file).expect("up writes the dashboard's URL");
    let url = url.trim().to_owned();
    assert!(url.starts_with("http://127.0.0.1:") && url.contains("/?token="), "{url}");
    assert_eq!(swarm.ctl_ok(&["ui"]).trim(), url, "flockctl ui prints the same URL");
    // `--open` says whether the browser command managed it: its failure is flockctl's.
    for (browser, code) in [("true", 0), ("false", 1)] {
        let mut open = Command::new(bin("flockctl"));
        open.arg("--state-dir").arg(swarm.state_dir()).args(["ui", "--open"]);
        let out = run(open.env("BROWSER", browser).env_remove("FLOCK_HOME"), SHORT);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "BROWSER={browser}: {stderr}");
        if code != 0 {
            assert!(stderr.contains("could not open the URL"), "{stderr}");
        }
    }
    let addr = url.trim_start_matches("http://").split('/').next().unwrap().to_owned();
    swarm.ctl_ok(&["channel", "create", "team", "--members", "worker", "--as", "alice"]);

    // Refusals, over plain HTTP: no token, a wrong token (cookie, bearer or URL), a foreign Host.
    assert_eq!(get(&addr, "/api/state", "").0, 401);
    assert_eq!(get(&addr, "/api/state", "Cookie: flock_ui=nope\r\n").0, 401);
    assert_eq!(get(&addr, "/api/state", "Authorization: Bearer nope\r\n").0, 401);
    assert_eq!(get(&addr, "/?token=0123", "").0, 401);
    // A health check needs no token (it tells nothing but that the supervisor serves).
    assert_eq!(get(&addr, "/healthz", "").0, 200);
    let token = url.split("token=").nth(1).unwrap();
    let bearer = format!("Authorization: Bearer {token}\r\n");
    let (status, state) = get(&addr, "/api/state", &bearer);
    assert_eq!(status, 200, "{state}");
    assert!(
        state.contains(r#""name":"worker""#) && state.contains(r#""channel":"team""#),
        "{state}"
    );
    let rebinding = format!(
        "GET /api/state HTTP/1.1\r\nHost: evil.example:80\r\nConnection: close\r\n{bearer}\r\n"
    );
    assert_eq!(http(&addr, &rebinding).0, 403);
    // An action needs the token, and a browser's request from another site is refused even with
    // it (Origin or Sec-Fetch-Site); nothing is done.
    let act = |extra: &str| {
        http(
            &addr,
            &format!(
                "POST /api/agents/worker/restart HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
                 Content-Type: application/json\r\nContent-Length: 2\r\n{extra}\r\n{{}}"
            ),
        )
    };
    assert_eq!(act("").0, 401);
    let (status, body) = act(&format!("{bearer}Origin: http://evil.example\r\n"));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("another site"), "{body}");
    assert_eq!(act(&format!("{bearer}Sec-Fetch-Site: cross-site\r\n")).0, 403);
    assert_eq!(swarm.agent("worker")["restarts"], 0, "refused actions did nothing");
    let (status, body) = get(&addr, "/api/dead-letters", &bearer);
    assert_eq!((status, body.ends_with("[]")), (200, true), "{body}");
    // The memory view's reads: a search, the newest records, the tiers — behind the token too.
    let knowledge = swarm.state_dir().join("memory/knowledge");
    std::fs::create_dir_all(&knowledge).unwrap();
    std::fs::write(
        knowledge.join("trips.md"),
        "# Trips\n\nThe Lisbon trip leaves on the 3rd of May from gate 12.\n",
    )
    .unwrap();
    assert_eq!(get(&addr, "/api/memory?q=Lisbon", "").0, 401);
    let (status, body) = get(&addr, "/api/memory?q=Lisbon+trip", &bearer);
    assert!(status == 200 && body.contains("gate 12"), "{status} {body}");
    let (status, body) = get(&addr, "/api/memory?kind=knowledge", &bearer);
    assert!(status == 200 && body.contains("gate 12"), "{status} {body}");
    let (status, body) = get(&addr, "/api/memory?q=x&priority=urgent", &bearer);
    assert!(status == 400 && body.contains("no priority `urgent`"), "{status} {body}");
    let (status, body) = get(&addr, "/api/memory/stats", &bearer);
    assert!(status == 200 && body.contains(r#""files":1"#), "{status} {body}");

    let (_driver, driver_port) = start_driver(&driver);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async {
        let c = open_browser(driver_port, &chromium).await;
        // A wrong token in the URL shows the refusal, not the swarm.
        c.goto(&format!("http://{addr}/?token=wrong")).await.unwrap();
        let body = text_of(&c, "body").await.unwrap_or_default();
        assert!(body.contains("Wrong token"), "{body}");
        assert!(c.find(Locator::Css("#ps")).await.is_err(), "the page must not load");

        // The right URL: the token becomes a cookie and leaves the address bar.
        c.goto(&url).await.unwrap();
        let here = c.current_url().await.unwrap();
        assert!(!here.as_str().contains("token"), "{here}");
        for agent in ["coordinator", "worker"] {
            let css = format!("#ps tr[data-name='{agent}'] td.state-cell");
            wait_text(&c, &css, |t| t == "ready", SHORT).await;
        }
        wait_text(&c, "#live", |t| t == "live", SHORT).await;

        // The memory view: the newest records at first, then what a search finds.
        wait_text(&c, "#memory tbody", |t| t.contains("gate 12"), SHORT).await;
        wait_text(&c, "#memory-tiers", |t| t.contains("1 files"), SHORT).await;
        wait_text(&c, "#memory-status", |t| t.ends_with(" newest"), SHORT).await;
        let q = c.find(Locator::Css("#memory-q")).await.unwrap();
        q.send_keys("Lisbon trip").await.unwrap();
        c.find(Locator::Css("#memory-form button")).await.unwrap().click().await.unwrap();
        wait_text(&c, "#memory-status", |t| t.ends_with(" found, best first"), SHORT).await;
        let first = text_of(&c, "#memory tbody tr").await.unwrap_or_default();
        assert!(first.contains("gate 12"), "the best match first: {first}");

        // kill -9 → the restart shows within 2 s (the supervisor restarts in milliseconds).
        let restarts = |c: &Client| {
            let c = c.clone();
            async move { text_of(&c, "#ps tr[data-name='worker'] td.restarts").await }
        };
        assert_eq!(restarts(&c).await.as_deref(), Some("0"));
        let killed = Instant::now();
        swarm.kill9("worker");
        wait_text(&c, "#ps tr[data-name='worker'] td.restarts", |t| t == "1", SHORT).await;
        let seen = killed.elapsed();
        assert!(seen <= Duration::from_secs(2), "the restart took {seen:?} to show");

        // A post typed into the page lands in the channel, as the name given.
        let team = c.wait().for_element(Locator::Css("li[data-channel='team']")).await.unwrap();
        team.click().await.unwrap();
        let who = c.find(Locator::Css("#post-as")).await.unwrap();
        who.clear().await.unwrap();
        who.send_keys("carol").await.unwrap();
        let text = c.find(Locator::Css("#post-text")).await.unwrap();
        text.send_keys("status please @worker").await.unwrap();
        c.find(Locator::Css("#post-button")).await.unwrap().click().await.unwrap();
        wait_text(&c, "#messages", |t| t.contains("human:carol: status please @worker"), SHORT)
            .await;
        let read = swarm.ctl_ok(&["read", "#team"]);
        assert!(read.contains("human:carol: status please @worker"), "{read}");
        // The mention woke the worker; its answer reaches the page without a reload.
        wait_text(&c, "#messages", |t| t.contains("worker: worker here: all green"), LONG).await;

        // Each agent's activity is drawn from the samples the page takes (one every 2 s): its
        // memory as a line, its turns as bars — a turn of the worker's between two samples.
        // (Read in one script: the chart is redrawn at each sample, which would stale an element.)
        let spark = "#ps tr[data-name='worker'] td.activity svg";
        let read = format!(
            "const s = document.querySelector(\"{spark}\"); if (!s) return ['', 0]; \
             const l = s.querySelector('polyline.rss'); \
             return [l ? l.getAttribute('points') : '', s.querySelectorAll('rect.turns').length];"
        );
        let chart = |c: &Client| {
            let (c, read) = (c.clone(), read.clone());
            async move {
                let seen = c.execute(&read, vec![]).await.unwrap();
                let points = seen[0].as_str().unwrap_or_default().split(' ').count();
                (points, seen[1].as_u64().unwrap_or(0))
            }
        };
        let start = Instant::now();
        while chart(&c).await.0 < 2 {
            assert!(start.elapsed() < LONG, "no memory line after {LONG:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        swarm.ctl_ok(&["send", "worker", "one more turn"]);
        while chart(&c).await.1 == 0 {
            assert!(start.elapsed() < LONG, "no bar for the worker's turn: {:?}", chart(&c).await);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // The operator acts from the page. Restart: the worker comes back (restarts 1 → 2).
        let button = |c: &Client, act: &'static str| {
            let c = c.clone();
            async move {
                let css =
                    format!("#ps tr[data-name='worker'] button[data-act='{act}']:not([hidden])");
                c.wait().for_element(Locator::Css(&css)).await.unwrap().click().await.unwrap();
            }
        };
        button(&c, "restart").await;
        wait_text(&c, "#ps-status", |t| t.starts_with("worker is ready"), LONG).await;
        wait_text(&c, "#ps tr[data-name='worker'] td.restarts", |t| t == "2", SHORT).await;
        // Stop: it stays down (no restart), and the row offers start instead.
        button(&c, "stop").await;
        wait_text(&c, "#ps tr[data-name='worker'] td.state-cell", |t| t == "stopped", LONG).await;
        button(&c, "start").await;
        wait_text(&c, "#ps tr[data-name='worker'] td.state-cell", |t| t == "ready", LONG).await;
        let acts = swarm.ctl_ok(&["journal", "query", "agent=human:operator", "--json"]);
        for kind in ["AGENT_RESTART", "AGENT_STOP", "AGENT_START"] {
            assert!(acts.contains(kind), "{kind} journaled as the operator: {acts}");
        }

        // A permission request waiting for a person shows up; approving it from the page
        // decides it as the operator, with the reason typed.
        swarm.ctl_ok(&["send", "worker", "need the network"]);
        let row = "#approvals tr[data-id='1']";
        wait_text(&c, row, |t| t.contains("crates.io") && t.contains("network"), LONG).await;
        c.find(Locator::Css("#approval-reason"))
            .await
            .unwrap()
            .send_keys("fine for this build")
            .await
            .unwrap();
        c.find(Locator::Css(&format!("{row} button.approve")))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_text(&c, "#approval-status", |t| t.contains("#1 granted"), LONG).await;
        let all = swarm.ctl_ok(&["approvals", "--all", "--json"]);
        let all: serde_json::Value = serde_json::from_str(&all).unwrap();
        let one = all.as_array().unwrap().iter().find(|r| r["id"] == 1).unwrap().clone();
        assert_eq!(
            (one["state"].as_str(), one["decided_by"].as_str(), one["verdict_reason"].as_str()),
            (Some("granted"), Some("human:operator"), Some("fine for this build")),
            "{one}"
        );
        // The list is sampled every 200 ms: the decided request leaves it.
        wait_gone(&c, row, SHORT).await;

        // With everything on it, the page fits a 1280 px window: nothing scrolls sideways.
        let fit = "return [document.documentElement.scrollWidth, window.innerWidth];";
        let fit = c.execute(fit, vec![]).await.unwrap();
        let (wide, window) = (fit[0].as_u64().unwrap_or(0), fit[1].as_u64().unwrap_or(0));
        assert!(window <= 1280 && wide <= window, "the page is {wide} px wide in {window} px");

        if let Some(path) = std::env::var_os("FLOCK_DASHBOARD_SCREENSHOT") {
            std::fs::write(path, c.screenshot().await.unwrap()).unwrap();
        }
        c.close().await.unwrap();
    });
}
