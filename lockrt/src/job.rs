//! [`every`]: a job run once per tick across a fleet, on ticks every instance agrees on.
//!
//! Each tick is claimed with a lock, `<name>:tick:<slot>`, the slot being the tick's number
//! modulo [`slots`]: a job's state on the server is a fixed number of keys, not one per tick
//! (a tick's claim is gone before the tick that reuses its slot starts). The instance whose
//! run finishes releases that claim keeping it taken on the server (as `min_hold` does) for a
//! tick (at least a second) past the tick's end: the mark survives its process, so no other
//! instance runs the tick again, and instances whose clocks lag still find it taken. A run that
//! does not finish (its process dies, its lock is lost, the locker shuts down) leaves the claim
//! to expire after `ttl` or frees it, and an instance still waiting for the tick takes it over:
//! also after the tick's end, while the claim is held by a run that did not finish, until the
//! next tick ends (then the tick is given up, with a WARN and a counter). The runs themselves hold the lock `<name>`, so a run that overruns
//! its tick never overlaps the next (bounded by `max_hold`, one tick unless set). A job that
//! finishes marks its tick done at once, on its claim's lease, so a shutdown racing the end of
//! the run keeps the claim too.

use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{LockError, LossCause};
use crate::locker::Locker;
use crate::options::LockOptions;

/// The shortest tick: below it, scheduling jitter eats the margin a claim is kept for.
const MIN_TICK: Duration = Duration::from_millis(10);

/// A finished tick's claim is kept at least this long past the tick's end (and at least a
/// tick): what an instance whose clock lags may still be trying.
const KEEP_PAST_END: Duration = Duration::from_secs(1);

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

/// Runs `job` once per `tick` across every instance that calls this with the same `name` on
/// the same lock server, until [`Locker::shutdown`]; then returns `Ok(())`. The job is given
/// the tick's start (a key for work that must not be done twice).
///
/// - **Ticks follow the wall clock**: they start at multiples of `tick` since the Unix epoch
///   (`tick = 1h` runs on the hour), so instances agree on them without talking. The first is
///   the next one to start.
/// - **Exactly one run per tick** across the fleet: the instance that gets the tick's claim
///   runs it, the others wait for the claim until the tick ends and run it only if the holder
///   dies first (its lease, `ttl`, runs out: pick `ttl` well below `tick` for a takeover
///   within the tick). A holder that died late in the tick, whose lease runs out after the
///   tick's end, is taken over then (a WARN says the tick runs late), until the next tick
///   ends; a claim still held by a run that neither finished nor renews at that point is
///   given up with a WARN and the counter `lockrt_job_ticks_given_up_total`. A finished run keeps its claim a tick (at least a second) past the
///   tick's end, so neither a crash after the run nor a clock that lags by less than that makes
///   it run twice. A run stopped by `shutdown()` or a lost lock is not finished: an instance
///   still waiting runs the tick. A tick whose run was cut short (also a late run's) or whose
///   claim failed is looked at again, and one that no instance finished is reported (WARN
///   `tick run by no instance`, the same counter).
/// - **Runs never overlap**: each holds the lock `name`; a tick whose run can't start before
///   the tick ends (the previous run still going) is skipped and logged at WARN. `max_hold`
///   bounds a run (default: one tick); past it the job is cancelled.
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
///
/// `opts` gives `ttl`, `max_hold`, `watchdog`. Errors, before any tick: `wait` or `min_hold`
/// given (set per tick), `on_lost = continue` (a run whose lock is lost is always cancelled,
/// or it could overlap the next), `read()` or `permits(n)` (shared claims would let every
/// instance run every tick), a `tick` under 10 ms, `max_hold` + `ttl` + max(tick, 1 s) beyond
/// 61 ticks + 10 minutes (a claim would outlive the job's claim slots), a `name` too long for
/// any of its claim keys.
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
    tick: Duration,
    opts: LockOptions,
    mut job: F,
) -> Result<(), LockError>
where
    F: FnMut(SystemTime) -> Fut,
    Fut: Future<Output = ()>,
{
    let slots = check(locker, name, tick, &opts)?;
    let tick_ms = tick.as_millis().max(1);
    let mut start = next_tick(now_ms(), tick_ms);
    // Ticks left to a run going on elsewhere past their end, or whose run here was cut short
    // or failed: looked at again later, so that one nobody finishes is not lost silently.
    let mut running: Vec<u128> = Vec::new();
    loop {
        tokio::select! {
            biased;
            () = locker.inner.closing.cancelled() => return Ok(()),
            () = sleep_until_ms(start) => {}
        }
        let claim = claim_of(name, start, tick_ms, slots);
        let turn = take_turn(locker, name, &claim, start, tick_ms, opts, &mut job).await;
        match turn {
            Ok(Turn::Running) if running.len() < MAX_WATCHED => running.push(start),
            // A run cut short (its lock lost, a late run too) or a claim that failed may leave
            // the tick to nobody: no instance may wait for it any more (with two instances, one
            // died). Looked at again like a run going on elsewhere, and reported if unfinished.
            Ok(turn @ (Turn::Lost | Turn::Failed)) if running.len() < MAX_WATCHED => {
                log_turn(name, start, turn);
                running.push(start);
            }
            Ok(turn) => log_turn(name, start, turn),
            Err(LockError::ShutDown) => return Ok(()),
            Err(e) => return Err(e),
        }
        watch(locker, name, &mut running, tick_ms, slots).await;
        // The next tick, or the one now under way when this turn took longer (a run that
        // overran, a late run): that one is claimed late, and the ticks in between are not
        // made up for; one that no instance ran is reported.
        let next = (start + tick_ms).max(now_ms() / tick_ms * tick_ms);
        skipped(locker, name, (start + tick_ms, next), tick_ms, slots).await;
        start = next;
    }
}

