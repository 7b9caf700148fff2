//! The interaction generator's own records and checks (`tests/chaos_kinds.rs`, schedule
//! `Mix`): what the kinds checker does not see. Each worker process appends one line per
//! event to its `*.mix` file (a [`Log`](super::history::Log), `Log::append`); [`check`] judges the merged lines against the promises:
//!
//! - `M <pid> <fence> <min_hold ms>`: a writer's section with `min_hold`. No other section
//!   on its key starts before the lock was held that long, unless its caller was told the
//!   lock was lost (then the lock may have gone early).
//! - `N <pid> <fence> <ok|BAD:what>`: a nested call inside a section (the same key again, or
//!   `run_all` inside a read section, which must be refused). `BAD` is a violation.
//! - `B <pid> <start ns> <end ns> <bound ns>`: a call that took longer than `wait` plus one
//!   connect and one response timeout (and a scheduling allowance) to start its body or fail.
//!   A violation unless the worker was stopped (SIGSTOP) meanwhile.
//! - `J <pid> <tick ms> <fence> <start ns> <end ns> [<flags>]`: a finished run of the
//!   `every()` job (flags: `nesting`, `fixed_lease`).
//!   At most one finished run per tick and no two runs at once, unless a stall or a fault of
//!   the first runner's worker explains it (the documented at-least-once instant).
//! - `F <pid> <key> <sent ns> <done ns> <ok|err>`: a forced unlock of `key`; it ends a
//!   `min_hold` early, as it ends any lock. One that failed (no reply) may still land later:
//!   its request may have been held up in the network until the fault on its worker ended.
//! - `L <pid> <key>`: a lock of this worker's locker still held after its `shutdown()`
//!   returned. Always a violation.
//! - `D <pid> <start ns> <end ns>`: a `shutdown()` of the worker's locker; no section of it
//!   may begin after one returned.
//! - `O <pid> <fence> <start ns> <end ns> <kind> <flags>`: what a section combined, for the
//!   pair counts (kind, options, nesting, cancellation, local hand-off).
//! - `S <pid> <key> <kind> <start ns> <end ns> <ttl ms> <outcome> <first ns> <last ns> <fence>
//!   <wait ms>`: a call on the hot key (local hand-off chains) or on the key that changes
//!   kind. Sections held to the end and released with proof (`ok`; `first`, `last`: when the
//!   body found its lease not lost) never overlap a holder of another kind, more than n
//!   permit holders or, exclusive, each other, and their fences follow their order. A `conflict`
//!   (`KindConflict`) is justified by a call of the other kind (a semaphore against a lock or
//!   read-write lock) that held or waited at the time: from its start to its end, plus, when it
//!   did not end released (lost, cancelled, timed out), what it may have left on the server
//!   (its lease, a queue registration, a request held up in the network).
//! - `K <pid> <tick ms> <ns>`: the job's worker kills itself (SIGKILL) inside that tick, which
//!   it runs, late in the tick. The tick is run by another instance (`J`), or reported as not
//!   run (`G`: given up, run by nobody, not known whether run).
//! - `G <pid> <from ms> <to ms> <words>`: the job's WARN about the ticks `[from, to)` (given
//!   up, run by nobody, not known whether run, run late, left to the others for a failure).
//!
//! And of every section: its fence below 2^53, exact where fenced storage compares fences as
//! doubles (a Lua script, JavaScript, JSON).
//!
//! Timestamps are `CLOCK_MONOTONIC` ns ([`mono_ns`](super::history::mono_ns)), comparable
//! across the processes of one host.

use std::collections::BTreeMap;
use std::path::Path;

use super::history::{Section, Stall};
use super::kinds::Kind;

/// The lock names of the generator's `every()` job's claims (`kinds:job:tick:<slot>`).
const JOB_CLAIMS: &str = "lock:kinds:job:tick:";

/// The lock key of the read-write key (the key `min_hold` writers take).
const RW_LOCK: &str = "kinds:rw";

/// Every `*.mix` line of `dir`.
pub fn load(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "mix") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.extend(text.lines().map(str::to_owned));
        }
    }
    out
}

