//! Network faults between a `Locker` and Redis, made by a `FaultProxy`: partition, dropped
//! replies, half-open connections, resets around an acquire and a release, late replies. Each
//! test prints its measured figure (`FIGURE ...`, quoted in RELIABILITY.md).

use crate::support;

use std::time::Duration;

use lockrt::testing::Direction;
use lockrt::{LockOptions, Locker};
use support::ms;
use support::proxy_faults::{
    default_margin, direct, fence_in, figure, held, leftovers, lock_value, locker_via, ms_f, pttl,
    server_and_proxy, within,
};
use tokio::time::Instant;

/// A partition (nothing gets through either way) while a lock is held: loss is declared
/// before the server-side expiry, and once the network heals the same `Locker` takes locks
/// again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_during_hold() {
    let (server, proxy) = server_and_proxy();
    let locker = locker_via(&proxy, ms(200)).await;
    let mut conn = direct(&server).await;
    let ttl = ms(1_000);
    let guard = held(&locker, "k", ttl).await;
    proxy.blackhole();
    // No renewal gets through from here on: this is the expiry of the last one that did.
    let expiry = Instant::now() + pttl(&mut conn, "k").await.expect("held");
    let declared = tokio::time::timeout(ttl * 2, guard.lost()).await;
    let at = Instant::now();
    // The partition lasts 1.5 s, then heals.
    tokio::time::sleep_until(expiry + ms(500)).await;
    proxy.pass();
    let healed = Instant::now();
    let recovered = within(ms(5_000), async || {
        matches!(
            tokio::time::timeout(
                ms(1_000),
                locker.try_acquire("k2", LockOptions::new().ttl(ttl))
            )
            .await,
            Ok(Ok(Some(_)))
        )
    })
    .await;
    figure(
        "partition_during_hold",
        format!(
            "ttl 1 s, 1.5 s partition: loss declared {} before the server-side expiry; same \
             Locker acquiring again {} after the network healed",
            if at < expiry {
                ms_f(expiry - at)
            } else {
                format!("-{}", ms_f(at - expiry))
            },
            recovered.map_or("never (5 s)".into(), ms_f)
        ),
    );
    assert!(declared.is_ok(), "no loss declared");
    assert!(
        at < expiry,
        "loss declared after the server expired the lock"
    );
    assert!(
        recovered.is_some(),
        "the Locker did not recover within 5 s of the network healing ({:?} ago)",
        healed.elapsed()
    );
}

/// One renewal reply dropped while the connection stays up: no false loss, the lock stays
/// ours, and the release works (5 runs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_reply_dropped_no_false_loss() {
    let (server, proxy) = server_and_proxy();
    let mut conn = direct(&server).await;
    let ttl = ms(450);
    let runs = 5;
    let mut false_losses = 0;
    let mut failed_releases = 0;
    for run in 0..runs {
        let locker = locker_via(&proxy, ms(150)).await;
        let key = format!("r{run}");
        let guard = locker
            .acquire(&key, LockOptions::new().ttl(ttl))
            .await
            .unwrap();
        let ours = lock_value(&mut conn, &key).await.unwrap();
        // Only renewals talk on this connection now: the next reply is a renewal's.
        let before = proxy.counters().replies_dropped;
        proxy.drop_replies(1);
        proxy
            .wait_until(ttl * 2, |c| c.replies_dropped > before)
            .await
            .expect("a renewal reply was dropped");
        let lost = tokio::time::timeout(ttl * 3, guard.lost()).await.is_ok();
        let still = lock_value(&mut conn, &key).await;
        if lost || still.as_deref() != Some(ours.as_str()) {
            false_losses += 1;
        }
        if guard.release().await.is_err() {
            failed_releases += 1;
        }
    }
    figure(
        "one_renewal_reply_dropped_no_false_loss",
        format!(
            "ttl 450 ms, one renewal reply dropped, held 3 ttl more: {false_losses} false \
             losses and {failed_releases} failed releases in {runs} runs"
        ),
    );
    assert_eq!(false_losses, 0, "a dropped renewal reply cost the lock");
    assert_eq!(failed_releases, 0);
}

