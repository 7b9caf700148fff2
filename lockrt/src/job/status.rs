//! [`Locker::jobs`]: what the lock server says about the jobs of [`every`](crate::every), read
//! from their tick claims (`<name>:tick:<slot>`) and owner records: a run going on, and the
//! latest finished run's mark. Read-only; it never takes or changes a claim.

use std::collections::BTreeMap;

use crate::error::LockError;
use crate::inspect::LockInfo;
use crate::locker::Locker;

/// One job of [`every`](crate::every) as [`Locker::jobs`] finds it on the lock server.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobStatus {
    /// The job's name (its claims are `<name>:tick:<slot>`).
    pub name: String,
    /// The claim of a run going on now (its holder runs the job), if any.
    pub running: Option<LockInfo>,
    /// The mark of the latest finished run still kept (a tick, at least a second, past its
    /// tick's end): its holder ran it, `holder.acquired_at_ms` is when it claimed the tick.
    pub finished: Option<LockInfo>,
}

impl Locker {
    /// The jobs whose names match `pattern` (a Redis glob, `"*"` for all) with a claim on the
    /// server, sorted by name: each one's run going on and its latest finished run still
    /// marked. A job between runs longer than its mark is kept (a tick past the tick's end)
    /// has no claim and is not listed. `lockctl jobs` prints this.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory();
    /// let opts = lockrt::LockOptions::new();
    /// let (tx, rx) = tokio::sync::oneshot::channel();
    /// let mut tx = Some(tx);
    /// let job = lockrt::spawn_every(&locker, "report", Duration::from_millis(50), opts, move |_| {
    ///     let tx = tx.take();
    ///     async move { if let Some(tx) = tx { let _ = tx.send(()); } }
    /// })?;
    /// rx.await.unwrap(); // the first run ended
    /// job.stop(lockrt::Stop::AfterRun).await?;
    /// let jobs = locker.jobs("*").await?;
    /// assert_eq!(jobs[0].name, "report");
    /// assert!(jobs[0].finished.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn jobs(&self, pattern: &str) -> Result<Vec<JobStatus>, LockError> {
        let claims = self
            .locks_with_released(&format!("{pattern}:tick:*"))
            .await?;
        let mut jobs: BTreeMap<String, JobStatus> = BTreeMap::new();
        for claim in claims {
            let Some(name) = job_of(&claim.key) else {
                continue;
            };
            let job = jobs.entry(name.to_owned()).or_insert_with(|| JobStatus {
                name: name.to_owned(),
                running: None,
                finished: None,
            });
            let place = if claim.released {
                &mut job.finished
            } else {
                &mut job.running
            };
            if place
                .as_ref()
                .is_none_or(|p| acquired(p) < acquired(&claim))
            {
                *place = Some(claim);
            }
        }
        Ok(jobs.into_values().collect())
    }
}

/// The job whose claim `key` is (`<name>:tick:<digits>`).
fn job_of(key: &str) -> Option<&str> {
    let (name, slot) = key.rsplit_once(":tick:")?;
    (!slot.is_empty() && slot.bytes().all(|b| b.is_ascii_digit())).then_some(name)
}

fn acquired(l: &LockInfo) -> u64 {
    l.holder.as_ref().map_or(0, |h| h.acquired_at_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_keys_name_their_job() {
        assert_eq!(job_of("job:report:tick:17"), Some("job:report"));
        assert_eq!(job_of("a:tick:b:tick:0"), Some("a:tick:b"));
        assert_eq!(job_of("stock:1"), None);
        assert_eq!(job_of("x:tick:"), None);
        assert_eq!(job_of("x:tick:1a"), None);
    }
}
