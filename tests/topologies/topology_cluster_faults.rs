//! lockrt on a Redis Cluster while the cluster changes under it: a coordinated failover
//! (`CLUSTER FAILOVER`) with a holder and a waiter, a master frozen with SIGSTOP until its
//! replica takes over, a slot migrated while a holder holds and a waiter waits, and
//! `sync_replicas` with one master's replica frozen. Each test
//! prints its measured figures (`FIGURE ...`).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockrt::testing::{RedisCluster, slot_of};
use lockrt::{LockOptions, Locker};
use support::proxy_faults::held;
use support::topology::{Raw, assert_woken_promptly, figure, ms, ms_f, spawn_waiter, within};
use tokio::time::Instant;

/// A user key whose lock key master `master` serves.
fn key_on(cluster: &RedisCluster, master: usize, stem: &str) -> String {
    let owner = cluster.nodes().expect("cluster view")[master].slots.clone();
    (0..100_000)
        .map(|n| format!("{stem}{n}"))
        .find(|k| {
            let slot = slot_of(format!("lock:{k}"));
            owner.iter().any(|r| r.contains(&slot))
        })
        .expect("a key on every master")
}

/// `count` user keys whose lock keys all hash to `slot`.
fn keys_in_slot(slot: u16, stem: &str, count: usize) -> Vec<String> {
    (0..10_000_000u32)
        .map(|n| format!("{stem}{n}"))
        .filter(|k| slot_of(format!("lock:{k}")) == slot)
        .take(count)
        .collect()
}

/// The replica of master `master`.
fn replica_of(cluster: &RedisCluster, master: usize) -> usize {
    cluster
        .nodes()
        .expect("cluster view")
        .into_iter()
        .find(|n| n.master == Some(master))
        .expect("a replica")
        .index
}

