//! Regression tests for the double-holder, orphan and panic defects found by adversarial
//! probes (issue 10). Each test names the defect it closes and fails on the runtime before the
//! fix; the fault-proxy and multi-process cases live in `faults_*.rs` and `chaos_*.rs`.

use crate::support;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockOptions, Locker};
use redis::AsyncCommands;
use support::{Fx, ms, opts};
use tokio::time::Instant;

/// Defect 1: a short-ttl waiter handed a grant runs its body; it never gets a guard whose
/// deadline has already passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d01_short_ttl_hand_off_runs_the_waiters_body() {
    let fx = Fx::redis();
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let short = opts().ttl(ms(200)).wait(ms(5_000));
    for round in 0..10 {
        let guard = holder.acquire("short", short).await.unwrap();
        let w = waiter.clone();
        let body_ran = tokio::spawn(async move {
            w.run("short", short, async {
                tokio::time::sleep(ms(250)).await;
                "ran"
            })
            .await
        });
        let mut conn = fx.conn().await;
        support::until_queued(&mut conn, "short", 1).await;
        // Hold long enough for the waiter's last busy attempt to be old when the grant comes.
        tokio::time::sleep(ms(150 + 20 * round)).await;
        guard.release().await.unwrap();
        let res = body_ran.await.unwrap();
        assert_eq!(
            res.unwrap(),
            "ran",
            "round {round}: the granted waiter lost at once"
        );
    }
}

/// Defect 2: a stale grant is rejected even when the fencing counter is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d02_stale_grant_with_missing_counter_is_not_used() {
    let fx = Fx::redis();
    let holder = fx.locker().await;
    let waiter = fx.locker().await;
    let mut conn = fx.conn().await;
    let guard = holder
        .acquire("stale", opts().ttl(ms(2_000)))
        .await
        .unwrap();
    let () = conn.del("{lock:stale}:state").await.unwrap();
    let w = waiter.clone();
    let got = tokio::spawn(async move {
        let g = w.acquire("stale", opts().wait(ms(10_000))).await.unwrap();
        let fence = g.fence();
        g.release().await.unwrap();
        fence
    });
    support::until_queued(&mut conn, "stale", 1).await;
    support::until_subscribed(&mut conn, "stale", 1).await;
    let tokens: Vec<String> = conn.zrange("{lock:stale}:q", 0, -1).await.unwrap();
    // A grant message from long ago: fence 1 is below anything the counter ever issued.
    let () = conn
        .publish("{lock:stale}:rel", format!("g:{}:1", tokens[0]))
        .await
        .unwrap();
    tokio::time::sleep(ms(300)).await;
    assert!(
        !got.is_finished(),
        "the waiter took a stale grant while another owner held"
    );
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    let fence = tokio::time::timeout(ms(3_000), got).await.unwrap().unwrap();
    assert!(fence > 1, "the waiter holds a real, fresh fence ({fence})");
}

/// Defect 3: a nested section's future awaited after the outer section ended fails with
/// `Lost` instead of running unlocked.
// The section returns a future on purpose: that is the defect's shape.
#[allow(clippy::async_yields_async)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d03_nested_future_outliving_its_section_is_lost_not_unlocked() {
    for fx in [Fx::redis(), Fx::memory()] {
        let locker = fx.locker().await;
        let other = fx.locker().await;
        let l2 = locker.clone();
        let nested = locker
            .run("re", opts(), async move {
                let mut nested = Box::pin(async move {
                    l2.run("re", opts(), async {
                        tokio::time::sleep(ms(10)).await;
                        lockrt::current_lock().is_some()
                    })
                    .await
                });
                // Polled once inside the section: it took the reentrant path.
                tokio::select! {
                    biased;
                    _ = &mut nested => panic!("finished inside"),
                    () = std::future::ready(()) => {}
                }
                nested
            })
            .await
            .unwrap();
        let held_elsewhere = other.acquire("re", opts()).await.unwrap();
        let res = nested.await;
        assert!(
            res.unwrap_err().is_lost(),
            "the nested body ran without the lock"
        );
        held_elsewhere.release().await.unwrap();
    }
}

/// Defect 5: a lock key overwritten with another type loses only its own lease, not the
/// whole renewal batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d05_poisoned_key_loses_only_its_own_lease() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    let o = opts().ttl(ms(600));
    let (a, b, c) = tokio::join!(
        locker.acquire("pa", o),
        locker.acquire("pb", o),
        locker.acquire("pc", o)
    );
    let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
    let () = conn.del("lock:pb").await.unwrap();
    let () = conn.rpush("lock:pb", "not a lock").await.unwrap();
    tokio::time::timeout(ms(1_000), b.lost())
        .await
        .expect("the poisoned lease is lost");
    tokio::time::sleep(ms(1_200)).await;
    assert!(
        !a.is_lost() && !c.is_lost(),
        "a poisoned key took its batch down"
    );
    assert!(fx.pttl("pa").await.is_some() && fx.pttl("pc").await.is_some());
    a.release().await.unwrap();
    c.release().await.unwrap();
}

