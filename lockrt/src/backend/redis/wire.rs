//! How release and revoke messages travel ([`Delivery`]), and the subscriber task's one
//! connection for either way ([`Wire`]).
//!
//! - **Broadcast**: `PUBLISH` and `SUBSCRIBE` on one server. A Redis Cluster forwards every
//!   `PUBLISH` to every node over its bus, so its subscriber listens on any one node; every
//!   release then costs work on all N nodes.
//! - **Sharded** (a Cluster of Redis 7+ or Valkey): `SPUBLISH`, delivered only within the
//!   channel's shard, and `SSUBSCRIBE` over a cluster connection, which keeps one connection
//!   per node and sends each channel's subscription to its slot's master. Every channel a
//!   script publishes on is in the script's own slot (a lock's `{lock}:rel`, and its slot's
//!   revoke channel, `LockKey::slot_revoke_channel`), as services that treat `PUBLISH` in a
//!   script like `SPUBLISH` require.
//!
//! redis-rs resubscribes a node's shard channels after a reconnect or a new slot map, but not
//! one the server unsubscribed (its slot moved to another shard): the wire reports both
//! ([`Incoming`]), and the task subscribes the moved one again and lets its waiters retry.
//! Nor does it learn of a failover by itself: a subscription-only connection sends nothing
//! that a promoted replica would answer with `MOVED`, so the channels of a dead master stay
//! with it. The wire keeps the shard layout it was built on ([`Layout`]) for the task to
//! compare with the server's after a node is lost.

#[cfg(feature = "cluster")]
use std::collections::HashMap;

use futures_util::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};

use crate::key::LockKey;

/// Whether messages go out with `PUBLISH` to every node or with `SPUBLISH` to the channel's
/// shard (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    Broadcast,
    Sharded,
}

impl Delivery {
    /// Sharded on a Cluster whose server has sharded pub/sub (Redis 7.0 or newer, which
    /// every Valkey reports), unless the builder turned it off; broadcast otherwise (a
    /// standalone or Sentinel server has one shard: `PUBLISH` reaches every subscriber there).
    pub(crate) fn for_server(cluster: bool, version: Option<(u32, u32)>, allowed: bool) -> Self {
        match (cluster && allowed, version) {
            (true, Some(v)) if v >= (7, 0) => Delivery::Sharded,
            _ => Delivery::Broadcast,
        }
    }

    /// The channel a forced unlock of `key` names the holder's token on, and its locker
    /// listens on while it holds a lock there.
    pub(crate) fn revoke_channel(self, key: &LockKey) -> String {
        match self {
            Delivery::Broadcast => key.revoke_channel(),
            Delivery::Sharded => key.slot_revoke_channel(),
        }
    }
}

/// What arrives on a [`Wire`] (a broadcast one has messages only).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) enum Incoming {
    /// A message on `channel`.
    Message { channel: String, payload: Vec<u8> },
    /// `channel` was subscribed again without being asked (redis-rs, after a node's
    /// reconnect or a new slot map): what was published on it meanwhile was missed.
    Resubscribed(String),
    /// The server unsubscribed `channel` (its slot moved to another shard): nothing more
    /// arrives on it until it is subscribed again.
    Dropped(String),
    /// A node's connection was lost (redis-rs reconnects it and resubscribes its channels).
    NodeLost,
    /// Anything else (a confirmation the wire asked for).
    Nothing,
}

/// The subscriber task's connection.
pub(crate) enum Wire {
    Broadcast(PubSubSink, PubSubStream),
    #[cfg(feature = "cluster")]
    Sharded(Shards),
}

/// Which node is master of which slots (from `CLUSTER SLOTS`), sorted by range.
#[cfg(feature = "cluster")]
pub(crate) type Layout = Vec<super::cluster::SlotMaster>;

