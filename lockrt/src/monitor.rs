//! The lease monitor (watchdog): one task per `Locker` and runtime that keeps every held lease
//! alive and declares loss.
//!
//! Each lease's local deadline is in [`LeaseInfo`] (`lease.rs`). A renewal is due a third of
//! the way into the current lease; leases due within a sixth of theirs are renewed in the same batch (one script call for many locks). A
//! renewal still unanswered after half of what is left of its lease goes out again at once on an
//! extra, fresh connection (hedged), so one reply lost on a live connection costs a round trip,
//! not the lease, whatever the response timeout. A failed renewal is retried with exponential
//! backoff inside the deadline and never moves it; a "not yours" answer, a passed deadline or a
//! passed `max_hold` marks the lease lost.
//!
//! A forced unlock revokes a lease at once: while it watches a lease, the monitor has its
//! locker listen on the revoke channel (`backend::redis::revoke`), and a token revoked there (or by an
//! in-memory forced unlock) is renewed at once, owner-checked: the server's "not yours" is
//! what declares it lost, so a message anyone could publish is only a hint (a fixed lease,
//! which has no renewal to ask with, is declared lost by the message). The regular renewal
//! finds a forced unlock whose message was lost.
//!
//! The task never blocks a guard: guards add and remove leases in a shared table under a short
//! mutex. It is woken only when a new lease is due before its next scan; an idle task scans
//! every shortest renewal interval it has seen. When its runtime ends, every lease it watched
//! is marked lost and the next acquire starts a new task on its own runtime.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use crate::backend::Backend;
use crate::backend::contract::{Found, Holders, Renewal, Renewed};
use crate::backend::redis::pubsub::Subscriber;
use crate::error::LossCause;
use crate::key::LockKey;
use crate::lease::{LeaseInfo, declare_lost};
use crate::renewal::{State, batches, hedge_time};

/// At most one renewal-failure WARN per this long per monitor; the rest are counted.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// What guards and the monitor task share.
struct Shared {
    table: Mutex<Table>,
    wake: Notify,
    /// Where revocations are heard (Redis).
    subscriber: Option<Subscriber>,
}

impl Shared {
    /// The leases held with `token`: checked with an owner-checked renewal at once, or, when
    /// the caller knows first hand (`trusted`) or the lease is fixed (no renewal to ask the
    /// server with), declared lost now.
    fn revoke_token(&self, token: &str, trusted: bool) {
        let now = Instant::now();
        let mut t = self.table();
        let mut lost = Vec::new();
        let mut matched = false;
        for (id, st) in t.leases.iter_mut() {
            if st.info.token.as_str() != token {
                continue;
            }
            matched = true;
            if trusted || !st.info.watchdog {
                lost.push(*id);
            } else {
                st.revoke_heard = true;
                st.check_now(now);
            }
        }
        if !matched {
            // Perhaps a lease whose acquire reply is still on its way (the revoke channel is
            // another connection and may deliver first), or one between two holders of this
            // locker (local hand-off): that lease, added soon, must hear of it too.
            t.unmatched
                .retain(|(_, at, _)| now.duration_since(*at) < UNMATCHED_KEPT);
            if t.unmatched.len() >= MAX_UNMATCHED {
                t.unmatched.remove(0);
            }
            t.unmatched.push((token.to_owned(), now, trusted));
        }
        for id in lost {
            if let Some(st) = t.leases.remove(&id) {
                declare_lost(&st.info, LossCause::ForceUnlocked);
            }
        }
        t.next_scan = Some(now);
        drop(t);
        self.wake.notify_one();
    }
}

impl Holders for Shared {
    fn revoke(&self, token: &str) {
        self.revoke_token(token, false);
    }

    fn revoked(&self, token: &str) {
        self.revoke_token(token, true);
    }

