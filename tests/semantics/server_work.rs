//! Server work per uncontended acquire + release pair, from `INFO commandstats`: lockrt's two
//! scripts against the plain pair (`SET NX PX`, then a compare-and-delete script). A
//! measurement for BENCHMARKS.md, not a test of a promise:
//! `cargo test --release --test semantics server_work:: -- --ignored --nocapture`.

use lockrt::Locker;
use lockrt::testing::RedisServer;

/// `usec` and `calls` of every command in `INFO commandstats`.
async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |f: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(f)?.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
            };
            Some((name.to_owned(), field("calls")?, field("usec")?))
        })
        .collect()
}

/// Server µs per pair of the commands named by `wanted`, over `pairs` pairs.
fn per_pair(stats: &[(String, u64, u64)], wanted: &[&str], pairs: u64) -> f64 {
    let usec: u64 = (stats.iter())
        .filter(|(n, _, _)| wanted.contains(&n.as_str()))
        .map(|(_, _, u)| u)
        .sum();
    usec as f64 / pairs as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for BENCHMARKS.md"]
async fn server_work_per_uncontended_pair() {
    const PAIRS: u64 = 20_000;
    let mut rounds = Vec::new();
    for _ in 0..3 {
        // lockrt: one locker, a new key every pair (uncontended), sequential.
        let server = RedisServer::start().expect("start redis-server");
        let mut conn = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let locker = Locker::connect(&server.url()).await.unwrap();
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        for i in 0..PAIRS {
            let g = locker
                .acquire(&format!("w{i}"), Default::default())
                .await
                .unwrap();
            g.release().await.unwrap();
        }
        let lockrt = per_pair(&commandstats(&mut conn).await, &["evalsha", "eval"], PAIRS);

        // The floor: SET NX PX and a compare-and-delete script.
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        let del = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        );
        for i in 0..PAIRS {
            let key = format!("f{i}");
            let _: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg("token")
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(&mut conn)
                .await
                .unwrap();
            let _: i64 = del
                .key(&key)
                .arg("token")
                .invoke_async(&mut conn)
                .await
                .unwrap();
        }
        let floor = per_pair(
            &commandstats(&mut conn).await,
            &["set", "evalsha", "eval"],
            PAIRS,
        );
        println!(
            "FIGURE server µs per pair: lockrt {lockrt:.1}, plain pair {floor:.1}, ratio {:.2}",
            lockrt / floor
        );
        rounds.push(lockrt / floor);
    }
    println!("FIGURE ratios {rounds:.2?}");
}
