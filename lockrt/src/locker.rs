//! [`Locker`]: the handle users keep (cheap to clone) and what its clones share: the backend,
//! the per-key waiting registry, the lease monitors and the counters.
//!
//! The ways to take a lock live with their protocol: [`Locker::acquire`] and
//! [`Locker::try_acquire`] in `acquire.rs`, [`Locker::run`] in `section.rs`; the builder in
//! `builder.rs`. This module owns the background work's placement: a lease monitor runs on
//! the runtime of the acquire that needs it, and a new one starts when that runtime is gone,
//! so a `Locker` works from any runtime (a `static` locker shared by several tests, a locker
//! built before a runtime restart).

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::backend::contract::Released;
use crate::error::LockError;
use crate::key::LockKey;
use crate::lease::LeaseInfo;
use crate::monitor::Monitor;
use crate::options::{Defaults, Wait};
use crate::wait::Notifier;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A connection to the lock server plus this process's lock bookkeeping. Clone it freely:
/// clones share the connection, the pub/sub subscriber and the watchdog.
///
/// ```no_run
/// use lockrt::{Locker, LockOptions};
/// use std::time::Duration;
///
/// # async fn demo() -> Result<(), lockrt::LockError> {
/// let locker = Locker::connect("redis://127.0.0.1:6379/").await?;
/// let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Duration::from_secs(2));
/// let stock = locker.run("stock:1", opts, async {
///     // only one process at a time gets here for stock:1
///     42
/// }).await?;
/// # let _ = stock; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    pub(crate) inner: Arc<Inner>,
}

/// Settings a `Locker` keeps from its builder, already checked and capped.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) default_ttl: Duration,
    pub(crate) default_wait: Wait,
    pub(crate) default_max_hold: Option<Duration>,
    pub(crate) safety_margin: Duration,
    /// Longest time `shutdown` waits for one release.
    pub(crate) shutdown_bound: Duration,
    /// This locker's identity in owner records (`Locker::instance_id`).
    pub(crate) instance_id: uuid::Uuid,
    /// Local hand-offs allowed in a row (`LockerBuilder::local_handoff`).
    pub(crate) local_handoff: u32,
}

pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) backend: Arc<Backend>,
    pub(crate) settings: Settings,
    pub(crate) notifier: Notifier,
    /// One lease monitor per runtime that holds locks through this locker.
    monitors: Mutex<Vec<(tokio::runtime::Id, Arc<Monitor>)>>,
    held: AtomicUsize,
    pub(crate) waiting: AtomicUsize,
    /// Cancelled by `shutdown`: no new locks, waiters end.
    pub(crate) closing: CancellationToken,
    /// Background clean-ups of acquisitions that ended without a guard, which `shutdown`
    /// lets finish.
    pub(crate) cleanups: tokio_util::task::TaskTracker,
    /// Jobs of `spawn_every`, which `shutdown` ends and waits for. Apart from `cleanups`:
    /// a job's own section waits for those at shutdown, and must not wait for itself.
    pub(crate) jobs: tokio_util::task::TaskTracker,
    next_lease: AtomicU64,
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.inner.settings;
        f.debug_struct("Locker")
            .field("server", &self.inner.backend.addr())
            .field("prefix", &s.prefix)
            .field("default_ttl", &s.default_ttl)
            .field("default_wait", &s.default_wait)
            .field("held", &self.inner.held.load(Ordering::Relaxed))
            .finish()
    }
}

/// Counters for monitoring, from [`Locker::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockerStats {
    /// Locks held through this locker right now (including ones being released).
    pub held: usize,
    /// Keys this locker holds or waits for.
    pub keys: usize,
    /// Release channels with a waiter listening.
    pub listening: usize,
    /// Callers of this locker waiting for a busy lock right now.
    pub waiting: usize,
}

