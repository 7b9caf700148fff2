//! Standalone Redis: the three lock scripts over one auto-reconnecting multiplexed connection
//! (requests from all tasks are pipelined on it), plus the connection details the pub/sub side
//! needs. Owns credential hygiene: every error leaving this module is scrubbed of the password.

use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, RedisError, Script};

use super::{Attempt, Queueing, Released, Renewal, Token, millis};
use crate::error::BackendError;
use crate::key::LockKey;

/// Functions the scripts share (`owns`, `take_lock`), prepended to each.
const PRELUDE: &str = include_str!("../scripts/lock.lua");

fn script(body: &str) -> Script {
    Script::new(&[PRELUDE, body].concat())
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/acquire.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/release.lua")));

/// Timeouts for talking to Redis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

pub(crate) struct RedisBackend {
    conn: ConnectionManager,
    client: Client,
    addr: String,
    secret: Option<String>,
    fence_retention: Duration,
}

impl RedisBackend {
    /// Opens the command connection, failing fast (within the connect timeout) with the
    /// server's address when it is unreachable.
    pub(crate) async fn connect(
        url: &str,
        timeouts: Timeouts,
        fence_retention: Duration,
    ) -> Result<RedisBackend, BackendError> {
        let safe_url = redact_url(url);
        let client = Client::open(url).map_err(|e| {
            BackendError::new(
                safe_url.clone(),
                format!("invalid Redis URL: {}", scrub(&e.to_string(), None)),
            )
            .permanent()
        })?;
        let info = client.get_connection_info();
        let addr = describe_addr(info.addr());
        let secret = info.redis_settings().password().map(str::to_owned);
        let me = |e: RedisError| {
            BackendError::new(addr.clone(), scrub(&e.to_string(), secret.as_deref()))
        };

        // A probe with hard timeouts: the manager's own first connect retries with backoff for
        // several seconds, too long to tell a user their server is down.
        let probe_cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let probe = tokio::time::timeout(
            timeouts.connect + timeouts.response,
            client.get_multiplexed_async_connection_with_config(&probe_cfg),
        )
        .await
        .map_err(|_| {
            BackendError::new(
                addr.clone(),
                format!("no answer within {:?}", timeouts.connect),
            )
        })?
        .map_err(me)?;
        drop(probe);

        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client.clone(), cfg)
            .await
            .map_err(me)?;
        Ok(RedisBackend {
            conn,
            client,
            addr,
            secret,
            fence_retention,
        })
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub(crate) fn error(&self, e: &RedisError) -> BackendError {
        let be = BackendError::new(
            self.addr.clone(),
            scrub(&e.to_string(), self.secret.as_deref()),
        );
        // A script error or wrong type will fail the same way again: don't retry it.
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
        {
            be
        } else if matches!(e.kind(), redis::ErrorKind::Server(_)) && !e.is_cluster_error() {
            be.permanent()
        } else {
            be
        }
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        queue: Option<Queueing>,
    ) -> Result<Attempt, BackendError> {
        let (register, grant) =
            queue.map_or((0, 0), |q| (millis(q.register), millis(q.grant_lease)));
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = ACQUIRE
            .key(key.lock())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(millis(self.fence_retention.max(ttl * 2)))
            .arg(register)
            .arg(grant)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&e))?;
        let n = reply.get(1).copied().unwrap_or(0);
        Ok(if reply.first() == Some(&1) {
            Attempt::Acquired {
                fence: u64::try_from(n).unwrap_or(0),
            }
        } else {
            // -1: a key without expiry (not ours); -3: free but promised to an earlier waiter.
            Attempt::Held {
                pttl: u64::try_from(n).ok().map(Duration::from_millis),
                counter: reply
                    .get(2)
                    .and_then(|&c| u64::try_from(c).ok())
                    .unwrap_or(0),
            }
        })
    }

    pub(crate) async fn renew(&self, batch: &[Renewal]) -> Result<Vec<bool>, BackendError> {
        let mut inv = RENEW.prepare_invoke();
        for r in batch {
            inv.key(r.key.lock());
        }
        for r in batch {
            inv.arg(r.token.as_str());
        }
        for r in batch {
            inv.arg(millis(r.ttl));
        }
        let mut conn = self.conn.clone();
        let out: Vec<i64> = inv
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&e))?;
        Ok(out.into_iter().map(|v| v == 1).collect())
    }

    pub(crate) async fn release(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Released, BackendError> {
        let mut conn = self.conn.clone();
        let n: i64 = RELEASE
            .key(key.lock())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(token.as_str())
            .arg(key.channel())
            .arg(millis(self.fence_retention))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.error(&e))?;
        Ok(match n {
            0 => Released::NotOwner,
            2 => Released::HandedOver,
            _ => Released::Freed,
        })
    }
}

/// `host:port` or the socket path: enough to find the server, nothing secret.
fn describe_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        other => other.to_string(),
    }
}

/// The URL with any `user:password@` part replaced, for messages about unparsable URLs.
pub(crate) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_owned(),
    }
}

fn scrub(msg: &str, secret: Option<&str>) -> String {
    match secret {
        Some(s) if !s.is_empty() => msg.replace(s, "***"),
        _ => msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(
            redact_url("redis://:secret@127.0.0.1:6379/0"),
            "redis://***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(
            scrub("auth secret failed", Some("secret")),
            "auth *** failed"
        );
    }
}
