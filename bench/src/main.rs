//! `flock-bench`: Flock's end-to-end benchmarks with real processes (`scripts/bench`).
//!
//! Without a subcommand it is the harness: it generates swarm files in a temporary state dir,
//! runs `flock-supervisor up` on them, drives the load and prints the figures of DESIGN.md §14
//! (see docs/benchmarks.md). The harness runs the same binary as the processes it measures:
//! `flock-bench agent <mode>` (started by the supervisor through `command:`) and
//! `flock-bench relay` (the raw-socket baseline).

mod agent;
mod bridge;
mod harness;
mod memory;
mod proto;
mod recall;
mod relay;
mod sandbox;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "flock-bench",
    version,
    about = "Flock benchmarks with real processes: routed and durable sends, requests, up, restart, RSS",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: harness::RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the benchmarks (the default).
    Run(harness::RunArgs),
    /// Run as a bench agent (started by flock-supervisor through `command:`; reads FLOCK_* env).
    Agent {
        #[arg(value_enum)]
        mode: agent::Mode,
    },
    /// Run the raw relay baseline on a Unix socket.
    Relay {
        #[arg(long)]
        socket: PathBuf,
        /// Bound of each connection's outbox (the router's default is 65 536).
        #[arg(long, default_value_t = 65_536)]
        outbox_frames: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => harness::main(cli.run),
        Some(Command::Run(args)) => harness::main(args),
        Some(Command::Agent { mode }) => agent::main(mode),
        Some(Command::Relay { socket, outbox_frames }) => relay::main(&socket, outbox_frames),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flock-bench: {e:#}");
            ExitCode::from(1)
        }
    }
}
