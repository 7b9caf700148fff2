//! Faults of the lock holders themselves: a holder process frozen past its ttl that then
//! writes with its old fence, callers cancelled at random points of `acquire`, and a crowd of
//! waiters handed the lock one after another. Each test prints its measured figure
//! (`FIGURE ...`, quoted in RELIABILITY.md).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use lockrt::testing::{Direction, FaultProxy, RedisServer};
use lockrt::{LockOptions, Locker};
use support::history::{self, Oracle, Rng, Worker};
use support::proxy_faults::{direct, figure, leftovers, locker_via, ms_f, within};
use tokio::time::Instant;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---- a frozen holder writes with its old fence ---------------------------------------------

/// The holder process is frozen (SIGSTOP) past its ttl; meanwhile another holder takes the
/// lock and claims its fence at the oracle; then the frozen one resumes and writes with its old
/// fence, as a process that never noticed would. The fenced oracle must reject every such
/// write, and the new holder's fence must be above the old one.
fn frozen_holder_writes_with_old_fence(rounds: u32, case: &str) {
    let server = RedisServer::start().unwrap();
    let oracle_server = RedisServer::start().unwrap();
    let ns = format!("frozen-{}", history::mono_ns());
    let ttl = ms(300);
    let mut worker = Worker::spawn_interactive(
        "holder_worker",
        &[
            ("url", server.url()),
            ("oracle", oracle_server.url()),
            ("ns", ns.clone()),
            ("ttl", ttl.as_millis().to_string()),
            ("rounds", rounds.to_string()),
        ],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let other = rt.block_on(Locker::connect(&server.url())).unwrap();
    let mut oracle = Oracle::connect(&oracle_server.url(), &ns);
    let (mut accepted, mut rejected, mut takeover) = (0, 0, Duration::ZERO);
    for _ in 0..rounds {
        let line = worker.expect_line(ms(10_000));
        let old: u64 = line
            .strip_prefix("@HOLDING ")
            .and_then(|f| f.parse().ok())
            .unwrap_or_else(|| panic!("worker said {line:?}"));
        worker.freeze();
        let t = Instant::now();
        // The frozen holder can't renew: the lock frees itself after its lease.
        let g = rt
            .block_on(other.acquire("k", LockOptions::new().ttl(ms(5_000)).wait(ms(5_000))))
            .expect("the frozen holder's lease ran out");
        takeover = takeover.max(t.elapsed());
        assert!(g.fence() > old, "fence {} not above {old}", g.fence());
        assert!(oracle.claim(g.fence()), "the new holder's claim");
        rt.block_on(g.release()).unwrap();
        worker.resume();
        worker.send("WRITE");
        let line = worker.expect_line(ms(10_000));
        match line.as_str() {
            l if l == format!("@WROTE {old} true") => accepted += 1,
            l if l == format!("@WROTE {old} false") => rejected += 1,
            l => panic!("worker said {l:?}"),
        }
    }
    let out = worker.join(ms(10_000));
    figure(
        case,
        format!(
            "{rounds} holders frozen past their 300 ms ttl, then writing with the old fence: \
             {accepted} stale writes accepted, {rejected} rejected; next holder in after at \
             most {}",
            ms_f(takeover)
        ),
    );
    assert_eq!(accepted, 0, "stale writes accepted; worker output:\n{out}");
    assert_eq!(rejected, rounds);
}

#[test]
fn frozen_holder_writing_with_old_fence_is_rejected() {
    frozen_holder_writes_with_old_fence(3, "frozen_holder_writing_with_old_fence_is_rejected");
}

#[test]
#[ignore = "chaos: run with cargo xtask chaos"]
fn chaos_frozen_holder_writing_with_old_fence_is_rejected() {
    frozen_holder_writes_with_old_fence(
        20,
        "chaos_frozen_holder_writing_with_old_fence_is_rejected",
    );
}

/// The holder process of the test above: takes the lock, says so, waits for its cue, writes
/// with its fence whatever its guard says, reports the oracle's answer.
#[test]
#[ignore = "worker process of this file's tests: they start it"]
fn holder_worker() {
    let Some(cfg) = history::worker_settings() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ttl = ms(cfg["ttl"].parse().unwrap());
    let rounds: u32 = cfg["rounds"].parse().unwrap();
    let locker = rt.block_on(Locker::connect(&cfg["url"])).unwrap();
    let mut oracle = Oracle::connect(&cfg["oracle"], &cfg["ns"]);
    let stdin = std::io::stdin();
    for _ in 0..rounds {
        let g = rt
            .block_on(locker.acquire("k", LockOptions::new().ttl(ttl).wait(ms(5_000))))
            .unwrap();
        println!("@HOLDING {}", g.fence());
        let mut cue = String::new();
        stdin.read_line(&mut cue).unwrap();
        assert_eq!(cue.trim(), "WRITE");
        let accepted = oracle.claim(g.fence());
        println!("@WROTE {} {accepted}", g.fence());
        let _guard = rt.enter();
        drop(g);
    }
}

// ---- cancellation at random points -----------------------------------------------------------

/// `n` calls (`acquire`, `try_acquire`, `run`), each cancelled at a random point (a timeout
/// of 0-15 ms over a proxy adding 1 ms each way), half of them against a lock another locker
/// holds: afterwards no lock key, no queue entry, no waiter state in the `Locker` and no task
/// beyond the ones it had before are left.
async fn cancelled_at_random_points(n: u32, case: &str) {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::in_front_of(&server).unwrap();
    proxy.delay(Direction::ToServer, ms(1));
    proxy.delay(Direction::ToClient, ms(1));
    let locker = locker_via(&proxy, ms(500)).await;
    let holder = Locker::connect(&server.url()).await.unwrap();
    let mut conn = direct(&server).await;
    let ttl = ms(10_000);
    // Warm up every background part of both lockers (monitor, subscriber, their connections),
    // then count tasks.
    {
        let busy = holder.acquire("k", LockOptions::new()).await.unwrap();
        let _ = locker.acquire("k", LockOptions::new().wait(ms(50))).await;
        busy.release().await.unwrap();
        // The holder's waiting path too: its subscriber starts on its first wait.
        let mine = locker.acquire("k", LockOptions::new()).await.unwrap();
        let _ = holder.acquire("k", LockOptions::new().wait(ms(50))).await;
        mine.release().await.unwrap();
        locker.run("k", LockOptions::new(), async {}).await.unwrap();
    }
    let settled = |l: &Locker| {
        let s = l.stats();
        s.held == 0 && s.waiting == 0 && s.keys == 0 && s.listening == 0
    };
    within(ms(3_000), async || settled(&locker)).await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let baseline = metrics.num_alive_tasks();
    let mut rng = Rng::new(0x5eed);
    let mut outcomes = [0u32; 3];
    let mut blocked = 0u32;
    let start = Instant::now();
    for _ in 0..n {
        // Another process holds the lock half of the time. If it can't get it at once, a
        // cancelled call of ours left the lock behind (counted, and checked again at the end).
        let busy = if rng.chance(50) {
            match holder
                .acquire("k", LockOptions::new().ttl(ttl).wait(ms(300)))
                .await
            {
                Ok(g) => Some(g),
                Err(_) => {
                    blocked += 1;
                    None
                }
            }
        } else {
            None
        };
        let cancel = Duration::from_micros(rng.range(0, 15_000));
        let opts = LockOptions::new().ttl(ttl).wait(ms(rng.range(0, 40)));
        let res = match rng.range(0, 2) {
            0 => {
                tokio::time::timeout(cancel, async { locker.acquire("k", opts).await.map(drop) })
                    .await
            }
            1 => {
                tokio::time::timeout(cancel, async {
                    locker.try_acquire("k", opts).await.map(drop)
                })
                .await
            }
            _ => tokio::time::timeout(
                cancel,
                locker.run("k", opts, tokio::time::sleep(ms(rng.range(0, 3)))),
            )
            .await
            .map(|r| r.map(drop)),
        };
        outcomes[match res {
            Err(_) => 0,
            Ok(Ok(())) => 1,
            Ok(Err(_)) => 2,
        }] += 1;
        if let Some(b) = busy {
            b.release().await.unwrap();
        }
    }
    let elapsed = start.elapsed();
    let settle = within(ms(3_000), async || {
        leftovers(&mut conn, "k").await.is_empty()
            && settled(&locker)
            && settled(&holder)
            && metrics.num_alive_tasks() <= baseline
    })
    .await;
    let left = leftovers(&mut conn, "k").await;
    let stats = locker.stats();
    let extra = metrics.num_alive_tasks().saturating_sub(baseline);
    figure(
        case,
        format!(
            "{n} calls in {:.1} s, {} cancelled, {} completed, {} failed; another holder found \
             the lock orphaned {blocked} times; at the end {} keys left ({left:?}), locker \
             stats {stats:?}, {extra} extra tasks ({baseline} before, {} after); settled {}",
            elapsed.as_secs_f64(),
            outcomes[0],
            outcomes[1],
            outcomes[2],
            left.len(),
            metrics.num_alive_tasks(),
            settle.map_or("never (3 s)".into(), ms_f)
        ),
    );
    assert_eq!(blocked, 0, "cancelled calls left the lock held by nobody");
    assert!(left.is_empty(), "left in Redis: {left:?}");
    assert!(settled(&locker), "left in the locker: {stats:?}");
    assert!(
        settled(&holder),
        "left in the other locker: {:?}",
        holder.stats()
    );
    assert_eq!(extra, 0, "tasks left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_at_random_points_leave_nothing() {
    cancelled_at_random_points(100, "cancelled_at_random_points_leave_nothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_1000_cancelled_at_random_points_leave_nothing() {
    cancelled_at_random_points(1_000, "chaos_1000_cancelled_at_random_points_leave_nothing").await;
}

// ---- many waiters ----------------------------------------------------------------------------

/// `waiters` tasks over 4 lockers each take one lock `rounds` times: every waiter is served,
/// never two inside at once, and afterwards no release channel is subscribed, no lock key is
/// left, and once the lockers are dropped no connection of theirs remains.
async fn many_waiters(waiters: u32, rounds: u32, case: &str) {
    let server = RedisServer::start().unwrap();
    let mut conn = direct(&server).await;
    let clients = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("connected_clients")
    };
    let info = || redis::cmd("INFO").arg("clients").clone();
    let before = clients(info().query_async(&mut conn).await.unwrap());
    let mut lockers = Vec::new();
    for _ in 0..4 {
        lockers.push(Locker::connect(&server.url()).await.unwrap());
    }
    let inside = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicU32::new(0));
    let overlaps = Arc::new(AtomicU32::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..waiters {
        let locker = lockers[w as usize % lockers.len()].clone();
        let (inside, served, overlaps) = (inside.clone(), served.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            let mut longest = Duration::ZERO;
            for _ in 0..rounds {
                let t = Instant::now();
                let g = locker
                    .acquire("hot", LockOptions::new().ttl(ms(2_000)).wait(ms(60_000)))
                    .await
                    .expect("served within a minute");
                longest = longest.max(t.elapsed());
                if inside.swap(true, Ordering::SeqCst) {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                g.release().await.expect("release");
            }
            longest
        }));
    }
    let mut longest = Duration::ZERO;
    for t in tasks {
        longest = longest.max(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    let clean = within(ms(3_000), async || {
        support::numsub(&mut conn, "{lock:hot}:rel").await == 0
            && leftovers(&mut conn, "hot").await.is_empty()
    })
    .await;
    let subscribed = support::numsub(&mut conn, "{lock:hot}:rel").await;
    let left = leftovers(&mut conn, "hot").await;
    drop(lockers);
    let closed = within(ms(3_000), async || {
        clients(info().query_async(&mut conn).await.unwrap()) <= before
    })
    .await;
    let after = clients(info().query_async(&mut conn).await.unwrap());
    figure(
        case,
        format!(
            "{waiters} waiters x {rounds} = {} hand-offs in {:.2} s (longest wait {}): {} served, \
             {} overlaps; afterwards {subscribed} channels, {} keys, {} connections left",
            waiters * rounds,
            elapsed.as_secs_f64(),
            ms_f(longest),
            served.load(Ordering::SeqCst),
            overlaps.load(Ordering::SeqCst),
            left.len(),
            after.saturating_sub(before)
        ),
    );
    assert_eq!(served.load(Ordering::SeqCst), waiters * rounds);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    assert!(clean.is_some(), "{subscribed} channels and {left:?} left");
    assert!(closed.is_some(), "{} connections left", after - before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_100_hand_offs_200_all_served_nothing_left() {
    many_waiters(100, 2, "waiters_100_hand_offs_200_all_served_nothing_left").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_100_waiters_2000_hand_offs() {
    many_waiters(100, 20, "chaos_100_waiters_2000_hand_offs").await;
}
