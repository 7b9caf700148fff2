//! Local hand-off (`LockerBuilder::local_handoff`): a holder whose section ends while another
//! caller of the same locker waits for the key passes the lease to it in the process. The lock
//! stays taken in the backend by the same owner token; the next holder gets a fence of its own
//! (see `lease::holder_fence`) and its own guard, lease monitoring and limits.
//!
//! The lease travels as a [`Baton`] left in the key's entry, and the key's turn (the locker's
//! one-permit FIFO semaphore) decides who takes it: the holder leaves the baton, then gives up
//! the turn, which goes to the longest-waiting caller; that caller takes the baton in the same
//! poll that gives it the turn. A baton nobody takes is released in the backend: the holder
//! checks once the turn is free after it left the baton, and so does (right after it is gone)
//! every waiter that leaves the queue without the turn, so whichever comes last finds an
//! unclaimed baton and a free turn, whatever the order in which they ran.
//!
//! The next holder starts at once; the owner check covering the passing holder's end goes out
//! at the same moment, and the passing holder's release waits for it (see `lease::Chain`): a
//! lock lost before the hand-off is reported `Lost` to every section since the last good
//! check, within one round trip of the successor's start, never as success.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::contract::{Released, Renewal};
use crate::error::BackendError;
use crate::lease::{Baton, ChainCheck, LeaseInfo, release_backoff};
use crate::locker::Locker;
use crate::renewal::hedge_time;
use crate::wait::EntryHandle;

/// Leaves `info`'s lease for the next caller of `locker` waiting for its key, if one waits
/// and the lease may be passed on: the hand-offs in a row stay within the locker's limit, the
/// lease has the safety margin left, no `min_hold` is pending (nobody may hold the lock before
/// it ends), no check of the lease found it gone and the locker is not shutting down. The
/// owner check covering this holder's end goes out now, unless one is out already (that one
/// sends it when it returns; see [`Chain`](crate::lease::Chain)). The place in the run the
/// lease went to, if it did, and the check to send; the caller then gives up its turn, lets
/// the next holder run, sends the check and calls [`confirm`].
pub(crate) fn pass_on(
    locker: &Locker,
    info: &LeaseInfo,
    entry: &EntryHandle,
) -> Option<(
    u32,
    Option<Check<impl Future<Output = ()> + Send + 'static>>,
)> {
    let limit = locker.settings().local_handoff;
    let pending_min_hold = info.kept_until().is_some_and(|k| k > Instant::now());
    // A shared lease (a read share, a permit) is never passed on: the callers queued on the
    // turn are this locker's writers, which a share must not let in.
    if info.local >= limit
        || info.key.kind.is_shared()
        || entry.queued() == 0
        || pending_min_hold
        || info.is_lost()
        || locker.inner.closing.is_cancelled()
        || info.released.load(std::sync::atomic::Ordering::Acquire)
    {
        return None;
    }
    let baton = info.baton();
    if !baton.fresh(info.safety) {
        return None;
    }
    // The check is sent by a task of the locker: a holder whose release is cancelled leaves
    // the sections after it covered all the same.
    let rt = tokio::runtime::Handle::try_current().ok()?;
    let to = baton.local;
    let chain = info.chain();
    let check = match chain.pass(to)? {
        // Counted before anyone can take the lease: no later holder releases it before the
        // check.
        true => Some(Check {
            task: Some(check_owner(locker.clone(), info, to, chain.checking())),
            locker: locker.clone(),
            rt,
        }),
        false => None,
    };
    entry.put_baton(baton);
    Some((to, check))
}

/// An owner check to send. It is sent when dropped, so a holder whose release is cancelled
/// before it sent the check leaves the sections after it covered all the same.
///
/// The passing holder sends it after the next holder had its first poll: spawning a task
/// wakes an idle worker thread, which on a virtual machine costs 60-200 µs after an idle
/// spell, and the next holder would wait for that (it runs on this thread once the release
/// yields).
pub(crate) struct Check<F: Future<Output = ()> + Send + 'static> {
    task: Option<F>,
    locker: Locker,
    rt: tokio::runtime::Handle,
}

