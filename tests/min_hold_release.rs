//! A release that keeps `min_hold` (the lock stays taken, owner-checked, to the end of
//! min_hold) whose reply is lost: the first try landed and left its proof, so the retry is a
//! success even when the shortened lease ended before it, not a loss nobody caused.

mod support;

use lockrt::testing::{FaultProxy, RedisServer};
use lockrt::{LockOptions, Locker};
use support::{ms, until_listening_for_revocations};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_min_hold_release_with_a_lost_reply_is_not_a_loss() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("proxy");
    let a = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(500))
        .build()
        .await
        .expect("locker");
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    // Loads the renewal script (a min_hold release is a renewal) on the server.
    a.acquire("warm", LockOptions::new().min_hold(ms(50)))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let guard = a
        .acquire("kept", LockOptions::new().ttl(ms(10_000)).min_hold(ms(300)))
        .await
        .expect("acquired");
    until_listening_for_revocations(&mut conn, 1).await;
    tokio::time::sleep(ms(100)).await;
    let before = proxy.counters().replies_dropped;
    proxy.drop_replies(1);
    let t0 = Instant::now();
    let res = guard.release().await;
    let dropped = proxy.counters().replies_dropped - before;
    let fence_holders: Option<String> = redis::cmd("GET")
        .arg("lock:kept")
        .query_async(&mut conn)
        .await
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL")
        .arg("lock:kept")
        .query_async(&mut conn)
        .await
        .unwrap();
    println!("PTTL now {pttl}");
    println!(
        "FIGURE release with min_hold, {dropped} reply dropped: {res:?} after {:?}; lock now {fence_holders:?} (nobody else ever held it)",
        t0.elapsed()
    );
    assert!(
        res.is_ok(),
        "a min_hold release whose reply was lost reported {res:?}; no other owner existed"
    );
}
