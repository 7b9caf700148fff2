//! Lock kinds in the history checker: writers (exclusive), readers and permit holders, each
//! section recorded with its kind, checked by [`check`] against a kinds oracle.
//!
//! One history holds one read-write key (exclusive and read sections) and one semaphore key
//! (permit sections): a key is either a lock or a semaphore, so the kind says which key. A
//! multi-key section's record names its keys.
//!
//! - A *writer* does what [`super::history::section`] does, its claim also raising the highest
//!   *writer* fence, so the oracle counts lost updates as before.
//! - A *reader* does a fenced read of the counter twice, around its `await`: a read whose fence
//!   is below the highest writer fence the oracle accepted is rejected (a stale reader
//!   detected). Its fence also raises the highest fence, so a writer below it is stale too.
//!   The two reads must agree: a writer that wrote in between was inside with the reader.
//! - A *multi-key* section (`acquire_all`) is a writer on each of its keys, the read-write key
//!   among them or not; the exclusive keys have their own fences and counters ([`multi`]).
//! - A *permit holder* `INCR`s the key's count inside when it starts (recording what it saw,
//!   which must not exceed n) and `DECR`s it when it stops, however it stops.
//!
//! The same excuse as for exclusive sections: a process frozen inside a synchronous step
//! overlaps whatever the lock does. A permit holder frozen past its lease also stays in the
//! oracle's count until it runs again, so a count it inflates is excused, and only then.

use std::collections::HashSet;
use std::{fmt, str::FromStr};

use super::history::{Section, Stall, stopped_during};

pub mod multi;
pub mod oracle;

pub use oracle::State;

/// What a section holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    /// The exclusive lock, the write side of the read-write lock.
    #[default]
    Exclusive,
    Read,
    Permits(u32),
    /// Exclusive locks of several keys at once (`acquire_all`): a writer on each of them.
    Multi,
}

impl Kind {
    pub fn options(self) -> lockrt::LockOptions {
        match self {
            Kind::Exclusive | Kind::Multi => lockrt::LockOptions::new(),
            Kind::Read => lockrt::LockOptions::new().read(),
            Kind::Permits(n) => lockrt::LockOptions::new().permits(n),
        }
    }
}

/// As logged: `x`, `r`, `p<n>`, `m`.
impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Exclusive => f.write_str("x"),
            Kind::Read => f.write_str("r"),
            Kind::Multi => f.write_str("m"),
            Kind::Permits(n) => write!(f, "p{n}"),
        }
    }
}

impl FromStr for Kind {
    type Err = ();
    fn from_str(s: &str) -> Result<Kind, ()> {
        match s {
            "x" => Ok(Kind::Exclusive),
            "r" => Ok(Kind::Read),
            "m" => Ok(Kind::Multi),
            _ => s
                .strip_prefix('p')
                .and_then(|n| n.parse().ok())
                .map(Kind::Permits)
                .ok_or(()),
        }
    }
}

// ---- the checker ----------------------------------------------------------------------------

/// What [`check`] found. Lists hold violations, one line each.
#[derive(Debug, Default)]
pub struct Report {
    /// Sections per kind: writers, readers, permit holders, multi-key; and how many completed.
    pub sections: [usize; 4],
    pub completed: [usize; 4],
    pub max_readers: usize,
    pub max_permits: usize,
    pub max_inside_seen: i64,
    pub overlaps: Vec<String>,
    pub excused_overlaps: usize,
    /// Overlaps (and the over-limit counts, lost updates, changed reads they cause) of a
    /// section whose caller was told its lock was lost: only what [`check_told`] is given.
    pub told_overlaps: usize,
    pub over_limit: Vec<String>,
    pub excused_over_limit: usize,
    pub fence_order: Vec<String>,
    pub stale_writes_accepted: Vec<String>,
    pub stale_reads_accepted: Vec<String>,
    pub stale_writes_rejected: usize,
    pub stale_reads_rejected: usize,
    /// Records' count of the oracle's accepted claims and fenced reads.
    pub writes_accepted: usize,
    pub reads_accepted: usize,
    /// Completed readers whose two reads differ.
    pub changed_under_reader: Vec<String>,
    pub lost_updates: usize,
    pub excused_lost_updates: usize,
    pub counter_expected: i64,
    pub state: State,
    /// Multi-key sections: the exclusive keys they took (besides the read-write key), and
    /// where a key's oracle and the records disagree.
    pub multi_keys: usize,
    pub key_disagreements: Vec<String>,
}

