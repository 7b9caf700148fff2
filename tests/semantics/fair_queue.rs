//! The cross-process waiter queue: a release hands the lock straight to the longest waiter,
//! lockers take turns under contention, and waiters that leave or die don't block the lock.

use crate::support;

use std::sync::{Arc, Mutex};

use redis::AsyncCommands;
use support::{Fx, ms, opts, queued, until_queued};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_hands_the_lock_to_the_queued_waiter_atomically() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let g = a.acquire("hand", opts()).await.unwrap();
    let first = g.fence();
    // The task returns the guard itself: dropping it there would release the lock and race
    // the check below.
    let w = tokio::spawn(async move { b.acquire("hand", opts().wait(ms(5_000))).await });
    until_queued(&mut conn, "hand", 1).await;
    g.release().await.unwrap();
    // Already the waiter's when the release returns: no gap another client could take.
    let value: Option<String> = conn.get("lock:hand").await.unwrap();
    let value = value.expect("the lock was handed over, not freed");
    let held = w.await.unwrap().unwrap();
    let fence = held.fence();
    assert!(value.contains(':'), "{value}");
    let info = a.lock_info("hand").await.unwrap().expect("held");
    assert_eq!(info.fence, Some(fence), "the lock's value is the waiter's");
    assert!(fence > first);
    assert_eq!(queued(&mut conn, "hand").await, 0);
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_lease_is_extended_to_the_full_ttl() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let g = a.acquire("ext", opts()).await.unwrap();
    let w = tokio::spawn(async move {
        b.run("ext", opts().ttl(ms(30_000)).wait(ms(5_000)), async {
            // Past the 2 s grant lease: the watchdog must have extended it.
            tokio::time::sleep(ms(2_500)).await;
        })
        .await
    });
    until_queued(&mut conn, "ext", 1).await;
    g.release().await.unwrap();
    w.await
        .unwrap()
        .expect("held through the body without loss");
}

/// Without local hand-off, every release goes to the longest waiter of any process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lockers_take_turns_under_contention() {
    let longest = longest_run_of_one_locker(0).await;
    assert!(
        longest <= 2,
        "one locker held the lock {longest} times in a row"
    );
}

/// With local hand-off, a locker keeps the lock for at most `pass_limit` hand-offs after it
/// took it while the other locker waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_hand_offs_in_a_row_stay_within_the_pass_limit() {
    let longest = longest_run_of_one_locker(3).await;
    assert!(
        longest <= 4,
        "one locker held the lock {longest} times in a row with pass_limit 3"
    );
    assert!(
        longest >= 2,
        "no local hand-off happened: longest run {longest}"
    );
}

