//! [`Schedule`]: when the ticks of [`every`](crate::every) start, as every instance computes
//! them alone: fixed ticks since the Unix epoch, or the times a cron expression names in a
//! time zone. Also the claim slots a schedule's ticks cycle through, a number of the schedule
//! alone (never of `ttl` or `max_hold`), so that every instance claims a tick on the same key.
//! Nothing here touches the lock server.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use crate::error::LockError;

/// The shortest fixed tick: below it, scheduling jitter eats the margin a claim is kept for.
pub(super) const MIN_TICK: Duration = Duration::from_millis(10);

/// A finished tick's claim is kept at least this long past the tick's end (and at least a
/// tick): what an instance whose clock lags may still be trying.
pub(super) const KEEP_PAST_END: Duration = Duration::from_secs(1);

/// Ticks and time a fixed schedule's claim slots span (see [`Schedule::slots`]).
pub(super) const SLOT_TICKS: u128 = 64;
pub(super) const SLOT_SPAN: Duration = Duration::from_secs(600);

/// A cron schedule's slots span this many of its longest gaps, plus [`SLOT_SPAN`].
const CRON_SLOT_GAPS: u128 = 5;

/// Bounds the search for the next time of a cron schedule from inside a repeated hour (a
/// per-second schedule walks its wall-clock seconds to the hour's end).
const MAX_CRON_STEPS: u32 = 20_000;

/// Where the longest gap of a cron schedule is measured from: 2001-01-01T00:00:00Z, fixed so
/// that every instance sizes the claim slots alike.
const GAP_ANCHOR_MS: u128 = 978_307_200_000;
/// Times enumerated one by one from the anchor; minutes sampled over two days from the first
/// time; days sampled over four years (a leap day included): to bound the longest gap.
const GAP_TIMES: u32 = 2_048;
const GAP_MINUTES: u128 = 2 * 24 * 60;
const GAP_DAYS: u128 = 4 * 365 + 1;
const MINUTE_MS: u128 = 60_000;
const DAY_MS: u128 = 86_400_000;

/// When the ticks of [`every`](crate::every) start: a fixed tick (`Duration`, ticks at its
/// multiples since the Unix epoch, `tick = 1h` on the hour) or a cron expression in a time
/// zone. A `Duration` converts into one, so `every(&locker, name, Duration::from_secs(60), ..)`
/// reads as before.
///
/// A tick starts at a scheduled time and ends at the next one; each tick runs once across the
/// fleet.
///
/// **Daylight-saving time** (a cron schedule in a zone that has it): every wall-clock time the
/// expression names runs once, never twice, never skipped:
/// - a time that does not exist (the clock jumps from 02:00 to 03:00 in Europe/Paris in
///   spring) runs at the first instant after the jump (03:00 CEST); all the named times of
///   the skipped hour run once there, together with 03:00 itself;
/// - a time that occurs twice (the clock goes back from 03:00 to 02:00 in autumn) runs at its
///   first occurrence (02:30 CEST), not again at the second (02:30 CET): a per-second or
///   per-minute schedule pauses for the repeated hour.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use lockrt::Schedule;
///
/// let nightly = Schedule::cron("0 2 * * *", "Europe/Paris")?;
/// // 2027-03-28 is the spring change in Paris: 02:00 does not exist, so the run is at 03:00 CEST.
/// let before = UNIX_EPOCH + Duration::from_secs(1_806_192_000); // 2027-03-28T00:00:00Z
/// let next = nightly.next_after(before).unwrap();
/// assert_eq!(next, UNIX_EPOCH + Duration::from_secs(1_806_195_600)); // 01:00Z = 03:00 CEST
///
/// assert!(Schedule::cron("0 25 * * *", "Europe/Paris").is_err()); // no hour 25
/// assert!(Schedule::cron("0 2 * * *", "Europe/Pariss").is_err()); // no such zone
/// let minutely: Schedule = Duration::from_secs(60).into();
/// assert_eq!(minutely.to_string(), "every 60s");
/// # Ok::<(), lockrt::LockError>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    kind: Kind,
    /// Test-only: added to the wall clock (ms) the job reads.
    #[cfg(feature = "testing")]
    pub(crate) offset_ms: i64,
}

#[derive(Clone)]
enum Kind {
    Every(Duration),
    Cron(Arc<Cron>),
}

