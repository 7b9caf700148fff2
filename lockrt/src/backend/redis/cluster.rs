//! Redis Cluster (feature `cluster`): redis-rs's cluster connection, which routes every lock
//! script to its key's slot (all names of one lock share a slot). Release messages go out
//! sharded (`SPUBLISH`, heard over a cluster connection of their own) on Redis 7+, or with
//! classic `PUBLISH`, which a cluster forwards to every node, so that subscriber listens on
//! any one node and moves to the next when that node fails (see `wire.rs`).

use redis::aio::ConnectionLike;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{Client, ConnectionAddr, Value};
use tokio::sync::mpsc;

use crate::backend::redis::client::client;
use crate::backend::redis::settings::{Timeouts, TlsFiles};

/// Retries of one cluster request (redirections, `TRYAGAIN`, a refreshed slot map).
const CLUSTER_RETRIES: u32 = 4;
/// Shortest and longest pause before such a retry, in ms (doubling from the shortest).
const CLUSTER_RETRY_WAIT_MS: (u64, u64) = (10, 200);

/// A cluster's client, and one client per seed to subscribe on.
pub(crate) struct Cluster {
    client: ClusterClient,
    /// The client's settings, for sharded pub/sub connections (each with its own pushes).
    seeds: Vec<String>,
    tls: TlsFiles,
    timeouts: Timeouts,
    /// One client per seed, to subscribe on (any node hears every release message).
    nodes: Vec<Client>,
}

impl Cluster {
    /// Parses the seeds; nothing is contacted yet.
    pub(crate) fn new(
        seeds: &[String],
        tls: &TlsFiles,
        timeouts: Timeouts,
    ) -> redis::RedisResult<Cluster> {
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
        Ok(Cluster {
            client: builder(seeds, tls, timeouts).build()?,
            seeds: seeds.to_vec(),
            tls: tls.clone(),
            timeouts,
            nodes,
        })
    }

    /// A new cluster connection (many node connections, with a fresh slot map).
    pub(crate) async fn connect(&self) -> redis::RedisResult<ClusterConnection> {
        self.client.get_async_connection().await
    }

    /// A new RESP3 cluster connection for shard channels, and the pushes it receives
    /// (messages, confirmations, and a disconnection notice per lost node connection).
    pub(crate) async fn sharded_pubsub(
        &self,
    ) -> redis::RedisResult<(ClusterConnection, mpsc::UnboundedReceiver<redis::PushInfo>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let client = builder(&self.seeds, &self.tls, self.timeouts)
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx)
            .build()?;
        Ok((client.get_async_connection().await?, rx))
    }

    /// The node to subscribe on in reconnection `round`: the next one after a failure.
    pub(crate) fn pubsub_client(&self, round: usize) -> Client {
        self.nodes[round % self.nodes.len()].clone()
    }

    /// Clients for every master, from `CLUSTER SLOTS` asked over `conn`, with the seeds'
    /// credentials and TLS settings.
    pub(crate) async fn masters<C>(&self, conn: &mut C) -> redis::RedisResult<Vec<Client>>
    where
        C: ConnectionLike + Send,
    {
        let slots: Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
        let template = self.nodes[0].get_connection_info().clone();
        let mut addrs: Vec<(String, u16)> = master_addrs(&slots);
        addrs.sort();
        addrs.dedup();
        addrs
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
            .collect()
    }

    /// The password, to scrub from messages: the first seed's.
    pub(crate) fn secrets(&self) -> Vec<String> {
        crate::backend::redis::client::password(&self.nodes[0])
            .into_iter()
            .collect()
    }
}

/// A cluster client's settings for these seeds.
fn builder(seeds: &[String], tls: &TlsFiles, timeouts: Timeouts) -> ClusterClientBuilder {
    // Redirections and TRYAGAIN (a slot in migration) are retried by redis-rs, a few times
    // and within milliseconds: its default waits at least 1.28 s per retry, longer than a
    // response may take here (the response timeout also bounds the retries).
    let builder = ClusterClient::builder(seeds.iter().map(String::as_str))
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_WAIT_MS.0)
        .max_retry_wait(CLUSTER_RETRY_WAIT_MS.1)
        .retry_wait_formula(CLUSTER_RETRY_WAIT_MS.0, 2);
    #[cfg(feature = "tls")]
    if !tls.is_empty() {
        return builder.certs(crate::backend::redis::client::certificates(tls));
    }
    let _ = tls;
    builder
}

/// The `(host, port)` of each slot range's master in a `CLUSTER SLOTS` reply.
fn master_addrs(slots: &Value) -> Vec<(String, u16)> {
    let masters = slot_masters(slots).into_iter();
    masters.map(|m| (m.host, m.port)).collect()
}

/// One slot range of a `CLUSTER SLOTS` reply and its master.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct SlotMaster {
    /// First and last slot of the range.
    pub(crate) slots: (Option<i64>, Option<i64>),
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The master's node id (empty when the reply has none).
    pub(crate) id: Vec<u8>,
}

/// The master of each slot range in a `CLUSTER SLOTS` reply, in the reply's order; a range
/// whose master's address cannot be read is left out.
pub(crate) fn slot_masters(slots: &Value) -> Vec<SlotMaster> {
    let Value::Array(ranges) = slots else {
        return Vec::new();
    };
    let int = |v: Option<&Value>| match v {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
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
            let port = u16::try_from(int(master.get(1))?).ok()?;
            let id = match master.get(2) {
                Some(Value::BulkString(b)) => b.clone(),
                _ => Vec::new(),
            };
            let slots = (int(fields.first()), int(fields.get(1)));
            Some(SlotMaster {
                slots,
                host,
                port,
                id,
            })
        })
        .collect()
}