/// A time a worker was disturbed by the schedule: stopped, or one of its connections faulted;
/// pid [`EVERYONE`] for the lock server itself (paused, or restarted without its data).
#[derive(Debug, Clone, Copy)]
pub struct Disturbed {
    pub pid: u32,
    pub from: u64,
    pub to: u64,
    /// A restart without data: every lock was gone at once.
    pub wiped: bool,
    /// What it was, for the pair counts: `restart`, `server_stop`, `conn_fault` (delay,
    /// dropped replies, resets, partitions, reordered requests) or `stop` (SIGSTOP).
    pub what: &'static str,
}

/// The pid of a [`Disturbed`] that concerns every worker: the lock server's own fault.
pub const EVERYONE: u32 = 0;

impl Disturbed {
    fn touches(&self, pid: u32, from: u64, to: u64) -> bool {
        (self.pid == pid || self.pid == EVERYONE) && self.from <= to && self.to >= from
    }
}

/// Whether the lock server was restarted without its data at some point of `[from, to]`.
fn wiped(from: u64, to: u64, faults: &[Disturbed]) -> bool {
    (faults.iter()).any(|f| f.wiped && f.touches(EVERYONE, from, to))
}

/// What the generator's records came to.
#[derive(Debug, Default)]
pub struct Report {
    pub min_hold_sections: usize,
    pub min_hold_broken: Vec<String>,
    pub nested: usize,
    pub nested_bad: Vec<String>,
    pub over_bound: usize,
    pub over_bound_unexcused: Vec<String>,
    pub job_runs: usize,
    pub job_ticks: usize,
    pub job_reruns_excused: usize,
    pub job_broken: Vec<String>,
    pub left_after_shutdown: Vec<String>,
    /// Sections that began after their locker's `shutdown()` returned (`D`).
    pub after_shutdown: Vec<String>,
    pub inexact_fences: Vec<String>,
    /// `S` sections held to the end, and those beside a holder they exclude.
    pub plain_held: usize,
    pub plain_overlaps: Vec<String>,
    /// `KindConflict`s, and those no holder or waiter of the other kind explains.
    pub conflicts: usize,
    pub conflicts_unjustified: Vec<String>,
    /// Ticks whose runner died inside them (`K`): run late elsewhere, reported as not run,
    /// lost silently.
    pub killed_ticks: usize,
    pub killed_ticks_run: usize,
    pub killed_ticks_reported: usize,
    pub killed_ticks_lost: Vec<String>,
    /// How many sections (and `every()` runs) combined each pair of features.
    pub pairs: BTreeMap<(&'static str, &'static str), usize>,
}

impl Report {
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (what, list) in [
            ("min_hold not honoured", &self.min_hold_broken),
            ("nested call", &self.nested_bad),
            ("call past its bound", &self.over_bound_unexcused),
            ("every()", &self.job_broken),
            ("left after shutdown", &self.left_after_shutdown),
            ("section after shutdown", &self.after_shutdown),
            ("fence not exact in a double", &self.inexact_fences),
            ("hot or kind-changing key", &self.plain_overlaps),
            ("KindConflict unjustified", &self.conflicts_unjustified),
            ("tick of a dead runner", &self.killed_ticks_lost),
        ] {
            v.extend(list.iter().take(10).map(|l| format!("{what}: {l}")));
        }
        v
    }

    pub fn summary(&self) -> String {
        format!(
            "{} min_hold sections ({} broken), {} nested calls ({} bad), {} calls past their \
             bound ({} unexcused), every(): {} runs over {} ticks ({} reruns excused, {} \
             broken), {} locks left after shutdown, {} fences above 2^53; hot and kind-changing \
             keys: {} sections held ({} overlaps), {} KindConflicts ({} unjustified); {} ticks \
             whose runner died ({} run late, {} reported not run, {} lost)",
            self.min_hold_sections,
            self.min_hold_broken.len(),
            self.nested,
            self.nested_bad.len(),
            self.over_bound,
            self.over_bound_unexcused.len(),
            self.job_runs,
            self.job_ticks,
            self.job_reruns_excused,
            self.job_broken.len(),
            self.left_after_shutdown.len(),
            self.inexact_fences.len(),
            self.plain_held,
            self.plain_overlaps.len(),
            self.conflicts,
            self.conflicts_unjustified.len(),
            self.killed_ticks,
            self.killed_ticks_run,
            self.killed_ticks_reported,
            self.killed_ticks_lost.len()
        )
    }
}

fn num(s: &str) -> u64 {
    s.parse()
        .unwrap_or_else(|_| panic!("bad number {s:?} in a mix record"))
}

