//! A forced unlock (`Locker::force_unlock`, which `lockctl unlock --force` calls) revokes the
//! lease at once: the holder's locker hears it and a section with `on_lost = "cancel"` is
//! cancelled within milliseconds, not at its next renewal; the lock goes to the waiter, and the
//! two never overlap for longer than that. The renewal stays the fallback when the message is
//! lost. On Redis and in memory.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockrt::testing::{FaultProxy, RedisCluster, RedisServer};
use lockrt::{LockError, LockOptions, Locker};
use support::{ms, opts};
use tokio::sync::oneshot;
use tokio::time::Instant;

both! {
    async fn force_unlock_cancels_the_holders_section_at_once(fx) {
        let holder = fx.locker().await;
        let waiting = fx.locker().await;
        let operator = fx.locker().await;
        let ttl = ms(10_000);
        let (entered_tx, entered_rx) = oneshot::channel();
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        let h = holder.clone();
        let section = tokio::spawn(async move {
            let res = h
                .run("job", opts().ttl(ttl), async move {
                    let _ = entered_tx.send(());
                    tokio::time::sleep(ms(2_000)).await;
                    done.store(true, Ordering::SeqCst);
                })
                .await;
            (Instant::now(), res)
        });
        entered_rx.await.expect("the section started");
        let w = waiting.clone();
        let waiter = tokio::spawn(async move {
            let g = w
                .acquire("job", LockOptions::new().ttl(ttl).wait(ms(20_000)))
                .await?;
            Ok::<_, LockError>((Instant::now(), g))
        });
        if fx.is_redis() {
            support::until_queued(&mut fx.conn().await, "job", 1).await;
        } else {
            support::settle(async || waiting.stats().waiting >= 1, "waiter").await;
        }
        let start = Instant::now();
        assert!(operator.force_unlock("job").await.unwrap(), "it was held");
        let (ended, res) = section.await.unwrap();
        let (taken, new) = waiter.await.unwrap().unwrap();
        let cancelled = ended - start;
        let overlap = ended.saturating_duration_since(taken);
        println!(
            "FIGURE force_revoke ({}): section {} {cancelled:?} after force_unlock; overlapped the new holder by {overlap:?} (ttl {ttl:?}, 2 s body)",
            if fx.is_redis() { "redis" } else { "memory" },
            if finished.load(Ordering::SeqCst) { "ran to its end" } else { "cancelled" },
        );
        assert!(matches!(res, Err(LockError::Lost { .. })), "{res:?}");
        assert!(!finished.load(Ordering::SeqCst), "the body ran to its end");
        assert!(cancelled < ms(300), "cancelled {cancelled:?} after the forced unlock");
        assert!(overlap < ms(300), "overlapped the new holder by {overlap:?}");
        let info = operator.lock_info("job").await.unwrap().expect("held by the waiter");
        assert_eq!(info.fence, Some(new.fence()));
        new.release().await.unwrap();
    }
}

both! {
    async fn force_unlock_revokes_only_the_holders_lease(fx) {
        // One locker holds two keys; forcing one leaves the other held and renewed.
        let holder = fx.locker().await;
        let operator = fx.locker().await;
        let ttl = ms(10_000);
        let forced = holder.acquire("forced", opts().ttl(ttl)).await.unwrap();
        let kept = holder.acquire("kept", opts().ttl(ttl)).await.unwrap();
        // A lock of the operator's own, so its revoke subscription is live too.
        let own = operator.acquire("own", opts().ttl(ttl)).await.unwrap();
        let start = Instant::now();
        assert!(operator.force_unlock("forced").await.unwrap());
        tokio::time::timeout(ms(2_000), forced.lost())
            .await
            .expect("the forced lease is lost at once");
        let lost = start.elapsed();
        assert!(lost < ms(300), "lost {lost:?} after the forced unlock");
        assert!(!kept.is_lost());
        assert!(!own.is_lost());
        assert!(matches!(forced.release().await, Err(LockError::Lost { .. })));
        kept.release().await.unwrap();
        own.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_revoke_message_leaves_the_renewal_to_find_the_loss() {
    // The holder's connections go through a proxy that drops the revoke message.
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let holder = Locker::connect(&proxy.url()).await.unwrap();
    let operator = Locker::connect(&server.url()).await.unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl = ms(900);
    let g = holder.acquire("quiet", opts().ttl(ttl)).await.unwrap();
    let acquired = Instant::now();
    support::settle(
        async || support::numsub(&mut conn, "{lock:}:revoke").await >= 1,
        "the holder listens for revocations",
    )
    .await;
    proxy.drop_replies(1);
    assert!(operator.force_unlock("quiet").await.unwrap());
    proxy
        .wait_until(ms(2_000), |c| c.replies_dropped >= 1)
        .await
        .expect("the revoke message was dropped");
    tokio::time::timeout(ttl, g.lost())
        .await
        .expect("the renewal a third into the lease finds the loss");
    let lost = acquired.elapsed();
    assert!(
        lost >= ttl / 3 - ms(50),
        "lost {lost:?}: not by the renewal"
    );
    assert!(lost < ttl / 2 + ms(100), "lost {lost:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_revokes_at_once_on_a_cluster() {
    // The revoke message is a classic PUBLISH, which the cluster forwards to every node: the
    // holder hears it whichever node its subscriber is on and whichever master has the slot.
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let connect = async || {
        Locker::builder()
            .cluster(cluster.seed_urls())
            .build()
            .await
            .unwrap()
    };
    let holder = connect().await;
    let operator = connect().await;
    let ttl = ms(10_000);
    let mut guards = Vec::new();
    for i in 0..6 {
        guards.push(
            holder
                .acquire(&format!("job:{i}"), opts().ttl(ttl))
                .await
                .unwrap(),
        );
    }
    let masters: std::collections::BTreeSet<usize> = (0..6)
        .map(|i| {
            cluster
                .master_of_slot(lockrt::testing::slot_of(format!("lock:job:{i}")))
                .unwrap()
        })
        .collect();
    assert!(masters.len() > 1, "the keys should spread over masters");
    let mut slowest = Duration::ZERO;
    for (i, g) in guards.iter().enumerate() {
        let start = Instant::now();
        assert!(operator.force_unlock(&format!("job:{i}")).await.unwrap());
        tokio::time::timeout(ms(2_000), g.lost())
            .await
            .expect("the holder is told at once");
        slowest = slowest.max(start.elapsed());
    }
    println!(
        "FIGURE force_revoke_cluster: 6 locks on {} masters, each holder told within {slowest:?}",
        masters.len()
    );
    assert!(slowest < ms(300), "{slowest:?}");
}
