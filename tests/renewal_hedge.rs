//! A renewal whose reply is lost on a live connection (dropped by a middlebox while the TCP
//! connection stays up) is hedged: unanswered for half of the lease left, it goes out again at
//! once on a fresh connection, so one lost reply never costs the lease, whatever the response
//! timeout. Against a real redis-server behind the fault proxy.

mod support;

use std::time::Duration;

use lockrt::Locker;
use lockrt::testing::{FaultProxy, RedisServer};
use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

/// Waits (at most `within`) until the locker's revoke subscription is in place, so that its
/// `SUBSCRIBE` confirmation is not the reply the proxy drops; a locker that subscribes
/// nothing while it holds just spends `within`.
async fn subscriptions_settled(conn: &mut redis::aio::MultiplexedConnection, within: Duration) {
    let start = Instant::now();
    while start.elapsed() < within {
        if support::numsub(conn, "{lock:}:revoke").await >= 1 {
            return;
        }
        tokio::time::sleep(ms(5)).await;
    }
}

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
    let acquired = Instant::now();
    let g = locker.acquire("hedged", opts().ttl(ttl)).await.unwrap();
    subscriptions_settled(&mut direct, ms(150)).await;
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
    subscriptions_settled(&mut direct, ms(150)).await;
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
