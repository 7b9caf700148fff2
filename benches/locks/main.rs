//! Lock benchmarks: `cargo bench --bench locks` (add `-- --quick` for a smoke run).
//!
//! Starts its own `redis-server` on loopback, runs every workload against lockrt
//! (`Locker::acquire` + `release`, `Locker::run`, the attribute; read shares, permits and
//! `acquire_all` for the lock kinds), the `rslock` crate and a floor written with plain
//! `redis`, and prints one markdown table, also written to `target/bench-locks.md`. Every
//! figure is the median over `BENCH_ROUNDS` rounds; ratios are computed within the run. Sizes
//! come from `BENCH_*` environment variables (see [`config::Config::from_env`]).
//!
//! A counting global allocator (`stats_alloc`) gives the exact client heap per held lock; it
//! costs a few atomic increments per allocation, for every implementation alike.
//!
//! This file is the runner: it owns the allocator and the runtime, starts the server, runs
//! the workloads in order and prints and writes the table. What it runs lives beside it:
//! [`config`] (sizes and fixed settings), [`env`] (connections to the server), [`imp`] (the
//! one trait lockrt, rslock and the floor implement), [`workload`] (one file per workload),
//! [`stats`] and [`table`] (medians and the printed rows), [`probes`] (process and server
//! counters).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use lockrt::testing::RedisServer;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use crate::config::Config;
use crate::env::Env;
use crate::stats::Figures;
use crate::table::Table;
use crate::workload::{
    baseline, contended, handoff, many_held, multi, parallel, processes, rw, semaphore, uncontended,
};

mod config;
mod env;
mod imp;
mod probes;
mod stats;
mod table;
mod workload;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

fn main() -> Res<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // A worker process of the multi-process workload: started by this binary itself.
    if let Ok(spec) = std::env::var(processes::WORKER) {
        return rt.block_on(processes::worker(&spec));
    }
    rt.block_on(run(Config::from_env()))
}

async fn run(cfg: Config) -> Res<()> {
    let started = Instant::now();
    eprintln!("bench config: {cfg:?}");
    let server = RedisServer::start()?;
    let env = Env {
        url: server.url(),
        client: server.client(),
    };
    let figs = measure(&env, &cfg).await?;
    let table = report(&figs, &cfg);

    let mut out = header(&cfg, started.elapsed());
    out.push_str(&table.markdown());
    println!("{out}");
    let path = write_out(&out)?;
    println!("written to {}", path.display());
    drop(server);
    Ok(())
}

/// Every workload, one after another, into one set of per-round figures (each says on
/// stderr when it starts and as each round ends).
async fn measure(env: &Env, cfg: &Config) -> Res<Figures> {
    let mut figs = Figures::default();
    baseline::run(env, cfg, &mut figs).await?;
    uncontended::run(env, cfg, &mut figs).await?;
    contended::run(env, cfg, &mut figs).await?;
    handoff::run(env, cfg, &mut figs).await?;
    parallel::run(env, cfg, &mut figs).await?;
    many_held::run(env, cfg, &mut figs).await?;
    processes::run(env, cfg, &mut figs).await?;
    rw::run(env, cfg, &mut figs).await?;
    semaphore::run(env, cfg, &mut figs).await?;
    multi::run(env, cfg, &mut figs).await?;
    Ok(figs)
}

/// The table: each workload's rows, in the order the workloads ran.
fn report(figs: &Figures, cfg: &Config) -> Table {
    let mut t = Table::default();
    baseline::report(figs, &mut t);
    uncontended::report(figs, &mut t);
    contended::report(figs, cfg, &mut t);
    handoff::report(figs, cfg, &mut t);
    parallel::report(figs, cfg, &mut t);
    many_held::report(figs, cfg, &mut t);
    processes::report(figs, &mut t);
    rw::report(figs, cfg, &mut t);
    semaphore::report(figs, cfg, &mut t);
    multi::report(figs, &mut t);
    t
}

/// The line above the table: the sizes of the run and how long it took.
fn header(cfg: &Config, took: Duration) -> String {
    format!(
        "lockrt benchmarks{}: medians over {} rounds ({} for many-held); uncontended {} pairs, \
         contended {}×{} sections, {} hand-offs of a {} ms hold, {} tasks × {} cycles \
         (1 task × {}), {} held locks; read-write {} tasks × {} ms holds for {} ms, semaphore \
         1 task × {} cycles and {} tasks for {} ms, multi-key 1 task × {} cycles. \
         Took {:.0} s.\n\n",
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
        cfg.rw_tasks,
        cfg.rw_hold.as_millis(),
        cfg.rw_time.as_millis(),
        cfg.sem_cycles,
        cfg.sem_tasks,
        cfg.sem_time.as_millis(),
        cfg.multi_cycles,
        took.as_secs_f64(),
    )
}

/// Writes `out` to `bench-locks.md` in the target directory; returns its path.
fn write_out(out: &str) -> Res<PathBuf> {
    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
        PathBuf::from,
    );
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("bench-locks.md");
    std::fs::write(&path, out)?;
    Ok(path)
}
