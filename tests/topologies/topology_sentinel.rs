//! lockrt through Redis Sentinel (one master, one replica, one sentinel, all local processes):
//! the behaviour every topology must have, a `SENTINEL FAILOVER` with a holder and a waiter
//! (locks usable on the new master right after the switch), and `sync_replicas`: no lock counts
//! unless a replica acknowledged it, also on a demoted master that still takes writes.

use crate::support;

use lockrt::testing::RedisSentinelGroup;
use lockrt::{LockError, LockOptions, Locker, distributed_lock};
use support::topology::{Raw, Topo, figure, ms, ms_f, within};
use tokio::time::Instant;

const SERVICE: &str = "locks";

fn group() -> RedisSentinelGroup {
    RedisSentinelGroup::start(SERVICE, 1).expect("start master, replica and sentinel")
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

fn sentinel_builder(group: &RedisSentinelGroup) -> lockrt::LockerBuilder {
    Locker::builder().sentinel(group.sentinel_urls(), SERVICE)
}

async fn topo(group: &RedisSentinelGroup) -> Topo {
    let sentinels = group.sentinel_urls();
    Topo {
        name: "sentinel",
        raw: Raw::single(&url(group.master_port().unwrap())).await,
        builder: Box::new(move || Locker::builder().sentinel(sentinels.clone(), SERVICE)),
    }
}

/// Whether the server on `port` holds the lock `key`.
async fn holds(port: u16, key: &str) -> bool {
    Raw::single(&url(port))
        .await
        .lease_left(key)
        .await
        .is_some()
}

/// `ROLE` of the server on `port`: `master` or `slave`.
async fn role(port: u16) -> String {
    let mut raw = Raw::single(&url(port)).await;
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut raw).await.unwrap();
    match &role[0] {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => format!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_acquire_release() {
    let g = group();
    support::topology::acquire_release(&topo(&g).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_mutual_exclusion() {
    let g = group();
    support::topology::mutual_exclusion(&topo(&g).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_hand_off() {
    let g = group();
    support::topology::hand_off(&topo(&g).await, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_renewals() {
    let g = group();
    let keys: Vec<String> = (0..4).map(|i| format!("ren{i}")).collect();
    support::topology::renewals(&topo(&g).await, &keys).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_fencing() {
    let g = group();
    support::topology::fencing(&topo(&g).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_loss_detection() {
    let g = group();
    support::topology::loss_detection(&topo(&g).await).await;
}

/// `redis+sentinel://host:port/<service>` builds the same locker as `.sentinel(..)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_url_scheme() {
    let g = group();
    let url = format!(
        "redis+sentinel://127.0.0.1:{}/{SERVICE}",
        g.sentinel_ports()[0]
    );
    let locker = Locker::builder()
        .url(&url)
        .build()
        .await
        .expect("redis+sentinel:// URL");
    let guard = locker.acquire("url", LockOptions::new()).await.unwrap();
    assert!(
        holds(g.master_port().unwrap(), "url").await,
        "not on the master"
    );
    guard.release().await.unwrap();
    figure(
        "sentinel_url_scheme",
        format!("{url}: acquire on the master, release: Ok"),
    );
}

#[distributed_lock(key = "attr:{id}", locker = locker, ttl = "2s", wait = "2s")]
async fn attr_section(locker: &Locker, raw: &mut Raw, id: u32) -> Result<u64, LockError> {
    assert!(raw.lease_left(&format!("attr:{id}")).await.is_some());
    Ok(lockrt::current_lock().expect("inside a section").fence())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_attribute() {
    let g = group();
    let t = topo(&g).await;
    let locker = t.locker().await;
    let mut raw = t.raw.clone();
    let first = attr_section(&locker, &mut raw, 7).await.unwrap();
    let second = attr_section(&locker, &mut raw, 7).await.unwrap();
    assert!(second > first);
    assert_eq!(raw.lease_left("attr:7").await, None);
    figure(
        "sentinel_attribute",
        "#[distributed_lock] with a Sentinel locker: body ran under the lock, fences increasing, \
         key gone after",
    );
}

/// `SENTINEL FAILOVER` while a lock is held and another locker waits for it: from the moment
/// the sentinel names the new master, a fresh acquire lands there within 2 s (the locker follows
/// `+switch-master` instead of writing to the demoted master, which still takes writes for
/// about 10 s); the holder's renewals move with it; the waiter is woken when the holder
/// releases on the new master.
// In the chaos tier: whether the holder keeps its lock depends on how long Sentinel takes from
// promoting the replica to announcing it (renewals in between reach only the old master), which
// a loaded machine stretches past the lease margin (seen once in a loaded CI run). That window
// is the documented limit of asynchronous replication; `sync_replicas` closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "chaos: timing-dependent Sentinel failover; run with cargo xtask chaos"]
async fn chaos_sentinel_failover_locks_usable_on_new_master_within_2s() {
    let g = group();
    let old = g.master_port().unwrap();
    let (holder, waiter) = (
        sentinel_builder(&g).build().await.unwrap(),
        sentinel_builder(&g).build().await.unwrap(),
    );
    // Sentinel promotes the replica about a second before it announces the switch; renewals
    // in between land on the old master only, so the new master's copy of the lock expires a
    // lease after the last renewal before the promotion. The holder's next renewal (a third of
    // the lease after the switch at the latest) must come before that: ttl 6 s leaves a
    // margin of about a second. (A shorter lease can expire there first and be taken by the
    // waiter while the holder still counts on its last renewal on the old master: the
    // asynchronous-replication window `sync_replicas` exists for.)
    let ttl = ms(6_000);
    let guard = holder
        .acquire("held", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let w = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let g = waiter
                .acquire("held", LockOptions::new().wait(ms(20_000)))
                .await;
            (Instant::now(), g)
        })
    };
    Raw::single(&url(old)).await.until_queued("held", 1).await;
    // The failover promotes the replica at once: a write it has not applied yet is lost
    // with the old master (the asynchronous-replication window, which `sync_replicas`
    // closes; `split_brain_stale_master_grants_no_acknowledged_lock`). This case is about
    // what follows a failover, so it starts once the replica has the lock and the queue.
    let mut replica = Raw::single(&url(g.replica_ports().unwrap()[0])).await;
    let replicated = within(ms(3_000), async || {
        let v: Option<String> = redis::cmd("GET")
            .arg("lock:held")
            .query_async(&mut replica)
            .await
            .unwrap();
        v.is_some_and(|v| support::holder_fence_of_value(&v) == guard.fence())
            && replica.queued("held").await == 1
    })
    .await;
    assert!(replicated.is_some(), "the replica never had the lock");

    let took = tokio::task::block_in_place(|| g.failover()).expect("SENTINEL FAILOVER");
    let switched = Instant::now();
    let new = g.master_port().unwrap();
    assert_ne!(new, old);
    // Fresh keys, back to back, until one is held on the new master.
    let mut n = 0;
    let mut on_old = 0;
    let landed = loop {
        n += 1;
        let key = format!("after{n}");
        if let Ok(lock) = holder.acquire(&key, LockOptions::new().wait(ms(100))).await {
            if holds(new, &key).await {
                break switched.elapsed();
            }
            on_old += 1;
            drop(lock);
        }
        assert!(
            switched.elapsed() < ms(10_000),
            "never reached the new master"
        );
    };
    let old_role = role(old).await;
    // The holder's renewals move to the new master: its lease there is refreshed.
    let mut on_new = Raw::single(&url(new)).await;
    let fence = guard.fence();
    let renewed = within(ttl, async || {
        let value: Option<String> = redis::cmd("GET")
            .arg("lock:held")
            .query_async(&mut on_new)
            .await
            .unwrap();
        let ours = value.is_some_and(|v| support::holder_fence_of_value(&v) == fence);
        ours && on_new
            .lease_left("held")
            .await
            .is_some_and(|p| p > ttl - ms(300))
    })
    .await;
    assert!(!guard.is_lost(), "the holder lost its lock in the failover");
    let renewed = renewed.expect("renewals did not move to the new master");
    if w.is_finished() {
        let (_, res) = w.await.unwrap();
        panic!("the waiter's acquire ended while the holder held the lock: {res:?}");
    }
    let released = Instant::now();
    guard.release().await.expect("release on the new master");
    let (got, lock) = w.await.unwrap();
    lock.expect("the waiter is served")
        .release()
        .await
        .expect("release by the waiter");
    let handoff = got - released;
    figure(
        "chaos_sentinel_failover_locks_usable_on_new_master_within_2s",
        format!(
            "SENTINEL FAILOVER took {} until the sentinel named the new master; a fresh lock \
             held on the new master {} after that ({on_old} landed on the old master first, \
             which was still a {old_role}); the holder (ttl 6 s) kept its lock, its renewal \
             seen on the new master {} after the switch; queued waiter served {} after the \
             release",
            ms_f(took),
            ms_f(landed),
            ms_f(landed + renewed),
            ms_f(handoff)
        ),
    );
    assert!(
        landed < ms(2_000),
        "locks on the new master after {landed:?}"
    );
    assert!(
        handoff < ms(500),
        "waiter woken by the fallback timer: {handoff:?}"
    );
}

/// With `sync_replicas(1, 300 ms)` and the only replica frozen, `WAIT` returns 0: an acquire
/// fails with a retryable error that says so and leaves no lock (nor queue place), and a
/// held lock whose renewals are not acknowledged is declared lost before its lease ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_replicas_refuses_unacknowledged_writes() {
    let g = group();
    let master = g.master_port().unwrap();
    let replica = g.replica_ports().unwrap()[0];
    // A `WAIT` answers as soon as the replica acknowledges; 300 ms only bounds a frozen one.
    let locker = sentinel_builder(&g)
        .sync_replicas(1, ms(300))
        .build()
        .await
        .unwrap();
    let held = locker
        .acquire("held", LockOptions::new().ttl(ms(600)))
        .await
        .expect("acknowledged while the replica runs");
    let replica_server = g.servers().iter().find(|s| s.port() == replica).unwrap();
    replica_server.pause().expect("SIGSTOP the replica");
    let stopped = Instant::now();
    let refused = async {
        let res = locker
            .acquire("refused", LockOptions::new().wait(ms(500)))
            .await;
        (res, stopped.elapsed())
    };
    let lost = async {
        let declared = tokio::time::timeout(ms(1_000), held.lost()).await;
        declared.map(|()| stopped.elapsed())
    };
    let ((res, failed_after), lost_after) = tokio::join!(refused, lost);
    let err = res.expect_err("no replica acknowledges");
    let lost_after = lost_after.expect("unacknowledged renewals end in a declared loss");
    let text = err.to_string();
    let transient = matches!(&err, LockError::Backend(b) if b.is_transient());
    let mut raw = Raw::single(&url(master)).await;
    let left = raw.lease_left("refused").await;
    let queued = raw.queued("refused").await;
    replica_server.resume().expect("SIGCONT");
    let back = within(ms(5_000), async || {
        locker
            .try_acquire("refused", LockOptions::new())
            .await
            .is_ok_and(|g| g.is_some())
    })
    .await;
    figure(
        "sync_replicas_refuses_unacknowledged_writes",
        format!(
            "replica frozen, sync_replicas(1, 300 ms): acquire failed after {} with a {} \
             error, lock left: {}, queue entries left: {queued}; a held lock (ttl 600 ms) \
             declared lost {} after the freeze; acquires acknowledged again {} after the \
             replica resumed. Error: {text}",
            ms_f(failed_after),
            if transient { "retryable" } else { "PERMANENT" },
            left.is_some(),
            ms_f(lost_after),
            back.map_or("never".into(), ms_f)
        ),
    );
    assert!(text.contains("acknowledged"), "{text}");
    assert!(transient, "{err:?}");
    assert_eq!(left, None, "an unacknowledged lock was left");
    assert_eq!(queued, 0);
    assert!(
        lost_after < ms(600),
        "loss declared after the lease: {lost_after:?}"
    );
    assert!(back.is_some(), "never acknowledged again");
}

/// Split brain after `SENTINEL FAILOVER`: the demoted master still takes writes (about 10 s)
/// and has no replica left. A locker stuck on it with `sync_replicas(1, ..)` gets no lock
/// acknowledged (retryable errors, nothing left behind), while one without `sync_replicas`
/// is granted the very lock a Sentinel locker holds on the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_brain_stale_master_grants_no_acknowledged_lock() {
    let g = group();
    let old = g.master_port().unwrap();
    tokio::task::block_in_place(|| g.failover()).expect("SENTINEL FAILOVER");
    let new = g.master_port().unwrap();
    let follower = sentinel_builder(&g).build().await.unwrap();
    let held = within(ms(2_000), async || holds_via(&follower, new).await).await;
    assert!(
        held.is_some(),
        "the Sentinel locker never reached the new master"
    );
    let on_new = follower
        .acquire("split", LockOptions::new().ttl(ms(5_000)))
        .await
        .unwrap();
    let stuck = |sync: bool| {
        let b = Locker::builder().url(url(old)).response_timeout(ms(500));
        if sync { b.sync_replicas(1, ms(100)) } else { b }
    };
    let (safe, unsafe_) = (
        stuck(true).build().await.unwrap(),
        stuck(false).build().await.unwrap(),
    );
    assert_eq!(role(old).await, "master", "the window closed too early");
    let (mut granted, mut refused, mut retryable) = (0, 0, 0);
    for _ in 0..5 {
        match safe.try_acquire("split", LockOptions::new()).await {
            Ok(Some(g)) => {
                granted += 1;
                drop(g);
            }
            Ok(None) => {}
            Err(e) => {
                refused += 1;
                if matches!(&e, LockError::Backend(b) if b.is_transient()) {
                    retryable += 1;
                }
            }
        }
    }
    let left_on_old = Raw::single(&url(old)).await.lease_left("split").await;
    let hazard = unsafe_
        .try_acquire("split", LockOptions::new())
        .await
        .ok()
        .flatten();
    let still_master = role(old).await == "master";
    figure(
        "split_brain_stale_master_grants_no_acknowledged_lock",
        format!(
            "after SENTINEL FAILOVER, the demoted master still a master: {still_master}; a \
             Sentinel locker holds the lock on the new master; a locker on the demoted master \
             with sync_replicas(1, 100 ms): {granted} of 5 try_acquire granted, {refused} \
             refused ({retryable} retryable), lock left there: {}; the same without \
             sync_replicas: {}",
            left_on_old.is_some(),
            if hazard.is_some() {
                "granted (two holders)"
            } else {
                "refused"
            }
        ),
    );
    drop(hazard);
    on_new.release().await.unwrap();
    assert!(
        still_master,
        "the window closed during the test; nothing was shown"
    );
    assert_eq!(granted, 0, "a lock was granted without acknowledgement");
    assert_eq!(retryable, 5);
    assert_eq!(left_on_old, None);
}

/// Whether a lock taken through `locker` lands on the server on `port`.
async fn holds_via(locker: &Locker, port: u16) -> bool {
    match locker
        .acquire("probe", LockOptions::new().wait(ms(100)))
        .await
    {
        Ok(g) => {
            let there = holds(port, "probe").await;
            let _ = g.release().await;
            there
        }
        Err(_) => false,
    }
}

/// Sentinels without a password in front of masters whose lock keys only an ACL user may
/// use: `sentinel_master_auth` (or the same in `LockerConfig`) authenticates to the masters
/// only, and the sentinels, which know no password, are still asked without one. Without it,
/// the default user's acquire is refused with the ACL advice. The password shows nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_auth_authenticates_to_the_masters_only() {
    const PASSWORD: &str = "m4ster-pw";
    let users = [
        "--user",
        "default",
        "on",
        "nopass",
        "~nothing:*",
        "&*",
        "+@all", //
        "--user",
        "locks",
        "on",
        ">m4ster-pw",
        "~*",
        "&*",
        "+@all",
    ];
    let g = RedisSentinelGroup::start_with_server_args(SERVICE, 1, &users)
        .expect("start master, replica and sentinel");
    let authed = sentinel_builder(&g).sentinel_master_auth("locks", PASSWORD);
    assert!(!format!("{authed:?}").contains(PASSWORD));
    let authed = authed
        .build()
        .await
        .expect("sentinels asked without a password");
    authed
        .acquire("authed", LockOptions::new())
        .await
        .expect("the masters' ACL user may lock")
        .release()
        .await
        .unwrap();

    let mut config = lockrt::LockerConfig::default();
    config.sentinels = g.sentinel_urls();
    config.service = Some(SERVICE.into());
    config.master_username = Some("locks".into());
    config.master_password = Some(PASSWORD.into());
    assert!(!format!("{config:?}").contains(PASSWORD));
    let configured = lockrt::LockerBuilder::from_config(config)
        .unwrap()
        .build()
        .await
        .unwrap();
    let guard = configured
        .acquire("configured", LockOptions::new())
        .await
        .expect("configured master credentials");
    guard.release().await.unwrap();

    let default_user = sentinel_builder(&g).build().await.unwrap();
    let err = default_user
        .acquire("authed", LockOptions::new().wait(ms(300)))
        .await
        .expect_err("the default user may not touch lock keys");
    let text = err.to_string();
    figure(
        "sentinel_master_auth",
        format!("with the masters' ACL user: acquired and released; without: {text}"),
    );
    assert!(
        text.contains("ACL") || text.contains("permission"),
        "{text}"
    );
    assert!(!text.contains(PASSWORD));
    let misplaced = Locker::builder()
        .url("redis://127.0.0.1:1/")
        .sentinel_master_auth("locks", PASSWORD)
        .build()
        .await
        .expect_err("master credentials need a Sentinel topology");
    assert!(matches!(misplaced, LockError::Config(_)), "{misplaced:?}");
}
