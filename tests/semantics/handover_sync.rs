//! `sync_replicas` covers hand-overs: a lock a release hands straight to a queued waiter
//! counts only once a replica acknowledged it, exactly as a lock taken by a direct acquire.
//! Tried on a master with one replica whose link is cut (a proxy on the replication link that
//! forwards nothing), then failed over to that replica: no waiter holds a lock the replica
//! never saw, so no fence is issued twice.

use crate::support;

use std::time::Duration;

use lockrt::testing::{FaultProxy, RedisServer};
use lockrt::{LockError, LockGuard, LockOptions, Locker};
use support::{ms, opts, until_queued, until_subscribed};
use tokio::time::Instant;

/// Prints a measured figure: `FIGURE <case>: <text>`.
fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// Full syncs without the default 5 s wait for more replicas.
const DISKLESS: [&str; 4] = [
    "--repl-diskless-sync-delay",
    "0",
    "--repl-diskless-sync",
    "yes",
];

/// A master whose replicas sync at once.
fn master() -> RedisServer {
    RedisServer::start_with(&DISKLESS).expect("start master")
}

/// A replica of `master` that replicates through a fault proxy (the link a test cuts), in
/// sync when this returns.
async fn replica_of(master: &RedisServer) -> (RedisServer, FaultProxy) {
    let link = FaultProxy::in_front_of(master).expect("start the replication link");
    let port = link.addr().port().to_string();
    let mut args = vec!["--replicaof", "127.0.0.1", &port];
    args.extend(DISKLESS);
    let replica = RedisServer::start_with(&args).expect("start replica");
    let mut conn = conn_to(&replica).await;
    let start = Instant::now();
    loop {
        // A replica loading its first sync may not answer within the response timeout on a
        // busy machine: not synced yet.
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await;
        if info.is_ok_and(|i| i.contains("master_link_status:up")) {
            break;
        }
        assert!(start.elapsed() < ms(10_000), "the replica never synced");
        tokio::time::sleep(ms(10)).await;
    }
    (replica, link)
}

async fn conn_to(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    server
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("connection")
}

/// A locker on `server` whose every acquire and renewal needs one replica's acknowledgement.
async fn synced(server: &RedisServer) -> Locker {
    Locker::builder()
        .url(server.url())
        .sync_replicas(1, ms(200))
        .build()
        .await
        .expect("locker")
}

/// The waiting side of a hand-over: `waiter` waits up to `wait` for `key`.
fn wait_for(
    waiter: &Locker,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<LockGuard, LockError>> {
    let (waiter, key) = (waiter.clone(), key.to_owned());
    tokio::spawn(async move {
        waiter
            .acquire(&key, opts().ttl(ms(10_000)).wait(wait))
            .await
    })
}

/// With the replica's link cut, a release hands the lock to the queued waiter on the master
/// only: the waiter must not get a guard for it, as a direct acquire is refused at the same
/// time. After the master dies and the replica is promoted, a third client gets the next
/// fence the replica knows of; no holder may have had it already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_hand_over_is_not_handed_out() {
    let mut master = master();
    let (replica, link) = replica_of(&master).await;
    let (holder, waiter, direct) = (
        synced(&master).await,
        synced(&master).await,
        synced(&master).await,
    );
    let mut conn = conn_to(&master).await;
    // The holder's lease is short, so the promoted replica frees the lock it never saw
    // released soon after the failover.
    let held = holder
        .acquire("job", opts().ttl(ms(1_000)))
        .await
        .expect("acknowledged while the replica runs");
    let first = held.fence();
    let handed = wait_for(&waiter, "job", ms(1_500));
    until_queued(&mut conn, "job", 1).await;
    until_subscribed(&mut conn, "job", 1).await;

    // The replication link is cut: nothing reaches the replica, nor its acknowledgements
    // the master.
    link.blackhole();
    let cut = Instant::now();
    held.release().await.expect("released on the master");
    let refused = direct
        .acquire("other", LockOptions::new().wait(Duration::ZERO))
        .await;
    let handed = handed.await.expect("waiter task");
    let handed_after = cut.elapsed();
    let handed_fence = handed.as_ref().ok().map(LockGuard::fence);

    // Failover: the master dies, the replica (which never saw the hand-over) is promoted.
    master.kill();
    let mut promoted = conn_to(&replica).await;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut promoted)
        .await
        .expect("REPLICAOF NO ONE");
    let third = Locker::connect(&replica.url()).await.expect("third locker");
    let after = third
        .acquire("job", opts().wait(ms(5_000)))
        .await
        .expect("the promoted replica grants the lock");
    figure(
        "an_unacknowledged_hand_over_is_not_handed_out",
        format!(
            "replication link cut; a direct acquire: {}; the waiter handed the lock by a release: \
             {} after {handed_after:?}; after failover to the replica a third client got \
             fence {} (first holder's {first})",
            match &refused {
                Ok(_) => "granted".to_owned(),
                Err(e) => format!("refused ({e})"),
            },
            match (&handed, handed_fence) {
                (Ok(_), Some(f)) => format!("granted fence {f}"),
                (Err(e), _) => format!("not granted ({e})"),
                _ => unreachable!(),
            },
            after.fence()
        ),
    );
    let err = refused.expect_err("a direct acquire is not acknowledged");
    assert!(err.to_string().contains("acknowledged"), "{err}");
    assert!(
        handed.is_err(),
        "the waiter was handed a lock no replica acknowledged (fence {handed_fence:?}), while \
         a direct acquire was refused"
    );
    assert!(after.fence() > first);
    assert_ne!(
        Some(after.fence()),
        handed_fence,
        "a fence was issued twice"
    );
}

