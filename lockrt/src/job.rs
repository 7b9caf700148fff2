//! [`every`]: a job run once per tick across a fleet, on ticks every instance agrees on (a
//! [`Schedule`]: fixed ticks, or a cron expression in a time zone); [`spawn_every`] runs it
//! as a task with a [`JobHandle`] that stops it.
//!
//! Each tick is claimed with a lock, `<name>:tick:<slot>`, the slot being the tick's number
//! (a cron tick's: its second) modulo the schedule's slots: a job's state on the server is a
//! fixed number of keys, not one per tick (a tick's claim is gone before the tick that reuses
//! its slot starts). The instance whose run finishes releases that claim keeping it taken on
//! the server (as `min_hold` does) for a tick (at least a second) past the tick's end: the
//! mark survives its process, so no other instance runs the tick again, and instances whose
//! clocks lag still find it taken. A run that does not finish (its process dies, its lock is
//! lost, the locker shuts down, its handle stops it with [`Stop::Now`]) leaves the claim to
//! expire after `ttl` or frees it, and an instance still waiting for the tick takes it over:
//! also after the tick's end, while the claim is held by a run that did not finish, until the
//! next tick ends (then the tick is given up, with a WARN and a counter). The runs themselves
//! hold the lock `<name>`, so a run that overruns its tick never overlaps the next (bounded by
//! `max_hold`, one tick unless set). A job that finishes marks its tick done at once, on its
//! claim's lease, so a shutdown racing the end of the run keeps the claim too.

mod handle;
mod schedule;
mod status;

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{LockError, LossCause};
use crate::locker::Locker;
use crate::options::LockOptions;

use handle::Stopper;
pub use handle::{JobHandle, Stop, spawn_every};
pub use schedule::Schedule;
use schedule::{KEEP_PAST_END, Tick};
pub use status::{JobRun, JobStatus};

/// Bounds the sleeps towards one tick start: a wall clock set back wakes the sleeper early,
/// and it sleeps again, but not without end.
const MAX_SLEEPS_PER_TICK: u32 = 64;

/// What happened to one tick on this instance, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// The job ran to its end here.
    Ran,
    /// Another instance took the tick.
    Elsewhere,
    /// Another instance runs the tick still, past its end: looked at again later.
    Running,
    /// The tick was ours, but the previous run held the job past the tick's end.
    Overrun,
    /// The job was cancelled when its lock was lost (or `max_hold` ran out).
    Lost,
    /// The locker shut down before or while the job ran.
    Stopped,
    /// Its [`JobHandle`] stopped the job before or while it ran (a run cut short with
    /// [`Stop::Now`] is not finished: another instance may run the tick).
    Halted,
    /// The job was cancelled at `max_hold`; the tick counts as done.
    MaxHold,
    /// The lock server failed; the tick is left to the others.
    Failed,
    /// Ran here after the tick's end: its runner did not finish (died) and its lease ran out.
    Late,
    /// The claim was still held by a run that did not finish when the next tick ended.
    GivenUp,
    /// Claimed too late to know whether the tick ran (a stopped process, a lagging clock).
    TooLate,
    /// Skipped here while busy with an earlier tick, and no other instance ran it.
    RunByNobody,
}