/// Most ticks left to runs going on elsewhere that are looked at again.
const MAX_WATCHED: usize = 8;

/// Looks again at the ticks in `running` (left to a run going on elsewhere past their end):
/// finished ones are forgotten; one whose claim is gone without a finished run's mark, once
/// no instance may take it over any more (the next tick ended), was run by nobody (its runner
/// died or was stopped after the others stopped waiting): reported.
async fn watch(locker: &Locker, name: &str, running: &mut Vec<u128>, tick_ms: u128, slots: u128) {
    let mut kept = Vec::with_capacity(running.len());
    for &tick in running.iter() {
        let claim = claim_of(name, tick, tick_ms, slots);
        let now = now_ms();
        match locker.lock_info(&claim).await {
            Ok(Some(info)) if info.released => {
                if !marks(&info, tick, tick_ms) {
                    log_turn(name, tick, Turn::RunByNobody);
                }
            }
            // Still running: looked at again while its claim can live.
            Ok(Some(_)) if now < tick + (slots - 2) * tick_ms => kept.push(tick),
            Ok(Some(_)) => tracing::warn!(
                job = name,
                tick = tick as u64,
                "tick still held by a run past its claim's longest life; not known whether it finishes"
            ),
            // Gone unfinished, but another instance may still take it over.
            Ok(None) if now < tick + 2 * tick_ms => kept.push(tick),
            // A finished run's mark would still be there.
            Ok(None) if now < marked_until(tick, tick_ms) => {
                log_turn(name, tick, Turn::RunByNobody)
            }
            // The server can't say now: looked at again next time, while a mark would tell.
            Err(_) if now < marked_until(tick, tick_ms) => kept.push(tick),
            Ok(None) | Err(_) => tracing::warn!(
                job = name,
                tick = tick as u64,
                "tick cut short or failed here, and looked at again only after a finished run's \
                 mark would have expired: not known whether another instance ran it"
            ),
        }
    }
    *running = kept;
}

/// Most ticks skipped in a row that are looked at one by one.
const MAX_SKIPPED_LOOKED_AT: u128 = 16;

