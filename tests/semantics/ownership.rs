//! Only the owner can release or renew: another token's release or renewal is refused and
//! leaves the key and its remaining lease as they were.

use crate::support;

use redis::AsyncCommands;
use support::{Fx, ms, opts};

#[tokio::test]
async fn non_owner_release_is_refused_and_leaves_key_and_pttl() {
    let fx = Fx::redis();
    let stale = fx.locker().await;
    let owner = fx.locker().await;
    let old = stale
        .acquire("own", opts().ttl(ms(100)).watchdog(false))
        .await
        .unwrap();
    tokio::time::timeout(ms(2_000), old.lost()).await.unwrap();
    let g = owner
        .acquire("own", opts().ttl(ms(60_000)).wait(ms(2_000)))
        .await
        .unwrap();
    let mut conn = fx.conn().await;
    let value: String = conn.get("lock:own").await.unwrap();
    let before: i64 = conn.pttl("lock:own").await.unwrap();

    assert!(old.release().await.unwrap_err().is_lost());

    let after_value: String = conn.get("lock:own").await.unwrap();
    let after: i64 = conn.pttl("lock:own").await.unwrap();
    assert_eq!(value, after_value);
    // Not shortened or deleted. The owner's own check once it listens for revocations (an
    // owner-checked renewal to its 60 s ttl) may land in between: never beyond that.
    assert!(
        after <= 60_000 && after > before - 1_000,
        "PTTL changed: {before} -> {after}"
    );
    g.release().await.unwrap();
}

#[tokio::test]
async fn non_owner_renewal_is_refused_and_leaves_key_and_pttl() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    let g = locker.acquire("own", opts().ttl(ms(600))).await.unwrap();
    // Another owner takes the key over with a long lease; our watchdog's renewal must neither
    // extend nor shorten it.
    let () = redis::cmd("SET")
        .arg("lock:own")
        .arg("ffffffffffffffffffffffffffffffff:9")
        .arg("PX")
        .arg(60_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::timeout(ms(2_000), g.lost())
        .await
        .expect("renewal refused means lost");
    let value: String = conn.get("lock:own").await.unwrap();
    let pttl: i64 = conn.pttl("lock:own").await.unwrap();
    assert_eq!(value, "ffffffffffffffffffffffffffffffff:9");
    assert!(
        pttl > 58_000,
        "another owner's lease was changed to {pttl} ms"
    );
    drop(g);
    tokio::time::sleep(ms(100)).await;
    let value: String = conn.get("lock:own").await.unwrap();
    assert_eq!(
        value, "ffffffffffffffffffffffffffffffff:9",
        "the dropped guard deleted another owner's lock"
    );
}
