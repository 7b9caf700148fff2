//! The lock kinds under a randomized schedule: worker processes, each with its own `Locker`
//! behind its own `FaultProxy`, run readers and writers of one read-write key, holders of a
//! semaphore of 3 permits on another key, and holders of 2 or 3 of 4 exclusive keys at once
//! (`acquire_all`, in random orders, sometimes with the read-write key as a writer), with
//! random ttls (fixed ones too), waits, bodies and cancellations, while the test delays,
//! drops, resets and partitions their traffic and freezes whole workers (SIGSTOP, often past
//! their ttl). The kinds checker (`support::kinds`) with its fenced oracle on a second
//! redis-server decides: no writer overlaps another holder, readers overlap only readers,
//! never more than 3 permit holders, a multi-key section overlaps no holder of any of its
//! keys, fences in order per key, no stale read or write accepted, no lost update on any key.
//!
//! `chaos_kinds_restart_without_persistence` kills the lock server and starts it again empty
//! while all of them run: a section that overlaps another must have been told `Lost`.
//!
//! `chaos_kinds_quick` runs with every `cargo test`; the others in `cargo xtask chaos`.
//! `LOCKRT_CHAOS_SEED=<seed>` runs only that seed (the same faults, not the same
//! interleaving).

mod support;

// Not a test target of its own (cargo builds every `tests/*.rs`): the worker's code.
#[path = "support/kinds_worker.rs"]
mod kinds_worker;

use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use kinds_worker::MULTI_KEYS;
use lockrt::testing::{Direction, FaultProxy, NodeRole, RedisCluster, RedisServer, slot_of};
use support::history::{self, KeyPart, Rng, Section, Stall, Stalls, Worker, mono_ns, seeds};
use support::kinds::oracle::Oracle;
use support::kinds::{self, Kind, Told};
use support::mix;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A short run for every `cargo test`: one seed, 2 workers, 4 s.
#[test]
fn chaos_kinds_quick() {
    run_seeds(&seeds([1]), 2, Duration::from_secs(4), Schedule::Faults);
}

/// The long run: 2 seeds, 3 workers, 12 s each.
#[test]
#[ignore = "chaos: run with cargo xtask chaos"]
fn chaos_kinds_long() {
    run_seeds(
        &seeds([21, 22]),
        3,
        Duration::from_secs(12),
        Schedule::Faults,
    );
}

/// The lock server (no persistence) killed and started again, empty, every 0.6-1.8 s while
/// readers, writers, permit and multi-key holders run (no other faults, no cancellations):
/// locks are legitimately lost, so sections may overlap, but only sections whose callers
/// were told `Lost`; fenced writes and reads are still never accepted stale.
#[test]
#[ignore = "chaos: lock server restarts; run with cargo xtask chaos"]
fn chaos_kinds_restart_without_persistence() {
    run_seeds(
        &seeds([91, 92]),
        3,
        Duration::from_secs(10),
        Schedule::Restarts,
    );
}

/// The interaction generator, short, for every `cargo test`: one seed, 3 workers, 5 s. Besides
/// the kinds, each worker draws `min_hold` for writers, `max_hold`, `on_lost = continue`,
/// nested calls inside `run` (the same key again; `run_all` inside a read or permit section,
/// which must be refused), forced unlocks of the shared keys, runs an `every()` job, and shuts
/// its locker down at the end (the first worker at 70% of the run, its callers still calling);
/// callers of a hot key pass it on to each other (local hand-off chains), callers of a key
/// that changes kind every 1.2 s (semaphore, lock, read-write lock) meet `KindConflict`s, and
/// a worker of its own runs the job and kills itself (SIGKILL) late in a tick it runs. The
/// schedule adds requests held up on one connection and delivered after later ones
/// (reordered across connections) to the proxy faults and SIGSTOPs. `support::mix` checks
/// what the kinds checker does not: `min_hold` honoured, nested calls, every call within its
/// bound, one finished run per tick, the dead runner's tick run late or reported, every
/// `KindConflict` justified by a holder or waiter of the other kind, the hot and changing
/// keys' sections exclusive per kind, nothing left after `shutdown()`.
#[test]
fn chaos_mix_quick() {
    run_seeds(&seeds([5]), 3, Duration::from_secs(5), Schedule::Mix);
}

/// The interaction generator, long: 4 seeds, 3 workers, 12 s each.
#[test]
#[ignore = "chaos: run with cargo xtask chaos"]
fn chaos_mix_long() {
    run_seeds(
        &seeds([51, 52, 53, 54]),
        3,
        Duration::from_secs(12),
        Schedule::Mix,
    );
}

/// The interaction generator on a Redis Cluster (3 masters, one replica each, no proxies):
/// 2 seeds, 3 workers, 12 s each, under slot migrations of the locks' slots, coordinated
/// failovers and stopped masters and workers (`cluster_faults`).
#[test]
#[ignore = "chaos: run with cargo xtask chaos"]
fn chaos_mix_cluster_long() {
    run_seeds(
        &seeds([61, 62]),
        3,
        Duration::from_secs(12),
        Schedule::MixCluster,
    );
}

