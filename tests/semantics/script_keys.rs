//! Every key a script touches is one it declared in `KEYS`, and every channel it publishes on
//! hashes to its own slot (Dragonfly refuses undeclared keys; Alibaba's proxy and Upstash
//! want them declared; ElastiCache Serverless treats `PUBLISH` in a script as `SPUBLISH`).
//! Checked on what the scripts really did: `MONITOR` records each script call and the
//! commands it ran, and the server's own `COMMAND GETKEYS` names their keys.

use crate::support;

use std::collections::BTreeMap;

use futures_util::StreamExt;
use lockrt::testing::{RedisCluster, RedisServer, slot_of};
use lockrt::{LockOptions, Locker};
use support::topology::Raw;
use support::{ms, opts};

/// The quoted arguments of a `MONITOR` line, and whether the script engine ran it.
fn parse(line: &str) -> Option<(bool, Vec<String>)> {
    let close = line.find("] ")?;
    let lua = line[..close].ends_with("lua");
    let mut args = Vec::new();
    let mut chars = line[close + 2..].chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(u8::from_str_radix(&hex, 16).map_or('?', char::from));
                    }
                    Some('n') => arg.push('\n'),
                    Some('r') => arg.push('\r'),
                    Some('t') => arg.push('\t'),
                    Some(other) => arg.push(other),
                    None => break,
                },
                c => arg.push(c),
            }
        }
        args.push(arg);
    }
    Some((lua, args))
}

/// Every path of every script, on two lockers.
async fn workload(a: &Locker, b: &Locker, raw: &mut Raw) {
    // Exclusive: a queued waiter handed the lock, a waiter that gives up, min_hold, renewals.
    let g = a.acquire("x", opts().ttl(ms(300))).await.unwrap();
    assert!(b.try_acquire("x", opts()).await.unwrap().is_none());
    let gave_up = b.acquire("x", opts().wait(ms(150))).await;
    assert!(gave_up.is_err());
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.acquire("x", opts().wait(ms(5_000))).await.map(drop) }
    });
    raw.until_queued("x", 1).await;
    tokio::time::sleep(ms(250)).await; // a renewal
    g.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let kept = a.acquire("kept", opts().min_hold(ms(100))).await.unwrap();
    kept.release().await.unwrap();

    // Read-write, with a writer queued behind readers and shares renewed.
    let short = opts().ttl(ms(300));
    let (r1, r2) = (
        a.acquire("rw", short.read()).await.unwrap(),
        b.acquire("rw", short.read()).await.unwrap(),
    );
    let writer = tokio::spawn({
        let b = b.clone();
        async move {
            b.acquire("rw", opts().write().wait(ms(5_000)))
                .await
                .map(drop)
        }
    });
    raw.until_queued("rw", 1).await;
    tokio::time::sleep(ms(250)).await;
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    writer.await.unwrap().unwrap();

    // A semaphore, several keys at once, inspection, forced unlocks of a lock and of readers.
    let sem = opts().permits(2);
    let (p1, p2) = (
        a.acquire("sem", sem).await.unwrap(),
        b.acquire("sem", sem).await.unwrap(),
    );
    let third = tokio::spawn({
        let b = b.clone();
        async move { b.acquire("sem", sem.wait(ms(5_000))).await.map(drop) }
    });
    raw.until_queued("sem", 1).await;
    p1.release().await.unwrap();
    third.await.unwrap().unwrap();
    p2.release().await.unwrap();
    drop(
        a.acquire_all(["m:1", "m:2"], LockOptions::new())
            .await
            .unwrap(),
    );
    let held = b.acquire("forced", opts()).await.unwrap();
    assert!(a.lock_info("forced").await.unwrap().is_some());
    assert!(a.force_unlock("forced").await.unwrap());
    drop(held);
    let reader = b.acquire("forced:r", opts().read()).await.unwrap();
    assert!(a.force_unlock("forced:r").await.unwrap());
    drop(reader);
}

