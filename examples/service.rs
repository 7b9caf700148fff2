//! A service as users run it, on one to three instances of one Redis: every lock kind behind
//! an axum handler, two jobs run once per tick across the instances, and a graceful stop, with
//! no glue code for any of it.
//!
//! ```sh
//! cargo run --example service -- --listen 127.0.0.1:3000
//! curl -i -X POST http://127.0.0.1:3000/refunds/7        # 200 once; 409 while one runs
//! curl -i http://127.0.0.1:3000/catalogue/t1             # 200 {"torn":false,...}
//! curl -i -X POST http://127.0.0.1:3000/exports/t1       # 200; 409 beyond 2 at once
//! curl -i -X POST http://127.0.0.1:3000/transfers/1/2    # 200: one unit from 1 to 2
//! curl -i http://127.0.0.1:3000/stats                    # lockrt's metrics by lock site
//! ```
//!
//! | route | lock | held while |
//! |---|---|---|
//! | `POST /refunds/{order}` | exclusive `refund:{order}`, `wait = "0s"` | the refund (300 ms, `--refund-ms`); a second refund of the order answers 409 |
//! | `GET /catalogue/{tenant}` | read `catalogue:{tenant}` | reading every item (readers share it) |
//! | job `job:catalogue` | write `catalogue:{tenant}` | rewriting every item, once per second across the fleet |
//! | `POST /exports/{tenant}` | `permits = 2` on `export:{tenant}` | the export (200 ms) |
//! | `POST /transfers/{from}/{to}` | both `acct:{from}` and `acct:{to}` | the racy read-modify-write of two balances |
//! | job `job:tick` | its tick's claim | counting the tick once (`ticks:<tick>`) |
//!
//! SIGTERM or Ctrl-C: the jobs stop first (a run under way finishes), then HTTP drains, then
//! the locker releases what it holds. `tests/topologies/examples_service.rs` runs three
//! instances and checks every promise of the table from the outside.

use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lockrt::{LockOptions, Locker, LockerBuilder, Stop, distributed_lock};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};

mod runner;

const USAGE: &str = "usage: service [--listen ADDR] [--refund-ms N]";
/// Items of a tenant's catalogue: a reader sees them all of one version or the read is torn.
const ITEMS: u32 = 8;

#[derive(Clone)]
struct App {
    locker: Locker,
    store: ConnectionManager,
    metrics: Snapshotter,
    /// How long the payment provider takes with a refund.
    refund_work: Duration,
}

struct Config {
    listen: SocketAddr,
    refund_work: Duration,
}

type Api = Result<Json<Value>, Response>;

fn internal(e: redis::RedisError) -> Response {
    tracing::error!("store: {e}");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": "internal"})),
    )
        .into_response()
}

/// `POST /refunds/{order}`: one refund of an order at a time across the fleet; a second one
/// while it runs is answered 409 by lockrt (`wait = "0s"`).
#[distributed_lock(key = "refund:{order}", locker = app.locker, wait = "0s")]
async fn refund(State(app): State<App>, Path(order): Path<u64>) -> Api {
    let mut store = app.store.clone();
    let n: u64 = store
        .incr(format!("refunded:{order}"), 1)
        .await
        .map_err(internal)?;
    tokio::time::sleep(app.refund_work).await; // the payment provider
    Ok(Json(json!({"order": order, "refunds": n})))
}

/// `GET /catalogue/{tenant}`: every item under the read lock; `torn` if two items differ.
#[distributed_lock(key = "catalogue:{tenant}", locker = app.locker, mode = "read", wait = "5s")]
async fn catalogue(State(app): State<App>, Path(tenant): Path<String>) -> Api {
    let mut store = app.store.clone();
    let mut versions = Vec::new();
    for i in 0..ITEMS {
        let v: Option<u64> = store.get(item(&tenant, i)).await.map_err(internal)?;
        versions.push(v.unwrap_or(0));
        tokio::task::yield_now().await;
    }
    let torn = versions.windows(2).any(|w| w[0] != w[1]);
    Ok(Json(
        json!({"tenant": tenant, "version": versions[0], "torn": torn}),
    ))
}

fn item(tenant: &str, i: u32) -> String {
    format!("catalogue:{tenant}:item:{i}")
}

