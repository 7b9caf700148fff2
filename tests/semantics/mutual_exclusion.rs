//! Mutual exclusion under contention: 3 lockers x 16 tasks on one key, a non-atomic
//! read-yield-write counter in the critical section, and recorded hold intervals.

use crate::support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::AsyncCommands;
use support::{ms, opts};
use tokio::time::Instant;

const LOCKERS: usize = 3;
const TASKS_PER_LOCKER: usize = 16;
const SECTIONS_PER_TASK: usize = 42; // 3 * 16 * 42 = 2,016 sections

both! {
    async fn no_lost_updates_and_no_overlapping_holds(fx) {
        let memory_counter = Arc::new(AtomicU64::new(0));
        let intervals = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..LOCKERS {
            let locker = fx.locker().await;
            let conn = if fx.is_redis() { Some(fx.conn().await) } else { None };
            for _ in 0..TASKS_PER_LOCKER {
                let (locker, mut conn) = (locker.clone(), conn.clone());
                let (counter, intervals) = (memory_counter.clone(), intervals.clone());
                tasks.push(tokio::spawn(async move {
                    for _ in 0..SECTIONS_PER_TASK {
                        locker.run("counter", opts().ttl(ms(5_000)).wait(ms(60_000)), async {
                            let start = Instant::now();
                            // Read, yield, write: loses updates unless the lock excludes.
                            match conn.as_mut() {
                                Some(c) => {
                                    let v: u64 = c.get("counter").await.unwrap_or(0);
                                    tokio::task::yield_now().await;
                                    let () = c.set("counter", v + 1).await.unwrap();
                                }
                                None => {
                                    let v = counter.load(Ordering::SeqCst);
                                    tokio::task::yield_now().await;
                                    counter.store(v + 1, Ordering::SeqCst);
                                }
                            }
                            intervals.lock().unwrap().push((start, Instant::now()));
                        }).await.expect("section ran under the lock");
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let total = (LOCKERS * TASKS_PER_LOCKER * SECTIONS_PER_TASK) as u64;
        let counted = if fx.is_redis() {
            let v: u64 = fx.conn().await.get("counter").await.unwrap();
            v
        } else {
            memory_counter.load(Ordering::SeqCst)
        };
        assert_eq!(counted, total, "lost updates: {}", total - counted);

        let mut iv = intervals.lock().unwrap().clone();
        assert_eq!(iv.len() as u64, total);
        iv.sort();
        for pair in iv.windows(2) {
            assert!(pair[1].0 >= pair[0].1, "two holders overlapped: {:?} and {:?}", pair[0], pair[1]);
        }
    }
}
