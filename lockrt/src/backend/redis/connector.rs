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
//!   master keeps accepting writes for seconds after the switch (for ever, when it is cut
//!   off from the Sentinels). The task asks its Sentinel for the master right after each
//!   subscription (a switch announced while nobody listened is not missed) and `PING`s it
//!   every 500 ms, moving to the next Sentinel when no answer comes (a half-open connection
//!   hears nothing). Before a request goes out, a view of the master that no Sentinel
//!   confirmed within the last second is confirmed by asking them; when none answers, the
//!   request fails instead of granting a lock on a master that may have been replaced.
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

/// No Sentinel confirmed the master: why, and the last Sentinel's error (a TLS or
/// credentials failure deserves the advice any connection would get).
#[derive(Clone)]
// Made only by the Sentinel watch.
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) struct Unconfirmed {
    pub(crate) why: String,
    pub(crate) last: Option<redis::RedisError>,
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
        timeouts: super::Timeouts,
    ) -> redis::RedisResult<Connector> {
        #[cfg(not(any(feature = "cluster", feature = "sentinel")))]
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
            } => sentinel(&sentinels, service, master_auth, tls, timeouts),
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

    /// The master the Sentinels name now, reported to the watch before anyone connects.
    #[cfg(feature = "sentinel")]
    async fn master(&self) -> redis::RedisResult<Client> {
        let Connector::Sentinel {
            sentinel, switches, ..
        } = self
        else {
            unreachable!("only called on a sentinel connector")
        };
        let asked = tokio::time::Instant::now();
        let master = sentinel.lock().await.async_get_client().await?;
        switches.resolved(master.get_connection_info().addr(), asked);
        Ok(master)
    }

    /// Whether requests may go out without asking the Sentinels first: always, but under
    /// Sentinel only while a Sentinel named the current master within the last second (the
    /// watcher's `PING`s keep that true while it hears its Sentinel).
    pub(crate) fn master_confirmed(&self) -> bool {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel { switches, .. } = self {
            return switches.is_confirmed();
        }
        true
    }

    /// Asks the Sentinels who the master is (Sentinel only): a master other than the
    /// connections reach makes them stale ([`epoch`](Self::epoch) moves). Fails, with the
    /// reason, when no Sentinel answers: then no master is confirmed.
    pub(crate) async fn confirm_master(&self) -> Result<(), Unconfirmed> {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel { switches, .. } = self {
            return switches.confirm().await;
        }
        Ok(())
    }

    /// Master switches seen so far (always 0 without Sentinel): a connection opened before
    /// the count last moved may talk to a demoted master. Restarts the watching task when
    /// its runtime ended.
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
    timeouts: super::Timeouts,
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
    timeouts: super::Timeouts,
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
        switches: SwitchWatch::new(watchers, service.clone(), timeouts),
        service,
        first,
        master_password: master_auth.map(|a| a.password),
    })
}

/// Following the Sentinels' view of the master: the switch counter, the task that keeps it,
/// and the confirmation asked before a request when the view is old.
///
/// Invariant: every connection to a master was opened under the current epoch only if the
/// master it reached is `View::master` (every resolution is reported through
/// [`SwitchWatch::resolved`], after the caller read the epoch); any other master the Sentinels
/// name starts a new epoch, which makes those connections stale.
#[cfg(feature = "sentinel")]
mod switch {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;

    use futures_util::stream::FuturesUnordered;
    use futures_util::{FutureExt, StreamExt};
    use redis::aio::{PubSubSink, PubSubStream};
    use redis::{AsyncConnectionConfig, Client, ConnectionAddr, RedisError, RedisResult};
    use tokio::sync::watch;
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::Unconfirmed;
    use crate::backend::redis::Timeouts;

    /// A subscribed watcher asks its Sentinel `PING` this often: an answer proves that every
    /// `+switch-master` sent before it has arrived, no answer (a half-open connection) moves
    /// the watcher to the next Sentinel.
    const KEEPALIVE: Duration = Duration::from_millis(500);
    /// A view of the master older than this is confirmed with a Sentinel before the next
    /// request: twice the keepalive, so a watcher that hears its Sentinel keeps
    /// it fresh and only a deaf one costs a question.
    const CONFIRMED_FOR: Duration = Duration::from_secs(1);
    /// Pause before trying the next Sentinel.
    const RETRY_DELAY: Duration = Duration::from_millis(200);

    /// A master's address as the Sentinels name it.
    type Addr = (String, u16);

    /// The master the current epoch's connections reach, and since when a Sentinel is known
    /// to have named it (the send time of the question or `PING` whose answer said so).
    #[derive(Default)]
    struct View {
        master: Option<Addr>,
        confirmed: Option<Instant>,
        /// The master the watcher's Sentinel named last: its `PING`s vouch for no other.
        named: Option<Addr>,
        /// When the last confirmation failed, and why: the requests that waited for it fail
        /// with it rather than each asking again (and waiting as long) in turn.
        failed: Option<(Instant, Unconfirmed)>,
    }

