//! Regression tests for promises broken where two features meet (issue 27): each test is named
//! for the rule it checks, tries it against real redis-server processes, and fails on the
//! runtime before the fix. RELIABILITY.md's pair table points here.

mod support;

use std::time::Duration;

use lockrt::testing::{FaultProxy, RedisServer};
use lockrt::{LockError, LockOptions, Locker};
use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

async fn direct(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis-server")
}

/// Rule: no request of a token changes a lock after that token's release, kept or not. A
/// renewal held up on one connection lands after the `min_hold` release that keeps the lock
/// (sent on a newer connection): the lock keeps the expiry the release gave it, neither
/// shortened to one ttl (another owner would get it before `min_hold`) nor extended past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c01_a_renewal_landing_after_a_kept_release_changes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = direct(&server).await;
    // Warmed up before "kept" is taken, so the first request held below is its renewal.
    let builder = Locker::builder().response_timeout(ms(300));
    let (locker, _warm) = warmed(&proxy, &mut direct, builder).await;
    let (ttl, min_hold) = (ms(1_200), ms(5_000));
    let acquired = Instant::now();
    let g = locker
        .acquire("kept", opts().ttl(ttl).min_hold(min_hold))
        .await
        .unwrap();
    assert!(proxy.hold_requests() >= 1, "a command connection is open");
    proxy
        .wait_until(ms(3_000), |c| c.requests_held >= 1)
        .await
        .expect("the first renewal is held in the network");
    assert!(
        acquired.elapsed() >= ttl / 4,
        "a request held {:?} after the acquire: not the renewal",
        acquired.elapsed()
    );
    // The renewal is retried on a newer connection (hedge, or the connection replaced after
    // the response timeout) and lands there.
    support::settle(
        async || {
            let pttl: i64 = direct.pttl("lock:kept").await.unwrap();
            acquired.elapsed() > ttl / 2 && pttl > (ttl * 3 / 4).as_millis() as i64
        },
        "the renewal landed through another connection",
    )
    .await;
    // One call through the locker's command connection, so that it is a new one when the
    // release goes out (its reply on a held connection would time out and replace it).
    let _ = locker.lock_info("warm").await;
    let sent = proxy.counters().requests_held;
    g.release().await.expect("released (kept until min_hold)");
    assert_eq!(
        proxy.counters().requests_held,
        sent,
        "the release went out on a connection opened after the hold"
    );
    assert!(
        acquired.elapsed() < ms(2_000),
        "released in time for the check"
    );
    deliver(&proxy).await;
    let pttl: i64 = direct.pttl("lock:kept").await.unwrap();
    let left = min_hold.saturating_sub(acquired.elapsed()).as_millis() as i64;
    assert!(
        pttl > left - 1_000 && pttl <= min_hold.as_millis() as i64,
        "after the late renewal the kept lock expires in {pttl} ms, {left} ms of min_hold left"
    );
    assert!(
        support::until_gone(&mut direct, "lock:kept", ms(8_000)).await,
        "the kept lock ends"
    );
    let gone = acquired.elapsed();
    assert!(
        gone >= min_hold - ms(50) && gone < min_hold + ms(600),
        "kept lock gone {gone:?} after the acquire, min_hold {min_hold:?}"
    );
}