/// Whether `pid` was stopped or disturbed at some point of `[from, to]`.
fn disturbed(pid: u32, from: u64, to: u64, stalls: &[Stall], faults: &[Disturbed]) -> bool {
    stalls
        .iter()
        .any(|s| s.pid == pid && s.stop <= to && s.cont >= from)
        || faults.iter().any(|f| f.touches(pid, from, to))
}

/// Every forced unlock of `lines` (`F`): its key, when it was sent, and the latest moment it
/// may have changed the lock (`forced_lands_by`).
fn forced_unlocks<'a>(lines: &'a [String], faults: &[Disturbed]) -> Vec<(&'a str, u64, u64)> {
    (lines.iter())
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"F")).then(|| {
                let (pid, sent, done) = (num(f[1]) as u32, num(f[3]), num(f[4]));
                let by = forced_lands_by(pid, sent, done, f.get(5) == Some(&"err"), faults);
                (f[2], sent, by)
            })
        })
        .collect()
}

/// The latest moment a forced unlock sent at `sent` by worker `pid` may change the lock: its
/// reply's arrival (`done`), or, for one that failed without a reply, the end of the fault
/// on its worker that held the request up (a second after `done` if no fault explains it).
fn forced_lands_by(pid: u32, sent: u64, done: u64, failed: bool, faults: &[Disturbed]) -> u64 {
    if !failed {
        return done;
    }
    faults
        .iter()
        .filter(|f| f.pid == pid && f.from <= done && f.to >= sent)
        .map(|f| f.to)
        .max()
        .unwrap_or(done + 1_000_000_000)
        .max(done)
}

/// The cancelled sections (`cancelled`) that a forced unlock of a key they held, or a restart
/// of the lock server without its data, may have ended while they ran: their callers would have been told `Lost` had they waited for the
/// verdict (a holder cut off from Redis learns of a forced unlock only at its lease's end),
/// so they count as told.
pub fn cut_by_force(
    lines: &[String],
    sections: &[Section],
    faults: &[Disturbed],
    cancelled: &super::kinds::Told,
) -> super::kinds::Cut {
    let forced = forced_unlocks(lines, faults);
    let held = |s: &Section, key: &str| match key {
        RW_LOCK => on_rw(s),
        _ => matches!(s.kind, Kind::Permits(_)),
    };
    let mut cut = super::kinds::Cut::new();
    for s in sections
        .iter()
        .filter(|s| cancelled.contains(&super::kinds::multi::ident(s)))
    {
        // A permit holder counts as inside until it left the oracle's count.
        let end = s.last_effect().max(s.left);
        let by_force = (forced.iter())
            .filter(|&&(key, sent, by)| held(s, key) && sent < end && by > s.acquired)
            .map(|&(_, sent, _)| sent);
        let by_restart = (faults.iter())
            .filter(|f| f.wiped && f.touches(EVERYONE, s.acquired, end))
            .map(|f| f.from);
        if let Some(t) = by_force.chain(by_restart).min() {
            cut.insert(super::kinds::multi::ident(s), t);
        }
    }
    cut
}