/// Runs `job` once per tick of `schedule` across every instance that calls this with the
/// same `name` on the same lock server, until [`Locker::shutdown`]; then returns `Ok(())`.
/// `schedule` is a [`Schedule`]: a `Duration` (fixed ticks) or [`Schedule::cron`]. The job is
/// given the tick's start (a key for work that must not be done twice). To stop one job on
/// its own (before draining HTTP, say), run it with [`spawn_every`] instead.
///
/// - **Ticks follow the wall clock**: a fixed `tick` starts at its multiples since the Unix
///   epoch (`tick = 1h` runs on the hour); a cron tick at each time the expression names in its
///   zone, and it ends at the next one (see [`Schedule`] for daylight-saving time). Instances
///   agree on them without talking. The first is the next one to start.
/// - **Exactly one run per tick** across the fleet: the instance that gets the tick's claim
///   runs it, the others wait for the claim until the tick ends and run it only if the holder
///   dies first (its lease, `ttl`, runs out: pick `ttl` well below the tick for a takeover
///   within the tick). A holder that died late in the tick, whose lease runs out after the
///   tick's end, is taken over then (a WARN says the tick runs late), until the next tick
///   ends; a claim still held by a run that neither finished nor renews at that point is
///   given up with a WARN and the counter `lockrt_job_ticks_given_up_total`. A finished run
///   keeps its claim a tick (at least a second) past the tick's end, so neither a crash after
///   the run nor a clock that lags by less than that makes it run twice. A run stopped by
///   `shutdown()`, a lost lock or [`Stop::Now`] is not finished: an instance still waiting
///   runs the tick. A tick whose run was cut short (also a late run's) or whose claim failed
///   is looked at again, and one that no instance finished is reported (WARN `tick run by no
///   instance`, the same counter).
/// - **Runs never overlap**: each holds the lock `name`; a tick whose run can't start before
///   the tick ends (the previous run still going) is skipped and logged at WARN. `max_hold`
///   bounds a run (default: one tick, a cron tick's own length); past it the job is cancelled.
/// - Failures are logged and the next tick tried: a lost lock (the job is cancelled, as
///   `on_lost = "cancel"` does), an unreachable server (WARN).
/// - At least once at one instant: an instance that dies after its job ended but before its
///   claim was marked done on the server (one round trip; as long as the server is
///   unreachable then, up to the claim's `ttl`) leaves the tick to be run again by a waiting
///   instance. So does a Redis that restarts without persistence, forgetting the claims (as it
///   forgets every lock). Make the job idempotent per tick where that matters.
/// - A run is cancelled when the tick's claim is lost (an operator force-unlocked it), as when
///   its own lock is: another instance may be running the tick then. A run cut short at
///   `max_hold` counts as done (it would be cut short on every instance).
/// - Metrics (feature `metrics`), labelled `job` = `name`: `lockrt_job_runs_total` by
///   `outcome`, `lockrt_job_ticks_given_up_total`, `lockrt_job_last_success_seconds`. Waiting
///   for a claim another instance holds is the expected outcome: it counts neither in
///   `lockrt_timeouts_total` nor in `lockrt_waiting`.
///
/// `opts` gives `ttl`, `max_hold`, `watchdog`. Errors, before any tick: `wait` or `min_hold`
/// given (set per tick), `on_lost = continue` (a run whose lock is lost is always cancelled,
/// or it could overlap the next), `read()` or `permits(n)` (shared claims would let every
/// instance run every tick), a fixed tick under 10 ms, `max_hold` + `ttl` + max(longest tick,
/// 1 s) beyond what the claim slots span (fixed ticks: 61 ticks + 10 minutes; cron: two of its
/// longest gaps + 10 minutes), a `name` too long for any of its claim keys.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// use std::time::Duration;
/// use lockrt::{LockOptions, Locker};
///
/// let locker = Locker::in_memory();
/// let opts = LockOptions::new().ttl(Duration::from_millis(500));
/// let job = tokio::spawn({
///     let locker = locker.clone();
///     async move {
///         lockrt::every(&locker, "job:report", Duration::from_millis(50), opts, |tick| async move {
///             // send the report for the tick starting at `tick` (a SystemTime)
///             let _ = tick;
///         })
///         .await
///     }
/// });
/// tokio::time::sleep(Duration::from_millis(120)).await;
/// locker.shutdown().await; // every() returns
/// job.await.unwrap()?;
/// # Ok(()) }
/// ```
pub async fn every<F, Fut>(
    locker: &Locker,
    name: &str,
    schedule: impl Into<Schedule>,
    opts: LockOptions,
    job: F,
) -> Result<(), LockError>
where
    F: FnMut(SystemTime) -> Fut,
    Fut: Future<Output = ()>,
{
    let schedule = schedule.into();
    check(locker, name, &schedule, &opts)?;
    let stop = Stopper::default();
    let j = Job {
        locker,
        name,
        schedule: &schedule,
        opts: job_opts(name, opts),
        stop: &stop,
    };
    j.run(job).await
}

/// What a job's claims and runs use besides the caller's options: they keep trying an
/// unreachable server within the tick (a Redis back in time still runs it), and their metrics
/// carry the job's name as their site, unless the caller named one.
pub(super) fn job_opts(name: &str, mut opts: LockOptions) -> LockOptions {
    opts.retry_unreachable = true;
    if opts.site.is_none() {
        opts.site = Some(site_of(name));
    }
    opts
}

/// Most job names kept as metrics sites; more get [`OTHER_JOBS`].
const MAX_JOB_SITES: usize = 256;
const OTHER_JOBS: &str = "other jobs";

/// `name` as a `'static` site label: kept once per distinct job name (a process has a few),
/// bounded so that names made up at run time can't grow it without end.
fn site_of(name: &str) -> &'static str {
    static SITES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut sites = SITES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = sites.iter().find(|s| **s == name) {
        return s;
    }
    if sites.len() >= MAX_JOB_SITES {
        return OTHER_JOBS;
    }
    let s: &'static str = Box::leak(name.to_owned().into_boxed_str());
    sites.push(s);
    s
}

