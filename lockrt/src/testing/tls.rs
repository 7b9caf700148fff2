//! Throwaway TLS: a private CA with a server and a client certificate ([`TlsMaterial`]), and a
//! `redis-server` that speaks only TLS ([`RedisTlsServer`]).
//!
//! What it owns: generating the certificates (rcgen, ECDSA P-256, PEM files), and the TLS
//! server process, started with `--port 0` so that nothing on it speaks plain TCP, ready when
//! `redis-cli --tls` gets `PONG` through a verified handshake, killed by its pid on drop. It
//! never connects lockrt itself over TLS: that is the `tls` feature's business, and these are
//! its test fixtures.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::process::{Daemon, free_port, redis_cli, redis_server, run_bounded};

/// How long a fresh TLS server may take to answer a TLS `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one `redis-cli` run may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts at finding a port nobody grabs between our probe and the server's bind.
const PORT_ATTEMPTS: usize = 5;

/// A private CA, a server certificate for `127.0.0.1` and `localhost` signed by it, and a
/// client certificate signed by it, as PEM files in one directory.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use lockrt::testing::{RedisTlsServer, TlsMaterial};
///
/// let dir = tempfile::tempdir()?;
/// let tls = TlsMaterial::generate(dir.path())?;
/// let server = RedisTlsServer::start(&tls, true)?; // clients must show a certificate
/// let url = server.url();                          // rediss://127.0.0.1:<port>/
/// let root = tls.ca_cert_pem();                    // trust this to verify the server
/// # let _ = (url, root); Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    dir: PathBuf,
    ca_cert: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

/// A fresh self-signed CA: the issuer of the test's leaf certificates, and its PEM.
fn test_ca() -> Result<(Issuer<'static, KeyPair>, String), rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "lockrt test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let pem = ca.self_signed(&ca_key)?.pem();
    Ok((Issuer::new(ca, ca_key), pem))
}

impl TlsMaterial {
    /// Generates fresh keys and certificates and writes them to `dir` (created if missing) as
    /// `ca.crt`, `server.crt`, `server.key`, `client.crt` and `client.key`. Every call makes
    /// a new CA, so two calls give two CAs that don't trust each other.
    pub fn generate(dir: impl AsRef<Path>) -> io::Result<TlsMaterial> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let fail =
            |e: rcgen::Error| io::Error::other(format!("generating a test certificate: {e}"));

        let (issuer, ca_pem) = test_ca().map_err(fail)?;
        let leaf =
            |names: Vec<String>, cn: &str, usage| -> Result<(String, String), rcgen::Error> {
                let key = KeyPair::generate()?;
                let mut params = CertificateParams::new(names)?;
                params.distinguished_name.push(DnType::CommonName, cn);
                params.use_authority_key_identifier_extension = true;
                params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
                params.extended_key_usages = vec![usage];
                let cert = params.signed_by(&key, &issuer)?;
                Ok((cert.pem(), key.serialize_pem()))
            };
        let server_names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
        let (server_cert, server_key) = leaf(
            server_names,
            "localhost",
            ExtendedKeyUsagePurpose::ServerAuth,
        )
        .map_err(fail)?;
        let (client_cert, client_key) = leaf(
            Vec::new(),
            "lockrt test client",
            ExtendedKeyUsagePurpose::ClientAuth,
        )
        .map_err(fail)?;

