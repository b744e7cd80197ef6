//! `flock-sandbox POLICY_JSON`: runs one command of a worker in the native sandbox. Started by
//! `flock-agent` for the `exec` tool; see the `flock_sandbox` crate for what it confines.

fn main() {
    flock_sandbox::helper::main()
}
