//! Credential hygiene for everything lockrt prints: URLs in `Debug` output and error texts.
//!
//! redis-rs accepts a password in several places of a URL: the user-info part
//! (`redis://user:S@host`, `redis://:S@host`), the query (`?pass=S` for `redis+unix://`), and
//! users write more (`?password=S`, unencoded `/`, `?`, `#` or `@` inside a password, a bad
//! port next to it). The rule here is the same for every one of them, well-formed or not: a
//! URL is shown by what is known to be harmless (scheme, host, port, path, the values of `db`
//! and `protocol`, `#insecure`); any user-info becomes `***@`, every other query value `***`,
//! unknown query keys and fragments `***`. Where two readings of a URL disagree on where its
//! user-info ends (an `@` after a `?` or `#`), everything after the scheme is hidden. On top
//! of that, every text that any reading takes for a secret is scrubbed from what is shown.
//!
//! This module never logs and never fails.

/// Query keys shown with their value (when it is a plain word or number).
const SHOWN_PARAMS: [&str; 2] = ["db", "protocol"];

/// Query keys shown with their value hidden; any other key is hidden with its value.
const CREDENTIAL_PARAMS: [&str; 4] = ["password", "pass", "user", "username"];

/// Query keys (lower case) whose values are scrubbed from messages: any key containing one of
/// these. (Every value but `db` and `protocol` is hidden from a shown URL anyway; scrubbing
/// is for messages that might quote one.)
const SECRET_KEY_PARTS: [&str; 6] = ["pass", "pwd", "secret", "token", "auth", "cred"];

/// The URL with every credential replaced by `***`: `redis://***@host:6379/0`,
/// `redis+unix:///run/redis.sock?pass=***`.
pub(crate) fn url(raw: &str) -> String {
    let shown = match url::Url::parse(raw) {
        Ok(u) if !has_late_at(&u) => structured(&u, raw),
        _ => by_hand(raw),
    };
    scrub_all(&shown, raw)
}

/// An `@` (or `%40`) in the path, query or fragment: a password with an unencoded `/`, `?`
/// or `#` may end there, so the URL parser's reading cannot be trusted.
fn has_late_at(u: &url::Url) -> bool {
    let at = |s: &str| s.contains('@') || s.to_ascii_lowercase().contains("%40");
    at(u.path()) || u.query().is_some_and(at) || u.fragment().is_some_and(at)
}

/// `u` from its harmless parts.
fn structured(u: &url::Url, raw: &str) -> String {
    let mut out = format!("{}:", u.scheme());
    if raw.contains("://") {
        out.push_str("//");
    }
    if !u.username().is_empty() || u.password().is_some() {
        out.push_str("***@");
    }
    out.push_str(u.host_str().unwrap_or_default());
    if let Some(port) = u.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(u.path());
    if let Some(q) = u.query() {
        out.push('?');
        out.push_str(&masked_query(q));
    }
    if let Some(f) = u.fragment() {
        out.push('#');
        out.push_str(masked_fragment(f));
    }
    out
}

/// `raw` (which the URL parser refused or cannot be trusted with) split by hand:
/// user-info up to the last `@`, query from the first `?`, fragment from the first `#`.
fn by_hand(raw: &str) -> String {
    let (scheme, rest) = split_scheme(raw);
    let tail_start = rest.find(['?', '#']);
    match rest.rfind('@') {
        // Either the query holds an `@` or the password holds a `?` or `#`: no reading of
        // what follows the scheme is safe to show.
        Some(at) if tail_start.is_some_and(|q| q < at) => format!("{scheme}***"),
        Some(at) => format!("{scheme}***@{}", masked_tail(&rest[at + 1..])),
        None => format!("{scheme}{}", masked_tail(rest)),
    }
}

/// `("redis://", rest)` when `raw` starts with a scheme and `://`, else `("", raw)`.
fn split_scheme(raw: &str) -> (&str, &str) {
    match raw.find("://") {
        Some(i)
            if i > 0
                && raw[..i]
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c)) =>
        {
            raw.split_at(i + 3)
        }
        _ => ("", raw),
    }
}

/// `host:port/path?query#fragment` with the query and fragment masked.
fn masked_tail(s: &str) -> String {
    let (head, tail) = s.split_at(s.find(['?', '#']).unwrap_or(s.len()));
    let mut out = head.to_owned();
    let (query, fragment) = match tail.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (tail, None),
    };
    if let Some(q) = query.strip_prefix('?') {
        out.push('?');
        out.push_str(&masked_query(q));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(masked_fragment(f));
    }
    out
}

