//! Scripted-model transcripts: the `rules:` list, read from a transcript file or inline in a
//! model definition, validated into a [`Transcript`].
//!
//! Agent names in `args.to` cannot be checked here (a transcript does not know its swarm), so they
//! are returned as [`Target`]s and checked once every agent is known.

use crate::error::Pos;
use crate::error::{Report, closest, list};
use crate::spec::{Matcher, ScriptRule, ScriptStep, Transcript};
use crate::yaml::{Node, Scalar, Value, lookup};

const FILE_KEYS: &[&str] = &["rules"];
const RULE_KEYS: &[&str] = &["match", "equals", "steps", "reply"];
const STEP_KEYS: &[&str] = &["tool", "args", "delay_ms"];

/// An `args.to` agent name waiting to be checked against the swarm's agents.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub file: String,
    pub pos: Pos,
    pub what: String,
    pub name: String,
}

/// A transcript file: a mapping with one key, `rules`.
pub(crate) fn file(root: &Node, report: &mut Report<'_>, targets: &mut Vec<Target>) -> Transcript {
    if root.is_null() {
        report.error(root.pos, "the transcript file is empty: add a `rules:` list");
        return Transcript::default();
    }
    let Some(entries) = root.entries() else {
        let found = root.describe();
        report.error(
            root.pos,
            format!("a transcript file must be a mapping with `rules:`, found {found}"),
        );
        return Transcript::default();
    };
    report.unknown_keys(entries, FILE_KEYS, "the transcript file");
    match lookup(entries, "rules") {
        Some((_, node)) => rules(node, "rules", report, targets),
        None => {
            report.error(root.pos, "the transcript file has no `rules:` list; add one");
            Transcript::default()
        }
    }
}

/// A `rules:` list. `what` is its dotted path (`rules`, or `models.x.rules` when inline).
pub(crate) fn rules(
    node: &Node,
    what: &str,
    report: &mut Report<'_>,
    targets: &mut Vec<Target>,
) -> Transcript {
    let Some(items) = report.list(node, what) else {
        return Transcript::default();
    };
    let rules = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| rule(item, &format!("{what}[{i}]"), report, targets))
        .collect();
    Transcript { rules }
}

fn rule(
    node: &Node,
    what: &str,
    report: &mut Report<'_>,
    targets: &mut Vec<Target>,
) -> Option<ScriptRule> {
    let entries = report.mapping(node, what)?;
    report.unknown_keys(entries, RULE_KEYS, &format!("`{what}`"));

    let matcher = match (lookup(entries, "match"), lookup(entries, "equals")) {
        (Some(_), Some((equals_key, _))) => {
            report.error(
                equals_key.pos,
                format!(
                    "`{what}` has both `match` and `equals`; keep one (`match` looks for the text \
                     anywhere in the input, `equals` compares the whole input)"
                ),
            );
            Matcher::Any
        }
        (Some((_, node)), None) => match report.string(node, &format!("{what}.match")) {
            Some(text) if text == "*" => Matcher::Any,
            Some(text) => Matcher::Contains(text),
            None => Matcher::Any,
        },
        (None, Some((_, node))) => {
            report.string(node, &format!("{what}.equals")).map_or(Matcher::Any, Matcher::Equals)
        }
        (None, None) => Matcher::Any,
    };

    let mut steps = Vec::new();
    if let Some((_, node)) = lookup(entries, "steps")
        && !node.is_null()
        && let Some(items) = report.list(node, &format!("{what}.steps"))
    {
        for (i, item) in items.iter().enumerate() {
            if let Some(s) = step(item, &format!("{what}.steps[{i}]"), report, targets) {
                steps.push(s);
            }
        }
    }

    let reply = match lookup(entries, "reply") {
        Some((_, node)) if !node.is_null() => {
            report.string(node, &format!("{what}.reply")).unwrap_or_default()
        }
        _ => String::new(),
    };
    Some(ScriptRule { matcher, steps, reply })
}

fn step(
    node: &Node,
    what: &str,
    report: &mut Report<'_>,
    targets: &mut Vec<Target>,
) -> Option<ScriptStep> {
    let entries = report.mapping(node, what)?;
    report.unknown_keys(entries, STEP_KEYS, &format!("`{what}`"));
    let args = lookup(entries, "args");
    match (lookup(entries, "tool"), lookup(entries, "delay_ms")) {
        (Some(_), Some((delay_key, _))) => {
            report.error(
                delay_key.pos,
                format!(
                    "`{what}` has both `tool` and `delay_ms`; a step does one thing: split it into \
                     two steps"
                ),
            );
            None
        }
        (None, None) => {
            report.error(
                node.pos,
                format!(
                    "`{what}` does nothing; give it `tool: NAME` (with `args`) or `delay_ms: N`"
                ),
            );
            None
        }
        (None, Some((_, delay))) => {
            if let Some((args_key, _)) = args {
                report.error(
                    args_key.pos,
                    format!("`{what}.args` only goes with `tool`; remove it from this delay step"),
                );
            }
            report
                .uint(delay, &format!("{what}.delay_ms"), 0, i128::from(u64::MAX))
                .map(ScriptStep::DelayMs)
        }
        (Some((_, tool)), None) => tool_step(tool, args.map(|(_, v)| v), what, report, targets),
    }
}

