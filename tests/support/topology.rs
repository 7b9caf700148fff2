//! Shared by the `topology_*` tests: the behaviour cases that must hold on every topology
//! (each takes a [`Topo`]: how to build a locker on it, and a direct connection to look at and
//! tamper with its keys), figures, and small timing helpers.
//!
//! Every case prints one `FIGURE <case>: ...` line (RELIABILITY.md collects them) and panics
//! with the case's name in the message when the behaviour is broken.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use lockrt::{LockError, LockGuard, LockOptions, Locker, LockerBuilder};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, Cmd, Pipeline, RedisFuture, Value};
use tokio::time::Instant;

// Shared with the other tests, re-exported so that a topology test imports from one place.
pub use super::ms;
pub use super::proxy_faults::{figure, within};

/// Milliseconds with two decimals, for figures.
pub fn ms_f(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// The median (upper middle) of `v`.
pub fn p50(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[v.len() / 2]
}

/// A task in which `locker` waits up to `wait` for `key`: the moment the wait ended, and what
/// it got.
pub fn spawn_waiter(
    locker: &Locker,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<(Instant, Result<LockGuard, LockError>)> {
    let (locker, key) = (locker.clone(), key.to_owned());
    tokio::spawn(async move {
        let g = locker.acquire(&key, LockOptions::new().wait(wait)).await;
        (Instant::now(), g)
    })
}

/// A waiter served `handoff` after the release was woken by the release's message, not by its
/// fallback timer.
pub fn assert_woken_promptly(handoff: Duration) {
    assert!(
        handoff < ms(500),
        "waiter woken by the fallback timer: {handoff:?}"
    );
}

/// A direct connection to the lock servers: one server, or a whole cluster.
#[derive(Clone)]
pub enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    pub async fn single(url: &str) -> Raw {
        let client = redis::Client::open(url).expect("url");
        Raw::Single(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("direct connection"),
        )
    }

    pub async fn cluster(seeds: &[String]) -> Raw {
        let client = redis::cluster::ClusterClient::new(seeds.to_vec()).expect("seeds");
        Raw::Cluster(
            client
                .get_async_connection()
                .await
                .expect("cluster connection"),
        )
    }

    /// Remaining lease of the lock `key` (default prefix), `None` when not held.
    pub async fn lease_left(&mut self, key: &str) -> Option<Duration> {
        let ms: i64 = self.pttl(format!("lock:{key}")).await.expect("PTTL");
        (ms > 0).then(|| Duration::from_millis(ms as u64))
    }

    /// How many waiters are queued for the lock `key`.
    pub async fn queued(&mut self, key: &str) -> usize {
        self.zcard(format!("{{lock:{key}}}:q"))
            .await
            .expect("ZCARD")
    }

    /// Waits (bounded: 5 s) until `n` waiters are queued for `key`.
    pub async fn until_queued(&mut self, key: &str, n: usize) {
        let mut raw = self.clone();
        let seen = within(ms(5_000), async || raw.queued(key).await == n).await;
        assert!(seen.is_some(), "never saw {n} queued waiter(s) for {key}");
    }
}

impl ConnectionLike for Raw {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Raw::Single(c) => c.req_packed_command(cmd),
            Raw::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Raw::Single(c) => c.req_packed_commands(cmd, offset, count),
            Raw::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// A topology under test: how to configure a locker on it, and a direct connection.
pub struct Topo {
    /// `cluster` or `sentinel`: the prefix of every figure.
    pub name: &'static str,
    pub builder: Box<dyn Fn() -> LockerBuilder + Send + Sync>,
    pub raw: Raw,
}

impl Topo {
    pub async fn locker(&self) -> Locker {
        (self.builder)().build().await.expect("connect")
    }

    fn case(&self, case: &str) -> String {
        format!("{}_{case}", self.name)
    }
}

/// A lock is the key `lock:<key>` with a positive PTTL while held and gone after release.
pub async fn acquire_release(t: &Topo) {
    let case = t.case("acquire_release");
    let locker = t.locker().await;
    let mut raw = t.raw.clone();
    let start = Instant::now();
    let guard = locker
        .acquire("basic:1", LockOptions::new().ttl(ms(5_000)))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let acquired = start.elapsed();
    let pttl = raw.lease_left("basic:1").await;
    assert!(pttl.is_some_and(|p| p > ms(4_000)), "{case}: PTTL {pttl:?}");
    let start = Instant::now();
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let released = start.elapsed();
    assert_eq!(raw.lease_left("basic:1").await, None, "{case}: key left");
    figure(
        &case,
        format!(
            "acquired in {}, key PTTL {} (ttl 5 s), released in {}, key gone",
            ms_f(acquired),
            ms_f(pttl.unwrap_or_default()),
            ms_f(released)
        ),
    );
}

/// 2 lockers x 4 tasks x 10 sections on one key, each a read-yield-write of a shared counter
/// (a lost update would leave it short) and a check that nobody else is inside; the fences
/// taken in the order sections ran strictly increase.
pub async fn mutual_exclusion(t: &Topo) {
    const LOCKERS: usize = 2;
    const TASKS: usize = 4;
    const ROUNDS: usize = 10;
    let case = t.case("mutual_exclusion");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(std::sync::Mutex::new(Vec::new()));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..LOCKERS {
        let locker = t.locker().await;
        for _ in 0..TASKS {
            let (locker, counter, inside, overlaps, fences) = (
                locker.clone(),
                counter.clone(),
                inside.clone(),
                overlaps.clone(),
                fences.clone(),
            );
            tasks.spawn(async move {
                for _ in 0..ROUNDS {
                    let opts = LockOptions::new().ttl(ms(2_000)).wait(ms(20_000));
                    let section = async {
                        if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        let fence = lockrt::current_lock().map(|h| h.fence());
                        fences.lock().unwrap().push(fence.unwrap_or(0));
                        let v = counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        tokio::time::sleep(ms(1)).await;
                        counter.store(v + 1, Ordering::SeqCst);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    };
                    locker.run("mx", opts, section).await?;
                }
                Ok::<(), lockrt::LockError>(())
            });
        }
    }
    while let Some(res) = tasks.join_next().await {
        res.unwrap().unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    let took = start.elapsed();
    let total = (LOCKERS * TASKS * ROUNDS) as u64;
    let counted = counter.load(Ordering::SeqCst);
    let fences = fences.lock().unwrap().clone();
    let increasing = fences.windows(2).all(|w| w[0] < w[1]);
    figure(
        &case,
        format!(
            "{total} sections by {LOCKERS} lockers x {TASKS} tasks in {:.2} s: {} lost updates, \
             {} overlaps, fences strictly increasing: {increasing}",
            took.as_secs_f64(),
            total - counted,
            overlaps.load(Ordering::SeqCst)
        ),
    );
    assert_eq!(counted, total, "{case}: lost updates");
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "{case}: overlapping sections"
    );
    assert!(increasing, "{case}: fences out of order: {fences:?}");
}

/// A waiter in another locker, queued and subscribed, gets the lock when the holder releases:
/// time from the release call to the waiter holding it, over `rounds` hand-offs.
pub async fn hand_off(t: &Topo, rounds: usize) -> Duration {
    let case = t.case("hand_off");
    let (holder, waiter) = (t.locker().await, t.locker().await);
    let mut raw = t.raw.clone();
    let mut times = Vec::new();
    for _ in 0..rounds {
        let guard = holder
            .acquire("handoff", LockOptions::new().ttl(ms(5_000)))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let waiting = spawn_waiter(&waiter, "handoff", ms(5_000));
        raw.until_queued("handoff", 1).await;
        let released = Instant::now();
        guard
            .release()
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let (got, g) = waiting.await.unwrap();
        let g = g.unwrap_or_else(|e| panic!("{case}: waiter: {e}"));
        times.push(got - released);
        g.release().await.unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    let median = p50(&times);
    let max = times.iter().max().copied().unwrap_or_default();
    figure(
        &case,
        format!(
            "{rounds} hand-offs between 2 lockers, release call to waiter holding: p50 {}, max {}",
            ms_f(median),
            ms_f(max)
        ),
    );
    assert!(
        max < ms(500),
        "{case}: a hand-off took {max:?} (woken by the fallback timer?)"
    );
    median
}

/// One locker holds every key in `keys` with a 300 ms lease for 1.2 s (3 or more renewals
/// each): none is lost, each still has most of a lease left.
pub async fn renewals(t: &Topo, keys: &[String]) {
    let case = t.case("renewals");
    let locker = t.locker().await;
    let mut raw = t.raw.clone();
    let mut guards = Vec::new();
    for k in keys {
        let g = locker
            .acquire(k, LockOptions::new().ttl(ms(300)))
            .await
            .unwrap_or_else(|e| panic!("{case}: {k}: {e}"));
        guards.push(g);
    }
    tokio::time::sleep(ms(1_200)).await;
    let mut least = ms(300);
    for (k, g) in keys.iter().zip(&guards) {
        assert!(!g.is_lost(), "{case}: {k} lost");
        let p = raw.lease_left(k).await;
        assert!(p.is_some(), "{case}: {k} not held in Redis");
        least = least.min(p.unwrap_or_default());
    }
    for g in guards {
        g.release().await.unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    figure(
        &case,
        format!(
            "{} locks with ttl 300 ms held 1.2 s by one locker: 0 lost, least PTTL left {}",
            keys.len(),
            ms_f(least)
        ),
    );
}

/// Fences strictly increase across two lockers, also after the lock expired unreleased.
pub async fn fencing(t: &Topo) {
    let case = t.case("fencing");
    let lockers = [t.locker().await, t.locker().await];
    let mut raw = t.raw.clone();
    let mut fences = Vec::new();
    for i in 0..10 {
        let g = lockers[i % 2]
            .acquire("fence", LockOptions::new().ttl(ms(2_000)))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        fences.push(g.fence());
        g.release().await.unwrap_or_else(|e| panic!("{case}: {e}"));
    }
    // Expired instead of released: the next holder still gets a higher fence.
    let g = lockers[0]
        .acquire("fence", LockOptions::new().ttl(ms(100)).watchdog(false))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    fences.push(g.fence());
    tokio::time::timeout(ms(1_000), g.lost())
        .await
        .unwrap_or_else(|_| panic!("{case}: a lease without watchdog never ran out"));
    let gone = within(ms(2_000), async || raw.lease_left("fence").await.is_none()).await;
    assert!(gone.is_some(), "{case}: the lease never expired");
    drop(g);
    let g = lockers[1]
        .acquire("fence", LockOptions::new().ttl(ms(2_000)))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    fences.push(g.fence());
    g.release().await.unwrap_or_else(|e| panic!("{case}: {e}"));
    let increasing = fences.windows(2).all(|w| w[0] < w[1]);
    figure(
        &case,
        format!(
            "{} acquisitions by 2 lockers (one lease left to expire): fences strictly \
             increasing: {increasing}",
            fences.len()
        ),
    );
    assert!(increasing, "{case}: {fences:?}");
}

/// The lock key deleted from outside: the holder learns within a third of the ttl (plus
/// scheduling), and `run` returns `Lost`.
pub async fn loss_detection(t: &Topo) {
    let case = t.case("loss_detection");
    let locker = t.locker().await;
    let mut raw = t.raw.clone();
    let guard = locker
        .acquire("victim", LockOptions::new().ttl(ms(600)))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let () = raw.del("lock:victim").await.expect("DEL");
    let deleted = Instant::now();
    tokio::time::timeout(ms(2_000), guard.lost())
        .await
        .unwrap_or_else(|_| panic!("{case}: loss never declared"));
    let after = deleted.elapsed();
    figure(
        &case,
        format!(
            "ttl 600 ms, lock key deleted from outside: loss declared after {}",
            ms_f(after)
        ),
    );
    assert!(
        after < ms(600 / 3 + 200),
        "{case}: loss noticed after {after:?}"
    );
    assert!(
        guard.release().await.is_err_and(|e| e.is_lost()),
        "{case}: release of a lost lock"
    );
}

/// A directory of its own under the system's temp dir, removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new(stem: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("lockrt-{stem}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
