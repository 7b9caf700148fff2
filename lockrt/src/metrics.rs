//! Metrics through the `metrics` facade (feature `metrics`): the application installs the
//! exporter (Prometheus, OpenTelemetry, ...). Without the feature every function here is an
//! empty inline fn. Names (label `cause` has five values, `kind` three: `exclusive`, `read`,
//! `permits`; `site` is the lock site's name, [`LockOptions::site`](crate::LockOptions::site),
//! from a fixed set; `job` one per job name of [`every`](crate::every); lock keys are never
//! labels, they would make unbounded label values):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `lockrt_acquired_total` | counter | locks taken (`acquire`, `run`, the attribute), by `kind` and `site` |
//! | `lockrt_timeouts_total` | counter | acquisitions whose `wait` elapsed (a `wait = 0` attempt that found the lock busy too), by `site` |
//! | `lockrt_acquire_failures_total` | counter | acquisitions that failed on the lock server (unreachable, refused); the body never ran; by `site` |
//! | `lockrt_lost_total` | counter | leases lost while held, once each wherever found (a renewal, the deadline, the release), by `cause` (`expired`, `unreachable`, `max_hold`, `force_unlocked`) and `site` |
//! | `lockrt_force_unlocks_total` | counter | locks this locker force-unlocked (`Locker::force_unlock`, `lockctl unlock --force`) |
//! | `lockrt_released_total` | counter | locks released, by `kind` and `site` |
//! | `lockrt_release_failures_total` | counter | releases that failed on the lock server (the lease ends the lock) |
//! | `lockrt_renewal_failures_total` | counter | renewals that failed (retried within the deadline) |
//! | `lockrt_wait_seconds` | histogram | time from the call to holding the lock, by `site` |
//! | `lockrt_hold_seconds` | histogram | time from holding to release, by `site` |
//! | `lockrt_handoff_seconds` | histogram | time from a waiter being woken by a release to holding the lock |
//! | `lockrt_local_handoffs_total` | counter | locks passed to the next holder inside the process (`LockerBuilder::local_handoff`) |
//! | `lockrt_held` | gauge | locks held now, by `kind` |
//! | `lockrt_waiting` | gauge | callers waiting for a busy lock now |
//! | `lockrt_job_ticks_given_up_total` | counter | ticks of [`every`](crate::every) this instance found run by nobody, by `job`: the claim still held by a run that did not finish (a runner that died with a lease longer than the tick, or one overrunning) when the next tick ended, or a tick skipped here while busy (a late or overrunning run) that no other instance took |
//! | `lockrt_job_runs_total` | counter | runs of a job on this instance, by `job` and `outcome`: `ran`, `late` (a take-over after the tick's end), `lost`, `max_hold`, `failed` (the lock server), `overran` (skipped: the previous run held the job), `stopped` (shutdown, `Stop::Now`) |
//! | `lockrt_job_last_success_seconds` | gauge | when a run of `job` last finished on this instance (`ran` or `late`), Unix seconds |

use std::time::Duration;

use crate::options::LockKind;

/// What each metric is, as an exporter shows it (Prometheus's `# HELP`): the table above.
const HELP: [(&str, Shape, &str); 17] = [
    (
        "lockrt_acquired_total",
        Shape::Counter,
        "Locks taken (acquire, run, the attribute), by kind.",
    ),
    (
        "lockrt_timeouts_total",
        Shape::Counter,
        "Acquisitions whose wait elapsed (a wait = 0 attempt that found the lock busy too).",
    ),
    (
        "lockrt_acquire_failures_total",
        Shape::Counter,
        "Acquisitions that failed on the lock server; the body never ran.",
    ),
    (
        "lockrt_lost_total",
        Shape::Counter,
        "Leases lost while held, once each, by cause.",
    ),
    (
        "lockrt_force_unlocks_total",
        Shape::Counter,
        "Locks this locker force-unlocked.",
    ),
    (
        "lockrt_released_total",
        Shape::Counter,
        "Locks released, by kind.",
    ),
    (
        "lockrt_release_failures_total",
        Shape::Counter,
        "Releases that failed on the lock server (the lease ends the lock).",
    ),
    (
        "lockrt_renewal_failures_total",
        Shape::Counter,
        "Renewals that failed (retried within the deadline).",
    ),
    (
        "lockrt_wait_seconds",
        Shape::Seconds,
        "Time from the call to holding the lock.",
    ),
    (
        "lockrt_hold_seconds",
        Shape::Seconds,
        "Time from holding the lock to its release.",
    ),
    (
        "lockrt_handoff_seconds",
        Shape::Seconds,
        "Time from a waiter woken by a release to holding the lock.",
    ),
    (
        "lockrt_local_handoffs_total",
        Shape::Counter,
        "Locks passed to the next holder inside the process.",
    ),
    ("lockrt_held", Shape::Gauge, "Locks held now, by kind."),
    (
        "lockrt_waiting",
        Shape::Gauge,
        "Callers waiting for a busy lock now.",
    ),
    (
        "lockrt_job_ticks_given_up_total",
        Shape::Counter,
        "Ticks of every() this instance found run by nobody, by job.",
    ),
    (
        "lockrt_job_runs_total",
        Shape::Counter,
        "Runs of every() jobs on this instance, by job and outcome.",
    ),
    (
        "lockrt_job_last_success_seconds",
        Shape::Time,
        "When a run of the job last finished on this instance (Unix seconds), by job.",
    ),
];

