//! A held lease as a guard and the lease monitor (`monitor.rs`) share it, and how a lease ends.
//!
//! Each lease has a local deadline on the monotonic clock: the send time of the last successful
//! acquire or renewal, plus the lease, minus a safety margin. The server cannot have expired the
//! lock before that instant, so declaring loss there is never late, even when Redis is
//! unreachable. The deadline lives in [`LeaseInfo`], so a guard compares it synchronously
//! ([`LeaseInfo::is_lost`]) and never reports "held" past it, even when the monitor has not run
//! (a blocked thread).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::backend::contract::{Found, Released, Renewal, Token, holder_fence};
use crate::error::{BackendError, LockError, LossCause};
use crate::key::LockKey;
use crate::retry::Backoff;

/// Retries of a release whose outcome is unknown (timeout, reset) or that a Cluster redirected
/// past redis-rs's own retries: with pauses doubling from 10 ms to 200 ms they span about
/// half a second, longer than a slot migration's redirections usually last (three retries,
/// 70 ms, left a release failing mid-migration).
const RELEASE_RETRIES: u32 = 6;

/// The backoff of a release and of a hand-off's owner check (which is retried like one).
pub(crate) fn release_backoff() -> Backoff {
    Backoff::new(
        Duration::from_millis(10),
        Duration::from_millis(200),
        RELEASE_RETRIES,
    )
}

/// Retries of a request a cluster slot in migration (or failover) refuses, until `until`.
pub(crate) fn while_migrating(until: Instant) -> Backoff {
    Backoff::new(Duration::from_millis(20), Duration::from_millis(250), 1024).until(until)
}

/// What a guard and the monitor share about one lease.
#[derive(Debug)]
pub(crate) struct LeaseInfo {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    /// The locker's safety margin (see [`margin`]).
    pub(crate) safety: Duration,
    /// No renewal after this (`max_hold`, counted from `acquired_at`).
    pub(crate) hold_until: Option<Instant>,
    /// When the lock was taken (the reply's arrival), for the hold-time metric.
    pub(crate) acquired_at: Instant,
    /// The metrics label of the lock site that took it.
    pub(crate) site: &'static str,
    /// A release before this keeps the lock until then (`min_hold`).
    pub(crate) keep_until: Option<Instant>,
    /// Set after the lock was taken: kept until then by any release, shutdown's too (a
    /// scheduled job's tick marked done, see [`keep_after`](Self::keep_after)).
    kept_after: OnceLock<Instant>,
    /// Released without keeping (`min_hold` forgone): the lock of an acquisition given back
    /// before any body ran.
    unkept: std::sync::atomic::AtomicBool,
    /// Cancelled when the lease is lost or released: nothing may rely on it after that.
    pub(crate) lost: CancellationToken,
    /// Released by `Locker::shutdown`: the guard's own release has nothing left to do.
    pub(crate) released: std::sync::atomic::AtomicBool,
    /// The loss was logged and counted (once, by whoever found it first).
    loss_reported: std::sync::atomic::AtomicBool,
    /// Why the lease was lost or ended early: the first cause found.
    cause: OnceLock<LossCause>,
    /// The local deadline; moved forward by each successful renewal.
    deadline: Mutex<Instant>,
    /// The holder's place in its locker's queue for the key: given up at loss, so local
    /// waiters don't queue behind a lock nobody holds.
    pub(crate) turn: Mutex<Option<OwnedSemaphorePermit>>,
    /// The fencing counter's value when the lock was taken from the backend.
    pub(crate) counter: u64,
    /// How many local hand-offs since then led to this holder (0: it took the lock itself).
    pub(crate) local: u32,
    /// Send time and lease of the latest acquire or renewal that succeeded: what a local
    /// successor's lease runs from.
    renewed: Mutex<(Instant, Duration)>,
    /// Shared by the holders the lock was passed between in the process; made when the lease
    /// is first passed on (most never are: no allocation for them).
    chain: OnceLock<Arc<Chain>>,
}

