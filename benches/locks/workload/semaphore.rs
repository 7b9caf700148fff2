//! Workload 9, semaphore: acquire+release cycles of one task, one after another, on a free
//! semaphore of 8 permits, on lockrt's exclusive lock and on the floor (`SET NX PX` +
//! `EVALSHA` compare-and-delete), interleaved in chunks; then `BENCH_SEM_TASKS` tasks (half
//! on each of two lockers) cycling on a semaphore of 4 permits for `BENCH_SEM_MS`, holding
//! for no more than one yield to the scheduler between acquire and release. Median µs per cycle against the exclusive lock's,
//! cycles/s, and the most holders seen at once. rslock has no semaphore.

use lockrt::Locker;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, Lockrt};
use crate::stats::{Figures, Seq};
use crate::table::{Table, Unit};
use crate::workload::common::{Columns, interleaved, on_one_key};

const SEM: &str = "9 semaphore";
/// Permits of the uncontended semaphore, and of the contended one.
const FREE_PERMITS: u32 = 8;
const BUSY_PERMITS: u32 = 4;
const FLOOR: &str = "floor (SET NX PX + EVALSHA), 1 task";
const EXCL: &str = "lockrt exclusive acquire/release, 1 task";
const FREE: &str = "lockrt permits(8), 1 task";
const BUSY: &str = "lockrt permits(4)";
const NAMES: [&str; 3] = [FLOOR, EXCL, FREE];

/// The one-task columns, in the order of [`NAMES`], each on its own key.
struct OneTask {
    floor: Floor,
    excl: Lockrt,
    free: Lockrt,
}

impl Columns for OneTask {
    fn count(&self) -> usize {
        NAMES.len()
    }

    async fn chunk(&self, which: usize, seq: &mut Seq, m: usize) -> Res<()> {
        match which {
            0 => seq.run(m, || self.floor.pair("bench:s:floor")).await,
            1 => seq.run(m, || self.excl.pair("bench:s:excl")).await,
            _ => seq.run(m, || self.free.pair("bench:s:free")).await,
        }
    }
}

/// Warm-up rounds of a fifth of the size, then per round the one-task columns and the
/// contended semaphore.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 9: semaphore");
    let lockers = [
        Locker::connect(&env.url).await?,
        Locker::connect(&env.url).await?,
    ];
    let one = OneTask {
        floor: Floor::new(env).await?,
        excl: Lockrt::new(&lockers[0]),
        free: Lockrt::new(&lockers[0]).permits(FREE_PERMITS),
    };
    let busy = lockers
        .each_ref()
        .map(|l| Lockrt::new(l).permits(BUSY_PERMITS));
    let zero = std::time::Duration::ZERO;
    let (key, tasks) = ("bench:s:busy", cfg.sem_tasks);
    interleaved(&one, 0, (cfg.sem_cycles / 5).max(50)).await?;
    on_one_key(&busy, key, tasks, zero, cfg.sem_time / 5).await?;
    for n in 1..=cfg.rounds {
        let seqs = interleaved(&one, n, cfg.sem_cycles).await?;
        for (imp, seq) in NAMES.iter().zip(seqs) {
            let (p50, _, per_sec) = seq.summary();
            figs.add(SEM, imp, "cycle p50", p50);
            figs.add(SEM, imp, "cycles/s", per_sec);
        }
        let r = on_one_key(&busy, key, tasks, zero, cfg.sem_time).await?;
        figs.add(SEM, BUSY, "cycle p50", r.cycle_p50);
        figs.add(SEM, BUSY, "cycles/s", r.per_sec);
        figs.add(SEM, BUSY, "most", r.most as f64);
        eprintln!("  semaphore round {n} done");
    }
    Ok(())
}

/// The one-task columns (exclusive against the floor, permits against exclusive), then the
/// contended semaphore against the exclusive lock's single task; rslock named as not measured.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    let get = |imp: &str, metric: &str| figs.get(SEM, imp, metric);
    for imp in NAMES {
        let base = match imp {
            FLOOR => None,
            EXCL => Some((FLOOR, "of floor")),
            _ => Some((EXCL, "of exclusive")),
        };
        for (metric, unit) in [("cycle p50", Unit::Us), ("cycles/s", Unit::PerSec)] {
            let v = get(imp, metric);
            let row = t.row(SEM, imp, metric, v, unit);
            if let Some((base, basis)) = base {
                row.ratio(v / get(base, metric), basis);
            }
        }
    }
    let name = format!("{BUSY}, {} tasks", cfg.sem_tasks);
    let v = get(BUSY, "cycle p50");
    let metric = "cycle p50 (acquire start → released)";
    t.row(SEM, &name, metric, v, Unit::Us)
        .ratio(v / get(EXCL, "cycle p50"), "of exclusive, 1 task");
    let v = get(BUSY, "cycles/s");
    t.row(SEM, &name, "cycles/s", v, Unit::PerSec)
        .ratio(v / get(EXCL, "cycles/s"), "of exclusive, 1 task");
    let most = figs.max(SEM, BUSY, "most");
    let metric = "most holders at once (max over rounds)";
    t.row(SEM, &name, metric, most, Unit::Count)
        .target(&format!("≤ {BUSY_PERMITS}"))
        .met(most <= f64::from(BUSY_PERMITS));
    let metric = "not measured: no semaphore";
    t.row(SEM, "rslock", metric, f64::NAN, Unit::Count);
}
