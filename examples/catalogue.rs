//! A tenant's price catalogue under a read-write lock: `GET /price/{tenant}/{sku}` reads it
//! under `#[distributed_lock(mode = "read")]`, so any number of requests (on any number of
//! instances) read at once, and a rebuild job rewrites it under `mode = "write"`, which waits
//! for the readers inside to leave and keeps new ones out until the whole catalogue is
//! rewritten.
//!
//! ```sh
//! cargo run --example catalogue -- --demo             # prints the figures below
//! cargo run --example catalogue -- --demo --no-lock   # the same without the locks: torn reads
//! cargo run --example catalogue -- --listen 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/price/acme/7          # 200 {"tenant":"acme","sku":7,...}
//! ```
//!
//! The catalogue lives in Redis as plain keys: `catalogue:<tenant>:rules` (the version and the
//! tenant's markup) and one `catalogue:<tenant>:sku:<n>` per item (the version and the base
//! price), every value written as `<version>:<number>`. A rebuild writes the rules, then the
//! items one by one with an await in between (each price recomputed from a supplier's feed), so
//! a reader without the lock could take the new rules and an old item: a price from two
//! versions. The handler checks the two versions match (only a demo does that: the read lock is
//! what makes it so) and answers `500 {"error":"torn_read",...}` when they don't.
//!
//! The rebuild runs with `lockrt::every`: in a fleet, each tick's rebuild runs on one instance
//! only (its own lock, `job:catalogue-rebuild`); the write lock on `catalogue:<tenant>` is the
//! other half, keeping every instance's readers out while it writes. `--no-lock` drops the
//! read and write locks, not the scheduling.
//!
//! `--demo` serves on a free loopback port, sends 16 clients' requests for `--secs` (default
//! 1.5, and at most 400 requests a client) while the job rebuilds every `--rebuild-ms`
//! (default 200), and prints:
//!
//! ```text
//! reads        874
//! rebuilds     16
//! torn_reads   0
//! errors       0
//! max_readers  16
//! ```
//!
//! `rebuilds` counts catalogues rewritten (two tenants a run), `max_readers` the most requests
//! inside the read lock at once on this instance. Flags:
//! `--listen ADDR` (default `127.0.0.1:3000`; `--demo` takes a free port), `--work-ms N` (the
//! handler's work between its two reads, default 1). The locker comes from configuration
//! (`LockerBuilder::from_env`); without a URL the example runner starts a throwaway
//! `redis-server`.

use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use lockrt::{LockOptions, Locker, LockerBuilder, distributed_lock};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;
use serde::Serialize;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod runner;

const USAGE: &str = "usage: catalogue [--demo] [--no-lock] [--listen ADDR] [--secs N] \
                     [--rebuild-ms N] [--work-ms N]";

const TENANTS: [&str; 2] = ["acme", "globex"];
/// Items per catalogue: a rebuild takes about this many `STEP`s.
const SKUS: u64 = 20;
/// The pause between two items of a rebuild (fetching the next supplier price, say).
const STEP: Duration = Duration::from_millis(1);
/// The demo's clients and the most requests each sends.
const CLIENTS: u64 = 16;
const MAX_REQUESTS: u64 = 400;
/// Bounds one demo request: a request stuck this long is counted as an error.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

fn rules_key(tenant: &str) -> String {
    // The lock is `lock:catalogue:<tenant>` (the locker's prefix): no clash with the data.
    format!("catalogue:{tenant}:rules")
}

fn sku_key(tenant: &str, sku: u64) -> String {
    format!("catalogue:{tenant}:sku:{sku}")
}

/// How many requests are inside the read lock now, and the most at once.
#[derive(Default)]
struct Readers {
    inside: AtomicUsize,
    most: AtomicUsize,
}

/// Counts a request as inside from its creation to its drop.
struct Inside<'a>(&'a Readers);

impl<'a> Inside<'a> {
    fn enter(readers: &'a Readers) -> Self {
        let now = readers.inside.fetch_add(1, Ordering::SeqCst) + 1;
        readers.most.fetch_max(now, Ordering::SeqCst);
        Inside(readers)
    }
}

