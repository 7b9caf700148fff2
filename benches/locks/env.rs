//! The bench's own `redis-server` as the workloads see it: its URL and a client, and the two
//! kinds of plain connection they open to it. Opens connections; never holds a lock.

use redis::aio::{ConnectionManager, MultiplexedConnection};

use crate::Res;

/// Where the server is, for every implementation alike.
pub(crate) struct Env {
    pub(crate) url: String,
    pub(crate) client: redis::Client,
}

impl Env {
    /// The kind of connection lockrt uses (a `ConnectionManager`, multiplexed).
    pub(crate) async fn manager(&self) -> Res<ConnectionManager> {
        Ok(ConnectionManager::new(self.client.clone()).await?)
    }

    /// A dedicated multiplexed connection without response timeout (for `BLPOP ... 0`).
    pub(crate) async fn blocking_conn(&self) -> Res<MultiplexedConnection> {
        let cfg = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await?)
    }
}
