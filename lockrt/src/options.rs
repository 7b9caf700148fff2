//! Per-call settings: [`LockOptions`] (ttl, wait, watchdog, what to do on loss). Unset fields
//! fall back to the [`Locker`](crate::Locker)'s defaults when the lock is taken.

use std::time::Duration;

/// Shortest lease: the watchdog could not renew a shorter one in time.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(30);
/// Longest lease, fence retention and timeout: what the attribute accepts (366 days).
pub(crate) const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// How long to wait for a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Wait {
    /// Give up after this long. `Duration::ZERO` makes exactly one attempt.
    For(Duration),
    /// No limit: wait until the lock is free.
    Forever,
}

/// What happens to a critical section whose lease is lost while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the body future at once and return [`LockError::Lost`](crate::LockError::Lost).
    #[default]
    Cancel,
    /// Let the body run to completion; the loss is logged at WARN.
    Continue,
}

/// What kind of lock a call takes on its key.
///
/// ```
/// use lockrt::{LockKind, LockOptions};
/// assert_eq!(LockOptions::new().get_kind(), LockKind::Exclusive);
/// assert_eq!(LockOptions::new().read().get_kind(), LockKind::Read);
/// assert_eq!(LockOptions::new().permits(3).get_kind(), LockKind::Permits(3));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time: the plain lock, and the write side of a read-write lock (same
    /// key, same data: exclusive holders and writers exclude each other and every reader).
    #[default]
    Exclusive,
    /// Shared with other readers of the key; excludes writers. A queued writer stops later
    /// readers from entering, so writers never starve.
    Read,
    /// A semaphore: at most this many holders of the key at once, each with its own leased
    /// permit. A key is either a lock or a semaphore.
    Permits(u32),
}

impl LockKind {
    /// Whether holders of this kind share the key (readers, permits).
    pub(crate) const fn is_shared(self) -> bool {
        !matches!(self, LockKind::Exclusive)
    }

    /// As logs, spans and metrics name it: `exclusive`, `read`, `permits`.
    pub const fn as_str(self) -> &'static str {
        match self {
            LockKind::Exclusive => "exclusive",
            LockKind::Read => "read",
            LockKind::Permits(_) => "permits",
        }
    }
}

impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockKind::Exclusive => f.write_str("an exclusive (write) lock"),
            LockKind::Read => f.write_str("a read lock"),
            LockKind::Permits(n) => write!(f, "a semaphore of {n} permits"),
        }
    }
}

