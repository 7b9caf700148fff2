//! The worker process of `tests/chaos_kinds.rs`: callers of the read-write key (readers
//! mostly), of the semaphore, and of several exclusive keys at once (`acquire_all`, sometimes
//! with the read-write key as a writer), each section recorded for `support::kinds`, and what
//! each caller was told about its section recorded for the restart schedule's check.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockrt::{LockOptions, Locker, MultiGuard};

use crate::support::history::{self, KeyPart, Log, Outcome, Recorder, Rng, Section, mono_ns};
use crate::support::kinds::oracle::Oracle;
use crate::support::kinds::{Kind, Told, multi};

const RW_KEY: &str = "kinds:rw";
const SEM_KEY: &str = "kinds:sem";
const PERMITS: u32 = 3;
/// The exclusive keys of multi-key sections by oracle name; the lock key is `kinds:<name>`.
pub(crate) const MULTI_KEYS: [&str; 4] = ["m0", "m1", "m2", "m3"];

/// Callers per worker process: of the read-write key, of the semaphore, of several keys.
const RW_CALLERS: u64 = 3;
const SEM_CALLERS: u64 = 3;
const MULTI_CALLERS: u64 = 2;
/// The generator's callers of the hot key and of the key that changes kind, per worker.
const HOT_CALLERS: u64 = 3;
const SHIFT_CALLERS: u64 = 2;

/// The generator's hot key: exclusive sections of a few ms, so that the callers of one worker
/// pass it on to each other (local hand-off chains), also while the server is stopped.
const HOT_KEY: &str = "kinds:hot";
/// The generator's key that changes kind: used as a semaphore of [`PERMITS`], as a lock and
/// as a read-write lock, in turns ([`shift_kind`]).
const SHIFT_KEY: &str = "kinds:shift";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One worker process: readers, writers, permit holders and multi-key holders until its time
/// is up. Settings: see `run_seed` in `tests/chaos_kinds.rs`.
pub(crate) fn main() {
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
    let told = Verdicts::create(get("told").as_ref());
    let cancel = get("cancel") == "1";
    // The interaction generator: options, nesting, forced unlocks, an `every()` job, and a
    // `shutdown()` at the end, each recorded for `support::mix`.
    let events = cfg.get("events").map(|p| Log::create(p.as_ref()));
    log_to(events.clone());
    // The generator's worker that only runs the job, and dies inside a tick it runs once
    // `die_ms` have passed (rule 9: the tick is run late elsewhere or reported).
    let die = cfg.get("die_ms").map(|d| ms(d.parse().unwrap()));
    let (url, oracle_url, ns) = (get("url"), get("oracle"), get("ns"));
    let tallies = rt.block_on(async {
        let (locker, response) = connect(&url, &mut Rng::new(seed)).await;
        let end = tokio::time::Instant::now() + run_for;
        // One worker of the generator shuts its locker down while its callers run (the
        // others at the end): sections in flight see `Lost`, later calls `ShutDown`.
        if let (Some(at), true) = (cfg.get("shutdown_ms"), events.is_some()) {
            let (locker, at) = (locker.clone(), ms(at.parse().unwrap()));
            let ev = events.clone();
            tokio::spawn(async move {
                tokio::time::sleep(at).await;
                shut_down(&locker, ev.as_ref()).await;
            });
        }
        let dies = die.map(|d| (tokio::time::Instant::now() + d, seed));
        if let (Some(first), Some(ev)) = (cfg.get("leak"), &events) {
            let first = first.parse().unwrap();
            tokio::spawn(leave_shares(locker.clone(), ev.clone(), first, end));
        }
        let job = events
            .clone()
            .map(|ev| tokio::spawn(job(locker.clone(), ev, dies)));
        // The job's worker has no callers; the generator's others have two roles more.
        let callers = match (&events, die) {
            (_, Some(_)) => 0,
            (None, _) => RW_CALLERS + SEM_CALLERS + MULTI_CALLERS,
            (Some(_), None) => {
                RW_CALLERS + SEM_CALLERS + MULTI_CALLERS + HOT_CALLERS + SHIFT_CALLERS
            }
        };
        let callers: Vec<_> = (0..callers)
            .map(|c| {
                let c = Caller {
                    locker: locker.clone(),
                    oracle: Oracle::connect(&oracle_url, &ns),
                    log: log.clone(),
                    told: told.clone(),
                    rng: Rng::new(seed.wrapping_mul(31).wrapping_add(c)),
                    role: match c {
                        c if c < RW_CALLERS => Role::Rw,
                        c if c < RW_CALLERS + SEM_CALLERS => Role::Sem,
                        c if c < RW_CALLERS + SEM_CALLERS + MULTI_CALLERS => Role::Multi,
                        c if c < RW_CALLERS + SEM_CALLERS + MULTI_CALLERS + HOT_CALLERS => {
                            Role::Hot
                        }
                        _ => Role::Shift,
                    },
                    cancel,
                    events: events.clone(),
                    response,
                };
                tokio::spawn(c.until(end))
            })
            .collect();
        let mut tallies = Vec::new();
        for c in callers {
            tallies.push(c.await.unwrap().0);
        }
        if die.is_some() {
            tokio::time::sleep_until(end).await;
        }
        if let Some(ev) = &events {
            // The job's run in flight, if any, ends with the shutdown.
            shut_down(&locker, Some(ev)).await;
            if let Some(job) = job {
                let _ = tokio::time::timeout(ms(5_000), job).await;
            }
            left_behind(&locker, &get("direct"), ev).await;
        }
        tallies
    });
    drop(rt);
    println!("WORKER {} {tallies:?}", std::process::id());
}