    /// What the watching task and the lockers share.
    struct Shared {
        sentinels: Vec<Client>,
        service: String,
        timeouts: Timeouts,
        epoch: watch::Sender<u64>,
        view: Mutex<View>,
    }

    impl Shared {
        fn view(&self) -> MutexGuard<'_, View> {
            // Only plain assignments under the lock: a panic can't leave it torn.
            self.view.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// A Sentinel named `master` in answer to a question sent at `at`. Another master than
        /// the current connections reach starts a new epoch.
        fn observe(&self, master: Addr, at: Instant) {
            self.observe_in(&mut self.view(), master, at);
        }

        /// [`observe`](Self::observe), by the Sentinel the watcher listens to.
        fn named(&self, master: Addr, at: Instant) {
            let mut view = self.view();
            view.named = Some(master.clone());
            self.observe_in(&mut view, master, at);
        }

        fn observe_in(&self, view: &mut View, master: Addr, at: Instant) {
            match &view.master {
                Some(m) if *m != master => {
                    tracing::info!(service = %self.service, "the Sentinels name another master; reconnecting");
                    self.epoch.send_modify(|e| *e += 1);
                    view.confirmed = Some(at);
                }
                _ => view.confirmed = Some(view.confirmed.map_or(at, |c| c.max(at))),
            }
            view.master = Some(master);
        }

        /// The Sentinel the watcher listens to answered a `PING` sent at `at`, after every
        /// message before it was applied: the view holds as of `at`, if that Sentinel names
        /// the same master (while Sentinels disagree, a resolution may have gone elsewhere).
        fn heard(&self, at: Instant) {
            let mut view = self.view();
            if view.master.is_some() && view.master == view.named {
                view.confirmed = Some(view.confirmed.map_or(at, |c| c.max(at)));
            }
        }

        /// Whether a Sentinel named the current master lately. Before any master was
        /// resolved there is no connection to doubt (the first one resolves it).
        fn is_confirmed(&self) -> bool {
            let view = self.view();
            view.master.is_none() || view.confirmed.is_some_and(|c| c.elapsed() < CONFIRMED_FOR)
        }

