//! Taking a lock: [`Locker::acquire`] and [`Locker::try_acquire`], as named steps.
//!
//! 1. **Turn**: this locker's callers for a key queue in arrival order (a one-permit fair
//!    semaphore); only the head talks to Redis. A task that already holds the key through a
//!    guard fails at once instead of waiting for itself.
//! 2. **Attempt**: one acquire script call, retried with the same owner token when its
//!    outcome is unknown (the script recognises the token), so it resolves to "held by us" or
//!    "held by another", never to an orphan or to two holders.
//! 3. **Wait**: subscribed to the lock's release channel *before* retrying, then retry on each
//!    release message, or a bounded fallback timer; a release may hand the lock straight to
//!    this waiter (a grant), always with a short lease (at most 2 s), so a waiter that died
//!    while queued holds the lock up that long only.
//! 4. **Hold**: the lease goes to the monitor and a guard is returned.
//!
//! Every lock handed out has a local deadline counted from the *send* time of the request that
//! took it (for a grant: the send time of the waiter's latest attempt plus the server time
//! from that attempt to the release, no later than the message's arrival), and is handed out
//! only while that deadline is at least the safety margin away. Anything else is confirmed by
//! another attempt with the same token (which extends the lease to the full ttl if it is still
//! ours): a reply that came too late, a grant whose message came late, a grant of a fixed
//! lease longer than the grant lease, and every grant under `sync_replicas` (the release that
//! granted it was not acknowledged; the attempt is). From the first request sent until the
//! guard exists, a compensation is armed: however the call ends (timeout, error, cancellation
//! at any await), a release by token removes whatever the requests may have left (a lock or a
//! queue place) and bars the token, so that a request still in the network takes nothing when
//! it lands; in the background and bounded in time.

mod at_once;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::backend::contract::{Attempt, Queueing, Token};
use crate::cleanup::Pending;
use crate::error::BackendError;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::handoff::QueueSpot;
use crate::key::LockKey;
use crate::kind::{check_kind, kind_conflict};
use crate::lease::{Chain, LeaseInfo, NewLease};
use crate::locker::Locker;
use crate::options::{LockKind, LockOptions, Terms, Wait};
use crate::retry::Backoff;
use crate::wait::{Counted, EntryHandle, Listener, Owner, granted_at, within};

pub(crate) use self::at_once::take_at_once;

/// How long a queued waiter's registration lives without a refresh (it refreshes at half).
const REGISTRATION: Duration = Duration::from_secs(2);
/// Lease a release hands to a waiter (or its ttl, if shorter): the watchdog's first renewal,
/// or for a fixed lease a confirming attempt, extends it to the full ttl.
const GRANT_LEASE: Duration = Duration::from_secs(2);
/// Retries of one attempt whose outcome stays unknown (reply lost, connection reset) when the
/// wait has no end; with a wait, retries go on (with backoff) until it ends.
const ATTEMPT_RETRIES: u32 = 3;
/// The count bound of retries within a wait (the wait bounds them in time).
const ATTEMPT_RETRIES_WITHIN_WAIT: u32 = 64;
/// Retries may start this long after the call began even when `wait` is shorter, so one
/// dropped connection does not fail a `try_acquire`.
const MIN_RETRY_WINDOW: Duration = Duration::from_millis(100);
/// Attempts in a row whose lock came back with too little lease left, before giving up.
const MAX_LATE: u32 = 3;
/// Attempts in a row that each dropped a batch of lapsed queue registrations (64) without
/// reaching the queue's head, before counting the lock as busy (the wait goes on).
const MAX_PRUNING: u32 = 256;

