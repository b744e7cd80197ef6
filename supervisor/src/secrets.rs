//! API keys leave the environment the moment they are read. `/proc/<pid>/environ` shows a
//! process's *original* environment block, which `unsetenv` does not touch: a process of the same
//! user (an agent with a custom `command:`, anything it started) could read every key there. So
//! the keys are copied out, their bytes in that block are overwritten, and the variables removed;
//! the supervisor is also made non-dumpable, which closes `/proc/<pid>/environ` and `mem` and
//! ptrace to other processes of the same user.

#![allow(unsafe_code)]

use std::collections::HashMap;

use flock_config::{ModelSpec, SwarmSpec};
use flock_llm::Secret;

unsafe extern "C" {
    /// The C environment: a null-terminated array of `NAME=value` strings.
    static environ: *const *mut libc::c_char;
}

/// Reads the key of every model the swarm file names (`api_key_env`) and every chat bridge's
/// token (`token_env`) — from the environment, else from `dotenv` (the `.env` beside the swarm
/// file, [`crate::dotenv`]) — and erases those variables from this process (see the module
/// docs). Variables that are unset or empty in both are left out.
///
/// # Safety
/// No other thread may read or change the environment while this runs: call it from `main`
/// before any thread (the tokio runtime among them) has started.
pub unsafe fn take_api_keys(
    spec: &SwarmSpec,
    dotenv: &HashMap<String, String>,
) -> HashMap<String, Secret> {
    let mut keys = HashMap::new();
    for (var, _) in secret_vars(spec) {
        let value = std::env::var(&var).ok().filter(|v| !v.trim().is_empty());
        if let Some(v) = value.or_else(|| dotenv.get(&var).cloned())
            && !v.trim().is_empty()
        {
            keys.insert(var.clone(), Secret::new(v.trim()));
        }
        // SAFETY: the caller promises a single-threaded process.
        unsafe { erase_var(&var) };
    }
    keys
}

/// Every environment variable the swarm reads a secret from (models' API keys, chat bridges'
/// platform tokens), once each, with where the swarm file names it first.
pub fn secret_vars(spec: &SwarmSpec) -> Vec<(String, String)> {
    let key_of = |model: &ModelSpec| match model {
        ModelSpec::OpenAi(m) | ModelSpec::Anthropic(m) => m.api_key_env.clone(),
        _ => None,
    };
    let models = spec
        .models
        .iter()
        .filter_map(|(name, m)| Some((key_of(m)?, format!("models.{name}.api_key_env"))));
    let agents = spec
        .agents
        .iter()
        .filter_map(|a| Some((key_of(&a.model)?, format!("the model of agent `{}`", a.name))));
    // Chat bridges' platform tokens too: only the bridge's own process is handed its token.
    let bridges = spec.bridges.iter().flat_map(|b| {
        std::iter::once((b.token_env.clone(), format!("bridges.{}.token_env", b.name))).chain(
            b.app_token_env
                .iter()
                .map(|v| (v.clone(), format!("bridges.{}.app_token_env", b.name))),
        )
    });
    let cluster =
        spec.cluster.iter().map(|c| (c.secret_env.clone(), "cluster.secret_env".to_owned()));
    let mut seen = std::collections::HashSet::new();
    models
        .chain(agents)
        .chain(bridges)
        .chain(cluster)
        .filter(|(var, _)| seen.insert(var.clone()))
        .collect()
}

/// The secret variables of the swarm that are unset or blank in this environment, each as a line
/// saying where the file names it and how to set it (`flock-supervisor validate` reports them:
/// `up` from here would start, and every call needing them would fail).
pub fn missing_secrets(spec: &SwarmSpec, dotenv: &HashMap<String, String>) -> Vec<String> {
    let blank = |v: Option<&str>| v.is_none_or(|v| v.trim().is_empty());
    secret_vars(spec)
        .into_iter()
        .filter(|(var, _)| {
            blank(std::env::var(var).ok().as_deref()) && blank(dotenv.get(var).map(String::as_str))
        })
        .map(|(var, named)| {
            format!(
                "`{var}` ({named}) is not set in this environment nor in the .env beside the \
                 swarm file: `export {var}=…` or add `{var}=…` to that .env (mode 0600) before \
                 `up`, or every call that needs it fails"
            )
        })
        .collect()
}

/// Overwrites the value of `name` in the environment block with zero bytes, then unsets it.
///
/// # Safety
/// As for [`take_api_keys`]: no other thread touches the environment.
unsafe fn erase_var(name: &str) {
    let prefix = format!("{name}=");
    // SAFETY: `environ` is the process's environment array, null-terminated, each entry a
    // NUL-terminated string we may write in place (it lives in writable memory: the initial
    // block on the stack, or the heap for variables set later); nobody else uses it now.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = *entry;
            let len = libc::strlen(text);
            let bytes = std::slice::from_raw_parts_mut(text.cast::<u8>(), len);
            if bytes.starts_with(prefix.as_bytes()) {
                bytes[prefix.len()..].fill(0);
            }
            entry = entry.add(1);
        }
        std::env::remove_var(name);
    }
}

/// Makes this process non-dumpable: no core file, and `/proc/<pid>/environ`, `mem`, `fd` and
/// ptrace are closed to other processes of the same user (root keeps them).
pub fn not_dumpable() -> std::io::Result<()> {
    // SAFETY: prctl with these arguments only sets a flag on this process.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