/// Defect 7: a locker keeps working after the runtime of its first acquire is gone.
#[test]
fn d07_locker_works_from_a_second_runtime() {
    let server = RedisServer::start().unwrap();
    let rt = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = rt();
    let locker = first.block_on(async {
        let locker = Locker::connect(&server.url()).await.unwrap();
        let g = locker.acquire("rt", opts()).await.unwrap();
        g.release().await.unwrap();
        locker
    });
    drop(first);
    rt().block_on(async {
        let g = locker.acquire("rt", opts().ttl(ms(600))).await.unwrap();
        tokio::time::sleep(ms(1_500)).await;
        assert!(
            !g.is_lost(),
            "reported lost: the watchdog died with the first runtime"
        );
        g.release().await.unwrap();
        let out = locker
            .run("rt2", opts().wait(ms(500)), async { 5 })
            .await
            .unwrap();
        assert_eq!(out, 5);
    });
}

/// Defect 8: no `Duration` value panics; huge waits mean forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d08_huge_durations_do_not_panic() {
    for fx in [Fx::redis(), Fx::memory()] {
        let locker = fx.locker().await;
        let huge = opts()
            .ttl(Duration::MAX)
            .wait(Duration::MAX)
            .max_hold(Duration::MAX);
        let g = locker.acquire("huge", huge).await.unwrap();
        assert!(fx.pttl("huge").await.is_some());
        let l2 = fx.locker().await;
        let waiter = tokio::spawn(async move { l2.acquire("huge", huge).await.map(|g| g.fence()) });
        tokio::time::sleep(ms(100)).await;
        assert!(!waiter.is_finished(), "a Duration::MAX wait waits");
        g.release().await.unwrap();
        assert!(
            tokio::time::timeout(ms(3_000), waiter)
                .await
                .unwrap()
                .unwrap()
                .is_ok()
        );
        let b = Locker::builder()
            .default_ttl(Duration::MAX)
            .default_wait(Duration::MAX)
            .safety_margin(Duration::MAX)
            .response_timeout(Duration::MAX)
            .connect_timeout(Duration::MAX)
            .fence_retention(Duration::MAX);
        let l = match &fx {
            Fx::Redis(s) => b.url(s.url()).build().await.unwrap(),
            Fx::Memory(_) => Locker::in_memory_with(b),
        };
        assert_eq!(l.run("huge2", opts(), async { 1 }).await.unwrap(), 1);
    }
}

/// Defect 9: `max_hold` ends a hung body's hold; the watchdog stops renewing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d09_max_hold_bounds_holding() {
    for fx in [Fx::redis(), Fx::memory()] {
        let locker = fx.locker().await;
        let start = Instant::now();
        let res = locker
            .run("hung", opts().ttl(ms(300)).max_hold(ms(700)), async {
                tokio::time::sleep(ms(5_000)).await;
            })
            .await;
        let took = start.elapsed();
        println!(
            "FIGURE d09_max_hold_bounds_holding: ttl 300 ms, max_hold 700 ms: body stopped with Lost after {took:?}"
        );
        assert!(res.unwrap_err().is_lost());
        assert!(took >= ms(600) && took < ms(1_500), "ended after {took:?}");
        let g = locker
            .acquire("forgotten", opts().ttl(ms(300)).max_hold(ms(500)))
            .await
            .unwrap();
        tokio::time::timeout(ms(2_000), g.lost())
            .await
            .expect("told it lost");
        let gone = fx.gone_within("forgotten", ms(1_000)).await;
        assert!(gone.is_some(), "renewed after max_hold");
        drop(g);
    }
}

/// Defect 10: a task holding a key through a guard never waits for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d10_guard_held_key_fails_at_once_in_its_own_task() {
    for fx in [Fx::redis(), Fx::memory()] {
        let locker = fx.locker().await;
        let g = locker.acquire("self", opts()).await.unwrap();
        let start = Instant::now();
        let err = locker
            .run("self", opts().wait(ms(5_000)), async {})
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::HeldByThisTask { .. }), "{err}");
        let err = locker
            .acquire("self", opts().wait_forever())
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::HeldByThisTask { .. }), "{err}");
        assert!(locker.try_acquire("self", opts()).await.unwrap().is_none());
        assert!(start.elapsed() < ms(500), "waited for itself");
        // Another task is another owner and waits as usual.
        let l2 = locker.clone();
        let other =
            tokio::spawn(async move { l2.acquire("self", opts().wait(ms(3_000))).await.is_ok() });
        tokio::time::sleep(ms(50)).await;
        g.release().await.unwrap();
        assert!(other.await.unwrap());
    }
}