/// `db` and `protocol` as they are, the credential keys with `***`, anything else `***`.
fn masked_query(q: &str) -> String {
    q.split('&')
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let key = decode(k).to_ascii_lowercase();
            let plain = v.len() <= 32
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if SHOWN_PARAMS.contains(&key.as_str()) && plain {
                format!("{key}={v}")
            } else if CREDENTIAL_PARAMS.contains(&key.as_str()) {
                format!("{key}=***")
            } else {
                "***".to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// `insecure` (redis-rs's only fragment) as it is, anything else `***`.
fn masked_fragment(f: &str) -> &str {
    if f == "insecure" { f } else { "***" }
}

/// Every text any reading of `raw` takes for a credential, raw and percent-decoded, longest
/// first: the URL parser's password (or a lone user name, a password in the wrong place),
/// the user-info up to the last `@` and its part after the first `:`, and the values of
/// query keys that name a secret.
pub(crate) fn secrets(raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(u) = url::Url::parse(raw) {
        match u.password() {
            Some(p) => out.push(p.to_owned()),
            None => out.push(u.username().to_owned()),
        }
        if let Some(q) = u.query() {
            out.extend(secret_values(q));
        }
    }
    let (_, rest) = split_scheme(raw);
    if let Some(at) = rest.rfind('@') {
        let userinfo = &rest[..at];
        match userinfo.split_once(':') {
            Some((_, password)) => out.push(password.to_owned()),
            None => out.push(userinfo.to_owned()),
        }
    }
    if let Some(q) = rest.find('?') {
        out.extend(secret_values(&rest[q + 1..]));
    }
    // redis-rs reads user-info percent-decoded, and query values form-decoded (`+` a space).
    let decoded: Vec<String> = out
        .iter()
        .flat_map(|s| [decode(s), decode(&s.replace('+', " "))])
        .collect();
    out.extend(decoded);
    out.retain(|s| !s.is_empty());
    // Longest first, so a secret containing another is replaced whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// The values in query `q` of the keys that name a secret: up to the next `&` or `#`, and
/// to the end (a password with an unencoded `&` or `#`).
fn secret_values(q: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    for pair in q.split('&') {
        let start = from;
        from += pair.len() + 1;
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        let key = decode(k).to_ascii_lowercase();
        if SECRET_KEY_PARTS.iter().any(|p| key.contains(p)) {
            out.push(v.split('#').next().unwrap_or(v).to_owned());
            out.push(q[start + k.len() + 1..].to_owned());
        }
    }
    out
}

/// `s` percent-decoded (`+` stays `+`: redis-rs decodes user-info without it).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `msg` with each non-empty secret replaced by `***`.
pub(crate) fn scrub_secrets(msg: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(msg.to_owned(), |m, s| m.replace(s.as_str(), "***"))
}

/// `msg` with every credential of `raw_url` (raw and percent-decoded) replaced by `***`.
pub(crate) fn scrub_all(msg: &str, raw_url: &str) -> String {
    scrub_secrets(msg, &secrets(raw_url))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every credential form redis-rs accepts, and the secret that must not survive.
    const EXHIBITS: [(&str, &str); 12] = [
        ("redis://:S3cr3t@127.0.0.1:6379/0", "S3cr3t"),
        ("redis://alice:S3cr3t@127.0.0.1:6379/", "S3cr3t"),
        ("redis://127.0.0.1:6379/?password=S3cr3t", "S3cr3t"),
        ("redis://h:6379/?user=bob&password=S3cr3t", "S3cr3t"),
        ("redis+unix:///tmp/redis.sock?pass=S3cr3t", "S3cr3t"),
        ("unix:///tmp/redis.sock?db=x&pass=S3cr3t", "S3cr3t"),
        (":S3cr3t@127.0.0.1:6379", "S3cr3t"),
        ("rediss://u:S3%40cr3t@h:6380/", "S3@cr3t"),
        ("redis://:S3/cr3t@h:notaport/", "S3/cr3t"),
        ("redis://:S3?cr3t@h/", "S3?cr3t"),
        ("redis://h:1/?user=me@corp&password=S3cr3t", "S3cr3t"),
        ("redis://h:notaport/?pass=S3cr3t#S3cr3t", "S3cr3t"),
    ];

    #[test]
    fn no_credential_form_survives_redaction() {
        for (raw, secret) in EXHIBITS {
            let shown = url(raw);
            assert!(!shown.contains(secret), "{raw} -> {shown}");
            assert!(!shown.contains("cr3t"), "{raw} -> {shown}");
            let msg = format!("failed to connect to {raw} with {secret}");
            let scrubbed = scrub_all(&msg, raw);
            assert!(!scrubbed.contains(secret), "{raw}: {scrubbed}");
        }
    }

    #[test]
    fn urls_keep_what_locates_the_server() {
        for (raw, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            (
                "redis://127.0.0.1:6379/?protocol=resp3",
                "redis://127.0.0.1:6379/?protocol=resp3",
            ),
            ("redis://app:pw@h:6379/2", "redis://***@h:6379/2"),
            ("rediss://h:6380/#insecure", "rediss://h:6380/#insecure"),
            (
                "unix:///run/redis.sock?db=x&pass=pw&bogus=1",
                "unix:///run/redis.sock?db=x&pass=***&***",
            ),
            (
                "redis://:pw@h:notaport/0?db=1",
                "redis://***@h:notaport/0?db=1",
            ),
            ("redis://h/?user=me@corp&password=pw", "redis://***"),
        ] {
            assert_eq!(url(raw), shown, "{raw}");
        }
    }
}
