//! The watchdog keeps a short lease alive for a long body, and stops when the body ends.

use crate::support;

use std::time::Duration;

use support::{ms, opts};
use tokio::time::Instant;

both! {
    async fn lease_renewed_through_a_long_body_and_not_after(fx) {
        let holder = fx.locker().await;
        let rival = fx.locker().await;
        let body = async {
            let start = Instant::now();
            let mut min_pttl = Duration::MAX;
            let mut rival_tries = 0;
            while start.elapsed() < ms(3_500) {
                let pttl = fx.pttl("long").await.expect("lock key must exist while the body runs");
                min_pttl = min_pttl.min(pttl);
                assert!(rival.try_acquire("long", opts()).await.unwrap().is_none(), "rival got the lock");
                rival_tries += 1;
                tokio::time::sleep(ms(25)).await;
            }
            (min_pttl, rival_tries)
        };
        let (min_pttl, tries) = holder.run("long", opts().ttl(ms(1_000)), body).await.unwrap();
        assert!(min_pttl > Duration::ZERO, "lease ran out: {min_pttl:?}");
        assert!(tries > 50);
        // Released on return, and no renewal resurrects it.
        assert!(fx.pttl("long").await.is_none(), "key left after the body ended");
        tokio::time::sleep(ms(800)).await;
        assert!(fx.pttl("long").await.is_none(), "a renewal ran after the body ended");
        assert_eq!(holder.stats().held, 0);
    }
}

both! {
    async fn without_watchdog_the_lease_is_fixed_and_loss_is_declared(fx) {
        let locker = fx.locker().await;
        let start = Instant::now();
        let res = locker
            .run("fixed", opts().ttl(ms(300)).watchdog(false), tokio::time::sleep(ms(5_000)))
            .await;
        let took = start.elapsed();
        assert!(res.unwrap_err().is_lost());
        // Declared locally just before the server-side lease ends.
        assert!(took < ms(300), "loss declared after {took:?}");
        assert!(took > ms(200), "loss declared early, after {took:?}");
    }
}

both! {
    async fn a_short_lease_after_long_ones_is_still_renewed(fx) {
        // Long leases make the idle monitor scan rarely (every ttl/3 = 10 s); a later short
        // lease is due long before that scan and must wake it, or it would expire unrenewed.
        let locker = fx.locker().await;
        for _ in 0..3 {
            locker.acquire("idle", opts().ttl(ms(30_000))).await.unwrap().release().await.unwrap();
        }
        // Give the monitor task (on another worker) time for the scan that sets its idle
        // interval; the monitor exposes no event for it, and this only makes the test stricter.
        tokio::time::sleep(ms(50)).await;
        let body = async {
            let start = Instant::now();
            let mut min_pttl = Duration::MAX;
            while start.elapsed() < ms(1_200) {
                let pttl = fx.pttl("short").await.expect("lock key must exist while the body runs");
                min_pttl = min_pttl.min(pttl);
                tokio::time::sleep(ms(25)).await;
            }
            min_pttl
        };
        let min_pttl = locker.run("short", opts().ttl(ms(300)), body).await.unwrap();
        assert!(min_pttl > Duration::ZERO, "lease ran out: {min_pttl:?}");
        assert!(fx.pttl("short").await.is_none(), "key left after the body ended");
    }
}