/// Defect 13 (second half): `wait` bounds an acquire against a server that stopped answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d13_wait_bounds_an_acquire_against_a_stalled_server() {
    let mut fx = Fx::redis();
    let url = fx.server().url();
    let locker = Locker::builder()
        .url(url)
        .response_timeout(ms(500))
        .build()
        .await
        .unwrap();
    fx.server().pause().unwrap();
    let start = Instant::now();
    let res = locker.acquire("stalled", opts().wait(ms(300))).await;
    let took = start.elapsed();
    fx.server().resume().unwrap();
    println!(
        "FIGURE d13_wait_bounds_an_acquire_against_a_stalled_server: wait 300 ms, response timeout 500 ms, server SIGSTOPped: failed after {took:?}"
    );
    assert!(res.is_err(), "acquired from a stopped server");
    // wait (300 ms) plus one response timeout (500 ms), with room for a loaded machine.
    assert!(took < ms(1_100), "returned after {took:?}");
}

/// Defect 14: renewals failing at once (READONLY) back off instead of spinning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d14_failing_renewals_back_off() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let mut conn = fx.conn().await;
    let g = locker.acquire("ro", opts().ttl(ms(1_500))).await.unwrap();
    let before = support::calls_of(&mut conn, "evalsha").await;
    // The server turns replica (of nothing reachable): every renewal fails with READONLY.
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    tokio::time::timeout(ms(3_000), g.lost())
        .await
        .expect("lost at the deadline");
    let calls = support::calls_of(&mut conn, "evalsha").await - before;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut conn)
        .await
        .unwrap();
    println!(
        "FIGURE d14_failing_renewals_back_off: ttl 1.5 s, READONLY from the start: {calls} renewal scripts until the loss"
    );
    assert!(
        calls <= 20,
        "{calls} renewal scripts for one lock in one lease"
    );
    drop(g);
}

/// Defect 15: `is_lost` says lost once the deadline has passed, even if the watchdog could
/// not run (a blocked current-thread runtime).
#[test]
fn d15_is_lost_is_true_past_the_deadline_on_a_blocked_thread() {
    let server = RedisServer::start().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let locker = Locker::connect(&server.url()).await.unwrap();
        let g = locker
            .acquire("blocked", opts().ttl(ms(300)))
            .await
            .unwrap();
        assert!(!g.is_lost());
        // Blocks the only thread: the watchdog cannot renew, Redis expires the key.
        std::thread::sleep(ms(400));
        assert!(
            g.is_lost(),
            "still says held after the lease may have expired"
        );
        let section = locker
            .run_checked("blocked2", opts().ttl(ms(300)), async {
                std::thread::sleep(ms(400));
            })
            .await;
        // The body had already run when the loss showed: reported, not returned as success.
        assert!(!section.unwrap().held_throughout());
    });
}

/// Defect 17: the release stands when PUBLISH is denied to the releasing user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d17_release_succeeds_when_publish_is_denied() {
    let fx = Fx::redis();
    let mut conn = fx.conn().await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nopub",
            "on",
            ">pw",
            "~*",
            "resetchannels",
            "+@all",
        ])
        .query_async(&mut conn)
        .await
        .unwrap();
    let Fx::Redis(server) = &fx else {
        unreachable!()
    };
    let url = format!("redis://nopub:pw@127.0.0.1:{}/", server.port());
    let holder = Locker::connect(&url).await.unwrap();
    let waiter = fx.locker().await;
    let g = holder.acquire("pub", opts()).await.unwrap();
    let w =
        tokio::spawn(async move { waiter.acquire("pub", opts().wait(ms(5_000))).await.is_ok() });
    support::until_queued(&mut conn, "pub", 1).await;
    g.release()
        .await
        .expect("released and handed over; only the message was denied");
    // The waiter still gets the lock, by its fallback retry.
    assert!(tokio::time::timeout(ms(4_000), w).await.unwrap().unwrap());
}

/// Defect 17: keys are logged escaped, so a newline in a key cannot forge a log line.
#[test]
fn d17_keys_in_logs_cannot_forge_lines() {
    let out = support::logs::logged(async || {
        let locker = Locker::in_memory();
        let key = "k\n2026-01-01T00:00:00Z  INFO forged: all good";
        let g = locker.acquire(key, LockOptions::new()).await.unwrap();
        g.release().await.unwrap();
    });
    assert!(out.contains("acquire"), "nothing logged: {out}");
    assert!(
        !out.lines().any(|l| l.starts_with("2026-01-01")),
        "a key forged a log line:\n{out}"
    );
}

