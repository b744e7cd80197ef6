//! MarkdownV2 as Telegram reads it: the text a message shows and its entities (offsets in UTF-16 code units), or the error Telegram gives.

use super::*;

/// A message entity; `offset` and `length` count UTF-16 code units, as in the Bot API.
#[derive(Debug, Clone)]
pub(super) struct Entity {
    pub(super) kind: &'static str,
    pub(super) offset: usize,
    pub(super) length: usize,
    /// `url`, `language`, `custom_emoji_id`, or `user` (the id of a `text_mention`'s user).
    pub(super) extra: Option<(&'static str, String)>,
}

impl Entity {
    pub(super) fn to_json(&self) -> Value {
        let mut entity = json!({"offset": self.offset, "length": self.length, "type": self.kind});
        match &self.extra {
            // Telegram fills in the user it knows; the fake knows only the id.
            Some(("user", id)) => {
                let id = id.parse::<i64>().unwrap_or(0);
                entity["user"] = json!({"id": id, "is_bot": false, "first_name": ""});
            }
            Some((name, value)) => entity[*name] = json!(value),
            None => {}
        }
        entity
    }
}

/// A text after entity parsing.
#[derive(Debug)]
pub(super) struct Formatted {
    pub(super) text: String,
    pub(super) entities: Vec<Entity>,
}

impl Formatted {
    pub(super) fn plain(text: &str) -> Formatted {
        Formatted { text: text.to_string(), entities: Vec::new() }
    }

    pub(super) fn from_parts(out: Vec<u8>, mut entities: Vec<Entity>) -> Formatted {
        entities.sort_by(|a, b| a.offset.cmp(&b.offset).then(b.length.cmp(&a.length)));
        let text = String::from_utf8(out)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        Formatted { text, entities }
    }