both! {
    /// Rule: a section covered by an enclosing one holds at least the kind it asked for. A
    /// multi-key section inside the task's own read or permit section on one of its keys is
    /// refused with `KindConflict` (as the single-key path is), and another locker's reader
    /// or permit holder still gets in meanwhile: nothing ran exclusively beside it.
    async fn c02_multi_key_inside_a_shared_section_is_refused(fx) {
        let locker = fx.locker().await;
        let other = fx.locker().await;
        for shared in [LockOptions::new().read(), LockOptions::new().permits(2)] {
            let shared = shared.ttl(ms(5_000)).wait(ms(2_000));
            let inner = locker
                .run("acct", shared, async {
                    locker
                        .run_all(["acct", "other"], opts().wait(ms(500)), async {
                            // Exclusive on "acct" while it runs: nobody else may share it.
                            other
                                .try_acquire("acct", shared.wait(ms(0)))
                                .await
                                .map(|g| g.is_some())
                        })
                        .await
                })
                .await
                .expect("the outer shared section ran");
            match inner {
                Err(LockError::KindConflict { key, .. }) => assert_eq!(key, "acct"),
                Ok(others_got_in) => panic!(
                    "{}: the multi-key body ran inside a shared section (another holder got \
                     in: {others_got_in:?})",
                    shared.get_kind()
                ),
                Err(e) => panic!("{}: {e}", shared.get_kind()),
            }
            // Nothing of the refused call is left: "other" is free.
            let g = other.try_acquire("other", opts()).await.unwrap();
            let g = g.expect("the refused call took nothing");
            // Released before the next round looks again (a dropped guard releases later).
            g.release().await.unwrap();
        }
    }
}

/// Ends `proxy.hold_requests()` and waits until every held request reached the server.
async fn deliver(proxy: &FaultProxy) {
    let held = proxy.counters();
    proxy.deliver_held();
    proxy
        .wait_until(ms(3_000), |c| {
            c.to_server >= held.to_server + held.requests_held
        })
        .await
        .expect("the held requests reached the server");
}

/// A locker on `url` whose connects and replies give up after `connect` and `response`.
async fn with_timeouts(url: String, connect: Duration, response: Duration) -> Locker {
    Locker::builder()
        .url(url)
        .connect_timeout(connect)
        .response_timeout(response)
        .build()
        .await
        .unwrap()
}

/// A locker through `proxy` built by `builder`, with its subscriber
/// listening and its first checks done (so the next requests are the test's own).
async fn warmed(
    proxy: &FaultProxy,
    direct: &mut redis::aio::MultiplexedConnection,
    builder: lockrt::LockerBuilder,
) -> (Locker, lockrt::LockGuard) {
    let locker = builder.url(proxy.url()).build().await.unwrap();
    let warm = support::warm_up(&locker, direct).await;
    (locker, warm)
}

/// Rule: every path that sends an acquire on behalf of a locker passes the same gate. An
/// `acquire_all` whose one-script attempt is in flight when `shutdown()` is called ends with
/// `ShutDown` before `shutdown()` returns, and the attempt, landing later, takes nothing;
/// after `shutdown()`, `acquire_all` is refused and takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c03_acquire_all_in_flight_is_ended_by_shutdown() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = direct(&server).await;
    let builder = Locker::builder()
        .connect_timeout(ms(500))
        .response_timeout(ms(2_000));
    let (locker, warm) = warmed(&proxy, &mut direct, builder).await;
    assert!(proxy.hold_requests() >= 1);
    let l = locker.clone();
    let task = tokio::spawn(async move {
        l.acquire_all(["s:a", "s:b"], opts().ttl(ms(30_000)).wait(ms(5_000)))
            .await
    });
    proxy
        .wait_until(ms(3_000), |c| c.requests_held >= 1)
        .await
        .expect("the one-call acquire is held in the network");
    locker.shutdown().await;
    let res = tokio::time::timeout(ms(200), task)
        .await
        .expect("acquire_all still in flight after shutdown() returned")
        .unwrap();
    assert!(
        matches!(res, Err(LockError::ShutDown)),
        "acquire_all across shutdown: {res:?}"
    );
    deliver(&proxy).await;
    for key in ["lock:s:a", "lock:s:b"] {
        let exists: bool = direct.exists(key).await.unwrap();
        assert!(
            !exists,
            "{key} taken by an acquire that landed after shutdown"
        );
    }
    let after = locker.acquire_all(["s:a", "s:b"], opts()).await;
    assert!(matches!(after, Err(LockError::ShutDown)), "{after:?}");
    for key in ["lock:s:a", "lock:s:b"] {
        let exists: bool = direct.exists(key).await.unwrap();
        assert!(!exists, "{key} taken after shutdown");
    }
    drop(warm);
}

