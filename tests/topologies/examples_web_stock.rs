//! `examples/web_stock.rs` as a real service: two instances of the binary on one Redis sell
//! exactly their stock under concurrent HTTP requests, a busy lock answers the documented 409
//! (lockrt's own answer: the example has no code for it),
//! and a client hanging up mid-request releases the lock at once (hyper drops the handler's
//! future when the connection closes). The HTTP client is raw HTTP/1.1 over a `TcpStream`.

use crate::support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

/// Bounds every wait for the service: a debug build on a loaded machine is slow to start.
const LIMIT: Duration = Duration::from_secs(30);
/// The handler's `wait = "2s"`.
const LOCK_WAIT: Duration = Duration::from_secs(2);

/// One running copy of the example. Killed (by its own handle) when dropped.
struct Instance {
    addr: SocketAddr,
    child: Child,
    // Held open: the service must not get EPIPE if it prints again.
    _stdout: Lines<BufReader<ChildStdout>>,
}

impl Instance {
    async fn start(redis: &RedisServer, args: &[&str]) -> Instance {
        Instance::start_with(&redis.url(), Stdio::inherit(), args).await
    }

    async fn start_with(redis_url: &str, stderr: Stdio, args: &[&str]) -> Instance {
        let mut child = Command::new(support::example_binary("web_stock"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("REDIS_URL", redis_url)
            .env_remove("LOCKRT_URL")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .expect("start web_stock");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let addr = tokio::time::timeout(LIMIT, async {
            loop {
                let Some(line) = stdout.next_line().await.expect("read stdout") else {
                    panic!("web_stock exited before listening");
                };
                if let Some(addr) = line.strip_prefix("listening on http://") {
                    return addr.parse::<SocketAddr>().expect("an address");
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("web_stock did not print `listening on` within {LIMIT:?}"));
        Instance {
            addr,
            child,
            _stdout: stdout,
        }
    }

    /// Kills the instance and returns what it wrote to stderr (started with `Stdio::piped()`).
    async fn stop_and_read_stderr(mut self) -> String {
        let mut stderr = self.child.stderr.take().expect("piped stderr");
        self.child.kill().await.expect("kill web_stock");
        String::from_utf8_lossy(&read_to_end(&mut stderr).await).into_owned()
    }
}

/// Everything up to EOF, bounded by [`LIMIT`].
async fn read_to_end(r: &mut (impl AsyncRead + Unpin)) -> Vec<u8> {
    let mut all = Vec::new();
    tokio::time::timeout(LIMIT, r.read_to_end(&mut all))
        .await
        .unwrap_or_else(|_| panic!("no EOF within {LIMIT:?}"))
        .expect("read");
    all
}

/// An HTTP answer: status, headers (names lowercased), body as JSON.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

fn request_bytes(method: &str, path: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

/// One request on a fresh connection; `Connection: close`, so the answer ends at EOF.
pub(crate) async fn http(addr: SocketAddr, method: &str, path: &str) -> Reply {
    let mut conn = tokio::time::timeout(LIMIT, TcpStream::connect(addr))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no connection within {LIMIT:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    conn.write_all(&request_bytes(method, path))
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    let raw = read_to_end(&mut conn).await;
    let text = String::from_utf8(raw).expect("UTF-8 answer");
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body = serde_json::from_str(body).unwrap_or_else(|_| panic!("body not JSON: {body:?}"));
    Reply {
        status,
        headers,
        body,
    }
}

/// The documented busy answer, exactly: lockrt's `LockError::Timeout` as a response.
fn assert_busy(r: &Reply) {
    assert_eq!(r.status, 409, "{r:?}");
    assert_eq!(r.header("content-type"), Some("application/json"), "{r:?}");
    assert_eq!(r.body, json!({"error": "lock_busy", "retry": true}));
}

/// Remaining lease of the lock (`None` when nobody holds it).
async fn lock_pttl(conn: &mut redis::aio::MultiplexedConnection, item: u64) -> Option<u64> {
    let ms: i64 = conn.pttl(format!("lock:stock:{item}")).await.expect("PTTL");
    u64::try_from(ms).ok().filter(|&ms| ms > 0)
}

async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis
        .client()
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_sell_exactly_the_stock() {
    const STOCK: u64 = 50;
    const REQUESTS: usize = 200;
    const CONCURRENCY: usize = 32;

    let redis = RedisServer::start().expect("start redis-server");
    // The first seeds; the second starts after, so it cannot reset a sale in progress.
    let a = Instance::start(&redis, &["--seed", &format!("1={STOCK}")]).await;
    let b = Instance::start(&redis, &[]).await;

    let started = Instant::now();
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..REQUESTS {
        let addr = if i % 2 == 0 { a.addr } else { b.addr };
        let slots = Arc::clone(&slots);
        tasks.spawn(async move {
            let _slot = slots.acquire_owned().await.expect("semaphore open");
            http(addr, "POST", "/items/1/deduct").await
        });
    }
    let (mut left_seen, mut sold_out, mut busy) = (Vec::new(), 0, 0);
    while let Some(reply) = tasks.join_next().await {
        let r = reply.expect("request task");
        match r.status {
            200 => {
                assert_eq!(r.body["item"], 1, "{r:?}");
                left_seen.push(r.body["left"].as_u64().expect("left is a number"));
            }
            409 if r.body == json!({"error": "sold_out"}) => sold_out += 1,
            _ => {
                assert_busy(&r);
                busy += 1;
            }
        }
    }
    let ok = left_seen.len() as u64;
    eprintln!(
        "{REQUESTS} requests over 2 instances, {CONCURRENCY} at a time: {ok} x 200, \
         {sold_out} x 409 sold out, {busy} x 409 busy in {:?}",
        started.elapsed()
    );

    let stock = http(a.addr, "GET", "/items/1").await;
    assert_eq!(stock.status, 200);
    assert_eq!(stock.body, http(b.addr, "GET", "/items/1").await.body);
    let left = stock.body["left"].as_u64().expect("left is a number");
    // No oversell: every 200 took exactly one unit that existed.
    assert_eq!(ok + left, STOCK, "sold {ok}, {left} left of {STOCK}");
    // Each sale saw a different figure: no two requests read the same stock.
    left_seen.sort_unstable();
    assert_eq!(left_seen, (left..STOCK).collect::<Vec<_>>());
    if busy == 0 {
        assert_eq!(ok, STOCK, "200 requests for 50 units sell them all");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_lock_answers_409_after_the_wait() {
    let redis = RedisServer::start().expect("start redis-server");
    let svc = Instance::start(&redis, &["--seed", "7=3"]).await;
    let locker = Locker::builder()
        .url(redis.url())
        .build()
        .await
        .expect("locker");

    // Another owner (this test) holds the item's lock for longer than the handler waits.
    let held = locker
        .acquire("stock:7", LockOptions::new().ttl(Duration::from_secs(10)))
        .await
        .expect("take the lock");
    let started = Instant::now();
    let r = http(svc.addr, "POST", "/items/7/deduct").await;
    let waited = started.elapsed();
    eprintln!("busy answer after {waited:?}: {r:?}");
    assert_busy(&r);
    assert!(waited >= LOCK_WAIT, "answered busy after only {waited:?}");
    // The body never ran: nothing was deducted.
    assert_eq!(http(svc.addr, "GET", "/items/7").await.body["left"], 3);

    held.release().await.expect("release");
    let r = http(svc.addr, "POST", "/items/7/deduct").await;
    assert_eq!((r.status, r.body), (200, json!({"item": 7, "left": 2})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_hanging_up_releases_the_lock() {
    const ITEM: u64 = 9;
    let redis = RedisServer::start().expect("start redis-server");
    // The critical section outlasts the test: only cancellation can end it early.
    let svc = Instance::start(&redis, &["--seed", "9=1", "--work-ms", "60000"]).await;
    let mut conn = redis_conn(&redis).await;

    let mut client = TcpStream::connect(svc.addr).await.expect("connect");
    let path = format!("/items/{ITEM}/deduct");
    client
        .write_all(&request_bytes("POST", &path))
        .await
        .expect("send");
    // Bounded poll: the handler has taken the lock when its key shows up.
    let started = Instant::now();
    while lock_pttl(&mut conn, ITEM).await.is_none() {
        assert!(started.elapsed() < LIMIT, "the handler never took the lock");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }

    // No axum or hyper setting is needed for this: while a handler runs, hyper's HTTP/1 server
    // keeps reading the socket, and an EOF before the response (half-close is off by default)
    // ends the connection task, dropping the handler's future with it. lockrt's drop path then
    // releases the lock in the background.
    drop(client);
    let hung_up = Instant::now();
    while lock_pttl(&mut conn, ITEM).await.is_some() {
        assert!(
            hung_up.elapsed() < Duration::from_millis(500),
            "lock still held {:?} after the client left (lease 10 s)",
            hung_up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    eprintln!("lock gone {:?} after the client hung up", hung_up.elapsed());
    // Cancelled before its write: the unit is still there.
    let left: u64 = conn.get(format!("stock:{ITEM}")).await.expect("GET");
    assert_eq!(left, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_answers_503_and_leaks_no_password() {
    const PASSWORD: &str = "s3cret-Pa55word";
    let mut redis = RedisServer::start_with(&["--requirepass", PASSWORD]).expect("start redis");
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}/", redis.port());
    let svc = Instance::start_with(&url, Stdio::piped(), &["--seed", "3=5"]).await;
    let r = http(svc.addr, "POST", "/items/3/deduct").await;
    assert_eq!((r.status, r.body), (200, json!({"item": 3, "left": 4})));

    redis.kill();
    let started = Instant::now();
    let r = http(svc.addr, "POST", "/items/3/deduct").await;
    eprintln!("with Redis down, after {:?}: {r:?}", started.elapsed());
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
    assert_eq!(r.body, json!({"error": "lock_unavailable", "retry": true}));

    // The service logged the failure, naming the server but not the password.
    let log = svc.stop_and_read_stderr().await;
    eprintln!("service log: {log}");
    assert!(
        log.contains(&format!("127.0.0.1:{}", redis.port())),
        "{log}"
    );
    assert!(
        !log.contains(PASSWORD),
        "the password leaked into the log: {log}"
    );
}
