//! lockrt over TLS (`rediss://`, feature `tls`) against a local `redis-server` that speaks only
//! TLS, with certificates from a private CA made by the test: trusted through `tls_ca_pem`,
//! with a client certificate when the server requires one; without the CA, or without the
//! client certificate, the connect fails with the TLS advice (and never panics inside rustls).
//! The same through Sentinel: sentinels and data servers on TLS only for clients, one CA.
//! Without `tls_ca_pem`, the platform's trust store is used: a CA given only through
//! `SSL_CERT_FILE` is trusted (checked in a child process, the only place the environment is
//! set), and `tls_ca_pem` replaces it.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use lockrt::testing::{RedisSentinelGroup, RedisTlsServer, TlsMaterial};
use lockrt::{LockError, LockOptions, Locker};
use support::topology::{Raw, TempDir, figure, ms, ms_f};
use tokio::time::Instant;

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

/// Set on the child process: the `child_*` test only acts when it is there, and reads the
/// servers and the other CA from these variables.
const CHILD: &str = "LOCKRT_TLS_TEST_CHILD";
const CHILD_URL: &str = "LOCKRT_TLS_TEST_URL";
const CHILD_SENTINELS: &str = "LOCKRT_TLS_TEST_SENTINELS";
const CHILD_OTHER_CA: &str = "LOCKRT_TLS_TEST_OTHER_CA";
/// How long the child may take (it connects a few lockers and hands a lock over twice).
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);

fn in_child() -> bool {
    std::env::var_os(CHILD).is_some()
}

