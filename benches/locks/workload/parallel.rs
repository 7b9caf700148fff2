//! Workload 5, parallel keys: acquire+release cycles from `BENCH_PAR_TASKS` tasks, each on
//! its own key, against one task alone; cycles/s of both and the speed-up, for the floor
//! (one connection) and lockrt (one Locker).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockrt::Locker;
use tokio::sync::Barrier;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, Lockrt};
use crate::stats::Figures;
use crate::table::{Table, Unit};

const PARALLEL: &str = "5 parallel keys";

/// An implementation's name in the figures, its name in the table and its keys' prefix.
struct Column {
    id: &'static str,
    name: &'static str,
    prefix: &'static str,
}

const FLOOR: Column = Column {
    id: "floor",
    name: "floor (SET NX PX + EVALSHA, 1 connection)",
    prefix: "bench:p:floor:",
};
const LOCKRT: Column = Column {
    id: "lockrt",
    name: "lockrt acquire/release (1 Locker)",
    prefix: "bench:p:",
};

/// `tasks` tasks, each `cycles` pairs on its own key (`prefix` and its number); returns
/// cycles/s overall.
async fn cycles<L: BenchLock>(
    imp: &L,
    prefix: &'static str,
    tasks: usize,
    cycles: usize,
) -> Res<f64> {
    let barrier = Arc::new(Barrier::new(tasks));
    let start = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let imp = imp.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let key = format!("{prefix}{i}");
                barrier.wait().await;
                for _ in 0..cycles {
                    imp.pair(&key).await?;
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

/// One round of one implementation: one task alone, then all of them.
async fn round<L: BenchLock>(imp: &L, col: &Column, cfg: &Config, figs: &mut Figures) -> Res<()> {
    let one = cycles(imp, col.prefix, 1, cfg.solo_cycles).await?;
    let many = cycles(imp, col.prefix, cfg.par_tasks, cfg.par_cycles).await?;
    figs.add(PARALLEL, col.id, "1 task", one);
    figs.add(PARALLEL, col.id, "many", many);
    figs.add(PARALLEL, col.id, "speedup", many / one);
    Ok(())
}

/// A warm-up of 10 cycles per task, then per round lockrt and the floor.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 5: parallel keys");
    let lockrt = Lockrt::new(&Locker::connect(&env.url).await?);
    let floor = Floor::new(env).await?;
    cycles(&lockrt, LOCKRT.prefix, cfg.par_tasks, 10).await?;
    cycles(&floor, FLOOR.prefix, cfg.par_tasks, 10).await?;
    for n in 1..=cfg.rounds {
        round(&lockrt, &LOCKRT, cfg, figs).await?;
        round(&floor, &FLOOR, cfg, figs).await?;
        eprintln!("  parallel round {n} done");
    }
    Ok(())
}

/// Per implementation: one task, all tasks as a ratio of one; lockrt's judged.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    for col in [FLOOR, LOCKRT] {
        let get = |metric: &str| figs.get(PARALLEL, col.id, metric);
        let speedup = get("speedup");
        t.row(
            PARALLEL,
            col.name,
            "cycles/s, 1 task",
            get("1 task"),
            Unit::PerSec,
        );
        let metric = format!("cycles/s, {} tasks", cfg.par_tasks);
        let row = t.row(PARALLEL, col.name, &metric, get("many"), Unit::PerSec);
        row.ratio(speedup, "of 1 task");
        if col.id == LOCKRT.id {
            row.target("≥ 8x of 1 task").met(speedup >= 8.0);
        }
    }
}
