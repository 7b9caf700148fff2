//! Following the Sentinels' view of the master: the switch counter, the task that keeps it,
//! and the confirmation asked before a request when the view is old.
//!
//! Invariant: every connection to a master was opened under the current epoch only if the
//! master it reached is `View::master` (every resolution is reported through
//! [`SwitchWatch::resolved`], after the caller read the epoch); any other master the Sentinels
//! name starts a new epoch, which makes those connections stale.

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

use crate::backend::redis::settings::{Timeouts, Unconfirmed};

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
