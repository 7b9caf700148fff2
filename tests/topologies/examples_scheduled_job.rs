//! `examples/scheduled_job.rs` as a fleet: three instances (OS processes) of the binary on one
//! Redis run `lockrt::every` for 30 ticks. One is killed (SIGKILL) in the middle of a run; the
//! other two are stopped with SIGTERM at the end. Checked from what they print: exactly one
//! finished run per tick from the first to the last, the killed run's tick finished by another
//! instance, no two runs at once (the killed one counted until the kill), no lost update of the
//! racy counter the job keeps, and a graceful stop of the survivors. And a run stopped
//! gracefully (SIGTERM) is run by another instance within its tick.

use crate::support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::testing::RedisServer;
use redis::AsyncCommands;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

const TICK_MS: u64 = 600;
const TICKS: usize = 30;
/// The run killed is one that starts after this many finished ticks.
const KILL_AFTER: usize = 10;
/// Bounds the whole run: 30 ticks plus start-up and a loaded machine.
const LIMIT: Duration = Duration::from_secs(TICK_MS * TICKS as u64 / 1000 + 60);

/// One line an instance printed: `start`/`end`, its tick, its wall-clock time.
#[derive(Debug, Clone)]
struct Event {
    pid: u32,
    what: String,
    tick: u64,
    at_us: u128,
}

fn parse(pid: u32, line: &str) -> Option<Event> {
    let mut words = line.split_whitespace();
    let what = words.next()?.to_owned();
    let field = |name: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u128>().ok())
    };
    Some(Event {
        pid,
        what,
        tick: u64::try_from(field("tick")?).ok()?,
        at_us: field("at_us")?,
    })
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

fn start(redis: &RedisServer, lines: &mpsc::UnboundedSender<(u32, String)>) -> Child {
    let tick = TICK_MS.to_string();
    start_with(
        redis,
        lines,
        &["--tick-ms", &tick, "--work-ms", "100", "--ttl-ms", "200"],
    )
}

