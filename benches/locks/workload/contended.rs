//! Workload 3, contended: `BENCH_TASKS` tasks on one key, each running `BENCH_SECTIONS`
//! critical sections (`GET counter`, then `SET counter v+1` on a plain connection): half on
//! each of two lockers (two processes' worth of clients), and all on one locker (the hot key
//! of one process, where local hand-off applies). Throughput against the serial ceiling (the
//! same sections back to back without a lock) and against one task that locks, runs the
//! section and unlocks back to back with plain redis-rs; lost updates, waits and their
//! fairness bound, and the hand-off gap.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockrt::Locker;
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::sync::Barrier;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, Lockrt, Rslock};
use crate::stats::{Figures, pct, us};
use crate::table::{Table, Unit};

const CONTENDED: &str = "3 contended";
const FLOOR: &str = "floor (serial, no lock)";
const LOCKRT: &str = "lockrt acquire/release";
const RSLOCK: &str = "rslock";
const HOT: &str = "3 hot key, one process";
const FLOOR_LOCKED: &str = "floor (one task: lock, GET, SET, unlock)";
const LOCKRT_ONE: &str = "lockrt, one Locker";
const RSLOCK_ONE: &str = "rslock, one manager";

/// What one round of one implementation saw.
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

/// One round: `cfg.tasks` tasks, alternating between the handles, on `key`.
async fn round<L: BenchLock>(
    pair: &[L],
    key: &'static str,
    counter: &ConnectionManager,
    cfg: &Config,
) -> Res<ContendedRound> {
    counter_set(&mut counter.clone(), 0).await?;
    let barrier = Arc::new(Barrier::new(cfg.tasks));
    let mut tasks = Vec::new();
    let start = Instant::now();
    for i in 0..cfg.tasks {
        let imp = pair[i % pair.len()].clone();
        let log = task(imp, key, counter.clone(), barrier.clone(), cfg.sections);
        tasks.push(tokio::spawn(log));
    }
    collect(tasks, start, counter, cfg).await
}

/// One contending task: `n` times take the lock, run a section, release.
async fn task<L: BenchLock>(
    imp: L,
    key: &'static str,
    mut conn: ConnectionManager,
    barrier: Arc<Barrier>,
    n: usize,
) -> Res<TaskLog> {
    barrier.wait().await;
    let mut log = TaskLog::default();
    for _ in 0..n {
        let t = Instant::now();
        let guard = imp.lock(key).await?;
        let held = Instant::now();
        log.waits.push(held - t);
        log.sections.push(section(&mut conn).await?);
        log.spans.push((held, Instant::now()));
        imp.unlock(key, guard).await?;
    }
    Ok(log)
}

type SectionTask = tokio::task::JoinHandle<Res<TaskLog>>;

/// Joins the tasks and reads the counter.
async fn collect(
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
    Ok(ContendedRound {
        per_sec: total as f64 / elapsed.as_secs_f64(),
        lost: lost_updates(total, got),
        max_after_first,
        waits,
        sections,
        gaps: gaps(spans),
    })
}

/// Holders never overlap, so in acquisition order each gap is one hand-off; sorted.
fn gaps(mut spans: Vec<(Instant, Instant)>) -> Vec<Duration> {
    spans.sort();
    let mut gaps: Vec<Duration> = spans
        .windows(2)
        .map(|w| w[1].0.saturating_duration_since(w[0].1))
        .collect();
    gaps.sort();
    gaps
}

/// The serial ceiling: every section back to back without a lock.
async fn serial(counter: &ConnectionManager, total: usize, figs: &mut Figures) -> Res<()> {
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
    figs.add(CONTENDED, FLOOR, "sections/s", per_sec);
    figs.add(CONTENDED, FLOOR, "lost updates", lost_updates(total, got));
    figs.add(CONTENDED, FLOOR, "section p50", us(pct(&secs, 0.5)));
    Ok(())
}

