//! Workload 6, many held: one lockrt Locker holds `BENCH_HELD` locks with the watchdog on
//! for `BENCH_HELD_PERIODS` ttls. Losses, failed releases, renewal script calls and all
//! Redis commands per renewal period, client CPU, and heap and RSS per held lock. lockrt
//! only (neither rslock nor the floor renews), so it uses `Locker` and `LockGuard` directly.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use lockrt::{LockGuard, LockOptions, Locker};
use redis::aio::ConnectionManager;

use crate::Res;
use crate::config::{Config, WAIT};
use crate::env::Env;
use crate::probes::{commandstats, cpu_ticks, getconf, heap_bytes, rss_pages};
use crate::stats::Figures;
use crate::table::{Table, Unit};

const HELD: &str = "6 many held";
/// Tasks that acquire (and later release) the locks, in parallel.
const WORKERS: usize = 32;
/// The monitor renews at most this many leases per script call.
const RENEW_BATCH: f64 = 500.0;

/// What one round saw.
struct Round {
    page: f64,
    tick: f64,
    acquire_s: f64,
    /// Heap bytes and resident pages the held locks added.
    heap_grown: i64,
    rss_grown: f64,
    held: Held,
    lost: usize,
    release_failed: usize,
}

/// The held period: how long it lasted, client CPU ticks, server calls before and after.
struct Held {
    elapsed: Duration,
    cpu_ticks: u64,
    cmd0: HashMap<String, u64>,
    cmd1: HashMap<String, u64>,
}

