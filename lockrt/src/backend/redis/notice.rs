//! The release messages of a lock's channel `{lock}:rel`, as release.lua and force.lua
//! publish them, decoded for the waiting side ([`Notice`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::contract::{Grant, Notice};

/// Decodes a message on a lock's release channel, as release.lua and force.lua publish it:
/// `g:<token>:<fence>[:<µs since the waiter's latest attempt>]` for a hand-over, anything
/// else for a release.
pub(crate) fn notice(payload: &[u8], arrived: Instant) -> Notice {
    payload
        .strip_prefix(b"g:")
        .and_then(|rest| grant(rest, arrived))
        .map_or(Notice::Released, Notice::Granted)
}

/// The part of a grant message after "g:": "<token>:<fence>[:<µs>]".
fn grant(rest: &[u8], arrived: Instant) -> Option<Grant> {
    let text = std::str::from_utf8(rest).ok()?;
    let (token, tail) = text.split_at_checked(32)?;
    let tail = tail.strip_prefix(':')?;
    let (fence, after_attempt) = match tail.split_once(':') {
        Some((fence, us)) => (fence, Some(Duration::from_micros(us.parse().ok()?))),
        None => (tail, None),
    };
    Some(Grant {
        token: token.to_owned(),
        fence: fence.parse().ok()?,
        after_attempt,
        arrived,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_messages_decode_into_grants_or_releases() {
        let t = Instant::now();
        let token = "0123456789abcdef0123456789abcdef";
        let granted = |payload: String| match notice(payload.as_bytes(), t) {
            Notice::Granted(g) => Some(g),
            Notice::Released => None,
        };
        let g = granted(format!("g:{token}:42:1500")).unwrap();
        assert_eq!((g.token.as_str(), g.fence), (token, 42));
        assert_eq!(g.after_attempt, Some(Duration::from_micros(1500)));
        let g = granted(format!("g:{token}:42")).unwrap();
        assert_eq!((g.fence, g.after_attempt), (42, None));
        for bad in [
            format!("g:{token}:"),
            format!("g:{token}:x"),
            format!("g:{token}:42:"),
            format!("g:{token}:42:-1"),
            format!("g:{token}42"),
            format!("{token}:42"),
            "g:short:1".to_owned(),
            "r".to_owned(),
        ] {
            assert!(granted(bad.clone()).is_none(), "{bad}");
        }
    }
}