/// The locked floor: one task taking the floor's lock, running the section and unlocking,
/// back to back.
async fn serial_locked(
    floor: &Floor,
    counter: &ConnectionManager,
    total: usize,
    figs: &mut Figures,
) -> Res<()> {
    let mut conn = counter.clone();
    counter_set(&mut conn, 0).await?;
    let start = Instant::now();
    for _ in 0..total {
        let token = floor.lock("bench:c:floor").await?;
        section(&mut conn).await?;
        floor.unlock("bench:c:floor", token).await?;
    }
    let per_sec = total as f64 / start.elapsed().as_secs_f64();
    figs.add(HOT, FLOOR_LOCKED, "sections/s", per_sec);
    Ok(())
}

/// The hot key's figures of one implementation.
fn record_hot(figs: &mut Figures, imp: &str, r: &ContendedRound) {
    figs.add(HOT, imp, "sections/s", r.per_sec);
    figs.add(HOT, imp, "lost updates", r.lost);
    figs.add(HOT, imp, "wait p99", us(pct(&r.waits, 0.99)) / 1e3);
    figs.add(HOT, imp, "gap p50", us(pct(&r.gaps, 0.5)));
}

fn record(figs: &mut Figures, imp: &str, r: &ContendedRound) {
    figs.add(CONTENDED, imp, "sections/s", r.per_sec);
    figs.add(CONTENDED, imp, "lost updates", r.lost);
    figs.add(CONTENDED, imp, "wait p50", us(pct(&r.waits, 0.5)) / 1e3);
    figs.add(CONTENDED, imp, "wait p99", us(pct(&r.waits, 0.99)) / 1e3);
    figs.add(CONTENDED, imp, "wait max", us(pct(&r.waits, 1.0)) / 1e3);
    figs.add(CONTENDED, imp, "section p50", us(pct(&r.sections, 0.5)));
    figs.add(CONTENDED, imp, "gap p50", us(pct(&r.gaps, 0.5)));
    figs.add(CONTENDED, imp, "wait max 2nd+", us(r.max_after_first) / 1e3);
}

/// A warm-up of 2 sections per task, then per round the serial floor, lockrt and rslock.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 3: contended");
    let lockers = [
        Lockrt::new(&Locker::connect(&env.url).await?),
        Lockrt::new(&Locker::connect(&env.url).await?),
    ];
    let managers = [Rslock::new(env), Rslock::new(env)];
    let one = [Lockrt::new(&Locker::connect(&env.url).await?)];
    let one_manager = [Rslock::new(env)];
    let floor = Floor::new(env).await?;
    let counter = env.manager().await?;
    let warm = Config {
        sections: 2,
        ..cfg.clone()
    };
    round(&lockers, "bench:c", &counter, &warm).await?;
    round(&managers, "bench:c:rslock", &counter, &warm).await?;
    round(&one, "bench:c:one", &counter, &warm).await?;
    round(&one_manager, "bench:c:rslock1", &counter, &warm).await?;

    for n in 1..=cfg.rounds {
        serial(&counter, cfg.tasks * cfg.sections, figs).await?;
        let lockrt = round(&lockers, "bench:c", &counter, cfg).await?;
        let rslock = round(&managers, "bench:c:rslock", &counter, cfg).await?;
        record(figs, LOCKRT, &lockrt);
        record(figs, RSLOCK, &rslock);
        serial_locked(&floor, &counter, cfg.tasks * cfg.sections, figs).await?;
        let hot = round(&one, "bench:c:one", &counter, cfg).await?;
        record_hot(figs, LOCKRT_ONE, &hot);
        let hot = round(&one_manager, "bench:c:rslock1", &counter, cfg).await?;
        record_hot(figs, RSLOCK_ONE, &hot);
        eprintln!("  contended round {n} done");
    }
    Ok(())
}

