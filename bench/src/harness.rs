//! The harness: starts real supervisors, agents and the raw relay, drives the load, collects the
//! figures and prints them (a table, or one JSON object with `--json`).

use std::time::Instant;

use anyhow::{Result, bail};
use serde_json::{Map, Value, json};

/// Progress goes to stderr so that `--json` keeps stdout clean.
macro_rules! say {
    ($($t:tt)*) => { eprintln!("flock-bench: {}", format!($($t)*)) };
}

mod cluster;
mod fixture;
mod io;
mod lifecycle;
mod memory_cli;
mod scale;

pub use fixture::RunArgs;
use fixture::{Bins, num, round3};
use io::{io_swarm, observe, raw_relay, ui_latency};
use lifecycle::{bridge, durable, lifecycle};

pub fn main(args: RunArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(run(args))
}

async fn run(args: RunArgs) -> Result<()> {
    let started = Instant::now();
    const FIGURES: [&str; 17] = [
        "routed",
        "raw",
        "durable",
        "request",
        "up",
        "restart",
        "rss",
        "sandbox",
        "memory",
        "memory_cli",
        "recall",
        "bridge",
        "observe",
        "ui",
        "cluster",
        "scale",
        "memory_real",
    ];
    if let Some(bad) = args.only.iter().find(|o| !FIGURES.contains(&o.as_str())) {
        bail!("--only {bad}: choose among {}", FIGURES.join(","));
    }
    let bins = Bins::find(args.bin_dir.as_deref())?;
    let root = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    if root.exists() {
        std::fs::remove_dir_all(&root)?;
    }
    std::fs::create_dir_all(&root)?;
    let want = |what: &str| args.only.is_empty() || args.only.iter().any(|o| o == what);
    let mut out = Map::new();
    out.insert("cpus".into(), json!(std::thread::available_parallelism().map_or(0, |n| n.get())));
    out.insert("frame_bytes".into(), json!(args.frame_bytes));

    let result = async {
        if want("routed") || want("request") {
            io_swarm(&bins, &root, &args, &mut out, want("routed"), want("request")).await?;
        }
        if want("raw") {
            raw_relay(&bins, &root, &args, &mut out).await?;
        }
        if want("durable") {
            durable(&bins, &root, &args, &mut out).await?;
        }
        // Like cluster, only when named: it starts a thousand processes.
        if args.only.iter().any(|o| o == "scale") {
            scale::scale(&bins, &root, &args, &mut out).await?;
        }
        if want("sandbox") {
            let helper = bins.supervisor.with_file_name("flock-sandbox");
            crate::sandbox::run(&helper, &root, args.exec_runs, &mut out).await?;
        }
        if want("memory") {
            say!("memory: indexing 100 000 observations, then 200 searches");
            crate::memory::run(&root, 100_000, crate::memory::Vectors::Imported, &mut out)?;
        }
        // Only when named: embedding 100 000 records for real takes ~40 min of both cores.
        if args.only.iter().any(|o| o == "memory_real") {
            say!(
                "memory: 100 000 observations embedded for real (progress below), then 200 searches"
            );
            crate::memory::run(&root, 100_000, crate::memory::Vectors::Embedded, &mut out)?;
        }
        if want("memory_cli") {
            say!("memory search: flockctl on a running swarm, then without one");
            memory_cli::memory_cli(&bins, &root, 50, &mut out).await?;
        }
        if want("recall") {
            say!("recall: LongMemEval-style fixture (seed {})", crate::recall::SEED);
            crate::recall::run(&root, args.keep, &mut out)?;
        }
        if want("bridge") {
            bridge(&bins, &root, args.bridge_messages, &mut out).await?;
        }
        if want("observe") {
            observe(&bins, &root, &args, &mut out).await?;
        }
        if want("ui") {
            ui_latency(&bins, &root, args.ui_changes, &mut out).await?;
        }
        // Only when named: it needs a NATS server.
        if args.only.iter().any(|o| o == "cluster") {
            cluster::cluster(&bins, &root, &args, &mut out).await?;
        }
        if want("up") || want("restart") || want("rss") {
            lifecycle(&bins, &root, &args, &mut out, want("up"), want("restart"), want("rss"))
                .await?;
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    if args.keep {
        say!("state dirs kept in {}", root.display());
    } else {
        let _ = std::fs::remove_dir_all(&root);
    }
    result?;

    if let (Some(r), Some(b)) =
        (num(&out, "routed_send_msgs_per_sec"), num(&out, "raw_relay_msgs_per_sec"))
    {
        out.insert("routed_vs_raw_relay".into(), json!(round3(r / b)));
    }
    out.insert("bench_secs".into(), json!(round3(started.elapsed().as_secs_f64())));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Object(out))?);
    } else {
        print_table(&out);
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------------
// swarm files and processes

// ----------------------------------------------------------------------------------------------
// figures

// ----------------------------------------------------------------------------------------------
// the table

fn print_table(out: &Map<String, Value>) {
    let get = |k: &str| num(out, k);
    let raw = get("raw_relay_msgs_per_sec");
    let thousands = |x: f64| {
        let s = format!("{:.0}", x);
        let mut r = String::new();
        for (i, c) in s.chars().enumerate() {
            if i > 0 && (s.len() - i) % 3 == 0 {
                r.push(' ');
            }
            r.push(c);
        }
        r
    };
    let vs_raw = |x: f64| raw.map_or(String::new(), |b| format!("{:.2}× raw relay", x / b));
    let mark = |ok: bool| if ok { "ok" } else { "MISSED" };
    println!(
        "Flock benchmarks ({} CPUs, {}-byte frames, {} s)",
        get("cpus").unwrap_or(0.0),
        get("frame_bytes").unwrap_or(0.0),
        get("bench_secs").unwrap_or(0.0)
    );
    let (figure, measured, target, blank) = ("figure", "measured", "target", "");
    println!("{figure:<38} {measured:>18} {target:>16} {blank:>7}  vs baseline");
    let row = |what: &str, measured: String, target: &str, ok: Option<bool>, cmp: String| {
        println!("{what:<38} {measured:>18} {target:>16} {:>7}  {cmp}", ok.map_or("", mark));
    };
    let ms = |k: &str| {
        let us = |p: &str| get(&format!("{k}_{p}_us")).map(|x| x / 1000.0);
        us("p50").zip(us("p95"))
    };
    let base = ms("exec_baseline").map(|(p50, _)| p50);
    let vs_sh = |p50: f64| {
        base.map_or(String::new(), |b| format!("{:.1}× sh -c true ({b:.2} ms)", p50 / b))
    };
    for (key, what, target) in [
        ("exec_native", "exec true, native sandbox p50/p95", 15.0),
        ("exec_docker", "exec true, docker sandbox p50/p95", 400.0),
    ] {
        if let Some((p50, p95)) = ms(key) {
            let t = format!("p50 ≤ {target} ms");
            row(what, format!("{p50:.2}/{p95:.2} ms"), &t, Some(p50 <= target), vs_sh(p50));
        }
    }
    if let (Some(on), Some(off), Some(ratio)) =
        (get("observe_on_msgs_per_sec"), get("observe_off_msgs_per_sec"), get("observe_on_vs_off"))
    {
        let cmp = format!("{ratio:.3}× tracing off ({} msg/s)", thousands(off));
        let what = "routed, tracing info + metrics on";
        row(what, format!("{} msg/s", thousands(on)), "≥ 0.95× off", Some(ratio >= 0.95), cmp);
    }
    if let (Some(p50), Some(p95)) = (get("ui_update_p50_ms"), get("ui_update_p95_ms")) {
        let what = "dashboard: kill -9 → page event p50/p95";
        row(
            what,
            format!("{p50:.0}/{p95:.0} ms"),
            "p95 ≤ 1 000 ms",
            Some(p95 <= 1000.0),
            String::new(),
        );
    }
    if let (Some(p50), Some(p95)) = (get("memory_search_p50_ms"), get("memory_search_p95_ms")) {
        let cmp = get("memory_scan_p50_ms")
            .map_or(String::new(), |b| format!("{:.3}× file scan ({b:.0} ms)", p50 / b));
        let what = format!(
            "BM25 search, {} records p50/p95",
            thousands(get("memory_records").unwrap_or(0.0))
        );
        row(&what, format!("{p50:.2}/{p95:.2} ms"), "p95 ≤ 150 ms", Some(p95 <= 150.0), cmp);
    }
    if let (Some(p50), Some(p95)) = (get("memory_cli_p50_ms"), get("memory_cli_p95_ms")) {
        let mut cmp = get("memory_cli_no_swarm_p50_ms").map_or(String::new(), |b| {
            format!("{:.3}× no swarm (model loaded per search: {b:.0} ms)", p50 / b)
        });
        if let Some(first) = get("memory_cli_first_ms") {
            cmp.push_str(&format!("; first after up {first:.0} ms"));
        }
        let what = "flockctl memory search, 1 000 records, p50/p95";
        row(what, format!("{p50:.0}/{p95:.0} ms"), "p95 ≤ 300 ms", Some(p95 <= 300.0), cmp);
    }
    for (set, (key, label, target)) in ["recall", "recall_heldout"].into_iter().flat_map(|set| {
        [("bm25", "BM25", ""), ("vector", "vectors", ""), ("hybrid", "hybrid", "@5 ≥ 0.95")]
            .map(|m| (set, m))
    }) {
        let (Some(a5), Some(a10)) =
            (get(&format!("{set}_{key}_at5")), get(&format!("{set}_{key}_at10")))
        else {
            continue;
        };
        let what = format!(
            "recall@5/@10 {label} ({} q{}, {} sessions)",
            get(&format!("{set}_questions")).unwrap_or(0.0),
            if set == "recall" { "" } else { " held-out" },
            get(&format!("{set}_sessions")).unwrap_or(0.0)
        );
        let ok = (!target.is_empty()).then_some(a5 >= 0.95);
        row(&what, format!("{a5:.3}/{a10:.3}"), target, ok, String::new());
    }
    if let (Some(p50), Some(p95)) = (get("memory_hybrid_p50_ms"), get("memory_hybrid_p95_ms")) {
        let what = format!(
            "hybrid search, {} records p50/p95",
            thousands(get("memory_records").unwrap_or(0.0))
        );
        let cmp = get("memory_rss_kib")
            .map_or(String::new(), |k| format!("bench RSS {:.0} MiB", k / 1024.0));
        row(&what, format!("{p50:.2}/{p95:.2} ms"), "p95 ≤ 150 ms", Some(p95 <= 150.0), cmp);
    }
    if let Some(x) = get("memory_embed_per_sec") {
        let mut cmp = get("memory_embed_passages_per_sec")
            .map_or(String::new(), |p| format!("{p:.0} passages/s, "));
        if let Some(q) = get("memory_embed_query_ms") {
            cmp.push_str(&format!("query {q:.0} ms"));
        }
        row("embedding, 3-sentence records (batch 16)", format!("{x:.0} records/s"), "", None, cmp);
    }
    if let (Some(n), Some(s)) = (get("memory_embedded_texts"), get("memory_embed_all_s")) {
        let rate = get("memory_embed_all_per_sec").unwrap_or(0.0);
        let what = format!("every record embedded for real ({} texts)", thousands(n));
        row(&what, format!("{:.1} min", s / 60.0), "", None, format!("{rate:.0} records/s"));
    }
    if let Some(ms) = get("memory_rebuild_ms") {
        row(
            "memory index rebuild from files",
            format!("{:.1} s", ms / 1000.0),
            "",
            None,
            String::new(),
        );
    }
    if let (Some(p50), Some(p99)) = (get("bridge_relay_p50_ms"), get("bridge_relay_p99_ms")) {
        let what = format!(
            "bridge chat → channel → chat, {:.0} msgs p50/p99",
            get("bridge_messages").unwrap_or(0.0)
        );
        let cmp = match (get("bridge_bare_bot_p50_ms"), get("bridge_bare_bot_p99_ms")) {
            (Some(b50), Some(b99)) => {
                format!("bare bot {b50:.2}/{b99:.2} ms ({:.1}× p50)", p50 / b50)
            }
            _ => String::new(),
        };
        row(&what, format!("{p50:.2}/{p99:.2} ms"), "", None, cmp);
    }
    for (key, base_key, what) in [
        ("fs_write_4k", "std_write_4k", "fs_write 4 KiB p50"),
        ("fs_read_4k", "std_read_4k", "fs_read 4 KiB p50"),
    ] {
        if let (Some((p50, _)), Some((b, _))) = (ms(key), ms(base_key)) {
            let cmp = format!("{:.1}× std::fs ({:.1} µs)", p50 / b, b * 1000.0);
            row(what, format!("{:.1} µs", p50 * 1000.0), "", None, cmp);
        }
    }
    if let Some(x) = get("routed_send_msgs_per_sec") {
        row(
            "routed at_most_once send",
            format!("{} msg/s", thousands(x)),
            "≥ 300 000",
            Some(x >= 300_000.0),
            vs_raw(x),
        );
    }
    if let Some(x) = raw {
        row(
            "raw socket relay (baseline)",
            format!("{} msg/s", thousands(x)),
            "",
            None,
            "1.00× raw relay".into(),
        );
    }
    if let Some(x) = get("durable_send_msgs_per_sec") {
        row(
            "durable agents__send (accepted)",
            format!("{} msg/s", thousands(x)),
            "≥ 50 000",
            Some(x >= 50_000.0),
            vs_raw(x),
        );
    }
    if let (Some(p50), Some(p99)) =
        (get("durable_send_latency_p50_us"), get("durable_send_latency_p99_us"))
    {
        row(
            "  one at a time: accept latency p50/p99",
            format!("{p50:.0}/{p99:.0} µs"),
            "",
            None,
            String::new(),
        );
    }
    if let Some(x) = get("durable_delivered_msgs_per_sec") {
        let accepted = get("durable_send_msgs_per_sec").unwrap_or(f64::INFINITY);
        let window = get("durable_delivery_window").unwrap_or(1.0);
        let vs_one = get("durable_delivered_window1_msgs_per_sec")
            .map(|one| format!("{:.2}× window 1", x / one.max(1.0)))
            .unwrap_or_default();
        row(
            &format!("  delivered + acked (window {window})"),
            format!("{} msg/s", thousands(x)),
            "≥ 100 000, ≥ 50 % of accepted",
            Some(x >= 100_000.0 && x >= accepted / 2.0),
            vs_one,
        );
    }
    if let Some(x) = get("durable_delivered_window1_msgs_per_sec") {
        row(
            "  delivered + acked (window 1, baseline)",
            format!("{} msg/s", thousands(x)),
            "",
            None,
            String::new(),
        );
    }
    if let (Some(x), Some(bare), Some(one)) = (
        get("cluster_delivered_msgs_per_sec"),
        get("cluster_bare_publish_msgs_per_sec"),
        get("cluster_one_host_delivered_msgs_per_sec"),
    ) {
        let ratio = x / bare.max(1.0);
        row(
            "durable across hosts (delivered + acked)",
            format!("{} msg/s", thousands(x)),
            "≥ 0.5× bare",
            Some(ratio >= 0.5),
            format!("{ratio:.2}× bare JetStream publish-with-ack ({} msg/s)", thousands(bare)),
        );
        row(
            "  the same on one host",
            format!("{} msg/s", thousands(one)),
            "",
            None,
            format!("across hosts {:.2}× one host", x / one.max(1.0)),
        );
        if let Some(a) = get("cluster_accepted_msgs_per_sec") {
            row(
                "  accepted on the sending host",
                format!("{} msg/s", thousands(a)),
                "",
                None,
                String::new(),
            );
        }
    }
    if let (Some(p50), Some(p99)) =
        (get("cluster_request_rtt_p50_us"), get("cluster_request_rtt_p99_us"))
    {
        let beside = |k: &str| get(k).map_or(String::new(), |b| format!("{b:.1} µs"));
        row(
            "request across hosts, round trip p50",
            format!("{p50:.1} µs"),
            "≤ 2 ms",
            Some(p50 <= 2000.0),
            format!(
                "one host {}, bare NATS request-reply {}",
                beside("cluster_one_host_request_rtt_p50_us"),
                beside("cluster_bare_request_rtt_p50_us")
            ),
        );
        row(
            "  p99",
            format!("{p99:.1} µs"),
            "",
            None,
            format!(
                "one host {}, bare NATS request-reply {}",
                beside("cluster_one_host_request_rtt_p99_us"),
                beside("cluster_bare_request_rtt_p99_us")
            ),
        );
    }
    if let (Some(p50), Some(p99)) = (get("request_rtt_p50_us"), get("request_rtt_p99_us")) {
        let vs = |k: &str, x: f64| {
            get(k).map_or(String::new(), |b| format!("{:.2}× raw relay ({b:.1} µs)", x / b))
        };
        row(
            "agents__request round trip p50",
            format!("{p50:.1} µs"),
            "≤ 100 µs",
            Some(p50 <= 100.0),
            vs("raw_relay_request_rtt_p50_us", p50),
        );
        row(
            "agents__request round trip p99",
            format!("{p99:.1} µs"),
            "≤ 1 000 µs",
            Some(p99 <= 1000.0),
            vs("raw_relay_request_rtt_p99_us", p99),
        );
    }
    if let Some(x) = get("up_to_ready_ms") {
        row(
            "up → 7 agents ready",
            format!("{x:.1} ms"),
            "≤ 500 ms",
            Some(x <= 500.0),
            String::new(),
        );
    }
    if let Some(x) = get("restart_to_ready_ms") {
        let mut detail =
            get("restart_to_ready_max_ms").map_or(String::new(), |m| format!("max {m:.1} ms"));
        if let (Some(u), Some(r)) =
            (get("restart_to_ready_uncaged_ms"), get("restart_caged_over_uncaged"))
        {
            detail.push_str(&format!("; uncaged {u:.1} ms, caged/uncaged {r:.2}×"));
        }
        row(
            "kill -9 → ready again (median, caged)",
            format!("{x:.1} ms"),
            "≤ 250 ms",
            Some(x <= 250.0),
            detail,
        );
    }
    if let Some(x) = get("idle_agent_rss_bytes") {
        let mb = x / (1024.0 * 1024.0);
        let detail = get("idle_agent_rss_max_bytes")
            .map_or(String::new(), |m| format!("max {:.1} MiB", m / 1048576.0));
        row(
            "idle flock-agent RSS (median of 7)",
            format!("{mb:.1} MiB"),
            "≤ 15 MB",
            Some(x <= 15e6),
            detail,
        );
    }
    if let (Some(private), Some(pss)) =
        (get("idle_agent_private_bytes"), get("idle_agent_pss_bytes"))
    {
        let anon = get("idle_agent_anon_bytes").unwrap_or(0.0);
        row(
            "  its own pages (private) / its share (PSS)",
            format!("{:.1} / {:.1} MiB", private / 1048576.0, pss / 1048576.0),
            "",
            None,
            format!("anonymous {:.1} MiB", anon / 1048576.0),
        );
    }
    if let Some(n) = get("scale_agents") {
        let n = n as usize;
        let pair =
            |what: &str| (get(&format!("scale_{n}_{what}")), get(&format!("scale_10_{what}")));
        let parallel = get("scale_parallel").unwrap_or(1.0);
        let up = format!("up → all ready (parallel {parallel})");
        let scale_rows: [(&str, &str, &str, f64, f64); 5] = [
            (&up, "up_ms", "≤ 5 000 ms", 5000.0, 1.0),
            ("ps (p50)", "ps_p50_ms", "≤ 100 ms", 100.0, 1.0),
            ("supervisor RSS", "supervisor_rss_bytes", "≤ 200 MB", 200e6, 1048576.0),
            ("kill -9 of a tenth at once → all ready", "storm_ms", "≤ 2 000 ms", 2000.0, 1.0),
            ("down → supervisor gone", "down_ms", "", f64::INFINITY, 1.0),
        ];
        for (what, key, target, limit, unit) in scale_rows {
            if let (Some(x), Some(base)) = pair(key) {
                let shown = |v: f64| {
                    if unit > 1.0 { format!("{:.1} MiB", v / unit) } else { format!("{v:.1} ms") }
                };
                row(
                    &format!("{n} agents: {what}"),
                    shown(x),
                    target,
                    limit.is_finite().then_some(x <= limit),
                    format!("10 agents: {}", shown(base)),
                );
            }
        }
        if let (Some(x), Some(base)) =
            (get(&format!("scale_{n}_routed_msgs_per_sec")), get("scale_10_routed_msgs_per_sec"))
        {
            let pairs = get(&format!("scale_{n}_routed_pairs")).unwrap_or(0.0);
            row(
                &format!("{n} agents: routed, {pairs} pairs at once"),
                format!("{x:.0} msg/s"),
                "≥ 70 % of 2",
                Some(x >= 0.7 * base),
                format!("2 agents: {base:.0} msg/s ({:.0} %)", 100.0 * x / base.max(1.0)),
            );
        }
        if let (Some(idle), Some(load)) = (
            get(&format!("scale_{n}_supervisor_cpu_idle_pct")),
            get(&format!("scale_{n}_supervisor_cpu_load_pct")),
        ) {
            row(
                &format!("{n} agents: supervisor CPU rest / load"),
                format!("{idle:.1} / {load:.0} %"),
                "",
                None,
                format!(
                    "10 agents: {:.1} / {:.0} %",
                    get("scale_10_supervisor_cpu_idle_pct").unwrap_or(0.0),
                    get("scale_10_supervisor_cpu_load_pct").unwrap_or(0.0)
                ),
            );
        }
        if let Some(x) = get(&format!("scale_{n}_ordered_up_ms")) {
            let down = get(&format!("scale_{n}_ordered_down_ms")).unwrap_or(0.0);
            row(
                &format!("{n} agents: up → all ready (parallel 1)"),
                format!("{x:.1} ms"),
                "",
                None,
                format!("down {down:.1} ms"),
            );
        }
    }
    if let Some(x) = get("routed_send_dropped")
        && x > 0.0
    {
        println!("note: {x} at_most_once messages were dropped by the router (target outbox full)");
    }
}
