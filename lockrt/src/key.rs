//! Key hygiene: turns a user's lock key into the Redis names one lock touches.
//!
//! The lock itself is `prefix + key` (`lock:stock:1`), so operators find it with `redis-cli`.
//! `{`, `}` and `%` in the user's key are percent-encoded, which gives two properties:
//! a lock key never contains a brace, so its cluster slot is the hash of the whole name, and the
//! auxiliary names (`{lock:stock:1}:state`, `:rel`, `:q`, `:w`) use exactly that name as their
//! hash tag: same slot, and no user key can produce a name with a brace, so none can forge a tag
//! or collide with an auxiliary name. This module must never let a raw user brace through.

use std::fmt::{self, Display, Write as _};
use std::sync::{Arc, OnceLock};

use crate::error::LockError;
use crate::options::LockKind;

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
    /// What kind of lock the caller takes (part of the call, not of the names).
    pub(crate) kind: LockKind,
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
            kind: LockKind::Exclusive,
        })
    }

    /// The same names, taken as `kind`.
    pub(crate) fn with_kind(self, kind: LockKind) -> LockKey {
        LockKey { kind, ..self }
    }

    /// `prefix + escaped(user)`: the lock's own Redis key, the tag without its braces.
    pub(crate) fn lock(&self) -> &str {
        lock_of_tag(&self.tag)
    }

    /// `{lock}:state`: the lock's fencing counter and how its latest leases ended (a hash,
    /// one per lock; see lock.lua).
    pub(crate) fn state(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":state")
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

    /// `{lock}:owner`: the holder's owner record (see `owner.rs`), same slot, same PTTL.
    pub(crate) fn owner(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":owner")
    }

    /// `{lock}:job`: the latest run of the job of `every` this key names (`job/status.rs`).
    pub(crate) fn job_note(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":job")
    }

    /// `{lock}:s`: the shared holders (readers or permit holders), token -> lease expiry
    /// (server ms). Writers and exclusive holders check it, so they exclude readers.
    pub(crate) fn shared(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":s")
    }

    /// `{lock}:si`: what the shared holders are (`kind`: `r` readers, `s<n>` a semaphore of
    /// `n`) and each one's `<fence>|<acquired ms>|<owner>`.
    pub(crate) fn shared_info(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":si")
    }

    /// `{lock}:now`: the scratch key every script call reads the server's clock through
    /// (set and deleted within the call; see lock.lua's `now_ms`).
    pub(crate) fn now(&self) -> Aux<'_> {
        Aux::new(&self.tag, ":now")
    }

    /// The prefix of the lock's name: the name without the escaped user key.
    pub(crate) fn prefix(&self) -> &str {
        // `%`, `{` and `}` are escaped to three bytes each (see `escape_into`).
        let escaped = self.user.len() + 2 * self.user.matches(['%', '{', '}']).count();
        let lock = self.lock();
        &lock[..lock.len().saturating_sub(escaped)]
    }

    /// `{<prefix>}:revoke`: where a forced unlock of any lock under this prefix names the
    /// token it took the lock from. Never a lock's own name: those have a non-empty key
    /// inside the braces.
    pub(crate) fn revoke_channel(&self) -> String {
        format!("{{{}}}:revoke", self.prefix())
    }

    /// `<prefix>revoke:{<n>}`, `<n>` a number whose slot is the lock's: the revoke channel of
    /// the lock's slot under sharded pub/sub, where a script may publish only on a channel of
    /// its own slot (one channel per slot and prefix, so a locker listens on one per slot it
    /// holds locks in). Never a lock's own channel: those end in `:rel`.
    pub(crate) fn slot_revoke_channel(&self) -> String {
        let slot = slot_of(self.lock().as_bytes());
        format!("{}revoke:{{{}}}", self.prefix(), slot_tag(slot))
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
            kind: LockKind::Exclusive,
        })
    }
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

/// The smallest number whose decimal text hashes to `slot`: a hash tag for that slot. The
/// table of all 16,384 is built once, in a few ms (about 160,000 hashes: every slot is hit
/// below 10^6, which a test checks).
fn slot_tag(slot: u16) -> u32 {
    static TAGS: OnceLock<Box<[u32]>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; 16384];
        let mut left = tags.len();
        let mut text = String::new();
        for n in 0..1_000_000u32 {
            text.clear();
            let _ = write!(text, "{n}");
            let s = usize::from(crc16_xmodem(text.as_bytes()) % 16384);
            if tags[s] == u32::MAX {
                tags[s] = n;
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        tags.into()
    });
    tags[usize::from(slot % 16384)]
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

