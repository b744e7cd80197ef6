//! Metrics of events the actors see one at a time — turns, model calls, channel posts, deltas,
//! journal appends, dead letters — kept in one process-wide registry and exposed in the
//! Prometheus/OpenMetrics text format by the supervisor's `--metrics` endpoint.
//!
//! What the actors already count or can be asked for (messages routed, chains, mailbox depths,
//! restarts, memory) is read at scrape time instead (`flock-supervisor`'s `web::metrics`), so the
//! router's hot path gains nothing: every event here happens at most once per turn.
//!
//! The metric names are documented in docs/observability.md; change both together.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    pub agent: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TurnLabels {
    pub agent: String,
    /// `ok` (acknowledged) or `failed` (refused or lost with the agent).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub model: String,
    /// `ok` or `error` (a call cancelled with its turn is not counted).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub model: String,
    /// `in` (prompt) or `out` (completion).
    pub direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ChannelLabels {
    pub channel: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Seconds from 5 ms to ~41 min (doubling): a scripted turn takes milliseconds, a local model's
/// turn tens of seconds, a long chain of tool calls minutes.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 20))
}

/// The process-wide event metrics. Cloning a family shares its values (they are `Arc`s inside).
#[derive(Debug)]
pub struct Metrics {
    pub turn_seconds: HistogramFamily<AgentLabels>,
    pub turns: Family<TurnLabels, Counter>,
    pub llm_calls: Family<CallLabels, Counter>,
    pub llm_tokens: Family<TokenLabels, Counter>,
    pub llm_seconds: HistogramFamily<ModelLabels>,
    pub channel_posts: Family<ChannelLabels, Counter>,
    pub deltas: Counter,
    pub durable_messages: Counter,
    pub dead_letters: Counter,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(|| Metrics {
    turn_seconds: Family::new_with_constructor(seconds_histogram),
    turns: Family::default(),
    llm_calls: Family::default(),
    llm_tokens: Family::default(),
    llm_seconds: Family::new_with_constructor(seconds_histogram),
    channel_posts: Family::default(),
    deltas: Counter::default(),
    durable_messages: Counter::default(),
    dead_letters: Counter::default(),
});

/// The process's metrics.
pub fn get() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    /// A turn ended after `took`: acknowledged (`ok`) or not.
    pub fn turn(&self, agent: &str, ok: bool, took: Duration) {
        let outcome = if ok { "ok" } else { "failed" }.to_owned();
        self.turns.get_or_create(&TurnLabels { agent: agent.to_owned(), outcome }).inc();
        self.turn_seconds
            .get_or_create(&AgentLabels { agent: agent.to_owned() })
            .observe(took.as_secs_f64());
    }

    /// A model call ended (`outcome`: ok, error, cancelled) with the tokens it used.
    pub fn llm_call(&self, model: &str, outcome: &str, took: Duration, tokens: (u64, u64)) {
        let m = model.to_owned();
        self.llm_calls
            .get_or_create(&CallLabels { model: m.clone(), outcome: outcome.into() })
            .inc();
        self.llm_seconds
            .get_or_create(&ModelLabels { model: m.clone() })
            .observe(took.as_secs_f64());
        for (direction, n) in [("in", tokens.0), ("out", tokens.1)] {
            if n > 0 {
                let labels = TokenLabels { model: m.clone(), direction: direction.into() };
                self.llm_tokens.get_or_create(&labels).inc_by(n);
            }
        }
    }

    pub fn channel_post(&self, channel: &str) {
        self.channel_posts.get_or_create(&ChannelLabels { channel: channel.to_owned() }).inc();
    }

    /// Registers every event metric in `registry` (the values stay shared with this process's).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_with_unit(
            "flock_turn_duration",
            "How long agents' turns took, from delivery to the agent's answer",
            Unit::Seconds,
            self.turn_seconds.clone(),
        );
        registry.register("flock_turns", "Turns ended, by agent and outcome", self.turns.clone());
        registry.register(
            "flock_llm_calls",
            "Model calls made through the gateway, by model and outcome",
            self.llm_calls.clone(),
        );
        registry.register(
            "flock_llm_tokens",
            "Tokens used by model calls, by model and direction (in = prompt, out = completion)",
            self.llm_tokens.clone(),
        );
        registry.register_with_unit(
            "flock_llm_latency",
            "How long model calls took, by model",
            Unit::Seconds,
            self.llm_seconds.clone(),
        );
        registry.register(
            "flock_channel_posts",
            "Messages posted in channels (agents and people), by channel",
            self.channel_posts.clone(),
        );
        registry.register(
            "flock_channel_deltas",
            "Channel deltas handed to agents as turns",
            self.deltas.clone(),
        );
        let journal_appends: Counter = Counter::default();
        journal_appends.inc_by(flock_journal::appended_total());
        registry.register(
            "flock_journal_appends",
            "Events appended to the shared journal",
            journal_appends,
        );
        registry.register(
            "flock_messages_durable",
            "Durable messages committed to the store (accepted)",
            self.durable_messages.clone(),
        );
        registry.register(
            "flock_dead_letters",
            "Messages moved to the dead letters after their last failed delivery",
            self.dead_letters.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_show_up_in_the_exposition_with_their_labels() {
        let m = get();
        m.turn("worker", true, Duration::from_millis(30));
        m.llm_call("qwen", "ok", Duration::from_millis(400), (120, 7));
        m.channel_post("team");
        let mut registry = Registry::default();
        m.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(r#"flock_turns_total{agent="worker",outcome="ok"}"#), "{text}");
        assert!(text.contains(r#"flock_turn_duration_seconds_count{agent="worker"} 1"#), "{text}");
        assert!(text.contains(r#"flock_llm_tokens_total{model="qwen",direction="in"} "#), "{text}");
        assert!(text.contains(r#"flock_channel_posts_total{channel="team"}"#), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
