//! lockrt's metrics (feature `metrics`), read back through a recording recorder: the locks'
//! life cycle in memory, and every kind of loss, timeout, failure and forced unlock against a
//! real redis-server (the table in `lockrt/src/metrics.rs` and the README), and loss causes and
//! counting at their edges (found by an adversarial review): a guard released after
//! `shutdown()` is no loss; a stalled section's error and metric name the same cause; a release
//! sent before the deadline and answered after it is no loss; a false revoke message does not
//! make a later expiry read as a forced unlock.

use std::time::Duration;

use lockrt::{LockError, LockOptions, Locker};
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

/// One thread: the recorder is the thread's, and every task of the runtime (the watchdog's too)
/// records into it.
fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn counters_histograms_and_gauges_follow_the_locks() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
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

/// What one `DebuggingRecorder` snapshot holds.
pub(crate) type Snapshot = Vec<(
    metrics_util::CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

/// Counters by name and labels (`name{k=v}`), summed over snapshots.
fn counters(snapshots: Vec<Snapshot>) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for (k, _, _, v) in snapshots.into_iter().flatten() {
        let DebugValue::Counter(c) = v else { continue };
        let labels: Vec<String> = k
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = if labels.is_empty() {
            k.key().name().to_owned()
        } else {
            format!("{}{{{}}}", k.key().name(), labels.join(","))
        };
        *out.entry(name).or_default() += c;
    }
    out
}

/// Runs `f` on a one-thread runtime recording into a fresh recorder: its output and the
/// counters it left.
fn recorded<T>(f: impl AsyncFnOnce() -> T) -> (T, std::collections::BTreeMap<String, u64>) {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    let out = metrics::with_local_recorder(&recorder, || rt.block_on(f()));
    (out, counters(vec![snapshotter.snapshot().into_vec()]))
}

fn lost_total(c: &std::collections::BTreeMap<String, u64>) -> u64 {
    c.iter()
        .filter(|(k, _)| k.starts_with("lockrt_lost_total"))
        .map(|(_, v)| *v)
        .sum()
}

#[test]
fn every_loss_timeout_failure_and_forced_unlock_is_counted() {
    let mut redis = lockrt::testing::RedisServer::start().expect("redis-server");
    let url = redis.url();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    let ms = Duration::from_millis;
    let mut snapshots = Vec::new();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let connect = async || Locker::builder().url(&url).build().await.unwrap();
            let (locker, operator) = (connect().await, connect().await);
            let opts = LockOptions::new().ttl(ms(1_000));
            let lost = async |g: &lockrt::LockGuard| {
                tokio::time::timeout(Duration::from_secs(5), g.lost())
                    .await
                    .expect("declared lost");
            };

            let g = locker
                .acquire("held-too-long", opts.max_hold(ms(100)))
                .await
                .unwrap();
            lost(&g).await;
            drop(g);
            let g = locker
                .acquire("fixed", opts.ttl(ms(200)).watchdog(false))
                .await
                .unwrap();
            lost(&g).await;
            drop(g);
            let g = locker.acquire("forced", opts).await.unwrap();
            assert!(operator.force_unlock("forced").await.unwrap());
            lost(&g).await;
            drop(g);
            let busy = operator.acquire("busy", opts).await.unwrap();
            let once = locker.acquire("busy", opts.wait(ms(0))).await;
            assert!(once.unwrap_err().is_timeout());
            busy.release().await.unwrap();

            // The server goes away: the holder can't renew, the next acquire and the release
            // fail.
            let g = locker
                .acquire("unreachable", opts.ttl(ms(600)))
                .await
                .unwrap();
            redis.kill();
            lost(&g).await;
            let refused = locker.acquire("other", opts.wait(ms(0))).await;
            assert!(refused.unwrap_err().is_backend());
            let release = g.release().await;
            assert!(release.unwrap_err().is_backend());
            let g2 = operator.acquire("x", opts.wait(ms(0))).await;
            assert!(g2.is_err());
            snapshots.push(snapshotter.snapshot().into_vec());
        })
    });
    let c = counters(snapshots);
    eprintln!("{c:#?}");
    for (name, want) in [
        ("lockrt_lost_total{cause=max_hold,site=unnamed}", 1),
        ("lockrt_lost_total{cause=expired,site=unnamed}", 1),
        ("lockrt_lost_total{cause=force_unlocked,site=unnamed}", 1),
        ("lockrt_lost_total{cause=unreachable,site=unnamed}", 1),
        ("lockrt_force_unlocks_total", 1),
        ("lockrt_timeouts_total{site=unnamed}", 1),
        ("lockrt_acquire_failures_total{site=unnamed}", 2),
        ("lockrt_release_failures_total", 1),
    ] {
        assert_eq!(c.get(name).copied().unwrap_or(0), want, "{name}: {c:#?}");
    }
}

