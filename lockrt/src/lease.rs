//! The lease monitor (watchdog): one task per `Locker` that keeps every held lease alive and
//! declares loss.
//!
//! Each lease has a local deadline on the monotonic clock: the send time of the last successful
//! acquire or renewal, plus ttl, minus a safety margin. The server cannot have expired the lock
//! before that instant, so declaring loss there is never late, even when Redis is unreachable.
//! A renewal is due a third of the way into the current lease (every ttl/3 once renewed);
//! leases due within a sixth of theirs are renewed in the same batch (one script call for many
//! locks), which keeps the number of round trips per period near `held / batch size`. A
//! transient renewal error is retried soon, but never moves the deadline. A "not yours"
//! answer or a passed deadline marks the lease lost.
//!
//! The monitor never outlives the leases' guards (it ends when its `Locker` is dropped) and
//! never blocks a guard. Guards add and remove leases in a shared table under a short mutex;
//! the task is woken only when a new lease is due before its next scan. An idle task scans
//! every shortest renewal interval it has seen, so a stream of short acquire/release pairs
//! costs no task wake-ups at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Renewal, Token};
use crate::key::LockKey;

/// Largest number of leases renewed by one script call.
const MAX_BATCH: usize = 500;

/// What a guard and the monitor share about one lease.
#[derive(Debug)]
pub(crate) struct LeaseInfo {
    pub(crate) id: u64,
    pub(crate) key: LockKey,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) watchdog: bool,
    /// Cancelled when the lease is lost.
    pub(crate) lost: CancellationToken,
    /// The holder's place in its locker's queue for the key: given up at loss, so local
    /// waiters don't queue behind a lock nobody holds.
    pub(crate) turn: Mutex<Option<OwnedSemaphorePermit>>,
}

