//! Loss detection: the lock deleted or taken over from outside, or Redis stopped while held.

use crate::support;

use lockrt::LockError;
use redis::AsyncCommands;
use support::{Fx, ms, opts};
use tokio::time::Instant;

async fn lost_within_a_third_of_ttl(overwrite: bool) {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    let (tamper_tx, tamper_rx) = tokio::sync::oneshot::channel::<Instant>();
    let dropped = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    struct SetOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for SetOnDrop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    let flag = SetOnDrop(dropped.clone());
    let run = locker.run("victim", opts().ttl(ms(1_000)), async move {
        let _flag = flag;
        let _ = tamper_tx.send(Instant::now());
        tokio::time::sleep(ms(10_000)).await;
    });
    let tamper = async {
        let _ = tamper_rx.await;
        if overwrite {
            let () = conn
                .set("lock:victim", "0123456789abcdef0123456789abcdef:1")
                .await
                .unwrap();
        } else {
            let () = conn.del("lock:victim").await.unwrap();
        }
        Instant::now()
    };
    let (res, tampered) = tokio::join!(run, tamper);
    let detected = tampered.elapsed();
    assert!(
        matches!(res, Err(LockError::Lost { ref key, .. }) if key == "victim"),
        "{res:?}"
    );
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "body not dropped"
    );
    eprintln!("loss detected {detected:?} after tampering");
    assert!(
        detected <= ms(1_000 / 3 + 200),
        "loss noticed after {detected:?}"
    );
    if overwrite {
        // The other owner's lock is untouched by our late release.
        let v: String = conn.get("lock:victim").await.unwrap();
        assert!(v.starts_with("0123456789abcdef"));
    }
}

#[tokio::test]
async fn deleting_the_key_from_outside_returns_lost_and_drops_the_body() {
    lost_within_a_third_of_ttl(false).await;
}

#[tokio::test]
async fn overwriting_the_key_with_another_token_returns_lost() {
    lost_within_a_third_of_ttl(true).await;
}

#[tokio::test]
async fn guard_lost_resolves_and_on_lost_continue_finishes_the_body() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    let guard = locker.acquire("g", opts().ttl(ms(600))).await.unwrap();
    let () = conn.del("lock:g").await.unwrap();
    tokio::time::timeout(ms(2_000), guard.lost())
        .await
        .expect("lost() resolves");
    assert!(guard.is_lost());
    assert!(guard.release().await.unwrap_err().is_lost());

    let continue_on_loss = opts().ttl(ms(600)).on_lost(lockrt::OnLost::Continue);
    let section = locker
        .run_checked("c", continue_on_loss, async {
            let () = conn.del("lock:c").await.unwrap();
            tokio::time::sleep(ms(700)).await;
            "finished"
        })
        .await
        .unwrap();
    assert!(!section.held_throughout(), "the loss is reported");
    assert_eq!(section.output(), "finished", "the body ran to its end");

    // `run` never returns such a body's output as success.
    let res = locker
        .run("c2", continue_on_loss, async {
            let () = conn.del("lock:c2").await.unwrap();
            tokio::time::sleep(ms(700)).await;
            "finished"
        })
        .await;
    assert!(res.unwrap_err().is_lost());
}

both! {
    async fn expired_lease_is_lost_and_its_late_release_spares_the_new_holder(fx) {
        let holder = fx.locker().await;
        let other = fx.locker().await;
        let g = holder.acquire("m", opts().ttl(ms(200)).watchdog(false)).await.unwrap();
        tokio::time::timeout(ms(2_000), g.lost()).await.expect("lost() resolves");
        // The lost guard is still alive, but holds nothing: others get the lock.
        let g2 = other.acquire("m", opts().ttl(ms(5_000)).wait(ms(2_000))).await.unwrap();
        assert!(g.release().await.unwrap_err().is_lost());
        assert!(fx.pttl("m").await.is_some(), "late release removed the new holder's lock");
        g2.release().await.unwrap();
    }
}

async fn stopped_redis(kill: bool) {
    let mut fx = Fx::redis();
    let locker = lockrt::Locker::builder()
        .url(fx.server().url())
        .response_timeout(ms(300))
        .build()
        .await
        .unwrap();
    let ttl = ms(1_500);
    let guard = locker.acquire("frozen", opts().ttl(ttl)).await.unwrap();
    let acquired = Instant::now();
    if kill {
        fx.server().kill();
    } else {
        fx.server().pause().unwrap();
    }
    tokio::time::timeout(ms(5_000), guard.lost())
        .await
        .expect("loss declared");
    let noticed = acquired.elapsed();
    eprintln!("loss declared {noticed:?} after the last successful acquire");
    assert!(
        noticed < ttl,
        "declared after the server-side lease could have expired: {noticed:?}"
    );

    if kill {
        fx.server().restart().unwrap();
    } else {
        fx.server().resume().unwrap();
        // Let the server-side lease run out.
        let start = Instant::now();
        while fx.pttl("frozen").await.is_some() {
            assert!(start.elapsed() < ms(5_000));
            tokio::time::sleep(ms(20)).await;
        }
    }
    let other = fx.locker().await;
    let g2 = other
        .acquire("frozen", opts().wait(ms(3_000)))
        .await
        .expect("another client acquires");
    // The old holder's late release must not delete the new holder's lock.
    let late = guard.release().await;
    assert!(late.is_err());
    assert!(
        fx.pttl("frozen").await.is_some(),
        "old holder deleted the new lock"
    );
    g2.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_while_held_declares_loss_before_lease_end() {
    stopped_redis(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_while_held_declares_loss_and_recovers() {
    stopped_redis(true).await;
}

/// A share (read share or permit) whose records someone else deleted, while a writer (or
/// another permit holder) took the key beside it: its release reports `Lost`, never `Ok`
/// (the state recorded it as live, so no release of it is inferred). Also when only the
/// holders' zset went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_shares_records_from_outside_makes_its_release_lost() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let cases = [
        ("rw", opts().read(), Some(opts()), true),
        ("sem", opts().permits(1), Some(opts().permits(1)), true),
        ("zset-only", opts().read(), None, false),
    ];
    for (name, share, other, both) in cases {
        let held = a.acquire(name, share.ttl(ms(10_000))).await.unwrap();
        let (s, si) = (format!("{{lock:{name}}}:s"), format!("{{lock:{name}}}:si"));
        let gone: Vec<&str> = if both { vec![&s, &si] } else { vec![&s] };
        let deleted: u32 = conn.del(&gone).await.unwrap();
        assert_eq!(
            deleted as usize,
            gone.len(),
            "{name}: the share's records exist"
        );
        let beside = match other {
            Some(o) => Some(
                b.try_acquire(name, o.ttl(ms(10_000)))
                    .await
                    .unwrap()
                    .expect(
                        "with the share's records gone the key looks free: the other taker gets it",
                    ),
            ),
            None => None,
        };
        let res = held.release().await;
        assert!(
            matches!(&res, Err(e) if e.is_lost()),
            "{name}: a share whose records were deleted released with {res:?}"
        );
        if let Some(g) = beside {
            g.release().await.unwrap();
        }
    }
}
