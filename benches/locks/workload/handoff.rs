//! Workload 4, hand-off: a holder takes the lock, holds it `BENCH_HOLD_MS` and releases; one
//! waiter starts waiting 10 %, 20 %, .., 90 % into the hold. Measured from the start of the
//! release (as each implementation's [`BenchLock::hand_over`] says) to the waiter holding,
//! for the BLPOP-signalled floor timed two ways, lockrt across two Lockers and within one,
//! and rslock.

use std::time::{Duration, Instant};

use lockrt::Locker;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::imp::{BenchLock, Floor, Lockrt, Rslock, SignalledFloor};
use crate::stats::{Figures, pct, us};
use crate::table::{Table, Unit};

const HANDOFF: &str = "4 hand-off";
const IMPS_HANDOFF: [&str; 6] = [
    "floor (BLPOP-signalled; DEL, then LPUSH; from LPUSH start)",
    "floor' (BLPOP-signalled; DEL+LPUSH in 1 MULTI; from release start)",
    "lockrt (2 Lockers)",
    "lockrt (same Locker)",
    "rslock (retry 3 × 0..200 ms)",
    "task wake-up (tokio oneshot, no lock)",
];
/// How long a lockrt waiter waits at most.
const LOCKRT_WAITER_WAIT: Duration = Duration::from_secs(5);

/// When in the hold (of `hold`) the waiter of sample `i` starts: 10 % .. 90 %.
fn waiter_offset(i: usize, hold: Duration) -> Duration {
    hold * (1 + (i % 9) as u32) / 10
}

/// One hand-off on `key` from `holder` to `waiter` (handles on the same lock, or the same
/// handle): the time from the start of the release to the waiter holding.
async fn sample<L: BenchLock>(
    holder: &L,
    waiter: &L,
    key: &'static str,
    i: usize,
    hold: Duration,
) -> Res<Duration> {
    let guard = holder.lock(key).await?;
    let held_at = Instant::now();
    let waiter = waiter.clone();
    let offset = waiter_offset(i, hold);
    let task = tokio::spawn(async move {
        tokio::time::sleep_until((held_at + offset).into()).await;
        let guard = waiter.take_over(key).await?;
        let at = Instant::now();
        waiter.unlock(key, guard).await?;
        Res::Ok(at)
    });
    tokio::time::sleep_until((held_at + hold).into()).await;
    let start = holder.hand_over(key, guard).await?;
    let got = tokio::time::timeout(Duration::from_secs(10), task).await???;
    Ok(got.saturating_duration_since(start))
}

/// The floor of a hand-off within one process: a task waiting on a oneshot channel, sent at
/// the end of the same hold, measured from the send to the task running.
async fn wake_up(i: usize, hold: Duration) -> Res<Duration> {
    let held_at = Instant::now();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let offset = waiter_offset(i, hold);
    let task = tokio::spawn(async move {
        tokio::time::sleep_until((held_at + offset).into()).await;
        let _ = rx.await;
        Instant::now()
    });
    tokio::time::sleep_until((held_at + hold).into()).await;
    let start = Instant::now();
    let _ = tx.send(());
    let got = tokio::time::timeout(Duration::from_secs(10), task).await??;
    Ok(got.saturating_duration_since(start))
}

/// The implementations, in the order of [`IMPS_HANDOFF`].
struct Columns {
    floor: SignalledFloor,
    floor_one_trip: SignalledFloor,
    /// Holder on Locker `a`; waiters on `a` and on `b`.
    a: Lockrt,
    a_waiter: Lockrt,
    b_waiter: Lockrt,
    rslock: [Rslock; 2],
}

impl Columns {
    async fn new(env: &Env) -> Res<Columns> {
        let floor = Floor::new(env).await?;
        let waiter_conn = env.blocking_conn().await?;
        let a = Lockrt::new(&Locker::connect(&env.url).await?);
        let b = Lockrt::new(&Locker::connect(&env.url).await?);
        Ok(Columns {
            floor: SignalledFloor::new(&floor, &waiter_conn, false),
            floor_one_trip: SignalledFloor::new(&floor, &waiter_conn, true),
            a_waiter: a.clone().wait(LOCKRT_WAITER_WAIT),
            a,
            b_waiter: b.wait(LOCKRT_WAITER_WAIT),
            rslock: [Rslock::new(env), Rslock::new(env)],
        })
    }

    /// Sample `i` of column `which`.
    async fn sample(&self, which: usize, i: usize, hold: Duration) -> Res<Duration> {
        match which {
            0 => sample(&self.floor, &self.floor, "bench:h:floor", i, hold).await,
            1 => {
                let floor = &self.floor_one_trip;
                sample(floor, floor, "bench:h:floor", i, hold).await
            }
            2 => sample(&self.a, &self.b_waiter, "bench:h", i, hold).await,
            3 => sample(&self.a, &self.a_waiter, "bench:h", i, hold).await,
            4 => {
                let [ra, rb] = &self.rslock;
                sample(ra, rb, "bench:h:rslock", i, hold).await
            }
            _ => wake_up(i, hold).await,
        }
    }
}

/// `BENCH_HANDOFFS` samples per column and round, after a warm-up round of 2.
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 4: hand-off");
    let columns = Columns::new(env).await?;
    for round in 0..=cfg.rounds {
        // Round 0 is a short warm-up.
        let n = if round == 0 { 2 } else { cfg.handoffs };
        let mut samples: [Vec<Duration>; 6] = Default::default();
        for i in 0..n {
            // Rotate the order so no implementation always runs right after another.
            for k in 0..6 {
                let which = (k + i) % 6;
                samples[which].push(columns.sample(which, i, cfg.hold).await?);
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

/// Median and max per column; lockrt's median judged against the floor and rslock.
pub(crate) fn report(figs: &Figures, cfg: &Config, t: &mut Table) {
    let median = |imp: &str| figs.get(HANDOFF, imp, "median");
    let floor = median(IMPS_HANDOFF[0]);
    let metric = format!("release → acquired, median of {}", cfg.handoffs);
    for (k, imp) in IMPS_HANDOFF.iter().enumerate() {
        let v = median(imp);
        let row = t.row(HANDOFF, imp, &metric, v, Unit::Us);
        if k > 0 && k < 5 {
            row.ratio(v / floor, "of floor");
        }
        if k == 2 || k == 3 {
            let r = v / floor;
            let speedup = median(IMPS_HANDOFF[4]) / v;
            row.target(&format!(
                "≤ 1.5x floor (is {r:.2}x; {:.2}x of floor') and ≥ 20x faster than \
                 rslock (is {speedup:.0}x)",
                v / median(IMPS_HANDOFF[1])
            ))
            .met(r <= 1.5 && speedup >= 20.0);
        }
        if k == 3 {
            let wake = median(IMPS_HANDOFF[5]);
            t.row(HANDOFF, imp, "idle waiter woken", v, Unit::Us)
                .ratio(v / wake, "of a task wake-up")
                .target(&format!(
                    "median ≤ 50 µs (is {v:.1} µs; a bare task wake-up after the same hold \
                     is {wake:.1} µs here)"
                ))
                .met(v <= 50.0);
        }
        let max = figs.get(HANDOFF, imp, "max");
        t.row(HANDOFF, imp, "release → acquired, max", max, Unit::Us);
    }
}