/// Two lockers with 4 tasks each contending for one key; the longest run of sections by one
/// locker while both had waiters.
async fn longest_run_of_one_locker(pass_limit: u32) -> usize {
    let fx = Fx::redis();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    // Both lockers connected and all tasks started before the first section: a locker still
    // connecting has no waiters, and the other rightly runs on meanwhile.
    let start = Arc::new(tokio::sync::Barrier::new(8));
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let builder = lockrt::Locker::builder().local_handoff(pass_limit);
        lockers.push(fx.locker_with(builder).await);
    }
    for (id, locker) in lockers.into_iter().enumerate() {
        for _ in 0..4 {
            let (locker, order, start) = (locker.clone(), order.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                for _ in 0..15 {
                    locker
                        .run("turns", opts().wait(ms(30_000)), async {
                            order.lock().unwrap().push(id);
                            tokio::time::sleep(ms(1)).await;
                        })
                        .await
                        .unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap();
    // While both lockers have waiters, every release hands over to the other one.
    let mut longest = 0;
    let mut run = 0;
    for (i, id) in order.iter().enumerate() {
        run = if i > 0 && order[i - 1] == *id {
            run + 1
        } else {
            1
        };
        if i > 4 && i < order.len() - 8 {
            longest = longest.max(run);
        }
    }
    eprintln!("pass_limit {pass_limit}: longest run {longest}: {order:?}");
    longest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue_and_gets_nothing() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let g = a.acquire("quit", opts()).await.unwrap();
    let w =
        tokio::spawn(async move { b.acquire("quit", opts().wait(ms(10_000))).await.map(|_| ()) });
    until_queued(&mut conn, "quit", 1).await;
    w.abort();
    let _ = w.await;
    g.release().await.unwrap();
    // Freed (or handed to the departed waiter and released by its cleanup) at once.
    assert!(fx.gone_within("quit", ms(200)).await.is_some());
    until_queued(&mut conn, "quit", 0).await;
    let leftovers: Vec<String> = conn.keys("{lock:quit}:[qw]").await.unwrap();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_blocks_the_lock_only_for_its_short_grant_lease() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let g = a.acquire("dead", opts()).await.unwrap();
    // A waiter of a process that has crashed: registered, never coming back.
    let now_ms = support::wall_ms();
    let ghost = "deadbeefdeadbeefdeadbeefdeadbeef";
    let () = conn.zadd("{lock:dead}:q", ghost, 1).await.unwrap();
    let () = conn
        .hset("{lock:dead}:w", ghost, format!("{}:500", now_ms + 2_000))
        .await
        .unwrap();
    g.release().await.unwrap();
    let value: String = conn.get("lock:dead").await.unwrap();
    assert!(
        value.starts_with(ghost),
        "handed to the queued (dead) waiter"
    );
    let start = Instant::now();
    let g2 = b
        .acquire("dead", opts().wait(ms(5_000)))
        .await
        .expect("acquired after the grant lapsed");
    assert!(
        start.elapsed() < ms(1_500),
        "blocked {:?} by a dead waiter",
        start.elapsed()
    );
    g2.release().await.unwrap();
}

/// A grant message that arrives after its lease could have run out (or a forged one) must not
/// make a waiter a second holder: a waiter accepts only a grant whose fence is above the
/// fencing counter its own attempts saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grant_message_does_not_make_a_second_holder() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    let g = a.acquire("stale", opts()).await.unwrap();
    let mut w = tokio::spawn(async move { b.acquire("stale", opts().wait(ms(5_000))).await });
    until_queued(&mut conn, "stale", 1).await;
    support::until_subscribed(&mut conn, "stale", 1).await;
    let tokens: Vec<String> = conn.zrange("{lock:stale}:q", 0, 0).await.unwrap();
    // A grant to the waiter with the current holder's fence (the counter's value when the
    // holder took it): older than what it has seen.
    let counter: u64 = conn.hget("{lock:stale}:state", "n").await.unwrap();
    let stale = format!("g:{}:{counter}", tokens[0]);
    let receivers: u64 = conn.publish("{lock:stale}:rel", stale).await.unwrap();
    assert_eq!(receivers, 1);
    assert!(
        tokio::time::timeout(ms(300), &mut w).await.is_err(),
        "the waiter took a stale grant while the lock is held"
    );
    let first = g.fence();
    g.release().await.unwrap();
    let held = w.await.unwrap().expect("acquired after the real release");
    assert!(held.fence() > first);
}

mod queue_dead_registrations {
    //! The cross-process waiter queue stays first-come first-served however many dead
    //! registrations (waiters of crashed processes, whose registration lapsed) lie ahead of a live
    //! waiter: a newcomer never takes a lock promised to the live waiter behind them.

    use super::support;

    use lockrt::testing::{Direction, FaultProxy};
    use lockrt::{LockOptions, Locker};
    use redis::AsyncCommands;
    use support::{Fx, ms, opts, until_queued, until_subscribed};

    /// Prints a measured figure: `FIGURE <case>: <text>`.
    fn figure(case: &str, text: impl std::fmt::Display) {
        println!("FIGURE {case}: {text}");
    }

    /// Registrations of waiters that died before `n` live ones arrived: queued first, lapsed.
    async fn dead_registrations(conn: &mut redis::aio::MultiplexedConnection, key: &str, n: usize) {
        let lapsed_ms = support::wall_ms() - 10_000;
        let mut pipe = redis::pipe();
        for i in 0..n {
            let token = format!("{i:032x}");
            pipe.zadd(format!("{{lock:{key}}}:q"), &token, i + 1)
                .ignore()
                .hset(
                    format!("{{lock:{key}}}:w"),
                    &token,
                    format!("{lapsed_ms}:2000"),
                )
                .ignore();
        }
        let () = pipe.query_async(conn).await.unwrap();
    }

    /// 300 dead registrations, then a live waiter (a locker whose requests are slowed, so the
    /// newcomer is first to try after the release): the newcomer's `try_acquire` is refused and
    /// the live waiter gets the lock.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_newcomer_does_not_jump_a_waiter_behind_many_dead_registrations() {
        let mut fx = Fx::redis();
        let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
        let holder = fx.locker().await;
        let newcomer = fx.locker().await;
        let waiter = Locker::builder()
            .url(proxy.url())
            .build()
            .await
            .expect("locker behind the proxy");
        let mut conn = fx.conn().await;
        let held = holder.acquire("fifo", opts()).await.unwrap();
        let first = held.fence();
        dead_registrations(&mut conn, "fifo", 300).await;
        let w = waiter.clone();
        let waited = tokio::spawn(async move { w.acquire("fifo", opts().wait(ms(10_000))).await });
        until_queued(&mut conn, "fifo", 301).await;
        until_subscribed(&mut conn, "fifo", 1).await;
        // The live waiter's next request reaches Redis 300 ms after it is sent (its
        // registration lives 2 s).
        proxy.delay(Direction::ToServer, ms(300));
        held.release().await.unwrap();
        let jumped = newcomer
            .try_acquire("fifo", LockOptions::new())
            .await
            .unwrap();
        let jumped_fence = jumped.as_ref().map(|g| g.fence());
        drop(jumped);
        proxy.delay(Direction::ToServer, ms(0));
        let got = waited.await.unwrap();
        figure(
            "a_newcomer_does_not_jump_a_waiter_behind_many_dead_registrations",
            format!(
                "300 dead registrations ahead of a live waiter: the newcomer's try_acquire {}; \
                 the waiter {}",
                match jumped_fence {
                    Some(f) => format!("took the lock (fence {f})"),
                    None => "was refused".to_owned(),
                },
                match &got {
                    Ok(g) => format!("got fence {}", g.fence()),
                    Err(e) => format!("failed: {e}"),
                }
            ),
        );
        assert_eq!(jumped_fence, None, "the newcomer jumped the queue");
        let got = got.expect("the waiter gets the lock");
        assert!(got.fence() > first);
        got.release().await.unwrap();
        let left: usize = conn.zcard("{lock:fifo}:q").await.unwrap();
        assert_eq!(left, 0, "dead registrations left behind");
    }
}

/// Waits (bounded) until `locker` has `n` callers waiting.
async fn until_waiting(locker: &lockrt::Locker, n: usize) {
    support::settle(
        async || locker.stats().waiting == n,
        &format!("never saw {n} waiting caller(s)"),
    )
    .await;
}

/// A section ending while a caller of the same locker waits passes the lock in the process:
/// the lock stays as it is in Redis (no release, no grant), the next holder's fence is the
/// next one; the last holder's release frees the lock in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_hand_off_leaves_the_lock_in_redis_and_gives_the_next_fence() {
    let fx = Fx::redis();
    let a = fx.locker().await;
    let mut conn = fx.conn().await;
    let g = a.acquire("local", opts()).await.unwrap();
    let w = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("local", opts().wait(ms(5_000))).await })
    };
    until_waiting(&a, 1).await;
    let value: String = conn.get("lock:local").await.unwrap();
    let first = g.fence();
    let before = a.lock_info("local").await.unwrap().unwrap();
    let taken = before.holder.as_ref().unwrap();
    assert_eq!((before.fence, taken.handoff), (Some(first), 0));
    // `release` returns once the passing holder's check is done, and that check names the
    // holder it passed the lock to in the owner record.
    g.release().await.unwrap();
    let next = w.await.unwrap().unwrap();
    let still: String = conn.get("lock:local").await.unwrap();
    assert_eq!(still, value, "the lock was released or granted in Redis");
    assert_eq!(next.fence(), first + 1);
    let info = a
        .lock_info("local")
        .await
        .unwrap()
        .expect("still held in Redis");
    let now = info.holder.as_ref().unwrap();
    assert_eq!(
        (info.fence, now.handoff),
        (Some(next.fence()), 1),
        "inspection names the holder running now"
    );
    assert_eq!(now.instance_id, taken.instance_id);
    assert!(now.acquired_at_ms >= taken.acquired_at_ms);
    next.release().await.unwrap();
    assert!(a.lock_info("local").await.unwrap().is_none(), "freed");
}

