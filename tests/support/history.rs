//! The history checker with a fenced oracle, and the plumbing to run critical sections in
//! several OS processes.
//!
//! A *section* is the body a lock protects. Every section, whichever process runs it, does the
//! same three things against the *oracle*, a second redis-server that the lock never touches:
//!
//! 1. a fenced claim: a Lua check-and-set that accepts its fence only if it is above every
//!    fence the oracle has seen (a stale holder is rejected here and does nothing else);
//! 2. an unfenced read-modify-write of a counter, `GET`, then (after an `await` where the body
//!    can be cancelled or the lease lost) `SET` to the value read plus one, so two sections
//!    inside at once lose an update;
//! 3. a record of what it did, with `CLOCK_MONOTONIC` timestamps (one clock for every process
//!    on the machine) taken around each step, appended to its process's log file.
//!
//! [`check`] then asserts, over all processes' records: no two sections' intervals overlap;
//! fences strictly increase in the order the sections started; the oracle's counter equals the
//! number of completed sections (no lost update); and no stale claim was accepted.
//!
//! A process frozen (SIGSTOP) *inside* a synchronous step, after its last chance to notice a
//! lost lease and before its write lands, overlaps the next holder whatever the lock does;
//! that is what fencing is for. Such anomalies are *excused* when the test's own record of
//! stalls shows the process stopped during exactly that step, and reported separately. A
//! process stopped at an `await` and resumed past its lease must not go on: that is never
//! excused, because the step after the `await` starts after the stall ended.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use super::kinds::Kind;
pub use super::kinds::multi::KeyPart;