impl<F: Future<Output = ()> + Send + 'static> Drop for Check<F> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.locker.inner.cleanups.spawn_on(task, &self.rt);
        }
    }
}

/// The owner checks of `info`'s lease from the hand-off to place `to` on: one round trip
/// each (an owner-checked renewal, retried like a release whose outcome is unknown, hedged
/// like the monitor's renewals), one more while hand-offs were made during the last, so at
/// most the locker's hand-off limit in all.
fn check_owner(
    locker: Locker,
    info: &LeaseInfo,
    mut to: u32,
    check: ChainCheck,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let (key, token, counter, ttl) = (info.key.clone(), info.token, info.counter, info.ttl);
    let chain = info.chain().clone();
    let deadline = info.deadline();
    let rounds = locker.settings().local_handoff.saturating_add(1);
    async move {
        let _check = check;
        for _ in 0..rounds {
            let renewal = Renewal {
                key: &key,
                token: &token,
                counter,
                lease: ttl,
                passed_to: Some(to),
            };
            let mut backoff = release_backoff();
            let (found, sent) = loop {
                let sent = Instant::now();
                let hedge_at = hedge_time(sent, std::iter::once(deadline.max(sent)));
                let res = locker.backend().renew_hedged(&[renewal], hedge_at).await;
                let found = res.into_iter().next().unwrap_or_else(|| {
                    Err(BackendError::new("local hand-off", "no reply to the check"))
                });
                match found {
                    Err(e) if backoff.retry(&e).await => {}
                    found => break (found, sent),
                }
            };
            match chain.checked(to, sent, ttl, found) {
                Some(next) => to = next,
                None => return,
            }
        }
        let e = BackendError::new("local hand-off", "more checks than hand-offs");
        chain.checked(to, Instant::now(), ttl, Err(e));
    }
}

/// How long a passed-on lease waits to be taken before it is released in the backend: the
/// next holder takes it in the poll that gives it the turn, so only a caller that is not
/// polled (its runtime blocked or gone) leaves it this long.
const CLAIM_WITHIN: Duration = Duration::from_millis(50);

/// What a holder that passed its lease on still does: makes sure a lease nobody takes is
/// released soon (see [`CLAIM_WITHIN`]), and waits for the owner check that covers the end
/// of its section (the next holder started meanwhile). A lock found gone is a loss of this
/// holder, reported as a release would report it (`NotOwner`); the holders after it are told
/// by the check itself.
pub(crate) async fn confirm(
    locker: &Locker,
    info: &LeaseInfo,
    entry: &EntryHandle,
    to: u32,
) -> Result<Released, BackendError> {
    let mut unclaimed = Unclaimed {
        locker,
        entry,
        counter: info.counter,
        local: to,
        by: Instant::now() + CLAIM_WITHIN,
    };
    let chain = info.chain().clone();
    let settled = chain.settled(info.local);
    tokio::pin!(settled);
    let covered = tokio::select! {
        biased;
        res = &mut settled => res,
        () = tokio::time::sleep_until(unclaimed.by) => {
            unclaimed.release_now();
            settled.await
        }
    };
    drop(unclaimed);
    match covered {
        Ok(()) => Ok(Released::HandedOver),
        Err(Ok(cause)) => {
            crate::lease::declare_lost(info, cause);
            // Gone: nothing of the lease is left to release (the lock may be another's).
            drop(entry.take_baton_if(info.counter, to));
            Ok(Released::NotOwner)
        }
        Err(Err(e)) => Err(e),
    }
}

/// The baton of hand-off `local`, to be released in the backend if nobody takes it by `by`
/// (see [`CLAIM_WITHIN`]). The passing holder checks while it waits for its owner check; it
/// leaves a timer behind only when the baton is still there after that, or when it is
/// dropped (the release cancelled) first.
struct Unclaimed<'a> {
    locker: &'a Locker,
    entry: &'a EntryHandle,
    counter: u64,
    local: u32,
    by: Instant,
}

impl Unclaimed<'_> {
    fn release_now(&mut self) {
        release_baton_if(self.locker, self.entry, self.counter, self.local);
    }
}

