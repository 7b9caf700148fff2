//! Fencing tokens: strictly increasing per key across holders and lockers, across expired
//! locks, and after the key's counter itself was dropped for idleness.

use crate::support;

use std::sync::{Arc, Mutex};

use redis::AsyncCommands;
use support::{Fx, ms, opts};

both! {
    async fn fences_strictly_increase_over_1000_acquisitions_by_several_lockers(fx) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for l in 0..4 {
            let locker = fx.locker().await;
            for t in 0..5 {
                let (locker, seen) = (locker.clone(), seen.clone());
                tasks.push(tokio::spawn(async move {
                    for i in 0..50 {
                        // Every 25th holder lets its fixed lease expire instead of releasing,
                        // so the next holder acquires across an expired lock.
                        let expire = (l + t + i) % 25 == 0;
                        let o = if expire { opts().ttl(ms(40)).watchdog(false) } else { opts() };
                        let g = locker.acquire("fenced", o.wait(ms(30_000))).await.unwrap();
                        seen.lock().unwrap().push(g.fence());
                        if expire {
                            tokio::time::timeout(ms(2_000), g.lost()).await.unwrap();
                            drop(g);
                        } else {
                            g.release().await.unwrap();
                        }
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1_000);
        for w in seen.windows(2) {
            assert!(w[1] > w[0], "fence went from {} to {}", w[0], w[1]);
        }
    }
}

#[tokio::test]
async fn fences_keep_increasing_after_the_counter_expired_or_vanished() {
    let fx = Fx::redis();
    let mut conn = fx.conn().await;
    let locker = lockrt::Locker::builder()
        .url(fx_url(&fx))
        .fence_retention(ms(50))
        .build()
        .await
        .unwrap();
    let first = locker.acquire("idle", opts().ttl(ms(100))).await.unwrap();
    let f1 = first.fence();
    first.release().await.unwrap();
    // The counter is kept only for a while (bounded state for idle keys)...
    let pttl: i64 = conn.pttl("{lock:idle}:state").await.unwrap();
    assert!(
        pttl > 0,
        "the fence counter must expire when idle (PTTL {pttl})"
    );
    support::settle(
        async || !conn.exists::<_, bool>("{lock:idle}:state").await.unwrap(),
        "fence counter never expired",
    )
    .await;
    // ...and fences still increase after it is gone.
    let f2 = locker.acquire("idle", opts()).await.unwrap();
    assert!(f2.fence() > f1, "{} after {}", f2.fence(), f1);
    let f2v = f2.fence();
    f2.release().await.unwrap();
    let () = conn.del("{lock:idle}:state").await.unwrap();
    // A new state starts at the next whole ms of the server's clock (its resolution); a state
    // deleted in the ms of its last fence is the documented limit, so wait that out.
    tokio::time::sleep(ms(2)).await;
    let f3 = locker.acquire("idle", opts()).await.unwrap();
    assert!(f3.fence() > f2v);
}

fn fx_url(fx: &Fx) -> String {
    match fx {
        Fx::Redis(s) => s.url(),
        Fx::Memory(_) => unreachable!(),
    }
}

both! {
    async fn fences_are_per_key_and_visible_inside_the_section(fx) {
        let locker = fx.locker().await;
        let fence = locker.run("a", opts(), async { lockrt::current_lock().unwrap().fence() }).await.unwrap();
        assert!(fence > 0);
        assert!(lockrt::current_lock().is_none());
    }
}