/// Rule: every call returns within `wait` + one connect + one response timeout, whatever the
/// server does. `acquire_all` holds its first key and waits for the second when the server
/// stops answering: it returns within that bound, and the first key is given back once the
/// server answers again (in the background, not after its ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c04_acquire_all_returns_within_its_bound_when_the_server_stops_answering() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = direct(&server).await;
    let (connect, response, wait) = (ms(500), ms(500), ms(300));
    let builder = Locker::builder()
        .connect_timeout(connect)
        .response_timeout(response);
    let (locker, _warm) = warmed(&proxy, &mut direct, builder).await;
    let holder = Locker::connect(&server.url()).await.unwrap();
    let b = holder.acquire("t:b", opts().ttl(ms(30_000))).await.unwrap();
    let started = Instant::now();
    let l = locker.clone();
    let task = tokio::spawn(async move {
        let res = l
            .acquire_all(["t:a", "t:b"], opts().ttl(ms(30_000)).wait(wait))
            .await;
        (res, started.elapsed())
    });
    support::until_queued(&mut direct, "t:b", 1).await;
    proxy.blackhole();
    let (res, took) = task.await.unwrap();
    let bound = wait + connect + response;
    assert!(res.is_err(), "acquire_all got {res:?}");
    assert!(
        took < bound + ms(300),
        "acquire_all returned after {took:?}, bound {bound:?}"
    );
    proxy.pass();
    assert!(
        support::until_gone(&mut direct, "lock:t:a", ms(10_000)).await,
        "the first key was not given back (ttl 30 s)"
    );
    b.release().await.unwrap();
}

/// Rule: every call returns within `wait` + one connect + one response timeout. A caller
/// handed the lease by local hand-off starts at once, whatever the passing holder's check of
/// the lock is waiting for: the server stopped (SIGSTOP) as the holder passes the lock, the
/// successor with `wait` 300 ms returns within its bound, not the holder's check's; once the
/// server answers again, the check finds the lock still the lease's and both releases succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_a_local_successor_starts_at_once_while_the_hand_off_check_waits() {
    let server = RedisServer::start().expect("start redis-server");
    let (connect, response, wait) = (ms(500), ms(500), ms(300));
    let locker = with_timeouts(server.url(), connect, response).await;
    let ttl = ms(10_000);
    let g = locker.acquire("passed", opts().ttl(ttl)).await.unwrap();
    let l = locker.clone();
    let successor = tokio::spawn(async move {
        let started = Instant::now();
        // The same ttl as the holder's: only such a caller is passed the lease.
        let res = l.acquire("passed", opts().ttl(ttl).wait(wait)).await;
        (res, started.elapsed())
    });
    support::settle(
        async || locker.stats().waiting == 1,
        "the successor waits for the key",
    )
    .await;
    server.pause().expect("SIGSTOP redis-server");
    let released = tokio::spawn(g.release());
    let (res, took) = successor.await.unwrap();
    server.resume().expect("SIGCONT redis-server");
    let bound = wait + connect + response;
    assert!(
        took < bound + ms(300),
        "the local successor returned after {took:?} ({res:?}), bound {bound:?}"
    );
    let g = res.expect("the successor is passed the lease");
    assert_eq!(g.fence() % 32, 1, "passed on, not taken from Redis");
    g.release().await.unwrap();
    released.await.unwrap().unwrap();
}

