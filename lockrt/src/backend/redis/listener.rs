//! The subscriber task ([`Task`]): the one owner of a locker's pub/sub connection, driven by
//! the commands of its handle (`pubsub.rs`); it also listens on the revoke channels its
//! locker's held leases want (`revoke.rs`).
//!
//! The task reports to the waiting side through [`Events`]: a message on a lock's channel, or
//! "messages may have been missed" (a new or lost connection, or a Sentinel master switch,
//! after which it resubscribes on the new master), after which every waiter retries. It never
//! decides anything about locks. The task restarts on the runtime of the next subscriber when
//! its own runtime is gone, and ends when the `Locker` is dropped. Its errors are diagnosed
//! like the command connection's (a channel the ACL denies names the rules).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::connector::Connector;
use super::diagnose::diagnose;
use super::notice::notice;
use super::revoke::Revocations;
#[cfg(feature = "cluster")]
use super::wire::Shards;
use super::wire::{Delivery, Incoming, Wire};
use crate::backend::contract::{Events, Notice};
use crate::error::BackendError;
use crate::key::{channel_of, tag_of_channel};

/// How long a channel stays subscribed after its last listener left: a wait that starts
/// within it needs no `SUBSCRIBE` round trip.
const LINGER: Duration = Duration::from_millis(500);

/// How long a lease must have been held under a revoke channel the task does not listen on
/// before it subscribes that channel: a section shorter than this (most on a Cluster, whose
/// revoke channels are one per slot) costs no `SSUBSCRIBE` and no unsubscribe. A forced unlock
/// of a lease younger than this is found when the subscription lands (its leases are then
/// checked at once), a few ms later than one of an older lease.
const REVOKE_DEFER: Duration = Duration::from_millis(2);

/// Delay before reconnecting after a failed (re)subscription.
const RECONNECT_DELAY: Duration = Duration::from_millis(200);

/// While a channel is subscribed, a connection silent for this long is asked `PING`; one
/// that does not answer within the timeout (half-open, or on a frozen node) is replaced and
/// every waiter retries, rather than each learning of releases from its fallback timer only.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// After a node of a sharded wire was lost (or the wire was replaced), how long the task
/// watches the shard layout for a failover, and how often it looks. A Cluster promotes a
/// replica after its node timeout (15 s by default): the watch outlasts a few of those.
const WATCH: Duration = Duration::from_secs(120);
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// After the watch, the layout is still read this often while the task listens: a replica
/// that takes over later (a failover held back by hand) is found too.
const WATCH_SLOW: Duration = Duration::from_secs(10);

/// (Un)subscribe the release channel of the lock with this tag, or a revoke channel.
pub(crate) enum SubCmd {
    Subscribe(Arc<str>, oneshot::Sender<Result<(), BackendError>>),
    Unsubscribe(Arc<str>),
    /// A lease is held under this revoke channel (the first one since the task last swept
    /// it away, see `Revocations::sweep`).
    Hold(Arc<str>),
}

/// How the task reaches Redis.
pub(crate) struct Remote {
    pub(crate) connector: Arc<Connector>,
    pub(crate) addr: String,
    pub(crate) timeout: Duration,
    /// The passwords, to scrub from messages.
    pub(crate) secrets: Vec<String>,
    /// How messages travel (chosen at build, see `wire.rs`).
    pub(crate) delivery: Delivery,
}

/// One thing the task reacts to.
enum Event {
    Cmd(Option<SubCmd>),
    LingerEnded,
    /// A lease has been held [`REVOKE_DEFER`] under a revoke channel not listened to yet.
    RevokeDue,
    Incoming(Option<Incoming>),
    Reconnect,
    /// The Sentinels named another master: this connection may be on the demoted one.
    MasterSwitched,
    /// The connection has been silent for [`KEEPALIVE`].
    Silent,
    /// Time to compare the shard layout with the wire's (see [`WATCH`]).
    Watch,
}

/// The subscriber task's state: the connection, which channels it has subscribed, which of
/// those linger without listeners, and when to reconnect.
pub(crate) struct Task {
    remote: Arc<Remote>,
    events: Weak<dyn Events>,
    conn: Option<Wire>,
    subscribed: HashSet<Arc<str>>,
    lingering: HashMap<Arc<str>, Instant>,
    reconnect_at: Option<Instant>,
    /// Connections made so far: a cluster subscriber moves to the next node each time.
    round: usize,
    /// Master switches (Sentinel only).
    switches: Option<watch::Receiver<u64>>,
    /// When the connection last proved alive (connected, a message, a `PING` answered).
    heard: Instant,
    revocations: Arc<Revocations>,
    /// Revoke channels subscribed on this connection, and when to sweep for those no lease
    /// has been held under for `LINGER`.
    revoke_subscribed: HashSet<Arc<str>>,
    revoke_sweep: Option<Instant>,
    /// Revoke channels announced and not subscribed yet, and when to subscribe them.
    revoke_due: HashMap<Arc<str>, Instant>,
    /// Revoke channels the server refused on this connection (an ACL): not asked again on it.
    revoke_refused: HashSet<Arc<str>>,
    /// Until when, and when next, to look for a failover (a sharded wire only, see [`WATCH`]).
    watch_until: Option<Instant>,
    watch_at: Option<Instant>,
}