impl Locker {
    /// Connects to the Redis at `url` with default settings.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::connect("redis://127.0.0.1:6379/").await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Locker, LockError> {
        Locker::builder().url(url).build().await
    }

    pub(crate) fn from_parts(settings: Settings, backend: Backend) -> Locker {
        Locker::from_backend(settings, Arc::new(backend))
    }

    fn from_backend(settings: Settings, backend: Arc<Backend>) -> Locker {
        crate::metrics::describe();
        let notifier = Notifier::new(backend.subscriber());
        backend.attach(notifier.events());
        Locker {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                backend,
                settings,
                notifier,
                monitors: Mutex::new(Vec::new()),
                held: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                closing: CancellationToken::new(),
                cleanups: tokio_util::task::TaskTracker::new(),
                jobs: tokio_util::task::TaskTracker::new(),
                next_lease: AtomicU64::new(1),
            }),
        }
    }

    /// The key prefix.
    ///
    /// ```
    /// assert_eq!(lockrt::Locker::in_memory().prefix(), "lock:");
    /// ```
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The Redis key a lock named `key` lives at (`lock:stock:1`), for inspection with
    /// `redis-cli`. Braces and `%` in `key` are percent-encoded.
    ///
    /// ```
    /// let locker = lockrt::Locker::in_memory();
    /// assert_eq!(locker.redis_key("stock:1").unwrap(), "lock:stock:1");
    /// ```
    pub fn redis_key(&self, key: &str) -> Result<String, LockError> {
        Ok(LockKey::new(self.prefix(), key)?.lock().to_owned())
    }

    /// This locker's instance id: a random UUID (v4) made when it was built, recorded beside
    /// every lock it holds (see [`LockInfo`](crate::LockInfo)). Clones share it.
    ///
    /// ```
    /// let locker = lockrt::Locker::in_memory();
    /// assert_eq!(locker.instance_id(), locker.clone().instance_id());
    /// ```
    pub fn instance_id(&self) -> uuid::Uuid {
        self.inner.settings.instance_id
    }

    /// Current counters.
    ///
    /// ```
    /// assert_eq!(lockrt::Locker::in_memory().stats().held, 0);
    /// ```
    pub fn stats(&self) -> LockerStats {
        LockerStats {
            held: self.inner.held.load(Ordering::Relaxed),
            keys: self.inner.notifier.entries(),
            listening: self.inner.notifier.listening(),
            waiting: self.inner.waiting.load(Ordering::Acquire),
        }
    }

    /// Remaining lease of `key` in the in-memory backend (`None` when not held or when this
    /// locker talks to Redis, where `PTTL` answers the same question).
    #[doc(hidden)]
    pub fn memory_pttl(&self, key: &str) -> Option<Duration> {
        let key = LockKey::new(self.prefix(), key).ok()?;
        self.inner.backend.memory_pttl(&key)
    }

    /// Another locker on this in-memory lock space, as if in another process: its own
    /// waiting queue, tasks, reentrancy and [`instance_id`](Self::instance_id) (which its
    /// locks' owner records name), the same locks. `None` for a Redis locker (connect again
    /// instead). Useful to test code that runs on several instances.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let a = lockrt::Locker::in_memory();
    /// let b = a.in_memory_peer().expect("an in-memory locker");
    /// let held = a.acquire("job", lockrt::LockOptions::new()).await?;
    /// assert!(b.try_acquire("job", lockrt::LockOptions::new()).await?.is_none());
    /// held.release().await?;
    /// assert!(b.try_acquire("job", lockrt::LockOptions::new()).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn in_memory_peer(&self) -> Option<Locker> {
        let settings = Settings {
            instance_id: uuid::Uuid::new_v4(),
            ..self.inner.settings.clone()
        };
        let peer = self.inner.backend.memory_peer(settings.instance_id)?;
        Some(Locker::from_backend(settings, Arc::new(peer)))
    }

    /// The values options left unset take.
    pub(crate) fn defaults(&self) -> Defaults {
        let s = &self.inner.settings;
        Defaults {
            ttl: s.default_ttl,
            wait: s.default_wait,
            max_hold: s.default_max_hold,
        }
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    pub(crate) fn next_lease_id(&self) -> u64 {
        self.inner.next_lease.fetch_add(1, Ordering::Relaxed)
    }

    /// The lease monitor of the current runtime, started when there is none (or the one there
    /// was died with its runtime). `None` outside a runtime.
    pub(crate) fn monitor(&self) -> Option<Arc<Monitor>> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let id = rt.id();
        let mut monitors = self
            .inner
            .monitors
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if self.inner.closing.is_cancelled() {
            // Shut down: a lease added now would be renewed by nobody's choice, forever.
            return Some(Arc::new(Monitor::closed()));
        }
        monitors.retain(|(_, m)| m.alive());
        if let Some((_, m)) = monitors.iter().find(|(r, _)| *r == id) {
            return Some(m.clone());
        }
        let m = Arc::new(Monitor::spawn(self.inner.backend.clone(), &rt));
        monitors.push((id, m.clone()));
        Some(m)
    }

    /// Shuts the locker down: it takes no new locks (`acquire` and waiting calls end with
    /// [`LockError::ShutDown`]), the watchdog stops, and every lock held through it (and its
    /// clones) is released now, so another instance takes over within a hand-off, not a ttl.
    /// A lock held for less than its `min_hold` is kept (owner-checked) until then, as any
    /// release would. Sections holding a lock see it lost (`run` returns `Lost`); guards
    /// released later report success without another round trip, or `Lost` when shutdown
    /// found the lock no longer theirs. It returns once every release this locker started
    /// (also the background releases of guards and sections dropped before) and the clean-up
    /// of every acquisition it ended or that gave up (queue places, and any lock a release
    /// handed them meanwhile) have finished. Bounded: what does not answer within the connect
    /// and response timeouts is left to its lease, and logged as such. Call it before the
    /// process exits, e.g. after axum's graceful shutdown.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// locker.shutdown().await;
    /// assert!(guard.is_lost());
    /// assert!(matches!(locker.acquire("job", Default::default()).await, Err(lockrt::LockError::ShutDown)));
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) {
        let leases: Vec<_> = {
            let mut monitors = self
                .inner
                .monitors
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            // Under the monitors' lock: an acquire that completes from now on finds the
            // locker closing and no monitor to start (`monitor`), so nothing renews forever.
            self.inner.closing.cancel();
            monitors.drain(..).flat_map(|(_, m)| m.drain()).collect()
        };
        let bound = self.inner.settings.shutdown_bound;
        let released = leases.len();
        for lease in leases {
            // The lease stops protecting anything now, whatever the server says.
            lease.end_by_shutdown();
            // Tracked tasks, not futures of this call: a shutdown cut short (called from
            // inside a section whose lease this cancels) or a second caller still leaves them
            // to finish, and waits for them below.
            let locker = self.clone();
            self.inner
                .cleanups
                .spawn(async move { locker.release_for_shutdown(&lease, bound).await });
        }
        // Closed first: a tracker's waiters (a job's section settling at shutdown, below)
        // wait for it to be closed and empty.
        self.inner.cleanups.close();
        // Spawned jobs end with the closing (their runs see the lock lost, their claims are
        // released): first, since what they release is among the clean-ups below.
        self.inner.jobs.close();
        if tokio::time::timeout(bound, self.inner.jobs.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                pending = self.inner.jobs.len(),
                bound_ms = bound.as_millis() as u64,
                "shutdown gave up waiting for spawned jobs to end"
            );
        }
        // Releases of dropped guards and sections still under way, and acquisitions that gave
        // up (their queue place, or a lock a release handed them in that instant): all finish
        // before the process may exit.
        if !self.settle(bound).await {
            tracing::warn!(
                pending = self.inner.cleanups.len(),
                bound_ms = bound.as_millis() as u64,
                "shutdown gave up waiting for background releases; their leases will expire"
            );
        }
        tracing::debug!(released, "locker shut down");
    }

    /// Waits (at most `bound`) for the work `shutdown` waits for: its releases, releases under
    /// way and clean-ups of acquisitions. Whether all of it finished.
    pub(crate) async fn settle(&self, bound: Duration) -> bool {
        tokio::time::timeout(bound, self.inner.cleanups.wait())
            .await
            .is_ok()
    }

    /// One lease drained by `shutdown`: released (or kept until `min_hold`), bounded.
    async fn release_for_shutdown(&self, lease: &LeaseInfo, bound: Duration) {
        let res = tokio::time::timeout(
            bound,
            crate::lease::end_lease(&self.inner.backend, lease, lease.kept_until()),
        );
        match res.await {
            Ok(Ok(Released::Freed | Released::HandedOver)) => {
                lease.released.store(true, Ordering::Release);
                self.wake(&lease.key.tag);
            }
            // Not ours any more: a loss, which the guard's own release reports too.
            // Found not ours: lost before the shutdown, whatever it ended.
            Ok(Ok(Released::NotOwner)) => {
                crate::lease::declare_lost(lease, crate::error::LossCause::Expired)
            }
            Ok(Err(e)) => {
                crate::metrics::release_failed();
                tracing::warn!(key = ?&*lease.key.user, error = %e, "shutdown could not release the lock; its lease will expire")
            }
            Err(_) => {
                crate::metrics::release_failed();
                tracing::warn!(key = ?&*lease.key.user, bound_ms = bound.as_millis() as u64, "shutdown gave up waiting for a release; the lock's lease will expire")
            }
        }
        lease.leave_turn();
    }

    pub(crate) fn note_held(&self) {
        self.inner.held.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn note_released(&self) {
        self.inner.held.fetch_sub(1, Ordering::Relaxed);
    }

    /// Wakes this process's waiters for the lock with this tag (a local release: faster than
    /// the message).
    pub(crate) fn wake(&self, tag: &str) {
        self.inner.notifier.wake(tag);
    }
}
