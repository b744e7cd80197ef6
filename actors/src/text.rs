//! Text helpers shared by the actors: one-line previews for logs and journals, and the refusal
//! of a text over a frame's limit.

/// The start of `text`, at most `n` characters, on one line.
pub fn clip(text: &str, n: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= n {
        flat
    } else {
        format!("{}…", flat.chars().take(n).collect::<String>())
    }
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
