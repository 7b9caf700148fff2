//! In-process locks with the Redis backend's semantics: owner tokens, leases that expire on a
//! monotonic clock, owner-checked renew and release, strictly increasing fences. Used by
//! `Locker::in_memory()` for unit tests and local development. Never awaits while holding its
//! mutex (every operation is a short synchronous critical section).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::contract::{Attempt, Events, Holders, LockState, Notice, Renewal, Token};
use crate::key::LockKey;
use crate::owner::{self, Holder};

struct Held {
    token: Token,
    fence: u64,
    expires: Instant,
    /// The holder's identity as the Redis owner key holds it: `<acquired-at ms>|<owner>`.
    owner: Box<str>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    // One counter for all keys: strictly increasing per key across holders, and no state at
    // all per idle key.
    last_fence: u64,
    // Size at which expired entries are swept, so abandoned keys cannot pile up.
    sweep_at: usize,
}

/// The locks, shared by the lockers of one lock space ([`MemoryBackend::peer`]).
#[derive(Default)]
struct Space {
    state: Mutex<State>,
    /// The waiting side of every locker on this lock space, told of each release (what
    /// Redis pub/sub does across processes).
    peers: Mutex<Vec<Weak<dyn Events>>>,
    /// The lease monitors of every locker on this lock space, told of a forced unlock (what
    /// the revoke channel does across processes).
    holders: Mutex<Vec<Weak<dyn Holders>>>,
}

#[derive(Default)]
pub(crate) struct MemoryBackend {
    space: Arc<Space>,
    /// The identity written beside each lock this locker takes.
    owner: String,
}

impl MemoryBackend {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave the map half-updated (single inserts and
        // removes), so a poisoned lock is safe to keep using.
        self.space.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A lock space whose locks record `owner` as their holder.
    pub(crate) fn with_owner(owner: String) -> MemoryBackend {
        MemoryBackend {
            owner,
            ..MemoryBackend::default()
        }
    }

    /// The same lock space for another locker, whose locks record `owner`.
    pub(crate) fn peer(&self, owner: String) -> MemoryBackend {
        MemoryBackend {
            space: self.space.clone(),
            owner,
        }
    }

    /// The identity written beside each lock taken here.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    pub(crate) fn acquire(&self, key: &LockKey, token: &Token, ttl: Duration) -> Attempt {
        let now = Instant::now();
        let mut st = self.state();
        if st.locks.len() >= st.sweep_at.max(1024) {
            st.locks.retain(|_, h| h.expires > now);
            st.sweep_at = st.locks.len() * 2;
        }
        if let Some(h) = st.locks.get_mut(key.lock())
            && h.expires > now
        {
            if h.token == *token {
                h.expires = now + ttl;
                return Attempt::Acquired { fence: h.fence };
            }
            return Attempt::Held {
                pttl: Some(h.expires - now),
                counter: Some(st.last_fence),
            };
        }
        st.last_fence += 1;
        let fence = st.last_fence;
        st.locks.insert(
            key.lock().to_owned(),
            Held {
                token: *token,
                fence,
                expires: now + ttl,
                owner: owner::record(wall_ms(), &self.owner).into(),
            },
        );
        Attempt::Acquired { fence }
    }

    pub(crate) fn renew(&self, batch: &[Renewal]) -> Vec<bool> {
        let now = Instant::now();
        let mut st = self.state();
        batch
            .iter()
            .map(|r| match st.locks.get_mut(r.lock) {
                Some(h) if h.expires > now && h.token == *r.token => {
                    h.expires = now + r.lease;
                    if let Some(place) = r.passed_to {
                        h.owner = owner::record_passed(wall_ms(), &self.owner, place).into();
                    }
                    true
                }
                _ => false,
            })
            .collect()
    }

    pub(crate) fn release(&self, key: &LockKey, token: &Token) -> bool {
        let now = Instant::now();
        let freed = {
            let mut st = self.state();
            match st.locks.get(key.lock()) {
                Some(h) if h.token == *token => {
                    let live = h.expires > now;
                    st.locks.remove(key.lock());
                    live
                }
                _ => false,
            }
        };
        if freed {
            self.announce(&key.tag);
        }
        freed
    }

