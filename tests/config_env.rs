//! `LockerBuilder::from_env` and `LockerBuilder::from_config` against a real redis-server. The
//! environment is only ever set on a child process (this test binary run again with one test
//! selected), so nothing here mutates the environment of a running test.

use std::process::Command;
use std::time::Duration;

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockOptions, LockerBuilder, LockerConfig, Wait};
use redis::AsyncCommands;

/// Set on the child process: the `child_*` tests only act when it is there.
const CHILD: &str = "LOCKRT_CONFIG_TEST_CHILD";

/// Runs the test `name` of this binary in a child process with these variables (and every
/// `LOCKRT_*` / `REDIS_URL` variable of ours removed); its success and output.
fn child(name: &str, vars: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for var in LockerConfig::ENV_VARS {
        cmd.env_remove(var);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{name}:\n{text}");
    (out.status.success(), text)
}

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

#[test]
fn from_env_builds_a_working_locker() {
    if in_child() {
        return;
    }
    let server = RedisServer::start_with(&["--requirepass", "s3cret-pw"]).unwrap();
    let url = format!("redis://:s3cret-pw@127.0.0.1:{}/", server.port());
    let (ok, out) = child(
        "child_from_env",
        &[
            ("LOCKRT_URL", &url),
            ("REDIS_URL", "redis://127.0.0.1:1/"), // LOCKRT_URL wins
            ("LOCKRT_PREFIX", "cfgenv:"),
            ("LOCKRT_DEFAULT_TTL", "5s"),
            ("LOCKRT_DEFAULT_WAIT", "200ms"),
            ("LOCKRT_CONNECT_TIMEOUT", "2s"),
            ("LOCKRT_RESPONSE_TIMEOUT", "1s 500ms"),
            ("LOCKRT_SAFETY_MARGIN", "300ms"),
            ("LOCKRT_MAX_HOLD", "1m"),
            ("LOCKRT_SERVICE_NAME", "billing"),
        ],
    );
    assert!(ok, "the child failed");
    assert!(out.contains("child: service \"billing\""), "{out}");
    assert!(out.contains("child: held cfgenv:job"), "{out}");

    // REDIS_URL alone is enough.
    let (ok, out) = child(
        "child_from_env",
        &[
            ("REDIS_URL", &url),
            ("LOCKRT_PREFIX", "cfgenv:"),
            ("LOCKRT_DEFAULT_TTL", "5s"),
            ("LOCKRT_DEFAULT_WAIT", "200ms"),
        ],
    );
    assert!(ok && out.contains("child: held cfgenv:job"), "{out}");
}

#[tokio::test(flavor = "current_thread")]
async fn child_from_env() {
    if !in_child() {
        return;
    }
    let locker = LockerBuilder::from_env().unwrap().build().await.unwrap();
    let url = std::env::var("LOCKRT_URL")
        .or_else(|_| std::env::var("REDIS_URL"))
        .unwrap();
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let guard = locker.acquire("job", LockOptions::new()).await.unwrap();
    let key = locker.redis_key("job").unwrap();
    let holder = locker
        .lock_info("job")
        .await
        .unwrap()
        .unwrap()
        .holder
        .unwrap();
    if let Ok(name) = std::env::var("LOCKRT_SERVICE_NAME") {
        assert_eq!(holder.service, name, "LOCKRT_SERVICE_NAME names the holder");
        println!("child: service {name:?}");
    }
    // The default ttl of 5 s, in Redis.
    let pttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(pttl > 3_000 && pttl <= 5_000, "pttl {pttl}");
    // The default wait of 200 ms: a second owner gives up after about that long.
    let other = LockerBuilder::from_env().unwrap().build().await.unwrap();
    let started = std::time::Instant::now();
    let err = other.acquire("job", LockOptions::new()).await.unwrap_err();
    assert!(err.is_timeout(), "{err:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    println!("child: held {key}");
    guard.release().await.unwrap();
    // `other` gave up, and its queue place is removed in the background; a release in that
    // instant hands it the lock, which that cleanup then releases. Let it run before this
    // process exits, or the next child finds the lock taken until its grant lease ends.
    let gone = async {
        while conn.exists::<_, bool>(&key).await.unwrap() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), gone)
        .await
        .expect("the lock is released by the waiter's cleanup");
}

#[test]
fn from_env_refuses_invalid_values_naming_the_variable() {
    if in_child() {
        return;
    }
    for (var, value) in [
        ("LOCKRT_DEFAULT_TTL", "30"),
        ("LOCKRT_DEFAULT_WAIT", "never"),
        ("LOCKRT_RESPONSE_TIMEOUT", "1 fortnight"),
    ] {
        let (ok, out) = child(
            "child_from_env_error",
            &[
                ("LOCKRT_URL", "redis://:s3cret-pw@127.0.0.1:1/"),
                (var, value),
            ],
        );
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!(
                "child error: invalid locker configuration: {var}=\"{value}\""
            )),
            "{out}"
        );
        assert!(!out.contains("s3cret-pw"), "{out}");
    }
    // `forever` is a wait, not a ttl.
    let (ok, out) = child("child_from_env_error", &[("LOCKRT_DEFAULT_TTL", "forever")]);
    assert!(
        ok && out.contains("LOCKRT_DEFAULT_TTL=\"forever\""),
        "{out}"
    );
}

