//! `extensions:` of an agent: an ordered list whose items are a built-in's name (its defaults)
//! or a one-key mapping `name: { settings }`.
//!
//! ```yaml
//! extensions:
//!   - message_window: { max: 60 }
//!   - context_injector
//!   - worker_lifecycle: { timeout_ms: 5000 }
//! ```

use crate::error::{Report, closest, list};
use crate::spec::{ExtensionSpec, Role};
use crate::yaml::{Node, lookup};

/// Parses the list; problems are reported and the broken items left out.
pub(crate) fn parse(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    peers: &[(String, Role)],
) -> Vec<ExtensionSpec> {
    if node.is_null() {
        return Vec::new();
    }
    let Some(items) = r.list(node, what) else { return Vec::new() };
    let mut out: Vec<ExtensionSpec> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{what}[{i}]");
        let (name_node, settings) = match item.entries() {
            Some([(k, v)]) => (k, Some(v)),
            Some(_) => {
                r.error(
                    item.pos,
                    format!(
                        "`{at}` must be an extension name or one `name: {{ settings }}` pair, \
                         e.g. `- message_window: {{ max: 60 }}`"
                    ),
                );
                continue;
            }
            None => (item, None),
        };
        let Some(name) = r.string(name_node, &at) else { continue };
        let Some(mut ext) = ExtensionSpec::default_for(&name, peers) else {
            let hint = closest(&name, ExtensionSpec::NAMES.iter().copied())
                .map(|b| format!("did you mean `{b}`? "))
                .unwrap_or_default();
            r.error(
                name_node.pos,
                format!(
                    "`{at}`: unknown extension `{name}`; {hint}the built-ins are {}",
                    list(ExtensionSpec::NAMES.iter().copied())
                ),
            );
            continue;
        };
        if out.iter().any(|e| e.name() == ext.name()) {
            r.error(name_node.pos, format!("`{at}`: `{name}` is listed twice; keep one"));
            continue;
        }
        if let Some(settings) = settings.filter(|s| !s.is_null()) {
            settings_of(r, settings, &format!("{what}.{name}"), &mut ext, peers);
        }
        out.push(ext);
    }
    out
}

/// Applies `settings` (a mapping) to `ext`, reporting unknown keys and bad values.
fn settings_of(
    r: &mut Report<'_>,
    node: &Node,
    what: &str,
    ext: &mut ExtensionSpec,
    peers: &[(String, Role)],
) {
    let Some(entries) = r.mapping(node, what) else { return };
    let keys: &[&str] = match ext {
        ExtensionSpec::MessageWindow { .. } => &["max"],
        ExtensionSpec::MessageCompaction { .. } => &["max_messages", "max_chars", "keep"],
        ExtensionSpec::ContextInjector | ExtensionSpec::DateHelper => &[],
        ExtensionSpec::IdleMonitor { .. } => &["after_secs", "notify"],
        ExtensionSpec::WorkerLifecycle { .. } => &["unconscious", "observer", "timeout_ms"],
        ExtensionSpec::MemoryFiles { .. } => &["reflect_after", "reflect_tokens", "reflection"],
        ExtensionSpec::JournalContext { .. } => &["last"],
    };
    r.unknown_keys(entries, keys, &format!("`{what}`"));
    let num = |r: &mut Report<'_>, key: &str, min: i128, max: i128| {
        lookup(entries, key).and_then(|(_, v)| r.uint::<u64>(v, &format!("{what}.{key}"), min, max))
    };
    let agent = |r: &mut Report<'_>, key: &str| -> Option<Option<String>> {
        let (_, v) = lookup(entries, key)?;
        let name = r.string(v, &format!("{what}.{key}"))?;
        if peers.iter().any(|(n, _)| *n == name) {
            Some(Some(name))
        } else {
            r.error(v.pos, format!("`{what}.{key}`: no agent named `{name}` in this swarm"));
            None
        }
    };
    match ext {
        ExtensionSpec::MessageWindow { max } => {
            if let Some(n) = num(r, "max", 0, 100_000) {
                *max = n as usize;
            }
        }
        ExtensionSpec::MessageCompaction { max_messages, max_chars, keep } => {
            if let Some(n) = num(r, "max_messages", 2, 100_000) {
                *max_messages = n as usize;
            }
            if let Some(n) = num(r, "max_chars", 100, 10_000_000) {
                *max_chars = n as usize;
            }
            if let Some(n) = num(r, "keep", 0, 100_000) {
                *keep = n as usize;
            }
            if *keep >= *max_messages {
                r.error(
                    node.pos,
                    format!(
                        "`{what}.keep` ({keep}) must be below `max_messages` ({max_messages}): \
                         otherwise nothing is ever compacted"
                    ),
                );
            }
        }
        ExtensionSpec::ContextInjector | ExtensionSpec::DateHelper => {}
        ExtensionSpec::JournalContext { last } => {
            if let Some(n) = num(r, "last", 1, 200) {
                *last = n as usize;
            }
        }
        ExtensionSpec::IdleMonitor { after_secs, notify } => {
            if let Some(n) = num(r, "after_secs", 1, 7 * 24 * 3600) {
                *after_secs = n;
            }
            if let Some((_, v)) = lookup(entries, "notify") {
                let names = r.list(v, &format!("{what}.notify")).unwrap_or_default();
                notify.clear();
                for (i, item) in names.iter().enumerate() {
                    let Some(name) = r.string(item, &format!("{what}.notify[{i}]")) else {
                        continue;
                    };
                    if peers.iter().any(|(n, _)| *n == name) {
                        notify.push(name);
                    } else {
                        r.error(item.pos, format!("`{what}.notify`: no agent named `{name}`"));
                    }
                }
            }
        }
        ExtensionSpec::WorkerLifecycle { unconscious, observer, timeout_ms } => {
            if let Some(a) = agent(r, "unconscious") {
                *unconscious = a;
            }
            if let Some(a) = agent(r, "observer") {
                *observer = a;
            }
            if let Some(n) = num(r, "timeout_ms", 1, 600_000) {
                *timeout_ms = n;
            }
        }
        ExtensionSpec::MemoryFiles { reflect_after, reflect_tokens, reflection } => {
            if let Some(n) = num(r, "reflect_after", 1, 100_000) {
                *reflect_after = Some(n as usize);
            }
            if let Some(n) = num(r, "reflect_tokens", 100, 1_000_000) {
                *reflect_tokens = n as usize;
            }
            if let Some(a) = agent(r, "reflection") {
                *reflection = a;
            }
        }
    }
}