/// A RESP3 cluster connection used for shard channels only, with its pushes.
#[cfg(feature = "cluster")]
pub(crate) struct Shards {
    pub(crate) conn: redis::cluster_async::ClusterConnection,
    pub(crate) pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    /// The layout the connection was made on, when it could be read (see [`Wire::moved`]).
    pub(crate) built_on: Option<Layout>,
    /// Confirmations this wire asked for and has not seen yet, per channel (subscribe,
    /// unsubscribe): any other is the server's or redis-rs's doing.
    asked: HashMap<Vec<u8>, (u32, u32)>,
}

#[cfg(feature = "cluster")]
impl Shards {
    pub(crate) fn new(
        conn: redis::cluster_async::ClusterConnection,
        pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    ) -> Shards {
        Shards {
            conn,
            pushes,
            built_on: None,
            asked: HashMap::new(),
        }
    }

    /// The server's current layout, asked of any node.
    pub(crate) async fn layout(&mut self) -> redis::RedisResult<Layout> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        let reply = (self.conn)
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        Ok(parse_layout(reply))
    }

    fn expect(&mut self, channel: &str, subscribe: bool) {
        let e = self.asked.entry(channel.as_bytes().to_vec()).or_default();
        match subscribe {
            true => e.0 += 1,
            false => e.1 += 1,
        }
    }

    /// Whether this confirmation was asked for (and counts it off).
    fn was_asked(&mut self, channel: &[u8], subscribe: bool) -> bool {
        let Some(e) = self.asked.get_mut(channel) else {
            return false;
        };
        let n = if subscribe { &mut e.0 } else { &mut e.1 };
        let asked = *n > 0;
        *n = n.saturating_sub(1);
        if *e == (0, 0) {
            self.asked.remove(channel);
        }
        asked
    }

    fn incoming(&mut self, push: redis::PushInfo) -> Incoming {
        use redis::PushKind;
        let mut data = push.data.into_iter();
        let channel = match data.next() {
            Some(redis::Value::BulkString(c)) => c,
            _ if push.kind == PushKind::Disconnection => return Incoming::NodeLost,
            _ => return Incoming::Nothing,
        };
        let text = || String::from_utf8_lossy(&channel).into_owned();
        match push.kind {
            PushKind::SMessage => match data.next() {
                Some(redis::Value::BulkString(payload)) => Incoming::Message {
                    channel: text(),
                    payload,
                },
                _ => Incoming::Nothing,
            },
            PushKind::SSubscribe if !self.was_asked(&channel, true) => {
                Incoming::Resubscribed(text())
            }
            PushKind::SUnsubscribe if !self.was_asked(&channel, false) => Incoming::Dropped(text()),
            PushKind::Disconnection => Incoming::NodeLost,
            _ => Incoming::Nothing,
        }
    }
}

impl Wire {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Wire::Broadcast(sink, _) => sink.subscribe(channel).await,
            #[cfg(feature = "cluster")]
            Wire::Sharded(s) => {
                s.expect(channel, true);
                let res = s.conn.ssubscribe(channel).await;
                if res.is_err() {
                    s.was_asked(channel.as_bytes(), true);
                }
                res
            }
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> redis::RedisResult<()> {
        match self {
            Wire::Broadcast(sink, _) => sink.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Wire::Sharded(s) => {
                s.expect(channel, false);
                let res = s.conn.sunsubscribe(channel).await;
                if res.is_err() {
                    s.was_asked(channel.as_bytes(), false);
                }
                res
            }
        }
    }

