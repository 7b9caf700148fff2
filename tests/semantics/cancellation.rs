//! A storm of acquires cancelled at random points leaves nothing behind: no lock keys, no
//! renewals, no subscriptions, no per-key state.

use crate::support;

use std::time::Duration;

use redis::AsyncCommands;
use support::{Fx, ms, opts};

/// Deterministic pseudo-random numbers (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_cancelled_acquires_leave_no_lock_renewal_or_subscription() {
    let fx = Fx::redis();
    let lockers = [fx.locker().await, fx.locker().await];
    let holder = fx.locker().await;
    // One key stays held for the whole storm so that many acquires are cancelled while
    // subscribed and waiting; the others are contended among the storm itself.
    let held = holder
        .acquire("storm:0", opts().ttl(ms(2_000)))
        .await
        .unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut tasks = Vec::new();
    for i in 0..1_000u64 {
        let locker = lockers[(i % 2) as usize].clone();
        let key = format!("storm:{}", rng.below(4));
        let cancel_after = Duration::from_micros(rng.below(3_000));
        let body_time = Duration::from_micros(rng.below(2_000));
        let abort = rng.below(2) == 0;
        let run = async move {
            locker
                .run(
                    &key,
                    opts().ttl(ms(2_000)).wait(ms(5_000)),
                    tokio::time::sleep(body_time),
                )
                .await
        };
        if abort {
            let t = tokio::spawn(run);
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(cancel_after).await;
                t.abort();
            }));
        } else {
            tasks.push(tokio::spawn(async move {
                let _ = tokio::time::timeout(cancel_after, run).await;
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    held.release().await.unwrap();

    let mut conn = fx.conn().await;
    support::settle(
        async || {
            let keys: Vec<String> = conn.keys("lock:*").await.unwrap();
            keys.is_empty()
        },
        "lock keys left behind",
    )
    .await;
    support::settle(
        async || {
            let keys: Vec<String> = conn.keys("{lock:storm:*}:[qw]").await.unwrap();
            keys.is_empty()
        },
        "waiter queues left behind",
    )
    .await;
    support::settle(
        async || {
            let chans: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("*")
                .query_async(&mut conn)
                .await
                .unwrap();
            chans.is_empty()
        },
        "subscriptions left behind",
    )
    .await;
    let numsub: Vec<(String, u64)> = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(
            (0..4)
                .map(|i| format!("{{lock:storm:{i}}}:rel"))
                .collect::<Vec<_>>(),
        )
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(numsub.iter().all(|(_, n)| *n == 0), "{numsub:?}");
    for l in &lockers {
        support::settle(
            async || l.stats().held == 0 && l.stats().keys == 0,
            &format!("locker state left behind: {:?}", l.stats()),
        )
        .await;
        let s = l.stats();
        assert_eq!(
            (s.held, s.keys, s.listening, s.waiting),
            (0, 0, 0, 0),
            "{s:?}"
        );
    }

    // No renewals continue: the script counters stay still once everything is released.
    let evals = async |conn: &mut redis::aio::MultiplexedConnection| -> (u64, u64) {
        let stats = support::commandstats(conn).await;
        (
            support::calls(&stats, "eval"),
            support::calls(&stats, "evalsha"),
        )
    };
    let before = evals(&mut conn).await;
    tokio::time::sleep(ms(1_000)).await; // longer than ttl/3: a live watchdog would renew
    assert_eq!(
        before,
        evals(&mut conn).await,
        "renewals continued after the storm"
    );
}
