//! The `lockctl` binary against a real redis-server: list, show, unlock --force, watch; keys
//! and owner records printed escaped; and the URL's password never appears in its output
//! (every URL shape: `secrets.rs`).

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
        .envs_removed()
        .output()
        .expect("run lockctl")
}

/// Without the service's settings of this process: each test says which it sets.
trait NoServiceEnv {
    fn envs_removed(&mut self) -> &mut Self;
}

impl NoServiceEnv for std::process::Command {
    fn envs_removed(&mut self) -> &mut Self {
        for var in lockrt::LockerConfig::ENV_VARS {
            self.env_remove(var);
        }
        self
    }
}

/// `lockctl ARGS` with only these variables of the service's settings set (no `--url`).
fn lockctl_env(vars: &[(&str, &str)], args: &[&str]) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env_remove("LOCKCTL_URL")
        .envs_removed()
        .envs(vars.iter().copied())
        .output()
        .expect("run lockctl")
}

/// What a service sets for itself (`LOCKRT_URL`, `LOCKRT_PREFIX`) is what lockctl uses; `show`
/// prints the acquisition time as a date and an age, and `--json` prints what scripts parse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_the_services_settings_and_prints_dates_and_json() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let svc = Locker::builder()
        .url(&url)
        .prefix("app:")
        .service_name("billing")
        .build()
        .await
        .unwrap();
    let g = svc.acquire("stock:1", LockOptions::new()).await.unwrap();
    let fence = g.fence();
    let out = tokio::task::spawn_blocking(move || {
        let env = [("LOCKRT_URL", url.as_str()), ("LOCKRT_PREFIX", "app:")];
        let listed = lockctl_env(&env, &["--json", "list"]);
        let shown = lockctl_env(&env, &["show", "stock:1"]);
        let json = lockctl_env(&env, &["show", "stock:1", "--json"]);
        let none = lockctl_env(&[], &["list"]);
        (listed, shown, json, none)
    })
    .await
    .unwrap();
    let (listed, shown, json, none) = out;
    assert!(listed.status.success(), "{listed:?}");
    let all: serde_json::Value = serde_json::from_str(&text(&listed)).expect("JSON");
    let all = all.as_array().expect("an array");
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0]["key"], "stock:1");
    assert_eq!(all[0]["redis_key"], "app:stock:1");
    assert_eq!(all[0]["fence"], fence);
    assert_eq!(all[0]["holder"]["service"], "billing");
    let shown = text(&shown);
    let at = shown
        .lines()
        .find_map(|l| l.strip_prefix("acquired at: "))
        .unwrap_or_else(|| panic!("{shown}"));
    // `2026-11-25T01:02:03.456Z (1s 234ms ago)`
    assert!(
        at.contains('T') && at.contains("Z (") && at.ends_with(" ago)"),
        "{at}"
    );
    let one: serde_json::Value = serde_json::from_str(&text(&json)).expect("JSON");
    assert_eq!(one["holder"]["pid"], std::process::id());
    assert!(
        one["remaining_ms"].as_u64().is_some_and(|ms| ms > 0),
        "{one}"
    );
    assert_eq!(none.status.code(), Some(2));
    let err = String::from_utf8_lossy(&none.stderr);
    assert!(
        err.contains("LOCKRT_URL") && err.contains("REDIS_URL"),
        "{err}"
    );
    g.release().await.unwrap();
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
    assert_eq!(job[0], "\"job\"");
    assert!(job[1].starts_with("\"reports\"@"), "{listed}");
    assert_eq!(job[2], pid);
    let stock: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(stock[0], "\"stock:1\"");
    assert!(stock[1].starts_with("\"billing\"@"), "{listed}");
    assert_eq!(stock[4], g.fence().to_string(), "{listed}");
    assert_eq!(stock[5], "1", "one waiter: {listed}");

    let out = run(&url, &["list", "stock:*"]).await;
    assert_eq!(text(&out).lines().count(), 2);

    let out = run(&url, &["show", "stock:1"]).await;
    assert!(out.status.success());
    let shown = text(&out);
    assert!(
        shown.contains(&format!("instance id: \"{}\"", a.instance_id())),
        "{shown}"
    );
    assert!(shown.contains("service:     \"billing\""), "{shown}");
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
    assert!(text(&out).contains("\"reports\"@"), "{}", text(&out));

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
    assert!(watched.contains("+ \"stock:1\""), "{watched}");
    assert!(watched.contains("- \"stock:1\""), "{watched}");
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

