//! Turns a redis-rs error into a [`BackendError`] that names the cause and the fix, scrubbed of
//! credentials, and transient exactly when redis-rs's own `retry_method()` says a retry can
//! help (plus the failover states `READONLY`, `LOADING`, `MASTERDOWN`, which clear by
//! themselves). A redirection (`MOVED`, `ASK`) means a misconfigured locker on a standalone
//! connection, but a slot migration or failover still under way on a cluster connection
//! (redis-rs follows redirections; one reaches us only when its retries ran out).

use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

use crate::error::BackendError;

/// ACL rules a user needs for lockrt with the default prefix `lock:`: its own keys, the helper
/// keys (hash tag first), the release channels, the commands lockrt sends (`HELLO` to check
/// the version, `WAIT` for `sync_replicas`, `ROLE` which redis-rs asks a Sentinel-named
/// master), and every command the scripts run (Redis checks those against the user too).
/// Keep in step with `scripts/*.lua`; `tests/topology_acl.rs` grants exactly this.
pub(crate) const ACL_HINT: &str = "grant the user `~lock:* ~{lock:* &{lock:* &lock:revoke:* \
     +evalsha +eval +subscribe +unsubscribe +ssubscribe +sunsubscribe +ping +hello +wait +role \
     +info` and the commands the scripts run, `+get +set +del +exists +pexpire +pexpireat +pttl \
     +hget +hmget +hset +hdel +hexists +hincrby +hlen +hgetall +zadd +zcard +zrange \
     +zrangebyscore +zrem +zscore +publish +spublish` (with your prefix instead of `lock:`; on \
     Redis 6.2 without the `s` commands, which it does not have)";

/// A scrubbed error for the server at `addr`; `cluster`: it came through a cluster
/// connection.
pub(crate) fn diagnose(
    addr: &str,
    cluster: bool,
    e: &RedisError,
    scrub: impl Fn(&str) -> String,
) -> BackendError {
    let (hint, transient) = classify(e, cluster);
    let be = BackendError::new(addr, scrub(&e.to_string())).with_hint(hint);
    let be = if cluster && moving(e) {
        be.migrating()
    } else {
        be
    };
    if transient { be } else { be.permanent() }
}

/// A slot in migration or a failover under way: redirections, `TRYAGAIN`, `CLUSTERDOWN`.
fn moving(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
        )
    )
}

/// What to do about `e`, and whether retrying the same request may succeed.
fn classify(e: &RedisError, cluster: bool) -> (&'static str, bool) {
    let retry = !matches!(e.retry_method(), RetryMethod::NoRetry);
    match e.kind() {
        _ if cluster && moving(e) => (
            "the cluster is moving this slot or failing over: retry shortly (while a slot \
             migrates, a script that finds some of a lock's keys moved and others not gets \
             TRYAGAIN until the migration ends)",
            true,
        ),
        ErrorKind::AuthenticationFailed => (
            "authentication failed: check the user name and password in the URL (or the ACL \
             user's `on` state)",
            false,
        ),
        ErrorKind::Server(ServerErrorKind::NoPerm) => (ACL_HINT, false),
        _ if denied_inside_script(e) => (ACL_HINT, false),
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

/// A command a script ran was denied by the user's ACL (Redis 7.0 answers a plain `ERR`).
/// A command a script ran that the user may not run: Redis 7.0 says "can't run this command",
/// Redis 7.2+ and Valkey "ACL failure in script: ... no permissions to run".
fn denied_inside_script(e: &RedisError) -> bool {
    let text = e.to_string();
    matches!(e.kind(), ErrorKind::Server(_))
        && (text.contains("can't run this command") || text.contains("ACL failure in script"))
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
            false,
            &server_error("NOPERM", "no permissions"),
            str::to_owned,
        );
        assert!(!noperm.is_transient());
        assert!(noperm.to_string().contains("~{lock:*"), "{noperm}");
        let in_script = diagnose(
            "h:1",
            false,
            &server_error(
                "ERR",
                "The user executing the script can't run this command or subcommand script: x",
            ),
            str::to_owned,
        );
        assert!(!in_script.is_transient());
        assert!(in_script.to_string().contains("+zscore"), "{in_script}");
        let valkey = diagnose(
            "h:1",
            false,
            &server_error(
                "ERR",
                "ACL failure in script: User u has no permissions to run the 'get' command \
                 script: x, on @user_script:1.",
            ),
            str::to_owned,
        );
        assert!(!valkey.is_transient());
        assert!(valkey.to_string().contains("+zscore"), "{valkey}");
        let moved = diagnose(
            "h:1",
            false,
            &server_error("MOVED", "6053 127.0.0.1:7001"),
            str::to_owned,
        );
        assert!(moved.to_string().contains(".cluster("), "{moved}");
        let ro = diagnose(
            "h:1",
            false,
            &server_error("READONLY", "You can't write"),
            str::to_owned,
        );
        assert!(ro.is_transient(), "{ro}");
        let loading = diagnose(
            "h:1",
            false,
            &server_error("LOADING", "Redis is loading"),
            str::to_owned,
        );
        assert!(loading.is_transient());
    }

    #[test]
    fn redirections_are_transient_on_a_cluster_connection_only() {
        for (code, text) in [
            ("MOVED", "6053 127.0.0.1:7001"),
            ("ASK", "6053 127.0.0.1:7001"),
        ] {
            let standalone = diagnose("h:1", false, &server_error(code, text), str::to_owned);
            assert!(!standalone.is_transient(), "{standalone}");
            assert!(standalone.to_string().contains(".cluster("), "{standalone}");
            let cluster = diagnose("h:1", true, &server_error(code, text), str::to_owned);
            assert!(cluster.is_transient(), "{cluster}");
            assert!(!cluster.to_string().contains(".cluster("), "{cluster}");
        }
        let tryagain = diagnose("h:1", true, &server_error("TRYAGAIN", "x"), str::to_owned);
        assert!(tryagain.is_transient(), "{tryagain}");
    }
}
