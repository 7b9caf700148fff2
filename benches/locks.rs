//! Lock benchmarks: `cargo bench --bench locks` (add `-- --quick` for a smoke run).
//!
//! Starts its own `redis-server` on loopback, runs every workload against lockrt
//! (`Locker::acquire` + `release`, `Locker::run`, the attribute), the `rslock` crate and a
//! floor written with plain `redis`, and prints one markdown table, also written to
//! `target/bench-locks.md`. Every figure is the median over `BENCH_ROUNDS` rounds; ratios
//! are computed within the run. Sizes come from `BENCH_*` environment variables (see
//! [`Config::from_env`]).
//!
//! A counting global allocator (`stats_alloc`) gives the exact client heap per held lock; it
//! costs a few atomic increments per allocation, for every implementation alike.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockGuard, LockOptions, Locker};
use redis::AsyncCommands;
use redis::aio::{ConnectionManager, MultiplexedConnection};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use tokio::sync::Barrier;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// The compare-and-delete release of the floor (the classic single-instance Redis lock).
const FLOOR_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// Lease for every lock that is not about expiry.
const TTL: Duration = Duration::from_secs(30);
/// Upper bound for any single wait, so no loop can hang the run.
const WAIT: Duration = Duration::from_secs(30);
/// rslock's `LockManager::new` defaults (retry count 3, random delay in 0..200 ms).
const RSLOCK_RETRIES: u32 = 3;
const RSLOCK_DELAY: Duration = Duration::from_millis(200);

/// The options every lockrt implementation uses (the attribute says the same in its args).
fn opts() -> LockOptions {
    LockOptions::new().ttl(TTL).wait(WAIT)
}

// ------------------------------------------------------------------------------------------
// The attribute column
// ------------------------------------------------------------------------------------------

/// One critical section through the attribute, with the same ttl and wait as [`opts`].
#[lockrt::distributed_lock(key = "bench:{k}", locker = locker, ttl = "30s", wait = "30s")]
async fn attr_section(locker: &Locker, k: &str) -> Result<(), LockError> {
    Ok(())
}

// ------------------------------------------------------------------------------------------
// Configuration
// ------------------------------------------------------------------------------------------

/// Sizes of the run. Full defaults follow the issue; `--quick` shrinks them for a smoke run.
#[derive(Debug, Clone)]
struct Config {
    quick: bool,
    /// `BENCH_ROUNDS`: rounds per workload, each figure is the median over them.
    rounds: usize,
    /// `BENCH_PAIRS`: acquire+release pairs per round, uncontended.
    pairs: usize,
    /// `BENCH_TASKS`: contending tasks (split over 2 lockers).
    tasks: usize,
    /// `BENCH_SECTIONS`: critical sections per contending task.
    sections: usize,
    /// `BENCH_HANDOFFS`: hand-off samples per round.
    handoffs: usize,
    /// `BENCH_HOLD_MS`: how long the holder holds in the hand-off workload.
    hold: Duration,
    /// `BENCH_PAR_TASKS`: tasks on distinct keys.
    par_tasks: usize,
    /// `BENCH_PAR_CYCLES`: lock cycles per parallel task.
    par_cycles: usize,
    /// `BENCH_SOLO_CYCLES`: lock cycles of the single-task baseline.
    solo_cycles: usize,
    /// `BENCH_HELD`: locks held at once by one locker.
    held: usize,
    /// `BENCH_HELD_TTL_MS`: their ttl.
    held_ttl: Duration,
    /// `BENCH_HELD_PERIODS`: how many ttls they are held for.
    held_periods: u32,
    /// `BENCH_HELD_ROUNDS`: rounds of the many-held workload (default: `rounds`).
    held_rounds: usize,
}

impl Config {
    /// Reads `--quick` and the `BENCH_*` variables (each overrides the preset).
    fn from_env() -> Config {
        let quick = std::env::args().any(|a| a == "--quick");
        let env = |name: &str, full: u64, quick_v: u64| -> u64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if quick { quick_v } else { full })
        };
        let rounds = env("BENCH_ROUNDS", 5, 2).max(1) as usize;
        Config {
            quick,
            rounds,
            pairs: env("BENCH_PAIRS", 5_000, 500).max(1) as usize,
            tasks: env("BENCH_TASKS", 32, 32).max(1) as usize,
            sections: env("BENCH_SECTIONS", 50, 10).max(1) as usize,
            handoffs: env("BENCH_HANDOFFS", 20, 5).max(1) as usize,
            hold: Duration::from_millis(env("BENCH_HOLD_MS", 100, 100).max(20)),
            par_tasks: env("BENCH_PAR_TASKS", 64, 64).max(1) as usize,
            par_cycles: env("BENCH_PAR_CYCLES", 200, 50).max(1) as usize,
            solo_cycles: env("BENCH_SOLO_CYCLES", 2_000, 500).max(1) as usize,
            held: env("BENCH_HELD", 10_000, 2_000).max(1) as usize,
            held_ttl: Duration::from_millis(env("BENCH_HELD_TTL_MS", 3_000, 1_500).max(300)),
            held_periods: env("BENCH_HELD_PERIODS", 3, 2).max(1) as u32,
            held_rounds: env("BENCH_HELD_ROUNDS", rounds as u64, 1).max(1) as usize,
        }
    }
}

// ------------------------------------------------------------------------------------------
// Statistics and the table
// ------------------------------------------------------------------------------------------

/// Nearest-rank percentile of a sorted slice (`p` in 0..=1).
fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per-round figures, keyed by (workload, implementation, metric); medians at the end.
#[derive(Default)]
struct Figures {
    rounds: HashMap<(String, String, String), Vec<f64>>,
}

impl Figures {
    fn add(&mut self, workload: &str, imp: &str, metric: &str, v: f64) {
        self.rounds
            .entry((workload.into(), imp.into(), metric.into()))
            .or_default()
            .push(v);
    }

    /// The median over rounds (NaN when never measured).
    fn get(&self, workload: &str, imp: &str, metric: &str) -> f64 {
        self.rounds
            .get(&(workload.into(), imp.into(), metric.into()))
            .map_or(f64::NAN, |v| median(v.clone()))
    }
}

