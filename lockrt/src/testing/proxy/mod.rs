//! [`FaultProxy`]: a TCP proxy on loopback that a test puts between a client and a server, and
//! tells at run time to misbehave.
//!
//! The proxy runs on a thread and a single-threaded tokio runtime of its own, so it keeps
//! working while the test's runtime is blocked, paused or gone, and it can be driven from
//! synchronous code. Both directions are cut into whole RESP frames (see `resp.rs`), so every
//! fault applies per request or per reply. Dropping the proxy stops its thread and closes every
//! connection it holds. It only ever connects to the upstream address it was given.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::server::RedisServer;
use pump::serve_on_own_thread;
use state::{Conn, Faults, Shared};

mod pump;
mod resp;
mod state;

pub use state::{Direction, ProxyCounters};

/// Longest time dropping a proxy waits for its thread to finish.
const SHUTDOWN: Duration = Duration::from_secs(5);

/// A fault-injecting TCP proxy on `127.0.0.1` in front of a server on loopback (usually a
/// [`RedisServer`]). Point the client at [`url`](Self::url) (or [`addr`](Self::addr)) instead of
/// the server, then change the proxy's behaviour at any time:
///
/// | control | what the client sees | applies to |
/// |---|---|---|
/// | [`pass`](Self::pass) | a transparent proxy (the initial state) | lifts every global fault below; stalled connections stay stalled |
/// | [`blackhole`](Self::blackhole) | connections open, nothing arrives either way (a partition) | existing and new connections, until `pass` |
/// | [`stall_existing`](Self::stall_existing) | open connections go silent for good (half-open); new ones work | connections open at the call |
/// | [`stall_subscribers`](Self::stall_subscribers) / [`stall_commands`](Self::stall_commands) | the same, only for pub/sub connections (ones that sent a `SUBSCRIBE`) / only for the others | connections open at the call |
/// | [`reset_all`](Self::reset_all) | `ECONNRESET` (RST, `SO_LINGER` 0) | connections open at the call |
/// | [`reset_on_next`](Self::reset_on_next) | the next request is never forwarded, or the next reply never delivered, and that connection is reset | the next frame in that direction, any connection |
/// | [`delay`](Self::delay) | every frame arrives `d` later (order kept) | frames read from now on, existing and new connections |
/// | [`drop_replies`](Self::drop_replies) | the next `n` replies vanish; the connection stays up, so later replies pair with the wrong requests | the next `n` replies, any connection |
/// | [`refuse_new`](Self::refuse_new) | new connections are reset right after the accept | new connections, until turned off or `pass` |
/// | [`hold_requests`](Self::hold_requests) / [`deliver_held`](Self::deliver_held) | requests on open command connections wait in the proxy, then reach the server late, after what went on newer connections (requests reordered across connections) | command connections open at the call |
/// | [`hold_subscriptions`](Self::hold_subscriptions) | a `SUBSCRIBE` (and what follows it on its connection) arrives only when the hold ends (a subscription that lands late) | every connection, until turned off or `pass` |
///
/// Frames that arrive during a blackhole or on a stalled connection are discarded, as a
/// partition that outlasts TCP's retransmissions would lose them. Pub/sub messages are
/// replies. [`counters`](Self::counters) and [`wait_until`](Self::wait_until) tell a test
/// what went through, so it can wait for an event instead of sleeping.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use lockrt::testing::{Direction, FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::in_front_of(&server)?;
/// let mut conn = redis::Client::open(proxy.url())?.get_connection()?;
/// let _: () = redis::cmd("SET").arg("k").arg(1).query(&mut conn)?;
///
/// proxy.delay(Direction::ToClient, Duration::from_millis(200)); // slow replies
/// let _: i64 = redis::cmd("GET").arg("k").query(&mut conn)?; // answered ~200 ms later
/// proxy.pass();
///
/// proxy.drop_replies(1); // the next reply never arrives
/// conn.set_read_timeout(Some(Duration::from_millis(300)))?;
/// assert!(redis::cmd("PING").query::<String>(&mut conn).is_err());
/// assert_eq!(proxy.counters().replies_dropped, 1);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    done: std::sync::mpsc::Receiver<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free `127.0.0.1` port that forwards every connection to `upstream`
    /// (which must be a loopback address). Returns once it accepts connections.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// use std::net::{Ipv4Addr, SocketAddr};
    /// let proxy = lockrt::testing::FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 6379)))?;
    /// println!("connect to {}", proxy.url());
    /// # Ok(()) }
    /// ```
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        if !upstream.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("FaultProxy forwards to loopback addresses only, not {upstream}"),
            ));
        }
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::default(),
            conns: Mutex::default(),
            counters: Mutex::default(),
            changed: Condvar::new(),
            changed_async: Notify::new(),
            hold: tokio::sync::watch::Sender::new(false),
        });
        let shutdown = CancellationToken::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<SocketAddr>>();
        let (done_tx, done) = std::sync::mpsc::channel::<()>();
        serve_on_own_thread(shared.clone(), shutdown.clone(), ready_tx, done_tx)?;
        let addr = ready_rx
            .recv_timeout(SHUTDOWN)
            .map_err(|_| io::Error::other("fault proxy thread did not start"))??;
        Ok(FaultProxy {
            addr,
            shared,
            shutdown,
            done,
        })
    }

    /// A proxy in front of `server` (which may be restarted meanwhile: the proxy connects
    /// anew for every client connection).
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// use lockrt::testing::{FaultProxy, RedisServer};
    /// let server = RedisServer::start()?;
    /// let proxy = FaultProxy::in_front_of(&server)?;
    /// assert_ne!(proxy.url(), server.url());
    /// # Ok(()) }
    /// ```
    pub fn in_front_of(server: &RedisServer) -> io::Result<FaultProxy> {
        FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port())))
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// `redis://127.0.0.1:<proxy port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.addr.port())
    }

    /// Back to a transparent proxy: no blackhole, no delays, no refusal, and pending
    /// [`drop_replies`](Self::drop_replies) and [`reset_on_next`](Self::reset_on_next)
    /// disarmed. Connections stalled by [`stall_existing`](Self::stall_existing) stay stalled
    /// (a half-open connection does not heal); [`reset_all`](Self::reset_all) ends them.
    pub fn pass(&self) {
        *self.shared.faults() = Faults::default();
        self.shared.hold.send_replace(false);
    }

    /// Partition: connections are accepted and kept open, but nothing is forwarded in either
    /// direction, on existing and new connections alike, until [`pass`](Self::pass). Frames
    /// that arrive meanwhile are discarded.
    pub fn blackhole(&self) {
        self.shared.faults().blackhole = true;
    }

    /// Half-open connections: every connection open now forwards nothing from here on (its
    /// frames are discarded) but stays open; connections opened later work normally. Returns
    /// how many connections were stalled.
    pub fn stall_existing(&self) -> usize {
        let conns = self.shared.conns();
        for c in conns.values() {
            c.stalled.store(true, Ordering::SeqCst);
        }
        conns.len()
    }

    /// Like [`stall_existing`](Self::stall_existing), for pub/sub connections only: those on
    /// which the client has sent `SUBSCRIBE`, `PSUBSCRIBE` or `SSUBSCRIBE`. Command connections
    /// keep working. Returns how many connections were stalled.
    ///
    /// ```no_run
    /// # fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// // A locker's release messages stop arriving; its commands still get their replies.
    /// let stalled = proxy.stall_subscribers();
    /// # let _ = stalled; }
    /// ```
    pub fn stall_subscribers(&self) -> usize {
        self.stall_where(|c| c.subscriber.load(Ordering::SeqCst))
    }

    /// Like [`stall_existing`](Self::stall_existing), for the connections that are not pub/sub
    /// connections (see [`stall_subscribers`](Self::stall_subscribers)). Returns how many
    /// connections were stalled.
    ///
    /// ```no_run
    /// # fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// // A locker's commands go unanswered; its subscriber still hears release messages.
    /// let stalled = proxy.stall_commands();
    /// # let _ = stalled; }
    /// ```
    pub fn stall_commands(&self) -> usize {
        self.stall_where(|c| !c.subscriber.load(Ordering::SeqCst))
    }

    fn stall_where(&self, pick: impl Fn(&Conn) -> bool) -> usize {
        let conns = self.shared.conns();
        let mut n = 0;
        for c in conns.values().filter(|c| pick(c)) {
            c.stalled.store(true, Ordering::SeqCst);
            n += 1;
        }
        n
    }

    /// Requests held up in the network: on every command connection (not pub/sub) open now,
    /// requests read from here on wait in the proxy, in order, instead of reaching the server,
    /// until [`deliver_held`](Self::deliver_held); nothing is discarded, also when the client
    /// closes the connection meanwhile. Connections opened later work normally, so a client
    /// that gives up on a held connection and sends on a new one has its later requests land
    /// before the held ones. Returns how many connections hold.
    ///
    /// ```no_run
    /// # async fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// use std::time::Duration;
    /// proxy.hold_requests();
    /// // ... a request is sent on a held connection:
    /// proxy
    ///     .wait_until(Duration::from_secs(2), |c| c.requests_held >= 1)
    ///     .await
    ///     .expect("a request is held");
    /// // ... later requests go out on a new connection; then the held one lands:
    /// proxy.deliver_held();
    /// # }
    /// ```
    pub fn hold_requests(&self) -> usize {
        let conns = self.shared.conns();
        let mut n = 0;
        for c in conns
            .values()
            .filter(|c| !c.subscriber.load(Ordering::SeqCst))
        {
            c.held.send_replace(true);
            n += 1;
        }
        n
    }

    /// Ends [`hold_requests`](Self::hold_requests): every held request goes to the server now,
    /// in order per connection.
    pub fn deliver_held(&self) {
        // A connection whose client closed stays listed until its held requests are written.
        for c in self.shared.conns().values() {
            c.held.send_replace(false);
        }
    }

    /// Resets (RST, `SO_LINGER` 0) both sides of every connection open now. New connections
    /// are not affected. Returns how many connections were reset.
    pub fn reset_all(&self) -> usize {
        let conns = self.shared.conns();
        for c in conns.values() {
            c.reset.cancel();
        }
        conns.len()
    }

    /// Arms a one-shot reset: the next frame in `dir`, on whichever connection it comes,
    /// is not forwarded and that connection is reset (RST) instead.
    /// `Direction::ToServer`: the request never reaches the server.
    /// `Direction::ToClient`: the server has run the request, its reply is never delivered.
    /// Calling it again arms one more.
    pub fn reset_on_next(&self, dir: Direction) {
        let mut f = self.shared.faults();
        match dir {
            Direction::ToServer => f.reset_next_request += 1,
            Direction::ToClient => f.reset_next_reply += 1,
        }
    }

    /// Delays every frame in `dir` read from now on by `d` (on existing and new
    /// connections), keeping their order. `Duration::ZERO` ends the delay for later frames.
    pub fn delay(&self, dir: Direction, d: Duration) {
        let mut f = self.shared.faults();
        match dir {
            Direction::ToServer => f.delay_to_server = d,
            Direction::ToClient => f.delay_to_client = d,
        }
    }

    /// Discards the next `n` replies (server → client frames, pub/sub messages included) on
    /// whichever connections they come, while the connections stay up. Adds to any drops
    /// still pending.
    pub fn drop_replies(&self, n: u64) {
        self.shared.faults().drop_replies += n;
    }

    /// While `refuse` is true, new connections are reset right after the accept (the client
    /// sees its connect or first request fail); open connections are not affected.
    pub fn refuse_new(&self, refuse: bool) {
        self.shared.faults().refuse = refuse;
    }

    /// While `hold` is true, a subscription request (`SUBSCRIBE`, `PSUBSCRIBE`, `SSUBSCRIBE`)
    /// waits in the proxy, and so does everything its client sends after it on that
    /// connection; nothing is discarded, and setting `hold` back to false forwards it all in
    /// order. Other connections and the other direction are not affected. For races where a
    /// subscription lands late: whatever is published meanwhile is missed by that subscriber.
    ///
    /// ```no_run
    /// # async fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// use std::time::Duration;
    /// proxy.hold_subscriptions(true);
    /// // ... a client subscribes through the proxy; its request waits here:
    /// proxy
    ///     .wait_until(Duration::from_secs(2), |c| c.subscriptions_held >= 1)
    ///     .await
    ///     .expect("a subscription is held");
    /// // ... publish what the subscriber must miss, then let the subscription land:
    /// proxy.hold_subscriptions(false);
    /// # }
    /// ```
    pub fn hold_subscriptions(&self, hold: bool) {
        self.shared.hold.send_replace(hold);
    }

    /// The counters now.
    pub fn counters(&self) -> ProxyCounters {
        *self.shared.counters()
    }

    /// Waits until `cond` holds for the counters, at most `within`. Returns the counters that
    /// satisfied it, or the last ones seen as the error when time ran out.
    ///
    /// ```no_run
    /// # async fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// use std::time::Duration;
    /// // Wait for a renewal's reply to have been dropped instead of sleeping for it.
    /// proxy.drop_replies(1);
    /// proxy
    ///     .wait_until(Duration::from_secs(2), |c| c.replies_dropped >= 1)
    ///     .await
    ///     .expect("a reply was dropped");
    /// # }
    /// ```
    pub async fn wait_until(
        &self,
        within: Duration,
        mut cond: impl FnMut(&ProxyCounters) -> bool,
    ) -> Result<ProxyCounters, ProxyCounters> {
        let deadline = Instant::now() + within;
        loop {
            let changed = self.shared.changed_async.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = self.counters();
            if cond(&now) {
                return Ok(now);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(self.counters());
            }
        }
    }

    /// [`wait_until`](Self::wait_until) for synchronous code: blocks the thread.
    ///
    /// ```no_run
    /// # fn demo(proxy: &lockrt::testing::FaultProxy) {
    /// use std::time::Duration;
    /// proxy.reset_all();
    /// proxy
    ///     .wait_until_blocking(Duration::from_secs(2), |c| c.open == 0)
    ///     .expect("every connection closed");
    /// # }
    /// ```
    pub fn wait_until_blocking(
        &self,
        within: Duration,
        mut cond: impl FnMut(&ProxyCounters) -> bool,
    ) -> Result<ProxyCounters, ProxyCounters> {
        let guard = self.shared.counters();
        let (guard, _) = self
            .shared
            .changed
            .wait_timeout_while(guard, within, |c| !cond(c))
            .unwrap_or_else(|p| p.into_inner());
        if cond(&guard) {
            Ok(*guard)
        } else {
            Err(*guard)
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shutdown.cancel();
        // Bounded: the thread only has to drop its runtime.
        let _ = self.done.recv_timeout(SHUTDOWN);
    }
}