/// An instance with `args`; its stdout lines go to `lines` with its pid.
fn start_with(
    redis: &RedisServer,
    lines: &mpsc::UnboundedSender<(u32, String)>,
    args: &[&str],
) -> Child {
    let mut cmd = Command::new(support::example_binary("scheduled_job"));
    for var in lockrt::LockerConfig::ENV_VARS {
        cmd.env_remove(var);
    }
    let mut child = cmd
        .env("REDIS_URL", redis.url())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start scheduled_job");
    let pid = child.id().expect("pid");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut err = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (l, lines) = (lines.clone(), lines.clone());
    tokio::spawn(async move {
        while let Ok(Some(line)) = out.next_line().await {
            let _ = l.send((pid, line));
        }
    });
    // The log (WARN and above), as lines starting with "log".
    tokio::spawn(async move {
        while let Ok(Some(line)) = err.next_line().await {
            let _ = lines.send((pid, format!("log {line}")));
        }
    });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_run_each_tick_once_and_take_over_a_killed_run() {
    let redis = RedisServer::start().expect("start redis-server");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut instances: Vec<Child> = (0..3).map(|_| start(&redis, &tx)).collect();
    drop(tx);

    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut events = Vec::new();
    let mut ended = BTreeMap::<u64, u32>::new();
    let mut killed: Option<(u32, u64, u128)> = None;
    let mut stopped = Vec::new();
    while ended.len() < TICKS {
        let (pid, line) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {TICKS} ticks ran within {LIMIT:?}", ended.len()))
            .expect("instances still printing");
        let Some(e) = parse(pid, &line) else {
            continue;
        };
        if e.what == "start" && killed.is_none() && ended.len() >= KILL_AFTER {
            let victim = instances
                .iter_mut()
                .find(|c| c.id() == Some(pid))
                .expect("the instance that printed");
            victim.start_kill().expect("SIGKILL");
            killed = Some((pid, e.tick, now_us()));
        }
        if e.what == "end" {
            *ended.entry(e.tick).or_default() += 1;
        }
        events.push(e);
    }
    // The survivors stop gracefully on SIGTERM.
    let stop_at = now_us();
    let victim = killed.map(|(pid, ..)| pid);
    stopped.extend(stop_all(&mut instances, victim, deadline).await);
    // What they printed while stopping.
    while let Some((pid, line)) = rx.recv().await {
        if line.starts_with("stopped") {
            continue;
        }
        if let Some(e) = parse(pid, &line) {
            if e.what == "end" {
                *ended.entry(e.tick).or_default() += 1;
            }
            events.push(e);
        }
    }

    let (victim, killed_tick, killed_at) = killed.expect("an instance was killed");
    let runs: Vec<_> = events.iter().filter(|e| e.what == "end").collect();
    eprintln!(
        "{} runs over ticks {}..={}; instance {victim} killed in tick {killed_tick}; exits {stopped:?}",
        runs.len(),
        ended.keys().next().unwrap(),
        ended.keys().last().unwrap()
    );

    // Exactly one finished run per tick, from the first to the last: none skipped, none twice.
    let first = *ended.keys().next().unwrap();
    let last = *ended.keys().last().unwrap();
    let ticks = (last - first) / TICK_MS + 1;
    for t in (first..=last).step_by(TICK_MS as usize) {
        assert_eq!(
            ended.get(&t),
            Some(&1),
            "tick {t}: {:?} finished runs",
            ended.get(&t)
        );
    }
    assert_eq!(runs.len() as u64, ticks, "one run per tick");
    assert!(ticks >= TICKS as u64);

    // The killed run was cut short, and its tick finished elsewhere.
    assert!(
        !runs
            .iter()
            .any(|e| e.pid == victim && e.tick == killed_tick),
        "instance {victim} finished tick {killed_tick} before the kill reached it: not mid-run"
    );
    assert!(
        runs.iter()
            .any(|e| e.tick == killed_tick && e.pid != victim)
    );

    // No two runs at once: each run's interval, the killed one's until the kill.
    let mut intervals: Vec<(u128, u128, u64, u32)> = events
        .iter()
        .filter(|e| e.what == "start")
        .map(|s| {
            let end = events
                .iter()
                .find(|e| e.what == "end" && e.pid == s.pid && e.tick == s.tick)
                // Unfinished: the killed run until the kill, one the stop cancelled until then.
                .map_or(if s.pid == victim { killed_at } else { stop_at }, |e| {
                    e.at_us
                });
            (s.at_us, end, s.tick, s.pid)
        })
        .collect();
    intervals.sort_unstable();
    for w in intervals.windows(2) {
        assert!(w[0].1 <= w[1].0, "runs overlap: {:?} and {:?}", w[0], w[1]);
    }

    // The racy counter saw every run: no update lost.
    let mut conn = redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let counted: u64 = conn.get("report:runs").await.unwrap();
    assert_eq!(counted, runs.len() as u64, "lost updates");

    // The survivors exited cleanly on SIGTERM (after `shutdown()`); the killed one did not.
    let clean = stopped.iter().filter(|s| s.success()).count();
    assert_eq!(clean, 2, "{stopped:?}");
}

/// SIGTERM to every instance but `except`, then every exit status (all of them).
async fn stop_all(
    instances: &mut [Child],
    except: Option<u32>,
    deadline: tokio::time::Instant,
) -> Vec<std::process::ExitStatus> {
    for child in instances.iter() {
        if let Some(pid) = child.id().filter(|&pid| Some(pid) != except) {
            sigterm(pid);
        }
    }
    let mut stopped = Vec::new();
    for child in instances.iter_mut() {
        let status = tokio::time::timeout_at(deadline, child.wait())
            .await
            .expect("instance exits")
            .expect("wait");
        stopped.push(status);
    }
    stopped
}

fn sigterm(pid: u32) {
    let pid = rustix::process::Pid::from_raw(pid as i32).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
}

/// A graceful stop (SIGTERM: `shutdown()`) in the middle of a run does not finish the tick:
/// the other instance, waiting for the tick's claim, runs it within the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stopped_by_shutdown_is_run_by_another_instance_within_its_tick() {
    let redis = RedisServer::start().expect("start redis-server");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let args = ["--tick-ms", "2000", "--work-ms", "1000", "--ttl-ms", "300"];
    let mut instances: Vec<Child> = (0..2).map(|_| start_with(&redis, &tx, &args)).collect();
    drop(tx);
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut next = async || {
        let (pid, line) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .expect("the instances print within the limit")
            .expect("instances still printing");
        (pid, parse(pid, &line))
    };
    let (victim, tick) = loop {
        if let (pid, Some(e)) = next().await
            && e.what == "start"
        {
            break (pid, e.tick);
        }
    };
    sigterm(victim);
    let taken_over = loop {
        match next().await {
            (pid, Some(e)) if e.what == "end" && e.tick == tick => break pid,
            (_, Some(e)) if e.tick > tick => panic!("tick {tick} never finished: {e:?}"),
            _ => {}
        }
    };
    assert_ne!(taken_over, victim, "the stopped instance finished its run");
    for status in stop_all(&mut instances, Some(victim), deadline).await {
        assert!(status.success(), "{status:?}");
    }
}

/// What [`kill_first_runner`] saw: the killed instance and its tick, when the kill was sent
/// (µs), every event, and the instances' log lines (WARN and above).
struct Killed {
    victim: u32,
    tick: u64,
    killed_at: u128,
    events: Vec<Event>,
    logs: Vec<String>,
}

