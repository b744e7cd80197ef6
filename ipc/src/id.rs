//! Message ids: 128-bit, time-ordered (48 bits of Unix milliseconds, 80 random bits), like a ULID.
//! Ids of messages a turn emits are *derived* from the input's id, so a redelivered turn emits the
//! same ids again and the durable mailbox drops the duplicates.

use std::time::{SystemTime, UNIX_EPOCH};

pub type MsgId = u128;

/// A fresh, time-ordered, random id.
pub fn new_id() -> MsgId {
    let ms = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    ((ms & 0xFFFF_FFFF_FFFF) << 80) | (fastrand::u128(..) & ((1u128 << 80) - 1))
}

/// A deterministic id for the `index`-th message emitted while handling `parent`.
/// Same inputs, same id: this is what makes a replayed turn idempotent.
pub fn derive_id(parent: MsgId, index: u32) -> MsgId {
    // Two rounds of splitmix64 over each half, keyed by the index; keeps the parent's time prefix
    // out of the result so derived ids do not collide with fresh ones of the same millisecond.
    fn mix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let hi = mix((parent >> 64) as u64 ^ mix(u64::from(index)));
    let lo = mix(parent as u64 ^ hi);
    (u128::from(hi) << 64) | u128::from(lo)
}

/// Short printable form (32 hex digits).
pub fn fmt_id(id: MsgId) -> String {
    format!("{id:032x}")
}

/// Parses the form printed by [`fmt_id`].
pub fn parse_id(s: &str) -> Option<MsgId> {
    u128::from_str_radix(s, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_and_distinct() {
        let p = new_id();
        assert_eq!(derive_id(p, 0), derive_id(p, 0));
        assert_ne!(derive_id(p, 0), derive_id(p, 1));
        assert_ne!(derive_id(p, 0), p);
        assert_ne!(derive_id(p, 0), derive_id(new_id(), 0));
    }

    #[test]
    fn fresh_ids_are_time_ordered_and_round_trip() {
        let a = new_id();
        std::hint::black_box(0);
        let b = new_id();
        assert!(a >> 80 <= b >> 80);
        assert_eq!(parse_id(&fmt_id(a)), Some(a));
    }
}