/// How a metric is described.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
#[derive(Clone, Copy)]
enum Shape {
    Counter,
    Gauge,
    Seconds,
    /// A gauge holding a time (Unix seconds).
    Time,
}

/// Describes every metric to the recorder now installed (the global one, or a thread's):
/// each locker does once when it is made, so an exporter installed first shows `# HELP`.
pub(crate) fn describe() {
    imp::describe();
}

#[cfg(feature = "metrics")]
mod imp {
    use std::time::Duration;

    use super::{HELP, Shape};

    pub(crate) fn describe() {
        for (name, shape, help) in HELP {
            match shape {
                Shape::Counter => metrics::describe_counter!(name, help),
                Shape::Gauge => metrics::describe_gauge!(name, help),
                Shape::Seconds => {
                    metrics::describe_histogram!(name, metrics::Unit::Seconds, help)
                }
                Shape::Time => metrics::describe_gauge!(name, metrics::Unit::Seconds, help),
            }
        }
    }

    pub(crate) fn acquired(waited: Duration, kind: &'static str, site: &'static str) {
        metrics::counter!("lockrt_acquired_total", "kind" => kind, "site" => site).increment(1);
        metrics::histogram!("lockrt_wait_seconds", "site" => site).record(waited.as_secs_f64());
        metrics::gauge!("lockrt_held", "kind" => kind).increment(1.0);
    }

    pub(crate) fn handoff(took: Duration) {
        metrics::histogram!("lockrt_handoff_seconds").record(took.as_secs_f64());
    }

    pub(crate) fn local_handoff() {
        metrics::counter!("lockrt_local_handoffs_total").increment(1);
    }

    pub(crate) fn released(held: Duration, kind: &'static str, site: &'static str) {
        metrics::counter!("lockrt_released_total", "kind" => kind, "site" => site).increment(1);
        metrics::histogram!("lockrt_hold_seconds", "site" => site).record(held.as_secs_f64());
    }

    pub(crate) fn ended(kind: &'static str) {
        metrics::gauge!("lockrt_held", "kind" => kind).decrement(1.0);
    }

    pub(crate) fn timed_out(site: &'static str) {
        metrics::counter!("lockrt_timeouts_total", "site" => site).increment(1);
    }

    pub(crate) fn lost(cause: &'static str, site: &'static str) {
        metrics::counter!("lockrt_lost_total", "cause" => cause, "site" => site).increment(1);
    }

    pub(crate) fn acquire_failed(site: &'static str) {
        metrics::counter!("lockrt_acquire_failures_total", "site" => site).increment(1);
    }

    pub(crate) fn count(name: &'static str) {
        metrics::counter!(name).increment(1);
    }

    pub(crate) fn renewal_failed(leases: usize) {
        metrics::counter!("lockrt_renewal_failures_total").increment(leases as u64);
    }

    pub(crate) fn waiting(delta: f64) {
        metrics::gauge!("lockrt_waiting").increment(delta);
    }

    pub(crate) fn job_count(name: &'static str, job: &str) {
        metrics::counter!(name, "job" => job.to_owned()).increment(1);
    }