/// One job's settings, as every step of [`every`] reads them.
struct Job<'a> {
    locker: &'a Locker,
    name: &'a str,
    schedule: &'a Schedule,
    opts: LockOptions,
    stop: &'a Stopper,
}

/// Most ticks left to runs going on elsewhere that are looked at again.
const MAX_WATCHED: usize = 8;

/// Most ticks walked to find the one under way after a long run.
const MAX_WALKED: u32 = 4_096;

impl Job<'_> {
    async fn run<F, Fut>(&self, mut job: F) -> Result<(), LockError>
    where
        F: FnMut(SystemTime) -> Fut,
        Fut: Future<Output = ()>,
    {
        let Some(mut start) = self.schedule.first(self.now()) else {
            return self.no_more_ticks();
        };
        // Ticks left to a run going on elsewhere past their end, or whose run here was cut
        // short or failed: looked at again later, so that one nobody finishes is not lost
        // silently.
        let mut running: Vec<Tick> = Vec::new();
        loop {
            tokio::select! {
                biased;
                () = self.locker.inner.closing.cancelled() => return Ok(()),
                () = self.stop.ending.cancelled() => return Ok(()),
                () = self.sleep_until(start) => {}
            }
            let Some(tick) = self.schedule.tick(start) else {
                return self.no_more_ticks();
            };
            match self.take_turn(tick, &mut job).await {
                Ok(Turn::Running) if running.len() < MAX_WATCHED => running.push(tick),
                // A run cut short (its lock lost, a late run too) or a claim that failed may
                // leave the tick to nobody: no instance may wait for it any more (with two
                // instances, one died). Looked at again like a run going on elsewhere, and
                // reported if unfinished.
                Ok(turn @ (Turn::Lost | Turn::Failed)) if running.len() < MAX_WATCHED => {
                    self.log_turn(tick, turn);
                    running.push(tick);
                }
                Ok(turn) => self.log_turn(tick, turn),
                Err(LockError::ShutDown) => return Ok(()),
                Err(e) => return Err(e),
            }
            if self.stop.ending.is_cancelled() {
                return Ok(());
            }
            self.watch(&mut running).await;
            // The next tick, or the one now under way when this turn took longer (a run that
            // overran, a late run): that one is claimed late, and the ticks in between are not
            // made up for; one that no instance ran is reported.
            let Some(next) = self.under_way(tick.end) else {
                return self.no_more_ticks();
            };
            self.skipped((tick.end, next)).await;
            start = next;
        }
    }

    /// The schedule names no time any more: the job ends, with a WARN.
    fn no_more_ticks(&self) -> Result<(), LockError> {
        tracing::warn!(job = self.name, schedule = %self.schedule, "no scheduled time left: the job ends");
        Ok(())
    }

    /// `end`, or the latest tick start at or before now when that is later (the tick under
    /// way after a long run).
    fn under_way(&self, end: u128) -> Option<u128> {
        let now = self.now();
        let mut at = end;
        for _ in 0..MAX_WALKED {
            match self.schedule.next(at) {
                Some(next) if next <= now => at = next,
                _ => return Some(at),
            }
        }
        // A very long run over very short ticks: the next one to start.
        self.schedule.first(now)
    }

    /// Looks again at the ticks in `running` (left to a run going on elsewhere past their
    /// end): finished ones are forgotten; one whose claim is gone without a finished run's
    /// mark, once no instance may take it over any more (the next tick ended), was run by
    /// nobody (its runner died or was stopped after the others stopped waiting): reported.
    async fn watch(&self, running: &mut Vec<Tick>) {
        let mut kept = Vec::with_capacity(running.len());
        for &tick in running.iter() {
            let claim = self.claim_key(tick.slot);
            let now = self.now();
            match self.locker.lock_info(&claim).await {
                Ok(Some(info)) if info.released => {
                    if !self.marks(&info, tick) {
                        self.log_turn(tick, Turn::RunByNobody);
                    }
                }
                // Still running: looked at again while its claim can live.
                Ok(Some(_)) if now < tick.start + self.schedule.slot_life() => kept.push(tick),
                Ok(Some(_)) => tracing::warn!(
                    job = self.name,
                    tick = tick.start as u64,
                    "tick still held by a run past its claim's longest life; not known whether it finishes"
                ),
                // Gone unfinished, but another instance may still take it over.
                Ok(None) if now < tick.next_end => kept.push(tick),
                // A finished run's mark would still be there.
                Ok(None) if now < tick.marked_until() => self.log_turn(tick, Turn::RunByNobody),
                // The server can't say now: looked at again next time, while a mark would tell.
                Err(_) if now < tick.marked_until() => kept.push(tick),
                Ok(None) | Err(_) => tracing::warn!(
                    job = self.name,
                    tick = tick.start as u64,
                    "tick cut short or failed here, and looked at again only after a finished \
                     run's mark would have expired: not known whether another instance ran it"
                ),
            }
        }
        *running = kept;
    }

    /// The ticks starting in `[from, to)` this instance skipped while busy with an earlier
    /// one: each is looked at on the server, and one that no instance ran (no claim: neither a
    /// finished run's mark nor a run going on) is given up loudly (WARN,
    /// `lockrt_job_ticks_given_up_total`).
    async fn skipped(&self, (from, to): (u128, u128)) {
        let mut start = from;
        for _ in 0..MAX_SKIPPED_LOOKED_AT {
            if start >= to {
                return;
            }
            let Some(tick) = self.schedule.tick(start) else {
                return;
            };
            if self.now() >= tick.marked_until() {
                break;
            }
            let ran = match self.locker.lock_info(&self.claim_key(tick.slot)).await {
                // A run going on, or this tick's finished run's mark.
                Ok(Some(info)) => !info.released || self.marks(&info, tick),
                Ok(None) => false,
                // The server can't say: the ticks are not judged.
                Err(_) => return,
            };
            if !ran {
                self.log_turn(tick, Turn::RunByNobody);
            }
            start = tick.end;
        }
        if start < to {
            // A finished run's mark may be gone already: not known.
            tracing::warn!(
                job = self.name,
                from = start as u64,
                to = to as u64,
                "ticks skipped here while busy; not known whether another instance ran them"
            );
        }
    }

    /// The claim key of slot `slot`.
    fn claim_key(&self, slot: u128) -> String {
        claim_key(self.name, slot)
    }

    /// Whether the released claim `info` is the mark of a finished run of `tick`, not of an
    /// older tick that used its slot before (taken many ticks earlier). A runner whose clock
    /// is ahead took it before the tick starts here: by as much as a mark is kept (a tick, at
    /// least a second), the skew the promise covers.
    fn marks(&self, info: &crate::inspect::LockInfo, tick: Tick) -> bool {
        let acquired = info.holder.as_ref().map_or(0, |h| h.acquired_at_ms);
        let skew = tick.gap().max(KEEP_PAST_END.as_millis());
        info.released && self.schedule.shift(u128::from(acquired)) + skew >= tick.start
    }

    fn now(&self) -> u128 {
        self.schedule.now_ms()
    }

    /// From now until `at` (Unix ms on the job's clock), zero if past.
    fn until(&self, at: u128) -> Duration {
        Duration::from_millis(duration_ms(at.saturating_sub(self.now())))
    }

    /// Sleeps until the job's clock reads `at` (Unix ms).
    async fn sleep_until(&self, at: u128) {
        for _ in 0..MAX_SLEEPS_PER_TICK {
            let left = self.until(at);
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left).await;
        }
    }
}

