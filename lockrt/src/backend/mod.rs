//! Where locks live. One enum over the backends (no boxing on the hot path); each backend
//! implements the same three atomic operations (acquire, renew a batch, release) with the same
//! owner-token semantics, so the waiting, lease and guard logic above never knows which it has.
//! Nothing here waits for a lock or keeps time: that is `wait.rs`, `lease.rs` and `monitor.rs`.

pub(crate) mod contract;
pub(crate) mod memory;
pub(crate) mod redis;

use std::time::Duration;

use std::sync::Weak;

use self::contract::{
    Attempt, Events, Found, Holders, LockState, Queueing, Released, Renewal, Renewed, Token,
    holder_fence,
};
use crate::error::BackendError;
use crate::key::LockKey;
use crate::owner::with_instance;

// One per `Locker`, behind an `Arc`: the size difference costs nothing, a `Box` would cost an
// indirection on every command. (TLS support makes the Redis variant larger.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Redis(redis::RedisBackend),
    Memory(memory::MemoryBackend),
}

impl Backend {
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        queue: Option<Queueing>,
    ) -> Result<Attempt, BackendError> {
        match self {
            Backend::Redis(b) => b.acquire(key, token, ttl, queue).await,
            // One process: a locker's writers queue on its per-key turn first; the backend's
            // queue orders lockers, readers and a semaphore's callers.
            Backend::Memory(b) => Ok(b.acquire(key, token, ttl, queue)),
        }
    }

    /// Takes every exclusive lock of `locks` in one atomic call when all are free with nobody
    /// queued: their fences in order, or `None` when any was not or the backend can't (in
    /// memory, or keys in several cluster slots): the caller then takes them one by one.
    pub(crate) async fn acquire_all(
        &self,
        locks: &[(&LockKey, &Token)],
        ttl: Duration,
    ) -> Result<Option<Vec<u64>>, BackendError> {
        let Backend::Redis(b) = self else {
            return Ok(None);
        };
        let group = locks.first().map(|(k, _)| b.renewal_group(k));
        if locks
            .iter()
            .any(|(k, _)| Some(b.renewal_group(k)) != group || k.kind.is_shared())
        {
            return Ok(None);
        }
        b.acquire_all(locks, ttl).await
    }

    /// Which renewals may share one call: a cluster slot (a script touches one slot, and a
    /// slow or unreachable master must delay only its own leases); one group otherwise.
    pub(crate) fn renewal_group(&self, key: &LockKey) -> u16 {
        match self {
            Backend::Redis(b) => b.renewal_group(key),
            Backend::Memory(_) => 0,
        }
    }

    /// Renews each lease if its token still owns it: one outcome per lease, so a failure
    /// affects only the leases it concerns. All of `batch` is of one [`renewal_group`]. On
    /// Redis, a call still unanswered at `hedge_at` is sent again at once on a fresh
    /// connection (see `RedisBackend::renew_hedged`).
    ///
    /// [`renewal_group`]: Backend::renewal_group
    pub(crate) async fn renew_hedged(
        &self,
        batch: &[Renewal<'_>],
        hedge_at: tokio::time::Instant,
    ) -> Vec<Renewed> {
        match self {
            Backend::Redis(b) => b.renew_hedged(batch, hedge_at).await,
            // In memory a forced unlock reaches its holder first hand (`Holders::revoked`).
            Backend::Memory(b) => (b.renew(batch).into_iter())
                .map(|held| Ok(if held { Found::Renewed } else { Found::Gone }))
                .collect(),
        }
    }

    /// Releases the lock if `token` owns it (handing it to a queued waiter, if any), and
    /// takes `token` out of the waiter queue either way. With `keep` (`min_hold`), the lock
    /// stays taken by `token` for that long instead. Success (also of a retry whose first
    /// try's reply was lost) only when this token's own release provably happened. `counter`:
    /// the fencing counter's value the lease was taken with.
    pub(crate) async fn release(
        &self,
        key: &LockKey,
        token: &Token,
        counter: u64,
        keep: Option<Duration>,
    ) -> Result<Released, BackendError> {
        match self {
            Backend::Redis(b) => b.release(key, token, counter, keep).await,
            Backend::Memory(b) => Ok(match keep {
                Some(keep) if b.keep(key, token, keep) => Released::Freed,
                Some(_) => Released::NotOwner,
                None if b.release(key, token) => Released::Freed,
                None => Released::NotOwner,
            }),
        }
    }

    /// Releases what an acquisition that ended without a guard may have left with `token`
    /// (the lock, a queue place), and refuses `token` from then on: a request of that
    /// acquisition still in the network takes nothing when it lands.
    pub(crate) async fn abandon(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Released, BackendError> {
        match self {
            Backend::Redis(b) => b.abandon(key, token).await,
            // In process, nothing is ever in flight once the call has returned.
            Backend::Memory(_) => self.release(key, token, 0, None).await,
        }
    }

    /// Whether a lock counts only once replicas acknowledged it (`sync_replicas`): a lock a
    /// release hands over is then confirmed by an acknowledged attempt before it is used.
    pub(crate) fn acknowledged_only(&self) -> bool {
        match self {
            Backend::Redis(b) => b.acknowledged_only(),
            Backend::Memory(_) => false,
        }
    }

    /// Release notifications from other processes, when the backend has any (Redis pub/sub).
    pub(crate) fn subscriber(&self) -> Option<redis::pubsub::Subscriber> {
        match self {
            Backend::Redis(b) => Some(b.subscriber()),
            Backend::Memory(_) => None,
        }
    }

    /// The state of lock `key`, `None` when nobody holds it.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<Option<LockState>, BackendError> {
        match self {
            Backend::Redis(b) => b.lock_state(key).await,
            Backend::Memory(b) => Ok(b.inspect(key.lock())),
        }
        .map(|state| {
            state.map(|s| LockState {
                // As a holder that took the lock from the backend reports it.
                // The holder running now: the lease may have been passed on in its process.
                fence: s.fence.map(|counter| {
                    holder_fence(counter, s.holder.as_ref().map_or(0, |h| h.handoff))
                }),
                ..s
            })
        })
    }

    /// Writes an operator's note `text` at Redis name `name` for `ttl` (with this locker's
    /// owner record appended): a job's latest run, which `lockctl jobs` reads.
    pub(crate) async fn put_note(
        &self,
        name: &str,
        text: &str,
        ttl: Duration,
    ) -> Result<(), BackendError> {
        match self {
            Backend::Redis(b) => b.put_note(name, text, ttl).await,
            Backend::Memory(b) => {
                b.put_note(name, text, ttl);
                Ok(())
            }
        }
    }

    /// The note at `name`, if any (see [`put_note`](Self::put_note)).
    pub(crate) async fn get_note(&self, name: &str) -> Result<Option<String>, BackendError> {
        match self {
            Backend::Redis(b) => b.get_note(name).await,
            Backend::Memory(b) => Ok(b.get_note(name)),
        }
    }

    /// The names of the held locks matching glob `pattern`, at most `limit`.
    pub(crate) async fn scan(
        &self,
        pattern: &str,
        limit: usize,
    ) -> Result<Vec<String>, BackendError> {
        match self {
            Backend::Redis(b) => b.scan(pattern, limit).await,
            Backend::Memory(b) => Ok(b.scan(pattern)),
        }
    }

    /// Releases lock `key` whoever holds it, revoking the holder: whether it was held.
    pub(crate) async fn force_release(&self, key: &LockKey) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(b) => Ok(b.force_release(key).await? != Released::NotOwner),
            Backend::Memory(b) => Ok(b.force_release(key)),
        }
    }

    /// Sends release notifications to `events`: the in-memory backend's own, Redis's come
    /// through the [`subscriber`](Self::subscriber) the caller attaches to.
    pub(crate) fn attach(&self, events: Weak<dyn Events>) {
        if let Backend::Memory(b) = self {
            b.attach(events);
        }
    }

    /// Sends revocations (forced unlocks) of held leases to `holders`.
    pub(crate) fn attach_holders(&self, holders: Weak<dyn Holders>) {
        match self {
            Backend::Redis(b) => b.subscriber().attach_holders(holders),
            Backend::Memory(b) => b.attach_holders(holders),
        }
    }

    /// Another in-memory backend on the same lock space, with instance `id` in its owner
    /// records; `None` for Redis.
    pub(crate) fn memory_peer(&self, id: uuid::Uuid) -> Option<Backend> {
        match self {
            Backend::Memory(m) => Some(Backend::Memory(m.peer(with_instance(m.owner(), id)))),
            Backend::Redis(_) => None,
        }
    }

    /// Remaining lease of lock `key` in the in-memory backend; `None` for Redis.
    pub(crate) fn memory_pttl(&self, key: &LockKey) -> Option<Duration> {
        match self {
            Backend::Memory(m) => m.pttl(key.lock()),
            Backend::Redis(_) => None,
        }
    }

    /// The server's address without credentials, for messages.
    pub(crate) fn addr(&self) -> &str {
        match self {
            Backend::Redis(b) => b.addr(),
            Backend::Memory(_) => "in-memory",
        }
    }
}
