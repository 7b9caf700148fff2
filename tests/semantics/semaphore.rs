//! Semaphores with leased permits (`LockOptions::permits(n)`): at most n holders at once
//! across lockers, FIFO hand-over of a released permit, a crashed holder's permit back when
//! its lease ends, clear errors for a key used as another kind or with another n; on Redis,
//! on a Cluster and in memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockKind, LockOptions, Locker};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn slots(n: u32) -> LockOptions {
    LockOptions::new().permits(n).ttl(ms(5_000)).wait(ms(5_000))
}

fn conflict(res: Result<Option<lockrt::LockGuard>, LockError>) -> String {
    match res {
        Err(LockError::KindConflict { reason, .. }) => reason,
        other => panic!("expected a kind conflict, got {other:?}"),
    }
}

/// n permits and no more; each holder its own fence; inspection lists them; a key in use as
/// a semaphore is refused as a lock, a read lock or a semaphore of another size, and the
/// other way round.
async fn limit_and_conflicts(a: Locker, b: Locker, key: &str) {
    let mut held = Vec::new();
    for locker in [&a, &b, &a] {
        held.push(locker.acquire(key, slots(3)).await.unwrap());
    }
    let fences: Vec<u64> = held.iter().map(|g| g.fence()).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(b.try_acquire(key, slots(3)).await.unwrap().is_none());
    let info = a.lock_info(key).await.unwrap().expect("held");
    assert_eq!((info.kind, info.shared.len()), (LockKind::Permits(3), 3));
    let reason = conflict(b.try_acquire(key, slots(5)).await);
    assert!(reason.contains("semaphore of 3 permits"), "{reason}");
    conflict(b.try_acquire(key, LockOptions::new()).await);
    conflict(b.try_acquire(key, LockOptions::new().read()).await);
    for g in held {
        g.release().await.unwrap();
    }
    assert!(
        a.lock_info(key).await.unwrap().is_none(),
        "all permits back"
    );
    let lock = a.acquire(key, LockOptions::new()).await.unwrap();
    let reason = conflict(b.try_acquire(key, slots(3)).await);
    assert!(reason.contains("exclusive"), "{reason}");
    lock.release().await.unwrap();
    let err = a.acquire(key, slots(0)).await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A released permit goes to the longest waiter; a holder that stops renewing and never
/// releases (as a crashed process) gives its permit back when its lease ends.
async fn handover_and_crash(a: Locker, b: Locker, key: &str) {
    let first = a.acquire(key, slots(1)).await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.to_owned());
        tokio::spawn(async move { b.acquire(&key, slots(1)).await })
    };
    let end = Instant::now() + ms(5_000);
    while a.lock_info(key).await.unwrap().map_or(0, |i| i.waiters) == 0 {
        assert!(Instant::now() < end, "the waiter never queued");
        tokio::time::sleep(ms(10)).await;
    }
    first.release().await.unwrap();
    let second = waiter.await.unwrap().expect("handed over");
    second.release().await.unwrap();

    let crashed = a
        .acquire(key, slots(1).watchdog(false).ttl(ms(300)))
        .await
        .unwrap();
    std::mem::forget(crashed);
    let started = Instant::now();
    let after = b
        .acquire(key, slots(1))
        .await
        .expect("the permit comes back");
    assert!(started.elapsed() >= ms(200), "not before the lease ended");
    after.release().await.unwrap();
}

/// Eight callers on two lockers take a permit of 3 over and over: never more than 3 inside at
/// once, and 3 at once at some point (the permits are used, not serialised).
async fn never_more_than_n(a: Locker, b: Locker, key: &str) {
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let locker = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (inside, most, key) = (inside.clone(), most.clone(), key.to_owned());
        tasks.spawn(async move {
            for _ in 0..25 {
                let g = locker.acquire(&key, slots(3)).await.expect("a permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= 3, "{now} holders of 3 permits");
                tokio::time::sleep(ms(3)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
}

/// A key with no holder is still in use by its queue: while a semaphore's waiter is queued
/// (here one whose thread stalls, so it does not retry), a caller asking for another number of
/// permits, the lock or a read share is refused, never queued behind it and granted a permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_kind_is_refused_while_a_waiter_is_queued() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let key = "export:mixed";
    let a = Locker::builder().url(&url).build().await.unwrap();
    for _ in 0..2 {
        let crashed = a.acquire(key, slots(2).watchdog(false).ttl(ms(300)));
        std::mem::forget(crashed.await.unwrap());
    }
    let stalled = std::thread::spawn({
        let url = url.clone();
        move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let b = Locker::builder().url(url).build().await.unwrap();
                let waiter = tokio::spawn(async move {
                    let g = b.acquire(key, slots(2).wait(ms(10_000))).await;
                    g.expect("the queued waiter gets its permit")
                        .release()
                        .await
                });
                tokio::time::sleep(ms(100)).await;
                // The stall: queued, and no retry until it ends.
                std::thread::sleep(ms(1_200));
                waiter.await.unwrap().unwrap();
            });
        }
    });
    tokio::time::sleep(ms(600)).await;
    let c = Locker::builder().url(&url).build().await.unwrap();
    let asked = [
        slots(1),
        LockOptions::new().wait(ms(5_000)),
        slots(2).read(),
    ];
    for opts in asked {
        let res = c.acquire(key, opts).await;
        assert!(
            matches!(res, Err(LockError::KindConflict { .. })),
            "{:?} got {:?}",
            opts.get_kind(),
            res.map(|g| g.fence())
        );
    }
    stalled.join().unwrap();
}

/// Runs `f` on a thread of its own with a one-thread runtime: a process of its own, whose
/// thread the test can stall.
fn on_own_thread<F: Future<Output = ()> + Send + 'static>(f: F) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(f);
    })
}