    pub(crate) fn job_run(job: &str, outcome: &'static str) {
        metrics::counter!("lockrt_job_runs_total", "job" => job.to_owned(), "outcome" => outcome)
            .increment(1);
    }

    pub(crate) fn job_succeeded(job: &str, at_secs: f64) {
        metrics::gauge!("lockrt_job_last_success_seconds", "job" => job.to_owned()).set(at_secs);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    #[inline]
    pub(crate) fn describe() {
        let _ = super::HELP;
    }
    #[inline]
    pub(crate) fn acquired(_: Duration, _: &'static str, _: &'static str) {}
    #[inline]
    pub(crate) fn handoff(_: Duration) {}
    #[inline]
    pub(crate) fn local_handoff() {}
    #[inline]
    pub(crate) fn released(_: Duration, _: &'static str, _: &'static str) {}
    #[inline]
    pub(crate) fn ended(_: &'static str) {}
    #[inline]
    pub(crate) fn timed_out(_: &'static str) {}
    #[inline]
    pub(crate) fn acquire_failed(_: &'static str) {}
    #[inline]
    pub(crate) fn lost(_: &'static str, _: &'static str) {}
    #[inline]
    pub(crate) fn count(_: &'static str) {}
    #[inline]
    pub(crate) fn renewal_failed(_: usize) {}
    #[inline]
    pub(crate) fn waiting(_: f64) {}
    #[inline]
    pub(crate) fn job_count(_: &'static str, _: &str) {}
    #[inline]
    pub(crate) fn job_run(_: &str, _: &'static str) {}
    #[inline]
    pub(crate) fn job_succeeded(_: &str, _: f64) {}
}

/// A lock of `kind` taken at `site` after waiting `waited`.
pub(crate) fn acquired(waited: Duration, kind: LockKind, site: &'static str) {
    imp::acquired(waited, kind.as_str(), site);
}

/// A waiter held the lock `took` after a release woke it.
pub(crate) fn handoff(took: Duration) {
    imp::handoff(took);
}

/// A lock passed to the next holder of the same locker.
pub(crate) fn local_handoff() {
    imp::local_handoff();
}

/// A lock of `kind` taken at `site` released after being held `held`.
pub(crate) fn released(held: Duration, kind: LockKind, site: &'static str) {
    imp::released(held, kind.as_str(), site);
}

/// A held lock's local bookkeeping ended (released, lost or dropped).
pub(crate) fn ended(kind: LockKind) {
    imp::ended(kind.as_str());
}

/// An acquisition's wait elapsed at `site`.
pub(crate) fn timed_out(site: &'static str) {
    imp::timed_out(site);
}

/// A lease taken at `site` was lost while held.
pub(crate) fn lost(cause: crate::error::LossCause, site: &'static str) {
    imp::lost(cause.as_str(), site);
}

/// An acquisition at `site` failed on the lock server.
pub(crate) fn acquire_failed(site: &'static str) {
    imp::acquire_failed(site);
}

/// A release failed on the lock server.
pub(crate) fn release_failed() {
    imp::count("lockrt_release_failures_total");
}

/// This locker force-unlocked a lock.
pub(crate) fn force_unlocked() {
    imp::count("lockrt_force_unlocks_total");
}

/// Renewals of `leases` leases failed (they are retried).
pub(crate) fn renewal_failed(leases: usize) {
    imp::renewal_failed(leases);
}

// Jobs of `every`, labelled with the job's name (a fixed set per service).

/// A tick of job `job` that no instance ran: its claim was still held by a run that did not
/// finish when the next tick ended, or nobody took a tick this instance skipped.
pub(crate) fn tick_given_up(job: &str) {
    imp::job_count("lockrt_job_ticks_given_up_total", job);
}

/// A run of job `job` here ended with `outcome`.
pub(crate) fn job_run(job: &str, outcome: &'static str) {
    imp::job_run(job, outcome);
}

/// A run of job `job` finished at `at_ms` (Unix ms).
pub(crate) fn job_succeeded(job: &str, at_ms: u128) {
    imp::job_succeeded(job, at_ms as f64 / 1000.0);
}

/// A caller started (`+1.0`) or stopped (`-1.0`) waiting.
pub(crate) fn waiting(delta: f64) {
    imp::waiting(delta);
}
