//! A `redis::Client` for one URL with the builder's TLS material, whatever the topology.
//!
//! TLS (feature `tls`) uses rustls with a crypto provider this crate installs. Servers are
//! verified with the platform's trust store (redis-rs reads it with rustls-native-certs on
//! every new connection, honouring `SSL_CERT_FILE` and `SSL_CERT_DIR`), or with a private CA
//! that replaces it; a client certificate is presented when given.

use redis::Client;
#[cfg(feature = "tls")]
use redis::ConnectionAddr;

use crate::backend::redis::settings::TlsFiles;

/// The error for a topology whose cargo feature is off.
pub(crate) fn feature_missing() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "this topology needs a cargo feature of lockrt",
        "enable `cluster` for Redis Cluster or `sentinel` for Sentinel".to_owned(),
    ))
}

/// A client for `url`, with the TLS material when there is any.
pub(crate) fn client(url: &str, tls: &TlsFiles) -> redis::RedisResult<Client> {
    #[cfg(feature = "tls")]
    install_crypto_provider();
    let client = if tls.is_empty() {
        Client::open(url)?
    } else {
        #[cfg(feature = "tls")]
        {
            Client::build_with_tls(url, certificates(tls))?
        }
        #[cfg(not(feature = "tls"))]
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS settings need lockrt's `tls` feature",
        )));
    };
    #[cfg(feature = "tls")]
    if matches!(
        client.get_connection_info().addr(),
        ConnectionAddr::TcpTls { .. }
    ) {
        check_platform_roots()?;
    }
    Ok(client)
}

/// The password `c` logs in with, if any: to scrub from messages.
pub(crate) fn password(c: &Client) -> Option<String> {
    let settings = c.get_connection_info().redis_settings();
    settings.password().map(str::to_owned)
}

/// redis-rs reads the platform's trust store on every TLS connection and refuses to connect
/// when any part of it fails to load (a missing `SSL_CERT_DIR`, an unreadable file), even
/// with `tls_ca_pem`, with an I/O error that reads like an unreachable server and is retried
/// as one. Reading it once here reports that at build, as the configuration error it is.
#[cfg(feature = "tls")]
fn check_platform_roots() -> redis::RedisResult<()> {
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let broken = match loaded.errors.first() {
        Some(e) => Some(e.to_string()),
        None => loaded
            .certs
            .into_iter()
            .find_map(|cert| roots.add(cert).err().map(|e| e.to_string())),
    };
    match broken {
        None => Ok(()),
        Some(why) => Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "the platform's trust store could not be read",
            format!(
                "{why}; fix or unset SSL_CERT_FILE and SSL_CERT_DIR, or repair the system's \
                 certificate files"
            ),
        ))),
    }
}

/// The TLS material as redis-rs takes it.
#[cfg(feature = "tls")]
pub(crate) fn certificates(tls: &TlsFiles) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: tls
            .client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: tls.ca.clone(),
    }
}

/// rustls needs one process-wide crypto provider; without it, the first `rediss://`
/// connection panics inside rustls. Installing ours is a no-op when the application already
/// installed one.
#[cfg(feature = "tls")]
pub(crate) fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
