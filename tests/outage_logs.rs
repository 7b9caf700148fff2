//! What an outage of the lock server logs, against a real redis-server killed for 15 s: one
//! WARN per interval with the count, not one per call, and one INFO when it is back. A binary
//! of its own: a scoped log subscriber misses events when tests on other threads register the
//! same call sites at the same time.

mod support;

use lockrt::Locker;
use lockrt::testing::RedisServer;
use support::{ms, opts};
use tokio::time::Instant;

/// 15 s of outage with 1,000 calls: at most one WARN per 5 s (plus the first), none per
/// call, and one INFO when the server is back; the calls after that take locks again.
#[test]
fn an_outage_logs_one_warn_per_interval_and_one_info_when_it_ends() {
    let (buf, subscriber) = support::logs::capture(tracing::Level::INFO);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut server = RedisServer::start().unwrap();
    let outage = ms(15_000);
    let (failed, after) = tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let locker = Locker::connect(&server.url()).await.unwrap();
            let warm = locker.acquire("warm", opts()).await.unwrap();
            warm.release().await.unwrap();
            server.kill();
            let start = Instant::now();
            let mut failed = 0;
            for i in 0..1_000u32 {
                // Spread over the outage: 1,000 calls in 15 s.
                tokio::time::sleep_until(start + outage * i / 1_000).await;
                let res = locker.try_acquire(&format!("k{}", i % 50), opts()).await;
                failed += usize::from(res.is_err());
            }
            server.restart().unwrap();
            let end = Instant::now() + ms(5_000);
            let after = loop {
                match locker.try_acquire("back", opts()).await {
                    Ok(Some(g)) => break g.release().await.is_ok(),
                    _ if Instant::now() < end => tokio::time::sleep(ms(20)).await,
                    _ => break false,
                }
            };
            locker.shutdown().await;
            (failed, after)
        })
    });
    let logs = String::from_utf8(buf.bytes()).unwrap();
    let warns: Vec<&str> = logs.lines().filter(|l| l.contains(" WARN ")).collect();
    let back = logs
        .lines()
        .filter(|l| l.contains("lock server reachable again"))
        .count();
    eprintln!(
        "{failed} of 1000 calls failed; {} WARN lines:\n{}",
        warns.len(),
        warns.join("\n")
    );
    assert_eq!(failed, 1_000, "every call failed while the server was down");
    assert!(after, "no lock after the server came back");
    assert_eq!(back, 1, "{logs}");
    // The first line, then one per 5 s of a 15 s outage; the lines of the pub/sub connection
    // lost at the kill (one) beside them.
    assert!(warns.len() <= 6, "{} WARN lines", warns.len());
    let counted = warns
        .iter()
        .filter(|l| l.contains("lock server still unreachable"))
        .count();
    assert!(counted >= 2, "no summary lines with counts: {warns:?}");
}