/// Defect 4: a single-attempt acquire cancelled while its script is in flight leaves no lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d04_cancelled_try_acquire_leaves_no_lock() {
    let fx = Fx::redis();
    let Fx::Redis(server) = &fx else {
        unreachable!()
    };
    let proxy = lockrt::testing::FaultProxy::in_front_of(server).unwrap();
    let locker = Locker::connect(&proxy.url()).await.unwrap();
    let cancelled = AtomicU32::new(0);
    for _ in 0..20 {
        proxy.delay(lockrt::testing::Direction::ToClient, ms(100));
        let attempt = locker.try_acquire("orphan", opts());
        if tokio::time::timeout(ms(30), attempt).await.is_err() {
            cancelled.fetch_add(1, Ordering::Relaxed);
        }
        proxy.pass();
        let gone = fx.gone_within("orphan", ms(2_000)).await;
        assert!(
            gone.is_some(),
            "a cancelled try_acquire left the lock for its whole ttl"
        );
    }
    assert_eq!(cancelled.load(Ordering::Relaxed), 20);
}

/// Defect found by the review of the optimistic local hand-off: the lock deleted and taken by
/// another locker, then the hand-off's check gets no answer (the passing locker cut off from
/// Redis). The successor ran beside the other holder and `run_checked` said held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d20_a_hand_off_check_without_answer_is_no_success() {
    let server = RedisServer::start().unwrap();
    let proxy = lockrt::testing::FaultProxy::in_front_of(&server).unwrap();
    let a = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(300))
        .build()
        .await
        .unwrap();
    let b = Locker::connect(&server.url()).await.unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl = ms(10_000);
    let g = a.acquire("k", opts().ttl(ttl)).await.unwrap();
    let a2 = a.clone();
    let w = tokio::spawn(async move {
        let same = opts().ttl(ttl).wait(ms(10_000));
        let c = a2
            .run_checked("k", same, async {
                let fence = lockrt::current_lock().unwrap().fence();
                tokio::time::sleep(ms(300)).await;
                fence
            })
            .await;
        c.map(|c| (c.held_throughout(), c.output()))
    });
    support::settle(async || a.stats().waiting == 1, "the successor waits").await;
    let () = conn.del("lock:k").await.unwrap();
    let other = b.acquire("k", opts().ttl(ttl)).await.unwrap();
    proxy.blackhole();
    let released = g.release().await;
    assert!(released.is_err(), "{released:?}");
    match w.await.unwrap() {
        Ok((held, fence)) => {
            assert_eq!(fence % 32, 1, "passed on");
            assert!(
                !held,
                "a section beside another holder was reported held throughout"
            );
        }
        Err(e) => assert!(e.is_lost() || e.is_backend(), "{e:?}"),
    }
    proxy.pass();
    other.release().await.unwrap();
}

/// The passing holder sends its owner check after the next holder's first poll: a release
/// cancelled in between (its future dropped right after the hand-off) still sends it, so a
/// successor on a lock lost before the hand-off is told `Lost` at once, not at its renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d21_a_release_cancelled_right_after_the_hand_off_still_checks() {
    let server = RedisServer::start().unwrap();
    let a = Locker::connect(&server.url()).await.unwrap();
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ttl = ms(30_000);
    // Listening already: the check once listening would find the loss first (see fair_queue).
    let _warm = support::warm_up(&a, &mut conn).await;
    let g = a.acquire("k", opts().ttl(ttl)).await.unwrap();
    let a2 = a.clone();
    let w = tokio::spawn(async move {
        let g = a2.acquire("k", opts().ttl(ttl).wait(ms(10_000))).await?;
        let fence = g.fence();
        let told = tokio::time::timeout(ms(3_000), g.lost()).await.is_ok();
        Ok::<_, lockrt::LockError>((fence, told, g.release().await))
    });
    support::settle(async || a.stats().waiting == 1, "the successor waits").await;
    let () = conn.del("lock:k").await.unwrap();
    // One poll: the lease goes to the successor and the release yields before the check.
    let mut release = Box::pin(g.release());
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(release.as_mut().poll(cx))).await;
    assert!(first.is_pending(), "the release waits for the check");
    drop(release);
    let (fence, told, released) = w.await.unwrap().unwrap();
    assert_eq!(fence % 32, 1, "passed on");
    assert!(told, "the successor was not told its lock was gone");
    assert!(released.is_err_and(|e| e.is_lost()), "released as if held");
}
