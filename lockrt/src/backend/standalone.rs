//! Standalone Redis (a single server, possibly behind a Unix socket or TLS): the three lock scripts over one multiplexed connection (requests from all
//! tasks are pipelined on it), which this module replaces whenever it can no longer be trusted.
//!
//! A pipelined connection pairs replies with requests by order only, so one reply that never
//! comes (dropped by a middlebox while the TCP connection stays up, or a response timeout)
//! shifts every later reply onto the wrong request. Two rules keep that from ever handing a
//! lock to the wrong caller: every script echoes a request id first in its reply, and a reply
//! with another id, a response timeout or an I/O error discards the connection (the next
//! request opens a new one, bounded by the connect timeout). redis-rs's `ConnectionManager`
//! reconnects on I/O errors only, not on timeouts, which is why this module keeps its own slot.
//!
//! Owns credential hygiene: every error leaving this module is scrubbed of the password.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, RedisError, RetryMethod, Script, Value,
};

use super::pubsub::Subscriber;
use super::{Attempt, Queueing, Released, Renewal, Token, millis};
use crate::error::BackendError;
use crate::key::LockKey;

/// Functions the scripts share (`owns`, `take_lock`, the request id), prepended to each.
const PRELUDE: &str = include_str!("../scripts/lock.lua");

fn script(body: &str) -> Script {
    Script::new(&[PRELUDE, body].concat())
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/acquire.lua")));
static RENEW: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/renew.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("../scripts/release.lua")));

/// Request ids: unique per process, which is all that can share a connection.
static NEXT_RID: AtomicU64 = AtomicU64::new(1);

/// The oldest server the scripts run on (`TIME` after writes needs effect replication).
const MIN_VERSION: (u32, u32) = (5, 0);

/// Timeouts for talking to Redis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// The command connection in use and its generation, so that a request that found it broken
/// discards only the one it used, not a fresh one another request already opened.
type Slot = Option<(MultiplexedConnection, u64)>;

pub(crate) struct RedisBackend {
    client: Client,
    addr: String,
    secret: Option<String>,
    timeouts: Timeouts,
    fence_retention: Duration,
    slot: Mutex<Slot>,
    /// Held while opening a connection: one connect at a time, the others wait for it.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    subscriber: Subscriber,
}

impl RedisBackend {
    /// Opens the command connection and checks the server, failing fast (within the connect
    /// and response timeouts) with the server's address when it is unreachable.
    pub(crate) async fn connect(
        url: &str,
        timeouts: Timeouts,
        fence_retention: Duration,
    ) -> Result<RedisBackend, BackendError> {
        let client = Client::open(url).map_err(|e| {
            let msg = crate::redact::scrub_all(&e.to_string(), url);
            BackendError::new(crate::redact::url(url), format!("invalid Redis URL: {msg}"))
                .permanent()
        })?;
        let info = client.get_connection_info();
        let addr = describe_addr(info.addr());
        let secret = info.redis_settings().password().map(str::to_owned);
        let subscriber = Subscriber::new(
            client.clone(),
            addr.clone(),
            timeouts.connect + timeouts.response,
            secret.clone(),
        );
        let backend = RedisBackend {
            client,
            addr,
            secret,
            timeouts,
            fence_retention,
            slot: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            subscriber,
        };
        let (mut conn, _) = backend.conn().await?;
        backend.check_version(&mut conn).await?;
        Ok(backend)
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn subscriber(&self) -> Subscriber {
        self.subscriber.clone()
    }

    /// The connection in use, opening one when there is none.
    async fn conn(&self) -> Result<(MultiplexedConnection, u64), BackendError> {
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        // Boxed: connecting is rare, and its future is large; inline it would grow every
        // request's future (and every future awaiting a lock) by its size.
        Box::pin(self.reconnect()).await
    }

    async fn reconnect(&self) -> Result<(MultiplexedConnection, u64), BackendError> {
        let _one = self.connecting.lock().await;
        if let Some(c) = self.slot().clone() {
            return Ok(c);
        }
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response));
        let conn = tokio::time::timeout(
            self.timeouts.connect + self.timeouts.response,
            self.client
                .get_multiplexed_async_connection_with_config(&cfg),
        )
        .await
        .map_err(|_| {
            BackendError::new(
                self.addr.clone(),
                format!(
                    "no connection within {:?}; check that Redis is running and reachable",
                    self.timeouts.connect
                ),
            )
        })?
        .map_err(|e| self.error(&e))?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.slot() = Some((conn.clone(), generation));
        Ok((conn, generation))
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        // Only ever a clone or a replacement under the lock: a panic can't leave it torn.
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops using connection `generation`: the next request opens a new one.
    fn discard(&self, generation: u64) {
        let mut slot = self.slot();
        if slot.as_ref().is_some_and(|(_, g)| *g == generation) {
            *slot = None;
        }
    }

