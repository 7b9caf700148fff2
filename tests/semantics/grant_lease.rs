//! The lease of a lock a release hands to a queued waiter: its local deadline is as close to
//! Redis's expiry as the safety margin allows (never after it), `max_hold` counts from the
//! hand-over (a guard is never born lost), and a waiter that died while queued blocks the lock
//! only for the short grant lease, whatever its ttl and watchdog setting.

use crate::support;

use std::time::Duration;

use lockrt::testing::FaultProxy;
use lockrt::{LockGuard, Locker};
use redis::AsyncCommands;
use support::{Fx, ms, opts, until_queued, until_subscribed};
use tokio::time::Instant;

/// The slack allowed on top of the safety margin.
const SLACK: Duration = Duration::from_millis(100);

/// The margin a lease of `ttl` keeps before its expiry with the default safety margin
/// (100 ms, at least ttl/20, at most ttl/4).
fn margin(ttl: Duration) -> Duration {
    ms(100).max(ttl / 20).min(ttl / 4)
}

/// Prints a measured figure: `FIGURE <case>: <text>`.
fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// Where Redis's expiry of `key` lies on this clock, read right now: between the two bounds.
async fn expiry_of(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> (Instant, Instant) {
    let before = Instant::now();
    let pttl: i64 = conn.pttl(format!("lock:{key}")).await.expect("PTTL");
    let after = Instant::now();
    assert!(pttl > 0, "{key} is not held ({pttl})");
    // PTTL is whole milliseconds, rounded down or up by the server.
    let pttl = Duration::from_millis(pttl as u64);
    (before + pttl - ms(1), after + pttl + ms(1))
}

/// How far before Redis's expiry a granted waiter's fixed lease (watchdog off, `ttl`) is
/// declared lost, when the release that granted it came `late` after the waiter's last busy
/// attempt (the holder's lease is long: the waiter retries on its own every second).
async fn early_loss_of_a_granted_fixed_lease(ttl: Duration, late: Duration) -> (Duration, bool) {
    let fx = Fx::redis();
    let (holder, waiter) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let held = holder.acquire("fixed", opts()).await.unwrap();
    let w = waiter.clone();
    let handed = tokio::spawn(async move {
        let g = w
            .acquire("fixed", opts().ttl(ttl).watchdog(false).wait(ms(10_000)))
            .await;
        (g, Instant::now())
    });
    until_queued(&mut conn, "fixed", 1).await;
    until_subscribed(&mut conn, "fixed", 1).await;
    // The scenario's timing: the grant comes `late` after the waiter's attempt (its next
    // one is due a second after it).
    tokio::time::sleep(late).await;
    held.release().await.unwrap();
    let (guard, born) = handed.await.unwrap();
    let guard: LockGuard = guard.expect("handed over");
    let (earliest, latest) = expiry_of(&mut conn, "fixed").await;
    assert!(!guard.is_lost(), "born lost");
    guard.lost().await;
    let lost = Instant::now();
    assert!(born < lost);
    let after_expiry = lost > latest;
    (earliest.saturating_duration_since(lost), after_expiry)
}

/// ttl 3 s, watchdog off, granted 800 ms after the waiter's last attempt: the local deadline
/// lies within the safety margin (150 ms here, plus a little slack) of Redis's expiry, never
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_fixed_lease_ends_at_the_margin_before_redis_expires_it() {
    let (early, after) = early_loss_of_a_granted_fixed_lease(ms(3_000), ms(800)).await;
    figure(
        "a_granted_fixed_lease_ends_at_the_margin_before_redis_expires_it",
        format!(
            "ttl 3 s, watchdog off, granted 800 ms after the waiter's last attempt: declared \
             lost {early:?} before Redis expired the lock (safety margin {:?})",
            margin(ms(3_000))
        ),
    );
    assert!(!after, "declared lost only after Redis expired the lock");
    assert!(
        early <= margin(ms(3_000)) + SLACK,
        "declared lost {early:?} before Redis expired the lock"
    );
}

/// The same with a ttl no longer than the grant lease (1.5 s): the grant is used as it
/// comes, its lease counted from when the release ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_granted_fixed_lease_ends_at_the_margin_before_redis_expires_it() {
    let (early, after) = early_loss_of_a_granted_fixed_lease(ms(1_500), ms(800)).await;
    figure(
        "a_short_granted_fixed_lease_ends_at_the_margin_before_redis_expires_it",
        format!(
            "ttl 1.5 s, watchdog off, granted 800 ms after the waiter's last attempt: \
             declared lost {early:?} before Redis expired the lock (safety margin {:?})",
            margin(ms(1_500))
        ),
    );
    assert!(!after, "declared lost only after Redis expired the lock");
    assert!(
        early <= margin(ms(1_500)) + SLACK,
        "declared lost {early:?} before Redis expired the lock"
    );
}

