//! [`LockGuard`]: proof of holding one lock, and its release on every exit path.
//!
//! Release has one path, [`Release`], used by [`LockGuard::release`] (awaited) and by `Drop`
//! (spawned onto the runtime; `Drop` never blocks). A release cut short by cancellation
//! finishes in the background the same way. Without a runtime, the lease bounds the lock.
//! Release never deletes another owner's lock (the script checks the token), and once it
//! starts, the lease counts as ended for everything that relied on it (reentrant sections).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::backend::contract::Released;
use crate::error::{BackendError, LockError, LossCause};
use crate::lease::{LeaseInfo, end_lease};
use crate::locker::Locker;
use crate::monitor::Monitor;
use crate::wait::EntryHandle;

/// A held lock. Dropping it releases the lock in the background; [`release`](Self::release)
/// does it in the foreground and reports the outcome.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockrt::LockError> {
/// use lockrt::{Locker, LockOptions};
/// let locker = Locker::connect("redis://127.0.0.1:6379/").await?;
/// let guard = locker.acquire("stock:1", LockOptions::new()).await?;
/// println!("holding {} with fence {}", guard.key(), guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    info: Arc<LeaseInfo>,
    fence: u64,
    release: Release,
}

impl LockGuard {
    pub(crate) fn new(
        locker: Locker,
        monitor: Arc<Monitor>,
        info: Arc<LeaseInfo>,
        entry: EntryHandle,
    ) -> LockGuard {
        let fence = info.fence();
        LockGuard {
            release: Release {
                locker,
                monitor,
                info: info.clone(),
                entry: Some(entry),
                late: false,
                done: false,
                background: false,
            },
            info,
            fence,
        }
    }

