//! `Locker::shutdown` and releases under way when it runs: it returns only once they are done,
//! also when it is called twice or from inside a section it ends.

mod support;

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
