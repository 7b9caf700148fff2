//! An acquire request that reaches Redis only after its caller gave up, and after the
//! compensating release that caller sent on a fresh connection, must not take the lock (or a
//! queue place) for an owner that is gone.

use crate::support;

use lockrt::testing::{Direction, FaultProxy};
use lockrt::{LockOptions, Locker};
use redis::AsyncCommands;
use support::{Fx, calls_of, ms, opts};
use tokio::time::Instant;

/// Prints a measured figure: `FIGURE <case>: <text>`.
fn figure(case: &str, text: impl std::fmt::Display) {
    println!("FIGURE {case}: {text}");
}

/// The request is held 1.5 s in the network; the caller times out after 300 ms and its
/// compensating release, on a new connection, reaches Redis first. When the acquire lands
/// afterwards, the lock stays free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_landing_after_its_compensation_takes_nothing() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let late = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(300))
        .build()
        .await
        .expect("locker behind the proxy");
    let other = fx.locker().await;
    let mut conn = fx.conn().await;
    // Both scripts loaded on the server, so the late request runs when it lands.
    late.acquire("warm", opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let before = calls_of(&mut conn, "evalsha").await;

    proxy.delay(Direction::ToServer, ms(1_500));
    let start = Instant::now();
    let attempt = {
        let late = late.clone();
        tokio::spawn(async move {
            late.try_acquire("late", LockOptions::new().ttl(ms(10_000)))
                .await
        })
    };
    // The scenario's timing: the request is in the proxy's delay line within a few ms;
    // requests sent from now on (the compensation) pass at once.
    tokio::time::sleep(ms(100)).await;
    proxy.delay(Direction::ToServer, ms(0));
    let res = attempt.await.unwrap();
    assert!(res.is_err(), "the attempt timed out: {res:?}");
    // The compensating release, then the late acquire.
    let landed = support::settle(
        async || calls_of(&mut conn, "evalsha").await >= before + 2,
        "the late acquire never reached the server",
    );
    landed.await;
    let landed_after = start.elapsed();
    let left: i64 = conn.pttl("lock:late").await.unwrap();
    let queued: usize = conn.zcard("{lock:late}:q").await.unwrap();
    let taken = other.try_acquire("late", LockOptions::new()).await.unwrap();
    figure(
        "an_acquire_landing_after_its_compensation_takes_nothing",
        format!(
            "acquire delayed 1.5 s, caller gave up at 300 ms, compensation first: after the \
             late request landed ({landed_after:?}) the lock's PTTL was {left} ms, another \
             client's try_acquire {}",
            if taken.is_some() {
                "succeeded"
            } else {
                "was refused"
            }
        ),
    );
    assert!(left < 0, "an orphaned lock with {left} ms left");
    assert_eq!(queued, 0, "an orphaned queue place");
    assert!(taken.is_some());
}

/// The same against a held lock: the late request would queue its owner, whose registration
/// lives 2 s, and the holder's release would hand the lock to nobody for the grant lease. It
/// takes no queue place, and the release frees the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_acquire_against_a_held_lock_takes_no_queue_place() {
    let mut fx = Fx::redis();
    let proxy = FaultProxy::in_front_of(fx.server()).expect("proxy");
    let late = Locker::builder()
        .url(proxy.url())
        .response_timeout(ms(300))
        .build()
        .await
        .expect("locker behind the proxy");
    let holder = fx.locker().await;
    let mut conn = fx.conn().await;
    late.acquire("warm", opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let held = holder.acquire("busy", opts()).await.unwrap();
    let before = calls_of(&mut conn, "evalsha").await;

    proxy.delay(Direction::ToServer, ms(1_500));
    let attempt = {
        let late = late.clone();
        tokio::spawn(async move { late.acquire("busy", opts().wait(ms(200))).await })
    };
    // As above: only the first request is held up.
    tokio::time::sleep(ms(100)).await;
    proxy.delay(Direction::ToServer, ms(0));
    assert!(attempt.await.unwrap().is_err());
    support::settle(
        async || calls_of(&mut conn, "evalsha").await >= before + 2,
        "the late acquire never reached the server",
    )
    .await;
    let queued: usize = conn.zcard("{lock:busy}:q").await.unwrap();
    held.release().await.unwrap();
    let left: i64 = conn.pttl("lock:busy").await.unwrap();
    figure(
        "a_late_acquire_against_a_held_lock_takes_no_queue_place",
        format!(
            "acquire delayed 1.5 s behind its compensation, lock held: {queued} queue place(s) \
             after it landed; after the holder's release the lock's PTTL was {left} ms"
        ),
    );
    assert_eq!(queued, 0, "the late acquire queued a departed waiter");
    assert!(
        left < 0,
        "the release handed the lock to a departed waiter ({left} ms)"
    );
}

