//! lockrt's metrics (feature `metrics`), read back through a recording recorder.

use std::time::Duration;

use lockrt::{LockOptions, Locker};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn counter(snapshot: &[(String, DebugValue)], name: &str) -> u64 {
    snapshot
        .iter()
        .find_map(|(n, v)| match v {
            DebugValue::Counter(c) if n == name => Some(*c),
            _ => None,
        })
        .unwrap_or(0)
}

fn histogram_len(snapshot: &[(String, DebugValue)], name: &str) -> usize {
    snapshot
        .iter()
        .find_map(|(n, v)| match v {
            DebugValue::Histogram(h) if n == name => Some(h.len()),
            _ => None,
        })
        .unwrap_or(0)
}

fn gauge(snapshot: &[(String, DebugValue)], name: &str) -> f64 {
    snapshot
        .iter()
        .find_map(|(n, v)| match v {
            DebugValue::Gauge(g) if n == name => Some(g.into_inner()),
            _ => None,
        })
        .unwrap_or(0.0)
}

#[test]
fn counters_histograms_and_gauges_follow_the_locks() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let held_during = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let locker = Locker::in_memory();
            let peer = locker.in_memory_peer().unwrap();
            let opts = LockOptions::new().ttl(Duration::from_millis(300));
            let g = locker.acquire("m", opts).await.unwrap();
            // One timeout while it is held.
            let busy = peer
                .acquire("m", opts.wait(Duration::from_millis(20)))
                .await;
            assert!(busy.unwrap_err().is_timeout());
            // And one hand-off: a waiter woken by the release.
            let waiter = peer.clone();
            let handed = tokio::spawn(async move {
                let g = waiter
                    .acquire("m", opts.wait(Duration::from_secs(2)))
                    .await
                    .unwrap();
                g.release().await.unwrap();
            });
            while peer.stats().waiting == 0 {
                tokio::task::yield_now().await;
            }
            let held_during = snapshotter.snapshot().into_vec();
            g.release().await.unwrap();
            handed.await.unwrap();
            // One loss: a fixed lease that runs out.
            let fixed = locker.acquire("m2", opts.watchdog(false)).await.unwrap();
            tokio::time::timeout(Duration::from_secs(2), fixed.lost())
                .await
                .unwrap();
            // The watchdog declares it lost at the same deadline; let it run. By the drop the
            // lease has expired too, so that release finds nothing and is not counted.
            tokio::time::sleep(Duration::from_millis(100)).await;
            drop(fixed);
            tokio::task::yield_now().await;
            held_during
        })
    });
    let flat = |s: Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>| {
        s.into_iter()
            .map(|(k, _, _, v)| (k.key().name().to_owned(), v))
            .collect::<Vec<_>>()
    };
    // A debugging snapshot drains what it reports: add the two up.
    let during = flat(held_during);
    let after = flat(snapshotter.snapshot().into_vec());
    assert_eq!(gauge(&during, "lockrt_held"), 1.0, "{during:?}");
    let both =
        |f: fn(&[(String, DebugValue)], &str) -> u64, name| f(&during, name) + f(&after, name);
    let hist = |name| histogram_len(&during, name) + histogram_len(&after, name);
    assert_eq!(
        both(counter, "lockrt_acquired_total"),
        3,
        "{during:?} {after:?}"
    );
    assert_eq!(
        both(counter, "lockrt_timeouts_total"),
        1,
        "{during:?} {after:?}"
    );
    assert_eq!(
        both(counter, "lockrt_released_total"),
        2,
        "{during:?} {after:?}"
    );
    assert_eq!(
        both(counter, "lockrt_lost_total"),
        1,
        "{during:?} {after:?}"
    );
    assert_eq!(hist("lockrt_wait_seconds"), 3, "{during:?} {after:?}");
    assert_eq!(hist("lockrt_hold_seconds"), 2, "{during:?} {after:?}");
    assert_eq!(hist("lockrt_handoff_seconds"), 1, "{during:?} {after:?}");
    let held = gauge(&during, "lockrt_held") + gauge(&after, "lockrt_held");
    let waiting = gauge(&during, "lockrt_waiting") + gauge(&after, "lockrt_waiting");
    assert_eq!((held, waiting), (0.0, 0.0), "{during:?} {after:?}");
}
