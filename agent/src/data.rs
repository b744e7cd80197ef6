//! The data tools a worker runs in its own process: `json_query` (values picked out of JSON by
//! a path) and `text_transform` (exact text operations a small model would get wrong). Both are
//! pure: no network, no files outside the workspace, nothing written.

use base64::Engine;
use serde_json::Value;

use crate::output::ToolOutput;
use crate::workspace::Workspace;

/// The largest JSON file `json_query` reads (a bigger one is refused, never cut: cut JSON does
/// not parse).
pub const MAX_JSON_BYTES: usize = 8 * 1024 * 1024;
/// The largest answer either tool gives the model.
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// The largest text `text_transform` takes.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;

fn bad(msg: impl std::fmt::Display) -> ToolOutput {
    ToolOutput::err(format!("BAD_REQUEST: {msg}"))
}

/// Cuts an answer to [`MAX_OUTPUT_BYTES`] on a char boundary and says so.
fn bounded(mut text: String) -> ToolOutput {
    if text.len() > MAX_OUTPUT_BYTES {
        let mut end = MAX_OUTPUT_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let total = text.len();
        text.truncate(end);
        text.push_str(&format!("\n… (cut: the answer was {total} bytes; narrow the query)"));
    }
    ToolOutput::ok(text)
}

/// `json_query {query, path? | json?}`.
pub fn json_query(ws: &Workspace, args: &Value) -> ToolOutput {
    let query = args.get("query").and_then(Value::as_str).unwrap_or_default();
    let path = args.get("path").and_then(Value::as_str).filter(|p| !p.trim().is_empty());
    let inline = args.get("json");
    let doc: Value = match (path, inline) {
        (Some(_), Some(_)) => return bad("give `path` or `json`, not both"),
        (None, None) => return bad("give `path` (a JSON file of your workspace) or `json`"),
        (Some(path), None) => {
            let bytes = match ws.read_bytes(path, MAX_JSON_BYTES) {
                Ok(b) => b,
                Err(e) => return e,
            };
            if bytes.len() > MAX_JSON_BYTES {
                return bad(format!(
                    "`{path}` is larger than {MAX_JSON_BYTES} bytes; query a smaller file"
                ));
            }
            match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => return bad(format!("`{path}` is not valid JSON: {e}")),
            }
        }
        // JSON text, or (a model's shortcut) the JSON value itself.
        (None, Some(Value::String(text))) => match serde_json::from_str(text) {
            Ok(v) => v,
            Err(e) => return bad(format!("`json` is not valid JSON: {e}")),
        },
        (None, Some(value)) => value.clone(),
    };
    let steps = match parse_query(query) {
        Ok(s) => s,
        Err(e) => return bad(format!("query `{query}`: {e}")),
    };
    let found = select(&doc, &steps);
    let spread = steps.iter().any(|s| matches!(s, Step::Each));
    let out = match (spread, found.as_slice()) {
        (false, []) => return bad(format!("query `{query}` matches nothing in this JSON")),
        (false, [one]) => (*one).clone(),
        _ => Value::Array(found.into_iter().cloned().collect()),
    };
    bounded(serde_json::to_string_pretty(&out).unwrap_or_default())
}

/// One step of a query path.
#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(i64),
    Each,
}

/// `a.b[0]["c d"][*].e`, with an optional leading `$` or `.`; empty: the whole document.
fn parse_query(query: &str) -> Result<Vec<Step>, String> {
    let q = query.trim();
    let q = q.strip_prefix('$').unwrap_or(q);
    let mut steps = Vec::new();
    let mut chars = q.chars().peekable();
    let mut key = String::new();
    let flush = |key: &mut String, steps: &mut Vec<Step>| {
        if !key.is_empty() {
            steps.push(Step::Key(std::mem::take(key)));
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '.' => flush(&mut key, &mut steps),
            '[' => {
                flush(&mut key, &mut steps);
                let mut inner = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == ']' {
                        closed = true;
                        break;
                    }
                    inner.push(c);
                }
                if !closed {
                    return Err("a `[` is not closed".into());
                }
                let inner = inner.trim();
                let quoted = inner
                    .strip_prefix('"')
                    .and_then(|s| s.strip_suffix('"'))
                    .or_else(|| inner.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')));
                steps.push(match (inner, quoted) {
                    (_, Some(k)) => Step::Key(k.to_owned()),
                    ("*", None) => Step::Each,
                    (n, None) => Step::Index(n.parse().map_err(|_| {
                        format!("`[{n}]` is not an index: use a number, `*` or a quoted key")
                    })?),
                });
            }
            ']' => return Err("a `]` has no `[`".into()),
            '*' if key.is_empty() => steps.push(Step::Each),
            c => key.push(c),
        }
    }
    flush(&mut key, &mut steps);
    Ok(steps)
}

