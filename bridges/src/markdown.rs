//! Markdown as agents write it → Telegram MarkdownV2 (https://core.telegram.org/bots/api#markdownv2-style).
//!
//! Understood: `**bold**`/`__bold__`, `*italic*`/`_italic_`, `~~strike~~`, `` `code` `` (any
//! backtick run), fenced code blocks with a language, `[text](http…|mailto:…)` links, `# headings`
//! (bold), and `\*`-style escapes. Everything else is text, escaped by the MarkdownV2 rules: in
//! text every one of ``_*[]()~`>#+-=|{}.!`` and `\`; inside code only `` ` `` and `\`; inside a
//! link's URL only `)` and `\`. A marker that does not close (on its line) is text, so no input
//! makes a message Telegram refuses with "can't parse entities".
//!
//! Two rules of Telegram shape the output: `code`/`pre` can be inside no other entity (so a code
//! span in bold closes the bold around it), and entities never nest in themselves (so `__`, which
//! MarkdownV2 reads as underline, never comes out of two italics meeting).
//!
//! The text is parsed into characters, each with the entities it is in; a message is then cut
//! at the platform's limit with every open entity closed at the cut and reopened in the next
//! message, so each message is valid on its own.

use std::collections::HashMap;

/// Characters MarkdownV2 reserves in text: each is escaped with `\`.
pub const RESERVED: &str = "_*[]()~`>#+-=|{}.!\\";

/// The longest URL a link may have (longer ones stay text): every message holding part of a
/// link's label repeats its URL, so a URL near the message limit would leave no room for the
/// label; and it bounds the scan for a link's end.
pub const MAX_URL_BYTES: usize = 512;

/// An entity of the output.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Entity {
    Bold,
    Italic,
    Strike,
    Code,
    /// A code block, with its language (may be empty).
    Pre(String),
    /// A link, with its URL.
    Link(String),
}

impl Entity {
    fn open(&self) -> String {
        match self {
            Entity::Bold => "*".into(),
            Entity::Italic => "_".into(),
            Entity::Strike => "~".into(),
            Entity::Code => "`".into(),
            Entity::Pre(lang) => format!("```{lang}\n"),
            Entity::Link(_) => "[".into(),
        }
    }

    fn close(&self) -> String {
        match self {
            Entity::Bold => "*".into(),
            Entity::Italic => "_".into(),
            Entity::Strike => "~".into(),
            Entity::Code => "`".into(),
            Entity::Pre(_) => "```".into(),
            Entity::Link(url) => {
                let mut s = String::from("](");
                for c in url.chars() {
                    if c == ')' || c == '\\' {
                        s.push('\\');
                    }
                    s.push(c);
                }
                s.push(')');
                s
            }
        }
    }

    fn verbatim(&self) -> bool {
        matches!(self, Entity::Code | Entity::Pre(_))
    }
}

/// Inline styles of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    Bold,
    Italic,
    Strike,
}

/// Parsed Markdown.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Span {
    Text(String),
    Code(String),
    Pre(String, String),
    Styled(Style, Vec<Span>),
    Link(Vec<Span>, String),
}

/// Text as characters, each with the entities it is in (an index into `contexts`).
#[derive(Debug, Default)]
pub struct Formatted {
    atoms: Vec<(char, usize)>,
    contexts: Vec<Vec<Entity>>,
    interned: HashMap<Vec<Entity>, usize>,
    /// Atoms before this index may not be a place to cut (the author's name).
    unbreakable: usize,
}

impl Formatted {
    fn context(&mut self, ctx: &[Entity]) -> usize {
        if let Some(&i) = self.interned.get(ctx) {
            return i;
        }
        self.contexts.push(ctx.to_vec());
        self.interned.insert(ctx.to_vec(), self.contexts.len() - 1);
        self.contexts.len() - 1
    }

    fn push_str(&mut self, text: &str, ctx: &[Entity]) {
        let id = self.context(ctx);
        self.atoms.extend(text.chars().map(|c| (c, id)));
    }

