//! Every exit path of `Locker::run` releases the lock promptly (key gone within 200 ms):
//! normal return, `Err` via `?`, panic (which keeps propagating), cancellation by
//! `tokio::time::timeout`, and `JoinHandle::abort`.

use crate::support;

use std::time::Duration;

use lockrt::LockError;
use support::{ms, opts};

const PROMPT: Duration = Duration::from_millis(200);

both! {
    async fn normal_return_releases_before_returning(fx) {
        let locker = fx.locker().await;
        let v = locker.run("ok", opts(), async { 5 }).await.unwrap();
        assert_eq!(v, 5);
        // Already released when `run` returned: no polling needed.
        assert!(fx.pttl("ok").await.is_none());
    }
}

both! {
    async fn error_via_question_mark_releases(fx) {
        let locker = fx.locker().await;
        async fn fails() -> Result<u32, String> {
            Err("boom".to_owned())
        }
        let res: Result<Result<u32, String>, LockError> =
            locker.run("err", opts(), async { let v = fails().await?; Ok(v + 1) }).await;
        assert_eq!(res.unwrap(), Err("boom".to_owned()));
        assert!(fx.pttl("err").await.is_none());
    }
}

both! {
    async fn panic_propagates_and_releases(fx) {
        let locker = fx.locker().await;
        let l = locker.clone();
        let task = tokio::spawn(async move {
            l.run("panic", opts(), async {
                panic!("body failed");
            })
            .await
        });
        let err = task.await.unwrap_err();
        assert!(err.is_panic(), "the panic must keep propagating");
        let took = fx.gone_within("panic", PROMPT).await;
        assert!(took.is_some(), "lock still held {PROMPT:?} after a panic");
        eprintln!("released {took:?} after the panic surfaced");
    }
}

both! {
    async fn timeout_cancellation_releases(fx) {
        let locker = fx.locker().await;
        let (in_tx, in_rx) = tokio::sync::oneshot::channel();
        let run = locker.run("cancel", opts(), async move {
            let _ = in_tx.send(());
            std::future::pending::<()>().await
        });
        let cancelled = tokio::time::timeout(ms(150), run).await;
        assert!(cancelled.is_err());
        in_rx.await.expect("the body had started");
        let took = fx.gone_within("cancel", PROMPT).await;
        assert!(took.is_some(), "lock still held after cancellation");
        eprintln!("released {took:?} after the timeout cancelled the run");
    }
}

both! {
    async fn abort_releases(fx) {
        let locker = fx.locker().await;
        let (in_tx, in_rx) = tokio::sync::oneshot::channel();
        let l = locker.clone();
        let task = tokio::spawn(async move {
            l.run("abort", opts(), async move {
                let _ = in_tx.send(());
                std::future::pending::<()>().await
            })
            .await
        });
        in_rx.await.unwrap();
        assert!(fx.pttl("abort").await.is_some());
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let took = fx.gone_within("abort", PROMPT).await;
        assert!(took.is_some(), "lock still held after abort");
        eprintln!("released {took:?} after abort");
    }
}

both! {
    async fn dropped_guard_releases_in_the_background(fx) {
        let locker = fx.locker().await;
        let g = locker.acquire("dropped", opts()).await.unwrap();
        drop(g);
        assert!(fx.gone_within("dropped", PROMPT).await.is_some());
        support::eventually(|| locker.stats().held == 0, "lock still counted as held").await;
        support::eventually(|| locker.stats().keys == 0, "per-key state left behind").await;
    }
}

both! {
    async fn failed_acquire_never_runs_the_body(fx) {
        let a = fx.locker().await;
        let b = fx.locker().await;
        let _g = a.acquire("never", opts()).await.unwrap();
        let ran = std::sync::atomic::AtomicBool::new(false);
        let res = b.run("never", opts().wait(ms(50)), async { ran.store(true, std::sync::atomic::Ordering::SeqCst) }).await;
        assert!(res.unwrap_err().is_timeout());
        assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    }
}
