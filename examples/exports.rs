//! Export slots per tenant with a semaphore: `#[distributed_lock(key = "export:{tenant}",
//! permits = 3)]` lets at most 3 exports of a tenant run at once across every instance (each
//! holds a leased permit), queues the rest, and keeps tenants apart: one tenant's burst never
//! takes another's slots.
//!
//! ```sh
//! cargo run --example exports
//! cargo run --example exports -- --no-lock   # the same exports without the semaphore
//! ```
//!
//! 3 `Locker`s (as three service instances would have) run 12 export requests for each of 3
//! tenants, all at once. Each export counts itself in `exports:<tenant>:running` while it works
//! (an `INCR` that also raises `exports:<tenant>:max_running`, a `DECR` at the end), so the
//! counters show how many ran at once across the instances:
//!
//! ```text
//! tenant acme      exports 12  max_at_once 3
//! tenant globex    exports 12  max_at_once 3
//! tenant initech   exports 12  max_at_once 3
//! exports      36
//! busy         0
//! max_at_once  3
//! crashed holder pid 4242 killed holding a permit of export:acme (fence 57458918602299936)
//! permit_back_ms 997
//! ```
//!
//! Then a crash: a second process (this program with `--hold TENANT`) takes one of acme's
//! permits and is killed with SIGKILL, so it neither releases nor renews it. Two permits are
//! free at once, the third comes back when the dead holder's lease (`ttl`, 1 s) runs out:
//! `permit_back_ms` is how long a new export waited for it. `--no-lock` skips that part.
//!
//! Flags: `--work-ms N` (one export's duration, default 20). The lockers come from
//! configuration (`LockerBuilder::from_env`); without a URL the example runner starts a
//! throwaway `redis-server` (and hands its URL to the second process).

use std::error::Error;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use lockrt::{LockError, LockOptions, Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use tokio::io::{AsyncBufReadExt, BufReader};

mod runner;

const USAGE: &str = "usage: exports [--no-lock] [--work-ms N] | exports --hold TENANT";

const TENANTS: [&str; 3] = ["acme", "globex", "initech"];
const PER_TENANT: u64 = 12;
const LOCKERS: usize = 3;
/// The attribute's `permits = 3`: what the report checks against.
const SLOTS: u64 = 3;
/// Bounds the wait for the crashed holder to take its permit, and for the permit to return.
const STEP_LIMIT: Duration = Duration::from_secs(30);

/// `INCR` the running count and raise the recorded maximum, atomically: the two in one script
/// so no export's figure is missed between them.
const ENTER: &str = r"
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n";

fn key(tenant: &str, what: &str) -> String {
    // The semaphore is `lock:export:<tenant>` (the locker's prefix): no clash with these.
    format!("exports:{tenant}:{what}")
}

/// Produces one export: counted as running while it works; the file's URL.
async fn produce(
    store: &mut ConnectionManager,
    tenant: &str,
    work: Duration,
) -> Result<String, redis::RedisError> {
    let _: u64 = redis::Script::new(ENTER)
        .key(key(tenant, "running"))
        .key(key(tenant, "max_running"))
        .invoke_async(store)
        .await?;
    // Querying and writing the file: the heavy part the slots are rationed for.
    tokio::time::sleep(work).await;
    let _: i64 = store.decr(key(tenant, "running"), 1).await?;
    let n: u64 = store.incr(key(tenant, "done"), 1).await?;
    Ok(format!("https://files.example/exports/{tenant}/{n}.csv"))
}

#[derive(Debug)]
enum ExportError {
    Lock(LockError),
    Store(redis::RedisError),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Lock(e) => write!(f, "{e}"),
            ExportError::Store(e) => write!(f, "store: {e}"),
        }
    }
}

impl From<LockError> for ExportError {
    fn from(e: LockError) -> Self {
        ExportError::Lock(e)
    }
}

impl From<redis::RedisError> for ExportError {
    fn from(e: redis::RedisError) -> Self {
        ExportError::Store(e)
    }
}

/// One of the tenant's 3 slots, waiting up to 30 s for one. `ttl = "1s"`: the watchdog renews
/// the permit while the export runs, and a crashed exporter's permit is back within a second.
#[distributed_lock(key = "export:{tenant}", locker = locker, permits = 3, ttl = "1s", wait = "30s")]
async fn export(
    locker: &Locker,
    store: &mut ConnectionManager,
    tenant: &str,
    work: Duration,
) -> Result<String, ExportError> {
    Ok(produce(store, tenant, work).await?)
}

/// Every request at once, spread over the lockers; how many were refused.
async fn run_exports(
    lockers: &[Locker],
    store: &ConnectionManager,
    no_lock: bool,
    work: Duration,
) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, tenant) in (0..PER_TENANT).flat_map(|_| TENANTS).enumerate() {
        let (locker, mut store) = (lockers[i % LOCKERS].clone(), store.clone());
        tasks.spawn(async move {
            let res = if no_lock {
                produce(&mut store, tenant, work).await.map_err(Into::into)
            } else {
                export(&locker, &mut store, tenant, work).await
            };
            res.map_err(|e| eprintln!("export for {tenant} refused: {e}"))
                .is_err()
        });
    }
    let mut busy = 0;
    while let Some(refused) = tasks.join_next().await {
        busy += u64::from(refused.unwrap_or(true));
    }
    busy
}

