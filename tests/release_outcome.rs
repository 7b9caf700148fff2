//! What a release reports: success only when this token's own release provably happened. A
//! release that finds the lock gone or held by another owner (the server restarted without its
//! data, a forced unlock) reports a loss, also when its first try's reply was lost and a retry
//! is what finds out; and a loss found there is logged at WARN and counted, once.

mod support;

use std::time::Duration;

use lockrt::testing::{Direction, FaultProxy, RedisServer};
use lockrt::{LockOptions, Locker};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::opts;
use tokio::sync::oneshot;

/// A section long enough that no renewal runs during the test: only the release can tell.
fn long() -> LockOptions {
    opts().ttl(Duration::from_secs(30))
}

/// Starts a `run_checked` section on `locker` that holds `key` until told to end; returns the
/// sender that ends it and the section's join handle.
async fn section(
    locker: &Locker,
    key: &'static str,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<lockrt::Checked<()>, lockrt::LockError>>,
) {
    let (end, ended) = oneshot::channel::<()>();
    let (started, running) = oneshot::channel::<()>();
    let l = locker.clone();
    let task = tokio::spawn(async move {
        l.run_checked(key, long(), async move {
            let _ = started.send(());
            let _ = ended.await;
        })
        .await
    });
    running.await.expect("the section started");
    (end, task)
}

/// WARN and above of every test of this binary, captured by a global subscriber. A scoped one
/// (`with_default`) may miss an event whose callsite another test's thread registered at the
/// same moment (tracing caches a callsite's interest process-wide).
fn global_logs() -> support::logs::LogBuf {
    static LOGS: std::sync::OnceLock<support::logs::LogBuf> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let (buf, subscriber) = support::logs::capture(tracing::Level::WARN);
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        buf
    })
    .clone()
}

fn counter(recorder: &metrics_util::debugging::Snapshotter, name: &str) -> u64 {
    recorder
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(k, _, _, v)| match v {
            DebugValue::Counter(c) if k.key().name() == name => Some(c),
            _ => None,
        })
        .unwrap_or(0)
}

/// Redis restarts without persistence while A's section runs, W takes the lock, and A's
/// release then meets a dead connection: the retry's "not owner" is a loss, not a success.
/// The loss is logged at WARN once (a line naming the key) and counted in `lockrt_lost_total`.
#[test]
fn a_restart_mid_section_is_reported_lost_logged_and_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let buf = global_logs();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let checked = metrics::with_local_recorder(&recorder, || {
        rt.block_on(async {
            let mut server = RedisServer::start().expect("redis-server");
            let a = Locker::connect(&server.url()).await.unwrap();
            let (end, task) = section(&a, "restarted").await;
            server.restart().expect("restart redis-server");
            let w = Locker::connect(&server.url()).await.unwrap();
            let other = w.acquire("restarted", long()).await.expect("W takes it");
            let _ = end.send(());
            // The body finishes and the release finds W, or the owner check that follows the
            // pub/sub reconnect finds W first and cancels the body: a loss either way.
            let res = task.await.unwrap();
            other.release().await.expect("W still holds it");
            res
        })
    });
    let lost = counter(&snapshotter, "lockrt_lost_total");
    // The other tests of this binary log into the same buffer: only this key's lines count.
    let logs: String = String::from_utf8(buf.bytes())
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"restarted\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let held_throughout = checked.as_ref().map(|c| c.held_throughout());
    println!(
        "FIGURE release_after_restart: held_throughout={held_throughout:?}, lost_total={lost}"
    );
    match checked {
        Ok(c) => {
            assert!(
                !c.held_throughout(),
                "W held the lock while A's body ran, yet A's section was reported held throughout"
            );
            assert!(c.into_result().unwrap_err().is_lost());
        }
        Err(e) => assert!(e.is_lost(), "{e}"),
    }
    assert_eq!(lost, 1, "the loss is counted once");
    eprintln!("{logs}");
    assert_eq!(
        logs.matches("lock lost").count(),
        1,
        "the loss is logged once at WARN:\n{logs}"
    );
}

/// A forced unlock while A's section runs, W takes the lock, and A's release loses its first
/// reply to a connection reset: its retry finds W's lock, which is a loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_unlock_then_a_reset_release_is_reported_lost() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("proxy");
    let a = Locker::connect(&proxy.url()).await.unwrap();
    let w = Locker::connect(&server.url()).await.unwrap();
    let (end, task) = section(&a, "forced").await;
    assert!(w.force_unlock("forced").await.unwrap(), "it was held");
    let other = w.acquire("forced", long()).await.expect("W takes it");
    proxy.reset_on_next(Direction::ToClient);
    let _ = end.send(());
    let res = task.await.unwrap();
    let reported_held = matches!(&res, Ok(c) if c.held_throughout());
    println!("FIGURE release_after_force_unlock: reported held throughout = {reported_held}");
    assert!(
        !reported_held,
        "A's section overlapped W's hold and must not be reported held throughout"
    );
    other.release().await.expect("W still holds it");
}

/// The other side: a release whose reply is lost but which did land is a success (the retry
/// finds its proof), and leaves the lock free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_landed_release_whose_reply_was_lost_is_a_success() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::in_front_of(&server).expect("proxy");
    let a = Locker::connect(&proxy.url()).await.unwrap();
    let w = Locker::connect(&server.url()).await.unwrap();
    let guard = a.acquire("landed:guard", long()).await.unwrap();
    proxy.reset_on_next(Direction::ToClient);
    guard.release().await.expect("the release landed: success");

    let (end, task) = section(&a, "landed:section").await;
    proxy.reset_on_next(Direction::ToClient);
    end.send(()).unwrap();
    let checked = task.await.unwrap().expect("the body ran");
    assert!(checked.held_throughout(), "nobody else held it");

    for key in ["landed:guard", "landed:section"] {
        let g = w.try_acquire(key, opts()).await.unwrap();
        g.expect("the lock is free after the release")
            .release()
            .await
            .unwrap();
    }
    // The proof lives a short while, not forever.
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let proofs: Vec<String> = redis::cmd("KEYS")
        .arg("{lock:*}:done:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(!proofs.is_empty(), "a release leaves its proof");
    for p in proofs {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&p)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(pttl > 0 && pttl <= 60_000, "{p} lives {pttl} ms");
    }
}
