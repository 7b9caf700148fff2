//! The cross-process waiter queue stays first-come first-served however many dead
//! registrations (waiters of crashed processes, whose registration lapsed) lie ahead of a live
//! waiter: a newcomer never takes a lock promised to the live waiter behind them.

mod support;

use lockrt::testing::{Direction, FaultProxy};
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use support::{Fx, ms, opts, until_queued, until_subscribed};

/// Prints a measured figure: `FIGURE <case>: <text>`.
fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// Registrations of waiters that died before `n` live ones arrived: queued first, lapsed.
async fn dead_registrations(conn: &mut redis::aio::MultiplexedConnection, key: &str, n: usize) {
    let now: (u64, u64) = redis::cmd("TIME").query_async(conn).await.unwrap();
    let lapsed_ms = now.0 * 1000 - 10_000;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let token = format!("{i:032x}");
        pipe.zadd(format!("{{lock:{key}}}:q"), &token, i + 1)
            .ignore()
            .hset(
                format!("{{lock:{key}}}:w"),
                &token,
                format!("{lapsed_ms}:2000"),
            )
            .ignore();
    }
    let () = pipe.query_async(conn).await.unwrap();
}

/// 300 dead registrations, then a live waiter (a locker whose requests are slowed, so the
/// newcomer is first to try after the release): the newcomer's `try_acquire` is refused and
/// the live waiter gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_jump_a_waiter_behind_many_dead_registrations() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let holder = fx.locker().await;
    let newcomer = fx.locker().await;
    let waiter = Locker::builder()
        .url(proxy.url())
        .build()
        .await
        .expect("locker behind the proxy");
    let mut conn = fx.conn().await;
    let held = holder.acquire("fifo", opts()).await.unwrap();
    let first = held.fence();
    dead_registrations(&mut conn, "fifo", 300).await;
    let w = waiter.clone();
    let waited = tokio::spawn(async move { w.acquire("fifo", opts().wait(ms(10_000))).await });
    until_queued(&mut conn, "fifo", 301).await;
    until_subscribed(&mut conn, "fifo", 1).await;
    // The live waiter's next request reaches Redis 300 ms after it is sent (its
    // registration lives 2 s).
    proxy.delay(Direction::ToServer, ms(300));
    held.release().await.unwrap();
    let jumped = newcomer
        .try_acquire("fifo", LockOptions::new())
        .await
        .unwrap();
    let jumped_fence = jumped.as_ref().map(|g| g.fence());
    drop(jumped);
    proxy.delay(Direction::ToServer, ms(0));
    let got = waited.await.unwrap();
    figure(
        "a_newcomer_does_not_jump_a_waiter_behind_many_dead_registrations",
        format!(
            "300 dead registrations ahead of a live waiter: the newcomer's try_acquire {}; \
             the waiter {}",
            match jumped_fence {
                Some(f) => format!("took the lock (fence {f})"),
                None => "was refused".to_owned(),
            },
            match &got {
                Ok(g) => format!("got fence {}", g.fence()),
                Err(e) => format!("failed: {e}"),
            }
        ),
    );
    assert_eq!(jumped_fence, None, "the newcomer jumped the queue");
    let got = got.expect("the waiter gets the lock");
    assert!(got.fence() > first);
    got.release().await.unwrap();
    let left: usize = conn.zcard("{lock:fifo}:q").await.unwrap();
    assert_eq!(left, 0, "dead registrations left behind");
}