/// `locker.shutdown()`, recorded as `D <pid> <start ns> <end ns>` (`support::mix`).
async fn shut_down(locker: &Locker, ev: Option<&Log>) {
    let start = mono_ns();
    locker.shutdown().await;
    if let Some(ev) = ev {
        ev.append(&format!("D {} {start} {}", std::process::id(), mono_ns()));
    }
}

/// What each caller was told about a section whose body ran: `V <pid> <fence> <verdict>`
/// (the fence of a multi-key section's first key), `lost` when it heard its lock was lost,
/// `cancelled` when it was cancelled before it could hear anything.
#[derive(Clone)]
struct Verdicts(Arc<Mutex<std::fs::File>>);

impl Verdicts {
    fn create(path: &Path) -> Verdicts {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("verdicts file");
        Verdicts(Arc::new(Mutex::new(f)))
    }

    fn write(&self, fence: u64, verdict: &str) {
        let line = format!("V {} {fence} {verdict}\n", std::process::id());
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f.write_all(line.as_bytes()).expect("write verdict");
    }
}

/// The sections whose callers were told `Lost` (from every `*.told` file in `dir`), those
/// whose callers were cancelled before any verdict, and how many sections ended with each
/// verdict (`lost:forced`, `lost:shutdown`: with that cause).
pub(crate) fn load_told(dir: &Path) -> (Told, Told, std::collections::BTreeMap<String, usize>) {
    let (mut told, mut cancelled) = (Told::new(), Told::new());
    let mut verdicts = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir).expect("dir").flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "told") {
            continue;
        }
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [_, pid, fence, verdict] = f[..] else {
                panic!("bad verdict {line:?}")
            };
            *verdicts.entry(verdict.to_owned()).or_insert(0) += 1;
            let section = (pid.parse().unwrap(), fence.parse().unwrap());
            if verdict.starts_with("lost") {
                told.insert(section);
            } else if verdict == "cancelled" {
                cancelled.insert(section);
            }
        }
    }
    (told, cancelled, verdicts)
}

/// Connects through the proxy, which may be misbehaving right now (bounded retries); the
/// locker and its response timeout.
async fn connect(url: &str, rng: &mut Rng) -> (Locker, Duration) {
    for _ in 0..50 {
        let b = Locker::builder().url(url).connect_timeout(CONNECT);
        let response = rng.ms(100, 400);
        if let Ok(l) = b.response_timeout(response).build().await {
            return (l, response);
        }
        tokio::time::sleep(ms(100)).await;
    }
    panic!("could not connect through the proxy {url}");
}

/// The long lease of the permits `leave_shares` takes: a kind record that outlived the last
/// share would refuse the next kinds' callers for that long.
const LONG_TTL: Duration = Duration::from_secs(5);

/// What the key that changes kind is used as now: the same for every worker (the host's
/// monotonic clock), a new kind every 1.2 s: a semaphore, a lock, a read-write lock (readers
/// mostly), a lock, and again.
fn shift_kind(now_ns: u64, rng: &mut Rng) -> Kind {
    match (now_ns / 1_200_000_000) % 4 {
        0 => Kind::Permits(PERMITS),
        2 if rng.chance(70) => Kind::Read,
        _ => Kind::Exclusive,
    }
}

/// The workers' connect timeout.
const CONNECT: Duration = Duration::from_millis(300);