/// The ticks `[from, to)` this instance skipped while busy with an earlier one: each is
/// looked at on the server, and one that no instance ran (no claim: neither a finished run's
/// mark nor a run going on) is given up loudly (WARN, `lockrt_job_ticks_given_up_total`).
async fn skipped(
    locker: &Locker,
    name: &str,
    (from, to): (u128, u128),
    tick_ms: u128,
    slots: u128,
) {
    let keep = tick_ms.max(KEEP_PAST_END.as_millis());
    let mut tick = from;
    let mut looked = 0;
    while tick < to {
        let now = now_ms();
        if looked == MAX_SKIPPED_LOOKED_AT || now >= tick + tick_ms + keep {
            // A finished run's mark may be gone already: not known.
            tracing::warn!(
                job = name,
                from = tick as u64,
                to = to as u64,
                "ticks skipped here while busy; not known whether another instance ran them"
            );
            return;
        }
        looked += 1;
        let claim = claim_of(name, tick, tick_ms, slots);
        let ran = match locker.lock_info(&claim).await {
            // A run going on, or this tick's finished run's mark.
            Ok(Some(info)) => !info.released || marks(&info, tick, tick_ms),
            Ok(None) => false,
            // The server can't say: the ticks are not judged.
            Err(_) => return,
        };
        if !ran {
            log_turn(name, tick, Turn::RunByNobody);
        }
        tick += tick_ms;
    }
}

/// Checks the settings and names before any tick; the job's number of claim slots.
fn check(
    locker: &Locker,
    name: &str,
    tick: Duration,
    opts: &LockOptions,
) -> Result<u128, LockError> {
    if tick < MIN_TICK {
        return Err(LockError::Config(format!(
            "every(): `tick` must be at least {}ms (got {tick:?}): a claim kept for less than \
             the scheduling jitter lets a tick run twice",
            MIN_TICK.as_millis()
        )));
    }
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
    let tick_ms = tick.as_millis().max(1);
    let slots = slots(tick_ms);
    // A tick's claim must be gone before the tick that reuses its slot starts.
    let ttl = opts.ttl.unwrap_or(locker.defaults().ttl);
    let life = claim_life(tick_ms, ttl, opts.max_hold.unwrap_or(tick));
    if life > (slots - 2) * tick_ms {
        return Err(LockError::Config(format!(
            "every(): `max_hold` plus `ttl` too long for a tick of {tick:?}: a tick's claim \
             would outlive the job's {} claim slots; keep max_hold + ttl + max(tick, 1 s) \
             within {} ticks + {} min",
            slots - 2,
            SLOT_TICKS - 3,
            SLOT_SPAN.as_secs() / 60
        )));
    }
    // The longest claim key there will be.
    locker.redis_key(&claim_key(name, slots - 1))?;
    Ok(slots)
}

/// Ticks and time a job's claim slots span (see [`slots`]).
const SLOT_TICKS: u128 = 64;
const SLOT_SPAN: Duration = Duration::from_secs(600);

/// How many claim keys a job cycles through: a number of the tick alone, so that every
/// instance of a job claims a tick on the same key whatever its other settings (a rolling
/// deploy that changes `ttl` must not let two instances run one tick). 64 ticks plus ten
/// minutes' worth; settings whose claims could live longer are refused (see [`claim_life`]).
fn slots(tick_ms: u128) -> u128 {
    SLOT_TICKS + SLOT_SPAN.as_millis().div_ceil(tick_ms) + 2
}

/// How long past a tick's start its claim may live: claimed until the tick ends, waited for
/// until the next one ends, held by the run (bounded by the claim's `max_hold`, or its lease
/// when the runner died), then kept as the finished tick's mark for a tick (at least a
/// second).
fn claim_life(tick_ms: u128, ttl: Duration, run_max: Duration) -> u128 {
    let keep = tick_ms.max(KEEP_PAST_END.as_millis());
    3 * tick_ms + run_max.as_millis() + ttl.as_millis() + keep
}

/// The claim key of slot `slot`.
fn claim_key(name: &str, slot: u128) -> String {
    format!("{name}:tick:{slot}")
}

/// The claim key of the tick starting at `tick` (Unix ms).
fn claim_of(name: &str, tick: u128, tick_ms: u128, slots: u128) -> String {
    claim_key(name, tick / tick_ms % slots)
}

/// Whether the released claim `info` is the mark of a finished run of the tick starting at
/// `tick`, not of an older tick that used its slot before (taken a tick or more earlier).
fn marks(info: &crate::inspect::LockInfo, tick: u128, tick_ms: u128) -> bool {
    let acquired = info.holder.as_ref().map_or(0, |h| h.acquired_at_ms);
    info.released && u128::from(acquired) + tick_ms >= tick
}

