//! A lock server that can't be reached, against real redis-server processes: a refused or
//! blackholed server fails a call after about one connect timeout, not its whole `wait`
//! (unless the caller asks to keep trying); a locker built while the server is down
//! (`lazy_connect`) serves locks once it starts. What an outage logs is `tests/outage_logs.rs`.

use crate::support;

use std::time::Duration;

use lockrt::testing::{FaultProxy, RedisServer};
use lockrt::{LockError, Locker};
use support::{ms, opts};
use tokio::time::Instant;

fn unreachable(err: &LockError) -> bool {
    matches!(err, LockError::Backend(e) if e.is_unreachable())
}

/// One lock taken and released: the locker's connection is open.
async fn warm(locker: &Locker) {
    let g = locker.acquire("warm", opts()).await.unwrap();
    g.release().await.unwrap();
}

/// `n` calls with `wait`, each failing with a `Backend` error: how long each took.
async fn failing_calls(locker: &Locker, n: usize, wait: Duration) -> Vec<Duration> {
    let mut took = Vec::new();
    for i in 0..n {
        let start = Instant::now();
        let err = locker
            .acquire(&format!("k{i}"), opts().wait(wait))
            .await
            .unwrap_err();
        took.push(start.elapsed());
        assert!(err.is_backend(), "{err:?}");
    }
    took
}

/// A locker of `server` built lazily (the server may be down).
async fn lazy(server: &RedisServer) -> Locker {
    let b = Locker::builder().url(server.url()).lazy_connect(true);
    b.build().await.unwrap()
}

/// `key` taken as soon as the server answers again (bounded).
async fn once_served(locker: &Locker, key: &str) -> lockrt::LockGuard {
    let end = Instant::now() + ms(5_000);
    loop {
        match locker.acquire(key, opts().wait(ms(1_000))).await {
            Ok(g) => return g,
            Err(e) if e.is_backend() && Instant::now() < end => tokio::time::sleep(ms(20)).await,
            Err(e) => panic!("no lock once the server answers: {e:?}"),
        }
    }
}

/// The server is killed (connections refused): a call with `wait = 5s` fails at once, as
/// unreachable; with `retry_unreachable` it keeps trying until its wait ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_the_call_at_once_not_after_its_wait() {
    let mut server = RedisServer::start().unwrap();
    let locker = Locker::connect(&server.url()).await.unwrap();
    warm(&locker).await;
    server.kill();
    let took = failing_calls(&locker, 5, ms(5_000)).await;
    let err = locker
        .acquire("k", opts().wait_forever())
        .await
        .unwrap_err();
    assert!(unreachable(&err), "wait forever: {err:?}");
    eprintln!("refused: calls failed after {took:?}");
    // One connect timeout is 1 s; the wait is 5 s.
    assert!(took.iter().all(|t| *t < ms(1_500)), "{took:?}");

    let start = Instant::now();
    let err = locker
        .acquire("patient", opts().wait(ms(1_500)).retry_unreachable(true))
        .await
        .unwrap_err();
    let patient = start.elapsed();
    eprintln!("refused, retry_unreachable: failed after {patient:?}");
    assert!(err.is_backend(), "{err:?}");
    assert!(patient >= ms(1_000), "gave up after {patient:?}");

    // Waiting for ever for the server, it gets the lock once the server is back.
    let waiter = {
        let locker = locker.clone();
        let opts = opts().wait_forever().retry_unreachable(true);
        tokio::spawn(async move { locker.acquire("back", opts).await })
    };
    tokio::time::sleep(ms(1_500)).await; // the outage, longer than the old retries
    server.restart().unwrap();
    let g = tokio::time::timeout(ms(5_000), waiter)
        .await
        .unwrap()
        .unwrap();
    g.expect("the lock once the server is back")
        .release()
        .await
        .unwrap();
}

