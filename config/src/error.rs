//! Config errors and the collector that gathers them: every problem in a swarm file is reported
//! at once, each pinned to a file, line and column, instead of stopping at the first one.

use std::fmt;

/// One problem in a swarm or transcript file.
///
/// `line` and `column` are 1-based; `0:0` means the problem concerns the file as a whole (it could
/// not be read).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct ConfigError {
    /// The file the problem is in, as the user named it (or as resolved from the swarm file).
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

/// Every problem found in a swarm file and the transcripts it references, in file order per file.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The errors, for callers that want to render them their own way.
    pub fn errors(&self) -> &[ConfigError] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl IntoIterator for ConfigErrors {
    type Item = ConfigError;
    type IntoIter = std::vec::IntoIter<ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// Collects errors for one file. Validation code keeps going after reporting, so a single run
/// surfaces every problem; [`Report::for_file`] switches to another file (a transcript) while
/// writing into the same list.
pub(crate) struct Report<'a> {
    file: &'a str,
    errors: &'a mut Vec<ConfigError>,
}

impl<'a> Report<'a> {
    pub(crate) fn new(file: &'a str, errors: &'a mut Vec<ConfigError>) -> Self {
        Self { file, errors }
    }

    /// A report for another file that appends to the same error list.
    pub(crate) fn for_file<'b>(&'b mut self, file: &'b str) -> Report<'b> {
        Report { file, errors: self.errors }
    }

    pub(crate) fn file(&self) -> &str {
        self.file
    }

    pub(crate) fn error(&mut self, pos: Pos, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.to_owned(),
            line: pos.line,
            column: pos.column,
            message: message.into(),
        });
    }

    /// How many errors have been reported so far (in any file). Lets a caller tell whether a
    /// sub-check it ran added problems.
    pub(crate) fn count(&self) -> usize {
        self.errors.len()
    }
}

/// `"; did you mean `x`?"` when `word` is a likely typo of one of `candidates`, else `""`.
pub(crate) fn did_you_mean<'c>(
    word: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> String {
    match closest(word, candidates) {
        Some(best) => format!("; did you mean `{best}`?"),
        None => String::new(),
    }
}

/// The candidate closest to `word`, if it is close enough to be a plausible typo: within an edit
/// distance of a third of the word's length (at most 3), or differing only in case or `-`/`_`.
/// Very short words get no fuzzy match: any other short word would be "close".
pub(crate) fn closest<'c>(
    word: &str,
    candidates: impl IntoIterator<Item = &'c str>,
) -> Option<&'c str> {
    let normalize = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let word_n = normalize(word);
    let limit = (word.chars().count() / 3).min(3);
    candidates
        .into_iter()
        .filter(|c| *c != word)
        .map(|c| {
            let distance =
                if normalize(c) == word_n { 0 } else { edit_distance(&word_n, &normalize(c)) };
            (distance, c)
        })
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, c)| c)
}

/// Levenshtein distance, counting characters (not bytes).
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

/// `a, b, c` with each item in backticks, for "use one of …" hints.
pub(crate) fn list<'c>(items: impl IntoIterator<Item = &'c str>) -> String {
    items.into_iter().map(|i| format!("`{i}`")).collect::<Vec<_>>().join(", ")
}

/// A 1-based line and column in a source file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    pub line: usize,
    pub column: usize,
}

impl Pos {
    /// The start of a file, for problems that concern the document as a whole.
    pub(crate) const START: Pos = Pos { line: 1, column: 1 };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("strategy", "strategi"), 1);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
    }

    #[test]
    fn closest_ignores_unrelated_words() {
        assert_eq!(closest("strategi", ["strategy", "escalate"]), Some("strategy"));
        assert_eq!(closest("max-restarts", ["max_restarts"]), Some("max_restarts"));
        assert_eq!(closest("colour", ["strategy", "escalate"]), None);
        assert_eq!(closest("x", ["y"]), None);
    }
}