    /// Adds a locker's waiting side to the release announcements.
    pub(crate) fn attach(&self, events: Weak<dyn Events>) {
        let mut peers = self.space.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.retain(|p| p.strong_count() > 0);
        peers.push(events);
    }

    fn announce(&self, tag: &str) {
        let peers: Vec<_> = self
            .space
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for p in peers {
            p.message(tag, Notice::Released);
        }
    }

    /// One live lock as inspection reports it.
    pub(crate) fn inspect(&self, lock: &str) -> Option<LockState> {
        let now = Instant::now();
        self.state()
            .locks
            .get(lock)
            .filter(|h| h.expires > now)
            .map(|h| LockState {
                fence: Some(h.fence),
                remaining: Some(h.expires - now),
                holder: Holder::parse(&h.owner),
                waiters: 0,
            })
    }

    /// Live lock names matching `pattern` (`*` and `?` globs), sorted.
    pub(crate) fn scan(&self, pattern: &str) -> Vec<String> {
        let now = Instant::now();
        let mut out: Vec<String> = self
            .state()
            .locks
            .iter()
            .filter(|(k, h)| h.expires > now && glob(pattern, k))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out
    }

    /// Removes the lock whoever holds it; its holder's lease monitor declares it lost at once.
    pub(crate) fn force_release(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let revoked = {
            let mut st = self.state();
            st.locks
                .remove(key.lock())
                .filter(|h| h.expires > now)
                .map(|h| h.token)
        };
        let Some(token) = revoked else {
            return false;
        };
        let holders: Vec<_> = (self.space.holders.lock().unwrap_or_else(|p| p.into_inner()))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for h in holders {
            // In process: this is the forced unlock itself, not a message anyone could send.
            h.revoked(token.as_str());
        }
        self.announce(&key.tag);
        true
    }

    /// Adds a lease monitor to the forced-unlock announcements.
    pub(crate) fn attach_holders(&self, holders: Weak<dyn Holders>) {
        let mut all = self.space.holders.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|h| h.strong_count() > 0);
        all.push(holders);
    }

    /// Remaining lease of a lock, for tests and introspection.
    pub(crate) fn pttl(&self, lock: &str) -> Option<Duration> {
        let now = Instant::now();
        self.state()
            .locks
            .get(lock)
            .filter(|h| h.expires > now)
            .map(|h| h.expires - now)
    }
}

/// The wall clock in ms since the Unix epoch (the owner record's acquired-at).
fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether `name` matches glob `pattern` (`*`, `?`, `[..]` taken literally: enough for the
/// in-memory backend).
fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("lock:*", "lock:a:b"));
        assert!(glob("lock:?", "lock:a"));
        assert!(!glob("lock:?", "lock:ab"));
        assert!(glob("*b*", "abc"));
        assert!(!glob("a*c", "abd"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_ends_exactly_at_its_ttl_and_only_the_owner_renews_it() {
        let m = MemoryBackend::default();
        let key = LockKey::new("lock:", "k").unwrap();
        let (a, b) = (Token::new(), Token::new());
        let ttl = Duration::from_secs(3);
        let Attempt::Acquired { fence } = m.acquire(&key, &a, ttl) else {
            panic!("free lock not taken")
        };
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert_eq!(m.pttl(key.lock()), Some(Duration::from_millis(1)));
        assert_eq!(
            m.acquire(&key, &b, ttl),
            Attempt::Held {
                pttl: Some(Duration::from_millis(1)),
                counter: Some(fence)
            }
        );
        let renewal = |t| Renewal {
            lock: key.lock(),
            token: t,
            lease: ttl,
            passed_to: None,
        };
        assert_eq!(m.renew(&[renewal(&b), renewal(&a)]), vec![false, true]);
        tokio::time::advance(ttl).await;
        assert_eq!(
            m.pttl(key.lock()),
            None,
            "expired exactly a ttl after the renewal"
        );
        let Attempt::Acquired { fence: next } = m.acquire(&key, &b, ttl) else {
            panic!("expired lock not taken")
        };
        assert!(next > fence);
        assert!(
            !m.release(&key, &a),
            "the old owner cannot release the new one's lock"
        );
        assert!(m.release(&key, &b));
    }
}