/// With the replica running, a hand-over under `sync_replicas` still reaches the waiter
/// promptly (its release message, then one acknowledged confirmation), with the fence the
/// release gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_hand_over_reaches_the_waiter() {
    let master = master();
    let _replica = replica_of(&master).await;
    let (holder, waiter) = (synced(&master).await, synced(&master).await);
    let mut conn = conn_to(&master).await;
    let mut took = Vec::new();
    for _ in 0..5 {
        let held = holder.acquire("job", opts()).await.expect("acquire");
        let handed = wait_for(&waiter, "job", ms(5_000));
        until_queued(&mut conn, "job", 1).await;
        until_subscribed(&mut conn, "job", 1).await;
        let start = Instant::now();
        held.release().await.expect("release");
        let guard = handed.await.unwrap().expect("handed over");
        took.push(start.elapsed());
        let value: String = redis::cmd("GET")
            .arg("lock:job")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(support::holder_fence_of_value(&value), guard.fence());
        guard.release().await.expect("release");
    }
    took.sort();
    figure(
        "an_acknowledged_hand_over_reaches_the_waiter",
        format!(
            "release to guard with sync_replicas(1), median of 5: {:?}",
            took[2]
        ),
    );
    assert!(
        took[2] < ms(500),
        "hand-over fell back to the timer: {took:?}"
    );
}

/// Seeds to run: the one in `LOCKRT_CHAOS_SEED` if set, else `default`.
fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("LOCKRT_CHAOS_SEED") {
        Ok(s) => vec![s.trim().parse().expect("LOCKRT_CHAOS_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

/// A small deterministic generator (xorshift64*), one per seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// What one seed's run saw.
#[derive(Default)]
struct Round {
    /// Fences of every guard handed out, before and after the cut.
    before: Vec<u64>,
    after: Vec<u64>,
    /// Acquires that failed (refused as unacknowledged, or timed out).
    failed: usize,
    /// The fence the promoted replica issued next.
    next: u64,
}

/// Three lockers with `sync_replicas(1)` take turns on one lock (hand-overs all the time);
/// at a random moment the replication link is cut, later the master dies and the replica is
/// promoted. Every fence a guard was handed must be below the one the promoted replica
/// issues next: a hand-over (or acquire) handed out without the replica's acknowledgement
/// would repeat a fence.
async fn hand_overs_cut_and_failed_over(seed: u64) -> Round {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut master = master();
    let (replica, link) = replica_of(&master).await;
    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicBool::new(false));
    let handed: Arc<Mutex<Round>> = Arc::default();
    let mut workers = Vec::new();
    for _ in 0..3 {
        let locker = synced(&master).await;
        let (stop, cut, handed) = (stop.clone(), cut.clone(), handed.clone());
        let hold = ms(rng.below(20));
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let opts = opts().ttl(ms(1_000)).wait(ms(1_000));
                match locker.acquire("job", opts).await {
                    Ok(g) => {
                        {
                            let mut h = handed.lock().unwrap();
                            if cut.load(Ordering::SeqCst) {
                                h.after.push(g.fence());
                            } else {
                                h.before.push(g.fence());
                            }
                        }
                        tokio::time::sleep(hold).await;
                        let _ = g.release().await;
                    }
                    Err(_) => handed.lock().unwrap().failed += 1,
                }
            }
        }));
    }
    tokio::time::sleep(ms(100 + rng.below(500))).await;
    // Marked before the cut: a guard counted "before" was surely acknowledged.
    cut.store(true, Ordering::SeqCst);
    link.blackhole();
    tokio::time::sleep(ms(200 + rng.below(600))).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        tokio::time::timeout(ms(10_000), w)
            .await
            .expect("a worker did not stop")
            .unwrap();
    }
    master.kill();
    let mut promoted = conn_to(&replica).await;
    let () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut promoted)
        .await
        .expect("REPLICAOF NO ONE");
    let third = Locker::connect(&replica.url()).await.expect("third locker");
    let next = third
        .acquire("job", opts().wait(ms(5_000)))
        .await
        .expect("the promoted replica grants the lock")
        .fence();
    let mut round = std::mem::take(&mut *handed.lock().unwrap());
    round.next = next;
    round
}

/// The chaos schedule of hand-overs under `sync_replicas` with the replication link cut at a
/// random moment and a failover to the replica: no fence is handed out twice. Replay one seed
/// with `LOCKRT_CHAOS_SEED=<seed>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_hand_overs_repeat_no_fence_after_a_failover_to_the_replica() {
    let mut failures = Vec::new();
    for seed in seeds(1..=8) {
        let r = hand_overs_cut_and_failed_over(seed).await;
        let repeated: Vec<u64> = (r.before.iter().chain(&r.after))
            .copied()
            .filter(|&f| f >= r.next)
            .collect();
        figure(
            "chaos_hand_overs_repeat_no_fence_after_a_failover_to_the_replica",
            format!(
                "seed {seed}: {} guards before the cut, {} after it, {} acquires failed; the \
                 promoted replica's next fence {}: {} handed-out fences at or above it",
                r.before.len(),
                r.after.len(),
                r.failed,
                r.next,
                repeated.len()
            ),
        );
        assert!(
            !r.before.is_empty(),
            "seed {seed}: no hand-over before the cut"
        );
        if !repeated.is_empty() {
            failures.push(format!(
                "seed {seed} (replay: LOCKRT_CHAOS_SEED={seed}): fences {repeated:?} handed \
                 out, the promoted replica issued {} next",
                r.next
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