/// Options for one acquisition.
///
/// ```
/// use lockrt::{LockOptions, OnLost};
/// use std::time::Duration;
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_millis(500))
///     .on_lost(OnLost::Cancel);
/// assert_eq!(opts.get_ttl(), Some(Duration::from_secs(10)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Wait>,
    pub(crate) watchdog: bool,
    pub(crate) on_lost: OnLost,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    /// A busy lock is the expected outcome (a scheduled job's claim on the instances that
    /// don't run the tick): an elapsed wait logs at DEBUG.
    pub(crate) busy_expected: bool,
    pub(crate) retry_unreachable: bool,
    /// The lock site's name for metrics (`site`).
    pub(crate) site: Option<&'static str>,
    pub(crate) kind: LockKind,
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl LockOptions {
    /// Locker defaults for ttl and wait, watchdog on, cancel on loss.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new();
    /// assert!(opts.get_watchdog());
    /// ```
    pub const fn new() -> Self {
        LockOptions {
            ttl: None,
            wait: None,
            watchdog: true,
            on_lost: OnLost::Cancel,
            max_hold: None,
            min_hold: None,
            busy_expected: false,
            retry_unreachable: false,
            site: None,
            kind: LockKind::Exclusive,
        }
    }

    /// The read side of the key's read-write lock: shared with other readers, excluded by a
    /// writer (an exclusive holder). Readers queue behind a writer that waits, so a stream of
    /// readers never holds a writer back more than one generation of readers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let read = lockrt::LockOptions::new().read();
    /// let a = locker.acquire("catalogue", read).await?;
    /// let b = locker.acquire("catalogue", read).await?; // another reader: shared
    /// let write = lockrt::LockOptions::new().write().wait(std::time::Duration::ZERO);
    /// assert!(locker.try_acquire("catalogue", write).await?.is_none());
    /// # drop((a, b)); Ok(()) }
    /// ```
    pub const fn read(mut self) -> Self {
        self.kind = LockKind::Read;
        self
    }

    /// The write side of the key's read-write lock, which is the exclusive lock (the
    /// default): one holder, no reader meanwhile.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().read().write();
    /// assert_eq!(opts.get_kind(), lockrt::LockKind::Exclusive);
    /// ```
    pub const fn write(mut self) -> Self {
        self.kind = LockKind::Exclusive;
        self
    }

    /// A semaphore on the key: at most `n` holders at once across all processes, each with its
    /// own leased permit (renewed by the watchdog, fenced, returned when its holder's lease
    /// ends). Every caller of one key must name the same `n`: a different `n` is refused with
    /// [`LockError::KindConflict`](crate::LockError::KindConflict) while the semaphore is in
    /// use, never a silent change of the limit. `0` is refused when the lock is taken.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let slots = lockrt::LockOptions::new().permits(2);
    /// let a = locker.acquire("export:acme", slots).await?;
    /// let b = locker.acquire("export:acme", slots).await?;
    /// assert!(locker.try_acquire("export:acme", slots).await?.is_none()); // both permits taken
    /// # drop((a, b)); Ok(()) }
    /// ```
    pub const fn permits(mut self, n: u32) -> Self {
        self.kind = LockKind::Permits(n);
        self
    }

    /// The kind of lock these options take.
    pub const fn get_kind(&self) -> LockKind {
        self.kind
    }

    /// Lease length. With the watchdog on, the lease is renewed about every `ttl / 3`.
    /// Values below 30 ms are raised to 30 ms when the lock is taken.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = lockrt::LockOptions::new().ttl(Duration::from_secs(5));
    /// # assert_eq!(opts.get_ttl(), Some(Duration::from_secs(5)));
    /// ```
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Longest time to wait for a busy lock; `Duration::ZERO` = one attempt.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = lockrt::LockOptions::new().wait(Duration::ZERO);
    /// # assert_eq!(opts.get_wait(), Some(lockrt::Wait::For(Duration::ZERO)));
    /// ```
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(Wait::For(wait));
        self
    }

    /// Wait without limit.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().wait_forever();
    /// # assert_eq!(opts.get_wait(), Some(lockrt::Wait::Forever));
    /// ```
    pub const fn wait_forever(mut self) -> Self {
        self.wait = Some(Wait::Forever);
        self
    }

    /// `true` (default): renew the lease while held. `false`: a fixed lease of `ttl`, after
    /// which the lock counts as lost.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().watchdog(false);
    /// # assert!(!opts.get_watchdog());
    /// ```
    pub const fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// What [`Locker::run`](crate::Locker::run) does when the lease is lost.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().on_lost(lockrt::OnLost::Continue);
    /// # assert_eq!(opts.get_on_lost(), lockrt::OnLost::Continue);
    /// ```
    pub const fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Longest time the lock may be held, counted from when this caller got it (when the
    /// reply, or the message of a release that handed it over, arrived): after it the watchdog
    /// stops renewing and the holder is told it lost the lock
    /// ([`LockGuard::lost`](crate::LockGuard::lost) resolves, `run` drops the body and returns
    /// [`LockError::Lost`](crate::LockError::Lost)). Default: the locker's (none unless set on
    /// the builder), so a forgotten guard or a hung body cannot keep a lock forever when one
    /// is set.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = lockrt::LockOptions::new().max_hold(Duration::from_secs(600));
    /// # assert_eq!(opts.get_max_hold(), Some(Duration::from_secs(600)));
    /// ```
    pub const fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Shortest time the lock stays taken: a release sooner than `min_hold` after the lock was
    /// acquired keeps it (owner-checked) until then, so a job that runs "once per tick" on
    /// several instances runs once per tick, not once per instance (ShedLock's
    /// `lockAtLeastFor`). The holder's part ends at the release as usual.
    ///
    /// ```
    /// # use std::time::Duration;
    /// let opts = lockrt::LockOptions::new().wait(Duration::ZERO).min_hold(Duration::from_secs(1));
    /// # assert_eq!(opts.get_min_hold(), Some(Duration::from_secs(1)));
    /// ```
    pub const fn min_hold(mut self, min_hold: Duration) -> Self {
        self.min_hold = Some(min_hold);
        self
    }

    /// Whether an unreachable lock server (no connection could be made: refused, timed out)
    /// is tried again until `wait` ends, instead of failing the call at once with
    /// [`LockError::Backend`](crate::LockError::Backend). Off by default: a request handler
    /// answers 503 at once rather than holding its caller for the whole `wait` of an outage.
    /// On for callers that would rather wait for the server to come back: `lockrt::every`
    /// claims its ticks this way, so a Redis back within the tick still runs it.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().retry_unreachable(true);
    /// # assert!(opts.get_retry_unreachable());
    /// ```
    pub const fn retry_unreachable(mut self, on: bool) -> Self {
        self.retry_unreachable = on;
        self
    }

    /// The name of this lock site in metrics: the label `site` of the acquisition, timeout,
    /// failure, loss, wait and hold metrics (feature `metrics`), so that the timeouts of one
    /// endpoint and the waits of another don't look alike. A name of the call site, from a
    /// fixed set (`&'static str`), never the rendered key: label values must stay bounded.
    /// `#[distributed_lock]` sets it to the annotated fn's path (`billing::refund`);
    /// `lockrt::every` to the job's name. Unset: `unnamed`.
    ///
    /// ```
    /// let opts = lockrt::LockOptions::new().site("refund");
    /// # assert_eq!(opts.get_site(), Some("refund"));
    /// ```
    pub const fn site(mut self, name: &'static str) -> Self {
        self.site = Some(name);
        self
    }

    /// The lock site's name set here, if any.
    pub const fn get_site(&self) -> Option<&'static str> {
        self.site
    }

    /// Whether an unreachable server is retried within `wait`.
    pub const fn get_retry_unreachable(&self) -> bool {
        self.retry_unreachable
    }

    /// The minimum hold set here, if any.
    pub const fn get_min_hold(&self) -> Option<Duration> {
        self.min_hold
    }

    /// The holding bound set here, if any.
    pub const fn get_max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The ttl set here, if any.
    pub const fn get_ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The wait set here, if any.
    pub const fn get_wait(&self) -> Option<Wait> {
        self.wait
    }

    /// Whether the watchdog is on.
    pub const fn get_watchdog(&self) -> bool {
        self.watchdog
    }

    /// The loss policy.
    pub const fn get_on_lost(&self) -> OnLost {
        self.on_lost
    }
}
/// A locker's values for what [`LockOptions`] leaves unset.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Defaults {
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) max_hold: Option<Duration>,
}