#[test]
fn child_from_env_error() {
    if !in_child() {
        return;
    }
    let err = LockerBuilder::from_env().unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    println!("child error: {err}");
}

#[test]
fn from_env_without_a_url_is_a_builder_that_build_refuses() {
    if in_child() {
        return;
    }
    let (ok, out) = child("child_no_url", &[("LOCKRT_PREFIX", "x:")]);
    assert!(ok, "{out}");
}

#[tokio::test(flavor = "current_thread")]
async fn child_no_url() {
    if !in_child() {
        return;
    }
    let builder = LockerBuilder::from_env().unwrap();
    let err = builder.build().await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("no Redis URL"), "{text}");
    assert!(
        text.contains("LOCKRT_URL") && text.contains("REDIS_URL"),
        "the error names the variables from_env read: {text}"
    );
}

#[tokio::test]
async fn from_config_deserialized_from_json_builds_a_working_locker() {
    if in_child() {
        return;
    }
    let server = RedisServer::start().unwrap();
    let json = format!(
        r#"{{
            "url": "{}",
            "prefix": "cfgjson:",
            "default_ttl": "4s",
            "default_wait": "forever",
            "max_hold": "10m",
            "connect_timeout": "2s",
            "response_timeout": "750ms",
            "safety_margin": "100ms"
        }}"#,
        server.url()
    );
    let config: LockerConfig = serde_json::from_str(&json).unwrap();
    assert_eq!(config.default_ttl, Some(Duration::from_secs(4)));
    assert_eq!(config.default_wait, Some(Wait::Forever));
    assert_eq!(config.max_hold, Some(Duration::from_secs(600)));
    assert_eq!(config.response_timeout, Some(Duration::from_millis(750)));

    let locker = LockerBuilder::from_config(config)
        .unwrap()
        .build()
        .await
        .unwrap();
    let guard = locker.acquire("job", LockOptions::new()).await.unwrap();
    let key = locker.redis_key("job").unwrap();
    assert_eq!(key, "cfgjson:job");
    let pttl: i64 = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
        .pttl(&key)
        .await
        .unwrap();
    assert!(pttl > 2_000 && pttl <= 4_000, "pttl {pttl}");
    // Waits forever: still waiting after a while, gets it once released.
    let url = server.url();
    let waiter = tokio::spawn(async move {
        let mut c = LockerConfig::default();
        c.url = Some(url);
        c.prefix = Some("cfgjson:".into());
        c.default_wait = Some(Wait::Forever);
        let other = LockerBuilder::from_config(c)
            .unwrap()
            .build()
            .await
            .unwrap();
        other.acquire("job", LockOptions::new()).await.map(drop)
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiter.is_finished());
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[test]
fn deserializing_refuses_bad_durations_and_unknown_fields() {
    if in_child() {
        return;
    }
    let err = serde_json::from_str::<LockerConfig>(r#"{"default_ttl": "30"}"#).unwrap_err();
    assert!(err.to_string().contains("expected a duration"), "{err}");
    let err = serde_json::from_str::<LockerConfig>(r#"{"default_wait": "never"}"#).unwrap_err();
    assert!(err.to_string().contains("forever"), "{err}");
    let err = serde_json::from_str::<LockerConfig>(r#"{"ttl": "30s"}"#).unwrap_err();
    assert!(err.to_string().contains("unknown field"), "{err}");
    // Every field is optional; an empty section is the defaults.
    let config: LockerConfig = serde_json::from_str("{}").unwrap();
    assert_eq!(config, LockerConfig::default());
    // Topologies as lists.
    let config: LockerConfig = serde_json::from_str(
        r#"{
            "sentinels": ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"],
            "service": "locks",
            "default_wait": "2s"
        }"#,
    )
    .unwrap();
    assert_eq!(config.sentinels.len(), 2);
    assert_eq!(config.default_wait, Some(Wait::For(Duration::from_secs(2))));
    assert!(LockerBuilder::from_config(config).is_ok());
    let config: LockerConfig =
        serde_json::from_str(r#"{"url": "redis://a:1/", "cluster": ["redis://b:2/"]}"#).unwrap();
    assert!(matches!(
        LockerBuilder::from_config(config),
        Err(LockError::Config(_))
    ));
}
