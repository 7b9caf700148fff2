//! Workload 7, the hot key across OS processes: 2 and 4 processes (this bench binary started
//! again as a worker, `BENCH_WORKER`), 16 tasks each on one `Locker` per process, running
//! sections (`GET counter`, `SET counter v+1`) on one key for a fixed time. Sections/s against
//! the serial floor, lost updates, each process's share (Jain's index), overlaps, and the
//! longest run of sections one process held in a row (how long another process's waiter
//! waited, in sections). With local hand-off (the default, 16) and without (`0`), and again
//! with 1 ms round trip added by a `FaultProxy` (0.5 ms each way), where the lock's own round
//! trips, not the section, bound a lock without local hand-off.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockrt::testing::{Direction, FaultProxy};
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;

use crate::Res;
use crate::config::Config;
use crate::env::Env;
use crate::stats::Figures;
use crate::table::{Table, Unit};

const PROCS: &str = "7 hot key, processes";
const KEY: &str = "bench:p";
const COUNTER: &str = "bench:p:counter";
const TASKS: usize = 16;

/// The variable that makes this binary a worker: `<url>|<tasks>|<ms>|<pass_limit>`.
pub(crate) const WORKER: &str = "BENCH_WORKER";

/// A worker process: `tasks` tasks on one `Locker` running sections until `ms` have passed;
/// prints one line per section, `<acquired µs> <released µs>` (wall clock, shared by all
/// processes of the machine).
pub(crate) async fn worker(spec: &str) -> Res<()> {
    let parts: Vec<&str> = spec.split('|').collect();
    let [url, tasks, ms, pass] = parts[..] else {
        return Err(format!("bad {WORKER}: {spec:?}").into());
    };
    let locker = Locker::builder()
        .url(url)
        .local_handoff(pass.parse()?)
        .build()
        .await?;
    let client = redis::Client::open(url)?;
    let end = Instant::now() + Duration::from_millis(ms.parse()?);
    let mut handles = Vec::new();
    for _ in 0..tasks.parse::<usize>()? {
        let locker = locker.clone();
        let mut conn = client.get_multiplexed_async_connection().await?;
        handles.push(tokio::spawn(async move {
            let mut spans = Vec::new();
            let opts = LockOptions::new().wait(Duration::from_secs(30));
            while Instant::now() < end {
                let g = locker.acquire(KEY, opts).await?;
                let start = wall_us();
                let v: i64 = conn.get(COUNTER).await.unwrap_or(0);
                let () = conn.set(COUNTER, v + 1).await?;
                spans.push((start, wall_us()));
                g.release().await?;
            }
            Ok::<_, crate::BoxError>(spans)
        }));
    }
    let mut out = String::new();
    for h in handles {
        for (a, b) in h.await?? {
            out.push_str(&format!("{a} {b}\n"));
        }
    }
    print!("{out}");
    Ok(())
}

fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// What one run of `n` processes saw.
struct Run {
    per_sec: f64,
    lost: f64,
    jain: f64,
    overlaps: f64,
    longest_run: f64,
}

/// Starts `n` workers against `url`, waits for them and reads what they did.
async fn run_procs(env: &Env, url: &str, n: usize, pass: u32, ms: u64) -> Res<Run> {
    let mut conn = env.manager().await?;
    let () = conn.set(COUNTER, 0).await?;
    let exe = std::env::current_exe()?;
    let start = Instant::now();
    let children: Vec<_> = (0..n)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .env(WORKER, format!("{url}|{TASKS}|{ms}|{pass}"))
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
        })
        .collect::<Result<_, _>>()?;
    let mut spans: Vec<(u64, u64, usize)> = Vec::new();
    let mut counts = Vec::new();
    for (i, child) in children.into_iter().enumerate() {
        let out =
            tokio::time::timeout(Duration::from_secs(120), child.wait_with_output()).await??;
        if !out.status.success() {
            return Err(format!("worker {i} failed: {}", out.status).into());
        }
        let text = String::from_utf8(out.stdout)?;
        let before = spans.len();
        for line in text.lines() {
            let (a, b) = line.split_once(' ').ok_or("odd worker line")?;
            spans.push((a.parse()?, b.parse()?, i));
        }
        counts.push((spans.len() - before) as f64);
    }
    let took = start.elapsed();
    let got: i64 = conn.get(COUNTER).await?;
    spans.sort();
    let sum: f64 = counts.iter().sum();
    let squares: f64 = counts.iter().map(|c| c * c).sum();
    Ok(Run {
        per_sec: spans.len() as f64 / took.as_secs_f64(),
        lost: spans.len() as f64 - got as f64,
        jain: sum * sum / (n as f64 * squares),
        overlaps: spans.windows(2).filter(|w| w[1].0 < w[0].1).count() as f64,
        longest_run: longest_run(&spans),
    })
}