mod token_once {
    //! A token serves one acquisition only: once it released (recorded in the lock's state `{lock}:state`)
    //! or its acquisition was abandoned, a request of it that lands late takes nothing, and a proof
    //! exists only for a release that really happened (a rolled-back unacknowledged acquire leaves none).

    use super::support;

    use std::time::Duration;

    use lockrt::testing::{Direction, FaultProxy, RedisServer};
    use lockrt::{LockOptions, Locker};
    use support::ms;
    use tokio::time::Instant;

    const DISKLESS: [&str; 4] = [
        "--repl-diskless-sync-delay",
        "0",
        "--repl-diskless-sync",
        "yes",
    ];

    async fn conn_to(server: &RedisServer) -> redis::aio::MultiplexedConnection {
        server
            .client()
            .get_multiplexed_async_connection()
            .await
            .expect("connection")
    }

    async fn until_synced(replica: &RedisServer) {
        let mut conn = conn_to(replica).await;
        let start = Instant::now();
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .expect("INFO");
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(start.elapsed() < ms(10_000), "the replica never synced");
            tokio::time::sleep(ms(10)).await;
        }
    }

    /// What the locks' states record (their marks and latest releases), field by field.
    async fn done_keys(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, String)> {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*:state")
            .query_async(conn)
            .await
            .unwrap();
        let mut out = Vec::new();
        for k in keys {
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&k)
                .query_async(conn)
                .await
                .unwrap();
            out.extend(
                fields
                    .into_iter()
                    .filter(|(f, _)| f.starts_with("m:") || f == "x"),
            );
        }
        out
    }

    /// Under `sync_replicas`, an acquire whose WAIT was not acknowledged is rolled back with an
    /// ordinary release of the same token, which writes the release proof '1'. The attempt is
    /// retried with the same token and succeeds once the replica is back: the guard's token now
    /// has a proof of release from *before* it held the lock. The lease then runs out (fixed
    /// lease), another owner takes the lock, and the guard's release finds "not owner" plus that
    /// stale proof: it must report `Lost`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rolled_back_unacknowledged_acquire_leaves_no_proof_to_hide_a_later_loss() {
        let master = RedisServer::start_with(&DISKLESS).expect("master");
        let port = master.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend(DISKLESS);
        let replica = RedisServer::start_with(&args).expect("replica");
        until_synced(&replica).await;
        let synced = || async {
            Locker::builder()
                .url(master.url())
                .sync_replicas(1, ms(200))
                .build()
                .await
                .expect("locker")
        };
        let (a, w) = (synced().await, synced().await);
        let mut conn = conn_to(&master).await;

        // The replica stops acknowledging: A's first attempt lands but is not acknowledged, so it
        // is released (proof '1' written) and retried with the same token.
        replica.pause().expect("SIGSTOP replica");
        let resume_at = tokio::spawn({
            let pid = replica.pid().unwrap();
            async move {
                tokio::time::sleep(ms(350)).await;
                let _ = std::process::Command::new("kill")
                    .args(["-CONT", &pid.to_string()])
                    .status();
            }
        });
        let started = Instant::now();
        let guard = a
            .acquire(
                "proof",
                LockOptions::new()
                    .ttl(ms(1_000))
                    .watchdog(false)
                    .wait(ms(5_000)),
            )
            .await
            .expect("acquired once the replica is back");
        resume_at.await.unwrap();
        let marks = done_keys(&mut conn).await;
        println!(
            "FIGURE acquired after {:?}; proof keys right after the acquire: {marks:?}",
            started.elapsed()
        );

        // The fixed lease runs out; W takes the lock.
        tokio::time::sleep(ms(1_200)).await;
        let other = w
            .acquire("proof", LockOptions::new().wait(ms(2_000)))
            .await
            .expect("W takes the expired lock");
        let w_fence = other.fence();
        let a_fence = guard.fence();
        let lost_locally = guard.is_lost();
        let res = guard.release().await;
        println!(
            "FIGURE A fence {a_fence}, W fence {w_fence} (W holds now), A is_lost()={lost_locally}, A release -> {res:?}"
        );
        other.release().await.expect("W held it");
        assert!(
            matches!(res, Err(ref e) if e.is_lost()),
            "A's release reported {res:?} while W held the lock in between (stale proof of the rollback)"
        );
    }

    /// An acquire request held up in the network past its retry: the retry takes the lock, the
    /// guard is released normally (proof '1'), and then the first request lands. acquire.lua only
    /// refuses a token marked 'a', so it takes the lock for a token whose owner is gone: the lock
    /// is orphaned for a whole ttl.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_acquire_held_up_past_a_normal_release_takes_nothing() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let a = Locker::builder()
            .url(proxy.url())
            .response_timeout(ms(300))
            .build()
            .await
            .expect("locker A");
        let b = Locker::connect(&server.url()).await.expect("locker B");
        let mut conn = conn_to(&server).await;
        // Loads the scripts on the server.
        a.acquire("orphan", LockOptions::new())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();

        proxy.delay(Direction::ToServer, ms(1_500));
        let a2 = a.clone();
        let task = tokio::spawn(async move {
            a2.acquire("orphan", LockOptions::new().ttl(ms(10_000)).wait(ms(5_000)))
                .await
        });
        // The first request is read (and held for 1.5 s) by now; later frames pass at once.
        tokio::time::sleep(ms(100)).await;
        proxy.delay(Direction::ToServer, Duration::ZERO);
        let guard = task.await.unwrap().expect("the retry takes the lock");
        guard.release().await.expect("released");
        let released_at = Instant::now();
        // Wait for the held request to land (1.5 s after it was sent).
        tokio::time::sleep(ms(1_800)).await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg("lock:orphan")
            .query_async(&mut conn)
            .await
            .unwrap();
        let free = b.try_acquire("orphan", LockOptions::new()).await.unwrap();
        println!(
            "FIGURE {:?} after A's release: lock:orphan PTTL {pttl} ms, B try_acquire -> {}",
            released_at.elapsed(),
            if free.is_some() { "acquired" } else { "busy" }
        );
        assert!(
            free.is_some(),
            "a request of A's released token landed late and took the lock (PTTL {pttl} ms): orphaned"
        );
    }

    /// `try_acquire` whose first request is held up in the network: the retry finds the lock held
    /// by B and returns `None` without any compensation (only a queued acquisition stays armed).
    /// B releases; the held request lands and takes the lock for a token nobody holds.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_try_acquire_leaves_no_request_that_takes_the_lock_later() {
        let server = RedisServer::start().expect("redis-server");
        let proxy = FaultProxy::in_front_of(&server).expect("proxy");
        let a = Locker::builder()
            .url(proxy.url())
            .response_timeout(ms(50))
            .build()
            .await
            .expect("locker A");
        let b = Locker::connect(&server.url()).await.expect("locker B");
        let mut conn = conn_to(&server).await;
        a.acquire("orphan2", LockOptions::new())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let held = b
            .acquire("orphan2", LockOptions::new())
            .await
            .expect("B holds");

        proxy.delay(Direction::ToServer, ms(1_500));
        let a2 = a.clone();
        let task = tokio::spawn(async move {
            a2.try_acquire("orphan2", LockOptions::new().ttl(ms(10_000)))
                .await
        });
        tokio::time::sleep(ms(20)).await;
        proxy.delay(Direction::ToServer, Duration::ZERO);
        let res = task.await.unwrap().expect("an answer");
        assert!(res.is_none(), "busy: B holds it");
        held.release().await.expect("B released");
        let released_at = Instant::now();
        tokio::time::sleep(ms(1_800)).await;
        let pttl: i64 = redis::cmd("PTTL")
            .arg("lock:orphan2")
            .query_async(&mut conn)
            .await
            .unwrap();
        let free = b.try_acquire("orphan2", LockOptions::new()).await.unwrap();
        println!(
            "FIGURE {:?} after B's release: lock:orphan2 PTTL {pttl} ms, B try_acquire -> {}",
            released_at.elapsed(),
            if free.is_some() { "acquired" } else { "busy" }
        );
        assert!(
            free.is_some(),
            "A's try_acquire said busy, then its held request took the lock (PTTL {pttl} ms)"
        );
    }
}