/// The kind of a key with no holder comes from its longest live waiter even behind lapsed
/// registrations: 16 waiters of a stalled process lapse in front of a live writer, and a
/// semaphore's caller must still be refused until the writer has the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_writer_behind_lapsed_waiters_still_decides_the_kind() {
    let redis = RedisServer::start().expect("redis-server");
    let url = redis.url();
    let key = "export:lapsed";
    let a = Locker::builder().url(&url).build().await.unwrap();
    let crashed = a.acquire(key, LockOptions::new().ttl(ms(600)).watchdog(false));
    std::mem::forget(crashed.await.unwrap());
    let stalled = on_own_thread({
        let url = url.clone();
        async move {
            // 16 lockers: a locker's own callers queue in it, only its first in Redis.
            for _ in 0..16 {
                let l = Locker::builder().url(&url).build().await.unwrap();
                tokio::spawn(async move { l.acquire(key, LockOptions::new()).await.map(drop) });
            }
            tokio::time::sleep(ms(150)).await;
            // Queued, then no refresh: the 16 registrations lapse about 2 s after.
            std::thread::sleep(ms(4_000));
        }
    });
    tokio::time::sleep(ms(250)).await;
    let w = Locker::builder().url(&url).build().await.unwrap();
    let writer =
        tokio::spawn(async move { w.acquire(key, LockOptions::new().wait(ms(10_000))).await });
    let s = Locker::builder().url(&url).build().await.unwrap();
    let started = Instant::now();
    while !writer.is_finished() && started.elapsed() < ms(6_000) {
        let res = s.try_acquire(key, slots(3)).await;
        assert!(
            matches!(res, Err(LockError::KindConflict { .. })),
            "a permit caller got {:?} ahead of the live writer",
            res.map(|g| g.map(|g| g.fence()))
        );
        tokio::time::sleep(ms(20)).await;
    }
    let held = writer
        .await
        .unwrap()
        .expect("the writer, first live in line");
    held.release().await.unwrap();
    stalled.join().unwrap();
}

/// In memory too: a writer of a peer queued first and not polled when the holder releases is
/// not passed by a semaphore's caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_queued_writer_decides_the_kind() {
    let m = Locker::in_memory();
    let (p, w) = (m.in_memory_peer().unwrap(), m.in_memory_peer().unwrap());
    let key = "export:mem";
    let g = m.acquire(key, LockOptions::new()).await.unwrap();
    let writer = on_own_thread(async move {
        let h =
            tokio::spawn(async move { w.acquire(key, LockOptions::new().wait(ms(3_000))).await });
        tokio::time::sleep(ms(100)).await;
        // Busy: queued, but not polled when the lock is released.
        std::thread::sleep(ms(300));
        h.await
            .unwrap()
            .expect("the queued writer")
            .release()
            .await
            .unwrap();
    });
    tokio::time::sleep(ms(200)).await;
    g.release().await.unwrap();
    let res = p.try_acquire(key, slots(3)).await;
    assert!(
        matches!(res, Err(LockError::KindConflict { .. })),
        "{:?}",
        res.map(|g| g.is_some())
    );
    writer.join().unwrap();
}

async fn all(a: Locker, b: Locker) {
    limit_and_conflicts(a.clone(), b.clone(), "export:1").await;
    handover_and_crash(a.clone(), b.clone(), "export:2").await;
    never_more_than_n(a, b, "export:3").await;
}

on_every_topology!(all);
