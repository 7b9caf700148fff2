//! `lockrt::spawn_every` and its `JobHandle` against a real redis-server, two instances (two
//! lockers): `Stop::Now` while a run is under way cancels it and the other instance runs that
//! tick; `Stop::AfterRun` lets the run finish and nobody runs the tick again; the finished
//! tick's claim is not listed as a held lock; `shutdown()` ends a spawned job and waits for it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::testing::RedisServer;
use lockrt::{JobHandle, LockOptions, Locker, Stop};
use tokio::sync::mpsc;

/// What a run did: its instance, `start`/`end`, its tick (Unix ms).
type Event = (usize, &'static str, u64);

const TICK: Duration = Duration::from_millis(2_000);
const LIMIT: Duration = Duration::from_secs(15);

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Two instances of job `name` (tick 2 s, ttl 1 s), each run taking `work`; their lockers and
/// handles, and the runs' events.
async fn pair(
    redis: &RedisServer,
    name: &'static str,
    work: Duration,
) -> (Vec<Locker>, Vec<JobHandle>, mpsc::UnboundedReceiver<Event>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut lockers = vec![];
    let mut handles = vec![];
    for inst in 0..2 {
        let locker = Locker::builder().url(redis.url()).build().await.unwrap();
        let tx = tx.clone();
        let opts = LockOptions::new().ttl(Duration::from_millis(1_000));
        let job = lockrt::spawn_every(&locker, name, TICK, opts, move |t| {
            let tx = tx.clone();
            async move {
                let t = unix_ms(t);
                let _ = tx.send((inst, "start", t));
                tokio::time::sleep(work).await;
                let _ = tx.send((inst, "end", t));
            }
        })
        .unwrap();
        lockers.push(locker);
        handles.push(job);
    }
    (lockers, handles, rx)
}

/// The next event, within the test's limit.
async fn next(rx: &mut mpsc::UnboundedReceiver<Event>, deadline: tokio::time::Instant) -> Event {
    tokio::time::timeout_at(deadline, rx.recv())
        .await
        .expect("an event within the limit")
        .expect("instances running")
}

/// The events up to the first one `done` accepts, that one included.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<Event>,
    deadline: tokio::time::Instant,
    done: impl Fn(Event) -> bool,
) -> Vec<Event> {
    let mut events = vec![];
    loop {
        let e = next(rx, deadline).await;
        events.push(e);
        if done(e) {
            return events;
        }
    }
}

/// Stops the jobs left and shuts the lockers down.
async fn end(handles: Vec<JobHandle>, lockers: Vec<Locker>) {
    for h in handles {
        h.stop(Stop::Now).await.unwrap();
    }
    for l in lockers {
        l.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_now_cancels_the_run_and_the_other_instance_runs_its_tick() {
    let redis = RedisServer::start().unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let (lockers, mut handles, mut rx) = pair(&redis, "h1", Duration::from_millis(600)).await;
    let (runner, what, tick) = next(&mut rx, deadline).await;
    assert_eq!(what, "start");
    let stopped = handles.remove(runner);
    stopped.stop(Stop::Now).await.unwrap();
    // The other instance, still waiting for the tick, runs it to its end.
    let events = until(&mut rx, deadline, |e| e.1 == "end" && e.2 == tick).await;
    eprintln!("runner {runner}, tick {tick}: then {events:?}");
    assert!(
        events.iter().all(|&(i, ..)| i != runner),
        "the stopped instance ran on: {events:?}"
    );
    assert_eq!(events[0], (1 - runner, "start", tick), "{events:?}");
    // Before its mark ends, the finished tick's claim is no held lock.
    let other = &lockers[1 - runner];
    let held = other.locks("h1:tick:*").await.unwrap();
    assert!(held.is_empty(), "{held:?}");
    let kept = other.locks_with_released("h1:tick:*").await.unwrap();
    assert!(kept.iter().any(|c| c.released), "{kept:?}");
    end(handles, lockers).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_run_lets_the_run_finish_and_nobody_reruns_its_tick() {
    let redis = RedisServer::start().unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let (lockers, mut handles, mut rx) = pair(&redis, "h2", Duration::from_millis(600)).await;
    let (runner, what, tick) = next(&mut rx, deadline).await;
    assert_eq!(what, "start");
    let stopped = handles.remove(runner);
    stopped.stop(Stop::AfterRun).await.unwrap();
    // Its run had finished when stop returned.
    assert_eq!(rx.try_recv(), Ok((runner, "end", tick)));
    // The other instance runs the next tick, not this one again.
    let events = until(&mut rx, deadline, |e| e.1 == "end" && e.2 > tick).await;
    eprintln!("runner {runner}, tick {tick}: then {events:?}");
    assert!(
        events.iter().all(|&(i, _, t)| i != runner && t > tick),
        "{events:?}"
    );
    assert_eq!(events[0].2, tick + TICK.as_millis() as u64, "{events:?}");
    end(handles, lockers).await;
}

/// `shutdown()` ends a spawned job (its run cancelled: the locker's locks end), and the handle
/// resolves with `Ok`; the cancelled run's tick is run by the other instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_a_spawned_job_and_waits_for_it() {
    let redis = RedisServer::start().unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    let (lockers, handles, mut rx) = pair(&redis, "h3", Duration::from_secs(5)).await;
    let (runner, _, tick) = next(&mut rx, deadline).await;
    lockers[runner].shutdown().await;
    let mut handles = handles;
    let job = handles.remove(runner);
    // Ended with the shutdown (the task's last step, handing its result over, may still be
    // under way: a moment, not the 5 s run).
    let ended = tokio::time::timeout(Duration::from_millis(500), job).await;
    assert!(matches!(ended, Ok(Ok(()))), "{ended:?}");
    // Its run was cut short, so the other instance runs the tick.
    let events = until(&mut rx, deadline, |e| e.1 == "start").await;
    assert_eq!(events, [(1 - runner, "start", tick)]);
    end(handles, lockers).await;
}
