//! No script reads the server's `TIME` (refused to scripts by some managed services): every
//! kind works on a server that refuses it, and fences stay strictly increasing when the hosts'
//! clocks disagree (the fence clock is the server's, read without `TIME`).

mod support;

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use support::{ms, opts};

/// A server that refuses `TIME`, as ElastiCache Serverless refuses it to scripts.
fn server_without_time() -> RedisServer {
    // A suite run on such servers already renames TIME for every server (REDIS_SERVER_ARGS);
    // a second rename of it would stop the server from starting.
    let renamed = std::env::var("REDIS_SERVER_ARGS").is_ok_and(|a| a.contains("TIME"));
    let args: &[&str] = if renamed {
        &[]
    } else {
        &["--rename-command", "TIME", ""]
    };
    RedisServer::start_with(args).expect("start redis-server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_works_where_scripts_may_not_call_time() {
    let server = server_without_time();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let refused: redis::RedisResult<redis::Value> = redis::cmd("TIME").query_async(&mut conn).await;
    assert!(refused.is_err(), "the server must refuse TIME: {refused:?}");
    let (a, b) = (
        Locker::connect(&server.url()).await.unwrap(),
        Locker::connect(&server.url()).await.unwrap(),
    );

    // Exclusive, with a waiter of another locker queued and handed the lock on release.
    let held = a.acquire("x", opts()).await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.acquire("x", opts().wait(ms(5_000)))
                .await
                .map(|g| g.fence())
        }
    });
    support::until_queued(&mut conn, "x", 1).await;
    let first = held.fence();
    held.release().await.unwrap();
    let next = waiter
        .await
        .unwrap()
        .expect("the queued waiter is handed the lock");
    assert!(next > first, "{next} after {first}");

    // Read shares renewed by the watchdog past their ttl (the server's clock read off the
    // shares' records), a writer queued behind them, served once they are released.
    let short = opts().ttl(ms(600));
    let r1 = a.acquire("rw", short.read()).await.unwrap();
    let r2 = b.acquire("rw", short.read()).await.unwrap();
    let writer = tokio::spawn({
        let b = b.clone();
        async move {
            b.acquire("rw", opts().write().wait(ms(8_000)))
                .await
                .map(|g| g.fence())
        }
    });
    support::until_queued(&mut conn, "rw", 1).await;
    tokio::time::sleep(ms(1_500)).await; // past two ttls: only renewals keep the shares
    assert!(
        !r1.is_lost() && !r2.is_lost(),
        "renewed shares must still be held"
    );
    let info = a.lock_info("rw").await.unwrap().expect("held by readers");
    assert_eq!(info.shared.len(), 2, "{info:?}");
    assert!(
        info.shared
            .iter()
            .all(|s| s.remaining <= ms(600) && !s.remaining.is_zero())
    );
    assert!(!writer.is_finished(), "a writer entered beside readers");
    let top = r1.fence().max(r2.fence());
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = writer
        .await
        .unwrap()
        .expect("the writer is served after the readers");
    assert!(w > top);

    // A share whose fixed lease ran out unreleased stops counting (the server's clock decides).
    let lapsing = a
        .acquire("lapse", opts().read().ttl(ms(300)).watchdog(false))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let after = b
        .acquire("lapse", opts().write().wait(ms(3_000)))
        .await
        .unwrap();
    assert!(
        start.elapsed() >= ms(150),
        "the writer entered while the share was live"
    );
    drop(lapsing);
    after.release().await.unwrap();

    // A semaphore of 2: the third caller waits for a permit.
    let sem = opts().permits(2);
    let (p1, p2) = (
        a.acquire("sem", sem).await.unwrap(),
        b.acquire("sem", sem).await.unwrap(),
    );
    assert!(b.try_acquire("sem", sem).await.unwrap().is_none());
    p1.release().await.unwrap();
    let p3 = b.acquire("sem", sem.wait(ms(2_000))).await.unwrap();
    p2.release().await.unwrap();
    p3.release().await.unwrap();

    // Several keys at once, and a forced unlock of a key held by readers.
    let both = a
        .acquire_all(["m:1", "m:2"], LockOptions::new())
        .await
        .unwrap();
    drop(both);
    let reader = b.acquire("forced", opts().read()).await.unwrap();
    assert!(a.force_unlock("forced").await.unwrap());
    tokio::time::timeout(ms(3_000), reader.lost())
        .await
        .expect("the reader is told");
}

/// Hosts whose clocks are two seconds apart: fences increase while the key's counter lives,
/// and after it expired (the fence clock is the server's; the client's clock only shows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_hosts_whose_clocks_differ_by_a_second() {
    let server = RedisServer::start().expect("start redis-server");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let locker = Locker::builder()
        .url(server.url())
        .fence_retention(ms(3_000))
        .build()
        .await
        .unwrap();
    let lease = opts().ttl(ms(500));
    let mut fences = Vec::new();
    let take = async |skew_ms: i64| {
        lockrt::testing::skew_clock(skew_ms);
        let g = locker.acquire("skewed", lease).await.unwrap();
        let f = g.fence();
        g.release().await.unwrap();
        lockrt::testing::skew_clock(0);
        f
    };
    for skew in [1_000, -1_000, 1_000, -1_000] {
        fences.push(take(skew).await);
    }
    // The counter expires 3 s after the last acquisition, ahead by a second.
    fences.push(take(1_000).await);
    let left: i64 = conn.pttl("{lock:skewed}:state").await.unwrap();
    assert!(left > 0 && left <= 3_000, "PTTL {left}");
    let start = tokio::time::Instant::now();
    while conn.exists::<_, bool>("{lock:skewed}:state").await.unwrap() {
        assert!(
            start.elapsed() < ms(5_000),
            "the fence counter never expired"
        );
        tokio::time::sleep(ms(20)).await;
    }
    fences.push(take(-1_000).await);
    assert!(fences.windows(2).all(|w| w[1] > w[0]), "{fences:?}");
}

/// A restart without data while a holder's host clock is ahead: the fence clock is the
/// server's, so the next holder's fence is above the lost one's, and the lost holder's release
/// is a loss (the new state's history starts above it). Found by a review when the fence clock
/// was the client's: the next fence went backwards and the release returned `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_data_with_a_host_clock_ahead_keeps_fences_and_losses() {
    let server = RedisServer::start().expect("start redis-server");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (a, b) = (
        Locker::connect(&server.url()).await.unwrap(),
        Locker::connect(&server.url()).await.unwrap(),
    );
    let long = opts().ttl(ms(30_000));
    for read in [false, true] {
        let key = if read { "restart:r" } else { "restart:x" };
        lockrt::testing::skew_clock(10_000);
        let first = a.acquire(key, if read { long.read() } else { long }).await;
        lockrt::testing::skew_clock(0);
        let first = first.unwrap();
        let () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
        // A restart takes longer than the server clock's resolution (1 ms), which orders the
        // fences of a state lost and its successor; FLUSHALL is instant, so wait that out.
        tokio::time::sleep(ms(2)).await;
        let next = b.acquire(key, long.write()).await.unwrap();
        assert!(
            next.fence() > first.fence(),
            "{} after {}",
            next.fence(),
            first.fence()
        );
        next.release().await.unwrap();
        let later = b.acquire(key, long).await.unwrap();
        later.release().await.unwrap();
        let err = first.release().await.unwrap_err();
        assert!(err.is_lost(), "{err:?}");
    }
}