/// The holders one lease is passed between in the process (local hand-off), and the owner
/// checks that cover them. A holder the lease is passed to starts at once; the check sent with
/// the hand-off (an owner-checked renewal; at most one out per lease: hand-offs made while one
/// is out are covered by the next, sent when it returns) proves the lock was still the lease's
/// when it was sent, so every section that ended before then held throughout. A passing
/// holder's success waits for the check that covers its end (`handoff::confirm`); a check that
/// finds the lock gone tells every section not yet covered `Lost`, the one running included.
/// The lock is released in the backend only once no check is out, so a check never finds it
/// released by a later holder of the same lease and reports a loss that was none.
#[derive(Debug, Default)]
pub(crate) struct Chain {
    pending: AtomicUsize,
    idle: Notify,
    state: Mutex<ChainState>,
    changed: Notify,
}

/// The hand-offs of a [`Chain`] and what its checks found so far.
#[derive(Debug, Default)]
struct ChainState {
    /// The latest hand-off made: the place in the run of the holder it went to.
    passed: u32,
    /// The latest hand-off that a check sent after it found still the lease's: the sections
    /// before that place ended covered.
    covered: u32,
    /// A check is out (or about to go).
    checking: bool,
    /// A check found the lock gone (`Ok`, the cause the uncovered sections are told) or could
    /// not tell (`Err`): no hand-off after it, no section past `covered` succeeds.
    failed: Option<Result<LossCause, BackendError>>,
    /// The holder of the lease now, told of a loss a check finds.
    holder: Option<Weak<LeaseInfo>>,
}

/// What a passing holder learns of the check that covers its end (see [`Chain::settled`]).
pub(crate) type Covered = Result<(), Result<LossCause, BackendError>>;

/// Longest wait for a chain's checks before a release goes ahead anyway (a check is bounded
/// by the response timeout; past this a loss may be reported that was none, never the reverse).
const CHAIN_WAIT: Duration = Duration::from_secs(3);

/// Longest wait of a passing holder for the check covering its end: the checks are bounded
/// themselves (retries of the response timeout, one round per hand-off), this only keeps
/// the wait bounded whatever happens to them.
const SETTLE_WAIT: Duration = Duration::from_secs(60);

impl Chain {
    fn state(&self) -> std::sync::MutexGuard<'_, ChainState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more check under way until the returned value is dropped.
    pub(crate) fn checking(self: &Arc<Self>) -> ChainCheck {
        self.pending.fetch_add(1, Ordering::AcqRel);
        ChainCheck(self.clone())
    }

    /// The lease is being passed to place `to` in the run: `true` when no check is out, and
    /// the caller sends one now (the one out otherwise covers this hand-off next round).
    /// `None`: a check failed, the lease is not passed on.
    pub(crate) fn pass(&self, to: u32) -> Option<bool> {
        let mut st = self.state();
        if st.failed.is_some() {
            return None;
        }
        st.passed = st.passed.max(to);
        let send = !st.checking;
        st.checking = true;
        Some(send)
    }

    /// A check failed: nothing more is passed on or taken.
    pub(crate) fn failed(&self) -> bool {
        self.state().failed.is_some()
    }

    /// `info` holds the lease now; told at once when a check already found the lock gone.
    pub(crate) fn adopt(&self, info: &Arc<LeaseInfo>) {
        let mut st = self.state();
        if let Some(Ok(cause)) = st.failed {
            drop(st);
            declare_lost(info, cause);
            return;
        }
        st.holder = Some(Arc::downgrade(info));
    }

