//! An axum service whose stock deduction is an annotated handler: the lock key comes from the
//! `Path` extractor, the locker from the app state, and a lock failure is an HTTP answer with no
//! glue: with lockrt's `axum` feature, `LockError` converts into axum's `Response`, so a handler
//! returning `Result<Json<_>, Response>` (or `impl IntoResponse`, `Response`,
//! `Result<_, (StatusCode, String)>`) can be locked as it is.
//!
//! ```sh
//! cargo run --example web_stock -- --listen 127.0.0.1:3000 --seed 1=5
//! curl -i -X POST http://127.0.0.1:3000/items/1/deduct    # 200 {"item":1,"left":4}
//! curl -i http://127.0.0.1:3000/items/1                   # 200 {"item":1,"left":4}
//! ```
//!
//! Run several copies on one Redis (`LOCKRT_URL` or `REDIS_URL=redis://127.0.0.1:6379/`) and
//! they still never sell a unit twice: the handler's read-check-write is racy on purpose, the
//! lock is what makes it safe. The locker comes from configuration (`LockerBuilder::from_env`,
//! README "Configuration"); without a URL the example runner starts a throwaway `redis-server`
//! and prints its URL.
//!
//! | answer | status | body | from |
//! |---|---|---|---|
//! | deducted | 200 | `{"item":1,"left":4}` | the handler |
//! | no stock left | 409 | `{"error":"sold_out"}` | the handler |
//! | stock store failed | 500 | `{"error":"internal","retry":false}` | the handler |
//! | lock busy for the whole `wait` | 409 | `{"error":"lock_busy","retry":true}` | lockrt |
//! | lock server unreachable | 503, `Retry-After: 1` | `{"error":"lock_unavailable","retry":true}` | lockrt |
//! | lock lost mid-way | 500 | `{"error":"lock_lost","retry":false}` | lockrt |
//!
//! `retry: true` means nothing was done and the same request may simply be sent again; `500`
//! means the deduction was interrupted and may or may not have happened, so a client should read
//! the stock before retrying.
//!
//! Flags: `--listen ADDR` (default `127.0.0.1:3000`; port 0 picks a free one, the line
//! `listening on http://...` says which), `--seed ITEM=N` (repeatable: set the stock at
//! start), `--work-ms N` (simulated work inside the critical section, default 5). Ctrl-C stops
//! it gracefully.

use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lockrt::{Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::Serialize;
use serde_json::json;

mod runner;

const USAGE: &str = "usage: web_stock [--listen ADDR] [--seed ITEM=N]... [--work-ms N]";

#[derive(Clone)]
struct AppState {
    /// Where the locks live; every instance on the same Redis shares them.
    locker: Locker,
    /// The stock itself (`stock:<id>`). A `ConnectionManager` reconnects after a Redis restart
    /// and is cheap to clone per request.
    store: ConnectionManager,
    /// Stands for what a real handler does between reading and writing (a payment check, say);
    /// it widens the race window the lock has to close.
    work: Duration,
}

#[derive(Serialize)]
struct Stock {
    item: u64,
    left: u64,
}

/// Success, or an answer already made: a lock failure gets there by `?` or by the attribute
/// itself (lockrt's `From<LockError> for Response`).
type ApiResult = Result<Json<Stock>, Response>;

/// A failure of the stock store: logged whole, answered without detail.
fn internal(e: redis::RedisError) -> Response {
    tracing::error!("stock store: {e}");
    let body = Json(json!({ "error": "internal", "retry": false }));
    (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
}

fn stock_key(id: u64) -> String {
    // The lock for this item is the Redis key `lock:stock:<id>` (the locker's prefix), so the
    // two never collide.
    format!("stock:{id}")
}

async fn read_stock(store: &mut ConnectionManager, id: u64) -> Result<u64, Response> {
    // An item never seeded has no stock.
    let left: Option<u64> = store.get(stock_key(id)).await.map_err(internal)?;
    Ok(left.unwrap_or(0))
}

/// `POST /items/{id}/deduct`: one unit, at most one request per item at a time across all
/// instances. `wait = "2s"`: a fixed policy visible where it applies; a request that cannot get
/// the lock in 2 s answers 409 `lock_busy` rather than hold a connection open. (For a configurable wait,
/// omit `wait` here and set `Locker::builder().default_wait(..)`.)
#[distributed_lock(key = "stock:{id}", locker = state.locker, ttl = "10s", wait = "2s")]
async fn deduct(State(state): State<AppState>, Path(id): Path<u64>) -> ApiResult {
    // Read, check, write: not atomic on purpose. Only the lock keeps two requests from both
    // reading the same figure and selling one unit twice.
    let mut store = state.store.clone();
    let left = read_stock(&mut store, id).await?;
    if left == 0 {
        let body = Json(json!({ "error": "sold_out" }));
        return Err((StatusCode::CONFLICT, body).into_response());
    }
    tokio::time::sleep(state.work).await;
    let () = store.set(stock_key(id), left - 1).await.map_err(internal)?;
    Ok(Json(Stock {
        item: id,
        left: left - 1,
    }))
}

/// `GET /items/{id}`: a plain read, no lock needed.
async fn show(State(state): State<AppState>, Path(id): Path<u64>) -> ApiResult {
    let left = read_stock(&mut state.store.clone(), id).await?;
    Ok(Json(Stock { item: id, left }))
}

fn app(state: AppState) -> Router {
    Router::new()
        .route("/items/{id}", get(show))
        .route("/items/{id}/deduct", post(deduct))
        .with_state(state)
}

struct Config {
    listen: SocketAddr,
    seeds: Vec<(u64, u64)>,
    work: Duration,
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        seeds: Vec::new(),
        work: Duration::from_millis(5),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |v: &str| format!("bad value {v:?} for {flag}\n{USAGE}");
        match flag.as_str() {
            "--listen" => {
                let v = value()?;
                cfg.listen = v.parse().map_err(|_| bad(&v))?;
            }
            "--seed" => {
                let v = value()?;
                let seed = v
                    .split_once('=')
                    .and_then(|(item, n)| Some((item.parse().ok()?, n.parse().ok()?)));
                cfg.seeds.push(seed.ok_or_else(|| bad(&v))?);
            }
            "--work-ms" => {
                let v = value()?;
                cfg.work = Duration::from_millis(v.parse().map_err(|_| bad(&v))?);
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(cfg)
}

async fn serve(cfg: Config) -> Result<(), Box<dyn Error>> {
    // Kept alive until `serve` returns: a throwaway server is killed when this is dropped.
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;
    if redis.is_throwaway() {
        // Only the throwaway server's URL is printed: a REDIS_URL may carry a password.
        println!("started a throwaway redis-server at {}", redis.url());
    }
    // What a service writes: the locker from its configuration (LOCKRT_URL or REDIS_URL, ...).
    let config = LockerBuilder::from_env()?;
    let config = redis.apply(config); // example runner only
    let locker = config.build().await?;
    let mut store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;
    for &(item, n) in &cfg.seeds {
        let () = store.set(stock_key(item), n).await?;
    }

    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    // A script (or a test) waits for this line to learn the port.
    println!("listening on http://{}", listener.local_addr()?);
    std::io::stdout().flush()?;

    let state = AppState {
        locker,
        store,
        work: cfg.work,
    };
    // A client that hangs up mid-request makes hyper drop the handler's future; the lock is
    // then released in the background within milliseconds, not when the 10 s lease runs out.
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    runner::serve_main("web_stock", parse_args(), serve).await
}
