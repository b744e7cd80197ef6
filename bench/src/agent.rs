//! The bench agents: small programs the supervisor starts through `command:` in a generated swarm
//! file (or the harness starts next to the raw relay). They connect exactly like `flock-agent`
//! (`FLOCK_*` environment, `Hello` with the spawn token), heartbeat, and then:
//!
//! - `sink`: counts at_most_once data messages, reports progress to the sender, acks durable
//!   deliveries (see [`crate::proto`] for the text protocol);
//! - `echo`: answers every request at once (`Ack { reply }`) and acks durable messages;
//! - `sender`: on `go`, sends `count` messages to `target`, `at_most_once` (windowed by the sink's
//!   progress) or `durable` (windowed by the router's `Accepted` answers);
//! - `requester`: on `go`, makes `warm + count` sequential requests (deadline: the swarm's
//!   default `request_timeout_ms`) and records each round trip.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use flock_ipc::{
    Body, Connection, Delivery, DeliveryKind, Frame, FrameReader, Hello, MsgId, OPERATOR, Outbox,
    PROTOCOL_VERSION, ROUTER, SendMode,
};
use serde_json::json;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::Notify;

use crate::proto::{self, Params, now_ns, percentile};

/// Frames the agent's own writer may have queued.
const OUTBOX_FRAMES: usize = 16 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Sink,
    Echo,
    Sender,
    Requester,
}

/// Runs one bench agent until the supervisor shuts it down or the connection closes.
pub fn main(mode: Mode) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let (name, conn) = connect().await?;
        let Connection { reader, outbox, welcome, writer: _writer } = conn;
        let every = Duration::from_millis(welcome.heartbeat_interval_ms.max(10));
        spawn_heartbeat(name.clone(), outbox.clone(), every);
        let agent = Agent { name, outbox, reader, batch: Vec::new() };
        match mode {
            Mode::Sink => sink(agent).await,
            Mode::Echo => echo(agent).await,
            Mode::Sender => sender(agent).await,
            Mode::Requester => requester(agent).await,
        }
    })
}

async fn connect() -> Result<(String, Connection)> {
    let get = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
    let socket = PathBuf::from(get(flock_ipc::env::SOCKET)?);
    let name = get(flock_ipc::env::AGENT)?;
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        agent_id: name.clone(),
        instance: get(flock_ipc::env::INSTANCE).unwrap_or_else(|_| "default".into()),
        pid: std::process::id(),
        // From the supervisor: handed over on a socket. From the bench's relay baseline, which
        // is not a supervisor: the environment.
        token: match flock_ipc::handoff::receive()?.remove(flock_ipc::env::TOKEN) {
            Some(t) => t,
            None => get(flock_ipc::env::TOKEN)?,
        },
    };
    let conn = Connection::agent(&socket, hello, OUTBOX_FRAMES)
        .await
        .map_err(|e| anyhow!("connect to {} as {name}: {e}", socket.display()))?;
    Ok((name, conn))
}

fn spawn_heartbeat(name: String, outbox: Outbox, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if outbox.send(Frame::new(&name, ROUTER, Body::Heartbeat)).await.is_err() {
                break;
            }
        }
    });
}

struct Agent {
    name: String,
    outbox: Outbox,
    reader: FrameReader<OwnedReadHalf>,
    batch: Vec<Frame>,
}

impl Agent {
    /// Next batch of frames; exits the process on `Shutdown` or when the router goes away.
    async fn next_batch(&mut self) -> Result<Vec<Frame>> {
        let mut batch = std::mem::take(&mut self.batch);
        batch.clear();
        match self.reader.read_batch(&mut batch).await {
            Ok(0) => std::process::exit(1),
            Ok(_) => {}
            Err(e) => bail!("router connection failed: {e}"),
        }
        if batch.iter().any(|f| matches!(f.body, Body::Shutdown)) {
            let _ = self.outbox.send(Frame::new(&self.name, ROUTER, Body::ShutdownAck)).await;
            // Let the writer flush the ShutdownAck.
            tokio::time::sleep(Duration::from_millis(20)).await;
            std::process::exit(0);
        }
        Ok(batch)
    }

    fn recycle(&mut self, batch: Vec<Frame>) {
        self.batch = batch;
    }

    async fn ack(&self, id: MsgId, reply: Option<String>) -> Result<()> {
        let frame = Frame {
            correlation_id: Some(id),
            ..Frame::new(&self.name, ROUTER, Body::Ack { reply })
        };
        self.outbox.send(frame).await.map_err(|_| anyhow!("writer closed"))
    }