    /// The check sent at `sent` for the hand-off to place `to` found `found` (a lease of
    /// `lease` renewed from `sent` when still the lease's). The place of the next check to
    /// send, when hand-offs were made since this one went out.
    pub(crate) fn checked(
        &self,
        to: u32,
        sent: Instant,
        lease: Duration,
        found: Result<Found, BackendError>,
    ) -> Option<u32> {
        let mut st = self.state();
        let holder = st.holder.as_ref().and_then(Weak::upgrade);
        let mut told = None;
        let next = match found {
            Ok(Found::Renewed) => {
                st.covered = st.covered.max(to);
                if let Some(h) = &holder {
                    // The check renewed the lock for whoever holds the lease now.
                    h.extend(sent, lease);
                }
                (st.passed > to).then_some(st.passed)
            }
            Ok(gone) => {
                let cause = match gone {
                    Found::Forced => LossCause::ForceUnlocked,
                    _ => LossCause::HandOffCheck,
                };
                st.failed = Some(Ok(cause));
                told = holder.map(|h| (h, cause));
                None
            }
            Err(e) => {
                // Could not tell: the sections it was to cover, the running one included, cannot
                // be vouched for (another may hold the lock): a loss, never a success.
                st.failed = Some(Err(e));
                told = holder.map(|h| (h, LossCause::HandOffCheck));
                None
            }
        };
        st.checking = next.is_some();
        drop(st);
        // Not a holder whose lease already ended (released, its outcome told).
        if let Some((h, cause)) = told.filter(|(h, _)| !h.lost.is_cancelled()) {
            declare_lost(&h, cause);
        }
        self.changed.notify_waiters();
        next
    }

    /// The holder at place `at` released the lock in the backend and found it its own: that
    /// covers every section up to its end, as a check sent then would (a check still out that
    /// then finds the lock gone, released, tells nobody before it a loss that was none).
    pub(crate) fn proven(&self, at: u32) {
        let mut st = self.state();
        st.covered = st.covered.max(at.saturating_add(1));
        drop(st);
        self.changed.notify_waiters();
    }

    /// Whether a check found the lock still the lease's after the hand-off to place `at`.
    pub(crate) fn covers_start(&self, at: u32) -> bool {
        self.state().covered >= at
    }

    /// Waits (bounded) for the check that covers the end of the section at place `at` (the
    /// hand-off to `at + 1`): `Ok` when it found the lock still the lease's, else what it
    /// found.
    pub(crate) async fn settled(&self, at: u32) -> Covered {
        let until = Instant::now() + SETTLE_WAIT;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let st = self.state();
                if st.covered > at {
                    return Ok(());
                }
                if let Some(f) = &st.failed {
                    return Err(f.clone());
                }
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return Err(Err(BackendError::new(
                    "local hand-off",
                    "the owner check of the hand-off did not end in time",
                )));
            }
        }
    }

    /// Waits (bounded) until no check is under way.
    pub(crate) async fn idle(&self) {
        let until = Instant::now() + CHAIN_WAIT;
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.pending.load(Ordering::Acquire) == 0 {
                return;
            }
            if tokio::time::timeout_at(until, idle).await.is_err() {
                return;
            }
        }
    }
}

/// A check of a [`Chain`] under way.
pub(crate) struct ChainCheck(Arc<Chain>);

impl Drop for ChainCheck {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A held lease passed from one holder of a locker to the next caller of the same locker
/// waiting for the key (local hand-off): the lock stays taken in the backend, by this token.
#[derive(Debug)]
pub(crate) struct Baton {
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) counter: u64,
    /// The local hand-offs so far, this one included.
    pub(crate) local: u32,
    /// The lease in the backend, as in [`LeaseInfo`]'s `renewed`.
    pub(crate) sent: Instant,
    pub(crate) lease: Duration,
    /// The ttl its renewals use: only a caller with the same ttl takes it, so a renewal of
    /// the predecessor landing late can never shorten the lock below the successor's deadline.
    pub(crate) ttl: Duration,
    pub(crate) chain: Arc<Chain>,
}

impl Baton {
    /// Whether it is hand-off `local` of the lock taken at `counter`.
    pub(crate) fn is(&self, counter: u64, local: u32) -> bool {
        self.counter == counter && self.local == local
    }

    /// Whether the lease it carries has at least the safety margin left (the rule every lock
    /// handed out follows).
    pub(crate) fn fresh(&self, safety: Duration) -> bool {
        fresh(self.sent, self.lease, safety)
    }
}

/// Whether a lease of `lease` counted from `sent` has at least the safety margin left before
/// its local deadline: the rule every lock handed out follows.
pub(crate) fn fresh(sent: Instant, lease: Duration, safety: Duration) -> bool {
    let m = margin(lease, safety);
    Instant::now() + m <= sent + (lease - m)
}