/// For every section (`O` records) and `every()` run (`J`): the features it combined, its
/// own (kind, options, nesting, cancellation, local hand-off) and what happened to it while
/// it ran (its worker's `shutdown()`, a forced unlock of a key it held, a connection fault,
/// a SIGSTOP of its worker, a stop or restart of the lock server); counted per pair.
fn pairs(
    lines: &[String],
    sections: &[Section],
    stalls: &[Stall],
    faults: &[Disturbed],
) -> BTreeMap<(&'static str, &'static str), usize> {
    let fields: Vec<Vec<&str>> = (lines.iter())
        .map(|l| l.split_whitespace().collect())
        .collect();
    let of = |tag: &str| {
        (fields.iter())
            .filter(|f| f.first() == Some(&tag))
            .cloned()
            .collect::<Vec<_>>()
    };
    let (shutdowns, forced) = (of("D"), of("F"));
    let around = |pid: u32, from: u64, to: u64, out: &mut Vec<&'static str>, keys: &[&str]| {
        if (shutdowns.iter())
            .any(|d| num(d[1]) as u32 == pid && num(d[2]) <= to && num(d[3]) >= from)
        {
            out.push("shutdown");
        }
        if (forced.iter()).any(|f| keys.contains(&f[2]) && num(f[3]) <= to && num(f[4]) >= from) {
            out.push("forced_unlock");
        }
        if (stalls.iter()).any(|s| s.pid == pid && s.stop <= to && s.cont >= from) {
            out.push("stop");
        }
        for f in faults.iter().filter(|f| f.touches(pid, from, to)) {
            out.push(f.what);
        }
    };
    let mut sets: Vec<Vec<&'static str>> = Vec::new();
    for f in of("O") {
        let (pid, fence, from, to) = (num(f[1]) as u32, num(f[2]), num(f[3]), num(f[4]));
        let kind: Kind = f[5].parse().unwrap_or(Kind::Exclusive);
        let mut out = vec![match kind {
            Kind::Exclusive => "write",
            Kind::Read => "read",
            Kind::Permits(_) => "permits",
            Kind::Multi => "multi_key",
        }];
        for flag in f[6].split(',') {
            out.extend(FLAGS.iter().find(|&&k| k == flag));
        }
        let rw = (sections.iter())
            .find(|s| s.pid == pid && s.fence == fence)
            .is_some_and(on_rw);
        let keys: &[&str] = match kind {
            Kind::Permits(_) => &["kinds:sem"],
            _ if rw => &[RW_LOCK],
            _ => &[],
        };
        around(pid, from, to, &mut out, keys);
        sets.push(out);
    }
    for f in of("S") {
        let (pid, from, to) = (num(f[1]) as u32, num(f[4]), num(f[5]));
        let kind: Kind = f[3].parse().unwrap_or(Kind::Exclusive);
        let mut out = vec![match kind {
            Kind::Read => "read",
            Kind::Permits(_) => "permits",
            _ => "write",
        }];
        if f[7] == "cancelled" {
            out.push("cancellation");
        }
        if !num(f[10]).is_multiple_of(32) {
            out.push("local_handoff");
        }
        if f[2] == "kinds:shift" {
            out.push("kind_change");
        }
        around(pid, from, to, &mut out, &[]);
        sets.push(out);
    }
    for f in of("J") {
        let (pid, from, to) = (num(f[1]) as u32, num(f[4]), num(f[5]));
        let mut out = vec!["every"];
        for flag in f.get(6).map_or("", |v| v).split(',') {
            out.extend(FLAGS.iter().find(|&&k| k == flag));
        }
        around(pid, from, to, &mut out, &[]);
        sets.push(out);
    }
    let mut pairs = BTreeMap::new();
    for mut set in sets {
        set.sort_unstable();
        set.dedup();
        for (i, &a) in set.iter().enumerate() {
            for &b in &set[i..] {
                *pairs.entry((a, b)).or_default() += 1;
            }
        }
    }
    pairs
}

/// The options and circumstances an `O` record may name.
const FLAGS: [&str; 7] = [
    "min_hold",
    "max_hold",
    "fixed_lease",
    "nesting",
    "cancellation",
    "on_lost_continue",
    "local_handoff",
];

/// Whether section `s` held the read-write key (the key `min_hold` writers use).
fn on_rw(s: &Section) -> bool {
    match s.kind {
        Kind::Exclusive | Kind::Read => true,
        Kind::Multi => s.keys.iter().any(|k| k.key == super::kinds::multi::RW),
        Kind::Permits(_) => false,
    }
}

