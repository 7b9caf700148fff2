//! lockrt as a Redis ACL user: a user granted exactly the documented rules can lock, wait
//! (pub/sub) and release; a user missing a rule gets the `NOPERM` message naming the rules; a
//! wrong password gets the authentication message; and no error, `Debug` output or log line
//! ever contains the password.

mod support;

use std::sync::LazyLock;

use lockrt::testing::RedisServer;
use lockrt::{LockError, LockOptions, Locker};
use support::logs::{LogBuf, capture};
use support::topology::{Raw, assert_woken_promptly, figure, ms, ms_f, spawn_waiter};
use tokio::time::Instant;

/// The rules `ACL_HINT` documents (lockrt/src/backend/redis/diagnose.rs), for the default prefix.
const RULES: &str = "~lock:* ~{lock:* &{lock:* &lock:revoke:* +evalsha +eval +subscribe \
                     +unsubscribe +ssubscribe +sunsubscribe +ping +hello +wait +role +info +get \
                     +set +del +exists +pexpire +pexpireat +pttl +hget +hmget +hset +hdel \
                     +hexists +hincrby +hlen +hgetall +zadd +zcard +zrange +zrangebyscore +zrem \
                     +zscore +publish +spublish";

/// Every log line of this test binary, at every level.
static LOGS: LazyLock<LogBuf> = LazyLock::new(|| {
    let (buf, subscriber) = capture(tracing::Level::TRACE);
    tracing::subscriber::set_global_default(subscriber).expect("one subscriber per binary");
    buf
});

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.bytes()).into_owned()
}

/// A server with an ACL user `user` (password `password`) granted `rules`.
async fn server_with_user(user: &str, password: &str, rules: &str) -> RedisServer {
    LazyLock::force(&LOGS);
    let server = RedisServer::start().expect("redis-server");
    let mut admin = Raw::single(&server.url()).await;
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(user)
        .arg("on")
        .arg(format!(">{password}"))
        .arg("resetkeys")
        .arg("resetchannels")
        .arg("-@all");
    for rule in rules.split_whitespace() {
        // Redis 6.2 has no sharded pub/sub: the README leaves its `s` commands out there.
        if let Some(name) = rule.strip_prefix('+')
            && !server_has(&mut admin, name).await
        {
            continue;
        }
        cmd.arg(rule);
    }
    let () = cmd.query_async(&mut admin).await.expect("ACL SETUSER");
    server
}

/// Whether the server knows the command `name` (`COMMAND INFO` answers nil for others).
async fn server_has(admin: &mut Raw, name: &str) -> bool {
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query_async(admin)
        .await
        .expect("COMMAND INFO");
    !matches!(info.first(), None | Some(redis::Value::Nil))
}

fn user_url(server: &RedisServer, user: &str, password: &str) -> String {
    format!("redis://{user}:{password}@127.0.0.1:{}/", server.port())
}

/// `text` (an error, a `Debug` output) does not contain `password`.
fn clean(text: &str, password: &str) {
    assert!(!text.contains(password), "the password leaked: {text}");
}

