//! `lockrt::every` on a cron schedule in a time zone, against a real redis-server: three
//! instances (threads with runtimes and lockers of their own) run a per-second cron in
//! Europe/Paris on a wall clock shifted (`testing::shift_job_clock`) to a few seconds before
//! the spring daylight-saving change, and across it: exactly one finished run per scheduled
//! second, none skipped at the jump (01:59:59 CET is followed by 03:00:00 CEST one second
//! later), none twice.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker, Schedule, Stop};

/// 2027-03-28T00:59:56Z (01:59:56 CET): four seconds before Paris jumps to 03:00 CEST.
const BEFORE_SPRING_MS: u64 = 1_806_195_596_000;
/// 01:00:00Z, 03:00:00 CEST: the first second after the jump.
const JUMP_MS: u64 = 1_806_195_600_000;

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

type Runs = Arc<Mutex<BTreeMap<u64, Vec<(usize, &'static str)>>>>;

#[test]
fn a_per_second_cron_runs_each_second_once_across_the_spring_change() {
    let redis = RedisServer::start().unwrap();
    // One offset for every instance: the job clock reads 01:59:56 CET now.
    let offset = BEFORE_SPRING_MS as i64 - unix_ms(SystemTime::now()) as i64;
    let each_second = Schedule::cron("* * * * * *", "Europe/Paris").unwrap();
    let schedule = lockrt::testing::shift_job_clock(each_second, offset);
    // Every instance stops, letting its run finish, once the job clock passes 03:00:04 CEST
    // (half a second into a tick), a real instant all of them share.
    let stop_at = UNIX_EPOCH + Duration::from_millis((JUMP_MS as i64 + 4_500 - offset) as u64);
    let runs: Runs = Arc::default();
    let threads: Vec<_> = (0..3)
        .map(|inst| {
            let (url, runs, schedule) = (redis.url(), runs.clone(), schedule.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let locker = Locker::builder().url(&url).build().await.unwrap();
                    let opts = LockOptions::new().ttl(Duration::from_millis(500));
                    let job = lockrt::spawn_every(&locker, "dst", schedule, opts, move |t| {
                        let runs = runs.clone();
                        async move {
                            let t = unix_ms(t);
                            let note =
                                |w| runs.lock().unwrap().entry(t).or_default().push((inst, w));
                            note("start");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            note("end");
                        }
                    })
                    .unwrap();
                    let left = stop_at
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    tokio::time::sleep(left).await;
                    job.stop(Stop::AfterRun).await.unwrap();
                    locker.shutdown().await;
                })
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let runs = runs.lock().unwrap();
    for (t, evs) in runs.iter() {
        eprintln!(
            "tick {t} ({:+} s from the jump): {evs:?}",
            (*t as i64 - JUMP_MS as i64) / 1000
        );
    }
    let first = *runs.keys().next().expect("runs");
    let last = *runs.keys().last().unwrap();
    assert!(first <= JUMP_MS - 2_000, "started late: {first}");
    assert!(last >= JUMP_MS + 3_000, "stopped early: {last}");
    // One finished run per second from the first to the last: across the jump too.
    for t in (first..=last).step_by(1000) {
        let ends = runs
            .get(&t)
            .map_or(0, |e| e.iter().filter(|(_, w)| *w == "end").count());
        assert_eq!(ends, 1, "tick {t}: {:?}", runs.get(&t));
    }
    assert_eq!(runs.len() as u64, (last - first) / 1000 + 1);
    assert!(runs.keys().all(|t| t % 1000 == 0));
}