/// Judges the generator's `lines` with the sections, stalls and faults of the run; `told`:
/// the (pid, fence) of sections whose callers were told their lock was lost.
pub fn check(
    lines: &[String],
    sections: &[Section],
    stalls: &[Stall],
    faults: &[Disturbed],
    (told, cancelled): (&super::kinds::Told, &super::kinds::Told),
) -> Report {
    /// Scheduling and clock allowance between a kept lock's end and the next section's start.
    const SLACK_NS: u64 = 30_000_000;
    let mut r = Report::default();
    // Forced unlocks of the read-write key: (sent, latest landing).
    let forced: Vec<(u64, u64)> = (forced_unlocks(lines, faults).into_iter())
        .filter(|&(key, ..)| key == RW_LOCK)
        .map(|(_, sent, by)| (sent, by))
        .collect();
    for s in sections {
        let fences = std::iter::once(s.fence).chain(s.keys.iter().map(|k| k.fence));
        if let Some(f) = fences.into_iter().find(|&f| f >= 1 << 53) {
            r.inexact_fences.push(format!("pid {} fence {f}", s.pid));
        }
    }
    // After `shutdown()` returned, every call of that locker is refused: no section of it
    // begins later (a scheduling allowance for a body that began as the call returned).
    for line in lines.iter().filter(|l| l.starts_with("D ")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (pid, done) = (num(f[1]) as u32, num(f[3]));
        for s in sections
            .iter()
            .filter(|s| s.pid == pid && s.acquired > done + SLACK_NS)
        {
            r.after_shutdown.push(format!(
                "pid {pid} fence {} began {:.1} ms after its locker's shutdown() returned",
                s.fence,
                (s.acquired - done) as f64 / 1e6
            ));
        }
    }
    let mut runs: BTreeMap<u64, Vec<(u32, u64, u64, u64)>> = BTreeMap::new();
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.first().copied() {
            Some("M") => {
                r.min_hold_sections += 1;
                let (pid, fence, hold) = (num(f[1]) as u32, num(f[2]), num(f[3]) * 1_000_000);
                if told.contains(&(pid, fence)) {
                    continue;
                }
                let Some(s) = sections.iter().find(|s| s.pid == pid && s.fence == fence) else {
                    continue;
                };
                let until = s.acquired + hold.saturating_sub(SLACK_NS);
                for o in sections
                    .iter()
                    .filter(|o| on_rw(o) && o.acquired > s.acquired)
                {
                    if (o.pid, o.fence) == (pid, fence) || o.acquired >= until {
                        continue;
                    }
                    // A forced unlock or a restart without data ends a kept lock as any
                    // other, when it came before this one entered.
                    // So does a lease lost before its kept release landed (the server or the
                    // network stopped past its ttl): a caller that waited would hear `Lost`,
                    // a cancelled one cannot.
                    let ended = (forced.iter()).any(|&(sent, by)| {
                        sent <= o.acquired + SLACK_NS && by + SLACK_NS > s.acquired
                    }) || wiped(s.acquired, o.acquired + SLACK_NS, faults)
                        || (cancelled.contains(&(pid, fence))
                            && disturbed(pid, s.acquired, o.acquired, stalls, faults));
                    if !ended {
                        r.min_hold_broken.push(format!(
                            "pid {pid} fence {fence} min_hold {} ms: pid {} fence {} started \
                             {:.1} ms after it",
                            hold / 1_000_000,
                            o.pid,
                            o.fence,
                            (o.acquired - s.acquired) as f64 / 1e6
                        ));
                    }
                }
            }
            Some("N") => {
                r.nested += 1;
                if f[3] != "ok" {
                    r.nested_bad.push(line.clone());
                }
            }
            Some("B") => {
                r.over_bound += 1;
                let (pid, from, to) = (num(f[1]) as u32, num(f[2]), num(f[3]));
                if !disturbed(pid, from, to, stalls, &[]) {
                    r.over_bound_unexcused.push(format!(
                        "pid {pid}: {:.0} ms, bound {:.0} ms ({})",
                        (to - from) as f64 / 1e6,
                        num(f[4]) as f64 / 1e6,
                        f.get(5).unwrap_or(&"")
                    ));
                }
            }
            Some("J") => {
                r.job_runs += 1;
                let run = (num(f[1]) as u32, num(f[3]), num(f[4]), num(f[5]));
                runs.entry(num(f[2])).or_default().push(run);
            }
            Some("L") => r.left_after_shutdown.push(line.clone()),
            Some("F" | "O" | "D" | "S" | "K" | "G") => {}
            _ => panic!("bad mix record {line:?}"),
        }
    }
    r.pairs = pairs(lines, sections, stalls, faults);
    let plain = plain_calls(lines);
    plain_exclusion(&plain, &mut r);
    plain_conflicts(&plain, stalls, faults, &mut r);
    killed_ticks(lines, &runs, &mut r);
    r.job_ticks = runs.len();
    let mut all: Vec<(u64, u64, u32, u64, u64)> = Vec::new();
    for (tick, rs) in &runs {
        let mut rs = rs.clone();
        rs.sort_by_key(|&(_, _, start, _)| start);
        for w in rs.windows(2) {
            // The first finished, but its mark did not reach Redis: its worker was stopped or
            // cut off right then (the at-least-once instant of the README).
            let (pid, _, _, end) = w[0];
            if disturbed(pid, end, w[1].2, stalls, faults) {
                r.job_reruns_excused += 1;
            } else {
                r.job_broken.push(format!(
                    "tick {tick} finished twice: {:?} then {:?}",
                    w[0], w[1]
                ));
            }
        }
        all.extend(
            rs.iter()
                .map(|&(pid, fence, s, e)| (s, e, pid, fence, *tick)),
        );
    }
    all.sort_unstable();
    for w in all.windows(2) {
        let ((_, end, pid, fence, _), (start, _, _, fence2, _)) = (w[0], w[1]);
        // A stop of the server, a migration or a failover lose nothing: the first runner is
        // cancelled at its own deadline and the counter stays; only its worker's faults or a
        // restart without data explain these two.
        let own: Vec<Disturbed> = (faults.iter())
            .filter(|f| f.pid != EVERYONE || f.wiped)
            .copied()
            .collect();
        if end > start && !disturbed(pid, start, end, stalls, &own) {
            r.job_broken
                .push(format!("runs overlap: {:?} and {:?}", w[0], w[1]));
        }
        if fence2 <= fence && !disturbed(pid, start, end, stalls, &own) {
            r.job_broken.push(format!(
                "job fences not increasing: {:?} then {:?}",
                w[0], w[1]
            ));
        }
    }
    r
}