/// One acquire reply dropped while two acquires are in flight on one connection (a busy key
/// and a free key): no reply is taken for another request's, so nobody ever holds the busy
/// key alongside its owner, and every lock the locker thinks it holds is its own in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acquire_reply_dropped_no_cross_wiring() {
    let (server, proxy) = server_and_proxy();
    let mut conn = direct(&server).await;
    let owner = Locker::connect(&server.url()).await.unwrap();
    let rounds = 10;
    let mut two_holders = 0;
    let mut not_ours = 0;
    for round in 0..rounds {
        let busy = format!("busy{round}");
        let free = format!("free{round}");
        let held = owner
            .acquire(&busy, LockOptions::new().ttl(ms(5_000)))
            .await
            .unwrap();
        let locker = locker_via(&proxy, ms(150)).await;
        // Warm the connection, so the next two replies are the two acquires'.
        drop(
            locker
                .try_acquire("warm", LockOptions::new())
                .await
                .unwrap(),
        );
        proxy.drop_replies(1);
        let opts = LockOptions::new().ttl(ms(2_000));
        let (b, f) = tokio::join!(
            locker.try_acquire(&busy, opts),
            locker.try_acquire(&free, opts)
        );
        if let Ok(Some(g)) = &b {
            two_holders += 1;
            let _ = g;
        }
        if let Ok(Some(g)) = &f {
            let v = lock_value(&mut conn, &free).await;
            if v.as_deref().map(fence_in) != Some(g.fence()) {
                not_ours += 1;
            }
        }
        proxy.pass();
        drop((b, f));
        held.release().await.unwrap();
    }
    figure(
        "one_acquire_reply_dropped_no_cross_wiring",
        format!(
            "{rounds} rounds of try_acquire(busy) + try_acquire(free) with one reply dropped: \
             {two_holders} rounds with two holders, {not_ours} guards not matching Redis"
        ),
    );
    assert_eq!(two_holders, 0, "a busy lock was handed to a second holder");
    assert_eq!(not_ours, 0, "a guard for a lock Redis says is not ours");
}

/// Half-open connection: every connection the `Locker` has goes silent (no RST, no FIN) while
/// new connections work. The next acquire must not hang on the dead connection: it opens a
/// new one and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connection_existing_stall_new_pass() {
    let (_server, proxy) = server_and_proxy();
    let locker = locker_via(&proxy, ms(200)).await;
    locker
        .run("warm", LockOptions::new(), async {})
        .await
        .unwrap();
    assert!(proxy.stall_existing() >= 1);
    let t = Instant::now();
    let mut outcome = Vec::new();
    let mut took = None;
    for _ in 0..5 {
        match locker
            .acquire("k", LockOptions::new().ttl(ms(1_000)).wait(ms(1_000)))
            .await
        {
            Ok(g) => {
                took = Some(t.elapsed());
                drop(g);
                break;
            }
            Err(e) => outcome.push(e.to_string()),
        }
    }
    figure(
        "half_open_connection_existing_stall_new_pass",
        format!(
            "response timeout 200 ms: acquired {} after the stall, {} failed attempts before",
            took.map_or("never (5 attempts)".into(), ms_f),
            outcome.len()
        ),
    );
    let took = took.unwrap_or_else(|| panic!("never acquired: {outcome:?}"));
    assert!(took < ms(2_000), "{took:?}");
}