impl Drop for Inside<'_> {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct AppState {
    locker: Locker,
    store: ConnectionManager,
    /// The handler's work between its two reads (a currency conversion, say): it widens the
    /// window in which a rebuild could slip in, and keeps readers inside together.
    work: Duration,
    readers: Arc<Readers>,
}

#[derive(Serialize)]
struct Price {
    tenant: String,
    sku: u64,
    cents: u64,
    version: u64,
}

type ApiResult = Result<Json<Price>, Response>;

fn internal(e: redis::RedisError) -> Response {
    tracing::error!("catalogue store: {e}");
    let body = Json(json!({ "error": "internal", "retry": false }));
    (StatusCode::INTERNAL_SERVER_ERROR, body).into_response()
}

/// A `<version>:<number>` value; `None` when the key is missing or malformed.
async fn read_entry(
    store: &mut ConnectionManager,
    key: String,
) -> Result<Option<(u64, u64)>, Response> {
    let raw: Option<String> = store.get(key).await.map_err(internal)?;
    Ok(raw.and_then(|v| {
        let (version, n) = v.split_once(':')?;
        Some((version.parse().ok()?, n.parse().ok()?))
    }))
}

/// Reads the rules, works, reads the item: two reads that must come from one version.
async fn look_up(state: &AppState, tenant: String, sku: u64) -> ApiResult {
    let _inside = Inside::enter(&state.readers);
    let mut store = state.store.clone();
    let rules = read_entry(&mut store, rules_key(&tenant)).await?;
    tokio::time::sleep(state.work).await;
    let item = read_entry(&mut store, sku_key(&tenant, sku)).await?;
    let (Some((version, markup)), Some((item_version, base))) = (rules, item) else {
        let body = Json(json!({ "error": "not_found" }));
        return Err((StatusCode::NOT_FOUND, body).into_response());
    };
    if item_version != version {
        tracing::debug!("torn read of {tenant}: rules v{version}, sku {sku} v{item_version}");
        let body = json!({ "error": "torn_read", "rules": version, "item": item_version });
        return Err((StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response());
    }
    let cents = base * (100 + markup) / 100;
    Ok(Json(Price {
        tenant,
        sku,
        cents,
        version,
    }))
}

/// `GET /price/{tenant}/{sku}`: a read share of the tenant's catalogue, waiting up to 5 s for a
/// rebuild to finish (a busy lock then answers 409 `lock_busy`).
#[distributed_lock(key = "catalogue:{tenant}", locker = state.locker, mode = "read", ttl = "10s", wait = "5s")]
async fn price(
    State(state): State<AppState>,
    Path((tenant, sku)): Path<(String, u64)>,
) -> ApiResult {
    look_up(&state, tenant, sku).await
}

/// `--no-lock`: the same read with nothing keeping a rebuild out.
async fn price_unlocked(
    State(state): State<AppState>,
    Path((tenant, sku)): Path<(String, u64)>,
) -> ApiResult {
    look_up(&state, tenant, sku).await
}

fn app(state: AppState, no_lock: bool) -> Router {
    let route = if no_lock {
        get(price_unlocked)
    } else {
        get(price)
    };
    Router::new()
        .route("/price/{tenant}/{sku}", route)
        .with_state(state)
}

type AnyError = Box<dyn Error + Send + Sync>;

/// Writes version `n+1` of the catalogue: the rules, then each item with a pause before it.
async fn write_catalogue(store: &mut ConnectionManager, tenant: &str) -> Result<u64, AnyError> {
    let version: u64 = store.incr(format!("catalogue:{tenant}:version"), 1).await?;
    let () = store
        .set(rules_key(tenant), format!("{version}:{}", version % 20))
        .await?;
    for sku in 0..SKUS {
        tokio::time::sleep(STEP).await;
        let base = 1_000 + sku * 10 + version;
        let () = store
            .set(sku_key(tenant, sku), format!("{version}:{base}"))
            .await?;
    }
    Ok(version)
}

/// The whole rewrite under the write lock: readers already inside finish first, new ones wait.
#[distributed_lock(key = "catalogue:{tenant}", locker = locker, mode = "write", ttl = "10s", wait = "5s")]
async fn rebuild(
    locker: &Locker,
    store: &mut ConnectionManager,
    tenant: &str,
) -> Result<u64, AnyError> {
    write_catalogue(store, tenant).await
}

/// Rebuilds every tenant's catalogue; the number rebuilt.
async fn rebuild_all(locker: &Locker, mut store: ConnectionManager, no_lock: bool) -> u64 {
    let mut done = 0;
    for tenant in TENANTS {
        let res = if no_lock {
            write_catalogue(&mut store, tenant).await
        } else {
            rebuild(locker, &mut store, tenant).await
        };
        match res {
            Ok(_) => done += 1,
            // Logged, not fatal: the next tick rebuilds it.
            Err(e) => tracing::error!("rebuild of {tenant}: {e}"),
        }
    }
    done
}

/// Runs [`rebuild_all`] once per `tick` across the fleet until `locker.shutdown()`.
async fn rebuild_job(
    locker: Locker,
    store: ConnectionManager,
    tick: Duration,
    no_lock: bool,
    rebuilds: Arc<AtomicU64>,
    idle: Arc<tokio::sync::Mutex<()>>,
) -> Result<(), lockrt::LockError> {
    // `ttl`: a crashed rebuilder's tick is taken over once its lease runs out. `max_hold`
    // (one tick by default) only for a stuck run: a rebuild cut short leaves the catalogue
    // half-written, and the write lock cannot undo that.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .max_hold(Duration::from_secs(10));
    lockrt::every(&locker, "job:catalogue-rebuild", tick, opts, |_tick| {
        let (locker, store) = (locker.clone(), store.clone());
        let (rebuilds, idle) = (rebuilds.clone(), idle.clone());
        async move {
            let _busy = idle.lock().await;
            let done = rebuild_all(&locker, store, no_lock).await;
            rebuilds.fetch_add(done, Ordering::SeqCst);
        }
    })
    .await
}

struct Config {
    listen: SocketAddr,
    demo: bool,
    no_lock: bool,
    secs: Duration,
    tick: Duration,
    work: Duration,
}

fn parse_args() -> Result<Config, String> {
    let mut cfg = Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 3000)),
        demo: false,
        no_lock: false,
        secs: Duration::from_millis(1_500),
        tick: Duration::from_millis(200),
        work: Duration::from_millis(1),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |v: &str| format!("bad value {v:?} for {flag}\n{USAGE}");
        let duration = |v: String, unit_secs: f64| {
            let n: f64 = v.parse().map_err(|_| bad(&v))?;
            Duration::try_from_secs_f64(n * unit_secs).map_err(|_| bad(&v))
        };
        match flag.as_str() {
            "--demo" => cfg.demo = true,
            "--no-lock" => cfg.no_lock = true,
            "--listen" => {
                let v = value()?;
                cfg.listen = v.parse().map_err(|_| bad(&v))?;
            }
            "--secs" => cfg.secs = duration(value()?, 1.0)?,
            "--rebuild-ms" => cfg.tick = duration(value()?, 0.001)?,
            "--work-ms" => cfg.work = duration(value()?, 0.001)?,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if cfg.demo {
        // The demo is self-contained: a free loopback port, whatever `--listen` said.
        cfg.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    }
    Ok(cfg)
}