/// `err`, whose message is `text`, is a permanent backend error whose message names each of
/// `names` and does not contain `password`.
fn assert_refused(text: &str, err: &LockError, names: &[&str], password: &str) {
    for name in names {
        assert!(text.contains(name), "{text}");
    }
    assert!(
        matches!(err, LockError::Backend(b) if !b.is_transient()),
        "{err:?}"
    );
    clean(text, password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_with_the_documented_rules_locks_waits_and_releases() {
    let password = "pw-documented-4711";
    let server = server_with_user("locks", password, RULES).await;
    let url = user_url(&server, "locks", password);
    let (a, b) = (
        Locker::connect(&url)
            .await
            .expect("connect as the ACL user"),
        Locker::connect(&url)
            .await
            .expect("connect as the ACL user"),
    );
    let mut raw = Raw::single(&server.url()).await;
    let guard = a
        .acquire("acl", LockOptions::new().ttl(ms(600)))
        .await
        .expect("acquire as the ACL user");
    let waiter = spawn_waiter(&b, "acl", ms(5_000));
    raw.until_queued("acl", 1).await;
    // Held past a few renewals.
    tokio::time::sleep(ms(700)).await;
    assert!(!guard.is_lost(), "renewals as the ACL user failed");
    let released = Instant::now();
    guard.release().await.expect("release as the ACL user");
    let (got, g) = waiter.await.unwrap();
    g.expect("the waiter, woken over pub/sub as the ACL user")
        .release()
        .await
        .unwrap();
    let handoff = got - released;
    figure(
        "acl_user_with_the_documented_rules_locks_waits_and_releases",
        format!(
            "user granted `{RULES}`: acquire, renewals (ttl 600 ms held 700 ms), waiter woken \
             {} after the release, release: Ok",
            ms_f(handoff)
        ),
    );
    assert_woken_promptly(handoff);
    clean(&logs(), password);
}

/// The rules without one of them: the error names what is missing.
async fn missing_rule(rule: &str, password: &str) -> (String, LockError) {
    let rules = RULES.replace(&format!("{rule} "), "");
    assert_ne!(rules, RULES, "{rule} is one of the rules");
    let server = server_with_user("partial", password, &rules).await;
    let url = user_url(&server, "partial", password);
    let locker = Locker::connect(&url).await.expect("connect");
    // Held by an admin, so that the user has to wait (and subscribe).
    let admin = Locker::connect(&server.url()).await.unwrap();
    let held = admin.acquire("acl", LockOptions::new()).await.unwrap();
    let err = locker
        .acquire("acl", LockOptions::new().wait(ms(300)))
        .await
        .expect_err("a missing rule fails");
    drop(held);
    (err.to_string(), err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_the_helper_key_pattern_gets_noperm_naming_the_rules() {
    let password = "pw-nokeys-0815";
    let (text, err) = missing_rule("~{lock:*", password).await;
    figure(
        "acl_user_without_the_helper_key_pattern_gets_noperm_naming_the_rules",
        format!("without `~{{lock:*`: {text}"),
    );
    assert_refused(&text, &err, &["~{lock:*", "&{lock:*"], password);
    clean(&format!("{err:?}"), password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_the_channel_pattern_gets_noperm_naming_the_rules() {
    let password = "pw-nochannels-1234";
    let (text, err) = missing_rule("&{lock:*", password).await;
    figure(
        "acl_user_without_the_channel_pattern_gets_noperm_naming_the_rules",
        format!("without `&{{lock:*`, waiting: {text}"),
    );
    assert_refused(&text, &err, &["~{lock:*", "&{lock:*"], password);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_gets_the_authentication_message() {
    let password = "pw-right-5555";
    let server = server_with_user("locks", password, RULES).await;
    let wrong = "pw-wrong-6666";
    let start = Instant::now();
    let err = Locker::connect(&user_url(&server, "locks", wrong))
        .await
        .expect_err("a wrong password is refused");
    let took = start.elapsed();
    let text = err.to_string();
    figure(
        "wrong_password_gets_the_authentication_message",
        format!("failed after {}: {text}", ms_f(took)),
    );
    assert_refused(&text, &err, &["authentication failed"], wrong);
    clean(&format!("{err:?}"), wrong);
    clean(&logs(), wrong);
}

/// The password in a URL never reaches an error, a `Debug` output or a log line, whatever
/// fails: a refused connection, a wrong password, a permission error, a MOVED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_appears_in_no_error_debug_or_log() {
    let password = "pw-never-shown-9876";
    let server = server_with_user("locks", password, "~other:* +@all").await;
    let url = user_url(&server, "locks", password);
    let mut outputs = Vec::new();
    // Permission error on the scripts.
    let locker = Locker::connect(&url).await.expect("connect");
    outputs.push(format!("{locker:?}"));
    let err = locker.acquire("k", LockOptions::new()).await.unwrap_err();
    outputs.push(err.to_string());
    outputs.push(format!("{err:?}"));
    // Nothing listens: refused.
    let closed = RedisServer::start().unwrap();
    let closed_url = user_url(&closed, "locks", password);
    drop(closed);
    let err = Locker::connect(&closed_url).await.unwrap_err();
    outputs.push(err.to_string());
    outputs.push(format!("{err:?}"));
    // A builder with the password, and every topology URL form.
    for url in [
        closed_url.clone(),
        closed_url.replace("redis://", "redis+cluster://"),
        closed_url.replace("redis://", "redis+sentinel://") + "svc",
    ] {
        let builder = Locker::builder().url(&url).connect_timeout(ms(200));
        outputs.push(format!("{builder:?}"));
        if let Err(e) = builder.build().await {
            outputs.push(e.to_string());
            outputs.push(format!("{e:?}"));
        }
    }
    let n = outputs.len();
    for text in &outputs {
        clean(text, password);
    }
    clean(&logs(), password);
    figure(
        "password_appears_in_no_error_debug_or_log",
        format!(
            "{n} errors and Debug outputs (NOPERM, refused, builder, cluster and sentinel URLs) \
             and {} bytes of TRACE logs: the password in none",
            logs().len()
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_a_command_the_scripts_run_gets_the_rules() {
    let password = "pw-noget-2468";
    let (text, err) = missing_rule("+get", password).await;
    figure(
        "acl_user_without_a_command_the_scripts_run_gets_the_rules",
        format!("without `+get` (run inside the scripts): {text}"),
    );
    assert_refused(&text, &err, &["+get", "~{lock:*"], password);
}

/// With `sync_replicas`, a user without `+wait`: the acquire script runs, `WAIT` is refused.
/// The write does not count, so the lock is released at once (not left for its ttl), and the
/// error names the rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_without_wait_leaves_no_lock_under_sync_replicas() {
    let password = "pw-nowait-2468";
    let rules = RULES.replace("+wait ", "");
    let server = server_with_user("nowait", password, &rules).await;
    let locker = Locker::builder()
        .url(user_url(&server, "nowait", password))
        .sync_replicas(0, ms(100))
        .build()
        .await
        .expect("connect");
    let err = locker
        .acquire("nowait", LockOptions::new().ttl(ms(30_000)).wait(ms(300)))
        .await
        .expect_err("WAIT is refused");
    let text = err.to_string();
    let left = Raw::single(&server.url()).await.lease_left("nowait").await;
    figure(
        "acl_user_without_wait_leaves_no_lock_under_sync_replicas",
        format!("lock left: {left:?}; {text}"),
    );
    assert_eq!(left, None, "the unacknowledged lock was left for its ttl");
    assert_refused(&text, &err, &["+wait"], password);
}