impl Task {
    pub(crate) fn new(
        remote: Arc<Remote>,
        events: Weak<dyn Events>,
        revocations: Arc<Revocations>,
    ) -> Task {
        let switches = remote.connector.switches();
        Task {
            remote,
            events,
            conn: None,
            subscribed: HashSet::new(),
            lingering: HashMap::new(),
            reconnect_at: None,
            round: 0,
            switches,
            heard: Instant::now(),
            revocations,
            revoke_subscribed: HashSet::new(),
            revoke_sweep: None,
            revoke_due: HashMap::new(),
            revoke_refused: HashSet::new(),
            watch_until: None,
            watch_at: None,
        }
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<SubCmd>) {
        loop {
            if self.events.strong_count() == 0 {
                break;
            }
            match self.next(&mut rx).await {
                Event::Cmd(None) => break,
                Event::Cmd(Some(SubCmd::Subscribe(tag, reply))) => {
                    let res = self.on_subscribe(&tag).await;
                    let _ = reply.send(res);
                }
                Event::Cmd(Some(SubCmd::Unsubscribe(tag))) => {
                    if self.subscribed.contains(&tag) {
                        self.lingering.insert(tag, Instant::now() + LINGER);
                    }
                }
                Event::Cmd(Some(SubCmd::Hold(channel))) => {
                    let now = Instant::now();
                    self.revoke_sweep.get_or_insert(now + LINGER);
                    if !self.revoke_subscribed.contains(&channel) {
                        self.revoke_due.entry(channel).or_insert(now + REVOKE_DEFER);
                    }
                }
                Event::LingerEnded => self.on_linger_ended().await,
                Event::RevokeDue => self.on_revoke_due().await,
                Event::Incoming(Some(incoming)) => self.on_incoming(incoming).await,
                Event::Silent => self.on_silent().await,
                Event::Incoming(None) => {
                    tracing::warn!(addr = %self.remote.addr, "lost the pub/sub connection; reconnecting");
                    self.reset(Instant::now());
                }
                Event::Reconnect => self.on_reconnect().await,
                Event::Watch => self.on_watch().await,
                Event::MasterSwitched => {
                    if self.conn.is_some() {
                        tracing::info!(addr = %self.remote.addr, "master switched; resubscribing on the new master");
                        self.reset(Instant::now());
                    }
                }
            }
        }
    }

    async fn next(&mut self, rx: &mut mpsc::UnboundedReceiver<SubCmd>) -> Event {
        let reconnect_at = self.reconnect_at;
        let linger_end = (self.lingering.values())
            .chain(self.revoke_sweep.iter())
            .min()
            .copied();
        let listening = !self.subscribed.is_empty() || !self.revoke_subscribed.is_empty();
        let ping_at = (self.conn.is_some() && listening).then(|| self.heard + KEEPALIVE);
        let revoke_due = self.revoke_due.values().min().copied();
        let watch_at = self.watch_at.filter(|_| self.conn.is_some() && listening);
        let conn = &mut self.conn;
        let switches = &mut self.switches;
        tokio::select! {
            cmd = rx.recv() => Event::Cmd(cmd),
            () = switched(switches) => Event::MasterSwitched,
            () = sleep_until(linger_end) => Event::LingerEnded,
            () = sleep_until(revoke_due) => Event::RevokeDue,
            incoming = async {
                match conn.as_mut() {
                    Some(wire) => wire.next().await,
                    None => std::future::pending().await,
                }
            } => Event::Incoming(incoming),
            () = sleep_until(reconnect_at) => Event::Reconnect,
            () = sleep_until(ping_at) => Event::Silent,
            () = sleep_until(watch_at) => Event::Watch,
        }
    }

    async fn on_subscribe(&mut self, tag: &Arc<str>) -> Result<(), BackendError> {
        self.lingering.remove(tag);
        let res = self.subscribe(tag).await;
        if res.is_err() {
            self.reconnect_at = Some(Instant::now() + RECONNECT_DELAY);
        }
        res.map_err(|m| self.error(m))
    }