/// Runs the test `name` of this binary in a child process with `vars`, whose trust store is
/// what they say (`SSL_CERT_FILE`, `SSL_CERT_DIR`, neither inherited); killed after
/// [`CHILD_TIMEOUT`].
fn child(name: &str, vars: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("SSL_CERT_FILE")
        .env_remove("SSL_CERT_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let proc = cmd.spawn().unwrap();
    let pid = proc.id();
    let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<Output>>();
    std::thread::spawn(move || {
        let _ = tx.send(proc.wait_with_output());
    });
    let out = match rx.recv_timeout(CHILD_TIMEOUT) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // Our own child, by its pid; the waiting thread then reaps it.
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            panic!("{name}: the child ran longer than {CHILD_TIMEOUT:?}");
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{name}:\n{text}");
    (out.status.success(), text)
}

/// A CA installed for the platform (here through `SSL_CERT_FILE`, as OpenSSL reads it) is
/// trusted without `tls_ca_pem`: a standalone server and a Sentinel group (sentinels and the
/// master they name) whose certificates it signed, lock, hand-over and release. `tls_ca_pem`
/// replaces the platform's roots: with another CA there, the same server is refused.
#[test]
fn tls_trusts_a_ca_installed_for_the_platform() {
    if in_child() {
        return;
    }
    let dir = TempDir::new("tls-platform");
    let m = material(&dir);
    let other_dir = TempDir::new("tls-platform-other");
    let other = material(&other_dir);
    let server = RedisTlsServer::start(&m, false).expect("TLS redis-server");
    let group = RedisSentinelGroup::start_tls("locks", 1, &m).expect("TLS sentinel group");
    let sentinels = group.sentinel_urls().join(",");
    let (ok, out) = child(
        "child_platform_roots",
        &[
            ("SSL_CERT_FILE", &m.ca_cert_path().to_string_lossy()),
            (CHILD_URL, &server.url()),
            (CHILD_SENTINELS, &sentinels),
            (CHILD_OTHER_CA, &other.ca_cert_path().to_string_lossy()),
        ],
    );
    assert!(ok, "the child failed:\n{out}");
    for line in [
        "child: standalone through the platform's roots",
        "child: sentinel through the platform's roots",
        "child: tls_ca_pem replaces the platform's roots",
    ] {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_platform_roots() {
    if !in_child() {
        return;
    }
    let var = |k| std::env::var(k).unwrap();
    let (url, sentinels) = (var(CHILD_URL), var(CHILD_SENTINELS));
    let sentinels: Vec<&str> = sentinels.split(',').collect();
    let ca_file = var("SSL_CERT_FILE");
    let ca = std::fs::read_to_string(&ca_file).unwrap();
    // The direct connections that look at the queues trust the CA explicitly.
    let m = TrustedCa(ca);

    let a = Locker::connect(&url).await.expect("standalone: connect");
    let b = Locker::builder().url(&url).build().await.unwrap();
    let mut raw = m.raw(&url).await;
    let case = "tls_platform_roots_standalone";
    lock_wait_release(&a, &b, &mut raw, case).await;
    println!("child: standalone through the platform's roots");

    let build = || {
        Locker::builder()
            .sentinel(sentinels.clone(), "locks")
            .build()
    };
    let (a, b) = (
        build().await.expect("sentinel: connect"),
        build().await.unwrap(),
    );
    let mut raw = m.raw_sentinel_master(sentinels[0]).await;
    lock_wait_release(&a, &b, &mut raw, "tls_platform_roots_sentinel").await;
    println!("child: sentinel through the platform's roots");

    let other = std::fs::read(var(CHILD_OTHER_CA)).unwrap();
    tls_error(
        Locker::builder().url(&url).tls_ca_pem(other).build().await,
        "tls_ca_pem_replaces_the_platform_roots",
    );
    println!("child: tls_ca_pem replaces the platform's roots");
}

/// The CA PEM, for direct connections that trust it explicitly.
struct TrustedCa(String);

impl TrustedCa {
    async fn raw(&self, url: &str) -> Raw {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.0.as_bytes().to_vec()),
        };
        let client = redis::Client::build_with_tls(url, certs).expect("TLS client");
        Raw::Single(
            client
                .get_multiplexed_async_connection()
                .await
                .expect("direct TLS connection"),
        )
    }

    /// A direct connection to the master `sentinel` names for `locks`.
    async fn raw_sentinel_master(&self, sentinel: &str) -> Raw {
        let Raw::Single(mut conn) = self.raw(sentinel).await else {
            unreachable!()
        };
        let (_host, port): (String, String) = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("locks")
            .query_async(&mut conn)
            .await
            .expect("the sentinel names the master");
        self.raw(&format!("rediss://127.0.0.1:{port}/")).await
    }
}

/// A platform trust store that cannot be read (here an `SSL_CERT_DIR` that does not exist)
/// fails the build at once as a configuration error naming the variables, with or without
/// `tls_ca_pem` (redis-rs reads the store on every connection even then), rather than as an
/// unreachable server that is retried.
#[test]
fn tls_reports_a_broken_platform_trust_store() {
    if in_child() {
        return;
    }
    let dir = TempDir::new("broken-store");
    let m = material(&dir);
    let server = RedisTlsServer::start(&m, false).expect("TLS redis-server");
    let missing = dir.0.join("no-such-dir");
    let (ok, out) = child(
        "child_broken_platform_roots",
        &[
            ("SSL_CERT_FILE", &m.ca_cert_path().to_string_lossy()),
            ("SSL_CERT_DIR", &missing.to_string_lossy()),
            (CHILD_URL, &server.url()),
        ],
    );
    assert!(ok, "the child failed:\n{out}");
    assert!(
        out.contains("child: a broken trust store is a configuration error"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_broken_platform_roots() {
    if !in_child() {
        return;
    }
    let url = std::env::var(CHILD_URL).unwrap();
    let ca = std::fs::read(std::env::var("SSL_CERT_FILE").unwrap()).unwrap();
    for (case, res) in [
        ("tls_broken_trust_store", Locker::connect(&url).await),
        (
            "tls_broken_trust_store_with_tls_ca_pem",
            Locker::builder().url(&url).tls_ca_pem(ca).build().await,
        ),
    ] {
        let err = res.err().unwrap_or_else(|| panic!("{case}: connected"));
        let text = err.to_string();
        figure(case, format!("build failed: {text} ({err:?})"));
        assert!(
            matches!(&err, LockError::Backend(b) if !b.is_transient()),
            "{case}: retried as transient: {err:?}"
        );
        for part in ["trust store", "SSL_CERT_DIR", "no-such-dir"] {
            assert!(text.contains(part), "{case}: {part:?} not named: {text}");
        }
    }
    println!("child: a broken trust store is a configuration error");
}