/// How a new lease is described to [`LeaseInfo::new`].
pub(crate) struct NewLease {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    pub(crate) safety: Duration,
    pub(crate) max_hold: Option<Duration>,
    /// `min_hold`, counted from when the reply arrived (no earlier than the server took it).
    pub(crate) min_hold: Option<Duration>,
    /// Send time of the request that took the lock, and the lease it took it for.
    pub(crate) sent: Instant,
    pub(crate) lease: Duration,
    /// The fencing counter's value when the lock was taken, and the local hand-offs since.
    pub(crate) counter: u64,
    pub(crate) local: u32,
    /// The chain of a lease passed on; `None` for a lock taken from the backend.
    pub(crate) chain: Option<Arc<Chain>>,
    pub(crate) site: &'static str,
}

impl LeaseInfo {
    pub(crate) fn new(n: NewLease, turn: Option<OwnedSemaphorePermit>) -> LeaseInfo {
        // `max_hold` counts from when this process learned it holds the lock, not from the
        // request's send time (for a hand-over, a waiter's attempt long before it): a guard
        // is never born past its `max_hold`.
        let acquired_at = Instant::now();
        let hold_until = n.max_hold.and_then(|h| acquired_at.checked_add(h));
        LeaseInfo {
            id: n.id,
            key: n.key,
            token: n.token,
            ttl: n.ttl,
            watchdog: n.watchdog,
            safety: n.safety,
            hold_until,
            acquired_at,
            site: n.site,
            keep_until: n.min_hold.and_then(|h| Instant::now().checked_add(h)),
            kept_after: OnceLock::new(),
            unkept: std::sync::atomic::AtomicBool::new(false),
            lost: CancellationToken::new(),
            released: std::sync::atomic::AtomicBool::new(false),
            loss_reported: std::sync::atomic::AtomicBool::new(false),
            cause: OnceLock::new(),
            deadline: Mutex::new(deadline_of(n.sent, n.lease, n.safety, hold_until)),
            turn: Mutex::new(turn),
            counter: n.counter,
            local: n.local,
            renewed: Mutex::new((n.sent, n.lease)),
            chain: n.chain.map_or_else(OnceLock::new, OnceLock::from),
        }
    }

