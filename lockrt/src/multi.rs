//! Several locks at once, all or none: [`Locker::acquire_all`], [`Locker::run_all`] and
//! [`MultiGuard`].
//!
//! When the keys share a cluster slot (any keys on a single server) and all are free with
//! nobody queued, one script takes them all at once. Otherwise the keys are taken one by one
//! in one canonical order (sorted, duplicates dropped), whatever
//! order the caller names them in: a holder of one key only ever waits for a key that sorts
//! after it, so two callers naming the same keys in opposite orders can't wait for each other
//! (no cycle, no deadlock). One `wait` covers them all; when a key can't be had in it, the keys
//! taken so far are released before the error returns. Each key keeps every guarantee of a
//! single lock (its own lease, watchdog, fence, loss detection, release on every exit path).

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use futures_util::future::select_all;
use tokio::time::Instant;

use crate::backend::contract::{Found, Renewal};
use crate::context;
use crate::error::LockError;
use crate::guard::{HeldLock, LockGuard};
use crate::kind::reenter;
use crate::lease::LeaseInfo;
use crate::locker::Locker;
use crate::options::{LockKind, LockOptions, OnLost, Wait};
use crate::wait::within;

/// All the locks of one [`Locker::acquire_all`]. Dropping it releases them all in the
/// background; [`release`](Self::release) does it in the foreground.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::in_memory();
/// let both = locker.acquire_all(["acct:2", "acct:1"], lockrt::LockOptions::new()).await?;
/// assert_eq!(both.keys().collect::<Vec<_>>(), ["acct:1", "acct:2"]);
/// assert!(both.fence("acct:2").is_some());
/// both.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the locks at once"]
pub struct MultiGuard {
    /// In the canonical (sorted) order.
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The keys held, sorted (duplicates given to `acquire_all` appear once).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.guards.iter().map(LockGuard::key)
    }

    /// `(key, fence)` for each key held, sorted by key: each fence is that key's own (see
    /// [`LockGuard::fence`]).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let g = locker.acquire_all(["b", "a"], Default::default()).await?;
    /// let fences = g.fences();
    /// assert_eq!(fences.iter().map(|(k, _)| *k).collect::<Vec<_>>(), ["a", "b"]);
    /// # Ok(()) }
    /// ```
    pub fn fences(&self) -> Vec<(&str, u64)> {
        self.guards.iter().map(|g| (g.key(), g.fence())).collect()
    }

    /// The fence of `key`, if it is one of the keys held.
    pub fn fence(&self, key: &str) -> Option<u64> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(LockGuard::fence)
    }

    /// Whether any of the locks has been lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any of the locks is lost.
    pub async fn lost(&self) {
        let _ = select_all(self.guards.iter().map(|g| Box::pin(g.lost()))).await;
    }

    /// Releases every lock. All are released whatever happens to one; the result is the
    /// first failure (`Lost` when one was no longer held, or the server's error).
    pub async fn release(self) -> Result<(), LockError> {
        let mut first = Ok(());
        // Reverse order: the last taken goes first, as nested locks would.
        for guard in self.guards.into_iter().rev() {
            let res = guard.release().await;
            if first.is_ok() {
                first = res;
            }
        }
        first
    }

    pub(crate) fn leases(&self) -> impl Iterator<Item = &Arc<LeaseInfo>> {
        self.guards.iter().map(LockGuard::lease)
    }
}

impl std::fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("fences", &self.fences())
            .finish()
    }
}