/// The waiter a lock was passed to is never polled again (its runtime's only thread blocks at
/// the hand-off, then the runtime shuts down): the lock is released in Redis within
/// milliseconds (another process gets it), not left until its lease runs out. Returns how long
/// the other process waited.
fn stranded_by_waiter_runtime(pass_limit: u32, ttl: std::time::Duration) -> std::time::Duration {
    let main_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = lockrt::testing::RedisServer::start().unwrap();
    let url = server.url();
    let (a, b, h) = main_rt.block_on(async {
        let a = lockrt::Locker::builder()
            .url(url.clone())
            .local_handoff(pass_limit)
            .build()
            .await
            .unwrap();
        let b = lockrt::Locker::connect(&url).await.unwrap();
        let h = a.acquire("k", opts().ttl(ttl)).await.unwrap();
        (a, b, h)
    });
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (released_tx, released_rx) = std::sync::mpsc::channel::<()>();
    let a2 = a.clone();
    let t = std::thread::spawn(move || {
        let rt2 = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt2.block_on(async move {
            let a3 = a2.clone();
            let _w = tokio::spawn(async move { a3.acquire("k", opts().wait(ms(20_000))).await });
            while a2.stats().waiting == 0 {
                tokio::task::yield_now().await;
            }
            ready_tx.send(()).unwrap();
            // The runtime's only thread blocks: W is woken by the hand-off, never polled.
            released_rx.recv().unwrap();
        });
        drop(rt2);
    });
    ready_rx.recv().unwrap();
    let waited = main_rt.block_on(async {
        h.release().await.unwrap();
        released_tx.send(()).unwrap();
        t.join().unwrap();
        tokio::time::sleep(ms(20)).await;
        let s = Instant::now();
        let g = b.acquire("k", opts().wait(ms(20_000))).await.unwrap();
        let waited = s.elapsed();
        drop(g);
        waited
    });
    main_rt.shutdown_timeout(ms(500));
    waited
}

