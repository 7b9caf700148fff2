//! An acquire whose reply is lost (the server froze after receiving it) is resolved before
//! `acquire` returns: either we hold the lock exactly once, or no lock of ours is left.

use crate::support;

use redis::AsyncCommands;
use support::{Fx, ms, opts};
use tokio::time::Instant;

async fn frozen_for(
    pause: std::time::Duration,
    wait: std::time::Duration,
) -> (
    Fx,
    lockrt::Locker,
    Result<lockrt::LockGuard, lockrt::LockError>,
) {
    let mut fx = Fx::redis();
    let locker = lockrt::Locker::builder()
        .url(fx.server().url())
        .response_timeout(ms(150))
        .build()
        .await
        .unwrap();
    // Warm up: the script is loaded and the connection established.
    locker.run("warm", opts(), async {}).await.unwrap();
    fx.server().pause().unwrap();
    let pid = fx.server().pid().unwrap();
    let thaw = tokio::spawn(async move {
        tokio::time::sleep(pause).await;
        let _ = std::process::Command::new("kill")
            .arg("-CONT")
            .arg(pid.to_string())
            .status();
    });
    let res = locker
        .acquire("unsure", opts().ttl(ms(5_000)).wait(wait))
        .await;
    thaw.await.unwrap();
    (fx, locker, res)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_resolved_by_retry_with_the_same_token() {
    let (fx, _locker, res) = frozen_for(ms(350), ms(3_000)).await;
    let guard = res.expect("resolved to acquired once the server answered");
    let mut conn = fx.conn().await;
    let value: String = conn.get("lock:unsure").await.unwrap();
    assert_eq!(
        support::holder_fence_of_value(&value),
        guard.fence(),
        "{value} vs fence {}",
        guard.fence()
    );
    // Exactly one holder: nobody else gets it, and our release frees it.
    let other = fx.locker().await;
    assert!(other.try_acquire("unsure", opts()).await.unwrap().is_none());
    guard.release().await.unwrap();
    assert!(other.try_acquire("unsure", opts()).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unresolved_acquire_leaves_no_orphan_lock() {
    // Silent for longer than the wait: no retry may start after it, so the call fails.
    let (fx, _locker, res) = frozen_for(ms(2_500), ms(1_000)).await;
    let err = res.expect_err("the server stayed silent past the wait");
    assert!(err.is_backend(), "{err:?}");
    // The server is answering again: whatever of ours landed is removed promptly, far
    // sooner than the 5 s lease.
    let start = Instant::now();
    loop {
        let mut conn = fx.conn().await;
        let exists: bool = conn.exists("lock:unsure").await.unwrap();
        if !exists {
            break;
        }
        assert!(
            start.elapsed() < ms(2_000),
            "orphan lock left after a failed acquire"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let other = fx.locker().await;
    assert!(other.try_acquire("unsure", opts()).await.unwrap().is_some());
}
