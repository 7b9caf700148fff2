//! Account transfers under a multi-key lock: each transfer locks both accounts with
//! `#[distributed_lock(keys = ["acct:{from}", "acct:{to}"])]`, all or none, so money is never
//! created or lost, and two transfers between the same accounts in opposite directions never
//! deadlock (the keys are always taken in one order).
//!
//! ```sh
//! cargo run --example transfer
//! ```
//!
//! 40 tasks over 3 `Locker`s (as three service instances would have) make 400 random
//! transfers among 5 accounts, each a racy read-then-write of two balances in Redis. At the
//! end the balances must still add up to the starting total:
//!
//! ```text
//! transfers  400
//! refused    0
//! total      5000 (started with 5000)
//! ```
//!
//! `--no-lock` runs the same transfers without the lock and shows the total drift. The lockers
//! come from configuration (`LockerBuilder::from_env`); without a URL the example runner starts
//! a throwaway `redis-server`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use lockrt::{LockError, Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

mod runner;

const ACCOUNTS: u64 = 5;
const START: i64 = 1_000;
const TASKS: u64 = 40;
const PER_TASK: u64 = 10;
const LOCKERS: usize = 3;

fn account(id: u64) -> String {
    format!("bank:acct:{id}")
}

#[derive(Debug)]
enum BankError {
    Lock(LockError),
    Store(redis::RedisError),
}

impl std::fmt::Display for BankError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BankError::Lock(e) => write!(f, "{e}"),
            BankError::Store(e) => write!(f, "store: {e}"),
        }
    }
}

impl From<LockError> for BankError {
    fn from(e: LockError) -> Self {
        BankError::Lock(e)
    }
}

impl From<redis::RedisError> for BankError {
    fn from(e: redis::RedisError) -> Self {
        BankError::Store(e)
    }
}

/// Moves `cents` from one account to the other: read both, wait (a fraud check, say), write
/// both. Racy on purpose: only the lock on both accounts makes it safe.
async fn move_money(
    store: &mut ConnectionManager,
    from: u64,
    to: u64,
    cents: i64,
) -> Result<(), BankError> {
    let a: i64 = store.get(account(from)).await?;
    let b: i64 = store.get(account(to)).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let () = store.set(account(from), a - cents).await?;
    let () = store.set(account(to), b + cents).await?;
    Ok(())
}

/// Both accounts or neither, within 5 s, whatever order `from` and `to` come in.
#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], locker = locker, ttl = "10s", wait = "5s")]
async fn transfer(
    locker: &Locker,
    store: &mut ConnectionManager,
    from: u64,
    to: u64,
    cents: i64,
) -> Result<(), BankError> {
    move_money(store, from, to, cents).await
}

/// A deterministic spread of (from, to, cents) for transfer `n` of task `task`.
fn pick(task: u64, n: u64) -> (u64, u64, i64) {
    let x = task * 7919 + n * 104_729;
    let from = x % ACCOUNTS;
    let to = (from + 1 + (x / ACCOUNTS) % (ACCOUNTS - 1)) % ACCOUNTS;
    (from, to, (x % 50) as i64 + 1)
}

async fn run(no_lock: bool) -> Result<bool, Box<dyn std::error::Error>> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;
    let mut store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;
    for id in 0..ACCOUNTS {
        let () = store.set(account(id), START).await?;
    }
    let mut lockers = Vec::new();
    for _ in 0..LOCKERS {
        lockers.push(redis.apply(LockerBuilder::from_env()?).build().await?);
    }
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (locker, mut store) = (lockers[task as usize % LOCKERS].clone(), store.clone());
        let refused = refused.clone();
        tasks.spawn(async move {
            for n in 0..PER_TASK {
                let (from, to, cents) = pick(task, n);
                let res = if no_lock {
                    move_money(&mut store, from, to, cents).await
                } else {
                    transfer(&locker, &mut store, from, to, cents).await
                };
                if let Err(e) = res {
                    eprintln!("transfer {from} -> {to} refused: {e}");
                    refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        });
    }
    while let Some(res) = tasks.join_next().await {
        res?;
    }
    let mut total = 0;
    for id in 0..ACCOUNTS {
        total += store.get::<_, i64>(account(id)).await?;
    }
    let refused = refused.load(std::sync::atomic::Ordering::SeqCst);
    println!("transfers  {}", TASKS * PER_TASK - refused);
    println!("refused    {refused}");
    println!(
        "total      {total} (started with {})",
        START * ACCOUNTS as i64
    );
    for locker in &lockers {
        locker.shutdown().await;
    }
    Ok(no_lock || (total == START * ACCOUNTS as i64 && refused == 0))
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    let no_lock = std::env::args().skip(1).any(|a| a == "--no-lock");
    match run(no_lock).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("transfer: money was created or lost");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("transfer: {e}");
            ExitCode::FAILURE
        }
    }
}