#[derive(Clone, Copy)]
enum Unit {
    Us,
    Ms,
    PerSec,
    Count,
    Bytes,
    Pct,
    X,
}

fn fmt_value(v: f64, unit: Unit) -> String {
    if v.is_nan() {
        return "n/a".into();
    }
    match unit {
        Unit::Us => format!("{v:.1} µs"),
        Unit::Ms => format!("{v:.2} ms"),
        Unit::PerSec => format!("{v:.0}/s"),
        Unit::Count => {
            if v.fract() == 0.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        }
        Unit::Bytes => format!("{v:.0} B"),
        Unit::Pct => format!("{v:.1} %"),
        Unit::X => format!("{v:.2}x"),
    }
}

struct Row {
    workload: String,
    imp: String,
    metric: String,
    value: String,
    ratio: String,
    target: String,
    met: String,
}

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// A row; `ratio` is printed as `N.NNx` (with its basis), `met` as yes/NO.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &mut self,
        workload: &str,
        imp: &str,
        metric: &str,
        value: f64,
        unit: Unit,
        ratio: Option<(f64, &str)>,
        target: &str,
        met: Option<bool>,
    ) {
        self.rows.push(Row {
            workload: workload.into(),
            imp: imp.into(),
            metric: metric.into(),
            value: fmt_value(value, unit),
            ratio: ratio.map_or_else(String::new, |(r, basis)| {
                if r.is_nan() {
                    "n/a".into()
                } else {
                    format!("{r:.2}x {basis}")
                }
            }),
            target: target.into(),
            met: match met {
                Some(true) => "yes".into(),
                Some(false) => "**NO**".into(),
                None => String::new(),
            },
        });
    }

    fn markdown(&self) -> String {
        let mut s = String::from(
            "| workload | implementation | metric | value | ratio | target | met? |\n\
             |---|---|---|---:|---:|---|---|\n",
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.workload, r.imp, r.metric, r.value, r.ratio, r.target, r.met
            );
        }
        s
    }
}

// ------------------------------------------------------------------------------------------
// Connections and small helpers
// ------------------------------------------------------------------------------------------

struct Env {
    url: String,
    client: redis::Client,
}

impl Env {
    /// The kind of connection lockrt uses (a `ConnectionManager`, multiplexed).
    async fn manager(&self) -> Res<ConnectionManager> {
        Ok(ConnectionManager::new(self.client.clone()).await?)
    }

    /// A dedicated multiplexed connection without response timeout (for `BLPOP ... 0`).
    async fn blocking_conn(&self) -> Res<MultiplexedConnection> {
        let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?)
    }

    fn rslock(&self) -> rslock::LockManager {
        let mut m = rslock::LockManager::new(vec![self.url.clone()]);
        m.set_retry(RSLOCK_RETRIES, RSLOCK_DELAY);
        m
    }
}

/// The floor's lock: `SET NX PX` and an `EVALSHA` compare-and-delete on one connection.
#[derive(Clone)]
struct Floor {
    conn: ConnectionManager,
    sha: String,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl Floor {
    async fn new(env: &Env) -> Res<Floor> {
        let mut conn = env.manager().await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(FLOOR_RELEASE)
            .query_async(&mut conn)
            .await?;
        Ok(Floor {
            conn,
            sha,
            next: Arc::default(),
        })
    }

    fn token(&self) -> String {
        // Unique per acquisition like lockrt's 128-bit token (uniqueness is all the floor needs).
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{n:032x}")
    }

    /// One attempt; the token when acquired.
    async fn try_lock(&self, key: &str) -> Res<Option<String>> {
        let token = self.token();
        let mut conn = self.conn.clone();
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await?;
        Ok(ok.map(|_| token))
    }

    async fn unlock(&self, key: &str, token: &str) -> Res<()> {
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(1)
            .arg(key)
            .arg(token)
            .query_async(&mut conn)
            .await?;
        if n != 1 {
            return Err("floor: release found another owner".into());
        }
        Ok(())
    }
}

/// rslock's lock with a bounded retry loop around `lock` (its own `acquire` loops forever).
async fn rslock_lock(m: &rslock::LockManager, key: &str, ttl: Duration) -> Res<rslock::Lock> {
    let deadline = Instant::now() + WAIT;
    loop {
        match m.lock(key, ttl).await {
            Ok(l) => return Ok(l),
            Err(rslock::LockError::Unavailable) if Instant::now() < deadline => {}
            Err(e) => return Err(format!("rslock: {e}").into()),
        }
    }
}

/// Latencies of sequential operations and the time they took in all, gathered over chunks.
#[derive(Default)]
struct Seq {
    lat: Vec<Duration>,
    total: Duration,
}

impl Seq {
    /// Runs `n` more operations one after another, timing each.
    async fn run<F, Fut>(&mut self, n: usize, mut op: F) -> Res<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Res<()>>,
    {
        let start = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            op().await?;
            self.lat.push(t.elapsed());
        }
        self.total += start.elapsed();
        Ok(())
    }

    /// (p50 µs, p99 µs, operations per second).
    fn summary(mut self) -> (f64, f64, f64) {
        self.lat.sort();
        (
            us(pct(&self.lat, 0.50)),
            us(pct(&self.lat, 0.99)),
            self.lat.len() as f64 / self.total.as_secs_f64(),
        )
    }
}

async fn counter_set(conn: &mut ConnectionManager, v: i64) -> Res<()> {
    let () = conn.set("bench:counter", v).await?;
    Ok(())
}

/// One critical section of the contended workload: read-modify-write on a plain connection.
async fn section(conn: &mut ConnectionManager) -> Res<Duration> {
    let t = Instant::now();
    let v: i64 = conn.get("bench:counter").await?;
    let () = conn.set("bench:counter", v + 1).await?;
    Ok(t.elapsed())
}

fn lost_updates(expected: usize, got: i64) -> f64 {
    expected as f64 - got as f64
}

// ------------------------------------------------------------------------------------------
// 0. Baseline round trip
// ------------------------------------------------------------------------------------------

const BASELINE: &str = "0 baseline";

