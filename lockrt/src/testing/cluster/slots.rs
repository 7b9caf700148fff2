//! Hash slots as Redis Cluster computes them, for tests that place keys on chosen nodes:
//! [`slot_of`] and [`key_in_slot`]. The hashing itself is the crate's own, in `key.rs`; this
//! file only gives it a public face.

/// The number of hash slots of a Redis Cluster.
pub const CLUSTER_SLOTS: u16 = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of the key, or of its `{hash tag}` when it has a
/// non-empty one, modulo 16384, exactly as Redis Cluster computes it.
///
/// ```
/// use lockrt::testing::slot_of;
/// assert_eq!(slot_of("foo"), 12182);
/// assert_eq!(slot_of("{user1000}.following"), slot_of("{user1000}.followers"));
/// ```
pub fn slot_of(key: impl AsRef<[u8]>) -> u16 {
    // The same hashing the cluster backend batches renewals by.
    crate::key::slot_of(key.as_ref())
}

/// A key `<prefix><n>` in `slot`, for a test that needs one there.
///
/// ```
/// use lockrt::testing::{key_in_slot, slot_of};
/// assert_eq!(slot_of(key_in_slot("k", 42)), 42);
/// ```
///
/// Panics when `slot` is not below 16384.
pub fn key_in_slot(prefix: &str, slot: u16) -> String {
    assert!(
        slot < CLUSTER_SLOTS,
        "slot {slot} is out of range (0..16384)"
    );
    // About 16 384 candidates on average; a slot missed by 4 million of them does not occur.
    (0..1u32 << 22)
        .map(|n| format!("{prefix}{n}"))
        .find(|key| slot_of(key) == slot)
        .expect("CRC16 reaches every slot within 4 million consecutive keys")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_cluster_spec_check_value() {
        assert_eq!(slot_of("123456789"), 0x31C3 % CLUSTER_SLOTS);
    }

    #[test]
    fn hash_tags_follow_the_first_braces_only_when_non_empty() {
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
    }

    #[test]
    fn key_in_slot_reaches_the_edges() {
        for slot in [0, 1, 8191, 16383] {
            assert_eq!(slot_of(key_in_slot("edge:", slot)), slot);
        }
    }
}
