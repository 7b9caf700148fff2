//! The tokio runtime a `Locker` works on is dropped while it holds 100 locks: nothing panics,
//! nothing renews them afterwards, and Redis lets every one of them go within its ttl. Its own
//! test binary, because it counts panics process-wide. Prints its figure (`FIGURE ...`).

use crate::support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};
use support::proxy_faults::{figure, ms_f};

#[test]
fn runtime_dropped_while_holding_100_locks() {
    let panics = Arc::new(AtomicU32::new(0));
    let seen = panics.clone();
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        seen.fetch_add(1, Ordering::SeqCst);
        default_hook(info);
    }));

    let server = RedisServer::start().unwrap();
    let ttl = Duration::from_millis(1_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (locker, guards) = rt.block_on(async {
        let locker = Locker::connect(&server.url()).await.unwrap();
        let mut guards = Vec::new();
        for i in 0..100 {
            guards.push(
                locker
                    .acquire(&format!("rt{i}"), LockOptions::new().ttl(ttl))
                    .await
                    .unwrap(),
            );
        }
        (locker, guards)
    });
    let dropped = Instant::now();
    drop(rt);
    // The guards and the locker outlive their runtime, as in a `static` or a leaked handle.
    drop(guards);
    drop(locker);

    let mut conn = server.client().get_connection().unwrap();
    let sample = |conn: &mut redis::Connection| -> HashMap<String, i64> {
        let keys: Vec<String> = redis::cmd("KEYS").arg("lock:rt*").query(conn).unwrap();
        keys.into_iter()
            .map(|k| {
                let p: i64 = redis::cmd("PTTL").arg(&k).query(conn).unwrap();
                (k, p)
            })
            .filter(|(_, p)| *p >= 0)
            .collect()
    };
    // Sampled right after the drop: from here on every remaining lease only shrinks, unless
    // something renews it (a renewal in flight at the drop has landed by now).
    let first = sample(&mut conn);
    let held_after_drop = first.len();
    let max_pttl_after_drop = first.values().copied().max().unwrap_or(-1);
    let mut last = first;
    let mut renewals = 0;
    let gone = loop {
        std::thread::sleep(Duration::from_millis(10));
        let now = sample(&mut conn);
        for (k, p) in &now {
            if last.get(k).is_some_and(|before| p > before) {
                renewals += 1;
            }
        }
        last = now;
        if last.is_empty() {
            break Some(dropped.elapsed());
        }
        if dropped.elapsed() > ttl + Duration::from_millis(500) {
            break None;
        }
    };
    figure(
        "runtime_dropped_while_holding_100_locks",
        format!(
            "ttl 1 s: {held_after_drop} keys right after the drop (largest PTTL {max_pttl_after_drop} \
             ms), all gone {} after it, {renewals} renewals seen after the drop, panics: {}",
            gone.map_or("never (1.5 s)".into(), ms_f),
            panics.load(Ordering::SeqCst)
        ),
    );
    assert_eq!(panics.load(Ordering::SeqCst), 0, "something panicked");
    assert_eq!(
        renewals, 0,
        "locks were renewed after their runtime was dropped"
    );
    let gone = gone.expect("locks still there 1.5 s after the drop");
    assert!(gone <= ttl + Duration::from_millis(100), "{gone:?}");
}
