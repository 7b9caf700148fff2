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

/// A blocking connection to the test's server: while it is used, a current-thread runtime runs
/// nothing else, so what it reads is what `shutdown` left when it returned.
fn blocking(fx: &Fx) -> redis::Connection {
    let Fx::Redis(server) = fx else {
        unreachable!("needs Redis")
    };
    server
        .client()
        .get_connection()
        .expect("blocking connection")
}

fn exists(c: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(c)
        .expect("EXISTS")
        == 1
}

fn queue_len(c: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("ZCARD")
        .arg(format!("{{lock:{key}}}:q"))
        .query(c)
        .expect("ZCARD")
}

/// Waits that `shutdown` itself cancels leave no queue place behind, and the next release
/// hands the lock to nobody from this locker: checked right after `shutdown` returns, on both
/// runtime flavours.
async fn cancelled_waits_are_cleaned_up() {
    let fx = Fx::redis();
    let mut sync = blocking(&fx);
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let held = holder.acquire("busy", opts()).await.unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move { w.acquire("busy", opts().wait(ms(10_000))).await });
    support::settle(
        async || support::queued(&mut fx.conn().await, "busy").await == 1,
        "the waiter is queued in Redis",
    )
    .await;
    waiter.shutdown().await;
    let left = queue_len(&mut sync, "busy");
    assert_eq!(
        left, 0,
        "shutdown returned with the cancelled wait still queued"
    );
    assert!(matches!(waiting.await.unwrap(), Err(LockError::ShutDown)));
    held.release().await.unwrap();
    assert!(
        !exists(&mut sync, "lock:busy"),
        "the release handed the lock to the departed waiter"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn cancelled_waits_are_cleaned_up_current_thread() {
    cancelled_waits_are_cleaned_up().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waits_are_cleaned_up_multi_thread() {
    for _ in 0..5 {
        cancelled_waits_are_cleaned_up().await;
    }
}

/// A lock released by `shutdown` keeps `min_hold` like any release (the README's once-per-tick
/// recipe): another instance cannot take it before then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_keeps_min_hold() {
    for fx in [Fx::redis(), Fx::memory()] {
        let first = fx.locker().await;
        let second = fx.locker().await;
        let job = opts().ttl(ms(30_000)).min_hold(ms(5_000));
        let guard = first.acquire("tick", job).await.unwrap();
        first.shutdown().await;
        assert!(
            second.try_acquire("tick", opts()).await.unwrap().is_none(),
            "another instance ran the job again right after shutdown (min_hold 5 s)"
        );
        let left = fx.pttl("tick").await.expect("kept until min_hold");
        assert!(left <= ms(5_000) && left > ms(3_000), "kept for {left:?}");
        guard.release().await.expect("released by shutdown");
    }
}

/// A lock lost before `shutdown` (another owner holds it now) is reported lost by the guard's
/// release afterwards, not released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_after_shutdown_reports_a_lock_lost_before_it() {
    let fx = Fx::redis();
    let first = fx.locker().await;
    let second = fx.locker().await;
    let guard = first
        .acquire("taken", opts().ttl(ms(30_000)))
        .await
        .unwrap();
    let _: () = redis::cmd("DEL")
        .arg("lock:taken")
        .query_async(&mut fx.conn().await)
        .await
        .unwrap();
    let other = second
        .acquire("taken", opts().ttl(ms(30_000)))
        .await
        .unwrap();
    first.shutdown().await;
    let res = guard.release().await;
    assert!(
        matches!(res, Err(LockError::Lost { .. })),
        "another owner holds the lock: {res:?}"
    );
    assert!(!other.is_lost());
    other
        .release()
        .await
        .expect("the other owner's lock was left alone");
}

/// A section dropped (a job cancelled by `select!` on the stop signal) releases in the
/// background; `shutdown` waits for that release, so the process may exit at once after it.
#[tokio::test(flavor = "current_thread")]
async fn shutdown_waits_for_releases_of_dropped_sections() {
    let fx = Fx::redis();
    let mut sync = blocking(&fx);
    let locker = fx.locker().await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (started, running) = tokio::sync::oneshot::channel::<()>();
    let mut job = Box::pin(locker.run("nightly", opts().ttl(ms(10_000)), async move {
        let _ = started.send(());
        std::future::pending::<()>().await
    }));
    tokio::select! {
        _ = &mut job => unreachable!("the job never ends by itself"),
        _ = async {
            running.await.unwrap();
            stop.send(()).unwrap();
            stopped.await.ok();
        } => {}
    }
    // Cancelled: the section's guard releases in the background from here.
    drop(job);
    locker.shutdown().await;
    assert!(
        !exists(&mut sync, "lock:nightly"),
        "shutdown returned before the dropped section's release ran"
    );
}

/// Acquisitions that complete on another thread while `shutdown` runs never leave a lease that
/// a fresh watchdog renews forever: once shutdown has returned and the leases have had time to
/// run out, nothing of this locker is held, even with every guard it handed out kept alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_racing_shutdown_leave_nothing_renewed() {
    let fx = Fx::redis();
    let ttl = ms(400);
    let mut kept = Vec::new();
    for round in 0..10 {
        let locker = fx.locker().await;
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let l = locker.clone();
                let key = format!("race:{round}:{i}");
                tokio::spawn(async move { l.acquire(&key, opts().ttl(ttl)).await })
            })
            .collect();
        // A different point of the acquisitions each round.
        for _ in 0..round {
            tokio::task::yield_now().await;
        }
        locker.shutdown().await;
        for t in tasks {
            if let Ok(g) = t.await.unwrap() {
                assert!(
                    g.is_lost(),
                    "a guard handed out by a shut-down locker is held"
                );
                kept.push(g);
            }
        }
    }
    // Not synchronisation: the time every lease this test took needs to run out.
    tokio::time::sleep(ttl * 3).await;
    let held: Vec<String> = redis::cmd("KEYS")
        .arg("lock:race:*")
        .query_async(&mut fx.conn().await)
        .await
        .unwrap();
    assert!(held.is_empty(), "still held after shutdown: {held:?}");
    drop(kept);
}
