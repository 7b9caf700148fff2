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
    /// The latest run's record, as the instance that ran it left it (kept as long as the
    /// job's claims live, at least ten minutes): its outcome and the next tick.
    pub last: Option<JobRun>,
}

/// The latest run of a job, as [`JobStatus::last`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobRun {
    /// The tick's scheduled start (Unix ms).
    pub tick_ms: u64,
    /// `ran`, `late`, `lost`, `max_hold`, `failed`, `overran` or `stopped` (the outcomes of
    /// `lockrt_job_runs_total`).
    pub outcome: String,
    /// The next tick's scheduled start (Unix ms).
    pub next_ms: u64,
    /// When the run ended (Unix ms, the runner's clock).
    pub ended_ms: u64,
    /// Who ran it: the runner's owner record (service, host, pid, locker instance).
    pub by: Option<crate::owner::Holder>,
}

/// The note a runner leaves (its owner record is appended by the backend).
pub(super) fn note_text(tick: u128, outcome: &str, next: u128, now: u128) -> String {
    format!("{tick}|{outcome}|{next}|{now}")
}

/// A note of [`note_text`], its owner record after it.
fn parse_note(note: &str) -> Option<JobRun> {
    let mut parts = note.splitn(5, '|');
    let tick_ms = parts.next()?.parse().ok()?;
    let outcome = parts.next()?.to_owned();
    let next_ms = parts.next()?.parse().ok()?;
    let ended_ms = parts.next()?.parse().ok()?;
    // The owner record, read as the owner key's value is (acquired-at, then the owner).
    let by = parts
        .next()
        .and_then(|owner| crate::owner::Holder::parse(&format!("{ended_ms}|{owner}")));
    Some(JobRun {
        tick_ms,
        outcome,
        next_ms,
        ended_ms,
        by,
    })
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
                last: None,
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
        for job in jobs.values_mut() {
            let key = crate::key::LockKey::new(self.prefix(), &job.name)?;
            let note = self.backend().get_note(&key.job_note().to_string()).await?;
            job.last = note.as_deref().and_then(parse_note);
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
    fn a_note_reads_back_as_the_run_it_records() {
        let text = note_text(1_000, "max_hold", 2_000, 1_500);
        let run = parse_note(&format!(
            "{text}|svc|host|42|00000000-0000-0000-0000-000000000000"
        ))
        .expect("a run");
        assert_eq!(
            (run.tick_ms, run.next_ms, run.ended_ms),
            (1_000, 2_000, 1_500)
        );
        assert_eq!(run.outcome, "max_hold");
        assert_eq!(run.by.map(|h| h.pid), Some(42));
        assert_eq!(parse_note("garbage"), None);
    }

    #[test]
    fn claim_keys_name_their_job() {
        assert_eq!(job_of("job:report:tick:17"), Some("job:report"));
        assert_eq!(job_of("a:tick:b:tick:0"), Some("a:tick:b"));
        assert_eq!(job_of("stock:1"), None);
        assert_eq!(job_of("x:tick:"), None);
        assert_eq!(job_of("x:tick:1a"), None);
    }
}
