//! What a [`FaultProxy`](crate::testing::FaultProxy) handle and its thread share: the faults in
//! force, per-connection control, and the traffic counters (with the signals that wake their
//! waiters). Plain state: deciding what a fault does to a frame is the pump's business.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// A direction of traffic through a [`FaultProxy`](crate::testing::FaultProxy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Direction {
    /// Client → server: requests.
    ToServer,
    /// Server → client: replies (and pub/sub messages).
    ToClient,
}

/// Traffic counters of a [`FaultProxy`](crate::testing::FaultProxy), from
/// [`FaultProxy::counters`](crate::testing::FaultProxy::counters). Frames are whole RESP
/// frames: one request, one reply, or one pub/sub message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyCounters {
    /// Connections accepted from clients (including ones refused right after the accept).
    pub accepted: u64,
    /// Connections reset at once because new connections were refused.
    pub refused: u64,
    /// Connections open right now (client side accepted and upstream connected).
    pub open: u64,
    /// Connections the proxy reset ([`FaultProxy::reset_all`](crate::testing::FaultProxy::reset_all), [`FaultProxy::reset_on_next`](crate::testing::FaultProxy::reset_on_next)),
    /// not counting refused ones.
    pub resets: u64,
    /// Connections whose upstream connect failed (server down): reset at once.
    pub upstream_failures: u64,
    /// Requests forwarded to the server (counted as they are written, so a test that has seen
    /// a request's effect sees it counted).
    pub to_server: u64,
    /// Replies forwarded to the client (counted as they are written, so a test that has read a
    /// reply sees it counted).
    pub to_client: u64,
    /// Replies discarded by [`FaultProxy::drop_replies`](crate::testing::FaultProxy::drop_replies).
    pub replies_dropped: u64,
    /// Frames discarded because of a blackhole or a stalled connection, both directions.
    pub discarded: u64,
    /// Connections whose bytes were not RESP and are forwarded unmeasured from then on.
    pub unparsed: u64,
    /// Requests held by [`FaultProxy::hold_requests`](crate::testing::FaultProxy::hold_requests) (counted when held).
    pub requests_held: u64,
    /// Subscription requests held by [`FaultProxy::hold_subscriptions`](crate::testing::FaultProxy::hold_subscriptions) (counted when held).
    pub subscriptions_held: u64,
}

/// The faults in force. Connection tasks read it per frame.
#[derive(Debug, Default)]
pub(super) struct Faults {
    pub(super) blackhole: bool,
    pub(super) refuse: bool,
    pub(super) delay_to_server: Duration,
    pub(super) delay_to_client: Duration,
    pub(super) drop_replies: u64,
    pub(super) reset_next_request: u64,
    pub(super) reset_next_reply: u64,
}

/// Per-connection control.
#[derive(Debug, Default)]
pub(super) struct Conn {
    pub(super) reset: CancellationToken,
    pub(super) stalled: AtomicBool,
    /// The client sent `SUBSCRIBE`, `PSUBSCRIBE` or `SSUBSCRIBE` on it: a pub/sub connection.
    pub(super) subscriber: AtomicBool,
    /// [`FaultProxy::hold_requests`](crate::testing::FaultProxy::hold_requests) holds its
    /// requests (read from then on) in the proxy.
    pub(super) held: tokio::sync::watch::Sender<bool>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) upstream: SocketAddr,
    pub(super) faults: Mutex<Faults>,
    pub(super) conns: Mutex<HashMap<u64, Arc<Conn>>>,
    pub(super) counters: Mutex<ProxyCounters>,
    /// Wakes synchronous and asynchronous waiters of `wait_until*` on every change.
    pub(super) changed: Condvar,
    pub(super) changed_async: Notify,
    /// [`FaultProxy::hold_subscriptions`](crate::testing::FaultProxy::hold_subscriptions) is on.
    pub(super) hold: tokio::sync::watch::Sender<bool>,
}

impl Shared {
    pub(super) fn faults(&self) -> MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn conns(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn counters(&self) -> MutexGuard<'_, ProxyCounters> {
        self.counters.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn count(&self, f: impl FnOnce(&mut ProxyCounters)) {
        f(&mut self.counters());
        self.changed.notify_all();
        self.changed_async.notify_waiters();
    }
}
