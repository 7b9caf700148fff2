//! Latency on a 3-master Redis Cluster (sharded pub/sub, and broadcast `PUBLISH`) next to a
//! standalone server, for BENCHMARKS.md: the
//! uncontended acquire + release pair and the hand-off (release call to the queued waiter in
//! another locker holding the lock). A measurement, not a check: run it in release,
//!
//! ```sh
//! cargo test --release --test topologies topology_bench:: -- --ignored --nocapture
//! ```
//!
//! and it prints a markdown table (`BENCH_PAIRS`, `BENCH_HANDOFFS` change the sizes).

use crate::support;

use std::time::Duration;

use lockrt::testing::{RedisCluster, RedisServer};
use lockrt::{LockOptions, Locker, LockerBuilder};
use support::topology::{Raw, ms};
use tokio::time::Instant;

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

/// `pairs` acquire + release pairs on distinct keys (spread over all slots), one at a time.
async fn uncontended(locker: &Locker, pairs: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(pairs);
    for i in 0..pairs + pairs / 10 {
        let key = format!("bench:{i}");
        let start = Instant::now();
        let g = locker.acquire(&key, LockOptions::new()).await.unwrap();
        g.release().await.unwrap();
        // The first tenth warms connections and script caches.
        if i >= pairs / 10 {
            times.push(start.elapsed());
        }
    }
    times
}

/// `rounds` hand-offs of one key from a holder to a queued waiter in another locker.
async fn hand_offs(a: &Locker, b: &Locker, raw: &mut Raw, rounds: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(rounds);
    for i in 0..rounds + 2 {
        let guard = a
            .acquire("bench:handoff", LockOptions::new())
            .await
            .unwrap();
        let w = {
            let b = b.clone();
            tokio::spawn(async move {
                let g = b
                    .acquire("bench:handoff", LockOptions::new().wait(ms(5_000)))
                    .await
                    .unwrap();
                (Instant::now(), g)
            })
        };
        raw.until_queued("bench:handoff", 1).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (got, g) = w.await.unwrap();
        g.release().await.unwrap();
        if i >= 2 {
            times.push(got - released);
        }
    }
    times
}

struct Row {
    topology: &'static str,
    pair: (Duration, Duration),
    handoff: (Duration, Duration),
}

async fn measure(topology: &'static str, builder: impl Fn() -> LockerBuilder, mut raw: Raw) -> Row {
    let (pairs, rounds) = (size("BENCH_PAIRS", 2_000), size("BENCH_HANDOFFS", 50));
    let a = builder().build().await.unwrap();
    let b = builder().build().await.unwrap();
    let mut pair = uncontended(&a, pairs).await;
    let mut handoff = hand_offs(&a, &b, &mut raw, rounds).await;
    Row {
        topology,
        pair: (percentile(&mut pair, 0.5), percentile(&mut pair, 0.99)),
        handoff: (
            percentile(&mut handoff, 0.5),
            percentile(&mut handoff, 0.99),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement for BENCHMARKS.md: run in release with --ignored --nocapture"]
async fn bench_cluster_next_to_standalone() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let standalone = measure(
        "standalone",
        || Locker::builder().url(url.clone()),
        Raw::single(&server.url()).await,
    )
    .await;
    drop(server);
    let cluster = RedisCluster::start(3, 0).unwrap();
    let seeds = cluster.seed_urls();
    let clustered = measure(
        "cluster, 3 masters, sharded pub/sub",
        || Locker::builder().cluster(seeds.clone()),
        Raw::cluster(&cluster.seed_urls()).await,
    )
    .await;
    let broadcast = measure(
        "cluster, 3 masters, broadcast PUBLISH",
        || {
            Locker::builder()
                .cluster(seeds.clone())
                .sharded_pubsub(false)
        },
        Raw::cluster(&cluster.seed_urls()).await,
    )
    .await;
    println!(
        "\n| topology | acquire + release p50 | p99 | hand-off p50 | p99 |\n|---|---:|---:|---:|---:|"
    );
    for r in [standalone, clustered, broadcast] {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.topology,
            us(r.pair.0),
            us(r.pair.1),
            us(r.handoff.0),
            us(r.handoff.1)
        );
    }
}
