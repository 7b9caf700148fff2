//! `#[distributed_lock]` end to end, on Redis and in memory: every exit path releases, nested
//! sections don't deadlock, the body never runs unlocked, loss cancels (or not, when asked),
//! and `locker = self.locker` works.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lockrt::{LockError, Locker, distributed_lock};
use support::{Fx, ms, opts};
use tokio::sync::oneshot;

const PROMPT: Duration = Duration::from_millis(200);

#[distributed_lock(key = "item:{id}", locker = locker, ttl = "5s", wait = "2s")]
async fn ok_path(locker: &Locker, fx: &Fx, id: u32) -> Result<u32, LockError> {
    // Held while the body runs, under exactly the rendered key.
    assert!(fx.pttl(&format!("item:{id}")).await.is_some());
    assert_eq!(lockrt::current_lock().unwrap().key(), format!("item:{id}"));
    Ok(id * 2)
}

#[derive(Debug, PartialEq)]
enum AppError {
    Lock(String),
    Parse,
}
impl From<LockError> for AppError {
    fn from(e: LockError) -> Self {
        AppError::Lock(e.to_string())
    }
}

async fn parse(text: &str) -> Result<u32, AppError> {
    text.parse().map_err(|_| AppError::Parse)
}

#[distributed_lock(key = "parse:<text>", locker = locker)]
async fn question_mark(locker: &Locker, text: &str) -> Result<u32, AppError> {
    let n = parse(text).await?;
    Ok(n + 1)
}

#[distributed_lock(key = "early:{n}", locker = locker)]
async fn early_return(locker: &Locker, n: u32) -> Result<&'static str, LockError> {
    if n > 0 {
        return Ok("early");
    }
    Ok("late")
}

#[distributed_lock(key = "stuck:{name}", locker = locker, ttl = "5s")]
async fn stuck(
    locker: Locker,
    name: &'static str,
    started: oneshot::Sender<()>,
) -> Result<(), LockError> {
    let _ = started.send(());
    std::future::pending().await
}

#[distributed_lock(key = "panic", locker = locker)]
async fn panics(locker: Locker) -> Result<(), LockError> {
    panic!("body failed")
}

both! {
    async fn ok_question_mark_and_early_return_release_before_returning(fx) {
        let locker = fx.locker().await;
        assert_eq!(ok_path(&locker, &fx, 21).await.unwrap(), 42);
        assert!(fx.pttl("item:21").await.is_none());

        assert_eq!(question_mark(&locker, "41").await, Ok(42));
        assert!(fx.pttl("parse:41").await.is_none());
        assert_eq!(question_mark(&locker, "x").await, Err(AppError::Parse));
        assert!(fx.pttl("parse:x").await.is_none());

        assert_eq!(early_return(&locker, 1).await.unwrap(), "early");
        assert!(fx.pttl("early:1").await.is_none());
    }
}

both! {
    async fn panic_propagates_and_releases(fx) {
        let locker = fx.locker().await;
        let err = tokio::spawn(panics(locker)).await.unwrap_err();
        assert!(err.is_panic(), "the panic must keep propagating");
        assert!(fx.gone_within("panic", PROMPT).await.is_some(), "held after a panic");
    }
}

both! {
    async fn timeout_cancellation_releases(fx) {
        let locker = fx.locker().await;
        let (tx, rx) = oneshot::channel();
        let res = tokio::time::timeout(ms(150), stuck(locker, "timeout", tx)).await;
        assert!(res.is_err());
        rx.await.expect("the body had started");
        assert!(fx.gone_within("stuck:timeout", PROMPT).await.is_some(), "held after timeout");
    }
}

both! {
    async fn abort_releases(fx) {
        let locker = fx.locker().await;
        let (tx, rx) = oneshot::channel();
        let task = tokio::spawn(stuck(locker, "abort", tx));
        rx.await.unwrap();
        assert!(fx.pttl("stuck:abort").await.is_some());
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert!(fx.gone_within("stuck:abort", PROMPT).await.is_some(), "held after abort");
    }
}