/// One placeholder's value in a rendered key: the value's `Display` with `%` and `.1` (the
/// first character of the template text that follows the placeholder) percent-encoded, as
/// `%XX` per UTF-8 byte. A value then never contains the text that ends it, so the split points
/// of a rendered key are recoverable and two argument tuples never render the same key
/// (`"order:{a}:{b}"` renders `("a:b", "c")` as `order:a%3Ab:c` and `("a", "b:c")` as
/// `order:a:b:c`: the last value needs only its `%` encoded). Writes straight into the
/// formatter: no allocation beyond the key itself.
///
/// The value is a `&dyn Display` so that a placeholder whose type lacks `Display` gets one
/// error, on the placeholder, from the coercion.
///
/// ```
/// use lockrt::__private::KeyPart;
///
/// assert_eq!(format!("{}:x", KeyPart(&"a:b%", ':')), "a%3Ab%25:x");
/// assert_eq!(format!("{}", KeyPart(&7, '%')), "7");
/// ```
pub struct KeyPart<'a>(pub &'a dyn Display, pub char);

impl Display for KeyPart<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            Escaping {
                out: f,
                also: self.1
            },
            "{}",
            self.0
        )
    }
}

/// Passes text through to `out`, percent-encoding `%` and `also`.
struct Escaping<'a, 'b> {
    out: &'a mut fmt::Formatter<'b>,
    also: char,
}