/// A guard held across `shutdown()` and released after its ttl: shutdown is not a loss, and
/// the README says such a guard's release reports success.
#[test]
fn a_release_after_shutdown_is_not_a_loss() {
    let redis = lockrt::testing::RedisServer::start().unwrap();
    let (res, c) = recorded(async || {
        let locker = Locker::builder().url(redis.url()).build().await.unwrap();
        let g = locker
            .acquire("k", LockOptions::new().ttl(ms(300)))
            .await
            .unwrap();
        locker.shutdown().await;
        tokio::time::sleep(ms(600)).await;
        g.release().await
    });
    eprintln!("release after shutdown: {res:?}\n{c:#?}");
    assert!(res.is_ok(), "{res:?}");
    assert_eq!(lost_total(&c), 0, "shutdown counted as a loss: {c:#?}");
}

/// A stalled process (the whole runtime blocked past the ttl, as SIGSTOP does): the error the
/// section returns and the metric/log must name the same cause.
#[test]
fn a_stalled_sections_error_and_metric_name_one_cause() {
    let redis = lockrt::testing::RedisServer::start().unwrap();
    let (res, c) = recorded(async || {
        let locker = Locker::builder().url(redis.url()).build().await.unwrap();
        let r = locker
            .run("stall", LockOptions::new().ttl(ms(300)), async {
                tokio::time::sleep(ms(20)).await;
                std::thread::sleep(ms(700));
                tokio::task::yield_now().await;
            })
            .await;
        tokio::time::sleep(ms(300)).await;
        r
    });
    eprintln!("stalled section: {res:?}\n{c:#?}");
    let Err(LockError::Lost { cause, .. }) = res else {
        panic!("{res:?}")
    };
    let label = format!("lockrt_lost_total{{cause={},site=unnamed}}", cause.as_str());
    assert_eq!(lost_total(&c), 1, "{c:#?}");
    assert_eq!(
        c.get(&label).copied().unwrap_or(0),
        1,
        "error says {cause:?}, metrics say {c:#?}"
    );
}

/// A healthy section whose release straddles the local deadline (the server still had the
/// lock and freed it by token): `run` returns Ok, so no loss should be counted either.
#[test]
fn a_release_sent_in_time_and_answered_late_is_not_a_loss() {
    let redis = lockrt::testing::RedisServer::start().unwrap();
    let client = redis.client();
    let (res, c) = recorded(async || {
        {
            let locker = Locker::builder()
                .url(redis.url())
                .safety_margin(ms(500))
                .build()
                .await
                .unwrap();
            let mut admin = client.get_multiplexed_async_connection().await.unwrap();
            // A fixed lease of 2 s with a 500 ms safety margin: local deadline at 1.5 s,
            // server expiry at 2 s. The release is sent at about 1 s, well before the
            // deadline, and the server answers nothing for 700 ms, so the answer comes after
            // the local deadline and before the expiry (room for a loaded machine both sides).
            let opts = LockOptions::new().ttl(ms(2_000)).watchdog(false);
            locker
                .run("slowrel", opts, async {
                    tokio::time::sleep(ms(1_000)).await;
                    let _: () = redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(700)
                        .arg("ALL")
                        .query_async(&mut admin)
                        .await
                        .unwrap();
                    7
                })
                .await
        }
    });
    eprintln!("slow release: {res:?}\n{c:#?}");
    assert!(matches!(res, Ok(7)), "{res:?}");
    assert_eq!(
        lost_total(&c),
        0,
        "run() returned Ok yet a loss was counted: {c:#?}"
    );
}

