//! How to reach the lock server(s): one standalone server, a Redis Cluster, or the master a
//! group of Sentinels names. Everything above this module sees one [`Conn`] that runs commands
//! and one [`Client`] to subscribe on; only this module knows the topology.
//!
//! - Standalone: a `Client` from a URL (or one the caller built).
//! - Cluster (feature `cluster`): redis-rs's cluster connection, which routes every lock
//!   script to its key's slot (all names of one lock share a slot). Release messages use
//!   classic `PUBLISH`, which a cluster forwards to every node, so the subscriber listens on
//!   any one node and moves to the next when that node fails.
//! - Sentinel (feature `sentinel`): the master is resolved from the Sentinels on every new
//!   connection; a connection that hits `READONLY` (a demoted master) or fails is replaced,
//!   which resolves the master again. A task (`SwitchWatch`) listens for the Sentinels'
//!   `+switch-master` of the service and counts switches: a connection opened before the
//!   latest switch is stale and gets replaced before its next command, because a demoted
//!   master keeps accepting writes for seconds after the switch.
//!
//! TLS (feature `tls`) uses rustls with a crypto provider this crate installs. Servers are
//! verified with the platform's trust store (redis-rs reads it with rustls-native-certs on
//! every new connection, honouring `SSL_CERT_FILE` and `SSL_CERT_DIR`), or with a private CA
//! that replaces it; a client certificate is presented when given. Both for every topology.
//! With Sentinel, `rediss://` sentinel URLs make the master connections TLS too, with the same
//! CA and client certificate.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisFuture, Value};

#[cfg(feature = "sentinel")]
pub(crate) use switch::SwitchWatch;

/// Where the servers are, as configured on the builder.
#[derive(Clone)]
pub(crate) enum Topology {
    /// A standalone server's URL.
    Url(String),
    /// A client the caller built.
    Client(Client),
    /// Seed URLs of a Redis Cluster.
    Cluster(Vec<String>),
    /// Sentinel URLs and the monitored service's name; the masters' own credentials when
    /// they are not the sentinel URLs'.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        master_auth: Option<Auth>,
    },
}

/// A user name (`None`: the default user) and password.
#[derive(Clone)]
// Read only by the Sentinel connector.
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) struct Auth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

/// TLS material in PEM: a private CA to trust instead of the platform's trust store, and a
/// client certificate with its key for servers that require one.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }
}