#[distributed_lock(key = "order:{order}", locker = locker)]
async fn outer(locker: &Locker, fx: &Fx, order: u32) -> Result<u32, LockError> {
    let fence = lockrt::current_lock().unwrap().fence();
    // Same key, same task: runs without acquiring again.
    let same = inner_same(locker, order).await?;
    assert_eq!(same, fence, "the nested section sees the outer lock");
    assert!(
        fx.pttl(&format!("order:{order}")).await.is_some(),
        "released by the inner end"
    );
    // Another key nested inside is a lock of its own.
    inner_other(locker, fx, order).await?;
    Ok(order)
}

#[distributed_lock(key = "order:{order}", locker = locker, wait = "0s")]
async fn inner_same(locker: &Locker, order: u32) -> Result<u64, LockError> {
    Ok(lockrt::current_lock().unwrap().fence())
}

#[distributed_lock(key = "audit:{order}", locker = locker, wait = "0s")]
async fn inner_other(locker: &Locker, fx: &Fx, order: u32) -> Result<(), LockError> {
    assert!(fx.pttl(&format!("audit:{order}")).await.is_some());
    Ok(())
}

both! {
    async fn nested_sections_same_and_other_key(fx) {
        let locker = fx.locker().await;
        let res = tokio::time::timeout(Duration::from_secs(5), outer(&locker, &fx, 7)).await;
        assert_eq!(res.expect("nested sections deadlocked").unwrap(), 7);
        assert!(fx.pttl("order:7").await.is_none());
        assert!(fx.pttl("audit:7").await.is_none());
    }
}

#[distributed_lock(key = "busy", locker = locker, wait = "100ms")]
async fn count_runs(locker: &Locker, runs: &AtomicU32) -> Result<(), LockError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