/// Seeds to run: the one in `LOCKRT_CHAOS_SEED` if set (to replay a failure), else `default`.
pub fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("LOCKRT_CHAOS_SEED") {
        Ok(s) => vec![s.trim().parse().expect("LOCKRT_CHAOS_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: comparable between processes on one machine.
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// Check-and-set of the highest fence seen. Fences are decimal strings compared by length
/// then bytes, so no fence is ever rounded by Lua's doubles.
const CLAIM: &str = r"
local max = redis.call('GET', KEYS[1]) or '0'
local f = ARGV[1]
if #f < #max or (#f == #max and f <= max) then
  redis.call('INCR', KEYS[3])
  return 0
end
redis.call('SET', KEYS[1], f)
redis.call('INCR', KEYS[2])
return 1
";

/// The fenced oracle: its own redis-server, keys under one namespace per run.
pub struct Oracle {
    conn: redis::Connection,
    ns: String,
    claim: redis::Script,
}

/// What the oracle holds at the end of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OracleState {
    pub counter: i64,
    pub max_fence: u64,
    pub accepted: u64,
    pub rejected: u64,
}

impl Oracle {
    pub fn connect(url: &str, ns: &str) -> Oracle {
        let conn = redis::Client::open(url)
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .expect("oracle connection");
        // No socket timeouts: with one, a read that a SIGSTOP/SIGCONT of this worker
        // interrupts fails with EINTR instead of resuming (signal(7)); the parent bounds a
        // worker's life anyway.
        Oracle {
            conn,
            ns: ns.to_owned(),
            claim: redis::Script::new(CLAIM),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("oracle:{}:{k}", self.ns)
    }

    /// The fenced write: `true` if accepted (`fence` above every fence seen so far).
    pub fn claim(&mut self, fence: u64) -> bool {
        let n: i64 = self
            .claim
            .key(self.key("max"))
            .key(self.key("accepted"))
            .key(self.key("rejected"))
            .arg(fence.to_string())
            .invoke(&mut self.conn)
            .expect("oracle claim");
        n == 1
    }

    pub fn get(&mut self) -> i64 {
        let v: Option<i64> = redis::cmd("GET")
            .arg(self.key("counter"))
            .query(&mut self.conn)
            .expect("oracle GET");
        v.unwrap_or(0)
    }

    pub fn set(&mut self, v: i64) {
        let () = redis::cmd("SET")
            .arg(self.key("counter"))
            .arg(v)
            .query(&mut self.conn)
            .expect("oracle SET");
    }

    pub fn state(&mut self) -> OracleState {
        let vals: Vec<Option<String>> = redis::cmd("MGET")
            .arg(self.key("counter"))
            .arg(self.key("max"))
            .arg(self.key("accepted"))
            .arg(self.key("rejected"))
            .query(&mut self.conn)
            .expect("oracle MGET");
        let n = |i: usize| vals[i].as_deref().map_or(0, |s| s.parse::<u64>().unwrap());
        OracleState {
            counter: n(0) as i64,
            max_fence: n(1),
            accepted: n(2),
            rejected: n(3),
        }
    }
}

/// One section's record. Timestamps are [`mono_ns`]; 0 means "did not get there".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Section {
    pub pid: u32,
    pub fence: u64,
    /// First instruction of the body.
    pub acquired: u64,
    /// After the claim's reply.
    pub claimed: u64,
    /// After the counter's `GET` reply.
    pub read: u64,
    /// First instruction after the body's `await`.
    pub wake: u64,
    /// After the counter's `SET` reply (completed sections only).
    pub end: u64,
    pub claim: Option<bool>,
    pub read_value: Option<i64>,
    pub completed: bool,
    /// What the section held; [`super::kinds`] reads the fields above per kind.
    pub kind: Kind,
    /// Kinds only: a reader's counter at its second read, a permit holder's count inside.
    pub extra: Option<i64>,
    /// Permit holders: after leaving the oracle's count inside (0: never counted).
    pub left: u64,
    /// Multi-key sections: each key with its fence and counter read, sorted by key.
    pub keys: Vec<KeyPart>,
    /// The section was told `Lost` (its release or `run` said so, after the record was
    /// written: a `V` record, see [`told_lost`]). Such a section may have overlapped a holder.
    pub told_lost: bool,
}

impl Section {
    /// The time of the section's last effect on the oracle.
    pub fn last_effect(&self) -> u64 {
        [self.end, self.read, self.claimed, self.acquired]
            .into_iter()
            .find(|&t| t != 0)
            .unwrap_or(0)
    }

    /// The synchronous step that produced the last effect: `[start, last_effect]`.
    pub(super) fn last_step(&self) -> (u64, u64) {
        if self.end != 0 {
            (self.wake, self.end)
        } else {
            (self.acquired, self.last_effect())
        }
    }

    fn to_line(&self) -> String {
        let opt = |o: Option<i64>| o.map_or("-".to_owned(), |v| v.to_string());
        format!(
            "S {} {} {} {} {} {} {} {} {} {} {} {} {}{}\n",
            self.pid,
            self.fence,
            self.acquired,
            self.claimed,
            self.read,
            self.wake,
            self.end,
            opt(self.claim.map(i64::from)),
            opt(self.read_value),
            u8::from(self.completed),
            self.kind,
            opt(self.extra),
            self.left,
            // A 15th field only for multi-key sections: other records stay as they were.
            KeyPart::field(&self.keys)
        )
    }

    /// A record as `Display` writes it; `None` for a partial or foreign line.
    pub fn from_line(line: &str) -> Option<Section> {
        let f: Vec<&str> = line.split_whitespace().collect();
        // 11 fields: a record from before the kinds (an exclusive section).
        if !(f.len() == 11 || f.len() == 14 || f.len() == 15) || f[0] != "S" {
            return None;
        }
        let num = |i: usize| f[i].parse::<u64>().ok();
        let opt = |i: usize| {
            if f[i] == "-" {
                Some(None)
            } else {
                f[i].parse::<i64>().ok().map(Some)
            }
        };
        Some(Section {
            pid: f[1].parse().ok()?,
            fence: num(2)?,
            acquired: num(3)?,
            claimed: num(4)?,
            read: num(5)?,
            wake: num(6)?,
            end: num(7)?,
            claim: opt(8)?.map(|v| v == 1),
            read_value: opt(9)?,
            completed: f[10] == "1",
            kind: f
                .get(11)
                .map_or(Some(Kind::Exclusive), |k| k.parse().ok())?,
            extra: f.get(12).map_or(Some(None), |_| opt(12))?,
            left: f.get(13).map_or(Some(0), |_| num(13))?,
            keys: f.get(14).map_or(Some(Vec::new()), |k| KeyPart::parse(k))?,
            told_lost: false,
        })
    }
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pid {}{} fence {} [{:.3} ms .. {:.3} ms]{}",
            self.pid,
            match self.kind {
                Kind::Exclusive => String::new(),
                k => format!(" {k}"),
            },
            self.fence,
            self.acquired as f64 / 1e6,
            self.last_effect() as f64 / 1e6,
            if self.completed { "" } else { " (cut short)" }
        )?;
        if self.told_lost {
            write!(f, " (told Lost)")?;
        }
        if !self.keys.is_empty() {
            write!(f, " of keys{}", KeyPart::field(&self.keys))?;
        }
        Ok(())
    }
}