    fn push_spans(&mut self, spans: &[Span], ctx: &mut Vec<Entity>) {
        for span in spans {
            match span {
                Span::Text(t) => self.push_str(t, ctx),
                // Telegram: code and pre are inside no other entity.
                Span::Code(t) => self.push_str(t, &[Entity::Code]),
                Span::Pre(lang, t) => self.push_str(t, &[Entity::Pre(lang.clone())]),
                Span::Styled(style, inner) => {
                    let e = match style {
                        Style::Bold => Entity::Bold,
                        Style::Italic => Entity::Italic,
                        Style::Strike => Entity::Strike,
                    };
                    if ctx.contains(&e) {
                        self.push_spans(inner, ctx);
                    } else {
                        ctx.push(e);
                        self.push_spans(inner, ctx);
                        ctx.pop();
                    }
                }
                Span::Link(label, url) => {
                    ctx.push(Entity::Link(url.clone()));
                    self.push_spans(label, ctx);
                    ctx.pop();
                }
            }
        }
    }

    /// The length of atom `i` once escaped.
    fn cost(&self, i: usize) -> usize {
        let (c, ctx) = self.atoms[i];
        let verbatim = self.contexts[ctx].last().is_some_and(Entity::verbatim);
        let escaped = if verbatim { c == '`' || c == '\\' } else { RESERVED.contains(c) };
        1 + usize::from(escaped)
    }

    /// Markers between a character in `from` and one in `to` (closes, then opens).
    fn transition(&self, from: usize, to: usize, out: &mut String) {
        if from == to {
            return;
        }
        let (a, b) = (&self.contexts[from], &self.contexts[to]);
        let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        for e in a[common..].iter().rev() {
            out.push_str(&e.close());
        }
        for e in &b[common..] {
            out.push_str(&e.open());
        }
    }

    fn transition_len(&self, from: usize, to: usize) -> usize {
        let mut s = String::new();
        self.transition(from, to, &mut s);
        s.chars().count()
    }

    fn root(&mut self) -> usize {
        self.context(&[])
    }

    /// MarkdownV2 for atoms `range`, every entity closed at its end.
    fn render(&self, range: std::ops::Range<usize>, root: usize) -> String {
        let mut out = String::new();
        let mut prev = root;
        for i in range {
            let (c, ctx) = self.atoms[i];
            self.transition(prev, ctx, &mut out);
            if self.cost(i) == 2 {
                out.push('\\');
            }
            out.push(c);
            prev = ctx;
        }
        self.transition(prev, root, &mut out);
        out
    }

    /// MarkdownV2 messages of at most `limit` characters each: cut at the last line break that
    /// fits, else the last space (the break itself is dropped), else between characters; an
    /// entity open at a cut is closed and reopened in the next message. Messages with nothing
    /// but whitespace are left out (Telegram refuses an empty message).
    pub fn messages(mut self, limit: usize) -> Vec<String> {
        let root = self.root();
        let close_len: Vec<usize> =
            (0..self.contexts.len()).map(|c| self.transition_len(c, root)).collect();
        let n = self.atoms.len();
        let mut out = Vec::new();
        let mut start = 0;
        while start < n {
            let mut cost = 0;
            let mut prev = root;
            let (mut newline, mut space) = (None, None);
            let mut end = n;
            for i in start..n {
                let ctx = self.atoms[i].1;
                let add = self.transition_len(prev, ctx) + self.cost(i);
                if i > start && cost + add + close_len[ctx] > limit {
                    end = i;
                    break;
                }
                cost += add;
                prev = ctx;
                if i > start && i >= self.unbreakable {
                    match self.atoms[i].0 {
                        '\n' => newline = Some(i),
                        ' ' => space = Some(i),
                        _ => {}
                    }
                }
            }
            let (piece_end, next) = if end == n {
                (n, n)
            } else {
                match newline.or(space) {
                    Some(b) => (b, b + 1),
                    None => (end, end),
                }
            };
            if self.atoms[start..piece_end].iter().any(|(c, _)| !c.is_whitespace()) {
                out.push(self.render(start..piece_end, root));
            }
            start = next;
        }
        if out.is_empty() {
            out.push(self.render(0..n, root));
        }
        out
    }
}

/// `*[author]* text` in MarkdownV2, the text's Markdown turned into entities, cut into messages
/// of at most `limit` characters (the name is never cut from the start of the first).
pub fn telegram(label: &str, text: &str, limit: usize) -> Vec<String> {
    let mut f = Formatted::default();
    f.push_str(&format!("[{label}]"), &[Entity::Bold]);
    f.push_str(" ", &[]);
    f.unbreakable = f.atoms.len();
    // Telegram drops every `\r` of a message (and reads `\n\r` after a code fence as one
    // line break): leave them out, so what is sent is what is shown.
    let spans = parse(&text.replace('\r', ""));
    f.push_spans(&spans, &mut Vec::new());
    f.messages(limit)
}

