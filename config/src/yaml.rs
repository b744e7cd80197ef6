//! A small YAML node tree that remembers where every node came from, so validation can point at
//! the offending key or value. Built from the event stream of `granit-parser` (the parser
//! `serde-saphyr` already uses, re-exported by it, so no extra crate is compiled).
//!
//! This is not a general YAML library: it resolves plain scalars with the YAML 1.2 core schema,
//! expands aliases by copying, and reads only the first document.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Marker, Parser, ScalarStyle, Span};

use crate::error::{Pos, Report};

/// Where a parser event starts.
fn pos_of(marker: &Marker) -> Pos {
    // granit-parser lines are 1-based already, columns 0-based.
    Pos { line: marker.line(), column: marker.col() + 1 }
}

/// A YAML node with its source position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub value: Value,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// `quoted` is true for quoted and block scalars and for `!!str`-tagged ones: those are always
    /// strings, never numbers, booleans or null.
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Entries in file order. Duplicate keys are reported while building and only the first is
    /// used by lookups.
    Map(Vec<(Node, Node)>),
}

/// A scalar's type under the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scalar<'a> {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'a str),
}

impl Node {
    /// The scalar this node holds, resolved; `None` for sequences and mappings.
    pub(crate) fn scalar(&self) -> Option<Scalar<'_>> {
        match &self.value {
            Value::Scalar { text, quoted: true } => Some(Scalar::Str(text)),
            Value::Scalar { text, quoted: false } => Some(resolve_plain(text)),
            _ => None,
        }
    }

    /// The raw text of a scalar of any type (`8080`, `true`, `hello`), or `None` for null and
    /// collections. Used where the value is free text and typing `PORT: 8080` should just work.
    pub(crate) fn text(&self) -> Option<&str> {
        match (&self.value, self.scalar()) {
            (_, Some(Scalar::Null)) => None,
            (Value::Scalar { text, .. }, _) => Some(text),
            _ => None,
        }
    }

    /// `key:` with nothing after it (as opposed to an explicit `~` or `null`).
    fn is_empty_plain(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, quoted: false } if text.is_empty())
    }

    pub(crate) fn is_null(&self) -> bool {
        self.scalar() == Some(Scalar::Null)
    }

    /// The entries if this node is a mapping.
    pub(crate) fn entries(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            Value::Map(entries) => Some(entries),
            _ => None,
        }
    }

    /// A short description of what the node is, for "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> String {
        match (&self.value, self.scalar()) {
            (Value::Seq(_), _) => "a list".to_owned(),
            (Value::Map(_), _) => "a mapping".to_owned(),
            (_, Some(Scalar::Null)) => "nothing".to_owned(),
            (_, Some(Scalar::Bool(b))) => format!("the boolean `{b}`"),
            (_, Some(Scalar::Int(_) | Scalar::Float(_))) => {
                format!("the number `{}`", self.text().unwrap_or_default())
            }
            (_, Some(Scalar::Str(s))) => format!("the text \"{}\"", shorten(s)),
            (Value::Scalar { .. }, None) => "a scalar".to_owned(),
        }
    }

    /// What this subtree costs the expansion budget: one per node plus the bytes of its text.
    fn weight(&self) -> usize {
        match &self.value {
            Value::Scalar { text, .. } => 1 + text.len(),
            Value::Seq(items) => 1 + items.iter().map(Node::weight).sum::<usize>(),
            Value::Map(entries) => {
                1 + entries.iter().map(|(k, v)| k.weight() + v.weight()).sum::<usize>()
            }
        }
    }
}

/// Finds `key` in a mapping's entries: the key node and the value node.
pub(crate) fn lookup<'n>(entries: &'n [(Node, Node)], key: &str) -> Option<(&'n Node, &'n Node)> {
    entries.iter().find(|(k, _)| k.text() == Some(key)).map(|(k, v)| (k, v))
}