/// Where one process appends its sections: one line per record, written when the section
/// ends (including when its future is dropped).
#[derive(Clone)]
pub struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    pub fn create(path: &Path) -> Log {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("section log");
        Log(Arc::new(Mutex::new(f)))
    }

    fn write(&self, s: &Section) {
        self.raw(&s.to_line());
    }

    /// Appends `line` and a newline as one write: the other records of a run, such as the
    /// interaction generator's (`support::mix`).
    pub fn append(&self, line: &str) {
        self.raw(&format!("{line}\n"));
    }

    fn raw(&self, text: &str) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(text.as_bytes()).expect("write record");
    }
}

/// Records that the section of this process with `fence` was told `Lost` after its record was
/// written (its release or `run` returned `Lost`).
pub fn told_lost(log: &Log, fence: u64) {
    log.append(&format!("V {} {fence}", std::process::id()));
}

/// Records a section when dropped, however the body ended.
pub struct Recorder<'a> {
    pub log: &'a Log,
    pub s: Section,
}

impl Drop for Recorder<'_> {
    fn drop(&mut self) {
        self.log.write(&self.s);
    }
}

/// How a section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Completed,
    /// The oracle rejected the fence: a newer holder had already claimed.
    Stale,
    /// The guard said the lease was lost before a write.
    Lost,
}

/// Runs one section with `fence`, awaiting `work` between the read and the write. With a
/// guard (the `acquire` style), the body does what a careful user does: checks `is_lost()`
/// before each write and stops when `lost()` fires; without one (inside `run`), the runtime
/// is trusted to cut the body short. Dropping the future mid-way records the section as cut
/// short.
pub async fn section(
    oracle: &mut Oracle,
    log: &Log,
    fence: u64,
    work: Duration,
    guard: Option<&lockrt::LockGuard>,
) -> Outcome {
    let mut r = Recorder {
        log,
        s: Section {
            pid: std::process::id(),
            fence,
            acquired: mono_ns(),
            ..Section::default()
        },
    };
    if guard.is_some_and(|g| g.is_lost()) {
        return Outcome::Lost;
    }
    let ok = oracle.claim(fence);
    r.s.claimed = mono_ns();
    r.s.claim = Some(ok);
    if !ok {
        return Outcome::Stale;
    }
    let v = oracle.get();
    r.s.read = mono_ns();
    r.s.read_value = Some(v);
    match guard {
        Some(g) => {
            tokio::select! {
                () = tokio::time::sleep(work) => {}
                () = g.lost() => return Outcome::Lost,
            }
        }
        None => tokio::time::sleep(work).await,
    }
    r.s.wake = mono_ns();
    if guard.is_some_and(|g| g.is_lost()) {
        return Outcome::Lost;
    }
    oracle.set(v + 1);
    r.s.end = mono_ns();
    r.s.completed = true;
    Outcome::Completed
}

