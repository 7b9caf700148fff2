//! `examples/service.rs` as three real instances on one Redis, checked from the outside for
//! `LOCKRT_SERVICE_SECS` seconds (12 unless set; the README's figures come from 60): every
//! round of 20 parallel refunds of one order gives one 200 and 19 409s, each job tick runs once,
//! no read of the catalogue is torn, two exports at most run at once, the transfers keep the
//! total; a forced unlock cancels the handler holding it; idle instances count no lock
//! timeouts and nobody waiting; SIGTERM stops each one cleanly with nothing left held.

use crate::support;

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use lockrt::Locker;
use lockrt::testing::RedisServer;
use redis::AsyncCommands;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::examples_web_stock::http;

const LIMIT: Duration = Duration::from_secs(30);

struct Instance {
    addr: SocketAddr,
    child: Child,
}

async fn start(redis: &RedisServer) -> Instance {
    let mut child = Command::new(support::example_binary("service"))
        .args(["--listen", "127.0.0.1:0", "--refund-ms", "1000"])
        .env("REDIS_URL", redis.url())
        .env_remove("LOCKRT_URL")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start service");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = tokio::time::timeout(LIMIT, async {
        loop {
            let line = stdout
                .next_line()
                .await
                .expect("stdout")
                .expect("listening line");
            if let Some(addr) = line.strip_prefix("listening on http://") {
                return addr.parse().expect("an address");
            }
        }
    })
    .await
    .expect("service listening");
    // Drained in the background: the service must never block on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    Instance { addr, child }
}