struct Cron {
    text: String,
    zone: Tz,
    cron: croner::Cron,
    /// The longest time between two scheduled times, as measured from [`GAP_ANCHOR_MS`] (ms).
    longest_ms: u128,
}

impl Schedule {
    /// Ticks every `tick`, starting at its multiples since the Unix epoch.
    pub fn every(tick: Duration) -> Schedule {
        Schedule {
            kind: Kind::Every(tick),
            #[cfg(feature = "testing")]
            offset_ms: 0,
        }
    }

    /// The times `expr` names in time zone `zone` (an IANA name: `"Europe/Paris"`, `"UTC"`).
    /// `expr` has five fields (`minute hour day-of-month month day-of-week`, `"0 2 * * *"` is
    /// daily at 02:00) or six with seconds first (`"*/10 * * * * *"`); ranges, lists, steps,
    /// names (`MON-FRI`, `JAN`), `L`, `W` and `#` as in croner. A day of month and a day of week
    /// both given match either (as Vixie cron does). See the type's docs for daylight-saving time.
    ///
    /// Errors with [`LockError::Config`] naming the problem: an expression croner can't parse,
    /// one that never matches (`"0 0 30 2 *"`), an unknown zone.
    pub fn cron(expr: &str, zone: &str) -> Result<Schedule, LockError> {
        let cron = croner::Cron::new(expr)
            .with_seconds_optional()
            .parse()
            .map_err(|e| {
                LockError::Config(format!(
                    "cron expression {expr:?} is not valid: {e}; write five fields (minute hour \
                     day-of-month month day-of-week, e.g. \"0 2 * * *\") or six with seconds first"
                ))
            })?;
        let zone: Tz = zone.parse().map_err(|_| {
            LockError::Config(format!(
                "unknown time zone {zone:?}: give an IANA name such as \"Europe/Paris\" or \"UTC\""
            ))
        })?;
        let mut c = Cron {
            text: expr.to_owned(),
            zone,
            cron,
            longest_ms: 0,
        };
        c.longest_ms = c.longest_gap().ok_or_else(|| {
            LockError::Config(format!(
                "cron expression {expr:?} names no time in {zone} (after 2001, within four \
                 years): a job on it would never run"
            ))
        })?;
        Ok(Schedule {
            kind: Kind::Cron(Arc::new(c)),
            #[cfg(feature = "testing")]
            offset_ms: 0,
        })
    }

    /// The first scheduled time strictly after `t`; `None` when there is none (a cron
    /// expression whose last time has passed).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let ms = t.duration_since(UNIX_EPOCH).ok()?.as_millis();
        self.next(ms).map(from_ms)
    }

    /// The first tick start strictly after `t` (Unix ms).
    pub(super) fn next(&self, t: u128) -> Option<u128> {
        match &self.kind {
            Kind::Every(tick) => {
                let tick = tick.as_millis().max(1);
                Some((t / tick + 1) * tick)
            }
            Kind::Cron(c) => c.next(t),
        }
    }

    /// The first tick start at or after `t` (Unix ms).
    pub(super) fn first(&self, t: u128) -> Option<u128> {
        self.next(t.saturating_sub(1))
    }

    /// The tick starting at `start` (a scheduled time), or `None` if no time follows it.
    pub(super) fn tick(&self, start: u128) -> Option<Tick> {
        let end = self.next(start)?;
        let next_end = self.next(end)?;
        let gap = end - start;
        Some(Tick {
            start,
            end,
            next_end,
            keep: gap.max(KEEP_PAST_END.as_millis()),
            slot: start / self.slot_unit() % self.slots(),
        })
    }

    /// The longest time between two ticks (ms): the tick of a fixed schedule.
    pub(super) fn longest_ms(&self) -> u128 {
        match &self.kind {
            Kind::Every(tick) => tick.as_millis().max(1),
            Kind::Cron(c) => c.longest_ms,
        }
    }

    /// What a slot number counts (ms): the tick of a fixed schedule; a second for cron, whose
    /// times are whole seconds, so two of them never share a slot number.
    fn slot_unit(&self) -> u128 {
        match &self.kind {
            Kind::Every(tick) => tick.as_millis().max(1),
            Kind::Cron(_) => 1_000,
        }
    }

    /// How many claim keys a job cycles through: a number of the schedule alone, so that
    /// every instance of a job claims a tick on the same key whatever its other settings (a
    /// rolling deploy that changes `ttl` must not let two instances run one tick). Fixed
    /// ticks: 64 ticks plus ten minutes' worth. Cron: five of its longest gaps plus ten
    /// minutes, in seconds. Settings whose claims could live longer are refused.
    pub(super) fn slots(&self) -> u128 {
        let unit = self.slot_unit();
        let span = SLOT_SPAN.as_millis().div_ceil(unit) + 2;
        match &self.kind {
            Kind::Every(_) => SLOT_TICKS + span,
            Kind::Cron(c) => CRON_SLOT_GAPS * c.longest_ms.div_ceil(unit) + span,
        }
    }

    /// How long past its start a tick's claim may live before its slot is reused (ms).
    pub(super) fn slot_life(&self) -> u128 {
        (self.slots() - 2) * self.slot_unit()
    }

    /// Checks what the schedule alone can get wrong; `what` names it in messages.
    pub(super) fn check(&self) -> Result<(), LockError> {
        if let Kind::Every(tick) = self.kind
            && tick < MIN_TICK
        {
            return Err(LockError::Config(format!(
                "every(): `tick` must be at least {}ms (got {tick:?}): a claim kept for less \
                 than the scheduling jitter lets a tick run twice",
                MIN_TICK.as_millis()
            )));
        }
        Ok(())
    }

    /// The wall clock the job reads (Unix ms): the system's, shifted in tests.
    pub(super) fn now_ms(&self) -> u128 {
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        self.shift(real)
    }

    /// A time of the server's or the system's clock (Unix ms) on the job's clock.
    pub(super) fn shift(&self, ms: u128) -> u128 {
        #[cfg(feature = "testing")]
        {
            let shifted = i128::try_from(ms).unwrap_or(i128::MAX) + i128::from(self.offset_ms);
            u128::try_from(shifted).unwrap_or(0)
        }
        #[cfg(not(feature = "testing"))]
        ms
    }
}

