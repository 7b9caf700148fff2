//! The lease monitor (watchdog): one task per `Locker` that keeps every held lease alive and
//! declares loss.
//!
//! Each lease has a local deadline on the monotonic clock: the send time of the last successful
//! acquire or renewal, plus ttl, minus a safety margin. The server cannot have expired the lock
//! before that instant, so declaring loss there is never late, even when Redis is unreachable.
//! Renewals are due every ttl/3; leases due within the next ttl/6 are renewed in the same batch
//! (one script call for many locks), which keeps the number of round trips per period near
//! `held / batch size`. A transient renewal error is retried soon, but never moves the deadline.
//! A "not yours" answer or a passed deadline marks the lease lost.
//!
//! The monitor never outlives the leases' guards (it ends when the last sender is dropped) and
//! never blocks a guard: guards talk to it through an unbounded channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
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

enum Cmd {
    /// A lease, the send time of the request that took it, and the lease it got then (the
    /// full ttl, or a shorter grant lease that the first renewal extends).
    Add(Arc<LeaseInfo>, Instant, Duration),
    Remove(u64),
}

struct State {
    info: Arc<LeaseInfo>,
    deadline: Instant,
    next_renew: Instant,
    in_flight: bool,
}

type Outcome = (
    Vec<u64>,
    Instant,
    Result<Vec<bool>, crate::error::BackendError>,
);

/// Handle to a locker's monitor task.
pub(crate) struct Monitor {
    tx: mpsc::UnboundedSender<Cmd>,
}

impl Monitor {
    pub(crate) fn spawn(backend: Arc<Backend>) -> Monitor {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(backend, rx));
        Monitor { tx }
    }

    /// Starts watching a lease acquired by a request sent at `sent`.
    pub(crate) fn add(&self, info: Arc<LeaseInfo>, sent: Instant, lease: Duration) {
        if self.tx.send(Cmd::Add(info.clone(), sent, lease)).is_err() {
            // No monitor (runtime shutting down): nobody can renew, so don't pretend to hold.
            info.lost.cancel();
        }
    }

    /// Stops watching (release or drop). Never blocks.
    pub(crate) fn remove(&self, id: u64) {
        let _ = self.tx.send(Cmd::Remove(id));
    }
}

async fn run(backend: Arc<Backend>, mut rx: mpsc::UnboundedReceiver<Cmd>) {
    let mut leases: HashMap<u64, State> = HashMap::new();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Outcome>();
    let far = || Instant::now() + Duration::from_secs(3600);
    let mut wake = far();
    loop {
        tokio::select! {
            biased;
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { break };
                apply(&mut leases, cmd, &mut wake);
                // Drain what else is queued before scanning, so a burst costs one pass.
                while let Ok(cmd) = rx.try_recv() {
                    apply(&mut leases, cmd, &mut wake);
                }
            }
            Some((ids, sent, res)) = done_rx.recv() => {
                let now = Instant::now();
                match res {
                    Ok(ok) => {
                        for (id, renewed) in ids.iter().zip(ok) {
                            let Some(st) = leases.get_mut(id) else { continue };
                            st.in_flight = false;
                            if renewed {
                                st.deadline = sent + st.info.ttl - margin(st.info.ttl);
                                st.next_renew = sent + st.info.ttl / 3;
                            } else {
                                declare_lost(&st.info, "the lock is held by another owner or expired");
                                leases.remove(id);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, leases = ids.len(), "lease renewal failed; retrying before the deadline");
                        for id in &ids {
                            let Some(st) = leases.get_mut(id) else { continue };
                            st.in_flight = false;
                            let retry = (st.info.ttl / 10).clamp(Duration::from_millis(5), Duration::from_millis(200));
                            st.next_renew = now + retry;
                        }
                    }
                }
                wake = now;
            }
            () = tokio::time::sleep_until(wake) => {
                let now = Instant::now();
                let mut due: Vec<u64> = Vec::new();
                leases.retain(|_, st| {
                    if st.deadline <= now {
                        declare_lost(&st.info, "no successful renewal before the lease deadline");
                        return false;
                    }
                    if st.info.watchdog && !st.in_flight && st.next_renew <= now + st.info.ttl / 6 {
                        due.push(st.info.id);
                    }
                    true
                });
                for chunk in due.chunks(MAX_BATCH) {
                    let batch: Vec<Renewal> = chunk.iter().map(|id| {
                        let st = leases.get_mut(id).expect("collected above");
                        st.in_flight = true;
                        st.info.clone()
                    }).collect();
                    let ids = chunk.to_vec();
                    let backend = backend.clone();
                    let done = done_tx.clone();
                    tokio::spawn(async move {
                        let sent = Instant::now();
                        let res = backend.renew(&batch).await;
                        let _ = done.send((ids, sent, res));
                    });
                }
                wake = leases.values().map(|st| {
                    if st.info.watchdog && !st.in_flight { st.deadline.min(st.next_renew) } else { st.deadline }
                }).min().unwrap_or_else(far);
            }
        }
    }
}

fn apply(leases: &mut HashMap<u64, State>, cmd: Cmd, wake: &mut Instant) {
    match cmd {
        Cmd::Add(info, sent, lease) => {
            let st = State {
                deadline: sent + lease - margin(lease),
                next_renew: sent + lease / 3,
                in_flight: false,
                info,
            };
            let at = if st.info.watchdog {
                st.next_renew.min(st.deadline)
            } else {
                st.deadline
            };
            *wake = (*wake).min(at);
            leases.insert(st.info.id, st);
        }
        Cmd::Remove(id) => {
            leases.remove(&id);
        }
    }
}

fn declare_lost(info: &LeaseInfo, why: &str) {
    tracing::warn!(key = %info.key.user, reason = why, "lock lost");
    info.lost.cancel();
    info.leave_turn();
}