/// Releases the baton of hand-off `local` of the lock taken at `counter` in the backend, if it
/// is still there.
fn release_baton_if(locker: &Locker, entry: &EntryHandle, counter: u64, local: u32) {
    if let Some(baton) = entry.take_baton_if(counter, local) {
        discard(locker, baton);
    }
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        if !self.entry.has_baton(self.counter, self.local) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (l, e, counter, local, by) = (
            self.locker.clone(),
            self.entry.clone(),
            self.counter,
            self.local,
            self.by,
        );
        self.locker.inner.cleanups.spawn_on(
            async move {
                tokio::time::sleep_until(by).await;
                release_baton_if(&l, &e, counter, local);
            },
            &rt,
        );
    }
}

/// Releases a baton nobody took: when the key's turn is free, no caller is about to take it.
pub(crate) fn reclaim(locker: &Locker, entry: &EntryHandle) {
    let Ok(turn) = entry.turn().try_acquire_owned() else {
        // A caller has the turn (or is being given it): the baton is its to take.
        return;
    };
    if let Some(baton) = entry.take_baton() {
        discard(locker, baton);
    }
    drop(turn);
}

/// Ends the lease `baton` carries in the backend (in the background, bounded), as the
/// compensation of an acquisition that ended without a guard does.
pub(crate) fn discard(locker: &Locker, baton: Baton) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let l = locker.clone();
    locker.inner.cleanups.spawn_on(
        async move {
            // After the checks of the holders before it (see `lease::Chain`).
            baton.chain.idle().await;
            crate::cleanup::spawn_cleanup(&l, baton.key, baton.token, baton.lease);
        },
        &rt,
    );
}

/// A passed-on lease this caller took; dropped while still here (not usable, or the caller
/// cancelled while it waited for the check of the hand-off), it is released in the backend.
pub(crate) struct Claimed<'a>(pub(crate) &'a Locker, pub(crate) Option<Baton>);

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        if let Some(baton) = self.1.take() {
            discard(self.0, baton);
        }
    }
}

/// One caller of the locker waiting for a key's turn, counted in the key's entry so that a
/// holder knows someone waits. Left without the turn (timed out, cancelled), it checks once
/// it is gone whether a baton was left that nobody will take.
pub(crate) struct QueueSpot {
    locker: Locker,
    entry: EntryHandle,
    served: bool,
}

impl QueueSpot {
    pub(crate) fn new(locker: &Locker, entry: &EntryHandle) -> QueueSpot {
        entry.joined_queue();
        QueueSpot {
            locker: locker.clone(),
            entry: entry.clone(),
            served: false,
        }
    }

    /// The caller got the turn: it takes any baton itself.
    pub(crate) fn served(mut self) {
        self.served = true;
    }
}

impl Drop for QueueSpot {
    fn drop(&mut self) {
        self.entry.left_queue();
        if self.served {
            return;
        }
        // The turn this caller may have been given goes back to the semaphore only when its
        // wait is dropped, which may be after this: check once that has happened.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (locker, entry) = (self.locker.clone(), self.entry.clone());
        self.locker
            .inner
            .cleanups
            .spawn_on(async move { reclaim(&locker, &entry) }, &rt);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::error::LockError;
    use crate::guard::LockGuard;
    use crate::locker::Locker;
    use crate::options::LockOptions;

    const MS: Duration = Duration::from_millis(1);

    fn locker(pass_limit: u32) -> Locker {
        Locker::in_memory_with(Locker::builder().local_handoff(pass_limit))
    }

    /// `n` callers queued behind `first` in order, each holding 10 ms once it has the lock;
    /// the fence and local hand-off count of every holder in the order they held.
    async fn queue_behind(
        locker: &Locker,
        first: LockGuard,
        opts: Vec<LockOptions>,
    ) -> Vec<(u64, u32)> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        tx.send((first.fence(), first.lease().local)).unwrap();
        let n = opts.len();
        for (i, o) in opts.into_iter().enumerate() {
            let (l, tx) = (locker.clone(), tx.clone());
            tokio::spawn(async move {
                let g = l.acquire("k", o).await.unwrap();
                tx.send((g.fence(), g.lease().local)).unwrap();
                tokio::time::sleep(10 * MS).await;
                g.release().await.unwrap();
            });
            // Each joins the queue before the next (FIFO order is the test's order).
            for _ in 0..1_000 {
                tokio::task::yield_now().await;
                if locker.stats().waiting > i {
                    break;
                }
            }
        }
        assert_eq!(locker.stats().waiting, n, "all queued");
        tokio::time::sleep(10 * MS).await;
        // A lease released past its local deadline (a test here does that on purpose) reports
        // `Lost`; anything else is a failure.
        match first.release().await {
            Ok(()) | Err(LockError::Lost { .. }) => {}
            Err(e) => panic!("release: {e}"),
        }
        let mut out = Vec::new();
        while out.len() < n + 1 {
            out.push(rx.recv().await.unwrap());
        }
        out
    }