fn run_for() -> Duration {
    let secs = std::env::var("LOCKRT_SERVICE_SECS")
        .ok()
        .and_then(|s| s.parse().ok());
    Duration::from_secs(secs.unwrap_or(12))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_keep_every_promise_of_the_service() {
    let redis = RedisServer::start().unwrap();
    let client = redis.client();
    let mut store = client.get_multiplexed_async_connection().await.unwrap();
    for acct in 1..=5 {
        let () = store.set(format!("balance:{acct}"), 100).await.unwrap();
    }
    let mut instances = Vec::new();
    for _ in 0..3 {
        instances.push(start(&redis).await);
    }
    let addrs: Vec<SocketAddr> = instances.iter().map(|i| i.addr).collect();
    let end = Instant::now() + run_for();

    // Readers of the catalogue while the job rewrites it.
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let addr = addrs[r % 3];
            tokio::spawn(async move {
                let (mut reads, mut torn) = (0u32, 0u32);
                while Instant::now() < end {
                    let reply = http(addr, "GET", "/catalogue/t1").await;
                    assert_eq!(reply.status, 200, "{reply:?}");
                    reads += 1;
                    torn += u32::from(reply.body["torn"] == Value::Bool(true));
                }
                (reads, torn)
            })
        })
        .collect();
    // Transfers among five accounts, racy without their two locks.
    let transfers: Vec<_> = (0..6)
        .map(|t| {
            let addr = addrs[t % 3];
            tokio::spawn(async move {
                let mut done = 0u32;
                for n in 0..30u64 {
                    let (from, to) = ((t as u64 + n) % 5 + 1, (t as u64 + 2 * n + 1) % 5 + 1);
                    if from == to {
                        continue;
                    }
                    let reply = http(addr, "POST", &format!("/transfers/{from}/{to}")).await;
                    assert_eq!(reply.status, 200, "{reply:?}");
                    done += 1;
                }
                done
            })
        })
        .collect();

    // Rounds of 20 parallel refunds of one order, spread over the instances.
    let mut rounds = Vec::new();
    let mut order = 0u64;
    while Instant::now() + Duration::from_secs(2) < end {
        order += 1;
        let calls: Vec<_> = (0..20)
            .map(|i| {
                let addr = addrs[i % 3];
                tokio::spawn(async move { http(addr, "POST", &format!("/refunds/{order}")).await })
            })
            .collect();
        let mut statuses = Vec::new();
        for c in calls {
            statuses.push(c.await.unwrap().status);
        }
        statuses.sort();
        rounds.push((order, statuses));
    }
    // Twelve exports of one tenant at once, with two slots.
    let exports: Vec<_> = (0..12)
        .map(|i| {
            let addr = addrs[i % 3];
            tokio::spawn(async move { http(addr, "POST", "/exports/t1").await.status })
        })
        .collect();
    let mut export_statuses = Vec::new();
    for e in exports {
        export_statuses.push(e.await.unwrap());
    }

    // A forced unlock of a refund under way cancels its handler.
    let forced = {
        let addr = addrs[0];
        tokio::spawn(async move { http(addr, "POST", "/refunds/999999").await })
    };
    let operator = Locker::connect(&redis.url()).await.unwrap();
    let seen = support::proxy_faults::within(LIMIT, async || {
        operator.lock_info("refund:999999").await.unwrap().is_some()
    })
    .await;
    assert!(seen.is_some(), "the refund never held its lock");
    assert!(operator.force_unlock("refund:999999").await.unwrap());
    let unlocked = Instant::now();
    let reply = forced.await.unwrap();
    let cancelled_after = unlocked.elapsed();
    assert_eq!(reply.status, 500, "{reply:?}");
    assert_eq!(reply.body["error"], "lock_lost", "{reply:?}");

    let (mut reads, mut torn) = (0, 0);
    for r in readers {
        let (n, t) = r.await.unwrap();
        reads += n;
        torn += t;
    }
    let mut moved = 0;
    for t in transfers {
        moved += t.await.unwrap();
    }
    tokio::time::sleep_until(end).await;

    // What each instance counted: no lock timeouts but the refunds' and exports' 409s, and
    // nobody waiting now.
    let mut stray_timeouts = Vec::new();
    for addr in &addrs {
        let stats = http(*addr, "GET", "/stats").await.body;
        for (name, v) in stats.as_object().unwrap() {
            let busy_site = name.contains("::refund") || name.contains("::export");
            if name.starts_with("lockrt_timeouts_total") && !busy_site && v != 0 {
                stray_timeouts.push((addr, name.clone(), v.clone()));
            }
            if name.starts_with("lockrt_waiting") {
                assert_eq!(v.as_f64(), Some(0.0), "{addr}: {name} = {v}");
            }
        }
    }

    // SIGTERM: each stops cleanly, holding nothing.
    for i in &instances {
        let pid = rustix::process::Pid::from_raw(i.child.id().unwrap() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    }
    let stopped = Instant::now();
    for i in &mut instances {
        let status = tokio::time::timeout(LIMIT, i.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
    let stop_took = stopped.elapsed();
    let held = operator.locks("*").await.unwrap();

    let ticks: Vec<String> = store.keys("ticks:*").await.unwrap();
    let mut ticks: Vec<(u64, u64)> = {
        let mut out = Vec::new();
        for k in ticks {
            let n: u64 = store.get(&k).await.unwrap();
            out.push((k["ticks:".len()..].parse().unwrap(), n));
        }
        out
    };
    ticks.sort();
    let total: i64 = {
        let mut sum = 0;
        for acct in 1..=5 {
            sum += store
                .get::<_, i64>(format!("balance:{acct}"))
                .await
                .unwrap();
        }
        sum
    };
    let max_exports: i64 = store.get("exports:t1:max").await.unwrap();
    let mut refunded = Vec::new();
    for (order, _) in &rounds {
        refunded.push(
            store
                .get::<_, u64>(format!("refunded:{order}"))
                .await
                .unwrap(),
        );
    }
    eprintln!(
        "service: {} refund rounds {:?}; {} ticks run {:?} times; {reads} catalogue reads, \
         {torn} torn; {moved} transfers, total {total}; exports {export_statuses:?}, at most \
         {max_exports} at once; forced unlock cancelled the handler after {cancelled_after:?}; \
         stray timeouts {stray_timeouts:?}; SIGTERM to exit {stop_took:?}; held after {held:?}",
        rounds.len(),
        rounds
            .iter()
            .map(|(_, s)| s.iter().filter(|&&s| s == 200).count())
            .collect::<Vec<_>>(),
        ticks.len(),
        ticks.iter().map(|(_, n)| n).collect::<Vec<_>>(),
    );
    for (order, statuses) in &rounds {
        let ok = statuses.iter().filter(|&&s| s == 200).count();
        let busy = statuses.iter().filter(|&&s| s == 409).count();
        assert_eq!((ok, busy), (1, 19), "refund round {order}: {statuses:?}");
    }
    assert!(
        refunded.iter().all(|&n| n == 1),
        "refunds per order {refunded:?}"
    );
    assert!(
        ticks.len() as u64 >= run_for().as_secs() - 3,
        "ticks {ticks:?}"
    );
    assert!(
        ticks.iter().all(|&(_, n)| n == 1),
        "a tick ran twice: {ticks:?}"
    );
    let gaps: Vec<_> = ticks
        .windows(2)
        .filter(|w| w[1].0 - w[0].0 != 1_000)
        .collect();
    assert!(gaps.is_empty(), "ticks run by nobody: {gaps:?}");
    assert!(reads > 0 && torn == 0, "{torn} of {reads} reads torn");
    assert_eq!(total, 500, "a transfer was lost");
    assert!(max_exports <= 2, "{max_exports} exports at once");
    assert!(export_statuses.contains(&200) && export_statuses.contains(&409));
    assert!(
        cancelled_after < Duration::from_secs(2),
        "{cancelled_after:?}"
    );
    assert!(stray_timeouts.is_empty(), "{stray_timeouts:?}");
    assert!(held.is_empty(), "still held after SIGTERM: {held:?}");
}