/// `max_hold` shorter than the wait: a waiter handed the lock 800 ms after its last attempt,
/// with `max_hold` 500 ms, gets a guard that is not lost at birth and holds for `max_hold`
/// from the hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_counts_from_the_hand_over() {
    let fx = Fx::redis();
    let (holder, waiter) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let max_hold = ms(500);
    let mut born_lost = 0;
    let mut held_for = Vec::new();
    for _ in 0..3 {
        let held = holder.acquire("bounded", opts()).await.unwrap();
        let w = waiter.clone();
        let handed = tokio::spawn(async move {
            let g = w
                .acquire("bounded", opts().max_hold(max_hold).wait(ms(10_000)))
                .await
                .expect("handed over");
            let lost_at_birth = g.is_lost();
            (g, Instant::now(), lost_at_birth)
        });
        until_queued(&mut conn, "bounded", 1).await;
        until_subscribed(&mut conn, "bounded", 1).await;
        tokio::time::sleep(ms(800)).await;
        let released = Instant::now();
        held.release().await.unwrap();
        let (guard, born, lost_at_birth) = handed.await.unwrap();
        born_lost += usize::from(lost_at_birth);
        guard.lost().await;
        held_for.push(released.elapsed());
        assert!(born.elapsed() < max_hold + ms(100));
        drop(guard);
    }
    figure(
        "max_hold_counts_from_the_hand_over",
        format!(
            "max_hold 500 ms, granted 800 ms after the waiter's last attempt: {born_lost} of \
             3 guards born lost; lost {held_for:?} after the release"
        ),
    );
    assert_eq!(born_lost, 0, "a guard was born lost");
    for h in held_for {
        assert!(
            h >= max_hold - ms(20),
            "lost {h:?} after the hand-over, max_hold is {max_hold:?}"
        );
    }
}

/// A waiter whose process stopped answering while it was queued (its connections through a
/// proxy that now forwards nothing), with the watchdog off and a ttl of 8 s: the release
/// hands it the lock for the short grant lease only, and another client gets the lock
/// within about 2 s instead of 8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_fixed_lease_waiter_blocks_the_lock_only_for_the_grant_lease() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let holder = fx.locker().await;
    let other = fx.locker().await;
    let doomed = Locker::builder()
        .url(proxy.url())
        .build()
        .await
        .expect("locker behind the proxy");
    let mut conn = fx.conn().await;
    let held = holder.acquire("dead", opts()).await.unwrap();
    let d = doomed.clone();
    let _doomed_wait = tokio::spawn(async move {
        d.acquire(
            "dead",
            opts().ttl(ms(8_000)).watchdog(false).wait(ms(30_000)),
        )
        .await
        .map(|_| ())
    });
    until_queued(&mut conn, "dead", 1).await;
    let ghost: Vec<String> = conn.zrange("{lock:dead}:q", 0, 0).await.unwrap();
    // From here on the waiter's process is as good as dead to Redis.
    proxy.blackhole();
    held.release().await.unwrap();
    let value: String = conn.get("lock:dead").await.unwrap();
    assert!(value.starts_with(&ghost[0]), "handed to the dead waiter");
    let blocked: i64 = conn.pttl("lock:dead").await.unwrap();
    let start = Instant::now();
    let got = other.acquire("dead", opts().wait(ms(5_000))).await;
    let took = start.elapsed();
    figure(
        "a_dead_fixed_lease_waiter_blocks_the_lock_only_for_the_grant_lease",
        format!(
            "dead waiter (ttl 8 s, watchdog off) handed the lock for {blocked} ms; another \
             client got it after {took:?}: {}",
            if got.is_ok() { "acquired" } else { "timed out" }
        ),
    );
    assert!(blocked <= 2_000, "handed over with a {blocked} ms lease");
    let got = got.expect("acquired once the grant lease ran out");
    assert!(took < ms(3_000), "blocked for {took:?}");
    got.release().await.unwrap();
}