    /// Telegram strips leading and trailing whitespace and clips the entities to what is left.
    pub(super) fn trimmed(self) -> Formatted {
        let start = self.text.trim_start();
        let lead: usize = self.text[..self.text.len() - start.len()].encode_utf16().count();
        let text = start.trim_end().to_string();
        let total = text.encode_utf16().count();
        let entities = self
            .entities
            .into_iter()
            .filter_map(|mut e| {
                let begin = e.offset.saturating_sub(lead);
                let end = (e.offset + e.length).saturating_sub(lead).min(total);
                (end > begin).then(|| {
                    e.offset = begin;
                    e.length = end - begin;
                    e
                })
            })
            .collect();
        Formatted { text, entities }
    }
}

/// Appends one byte of UTF-8 text, counting UTF-16 units at the first byte of each character.
pub(super) fn push_byte(out: &mut Vec<u8>, utf16: &mut usize, c: u8) {
    out.push(c);
    if c & 0xC0 != 0x80 {
        *utf16 += if c >= 0xF0 { 2 } else { 1 };
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Bold,
    Italic,
    Underline,
    Strikethrough,
    Spoiler,
    Code,
    Pre,
    TextLink,
    CustomEmoji,
}

/// An entity whose end marker was not met yet.
pub(super) struct Open {
    pub(super) kind: Kind,
    pub(super) language: Option<String>,
    pub(super) utf16_start: usize,
    pub(super) byte_offset: usize,
    pub(super) out_start: usize,
}

impl Open {
    /// Telegram's name for the entity in its "Can't find end of …" error.
    pub(super) fn unclosed(&self) -> String {
        let name = match self.kind {
            Kind::Bold => "Bold",
            Kind::Italic => "Italic",
            Kind::Underline => "Underline",
            Kind::Strikethrough => "Strikethrough",
            Kind::Spoiler => "Spoiler",
            Kind::Code => "Code",
            Kind::Pre if self.language.is_some() => "PreCode",
            Kind::Pre => "Pre",
            Kind::TextLink => "TextUrl",
            Kind::CustomEmoji => "CustomEmoji",
        };
        format!("Can't find end of {name} entity at byte offset {}", self.byte_offset)
    }
}

/// A block quote being read: lines starting with `>`.
pub(super) struct Quote {
    pub(super) utf16_start: usize,
    /// Entities open when the quote began: those opened inside must close inside.
    pub(super) depth: usize,
    /// Its last line ended with `||`.
    pub(super) expandable: bool,
}

/// What `sendMessage` with `parse_mode: "MarkdownV2"` makes of `src`: the message text as stored
/// (trimmed) and its entities as JSON, or the `description` of the 400 Telegram answers (can't
/// parse entities, empty, too long). For unit tests of a client's MarkdownV2 output.
pub fn markdown_v2_as_sent(src: &str) -> Result<(String, Vec<Value>), String> {
    let formatted =
        parse_markdown_v2(src).map_err(|e| format!("can't parse entities: {e}"))?.trimmed();
    if formatted.text.is_empty() {
        return Err("message must be non-empty".into());
    }
    if formatted.text.chars().count() > MAX_MESSAGE_CHARS {
        return Err("message is too long".into());
    }
    Ok((formatted.text, formatted.entities.iter().map(Entity::to_json).collect()))
}

/// `parse_mode: "MarkdownV2"`, following Telegram's parser (tdlib's `parse_markdown_v2`): every
/// character of ``_*[]()~`>#+-=|{}.!`` outside an entity must be escaped with `\` (inside
/// `code`/`pre` only `` ` `` and `\`, inside a link URL only `)` and `\`), entities must be closed
/// (those opened inside a block quote, inside it), `>` starts a quote only at a line start.
/// Returns the text with escapes and markers removed, not trimmed yet.
pub(super) fn parse_markdown_v2(src: &str) -> Result<Formatted, String> {
    const RESERVED: &[u8] = b"_*[]()~`>#+-=|{}.!";
    let b = src.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let escapable = |c: u8| (1..=126).contains(&c);
    // Only `\r`s between `from` and the end of the line.
    let at_line_end = |mut from: usize| {
        while at(from) == b'\r' {
            from += 1;
        }
        from >= b.len() || b[from] == b'\n'
    };
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut utf16 = 0usize;
    let mut stack: Vec<Open> = Vec::new();
    let mut entities: Vec<Entity> = Vec::new();
    let mut quote: Option<Quote> = None;
    let close_quote = |q: Quote, stack: &[Open], utf16: usize, entities: &mut Vec<Entity>| {
        if stack.len() > q.depth {
            return Err(stack.last().expect("deeper than the quote").unclosed());
        }
        if utf16 > q.utf16_start {
            entities.push(Entity {
                kind: if q.expandable { "expandable_blockquote" } else { "blockquote" },
                offset: q.utf16_start,
                length: utf16 - q.utf16_start,
                extra: None,
            });
        }
        Ok(())
    };
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let in_code = stack.last().is_some_and(|o| matches!(o.kind, Kind::Code | Kind::Pre));
        if !in_code && (i == 0 || b[i - 1] == b'\n') {
            // `\r`s before the `>` stay in the text, outside the quote.
            let mut j = i;
            while at(j) == b'\r' {
                j += 1;
            }
            let marker = if at(j) == b'>' {
                1
            } else if b[j..].starts_with(b"**>") {
                3
            } else {
                0
            };
            // A quote ends before a line that does not continue it; the line break ending its
            // last line belongs to it.
            let continues = marker == 1 && j == i && quote.as_ref().is_some_and(|q| !q.expandable);
            if !continues && let Some(q) = quote.take() {
                close_quote(q, &stack, utf16, &mut entities)?;
            }
            if marker > 0 {
                for &r in &b[i..j] {
                    push_byte(&mut out, &mut utf16, r);
                }
                quote.get_or_insert(Quote {
                    utf16_start: utf16,
                    depth: stack.len(),
                    expandable: false,
                });
                i = j + marker;
                continue;
            }
        }
        // `||` ending a quoted line (and closing no spoiler) makes the quote expandable.
        if !in_code
            && c == b'|'
            && at(i + 1) == b'|'
            && !stack.last().is_some_and(|o| o.kind == Kind::Spoiler)
            && at_line_end(i + 2)
            && let Some(q) = quote.as_mut()
        {
            q.expandable = true;
            i += 2;
            continue;
        }
        if c == b'\\' && escapable(at(i + 1)) {
            push_byte(&mut out, &mut utf16, b[i + 1]);
            i += 2;
            continue;
        }
        let reserved: &[u8] = if in_code { b"`" } else { RESERVED };
        if !reserved.contains(&c) {
            push_byte(&mut out, &mut utf16, c);
            i += 1;
            continue;
        }
        let closes = stack.last().is_some_and(|o| match o.kind {
            Kind::Bold => c == b'*',
            Kind::Italic => c == b'_' && at(i + 1) != b'_',
            Kind::Underline => c == b'_' && at(i + 1) == b'_',
            Kind::Strikethrough => c == b'~',
            Kind::Spoiler => c == b'|' && at(i + 1) == b'|',
            Kind::Code => c == b'`',
            Kind::Pre => c == b'`' && at(i + 1) == b'`' && at(i + 2) == b'`',
            Kind::TextLink | Kind::CustomEmoji => c == b']',
        });
        if !closes {
            let byte_offset = i;
            let mut language = None;
            let kind = match c {
                b'_' if at(i + 1) == b'_' => {
                    i += 2;
                    Kind::Underline
                }
                b'_' => {
                    i += 1;
                    Kind::Italic
                }
                b'*' => {
                    i += 1;
                    Kind::Bold
                }
                b'~' => {
                    i += 1;
                    Kind::Strikethrough
                }
                b'|' if at(i + 1) == b'|' => {
                    i += 2;
                    Kind::Spoiler
                }
                b'[' => {
                    i += 1;
                    Kind::TextLink
                }
                b'`' if at(i + 1) == b'`' && at(i + 2) == b'`' => {
                    i += 3;
                    language = pre_language(b, &mut i);
                    // One line break after the opening (and the language) is not text.
                    if matches!(at(i), b'\n' | b'\r') {
                        i += if matches!(at(i + 1), b'\n' | b'\r') && at(i) != at(i + 1) {
                            2
                        } else {
                            1
                        };
                    }
                    Kind::Pre
                }
                b'`' => {
                    i += 1;
                    Kind::Code
                }
                b'!' if at(i + 1) == b'[' => {
                    i += 2;
                    Kind::CustomEmoji
                }
                _ => {
                    return Err(format!(
                        "Character '{}' is reserved and must be escaped with the preceding '\\'",
                        c as char
                    ));
                }
            };
            stack.push(Open {
                kind,
                language,
                utf16_start: utf16,
                byte_offset,
                out_start: out.len(),
            });
            continue;
        }
        let open = stack.pop().expect("an entity closes only when one is open");
        let mut extra = None;
        let mut keep = utf16 > open.utf16_start;
        let mut kind = match open.kind {
            Kind::Bold => "bold",
            Kind::Italic => "italic",
            Kind::Underline => "underline",
            Kind::Strikethrough => "strikethrough",
            Kind::Spoiler => "spoiler",
            Kind::Code => "code",
            Kind::Pre => "pre",
            Kind::TextLink => "text_link",
            Kind::CustomEmoji => "custom_emoji",
        };
        match open.kind {
            Kind::Bold | Kind::Italic | Kind::Strikethrough | Kind::Code => i += 1,
            Kind::Underline | Kind::Spoiler => i += 2,
            Kind::Pre => {
                i += 3;
                extra = open.language.map(|l| ("language", l));
            }
            Kind::TextLink | Kind::CustomEmoji => {
                i += 1;
                let url = if at(i) == b'(' {
                    i += 1;
                    let url_begin = i;
                    let mut url = Vec::new();
                    while i < b.len() && b[i] != b')' {
                        if b[i] == b'\\' && escapable(at(i + 1)) {
                            url.push(b[i + 1]);
                            i += 2;
                        } else {
                            url.push(b[i]);
                            i += 1;
                        }
                    }
                    if i >= b.len() {
                        let what =
                            if open.kind == Kind::CustomEmoji { "a custom emoji" } else { "a" };
                        return Err(format!(
                            "Can't find end of {what} URL at byte offset {url_begin}"
                        ));
                    }
                    i += 1;
                    Some(String::from_utf8_lossy(&url).into_owned())
                } else {
                    None
                };
                if open.kind == Kind::CustomEmoji {
                    let Some(url) = url else {
                        return Err("Custom emoji entity must contain a tg://emoji URL".into());
                    };
                    extra = Some(("custom_emoji_id", custom_emoji_id(&url)?));
                } else {
                    // Without `(url)` the text is the URL; an unusable URL drops the entity.
                    let url = url.unwrap_or_else(|| {
                        String::from_utf8_lossy(&out[open.out_start..]).into_owned()
                    });
                    match url.trim().strip_prefix("tg:").map(|u| u.trim_start_matches('/')) {
                        Some(user) if user.starts_with("user?id=") => {
                            // Telegram turns it into a `text_mention` with the user.
                            let id = user["user?id=".len()..].parse::<i64>().unwrap_or(0);
                            kind = "text_mention";
                            keep &= id > 0;
                            extra = Some(("user", id.to_string()));
                        }
                        _ => match normalize_url(&url) {
                            Some(url) => extra = Some(("url", url)),
                            None => keep = false,
                        },
                    }
                }
            }
        }
        if keep {
            entities.push(Entity {
                kind,
                offset: open.utf16_start,
                length: utf16 - open.utf16_start,
                extra,
            });
        }
    }
    if let Some(open) = stack.last() {
        return Err(open.unclosed());
    }
    if let Some(q) = quote.take() {
        close_quote(q, &stack, utf16, &mut entities)?;
    }
    Ok(Formatted::from_parts(out, entities))
}

/// The id in a `tg://emoji?id=…` URL, with Telegram's errors.
pub(super) fn custom_emoji_id(url: &str) -> Result<String, String> {
    let (scheme, rest) = url.split_once(':').unwrap_or(("", url));
    if !scheme.eq_ignore_ascii_case("tg") {
        return Err("Custom emoji URL must have scheme tg".into());
    }
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let rest = rest.split('#').next().unwrap_or_default();
    let (host, query) = rest.split_once('?').unwrap_or((rest, ""));
    if !host.trim_end_matches('/').eq_ignore_ascii_case("emoji") {
        return Err("Custom emoji URL must have host \"emoji\"".into());
    }
    let id = query.split('&').find_map(|pair| pair.strip_prefix("id="));
    let Some(id) = id else {
        return Err("Custom emoji URL must have an emoji identifier".into());
    };
    let valid = !id.is_empty()
        && !id.starts_with('0')
        && id.bytes().all(|c| c.is_ascii_digit())
        && id.parse::<i64>().is_ok();
    if !valid {
        return Err("Invalid custom emoji identifier specified".into());
    }
    Ok(id.to_string())
}

/// A URL as Telegram keeps it in a `text_link` (`http://` added when no scheme is given, `/`
/// after a bare host), or `None` when it does not look like one (Telegram drops the entity).
pub(super) fn normalize_url(url: &str) -> Option<String> {
    let url = url.trim();
    if url.is_empty() || url.chars().any(char::is_whitespace) {
        return None;
    }
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) if !scheme.is_empty() => (scheme.to_ascii_lowercase(), rest),
        _ => ("http".to_string(), url),
    };
    let host_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = &rest[..host_end];
    let tld = host.rsplit('.').next().unwrap_or_default();
    let web = matches!(scheme.as_str(), "http" | "https");
    if host.is_empty() || (web && (!host.contains('.') || tld.len() < 2) && host != "localhost") {
        return None;
    }
    let path = &rest[host_end..];
    let slash = if web && !path.starts_with('/') { "/" } else { "" };
    Some(format!("{scheme}://{host}{slash}{path}"))
}