fn shorten(s: &str) -> String {
    const MAX: usize = 40;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(MAX).collect::<String>())
    }
}

/// YAML 1.2 core schema resolution of a plain (unquoted) scalar.
fn resolve_plain(text: &str) -> Scalar<'_> {
    match text {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "true" | "True" | "TRUE" => return Scalar::Bool(true),
        "false" | "False" | "FALSE" => return Scalar::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Scalar::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Scalar::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Scalar::Float(f64::NAN),
        _ => {}
    }
    if let Some(int) = parse_int(text) {
        return Scalar::Int(int);
    }
    // Rust's float parser also takes `inf`, `nan` and `infinity`, which YAML reads as text, so
    // only hand it strings made of number characters.
    let numeric = text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b))
        && text.bytes().any(|b| b.is_ascii_digit());
    if numeric && let Ok(float) = text.parse::<f64>() {
        return Scalar::Float(float);
    }
    Scalar::Str(text)
}

/// `[-+]?[0-9]+`, `0o[0-7]+` or `0x[0-9a-fA-F]+`.
fn parse_int(text: &str) -> Option<i128> {
    let radix_digits = |digits: &str, radix: u32| {
        if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
            return None;
        }
        i128::from_str_radix(digits, radix).ok()
    };
    if let Some(hex) = text.strip_prefix("0x") {
        return radix_digits(hex, 16);
    }
    if let Some(octal) = text.strip_prefix("0o") {
        return radix_digits(octal, 8);
    }
    let (negative, digits) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let value = radix_digits(digits, 10)?;
    Some(if negative { -value } else { value })
}

/// Most a document may expand to, in nodes plus bytes of text. Aliases are copied, so a few
/// nested anchors could otherwise blow up into billions of nodes or gigabytes of text ("billion
/// laughs"); real swarm files are far smaller. Checked before each copy is made.
const MAX_WEIGHT: usize = 32 * 1024 * 1024;

/// Parses `text` into a tree. Syntax errors and duplicate keys are reported to `report`; on a
/// syntax error the tree is `None` (the parser cannot go on). An empty document is `Some` null.
pub(crate) fn parse(text: &str, report: &mut Report<'_>) -> Option<Node> {
    let mut builder = Builder::default();
    for event in Parser::new_from_str(text) {
        match event {
            Ok((event, span)) => match builder.event(event, span, report) {
                Ok(Flow::Continue) => {}
                Ok(Flow::Done) => break,
                Err((pos, message)) => {
                    report.error(pos, message);
                    return None;
                }
            },
            Err(error) => {
                let pos = pos_of(error.marker());
                report.error(
                    pos,
                    format!("YAML syntax error: {}; fix the YAML at this position", error.info()),
                );
                return None;
            }
        }
    }
    Some(builder.root.unwrap_or(Node {
        value: Value::Scalar { text: String::new(), quoted: false },
        pos: Pos::START,
    }))
}

enum Flow {
    Continue,
    Done,
}

/// A collection being built, with the anchor id to register when it closes.
enum Frame {
    Seq {
        pos: Pos,
        anchor: usize,
        items: Vec<Node>,
    },
    Map {
        pos: Pos,
        anchor: usize,
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        /// Where each key was first seen: duplicates found in O(1), not by a scan.
        seen: HashMap<String, Pos>,
    },
}

#[derive(Default)]
struct Builder {
    stack: Vec<Frame>,
    /// Completed anchors with their weight.
    anchors: HashMap<usize, (Node, usize)>,
    root: Option<Node>,
    /// The expansion so far (nodes + bytes).
    weight: usize,
    documents: usize,
}

