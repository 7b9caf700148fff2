//! A server whose `maxmemory-policy` can evict keys can drop a held lock (two holders at once),
//! so `build()` refuses it: on a standalone server, on the master a Sentinel names and on any
//! master of a Cluster, with an error naming the server, the policy, the risk and the fix.
//! `allow_eviction(true)` builds anyway with one WARN; `noeviction` builds; a server that
//! refuses `INFO` is not refused for it (logged at INFO). `Locker::in_memory()` has no server
//! and is not affected.

#[path = "support/logs.rs"]
mod logs;

use std::time::Duration;

use lockrt::testing::{RedisCluster, RedisSentinelGroup, RedisServer};
use lockrt::{LockError, LockOptions, Locker, LockerBuilder};

fn server(policy: &str) -> RedisServer {
    RedisServer::start_with(&["--maxmemory-policy", policy]).expect("start redis-server")
}

fn builder(url: &str) -> LockerBuilder {
    Locker::builder()
        .url(url)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
}

/// The build error, which must be a permanent backend error.
async fn refused(b: LockerBuilder) -> String {
    let err = b
        .build()
        .await
        .expect_err("an evicting server must be refused");
    let LockError::Backend(e) = &err else {
        panic!("expected a Backend error, got {err:?}");
    };
    assert!(!e.is_transient(), "retrying cannot help: {err}");
    err.to_string()
}

/// The refusal says where, what, why and how to fix it.
fn assert_explains(msg: &str, addr: &str, policy: &str) {
    for part in [
        addr,
        &format!("maxmemory-policy {policy}"),
        "two holders",
        "maxmemory-policy noeviction",
        "allow_eviction(true)",
    ] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
}

async fn lock_works(locker: &Locker) {
    let guard = locker
        .acquire(
            "eviction:k",
            LockOptions::new().wait(Duration::from_secs(1)),
        )
        .await
        .expect("acquire");
    assert!(guard.fence() > 0);
    guard.release().await.expect("release");
}

#[tokio::test]
async fn allkeys_lru_server_is_refused_naming_the_policy() {
    let s = server("allkeys-lru");
    let msg = refused(builder(&s.url())).await;
    assert_explains(&msg, &format!("127.0.0.1:{}", s.port()), "allkeys-lru");
    println!("{msg}");
}

#[tokio::test]
async fn volatile_ttl_server_is_refused() {
    // Every held lock has a TTL, so volatile-* policies evict locks too.
    let s = server("volatile-ttl");
    let msg = refused(builder(&s.url())).await;
    assert_explains(&msg, &format!("127.0.0.1:{}", s.port()), "volatile-ttl");
}

#[tokio::test]
async fn a_policy_set_at_runtime_is_the_one_checked() {
    let s = server("noeviction");
    let mut admin = s.client().get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lfu")
        .query_async(&mut admin)
        .await
        .unwrap();
    let msg = refused(builder(&s.url())).await;
    assert_explains(&msg, &format!("127.0.0.1:{}", s.port()), "volatile-lfu");
}

#[tokio::test]
async fn noeviction_server_builds() {
    let s = server("noeviction");
    lock_works(&builder(&s.url()).build().await.expect("noeviction is safe")).await;
    // The default policy of a server started without one is noeviction too.
    let plain = RedisServer::start().unwrap();
    lock_works(&builder(&plain.url()).build().await.expect("default")).await;
    // Locker::connect goes through the same build.
    lock_works(&Locker::connect(&plain.url()).await.expect("connect")).await;
}

#[test]
fn allow_eviction_builds_on_allkeys_lru_with_one_warn_naming_the_policy() {
    let s = server("allkeys-lru");
    let url = s.url();
    let logs = logs::logged(async || {
        let locker = builder(&url)
            .allow_eviction(true)
            .build()
            .await
            .expect("allow_eviction(true) accepts the risk");
        lock_works(&locker).await;
        // allow_eviction(false) is the default: refused again.
        let msg = refused(builder(&url).allow_eviction(true).allow_eviction(false)).await;
        assert!(msg.contains("allkeys-lru"), "{msg}");
    });
    let warns: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("maxmemory-policy"))
        .collect();
    assert_eq!(
        warns.len(),
        1,
        "one WARN for the allowed build, got:\n{logs}"
    );
    assert!(
        warns[0].contains("allkeys-lru") && warns[0].contains(&format!("127.0.0.1:{}", s.port())),
        "{}",
        warns[0]
    );
}

