//! Links `flock-agent` as a position-dependent executable (`-no-pie`), see docs/benchmarks.md
//! "What an idle agent's memory is": a PIE's pointer tables are rewritten by the loader in every
//! process (private pages, ~0.3 MB per agent); at a fixed address they stay shared file pages.
//! Its shared libraries (glibc) are still loaded at random addresses.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo::rustc-link-arg-bin=flock-agent=-no-pie");
    }
}
