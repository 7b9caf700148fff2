//! A renewal whose reply is lost on a live connection (dropped by a middlebox while the TCP
//! connection stays up) is hedged: unanswered for half of the lease left, it goes out again at
//! once on a fresh connection, so one lost reply never costs the lease, whatever the response
//! timeout. Against a real redis-server behind the fault proxy.

use crate::support;

use std::time::Duration;

use lockrt::Locker;
use lockrt::testing::{FaultProxy, RedisServer};
use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_dropped_renewal_reply_does_not_cost_a_one_second_lease() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // The default response timeout (1 s) is as long as the lease.
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let ttl = ms(1_000);
    // Listening for revocations, and the check of the leases once listening, are done before
    // "hedged" is taken: neither the SUBSCRIBE confirmation nor that check's reply (which came
    // before the acquire's, on the same connection) can be the reply dropped below.
    let _warm = support::warm_up(&locker, &mut direct).await;
    let acquired = Instant::now();
    let g = locker.acquire("hedged", opts().ttl(ttl)).await.unwrap();
    let before = proxy.counters();
    proxy.drop_replies(1);
    proxy
        .wait_until(ms(2_000), |c| c.replies_dropped >= 1)
        .await
        .expect("a reply was dropped");
    let dropped_at = acquired.elapsed();
    // Nothing but the renewal (a third into the lease) talks to Redis at that point.
    assert!(
        dropped_at >= ttl / 4 && dropped_at < ttl / 2,
        "the dropped reply came {dropped_at:?} after the acquire: not the renewal's"
    );
    // Three leases long: every later renewal must also get its own reply.
    let kept = tokio::time::timeout(3 * ttl, g.lost()).await.is_err();
    let after = proxy.counters();
    println!(
        "FIGURE renewal_hedge: ttl {ttl:?}, response timeout 1s, renewal reply dropped {dropped_at:?} \
         into the lease: {} ({} new connection(s))",
        if kept {
            "lease kept".to_owned()
        } else {
            format!("lease lost {:?} after the acquire", acquired.elapsed())
        },
        after.accepted - before.accepted
    );
    assert!(kept, "one dropped renewal reply cost the lease");
    assert!(!g.is_lost());
    let value: Option<String> = direct.get("lock:hedged").await.unwrap();
    assert!(value.is_some(), "still held in Redis");
    let pttl: i64 = direct.pttl("lock:hedged").await.unwrap();
    assert!(pttl > 0 && pttl <= 1_000, "pttl {pttl}");
    // The connection that lost a reply is not used any more: later calls pair correctly.
    let other = locker.acquire("other", opts().ttl(ttl)).await.unwrap();
    other.release().await.unwrap();
    g.release().await.expect("released as the owner");
    let gone: bool = direct.exists("lock:hedged").await.unwrap();
    assert!(!gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_answered_late_but_in_time_keeps_the_lease_without_a_false_loss() {
    // Replies delayed (not lost) by less than the hedge delay: no hedge, nothing lost.
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let ttl = ms(1_000);
    let g = locker.acquire("late", opts().ttl(ttl)).await.unwrap();
    let mut direct = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    support::until_listening_for_revocations(&mut direct, 1).await;
    let before = proxy.counters();
    proxy.delay(lockrt::testing::Direction::ToClient, ms(60));
    let kept = tokio::time::timeout(2 * ttl, g.lost()).await.is_err();
    proxy.pass();
    assert!(kept, "a slow reply cost the lease");
    let after = proxy.counters();
    assert_eq!(
        after.accepted, before.accepted,
        "a reply in time is not hedged: no new connection"
    );
    g.release().await.expect("released as the owner");
}

/// A small seeded generator (splitmix64): the chaos case's pauses replay from its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

/// Chaos: for 20 s, one reply at a time is dropped at seeded random moments while three
/// leases (ttl 600 ms, 1 s, 1.5 s, the default 1 s response timeout) are renewed; every one
/// is kept. Replay a seed with `LOCKRT_CHAOS_SEED=<seed>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow (20 s): cargo xtask chaos"]
async fn chaos_renewal_hedge_random_dropped_replies() {
    let seed = std::env::var("LOCKRT_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    println!("chaos_renewal_hedge_random_dropped_replies: seed {seed}");
    let mut rng = Rng(seed);
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let mut guards = Vec::new();
    for (i, ttl) in [600, 1_000, 1_500].into_iter().enumerate() {
        guards.push(
            locker
                .acquire(&format!("chaos:{i}"), opts().ttl(ms(ttl)))
                .await
                .unwrap(),
        );
    }
    let start = Instant::now();
    let mut drops = 0;
    while start.elapsed() < Duration::from_secs(20) {
        // One reply at a time, never two of one renewal: the next drop comes at least 500 ms
        // after the last one happened.
        tokio::time::sleep(ms(500 + rng.below(1_000))).await;
        proxy.drop_replies(1);
        let dropped = proxy
            .wait_until(ms(3_000), |c| c.replies_dropped > drops)
            .await
            .expect("a reply was dropped");
        drops = dropped.replies_dropped;
        for (i, g) in guards.iter().enumerate() {
            assert!(
                !g.is_lost(),
                "seed {seed}: lease chaos:{i} lost after {drops} dropped replies"
            );
        }
    }
    proxy.pass();
    let c = proxy.counters();
    println!(
        "FIGURE chaos_renewal_hedge: seed {seed}, {drops} replies dropped in 20 s, {} connections, 0 of 3 leases lost",
        c.accepted
    );
    for g in guards {
        g.release().await.expect("still the owner");
    }
}

mod renewal_latency {
    //! Renewals on a link that is slow but loses nothing: a steady reply latency above the hedge
    //! point (half of the lease left) but well below the lease left. The hedge goes out on an extra
    //! connection and the first one stays in use, so the first call's reply still wins and the lease
    //! is kept; a hedge that replaced the healthy connection made every renewal reconnect and lost it.

    use super::support;

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
        // Diagnosis: `LOCKRT_CHAOS_LOG=lockrt=trace` logs the case.
        if let Ok(filter) = std::env::var("LOCKRT_CHAOS_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(filter.as_str())
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
}
