//! The command-line examples run and prove their point: the flash sale sells exactly its stock
//! (and oversells without the lock), the cache rebuild loads once, transfers under a
//! multi-key lock keep the total (and drift without it), the quick start sells what it has. They run as the real binaries `cargo test` builds in `target/<profile>/examples`.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use lockrt::testing::RedisServer;
use redis::AsyncCommands;

/// Generous: the demo takes about a second, a debug build on a loaded machine longer.
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// Runs an example to completion; its exit status and stdout.
async fn run(name: &str, args: &[&str], redis_url: Option<&str>) -> (bool, String) {
    run_with(name, args, redis_url, &[]).await
}

/// [`run`] with more environment variables (`LOCKRT_*` ones are removed unless given here).
async fn run_with(
    name: &str,
    args: &[&str],
    redis_url: Option<&str>,
    vars: &[(&str, &str)],
) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(support::example_binary(name));
    cmd.args(args).kill_on_drop(true);
    for var in lockrt::LockerConfig::ENV_VARS {
        cmd.env_remove(var);
    }
    cmd.envs(vars.iter().copied());
    match redis_url {
        Some(url) => cmd.env("REDIS_URL", url),
        None => cmd.env_remove("REDIS_URL"),
    };
    let out = tokio::time::timeout(RUN_LIMIT, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{name} did not finish within {RUN_LIMIT:?}"))
        .expect("run example");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!(
        "{name} {args:?}:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), stdout)
}

/// `  sold       100` lines as name -> number.
fn figures(stdout: &str) -> HashMap<String, i64> {
    stdout
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?.to_owned();
            let value = words.next()?.parse().ok()?;
            Some((name, value))
        })
        .collect()
}

