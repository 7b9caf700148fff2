//! One of three Sentinels frozen (SIGSTOP: TCP accepts, nothing answers; as a Sentinel behind a
//! dead network path or a stuck VM). The locker keeps following the master: before a failover
//! (the request gate) and after one (the reconnect resolves the master again).

use std::time::Duration;

use lockrt::testing::RedisSentinelGroup;
use lockrt::{LockOptions, Locker};
use tokio::time::Instant;

const SERVICE: &str = "locks";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// Resumes the frozen sentinel however the test ends.
struct Thaw(u32);
impl Drop for Thaw {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

async fn ask(port: u16) -> Option<u16> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut conn = tokio::time::timeout(ms(500), c.get_multiplexed_async_connection())
        .await
        .ok()?
        .ok()?;
    let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(SERVICE)
        .query_async(&mut conn)
        .await
        .ok()?;
    addr.map(|a| a.1)
}

#[derive(Default, Debug)]
struct Tally {
    ok: u32,
    busy: u32,
    err: u32,
    max: Duration,
    total: Duration,
    first_err: Option<String>,
}

async fn probe(locker: &Locker, prefix: &str, n: u32, every: Duration) -> Tally {
    let mut t = Tally::default();
    for i in 0..n {
        let start = Instant::now();
        let r = locker
            .try_acquire(&format!("{prefix}{i}"), LockOptions::new().ttl(ms(5_000)))
            .await;
        let took = start.elapsed();
        t.max = t.max.max(took);
        t.total += took;
        match r {
            Ok(Some(g)) => {
                t.ok += 1;
                drop(g);
            }
            Ok(None) => t.busy += 1,
            Err(e) => {
                t.err += 1;
                t.first_err.get_or_insert(e.to_string());
            }
        }
        tokio::time::sleep(every).await;
    }
    t
}

async fn case(timeouts: Option<Duration>) {
    let g = RedisSentinelGroup::start(SERVICE, 3).expect("group");
    let ports = g.sentinel_ports();
    let mut b = Locker::builder().sentinel(g.sentinel_urls(), SERVICE);
    if let Some(t) = timeouts {
        b = b.connect_timeout(t).response_timeout(t);
    }
    let locker = b.build().await.expect("locker");
    let warm = locker.acquire("warm", LockOptions::new()).await.unwrap();
    warm.release().await.unwrap();
    let pids = g.pids();
    let first_sentinel = pids[2];
    signal(first_sentinel, "-STOP");
    let _thaw = Thaw(first_sentinel);
    // Phase 1: the gate with the first Sentinel (the watcher's) frozen, no failover.
    let p1 = probe(&locker, "a", 30, ms(150)).await;
    // Phase 2: a failover run by the second Sentinel; the locker must follow.
    let old = ask(ports[1]).await.unwrap();
    let _: String = redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(SERVICE)
        .query_async(
            &mut redis::Client::open(format!("redis://127.0.0.1:{}/", ports[1]))
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap(),
        )
        .await
        .expect("SENTINEL FAILOVER on the second sentinel");
    let start = Instant::now();
    loop {
        if ask(ports[1]).await.is_some_and(|p| p != old)
            && ask(ports[2]).await.is_some_and(|p| p != old)
        {
            break;
        }
        assert!(start.elapsed() < ms(15_000), "no failover");
        tokio::time::sleep(ms(50)).await;
    }
    let switched = start.elapsed();
    let p2 = probe(&locker, "b", 40, ms(150)).await;
    // Where did phase 2's locks land? Count on the new master.
    println!(
        "FIGURE sentinel_frozen (timeouts {timeouts:?}): first of 3 sentinels SIGSTOPped.\n  \
         phase 1 (no failover): {} ok, {} busy, {} errors, max {:?}, mean {:?}, first error {:?}\n  \
         phase 2 (failover by sentinel 2, switched in {switched:?}): {} ok, {} busy, {} errors, max {:?}, mean {:?}, first error {:?}",
        p1.ok,
        p1.busy,
        p1.err,
        p1.max,
        p1.total / 30,
        p1.first_err,
        p2.ok,
        p2.busy,
        p2.err,
        p2.max,
        p2.total / 40,
        p2.first_err,
    );
    assert_eq!(p1.err, 0, "phase 1 errors");
    assert!(
        p2.err <= 3,
        "the locker did not follow the failover with one sentinel frozen: {} of 40 errors",
        p2.err
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow (about 60 s): cargo xtask chaos"]
async fn chaos_one_frozen_sentinel_default_timeouts() {
    case(None).await;
}