impl LeaseInfo {
    /// Gives up the local turn (idempotent).
    pub(crate) fn leave_turn(&self) {
        drop(self.turn.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// The margin taken off every deadline: covers clock-rate differences between this host and
/// the server, and the time a loss takes to act on.
pub(crate) fn margin(ttl: Duration) -> Duration {
    ttl / 20 + Duration::from_millis(1)
}

struct State {
    info: Arc<LeaseInfo>,
    deadline: Instant,
    next_renew: Instant,
    /// Leases due within this much of a scan are renewed in the same batch: a sixth of the
    /// current lease, so a short first lease (a granted waiter's) is not renewed at once.
    window: Duration,
    in_flight: bool,
}

impl State {
    fn new(info: Arc<LeaseInfo>, sent: Instant, lease: Duration) -> State {
        let mut st = State {
            info,
            deadline: sent,
            next_renew: sent,
            window: Duration::ZERO,
            in_flight: false,
        };
        st.runs(sent, lease);
        st
    }

    /// The lease now runs `lease` from `sent` (the send time of the request that got it).
    fn runs(&mut self, sent: Instant, lease: Duration) {
        self.deadline = sent + lease - margin(lease);
        self.next_renew = sent + lease / 3;
        self.window = lease / 6;
    }

    /// When the monitor must look at this lease next.
    fn due(&self) -> Instant {
        if self.info.watchdog && !self.in_flight {
            self.deadline.min(self.next_renew)
        } else {
            self.deadline
        }
    }
}

/// What guards and the monitor task share.
struct Shared {
    table: Mutex<Table>,
    wake: Notify,
}

#[derive(Default)]
struct Table {
    leases: HashMap<u64, State>,
    /// The task's next scan; an added lease due earlier wakes it.
    next_scan: Option<Instant>,
    /// The shortest time from acquire to first look of any lease seen: an idle task scans
    /// this often, so a stream of acquire/release pairs with the same ttl never wakes it.
    idle_step: Option<Duration>,
    /// Set when the task is gone (runtime shutting down) or the `Locker` dropped.
    closed: bool,
}

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Every critical section is a few map operations; a panic can't leave it torn.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

type Outcome = (
    Vec<u64>,
    Instant,
    Result<Vec<bool>, crate::error::BackendError>,
);

/// Handle to a locker's monitor task; dropping it ends the task.
pub(crate) struct Monitor {
    shared: Arc<Shared>,
}

impl Monitor {
    pub(crate) fn spawn(backend: Arc<Backend>) -> Monitor {
        let shared = Arc::new(Shared {
            table: Mutex::default(),
            wake: Notify::new(),
        });
        tokio::spawn(run(backend, Closer(shared.clone())));
        Monitor { shared }
    }

    /// Starts watching a lease acquired by a request sent at `sent`.
    pub(crate) fn add(&self, info: Arc<LeaseInfo>, sent: Instant, lease: Duration) {
        let st = State::new(info, sent, lease);
        let due = st.due();
        // Never scan idle more often than MIN_IDLE_STEP: shorter leases just wake the task.
        let step = due.saturating_duration_since(sent).max(MIN_IDLE_STEP);
        let mut t = self.shared.table();
        if t.closed {
            // No monitor (runtime shutting down): nobody can renew, so don't pretend to hold.
            st.info.lost.cancel();
            return;
        }
        t.leases.insert(st.info.id, st);
        t.idle_step = Some(t.idle_step.map_or(step, |s| s.min(step)));
        if t.next_scan.is_none_or(|at| due < at) {
            t.next_scan = Some(due);
            drop(t);
            self.shared.wake.notify_one();
        }
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
/// dropping it), so later leases are reported lost instead of silently unwatched.
struct Closer(Arc<Shared>);

impl Drop for Closer {
    fn drop(&mut self) {
        let mut t = self.0.table();
        t.closed = true;
        for st in t.leases.values() {
            st.info.lost.cancel();
        }
        t.leases.clear();
    }
}

async fn run(backend: Arc<Backend>, closer: Closer) {
    let shared = &closer.0;
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Outcome>();
    loop {
        let mut batches = Vec::new();
        let wake = {
            let mut t = shared.table();
            if t.closed {
                break;
            }
            let now = Instant::now();
            let mut due: Vec<Renewal> = Vec::new();
            t.leases.retain(|_, st| {
                if st.deadline <= now {
                    declare_lost(&st.info, "no successful renewal before the lease deadline");
                    return false;
                }
                if st.info.watchdog && !st.in_flight && st.next_renew <= now + st.window {
                    st.in_flight = true;
                    due.push(st.info.clone());
                }
                true
            });
            while !due.is_empty() {
                let rest = due.split_off(due.len().min(MAX_BATCH));
                batches.push(std::mem::replace(&mut due, rest));
            }
            let wake = t
                .leases
                .values()
                .map(State::due)
                .min()
                .unwrap_or_else(|| now + t.idle_step.unwrap_or(IDLE_SCAN));
            t.next_scan = Some(wake);
            wake
        };
        for batch in batches {
            let backend = backend.clone();
            let done = done_tx.clone();
            tokio::spawn(async move {
                let ids = batch.iter().map(|l| l.id).collect();
                let sent = Instant::now();
                let res = backend.renew(&batch).await;
                let _ = done.send((ids, sent, res));
            });
        }
        tokio::select! {
            biased;
            () = shared.wake.notified() => {}
            Some((ids, sent, res)) = done_rx.recv() => apply_outcome(&mut shared.table(), &ids, sent, res),
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

/// The shortest idle scan interval, so a locker that once held a very short lease does not
/// keep waking often while idle.
const MIN_IDLE_STEP: Duration = Duration::from_millis(100);

/// How long a monitor that has never seen a lease sleeps before looking again (an added lease
/// due earlier wakes it).
const IDLE_SCAN: Duration = Duration::from_secs(3600);

fn apply_outcome(
    t: &mut Table,
    ids: &[u64],
    sent: Instant,
    res: Result<Vec<bool>, crate::error::BackendError>,
) {
    match res {
        Ok(ok) => {
            for (id, renewed) in ids.iter().zip(ok) {
                let Some(st) = t.leases.get_mut(id) else {
                    continue;
                };
                st.in_flight = false;
                if renewed {
                    let ttl = st.info.ttl;
                    st.runs(sent, ttl);
                } else {
                    declare_lost(&st.info, "the lock is held by another owner or expired");
                    t.leases.remove(id);
                }
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, leases = ids.len(), "lease renewal failed; retrying before the deadline");
            let now = Instant::now();
            for id in ids {
                let Some(st) = t.leases.get_mut(id) else {
                    continue;
                };
                st.in_flight = false;
                let retry =
                    (st.info.ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(200));
                st.next_renew = now + retry;
            }
        }
    }
}

fn declare_lost(info: &LeaseInfo, why: &str) {
    tracing::warn!(key = %info.key.user, reason = why, "lock lost");
    info.lost.cancel();
    info.leave_turn();
}