    async fn on_incoming(&mut self, incoming: Incoming) {
        match incoming {
            Incoming::Message { channel, payload } => {
                if self.conn.as_ref().is_some_and(Wire::one_connection) {
                    self.heard = Instant::now();
                }
                self.on_message(&channel, &payload);
            }
            Incoming::Resubscribed(channel) => {
                if self.revoke_subscribed.contains(&*channel) {
                    self.revocations
                        .resubscribed(&channel, self.remote.delivery);
                } else if let Some(tag) = tag_of_channel(&channel) {
                    self.retry(tag);
                }
            }
            Incoming::Dropped(channel) => self.on_dropped(&channel).await,
            // redis-rs reconnects the node and resubscribes its channels (`Resubscribed`
            // follows); what was published before is missed either way. A dead node's
            // channels come back only with a new layout: the task watches for one.
            Incoming::NodeLost => {
                self.missed();
                self.watch(Instant::now());
            }
            Incoming::Nothing => {}
        }
    }

    fn on_message(&self, channel: &str, payload: &[u8]) {
        if self.revoke_subscribed.contains(channel) {
            if let Ok(token) = std::str::from_utf8(payload) {
                self.revocations.revoke(token);
            }
            return;
        }
        if let (Some(tag), Some(events)) = (tag_of_channel(channel), self.events.upgrade()) {
            events.message(tag, notice(payload, Instant::now()));
        }
    }

    /// The waiters of the lock with this tag retry now (a message may have been missed).
    fn retry(&self, tag: &str) {
        if let Some(events) = self.events.upgrade() {
            events.message(tag, Notice::Released);
        }
    }

    /// The server unsubscribed `channel` (its slot moved to another shard): subscribed again
    /// where the slot is now, when it is still wanted, and its waiters retry.
    async fn on_dropped(&mut self, channel: &str) {
        if let Some(revoke) = self.revoke_subscribed.take(channel) {
            self.subscribe_revoke(&revoke).await;
            return;
        }
        let Some(tag) = tag_of_channel(channel).and_then(|t| self.subscribed.take(t)) else {
            return;
        };
        if self.lingering.remove(&tag).is_some() {
            return;
        }
        tracing::debug!(addr = %self.remote.addr, channel, "shard channel moved; subscribing where its slot is now");
        if self.subscribe(&tag).await.is_err() {
            self.reconnect_at
                .get_or_insert(Instant::now() + RECONNECT_DELAY);
        }
        self.retry(&tag);
    }