impl Locker {
    /// Takes the lock, waiting up to the options' `wait` (or the locker's default).
    /// `Err(Timeout)` when it stayed busy, `Err(Backend)` when Redis failed,
    /// `Err(HeldByThisTask)` when this task already holds it through a guard.
    ///
    /// The call returns within `wait` (at least 100 ms) plus one connect and one response
    /// timeout, even against a server that stopped answering.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory();
    /// let guard = locker.acquire("stock:1", lockrt::LockOptions::new()).await?;
    /// let other = locker.clone();
    /// let busy = tokio::spawn(async move {
    ///     other.acquire("stock:1", lockrt::LockOptions::new().wait(Duration::from_millis(10))).await
    /// });
    /// assert!(busy.await.unwrap().unwrap_err().is_timeout());
    /// drop(guard);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, key: &str, opts: LockOptions) -> Result<LockGuard, LockError> {
        let terms = opts.resolve(&self.defaults());
        let bound = self.call_bound(terms.wait);
        self.unless_shut_down(bound, Acquisition::new(self, key, terms)?.run())
            .await
    }

    /// When a call that waits up to `wait` must have returned: `wait` (at least the retry
    /// window) plus one connect and one response timeout, from now; `None` without a limit.
    pub(crate) fn call_bound(&self, wait: Wait) -> Option<Instant> {
        match wait {
            // A wait too long to add to a clock is no limit.
            Wait::For(d) => Instant::now()
                .checked_add(d.max(MIN_RETRY_WINDOW))?
                .checked_add(self.inner.settings.shutdown_bound),
            Wait::Forever => None,
        }
    }

    /// `acquisition`, cancelled (with its compensation) when the locker shuts down, and cut
    /// short at `bound` (the call's promise, whatever queues ahead of it on the connection).
    async fn unless_shut_down(
        &self,
        bound: Option<Instant>,
        acquisition: impl Future<Output = Result<LockGuard, LockError>>,
    ) -> Result<LockGuard, LockError> {
        // Boxed: the acquisition is the largest future of a section, and a section nested in
        // another (`run` in `run`, `run_all` in `run`) would otherwise carry it inline, deep
        // enough to overflow a thread's stack in a debug build.
        let acquisition = Box::pin(acquisition);
        let bounded = async {
            match within(bound, acquisition).await {
                Some(res) => res,
                None => Err(self.unanswered("the acquire")),
            }
        };
        self.gated(bounded, LockGuard::is_lost).await
    }

    /// The error of a call that found no answer to `what` within its bound.
    pub(crate) fn unanswered(&self, what: &str) -> LockError {
        let e = BackendError::new(
            self.backend().addr(),
            format!(
                "no answer to {what} within the call's wait plus one connect and one response \
                 timeout"
            ),
        );
        LockError::Backend(e.with_hint(
            "check that the server is up and reachable; nothing of this call stays taken",
        ))
    }

    /// The gate every path that sends an acquire on behalf of this locker passes: refused once
    /// closing, cancelled (with its compensation) when the locker shuts down, waited for by
    /// `shutdown`, and never handing out what shutdown already ended (`born_lost`).
    pub(crate) async fn gated<T>(
        &self,
        acquisition: impl Future<Output = Result<T, LockError>>,
        born_lost: impl FnOnce(&T) -> bool,
    ) -> Result<T, LockError> {
        // Keeps `shutdown` waiting until this call has ended and handed its clean-up (if
        // any) to the tracker: dropped last, after the acquisition's compensation.
        let _in_flight = self.inner.cleanups.token();
        let res = tokio::select! {
            biased;
            () = self.inner.closing.cancelled() => Err(LockError::ShutDown),
            res = acquisition => res,
        };
        match res {
            // Completed as `shutdown` drained the monitors: nothing renews it, so it is not
            // handed out (dropping it releases it).
            Ok(taken) if self.inner.closing.is_cancelled() && born_lost(&taken) => {
                Err(LockError::ShutDown)
            }
            res => res,
        }
    }

    /// One attempt: `Ok(None)` when another owner (or this task, through a guard) holds the
    /// lock. Ignores the options' wait.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let first = locker.try_acquire("k", lockrt::LockOptions::new()).await?;
    /// assert!(first.is_some());
    /// let other = locker.clone();
    /// let second = tokio::spawn(async move {
    ///     other.try_acquire("k", lockrt::LockOptions::new()).await
    /// });
    /// assert!(second.await.unwrap()?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(
        &self,
        key: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let terms = Terms {
            wait: Wait::For(Duration::ZERO),
            ..opts.resolve(&self.defaults())
        };
        let bound = self.call_bound(terms.wait);
        let once = Acquisition::new(self, key, terms)?;
        match self.unless_shut_down(bound, once.run()).await {
            Ok(g) => Ok(Some(g)),
            // Busy, also when the holder is this very task.
            Err(LockError::Timeout { .. } | LockError::HeldByThisTask { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A lock an attempt, a grant or a local hand-off took: the fencing counter's value, the
/// local hand-offs since, and the lease counted from `sent`.
#[derive(Debug, Clone, Copy)]
struct Taken {
    fence: u64,
    sent: Instant,
    lease: Duration,
    local: u32,
}

/// What the latest busy attempt saw.
#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    sent: Option<Instant>,
    pttl: Option<Duration>,
    /// The fencing counter, `None` when unknown (a grant must then be confirmed).
    counter: Option<u64>,
}

/// One call of `acquire`/`try_acquire`, from its options to a guard.
struct Acquisition<'a> {
    locker: &'a Locker,
    key: LockKey,
    ttl: Duration,
    terms: Terms,
    start: Instant,
    /// When `wait` ends (`None`: never).
    deadline: Option<Instant>,
    /// No retry of a failed request starts after this.
    retry_end: Option<Instant>,
    token: Token,
    queue: Option<Queueing>,
}

impl<'a> Acquisition<'a> {
    fn new(locker: &'a Locker, user_key: &str, terms: Terms) -> Result<Self, LockError> {
        let key = LockKey::new(locker.prefix(), user_key)?.with_kind(terms.kind);
        check_kind(&terms, user_key)?;
        let (ttl, wait) = (terms.ttl, terms.wait);
        let start = Instant::now();
        // A wait too large to add to the clock is no limit at all.
        let deadline = match wait {
            Wait::For(d) => start.checked_add(d),
            Wait::Forever => None,
        };
        // A caller that may wait joins the lock's cross-process queue on its first failed
        // attempt; a release then hands it the lock with a short lease that its watchdog (or,
        // for a fixed lease, a confirming attempt) extends: a waiter that died meanwhile
        // blocks the lock only that long, whatever its ttl.
        let queue = (wait != Wait::For(Duration::ZERO)).then(|| Queueing {
            register: REGISTRATION,
            grant_lease: ttl.min(GRANT_LEASE),
        });
        Ok(Acquisition {
            locker,
            key,
            ttl,
            terms,
            start,
            deadline,
            retry_end: deadline.map(|d| d.max(start + MIN_RETRY_WINDOW)),
            token: Token::new(),
            queue,
        })
    }

    /// The lease of a passed-on baton as this caller's, if it suits this caller; `None`: the
    /// lock goes back. Taken at once: the check of the hand-off is out, and tells this holder
    /// `Lost` should it find the lock gone (see `lease::Chain`).
    fn vouched(&self, claimed: &crate::handoff::Claimed<'_>) -> Option<Taken> {
        let baton = claimed.1.as_ref()?;
        let safety = self.locker.settings().safety_margin;
        if !self.terms.watchdog
            || baton.ttl != self.ttl
            || !baton.fresh(safety)
            || baton.chain.failed()
        {
            return None;
        }
        Some(Taken {
            fence: baton.counter,
            sent: baton.sent,
            lease: baton.lease,
            local: baton.local,
        })
    }

    async fn run(self) -> Result<LockGuard, LockError> {
        let entry = self.locker.inner.notifier.entry(&self.key.tag);
        if self.key.kind.is_shared() {
            return self.run_shared(entry).await;
        }
        if entry.shared_by(Owner::current()) {
            // This task reads the key through a guard: a write would wait for itself.
            return Err(LockError::HeldByThisTask {
                key: self.key.user.to_string(),
            });
        }
        let turn = Some(self.take_turn(&entry).await?);
        // In the same poll that gave this caller the turn: a lease its predecessor passed on.
        if let Some(baton) = entry.take_baton() {
            let mut claimed = crate::handoff::Claimed(self.locker, Some(baton));
            if let Some(taken) = self.vouched(&claimed) {
                let baton = claimed.1.take().expect("kept until here");
                crate::metrics::local_handoff();
                let chain = Some(baton.chain.clone());
                return Ok(self.make_guard(entry, turn, taken, baton.token, chain));
            }
            // A fixed lease (which must run its own ttl), another ttl, too little lease left,
            // or a check that found the lock gone: the lock goes back to Redis (dropping `claimed`
            // releases it there), and this caller asks for it there like any other.
        }
        self.take_in_backend(entry, turn).await
    }

    /// A read share or a permit: no local turn (holders share the key) and no local hand-off;
    /// the key's queue in the backend keeps the order, also among this locker's callers.
    async fn run_shared(self, entry: EntryHandle) -> Result<LockGuard, LockError> {
        if self.key.kind == LockKind::Read && entry.held_by(Owner::current()) {
            // This task holds the write lock through a guard: a read would wait for itself.
            return Err(LockError::HeldByThisTask {
                key: self.key.user.to_string(),
            });
        }
        self.take_in_backend(entry, None).await
    }

    /// Steps 2 to 4: attempt, wait, hold.
    async fn take_in_backend(
        self,
        entry: EntryHandle,
        turn: Option<OwnedSemaphorePermit>,
    ) -> Result<LockGuard, LockError> {
        let mut pending = Pending {
            locker: self.locker,
            key: &self.key,
            token: self.token,
            bound: REGISTRATION.max(self.ttl),
            armed: false,
        };
        let mut seen = Seen::default();
        let taken = match self.attempt(&mut pending, &mut seen).await? {
            Some(t) => t,
            None if self.expired() => return Err(self.timeout("busy")),
            None => self.wait_for_lock(&entry, &mut pending, &mut seen).await?,
        };
        pending.armed = false;
        Ok(self.make_guard(entry, turn, taken, self.token, None))
    }

    /// Step 1: this locker's FIFO turn for the key.
    async fn take_turn(&self, entry: &EntryHandle) -> Result<OwnedSemaphorePermit, LockError> {
        let turn = entry.turn();
        if let Ok(p) = turn.clone().try_acquire_owned() {
            return Ok(p);
        }
        if entry.held_by(Owner::current()) {
            return Err(LockError::HeldByThisTask {
                key: self.key.user.to_string(),
            });
        }
        // Queued before counted: a caller seen waiting is one a releasing holder passes to.
        let spot = QueueSpot::new(self.locker, entry);
        let _waiting = self.counted();
        let permit = within(self.deadline, turn.acquire_owned()).await;
        match permit {
            Some(Ok(p)) => {
                spot.served();
                Ok(p)
            }
            // Turn semaphores are never closed; a closed one reads as a timeout.
            Some(Err(_)) | None => Err(self.timeout("queued behind this locker's callers")),
        }
    }

    /// Step 2: one attempt, retried while its outcome is unknown. `Ok(None)`: busy (what the
    /// attempt saw is in `seen`).
    async fn attempt(
        &self,
        pending: &mut Pending<'_>,
        seen: &mut Seen,
    ) -> Result<Option<Taken>, LockError> {
        let mut backoff = self.backoff();
        // Waiting for an unreachable server (`retry_unreachable`): a try per 200 ms at most,
        // until the wait ends; with `wait_forever`, until the server answers.
        let mut down = Backoff::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
            u32::MAX,
        );
        if let Some(end) = self.retry_end {
            down = down.until(end);
        }
        let mut late = 0;
        let mut pruning = 0;
        // A try whose outcome is unknown may still land later (held up in the network).
        let mut uncertain = false;
        loop {
            let sent = Instant::now();
            let armed_before = pending.armed;
            pending.armed = true;
            let res = self
                .locker
                .backend()
                .acquire(&self.key, &self.token, self.ttl, self.queue)
                .await;
            match res {
                Ok(Attempt::Acquired { fence }) => {
                    if let Some(taken) = self.in_time(fence, sent, &mut late)? {
                        return Ok(Some(taken));
                    }
                }
                // Free, with lapsed registrations still ahead of the queue's head: drop the next
                // batch at once.
                Ok(Attempt::Pruning) if pruning < MAX_PRUNING => pruning += 1,
                Ok(attempt @ (Attempt::Held { .. } | Attempt::Pruning)) => {
                    let (pttl, counter) = match attempt {
                        Attempt::Held { pttl, counter } => (pttl, counter),
                        _ => (None, None),
                    };
                    // Nothing of ours is left in Redis but a queue place, if we took one, and
                    // whatever an earlier try still in the network may take when it lands.
                    pending.armed = self.queue.is_some() || uncertain;
                    *seen = Seen {
                        sent: Some(sent),
                        pttl,
                        counter,
                    };
                    return Ok(None);
                }
                Ok(Attempt::Conflict { found }) => {
                    pending.armed = self.queue.is_some() || uncertain;
                    return Err(kind_conflict(&self.key, found));
                }
                // This try was not sent: it fails the call at once unless the caller would
                // rather wait for the server (then until its wait ends, as for a busy lock),
                // and leaves to clean up only what earlier tries may have left.
                Err(e) if e.is_unreachable() => {
                    pending.armed = armed_before || uncertain;
                    if !(self.terms.retry_unreachable && down.retry(&e).await) {
                        return Err(self.failed(e));
                    }
                }
                Err(e) if backoff.retry(&e).await => uncertain = true,
                Err(e) => return Err(self.failed(e)),
            }
        }
    }

    /// The lock an attempt sent at `sent` took, if its reply came in time to use it. Ours
    /// but too late: `None`, and the next attempt (same token) extends it with a fresh send
    /// time or tells us it is gone; after [`MAX_LATE`] in a row, or past the wait, the error.
    fn in_time(
        &self,
        fence: u64,
        sent: Instant,
        late: &mut u32,
    ) -> Result<Option<Taken>, LockError> {
        let taken = Taken {
            fence,
            sent,
            lease: self.ttl,
            local: 0,
        };
        if self.fresh(&taken) {
            return Ok(Some(taken));
        }
        *late += 1;
        if *late >= MAX_LATE || self.retry_end.is_some_and(|e| Instant::now() >= e) {
            return Err(self.too_late());
        }
        Ok(None)
    }

    /// Retries of one attempt: a few, and none starting after the wait.
    fn backoff(&self) -> Backoff {
        let backoff =
            |tries| Backoff::new(Duration::from_millis(10), Duration::from_millis(200), tries);
        match self.retry_end {
            Some(end) => backoff(ATTEMPT_RETRIES_WITHIN_WAIT).until(end),
            None => backoff(ATTEMPT_RETRIES),
        }
    }

    fn failed(&self, e: BackendError) -> LockError {
        crate::metrics::acquire_failed(self.terms.site);
        if e.is_unreachable() {
            // The outage itself is logged once per interval, not once per call.
            tracing::debug!(key = ?&*self.key.user, error = %e, "acquire failed");
        } else {
            tracing::warn!(key = ?&*self.key.user, error = %e, "acquire failed");
        }
        e.into()
    }

    /// Step 3: listen for releases, retry on each, take a grant when one comes.
    async fn wait_for_lock(
        &self,
        entry: &EntryHandle,
        pending: &mut Pending<'_>,
        seen: &mut Seen,
    ) -> Result<Taken, LockError> {
        let _waiting = self.counted();
        let listener = within(self.deadline, entry.listen())
            .await
            .ok_or_else(|| self.timeout("busy"))??;
        // Subscribed now: retry at once, then after every release message (or fallback).
        let mut woken: Option<Instant> = None;
        let handed = |taken: Taken, woken: Option<Instant>| {
            if let Some(w) = woken {
                crate::metrics::handoff(w.elapsed());
            }
            taken
        };
        loop {
            let notified = listener.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(taken) = self.usable_grant(&listener, seen) {
                return Ok(handed(taken, woken));
            }
            if let Some(taken) = self.attempt(pending, seen).await? {
                return Ok(handed(taken, woken));
            }
            if self.expired() {
                return Err(self.timeout("busy"));
            }
            // Fallback in case a message is lost: when the holder's lease runs out, and
            // often enough to keep the queue registration fresh.
            let fallback = seen.pttl.map_or(REGISTRATION / 2, |p| {
                (p + Duration::from_millis(1)).min(REGISTRATION / 2)
            });
            let mut until = Instant::now() + fallback;
            if let Some(d) = self.deadline {
                until = until.min(d);
            }
            woken = tokio::select! {
                () = &mut notified => Some(Instant::now()),
                () = tokio::time::sleep_until(until) => None,
            };
        }
    }

    /// A grant to this waiter that can be used as it is: newer than every fence the latest
    /// busy attempt could have seen, and with enough of its lease left counted from when it
    /// was granted (see [`granted_at`]). Anything else is confirmed by the next attempt, and
    /// so is every grant the release's write alone does not make usable: under
    /// `sync_replicas` (a release is not acknowledged by replicas; the attempt is), and a
    /// fixed lease longer than the grant lease (the attempt gives it the full ttl).
    fn usable_grant(&self, listener: &Listener<'_>, seen: &Seen) -> Option<Taken> {
        let grant = listener.take_grant(self.token.as_str())?;
        let lease = self.queue.map_or(self.ttl, |q| q.grant_lease);
        let confirm =
            self.locker.backend().acknowledged_only() || (!self.terms.watchdog && lease < self.ttl);
        if confirm {
            return None;
        }
        let taken = Taken {
            fence: grant.fence,
            sent: granted_at(seen.sent?, &grant),
            lease,
            local: 0,
        };
        (seen.counter.is_some_and(|c| grant.fence > c) && self.fresh(&taken)).then_some(taken)
    }

    /// Step 4: the lease to the monitor, the guard to the caller.
    fn make_guard(
        &self,
        entry: EntryHandle,
        turn: Option<OwnedSemaphorePermit>,
        taken: Taken,
        token: Token,
        chain: Option<Arc<Chain>>,
    ) -> LockGuard {
        let settings = self.locker.settings();
        let info = Arc::new(LeaseInfo::new(
            NewLease {
                id: self.locker.next_lease_id(),
                key: self.key.clone(),
                token,
                ttl: self.ttl,
                watchdog: self.terms.watchdog,
                safety: settings.safety_margin,
                max_hold: self.terms.max_hold,
                min_hold: self.terms.min_hold,
                sent: taken.sent,
                lease: taken.lease,
                counter: taken.fence,
                local: taken.local,
                chain,
                site: self.terms.site,
            },
            turn,
        ));
        if taken.local > 0 {
            // The chain's checks tell this holder should they find the lock gone (at once, if
            // one already did).
            info.chain().adopt(&info);
        }
        let monitor = self.locker.monitor();
        let watched = monitor
            .as_ref()
            .is_some_and(|m| m.add(info.clone(), taken.sent, taken.lease));
        if !watched {
            // Nobody can renew it (no runtime left): don't pretend to hold.
            info.end_by_shutdown();
        }
        if self.key.kind == LockKind::Read {
            // For the check that refuses this task a write of what it reads.
            entry.add_sharer(Owner::current(), &info);
        } else if !self.key.kind.is_shared() {
            // For a guard's HeldByThisTask check and the local hand-off: the one holder.
            entry.set_holder(Owner::current(), &info);
        }
        self.locker.note_held();
        crate::metrics::acquired(self.start.elapsed(), self.key.kind, self.terms.site);
        tracing::debug!(
            key = ?&*self.key.user,
            fence = info.fence(),
            waited_ms = self.start.elapsed().as_millis() as u64,
            outcome = if taken.local > 0 { "handed over locally" } else { "acquired" },
            "acquire"
        );
        let monitor = monitor.unwrap_or_else(|| Arc::new(crate::monitor::Monitor::closed()));
        LockGuard::new(self.locker.clone(), monitor, info, entry)
    }

    /// Whether a lock taken like this still has at least the safety margin left before its
    /// local deadline.
    fn fresh(&self, t: &Taken) -> bool {
        crate::lease::fresh(t.sent, t.lease, self.locker.settings().safety_margin)
    }

    fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// Counts this caller as waiting, unless its lock was expected busy (a job's claim, which
    /// every idle instance waits for all tick long).
    fn counted(&self) -> Option<Counted<'_>> {
        (!self.terms.busy_expected).then(|| Counted::new(&self.locker.inner.waiting))
    }

    fn timeout(&self, why: &str) -> LockError {
        // A busy lock that was expected (a job's claim) is no timeout an operator watches.
        if !self.terms.busy_expected {
            crate::metrics::timed_out(self.terms.site);
        }
        let waited_ms = self.start.elapsed().as_millis() as u64;
        if self.terms.wait == Wait::For(Duration::ZERO) || self.terms.busy_expected {
            // One attempt that found the lock busy: what a fleet of job instances does each
            // tick, not worth a line at INFO.
            tracing::debug!(key = ?&*self.key.user, why, "lock busy (wait 0s)");
        } else {
            // INFO: a busy lock is an ordinary outcome, but one an operator wants to see.
            tracing::info!(key = ?&*self.key.user, waited_ms, why, "lock wait elapsed");
        }
        LockError::Timeout {
            key: self.key.user.to_string(),
            waited: self.start.elapsed(),
        }
    }

    fn too_late(&self) -> LockError {
        BackendError::new(
            self.locker.backend().addr(),
            format!(
                "replies took so long that less than the safety margin of the {}ms lease was \
                 left; raise `ttl` or check the network and the server's load",
                self.ttl.as_millis()
            ),
        )
        .into()
    }
}
