//! An acquire request that reaches Redis only after its caller gave up, and after the
//! compensating release that caller sent on a fresh connection, must not take the lock (or a
//! queue place) for an owner that is gone.

mod support;

use lockrt::testing::{Direction, FaultProxy};
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use support::{Fx, calls_of, ms, opts};
use tokio::time::Instant;

/// Prints a measured figure: `FIGURE <case>: <text>`.
fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// The request is held 1.5 s in the network; the caller times out after 300 ms and its
/// compensating release, on a new connection, reaches Redis first. When the acquire lands
/// afterwards, the lock stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_landing_after_its_compensation_takes_nothing() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let late = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(300))
        .build()
        .await
        .expect("locker behind the proxy");
    let other = fx.locker().await;
    let mut conn = fx.conn().await;
    // Both scripts loaded on the server, so the late request runs when it lands.
    late.acquire("warm", opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = calls_of(&mut conn, "evalsha").await;

    proxy.delay(Direction::ToServer, ms(1_500));
    let start = Instant::now();
    let attempt = {
        let late = late.clone();
        tokio::spawn(async move {
            late.try_acquire("late", LockOptions::new().ttl(ms(10_000)))
                .await
        })
    };
    // The scenario's timing: the request is in the proxy's delay line within a few ms;
    // requests sent from now on (the compensation) pass at once.
    tokio::time::sleep(ms(100)).await;
    proxy.delay(Direction::ToServer, ms(0));
    let res = attempt.await.unwrap();
    assert!(res.is_err(), "the attempt timed out: {res:?}");
    // The compensating release, then the late acquire.
    let landed = support::settle(
        async || calls_of(&mut conn, "evalsha").await >= before + 2,
        "the late acquire never reached the server",
    );
    landed.await;
    let landed_after = start.elapsed();
    let left: i64 = conn.pttl("lock:late").await.unwrap();
    let queued: usize = conn.zcard("{lock:late}:q").await.unwrap();
    let taken = other.try_acquire("late", LockOptions::new()).await.unwrap();
    figure(
        "an_acquire_landing_after_its_compensation_takes_nothing",
        format!(
            "acquire delayed 1.5 s, caller gave up at 300 ms, compensation first: after the \
             late request landed ({landed_after:?}) the lock's PTTL was {left} ms, another \
             client's try_acquire {}",
            if taken.is_some() {
                "succeeded"
            } else {
                "was refused"
            }
        ),
    );
    assert!(left < 0, "an orphaned lock with {left} ms left");
    assert_eq!(queued, 0, "an orphaned queue place");
    assert!(taken.is_some());
}

/// The same against a held lock: the late request would queue its owner, whose registration
/// lives 2 s, and the holder's release would hand the lock to nobody for the grant lease. It
/// takes no queue place, and the release frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_acquire_against_a_held_lock_takes_no_queue_place() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let late = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(300))
        .build()
        .await
        .expect("locker behind the proxy");
    let holder = fx.locker().await;
    let mut conn = fx.conn().await;
    late.acquire("warm", opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = holder.acquire("busy", opts()).await.unwrap();
    let before = calls_of(&mut conn, "evalsha").await;

    proxy.delay(Direction::ToServer, ms(1_500));
    let attempt = {
        let late = late.clone();
        tokio::spawn(async move { late.acquire("busy", opts().wait(ms(200))).await })
    };
    // As above: only the first request is held up.
    tokio::time::sleep(ms(100)).await;
    proxy.delay(Direction::ToServer, ms(0));
    assert!(attempt.await.unwrap().is_err());
    support::settle(
        async || calls_of(&mut conn, "evalsha").await >= before + 2,
        "the late acquire never reached the server",
    )
    .await;
    let queued: usize = conn.zcard("{lock:busy}:q").await.unwrap();
    held.release().await.unwrap();
    let left: i64 = conn.pttl("lock:busy").await.unwrap();
    figure(
        "a_late_acquire_against_a_held_lock_takes_no_queue_place",
        format!(
            "acquire delayed 1.5 s behind its compensation, lock held: {queued} queue place(s) \
             after it landed; after the holder's release the lock's PTTL was {left} ms"
        ),
    );
    assert_eq!(queued, 0, "the late acquire queued a departed waiter");
    assert!(
        left < 0,
        "the release handed the lock to a departed waiter ({left} ms)"
    );
}
