//! In-process locks with the Redis backend's semantics: owner tokens, leases that expire on a
//! monotonic clock, owner-checked renew and release, strictly increasing fences. Used by
//! `Locker::in_memory()` for unit tests and local development. Never awaits while holding its
//! mutex (every operation is a short synchronous critical section).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

mod queue;

use self::queue::{Queue, Share, Shared};
use super::contract::{
    Attempt, Events, Holders, LockState, Notice, Queueing, Renewal, SharedState, Token,
};
use crate::key::LockKey;
use crate::options::LockKind;
use crate::owner::{self, Holder};

struct Held {
    token: Token,
    fence: u64,
    expires: Instant,
    /// The holder's identity as the Redis owner key holds it: `<acquired-at ms>|<owner>`.
    owner: Box<str>,
    /// Released but kept taken until `expires` (`min_hold`): no request of the token changes
    /// it any more, as release.lua's `kept_by` rules.
    kept: bool,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    /// Keys held by readers or a semaphore's permits.
    shared: HashMap<String, Shared>,
    /// Keys with callers waiting (only those that may wait queue).
    queues: HashMap<String, Queue>,
    // One counter for all keys: strictly increasing per key across holders, and no state at
    // all per idle key.
    last_fence: u64,
    // Size at which expired entries are swept, so abandoned keys cannot pile up.
    sweep_at: usize,
    /// Notes for operators (`put_note`): text and expiry.
    notes: HashMap<String, (String, Instant)>,
}

impl State {
    /// Drops lapsed entries once the maps have doubled since the last sweep, so abandoned keys
    /// cannot pile up.
    fn sweep(&mut self, now: Instant) {
        let size = self.locks.len() + self.shared.len() + self.queues.len();
        if size < self.sweep_at.max(1024) {
            return;
        }
        self.locks.retain(|_, h| h.expires > now);
        self.shared.retain(|_, s| s.live(now) > 0);
        self.queues.retain(|_, q| !q.is_empty());
        self.notes.retain(|_, (_, expires)| *expires > now);
        self.sweep_at = (self.locks.len() + self.shared.len() + self.queues.len()) * 2;
    }

    /// The live shares of `lock`, if any.
    fn shares(&mut self, lock: &str, now: Instant) -> Option<&mut Shared> {
        let live = self.shared.get_mut(lock).map(|s| s.live(now));
        if live == Some(0) {
            self.shared.remove(lock);
        }
        self.shared.get_mut(lock)
    }

    fn live_lock(&self, lock: &str, now: Instant) -> Option<&Held> {
        self.locks.get(lock).filter(|h| h.expires > now)
    }

    /// What `lock` is in use as, when that is not `kind` (a lock or write lock, readers, a
    /// semaphore of another size) and the two cannot meet: its holders' kind, or with none,
    /// what the longest live waiter asked for (its place came first).
    fn conflict(&mut self, lock: &str, kind: LockKind, now: Instant) -> Option<LockKind> {
        let locked = self.live_lock(lock, now).is_some();
        let waiting = (self.queues.get_mut(lock)).and_then(|q| q.first_kind(now));
        let shared = match self.shares(lock, now).map(|s| s.kind) {
            Some(k) => Some(k),
            None if locked => None,
            None => waiting,
        };
        match (kind, shared) {
            (LockKind::Permits(_), _) if locked => Some(LockKind::Exclusive),
            (LockKind::Permits(n), Some(found)) if found != LockKind::Permits(n) => Some(found),
            (LockKind::Exclusive | LockKind::Read, Some(found @ LockKind::Permits(_))) => {
                Some(found)
            }
            _ => None,
        }
    }

    /// `token`'s own live lock or share of `lock`, extended by `ttl`: its fence.
    fn refresh(
        &mut self,
        lock: &str,
        kind: LockKind,
        token: &Token,
        ttl: Duration,
        now: Instant,
    ) -> Option<u64> {
        if kind.is_shared() {
            let share = self.shares(lock, now)?.shares.iter_mut();
            let share = share.into_iter().find(|s| s.token == *token)?;
            share.expires = now + ttl;
            return Some(share.fence);
        }
        let held = self.locks.get_mut(lock).filter(|h| h.expires > now)?;
        (held.token == *token && !held.kept).then(|| {
            held.expires = now + ttl;
            held.fence
        })
    }

