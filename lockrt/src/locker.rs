//! [`Locker`]: the handle users keep (cheap to clone), its builder, and the three ways to take
//! a lock: [`Locker::acquire`], [`Locker::try_acquire`] and [`Locker::run`].
//!
//! Owns the acquire protocol: take this locker's FIFO turn for the key, try once, then listen
//! for releases and retry on each notification, with a fallback retry at the holder's
//! remaining lease. An attempt whose reply was lost is retried with the same token (the script
//! recognises it), so it resolves to "held by us" or "held by another", never to an orphan.
//! Reentrancy and `current_lock` are task-local state set by `run`.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::LockError;
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::{RedisBackend, Timeouts};
use crate::backend::{Attempt, Backend, Queueing, Released, Token};
use crate::error::{BackendError, fmt_duration};
use crate::guard::{HeldLock, LockGuard};
use crate::key::{LockKey, validate_prefix};
use crate::lease::{LeaseInfo, Monitor};
use crate::options::{LockOptions, OnLost, Wait};
use crate::wait::{Notifier, Remote};

const DEFAULT_TTL: Duration = Duration::from_secs(30);
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
const MIN_TTL: Duration = Duration::from_millis(30);
const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a queued waiter's registration lives without a refresh (it refreshes at half).
const REGISTRATION: Duration = Duration::from_secs(2);
/// Lease handed to a waiter with a watchdog; its first renewal extends it to the full ttl.
const GRANT_LEASE: Duration = Duration::from_secs(2);
/// Attempts for one acquire whose outcome stays unknown (reply lost, connection reset).
const MAX_ATTEMPT_RETRIES: u32 = 3;

tokio::task_local! {
    static HELD: Vec<HeldLock>;
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static DEFAULT: RwLock<Option<Locker>> = RwLock::new(None);

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
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    backend: Arc<Backend>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Wait,
    op_timeout: Duration,
    notifier: Notifier,
    monitor: OnceLock<Monitor>,
    held: AtomicUsize,
    waiting: AtomicUsize,
    next_lease: AtomicU64,
}

/// Builds a [`Locker`] with non-default settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockrt::LockError> {
/// use std::time::Duration;
/// let locker = lockrt::Locker::builder()
///     .url("redis://127.0.0.1:6379/")
///     .prefix("app:lock:")
///     .default_ttl(Duration::from_secs(10))
///     .default_wait(Duration::from_secs(3))
///     .build()
///     .await?;
/// # let _ = locker; Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct LockerBuilder {
    url: Option<String>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Wait,
    connect_timeout: Duration,
    response_timeout: Duration,
    fence_retention: Duration,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field(
                "url",
                &self.url.as_deref().map(crate::backend::redis::redact_url),
            )
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .finish_non_exhaustive()
    }
}

impl Default for LockerBuilder {
    fn default() -> Self {
        LockerBuilder {
            url: None,
            prefix: "lock:".to_owned(),
            default_ttl: DEFAULT_TTL,
            default_wait: Wait::For(DEFAULT_WAIT),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            fence_retention: DEFAULT_FENCE_RETENTION,
        }
    }
}