both! {
    /// Rule: a key's kind comes from live holders and live waiters only. A semaphore's holder
    /// with a long lease releases early, the other holder's fixed short lease runs out
    /// unreleased: the key has no live holder, and an exclusive caller takes it at once instead
    /// of being refused with `KindConflict` until the longest lease ever recorded ends.
    async fn c06_a_key_whose_last_share_ran_out_takes_any_kind(fx) {
        let locker = fx.locker().await;
        let sem = LockOptions::new().permits(3);
        let long = locker.acquire("sem", sem.ttl(ms(9_000))).await.unwrap();
        let sent = Instant::now();
        let short = locker
            .acquire("sem", sem.ttl(ms(600)).watchdog(false))
            .await
            .unwrap();
        long.release().await.unwrap();
        tokio::time::timeout(ms(3_000), short.lost())
            .await
            .expect("the fixed lease runs out");
        // The holder counts its lease lost a margin early; the server's ends at 600 ms.
        tokio::time::sleep_until(sent + ms(700)).await;
        let started = Instant::now();
        let lock = locker
            .acquire("sem", opts().ttl(ms(5_000)).wait(ms(0)))
            .await
            .unwrap_or_else(|e| panic!("an exclusive caller after the last share ran out: {e}"));
        assert!(started.elapsed() < ms(1_000));
        lock.release().await.unwrap();
        drop(short);
    }
}

/// Rule: fences are exact in a double (below 2^53) with every ordering guarantee. The
/// canonical fenced write, a compare-and-set in a Redis Lua script (where numbers are
/// doubles), accepts every write of sections that held the lock in turn: two lockers, two
/// tasks each, local hand-offs among them, and a counter that expired in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c11_fences_are_exact_where_a_lua_fenced_write_compares_them() {
    let server = RedisServer::start().expect("start redis-server");
    let cas = redis::Script::new(
        "local last = tonumber(redis.call('GET', KEYS[1]) or '0') \
         if tonumber(ARGV[1]) > last then redis.call('SET', KEYS[1], ARGV[1]) return 1 end \
         return 0",
    );
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let locker = Locker::builder()
            .url(server.url())
            .local_handoff(8)
            .fence_retention(ms(200))
            .build()
            .await
            .unwrap();
        for _ in 0..2 {
            let (locker, cas) = (locker.clone(), cas.clone());
            let mut conn = direct(&server).await;
            tasks.push(tokio::spawn(async move {
                let (mut accepted, mut rejected, mut max) = (0, 0, 0u64);
                for round in 0..60 {
                    let g = locker
                        .acquire("fenced", opts().ttl(ms(300)).wait(ms(10_000)))
                        .await
                        .unwrap();
                    max = max.max(g.fence());
                    let ok: i64 = cas
                        .key("storage")
                        .arg(g.fence().to_string())
                        .invoke_async(&mut conn)
                        .await
                        .unwrap();
                    if ok == 1 {
                        accepted += 1
                    } else {
                        rejected += 1
                    }
                    if round == 30 {
                        // Idle past the counter's retention: the next one starts anew.
                        drop(g);
                        tokio::time::sleep(ms(700)).await;
                        continue;
                    }
                    g.release().await.unwrap();
                }
                (accepted, rejected, max)
            }));
        }
    }
    let (mut accepted, mut rejected, mut max) = (0, 0, 0);
    for t in tasks {
        let (a, r, m) = t.await.unwrap();
        (accepted, rejected, max) = (accepted + a, rejected + r, max.max(m));
    }
    println!(
        "FIGURE fenced_lua_write: {accepted} accepted, {rejected} rejected, largest fence {max}"
    );
    assert!(max < 1 << 53, "fence {max} is not exact in a double");
    assert_eq!(
        rejected, 0,
        "legitimate fenced writes rejected ({accepted} accepted)"
    );
}