    fn resubscribed(&self, on_channel: &dyn Fn(&LockKey) -> bool) {
        let now = Instant::now();
        let mut t = self.table();
        let mut due = false;
        let listened = |st: &&mut State| st.info.watchdog && on_channel(&st.info.key);
        for st in t.leases.values_mut().filter(listened) {
            st.check_now(now);
            due = true;
        }
        if due {
            t.next_scan = Some(now);
            drop(t);
            self.wake.notify_one();
        }
    }
}

#[derive(Default)]
struct Table {
    leases: HashMap<u64, State>,
    /// The task's next scan; an added lease due earlier wakes it.
    next_scan: Option<Instant>,
    /// The shortest time from acquire to first look of any lease seen: an idle task scans
    /// this often, so a stream of acquire/release pairs with the same ttl never wakes it.
    idle_step: Option<Duration>,
    /// Set when the task is gone (its runtime shut down) or the `Locker` dropped.
    closed: bool,
    /// Rate limit of renewal-failure warnings.
    last_warn: Option<Instant>,
    suppressed: u64,
    /// Revocations of tokens no watched lease had: (token, when, trusted), kept
    /// [`UNMATCHED_KEPT`] for a lease passed on in the process that is about to be added.
    unmatched: Vec<(String, Instant, bool)>,
}

/// How long a revocation nobody matched is kept for a lease added after it, and how many.
const UNMATCHED_KEPT: Duration = Duration::from_secs(2);
const MAX_UNMATCHED: usize = 16;

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Every critical section is a few map operations; a panic can't leave it torn.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Outcome = (Vec<u64>, Instant, Vec<Renewed>);

/// Handle to one monitor task; dropping it ends the task.
pub(crate) struct Monitor {
    shared: Arc<Shared>,
}

impl Monitor {
    /// Starts a monitor task on the current runtime.
    pub(crate) fn spawn(backend: Arc<Backend>, rt: &tokio::runtime::Handle) -> Monitor {
        let shared = Arc::new(Shared {
            table: Mutex::default(),
            wake: Notify::new(),
            subscriber: backend.subscriber(),
        });
        let holders: Arc<dyn Holders> = shared.clone();
        backend.attach_holders(Arc::downgrade(&holders));
        rt.spawn(run(backend, Closer(shared.clone())));
        Monitor { shared }
    }

    /// A monitor without a task (no runtime to run one): every lease added is refused.
    pub(crate) fn closed() -> Monitor {
        let shared = Arc::new(Shared {
            table: Mutex::default(),
            wake: Notify::new(),
            subscriber: None,
        });
        shared.table().closed = true;
        Monitor { shared }
    }

    /// Whether the task still runs (its runtime has not shut down).
    pub(crate) fn alive(&self) -> bool {
        !self.shared.table().closed
    }

    /// Starts watching a lease taken by a request sent at `sent` for `lease`. `false` when the
    /// task is gone: nobody can renew, so the caller must not pretend to hold.
    pub(crate) fn add(&self, info: Arc<LeaseInfo>, sent: Instant, lease: Duration) -> bool {
        let revocable = self.shared.subscriber.as_ref().map(|s| s.hold(&info.key));
        let mut st = State::new(info, sent, lease, revocable);
        let mut t = self.shared.table();
        if t.closed {
            return false;
        }
        if let Some(trusted) = revoked_before(&mut t, &st.info) {
            if trusted || !st.info.watchdog {
                declare_lost(&st.info, LossCause::ForceUnlocked);
                return true;
            }
            st.revoke_heard = true;
            st.check_now(Instant::now());
        }
        let due = st.due();
        // Never scan idle more often than MIN_IDLE_STEP: shorter leases just wake the task.
        let step = due.saturating_duration_since(sent).max(MIN_IDLE_STEP);
        t.leases.insert(st.info.id, st);
        t.idle_step = Some(t.idle_step.map_or(step, |s| s.min(step)));
        if t.next_scan.is_none_or(|at| due < at) {
            t.next_scan = Some(due);
            drop(t);
            self.shared.wake.notify_one();
        }
        true
    }

