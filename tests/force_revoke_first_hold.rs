//! A forced unlock right after a locker that held nothing took a lock: the revoke channel is
//! subscribed in the background when it starts holding, so a revoke published before that
//! SUBSCRIBE reached Redis is heard by nobody. Every subscription (the first too) is followed by
//! an owner-checked renewal of the held leases, so the holder learns of it within milliseconds,
//! not at its next renewal.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lockrt::testing::{Direction, FaultProxy, RedisServer};
use lockrt::{LockOptions, Locker};
use support::{ms, opts};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_right_after_the_first_hold_is_heard_at_once() {
    case(40, 5).await;
}

/// The same on plain loopback, forced at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_right_after_the_first_hold_loopback() {
    case(0, 0).await;
}

async fn case(latency: u64, after: u64) {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("proxy");
    // A holder 40 ms away from Redis (requests arrive 40 ms late): a cross-zone link.
    let holder = Locker::connect(&proxy.url()).await.unwrap();
    let operator = Locker::connect(&server.url()).await.unwrap();
    let waiting = Locker::connect(&server.url()).await.unwrap();
    proxy.delay(Direction::ToServer, ms(latency));
    let ttl = ms(6_000);
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let h = holder.clone();
    let section = tokio::spawn(async move {
        let r = h
            .run("job", opts().ttl(ttl), async move {
                let _ = tx.send(Instant::now());
                tokio::time::sleep(ms(4_000)).await;
                done.store(true, Ordering::SeqCst);
            })
            .await;
        (Instant::now(), r)
    });
    let entered = rx.await.unwrap();
    // The operator force-unlocks 5 ms into the section; a waiter takes over.
    tokio::time::sleep(ms(after)).await;
    let w = waiting.clone();
    let forced = Instant::now();
    assert!(operator.force_unlock("job").await.unwrap(), "it was held");
    let taken = w
        .acquire("job", LockOptions::new().ttl(ttl).wait(ms(1_000)))
        .await
        .expect("the lock is free after the forced unlock");
    let taken_at = Instant::now();
    let (ended, res) = section.await.unwrap();
    let overlap = ended.saturating_duration_since(taken_at);
    println!(
        "FIGURE force_revoke_first_hold: force_unlock {:?} after the section began (holder held nothing before; \
         requests {latency} ms to Redis): section ended {:?} after the forced unlock (finished: {}, {:?}); \
         overlapped the new holder by {overlap:?}",
        forced - entered,
        ended - forced,
        finished.load(Ordering::SeqCst),
        res.as_ref().map(|_| ()).map_err(|e| e.to_string()),
    );
    drop(taken);
    assert!(
        ended - forced < ms(200),
        "the revoke was not heard: the section ran {:?} past the forced unlock",
        ended - forced
    );
}