/// Rule: state per job, not per tick. `every()` with a 50 ms tick for 3 s (60 ticks): every
/// claim and fencing counter the job leaves is one of its fixed claim slots (64 ticks plus ten
/// minutes' worth, whatever the job's other settings), not a key per tick start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c07_every_keeps_state_per_job_not_per_tick() {
    let server = RedisServer::start().expect("start redis-server");
    let mut direct = direct(&server).await;
    let locker = Locker::connect(&server.url()).await.unwrap();
    let l = locker.clone();
    let job = tokio::spawn(async move {
        let opts = opts().ttl(ms(200));
        lockrt::every(&l, "j7", ms(50), opts, |_| async {}).await
    });
    let mut counters = Vec::new();
    let slots = 64 + 600_000 / 50 + 2;
    for _ in 0..3 {
        tokio::time::sleep(ms(1_000)).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("{lock:j7:*}:state")
            .query_async(&mut direct)
            .await
            .unwrap();
        for k in &keys {
            let slot: u64 = k
                .strip_prefix("{lock:j7:tick:")
                .and_then(|r| r.strip_suffix("}:state"))
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("{k} is not a claim slot's counter"));
            assert!(slot < slots, "{k}: slot {slot} of {slots}");
        }
        counters.push(keys.len());
    }
    locker.shutdown().await;
    job.await.unwrap().unwrap();
    println!(
        "FIGURE every_state: claim-slot counters of a 50 ms job after 1, 2, 3 s: {counters:?} (at most {slots})"
    );
    assert!(counters.iter().all(|&n| n <= slots as usize));
}

/// Rule: every check the docs promise "before any tick" is made before any tick. With a
/// one-minute tick and `max_hold` 20 min, the job cycles through 27 claim slots
/// (`<name>:tick:0` .. `<name>:tick:26`): a name for which only the two-digit slots exceed the
/// key limit (1,024 bytes) is refused at once, not at the first tick that uses such a slot.
#[tokio::test]
async fn c08_every_refuses_an_over_long_name_before_any_tick() {
    let locker = Locker::in_memory();
    let opts = opts().max_hold(Duration::from_secs(20 * 60));
    let name = "n".repeat(1_024 - ":tick:".len() - 1);
    let started = Instant::now();
    let res = tokio::time::timeout(
        ms(5_000),
        lockrt::every(&locker, &name, Duration::from_secs(60), opts, |_| async {}),
    )
    .await;
    assert!(
        matches!(res, Ok(Err(LockError::InvalidKey { .. }))),
        "every() with a name whose longer claim keys are too long: {res:?}"
    );
    assert!(started.elapsed() < ms(1_000));
    // One byte shorter fits every slot: accepted (it waits for its first tick).
    let fits = "n".repeat(name.len() - 1);
    let res = tokio::time::timeout(
        ms(200),
        lockrt::every(&locker, &fits, Duration::from_secs(60), opts, |_| async {}),
    )
    .await;
    assert!(res.is_err(), "a name that fits every slot: {res:?}");
}

/// `count` user keys whose locks all hash to one slot served by master 0 of `cluster`.
fn keys_in_one_slot(cluster: &lockrt::testing::RedisCluster, count: usize) -> (u16, Vec<String>) {
    use lockrt::testing::slot_of;
    let slot = (0..16_384u16)
        .find(|&s| cluster.master_of_slot(s).unwrap() == 0)
        .expect("master 0 serves a slot");
    let keys = (0..10_000_000u32)
        .map(|n| format!("mig{n}"))
        .filter(|k| slot_of(format!("lock:{k}")) == slot)
        .take(count)
        .collect();
    (slot, keys)
}

/// Moves one key of a migrating slot from master `from` to master `to` (an operator's
/// `MIGRATE`): the lock's keys are then split between two masters, and every script on them
/// gets `TRYAGAIN` until the migration ends.
fn migrate_one(cluster: &lockrt::testing::RedisCluster, from: usize, to: usize, key: &str) {
    let mut c = cluster
        .client(from)
        .get_connection()
        .expect("node connection");
    let _: String = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(cluster.port(to))
        .arg(key)
        .arg(0)
        .arg(5_000)
        .query(&mut c)
        .expect("MIGRATE one key");
}