/// Reads every `*.log` section file in `dir`.
pub fn load(dir: &Path) -> Vec<Section> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("log dir") {
        let path = entry.expect("log entry").path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).expect("read log");
            let mut told = std::collections::HashSet::new();
            let first = out.len();
            for line in text.lines() {
                if let Some(v) = line.strip_prefix("V ") {
                    told.insert(v.to_owned());
                    continue;
                }
                out.push(
                    Section::from_line(line)
                        .unwrap_or_else(|| panic!("bad record {line:?} in {}", path.display())),
                );
            }
            for s in &mut out[first..] {
                s.told_lost = told.contains(&format!("{} {}", s.pid, s.fence));
            }
        }
    }
    out
}

/// A process the test froze: SIGSTOP sent after `stop`, SIGCONT sent after `cont`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub pid: u32,
    pub stop: u64,
    pub cont: u64,
}

/// What [`check`] found.
#[derive(Debug, Default)]
pub struct Report {
    pub sections: usize,
    pub completed: usize,
    pub claims_accepted: usize,
    /// Stale writers the fenced oracle rejected.
    pub stale_rejected: usize,
    /// Claims accepted although a section with a higher fence had started before (must be 0).
    pub stale_accepted: Vec<String>,
    /// Two sections inside at once, not explained by a stall inside a synchronous step.
    pub overlaps: Vec<String>,
    pub excused_overlaps: usize,
    /// Consecutive sections (by start) whose fences do not increase.
    pub fence_order: Vec<String>,
    /// Completed sections whose update was lost (two read the same counter value).
    pub lost_updates: usize,
    pub excused_lost_updates: usize,
    /// Sections told `Lost` after they ran (left out of the overlap and fence checks).
    pub told_lost: usize,
    /// The oracle's counter vs what the records say it should be.
    pub counter: i64,
    pub counter_expected: i64,
    pub oracle: OracleState,
}

impl Report {
    /// Everything that is wrong, one line each; empty when the history is correct.
    pub fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        for o in &self.overlaps {
            v.push(format!("overlap: {o}"));
        }
        for o in &self.fence_order {
            v.push(format!("fence order: {o}"));
        }
        for o in &self.stale_accepted {
            v.push(format!("stale write accepted: {o}"));
        }
        let unexcused = self.lost_updates - self.excused_lost_updates;
        if unexcused > 0 {
            v.push(format!("{unexcused} lost update(s)"));
        }
        if self.counter != self.counter_expected {
            v.push(format!(
                "oracle counter {} != {} completed sections - {} lost updates",
                self.counter, self.completed, self.lost_updates
            ));
        }
        if self.claims_accepted as u64 != self.oracle.accepted
            || self.stale_rejected as u64 != self.oracle.rejected
        {
            v.push(format!(
                "records say {} claims accepted / {} rejected, the oracle {} / {}",
                self.claims_accepted,
                self.stale_rejected,
                self.oracle.accepted,
                self.oracle.rejected
            ));
        }
        v
    }

    pub fn is_ok(&self) -> bool {
        self.violations().is_empty()
    }

    /// One line of figures for the test output and RELIABILITY.md.
    pub fn summary(&self) -> String {
        format!(
            "{} sections ({} completed), {} overlaps ({} excused: stopped inside a step), \
             {} lost updates ({} excused), {} stale writes accepted, {} stale writes rejected, \
             {} fence-order violations, counter {} (expected {}), {} told Lost after they ran",
            self.sections,
            self.completed,
            self.overlaps.len() + self.excused_overlaps,
            self.excused_overlaps,
            self.lost_updates,
            self.excused_lost_updates,
            self.stale_accepted.len(),
            self.stale_rejected,
            self.fence_order.len(),
            self.counter,
            self.counter_expected,
            self.told_lost
        )
    }
}

pub(super) fn stopped_during(stalls: &[Stall], pid: u32, (from, to): (u64, u64)) -> bool {
    stalls
        .iter()
        .any(|s| s.pid == pid && s.stop <= to && s.cont >= from)
}

