//! The lock kinds under a randomized schedule: worker processes, each with its own `Locker`
//! behind its own `FaultProxy`, run readers and writers of one read-write key and holders of a
//! semaphore of 3 permits on another key, with random ttls (fixed ones too), waits, bodies and
//! cancellations, while the test delays, drops, resets and partitions their traffic and
//! freezes whole workers (SIGSTOP, often past their ttl). The kinds checker
//! (`support::kinds`) with its fenced oracle on a second redis-server decides: no writer
//! overlaps another holder, readers overlap only readers, never more than 3 permit holders,
//! fences in order, no stale read or write accepted, no lost update.
//!
//! `chaos_kinds_quick` runs with every `cargo test`; `chaos_kinds_long` in `cargo xtask
//! chaos`. `LOCKRT_CHAOS_SEED=<seed>` runs only that seed (the same faults, not the same
//! interleaving).

mod support;

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use lockrt::testing::{Direction, FaultProxy, RedisServer};
use lockrt::{LockOptions, Locker};
use support::history::{
    self, Log, Outcome, Recorder, Rng, Section, Stall, Stalls, Worker, mono_ns,
};
use support::kinds::{self, Kind, Oracle};

const RW_KEY: &str = "kinds:rw";
const SEM_KEY: &str = "kinds:sem";
const PERMITS: u32 = 3;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn seeds(default: impl IntoIterator<Item = u64>) -> Vec<u64> {
    match std::env::var("LOCKRT_CHAOS_SEED") {
        Ok(s) => vec![s.trim().parse().expect("LOCKRT_CHAOS_SEED is a number")],
        Err(_) => default.into_iter().collect(),
    }
}

/// A short run for every `cargo test`: one seed, 2 workers, 4 s.
#[test]
fn chaos_kinds_quick() {
    run_seeds(&seeds([1]), 2, Duration::from_secs(4));
}

/// The long run: 2 seeds, 3 workers, 12 s each.
#[test]
#[ignore = "chaos: run with cargo xtask chaos"]
fn chaos_kinds_long() {
    run_seeds(&seeds([21, 22]), 3, Duration::from_secs(12));
}

/// A seed's checked history, with the stalls and faults the schedule inflicted.
type SeedResult = (kinds::Report, Vec<Section>, Vec<Stall>, Vec<String>);