/// `text` as MarkdownV2 with no entity at all (every reserved character escaped), within
/// `limit` characters: the last resort for a message Telegram refused to parse.
pub fn escaped_plain(text: &str, limit: usize) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut used = 0;
    for c in text.chars() {
        let cost = if RESERVED.contains(c) { 2 } else { 1 };
        if used + cost > limit {
            break;
        }
        if cost == 2 {
            out.push('\\');
        }
        out.push(c);
        used += cost;
    }
    out
}

/// What people see of MarkdownV2 this module wrote: markers and escapes removed.
pub fn plain(md: &str) -> String {
    let mut out = String::with_capacity(md.len());
    let mut chars = md.chars().peekable();
    let mut in_pre = false;
    let mut in_code = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.extend(chars.next()),
            '`' if chars.peek() == Some(&'`') => {
                chars.next();
                chars.next();
                if !in_pre {
                    // The language and the line break after it.
                    for c in chars.by_ref() {
                        if c == '\n' {
                            break;
                        }
                    }
                }
                in_pre = !in_pre;
            }
            '`' => in_code = !in_code,
            _ if in_pre || in_code => out.push(c),
            '*' | '_' | '~' | '[' => {}
            ']' => {
                // `](url)`: the URL is not shown.
                if chars.peek() == Some(&'(') {
                    while let Some(u) = chars.next() {
                        match u {
                            '\\' => {
                                chars.next();
                            }
                            ')' => break,
                            _ => {}
                        }
                    }
                }
            }
            c => out.push(c),
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Markdown

/// Parses Markdown: fenced code blocks (a fence that never closes is text), headings as bold,
/// inline Markdown per line.
fn parse(text: &str) -> Vec<Span> {
    let lines: Vec<&str> = text.split('\n').collect();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if i > 0 {
            spans.push(Span::Text("\n".into()));
        }
        let line = lines[i];
        if let Some(info) = line.trim_start().strip_prefix("```")
            && !info.contains('`')
            && let Some(close) =
                (i + 1..lines.len()).find(|&j| lines[j].trim().strip_prefix("```") == Some(""))
        {
            let lang: String = info
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || "+#._-".contains(*c))
                .take(32)
                .collect();
            spans.push(Span::Pre(lang, lines[i + 1..close].join("\n")));
            i = close + 1;
            continue;
        }
        let trimmed = line.trim_start();
        let hashes = trimmed.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && trimmed[hashes..].starts_with(' ') {
            let heading = trimmed[hashes..].trim();
            spans.push(Span::Styled(Style::Bold, inline(heading, true)));
        } else {
            spans.extend(inline(line, true));
        }
        i += 1;
    }
    spans
}

fn char_before(s: &str, i: usize) -> Option<char> {
    s[..i].chars().next_back()
}

fn char_at(s: &str, i: usize) -> Option<char> {
    s.get(i..).and_then(|r| r.chars().next())
}

/// How many `c` in a row start at `i`.
fn run(s: &str, i: usize, c: u8) -> usize {
    s.as_bytes()[i..].iter().take_while(|&&b| b == c).count()
}

/// Emphasis nested deeper than this is read as text (bounds the work on hostile input).
const MAX_DEPTH: usize = 6;

/// Whether `marker` at `i` can open emphasis: something other than whitespace follows, and an
/// underscore is not inside a word (`snake_case`).
fn can_open(s: &str, i: usize, marker: &str) -> bool {
    let after = char_at(s, i + marker.len());
    let before = char_before(s, i);
    after.is_some_and(|c| !c.is_whitespace())
        && !(marker.starts_with('_') && before.is_some_and(char::is_alphanumeric))
}

