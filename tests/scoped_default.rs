//! `lockrt::testing::with_default`: a default locker for one future, so parallel tests each
//! with their own default don't see each other's locks. In a file of its own: one test here
//! also installs the process-wide default.

use std::time::Duration;

use lockrt::testing::{RedisServer, with_default};
use lockrt::{LockError, Locker, distributed_lock};
use redis::AsyncCommands;

/// Held in `mine` (and so not in any other test's locker) while the body runs. `wait = "0s"`:
/// two tests sharing one locker would find the lock busy.
#[distributed_lock(key = "shared", wait = "0s")]
async fn section(mine: &Locker) -> Result<(), LockError> {
    assert!(
        mine.memory_pttl("shared").is_some(),
        "the lock is not in this test's own locker"
    );
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(mine.memory_pttl("shared").is_some());
    Ok(())
}

/// Many rounds, each in a fresh task on the multi-thread runtime, so the two tests' sections
/// overlap in time on the same worker threads.
async fn rounds(name: &str) {
    let mine = Locker::in_memory();
    for round in 0..200 {
        let locker = mine.clone();
        let task = tokio::spawn(with_default(
            mine.clone(),
            async move { section(&locker).await },
        ));
        task.await
            .unwrap()
            .unwrap_or_else(|e| panic!("{name} round {round}: {e:?}"));
        assert!(mine.memory_pttl("shared").is_none(), "released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_test_one_has_its_own_default() {
    rounds("one").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_test_two_has_its_own_default() {
    rounds("two").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_scopes_in_one_test_stay_separate() {
    // Eight scopes at once, each with its own in-memory default, all taking "shared".
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            tokio::spawn(async move {
                let mine = Locker::in_memory();
                for round in 0..100 {
                    with_default(mine.clone(), section(&mine))
                        .await
                        .unwrap_or_else(|e| panic!("scope {i} round {round}: {e:?}"));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scope_wins_over_the_process_default_and_ends_with_its_future() {
    let server = RedisServer::start().unwrap();
    let global = Locker::connect(&server.url()).await.unwrap();
    lockrt::set_default(global.clone());
    let scoped = Locker::builder()
        .url(server.url())
        .prefix("scoped:")
        .build()
        .await
        .unwrap();

    #[distributed_lock(key = "job", wait = "0s")]
    async fn job() -> Result<String, LockError> {
        lockrt::default_locker()?.redis_key("job")
    }

    // Inside: the scoped locker's keys on the real server.
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let key = with_default(scoped.clone(), async {
        let held: bool = conn.exists("scoped:job").await.unwrap();
        assert!(!held);
        job().await
    })
    .await
    .unwrap();
    assert_eq!(key, "scoped:job");
    // A scoped lock is a real lock: busy while another owner holds it.
    let other = Locker::builder()
        .url(server.url())
        .prefix("scoped:")
        .build()
        .await
        .unwrap();
    let guard = other.acquire("job", Default::default()).await.unwrap();
    let err = with_default(scoped.clone(), job()).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    guard.release().await.unwrap();

    // Outside (and after) the scope: the process-wide default.
    assert_eq!(job().await.unwrap(), "lock:job");
}
