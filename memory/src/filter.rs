//! Which records a search (or a listing) keeps beside the words: at least a priority, a
//! category, a range of days. One parser for the CLI, the dashboard and the `memory_search`
//! tool, whose errors say what to write.

use crate::records::{Priority, Record, days_of};

/// What a record must be to be found, beside the words (`Default`: anything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// At least this priority (`High`: high only; `Medium`: medium and high).
    pub min_priority: Option<Priority>,
    /// Only this category (as the observer tags it: `decision`, `preference`…), any case.
    pub category: Option<String>,
    /// Only records dated on or after / on or before this day (days since the epoch).
    pub since: Option<i64>,
    pub until: Option<i64>,
}

impl Filter {
    /// The filter a person or a model named: a priority (`low`, `medium`, `high`: at least it),
    /// a category, and dates as `YYYY-MM-DD`; what is wrong, said so it can be fixed.
    pub fn parse(
        priority: Option<&str>,
        category: Option<&str>,
        since: Option<&str>,
        until: Option<&str>,
    ) -> std::result::Result<Filter, String> {
        let min_priority = match priority.filter(|p| !p.is_empty()) {
            None => None,
            Some(p) => Some(Priority::parse(p).ok_or_else(|| {
                format!("no priority `{p}`; priorities: low, medium, high (at least that one)")
            })?),
        };
        let day = |what: &str, v: Option<&str>| match v.filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => days_of(v).filter(|_| v.len() == 10).map(Some).ok_or_else(|| {
                format!("`{what}` {v:?} is not a date: write YYYY-MM-DD (e.g. 2026-11-01)")
            }),
        };
        let (since, until) = (day("since", since)?, day("until", until)?);
        if let (Some(s), Some(u)) = (since, until)
            && s > u
        {
            return Err("`since` is after `until`: nothing can be in between".into());
        }
        let category = category.filter(|c| !c.trim().is_empty()).map(|c| c.trim().to_owned());
        Ok(Filter { min_priority, category, since, until })
    }

    pub(crate) fn passes(&self, record: &Record, day: Option<i64>) -> bool {
        self.min_priority.is_none_or(|p| record.priority >= p)
            && self.category.as_deref().is_none_or(|c| record.category.eq_ignore_ascii_case(c))
            && self.since.is_none_or(|s| day.is_some_and(|d| d >= s))
            && self.until.is_none_or(|u| day.is_some_and(|d| d <= u))
    }
}