/// The values `steps` reach from `doc`.
fn select<'a>(doc: &'a Value, steps: &[Step]) -> Vec<&'a Value> {
    let mut current = vec![doc];
    for step in steps {
        current = current
            .into_iter()
            .flat_map(|v| -> Vec<&Value> {
                match (step, v) {
                    (Step::Key(k), Value::Object(m)) => m.get(k).into_iter().collect(),
                    (Step::Index(i), Value::Array(a)) => {
                        let at = if *i < 0 { a.len() as i64 + i } else { *i };
                        usize::try_from(at).ok().and_then(|at| a.get(at)).into_iter().collect()
                    }
                    (Step::Each, Value::Array(a)) => a.iter().collect(),
                    (Step::Each, Value::Object(m)) => m.values().collect(),
                    _ => Vec::new(),
                }
            })
            .collect();
    }
    current
}

/// `text_transform {text, op, from?, to?, separator?}` (ops: [`flock_config::tools::TEXT_OPS`]).
pub fn text_transform(arguments: &str) -> ToolOutput {
    let args: Value = match serde_json::from_str(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => return bad("tool arguments must be a JSON object"),
    };
    let get = |k: &str| args.get(k).and_then(Value::as_str);
    let Some(text) = get("text") else {
        return bad("text_transform needs a string argument `text`");
    };
    if text.len() > MAX_TEXT_BYTES {
        return bad(format!("`text` is larger than {MAX_TEXT_BYTES} bytes"));
    }
    let op = get("op").unwrap_or_default();
    let lines = || text.lines().collect::<Vec<_>>();
    let out = match op {
        "upper" => text.to_uppercase(),
        "lower" => text.to_lowercase(),
        "trim" => text.trim().to_owned(),
        "replace" => match get("from") {
            Some(from) if !from.is_empty() => {
                let to = get("to").unwrap_or_default();
                // Sized before it is built: many matches of a short `from` times a long `to`
                // would not fit in memory.
                let grown = text.matches(from).count().saturating_mul(to.len());
                if grown.saturating_add(text.len()) > MAX_TEXT_BYTES {
                    return bad(format!("the result would be over {MAX_TEXT_BYTES} bytes"));
                }
                text.replace(from, to)
            }
            _ => return bad("replace needs `from` (the text to replace) and `to`"),
        },
        "split" => {
            let sep = get("separator").filter(|s| !s.is_empty()).unwrap_or("\n");
            Value::from(text.split(sep).collect::<Vec<_>>()).to_string()
        }
        "lines_sorted" => {
            let mut l = lines();
            l.sort_unstable();
            l.join("\n")
        }
        "lines_unique" => {
            let mut seen = std::collections::HashSet::new();
            lines().into_iter().filter(|l| seen.insert(*l)).collect::<Vec<_>>().join("\n")
        }
        "count" => serde_json::json!({
            "chars": text.chars().count(),
            "words": text.split_whitespace().count(),
            "lines": text.lines().count(),
            "bytes": text.len(),
        })
        .to_string(),
        "slug" => slug(text),
        "base64_encode" => base64::engine::general_purpose::STANDARD.encode(text),
        "base64_decode" => {
            let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
            match base64::engine::general_purpose::STANDARD.decode(clean) {
                Ok(bytes) => match String::from_utf8(bytes) {
                    Ok(s) => s,
                    Err(_) => return bad("the decoded bytes are not text (UTF-8)"),
                },
                Err(e) => return bad(format!("`text` is not base64: {e}")),
            }
        }
        other => {
            return bad(format!(
                "op `{other}` is not one of: {}",
                flock_config::tools::TEXT_OPS.join(", ")
            ));
        }
    };
    bounded(out)
}