    /// The key as given to `acquire` (without the prefix).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("stock:1", lockrt::LockOptions::new()).await?;
    /// assert_eq!(guard.key(), "stock:1");
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        &self.info.key.user
    }

    /// The fencing token: strictly greater than the fence of every earlier holder of this key.
    /// Pass it to the resource you protect and have it reject smaller ones.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let first = locker.acquire("k", lockrt::LockOptions::new()).await?.fence();
    /// let second = locker.acquire("k", lockrt::LockOptions::new()).await?.fence();
    /// assert!(second > first);
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Resolves when the lease is lost (taken over, expired, not renewed in time, or held
    /// for `max_hold`). It also resolves when the local deadline passes while the monitor
    /// task could not run.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("k", lockrt::LockOptions::new()).await?;
    /// tokio::select! {
    ///     () = guard.lost() => eprintln!("lost the lock, stop writing"),
    ///     () = tokio::task::yield_now() => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        self.info.lost()
    }

    /// Whether the lease has been lost already. Also `true` once the local deadline has
    /// passed without a renewal, even if the watchdog has not run yet (a blocked thread):
    /// this never says "held" when Redis may have expired the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let guard = lockrt::Locker::in_memory().acquire("k", lockrt::LockOptions::new()).await?;
    /// assert!(!guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.info.is_lost()
    }

    /// The lease length this guard holds and renews.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let opts = lockrt::LockOptions::new().ttl(Duration::from_secs(5));
    /// let guard = lockrt::Locker::in_memory().acquire("k", opts).await?;
    /// assert_eq!(guard.ttl(), Duration::from_secs(5));
    /// # Ok(()) }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.info.ttl
    }

    /// Releases the lock now. `Err(Lost)` if it was no longer ours (it expired or was taken
    /// over), `Err(Backend)` if Redis could not be reached (the lease then ends by itself).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("k", lockrt::LockOptions::new()).await?;
    /// guard.release().await?;
    /// assert!(locker.try_acquire("k", lockrt::LockOptions::new()).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<(), LockError> {
        match self.release.run().await {
            // Ran out before the release began: the guard could not vouch for the lock up to
            // its end (`is_lost()` said so), whatever the server then found.
            Ok(Released::Freed | Released::HandedOver) if self.release.late => {
                Err(self.info.lost_error())
            }
            Ok(Released::Freed | Released::HandedOver) => Ok(()),
            Ok(Released::NotOwner) => Err(self.info.lost_error()),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases and reports what the server said (for `run`, which tells a lost lock apart).
    pub(crate) async fn release_outcome(mut self) -> Result<Released, BackendError> {
        self.release.run().await
    }

    pub(crate) fn lease(&self) -> &Arc<LeaseInfo> {
        &self.info
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.info.key.user)
            .field("fence", &self.fence)
            .field("token", &self.info.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

/// Everything a release needs, and the one way it happens. Dropped before it completed
/// (the guard dropped, or `release()` cancelled), it finishes in the background.
struct Release {
    locker: Locker,
    monitor: Arc<Monitor>,
    info: Arc<LeaseInfo>,
    entry: Option<EntryHandle>,
    /// The lease had run out (locally) when the release began: a loss, whatever the release
    /// finds.
    late: bool,
    done: bool,
    /// Already the background copy: never spawn another.
    background: bool,
}

impl Release {
    async fn run(&mut self) -> Result<Released, BackendError> {
        // `shutdown` waits for a release under way, also one awaited in the foreground.
        let _under_way = self.locker.inner.cleanups.token();
        // Ran out before the release began: the holder could not vouch for the lock at its
        // end (the monitor may not have looked yet), which is a loss too. Not a lease that
        // shutdown released: that ended in time.
        let past = match self
            .info
            .released
            .load(std::sync::atomic::Ordering::Acquire)
        {
            true => None,
            false => self.info.past_deadline(tokio::time::Instant::now()),
        };
        self.late = past.is_some();
        self.monitor.remove(self.info.id);
        let entry = self.entry.take();
        // `pass_on` declines a lock to be kept past the release (`kept_until`).
        let passed = entry
            .as_ref()
            .and_then(|e| crate::handoff::pass_on(&self.locker, &self.info, e));
        let res = match (entry, passed) {
            (Some(entry), Some((to, check))) => {
                // Gives up the turn: the longest waiter of this locker takes the lease (and
                // runs at once, on this thread when this task yields), then the check
                // covering this holder's end goes out.
                self.finish();
                crate::handoff::reclaim(&self.locker, &entry);
                if check.is_some() {
                    tokio::task::yield_now().await;
                }
                drop(check);
                crate::handoff::confirm(&self.locker, &self.info, &entry, to).await
            }
            (entry, _) => {
                self.entry = entry;
                end_lease(self.locker.backend(), &self.info, self.info.kept_until()).await
            }
        };
        // A section started on a passed-on lease that no check covered, whose own release
        // could not tell either: nothing vouches for it (another may have held the lock).
        let res = match (&res, self.info.passed_chain()) {
            (Err(_), Some(chain))
                if self.info.local > 0 && !chain.covers_start(self.info.local) =>
            {
                crate::lease::declare_lost(&self.info, LossCause::HandOffCheck);
                Ok(Released::NotOwner)
            }
            _ => res,
        };
        if matches!(res, Ok(Released::Freed)) {
            if let Some(chain) = self.info.passed_chain() {
                chain.proven(self.info.local);
            }
            self.locker.wake(&self.info.key.tag);
        }
        self.account(&res, past);
        self.finish();
        res
    }

    /// Counts and logs what the release found: a loss (once, with its cause), a release, a
    /// failure.
    fn account(&self, res: &Result<Released, BackendError>, past: Option<LossCause>) {
        if let Some(cause) = past {
            crate::lease::declare_lost(&self.info, cause);
        }
        match res {
            Ok(Released::Freed | Released::HandedOver) => {
                let held = self.info.acquired_at.elapsed();
                crate::metrics::released(held, self.info.key.kind, self.info.site)
            }
            // The cause found before (a forced unlock, the deadline), if any, stands.
            Ok(Released::NotOwner) => {
                let cause = match self.info.loss_cause() {
                    LossCause::ShutDown => LossCause::Expired,
                    cause => cause,
                };
                crate::lease::declare_lost(&self.info, cause)
            }
            Err(_) => crate::metrics::release_failed(),
        }
        let outcome = match res {
            Ok(Released::Freed) => "freed",
            Ok(Released::HandedOver) => "handed over",
            Ok(Released::NotOwner) => "not ours any more",
            Err(_) => "failed",
        };
        tracing::debug!(key = ?&*self.info.key.user, outcome, "release");
    }

    /// Local bookkeeping once the release is over (or can't happen): the lease ends for
    /// everything relying on it, the local turn and the key's entry go.
    fn finish(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        self.monitor.remove(self.info.id);
        self.info.lost.cancel();
        self.info.leave_turn();
        drop(self.entry.take());
        self.locker.note_released();
        crate::metrics::ended(self.info.key.kind);
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.monitor.remove(self.info.id);
        let rt = tokio::runtime::Handle::try_current();
        let (Ok(rt), false) = (rt, self.background) else {
            // No runtime left to talk to Redis: the lease ends the lock within ttl.
            self.finish();
            return;
        };
        let mut rest = Release {
            locker: self.locker.clone(),
            monitor: self.monitor.clone(),
            info: self.info.clone(),
            entry: self.entry.take(),
            late: false,
            done: false,
            background: true,
        };
        self.done = true;
        // The lease stops protecting anything now, not when the background release ends.
        self.info.lost.cancel();
        // Tracked, so `Locker::shutdown` waits for it before the process may exit.
        let tracker = self.locker.inner.cleanups.clone();
        tracker.spawn_on(
            async move {
                if let Err(e) = rest.run().await {
                    tracing::warn!(key = ?&*rest.info.key.user, error = %e, "background release failed; the lease will expire");
                }
            },
            &rt,
        );
    }
}

/// The lock held by the current critical section, from [`current_lock`](crate::current_lock).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::in_memory();
/// locker.run("job", lockrt::LockOptions::new(), async {
///     let held = lockrt::current_lock().expect("inside a critical section");
///     assert_eq!(held.key(), "job");
///     assert!(held.fence() > 0);
/// }).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct HeldLock {
    pub(crate) locker_id: u64,
    pub(crate) key: Arc<str>,
    pub(crate) fence: u64,
    /// The section's lease: a reentrant section ends with it.
    pub(crate) lease: Arc<LeaseInfo>,
}

impl HeldLock {
    /// The lock's key.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let key = locker.run("job", Default::default(), async {
    ///     lockrt::current_lock().map(|h| h.key().to_owned())
    /// }).await?;
    /// assert_eq!(key.as_deref(), Some("job"));
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock's fencing token.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let fence = locker.run("job", Default::default(), async {
    ///     lockrt::current_lock().map(|h| h.fence())
    /// }).await?;
    /// assert!(fence.is_some_and(|f| f > 0));
    /// # Ok(()) }
    /// ```
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// What the section holds: the lock (or write lock), a read share, or a permit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let kind = locker.run("catalogue", lockrt::LockOptions::new().read(), async {
    ///     lockrt::current_lock().map(|h| h.kind())
    /// }).await?;
    /// assert_eq!(kind, Some(lockrt::LockKind::Read));
    /// # Ok(()) }
    /// ```
    pub fn kind(&self) -> crate::options::LockKind {
        self.lease.key.kind
    }
}

impl PartialEq for HeldLock {
    fn eq(&self, other: &Self) -> bool {
        self.locker_id == other.locker_id && self.key == other.key && self.fence == other.fence
    }
}

impl Eq for HeldLock {}

impl fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HeldLock")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .finish()
    }
}