#[test]
fn a_server_refusing_info_is_not_refused_and_the_skip_is_logged() {
    // As a proxy that does not know INFO: the policy cannot be read, so it is not judged.
    let s = RedisServer::start_with(&[
        "--maxmemory-policy",
        "allkeys-lru",
        "--rename-command",
        "INFO",
        "",
    ])
    .expect("start redis-server without INFO");
    let url = s.url();
    let logs = logs::logged(async || {
        let locker = builder(&url)
            .build()
            .await
            .expect("INFO refused: not judged");
        lock_works(&locker).await;
    });
    assert!(
        logs.lines()
            .any(|l| l.contains("INFO") && l.contains("maxmemory-policy not checked")),
        "the skipped check is logged:\n{logs}"
    );
    assert!(!logs.contains("WARN"), "{logs}");
}

#[tokio::test]
async fn an_acl_user_without_info_builds_on_a_noperm() {
    let s = server("allkeys-lru");
    let mut admin = s.client().get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locks")
        .arg("on")
        .arg(">pw")
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg("-info")
        .query_async(&mut admin)
        .await
        .unwrap();
    let url = format!("redis://locks:pw@127.0.0.1:{}/", s.port());
    lock_works(
        &builder(&url)
            .build()
            .await
            .expect("NOPERM on INFO: not judged"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_with_volatile_lru_is_refused_naming_the_master() {
    let group = RedisSentinelGroup::start_with_server_args(
        "locks",
        1,
        &["--maxmemory-policy", "volatile-lru"],
    )
    .expect("start master, replica and sentinel");
    let master = group.master_port().unwrap();
    let b = || {
        Locker::builder()
            .sentinel(group.sentinel_urls(), "locks")
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
    };
    let msg = refused(b()).await;
    assert_explains(&msg, &format!("127.0.0.1:{master}"), "volatile-lru");
    assert!(msg.contains("the master of sentinel service"), "{msg}");
    lock_works(&b().allow_eviction(true).build().await.expect("allowed")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_with_one_evicting_master_is_refused_naming_that_master() {
    let cluster = RedisCluster::start(3, 0).expect("start a 3-master cluster");
    let set_policy = async |node: usize, policy: &str| {
        let mut c = cluster
            .client(node)
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory-policy")
            .arg(policy)
            .query_async(&mut c)
            .await
            .unwrap();
    };
    let b = || {
        Locker::builder()
            .cluster(cluster.seed_urls())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
    };
    lock_works(&b().build().await.expect("every master noeviction")).await;

    // Only the last master evicts, and the first seed is another one: every master is read.
    set_policy(2, "allkeys-random").await;
    let msg = refused(b()).await;
    assert_explains(
        &msg,
        &format!("127.0.0.1:{}", cluster.port(2)),
        "allkeys-random",
    );
    assert!(msg.contains("cluster master"), "{msg}");

    set_policy(1, "volatile-ttl").await;
    let msg = refused(b()).await;
    assert!(
        msg.contains("allkeys-random") && msg.contains("volatile-ttl"),
        "both evicting masters named: {msg}"
    );
    lock_works(&b().allow_eviction(true).build().await.expect("allowed")).await;
}

#[tokio::test]
async fn in_memory_lockers_are_not_affected() {
    for locker in [
        Locker::in_memory(),
        Locker::in_memory_with(Locker::builder().allow_eviction(false)),
        Locker::in_memory_with(Locker::builder().allow_eviction(true)),
    ] {
        lock_works(&locker).await;
    }
}