/// A connection that runs commands, whichever the topology.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    /// Sends `pipe` as one batch to the server that owns `slot`: the only server of a
    /// standalone or Sentinel connection, the slot's master on a Cluster. A `WAIT` in `pipe`
    /// thus follows the script before it on the same node connection and counts its writes.
    /// (redis-rs follows a `MOVED` inside the batch as for any request, refreshing its slot
    /// map.)
    pub(crate) async fn pipeline_at(
        &mut self,
        pipe: Pipeline,
        slot: u16,
    ) -> redis::RedisResult<Vec<Value>> {
        #[cfg(not(feature = "cluster"))]
        let _ = slot;
        match self {
            Conn::Single(c) => c.req_packed_commands(&pipe, 0, pipe.len()).await,
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let route = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
                let n = pipe.len();
                c.route_pipeline(pipe, 0, n, route).await
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Opens connections to the configured topology.
// One per `Locker`, behind an `Arc`: the size difference between topologies costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Connector {
    Single(Client),
    #[cfg(feature = "cluster")]
    Cluster {
        client: redis::cluster::ClusterClient,
        /// One client per seed, to subscribe on (any node hears every release message).
        nodes: Vec<Client>,
    },
    #[cfg(feature = "sentinel")]
    Sentinel {
        /// Asks the sentinels for the master, and builds its client (credentials, TLS mode and
        /// certificates of the sentinel URLs and the builder).
        sentinel: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        service: String,
        first: Client,
        switches: SwitchWatch,
        /// The masters' password, when it is not the sentinel URLs'.
        master_password: Option<String>,
    },
}

impl Connector {
    /// Parses the topology; nothing is contacted yet.
    pub(crate) fn new(
        topology: Topology,
        tls: &TlsFiles,
        timeouts: super::remote::Timeouts,
    ) -> redis::RedisResult<Connector> {
        #[cfg(not(feature = "cluster"))]
        let _ = timeouts;
        match topology {
            Topology::Url(url) => Ok(Connector::Single(client(&url, tls)?)),
            Topology::Client(c) => Ok(Connector::Single(c)),
            #[cfg(feature = "cluster")]
            Topology::Cluster(seeds) => cluster(&seeds, tls, timeouts),
            #[cfg(feature = "sentinel")]
            Topology::Sentinel {
                sentinels,
                service,
                master_auth,
            } => sentinel(&sentinels, service, master_auth, tls),
            #[allow(unreachable_patterns)]
            _ => Err(feature_missing()),
        }
    }

    /// A new connection to where lock scripts must run.
    pub(crate) async fn connect(&self, cfg: &AsyncConnectionConfig) -> redis::RedisResult<Conn> {
        match self {
            Connector::Single(c) => c
                .get_multiplexed_async_connection_with_config(cfg)
                .await
                .map(Conn::Single),
            #[cfg(feature = "cluster")]
            Connector::Cluster { client, .. } => {
                client.get_async_connection().await.map(Conn::Cluster)
            }
            #[cfg(feature = "sentinel")]
            Connector::Sentinel { .. } => self
                .master()
                .await?
                .get_multiplexed_async_connection_with_config(cfg)
                .await
                .map(Conn::Single),
        }
    }

    /// The server to subscribe on for release messages; `round` counts reconnections, so a
    /// cluster subscriber moves on to the next node after a failure.
    pub(crate) async fn pubsub_client(&self, round: usize) -> redis::RedisResult<Client> {
        #[cfg(not(feature = "cluster"))]
        let _ = round;
        match self {
            Connector::Single(c) => Ok(c.clone()),
            #[cfg(feature = "cluster")]
            Connector::Cluster { nodes, .. } => Ok(nodes[round % nodes.len()].clone()),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel { .. } => self.master().await,
        }
    }

    #[cfg(feature = "sentinel")]
    async fn master(&self) -> redis::RedisResult<Client> {
        let Connector::Sentinel { sentinel, .. } = self else {
            unreachable!("only called on a sentinel connector")
        };
        sentinel.lock().await.async_get_client().await
    }

    /// Master switches seen so far (always 0 without Sentinel): a connection opened before
    /// the count last moved talks to a demoted master. Restarts the watching task when its
    /// runtime ended.
    pub(crate) fn epoch(&self) -> u64 {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel { switches, .. } = self {
            return switches.epoch();
        }
        0
    }

    /// Notified on each master switch (Sentinel only), for the subscriber.
    pub(crate) fn switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel { switches, .. } = self {
            return Some(switches.subscribe());
        }
        None
    }

    /// Clients for every master of a Cluster, from `CLUSTER SLOTS` asked over `conn` (with
    /// the seeds' credentials; what scans every node needs). `None` for other topologies,
    /// where `conn` reaches the one server that holds every lock.
    pub(crate) async fn masters(&self, conn: &mut Conn) -> redis::RedisResult<Option<Vec<Client>>> {
        #[cfg(feature = "cluster")]
        if let Connector::Cluster { nodes, .. } = self {
            let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
            let template = nodes[0].get_connection_info().clone();
            let mut addrs: Vec<(String, u16)> = master_addrs(&slots);
            addrs.sort();
            addrs.dedup();
            let clients = addrs
                .into_iter()
                .map(|(host, port)| {
                    let addr = match template.addr() {
                        ConnectionAddr::TcpTls {
                            insecure,
                            tls_params,
                            ..
                        } => ConnectionAddr::TcpTls {
                            host,
                            port,
                            insecure: *insecure,
                            tls_params: tls_params.clone(),
                        },
                        _ => ConnectionAddr::Tcp(host, port),
                    };
                    Client::open(template.clone().set_addr(addr))
                })
                .collect::<redis::RedisResult<Vec<Client>>>()?;
            return Ok(Some(clients));
        }
        let _ = conn;
        Ok(None)
    }

    /// Whether lock scripts may go to different servers (a renewal batch must then stay
    /// within one slot).
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if matches!(self, Connector::Cluster { .. }) {
            return true;
        }
        false
    }

    /// Where the servers are, for messages: no credentials.
    pub(crate) fn describe(&self) -> String {
        match self {
            Connector::Single(c) => describe_addr(c.get_connection_info().addr()),
            #[cfg(feature = "cluster")]
            Connector::Cluster { nodes, .. } => {
                let seeds: Vec<String> = nodes
                    .iter()
                    .map(|c| describe_addr(c.get_connection_info().addr()))
                    .collect();
                format!("cluster {}", seeds.join(","))
            }
            #[cfg(feature = "sentinel")]
            Connector::Sentinel { service, first, .. } => format!(
                "sentinel service {service:?} via {}",
                describe_addr(first.get_connection_info().addr())
            ),
        }
    }

    /// The password, to scrub from messages.
    pub(crate) fn secrets(&self) -> Vec<String> {
        let (c, more) = match self {
            Connector::Single(c) => (c, None),
            #[cfg(feature = "cluster")]
            Connector::Cluster { nodes, .. } => (&nodes[0], None),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel {
                first,
                master_password,
                ..
            } => (first, master_password.clone()),
        };
        let url = c.get_connection_info().redis_settings().password();
        url.map(str::to_owned).into_iter().chain(more).collect()
    }
}