/// `PING` round trips: back to back, and after 50 ms of idleness (what a hand-off starts
/// from: an idle client, server and waiter).
async fn baseline(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let mut conn = env.manager().await?;
    for round in 0..=cfg.rounds {
        let mut hot = Vec::with_capacity(1000);
        for _ in 0..1000 {
            let t = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            hot.push(t.elapsed());
        }
        let mut idle = Vec::with_capacity(10);
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let t = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            idle.push(t.elapsed());
        }
        if round > 0 {
            hot.sort();
            idle.sort();
            figs.add(BASELINE, "PING", "hot p50", us(pct(&hot, 0.5)));
            figs.add(BASELINE, "PING", "idle p50", us(pct(&idle, 0.5)));
        }
    }
    Ok(())
}

fn report_baseline(figs: &Figures, t: &mut Table) {
    let hot = figs.get(BASELINE, "PING", "hot p50");
    t.row(
        BASELINE,
        "plain redis",
        "PING RTT p50, back to back",
        hot,
        Unit::Us,
        None,
        "",
        None,
    );
    let idle = figs.get(BASELINE, "PING", "idle p50");
    t.row(
        BASELINE,
        "plain redis",
        "PING RTT p50, after 50 ms idle",
        idle,
        Unit::Us,
        Some((idle / hot, "of back to back")),
        "",
        None,
    );
}

// ------------------------------------------------------------------------------------------
// 1 + 2. Uncontended
// ------------------------------------------------------------------------------------------

const UNCONTENDED: &str = "1 uncontended";
/// Chunks each round's pairs are split into, per implementation, interleaved.
const UNC_CHUNKS: usize = 10;
const IMPS_UNC: [&str; 5] = [
    "floor (SET NX PX + EVALSHA)",
    "lockrt acquire/release",
    "lockrt run",
    "lockrt attribute",
    "rslock",
];

async fn uncontended(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let floor = Floor::new(env).await?;
    let locker = Locker::connect(&env.url).await?;
    let rs = env.rslock();

    for round in 0..=cfg.rounds {
        // Round 0 is the warm-up (connections, scripts loaded, allocator and caches warm).
        let n = if round == 0 {
            (cfg.pairs / 5).max(100)
        } else {
            cfg.pairs
        };
        // The machine's speed drifts: run the implementations interleaved in chunks, in a
        // rotating order, so drift hits all of them alike.
        let chunks = UNC_CHUNKS.min(n);
        let mut seqs: [Seq; 5] = Default::default();
        for chunk in 0..chunks {
            let m = n / chunks + usize::from(chunk < n % chunks);
            for k in 0..IMPS_UNC.len() {
                let which = (k + round + chunk) % IMPS_UNC.len();
                let seq = &mut seqs[which];
                match which {
                    0 => {
                        seq.run(m, || async {
                            let t = floor
                                .try_lock("bench:u:floor")
                                .await?
                                .ok_or("floor: lock busy")?;
                            floor.unlock("bench:u:floor", &t).await
                        })
                        .await?
                    }
                    1 => {
                        seq.run(m, || async {
                            let g = locker.acquire("bench:u:acq", opts()).await?;
                            g.release().await?;
                            Ok(())
                        })
                        .await?
                    }
                    2 => {
                        seq.run(m, || async {
                            locker.run("bench:u:run", opts(), async {}).await?;
                            Ok(())
                        })
                        .await?
                    }
                    3 => {
                        seq.run(m, || async {
                            attr_section(&locker, "u:attr").await?;
                            Ok(())
                        })
                        .await?
                    }
                    _ => {
                        seq.run(m, || async {
                            let l = rslock_lock(&rs, "bench:u:rslock", TTL).await?;
                            rs.unlock(&l).await;
                            Ok(())
                        })
                        .await?
                    }
                }
            }
        }
        if round > 0 {
            for (imp, seq) in IMPS_UNC.iter().zip(seqs) {
                let (p50, p99, per_sec) = seq.summary();
                figs.add(UNCONTENDED, imp, "p50", p50);
                figs.add(UNCONTENDED, imp, "p99", p99);
                figs.add(UNCONTENDED, imp, "pairs/s", per_sec);
            }
        }
        eprintln!("  uncontended round {round} done");
    }
    Ok(())
}

fn report_uncontended(figs: &Figures, t: &mut Table) {
    let floor = IMPS_UNC[0];
    for imp in IMPS_UNC {
        for (metric, unit) in [
            ("p50", Unit::Us),
            ("p99", Unit::Us),
            ("pairs/s", Unit::PerSec),
        ] {
            let v = figs.get(UNCONTENDED, imp, metric);
            let base = figs.get(UNCONTENDED, floor, metric);
            let ratio = (imp != floor).then(|| (v / base, "of floor"));
            // The target is on lockrt's p50; rslock is shown for comparison.
            let (target, met) = if metric == "p50" && imp.starts_with("lockrt") {
                ("≤ 1.10x floor", Some(v / base <= 1.10))
            } else {
                ("", None)
            };
            t.row(UNCONTENDED, imp, metric, v, unit, ratio, target, met);
        }
    }
    let attr = figs.get(UNCONTENDED, "lockrt attribute", "p50");
    let run = figs.get(UNCONTENDED, "lockrt run", "p50");
    let r = attr / run;
    t.row(
        "2 attribute overhead",
        "attribute vs run",
        "p50 ratio",
        r,
        Unit::X,
        None,
        "≤ 1.03x",
        Some(r <= 1.03),
    );
    let attr = figs.get(UNCONTENDED, "lockrt attribute", "pairs/s");
    let run = figs.get(UNCONTENDED, "lockrt run", "pairs/s");
    let r = run / attr;
    t.row(
        "2 attribute overhead",
        "attribute vs run",
        "time per pair ratio (from pairs/s)",
        r,
        Unit::X,
        None,
        "≤ 1.03x",
        Some(r <= 1.03),
    );
}

// ------------------------------------------------------------------------------------------
// 3. Contended
// ------------------------------------------------------------------------------------------

const CONTENDED: &str = "3 contended";

