//! Faults of the Redis server itself while a lock is held or being taken: killed and
//! restarted, down at acquire, frozen (SIGSTOP), clients paused, connections killed. Each test
//! prints its measured figure (`FIGURE ...`, quoted in RELIABILITY.md).

mod support;

use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};
use support::history::{self, Log, Oracle};
use support::ms;
use support::proxy_faults::{
    default_margin, direct, fence_in, figure, held, lock_value, locker_via, ms_f, pttl,
    server_and_proxy, within,
};
use tokio::time::Instant;

async fn locker(server: &RedisServer, response_timeout: Duration) -> Locker {
    Locker::builder()
        .url(server.url())
        .response_timeout(response_timeout)
        .connect_timeout(ms(300))
        .build()
        .await
        .expect("connect")
}

/// The server dies (SIGKILL) under a held lock and comes back empty: the holder learns it
/// lost the lock before its lease could have run out, and the same `Locker` works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_while_held() {
    let mut server = RedisServer::start().unwrap();
    let locker = locker(&server, ms(200)).await;
    let ttl = ms(1_000);
    let guard = held(&locker, "k", ttl).await;
    let killed = Instant::now();
    server.kill();
    server.restart().unwrap();
    // The lock is gone with the data; the holder must find out within its lease.
    tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("loss declared within the ttl");
    let lost_after = killed.elapsed();
    // The same locker takes the lock again once the server is back.
    let back = Instant::now();
    let again = within(ms(5_000), async || {
        matches!(
            locker.try_acquire("k", LockOptions::new().ttl(ttl)).await,
            Ok(Some(_))
        )
    })
    .await;
    figure(
        "redis_killed_and_restarted_while_held",
        format!(
            "ttl 1 s: loss declared {} after SIGKILL; same Locker re-acquired {} after restart",
            ms_f(lost_after),
            again.map_or("never (5 s)".into(), ms_f)
        ),
    );
    assert!(lost_after < ttl, "loss declared after the ttl");
    assert!(again.is_some(), "the Locker did not recover within 5 s");
    let _ = back;
}

/// Redis is down when `acquire` is called: it fails with `Backend` within its `wait` (plus a
/// documented slack), and once Redis is back the same `Locker` acquires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_acquire_then_back() {
    let mut server = RedisServer::start().unwrap();
    let locker = locker(&server, ms(200)).await;
    server.kill();
    let wait = ms(300);
    let t = Instant::now();
    let err = locker
        .acquire("k", LockOptions::new().ttl(ms(1_000)).wait(wait))
        .await
        .expect_err("no server");
    let failed_after = t.elapsed();
    assert!(err.is_backend(), "{err:?}");
    server.restart().unwrap();
    let recovered = within(ms(5_000), async || {
        locker
            .acquire("k", LockOptions::new().ttl(ms(1_000)).wait(ms(200)))
            .await
            .is_ok()
    })
    .await;
    figure(
        "redis_down_at_acquire_then_back",
        format!(
            "wait 300 ms: Backend error after {}; acquired {} after restart",
            ms_f(failed_after),
            recovered.map_or("never (5 s)".into(), ms_f)
        ),
    );
    // Slack: one connect timeout (300 ms) past `wait`.
    assert!(failed_after < wait + ms(300) + ms(200), "{failed_after:?}");
    assert!(recovered.is_some(), "the Locker did not recover within 5 s");
}

/// Redis frozen (SIGSTOP) under a held lock: loss is declared strictly before the server-side
/// expiry of the last renewal that succeeded (Redis's clock runs on while it is stopped, and
/// it expires the key the moment it runs again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frozen_while_held_loss_declared_before_server_expiry() {
    let (server, proxy) = server_and_proxy();
    let locker = locker_via(&proxy, ms(200)).await;
    let mut conn = direct(&server).await;
    let ttl = ms(1_000);
    let guard = held(&locker, "k", ttl).await;
    // Right after a renewal's reply: the next renewal is a third of the ttl away, so the
    // expiry read now is the expiry of the last successful renewal.
    let c = proxy.counters();
    proxy
        .wait_until(ms(2_000), |n| n.to_client > c.to_client)
        .await
        .expect("a renewal");
    // Nothing more reaches the server from the locker, so no renewal can land between the
    // PTTL read and the freeze: the expiry read is that of the last renewal the server ran,
    // which is at least as late as the last one the locker saw succeed.
    proxy.blackhole();
    let left = pttl(&mut conn, "k").await.expect("held");
    let expiry = Instant::now() + left;
    server.pause().unwrap();
    let declared = tokio::time::timeout(ttl * 2, guard.lost()).await;
    let at = Instant::now();
    server.resume().unwrap();
    let early = expiry.saturating_duration_since(at);
    figure(
        "redis_frozen_while_held_loss_declared_before_server_expiry",
        format!(
            "ttl 1 s: loss declared {} before the server-side expiry (margin {})",
            if at < expiry {
                ms_f(early)
            } else {
                format!("-{}", ms_f(at - expiry))
            },
            ms_f(default_margin(ttl))
        ),
    );
    assert!(declared.is_ok(), "no loss declared within 2 ttl");
    assert!(
        at < expiry,
        "loss declared after the server expired the lock"
    );
}