/// The generator's `every()` job: a 250 ms tick, each finished run recorded (`J`). With
/// `dies` (the job's own worker): from that moment on, the first run it gets is its last: it
/// records the tick (`K`) and kills its own process 120-240 ms into the tick, so the claim's
/// lease runs out after the tick's end.
async fn job(locker: Locker, ev: Log, dies: Option<(tokio::time::Instant, u64)>) {
    // Half the workers run it on a fixed lease; every run takes a nested lock.
    let fixed = dies.is_none() && std::process::id().is_multiple_of(2);
    let opts = LockOptions::new().ttl(ms(200)).watchdog(!fixed);
    let l = locker.clone();
    let _ = lockrt::every(&l, JOB, ms(250), opts, |tick| {
        let (ev, locker) = (ev.clone(), locker.clone());
        async move {
            let start = mono_ns();
            let tick_ms = tick
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis();
            if let Some((_, seed)) = dies.filter(|(at, _)| tokio::time::Instant::now() >= *at) {
                let into = ms(Rng::new(seed).range(120, 240));
                ev.append(&format!("K {} {tick_ms} {start}", std::process::id()));
                let left = (tick + into).duration_since(std::time::SystemTime::now());
                tokio::time::sleep(left.unwrap_or_default()).await;
                let me = rustix::process::getpid();
                let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            }
            let fence = lockrt::current_lock().map_or(0, |h| h.fence());
            let inner = LockOptions::new().ttl(ms(500)).wait(Duration::ZERO);
            let _ = locker
                .run(JOB_NESTED, inner, tokio::time::sleep(ms(10)))
                .await;
            tokio::time::sleep(ms(10)).await;
            let flags = if fixed {
                "nesting,fixed_lease"
            } else {
                "nesting"
            };
            ev.append(&format!(
                "J {} {tick_ms} {fence} {start} {} {flags}",
                std::process::id(),
                mono_ns()
            ));
        }
    })
    .await;
}

/// Two workers of the generator, near the end of every other semaphore turn of the key that
/// changes kind (`first`: 0 or 1, which of them), until the run ends: a permit on a long
/// lease, and beside it one on a short fixed lease; the long one is released at once, the
/// short one never (recorded `S … leaked`, as a holder that died would leave it): it runs out
/// on the server after the turn's last permits were released, and the kind record must not
/// outlive it (rule 6: until the long lease would have ended, callers of other kinds would be
/// refused).
async fn leave_shares(locker: Locker, ev: Log, first: u64, end: tokio::time::Instant) {
    let turn = 4 * 1_200_000_000;
    let mut at = (mono_ns() / turn + 1 + first) * turn + 900_000_000;
    let mut kept = Vec::new();
    while tokio::time::Instant::now() + Duration::from_nanos(at - mono_ns()) < end {
        tokio::time::sleep(Duration::from_nanos(at - mono_ns())).await;
        kept.extend(leave_a_share(&locker, &ev).await);
        at += 2 * turn;
    }
    // Never released, not even by a drop: kept until the process ends.
    std::future::pending::<()>().await;
    drop(kept);
}

/// One turn of `leave_shares`: the guard of the permit left unreleased.
async fn leave_a_share(locker: &Locker, ev: &Log) -> Option<lockrt::LockGuard> {
    let sem = Kind::Permits(PERMITS).options().wait(ms(200));
    let pid = std::process::id();
    // The turn's first moments may still see the last turn's holders (`KindConflict`).
    let mut long = None;
    let mut start = 0;
    for _ in 0..30 {
        start = mono_ns();
        if let Ok(g) = locker.acquire(SHIFT_KEY, sem.ttl(LONG_TTL)).await {
            long = Some(g);
            break;
        }
        tokio::time::sleep(ms(20)).await;
    }
    let long = long?;
    let (first, fence) = (mono_ns(), long.fence());
    // Taken while the long one is held: the key's records live as long as the long lease.
    let at = mono_ns();
    let short = locker
        .acquire(SHIFT_KEY, sem.ttl(ms(300)).watchdog(false))
        .await;
    let taken = mono_ns();
    let last = taken;
    let outcome = match long.release().await {
        Ok(()) => "ok",
        Err(_) => "error",
    };
    ev.append(&format!(
        "S {pid} {SHIFT_KEY} {} {start} {} {} {outcome} {first} {last} {fence} 200",
        Kind::Permits(PERMITS),
        mono_ns(),
        LONG_TTL.as_millis()
    ));
    let g = short.ok()?;
    ev.append(&format!(
        "S {pid} {SHIFT_KEY} {} {at} {taken} 300 leaked 0 0 {} 200",
        Kind::Permits(PERMITS),
        g.fence()
    ));
    Some(g)
}