/// Every control character in `text` but the line breaks lockctl itself writes.
fn controls(text: &str) -> Vec<char> {
    text.chars()
        .filter(|c| c.is_control() && *c != '\n')
        .collect()
}

/// A key, or an owner record written by something other than lockrt (lockrt cleans its own),
/// holding a newline, a carriage return or a terminal escape cannot forge a row of `list` or
/// `watch`, or a field of `show`: keys and owner fields are printed quoted and escaped, as
/// lockrt's logs print keys (`Debug`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_owner_records_are_printed_escaped() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let locker = named(&url, "billing").await;
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let evil = "evil\n\"forged\" \"x\"@\"h\" 1 1000ms 7 0\r\u{1b}[2J\u{7}";
    let _evil = locker.acquire(evil, opts).await.unwrap();
    let _plain = locker.acquire("plain", opts).await.unwrap();
    let info = locker.lock_info("plain").await.unwrap().unwrap();
    let owner = "1700000000000|svc\nFORGED ROW|host\u{1b}[31m|42|id\r\nservice:     forged";
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{{{}}}:owner", info.redis_key))
        .arg(owner)
        .arg("KEEPTTL")
        .query_async(&mut conn)
        .await
        .unwrap();

    let out = run(&url, &["list"]).await;
    assert!(out.status.success(), "{out:?}");
    let listed = text(&out);
    println!("{listed}");
    let rows: Vec<&str> = listed.lines().collect();
    assert_eq!(rows.len(), 3, "a header and one row per lock:\n{listed}");
    assert!(controls(&listed).is_empty(), "{:?}", controls(&listed));
    let evil_row = rows
        .iter()
        .find(|r| r.starts_with("\"evil"))
        .expect(&listed);
    assert!(evil_row.starts_with(&format!("{evil:?}")), "{evil_row}");
    let plain_row = rows
        .iter()
        .find(|r| r.starts_with("\"plain\""))
        .expect(&listed);
    assert!(
        plain_row.contains(r#""svc\nFORGED ROW"@"host\u{1b}[31m" 42"#),
        "{plain_row}"
    );

    let out = run(&url, &["show", "plain"]).await;
    assert!(out.status.success(), "{out:?}");
    let shown = text(&out);
    println!("{shown}");
    assert!(controls(&shown).is_empty(), "{:?}", controls(&shown));
    assert_eq!(
        shown.lines().count(),
        8,
        "header, row, six fields:\n{shown}"
    );
    assert_eq!(
        shown.lines().filter(|l| l.starts_with("service:")).count(),
        1,
        "one service line:\n{shown}"
    );
    assert!(
        shown.contains(r#"service:     "svc\nFORGED ROW""#),
        "{shown}"
    );
    assert!(
        shown.contains(r#"instance id: "id\r\nservice:     forged""#),
        "{shown}"
    );

    let out = run(&url, &["watch", "--count", "1"]).await;
    assert!(out.status.success(), "{out:?}");
    let watched = text(&out);
    assert!(controls(&watched).is_empty(), "{:?}", controls(&watched));
    assert_eq!(watched.lines().count(), 3, "{watched}");

    let out = run(&url, &["show", "gone\n\u{1b}[2J"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out), "\"gone\\n\\u{1b}[2J\": not held\n");
}

/// Read-held keys and semaphores are listed with their kind and how many hold them, `show`
/// names each reader or permit holder, and `--json` carries the kind and the holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_permits_are_listed_and_shown() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let svc = named(&url, "catalogue").await;
    let read = LockOptions::new().read();
    let (r1, r2) = (
        svc.acquire("cat:1", read).await.unwrap(),
        svc.acquire("cat:1", read).await.unwrap(),
    );
    let slots = LockOptions::new().permits(3);
    let p1 = svc.acquire("export:acme", slots).await.unwrap();
    let list = text(&run(&url, &["list"]).await);
    assert!(list.contains("2 readers"), "{list}");
    assert!(list.contains("1/3 permits"), "{list}");
    let show = text(&run(&url, &["show", "cat:1"]).await);
    assert_eq!(show.matches("reader:").count(), 2, "{show}");
    assert!(show.contains("\"catalogue\""), "{show}");
    let json: serde_json::Value =
        serde_json::from_str(&text(&run(&url, &["--json", "show", "export:acme"]).await)).unwrap();
    assert_eq!(json["kind"], "permits");
    assert_eq!(json["permits"], 3);
    assert_eq!(json["shared"].as_array().map(Vec::len), Some(1));
    assert_eq!(json["shared"][0]["fence"], p1.fence());
    let unlock = run(&url, &["unlock", "--force", "cat:1"]).await;
    assert!(unlock.status.success(), "{}", text(&unlock));
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while !(r1.is_lost() && r2.is_lost()) {
        assert!(tokio::time::Instant::now() < end, "readers not revoked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `lockctl jobs`: each `every` job with a claim, its run going on or its latest finished run,
/// by whom; `list` leaves a finished tick's claim out, `list --released` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_show_runs_going_on_and_finished_and_list_leaves_marks_out() {
    let server = RedisServer::start().expect("redis-server");
    let url = server.url();
    let svc = named(&url, "reports").await;
    let opts = LockOptions::new().ttl(Duration::from_secs(1));
    let tick = Duration::from_secs(3);
    let (done_tx, mut done) = tokio::sync::mpsc::unbounded_channel();
    let report = lockrt::spawn_every(&svc, "job:report", tick, opts, move |_| {
        let done_tx = done_tx.clone();
        async move {
            let _ = done_tx.send(());
        }
    })
    .unwrap();
    let (busy_tx, mut busy) = tokio::sync::mpsc::unbounded_channel();
    let sync = lockrt::spawn_every(&svc, "job:sync", tick, opts, move |_| {
        let _ = busy_tx.send(());
        // Runs until stopped.
        std::future::pending::<()>()
    })
    .unwrap();
    done.recv().await.expect("a report ran");
    busy.recv().await.expect("a sync runs");
    // The record of the finished run is written once the run has ended.
    let end = tokio::time::Instant::now() + Duration::from_secs(5);
    while svc.jobs("job:report").await.unwrap()[0].last.is_none() {
        assert!(
            tokio::time::Instant::now() < end,
            "no record of the report's run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let out = run(&url, &["jobs"]).await;
    assert!(out.status.success(), "{out:?}");
    let shown = text(&out);
    println!("{shown}");
    let lines: Vec<&str> = shown.lines().collect();
    assert_eq!(lines.len(), 3, "{shown}");
    assert!(lines[0].starts_with("JOB"), "{shown}");
    let pid = std::process::id().to_string();
    let report_line: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(&report_line[..2], ["\"job:report\"", "finished"], "{shown}");
    assert!(report_line[2].starts_with("\"reports\"@"), "{shown}");
    assert_eq!(report_line[3], pid, "{shown}");
    assert_eq!(report_line[6], "\"ran\"", "{shown}");
    assert!(report_line[7].starts_with("20"), "a next tick: {shown}");
    let sync_line: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(&sync_line[..2], ["\"job:sync\"", "running"], "{shown}");

    let out = run(&url, &["--json", "jobs", "job:report"]).await;
    let all: serde_json::Value = serde_json::from_str(&text(&out)).expect("JSON");
    assert_eq!(all.as_array().map(Vec::len), Some(1), "{all}");
    assert_eq!(all[0]["name"], "job:report");
    assert_eq!(all[0]["finished"]["holder"]["service"], "reports");
    assert_eq!(all[0]["finished"]["released"], true);
    let last = &all[0]["last"];
    assert_eq!(last["outcome"], "ran", "{all}");
    let (tick, next) = (last["tick_ms"].as_u64(), last["next_ms"].as_u64());
    assert_eq!(next, tick.map(|t| t + 3_000), "{all}");
    assert_eq!(last["by"]["service"], "reports", "{all}");

    // The finished tick's claim is no held lock; the running one's is.
    let out = run(&url, &["list", "job:*"]).await;
    let listed = text(&out);
    assert!(!listed.contains("job:report:tick:"), "{listed}");
    assert!(listed.contains("job:sync:tick:"), "{listed}");
    let out = run(&url, &["list", "--released", "job:report:*"]).await;
    assert!(text(&out).contains("job:report:tick:"), "{}", text(&out));

    report.stop(lockrt::Stop::AfterRun).await.unwrap();
    sync.stop(lockrt::Stop::Now).await.unwrap();
    svc.shutdown().await;
}