    /// Unsubscribes channels whose linger ended and that still have no listener.
    async fn on_linger_ended(&mut self) {
        self.on_revoke_linger_ended().await;
        let Some(events) = self.events.upgrade() else {
            return;
        };
        let wanted: HashSet<Arc<str>> = events.wanted().into_iter().collect();
        let now = Instant::now();
        let due: Vec<Arc<str>> = self
            .lingering
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(tag, _)| tag.clone())
            .collect();
        for tag in due {
            self.lingering.remove(&tag);
            if wanted.contains(&tag) || !self.subscribed.remove(&tag) {
                continue;
            }
            let Some(wire) = self.conn.as_mut() else {
                continue;
            };
            let channel = channel_of(&tag).to_string();
            let res = tokio::time::timeout(self.remote.timeout, wire.unsubscribe(&channel));
            if !matches!(res.await, Ok(Ok(()))) {
                // The connection is unusable: reconnect and resubscribe what is wanted.
                self.reset(Instant::now());
                return;
            }
        }
    }

    /// Subscribes the revoke channels whose wait ([`REVOKE_DEFER`]) ended and that a lease is
    /// still held under; the others are forgotten (their next lease announces them again).
    async fn on_revoke_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Arc<str>> = (self.revoke_due.iter())
            .filter(|(_, at)| **at <= now)
            .map(|(channel, _)| channel.clone())
            .collect();
        for channel in due {
            self.revoke_due.remove(&channel);
            if self.revocations.still_held(&channel) {
                self.subscribe_revoke(&channel).await;
            }
        }
    }

    /// Unsubscribes revoke channels no lease has been held under for [`LINGER`].
    async fn on_revoke_linger_ended(&mut self) {
        let now = Instant::now();
        if self.revoke_sweep.is_none_or(|at| at > now) {
            return;
        }
        let (due, next) = self.revocations.sweep(now, LINGER);
        self.revoke_sweep = next;
        for channel in due {
            self.revoke_refused.remove(&channel);
            if !self.revoke_subscribed.remove(&channel) {
                continue;
            }
            let Some(wire) = self.conn.as_mut() else {
                continue;
            };
            let res = tokio::time::timeout(self.remote.timeout, wire.unsubscribe(&channel));
            if !matches!(res.await, Ok(Ok(()))) {
                self.reset(Instant::now());
                return;
            }
        }
    }

    /// Subscribes a revoke channel, best effort: a failure is logged and left to the
    /// renewals (which find a forced unlock on their own) and to the next reconnect, never a
    /// reason to reconnect by itself (an ACL may deny that one channel).
    async fn subscribe_revoke(&mut self, channel: &Arc<str>) {
        let done =
            self.revoke_subscribed.contains(channel) || self.revoke_refused.contains(channel);
        if done && self.conn.is_some() {
            return;
        }
        if self.conn.is_none() && self.connect().await.is_err() {
            // Retried with the waiters' channels; until then the renewal finds a revocation.
            self.reconnect_at
                .get_or_insert(Instant::now() + RECONNECT_DELAY);
            return;
        }
        let Some(wire) = self.conn.as_mut() else {
            return;
        };
        match tokio::time::timeout(self.remote.timeout, wire.subscribe(channel)).await {
            Ok(Ok(())) => {
                self.revoke_subscribed.insert(channel.clone());
                self.heard = Instant::now();
                // A forced unlock published before this subscription landed (the first one
                // after holding nothing, or after a lost connection) was heard by nobody: the
                // leases held under it are renewed, owner-checked, at once.
                self.revocations.resubscribed(channel, self.remote.delivery);
            }
            Ok(Err(e)) => {
                let refused = SubError::Redis(e);
                if !refused.is_refusal() {
                    self.reset(Instant::now());
                    return;
                }
                self.revoke_refused.insert(channel.clone());
                tracing::warn!(addr = %self.remote.addr, channel = %channel, error = %self.error(refused), "cannot listen for forced unlocks; a holder learns of one at its next renewal");
            }
            Err(_) => {
                tracing::warn!(addr = %self.remote.addr, "pub/sub connection not answering; reconnecting");
                self.reset(Instant::now());
            }
        }
    }

    /// `PING` on a silent connection; no answer in time replaces it.
    async fn on_silent(&mut self) {
        let Some(wire) = self.conn.as_mut() else {
            return;
        };
        let pong = tokio::time::timeout(self.remote.timeout, wire.ping());
        match pong.await {
            // An error reply (an ACL without `+ping`) is an answer too.
            Ok(Ok(_)) => {}
            Ok(Err(e)) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {}
            _ => {
                tracing::warn!(addr = %self.remote.addr, "pub/sub connection not answering PING; reconnecting");
                self.reset(Instant::now());
                return;
            }
        }
        self.heard = Instant::now();
    }

    /// Resubscribes every channel with a listener on a new connection.
    async fn on_reconnect(&mut self) {
        self.reconnect_at = None;
        let Some(events) = self.events.upgrade() else {
            return;
        };
        let wanted = events.wanted();
        drop(events);
        for tag in &wanted {
            if self.subscribe(tag).await.is_err() {
                self.reconnect_at = Some(Instant::now() + RECONNECT_DELAY);
                return;
            }
        }
        for channel in self.revocations.wanted() {
            self.subscribe_revoke(&channel).await;
        }
        self.missed();
    }

    /// Looks for a failover from `now` on, for [`WATCH`] (a sharded wire only).
    fn watch(&mut self, now: Instant) {
        if self.remote.delivery == Delivery::Sharded {
            self.watch_until = Some(now + WATCH);
            self.watch_at = Some(now + WATCH_EVERY);
        }
    }

    /// Replaces a sharded wire whose layout changed (a replica promoted in place of a lost
    /// master): the new one subscribes every channel where its slot is served now.
    async fn on_watch(&mut self) {
        let now = Instant::now();
        let watching = self.watch_until.is_some_and(|until| until > now);
        self.watch_at = Some(now + if watching { WATCH_EVERY } else { WATCH_SLOW });
        let Some(wire) = self.conn.as_mut() else {
            return;
        };
        if let Ok(Some(true)) = tokio::time::timeout(self.remote.timeout, wire.moved()).await {
            tracing::info!(addr = %self.remote.addr, "a shard has a new master; subscribing again where each slot is served now");
            // A replacement for a changed layout does not lengthen the watch: a resharding
            // after a node loss replaces the wire at most until the watch ends.
            let until = self.watch_until;
            self.reset(now);
            self.watch_until = until;
        }
    }

    /// Drops the connection and everything subscribed on it; reconnects at `at`.
    fn reset(&mut self, at: Instant) {
        self.conn = None;
        self.subscribed.clear();
        self.lingering.clear();
        self.revoke_subscribed.clear();
        self.revoke_refused.clear();
        self.reconnect_at = Some(at);
        // The new wire may be built on a layout that is about to change.
        self.watch(Instant::now());
        // Releases may have been missed: let every waiter retry now.
        self.missed();
    }

    fn missed(&self) {
        if let Some(events) = self.events.upgrade() {
            events.missed();
        }
    }

    /// Subscribes the channel of `tag`. A connection that fails to answer (rather than
    /// refusing the channel) may sit on a frozen or vanished node: one more try on a new
    /// connection, the next node for a cluster (for one server, only when the failed
    /// connection was an old one).
    async fn subscribe(&mut self, tag: &Arc<str>) -> Result<(), SubError> {
        if self.subscribed.contains(tag) && self.conn.is_some() {
            return Ok(());
        }
        let old = self.conn.is_some();
        match self.subscribe_once(tag).await {
            Err(e) if !e.is_refusal() && (old || self.remote.connector.is_cluster()) => {
                tracing::warn!(addr = %self.remote.addr, "pub/sub connection not answering; trying a new one");
                self.reset(Instant::now());
                self.subscribe_once(tag).await
            }
            res => res,
        }
    }

    async fn subscribe_once(&mut self, tag: &Arc<str>) -> Result<(), SubError> {
        if self.conn.is_none() {
            self.connect().await?;
        }
        let wire = self.conn.as_mut().expect("connected above");
        let channel = channel_of(tag).to_string();
        let res = tokio::time::timeout(self.remote.timeout, wire.subscribe(&channel)).await;
        match res {
            Ok(Ok(())) => {
                self.subscribed.insert(tag.clone());
                self.heard = Instant::now();
                Ok(())
            }
            Ok(Err(e)) => {
                self.conn = None;
                Err(SubError::Redis(e))
            }
            Err(_) => {
                self.conn = None;
                Err(SubError::Timeout("SUBSCRIBE not answered"))
            }
        }
    }

    async fn connect(&mut self) -> Result<(), SubError> {
        self.subscribed.clear();
        self.revoke_subscribed.clear();
        self.revoke_refused.clear();
        let round = self.round;
        self.round = self.round.wrapping_add(1);
        let connector = self.remote.connector.clone();
        let delivery = self.remote.delivery;
        let connect = async move {
            #[cfg(feature = "cluster")]
            if delivery == Delivery::Sharded {
                let (conn, pushes) = connector.sharded_pubsub().await?;
                let mut shards = Shards::new(conn, pushes);
                shards.built_on = shards.layout().await.ok();
                return Ok(Wire::Sharded(shards));
            }
            let _ = delivery;
            let (sink, stream) = connector
                .pubsub_client(round)
                .await?
                .get_async_pubsub()
                .await?
                .split();
            Ok(Wire::Broadcast(sink, stream))
        };
        let wire = tokio::time::timeout(self.remote.timeout, connect)
            .await
            .map_err(|_| SubError::Timeout("pub/sub connection not established"))?
            .map_err(SubError::Redis)?;
        self.conn = Some(wire);
        self.heard = Instant::now();
        // Anything published before this connection existed was missed.
        self.missed();
        Ok(())
    }

    /// A scrubbed error naming cause and fix (a denied channel gets the ACL rules), as the
    /// command connection's errors do.
    fn error(&self, e: SubError) -> BackendError {
        let scrub = |m: &str| {
            let m = crate::redact::scrub_secrets(m, &self.remote.secrets);
            format!("pub/sub: {m}")
        };
        match e {
            SubError::Redis(e) => diagnose(
                &self.remote.addr,
                self.remote.connector.is_cluster(),
                &e,
                scrub,
            ),
            SubError::Timeout(what) => BackendError::new(
                self.remote.addr.clone(),
                scrub(&format!("{what} within {:?}", self.remote.timeout)),
            ),
        }
    }
}

/// Resolves on the next master switch; never without Sentinel (or once it is gone).
async fn switched(switches: &mut Option<watch::Receiver<u64>>) {
    let open = match switches {
        Some(rx) => rx.changed().await.is_ok(),
        None => false,
    };
    if !open {
        std::future::pending::<()>().await;
    }
}

/// Why subscribing failed.
enum SubError {
    Redis(redis::RedisError),
    Timeout(&'static str),
}

impl SubError {
    /// The server answered with an error (a denied channel, a wrong password): another
    /// connection would be refused too.
    fn is_refusal(&self) -> bool {
        matches!(self, SubError::Redis(e) if e.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(e.kind(), redis::ErrorKind::Server(_)))
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
