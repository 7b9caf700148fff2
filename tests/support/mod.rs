//! Shared fixtures: each test gets its own lock space, either a throwaway redis-server or an
//! in-memory locker, through the same API, so behaviour tests run unchanged on both backends.

#![allow(dead_code, unreachable_pub)]

pub mod history;
pub mod kinds;
pub mod logs;
pub mod mix;
pub mod proxy_faults;
pub mod topology;

use std::path::PathBuf;
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use tokio::time::Instant;

/// The fence of the holder that took a lock whose value (`<token>:<counter>`) Redis has: the
/// counter's value times 32 (README, "On the wire"; local successors take the next 31).
pub fn holder_fence_of_value(value: &str) -> u64 {
    let counter: u64 = value
        .rsplit(':')
        .next()
        .and_then(|f| f.parse().ok())
        .unwrap_or_else(|| panic!("lock value {value:?}"));
    counter * 32
}

/// A lock space: a Redis server of its own, or one in-memory locker.
pub enum Fx {
    Redis(RedisServer),
    Memory(Locker),
}

impl Fx {
    pub fn redis() -> Fx {
        Fx::Redis(RedisServer::start().expect("start redis-server"))
    }

    pub fn memory() -> Fx {
        Fx::Memory(Locker::in_memory())
    }

    pub fn is_redis(&self) -> bool {
        matches!(self, Fx::Redis(_))
    }

    pub fn server(&mut self) -> &mut RedisServer {
        match self {
            Fx::Redis(s) => s,
            Fx::Memory(_) => panic!("this test needs Redis"),
        }
    }

    /// A new locker on this lock space, as another process would have: its own connections
    /// for Redis, a peer in memory.
    pub async fn locker(&self) -> Locker {
        match self {
            Fx::Redis(s) => Locker::connect(&s.url()).await.expect("connect"),
            Fx::Memory(l) => l.in_memory_peer().expect("in-memory locker"),
        }
    }

    /// A new locker on this Redis, built from `builder` (its URL set here).
    pub async fn locker_with(&self, builder: lockrt::LockerBuilder) -> Locker {
        match self {
            Fx::Redis(s) => builder.url(s.url()).build().await.expect("connect"),
            Fx::Memory(_) => panic!("this test needs Redis"),
        }
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        match self {
            Fx::Redis(s) => s
                .client()
                .get_multiplexed_async_connection()
                .await
                .expect("redis connection"),
            Fx::Memory(_) => panic!("this test needs Redis"),
        }
    }

    /// Remaining lease of `key` (`None` when not held).
    pub async fn pttl(&self, key: &str) -> Option<Duration> {
        match self {
            Fx::Redis(_) => {
                let ms: i64 = self
                    .conn()
                    .await
                    .pttl(format!("lock:{key}"))
                    .await
                    .expect("PTTL");
                (ms > 0).then(|| Duration::from_millis(ms as u64))
            }
            Fx::Memory(l) => l.memory_pttl(key),
        }
    }