/// Rule: a release, a hand-over and a forced unlock are retried until they land or the lease
/// ends; a migration never strands a lock for its lease. A lock's owner record is moved ahead
/// of the rest of its slot (so its scripts get `TRYAGAIN`) for 2.5 s: the holder's release
/// waits it out and lands, handing the lock to the waiter long before the lease (8 s) ends;
/// a forced unlock in the same state lands too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_a_release_and_a_forced_unlock_outlast_a_slot_migration() {
    let cluster = lockrt::testing::RedisCluster::start(3, 0).expect("start 3 masters");
    let (slot, keys) = keys_in_one_slot(&cluster, 2);
    let locker = || async {
        Locker::builder()
            .cluster(cluster.seed_urls())
            .response_timeout(ms(500))
            .build()
            .await
            .unwrap()
    };
    let (holder, waiter, admin) = (locker().await, locker().await, locker().await);
    let ttl = ms(8_000);
    let g = holder.acquire(&keys[0], opts().ttl(ttl)).await.unwrap();
    let forced = holder.acquire(&keys[1], opts().ttl(ttl)).await.unwrap();
    let w = {
        let (waiter, key) = (waiter.clone(), keys[0].clone());
        tokio::spawn(async move { waiter.acquire(&key, opts().ttl(ttl).wait(ms(20_000))).await })
    };
    support::settle(
        async || waiter.stats().waiting == 1,
        "the waiter waits for the lock",
    )
    .await;
    let migration = cluster
        .begin_slot_migration(slot, 1)
        .expect("begin migration");
    for key in &keys {
        migrate_one(&cluster, 0, 1, &format!("{{lock:{key}}}:owner"));
    }
    let started = Instant::now();
    let release = tokio::spawn(g.release());
    let unlock = {
        let (admin, key) = (admin.clone(), keys[1].clone());
        tokio::spawn(async move { admin.force_unlock(&key).await })
    };
    tokio::time::sleep(ms(2_500)).await;
    assert!(
        !release.is_finished(),
        "the release gave up during the migration"
    );
    migration.move_keys().expect("move the rest");
    migration.finish().expect("finish the migration");
    let released = release.await.unwrap();
    let took = started.elapsed();
    assert!(
        released.is_ok(),
        "release across the migration: {released:?}"
    );
    let next = tokio::time::timeout(ms(3_000), w)
        .await
        .expect("the waiter is handed the lock after the migration, not after the lease")
        .unwrap()
        .expect("the waiter holds the lock");
    let unlocked = unlock.await.unwrap();
    assert!(
        matches!(unlocked, Ok(true)),
        "forced unlock across the migration: {unlocked:?}"
    );
    tokio::time::timeout(ms(3_000), forced.lost())
        .await
        .expect("the force-unlocked holder hears of it");
    println!(
        "FIGURE cluster_migration_release: released {took:?} after the start, across a 2.5 s split"
    );
    assert!(took < ttl, "released after {took:?}, lease {ttl:?}");
    next.release().await.unwrap();
}

/// Rule: a poisoned key fails only its own lease. Four leases of one slot renew in one call;
/// one lock's keys are split between two masters for three leases' time: that lease may be
/// lost, the other three are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_one_split_lock_fails_only_its_own_lease_in_a_slot() {
    let cluster = lockrt::testing::RedisCluster::start(3, 0).expect("start 3 masters");
    let (slot, keys) = keys_in_one_slot(&cluster, 4);
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .response_timeout(ms(500))
        .build()
        .await
        .unwrap();
    let ttl = ms(2_000);
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(locker.acquire(key, opts().ttl(ttl)).await.unwrap());
    }
    let migration = cluster
        .begin_slot_migration(slot, 1)
        .expect("begin migration");
    migrate_one(&cluster, 0, 1, &format!("{{lock:{}}}:owner", keys[0]));
    tokio::time::sleep(3 * ttl).await;
    let lost: Vec<bool> = guards.iter().map(|g| g.is_lost()).collect();
    migration.move_keys().expect("move the rest");
    migration.finish().expect("finish the migration");
    println!("FIGURE cluster_poisoned_key: leases lost after 3 ttl with one lock split: {lost:?}");
    assert!(
        lost[1..].iter().all(|l| !l),
        "leases of other locks of the slot were lost with the split one: {lost:?}"
    );
    for g in guards {
        let _ = g.release().await;
    }
}

