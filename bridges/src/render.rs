//! Turning a Flock post into platform messages: who said it, the platform's markup (Telegram's in
//! `markdown.rs`), and the platform's length limit (split on line, then word boundaries, never inside a character).

/// How a post's author is shown: an agent by its name, a person from a platform by their name
/// and platform (`human:discord:bob` → `bob (discord)`), a person on the CLI by name.
pub fn author_label(author: &str) -> String {
    match author.strip_prefix("human:") {
        Some(rest) => match rest.split_once(':') {
            Some((platform, name)) => format!("{name} ({platform})"),
            None => rest.to_owned(),
        },
        None => author.to_owned(),
    }
}

/// Splits `text` into pieces whose cost (the sum of `cost` over their characters) is at most
/// `limit`: at the last line break that fits, else the last space, else between characters.
/// Pieces keep their text exactly (nothing is dropped but the break itself).
pub fn split(text: &str, limit: usize, cost: impl Fn(char) -> usize) -> Vec<String> {
    let limit = limit.max(1);
    let mut pieces = Vec::new();
    let mut rest = text;
    loop {
        let mut total = 0;
        let mut end = rest.len();
        let (mut last_newline, mut last_space) = (None, None);
        for (i, c) in rest.char_indices() {
            if total + cost(c) > limit {
                end = i;
                break;
            }
            total += cost(c);
            match c {
                '\n' => last_newline = Some(i),
                ' ' => last_space = Some(i),
                _ => {}
            }
        }
        if end == rest.len() {
            if !rest.is_empty() || pieces.is_empty() {
                pieces.push(rest.to_owned());
            }
            return pieces;
        }
        // Break at a newline or space that is not at the very start (that would make no
        // progress); the break character itself is dropped.
        let cut = last_newline.filter(|&i| i > 0).or(last_space.filter(|&i| i > 0));
        match cut {
            Some(i) => {
                pieces.push(rest[..i].to_owned());
                rest = &rest[i + 1..];
            }
            None => {
                let end =
                    if end == 0 { rest.chars().next().map_or(1, char::len_utf8) } else { end };
                pieces.push(rest[..end].to_owned());
                rest = &rest[end..];
            }
        }
    }
}

/// Telegram messages for a post: `*[author]* text` in MarkdownV2 with the text's Markdown as
/// entities (`crate::markdown`), each at most 4 096 characters as sent (the first carries the
/// name; the rest continue it, with the entities open at the cut reopened).
pub fn telegram_messages(author: &str, text: &str) -> Vec<String> {
    crate::markdown::telegram(&author_label(author), text, 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authors_are_labelled_by_who_they_are() {
        assert_eq!(author_label("worker-1"), "worker-1");
        assert_eq!(author_label("human:discord:bob"), "bob (discord)");
        assert_eq!(author_label("human:carol"), "carol");
    }

    #[test]
    fn long_text_splits_at_lines_then_words_and_loses_nothing() {
        let text = "alpha beta\ngamma delta epsilon";
        let parts = split(text, 12, |_| 1);
        assert_eq!(parts, vec!["alpha beta", "gamma delta", "epsilon"]);
        let word = "x".repeat(25);
        let parts = split(&word, 10, |_| 1);
        assert_eq!(parts, vec!["x".repeat(10), "x".repeat(10), "x".repeat(5)]);
        let multi = "é".repeat(5);
        assert_eq!(split(&multi, 2, |_| 1).concat(), multi, "never inside a character");
        assert_eq!(split("", 10, |_| 1), vec![String::new()]);
    }

    #[test]
    fn telegram_messages_fit_the_limit_once_escaped() {
        let text = ".".repeat(5000);
        let parts = telegram_messages("worker-1", &text);
        assert!(parts.len() >= 2, "{}", parts.len());
        for p in &parts {
            assert!(p.chars().count() <= 4096, "{}", p.chars().count());
        }
        assert!(parts[0].starts_with("*\\[worker\\-1\\]* "), "{}", &parts[0][..30]);
        let dots: usize = parts.iter().map(|p| p.matches("\\.").count()).sum();
        assert_eq!(dots, 5000, "every character arrives");
    }
}
