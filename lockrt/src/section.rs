//! [`Locker::run`]: holding a lock around a future, which is what `#[distributed_lock]` expands
//! to. Owns reentrancy, the loss policy and the verdict on whether the body was protected.
//!
//! The body is never polled while the lease may be gone: before every poll the local deadline
//! is compared on the caller's clock (not only when the watchdog gets to run), and a reentrant
//! section is bound to the lease of the section it re-enters, so a nested future awaited after
//! that section ended fails with `Lost` instead of running unlocked. A body during which the
//! lock was lost never comes back as plain success: `run` returns `Lost`, and
//! [`Locker::run_checked`] hands back the output together with that verdict.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use tracing::Instrument;

use crate::backend::contract::Released;
use crate::context;
use crate::error::{LockError, LossCause, fmt_duration, fmt_wait};
use crate::guard::HeldLock;
use crate::kind::reenter;
use crate::lease::LeaseInfo;
use crate::locker::Locker;
use crate::options::{LockOptions, OnLost, Terms};

/// A critical section's output with whether the lock was held from its start to its end,
/// from [`Locker::run_checked`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::in_memory();
/// let section = locker.run_checked("report", lockrt::LockOptions::new(), async { 7 }).await?;
/// assert!(section.held_throughout());
/// assert_eq!(section.into_result()?, 7);
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "check `held_throughout` or use `into_result`"]
pub struct Checked<T> {
    output: T,
    lost: bool,
    key: String,
    cause: LossCause,
}

impl<T> Checked<T> {
    /// `false` when the lease was lost (expired, taken over, or past its deadline) at some
    /// point while the body ran, or the release found another owner: another holder may have
    /// run at the same time.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let section = lockrt::Locker::in_memory()
    ///     .run_checked("k", lockrt::LockOptions::new(), async {}).await?;
    /// assert!(section.held_throughout());
    /// # Ok(()) }
    /// ```
    pub fn held_throughout(&self) -> bool {
        !self.lost
    }

    /// The body's output, whether or not the lock was held throughout.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let section = lockrt::Locker::in_memory()
    ///     .run_checked("k", lockrt::LockOptions::new(), async { 1 }).await?;
    /// assert_eq!(section.output(), 1);
    /// # Ok(()) }
    /// ```
    pub fn output(self) -> T {
        self.output
    }

    /// The output if the lock was held throughout, `Err(Lost)` otherwise.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let section = lockrt::Locker::in_memory()
    ///     .run_checked("k", lockrt::LockOptions::new(), async { 1 }).await?;
    /// assert_eq!(section.into_result()?, 1);
    /// # Ok(()) }
    /// ```
    pub fn into_result(self) -> Result<T, LockError> {
        if self.lost {
            Err(LockError::Lost {
                key: self.key,
                cause: self.cause,
            })
        } else {
            Ok(self.output)
        }
    }
}