/// A call on the hot key or the key that changes kind (`S`).
#[derive(Debug, Clone)]
struct Plain {
    pid: u32,
    key: String,
    kind: Kind,
    start: u64,
    end: u64,
    ttl_ns: u64,
    outcome: String,
    first: u64,
    last: u64,
    fence: u64,
    wait_ns: u64,
}

fn plain_calls(lines: &[String]) -> Vec<Plain> {
    (lines.iter())
        .filter(|l| l.starts_with("S "))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Plain {
                pid: num(f[1]) as u32,
                key: f[2].to_owned(),
                kind: f[3].parse().unwrap_or_else(|_| panic!("bad kind in {l:?}")),
                start: num(f[4]),
                end: num(f[5]),
                ttl_ns: num(f[6]) * 1_000_000,
                outcome: f[7].to_owned(),
                first: num(f[8]),
                last: num(f[9]),
                fence: num(f[10]),
                wait_ns: num(f[11]) * 1_000_000,
            }
        })
        .collect()
}

/// Sections held to the end and released with proof held their lease throughout, from
/// `first` to `last` at least: no two of kinds that exclude each other overlap there, no
/// more than n permit holders at once, and exclusive ones carry fences in their order.
fn plain_exclusion(plain: &[Plain], r: &mut Report) {
    let mut held: Vec<&Plain> = plain.iter().filter(|p| p.outcome == "ok").collect();
    held.sort_by_key(|p| (p.key.clone(), p.first));
    r.plain_held = held.len();
    for (i, a) in held.iter().enumerate() {
        let beside: Vec<&&Plain> = (held[i + 1..].iter())
            .take_while(|b| b.key == a.key && b.first < a.last)
            .collect();
        for (j, b) in beside.iter().enumerate() {
            let shared = match (a.kind, b.kind) {
                // Holders inside when `b` entered: `a`, `b` and those of `beside` still in.
                (Kind::Permits(n), Kind::Permits(m)) if n == m => {
                    let still = beside[..j].iter().filter(|o| o.last > b.first).count();
                    still as u32 + 2 <= n
                }
                (Kind::Read, Kind::Read) => true,
                _ => false,
            };
            if !shared {
                r.plain_overlaps.push(format!(
                    "{}: {} of pid {} (fence {}) and {} of pid {} (fence {}) held at once \
                     for {:.1} ms",
                    a.key,
                    a.kind,
                    a.pid,
                    a.fence,
                    b.kind,
                    b.pid,
                    b.fence,
                    (a.last.min(b.last) - b.first) as f64 / 1e6
                ));
            }
        }
    }
    let mut exclusive: Vec<&&Plain> = (held.iter())
        .filter(|p| p.kind == Kind::Exclusive)
        .collect();
    exclusive.sort_by_key(|p| (p.key.clone(), p.first));
    for w in exclusive.windows(2) {
        if w[0].key == w[1].key && w[1].fence <= w[0].fence {
            r.plain_overlaps.push(format!(
                "{}: fence {} (pid {}) after fence {} (pid {})",
                w[0].key, w[1].fence, w[1].pid, w[0].fence, w[0].pid
            ));
        }
    }
}