/// Prints each tenant's figures and the totals; whether no tenant ran more than its slots.
async fn report(store: &mut ConnectionManager, busy: u64) -> Result<bool, redis::RedisError> {
    let (mut total, mut most) = (0, 0);
    for tenant in TENANTS {
        let done: Option<u64> = store.get(key(tenant, "done")).await?;
        let max: Option<u64> = store.get(key(tenant, "max_running")).await?;
        let (done, max) = (done.unwrap_or(0), max.unwrap_or(0));
        println!("tenant {tenant:<9} exports {done}  max_at_once {max}");
        total += done;
        most = most.max(max);
    }
    println!("exports      {total}");
    println!("busy         {busy}");
    println!("max_at_once  {most}");
    Ok(most <= SLOTS && total == PER_TENANT * TENANTS.len() as u64 && busy == 0)
}

/// Starts this program as a second process holding one of `tenant`'s permits; its pid and
/// the line it printed once it held it.
async fn start_holder(
    redis: &runner::DevRedis,
    tenant: &str,
) -> Result<(tokio::process::Child, String), Box<dyn Error>> {
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.args(["--hold", tenant])
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    if redis.is_throwaway() {
        // Configured runs pass their LOCKRT_URL or REDIS_URL on by inheritance.
        cmd.env("REDIS_URL", redis.url());
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let line = tokio::time::timeout(STEP_LIMIT, BufReader::new(stdout).lines().next_line())
        .await
        .map_err(|_| "the holder took no permit in time")??
        .ok_or("the holder exited before taking a permit")?;
    Ok((child, line))
}

/// Kills a process holding one of acme's 3 permits, then takes the 3: two at once, the third
/// once the dead holder's lease runs out. How long that took.
async fn crash_demo(locker: &Locker, redis: &runner::DevRedis) -> Result<Duration, Box<dyn Error>> {
    let (mut holder, line) = start_holder(redis, "acme").await?;
    let pid = holder.id().unwrap_or(0);
    holder.kill().await?;
    println!("crashed holder pid {pid} killed {line}");

    let opts = LockOptions::new().permits(3).ttl(Duration::from_secs(10));
    let mut held = Vec::new();
    for _ in 0..2 {
        let g = locker.try_acquire("export:acme", opts).await?;
        held.push(g.ok_or("fewer than two permits free after the crash")?);
    }
    if locker.try_acquire("export:acme", opts).await?.is_some() {
        return Err("the dead holder's permit was free at once: its lease was not kept".into());
    }
    let started = Instant::now();
    held.push(locker.acquire("export:acme", opts.wait(STEP_LIMIT)).await?);
    let back = started.elapsed();
    for g in held {
        g.release().await?;
    }
    Ok(back)
}

/// `--hold TENANT`: takes one of the tenant's permits (the runtime API, same key and count as
/// the attribute), says so, and works until killed (at most a minute).
async fn hold(tenant: &str) -> Result<(), Box<dyn Error>> {
    let redis = runner::DevRedis::configured_or_start()?;
    let locker = redis.apply(LockerBuilder::from_env()?).build().await?;
    let opts = LockOptions::new()
        .permits(3)
        .ttl(Duration::from_secs(1))
        .wait(STEP_LIMIT);
    let key = format!("export:{tenant}");
    locker
        .run(&key, opts, async {
            let held = lockrt::current_lock().ok_or("no lock in the section")?;
            println!(
                "holding a permit of {} (fence {})",
                held.key(),
                held.fence()
            );
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Box<dyn Error>>(())
        })
        .await??;
    Ok(())
}

async fn run(no_lock: bool, work: Duration) -> Result<bool, Box<dyn Error>> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;
    let mut store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;
    for tenant in TENANTS {
        let () = store
            .del(&[
                key(tenant, "running"),
                key(tenant, "max_running"),
                key(tenant, "done"),
            ])
            .await?;
    }
    let mut lockers = Vec::new();
    for _ in 0..LOCKERS {
        lockers.push(redis.apply(LockerBuilder::from_env()?).build().await?);
    }
    let busy = run_exports(&lockers, &store, no_lock, work).await;
    let ok = report(&mut store, busy).await?;
    if !no_lock {
        let back = crash_demo(&lockers[0], &redis).await?;
        println!("permit_back_ms {}", back.as_millis());
    }
    for locker in &lockers {
        locker.shutdown().await;
    }
    Ok(no_lock || ok)
}

enum Mode {
    Demo { no_lock: bool, work: Duration },
    Hold(String),
}

fn parse_args() -> Result<Mode, String> {
    let (mut no_lock, mut work, mut hold) = (false, Duration::from_millis(20), None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        match flag.as_str() {
            "--no-lock" => no_lock = true,
            "--work-ms" => {
                let v = value()?;
                let ms = v
                    .parse()
                    .map_err(|_| format!("bad value {v:?} for {flag}"))?;
                work = Duration::from_millis(ms);
            }
            "--hold" => hold = Some(value()?),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(match hold {
        Some(tenant) => Mode::Hold(tenant),
        None => Mode::Demo { no_lock, work },
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    let res = match parse_args() {
        Ok(Mode::Hold(tenant)) => hold(&tenant).await.map(|()| true),
        Ok(Mode::Demo { no_lock, work }) => run(no_lock, work).await,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("exports: a tenant ran more exports at once than its slots, or one failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("exports: {e}");
            ExitCode::FAILURE
        }
    }
}