/// Most ticks skipped in a row that are looked at one by one.
const MAX_SKIPPED_LOOKED_AT: u32 = 16;

/// Checks the settings and names before any tick.
fn check(
    locker: &Locker,
    name: &str,
    schedule: &Schedule,
    opts: &LockOptions,
) -> Result<(), LockError> {
    schedule.check()?;
    if opts.on_lost == crate::options::OnLost::Continue {
        return Err(LockError::Config(
            "every(): `on_lost = continue` would let a run whose lock was lost overlap the \
             next one; a run is always cancelled when its lock is lost"
                .into(),
        ));
    }
    if opts.kind != crate::options::LockKind::Exclusive {
        return Err(LockError::Config(format!(
            "every(): a job runs under an exclusive lock, not {}: with shared claims every \
             instance would run every tick",
            opts.kind
        )));
    }
    if opts.wait.is_some() || opts.min_hold.is_some() {
        return Err(LockError::Config(
            "every(): leave `wait` and `min_hold` unset: each tick is waited for until it ends, \
             and a finished tick's claim kept past its end"
                .into(),
        ));
    }
    locker.redis_key(name)?;
    let slots = schedule.slots();
    // A tick's claim must be gone before the tick that reuses its slot starts.
    let longest = schedule.longest_ms();
    let ttl = opts.ttl.unwrap_or(locker.defaults().ttl);
    let run_max = opts.max_hold.map_or(longest, |d| d.as_millis());
    let life = claim_life(longest, ttl.as_millis(), run_max);
    if life > schedule.slot_life() {
        let room = schedule.slot_life() - 3 * longest;
        return Err(LockError::Config(format!(
            "every(): `max_hold` plus `ttl` too long for {schedule}: a tick's claim would \
             outlive the job's {} claim slots; keep max_hold + ttl + max(longest tick, 1 s) \
             within {:?}",
            slots - 2,
            Duration::from_millis(duration_ms(room)),
        )));
    }
    // The longest claim key there will be.
    locker.redis_key(&claim_key(name, slots - 1))?;
    Ok(())
}

