//! Key hygiene: turns a user's lock key into the Redis names one lock touches.
//!
//! The lock itself is `prefix + key` (`lock:stock:1`), so operators find it with `redis-cli`.
//! `{`, `}` and `%` in the user's key are percent-encoded, which gives two properties:
//! a lock key never contains a brace, so its cluster slot is the hash of the whole name, and the
//! auxiliary names (`{lock:stock:1}:fence`, `:rel`, `:q`, `:w`) use exactly that name as their
//! hash tag: same slot, and no user key can produce a name with a brace, so none can forge a tag
//! or collide with an auxiliary name. This module must never let a raw user brace through.

use crate::LockError;

/// Longest accepted user key, in bytes. Redis allows far more, but a key this long is almost
/// certainly a bug (a serialised struct), and every lock operation sends it several times.
pub(crate) const MAX_KEY_LEN: usize = 1024;

/// The Redis names of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKey {
    /// The key as the user wrote it.
    pub(crate) user: String,
    /// `prefix + escaped(user)`: the lock's own Redis key.
    pub(crate) lock: String,
    /// `{lock}:fence`: the per-key fencing counter.
    pub(crate) fence: String,
    /// `{lock}:rel`: the pub/sub channel a release is announced on.
    pub(crate) channel: String,
    /// `{lock}:q`: waiters of all processes in arrival order.
    pub(crate) queue: String,
    /// `{lock}:w`: each queued waiter's registration expiry and granted lease.
    pub(crate) waiters: String,
}

impl LockKey {
    pub(crate) fn new(prefix: &str, user: &str) -> Result<LockKey, LockError> {
        validate(user)?;
        let mut lock = String::with_capacity(prefix.len() + user.len() + 8);
        lock.push_str(prefix);
        escape_into(user, &mut lock);
        let fence = format!("{{{lock}}}:fence");
        let channel = format!("{{{lock}}}:rel");
        let queue = format!("{{{lock}}}:q");
        let waiters = format!("{{{lock}}}:w");
        Ok(LockKey {
            user: user.to_owned(),
            lock,
            fence,
            channel,
            queue,
            waiters,
        })
    }
}

fn validate(user: &str) -> Result<(), LockError> {
    let reason = if user.is_empty() {
        "the key is empty; give every lock a name, e.g. \"stock:{id}\"".to_owned()
    } else if user.len() > MAX_KEY_LEN {
        format!(
            "the key is {} bytes, more than the {MAX_KEY_LEN} allowed; lock on an id, not on a value",
            user.len()
        )
    } else {
        return Ok(());
    };
    let shown: String = user.chars().take(64).collect();
    Err(LockError::InvalidKey { key: shown, reason })
}

/// Percent-encodes the characters that would let a key forge a hash tag.
fn escape_into(user: &str, out: &mut String) {
    for c in user.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

/// A prefix may not contain braces: that would put a hash tag into every lock key.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.contains(['{', '}']) {
        return Err(LockError::Config(format!(
            "prefix {prefix:?} contains a brace; lockrt manages cluster hash tags itself, \
             use a prefix such as \"lock:\" or \"app:lock:\""
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_key_keeps_its_operator_visible_name() {
        let k = LockKey::new("lock:", "stock:1").unwrap();
        assert_eq!(k.lock, "lock:stock:1");
        assert_eq!(k.fence, "{lock:stock:1}:fence");
        assert_eq!(k.channel, "{lock:stock:1}:rel");
    }

    #[test]
    fn braces_cannot_forge_a_hash_tag_or_collide() {
        let k = LockKey::new("lock:", "a}:fence{x").unwrap();
        assert!(!k.lock.contains(['{', '}']));
        let other = LockKey::new("lock:", "a").unwrap();
        assert_ne!(k.lock, other.fence);
        // Escaping is injective: `%7B` typed by a user stays distinct from an escaped brace.
        let a = LockKey::new("lock:", "%7B").unwrap();
        let b = LockKey::new("lock:", "{").unwrap();
        assert_ne!(a.lock, b.lock);
    }

    #[test]
    fn empty_and_huge_keys_are_rejected() {
        assert!(matches!(
            LockKey::new("lock:", ""),
            Err(LockError::InvalidKey { .. })
        ));
        let huge = "x".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            LockKey::new("lock:", &huge),
            Err(LockError::InvalidKey { .. })
        ));
        assert!(LockKey::new("lock:", &"x".repeat(MAX_KEY_LEN)).is_ok());
    }

    #[test]
    fn prefix_with_brace_is_a_config_error() {
        assert!(validate_prefix("lock:").is_ok());
        assert!(validate_prefix("{app}:").is_err());
    }
}