/// `POST /exports/{tenant}`: at most two exports of a tenant at once across the fleet.
#[distributed_lock(key = "export:{tenant}", locker = app.locker, permits = 2, wait = "0s")]
async fn export(State(app): State<App>, Path(tenant): Path<String>) -> Api {
    let mut store = app.store.clone();
    let active = format!("exports:{tenant}:active");
    let now: i64 = store.incr(&active, 1).await.map_err(internal)?;
    let max_key = format!("exports:{tenant}:max");
    let max: Option<i64> = store.get(&max_key).await.map_err(internal)?;
    if max.is_none_or(|m| now > m) {
        let () = store.set(&max_key, now).await.map_err(internal)?;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _: i64 = store.decr(&active, 1).await.map_err(internal)?;
    Ok(Json(json!({"tenant": tenant, "at_once": now})))
}

/// `POST /transfers/{from}/{to}`: one unit between two balances, a racy read-modify-write
/// that both accounts' locks make safe.
#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], locker = app.locker, wait = "5s")]
async fn transfer(State(app): State<App>, Path((from, to)): Path<(u64, u64)>) -> Api {
    let mut store = app.store.clone();
    let a: i64 = store
        .get(format!("balance:{from}"))
        .await
        .map_err(internal)?;
    let b: i64 = store.get(format!("balance:{to}")).await.map_err(internal)?;
    tokio::task::yield_now().await;
    let () = store
        .set(format!("balance:{from}"), a - 1)
        .await
        .map_err(internal)?;
    let () = store
        .set(format!("balance:{to}"), b + 1)
        .await
        .map_err(internal)?;
    Ok(Json(json!({"from": from, "to": to})))
}

/// `GET /stats`: lockrt's counters and gauges as this instance recorded them, by label.
async fn stats(State(app): State<App>) -> Json<Value> {
    let mut out = serde_json::Map::new();
    for (key, _, _, value) in app.metrics.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.key().name(), labels.join(","));
        let v = match value {
            DebugValue::Counter(c) => json!(c),
            DebugValue::Gauge(g) => json!(g.into_inner()),
            DebugValue::Histogram(h) => json!(h.len()),
        };
        out.insert(name, v);
    }
    Json(Value::Object(out))
}

/// The catalogue job: every item rewritten to the tick's version under the write lock.
async fn rewrite(locker: Locker, mut store: ConnectionManager, tick: SystemTime) {
    let version = tick
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64;
    let opts = LockOptions::new().write().wait(Duration::from_secs(5));
    let rewritten = locker
        .run("catalogue:t1", opts, async {
            for i in 0..ITEMS {
                let res: redis::RedisResult<()> = store.set(item("t1", i), version).await;
                if let Err(e) = res {
                    tracing::error!("catalogue: {e}");
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
    if let Err(e) = rewritten {
        tracing::warn!("catalogue not rewritten: {e}");
    }
}

async fn serve(cfg: Config) -> Result<(), Box<dyn Error>> {
    let recorder = DebuggingRecorder::new();
    let metrics = recorder.snapshotter();
    recorder.install()?;
    let redis = runner::DevRedis::configured_or_start()?; // example runner only
    let locker = redis.apply(LockerBuilder::from_env()?).build().await?;
    let store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;

    let tick = Duration::from_secs(1);
    let job_opts = LockOptions::new().ttl(Duration::from_millis(800));
    let jobs = [
        lockrt::spawn_every(&locker, "job:tick", tick, job_opts, {
            let store = store.clone();
            move |t| {
                let mut store = store.clone();
                async move {
                    let ms = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
                    let res: redis::RedisResult<u64> = store.incr(format!("ticks:{ms}"), 1).await;
                    if let Err(e) = res {
                        tracing::error!("tick: {e}");
                    }
                }
            }
        })?,
        lockrt::spawn_every(&locker, "job:catalogue", tick, job_opts, {
            let (locker, store) = (locker.clone(), store.clone());
            move |t| rewrite(locker.clone(), store.clone(), t)
        })?,
    ];

    let app = Router::new()
        .route("/refunds/{order}", post(refund))
        .route("/catalogue/{tenant}", get(catalogue))
        .route("/exports/{tenant}", post(export))
        .route("/transfers/{from}/{to}", post(transfer))
        .route("/stats", get(stats))
        .with_state(App {
            locker: locker.clone(),
            store,
            metrics,
            refund_work: cfg.refund_work,
        });
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    println!("listening on http://{}", listener.local_addr()?);
    std::io::stdout().flush()?;

    // SIGTERM: the jobs first (a run under way finishes), then HTTP, then the locks.
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let mut term = signal(SignalKind::terminate()).expect("a SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            for job in jobs {
                let _ = job.stop(Stop::AfterRun).await;
            }
        })
        .await?;
    locker.shutdown().await;
    println!("stopped");
    Ok(())
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        refund_work: Duration::from_millis(300),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let v = match flag.as_str() {
            "-h" | "--help" => return Err(USAGE.to_owned()),
            "--listen" | "--refund-ms" => args.next(),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        };
        let v = v.ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let bad = || format!("bad value {v:?} for {flag}\n{USAGE}");
        match flag.as_str() {
            "--listen" => cfg.listen = v.parse().map_err(|_| bad())?,
            _ => cfg.refund_work = Duration::from_millis(v.parse().map_err(|_| bad())?),
        }
    }
    Ok(cfg)
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    runner::serve_main("service", parse_args(), serve).await
}