/// `parse_mode: "Markdown"` (legacy): `*bold*`, `_italic_`, `` `code` ``, ```` ```pre``` ````
/// and `[text](url)`, not nested; `\` escapes only `_ * ` [`.
pub(super) fn parse_markdown(src: &str) -> Result<Formatted, String> {
    let b = src.as_bytes();
    let at = |i: usize| b.get(i).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(b.len());
    let mut utf16 = 0usize;
    let mut entities = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'\\' && matches!(at(i + 1), b'_' | b'*' | b'`' | b'[') {
            push_byte(&mut out, &mut utf16, b[i + 1]);
            i += 2;
            continue;
        }
        if !matches!(c, b'_' | b'*' | b'`' | b'[') {
            push_byte(&mut out, &mut utf16, c);
            i += 1;
            continue;
        }
        let begin = i;
        let end_char = if c == b'[' { b']' } else { c };
        let pre = c == b'`' && at(i + 1) == b'`' && at(i + 2) == b'`';
        i += if pre { 3 } else { 1 };
        let mut language = None;
        if pre {
            language = pre_language(b, &mut i);
            if matches!(at(i), b'\n' | b'\r') {
                i += 1;
            }
        }
        let start = utf16;
        let out_start = out.len();
        while i < b.len()
            && (b[i] != end_char || (pre && !(at(i + 1) == b'`' && at(i + 2) == b'`')))
        {
            push_byte(&mut out, &mut utf16, b[i]);
            i += 1;
        }
        if i >= b.len() {
            return Err(format!("Can't find end of the entity starting at byte offset {begin}"));
        }
        i += if pre { 3 } else { 1 };
        let (kind, extra) = match c {
            b'*' => ("bold", None),
            b'_' => ("italic", None),
            b'`' if pre => ("pre", language.map(|l| ("language", l))),
            b'`' => ("code", None),
            _ => {
                let url = if at(i) == b'(' {
                    let close = b[i..].iter().position(|&x| x == b')');
                    let url = close.map(|k| String::from_utf8_lossy(&b[i + 1..i + k]).into_owned());
                    i += close.map_or(0, |k| k + 1);
                    url
                } else {
                    None
                };
                let url =
                    url.unwrap_or_else(|| String::from_utf8_lossy(&out[out_start..]).into_owned());
                ("text_link", Some(("url", url)))
            }
        };
        if utf16 > start {
            entities.push(Entity { kind, offset: start, length: utf16 - start, extra });
        }
    }
    Ok(Formatted::from_parts(out, entities))
}

