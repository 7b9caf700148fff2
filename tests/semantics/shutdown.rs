//! `Locker::shutdown`: no new locks, waiters end, every held lock released at once, so another
//! instance takes over within a hand-off, not a ttl.

use crate::support;

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

mod shutdown_releases {
    //! `Locker::shutdown` and releases under way when it runs: it returns only once they are done,
    //! also when it is called twice or from inside a section it ends.

    use super::support;

    use lockrt::testing::{FaultProxy, RedisServer};
    use lockrt::{LockOptions, Locker};
    use support::ms;
    use tokio::time::Instant;

    fn pttl(server: &RedisServer, key: &str) -> i64 {
        let mut conn = server.client().get_connection().expect("connection");
        redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL")
    }

    /// A task awaits `guard.release()` (a foreground release, not a dropped guard) whose first try
    /// went out on a connection that went silent; it will be retried after the response timeout.
    /// The process then shuts the locker down and exits (`main` returns, the runtime goes).
    /// shutdown must not return before that release finished or timed out.
    #[test]
    fn shutdown_waits_for_a_foreground_release_under_way() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (returned_after, release_done_at_return) = rt.block_on(async {
            let locker = Locker::builder()
                .url(proxy.url())
                .response_timeout(ms(1_000))
                .build()
                .await
                .expect("locker");
            let guard = locker
                .acquire("job", LockOptions::new().ttl(ms(10_000)))
                .await
                .expect("acquired");
            let before = proxy.counters().discarded;
            // The command connection goes half-open: the release's first try vanishes.
            proxy.stall_commands();
            let release = tokio::spawn(async move { guard.release().await });
            proxy
                .wait_until(ms(5_000), |c| c.discarded > before)
                .await
                .expect("the release's first try reached the proxy");
            let t0 = Instant::now();
            locker.shutdown().await;
            (t0.elapsed(), release.is_finished())
        });
        // The process exits.
        drop(rt);
        let left = pttl(&server, "lock:job");
        println!(
            "FIGURE shutdown returned after {returned_after:?} with the foreground release finished: {release_done_at_return}; after exit lock:job PTTL {left} ms"
        );
        assert!(
            left < 0,
            "shutdown returned after {returned_after:?} while a release was under way; the lock stayed (PTTL {left} ms)"
        );
    }

    /// The same with a `run` section whose body has just returned: its release is awaited inside
    /// `run` (not tracked) when shutdown runs.
    #[test]
    fn shutdown_waits_for_a_sections_release_under_way() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (returned_after, section_done) = rt.block_on(async {
            let locker = Locker::builder()
                .url(proxy.url())
                .response_timeout(ms(1_000))
                .build()
                .await
                .expect("locker");
            let (go, went) = tokio::sync::oneshot::channel::<()>();
            let (inside_tx, inside) = tokio::sync::oneshot::channel::<()>();
            let l = locker.clone();
            let section = tokio::spawn(async move {
                l.run("job", LockOptions::new().ttl(ms(10_000)), async move {
                    let _ = inside_tx.send(());
                    let _ = went.await;
                })
                .await
            });
            inside.await.unwrap();
            let before = proxy.counters().discarded;
            proxy.stall_commands();
            go.send(()).unwrap();
            proxy
                .wait_until(ms(5_000), |c| c.discarded > before)
                .await
                .expect("the section's release reached the proxy");
            let t0 = Instant::now();
            locker.shutdown().await;
            (t0.elapsed(), section.is_finished())
        });
        drop(rt);
        let left = pttl(&server, "lock:job");
        println!(
            "FIGURE shutdown returned after {returned_after:?} with the section finished: {section_done}; after exit lock:job PTTL {left} ms"
        );
        assert!(
            left < 0,
            "shutdown returned after {returned_after:?} while a section's release was under way; the lock stayed (PTTL {left} ms)"
        );
    }

    /// Control: the same with the guard dropped (its release runs in the background, tracked):
    /// shutdown waits for the retry and the lock is gone when the process exits.
    #[test]
    fn control_shutdown_waits_for_a_dropped_guards_release() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let returned_after = rt.block_on(async {
            let locker = Locker::builder()
                .url(proxy.url())
                .response_timeout(ms(1_000))
                .build()
                .await
                .expect("locker");
            let guard = locker
                .acquire("job", LockOptions::new().ttl(ms(10_000)))
                .await
                .expect("acquired");
            let before = proxy.counters().discarded;
            proxy.stall_commands();
            drop(guard);
            proxy
                .wait_until(ms(5_000), |c| c.discarded > before)
                .await
                .expect("the release's first try reached the proxy");
            let t0 = Instant::now();
            locker.shutdown().await;
            t0.elapsed()
        });
        drop(rt);
        let left = pttl(&server, "lock:job");
        println!(
            "FIGURE control: shutdown returned after {returned_after:?}; after exit lock:job PTTL {left} ms"
        );
        assert!(left < 0, "PTTL {left}");
    }

    /// `shutdown()` awaited inside a section of the same locker (a job that decides the service
    /// must stop): shutdown's first step marks the section's own lease lost, `run` cancels the
    /// body (`on_lost = "cancel"`), which drops the shutdown future half-way: the releases of the
    /// other locks it drained are dropped with it. Another task's lock ("other") stays for its ttl
    /// once the process exits.
    #[test]
    fn shutdown_called_inside_a_section_releases_every_lock() {
        let server = RedisServer::start().expect("redis-server");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (outcome, shutdown_completed) = rt.block_on(async {
            let locker = Locker::connect(&server.url()).await.expect("locker");
            let other = locker
                .acquire("other", LockOptions::new().ttl(ms(10_000)))
                .await
                .expect("acquired");
            // The holder of "other" keeps its guard until the process exits.
            let keeper = tokio::spawn(async move {
                let _other = other;
                std::future::pending::<()>().await;
            });
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let l = locker.clone();
            let d = done.clone();
            let outcome = locker
                .run("job", LockOptions::new().ttl(ms(10_000)), async move {
                    l.shutdown().await;
                    d.store(true, std::sync::atomic::Ordering::SeqCst);
                })
                .await;
            drop(keeper);
            (outcome, done.load(std::sync::atomic::Ordering::SeqCst))
        });
        drop(rt);
        let left = pttl(&server, "lock:other");
        let job = pttl(&server, "lock:job");
        println!(
            "FIGURE shutdown inside a section: run -> {outcome:?}, shutdown completed: {shutdown_completed}; after exit lock:other PTTL {left} ms, lock:job PTTL {job} ms"
        );
        assert!(
            left < 0,
            "shutdown was cut short inside the section; lock:other stayed (PTTL {left} ms)"
        );
    }

    /// Two callers of `shutdown()` (a signal handler and the end of `main`): the second finds the
    /// monitors drained by the first and returns at once, while the first's release (its first try
    /// lost on a silent connection) is still under way; `main` exits after the second.
    #[test]
    fn a_second_shutdown_waits_for_the_first_ones_releases() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let returned_after = rt.block_on(async {
            let locker = Locker::builder()
                .url(proxy.url())
                .response_timeout(ms(1_000))
                .build()
                .await
                .expect("locker");
            let guard = locker
                .acquire("job", LockOptions::new().ttl(ms(10_000)))
                .await
                .expect("acquired");
            let before = proxy.counters().discarded;
            proxy.stall_commands();
            let first = tokio::spawn({
                let l = locker.clone();
                async move { l.shutdown().await }
            });
            proxy
                .wait_until(ms(5_000), |c| c.discarded > before)
                .await
                .expect("the first shutdown's release reached the proxy");
            let t0 = Instant::now();
            locker.shutdown().await;
            let took = t0.elapsed();
            drop(first);
            drop(guard);
            took
        });
        drop(rt);
        let left = pttl(&server, "lock:job");
        println!(
            "FIGURE second shutdown returned after {returned_after:?}; after exit lock:job PTTL {left} ms"
        );
        assert!(
            left < 0,
            "the second shutdown returned after {returned_after:?}; lock stayed (PTTL {left} ms)"
        );
    }
}
