//! Release notifications over Redis pub/sub: one subscriber connection per `Locker`, owned by
//! one task that subscribes a lock's channel when its first listener appears and unsubscribes
//! `LINGER` after the last goes (under steady contention the next wait starts long before, and
//! skips a round trip). While anything is subscribed, a connection silent for `KEEPALIVE` is
//! asked `PING`, so a half-open one is replaced within about a second.
//!
//! The task is in `listener.rs` (its connection in `wire.rs`), the revocation bookkeeping it
//! shares with this handle in `revoke.rs`.

use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::sync::{mpsc, oneshot};

use super::listener::{Remote, SubCmd, Task};
use super::revoke::Revocations;
use crate::backend::contract::{Events, Holders};
use crate::error::BackendError;
use crate::key::LockKey;

/// One held lease's interest in its revoke channel; dropping it ends the interest.
pub(crate) struct Held {
    sub: Subscriber,
    channel: Arc<str>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // No message: the task sweeps for channels nobody holds with (see `revoke.rs`).
        self.sub.inner.revocations.unhold(&self.channel);
    }
}

/// Handle to a locker's subscriber task (cheap to clone).
#[derive(Clone)]
pub(crate) struct Subscriber {
    inner: Arc<Inner>,
}

struct Inner {
    remote: Arc<Remote>,
    events: OnceLock<Weak<dyn Events>>,
    tx: Mutex<Option<mpsc::UnboundedSender<SubCmd>>>,
    revocations: Arc<Revocations>,
}

impl Subscriber {
    pub(crate) fn new(remote: Remote) -> Subscriber {
        Subscriber {
            inner: Arc::new(Inner {
                remote: Arc::new(remote),
                events: OnceLock::new(),
                tx: Mutex::new(None),
                revocations: Arc::default(),
            }),
        }
    }

    /// Where messages go; set once, by the locker's waiting side.
    pub(crate) fn attach(&self, events: Weak<dyn Events>) {
        let _ = self.inner.events.set(events);
    }

    /// Subscribes the lock's channel (at once when already subscribed); once this returns
    /// `Ok`, no later release message is missed.
    pub(crate) async fn subscribe(&self, tag: &Arc<str>) -> Result<(), BackendError> {
        for _ in 0..2 {
            let (reply_tx, reply_rx) = oneshot::channel();
            if !self.send(SubCmd::Subscribe(tag.clone(), reply_tx)) {
                continue;
            }
            match reply_rx.await {
                Ok(res) => return res,
                // The task ended with its runtime: the next round starts a new one here.
                Err(_) => self.forget_task(),
            }
        }
        Err(BackendError::new(
            self.inner.remote.addr.clone(),
            "pub/sub: the subscriber task could not be started",
        ))
    }

    /// Tells `holders` of every token revoked on a channel this subscriber listens to.
    pub(crate) fn attach_holders(&self, holders: Weak<dyn Holders>) {
        self.inner.revocations.attach(holders);
    }

    /// Listens on the revoke channel of `key` while the returned [`Held`] lives
    /// (subscribing in the background when it is the first). Nothing waits for the
    /// subscription: until it is in place, a revocation is found by the renewal.
    pub(crate) fn hold(&self, key: &LockKey) -> Held {
        let wanted = self.inner.remote.delivery.revoke_channel(key);
        let (channel, announce) = self.inner.revocations.hold(&wanted);
        if let Some(channel) = announce {
            self.send(SubCmd::Hold(channel));
        } else if !self.task_alive() {
            // The task ended with its runtime: a new one, told every held channel, listens.
            self.send(SubCmd::Hold(channel.clone()));
        }
        Held {
            sub: self.clone(),
            channel,
        }
    }

    /// The last listener of the lock's channel left.
    pub(crate) fn unsubscribe(&self, tag: &Arc<str>) {
        self.send(SubCmd::Unsubscribe(tag.clone()));
    }

    /// Sends to the task, starting it (on the current runtime) when there is none or its
    /// runtime is gone. `false` when no task can run (no runtime).
    fn send(&self, cmd: SubCmd) -> bool {
        let mut tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        let cmd = match tx.as_ref() {
            Some(t) => match t.send(cmd) {
                Ok(()) => return true,
                Err(mpsc::error::SendError(cmd)) => cmd,
            },
            None => cmd,
        };
        let (Some(events), Ok(rt)) = (
            self.inner.events.get().cloned(),
            tokio::runtime::Handle::try_current(),
        ) else {
            *tx = None;
            return false;
        };
        let (new_tx, rx) = mpsc::unbounded_channel();
        let _ = new_tx.send(cmd);
        // A new task knows nothing: it hears of every prefix a lease is held under.
        for channel in self.inner.revocations.reannounce() {
            let _ = new_tx.send(SubCmd::Hold(channel));
        }
        let task = Task::new(
            self.inner.remote.clone(),
            events,
            self.inner.revocations.clone(),
        );
        rt.spawn(task.run(rx));
        *tx = Some(new_tx);
        true
    }

    fn task_alive(&self) -> bool {
        let tx = self.inner.tx.lock().unwrap_or_else(|p| p.into_inner());
        tx.as_ref().is_some_and(|t| !t.is_closed())
    }

    fn forget_task(&self) {
        *self.inner.tx.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