/// Every `KindConflict` needs a call of the other kind that held or waited at the time. What
/// a call may leave behind on the server after it returned (`None`: it never held nor waited:
/// refused, found busy at once with no queue place, refused before sending): nothing once
/// released; a lease told lost, until its ttl; one that timed out, was cancelled or failed, its
/// clean-up (a release, leaving the queue) a moment later, but with its worker or the server
/// disturbed its lease, its queue registration (2 s, if it waited) and a request held up in the
/// network (the schedule holds them up to 0.9 s) that lands later.
fn plain_conflicts(plain: &[Plain], stalls: &[Stall], faults: &[Disturbed], r: &mut Report) {
    const SLACK_NS: u64 = 50_000_000;
    const SECOND: u64 = 1_000_000_000;
    let left_behind = |p: &Plain| match p.outcome.as_str() {
        "conflict" | "busy" => None,
        // Refused at once after its locker's `shutdown()`: it sent nothing.
        "shutdown" if p.end - p.start < 5_000_000 => None,
        "ok" => Some(SLACK_NS),
        // Never released: the lease runs out within its ttl of the grant (before `end`).
        "lost" | "leaked" => Some(p.ttl_ns + SLACK_NS),
        _ if !disturbed(p.pid, p.start, p.end + SECOND, stalls, faults) => {
            // `wait = 0`: found busy at once, no queue place.
            (p.outcome != "timeout" || p.wait_ns > 0).then_some(4 * SLACK_NS)
        }
        _ if p.wait_ns == 0 => Some(p.ttl_ns + SECOND),
        _ => Some(p.ttl_ns.max(2 * SECOND) + SECOND),
    };
    let permits = |k: Kind| matches!(k, Kind::Permits(_));
    for x in plain.iter().filter(|p| p.outcome == "conflict") {
        r.conflicts += 1;
        let justified = plain.iter().any(|c| {
            c.key == x.key
                && permits(c.kind) != permits(x.kind)
                && c.start <= x.end
                && left_behind(c).is_some_and(|left| c.end + left >= x.start)
        });
        if !justified {
            r.conflicts_unjustified.push(format!(
                "{}: {} of pid {} refused, no holder or waiter of another kind then ({:.1} ms)",
                x.key,
                x.kind,
                x.pid,
                (x.end - x.start) as f64 / 1e6
            ));
        }
    }
}

/// The job's tick in which its runner killed itself (`K`) is run by another instance (`J`)
/// once the dead runner's lease ran out, or reported (`G`) as not run: given up, run by
/// nobody, not known whether run (all naming the tick). No excuse: the other instances run
/// until the end.
fn killed_ticks(lines: &[String], runs: &BTreeMap<u64, Vec<(u32, u64, u64, u64)>>, r: &mut Report) {
    // A WARN that says the tick was not run, given up, or not known to have run; not one that
    // announces a late run's start or leaves the tick to the others.
    const NOT_RUN: [&str; 6] = [
        "tick_given_up",
        "tick_run_by_no",
        "tick_not_run_here",
        "ticks_skipped_here",
        "tick_still_held",
        "tick_cut_short",
    ];
    let fields: Vec<Vec<&str>> = (lines.iter())
        .map(|l| l.split_whitespace().collect())
        .collect();
    // Not by the dead runner itself: what it logged before it took the tick.
    let reported = |tick: u64, dead: u32| {
        (fields.iter()).any(|f| {
            f[0] == "G"
                && num(f[1]) as u32 != dead
                && num(f[2]) <= tick
                && tick < num(f[3])
                && NOT_RUN.iter().any(|w| f[4].starts_with(w))
        })
    };
    for k in fields.iter().filter(|f| f[0] == "K") {
        r.killed_ticks += 1;
        let (pid, tick) = (num(k[1]) as u32, num(k[2]));
        let run_elsewhere = runs
            .get(&tick)
            .is_some_and(|rs| rs.iter().any(|run| run.0 != pid));
        if run_elsewhere {
            r.killed_ticks_run += 1;
        } else if reported(tick, pid) {
            r.killed_ticks_reported += 1;
        } else {
            r.killed_ticks_lost.push(format!(
                "tick {tick}: its runner (pid {pid}) died inside it; no instance ran it late \
                 or reported it not run"
            ));
        }
    }
}