both! {
    /// Review of issue 27: more lapsed shares than one script drops at a time (64) still leave
    /// the key free for another kind: 140 permit holders whose fixed leases ran out unreleased
    /// and one that released, then an exclusive caller takes the key at once.
    async fn c06_many_lapsed_shares_take_any_kind(fx) {
        let locker = fx.locker().await;
        let sem = LockOptions::new().permits(1_000);
        let long = locker.acquire("many", sem.ttl(ms(10_000))).await.unwrap();
        let sent = Instant::now();
        let mut short = Vec::new();
        for _ in 0..140 {
            short.push(
                locker
                    .acquire("many", sem.ttl(ms(400)).watchdog(false))
                    .await
                    .unwrap(),
            );
        }
        tokio::time::sleep_until(sent + ms(1_000)).await;
        long.release().await.unwrap();
        let lock = locker
            .acquire("many", opts().ttl(ms(5_000)).wait(ms(0)))
            .await
            .unwrap_or_else(|e| panic!("an exclusive caller after 140 shares ran out: {e}"));
        lock.release().await.unwrap();
        drop(short);
    }
}

both! {
    /// Review of issue 27: all or none also with `min_hold`. An `acquire_all` that times out
    /// on its second key gives the first back at once: no body ran, so `min_hold` keeps
    /// nothing.
    async fn c04_a_failed_acquire_all_with_min_hold_keeps_nothing(fx) {
        let (locker, other) = (fx.locker().await, fx.locker().await);
        let busy = other.acquire("g2", opts().ttl(ms(10_000))).await.unwrap();
        let res = locker
            .acquire_all(["g1", "g2"], opts().min_hold(ms(5_000)).wait(ms(200)))
            .await;
        assert!(res.is_err_and(|e| e.is_timeout()));
        let g1 = other.try_acquire("g1", opts()).await.unwrap();
        assert!(g1.is_some(), "g1 kept by a failed acquire_all");
        busy.release().await.unwrap();
    }
}

/// Review of issue 27: the bound holds call after call. Against a stopped server (SIGSTOP),
/// eight `acquire` and eight `try_acquire` calls in a row each return within `wait` (at least
/// 100 ms) + one connect + one response timeout: background work of the calls before (their
/// compensations, reconnects) does not queue ahead of the next call's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c05_calls_in_a_row_against_a_stopped_server_keep_their_bound() {
    let server = RedisServer::start().expect("start redis-server");
    let (connect, response, wait) = (ms(300), ms(300), ms(300));
    let locker = with_timeouts(server.url(), connect, response).await;
    server.pause().expect("SIGSTOP redis-server");
    let mut took = Vec::new();
    for i in 0..16 {
        let started = Instant::now();
        let res = if i % 2 == 0 {
            locker.acquire("stopped", opts().wait(wait)).await.map(drop)
        } else {
            locker.try_acquire("stopped", opts()).await.map(drop)
        };
        assert!(res.is_err(), "call {i} against a stopped server: {res:?}");
        took.push(started.elapsed());
    }
    server.resume().expect("SIGCONT redis-server");
    println!(
        "FIGURE stopped_server_calls: {:?}",
        took.iter().map(|d| d.as_millis()).collect::<Vec<_>>()
    );
    for (i, d) in took.iter().enumerate() {
        let w = if i % 2 == 0 { wait } else { ms(100) };
        let bound = w + connect + response;
        assert!(*d < bound + ms(200), "call {i}: {d:?}, bound {bound:?}");
    }
}

