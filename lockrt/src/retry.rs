//! One bounded exponential backoff for every retry loop in the runtime (a failed acquire
//! attempt, a release, the cleanup of an attempt nobody waits for): a limit on tries and on
//! time, so no loop can spin or outlive its purpose.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::BackendError;

/// Retries of a transient failure, with exponentially growing pauses, until `tries` or `until`
/// is reached.
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    max: Duration,
    tries: u32,
    until: Option<Instant>,
}

impl Backoff {
    /// Pauses start at `first` and double up to `max`; at most `tries` retries.
    pub(crate) fn new(first: Duration, max: Duration, tries: u32) -> Backoff {
        Backoff {
            next: first,
            max,
            tries,
            until: None,
        }
    }

    /// No retry may start after `until`.
    pub(crate) fn until(mut self, until: Instant) -> Backoff {
        self.until = Some(until);
        self
    }

    /// After a failure `e`: sleeps and returns `true` when another try is allowed (the error
    /// is transient and neither limit is reached), `false` at once otherwise.
    pub(crate) async fn retry(&mut self, e: &BackendError) -> bool {
        if !e.is_transient() || self.tries == 0 {
            return false;
        }
        let wake = Instant::now() + self.next;
        if self.until.is_some_and(|u| wake > u) {
            return false;
        }
        self.tries -= 1;
        tokio::time::sleep_until(wake).await;
        self.next = (self.next * 2).min(self.max);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn stops_at_the_count_the_time_and_permanent_errors() {
        let transient = BackendError::new("a", "timeout");
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(40), 3);
        let start = Instant::now();
        assert!(b.retry(&transient).await);
        assert!(b.retry(&transient).await);
        assert!(b.retry(&transient).await);
        assert!(!b.retry(&transient).await, "three retries at most");
        assert_eq!(start.elapsed(), ms(10 + 20 + 40));

        let mut b = Backoff::new(ms(10), ms(40), 10).until(Instant::now() + ms(25));
        assert!(b.retry(&transient).await);
        assert!(
            !b.retry(&transient).await,
            "the next pause would end past `until`"
        );

        let mut b = Backoff::new(ms(10), ms(40), 10);
        assert!(!b.retry(&transient.clone().permanent()).await);
    }
}
