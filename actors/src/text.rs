//! Text helpers shared by the actors: one-line previews for logs and journals, and the refusal
//! of a text over a frame's limit.

/// The start of `text`, at most `n` characters, on one line (each run of whitespace one space;
/// an ellipsis marks a cut). One pass, one allocation: every durable message's chain gets one.
pub fn clip(text: &str, n: usize) -> String {
    let mut out = String::with_capacity(text.len().min(n.saturating_mul(4)) + 3);
    let mut count = 0;
    for (i, word) in text.split_whitespace().enumerate() {
        let sep = (i > 0).then_some(' ');
        for c in sep.into_iter().chain(word.chars()) {
            if count == n {
                out.push('…');
                return out;
            }
            out.push(c);
            count += 1;
        }
    }
    out
}

/// Why a text of `len` bytes is refused; says the limit and how to raise it.
pub fn too_long(what: &str, len: usize, limit: usize) -> String {
    format!(
        "{what} is {} and the limit is {}: send it in parts, or put it in a file and send its path \
         (the limit is an eighth of `delivery.max_frame_bytes` in the swarm file)",
        flock_ipc::human_bytes(len),
        flock_ipc::human_bytes(limit)
    )
}

#[cfg(test)]
mod tests {
    use super::clip;

    #[test]
    fn clip_flattens_whitespace_and_cuts_at_n_characters() {
        assert_eq!(clip("", 5), "");
        assert_eq!(clip("  a \n\t b  ", 5), "a b");
        assert_eq!(clip("hello", 5), "hello");
        assert_eq!(clip("hello world", 5), "hello…");
        assert_eq!(clip("hello world", 6), "hello …");
        assert_eq!(clip("hello world", 7), "hello w…");
        assert_eq!(clip("héllo wörld", 11), "héllo wörld");
        assert_eq!(clip("héllo wörld", 3), "hél…");
        assert_eq!(clip("abc", 0), "…");
    }
}
