//! Reentrancy within one task, and other tasks (also ones spawned inside the body) as other
//! owners.

use crate::support;

use support::{ms, opts};

both! {
    async fn nested_run_on_same_key_does_not_deadlock_and_releases_at_the_end(fx) {
        let locker = fx.locker().await;
        let out = locker
            .run("re", opts().wait(ms(500)), async {
                let outer = lockrt::current_lock().unwrap();
                let inner = locker
                    .run("re", opts().wait(ms(500)), async {
                        let held = lockrt::current_lock().unwrap();
                        assert_eq!(held.fence(), outer.fence(), "the inner call must not re-acquire");
                        7
                    })
                    .await
                    .unwrap();
                // The inner section ending did not release the outer lock.
                assert!(fx.pttl("re").await.is_some(), "released by the inner section");
                inner
            })
            .await
            .unwrap();
        assert_eq!(out, 7);
        assert!(fx.pttl("re").await.is_none());
    }
}

both! {
    async fn nested_run_on_another_key_takes_both(fx) {
        let locker = fx.locker().await;
        locker
            .run("outer", opts(), async {
                locker
                    .run("inner", opts(), async {
                        assert!(fx.pttl("outer").await.is_some());
                        assert!(fx.pttl("inner").await.is_some());
                        assert_eq!(lockrt::current_lock().unwrap().key(), "inner");
                    })
                    .await
                    .unwrap();
                assert!(fx.pttl("inner").await.is_none());
                assert_eq!(lockrt::current_lock().unwrap().key(), "outer");
            })
            .await
            .unwrap();
    }
}

both! {
    async fn task_spawned_inside_the_body_waits_like_any_owner(fx) {
        let locker = fx.locker().await;
        let l2 = locker.clone();
        let spawned = locker
            .run("spawn", opts(), async move {
                let l3 = l2.clone();
                let handle = tokio::spawn(async move {
                    assert!(lockrt::current_lock().is_none(), "spawned tasks don't inherit the lock");
                    l3.run("spawn", opts().wait(ms(100)), async {}).await
                });
                handle.await.unwrap()
            })
            .await
            .unwrap();
        assert!(spawned.unwrap_err().is_timeout(), "the spawned task must not share the lock");
    }
}

/// Reentrancy is per locker: a second `Locker` in the same task is another owner.
#[tokio::test]
async fn another_locker_is_another_owner_even_in_the_same_task() {
    let fx = support::Fx::redis();
    let a = fx.locker().await;
    let b = fx.locker().await;
    let res = a
        .run("x", opts(), async {
            b.run("x", opts().wait(ms(100)), async {}).await
        })
        .await
        .unwrap();
    assert!(res.unwrap_err().is_timeout());
}

/// `run` and `acquire` futures are `Send` when the body is, so they work in `tokio::spawn`
/// and in axum handlers.
#[test]
fn lock_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let locker = lockrt::Locker::in_memory();
    let run = locker.run("k", opts(), async { 1 });
    is_send(&run);
    let acq = locker.acquire("k", opts());
    is_send(&acq);
}