/// One `GET` on a fresh connection (`Connection: close`: the answer ends at EOF); the status
/// and the body.
async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut conn = TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    conn.write_all(request.as_bytes()).await?;
    let mut raw = String::new();
    conn.read_to_string(&mut raw).await?;
    let status = raw
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = raw.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok((status, body.to_owned()))
}

/// What the demo's clients got.
#[derive(Default)]
struct Tally {
    reads: u64,
    torn: u64,
    errors: u64,
}

/// One client: requests over the tenants and items until `end` or `MAX_REQUESTS`.
async fn client(addr: SocketAddr, id: u64, end: Instant) -> Tally {
    let mut tally = Tally::default();
    for n in 0..MAX_REQUESTS {
        if Instant::now() >= end {
            break;
        }
        let tenant = TENANTS[((id + n) % TENANTS.len() as u64) as usize];
        let path = format!("/price/{tenant}/{}", (id * 7 + n) % SKUS);
        match tokio::time::timeout(REQUEST_LIMIT, http_get(addr, &path)).await {
            Ok(Ok((200, _))) => tally.reads += 1,
            Ok(Ok((500, body))) if body.contains("torn_read") => {
                tally.reads += 1;
                tally.torn += 1;
            }
            other => {
                eprintln!("GET {path}: {other:?}");
                tally.errors += 1;
            }
        }
    }
    tally
}

