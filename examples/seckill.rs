//! Flash sale: N units of stock, M buyers spread over several OS processes, each buyer calling
//! an annotated `deduct(item)` that does a deliberately non-atomic read-check-write of the
//! stock. With the lock, exactly N units are sold; with `--no-lock`, the same code oversells.
//!
//! ```sh
//! cargo xtask demo                  # or: cargo run --release --example seckill
//! cargo xtask demo -- --no-lock     # the oversell the lock prevents
//! cargo run --release --example seckill -- --stock 100 --buyers 1000 --procs 4 --work-ms 1
//! ```
//!
//! Each process builds its locker from configuration (`LockerBuilder::from_env`: `LOCKRT_URL` or
//! `REDIS_URL`, ...); without one the example runner starts a throwaway `redis-server`. The
//! parent seeds the stock, spawns `--procs` copies of itself (each one a separate `Locker`, as
//! separate service instances would be), and sums up what they sold.

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use lockrt::{LockError, Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

mod runner;

const ITEM: u64 = 1;
const USAGE: &str = "usage: seckill [--stock N] [--buyers N] [--procs N] [--work-ms N] [--no-lock]";

/// What the sale runs with; the child processes get the same flags plus `--child`.
#[derive(Clone, Debug)]
struct Config {
    stock: u64,
    buyers: u64,
    procs: u64,
    work: Duration,
    lock: bool,
    child: bool,
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        stock: 100,
        buyers: 1_000,
        procs: 4,
        work: Duration::from_millis(1),
        lock: true,
        child: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let v = args
                .next()
                .ok_or(format!("{name} needs a number\n{USAGE}"))?;
            v.parse()
                .map_err(|_| format!("{name} needs a number, got {v:?}\n{USAGE}"))
        };
        match flag.as_str() {
            "--stock" => cfg.stock = number("--stock")?,
            "--buyers" => cfg.buyers = number("--buyers")?,
            "--procs" => cfg.procs = number("--procs")?,
            "--work-ms" => cfg.work = Duration::from_millis(number("--work-ms")?),
            "--no-lock" => cfg.lock = false,
            "--child" => cfg.child = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if cfg.procs == 0 || cfg.buyers == 0 {
        return Err(format!("--procs and --buyers must be at least 1\n{USAGE}"));
    }
    Ok(cfg)
}

/// A buyer's failure: the lock (busy for the whole wait, lost, Redis down) or a Redis command.
#[derive(Debug)]
enum SaleError {
    Lock(LockError),
    Redis(redis::RedisError),
}

impl std::fmt::Display for SaleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaleError::Lock(e) => write!(f, "{e}"),
            SaleError::Redis(e) => write!(f, "redis: {e}"),
        }
    }
}

impl From<LockError> for SaleError {
    fn from(e: LockError) -> Self {
        SaleError::Lock(e)
    }
}

impl From<redis::RedisError> for SaleError {
    fn from(e: redis::RedisError) -> Self {
        SaleError::Redis(e)
    }
}

enum Outcome {
    Bought,
    SoldOut,
}

fn stock_key(item: u64) -> String {
    format!("seckill:stock:{item}")
}

fn sold_key(item: u64) -> String {
    format!("seckill:sold:{item}")
}

/// The critical section: read the stock, check it, write it back one lower. Racy on purpose;
/// `work` stands for what a real service does in between (a payment check, say).
async fn read_check_write(
    conn: &mut ConnectionManager,
    item: u64,
    work: Duration,
) -> Result<Outcome, SaleError> {
    let left: i64 = conn.get(stock_key(item)).await?;
    if left <= 0 {
        return Ok(Outcome::SoldOut);
    }
    tokio::time::sleep(work).await;
    let () = conn.set(stock_key(item), left - 1).await?;
    // An atomic tally of units handed out, to count what the racy stock figure hides.
    let _: i64 = conn.incr(sold_key(item), 1).await?;
    Ok(Outcome::Bought)
}

/// One buyer's purchase, under the lock `lock:stock:<item>`. A long `wait`: buyers queue
/// rather than give up, as they would at a sale that is still running.
#[distributed_lock(key = "stock:<item>", locker = locker, ttl = "10s", wait = "60s")]
async fn deduct(
    locker: &Locker,
    conn: &mut ConnectionManager,
    item: u64,
    work: Duration,
) -> Result<Outcome, SaleError> {
    read_check_write(conn, item, work).await
}

/// What one process's buyers got.
#[derive(Default, Debug)]
struct Tally {
    bought: u64,
    sold_out: u64,
    busy: u64,
    errors: u64,
}

impl Tally {
    fn line(&self) -> String {
        format!(
            "tally bought={} sold_out={} busy={} errors={}",
            self.bought, self.sold_out, self.busy, self.errors
        )
    }

    fn parse(line: &str) -> Option<Tally> {
        let mut t = Tally::default();
        for field in line.strip_prefix("tally ")?.split(' ') {
            let (name, value) = field.split_once('=')?;
            let value = value.parse().ok()?;
            match name {
                "bought" => t.bought = value,
                "sold_out" => t.sold_out = value,
                "busy" => t.busy = value,
                "errors" => t.errors = value,
                _ => return None,
            }
        }
        Some(t)
    }

