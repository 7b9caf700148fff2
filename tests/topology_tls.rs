//! lockrt over TLS (`rediss://`, feature `tls`) against a local `redis-server` that speaks only
//! TLS, with certificates from a private CA made by the test: trusted through `tls_ca_pem`,
//! with a client certificate when the server requires one; without the CA, or without the
//! client certificate, the connect fails with the TLS advice (and never panics inside rustls).
//! The same through Sentinel: sentinels and data servers on TLS only for clients, one CA.

mod topology_support;

use lockrt::testing::{RedisSentinelGroup, RedisTlsServer, TlsMaterial};
use lockrt::{LockError, LockOptions, Locker};
use tokio::time::Instant;
use topology_support::{Raw, TempDir, figure, ms, ms_f};

fn material(dir: &TempDir) -> TlsMaterial {
    TlsMaterial::generate(&dir.0).expect("generate a CA and certificates")
}

/// Acquire, a waiter in a second locker woken over TLS pub/sub, release.
async fn lock_wait_release(a: &Locker, b: &Locker, raw: &mut Raw, case: &str) {
    let guard = a
        .acquire("tls", LockOptions::new().ttl(ms(2_000)))
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            let g = b.acquire("tls", LockOptions::new().wait(ms(5_000))).await;
            (Instant::now(), g)
        })
    };
    raw.until_queued("tls", 1).await;
    let released = Instant::now();
    guard
        .release()
        .await
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    let (got, g) = waiter.await.unwrap();
    let g = g.unwrap_or_else(|e| panic!("{case}: waiter: {e}"));
    g.release().await.unwrap();
    let handoff = got - released;
    figure(
        case,
        format!(
            "acquire, waiter woken {} after the release, release: Ok",
            ms_f(handoff)
        ),
    );
    assert!(
        handoff < ms(500),
        "{case}: waiter woken by the fallback timer: {handoff:?}"
    );
}

/// A direct TLS connection, to look at the lock's queue.
async fn raw(server: &RedisTlsServer, m: &TlsMaterial, client_cert: bool) -> Raw {
    raw_at(&server.url(), m, client_cert).await
}

async fn raw_at(url: &str, m: &TlsMaterial, client_cert: bool) -> Raw {
    let certs = redis::TlsCertificates {
        client_tls: client_cert.then(|| redis::ClientTlsConfig {
            client_cert: m.client_cert_pem().as_bytes().to_vec(),
            client_key: m.client_key_pem().as_bytes().to_vec(),
        }),
        root_cert: Some(m.ca_cert_pem().as_bytes().to_vec()),
    };
    let client = redis::Client::build_with_tls(url, certs).expect("TLS client");
    Raw::Single(
        client
            .get_multiplexed_async_connection()
            .await
            .expect("direct TLS connection"),
    )
}

fn tls_error(res: Result<Locker, LockError>, case: &str) -> String {
    let err = res.err().unwrap_or_else(|| panic!("{case}: connected"));
    let text = err.to_string();
    figure(case, format!("connect failed: {text}"));
    assert!(text.contains("TLS failed"), "{case}: no TLS advice: {text}");
    assert!(
        matches!(&err, LockError::Backend(b) if !b.is_transient()),
        "{case}: a TLS failure is not transient: {err:?}"
    );
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca() {
    let dir = TempDir::new("tls-ca");
    let m = material(&dir);
    let server = RedisTlsServer::start(&m, false).expect("TLS redis-server");
    let build = || {
        Locker::builder()
            .url(server.url())
            .tls_ca_pem(m.ca_cert_pem())
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let mut raw = raw(&server, &m, false).await;
    lock_wait_release(&a, &b, &mut raw, "tls_with_a_private_ca").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_client_certificate_the_server_requires() {
    let dir = TempDir::new("tls-client");
    let m = material(&dir);
    let server = RedisTlsServer::start(&m, true).expect("TLS redis-server");
    let build = || {
        Locker::builder()
            .url(server.url())
            .tls_ca_pem(m.ca_cert_pem())
            .tls_client_cert_pem(m.client_cert_pem(), m.client_key_pem())
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let mut raw = raw(&server, &m, true).await;
    let case = "tls_with_a_client_certificate_the_server_requires";
    lock_wait_release(&a, &b, &mut raw, case).await;
    // The same server refuses a client without a certificate.
    let without = Locker::builder()
        .url(server.url())
        .tls_ca_pem(m.ca_cert_pem())
        .build()
        .await;
    tls_error(
        without,
        "tls_client_certificate_missing_fails_with_the_tls_advice",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_without_the_ca_fails_with_the_tls_advice() {
    let dir = TempDir::new("tls-noca");
    let m = material(&dir);
    let server = RedisTlsServer::start(&m, false).expect("TLS redis-server");
    // The system roots don't know the test CA.
    tls_error(
        Locker::connect(&server.url()).await,
        "tls_without_the_ca_fails_with_the_tls_advice",
    );
    // Another CA's certificate does not verify it either.
    let other_dir = TempDir::new("tls-other");
    let other = material(&other_dir);
    let wrong = Locker::builder()
        .url(server.url())
        .tls_ca_pem(other.ca_cert_pem())
        .build()
        .await;
    tls_error(wrong, "tls_with_another_ca_fails_with_the_tls_advice");
}

/// Sentinels and data servers speaking TLS with certificates of the test's private CA: the
/// CA given to the builder is used for the sentinels and for the master they name; without
/// it, the connect fails with the TLS advice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_sentinel_with_a_private_ca() {
    let dir = TempDir::new("tls-sentinel");
    let m = material(&dir);
    let group = RedisSentinelGroup::start_tls("locks", 1, &m).expect("TLS sentinel group");
    let urls = group.sentinel_urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let build = || {
        Locker::builder()
            .sentinel(urls.clone(), "locks")
            .tls_ca_pem(m.ca_cert_pem())
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let master = format!("rediss://127.0.0.1:{}/", group.master_port().unwrap());
    let mut raw = raw_at(&master, &m, false).await;
    lock_wait_release(&a, &b, &mut raw, "tls_sentinel_with_a_private_ca").await;
    tls_error(
        Locker::builder()
            .sentinel(urls.clone(), "locks")
            .build()
            .await,
        "tls_sentinel_without_the_ca_fails_with_the_tls_advice",
    );
}
