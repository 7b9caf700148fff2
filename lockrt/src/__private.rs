//! What the `#[distributed_lock]` expansion calls. Not public API: names here may change in any
//! release. Kept tiny so the expansion costs nothing beyond a hand-written `Locker::run`.

use std::fmt::{self, Display, Write as _};
use std::future::Future;

pub use crate::error::FromLockError;
pub use crate::options::{LockOptions, OnLost};
pub use crate::{LockError, Locker};

/// Anything `locker = EXPR` may evaluate to.
#[diagnostic::on_unimplemented(
    message = "`locker = ...` must be a `lockrt::Locker`, `&Locker` or `Arc<Locker>`, not `{Self}`",
    label = "this is not a locker",
    note = "pass the expression that holds your `Locker`, e.g. `locker = self.locker` or `locker = state.locker`"
)]
pub trait AsLocker {
    /// The locker behind the expression.
    fn __as_locker(&self) -> &Locker;
}

impl AsLocker for Locker {
    fn __as_locker(&self) -> &Locker {
        self
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &T {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for &mut T {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for std::sync::Arc<T> {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

impl<T: AsLocker + ?Sized> AsLocker for Box<T> {
    fn __as_locker(&self) -> &Locker {
        (**self).__as_locker()
    }
}

/// A clone of the locker behind `l` (an `Arc` bump, no allocation), so the body can take the
/// fn's parameters by move.
#[inline]
pub fn locker_of<L: AsLocker + ?Sized>(l: &L) -> Locker {
    l.__as_locker().clone()
}

/// The default locker, or `NoDefaultLocker`.
#[inline]
pub fn default_locker() -> Result<Locker, LockError> {
    crate::default_locker()
}

/// Runs `body` under the lock and folds lock failures into the fn's return type.
#[inline]
pub async fn run<F>(
    locker: Result<Locker, LockError>,
    key: String,
    opts: LockOptions,
    body: F,
) -> F::Output
where
    F: Future,
    F::Output: FromLockError,
{
    let locker = match locker {
        Ok(l) => l,
        Err(e) => return F::Output::from_lock_error(e),
    };
    match locker.run(key, opts, body).await {
        Ok(v) => v,
        Err(e) => F::Output::from_lock_error(e),
    }
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
