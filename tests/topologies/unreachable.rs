//! Redis unreachable at connect or at acquire: a `Backend` error that names the address,
//! quickly, without panic or hang; and credentials never leak into errors, Debug or logs.

use crate::support;

use std::time::Duration;

use lockrt::{LockError, Locker};
use support::{ms, opts};
use tokio::time::Instant;

fn dead_port() -> u16 {
    // Bound and dropped: nothing listens there afterwards.
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn connect_to_a_dead_port_fails_fast_naming_the_address() {
    let port = dead_port();
    let start = Instant::now();
    let err = Locker::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(start.elapsed() < ms(2_000), "took {:?}", start.elapsed());
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
}

#[tokio::test]
async fn invalid_url_is_a_clear_error() {
    let err = Locker::connect("http://:secret@nowhere").await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(text.contains("invalid Redis URL"), "{text}");
    assert!(!text.contains("secret"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_while_redis_is_down_is_a_backend_error_within_wait_plus_1s() {
    let mut fx = support::Fx::redis();
    let locker = fx.locker().await;
    fx.server().kill();
    let wait = ms(500);
    let start = Instant::now();
    let err = locker.acquire("down", opts().wait(wait)).await.unwrap_err();
    let took = start.elapsed();
    assert!(err.is_backend(), "{err:?}");
    assert!(took <= wait + Duration::from_secs(1), "took {took:?}");
    assert!(
        err.to_string()
            .contains(&format!("127.0.0.1:{}", fx.server().port())),
        "{err}"
    );

    // A paused server (no answers at all) is bounded the same way.
    fx.server().restart().unwrap();
    let locker = Locker::builder()
        .url(fx.server().url())
        .response_timeout(ms(200))
        .build()
        .await
        .unwrap();
    fx.server().pause().unwrap();
    let start = Instant::now();
    let err = locker.acquire("down", opts().wait(wait)).await.unwrap_err();
    assert!(err.is_backend(), "{err:?}");
    assert!(
        start.elapsed() <= wait + Duration::from_secs(1),
        "took {:?}",
        start.elapsed()
    );
    fx.server().resume().unwrap();
}

// One thread: the subscriber below is this thread's default, and the locker's tasks log too.
#[tokio::test(flavor = "current_thread")]
async fn password_appears_in_no_error_debug_output_or_log_line() {
    let (logs, subscriber) = support::logs::capture(tracing::Level::TRACE);
    let _default = tracing::subscriber::set_default(subscriber);

    let secret = "s3cr3t-pa55";
    let mut server = lockrt::testing::RedisServer::start_with(&["--requirepass", secret]).unwrap();
    let port = server.port();
    let mut seen = Vec::new();

    // Wrong password, dead port, right password then server killed mid-use.
    for url in [
        format!("redis://:{secret}x@127.0.0.1:{port}/"),
        format!("redis://:{secret}@127.0.0.1:{}/", dead_port()),
    ] {
        let err = Locker::connect(&url).await.unwrap_err();
        seen.push(format!("{err} {err:?}"));
    }
    let builder = Locker::builder().url(format!("redis://:{secret}@127.0.0.1:{port}/"));
    seen.push(format!("{builder:?}"));
    let locker = builder.response_timeout(ms(200)).build().await.unwrap();
    seen.push(format!("{locker:?}"));
    let guard = locker.acquire("pw", opts().ttl(ms(600))).await.unwrap();
    seen.push(format!("{guard:?}"));
    let waiter = locker.clone();
    let l2 = Locker::connect(&format!("redis://:{secret}@127.0.0.1:{port}/"))
        .await
        .unwrap();
    let w = tokio::spawn(async move { l2.acquire("pw", opts().wait(ms(3_000))).await.map(|_| ()) });
    server.kill();
    tokio::time::timeout(ms(3_000), guard.lost()).await.unwrap();
    let err = waiter
        .acquire("pw2", opts().wait(ms(100)))
        .await
        .unwrap_err();
    seen.push(format!("{err} {err:?}"));
    if let Err(e) = w.await.unwrap() {
        seen.push(format!("{e} {e:?}"));
    }
    drop(guard);
    tokio::time::sleep(ms(300)).await;

    let logs = String::from_utf8(logs.bytes()).unwrap();
    assert!(!logs.is_empty(), "expected log lines from the failures");
    for text in seen.iter().chain(std::iter::once(&logs)) {
        assert!(!text.contains(secret), "password leaked: {text}");
    }
    assert!(
        seen[0].contains(&format!("127.0.0.1:{port}")),
        "{}",
        seen[0]
    );
}
