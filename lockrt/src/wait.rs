//! Waiting for a busy lock without polling.
//!
//! Per lock key a [`Locker`](crate::Locker) keeps one [`Entry`] while anyone uses the key:
//! a FIFO turn (a one-permit fair semaphore) so that its own callers contend in arrival order
//! and only one of them talks to Redis at a time, and a [`Notify`] woken by release messages.
//! Release messages from other processes arrive through the backend's subscriber
//! ([`Subscriber`]), which this module tells when a key's first listener appears and its last
//! goes. Listeners subscribe *before* their retry, so a release between the failed attempt and the
//! wait cannot be missed. Entries and subscriptions are removed as soon as nobody uses them:
//! this module must never leak a subscription or an entry, and never blocks in `Drop`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;

use crate::backend::contract::{Events, Grant, Notice};
use crate::backend::redis::pubsub::Subscriber;
use crate::error::BackendError;
use crate::lease::{Baton, LeaseInfo};

/// Who is asking for a lock: the tokio task, or the thread when not inside a task (the future
/// a runtime's `block_on` drives). A lock held through a guard remembers who took it, so that
/// the same task asking again fails at once instead of waiting for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Owner {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Owner {
    pub(crate) fn current() -> Owner {
        tokio::task::try_id()
            .map_or_else(|| Owner::Thread(std::thread::current().id()), Owner::Task)
    }
}

pub(crate) struct Entry {
    pub(crate) turn: Arc<Semaphore>,
    /// Who holds the lock through this locker, while it does.
    holder: Mutex<Option<(Owner, Weak<LeaseInfo>)>>,
    /// Who holds read shares through this locker, while they do.
    sharers: Mutex<Vec<(Owner, Weak<LeaseInfo>)>>,
    notify: Notify,
    listeners: AtomicUsize,
    /// Locks handed to a waiter by a release, until claimed.
    grants: Mutex<Vec<Grant>>,
    /// Callers of this locker waiting for the turn (not the one that has it).
    queued: AtomicUsize,
    /// A lease a holder of this locker passed to the next caller that gets the turn.
    /// Boxed: an entry per held key stays small (most are never passed on).
    baton: Mutex<Option<Box<Baton>>>,
}

/// Grants kept per key at most: only this locker's head waiter claims one, the rest are
/// other processes' and are dropped oldest first.
const MAX_GRANTS: usize = 8;

impl Entry {
    /// Whether a waiter of this locker is listening for the key's release messages.
    fn listened(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    fn deliver(&self, notice: Notice) {
        if let Notice::Granted(grant) = notice {
            let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
            if grants.len() >= MAX_GRANTS {
                grants.remove(0);
            }
            grants.push(grant);
        }
        self.notify.notify_waiters();
    }
}

/// Keyed by the lock's tag (`{lock}`), shared with the holders' [`LockKey`](crate::key::LockKey).
type Entries = Mutex<HashMap<Arc<str>, Arc<Entry>>>;

struct Shared {
    entries: Entries,
    remote: Option<Subscriber>,
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        // Map operations are single inserts/removes; a panic elsewhere can't corrupt it.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Events for Shared {
    fn message(&self, tag: &str, notice: Notice) {
        if let Some(e) = self.entries().get(tag) {
            e.deliver(notice);
        }
    }

    fn missed(&self) {
        for e in self.entries().values() {
            e.notify.notify_waiters();
        }
    }

    fn wanted(&self) -> Vec<Arc<str>> {
        self.entries()
            .iter()
            .filter(|(_, e)| e.listened())
            .map(|(tag, _)| tag.clone())
            .collect()
    }
}

/// The per-`Locker` registry of keys in use and their release notifications.
#[derive(Clone)]
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

impl Notifier {
    /// Notifications from this process, and from others through `remote` when given.
    pub(crate) fn new(remote: Option<Subscriber>) -> Notifier {
        let shared = Arc::new(Shared {
            entries: Mutex::default(),
            remote,
        });
        if let Some(sub) = &shared.remote {
            let events: Arc<dyn Events> = shared.clone();
            sub.attach(Arc::downgrade(&events));
        }
        Notifier { shared }
    }

    /// The waiting side, as release announcements reach it.
    pub(crate) fn events(&self) -> std::sync::Weak<dyn Events> {
        let events: Arc<dyn Events> = self.shared.clone();
        Arc::downgrade(&events)
    }