/// How long past a tick's start its claim may live (ms), for a tick of `tick` ms: claimed
/// until the tick ends, waited for until the next one ends, held by the run (bounded by the
/// claim's `max_hold`, or its lease when the runner died), then kept as the finished tick's
/// mark for a tick (at least a second).
fn claim_life(tick: u128, ttl: u128, run_max: u128) -> u128 {
    let keep = tick.max(KEEP_PAST_END.as_millis());
    3 * tick + run_max + ttl + keep
}

/// The claim key of slot `slot`.
fn claim_key(name: &str, slot: u128) -> String {
    format!("{name}:tick:{slot}")
}

/// What a run's body came to.
enum Body {
    Done,
    /// The tick's claim was lost.
    Lost,
    /// Its handle stopped it with [`Stop::Now`].
    Halted,
}

impl Job<'_> {
    /// One tick: its claim, then the run under the job's lock. `Err` only for what ends
    /// [`every`]: a shutdown, a key or setting the locker refuses.
    async fn take_turn<F, Fut>(&self, tick: Tick, job: &mut F) -> Result<Turn, LockError>
    where
        F: FnMut(SystemTime) -> Fut,
        Fut: Future<Output = ()>,
    {
        let (name, start) = (self.name, tick.start);
        let length = Duration::from_millis(duration_ms(tick.gap()));
        let run_max = self.opts.max_hold.unwrap_or(length);
        // Held for as long as a run that starts at the tick's end may last: a claim that
        // stopped renewing before the run ended would let a waiting instance run the tick
        // again.
        let claim_opts = LockOptions {
            max_hold: Some(self.until(tick.end) + run_max + length),
            // Every instance but one waits for the claim until the tick ends: expected.
            busy_expected: true,
            ..self.opts
        };
        // A stop while waiting for the claim: nothing ran, nothing to mark (the wait's own
        // clean-up runs in the background, and shutdown waits for it).
        let claimed = tokio::select! {
            biased;
            () = self.stop.ending.cancelled() => return Ok(Turn::Halted),
            c = self.claim_tick(tick, claim_opts) => c,
        };
        let (claim, late) = match claimed {
            Ok(Claim::Ours { guard, late }) => (guard, late),
            Ok(Claim::Elsewhere) => return Ok(Turn::Elsewhere),
            Ok(Claim::Running) => return Ok(Turn::Running),
            Ok(Claim::GivenUp) => return Ok(Turn::GivenUp),
            Ok(Claim::TooLate) => return Ok(Turn::TooLate),
            Err(LockError::Backend(e)) => {
                // The tick is left to the others: named, so that one lost with it is not silent.
                tracing::warn!(job = name, tick = start as u64, error = %e, "could not claim the tick");
                crate::metrics::job_run(name, "failed");
                return Ok(Turn::Failed);
            }
            Err(e) => return Err(e),
        };
        if late {
            tracing::warn!(
                job = name,
                tick = start as u64,
                late_ms = duration_ms(self.now().saturating_sub(tick.end)),
                "tick runs late here: the run that had it did not finish (its runner died or \
                 was stopped, or its run could not start in time) and its claim came free"
            );
        }
        // A late run may wait for the job's lock until the next tick ends (the dead runner's
        // lease on it runs out, or the next tick's run ends first).
        let run_until = if late { tick.next_end } else { tick.end };
        let run_opts = self.opts.max_hold(run_max).wait(self.until(run_until));
        let scheduled = UNIX_EPOCH + Duration::from_millis(duration_ms(start));
        let keep = || {
            tokio::time::Instant::now()
                + self.until(tick.end)
                + Duration::from_millis(duration_ms(tick.keep))
        };
        let lease = claim.lease().clone();
        // The run also ends when the tick's claim is lost (forced unlock, eviction): another
        // instance may be running the tick then. A finished job marks the tick done at once,
        // so whatever releases the claim from then on (a shutdown racing the job lock's
        // release) keeps it. `Stop::Now` cancels it unfinished: the claim is freed.
        let started = std::sync::atomic::AtomicBool::new(false);
        let body = async {
            started.store(true, std::sync::atomic::Ordering::Relaxed);
            tokio::select! {
                biased;
                () = lease.lost() => Body::Lost,
                () = self.stop.cancel_run.cancelled() => Body::Halted,
                () = job(scheduled) => {
                    lease.keep_after(keep());
                    Body::Done
                }
            }
        };
        // A stop while the run waits for the job's lock (the previous run overran): nothing
        // ran, the wait ends. Once the job started, `Stop::AfterRun` lets it finish.
        let stopped_before_start = async {
            self.stop.ending.cancelled().await;
            if started.load(std::sync::atomic::Ordering::Relaxed) {
                std::future::pending::<()>().await;
            }
        };
        let ran = tokio::select! {
            biased;
            r = self.locker.run(name, run_opts, body) => r,
            () = stopped_before_start => Ok(Body::Halted),
        };
        let turn = match ran {
            Ok(Body::Done) if late => Turn::Late,
            Ok(Body::Done) => Turn::Ran,
            Ok(Body::Lost) => Turn::Lost,
            Ok(Body::Halted) => Turn::Halted,
            Err(LockError::Timeout { .. }) => Turn::Overrun,
            Err(LockError::Lost {
                cause: LossCause::ShutDown,
                ..
            })
            | Err(LockError::ShutDown) => Turn::Stopped,
            Err(LockError::Lost {
                cause: LossCause::MaxHold,
                ..
            }) => {
                // It would be cut short on every instance alike: the tick counts as done.
                lease.keep_after(keep());
                Turn::MaxHold
            }
            Err(LockError::Lost { .. }) => Turn::Lost,
            Err(LockError::Backend(e)) => {
                tracing::warn!(job = name, tick = start as u64, error = %e, "could not lock the job");
                Turn::Failed
            }
            Err(e) => return Err(e),
        };
        self.end_turn(tick, claim, turn).await
    }
}

