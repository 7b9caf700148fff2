//! What a build checks on the server before it hands out a `Locker`: the version (the scripts
//! need Redis 6.2 or newer, and a server says which it is to an ACL-restricted user too), and
//! the eviction policy ([`RedisBackend::check_eviction`]): a server that may evict keys under
//! memory pressure can drop a held lock's key, and then a second owner takes the lock while
//! the first still holds it. Only `noeviction` is safe; any other policy name, one of a
//! future release too, counts as evicting.
//!
//! Both read `INFO` (never `CONFIG GET`, which managed services refuse). A server that refuses
//! `INFO` or leaves the field out (some proxies, an ACL user without `+info`) is not refused
//! for it: the check is skipped and logged. Nothing here changes the server.

use std::sync::Arc;

use redis::{RedisError, Value};

use super::connector::{Conn, Connector};
use super::link::{Link, Startup};
use super::settings::Timeouts;
use super::wire::Delivery;
use crate::error::BackendError;

/// The oldest server the scripts run on: they read the server's clock with `SET … PXAT`.
const MIN_VERSION: (u32, u32) = (6, 2);

/// Refuses servers older than the scripts need, with a command an ACL-restricted user
/// may run (`HELLO`; servers before 6.0 have no ACLs and answer `INFO`); the version, when
/// the server said it.
pub(crate) async fn check_version(
    conn: &mut Conn,
    link: &Link,
) -> Result<Option<(u32, u32)>, BackendError> {
    let hello: Result<Value, RedisError> = redis::cmd("HELLO").arg(2).query_async(conn).await;
    let version = match hello {
        Ok(v) => version_in_hello(&v),
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) => {
            let info: String = redis::cmd("INFO")
                .arg("server")
                .query_async(conn)
                .await
                .map_err(|e| link.error(&e))?;
            version_in_info(&info)
        }
        Err(e) => return Err(link.error(&e)),
    };
    match version {
        Some(v) if v < MIN_VERSION => Err(BackendError::new(
            link.addr().to_owned(),
            format!(
                "Redis {}.{} is too old: lockrt's scripts need Redis {}.{} or newer",
                v.0, v.1, MIN_VERSION.0, MIN_VERSION.1
            ),
        )
        .permanent()),
        v => Ok(v),
    }
}

/// `(major, minor)` from a `HELLO` reply (a map in RESP3, a flat list in RESP2).
fn version_in_hello(v: &Value) -> Option<(u32, u32)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let pairs: Vec<(Option<String>, Option<String>)> = match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), text(v))).collect(),
        Value::Array(a) => a
            .chunks(2)
            .map(|c| (text(&c[0]), c.get(1).and_then(text)))
            .collect(),
        _ => return None,
    };
    let version = pairs
        .into_iter()
        .find(|(k, _)| k.as_deref() == Some("version"))?
        .1?;
    parse_version(&version)
}

fn version_in_info(info: &str) -> Option<(u32, u32)> {
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))?;
    parse_version(line.trim())
}

fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The only `maxmemory-policy` that never evicts a key.
const SAFE_POLICY: &str = "noeviction";

/// Whether a server with this `maxmemory-policy` may evict a held lock's key. A whitelist:
/// every `allkeys-*` policy may evict any key, every `volatile-*` one any key with a TTL (and
/// every held lock has one), and a policy name this version does not know counts as evicting.
fn can_evict(policy: &str) -> bool {
    !policy.trim().eq_ignore_ascii_case(SAFE_POLICY)
}