/// One tick: its claim, then the run under the job's lock. `Err` only for what ends
/// [`every`]: a shutdown, a key or setting the locker refuses.
async fn take_turn<F, Fut>(
    locker: &Locker,
    name: &str,
    claim_key: &str,
    start: u128,
    tick_ms: u128,
    opts: LockOptions,
    job: &mut F,
) -> Result<Turn, LockError>
where
    F: FnMut(SystemTime) -> Fut,
    Fut: Future<Output = ()>,
{
    let end = start + tick_ms;
    let tick = Duration::from_millis(duration_ms(tick_ms));
    let run_max = opts.max_hold.unwrap_or(tick);
    // Held for as long as a run that starts at the tick's end may last: a claim that stopped
    // renewing before the run ended would let a waiting instance run the tick again.
    let claim_opts = LockOptions {
        max_hold: Some(ms_until(end) + run_max + tick),
        // Every instance but one waits for the claim until the tick ends: expected.
        busy_expected: true,
        ..opts
    };
    let (claim, late) = match claim_tick(locker, claim_key, start, tick_ms, claim_opts).await {
        Ok(Claim::Ours { guard, late }) => (guard, late),
        Ok(Claim::Elsewhere) => return Ok(Turn::Elsewhere),
        Ok(Claim::Running) => return Ok(Turn::Running),
        Ok(Claim::GivenUp) => return Ok(Turn::GivenUp),
        Ok(Claim::TooLate) => return Ok(Turn::TooLate),
        Err(LockError::Backend(e)) => {
            // The tick is left to the others: named, so that one lost with it is not silent.
            tracing::warn!(job = name, tick = start as u64, error = %e, "could not claim the tick");
            return Ok(Turn::Failed);
        }
        Err(e) => return Err(e),
    };
    if late {
        tracing::warn!(
            job = name,
            tick = start as u64,
            late_ms = duration_ms(now_ms().saturating_sub(end)),
            "tick runs late here: the run that had it did not finish (its runner died or was \
             stopped, or its run could not start in time) and its claim came free"
        );
    }
    // A late run may wait for the job's lock until the next tick ends (the dead runner's
    // lease on it runs out, or the next tick's run ends first).
    let run_until = if late { end + tick_ms } else { end };
    let run_opts = opts.max_hold(run_max).wait(ms_until(run_until));
    let scheduled = UNIX_EPOCH + Duration::from_millis(duration_ms(start));
    let keep = || tokio::time::Instant::now() + ms_until(end) + tick.max(KEEP_PAST_END);
    let lease = claim.lease().clone();
    // The run also ends when the tick's claim is lost (forced unlock, eviction): another
    // instance may be running the tick then. A finished job marks the tick done at once, so
    // whatever releases the claim from then on (a shutdown racing the job lock's release)
    // keeps it.
    let body = async {
        tokio::select! {
            biased;
            () = lease.lost() => false,
            () = job(scheduled) => {
                lease.keep_after(keep());
                true
            }
        }
    };
    let turn = match locker.run(name, run_opts, body).await {
        Ok(true) if late => Turn::Late,
        Ok(true) => Turn::Ran,
        Ok(false) => Turn::Lost,
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
    end_turn(name, claim, turn).await
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

/// Waits for the claim `key` of the tick starting at `start` until the tick ends, as every
/// instance does. A claim still held then is looked at: the mark of a finished run (or a
/// run going on past the tick's end) is another instance's tick; a run that has not finished
/// may be a runner that died, whose lease runs out within its ttl: the claim is waited for
/// again, each time until that lease would end, until the next tick ends.
async fn claim_tick(
    locker: &Locker,
    key: &str,
    start: u128,
    tick_ms: u128,
    opts: LockOptions,
) -> Result<Claim, LockError> {
    let end = start + tick_ms;
    let give_up = end + tick_ms;
    let mut until = end;
    let mut late = false;
    // When the holder's lease ends, as last seen (Unix ms): a later one means it renewed.
    let mut expiry: Option<u128> = None;
    // Until then a finished run's mark is still on the claim.
    let mark_ends = marked_until(start, tick_ms);
    for _ in 0..MAX_CLAIM_ROUNDS {
        match locker.acquire(key, opts.wait(ms_until(until))).await {
            // Taken after a finished run's mark may have expired (this process was stopped,
            // or its clock lags by more than the mark is kept): whether the tick ran is not
            // known any more, so it is not run here.
            Ok(guard) if now_ms() >= mark_ends => {
                let _ = guard.release().await;
                return Ok(Claim::TooLate);
            }
            Ok(guard) => return Ok(Claim::Ours { guard, late }),
            Err(LockError::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
        late = true;
        let now = now_ms();
        match locker.lock_info(key).await? {
            // Freed just now (a run that did not finish): ask again at once.
            None if now < give_up => until = now,
            Some(info) if info.released => {
                // The mark of a run of this tick that finished; the mark of an older tick of
                // this slot (a clock far ahead) is waited out.
                if marks(&info, start, tick_ms) || now >= give_up {
                    return Ok(Claim::Elsewhere);
                }
                until = give_up.min(now + info.remaining.unwrap_or_default().as_millis() + 1);
            }
            Some(info) => {
                // Held by a run that has not finished. Renewed since the last look: its
                // runner lives and finishes the tick. Otherwise wait until its lease ends.
                let ends = now + info.remaining.map_or(tick_ms, |r| r.as_millis());
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
    name: &str,
    claim: crate::guard::LockGuard,
    turn: Turn,
) -> Result<Turn, LockError> {
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

fn log_turn(name: &str, start: u128, turn: Turn) {
    let tick = start as u64;
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
            crate::metrics::tick_given_up();
            tracing::warn!(
                job = name,
                tick,
                "tick given up: its claim was still held by a run that did not finish when the \
                 next tick ended (a runner that died with a ttl longer than the tick, or a run \
                 overrunning); pick ttl well below the tick"
            );
        }
        Turn::RunByNobody => {
            crate::metrics::tick_given_up();
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
        Turn::Failed | Turn::Stopped => {}
    }
}

/// Until when (Unix ms) a finished run of the tick starting at `tick` keeps its mark on the
/// tick's claim: past its end by a tick, at least [`KEEP_PAST_END`].
fn marked_until(tick: u128, tick_ms: u128) -> u128 {
    tick + tick_ms + tick_ms.max(KEEP_PAST_END.as_millis())
}

/// The first tick start at or after `now` (both Unix ms): the first tick [`every`] claims.
fn next_tick(now: u128, tick_ms: u128) -> u128 {
    now.div_ceil(tick_ms) * tick_ms
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

fn duration_ms(ms: u128) -> u64 {
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// From now until `at` (Unix ms), zero if past.
fn ms_until(at: u128) -> Duration {
    Duration::from_millis(duration_ms(at.saturating_sub(now_ms())))
}

/// Sleeps until the wall clock reads `at` (Unix ms).
async fn sleep_until_ms(at: u128) {
    for _ in 0..MAX_SLEEPS_PER_TICK {
        let left = ms_until(at);
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_slots_depend_on_the_tick_alone_and_outlive_every_accepted_claim() {
        assert_eq!(slots(1_000), 64 + 600 + 2);
        assert_eq!(slots(60_000), 64 + 10 + 2);
        assert_eq!(slots(10), 64 + 60_000 + 2);
        // The default ttl (30 s) with max_hold of a tick fits every tick.
        for tick in [10, 250, 1_000, 60_000, 3_600_000] {
            let life = claim_life(
                tick,
                Duration::from_secs(30),
                Duration::from_millis(tick as u64),
            );
            assert!(life <= (slots(tick) - 2) * tick, "tick {tick} ms");
        }
    }

    #[test]
    fn ticks_start_at_multiples_of_the_tick() {
        assert_eq!(next_tick(0, 1000), 0);
        assert_eq!(next_tick(1, 1000), 1000);
        assert_eq!(next_tick(1000, 1000), 1000);
        assert_eq!(next_tick(1_700_000_000_123, 60_000), 1_700_000_040_000);
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
        let res = every(&locker, "", ms(100), LockOptions::new(), job).await;
        assert!(matches!(res, Err(LockError::InvalidKey { .. })), "{res:?}");
    }
}