impl fmt::Write for Escaping<'_, '_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut clean = 0;
        for (i, c) in s.char_indices() {
            if c == '%' || c == self.also {
                self.out.write_str(&s[clean..i])?;
                for byte in c.encode_utf8(&mut [0; 4]).bytes() {
                    write!(self.out, "%{byte:02X}")?;
                }
                clean = i + c.len_utf8();
            }
        }
        self.out.write_str(&s[clean..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_key_keeps_its_operator_visible_name() {
        let k = LockKey::new("lock:", "stock:1").unwrap();
        assert_eq!(k.lock(), "lock:stock:1");
        assert_eq!(k.state().to_string(), "{lock:stock:1}:state");
        assert_eq!(k.channel().to_string(), "{lock:stock:1}:rel");
        assert_eq!(k.queue().to_string(), "{lock:stock:1}:q");
        assert_eq!(k.waiters().to_string(), "{lock:stock:1}:w");
        assert_eq!(tag_of_channel(&k.channel().to_string()), Some(&*k.tag));
    }

    #[test]
    fn the_revoke_channel_is_the_prefix_in_braces_whatever_the_key() {
        for (prefix, user) in [
            ("lock:", "stock:1"),
            ("app:lock:", "a{b}%c"),
            ("", "k"),
            ("p", "%7B"),
        ] {
            let key = LockKey::new(prefix, user).unwrap();
            assert_eq!(key.prefix(), prefix, "{user}");
            assert_eq!(key.revoke_channel(), format!("{{{prefix}}}:revoke"));
            // Never a lock's own channel: those have a non-empty key inside the braces.
            assert_ne!(key.revoke_channel(), key.channel().to_string());
            assert_eq!(tag_of_channel(&key.revoke_channel()), None);
        }
    }

    #[test]
    fn slot_revoke_channels_share_the_locks_slot() {
        for slot in 0..16384u16 {
            let tag = slot_tag(slot);
            assert_ne!(tag, u32::MAX, "slot {slot} has no tag");
            assert_eq!(slot_of(tag.to_string().as_bytes()), slot);
        }
        for (prefix, user) in [("lock:", "stock:1"), ("a:rel", "x{y}"), ("", "k")] {
            let key = LockKey::new(prefix, user).unwrap();
            let channel = key.slot_revoke_channel();
            assert!(
                channel.starts_with(&format!("{prefix}revoke:{{")),
                "{channel}"
            );
            assert_eq!(
                slot_of(channel.as_bytes()),
                slot_of(key.lock().as_bytes()),
                "{channel}"
            );
            assert_eq!(tag_of_channel(&channel), None);
        }
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
        let k = LockKey::new("lock:", "a{b}").unwrap();
        assert_eq!(k.owner().to_string(), "{lock:a%7Bb%7D}:owner");
        let k = LockKey::new("lock:", "job").unwrap();
        assert_eq!(k.owner().to_string(), "{lock:job}:owner");
    }

    #[test]
    fn braces_cannot_forge_a_hash_tag_or_collide() {
        let k = LockKey::new("lock:", "a}:fence{x").unwrap();
        assert!(!k.lock().contains(['{', '}']));
        let other = LockKey::new("lock:", "a").unwrap();
        assert_ne!(k.lock(), other.state().to_string());
        // Escaping is injective: `%7B` typed by a user stays distinct from an escaped brace.
        let a = LockKey::new("lock:", "%7B").unwrap();
        let b = LockKey::new("lock:", "{").unwrap();
        assert_ne!(a.lock(), b.lock());
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

#[cfg(test)]
mod template_tests {
    use super::KeyPart;
    use std::collections::HashSet;

    /// A template as the macro sees it: `texts[0] {v0} texts[1] {v1} ... texts[n]`. The macro
    /// gives each placeholder the first character of the text after it, `%` at the end
    /// (placeholders that touch, or a `%` right after one, are compile errors: never built).
    struct Template<'a> {
        texts: &'a [&'a str],
    }

    impl Template<'_> {
        fn render(&self, values: &[String]) -> String {
            let mut key = self.texts[0].to_owned();
            for (value, text) in values.iter().zip(&self.texts[1..]) {
                let next = text.chars().next().unwrap_or('%');
                key.push_str(&KeyPart(value, next).to_string());
                key.push_str(text);
            }
            key
        }

        /// The values back from a rendered key: a left inverse of `render`, so `render` is
        /// injective wherever this round-trips. A value ends at the first character that is
        /// neither part of a `%XX` escape nor allowed raw in it: the text that follows.
        fn parse(&self, key: &str) -> Vec<String> {
            let mut rest = key.strip_prefix(self.texts[0]).expect("prefix");
            let mut values = Vec::new();
            for text in &self.texts[1..] {
                let end = match text.chars().next() {
                    None => rest.len(),
                    Some(next) => value_end(rest, next),
                };
                values.push(unescape(&rest[..end]));
                rest = rest[end..]
                    .strip_prefix(text)
                    .expect("the text after a value");
            }
            assert!(rest.is_empty(), "trailing {rest:?}");
            values
        }
    }

    fn value_end(s: &str, next: char) -> usize {
        let mut chars = s.char_indices();
        while let Some((i, c)) = chars.next() {
            if c == '%' {
                chars.nth(1); // the two hex digits
            } else if c == next {
                return i;
            }
        }
        s.len()
    }

    fn unescape(s: &str) -> String {
        let mut bytes = Vec::new();
        let mut i = 0;
        while i < s.len() {
            if s.as_bytes()[i] == b'%' {
                bytes.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
                i += 3;
            } else {
                bytes.push(s.as_bytes()[i]);
                i += 1;
            }
        }
        String::from_utf8(bytes).unwrap()
    }

    /// xorshift64*: deterministic, so a failure names the seed that replays it.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
        }

        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[self.below(from.len())]
        }

        /// Up to 5 characters that make collisions likely: separators, `%`, the hex digits of
        /// escapes, a multi-byte character.
        fn value(&mut self) -> String {
            const CHARS: &[char] = &[':', '-', '%', '2', '5', 'A', '3', 'a', 'é', '{', '/'];
            let len = self.below(6);
            (0..len).map(|_| CHARS[self.below(CHARS.len())]).collect()
        }
    }

    #[test]
    fn rendering_is_injective_for_random_templates_and_values() {
        const PREFIXES: &[&str] = &["", "order:", "%", "a2"];
        const SEPARATORS: &[&str] = &[":", "-", "/", "2", "A", "é", "::", ":x", "{", "-%", ":%3A"];
        for seed in 1..=500u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let holes = 1 + rng.below(3);
            let mut texts = vec![rng.pick(PREFIXES)];
            texts.extend((0..holes).map(|_| rng.pick(SEPARATORS)));
            if rng.below(2) == 0 {
                *texts.last_mut().unwrap() = "";
            }
            let template = Template { texts: &texts };
            let mut keys = HashSet::new();
            let mut tuples = HashSet::new();
            for _ in 0..200 {
                let values: Vec<String> = (0..holes).map(|_| rng.value()).collect();
                let key = template.render(&values);
                assert_eq!(
                    template.parse(&key),
                    values,
                    "seed {seed}: {texts:?} -> {key:?}"
                );
                if tuples.insert(values) {
                    assert!(
                        keys.insert(key),
                        "seed {seed}: {texts:?}: two tuples, one key"
                    );
                }
            }
        }
    }

    #[test]
    fn every_short_pair_renders_its_own_key() {
        // All strings of up to 3 characters over an alphabet of separators and escape digits.
        let mut strings = vec![String::new()];
        let mut level = strings.clone();
        for _ in 0..3 {
            level = level
                .iter()
                .flat_map(|s| [':', '%', '2', 'A'].map(|c| format!("{s}{c}")))
                .collect();
            strings.extend(level.iter().cloned());
        }
        for texts in [["o:", ":", ""], ["", "2", "A"], ["x", ":", ":"]] {
            let template = Template { texts: &texts };
            let mut keys = HashSet::new();
            for a in &strings {
                for b in &strings {
                    let key = template.render(&[a.clone(), b.clone()]);
                    assert!(
                        keys.insert(key.clone()),
                        "{texts:?}: {key:?} rendered twice"
                    );
                }
            }
        }
    }

    #[test]
    fn the_reported_collision_is_gone() {
        let template = Template {
            texts: &["order:", ":", ""],
        };
        let one = template.render(&["a:b".into(), "c".into()]);
        let other = template.render(&["a".into(), "b:c".into()]);
        assert_eq!(one, "order:a%3Ab:c");
        assert_eq!(other, "order:a:b:c");
    }
}
