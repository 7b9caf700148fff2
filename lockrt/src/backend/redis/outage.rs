//! The lock server's reachability as one locker sees it ([`Outage`]): while no connection can
//! be made, the calls that need one fail at once with the latest connect's error, at most one
//! connect is tried per [`CONNECT_SPACING`], and the log gets one WARN when it starts, one per
//! [`REPORT_EVERY`] with the count of calls that failed, and one INFO when a connection is made
//! again. Without this, an outage at 1,000 requests a second wrote 1,000 WARN lines a second,
//! and every request waited for a connect of its own in turn.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BackendError;

/// At most one WARN per this interval while the server stays unreachable.
pub(crate) const REPORT_EVERY: Duration = Duration::from_secs(5);

/// A connect that failed this recently answers the calls after it: a server that refuses
/// connections is not asked again by every request.
pub(crate) const CONNECT_SPACING: Duration = Duration::from_millis(100);

#[derive(Default)]
pub(crate) struct Outage {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// When connecting started to fail; `None` while the server is reachable.
    since: Option<Instant>,
    /// The latest failed connect: when it ended, and its error.
    latest: Option<(Instant, BackendError)>,
    /// Requests failed since the last log line, and since the outage began (calls, and the
    /// clean-ups and renewals behind them).
    unreported: u64,
    total: u64,
    reported_at: Option<Instant>,
}

impl Outage {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Counters only: a panic elsewhere can't leave them torn in a way that matters.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error of a connect that ended after `asked` (the caller waited for it) or within
    /// [`CONNECT_SPACING`]: the caller's answer too, counted as a failed call.
    pub(crate) fn answer(&self, asked: Instant) -> Option<BackendError> {
        let mut st = self.state();
        let (at, e) = st.latest.clone()?;
        if at < asked && at.elapsed() >= CONNECT_SPACING {
            return None;
        }
        // A refused password is no outage: said as it is, not as "still unreachable".
        if st.since.is_some() {
            st.count(&e);
        }
        Some(e)
    }

    /// A connect that failed with an error that is no outage (a refused password): kept
    /// only to answer the calls of the next [`CONNECT_SPACING`].
    pub(crate) fn refused(&self, e: &BackendError) {
        self.state().latest = Some((Instant::now(), e.clone()));
    }

    /// A connect failed with `e`.
    pub(crate) fn failed(&self, e: &BackendError) {
        let mut st = self.state();
        let now = Instant::now();
        st.latest = Some((now, e.clone()));
        if st.since.is_none() {
            st.since = Some(now);
            st.total = 0;
            st.unreported = 0;
            st.reported_at = Some(now);
            st.total += 1;
            tracing::warn!(
                error = %e,
                "lock server unreachable; calls fail at once while it is, counted in one line \
                 every {}s",
                REPORT_EVERY.as_secs()
            );
            return;
        }
        st.count(e);
    }

    /// A connection was made.
    pub(crate) fn connected(&self, addr: &str) {
        let mut st = self.state();
        st.latest = None;
        let Some(since) = st.since.take() else {
            return;
        };
        tracing::info!(
            addr = %addr,
            down_ms = since.elapsed().as_millis() as u64,
            failed_requests = st.total,
            "lock server reachable again"
        );
    }
}

impl State {
    /// One more call failed with `e`; a WARN with the count when the last line is old enough.
    fn count(&mut self, e: &BackendError) {
        self.total += 1;
        self.unreported += 1;
        let now = Instant::now();
        if self.reported_at.is_some_and(|r| now < r + REPORT_EVERY) {
            return;
        }
        let since = self.since.map_or(Duration::ZERO, |s| now - s);
        tracing::warn!(
            error = %e,
            failed_requests = self.unreported,
            down_s = since.as_secs(),
            "lock server still unreachable"
        );
        self.unreported = 0;
        self.reported_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn answers_with_a_recent_failure_and_counts_until_connected() {
        let o = Outage::default();
        let asked = Instant::now();
        assert!(o.answer(asked).is_none(), "nothing failed yet");
        let e = BackendError::new("a", "refused").unreachable();
        o.failed(&e);
        assert!(
            o.answer(asked).is_some(),
            "a connect that ended after the call asked"
        );
        tokio::time::advance(CONNECT_SPACING).await;
        assert!(
            o.answer(Instant::now()).is_none(),
            "old enough to try again"
        );
        assert_eq!(o.state().total, 2);
        o.connected("a");
        assert!(o.state().since.is_none() && o.answer(asked).is_none());
        // A refused password answers the next calls too, but is no outage.
        o.refused(&BackendError::new("a", "WRONGPASS").permanent());
        assert!(o.answer(Instant::now()).is_some());
        assert!(o.state().since.is_none());
    }
}
