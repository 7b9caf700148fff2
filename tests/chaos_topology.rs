//! Chaos schedules on topologies: several worker processes, each with its own `Locker` and
//! several tasks (holders and queued waiters at once), take one lock over and over while the
//! test fails the topology under them: Sentinel failovers (`SENTINEL FAILOVER`, the master
//! SIGSTOPped, the master killed), with and without `sync_replicas`; half-open connections to
//! the sentinels, the subscribers and the masters; Redis restarted without persistence in the
//! middle of a section; `force_unlock` from another process during sections; `shutdown()` of
//! one worker process while its tasks hold and wait. Every section is recorded and the history
//! checker (`support::history`) with its fenced oracle on a separate redis-server decides.
//!
//! What each schedule asserts is what the README promises for that fault:
//!
//! - with `sync_replicas`, a failover leaves the history clean: 0 overlaps, fences strictly
//!   increasing (none repeated), no lost update, no stale write accepted;
//! - without it, the README documents a window (a write the replica had not applied is lost
//!   with the old master): the schedule measures it (`FIGURE`) and asserts only that the
//!   records and the oracle agree, that no overlapped section was reported as a success, and
//!   that locks are served again after the switch;
//! - a restart without persistence and a forced unlock take the lock away from a running
//!   section, so the next holder may start before the old one noticed: such an overlap is
//!   allowed only for a section the fault hit, which the locker must report `Lost` (never
//!   success), and with a forced unlock only for milliseconds; fences keep increasing and the
//!   oracle rejects stale claims;
//! - half-open connections and a shutdown leave the history clean.
//!
//! A seed fixes every random choice; `LOCKRT_CHAOS_SEED=<seed>` runs only that seed, e.g.
//! `LOCKRT_CHAOS_SEED=7 cargo test --test chaos_topology -- --include-ignored --nocapture
//! chaos_topology_restart`. The timing of a replay differs, so it reproduces the same faults,
//! not the same interleaving.

mod support;

use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use lockrt::testing::{FaultProxy, RedisSentinelGroup, RedisServer};
use lockrt::{LockError, LockOptions, Locker};
use support::history::{self, Log, Oracle, Rng, Section, Worker, seeds};

const SERVICE: &str = "locks";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

fn ms_of(ns: u64) -> f64 {
    ns as f64 / 1e6
}

// ---- the worker process ------------------------------------------------------------------

/// How a worker reaches the lock: one URL, or the sentinels of [`SERVICE`].
#[derive(Clone)]
enum Target {
    Url(String),
    Sentinels(Vec<String>),
}

/// What the workers of one schedule do.
#[derive(Clone)]
struct Load {
    target_per_worker: Vec<Target>,
    sync_replicas: bool,
    tasks: usize,
    ttl: (u64, u64),
    /// Longest body of the long ones (a quarter of the bodies); the rest take 0-40 ms.
    long_work: u64,
    wait: (u64, u64),
    /// A third of the `acquire` calls use a fixed lease (no watchdog) of ttl.
    fixed_leases: bool,
    response_timeout: u64,
}

/// The worker: `tasks` tasks sharing one `Locker`, each taking the lock in a loop (`run`,
/// `run_checked`, or `acquire` and an explicit release) until its stdin ends. It says `@ready`
/// once connected; on the line `shutdown` it calls `Locker::shutdown()` as soon as one of its
/// tasks holds the lock and another waits (bounded), reports what Redis still holds of it,
/// and exits. Every section goes to the history log; what the locker reported for it goes to
/// the results file (`R <pid> <fence> <body start> <completed> <verdict> <style>`).
#[test]
#[ignore = "worker process of this file's tests: they start it"]
fn worker() {
    let Some(cfg) = history::worker_settings() else {
        return;
    };
    let get = |k: &str| {
        cfg.get(k)
            .unwrap_or_else(|| panic!("worker setting {k}"))
            .clone()
    };
    let num = |k: &str| get(k).parse::<u64>().unwrap();
    let pair = |k: &str| {
        let v = get(k);
        let (a, b) = v.split_once('-').unwrap();
        (a.parse::<u64>().unwrap(), b.parse::<u64>().unwrap())
    };
    let w = WorkerCfg {
        key: get("key"),
        oracle: get("oracle"),
        ns: get("ns"),
        ttl: pair("ttl"),
        wait: pair("wait"),
        long_work: num("long_work"),
        fixed: num("fixed") == 1,
    };
    let seed = num("seed");
    let tasks = num("tasks") as usize;
    let log = Log::create(get("log").as_ref());
    let results = Results::create(get("res").as_ref());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stats = Arc::new(Stats::default());
    let stop = Arc::new(AtomicBool::new(false));
    let shut = rt.block_on(async {
        let locker = connect(&get("topo"), &get("addr"), num("sync") == 1, num("rto")).await;
        let mut set = tokio::task::JoinSet::new();
        for t in 0..tasks {
            set.spawn(task_loop(
                locker.clone(),
                w.clone(),
                Rng::new(seed * 100 + t as u64),
                log.clone(),
                results.clone(),
                stats.clone(),
                stop.clone(),
            ));
        }
        say("@ready");
        while let Some(line) = rx.recv().await {
            let cmd = line.trim();
            if cmd == "shutdown" || cmd == "shutdown-waiting" {
                let only = cmd == "shutdown-waiting";
                return Some(
                    shut_down(&locker, &get("topo"), &get("addr"), &w.key, &stats, only).await,
                );
            }
        }
        stop.store(true, Ordering::SeqCst);
        let joined = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(r) = set.join_next().await {
                r.expect("a worker task panicked");
            }
        })
        .await;
        assert!(
            joined.is_ok(),
            "the worker's tasks did not finish within 60 s"
        );
        None
    });
    // Dropping the runtime drops the tasks' futures, so every section still open is recorded
    // (cut short) before the process ends.
    rt.shutdown_timeout(Duration::from_secs(10));
    match shut {
        Some(line) => say(&line),
        None => say(&format!("@done {}", stats.tally())),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

#[derive(Clone)]
struct WorkerCfg {
    key: String,
    oracle: String,
    ns: String,
    ttl: (u64, u64),
    wait: (u64, u64),
    long_work: u64,
    fixed: bool,
}

/// What a worker's tasks are doing and have done.
#[derive(Default)]
struct Stats {
    inside: AtomicUsize,
    waiting: AtomicUsize,
    completed: AtomicUsize,
    reported_ok: AtomicUsize,
    lost: AtomicUsize,
    timeouts: AtomicUsize,
    backend: AtomicUsize,
    shut: AtomicUsize,
}

impl Stats {
    fn tally(&self) -> String {
        let g = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        format!(
            "completed={} ok={} lost={} timeouts={} backend={} shutdown={}",
            g(&self.completed),
            g(&self.reported_ok),
            g(&self.lost),
            g(&self.timeouts),
            g(&self.backend),
            g(&self.shut)
        )
    }
}

/// Counts a task as waiting until it enters a section or its call ends.
struct Waiting<'a> {
    stats: &'a Stats,
    done: AtomicBool,
}