/// Lower-case ASCII letters and digits joined by single `-`.
fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ws() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        (dir, ws)
    }

    #[test]
    fn json_query_picks_values_from_a_workspace_file() {
        let (_d, ws) = ws();
        let doc = json!({"items": [{"name": "pen", "price": 2}, {"name": "ink", "price": 5}],
                         "shop": {"open hours": "9-5"}});
        assert!(ws.write("data/shop.json", &doc.to_string()).ok);
        let q = |query: &str| json_query(&ws, &json!({"query": query, "path": "data/shop.json"}));
        assert_eq!(q("items[1].name").content, "\"ink\"");
        assert_eq!(q("$.items[-1].price").content, "5");
        let prices: Value = serde_json::from_str(&q("items[*].price").content).unwrap();
        assert_eq!(prices, json!([2, 5]));
        assert_eq!(q("shop[\"open hours\"]").content, "\"9-5\"");
        assert_eq!(serde_json::from_str::<Value>(&q("").content).unwrap(), doc);
        let miss = q("items[7]");
        assert!(!miss.ok && miss.content.contains("matches nothing"), "{miss:?}");
        let broken = q("items[x]");
        assert!(!broken.ok && broken.content.contains("not an index"), "{broken:?}");
    }

    #[test]
    fn json_query_takes_inline_json_and_refuses_what_it_cannot_read() {
        let (_d, ws) = ws();
        let out = json_query(&ws, &json!({"query": "a.b", "json": "{\"a\": {\"b\": [1]}}"}));
        assert_eq!(out.content.split_whitespace().collect::<String>(), "[1]");
        let both = json_query(&ws, &json!({"query": "a", "json": "{}", "path": "x.json"}));
        assert!(!both.ok && both.content.contains("not both"));
        let bad_json = json_query(&ws, &json!({"query": "a", "json": "{a"}));
        assert!(!bad_json.ok && bad_json.content.contains("not valid JSON"));
        // Out of the workspace, as for fs_read.
        let outside = json_query(&ws, &json!({"query": "a", "path": "../../etc/passwd"}));
        assert!(!outside.ok, "{outside:?}");
    }

    #[test]
    fn text_transform_is_exact() {
        let t = |args: Value| text_transform(&args.to_string());
        assert_eq!(t(json!({"text": "Hello", "op": "upper"})).content, "HELLO");
        assert_eq!(
            t(json!({"text": "a-b-a", "op": "replace", "from": "a", "to": "x"})).content,
            "x-b-x"
        );
        assert_eq!(t(json!({"text": "b\na\nb", "op": "lines_sorted"})).content, "a\nb\nb");
        assert_eq!(t(json!({"text": "b\na\nb", "op": "lines_unique"})).content, "b\na");
        assert_eq!(
            t(json!({"text": "a,b", "op": "split", "separator": ","})).content,
            "[\"a\",\"b\"]"
        );
        assert_eq!(
            t(json!({"text": " Q3 Report: Sales! ", "op": "slug"})).content,
            "q3-report-sales"
        );
        let count: Value =
            serde_json::from_str(&t(json!({"text": "one two\nthree", "op": "count"})).content)
                .unwrap();
        assert_eq!((count["words"].as_u64(), count["lines"].as_u64()), (Some(3), Some(2)));
        let enc = t(json!({"text": "héllo", "op": "base64_encode"})).content;
        assert_eq!(t(json!({"text": enc, "op": "base64_decode"})).content, "héllo");
        let unknown = t(json!({"text": "x", "op": "reverse"}));
        assert!(!unknown.ok && unknown.content.contains("upper, lower"), "{unknown:?}");
        assert!(!t(json!({"text": "x", "op": "replace"})).ok);
        // A replacement that would blow up is refused before it is built.
        let huge = t(
            json!({"text": "a".repeat(1000), "op": "replace", "from": "a", "to": "b".repeat(2000)}),
        );
        assert!(!huge.ok && huge.content.contains("would be over"), "{}", huge.content);
    }
}