    /// `PING` on the connection, on every master's for a sharded wire.
    pub(crate) async fn ping(&mut self) -> redis::RedisResult<()> {
        match self {
            Wire::Broadcast(sink, _) => sink.ping::<redis::Value>().await.map(drop),
            #[cfg(feature = "cluster")]
            Wire::Sharded(s) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let all = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                s.conn
                    .route_command(redis::cmd("PING"), all)
                    .await
                    .map(drop)
            }
        }
    }

    /// Whether the server's shard layout differs from the one this wire was built on (a
    /// failover or a moved slot range): `None` when that cannot be told now (a broadcast
    /// wire, or no node answered). A wire built without a layout takes the first one read.
    pub(crate) async fn moved(&mut self) -> Option<bool> {
        match self {
            Wire::Broadcast(..) => None,
            #[cfg(feature = "cluster")]
            Wire::Sharded(s) => {
                let now = s.layout().await.ok()?;
                Some(*s.built_on.get_or_insert_with(|| now.clone()) != now)
            }
        }
    }

    /// Whether a message proves the whole wire alive (one connection), so that it needs no
    /// `PING` for a while; a sharded wire's message proves only its own node's.
    pub(crate) fn one_connection(&self) -> bool {
        matches!(self, Wire::Broadcast(..))
    }

    /// The next thing that arrives; `None` when the connection is gone.
    pub(crate) async fn next(&mut self) -> Option<Incoming> {
        match self {
            Wire::Broadcast(_, stream) => stream.next().await.map(|msg| Incoming::Message {
                channel: msg.get_channel_name().to_owned(),
                payload: msg.get_payload_bytes().to_vec(),
            }),
            #[cfg(feature = "cluster")]
            Wire::Sharded(s) => s.pushes.recv().await.map(|push| s.incoming(push)),
        }
    }
}

/// The masters of a `CLUSTER SLOTS` reply, sorted: nodes may list the ranges in different
/// orders.
#[cfg(feature = "cluster")]
fn parse_layout(reply: redis::Value) -> Layout {
    let mut layout = super::cluster::slot_masters(&reply);
    layout.sort();
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_cluster_of_redis_7_or_newer_shards_unless_turned_off() {
        assert_eq!(
            Delivery::for_server(true, Some((7, 0)), true),
            Delivery::Sharded
        );
        assert_eq!(
            Delivery::for_server(true, Some((9, 1)), true),
            Delivery::Sharded
        );
        for (cluster, version, allowed) in [
            (true, Some((6, 2)), true),
            (true, None, true),
            (false, Some((8, 2)), true),
            (true, Some((8, 2)), false),
        ] {
            assert_eq!(
                Delivery::for_server(cluster, version, allowed),
                Delivery::Broadcast,
                "{cluster} {version:?} {allowed}"
            );
        }
    }

    #[cfg(feature = "cluster")]
    #[test]
    fn a_layout_is_the_masters_of_each_range_in_any_order() {
        use redis::Value::{Array, BulkString, Int};
        let node = |ip: &str, port, id: &str| {
            Array(vec![
                BulkString(ip.into()),
                Int(port),
                BulkString(id.into()),
            ])
        };
        let range = |a, b, master, replica| Array(vec![Int(a), Int(b), master, replica]);
        let before = Array(vec![
            range(
                8192,
                16383,
                node("127.0.0.1", 7001, "b"),
                node("127.0.0.1", 7003, "d"),
            ),
            range(
                0,
                8191,
                node("127.0.0.1", 7000, "a"),
                node("127.0.0.1", 7002, "c"),
            ),
        ]);
        let same = Array(vec![
            range(
                0,
                8191,
                node("127.0.0.1", 7000, "a"),
                node("127.0.0.1", 7002, "c"),
            ),
            range(
                8192,
                16383,
                node("127.0.0.1", 7001, "b"),
                node("127.0.0.1", 7003, "d"),
            ),
        ]);
        // The replica of the first range took over.
        let promoted = Array(vec![
            range(0, 8191, node("127.0.0.1", 7002, "c"), Array(vec![])),
            range(
                8192,
                16383,
                node("127.0.0.1", 7001, "b"),
                node("127.0.0.1", 7003, "d"),
            ),
        ]);
        let before = parse_layout(before);
        assert_eq!(before.len(), 2);
        assert_eq!(before, parse_layout(same));
        assert_ne!(before, parse_layout(promoted));
        assert!(parse_layout(Int(1)).is_empty());
    }
}