impl LockerBuilder {
    /// The server: `redis://[:password@]host:port/db`, `rediss://...` (feature `tls`) or
    /// `redis+unix:///path/to/socket`.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Namespace for lock keys (default `"lock:"`): the lock `stock:1` is the Redis key
    /// `lock:stock:1`. May not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease used when a call sets no `ttl` (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Wait used when a call sets none (default 10 s).
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = Wait::For(wait);
        self
    }

    /// Make calls without a `wait` wait without limit.
    pub fn default_wait_forever(mut self) -> Self {
        self.default_wait = Wait::Forever;
        self
    }

    /// Longest time to establish a connection (default 1 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Longest time to wait for one reply (default 1 s); a request past it counts as failed
    /// and, for an acquire, is resolved by a retry with the same owner token.
    pub fn response_timeout(mut self, t: Duration) -> Self {
        self.response_timeout = t;
        self
    }

    /// How long a key's fencing counter lives from its creation (default 24 h): the state a
    /// key leaves behind is bounded by it. The next counter starts at the Redis server's time
    /// in µs, above every fence the old one issued (it started at the server time of its own
    /// creation and grew by one per acquisition), unless the server's clock stepped back by
    /// about this long or the key averaged more than one acquisition per µs.
    pub fn fence_retention(mut self, t: Duration) -> Self {
        self.fence_retention = t;
        self
    }

    /// Connects to Redis. Fails within about the connect timeout when the server is
    /// unreachable, with an error naming its address (never its password).
    pub async fn build(self) -> Result<Locker, LockError> {
        validate_prefix(&self.prefix)?;
        if self.default_ttl.is_zero()
            || self.connect_timeout.is_zero()
            || self.response_timeout.is_zero()
        {
            return Err(LockError::Config(
                "default_ttl and timeouts must be greater than zero".into(),
            ));
        }
        let url = self.url.clone().ok_or_else(|| {
            LockError::Config(
                "no Redis URL: call `.url(\"redis://host:6379/\")` on the builder".into(),
            )
        })?;
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.response_timeout,
        };
        let backend = RedisBackend::connect(&url, timeouts, self.fence_retention).await?;
        let notifier = Notifier::remote(Remote {
            client: backend.client().clone(),
            addr: backend.addr().to_owned(),
            timeout: timeouts.connect + timeouts.response,
            secret: backend
                .client()
                .get_connection_info()
                .redis_settings()
                .password()
                .map(str::to_owned),
        });
        Ok(Locker::from_parts(self, Backend::Redis(backend), notifier))
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("server", &self.inner.backend.addr())
            .field("prefix", &self.inner.prefix)
            .field("default_ttl", &self.inner.default_ttl)
            .field("default_wait", &self.inner.default_wait)
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

    /// A builder for non-default settings.
    ///
    /// ```
    /// let builder = lockrt::Locker::builder().prefix("jobs:");
    /// # let _ = builder;
    /// ```
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// Locks that live in this process only, with the same semantics as Redis-backed ones
    /// (waiting, leases, watchdog, loss, fencing, reentrancy). Clones share the locks; two
    /// separate `in_memory()` lockers are two separate lock spaces.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let n = locker.run("counter", lockrt::LockOptions::new(), async { 1 + 1 }).await?;
    /// assert_eq!(n, 2);
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> Locker {
        Locker::in_memory_with(LockerBuilder::default())
    }

    /// [`in_memory`](Self::in_memory) with the builder's prefix and defaults (the URL is
    /// ignored).
    ///
    /// ```
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory_with(
    ///     lockrt::Locker::builder().default_ttl(Duration::from_secs(5)),
    /// );
    /// # let _ = locker;
    /// ```
    pub fn in_memory_with(builder: LockerBuilder) -> Locker {
        let mut builder = builder;
        if validate_prefix(&builder.prefix).is_err() {
            builder.prefix = "lock:".into();
        }
        Locker::from_parts(
            builder,
            Backend::Memory(MemoryBackend::default()),
            Notifier::local(),
        )
    }

    fn from_parts(b: LockerBuilder, backend: Backend, notifier: Notifier) -> Locker {
        Locker {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                backend: Arc::new(backend),
                prefix: b.prefix,
                default_ttl: b.default_ttl.max(MIN_TTL),
                default_wait: b.default_wait,
                op_timeout: b.connect_timeout + b.response_timeout,
                notifier,
                monitor: OnceLock::new(),
                held: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
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
        &self.inner.prefix
    }

    /// The Redis key a lock named `key` lives at (`lock:stock:1`), for inspection with
    /// `redis-cli`. Braces and `%` in `key` are percent-encoded.
    ///
    /// ```
    /// let locker = lockrt::Locker::in_memory();
    /// assert_eq!(locker.redis_key("stock:1").unwrap(), "lock:stock:1");
    /// ```
    pub fn redis_key(&self, key: &str) -> Result<String, LockError> {
        Ok(LockKey::new(&self.inner.prefix, key)?.lock().to_owned())
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
            waiting: self.inner.waiting.load(Ordering::Relaxed),
        }
    }

    /// Remaining lease of `key` in the in-memory backend (`None` when not held or when this
    /// locker talks to Redis, where `PTTL` answers the same question).
    #[doc(hidden)]
    pub fn memory_pttl(&self, key: &str) -> Option<Duration> {
        match &*self.inner.backend {
            Backend::Memory(m) => m.pttl(LockKey::new(&self.inner.prefix, key).ok()?.lock()),
            Backend::Redis(_) => None,
        }
    }

    /// Takes the lock, waiting up to the options' `wait` (or the locker's default).
    /// `Err(Timeout)` when it stayed busy, `Err(Backend)` when Redis failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("stock:1", lockrt::LockOptions::new()).await?;
    /// let busy = locker.acquire("stock:1", lockrt::LockOptions::new().wait(Duration::from_millis(10))).await;
    /// assert!(busy.unwrap_err().is_timeout());
    /// drop(guard);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, key: &str, opts: LockOptions) -> Result<LockGuard, LockError> {
        let wait = opts.wait.unwrap_or(self.inner.default_wait);
        self.acquire_inner(key, opts, wait).await
    }

    /// One attempt: `Ok(None)` when another owner holds the lock. Ignores the options' wait.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let first = locker.try_acquire("k", lockrt::LockOptions::new()).await?;
    /// assert!(first.is_some());
    /// assert!(locker.try_acquire("k", lockrt::LockOptions::new()).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(
        &self,
        key: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        match self
            .acquire_inner(key, opts, Wait::For(Duration::ZERO))
            .await
        {
            Ok(g) => Ok(Some(g)),
            Err(LockError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Holds the lock around `fut`: acquires, runs `fut` while the watchdog renews, and
    /// releases on every exit path (before returning on a normal return; in the background
    /// after a panic or cancellation). If the lease is lost, `fut` is dropped and
    /// `Err(Lost)` returned, unless the options say [`OnLost::Continue`].
    ///
    /// Reentrant: inside `fut`, another `run` on the same locker and key in the same task
    /// runs its future directly.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let opts = lockrt::LockOptions::new();
    /// let v = locker.run("order:7", opts, async {
    ///     // reentrant: same task, same key
    ///     locker.run("order:7", opts, async { 7 }).await
    /// }).await??;
    /// assert_eq!(v, 7);
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
        fut: F,
    ) -> Result<F::Output, LockError> {
        let key = key.as_ref();
        let outer = HELD.try_with(|held| {
            let reentrant = held
                .iter()
                .any(|h| h.locker_id == self.inner.id && &*h.key == key);
            (reentrant, held.clone())
        });
        let mut stack = match outer {
            Ok((true, _)) => return Ok(fut.await),
            Ok((false, stack)) => stack,
            Err(_) => Vec::new(),
        };
        let guard = self.acquire(key, opts).await?;
        stack.push(HeldLock {
            locker_id: self.inner.id,
            key: Arc::from(key),
            fence: guard.fence,
        });
        let body = HELD.scope(stack, fut);
        let out = match opts.on_lost {
            OnLost::Cancel => {
                tokio::select! {
                    biased;
                    out = body => out,
                    () = guard.lost() => {
                        // `body` is dropped here, before anything else runs.
                        return Err(LockError::Lost { key: key.to_owned() });
                    }
                }
            }
            _ => {
                tokio::pin!(body);
                tokio::select! {
                    biased;
                    out = &mut body => out,
                    () = guard.lost() => {
                        tracing::warn!(key, "lock lost while its critical section runs; continuing as asked (on_lost = continue)");
                        body.await
                    }
                }
            }
        };
        // The body's result stands whatever the release says.
        if let Err(e) = guard.release().await {
            tracing::warn!(key, error = %e, "release after the critical section failed");
        }
        Ok(out)
    }

    /// Takes the turn, then the lock, within `wait` (`For(0)`: one attempt).
    async fn acquire_inner(
        &self,
        user_key: &str,
        opts: LockOptions,
        wait: Wait,
    ) -> Result<LockGuard, LockError> {
        let start = Instant::now();
        let key = LockKey::new(&self.inner.prefix, user_key)?;
        let ttl = opts.ttl.unwrap_or(self.inner.default_ttl).max(MIN_TTL);
        let deadline = match wait {
            Wait::For(d) => Some(start + d),
            Wait::Forever => None,
        };
        let timeout = |start: Instant| LockError::Timeout {
            key: user_key.to_owned(),
            waited: start.elapsed(),
        };

        let entry = self.inner.notifier.entry(&key.tag);
        // This locker's callers queue in arrival order; only the head talks to Redis.
        let turn = entry.turn();
        let permit = match turn.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let _waiting = Counted::new(&self.inner.waiting);
                within(deadline, turn.acquire_owned())
                    .await
                    .ok_or_else(|| timeout(start))?
                    .expect("turn semaphores are never closed")
            }
        };

        // A caller that may wait joins the lock's cross-process queue on its first failed
        // attempt; a release then hands it the lock with a short lease that its watchdog
        // extends (a waiter that died meanwhile blocks the lock only that long).
        let queue = (wait != Wait::For(Duration::ZERO)).then(|| Queueing {
            register: REGISTRATION,
            grant_lease: if opts.watchdog {
                ttl.min(GRANT_LEASE)
            } else {
                ttl
            },
        });
        let token = Token::new();
        let mut enqueued = Enqueued {
            locker: self,
            key: &key,
            token: &token,
            bound: REGISTRATION.max(ttl),
            armed: queue.is_some(),
        };
        let (mut attempt, mut sent) = self.attempt(&key, &token, ttl, queue).await?;
        let mut waiting = None;
        let listener = match attempt {
            Attempt::Acquired { .. } => None,
            Attempt::Held { .. } if deadline.is_some_and(|d| Instant::now() >= d) => {
                tracing::debug!(key = user_key, outcome = "busy", "acquire");
                return Err(timeout(start));
            }
            Attempt::Held { .. } => {
                waiting = Some(Counted::new(&self.inner.waiting));
                let listen = within(deadline, entry.listen()).await;
                Some(listen.ok_or_else(|| timeout(start))??)
            }
        };
        let mut lease = ttl;
        // A grant whose fence is not above a counter an attempt saw is stale: its message
        // came so late that the granted lease had run out before that attempt.
        let mut seen_counter = match attempt {
            Attempt::Held { counter, .. } => counter,
            Attempt::Acquired { .. } => 0,
        };
        if let Some(listener) = &listener {
            // Subscribed now: retry once, then after every release message (or fallback).
            loop {
                let notified = listener.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if let Some(grant) = listener.take_grant(token.as_str())
                    && grant.fence > seen_counter
                {
                    // The granted lease started when the release ran, which was after `sent`
                    // (that attempt still found the lock busy): counting from `sent` keeps the
                    // local deadline early however late the message arrived.
                    (attempt, lease) = (
                        Attempt::Acquired { fence: grant.fence },
                        grant_lease(queue, ttl),
                    );
                    break;
                }
                (attempt, sent) = self.attempt(&key, &token, ttl, queue).await?;
                let pttl = match attempt {
                    Attempt::Acquired { .. } => break,
                    Attempt::Held { pttl, counter } => {
                        seen_counter = seen_counter.max(counter);
                        pttl
                    }
                };
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) {
                    tracing::debug!(key = user_key, outcome = "timeout", "acquire");
                    return Err(timeout(start));
                }
                // Fallback in case a message is lost: when the holder's lease runs out, and
                // often enough to keep the queue registration fresh.
                let fallback = pttl.map_or(REGISTRATION / 2, |p| {
                    (p + Duration::from_millis(1)).min(REGISTRATION / 2)
                });
                let mut until = now + fallback;
                if let Some(d) = deadline {
                    until = until.min(d);
                }
                tokio::select! {
                    () = &mut notified => {}
                    () = tokio::time::sleep_until(until) => {}
                }
            }
        }
        enqueued.armed = false;
        drop(enqueued);
        drop(listener);
        drop(waiting);
        let Attempt::Acquired { fence } = attempt else {
            unreachable!("loop exits only when acquired")
        };
        let info = Arc::new(LeaseInfo {
            id: self.inner.next_lease.fetch_add(1, Ordering::Relaxed),
            key,
            token,
            ttl,
            watchdog: opts.watchdog,
            lost: CancellationToken::new(),
            turn: std::sync::Mutex::new(Some(permit)),
        });
        self.monitor().add(info.clone(), sent, lease);
        self.inner.held.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            key = user_key,
            fence,
            waited_ms = start.elapsed().as_millis() as u64,
            outcome = "acquired",
            "acquire"
        );
        Ok(LockGuard {
            locker: self.clone(),
            info,
            fence,
            entry: Some(entry),
            done: false,
        })
    }

    /// One acquire, resolving a lost reply by retrying with the same token (bounded in count
    /// and time). Returns the attempt and the send time of the request that answered.
    async fn attempt(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        queue: Option<Queueing>,
    ) -> Result<(Attempt, Instant), LockError> {
        let budget_end = Instant::now() + self.inner.op_timeout;
        let mut backoff = Duration::from_millis(10);
        let mut uncertain = false;
        let mut tries = 0;
        loop {
            let sent = Instant::now();
            match self.inner.backend.acquire(key, token, ttl, queue).await {
                Ok(a) => return Ok((a, sent)),
                Err(e) => {
                    uncertain |= e.is_transient();
                    tries += 1;
                    if !e.is_transient()
                        || tries > MAX_ATTEMPT_RETRIES
                        || Instant::now() + backoff >= budget_end
                    {
                        if uncertain {
                            // The request may have landed: remove it by token, in the
                            // background and bounded; otherwise the lease ends it.
                            self.spawn_cleanup(key.clone(), *token, ttl);
                        }
                        // Returned to the caller, who decides how loud it is.
                        tracing::debug!(key = %key.user, error = %e, "acquire failed");
                        return Err(e.into());
                    }
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
            }
        }
    }

    /// Removes a lock an unanswered acquire may have taken, by its token. Keeps trying (with
    /// backoff) for at most `ttl`: after that the lease has ended it anyway.
    fn spawn_cleanup(&self, key: LockKey, token: Token, ttl: Duration) {
        let this = self.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let give_up = Instant::now() + ttl;
                let mut backoff = Duration::from_millis(20);
                while Instant::now() < give_up {
                    if this.inner.backend.release(&key, &token).await.is_ok() {
                        return;
                    }
                    tokio::time::sleep(
                        backoff.min(give_up.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            });
        }
    }

    fn monitor(&self) -> &Monitor {
        self.inner
            .monitor
            .get_or_init(|| Monitor::spawn(self.inner.backend.clone()))
    }

    pub(crate) fn monitor_remove(&self, lease: u64) {
        if let Some(m) = self.inner.monitor.get() {
            m.remove(lease);
        }
    }

    pub(crate) fn note_released(&self) {
        self.inner.held.fetch_sub(1, Ordering::Relaxed);
    }

    /// Owner-checked release with a few bounded retries, then wakes this process's waiters.
    pub(crate) async fn release_token(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Released, BackendError> {
        let res = self.release_raw(key, token).await;
        self.note_released();
        if matches!(res, Ok(Released::Freed)) {
            self.inner.notifier.wake(&key.tag);
        }
        tracing::debug!(key = %key.user, released = ?res.as_ref().ok(), "release");
        res
    }

    async fn release_raw(&self, key: &LockKey, token: &Token) -> Result<Released, BackendError> {
        let mut backoff = Duration::from_millis(10);
        let mut tries = 0;
        loop {
            match self.inner.backend.release(key, token).await {
                Err(e) if e.is_transient() && tries < MAX_ATTEMPT_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                res => return res,
            }
        }
    }
}

/// `fut`'s output, or `None` if `deadline` passes first (`None` deadline: no limit).
async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// The lease a grant hands over (see `acquire_inner`).
fn grant_lease(queue: Option<Queueing>, ttl: Duration) -> Duration {
    queue.map_or(ttl, |q| q.grant_lease)
}

/// A waiter's place in the cross-process queue: leaving without the lock (timeout, error,
/// cancellation) removes it, and releases a grant that raced with the departure.
struct Enqueued<'a> {
    locker: &'a Locker,
    key: &'a LockKey,
    token: &'a Token,
    bound: Duration,
    armed: bool,
}

impl Drop for Enqueued<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.locker
                .spawn_cleanup(self.key.clone(), *self.token, self.bound);
        }
    }
}

/// Counts a caller in a gauge for as long as it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(gauge: &'a AtomicUsize) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
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

/// The locker installed with [`set_default`].
///
/// ```
/// lockrt::set_default(lockrt::Locker::in_memory());
/// assert!(lockrt::default_locker().is_ok());
/// ```
pub fn default_locker() -> Result<Locker, LockError> {
    DEFAULT
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or(LockError::NoDefaultLocker)
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
    is::<LockGuard>();
    is::<LockError>();
    let _ = fmt_duration;
}