/// Acquires `bench:held:0..n` from [`WORKERS`] tasks at once; every guard in one Vec.
async fn acquire_all(locker: &Locker, n: usize, opts: LockOptions) -> Res<Vec<LockGuard>> {
    let handles: Vec<_> = (0..WORKERS)
        .map(|w| {
            let locker = locker.clone();
            tokio::spawn(async move {
                let mut gs = Vec::with_capacity(n / WORKERS + 1);
                for i in (w..n).step_by(WORKERS) {
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
    Ok(guards)
}

/// Releases from [`WORKERS`] tasks at once; returns how many releases failed.
async fn release_all(guards: Vec<LockGuard>) -> Res<usize> {
    let mut chunks: Vec<Vec<LockGuard>> = (0..WORKERS).map(|_| Vec::new()).collect();
    for (i, g) in guards.into_iter().enumerate() {
        chunks[i % WORKERS].push(g);
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
    Ok(release_failed)
}

/// Sleeps `BENCH_HELD_PERIODS` ttls while the locks are held, reading CPU and server calls
/// on both sides.
async fn hold(stats_conn: &mut ConnectionManager, cfg: &Config) -> Res<Held> {
    let cmd0 = commandstats(stats_conn).await?;
    let cpu0 = cpu_ticks()?;
    let t0 = Instant::now();
    tokio::time::sleep(cfg.held_ttl * cfg.held_periods).await;
    let elapsed = t0.elapsed();
    let cpu1 = cpu_ticks()?;
    let cmd1 = commandstats(stats_conn).await?;
    Ok(Held {
        elapsed,
        cpu_ticks: cpu1 - cpu0,
        cmd0,
        cmd1,
    })
}

/// One round on a new Locker: acquire all, hold, count losses, release all.
async fn round(env: &Env, cfg: &Config) -> Res<Round> {
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
    let t_acq = Instant::now();
    let guards = acquire_all(&locker, n, opts).await?;
    let acquire_s = t_acq.elapsed().as_secs_f64();
    let heap_grown = heap_bytes() - heap0;
    let rss_grown = rss_pages()? as f64 - rss0 as f64;

    let held = hold(&mut stats_conn, cfg).await?;
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    // Failed releases count as losses too.
    let release_failed = release_all(guards).await?;
    Ok(Round {
        page,
        tick,
        acquire_s,
        heap_grown,
        rss_grown,
        held,
        lost,
        release_failed,
    })
}

fn record(figs: &mut Figures, cfg: &Config, r: &Round) {
    let (cmd0, cmd1) = (&r.held.cmd0, &r.held.cmd1);
    let delta = |name: &str| {
        cmd1.get(name).copied().unwrap_or(0) as f64 - cmd0.get(name).copied().unwrap_or(0) as f64
    };
    let total: f64 = cmd1.keys().filter(|k| *k != "info").map(|k| delta(k)).sum();
    let elapsed = r.held.elapsed.as_secs_f64();
    let periods = elapsed / (cfg.held_ttl / 3).as_secs_f64();
    let cpu_s = r.held.cpu_ticks as f64 / r.tick;
    let n = cfg.held as f64;
    let mut add = |metric: &str, v: f64| figs.add(HELD, "lockrt", metric, v);
    add("acquire s", r.acquire_s);
    add("lost", r.lost as f64);
    add("release failed", r.release_failed as f64);
    add("evalsha/period", delta("evalsha") / periods);
    add("eval/period", delta("eval") / periods);
    add("calls/period", total / periods);
    add("pexpire/period", delta("pexpire") / periods);
    add("cpu %", 100.0 * cpu_s / elapsed);
    add("cpu ms/period", 1e3 * cpu_s / periods);
    add("heap/lock", r.heap_grown as f64 / n);
    add("rss/lock", r.rss_grown * r.page / n);
}

/// A small warm-up round, then `BENCH_HELD_ROUNDS` measured rounds.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 6: many held");
    // Warm-up: a small batch so the allocator's arenas and Redis' dict have grown once.
    let warm = Config {
        held: cfg.held.min(1_000),
        held_periods: 1,
        held_ttl: Duration::from_millis(300),
        ..cfg.clone()
    };
    round(env, &warm).await?;
    for n in 1..=cfg.held_rounds {
        let r = round(env, cfg).await?;
        record(figs, cfg, &r);
        eprintln!("  many-held round {n} done");
    }
    Ok(())
}

/// Losses and failed releases, batching of renewals, CPU and memory; judged where the
/// issue sets a target.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    let imp = format!(
        "lockrt ({} locks, ttl {} ms, watchdog, {} ttls)",
        cfg.held,
        cfg.held_ttl.as_millis(),
        cfg.held_periods
    );
    for (metric, figure) in [
        ("lost (guard.is_lost())", "lost"),
        ("failed releases", "release failed"),
    ] {
        let v = figs.get(HELD, "lockrt", figure);
        t.row(HELD, &imp, metric, v, Unit::Count)
            .target("0")
            .met(v == 0.0);
    }
    report_renewals(figs, cfg, &imp, t);
    report_memory(figs, &imp, t);
}

/// Script calls, all commands and client CPU per renewal period.
fn report_renewals(figs: &Figures, cfg: &Config, imp: &str, t: &mut Table) {
    let g = |m: &str| figs.get(HELD, "lockrt", m);
    let ideal = (cfg.held as f64 / RENEW_BATCH).ceil();
    let ev = g("evalsha/period");
    let metric = "EVALSHA per renewal period (ttl/3)";
    let target = format!(
        "≈ {} / {RENEW_BATCH} = {ideal:.0} (≤ {:.0})",
        cfg.held,
        ideal * 1.5
    );
    t.row(HELD, imp, metric, ev, Unit::Count)
        .ratio(ev / ideal, "of ideal")
        .target(&target)
        .met(ev <= ideal * 1.5);
    let metric = "all Redis commands per period (incl. GET/PEXPIRE inside scripts)";
    t.row(HELD, imp, metric, g("calls/period"), Unit::Count);
    t.row(HELD, imp, "client CPU (of one core)", g("cpu %"), Unit::Pct);
    let metric = "client CPU per period";
    t.row(HELD, imp, metric, g("cpu ms/period"), Unit::Ms);
}

/// Heap and RSS per held lock, the guard's own size, and the time to acquire them all.
fn report_memory(figs: &Figures, imp: &str, t: &mut Table) {
    let g = |m: &str| figs.get(HELD, "lockrt", m);
    let heap = g("heap/lock");
    let metric = "heap per held lock (counting allocator)";
    t.row(HELD, imp, metric, heap, Unit::Bytes)
        .target("< 1 KiB")
        .met(heap < 1024.0);
    let metric = "of which the LockGuard value itself (size_of, in the caller's Vec)";
    let guard = std::mem::size_of::<LockGuard>() as f64;
    t.row(HELD, imp, metric, guard, Unit::Bytes);
    t.row(HELD, imp, "RSS per held lock", g("rss/lock"), Unit::Bytes);
    let acquire_ms = g("acquire s") * 1e3;
    t.row(HELD, imp, "time to acquire all", acquire_ms, Unit::Ms);
}