/// `CLIENT PAUSE` while two lockers race for one key, 30 runs: never two holders (checked by
/// the history checker's oracle), and no lock left over beyond its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: run with cargo xtask chaos"]
async fn chaos_client_pause_during_acquire() {
    client_pause_runs(30).await;
}

async fn client_pause_runs(runs: u32) {
    let server = RedisServer::start().unwrap();
    let oracle_server = RedisServer::start().unwrap();
    let dir = std::env::temp_dir().join(format!(
        "lockrt-pause-{}-{}",
        std::process::id(),
        history::mono_ns()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let ns = format!("pause-{}", history::mono_ns());
    let log = Log::create(&dir.join("p.log"));
    let a = locker(&server, ms(150)).await;
    let b = locker(&server, ms(150)).await;
    let mut admin = direct(&server).await;
    let ttl = ms(500);
    let mut orphans = 0;
    let mut acquired = 0;
    let mut errors = 0;
    let start = Instant::now();
    // One key for every run: fences are per key, and the checker compares them.
    let key = "p".to_owned();
    for run in 0..runs {
        let pause_ms = 100 + u64::from(run % 5) * 60;
        let _: () = redis::cmd("CLIENT")
            .arg("PAUSE")
            .arg(pause_ms)
            .arg("ALL")
            .query_async(&mut admin)
            .await
            .unwrap();
        let race = |l: Locker, key: String, log: Log, ns: String, url: String| async move {
            let opts = LockOptions::new().ttl(ttl).wait(ms(1_500));
            let mut oracle = Oracle::connect(&url, &ns);
            match l.acquire(&key, opts).await {
                Ok(g) => {
                    let fence = g.fence();
                    history::section(&mut oracle, &log, fence, ms(20), Some(&g)).await;
                    let _ = g.release().await;
                    (1, 0)
                }
                Err(_) => (0, 1),
            }
        };
        let (ra, rb) = tokio::join!(
            tokio::spawn(race(
                a.clone(),
                key.clone(),
                log.clone(),
                ns.clone(),
                oracle_server.url()
            )),
            tokio::spawn(race(
                b.clone(),
                key.clone(),
                log.clone(),
                ns.clone(),
                oracle_server.url()
            )),
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        acquired += ra.0 + rb.0;
        errors += ra.1 + rb.1;
        // Whatever happened, nothing of this run may outlive its ttl.
        let gone = within(ttl + ms(100), async || {
            lock_value(&mut admin, &key).await.is_none()
        })
        .await;
        if gone.is_none() {
            orphans += 1;
        }
    }
    let report = history::check(
        &history::load(&dir),
        &[],
        Oracle::connect(&oracle_server.url(), &ns).state(),
    );
    let _ = std::fs::remove_dir_all(&dir);
    figure(
        "chaos_client_pause_during_acquire",
        format!(
            "{runs} runs in {:.1} s: {acquired} acquisitions, {errors} errors, {orphans} locks \
             left beyond ttl; {}",
            start.elapsed().as_secs_f64(),
            report.summary()
        ),
    );
    assert!(report.is_ok(), "{:?}", report.violations());
    assert_eq!(orphans, 0, "locks left over beyond their ttl");
}

/// `CLIENT KILL` of the holder's connections: the lock stays held (renewals go on over a new
/// connection), with no false loss, and the release works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_kill_while_holding() {
    let server = RedisServer::start().unwrap();
    let locker = locker(&server, ms(200)).await;
    let mut admin = direct(&server).await;
    let ttl = ms(600);
    let guard = held(&locker, "k", ttl).await;
    let ours = lock_value(&mut admin, "k").await.unwrap();
    let mut killed = 0i64;
    let mut min_left = ttl;
    let end = Instant::now() + ttl * 3;
    while Instant::now() < end {
        let n: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut admin)
            .await
            .unwrap();
        killed += n;
        tokio::time::sleep(ttl / 4).await;
        if let Some(left) = pttl(&mut admin, "k").await {
            min_left = min_left.min(left);
        }
    }
    let still = lock_value(&mut admin, "k").await;
    let lost = guard.is_lost();
    let released = guard.release().await;
    figure(
        "client_kill_while_holding",
        format!(
            "ttl 600 ms, CLIENT KILL every 150 ms for 1.8 s ({killed} connections killed): \
             false loss {lost}, lowest PTTL seen {}, release {:?}",
            ms_f(min_left),
            released.as_ref().map(|_| ()).map_err(|e| e.to_string())
        ),
    );
    assert!(!lost, "false loss after CLIENT KILL");
    assert_eq!(
        still.as_deref(),
        Some(ours.as_str()),
        "the lock changed hands"
    );
    assert_eq!(fence_in(&ours), fence_in(still.as_deref().unwrap()));
    released.expect("release after CLIENT KILL");
}