/// SIGKILLs the instance that starts the first run, `into` into its tick, and collects what
/// the instances print until `done(victim's tick, events so far)`. Meanwhile, once the victim
/// is known, `meanwhile(µs since its tick's start)` is called at least every 20 ms (a fault of
/// the test's own at a moment of that tick).
async fn kill_first_runner(
    instances: &mut [Child],
    rx: &mut mpsc::UnboundedReceiver<(u32, String)>,
    deadline: tokio::time::Instant,
    into: Duration,
    (done, mut meanwhile): (impl Fn(u64, &[Event]) -> bool, impl FnMut(u128)),
) -> Killed {
    let (mut events, mut logs) = (Vec::new(), Vec::new());
    let mut victim: Option<(u32, u64)> = None;
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut killed_at = 0u128;
    loop {
        if let Some((_, tick)) = victim {
            meanwhile(now_us().saturating_sub(u128::from(tick) * 1000));
        }
        let soon = tokio::time::Instant::now() + Duration::from_millis(20);
        let wake = kill_at.map_or(soon, |k| k.min(soon));
        tokio::select! {
            () = tokio::time::sleep_until(wake), if victim.is_some() => {
                if kill_at.is_some_and(|k| k <= tokio::time::Instant::now()) {
                    let (pid, _) = victim.expect("a victim");
                    let child = instances.iter_mut().find(|c| c.id() == Some(pid)).unwrap();
                    child.start_kill().expect("SIGKILL");
                    killed_at = now_us();
                    kill_at = None;
                }
            }
            got = tokio::time::timeout_at(deadline, rx.recv()) => {
                let Ok(got) = got else {
                    panic!("not done within the limit; victim {victim:?}, events {events:?}, logs {logs:?}")
                };
                let (pid, line) = got.expect("printing");
                if line.starts_with("log") {
                    logs.push(line);
                    continue;
                }
                let Some(e) = parse(pid, &line) else { continue };
                if e.what == "start" && victim.is_none() {
                    // `into` into the tick (the tick value is its start in Unix ms).
                    let since = now_us().saturating_sub(u128::from(e.tick) * 1000);
                    let left = into.saturating_sub(Duration::from_micros(since as u64));
                    victim = Some((pid, e.tick));
                    kill_at = Some(tokio::time::Instant::now() + left);
                }
                events.push(e);
                if let Some((_, tick)) = victim
                    && done(tick, &events)
                {
                    let (victim, tick) = victim.unwrap();
                    return Killed { victim, tick, killed_at, events, logs };
                }
            }
        }
    }
}

/// Issue 27, rule 9: a tick whose runner died is never lost silently. Three instances, tick
/// 2 s, job 1.5 s, ttl 1 s; the runner of a tick is SIGKILLed 1.2 s into it, so its lease runs
/// out only after the tick's end: another instance runs that tick late (with a WARN), once,
/// and no two runs overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_late_in_its_tick_is_taken_over_after_the_tick_ends() {
    let redis = RedisServer::start().expect("start redis-server");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let args = ["--tick-ms", "2000", "--work-ms", "1500", "--ttl-ms", "1000"];
    let mut instances: Vec<Child> = (0..3).map(|_| start_with(&redis, &tx, &args)).collect();
    drop(tx);
    let deadline = tokio::time::Instant::now() + LIMIT;
    let finished = |tick: u64, events: &[Event]| {
        events
            .last()
            .is_some_and(|e| e.what == "end" && e.tick == tick)
    };
    let Killed {
        victim,
        tick,
        killed_at,
        events,
        ..
    } = kill_first_runner(
        &mut instances,
        &mut rx,
        deadline,
        support::ms(1_200),
        (finished, |_| {}),
    )
    .await;
    let ends: Vec<&Event> = events
        .iter()
        .filter(|e| e.what == "end" && e.tick == tick)
        .collect();
    assert_eq!(ends.len(), 1, "tick {tick}: {ends:?}");
    assert_ne!(
        ends[0].pid, victim,
        "the killed instance finished its tick: not mid-run"
    );
    assert!(
        ends[0].at_us > u128::from(tick + 2000) * 1000,
        "taken over after the tick's end, as the lease ran out then"
    );
    // No two runs at once: the killed run until the kill.
    let mut intervals: Vec<(u128, u128)> = events
        .iter()
        .filter(|e| e.what == "start")
        .filter_map(|s| {
            let end = events
                .iter()
                .find(|e| e.what == "end" && e.pid == s.pid && e.tick == s.tick)
                .map(|e| e.at_us);
            match end {
                Some(end) => Some((s.at_us, end)),
                None if s.pid == victim => Some((s.at_us, killed_at)),
                None => None,
            }
        })
        .collect();
    intervals.sort_unstable();
    for w in intervals.windows(2) {
        assert!(w[0].1 <= w[1].0, "runs overlap: {:?} and {:?}", w[0], w[1]);
    }
    stop_all(&mut instances, Some(victim), deadline).await;
}