    /// The entry for the lock with this tag, created on first use and removed when its last
    /// handle drops.
    pub(crate) fn entry(&self, tag: &Arc<str>) -> EntryHandle {
        let mut map = self.shared.entries();
        let entry = match map.get(tag) {
            Some(e) => e.clone(),
            None => {
                let e = Arc::new(Entry {
                    turn: Arc::new(Semaphore::new(1)),
                    holder: Mutex::new(None),
                    sharers: Mutex::new(Vec::new()),
                    notify: Notify::new(),
                    listeners: AtomicUsize::new(0),
                    grants: Mutex::new(Vec::new()),
                    queued: AtomicUsize::new(0),
                    baton: Mutex::new(None),
                });
                map.insert(tag.clone(), e.clone());
                e
            }
        };
        EntryHandle {
            shared: self.shared.clone(),
            tag: tag.clone(),
            entry: Some(entry),
        }
    }

    /// Wakes this process's waiters for the lock with this tag (a local release: faster than
    /// the message).
    pub(crate) fn wake(&self, tag: &str) {
        if let Some(e) = self.shared.entries().get(tag) {
            e.notify.notify_waiters();
        }
    }

    /// Keys with an entry (held or waited for through this locker).
    pub(crate) fn entries(&self) -> usize {
        self.shared.entries().len()
    }

    /// Channels with at least one listener.
    pub(crate) fn listening(&self) -> usize {
        self.shared
            .entries()
            .values()
            .filter(|e| e.listened())
            .count()
    }
}

/// Keeps a key's entry alive; dropping the last handle removes it.
pub(crate) struct EntryHandle {
    shared: Arc<Shared>,
    tag: Arc<str>,
    entry: Option<Arc<Entry>>,
}

impl EntryHandle {
    fn entry(&self) -> &Entry {
        self.entry.as_ref().expect("entry present until drop")
    }

    pub(crate) fn turn(&self) -> Arc<Semaphore> {
        self.entry().turn.clone()
    }

    /// Callers of this locker waiting for the turn right now.
    pub(crate) fn queued(&self) -> usize {
        self.entry().queued.load(Ordering::Acquire)
    }

    /// Counts one more caller waiting for the turn; [`left_queue`](Self::left_queue) undoes it.
    pub(crate) fn joined_queue(&self) {
        self.entry().queued.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn left_queue(&self) {
        self.entry().queued.fetch_sub(1, Ordering::AcqRel);
    }

    /// Leaves `baton` for whoever gets the turn next.
    pub(crate) fn put_baton(&self, baton: Baton) {
        *self.entry().baton.lock().unwrap_or_else(|p| p.into_inner()) = Some(Box::new(baton));
    }

    /// The baton of hand-off `local` of the lock taken at `counter`, if it is still there.
    pub(crate) fn take_baton_if(&self, counter: u64, local: u32) -> Option<Baton> {
        let mut baton = self.entry().baton.lock().unwrap_or_else(|p| p.into_inner());
        if baton.as_ref().is_some_and(|b| b.is(counter, local)) {
            return baton.take().map(|b| *b);
        }
        None
    }

    /// Whether the baton of hand-off `local` of the lock taken at `counter` is still there.
    pub(crate) fn has_baton(&self, counter: u64, local: u32) -> bool {
        let baton = self.entry().baton.lock().unwrap_or_else(|p| p.into_inner());
        baton.as_ref().is_some_and(|b| b.is(counter, local))
    }

    /// The lease a holder passed on, if one waits (only for the caller with the turn).
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        self.entry()
            .baton
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .map(|b| *b)
    }

    /// Records that `owner` holds the lock through `lease`.
    pub(crate) fn set_holder(&self, owner: Owner, lease: &Arc<LeaseInfo>) {
        *self
            .entry()
            .holder
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((owner, Arc::downgrade(lease)));
    }

    /// Records that `owner` holds a read share through `lease`.
    pub(crate) fn add_sharer(&self, owner: Owner, lease: &Arc<LeaseInfo>) {
        let mut sharers = self
            .entry()
            .sharers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        sharers.retain(|(_, l)| l.upgrade().is_some_and(|l| !l.lost.is_cancelled()));
        sharers.push((owner, Arc::downgrade(lease)));
    }

    /// Whether `owner` holds a read share through this locker right now.
    pub(crate) fn shared_by(&self, owner: Owner) -> bool {
        let sharers = self
            .entry()
            .sharers
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        sharers.iter().any(|(o, lease)| {
            *o == owner && lease.upgrade().is_some_and(|l| !l.lost.is_cancelled())
        })
    }

