//! `flock-sandbox POLICY_JSON`: runs one command of a worker in the native sandbox. Started by
//! `flock-agent` for the `exec` tool; see the `flock_sandbox` crate for what it confines.
//!
//! `flock-sandbox cage CAGE_JSON PROGRAM [ARGS…]`: confines an agent process and becomes it.
//! Started by `flock-supervisor` for every agent; see `flock_sandbox::cage`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("cage") {
        flock_sandbox::cage::main(&args[1..])
    }
    flock_sandbox::helper::main()
}