/// A revoke message for our token that turns out to be a false alarm (the check finds the
/// lock ours), then a real expiry (the server lost the key): the cause must be `expired`.
#[test]
fn a_false_revoke_does_not_make_a_later_expiry_a_forced_unlock() {
    let redis = lockrt::testing::RedisServer::start().unwrap();
    let client = redis.client();
    let rt = runtime();
    let cause = rt.block_on(async {
        let locker = Locker::builder().url(redis.url()).build().await.unwrap();
        let mut admin = client.get_multiplexed_async_connection().await.unwrap();
        let g = locker
            .acquire("rv", LockOptions::new().ttl(ms(1500)))
            .await
            .unwrap();
        tokio::time::sleep(ms(100)).await;
        let held: String = redis::cmd("GET")
            .arg("lock:rv")
            .query_async(&mut admin)
            .await
            .unwrap();
        let token = &held[..32];
        let n: i64 = redis::cmd("PUBLISH")
            .arg("{lock:}:revoke")
            .arg(token)
            .query_async(&mut admin)
            .await
            .unwrap();
        eprintln!("published revoke of {token} to {n} subscribers");
        tokio::time::sleep(ms(300)).await;
        assert!(!g.is_lost(), "a false revoke must not end the lease");
        // Later (many renewals on) the server loses the key: a plain expiry.
        tokio::time::sleep(ms(1500)).await;
        let _: () = redis::cmd("DEL")
            .arg("lock:rv")
            .query_async(&mut admin)
            .await
            .unwrap();
        tokio::time::timeout(ms(3000), g.lost())
            .await
            .expect("declared lost");
        match g.release().await {
            Err(LockError::Lost { cause, .. }) => cause,
            other => panic!("{other:?}"),
        }
    });
    eprintln!("cause: {cause:?}");
    assert_eq!(cause, lockrt::LossCause::Expired);
}

/// A guard whose fixed lease ran out locally (its `is_lost()` said so) released before the
/// server expired it: the release reports `Lost`, as the loss it counts (it returned `Ok` and
/// counted a loss).
#[test]
fn a_release_begun_after_the_deadline_reports_the_loss_it_counts() {
    let redis = lockrt::testing::RedisServer::start().unwrap();
    let (res, c) = recorded(async || {
        let locker = Locker::builder()
            .url(redis.url())
            .safety_margin(ms(500))
            .build()
            .await
            .unwrap();
        // Fixed lease of 2 s with a 500 ms margin: local deadline 1.5 s, server expiry 2 s.
        let opts = LockOptions::new().ttl(ms(2_000)).watchdog(false);
        let g = locker.acquire("late", opts).await.unwrap();
        tokio::time::sleep(ms(1_750)).await;
        assert!(g.is_lost());
        g.release().await
    });
    eprintln!("release after the deadline: {res:?}\n{c:#?}");
    assert!(matches!(res, Err(LockError::Lost { .. })), "{res:?}");
    assert_eq!(lost_total(&c), 1, "{c:#?}");
}

#[test]
fn locks_taken_and_released_are_counted_by_kind() {
    let ((), c) = recorded(async || {
        let locker = Locker::in_memory();
        let read = locker
            .acquire("cat", LockOptions::new().read())
            .await
            .unwrap();
        let again = locker
            .acquire("cat", LockOptions::new().read())
            .await
            .unwrap();
        let permit = locker
            .acquire("export", LockOptions::new().permits(2))
            .await
            .unwrap();
        let lock = locker.acquire("job", LockOptions::new()).await.unwrap();
        for g in [read, again, permit, lock] {
            g.release().await.unwrap();
        }
    });
    assert_eq!(
        c.get("lockrt_acquired_total{kind=read,site=unnamed}"),
        Some(&2),
        "{c:?}"
    );
    assert_eq!(
        c.get("lockrt_acquired_total{kind=permits,site=unnamed}"),
        Some(&1),
        "{c:?}"
    );
    assert_eq!(
        c.get("lockrt_acquired_total{kind=exclusive,site=unnamed}"),
        Some(&1),
        "{c:?}"
    );
    assert_eq!(
        c.get("lockrt_released_total{kind=read,site=unnamed}"),
        Some(&2),
        "{c:?}"
    );
}

/// Every metric a locker records has `# HELP` text (and the histograms a unit) as an exporter
/// shows it: described when the locker is made, under the recorder installed then.
#[test]
fn every_metric_recorded_has_help_text() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let locker = Locker::in_memory();
            let peer = locker.in_memory_peer().unwrap();
            let opts = LockOptions::new().ttl(ms(300));
            let g = locker.acquire("h", opts).await.unwrap();
            let busy = peer.acquire("h", opts.wait(ms(20))).await;
            assert!(busy.unwrap_err().is_timeout());
            g.release().await.unwrap();
        })
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let names: Vec<String> = snapshot
        .iter()
        .map(|(k, ..)| k.key().name().to_owned())
        .collect();
    for name in [
        "lockrt_acquired_total",
        "lockrt_timeouts_total",
        "lockrt_wait_seconds",
        "lockrt_held",
    ] {
        assert!(
            names.iter().any(|n| n == name),
            "{name} not recorded: {names:?}"
        );
    }
    for (key, unit, help, _) in &snapshot {
        let name = key.key().name();
        assert!(
            help.as_ref().is_some_and(|h| !h.is_empty()),
            "{name} has no help text"
        );
        if name.ends_with("_seconds") {
            assert_eq!(*unit, Some(metrics::Unit::Seconds), "{name}");
        }
    }
}