/// How many scripts node `index` ran so far (`EVALSHA` and `EVAL`).
async fn scripts_run(cluster: &RedisCluster, index: usize) -> u64 {
    let mut c = cluster
        .client(index)
        .get_multiplexed_async_connection()
        .await
        .expect("node connection");
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .expect("INFO");
    ["cmdstat_evalsha:calls=", "cmdstat_eval:calls="]
        .iter()
        .filter_map(|p| text.lines().find_map(|l| l.strip_prefix(p)))
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

async fn cluster_locker(cluster: &RedisCluster, response: Duration) -> Locker {
    Locker::builder()
        .cluster(cluster.seed_urls())
        .response_timeout(response)
        .connect_timeout(ms(300))
        .build()
        .await
        .expect("connect")
}

/// `sync_replicas(1, 300 ms)` on a Cluster: each `WAIT` goes to the master that ran the
/// script, so with master 0's replica frozen, locks on master 0 are refused (nothing left
/// behind) and one held there is declared lost before its lease ends, while master 1 keeps
/// acknowledging. (A `WAIT` sent to any other master would answer 1 at once and let the
/// unacknowledged lock count.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_sync_replicas_waits_on_the_locks_own_master() {
    let cluster = RedisCluster::start(3, 1).expect("start 3 masters + 3 replicas");
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .sync_replicas(1, ms(300))
        .build()
        .await
        .expect("connect");
    let opts = LockOptions::new().ttl(ms(600));
    let (on_0, on_1) = (key_on(&cluster, 0, "held"), key_on(&cluster, 1, "kept"));
    let held = locker.acquire(&on_0, opts).await.expect("acknowledged");
    let kept = locker.acquire(&on_1, opts).await.expect("acknowledged");
    let replica = replica_of(&cluster, 0);
    cluster.pause(replica).expect("SIGSTOP master 0's replica");
    let stopped = Instant::now();
    let (refused_key, other_key) = (key_on(&cluster, 0, "refused"), key_on(&cluster, 1, "other"));
    let attempts = async {
        let wait = LockOptions::new().wait(ms(500));
        let refused = locker.acquire(&refused_key, wait).await;
        let failed_after = stopped.elapsed();
        let other = locker.acquire(&other_key, wait).await.map(drop);
        (refused, failed_after, other)
    };
    let lost = async {
        let declared = tokio::time::timeout(ms(1_000), held.lost()).await;
        declared.map(|()| stopped.elapsed())
    };
    let ((refused, failed_after, other), lost_after) = tokio::join!(attempts, lost);
    let kept_through = !kept.is_lost();
    let mut raw = Raw::cluster(&cluster.seed_urls()).await;
    let left = raw.lease_left(&refused_key).await;
    cluster.resume(replica).expect("SIGCONT");
    let back = within(ms(5_000), async || {
        locker
            .try_acquire(&refused_key, LockOptions::new())
            .await
            .is_ok_and(|g| g.is_some())
    })
    .await;
    let err = refused.expect_err("master 0's replica is frozen");
    let text = err.to_string();
    figure(
        "cluster_sync_replicas",
        format!(
            "master 0's replica frozen, sync_replicas(1, 300 ms): acquire on master 0 failed \
             after {} (lock left: {}), acquire on master 1: {}, lock held on master 0 \
             (ttl 600 ms) declared lost {} after the freeze, lock on master 1 kept: \
             {kept_through}; master 0 acknowledged again {} after the resume. Error: {text}",
            ms_f(failed_after),
            left.is_some(),
            if other.is_ok() { "ok" } else { "FAILED" },
            lost_after.as_ref().map_or("never".into(), |d| ms_f(*d)),
            back.map_or("never".into(), ms_f)
        ),
    );
    assert!(text.contains("acknowledged"), "{text}");
    assert!(
        matches!(&err, lockrt::LockError::Backend(b) if b.is_transient()),
        "{err:?}"
    );
    assert_eq!(left, None, "an unacknowledged lock was left");
    other.expect("master 1's replica acknowledges");
    let lost_after = lost_after.expect("unacknowledged renewals end in a declared loss");
    assert!(
        lost_after < ms(600),
        "loss declared after the lease: {lost_after:?}"
    );
    assert!(kept_through, "the lock on master 1 was lost");
    assert!(back.is_some(), "never acknowledged again");
    kept.release().await.expect("release on master 1");

    // The slot of a held lock moves to master 1, lock and all: its routed renewal (script
    // and `WAIT`) is answered `MOVED`, and the renewals follow the slot, with the new
    // master's replica acknowledging, before the lease ends.
    let moving = locker
        .acquire(&refused_key, LockOptions::new().ttl(ms(1_500)))
        .await
        .expect("acknowledged again");
    let slot = slot_of(format!("lock:{refused_key}"));
    cluster.migrate_slot(slot, 1).expect("migrate the slot");
    let moved = Instant::now();
    // Three renewal periods on the new master.
    let lost = tokio::time::timeout(ms(1_500), moving.lost()).await.is_ok();
    let raw_left = Raw::cluster(&cluster.seed_urls())
        .await
        .lease_left(&refused_key)
        .await;
    figure(
        "cluster_sync_replicas_slot_moved",
        format!(
            "lock (ttl 1.5 s) whose slot moved to another master: lost {lost} within {}, \
             lease left there {raw_left:?}",
            ms_f(moved.elapsed())
        ),
    );
    assert!(!lost, "the lock was lost when its slot moved");
    assert!(raw_left.is_some(), "the lock is gone from the new master");
    moving.release().await.expect("release on the new master");
}