/// The keys sorted, without duplicates: the one order every caller takes them in.
fn canonical<I, K>(keys: I) -> Result<Vec<String>, LockError>
where
    I: IntoIterator<Item = K>,
    K: AsRef<str>,
{
    let mut keys: Vec<String> = keys.into_iter().map(|k| k.as_ref().to_owned()).collect();
    if keys.is_empty() {
        return Err(LockError::InvalidKey {
            key: String::new(),
            reason: "no keys given to acquire_all / run_all".into(),
        });
    }
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

impl Locker {
    /// Takes the locks of all `keys` or none, within one `wait`. The keys are taken in one
    /// canonical order (sorted, duplicates once) whatever order they are given in, so callers
    /// naming the same keys in opposite orders never deadlock; when one can't be had in time,
    /// those taken are released before the error returns (within the call's bound: `wait`
    /// plus one connect and one response timeout; after that in the background). Refused
    /// with `ShutDown` once the locker shuts down. `opts` applies to each lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory();
    /// let peer = locker.in_memory_peer().unwrap();
    /// let one = peer.acquire("acct:2", Default::default()).await?;
    /// let opts = lockrt::LockOptions::new().wait(Duration::from_millis(20));
    /// // acct:1 is free but acct:2 is not: neither is taken.
    /// assert!(locker.acquire_all(["acct:1", "acct:2"], opts).await.unwrap_err().is_timeout());
    /// assert!(locker.try_acquire("acct:1", Default::default()).await?.is_some());
    /// # drop(one); Ok(()) }
    /// ```
    pub async fn acquire_all<I, K>(
        &self,
        keys: I,
        opts: LockOptions,
    ) -> Result<MultiGuard, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
    {
        let keys = canonical(keys)?;
        self.take_all(&keys, opts).await
    }

    /// Takes `keys` (canonical) in order with one deadline, through the shutdown gate (as a
    /// single acquire: refused once closing, its compensation waited for by `shutdown`).
    async fn take_all(&self, keys: &[String], opts: LockOptions) -> Result<MultiGuard, LockError> {
        exclusive_only(keys, opts)?;
        // Boxed: the one-by-one path nests every step of a single acquire, and without the
        // box an `async fn` holding a multi-key section (the attribute's `keys = [..]`)
        // overflows rustc's layout depth limit.
        self.gated(Box::pin(self.take_all_now(keys, opts)), MultiGuard::is_lost)
            .await
    }

    /// [`take_all`](Self::take_all) inside the gate; on failure gives back what it took.
    async fn take_all_now(
        &self,
        keys: &[String],
        opts: LockOptions,
    ) -> Result<MultiGuard, LockError> {
        // The call's bound counts from its start, the one-script attempt included: `wait`
        // plus one connect and one response timeout, whatever the server does.
        let wait = opts.wait.unwrap_or(self.defaults().wait);
        let deadline = match wait {
            Wait::For(d) => Instant::now().checked_add(d),
            Wait::Forever => None,
        };
        let bound = self.call_bound(wait);
        // One call when all are free and share a slot; else one by one, waiting as needed.
        match within(bound, crate::acquire::take_at_once(self, keys, opts)).await {
            Some(Some(guards)) => return Ok(MultiGuard { guards }),
            Some(None) => {}
            // Dropped unanswered: its compensation releases whatever it took.
            None => return Err(self.unanswered("the one-call acquire of the keys")),
        }
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let opts = match deadline {
                Some(d) => opts.wait(d.saturating_duration_since(Instant::now())),
                None => opts.wait_forever(),
            };
            match self.acquire(key, opts).await {
                Ok(g) => guards.push(g),
                Err(e) => return Err(self.give_back(guards, bound, e).await),
            }
        }
        // A key taken first may have been lost while the others were waited for: a fixed
        // lease run out or a forced unlock (known here), or a server restarted without its
        // data (known only by asking). Nobody gets a guard that is already lost.
        let earlier = &guards[..guards.len().saturating_sub(1)];
        let confirmed = match within(bound, self.confirm_held(earlier)).await {
            Some(confirmed) => confirmed,
            None => Err(self.unanswered("the check of the keys taken first")),
        };
        if let Err(e) = confirmed {
            return Err(self.give_back(guards, bound, e).await);
        }
        if let Some(lost) = guards.iter().find(|g| g.is_lost()) {
            let e = lost.lease().lost_error();
            return Err(self.give_back(guards, bound, e).await);
        }
        Ok(MultiGuard { guards })
    }

    /// All or none: the keys taken go back before the caller hears of `e`, but not past the
    /// call's `bound`; a release still under way then (a server that stopped answering) goes
    /// on in the background, where `shutdown` waits for it.
    async fn give_back(
        &self,
        guards: Vec<LockGuard>,
        bound: Option<Instant>,
        e: LockError,
    ) -> LockError {
        // No body ran: `min_hold` does not keep them.
        for g in &guards {
            g.lease().forgo_keep();
        }
        // Cut short at the bound, each release goes on in the background (tracked for
        // `shutdown`), and the keys count as released at once: this task may take them again.
        let _ = within(bound, MultiGuard { guards }.release()).await;
        e
    }

    /// Checks with the backend that each of `earlier` (taken before the keys waited for after
    /// them) is still held, with one owner-checked renewal per cluster slot: a lock deleted
    /// while the rest were waited for (a server restarted without its data) must not let the
    /// body start. A fixed lease is renewed only up to its own end.
    async fn confirm_held(&self, earlier: &[LockGuard]) -> Result<(), LockError> {
        let now = Instant::now();
        let mut batch: Vec<(u16, &LeaseInfo, Renewal<'_>)> = (earlier.iter())
            .map(|g| {
                let info = &**g.lease();
                let lease = match info.watchdog {
                    true => info.ttl,
                    false => info.deadline().saturating_duration_since(now) + info.safety,
                };
                (
                    self.backend().renewal_group(&info.key),
                    info,
                    info.renewal(lease, None),
                )
            })
            .collect();
        batch.sort_by_key(|(group, _, _)| *group);
        for group in batch.chunk_by(|a, b| a.0 == b.0) {
            let renewals: Vec<Renewal<'_>> = group.iter().map(|(_, _, r)| *r).collect();
            let hedge_at = Instant::now() + group[0].1.ttl;
            let found = self.backend().renew_hedged(&renewals, hedge_at).await;
            for ((_, info, _), res) in group.iter().zip(found) {
                match res {
                    Ok(Found::Renewed) => {}
                    Ok(found) => {
                        crate::lease::declare_lost(info, found.cause());
                        return Err(info.lost_error());
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Runs `fut` holding all of `keys` ([`acquire_all`](Self::acquire_all)), then releases
    /// them. The body is cancelled, as `on_lost` says, when any of the locks is lost, and the
    /// call returns that key's `Lost`. Reentrant per key: a key this task already holds in an
    /// enclosing section (of this locker) is covered by it, and its loss ends this body too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let moved = locker.run_all(["acct:7", "acct:3"], Default::default(), async {
    ///     // debit acct:7, credit acct:3
    ///     lockrt::current_lock().map(|h| h.key().to_owned())
    /// }).await?;
    /// assert!(moved.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn run_all<I, K, F>(
        &self,
        keys: I,
        opts: LockOptions,
        fut: F,
    ) -> Result<F::Output, LockError>
    where
        I: IntoIterator<Item = K>,
        K: AsRef<str>,
        F: Future,
    {
        let keys = canonical(keys)?;
        let span = tracing::info_span!("lock_all", keys = ?keys, outcome = tracing::field::Empty);
        let res =
            tracing::Instrument::instrument(self.section_all(&keys, opts, fut), span.clone()).await;
        span.record("outcome", if res.is_ok() { "released" } else { "error" });
        res
    }

    async fn section_all<F: Future>(
        &self,
        keys: &[String],
        opts: LockOptions,
        fut: F,
    ) -> Result<F::Output, LockError> {
        exclusive_only(keys, opts)?;
        let (outer, fresh): (Vec<_>, Vec<_>) = keys
            .iter()
            .map(|k| (k, context::held(self.inner.id, k)))
            .partition(|(_, held)| held.is_some());
        // A key of an enclosing section covers this one only if held exclusively: inside a
        // read or permit section others share the key, and this body is exclusive.
        for (key, held) in &outer {
            if let Some(held) = held {
                reenter(key, held.lease.key.kind, opts.kind)?;
            }
        }
        let fresh: Vec<String> = fresh.into_iter().map(|(k, _)| k.clone()).collect();
        let multi = if fresh.is_empty() {
            MultiGuard { guards: Vec::new() }
        } else {
            self.take_all(&fresh, opts).await?
        };
        let mut leases: Vec<Arc<LeaseInfo>> = outer
            .into_iter()
            .filter_map(|(_, held)| held.map(|h| h.lease))
            .collect();
        leases.extend(multi.leases().cloned());
        let held: Vec<HeldLock> = multi
            .guards
            .iter()
            .map(|g| HeldLock {
                locker_id: self.inner.id,
                key: Arc::from(g.key()),
                fence: g.fence(),
                lease: g.lease().clone(),
            })
            .collect();
        let body = context::within(held, fut);
        match guarded_all(&leases, opts.on_lost, body).await {
            Ok((output, lost)) => {
                let released = multi.release().await;
                match released {
                    Err(e @ LockError::Lost { .. }) => Err(e),
                    _ if lost => Err(first_lost(&leases)),
                    Err(e) => {
                        // The body's result stands whatever the release says.
                        tracing::warn!(error = %e, "release after the critical section failed");
                        Ok(output)
                    }
                    Ok(()) => Ok(output),
                }
            }
            Err(e) => {
                // Cancelled by a loss: the guards' drop releases in the background.
                drop(multi);
                Err(e)
            }
        }
    }
}

/// Multi-key locks are exclusive, as the attribute refuses `mode` or `permits` with `keys`.
fn exclusive_only(keys: &[String], opts: LockOptions) -> Result<(), LockError> {
    if opts.kind == LockKind::Exclusive {
        return Ok(());
    }
    Err(LockError::Config(format!(
        "multi-key locks are exclusive: {} was asked for keys {keys:?}",
        opts.kind
    )))
}

/// The `Lost` error of the first lease found lost.
fn first_lost(leases: &[Arc<LeaseInfo>]) -> LockError {
    leases
        .iter()
        .find(|l| l.is_lost())
        .unwrap_or(&leases[0])
        .lost_error()
}

/// Runs `body` while every lease holds, as `section::guarded` does for one.
async fn guarded_all<F: Future>(
    leases: &[Arc<LeaseInfo>],
    on_lost: OnLost,
    body: F,
) -> Result<(F::Output, bool), LockError> {
    let mut body = pin!(body);
    let mut any_lost: Pin<Box<dyn Future<Output = ()> + Send + '_>> = if leases.is_empty() {
        Box::pin(std::future::pending())
    } else {
        Box::pin(async {
            let _ = select_all(leases.iter().map(|l| Box::pin(l.lost()))).await;
        })
    };
    let mut lost = false;
    std::future::poll_fn(|cx| {
        if !lost && (leases.iter().any(|l| l.is_lost()) || any_lost.as_mut().poll(cx).is_ready()) {
            lost = true;
            if on_lost == OnLost::Cancel {
                return Poll::Ready(Err(first_lost(leases)));
            }
            tracing::warn!("a lock lost while its critical section runs; continuing as asked (on_lost = continue)");
        }
        body.as_mut().poll(cx).map(|out| Ok((out, lost)))
    })
    .await
}