/// `MONITOR`s node `client` from its "start-of-workload" marker (reported on `ready`) until
/// its "end-of-workload" one: every line.
fn monitor(
    client: redis::Client,
    ready: tokio::sync::oneshot::Sender<()>,
) -> tokio::task::JoinHandle<Vec<String>> {
    tokio::spawn(async move {
        let monitor = client.get_async_monitor().await.unwrap();
        let mut stream = monitor.into_on_message::<String>();
        let mut ready = Some(ready);
        let mut lines = Vec::new();
        while let Some(line) = stream.next().await {
            if line.contains("\"start-of-workload\"") {
                ready.take().map(|r| r.send(()));
            }
            let end = line.contains("\"end-of-workload\"");
            lines.push(line);
            if end {
                break;
            }
        }
        lines
    })
}

/// `ECHO marker` on node `node`.
async fn mark(node: &redis::Client, marker: &str) {
    let mut conn = node.get_multiplexed_async_connection().await.unwrap();
    let _: String = redis::cmd("ECHO")
        .arg(marker)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// The workload on two lockers of `builder`, with every node in `nodes` monitored; the
/// lines each node saw.
async fn recorded(
    nodes: &[redis::Client],
    builder: impl Fn() -> lockrt::LockerBuilder,
    mut raw: Raw,
) -> Vec<Vec<String>> {
    let mut monitors = Vec::new();
    for node in nodes {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        monitors.push(monitor(node.clone(), tx));
        // Sent until the monitor sees one: it may not be listening yet.
        let mut listening = false;
        for _ in 0..100 {
            mark(node, "start-of-workload").await;
            if tokio::time::timeout(ms(50), &mut rx).await.is_ok() {
                listening = true;
                break;
            }
        }
        assert!(listening, "MONITOR never saw its start marker");
    }
    let (a, b) = (
        builder().build().await.unwrap(),
        builder().build().await.unwrap(),
    );
    workload(&a, &b, &mut raw).await;
    let mut out = Vec::new();
    for (node, monitor) in nodes.iter().zip(monitors) {
        mark(node, "end-of-workload").await;
        out.push(
            tokio::time::timeout(ms(5_000), monitor)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    out
}

/// What the scripts did, as `MONITOR` recorded it.
#[derive(Default)]
struct Findings {
    scripts: usize,
    checked: usize,
    inner: BTreeMap<String, usize>,
    problems: Vec<String>,
    /// Forced-unlock messages, and those on a channel outside the script's slot.
    revokes: usize,
    revokes_elsewhere: usize,
}

/// Checks one node's lines: each key a script touched was declared, each channel it
/// published on is in its first key's slot (revoke channels counted apart).
async fn check(lines: &[String], node: &redis::Client, found: &mut Findings) {
    let mut conn = node.get_multiplexed_async_connection().await.unwrap();
    let mut declared: Vec<String> = Vec::new();
    let mut in_script = false;
    for line in lines {
        let Some((lua, args)) = parse(line) else {
            continue;
        };
        let Some(name) = args.first().map(|a| a.to_ascii_uppercase()) else {
            continue;
        };
        if !lua {
            in_script = name == "EVALSHA" || name == "EVAL";
            if in_script {
                let n: usize = args[2].parse().unwrap();
                declared = args[3..3 + n].to_vec();
                found.scripts += 1;
            }
            continue;
        }
        assert!(in_script, "a script command outside a script call: {line}");
        *found.inner.entry(name.clone()).or_default() += 1;
        if name == "PUBLISH" || name == "SPUBLISH" {
            let channel = &args[1];
            let elsewhere = slot_of(channel) != slot_of(&declared[0]);
            if channel.contains("revoke") {
                found.revokes += 1;
                found.revokes_elsewhere += usize::from(elsewhere);
            } else if elsewhere {
                found.problems.push(format!(
                    "{channel} is not in the slot of {}: {line}",
                    declared[0]
                ));
            }
            continue;
        }
        let mut getkeys = redis::cmd("COMMAND");
        getkeys.arg("GETKEYS").arg(&args);
        let keys: Vec<String> = getkeys.query_async(&mut conn).await.unwrap_or_default();
        for key in keys {
            found.checked += 1;
            if !declared.contains(&key) {
                found
                    .problems
                    .push(format!("{key} not declared ({declared:?}): {line}"));
            }
        }
    }
}

/// The checks every topology passes; `publish`: the command the scripts publish with.
fn assert_clean(found: &Findings, publish: &str) {
    let Findings {
        scripts,
        checked,
        inner,
        problems,
        revokes,
        revokes_elsewhere,
    } = found;
    println!(
        "FIGURE {scripts} script calls, {checked} keys checked, inner commands {inner:?}, \
         {revokes} revocations ({revokes_elsewhere} outside the lock's slot)"
    );
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(
        *scripts > 40,
        "the workload ran only {scripts} script calls"
    );
    assert!(*checked > 200, "only {checked} keys were checked");
    assert!(*revokes > 0, "no forced unlock was published");
    for cmd in ["HSET", "ZADD", publish, "PTTL", "SET", "DEL", "HMGET"] {
        assert!(inner.contains_key(cmd), "no {cmd} seen: {inner:?}");
    }
    // Each command the scripts ran is one the documented ACL rules grant (README, Topologies;
    // `ACL_HINT`; tests/topology_acl.rs grants exactly those).
    let granted = "get set del exists pexpire pexpireat pttl hget hmget hset hdel hexists \
                   hincrby hlen hgetall zadd zcard zrange zrangebyscore zrem zscore publish \
                   spublish";
    for cmd in inner.keys() {
        let cmd = cmd.to_ascii_lowercase();
        assert!(
            granted.split_whitespace().any(|g| g == cmd),
            "{cmd} is not in the ACL rules"
        );
    }
}

/// One server: `PUBLISH`, and the revoke channel is the prefix's `{lock:}:revoke` (one
/// server has no slots to respect; a cluster's is below).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_touch_only_declared_keys_and_publish_in_their_slot() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let raw = Raw::single(&url).await;
    let nodes = [server.client()];
    let lines = recorded(&nodes, || Locker::builder().url(url.clone()), raw).await;
    let mut found = Findings::default();
    check(&lines[0], &nodes[0], &mut found).await;
    assert_clean(&found, "PUBLISH");
    assert_eq!(
        found.revokes, found.revokes_elsewhere,
        "{{lock:}}:revoke on one server"
    );
}

/// A Redis Cluster of 7.0+: `SPUBLISH` only, every channel in the script's own slot, the
/// revoke channel too (what services that treat `PUBLISH` in a script as `SPUBLISH` need).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_every_channel_is_in_the_scripts_slot() {
    let cluster = RedisCluster::start(3, 0).expect("start 3 masters");
    let seeds = cluster.seed_urls();
    let raw = Raw::cluster(&seeds).await;
    let nodes: Vec<redis::Client> = (0..3).map(|i| cluster.client(i)).collect();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut nodes[0].get_multiplexed_async_connection().await.unwrap())
        .await
        .unwrap();
    let sharded = !info.contains("redis_version:6.");
    let lines = recorded(&nodes, || Locker::builder().cluster(seeds.clone()), raw).await;
    let mut found = Findings::default();
    for (node, lines) in nodes.iter().zip(&lines) {
        check(lines, node, &mut found).await;
    }
    if !sharded {
        // Before 7.0: broadcast `PUBLISH`, whose channel may be anywhere.
        assert_clean(&found, "PUBLISH");
        return;
    }
    assert_clean(&found, "SPUBLISH");
    assert!(!found.inner.contains_key("PUBLISH"), "{:?}", found.inner);
    assert_eq!(
        found.revokes_elsewhere, 0,
        "a revoke channel outside the lock's slot"
    );
}
