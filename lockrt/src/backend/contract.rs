//! What every backend promises and what the layers above see of it: owner tokens, attempt and
//! release outcomes, renewals, and the events a backend reports to the waiting and holding
//! sides. A leaf: backends and the runtime import it, it imports neither.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{BackendError, LossCause};
use crate::key::LockKey;
use crate::options::LockKind;
use crate::owner::Holder;

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
    /// The key is in use as another kind of lock (a semaphore asked for as a lock, or another
    /// number of permits): refused, never waited for.
    Conflict { found: LockKind },
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

/// What the server found of one lease it was asked to renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Held by its token, and renewed.
    Renewed,
    /// No longer held by its token: it expired, another owner took it, or the server lost it.
    Gone,
    /// No longer held: an operator force-unlocked it (the lock's state marked its token so),
    /// which a locker that missed the revoke message learns this way.
    Forced,
}

impl Found {
    /// Why a lease not renewed ended.
    pub(crate) fn cause(self) -> LossCause {
        match self {
            Found::Forced => LossCause::ForceUnlocked,
            Found::Renewed | Found::Gone => LossCause::Expired,
        }
    }
}

/// The outcome of one lease's renewal; `Err` not known (retry within the deadline).
pub(crate) type Renewed = Result<Found, BackendError>;

/// What renewing one lease needs: the lock's key (its kind says whether the lease is the lock
/// itself or a read share or permit among its shared holders), its owner token, the new lease.
/// Borrowed from the lease table's entries for the duration of one batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) token: &'a Token,
    /// The fencing counter's value the lease was taken with: a lock its token took again
    /// later (a request of it held up in the network) is not this lease.
    pub(crate) counter: u64,
    pub(crate) lease: Duration,
    /// A local hand-off's check: the lease was passed on in the process to the holder with
    /// this place in the run (see `owner::Holder::handoff`), which the owner record then names.
    pub(crate) passed_to: Option<u32>,
}

/// A lock handed over by a release, as announced on the channel.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) token: String,
    pub(crate) fence: u64,
    /// Server time from the waiter's latest attempt to the release that granted the lock,
    /// when the release knew it.
    pub(crate) after_attempt: Option<Duration>,
    /// When the message arrived: the grant happened before.
    pub(crate) arrived: Instant,
}

/// What a release told the waiters of its lock.
#[derive(Debug, Clone)]
pub(crate) enum Notice {
    /// Released, or a message not understood: waiters try again.
    Released,
    /// Handed to a waiter, named by its token in the grant.
    Granted(Grant),
}

/// What the subscriber reports to the waiting side.
pub(crate) trait Events: Send + Sync {
    /// A message on the release channel of the lock with tag `tag`.
    fn message(&self, tag: &str, notice: Notice);
    /// Messages may have been missed: every waiter should retry now.
    fn missed(&self);
    /// The tags whose channel has a listener now.
    fn wanted(&self) -> Vec<Arc<str>>;
}

/// What the lease monitors do with a revoke message.
pub(crate) trait Holders: Send + Sync {
    /// The lock held with owner token `token` may have been force-unlocked (anyone who can
    /// publish can say so): its lease is checked with the server at once.
    fn revoke(&self, token: &str);
    /// The lock held with owner token `token` was force-unlocked, as the caller knows first
    /// hand (the in-memory backend): its lease is lost now.
    fn revoked(&self, token: &str);
    /// A revoke channel is listened to now (the first time after holding nothing there, or
    /// again after a lost connection): a revocation published on it before was missed, so
    /// every lease whose key `on_channel` names is checked now (renewed) rather than at its
    /// next renewal. Only those: a lease revoked on another channel was heard there.
    fn resubscribed(&self, on_channel: &dyn Fn(&LockKey) -> bool);
}

/// One held lock as a backend reports it to inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockState {
    /// The holder's fencing token, when the lock's value has lockrt's format.
    pub(crate) fence: Option<u64>,
    /// Remaining lease; `None` when the key has no expiry (not a lockrt lock).
    pub(crate) remaining: Option<Duration>,
    /// The owner record, when the lock has one.
    pub(crate) holder: Option<Holder>,
    /// Waiters of other processes queued with a live registration.
    pub(crate) waiters: u64,
    /// What holds the key: the lock (or write lock), readers, or a semaphore's permits.
    pub(crate) kind: LockKind,
    /// Each reader or permit holder, when `kind` is shared.
    pub(crate) shared: Vec<SharedState>,
    /// Released by its holder and kept taken until `min_hold` ends: nobody runs under it.
    pub(crate) kept: bool,
}

/// One reader or permit holder as a backend reports it to inspection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedState {
    pub(crate) fence: Option<u64>,
    pub(crate) remaining: Duration,
    pub(crate) holder: Option<Holder>,
}

/// Fences handed out per value of a key's fencing counter: the holder that took the lock from
/// the backend gets `counter * FENCES_PER_COUNT`, its local successors the next ones, and the
/// next holder of any process at least `(counter + 1) * FENCES_PER_COUNT`, so every holder's
/// fence is strictly greater than the previous one's. Local hand-offs in a row stay below it.
pub(crate) const FENCES_PER_COUNT: u64 = 32;

/// The fence of the holder `local` hand-offs after the one that took the lock at `counter`.
pub(crate) fn holder_fence(counter: u64, local: u32) -> u64 {
    counter
        .saturating_mul(FENCES_PER_COUNT)
        .saturating_add(u64::from(local))
}

/// A kind as the scripts write it (`x` a lock, `r` readers, `s<n>` a semaphore of n).
pub(crate) fn kind_code(kind: LockKind) -> String {
    match kind {
        LockKind::Exclusive => "x".to_owned(),
        LockKind::Read => "r".to_owned(),
        LockKind::Permits(n) => format!("s{n}"),
    }
}

/// The kind the scripts wrote as `code`; `None` for anything else.
pub(crate) fn parse_kind(code: &str) -> Option<LockKind> {
    match code {
        "x" => Some(LockKind::Exclusive),
        "r" => Some(LockKind::Read),
        _ => code.strip_prefix('s')?.parse().ok().map(LockKind::Permits),
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