    /// Whether `owner` holds the lock through this locker right now (a live guard).
    pub(crate) fn held_by(&self, owner: Owner) -> bool {
        let holder = self
            .entry()
            .holder
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        holder.as_ref().is_some_and(|(o, lease)| {
            *o == owner && lease.upgrade().is_some_and(|l| !l.lost.is_cancelled())
        })
    }

    /// Starts listening for releases; once this returns, no later release is missed.
    pub(crate) async fn listen(&self) -> Result<Listener<'_>, BackendError> {
        {
            let _map = self.shared.entries();
            self.entry().listeners.fetch_add(1, Ordering::Relaxed);
        }
        let listener = Listener { handle: self };
        if let Some(sub) = &self.shared.remote {
            // Every listener asks; the subscriber answers at once when already subscribed, and
            // its queue orders this after any pending unsubscribe of the same channel.
            sub.subscribe(&self.tag).await?;
        }
        Ok(listener)
    }
}

impl Clone for EntryHandle {
    fn clone(&self) -> Self {
        // Under the map lock, like every other clone and drop (see `Drop`).
        let _map = self.shared.entries();
        EntryHandle {
            shared: self.shared.clone(),
            tag: self.tag.clone(),
            entry: self.entry.clone(),
        }
    }
}

impl Drop for EntryHandle {
    fn drop(&mut self) {
        let mut map = self.shared.entries();
        if let Some(entry) = self.entry.take() {
            drop(entry);
            // Under the map lock every clone is created or dropped, so the count is exact.
            if map
                .get(&self.tag)
                .is_some_and(|e| Arc::strong_count(e) == 1)
            {
                map.remove(&self.tag);
            }
        }
    }
}

/// A registered interest in release messages for one key.
pub(crate) struct Listener<'a> {
    handle: &'a EntryHandle,
}

impl Listener<'_> {
    /// A future that completes on the next release message (enable it before retrying).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.handle.entry().notify.notified()
    }

    /// Claims a lock a release handed to `token`, if its message has arrived.
    pub(crate) fn take_grant(&self, token: &str) -> Option<Grant> {
        let mut grants = self
            .handle
            .entry()
            .grants
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let i = grants.iter().position(|g| g.token == token)?;
        Some(grants.remove(i))
    }
}

impl Drop for Listener<'_> {
    fn drop(&mut self) {
        let last = {
            let _map = self.handle.shared.entries();
            self.handle
                .entry()
                .listeners
                .fetch_sub(1, Ordering::Relaxed)
                == 1
        };
        if last && let Some(sub) = &self.handle.shared.remote {
            sub.unsubscribe(&self.handle.tag);
        }
    }
}

/// Where a grant's lease starts on this clock: the latest busy attempt's send time `attempt`
/// plus the server time from that attempt to the granting release (the release ran after the
/// attempt reached Redis, so this is no later than the grant), but no later than the message's
/// arrival (a server clock that jumped ahead must not stretch the lease). Without that time,
/// the attempt's send time.
pub(crate) fn granted_at(attempt: Instant, grant: &Grant) -> Instant {
    let most = grant.arrived.saturating_duration_since(attempt);
    attempt + grant.after_attempt.map_or(Duration::ZERO, |d| d.min(most))
}

/// `fut`'s output, or `None` if `deadline` passes first (`None` deadline: no limit).
pub(crate) async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Counts a caller in a gauge for as long as it lives.
pub(crate) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    pub(crate) fn new(gauge: &'a AtomicUsize) -> Self {
        // Release: whoever sees the count sees what the caller did before (joined a queue).
        gauge.fetch_add(1, Ordering::Release);
        crate::metrics::waiting(1.0);
        Counted(gauge)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
        crate::metrics::waiting(-1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::time::Instant;

    fn grant(after_attempt: Option<Duration>, arrived: Instant) -> Grant {
        Grant {
            token: String::new(),
            fence: 1,
            after_attempt,
            arrived,
        }
    }

    #[test]
    fn a_grant_starts_at_the_release_but_never_after_its_message_arrived() {
        let ms = Duration::from_millis;
        let attempt = Instant::now();
        let arrived = attempt + ms(900);
        // The release ran 800 ms after the attempt reached Redis.
        assert_eq!(
            granted_at(attempt, &grant(Some(ms(800)), arrived)),
            attempt + ms(800)
        );
        // A server clock that jumped ahead cannot move the start past the message.
        assert_eq!(
            granted_at(attempt, &grant(Some(ms(5_000)), arrived)),
            arrived
        );
        // A release that did not know the attempt's time: the attempt's send time.
        assert_eq!(granted_at(attempt, &grant(None, arrived)), attempt);
    }
}