impl Locker {
    /// Runs `fut` while holding the lock: acquire (waiting up to `wait`), run with the
    /// watchdog renewing, release. The lock is released on every exit path, including a panic
    /// in `fut` and this future being dropped. Reentrant: a nested `run` on the same locker
    /// and key in the same task runs `fut` directly, for as long as the outer section holds.
    ///
    /// `Err(Lost)` when the lease was lost while `fut` ran: with [`OnLost::Cancel`] (the
    /// default) `fut` is dropped at once; with [`OnLost::Continue`] it runs to its end and its
    /// output is dropped (use [`run_checked`](Self::run_checked) to keep it).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let opts = lockrt::LockOptions::new();
    /// let v = locker.run("job", opts, async {
    ///     // nested: same key, same task, runs without acquiring again
    ///     locker.run("job", opts, async { 7 }).await
    /// }).await??;
    /// assert_eq!(v, 7);
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
        fut: F,
    ) -> Result<F::Output, LockError> {
        // Boxed at once: in debug builds every move of a deeply nested body future is a copy
        // on the stack, and nested sections would otherwise overflow it.
        self.traced(key.as_ref(), opts, Box::pin(fut))
            .await?
            .into_result()
    }

    /// Like [`run`](Self::run), but a body that completed while the lock was lost still
    /// hands back its output, with the verdict in [`Checked::held_throughout`]. Errors are
    /// the acquisition's, or `Lost` when the body was cancelled because of a loss.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use lockrt::{LockOptions, OnLost};
    /// let locker = lockrt::Locker::in_memory();
    /// let opts = LockOptions::new().on_lost(OnLost::Continue);
    /// let section = locker.run_checked("import", opts, async { "done" }).await?;
    /// if !section.held_throughout() {
    ///     eprintln!("another holder may have overlapped; re-check before trusting the result");
    /// }
    /// # let _ = section.output(); Ok(()) }
    /// ```
    pub async fn run_checked<F: Future>(
        &self,
        key: impl AsRef<str>,
        opts: LockOptions,
        fut: F,
    ) -> Result<Checked<F::Output>, LockError> {
        self.traced(key.as_ref(), opts, Box::pin(fut)).await
    }

    /// The section inside its `lock` span, with the outcome recorded on it and logged as an
    /// event (an elapsed wait and a failed acquisition are logged where they happen).
    async fn traced<F: Future>(
        &self,
        key: &str,
        opts: LockOptions,
        fut: Pin<Box<F>>,
    ) -> Result<Checked<F::Output>, LockError> {
        let span = section_span(key, &opts.resolve(&self.defaults()));
        let res = self.section(key, opts, fut).instrument(span.clone()).await;
        let (outcome, cause) = match &res {
            Ok(c) if c.lost => ("lost", Some(c.cause)),
            Ok(_) => ("released", None),
            Err(LockError::Timeout { .. }) => ("timeout", None),
            Err(LockError::Lost { cause, .. }) => ("lost", Some(*cause)),
            Err(_) => ("error", None),
        };
        span.record("outcome", outcome);
        if let Some(cause) = cause {
            span.record("cause", cause.as_str());
        }
        // The key on the event too: a subscriber above INFO drops the span. A loss itself was
        // logged at WARN, once, where it was found (`lock lost`, with its cause).
        let _in = span.enter();
        match cause {
            None if outcome == "released" => {
                tracing::debug!(key = ?key, outcome, "lock section ended")
            }
            None => {}
            Some(LossCause::ShutDown) => {
                tracing::info!(key = ?key, outcome, "lock section ended by the locker's shutdown")
            }
            Some(cause) => tracing::info!(
                key = ?key,
                outcome,
                cause = cause.as_str(),
                "lock section ended by the loss of its lock"
            ),
        }
        drop(_in);
        res
    }

    async fn section<F: Future>(
        &self,
        key: &str,
        opts: LockOptions,
        fut: Pin<Box<F>>,
    ) -> Result<Checked<F::Output>, LockError> {
        let checked = |(output, lost), lease: &LeaseInfo| Checked {
            output,
            lost,
            key: key.to_owned(),
            cause: if lost {
                lease.loss_cause_now()
            } else {
                LossCause::Expired
            },
        };
        if let Some(outer) = context::held(self.inner.id, key) {
            reenter(key, outer.lease.key.kind, opts.kind)?;
            // Reentrant: protected by the outer section's lease, and only while it lasts.
            return guarded(key, &outer.lease, opts.on_lost, fut)
                .await
                .map(|r| checked(r, &outer.lease));
        }
        let started = tokio::time::Instant::now();
        let guard = self.acquire(key, opts).await?;
        let span = tracing::Span::current();
        span.record("fence", guard.fence());
        span.record("local_handoff", guard.lease().local > 0);
        span.record("waited_ms", started.elapsed().as_millis() as u64);
        let held = HeldLock {
            locker_id: self.inner.id,
            key: Arc::from(key),
            fence: guard.fence(),
            lease: guard.lease().clone(),
        };
        let lease = guard.lease().clone();
        let (output, lost) =
            match guarded(key, &lease, opts.on_lost, context::within([held], fut)).await {
                Ok(out) => out,
                Err(e) => {
                    // Cancelled by a loss: the guard's drop releases in the background.
                    drop(guard);
                    self.settle_shutdown().await;
                    return Err(e);
                }
            };
        let lost = lost || lease.is_lost();
        let released = guard.release_outcome().await;
        let lost = lost || matches!(released, Ok(Released::NotOwner));
        if let Err(e) = &released {
            // The body's result stands whatever the release says.
            tracing::warn!(key = ?key, error = %e, "release after the critical section failed");
        }
        Ok(checked((output, lost), &lease))
    }
}

impl Locker {
    /// When `shutdown` ended the section (its body may be the one that called it, and was
    /// dropped with that call), the releases shutdown started finish before the section
    /// returns, so a caller that exits after it leaves no lock behind. Bounded.
    async fn settle_shutdown(&self) {
        if self.inner.closing.is_cancelled() {
            self.settle(self.inner.settings.shutdown_bound).await;
        }
    }
}

/// The `lock` span around acquisition and body: the key, the options, and once known the
/// fence, whether the lock came by local hand-off, the time waited and the outcome (`released`, `lost`, `timeout`, `error`). Events of
/// the body and of lockrt itself are inside it, whatever order `#[instrument]` and
/// `#[distributed_lock]` are written in.
fn section_span(key: &str, terms: &Terms) -> tracing::Span {
    let span = tracing::info_span!(
        "lock",
        key = ?key,
        kind = tracing::field::Empty,
        ttl = %fmt_duration(terms.ttl),
        wait = %fmt_wait(terms.wait),
        fence = tracing::field::Empty,
        local_handoff = tracing::field::Empty,
        waited_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
        cause = tracing::field::Empty,
    );
    // Only a shared kind is named: the lines of plain locks stay as they were.
    if terms.kind.is_shared() {
        span.record("kind", terms.kind.as_str());
    }
    span
}

/// Runs `body` while `lease` holds. Before every poll of the body the lease is checked on the
/// caller's clock. `Ok((output, lost during the body))`, or `Err(Lost)` when the loss policy
/// cancelled the body.
async fn guarded<F: Future>(
    key: &str,
    lease: &LeaseInfo,
    on_lost: OnLost,
    body: F,
) -> Result<(F::Output, bool), LockError> {
    let mut body = pin!(body);
    let mut lost_signal = pin!(lease.lost());
    let mut lost = false;
    std::future::poll_fn(|cx| {
        if !lost && (lease.is_lost() || lost_signal.as_mut().poll(cx).is_ready()) {
            lost = true;
            if on_lost == OnLost::Cancel {
                // `body` is dropped with this future, before anything else runs.
                return Poll::Ready(Err(lease.lost_error()));
            }
            tracing::warn!(key = ?key, "lock lost while its critical section runs; continuing as asked (on_lost = continue)");
        }
        body.as_mut().poll(cx).map(|out| Ok((out, lost)))
    })
    .await
}