        /// `SENTINEL GET-MASTER-ADDR-BY-NAME` on `sentinel`, over a connection of its own
        /// (a subscribed one takes no other command), bounded by the timeouts.
        async fn ask(&self, sentinel: &Client) -> RedisResult<Addr> {
            let cfg = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.timeouts.connect))
                .set_response_timeout(Some(self.timeouts.response));
            let ask = async {
                let mut conn = sentinel
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await?;
                let addr: Option<Addr> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.service)
                    .query_async(&mut conn)
                    .await?;
                addr.ok_or_else(|| {
                    RedisError::from((
                        redis::ErrorKind::MasterNameNotFoundBySentinel,
                        "the Sentinel does not know the service",
                    ))
                })
            };
            tokio::time::timeout(self.limit(), ask)
                .await
                .unwrap_or_else(|_| Err(timed_out()))
        }

        /// Longest time for one connect and one answer.
        fn limit(&self) -> Duration {
            self.timeouts.connect.saturating_add(self.timeouts.response)
        }
    }

    fn timed_out() -> RedisError {
        RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
    }

    /// Counts the master switches of one service that the Sentinels announce or name. The
    /// task that listens runs on the runtime of the first caller (and again on a later
    /// caller's when that runtime ended); it stops when this is dropped.
    pub(crate) struct SwitchWatch {
        shared: Arc<Shared>,
        running: Arc<AtomicBool>,
        stop: CancellationToken,
        /// One confirmation at a time; the others wait for its answer.
        confirming: tokio::sync::Mutex<()>,
    }

    impl SwitchWatch {
        pub(crate) fn new(sentinels: Vec<Client>, service: String, timeouts: Timeouts) -> Self {
            SwitchWatch {
                shared: Arc::new(Shared {
                    sentinels,
                    service,
                    timeouts,
                    epoch: watch::Sender::new(0),
                    view: Mutex::new(View::default()),
                }),
                running: Arc::new(AtomicBool::new(false)),
                stop: CancellationToken::new(),
                confirming: tokio::sync::Mutex::new(()),
            }
        }

        pub(crate) fn epoch(&self) -> u64 {
            self.ensure_running();
            *self.shared.epoch.borrow()
        }

        pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
            self.ensure_running();
            self.shared.epoch.subscribe()
        }

        /// The Sentinels named `addr` (a connection is about to be opened there) when asked
        /// at `at`.
        pub(crate) fn resolved(&self, addr: &ConnectionAddr, at: Instant) {
            let addr = match addr {
                ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
                    (host.clone(), *port)
                }
                _ => return,
            };
            self.shared.observe(addr, at);
        }

        /// Whether a Sentinel named the current master less than a second ago.
        pub(crate) fn is_confirmed(&self) -> bool {
            self.ensure_running();
            self.shared.is_confirmed()
        }

        /// Asks every Sentinel at once who the master is and takes the first answer (a new
        /// epoch when it names another master). Fails when none answers within the timeouts.
        pub(crate) async fn confirm(&self) -> Result<(), Unconfirmed> {
            let waited = Instant::now();
            let _one = self.confirming.lock().await;
            if self.is_confirmed() {
                return Ok(());
            }
            if let Some((at, why)) = &self.shared.view().failed
                && *at >= waited
            {
                return Err(why.clone());
            }
            let sent = Instant::now();
            let shared = &self.shared;
            let mut asks: FuturesUnordered<_> =
                shared.sentinels.iter().map(|s| shared.ask(s)).collect();
            let mut last = None;
            while let Some(answer) = asks.next().await {
                match answer {
                    Ok(master) => {
                        shared.observe(master, sent);
                        return Ok(());
                    }
                    Err(e) => last = Some(e),
                }
            }
            let detail = last
                .as_ref()
                .map_or_else(String::new, |e| format!(" (last error: {e})"));
            let failed = Unconfirmed {
                why: format!(
                    "no Sentinel named the master of service {:?} within {:?}, and none has been \
                     heard for {CONFIRMED_FOR:?}: the master may have been replaced{detail}",
                    shared.service,
                    shared.limit()
                ),
                last,
            };
            shared.view().failed = Some((Instant::now(), failed.clone()));
            Err(failed)
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
                shared: self.shared.clone(),
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
        shared: Arc<Shared>,
        stop: CancellationToken,
        _running: Running,
    }

    impl Follow {
        /// Listens on one Sentinel at a time, moving to the next when it fails or stops
        /// answering `PING`.
        async fn run(self) {
            let n = self.shared.sentinels.len();
            for round in 0usize.. {
                let sentinel = &self.shared.sentinels[round % n];
                let subscribed = tokio::select! {
                    () = self.stop.cancelled() => return,
                    s = self.subscribe(sentinel) => s,
                };
                match subscribed {
                    Ok((sink, stream)) => {
                        if self.listen(sink, stream).await.is_break() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::debug!(service = %self.shared.service, error = %e, "cannot follow a Sentinel; trying the next");
                    }
                }
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = tokio::time::sleep(RETRY_DELAY) => {}
                }
            }
        }

        /// Subscribes `+switch-master` on `sentinel`, then asks it for the master: a switch
        /// it announced before the subscription (while nobody listened) shows in the answer.
        async fn subscribe(&self, sentinel: &Client) -> RedisResult<(PubSubSink, PubSubStream)> {
            let subscribe = async {
                let (mut sink, stream) = sentinel.get_async_pubsub().await?.split();
                sink.subscribe("+switch-master").await?;
                Ok::<_, RedisError>((sink, stream))
            };
            let (sink, stream) = tokio::time::timeout(self.shared.limit(), subscribe)
                .await
                .unwrap_or_else(|_| Err(timed_out()))?;
            let sent = Instant::now();
            let master = self.shared.ask(sentinel).await?;
            self.shared.named(master, sent);
            Ok((sink, stream))
        }

        /// Applies this service's switches until the connection ends or stops answering
        /// `PING` (`Continue`) or the watch is dropped (`Break`).
        async fn listen(
            &self,
            mut sink: PubSubSink,
            mut messages: PubSubStream,
        ) -> std::ops::ControlFlow<()> {
            use std::ops::ControlFlow::{Break, Continue};
            let mut ping_at = Instant::now() + KEEPALIVE;
            loop {
                let msg = tokio::select! {
                    () = self.stop.cancelled() => return Break(()),
                    m = messages.next() => m,
                    () = tokio::time::sleep_until(ping_at) => {
                        if !self.ping(&mut sink, &mut messages).await {
                            tracing::warn!(service = %self.shared.service, "a Sentinel connection is not answering PING; trying the next Sentinel");
                            return Continue(());
                        }
                        ping_at = Instant::now() + KEEPALIVE;
                        continue;
                    }
                };
                let Some(msg) = msg else {
                    return Continue(());
                };
                self.on_message(&msg);
            }
        }

        /// `PING`; on the answer, applies the messages that came before it and counts the
        /// view as confirmed when the `PING` was sent. `false`: no answer in time (a connect
        /// and a response timeout, as for the subscription: a slow Sentinel is not dropped for
        /// being slow, and meanwhile requests confirm the master themselves).
        async fn ping(&self, sink: &mut PubSubSink, messages: &mut PubSubStream) -> bool {
            let sent = Instant::now();
            let pong = tokio::time::timeout(self.shared.limit(), sink.ping::<redis::Value>());
            match pong.await {
                Ok(Ok(_)) => {}
                // An error reply (an ACL without `+ping`) is an answer too.
                Ok(Err(e)) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {}
                _ => return false,
            }
            while let Some(next) = messages.next().now_or_never() {
                match next {
                    Some(msg) => self.on_message(&msg),
                    None => return false,
                }
            }
            self.shared.heard(sent);
            true
        }

        /// A `+switch-master` message: this service's new master.
        fn on_message(&self, msg: &redis::Msg) {
            match new_master(&self.shared.service, msg.get_payload_bytes()) {
                None => {}
                Some(Some(master)) => {
                    tracing::info!(service = %self.shared.service, "the Sentinels switched the master");
                    self.shared.named(master, Instant::now());
                }
                // Unreadable: count it as a switch, so every connection resolves anew.
                Some(None) => {
                    self.shared.epoch.send_modify(|e| *e += 1);
                    let mut view = self.shared.view();
                    view.confirmed = None;
                    view.named = None;
                }
            }
        }
    }

    /// The new master in a `+switch-master` payload, `"<service> <old ip> <old port> <new ip>
    /// <new port>"`: `None` for another service, `Some(None)` when unreadable.
    fn new_master(service: &str, payload: &[u8]) -> Option<Option<Addr>> {
        let payload = String::from_utf8_lossy(payload);
        let fields: Vec<&str> = payload.split(' ').collect();
        if fields.first() != Some(&service) {
            return None;
        }
        let port = fields.get(4).and_then(|p| p.parse::<u16>().ok());
        Some(fields.get(3).zip(port).map(|(h, p)| ((*h).to_owned(), p)))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn shared() -> Shared {
            let timeouts = Timeouts {
                connect: Duration::from_secs(1),
                response: Duration::from_secs(1),
            };
            Shared {
                sentinels: vec![Client::open("redis://127.0.0.1:1/").unwrap()],
                service: "locks".into(),
                timeouts,
                epoch: watch::Sender::new(0),
                view: Mutex::new(View::default()),
            }
        }

        fn addr(port: u16) -> Addr {
            ("10.0.0.1".into(), port)
        }

        #[test]
        fn switch_messages_name_the_new_master_of_this_service_only() {
            let msg = b"locks 10.0.0.1 6379 10.0.0.2 6380";
            assert_eq!(
                new_master("locks", msg),
                Some(Some(("10.0.0.2".into(), 6380)))
            );
            assert_eq!(new_master("other", msg), None);
            assert_eq!(new_master("lock", msg), None, "a prefix is another service");
            assert_eq!(new_master("locks", b"locks 10.0.0.1 6379"), Some(None));
            assert_eq!(new_master("locks", b"locks a b c notaport"), Some(None));
        }

        #[tokio::test(start_paused = true)]
        async fn only_another_master_starts_an_epoch_and_views_expire() {
            let s = shared();
            assert!(s.is_confirmed(), "no master resolved yet: nothing to doubt");
            s.heard(Instant::now());
            assert!(
                s.view().confirmed.is_none(),
                "a PING confirms no unknown master"
            );
            s.observe(addr(1), Instant::now());
            s.named(addr(1), Instant::now());
            assert_eq!(*s.epoch.borrow(), 0, "the same master is no switch");
            assert!(s.is_confirmed());
            tokio::time::advance(CONFIRMED_FOR).await;
            assert!(!s.is_confirmed(), "a second without a Sentinel's word");
            s.heard(Instant::now());
            assert!(s.is_confirmed(), "a PING answered confirms the master");
            s.named(addr(2), Instant::now());
            assert_eq!(*s.epoch.borrow(), 1, "another master is a switch");
            // An answer sent before a fresher one does not make the view older.
            let old = Instant::now();
            tokio::time::advance(Duration::from_millis(500)).await;
            s.heard(Instant::now());
            s.observe(addr(2), old);
            tokio::time::advance(Duration::from_millis(700)).await;
            assert!(s.is_confirmed());
            // A resolution through a Sentinel that still names the old master: the watcher's
            // Sentinel, which names another, no longer vouches for the view.
            s.observe(addr(1), Instant::now());
            assert_eq!(*s.epoch.borrow(), 2);
            tokio::time::advance(CONFIRMED_FOR).await;
            s.heard(Instant::now());
            assert!(
                !s.is_confirmed(),
                "vouched for a master its Sentinel does not name"
            );
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
