//! Who holds what: the inspection API ([`Locker::locks`], [`Locker::lock_info`],
//! [`Locker::force_unlock`]) that `lockctl` uses, read from each lock's owner record (see
//! `owner.rs`).

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::contract::holder_fence;
use crate::error::LockError;
use crate::key::LockKey;
use crate::locker::Locker;
use crate::options::LockKind;
use crate::owner::Holder;

/// How long a forced unlock is retried while the lock's cluster slot migrates.
const FORCE_WHILE_MIGRATING: Duration = Duration::from_secs(10);

/// At most this many locks from one [`Locker::locks`] call.
pub const MAX_LISTED: usize = 10_000;

/// One held lock, as [`Locker::lock_info`] and [`Locker::locks`] report it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::builder().service_name("billing");
/// let locker = lockrt::Locker::in_memory_with(locker);
/// let guard = locker.acquire("invoice:7", lockrt::LockOptions::new()).await?;
/// let info = locker.lock_info("invoice:7").await?.expect("held");
/// assert_eq!(info.holder.as_ref().unwrap().service, "billing");
/// assert_eq!(info.fence, Some(guard.fence()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as the user wrote it (`stock:1`).
    pub key: String,
    /// The lock's Redis key (`lock:stock:1`).
    pub redis_key: String,
    /// Who holds it; `None` when the lock has no owner record (taken by an older lockrt).
    pub holder: Option<Holder>,
    /// Remaining lease; `None` when the key has no expiry (not a lockrt lock).
    pub remaining: Option<Duration>,
    /// The holder's fencing token, when the value has lockrt's format.
    pub fence: Option<u64>,
    /// Waiters queued for it with a live registration: in Redis those of every process
    /// (a locker's own writers queue inside it, and only the first is counted); in memory
    /// those of other lockers, readers and a semaphore's callers.
    pub waiters: u64,
    /// What holds it: the lock (or write lock), readers, or a semaphore's permits. For the
    /// last two, `holder` is `None`, `remaining` and `fence` are the largest of the holders',
    /// and `shared` lists each one.
    pub kind: LockKind,
    /// Each reader or permit holder, when `kind` is [`LockKind::Read`] or
    /// [`LockKind::Permits`]; empty for a lock.
    pub shared: Vec<ShareInfo>,
    /// Released by its holder and kept taken until its `min_hold` ends (also the mark of a
    /// finished [`every`](crate::every) tick): nobody runs under it, and no request of its
    /// holder changes it any more.
    pub released: bool,
}

/// One reader or permit holder of a key, in [`LockInfo::shared`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::in_memory();
/// let slots = lockrt::LockOptions::new().permits(3);
/// let (_a, _b) = (locker.acquire("export", slots).await?, locker.acquire("export", slots).await?);
/// let info = locker.lock_info("export").await?.expect("held");
/// assert_eq!(info.kind, lockrt::LockKind::Permits(3));
/// assert_eq!(info.shared.len(), 2);
/// assert_eq!(info.shared[0].holder.as_ref().unwrap().pid, std::process::id());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShareInfo {
    /// Who holds the share; `None` without a readable owner record.
    pub holder: Option<Holder>,
    /// Remaining lease.
    pub remaining: Duration,
    /// The share's fencing token.
    pub fence: Option<u64>,
}

impl Locker {
    /// The lock `key` (the user's key, without the prefix), or `None` when nobody holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// assert!(locker.lock_info("job").await?.is_none());
    /// let _g = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// let info = locker.lock_info("job").await?.unwrap();
    /// assert_eq!(info.holder.unwrap().pid, std::process::id());
    /// # Ok(()) }
    /// ```
    pub async fn lock_info(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(self.prefix(), key)?;
        self.info_of(&key).await
    }