/// The server stops answering (a partition: connections accepted, nothing forwarded): a
/// call fails after the response and connect timeouts, well within its `wait`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_server_fails_the_call_after_the_timeouts_not_its_wait() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::in_front_of(&server).unwrap();
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    warm(&locker).await;
    proxy.blackhole();
    let took = failing_calls(&locker, 3, ms(10_000)).await;
    eprintln!("blackholed: calls failed after {took:?}");
    // The first call: a response timeout (1 s) on the old connection, then a connect that
    // times out (1 s connect + 1 s handshake at most); the next ones a connect each.
    assert!(took.iter().all(|t| *t < ms(5_000)), "{took:?}");
    proxy.pass();
    let g = once_served(&locker, "after").await;
    g.release().await.unwrap();
}

/// Built while nothing listens at its address (`lazy_connect`): calls fail at once as
/// unreachable; once the server starts, locks are served, mutual exclusion included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locker_built_while_redis_is_down_serves_locks_once_it_starts() {
    let mut server = RedisServer::start().unwrap();
    server.kill();
    let strict = Locker::connect(&server.url()).await;
    assert!(strict.is_err(), "a build that is not lazy fails");
    let start = Instant::now();
    let locker = lazy(&server).await;
    assert!(
        start.elapsed() < ms(2_000),
        "built after {:?}",
        start.elapsed()
    );
    let start = Instant::now();
    let err = locker
        .acquire("k", opts().wait(ms(5_000)))
        .await
        .unwrap_err();
    assert!(unreachable(&err), "{err:?}");
    assert!(
        start.elapsed() < ms(1_500),
        "failed after {:?}",
        start.elapsed()
    );

    server.restart().unwrap();
    let other = Locker::connect(&server.url()).await.unwrap();
    let g = once_served(&locker, "k").await;
    // The lock is real: another locker can't take it, and takes it after the release.
    assert!(other.try_acquire("k", opts()).await.unwrap().is_none());
    g.release().await.unwrap();
    let g2 = other.acquire("k", opts().wait(ms(2_000))).await.unwrap();
    g2.release().await.unwrap();
}

/// A lazy locker checks the server as a build would, on its first connection: one whose
/// `maxmemory-policy` may evict is refused with the build's error, on every call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_locker_refuses_an_evicting_server_on_its_first_connection() {
    let mut server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]).unwrap();
    server.kill();
    let locker = lazy(&server).await;
    server.restart().unwrap();
    let end = Instant::now() + ms(5_000);
    let err = loop {
        match locker.acquire("k", opts()).await {
            Err(e) if unreachable(&e) && Instant::now() < end => tokio::time::sleep(ms(20)).await,
            other => break other.unwrap_err(),
        }
    };
    assert!(err.to_string().contains("allkeys-lru"), "{err}");
    let again = locker.acquire("k", opts()).await.unwrap_err();
    assert!(again.to_string().contains("allkeys-lru"), "{again}");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "a refused server was written to: {keys:?}");
}

/// A job's claim keeps trying an unreachable server within its tick: Redis down when a tick
/// starts and back (without its data) a few hundred ms later still runs that tick, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_its_tick_when_redis_is_back_within_it() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let mut server = RedisServer::start().unwrap();
    let locker = Locker::connect(&server.url()).await.unwrap();
    let (tx, mut ran) = tokio::sync::mpsc::unbounded_channel::<u64>();
    let tick = ms(2_000);
    let opts = opts().ttl(ms(500));
    let job = lockrt::spawn_every(&locker, "job:outage", tick, opts, move |t| {
        let tx = tx.clone();
        async move {
            let t = t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
            let _ = tx.send(t);
        }
    })
    .unwrap();
    let first = tokio::time::timeout(ms(5_000), ran.recv())
        .await
        .unwrap()
        .unwrap();
    server.kill();
    // The next tick starts while the server is down; it is back 300 ms into that tick.
    let next = first + 2_000;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    tokio::time::sleep(ms((next + 300).saturating_sub(now))).await;
    server.restart().unwrap();
    let got = tokio::time::timeout(ms(3_000), ran.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, next, "the tick whose start found the server down");
    job.stop(lockrt::Stop::Now).await.unwrap();
    locker.shutdown().await;
}
