//! Several exclusive locks in one backend call ([`take_at_once`]), the fast path of
//! `Locker::acquire_all`: when the keys share a cluster slot (any keys on a single server) and
//! every one is free with nobody queued, one script takes them all. Anything else (a key held
//! or queued for, a local caller ahead, a passed-on lease waiting, keys across slots, an
//! unknown outcome) leaves nothing taken and the caller takes the keys one by one, which waits.

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use super::{Acquisition, REGISTRATION, Taken};
use crate::cleanup::Pending;
use crate::guard::LockGuard;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::wait::EntryHandle;

/// Every lock of `keys` (canonical order) in one call, or `None` (nothing held) when that
/// can't be done at once.
pub(crate) async fn take_at_once(
    locker: &Locker,
    keys: &[String],
    opts: LockOptions,
) -> Option<Vec<LockGuard>> {
    let terms = opts.resolve(&locker.defaults());
    if terms.kind.is_shared() || keys.len() < 2 || locker.backend().acknowledged_only() {
        return None;
    }
    let mut parts = Vec::with_capacity(keys.len());
    for key in keys {
        let acq = Acquisition::new(locker, key, terms).ok()?;
        let entry = locker.inner.notifier.entry(&acq.key.tag);
        // Only when no caller of this locker is ahead for the key.
        let turn = entry.turn().try_acquire_owned().ok()?;
        if let Some(baton) = entry.take_baton() {
            // A lease a holder left for whoever takes the turn next: released, not taken
            // over here (the one-by-one path after this does hand-offs).
            crate::handoff::discard(locker, baton);
            return None;
        }
        parts.push((acq, entry, turn));
    }
    let mut pending: Vec<Pending<'_>> = (parts.iter())
        .map(|(acq, _, _)| Pending {
            locker,
            key: &acq.key,
            token: acq.token,
            bound: REGISTRATION.max(acq.ttl),
            armed: true,
        })
        .collect();
    let locks: Vec<_> = (parts.iter()).map(|(a, _, _)| (&a.key, &a.token)).collect();
    let sent = Instant::now();
    // An error (outcome unknown) or a late reply leaves `pending` armed: whatever the call
    // took is released. A call that took nothing leaves nothing to release.
    let fences = match locker.backend().acquire_all(&locks, terms.ttl).await {
        Ok(Some(fences)) => fences,
        Ok(None) => {
            pending.iter_mut().for_each(|p| p.armed = false);
            return None;
        }
        Err(_) => return None,
    };
    let taken: Vec<Taken> = (fences.iter())
        .map(|&fence| Taken {
            fence,
            sent,
            lease: terms.ttl,
            local: 0,
        })
        .collect();
    if fences.len() != parts.len() || !taken.iter().all(|t| parts[0].0.fresh(t)) {
        return None;
    }
    pending.iter_mut().for_each(|p| p.armed = false);
    drop(pending);
    Some(guards(parts, taken))
}

fn guards(
    parts: Vec<(Acquisition<'_>, EntryHandle, OwnedSemaphorePermit)>,
    taken: Vec<Taken>,
) -> Vec<LockGuard> {
    (parts.into_iter().zip(taken))
        .map(|((acq, entry, turn), taken)| {
            let token = acq.token;
            acq.make_guard(entry, Some(turn), taken, token, None)
        })
        .collect()
}