/// `parse_mode: "HTML"`: the tags Telegram supports, `&lt; &gt; &amp; &quot;` and numeric
/// character references; tags must be closed in order.
pub(super) fn parse_html(src: &str) -> Result<Formatted, String> {
    let b = src.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut utf16 = 0usize;
    let mut entities = Vec::new();
    // Open tags: (tag name, entity type, extra, start).
    type OpenTag = (String, &'static str, Option<(&'static str, String)>, usize);
    let mut stack: Vec<OpenTag> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'&' {
            let semi = b[i..].iter().take(12).position(|&x| x == b';');
            let decoded = semi.and_then(|k| {
                let name = &src[i + 1..i + k];
                let ch = match name {
                    "lt" => Some('<'),
                    "gt" => Some('>'),
                    "amp" => Some('&'),
                    "quot" => Some('"'),
                    _ => name
                        .strip_prefix("#x")
                        .or_else(|| name.strip_prefix("#X"))
                        .and_then(|h| u32::from_str_radix(h, 16).ok())
                        .or_else(|| name.strip_prefix('#').and_then(|d| d.parse().ok()))
                        .and_then(char::from_u32),
                };
                ch.map(|ch| (ch, k))
            });
            if let Some((ch, k)) = decoded {
                let mut tmp = [0u8; 4];
                for &byte in ch.encode_utf8(&mut tmp).as_bytes() {
                    push_byte(&mut out, &mut utf16, byte);
                }
                i += k + 1;
            } else {
                push_byte(&mut out, &mut utf16, c);
                i += 1;
            }
            continue;
        }
        if c != b'<' {
            push_byte(&mut out, &mut utf16, c);
            i += 1;
            continue;
        }
        let begin = i;
        let Some(close) = b[i..].iter().position(|&x| x == b'>').map(|k| i + k) else {
            return Err(format!("Unclosed start tag at byte offset {begin}"));
        };
        let inner = &src[i + 1..close];
        i = close + 1;
        if let Some(name) = inner.strip_prefix('/') {
            let name = name.trim().to_ascii_lowercase();
            let Some((tag, kind, extra, start)) = stack.pop() else {
                return Err(format!("Unexpected end tag at byte offset {begin}"));
            };
            if !name.is_empty() && name != tag {
                return Err(format!(
                    "Unmatched end tag at byte offset {begin}, expected \"</{tag}>\", found \
                     \"</{name}>\""
                ));
            }
            if utf16 > start {
                entities.push(Entity { kind, offset: start, length: utf16 - start, extra });
            }
            continue;
        }
        let (name, attrs) = inner.split_once(char::is_whitespace).unwrap_or((inner, ""));
        let name = name.to_ascii_lowercase();
        let attr = |wanted: &str| -> Option<String> {
            let at = attrs.find(&format!("{wanted}="))? + wanted.len() + 1;
            let rest = &attrs[at..];
            let value = match rest.chars().next()? {
                q @ ('"' | '\'') => rest[1..].split(q).next()?,
                _ => rest.split(char::is_whitespace).next()?,
            };
            Some(value.replace("&amp;", "&").replace("&quot;", "\"").replace("&lt;", "<"))
        };
        let (kind, extra) = match name.as_str() {
            "b" | "strong" => ("bold", None),
            "i" | "em" => ("italic", None),
            "u" | "ins" => ("underline", None),
            "s" | "strike" | "del" => ("strikethrough", None),
            "tg-spoiler" => ("spoiler", None),
            "span" if attrs.contains("tg-spoiler") => ("spoiler", None),
            "a" => ("text_link", Some(("url", attr("href").unwrap_or_default()))),
            "code" => ("code", None),
            "pre" => ("pre", None),
            "blockquote" if attrs.contains("expandable") => ("expandable_blockquote", None),
            "blockquote" => ("blockquote", None),
            "tg-emoji" => ("custom_emoji", attr("emoji-id").map(|id| ("custom_emoji_id", id))),
            _ => return Err(format!("Unsupported start tag \"{name}\" at byte offset {begin}")),
        };
        stack.push((name, kind, extra, utf16));
    }
    if let Some((tag, ..)) = stack.last() {
        return Err(format!("Can't find end tag corresponding to start tag \"{tag}\""));
    }
    Ok(Formatted::from_parts(out, entities))
}