/// `CLUSTER FAILOVER` of the master that serves a held lock with a queued waiter: the holder
/// keeps the lock (or is told it lost it before anyone else gets it), its renewals land on
/// the new master, and the waiter is served when the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_with_holder_and_waiter() {
    let cluster = Arc::new(RedisCluster::start(3, 1).expect("start 3 masters + 3 replicas"));
    let key = key_on(&cluster, 0, "fo");
    let (holder, waiter) = (
        cluster_locker(&cluster, ms(500)).await,
        cluster_locker(&cluster, ms(500)).await,
    );
    let mut raw = Raw::cluster(&cluster.seed_urls()).await;
    let ttl = ms(1_000);
    let guard = held(&holder, &key, ttl).await;
    let first_fence = guard.fence();
    let w = spawn_waiter(&waiter, &key, ms(20_000));
    raw.until_queued(&key, 1).await;
    let replica = replica_of(&cluster, 0);
    let scripts_before = scripts_run(&cluster, replica).await;

    // The failover, then a full lease of holding on the new master.
    let failover = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || cluster.failover(replica))
    };
    let after_failover = async {
        let took = failover.await.unwrap().expect("CLUSTER FAILOVER");
        // Renewals resume: the new master runs the holder's renewal scripts.
        let resumed = within(ms(3_000), async || {
            scripts_run(&cluster, replica).await > scripts_before
        })
        .await;
        // Another full lease on the new master.
        tokio::time::sleep(ttl).await;
        (took, resumed)
    };
    let outcome = tokio::select! {
        () = guard.lost() => Err(Instant::now()),
        done = after_failover => Ok(done),
    };
    let waiter_done_early = w.is_finished();
    let (took, resumed) = match outcome {
        Ok(done) => done,
        Err(lost_at) => {
            // Allowed, but then nobody may have held it before the loss was declared.
            if waiter_done_early {
                let (got, _) = w.await.unwrap();
                assert!(
                    got >= lost_at,
                    "the waiter got the lock before the holder was told"
                );
            }
            figure(
                "cluster_failover_with_holder_and_waiter",
                "the holder was told it lost the lock during the failover",
            );
            return;
        }
    };
    let pttl = raw.lease_left(&key).await;
    let renewals_on_new = scripts_run(&cluster, replica).await - scripts_before;
    assert!(
        !waiter_done_early,
        "the waiter got the lock while the holder held it"
    );
    assert!(
        pttl.is_some_and(|p| p > ms(500)),
        "renewals did not resume on the new master: PTTL {pttl:?}"
    );
    let released = Instant::now();
    guard.release().await.expect("release on the new master");
    let (got, g) = w.await.unwrap();
    let g = g.expect("the waiter is served");
    let handoff = got - released;
    assert!(g.fence() > first_fence);
    figure(
        "cluster_failover_with_holder_and_waiter",
        format!(
            "ttl 1 s: failover took {}; 0 losses; renewals on the new master resumed {} after \
             it ({renewals_on_new} scripts there, PTTL {} a lease later); waiter served {} \
             after the release, fence {} > {}",
            ms_f(took),
            resumed.map_or("never".into(), ms_f),
            ms_f(pttl.unwrap_or_default()),
            ms_f(handoff),
            g.fence(),
            first_fence
        ),
    );
    assert_woken_promptly(handoff);
}

