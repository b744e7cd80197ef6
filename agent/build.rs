//! Links `flock-agent` as a position-dependent executable (`-no-pie`), see docs/benchmarks.md
//! "What an idle agent's memory is": a PIE's pointer tables are rewritten by the loader in every
//! process (private pages, ~0.3 MB per agent); at a fixed address they stay shared file pages.
//! agent/link/rustc-wrapper (run by cargo for this workspace's crates, .cargo/config.toml) goes
//! further where it can: static glibc and the agent's running functions laid out together. The
//! agent is linked again when its list of functions or that script changes.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=link/startup-symbols.txt");
    println!("cargo::rerun-if-changed=link/rustc-wrapper");
    println!("cargo::rerun-if-env-changed=FLOCK_AGENT_PLAIN_LINK");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo::rustc-link-arg-bin=flock-agent=-no-pie");
    }
}