both! {
    async fn body_never_runs_without_the_lock(fx) {
        let holder = fx.locker().await;
        let other = fx.locker().await;
        let runs = AtomicU32::new(0);
        let guard = holder.acquire("busy", opts()).await.unwrap();
        let err = count_runs(&other, &runs).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert_eq!(runs.load(Ordering::SeqCst), 0, "the body ran without the lock");
        guard.release().await.unwrap();
        count_runs(&other, &runs).await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}

#[distributed_lock(key = "victim:{policy}", locker = locker, ttl = "1s", on_lost = "cancel")]
async fn lost_cancel(
    locker: &Locker,
    policy: &str,
    started: oneshot::Sender<()>,
    finished: &AtomicU32,
) -> Result<(), LockError> {
    let _ = started.send(());
    tokio::time::sleep(ms(2_000)).await;
    finished.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

#[distributed_lock(key = "victim:{policy}", locker = locker, ttl = "1s", on_lost = "continue")]
async fn lost_continue(
    locker: &Locker,
    policy: &str,
    started: oneshot::Sender<()>,
    finished: &AtomicU32,
) -> Result<(), LockError> {
    let _ = started.send(());
    tokio::time::sleep(ms(1_000)).await;
    finished.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

async fn delete_when_started(fx: &Fx, key: &str, started: oneshot::Receiver<()>) {
    use redis::AsyncCommands;
    started.await.unwrap();
    let () = fx.conn().await.del(format!("lock:{key}")).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_cancels_the_body_or_lets_it_finish_when_asked() {
    let fx = Fx::redis();
    let locker = fx.locker().await;
    let finished = AtomicU32::new(0);

    let (tx, rx) = oneshot::channel();
    let (res, ()) = tokio::join!(
        lost_cancel(&locker, "cancel", tx, &finished),
        delete_when_started(&fx, "victim:cancel", rx)
    );
    assert!(
        matches!(res, Err(LockError::Lost { ref key, .. }) if key == "victim:cancel"),
        "{res:?}"
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        0,
        "the body ran on after the loss"
    );

    let (tx, rx) = oneshot::channel();
    let (res, ()) = tokio::join!(
        lost_continue(&locker, "continue", tx, &finished),
        delete_when_started(&fx, "victim:continue", rx)
    );
    assert_eq!(
        finished.load(Ordering::SeqCst),
        1,
        "on_lost = continue finishes the body"
    );
    // ... and still reports the loss: a body that may have overlapped another holder never
    // comes back as plain success.
    assert!(
        matches!(res, Err(LockError::Lost { ref key, .. }) if key == "victim:continue"),
        "{res:?}"
    );
}

struct Ledger {
    locker: Arc<Locker>,
    tenant: String,
    entries: Vec<i64>,
}

impl Ledger {
    #[distributed_lock(key = "ledger:{self.tenant}", locker = self.locker)]
    async fn post(&mut self, amount: i64) -> Result<usize, LockError> {
        self.entries.push(amount);
        Ok(self.entries.len())
    }
}

both! {
    async fn locker_from_self(fx) {
        let mut ledger = Ledger {
            locker: Arc::new(fx.locker().await),
            tenant: "acme".into(),
            entries: Vec::new(),
        };
        assert_eq!(ledger.post(5).await.unwrap(), 1);
        assert_eq!(ledger.post(-2).await.unwrap(), 2);
        assert!(fx.pttl("ledger:acme").await.is_none());
    }
}

#[distributed_lock(key = "counter", locker = locker, wait = "10s")]
async fn increment(locker: Locker, fx: Arc<Fx>) -> Result<(), LockError> {
    use redis::AsyncCommands;
    let mut conn = fx.conn().await;
    let v: u32 = conn
        .get::<_, Option<u32>>("counter")
        .await
        .unwrap()
        .unwrap_or(0);
    tokio::task::yield_now().await;
    let () = conn.set("counter", v + 1).await.unwrap();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotated_fn_excludes_across_lockers() {
    use redis::AsyncCommands;
    let fx = Arc::new(Fx::redis());
    let lockers = [fx.locker().await, fx.locker().await];
    let tasks: Vec<_> = (0..100)
        .map(|i| tokio::spawn(increment(lockers[i % 2].clone(), fx.clone())))
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let v: u32 = fx.conn().await.get("counter").await.unwrap();
    assert_eq!(v, 100, "lost updates through the attribute");
}

#[distributed_lock(key = "cat:{tenant}", locker = locker, mode = "read", wait = "2s")]
async fn read_catalogue(
    locker: &Locker,
    tenant: &str,
    inside: &AtomicU32,
) -> Result<u32, LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(ms(100)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    assert_eq!(
        lockrt::current_lock().map(|h| h.kind()),
        Some(lockrt::LockKind::Read)
    );
    Ok(now)
}

#[distributed_lock(key = "cat:{tenant}", locker = locker, mode = "write", wait = "2s")]
async fn rebuild_catalogue(
    locker: &Locker,
    tenant: &str,
    inside: &AtomicU32,
) -> Result<u32, LockError> {
    Ok(inside.load(Ordering::SeqCst))
}

#[distributed_lock(key = "export:{tenant}", locker = locker, permits = 2, wait = "5s")]
async fn export(locker: &Locker, tenant: &str, inside: &AtomicU32) -> Result<u32, LockError> {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(ms(50)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
    Ok(now)
}

/// `mode = "read"` sections of one key run together and a `mode = "write"` one never with
/// them; `permits = 2` lets two in at once, never three. Each caller is its own task, as
/// requests are (one task joining two sections on one key is one owner).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_kinds_through_the_attribute() {
    for fx in [Fx::redis(), Fx::memory()] {
        let locker = fx.locker().await;
        let inside = Arc::new(AtomicU32::new(0));
        let spawn_read = || {
            let (locker, inside) = (locker.clone(), inside.clone());
            tokio::spawn(async move { read_catalogue(&locker, "acme", &inside).await })
        };
        let (a, b) = (spawn_read(), spawn_read());
        let w = {
            let (locker, inside) = (locker.clone(), inside.clone());
            tokio::spawn(async move {
                tokio::time::sleep(ms(30)).await;
                rebuild_catalogue(&locker, "acme", &inside).await
            })
        };
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert_eq!(a.max(b), 2, "the readers shared the key");
        assert_eq!(
            w.await.unwrap().unwrap(),
            0,
            "the writer ran with no reader inside"
        );
        let slots = Arc::new(AtomicU32::new(0));
        let runs: Vec<_> = (0..6)
            .map(|_| {
                let (locker, slots) = (locker.clone(), slots.clone());
                tokio::spawn(async move { export(&locker, "acme", &slots).await })
            })
            .collect();
        let mut most = 0;
        for run in runs {
            most = most.max(run.await.unwrap().unwrap());
        }
        assert_eq!(most, 2);
    }
}