/// What waiting for a tick's claim came to.
enum Claim {
    /// This instance runs the tick (`late`: after the tick's end).
    Ours {
        guard: crate::guard::LockGuard,
        late: bool,
    },
    /// Another instance finished the tick.
    Elsewhere,
    /// Another instance runs it still, past the tick's end (it renewed the claim since).
    Running,
    /// Still held by a run that did not finish when the next tick ended.
    GivenUp,
    /// Claimed only after a finished run's mark would have expired.
    TooLate,
}

/// Rounds of looking at a claim still held after the tick's end.
const MAX_CLAIM_ROUNDS: u32 = 64;

/// A claim's lease that ends this much later than last seen (ms) was renewed: more than
/// the clock and round-trip noise between two looks.
const RENEWED_BY: u128 = 20;

impl Job<'_> {
    /// Waits for the claim of `tick` until the tick ends, as every
    /// instance does. A claim still held then is looked at: the mark of a finished run (or a
    /// run going on past the tick's end) is another instance's tick; a run that has not finished
    /// may be a runner that died, whose lease runs out within its ttl: the claim is waited for
    /// again, each time until that lease would end, until the next tick ends.
    async fn claim_tick(&self, tick: Tick, opts: LockOptions) -> Result<Claim, LockError> {
        let (locker, key) = (self.locker, &self.claim_key(tick.slot));
        let give_up = tick.next_end;
        let mut until = tick.end;
        let mut late = false;
        // When the holder's lease ends, as last seen (Unix ms): a later one means it renewed.
        let mut expiry: Option<u128> = None;
        // Until then a finished run's mark is still on the claim.
        let mark_ends = tick.marked_until();
        for _ in 0..MAX_CLAIM_ROUNDS {
            match locker.acquire(key, opts.wait(self.until(until))).await {
                // Taken after a finished run's mark may have expired (this process was stopped,
                // or its clock lags by more than the mark is kept): whether the tick ran is not
                // known any more, so it is not run here.
                Ok(guard) if self.now() >= mark_ends => {
                    let _ = guard.release().await;
                    return Ok(Claim::TooLate);
                }
                Ok(guard) => return Ok(Claim::Ours { guard, late }),
                Err(LockError::Timeout { .. }) => {}
                Err(e) => return Err(e),
            }
            late = true;
            let now = self.now();
            match locker.lock_info(key).await? {
                // Freed just now (a run that did not finish): ask again at once.
                None if now < give_up => until = now,
                Some(info) if info.released => {
                    // The mark of a run of this tick that finished; the mark of an older tick of
                    // this slot (a clock far ahead) is waited out.
                    if self.marks(&info, tick) || now >= give_up {
                        return Ok(Claim::Elsewhere);
                    }
                    until = give_up.min(now + info.remaining.unwrap_or_default().as_millis() + 1);
                }
                Some(info) => {
                    // Held by a run that has not finished. Renewed since the last look: its
                    // runner lives and finishes the tick. Otherwise wait until its lease ends.
                    let ends = now + info.remaining.map_or(tick.gap(), |r| r.as_millis());
                    if expiry.is_some_and(|e| ends > e + RENEWED_BY) {
                        return Ok(Claim::Running);
                    }
                    if now >= give_up {
                        return Ok(Claim::GivenUp);
                    }
                    expiry = Some(ends);
                    until = give_up.min(ends + 1);
                }
                None => return Ok(Claim::GivenUp),
            }
        }
        Ok(Claim::GivenUp)
    }

    /// Releases the tick's claim. A tick marked done (its job finished, or reached `max_hold`)
    /// keeps the claim taken on the server past the tick's end (and a lagging clock's), whatever
    /// happens to this process now. Any other claim is freed, so an instance still waiting for the
    /// tick runs it.
    async fn end_turn(
        &self,
        tick: Tick,
        claim: crate::guard::LockGuard,
        turn: Turn,
    ) -> Result<Turn, LockError> {
        let name = self.name;
        if let Some(outcome) = turn.outcome() {
            crate::metrics::job_run(name, outcome);
            self.note_run(tick, outcome).await;
        }
        if matches!(turn, Turn::Ran | Turn::Late) {
            crate::metrics::job_succeeded(name, self.now());
        }
        match claim.release().await {
            Ok(()) | Err(LockError::Lost { .. }) | Err(LockError::ShutDown) => {}
            Err(LockError::Backend(e)) => {
                tracing::warn!(job = name, error = %e, "claim of the tick not released; its lease ends it");
            }
            Err(e) => return Err(e),
        }
        if turn == Turn::Stopped {
            return Err(LockError::ShutDown);
        }
        Ok(turn)
    }

    /// Leaves the job's latest run on the server for `lockctl jobs` (`job/status.rs`): the
    /// tick, its outcome, the next tick and when, with this instance's owner record. Kept as
    /// long as the job's claims live (at least ten minutes). Best effort: a failure is only
    /// logged (the run itself is already counted and logged).
    async fn note_run(&self, tick: Tick, outcome: &str) {
        let Ok(key) = crate::key::LockKey::new(self.locker.prefix(), self.name) else {
            return;
        };
        let text = status::note_text(tick.start, outcome, tick.end, self.now());
        let keep = Duration::from_millis(duration_ms(self.schedule.slot_life().max(600_000)));
        let name = key.job_note().to_string();
        let res = self.locker.backend().put_note(&name, &text, keep).await;
        if let Err(e) = res {
            tracing::debug!(job = self.name, error = %e, "job status not written");
        }
    }

    fn log_turn(&self, tick: Tick, turn: Turn) {
        let (name, tick) = (self.name, tick.start as u64);
        match turn {
            Turn::Ran => tracing::debug!(job = name, tick, "job ran"),
            Turn::Elsewhere => tracing::trace!(job = name, tick, "job ran on another instance"),
            Turn::Running => tracing::trace!(job = name, tick, "job runs on another instance"),
            Turn::Overrun => tracing::warn!(
                job = name,
                tick,
                "tick skipped: the previous run still held the job when the tick ended; raise the \
             tick or bound the job with max_hold"
            ),
            // The loss itself was logged at WARN where it was found.
            Turn::Lost => tracing::info!(job = name, tick, "job cancelled: its lock was lost"),
            Turn::MaxHold => tracing::warn!(
                job = name,
                tick,
                "job cancelled at max_hold; the tick counts as done (raise max_hold)"
            ),
            Turn::Late => tracing::warn!(job = name, tick, "job ran late (its runner died)"),
            Turn::GivenUp => {
                crate::metrics::tick_given_up(name);
                tracing::warn!(
                    job = name,
                    tick,
                    "tick given up: its claim was still held by a run that did not finish when the \
                 next tick ended (a runner that died with a ttl longer than the tick, or a run \
                 overrunning); pick ttl well below the tick"
                );
            }
            Turn::RunByNobody => {
                crate::metrics::tick_given_up(name);
                tracing::warn!(
                    job = name,
                    tick,
                    "tick run by no instance: no run of it finished and none may start any more (its \
                 run was cut short or failed, its runner died, or this one was busy with an \
                 earlier tick)"
                );
            }
            Turn::TooLate => tracing::warn!(
                job = name,
                tick,
                "tick not run here: claimed only after a finished run's mark would have expired \
             (this process was stopped, or its clock lags by more than a tick and a second)"
            ),
            Turn::Halted => tracing::debug!(job = name, tick, "job stopped by its handle"),
            Turn::Failed | Turn::Stopped => {}
        }
    }
}