fn feature_missing() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::InvalidClientConfig,
        "this topology needs a cargo feature of lockrt",
        "enable `cluster` for Redis Cluster or `sentinel` for Sentinel".to_owned(),
    ))
}

/// A client for `url`, with the TLS material when there is any.
fn client(url: &str, tls: &TlsFiles) -> redis::RedisResult<Client> {
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

#[cfg(feature = "tls")]
fn certificates(tls: &TlsFiles) -> redis::TlsCertificates {
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

/// Retries of one cluster request (redirections, `TRYAGAIN`, a refreshed slot map).
#[cfg(feature = "cluster")]
const CLUSTER_RETRIES: u32 = 4;
/// Shortest and longest pause before such a retry, in ms (doubling from the shortest).
#[cfg(feature = "cluster")]
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 200);

#[cfg(feature = "cluster")]
fn cluster(
    seeds: &[String],
    tls: &TlsFiles,
    timeouts: super::remote::Timeouts,
) -> redis::RedisResult<Connector> {
    let nodes = seeds
        .iter()
        .map(|s| client(s, tls))
        .collect::<redis::RedisResult<Vec<Client>>>()?;
    if nodes.is_empty() {
        return Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a cluster needs at least one seed URL",
        )));
    }
    // Redirections and TRYAGAIN (a slot in migration) are retried by redis-rs, a few times
    // and within milliseconds: its default waits at least 1.28 s per retry, longer than a
    // response may take here (the response timeout also bounds the retries).
    #[allow(unused_mut)]
    let mut builder = redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
        .retry_wait_formula(CLUSTER_RETRY_WAIT_MS.0, 2);
    #[cfg(feature = "tls")]
    if !tls.is_empty() {
        builder = builder.certs(certificates(tls));
    }
    Ok(Connector::Cluster {
        client: builder.build()?,
        nodes,
    })
}

#[cfg(feature = "sentinel")]
fn sentinel(
    sentinels: &[String],
    service: String,
    master_auth: Option<Auth>,
    tls: &TlsFiles,
) -> redis::RedisResult<Connector> {
    use redis::IntoConnectionInfo;
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let first = client(
        sentinels.first().ok_or_else(|| {
            redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "sentinel needs at least one sentinel URL",
            ))
        })?,
        tls,
    )?;
    let infos = sentinels
        .iter()
        .map(|s| s.as_str().into_connection_info())
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let mut builder = SentinelClientBuilder::new(
        infos.iter().map(|i| i.addr().clone()),
        &service,
        SentinelServerType::Master,
    )?;
    // The sentinels use the credentials of the first URL; the masters too, unless they have
    // their own. Both use its TLS mode.
    let settings = infos[0].redis_settings();
    if let Some(user) = settings.username() {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = settings.password() {
        builder = builder.set_client_to_sentinel_password(password);
    }
    let master = master_auth.clone().unwrap_or_else(|| Auth {
        username: settings.username().map(str::to_owned),
        password: settings.password().unwrap_or_default().to_owned(),
    });
    if let Some(user) = &master.username {
        builder = builder.set_client_to_redis_username(user);
    }
    if !master.password.is_empty() {
        builder = builder.set_client_to_redis_password(&master.password);
    }
    builder = builder.set_client_to_redis_db(settings.db());
    if let ConnectionAddr::TcpTls { insecure, .. } = infos[0].addr() {
        builder = builder.set_client_to_redis_tls_mode(if *insecure {
            redis::TlsMode::Insecure
        } else {
            redis::TlsMode::Secure
        });
        #[cfg(feature = "tls")]
        if !tls.is_empty() {
            builder = builder
                .set_client_to_sentinel_certificates(certificates(tls))
                .set_client_to_redis_certificates(certificates(tls));
        }
    }
    let watchers = sentinels
        .iter()
        .map(|s| client(s, tls))
        .collect::<redis::RedisResult<Vec<Client>>>()?;
    Ok(Connector::Sentinel {
        sentinel: tokio::sync::Mutex::new(builder.build()?),
        switches: SwitchWatch::new(watchers, service.clone()),
        service,
        first,
        master_password: master_auth.map(|a| a.password),
    })
}

/// Following `+switch-master`: the counter, and the task that keeps it.
#[cfg(feature = "sentinel")]
mod switch {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use futures_util::StreamExt;
    use redis::Client;
    use tokio::sync::watch;
    use tokio_util::sync::CancellationToken;

    /// Longest time to connect to a Sentinel and subscribe.
    const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(2);
    /// Pause before trying the next Sentinel.
    const RETRY_DELAY: Duration = Duration::from_millis(200);

