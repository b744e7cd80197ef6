//! Whether agents run in their cage (`flock-sandbox cage`, see `flock_sandbox::cage`): every
//! agent does, unless the swarm file says `unconfined: true` for it, or the kernel cannot cage
//! (unprivileged user namespaces turned off).
//!
//! `up` finds out by caging `/bin/true` once, for real. Where it cannot, a custom `command:` —
//! code Flock did not write — is refused unless the swarm file says `unconfined: true` for it;
//! the built-in `flock-agent` runs uncaged with a warning (its tools' commands are still
//! sandboxed). `flockctl ps` shows which agents are caged.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Result, bail};
use flock_config::SwarmSpec;

use crate::paths::StateDir;

/// The helper binary (beside `flock-supervisor`, or `FLOCK_SANDBOX_HELPER`).
pub fn helper() -> Result<PathBuf> {
    crate::spawn::sibling_binary("flock-sandbox", "FLOCK_SANDBOX_HELPER", crate::spawn::BUILD_HINT)
}

/// Cages `/bin/true` with the helper at `helper`, in a scratch folder of the state dir's
/// `run/`: `Ok` if the kernel allows everything the cage does, else why not.
pub fn probe(helper: &Path, state: &StateDir) -> Result<(), String> {
    let scratch = state.run_dir().join(format!("cage-probe-{}", std::process::id()));
    let shown = scratch.join("shown");
    std::fs::create_dir_all(&shown).map_err(|e| format!("create {}: {e}", shown.display()))?;
    let json = serde_json::json!({ "hidden": scratch, "show": [shown] }).to_string();
    let out = Command::new(helper)
        .args(["cage", &json, "/bin/true"])
        .env_clear()
        .stdin(Stdio::null())
        .output();
    let _ = std::fs::remove_dir_all(&scratch);
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            let why = String::from_utf8_lossy(&o.stderr).trim().to_owned();
            Err(why.strip_prefix("flock-sandbox: cage: ").unwrap_or(&why).to_owned())
        }
        Err(e) => Err(format!("cannot run {}: {e}", helper.display())),
    }
}

/// The cage helper to start agents with (`None`: agents run uncaged), or an error when a custom
/// command would have to run uncaged without the swarm file saying so.
pub fn decide(spec: &SwarmSpec, probed: Result<PathBuf, String>) -> Result<Option<PathBuf>> {
    let why = match probed {
        Ok(helper) => return Ok(Some(helper)),
        Err(why) => why,
    };
    let refused: Vec<&str> = spec
        .agents
        .iter()
        .filter(|a| a.command.is_some() && !a.unconfined)
        .map(|a| a.name.as_str())
        .collect();
    if !refused.is_empty() {
        bail!(
            "this machine cannot cage agent processes ({why}), and {} run{} a custom `command:`, \
             which Flock does not start uncaged unless told to: add `unconfined: true` to {} in \
             the swarm file to run {} as your own user with your own access (see docs/security.md)",
            refused.join(", "),
            if refused.len() == 1 { "s" } else { "" },
            if refused.len() == 1 { "it" } else { "each" },
            if refused.len() == 1 { "it" } else { "them" },
        );
    }
    if spec.agents.iter().any(|a| !a.unconfined) {
        tracing::warn!(
            "flock: agents run uncaged: this machine cannot cage them ({why}); their tools' \
             commands are still sandboxed (see docs/security.md)"
        );
    }
    Ok(None)
}