impl Turn {
    /// The run's outcome as `lockrt_job_runs_total` labels it; `None` where this instance
    /// did not try to run the tick.
    fn outcome(self) -> Option<&'static str> {
        Some(match self {
            Turn::Ran => "ran",
            Turn::Late => "late",
            Turn::Lost => "lost",
            Turn::MaxHold => "max_hold",
            Turn::Failed => "failed",
            Turn::Overrun => "overran",
            Turn::Stopped | Turn::Halted => "stopped",
            _ => return None,
        })
    }
}

fn duration_ms(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_locks_keep_trying_and_carry_the_jobs_name_as_their_site() {
        let opts = job_opts("job:report", LockOptions::new());
        assert!(opts.retry_unreachable);
        assert_eq!(opts.site, Some("job:report"));
        let named = job_opts("job:report", LockOptions::new().site("reports"));
        assert_eq!(named.site, Some("reports"));
        // One name is kept once.
        assert!(std::ptr::eq(site_of("job:x"), site_of("job:x")));
    }

    #[test]
    fn claim_slots_depend_on_the_schedule_alone_and_outlive_every_accepted_claim() {
        let slots = |ms| Schedule::every(Duration::from_millis(ms)).slots();
        assert_eq!(slots(1_000), 64 + 600 + 2);
        assert_eq!(slots(60_000), 64 + 10 + 2);
        assert_eq!(slots(10), 64 + 60_000 + 2);
        // The default ttl (30 s) with max_hold of a tick fits every tick.
        for tick in [10, 250, 1_000, 60_000, 3_600_000] {
            let life = claim_life(tick, 30_000, tick);
            let s = Schedule::every(Duration::from_millis(tick as u64));
            assert!(life <= s.slot_life(), "tick {tick} ms");
        }
        // And every cron schedule's longest tick.
        for (expr, zone) in [
            ("* * * * * *", "UTC"),
            ("* * * * * *", "Europe/Paris"),
            ("0 2 * * *", "Europe/Paris"),
            ("0 9-17 * * MON-FRI", "America/New_York"),
            ("0 0 29 2 *", "UTC"),
        ] {
            let s = Schedule::cron(expr, zone).unwrap();
            let longest = s.longest_ms();
            assert!(claim_life(longest, 30_000, longest) <= s.slot_life(), "{s}");
        }
    }

    #[tokio::test]
    async fn refuses_settings_it_sets_itself() {
        let locker = Locker::in_memory();
        let ms = Duration::from_millis;
        let job = |_| async {};
        for (opts, tick) in [
            (LockOptions::new(), Duration::ZERO),
            (LockOptions::new().wait(ms(5)), ms(100)),
            (LockOptions::new().min_hold(ms(5)), ms(100)),
            (LockOptions::new().read(), ms(100)),
            // A claim that could outlive the job's slots: 64 ticks + 10 min.
            (LockOptions::new().max_hold(ms(700_000)), ms(100)),
            (LockOptions::new().permits(3), ms(100)),
            (LockOptions::new(), ms(5)),
            (
                LockOptions::new().on_lost(crate::options::OnLost::Continue),
                ms(100),
            ),
        ] {
            let res = every(&locker, "job", tick, opts, job).await;
            assert!(matches!(res, Err(LockError::Config(_))), "{res:?}");
        }
        // A cron schedule's claims must fit its slots too: two of its longest gaps + 10 min.
        let daily = Schedule::cron("0 2 * * *", "UTC").unwrap();
        let too_long = LockOptions::new().max_hold(Duration::from_secs(3 * 86_400));
        let res = every(&locker, "job", daily, too_long, job).await;
        assert!(matches!(res, Err(LockError::Config(_))), "{res:?}");
        let res = every(&locker, "", ms(100), LockOptions::new(), job).await;
        assert!(matches!(res, Err(LockError::InvalidKey { .. })), "{res:?}");
    }
}
