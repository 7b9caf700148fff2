//! Single flight: when a cached value is missing, exactly one caller rebuilds it while the
//! others wait for the lock and then find the fresh value.
//!
//! ```sh
//! cargo run --example cache_rebuild
//! ```
//!
//! 50 concurrent readers over 3 `Locker`s (three connections, as three service instances would
//! have) hit a cold cache. A reader that misses calls the annotated `rebuild`, which checks the
//! cache again once it holds the lock: whoever rebuilt before it has already filled it. The slow
//! loader runs once. The lockers come from configuration (`LockerBuilder::from_env`: `LOCKRT_URL`
//! or `REDIS_URL`, ...); without one the example runner starts a throwaway `redis-server`.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockrt::{LockError, Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

mod runner;

const READERS: usize = 50;
const LOCKERS: usize = 3;

/// How often the expensive loader ran.
static LOADER_CALLS: AtomicU32 = AtomicU32::new(0);

#[derive(Debug)]
enum CacheError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl std::fmt::Display for CacheError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheError::Lock(e) => write!(f, "{e}"),
            CacheError::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

impl From<LockError> for CacheError {
    fn from(e: LockError) -> Self {
        CacheError::Lock(e)
    }
}

impl From<redis::RedisError> for CacheError {
    fn from(e: redis::RedisError) -> Self {
        CacheError::Redis(e)
    }
}

fn cache_key(report: &str) -> String {
    format!("cache:report:{report}")
}

/// The expensive part: a slow query, say.
async fn load(report: &str) -> String {
    LOADER_CALLS.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("{report}: 1,234 orders")
}

async fn cached(conn: &mut ConnectionManager, report: &str) -> Result<Option<String>, CacheError> {
    Ok(conn.get(cache_key(report)).await?)
}

/// The read path: the cache, or a rebuild on a miss.
async fn read(
    locker: &Locker,
    conn: &mut ConnectionManager,
    report: &str,
) -> Result<String, CacheError> {
    match cached(conn, report).await? {
        Some(hit) => Ok(hit),
        None => rebuild(locker, conn, report).await,
    }
}

/// One rebuild at a time per report, across every process sharing the Redis. `wait` covers a
/// load or two; `ttl` bounds how long a crashed rebuilder keeps the others out.
#[distributed_lock(key = "rebuild:{report}", locker = locker, ttl = "10s", wait = "5s")]
async fn rebuild(
    locker: &Locker,
    conn: &mut ConnectionManager,
    report: &str,
) -> Result<String, CacheError> {
    // Whoever held the lock before us may have filled the cache while we waited.
    if let Some(hit) = cached(conn, report).await? {
        return Ok(hit);
    }
    let value = load(report).await;
    let () = conn.set_ex(cache_key(report), &value, 60).await?;
    Ok(value)
}

async fn run() -> Result<bool, String> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start().map_err(|e| e.to_string())?;
    let client = redis::Client::open(redis.url()).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_connection_manager()
        .await
        .map_err(|e| format!("could not reach Redis: {e}"))?;
    let report = "daily-sales";
    let () = conn
        .del(cache_key(report))
        .await
        .map_err(|e| e.to_string())?;

    let mut lockers = Vec::new();
    for _ in 0..LOCKERS {
        // What a service writes: the locker from its configuration.
        let config = LockerBuilder::from_env().map_err(|e| e.to_string())?;
        let config = redis.apply(config); // example runner only
        lockers.push(config.build().await.map_err(|e| e.to_string())?);
    }
    let started = Instant::now();
    let readers: Vec<_> = (0..READERS)
        .map(|i| {
            let (locker, mut conn) = (lockers[i % LOCKERS].clone(), conn.clone());
            tokio::spawn(async move { read(&locker, &mut conn, report).await })
        })
        .collect();
    let mut values = Vec::new();
    for r in readers {
        match r.await {
            Ok(Ok(v)) => values.push(v),
            Ok(Err(e)) => eprintln!("reader failed: {e}"),
            Err(e) => eprintln!("reader task failed: {e}"),
        }
    }
    let elapsed = started.elapsed();
    let calls = LOADER_CALLS.load(Ordering::SeqCst);
    let expected = format!("{report}: 1,234 orders");
    let all_got_it = values.len() == READERS && values.iter().all(|v| *v == expected);

    println!("cache rebuild: {READERS} readers over {LOCKERS} lockers, cold cache");
    println!("  loader calls  {calls}");
    println!(
        "  values        {} of {READERS} readers got {expected:?}",
        values.len()
    );
    println!("  time          {} ms", elapsed.as_millis());
    Ok(calls == 1 && all_got_it)
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("  WRONG: expected one loader call and the value for every reader");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cache_rebuild: {e}");
            ExitCode::FAILURE
        }
    }
}
