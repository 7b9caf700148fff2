//! Workload 8, read-write: `BENCH_RW_TASKS` tasks on one key, half on each of two lockers,
//! each taking the key's read share, holding it `BENCH_RW_HOLD_MS`, releasing, again and
//! again for `BENCH_RW_MS`; then the same tasks with the exclusive (write) lock on a key of
//! its own. Sections/s of both and their ratio, the median hold and cycle, and the most
//! holders seen at once (all readers may share; an exclusive holder never does). lockrt
//! only: rslock has no read-write lock, and the floor's `SET NX` never waits.

use lockrt::Locker;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::Lockrt;
use crate::stats::Figures;
use crate::table::{Table, Unit};
use crate::workload::common::{OnOneKey, on_one_key};

const RW: &str = "8 read-write";
const READ: &str = "lockrt read share";
const EXCL: &str = "lockrt exclusive (write)";
const READ_KEY: &str = "bench:rw:read";
const EXCL_KEY: &str = "bench:rw:excl";

fn record(figs: &mut Figures, imp: &str, r: &OnOneKey) {
    figs.add(RW, imp, "sections/s", r.per_sec);
    figs.add(RW, imp, "cycle p50", r.cycle_p50);
    figs.add(RW, imp, "hold p50", r.hold_p50);
    figs.add(RW, imp, "most", r.most as f64);
}

/// A warm-up of a fifth of a round per kind, then per round both kinds, in alternating order.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 8: read-write");
    let lockers = [
        Locker::connect(&env.url).await?,
        Locker::connect(&env.url).await?,
    ];
    let read = lockers.each_ref().map(|l| Lockrt::new(l).read());
    let excl = lockers.each_ref().map(Lockrt::new);
    let (tasks, hold) = (cfg.rw_tasks, cfg.rw_hold);
    let warm = cfg.rw_time / 5;
    on_one_key(&read, READ_KEY, tasks, hold, warm).await?;
    on_one_key(&excl, EXCL_KEY, tasks, hold, warm).await?;
    for n in 1..=cfg.rounds {
        for which in [n % 2, (n + 1) % 2] {
            if which == 0 {
                let r = on_one_key(&read, READ_KEY, tasks, hold, cfg.rw_time).await?;
                record(figs, READ, &r);
            } else {
                let r = on_one_key(&excl, EXCL_KEY, tasks, hold, cfg.rw_time).await?;
                record(figs, EXCL, &r);
            }
        }
        eprintln!("  read-write round {n} done");
    }
    Ok(())
}

/// Readers against the exclusive lock; the holder counts; rslock named as not measured.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    let excl_rate = figs.get(RW, EXCL, "sections/s");
    let hold_ms = cfg.rw_hold.as_millis();
    for imp in [READ, EXCL] {
        let get = |metric: &str| figs.get(RW, imp, metric);
        let name = format!("{imp}, {} tasks on one key", cfg.rw_tasks);
        let metric = format!("sections/s (hold {hold_ms} ms)");
        let row = t.row(RW, &name, &metric, get("sections/s"), Unit::PerSec);
        if imp == READ {
            row.ratio(get("sections/s") / excl_rate, "of exclusive");
        }
        let metric = "cycle p50 (acquire start → released)";
        t.row(RW, &name, metric, get("cycle p50"), Unit::Us);
        let metric = "hold p50 (acquired → release start)";
        t.row(RW, &name, metric, get("hold p50"), Unit::Us);
        let most = figs.max(RW, imp, "most");
        let metric = "most holders at once (max over rounds)";
        let row = t.row(RW, &name, metric, most, Unit::Count);
        if imp == EXCL {
            row.target("1").met(most == 1.0);
        }
    }
    let metric = "not measured: no read-write lock";
    t.row(RW, "rslock", metric, f64::NAN, Unit::Count);
}