/// The `maxmemory_policy` field of an `INFO memory` reply.
fn policy_in_info(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|l| l.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

/// The text of one server's `INFO` reply, or `Err` with why there is none (an error reply).
fn info_text(v: &Value) -> Result<String, String> {
    match v {
        Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Ok(s.clone()),
        Value::VerbatimString { text, .. } => Ok(text.clone()),
        Value::ServerError(e) => Err(e.to_string()),
        other => Err(format!("an unexpected reply ({other:?})")),
    }
}

/// What one server's `INFO memory` said about eviction.
#[derive(Debug, PartialEq, Eq)]
enum Finding {
    /// `noeviction`.
    Safe,
    /// A policy that may evict a held lock (named).
    Evicting(String),
    /// No policy to judge: the reply was an error or had no `maxmemory_policy` (why).
    Unknown(String),
}

fn finding(reply: &Value) -> Finding {
    match info_text(reply) {
        Ok(info) => match policy_in_info(&info) {
            Some(p) if can_evict(p) => Finding::Evicting(p.to_owned()),
            Some(_) => Finding::Safe,
            None => Finding::Unknown("its INFO memory has no maxmemory_policy field".into()),
        },
        Err(why) => Finding::Unknown(format!("INFO memory was refused: {why}")),
    }
}

/// The checks of a locker built before its server answered ([`ServerCheck`]), run on its
/// first connection; `expected` is how the locker sends and listens since its build.
pub(crate) struct Started {
    pub(crate) check: ServerCheck,
    pub(crate) expected: Delivery,
}

impl Startup for Started {
    fn check<'a>(
        &'a self,
        link: &'a Link,
        mut conn: Conn,
        generation: u64,
    ) -> futures_util::future::BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            let delivery = self.check.run(link, &mut conn, generation).await?;
            if delivery != self.expected {
                return Err(BackendError::new(
                    self.check.addr.clone(),
                    "this Cluster has no sharded pub/sub (a server before Redis 7.0), which a \
                     locker built before its servers answered assumes it has",
                )
                .with_hint(
                    "set `sharded_pubsub(false)` (LOCKRT_SHARDED_PUBSUB=false) on every locker \
                     of this Cluster",
                )
                .permanent());
            }
            tracing::info!(addr = %self.check.addr, "lock server reachable: serving locks");
            Ok(())
        })
    }
}

