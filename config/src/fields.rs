//! Typed reads of YAML nodes that report a helpful error instead of failing: each accessor
//! returns `None` after reporting, so the caller moves on and the next problem is found too.
//!
//! `what` is always the dotted path of the value (`supervision.max_restarts`,
//! `agents.worker-1.role`), the name the user will search for in the file.

use crate::error::{Report, closest, did_you_mean, list};
use crate::yaml::{Node, Scalar, Value};

/// The longest text any one field may hold (a long system prompt fits; a pasted log does not).
pub const MAX_FIELD_BYTES: usize = 64 * 1024;
/// The longest `description`: every agent's catalog shows every description.
pub const MAX_DESCRIPTION_BYTES: usize = 2 * 1024;

impl Report<'_> {
    /// Reports every key of `entries` that is not in `allowed`, with a typo suggestion.
    pub(crate) fn unknown_keys(
        &mut self,
        entries: &[(Node, Node)],
        allowed: &[&str],
        section: &str,
    ) {
        for (key, _) in entries {
            match key.text() {
                Some(name) if allowed.contains(&name) => {}
                Some(name) => {
                    let hint = did_you_mean(name, allowed.iter().copied());
                    let message = if hint.is_empty() {
                        format!(
                            "unknown key `{name}` in {section}; remove it (allowed keys: {})",
                            list(allowed.iter().copied())
                        )
                    } else {
                        format!("unknown key `{name}` in {section}{hint}")
                    };
                    self.error(key.pos, message);
                }
                None => self.error(
                    key.pos,
                    format!(
                        "keys in {section} must be plain names, found {}; use one of {}",
                        key.describe(),
                        list(allowed.iter().copied())
                    ),
                ),
            }
        }
    }

    /// The entries of a mapping.
    pub(crate) fn mapping<'n>(&mut self, node: &'n Node, what: &str) -> Option<&'n [(Node, Node)]> {
        if let Some(entries) = node.entries() {
            return Some(entries);
        }
        self.error(
            node.pos,
            format!(
                "`{what}` must be a mapping (`key: value` entries indented under it), found {}",
                node.describe()
            ),
        );
        None
    }

    /// The items of a list.
    pub(crate) fn list<'n>(&mut self, node: &'n Node, what: &str) -> Option<&'n [Node]> {
        if let Value::Seq(items) = &node.value {
            return Some(items);
        }
        self.error(
            node.pos,
            format!(
                "`{what}` must be a list (`- item` lines, or `[a, b]`), found {}",
                node.describe()
            ),
        );
        None
    }

    /// Free text. Numbers and booleans are taken as written (`name: 2024` is the text "2024").
    /// At most [`MAX_FIELD_BYTES`] (a system prompt's worth); see [`Report::string_of_at_most`].
    pub(crate) fn string(&mut self, node: &Node, what: &str) -> Option<String> {
        self.string_of_at_most(node, what, MAX_FIELD_BYTES)
    }

    /// Free text of at most `max` bytes: a field shown to every agent (a `description`) or kept
    /// per message has a smaller bound than a prompt.
    pub(crate) fn string_of_at_most(
        &mut self,
        node: &Node,
        what: &str,
        max: usize,
    ) -> Option<String> {
        if let Some(text) = node.text() {
            if text.len() > max {
                self.error(
                    node.pos,
                    format!("`{what}` is {} bytes long; at most {max} are allowed", text.len()),
                );
                return None;
            }
            return Some(text.to_owned());
        }
        let message = if node.is_null() {
            format!("`{what}` has no value: write one after the colon")
        } else {
            format!(
                "`{what}` must be a single text value, found {}; quote it if it contains `:`, \
                 `#`, `[` or `{{`",
                node.describe()
            )
        };
        self.error(node.pos, message);
        None
    }

    /// Text that must not be a number, boolean or null in the YAML sense: values that end up
    /// typed in JSON (tool arguments), where `to: 5` would send a number.
    pub(crate) fn strict_string(&mut self, node: &Node, what: &str) -> Option<String> {
        if let Some(Scalar::Str(text)) = node.scalar() {
            return Some(text.to_owned());
        }
        let hint = if node.text().is_some() { "; put it in quotes" } else { "" };
        self.error(node.pos, format!("`{what}` must be text, found {}{hint}", node.describe()));
        None
    }

    /// A whole number in `min..=max`.
    pub(crate) fn uint<T: TryFrom<i128>>(
        &mut self,
        node: &Node,
        what: &str,
        min: i128,
        max: i128,
    ) -> Option<T> {
        let message = match node.scalar() {
            Some(Scalar::Int(n)) if n < min => {
                format!("`{what}` must be at least {min}, got {n}; raise it to {min} or more")
            }
            Some(Scalar::Int(n)) if n > max => {
                format!("`{what}` must be at most {max}, got {n}; lower it to {max} or less")
            }
            Some(Scalar::Int(n)) => match T::try_from(n) {
                Ok(value) => return Some(value),
                Err(_) => format!("`{what}` is out of range, got {n}; use {min} to {max}"),
            },
            Some(Scalar::Str(text)) if text.trim().parse::<i128>().is_ok() => {
                format!(
                    "`{what}` must be a number, found the quoted text \"{text}\"; remove the quotes"
                )
            }
            Some(Scalar::Float(_)) => format!(
                "`{what}` must be a whole number, found {}; drop the fraction",
                node.describe()
            ),
            _ => format!(
                "`{what}` must be a whole number (for example `{min}`), found {}",
                node.describe()
            ),
        };
        self.error(node.pos, message);
        None
    }

    /// `true` or `false`.
    pub(crate) fn boolean(&mut self, node: &Node, what: &str) -> Option<bool> {
        if let Some(Scalar::Bool(b)) = node.scalar() {
            return Some(b);
        }
        let message = match node.text() {
            Some(text @ ("true" | "false" | "True" | "False" | "TRUE" | "FALSE")) => {
                format!("`{what}` must be `{text}` without quotes")
            }
            _ => format!("`{what}` must be `true` or `false`, found {}", node.describe()),
        };
        self.error(node.pos, message);
        None
    }

    /// One of a closed set of words, e.g. a restart policy. `kind` names the set in messages.
    pub(crate) fn choice<T: Copy>(
        &mut self,
        node: &Node,
        what: &str,
        kind: &str,
        options: &[(&str, T)],
    ) -> Option<T> {
        let names = || options.iter().map(|(name, _)| *name);
        let Some(text) = node.text() else {
            self.error(
                node.pos,
                format!(
                    "`{what}` must be a {kind}, found {}; use one of {}",
                    node.describe(),
                    list(names())
                ),
            );
            return None;
        };
        if let Some((_, value)) = options.iter().find(|(name, _)| *name == text) {
            return Some(*value);
        }
        let hint = match closest(text, names()) {
            Some(best) => format!(" (did you mean `{best}`?)"),
            None => String::new(),
        };
        self.error(
            node.pos,
            format!("`{what}`: unknown {kind} `{text}`; use one of {}{hint}", list(names())),
        );
        None
    }
}