/// The serial floor, then lockrt and rslock against it.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    let floor_rate = figs.get(CONTENDED, FLOOR, "sections/s");
    t.row(CONTENDED, FLOOR, "sections/s", floor_rate, Unit::PerSec);
    let sec = figs.get(CONTENDED, FLOOR, "section p50");
    t.row(CONTENDED, FLOOR, "section p50", sec, Unit::Us);
    for imp in [LOCKRT, RSLOCK] {
        report_imp(figs, cfg, imp, floor_rate, t);
    }
    report_hot(figs, cfg, floor_rate, t);
}

/// The hot key of one process against both floors.
fn report_hot(figs: &Figures, cfg: &Config, floor_rate: f64, t: &mut Table) {
    let locked = figs.get(HOT, FLOOR_LOCKED, "sections/s");
    t.row(HOT, FLOOR_LOCKED, "sections/s", locked, Unit::PerSec)
        .ratio(locked / floor_rate, "of serial floor");
    for imp in [LOCKRT_ONE, RSLOCK_ONE] {
        let get = |metric: &str| figs.get(HOT, imp, metric);
        let judged = imp == LOCKRT_ONE;
        let rate = get("sections/s");
        let row = t.row(HOT, imp, "sections/s", rate, Unit::PerSec);
        row.ratio(rate / floor_rate, "of serial floor");
        if judged {
            row.target("≥ 0.9x serial floor")
                .met(rate / floor_rate >= 0.9);
        }
        let row = t.row(HOT, imp, "sections/s vs locked floor", rate, Unit::PerSec);
        row.ratio(rate / locked, "of locked floor");
        if judged {
            row.target("≥ 1.8x locked floor").met(rate / locked >= 1.8);
        }
        let lost = get("lost updates");
        let metric = format!("lost updates (of {})", cfg.tasks * cfg.sections);
        t.row(HOT, imp, &metric, lost, Unit::Count)
            .target("0")
            .met(lost == 0.0);
        t.row(HOT, imp, "wait p99", get("wait p99"), Unit::Ms);
        let metric = "hand-off gap p50 (release start → next holder)";
        t.row(HOT, imp, metric, get("gap p50"), Unit::Us);
    }
}

/// One implementation's rows. rslock is shown for comparison: its throughput and fairness
/// are not judged (it makes no fairness promise).
fn report_imp(figs: &Figures, cfg: &Config, imp: &str, floor_rate: f64, t: &mut Table) {
    let get = |metric: &str| figs.get(CONTENDED, imp, metric);
    let judged = imp != RSLOCK;
    let rate = get("sections/s");
    let row = t.row(CONTENDED, imp, "sections/s", rate, Unit::PerSec);
    row.ratio(rate / floor_rate, "of floor");
    if judged {
        row.target("≥ 0.7x floor").met(rate / floor_rate >= 0.7);
    }
    let lost = get("lost updates");
    let metric = format!("lost updates (of {})", cfg.tasks * cfg.sections);
    t.row(CONTENDED, imp, &metric, lost, Unit::Count)
        .target("0")
        .met(lost == 0.0);
    for m in ["wait p50", "wait p99"] {
        t.row(CONTENDED, imp, m, get(m), Unit::Ms);
    }
    let sec = get("section p50");
    let metric = "section p50 (GET+SET while held)";
    t.row(CONTENDED, imp, metric, sec, Unit::Us);
    let metric = "hand-off gap p50 (release start → next holder)";
    t.row(CONTENDED, imp, metric, get("gap p50"), Unit::Us);

    let bound_ms = 2.0 * cfg.tasks as f64 * sec / 1e3;
    let max = get("wait max");
    let row = t.row(CONTENDED, imp, "wait max", max, Unit::Ms);
    row.ratio(max / bound_ms, "of bound")
        .target(&format!("≤ 2×{}×section p50 = {bound_ms:.2} ms", cfg.tasks));
    if judged {
        row.met(max <= bound_ms);
    }
    let max2 = get("wait max 2nd+");
    let metric = "wait max, each task's 1st acquisition left out";
    t.row(CONTENDED, imp, metric, max2, Unit::Ms)
        .ratio(max2 / bound_ms, "of bound");
}
