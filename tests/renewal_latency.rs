//! Renewals on a link that is slow but loses nothing: a steady reply latency above the hedge
//! point (half of the lease left) but well below the lease left. The hedge goes out on an extra
//! connection and the first one stays in use, so the first call's reply still wins and the lease
//! is kept; a hedge that replaced the healthy connection made every renewal reconnect and lost it.

mod support;

use std::time::Duration;

use lockrt::Locker;
use lockrt::testing::{Direction, FaultProxy, RedisServer};
use support::{ms, opts};
use tokio::time::Instant;

/// One EVAL round trip through the proxy, timed (what a renewal on a kept connection costs).
async fn round_trip(url: &str) -> Duration {
    let c = redis::Client::open(url).unwrap();
    let mut conn = c.get_multiplexed_async_connection().await.unwrap();
    let start = Instant::now();
    let _: i64 = redis::cmd("EVAL")
        .arg("return redis.call('PEXPIRE', KEYS[1], 1000)")
        .arg(1)
        .arg("nothing")
        .query_async(&mut conn)
        .await
        .unwrap();
    start.elapsed()
}

async fn run_case(ttl_ms: u64, delay_ms: u64) -> (bool, Duration, u64, Duration) {
    if std::env::var("ADV_TRACE").is_ok() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("lockrt=trace")
            .with_test_writer()
            .try_init();
    }
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let locker = Locker::builder()
        .url(proxy.url())
        // Generous timeouts: nothing here times out, the link is only slow.
        .response_timeout(ms(5_000))
        .connect_timeout(ms(5_000))
        .build()
        .await
        .unwrap();
    let ttl = ms(ttl_ms);
    let g = locker.acquire("slow", opts().ttl(ttl)).await.unwrap();
    // Let the revoke subscription settle and one renewal load the renewal script (a first
    // renewal costs NOSCRIPT + EVAL: two round trips, with or without the hedge).
    tokio::time::sleep(ttl / 2).await;
    let before = proxy.counters();
    let start = Instant::now();
    proxy.delay(Direction::ToClient, ms(delay_ms));
    let kept = tokio::time::timeout(ms(6 * ttl_ms), g.lost())
        .await
        .is_err();
    let when = start.elapsed();
    let after = proxy.counters();
    let rtt = round_trip(&proxy.url()).await;
    proxy.pass();
    (kept, when, after.accepted - before.accepted, rtt)
}

/// ttl 1 s, margin 100 ms: a renewal is sent 333 ms into a lease whose local deadline is at
/// 900 ms, so it has 567 ms; the hedge fires after half of that, 283 ms. Replies 350 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_latency_above_the_hedge_point_keeps_the_lease() {
    let (kept, when, new_conns, rtt) = run_case(1_000, 350).await;
    println!(
        "FIGURE renewal_latency: ttl 1s, replies 350 ms late (measured EVAL round trip {rtt:?}, \
         below the 567 ms a renewal has): {} ; {new_conns} new connection(s) in the meantime",
        if kept {
            "lease kept for 6 s".to_owned()
        } else {
            format!("lease LOST {when:?} after the delay started")
        }
    );
    assert!(
        kept,
        "a slow but lossless link cost the lease (lost after {when:?}, {new_conns} reconnects)"
    );
}

/// The same shape at a shorter ttl and a realistic cross-zone latency: ttl 500 ms (deadline
/// 400 ms, renewal at 167 ms, 233 ms to answer, hedge at 116 ms), replies 130 ms late.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_zone_latency_keeps_a_short_lease() {
    let (kept, when, new_conns, rtt) = run_case(500, 130).await;
    println!(
        "FIGURE renewal_latency: ttl 500ms, replies 130 ms late (measured round trip {rtt:?}): {} ; {new_conns} new connection(s)",
        if kept {
            "lease kept for 3 s".to_owned()
        } else {
            format!("lease LOST {when:?} after the delay started")
        }
    );
    assert!(kept, "lost after {when:?}, {new_conns} reconnects");
}
