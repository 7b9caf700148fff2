//! Lock kinds in the history checker: writers (exclusive), readers and permit holders, each
//! section recorded with its kind, checked by [`check`] against a kinds oracle.
//!
//! One history holds one read-write key (exclusive and read sections) and one semaphore key
//! (permit sections): a key is either a lock or a semaphore, so the kind says which key.
//!
//! - A *writer* does what [`super::history::section`] does, its claim also raising the highest
//!   *writer* fence, so the oracle counts lost updates as before.
//! - A *reader* does a fenced read of the counter twice, around its `await`: a read whose fence
//!   is below the highest writer fence the oracle accepted is rejected (a stale reader
//!   detected). Its fence also raises the highest fence, so a writer below it is stale too.
//!   The two reads must agree: a writer that wrote in between was inside with the reader.
//! - A *permit holder* `INCR`s the key's count inside when it starts (recording what it saw,
//!   which must not exceed n) and `DECR`s it when it stops, however it stops.
//!
//! The same excuse as for exclusive sections: a process frozen inside a synchronous step
//! overlaps whatever the lock does. A permit holder frozen past its lease also stays in the
//! oracle's count until it runs again, so a count it inflates is excused, and only then.

use std::time::Duration;
use std::{fmt, str::FromStr};

use super::history::{Section, Stall, stopped_during};

/// What a section holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    /// The exclusive lock, the write side of the read-write lock.
    #[default]
    Exclusive,
    Read,
    Permits(u32),
}

impl Kind {
    pub fn options(self) -> lockrt::LockOptions {
        match self {
            Kind::Exclusive => lockrt::LockOptions::new(),
            Kind::Read => lockrt::LockOptions::new().read(),
            Kind::Permits(n) => lockrt::LockOptions::new().permits(n),
        }
    }
}

/// As logged: `x`, `r`, `p<n>`.
impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Exclusive => f.write_str("x"),
            Kind::Read => f.write_str("r"),
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
            _ => s
                .strip_prefix('p')
                .and_then(|n| n.parse().ok())
                .map(Kind::Permits)
                .ok_or(()),
        }
    }
}

/// Fences are decimal strings compared by length then bytes (no rounding by Lua's doubles).
const ABOVE: &str = "local function above(f, m) return #f > #m or (#f == #m and f > m) end\n";

/// Writers: accepted only above every fence seen (readers' too); raises the writer fence.
const WRITE: &str = r"
if not above(ARGV[1], redis.call('GET', KEYS[1]) or '0') then
  redis.call('INCR', KEYS[4])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[1])
redis.call('INCR', KEYS[3])
return 1
";

/// Readers: rejected (-1) below the highest writer fence, else the counter.
const READ: &str = r"
if not above(ARGV[1], redis.call('GET', KEYS[2]) or '0') then
  redis.call('INCR', KEYS[4])
  return -1
end
if above(ARGV[1], redis.call('GET', KEYS[1]) or '0') then
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('INCR', KEYS[3])
return tonumber(redis.call('GET', KEYS[5]) or '0')
";

/// Permit holders: one more inside; the highest count kept.
const ENTER: &str = r"
local v = redis.call('INCR', KEYS[1])
if v > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], v) end
return v
";

/// The kinds oracle: a redis-server the locks never touch, keys under one namespace per run.
pub struct Oracle {
    conn: redis::Connection,
    ns: String,
    write: redis::Script,
    read: redis::Script,
    enter: redis::Script,
}

/// What the oracle holds at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct State {
    pub counter: i64,
    pub writes_accepted: i64,
    pub writes_rejected: i64,
    pub reads_accepted: i64,
    pub reads_rejected: i64,
    pub inside: i64,
    pub inside_max: i64,
    pub permits_done: i64,
}

const STATE_KEYS: [&str; 8] = [
    "counter",
    "w_ok",
    "w_no",
    "r_ok",
    "r_no",
    "inside",
    "inside_max",
    "done",
];