#[test]
fn a_waiter_that_never_runs_again_at_the_hand_off_leaves_no_lock_behind() {
    let without = stranded_by_waiter_runtime(0, ms(5_000));
    let with = stranded_by_waiter_runtime(16, ms(5_000));
    assert!(without < ms(1_000), "without local hand-off: {without:?}");
    assert!(with < ms(1_000), "the lock stayed in Redis for {with:?}");
}

/// A holder that got the lock by local hand-off is revoked by a forced unlock like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_unlock_revokes_a_local_successor() {
    let fx = Fx::redis();
    let (a, ops) = (fx.locker().await, fx.locker().await);
    let g = a.acquire("revoked", opts().ttl(ms(10_000))).await.unwrap();
    let w = {
        let a = a.clone();
        tokio::spawn(async move { a.acquire("revoked", opts().wait(ms(5_000))).await })
    };
    until_waiting(&a, 1).await;
    g.release().await.unwrap();
    let next = w.await.unwrap().unwrap();
    assert!(ops.force_unlock("revoked").await.unwrap());
    let start = Instant::now();
    tokio::time::timeout(ms(2_000), next.lost())
        .await
        .expect("the successor learns it lost the lock");
    assert!(start.elapsed() < ms(1_000), "took {:?}", start.elapsed());
}

