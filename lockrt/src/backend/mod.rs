//! Where locks live. One enum over the backends (no boxing on the hot path); each backend
//! implements the same three atomic operations (acquire, renew a batch, release) with the same
//! owner-token semantics, so the waiting, lease and guard logic above never knows which it has.
//! Nothing here waits for a lock or keeps time: that is `wait.rs` and `lease.rs`.

mod diagnose;
pub(crate) mod memory;
pub(crate) mod pubsub;
pub(crate) mod remote;
pub(crate) mod topology;

use std::time::Duration;

use crate::error::BackendError;
use crate::key::LockKey;

/// A fresh 128-bit random owner token, as 32 lowercase hex digits (the scripts rely on the
/// fixed length). Read from the OS for every acquisition (one `getrandom` call): a user-space
/// generator would repeat its sequence in forked processes or a restored VM snapshot, and two
/// owners with one token would both "hold" the lock. Stored inline: every held lock keeps one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token([u8; 32]);

impl Token {
    pub(crate) fn new() -> Token {
        let mut bytes = [0u8; 16];
        let n = match getrandom::fill(&mut bytes) {
            Ok(()) => u128::from_le_bytes(bytes),
            Err(e) => unique_fallback(e),
        };
        let mut hex = [0u8; 32];
        for (i, b) in hex.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((n >> (124 - 4 * i)) & 0xf) as usize];
        }
        Token(hex)
    }

    pub(crate) fn as_str(&self) -> &str {
        // Only hex digits are ever stored.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// A token when the OS has no randomness to give (never seen on supported systems): unique
/// rather than random, from the wall clock in ns, the process id and a counter, so owners still
/// never share one.
fn unique_fallback(e: getrandom::Error) -> u128 {
    static WARNED: std::sync::Once = std::sync::Once::new();
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    WARNED.call_once(|| tracing::warn!(error = %e, "no OS randomness; owner tokens fall back to clock, pid and counter"));
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    (u128::from(nanos) << 64) | (u128::from(std::process::id()) << 32) | u128::from(seq)
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A quarter of the token identifies it in logs without handing out the credential.
        write!(f, "Token({}…)", &self.as_str()[..8])
    }
}

/// The result of one acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The token holds the lock now, with this fence, for a fresh lease counted from no
    /// earlier than the request's send time.
    Acquired { fence: u64 },
    /// Free, but the waiter queue's head is not known yet: the attempt dropped as many lapsed
    /// registrations as one call may and more may follow. Ask again at once (a newcomer must
    /// not take a lock a live waiter behind them is owed).
    Pruning,
    /// Another owner holds it (or it is promised to an earlier waiter).
    Held {
        /// The holder's remaining lease, when it has one.
        pttl: Option<Duration>,
        /// The key's fencing counter when the attempt ran, `None` when the counter did not
        /// exist: a grant with a fence not above a known counter ran out before the attempt;
        /// with the counter unknown, a grant must be confirmed by another attempt.
        counter: Option<u64>,
    },
}

/// How a failed attempt joins the lock's waiter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queueing {
    /// The registration lapses unless refreshed within this.
    pub(crate) register: Duration,
    /// The lease a release hands over with the lock.
    pub(crate) grant_lease: Duration,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The token did not hold the lock (expired, taken over, or never acquired).
    NotOwner,
    /// Deleted; nobody was waiting.
    Freed,
    /// Handed straight to the longest waiter.
    HandedOver,
}

/// The outcome of one lease's renewal: `Ok(true)` renewed, `Ok(false)` no longer held by its
/// token, `Err` not known (retry within the deadline).
pub(crate) type Renewed = Result<bool, BackendError>;

/// What renewing one lease needs: the lock's Redis key, its owner token, the new lease.
/// Borrowed from the lease table's entries for the duration of one batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) lock: &'a str,
    pub(crate) token: &'a Token,
    pub(crate) lease: Duration,
}

// One per `Locker`, behind an `Arc`: the size difference costs nothing, a `Box` would cost an
// indirection on every command. (TLS support makes the Redis variant larger.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Backend {
    Redis(remote::RedisBackend),
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
            // One process: its callers already queue on the locker's per-key turn.
            Backend::Memory(b) => Ok(b.acquire(key, token, ttl)),
        }
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
            Backend::Memory(b) => b.renew(batch).into_iter().map(Ok).collect(),
        }
    }

    /// Releases the lock if `token` owns it (handing it to a queued waiter, if any), and
    /// takes `token` out of the waiter queue either way. With `keep` (`min_hold`), the lock
    /// stays taken by `token` for that long instead. Success (also of a retry whose first
    /// try's reply was lost) only when this token's own release provably happened.
    pub(crate) async fn release(
        &self,
        key: &LockKey,
        token: &Token,
        keep: Option<Duration>,
    ) -> Result<Released, BackendError> {
        match self {
            Backend::Redis(b) => b.release(key, token, keep).await,
            Backend::Memory(b) => Ok(match keep {
                Some(keep) => {
                    let renewal = Renewal {
                        lock: key.lock(),
                        token,
                        lease: keep,
                    };
                    if b.renew(&[renewal]).first() == Some(&true) {
                        Released::Freed
                    } else {
                        Released::NotOwner
                    }
                }
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
            Backend::Memory(_) => self.release(key, token, None).await,
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
    pub(crate) fn subscriber(&self) -> Option<pubsub::Subscriber> {
        match self {
            Backend::Redis(b) => Some(b.subscriber()),
            Backend::Memory(_) => None,
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

/// Milliseconds for a script argument: at least 1 (0 would mean "no lease"), saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_are_32_lowercase_hex_digits_and_distinct() {
        let (a, b) = (Token::new(), Token::new());
        for t in [a, b] {
            assert_eq!(t.as_str().len(), 32);
            assert!(
                t.as_str()
                    .bytes()
                    .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
            );
        }
        assert_ne!(a, b);
        assert!(
            !format!("{a:?}").contains(a.as_str()),
            "Debug shows only part of it"
        );
        assert_ne!(
            format!("{a:?}"),
            format!("{b:?}"),
            "Debug tells tokens apart"
        );
    }
}