/// Issue 27, rule 9, with one survivor: two instances, tick 2 s, job 1.9 s, ttl 1.5 s; the
/// runner of a tick is SIGKILLed 1.85 s into it. The survivor runs that tick late, which takes
/// it past the next tick's end: the next tick is run by nobody, and that is never silent (a
/// WARN names it), or it is run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_nobody_could_run_after_a_late_takeover_is_reported() {
    let redis = RedisServer::start().expect("start redis-server");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let args = ["--tick-ms", "2000", "--work-ms", "1900", "--ttl-ms", "1500"];
    let mut instances: Vec<Child> = (0..2).map(|_| start_with(&redis, &tx, &args)).collect();
    drop(tx);
    let deadline = tokio::time::Instant::now() + LIMIT;
    // Two ticks after the victim's have had their chance.
    let later = |tick: u64, events: &[Event]| {
        events
            .iter()
            .any(|e| e.what == "end" && e.tick >= tick + 3 * 2000)
    };
    let Killed {
        victim,
        tick,
        events,
        logs,
        ..
    } = kill_first_runner(
        &mut instances,
        &mut rx,
        deadline,
        support::ms(1_850),
        (later, |_| {}),
    )
    .await;
    let ends: Vec<u64> = (events.iter())
        .filter(|e| e.what == "end")
        .map(|e| e.tick)
        .collect();
    assert_eq!(
        ends.iter().filter(|&&t| t == tick).count(),
        1,
        "tick {tick}: {ends:?}"
    );
    let next = tick + 2000;
    let reported = logs
        .iter()
        .any(|l| l.contains("run by no instance") && l.contains(&format!("tick={next}")));
    let ran = ends.contains(&next);
    eprintln!("ends {ends:?}; logs {logs:#?}");
    assert!(
        ran || reported,
        "tick {next} after the late run of {tick}: neither run nor reported"
    );
    stop_all(&mut instances, Some(victim), deadline).await;
}

/// Rule: a tick whose runner died is never lost silently, also when the run that takes it
/// over late is cut short. Two instances (tick 2 s, job 1.5 s, ttl 1 s); the runner is killed
/// 1.2 s into its tick; the other takes the tick over after the tick's end, and the lock
/// server is stopped (SIGSTOP, 2 s) 2.6 s into the tick, so that late run loses its lock. The
/// tick is run to its end, or a WARN names it as not run. Before: only `tick runs late here`
/// (a start) and a lost lock named the claim's slot, not the tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_run_cut_short_by_a_stopped_server_is_reported() {
    let redis = RedisServer::start().expect("start redis-server");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let args = ["--tick-ms", "2000", "--work-ms", "1500", "--ttl-ms", "1000"];
    let mut instances: Vec<Child> = (0..2).map(|_| start_with(&redis, &tx, &args)).collect();
    drop(tx);
    let deadline = tokio::time::Instant::now() + LIMIT;
    let (paused, resumed) = (std::cell::Cell::new(false), std::cell::Cell::new(false));
    // The server stopped 2.6-4.6 s into the tick, while the late run holds its lock.
    let stop_server = |since_us: u128| {
        if !paused.get() && since_us >= 2_600_000 {
            redis.pause().expect("SIGSTOP redis-server");
            paused.set(true);
        }
        if paused.get() && !resumed.get() && since_us >= 4_600_000 {
            redis.resume().expect("SIGCONT redis-server");
            resumed.set(true);
        }
    };
    // Time for the survivor to look at the tick again.
    let looked_again = |tick: u64, events: &[Event]| {
        resumed.get()
            && events
                .iter()
                .any(|e| e.what == "end" && e.tick >= tick + 8_000)
    };
    let Killed {
        victim,
        tick,
        events,
        logs,
        ..
    } = kill_first_runner(
        &mut instances,
        &mut rx,
        deadline,
        support::ms(1_200),
        (looked_again, stop_server),
    )
    .await;
    let ran = events.iter().any(|e| e.what == "end" && e.tick == tick);
    let not_run = logs.iter().any(|l| {
        l.contains(&format!("tick={tick}"))
            && (l.contains("run by no instance") || l.contains("not known whether"))
    });
    assert!(
        ran || not_run,
        "tick {tick} of the killed runner neither run nor reported not run: {logs:#?}"
    );
    stop_all(&mut instances, Some(victim), deadline).await;
}