/// What the lock server holds once every worker has exited: keys by class, and what should
/// not be there. Bounded state: every key expires (none without a TTL), no lock or share is
/// held by anyone (a lock kept until its `min_hold`, held by a `k…` token, is allowed), and
/// per lock only its fixed keys plus release proofs (which expire) exist.
#[derive(Debug, Default)]
pub struct ServerState {
    pub keys: usize,
    /// Keys by class: `lock`, `fence`, `q`, `w`, `owner`, `s`, `si`, `done`, other.
    pub by_class: BTreeMap<String, usize>,
    /// Distinct lock names (hash tags).
    pub locks: usize,
    /// Claim locks of the generator's `every()` job (one per slot of its tick at most).
    pub job_claims: usize,
    pub violations: Vec<String>,
}

impl ServerState {
    /// Reads every key of `conn`'s database (a test server: `KEYS` is fine), with its TTL.
    pub fn read(conn: &mut redis::Connection) -> ServerState {
        let mut st = ServerState::default();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
        let mut tags = std::collections::BTreeSet::new();
        // This host's clock, the server's too (it runs here); not `TIME`, which a run may refuse.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for key in &keys {
            // A lock's own key is its hash tag without the braces; the others are `{tag}:…`.
            let class = match key.find('}').filter(|_| key.starts_with('{')) {
                None => {
                    tags.insert(format!("{{{key}}}"));
                    "lock"
                }
                Some(close) => {
                    tags.insert(key[..=close].to_owned());
                    key[close + 1..].trim_start_matches(':')
                }
            };
            *st.by_class.entry(class.into()).or_default() += 1;
            let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).expect("PTTL");
            if ttl == -1 {
                st.violations.push(format!("{key:?} never expires"));
            }
            match class {
                "lock" => {
                    let v: Option<String> = redis::cmd("GET").arg(key).query(conn).ok();
                    if let Some(v) = v.filter(|v| !v.starts_with('k')) {
                        st.violations
                            .push(format!("{key:?} held ({v}) after every worker exited"));
                    }
                }
                "s" => {
                    let live: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                        .arg(key)
                        .arg(now_ms + 1)
                        .arg("+inf")
                        .query(conn)
                        .expect("ZRANGEBYSCORE");
                    if !live.is_empty() {
                        st.violations.push(format!(
                            "{key:?}: {} shares held after every worker exited: {live:?}",
                            live.len()
                        ));
                    }
                }
                // `job`: a job's latest run (`lockctl jobs`), a note with a TTL.
                "state" | "q" | "w" | "owner" | "si" | "job" => {}
                _ => st
                    .violations
                    .push(format!("{key:?}: a key of no known kind")),
            }
        }
        st.keys = keys.len();
        st.locks = tags.len();
        // State per lock, not per use: a lock has at most its 7 fixed keys (no key per release);
        // the job at most one claim per slot of its tick (64 ticks plus 10 minutes' worth,
        // plus 2).
        let mut per_tag: BTreeMap<&str, usize> = BTreeMap::new();
        for key in &keys {
            let tag = match key.find('}').filter(|_| key.starts_with('{')) {
                Some(close) => &key[1..close],
                None => key.as_str(),
            };
            *per_tag.entry(tag).or_default() += 1;
        }
        for (tag, n) in per_tag.iter().filter(|&(_, &n)| n > 7) {
            st.violations
                .push(format!("{tag:?}: {n} keys, more than a lock's 7"));
        }
        let claims = (per_tag.keys())
            .filter(|t| t.starts_with(JOB_CLAIMS))
            .count();
        let slots = 64 + 600_000 / 250 + 2;
        if claims > slots {
            st.violations
                .push(format!("{claims} claim locks of the job, {slots} slots"));
        }
        st.job_claims = claims;
        st
    }

    /// Adds another server's state (a Cluster's masters, one by one).
    pub fn merge(&mut self, other: ServerState) {
        self.keys += other.keys;
        self.locks += other.locks;
        self.job_claims += other.job_claims;
        for (class, n) in other.by_class {
            *self.by_class.entry(class).or_default() += n;
        }
        self.violations.extend(other.violations);
    }

    pub fn summary(&self) -> String {
        format!(
            "{} keys of {} locks ({} job claims) after the last worker exited {:?}",
            self.keys, self.locks, self.job_claims, self.by_class
        )
    }
}