    async fn info_of(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let state = self.backend().inspect(key).await?;
        Ok(state.map(|s| LockInfo {
            key: key.user.to_string(),
            redis_key: key.lock().to_owned(),
            holder: s.holder,
            remaining: s.remaining,
            fence: s.fence,
            waiters: s.waiters,
            kind: s.kind,
            shared: (s.shared.into_iter())
                .map(|h| ShareInfo {
                    holder: h.holder,
                    remaining: h.remaining,
                    fence: h.fence.map(|c| holder_fence(c, 0)),
                })
                .collect(),
            released: s.kept,
        }))
    }

    /// The held locks whose keys (without the prefix) match `pattern`, a Redis glob (`*`,
    /// `?`, `[..]`; `"*"` for all), sorted by key, at most [`MAX_LISTED`]. Runs `SCAN`, which
    /// does not block the server; on a Redis Cluster it scans every master (found with
    /// `CLUSTER SLOTS`, connected with the seeds' credentials).
    ///
    /// A lock released and kept taken until its `min_hold` ends, or the mark of a finished
    /// [`every`](crate::every) tick, is held by nobody: it is not listed here (see
    /// [`locks_with_released`](Self::locks_with_released)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let _a = locker.acquire("stock:1", lockrt::LockOptions::new()).await?;
    /// let _b = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// let held = locker.locks("stock:*").await?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].key, "stock:1");
    /// # Ok(()) }
    /// ```
    pub async fn locks(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let mut all = self.locks_with_released(pattern).await?;
        all.retain(|l| !l.released);
        Ok(all)
    }

    /// As [`locks`](Self::locks), and also the locks released and kept taken
    /// ([`LockInfo::released`]): a `min_hold` not over yet, the marks of finished
    /// [`every`](crate::every) ticks (`lockctl list --released`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory();
    /// let kept = lockrt::LockOptions::new().min_hold(Duration::from_secs(5));
    /// locker.acquire("report", kept).await?.release().await?;
    /// assert!(locker.locks("*").await?.is_empty());
    /// assert!(locker.locks_with_released("*").await?[0].released);
    /// # Ok(()) }
    /// ```
    pub async fn locks_with_released(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let full = format!("{}{pattern}", self.prefix());
        let names = self.backend().scan(&full, MAX_LISTED).await?;
        let mut out = Vec::new();
        for name in names.into_iter().take(MAX_LISTED) {
            let Some(key) = LockKey::from_lock_name(self.prefix(), &name) else {
                continue;
            };
            if let Some(info) = self.info_of(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Removes lock `key` whoever holds it, for operators (a crashed holder's lock, a stuck
    /// job). It runs the holder's own release: the owner record goes, the longest live waiter
    /// (of any process) gets the lock at once and is told. The holder is revoked at once: the
    /// same script publishes its token on the revoke channel `{<prefix>}:revoke`, which every
    /// locker listens to while it holds a lock, so the holder's lease is declared lost within
    /// milliseconds and its section (`on_lost = "cancel"`) cancelled. If that message is lost
    /// (the holder's subscriber was reconnecting), its next renewal, within a third of its ttl,
    /// finds the lock gone. Returns whether a lock was held. Between the hand-over and the
    /// holder hearing of it lie those milliseconds (or that renewal interval): use fencing
    /// tokens where even that overlap matters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let held = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// assert!(locker.force_unlock("job").await?);
    /// assert!(held.is_lost(), "the holder is told at once");
    /// assert!(locker.lock_info("job").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let key = LockKey::new(self.prefix(), key)?;
        // A slot in migration refuses it until the migration ends: retried for a while.
        let mut moving = crate::lease::while_migrating(Instant::now() + FORCE_WHILE_MIGRATING);
        let freed = loop {
            match self.backend().force_release(&key).await {
                Err(e) if e.is_migrating() && moving.retry(&e).await => {}
                res => break res?,
            }
        };
        if freed {
            crate::metrics::force_unlocked();
            self.wake(&key.tag);
        }
        Ok(freed)
    }
}