impl<'a> Waiting<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats.waiting.fetch_add(1, Ordering::SeqCst);
        Waiting {
            stats,
            done: AtomicBool::new(false),
        }
    }

    fn over(&self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.stats.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.over();
    }
}

/// Counts a task as inside a section while it lives (also when the body is dropped).
struct Inside<'a>(&'a Stats);

impl<'a> Inside<'a> {
    fn new(stats: &'a Stats) -> Self {
        stats.inside.fetch_add(1, Ordering::SeqCst);
        Inside(stats)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the locker reported for each section: `R <pid> <fence> <body start> <completed>
/// <verdict> <style>`, one line per call that got a fence.
#[derive(Clone)]
struct Results(Arc<Mutex<std::fs::File>>);

impl Results {
    fn create(path: &Path) -> Results {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("results file");
        Results(Arc::new(Mutex::new(f)))
    }

    fn write(&self, fence: u64, start: u64, completed: bool, verdict: &str, style: &str) {
        let line = format!(
            "R {} {fence} {start} {} {verdict} {style}\n",
            std::process::id(),
            u8::from(completed)
        );
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(line.as_bytes()).expect("write result");
    }
}

async fn connect(topo: &str, addr: &str, sync: bool, rto: u64) -> Locker {
    let mut last = None;
    for _ in 0..50 {
        let b = match topo {
            "sentinel" => Locker::builder().sentinel(addr.split(','), SERVICE),
            _ => Locker::builder().url(addr),
        };
        let b = b.response_timeout(ms(rto)).connect_timeout(ms(500));
        let b = if sync { b.sync_replicas(1, ms(200)) } else { b };
        match b.build().await {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("could not connect: {last:?}");
}

async fn task_loop(
    locker: Locker,
    w: WorkerCfg,
    mut rng: Rng,
    log: Log,
    results: Results,
    stats: Arc<Stats>,
    stop: Arc<AtomicBool>,
) {
    let mut oracle = Oracle::connect(&w.oracle, &w.ns);
    while !stop.load(Ordering::SeqCst) {
        // Three ttls of the range: a lock is passed on in the process only to a caller with
        // the same one.
        let ttl = ms([w.ttl.0, (w.ttl.0 + w.ttl.1) / 2, w.ttl.1][rng.range(0, 2) as usize]);
        let wait = rng.ms(w.wait.0, w.wait.1);
        let style = rng.range(0, 2);
        let fixed = w.fixed && style == 2 && rng.chance(33);
        let work = if rng.chance(25) {
            let long = if fixed {
                w.long_work.min(ttl.as_millis() as u64 / 3)
            } else {
                w.long_work
            };
            rng.ms(40, long.max(40))
        } else {
            rng.ms(0, 40)
        };
        let opts = LockOptions::new().ttl(ttl).wait(wait).watchdog(!fixed);
        let op = one_op(
            &locker,
            &w.key,
            opts,
            style,
            work,
            &mut oracle,
            &log,
            &results,
            &stats,
        );
        // A hang is a failure of its own.
        let bound = wait + ttl * 3 + work + Duration::from_secs(20);
        let res = tokio::time::timeout(bound, op)
            .await
            .unwrap_or_else(|_| panic!("a call did not end within {bound:?}"));
        let pause = match res {
            Ok(()) => rng.ms(0, 30),
            Err(e) => {
                match &e {
                    LockError::ShutDown => {
                        stats.shut.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    e if e.is_timeout() => stats.timeouts.fetch_add(1, Ordering::SeqCst),
                    e if e.is_lost() => stats.lost.fetch_add(1, Ordering::SeqCst),
                    e if e.is_backend() => stats.backend.fetch_add(1, Ordering::SeqCst),
                    e => panic!("unexpected error: {e:?}"),
                };
                rng.ms(20, 150)
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// One use of the lock: `run_checked` (0), `run` (1) or `acquire` + explicit release (2).
/// Records what the locker reported for the section.
#[allow(clippy::too_many_arguments)]
async fn one_op(
    locker: &Locker,
    key: &str,
    opts: LockOptions,
    style: u64,
    work: Duration,
    oracle: &mut Oracle,
    log: &Log,
    results: &Results,
    stats: &Stats,
) -> Result<(), LockError> {
    let waiting = Waiting::new(stats);
    // The fence, the body's start and whether the section completed, once the body ran.
    let mut seen: Option<(u64, u64, bool)> = None;
    let res = match style {
        0 | 1 => {
            let body = async {
                waiting.over();
                let _inside = Inside::new(stats);
                let fence = lockrt::current_lock().expect("inside run").fence();
                let start = history::mono_ns();
                seen = Some((fence, start, false));
                let o = history::section(oracle, log, fence, work, None).await;
                seen = Some((fence, start, o == history::Outcome::Completed));
            };
            if style == 0 {
                match locker.run_checked(key, opts, body).await {
                    Ok(c) if c.held_throughout() => Ok("ok"),
                    Ok(_) => Ok("lost"),
                    Err(e) => Err(e),
                }
            } else {
                locker.run(key, opts, body).await.map(|()| "ok")
            }
        }
        _ => {
            let g = locker.acquire(key, opts).await;
            waiting.over();
            let g = g?;
            let start = history::mono_ns();
            let o = {
                let _inside = Inside::new(stats);
                history::section(oracle, log, g.fence(), work, Some(&g)).await
            };
            seen = Some((g.fence(), start, o == history::Outcome::Completed));
            match g.release().await {
                Ok(()) if o == history::Outcome::Lost => Ok("lost"),
                Ok(()) => Ok("ok"),
                Err(e) => Err(e),
            }
        }
    };
    drop(waiting);
    if let Some((fence, start, completed)) = seen {
        let verdict = match &res {
            Ok(v) => (*v).to_owned(),
            Err(e) if e.is_lost() => "lost".to_owned(),
            Err(LockError::ShutDown) => "shutdown".to_owned(),
            Err(_) => "error".to_owned(),
        };
        if completed {
            stats.completed.fetch_add(1, Ordering::SeqCst);
        }
        match verdict.as_str() {
            "ok" => stats.reported_ok.fetch_add(1, Ordering::SeqCst),
            "lost" => stats.lost.fetch_add(1, Ordering::SeqCst),
            _ => 0,
        };
        let style = ["run_checked", "run", "acquire"][style.min(2) as usize];
        results.write(fence, start, completed, &verdict, style);
    }
    match res {
        Ok(_) => Ok(()),
        // A section that was cut short by a loss was counted above.
        Err(e) if e.is_lost() && seen.is_some() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Shuts the locker down once one of this worker's tasks holds the lock and another waits
/// (at most 5 s), then reads what Redis still holds of this locker (standalone only).
async fn shut_down(
    locker: &Locker,
    topo: &str,
    addr: &str,
    key: &str,
    stats: &Stats,
    waiting_only: bool,
) -> String {
    // `shutdown`: one task inside and one waiting; `shutdown-waiting`: tasks waiting, none
    // inside (nothing to release: the cancelled waits are all there is to clean up).
    let busy = async {
        loop {
            let (inside, waiting) = (
                stats.inside.load(Ordering::SeqCst),
                stats.waiting.load(Ordering::SeqCst),
            );
            let ready = if waiting_only {
                inside == 0 && waiting > 0
            } else {
                inside > 0 && waiting > 0
            };
            if ready {
                break;
            }
            tokio::time::sleep(ms(1)).await;
        }
    };
    let busy = tokio::time::timeout(Duration::from_secs(5), busy)
        .await
        .is_ok();
    let (inside, waiting) = (
        stats.inside.load(Ordering::SeqCst),
        stats.waiting.load(Ordering::SeqCst),
    );
    let before = history::mono_ns();
    locker.shutdown().await;
    let after = history::mono_ns();
    let (queued, held) = if topo == "url" {
        leftovers(addr, key, locker.instance_id())
    } else {
        (0, false)
    };
    format!(
        "@shutdown {before} {after} busy={} inside={inside} waiting={waiting} queued_left={queued} held_left={held}",
        u8::from(busy)
    )
}

/// This locker's queue places and lock left in Redis: registrations carry the locker's
/// instance id in their owner text, the lock in its owner record.
fn leftovers(url: &str, key: &str, instance: impl std::fmt::Display) -> (usize, bool) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(ms(2_000)))
        .expect("direct connection");
    let id = instance.to_string();
    let regs: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{{lock:{key}}}:w"))
        .query(&mut conn)
        .unwrap_or_default();
    let queued = regs
        .iter()
        .filter(|(k, v)| k.starts_with("o:") && v.contains(&id))
        .count();
    let owner: Option<String> = redis::cmd("GET")
        .arg(format!("{{lock:{key}}}:owner"))
        .query(&mut conn)
        .unwrap_or_default();
    (queued, owner.is_some_and(|o| o.contains(&id)))
}

// ---- the schedules ------------------------------------------------------------------------

/// One run of a schedule: the workers, the oracle, and the test's record of its faults.
struct Run {
    case: String,
    seed: u64,
    dir: PathBuf,
    ns: String,
    key: String,
    oracle_url: String,
    workers: Vec<Worker>,
    /// Faults the test made: when (`mono_ns`), and what.
    events: Vec<(u64, String)>,
    rng: Rng,
}

impl Run {
    fn start(case: &str, seed: u64, oracle: &RedisServer, load: &Load) -> Run {
        let dir = std::env::temp_dir().join(format!(
            "lockrt-chaos-topo-{}-{seed}-{}",
            std::process::id(),
            history::mono_ns()
        ));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let exe = private_exe(&dir);
        let ns = format!("{case}-{seed}-{}", history::mono_ns());
        let key = format!("topo:{ns}");
        let workers = load
            .target_per_worker
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let (topo, addr) = match t {
                    Target::Url(u) => ("url", u.clone()),
                    Target::Sentinels(s) => ("sentinel", s.join(",")),
                };
                Worker::spawn_interactive_using(
                    &exe,
                    "worker",
                    &[
                        ("topo", topo.to_owned()),
                        ("addr", addr),
                        ("sync", u8::from(load.sync_replicas).to_string()),
                        ("rto", load.response_timeout.to_string()),
                        ("oracle", oracle.url()),
                        ("ns", ns.clone()),
                        ("key", key.clone()),
                        ("log", dir.join(format!("w{i}.log")).display().to_string()),
                        ("res", dir.join(format!("w{i}.res")).display().to_string()),
                        ("seed", (seed * 1000 + i as u64).to_string()),
                        ("tasks", load.tasks.to_string()),
                        ("ttl", format!("{}-{}", load.ttl.0, load.ttl.1)),
                        ("wait", format!("{}-{}", load.wait.0, load.wait.1)),
                        ("long_work", load.long_work.to_string()),
                        ("fixed", u8::from(load.fixed_leases).to_string()),
                    ],
                )
            })
            .collect::<Vec<_>>();
        for w in &workers {
            let line = w.expect_line(Duration::from_secs(30));
            assert!(line.starts_with("@ready"), "worker {}: {line}", w.pid());
        }
        Run {
            case: case.to_owned(),
            seed,
            dir,
            ns,
            key,
            oracle_url: oracle.url(),
            workers,
            events: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    fn event(&mut self, what: impl Into<String>) -> u64 {
        let t = history::mono_ns();
        self.events.push((t, what.into()));
        t
    }

    /// Sections completed (by any worker) that started after `t`, from the logs so far.
    fn completed_since(&self, t: u64) -> usize {
        let mut n = 0;
        for entry in std::fs::read_dir(&self.dir).expect("log dir").flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                // Only whole lines: a worker may be writing the last one.
                let whole = text.rfind('\n').map_or("", |i| &text[..i]);
                n += whole
                    .lines()
                    .filter_map(parse_section)
                    .filter(|s| s.completed && s.acquired > t)
                    .count();
            }
        }
        n
    }

    /// Waits until `n` sections completed after `t` (at most `within`); how long it took.
    fn until_served(&self, t: u64, n: usize, within: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < within {
            if self.completed_since(t) >= n {
                return Some(start.elapsed());
            }
            thread::sleep(ms(20));
        }
        None
    }

    /// Lets the workers run until `d` after `t` (`mono_ns`).
    fn until_elapsed(&self, t: u64, d: Duration) {
        let end = t + d.as_nanos() as u64;
        let now = history::mono_ns();
        if end > now {
            thread::sleep(Duration::from_nanos(end - now));
        }
    }

    /// Ends the workers (their stdin closes), and checks the history.
    fn finish(self) -> Outcome {
        let mut done = Vec::new();
        for w in self.workers {
            let out = w.join(Duration::from_secs(90));
            done.extend(
                out.lines()
                    .filter_map(|l| l.find('@').map(|i| l[i..].to_owned()))
                    .filter(|l| l.starts_with("@done") || l.starts_with("@shutdown")),
            );
        }
        let sections = history::load(&self.dir);
        let results = load_results(&self.dir);
        let state = Oracle::connect(&self.oracle_url, &self.ns).state();
        let report = history::check(&sections, &[], state);
        let _ = std::fs::remove_dir_all(&self.dir);
        let overlaps = overlaps(&sections, &results, &self.events);
        Outcome {
            case: self.case,
            seed: self.seed,
            report,
            sections,
            overlaps,
            events: self.events,
            workers: done,
        }
    }
}

/// A copy of this test binary in `dir`, for the workers: a rebuild that replaces the binary
/// while the schedules run must not make later spawns fail. Copied from `/proc/self/exe`,
/// which still opens this process's own binary after the file was replaced.
fn private_exe(dir: &Path) -> PathBuf {
    let private = dir.join("worker-exe");
    if std::fs::copy("/proc/self/exe", &private).is_err() {
        let exe = std::env::current_exe().expect("test binary");
        std::fs::copy(&exe, &private).expect("copy of the test binary");
    }
    private
}

fn parse_section(line: &str) -> Option<Section> {
    Section::from_line(line)
}

/// What the locker reported for one section.
#[derive(Debug, Clone)]
struct Reported {
    pid: u32,
    fence: u64,
    start: u64,
    verdict: String,
}

fn load_results(dir: &Path) -> Vec<Reported> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "res") {
            for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
                let f: Vec<&str> = line.split_whitespace().collect();
                if f.len() == 7 && f[0] == "R" {
                    out.push(Reported {
                        pid: f[1].parse().unwrap(),
                        fence: f[2].parse().unwrap(),
                        start: f[3].parse().unwrap(),
                        verdict: format!("{} ({})", f[5], f[6]),
                    });
                }
            }
        }
    }
    out
}

/// Two sections inside at once: the one that was still inside, the one that started, how
/// long they overlapped, the test's faults during the first one, and what the locker reported
/// for the first one.
#[derive(Debug)]
struct Overlap {
    earlier: Section,
    later: Section,
    overlap_ns: u64,
    faults_during: Vec<String>,
    reported: Option<String>,
}

/// The checker's overlap sweep, with the pairs kept.
fn overlaps(sections: &[Section], results: &[Reported], events: &[(u64, String)]) -> Vec<Overlap> {
    let mut by_start: Vec<&Section> = sections.iter().filter(|s| s.acquired != 0).collect();
    by_start.sort_by_key(|s| (s.acquired, s.fence));
    let mut reach: Option<&Section> = None;
    let mut out = Vec::new();
    for s in &by_start {
        if let Some(prev) = reach
            && prev.last_effect() > s.acquired
        {
            let reported = results
                .iter()
                .filter(|r| r.pid == prev.pid && r.fence == prev.fence)
                .min_by_key(|r| r.start.abs_diff(prev.acquired))
                .map(|r| r.verdict.clone());
            out.push(Overlap {
                earlier: prev.clone(),
                later: (*s).clone(),
                overlap_ns: prev.last_effect() - s.acquired,
                faults_during: events
                    .iter()
                    .filter(|(t, _)| *t >= prev.acquired && *t <= s.acquired)
                    .map(|(_, e)| e.clone())
                    .collect(),
                reported,
            });
        }
        if reach.is_none_or(|p| s.last_effect() > p.last_effect()) {
            reach = Some(s);
        }
    }
    out
}

/// A finished run.
struct Outcome {
    case: String,
    seed: u64,
    report: history::Report,
    sections: Vec<Section>,
    overlaps: Vec<Overlap>,
    events: Vec<(u64, String)>,
    workers: Vec<String>,
}

impl Outcome {
    /// Fences handed to more than one section.
    fn repeated_fences(&self) -> usize {
        let mut seen: HashMap<u64, usize> = HashMap::new();
        for s in &self.sections {
            *seen.entry(s.fence).or_default() += 1;
        }
        seen.values().filter(|&&n| n > 1).count()
    }

    fn max_overlap_ms(&self) -> f64 {
        self.overlaps
            .iter()
            .map(|o| ms_of(o.overlap_ns))
            .fold(0.0, f64::max)
    }

    /// Overlapped sections the locker reported as a success: never allowed.
    fn overlapped_reported_ok(&self) -> Vec<String> {
        self.overlaps
            .iter()
            .filter(|o| o.reported.as_deref().is_some_and(|r| r.starts_with("ok ")))
            .map(|o| {
                format!(
                    "pid {} fence {} reported success although pid {} fence {} started {:.1} ms \
                     before it ended",
                    o.earlier.pid,
                    o.earlier.fence,
                    o.later.pid,
                    o.later.fence,
                    ms_of(o.overlap_ns)
                )
            })
            .collect()
    }

    /// Checker findings other than overlaps and the lost updates they cause: fence order,
    /// stale writes accepted, records vs oracle.
    fn integrity_violations(&self) -> Vec<String> {
        self.report
            .violations()
            .into_iter()
            .filter(|v| {
                !v.starts_with("overlap:")
                    && !v.ends_with("lost update(s)")
                    && !v.starts_with("oracle counter")
            })
            .collect()
    }

    /// The counter agrees with the records (completed sections minus the lost updates the
    /// overlaps caused).
    fn counter_consistent(&self) -> bool {
        self.report.counter == self.report.counter_expected
    }

    fn summary(&self) -> String {
        format!(
            "{}; {} passed on locally; repeated fences {}, longest overlap {:.1} ms",
            self.report.summary(),
            // Fences not a multiple of 32: sections of a lock passed on in its process.
            (self.sections.iter())
                .filter(|s| !s.fence.is_multiple_of(32))
                .count(),
            self.repeated_fences(),
            self.max_overlap_ms()
        )
    }

    fn failure(&self, why: &[String]) -> String {
        let t0 = self
            .sections
            .iter()
            .map(|s| s.acquired)
            .chain(self.events.iter().map(|e| e.0))
            .min()
            .unwrap_or(0);
        let mut ev = String::new();
        for (t, e) in &self.events {
            ev.push_str(&format!(
                "  {:>10.3} ms  {e}\n",
                ms_of(t.saturating_sub(t0))
            ));
        }
        let mut ovs = String::new();
        for o in &self.overlaps {
            ovs.push_str(&format!(
                "  pid {} fence {} [{:.3} .. {:.3} ms] reported {:?}, still inside when pid {} \
                 fence {} started at {:.3} ms; faults meanwhile: {:?}\n",
                o.earlier.pid,
                o.earlier.fence,
                ms_of(o.earlier.acquired.saturating_sub(t0)),
                ms_of(o.earlier.last_effect().saturating_sub(t0)),
                o.reported,
                o.later.pid,
                o.later.fence,
                ms_of(o.later.acquired.saturating_sub(t0)),
                o.faults_during
            ));
        }
        format!(
            "{} seed {} FAILED (replay: LOCKRT_CHAOS_SEED={}):\n  {}\nfaults:\n{ev}overlaps:\n\
             {ovs}workers: {}\ntimeline:\n{}",
            self.case,
            self.seed,
            self.seed,
            why.join("\n  "),
            self.workers.join(" | "),
            history::timeline(&self.sections, &[], 300)
        )
    }
}

/// Asserts the whole history is clean: every checker finding is a failure.
fn strict(o: &Outcome) -> Vec<String> {
    let mut v = o.report.violations();
    v.extend(o.overlapped_reported_ok());
    v
}

/// For faults that take the lock from a running section (restart, forced unlock): an overlap
/// is allowed only when a fault of `kind` happened while the earlier section was inside, the
/// locker did not report that section as a success, and it lasted at most `bound`; every
/// other finding is a failure.
fn revoked_only(
    o: &Outcome,
    kind: &str,
    bound: Option<Duration>,
    only_pid: Option<u32>,
) -> Vec<String> {
    let mut v = o.integrity_violations();
    v.extend(o.overlapped_reported_ok());
    for ov in &o.overlaps {
        let explained = ov.faults_during.iter().any(|f| f.starts_with(kind))
            && only_pid.is_none_or(|p| p == ov.earlier.pid);
        if !explained {
            v.push(format!(
                "overlap not explained by a {kind}: pid {} fence {} still inside when pid {} \
                 fence {} started ({:.1} ms)",
                ov.earlier.pid,
                ov.earlier.fence,
                ov.later.pid,
                ov.later.fence,
                ms_of(ov.overlap_ns)
            ));
        }
        if let Some(b) = bound
            && ov.overlap_ns > b.as_nanos() as u64
        {
            v.push(format!(
                "overlap of {:.1} ms after a {kind} (bound {b:?}): pid {} fence {}",
                ms_of(ov.overlap_ns),
                ov.earlier.pid,
                ov.earlier.fence
            ));
        }
    }
    if !o.counter_consistent() {
        v.push(format!(
            "oracle counter {} != {} expected",
            o.report.counter, o.report.counter_expected
        ));
    }
    let unexplained = o.report.lost_updates.saturating_sub(o.overlaps.len());
    if unexplained > 0 {
        v.push(format!("{unexplained} lost update(s) without an overlap"));
    }
    v
}

fn assert_all(case: &str, failures: Vec<String>) {
    assert!(failures.is_empty(), "{case}:\n{}", failures.join("\n\n"));
}

// ---- Sentinel failovers ---------------------------------------------------------------------

/// How long a failover schedule goes on after the sentinel named the new master: past the
/// deafness bound and the leases that may span the switch, while the demoted master still
/// takes writes (until a sentinel reconfigures it, up to ~10 s).
const AFTER_SWITCH: Duration = Duration::from_secs(8);

/// How long after the switch a locker may still use the old master (the README's deafness
/// bound of the `+switch-master` watcher, 1 s, plus slack), and then the longest ttl (3 s)
/// during which a lock taken in the window may still be held.
const WINDOW_END: Duration = Duration::from_millis(1_500 + 3_000);

/// Without `sync_replicas`, the README documents a window: a write the replica had not
/// applied is lost with the old master, so a fence may repeat (the oracle rejects the second
/// claim) and a waiter may take the lock on the new master while the holder still counts it
/// held. Measured, not failures: overlaps, the lost updates they cause, fence order. Still
/// failures: records and oracle disagreeing, a stale claim accepted, an overlapped section
/// reported as a success, and any overlap of a section that started after the window
/// (the locker kept using a replaced master: split brain).
fn window_only(o: &Outcome, switched: u64) -> Vec<String> {
    let mut v = o.integrity_violations();
    v.retain(|l| !l.starts_with("fence order:"));
    v.extend(o.overlapped_reported_ok());
    let end = switched + WINDOW_END.as_nanos() as u64;
    for ov in o.overlaps.iter().filter(|ov| ov.earlier.acquired > end) {
        v.push(format!(
            "split brain {:.0} ms after the switch: pid {} fence {} still inside when pid {} \
             fence {} started ({:.1} ms)",
            ms_of(ov.later.acquired - switched),
            ov.earlier.pid,
            ov.earlier.fence,
            ov.later.pid,
            ov.later.fence,
            ms_of(ov.overlap_ns)
        ));
    }
    v
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failover {
    /// `SENTINEL FAILOVER`.
    Command,
    /// The master SIGSTOPped until the sentinel promoted the replica, then resumed.
    Stop,
    /// The master SIGKILLed; restarted empty once the replica is promoted (it rejoins as a
    /// replica).
    Kill,
    /// The replica SIGSTOPped for a while (its replication link cut: what the master takes
    /// meanwhile never reaches it), then the master SIGKILLed and the replica resumed, so the
    /// sentinel promotes it; the old master is restarted empty afterwards.
    KillReplicaFrozen,
}

/// Waits (bounded, polling: no event announces it) until the lock is held and someone is
/// queued for it on the server on `port`.
fn until_busy(port: u16, key: &str, within: Duration) -> bool {
    let Ok(mut conn) = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .and_then(|c| c.get_connection_with_timeout(ms(1_000)))
    else {
        return false;
    };
    let _ = conn.set_read_timeout(Some(ms(1_000)));
    let start = Instant::now();
    while start.elapsed() < within {
        let held: bool = redis::cmd("EXISTS")
            .arg(format!("lock:{key}"))
            .query(&mut conn)
            .unwrap_or(false);
        let queued: usize = redis::cmd("ZCARD")
            .arg(format!("{{lock:{key}}}:q"))
            .query(&mut conn)
            .unwrap_or(0);
        if held && queued > 0 {
            return true;
        }
        thread::sleep(ms(5));
    }
    false
}

/// One failover under load: 3 workers x 3 tasks through the sentinel, ttls 1-3 s.
fn failover_seed(
    seed: u64,
    how: Failover,
    sync: bool,
    oracle: &RedisServer,
) -> (Outcome, String, u64) {
    let case = format!(
        "chaos_topology_sentinel_{}{}",
        match how {
            Failover::Command => "failover",
            Failover::Stop => "master_stopped",
            Failover::Kill => "master_killed",
            Failover::KillReplicaFrozen => "replica_frozen_master_killed",
        },
        if sync { "_sync" } else { "" }
    );
    let mut g = RedisSentinelGroup::start(SERVICE, 1).expect("sentinel group");
    let load = Load {
        target_per_worker: vec![Target::Sentinels(g.sentinel_urls()); 3],
        sync_replicas: sync,
        tasks: 3,
        ttl: (1_000, 3_000),
        long_work: 600,
        wait: (1_000, 6_000),
        fixed_leases: true,
        response_timeout: 500,
    };
    let mut run = Run::start(&case, seed, oracle, &load);
    thread::sleep(run.rng.ms(800, 2_000));
    let old = g.master_port().expect("master");
    let busy = until_busy(old, &run.key, Duration::from_secs(5));
    let fault_at = run.event(format!("{how:?} (lock held and queued: {busy})"));
    let new = match how {
        Failover::Command => {
            g.failover().expect("SENTINEL FAILOVER");
            g.master_port().expect("new master")
        }
        Failover::Stop => {
            g.pause_master().expect("SIGSTOP the master");
            let new = g
                .wait_for_new_master(old, Duration::from_secs(30))
                .expect("the replica promoted");
            thread::sleep(run.rng.ms(0, 1_500));
            g.server_mut(old).unwrap().resume().expect("SIGCONT");
            run.event("old master resumed");
            new
        }
        Failover::KillReplicaFrozen => {
            let replica = g.replica_ports().expect("replica")[0];
            g.server_mut(replica)
                .unwrap()
                .pause()
                .expect("SIGSTOP the replica");
            run.event("replica frozen");
            thread::sleep(run.rng.ms(300, 1_200));
            g.kill_master().expect("SIGKILL the master");
            g.server_mut(replica)
                .unwrap()
                .resume()
                .expect("SIGCONT the replica");
            run.event("master killed, replica resumed");
            let new = g
                .wait_for_new_master(old, Duration::from_secs(30))
                .expect("the replica promoted");
            g.server_mut(old)
                .unwrap()
                .restart()
                .expect("restart the old master");
            run.event("old master restarted empty");
            new
        }
        Failover::Kill => {
            g.kill_master().expect("SIGKILL the master");
            let new = g
                .wait_for_new_master(old, Duration::from_secs(30))
                .expect("the replica promoted");
            thread::sleep(run.rng.ms(0, 1_500));
            g.server_mut(old)
                .unwrap()
                .restart()
                .expect("restart the old master");
            run.event("old master restarted empty");
            new
        }
    };
    let switched = run.event(format!("sentinel names the new master {new}"));
    // Locks are served again after the switch (with sync_replicas only once a replica is
    // attached to the new master again).
    let served = run.until_served(switched, 3, Duration::from_secs(30));
    run.until_elapsed(switched, AFTER_SWITCH);
    let outcome = run.finish();
    let text = format!(
        "seed {seed}: {}; failover {:.0} ms; 3 sections completed {} after the switch",
        outcome.summary(),
        ms_of(switched - fault_at),
        served.map_or("NEVER (30 s)".into(), |d| format!(
            "{:.0} ms",
            d.as_secs_f64() * 1e3
        ))
    );
    drop(g);
    (outcome, text, switched)
}

fn failover_case(how: Failover, sync: bool, default_seeds: &[u64]) {
    let oracle = RedisServer::start().expect("oracle");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    let mut case = String::new();
    for seed in seeds(default_seeds.iter().copied()) {
        let (o, text, switched) = failover_seed(seed, how, sync, &oracle);
        case.clone_from(&o.case);
        println!("{}: {text}", o.case);
        for w in &o.workers {
            println!("{}:   {w}", o.case);
        }
        let mut v = if sync {
            strict(&o)
        } else {
            window_only(&o, switched)
        };
        if text.contains("NEVER") {
            v.push("locks were not served again after the switch".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(&case, lines.join(" | "));
    assert_all(&case, failures);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_failover_sync() {
    failover_case(Failover::Command, true, &[11, 12]);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_failover() {
    failover_case(Failover::Command, false, &[11, 12]);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_master_stopped_sync() {
    failover_case(Failover::Stop, true, &[21]);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_master_stopped() {
    failover_case(Failover::Stop, false, &[21]);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_master_killed_sync() {
    failover_case(Failover::Kill, true, &[31]);
}

/// The hand-over case of `sync_replicas`: while the replica's link is cut, hand-overs must
/// not be used unacknowledged; after the failover to that replica no fence repeats.
#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_replica_frozen_master_killed_sync() {
    failover_case(Failover::KillReplicaFrozen, true, &[35, 36]);
}

#[test]
#[ignore = "chaos: Sentinel failover under load; run with cargo xtask chaos"]
fn chaos_topology_sentinel_master_killed() {
    failover_case(Failover::Kill, false, &[31]);
}

// ---- half-open connections -------------------------------------------------------------------

/// Every worker reaches the only sentinel through its own proxy; the sentinel connections of
/// a random subset of the workers go half-open, then `SENTINEL FAILOVER`. With
/// `sync_replicas`: the history stays clean. Without: the documented window is measured, and
/// no two sections that both started after the deafness bound overlap (split brain through
/// a deaf watcher).
fn half_open_sentinels(case: &str, sync: bool, default_seeds: [u64; 2]) {
    let oracle = RedisServer::start().expect("oracle");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds(default_seeds) {
        let g = RedisSentinelGroup::start(SERVICE, 1).expect("sentinel group");
        let sentinel =
            std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, g.sentinel_ports()[0]));
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|_| FaultProxy::start(sentinel).expect("proxy"))
            .collect();
        let load = Load {
            target_per_worker: proxies
                .iter()
                .map(|p| Target::Sentinels(vec![p.url()]))
                .collect(),
            sync_replicas: sync,
            tasks: 3,
            ttl: (1_000, 3_000),
            long_work: 600,
            wait: (1_000, 6_000),
            fixed_leases: true,
            response_timeout: 500,
        };
        let mut run = Run::start(case, seed, &oracle, &load);
        thread::sleep(run.rng.ms(800, 2_000));
        let old = g.master_port().unwrap();
        let busy = until_busy(old, &run.key, Duration::from_secs(5));
        // A random non-empty subset of the workers goes deaf.
        let mut stalled = 0;
        let mask = run.rng.range(1, 7);
        for (i, p) in proxies.iter().enumerate() {
            if mask & (1 << i) != 0 {
                stalled += p.stall_existing();
            }
        }
        run.event(format!(
            "half-open: {stalled} sentinel connections of workers {mask:03b} (lock busy: {busy})"
        ));
        thread::sleep(run.rng.ms(0, 1_500));
        g.failover().expect("SENTINEL FAILOVER");
        let switched = run.event("SENTINEL FAILOVER done");
        let served = run.until_served(switched, 3, Duration::from_secs(30));
        run.until_elapsed(switched, AFTER_SWITCH);
        let o = run.finish();
        let text = format!(
            "seed {seed}: {stalled} connections half-open, then SENTINEL FAILOVER: {}; 3 \
             sections completed {} after the switch",
            o.summary(),
            served.map_or("NEVER (30 s)".into(), |d| format!(
                "{:.0} ms",
                d.as_secs_f64() * 1e3
            ))
        );
        println!("{case}: {text}");
        for w in &o.workers {
            println!("{case}:   {w}");
        }
        let mut v = if sync {
            strict(&o)
        } else {
            window_only(&o, switched)
        };
        if served.is_none() {
            v.push("locks were not served again after the switch".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(case, lines.join(" | "));
    assert_all(case, failures);
}

#[test]
#[ignore = "chaos: half-open Sentinel connections and a failover; run with cargo xtask chaos"]
fn chaos_topology_half_open_sentinels_sync() {
    half_open_sentinels("chaos_topology_half_open_sentinels_sync", true, [41, 42]);
}

#[test]
#[ignore = "chaos: half-open Sentinel connections and a failover; run with cargo xtask chaos"]
fn chaos_topology_half_open_sentinels() {
    half_open_sentinels("chaos_topology_half_open_sentinels", false, [43, 44]);
}

#[derive(Debug, Clone, Copy)]
enum Stall {
    Subscribers,
    Commands,
}

/// Standalone Redis, every worker behind its own proxy; the test stalls (half-open) the
/// pub/sub connections or the command connections of random workers, many times.
fn half_open_standalone(case: &str, what: Stall, default_seeds: [u64; 2]) {
    let server = RedisServer::start().expect("lock server");
    let oracle = RedisServer::start().expect("oracle");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds(default_seeds) {
        let proxies: Vec<FaultProxy> = (0..3)
            .map(|_| FaultProxy::in_front_of(&server).expect("proxy"))
            .collect();
        let load = Load {
            target_per_worker: proxies.iter().map(|p| Target::Url(p.url())).collect(),
            sync_replicas: false,
            tasks: 3,
            ttl: (500, 2_000),
            long_work: 500,
            wait: (500, 4_000),
            fixed_leases: true,
            response_timeout: 300,
        };
        let mut run = Run::start(case, seed, &oracle, &load);
        let end = Instant::now() + Duration::from_secs(6);
        let mut stalls = 0;
        while Instant::now() < end {
            thread::sleep(run.rng.ms(200, 1_000));
            let w = run.rng.range(0, 2) as usize;
            let n = match what {
                Stall::Subscribers => proxies[w].stall_subscribers(),
                Stall::Commands => proxies[w].stall_commands(),
            };
            stalls += n;
            run.event(format!("w{w}: {n} {what:?} connections half-open"));
        }
        let calm = run.event("faults end");
        let served = run.until_served(calm, 3, Duration::from_secs(20));
        let o = run.finish();
        let text = format!(
            "seed {seed}: {stalls} {what:?} connections stalled over 6 s: {}; served after: {}",
            o.summary(),
            served.map_or("NEVER (20 s)".into(), |d| format!(
                "{:.0} ms",
                d.as_secs_f64() * 1e3
            ))
        );
        println!("{case}: {text}");
        for w in &o.workers {
            println!("{case}:   {w}");
        }
        let mut v = strict(&o);
        if served.is_none() {
            v.push("locks were not served again after the faults".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(case, lines.join(" | "));
    assert_all(case, failures);
}

#[test]
#[ignore = "chaos: half-open subscriber connections; run with cargo xtask chaos"]
fn chaos_topology_half_open_subscribers() {
    half_open_standalone(
        "chaos_topology_half_open_subscribers",
        Stall::Subscribers,
        [51, 52],
    );
}

#[test]
#[ignore = "chaos: half-open command connections; run with cargo xtask chaos"]
fn chaos_topology_half_open_masters() {
    half_open_standalone(
        "chaos_topology_half_open_masters",
        Stall::Commands,
        [61, 62],
    );
}

// ---- Redis restarted without persistence -------------------------------------------------------

/// Standalone Redis without persistence, killed and restarted (empty) while a section runs,
/// three times per seed.
#[test]
#[ignore = "chaos: Redis restarted without persistence mid-section; run with cargo xtask chaos"]
fn chaos_topology_restart_without_persistence() {
    let case = "chaos_topology_restart_without_persistence";
    let mut server = RedisServer::start().expect("lock server");
    let oracle = RedisServer::start().expect("oracle");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds([71, 72]) {
        let load = Load {
            target_per_worker: vec![Target::Url(server.url()); 3],
            sync_replicas: false,
            tasks: 3,
            ttl: (600, 2_000),
            long_work: 800,
            wait: (500, 4_000),
            fixed_leases: true,
            response_timeout: 300,
        };
        let mut run = Run::start(case, seed, &oracle, &load);
        let mut restarts = Vec::new();
        for _ in 0..3 {
            thread::sleep(run.rng.ms(300, 1_200));
            let busy = until_busy(server.port(), &run.key, Duration::from_secs(5));
            run.event(format!("restart: killed (lock busy: {busy})"));
            let t = Instant::now();
            server.restart().expect("restart");
            restarts.push(t.elapsed());
            run.event("restart: up again, empty");
        }
        let back = run.event("faults end");
        let served = run.until_served(back, 3, Duration::from_secs(20));
        let o = run.finish();
        let cut = o
            .overlaps
            .iter()
            .filter(|ov| {
                ov.reported
                    .as_deref()
                    .is_some_and(|r| r.starts_with("lost "))
            })
            .count();
        let text = format!(
            "seed {seed}: 3 restarts (down {:.0}-{:.0} ms): {}; {} overlaps, each of a section \
             the restart hit, {cut} of them reported lost; served after: {}",
            restarts.iter().min().unwrap().as_secs_f64() * 1e3,
            restarts.iter().max().unwrap().as_secs_f64() * 1e3,
            o.summary(),
            o.overlaps.len(),
            served.map_or("NEVER (20 s)".into(), |d| format!(
                "{:.0} ms",
                d.as_secs_f64() * 1e3
            ))
        );
        println!("{case}: {text}");
        for w in &o.workers {
            println!("{case}:   {w}");
        }
        let mut v = revoked_only(&o, "restart", None, None);
        if served.is_none() {
            v.push("locks were not served again after the restarts".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(case, lines.join(" | "));
    assert_all(case, failures);
}

// ---- force_unlock during sections ------------------------------------------------------------

/// An operator in the test process calls `force_unlock` while sections run (5 times per
/// seed): the lock goes to the next waiter, the old holder is revoked within milliseconds
/// (an overlap of at most 300 ms, the bound `tests/semantics/force_revoke.rs` asserts) and reported lost.
#[test]
#[ignore = "chaos: force_unlock during sections; run with cargo xtask chaos"]
fn chaos_topology_force_unlock() {
    let case = "chaos_topology_force_unlock";
    force_unlock_case(case, &seeds([81, 82]), 5);
}

fn force_unlock_case(case: &str, seeds: &[u64], unlocks: usize) {
    let server = RedisServer::start().expect("lock server");
    let oracle = RedisServer::start().expect("oracle");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let operator = rt
        .block_on(Locker::connect(&server.url()))
        .expect("operator");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for &seed in seeds {
        let load = Load {
            target_per_worker: vec![Target::Url(server.url()); 3],
            sync_replicas: false,
            tasks: 3,
            ttl: (2_000, 10_000),
            long_work: 800,
            wait: (1_000, 6_000),
            fixed_leases: true,
            response_timeout: 500,
        };
        let mut run = Run::start(case, seed, &oracle, &load);
        let mut freed = 0;
        for _ in 0..unlocks {
            thread::sleep(run.rng.ms(200, 900));
            let busy = until_busy(server.port(), &run.key, Duration::from_secs(5));
            let t = run.event(format!("force_unlock (lock busy: {busy})"));
            let was = rt
                .block_on(operator.force_unlock(&run.key))
                .expect("force_unlock");
            freed += usize::from(was);
            run.event(format!(
                "force_unlock answered after {:.1} ms: {}",
                ms_of(history::mono_ns() - t),
                if was { "freed" } else { "was free" }
            ));
        }
        let last = run.event("faults end");
        let served = run.until_served(last, 3, Duration::from_secs(20));
        let o = run.finish();
        let text = format!(
            "seed {seed}: {freed} of {unlocks} force_unlock calls freed a held lock: {}; \
             {} overlaps (revoked holder still inside), longest {:.1} ms; served after: {}",
            o.summary(),
            o.overlaps.len(),
            o.max_overlap_ms(),
            served.map_or("NEVER (20 s)".into(), |d| format!(
                "{:.0} ms",
                d.as_secs_f64() * 1e3
            ))
        );
        println!("{case}: {text}");
        for w in &o.workers {
            println!("{case}:   {w}");
        }
        let mut v = revoked_only(&o, "force_unlock", Some(ms(300)), None);
        if served.is_none() {
            v.push("locks were not served again after the forced unlocks".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(case, lines.join(" | "));
    assert_all(case, failures);
}

// ---- shutdown of one worker process ----------------------------------------------------------

/// One worker process shuts its locker down while one of its tasks holds the lock and another
/// waits (or, every other seed, while its tasks only wait), and exits; the others take over within a hand-off (ttls 5-10 s, a third of the
/// `acquire` calls with a fixed lease), nothing of the departed locker is left in Redis, and
/// the history stays clean.
#[test]
#[ignore = "chaos: shutdown of a worker process under load; run with cargo xtask chaos"]
fn chaos_topology_shutdown_one_process() {
    let case = "chaos_topology_shutdown_one_process";
    let server = RedisServer::start().expect("lock server");
    let oracle = RedisServer::start().expect("oracle");
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    for seed in seeds(91..=96) {
        // Odd seeds: one task inside and two waiting; even seeds: tasks only waiting, so the
        // cancelled waits are all shutdown has to clean up.
        let waiting_only = seed % 2 == 0;
        let load = Load {
            target_per_worker: vec![Target::Url(server.url()); 3],
            sync_replicas: false,
            tasks: 3,
            ttl: (5_000, 10_000),
            long_work: 400,
            wait: (2_000, 8_000),
            fixed_leases: true,
            response_timeout: 500,
        };
        let mut run = Run::start(case, seed, &oracle, &load);
        thread::sleep(run.rng.ms(500, 1_500));
        let w = run.rng.range(0, 2) as usize;
        let departed = run.workers[w].pid();
        run.event(format!("shutdown of worker {w} (pid {departed}) asked"));
        run.workers[w].send(if waiting_only {
            "shutdown-waiting"
        } else {
            "shutdown"
        });
        let line = run.workers[w].expect_line(Duration::from_secs(30));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], "@shutdown", "{line}");
        let (before, after): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        run.events.push((before, "shutdown: called".into()));
        run.events.push((after, "shutdown: returned".into()));
        let served = run.until_served(after, 3, Duration::from_secs(20));
        let o = run.finish();
        // Takeover: the first section of another process that started after the shutdown
        // began.
        let takeover = o
            .sections
            .iter()
            .filter(|s| s.pid != departed && s.acquired > before)
            .map(|s| s.acquired)
            .min();
        let flags = |k: &str| {
            f.iter()
                .find_map(|x| x.strip_prefix(k))
                .unwrap_or("?")
                .to_owned()
        };
        let text = format!(
            "seed {seed}: shutdown with {} task(s) inside and {} waiting took {:.1} ms; \
             queue places left {}, lock left {}; another process inside {} after shutdown \
             began; {}; {} overlaps of a revoked section of the departed process, longest \
             {:.1} ms",
            flags("inside="),
            flags("waiting="),
            ms_of(after - before),
            flags("queued_left="),
            flags("held_left="),
            takeover.map_or("NEVER".into(), |t| format!("{:.1} ms", ms_of(t - before))),
            o.summary(),
            o.overlaps.len(),
            o.max_overlap_ms()
        );
        println!("{case}: {text}");
        for w in &o.workers {
            println!("{case}:   {w}");
        }
        // Shutdown revokes the sections that hold a lock (README: they "see their lock
        // lost"), like a forced unlock: the next holder may start while a revoked body
        // finishes the step it is in. Allowed only for the departed process's sections,
        // reported lost, for at most 300 ms; anything else is a failure.
        let mut v = revoked_only(&o, "shutdown: called", Some(ms(300)), Some(departed));
        if flags("queued_left=") != "0" || flags("held_left=") != "false" {
            v.push(format!("the departed locker left state in Redis: {line}"));
        }
        if flags("busy=") != "1" {
            v.push(format!(
                "the worker never was in the state to shut down in ({}): {line}",
                if waiting_only {
                    "waiting, nothing held"
                } else {
                    "holding and waiting"
                }
            ));
        }
        // A hand-off, not the 2 s grant lease of a departed waiter, nor a ttl.
        match takeover {
            Some(t) if t - before < 1_000_000_000 => {}
            _ => v.push("no other process took over within 1 s of the shutdown".into()),
        }
        if served.is_none() {
            v.push("locks were not served again after the shutdown".into());
        }
        if !v.is_empty() {
            failures.push(o.failure(&v));
        }
        lines.push(text);
    }
    figure(case, lines.join(" | "));
    assert_all(case, failures);
}

// ---- the new proxy fault ---------------------------------------------------------------------

/// `FaultProxy::stall_subscribers` stalls pub/sub connections only, `stall_commands` the rest.
#[test]
fn proxy_stalls_subscribers_or_commands_only() {
    let server = RedisServer::start().unwrap();
    let proxy = FaultProxy::in_front_of(&server).unwrap();
    let client = redis::Client::open(proxy.url()).unwrap();
    let mut cmd = client.get_connection().unwrap();
    cmd.set_read_timeout(Some(ms(300))).unwrap();
    let mut sub = client.get_connection().unwrap();
    sub.set_read_timeout(Some(ms(300))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("chan").unwrap();
    assert_eq!(proxy.stall_subscribers(), 1);
    let mut publisher = server.client().get_connection().unwrap();
    let _: i64 = redis::cmd("PUBLISH")
        .arg("chan")
        .arg("x")
        .query(&mut publisher)
        .unwrap();
    assert!(
        ps.get_message().is_err(),
        "a stalled subscriber heard a message"
    );
    let pong: String = redis::cmd("PING").query(&mut cmd).unwrap();
    assert_eq!(pong, "PONG");
    assert_eq!(proxy.stall_commands(), 1);
    assert!(redis::cmd("PING").query::<String>(&mut cmd).is_err());
}
