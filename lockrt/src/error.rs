//! The crate's one error type, [`LockError`], and [`FromLockError`], the bridge that lets an
//! annotated function return lock failures through its own return type.
//!
//! Messages say what happened and what to do. Nothing here may carry a password: backend errors
//! are stored as already-scrubbed text plus the redacted server address.

use std::fmt;
use std::time::Duration;

/// Everything that can go wrong while taking, holding or releasing a lock.
///
/// ```
/// use lockrt::LockError;
/// use std::time::Duration;
///
/// let err = LockError::Timeout { key: "stock:1".into(), waited: Duration::from_secs(5) };
/// assert!(err.is_timeout());
/// assert_eq!(
///     err.to_string(),
///     "could not lock `stock:1`: `wait` elapsed after 5s while another owner held it; \
///      raise `wait` or shorten the critical section"
/// );
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock stayed held by another owner for the whole `wait`.
    #[error(
        "could not lock `{key}`: `wait` elapsed after {} while another owner held it; \
         raise `wait` or shorten the critical section",
        fmt_duration(*waited)
    )]
    Timeout {
        /// The lock's key, as given by the caller.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The lock stopped being held while the critical section ran: see [`LossCause`].
    #[error(
        "lock `{key}` was lost while held: {cause}; the critical section was stopped or must \
         not commit its effects"
    )]
    Lost {
        /// The lock's key, as given by the caller.
        key: String,
        /// Why: the lease ran out, an operator force-unlocked it, shutdown ended it, ...
        cause: LossCause,
    },
    /// Redis could not be reached or answered with an error.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The key is empty, too long, or otherwise unusable.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (truncated when very long).
        key: String,
        /// Why it was rejected.
        reason: String,
    },
    /// This task already holds the lock through a [`LockGuard`](crate::LockGuard) of the same
    /// locker: waiting for it would wait for itself.
    #[error(
        "lock `{key}` is already held by this task through a LockGuard; waiting for it would \
         never end: release the guard first, or hold the lock with `run` or \
         #[distributed_lock], which re-enter"
    )]
    HeldByThisTask {
        /// The lock's key, as given by the caller.
        key: String,
    },
    /// The key is in use as another kind of lock than this call asked for: a semaphore taken
    /// as a lock (or the other way round), a semaphore with another number of permits, or a
    /// write asked for inside this task's own read section (an upgrade, which would wait for
    /// itself). Refused at once, never waited for.
    #[error("lock `{key}` cannot be taken as asked: {reason}")]
    KindConflict {
        /// The lock's key, as given by the caller.
        key: String,
        /// What is in the way.
        reason: String,
    },
    /// The locker was shut down ([`Locker::shutdown`](crate::Locker::shutdown)): it takes no
    /// new locks, and waiting for one ended.
    #[error("the locker was shut down: it takes no new locks (the process is stopping)")]
    ShutDown,
    /// An annotated function without `locker = ...` ran before [`set_default`](crate::set_default).
    #[error(
        "no default locker installed: call `lockrt::set_default(locker)` at startup, \
         or pass `locker = ...` to #[distributed_lock]"
    )]
    NoDefaultLocker,
    /// The locker was configured with invalid settings.
    #[error("invalid locker configuration: {0}")]
    Config(String),
}

impl LockError {
    /// `true` for [`LockError::Timeout`]: the lock was busy for the whole wait.
    ///
    /// ```
    /// # use lockrt::LockError;
    /// assert!(!LockError::NoDefaultLocker.is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        matches!(self, LockError::Timeout { .. })
    }

    /// `true` for [`LockError::Lost`]: the lease was lost while the section ran.
    ///
    /// ```
    /// # use lockrt::LockError;
    /// use lockrt::LossCause;
    /// assert!(LockError::Lost { key: "k".into(), cause: LossCause::Expired }.is_lost());
    /// ```
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }

    /// `true` for [`LockError::Backend`]: Redis was unreachable or failed.
    ///
    /// ```
    /// # use lockrt::LockError;
    /// assert!(!LockError::NoDefaultLocker.is_backend());
    /// ```
    pub fn is_backend(&self) -> bool {
        matches!(self, LockError::Backend(_))
    }
}

