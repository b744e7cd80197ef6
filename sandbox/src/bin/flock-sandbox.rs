//! `flock-sandbox POLICY_JSON`: runs one command of a worker in the native sandbox. Started by
//! `flock-agent` for the `exec` tool; see the `flock_sandbox` crate for what it confines.
//!
//! `flock-sandbox cage CAGE_JSON PROGRAM [ARGS…]`: confines an agent process and becomes it.
//! Started by `flock-supervisor` for every agent; see `flock_sandbox::cage`.
//!
//! `flock-sandbox launch PROGRAM [ARGS…]`: sets up a process the supervisor started and becomes
//! `PROGRAM`; see `flock_sandbox::launch`.

fn main() {
    // Started by flock-supervisor (as an agent's cage, or with `launch`): its session, its
    // death signal and the secrets' socket first (flock_sandbox::launch).
    flock_sandbox::launch::set_up_if_launched();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cage") => flock_sandbox::cage::main(&args[1..]),
        Some("launch") => flock_sandbox::launch::main(&args[1..]),
        _ => flock_sandbox::helper::main(),
    }
}
