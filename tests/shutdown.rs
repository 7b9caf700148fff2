//! `Locker::shutdown`: no new locks, waiters end, every held lock released at once, so another
//! instance takes over within a hand-off, not a ttl.

mod support;

use lockrt::LockError;
use support::{Fx, ms, opts};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_instance_takes_over_within_a_hand_off_after_shutdown() {
    for fx in [Fx::redis(), Fx::memory()] {
        let first = fx.locker().await;
        let second = fx.locker().await;
        let long = opts().ttl(ms(30_000));
        // The first instance holds a job lock through a guard and another through `run`.
        let guard = first.acquire("job", long).await.unwrap();
        let f = first.clone();
        let section = tokio::spawn(async move {
            f.run("report", long, async {
                tokio::time::sleep(ms(30_000)).await;
            })
            .await
        });
        let s = second.clone();
        let waiter = tokio::spawn(async move {
            let g = s.acquire("job", long.wait(ms(10_000))).await?;
            let at = Instant::now();
            g.release().await?;
            Ok::<_, LockError>(at)
        });
        // A waiter inside the first instance, for a lock the second holds.
        let other = second.acquire("elsewhere", long).await.unwrap();
        let f = first.clone();
        let local_waiter =
            tokio::spawn(async move { f.acquire("elsewhere", long.wait(ms(10_000))).await });
        support::settle(
            async || first.stats().waiting >= 1,
            "first instance's waiter",
        )
        .await;
        support::settle(async || fx.pttl("report").await.is_some(), "section holds").await;

        let start = Instant::now();
        first.shutdown().await;
        let shut_in = start.elapsed();
        let took_over = waiter.await.unwrap().unwrap() - start;
        println!(
            "FIGURE shutdown_takeover ({}): shutdown took {shut_in:?}, second instance held the lock {took_over:?} after shutdown began (ttl 30 s)",
            if fx.is_redis() { "redis" } else { "memory" }
        );
        assert!(took_over < ms(1_000), "took over after {took_over:?}");
        assert!(shut_in < ms(2_000), "shutdown took {shut_in:?}");
        assert!(
            section.await.unwrap().unwrap_err().is_lost(),
            "section told it lost"
        );
        assert!(matches!(
            local_waiter.await.unwrap(),
            Err(LockError::ShutDown)
        ));
        assert!(guard.is_lost());
        guard.release().await.expect("already released by shutdown");
        assert!(fx.pttl("report").await.is_none());
        assert!(matches!(
            first.acquire("new", opts()).await,
            Err(LockError::ShutDown)
        ));
        assert!(matches!(
            first.try_acquire("new", opts()).await,
            Err(LockError::ShutDown)
        ));
        other.release().await.unwrap();
    }
}

/// An acquisition that gave up leaves its queue place to a background clean-up (a release in
/// that instant may even hand it the lock). `shutdown` lets that clean-up finish, so a process
/// that shuts its locker down before exiting leaves nothing behind. Checked with a blocking
/// connection, during which the current-thread runtime runs nothing else.
#[tokio::test(flavor = "current_thread")]
async fn shutdown_finishes_the_clean_up_of_a_waiter_that_gave_up() {
    let fx = Fx::redis();
    let Fx::Redis(server) = &fx else {
        unreachable!()
    };
    let mut sync = server
        .client()
        .get_connection()
        .expect("blocking connection");
    let queued = |c: &mut redis::Connection| -> usize {
        redis::cmd("ZCARD")
            .arg("{lock:gave-up}:q")
            .query(c)
            .expect("ZCARD")
    };
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let _held = holder.acquire("gave-up", opts()).await.unwrap();
    let err = waiter
        .acquire("gave-up", opts().wait(ms(200)))
        .await
        .expect_err("the lock is held");
    assert!(err.is_timeout(), "{err:?}");
    // The clean-up has not run yet: nothing else ran since the acquire returned.
    assert_eq!(queued(&mut sync), 1, "the waiter's queue place");
    waiter.shutdown().await;
    assert_eq!(
        queued(&mut sync),
        0,
        "shutdown returned before the clean-up ran"
    );
}