/// The entities Telegram finds in what people write: `/commands` and `@mentions` (a rough
/// version of its detection: a word starting with `/` or `@` after a space or at the start).
pub(super) fn detect_entities(text: &str) -> Vec<Value> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let chars: Vec<char> = text.chars().collect();
    let mut entities = Vec::new();
    let mut utf16 = 0usize;
    let mut i = 0;
    while i < chars.len() {
        let at_start = i == 0 || chars[i - 1].is_whitespace();
        if at_start && (chars[i] == '/' || chars[i] == '@') {
            let mut end = i + 1;
            while end < chars.len() && word(chars[end]) {
                end += 1;
            }
            let name = end - i - 1;
            let kind = if chars[i] == '/' && (1..=64).contains(&name) {
                // `/cmd@botname` is one command.
                if end < chars.len() && chars[end] == '@' {
                    let mut bot_end = end + 1;
                    while bot_end < chars.len() && word(chars[bot_end]) {
                        bot_end += 1;
                    }
                    if bot_end > end + 1 {
                        end = bot_end;
                    }
                }
                Some("bot_command")
            } else if chars[i] == '@' && (5..=32).contains(&name) {
                Some("mention")
            } else {
                None
            };
            let boundary = end == chars.len() || (!word(chars[end]) && chars[end] != '@');
            if let Some(kind) = kind.filter(|_| boundary) {
                let length: usize = chars[i..end].iter().map(|c| c.len_utf16()).sum();
                entities.push(json!({"offset": utf16, "length": length, "type": kind}));
                utf16 += length;
                i = end;
                continue;
            }
        }
        utf16 += chars[i].len_utf16();
        i += 1;
    }
    entities
}

/// The language word right after a code block's opening ```` ``` ```` at `b[*i..]` (not followed
/// by the block's end), `*i` moved past it; `None` (and `*i` unmoved) when there is none.
fn pre_language(b: &[u8], i: &mut usize) -> Option<String> {
    let mut end = *i;
    while end < b.len() && !b[end].is_ascii_whitespace() && b[end] != b'`' {
        end += 1;
    }
    if end == *i || end >= b.len() || b[end] == b'`' {
        return None;
    }
    let language = String::from_utf8_lossy(&b[*i..end]).into_owned();
    *i = end;
    Some(language)
}