    /// Stops the task and hands over every lease it watched (shutdown).
    pub(crate) fn drain(&self) -> Vec<Arc<LeaseInfo>> {
        let mut t = self.shared.table();
        t.closed = true;
        let leases = t.leases.drain().map(|(_, st)| st.info).collect();
        drop(t);
        self.shared.wake.notify_one();
        leases
    }

    /// Stops watching (release or drop). Never blocks; the task is not woken, a scan that
    /// finds nothing costs nothing.
    pub(crate) fn remove(&self, id: u64) {
        self.shared.table().leases.remove(&id);
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.shared.table().closed = true;
        self.shared.wake.notify_one();
    }
}

/// Owned by the task: marks the table closed however the task ends (including its runtime
/// dropping it), so the leases it watched are reported lost instead of silently unwatched.
struct Closer(Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        let mut t = self.0.table();
        t.closed = true;
        for st in t.leases.values() {
            st.info.end_by_shutdown();
            st.info.leave_turn();
        }
        t.leases.clear();
    }
}

async fn run(backend: Arc<Backend>, closer: Closer) {
    let shared = &closer.0;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Outcome>();
    loop {
        let Some((due, wake)) = scan(&mut shared.table()) else {
            break;
        };
        for batch in batches(due, |key| backend.renewal_group(key)) {
            tokio::spawn(renew(backend.clone(), batch, done_tx.clone()));
        }
        tokio::select! {
            biased;
            () = shared.wake.notified() => {}
            Some(first) = done_rx.recv() => {
                // Every outcome that is in, before the next scan: one per slot on a cluster.
                let mut t = shared.table();
                let more = std::iter::from_fn(|| done_rx.try_recv().ok());
                for (ids, sent, res) in std::iter::once(first).chain(more) {
                    apply_outcome(&mut t, &ids, sent, res);
                }
            }
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// Declares passed deadlines, collects the renewals due and says when to look next; `None`
/// once closed.
fn scan(t: &mut Table) -> Option<(Vec<Arc<LeaseInfo>>, Instant)> {
    if t.closed {
        return None;
    }
    let now = Instant::now();
    let mut due: Vec<Arc<LeaseInfo>> = Vec::new();
    t.leases.retain(|_, st| {
        if let Some(cause) = st.info.past_deadline(now) {
            declare_lost(&st.info, cause);
            return false;
        }
        if st.renews() && st.next_renew <= now + st.window {
            st.in_flight = true;
            due.push(st.info.clone());
        }
        true
    });
    let wake = t
        .leases
        .values()
        .map(State::due)
        .min()
        .unwrap_or_else(|| now + t.idle_step.unwrap_or(IDLE_SCAN));
    t.next_scan = Some(wake);
    Some((due, wake))
}

async fn renew(
    backend: Arc<Backend>,
    batch: Vec<Arc<LeaseInfo>>,
    done: mpsc::UnboundedSender<Outcome>,
) {
    let ids = batch.iter().map(|l| l.id).collect();
    let renewals: Vec<Renewal<'_>> = batch.iter().map(|l| l.renewal(l.ttl, None)).collect();
    let sent = Instant::now();
    let hedge_at = hedge_time(sent, batch.iter().map(|l| l.deadline()));
    let mut res = backend.renew_hedged(&renewals, hedge_at).await;
    if renewals.len() > 1
        && res
            .iter()
            .all(|r| r.as_ref().is_err_and(|e| e.is_migrating()))
    {
        // One lease whose keys a migration split between two masters fails the call of its
        // whole slot (TRYAGAIN): each lease alone, so that it fails only its own renewal.
        let singles = futures_util::future::join_all(
            (renewals.iter()).map(|r| backend.renew_hedged(std::slice::from_ref(r), hedge_at)),
        )
        .await;
        res = (singles.into_iter().zip(res))
            .map(|(mut single, batch)| single.pop().unwrap_or(batch))
            .collect();
    }
    let _ = done.send((ids, sent, res));
}

/// The shortest idle scan interval, so a locker that once held a very short lease does not
/// keep waking often while idle.
const MIN_IDLE_STEP: Duration = Duration::from_millis(100);

/// How long a monitor that has never seen a lease sleeps before looking again (an added lease
/// due earlier wakes it).
const IDLE_SCAN: Duration = Duration::from_secs(3600);

fn apply_outcome(t: &mut Table, ids: &[u64], sent: Instant, res: Vec<Renewed>) {
    let now = Instant::now();
    let mut failed = None;
    for (id, renewed) in ids.iter().zip(res) {
        let Some(st) = t.leases.get_mut(id) else {
            continue;
        };
        st.in_flight = false;
        match renewed {
            Ok(Found::Renewed) => {
                // A check sent after a revoke message found the lock still ours: the message
                // was stale or false, and a later loss is not the forced unlock's.
                if !st.recheck {
                    st.revoke_heard = false;
                }
                let ttl = st.info.ttl;
                st.runs(sent, ttl);
                if std::mem::take(&mut st.recheck) {
                    st.next_renew = now;
                }
            }
            Ok(found) => {
                let cause = if st.revoke_heard {
                    LossCause::ForceUnlocked
                } else {
                    found.cause()
                };
                declare_lost(&st.info, cause);
                t.leases.remove(id);
            }
            // Only the leases whose renewal failed wait for a retry (per key, per slot).
            Err(e) => {
                st.retry_later(now);
                failed = Some((e, failed.map_or(1, |(_, n)| n + 1)));
            }
        }
    }
    if let Some((e, n)) = failed {
        warn_limited(t, now, &e, n);
    }
}

/// One WARN per `WARN_EVERY`, naming how many were suppressed since the last.
fn warn_limited(t: &mut Table, now: Instant, e: &crate::error::BackendError, leases: usize) {
    crate::metrics::renewal_failed(leases);
    if t.last_warn.is_some_and(|at| now < at + WARN_EVERY) {
        t.suppressed += 1;
        return;
    }
    tracing::warn!(error = %e, leases, suppressed = t.suppressed, "lease renewal failed; retrying with backoff before the deadline");
    t.last_warn = Some(now);
    t.suppressed = 0;
}

/// Whether a revocation of `info`'s token came while no watched lease had it (a lease being
/// passed on in the process): `Some(trusted)`, forgotten once matched.
fn revoked_before(t: &mut Table, info: &LeaseInfo) -> Option<bool> {
    if t.unmatched.is_empty() {
        return None;
    }
    let i = t
        .unmatched
        .iter()
        .position(|(token, _, _)| token == info.token.as_str())?;
    Some(t.unmatched.remove(i).2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::contract::{Attempt, Released, Token};
    use crate::backend::memory::MemoryBackend;
    use crate::key::LockKey;
    use crate::lease::margin;
    use crate::lease::tests::{SAFETY, lease};

    fn setup(ttl: Duration, max_hold: Option<Duration>) -> (Arc<Backend>, Arc<LeaseInfo>) {
        let memory = MemoryBackend::default();
        let key = LockKey::new("lock:", "k").unwrap();
        let token = Token::new();
        assert!(matches!(
            memory.acquire(&key, &token, ttl, None),
            Attempt::Acquired { .. }
        ));
        let backend = Arc::new(Backend::Memory(memory));
        (backend, lease(1, key, token, ttl, max_hold))
    }

    fn pttl(backend: &Backend) -> Option<Duration> {
        backend.memory_pttl(&LockKey::new("lock:", "k").unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn renewal_comes_a_third_into_the_lease_and_moves_the_deadline() {
        let ttl = Duration::from_secs(3);
        let (backend, info) = setup(ttl, None);
        let start = Instant::now();
        let monitor = Monitor::spawn(backend.clone(), &tokio::runtime::Handle::current());
        assert!(monitor.add(info.clone(), start, ttl));
        tokio::time::sleep(Duration::from_millis(999)).await;
        assert_eq!(
            info.deadline(),
            start + ttl - margin(ttl, SAFETY),
            "not yet renewed"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        tokio::task::yield_now().await;
        let renewed_at = start + Duration::from_secs(1);
        assert_eq!(info.deadline(), renewed_at + ttl - margin(ttl, SAFETY));
        assert_eq!(pttl(&backend), Some(ttl - Duration::from_millis(1)));
        // Held through many periods.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!info.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn taken_over_lease_is_lost_at_the_next_renewal() {
        let ttl = Duration::from_secs(3);
        let (backend, info) = setup(ttl, None);
        let start = Instant::now();
        let monitor = Monitor::spawn(backend.clone(), &tokio::runtime::Handle::current());
        assert!(monitor.add(info.clone(), start, ttl));
        let tampered = backend
            .release(&info.key, &info.token, info.counter, None)
            .await;
        assert!(
            matches!(tampered, Ok(Released::Freed)),
            "tampered from outside"
        );
        tokio::time::timeout(Duration::from_secs(2), info.lost())
            .await
            .expect("loss seen at the renewal a third in, before the deadline");
        assert!(Instant::now() < start + ttl - margin(ttl, SAFETY));
    }

    /// A forced unlock lands right after an acquisition ran, and its revoke message arrives
    /// before the acquire reply (they travel on different connections): the lease, added
    /// afterwards, is checked at once and found lost, not at its first renewal.
    #[tokio::test(start_paused = true)]
    async fn a_revocation_heard_before_its_lease_was_added_is_checked_at_once() {
        let ttl = Duration::from_secs(3);
        let (backend, info) = setup(ttl, None);
        assert_eq!(info.local, 0, "a lock taken from the backend");
        let monitor = Monitor::spawn(backend.clone(), &tokio::runtime::Handle::current());
        let forced = backend.force_release(&info.key).await;
        assert!(matches!(forced, Ok(true)), "{forced:?}");
        monitor.shared.revoke(info.token.as_str());
        let start = Instant::now();
        assert!(monitor.add(info.clone(), start, ttl));
        tokio::time::timeout(Duration::from_millis(100), info.lost())
            .await
            .expect("lost at once, not at the renewal a third into the lease");
    }

    #[tokio::test(start_paused = true)]
    async fn max_hold_stops_the_watchdog_and_reports_loss() {
        let ttl = Duration::from_secs(3);
        let (backend, info) = setup(ttl, Some(Duration::from_secs(10)));
        let start = Instant::now();
        let monitor = Monitor::spawn(backend.clone(), &tokio::runtime::Handle::current());
        assert!(monitor.add(info.clone(), start, ttl));
        tokio::time::timeout(Duration::from_secs(60), info.lost())
            .await
            .expect("lost at max_hold");
        assert_eq!(Instant::now(), start + Duration::from_secs(10));
        // No renewal after max_hold: the server-side lease runs out within a ttl.
        tokio::time::sleep(ttl).await;
        assert_eq!(pttl(&backend), None);
    }

    #[test]
    fn a_dead_runtime_marks_its_leases_lost_and_a_new_monitor_can_start() {
        let ttl = Duration::from_secs(3);
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        };
        let first = runtime();
        let (backend, info, monitor) = first.block_on(async {
            let (backend, info) = setup(ttl, None);
            let monitor = Monitor::spawn(backend.clone(), &tokio::runtime::Handle::current());
            assert!(monitor.add(info.clone(), Instant::now(), ttl));
            tokio::task::yield_now().await;
            (backend, info, monitor)
        });
        drop(first);
        assert!(info.is_lost(), "its runtime is gone: nobody renews it");
        assert!(!monitor.alive());
        runtime().block_on(async {
            let (_, info2) = setup(ttl, None);
            let fresh = Monitor::spawn(backend, &tokio::runtime::Handle::current());
            assert!(fresh.add(info2.clone(), Instant::now(), ttl));
            assert!(!info2.is_lost());
        });
    }
}