/// Installs the worker's log: with the generator, every WARN of the job about a tick (`G <pid>
/// <from ms> <to ms> <words>`: a tick given up, run by nobody, not known whether run, run late),
/// for rule 9's check; with `LOCKRT_CHAOS_LOG` (diagnosis), the log on stderr (`*.out`), e.g.
/// `lockrt=debug`.
fn log_to(events: Option<Log>) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    let fmt = std::env::var("LOCKRT_CHAOS_LOG").ok().map(|filter| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_filter(tracing_subscriber::EnvFilter::new(filter))
    });
    let ticks =
        events.map(|ev| TickWarnings(ev).with_filter(tracing::level_filters::LevelFilter::WARN));
    let _ = tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(ticks).with(fmt),
    );
}

/// Writes the job's WARN lines about a tick as `G` records (`log_to`).
struct TickWarnings(Log);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for TickWarnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut f = TickFields::default();
        event.record(&mut f);
        if f.job.as_deref() != Some(JOB) {
            return;
        }
        let (from, to) = match (f.tick, f.from, f.to) {
            (Some(t), ..) => (t, t + 1),
            (None, Some(from), Some(to)) => (from, to),
            _ => return,
        };
        let words: Vec<&str> = f.message.split_whitespace().take(4).collect();
        let pid = std::process::id();
        self.0
            .append(&format!("G {pid} {from} {to} {}", words.join("_")));
    }
}

/// The fields of a job's log line that `TickWarnings` reads.
#[derive(Default)]
struct TickFields {
    job: Option<String>,
    tick: Option<u64>,
    from: Option<u64>,
    to: Option<u64>,
    message: String,
}