impl Builder {
    fn event(
        &mut self,
        event: Event<'_>,
        span: Span,
        report: &mut Report<'_>,
    ) -> Result<Flow, (Pos, String)> {
        let pos = pos_of(&span.start);
        match event {
            Event::DocumentStart(..) => {
                self.documents += 1;
                if self.documents > 1 {
                    report.error(
                        pos,
                        "a second YAML document starts here; a swarm file holds exactly one: \
                         remove this `---` and what follows, or move it to its own file",
                    );
                    return Ok(Flow::Done);
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                let quoted = style != ScalarStyle::Plain
                    || tag.as_ref().and_then(|t| t.core_suffix()) == Some("str");
                let weight = 1 + text.len();
                self.finish(
                    Node { value: Value::Scalar { text: text.into_owned(), quoted }, pos },
                    weight,
                    anchor,
                    report,
                )?;
            }
            Event::SequenceStart(_, anchor, _) => {
                self.stack.push(Frame::Seq { pos, anchor, items: Vec::new() });
            }
            Event::MappingStart(_, anchor, _) => {
                let (entries, seen) = (Vec::new(), HashMap::new());
                self.stack.push(Frame::Map { pos, anchor, entries, key: None, seen });
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Seq { pos, anchor, items }) => {
                    self.finish(Node { value: Value::Seq(items), pos }, 1, anchor, report)?;
                }
                Some(Frame::Map { pos, anchor, entries, .. }) => {
                    self.finish(Node { value: Value::Map(entries), pos }, 1, anchor, report)?;
                }
                None => return Err((pos, "unbalanced YAML structure".to_owned())),
            },
            Event::Alias(id) => {
                let Some(weight) = self.anchors.get(&id).map(|(_, w)| *w) else {
                    return Err((
                        pos,
                        "alias refers to an anchor that is not complete yet (a node cannot \
                         contain an alias of itself); point it at an earlier `&name`"
                            .to_owned(),
                    ));
                };
                // The budget is checked before the copy is made.
                self.charge(weight, pos)?;
                let mut node = self.anchors[&id].0.clone();
                // The copy keeps its inner positions; only the alias itself points at `*name`.
                node.pos = pos;
                self.place(node, report);
            }
            Event::UnresolvedAlias(name) => {
                return Err((
                    pos,
                    format!(
                        "alias `*{name}` refers to an unknown anchor; define it with \
                         `&{name}` first"
                    ),
                ));
            }
            _ => {}
        }
        Ok(Flow::Continue)
    }

    /// Counts `weight` against the expansion budget.
    fn charge(&mut self, weight: usize, pos: Pos) -> Result<(), (Pos, String)> {
        self.weight = self.weight.saturating_add(weight);
        if self.weight > MAX_WEIGHT {
            return Err((
                pos,
                format!(
                    "the document expands to more than {} MiB of nodes and text (through \
                     aliases?); simplify it",
                    MAX_WEIGHT >> 20
                ),
            ));
        }
        Ok(())
    }

    /// A node just completed (`weight`: its own cost, its children were counted already).
    fn finish(
        &mut self,
        node: Node,
        weight: usize,
        anchor: usize,
        report: &mut Report<'_>,
    ) -> Result<(), (Pos, String)> {
        self.charge(weight, node.pos)?;
        if anchor != 0 {
            let total = node.weight();
            self.anchors.insert(anchor, (node.clone(), total));
        }
        self.place(node, report);
        Ok(())
    }

