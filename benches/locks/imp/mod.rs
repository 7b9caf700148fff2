//! The one interface the workloads drive, [`BenchLock`], and its implementations: lockrt
//! ([`Lockrt`], through `acquire`/`release`, `Locker::run` or the attribute, of any kind;
//! [`LockrtAll`] for two keys at once), the `rslock` crate ([`Rslock`]) and the floor written
//! with plain `redis` ([`Floor`], [`SignalledFloor`] for the hand-off, [`FloorTwo`] for two
//! keys). A workload is written once, generic over the trait;
//! how each implementation takes, waits for and releases a lock lives here and nowhere else.
//! Nothing here times anything, except where a hand-off's measured span starts.

use std::future::Future;
use std::time::Instant;

use crate::Res;

mod floor;
mod lockrt;
mod rslock;

pub(crate) use floor::{Floor, FloorTwo, SignalledFloor};
pub(crate) use lockrt::{Lockrt, LockrtAll, Via};
pub(crate) use rslock::Rslock;

/// A lock as a workload uses it. Cloning gives another handle on the same connections
/// (a spawned task's own copy).
pub(crate) trait BenchLock: Clone + Send + Sync + 'static {
    /// What holding the lock leaves the holder with (a guard, a lock value, a token).
    type Guard: Send + 'static;

    /// Takes the lock on `key`, waiting for it if the implementation waits (up to
    /// [`WAIT`](crate::config::WAIT)).
    fn lock(&self, key: &str) -> impl Future<Output = Res<Self::Guard>> + Send;

    /// Releases what [`lock`](BenchLock::lock) or [`take_over`](BenchLock::take_over)
    /// returned.
    fn unlock(&self, key: &str, guard: Self::Guard) -> impl Future<Output = Res<()>> + Send;

    /// One acquire+release pair, the unit of the uncontended and parallel workloads.
    fn pair(&self, key: &str) -> impl Future<Output = Res<()>> + Send {
        async move {
            let guard = self.lock(key).await?;
            self.unlock(key, guard).await
        }
    }

    /// The hand-off waiter's acquisition, started while another holds the lock.
    fn take_over(&self, key: &str) -> impl Future<Output = Res<Self::Guard>> + Send {
        self.lock(key)
    }

    /// The hand-off holder's release; returns the instant the measured hand-off starts
    /// (by default the start of [`unlock`](BenchLock::unlock)).
    fn hand_over(
        &self,
        key: &str,
        guard: Self::Guard,
    ) -> impl Future<Output = Res<Instant>> + Send {
        async move {
            let start = Instant::now();
            self.unlock(key, guard).await?;
            Ok(start)
        }
    }
}
