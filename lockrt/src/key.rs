//! Key hygiene: turns a user's lock key into the Redis names one lock touches.
//!
//! The lock itself is `prefix + key` (`lock:stock:1`), so operators find it with `redis-cli`.
//! `{`, `}` and `%` in the user's key are percent-encoded, which gives two properties:
//! a lock key never contains a brace, so its cluster slot is the hash of the whole name, and the
//! auxiliary names (`{lock:stock:1}:fence`, `:rel`, `:q`, `:w`) use exactly that name as their
//! hash tag: same slot, and no user key can produce a name with a brace, so none can forge a tag
//! or collide with an auxiliary name. This module must never let a raw user brace through.

use std::io::Write;
use std::sync::Arc;

use redis::{RedisWrite, ToRedisArgs};

use crate::error::LockError;

/// Longest accepted user key, in bytes. Redis allows far more, but a key this long is almost
/// certainly a bug (a serialised struct), and every lock operation sends it several times.
pub(crate) const MAX_KEY_LEN: usize = 1024;

/// The Redis names of one lock, in two small allocations: a held lock keeps this alive for
/// as long as it is held, and a service may hold many thousands at once. The auxiliary names
/// are written straight into commands ([`Aux`]) instead of being stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKey {
    /// The key as the user wrote it.
    pub(crate) user: Box<str>,
    /// `{prefix + escaped(user)}`: the hash tag of every name of this lock. Shared (not
    /// copied) with the locker's per-key waiting entry.
    pub(crate) tag: Arc<str>,
}

impl LockKey {
    pub(crate) fn new(prefix: &str, user: &str) -> Result<LockKey, LockError> {
        validate(user)?;
        let mut tag = String::with_capacity(prefix.len() + user.len() + 2);
        tag.push('{');
        tag.push_str(prefix);
        escape_into(user, &mut tag);
        tag.push('}');
        Ok(LockKey {
            user: user.into(),
            tag: tag.into(),
        })
    }

    /// `prefix + escaped(user)`: the lock's own Redis key, the tag without its braces.
    pub(crate) fn lock(&self) -> &str {
        lock_of_tag(&self.tag)
    }

    /// `{lock}:fence`: the per-key fencing counter.
    pub(crate) fn fence(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":fence")
    }

    /// `{lock}:rel`: the pub/sub channel hand-overs (and releases with waiters queued) go out on.
    pub(crate) fn channel(&self) -> Aux<'_> {
        channel_of(&self.tag)
    }

    /// `{lock}:q`: waiters of all processes in arrival order.
    pub(crate) fn queue(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":q")
    }

    /// `{lock}:w`: each queued waiter's registration expiry, granted lease and latest attempt.
    pub(crate) fn waiters(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":w")
    }

    /// The key whose lock is Redis key `name` (as `SCAN` lists it) under `prefix`: the inverse
    /// of [`LockKey::lock`]. `None` when `name` is not under `prefix`.
    pub(crate) fn from_lock_name(prefix: &str, name: &str) -> Option<LockKey> {
        let escaped = name.strip_prefix(prefix)?;
        let user = escaped
            .replace("%7B", "{")
            .replace("%7D", "}")
            .replace("%25", "%");
        Some(LockKey {
            user: user.into(),
            tag: format!("{{{name}}}").into(),
        })
    }
}

/// `{lock}:owner`, the owner record beside lock key `lock` (for callers that have only the
/// lock's name, such as a renewal batch).
pub(crate) fn owner_of_lock(lock: &str) -> String {
    format!("{{{lock}}}:owner")
}

/// The suffix of a lock's release channel after its tag.
const CHANNEL_SUFFIX: &str = ":rel";

/// The release channel `{lock}:rel` of the lock with this tag.
pub(crate) fn channel_of(tag: &str) -> Aux<'_> {
    Aux::new(tag, CHANNEL_SUFFIX)
}

/// The lock key inside a tag `{lock}`.
pub(crate) fn lock_of_tag(tag: &str) -> &str {
    &tag[1..tag.len() - 1]
}

/// The tag of a release channel `{lock}:rel`, if it is one.
pub(crate) fn tag_of_channel(channel: &str) -> Option<&str> {
    channel.strip_suffix(CHANNEL_SUFFIX)
}

/// An auxiliary name `{lock}:suffix`, written into a command without building a `String`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Aux<'a> {
    tag: &'a str,
    suffix: &'static str,
}

impl<'a> Aux<'a> {
    fn new(tag: &'a str, suffix: &'static str) -> Aux<'a> {
        Aux { tag, suffix }
    }
}

impl std::fmt::Display for Aux<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.tag, self.suffix)
    }
}

impl ToRedisArgs for Aux<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = w.write_all(self.tag.as_bytes());
        let _ = w.write_all(self.suffix.as_bytes());
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

/// The cluster slot of a key (CRC16/XMODEM of the key, or of its `{hash tag}`, mod 16384).
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(tagged) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_key_keeps_its_operator_visible_name() {
        let k = LockKey::new("lock:", "stock:1").unwrap();
        assert_eq!(k.lock(), "lock:stock:1");
        assert_eq!(k.fence().to_string(), "{lock:stock:1}:fence");
        assert_eq!(k.channel().to_string(), "{lock:stock:1}:rel");
        assert_eq!(k.queue().to_string(), "{lock:stock:1}:q");
        assert_eq!(k.waiters().to_string(), "{lock:stock:1}:w");
        assert_eq!(tag_of_channel(&k.channel().to_string()), Some(&*k.tag));
    }

    #[test]
    fn lock_names_parse_back_into_their_keys() {
        for user in ["stock:1", "a%7Bb%7D%25", "{x}", "%", "}{", "100%{off}"] {
            let k = LockKey::new("app:lock:", user).unwrap();
            assert_eq!(
                LockKey::from_lock_name("app:lock:", k.lock()),
                Some(k.clone())
            );
        }
        assert_eq!(LockKey::from_lock_name("app:lock:", "other:x"), None);
        let k = LockKey::new("lock:", "job").unwrap();
        assert_eq!(owner_of_lock(k.lock()), "{lock:job}:owner");
    }

    #[test]
    fn braces_cannot_forge_a_hash_tag_or_collide() {
        let k = LockKey::new("lock:", "a}:fence{x").unwrap();
        assert!(!k.lock().contains(['{', '}']));
        let other = LockKey::new("lock:", "a").unwrap();
        assert_ne!(k.lock(), other.fence().to_string());
        // Escaping is injective: `%7B` typed by a user stays distinct from an escaped brace.
        let a = LockKey::new("lock:", "%7B").unwrap();
        let b = LockKey::new("lock:", "{").unwrap();
        assert_ne!(a.lock(), b.lock());
    }

    #[test]
    fn aux_names_are_written_as_one_argument() {
        let k = LockKey::new("lock:", "stock:1").unwrap();
        let args = redis::cmd("X")
            .arg(k.fence())
            .arg(k.queue())
            .get_packed_command();
        let text = String::from_utf8(args).unwrap();
        assert!(text.contains("$20\r\n{lock:stock:1}:fence\r\n"), "{text:?}");
        assert!(text.contains("$16\r\n{lock:stock:1}:q\r\n"), "{text:?}");
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

    #[test]
    fn slots_follow_redis_cluster_hashing() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(
            slot_of(b"{}x"),
            slot_of(b"{}x"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(slot_of(b"lock:a"), slot_of(b"{lock:a}:fence"));
    }
}
