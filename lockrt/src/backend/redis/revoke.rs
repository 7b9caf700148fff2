//! Revocation bookkeeping of the subscriber (`pubsub.rs`): which revoke channels the
//! locker's held leases want, and which lease monitors hear of a revoked token.
//!
//! While its locker holds any lock, the task also listens on the lock's revoke channel
//! (`Delivery::revoke_channel`: `{<prefix>}:revoke` when broadcast, one per slot and prefix
//! when sharded; no lock's own channel can have such a name): a forced unlock publishes
//! there the token it took the lock from, and the task hands it to the lease monitors
//! ([`Holders`]), which declare that lease lost at once. One subscription per channel, made
//! in the background when the locker takes its first lock there and kept `LINGER` after its
//! last. After a lost connection, the monitors renew every lease as soon as the channel is
//! subscribed again (a revocation may have been published meanwhile); a message missed
//! otherwise (not yet subscribed right after the first lock, an ACL without the channel)
//! leaves the loss to the holder's next renewal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::wire::Delivery;
use crate::backend::contract::Holders;
use crate::key::LockKey;

/// A revoke channel, how many leases are held with it, and whether the task has been told to
/// listen on it (`announced`) and since when no lease is held with it.
struct Channel {
    channel: Arc<str>,
    held: usize,
    announced: bool,
    idle_since: Option<Instant>,
}

/// Who holds locks and who is told of revocations, shared by the handle and the task.
///
/// Taking and releasing a lock with an announced channel only counts, under a mutex: no
/// message to the task and no wake-up of it (one per acquisition and one per release used to
/// cost the uncontended path two cross-thread wake-ups). The task finds the channels nobody
/// holds under any more by sweeping ([`Revocations::sweep`]) while it listens to any.
#[derive(Default)]
pub(crate) struct Revocations {
    held: Mutex<HashMap<Arc<str>, Channel>>,
    holders: Mutex<Vec<Weak<dyn Holders>>>,
}

impl Revocations {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, Channel>> {
        // Only counters and flags change under it: a panic can't leave it torn.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The revoke channels the task has been told to listen on (held under, or lingering).
    pub(crate) fn wanted(&self) -> Vec<Arc<str>> {
        let held = self.table();
        held.values()
            .filter(|p| p.announced)
            .map(|p| p.channel.clone())
            .collect()
    }

    /// Forgets what the task was told (a new task starts): the channels held under, to
    /// announce to the new one.
    pub(crate) fn reannounce(&self) -> Vec<Arc<str>> {
        let mut held = self.table();
        held.retain(|_, p| p.held > 0);
        held.values_mut()
            .map(|p| {
                p.announced = true;
                p.channel.clone()
            })
            .collect()
    }

    /// Tells `holders` of every token revoked on a channel the subscriber listens to.
    pub(crate) fn attach(&self, holders: Weak<dyn Holders>) {
        let mut h = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        h.retain(|w| w.strong_count() > 0);
        h.push(holders);
    }

    fn holders(&self) -> Vec<Arc<dyn Holders>> {
        let mut h = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        h.retain(|w| w.strong_count() > 0);
        h.iter().filter_map(Weak::upgrade).collect()
    }

    pub(crate) fn revoke(&self, token: &str) {
        for h in self.holders() {
            h.revoke(token);
        }
    }

    /// `channel` is listened to now: the leases held under it are checked at once.
    pub(crate) fn resubscribed(&self, channel: &str, delivery: Delivery) {
        let on_channel = |key: &LockKey| delivery.revoke_channel(key) == channel;
        for h in self.holders() {
            h.resubscribed(&on_channel);
        }
    }

