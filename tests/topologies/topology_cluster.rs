//! lockrt on a Redis Cluster of local `redis-server` processes: the behaviour every topology
//! must have (acquire/release, mutual exclusion, hand-off, renewals, fencing, loss, the
//! attribute), renewals of locks on several slots and masters from one locker (batched per
//! slot, never `CROSSSLOT`), scripts reloaded after `SCRIPT FLUSH` on every node, and the error
//! a standalone locker pointed at a cluster node gives. Failover and migration are in
//! `topology_cluster_faults.rs`.

use crate::support;

use std::collections::BTreeSet;

use lockrt::testing::{RedisCluster, slot_of};
use lockrt::{LockError, LockOptions, Locker, distributed_lock};
use support::topology::{Raw, Topo, figure, ms, ms_f};
use tokio::time::Instant;

async fn topo(cluster: &RedisCluster) -> Topo {
    let seeds = cluster.seed_urls();
    Topo {
        name: "cluster",
        raw: Raw::cluster(&seeds).await,
        builder: Box::new(move || Locker::builder().cluster(seeds.clone())),
    }
}

/// `count` user keys whose lock key (`lock:<key>`) master `master` serves, each in a slot of
/// its own.
fn keys_on(cluster: &RedisCluster, master: usize, stem: &str, count: usize) -> Vec<String> {
    let owner = cluster.nodes().expect("cluster view")[master].slots.clone();
    let mut slots = BTreeSet::new();
    (0..100_000)
        .map(|n| format!("{stem}{n}"))
        .filter(|k| {
            let slot = slot_of(format!("lock:{k}"));
            owner.iter().any(|r| r.contains(&slot)) && slots.insert(slot)
        })
        .take(count)
        .collect()
}

/// `INFO <section>` of node `index`.
async fn info(cluster: &RedisCluster, index: usize, section: &str) -> String {
    let mut c = cluster
        .client(index)
        .get_multiplexed_async_connection()
        .await
        .expect("node connection");
    redis::cmd("INFO")
        .arg(section)
        .query_async(&mut c)
        .await
        .expect("INFO")
}

