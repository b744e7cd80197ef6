//! `flock-config`: reads a swarm file (YAML) and turns it into a validated [`SwarmSpec`].
//!
//! The file is first read into a raw YAML tree that remembers the line and column of every key
//! and value, then checked section by section. Checking never stops at the first problem: the
//! result is either a spec with every default applied, or [`ConfigErrors`] listing every problem
//! found, each as `file:line:column: what is wrong; how to fix it`. Scripted-model transcripts
//! referenced by the swarm file are read and checked in the same pass, and their problems are
//! reported against their own file.
//!
//! This crate does not start anything and does not touch the state directory: it only reads the
//! swarm file and the transcripts it names.

mod error;
mod extensions;
mod fields;
mod section;
pub mod spec;
mod swarm;
pub mod tools;
mod transcript;
mod yaml;

use std::path::Path;

pub use error::{ConfigError, ConfigErrors};
pub use fields::{MAX_DESCRIPTION_BYTES, MAX_FIELD_BYTES};
pub use spec::*;
pub use tools::{Owner, ToolSpec};

/// Reads and validates the swarm file at `path`.
///
/// A file that cannot be read is reported as one error at line 0.
pub fn load(path: &Path) -> Result<SwarmSpec, ConfigErrors> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path),
        Err(error) => Err(ConfigErrors(vec![ConfigError {
            file: path.display().to_string(),
            line: 0,
            column: 0,
            message: format!("cannot read the swarm file: {error}; check the path"),
        }])),
    }
}

/// Validates swarm-file `text` as if it had been read from `origin`.
///
/// `origin` names the file in error messages, becomes [`SwarmSpec::source`] (made absolute), and
/// is the base for relative paths in the file (`transcript:` files, `command` programs).
pub fn parse(text: &str, origin: &Path) -> Result<SwarmSpec, ConfigErrors> {
    let file = origin.display().to_string();
    let mut errors = Vec::new();
    let spec = {
        let mut report = error::Report::new(&file, &mut errors);
        match yaml::parse(text, &mut report) {
            Some(root) => swarm::build(&root, origin, report),
            None => None,
        }
    };
    match spec {
        Some(spec) if errors.is_empty() => Ok(spec),
        _ => {
            if errors.is_empty() {
                // Every path that yields no spec reports why; this guards against one that forgets,
                // so a caller never gets an empty error list.
                errors.push(ConfigError {
                    file: file.clone(),
                    line: 1,
                    column: 1,
                    message: "the swarm file is invalid (no details recorded; please report this \
                              as a Flock bug)"
                        .to_owned(),
                });
            }
            sort_errors(&mut errors, &file);
            Err(ConfigErrors(errors))
        }
    }
}

/// Orders errors by file (the swarm file first, then others in the order they were first
/// mentioned), then by position. Cross-reference checks run after whole sections, so without this
/// an unknown `can_call` name could be listed after a problem further down the file.
fn sort_errors(errors: &mut [ConfigError], swarm_file: &str) {
    let mut files: Vec<String> = vec![swarm_file.to_owned()];
    for error in errors.iter() {
        if !files.contains(&error.file) {
            files.push(error.file.clone());
        }
    }
    let rank = |file: &str| files.iter().position(|f| f == file).unwrap_or(usize::MAX);
    errors.sort_by_key(|e| (rank(&e.file), e.line, e.column));
}

/// Names an agent may not take: a message to or from them would mean someone else (the
/// operator's `flockctl send` would inherit the agent's `can_call`), and `ps` lists the
/// supervisor's own rows under them.
pub const RESERVED_AGENT_NAMES: &[&str] = &[
    "operator",
    "human",
    "supervisor",
    "router",
    "store",
    "channels",
    "children",
    "chains",
    "llm-gateway",
    "flock-model",
    "flock",
    "system",
];
/// Whether `name` is one Flock keeps for itself ([`RESERVED_AGENT_NAMES`]).
pub fn reserved_agent_name(name: &str) -> bool {
    RESERVED_AGENT_NAMES.contains(&name)
}

/// Whether `name` is a valid agent name: `[a-z0-9][a-z0-9-]{0,62}`.
///
/// Agent names appear in socket paths, log file names and `flockctl` commands, so they are kept
/// to characters that need no quoting anywhere.
pub fn valid_agent_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let Some(first) = bytes.first() else {
        return false;
    };
    let lower_or_digit = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    bytes.len() <= 63
        && lower_or_digit(first)
        && bytes.iter().all(|b| lower_or_digit(b) || *b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_are_lowercase_words_up_to_63_chars() {
        assert!(valid_agent_name("worker-1"));
        assert!(valid_agent_name("1"));
        assert!(valid_agent_name(&"a".repeat(63)));
        assert!(!valid_agent_name(&"a".repeat(64)));
        assert!(!valid_agent_name(""));
        assert!(!valid_agent_name("-worker"));
        assert!(!valid_agent_name("Worker"));
        assert!(!valid_agent_name("worker_1"));
        assert!(!valid_agent_name("wörker"));
    }
}
