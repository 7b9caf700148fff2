//! What the lock-kind workloads (8 to 10) share: sequential cycles of several columns run
//! interleaved in chunks ([`Columns`], [`interleaved`]), and tasks cycling on one shared key
//! for a set time while counting how many hold at once ([`on_one_key`]).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Barrier;

use crate::Res;
use crate::imp::BenchLock;
use crate::stats::{Seq, pct, us};

/// Chunks each round's cycles are split into, per column, interleaved.
const CHUNKS: usize = 10;

/// Implementations measured side by side with sequential cycles, each on its own key.
pub(crate) trait Columns {
    /// How many columns there are.
    fn count(&self) -> usize;

    /// `m` more cycles of column `which` into `seq`.
    fn chunk(&self, which: usize, seq: &mut Seq, m: usize) -> impl Future<Output = Res<()>>;
}

/// One round of `n` cycles per column. The machine's speed drifts: the columns run
/// interleaved in chunks, in an order rotating with `round` and the chunk, so drift hits all
/// of them alike (as the uncontended workload does).
pub(crate) async fn interleaved<C: Columns>(cols: &C, round: usize, n: usize) -> Res<Vec<Seq>> {
    let chunks = CHUNKS.min(n);
    let mut seqs: Vec<Seq> = (0..cols.count()).map(|_| Seq::default()).collect();
    for chunk in 0..chunks {
        let m = n / chunks + usize::from(chunk < n % chunks);
        for k in 0..cols.count() {
            let which = (k + round + chunk) % cols.count();
            cols.chunk(which, &mut seqs[which], m).await?;
        }
    }
    Ok(seqs)
}

/// What the tasks on one key saw in one round.
pub(crate) struct OnOneKey {
    /// Sections (acquire, hold, release) per second, all tasks together.
    pub(crate) per_sec: f64,
    /// Median of acquire start → release done, in µs.
    pub(crate) cycle_p50: f64,
    /// Median time between acquired and release start (the hold), in µs.
    pub(crate) hold_p50: f64,
    /// The most tasks that held the key at the same time.
    pub(crate) most: usize,
}

/// Tasks' cycle times and hold times, and the count of holders now and at most.
#[derive(Default)]
struct Log {
    cycles: Vec<Duration>,
    holds: Vec<Duration>,
}

#[derive(Default)]
struct Holders {
    now: AtomicUsize,
    most: AtomicUsize,
}

/// `tasks` tasks on `key`, alternating between the handles, each taking the lock, holding
/// it for `hold` (a zero hold is one yield to the scheduler), releasing, until `run_for` has
/// passed (a cycle started goes on to its end, and counts).
pub(crate) async fn on_one_key<L: BenchLock>(
    handles: &[L],
    key: &'static str,
    tasks: usize,
    hold: Duration,
    run_for: Duration,
) -> Res<OnOneKey> {
    let barrier = Arc::new(Barrier::new(tasks));
    let holders = Arc::new(Holders::default());
    let start = Instant::now();
    let end = start + run_for;
    let joins: Vec<_> = (0..tasks)
        .map(|i| {
            let imp = handles[i % handles.len()].clone();
            let (barrier, holders) = (barrier.clone(), holders.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                cycles(imp, key, hold, end, &holders).await
            })
        })
        .collect();
    let mut log = Log::default();
    for j in joins {
        let l = tokio::time::timeout(Duration::from_secs(300), j).await???;
        log.cycles.extend(l.cycles);
        log.holds.extend(l.holds);
    }
    let elapsed = start.elapsed();
    log.cycles.sort();
    log.holds.sort();
    Ok(OnOneKey {
        per_sec: log.cycles.len() as f64 / elapsed.as_secs_f64(),
        cycle_p50: us(pct(&log.cycles, 0.5)),
        hold_p50: us(pct(&log.holds, 0.5)),
        most: holders.most.load(Ordering::SeqCst),
    })
}

/// One task's cycles until `end`. It counts itself a holder from the moment `lock` returns
/// to the moment it calls `unlock`: inside the time it really holds, so the count never
/// overstates.
async fn cycles<L: BenchLock>(
    imp: L,
    key: &str,
    hold: Duration,
    end: Instant,
    holders: &Holders,
) -> Res<Log> {
    let mut log = Log::default();
    while Instant::now() < end {
        let t = Instant::now();
        let guard = imp.lock(key).await?;
        let held = Instant::now();
        let now = holders.now.fetch_add(1, Ordering::SeqCst) + 1;
        holders.most.fetch_max(now, Ordering::SeqCst);
        if hold.is_zero() {
            // One turn of the scheduler, so that other tasks run while this one holds: without
            // it, taking and dropping the count in one poll would hide every overlap.
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(hold).await;
        }
        holders.now.fetch_sub(1, Ordering::SeqCst);
        log.holds.push(held.elapsed());
        imp.unlock(key, guard).await?;
        log.cycles.push(t.elapsed());
    }
    Ok(log)
}