    /// One more lease held with revoke channel `channel`: the channel as kept here, and the
    /// channel again when the task has not been told to listen on it (the one to announce).
    pub(crate) fn hold(&self, channel: &str) -> (Arc<str>, Option<Arc<str>>) {
        let mut held = self.table();
        if let Some(p) = held.get_key_value(channel).map(|(p, _)| p.clone()) {
            let entry = held.get_mut(&*p).expect("found above");
            entry.held += 1;
            entry.idle_since = None;
            let announce = (!entry.announced).then(|| entry.channel.clone());
            entry.announced = true;
            return (p, announce);
        }
        let channel: Arc<str> = channel.into();
        let entry = Channel {
            channel: channel.clone(),
            held: 1,
            announced: true,
            idle_since: None,
        };
        held.insert(channel.clone(), entry);
        (channel.clone(), Some(channel))
    }

    /// Whether a lease is held under `channel` (the task subscribes it then); if none is, the
    /// channel is no longer announced, so that the next lease under it announces it again.
    pub(crate) fn still_held(&self, channel: &str) -> bool {
        let mut held = self.table();
        let Some(entry) = held.get_mut(channel) else {
            return false;
        };
        if entry.held > 0 {
            return true;
        }
        entry.announced = false;
        false
    }

    /// One lease fewer with revoke channel `channel`; the task unsubscribes it `linger`
    /// after the last one went (see [`Revocations::sweep`]).
    pub(crate) fn unhold(&self, channel: &str) {
        let mut held = self.table();
        if let Some(entry) = held.get_mut(channel) {
            entry.held = entry.held.saturating_sub(1);
            if entry.held == 0 {
                entry.idle_since = Some(Instant::now());
            }
        }
    }

    /// The announced channels nobody has held under for `linger` (no longer announced: a
    /// later lease announces them again), and when to sweep next (`None`: nothing announced).
    pub(crate) fn sweep(&self, now: Instant, linger: Duration) -> (Vec<Arc<str>>, Option<Instant>) {
        let mut held = self.table();
        let mut due = Vec::new();
        let mut next: Option<Instant> = None;
        held.retain(|_, p| {
            if !p.announced {
                return p.held > 0;
            }
            let at = p.idle_since.map_or(now + linger, |since| since + linger);
            if p.held == 0 && at <= now {
                due.push(p.channel.clone());
                return false;
            }
            next = Some(next.map_or(at, |n| n.min(at)));
            true
        });
        (due, next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_prefix_is_announced_once_and_swept_a_linger_after_its_last_lease() {
        let r = Revocations::default();
        let key = LockKey::new("app", "a").unwrap();
        let other = LockKey::new("app", "b").unwrap();
        let linger = Duration::from_millis(500);
        let (prefix, announce) = r.hold(&key.revoke_channel());
        assert_eq!(announce.as_deref(), Some(&*key.revoke_channel()));
        // Same prefix: counted, no message to the task.
        assert!(r.hold(&other.revoke_channel()).1.is_none());
        r.unhold(&prefix);
        r.unhold(&prefix);
        assert_eq!(r.wanted().len(), 1, "lingering channels stay wanted");
        let (due, next) = r.sweep(Instant::now(), linger);
        assert!(due.is_empty());
        assert_eq!(next, Some(Instant::now() + linger));
        // Held again within the linger: still announced, nothing to send.
        tokio::time::advance(linger / 2).await;
        assert!(r.hold(&key.revoke_channel()).1.is_none());
        tokio::time::advance(linger).await;
        let (due, next) = r.sweep(Instant::now(), linger);
        assert!(due.is_empty(), "a held prefix is never swept");
        assert!(next.is_some());
        r.unhold(&prefix);
        tokio::time::advance(linger).await;
        let (due, next) = r.sweep(Instant::now(), linger);
        assert_eq!(due, vec![Arc::from(key.revoke_channel())]);
        assert!(next.is_none() && r.wanted().is_empty());
        // After the sweep, the next lease announces the channel again.
        assert!(r.hold(&key.revoke_channel()).1.is_some());
        assert_eq!(r.reannounce().len(), 1);
    }
}