    /// Counts the master switches of one service that the Sentinels announce. The task that
    /// listens runs on the runtime of the first caller (and again on a later caller's when
    /// that runtime ended); it stops when this is dropped.
    pub(crate) struct SwitchWatch {
        sentinels: Vec<Client>,
        service: String,
        epoch: watch::Sender<u64>,
        running: Arc<AtomicBool>,
        stop: CancellationToken,
    }

    impl SwitchWatch {
        pub(crate) fn new(sentinels: Vec<Client>, service: String) -> SwitchWatch {
            SwitchWatch {
                sentinels,
                service,
                epoch: watch::Sender::new(0),
                running: Arc::new(AtomicBool::new(false)),
                stop: CancellationToken::new(),
            }
        }

        pub(crate) fn epoch(&self) -> u64 {
            self.ensure_running();
            *self.epoch.borrow()
        }

        pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
            self.ensure_running();
            self.epoch.subscribe()
        }

        fn ensure_running(&self) {
            if self.running.load(Ordering::Acquire) || self.running.swap(true, Ordering::AcqRel) {
                return;
            }
            let Ok(rt) = tokio::runtime::Handle::try_current() else {
                self.running.store(false, Ordering::Release);
                return;
            };
            let task = Follow {
                sentinels: self.sentinels.clone(),
                service: self.service.clone(),
                epoch: self.epoch.clone(),
                stop: self.stop.clone(),
                _running: Running(self.running.clone()),
            };
            rt.spawn(task.run());
        }
    }

    impl Drop for SwitchWatch {
        fn drop(&mut self) {
            self.stop.cancel();
        }
    }

    /// Clears the running flag however the task ends (also when its runtime drops it).
    struct Running(Arc<AtomicBool>);

    impl Drop for Running {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }

    struct Follow {
        sentinels: Vec<Client>,
        service: String,
        epoch: watch::Sender<u64>,
        stop: CancellationToken,
        _running: Running,
    }

    impl Follow {
        /// Listens on one Sentinel at a time, moving to the next when it fails. Every
        /// subscription but the first counts as a switch: one may have been announced while
        /// nobody listened.
        async fn run(self) {
            for round in 0usize.. {
                let sentinel = &self.sentinels[round % self.sentinels.len()];
                let subscribed = tokio::time::timeout(SUBSCRIBE_TIMEOUT, async {
                    let mut ps = sentinel.get_async_pubsub().await?;
                    ps.subscribe("+switch-master").await?;
                    Ok::<_, redis::RedisError>(ps)
                });
                let subscribed = tokio::select! {
                    () = self.stop.cancelled() => return,
                    s = subscribed => s,
                };
                if let Ok(Ok(ps)) = subscribed {
                    if round > 0 {
                        self.bump();
                    }
                    if self.listen(ps.into_on_message()).await.is_break() {
                        return;
                    }
                }
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY_DELAY) => {}
                }
            }
        }

        /// Counts this service's switches until the connection ends (`Continue`) or the
        /// watch is dropped (`Break`).
        async fn listen(
            &self,
            mut messages: redis::aio::PubSubStream,
        ) -> std::ops::ControlFlow<()> {
            loop {
                let msg = tokio::select! {
                    () = self.stop.cancelled() => return std::ops::ControlFlow::Break(()),
                    m = messages.next() => m,
                };
                let Some(msg) = msg else {
                    return std::ops::ControlFlow::Continue(());
                };
                // "<service> <old ip> <old port> <new ip> <new port>"
                let payload = msg.get_payload_bytes();
                if payload.split(|&b| b == b' ').next() == Some(self.service.as_bytes()) {
                    tracing::info!(service = %self.service, "the Sentinels switched the master; reconnecting");
                    self.bump();
                }
            }
        }

        fn bump(&self) {
            self.epoch.send_modify(|e| *e += 1);
        }
    }
}

/// The `(host, port)` of each slot range's master in a `CLUSTER SLOTS` reply.
#[cfg(feature = "cluster")]
fn master_addrs(slots: &Value) -> Vec<(String, u16)> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter_map(|range| {
            let Value::Array(fields) = range else {
                return None;
            };
            let Some(Value::Array(master)) = fields.get(2) else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let port = match master.get(1)? {
                Value::Int(p) => u16::try_from(*p).ok()?,
                _ => return None,
            };
            Some((host, port))
        })
        .collect()
}

/// `host:port` or the socket path: enough to find the server, nothing secret.
pub(crate) fn describe_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        other => other.to_string(),
    }
}

/// The cluster slot of a key (CRC16/XMODEM of the key, or of its `{hash tag}`, mod 16384).
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16_xmodem(tagged) % 16384
}

fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_cluster_hashing() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(
            slot_of(b"{}x"),
            slot_of(b"{}x"),
            "an empty tag hashes the whole key"
        );
        assert_eq!(slot_of(b"lock:a"), slot_of(b"{lock:a}:fence"));
    }
}
