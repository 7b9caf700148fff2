//! The `rslock` crate as a [`BenchLock`]: a `LockManager` with its own defaults
//! (`set_retry(3, 200 ms)`: each `lock` call tries 3 times, sleeping a random 0..200 ms
//! between tries). Waiting is a loop around `lock` bounded at [`WAIT`] (rslock's own
//! `acquire` loops without bound); release is `unlock`.

use std::time::{Duration, Instant};

use super::BenchLock;
use crate::Res;
use crate::config::{TTL, WAIT};
use crate::env::Env;

/// rslock's `LockManager::new` defaults (retry count 3, random delay in 0..200 ms).
const RSLOCK_RETRIES: u32 = 3;
const RSLOCK_DELAY: Duration = Duration::from_millis(200);

/// One `LockManager` (its own connections).
#[derive(Clone)]
pub(crate) struct Rslock(rslock::LockManager);

impl Rslock {
    /// A new `LockManager` on the bench's server, with rslock's default retries.
    pub(crate) fn new(env: &Env) -> Rslock {
        let mut m = rslock::LockManager::new(vec![env.url.clone()]);
        m.set_retry(RSLOCK_RETRIES, RSLOCK_DELAY);
        Rslock(m)
    }
}

impl BenchLock for Rslock {
    type Guard = rslock::Lock;

    /// `lock` with ttl [`TTL`], again while the lock is busy, until [`WAIT`] has passed.
    async fn lock(&self, key: &str) -> Res<rslock::Lock> {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.0.lock(key, TTL).await {
                Ok(l) => return Ok(l),
                Err(rslock::LockError::Unavailable) if Instant::now() < deadline => {}
                Err(e) => return Err(format!("rslock: {e}").into()),
            }
        }
    }

    async fn unlock(&self, _key: &str, lock: rslock::Lock) -> Res<()> {
        self.0.unlock(&lock).await;
        Ok(())
    }
}