/// `CLIENTS` clients at once for `length`; their tallies summed.
async fn load(addr: SocketAddr, length: Duration) -> Tally {
    let end = Instant::now() + length;
    let mut clients = tokio::task::JoinSet::new();
    for id in 0..CLIENTS {
        clients.spawn(client(addr, id, end));
    }
    let mut sum = Tally::default();
    while let Some(t) = clients.join_next().await {
        let t = t.unwrap_or_else(|e| {
            eprintln!("client task: {e}");
            Tally {
                errors: 1,
                ..Tally::default()
            }
        });
        sum.reads += t.reads;
        sum.torn += t.torn;
        sum.errors += t.errors;
    }
    sum
}

/// Serves `app` in the background until the sender is used (or dropped).
fn start_server(
    listener: tokio::net::TcpListener,
    app: Router,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async {
        let _ = stopped.await;
    });
    (stop, tokio::spawn(server.into_future()))
}

/// The service: the rebuild job in the background, the HTTP server in front, until Ctrl-C
/// (or, with `--demo`, until the demo load is done; then its figures are printed).
async fn serve(cfg: Config) -> Result<(), Box<dyn Error>> {
    // Example runner only: the configured Redis, or a throwaway one.
    let redis = runner::DevRedis::configured_or_start()?;
    if redis.is_throwaway() && !cfg.demo {
        println!("started a throwaway redis-server at {}", redis.url());
    }
    let locker = redis.apply(LockerBuilder::from_env()?).build().await?;
    // The job's own locker, as if on another instance; its shutdown stops the job.
    let job_locker = redis.apply(LockerBuilder::from_env()?).build().await?;
    let store = redis::Client::open(redis.url())?
        .get_connection_manager()
        .await?;
    // Version 1 before the first request, so a reader always finds a catalogue.
    if rebuild_all(&locker, store.clone(), cfg.no_lock).await != TENANTS.len() as u64 {
        return Err("the first build of the catalogue failed".into());
    }

    let (rebuilds, idle) = (Arc::new(AtomicU64::new(0)), Arc::default());
    let job = tokio::spawn(rebuild_job(
        job_locker.clone(),
        store.clone(),
        cfg.tick,
        cfg.no_lock,
        rebuilds.clone(),
        Arc::clone(&idle),
    ));
    let listener = tokio::net::TcpListener::bind(cfg.listen).await?;
    let addr = listener.local_addr()?;
    let readers = Arc::new(Readers::default());
    let state = AppState {
        locker: locker.clone(),
        store,
        work: cfg.work,
        readers: readers.clone(),
    };
    let (stop, server) = start_server(listener, app(state, cfg.no_lock));

    let tally = if cfg.demo {
        Some(load(addr, cfg.secs).await)
    } else {
        // A script waits for this line to learn the port.
        println!("listening on http://{addr}");
        std::io::stdout().flush()?;
        let _ = tokio::signal::ctrl_c().await;
        None
    };
    // Not in the middle of a rebuild: one cut short would leave the catalogue half-written.
    // A run starting meanwhile waits here, and shutdown cancels it before it writes.
    let _idle = idle.lock().await;
    job_locker.shutdown().await;
    job.await??;
    let _ = stop.send(());
    server.await??;
    locker.shutdown().await;
    match tally {
        Some(t) => report(&t, rebuilds.load(Ordering::SeqCst), &readers, cfg.no_lock),
        None => Ok(()),
    }
}

/// Prints the demo's figures; with the locks, an error unless every read was whole.
fn report(
    t: &Tally,
    rebuilds: u64,
    readers: &Readers,
    no_lock: bool,
) -> Result<(), Box<dyn Error>> {
    println!("reads        {}", t.reads);
    println!("rebuilds     {rebuilds}");
    println!("torn_reads   {}", t.torn);
    println!("errors       {}", t.errors);
    println!("max_readers  {}", readers.most.load(Ordering::SeqCst));
    if !no_lock && (t.torn > 0 || t.errors > 0) {
        return Err("a read saw a half-rebuilt catalogue, or failed".into());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    runner::init_logs();
    runner::serve_main("catalogue", parse_args(), serve).await
}