/// The lock is lost silently while its holder runs (deleted behind its back, as a restarted
/// server without its data would) and another process takes it: the waiter of the holder's
/// locker is passed the lease and starts at once, and the check of that hand-off, out at the
/// same moment, finds the lock gone: the successor is told `Lost` (`HandOffCheck`) within a
/// round trip, never reports its section a success, and the holder's release reports the loss
/// too. Nothing of the other process's lock is released; the next holder takes the lock from
/// Redis with a fence above that one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_successor_on_a_lock_lost_before_the_hand_off_is_told_lost() {
    let fx = Fx::redis();
    let (a, b) = (fx.locker().await, fx.locker().await);
    let mut conn = fx.conn().await;
    // Listening for forced unlocks already: the check run once a locker starts listening
    // would find the loss before the release does (no hand-off then, rightly).
    let _warm = support::warm_up(&a, &mut conn).await;
    let g = a.acquire("gone", opts().ttl(ms(10_000))).await.unwrap();
    let w = {
        let a = a.clone();
        // The same ttl as the holder's: only such a caller is passed the lease.
        let same = opts().ttl(ms(10_000)).wait(ms(10_000));
        tokio::spawn(async move {
            let g = a.acquire("gone", same).await.unwrap();
            let started = Instant::now();
            let told = tokio::time::timeout(ms(2_000), g.lost()).await.is_ok();
            (g.fence() % 32, started.elapsed(), told, g.release().await)
        })
    };
    until_waiting(&a, 1).await;
    let () = conn.del("lock:gone").await.unwrap();
    let other = b.acquire("gone", opts().ttl(ms(10_000))).await.unwrap();
    let err = g
        .release()
        .await
        .expect_err("the release finds the lock lost");
    assert!(err.is_lost(), "{err:?}");
    let (local, took, told, released) = w.await.unwrap();
    assert_eq!(local, 1, "the successor was passed the lease");
    assert!(told, "the successor was not told of the loss");
    assert!(took < ms(1_000), "told after {took:?}");
    match released {
        Err(lockrt::LockError::Lost { cause, .. }) => {
            assert_eq!(cause, lockrt::LossCause::HandOffCheck)
        }
        other => panic!("the successor's release: {other:?}"),
    }
    // The other process's lock is untouched.
    assert_eq!(
        support::holder_fence_of_value(&conn.get::<_, String>("lock:gone").await.unwrap()),
        other.fence(),
    );
    let other_fence = other.fence();
    other.release().await.unwrap();
    let next = a.acquire("gone", opts().ttl(ms(10_000))).await.unwrap();
    assert!(
        next.fence() > other_fence,
        "{} <= {other_fence}",
        next.fence()
    );
    next.release().await.unwrap();
}

/// Holders of two lockers, 4 tasks each, local hand-offs on: in the order they held the lock,
/// no two sections overlap, fences strictly increase, and no update is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_increase_across_local_and_remote_holders() {
    let fx = Fx::redis();
    let held = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locker = fx
            .locker_with(lockrt::Locker::builder().local_handoff(4))
            .await;
        for _ in 0..4 {
            let (locker, held, mut conn) = (locker.clone(), held.clone(), fx.conn().await);
            tasks.push(tokio::spawn(async move {
                for _ in 0..12 {
                    let g = locker
                        .acquire("mixed", opts().wait(ms(30_000)))
                        .await
                        .unwrap();
                    let start = Instant::now();
                    let n: u64 = conn.get("count").await.unwrap_or(0);
                    let () = conn.set("count", n + 1).await.unwrap();
                    held.lock()
                        .unwrap()
                        .push((start, Instant::now(), g.fence()));
                    g.release().await.unwrap();
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut held = held.lock().unwrap().clone();
    held.sort_by_key(|h| h.0);
    let local = held.windows(2).filter(|w| w[1].2 == w[0].2 + 1).count();
    for w in held.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlapping sections: {w:?}");
        assert!(w[1].2 > w[0].2, "fence order: {w:?}");
    }
    let mut conn = fx.conn().await;
    let count: u64 = conn.get("count").await.unwrap();
    assert_eq!(count, 96, "lost updates");
    assert!(local > 0, "no local hand-off happened");
}

both! {
    /// After a local hand-off, inspection names the holder running now (its fence and place in
    /// the run), on Redis and in memory alike.
    async fn inspection_names_the_local_holder_running_now(fx) {
        let a = fx.locker().await;
        let g = a.acquire("named", opts()).await.unwrap();
        let w = {
            let a = a.clone();
            tokio::spawn(async move { a.acquire("named", opts().wait(ms(5_000))).await })
        };
        until_waiting(&a, 1).await;
        g.release().await.unwrap();
        let next = w.await.unwrap().unwrap();
        let info = a.lock_info("named").await.unwrap().expect("held");
        let handoff = info.holder.as_ref().map(|h| h.handoff);
        assert_eq!((info.fence, handoff), (Some(next.fence()), Some(1)));
        next.release().await.unwrap();
    }
}
