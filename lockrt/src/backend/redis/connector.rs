//! How to reach the lock server(s): one standalone server, a Redis Cluster ([`Cluster`]), or
//! the master a group of Sentinels names ([`Sentinel`]). Everything above this module sees one
//! [`Conn`] that runs commands and one [`Client`] to subscribe on; only this module and the
//! two it holds know the topology.
//!
//! - Standalone: a `Client` from a URL (or one the caller built).
//! - Cluster (feature `cluster`): `cluster.rs`.
//! - Sentinel (feature `sentinel`): `sentinel.rs`.
//!
//! TLS (feature `tls`, `client.rs`) applies to every topology.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Value};

use crate::backend::redis::client::{client, feature_missing, password};
#[cfg(feature = "cluster")]
use crate::backend::redis::cluster::Cluster;
#[cfg(feature = "sentinel")]
use crate::backend::redis::sentinel::Sentinel;
use crate::backend::redis::settings::{Timeouts, TlsFiles, Topology, Unconfirmed};

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
    Cluster(Cluster),
    #[cfg(feature = "sentinel")]
    Sentinel(Sentinel),
}

impl Connector {
    /// Parses the topology; nothing is contacted yet.
    pub(crate) fn new(
        topology: Topology,
        tls: &TlsFiles,
        timeouts: Timeouts,
    ) -> redis::RedisResult<Connector> {
        #[cfg(not(any(feature = "cluster", feature = "sentinel")))]
        let _ = timeouts;
        match topology {
            Topology::Url(url) => Ok(Connector::Single(client(&url, tls)?)),
            Topology::Client(c) => Ok(Connector::Single(c)),
            #[cfg(feature = "cluster")]
            Topology::Cluster(seeds) => {
                Ok(Connector::Cluster(Cluster::new(&seeds, tls, timeouts)?))
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel {
                sentinels,
                service,
                master_auth,
            } => Ok(Connector::Sentinel(Sentinel::new(
                &sentinels,
                service,
                master_auth,
                tls,
                timeouts,
            )?)),
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
            Connector::Cluster(c) => c.connect().await.map(Conn::Cluster),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel(s) => s
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
            Connector::Cluster(c) => Ok(c.pubsub_client(round)),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel(s) => s.master().await,
        }
    }

    /// A cluster connection for shard channels (RESP3), with the pushes it receives:
    /// `SSUBSCRIBE` goes to each channel's slot master (see `wire.rs`).
    #[cfg(feature = "cluster")]
    pub(crate) async fn sharded_pubsub(
        &self,
    ) -> redis::RedisResult<(
        redis::cluster_async::ClusterConnection,
        tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    )> {
        match self {
            Connector::Cluster(c) => c.sharded_pubsub().await,
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "sharded pub/sub needs a cluster",
            ))),
        }
    }

    /// Whether requests may go out without asking the Sentinels first: always, but under
    /// Sentinel only while a Sentinel named the current master within the last second (the
    /// watcher's `PING`s keep that true while it hears its Sentinel).
    pub(crate) fn master_confirmed(&self) -> bool {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel(s) = self {
            return s.is_confirmed();
        }
        true
    }

    /// Asks the Sentinels who the master is (Sentinel only): a master other than the
    /// connections reach makes them stale ([`epoch`](Self::epoch) moves). Fails, with the
    /// reason, when no Sentinel answers: then no master is confirmed.
    pub(crate) async fn confirm_master(&self) -> Result<(), Unconfirmed> {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel(s) = self {
            return s.confirm().await;
        }
        Ok(())
    }

    /// Master switches seen so far (always 0 without Sentinel): a connection opened before
    /// the count last moved may talk to a demoted master. Restarts the watching task when
    /// its runtime ended.
    pub(crate) fn epoch(&self) -> u64 {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel(s) = self {
            return s.epoch();
        }
        0
    }

    /// Notified on each master switch (Sentinel only), for the subscriber.
    pub(crate) fn switches(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        #[cfg(feature = "sentinel")]
        if let Connector::Sentinel(s) = self {
            return Some(s.switches());
        }
        None
    }

    /// Clients for every master of a Cluster, from `CLUSTER SLOTS` asked over `conn` (with
    /// the seeds' credentials; what scans every node needs). `None` for other topologies,
    /// where `conn` reaches the one server that holds every lock.
    pub(crate) async fn masters(&self, conn: &mut Conn) -> redis::RedisResult<Option<Vec<Client>>> {
        #[cfg(feature = "cluster")]
        if let Connector::Cluster(c) = self {
            return c.masters(conn).await.map(Some);
        }
        let _ = conn;
        Ok(None)
    }

    /// Whether lock scripts may go to different servers (a renewal batch must then stay
    /// within one slot).
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if matches!(self, Connector::Cluster(_)) {
            return true;
        }
        false
    }

    /// The passwords, to scrub from messages.
    pub(crate) fn secrets(&self) -> Vec<String> {
        match self {
            Connector::Single(c) => password(c).into_iter().collect(),
            #[cfg(feature = "cluster")]
            Connector::Cluster(c) => c.secrets(),
            #[cfg(feature = "sentinel")]
            Connector::Sentinel(s) => s.secrets(),
        }
    }
}