mod grant_deadline {
    //! A grant's local deadline against the server-side expiry, with the grant
    //! message held up in the network and the waiter's latest attempt long before the release.

    use super::support;

    use lockrt::testing::{Direction, FaultProxy, RedisServer};
    use lockrt::{LockOptions, Locker};
    use support::{ms, until_queued, until_subscribed};
    use tokio::time::Instant;

    async fn case(message_delay_ms: u64, release_after_ms: u64) -> (i64, i64) {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let h = Locker::connect(&server.url()).await.unwrap();
        let w = Locker::connect(&proxy.url()).await.unwrap();
        let mut conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let held = h
            .acquire("g", LockOptions::new().ttl(ms(30_000)))
            .await
            .unwrap();
        let w2 = w.clone();
        let waiter = tokio::spawn(async move {
            w2.acquire("g", LockOptions::new().ttl(ms(3_000)).wait(ms(20_000)))
                .await
        });
        until_queued(&mut conn, "g", 1).await;
        until_subscribed(&mut conn, "g", 1).await;
        tokio::time::sleep(ms(release_after_ms)).await;
        proxy.delay(Direction::ToClient, ms(message_delay_ms));
        held.release().await.unwrap();
        let released = Instant::now();
        let guard = waiter.await.unwrap().expect("granted");
        let got_after = released.elapsed();
        // Nothing renews it from now on.
        proxy.blackhole();
        let pttl: i64 = redis::cmd("PTTL")
            .arg("lock:g")
            .query_async(&mut conn)
            .await
            .unwrap();
        let expiry = Instant::now() + ms(pttl.max(0) as u64);
        let ttl_guard = tokio::time::timeout(ms(10_000), guard.lost()).await;
        assert!(ttl_guard.is_ok(), "never lost");
        let lost_at = Instant::now();
        // The server expiry, observed.
        loop {
            let n: i64 = redis::cmd("EXISTS")
                .arg("lock:g")
                .query_async(&mut conn)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            tokio::time::sleep(ms(2)).await;
        }
        let gone_at = Instant::now();
        let margin_observed = gone_at.saturating_duration_since(lost_at).as_millis() as i64
            - lost_at.saturating_duration_since(gone_at).as_millis() as i64;
        let margin_pttl = expiry.saturating_duration_since(lost_at).as_millis() as i64
            - lost_at.saturating_duration_since(expiry).as_millis() as i64;
        println!(
            "FIGURE message delay {message_delay_ms} ms, release {release_after_ms} ms after queueing: guard after {got_after:?}; PTTL then {pttl} ms; declared lost {margin_observed} ms before the key vanished ({margin_pttl} ms before PTTL's expiry)"
        );
        drop(guard);
        (margin_observed, margin_pttl)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "slow (12 s): cargo test --test semantics grant_lease::grant_deadline -- --ignored"]
    async fn chaos_a_delayed_grant_is_never_counted_past_the_server_expiry() {
        for (delay, after) in [(0, 900), (400, 900), (800, 950), (300, 100)] {
            let (observed, by_pttl) = case(delay, after).await;
            assert!(
                observed >= 0 && by_pttl >= -5,
                "declared lost after the server expired the lock: {observed} ms / {by_pttl} ms"
            );
        }
    }
}