/// Why a held lock was lost ([`LockError::Lost`]), each with what to do about it.
///
/// ```
/// use lockrt::{LockError, LossCause};
///
/// let e = LockError::Lost { key: "job".into(), cause: LossCause::ShutDown };
/// assert!(e.to_string().contains("shut down"));
/// assert!(!e.to_string().contains("reachability"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LossCause {
    /// The lease expired or another owner holds the lock (a renewal or the release found it
    /// so), e.g. after the process stalled past `ttl` or the server lost its data.
    #[error(
        "the lease expired or another owner took it; check Redis reachability, process \
         stalls and `ttl`"
    )]
    Expired,
    /// No renewal succeeded before the lease's deadline: the server did not answer, or this
    /// process stalled (SIGSTOP, a blocked runtime thread, swapping) past it.
    #[error(
        "no renewal succeeded before the lease ran out; check Redis reachability and pauses \
         of this process (a blocked runtime thread, SIGSTOP)"
    )]
    Unreachable,
    /// Held for `max_hold`: the watchdog stopped renewing, as asked.
    #[error("held for its `max_hold`; raise `max_hold` or shorten the critical section")]
    MaxHold,
    /// An operator ended it (`Locker::force_unlock`, `lockctl unlock --force`).
    #[error("an operator force-unlocked it (Locker::force_unlock or lockctl unlock --force)")]
    ForceUnlocked,
    /// [`Locker::shutdown`](crate::Locker::shutdown) ended it: the process is stopping.
    #[error("the locker was shut down (the process is stopping)")]
    ShutDown,
    /// The section started at once on a lease passed on in the process (local hand-off), and
    /// the owner check that went out with the hand-off found the lock no longer the lease's
    /// (it expired, was deleted or force-unlocked, or the server lost it): another holder may
    /// have run beside this section.
    #[error(
        "the check of a local hand-off found the lock gone (expired, deleted, force-unlocked or \
         lost by the server) while sections ran on the lease"
    )]
    HandOffCheck,
}

impl LossCause {
    /// A short name for logs and metric labels: `expired`, `unreachable`, `max_hold`,
    /// `force_unlocked`, `shut_down`, `hand_off_check`.
    ///
    /// ```
    /// assert_eq!(lockrt::LossCause::MaxHold.as_str(), "max_hold");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            LossCause::Expired => "expired",
            LossCause::Unreachable => "unreachable",
            LossCause::MaxHold => "max_hold",
            LossCause::ForceUnlocked => "force_unlocked",
            LossCause::ShutDown => "shut_down",
            LossCause::HandOffCheck => "hand_off_check",
        }
    }
}

/// A failure talking to the lock server. Carries the server's address with credentials removed,
/// and the failure as text (scrubbed of credentials too).
///
/// ```
/// use lockrt::BackendError;
/// let e = BackendError::new("127.0.0.1:6379", "connection refused");
/// assert_eq!(e.addr(), "127.0.0.1:6379");
/// assert!(e.to_string().contains("127.0.0.1:6379"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct BackendError {
    addr: String,
    message: String,
    hint: Option<String>,
    transient: bool,
    /// A cluster slot moving or failing over (`TRYAGAIN`, redirections): it ends by itself.
    migrating: bool,
    /// No connection could be made (refused, timed out, no Sentinel answered): nothing was
    /// sent, and retrying at once will most likely fail the same way.
    unreachable: bool,
}

impl BackendError {
    /// An error for the server at `addr` (already redacted) with a message.
    pub fn new(addr: impl Into<String>, message: impl Into<String>) -> Self {
        BackendError {
            addr: addr.into(),
            message: message.into(),
            hint: None,
            transient: true,
            migrating: false,
            unreachable: false,
        }
    }

    /// What to do about it (the default says to check that Redis runs and is reachable).
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub(crate) fn permanent(mut self) -> Self {
        self.transient = false;
        self
    }