/// A master frozen (SIGSTOP) under a held lock: the holder declares the loss before the
/// lock could expire on that master (the expiry of the last renewal it ran), the same locker takes
/// the lock again once the replica took over (its cluster connection rebuilt), and a lock the
/// same locker holds on a healthy master is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_sigstopped_loss_declared_and_lock_usable_after_failover() {
    let cluster = RedisCluster::start(3, 1).expect("start 3 masters + 3 replicas");
    let (key, healthy) = (key_on(&cluster, 0, "stop"), key_on(&cluster, 1, "ok"));
    let locker = cluster_locker(&cluster, ms(200)).await;
    let ttl = ms(1_000);
    let guard = held(&locker, &key, ttl).await;
    let other = held(&locker, &healthy, ms(3_000)).await;
    let replica = replica_of(&cluster, 0);
    let mut on_replica = Raw::single(&cluster.url(replica)).await;
    let () = redis::cmd("READONLY")
        .query_async(&mut on_replica)
        .await
        .expect("READONLY");
    let pttl = async |raw: &mut Raw| {
        let asked = Instant::now();
        let left: i64 = redis::cmd("PTTL")
            .arg(format!("lock:{key}"))
            .query_async(raw)
            .await
            .expect("PTTL");
        asked + ms(left.max(0) as u64)
    };
    // The master's expiry, read just before it stops: no later than the true one (a
    // renewal in between only moves it later).
    let master_expiry = pttl(&mut Raw::single(&cluster.url(0)).await).await;
    cluster.pause(0).expect("SIGSTOP");
    let paused = Instant::now();
    // The replica's copy, which the promoted replica will enforce: replication is
    // asynchronous, so it may be a renewal behind.
    let replica_expiry = pttl(&mut on_replica).await;

    // A key of a healthy master during the outage.
    let probe_start = Instant::now();
    let probe = locker
        .acquire(
            &key_on(&cluster, 2, "probe"),
            LockOptions::new().wait(ms(2_000)),
        )
        .await;
    let probe_took = probe_start.elapsed();
    let probe_ok = probe.is_ok();
    drop(probe);

    tokio::time::timeout(ms(5_000), guard.lost())
        .await
        .expect("loss declared");
    let lost = Instant::now();
    let margin = master_expiry.saturating_duration_since(lost);
    let replica_margin = if replica_expiry >= lost {
        format!("{} before", ms_f(replica_expiry - lost))
    } else {
        format!("{} after", ms_f(lost - replica_expiry))
    };
    let promoted_at = within(ms(20_000), async || {
        cluster
            .nodes()
            .is_ok_and(|n| n[replica].role == lockrt::testing::NodeRole::Master)
    })
    .await
    .map(|d| lost + d)
    .expect("the replica takes over");
    let promoted = promoted_at - paused;
    let usable = within(ms(15_000), async || {
        matches!(
            locker.try_acquire(&key, LockOptions::new().ttl(ttl)).await,
            Ok(Some(_))
        )
    })
    .await
    .map(|d| promoted_at + d);
    let other_lost = other.is_lost();
    cluster.resume(0).expect("SIGCONT");
    let usable = usable.expect("the lock is usable again after the failover");
    figure(
        "cluster_master_sigstopped",
        format!(
            "ttl 1 s, response timeout 200 ms: loss declared {} after SIGSTOP, {} before the \
             frozen master's expiry ({replica_margin} the replica's copy expires); replica \
             promoted {} after SIGSTOP; the same locker took the \
             lock again {} after SIGSTOP ({} after the promotion was seen); a key of a healthy \
             master during the outage: {} in {}; the locker's lock on a healthy master: {}",
            ms_f(lost - paused),
            ms_f(margin),
            ms_f(promoted),
            ms_f(usable.saturating_duration_since(paused)),
            ms_f(usable.saturating_duration_since(promoted_at)),
            if probe_ok { "acquired" } else { "failed" },
            ms_f(probe_took),
            if other_lost {
                "LOST (renewal batch failed with the frozen master's slot)"
            } else {
                "kept"
            },
        ),
    );
    assert!(
        lost < master_expiry,
        "loss declared after the frozen master's expiry"
    );
}

