//! [`spawn_every`] and its [`JobHandle`]: a job of [`every`](crate::every) as a task of its
//! own that can be stopped alone, its run under way finished or cancelled as the caller says.
//! The task is one of the locker's tracked tasks, so [`Locker::shutdown`] ends it too and
//! waits for its clean-up. Dropping the handle leaves the job running.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::SystemTime;

use tokio_util::sync::CancellationToken;

use super::{Job, Schedule, check};
use crate::error::LockError;
use crate::locker::Locker;
use crate::options::LockOptions;

/// How [`JobHandle::stop`] treats a run under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stop {
    /// Let the run under way finish: its tick counts as done (no instance runs it again).
    /// A job not running stops at once.
    AfterRun,
    /// Cancel the run under way (its future is dropped): the tick is not done, and another
    /// instance still waiting for it runs it.
    Now,
}

/// What a handle signals to its job.
#[derive(Clone, Default)]
pub(super) struct Stopper {
    /// Any stop: no new tick is claimed, a wait for one ends.
    pub(super) ending: CancellationToken,
    /// [`Stop::Now`]: the run under way is cancelled too.
    pub(super) cancel_run: CancellationToken,
}

/// A job started with [`spawn_every`]. Await it for the job's end (after
/// [`Locker::shutdown`], or an error before any tick); [`stop`](Self::stop) ends it first.
/// Dropping the handle leaves the job running until the locker shuts down.
#[must_use = "dropping the handle leaves the job running until the locker shuts down"]
pub struct JobHandle {
    name: String,
    stop: Stopper,
    task: tokio::task::JoinHandle<Result<(), LockError>>,
}

impl JobHandle {
    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the job has ended.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the job: no tick is claimed any more, and the run under way finishes
    /// ([`Stop::AfterRun`]) or is cancelled ([`Stop::Now`]). Returns once the job has fully
    /// ended, its tick's claim released (kept as done after a finished run, freed for
    /// another instance after a cancelled one), with what the job ended with.
    pub async fn stop(self, how: Stop) -> Result<(), LockError> {
        if how == Stop::Now {
            self.stop.cancel_run.cancel();
        }
        self.stop.ending.cancel();
        self.await
    }
}

impl Future for JobHandle {
    type Output = Result<(), LockError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.task).poll(cx).map(|res| match res {
            Ok(res) => res,
            // The job panicked: the panic goes on in the task that awaits it.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime shut down under it.
            Err(_) => Err(LockError::ShutDown),
        })
    }
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle")
            .field("name", &self.name)
            .field("finished", &self.is_finished())
            .finish()
    }
}

/// [`every`](crate::every) as a task of its own on the current Tokio runtime: the same job,
/// schedule and promises, and a [`JobHandle`] to stop this job alone (before draining HTTP,
/// say) or to await its end. It also ends with [`Locker::shutdown`], which waits for it.
///
/// Errors at once for what `every` refuses before any tick (settings, the name), and
/// [`LockError::Config`] outside a Tokio runtime.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// use std::time::Duration;
/// use lockrt::{LockOptions, Locker, Schedule, Stop};
///
/// let locker = Locker::in_memory();
/// let nightly = Schedule::cron("0 2 * * *", "Europe/Paris")?;
/// let opts = LockOptions::new().ttl(Duration::from_secs(10));
/// let report = lockrt::spawn_every(&locker, "job:report", nightly, opts, |tick| async move {
///     let _ = tick; // the report for the night of `tick`
/// })?;
/// // On SIGTERM: jobs first (a report under way finishes), then HTTP, then the locker.
/// report.stop(Stop::AfterRun).await?;
/// locker.shutdown().await;
/// # Ok(()) }
/// ```
pub fn spawn_every<F, Fut>(
    locker: &Locker,
    name: &str,
    schedule: impl Into<Schedule>,
    opts: LockOptions,
    job: F,
) -> Result<JobHandle, LockError>
where
    F: FnMut(SystemTime) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let schedule = schedule.into();
    check(locker, name, &schedule, &opts)?;
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
        LockError::Config(
            "spawn_every() runs the job on the current Tokio runtime: call it from inside one"
                .into(),
        )
    })?;
    let stop = Stopper::default();
    let task = {
        let tracker = locker.inner.jobs.clone();
        let (locker, name, stop) = (locker.clone(), name.to_owned(), stop.clone());
        let run = async move {
            let j = Job {
                locker: &locker,
                name: &name,
                schedule: &schedule,
                opts: super::job_opts(&name, opts),
                stop: &stop,
            };
            j.run(job).await
        };
        // A tracked task: shutdown waits for its clean-up (the claim released or marked).
        tracker.spawn_on(run, &runtime)
    };
    Ok(JobHandle {
        name: name.to_owned(),
        stop,
        task,
    })
}