    pub(crate) fn migrating(mut self) -> Self {
        self.migrating = true;
        self
    }

    pub(crate) fn unreachable(mut self) -> Self {
        self.unreachable = true;
        self
    }

    /// Whether no connection to the server could be made (it refused, or the connect timed
    /// out, or no Sentinel answered): the last try was never sent (an
    /// earlier one of the same call may have landed; lockrt cleans up after it). A service
    /// answers this with 503 at once; the outage is logged once per interval, not per call.
    ///
    /// ```
    /// # async fn demo(locker: lockrt::Locker) {
    /// match locker.acquire("k", lockrt::LockOptions::new()).await {
    ///     Err(lockrt::LockError::Backend(e)) if e.is_unreachable() => { /* 503 */ }
    ///     _ => {}
    /// }
    /// # }
    /// ```
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }

    /// A cluster slot in migration or failover refused the request: retry until it lands
    /// (or the lease ends), the state ends by itself.
    pub(crate) fn is_migrating(&self) -> bool {
        self.migrating && self.transient
    }

    /// The server's address, without credentials.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// What went wrong, without credentials.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Whether retrying the same request may succeed (I/O failures, timeouts, failover).
    pub fn is_transient(&self) -> bool {
        self.transient
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hint = self
            .hint
            .as_deref()
            .unwrap_or("check that Redis is running and reachable");
        write!(
            f,
            "lock server at {} failed: {}; {hint}",
            self.addr, self.message
        )
    }
}

impl fmt::Debug for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendError")
            .field("addr", &self.addr)
            .field("message", &self.message)
            .field("hint", &self.hint)
            .field("transient", &self.transient)
            .field("unreachable", &self.unreachable)
            .finish()
    }
}

impl std::error::Error for BackendError {}

/// Renders a `wait` for logs: `0s`, `1.5s`, `forever`.
pub(crate) fn fmt_wait(w: crate::options::Wait) -> String {
    match w {
        crate::options::Wait::For(d) if d.is_zero() => "0s".to_owned(),
        crate::options::Wait::For(d) => fmt_duration(d),
        crate::options::Wait::Forever => "forever".to_owned(),
    }
}

/// Renders `1.5s`, `300ms`, `2m` for messages.
pub(crate) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

/// How an annotated function turns a lock failure into its own return value.
///
/// Implemented for every `Result<T, E>` whose `E: From<LockError>`. Implement it for your own
/// return type (an axum response, say) to decide what a busy lock looks like to your callers.
///
/// ```
/// use lockrt::{FromLockError, LockError};
///
/// enum Reply { Done(u32), Busy }
///
/// impl FromLockError for Reply {
///     fn from_lock_error(err: LockError) -> Self {
///         let _ = err;
///         Reply::Busy
///     }
/// }
///
/// let r: Result<u32, LockError> = FromLockError::from_lock_error(LockError::NoDefaultLocker);
/// assert!(r.is_err());
/// assert!(matches!(Reply::from_lock_error(LockError::NoDefaultLocker), Reply::Busy));
/// ```
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` fn returns `{Self}`, which cannot carry a lock failure",
    label = "lock failures (timeout, lost, Redis down) must be returned through this type",
    note = "return `Result<{Self}, E>` where `E: From<lockrt::LockError>`, e.g. `Result<{Self}, lockrt::LockError>`",
    note = "an axum handler (lockrt's `axum` feature) may also return `Result<{Self}, axum::response::Response>`, `Result<{Self}, axum::http::StatusCode>` or `impl IntoResponse`",
    note = "or implement `lockrt::FromLockError` for a type of your own crate and return that"
)]
pub trait FromLockError {
    /// Builds the value returned when the lock could not be taken or was lost.
    fn from_lock_error(err: LockError) -> Self;
}

impl<T, E: From<LockError>> FromLockError for Result<T, E> {
    fn from_lock_error(err: LockError) -> Self {
        Err(E::from(err))
    }
}
