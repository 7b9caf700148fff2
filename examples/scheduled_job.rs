//! A job that must run once per tick across a fleet: every instance calls `lockrt::spawn_every`
//! with the same name, the ticks follow the wall clock, and exactly one instance runs each tick.
//!
//! ```sh
//! cargo run --example scheduled_job -- --tick-ms 2000     # start it in two or three shells
//! ```
//!
//! Each run adds one to `report:runs` in Redis with a racy read-then-write (so two runs at once
//! would lose an update) and prints:
//!
//! ```text
//! start tick=1795582930000 at_us=1795582930001187 pid=4242
//! end tick=1795582930000 at_us=1795582930061540 pid=4242 runs=17
//! ```
//!
//! Kill the instance that is running (the `start` line without its `end`) and another takes the
//! tick over once the lease (`--ttl-ms`) runs out. Ctrl-C (or SIGTERM) stops an instance
//! gracefully: the job's handle stops it (`JobHandle::stop`), then `locker.shutdown()`, and
//! `stopped` is printed.
//!
//! Flags: `--tick-ms N` (default 2000), `--work-ms N` (the job's duration, default 100),
//! `--ttl-ms N` (the lease, default 1000: a dead instance's tick is taken over after it).
//! The locker comes from configuration (`LockerBuilder::from_env`: `LOCKRT_URL` or
//! `REDIS_URL`); without one the example runner starts a throwaway `redis-server`, which only
//! this instance sees.

use std::error::Error;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockrt::{LockOptions, LockerBuilder, Stop};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::signal::unix::{SignalKind, signal};

mod runner;

const USAGE: &str = "usage: scheduled_job [--tick-ms N] [--work-ms N] [--ttl-ms N]";

struct Config {
    tick: Duration,
    work: Duration,
    ttl: Duration,
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        tick: Duration::from_millis(2000),
        work: Duration::from_millis(100),
        ttl: Duration::from_millis(1000),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let ms = value
            .parse()
            .map(Duration::from_millis)
            .map_err(|_| format!("bad value {value:?} for {flag}\n{USAGE}"))?;
        match flag.as_str() {
            "--tick-ms" => cfg.tick = ms,
            "--work-ms" => cfg.work = ms,
            "--ttl-ms" => cfg.ttl = ms,
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(cfg)
}

fn unix_us(t: SystemTime) -> u128 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros())
}

/// The job: what a real one would do once per tick (a report, a clean-up), here a counter
/// updated with a read and a later write, which two runs at once would get wrong.
async fn report(mut store: ConnectionManager, tick: SystemTime, work: Duration) {
    let (tick_ms, pid) = (unix_us(tick) / 1000, std::process::id());
    println!(
        "start tick={tick_ms} at_us={} pid={pid}",
        unix_us(SystemTime::now())
    );
    let runs: Result<u64, redis::RedisError> = async {
        let runs: Option<u64> = store.get("report:runs").await?;
        tokio::time::sleep(work).await;
        let runs = runs.unwrap_or(0) + 1;
        let () = store.set("report:runs", runs).await?;
        Ok(runs)
    }
    .await;
    match runs {
        Ok(runs) => println!(
            "end tick={tick_ms} at_us={} pid={pid} runs={runs}",
            unix_us(SystemTime::now())
        ),
        // Logged, not fatal: the next tick tries again.
        Err(e) => tracing::error!("report store: {e}"),
    }
}

async fn serve(cfg: Config) -> Result<(), Box<dyn Error>> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;
    let locker = redis.apply(LockerBuilder::from_env()?).build().await?;
    let store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;

    let opts = LockOptions::new().ttl(cfg.ttl);
    let job = lockrt::spawn_every(&locker, "job:report", cfg.tick, opts, move |tick| {
        report(store.clone(), tick, cfg.work)
    })?;
    println!("ready pid={}", std::process::id());

    // Stop on Ctrl-C or SIGTERM: the job first (a service would stop its jobs, then drain
    // HTTP), then the locker. `Stop::Now` cancels a run under way, so another instance runs
    // its tick; `Stop::AfterRun` would let it finish here.
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    job.stop(Stop::Now).await?;
    locker.shutdown().await;
    println!("stopped pid={}", std::process::id());
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    runner::serve_main("scheduled_job", parse_args(), serve).await
}
