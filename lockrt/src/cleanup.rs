//! Compensation: what an acquisition (or a passed-on lease nobody took) may have left in the
//! backend is removed by token, in the background and bounded in time, and the token is barred
//! from then on.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::contract::{Released, Token};
use crate::key::LockKey;
use crate::locker::Locker;
use crate::retry::Backoff;

/// The compensation for requests sent on behalf of an acquisition that did not end in a
/// guard: a release by token (which also leaves the waiter queue), spawned when dropped armed.
pub(crate) struct Pending<'a> {
    pub(crate) locker: &'a Locker,
    pub(crate) key: &'a LockKey,
    pub(crate) token: Token,
    pub(crate) bound: Duration,
    pub(crate) armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            spawn_cleanup(self.locker, self.key.clone(), self.token, self.bound);
        }
    }
}

/// Removes whatever requests with `token` may have left, in the background, retrying
/// transient failures for at most `bound` (after that the lease has ended it anyway) and
/// stopping at once on a permanent error. The token is barred from then on (see
/// [`Backend::abandon`](crate::backend::Backend::abandon)).
pub(crate) fn spawn_cleanup(locker: &Locker, key: LockKey, token: Token, bound: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let tracker = locker.inner.cleanups.clone();
    let locker = locker.clone();
    tracker.spawn_on(async move {
        let mut backoff = Backoff::new(Duration::from_millis(20), Duration::from_millis(500), 64)
            .until(Instant::now() + bound);
        loop {
            match locker.backend().abandon(&key, &token).await {
                Ok(Released::Freed) => return locker.wake(&key.tag),
                Ok(_) => return,
                Err(e) if backoff.retry(&e).await => {}
                Err(e) => {
                    tracing::debug!(key = ?&*key.user, error = %e, "cleanup of an abandoned acquire failed; its lease ends it");
                    return;
                }
            }
        }
    }, &rt);
}