/// A slot migrated (MIGRATING/IMPORTING, keys moved, ownership changed) while a holder holds a
/// lock in it, a waiter waits for it, and 4 tasks lock other keys of the same slot in a loop:
/// no reply reaches the wrong request, the holder keeps its lock, the waiter is woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: cargo xtask chaos"]
async fn chaos_cluster_slot_migration_holder_and_waiter() {
    let cluster = Arc::new(RedisCluster::start(3, 0).expect("start 3 masters"));
    let key = key_on(&cluster, 0, "mig");
    let slot = slot_of(format!("lock:{key}"));
    let neighbours = keys_in_slot(slot, "nb", 4);
    let (holder, waiter, busy) = (
        cluster_locker(&cluster, ms(500)).await,
        cluster_locker(&cluster, ms(500)).await,
        cluster_locker(&cluster, ms(500)).await,
    );
    let mut raw = Raw::cluster(&cluster.seed_urls()).await;
    let guard = held(&holder, &key, ms(1_000)).await;
    let w = spawn_waiter(&waiter, &key, ms(60_000));
    raw.until_queued(&key, 1).await;

    // Load on the same slot: each task locks its own key over and over.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ok, tryagain, errors, mismatched) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let mut load = tokio::task::JoinSet::new();
    for k in neighbours.clone() {
        let (busy, stop, ok, tryagain, errors, mismatched) = (
            busy.clone(),
            stop.clone(),
            ok.clone(),
            tryagain.clone(),
            errors.clone(),
            mismatched.clone(),
        );
        load.spawn(async move {
            let mut last = 0;
            while !stop.load(Ordering::SeqCst) {
                match busy
                    .acquire(&k, LockOptions::new().ttl(ms(1_000)).wait(ms(2_000)))
                    .await
                {
                    Ok(g) => {
                        assert!(g.fence() > last, "fence went back on {k}");
                        last = g.fence();
                        match g.release().await {
                            Ok(()) => ok.fetch_add(1, Ordering::SeqCst),
                            Err(e) => {
                                count_error("release", &e, &tryagain, &errors, &mismatched);
                                0
                            }
                        };
                    }
                    Err(e) => count_error("acquire", &e, &tryagain, &errors, &mismatched),
                }
            }
        });
    }

    let migrated = {
        let cluster = cluster.clone();
        tokio::task::spawn_blocking(move || {
            let start = std::time::Instant::now();
            // Each phase lasts a while under load: MIGRATING/IMPORTING with the keys still on
            // the old master, then moved (ASK redirections), then the new owner (MOVED).
            let phase = std::time::Duration::from_millis(300);
            let m = cluster.begin_slot_migration(slot, 1)?;
            std::thread::sleep(phase);
            let mut moved = m.move_keys()?;
            std::thread::sleep(phase);
            // Keys written since the first pass.
            moved += m.move_keys()?;
            m.finish()?;
            Ok::<_, std::io::Error>((moved, start.elapsed()))
        })
    };
    let (moved, took) = migrated.await.unwrap().expect("slot migration");
    // A full lease on the new master before releasing.
    tokio::time::sleep(ms(1_000)).await;
    stop.store(true, Ordering::SeqCst);
    while let Some(res) = load.join_next().await {
        res.unwrap();
    }
    let holder_lost = guard.is_lost();
    let waiter_early = w.is_finished();
    let released = Instant::now();
    let release = guard.release().await;
    let (got, g) = w.await.unwrap();
    let handoff = got.saturating_duration_since(released);
    figure(
        "chaos_cluster_slot_migration_holder_and_waiter",
        format!(
            "slot {slot} moved from master 0 to 1 ({moved} keys) in {}; 4 tasks on the same slot \
             meanwhile: {} sections, {} acquires refused with TRYAGAIN (retryable), {} other \
             errors, {} mismatched replies; holder lost: {holder_lost}; waiter served {} after \
             the release",
            ms_f(took),
            ok.load(Ordering::SeqCst),
            tryagain.load(Ordering::SeqCst),
            errors.load(Ordering::SeqCst),
            mismatched.load(Ordering::SeqCst),
            ms_f(handoff)
        ),
    );
    assert_eq!(cluster.master_of_slot(slot).unwrap(), 1);
    assert_eq!(
        errors.load(Ordering::SeqCst),
        0,
        "errors other than TRYAGAIN"
    );
    assert_eq!(
        mismatched.load(Ordering::SeqCst),
        0,
        "replies paired with other requests"
    );
    assert!(
        !holder_lost && !waiter_early,
        "the holder lost the lock in the migration"
    );
    release.expect("release after the migration");
    g.expect("the waiter is served")
        .release()
        .await
        .expect("release by the waiter");
    assert_woken_promptly(handoff);
}

/// Counts an error of the load's `op` on the migrating slot: `TRYAGAIN` (a script finding some of
/// a lock's keys moved and others not, refused until the migration ends: retryable and
/// expected) in `tryagain`, anything else in `errors`, replies of other requests in
/// `mismatched` too.
fn count_error(
    op: &str,
    e: &lockrt::LockError,
    tryagain: &AtomicU64,
    errors: &AtomicU64,
    mismatched: &AtomicUsize,
) {
    if e.to_string().contains("TryAgain") {
        tryagain.fetch_add(1, Ordering::SeqCst);
        return;
    }
    if errors.fetch_add(1, Ordering::SeqCst) < 3 {
        eprintln!("{op} failed during the migration: {e}");
    }
    if e.to_string().contains("another request") {
        mismatched.fetch_add(1, Ordering::SeqCst);
    }
}

