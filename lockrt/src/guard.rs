//! [`LockGuard`]: proof of holding one lock, and the release on every exit path.
//!
//! Explicit [`LockGuard::release`] awaits the owner-checked delete. Dropping an unreleased
//! guard (panic, cancellation, early return) stops its lease at once and spawns the same
//! release onto the runtime; it never blocks in `Drop`. Without a runtime, the lease bounds
//! the lock. Release never deletes another owner's lock (the script checks the token).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::LockError;
use crate::backend::{Released, Token};
use crate::lease::LeaseInfo;
use crate::locker::Locker;
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
    pub(crate) locker: Locker,
    pub(crate) info: Arc<LeaseInfo>,
    pub(crate) fence: u64,
    pub(crate) entry: Option<EntryHandle>,
    pub(crate) done: bool,
}

impl LockGuard {
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

    /// Resolves when the lease is lost (taken over, expired, or not renewed in time).
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
        self.info.lost.cancelled()
    }

    /// Whether the lease has been lost already.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let guard = lockrt::Locker::in_memory().acquire("k", lockrt::LockOptions::new()).await?;
    /// assert!(!guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.info.lost.is_cancelled()
    }

    /// The lease length this guard holds and renews.
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
        self.locker.monitor_remove(self.info.id);
        let res = self
            .locker
            .release_token(&self.info.key, &self.info.token)
            .await;
        // Only now: if this future is dropped mid-release, `Drop` releases in the background.
        self.done = true;
        self.info.leave_turn();
        drop(self.entry.take());
        match res {
            Ok(Released::Freed | Released::HandedOver) => Ok(()),
            Ok(Released::NotOwner) => Err(LockError::Lost {
                key: self.info.key.user.to_string(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    pub(crate) fn token(&self) -> &Token {
        &self.info.token
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.locker.monitor_remove(self.info.id);
        let entry = self.entry.take();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime left to talk to Redis: the lease ends the lock within ttl.
            self.locker.note_released();
            self.info.leave_turn();
            return;
        };
        let locker = self.locker.clone();
        let info = self.info.clone();
        rt.spawn(async move {
            if let Err(e) = locker.release_token(&info.key, &info.token).await {
                tracing::warn!(key = %info.key.user, error = %e, "background release failed; the lease will expire");
            }
            info.leave_turn();
            drop(entry);
        });
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.info.key.user)
            .field("fence", &self.fence)
            .field("token", self.token())
            .field("lost", &self.is_lost())
            .finish()
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub(crate) locker_id: u64,
    pub(crate) key: Arc<str>,
    pub(crate) fence: u64,
}

impl HeldLock {
    /// The lock's key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lock's fencing token.
    pub fn fence(&self) -> u64 {
        self.fence
    }
}
