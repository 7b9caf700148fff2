//! Generated Redis URL shapes, each carrying a distinctive password, for the tests that check
//! that no configured secret ever reaches an output (lockctl's here, the library's in the
//! workspace's `tests/secrets.rs`, which includes this file by path).
//!
//! The shapes are the product of a scheme (every one redis-rs or lockrt accepts, and none),
//! a place for the credential (user-info or query, under every key redis-rs knows) and a
//! malformed part (bad port, bad db, stray `@`, unknown query key, trailing garbage, ...),
//! plus the secret percent-encoded and with unencoded separators in it. Every URL points
//! at a closed port or a missing socket, so a connection attempt fails at once.
//!
//! Every secret contains [`MARKER`] (between any two separators it holds, so no fragment of
//! it escapes the check), and [`leak`] finds it, raw or percent-encoded, in any case.

#![allow(dead_code, unreachable_pub)]

/// The text every secret contains; its percent-encoded spelling is `sE%6Br3T`.
pub const MARKER: &str = "sEkr3T";

/// One URL and what it is made of.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The URL, as a user would configure it.
    pub url: String,
    /// The secret as written in the URL.
    pub secret: String,
    /// `scheme / credential place / malformed part / secret spelling`, for failure messages.
    pub what: String,
}

/// The piece of `output` that shows the secret, if any: [`MARKER`] raw or percent-encoded
/// (any case), with some context.
pub fn leak(output: &str) -> Option<String> {
    let lower = output.to_ascii_lowercase();
    ["sekr3t", "se%6br3t"].iter().find_map(|m| {
        lower.find(m).map(|at| {
            let from = output[..at]
                .char_indices()
                .rev()
                .nth(40)
                .map_or(0, |(i, _)| i);
            let to = output[at..]
                .char_indices()
                .nth(60)
                .map_or(output.len(), |(i, _)| at + i);
            output[from..to].to_owned()
        })
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// One TCP server (`redis://`, `rediss://`, `valkey://`, `valkeys://`).
    Tcp,
    /// A Unix socket (`redis+unix://`, `unix://`, `valkey+unix://`).
    Unix,
    /// lockrt's Sentinel URL: hosts and a service name.
    Sentinel,
    /// lockrt's Cluster URL: seed hosts.
    Cluster,
    /// No scheme at all (`:secret@host:port`).
    Bare,
}

const SCHEMES: [(&str, Kind); 13] = [
    ("redis", Kind::Tcp),
    ("rediss", Kind::Tcp),
    ("valkey", Kind::Tcp),
    ("valkeys", Kind::Tcp),
    ("redis+unix", Kind::Unix),
    ("unix", Kind::Unix),
    ("valkey+unix", Kind::Unix),
    ("redis+sentinel", Kind::Sentinel),
    ("rediss+sentinel", Kind::Sentinel),
    ("redis+cluster", Kind::Cluster),
    ("rediss+cluster", Kind::Cluster),
    ("", Kind::Bare),
    ("REDIS", Kind::Tcp),
];

/// Where the credential goes: user-info (`{}` is the secret) or a query string.
const PLACES: [(&str, Place); 8] = [
    ("user:pass@", Place::UserInfo("app:{}")),
    (":pass@", Place::UserInfo(":{}")),
    ("user:pass@ with empty user name", Place::UserInfo("%20:{}")),
    ("?password=", Place::Query("password={}")),
    ("?user=&password=", Place::Query("user=app&password={}")),
    ("?pass=", Place::Query("pass={}")),
    ("?user=&pass=", Place::Query("user=app&pass={}")),
    (
        "?username=&password=",
        Place::Query("username=app&password={}"),
    ),
];

#[derive(Clone, Copy)]
enum Place {
    UserInfo(&'static str),
    Query(&'static str),
}

/// A malformed (or merely unusual) part added to the URL.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Malformed {
    None,
    BadPort,
    HugePort,
    BadDb,
    StrayAt,
    DoubleAt,
    UnknownKey,
    TrailingGarbage,
    Fragment,
    ExtraPath,
    EmptyHost,
}

const MALFORMED: [Malformed; 11] = [
    Malformed::None,
    Malformed::BadPort,
    Malformed::HugePort,
    Malformed::BadDb,
    Malformed::StrayAt,
    Malformed::DoubleAt,
    Malformed::UnknownKey,
    Malformed::TrailingGarbage,
    Malformed::Fragment,
    Malformed::ExtraPath,
    Malformed::EmptyHost,
];

/// How the secret is spelled.
#[derive(Clone, Copy, Debug)]
enum Spelling {
    /// Letters and digits.
    Plain,
    /// Percent-encoded: one letter of the marker, and `@`, `/`, `:` (decodes to
    /// `sEkr3T@sEkr3T/sEkr3T:sEkr3T<n>`).
    Encoded,
    /// Separators left unencoded (`/`, `?`, `#`, `@`, `&`, `=`, `:`, space), a malformed URL.
    Unencoded,
}

fn secret(spelling: Spelling, n: usize) -> String {
    match spelling {
        Spelling::Plain => format!("{MARKER}{n}"),
        Spelling::Encoded => format!("sE%6Br3T%40{MARKER}%2F{MARKER}%3a{MARKER}{n}"),
        Spelling::Unencoded => {
            let m = MARKER;
            format!("{m}/{m}?{m}#{m}@{m}&{m}={m}:{m} {m}{n}")
        }
    }
}

/// Every shape: the full product of scheme, credential place and malformed part with a
/// plain secret, and each scheme and place with the other two spellings.
pub fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for (scheme, kind) in SCHEMES {
        for (place_name, place) in PLACES {
            for m in MALFORMED {
                out.push(build(
                    scheme,
                    kind,
                    place_name,
                    place,
                    m,
                    Spelling::Plain,
                    out.len(),
                ));
            }
            for spelling in [Spelling::Encoded, Spelling::Unencoded] {
                out.push(build(
                    scheme,
                    kind,
                    place_name,
                    place,
                    Malformed::None,
                    spelling,
                    out.len(),
                ));
            }
        }
    }
    out
}

fn build(
    scheme: &str,
    kind: Kind,
    place_name: &str,
    place: Place,
    m: Malformed,
    spelling: Spelling,
    n: usize,
) -> Shape {
    let secret = secret(spelling, n);
    let (userinfo, mut query) = match place {
        Place::UserInfo(t) => (format!("{}@", t.replace("{}", &secret)), Vec::new()),
        Place::Query(t) => (String::new(), vec![t.replace("{}", &secret)]),
    };
    let port = match m {
        Malformed::BadPort => "notaport",
        Malformed::HugePort => "99999",
        _ => "1",
    };
    let host = if m == Malformed::EmptyHost {
        String::new()
    } else {
        format!("127.0.0.1:{port}")
    };
    let (hosts, mut path) = match kind {
        Kind::Tcp | Kind::Bare => (host, "/0".to_owned()),
        Kind::Unix => (
            if matches!(m, Malformed::BadPort | Malformed::HugePort) {
                format!(":{port}")
            } else {
                String::new()
            },
            "/nonexistent-lockrt-dir/redis.sock".to_owned(),
        ),
        Kind::Sentinel => (format!("127.0.0.1:2,{host}"), "/locks".to_owned()),
        Kind::Cluster => (format!("127.0.0.1:2,{host}"), "/".to_owned()),
    };
    match (m, kind) {
        (Malformed::BadDb, Kind::Unix) => query.insert(0, "db=x".to_owned()),
        (Malformed::BadDb, Kind::Sentinel) => path.push_str("/x"),
        (Malformed::BadDb, _) => path = "/x".to_owned(),
        (Malformed::ExtraPath, _) => path.push_str("/extra/0"),
        (Malformed::UnknownKey, _) => query.insert(0, "bogus=1".to_owned()),
        _ => {}
    }
    let at = match m {
        Malformed::StrayAt => "@",
        Malformed::DoubleAt => "x@y@",
        _ => "",
    };
    let mut url = if kind == Kind::Bare {
        String::new()
    } else {
        format!("{scheme}://")
    };
    url.push_str(&userinfo);
    url.push_str(at);
    url.push_str(&hosts);
    url.push_str(&path);
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    match m {
        Malformed::TrailingGarbage => url.push_str(" trailing garbage \u{7f}"),
        Malformed::Fragment => url.push_str("#frag"),
        _ => {}
    }
    Shape {
        what: format!(
            "{} / {place_name} / {m:?} / {spelling:?}",
            if scheme.is_empty() { "(none)" } else { scheme }
        ),
        url,
        secret,
    }
}

#[test]
fn every_shape_carries_the_marker() {
    let shapes = shapes();
    assert!(shapes.len() > 1000, "{}", shapes.len());
    for s in &shapes {
        assert!(leak(&s.url).is_some(), "{s:?}");
    }
}