struct ContendedRound {
    per_sec: f64,
    lost: f64,
    /// The longest wait of any task's 2nd and later acquisitions (the 1st includes the start).
    max_after_first: Duration,
    waits: Vec<Duration>,
    sections: Vec<Duration>,
    /// Release call start → next holder acquired, from every holder to the next.
    gaps: Vec<Duration>,
}

/// What one task saw: per section the wait, the section time, and (acquired, releasing).
#[derive(Default)]
struct TaskLog {
    waits: Vec<Duration>,
    sections: Vec<Duration>,
    spans: Vec<(Instant, Instant)>,
}

async fn contended_lockrt(
    lockers: &[Locker; 2],
    counter: &ConnectionManager,
    cfg: &Config,
) -> Res<ContendedRound> {
    counter_set(&mut counter.clone(), 0).await?;
    let barrier = Arc::new(Barrier::new(cfg.tasks));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..cfg.tasks {
        let locker = lockers[i % 2].clone();
        let mut conn = counter.clone();
        let barrier = barrier.clone();
        let n = cfg.sections;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut log = TaskLog::default();
            for _ in 0..n {
                let t = Instant::now();
                let g = locker.acquire("bench:c", opts()).await?;
                let held = Instant::now();
                log.waits.push(held - t);
                log.sections.push(section(&mut conn).await?);
                log.spans.push((held, Instant::now()));
                g.release().await?;
            }
            Res::Ok(log)
        }));
    }
    collect_contended(tasks, start, counter, cfg).await
}

async fn contended_rslock(
    managers: &[rslock::LockManager; 2],
    counter: &ConnectionManager,
    cfg: &Config,
) -> Res<ContendedRound> {
    counter_set(&mut counter.clone(), 0).await?;
    let barrier = Arc::new(Barrier::new(cfg.tasks));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..cfg.tasks {
        let m = managers[i % 2].clone();
        let mut conn = counter.clone();
        let barrier = barrier.clone();
        let n = cfg.sections;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut log = TaskLog::default();
            for _ in 0..n {
                let t = Instant::now();
                let l = rslock_lock(&m, "bench:c:rslock", TTL).await?;
                let held = Instant::now();
                log.waits.push(held - t);
                log.sections.push(section(&mut conn).await?);
                log.spans.push((held, Instant::now()));
                m.unlock(&l).await;
            }
            Res::Ok(log)
        }));
    }
    collect_contended(tasks, start, counter, cfg).await
}

type SectionTask = tokio::task::JoinHandle<Res<TaskLog>>;

async fn collect_contended(
    tasks: Vec<SectionTask>,
    start: Instant,
    counter: &ConnectionManager,
    cfg: &Config,
) -> Res<ContendedRound> {
    let mut waits = Vec::new();
    let mut sections = Vec::new();
    let mut spans = Vec::new();
    let mut max_after_first = Duration::ZERO;
    for t in tasks {
        let log = tokio::time::timeout(Duration::from_secs(300), t).await???;
        max_after_first =
            max_after_first.max(log.waits.iter().skip(1).copied().max().unwrap_or_default());
        waits.extend(log.waits);
        sections.extend(log.sections);
        spans.extend(log.spans);
    }
    let elapsed = start.elapsed();
    let got: i64 = counter.clone().get("bench:counter").await?;
    let total = cfg.tasks * cfg.sections;
    waits.sort();
    sections.sort();
    // Holders never overlap, so in acquisition order each gap is one hand-off.
    spans.sort();
    let mut gaps: Vec<Duration> = spans
        .windows(2)
        .map(|w| w[1].0.saturating_duration_since(w[0].1))
        .collect();
    gaps.sort();
    Ok(ContendedRound {
        per_sec: total as f64 / elapsed.as_secs_f64(),
        lost: lost_updates(total, got),
        max_after_first,
        waits,
        sections,
        gaps,
    })
}

async fn contended(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let lockers = [
        Locker::connect(&env.url).await?,
        Locker::connect(&env.url).await?,
    ];
    let managers = [env.rslock(), env.rslock()];
    let counter = env.manager().await?;
    let total = cfg.tasks * cfg.sections;
    let warm = Config {
        sections: 2,
        ..cfg.clone()
    };
    contended_lockrt(&lockers, &counter, &warm).await?;
    contended_rslock(&managers, &counter, &warm).await?;

    for round in 1..=cfg.rounds {
        // Floor: the serial ceiling, every section back to back without a lock.
        let mut conn = counter.clone();
        counter_set(&mut conn, 0).await?;
        let start = Instant::now();
        let mut secs = Vec::with_capacity(total);
        for _ in 0..total {
            secs.push(section(&mut conn).await?);
        }
        let per_sec = total as f64 / start.elapsed().as_secs_f64();
        let got: i64 = conn.get("bench:counter").await?;
        secs.sort();
        let f = "floor (serial, no lock)";
        figs.add(CONTENDED, f, "sections/s", per_sec);
        figs.add(CONTENDED, f, "lost updates", lost_updates(total, got));
        figs.add(CONTENDED, f, "section p50", us(pct(&secs, 0.5)));

        for (imp, r) in [
            (
                "lockrt acquire/release",
                contended_lockrt(&lockers, &counter, cfg).await?,
            ),
            ("rslock", contended_rslock(&managers, &counter, cfg).await?),
        ] {
            figs.add(CONTENDED, imp, "sections/s", r.per_sec);
            figs.add(CONTENDED, imp, "lost updates", r.lost);
            figs.add(CONTENDED, imp, "wait p50", us(pct(&r.waits, 0.5)) / 1e3);
            figs.add(CONTENDED, imp, "wait p99", us(pct(&r.waits, 0.99)) / 1e3);
            figs.add(CONTENDED, imp, "wait max", us(pct(&r.waits, 1.0)) / 1e3);
            figs.add(CONTENDED, imp, "section p50", us(pct(&r.sections, 0.5)));
            figs.add(CONTENDED, imp, "gap p50", us(pct(&r.gaps, 0.5)));
            figs.add(CONTENDED, imp, "wait max 2nd+", us(r.max_after_first) / 1e3);
        }
        eprintln!("  contended round {round} done");
    }
    Ok(())
}

