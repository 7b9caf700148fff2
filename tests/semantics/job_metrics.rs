//! The metrics of `lockrt::every` (feature `metrics`), read back by their `job` label through a
//! recording recorder: two instances (lockers sharing one lock space) run a job; the runs are
//! counted by outcome and the last success is a time; a tick's claim waited for by the
//! instance that does not run it is neither a timeout (`lockrt_timeouts_total`) nor a caller
//! waiting (`lockrt_waiting`). Against a real redis-server too: a run stopped with `Stop::Now`
//! is counted `stopped`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker, Stop};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::mpsc;

use super::metrics::Snapshot;

/// The value of metric `name` whose labels include every one of `labels`, summed.
fn value(snapshot: &Snapshot, name: &str, labels: &[(&str, &str)]) -> f64 {
    snapshot
        .iter()
        .filter(|(k, ..)| k.key().name() == name)
        .filter(|(k, ..)| {
            labels.iter().all(|(l, v)| {
                k.key()
                    .labels()
                    .any(|got| got.key() == *l && got.value() == *v)
            })
        })
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => *c as f64,
            DebugValue::Gauge(g) => g.into_inner(),
            DebugValue::Histogram(h) => h.len() as f64,
        })
        .sum()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn snapshot(s: &Snapshotter) -> Snapshot {
    s.snapshot().into_vec()
}

#[test]
fn job_runs_are_counted_by_job_and_claim_waits_are_no_timeouts() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    let (during, ran) = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let a = Locker::in_memory();
            let b = a.in_memory_peer().unwrap();
            let (tx, mut rx) = mpsc::unbounded_channel();
            let mut jobs = vec![];
            for locker in [&a, &b] {
                let tx = tx.clone();
                let opts = LockOptions::new().ttl(Duration::from_millis(500));
                let tick = Duration::from_millis(200);
                let job = lockrt::spawn_every(locker, "m1", tick, opts, move |t| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send(t);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                })
                .unwrap();
                jobs.push(job);
            }
            // Three runs have started: the instance that lost each tick waited for its claim.
            let mut ticks = vec![];
            for _ in 0..3 {
                ticks.push(rx.recv().await.unwrap());
            }
            // The third run's tick is under way: its loser queues for the claim (no event
            // tells when: looked at, bounded, while the run's 50 ms last).
            let mut queued = false;
            for _ in 0..20 {
                let claims = a.locks("m1:tick:*").await.unwrap();
                queued = claims.iter().any(|c| c.waiters > 0);
                if queued {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert!(queued, "the other instance never waited for the claim");
            let during = snapshot(&snapshotter);
            for job in jobs {
                job.stop(Stop::AfterRun).await.unwrap();
            }
            (during, ticks)
        })
    });
    let after = snapshot(&snapshotter);
    // A snapshot takes the counters' increments since the one before.
    let count =
        |name, labels: &[(&str, &str)]| value(&during, name, labels) + value(&after, name, labels);
    let job = [("job", "m1")];
    assert_eq!(value(&during, "lockrt_waiting", &[]), 0.0);
    assert_eq!(count("lockrt_timeouts_total", &[]), 0.0);
    let runs = count(
        "lockrt_job_runs_total",
        &[("job", "m1"), ("outcome", "ran")],
    );
    assert!(runs >= 3.0, "{runs} runs for {ran:?}");
    assert_eq!(count("lockrt_job_runs_total", &job), runs, "only ran");
    let last = value(&after, "lockrt_job_last_success_seconds", &job);
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!((now - 5.0..=now).contains(&last), "{last} vs {now}");
    assert_eq!(count("lockrt_job_ticks_given_up_total", &job), 0.0);
    // Described for the exporter, as every metric is.
    for (key, unit, help, _) in during.iter().chain(&after) {
        let name = key.key().name();
        if name.starts_with("lockrt_job") {
            assert!(help.as_ref().is_some_and(|h| !h.is_empty()), "{name}");
            if name.ends_with("_seconds") {
                assert_eq!(*unit, Some(metrics::Unit::Seconds), "{name}");
            }
        }
    }
}

#[test]
fn a_run_stopped_now_is_counted_stopped() {
    let redis = RedisServer::start().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let rt = runtime();
    metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let locker = Locker::builder().url(redis.url()).build().await.unwrap();
            let (tx, mut rx) = mpsc::unbounded_channel();
            let opts = LockOptions::new().ttl(Duration::from_millis(1_000));
            let tick = Duration::from_millis(1_000);
            let job = lockrt::spawn_every(&locker, "m2", tick, opts, move |_| {
                let _ = tx.send(());
                tokio::time::sleep(Duration::from_secs(5))
            })
            .unwrap();
            rx.recv().await.unwrap();
            job.stop(Stop::Now).await.unwrap();
            locker.shutdown().await;
        })
    });
    let after = snapshot(&snapshotter);
    let stopped = [("job", "m2"), ("outcome", "stopped")];
    assert_eq!(value(&after, "lockrt_job_runs_total", &stopped), 1.0);
    assert_eq!(
        value(&after, "lockrt_job_last_success_seconds", &[("job", "m2")]),
        0.0
    );
}