    /// Refuses servers older than the scripts need, with a command an ACL-restricted user
    /// may run (`HELLO`; servers before 6.0 have no ACLs and answer `INFO`).
    async fn check_version(&self, conn: &mut MultiplexedConnection) -> Result<(), BackendError> {
        let hello: Result<Value, RedisError> = redis::cmd("HELLO").arg(2).query_async(conn).await;
        let version = match hello {
            Ok(v) => version_in_hello(&v),
            Err(e)
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError) =>
            {
                let info: String = redis::cmd("INFO")
                    .arg("server")
                    .query_async(conn)
                    .await
                    .map_err(|e| self.error(&e))?;
                version_in_info(&info)
            }
            Err(e) => return Err(self.error(&e)),
        };
        match version {
            Some(v) if v < MIN_VERSION => Err(BackendError::new(
                self.addr.clone(),
                format!(
                    "Redis {}.{} is too old: lockrt's scripts need Redis {}.{} or newer",
                    v.0, v.1, MIN_VERSION.0, MIN_VERSION.1
                ),
            )
            .permanent()),
            _ => Ok(()),
        }
    }

    /// A scrubbed error, transient or not as redis-rs's own `retry_method` says.
    fn error(&self, e: &RedisError) -> BackendError {
        let be = BackendError::new(self.addr.clone(), self.scrub(&e.to_string()));
        match e.retry_method() {
            RetryMethod::NoRetry => be.permanent(),
            _ => be,
        }
    }

    fn scrub(&self, msg: &str) -> String {
        match self.secret.as_deref() {
            Some(s) if !s.is_empty() => msg.replace(s, "***"),
            _ => msg.to_owned(),
        }
    }

    /// Runs a script invocation whose reply starts with the request id `rid`, and returns the
    /// rest of the reply. A reply with another id (a shifted pipeline), a timeout or a broken
    /// connection discards the connection and is a transient error: the request may or may
    /// not have run.
    async fn invoke(
        &self,
        inv: redis::ScriptInvocation<'_>,
        rid: u64,
    ) -> Result<Vec<Value>, BackendError> {
        let (mut conn, generation) = self.conn().await?;
        let reply: Result<Vec<Value>, RedisError> = inv.invoke_async(&mut conn).await;
        let mut reply = match reply {
            Ok(r) => r,
            Err(e) => {
                if needs_new_connection(&e) {
                    self.discard(generation);
                }
                return Err(self.error(&e));
            }
        };
        if reply.is_empty() || !is_rid(&reply[0], rid) {
            self.discard(generation);
            return Err(BackendError::new(
                self.addr.clone(),
                "a reply belonging to another request arrived (a reply was lost on the \
                 connection); reconnecting",
            ));
        }
        reply.remove(0);
        Ok(reply)
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
        let rid = NEXT_RID.fetch_add(1, Ordering::Relaxed);
        let mut inv = ACQUIRE.prepare_invoke();
        inv.key(key.lock())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(rid)
            .arg(token.as_str())
            .arg(millis(ttl))
            .arg(millis(self.fence_retention))
            .arg(register)
            .arg(grant);
        let reply = ints(&self.invoke(inv, rid).await?);
        let n = reply.get(1).copied().unwrap_or(0);
        Ok(if reply.first() == Some(&1) {
            Attempt::Acquired {
                fence: u64::try_from(n).unwrap_or(0),
            }
        } else {
            // -1: a key without expiry (not ours); -3: free but promised to an earlier waiter.
            Attempt::Held {
                pttl: u64::try_from(n).ok().map(Duration::from_millis),
                counter: reply.get(2).and_then(|&c| u64::try_from(c).ok()),
            }
        })
    }

    pub(crate) async fn renew(&self, batch: &[Renewal<'_>]) -> Result<Vec<bool>, BackendError> {
        let rid = NEXT_RID.fetch_add(1, Ordering::Relaxed);
        let mut inv = RENEW.prepare_invoke();
        inv.arg(rid);
        for r in batch {
            inv.key(r.lock);
        }
        for r in batch {
            inv.arg(r.token.as_str());
        }
        for r in batch {
            inv.arg(millis(r.lease));
        }
        let out = ints(&self.invoke(inv, rid).await?);
        if out.len() != batch.len() {
            return Err(BackendError::new(
                self.addr.clone(),
                "renewal reply has the wrong length",
            ));
        }
        Ok(out.into_iter().map(|v| v == 1).collect())
    }

    pub(crate) async fn release(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Released, BackendError> {
        let rid = NEXT_RID.fetch_add(1, Ordering::Relaxed);
        let mut inv = RELEASE.prepare_invoke();
        inv.key(key.lock())
            .key(key.fence())
            .key(key.queue())
            .key(key.waiters())
            .arg(rid)
            .arg(token.as_str())
            .arg(key.channel())
            .arg(millis(self.fence_retention));
        let reply = ints(&self.invoke(inv, rid).await?);
        Ok(match reply.first() {
            Some(0) => Released::NotOwner,
            Some(2) => Released::HandedOver,
            _ => Released::Freed,
        })
    }
}

/// Errors after which the connection can't be trusted to pair replies with requests.
fn needs_new_connection(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || matches!(e.retry_method(), RetryMethod::Reconnect)
}

fn is_rid(v: &Value, rid: u64) -> bool {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok() == Some(rid.to_string().as_str()),
        _ => false,
    }
}

/// The integers of a script reply (anything else reads as 0, which every caller treats as
/// the cautious answer: not acquired, not renewed, not released).
fn ints(v: &[Value]) -> Vec<i64> {
    v.iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            _ => 0,
        })
        .collect()
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

/// `host:port` or the socket path: enough to find the server, nothing secret.
fn describe_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!((4, 0) < MIN_VERSION && (5, 0) >= MIN_VERSION);
    }

    #[test]
    fn request_ids_must_match() {
        assert!(is_rid(&Value::BulkString(b"42".to_vec()), 42));
        assert!(!is_rid(&Value::BulkString(b"41".to_vec()), 42));
        assert!(!is_rid(&Value::Nil, 42));
    }
}
