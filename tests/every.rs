//! `lockrt::every` at the edges a review found (several instances as threads with runtimes of
//! their own, each with its own locker, on one real redis-server): a shutdown right as a run
//! ends does not rerun the tick; a job longer than `max_hold` is not started once per instance
//! per tick; a run whose tick claim is force-unlocked is cancelled, so the tick finishes once.
use std::collections::BTreeMap;
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

/// The instance that runs a tick starts `locker.shutdown()` at the very end of its job (as a
/// SIGTERM arriving then would): the job finished, so the tick must not run again.
#[test]
fn a_shutdown_as_the_run_ends_does_not_rerun_the_tick() {
    let redis = RedisServer::start().unwrap();
    let url = redis.url();
    let log: Log = Arc::default();
    let trick = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for inst in 0..2 {
        let (url, log, trick) = (url.clone(), log.clone(), trick.clone());
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let locker = Locker::builder().url(&url).build().await.unwrap();
                let l = locker.clone();
                let h = tokio::spawn(async move {
                    let l2 = l.clone();
                    lockrt::every(
                        &l,
                        "x1",
                        ms(2000),
                        LockOptions::new().ttl(ms(1000)),
                        move |t| {
                            let (log, trick, l2) = (log.clone(), trick.clone(), l2.clone());
                            async move {
                                let t = tick_ms(t);
                                log.lock()
                                    .unwrap()
                                    .entry(t)
                                    .or_default()
                                    .push((inst, "start"));
                                tokio::time::sleep(ms(100)).await;
                                log.lock()
                                    .unwrap()
                                    .entry(t)
                                    .or_default()
                                    .push((inst, "end"));
                                if !trick.swap(true, Ordering::SeqCst) {
                                    // SIGTERM handler: graceful shutdown, right as the job returns.
                                    tokio::spawn(async move { l2.shutdown().await });
                                }
                            }
                        },
                    )
                    .await
                });
                let r = tokio::time::timeout(ms(5000), h).await;
                locker.shutdown().await;
                eprintln!("inst {inst}: {r:?}");
            })
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(report(&log, "x1"), 0);
}

/// max_hold below the job's duration: each run is cancelled at max_hold, and the tick counts
/// as done (it used to be freed, and every waiting instance ran the same tick in turn).
#[test]
fn a_job_cut_short_at_max_hold_is_started_once_per_tick() {
    let redis = RedisServer::start().unwrap();
    let url = redis.url();
    let log: Log = Arc::default();
    let mut threads = Vec::new();
    for inst in 0..3 {
        let (url, log) = (url.clone(), log.clone());
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let locker = Locker::builder().url(&url).build().await.unwrap();
                let l = locker.clone();
                let opts = LockOptions::new().ttl(ms(1000)).max_hold(ms(300));
                let h = tokio::spawn(async move {
                    lockrt::every(&l, "x2", ms(3000), opts, move |t| {
                        let log = log.clone();
                        async move {
                            let t = tick_ms(t);
                            log.lock()
                                .unwrap()
                                .entry(t)
                                .or_default()
                                .push((inst, "start"));
                            tokio::time::sleep(ms(600)).await;
                            log.lock()
                                .unwrap()
                                .entry(t)
                                .or_default()
                                .push((inst, "end"));
                        }
                    })
                    .await
                });
                tokio::time::sleep(ms(6500)).await;
                locker.shutdown().await;
                eprintln!("inst {inst}: {:?}", h.await);
            })
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
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
    let redis = RedisServer::start().unwrap();
    let url = redis.url();
    let log: Log = Arc::default();
    let trick = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for inst in 0..2 {
        let (url, log, trick) = (url.clone(), log.clone(), trick.clone());
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let locker = Locker::builder().url(&url).build().await.unwrap();
                let l = locker.clone();
                let h = tokio::spawn(async move {
                    let l2 = l.clone();
                    lockrt::every(
                        &l,
                        "x5",
                        ms(3000),
                        LockOptions::new().ttl(ms(1000)),
                        move |t| {
                            let (log, trick, l2) = (log.clone(), trick.clone(), l2.clone());
                            async move {
                                let tm = tick_ms(t);
                                log.lock()
                                    .unwrap()
                                    .entry(tm)
                                    .or_default()
                                    .push((inst, "start"));
                                if !trick.swap(true, Ordering::SeqCst) {
                                    let r = l2.force_unlock(&format!("x5:at:{tm}")).await;
                                    eprintln!("force_unlock claim: {r:?}");
                                }
                                tokio::time::sleep(ms(500)).await;
                                log.lock()
                                    .unwrap()
                                    .entry(tm)
                                    .or_default()
                                    .push((inst, "end"));
                            }
                        },
                    )
                    .await
                });
                tokio::time::sleep(ms(7000)).await;
                locker.shutdown().await;
                eprintln!("inst {inst}: {:?}", h.await);
            })
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(report(&log, "x5"), 0);
}
