//! Revocation bookkeeping of the subscriber (`pubsub.rs`): which revoke channels the
//! locker's held leases want, and which lease monitors hear of a revoked token.
//!
//! While its locker holds any lock, the task also listens on the revoke channel
//! `{<prefix>}:revoke` (`LockKey::revoke_channel`; no lock's own channel can have that name, a key is
//! never empty): a forced unlock publishes there the token it took the lock from, and the task
//! hands it to the lease monitors ([`Holders`]), which declare that lease lost at once. One
//! subscription per locker, made in the background when it takes its first lock and kept
//! `LINGER` after its last. After a lost connection, the monitors renew every lease as soon as
//! the channel is subscribed again (a revocation may have been published meanwhile); a message
//! missed otherwise (not yet subscribed right after the first lock, an ACL without the
//! channel) leaves the loss to the holder's next renewal.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::backend::contract::Holders;
use crate::key::LockKey;

/// A prefix's revoke channel and how many leases are held under it.
type HeldUnder = (Arc<str>, usize);

/// Who holds locks and who is told of revocations, shared by the handle and the task.
#[derive(Default)]
pub(crate) struct Revocations {
    /// Leases held per prefix, with that prefix's revoke channel.
    held: Mutex<HashMap<Arc<str>, HeldUnder>>,
    holders: Mutex<Vec<Weak<dyn Holders>>>,
}

impl Revocations {
    /// The revoke channels some lease is held under.
    pub(crate) fn wanted(&self) -> Vec<Arc<str>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.values()
            .filter(|(_, n)| *n > 0)
            .map(|(c, _)| c.clone())
            .collect()
    }

    pub(crate) fn is_wanted(&self, channel: &str) -> bool {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.values().any(|(c, n)| *n > 0 && &**c == channel)
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

    pub(crate) fn resubscribed(&self) {
        for h in self.holders() {
            h.resubscribed();
        }
    }

    /// Tells `holders` of every token revoked on a channel the subscriber listens to.
    pub(crate) fn attach(&self, holders: Weak<dyn Holders>) {
        let mut h = self.holders.lock().unwrap_or_else(|p| p.into_inner());
        h.retain(|w| w.strong_count() > 0);
        h.push(holders);
    }

    /// One more lease held under `key`'s prefix: the prefix as kept here, and its revoke
    /// channel when this is the only lease under it (the channel to subscribe).
    pub(crate) fn hold(&self, key: &LockKey) -> (Arc<str>, Option<Arc<str>>) {
        let prefix = key.prefix();
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get_key_value(prefix).map(|(p, _)| p.clone()) {
            Some(p) => {
                let (channel, n) = held.get_mut(&*p).expect("found above");
                *n += 1;
                let first = (*n == 1).then(|| channel.clone());
                (p, first)
            }
            None => {
                let p: Arc<str> = prefix.into();
                let channel: Arc<str> = key.revoke_channel().into();
                held.insert(p.clone(), (channel.clone(), 1));
                (p, Some(channel))
            }
        }
    }

    /// One lease fewer under `prefix`: its revoke channel when that was the last lease under
    /// it (the channel to unsubscribe).
    pub(crate) fn unhold(&self, prefix: &str) -> Option<Arc<str>> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match held.get_mut(prefix) {
            Some((channel, n)) => {
                *n -= 1;
                (*n == 0).then(|| channel.clone())
            }
            None => None,
        }
    }
}
