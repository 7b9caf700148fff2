//! Inspection on a Redis Cluster: `Locker::locks` scans every master, `lock_info` and
//! `force_unlock` work per slot.

use std::time::Duration;

use lockrt::testing::RedisCluster;
use lockrt::{LockOptions, Locker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_listed_across_every_master() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let locker = Locker::builder()
        .cluster(cluster.seed_urls())
        .service_name("inspector")
        .build()
        .await
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let mut guards = Vec::new();
    for i in 0..12 {
        guards.push(locker.acquire(&format!("job:{i}"), opts).await.unwrap());
    }
    let masters: std::collections::BTreeSet<usize> = (0..12)
        .map(|i| {
            cluster
                .master_of_slot(lockrt::testing::slot_of(format!("lock:job:{i}")))
                .unwrap()
        })
        .collect();
    let listed = locker.locks("job:*").await.unwrap();
    println!(
        "FIGURE cluster_locks_listed: 12 locks on {} masters, {} listed",
        masters.len(),
        listed.len()
    );
    assert!(masters.len() > 1, "the keys should spread over masters");
    assert_eq!(listed.len(), 12, "{listed:?}");
    let g = &guards[3];
    let info = locker.lock_info("job:3").await.unwrap().expect("held");
    assert_eq!(info.fence, Some(g.fence()));
    assert!(
        info.holder
            .is_some_and(|h| format!("{h}").contains("inspector"))
    );
    assert!(locker.force_unlock("job:3").await.unwrap());
    tokio::time::timeout(Duration::from_secs(10), g.lost())
        .await
        .expect("the holder learns it lost");
    assert_eq!(locker.locks("job:*").await.unwrap().len(), 11);
}