impl tracing::field::Visit for TickFields {
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        match field.name() {
            "tick" => self.tick = Some(value),
            "from" => self.from = Some(value),
            "to" => self.to = Some(value),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "job" {
            self.job = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

/// The generator's job name.
const JOB: &str = "kinds:job";
/// The lock each run of the job takes inside its tick's section.
const JOB_NESTED: &str = "kinds:job-nested";

/// After `shutdown()`: every lock of the keys this worker used that its locker still holds
/// (`L`), read straight from the server. A claim of a finished tick, kept on purpose, is
/// not held (`released`).
async fn left_behind(locker: &Locker, direct: &str, ev: &Log) {
    let Ok(reader) = Locker::connect(direct).await else {
        return;
    };
    let mine = locker.instance_id().to_string();
    let held = reader.locks("kinds:*").await.unwrap_or_default();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for info in held.iter().filter(|i| !i.released) {
        let lock =
            (info.holder.iter()).map(|h| (h, info.remaining.unwrap_or_default(), info.fence));
        let shares =
            (info.shared.iter()).filter_map(|s| Some((s.holder.as_ref()?, s.remaining, s.fence)));
        for (h, left, fence) in lock.chain(shares).filter(|(h, ..)| h.instance_id == mine) {
            ev.append(&format!(
                "L {} {} fence={fence:?} left={}ms taken={}ms_ago",
                std::process::id(),
                info.key,
                left.as_millis(),
                wall.saturating_sub(h.acquired_at_ms)
            ));
        }
    }
    reader.shutdown().await;
}

/// What a caller takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The read-write key: readers mostly, writers.
    Rw,
    Sem,
    /// 2 or 3 keys at once: exclusive keys, sometimes the read-write key as a writer.
    Multi,
    /// The generator's hot key ([`HOT_KEY`]).
    Hot,
    /// The generator's key that changes kind ([`SHIFT_KEY`]).
    Shift,
}

/// One caller in a worker.
struct Caller {
    locker: Locker,
    oracle: Oracle,
    log: Log,
    told: Verdicts,
    rng: Rng,
    role: Role,
    /// Whether some calls are cancelled (not in the restart schedule: its check needs to know
    /// what every caller was told).
    cancel: bool,
    /// The interaction generator's records (`support::mix`), when it runs.
    events: Option<Log>,
    /// The locker's response timeout, for the bound every call keeps.
    response: Duration,
}

impl Caller {
    async fn until(mut self, end: tokio::time::Instant) -> Tally {
        let mut tally = Tally::default();
        while tokio::time::Instant::now() < end {
            let kind = match self.role {
                Role::Sem => Kind::Permits(PERMITS),
                Role::Multi => Kind::Multi,
                Role::Rw if self.rng.chance(35) => Kind::Exclusive,
                Role::Rw => Kind::Read,
                Role::Hot | Role::Shift => {
                    self.plain(&mut tally).await;
                    tokio::time::sleep(self.rng.ms(0, 10)).await;
                    continue;
                }
            };
            self.once(kind, &mut tally).await;
            tokio::time::sleep(self.rng.ms(0, 20)).await;
        }
        tally
    }

    /// A random set of 2 or 3 keys in a random order; the read-write key in some.
    fn key_set(&mut self) -> Vec<&'static str> {
        let mut keys = MULTI_KEYS.to_vec();
        for i in (1..keys.len()).rev() {
            keys.swap(i, self.rng.range(0, i as u64) as usize);
        }
        keys.truncate(self.rng.range(2, 3) as usize);
        if self.rng.chance(30) {
            keys[0] = multi::RW;
        }
        keys
    }

    /// One use with random options, body and cancellation; every call is bounded.
    async fn once(&mut self, kind: Kind, tally: &mut Tally) {
        let names = if kind == Kind::Multi {
            self.key_set()
        } else {
            Vec::new()
        };
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
        let mut opts = kind.options().ttl(ttl).wait(wait).watchdog(!fixed);
        let mix = self.events.is_some();
        // The generator: `min_hold` on writers, a nested call inside `run`, forced unlocks.
        let min_hold = (mix && kind == Kind::Exclusive && rng.chance(25)).then(|| rng.ms(100, 700));
        if let Some(m) = min_hold {
            opts = opts.min_hold(m);
        }
        let nest = mix && kind != Kind::Multi && rng.chance(25);
        // `max_hold` cuts a section short (`Lost`); `on_lost = continue` lets a `run` body
        // finish after a loss, then reports it.
        let max_hold = mix && rng.chance(10);
        if max_hold {
            opts = opts.max_hold(rng.ms(50, 800));
        }
        // Readers and permit holders only: a writer running on after a loss would write the
        // oracle's counter unfenced, and its late write would read as another's lost update.
        let go_on = mix && matches!(kind, Kind::Read | Kind::Permits(_)) && rng.chance(10);
        if go_on {
            opts = opts.on_lost(lockrt::OnLost::Continue);
        }
        if let (true, Some(ev)) = (rng.chance(3), &self.events) {
            let victim = if rng.chance(50) { RW_KEY } else { SEM_KEY };
            let sent = mono_ns();
            // A failed call may still land: its request may be held up in the network.
            let how = match self.locker.force_unlock(victim).await {
                Ok(_) => "ok",
                Err(_) => "err",
            };
            ev.append(&format!(
                "F {} {victim} {sent} {} {how}",
                std::process::id(),
                mono_ns()
            ));
            tally.bump("forced");
        }
        // Not a body that runs on after a loss: its caller must hear the `Lost` at the end,
        // or nobody could tell its overlap from a broken lock.
        let cancel = (rng.chance(25) && self.cancel && !go_on).then(|| rng.ms(0, 1_200));
        let style = if nest || go_on { 0 } else { rng.range(0, 2) };
        let key = if kind == Kind::Permits(PERMITS) {
            SEM_KEY
        } else {
            RW_KEY
        };
        let (seen, began) = (AtomicU64::new(0), AtomicU64::new(0));
        let cx = Cx {
            oracle: &mut self.oracle,
            log: &self.log,
            seen: &seen,
            began: &began,
            nest: nest.then_some(self.events.as_ref()).flatten(),
        };
        let start = mono_ns();
        let op = async {
            match kind {
                Kind::Multi => multi_op(&self.locker, &names, opts, work, cx).await,
                _ => one_op(&self.locker, key, (kind, opts), style, work, cx).await,
            }
        };
        let bound = cancel.unwrap_or(wait + ttl * 4 + work + Duration::from_secs(5));
        let res = tokio::time::timeout(bound, op).await;
        let fence = seen.load(Ordering::SeqCst);
        if fence != 0 {
            self.told.write(fence, verdict(&res));
        }
        if let Some(ev) = &self.events {
            let pid = std::process::id();
            if let (Some(m), true) = (min_hold, fence != 0) {
                ev.append(&format!("M {pid} {fence} {}", m.as_millis()));
            }
            if fence != 0 {
                // What this section combined, for the pair counts of `support::mix`.
                let drawn = [
                    (min_hold.is_some(), "min_hold"),
                    (max_hold, "max_hold"),
                    (fixed, "fixed_lease"),
                    (nest, "nesting"),
                    (res.is_err(), "cancellation"),
                    (go_on, "on_lost_continue"),
                    (fence % 32 != 0, "local_handoff"),
                ];
                let on: Vec<&str> = (drawn.iter()).filter(|d| d.0).map(|d| d.1).collect();
                ev.append(&format!(
                    "O {pid} {fence} {start} {} {kind} {}",
                    mono_ns(),
                    if on.is_empty() {
                        "-".to_owned()
                    } else {
                        on.join(",")
                    }
                ));
            }
            // Until the body began, or the call ended without one (a cancelled call: no).
            let until = match began.load(Ordering::SeqCst) {
                0 if res.is_ok() => mono_ns(),
                0 => 0,
                t => t,
            };
            // A `try_acquire` ignores `wait`.
            let wait = if style == 2 && kind != Kind::Multi {
                Duration::ZERO
            } else {
                wait
            };
            let how = || format!("{kind}/style{style}/wait{}ms", wait.as_millis());
            self.bound_kept(ev, (start, until), wait, how, verdict(&res));
        }
        match res {
            Ok(Ok(o)) => tally.count(o),
            Ok(Err(e)) if e.is_timeout() => tally.bump("timeout"),
            Ok(Err(e)) if e.is_lost() => tally.bump("lost"),
            Ok(Err(e)) if e.is_backend() => tally.bump("backend"),
            Ok(Err(lockrt::LockError::ShutDown)) if self.events.is_some() => {
                tally.bump("shut_down")
            }
            Ok(Err(e)) => panic!("unexpected error: {e:?}"),
            Err(_) if cancel.is_some() => tally.bump("cancelled"),
            Err(_) => panic!("a call did not finish within {bound:?} ({kind}, ttl {ttl:?})"),
        }
    }

    /// `B` when a call took longer than `wait` plus one connect and one response timeout (the
    /// retry window and scheduling on a loaded machine on top) to start its body or fail:
    /// `[start, until]` (`until` 0: a cancelled call that never began).
    fn bound_kept(
        &self,
        ev: &Log,
        (start, until): (u64, u64),
        wait: Duration,
        how: impl FnOnce() -> String,
        verdict: &str,
    ) {
        let allowed = wait.max(ms(100)) + CONNECT + self.response + ms(400);
        if until != 0 && until - start > allowed.as_nanos() as u64 {
            ev.append(&format!(
                "B {} {start} {until} {} {}/response{}ms/{}",
                std::process::id(),
                allowed.as_nanos(),
                how(),
                self.response.as_millis(),
                verdict.replace(' ', "_")
            ));
        }
    }

    /// One use of the hot key or of the key that changes kind, with a guard; recorded as `S
    /// <pid> <key> <kind> <start ns> <end ns> <ttl ms> <outcome> <first ns> <last ns> <fence>
    /// <wait ms>` (`support::mix`): `first` and `last` are the moments the body found its
    /// lease not lost (0: never), `outcome` what the caller was told: `ok` (held to the end
    /// and released), `busy`, `conflict` (`KindConflict`), `timeout`, `lost`, `error`, `shutdown`, `cancelled`.
    async fn plain(&mut self, tally: &mut Tally) {
        let Some(ev) = self.events.clone() else {
            return;
        };
        let rng = &mut self.rng;
        let (key, kind) = match self.role {
            Role::Hot => (HOT_KEY, Kind::Exclusive),
            _ => (SHIFT_KEY, shift_kind(mono_ns(), rng)),
        };
        // Permits on a fixed lease their bodies often outlast, not watching for the loss (a
        // share released only after it ran out; `leave_shares` leaves some unreleased).
        let heedless = matches!(kind, Kind::Permits(_)) && rng.chance(40);
        let (ttl, fixed, work) = match (self.role, kind) {
            (Role::Hot, _) => (
                ms([500, 1_000][rng.range(0, 1) as usize]),
                false,
                rng.ms(0, 3),
            ),
            (_, Kind::Permits(_)) if heedless => (ms(300), true, rng.ms(150, 600)),
            _ => {
                let ttl = ms([200, 500, 1_000][rng.range(0, 2) as usize]);
                let work = match rng.chance(15) {
                    true => rng.ms(0, ttl.as_millis() as u64 * 3 / 2),
                    false => rng.ms(0, 40),
                };
                (ttl, rng.chance(20), work)
            }
        };
        // Permits of the key that changes kind are taken at once or not: a waiter's queue
        // registration would outlive its call when the call is cut off (and then justify
        // refusals of other kinds for seconds).
        let wait = match (self.role, kind, rng.chance(20)) {
            (Role::Hot, ..) => rng.ms(50, 600),
            (_, Kind::Permits(_), _) | (_, _, true) => Duration::ZERO,
            _ => rng.ms(0, 800),
        };
        let at_once = rng.chance(20);
        let cancel = (self.cancel && rng.chance(15)).then(|| rng.ms(0, 800));
        let opts = kind.options().ttl(ttl).wait(wait).watchdog(!fixed);
        // When the body began, first and last found its lease not lost; its fence.
        let stamps: [AtomicU64; 4] = Default::default();
        let op = async {
            let g = match at_once {
                true => match self.locker.try_acquire(key, opts).await? {
                    Some(g) => g,
                    None => return Ok(false),
                },
                false => self.locker.acquire(key, opts).await?,
            };
            stamps[0].store(mono_ns(), Ordering::SeqCst);
            stamps[3].store(g.fence(), Ordering::SeqCst);
            if !g.is_lost() {
                stamps[1].store(mono_ns(), Ordering::SeqCst);
                let watch = (!heedless).then_some(&g);
                if work_for(work, watch).await && !g.is_lost() {
                    stamps[2].store(mono_ns(), Ordering::SeqCst);
                }
            }
            g.release().await.map(|()| true)
        };
        let start = mono_ns();
        let bound = cancel.unwrap_or(wait + ttl * 4 + work + Duration::from_secs(5));
        let res = tokio::time::timeout(bound, op).await;
        let done = mono_ns();
        let [began, first, last, fence] = stamps.each_ref().map(|a| a.load(Ordering::SeqCst));
        let outcome = match &res {
            Ok(Ok(true)) if last != 0 => "ok",
            Ok(Ok(true)) => "lost",
            Ok(Ok(false)) => "busy",
            Ok(Err(lockrt::LockError::KindConflict { .. })) => "conflict",
            Ok(Err(lockrt::LockError::ShutDown)) => "shutdown",
            Ok(Err(e)) if e.is_timeout() => "timeout",
            Ok(Err(e)) if e.is_lost() => "lost",
            Ok(Err(e)) if e.is_backend() => "error",
            Ok(Err(e)) => panic!("unexpected error on {key}: {e:?}"),
            Err(_) if cancel.is_some() => "cancelled",
            Err(_) => panic!("a call on {key} did not finish within {bound:?}"),
        };
        tally.bump(match self.role {
            Role::Hot => "hot",
            _ => "shift",
        });
        // A `try_acquire` ignores `wait` (and never queues).
        let wait = if at_once { Duration::ZERO } else { wait };
        ev.append(&format!(
            "S {} {key} {kind} {start} {done} {} {outcome} {first} {last} {fence} {}",
            std::process::id(),
            ttl.as_millis(),
            wait.as_millis()
        ));
        let until = match began {
            0 if res.is_ok() => done,
            b => b,
        };
        let how = || format!("{key}/{kind}/wait{}ms", wait.as_millis());
        self.bound_kept(&ev, (start, until), wait, how, outcome);
    }
}

type OpResult = Result<Option<Outcome>, lockrt::LockError>;

/// What the caller heard about a section whose body ran: `lost` from the guard in the body,
/// from `run` or from the release; `ok` (or `stale`) otherwise.
fn verdict(res: &Result<OpResult, tokio::time::error::Elapsed>) -> &'static str {
    match res {
        Ok(Ok(Some(Outcome::Lost))) => "lost",
        Ok(Err(lockrt::LockError::Lost { cause, .. })) => match cause {
            lockrt::LossCause::ForceUnlocked => "lost:forced",
            lockrt::LossCause::ShutDown => "lost:shutdown",
            _ => "lost",
        },
        Ok(Err(e)) if e.is_lost() => "lost",
        Ok(Ok(Some(Outcome::Stale))) => "stale",
        Ok(Ok(_)) => "ok",
        Ok(Err(_)) => "error",
        Err(_) => "cancelled",
    }
}

