//! The workloads, one file each, numbered as they run and print (BENCHMARKS.md explains
//! each). Every file has `run`, which measures into [`Figures`](crate::stats::Figures) round
//! by round after an unmeasured warm-up, and `report`, which turns the medians into its rows
//! of the table. A workload that compares implementations is written once, generic over
//! [`BenchLock`](crate::imp::BenchLock), and names its columns and their keys in one place.
//! `common` holds what the lock-kind workloads (8 to 10) share.

pub(crate) mod baseline;
mod common;
pub(crate) mod contended;
pub(crate) mod handoff;
pub(crate) mod many_held;
pub(crate) mod multi;
pub(crate) mod parallel;
pub(crate) mod processes;
pub(crate) mod rw;
pub(crate) mod semaphore;
pub(crate) mod uncontended;
