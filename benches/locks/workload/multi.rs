//! Workload 10, multi-key: one task's cycles, one after another, of `Locker::acquire_all` of
//! two keys + `MultiGuard::release`, with the keys sharing a hash tag (`{acct}:1`,
//! `{acct}:2`) and without (`acct:1`, `acct:2`), against a single-key acquire+release; and
//! the floor, one key against two locks one after another. All interleaved in chunks,
//! `BENCH_MULTI_CYCLES` per column and round. On the bench's single server both key pairs
//! cost the same unless lockrt takes a shorter path for keys of one slot. rslock has no
//! multi-key lock.

use lockrt::Locker;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, FloorTwo, Lockrt, LockrtAll};
use crate::stats::{Figures, Seq};
use crate::table::{Table, Unit};
use crate::workload::common::{Columns, interleaved};

const MULTI: &str = "10 multi-key";
const ONE: &str = "lockrt acquire/release, 1 key";
const TAGGED: &str = "lockrt acquire_all, 2 keys, one hash tag ({acct}:1, {acct}:2)";
const SPREAD: &str = "lockrt acquire_all, 2 keys, 2 slots (acct:1, acct:2)";
const FLOOR_ONE: &str = "floor (SET NX PX + EVALSHA), 1 key";
const FLOOR_TWO: &str = "floor, 2 keys one after another";
const NAMES: [&str; 5] = [ONE, TAGGED, SPREAD, FLOOR_ONE, FLOOR_TWO];

/// The columns, in the order of [`NAMES`]; lockrt's share one `Locker`. A two-key pair on
/// `k` takes `k1` and `k2`.
struct Cols {
    one: Lockrt,
    all: LockrtAll,
    floor: Floor,
    floor_two: FloorTwo,
}

impl Columns for Cols {
    fn count(&self) -> usize {
        NAMES.len()
    }

    async fn chunk(&self, which: usize, seq: &mut Seq, m: usize) -> Res<()> {
        match which {
            0 => seq.run(m, || self.one.pair("bench:m:one")).await,
            1 => seq.run(m, || self.all.pair("{acct}:")).await,
            2 => seq.run(m, || self.all.pair("acct:")).await,
            3 => seq.run(m, || self.floor.pair("bench:m:floor")).await,
            _ => seq.run(m, || self.floor_two.pair("bench:m:floor:")).await,
        }
    }
}

/// A warm-up round of a fifth of the size, then the rounds.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 10: multi-key");
    let locker = Locker::connect(&env.url).await?;
    let floor = Floor::new(env).await?;
    let cols = Cols {
        one: Lockrt::new(&locker),
        all: Lockrt::new(&locker).all(),
        floor: floor.clone(),
        floor_two: FloorTwo(floor),
    };
    interleaved(&cols, 0, (cfg.multi_cycles / 5).max(50)).await?;
    for n in 1..=cfg.rounds {
        let seqs = interleaved(&cols, n, cfg.multi_cycles).await?;
        for (imp, seq) in NAMES.iter().zip(seqs) {
            let (p50, _, per_sec) = seq.summary();
            figs.add(MULTI, imp, "cycle p50", p50);
            figs.add(MULTI, imp, "cycles/s", per_sec);
        }
        eprintln!("  multi-key round {n} done");
    }
    Ok(())
}

/// lockrt's two-key columns against its single key, the floor's two keys against its one;
/// rslock named as not measured.
pub(crate) fn report(figs: &Figures, t: &mut Table) {
    let get = |imp: &str, metric: &str| figs.get(MULTI, imp, metric);
    for imp in NAMES {
        let base = match imp {
            TAGGED | SPREAD => Some((ONE, "of 1 key")),
            FLOOR_TWO => Some((FLOOR_ONE, "of floor 1 key")),
            _ => None,
        };
        for (metric, unit) in [("cycle p50", Unit::Us), ("cycles/s", Unit::PerSec)] {
            let v = get(imp, metric);
            let row = t.row(MULTI, imp, metric, v, unit);
            if let Some((base, basis)) = base {
                row.ratio(v / get(base, metric), basis);
            }
        }
    }
    let metric = "not measured: no multi-key lock";
    t.row(MULTI, "rslock", metric, f64::NAN, Unit::Count);
}