    async fn send(&self, to: &str, text: String, mode: SendMode) -> Result<MsgId> {
        let frame = Frame::new(&self.name, to, Body::Send { text, mode });
        let id = frame.id;
        self.outbox.send(frame).await.map_err(|_| anyhow!("writer closed"))?;
        Ok(id)
    }
}

fn workspace_file(name: &str) -> PathBuf {
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")).join(name)
}

// ----------------------------------------------------------------------------------------------
// sink

#[derive(Default)]
struct SinkRun {
    count: u64,
    warm: u64,
    every: u64,
    warm_ns: u64,
    last_ns: u64,
}

async fn sink(mut a: Agent) -> Result<()> {
    let mut run = SinkRun::default();
    let mut reports: Vec<(String, String)> = Vec::new();
    loop {
        let mut batch = a.next_batch().await?;
        let now = now_ns();
        for frame in batch.drain(..) {
            let Body::Deliver(d) = &frame.body else { continue };
            if d.durable {
                a.ack(frame.id, None).await?;
            }
            if d.sender == OPERATOR {
                continue;
            }
            let text = d.text.as_str();
            if text.starts_with("d ") {
                if run.count == 0 {
                    let mut w = text.split(' ').skip(1);
                    run.warm = w.next().and_then(|s| s.parse().ok()).unwrap_or(0);
                    run.every = w.next().and_then(|s| s.parse().ok()).unwrap_or(1024).max(1);
                }
                run.count += 1;
                run.last_ns = now;
                if run.count == run.warm.max(1) {
                    run.warm_ns = now;
                }
                if run.count % run.every == 0 {
                    reports.push((d.sender.clone(), format!("p {}", run.count)));
                }
            } else if text == "end" {
                let measured = run.count.saturating_sub(run.warm.max(1));
                let ns = run.last_ns.saturating_sub(run.warm_ns);
                // The window's ends too (wall clock, shared by every process here), so a run
                // of many pairs can be measured over the interval they all shared.
                let text =
                    format!("final {} {measured} {ns} {} {}", run.count, run.warm_ns, run.last_ns);
                a.send(&d.sender, text, SendMode::Durable).await?;
                run = SinkRun::default();
            }
        }
        for (to, text) in reports.drain(..) {
            a.send(&to, text, SendMode::AtMostOnce).await?;
        }
        a.recycle(batch);
    }
}

// ----------------------------------------------------------------------------------------------
// echo

async fn echo(mut a: Agent) -> Result<()> {
    loop {
        let mut batch = a.next_batch().await?;
        for frame in batch.drain(..) {
            let Body::Deliver(Delivery { kind, durable, text, .. }) = frame.body else { continue };
            match kind {
                DeliveryKind::Request => a.ack(frame.id, Some(text)).await?,
                DeliveryKind::Message | DeliveryKind::Delta | DeliveryKind::Result if durable => {
                    a.ack(frame.id, None).await?
                }
                DeliveryKind::Message | DeliveryKind::Delta | DeliveryKind::Result => {}
            }
        }
        a.recycle(batch);
    }
}

// ----------------------------------------------------------------------------------------------
// sender

#[derive(Default)]
struct Shared {
    /// at_most_once: messages the sink counted. durable: `Accepted` answers.
    progress: AtomicU64,
    /// `Error` answers (at_most_once: drops; durable: refusals).
    errors: AtomicU64,
    /// Time when `progress + errors` first reached the warm-up count (durable runs).
    warm_ns: AtomicU64,
    done_ns: AtomicU64,
    wake: Notify,
    /// The sink's `final …` text (at_most_once runs).
    final_text: Mutex<Option<String>>,
    finished: Notify,
    /// Answers expected in total (durable runs).
    total: AtomicU64,
    warm: AtomicU64,
    durable: AtomicBool,
}

