//! The 30-second version from the README: one attribute, and `deduct` runs for one item at a
//! time across every process that shares the Redis.
//!
//! ```sh
//! cargo run --example quickstart     # LOCKRT_URL / REDIS_URL, or a throwaway redis-server
//! ```
//!
//! The locker comes from configuration, as in a service (`LockerBuilder::from_env`, README
//! "Configuration"); the throwaway server is the example runner's convenience (`runner`).

use std::sync::OnceLock;

use lockrt::{LockError, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

mod runner;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
    Redis(redis::RedisError),
    OutOfStock,
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(e) => write!(f, "{e}"),
            AppError::Redis(e) => write!(f, "redis: {e}"),
            AppError::OutOfStock => write!(f, "out of stock"),
        }
    }
}

impl std::error::Error for AppError {}

impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e)
    }
}

impl From<redis::RedisError> for AppError {
    fn from(e: redis::RedisError) -> Self {
        AppError::Redis(e)
    }
}

static STORE: OnceLock<ConnectionManager> = OnceLock::new();

async fn read_stock(id: u64) -> Result<u32, AppError> {
    let mut store = STORE.get().expect("connected in main").clone();
    Ok(store.get(format!("stock:{id}")).await?)
}

async fn write_stock(id: u64, left: u32) -> Result<(), AppError> {
    let mut store = STORE.get().expect("connected in main").clone();
    Ok(store.set(format!("stock:{id}"), left).await?)
}

#[distributed_lock(key = "stock:<id>", ttl = "30s", wait = "5s")]
async fn deduct(id: u64, qty: u32) -> Result<u32, AppError> {
    // Runs only while this process holds lock:stock:<id>; renewed every 10 s while it runs.
    let stock = read_stock(id).await?;
    let left = stock.checked_sub(qty).ok_or(AppError::OutOfStock)?;
    write_stock(id, left).await?;
    Ok(left)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;

    // What a service writes: the locker from its configuration (LOCKRT_URL or REDIS_URL, ...).
    let config = LockerBuilder::from_env()?;
    let config = redis.apply(config); // example runner only
    lockrt::set_default(config.build().await?);
    let _ = STORE.set(
        redis::Client::open(redis.url())?
            .get_connection_manager()
            .await?,
    );
    write_stock(1, 10).await?;

    // Twelve buyers at once for ten units: ten succeed, two find it sold out, none oversell.
    let buyers: Vec<_> = (0..12).map(|_| tokio::spawn(deduct(1, 1))).collect();
    let (mut sold, mut out) = (0, 0);
    for b in buyers {
        match b.await? {
            Ok(_) => sold += 1,
            Err(AppError::OutOfStock) => out += 1,
            Err(e) => return Err(e.into()),
        }
    }
    println!("sold {sold}, sold out {out}, left {}", read_stock(1).await?);
    Ok(())
}
