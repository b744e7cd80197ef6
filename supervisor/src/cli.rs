//! The command line of `flock-supervisor` (here rather than in its binary so that `flockctl man`
//! can write its manual page too).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "flock-supervisor",
    version,
    about = "Run a team of LLM agents as supervised OS processes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Start every agent of a swarm file and supervise them until Ctrl-C, SIGTERM or `flockctl down`.
    Up {
        /// The swarm file (YAML), e.g. examples/office.yaml.
        file: PathBuf,
        /// Run in the background; returns once the swarm is ready. Output: <state-dir>/logs/supervisor.log.
        #[arg(long)]
        detach: bool,
        /// Where the swarm keeps its database, sockets, logs and workspaces [default: $FLOCK_HOME or ~/.flock].
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// Run every embedded-model agent on this local model instead of the swarm file's
        /// (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b; fetch with `scripts/setup --model NAME`).
        #[arg(long, value_name = "NAME")]
        model: Option<String>,
        /// In a swarm across hosts (`cluster:` in the file): which host this is. It starts the
        /// agents the file places here (`host:`) and reaches the others through NATS JetStream
        /// [default: the file's `cluster.leader`, else `main`]. See docs/cluster.md.
        #[arg(long, value_name = "NAME", env = "FLOCK_HOST")]
        host: Option<String>,
        /// Stand by for --host NAME from this machine: start nothing until that host has been
        /// lost for the time the file's `cluster.failover` gives it, then take it over and run
        /// its agents here (its own run, if it comes back, hands what it held over and stops).
        /// Runs in the foreground. See docs/cluster.md, "Failover".
        #[arg(long, requires = "host", conflicts_with = "detach")]
        standby: bool,
        /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464; port 0 picks
        /// one). Off by default; no token: keep it on loopback or behind your firewall.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<std::net::SocketAddr>,
        /// Serve the live web dashboard at ADDR (e.g. 127.0.0.1:8080; port 0 picks one). Its URL,
        /// with this run's token, is printed at start and by `flockctl ui`.
        #[arg(long, value_name = "ADDR")]
        ui: Option<std::net::SocketAddr>,
        /// Log lines as `text` (readable) or `json` (one object per line), for the supervisor and
        /// every process it spawns; which events: RUST_LOG (default `info`). See
        /// docs/observability.md.
        #[arg(long, value_name = "FORMAT", env = "FLOCK_LOG_FORMAT", default_value = "text",
              value_parser = ["text", "json"], ignore_case = true)]
        log_format: String,
    },
    /// Check a swarm file and print every problem at once, with line and column.
    Validate {
        /// The swarm file (YAML).
        file: PathBuf,
        /// Print only the name of the local model the swarm needs (nothing if none): for scripts
        /// that fetch and build the embedded model only when it is used.
        #[arg(long)]
        local_model: bool,
        /// Print what the swarm needs built besides flock-supervisor, flockctl, flock-agent and
        /// flock-sandbox, one per line (`flock-bridge` when it has chat bridges, `flock-model`
        /// when it runs the embedded model, `vectors` when it searches memory: a supervisor with
        /// search by meaning, `cluster` when it runs across hosts: a supervisor with the NATS
        /// link): for scripts that build only what a swarm runs.
        #[arg(long, conflicts_with = "local_model")]
        needs: bool,
        /// Check the file alone: do not also check that the API keys and platform tokens it names
        /// are set in this environment.
        #[arg(long)]
        file_only: bool,
    },
}