async fn sender(mut a: Agent) -> Result<()> {
    let shared = Arc::new(Shared::default());
    let mut running = false;
    loop {
        let mut batch = a.next_batch().await?;
        for frame in batch.drain(..) {
            match &frame.body {
                Body::Deliver(d) => {
                    if d.durable {
                        a.ack(frame.id, None).await?;
                    }
                    if d.sender == OPERATOR && d.text.starts_with("go") {
                        if running {
                            eprintln!("sender: a run is in progress; `go` ignored");
                            continue;
                        }
                        running = true;
                        let params = Params::parse(&d.text);
                        let (name, outbox, shared) =
                            (a.name.clone(), a.outbox.clone(), shared.clone());
                        tokio::spawn(async move {
                            if let Err(e) = send_run(&name, outbox, shared, params).await {
                                eprintln!("sender: run failed: {e:#}");
                            }
                        });
                    } else if let Some(n) = d.text.strip_prefix("p ") {
                        let n = n.parse().unwrap_or(0);
                        shared.progress.fetch_max(n, Ordering::Relaxed);
                        shared.wake.notify_one();
                    } else if d.text.starts_with("final ") {
                        *shared.final_text.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some(d.text.clone());
                        shared.finished.notify_one();
                        running = false;
                    }
                }
                Body::Accepted | Body::Error { .. } => {
                    if matches!(frame.body, Body::Accepted) {
                        shared.progress.fetch_add(1, Ordering::Relaxed);
                    } else {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if shared.durable.load(Ordering::Relaxed) {
                        let answered = shared.progress.load(Ordering::Relaxed)
                            + shared.errors.load(Ordering::Relaxed);
                        if answered == shared.warm.load(Ordering::Relaxed) {
                            shared.warm_ns.store(now_ns(), Ordering::Relaxed);
                        }
                        if answered == shared.total.load(Ordering::Relaxed) {
                            shared.done_ns.store(now_ns(), Ordering::Relaxed);
                            shared.finished.notify_one();
                            running = false;
                        }
                    }
                    shared.wake.notify_one();
                }
                _ => {}
            }
        }
        a.recycle(batch);
    }
}

/// One load run of the sender (a task next to the reader loop, which feeds `shared`).
async fn send_run(name: &str, outbox: Outbox, shared: Arc<Shared>, p: Params) -> Result<()> {
    let out = workspace_file(&proto::result_name(&p)?);
    let target = p.str("target")?.to_owned();
    let count = p.u64("count")?;
    let warm = p.u64_or("warm", 0)?;
    let window = p.u64_or("window", 16 * 1024)?.max(1);
    let every = p.u64_or("every", 1024)?.max(1);
    let frame_bytes = p.u64_or("frame", 150)? as usize;
    let durable = match p.str("mode")? {
        "durable" => true,
        "at_most_once" => false,
        other => bail!("mode={other}: expected durable or at_most_once"),
    };
    // Reset the shared counters before the first frame goes out.
    shared.progress.store(0, Ordering::Relaxed);
    shared.errors.store(0, Ordering::Relaxed);
    shared.warm_ns.store(0, Ordering::Relaxed);
    shared.done_ns.store(0, Ordering::Relaxed);
    shared.total.store(count, Ordering::Relaxed);
    shared.warm.store(warm.max(1), Ordering::Relaxed);
    shared.durable.store(durable, Ordering::Relaxed);
    *shared.final_text.lock().unwrap_or_else(|p| p.into_inner()) = None;

    let (mode, text) = if durable {
        (SendMode::Durable, proto::padded_text(name, &target, "m ", SendMode::Durable, frame_bytes))
    } else {
        (SendMode::AtMostOnce, proto::data_text(name, &target, warm, every, frame_bytes))
    };
    let send_bytes = proto::send_frame_size(name, &target, &text, mode);
    let started = Instant::now();
    let start_ns = now_ns();
    // With a window of one, each send waits for its answer: record those latencies.
    let sequential = window == 1;
    let mut latencies_ns = Vec::new();
    let accounted =
        || shared.progress.load(Ordering::Relaxed) + shared.errors.load(Ordering::Relaxed);
    for sent in 0..count {
        while sent - accounted().min(sent) >= window {
            shared.wake.notified().await;
        }
        let t = Instant::now();
        let frame = Frame::new(name, &target, Body::Send { text: text.clone(), mode });
        outbox.send(frame).await.map_err(|_| anyhow!("writer closed"))?;
        if sequential && durable {
            while accounted() <= sent {
                shared.wake.notified().await;
            }
            if sent >= warm {
                latencies_ns.push(t.elapsed().as_nanos() as u64);
            }
        }
    }
    latencies_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let send_secs = started.elapsed().as_secs_f64();
    let result = if durable {
        tokio::time::timeout(Duration::from_secs(120), shared.finished.notified())
            .await
            .map_err(|_| anyhow!("not every durable send was answered within 120 s"))?;
        let accepted = shared.progress.load(Ordering::Relaxed);
        let errors = shared.errors.load(Ordering::Relaxed);
        let warm_ns = if warm == 0 { start_ns } else { shared.warm_ns.load(Ordering::Relaxed) };
        let ns = shared.done_ns.load(Ordering::Relaxed).saturating_sub(warm_ns).max(1);
        let measured = count - warm.min(count);
        json!({
            "mode": "durable",
            "sent": count,
            "accepted": accepted,
            "errors": errors,
            "measured": measured,
            "measured_ns": ns,
            "msgs_per_sec": measured as f64 / (ns as f64 / 1e9),
            "send_frame_bytes": send_bytes,
            "window": window,
            "send_secs": send_secs,
            "latency_p50_us": us(percentile(&latencies_ns, 50.0)),
            "latency_p99_us": us(percentile(&latencies_ns, 99.0)),
        })
    } else {
        let end =
            Frame::new(name, &target, Body::Send { text: "end".into(), mode: SendMode::Durable });
        outbox.send(end).await.map_err(|_| anyhow!("writer closed"))?;
        tokio::time::timeout(Duration::from_secs(120), shared.finished.notified())
            .await
            .map_err(|_| anyhow!("the sink sent no `final` within 120 s"))?;
        let fin =
            shared.final_text.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_default();
        let f: Vec<u64> = fin.split(' ').skip(1).filter_map(|s| s.parse().ok()).collect();
        let [received, measured, ns, warm_at_ns, last_at_ns] = f[..] else {
            bail!("bad final message: {fin}")
        };
        let drops = shared.errors.load(Ordering::Relaxed);
        json!({
            "mode": "at_most_once",
            "sent": count,
            "received": received,
            "dropped": drops,
            "measured": measured,
            "measured_ns": ns,
            "warm_at_ns": warm_at_ns,
            "last_at_ns": last_at_ns,
            "msgs_per_sec": measured as f64 / (ns.max(1) as f64 / 1e9),
            "send_frame_bytes": send_bytes,
            "window": window,
            "send_secs": send_secs,
        })
    };
    proto::write_result(&out, &result)
}

// ----------------------------------------------------------------------------------------------
// requester

async fn requester(mut a: Agent) -> Result<()> {
    loop {
        let mut batch = a.next_batch().await?;
        let mut go = None;
        for frame in batch.drain(..) {
            if let Body::Deliver(d) = &frame.body {
                if d.durable {
                    a.ack(frame.id, None).await?;
                }
                if d.sender == OPERATOR && d.text.starts_with("go") {
                    go = Some(Params::parse(&d.text));
                }
            }
        }
        a.recycle(batch);
        if let Some(p) = go {
            let out = workspace_file(&proto::result_name(&p)?);
            let result = request_run(&mut a, &p).await?;
            proto::write_result(&out, &result)?;
        }
    }
}

async fn request_run(a: &mut Agent, p: &Params) -> Result<serde_json::Value> {
    let target = p.str("target")?.to_owned();
    let count = p.u64("count")?;
    let warm = p.u64_or("warm", 0)?;
    let frame_bytes = p.u64_or("frame", 150)? as usize;
    let text = proto::padded_text(&a.name, &target, "q ", SendMode::Durable, frame_bytes);
    let me = a.name.clone();
    let request = |text: &str| {
        Frame::new(&me, &target, Body::Request { text: text.to_owned(), timeout_ms: 0 })
    };
    let request_bytes = proto::frame_size(&request(&text));
    let mut rtts_ns = Vec::with_capacity(count as usize);
    let mut errors = 0u64;
    let started = Instant::now();
    for i in 0..warm + count {
        let frame = request(&text);
        let id = frame.id;
        let t = Instant::now();
        a.outbox.send(frame).await.map_err(|_| anyhow!("writer closed"))?;
        'wait: loop {
            let mut batch = a.next_batch().await?;
            let mut answered = false;
            for frame in batch.drain(..) {
                match &frame.body {
                    Body::Reply { .. } if frame.correlation_id == Some(id) => answered = true,
                    Body::Error { .. } if frame.correlation_id == Some(id) => {
                        errors += 1;
                        answered = true;
                    }
                    Body::Deliver(d) if d.durable => a.ack(frame.id, None).await?,
                    _ => {}
                }
            }
            a.recycle(batch);
            if answered {
                break 'wait;
            }
        }
        if i >= warm {
            rtts_ns.push(t.elapsed().as_nanos() as u64);
        }
    }
    let total_secs = started.elapsed().as_secs_f64();
    let mean_ns = rtts_ns.iter().sum::<u64>() / rtts_ns.len().max(1) as u64;
    rtts_ns.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    Ok(json!({
        "count": count,
        "warm": warm,
        "sent": warm + count,
        "errors": errors,
        "p50_us": us(percentile(&rtts_ns, 50.0)),
        "p90_us": us(percentile(&rtts_ns, 90.0)),
        "p99_us": us(percentile(&rtts_ns, 99.0)),
        "p999_us": us(percentile(&rtts_ns, 99.9)),
        "max_us": us(rtts_ns.last().copied().unwrap_or(0)),
        "mean_us": us(mean_ns),
        "request_frame_bytes": request_bytes,
        "total_secs": total_secs,
    }))
}