    /// Waits (bounded) until `key` is no longer held; how long it took, or `None` if it
    /// was still held after `within`.
    pub async fn gone_within(&self, key: &str, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() <= within {
            if self.pttl(key).await.is_none() {
                return Some(start.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        None
    }
}

pub fn opts() -> LockOptions {
    LockOptions::new()
}

/// This host's clock in ms since the Unix epoch: the test servers' clock too (they run here),
/// read without `TIME`, which a suite may run with refused (`REDIS_SERVER_ARGS`).
pub fn wall_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map_or(0, |d| d.as_millis() as u64)
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs an async test body against Redis and against the in-memory backend.
#[macro_export]
macro_rules! both {
    ($(#[$m:meta])* async fn $name:ident($fx:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($fx: $crate::support::Fx) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$m])*
            async fn redis() {
                body($crate::support::Fx::redis()).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            $(#[$m])*
            async fn memory() {
                body($crate::support::Fx::memory()).await
            }
        }
    };
}

/// Waits (bounded: 3 s) until the async check `done` holds, for state observed through
/// Redis; panics with `what` if it doesn't.
pub async fn settle(mut done: impl AsyncFnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < Duration::from_secs(3), "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many waiters of all processes are in the Redis queue of lock `key`.
pub async fn queued(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> usize {
    conn.zcard(format!("{{lock:{key}}}:q"))
        .await
        .expect("ZCARD")
}

/// Waits (bounded) until exactly `n` waiters are queued for lock `key`.
pub async fn until_queued(conn: &mut redis::aio::MultiplexedConnection, key: &str, n: usize) {
    settle(
        async || queued(conn, key).await == n,
        &format!("never saw {n} queued waiter(s) for {key}"),
    )
    .await;
}

/// Waits (bounded) until exactly `n` connections are subscribed to lock `key`'s channel.
pub async fn until_subscribed(conn: &mut redis::aio::MultiplexedConnection, key: &str, n: u64) {
    let channel = format!("{{lock:{key}}}:rel");
    settle(
        async || numsub(conn, &channel).await == n,
        &format!("never saw {n} subscriber(s) of {channel}"),
    )
    .await;
}

/// Waits (bounded) until `n` lockers holding locks under the default prefix listen for forced
/// unlocks on its revoke channel (they subscribe in the background after their first lock).
pub async fn until_listening_for_revocations(conn: &mut redis::aio::MultiplexedConnection, n: u64) {
    settle(
        async || numsub(conn, "{lock:}:revoke").await >= n,
        "the holders never listened for forced unlocks",
    )
    .await;
}

/// Takes a long lock `warm` with `locker` and waits until the locker listens for forced
/// unlocks and has run its check once listening (two scripts): the next requests it sends are
/// the test's own. The guard keeps the locker listening.
pub async fn warm_up(
    locker: &lockrt::Locker,
    direct: &mut redis::aio::MultiplexedConnection,
) -> lockrt::LockGuard {
    let warm = locker
        .acquire("warm", opts().ttl(ms(30_000)))
        .await
        .unwrap();
    until_listening_for_revocations(direct, 1).await;
    settle(
        async || script_calls(direct).await >= 2,
        "the locker's acquire and its check once listening",
    )
    .await;
    warm
}

/// Waits (at most `within`) until `key` is gone from the server: whether it went.
pub async fn until_gone(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    within: Duration,
) -> bool {
    use redis::AsyncCommands;
    let end = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < end {
        if !conn.exists::<_, bool>(key).await.unwrap() {
            return true;
        }
        tokio::time::sleep(ms(20)).await;
    }
    false
}

/// Lock scripts the server has run so far: `EVALSHA` and `EVAL` calls that did not fail (a
/// `NOSCRIPT` answer counts as a failed call).
pub async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let stats = commandstats(conn).await;
    let field = |cmd: &str, name: &str| -> u64 {
        let prefix = format!("cmdstat_{cmd}:");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').find_map(|kv| kv.strip_prefix(name)))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    ["evalsha", "eval"]
        .iter()
        .map(|c| field(c, "calls=").saturating_sub(field(c, "failed_calls=")))
        .sum()
}

/// `PUBSUB NUMSUB` of one channel: how many connections are subscribed to it.
pub async fn numsub(conn: &mut redis::aio::MultiplexedConnection, channel: &str) -> u64 {
    let v: Vec<(String, u64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query_async(conn)
        .await
        .expect("PUBSUB NUMSUB");
    v[0].1
}

/// `INFO commandstats`, one `cmdstat_<name>:calls=..,usec=..` line per command run so far.
pub async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats")
}

/// How many times `cmd` ran, from an `INFO commandstats` text (0 when it never ran).
pub fn calls(stats: &str, cmd: &str) -> u64 {
    let prefix = format!("cmdstat_{cmd}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// How many times `cmd` has run on the server so far.
pub async fn calls_of(conn: &mut redis::aio::MultiplexedConnection, cmd: &str) -> u64 {
    calls(&commandstats(conn).await, cmd)
}

/// Waits (bounded) until `cond` holds, for state that settles right after a background step
/// (a release spawned by `Drop`). Panics with `what` if it doesn't within 2 s.
pub async fn eventually(mut cond: impl FnMut() -> bool, what: &str) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(2), "{what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Path of an example binary. `cargo test` builds the examples next to the test binaries:
/// this one is target/<profile>/deps/<name>-<hash>, they are target/<profile>/examples/<name>.
pub fn example_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps")
        .join("examples")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --examples` (cargo test builds them)",
        path.display()
    );
    path
}

/// Four tests, `on_redis`, `on_a_cluster` (3 masters), `on_sentinel` and `in_memory`, each
/// running `$scenario(a, b)` with two lockers of that topology: two owners, as two processes
/// would be.
#[macro_export]
macro_rules! on_every_topology {
    ($scenario:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn on_redis() {
            let redis = lockrt::testing::RedisServer::start().expect("redis-server");
            let connect = async || {
                let builder = lockrt::Locker::builder().url(redis.url());
                builder.build().await.unwrap()
            };
            $scenario(connect().await, connect().await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn on_a_cluster() {
            let cluster = lockrt::testing::RedisCluster::start(3, 0).expect("cluster");
            let connect = async || {
                let builder = lockrt::Locker::builder().cluster(cluster.seed_urls());
                builder.build().await.unwrap()
            };
            $scenario(connect().await, connect().await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn on_sentinel() {
            let group = lockrt::testing::RedisSentinelGroup::start("lockrt", 1)
                .expect("master, replica and sentinel");
            let connect = async || {
                let builder = lockrt::Locker::builder().sentinel(group.sentinel_urls(), "lockrt");
                builder.build().await.unwrap()
            };
            $scenario(connect().await, connect().await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn in_memory() {
            let locker = lockrt::Locker::in_memory();
            let peer = || locker.in_memory_peer().unwrap();
            $scenario(peer(), peer()).await;
        }
    };
}