/// The node a locker's subscriber listens on freezes (SIGSTOP): a waiter of that locker for a
/// lock on another master is still served promptly when the holder releases (the subscriber
/// moves to another node instead of waiting on the frozen one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_subscriber_node_frozen_waiter_still_served() {
    let cluster = RedisCluster::start(3, 0).expect("start 3 masters");
    let (holder, waiter) = (
        cluster_locker(&cluster, ms(200)).await,
        cluster_locker(&cluster, ms(200)).await,
    );
    let mut raw = Raw::cluster(&cluster.seed_urls()).await;
    // One wait first: the waiter's subscriber connects to the first seed, node 0.
    let warm = key_on(&cluster, 1, "warm");
    let g = holder.acquire(&warm, LockOptions::new()).await.unwrap();
    let w = spawn_waiter(&waiter, &warm, ms(5_000));
    raw.until_queued(&warm, 1).await;
    g.release().await.unwrap();
    w.await.unwrap().1.unwrap().release().await.unwrap();

    cluster.pause(0).expect("SIGSTOP node 0");
    let paused = Instant::now();
    let key = key_on(&cluster, 1, "busy");
    let g = holder.acquire(&key, LockOptions::new()).await.unwrap();
    let w = spawn_waiter(&waiter, &key, ms(5_000));
    raw.until_queued(&key, 1).await;
    // Long enough for a subscription attempt on the frozen node to time out.
    tokio::time::sleep(ms(600)).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let (got, res) = w.await.unwrap();
    let handoff = got.saturating_duration_since(released);
    let outcome = match &res {
        Ok(_) => format!("served {} after the release", ms_f(handoff)),
        Err(e) => format!("FAILED: {e}"),
    };
    cluster.resume(0).expect("SIGCONT");
    figure(
        "cluster_subscriber_node_frozen_waiter_still_served",
        format!(
            "node 0 (the waiter's pub/sub node) frozen, lock on master 1 released {} after \
             the freeze: waiter {outcome}",
            ms_f(released - paused)
        ),
    );
    res.expect("the waiter is served")
        .release()
        .await
        .expect("release by the waiter");
    assert_woken_promptly(handoff);
}

/// One master frozen: a lock the same locker holds on another master keeps being renewed
/// (renewal outcomes are per lease, so one slot's timeout fails only its own leases).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_frozen_master_does_not_cost_locks_on_other_masters() {
    let cluster = RedisCluster::start(3, 0).expect("start 3 masters");
    let (frozen, healthy) = (
        key_on(&cluster, 0, "frozen"),
        key_on(&cluster, 1, "healthy"),
    );
    let locker = cluster_locker(&cluster, ms(200)).await;
    let ttl = ms(600);
    let on_frozen = held(&locker, &frozen, ttl).await;
    let on_healthy = held(&locker, &healthy, ttl).await;
    cluster.pause(0).expect("SIGSTOP");
    // Two leases long, and before the cluster notices the frozen node (2 s node timeout).
    tokio::time::sleep(2 * ttl).await;
    let (lost_frozen, lost_healthy) = (on_frozen.is_lost(), on_healthy.is_lost());
    cluster.resume(0).expect("SIGCONT");
    figure(
        "cluster_frozen_master_does_not_cost_locks_on_other_masters",
        format!(
            "master 0 frozen for 2 leases (ttl 600 ms): lock on master 0 lost: {lost_frozen}, \
             lock on master 1 lost: {lost_healthy}"
        ),
    );
    assert!(
        lost_frozen,
        "the frozen master's lock must be declared lost"
    );
    assert!(
        !lost_healthy,
        "the healthy master's lock was lost with the frozen one's batch"
    );
}