fn run_seeds(seeds: &[u64], workers: usize, secs: Duration) {
    let lock_server = RedisServer::start().expect("lock redis-server");
    let oracle_server = RedisServer::start().expect("oracle redis-server");
    let mut failures = Vec::new();
    for &seed in seeds {
        let (rep, sections, stalls, faults) =
            run_seed(seed, workers, secs, &lock_server, &oracle_server);
        println!("seed {seed}: faults: {}", faults.join(", "));
        println!(
            "FIGURE chaos_kinds seed {seed}: {workers} workers x {secs:?}, {} faults ({} stops): {}",
            faults.len(),
            stalls.len(),
            rep.summary()
        );
        let mut v = rep.violations();
        if rep.completed.contains(&0) {
            v.push(format!("a kind never completed: {:?}", rep.completed));
        }
        if !v.is_empty() {
            failures.push(format!(
                "seed {seed} FAILED (replay: LOCKRT_CHAOS_SEED={seed}):\n  {}\ntimeline:\n{}",
                v.join("\n  "),
                history::timeline(&sections, &stalls, 200)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

fn run_seed(
    seed: u64,
    n: usize,
    secs: Duration,
    lock_server: &RedisServer,
    oracle_server: &RedisServer,
) -> SeedResult {
    let dir = scratch_dir(seed);
    let ns = format!("k{seed}-{}", mono_ns());
    let proxies: Vec<FaultProxy> = (0..n)
        .map(|_| FaultProxy::in_front_of(lock_server).expect("proxy"))
        .collect();
    let workers: Vec<Worker> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            Worker::spawn(
                "worker",
                &[
                    ("url", p.url()),
                    ("oracle", oracle_server.url()),
                    ("ns", ns.clone()),
                    ("log", dir.join(format!("w{i}.log")).display().to_string()),
                    ("seed", (seed * 1000 + i as u64).to_string()),
                    ("ms", secs.as_millis().to_string()),
                ],
                dir.join(format!("w{i}.out")),
            )
        })
        .collect();
    let stalls = Stalls::default();
    let faults = inject(&mut Rng::new(seed), &proxies, &workers, &stalls, secs);
    for w in workers {
        let out = w.join(secs + Duration::from_secs(40));
        for l in out
            .lines()
            .filter_map(|l| l.find("WORKER").map(|i| &l[i..]))
        {
            println!("seed {seed}:   {l}");
        }
    }
    let sections = history::load(&dir);
    let state = Oracle::connect(&oracle_server.url(), &ns).state();
    let stalls = stalls.all();
    let report = kinds::check(&sections, &stalls, state);
    let _ = std::fs::remove_dir_all(&dir);
    (report, sections, stalls, faults)
}

/// The schedule: one fault at a time, at random moments, on a random worker; stops last up
/// to 1.5 s, past most ttls.
fn inject(
    rng: &mut Rng,
    proxies: &[FaultProxy],
    workers: &[Worker],
    stalls: &Stalls,
    secs: Duration,
) -> Vec<String> {
    let mut faults = Vec::new();
    let end = Instant::now() + secs;
    while Instant::now() + ms(300) < end {
        thread::sleep(rng.ms(20, 250));
        let w = rng.range(0, proxies.len() as u64 - 1) as usize;
        let p = &proxies[w];
        let hold = rng.ms(50, 900);
        let dir = if rng.chance(50) {
            Direction::ToClient
        } else {
            Direction::ToServer
        };
        let fault = match rng.range(0, 7) {
            0 => {
                let d = rng.ms(10, 700);
                p.delay(dir, d);
                format!("delay {dir:?} {d:?}")
            }
            1 => {
                p.drop_replies(rng.range(1, 2));
                "drop".into()
            }
            2 | 3 => {
                workers[w].stall(rng.ms(10, 1_500), stalls);
                "stop".into()
            }
            4 => {
                p.reset_all();
                "reset".into()
            }
            5 => {
                p.blackhole();
                "partition".into()
            }
            6 => {
                p.reset_on_next(dir);
                format!("rst-next {dir:?}")
            }
            _ => "quiet".into(),
        };
        thread::sleep(hold);
        p.pass();
        faults.push(format!("w{w}:{fault}"));
    }
    for p in proxies {
        p.pass();
    }
    faults
}

fn scratch_dir(seed: u64) -> PathBuf {
    let name = format!(
        "lockrt-chaos-kinds-{}-{seed}-{}",
        std::process::id(),
        mono_ns()
    );
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// Callers per worker process: of the read-write key, then of the semaphore.
const RW_CALLERS: u64 = 3;
const SEM_CALLERS: u64 = 3;

/// One worker process: readers, writers and permit holders until its time is up.
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
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let seed: u64 = get("seed").parse().unwrap();
    let run_for = ms(get("ms").parse().unwrap());
    let log = Log::create(get("log").as_ref());
    let (url, oracle_url, ns) = (get("url"), get("oracle"), get("ns"));
    let tallies = rt.block_on(async {
        let locker = connect(&url, &mut Rng::new(seed)).await;
        let end = tokio::time::Instant::now() + run_for;
        let callers: Vec<_> = (0..RW_CALLERS + SEM_CALLERS)
            .map(|c| {
                let c = Caller {
                    locker: locker.clone(),
                    oracle: Oracle::connect(&oracle_url, &ns),
                    log: log.clone(),
                    rng: Rng::new(seed.wrapping_mul(31).wrapping_add(c)),
                    sem: c >= RW_CALLERS,
                };
                tokio::spawn(c.until(end))
            })
            .collect();
        let mut tallies = Vec::new();
        for c in callers {
            tallies.push(c.await.unwrap().0);
        }
        tallies
    });
    drop(rt);
    println!("WORKER {} {tallies:?}", std::process::id());
}

/// Connects through the proxy, which may be misbehaving right now (bounded retries).
async fn connect(url: &str, rng: &mut Rng) -> Locker {
    for _ in 0..50 {
        let b = Locker::builder().url(url).connect_timeout(ms(300));
        if let Ok(l) = b.response_timeout(rng.ms(100, 400)).build().await {
            return l;
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("could not connect through the proxy {url}");
}

/// One caller in a worker: of the semaphore, or of the read-write key (readers mostly).
struct Caller {
    locker: Locker,
    oracle: Oracle,
    log: Log,
    rng: Rng,
    sem: bool,
}

impl Caller {
    async fn until(mut self, end: tokio::time::Instant) -> Tally {
        let mut tally = Tally::default();
        while tokio::time::Instant::now() < end {
            let kind = if self.sem {
                Kind::Permits(PERMITS)
            } else if self.rng.chance(35) {
                Kind::Exclusive
            } else {
                Kind::Read
            };
            self.once(kind, &mut tally).await;
            tokio::time::sleep(self.rng.ms(0, 20)).await;
        }
        tally
    }

    /// One use with random options, body and cancellation; every call is bounded.
    async fn once(&mut self, kind: Kind, tally: &mut Tally) {
        let rng = &mut self.rng;
        let fixed = rng.chance(25);
        let ttl = if fixed {
            ms(1_000)
        } else {
            ms([200, 500, 1_000][rng.range(0, 2) as usize])
        };
        let wait = if rng.chance(20) {
            Duration::ZERO
        } else {
            rng.ms(0, 1_500)
        };
        // Mostly short bodies; some outlive a renewal or two (or a fixed lease).
        let work = if rng.chance(20) {
            rng.ms(0, ttl.as_millis() as u64 * 3 / 2)
        } else {
            rng.ms(0, 40)
        };
        let opts = kind.options().ttl(ttl).wait(wait).watchdog(!fixed);
        let cancel = rng.chance(25).then(|| rng.ms(0, 1_200));
        let style = rng.range(0, 2);
        let key = if self.sem { SEM_KEY } else { RW_KEY };
        let op = one_op(
            &self.locker,
            key,
            (kind, opts),
            style,
            work,
            &mut self.oracle,
            &self.log,
        );
        let bound = cancel.unwrap_or(wait + ttl * 4 + work + Duration::from_secs(5));
        match tokio::time::timeout(bound, op).await {
            Ok(Ok(o)) => tally.count(o),
            Ok(Err(e)) if e.is_timeout() => tally.bump("timeout"),
            Ok(Err(e)) if e.is_lost() => tally.bump("lost"),
            Ok(Err(e)) if e.is_backend() => tally.bump("backend"),
            Ok(Err(e)) => panic!("unexpected error: {e:?}"),
            Err(_) if cancel.is_some() => tally.bump("cancelled"),
            Err(_) => panic!("a call did not finish within {bound:?} ({kind}, ttl {ttl:?})"),
        }
    }
}

fn is_lost(guard: Option<&lockrt::LockGuard>) -> bool {
    guard.is_some_and(|g| g.is_lost())
}

/// The body's `await`: `false` if the guard said the lease was lost meanwhile. Without a
/// guard (inside `run`) the runtime is trusted to cut the body short.
async fn work_for(work: Duration, guard: Option<&lockrt::LockGuard>) -> bool {
    match guard {
        Some(g) => tokio::select! {
            () = tokio::time::sleep(work) => true,
            () = g.lost() => false,
        },
        None => {
            tokio::time::sleep(work).await;
            true
        }
    }
}

/// A section in progress; a permit holder leaves the oracle's count when it is dropped,
/// however the body ends, before the record is written.
struct Inside<'a, 'o> {
    o: &'o mut Oracle,
    r: Recorder<'a>,
}

impl Drop for Inside<'_, '_> {
    fn drop(&mut self) {
        if matches!(self.r.s.kind, Kind::Permits(_)) && self.r.s.claimed != 0 {
            self.o.leave();
            self.r.s.left = mono_ns();
        }
    }
}

impl Inside<'_, '_> {
    /// The step before the `await` (see `support::kinds`): a writer's claim and read, a
    /// reader's fenced read, a permit holder's entry. `None`: stale.
    fn first(&mut self) -> Option<i64> {
        let fence = self.r.s.fence;
        let s = &mut self.r.s;
        let v = match s.kind {
            Kind::Exclusive => {
                let ok = self.o.write_claim(fence);
                (s.claimed, s.claim) = (mono_ns(), Some(ok));
                if !ok {
                    return None;
                }
                self.o.get()
            }
            Kind::Read => {
                let v = self.o.read(fence);
                (s.claimed, s.claim) = (mono_ns(), Some(v.is_some()));
                v?
            }
            Kind::Permits(_) => {
                let v = self.o.enter();
                (s.claimed, s.claim, s.extra) = (mono_ns(), Some(true), Some(v));
                return Some(v);
            }
        };
        (s.read, s.read_value) = (mono_ns(), Some(v));
        Some(v)
    }

    /// The step after the `await`: a writer's write, a reader's second fenced read (`false`
    /// if stale), a permit holder counted done.
    fn last(&mut self, first: i64) -> bool {
        let s = &mut self.r.s;
        let ok = match s.kind {
            Kind::Exclusive => {
                self.o.set(first + 1);
                true
            }
            Kind::Read => {
                s.extra = self.o.read(s.fence);
                s.extra.is_some()
            }
            Kind::Permits(_) => {
                self.o.cmd("INCR", "done");
                true
            }
        };
        (s.end, s.completed) = (mono_ns(), ok);
        ok
    }
}

/// One section of `kind`. With a guard (the `acquire` style), the body checks `is_lost()`
/// before each step and stops when `lost()` fires; inside `run` the runtime must cut it short.
async fn body(
    kind: Kind,
    o: &mut Oracle,
    log: &Log,
    fence: u64,
    work: Duration,
    guard: Option<&lockrt::LockGuard>,
) -> Outcome {
    let (pid, acquired) = (std::process::id(), mono_ns());
    let s = Section {
        pid,
        fence,
        kind,
        acquired,
        ..Section::default()
    };
    let mut p = Inside {
        r: Recorder { log, s },
        o,
    };
    if is_lost(guard) {
        return Outcome::Lost;
    }
    let Some(first) = p.first() else {
        return Outcome::Stale;
    };
    if !work_for(work, guard).await {
        return Outcome::Lost;
    }
    p.r.s.wake = mono_ns();
    if is_lost(guard) {
        return Outcome::Lost;
    }
    if p.last(first) {
        Outcome::Completed
    } else {
        Outcome::Stale
    }
}

/// One use of the lock: `run` (0), `acquire` + guard (1) or `try_acquire` + guard (2).
async fn one_op(
    locker: &Locker,
    key: &str,
    (kind, opts): (Kind, LockOptions),
    style: u64,
    work: Duration,
    oracle: &mut Oracle,
    log: &Log,
) -> Result<Option<Outcome>, lockrt::LockError> {
    let g = match style {
        0 => {
            let section = async {
                let fence = lockrt::current_lock().expect("inside run").fence();
                body(kind, oracle, log, fence, work, None).await
            };
            return locker.run(key, opts, section).await.map(Some);
        }
        1 => locker.acquire(key, opts).await?,
        _ => match locker.try_acquire(key, opts).await? {
            Some(g) => g,
            None => return Ok(None),
        },
    };
    let o = body(kind, oracle, log, g.fence(), work, Some(&g)).await;
    let _ = g.release().await;
    Ok(Some(o))
}

/// How a worker's calls ended, by name.
#[derive(Debug, Default)]
struct Tally(std::collections::BTreeMap<&'static str, u32>);

impl Tally {
    fn bump(&mut self, what: &'static str) {
        *self.0.entry(what).or_default() += 1;
    }

    fn count(&mut self, o: Option<Outcome>) {
        self.bump(match o {
            Some(Outcome::Completed) => "completed",
            Some(Outcome::Stale) => "stale",
            Some(Outcome::Lost) => "lost_in_body",
            None => "busy",
        });
    }
}

// ---- the kinds checker must be able to fail ------------------------------------------------

/// A completed section of `kind` over `span`.
fn sec(pid: u32, kind: Kind, fence: u64, span: (u64, u64)) -> Section {
    let permit = matches!(kind, Kind::Permits(_));
    Section {
        pid,
        fence,
        kind,
        acquired: span.0,
        claimed: span.0 + 1,
        wake: span.1 - 1,
        end: span.1,
        claim: Some(true),
        read_value: (!permit).then_some(0),
        extra: Some(i64::from(permit)),
        completed: true,
        ..Section::default()
    }
}

fn check(h: &[Section], stalls: &[Stall]) -> kinds::Report {
    kinds::check(h, stalls, kinds::State::default())
}

#[test]
fn kinds_checker_lets_readers_share_and_fails_a_writer_among_them() {
    let mut h = vec![
        sec(1, Kind::Read, 64, (100, 300)),
        sec(2, Kind::Read, 96, (150, 250)),
    ];
    let r = check(&h, &[]);
    assert!(
        r.overlaps.is_empty() && r.max_readers == 2,
        "{:?}",
        r.violations()
    );
    h.push(sec(3, Kind::Exclusive, 128, (200, 400)));
    assert_eq!(check(&h, &[]).overlaps.len(), 2);
    // A reader below a writer that started before it: both its reads were stale.
    let h = [
        sec(3, Kind::Exclusive, 128, (100, 200)),
        sec(1, Kind::Read, 96, (300, 400)),
    ];
    let r = check(&h, &[]);
    assert_eq!((r.fence_order.len(), r.stale_reads_accepted.len()), (1, 2));
    // A reader whose two reads differ.
    let mut changed = sec(1, Kind::Read, 64, (100, 300));
    changed.extra = Some(1);
    assert_eq!(check(&[changed], &[]).changed_under_reader.len(), 1);
}

#[test]
fn kinds_checker_fails_a_fourth_permit_unless_a_holder_was_frozen_inside() {
    let p = Kind::Permits(3);
    let h: Vec<Section> = (0..4u32)
        .map(|i| {
            sec(
                i + 1,
                p,
                32 * u64::from(i + 1),
                (100 + u64::from(i) * 10, 500),
            )
        })
        .collect();
    let r = check(&h, &[]);
    assert_eq!(
        (r.max_permits, r.over_limit.len()),
        (4, 1),
        "{:?}",
        r.violations()
    );
    // Holder 1 frozen inside its last step: the fourth is excused.
    let frozen = [Stall {
        pid: 1,
        stop: 499,
        cont: 499,
    }];
    let r = check(&h, &frozen);
    assert_eq!((r.over_limit.len(), r.excused_over_limit), (0, 1));
    let h = [sec(1, p, 32, (100, 200)), sec(2, p, 32, (300, 400))];
    assert_eq!(check(&h, &[]).fence_order.len(), 1, "same permit fence");
}
