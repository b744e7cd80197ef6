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
/// token (`token_env`), and erases those variables
/// from this process (see the module docs). Variables that are unset or empty are left out.
///
/// # Safety
/// No other thread may read or change the environment while this runs: call it from `main`
/// before any thread (the tokio runtime among them) has started.
pub unsafe fn take_api_keys(spec: &SwarmSpec) -> HashMap<String, Secret> {
    let mut keys = HashMap::new();
    let models = spec.agents.iter().map(|a| &a.model).chain(spec.models.values());
    let model_vars = models.filter_map(|model| match model {
        ModelSpec::OpenAi(m) | ModelSpec::Anthropic(m) => m.api_key_env.as_ref(),
        _ => None,
    });
    // Chat bridges' platform tokens too: only the bridge's own process is handed its token.
    let bridge_vars =
        spec.bridges.iter().flat_map(|b| std::iter::once(&b.token_env).chain(&b.app_token_env));
    let vars = model_vars.chain(bridge_vars);
    for var in vars {
        if keys.contains_key(var) {
            continue;
        }
        if let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            keys.insert(var.clone(), Secret::new(v.trim()));
        }
        // SAFETY: the caller promises a single-threaded process.
        unsafe { erase_var(var) };
    }
    keys
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
