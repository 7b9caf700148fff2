//! The `lockctl` binary against a real redis-server: list, show, unlock --force, watch; and
//! the URL's password never appears in its output.

use std::process::Output;
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockOptions, Locker};

fn lockctl(url: &str, args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("LOCKCTL_URL")
        .env_remove("REDIS_URL")
        .output()
        .expect("run lockctl")
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

async fn run(url: &str, args: &[&str]) -> Output {
    let (url, args): (String, Vec<String>) = (
        url.to_owned(),
        args.iter().map(|a| (*a).to_owned()).collect(),
    );
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        lockctl(&url, &args)
    })
    .await
    .unwrap()
}

/// A locker on `url` whose locks record `service` as their holder's service.
async fn named(url: &str, service: &str) -> Locker {
    let builder = Locker::builder().url(url).service_name(service);
    builder.build().await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_unlock_and_watch() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let a = named(&url, "billing").await;
    let b = named(&url, "reports").await;
    let ttl = Duration::from_secs(3);
    let g = a
        .acquire("stock:1", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let _job = b.acquire("job", LockOptions::new().ttl(ttl)).await.unwrap();
    let b2 = b.clone();
    let waiter = tokio::spawn(async move {
        b2.acquire(
            "stock:1",
            LockOptions::new().ttl(ttl).wait(Duration::from_secs(20)),
        )
        .await
    });
    while a.lock_info("stock:1").await.unwrap().unwrap().waiters < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let out = run(&url, &["list"]).await;
    assert!(out.status.success(), "{out:?}");
    let listed = text(&out);
    println!("{listed}");
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].starts_with("KEY"));
    let pid = std::process::id().to_string();
    let job: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(job[0], "job");
    assert!(job[1].starts_with("reports@"), "{listed}");
    assert_eq!(job[2], pid);
    let stock: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(stock[0], "stock:1");
    assert!(stock[1].starts_with("billing@"), "{listed}");
    assert_eq!(stock[4], g.fence().to_string(), "{listed}");
    assert_eq!(stock[5], "1", "one waiter: {listed}");

    let out = run(&url, &["list", "stock:*"]).await;
    assert_eq!(text(&out).lines().count(), 2);

    let out = run(&url, &["show", "stock:1"]).await;
    assert!(out.status.success());
    let shown = text(&out);
    assert!(
        shown.contains(&format!("instance id: {}", a.instance_id())),
        "{shown}"
    );
    assert!(shown.contains("service:     billing"), "{shown}");
    let out = run(&url, &["show", "nothing"]).await;
    assert_eq!(out.status.code(), Some(1));

    let out = run(&url, &["unlock", "stock:1"]).await;
    assert!(!out.status.success(), "refused without --force");
    let start = tokio::time::Instant::now();
    let out = run(&url, &["unlock", "--force", "stock:1"]).await;
    assert!(out.status.success(), "{out:?}");
    let new = waiter.await.unwrap().unwrap();
    let handed = start.elapsed();
    tokio::time::timeout(ttl / 3 + Duration::from_millis(500), g.lost())
        .await
        .expect("holder told it lost within its renewal interval");
    let lost = start.elapsed();
    println!(
        "FIGURE lockctl_force_unlock: waiter held the lock {handed:?} after `lockctl unlock --force` started (process start included), holder lost after {lost:?} (ttl {ttl:?})"
    );
    assert!(handed < Duration::from_secs(2), "{handed:?}");
    let out = run(&url, &["show", "stock:1"]).await;
    assert!(text(&out).contains("reports@"), "{}", text(&out));

    // watch: the first look prints every lock, the next ones only changes.
    let url2 = url.clone();
    let watcher =
        tokio::spawn(
            async move { run(&url2, &["watch", "--interval", "200ms", "--count", "8"]).await },
        );
    tokio::time::sleep(Duration::from_millis(500)).await;
    new.release().await.unwrap();
    let out = watcher.await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let watched = text(&out);
    println!("{watched}");
    assert!(watched.contains("+ stock:1"), "{watched}");
    assert!(watched.contains("- stock:1"), "{watched}");
}

#[test]
fn passwords_never_appear() {
    let out = lockctl("redis://user:hunter2@127.0.0.1:1/", &["list"]);
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("hunter2"), "{all}");
    assert!(all.contains("127.0.0.1"), "{all}");
}