fn report_contended(figs: &Figures, cfg: &Config, t: &mut Table) {
    let total = cfg.tasks * cfg.sections;
    let f = "floor (serial, no lock)";
    let floor_rate = figs.get(CONTENDED, f, "sections/s");
    t.row(
        CONTENDED,
        f,
        "sections/s",
        floor_rate,
        Unit::PerSec,
        None,
        "",
        None,
    );
    t.row(
        CONTENDED,
        f,
        "section p50",
        figs.get(CONTENDED, f, "section p50"),
        Unit::Us,
        None,
        "",
        None,
    );
    for imp in ["lockrt acquire/release", "rslock"] {
        let rate = figs.get(CONTENDED, imp, "sections/s");
        t.row(
            CONTENDED,
            imp,
            "sections/s",
            rate,
            Unit::PerSec,
            Some((rate / floor_rate, "of floor")),
            if imp == "rslock" {
                ""
            } else {
                "≥ 0.7x floor"
            },
            (imp != "rslock").then_some(rate / floor_rate >= 0.7),
        );
        let lost = figs.get(CONTENDED, imp, "lost updates");
        t.row(
            CONTENDED,
            imp,
            &format!("lost updates (of {total})"),
            lost,
            Unit::Count,
            None,
            "0",
            Some(lost == 0.0),
        );
        for m in ["wait p50", "wait p99"] {
            t.row(
                CONTENDED,
                imp,
                m,
                figs.get(CONTENDED, imp, m),
                Unit::Ms,
                None,
                "",
                None,
            );
        }
        let sec = figs.get(CONTENDED, imp, "section p50");
        t.row(
            CONTENDED,
            imp,
            "section p50 (GET+SET while held)",
            sec,
            Unit::Us,
            None,
            "",
            None,
        );
        t.row(
            CONTENDED,
            imp,
            "hand-off gap p50 (release start → next holder)",
            figs.get(CONTENDED, imp, "gap p50"),
            Unit::Us,
            None,
            "",
            None,
        );
        let max = figs.get(CONTENDED, imp, "wait max");
        let bound_ms = 2.0 * cfg.tasks as f64 * sec / 1e3;
        let fair = if imp == "rslock" {
            // rslock makes no fairness promise: shown for comparison, not judged.
            None
        } else {
            Some(max <= bound_ms)
        };
        t.row(
            CONTENDED,
            imp,
            "wait max",
            max,
            Unit::Ms,
            Some((max / bound_ms, "of bound")),
            &format!("≤ 2×{}×section p50 = {bound_ms:.2} ms", cfg.tasks),
            fair,
        );
        let max2 = figs.get(CONTENDED, imp, "wait max 2nd+");
        t.row(
            CONTENDED,
            imp,
            "wait max, each task's 1st acquisition left out",
            max2,
            Unit::Ms,
            Some((max2 / bound_ms, "of bound")),
            "",
            None,
        );
    }
}

// ------------------------------------------------------------------------------------------
// 4. Hand-off
// ------------------------------------------------------------------------------------------

const HANDOFF: &str = "4 hand-off";

/// When in the hold (of `hold`) the waiter of sample `i` starts: 10 % .. 90 %.
fn waiter_offset(i: usize, hold: Duration) -> Duration {
    hold * (1 + (i % 9) as u32) / 10
}

/// One lockrt hand-off: holder on `a`, waiter on `b` (may be the same locker).
async fn handoff_lockrt(a: &Locker, b: &Locker, i: usize, hold: Duration) -> Res<Duration> {
    let g = a.acquire("bench:h", opts()).await?;
    let held_at = Instant::now();
    let b = b.clone();
    let offset = waiter_offset(i, hold);
    let waiter = tokio::spawn(async move {
        tokio::time::sleep_until((held_at + offset).into()).await;
        let g = b
            .acquire(
                "bench:h",
                LockOptions::new().ttl(TTL).wait(Duration::from_secs(5)),
            )
            .await?;
        let at = Instant::now();
        g.release().await?;
        Res::Ok(at)
    });
    tokio::time::sleep_until((held_at + hold).into()).await;
    let released = Instant::now();
    g.release().await?;
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
    Ok(got.saturating_duration_since(released))
}

async fn handoff_rslock(
    a: &rslock::LockManager,
    b: &rslock::LockManager,
    i: usize,
    hold: Duration,
) -> Res<Duration> {
    let l = rslock_lock(a, "bench:h:rslock", TTL).await?;
    let held_at = Instant::now();
    let b = b.clone();
    let offset = waiter_offset(i, hold);
    let waiter = tokio::spawn(async move {
        tokio::time::sleep_until((held_at + offset).into()).await;
        let l = rslock_lock(&b, "bench:h:rslock", TTL).await?;
        let at = Instant::now();
        b.unlock(&l).await;
        Res::Ok(at)
    });
    tokio::time::sleep_until((held_at + hold).into()).await;
    let released = Instant::now();
    a.unlock(&l).await;
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
    Ok(got.saturating_duration_since(released))
}

/// The floor: the waiter blocks in `BLPOP sig 0` on its own connection, then takes the lock
/// with `SET NX PX`. Released with `DEL key`, then `LPUSH sig 1` (`one_trip: false`, measured
/// from the start of `LPUSH`, as specified), or with both in one `MULTI` round trip
/// (`one_trip: true`, measured from the start of that release, like lockrt's).
async fn handoff_floor(
    floor: &Floor,
    waiter_conn: &MultiplexedConnection,
    i: usize,
    hold: Duration,
    one_trip: bool,
) -> Res<Duration> {
    let mut conn = floor.conn.clone();
    let () = conn.del("bench:h:sig").await?;
    floor
        .try_lock("bench:h:floor")
        .await?
        .ok_or("floor: hand-off lock busy")?;
    let held_at = Instant::now();
    let offset = waiter_offset(i, hold);
    let mut wconn = waiter_conn.clone();
    let wfloor = floor.clone();
    let waiter = tokio::spawn(async move {
        tokio::time::sleep_until((held_at + offset).into()).await;
        let _: (String, String) = redis::cmd("BLPOP")
            .arg("bench:h:sig")
            .arg(0)
            .query_async(&mut wconn)
            .await?;
        let token = wfloor
            .try_lock("bench:h:floor")
            .await?
            .ok_or("floor: signalled but the lock is busy")?;
        let at = Instant::now();
        wfloor.unlock("bench:h:floor", &token).await?;
        Res::Ok(at)
    });
    tokio::time::sleep_until((held_at + hold).into()).await;
    let start = if one_trip {
        let start = Instant::now();
        let () = redis::pipe()
            .atomic()
            .del("bench:h:floor")
            .ignore()
            .lpush("bench:h:sig", 1)
            .ignore()
            .query_async(&mut conn)
            .await?;
        start
    } else {
        let () = conn.del("bench:h:floor").await?;
        let start = Instant::now();
        let _: i64 = conn.lpush("bench:h:sig", 1).await?;
        start
    };
    let got = tokio::time::timeout(Duration::from_secs(10), waiter).await???;
    Ok(got.saturating_duration_since(start))
}