/// What the test does to the workers meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schedule {
    /// Proxy faults and SIGSTOPs (`inject`), with cancellations in the workers.
    Faults,
    /// Lock server restarts (`restarts`).
    Restarts,
    /// `Faults` with reordered requests, and the interaction generator in the workers.
    Mix,
    /// The interaction generator on a Redis Cluster: slot migrations of the locks' slots,
    /// coordinated failovers, stopped masters and workers (`cluster_faults`).
    MixCluster,
}

impl Schedule {
    fn mix(self) -> bool {
        matches!(self, Schedule::Mix | Schedule::MixCluster)
    }
}

/// A seed's checked history, with the stalls and faults the schedule inflicted, and what the
/// callers were told.
struct SeedResult {
    report: kinds::Report,
    /// The generator's own checks (`Mix` only).
    mix: Option<mix::Report>,
    /// What the lock server held after the last worker exited (`Mix` only).
    state: Option<mix::ServerState>,
    sections: Vec<Section>,
    stalls: Vec<Stall>,
    faults: Vec<String>,
    verdicts: std::collections::BTreeMap<String, usize>,
}

fn run_seeds(seeds: &[u64], workers: usize, secs: Duration, schedule: Schedule) {
    let mut lock_server = RedisServer::start().expect("lock redis-server");
    let oracle_server = RedisServer::start().expect("oracle redis-server");
    let name = match schedule {
        Schedule::Faults => "chaos_kinds",
        Schedule::Restarts => "chaos_kinds_restart_without_persistence",
        Schedule::Mix => "chaos_mix",
        Schedule::MixCluster => "chaos_mix_cluster",
    };
    let cluster = (schedule == Schedule::MixCluster)
        .then(|| RedisCluster::start(3, 1).expect("a cluster of 3 masters, 1 replica each"));
    let (mut failures, mut killed_ticks) = (Vec::new(), 0);
    for &seed in seeds {
        let servers = (&mut lock_server, &oracle_server, cluster.as_ref());
        let res = run_seed(seed, workers, secs, servers, schedule);
        let rep = &res.report;
        println!("seed {seed}: faults: {}", res.faults.join(", "));
        println!(
            "FIGURE {name} seed {seed}: {workers} workers x {secs:?}, {} faults ({} stops), \
             verdicts {:?}: {}",
            res.faults.len(),
            res.stalls.len(),
            res.verdicts,
            rep.summary()
        );
        let mut v = rep.violations();
        if let Some(m) = &res.mix {
            println!("FIGURE {name} seed {seed}: generator: {}", m.summary());
            let pairs: Vec<String> = (m.pairs.iter())
                .map(|((a, b), n)| format!("{a}x{b}={n}"))
                .collect();
            println!("PAIRS {name} seed {seed}: {}", pairs.join(" "));
            v.extend(m.violations());
            // A check with nothing to judge proves nothing.
            if m.plain_held == 0 || m.conflicts == 0 {
                v.push(format!(
                    "the hot and changing keys had nothing to judge: {} sections held, {} \
                     KindConflicts",
                    m.plain_held, m.conflicts
                ));
            }
            killed_ticks += m.killed_ticks;
        }
        if let Some(st) = &res.state {
            println!("FIGURE {name} seed {seed}: state: {}", st.summary());
            v.extend(st.violations.iter().take(10).map(|l| format!("state: {l}")));
        }
        if rep.completed.contains(&0) {
            v.push(format!("a kind never completed: {:?}", rep.completed));
        }
        if !v.is_empty() {
            failures.push(format!(
                "seed {seed} FAILED (replay: LOCKRT_CHAOS_SEED={seed}):\n  {}\ntimeline:\n{}",
                v.join("\n  "),
                history::timeline(&res.sections, &res.stalls, 200)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The job worker dies in a tick it wins against three others: over several seeds at
    // least once (one seed may see it win none after its moment).
    if schedule == Schedule::Mix && seeds.len() > 1 {
        assert!(
            killed_ticks > 0,
            "no seed killed the job's runner inside a tick"
        );
    }
}

fn run_seed(
    seed: u64,
    n: usize,
    secs: Duration,
    (lock_server, oracle_server, cluster): (&mut RedisServer, &RedisServer, Option<&RedisCluster>),
    schedule: Schedule,
) -> SeedResult {
    let cluster_url = cluster.map(|c| {
        let seeds: Vec<String> = (0..c.len())
            .map(|i| format!("127.0.0.1:{}", c.port(i)))
            .collect();
        format!("redis+cluster://{}/", seeds.join(","))
    });
    let dir = scratch_dir(seed);
    let ns = format!("k{seed}-{}", mono_ns());
    let proxies: Vec<FaultProxy> = (0..n)
        .map(|_| FaultProxy::in_front_of(lock_server).expect("proxy"))
        .collect();
    let urls = match schedule {
        Schedule::Faults | Schedule::Mix => proxies.iter().map(FaultProxy::url).collect(),
        Schedule::MixCluster => vec![cluster_url.clone().expect("cluster"); n],
        // Restarts: straight to the server, so nothing but the restart is between them.
        Schedule::Restarts => vec![lock_server.url(); n],
    };
    let cancel = schedule != Schedule::Restarts;
    let direct = match schedule {
        Schedule::Mix => Some(lock_server.url()),
        Schedule::MixCluster => cluster_url.clone(),
        _ => None,
    };
    let workers = spawn_workers(
        seed,
        &urls,
        (&oracle_server.url(), &ns),
        &dir,
        (secs, cancel, direct.clone()),
    );
    let stalls = Stalls::default();
    let mut rng = Rng::new(seed);
    let mut disturbed = Vec::new();
    let faults = match schedule {
        Schedule::Faults => inject(&mut rng, &proxies, &workers, &stalls, secs, None),
        Schedule::Mix => inject(
            &mut rng,
            &proxies,
            &workers,
            &stalls,
            secs,
            Some((&mut disturbed, &mut *lock_server)),
        ),
        Schedule::Restarts => restarts(&mut rng, lock_server, secs),
        Schedule::MixCluster => cluster_faults(
            &mut rng,
            cluster.expect("cluster"),
            (&workers, &stalls),
            secs,
            &mut disturbed,
        ),
    };
    for (i, w) in workers.into_iter().enumerate() {
        // The generator's job worker (the last) kills itself inside a tick.
        let out = match direct.is_some() && i == n {
            true => w.join_or_killed(secs + Duration::from_secs(40)),
            false => w.join(secs + Duration::from_secs(40)),
        };
        for l in out
            .lines()
            .filter_map(|l| l.find("WORKER").map(|i| &l[i..]))
        {
            println!("seed {seed}:   {l}");
        }
    }
    // Read before anything else: what every worker left, with nothing running.
    let left = match (schedule, cluster) {
        (Schedule::Mix, _) => {
            let mut conn = lock_server.client().get_connection().expect("lock server");
            Some(mix::ServerState::read(&mut conn))
        }
        (Schedule::MixCluster, Some(cluster)) => {
            let mut all = mix::ServerState::default();
            let nodes = cluster.nodes().expect("cluster nodes");
            for n in nodes.iter().filter(|n| n.role == NodeRole::Master) {
                let mut conn = cluster.client(n.index).get_connection().expect("master");
                all.merge(mix::ServerState::read(&mut conn));
            }
            Some(all)
        }
        _ => None,
    };
    let sections = history::load(&dir);
    let (told, cancelled, verdicts) = kinds_worker::load_told(&dir);
    let mut oracle = Oracle::connect(&oracle_server.url(), &ns);
    let (state, keys) = (oracle.state(), oracle.key_states(&MULTI_KEYS));
    let stalls = stalls.all();
    // Under proxy faults and stops alone no section may overlap another (a loss is declared
    // before the lease ends on the server). A restart, and the generator's forced unlocks and
    // shutdowns, end locks under running sections: there the README's promise is checked,
    // sections not told `Lost` never overlap.
    let told = match schedule {
        Schedule::Restarts | Schedule::Mix | Schedule::MixCluster => told,
        Schedule::Faults => Told::new(),
    };
    let cut = match schedule.mix() {
        true => mix::cut_by_force(&mix::load(&dir), &sections, &disturbed, &cancelled),
        false => kinds::Cut::new(),
    };
    let report = kinds::check_cut(&sections, &stalls, state, (&told, &cut), &keys);
    let mix = schedule.mix().then(|| {
        let lines = mix::load(&dir);
        mix::check(&lines, &sections, &stalls, &disturbed, (&told, &cancelled))
    });
    let failed = !report.violations().is_empty()
        || mix.as_ref().is_some_and(|m| !m.violations().is_empty())
        || left.as_ref().is_some_and(|s| !s.violations.is_empty());
    // `LOCKRT_CHAOS_KEEP=1` keeps them for a look at a green run too.
    if failed || std::env::var_os("LOCKRT_CHAOS_KEEP").is_some() {
        println!("seed {seed}: records kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    SeedResult {
        report,
        mix,
        state: left,
        sections,
        stalls,
        faults,
        verdicts,
    }
}

/// One worker per url, writing its records and verdicts to `dir`.
fn spawn_workers(
    seed: u64,
    urls: &[String],
    (oracle, ns): (&str, &str),
    dir: &std::path::Path,
    (secs, cancel, direct): (Duration, bool, Option<String>),
) -> Vec<Worker> {
    let file = |i: usize, ext: &str| dir.join(format!("w{i}.{ext}"));
    let base = |i: usize, url: &str, cancel: bool| {
        vec![
            ("url", url.to_owned()),
            ("oracle", oracle.to_owned()),
            ("ns", ns.to_owned()),
            ("log", file(i, "log").display().to_string()),
            ("told", file(i, "told").display().to_string()),
            ("cancel", u8::from(cancel).to_string()),
            ("seed", (seed * 1000 + i as u64).to_string()),
            ("ms", secs.as_millis().to_string()),
        ]
    };
    (urls.iter().enumerate())
        .map(|(i, url)| {
            let mut settings = base(i, url, cancel);
            if let Some(direct) = &direct {
                settings.push(("events", file(i, "mix").display().to_string()));
                settings.push(("direct", direct.clone()));
                if i == 0 {
                    // This one's locker shuts down mid-run, its callers still calling.
                    let at = secs.as_millis() * 7 / 10;
                    settings.push(("shutdown_ms", at.to_string()));
                }
                if i > 0 {
                    // These leave permits of the key that changes kind unreleased, in turns.
                    settings.push(("leak", ((i - 1) % 2).to_string()));
                }
            }
            Worker::spawn("worker", &settings, file(i, "out"))
        })
        .chain(direct.as_ref().map(|direct| {
            // The generator's job worker: the job alone, straight to the server, killing
            // itself inside the first tick it runs once 25-45% of the run have passed.
            let i = urls.len();
            let die = secs.as_millis() as u64 * Rng::new(seed).range(25, 45) / 100;
            let mut settings = base(i, direct, false);
            settings.extend([
                ("events", file(i, "mix").display().to_string()),
                ("direct", direct.clone()),
                ("die_ms", die.to_string()),
            ]);
            Worker::spawn("worker", &settings, file(i, "out"))
        }))
        .collect()
}

/// The Cluster schedule: one fault at a time, at random moments: the slot of one of the
/// locks moved to another master (keys migrated in two passes under load, as an operator's
/// resharding does), a coordinated failover of a master to its replica, a master stopped
/// (SIGSTOP, below the node timeout), a worker stopped.
fn cluster_faults(
    rng: &mut Rng,
    cluster: &RedisCluster,
    (workers, stalls): (&[Worker], &Stalls),
    secs: Duration,
    disturbed: &mut Vec<mix::Disturbed>,
) -> Vec<String> {
    let locks = ["rw", "sem", "m0", "m1", "m2", "m3"].map(|k| format!("lock:kinds:{k}"));
    let mut faults = Vec::new();
    let end = Instant::now() + secs;
    while Instant::now() + ms(1_000) < end {
        let from = mono_ns();
        thread::sleep(rng.ms(50, 400));
        let nodes = cluster.nodes().expect("cluster nodes");
        let masters: Vec<usize> = (nodes.iter())
            .filter(|n| n.role == NodeRole::Master)
            .map(|n| n.index)
            .collect();
        let (fault, pid, what) = match rng.range(0, 4) {
            0 | 1 => {
                let lock = &locks[rng.range(0, locks.len() as u64 - 1) as usize];
                let slot = slot_of(lock);
                let owner = cluster.master_of_slot(slot).expect("slot owner");
                let others: Vec<usize> = masters.iter().copied().filter(|&m| m != owner).collect();
                let to = others[rng.range(0, others.len() as u64 - 1) as usize];
                let m = cluster.begin_slot_migration(slot, to).expect("migrating");
                thread::sleep(rng.ms(50, 400));
                let mut moved = m.move_keys().expect("keys moved");
                thread::sleep(rng.ms(50, 300));
                moved += m.move_keys().expect("keys moved");
                m.finish().expect("migration finished");
                let f = format!("migrate {lock} {owner}->{to} ({moved} keys)");
                (f, mix::EVERYONE, "migration")
            }
            2 => {
                let replicas: Vec<usize> = (nodes.iter())
                    .filter(|n| n.role == NodeRole::Replica && !n.paused)
                    .map(|n| n.index)
                    .collect();
                let r = replicas[rng.range(0, replicas.len() as u64 - 1) as usize];
                // A failover the cluster does not finish in time is reported, not fatal: the
                // schedule goes on with whatever roles the cluster ended up with.
                let f = match cluster.failover(r) {
                    Ok(took) => format!("failover to {r} ({took:?})"),
                    Err(e) => format!("failover to {r} unfinished: {e}"),
                };
                (f, mix::EVERYONE, "failover")
            }
            3 => {
                let m = masters[rng.range(0, masters.len() as u64 - 1) as usize];
                let hold = rng.ms(50, 900);
                cluster.pause(m).expect("pause");
                thread::sleep(hold);
                cluster.resume(m).expect("resume");
                (
                    format!("master {m} stopped {hold:?}"),
                    mix::EVERYONE,
                    "server_stop",
                )
            }
            _ => {
                let w = rng.range(0, workers.len() as u64 - 1) as usize;
                workers[w].stall(rng.ms(10, 1_500), stalls);
                (format!("w{w}:stop"), workers[w].pid(), "stop")
            }
        };
        faults.push(fault);
        disturbed.push(mix::Disturbed {
            pid,
            from,
            to: mono_ns() + 500_000_000,
            wiped: false,
            what,
        });
    }
    faults
}

/// Kills the lock server and starts it again empty, every 0.6-1.8 s until the run's end.
fn restarts(rng: &mut Rng, server: &mut RedisServer, secs: Duration) -> Vec<String> {
    let mut out = Vec::new();
    let end = Instant::now() + secs;
    while Instant::now() + ms(1_500) < end {
        thread::sleep(rng.ms(600, 1_800));
        let t = Instant::now();
        server.restart().expect("restart");
        out.push(format!(
            "restart ({:.0} ms)",
            t.elapsed().as_secs_f64() * 1e3
        ));
    }
    out
}

/// The schedule: one fault at a time, at random moments, on a random worker; stops last up
/// to 1.5 s, past most ttls.
fn inject(
    rng: &mut Rng,
    proxies: &[FaultProxy],
    workers: &[Worker],
    stalls: &Stalls,
    secs: Duration,
    mix: Option<(&mut Vec<mix::Disturbed>, &mut RedisServer)>,
) -> Vec<String> {
    // The generator's schedule: what disturbed whom, and the lock server to restart.
    let (mut disturbed, mut server) = match mix {
        Some((d, s)) => (Some(d), Some(s)),
        None => (None, None),
    };
    let mut faults = Vec::new();
    let (start, end) = (Instant::now(), Instant::now() + secs);
    // The generator restarts the lock server at least once, from the run's middle on.
    let mut restarted = server.is_none();
    while Instant::now() + ms(300) < end {
        let from = mono_ns();
        thread::sleep(rng.ms(20, 250));
        let w = rng.range(0, proxies.len() as u64 - 1) as usize;
        let p = &proxies[w];
        let hold = rng.ms(50, 900);
        let dir = if rng.chance(50) {
            Direction::ToClient
        } else {
            Direction::ToServer
        };
        let draw = rng.range(0, if disturbed.is_some() { 10 } else { 7 });
        let draw = if !restarted && start.elapsed() > secs / 2 {
            9
        } else {
            draw
        };
        restarted |= draw == 9;
        let fault = match draw {
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
            // The generator: requests held up on the connections open now, delivered after
            // what goes out on newer ones (a hedged renewal, a replaced connection).
            7 | 8 if disturbed.is_some() => {
                p.hold_requests();
                "reorder".into()
            }
            // The lock server restarted without its data, or frozen (SIGSTOP) past most ttls
            // and let go on with its data (as a restart with data looks to its clients).
            9 => match server.as_deref_mut() {
                Some(server) => {
                    server.restart().expect("restart");
                    "restart".into()
                }
                None => "quiet".into(),
            },
            // In the long runs some stops outlast every call's bound (`wait` + connect +
            // response, at most 2.3 s here): calls must return within it all the same.
            10 => match server.as_deref() {
                Some(server) => {
                    let stop = match secs > Duration::from_secs(5) && rng.chance(30) {
                        true => rng.ms(2_400, 3_000),
                        false => hold,
                    };
                    server.pause().expect("pause");
                    thread::sleep(stop);
                    server.resume().expect("resume");
                    format!("server-stop {stop:?}")
                }
                None => "quiet".into(),
            },
            _ => "quiet".into(),
        };
        thread::sleep(hold);
        p.deliver_held();
        p.pass();
        faults.push(format!("w{w}:{fault}"));
        if let Some(d) = disturbed.as_deref_mut() {
            // Effects of a fault outlast it by a response timeout or so.
            let to = mono_ns() + 500_000_000;
            let (pid, wiped, what) = match fault.as_str() {
                "restart" => (mix::EVERYONE, true, "restart"),
                f if f.starts_with("server-stop") => (mix::EVERYONE, false, "server_stop"),
                "stop" => (workers[w].pid(), false, "stop"),
                "quiet" => (workers[w].pid(), false, "quiet"),
                _ => (workers[w].pid(), false, "conn_fault"),
            };
            d.push(mix::Disturbed {
                pid,
                from,
                to,
                wiped,
                what,
            });
        }
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

/// One worker process (`support/kinds_worker.rs`).
#[test]
#[ignore = "worker process of this file's tests: they start it"]
fn worker() {
    kinds_worker::main();
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

/// A completed multi-key section over `keys` (name, fence), each key read 0.
fn multi(pid: u32, keys: &[(&str, u64)], span: (u64, u64)) -> Section {
    let keys: Vec<KeyPart> = (keys.iter())
        .map(|&(key, fence)| KeyPart {
            key: key.into(),
            fence,
            read: Some(0),
        })
        .collect();
    Section {
        kind: Kind::Multi,
        fence: keys[0].fence,
        keys,
        read: span.0 + 1,
        ..sec(pid, Kind::Multi, 0, span)
    }
}

#[test]
fn kinds_checker_fails_a_multi_key_section_beside_a_holder_of_one_of_its_keys() {
    let a = multi(1, &[("m0", 64), ("m1", 64)], (100, 300));
    let b = multi(2, &[("m2", 96), ("m3", 96)], (150, 250));
    let r = check(&[a.clone(), b], &[]);
    assert!(r.overlaps.is_empty(), "{:?}", r.violations());
    assert_eq!(r.multi_keys, 4);
    // On m1 with `a`: an overlap, both read 0 (a lost update), and m1's fence not above.
    let c = multi(3, &[("m1", 32), ("m2", 128)], (200, 400));
    let r = check(&[a.clone(), c.clone()], &[]);
    assert_eq!(
        (r.overlaps.len(), r.lost_updates, r.fence_order.len()),
        (1, 1, 1),
        "{:?}",
        r.violations()
    );
    assert!(r.overlaps[0].starts_with("key m1: "), "{:?}", r.overlaps);
    // The same overlap of a section told `Lost` (as after a restart) is not a violation, nor
    // its fence below the other's; told either way round.
    for told in [&a, &c] {
        let told: kinds::Told = [kinds::multi::ident(told)].into();
        let r = kinds::check_told(
            &[a.clone(), c.clone()],
            &[],
            kinds::State::default(),
            &told,
            &[],
        );
        assert_eq!(
            (r.overlaps.len(), r.fence_order.len(), r.told_overlaps),
            (0, 0, 2),
            "{:?}",
            r.violations()
        );
    }
    // With the read-write key: a writer there, so a reader inside overlaps it.
    let w = multi(4, &[("m0", 160), ("rw", 160)], (500, 700));
    let h = [w, sec(5, Kind::Read, 192, (600, 800))];
    assert_eq!(check(&h, &[]).overlaps.len(), 1);
}

/// The generator's `min_hold` check: a writer inside another's `min_hold` is a violation,
/// unless a forced unlock of the key may have landed in between: one that answered within
/// the window, or one that failed and whose request a fault on its worker may have held up.
#[test]
fn mix_checker_fails_a_writer_inside_a_min_hold_unless_a_forced_unlock_may_have_landed() {
    const MS: u64 = 1_000_000;
    let kept = sec(1, Kind::Exclusive, 64, (3_000 * MS, 3_010 * MS));
    let next = sec(2, Kind::Exclusive, 96, (3_100 * MS, 3_120 * MS));
    let h = [kept, next];
    let judge = |lines: &[&str], faults: &[mix::Disturbed]| {
        let lines: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        mix::check(&lines, &h, &[], faults, (&Told::new(), &Told::new()))
            .min_hold_broken
            .len()
    };
    let m = "M 1 64 400";
    assert_eq!(
        judge(&[m], &[]),
        1,
        "a writer 100 ms into a 400 ms min_hold"
    );
    // A forced unlock answered before the kept lock was taken changes nothing.
    let early = format!("F 3 kinds:rw {} {} ok", 2_600 * MS, 2_700 * MS);
    assert_eq!(judge(&[m, &early], &[]), 1);
    // The same call failed while a fault held its worker's requests until 3,200 ms.
    let failed = format!("F 3 kinds:rw {} {} err", 2_600 * MS, 2_700 * MS);
    let held = mix::Disturbed {
        pid: 3,
        from: 2_500 * MS,
        to: 3_200 * MS,
        wiped: false,
        what: "conn_fault",
    };
    assert_eq!(
        judge(&[m, &failed], &[held]),
        0,
        "its request may land late"
    );
    // A fault on another worker does not explain it; a second after the call ends does.
    let elsewhere = mix::Disturbed { pid: 4, ..held };
    assert_eq!(judge(&[m, &failed], &[elsewhere]), 0);
    let long_ago = format!("F 3 kinds:rw {} {} err", 10 * MS, 20 * MS);
    assert_eq!(judge(&[m, &long_ago], &[elsewhere]), 1);
    // One sent only after the other writer had entered explains nothing.
    let after = format!("F 3 kinds:rw {} {} ok", 3_300 * MS, 3_310 * MS);
    assert_eq!(
        judge(&[m, &after], &[]),
        1,
        "forced after the writer entered"
    );
    // A cancelled holder whose link was cut before the other entered: its kept release may
    // have landed after its lease ran out (a caller that waited would hear `Lost`).
    let lines = [m.to_owned()];
    let cut = mix::Disturbed {
        pid: 1,
        from: 3_020 * MS,
        to: 3_090 * MS,
        wiped: false,
        what: "conn_fault",
    };
    let cancelled: Told = [(1, 64)].into_iter().collect();
    let r = mix::check(&lines, &h, &[], &[cut], (&Told::new(), &cancelled));
    assert!(r.min_hold_broken.is_empty(), "{:?}", r.min_hold_broken);
    let r = mix::check(&lines, &h, &[], &[cut], (&Told::new(), &Told::new()));
    assert_eq!(
        r.min_hold_broken.len(),
        1,
        "not cancelled: it would have been told"
    );
}

/// Stale acceptance is judged by what had reached the oracle: a reader sent its read before
/// a higher writer's claim returned cannot have been rejected; one sent after must have been.
#[test]
fn kinds_checker_judges_a_stale_read_by_the_claims_the_oracle_had_seen() {
    let mut writer = sec(3, Kind::Exclusive, 128, (100, 400));
    writer.claimed = 300;
    // Told `Lost`: the overlap itself is excused, so only the fences are judged.
    let told: Told = [(1, 96), (3, 128)].into_iter().collect();
    let judge = |reader: Section| {
        let h = [writer.clone(), reader];
        let r = kinds::check_told(&h, &[], kinds::State::default(), &told, &[]);
        r.stale_reads_accepted.len()
    };
    let mut early = sec(1, Kind::Read, 96, (200, 500));
    early.wake = 250;
    assert_eq!(judge(early), 0, "both reads sent before the claim returned");
    let mut late = sec(1, Kind::Read, 96, (200, 500));
    late.wake = 350;
    assert_eq!(judge(late), 1, "the second read was sent after it");
    assert_eq!(judge(sec(1, Kind::Read, 96, (310, 500))), 2, "both were");
}

/// A cancelled section counts as told only when a forced unlock of a key it held may have
/// landed while it ran.
#[test]
fn mix_checker_counts_a_cancelled_section_as_told_only_when_a_forced_unlock_may_have_cut_it() {
    let permit = sec(1, Kind::Permits(3), 64, (1_000, 2_000));
    let writer = sec(2, Kind::Exclusive, 96, (1_000, 2_000));
    let h = [permit, writer];
    let cancelled: Told = [(1, 64), (2, 96)].into_iter().collect();
    let cut = |line: &str| {
        let lines = [line.to_owned()];
        let mut v: Vec<(u32, u64)> = mix::cut_by_force(&lines, &h, &[], &cancelled)
            .into_keys()
            .collect();
        v.sort_unstable();
        v
    };
    assert_eq!(cut("F 3 kinds:sem 1500 1510 ok"), [(1, 64)]);
    assert_eq!(cut("F 3 kinds:rw 1500 1510 ok"), [(2, 96)]);
    assert_eq!(
        cut("F 3 kinds:sem 100 110 ok"),
        [],
        "answered before it began"
    );
    assert_eq!(cut("F 3 kinds:sem 2500 2510 ok"), [], "sent after it ended");
    let only_told: Told = [(2, 96)].into_iter().collect();
    let lines = ["F 3 kinds:sem 1500 1510 ok".to_owned()];
    assert!(mix::cut_by_force(&lines, &h, &[], &only_told).is_empty());
    // Cut short after its entry: inside until it left the oracle's count.
    let short = Section {
        end: 0,
        wake: 0,
        left: 2_000,
        ..sec(5, Kind::Permits(3), 128, (1_000, 1_010))
    };
    let cancelled: Told = [(5, 128)].into_iter().collect();
    let got = mix::cut_by_force(&lines, &[short], &[], &cancelled);
    assert!(
        got.contains_key(&(5, 128)),
        "a forced unlock while it was inside"
    );
}

/// A told writer's late write sets the counter back several steps: every value read again
/// after it is explained by that one write, and only by a write that landed after the value
/// was first read.
#[test]
fn kinds_checker_excuses_the_repeats_one_late_told_write_causes() {
    let w = |pid, fence, span, read| Section {
        read_value: Some(read),
        ..sec(pid, Kind::Exclusive, fence, span)
    };
    // Pid 1 read 21 and wrote 22 only at 900, after others had taken the counter to 24.
    let h = [
        w(1, 64, (100, 900), 21),
        w(2, 96, (200, 250), 21),
        w(2, 128, (300, 350), 22),
        w(2, 160, (400, 450), 23),
        w(2, 192, (950, 990), 22),
        w(2, 224, (1_000, 1_050), 23),
    ];
    let judge = |told: &Told| {
        let r = kinds::check_told(&h, &[], kinds::State::default(), told, &[]);
        (r.lost_updates, r.excused_lost_updates)
    };
    let told: Told = [(1, 64)].into_iter().collect();
    assert_eq!(
        judge(&told),
        (3, 3),
        "21 by the told writer, 22 and 23 by its late write"
    );
    assert_eq!(
        judge(&Told::new()),
        (3, 0),
        "nobody was told: three lost updates"
    );
}

/// A permit holder that was told `Lost` may see more than n inside: the limit holds among the
/// others.
#[test]
fn kinds_checker_lets_a_told_permit_holder_see_more_than_n_inside() {
    let p = Kind::Permits(3);
    let h: Vec<Section> = (0..4u32)
        .map(|i| {
            let mut s = sec(
                i + 1,
                p,
                32 * u64::from(i + 1),
                (100 + u64::from(i) * 10, 500),
            );
            s.extra = Some(i64::from(i) + 1);
            s
        })
        .collect();
    let judge = |told: &Told| {
        let r = kinds::check_told(&h, &[], kinds::State::default(), told, &[]);
        r.over_limit.len()
    };
    assert!(judge(&Told::new()) > 0, "a fourth holder inside");
    let fourth: Told = [(4, 128)].into_iter().collect();
    assert_eq!(judge(&fourth), 0, "the fourth was told Lost");
}

/// A cancelled section cut by a forced unlock excuses only what entered after the forced
/// unlock: an overlap with a section that entered before it stays a violation.
#[test]
fn kinds_checker_excuses_a_cut_section_only_for_what_entered_after_the_cut() {
    const MS: u64 = 1_000_000;
    let cancelled_writer = sec(1, Kind::Exclusive, 64, (100 * MS, 500 * MS));
    let other = sec(2, Kind::Exclusive, 96, (200 * MS, 300 * MS));
    let h = [cancelled_writer, other];
    let cancelled: Told = [(1, 64)].into_iter().collect();
    let overlaps = |force_at: u64| {
        let lines = [format!(
            "F 3 kinds:rw {} {} ok",
            force_at * MS,
            (force_at + 10) * MS
        )];
        let cut = mix::cut_by_force(&lines, &h, &[], &cancelled);
        let st = kinds::State::default();
        kinds::check_cut(&h, &[], st, (&Told::new(), &cut), &[])
            .overlaps
            .len()
    };
    assert_eq!(overlaps(150), 0, "the forced unlock let the other in");
    assert_eq!(
        overlaps(400),
        1,
        "the other was inside before the forced unlock"
    );
}

// ---- the generator's last checks must be able to fail ------------------------------------

fn mix_check(lines: &[String]) -> mix::Report {
    mix::check(lines, &[], &[], &[], (&Told::new(), &Told::new()))
}

/// A call of the key that changes kind: `S <pid> kinds:shift <kind> <start> <end> <ttl ms>
/// <outcome> <first> <last> <fence> <wait ms>`, times in ms.
fn shift_call(pid: u32, kind: &str, (start, end): (u64, u64), outcome: &str, wait: u64) -> String {
    let ns = |t: u64| t * 1_000_000;
    let (first, last) = match outcome {
        "ok" => (ns(start) + 1, ns(end) - 1),
        _ => (0, 0),
    };
    format!(
        "S {pid} kinds:shift {kind} {} {} 500 {outcome} {first} {last} 64 {wait}",
        ns(start),
        ns(end)
    )
}

#[test]
fn mix_checker_justifies_a_kind_conflict_only_by_a_call_that_held_or_waited() {
    // Two refusals of opposite kinds, nobody holding or waiting: neither is justified.
    let r = mix_check(&[
        shift_call(1, "x", (1_000, 1_001), "conflict", 200),
        shift_call(2, "p3", (1_000, 1_001), "conflict", 0),
    ]);
    assert_eq!(
        r.conflicts_unjustified.len(),
        2,
        "{:?}",
        r.conflicts_unjustified
    );
    // A call refused at once after its locker's shutdown() sent nothing; one found busy at
    // once never queued.
    let r = mix_check(&[
        shift_call(1, "x", (1_000, 1_001), "conflict", 200),
        shift_call(2, "p3", (1_000, 1_001), "shutdown", 0),
        shift_call(3, "p3", (999, 1_001), "busy", 0),
        shift_call(3, "p3", (999, 1_001), "timeout", 0),
    ]);
    assert_eq!(r.conflicts_unjustified.len(), 1);
    // A permit held then, or released just before: justified; released 100 ms before: not.
    let held = |from, to| {
        mix_check(&[
            shift_call(1, "x", (1_000, 1_001), "conflict", 200),
            shift_call(2, "p3", (from, to), "ok", 0),
        ])
        .conflicts_unjustified
        .len()
    };
    assert_eq!(held(900, 1_005), 0);
    assert_eq!(held(900, 980), 0, "within the slack of a release's reply");
    assert_eq!(held(700, 900), 1);
}

#[test]
fn mix_checker_wants_a_dead_runners_tick_run_or_reported_not_run() {
    let ns = |t: u64| t * 1_000_000;
    let killed = format!("K 9 1500 {}", ns(1_500));
    let later = format!("J 2 1750 96 {} {}", ns(1_750), ns(1_780));
    let lost = |extra: &[String]| {
        let mut lines = vec![killed.clone(), later.clone()];
        lines.extend_from_slice(extra);
        mix_check(&lines).killed_ticks_lost.len()
    };
    assert_eq!(lost(&[]), 1, "neither run nor reported");
    // A late run's start announced, never finished; a claim left to the others: not reports.
    assert_eq!(lost(&["G 2 1500 1501 tick_runs_late_here:".into()]), 1);
    assert_eq!(lost(&["G 2 1500 1501 could_not_claim_the".into()]), 1);
    // What the dead runner logged itself, before it took the tick: not a report.
    assert_eq!(lost(&["G 9 1000 1750 ticks_skipped_here_while".into()]), 1);
    assert_eq!(lost(&["G 2 1500 1501 tick_run_by_no".into()]), 0);
    assert_eq!(lost(&["G 3 1250 1750 ticks_skipped_here_while".into()]), 0);
    assert_eq!(
        lost(&[format!("J 2 1500 64 {} {}", ns(1_800), ns(1_830))]),
        0,
        "run late"
    );
}