/// Checks a history (see the module docs) against the oracle's final state.
pub fn check(sections: &[Section], stalls: &[Stall], oracle: OracleState) -> Report {
    let mut r = Report {
        sections: sections.len(),
        oracle,
        counter: oracle.counter,
        ..Report::default()
    };
    // The promise: sections not told `Lost` never overlap and carry fences in start order. A
    // section told `Lost` (a local successor whose hand-off check found the lock gone) may
    // have run beside a holder: it is left out of those checks, and excuses a lost update.
    r.told_lost = sections.iter().filter(|s| s.told_lost).count();
    let mut by_start: Vec<&Section> = sections
        .iter()
        .filter(|s| s.acquired != 0 && !s.told_lost)
        .collect();
    by_start.sort_by_key(|s| (s.acquired, s.fence));
    r.completed = sections.iter().filter(|s| s.completed).count();
    r.claims_accepted = sections.iter().filter(|s| s.claim == Some(true)).count();
    r.stale_rejected = sections.iter().filter(|s| s.claim == Some(false)).count();

    // Overlaps: sweep by start, against the section reaching furthest so far.
    let mut reach: Option<&Section> = None;
    for s in &by_start {
        if let Some(prev) = reach
            && prev.last_effect() > s.acquired
        {
            if stopped_during(stalls, prev.pid, prev.last_step()) {
                r.excused_overlaps += 1;
            } else {
                r.overlaps
                    .push(format!("{prev} still inside when {s} started"));
            }
        }
        if reach.is_none_or(|p| s.last_effect() > p.last_effect()) {
            reach = Some(s);
        }
    }

    // Fences strictly increase in the order sections started.
    for w in by_start.windows(2) {
        if w[1].fence <= w[0].fence {
            r.fence_order
                .push(format!("{} started after {}", w[1], w[0]));
        }
    }

    // Stale claims accepted: a section with a higher fence had started before this claim.
    let mut highest_started = 0u64;
    for s in &by_start {
        if s.claim == Some(true) && s.fence < highest_started {
            r.stale_accepted.push(format!(
                "{s} claimed after fence {highest_started} had started"
            ));
        }
        highest_started = highest_started.max(s.fence);
    }

    // Lost updates: completed sections that read the same counter value.
    let mut readers: BTreeMap<i64, Vec<&Section>> = BTreeMap::new();
    for s in sections.iter().filter(|s| s.completed) {
        readers
            .entry(s.read_value.unwrap_or(0))
            .or_default()
            .push(s);
    }
    for group in readers.values().filter(|g| g.len() > 1) {
        let lost = group.len() - 1;
        let stalled = group
            .iter()
            .filter(|s| s.told_lost || stopped_during(stalls, s.pid, s.last_step()))
            .count();
        r.lost_updates += lost;
        r.excused_lost_updates += lost.min(stalled);
    }
    r.counter_expected = (r.completed - r.lost_updates) as i64;
    r
}

/// Renders a history as a timeline (for a failure message), at most `max` lines.
pub fn timeline(sections: &[Section], stalls: &[Stall], max: usize) -> String {
    let t0 = sections
        .iter()
        .map(|s| s.acquired)
        .chain(stalls.iter().map(|s| s.stop))
        .min()
        .unwrap_or(0);
    let ms = |t: u64| (t.saturating_sub(t0)) as f64 / 1e6;
    let mut events: Vec<(u64, String)> = sections
        .iter()
        .map(|s| {
            (
                s.acquired,
                format!(
                    "{:>10.3} .. {:>10.3} ms  pid {} fence {} claim {:?} read {:?}{}{}",
                    ms(s.acquired),
                    ms(s.last_effect()),
                    s.pid,
                    s.fence,
                    s.claim,
                    s.read_value,
                    match s.kind {
                        Kind::Exclusive => String::new(),
                        Kind::Multi => format!(" m{}", KeyPart::field(&s.keys)),
                        k => format!(" {k} extra {:?}", s.extra),
                    },
                    if s.completed { "" } else { " cut short" }
                ),
            )
        })
        .collect();
    events.extend(stalls.iter().map(|s| {
        (
            s.stop,
            format!(
                "{:>10.3} .. {:>10.3} ms  pid {} STOPPED",
                ms(s.stop),
                ms(s.cont),
                s.pid
            ),
        )
    }));
    events.sort();
    let mut out = String::new();
    for (_, line) in events.iter().take(max) {
        let _ = writeln!(out, "{line}");
    }
    if events.len() > max {
        let _ = writeln!(out, "... {} more", events.len() - max);
    }
    out
}