        let material = TlsMaterial {
            dir,
            ca_cert: ca_pem,
            server_cert,
            server_key,
            client_cert,
            client_key,
        };
        std::fs::write(material.ca_cert_path(), &material.ca_cert)?;
        std::fs::write(material.server_cert_path(), &material.server_cert)?;
        std::fs::write(material.server_key_path(), &material.server_key)?;
        std::fs::write(material.client_cert_path(), &material.client_cert)?;
        std::fs::write(material.client_key_path(), &material.client_key)?;
        Ok(material)
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ca.crt`: the CA certificate that verifies the server (and, on the server, clients).
    pub fn ca_cert_path(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `server.crt`: the server certificate (subject alternative names `127.0.0.1` and
    /// `localhost`).
    pub fn server_cert_path(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// `server.key`: the server's private key (PKCS#8).
    pub fn server_key_path(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// `client.crt`: the client certificate.
    pub fn client_cert_path(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// `client.key`: the client's private key (PKCS#8).
    pub fn client_key_path(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// The CA certificate, PEM.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca_cert
    }

    /// The client certificate, PEM.
    pub fn client_cert_pem(&self) -> &str {
        &self.client_cert
    }

    /// The client's private key, PEM (PKCS#8).
    pub fn client_key_pem(&self) -> &str {
        &self.client_key
    }
}

/// A `redis-server` child process that speaks only TLS, on a free loopback port.
///
/// It runs with `--port 0 --tls-port <port>`, the [`TlsMaterial`]'s server certificate and
/// key, its CA for client certificates, and `--tls-auth-clients yes` or `no`.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use lockrt::testing::{RedisTlsServer, TlsMaterial};
///
/// let dir = tempfile::tempdir()?;
/// let tls = TlsMaterial::generate(dir.path())?;
/// let server = RedisTlsServer::start(&tls, false)?;
/// assert_eq!(server.cli_ping(Some(&tls), false)?, "PONG"); // verified with the test CA
/// assert!(server.cli_ping(None, false).is_err());          // the system's CAs don't know it
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisTlsServer {
    // Before `dir`: the server is killed before its directory is removed.
    daemon: Daemon,
    _dir: tempfile::TempDir,
    require_client_cert: bool,
}

impl RedisTlsServer {
    /// Starts the server and waits until `redis-cli --tls` (verifying it with the CA, and
    /// showing the client certificate) gets `PONG`.
    ///
    /// With `require_client_cert`, clients without a certificate signed by the CA are refused
    /// during the handshake. Fails with the install command when `redis-server` or `redis-cli`
    /// is missing.
    pub fn start(material: &TlsMaterial, require_client_cert: bool) -> io::Result<RedisTlsServer> {
        let dir = tempfile::Builder::new()
            .prefix("lockrt-redis-tls-")
            .tempdir()?;
        let log = dir.path().join("redis.log");
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut cmd = redis_server();
            cmd.args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ]);
            cmd.args(["--save", "", "--appendonly", "no", "--daemonize", "no"]);
            cmd.args(["--loglevel", "warning", "--protected-mode", "yes"]);
            cmd.arg("--dir").arg(dir.path()).arg("--logfile").arg(&log);
            cmd.arg("--tls-cert-file").arg(material.server_cert_path());
            cmd.arg("--tls-key-file").arg(material.server_key_path());
            cmd.arg("--tls-ca-cert-file").arg(material.ca_cert_path());
            let auth = if require_client_cert { "yes" } else { "no" };
            cmd.args(["--tls-auth-clients", auth]);
            let ready = |p: u16| tls_ping(p, Some(material), true).is_ok();
            match Daemon::start(cmd, port, log.clone(), READY_TIMEOUT, ready) {
                Ok(daemon) => {
                    return Ok(RedisTlsServer {
                        daemon,
                        _dir: dir,
                        require_client_cert,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("could not start a TLS redis-server")))
    }

    /// `rediss://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.daemon.port())
    }

    /// The TLS port (there is no plain one).
    pub fn port(&self) -> u16 {
        self.daemon.port()
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.daemon.pid()
    }

    /// Whether clients must show a certificate signed by the CA.
    pub fn requires_client_cert(&self) -> bool {
        self.require_client_cert
    }

    /// Sends `PING` with `redis-cli --tls`, verifying the server with `material`'s CA (or, with
    /// `None`, with the system's trust store, which does not know the test CA) and showing the
    /// client certificate when `client_cert`. `Ok` holds the reply; `Err` says why it failed.
    pub fn cli_ping(
        &self,
        material: Option<&TlsMaterial>,
        client_cert: bool,
    ) -> io::Result<String> {
        tls_ping(self.port(), material, client_cert)
    }

    /// Kills the server at once (SIGKILL).
    pub fn kill(&mut self) {
        self.daemon.kill();
    }

    /// Freezes the server (SIGSTOP).
    pub fn pause(&self) -> io::Result<()> {
        self.daemon.signal("-STOP")
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        self.daemon.signal("-CONT")
    }
}

fn tls_ping(port: u16, material: Option<&TlsMaterial>, client_cert: bool) -> io::Result<String> {
    let mut cmd: Command = redis_cli();
    cmd.args(["--tls", "-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(m) = material {
        cmd.arg("--cacert").arg(m.ca_cert_path());
        if client_cert {
            cmd.arg("--cert").arg(m.client_cert_path());
            cmd.arg("--key").arg(m.client_key_path());
        }
    }
    cmd.arg("PING");
    let out = run_bounded(&mut cmd, CLI_TIMEOUT)?;
    let reply = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && reply == "PONG" {
        Ok(reply)
    } else {
        Err(io::Error::other(format!(
            "redis-cli --tls PING to port {port} failed ({}): {reply} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