/// Sections whose caller was told the lock was lost, by [`multi::ident`].
pub type Told = HashSet<(u32, u64)>;

/// Sections whose callers left (cancelled) before they could hear that their lock was ended
/// under them, with the earliest moment it may have been ended (a forced unlock sent, a
/// restart without data): they count as told for what started from then on, not before.
pub type Cut = std::collections::HashMap<(u32, u64), u64>;

fn of(s: &[Section], k: impl Fn(Kind) -> bool) -> Vec<&Section> {
    let mut v: Vec<&Section> = s.iter().filter(|s| k(s.kind) && s.acquired != 0).collect();
    v.sort_by_key(|s| (s.acquired, s.fence));
    v
}

/// Checks a history of the kinds (see the module docs) against the oracle's final state.
pub fn check(sections: &[Section], stalls: &[Stall], state: State) -> Report {
    check_told(sections, stalls, state, &Told::new(), &[])
}

/// [`check`], where the sections in `told` (their callers heard `Lost`) may overlap others,
/// as after a restart that forgot the locks; `keys` is the multi-key oracle's state.
pub fn check_told(
    sections: &[Section],
    stalls: &[Stall],
    state: State,
    told: &Told,
    keys: &[multi::KeyState],
) -> Report {
    check_cut(sections, stalls, state, (told, &Cut::new()), keys)
}

/// [`check_told`], where the sections in `cut` count as told from their moment on.
pub fn check_cut(
    sections: &[Section],
    stalls: &[Stall],
    state: State,
    (told, cut): (&Told, &Cut),
    keys: &[multi::KeyState],
) -> Report {
    let mut r = Report {
        state,
        ..Report::default()
    };
    let kinds: [fn(Kind) -> bool; 4] = [
        |k| k == Kind::Exclusive,
        |k| k == Kind::Read,
        |k| matches!(k, Kind::Permits(_)),
        |k| k == Kind::Multi,
    ];
    for (i, k) in kinds.iter().enumerate() {
        r.sections[i] = sections.iter().filter(|s| k(s.kind)).count();
        r.completed[i] = sections.iter().filter(|s| k(s.kind) && s.completed).count();
    }
    // Multi-key sections that took the read-write key are writers of it.
    let on_rw = multi::project(sections, multi::RW);
    let mut rw = of(sections, |k| k == Kind::Exclusive || k == Kind::Read);
    rw.extend(&on_rw);
    rw.sort_by_key(|s| (s.acquired, s.fence));
    let ex = Excuses { stalls, told, cut };
    rw_overlaps(&mut r, &rw, &ex);
    rw_fences(&mut r, &rw, &ex);
    readers(&mut r, &rw, &ex);
    lost_updates(&mut r, &rw, &ex);
    let permits = of(sections, |k| matches!(k, Kind::Permits(_)));
    permit_sweep(&mut r, &permits, &ex);
    permit_counts(&mut r, &permits, &ex);
    multi::check_keys(&mut r, sections, &ex, keys);
    r
}

/// What may explain an anomaly: a process frozen inside a step, or a caller told `Lost`.
struct Excuses<'a> {
    stalls: &'a [Stall],
    told: &'a Told,
    cut: &'a Cut,
}

impl Excuses<'_> {
    fn frozen(&self, s: &Section) -> bool {
        stopped_during(self.stalls, s.pid, s.last_step())
    }

    fn told(&self, s: &Section) -> bool {
        self.told.contains(&multi::ident(s))
    }

    /// Told, or cut under its caller at most a scheduling allowance after `at` (when the
    /// later section of a pair started).
    fn told_by(&self, s: &Section, at: u64) -> bool {
        const SLACK_NS: u64 = 30_000_000;
        self.told(s)
            || (self.cut.get(&multi::ident(s))).is_some_and(|&t| t <= at.saturating_add(SLACK_NS))
    }
}

