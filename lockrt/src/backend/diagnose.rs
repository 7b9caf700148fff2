//! Turns a redis-rs error into a [`BackendError`] that names the cause and the fix, scrubbed of
//! credentials, and transient exactly when redis-rs's own `retry_method()` says a retry can
//! help (plus the failover states `READONLY`, `LOADING`, `MASTERDOWN`, which clear by
//! themselves).

use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

use crate::error::BackendError;

/// ACL rules a user needs for lockrt with the default prefix `lock:`: its own keys, the helper
/// keys (hash tag first), the release channels, and the commands the scripts and the
/// subscriber run.
pub(crate) const ACL_HINT: &str = "grant the user `~lock:* ~{lock:* &{lock:* +evalsha +eval \
     +script|load +subscribe +unsubscribe +ping +hello +wait` (with your prefix instead of \
     `lock:`)";

/// A scrubbed error for the server at `addr`.
pub(crate) fn diagnose(addr: &str, e: &RedisError, scrub: impl Fn(&str) -> String) -> BackendError {
    let (hint, transient) = classify(e);
    let be = BackendError::new(addr, scrub(&e.to_string())).with_hint(hint);
    if transient { be } else { be.permanent() }
}

/// What to do about `e`, and whether retrying the same request may succeed.
fn classify(e: &RedisError) -> (&'static str, bool) {
    let retry = !matches!(e.retry_method(), RetryMethod::NoRetry);
    match e.kind() {
        ErrorKind::AuthenticationFailed => (
            "authentication failed: check the user name and password in the URL (or the ACL \
             user's `on` state)",
            false,
        ),
        ErrorKind::Server(ServerErrorKind::NoPerm) => (ACL_HINT, false),
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => (
            "this is a Redis Cluster node: build the locker with `.cluster([...seed URLs])` \
             (feature `cluster`) or a `redis+cluster://` URL",
            false,
        ),
        ErrorKind::Server(ServerErrorKind::CrossSlot) => (
            "a request spanned cluster slots; this is a lockrt bug, please report it",
            false,
        ),
        ErrorKind::Server(
            ServerErrorKind::ReadOnly | ServerErrorKind::BusyLoading | ServerErrorKind::MasterDown,
        ) => (
            "the server is a replica, loading, or without a master (failover in progress); \
             lockrt retries and reconnects",
            true,
        ),
        ErrorKind::InvalidClientConfig => ("check the URL and the builder's settings", false),
        _ if is_tls(e) => (
            "TLS failed: check the CA (`tls_ca_pem`), the client certificate, the server name \
             in the URL, and that the port speaks TLS",
            false,
        ),
        _ if e.is_timeout() => (
            "no answer in time: check that Redis is running, reachable and not overloaded",
            true,
        ),
        _ if e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped() => {
            ("check that Redis is running and reachable", true)
        }
        _ => ("check that Redis is running and reachable", retry),
    }
}

fn is_tls(e: &RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    text.contains("tls") || text.contains("certificate") || text.contains("handshake")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, text: &str) -> RedisError {
        let resp = format!("-{code} {text}\r\n");
        let value = redis::parse_redis_value(resp.as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    #[test]
    fn each_class_names_its_fix() {
        let noperm = diagnose(
            "h:1",
            &server_error("NOPERM", "no permissions"),
            str::to_owned,
        );
        assert!(!noperm.is_transient());
        assert!(noperm.to_string().contains("~{lock:*"), "{noperm}");
        let moved = diagnose(
            "h:1",
            &server_error("MOVED", "6053 127.0.0.1:7001"),
            str::to_owned,
        );
        assert!(moved.to_string().contains(".cluster("), "{moved}");
        let ro = diagnose(
            "h:1",
            &server_error("READONLY", "You can't write"),
            str::to_owned,
        );
        assert!(ro.is_transient(), "{ro}");
        let loading = diagnose(
            "h:1",
            &server_error("LOADING", "Redis is loading"),
            str::to_owned,
        );
        assert!(loading.is_transient());
    }
}