const IMPS_HANDOFF: [&str; 5] = [
    "floor (BLPOP-signalled; DEL, then LPUSH; from LPUSH start)",
    "floor' (BLPOP-signalled; DEL+LPUSH in 1 MULTI; from release start)",
    "lockrt (2 Lockers)",
    "lockrt (same Locker)",
    "rslock (retry 3 × 0..200 ms)",
];

async fn handoff(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let floor = Floor::new(env).await?;
    let waiter_conn = env.blocking_conn().await?;
    let a = Locker::connect(&env.url).await?;
    let b = Locker::connect(&env.url).await?;
    let (ra, rb) = (env.rslock(), env.rslock());
    for round in 0..=cfg.rounds {
        // Round 0 is a short warm-up.
        let n = if round == 0 { 2 } else { cfg.handoffs };
        let mut samples: [Vec<Duration>; 5] = Default::default();
        for i in 0..n {
            // Rotate the order so no implementation always runs right after another.
            for k in 0..5 {
                let which = (k + i) % 5;
                let d = match which {
                    0 => handoff_floor(&floor, &waiter_conn, i, cfg.hold, false).await?,
                    1 => handoff_floor(&floor, &waiter_conn, i, cfg.hold, true).await?,
                    2 => handoff_lockrt(&a, &b, i, cfg.hold).await?,
                    3 => handoff_lockrt(&a, &a, i, cfg.hold).await?,
                    _ => handoff_rslock(&ra, &rb, i, cfg.hold).await?,
                };
                samples[which].push(d);
            }
        }
        if round > 0 {
            for (k, s) in samples.iter_mut().enumerate() {
                s.sort();
                figs.add(HANDOFF, IMPS_HANDOFF[k], "median", us(pct(s, 0.5)));
                figs.add(HANDOFF, IMPS_HANDOFF[k], "max", us(pct(s, 1.0)));
            }
        }
        eprintln!("  hand-off round {round} done");
    }
    Ok(())
}

fn report_handoff(figs: &Figures, cfg: &Config, t: &mut Table) {
    let floor = figs.get(HANDOFF, IMPS_HANDOFF[0], "median");
    let floor1 = figs.get(HANDOFF, IMPS_HANDOFF[1], "median");
    let rs = figs.get(HANDOFF, IMPS_HANDOFF[4], "median");
    let metric = format!("release → acquired, median of {}", cfg.handoffs);
    for (k, imp) in IMPS_HANDOFF.iter().enumerate() {
        let v = figs.get(HANDOFF, imp, "median");
        let (ratio, target, met) = match k {
            0 => (None, String::new(), None),
            1 | 4 => (Some((v / floor, "of floor")), String::new(), None),
            _ => {
                let r = v / floor;
                let speedup = rs / v;
                (
                    Some((r, "of floor")),
                    format!(
                        "≤ 1.5x floor (is {r:.2}x; {:.2}x of floor') and ≥ 20x faster than \
                         rslock (is {speedup:.0}x)",
                        v / floor1
                    ),
                    Some(r <= 1.5 && speedup >= 20.0),
                )
            }
        };
        t.row(HANDOFF, imp, &metric, v, Unit::Us, ratio, &target, met);
        t.row(
            HANDOFF,
            imp,
            "release → acquired, max",
            figs.get(HANDOFF, imp, "max"),
            Unit::Us,
            None,
            "",
            None,
        );
    }
}

// ------------------------------------------------------------------------------------------
// 5. Parallel keys
// ------------------------------------------------------------------------------------------

const PARALLEL: &str = "5 parallel keys";

/// `tasks` tasks, each `cycles` acquire+release on its own key; returns cycles/s overall.
async fn parallel_lockrt(locker: &Locker, tasks: usize, cycles: usize) -> Res<f64> {
    let barrier = Arc::new(Barrier::new(tasks));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let locker = locker.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let key = format!("bench:p:{i}");
                barrier.wait().await;
                for _ in 0..cycles {
                    locker.acquire(&key, opts()).await?.release().await?;
                }
                Res::Ok(())
            })
        })
        .collect();
    for h in handles {
        tokio::time::timeout(Duration::from_secs(300), h).await???;
    }
    Ok((tasks * cycles) as f64 / start.elapsed().as_secs_f64())
}

async fn parallel_floor(floor: &Floor, tasks: usize, cycles: usize) -> Res<f64> {
    let barrier = Arc::new(Barrier::new(tasks));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let floor = floor.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let key = format!("bench:p:floor:{i}");
                barrier.wait().await;
                for _ in 0..cycles {
                    let t = floor.try_lock(&key).await?.ok_or("floor: busy")?;
                    floor.unlock(&key, &t).await?;
                }
                Res::Ok(())
            })
        })
        .collect();
    for h in handles {
        tokio::time::timeout(Duration::from_secs(300), h).await???;
    }
    Ok((tasks * cycles) as f64 / start.elapsed().as_secs_f64())
}

