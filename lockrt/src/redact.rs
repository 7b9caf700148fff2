//! Credential hygiene for everything lockrt prints: URLs in `Debug` output and error texts.
//!
//! redis-rs accepts a password in several places of a URL: the user-info part
//! (`redis://user:S@host`), the query (`?password=S`, `?pass=S` for `redis+unix://`), and a
//! scheme-less `:S@host:port`. Every one of them is removed here, by parsing the URL with the
//! `url` crate rather than by pattern. This module never logs and never fails: text it cannot
//! parse loses everything up to its last `@`.

/// Query parameters whose values are credentials.
const SECRET_PARAMS: [&str; 4] = ["password", "pass", "user", "username"];

/// The URL with every credential replaced by `***`.
pub(crate) fn url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if u.has_host() || u.scheme().starts_with("redis") => {
            if !u.username().is_empty() || u.password().is_some() {
                let _ = u.set_username("");
                let _ = u.set_password(Some("***"));
            }
            let pairs: Vec<(String, String)> = u
                .query_pairs()
                .map(|(k, v)| {
                    let v = if SECRET_PARAMS.contains(&k.as_ref()) {
                        "***".to_owned()
                    } else {
                        v.into_owned()
                    };
                    (k.into_owned(), v)
                })
                .collect();
            if !pairs.is_empty() {
                u.query_pairs_mut().clear().extend_pairs(pairs);
            }
            u.to_string()
        }
        _ => match raw.rfind('@') {
            Some(at) => format!("***@{}", &raw[at + 1..]),
            None => raw.to_owned(),
        },
    }
}

/// Every credential the URL carries, to scrub from messages that might quote them.
pub(crate) fn secrets(raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    match url::Url::parse(raw) {
        Ok(u) => {
            out.extend(u.password().map(decode));
            if !u.username().is_empty() {
                out.push(decode(u.username()));
            }
            out.extend(
                u.query_pairs()
                    .filter(|(k, _)| SECRET_PARAMS.contains(&k.as_ref()))
                    .map(|(_, v)| v.into_owned()),
            );
        }
        Err(_) => {
            if let Some(at) = raw.rfind('@') {
                let userinfo = &raw[..at];
                let userinfo = userinfo.rsplit("//").next().unwrap_or(userinfo);
                out.extend(userinfo.split(':').map(str::to_owned));
                out.push(userinfo.to_owned());
            }
        }
    }
    out.retain(|s| !s.is_empty());
    // Longest first, so a secret containing another is replaced whole.
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out
}

fn decode(s: &str) -> String {
    url::form_urlencoded::parse(format!("x={s}").as_bytes())
        .next()
        .map_or_else(|| s.to_owned(), |(_, v)| v.into_owned())
}

/// `msg` with every credential of `raw_url` (raw and percent-decoded) replaced by `***`.
/// `msg` with each non-empty secret replaced by `***`.
pub(crate) fn scrub_secrets(msg: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(msg.to_owned(), |m, s| m.replace(s.as_str(), "***"))
}

pub(crate) fn scrub_all(msg: &str, raw_url: &str) -> String {
    let mut out = msg.to_owned();
    for s in secrets(raw_url) {
        out = out.replace(&s, "***");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every credential form redis-rs accepts, and the secret that must not survive.
    const EXHIBITS: [(&str, &str); 7] = [
        ("redis://:S3cr3t@127.0.0.1:6379/0", "S3cr3t"),
        ("redis://alice:S3cr3t@127.0.0.1:6379/", "S3cr3t"),
        ("redis://127.0.0.1:6379/?password=S3cr3t", "S3cr3t"),
        ("redis://h:6379/?user=bob&password=S3cr3t", "S3cr3t"),
        ("redis+unix:///tmp/redis.sock?pass=S3cr3t", "S3cr3t"),
        (":S3cr3t@127.0.0.1:6379", "S3cr3t"),
        ("rediss://u:S3%40cr3t@h:6380/", "S3@cr3t"),
    ];

    #[test]
    fn no_credential_form_survives_redaction() {
        for (raw, secret) in EXHIBITS {
            let shown = url(raw);
            assert!(!shown.contains(secret), "{raw} -> {shown}");
            assert!(!shown.contains("S3cr3t"), "{raw} -> {shown}");
            let msg = format!("failed to connect to {raw} with {secret}");
            let scrubbed = scrub_all(&msg, raw);
            assert!(!scrubbed.contains(secret), "{raw}: {scrubbed}");
        }
    }

    #[test]
    fn urls_without_credentials_stay_readable() {
        assert_eq!(url("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(
            url("redis://127.0.0.1:6379/?protocol=resp3"),
            "redis://127.0.0.1:6379/?protocol=resp3"
        );
    }
}