impl From<Duration> for Schedule {
    fn from(tick: Duration) -> Schedule {
        Schedule::every(tick)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Every(tick) => write!(f, "every {tick:?}"),
            Kind::Cron(c) => write!(f, "cron {:?} in {}", c.text, c.zone),
        }
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({self})")
    }
}

/// One tick as [`every`](crate::every) claims and runs it (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tick {
    /// Its scheduled time.
    pub(super) start: u128,
    /// The next scheduled time: the tick ends then.
    pub(super) end: u128,
    /// The end of the tick after it: a late take-over is tried until then.
    pub(super) next_end: u128,
    /// How long past its end a finished run's mark is kept: a tick, at least a second.
    pub(super) keep: u128,
    /// Its claim slot.
    pub(super) slot: u128,
}

impl Tick {
    /// The tick's length (ms).
    pub(super) fn gap(&self) -> u128 {
        self.end - self.start
    }

    /// Until when a finished run of this tick keeps its mark on the tick's claim.
    pub(super) fn marked_until(&self) -> u128 {
        self.end + self.keep
    }
}

impl Cron {
    /// The first scheduled time strictly after `after` (Unix ms), by the daylight-saving rules
    /// of [`Schedule`]: croner searches wall-clock times, maps a time that occurs twice to its
    /// first occurrence and one that does not exist to the end of the jump. From inside a
    /// repeated hour the first occurrences lie behind: the search walks on to the hour's end.
    fn next(&self, after: u128) -> Option<u128> {
        let secs = i64::try_from(after / 1000).ok()?;
        let mut from: DateTime<Tz> = Utc
            .timestamp_opt(secs, 0)
            .single()?
            .with_timezone(&self.zone);
        for _ in 0..MAX_CRON_STEPS {
            let at = self.cron.find_next_occurrence(&from, false).ok()?;
            let ms = u128::try_from(at.timestamp()).ok()? * 1000;
            if ms > after {
                return Some(ms);
            }
            from = at;
        }
        None
    }

