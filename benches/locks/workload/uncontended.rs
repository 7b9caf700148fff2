//! Workloads 1 and 2, uncontended: acquire+release pairs on a free key, one after another,
//! for the floor, lockrt (`acquire`/`release`, `run`, the attribute) and rslock; p50, p99
//! and pairs/s of each, and the attribute's overhead over `Locker::run`.

use lockrt::Locker;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, Lockrt, Rslock, Via};
use crate::stats::{Figures, Seq};
use crate::table::{Table, Unit};

const UNCONTENDED: &str = "1 uncontended";
const OVERHEAD: &str = "2 attribute overhead";
/// Chunks each round's pairs are split into, per implementation, interleaved.
const UNC_CHUNKS: usize = 10;
const IMPS_UNC: [&str; 5] = [
    "floor (SET NX PX + EVALSHA)",
    "lockrt acquire/release",
    "lockrt run",
    "lockrt attribute",
    "rslock",
];

/// The implementations, in the order of [`IMPS_UNC`]; lockrt's three share one `Locker`.
struct Columns {
    floor: Floor,
    acquire: Lockrt,
    run: Lockrt,
    attr: Lockrt,
    rslock: Rslock,
}

impl Columns {
    async fn new(env: &Env) -> Res<Columns> {
        let floor = Floor::new(env).await?;
        let locker = Locker::connect(&env.url).await?;
        let lockrt = Lockrt::new(&locker);
        Ok(Columns {
            floor,
            acquire: lockrt.clone(),
            run: lockrt.clone().via(Via::Run),
            attr: lockrt.via(Via::Attribute),
            rslock: Rslock::new(env),
        })
    }

    /// `m` more pairs of column `which` into `seq`, each column on its own key.
    async fn chunk(&self, which: usize, seq: &mut Seq, m: usize) -> Res<()> {
        match which {
            0 => pairs(seq, m, &self.floor, "bench:u:floor").await,
            1 => pairs(seq, m, &self.acquire, "bench:u:acq").await,
            2 => pairs(seq, m, &self.run, "bench:u:run").await,
            // The attribute's key is `bench:{k}`: this is its `k`.
            3 => pairs(seq, m, &self.attr, "u:attr").await,
            _ => pairs(seq, m, &self.rslock, "bench:u:rslock").await,
        }
    }

    /// One round of `n` pairs per column. The machine's speed drifts: the columns run
    /// interleaved in chunks, in a rotating order, so drift hits all of them alike.
    async fn round(&self, round: usize, n: usize) -> Res<[Seq; 5]> {
        let chunks = UNC_CHUNKS.min(n);
        let mut seqs: [Seq; 5] = Default::default();
        for chunk in 0..chunks {
            let m = n / chunks + usize::from(chunk < n % chunks);
            for k in 0..IMPS_UNC.len() {
                let which = (k + round + chunk) % IMPS_UNC.len();
                self.chunk(which, &mut seqs[which], m).await?;
            }
        }
        Ok(seqs)
    }
}

async fn pairs<L: BenchLock>(seq: &mut Seq, m: usize, imp: &L, key: &str) -> Res<()> {
    seq.run(m, || imp.pair(key)).await
}

/// `BENCH_PAIRS` pairs per column and round, after a warm-up round of a fifth as many.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 1+2: uncontended");
    let columns = Columns::new(env).await?;
    for round in 0..=cfg.rounds {
        // Round 0 is the warm-up (connections, scripts loaded, allocator and caches warm).
        let n = if round == 0 {
            (cfg.pairs / 5).max(100)
        } else {
            cfg.pairs
        };
        let seqs = columns.round(round, n).await?;
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

/// Every column against the floor, then the attribute against `run`.
pub(crate) fn report(figs: &Figures, t: &mut Table) {
    let floor = IMPS_UNC[0];
    for imp in IMPS_UNC {
        for (metric, unit) in [
            ("p50", Unit::Us),
            ("p99", Unit::Us),
            ("pairs/s", Unit::PerSec),
        ] {
            let v = figs.get(UNCONTENDED, imp, metric);
            let base = figs.get(UNCONTENDED, floor, metric);
            let row = t.row(UNCONTENDED, imp, metric, v, unit);
            if imp != floor {
                row.ratio(v / base, "of floor");
            }
            // The target is on lockrt's p50; rslock is shown for comparison.
            if metric == "p50" && imp.starts_with("lockrt") {
                row.target("≤ 1.10x floor").met(v / base <= 1.10);
            }
        }
    }
    report_overhead(figs, t);
}

/// The attribute's p50 and time per pair as ratios of `Locker::run`'s.
fn report_overhead(figs: &Figures, t: &mut Table) {
    let get = |imp: &str, metric: &str| figs.get(UNCONTENDED, imp, metric);
    let p50 = get("lockrt attribute", "p50") / get("lockrt run", "p50");
    let per_pair = get("lockrt run", "pairs/s") / get("lockrt attribute", "pairs/s");
    for (metric, r) in [
        ("p50 ratio", p50),
        ("time per pair ratio (from pairs/s)", per_pair),
    ] {
        t.row(OVERHEAD, "attribute vs run", metric, r, Unit::X)
            .target("≤ 1.03x")
            .met(r <= 1.03);
    }
}