    fn fences_increase(held: &[(u64, u32)]) {
        for w in held.windows(2) {
            assert!(w[1].0 > w[0].0, "fences in holding order: {held:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn hand_offs_in_a_row_stay_within_the_limit_and_each_holder_gets_a_new_fence() {
        let locker = locker(2);
        let first = locker.acquire("k", LockOptions::new()).await.unwrap();
        let held = queue_behind(&locker, first, vec![LockOptions::new(); 5]).await;
        let locals: Vec<u32> = held.iter().map(|h| h.1).collect();
        assert_eq!(locals, [0, 1, 2, 0, 1, 2], "{held:?}");
        fences_increase(&held);
        assert_eq!(
            held[1].0,
            held[0].0 + 1,
            "a local successor takes the next fence"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn without_local_hand_off_every_holder_takes_the_lock_from_the_backend() {
        let locker = locker(0);
        let first = locker.acquire("k", LockOptions::new()).await.unwrap();
        let held = queue_behind(&locker, first, vec![LockOptions::new(); 3]).await;
        assert!(held.iter().all(|h| h.1 == 0), "{held:?}");
        fences_increase(&held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_without_the_safety_margin_left_is_not_passed_on() {
        let locker = locker(16);
        // A fixed 1 s lease (margin 100 ms) released with 30 ms left: through the backend.
        let fixed = LockOptions::new().ttl(1000 * MS).watchdog(false);
        let first = locker.acquire("k", fixed).await.unwrap();
        tokio::time::sleep(950 * MS).await;
        let held = queue_behind(&locker, first, vec![LockOptions::new().ttl(1000 * MS)]).await;
        assert_eq!(held[1].1, 0, "{held:?}");
        // With half of it left: passed on (to a caller with the same ttl).
        let first = locker.acquire("k", fixed).await.unwrap();
        tokio::time::sleep(480 * MS).await;
        let same_ttl = LockOptions::new().ttl(1000 * MS);
        let held = queue_behind(&locker, first, vec![same_ttl]).await;
        assert_eq!(held[1].1, 1, "{held:?}");
        fences_increase(&held);
    }

    #[tokio::test(start_paused = true)]
    async fn fixed_lease_other_ttl_and_pending_min_hold_go_through_the_backend() {
        let locker = locker(16);
        let first = locker.acquire("k", LockOptions::new()).await.unwrap();
        let fixed = LockOptions::new().watchdog(false);
        let held = queue_behind(&locker, first, vec![fixed]).await;
        assert_eq!(held[1].1, 0, "a fixed lease runs its own ttl: {held:?}");
        let first = locker.acquire("k", LockOptions::new()).await.unwrap();
        let shorter = LockOptions::new().ttl(5_000 * MS);
        let held = queue_behind(&locker, first, vec![shorter]).await;
        assert_eq!(held[1].1, 0, "renewals with another ttl: {held:?}");
        let kept = LockOptions::new().min_hold(200 * MS);
        let first = locker.acquire("k", kept).await.unwrap();
        let start = tokio::time::Instant::now();
        let held = queue_behind(&locker, first, vec![LockOptions::new()]).await;
        assert_eq!(held[1].1, 0, "{held:?}");
        assert!(start.elapsed() >= 200 * MS, "min_hold kept the lock");
    }
}