// ---- processes ----------------------------------------------------------------------------

/// Environment variable naming the worker role a re-invoked test binary plays.
pub const WORKER_ENV: &str = "LOCKRT_TEST_WORKER";

/// The settings a worker process was started with, when this process is one.
pub fn worker_settings() -> Option<HashMap<String, String>> {
    let spec = std::env::var(WORKER_ENV).ok()?;
    Some(
        spec.split(';')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    )
}

/// A worker: this test binary re-run as `--exact <test> --ignored`, acting on the settings in
/// [`WORKER_ENV`]. Killed (it is our own child, by pid) if still running when dropped.
pub struct Worker {
    child: Option<Child>,
    pid: u32,
    out: PathBuf,
    /// Interactive workers: their stdin, and their stdout lines as they come.
    stdin: Option<std::process::ChildStdin>,
    lines: Option<std::sync::mpsc::Receiver<String>>,
    seen: Arc<Mutex<Vec<String>>>,
}

/// Records the stalls a test inflicts, for [`check`].
#[derive(Clone, Default)]
pub struct Stalls(Arc<Mutex<Vec<Stall>>>);

impl Stalls {
    pub fn all(&self) -> Vec<Stall> {
        self.0.lock().unwrap().clone()
    }
}

impl Worker {
    /// Starts the worker test `test` (its full name within this binary) with `settings`.
    /// Its stdout and stderr go to `out`.
    pub fn spawn(test: &str, settings: &[(&str, String)], out: PathBuf) -> Worker {
        let spec = settings
            .iter()
            .map(|(k, v)| {
                assert!(!v.contains(';') && !v.contains('='), "setting {k}={v}");
                format!("{k}={v}")
            })
            .collect::<Vec<_>>()
            .join(";");
        let log = std::fs::File::create(&out).expect("worker output file");
        let child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                test,
                "--nocapture",
                "--ignored",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, spec)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn worker");
        let pid = child.id();
        Worker {
            child: Some(child),
            pid,
            out,
            stdin: None,
            lines: None,
            seen: Arc::default(),
        }
    }

    /// Like [`spawn`](Self::spawn), but the test talks to the worker: it writes lines to the
    /// worker's stdin ([`send`](Self::send)) and reads the worker's stdout lines from their
    /// `@` on ([`expect_line`](Self::expect_line)), so each side waits for the other's
    /// event instead of sleeping.
    pub fn spawn_interactive(test: &str, settings: &[(&str, String)]) -> Worker {
        let exe = std::env::current_exe().expect("test binary");
        Worker::spawn_interactive_using(&exe, test, settings)
    }

    /// [`spawn_interactive`](Self::spawn_interactive), running the test binary at `exe` (a
    /// private link or copy of it: a rebuild that replaces the binary while a long schedule
    /// runs then cannot make later spawns fail).
    pub fn spawn_interactive_using(exe: &Path, test: &str, settings: &[(&str, String)]) -> Worker {
        let spec = settings
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(";");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                test,
                "--nocapture",
                "--ignored",
                "--test-threads=1",
            ])
            .env(WORKER_ENV, spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn worker");
        let pid = child.id();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let keep = seen.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                keep.lock().unwrap().push(line.clone());
                // The test harness may print "test name ... " on the same line first.
                if let Some(i) = line.find('@')
                    && tx.send(line[i..].to_owned()).is_err()
                {
                    break;
                }
            }
        });
        Worker {
            stdin: child.stdin.take(),
            child: Some(child),
            pid,
            out: PathBuf::new(),
            lines: Some(rx),
            seen,
        }
    }

    /// Writes one line to an interactive worker's stdin.
    pub fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("interactive worker");
        writeln!(stdin, "{line}").expect("write to worker");
        stdin.flush().expect("flush to worker");
    }

    /// The worker's next `@` line, which must come within `within`.
    pub fn expect_line(&self, within: Duration) -> String {
        let rx = self.lines.as_ref().expect("interactive worker");
        rx.recv_timeout(within).unwrap_or_else(|_| {
            panic!(
                "worker {} said nothing within {within:?}; its output:\n{}",
                self.pid,
                self.seen.lock().unwrap().join("\n")
            )
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid as i32).expect("pid");
        // Only while it has not been reaped: the pid is still ours.
        if self.child.is_some() {
            let _ = rustix::process::kill_process(pid, sig);
        }
    }

    /// Freezes the worker for `d` (SIGSTOP, then SIGCONT), recording the stall in `stalls`.
    /// Blocks the calling thread for `d`: this is the schedule, not a synchronisation.
    pub fn stall(&self, d: Duration, stalls: &Stalls) {
        let stop = mono_ns();
        self.signal(rustix::process::Signal::STOP);
        std::thread::sleep(d);
        // Recorded before SIGCONT: anything the worker does after resuming is later.
        let cont = mono_ns();
        self.signal(rustix::process::Signal::CONT);
        stalls.0.lock().unwrap().push(Stall {
            pid: self.pid,
            stop,
            cont,
        });
    }

    /// Sends SIGSTOP (see [`resume`](Self::resume)); returns the time it was sent.
    pub fn freeze(&self) -> u64 {
        let t = mono_ns();
        self.signal(rustix::process::Signal::STOP);
        t
    }

    /// Sends SIGCONT; returns the time just before it was sent.
    pub fn resume(&self) -> u64 {
        let t = mono_ns();
        self.signal(rustix::process::Signal::CONT);
        t
    }

    /// Waits for the worker to exit, at most `within` (then kills it). Panics, with the
    /// worker's output, unless it exited successfully.
    pub fn join(self, within: Duration) -> String {
        self.finish(within, false)
    }

    /// [`join`](Self::join) a worker that may have killed itself (SIGKILL): that counts as
    /// finished too.
    pub fn join_or_killed(self, within: Duration) -> String {
        self.finish(within, true)
    }

    fn finish(mut self, within: Duration, killed_ok: bool) -> String {
        // An interactive worker sees end of input: its cue to finish.
        drop(self.stdin.take());
        let mut child = self.child.take().expect("joined once");
        let (tx, rx) = std::sync::mpsc::channel();
        let pid = self.pid;
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(());
            status
        });
        let timed_out = rx.recv_timeout(within).is_err();
        if timed_out {
            let p = rustix::process::Pid::from_raw(pid as i32).expect("pid");
            let _ = rustix::process::kill_process(p, rustix::process::Signal::CONT);
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
        }
        let status = waiter.join().expect("waiter thread").expect("wait");
        let out = if self.lines.is_some() {
            self.seen.lock().unwrap().join("\n")
        } else {
            std::fs::read_to_string(&self.out).unwrap_or_default()
        };
        let killed = {
            use std::os::unix::process::ExitStatusExt as _;
            status.signal() == Some(rustix::process::Signal::KILL.as_raw())
        };
        assert!(
            !timed_out && (status.success() || (killed_ok && killed)),
            "worker {pid} {}: {status}\n--- its output ---\n{out}",
            if timed_out {
                "did not finish in time"
            } else {
                "failed"
            }
        );
        out
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A frozen child would not die of SIGKILL until thawed on some systems.
            self.signal(rustix::process::Signal::CONT);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---- seeds --------------------------------------------------------------------------------

/// A small deterministic generator (SplitMix64): a seed replays the same schedule of choices.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// `true` with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.range(1, 100) <= pct
    }
}