/// A connection reset right before the acquire request reaches Redis (`before`) or right
/// after Redis ran it (`after`): each acquire ends with the lock held exactly once by the
/// caller, or with an error and no lock of ours left (well within the ttl).
async fn reset_around_acquire(n: u32, case: &str) {
    let (server, proxy) = server_and_proxy();
    let mut conn = direct(&server).await;
    let locker = locker_via(&proxy, ms(200)).await;
    let ttl = ms(10_000);
    let mut tally = [[0u32; 3]; 2];
    for i in 0..n {
        for (side, dir) in [Direction::ToServer, Direction::ToClient]
            .into_iter()
            .enumerate()
        {
            let key = format!("rst{side}-{i}");
            proxy.reset_on_next(dir);
            let res = locker
                .acquire(&key, LockOptions::new().ttl(ttl).wait(ms(1_000)))
                .await;
            proxy.pass();
            match res {
                Ok(g) => {
                    let v = lock_value(&mut conn, &key).await;
                    assert_eq!(
                        v.as_deref().map(fence_in),
                        Some(g.fence()),
                        "{case}: guard for a lock Redis does not give us ({dir:?}, {i})"
                    );
                    g.release().await.expect("release");
                    assert!(lock_value(&mut conn, &key).await.is_none());
                    tally[side][0] += 1;
                }
                Err(e) => {
                    assert!(e.is_backend(), "{e:?}");
                    let gone = within(ms(2_000), async || {
                        leftovers(&mut conn, &key).await.is_empty()
                    })
                    .await;
                    assert!(
                        gone.is_some(),
                        "{case}: failed acquire left {:?} ({dir:?}, {i})",
                        leftovers(&mut conn, &key).await
                    );
                    tally[side][1] += 1;
                }
            }
            // Exactly one holder possible afterwards: anyone else can take it at once.
            let other = Locker::connect(&server.url()).await.unwrap();
            assert!(
                other
                    .try_acquire(&key, LockOptions::new())
                    .await
                    .unwrap()
                    .is_some(),
                "{case}: lock still held after the acquire was resolved ({dir:?}, {i})"
            );
            tally[side][2] += 1;
        }
    }
    figure(
        case,
        format!(
            "{n} resets before the acquire reached Redis: {} held once, {} error with nothing \
             left; {n} resets after Redis ran it: {} held once, {} error with nothing left",
            tally[0][0], tally[0][1], tally[1][0], tally[1][1]
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_reset_before_and_after_acquire_forwarded() {
    reset_around_acquire(20, "connection_reset_before_and_after_acquire_forwarded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_connection_reset_before_and_after_acquire_forwarded() {
    reset_around_acquire(
        200,
        "chaos_connection_reset_before_and_after_acquire_forwarded",
    )
    .await;
}

/// The release's reply is lost to a reset after Redis ran it: the release reports success
/// (the lock was ours and is gone), 20 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rst_after_release_reached_redis() {
    let (server, proxy) = server_and_proxy();
    let mut conn = direct(&server).await;
    let locker = locker_via(&proxy, ms(200)).await;
    let runs = 20;
    let mut errs = Vec::new();
    for i in 0..runs {
        let key = format!("rel{i}");
        let g = locker
            .acquire(&key, LockOptions::new().ttl(ms(5_000)))
            .await
            .unwrap();
        proxy.reset_on_next(Direction::ToClient);
        let res = g.release().await;
        proxy.pass();
        assert!(
            lock_value(&mut conn, &key).await.is_none(),
            "the release did not reach Redis"
        );
        if let Err(e) = res {
            errs.push(e.to_string());
        }
    }
    figure(
        "rst_after_release_reached_redis",
        format!(
            "{runs} releases whose reply was reset after Redis ran them: {} reported an error",
            errs.len()
        ),
    );
    assert!(errs.is_empty(), "{errs:?}");
}

/// Every acquire reply delayed by 0.9 x ttl: `acquire` never returns a lock with less than
/// twice the safety margin of lease left in Redis (so its local deadline, counted from the
/// send time, is at least the margin ahead), whatever else it does (wait on, time out).
async fn late_acquire_reply(runs: u32, ttl: Duration, case: &str) {
    let (server, proxy) = server_and_proxy();
    let mut conn = direct(&server).await;
    let locker = locker_via(&proxy, ttl * 2).await;
    locker
        .run("warm", LockOptions::new(), async {})
        .await
        .unwrap();
    let need = default_margin(ttl) * 2;
    let mut short = Vec::new();
    let mut min_left: Option<Duration> = None;
    let (mut ok, mut failed) = (0, 0);
    for i in 0..runs {
        let key = format!("late{i}");
        proxy.delay(Direction::ToClient, ttl * 9 / 10);
        let res = locker
            .acquire(&key, LockOptions::new().ttl(ttl).wait(ttl * 2))
            .await;
        // Read before anything else: how much lease the returned lock has in Redis.
        let left = pttl(&mut conn, &key).await;
        proxy.pass();
        match res {
            Ok(g) => {
                ok += 1;
                let left = left.unwrap_or_default();
                min_left = Some(min_left.map_or(left, |m| m.min(left)));
                if left < need {
                    short.push(left);
                }
                drop(g);
            }
            Err(_) => failed += 1,
        }
    }
    figure(
        case,
        format!(
            "ttl {}, every acquire reply delayed 0.9 ttl, {runs} runs: {ok} returned a lock \
             (least lease left in Redis {}), {failed} errors; {} locks with less than 2 x \
             margin ({}) left",
            ms_f(ttl),
            min_left.map_or("-".into(), ms_f),
            short.len(),
            ms_f(need)
        ),
    );
    assert!(
        short.is_empty(),
        "acquire returned locks with only {short:?} left (need {need:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_reply_delayed_most_of_the_ttl() {
    late_acquire_reply(4, ms(500), "acquire_reply_delayed_most_of_the_ttl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_acquire_reply_delayed_most_of_the_ttl() {
    late_acquire_reply(30, ms(1_000), "chaos_acquire_reply_delayed_most_of_the_ttl").await;
}