    /// Places a completed node: into the open collection, or as the document root.
    fn place(&mut self, node: Node, report: &mut Report<'_>) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, seen, .. }) => match key.take() {
                None => *key = Some(node),
                Some(k) => {
                    let mut value = node;
                    // An empty value (`key:` and nothing after it) has no text to point at; its
                    // key is where the user will look.
                    if value.is_empty_plain() {
                        value.pos = k.pos;
                    }
                    if let Some(name) = k.text() {
                        match seen.get(name) {
                            Some(first) => report.error(
                                k.pos,
                                format!(
                                    "duplicate key `{name}` (first at line {}): keep only one \
                                     of them",
                                    first.line
                                ),
                            ),
                            None => {
                                seen.insert(name.to_owned(), k.pos);
                            }
                        }
                    }
                    entries.push((k, value));
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(text: &str) -> Node {
        let mut errors = Vec::new();
        let node = parse(text, &mut Report::new("t.yaml", &mut errors));
        assert!(errors.is_empty(), "{errors:?}");
        node.unwrap_or_else(|| panic!("no tree"))
    }

    #[test]
    fn plain_scalars_resolve_with_the_core_schema() {
        assert_eq!(resolve_plain("~"), Scalar::Null);
        assert_eq!(resolve_plain("True"), Scalar::Bool(true));
        assert_eq!(resolve_plain("yes"), Scalar::Str("yes"));
        assert_eq!(resolve_plain("-12"), Scalar::Int(-12));
        assert_eq!(resolve_plain("0x1F"), Scalar::Int(31));
        assert_eq!(resolve_plain("1.5e3"), Scalar::Float(1500.0));
        assert_eq!(resolve_plain("inf"), Scalar::Str("inf"));
        assert_eq!(resolve_plain("1_000"), Scalar::Str("1_000"));
    }

    #[test]
    fn quoted_scalars_stay_strings() {
        let node = tree("a: '5'\nb: 5\n");
        let entries = node.entries().unwrap_or_default();
        assert_eq!(lookup(entries, "a").map(|(_, v)| v.scalar()), Some(Some(Scalar::Str("5"))));
        assert_eq!(lookup(entries, "b").map(|(_, v)| v.scalar()), Some(Some(Scalar::Int(5))));
    }

    #[test]
    fn nodes_carry_one_based_positions() {
        let node = tree("top:\n  key: value\n");
        let entries = node.entries().unwrap_or_default();
        let (_, inner) = lookup(entries, "top").unwrap_or_else(|| panic!("no top"));
        let (key, value) =
            lookup(inner.entries().unwrap_or_default(), "key").unwrap_or_else(|| panic!("no key"));
        assert_eq!(key.pos, Pos { line: 2, column: 3 });
        assert_eq!(value.pos, Pos { line: 2, column: 8 });
    }

    #[test]
    fn aliases_are_expanded() {
        let node = tree("a: &x [1, 2]\nb: *x\n");
        let entries = node.entries().unwrap_or_default();
        let a = lookup(entries, "a").map(|(_, v)| v.value.clone());
        let b = lookup(entries, "b").map(|(_, v)| v.value.clone());
        assert_eq!(a, b);
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_expands() {
        // 64 KiB of text, aliased ten times per level, six levels: 64 GiB once expanded.
        let mut yaml = format!("l0: &l0 \"{}\"\n", "x".repeat(64 * 1024));
        for i in 1..=6 {
            let refs = vec![format!("*l{}", i - 1); 10].join(", ");
            yaml.push_str(&format!("l{i}: &l{i} [{refs}]\n"));
        }
        let mut errors = Vec::new();
        let node = parse(&yaml, &mut Report::new("bomb.yaml", &mut errors));
        assert!(node.is_none());
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].message.contains("through aliases"), "{}", errors[0].message);
    }

    #[test]
    fn many_keys_are_checked_for_duplicates_without_a_scan_each() {
        let mut yaml: String = (0..80_000).map(|i| format!("k{i}: {i}\n")).collect();
        yaml.push_str("k79999: again\n");
        let mut errors = Vec::new();
        let node = parse(&yaml, &mut Report::new("keys.yaml", &mut errors));
        assert_eq!(node.and_then(|n| n.entries().map(<[_]>::len)), Some(80_001));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].message.contains("first at line 80000"), "{}", errors[0].message);
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let mut errors = Vec::new();
        parse("a: 1\nb: 2\na: 3\n", &mut Report::new("t.yaml", &mut errors));
        assert_eq!(errors.len(), 1);
        assert_eq!((errors[0].line, errors[0].column), (3, 1));
        assert!(errors[0].message.contains("first at line 1"), "{}", errors[0].message);
    }
}