/// [`LockOptions`] resolved against a locker's [`Defaults`]: what one acquisition uses.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// The lease, within [`MIN_TTL`]..=[`MAX_TTL`].
    pub(crate) ttl: Duration,
    pub(crate) wait: Wait,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) min_hold: Option<Duration>,
    pub(crate) busy_expected: bool,
    pub(crate) retry_unreachable: bool,
    /// The metrics label `site` (see [`LockOptions::site`]).
    pub(crate) site: &'static str,
    pub(crate) kind: LockKind,
}

/// The `site` label of a lock whose options name none.
pub(crate) const UNNAMED_SITE: &str = "unnamed";

impl LockOptions {
    /// The one place where options meet a locker's defaults.
    pub(crate) fn resolve(&self, defaults: &Defaults) -> Terms {
        Terms {
            ttl: self.ttl.unwrap_or(defaults.ttl).clamp(MIN_TTL, MAX_TTL),
            wait: self.wait.unwrap_or(defaults.wait),
            watchdog: self.watchdog,
            max_hold: self.max_hold.or(defaults.max_hold),
            min_hold: self.min_hold,
            busy_expected: self.busy_expected,
            retry_unreachable: self.retry_unreachable,
            site: self.site.unwrap_or(UNNAMED_SITE),
            kind: self.kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_resolve_against_defaults_and_leases_stay_in_bounds() {
        let defaults = Defaults {
            ttl: Duration::from_secs(30),
            wait: Wait::For(Duration::from_secs(10)),
            max_hold: Some(Duration::from_secs(60)),
        };
        let t = LockOptions::new().resolve(&defaults);
        assert_eq!(
            (t.ttl, t.wait, t.max_hold),
            (defaults.ttl, defaults.wait, defaults.max_hold)
        );
        assert!(t.watchdog && t.min_hold.is_none());
        let opts = LockOptions::new()
            .ttl(Duration::from_millis(1))
            .wait_forever()
            .max_hold(Duration::from_secs(5));
        let t = opts.resolve(&defaults);
        assert_eq!(t.ttl, MIN_TTL, "a lease too short to renew is raised");
        assert_eq!(
            (t.wait, t.max_hold),
            (Wait::Forever, Some(Duration::from_secs(5)))
        );
        let long = LockOptions::new().ttl(Duration::from_secs(400 * 24 * 3600));
        assert_eq!(long.resolve(&defaults).ttl, MAX_TTL);
    }
}