    /// A renewal of this lease to `lease`; `passed_to`: the check of a local hand-off to that
    /// place in the run.
    pub(crate) fn renewal(&self, lease: Duration, passed_to: Option<u32>) -> Renewal<'_> {
        Renewal {
            key: &self.key,
            token: &self.token,
            counter: self.counter,
            lease,
            passed_to,
        }
    }

    /// The chain of holders this lease was passed between, if it was.
    pub(crate) fn passed_chain(&self) -> Option<&Arc<Chain>> {
        self.chain.get()
    }

    /// The chain of holders this lease is passed between (made on first use).
    pub(crate) fn chain(&self) -> &Arc<Chain> {
        self.chain.get_or_init(Arc::default)
    }

    /// This holder's fencing token (see [`holder_fence`]).
    pub(crate) fn fence(&self) -> u64 {
        holder_fence(self.counter, self.local)
    }

    /// The lease as it stands in the backend, for the next local holder.
    pub(crate) fn baton(&self) -> Baton {
        let (sent, lease) = *self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        Baton {
            key: self.key.clone(),
            token: self.token,
            counter: self.counter,
            local: self.local + 1,
            sent,
            lease,
            ttl: self.ttl,
            chain: self.chain().clone(),
        }
    }

    /// The local deadline now.
    pub(crate) fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn extend(&self, sent: Instant, lease: Duration) {
        let d = deadline_of(sent, lease, self.safety, self.hold_until);
        let mut cur = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        *cur = (*cur).max(d);
        let mut renewed = self.renewed.lock().unwrap_or_else(|p| p.into_inner());
        if sent >= renewed.0 {
            *renewed = (sent, lease);
        }
    }

    /// Lost, released, or past the local deadline: checked on the caller's clock, without
    /// waiting for the monitor to run.
    pub(crate) fn is_lost(&self) -> bool {
        self.lost.is_cancelled() || Instant::now() >= self.deadline()
    }

    /// Resolves once [`is_lost`](Self::is_lost) holds.
    pub(crate) async fn lost(&self) {
        // Bounded: each round waits for the deadline, which only moves with a renewal.
        loop {
            if self.is_lost() {
                return;
            }
            tokio::select! {
                () = self.lost.cancelled() => return,
                () = tokio::time::sleep_until(self.deadline()) => {}
            }
        }
    }

    /// Gives up the local turn (idempotent).
    pub(crate) fn leave_turn(&self) {
        drop(self.turn.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// The margin taken off every deadline: covers clock-rate differences between this host and
/// the server and the time a loss takes to act on. The locker's safety margin, or a twentieth
/// of the lease if that is larger, but never more than a quarter of the lease (the renewal at
/// a third must come before the deadline, with room for its round trip).
pub(crate) fn margin(lease: Duration, safety: Duration) -> Duration {
    safety.max(lease / 20).min(lease / 4)
}

fn deadline_of(
    sent: Instant,
    lease: Duration,
    safety: Duration,
    hold_until: Option<Instant>,
) -> Instant {
    let d = sent + (lease - margin(lease, safety));
    hold_until.map_or(d, |h| d.min(h))
}

/// Marks the lease lost; the first to find a lease lost (the monitor, a release, shutdown)
/// logs it at WARN and counts it, so operators see every loss exactly once.
pub(crate) fn declare_lost(info: &LeaseInfo, cause: LossCause) {
    let _ = info.cause.set(cause);
    if !info
        .loss_reported
        .swap(true, std::sync::atomic::Ordering::AcqRel)
    {
        crate::metrics::lost(cause, info.site);
        tracing::warn!(key = ?&*info.key.user, cause = %cause, "lock lost");
    }
    info.lost.cancel();
    info.leave_turn();
}

impl LeaseInfo {
    /// From now on, whatever releases this lease (its guard, shutdown, a drop) keeps the lock
    /// taken on the server until `until`, owner-checked, as `min_hold` does. Once.
    pub(crate) fn keep_after(&self, until: Instant) {
        let _ = self.kept_after.set(until);
    }

    /// Until when a release keeps the lock: the later of `min_hold`'s end and
    /// [`keep_after`](Self::keep_after)'s.
    pub(crate) fn kept_until(&self) -> Option<Instant> {
        if self.unkept.load(Ordering::Acquire) {
            return None;
        }
        self.keep_until.max(self.kept_after.get().copied())
    }

    /// Whatever releases this lease from now on frees the lock at once, `min_hold` or not:
    /// for a lock taken by an acquisition that failed before any body ran.
    pub(crate) fn forgo_keep(&self) {
        self.unkept.store(true, Ordering::Release);
    }

    /// Ends the lease because the locker shuts down or its runtime is gone: nothing renews it
    /// any more. Not a loss to report; sections end with [`LossCause::ShutDown`].
    pub(crate) fn end_by_shutdown(&self) {
        let _ = self.cause.set(LossCause::ShutDown);
        self.lost.cancel();
    }

    /// Why the lease counts as lost at `now` because its local deadline has passed, if it has:
    /// `max_hold` reached, a fixed lease (`watchdog = false`) run out, or no renewal in time.
    pub(crate) fn past_deadline(&self, now: Instant) -> Option<LossCause> {
        if self.deadline() > now {
            None
        } else if self.hold_until.is_some_and(|h| h <= now) {
            Some(LossCause::MaxHold)
        } else if self.watchdog {
            Some(LossCause::Unreachable)
        } else {
            Some(LossCause::Expired)
        }
    }

    /// Why the lease was lost: the first cause found ([`LossCause::Expired`] when none was
    /// recorded, e.g. a release that found another owner).
    pub(crate) fn loss_cause(&self) -> LossCause {
        self.cause.get().copied().unwrap_or(LossCause::Expired)
    }

    /// [`loss_cause`](Self::loss_cause) for a lease found lost now: one whose local deadline
    /// passed before anyone declared it lost is declared so here (counted and logged once,
    /// with the same cause the monitor would give).
    pub(crate) fn loss_cause_now(&self) -> LossCause {
        if self.cause.get().is_none()
            && let Some(cause) = self.past_deadline(Instant::now())
        {
            declare_lost(self, cause);
        }
        self.loss_cause()
    }

    /// The error of a section or release that found this lease lost.
    pub(crate) fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.key.user.to_string(),
            cause: self.loss_cause_now(),
        }
    }
}