    /// Whether holders keep `token` out of `lock` (`Some`, with the time until the first of
    /// them ends, when known) and, for a semaphore, the free permits.
    fn busy(
        &mut self,
        lock: &str,
        kind: LockKind,
        token: &Token,
        now: Instant,
    ) -> (Option<Option<Duration>>, Option<usize>) {
        let locked = self
            .live_lock(lock, now)
            .filter(|h| h.token != *token)
            .map(|h| h.expires - now);
        let shares = self.shares(lock, now);
        let (live, first_end) = shares.map_or((0, None), |s| (s.shares.len(), s.first_end(now)));
        match kind {
            LockKind::Permits(n) => {
                let room = usize::try_from(n)
                    .unwrap_or(usize::MAX)
                    .saturating_sub(live);
                ((room == 0).then_some(first_end), Some(room))
            }
            LockKind::Read => (locked.map(Some), None),
            _ if locked.is_some() => (Some(locked), None),
            _ => ((live > 0).then_some(first_end), None),
        }
    }

    /// Takes `token` out of `lock`'s queue: whether it was queued.
    fn leave_queue(&mut self, lock: &str, token: &Token) -> bool {
        let Some(q) = self.queues.get_mut(lock) else {
            return false;
        };
        let queued = q.leave(token);
        if q.is_empty() {
            self.queues.remove(lock);
        }
        queued
    }

    fn renew_share(&mut self, lock: &str, token: &Token, until: Instant, now: Instant) -> bool {
        let share = self
            .shares(lock, now)
            .and_then(|s| s.shares.iter_mut().find(|s| s.token == *token));
        share.map(|s| s.expires = until).is_some()
    }

    /// Ends `token`'s share of `lock`: whether it was live.
    fn release_share(&mut self, lock: &str, token: &Token, now: Instant) -> bool {
        let Some(shared) = self.shares(lock, now) else {
            return false;
        };
        let before = shared.shares.len();
        shared.shares.retain(|s| s.token != *token);
        let released = shared.shares.len() < before;
        if shared.shares.is_empty() {
            self.shared.remove(lock);
        }
        released
    }
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

