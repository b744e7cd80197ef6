//! `GET /metrics`: the Prometheus/OpenMetrics exposition. Event metrics come from the actors'
//! process-wide registry ([`flock_actors::metrics`]); everything else is read at scrape time from
//! what `flockctl ps` shows and the router's own counters, so scraping costs the swarm nothing
//! between scrapes. Names and labels: docs/observability.md.

use flock_actors::RouterMsg;
use flock_ipc::PsRow;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use crate::control::ControlCtx;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Proc {
    /// The `ps` name: an agent, `flock-model`, `bridge-NAME`, `supervisor`.
    name: String,
    /// agent, process (the model), bridge, supervisor.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostState {
    host: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcState {
    name: String,
    kind: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentTokens {
    agent: String,
    direction: String,
}

/// The OpenMetrics content type Prometheus negotiates for this format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The classic Prometheus text format, for every client that does not ask for OpenMetrics.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a scrape's `Accept` header asks for OpenMetrics (Prometheus does; curl and most other
/// clients do not, and get the classic format).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.to_ascii_lowercase().contains("application/openmetrics-text"))
}

/// The classic text format of an OpenMetrics exposition: a counter family is named after its
/// samples (`# TYPE flock_restarts_total counter`, so classic parsers do not read it as untyped),
/// `unknown` is `untyped`, and the `# UNIT` and `# EOF` lines that format lacks are left out.
pub fn classic(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, "counter")) = rest.split_once(' ')
        {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            let tail = if *tag == "# TYPE " && tail == "unknown" { "untyped" } else { tail };
            let name = if counters.contains(name) { format!("{name}_total") } else { name.into() };
            Some(format!("{tag}{name} {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The whole exposition, as the body of a scrape.
pub async fn scrape(ctx: &ControlCtx) -> String {
    let mut registry = Registry::default();
    flock_actors::metrics::get().register(&mut registry);

    if let Ok((_, counters)) = ractor::call!(ctx.router, RouterMsg::Snapshot) {
        let counter = |v: u64| {
            let c: Counter = Counter::default();
            c.inc_by(v);
            c
        };
        let gauge = |v: u64| {
            let g: Gauge = Gauge::default();
            g.set(v as i64);
            g
        };
        registry.register(
            "flock_messages_routed",
            "Deliveries handed to agents' connections by the router",
            counter(counters.routed),
        );
        registry.register(
            "flock_frames_dropped",
            "Answers the router could not queue to a connection that was full or gone",
            counter(counters.dropped),
        );
        registry.register(
            "flock_chains_stopped",
            "Chains of turns stopped by a budget (hops, tokens or wall time)",
            counter(counters.chains_stopped),
        );
        registry.register(
            "flock_chains_in_flight",
            "Chains of turns in flight now",
            gauge(counters.chains_live),
        );
    }

    let rows: Vec<PsRow> = match crate::control::ps(ctx).await {
        Ok(flock_ipc::ControlReply::Ps(rows)) => rows,
        _ => Vec::new(),
    };
    let up = Family::<ProcState, Gauge>::default();
    let mailbox = Family::<Proc, Gauge>::default();
    let restarts = Family::<Proc, Counter>::default();
    let turns = Family::<Proc, Counter>::default();
    let rss = Family::<Proc, Gauge>::default();
    let cpu = Family::<Proc, Counter<f64>>::default();
    let tokens = Family::<AgentTokens, Counter>::default();
    // Across hosts, each host reports its own processes (scrape every host); the hosts as this
    // one sees them are `flock_host_up`.
    let me = ctx.cluster.as_ref().map(|h| h.me().to_owned());
    let hosts = Family::<HostState, Gauge>::default();
    for r in rows.iter().filter(|r| r.kind == "host") {
        let state = HostState { host: r.name.clone(), state: r.state.clone() };
        hosts.get_or_create(&state).set(i64::from(r.state == "up"));
    }
    let here = |r: &&PsRow| r.host.is_none() || r.host == me;
    for r in
        rows.iter().filter(here).filter(|r| !matches!(r.kind.as_str(), "actor" | "chains" | "host"))
    {
        let proc = Proc { name: r.name.clone(), kind: r.kind.clone() };
        let state =
            ProcState { name: r.name.clone(), kind: r.kind.clone(), state: r.state.clone() };
        up.get_or_create(&state).set(i64::from(r.pid.is_some()));
        mailbox.get_or_create(&proc).set(r.mailbox_depth as i64);
        restarts.get_or_create(&proc).inc_by(u64::from(r.restarts));
        if r.kind == "agent" || r.kind == "bridge" {
            turns.get_or_create(&proc).inc_by(r.turns_total);
        }
        if let Some(b) = r.rss_bytes {
            rss.get_or_create(&proc).set(b as i64);
        }
        if let Some(s) = r.pid.and_then(crate::spawn::cpu_seconds) {
            cpu.get_or_create(&proc).inc_by(s);
        }
        if r.kind == "agent" {
            for (direction, n) in [("in", r.tokens_in), ("out", r.tokens_out)] {
                let labels = AgentTokens { agent: r.name.clone(), direction: direction.into() };
                tokens.get_or_create(&labels).inc_by(n);
            }
        }
    }
    if me.is_some() {
        registry.register(
            "flock_host_up",
            "1 when a host of the swarm writes its status (with its state as a label: up, lost, \
             down, unknown), 0 when it does not",
            hosts,
        );
    }
    registry.register(
        "flock_process_up",
        "1 when the process runs (with its state as a label), 0 when it does not",
        up,
    );
    registry.register(
        "flock_mailbox_depth",
        "Inputs waiting for an agent, the one in flight included (a bridge: posts waiting to go out)",
        mailbox,
    );
    registry.register("flock_restarts", "Restarts of a supervised process", restarts);
    registry.register(
        "flock_agent_turns",
        "Turns an agent has finished (a bridge: messages relayed)",
        turns,
    );
    registry.register_with_unit(
        "flock_process_resident_memory",
        "Resident memory of a process",
        Unit::Bytes,
        rss,
    );
    registry.register_with_unit(
        "flock_process_cpu",
        "CPU time (user + system) a process has used",
        Unit::Seconds,
        cpu,
    );
    registry.register(
        "flock_agent_tokens",
        "Model tokens an agent has used since the swarm's first start, by direction",
        tokens,
    );

    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_classic_format_names_counters_after_their_samples_and_drops_what_it_lacks() {
        let om = "# HELP flock_restarts Restarts.\n# TYPE flock_restarts counter\n\
                  flock_restarts_total{name=\"w\"} 1\n\
                  # HELP flock_process_cpu_seconds CPU.\n# TYPE flock_process_cpu_seconds counter\n\
                  # UNIT flock_process_cpu_seconds seconds\nflock_process_cpu_seconds_total 0.5\n\
                  # HELP flock_mailbox_depth Depth.\n# TYPE flock_mailbox_depth gauge\n\
                  flock_mailbox_depth 0\n# TYPE odd unknown\nodd 1\n# EOF\n";
        let text = classic(om);
        assert_eq!(
            text,
            "# HELP flock_restarts_total Restarts.\n# TYPE flock_restarts_total counter\n\
             flock_restarts_total{name=\"w\"} 1\n\
             # HELP flock_process_cpu_seconds_total CPU.\n\
             # TYPE flock_process_cpu_seconds_total counter\nflock_process_cpu_seconds_total 0.5\n\
             # HELP flock_mailbox_depth Depth.\n# TYPE flock_mailbox_depth gauge\n\
             flock_mailbox_depth 0\n# TYPE odd untyped\nodd 1\n"
        );
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
