//! Task context: which critical sections the current task is inside (for reentrancy and
//! [`current_lock`]) and the process-wide default locker.
//!
//! A reentrant section is bound to the lease of the section it re-enters, not just to the
//! moment it was first polled: its body is never polled after that section ended.

use std::sync::{Arc, RwLock};

use crate::error::LockError;
use crate::guard::HeldLock;
use crate::locker::Locker;

tokio::task_local! {
    static HELD: Vec<HeldLock>;
    /// A default for one task's future only (`testing::with_default`), before [`DEFAULT`].
    static SCOPED_DEFAULT: Locker;
}

static DEFAULT: RwLock<Option<Locker>> = RwLock::new(None);

/// The section of this task holding `key` on the locker with this id, if any.
pub(crate) fn held(locker_id: u64, key: &str) -> Option<HeldLock> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|h| h.locker_id == locker_id && &*h.key == key)
            .cloned()
    })
    .ok()
    .flatten()
}

/// Runs `fut` with `locks` on top of this task's stack of sections (the last is what
/// [`current_lock`] names).
pub(crate) async fn within<F: Future>(
    locks: impl IntoIterator<Item = HeldLock>,
    fut: F,
) -> F::Output {
    let mut stack = HELD.try_with(Vec::clone).unwrap_or_default();
    stack.extend(locks);
    HELD.scope(stack, fut).await
}

/// Installs the locker that `#[distributed_lock]` uses when no `locker = ...` is given.
/// Replaces any earlier default.
///
/// ```
/// lockrt::set_default(lockrt::Locker::in_memory());
/// ```
pub fn set_default(locker: Locker) {
    *DEFAULT.write().unwrap_or_else(|p| p.into_inner()) = Some(locker);
}

/// The locker installed with [`set_default`], or inside `lockrt::testing::with_default`
/// (feature `testing`) the one installed for that future.
///
/// ```
/// lockrt::set_default(lockrt::Locker::in_memory());
/// assert!(lockrt::default_locker().is_ok());
/// ```
pub fn default_locker() -> Result<Locker, LockError> {
    if let Ok(locker) = SCOPED_DEFAULT.try_with(Locker::clone) {
        return Ok(locker);
    }
    DEFAULT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(LockError::NoDefaultLocker)
}

/// Runs `fut` with `locker` as its [`default_locker`], ahead of the process-wide one.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) async fn with_default<F: Future>(locker: Locker, fut: F) -> F::Output {
    SCOPED_DEFAULT.scope(locker, fut).await
}

/// The innermost lock held by the current task's critical section (`run` or an annotated
/// fn), or `None` outside one. Tasks spawned inside a section don't see it: they are other
/// owners.
///
/// ```
/// assert!(lockrt::current_lock().is_none());
/// ```
pub fn current_lock() -> Option<HeldLock> {
    HELD.try_with(|held| held.last().cloned()).ok().flatten()
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync + 'static>() {}
    is::<Locker>();
    is::<crate::guard::LockGuard>();
    is::<LockError>();
    is::<Arc<str>>();
}
