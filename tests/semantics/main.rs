//! Behaviour of the lock kinds and their options against real `redis-server` processes (and the
//! in-memory backend where a test says so).
//! Each module is one test file (run one with `cargo test --test semantics <module>::`); they share
//! one binary so that the suite builds and links once, not once per file.

#[macro_use]
#[path = "../support/mod.rs"]
mod support;

mod attr_behaviour;
mod cancellation;
mod every;
mod exit_paths;
mod fair_queue;
mod fencing;
mod force_revoke;
mod grant_lease;
mod handover_sync;
mod inspect;
mod job_cron;
mod job_handle;
mod job_metrics;
mod key_hygiene;
mod late_acquire;
mod loss;
mod metrics;
mod min_hold;
mod multi_key;
mod mutual_exclusion;
mod outage;
mod ownership;
mod readme;
mod reentrancy;
mod renewal_hedge;
mod rw_lock;
mod safety_regressions;
mod script_keys;
mod semaphore;
mod server_work;
mod shutdown;
mod tracing_spans;
mod unknown_outcome;
mod waiting;
mod watchdog;