async fn parallel(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let locker = Locker::connect(&env.url).await?;
    let floor = Floor::new(env).await?;
    parallel_lockrt(&locker, cfg.par_tasks, 10).await?;
    parallel_floor(&floor, cfg.par_tasks, 10).await?;
    for round in 1..=cfg.rounds {
        let one = parallel_lockrt(&locker, 1, cfg.solo_cycles).await?;
        let many = parallel_lockrt(&locker, cfg.par_tasks, cfg.par_cycles).await?;
        figs.add(PARALLEL, "lockrt", "1 task", one);
        figs.add(PARALLEL, "lockrt", "many", many);
        figs.add(PARALLEL, "lockrt", "speedup", many / one);
        let one = parallel_floor(&floor, 1, cfg.solo_cycles).await?;
        let many = parallel_floor(&floor, cfg.par_tasks, cfg.par_cycles).await?;
        figs.add(PARALLEL, "floor", "1 task", one);
        figs.add(PARALLEL, "floor", "many", many);
        figs.add(PARALLEL, "floor", "speedup", many / one);
        eprintln!("  parallel round {round} done");
    }
    Ok(())
}

fn report_parallel(figs: &Figures, cfg: &Config, t: &mut Table) {
    for imp in ["floor", "lockrt"] {
        let name = if imp == "floor" {
            "floor (SET NX PX + EVALSHA, 1 connection)"
        } else {
            "lockrt acquire/release (1 Locker)"
        };
        let one = figs.get(PARALLEL, imp, "1 task");
        let many = figs.get(PARALLEL, imp, "many");
        let speedup = figs.get(PARALLEL, imp, "speedup");
        t.row(
            PARALLEL,
            name,
            "cycles/s, 1 task",
            one,
            Unit::PerSec,
            None,
            "",
            None,
        );
        let (target, met) = if imp == "lockrt" {
            ("≥ 8x of 1 task", Some(speedup >= 8.0))
        } else {
            ("", None)
        };
        t.row(
            PARALLEL,
            name,
            &format!("cycles/s, {} tasks", cfg.par_tasks),
            many,
            Unit::PerSec,
            Some((speedup, "of 1 task")),
            target,
            met,
        );
    }
}

// ------------------------------------------------------------------------------------------
// 6. Many held
// ------------------------------------------------------------------------------------------

const HELD: &str = "6 many held";

/// `utime + stime` of this process, in clock ticks.
fn cpu_ticks() -> Res<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').ok_or("odd /proc/self/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// Resident set size in pages.
fn rss_pages() -> Res<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    Ok(statm
        .split_whitespace()
        .nth(1)
        .ok_or("odd /proc/self/statm")?
        .parse()?)
}

fn getconf(name: &str, fallback: u64) -> u64 {
    std::process::Command::new("getconf")
        .arg(name)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(fallback)
}

/// Live heap bytes of the whole process (counting allocator).
fn heap_bytes() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64 + s.bytes_reallocated as i64
}

/// `calls` per command from `INFO commandstats`.
async fn commandstats(conn: &mut ConnectionManager) -> Res<HashMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name.to_owned(), calls);
    }
    Ok(out)
}

async fn many_held_round(env: &Env, cfg: &Config, figs: &mut Figures, record: bool) -> Res<()> {
    let n = cfg.held;
    let locker = Locker::connect(&env.url).await?;
    let opts = LockOptions::new().ttl(cfg.held_ttl).wait(WAIT);
    let mut stats_conn = env.manager().await?;
    let page = getconf("PAGESIZE", 4096) as f64;
    let tick = getconf("CLK_TCK", 100) as f64;

    // One lock first, so the monitor task and the locker's lazy state exist before measuring.
    locker
        .acquire("bench:held:warm", opts)
        .await?
        .release()
        .await?;

    let heap0 = heap_bytes();
    let rss0 = rss_pages()?;
    // Acquire from a few tasks at once, then keep every guard in one Vec.
    let workers = 32;
    let t_acq = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let mut gs = Vec::with_capacity(n / workers + 1);
                for i in (w..n).step_by(workers) {
                    gs.push(locker.acquire(&format!("bench:held:{i}"), opts).await?);
                }
                Res::Ok(gs)
            })
        })
        .collect();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    for h in handles {
        guards.extend(tokio::time::timeout(Duration::from_secs(300), h).await???);
    }
    let acquire_s = t_acq.elapsed().as_secs_f64();
    let heap1 = heap_bytes();
    let rss1 = rss_pages()?;

    let cmd0 = commandstats(&mut stats_conn).await?;
    let cpu0 = cpu_ticks()?;
    let t0 = Instant::now();
    tokio::time::sleep(cfg.held_ttl * cfg.held_periods).await;
    let elapsed = t0.elapsed();
    let cpu1 = cpu_ticks()?;
    let cmd1 = commandstats(&mut stats_conn).await?;

    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // Release from a few tasks at once; count failures as losses too.
    let mut chunks: Vec<Vec<LockGuard>> = (0..workers).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % workers].push(g);
    }
    let handles: Vec<_> = chunks
        .into_iter()
        .map(|gs| {
            tokio::spawn(async move {
                let mut failed = 0usize;
                for g in gs {
                    failed += usize::from(g.release().await.is_err());
                }
                failed
            })
        })
        .collect();
    let mut release_failed = 0;
    for h in handles {
        release_failed += tokio::time::timeout(Duration::from_secs(300), h).await??;
    }

    if record {
        let delta = |name: &str| {
            cmd1.get(name).copied().unwrap_or(0) as f64
                - cmd0.get(name).copied().unwrap_or(0) as f64
        };
        let total: f64 = cmd1.keys().filter(|k| *k != "info").map(|k| delta(k)).sum();
        let periods = elapsed.as_secs_f64() / (cfg.held_ttl / 3).as_secs_f64();
        let cpu_s = (cpu1 - cpu0) as f64 / tick;
        figs.add(HELD, "lockrt", "acquire s", acquire_s);
        figs.add(HELD, "lockrt", "lost", lost as f64);
        figs.add(HELD, "lockrt", "release failed", release_failed as f64);
        figs.add(HELD, "lockrt", "evalsha/period", delta("evalsha") / periods);
        figs.add(HELD, "lockrt", "eval/period", delta("eval") / periods);
        figs.add(HELD, "lockrt", "calls/period", total / periods);
        figs.add(HELD, "lockrt", "pexpire/period", delta("pexpire") / periods);
        figs.add(
            HELD,
            "lockrt",
            "cpu %",
            100.0 * cpu_s / elapsed.as_secs_f64(),
        );
        figs.add(HELD, "lockrt", "cpu ms/period", 1e3 * cpu_s / periods);
        figs.add(
            HELD,
            "lockrt",
            "heap/lock",
            (heap1 - heap0) as f64 / n as f64,
        );
        figs.add(
            HELD,
            "lockrt",
            "rss/lock",
            (rss1 as f64 - rss0 as f64) * page / n as f64,
        );
    }
    Ok(())
}