/// Writers overlap nobody, readers only readers: each section against those still inside
/// when it starts.
fn rw_overlaps(r: &mut Report, rw: &[&Section], ex: &Excuses) {
    let mut active: Vec<&Section> = Vec::new();
    for &s in rw {
        active.retain(|a| a.last_effect() > s.acquired);
        for &a in &active {
            if a.kind == Kind::Read && s.kind == Kind::Read {
                continue;
            }
            if ex.frozen(a) {
                r.excused_overlaps += 1;
            } else if ex.told_by(a, s.acquired) || ex.told_by(s, s.acquired) {
                // Either side told `Lost` (a forced unlock's revocation reaches a holder whose
                // body just started a moment later): the promise is about the others.
                r.told_overlaps += 1;
            } else {
                r.overlaps
                    .push(format!("{a} still inside when {s} started"));
            }
        }
        if s.kind == Kind::Read {
            let n = 1 + active.iter().filter(|a| a.kind == Kind::Read).count();
            r.max_readers = r.max_readers.max(n);
        }
        active.push(s);
    }
}

/// In start order, among sections that reached the oracle: a writer's fence above every
/// earlier fence, a reader's above every earlier writer's (unless either was told `Lost`).
/// Accepted claims and reads are stale when a higher fence had reached the oracle before
/// they were sent (a writer's claim; for a writer, a reader's read too): fenced storage
/// rejects only what it has seen beaten.
fn rw_fences(r: &mut Report, rw: &[&Section], ex: &Excuses) {
    let (mut any, mut writers) = (None::<&Section>, None::<&Section>);
    let seen_by_writers = Seen::of(rw, |s| s.kind == Kind::Exclusive);
    let seen_by_all = Seen::of(rw, |_| true);
    for &s in rw {
        let bound = if s.kind == Kind::Read { writers } else { any };
        if s.claim.is_some()
            && let Some(b) = bound.filter(|b| b.fence >= s.fence)
        {
            if ex.told_by(s, s.acquired) || ex.told_by(b, s.acquired) {
                r.told_overlaps += 1;
            } else {
                r.fence_order.push(format!("{s} started after {b}"));
            }
        }
        let seen = if s.kind == Kind::Read {
            &seen_by_writers
        } else {
            &seen_by_all
        };
        let beaten = seen.before(s.acquired);
        if s.claim == Some(true) && s.fence < beaten {
            let msg = format!("{s} accepted after fence {beaten} had reached the oracle");
            match s.kind {
                Kind::Read => r.stale_reads_accepted.push(msg),
                _ => r.stale_writes_accepted.push(msg),
            }
        }
        if s.claim.is_some() {
            any = highest(any, s);
            if s.kind == Kind::Exclusive {
                writers = highest(writers, s);
            }
        }
    }
    r.writes_accepted = count(rw, |s| s.kind == Kind::Exclusive && s.claim == Some(true));
    r.stale_writes_rejected = count(rw, |s| s.kind == Kind::Exclusive && s.claim == Some(false));
}

/// The fences that had reached the oracle by a moment: accepted first steps (claims, reads)
/// by the time they returned.
struct Seen {
    /// (returned at, highest fence accepted by then), in time order.
    by: Vec<(u64, u64)>,
}

impl Seen {
    fn of(rw: &[&Section], which: impl Fn(&Section) -> bool) -> Seen {
        let mut steps: Vec<(u64, u64)> = (rw.iter())
            .filter(|s| s.claim == Some(true) && s.claimed != 0 && which(s))
            .map(|s| (s.claimed, s.fence))
            .collect();
        steps.sort_unstable();
        let mut top = 0;
        for step in &mut steps {
            top = top.max(step.1);
            step.1 = top;
        }
        Seen { by: steps }
    }

    /// The highest fence accepted strictly before `t` (0 if none).
    fn before(&self, t: u64) -> u64 {
        match self.by.partition_point(|&(at, _)| at < t) {
            0 => 0,
            n => self.by[n - 1].1,
        }
    }
}

fn highest<'a>(m: Option<&'a Section>, s: &'a Section) -> Option<&'a Section> {
    m.filter(|m| m.fence >= s.fence).or(Some(s))
}

fn count(v: &[&Section], f: impl Fn(&Section) -> bool) -> usize {
    v.iter().filter(|s| f(s)).count()
}

