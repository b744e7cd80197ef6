//! The flat sections of the swarm file (`supervision`, `delivery`, `channels`, `budget`) as
//! tables: one [`Field`] per key says how its value is read, so the keys a section accepts, its
//! unknown-key error with a did-you-mean, and its reads all come from one list. A check that
//! relates two keys (a maximum below its minimum) runs after the table, on the read values.

use crate::error::Report;
use crate::yaml::{Node, Scalar, lookup};

/// One key of a section and how its value is read into the section's spec (a problem is
/// reported and the default kept).
pub(crate) struct Field<S> {
    pub(crate) key: &'static str,
    pub(crate) read: fn(&mut Report<'_>, &Node, &str, &mut S),
}

/// A whole number between two bounds, into a field of the spec.
macro_rules! uint {
    ($key:literal, $min:expr, $max:expr, $field:ident) => {
        $crate::section::Field {
            key: $key,
            read: |r, v, what, s| {
                if let Some(n) = r.uint(v, what, $min, $max) {
                    s.$field = n;
                }
            },
        }
    };
}

/// `true` or `false`, into a field of the spec.
macro_rules! boolean {
    ($key:literal, $field:ident) => {
        $crate::section::Field {
            key: $key,
            read: |r, v, what, s| {
                if let Some(b) = r.boolean(v, what) {
                    s.$field = b;
                }
            },
        }
    };
}

pub(crate) use {boolean, uint};

/// Reads section `name` by its table into a default spec. An absent (`null`) section is the
/// default; one that is not a mapping is reported. Also returns the section's entries, for the
/// checks that relate two keys.
pub(crate) fn read<'n, S: Default>(
    r: &mut Report<'_>,
    node: &'n Node,
    name: &str,
    fields: &[Field<S>],
) -> (S, &'n [(Node, Node)]) {
    let mut spec = S::default();
    if node.is_null() {
        return (spec, &[]);
    }
    let Some(entries) = r.mapping(node, name) else { return (spec, &[]) };
    let keys: Vec<&str> = fields.iter().map(|f| f.key).collect();
    r.unknown_keys(entries, &keys, &format!("`{name}`"));
    for field in fields {
        if let Some((_, value)) = lookup(entries, field.key) {
            (field.read)(r, value, &format!("{name}.{}", field.key), &mut spec);
        }
    }
    (spec, entries)
}

/// The node of `key` when it holds a whole number (read by its field): where a check relating
/// it to another key points.
pub(crate) fn read_number<'n>(entries: &'n [(Node, Node)], key: &str) -> Option<&'n Node> {
    lookup(entries, key).map(|(_, v)| v).filter(|v| matches!(v.scalar(), Some(Scalar::Int(_))))
}
