//! One lease's renewal schedule, and how due renewals are grouped and hedged: the arithmetic of
//! the lease monitor (`monitor.rs`), which owns the task and the table.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::redis::pubsub::Held;
use crate::key::LockKey;
use crate::lease::LeaseInfo;

/// Largest number of leases renewed by one script call.
const MAX_BATCH: usize = 500;

/// Shortest and longest pause before retrying a failed renewal.
const RETRY_MIN: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// A watched lease: when it is renewed next, and how its renewals went.
pub(crate) struct State {
    pub(crate) info: Arc<LeaseInfo>,
    pub(crate) next_renew: Instant,
    /// Leases due within this much of a scan are renewed in the same batch: a sixth of the
    /// current lease, so a short first lease (a granted waiter's) is not renewed at once.
    pub(crate) window: Duration,
    pub(crate) in_flight: bool,
    /// Renew again as soon as the renewal in flight is answered: it may have been sent before
    /// a forced unlock that a revoke message (or a gap in listening) says may have happened.
    pub(crate) recheck: bool,
    /// Renewals failed in a row, for the retry backoff.
    pub(crate) failures: u32,
    /// A forced unlock of this lease was announced: a check that finds it gone names that
    /// as the cause.
    pub(crate) revoke_heard: bool,
    /// The locker listens for this lease's revocation while it is watched.
    _revocable: Option<Held>,
}

impl State {
    pub(crate) fn new(
        info: Arc<LeaseInfo>,
        sent: Instant,
        lease: Duration,
        revocable: Option<Held>,
    ) -> State {
        let mut st = State {
            info,
            next_renew: sent,
            window: Duration::ZERO,
            in_flight: false,
            recheck: false,
            failures: 0,
            revoke_heard: false,
            _revocable: revocable,
        };
        st.runs(sent, lease);
        st
    }

    /// The lease now runs `lease` from `sent` (the send time of the request that got it).
    pub(crate) fn runs(&mut self, sent: Instant, lease: Duration) {
        self.info.extend(sent, lease);
        self.next_renew = sent + lease / 3;
        self.window = lease / 6;
        self.failures = 0;
    }

    /// An owner-checked renewal at once (or right after the one in flight): a revoke message
    /// is only a hint, which the server confirms or not, so nobody who can publish can cancel
    /// a healthy section.
    pub(crate) fn check_now(&mut self, now: Instant) {
        if self.in_flight {
            self.recheck = true;
        } else {
            self.next_renew = now;
        }
    }

    pub(crate) fn renews(&self) -> bool {
        self.info.watchdog
            && !self.in_flight
            && self.info.hold_until.is_none_or(|h| self.next_renew < h)
    }

    /// When the monitor must look at this lease next.
    pub(crate) fn due(&self) -> Instant {
        let deadline = self.info.deadline();
        if self.renews() {
            deadline.min(self.next_renew)
        } else {
            deadline
        }
    }

    /// Schedules the retry of a failed renewal: exponential backoff, but always before the
    /// deadline.
    pub(crate) fn retry_later(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        // The first retry goes at once (one lost reply or a replaced connection must not cost
        // the lease); from the second on, exponential backoff, always before the deadline.
        if self.failures == 1 {
            self.next_renew = now;
        } else {
            let base = (self.info.ttl / 30).clamp(RETRY_MIN, RETRY_MAX);
            let backoff = base
                .saturating_mul(1 << (self.failures - 1).min(8))
                .min(RETRY_MAX);
            let left = self.info.deadline().saturating_duration_since(now);
            self.next_renew = now + backoff.min(left / 2).max(RETRY_MIN);
        }
        // A retry waits its backoff: it does not join an earlier batch.
        self.window = Duration::ZERO;
    }
}

/// Splits the due leases into renewal calls: one group (cluster slot) per call, so a slow
/// master delays only its own leases' outcomes, and at most [`MAX_BATCH`] leases per call.
pub(crate) fn batches(
    due: Vec<Arc<LeaseInfo>>,
    group: impl Fn(&LockKey) -> u16,
) -> impl Iterator<Item = Vec<Arc<LeaseInfo>>> {
    let mut groups: HashMap<u16, Vec<Arc<LeaseInfo>>> = HashMap::new();
    for lease in due {
        groups.entry(group(&lease.key)).or_default().push(lease);
    }
    groups.into_values().flat_map(|mut g| {
        let mut out = Vec::with_capacity(g.len().div_ceil(MAX_BATCH));
        while !g.is_empty() {
            let rest = g.split_off(g.len().min(MAX_BATCH));
            out.push(std::mem::replace(&mut g, rest));
        }
        out
    })
}

/// When a renewal sent at `sent` and still unanswered is sent again on a fresh connection:
/// after half of what is left of the earliest of the batch's leases (`deadlines`), so one
/// reply lost on a live connection costs a reconnect and a round trip, never the lease, and
/// the response timeout (which may be as long as the lease) does not come into it.
pub(crate) fn hedge_time(sent: Instant, deadlines: impl Iterator<Item = Instant>) -> Instant {
    let left = deadlines
        .map(|d| d.saturating_duration_since(sent))
        .min()
        .unwrap_or_default();
    sent + (left / HEDGE_SHARE).max(HEDGE_MIN)
}

/// The share of the lease left after which an unanswered renewal is hedged (a half: the
/// hedge has the other half for a new connection and its round trip).
const HEDGE_SHARE: u32 = 2;

/// A renewal is never hedged sooner than this: a round trip that slow is no lost reply.
const HEDGE_MIN: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::contract::Token;
    use crate::lease::tests::lease;

    #[test]
    fn renewal_batches_hold_one_group_and_at_most_max_batch() {
        let leases: Vec<Arc<LeaseInfo>> = (0..1_203u64)
            .map(|id| {
                let key = LockKey::new("lock:", &format!("k{id}")).unwrap();
                lease(id, key, Token::new(), Duration::from_secs(3), None)
            })
            .collect();
        // Two groups: 1,083 leases in group 0 (three calls), 120 in group 1 (one call).
        let group = |k: &LockKey| u16::from(k.lock().ends_with('7'));
        let out: Vec<_> = batches(leases, group).collect();
        let mut sizes: Vec<usize> = out.iter().map(Vec::len).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, [83, 120, 500, 500]);
        for b in &out {
            assert!(b.iter().all(|l| group(&l.key) == group(&b[0].key)));
        }
        let mut ids: Vec<u64> = out.iter().flatten().map(|l| l.id).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..1_203).collect::<Vec<_>>());
    }

    #[test]
    fn a_renewal_is_hedged_after_half_of_the_earliest_lease_left() {
        let sent = Instant::now();
        let at = |ms| sent + Duration::from_millis(ms);
        assert_eq!(hedge_time(sent, [at(900), at(600)].into_iter()), at(300));
        assert_eq!(hedge_time(sent, [at(2)].into_iter()), sent + HEDGE_MIN);
        assert_eq!(hedge_time(sent, std::iter::empty()), sent + HEDGE_MIN);
    }
}