/// Rule: no request of a token changes a lock after that token's release, also a release
/// that found the lock lost. A `try_acquire` whose first attempt is held up in the network
/// takes the lock with its retry on a fresh connection; a forced unlock ends that lease and
/// its release finds it lost; the first attempt, landing only then, must take nothing (it
/// took the free lock with a token nobody holds any more, for a whole ttl). For a lock and
/// for a read share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c12_an_attempt_landing_after_its_lost_lease_was_released_takes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = direct(&server).await;
    // The response timeout well inside the retry window (100 ms), so the attempt is retried.
    let builder = Locker::builder().response_timeout(ms(40));
    let (locker, _warm) = warmed(&proxy, &mut direct, builder).await;
    let admin = Locker::connect(&server.url()).await.unwrap();
    for (name, kind) in [("ghost-x", opts()), ("ghost-r", opts().read())] {
        let held_before = proxy.counters().requests_held;
        assert!(proxy.hold_requests() >= 1, "a command connection is open");
        let g = locker
            .try_acquire(name, kind.ttl(ms(6_000)))
            .await
            .expect("the retry got an answer")
            .expect("the lock was free");
        assert!(
            proxy.counters().requests_held > held_before,
            "{name}: the first attempt is held in the network"
        );
        assert!(admin.force_unlock(name).await.unwrap(), "{name}: was held");
        let lost = g.release().await;
        assert!(
            lost.as_ref().is_err_and(LockError::is_lost),
            "{name}: the release finds the lease lost: {lost:?}"
        );
        deliver(&proxy).await;
        let info = admin.lock_info(name).await.unwrap();
        assert!(
            info.is_none(),
            "{name}: the attempt that landed after the release took the lock: {info:?}"
        );
    }
}

/// Rule: no request of a token changes a lock after that token's lease ended, also when a
/// forced unlock ended it. A holder whose first acquire attempt is held up in the network
/// (its retry took the lock) is force-unlocked while its revocation message is lost; another
/// locker takes and releases the lock; the held attempt lands: it must take nothing, and the
/// holder must hear it lost the lock (before, the attempt took the lock back for the same
/// token, the holder's renewals found it their own, and its release returned `Ok` although
/// another owner had held the lock inside its section).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c13_an_attempt_landing_after_a_forced_unlock_takes_nothing() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("start proxy");
    let mut direct = direct(&server).await;
    let builder = Locker::builder().response_timeout(ms(300));
    let (holder, _warm) = warmed(&proxy, &mut direct, builder).await;
    let (admin, other) = (
        Locker::connect(&server.url()).await.unwrap(),
        Locker::connect(&server.url()).await.unwrap(),
    );
    let held_before = proxy.counters().requests_held;
    assert!(proxy.hold_requests() >= 1, "a command connection is open");
    let g = holder
        .acquire("forced", opts().ttl(ms(3_000)).wait(ms(5_000)))
        .await
        .expect("the retry took the lock");
    assert!(
        proxy.counters().requests_held > held_before,
        "the first attempt is held in the network"
    );
    // The revocation message to the holder's subscriber is lost.
    proxy.drop_replies(1);
    assert!(admin.force_unlock("forced").await.unwrap(), "was held");
    let taken = other
        .acquire("forced", opts().ttl(ms(3_000)).wait(ms(1_000)))
        .await
        .expect("free after the forced unlock");
    taken.release().await.unwrap();
    deliver(&proxy).await;
    let info = admin.lock_info("forced").await.unwrap();
    assert!(
        info.is_none(),
        "the attempt that landed after the forced unlock took the lock back: {info:?}"
    );
    let end = g.release().await;
    assert!(
        end.as_ref().is_err_and(LockError::is_lost),
        "the force-unlocked holder's release: {end:?}"
    );
}
