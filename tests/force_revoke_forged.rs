//! A revoke message is only a hint: a client that can read the lock key and PUBLISH (no EVAL,
//! no DEL, no force_unlock) cannot cancel a healthy holder's section, because the holder checks
//! with an owner-checked renewal and only the server's "not yours" declares the lease lost.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lockrt::testing::RedisServer;
use lockrt::{LockError, Locker};
use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_revoke_does_not_cancel_a_healthy_section() {
    let server = RedisServer::start().expect("start redis-server");
    let mut direct = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let holder = Locker::connect(&server.url()).await.unwrap();
    let finished = Arc::new(AtomicBool::new(false));
    let done = finished.clone();
    let h = holder.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let section = tokio::spawn(async move {
        let r = h
            .run("job", opts().ttl(ms(10_000)), async move {
                let _ = tx.send(());
                tokio::time::sleep(ms(2_000)).await;
                done.store(true, Ordering::SeqCst);
            })
            .await;
        (Instant::now(), r)
    });
    rx.await.unwrap();
    support::until_listening_for_revocations(&mut direct, 1).await;
    // A third party: GET (read access) and PUBLISH.
    let value: String = direct.get("lock:job").await.unwrap();
    let token = &value[..32];
    let start = Instant::now();
    let receivers: i64 = direct.publish("{lock:}:revoke", token).await.unwrap();
    let (ended, res) = section.await.unwrap();
    let cancelled = ended - start;
    // Was the lock still ours in Redis at the moment of the forged message? Yes: nobody
    // touched it. What is there now?
    tokio::time::sleep(ms(500)).await;
    let after: Option<String> = direct.get("lock:job").await.unwrap();
    let pttl: i64 = direct.pttl("lock:job").await.unwrap();
    println!(
        "FIGURE force_revoke_forged: 500 ms after the section ended, lock:job pttl {pttl} ms (the cancelled holder's token still holds it)"
    );
    println!(
        "FIGURE force_revoke_forged: PUBLISH of the holder's token by a third party ({receivers} receiver(s)): \
         section {} {cancelled:?} after it (body finished: {}), result {:?}; lock key now {:?}",
        if finished.load(Ordering::SeqCst) {
            "ran to its end"
        } else {
            "cancelled"
        },
        finished.load(Ordering::SeqCst),
        res.as_ref().map(|_| ()).map_err(LockError::to_string),
        after,
    );
    assert!(
        finished.load(Ordering::SeqCst),
        "a PUBLISH by a client without EVAL/DEL cancelled a section whose lock was never taken from it"
    );
}