/// Inline Markdown of one line. Searches that found nothing are remembered (a later search
/// from further on finds nothing either), so a line full of markers that never close costs
/// linear time, not quadratic.
struct Inline<'a> {
    s: &'a str,
    /// Whether links are read (not inside a link's label).
    links: bool,
    depth: usize,
    /// Per emphasis marker: no close at or after this position.
    no_close: HashMap<&'static str, usize>,
    /// Per backtick run length: no closing run at or after this position.
    no_code: HashMap<usize, usize>,
    /// Where the next `](` at or after the first position is (`None`: there is none).
    next_link: Option<(usize, Option<usize>)>,
}

impl<'a> Inline<'a> {
    fn parse(s: &'a str, links: bool, depth: usize) -> Vec<Span> {
        let mut p = Inline {
            s,
            links,
            depth,
            no_close: HashMap::new(),
            no_code: HashMap::new(),
            next_link: None,
        };
        p.spans()
    }

    /// The end of a code span opened by `n` backticks whose text starts at `from`: the start
    /// of the next run of exactly `n` backticks.
    fn code_close(&mut self, from: usize, n: usize) -> Option<usize> {
        if self.no_code.get(&n).is_some_and(|&f| from >= f) {
            return None;
        }
        let s = self.s;
        let mut j = from;
        while j < s.len() {
            if s.as_bytes()[j] == b'`' {
                let m = run(s, j, b'`');
                if m == n {
                    return Some(j);
                }
                j += m;
            } else {
                j += 1;
            }
        }
        self.no_code.insert(n, from);
        None
    }

    /// Where the emphasis `marker` opened before `from` closes: the next run of its character
    /// that is exactly as long (for a double marker, at least as long: its last two), after
    /// something other than whitespace, and for `_` not inside a word. Code spans and escapes
    /// are skipped.
    fn find_close(&mut self, from: usize, marker: &'static str) -> Option<usize> {
        if self.no_close.get(marker).is_some_and(|&f| from >= f) {
            return None;
        }
        let s = self.s;
        let b = s.as_bytes();
        let m = marker.as_bytes()[0];
        let mut j = from;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'`' => {
                    let n = run(s, j, b'`');
                    j = self.code_close(j + n, n).map_or(j + n, |e| e + n);
                }
                c if c == m => {
                    let n = run(s, j, m);
                    let at = if marker.len() == 2 && n >= 2 { Some(j + n - 2) } else { None };
                    let at = at.or((marker.len() == 1 && n == 1).then_some(j));
                    if let Some(at) = at
                        && at > from
                        && char_before(s, at).is_some_and(|c| !c.is_whitespace())
                        && !(m == b'_'
                            && char_at(s, at + marker.len()).is_some_and(char::is_alphanumeric))
                    {
                        return Some(at);
                    }
                    j += n;
                }
                _ => j += 1,
            }
        }
        self.no_close.insert(marker, from);
        None
    }

    /// A link `[label](url)` at `i`: the label, the URL and where it ends. Only web and mail
    /// links (nothing that could mention someone); the URL may hold balanced parentheses.
    fn link_at(&mut self, i: usize) -> Option<(&'a str, &'a str, usize)> {
        let s = self.s;
        let close = match self.next_link {
            Some((at, found)) if at <= i && found.is_none_or(|f| f >= i) => found,
            _ => {
                let found = s[i..].find("](").map(|k| i + k);
                self.next_link = Some((i, found));
                found
            }
        }?;
        let label = &s[i + 1..close];
        if label.is_empty() || label.contains('[') {
            return None;
        }
        let url_start = close + 2;
        let mut depth = 0;
        for (k, c) in s[url_start..].char_indices() {
            if k > MAX_URL_BYTES {
                return None;
            }
            match c {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    let url = &s[url_start..url_start + k];
                    let ok = ["http://", "https://", "mailto:"].iter().any(|p| url.starts_with(p))
                        && url.len() > 8;
                    return ok.then_some((label, url, url_start + k + 1));
                }
                ')' => depth -= 1,
                c if c.is_whitespace() => return None,
                _ => {}
            }
        }
        None
    }

    fn spans(&mut self) -> Vec<Span> {
        let s = self.s;
        let b = s.as_bytes();
        let mut spans = Vec::new();
        let mut text = String::new();
        let mut i = 0;
        let flush = |text: &mut String, spans: &mut Vec<Span>| {
            if !text.is_empty() {
                spans.push(Span::Text(std::mem::take(text)));
            }
        };
        let emphasis = self.depth < MAX_DEPTH;
        'next: while i < s.len() {
            let c = b[i];
            if c == b'\\' && b.get(i + 1).is_some_and(u8::is_ascii_punctuation) {
                text.push(b[i + 1] as char);
                i += 2;
                continue;
            }
            if c == b'`' {
                let n = run(s, i, b'`');
                if let Some(end) = self.code_close(i + n, n) {
                    flush(&mut text, &mut spans);
                    let code = &s[i + n..end];
                    // CommonMark: one space on both sides of a code span is padding.
                    let code = match code.strip_prefix(' ').and_then(|c| c.strip_suffix(' ')) {
                        Some(inner) if !inner.trim().is_empty() => inner,
                        _ => code,
                    };
                    spans.push(Span::Code(code.to_owned()));
                    i = end + n;
                } else {
                    text.push_str(&s[i..i + n]);
                    i += n;
                }
                continue;
            }
            if self.links
                && c == b'['
                && let Some((label, url, end)) = self.link_at(i)
            {
                flush(&mut text, &mut spans);
                spans.push(Span::Link(Inline::parse(label, false, self.depth + 1), url.to_owned()));
                i = end;
                continue;
            }
            let doubles = [("**", Style::Bold), ("__", Style::Bold), ("~~", Style::Strike)];
            for (marker, style) in doubles {
                if emphasis
                    && s[i..].starts_with(marker)
                    && can_open(s, i, marker)
                    && let Some(end) = self.find_close(i + 2, marker)
                {
                    flush(&mut text, &mut spans);
                    let inner = Inline::parse(&s[i + 2..end], self.links, self.depth + 1);
                    spans.push(Span::Styled(style, inner));
                    i = end + 2;
                    continue 'next;
                }
            }
            if emphasis && (c == b'*' || c == b'_') && run(s, i, c) == 1 {
                let marker = if c == b'*' { "*" } else { "_" };
                if can_open(s, i, marker)
                    && let Some(end) = self.find_close(i + 1, marker)
                {
                    flush(&mut text, &mut spans);
                    let inner = Inline::parse(&s[i + 1..end], self.links, self.depth + 1);
                    spans.push(Span::Styled(Style::Italic, inner));
                    i = end + 1;
                    continue;
                }
            }
            // A run of markers that opened nothing is text, all of it (`**x*` is not `*` + x).
            let n = if matches!(c, b'*' | b'_' | b'~') { run(s, i, c) } else { 1 };
            let len = if n > 1 { n } else { s[i..].chars().next().map_or(1, char::len_utf8) };
            text.push_str(&s[i..i + len]);
            i += len;
        }
        flush(&mut text, &mut spans);
        spans
    }
}

