//! Read-write locks (`LockOptions::read()` / `write()`): readers share, a writer excludes
//! everyone, a queued writer holds back later readers, a writer's release hands the lock to
//! the run of readers queued at the head, reentrancy by kind, forced unlock and inspection;
//! on Redis, on a Cluster and in memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockKind, LockOptions, Locker};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn read() -> LockOptions {
    LockOptions::new().read().ttl(ms(5_000)).wait(ms(5_000))
}

fn write() -> LockOptions {
    LockOptions::new().write().ttl(ms(5_000)).wait(ms(5_000))
}

fn now_only(opts: LockOptions) -> LockOptions {
    opts.wait(Duration::ZERO)
}

/// Polls `check` every 10 ms for up to 5 s.
async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + ms(5_000);
    while !check().await {
        assert!(Instant::now() < end, "timed out waiting for: {what}");
        tokio::time::sleep(ms(10)).await;
    }
}

async fn waiters(locker: &Locker, key: &str) -> u64 {
    let info = locker.lock_info(key).await.unwrap();
    info.map_or(0, |i| i.waiters)
}

/// Readers share and exclude writers; a writer excludes readers; fences rise in order.
async fn readers_share_writers_exclude(a: Locker, b: Locker, key: &str) {
    let r1 = a.acquire(key, read()).await.unwrap();
    let first = r1.fence();
    let r2 = b
        .acquire(key, now_only(read()))
        .await
        .expect("readers share");
    assert!(r2.fence() > r1.fence());
    assert!(a.try_acquire(key, write()).await.unwrap().is_none());
    assert!(b.try_acquire(key, write()).await.unwrap().is_none());
    let info = a.lock_info(key).await.unwrap().expect("read-held");
    assert_eq!((info.kind, info.shared.len()), (LockKind::Read, 2));
    assert_eq!(info.fence, Some(r2.fence()));
    assert!(a.locks("*").await.unwrap().iter().any(|l| l.key == key));
    r1.release().await.unwrap();
    assert!(b.try_acquire(key, write()).await.unwrap().is_none());
    r2.release().await.unwrap();
    let w = b.acquire(key, now_only(write())).await.expect("free");
    assert!(w.fence() > first);
    assert!(a.try_acquire(key, read()).await.unwrap().is_none());
    let info = a.lock_info(key).await.unwrap().expect("write-held");
    assert_eq!((info.kind, info.shared.len()), (LockKind::Exclusive, 0));
    w.release().await.unwrap();
    assert!(a.lock_info(key).await.unwrap().is_none());
}

/// A writer's release hands the lock to every reader queued behind it at once, and a writer
/// queued behind readers stops a later reader from entering.
async fn queue_order(a: Locker, b: Locker, key: &str) {
    let w = a.acquire(key, write()).await.unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let (b, key, inside) = (b.clone(), key.to_owned(), inside.clone());
        readers.spawn(async move {
            let g = b.acquire(&key, read()).await.expect("granted");
            inside.fetch_add(1, Ordering::SeqCst);
            // All three hold at the same time: shared, not one after another.
            let end = Instant::now() + ms(5_000);
            while inside.load(Ordering::SeqCst) < 3 {
                assert!(Instant::now() < end, "the readers did not hold at once");
                tokio::time::sleep(ms(10)).await;
            }
            g.release().await.unwrap();
        });
    }
    eventually("three readers queued", async || waiters(&a, key).await >= 3).await;
    w.release().await.unwrap();
    while let Some(r) = readers.join_next().await {
        r.unwrap();
    }

    let r1 = a.acquire(key, read()).await.unwrap();
    let read_fence = r1.fence();
    let writer = {
        let (b, key) = (b.clone(), key.to_owned());
        tokio::spawn(async move { b.acquire(&key, write()).await })
    };
    eventually("the writer queued", async || waiters(&a, key).await >= 1).await;
    assert!(
        a.try_acquire(key, read()).await.unwrap().is_none(),
        "a reader must not pass a queued writer"
    );
    r1.release().await.unwrap();
    let w = writer.await.unwrap().expect("the writer after the reader");
    assert!(w.fence() > read_fence);
    w.release().await.unwrap();
}