/// Ends a lease in Redis: with `min_hold` not yet reached the lock is kept (owner-checked)
/// until then, otherwise released by token; both leave a proof and are retried a few times
/// when their outcome is unknown. Success only when this token's own release provably
/// happened: a retry finds the proof its first try left, and "not ours" without it is
/// `NotOwner` (the lock expired, was force-unlocked, or the server restarted: another owner
/// may have held it meanwhile).
/// Used by a guard's release and by `Locker::shutdown`; `keep_until` is the lease's
/// `min_hold` end, or another a caller chose ([`LockGuard::release_keeping`](crate::LockGuard)).
pub(crate) async fn end_lease(
    backend: &Backend,
    info: &LeaseInfo,
    keep_until: Option<Instant>,
) -> Result<Released, BackendError> {
    if info.released.load(Ordering::Acquire) {
        return Ok(Released::Freed);
    }
    if let Some(chain) = info.chain.get() {
        chain.idle().await;
    }
    let mut backoff = release_backoff();
    // A slot in migration refuses the release until the migration ends (seconds): retried
    // until it lands or the lease would have ended anyway, so the lock and its queue's next
    // holder never wait for the lease.
    let mut moving = while_migrating(info.deadline());
    let keep_until = keep_until.filter(|k| *k > Instant::now());
    loop {
        let keep = keep_until
            .map(|k| k.saturating_duration_since(Instant::now()))
            .filter(|d| !d.is_zero());
        match backend
            .release(&info.key, &info.token, info.counter, keep)
            .await
        {
            Err(e) if e.is_migrating() && moving.retry(&e).await => {}
            Err(e) if backoff.retry(&e).await => {}
            res => return res,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::sync::Semaphore;

    pub(crate) const SAFETY: Duration = Duration::from_millis(50);

    /// A lease on `key` with `token`, taken now for `ttl`.
    pub(crate) fn lease(
        id: u64,
        key: LockKey,
        token: Token,
        ttl: Duration,
        max_hold: Option<Duration>,
    ) -> Arc<LeaseInfo> {
        let turn = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let lease = NewLease {
            id,
            key,
            token,
            ttl,
            watchdog: true,
            safety: SAFETY,
            max_hold,
            min_hold: None,
            sent: Instant::now(),
            lease: ttl,
            counter: 1,
            local: 0,
            chain: None,
            site: crate::options::UNNAMED_SITE,
        };
        Arc::new(LeaseInfo::new(lease, Some(turn)))
    }

    #[test]
    fn margin_is_the_setting_within_a_twentieth_and_a_quarter() {
        let ms = Duration::from_millis;
        assert_eq!(margin(ms(30_000), ms(100)), ms(1500));
        assert_eq!(margin(ms(1000), ms(100)), ms(100));
        assert_eq!(margin(ms(200), ms(100)), ms(50));
    }

    #[tokio::test(start_paused = true)]
    async fn deadline_is_send_time_plus_lease_minus_margin() {
        let ttl = Duration::from_secs(3);
        let sent = Instant::now();
        let info = lease(
            1,
            LockKey::new("lock:", "k").unwrap(),
            Token::new(),
            ttl,
            None,
        );
        assert_eq!(info.deadline(), sent + ttl - margin(ttl, SAFETY));
        tokio::time::advance(ttl - margin(ttl, SAFETY) - Duration::from_millis(1)).await;
        assert!(!info.is_lost());
        tokio::time::advance(Duration::from_millis(1)).await;
        // No monitor ran: the guard still knows on its own.
        assert!(
            info.is_lost(),
            "past the deadline reads as lost synchronously"
        );
    }
}