fn inline(s: &str, links: bool) -> Vec<Span> {
    Inline::parse(s, links, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> String {
        let msgs = telegram("w", text, 4096);
        assert_eq!(msgs.len(), 1, "{msgs:?}");
        msgs[0].strip_prefix("*\\[w\\]* ").expect("the name in front").to_owned()
    }

    #[test]
    fn each_construct_becomes_its_entity() {
        assert_eq!(one("**bold** and __bold__"), "*bold* and *bold*");
        assert_eq!(one("*it* and _it_"), "_it_ and _it_");
        assert_eq!(one("~~gone~~"), "~gone~");
        assert_eq!(one("run `cargo test -p x` now"), "run `cargo test -p x` now");
        assert_eq!(one("``a`b``"), "`a\\`b`");
        assert_eq!(
            one("see [the docs](https://x.io/a_(b)?q=1)."),
            "see [the docs](https://x.io/a_(b\\)?q=1)\\."
        );
        assert_eq!(one("# Plan: v2"), "*Plan: v2*");
        assert_eq!(
            one("Fix:\n```rust\nlet a = b`c\\d; // *x*\n```\ndone."),
            "Fix:\n```rust\nlet a = b\\`c\\\\d; // *x*```\ndone\\."
        );
        assert_eq!(one("```\nplain\n```"), "```\nplain```");
        assert_eq!(one("escaped \\*stars\\*"), "escaped \\*stars\\*");
    }

    #[test]
    fn everything_else_is_escaped_text() {
        assert_eq!(
            one("v1.2 (beta)! a-b=c #1 {x} |y| >q +z \\"),
            "v1\\.2 \\(beta\\)\\! a\\-b\\=c \\#1 \\{x\\} \\|y\\| \\>q \\+z \\\\"
        );
        assert_eq!(one("- item\n> quote"), "\\- item\n\\> quote");
    }

    #[test]
    fn unbalanced_or_inword_markers_stay_text() {
        assert_eq!(one("**not closed"), "\\*\\*not closed");
        assert_eq!(one("a ** b ** c"), "a \\*\\* b \\*\\* c");
        assert_eq!(one("snake_case_name and _x"), "snake\\_case\\_name and \\_x");
        assert_eq!(one("2 * 3 * 4"), "2 \\* 3 \\* 4");
        assert_eq!(one("`open code"), "\\`open code");
        assert_eq!(one("```rust\nno close"), "\\`\\`\\`rust\nno close");
        assert_eq!(one("[x](javascript:alert(1))"), "\\[x\\]\\(javascript:alert\\(1\\)\\)");
        assert_eq!(one("[x](tg://user?id=1)"), "\\[x\\]\\(tg://user?id\\=1\\)");
        assert_eq!(one("**bold\nacross lines**"), "\\*\\*bold\nacross lines\\*\\*");
    }

    #[test]
    fn nesting_follows_telegrams_rules() {
        // Code is inside no other entity: the bold closes around it.
        assert_eq!(one("**bold `code` bold**"), "*bold *`code`* bold*");
        // The closing `**` inside the code span does not close the bold.
        assert_eq!(one("**a `b**` c**"), "*a *`b**`* c*");
        assert_eq!(one("***both***"), "*_both_*");
        assert_eq!(one("**[link](https://a.b/c) in bold**"), "*[link](https://a.b/c) in bold*");
        assert_eq!(one("[**bold** link](https://a.b)"), "[*bold* link](https://a.b)");
        // Italic in italic never makes `__` (underline in MarkdownV2).
        assert_eq!(one("_a *b* c_"), "_a b c_");
    }

    #[test]
    fn plain_is_what_people_see() {
        let md = one("**b** _i_ `c*` [l](https://x.y/(z)) ```");
        assert_eq!(plain(&md), "b i c* l ```");
        assert_eq!(plain("```rust\nlet x;```\nok\\."), "let x;\nok.");
    }

    #[test]
    fn long_posts_close_and_reopen_their_entities() {
        let text = format!("**{}**", "word ".repeat(1500).trim_end());
        let msgs = telegram("w", &text, 4096);
        assert!(msgs.len() >= 2, "{}", msgs.len());
        for m in &msgs {
            assert!(m.chars().count() <= 4096, "{}", m.chars().count());
            let body = m.strip_prefix("*\\[w\\]* ").unwrap_or(m);
            assert!(body.starts_with('*') && body.ends_with('*'), "bold on both ends: {m:.40}");
        }
        let words: usize = msgs.iter().map(|m| plain(m).matches("word").count()).sum();
        assert_eq!(words, 1500, "every word arrives");

        let code = format!("```py\n{}\n```", "x = 1\n".repeat(1000).trim_end());
        let msgs = telegram("w", &code, 4096);
        assert!(msgs.len() >= 2);
        for m in &msgs[1..] {
            assert!(m.starts_with("```py\n") && m.ends_with("```"), "{m:.20}…");
        }
        let lines: usize = msgs.iter().map(|m| plain(m).matches("x = 1").count()).sum();
        assert_eq!(lines, 1000);
    }

    #[test]
    fn a_whitespace_piece_is_not_sent_and_the_name_is_never_cut() {
        let text = format!("a{}b", " ".repeat(5000));
        for m in telegram("bob (discord)", &text, 4096) {
            assert!(!m.trim().is_empty());
        }
        let msgs = telegram("bob (discord)", &"x".repeat(5000), 4096);
        assert!(msgs[0].starts_with("*\\[bob \\(discord\\)\\]* x"), "{:.30}", msgs[0]);
    }

    /// Every message, parsed by the fake Telegram's MarkdownV2 parser (modelled on tdlib's):
    /// accepted, within the limit, and showing what `plain` says people see.
    fn accepted(author: &str, text: &str) -> Vec<(String, Vec<serde_json::Value>)> {
        telegram(author, text, 4096)
            .iter()
            .map(|m| {
                assert!(m.chars().count() <= 4096, "{} characters", m.chars().count());
                let sent = flock_testkit::fake_telegram::markdown_v2_as_sent(m)
                    .unwrap_or_else(|e| panic!("Telegram would refuse {m:?} (from {text:?}): {e}"));
                assert_eq!(sent.0, plain(m).trim(), "what people see of {m:?}");
                sent
            })
            .collect()
    }

    #[test]
    fn a_link_with_a_huge_url_stays_text_and_every_message_fits() {
        let url = format!("https://x.io/{}", "a".repeat(5000));
        let text = format!("see [the {} label]({url}) now", "long ".repeat(200));
        let sent = accepted("w", &text);
        assert!(sent.iter().all(|(_, entities)| entities.iter().all(|e| e["type"] != "text_link")));
        let short = accepted("w", "[ok](https://x.io/a)");
        assert_eq!(short[0].1.len(), 2, "a usual link is still a link: {:?}", short[0].1);
    }

    #[test]
    fn escaped_plain_is_entity_free_and_within_the_limit() {
        let text = "a*b_c[d](e) ".repeat(1000);
        let m = escaped_plain(&text, 4096);
        assert!(m.chars().count() <= 4096);
        let (shown, entities) = flock_testkit::fake_telegram::markdown_v2_as_sent(&m).unwrap();
        assert!(entities.is_empty());
        assert!(text.starts_with(shown.trim_end()), "{shown:.40}");
    }

    #[test]
    fn telegram_renders_the_intended_entities() {
        let md = "**Done**: see _notes_, run `cargo test` and [the PR](https://x.io/pr/1).\n```rust\nfn main() {}\n```";
        let sent = accepted("worker-1", md);
        assert_eq!(sent.len(), 1);
        let (text, entities) = &sent[0];
        assert_eq!(text, "[worker-1] Done: see notes, run cargo test and the PR.\nfn main() {}");
        let kinds: Vec<(String, u64, u64)> = entities
            .iter()
            .map(|e| {
                let k = e["type"].as_str().unwrap_or("?").to_owned();
                (k, e["offset"].as_u64().unwrap_or(0), e["length"].as_u64().unwrap_or(0))
            })
            .collect();
        let at = |s: &str| text.find(s).unwrap() as u64;
        assert_eq!(
            kinds,
            [
                ("bold".into(), 0, 10),
                ("bold".into(), at("Done"), 4),
                ("italic".into(), at("notes"), 5),
                ("code".into(), at("cargo"), 10),
                ("text_link".into(), at("the PR"), 6),
                ("pre".into(), at("fn main"), 12),
            ]
        );
        assert_eq!(entities[4]["url"], "https://x.io/pr/1");
        assert_eq!(entities[5]["language"], "rust");
    }

    #[test]
    fn nasty_input_is_always_accepted() {
        let nasty = [
            "**unbalanced",
            "__init__ and snake_case_name",
            "**bold `code` bold**",
            "*a **b** c*",
            "***x*** ___y___ ~~~z~~~",
            "_a_b_c_ *a*b*c*",
            "[a](https://x.y/a)b)c) [b]( https://x) [c](https://x.y/\\)",
            "```\n```\n```",
            "`` ` `` ``` `a` ```",
            "> not a quote || spoiler? || ~strike~",
            "\\*\\_\\`\\\\",
            "x\r\n>y\r\n**>z",
            "emoji 🦀 **bold 🦀** `🦀`",
            "![img](https://x.y/i.png)",
            "",
            "   ",
        ];
        for text in nasty {
            accepted("bob (discord)", text);
        }
        // Random Markdown-ish text, long enough to be cut, with a fixed seed.
        let mut rng = fastrand::Rng::with_seed(9);
        let alphabet = [
            "*",
            "**",
            "_",
            "__",
            "~~",
            "`",
            "```",
            "```rust\n",
            "[",
            "](",
            "https://a.b/",
            ")",
            "(",
            "\\",
            "\n",
            " ",
            "word",
            "é",
            "🦀",
            ">",
            "#",
            "|",
            "!",
            ".",
            "-",
            "\r",
        ];
        for round in 0..300 {
            let n = if round % 10 == 0 { 3000 } else { rng.usize(1..60) };
            let text: String = (0..n).map(|_| alphabet[rng.usize(..alphabet.len())]).collect();
            accepted("w", &text);
        }
    }
}