/// Whether `e` is the server's own error reply (the command refused: unknown to a proxy,
/// `NOPERM` for an ACL user), not a failure to reach it.
fn is_refusal(e: &RedisError) -> bool {
    matches!(
        e.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// Everything a build checks on the server, and how messages will travel there.
pub(crate) struct ServerCheck {
    pub(crate) connector: Arc<Connector>,
    pub(crate) addr: String,
    /// Bounds asking the Sentinels for the master's address, for messages.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) timeouts: Timeouts,
    /// `sharded_pubsub` as the builder set it.
    pub(crate) sharded_allowed: bool,
    pub(crate) allow_eviction: bool,
}

impl ServerCheck {
    /// The version and the eviction policy, on connection `conn` (`generation`) of `link`:
    /// how messages travel on this server.
    pub(crate) async fn run(
        &self,
        link: &Link,
        conn: &mut Conn,
        generation: u64,
    ) -> Result<Delivery, BackendError> {
        let version = check_version(conn, link).await?;
        self.check_eviction(link, conn, generation).await?;
        Ok(Delivery::for_server(
            self.connector.is_cluster(),
            version,
            self.sharded_allowed,
        ))
    }

    /// How messages travel when the server can't be asked yet (a lazy start): sharded on a
    /// Cluster unless turned off. [`Started`] refuses a server where that is wrong.
    pub(crate) fn assumed_delivery(&self) -> Delivery {
        Delivery::for_server(
            self.connector.is_cluster(),
            Some((7, 0)),
            self.sharded_allowed,
        )
    }

    /// Reads the `maxmemory-policy` of the server(s) that hold locks with `INFO memory`: the
    /// server, the master the Sentinels named, or every master of a Cluster (redis-rs sends
    /// `INFO` to each master of its slot map). Fails with a permanent error naming the server,
    /// the policy, the risk and the fix when a policy may evict, unless `allow_eviction` (then
    /// one WARN says so). A server that refuses `INFO` or has no such field is logged (INFO)
    /// and passed.
    async fn check_eviction(
        &self,
        link: &Link,
        conn: &mut Conn,
        generation: u64,
    ) -> Result<(), BackendError> {
        let allow = self.allow_eviction;
        let reply: Result<Value, RedisError> =
            redis::cmd("INFO").arg("memory").query_async(conn).await;
        let reply = match reply {
            Ok(v) => v,
            Err(e) if is_refusal(&e) => {
                let why = link.error(&e);
                tracing::info!(
                    addr = %self.addr,
                    error = %why.message(),
                    "maxmemory-policy not checked: the server refused INFO memory; make sure \
                     it is noeviction (an evicting policy can drop a held lock)"
                );
                return Ok(());
            }
            Err(e) => {
                link.check_failed(generation, &e);
                return Err(link.error(&e));
            }
        };
        // A Cluster's reply maps each master's address to its own reply.
        let findings: Vec<(Option<String>, Finding)> = match &reply {
            Value::Map(nodes) => nodes
                .iter()
                .map(|(addr, v)| (info_text(addr).ok(), finding(v)))
                .collect(),
            one => vec![(None, finding(one))],
        };
        let mut evicting = Vec::new();
        for (node, found) in findings {
            match found {
                Finding::Safe => {}
                Finding::Evicting(policy) => evicting.push((node, policy)),
                Finding::Unknown(why) => tracing::info!(
                    addr = %node.as_deref().unwrap_or(&self.addr),
                    why = %crate::redact::scrub_secrets(&why, &self.connector.secrets()),
                    "maxmemory-policy not checked; make sure it is noeviction (an evicting \
                     policy can drop a held lock)"
                ),
            }
        }
        evicting.sort();
        let Some((first, policy)) = evicting.first() else {
            return Ok(());
        };
        let addr = match first {
            Some(node) => format!("{node} (a cluster master)"),
            None => self.server_name().await,
        };
        let others: Vec<String> = evicting[1..]
            .iter()
            .map(|(n, p)| format!("{} with {p}", n.as_deref().unwrap_or("another master")))
            .collect();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!(" (and so can {})", others.join(", "))
        };
        if allow {
            tracing::warn!(
                addr = %addr,
                policy = %policy,
                "the server's maxmemory-policy can evict a held lock{also} (two holders at \
                 once); built anyway, as `allow_eviction(true)` asks"
            );
            return Ok(());
        }
        Err(BackendError::new(
            addr,
            format!(
                "maxmemory-policy {policy} can evict a held lock{also}: under memory pressure \
                 the server may delete a held lock's key, and then another owner takes the lock \
                 while this one still holds it (two holders at once)"
            ),
        )
        .with_hint(
            "set `maxmemory-policy noeviction` on the server (and on its replicas, which a \
             failover promotes), or, to accept the risk, call `allow_eviction(true)` on the \
             LockerBuilder",
        )
        .permanent())
    }

    /// The address of the server behind this backend, for an error: the master the Sentinels
    /// name now (asked again, within the timeouts) with the Sentinels', else the configured one.
    async fn server_name(&self) -> String {
        #[cfg(feature = "sentinel")]
        if let super::connector::Connector::Sentinel(s) = &*self.connector {
            let limit = self.timeouts.connect.saturating_add(self.timeouts.response);
            if let Ok(Ok(master)) = tokio::time::timeout(limit, s.master()).await {
                let at = super::settings::describe_addr(master.get_connection_info().addr());
                return format!("{at} (the master of {})", self.addr);
            }
        }
        self.addr.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_noeviction_is_safe() {
        for evicting in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
            // A policy of a future release, or another server's (Dragonfly's cache mode).
            "allkeys-something-new",
            "eviction",
            "",
        ] {
            assert!(can_evict(evicting), "{evicting:?} must count as evicting");
        }
        assert!(!can_evict("noeviction"));
        assert!(!can_evict(" NoEviction\r"));
    }

    #[test]
    fn the_policy_is_read_from_info_memory() {
        let info = "# Memory\r\nused_memory:1000\r\nmaxmemory:0\r\n\
                    maxmemory_policy:volatile-ttl\r\nallocator_frag_ratio:1.0\r\n";
        assert_eq!(policy_in_info(info), Some("volatile-ttl"));
        assert_eq!(policy_in_info("# Memory\r\nused_memory:1000\r\n"), None);
        assert_eq!(policy_in_info("maxmemory_policy:\r\n"), None);

        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        assert_eq!(
            finding(&bulk(info)),
            Finding::Evicting("volatile-ttl".into())
        );
        assert_eq!(
            finding(&bulk("maxmemory_policy:noeviction\r\n")),
            Finding::Safe
        );
        // RESP3 sends INFO as a verbatim string.
        let verbatim = Value::VerbatimString {
            format: redis::VerbatimFormat::Text,
            text: "maxmemory_policy:allkeys-lru\r\n".into(),
        };
        assert_eq!(finding(&verbatim), Finding::Evicting("allkeys-lru".into()));
        assert!(matches!(
            finding(&bulk("# Memory\r\n")),
            Finding::Unknown(_)
        ));
        assert!(matches!(finding(&Value::Nil), Finding::Unknown(_)));
    }

    #[test]
    fn versions_are_read_from_hello_and_info() {
        let hello = Value::Array(vec![
            Value::BulkString(b"server".to_vec()),
            Value::BulkString(b"redis".to_vec()),
            Value::BulkString(b"version".to_vec()),
            Value::BulkString(b"7.0.15".to_vec()),
        ]);
        assert_eq!(version_in_hello(&hello), Some((7, 0)));
        assert_eq!(
            version_in_info("# Server\r\nredis_version:4.0.9\r\n"),
            Some((4, 0))
        );
        assert!((6, 0) < MIN_VERSION && (6, 2) >= MIN_VERSION && (7, 0) >= MIN_VERSION);
    }
}