#[tokio::test]
async fn seckill_sells_exactly_the_stock_across_processes() {
    let server = RedisServer::start().unwrap();
    let (ok, out) = run("seckill", &[], Some(&server.url())).await;
    assert!(ok, "the demo reported a wrong result");
    let f = figures(&out);
    assert_eq!((f["sold"], f["remaining"], f["oversold"]), (100, 0, 0));
    assert_eq!((f["busy"], f["errors"]), (0, 0));
    // It used the server it was given.
    let left: i64 = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
        .get("seckill:stock:1")
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn seckill_without_the_lock_oversells() {
    // No REDIS_URL: the demo starts its own throwaway server, as on a fresh machine.
    let (ok, out) = run("seckill", &["--no-lock", "--work-ms", "2"], None).await;
    assert!(ok);
    let f = figures(&out);
    assert!(
        f["oversold"] > 0,
        "the racy section should oversell without the lock"
    );
    assert_eq!(f["sold"] + f["remaining"] - 100, f["oversold"]);
}

#[tokio::test]
async fn cache_rebuild_loads_once_for_fifty_readers() {
    let (ok, out) = run("cache_rebuild", &[], None).await;
    assert!(ok, "the example reported a wrong result");
    assert!(out.contains("loader calls  1\n"), "{out}");
    assert!(out.contains("50 of 50 readers got"), "{out}");
}

#[tokio::test]
async fn transfers_under_a_multi_key_lock_keep_the_total() {
    let (ok, out) = run("transfer", &[], None).await;
    assert!(ok, "the example reported a wrong result");
    let f = figures(&out);
    assert_eq!((f["transfers"], f["refused"], f["total"]), (400, 0, 5000));
}

#[tokio::test]
async fn transfers_without_the_lock_create_or_lose_money() {
    let (ok, out) = run("transfer", &["--no-lock"], None).await;
    assert!(ok);
    assert_ne!(figures(&out)["total"], 5000, "{out}");
}

#[tokio::test]
async fn quickstart_sells_what_it_has() {
    let (ok, out) = run("quickstart", &[], None).await;
    assert!(ok);
    assert_eq!(out.trim(), "sold 10, sold out 2, left 0");
}

#[tokio::test]
async fn quickstart_takes_its_locker_from_the_lockrt_variables() {
    // The production path: LOCKRT_URL and LOCKRT_PREFIX, no REDIS_URL.
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let vars = [
        ("LOCKRT_URL", url.as_str()),
        ("LOCKRT_PREFIX", "quick:"),
        ("LOCKRT_DEFAULT_TTL", "20s"),
    ];
    let (ok, out) = run_with("quickstart", &[], None, &vars).await;
    assert!(ok);
    assert_eq!(out.trim(), "sold 10, sold out 2, left 0");
    // The locks were taken on that server, under that prefix (the fencing counter stays).
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let fences: Vec<String> = conn.keys("*:state").await.unwrap();
    assert_eq!(fences, ["{quick:stock:1}:state"]);

    // An invalid value stops it with an error naming the variable.
    let vars = [
        ("LOCKRT_URL", url.as_str()),
        ("LOCKRT_DEFAULT_WAIT", "soon"),
    ];
    let (ok, _) = run_with("quickstart", &[], None, &vars).await;
    assert!(!ok);
}

#[tokio::test]
async fn catalogue_readers_share_and_never_see_a_half_rebuilt_catalogue() {
    let server = RedisServer::start().unwrap();
    let (ok, out) = run("catalogue", &["--demo"], Some(&server.url())).await;
    assert!(ok, "the demo reported a torn read or a failed request");
    let f = figures(&out);
    assert!(f["reads"] > 0 && f["rebuilds"] > 0, "{out}");
    assert_eq!((f["torn_reads"], f["errors"]), (0, 0), "{out}");
    assert!(f["max_readers"] > 1, "readers should share the lock: {out}");
    // It used the server it was given, and rebuilt there more than the first build.
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let version: i64 = conn.get("catalogue:acme:version").await.unwrap();
    assert!(version > 1, "version {version}");
}

#[tokio::test]
async fn catalogue_without_the_lock_serves_torn_reads() {
    let (ok, out) = run("catalogue", &["--demo", "--no-lock"], None).await;
    assert!(ok);
    let f = figures(&out);
    assert!(f["rebuilds"] > 0, "{out}");
    assert!(
        f["torn_reads"] > 0,
        "readers racing the rebuilds should see mixed versions without the lock: {out}"
    );
}

#[tokio::test]
async fn exports_run_three_at_once_per_tenant_and_a_dead_holders_permit_comes_back() {
    let server = RedisServer::start().unwrap();
    let (ok, out) = run("exports", &[], Some(&server.url())).await;
    assert!(ok, "the example reported a wrong result");
    let f = figures(&out);
    assert_eq!((f["exports"], f["busy"], f["max_at_once"]), (36, 0, 3));
    let tenants: Vec<&str> = out.lines().filter(|l| l.starts_with("tenant ")).collect();
    assert_eq!(tenants.len(), 3, "{out}");
    // Every tenant used all its slots, and only its own: none took another's.
    assert!(
        tenants
            .iter()
            .all(|l| l.ends_with("exports 12  max_at_once 3")),
        "{out}"
    );
    // The killed holder's lease is 1 s: its permit is back within it (plus scheduling).
    assert!(
        out.contains("killed holding a permit of export:acme"),
        "{out}"
    );
    assert!((0..3_000).contains(&f["permit_back_ms"]), "{out}");
    let most: i64 = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
        .get("exports:acme:max_running")
        .await
        .unwrap();
    assert_eq!(most, 3);
}

#[tokio::test]
async fn exports_without_the_semaphore_run_more_than_three_at_once() {
    let (ok, out) = run("exports", &["--no-lock"], None).await;
    assert!(ok);
    let f = figures(&out);
    assert_eq!(f["exports"], 36, "{out}");
    assert!(f["max_at_once"] > 3, "{out}");
    assert!(
        !out.contains("permit_back_ms"),
        "no crash part without the lock: {out}"
    );
}