/// Readers' second reads: not stale (no writer with a higher fence claimed before it), and
/// equal to the first, unless a writer frozen inside its write explains the change.
fn readers(r: &mut Report, rw: &[&Section], ex: &Excuses) {
    let writers: Vec<&Section> = rw
        .iter()
        .copied()
        .filter(|s| s.kind == Kind::Exclusive)
        .collect();
    for &s in rw.iter().filter(|s| s.kind == Kind::Read && s.completed) {
        // A writer whose claim had reached the oracle before the second read was sent.
        if let Some(w) = writers.iter().find(|w| {
            w.claim == Some(true) && w.claimed != 0 && w.claimed < s.wake && w.fence > s.fence
        }) {
            r.stale_reads_accepted
                .push(format!("{s}: second read accepted after {w} had claimed"));
        }
        if s.extra != s.read_value {
            let by = |w: &&&Section| w.acquired < s.end && w.last_effect() > s.acquired;
            if writers.iter().filter(by).any(|w| ex.told(w) || ex.told(s)) {
                r.told_overlaps += 1;
            } else if !writers.iter().filter(by).any(|w| ex.frozen(w)) {
                r.changed_under_reader
                    .push(format!("{s} read {:?} then {:?}", s.read_value, s.extra));
            }
        }
    }
    r.reads_accepted = count(rw, |s| s.kind == Kind::Read && s.claim == Some(true))
        + count(rw, |s| s.kind == Kind::Read && s.completed);
    r.stale_reads_rejected = count(rw, |s| {
        s.kind == Kind::Read && (s.claim == Some(false) || (s.end != 0 && !s.completed))
    });
}

/// Completed writers that read the same counter value lost an update.
fn lost_updates(r: &mut Report, rw: &[&Section], ex: &Excuses) {
    let mut by_value = std::collections::BTreeMap::<i64, Vec<&Section>>::new();
    for &s in rw
        .iter()
        .filter(|s| s.kind == Kind::Exclusive && s.completed)
    {
        by_value
            .entry(s.read_value.unwrap_or(0))
            .or_default()
            .push(s);
    }
    for (value, group) in by_value.iter().filter(|(_, g)| g.len() > 1) {
        let lost = group.len() - 1;
        let stalled = count(group, |s| ex.frozen(s) || ex.told(s));
        // A writer told `Lost` (or frozen) whose last write landed late set the counter back
        // to what it had read plus one: every value from there up to where the counter had got
        // is read once more. Each such write explains one repeat of `value` when it read less
        // and landed after `value` was first read.
        let first_read = group.iter().map(|s| s.acquired).min().unwrap_or(0);
        let late = (by_value.range(..value).flat_map(|(_, g)| g))
            .filter(|s| (ex.frozen(s) || ex.told(s)) && s.end > first_read)
            .count();
        r.lost_updates += lost;
        r.excused_lost_updates += lost.min(stalled + late);
    }
    let completed = count(rw, |s| s.kind == Kind::Exclusive && s.completed);
    r.counter_expected = (completed - r.lost_updates) as i64;
}

/// At no instant more than n permit holders inside (by their intervals); permit fences
/// distinct.
fn permit_sweep(r: &mut Report, permits: &[&Section], ex: &Excuses) {
    let mut active: Vec<&Section> = Vec::new();
    for &s in permits.iter().filter(|s| s.claim.is_some()) {
        let Kind::Permits(n) = s.kind else { continue };
        active.retain(|a| a.last_effect() > s.acquired);
        let inside = active.len() + 1;
        r.max_permits = r.max_permits.max(inside);
        if inside > n as usize {
            let frozen = count(&active, |a| ex.frozen(a));
            let told = count(&active, |a| ex.told_by(a, s.acquired))
                + usize::from(ex.told_by(s, s.acquired));
            if inside - frozen <= n as usize {
                r.excused_over_limit += 1;
            } else if inside - frozen - told.min(inside - frozen) <= n as usize {
                r.told_overlaps += 1;
            } else {
                let who: Vec<String> = active.iter().map(|a| a.to_string()).collect();
                r.over_limit.push(format!(
                    "{s} started while {} were inside: {}",
                    inside - 1,
                    who.join("; ")
                ));
            }
        }
        active.push(s);
    }
    let mut fences: Vec<&Section> = permits.to_vec();
    fences.sort_by_key(|s| s.fence);
    for w in fences.windows(2).filter(|w| w[0].fence == w[1].fence) {
        r.fence_order
            .push(format!("same permit fence: {} and {}", w[0], w[1]));
    }
}