/// Sections re-enter by kind: a read inside a write section is covered, a write inside a
/// read section fails at once; a guard's task may not read what it holds for writing.
async fn reentrancy_and_errors(a: Locker, key: &str) {
    let inner = a
        .run(key, write(), async {
            a.run(key, read(), async {
                lockrt::current_lock().map(|h| h.kind())
            })
            .await
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        inner,
        Some(LockKind::Exclusive),
        "covered by the write section"
    );
    let started = Instant::now();
    let upgrade = a
        .run(key, read(), async { a.run(key, write(), async {}).await })
        .await
        .unwrap();
    assert!(
        matches!(upgrade, Err(LockError::KindConflict { .. })),
        "{upgrade:?}"
    );
    assert!(started.elapsed() < ms(2_000), "refused, not waited for");
    let g = a.acquire(key, write()).await.unwrap();
    let err = a.acquire(key, read()).await.unwrap_err();
    assert!(matches!(err, LockError::HeldByThisTask { .. }), "{err:?}");
    g.release().await.unwrap();
    let r = a.acquire(key, read()).await.unwrap();
    let started = Instant::now();
    let err = a.acquire(key, write()).await.unwrap_err();
    assert!(matches!(err, LockError::HeldByThisTask { .. }), "{err:?}");
    assert!(started.elapsed() < ms(2_000), "refused, not waited for");
    // Another task is another owner: it waits for the reader as any writer does.
    let other = tokio::spawn({
        let (a, key) = (a.clone(), key.to_owned());
        async move { a.acquire(&key, write().wait(ms(50))).await.map(drop) }
    });
    assert!(other.await.unwrap().unwrap_err().is_timeout());
    r.release().await.unwrap();
    let err = a.acquire(key, read().min_hold(ms(100))).await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
}

/// A forced unlock of a read-held key revokes every reader.
async fn forced_unlock(a: Locker, b: Locker, key: &str) {
    let r1 = a.acquire(key, read()).await.unwrap();
    let r2 = b.acquire(key, read()).await.unwrap();
    assert!(a.force_unlock(key).await.unwrap());
    eventually("both readers lost", async || r1.is_lost() && r2.is_lost()).await;
    let w = b.acquire(key, now_only(write())).await.expect("free after");
    w.release().await.unwrap();
}

async fn all(a: Locker, b: Locker) {
    readers_share_writers_exclude(a.clone(), b.clone(), "cat:1").await;
    queue_order(a.clone(), b.clone(), "cat:2").await;
    reentrancy_and_errors(a.clone(), "cat:3").await;
    forced_unlock(a, b, "cat:4").await;
}

const KEY: &str = "cat:stream";

/// Six readers over two lockers, each holding 40 ms and coming back at once, staggered so
/// that one always holds, until `stop`; each one's fence goes to `fences`.
fn stream_of_readers(
    a: &Locker,
    b: &Locker,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    fences: &Arc<std::sync::Mutex<Vec<u64>>>,
) -> tokio::task::JoinSet<()> {
    let mut readers = tokio::task::JoinSet::new();
    for i in 0..6u64 {
        let locker = if i % 2 == 0 { a.clone() } else { b.clone() };
        let (stop, fences) = (stop.clone(), fences.clone());
        readers.spawn(async move {
            tokio::time::sleep(ms(7 * i)).await;
            while !stop.load(Ordering::SeqCst) {
                let g = locker.acquire(KEY, read()).await.expect("reader");
                fences.lock().unwrap().push(g.fence());
                tokio::time::sleep(ms(40)).await;
                g.release().await.unwrap();
            }
        });
    }
    readers
}

/// Readers come and go so that one always holds; a writer that queues must get in after the
/// readers holding when it queued (one generation), never behind readers that came after it:
/// no reader's fence lies between the fence seen when the writer was queued and the writer's.
async fn writers_never_starve(a: Locker, b: Locker) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut readers = stream_of_readers(&a, &b, &stop, &fences);
    let (mut checked, longest) = (0, AtomicU64::new(0));
    for _ in 0..10 {
        tokio::time::sleep(ms(100)).await;
        let started = Instant::now();
        let writer = {
            let b = b.clone();
            tokio::spawn(async move { b.acquire(KEY, write()).await })
        };
        // The fence held when the writer was seen queued (readers queue only behind a writer).
        let mut queued_at = None;
        while !writer.is_finished() && started.elapsed() < ms(5_000) {
            if let Some(info) = a.lock_info(KEY).await.unwrap()
                && info.waiters >= 1
                && info.kind == LockKind::Read
            {
                queued_at = info.fence;
                break;
            }
            tokio::time::sleep(ms(2)).await;
        }
        let w = writer.await.unwrap().expect("the writer got in");
        longest.fetch_max(started.elapsed().as_millis() as u64, Ordering::SeqCst);
        if let Some(seen) = queued_at {
            checked += 1;
            let passed: Vec<u64> = (fences.lock().unwrap().iter())
                .copied()
                .filter(|&f| f > seen && f < w.fence())
                .collect();
            assert!(
                passed.is_empty(),
                "readers {passed:?} passed the queued writer"
            );
        }
        w.release().await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(r) = readers.join_next().await {
        r.unwrap();
    }
    assert!(
        checked >= 5,
        "the writer was seen queued in only {checked} of 10 rounds"
    );
    println!(
        "writer waited at most {} ms behind a stream of readers holding 40 ms each",
        longest.load(Ordering::SeqCst)
    );
}

on_every_topology!(all);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_starve_on_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let connect = async || Locker::builder().url(redis.url()).build().await.unwrap();
    writers_never_starve(connect().await, connect().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_starve_in_memory() {
    let locker = Locker::in_memory();
    let peer = || locker.in_memory_peer().unwrap();
    writers_never_starve(peer(), peer()).await;
}