#[lockrt::distributed_lock(key = "refund:{order}", locker = locker, wait = "0s")]
async fn refund(locker: &Locker, order: u32) -> Result<u32, LockError> {
    Ok(order)
}

/// Every acquisition, timeout, failure, loss, wait and hold carries the lock site: the
/// annotated fn's path for the attribute, the name given to `site` otherwise, `unnamed`
/// without one; never the key (three orders are one site). Against a real redis-server.
#[test]
fn metrics_carry_the_lock_site_not_the_key() {
    let mut redis = lockrt::testing::RedisServer::start().expect("redis-server");
    let url = redis.url();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let locker = Locker::connect(&url).await.unwrap();
            for order in 1..=3 {
                assert_eq!(refund(&locker, order).await.unwrap(), order);
            }
            let export = LockOptions::new().site("export").ttl(ms(500));
            let g = locker.acquire("export:t1", export).await.unwrap();
            // Another instance's export finds the slot taken.
            let other = Locker::connect(&url).await.unwrap();
            let busy = other.run("export:t1", export.wait(ms(0)), async {}).await;
            assert!(busy.unwrap_err().is_timeout());
            assert!(other.force_unlock("export:t1").await.unwrap());
            tokio::time::timeout(ms(5_000), g.lost()).await.unwrap();
            drop(g);
            locker
                .run("plain", LockOptions::new(), async {})
                .await
                .unwrap();
            redis.kill();
            let down = locker.acquire("export:t2", export).await;
            assert!(down.unwrap_err().is_backend());
        })
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let mut by_site = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (k, ..) in &snapshot {
        let key = k.key();
        let site = key
            .labels()
            .find(|l| l.key() == "site")
            .map(|l| l.value().to_owned());
        if let Some(site) = site {
            by_site.entry(site).or_default().push(key.name().to_owned());
        }
        let keys = [
            "refund:1",
            "refund:2",
            "refund:3",
            "export:t1",
            "export:t2",
            "plain",
        ];
        assert!(
            key.labels().all(|l| !keys.contains(&l.value())),
            "a key in a label: {key:?}"
        );
    }
    eprintln!("{by_site:#?}");
    let c = counters(vec![snapshot]);
    let site = "semantics::metrics::refund";
    for (name, want) in [
        (
            format!("lockrt_acquired_total{{kind=exclusive,site={site}}}"),
            3,
        ),
        (
            format!("lockrt_released_total{{kind=exclusive,site={site}}}"),
            3,
        ),
        (
            "lockrt_acquired_total{kind=exclusive,site=export}".into(),
            1,
        ),
        ("lockrt_timeouts_total{site=export}".into(), 1),
        (
            "lockrt_lost_total{cause=force_unlocked,site=export}".into(),
            1,
        ),
        ("lockrt_acquire_failures_total{site=export}".into(), 1),
        (
            "lockrt_acquired_total{kind=exclusive,site=unnamed}".into(),
            1,
        ),
    ] {
        assert_eq!(c.get(&name).copied().unwrap_or(0), want, "{name}: {c:#?}");
    }
    for s in [site, "export", "unnamed"] {
        let names = &by_site[s];
        assert!(
            names.iter().any(|n| n == "lockrt_wait_seconds"),
            "{s}: {names:?}"
        );
    }
    assert!(by_site[site].iter().any(|n| n == "lockrt_hold_seconds"));
}

/// The alert rules of `examples/prometheus-alerts.yml` name only metrics and labels the
/// README's metrics table documents (each one recorded and described, as the tests above check).
#[test]
fn the_alert_rules_name_only_documented_metrics() {
    let rules = include_str!("../../examples/prometheus-alerts.yml");
    let readme = include_str!("../../README.md");
    let documented = |name: &str| readme.contains(&format!("| `{name}` |"));
    let mut named = Vec::new();
    for (at, _) in rules.match_indices("lockrt_") {
        let name: String = rules[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        named.push(name);
    }
    named.sort();
    named.dedup();
    assert!(named.len() >= 6, "{named:?}");
    let unknown: Vec<_> = named.iter().filter(|n| !documented(n)).collect();
    assert!(
        unknown.is_empty(),
        "not in the README's metrics table: {unknown:?}"
    );
    for label in ["site", "cause", "job", "outcome"] {
        assert!(readme.contains(&format!("`{label}`")), "label {label}");
    }
}
