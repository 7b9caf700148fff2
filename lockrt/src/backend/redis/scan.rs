//! Finding held locks: `SCAN` on the server, or on every master of a Cluster; and the plain
//! notes beside them for operators (a job's latest run).

use redis::aio::ConnectionLike;
use redis::{AsyncConnectionConfig, RedisError};

use super::RedisBackend;
use crate::error::BackendError;

impl RedisBackend {
    /// Lock keys matching `pattern` (a `SCAN MATCH` glob over full Redis names), at most
    /// `limit`. On a Cluster every master is scanned (masters from `CLUSTER SLOTS`).
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
    ) -> Result<Vec<String>, BackendError> {
        let (mut conn, generation) = self.link.conn().await?;
        let masters = match self.connector.masters(&mut conn).await {
            Ok(m) => m,
            Err(e) => {
                self.link.after_failure(generation, &e);
                return Err(self.link.error(&e));
            }
        };
        let mut out = Vec::new();
        match masters {
            None => scan_one(&mut conn, pattern, limit, &mut out)
                .await
                .map_err(|e| {
                    self.link.after_failure(generation, &e);
                    self.link.error(&e)
                })?,
            Some(clients) => {
                for client in clients {
                    let mut node = self.node_conn(&client).await?;
                    scan_one(&mut node, pattern, limit, &mut out)
                        .await
                        .map_err(|e| self.link.error(&e))?;
                }
            }
        }
        out.sort();
        out.dedup();
        out.truncate(limit);
        Ok(out)
    }

    /// A plain connection to one cluster node, bounded by the timeouts.
    async fn node_conn(
        &self,
        client: &redis::Client,
    ) -> Result<redis::aio::MultiplexedConnection, BackendError> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response));
        tokio::time::timeout(
            self.timeouts.connect.saturating_add(self.timeouts.response),
            client.get_multiplexed_async_connection_with_config(&cfg),
        )
        .await
        .map_err(|_| BackendError::new(self.addr.clone(), "a cluster node did not answer in time"))?
        .map_err(|e| self.link.error(&e))
    }
}

/// Appends the lock keys matching `pattern` on the server behind `conn` (at most `limit`):
/// the locks themselves, and the keys held only by readers or a semaphore's permits (whose
/// `{lock}:s` is there, not the lock).
async fn scan_one(
    conn: &mut impl ConnectionLike,
    pattern: &str,
    limit: usize,
    out: &mut Vec<String>,
) -> Result<(), RedisError> {
    // Auxiliary names (`{lock}:…`) carry braces; lock keys never do.
    scan_matching(conn, pattern, limit, out, |k| {
        (!k.contains(['{', '}'])).then_some(k)
    })
    .await?;
    let shared = format!("{{{pattern}}}:s");
    scan_matching(conn, &shared, limit, out, |k| {
        let lock = k.strip_prefix('{')?.strip_suffix("}:s")?;
        (!lock.contains(['{', '}'])).then(|| lock.to_owned())
    })
    .await
}

/// `SCAN MATCH pattern` on one server, each name mapped by `lock` (`None`: not a lock).
async fn scan_matching(
    conn: &mut impl ConnectionLike,
    pattern: &str,
    limit: usize,
    out: &mut Vec<String>,
    lock: impl Fn(String) -> Option<String>,
) -> Result<(), RedisError> {
    let mut cursor: u64 = 0;
    // Bounded by the keyspace: SCAN ends with cursor 0, or at `limit` keys.
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500);
        let (next, keys): (u64, Vec<String>) = cmd.query_async(conn).await?;
        out.extend(keys.into_iter().filter_map(&lock));
        cursor = next;
        if cursor == 0 || out.len() >= limit {
            return Ok(());
        }
    }
}

impl RedisBackend {
    /// Writes `text` (this locker's owner record appended) at `name` for `ttl`: a plain `SET`,
    /// a note for operators (a job's latest run), never read by a lock operation.
    pub(crate) async fn put_note(
        &self,
        name: &str,
        text: &str,
        ttl: std::time::Duration,
    ) -> Result<(), BackendError> {
        let (mut conn, generation) = self.link.conn().await?;
        let value = format!("{text}|{}", self.owner);
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let res: Result<(), RedisError> = redis::cmd("SET")
            .arg(name)
            .arg(value)
            .arg("PX")
            .arg(ms)
            .query_async(&mut conn)
            .await;
        res.map_err(|e| {
            self.link.after_failure(generation, &e);
            self.link.error(&e)
        })
    }

    /// The note at `name`, if any (see [`put_note`](Self::put_note)).
    pub(crate) async fn get_note(&self, name: &str) -> Result<Option<String>, BackendError> {
        let (mut conn, generation) = self.link.conn().await?;
        let res: Result<Option<String>, RedisError> =
            redis::cmd("GET").arg(name).query_async(&mut conn).await;
        res.map_err(|e| {
            self.link.after_failure(generation, &e);
            self.link.error(&e)
        })
    }
}
