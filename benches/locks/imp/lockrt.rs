//! lockrt as a [`BenchLock`]: a `Locker` with the options of its column, taken through
//! `acquire`/`release`, `Locker::run` or the `#[distributed_lock]` attribute ([`Via`]), as an
//! exclusive lock, a read share or a permit; and two keys at once through `acquire_all`
//! ([`LockrtAll`]). Holds no state of its own beyond the `Locker` handle.

use std::time::Duration;

use lockrt::{LockError, LockGuard, LockOptions, Locker, MultiGuard};

use super::BenchLock;
use crate::Res;
use crate::config::{TTL, WAIT};

/// One critical section through the attribute, with the same ttl and wait as
/// [`Lockrt::new`]. Its key is `bench:{k}`.
#[lockrt::distributed_lock(key = "bench:{k}", locker = locker, ttl = "30s", wait = "30s")]
async fn attr_section(locker: &Locker, k: &str) -> Result<(), LockError> {
    Ok(())
}

/// How a pair ([`BenchLock::pair`]) takes and releases the lock.
#[derive(Clone, Copy)]
pub(crate) enum Via {
    /// `locker.acquire(key, opts)`, then `guard.release()`.
    Acquire,
    /// `locker.run(key, opts, async {})`.
    Run,
    /// [`attr_section`]; the pair's `key` is the attribute's `k`.
    Attribute,
}

/// A `Locker` with its options and the way its pairs go.
#[derive(Clone)]
pub(crate) struct Lockrt {
    locker: Locker,
    opts: LockOptions,
    via: Via,
}

impl Lockrt {
    /// `acquire`/`release` with ttl [`TTL`] and wait [`WAIT`].
    pub(crate) fn new(locker: &Locker) -> Lockrt {
        Lockrt {
            locker: locker.clone(),
            opts: LockOptions::new().ttl(TTL).wait(WAIT),
            via: Via::Acquire,
        }
    }

    /// The same options, pairs taken `via`.
    pub(crate) fn via(mut self, via: Via) -> Lockrt {
        self.via = via;
        self
    }

    /// The same, waiting at most `wait`.
    pub(crate) fn wait(mut self, wait: Duration) -> Lockrt {
        self.opts = self.opts.wait(wait);
        self
    }

    /// The same, taking the read share of the key's read-write lock.
    pub(crate) fn read(mut self) -> Lockrt {
        self.opts = self.opts.read();
        self
    }

    /// The same, taking one of the key's `n` permits (a semaphore).
    pub(crate) fn permits(mut self, n: u32) -> Lockrt {
        self.opts = self.opts.permits(n);
        self
    }

    /// The same options, taking `key1` and `key2` at once ([`LockrtAll`]).
    pub(crate) fn all(self) -> LockrtAll {
        LockrtAll(self)
    }
}

/// `Locker::acquire_all` of two keys, then `MultiGuard::release`: a pair on `key` takes
/// `key` + `1` and `key` + `2` (`{acct}:` gives `{acct}:1` and `{acct}:2`).
#[derive(Clone)]
pub(crate) struct LockrtAll(Lockrt);

impl BenchLock for LockrtAll {
    type Guard = MultiGuard;

    async fn lock(&self, key: &str) -> Res<MultiGuard> {
        let keys = [format!("{key}1"), format!("{key}2")];
        Ok(self.0.locker.acquire_all(keys, self.0.opts).await?)
    }

    async fn unlock(&self, _key: &str, guard: MultiGuard) -> Res<()> {
        Ok(guard.release().await?)
    }
}

impl BenchLock for Lockrt {
    type Guard = LockGuard;

    async fn lock(&self, key: &str) -> Res<LockGuard> {
        Ok(self.locker.acquire(key, self.opts).await?)
    }

    async fn unlock(&self, _key: &str, guard: LockGuard) -> Res<()> {
        Ok(guard.release().await?)
    }

    async fn pair(&self, key: &str) -> Res<()> {
        match self.via {
            Via::Acquire => {
                let guard = self.lock(key).await?;
                self.unlock(key, guard).await
            }
            Via::Run => Ok(self.locker.run(key, self.opts, async {}).await?),
            Via::Attribute => Ok(attr_section(&self.locker, key).await?),
        }
    }
}
