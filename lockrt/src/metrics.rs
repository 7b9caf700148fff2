//! Metrics through the `metrics` facade (feature `metrics`): the application installs the
//! exporter (Prometheus, OpenTelemetry, ...). Without the feature every function here is an
//! empty inline fn. Names (no labels: lock keys would make unbounded label values):
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `lockrt_acquired_total` | counter | locks taken (`acquire`, `run`, the attribute) |
//! | `lockrt_timeouts_total` | counter | acquisitions whose `wait` elapsed |
//! | `lockrt_lost_total` | counter | leases lost while held |
//! | `lockrt_released_total` | counter | locks released |
//! | `lockrt_renewal_failures_total` | counter | renewals that failed (retried within the deadline) |
//! | `lockrt_wait_seconds` | histogram | time from the call to holding the lock |
//! | `lockrt_hold_seconds` | histogram | time from holding to release |
//! | `lockrt_handoff_seconds` | histogram | time from a waiter being woken by a release to holding the lock |
//! | `lockrt_local_handoffs_total` | counter | locks passed to the next holder inside the process (`LockerBuilder::local_handoff`) |
//! | `lockrt_held` | gauge | locks held now |
//! | `lockrt_waiting` | gauge | callers waiting for a busy lock now |

use std::time::Duration;

#[cfg(feature = "metrics")]
mod imp {
    use std::time::Duration;

    pub(crate) fn acquired(waited: Duration) {
        metrics::counter!("lockrt_acquired_total").increment(1);
        metrics::histogram!("lockrt_wait_seconds").record(waited.as_secs_f64());
        metrics::gauge!("lockrt_held").increment(1.0);
    }

    pub(crate) fn handoff(took: Duration) {
        metrics::histogram!("lockrt_handoff_seconds").record(took.as_secs_f64());
    }

    pub(crate) fn local_handoff() {
        metrics::counter!("lockrt_local_handoffs_total").increment(1);
    }

    pub(crate) fn released(held: Duration) {
        metrics::counter!("lockrt_released_total").increment(1);
        metrics::histogram!("lockrt_hold_seconds").record(held.as_secs_f64());
    }

    pub(crate) fn ended() {
        metrics::gauge!("lockrt_held").decrement(1.0);
    }

    pub(crate) fn timed_out() {
        metrics::counter!("lockrt_timeouts_total").increment(1);
    }

    pub(crate) fn lost() {
        metrics::counter!("lockrt_lost_total").increment(1);
    }

    pub(crate) fn renewal_failed(leases: usize) {
        metrics::counter!("lockrt_renewal_failures_total").increment(leases as u64);
    }

    pub(crate) fn waiting(delta: f64) {
        metrics::gauge!("lockrt_waiting").increment(delta);
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    use std::time::Duration;

    #[inline]
    pub(crate) fn acquired(_: Duration) {}
    #[inline]
    pub(crate) fn handoff(_: Duration) {}
    #[inline]
    pub(crate) fn local_handoff() {}
    #[inline]
    pub(crate) fn released(_: Duration) {}
    #[inline]
    pub(crate) fn ended() {}
    #[inline]
    pub(crate) fn timed_out() {}
    #[inline]
    pub(crate) fn lost() {}
    #[inline]
    pub(crate) fn renewal_failed(_: usize) {}
    #[inline]
    pub(crate) fn waiting(_: f64) {}
}

/// A lock taken after waiting `waited`.
pub(crate) fn acquired(waited: Duration) {
    imp::acquired(waited);
}

/// A waiter held the lock `took` after a release woke it.
pub(crate) fn handoff(took: Duration) {
    imp::handoff(took);
}

/// A lock passed to the next holder of the same locker.
pub(crate) fn local_handoff() {
    imp::local_handoff();
}

/// A lock released after being held `held`.
pub(crate) fn released(held: Duration) {
    imp::released(held);
}

/// A held lock's local bookkeeping ended (released, lost or dropped).
pub(crate) fn ended() {
    imp::ended();
}

/// An acquisition's wait elapsed.
pub(crate) fn timed_out() {
    imp::timed_out();
}

/// A lease was lost while held.
pub(crate) fn lost() {
    imp::lost();
}

/// Renewals of `leases` leases failed (they are retried).
pub(crate) fn renewal_failed(leases: usize) {
    imp::renewal_failed(leases);
}

/// A caller started (`+1.0`) or stopped (`-1.0`) waiting.
pub(crate) fn waiting(delta: f64) {
    imp::waiting(delta);
}
