//! Several keys at once (`Locker::acquire_all`, `run_all`): all or none within one `wait`,
//! deadlock-free whatever order callers name the keys in, a fence per key, a loss of any key
//! ends the body, reentrant per key; on Redis, on a Cluster with the keys on different
//! masters, and in memory.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockrt::testing::{RedisCluster, RedisSentinelGroup, RedisServer, slot_of};
use lockrt::{LockError, LockOptions, Locker, LossCause};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Marks `key` held for the duration of a section and panics if it already was: overlapping
/// holders of one key in this process.
struct Inside(Arc<AtomicBool>);

impl Inside {
    fn enter(flag: &Arc<AtomicBool>, key: &str) -> Inside {
        assert!(
            !flag.swap(true, Ordering::SeqCst),
            "two holders of {key} at once"
        );
        Inside(flag.clone())
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Two lockers (two owners, as two processes would be) take `[a, b]` and `[b, a]` 1,000
/// times each: never a timeout (a deadlock would show as one), never two holders of a key,
/// and each key's fences increase.
async fn opposite_orders_never_deadlock(first: Locker, second: Locker, a: &str, b: &str) {
    const ROUNDS: usize = 1_000;
    let flags: Arc<[Arc<AtomicBool>; 2]> = Arc::new(Default::default());
    let last = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (locker, keys) in [(first, [a, b]), (second, [b, a])] {
        let keys = keys.map(str::to_owned);
        let (flags, last, names) = (flags.clone(), last.clone(), [a.to_owned(), b.to_owned()]);
        tasks.spawn(async move {
            let opts = LockOptions::new().ttl(ms(5_000)).wait(ms(2_000));
            for _ in 0..ROUNDS {
                let g = locker.acquire_all(&keys, opts).await.expect("no timeout");
                let _inside: Vec<Inside> = (0..2)
                    .map(|i| Inside::enter(&flags[i], &names[i]))
                    .collect();
                for (i, name) in names.iter().enumerate() {
                    let fence = g.fence(name).expect("a fence per key");
                    let before = last[i].swap(fence, Ordering::SeqCst);
                    assert!(fence > before, "{name}: fence {fence} after {before}");
                }
                tokio::task::yield_now().await;
                drop(_inside);
                g.release().await.expect("release");
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res.unwrap();
    }
    eprintln!(
        "{} rounds of [a, b] against [b, a] in {:?}",
        2 * ROUNDS,
        started.elapsed()
    );
}

/// The behaviour every topology shares; `keys` are two keys the test wants apart.
async fn all_or_none_loss_and_reentrancy(locker: Locker, other: Locker, a: &str, b: &str) {
    let opts = LockOptions::new().ttl(ms(5_000));

    // All or none: `b` busy, so `a` is not kept either.
    let held = other.acquire(b, opts).await.unwrap();
    let res = locker.acquire_all([a, b], opts.wait(ms(100))).await;
    assert!(res.unwrap_err().is_timeout());
    let free = other.try_acquire(a, opts).await.unwrap();
    assert!(free.is_some(), "{a} was left held after the timeout");
    drop(free);
    held.release().await.unwrap();

    // A loss of either key ends the body with that key's Lost; the other key is released.
    let (entered, inside) = tokio::sync::oneshot::channel();
    let body = locker.run_all([a, b], opts, async move {
        entered.send(()).unwrap();
        std::future::pending::<()>().await
    });
    let force = async {
        inside.await.unwrap();
        assert!(other.force_unlock(b).await.unwrap());
    };
    let (res, ()) = tokio::join!(body, force);
    match res {
        Err(LockError::Lost { key, cause }) => {
            assert_eq!(key, b);
            assert_eq!(cause, LossCause::ForceUnlocked);
        }
        other => panic!("expected Lost: {other:?}"),
    }
    let deadline = Instant::now() + ms(5_000);
    loop {
        if let Some(g) = other.try_acquire(a, opts).await.unwrap() {
            g.release().await.unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{a} still held after the section ended"
        );
        tokio::time::sleep(ms(5)).await;
    }

    // Reentrant per key: inside a section on `a`, run_all([a, b]) takes only `b`.
    let inner = locker
        .run(a, opts, async {
            locker
                .run_all([b, a], opts.wait(ms(0)), async {
                    lockrt::current_lock().map(|h| h.key().to_owned())
                })
                .await
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(inner.as_deref(), Some(b));

    // Multi-key locks are exclusive, as the attribute says at compile time.
    let read = locker.acquire_all([a, b], opts.read()).await;
    assert!(matches!(read, Err(LockError::Config(_))), "{read:?}");

    // No keys, or one key twice.
    assert!(matches!(
        locker.acquire_all(Vec::<String>::new(), opts).await,
        Err(LockError::InvalidKey { .. })
    ));
    let twice = locker.acquire_all([a, a], opts).await.unwrap();
    assert_eq!(twice.keys().count(), 1);
    twice.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let connect = async || Locker::builder().url(redis.url()).build().await.unwrap();
    all_or_none_loss_and_reentrancy(connect().await, connect().await, "acct:1", "acct:2").await;
    opposite_orders_never_deadlock(connect().await, connect().await, "acct:1", "acct:2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_across_slots() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let connect = async || {
        Locker::builder()
            .cluster(cluster.seed_urls())
            .build()
            .await
            .unwrap()
    };
    let (a, b) = ("acct:1", "acct:2");
    assert_ne!(slot_of(format!("lock:{a}")), slot_of(format!("lock:{b}")));
    all_or_none_loss_and_reentrancy(connect().await, connect().await, a, b).await;
    opposite_orders_never_deadlock(connect().await, connect().await, a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory() {
    let locker = Locker::in_memory();
    let peer = || locker.in_memory_peer().unwrap();
    all_or_none_loss_and_reentrancy(peer(), peer(), "acct:1", "acct:2").await;
    opposite_orders_never_deadlock(peer(), peer(), "acct:1", "acct:2").await;
}

/// Free keys on one server are taken in one script call, all or none; a busy key sends the
/// call down the one-by-one path, which waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_keys_of_one_slot_take_one_call() {
    let redis = RedisServer::start().expect("redis-server");
    let locker = Locker::builder().url(redis.url()).build().await.unwrap();
    let other = Locker::builder().url(redis.url()).build().await.unwrap();
    let keys = ["order:1:sku:1", "order:1:sku:2", "order:1:sku:3"];
    // Warm: scripts loaded, connections open.
    locker
        .acquire_all(keys, LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let before = support::script_calls(&mut conn).await;
    let all = locker.acquire_all(keys, LockOptions::new()).await.unwrap();
    let calls = support::script_calls(&mut conn).await - before;
    assert_eq!(calls, 1, "one call for three free keys");
    let fences: Vec<u64> = all.fences().iter().map(|(_, f)| *f).collect();
    assert_eq!(fences.len(), 3);
    for key in keys {
        assert!(
            other
                .try_acquire(key, LockOptions::new())
                .await
                .unwrap()
                .is_none()
        );
        let info = other.lock_info(key).await.unwrap().expect("held");
        assert_eq!(info.fence, all.fence(key));
    }
    // Held by the one-call path, renewed and released like any other.
    tokio::time::sleep(ms(200)).await;
    assert!(!all.is_lost());
    all.release().await.unwrap();
    let one = other.acquire(keys[1], LockOptions::new()).await.unwrap();
    let waiting = locker.acquire_all(keys, LockOptions::new().wait(ms(3_000)));
    let (res, ()) = tokio::join!(waiting, async {
        tokio::time::sleep(ms(100)).await;
        one.release().await.unwrap();
    });
    let all = res.expect("taken once the busy key was released");
    assert!(all.fence(keys[1]).unwrap() > fences[1]);
    all.release().await.unwrap();
}

/// On a Cluster, keys that happen to share a slot take the one-call path too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_keys_of_one_cluster_slot() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .build()
        .await
        .unwrap();
    let first = "order:0".to_owned();
    let slot = slot_of(format!("lock:{first}"));
    let second = (1..100_000)
        .map(|i| format!("order:{i}"))
        .find(|k| slot_of(format!("lock:{k}")) == slot)
        .expect("a key in the same slot");
    let both = locker
        .acquire_all([&first, &second], LockOptions::new())
        .await
        .unwrap();
    assert_eq!(both.fences().len(), 2);
    for key in [&first, &second] {
        let info = locker.lock_info(key).await.unwrap().expect("held");
        assert_eq!(info.fence, both.fence(key));
    }
    both.release().await.unwrap();
    assert!(locker.lock_info(&first).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sentinel() {
    let group = RedisSentinelGroup::start("lockrt", 1).expect("master, replica and sentinel");
    let connect = async || {
        Locker::builder()
            .sentinel(group.sentinel_urls(), "lockrt")
            .build()
            .await
            .unwrap()
    };
    let (a, b) = ("acct:1", "acct:2");
    all_or_none_loss_and_reentrancy(connect().await, connect().await, a, b).await;
}

/// A key taken first and lost silently while the next is waited for (here deleted behind
/// lockrt's back, as a server restarted without its data would) is found before the body
/// starts: `acquire_all` returns that key's `Lost`, never a guard with a stale fence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_lost_while_the_next_is_waited_for_is_found_before_the_body() {
    let redis = RedisServer::start().expect("redis-server");
    let locker = Locker::builder().url(redis.url()).build().await.unwrap();
    let other = Locker::builder().url(redis.url()).build().await.unwrap();
    let (a, b) = ("acct:1", "acct:2");
    let held = other.acquire(b, LockOptions::new()).await.unwrap();
    let waiting = locker.acquire_all([a, b], LockOptions::new().wait(ms(5_000)));
    let meddle = async {
        let mut conn = redis
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let end = Instant::now() + ms(5_000);
        while locker.lock_info(a).await.unwrap().is_none() {
            assert!(Instant::now() < end, "{a} never taken");
            tokio::time::sleep(ms(5)).await;
        }
        let _: () = redis::cmd("DEL")
            .arg(format!("lock:{a}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        held.release().await.unwrap();
    };
    let (res, ()) = tokio::join!(waiting, meddle);
    match res {
        Err(LockError::Lost { key, .. }) => assert_eq!(key, a),
        other => panic!(
            "expected {a}'s Lost, got {:?}",
            other.map(|g| g.fences().len())
        ),
    }
    let both = other
        .acquire_all([a, b], LockOptions::new().wait(ms(2_000)))
        .await;
    both.expect("nothing left held").release().await.unwrap();
}
