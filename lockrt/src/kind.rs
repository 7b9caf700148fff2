//! Which kinds of lock meet on one key: the options a kind refuses, the error for a key in use
//! as another kind, and which sections re-enter which.

use crate::error::LockError;
use crate::key::LockKey;
use crate::options::{LockKind, Terms};

/// Options a kind does not take: a semaphore of 0 permits, `min_hold` on a shared kind (a
/// kept share would hold back the writer or the waiter owed the permit, with nobody running).
pub(crate) fn check_kind(terms: &Terms, key: &str) -> Result<(), LockError> {
    let reason = match terms.kind {
        LockKind::Permits(0) => "a semaphore needs at least 1 permit (`permits(0)`)",
        LockKind::Read | LockKind::Permits(_) if terms.min_hold.is_some() => {
            "`min_hold` is for exclusive locks, not read shares or permits"
        }
        _ => return Ok(()),
    };
    Err(LockError::Config(format!("lock `{key}`: {reason}")))
}

/// The error for a key in use as `found` when this call asked for `key.kind`.
pub(crate) fn kind_conflict(key: &LockKey, found: LockKind) -> LockError {
    let reason = match (key.kind, found) {
        (LockKind::Permits(n), LockKind::Permits(m)) => format!(
            "it is in use as a semaphore of {m} permits, this call asked for {n}; every caller \
             of one key must name the same number"
        ),
        (asked, found) => format!(
            "it is in use as {found}, this call asked for {asked}; a key is either a lock or a \
             semaphore"
        ),
    };
    LockError::KindConflict {
        key: key.user.to_string(),
        reason,
    }
}

/// Whether a section asking for `asked` may run inside this task's own section on the same key
/// held as `held`: a write section covers reads and writes, a read section reads, a permit
/// section permits of the same semaphore. Anything else would wait for itself (a write inside
/// a read: an upgrade) or mix kinds on one key: refused at once.
pub(crate) fn reenter(key: &str, held: LockKind, asked: LockKind) -> Result<(), LockError> {
    let reason = match (held, asked) {
        (LockKind::Exclusive, LockKind::Exclusive | LockKind::Read) => return Ok(()),
        (LockKind::Read, LockKind::Read) => return Ok(()),
        (LockKind::Permits(n), LockKind::Permits(m)) if n == m => return Ok(()),
        (LockKind::Read, LockKind::Exclusive) => "this task's own read section holds it; a \
            write inside it would wait for itself (a read lock is not upgraded): take the \
            write lock for the whole section instead"
            .to_owned(),
        (held, asked) => {
            format!("this task's own section holds it as {held}; it cannot re-enter as {asked}")
        }
    };
    Err(LockError::KindConflict {
        key: key.to_owned(),
        reason,
    })
}
