//! Who holds what: the owner record beside each lock (same lifetime, deleted on release,
//! handed over with the lock) and the inspection API (`lock_info`, `locks`, `force_unlock`),
//! against a real redis-server and in memory.

use crate::support;

use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use support::{Fx, ms, opts};
use tokio::time::Instant;

async fn named(fx: &Fx, service: &str) -> Locker {
    match fx {
        Fx::Redis(s) => Locker::builder()
            .url(s.url())
            .service_name(service)
            .build()
            .await
            .expect("connect"),
        Fx::Memory(_) => panic!("named lockers are Redis only here"),
    }
}

/// PTTLs of a lock and its owner record, read in one MULTI so that no script runs between them.
async fn pttls(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> (i64, i64) {
    redis::pipe()
        .atomic()
        .pttl(format!("lock:{key}"))
        .pttl(format!("{{lock:{key}}}:owner"))
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_show_name_the_holder_fence_and_waiters() {
    let fx = Fx::redis();
    let a = named(&fx, "billing").await;
    let b = named(&fx, "reports").await;
    let long = opts().ttl(ms(10_000));
    let g = a.acquire("stock:1", long).await.unwrap();
    let _job = b.acquire("job", long).await.unwrap();
    let b2 = b.clone();
    let waiter = tokio::spawn(async move { b2.acquire("stock:1", long.wait(ms(10_000))).await });
    support::until_queued(&mut fx.conn().await, "stock:1", 1).await;

    let info = a.lock_info("stock:1").await.unwrap().expect("held");
    let holder = info.holder.clone().expect("owner record");
    assert_eq!(info.key, "stock:1");
    assert_eq!(info.redis_key, "lock:stock:1");
    assert_eq!(holder.service, "billing");
    assert_eq!(holder.pid, std::process::id());
    assert_eq!(holder.instance_id, a.instance_id().to_string());
    assert_ne!(a.instance_id(), b.instance_id());
    assert_eq!(info.fence, Some(g.fence()));
    assert_eq!(info.waiters, 1);
    let left = info.remaining.unwrap();
    assert!(left > ms(8_000) && left <= ms(10_000), "{left:?}");
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(holder.acquired_at_ms <= now_ms + 1_000 && holder.acquired_at_ms + 10_000 > now_ms);
    assert!(holder.to_string().starts_with("billing@"));

    let all = b.locks("*").await.unwrap();
    let keys: Vec<&str> = all.iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["job", "stock:1"]);
    assert_eq!(
        all[0].holder.as_ref().unwrap().service,
        "reports",
        "{all:?}"
    );
    let stock = b.locks("stock:*").await.unwrap();
    assert_eq!(stock.len(), 1);
    assert_eq!(stock[0].fence, Some(g.fence()));
    assert!(b.lock_info("nobody").await.unwrap().is_none());

    // A user key with braces is listed under its own name.
    let _odd = a.acquire("odd{x}", long).await.unwrap();
    let odd = a.locks("odd*").await.unwrap();
    assert_eq!(odd.len(), 1);
    assert_eq!(odd[0].key, "odd{x}");

    g.release().await.unwrap();
    let handed = waiter.await.unwrap().unwrap();
    let info = a.lock_info("stock:1").await.unwrap().expect("handed over");
    assert_eq!(
        info.holder.unwrap().instance_id,
        b.instance_id().to_string(),
        "the hand-over records the waiter as the holder"
    );
    assert_eq!(info.fence, Some(handed.fence()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_record_lives_and_dies_with_the_lock() {
    let fx = Fx::redis();
    let mut conn = fx.conn().await;
    let a = fx.locker().await;
    let g = a.acquire("k", opts().ttl(ms(3_000))).await.unwrap();
    let (lock, owner) = pttls(&mut conn, "k").await;
    assert!((lock - owner).abs() <= 5, "lock {lock} owner {owner}");
    // After a renewal (every ttl/3) both were extended together.
    tokio::time::sleep(ms(1_500)).await;
    let (lock, owner) = pttls(&mut conn, "k").await;
    assert!(lock > 2_000, "renewed: {lock}");
    assert!((lock - owner).abs() <= 5, "lock {lock} owner {owner}");
    println!("FIGURE owner_pttl_gap: lock {lock} ms, owner record {owner} ms after a renewal");
    let size: usize = conn.strlen("{lock:k}:owner").await.unwrap();
    assert!(size <= 256 + 20, "owner record is {size} bytes");
    g.release().await.unwrap();
    let exists: usize = conn
        .exists(&["lock:k", "{lock:k}:owner"][..])
        .await
        .unwrap();
    assert_eq!(exists, 0, "release deletes lock and owner record");

    // min_hold: the release shortens both to the rest of the minimum hold.
    let g = a
        .acquire("tick", opts().ttl(ms(10_000)).min_hold(ms(1_000)))
        .await
        .unwrap();
    g.release().await.unwrap();
    let (lock, owner) = pttls(&mut conn, "tick").await;
    assert!(lock > 0 && lock <= 1_000, "kept for min_hold: {lock}");
    assert!((lock - owner).abs() <= 5, "lock {lock} owner {owner}");

    // A dropped guard's release (run in the background) takes the owner record along: read
    // before or after it, never in between.
    let lease = a.try_acquire("left", opts().ttl(ms(300))).await.unwrap();
    drop(lease);
    let (lock, owner) = pttls(&mut conn, "left").await;
    assert!(
        (lock >= 0 && (lock - owner).abs() <= 5) || (lock == -2 && owner == -2),
        "lock {lock} owner {owner}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_tells_the_holder_and_hands_over_to_the_waiter() {
    for fx in [Fx::redis(), Fx::memory()] {
        let name = if fx.is_redis() { "redis" } else { "memory" };
        let holder = fx.locker().await;
        let waiting = fx.locker().await;
        let operator = fx.locker().await;
        let ttl = ms(3_000);
        let g = holder.acquire("job", opts().ttl(ttl)).await.unwrap();
        let w = waiting.clone();
        let waiter = tokio::spawn(async move {
            let g = w
                .acquire("job", LockOptions::new().ttl(ttl).wait(ms(20_000)))
                .await?;
            Ok::<_, lockrt::LockError>((Instant::now(), g))
        });
        if fx.is_redis() {
            support::until_queued(&mut fx.conn().await, "job", 1).await;
        } else {
            support::settle(async || waiting.stats().waiting >= 1, "waiter").await;
        }
        let start = Instant::now();
        assert!(operator.force_unlock("job").await.unwrap());
        let (got_at, new) = waiter.await.unwrap().unwrap();
        let handed = got_at - start;
        tokio::time::timeout(ttl / 3 + ms(500), g.lost())
            .await
            .expect("holder sees the loss within its renewal interval");
        let lost = start.elapsed();
        println!(
            "FIGURE force_unlock_handover ({name}): waiter held the lock {handed:?} after the forced unlock"
        );
        println!(
            "FIGURE force_unlock_holder_lost ({name}): holder told it lost {lost:?} after the forced unlock (ttl {ttl:?}, renewal every ttl/3)"
        );
        assert!(handed < ms(500), "waiter took {handed:?}");
        assert!(new.fence() > g.fence());
        let info = operator.lock_info("job").await.unwrap().expect("held");
        assert_eq!(info.fence, Some(new.fence()));
        assert_eq!(
            info.holder.unwrap().instance_id,
            waiting.instance_id().to_string()
        );
        assert!(!operator.force_unlock("nothing").await.unwrap());
        new.release().await.unwrap();
        assert!(operator.lock_info("job").await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_locks_record_their_owner_too() {
    let a = Locker::in_memory_with(Locker::builder().service_name("mem"));
    let g = a.acquire("x:1", opts()).await.unwrap();
    let _h = a.acquire("y", opts()).await.unwrap();
    let info = a.lock_info("x:1").await.unwrap().unwrap();
    let holder = info.holder.unwrap();
    assert_eq!(holder.service, "mem");
    assert_eq!(holder.instance_id, a.instance_id().to_string());
    assert_eq!(info.fence, Some(g.fence()));
    let listed = a.locks("x:*").await.unwrap();
    assert_eq!(listed.len(), 1);
    g.release().await.unwrap();
    assert!(a.lock_info("x:1").await.unwrap().is_none());

    // A peer is another instance: its locks name it, both lockers see them.
    let b = a.in_memory_peer().unwrap();
    assert_ne!(b.instance_id(), a.instance_id());
    let _p = b.acquire("x:2", opts()).await.unwrap();
    let holder = a.lock_info("x:2").await.unwrap().unwrap().holder.unwrap();
    assert_eq!(holder.instance_id, b.instance_id().to_string());
    assert_eq!(holder.service, "mem");
}