    pub(crate) fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        queue: Option<Queueing>,
    ) -> Attempt {
        let now = Instant::now();
        let mut st = self.state();
        st.sweep(now);
        let lock = key.lock();
        if let Some(found) = st.conflict(lock, key.kind, now) {
            return Attempt::Conflict { found };
        }
        if let Some(fence) = st.refresh(lock, key.kind, token, ttl, now) {
            return Attempt::Acquired { fence };
        }
        let (busy, room) = st.busy(lock, key.kind, token, now);
        let queued = st.queues.get_mut(lock);
        let let_in = queued.is_none_or(|q| q.lets_in(token, key.kind, room, now));
        if busy.is_some() || !let_in {
            if let Some(q) = queue {
                let places = st.queues.entry(lock.to_owned()).or_default();
                places.join(token, key.kind, q.register, now);
            }
            return Attempt::Held {
                pttl: busy.flatten(),
                counter: Some(st.last_fence),
            };
        }
        st.leave_queue(lock, token);
        st.last_fence += 1;
        let fence = st.last_fence;
        let owner: Box<str> = owner::record(wall_ms(), &self.owner).into();
        let expires = now + ttl;
        if key.kind.is_shared() {
            let shared = st.shared.entry(lock.to_owned()).or_insert(Shared {
                kind: key.kind,
                shares: Vec::new(),
            });
            let token = *token;
            shared.shares.push(Share {
                token,
                fence,
                expires,
                owner,
            });
        } else {
            let token = *token;
            let held = Held {
                token,
                fence,
                expires,
                owner,
                kept: false,
            };
            st.locks.insert(lock.to_owned(), held);
        }
        Attempt::Acquired { fence }
    }

    pub(crate) fn renew(&self, batch: &[Renewal]) -> Vec<bool> {
        let now = Instant::now();
        let mut st = self.state();
        batch
            .iter()
            .map(|r| {
                let lock = r.key.lock();
                if r.key.kind.is_shared() {
                    return st.renew_share(lock, r.token, now + r.lease, now);
                }
                match st.locks.get_mut(lock) {
                    Some(h) if h.expires > now && h.token == *r.token && !h.kept => {
                        h.expires = now + r.lease;
                        if let Some(place) = r.passed_to {
                            h.owner = owner::record_passed(wall_ms(), &self.owner, place).into();
                        }
                        true
                    }
                    _ => false,
                }
            })
            .collect()
    }

    /// `min_hold`: `token`'s live lock stays taken for `lease` more, owned by nobody (see
    /// `Held::kept`). Whether `token` held it.
    pub(crate) fn keep(&self, key: &LockKey, token: &Token, lease: Duration) -> bool {
        let now = Instant::now();
        let mut st = self.state();
        match st.locks.get_mut(key.lock()) {
            Some(h) if h.expires > now && h.token == *token && !h.kept => {
                h.expires = now + lease;
                h.kept = true;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn release(&self, key: &LockKey, token: &Token) -> bool {
        let now = Instant::now();
        let (freed, unqueued) = {
            let mut st = self.state();
            let unqueued = st.leave_queue(key.lock(), token);
            let freed = if key.kind.is_shared() {
                st.release_share(key.lock(), token, now)
            } else {
                match st.locks.get(key.lock()) {
                    Some(h) if h.token == *token => {
                        let live = h.expires > now;
                        st.locks.remove(key.lock());
                        live
                    }
                    _ => false,
                }
            };
            (freed, unqueued)
        };
        // A waiter that gave up may have held back readers or later permits.
        if freed || unqueued {
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

    /// Writes `text` (this locker's owner record appended) at `name` for `ttl`, as the Redis
    /// backend's `SET .. PX`.
    pub(crate) fn put_note(&self, name: &str, text: &str, ttl: Duration) {
        let now = Instant::now();
        let mut st = self.state();
        st.sweep(now);
        let value = format!("{text}|{}", self.owner);
        st.notes.insert(name.to_owned(), (value, now + ttl));
    }

    /// The live note at `name`, if any.
    pub(crate) fn get_note(&self, name: &str) -> Option<String> {
        let now = Instant::now();
        let st = self.state();
        st.notes
            .get(name)
            .filter(|(_, expires)| *expires > now)
            .map(|(text, _)| text.clone())
    }

    /// One live lock as inspection reports it.
    pub(crate) fn inspect(&self, lock: &str) -> Option<LockState> {
        let now = Instant::now();
        let mut st = self.state();
        let waiters = st.queues.get(lock).map_or(0, Queue::len);
        if let Some(h) = st.live_lock(lock, now) {
            return Some(LockState {
                fence: Some(h.fence),
                remaining: Some(h.expires - now),
                holder: Holder::parse(&h.owner),
                waiters,
                kind: LockKind::Exclusive,
                shared: Vec::new(),
                kept: h.kept,
            });
        }
        let shared = st.shares(lock, now)?;
        let shares: Vec<SharedState> = (shared.shares.iter())
            .map(|s| SharedState {
                fence: Some(s.fence),
                remaining: s.expires - now,
                holder: Holder::parse(&s.owner),
            })
            .collect();
        Some(LockState {
            fence: shares.iter().filter_map(|s| s.fence).max(),
            remaining: shares.iter().map(|s| s.remaining).max(),
            holder: None,
            waiters,
            kind: shared.kind,
            shared: shares,
            kept: false,
        })
    }

    /// Live lock names matching `pattern` (`*` and `?` globs), sorted: locks, and keys held
    /// by readers or permits.
    pub(crate) fn scan(&self, pattern: &str) -> Vec<String> {
        let now = Instant::now();
        let st = self.state();
        let locks = (st.locks.iter()).filter(|(_, h)| h.expires > now);
        let shared = (st.shared.iter()).filter(|(_, s)| s.shares.iter().any(|s| s.expires > now));
        let mut out: Vec<String> = locks
            .map(|(k, _)| k)
            .chain(shared.map(|(k, _)| k))
            .filter(|k| glob(pattern, k))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// Removes the lock, or every read share or permit of the key, whoever holds it; its
    /// holders' lease monitors declare it lost at once.
    pub(crate) fn force_release(&self, key: &LockKey) -> bool {
        let now = Instant::now();
        let revoked: Vec<Token> = {
            let mut st = self.state();
            let lock = (st.locks.remove(key.lock()))
                .filter(|h| h.expires > now)
                .map(|h| h.token);
            let shares = st.shared.remove(key.lock()).map(|s| s.shares);
            let shares = shares.into_iter().flatten().filter(|s| s.expires > now);
            lock.into_iter().chain(shares.map(|s| s.token)).collect()
        };
        if revoked.is_empty() {
            return false;
        }
        let holders: Vec<_> = (self.space.holders.lock().unwrap_or_else(|p| p.into_inner()))
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for h in holders {
            for token in &revoked {
                // In process: this is the forced unlock itself, not a message anyone could send.
                h.revoked(token.as_str());
            }
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
        let Attempt::Acquired { fence } = m.acquire(&key, &a, ttl, None) else {
            panic!("free lock not taken")
        };
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert_eq!(m.pttl(key.lock()), Some(Duration::from_millis(1)));
        assert_eq!(
            m.acquire(&key, &b, ttl, None),
            Attempt::Held {
                pttl: Some(Duration::from_millis(1)),
                counter: Some(fence)
            }
        );
        let renewal = |t| Renewal {
            key: &key,
            token: t,
            counter: 0,
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
        let Attempt::Acquired { fence: next } = m.acquire(&key, &b, ttl, None) else {
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
