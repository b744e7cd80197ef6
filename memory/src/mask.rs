//! Masking: what must never be written to memory nor sent to a model. Each rule replaces what it
//! finds with `[masked:KIND]`; a rule with a label (`password: …`, `Bearer …`) keeps the label so
//! the text still reads. Rules run in order, private keys first (a key block contains text the
//! other rules would only partly match).
//!
//! Masking is deliberately eager: an e-mail address or a card number in a task is masked too. The
//! original never reaches the memory files, the index or a model request.

use std::borrow::Cow;
use std::sync::OnceLock;

use regex::{Captures, Regex};

/// One rule: a kind (shown in the replacement) and its pattern. A pattern with a group named
/// `label` keeps that group and masks the rest of the match; `card` matches are masked only when
/// their digits pass the Luhn check.
struct Rule {
    kind: &'static str,
    pattern: Regex,
}

/// The rules, in the order they run: `(kind, pattern)`.
const RULES: &[(&str, &str)] = &[
    (
        "private_key",
        r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----",
    ),
    (
        "api_key",
        // OpenAI/Anthropic (sk-…), AWS access key ids, GitHub tokens, Slack tokens, Google keys.
        r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{20,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35})",
    ),
    ("token", r"(?i)(?P<label>\bbearer\s+)[A-Za-z0-9._~+/\-]{12,}=*"),
    (
        "password",
        r#"(?i)(?P<label>\b[\w.\-]*?(?:password|passwd|pwd|secret|api[_-]?key|access[_-]?token|auth[_-]?token|token)\s*[:=]\s*)(?:"[^"\n]*"|'[^'\n]*'|[^\s,;]+)"#,
    ),
    ("card", r"\b(?:\d[ \-]?){12,18}\d\b"),
    ("email", r"\b[A-Za-z0-9._%+\-]+@[A-Za-z0-9.\-]+\.[A-Za-z]{2,}\b"),
];

/// The swarm's own rules (`memory.mask` in the swarm file), after the built-in ones; set once
/// per process.
static EXTRA: OnceLock<Vec<Rule>> = OnceLock::new();

/// The variable through which the supervisor hands an agent the swarm's rules (JSON:
/// `[{"name": …, "pattern": …}]`).
pub const RULES_ENV: &str = "FLOCK_MASK_RULES";

/// Adds the swarm's rules (`(name, pattern)`) to this process's masking; the first call wins.
/// `Err` names a pattern that does not compile (the swarm file's validation refuses those
/// first).
pub fn set_extra_rules(rules: &[(String, String)]) -> Result<(), String> {
    let compiled = rules
        .iter()
        .map(|(name, p)| {
            let pattern = Regex::new(p).map_err(|e| format!("mask rule `{name}`: {e}"))?;
            // A rule's kind lives as long as the process: leaked once, at start.
            Ok(Rule { kind: Box::leak(name.clone().into_boxed_str()), pattern })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let _ = EXTRA.set(compiled);
    Ok(())
}

fn rules() -> impl Iterator<Item = &'static Rule> {
    builtin().iter().chain(EXTRA.get().into_iter().flatten())
}

fn builtin() -> &'static [Rule] {
    static RULES_COMPILED: OnceLock<Vec<Rule>> = OnceLock::new();
    RULES_COMPILED.get_or_init(|| {
        RULES
            .iter()
            .map(|(kind, p)| Rule {
                kind,
                pattern: Regex::new(p).expect("the masking patterns are valid (unit-tested)"),
            })
            .collect()
    })
}

/// `text` with every secret replaced; borrowed when there was nothing to mask.
pub fn mask(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    for rule in rules() {
        if !rule.pattern.is_match(&out) {
            continue;
        }
        let replaced = rule.pattern.replace_all(&out, |c: &Captures<'_>| {
            let whole = &c[0];
            if rule.kind == "card" && !luhn(whole) {
                return whole.to_owned();
            }
            let label = c.name("label").map_or("", |m| m.as_str());
            format!("{label}[masked:{}]", rule.kind)
        });
        // A rule that matched but kept everything (a card number failing Luhn) changes nothing.
        if let Cow::Owned(s) = replaced
            && s != *out
        {
            out = Cow::Owned(s);
        }
    }
    out
}

/// Masks `text` in place; returns whether anything changed.
pub fn mask_in_place(text: &mut String) -> bool {
    match mask(text) {
        Cow::Borrowed(_) => false,
        Cow::Owned(masked) => {
            *text = masked;
            true
        }
    }
}

/// The Luhn checksum of the digits in `s` (spaces and dashes ignored).
fn luhn(s: &str) -> bool {
    let digits: Vec<u32> = s.chars().filter_map(|c| c.to_digit(10)).collect();
    if digits.len() < 13 {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| {
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 { x - 9 } else { x }
            } else {
                d
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masked(text: &str) -> String {
        mask(text).into_owned()
    }

    #[test]
    fn every_rule_masks_what_it_is_for() {
        let cases = [
            ("key sk-proj-abcdefghijklmnopqrstuvwxyz0123 here", "key [masked:api_key] here"),
            ("sk-ant-api03-AAAAAAAAAAAAAAAAAAAAAAAAAAAA", "[masked:api_key]"),
            ("aws AKIAIOSFODNN7EXAMPLE ok", "aws [masked:api_key] ok"),
            ("ghp_0123456789abcdefghijABCDEFGHIJ012345", "[masked:api_key]"),
            ("slack xoxb-123456789012-abcdefABCDEF", "slack [masked:api_key]"),
            (
                "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload",
                "Authorization: Bearer [masked:token]",
            ),
            ("password: hunter2hunter", "password: [masked:password]"),
            ("db_pwd=\"s3cr3t value\" next", "db_pwd=[masked:password] next"),
            ("API_KEY=abcd1234, then", "API_KEY=[masked:password], then"),
            ("token = 'abc def'", "token = [masked:password]"),
            ("card 4111 1111 1111 1111 paid", "card [masked:card] paid"),
            ("mail ana@example.com now", "mail [masked:email] now"),
        ];
        for (input, want) in cases {
            assert_eq!(masked(input), want, "{input}");
        }
        let pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----";
        assert_eq!(masked(&format!("x {pem} y")), "x [masked:private_key] y");
    }

    #[test]
    fn ordinary_text_is_left_alone_and_borrowed() {
        for text in [
            "max_tokens: 512 and 3 tokens: fine",
            "order 1234 5678 9012 3456 is not a card (Luhn fails)",
            "the sky-blue theme, version 2.0.1, at 10:30",
            "passwords are never stored",
        ] {
            assert!(matches!(mask(text), Cow::Borrowed(_)), "changed: {text} → {}", masked(text));
        }
    }

    #[test]
    fn the_swarms_own_rules_apply_after_the_built_in_ones() {
        set_extra_rules(&[("employee_id".into(), "EMP-[0-9]{6}".into())]).unwrap();
        assert_eq!(
            masked("badge EMP-123456 and ana@example.com"),
            "badge [masked:employee_id] and [masked:email]"
        );
        assert!(set_extra_rules(&[("bad".into(), "(".into())]).is_err());
    }

    #[test]
    fn luhn_accepts_real_test_numbers_only() {
        assert!(luhn("4111111111111111"));
        assert!(luhn("5500-0000-0000-0004"));
        assert!(!luhn("4111111111111112"));
        assert!(!luhn("1234"));
    }
}