    /// A bound on the longest gap between two scheduled times. A cron expression's fields are
    /// a product: every scheduled day has the same times of day (daylight-saving time aside,
    /// added as the zone's shift). So: gaps within a day are seen in the first [`GAP_TIMES`]
    /// times (under a minute) or from the minutes of two days after the first time (a gap of a
    /// minute or more holds a whole minute `m`, and is shorter than a minute more than from
    /// `m` to the next time); gaps across days hold a midnight (UTC) `d`, and are shorter than a
    /// day more than from `d` to the next time, over four years. A sample that is itself
    /// scheduled holds no gap. `None` when nothing is scheduled.
    fn longest_gap(&self) -> Option<u128> {
        let first = self.next(GAP_ANCHOR_MS - 1)?;
        let mut at = first;
        let mut dense = 0;
        for _ in 0..GAP_TIMES {
            let Some(next) = self.next(at) else { break };
            dense = dense.max(next - at);
            at = next;
        }
        // From each sample, the time to the next scheduled time at or after it.
        let from = |sample: u128| self.next(sample - 1).map_or(0, |n| n - sample);
        let minute0 = first / MINUTE_MS * MINUTE_MS;
        let minutes = (0..GAP_MINUTES)
            .map(|m| from(minute0 + m * MINUTE_MS))
            .max();
        let days = (0..GAP_DAYS)
            .map(|d| from(GAP_ANCHOR_MS + d * DAY_MS))
            .max();
        let slack = |found: Option<u128>, step| found.filter(|&f| f > 0).map_or(0, |f| f + step);
        let longest = dense
            .max(slack(minutes, MINUTE_MS))
            .max(slack(days, DAY_MS));
        Some(longest.max(1_000) + self.dst_shift_ms())
    }

    /// How far the zone's clocks move between winter and summer (ms), zero without DST.
    fn dst_shift_ms(&self) -> u128 {
        let offset = |ms: i64| {
            let t = Utc.timestamp_millis_opt(ms).single();
            t.map_or(0, |t| {
                i64::from(t.with_timezone(&self.zone).offset().fix().local_minus_utc())
            })
        };
        // Every week of 1990-2060: a zone's shifts need not be summer time in July (Morocco
        // sets its clocks back for Ramadan, a month that moves through the year).
        const WEEK_MS: i64 = 7 * 24 * 3_600_000;
        let (from, to) = (631_152_000_000_i64, 2_840_140_800_000_i64);
        let (mut low, mut high) = (i64::MAX, i64::MIN);
        for t in (from..to).step_by(WEEK_MS as usize) {
            let o = offset(t);
            (low, high) = (low.min(o), high.max(o));
        }
        u128::from(high.abs_diff(low)) * 1000
    }
}