/// The longest run of sections one process held in a row, in holding order, leaving out the
/// first and last tenth (start and end, when not every process is contending).
fn longest_run(spans: &[(u64, u64, usize)]) -> f64 {
    let cut = spans.len() / 10;
    let inner = &spans[cut..spans.len() - cut];
    let (mut longest, mut run) = (0, 0);
    for (i, s) in inner.iter().enumerate() {
        run = if i > 0 && inner[i - 1].2 == s.2 {
            run + 1
        } else {
            1
        };
        longest = longest.max(run);
    }
    longest as f64
}

/// The serial floor through `url`: one task doing the section back to back for `ms`.
async fn serial(url: &str, ms: u64) -> Res<f64> {
    let mut conn = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let end = Instant::now() + Duration::from_millis(ms);
    let (start, mut n) = (Instant::now(), 0u64);
    while Instant::now() < end {
        let v: i64 = conn.get(COUNTER).await.unwrap_or(0);
        let () = conn.set(COUNTER, v + 1).await?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn imp_name(n: usize, pass: u32, rtt: bool) -> String {
    format!(
        "lockrt, {n} processes × {TASKS} tasks, pass_limit {pass}{}",
        if rtt { ", +1 ms RTT" } else { "" }
    )
}

/// Per round (at most 3): for 0 and 1 ms added round trip, the serial floor, then 2 and 4 processes with
/// local hand-off on (16) and off (0).
pub(crate) async fn run(env: &Env, cfg: &Config, figs: &mut Figures) -> Res<()> {
    eprintln!("workload 7: hot key across processes");
    let server_addr = env
        .client
        .get_connection_info()
        .addr()
        .to_string()
        .parse()?;
    let proxy = FaultProxy::start(server_addr)?;
    proxy.delay(Direction::ToServer, Duration::from_micros(500));
    proxy.delay(Direction::ToClient, Duration::from_micros(500));
    let ms = if cfg.quick { 800 } else { 2_000 };
    // Each round starts 8 sets of processes per network: fewer rounds than the others.
    for n_round in 1..=cfg.rounds.min(3) {
        for (rtt, url) in [(false, env.url.clone()), (true, proxy.url())] {
            let floor = serial(&url, ms).await?;
            figs.add(PROCS, &floor_name(rtt), "sections/s", floor);
            for n in [2, 4] {
                for pass in [16, 0] {
                    let r = run_procs(env, &url, n, pass, ms).await?;
                    let imp = imp_name(n, pass, rtt);
                    figs.add(PROCS, &imp, "sections/s", r.per_sec);
                    figs.add(PROCS, &imp, "lost", r.lost);
                    figs.add(PROCS, &imp, "jain", r.jain);
                    figs.add(PROCS, &imp, "overlaps", r.overlaps);
                    figs.add(PROCS, &imp, "longest run", r.longest_run);
                }
            }
        }
        eprintln!("  processes round {n_round} done");
    }
    Ok(())
}

fn floor_name(rtt: bool) -> String {
    format!(
        "floor (serial, no lock{})",
        if rtt { ", +1 ms RTT" } else { "" }
    )
}

/// Each column against the serial floor of its network.
pub(crate) fn report(figs: &Figures, t: &mut Table) {
    for rtt in [false, true] {
        let floor = figs.get(PROCS, &floor_name(rtt), "sections/s");
        t.row(PROCS, &floor_name(rtt), "sections/s", floor, Unit::PerSec);
        for n in [2, 4] {
            for pass in [16, 0] {
                let imp = imp_name(n, pass, rtt);
                let get = |m: &str| figs.get(PROCS, &imp, m);
                let rate = get("sections/s");
                let row = t.row(PROCS, &imp, "sections/s", rate, Unit::PerSec);
                row.ratio(rate / floor, "of serial floor");
                if n == 2 && pass == 16 && !rtt {
                    row.target("≥ 0.8x serial floor").met(rate / floor >= 0.8);
                }
                if rtt && pass == 16 {
                    let without = figs.get(PROCS, &imp_name(n, 0, true), "sections/s");
                    t.row(PROCS, &imp, "vs pass_limit 0", rate / without, Unit::X)
                        .target("≥ 5x")
                        .met(rate / without >= 5.0);
                }
                t.row(PROCS, &imp, "lost updates", get("lost"), Unit::Count)
                    .target("0")
                    .met(get("lost") == 0.0);
                t.row(
                    PROCS,
                    &imp,
                    "overlapping sections",
                    get("overlaps"),
                    Unit::Count,
                )
                .target("0")
                .met(get("overlaps") == 0.0);
                t.row(PROCS, &imp, "share (Jain's index)", get("jain"), Unit::X);
                let run = get("longest run");
                let row = t.row(PROCS, &imp, "longest run of one process", run, Unit::Count);
                if pass > 0 {
                    row.target(&format!("≤ {}", pass + 1))
                        .met(run <= f64::from(pass + 1));
                }
            }
        }
    }
}