/// What a use of the lock writes to: the oracle, the log, the fence its body ran with and
/// when it began; with `nest`, a nested call inside `run` recorded there.
struct Cx<'a> {
    oracle: &'a mut Oracle,
    log: &'a Log,
    seen: &'a AtomicU64,
    began: &'a AtomicU64,
    nest: Option<&'a Log>,
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
            Kind::Multi => unreachable!("multi-key sections run in multi_body"),
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
            Kind::Multi => unreachable!("multi-key sections run in multi_body"),
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
    cx: Cx<'_>,
) -> OpResult {
    let Cx {
        oracle,
        log,
        seen,
        began,
        nest,
    } = cx;
    let g = match style {
        0 => {
            let section = async {
                began.store(mono_ns(), Ordering::SeqCst);
                let fence = lockrt::current_lock().expect("inside run").fence();
                seen.store(fence, Ordering::SeqCst);
                if let Some(ev) = nest {
                    nested(locker, key, kind, fence, ev).await;
                }
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
    began.store(mono_ns(), Ordering::SeqCst);
    seen.store(g.fence(), Ordering::SeqCst);
    let o = body(kind, oracle, log, g.fence(), work, Some(&g)).await;
    release(g.release().await, o)
}

/// A nested call inside this task's own `run` section of `kind` on `key` (`N`): the same
/// kind again is covered by the outer section (no wait, `Ok`); a multi-key section over the
/// key inside a read or permit section must be refused with `KindConflict`; a read inside a
/// write section is covered.
async fn nested(locker: &Locker, key: &str, kind: Kind, fence: u64, ev: &Log) {
    let now = LockOptions::new().wait(Duration::ZERO);
    // Through the attribute half the time: the macro's expansion must nest as `run` does.
    let attr = fence % 64 < 32;
    let verdict = match kind {
        Kind::Read | Kind::Permits(_) => {
            let keys = [key.to_owned(), format!("kinds:{}", MULTI_KEYS[3])];
            let res = if attr {
                attr_multi(locker, key).await
            } else {
                locker.run_all(keys, now, async {}).await
            };
            match res {
                Err(lockrt::LockError::KindConflict { .. } | lockrt::LockError::ShutDown) => {
                    "ok".to_owned()
                }
                Err(e) if e.is_lost() => "ok".to_owned(),
                other => format!("BAD:multi-key-inside-{kind}:{other:?}"),
            }
        }
        _ => match if attr {
            attr_read(locker, key).await
        } else {
            let read = LockOptions::new().read().wait(Duration::ZERO);
            locker.run(key, read, async {}).await
        } {
            Ok(()) | Err(lockrt::LockError::ShutDown) => "ok".to_owned(),
            Err(e) if e.is_lost() => "ok".to_owned(),
            Err(e) => format!("BAD:read-inside-write:{e:?}"),
        },
    };
    ev.append(&format!(
        "N {} {fence} {}",
        std::process::id(),
        verdict.replace(' ', "_")
    ));
}

/// `run_all` over `key` and another key, through the attribute (`nested`).
#[lockrt::distributed_lock(keys = ["{key}", "kinds:m3"], locker = locker, wait = "0s")]
async fn attr_multi(locker: &Locker, key: &str) -> Result<(), lockrt::LockError> {
    Ok(())
}

/// A read section of `key`, through the attribute (`nested`).
#[lockrt::distributed_lock(key = "{key}", locker = locker, mode = "read", wait = "0s")]
async fn attr_read(locker: &Locker, key: &str) -> Result<(), lockrt::LockError> {
    Ok(())
}

/// The section's outcome, or the release's `Lost`: the caller is told the lock was lost.
/// Other release errors leave the outcome as it was (the lock expires).
fn release(res: Result<(), lockrt::LockError>, o: Outcome) -> OpResult {
    match res {
        // Also after a body that saw the loss: the error names its cause.
        Err(e) if e.is_lost() => Err(e),
        _ => Ok(Some(o)),
    }
}

/// One multi-key use: `acquire_all` of the keys named `kinds:<name>`, then the body with the
/// guard (it checks `is_lost()` before each step and stops when `lost()` fires).
async fn multi_op(
    locker: &Locker,
    names: &[&str],
    opts: LockOptions,
    work: Duration,
    cx: Cx<'_>,
) -> OpResult {
    let keys = names.iter().map(|n| format!("kinds:{n}"));
    let g = locker.acquire_all(keys, opts).await?;
    cx.began.store(mono_ns(), Ordering::SeqCst);
    let parts: Vec<(String, u64)> = (g.fences().into_iter())
        .map(|(k, f)| (k.trim_start_matches("kinds:").to_owned(), f))
        .collect();
    cx.seen.store(parts[0].1, Ordering::SeqCst);
    let o = multi_body(cx.oracle, cx.log, &parts, work, &g).await;
    release(g.release().await, o)
}

/// A writer on each key: one all-or-none fenced claim that reads every key's counter, the
/// `await`, then every counter set to what it read plus one.
async fn multi_body(
    o: &mut Oracle,
    log: &Log,
    parts: &[(String, u64)],
    work: Duration,
    g: &MultiGuard,
) -> Outcome {
    let keys = (parts.iter())
        .map(|(key, fence)| KeyPart {
            key: key.clone(),
            fence: *fence,
            read: None,
        })
        .collect();
    let s = Section {
        pid: std::process::id(),
        fence: parts[0].1,
        kind: Kind::Multi,
        acquired: mono_ns(),
        keys,
        ..Section::default()
    };
    let mut r = Recorder { log, s };
    if g.is_lost() {
        return Outcome::Lost;
    }
    let read = o.claim_all(parts);
    (r.s.claimed, r.s.claim) = (mono_ns(), Some(read.is_some()));
    r.s.read = r.s.claimed;
    let Some(read) = read else {
        return Outcome::Stale;
    };
    for (p, v) in r.s.keys.iter_mut().zip(&read) {
        p.read = Some(*v);
    }
    tokio::select! {
        () = tokio::time::sleep(work) => {}
        () = g.lost() => return Outcome::Lost,
    }
    r.s.wake = mono_ns();
    if g.is_lost() {
        return Outcome::Lost;
    }
    o.set_all(parts, &read);
    (r.s.end, r.s.completed) = (mono_ns(), true);
    Outcome::Completed
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