impl Oracle {
    pub fn connect(url: &str, ns: &str) -> Oracle {
        // No socket timeouts, as history::Oracle: SIGSTOP/SIGCONT would fail a read.
        let conn = redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("oracle connection");
        Oracle {
            conn,
            ns: ns.to_owned(),
            write: redis::Script::new(&format!("{ABOVE}{WRITE}")),
            read: redis::Script::new(&format!("{ABOVE}{READ}")),
            enter: redis::Script::new(ENTER),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("oracle:{}:{k}", self.ns)
    }

    /// A writer's fenced claim: `true` if accepted.
    pub fn write_claim(&mut self, fence: u64) -> bool {
        let keys = ["max", "wmax", "w_ok", "w_no"].map(|k| self.key(k));
        let mut call = self.write.key(&keys);
        let n: i64 = call
            .arg(fence.to_string())
            .invoke(&mut self.conn)
            .expect("oracle write");
        n == 1
    }

    /// A reader's fenced read: the counter, `None` if the fence is stale.
    pub fn read(&mut self, fence: u64) -> Option<i64> {
        let keys = ["max", "wmax", "r_ok", "r_no", "counter"].map(|k| self.key(k));
        let mut call = self.read.key(&keys);
        let v: i64 = call
            .arg(fence.to_string())
            .invoke(&mut self.conn)
            .expect("oracle read");
        (v >= 0).then_some(v)
    }

    pub fn cmd(&mut self, cmd: &str, key: &str) -> i64 {
        let k = self.key(key);
        let v: Option<i64> = redis::cmd(cmd).arg(k).query(&mut self.conn).expect(cmd);
        v.unwrap_or(0)
    }

    pub fn get(&mut self) -> i64 {
        self.cmd("GET", "counter")
    }

    pub fn set(&mut self, v: i64) {
        let k = self.key("counter");
        let () = redis::cmd("SET")
            .arg(k)
            .arg(v)
            .query(&mut self.conn)
            .expect("SET");
    }

    /// A permit holder starts: how many are inside with it.
    pub fn enter(&mut self) -> i64 {
        let keys = ["inside", "inside_max"].map(|k| self.key(k));
        self.enter
            .key(&keys)
            .invoke(&mut self.conn)
            .expect("oracle enter")
    }

    pub fn leave(&mut self) {
        self.cmd("DECR", "inside");
    }

    pub fn state(&mut self) -> State {
        let keys = STATE_KEYS.map(|k| self.key(k));
        let v: Vec<Option<i64>> = redis::cmd("MGET")
            .arg(&keys)
            .query(&mut self.conn)
            .expect("MGET");
        let n = |i: usize| v[i].unwrap_or(0);
        State {
            counter: n(0),
            writes_accepted: n(1),
            writes_rejected: n(2),
            reads_accepted: n(3),
            reads_rejected: n(4),
            inside: n(5),
            inside_max: n(6),
            permits_done: n(7),
        }
    }
}

// ---- the checker ----------------------------------------------------------------------------

/// What [`check`] found. Lists hold violations, one line each.
#[derive(Debug, Default)]
pub struct Report {
    /// Sections per kind: writers, readers, permit holders; and how many completed.
    pub sections: [usize; 3],
    pub completed: [usize; 3],
    pub max_readers: usize,
    pub max_permits: usize,
    pub max_inside_seen: i64,
    pub overlaps: Vec<String>,
    pub excused_overlaps: usize,
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
}

fn of(s: &[Section], k: impl Fn(Kind) -> bool) -> Vec<&Section> {
    let mut v: Vec<&Section> = s.iter().filter(|s| k(s.kind) && s.acquired != 0).collect();
    v.sort_by_key(|s| (s.acquired, s.fence));
    v
}

/// Checks a history of the kinds (see the module docs) against the oracle's final state.
pub fn check(sections: &[Section], stalls: &[Stall], state: State) -> Report {
    let mut r = Report {
        state,
        ..Report::default()
    };
    let kinds: [fn(Kind) -> bool; 3] = [
        |k| k == Kind::Exclusive,
        |k| k == Kind::Read,
        |k| matches!(k, Kind::Permits(_)),
    ];
    for (i, k) in kinds.iter().enumerate() {
        r.sections[i] = sections.iter().filter(|s| k(s.kind)).count();
        r.completed[i] = sections.iter().filter(|s| k(s.kind) && s.completed).count();
    }
    let rw = of(sections, |k| !matches!(k, Kind::Permits(_)));
    rw_overlaps(&mut r, &rw, stalls);
    rw_fences(&mut r, &rw);
    readers(&mut r, &rw, stalls);
    lost_updates(&mut r, &rw, stalls);
    let permits = of(sections, |k| matches!(k, Kind::Permits(_)));
    permit_sweep(&mut r, &permits, stalls);
    permit_counts(&mut r, &permits, stalls);
    r
}

/// Writers overlap nobody, readers only readers: each section against those still inside
/// when it starts.
fn rw_overlaps(r: &mut Report, rw: &[&Section], stalls: &[Stall]) {
    let mut active: Vec<&Section> = Vec::new();
    for &s in rw {
        active.retain(|a| a.last_effect() > s.acquired);
        for &a in &active {
            if a.kind == Kind::Read && s.kind == Kind::Read {
                continue;
            }
            if stopped_during(stalls, a.pid, a.last_step()) {
                r.excused_overlaps += 1;
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
/// earlier fence, a reader's above every earlier writer's. Accepted claims and reads below a
/// fence started earlier are stale.
fn rw_fences(r: &mut Report, rw: &[&Section]) {
    let (mut any, mut writers) = (None::<&Section>, None::<&Section>);
    let mut highest_started = 0u64;
    for &s in rw {
        let bound = if s.kind == Kind::Read { writers } else { any };
        if s.claim.is_some()
            && let Some(b) = bound.filter(|b| b.fence >= s.fence)
        {
            r.fence_order.push(format!("{s} started after {b}"));
        }
        let started = if s.kind == Kind::Read {
            writers.map_or(0, |w| w.fence)
        } else {
            highest_started
        };
        if s.claim == Some(true) && s.fence < started {
            let msg = format!("{s} accepted after fence {started} had started");
            match s.kind {
                Kind::Read => r.stale_reads_accepted.push(msg),
                _ => r.stale_writes_accepted.push(msg),
            }
        }
        highest_started = highest_started.max(s.fence);
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

fn highest<'a>(m: Option<&'a Section>, s: &'a Section) -> Option<&'a Section> {
    m.filter(|m| m.fence >= s.fence).or(Some(s))
}

fn count(v: &[&Section], f: impl Fn(&Section) -> bool) -> usize {
    v.iter().filter(|s| f(s)).count()
}

/// Readers' second reads: not stale (no writer with a higher fence started before it), and
/// equal to the first, unless a writer frozen inside its write explains the change.
fn readers(r: &mut Report, rw: &[&Section], stalls: &[Stall]) {
    let writers: Vec<&Section> = rw
        .iter()
        .copied()
        .filter(|s| s.kind == Kind::Exclusive)
        .collect();
    for &s in rw.iter().filter(|s| s.kind == Kind::Read && s.completed) {
        if let Some(w) = writers
            .iter()
            .find(|w| w.acquired < s.wake && w.fence > s.fence)
        {
            r.stale_reads_accepted
                .push(format!("{s}: second read accepted after {w} had started"));
        }
        if s.extra != s.read_value {
            let excused = writers.iter().any(|w| {
                w.acquired < s.end
                    && w.last_effect() > s.acquired
                    && stopped_during(stalls, w.pid, w.last_step())
            });
            if !excused {
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
fn lost_updates(r: &mut Report, rw: &[&Section], stalls: &[Stall]) {
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
    for group in by_value.values().filter(|g| g.len() > 1) {
        let lost = group.len() - 1;
        let stalled = count(group, |s| stopped_during(stalls, s.pid, s.last_step()));
        r.lost_updates += lost;
        r.excused_lost_updates += lost.min(stalled);
    }
    r.counter_expected = (r.completed[0] - r.lost_updates) as i64;
}

/// At no instant more than n permit holders inside (by their intervals); permit fences
/// distinct.
fn permit_sweep(r: &mut Report, permits: &[&Section], stalls: &[Stall]) {
    let mut active: Vec<&Section> = Vec::new();
    for &s in permits.iter().filter(|s| s.claim.is_some()) {
        let Kind::Permits(n) = s.kind else { continue };
        active.retain(|a| a.last_effect() > s.acquired);
        let inside = active.len() + 1;
        r.max_permits = r.max_permits.max(inside);
        if inside > n as usize {
            let frozen = count(&active, |a| stopped_during(stalls, a.pid, a.last_step()));
            if inside - frozen <= n as usize {
                r.excused_over_limit += 1;
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
fn permit_counts(r: &mut Report, permits: &[&Section], stalls: &[Stall]) {
    for &s in permits {
        let (Kind::Permits(n), Some(v)) = (s.kind, s.extra) else {
            continue;
        };
        r.max_inside_seen = r.max_inside_seen.max(v);
        if v <= i64::from(n) {
            continue;
        }
        let frozen = count(permits, |o| {
            o != s
                && o.claimed != 0
                && o.acquired < s.claimed
                && (o.left == 0 || o.left > s.acquired)
                && stalls
                    .iter()
                    .any(|t| t.pid == o.pid && t.stop <= s.claimed && t.cont >= o.acquired)
        });
        if v - frozen as i64 > i64::from(n) {
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
        let [w, rd, p] = self.sections;
        let [cw, crd, cp] = self.completed;
        format!(
            "writers {w} ({cw} completed), readers {rd} ({crd}), permits {p} ({cp}); max readers \
             {}, max permits {} (oracle saw {}); overlaps {} ({} excused), over limit {} ({} \
             excused), stale accepted {}+{}, stale rejected {}+{}, lost updates {} ({} excused)",
            self.max_readers,
            self.max_permits,
            self.max_inside_seen,
            self.overlaps.len() + self.excused_overlaps,
            self.excused_overlaps,
            self.over_limit.len() + self.excused_over_limit,
            self.excused_over_limit,
            self.stale_writes_accepted.len(),
            self.stale_reads_accepted.len(),
            self.stale_writes_rejected,
            self.stale_reads_rejected,
            self.lost_updates,
            self.excused_lost_updates,
        )
    }
}