async fn many_held(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    // Warm-up: a small batch so the allocator's arenas and Redis' dict have grown once.
    let warm = Config {
        held: cfg.held.min(1_000),
        held_periods: 1,
        held_ttl: Duration::from_millis(300),
        ..cfg.clone()
    };
    many_held_round(env, &warm, figs, false).await?;
    for round in 1..=cfg.held_rounds {
        many_held_round(env, cfg, figs, true).await?;
        eprintln!("  many-held round {round} done");
    }
    Ok(())
}

fn report_many_held(figs: &Figures, cfg: &Config, t: &mut Table) {
    let imp = format!(
        "lockrt ({} locks, ttl {} ms, watchdog, {} ttls)",
        cfg.held,
        cfg.held_ttl.as_millis(),
        cfg.held_periods
    );
    let g = |m: &str| figs.get(HELD, "lockrt", m);
    let lost = g("lost");
    t.row(
        HELD,
        &imp,
        "lost (guard.is_lost())",
        lost,
        Unit::Count,
        None,
        "0",
        Some(lost == 0.0),
    );
    let rf = g("release failed");
    t.row(
        HELD,
        &imp,
        "failed releases",
        rf,
        Unit::Count,
        None,
        "0",
        Some(rf == 0.0),
    );
    // The monitor renews at most 500 leases per script call.
    let ideal = (cfg.held as f64 / 500.0).ceil();
    let ev = g("evalsha/period");
    t.row(
        HELD,
        &imp,
        "EVALSHA per renewal period (ttl/3)",
        ev,
        Unit::Count,
        Some((ev / ideal, "of ideal")),
        &format!("≈ {} / 500 = {ideal:.0} (≤ {:.0})", cfg.held, ideal * 1.5),
        Some(ev <= ideal * 1.5),
    );
    t.row(
        HELD,
        &imp,
        "all Redis commands per period (incl. GET/PEXPIRE inside scripts)",
        g("calls/period"),
        Unit::Count,
        None,
        "",
        None,
    );
    t.row(
        HELD,
        &imp,
        "client CPU (of one core)",
        g("cpu %"),
        Unit::Pct,
        None,
        "",
        None,
    );
    t.row(
        HELD,
        &imp,
        "client CPU per period",
        g("cpu ms/period"),
        Unit::Ms,
        None,
        "",
        None,
    );
    let heap = g("heap/lock");
    t.row(
        HELD,
        &imp,
        "heap per held lock (counting allocator)",
        heap,
        Unit::Bytes,
        None,
        "< 1 KiB",
        Some(heap < 1024.0),
    );
    t.row(
        HELD,
        &imp,
        "of which the LockGuard value itself (size_of, in the caller's Vec)",
        std::mem::size_of::<LockGuard>() as f64,
        Unit::Bytes,
        None,
        "",
        None,
    );
    t.row(
        HELD,
        &imp,
        "RSS per held lock",
        g("rss/lock"),
        Unit::Bytes,
        None,
        "",
        None,
    );
    t.row(
        HELD,
        &imp,
        "time to acquire all",
        g("acquire s") * 1e3,
        Unit::Ms,
        None,
        "",
        None,
    );
}

// ------------------------------------------------------------------------------------------
// main
// ------------------------------------------------------------------------------------------

fn main() -> Res<()> {
    let cfg = Config::from_env();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(cfg))
}

async fn run(cfg: Config) -> Res<()> {
    let started = Instant::now();
    eprintln!("bench config: {cfg:?}");
    let server = RedisServer::start()?;
    let env = Env {
        url: server.url(),
        client: server.client(),
    };
    let mut figs = Figures::default();

    eprintln!("workload 0: baseline round trip");
    baseline(&env, &cfg, &mut figs).await?;
    eprintln!("workload 1+2: uncontended");
    uncontended(&env, &cfg, &mut figs).await?;
    eprintln!("workload 3: contended");
    contended(&env, &cfg, &mut figs).await?;
    eprintln!("workload 4: hand-off");
    handoff(&env, &cfg, &mut figs).await?;
    eprintln!("workload 5: parallel keys");
    parallel(&env, &cfg, &mut figs).await?;
    eprintln!("workload 6: many held");
    many_held(&env, &cfg, &mut figs).await?;

    let mut t = Table::default();
    report_baseline(&figs, &mut t);
    report_uncontended(&figs, &mut t);
    report_contended(&figs, &cfg, &mut t);
    report_handoff(&figs, &cfg, &mut t);
    report_parallel(&figs, &cfg, &mut t);
    report_many_held(&figs, &cfg, &mut t);

    let mut out = format!(
        "lockrt benchmarks{}: medians over {} rounds ({} for many-held); uncontended {} pairs, \
         contended {}×{} sections, {} hand-offs of a {} ms hold, {} tasks × {} cycles \
         (1 task × {}), {} held locks. Took {:.0} s.\n\n",
        if cfg.quick { " (--quick)" } else { "" },
        cfg.rounds,
        cfg.held_rounds,
        cfg.pairs,
        cfg.tasks,
        cfg.sections,
        cfg.handoffs,
        cfg.hold.as_millis(),
        cfg.par_tasks,
        cfg.par_cycles,
        cfg.solo_cycles,
        cfg.held,
        started.elapsed().as_secs_f64(),
    );
    out.push_str(&t.markdown());
    println!("{out}");

    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        std::path::PathBuf::from,
    );
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench-locks.md");
    std::fs::write(&path, &out)?;
    println!("written to {}", path.display());
    drop(server);
    Ok(())
}