    fn add(&mut self, o: &Tally) {
        self.bought += o.bought;
        self.sold_out += o.sold_out;
        self.busy += o.busy;
        self.errors += o.errors;
    }
}

/// A child process: its share of the buyers, all at once, on one `Locker`.
async fn buy(cfg: &Config, url: &str) -> Result<Tally, String> {
    // What a service writes: the locker from its configuration (LOCKRT_URL, set by the parent).
    let locker = LockerBuilder::from_env()
        .map_err(|e| e.to_string())?
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let client = redis::Client::open(url).map_err(|e| e.to_string())?;
    let conn = client
        .get_connection_manager()
        .await
        .map_err(|e| e.to_string())?;
    let tasks: Vec<_> = (0..cfg.buyers)
        .map(|_| {
            let (locker, mut conn, work, lock) = (locker.clone(), conn.clone(), cfg.work, cfg.lock);
            tokio::spawn(async move {
                if lock {
                    deduct(&locker, &mut conn, ITEM, work).await
                } else {
                    read_check_write(&mut conn, ITEM, work).await
                }
            })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        match task.await {
            Ok(Ok(Outcome::Bought)) => tally.bought += 1,
            Ok(Ok(Outcome::SoldOut)) => tally.sold_out += 1,
            Ok(Err(SaleError::Lock(e))) if e.is_timeout() => tally.busy += 1,
            Ok(Err(e)) => {
                eprintln!("buyer failed: {e}");
                tally.errors += 1;
            }
            Err(e) => {
                eprintln!("buyer task failed: {e}");
                tally.errors += 1;
            }
        }
    }
    Ok(tally)
}

/// The parent: seed, spawn the buyer processes, add up, report.
async fn sale(cfg: &Config) -> Result<bool, String> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start().map_err(|e| e.to_string())?;
    let client = redis::Client::open(redis.url()).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("could not reach Redis: {e}"))?;
    let () = conn
        .set(stock_key(ITEM), cfg.stock)
        .await
        .map_err(|e| e.to_string())?;
    let () = conn.del(sold_key(ITEM)).await.map_err(|e| e.to_string())?;

    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut children = Vec::new();
    for p in 0..cfg.procs {
        // Spread the buyers evenly; the first processes take the remainder.
        let share = cfg.buyers / cfg.procs + u64::from(p < cfg.buyers % cfg.procs);
        let mut cmd = tokio::process::Command::new(&exe);
        cmd.args(["--child", "--buyers", &share.to_string()])
            .args(["--work-ms", &cfg.work.as_millis().to_string()])
            .args(if cfg.lock { None } else { Some("--no-lock") })
            // The URL may hold a password: the environment keeps it out of `ps`.
            .env("LOCKRT_URL", redis.url())
            .env("REDIS_URL", redis.url())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        children.push(
            cmd.spawn()
                .map_err(|e| format!("could not start a buyer: {e}"))?,
        );
    }
    let mut total = Tally::default();
    for child in children {
        let out = child.wait_with_output().await.map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        match stdout.lines().find_map(Tally::parse) {
            Some(t) if out.status.success() => total.add(&t),
            _ => return Err(format!("a buyer process failed ({})", out.status)),
        }
    }
    let elapsed = started.elapsed();

    let sold: u64 = conn
        .get::<_, Option<u64>>(sold_key(ITEM))
        .await
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    let remaining: i64 = conn.get(stock_key(ITEM)).await.map_err(|e| e.to_string())?;
    // Units handed out beyond what the stock allowed.
    let oversold = (sold as i64 + remaining - cfg.stock as i64).max(0);

    println!(
        "flash sale: {} units, {} buyers in {} processes, lock {}{}",
        cfg.stock,
        cfg.buyers,
        cfg.procs,
        if cfg.lock { "on" } else { "OFF" },
        if redis.is_throwaway() {
            " (throwaway redis-server)"
        } else {
            " (LOCKRT_URL / REDIS_URL)"
        }
    );
    println!("  sold       {sold}");
    println!("  remaining  {remaining}");
    println!("  oversold   {oversold}");
    println!("  sold out   {} buyers turned away", total.sold_out);
    println!("  busy       {} (lock wait elapsed)", total.busy);
    println!("  errors     {}", total.errors);
    println!("  time       {} ms", elapsed.as_millis());

    let expected = cfg.stock.min(cfg.buyers);
    let correct = oversold == 0 && sold == expected && total.errors == 0 && total.busy == 0;
    if cfg.lock && !correct {
        println!("  WRONG: expected {expected} sold and nothing oversold");
    }
    if !cfg.lock && oversold > 0 {
        println!("  without the lock, {oversold} units were sold that did not exist");
    }
    Ok(!cfg.lock || correct)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = match parse_args() {
        Ok(cfg) => cfg,
        Err(msg) => {
            eprintln!("{msg}");
            return ExitCode::from(2);
        }
    };
    let result = if cfg.child {
        let url = std::env::var("REDIS_URL").unwrap_or_default();
        buy(&cfg, &url).await.map(|t| {
            println!("{}", t.line());
            true
        })
    } else {
        sale(&cfg).await
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("seckill: {e}");
            ExitCode::FAILURE
        }
    }
}