fn from_ms(ms: u128) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2027-03-28T00:59:55Z: five seconds before Paris jumps from 02:00 CET to 03:00 CEST.
    const SPRING_MS: u128 = 1_806_195_595_000;
    /// 2027-10-31T00:59:55Z: five seconds before Paris goes back from 03:00 CEST to 02:00 CET.
    const AUTUMN_MS: u128 = 1_824_944_395_000;

    fn cron(expr: &str) -> Schedule {
        Schedule::cron(expr, "Europe/Paris").unwrap()
    }

    fn times(s: &Schedule, from: u128, n: usize) -> Vec<u128> {
        let mut out = vec![];
        let mut t = from;
        for _ in 0..n {
            t = s.next(t).unwrap();
            out.push(t);
        }
        out
    }

    #[test]
    fn fixed_ticks_start_at_multiples_of_the_tick() {
        let s = Schedule::every(Duration::from_millis(1000));
        assert_eq!(s.first(1), Some(1000));
        assert_eq!(s.first(1000), Some(1000));
        assert_eq!(s.next(1000), Some(2000));
        let m = Schedule::every(Duration::from_secs(60));
        assert_eq!(m.first(1_700_000_000_123), Some(1_700_000_040_000));
        assert_eq!(m.tick(60_000).unwrap().slot, 1);
    }

    #[test]
    fn a_nonexistent_time_runs_once_at_the_end_of_the_jump() {
        let daily = cron("30 2 * * *");
        // 2027-03-27 02:30 CET = 01:30Z; 28th: 02:30 does not exist -> 03:00 CEST = 01:00Z;
        // 29th: 02:30 CEST = 00:30Z.
        let got = times(&daily, SPRING_MS - 86_400_000, 3);
        let day = 86_400_000;
        let base = SPRING_MS + 5_000 - 3_600_000; // 2027-03-28T00:00:00Z
        assert_eq!(
            got,
            vec![
                base - day + 5_400_000,
                base + 3_600_000,
                base + day + 1_800_000
            ]
        );
        // Per second: 01:59:59 CET, then 03:00:00 CEST one real second later, no gap.
        let each = cron("* * * * * *");
        let got = times(&each, SPRING_MS, 8);
        let expect: Vec<u128> = (1..=8).map(|i| SPRING_MS + i * 1000).collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn a_time_that_occurs_twice_runs_once_at_its_first_occurrence() {
        let daily = cron("30 2 * * *");
        let base = AUTUMN_MS + 5_000 - 3_600_000; // 2027-10-31T00:00:00Z = 02:00 CEST
        // 02:30 CEST = 00:30Z, and not 02:30 CET = 01:30Z; the next day 02:30 CET = 01:30Z.
        let got = times(&daily, base - 1, 2);
        assert_eq!(got, vec![base + 1_800_000, base + 86_400_000 + 5_400_000]);
        // From inside the repeated hour (02:10 CET), the next is the next day's.
        assert_eq!(
            daily.next(base + 4_200_000),
            Some(base + 86_400_000 + 5_400_000)
        );
        // Per second: 02:59:59 CEST, then 03:00:00 CET, an hour (and a second) later.
        let each = cron("* * * * * *");
        let got = times(&each, AUTUMN_MS + 3_000, 3);
        let end = AUTUMN_MS + 5_000; // 01:00Z = 03:00 CEST = 02:00 CET
        assert_eq!(got, vec![end - 1000, end + 3_600_000, end + 3_601_000]);
        // From inside the repeated hour: its end.
        assert_eq!(each.next(end + 1_234_567), Some(end + 3_600_000));
    }

    #[test]
    fn irregular_gaps_size_the_claim_slots() {
        let office = cron("0 9-17 * * MON-FRI");
        // Friday 17:00 to Monday 09:00 (64 h), within a day, plus the DST hour.
        let longest = office.longest_ms();
        assert!(longest >= 64 * 3_600_000, "{longest}");
        assert!(longest <= 90 * 3_600_000, "{longest}");
        assert!(office.slot_life() >= 5 * 64 * 3_600_000);
        let utc = Schedule::cron("* * * * * *", "UTC").unwrap();
        assert_eq!(utc.longest_ms(), 1_000);
        assert_eq!(utc.slots(), 5 + 600 + 2);
        // Each cron tick's slot is its second modulo the slots.
        let t = utc.tick(1_000_000).unwrap();
        assert_eq!(
            (t.end, t.next_end, t.slot),
            (1_001_000, 1_002_000, 1_000 % 607)
        );
    }

    #[test]
    fn a_gap_inside_the_day_is_bounded_too() {
        // Every second but the noon hour: a gap of an hour and a second once a day.
        let lunch = Schedule::cron("* * 0-11,13-23 * * *", "UTC").unwrap();
        assert!(lunch.longest_ms() >= 3_601_000, "{}", lunch.longest_ms());
        assert!(lunch.longest_ms() <= 3_661_000, "{}", lunch.longest_ms());
        let nightly = Schedule::cron("0 2 * * *", "UTC").unwrap();
        assert!(nightly.longest_ms() >= DAY_MS, "{}", nightly.longest_ms());
    }

    #[test]
    fn a_zone_shifting_its_clocks_outside_july_sizes_the_slots_too() {
        // Morocco sets its clocks back an hour for Ramadan (not in 2001's January or July):
        // a per-second cron's tick across the change lasts an hour and a second.
        let casablanca = Schedule::cron("* * * * * *", "Africa/Casablanca").unwrap();
        assert!(
            casablanca.longest_ms() >= 3_601_000,
            "{}",
            casablanca.longest_ms()
        );
        let utc = Schedule::cron("* * * * * *", "UTC").unwrap();
        assert_eq!(utc.longest_ms(), 1_000);
    }

    #[test]
    fn bad_expressions_and_zones_are_config_errors_naming_them() {
        for (expr, zone, says) in [
            ("0 25 * * *", "UTC", "\"0 25 * * *\""),
            ("not cron", "UTC", "not valid"),
            (
                "0 2 * * *",
                "Mars/Olympus",
                "unknown time zone \"Mars/Olympus\"",
            ),
            ("0 0 30 2 *", "UTC", "names no time"),
        ] {
            match Schedule::cron(expr, zone) {
                Err(LockError::Config(msg)) => assert!(msg.contains(says), "{msg}"),
                other => panic!("{expr} {zone}: {other:?}"),
            }
        }
    }
}