/// The oracle's count inside as each permit holder saw it: at most n, but for holders still
/// counted because their process was frozen since they entered.
fn permit_counts(r: &mut Report, permits: &[&Section], ex: &Excuses) {
    for &s in permits {
        let (Kind::Permits(n), Some(v)) = (s.kind, s.extra) else {
            continue;
        };
        r.max_inside_seen = r.max_inside_seen.max(v);
        if v <= i64::from(n) {
            continue;
        }
        let inside = |o: &Section| {
            o != s
                && o.claimed != 0
                && o.acquired < s.claimed
                && (o.left == 0 || o.left > s.acquired)
        };
        let frozen = count(permits, |o| {
            inside(o)
                && ex
                    .stalls
                    .iter()
                    .any(|t| t.pid == o.pid && t.stop <= s.claimed && t.cont >= o.acquired)
        });
        // This holder too, when it was told `Lost`: the promise is about the others.
        let told = count(permits, |o| inside(o) && ex.told_by(o, s.acquired))
            + usize::from(ex.told_by(s, s.acquired));
        if v - frozen as i64 > i64::from(n) && v - (frozen + told) as i64 <= i64::from(n) {
            r.told_overlaps += 1;
        } else if v - frozen as i64 > i64::from(n) {
            r.over_limit.push(format!(
                "{s} saw {v} inside the semaphore of {n} ({frozen} frozen)"
            ));
        } else {
            r.excused_over_limit += 1;
        }
    }
}

impl Report {
    /// Everything that is wrong, one line each; empty when the history is correct.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        let lists = [
            ("overlap", &self.overlaps),
            ("over the limit", &self.over_limit),
            ("fence order", &self.fence_order),
            ("stale write accepted", &self.stale_writes_accepted),
            ("stale read accepted", &self.stale_reads_accepted),
            ("counter changed under a reader", &self.changed_under_reader),
            ("multi-key oracle", &self.key_disagreements),
        ];
        for (what, list) in lists {
            v.extend(list.iter().map(|l| format!("{what}: {l}")));
        }
        let unexcused = self.lost_updates - self.excused_lost_updates;
        if unexcused > 0 {
            v.push(format!("{unexcused} lost update(s)"));
        }
        v.extend(self.disagreements());
        v
    }

    /// Where the records and the oracle's final state disagree.
    fn disagreements(&self) -> Vec<String> {
        let st = &self.state;
        let mut v = Vec::new();
        let mut expect = |what: &str, oracle: i64, records: i64| {
            if oracle != records {
                v.push(format!("oracle {what} {oracle}, the records say {records}"));
            }
        };
        expect("counter", st.counter, self.counter_expected);
        expect(
            "writes rejected",
            st.writes_rejected,
            self.stale_writes_rejected as i64,
        );
        expect(
            "reads rejected",
            st.reads_rejected,
            self.stale_reads_rejected as i64,
        );
        expect(
            "writes accepted",
            st.writes_accepted,
            self.writes_accepted as i64,
        );
        expect(
            "reads accepted",
            st.reads_accepted,
            self.reads_accepted as i64,
        );
        expect("permit holders inside at the end", st.inside, 0);
        expect("highest count inside", st.inside_max, self.max_inside_seen);
        expect(
            "permit sections done",
            st.permits_done,
            self.completed[2] as i64,
        );
        v
    }

    pub fn is_ok(&self) -> bool {
        self.violations().is_empty()
    }

    /// One line of figures.
    pub fn summary(&self) -> String {
        let [w, rd, p, m] = self.sections;
        let [cw, crd, cp, cm] = self.completed;
        format!(
            "writers {w} ({cw} completed), readers {rd} ({crd}), permits {p} ({cp}), multi-key \
             {m} ({cm}) over {} keys + rw; max readers {}, max permits {} (oracle saw {}); \
             overlaps {} ({} excused), over limit {} ({} excused), told lost and overlapped {}, \
             stale accepted {}+{}, stale rejected {}+{}, lost updates {} ({} excused)",
            self.multi_keys,
            self.max_readers,
            self.max_permits,
            self.max_inside_seen,
            self.overlaps.len() + self.excused_overlaps,
            self.excused_overlaps,
            self.over_limit.len() + self.excused_over_limit,
            self.excused_over_limit,
            self.told_overlaps,
            self.stale_writes_accepted.len(),
            self.stale_reads_accepted.len(),
            self.stale_writes_rejected,
            self.stale_reads_rejected,
            self.lost_updates,
            self.excused_lost_updates,
        )
    }
}
