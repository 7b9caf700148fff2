//! Helpers shared by the fault tests (`tests/faults_*.rs`): lockers behind a `FaultProxy`, the
//! lock's state as Redis has it, and the one-line figures those tests print for
//! RELIABILITY.md.

#![allow(dead_code)]

use std::time::Duration;

use lockrt::testing::{FaultProxy, RedisServer};
use lockrt::{LockGuard, LockOptions, Locker};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::time::Instant;

/// The margin a default `Locker` takes off a lease of `ttl` (`LockerBuilder::safety_margin`:
/// 100 ms, but at least a twentieth and at most a quarter of the lease).
pub fn default_margin(ttl: Duration) -> Duration {
    Duration::from_millis(100).max(ttl / 20).min(ttl / 4)
}

/// A redis-server and a fault proxy in front of it.
pub fn server_and_proxy() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::in_front_of(&server).unwrap();
    (server, proxy)
}

/// A locker that talks to `proxy`, with a short response timeout so faults show quickly.
pub async fn locker_via(proxy: &FaultProxy, response_timeout: Duration) -> Locker {
    Locker::builder()
        .url(proxy.url())
        .response_timeout(response_timeout)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect through the proxy")
}

/// `key` taken by `locker` with a lease of `ttl` (renewed by the watchdog).
pub async fn held(locker: &Locker, key: &str, ttl: Duration) -> LockGuard {
    locker
        .acquire(key, LockOptions::new().ttl(ttl))
        .await
        .unwrap()
}

/// A connection straight to the server (never through a proxy), for inspection.
pub async fn direct(server: &RedisServer) -> MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("direct connection")
}

/// The lock's value (`<token>:<fence>`) as Redis has it.
pub async fn lock_value(conn: &mut MultiplexedConnection, key: &str) -> Option<String> {
    conn.get(format!("lock:{key}")).await.expect("GET lock")
}

/// The fence of the holder that took the lock with this value.
pub fn fence_in(value: &str) -> u64 {
    super::holder_fence_of_value(value)
}

/// Remaining lease of the lock in Redis (`None` when it does not exist).
pub async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> Option<Duration> {
    let ms: i64 = conn.pttl(format!("lock:{key}")).await.expect("PTTL");
    (ms >= 0).then(|| Duration::from_millis(ms as u64))
}

/// Every key of lock `key` still in Redis: the lock, its queue, its waiter details.
pub async fn leftovers(conn: &mut MultiplexedConnection, key: &str) -> Vec<String> {
    let mut left = Vec::new();
    for k in [
        format!("lock:{key}"),
        format!("{{lock:{key}}}:q"),
        format!("{{lock:{key}}}:w"),
    ] {
        let exists: bool = conn.exists(&k).await.expect("EXISTS");
        if exists {
            left.push(k);
        }
    }
    left
}

/// Polls `cond` every few ms until it holds or `within` passes; how long it took, or `None`.
/// For state that only Redis can be asked about (no event to await).
pub async fn within(within: Duration, mut cond: impl AsyncFnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond().await {
            return Some(start.elapsed());
        }
        if start.elapsed() > within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Prints a measured figure: `FIGURE <case>: <text>`. RELIABILITY.md quotes these lines.
pub fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// Milliseconds with one decimal, for figures.
pub fn ms_f(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}