fn tool_step(
    tool: &Node,
    args: Option<&Node>,
    what: &str,
    report: &mut Report<'_>,
    targets: &mut Vec<Target>,
) -> Option<ScriptStep> {
    let name = report.string(tool, &format!("{what}.tool"))?;
    if crate::tools::tool(&name).is_none_or(|t| !t.is_model_tool()) {
        report.error(
            tool.pos,
            format!(
                "`{what}.tool`: unknown tool `{name}`; scripted models can call {}{}",
                list(crate::tools::model_tools()),
                match closest(&name, crate::tools::model_tools()) {
                    Some(best) => format!(" (did you mean `{best}`?)"),
                    None => String::new(),
                }
            ),
        );
        return None;
    }
    let args_what = format!("{what}.args");
    let arguments = match args {
        None => "{}".to_owned(),
        Some(node) if node.is_null() => "{}".to_owned(),
        Some(node) => {
            report.mapping(node, &args_what)?;
            let mut out = String::new();
            json(node, &args_what, report, &mut out).then_some(out)?
        }
    };
    if matches!(name.as_str(), "agents__send" | "agents__request") {
        check_call_args(&name, tool, args, &args_what, report, targets);
    }
    Some(ScriptStep::Tool { name, arguments })
}

/// `agents__send` and `agents__request` need `to` (an agent of the swarm) and `text`;
/// a request may carry `timeout_ms`. Other keys pass through: the agent runtime owns the tool's
/// full schema and feeds a bad call back to the model.
fn check_call_args(
    tool_name: &str,
    tool: &Node,
    args: Option<&Node>,
    what: &str,
    report: &mut Report<'_>,
    targets: &mut Vec<Target>,
) {
    let Some(entries) = args.and_then(Node::entries) else {
        if args.is_none_or(Node::is_null) {
            report.error(
                tool.pos,
                format!(
                    "`{tool_name}` needs `args` with `to` and `text`; add \
                     `args: {{ to: AGENT, text: \"…\" }}` to this step"
                ),
            );
        }
        return;
    };
    let at = args.map_or(tool.pos, |a| a.pos);
    match lookup(entries, "to") {
        None => report.error(
            at,
            format!("`{what}` is missing `to`; name the agent to call, e.g. `to: worker-1`"),
        ),
        Some((_, node)) => {
            if let Some(name) = report.strict_string(node, &format!("{what}.to"))
                // `{from}`/`{input}` are filled in at run time, so such a name cannot be checked.
                && !name.contains('{')
            {
                targets.push(Target {
                    file: report.file().to_owned(),
                    pos: node.pos,
                    what: format!("{what}.to"),
                    name,
                });
            }
        }
    }
    match lookup(entries, "text") {
        None => report.error(
            at,
            format!("`{what}` is missing `text`; add the message, e.g. `text: \"do {{input}}\"`"),
        ),
        Some((_, node)) => {
            report.strict_string(node, &format!("{what}.text"));
        }
    }
    if tool_name == "agents__request"
        && let Some((_, node)) = lookup(entries, "timeout_ms")
    {
        report.uint::<u64>(node, &format!("{what}.timeout_ms"), 1, i128::from(u64::MAX));
    }
}

/// Writes `node` as JSON into `out`, keeping mapping keys in file order (serde_json's own map
/// would sort them, and its `preserve_order` feature would change the map type for the whole
/// workspace). Returns false after reporting a value JSON cannot hold.
fn json(node: &Node, what: &str, report: &mut Report<'_>, out: &mut String) -> bool {
    match &node.value {
        Value::Seq(items) => {
            out.push('[');
            let mut ok = true;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                ok &= json(item, &format!("{what}[{i}]"), report, out);
            }
            out.push(']');
            ok
        }
        Value::Map(entries) => {
            out.push('{');
            let mut ok = true;
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let Some(name) = key.text() else {
                    report.error(
                        key.pos,
                        format!("keys in `{what}` must be plain names, found {}", key.describe()),
                    );
                    ok = false;
                    continue;
                };
                out.push_str(&serde_json::Value::from(name).to_string());
                out.push(':');
                ok &= json(value, &format!("{what}.{name}"), report, out);
            }
            out.push('}');
            ok
        }
        Value::Scalar { .. } => {
            let value = match node.scalar() {
                Some(Scalar::Null) | None => serde_json::Value::Null,
                Some(Scalar::Bool(b)) => serde_json::Value::from(b),
                Some(Scalar::Str(s)) => serde_json::Value::from(s),
                Some(Scalar::Int(n)) => match (i64::try_from(n), u64::try_from(n)) {
                    (Ok(n), _) => serde_json::Value::from(n),
                    (_, Ok(n)) => serde_json::Value::from(n),
                    _ => {
                        report.error(
                            node.pos,
                            format!(
                                "`{what}` is too large for a JSON number; quote it to send text"
                            ),
                        );
                        return false;
                    }
                },
                Some(Scalar::Float(f)) => match serde_json::Number::from_f64(f) {
                    Some(n) => serde_json::Value::Number(n),
                    None => {
                        report.error(
                            node.pos,
                            format!("`{what}`: JSON has no infinity or NaN; quote it to send text"),
                        );
                        return false;
                    }
                },
            };
            out.push_str(&value.to_string());
            true
        }
    }
}
