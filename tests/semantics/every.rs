//! `lockrt::every` at the edges a review found (several instances as threads with runtimes of
//! their own, each with its own locker, on one real redis-server): a shutdown right as a run
//! ends does not rerun the tick; a job longer than `max_hold` is not started once per instance
//! per tick; a run whose tick claim is force-unlocked is cancelled, so the tick finishes once.
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn tick_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

type Log = Arc<Mutex<BTreeMap<u64, Vec<(usize, &'static str)>>>>;

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn report(log: &Log, what: &str) -> usize {
    let log = log.lock().unwrap();
    let mut bad = 0;
    for (t, evs) in log.iter() {
        let ends = evs.iter().filter(|(_, w)| *w == "end").count();
        let flag = if ends > 1 {
            bad += 1;
            "  <== more than one finished run"
        } else {
            ""
        };
        eprintln!("{what}: tick {t}: {evs:?}{flag}");
    }
    bad
}

/// Instances running `every(name, tick, opts, ..)`, each on a thread with a runtime and a
/// locker of its own, until `every` returns or about `run_for` has passed (all stop at one
/// time, mid-tick); then each shuts its locker down. Each run is logged as `start` and, if its job returns, `end`, under its tick;
/// the job gets its instance, its locker and its tick (Unix ms).
/// With one instance per entry of `skews`, each with its job clock that many ms ahead
/// (`lockrt::testing::shift_job_clock`).
fn fleet<J, Fut>(
    skews: &[i64],
    name: &'static str,
    tick: Duration,
    opts: LockOptions,
    run_for: Duration,
    job: J,
) -> Log
where
    J: Fn(usize, Locker, u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let redis = RedisServer::start().unwrap();
    let log: Log = Arc::default();
    // Every instance stops at one wall-clock time, half a tick after a tick's start: a stop
    // that cancelled a run would (rightly) let a waiting instance run its tick again.
    let every_ms = tick.as_millis() as u64;
    let stop_ms = (tick_ms(SystemTime::now()) + run_for.as_millis() as u64) / every_ms * every_ms
        + every_ms / 2;
    let stop = UNIX_EPOCH + Duration::from_millis(stop_ms);
    let threads: Vec<_> = (0..skews.len())
        .map(|inst| {
            let (url, log, job) = (redis.url(), log.clone(), job.clone());
            let schedule = lockrt::testing::shift_job_clock(tick.into(), skews[inst]);
            std::thread::spawn(move || {
                rt().block_on(async move {
                    let locker = Locker::builder().url(&url).build().await.unwrap();
                    let l = locker.clone();
                    let runs = lockrt::every(&locker, name, schedule, opts, move |t| {
                        let (log, job, l) = (log.clone(), job.clone(), l.clone());
                        async move {
                            let t = tick_ms(t);
                            let note =
                                |what| log.lock().unwrap().entry(t).or_default().push((inst, what));
                            note("start");
                            job(inst, l, t).await;
                            note("end");
                        }
                    });
                    let left = stop.duration_since(SystemTime::now()).unwrap_or_default();
                    let r = tokio::time::timeout(left, runs).await;
                    locker.shutdown().await;
                    eprintln!("{name} instance {inst}: {r:?}");
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    log
}

/// The instance that runs a tick starts `locker.shutdown()` at the very end of its job (as a
/// SIGTERM arriving then would): the job finished, so the tick must not run again.
#[test]
fn a_shutdown_as_the_run_ends_does_not_rerun_the_tick() {
    let stopped = Arc::new(AtomicBool::new(false));
    let opts = LockOptions::new().ttl(ms(1000));
    let log = fleet(
        &[0; 2],
        "x1",
        ms(2000),
        opts,
        ms(5000),
        move |_, locker, _| {
            let stopped = stopped.clone();
            async move {
                tokio::time::sleep(ms(100)).await;
                if !stopped.swap(true, Ordering::SeqCst) {
                    // SIGTERM handler: graceful shutdown, right as the job returns.
                    tokio::spawn(async move { locker.shutdown().await });
                }
            }
        },
    );
    assert_eq!(report(&log, "x1"), 0);
}

/// max_hold below the job's duration: each run is cancelled at max_hold, and the tick counts
/// as done (it used to be freed, and every waiting instance ran the same tick in turn).
#[test]
fn a_job_cut_short_at_max_hold_is_started_once_per_tick() {
    let opts = LockOptions::new().ttl(ms(1000)).max_hold(ms(300));
    let log = fleet(&[0; 3], "x2", ms(3000), opts, ms(6500), |_, _, _| {
        tokio::time::sleep(ms(600))
    });
    report(&log, "x2");
    let starts: Vec<usize> = log
        .lock()
        .unwrap()
        .values()
        .map(|e| e.iter().filter(|(_, w)| *w == "start").count())
        .collect();
    assert!(starts.iter().all(|&n| n <= 1), "starts per tick {starts:?}");
}

/// The tick's claim is force-unlocked while the job runs: the run is cancelled, another
/// instance runs the tick, and the tick finishes once.
#[test]
fn a_run_whose_claim_is_lost_is_cancelled() {
    let forced = Arc::new(AtomicBool::new(false));
    let opts = LockOptions::new().ttl(ms(1000));
    let log = fleet(
        &[0; 2],
        "x5",
        ms(3000),
        opts,
        ms(7000),
        move |_, locker, _| {
            let forced = forced.clone();
            async move {
                if !forced.swap(true, Ordering::SeqCst) {
                    // The running tick's claim: the one claim not released (finished) yet.
                    let claims = locker.locks("x5:tick:*").await.unwrap();
                    let running = claims
                        .iter()
                        .find(|c| !c.released)
                        .expect("the running claim");
                    let r = locker.force_unlock(&running.key).await;
                    eprintln!("force_unlock claim {}: {r:?}", running.key);
                }
                tokio::time::sleep(ms(500)).await;
            }
        },
    );
    assert_eq!(report(&log, "x5"), 0);
}

/// Ticks shorter than a second, one instance's clock 600 ms ahead: its finished run's mark,
/// taken before the tick starts on the other's clock, is still this tick's (it was read as an
/// older tick's, and each tick ran twice: 6 of 6 in review).
#[test]
fn a_clock_ahead_by_more_than_a_short_tick_does_not_rerun_it() {
    let opts = LockOptions::new().ttl(ms(500));
    let log = fleet(&[600, 0], "x6", ms(500), opts, ms(4000), |_, _, _| {
        tokio::time::sleep(ms(20))
    });
    assert!(log.lock().unwrap().len() >= 4, "too few ticks ran");
    assert_eq!(report(&log, "x6"), 0);
}

/// `shutdown()` while a spawned job runs returns at once: it used to wait for the job, which
/// waited for shutdown's clean-ups, until the bound (2 s) ran out.
#[test]
fn shutdown_during_a_spawned_jobs_run_is_prompt() {
    let redis = RedisServer::start().unwrap();
    rt().block_on(async {
        let locker = Locker::builder().url(redis.url()).build().await.unwrap();
        let (tx, mut started) = tokio::sync::mpsc::unbounded_channel();
        let opts = LockOptions::new().ttl(ms(300));
        let job = lockrt::spawn_every(&locker, "x7", ms(2000), opts, move |_| {
            let _ = tx.send(());
            tokio::time::sleep(ms(600))
        })
        .unwrap();
        tokio::time::timeout(ms(5_000), started.recv())
            .await
            .unwrap();
        let start = std::time::Instant::now();
        locker.shutdown().await;
        let took = start.elapsed();
        assert!(took < ms(1_000), "shutdown took {took:?}");
        assert!(job.await.is_ok());
    });
}
