//! Key hygiene: user keys can't forge a cluster hash tag or collide with auxiliary keys, all
//! keys of one lock share a cluster slot, and unusable keys are `InvalidKey`.

use crate::support;

use lockrt::LockError;
use redis::AsyncCommands;
use support::{Fx, ms, opts};

/// Redis Cluster's key slot: CRC16/XMODEM of the hash tag (or the whole key) mod 16384.
fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let mut crc: u16 = 0;
    for &b in tagged.unwrap_or(bytes) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

#[test]
fn slot_function_matches_redis_reference_values() {
    // From the Redis Cluster specification.
    assert_eq!(slot("123456789"), 0x31C3);
    assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
}

#[tokio::test]
async fn every_key_of_one_lock_shares_a_slot_and_braces_cannot_forge_tags() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    for user_key in [
        "stock:1",
        "tenant:{acme}:order:9",
        "a}:fence{x",
        "{lock:stock:1}:fence",
        "100%",
    ] {
        let g = locker.acquire(user_key, opts()).await.unwrap();
        let keys: Vec<String> = conn.keys("*").await.unwrap();
        let lock = locker.redis_key(user_key).unwrap();
        assert!(keys.contains(&lock), "{keys:?} lacks {lock}");
        assert!(
            !lock.contains(['{', '}']),
            "{lock} carries a brace from the user key"
        );
        let fence = format!("{{{lock}}}:state");
        assert!(keys.contains(&fence), "{keys:?} lacks {fence}");
        assert_eq!(
            slot(&lock),
            slot(&fence),
            "{lock} and {fence} in different slots"
        );
        assert_eq!(slot(&lock), slot(&format!("{{{lock}}}:rel")));
        g.release().await.unwrap();
    }
    // A user key shaped like an auxiliary key is a different lock from the real one.
    let real = locker.acquire("stock:1", opts()).await.unwrap();
    let fake = locker
        .acquire("{lock:stock:1}:fence", opts().wait(ms(0)))
        .await
        .unwrap();
    assert_ne!(
        locker.redis_key("{lock:stock:1}:fence").unwrap(),
        "{lock:stock:1}:fence"
    );
    drop((real, fake));
}

both! {
    async fn empty_and_absurdly_long_keys_are_invalid(fx) {
        let locker = fx.locker().await;
        let err = locker.acquire("", opts()).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
        assert!(err.to_string().contains("empty"), "{err}");
        let long = "k".repeat(4096);
        let err = locker.run(&long, opts(), async {}).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
        assert!(err.to_string().contains("4096 bytes"), "{err}");
    }
}

#[tokio::test]
async fn prefix_with_a_brace_is_rejected() {
    let err = lockrt::Locker::builder()
        .url("redis://127.0.0.1:1/")
        .prefix("{app}:")
        .build()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("brace"), "{err}");
}
