//! What a run is sized by: `--quick` and the `BENCH_*` environment variables ([`Config`]),
//! and the lease and wait every lock uses unless its workload is about them ([`TTL`],
//! [`WAIT`]). Reads the command line and the environment once, at the start; nothing else.

use std::time::Duration;

/// Lease for every lock that is not about expiry.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// Upper bound for any single wait, so no loop can hang the run.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// Sizes of the run. Full defaults follow the issue; `--quick` shrinks them for a smoke run.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) quick: bool,
    /// `BENCH_ROUNDS`: rounds per workload, each figure is the median over them.
    pub(crate) rounds: usize,
    /// `BENCH_PAIRS`: acquire+release pairs per round, uncontended.
    pub(crate) pairs: usize,
    /// `BENCH_TASKS`: contending tasks (split over 2 lockers).
    pub(crate) tasks: usize,
    /// `BENCH_SECTIONS`: critical sections per contending task.
    pub(crate) sections: usize,
    /// `BENCH_HANDOFFS`: hand-off samples per round.
    pub(crate) handoffs: usize,
    /// `BENCH_HOLD_MS`: how long the holder holds in the hand-off workload.
    pub(crate) hold: Duration,
    /// `BENCH_PAR_TASKS`: tasks on distinct keys.
    pub(crate) par_tasks: usize,
    /// `BENCH_PAR_CYCLES`: lock cycles per parallel task.
    pub(crate) par_cycles: usize,
    /// `BENCH_SOLO_CYCLES`: lock cycles of the single-task baseline.
    pub(crate) solo_cycles: usize,
    /// `BENCH_HELD`: locks held at once by one locker.
    pub(crate) held: usize,
    /// `BENCH_HELD_TTL_MS`: their ttl.
    pub(crate) held_ttl: Duration,
    /// `BENCH_HELD_PERIODS`: how many ttls they are held for.
    pub(crate) held_periods: u32,
    /// `BENCH_HELD_ROUNDS`: rounds of the many-held workload (default: `rounds`).
    pub(crate) held_rounds: usize,
    /// `BENCH_RW_TASKS`: tasks on the one key of the read-write workload (split over 2
    /// lockers), readers and then exclusive holders.
    pub(crate) rw_tasks: usize,
    /// `BENCH_RW_HOLD_MS`: how long each of them holds (0: release at once). Not
    /// `BENCH_HOLD_MS`, which is the hand-off's hold.
    pub(crate) rw_hold: Duration,
    /// `BENCH_RW_MS`: how long each kind runs per round.
    pub(crate) rw_time: Duration,
    /// `BENCH_SEM_CYCLES`: acquire+release cycles per column and round, one task.
    pub(crate) sem_cycles: usize,
    /// `BENCH_SEM_TASKS`: tasks on the contended semaphore (split over 2 lockers).
    pub(crate) sem_tasks: usize,
    /// `BENCH_SEM_MS`: how long they run per round.
    pub(crate) sem_time: Duration,
    /// `BENCH_MULTI_CYCLES`: single- and multi-key cycles per column and round, one task.
    pub(crate) multi_cycles: usize,
}

impl Config {
    /// Reads `--quick` and the `BENCH_*` variables (each overrides the preset).
    pub(crate) fn from_env() -> Config {
        let quick = std::env::args().any(|a| a == "--quick");
        let env = |name: &str, full: u64, quick_v: u64| -> u64 {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(if quick { quick_v } else { full })
        };
        let rounds = env("BENCH_ROUNDS", 5, 2).max(1) as usize;
        Config {
            quick,
            rounds,
            pairs: env("BENCH_PAIRS", 5_000, 500).max(1) as usize,
            tasks: env("BENCH_TASKS", 32, 32).max(1) as usize,
            sections: env("BENCH_SECTIONS", 50, 10).max(1) as usize,
            handoffs: env("BENCH_HANDOFFS", 20, 5).max(1) as usize,
            hold: Duration::from_millis(env("BENCH_HOLD_MS", 100, 100).max(20)),
            par_tasks: env("BENCH_PAR_TASKS", 64, 64).max(1) as usize,
            par_cycles: env("BENCH_PAR_CYCLES", 200, 50).max(1) as usize,
            solo_cycles: env("BENCH_SOLO_CYCLES", 2_000, 500).max(1) as usize,
            held: env("BENCH_HELD", 10_000, 2_000).max(1) as usize,
            held_ttl: Duration::from_millis(env("BENCH_HELD_TTL_MS", 3_000, 1_500).max(300)),
            held_periods: env("BENCH_HELD_PERIODS", 3, 2).max(1) as u32,
            held_rounds: env("BENCH_HELD_ROUNDS", rounds as u64, 1).max(1) as usize,
            rw_tasks: env("BENCH_RW_TASKS", 32, 32).max(1) as usize,
            rw_hold: Duration::from_millis(env("BENCH_RW_HOLD_MS", 1, 1)),
            rw_time: Duration::from_millis(env("BENCH_RW_MS", 1_000, 300).max(50)),
            sem_cycles: env("BENCH_SEM_CYCLES", 2_000, 300).max(1) as usize,
            sem_tasks: env("BENCH_SEM_TASKS", 16, 16).max(1) as usize,
            sem_time: Duration::from_millis(env("BENCH_SEM_MS", 1_000, 300).max(50)),
            multi_cycles: env("BENCH_MULTI_CYCLES", 1_000, 200).max(1) as usize,
        }
    }
}