/// A counter of an `INFO` line `<prefix>calls=N,...` or `<prefix>count=N`.
fn stat(text: &str, prefix: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|rest| rest.split(['=', ',']).nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[distributed_lock(key = "attr:{id}", locker = locker, ttl = "2s", wait = "2s")]
async fn attr_section(locker: &Locker, raw: &mut Raw, id: u32) -> Result<u64, LockError> {
    assert!(
        raw.lease_left(&format!("attr:{id}")).await.is_some(),
        "the body runs while the lock is held"
    );
    Ok(lockrt::current_lock().expect("inside a section").fence())
}

/// The attribute with a cluster locker, on keys of every master.
async fn attribute(cluster: &RedisCluster, t: &Topo) {
    let locker = t.locker().await;
    let mut raw = t.raw.clone();
    let ids: Vec<u32> = (0..3)
        .map(|m| {
            (0u32..)
                .find(|id| {
                    let slot = slot_of(format!("lock:attr:{id}"));
                    cluster.master_of_slot(slot).expect("slot owner") == m
                })
                .expect("an id on every master")
        })
        .collect();
    for &id in &ids {
        let first = attr_section(&locker, &mut raw, id).await.unwrap();
        let second = attr_section(&locker, &mut raw, id).await.unwrap();
        assert!(
            second > first,
            "cluster_attribute: fences {first}, {second}"
        );
        assert_eq!(raw.lease_left(&format!("attr:{id}")).await, None);
    }
    figure(
        "cluster_attribute",
        format!(
            "#[distributed_lock] with a cluster locker on keys of all 3 masters (ids {ids:?}): \
             body ran under the lock, fences increasing, keys gone after"
        ),
    );
}

/// Renewals of 4 locks on 3 masters (two on one master, in two slots) from one locker: each
/// script call stays in one slot (no `CROSSSLOT` anywhere), every master saw renewals.
async fn renewals_across_slots(cluster: &RedisCluster, t: &Topo) {
    let mut keys = keys_on(cluster, 0, "ren", 2);
    keys.extend(keys_on(cluster, 1, "ren", 1));
    keys.extend(keys_on(cluster, 2, "ren", 1));
    let mut before = Vec::new();
    for m in 0..3 {
        before.push(stat(
            &info(cluster, m, "commandstats").await,
            "cmdstat_evalsha:",
        ));
    }
    support::topology::renewals(t, &keys).await;
    let mut calls = Vec::new();
    let mut crossslot = 0;
    for (m, before) in before.iter().enumerate() {
        calls.push(stat(&info(cluster, m, "commandstats").await, "cmdstat_evalsha:") - before);
        crossslot += stat(
            &info(cluster, m, "errorstats").await,
            "errorstat_CROSSSLOT:",
        );
    }
    let slots: BTreeSet<u16> = keys.iter().map(|k| slot_of(format!("lock:{k}"))).collect();
    figure(
        "cluster_renewals_across_slots",
        format!(
            "{} locks in {} slots on 3 masters, ttl 300 ms, held 1.2 s: script calls per master \
             {calls:?} (acquire + renewals + release), CROSSSLOT errors {crossslot}",
            keys.len(),
            slots.len()
        ),
    );
    assert_eq!(slots.len(), keys.len());
    assert_eq!(crossslot, 0, "a script call spanned slots");
    // Per master: one acquire and one release per lock plus at least 3 renewal rounds.
    assert!(
        calls[0] >= 2 * 2 + 3 && calls[1] >= 2 + 3 && calls[2] >= 2 + 3,
        "{calls:?}"
    );
}

/// Acquires and releases a key of each master in `masters`.
async fn lock_once_on(locker: &Locker, cluster: &RedisCluster, masters: std::ops::Range<usize>) {
    for m in masters {
        let k = &keys_on(cluster, m, "flush", 1)[0];
        locker
            .acquire(k, LockOptions::new())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
}

/// `SCRIPT FLUSH` on every node: the next acquire and release on each master still work
/// (EVALSHA's NOSCRIPT answered by EVAL on the same node), and no script went to a master
/// that did not need it.
async fn noscript_after_flush(cluster: &RedisCluster, t: &Topo) {
    let locker = t.locker().await;
    // Warm: the scripts are cached everywhere they ran.
    lock_once_on(&locker, cluster, 0..3).await;
    for m in 0..cluster.len() {
        let mut c = cluster
            .client(m)
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let evals = async |m| stat(&info(cluster, m, "commandstats").await, "cmdstat_eval:");
    let mut before = Vec::new();
    for m in 0..3 {
        before.push(evals(m).await);
    }
    let k = &keys_on(cluster, 0, "flush", 1)[0];
    let start = Instant::now();
    let g = locker
        .acquire(k, LockOptions::new())
        .await
        .expect("acquire after SCRIPT FLUSH");
    let first = start.elapsed();
    g.release().await.expect("release after SCRIPT FLUSH");
    let loaded: Vec<u64> = {
        let mut v = Vec::new();
        for (m, before) in before.iter().enumerate() {
            v.push(evals(m).await - before);
        }
        v
    };
    lock_once_on(&locker, cluster, 1..3).await;
    figure(
        "cluster_noscript_after_flush",
        format!(
            "SCRIPT FLUSH on every node: first acquire {} later, EVAL fallbacks on the 3 \
             masters {loaded:?} (acquire and release on master 0 only); acquire + release on \
             the other masters Ok",
            ms_f(first)
        ),
    );
    assert_eq!(
        loaded,
        [2, 0, 0],
        "scripts loaded where they were not needed"
    );
}

/// A standalone locker pointed at one node: a key of another node's slot fails at once with
/// the advice to use the cluster topology.
async fn standalone_locker_on_cluster_node(cluster: &RedisCluster) {
    let locker = Locker::connect(&cluster.url(0))
        .await
        .expect("a node answers");
    let k = &keys_on(cluster, 1, "moved", 1)[0];
    let start = Instant::now();
    let err = locker
        .acquire(k, LockOptions::new().wait(ms(2_000)))
        .await
        .expect_err("a key of another slot");
    let took = start.elapsed();
    let text = err.to_string();
    figure(
        "cluster_standalone_locker_on_cluster_node",
        format!("failed after {}: {text}", ms_f(took)),
    );
    assert!(
        text.contains("Redis Cluster node") && text.contains(".cluster("),
        "{text}"
    );
    match &err {
        LockError::Backend(b) => assert!(!b.is_transient(), "MOVED is not transient"),
        other => panic!("{other:?}"),
    }
    assert!(
        took < ms(500),
        "a MOVED is not retried for the whole wait: {took:?}"
    );
}

/// `redis+cluster://host:port,host:port/` builds the same cluster locker as `.cluster(..)`.
async fn url_scheme(cluster: &RedisCluster) {
    let hosts: Vec<String> = (0..2)
        .map(|i| format!("127.0.0.1:{}", cluster.port(i)))
        .collect();
    let url = format!("redis+cluster://{}/", hosts.join(","));
    let locker = Locker::builder()
        .url(&url)
        .build()
        .await
        .expect("redis+cluster:// URL");
    // Keys of every master, through seeds of two of them.
    for m in 0..3 {
        let k = &keys_on(cluster, m, "url", 1)[0];
        locker
            .acquire(k, LockOptions::new())
            .await
            .unwrap_or_else(|e| panic!("cluster_url_scheme: {e}"))
            .release()
            .await
            .unwrap();
    }
    figure(
        "cluster_url_scheme",
        format!("{url}: acquire + release of keys on all 3 masters Ok"),
    );
}

/// Every behaviour case on one 3-master cluster, one after the other (a cluster takes about
/// 2 s to start; the cases use keys of their own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_behaviour_suite() {
    let started = Instant::now();
    let cluster = RedisCluster::start(3, 0).expect("start a 3-master cluster");
    figure(
        "cluster_start",
        format!("3 masters ready in {}", ms_f(started.elapsed())),
    );
    let t = topo(&cluster).await;
    support::topology::acquire_release(&t).await;
    support::topology::mutual_exclusion(&t).await;
    support::topology::hand_off(&t, 10).await;
    renewals_across_slots(&cluster, &t).await;
    support::topology::fencing(&t).await;
    support::topology::loss_detection(&t).await;
    attribute(&cluster, &t).await;
    noscript_after_flush(&cluster, &t).await;
    standalone_locker_on_cluster_node(&cluster).await;
    url_scheme(&cluster).await;
}
