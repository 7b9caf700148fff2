//! Waiting for a busy lock without polling.
//!
//! Per lock key a [`Locker`](crate::Locker) keeps one [`Entry`] while anyone uses the key:
//! a FIFO turn (a one-permit fair semaphore) so that its own callers contend in arrival order
//! and only one of them talks to Redis at a time, and a [`Notify`] woken by release messages.
//! Release messages arrive over one pub/sub connection per `Locker`, owned by one task that
//! subscribes a channel when its first listener appears and unsubscribes `LINGER` after the
//! last goes (under steady contention the next wait starts long before, and skips a round trip).
//! Listeners subscribe *before* their retry, so a release between the failed attempt and the
//! wait cannot be missed. Entries and subscriptions are removed as soon as nobody uses them:
//! this module must never leak a subscription or an entry, and never blocks in `Drop`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::error::BackendError;
use crate::key::{channel_of, tag_of_channel};

/// How long a channel stays subscribed after its last listener left: a wait that starts
/// within it needs no `SUBSCRIBE` round trip.
const LINGER: Duration = Duration::from_millis(500);

pub(crate) struct Entry {
    pub(crate) turn: Arc<Semaphore>,
    notify: Notify,
    listeners: AtomicUsize,
    /// Locks handed to a waiter by a release ("g:<token>:<fence>" messages), until claimed.
    grants: Mutex<Vec<Grant>>,
}

/// A lock handed over by a release, as announced on the channel.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    pub(crate) token: String,
    pub(crate) fence: u64,
}

/// Grants kept per key at most: only this locker's head waiter claims one, the rest are
/// other processes' and are dropped oldest first.
const MAX_GRANTS: usize = 8;

impl Entry {
    /// Whether a waiter of this locker is listening for the key's release messages.
    fn listened(&self) -> bool {
        self.listeners.load(Ordering::Relaxed) > 0
    }

    fn deliver(&self, payload: &[u8]) {
        if let Some(rest) = payload.strip_prefix(b"g:")
            && rest.len() > 33
            && rest[32] == b':'
            && let (Ok(token), Some(fence)) = (
                std::str::from_utf8(&rest[..32]),
                std::str::from_utf8(&rest[33..])
                    .ok()
                    .and_then(|f| f.parse().ok()),
            )
        {
            let mut grants = self.grants.lock().unwrap_or_else(|p| p.into_inner());
            if grants.len() >= MAX_GRANTS {
                grants.remove(0);
            }
            grants.push(Grant {
                token: token.to_owned(),
                fence,
            });
        }
        self.notify.notify_waiters();
    }
}

/// Keyed by the lock's tag (`{lock}`), shared with the holders' [`LockKey`](crate::key::LockKey).
type Entries = Mutex<HashMap<Arc<str>, Arc<Entry>>>;

struct Shared {
    entries: Entries,
    remote: Option<mpsc::UnboundedSender<SubCmd>>,
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, HashMap<Arc<str>, Arc<Entry>>> {
        // Map operations are single inserts/removes; a panic elsewhere can't corrupt it.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// (Un)subscribe the release channel of the lock with this tag.
enum SubCmd {
    Subscribe(Arc<str>, oneshot::Sender<Result<(), BackendError>>),
    Unsubscribe(Arc<str>),
}

/// The per-`Locker` registry of keys in use and their release notifications.
#[derive(Clone)]
pub(crate) struct Notifier {
    shared: Arc<Shared>,
}

/// How the pub/sub task reaches Redis.
pub(crate) struct Remote {
    pub(crate) client: Client,
    pub(crate) addr: String,
    pub(crate) timeout: Duration,
    /// The password, to scrub from messages.
    pub(crate) secret: Option<String>,
}

impl Notifier {
    /// Notifications only from this process (the in-memory backend).
    pub(crate) fn local() -> Notifier {
        Notifier {
            shared: Arc::new(Shared {
                entries: Mutex::default(),
                remote: None,
            }),
        }
    }

    /// Notifications from Redis pub/sub, over one connection made on first use.
    pub(crate) fn remote(remote: Remote) -> Notifier {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            entries: Mutex::default(),
            remote: Some(tx),
        });
        tokio::spawn(pubsub_task(remote, Arc::downgrade(&shared), rx));
        Notifier { shared }
    }

    /// The entry for the lock with this tag, created on first use and removed when its last
    /// handle drops.
    pub(crate) fn entry(&self, tag: &Arc<str>) -> EntryHandle {
        let mut map = self.shared.entries();
        let entry = match map.get(tag) {
            Some(e) => e.clone(),
            None => {
                let e = Arc::new(Entry {
                    turn: Arc::new(Semaphore::new(1)),
                    notify: Notify::new(),
                    listeners: AtomicUsize::new(0),
                    grants: Mutex::new(Vec::new()),
                });
                map.insert(tag.clone(), e.clone());
                e
            }
        };
        EntryHandle {
            shared: self.shared.clone(),
            tag: tag.clone(),
            entry: Some(entry),
        }
    }

    /// Wakes this process's waiters for the lock with this tag (a local release: faster than
    /// the message).
    pub(crate) fn wake(&self, tag: &str) {
        if let Some(e) = self.shared.entries().get(tag) {
            e.notify.notify_waiters();
        }
    }

    /// Keys with an entry (held or waited for through this locker).
    pub(crate) fn entries(&self) -> usize {
        self.shared.entries().len()
    }

    /// Channels with at least one listener.
    pub(crate) fn listening(&self) -> usize {
        self.shared
            .entries()
            .values()
            .filter(|e| e.listened())
            .count()
    }
}

/// Keeps a key's entry alive; dropping the last handle removes it.
pub(crate) struct EntryHandle {
    shared: Arc<Shared>,
    tag: Arc<str>,
    entry: Option<Arc<Entry>>,
}

impl EntryHandle {
    fn entry(&self) -> &Entry {
        self.entry.as_ref().expect("entry present until drop")
    }

    pub(crate) fn turn(&self) -> Arc<Semaphore> {
        self.entry().turn.clone()
    }

    /// Starts listening for releases; once this returns, no later release is missed.
    pub(crate) async fn listen(&self) -> Result<Listener<'_>, BackendError> {
        {
            let _map = self.shared.entries();
            self.entry().listeners.fetch_add(1, Ordering::Relaxed);
        }
        let listener = Listener { handle: self };
        if let Some(tx) = &self.shared.remote {
            // Every listener asks; the task answers at once when already subscribed, and its
            // queue orders this after any pending unsubscribe of the same channel.
            let (reply_tx, reply_rx) = oneshot::channel();
            if tx
                .send(SubCmd::Subscribe(self.tag.clone(), reply_tx))
                .is_err()
            {
                return Err(BackendError::new(
                    "pubsub",
                    "the locker's pub/sub task has stopped",
                ));
            }
            match reply_rx.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(BackendError::new(
                        "pubsub",
                        "the locker's pub/sub task has stopped",
                    ));
                }
            }
        }
        Ok(listener)
    }
}

impl Drop for EntryHandle {
    fn drop(&mut self) {
        let mut map = self.shared.entries();
        if let Some(entry) = self.entry.take() {
            drop(entry);
            // Under the map lock every clone is created or dropped, so the count is exact.
            if map
                .get(&self.tag)
                .is_some_and(|e| Arc::strong_count(e) == 1)
            {
                map.remove(&self.tag);
            }
        }
    }
}

/// A registered interest in release messages for one key.
pub(crate) struct Listener<'a> {
    handle: &'a EntryHandle,
}

impl Listener<'_> {
    /// A future that completes on the next release message (enable it before retrying).
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.handle.entry().notify.notified()
    }

    /// Claims a lock a release handed to `token`, if its message has arrived.
    pub(crate) fn take_grant(&self, token: &str) -> Option<Grant> {
        let mut grants = self
            .handle
            .entry()
            .grants
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let i = grants.iter().position(|g| g.token == token)?;
        Some(grants.remove(i))
    }
}

impl Drop for Listener<'_> {
    fn drop(&mut self) {
        let last = {
            let _map = self.handle.shared.entries();
            self.handle
                .entry()
                .listeners
                .fetch_sub(1, Ordering::Relaxed)
                == 1
        };
        if last && let Some(tx) = &self.handle.shared.remote {
            let _ = tx.send(SubCmd::Unsubscribe(self.handle.tag.clone()));
        }
    }
}

/// Owns the pub/sub connection: applies (un)subscriptions in order, fans messages out to
/// entries, reconnects and resubscribes after a drop. Ends when the `Locker` is gone.
async fn pubsub_task(
    remote: Remote,
    shared: Weak<Shared>,
    mut rx: mpsc::UnboundedReceiver<SubCmd>,
) {
    let mut conn: Option<(PubSubSink, PubSubStream)> = None;
    // Tags whose release channel is subscribed.
    let mut subscribed: HashSet<Arc<str>> = HashSet::new();
    // Subscribed tags without listeners, and when to unsubscribe them.
    let mut lingering: HashMap<Arc<str>, Instant> = HashMap::new();
    let mut reconnect_at: Option<tokio::time::Instant> = None;
    let err = |m: String| {
        let m = match remote.secret.as_deref() {
            Some(s) if !s.is_empty() => m.replace(s, "***"),
            _ => m,
        };
        BackendError::new(remote.addr.clone(), format!("pub/sub: {m}"))
    };
    loop {
        let retry = async {
            match reconnect_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let linger_end = lingering.values().min().copied();
        let unlinger = async {
            match linger_end {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let next_msg = async {
            match conn.as_mut() {
                Some((_, stream)) => stream.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            cmd = rx.recv() => {
                let Some(cmd) = cmd else { break };
                match cmd {
                    SubCmd::Subscribe(tag, reply) => {
                        lingering.remove(&tag);
                        let res = subscribe(&remote, &mut conn, &mut subscribed, &shared, &tag).await
                            .map_err(err);
                        if res.is_err() {
                            reconnect_at = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                        }
                        let _ = reply.send(res);
                    }
                    SubCmd::Unsubscribe(tag) => {
                        if subscribed.contains(&tag) {
                            lingering.insert(tag, Instant::now() + LINGER);
                        }
                    }
                }
            }
            () = unlinger => {
                let Some(sh) = shared.upgrade() else { break };
                let now = Instant::now();
                let due: Vec<Arc<str>> = lingering.iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(tag, _)| tag.clone())
                    .collect();
                for tag in due {
                    lingering.remove(&tag);
                    let wanted = sh.entries().get(&tag).is_some_and(|e| e.listened());
                    if !wanted
                        && subscribed.remove(&tag)
                        && let Some((sink, _)) = conn.as_mut()
                        && tokio::time::timeout(remote.timeout, sink.unsubscribe(channel_of(&tag))).await.is_err()
                    {
                        // The connection is unusable: reconnect at once and resubscribe the
                        // channels that still have listeners.
                        conn = None;
                        subscribed.clear();
                        lingering.clear();
                        reconnect_at = Some(tokio::time::Instant::now());
                        break;
                    }
                }
            }
            msg = next_msg => {
                let Some(sh) = shared.upgrade() else { break };
                match msg {
                    Some(msg) => {
                        if let Some(tag) = tag_of_channel(msg.get_channel_name())
                            && let Some(e) = sh.entries().get(tag)
                        {
                            e.deliver(msg.get_payload_bytes());
                        }
                    }
                    None => {
                        tracing::warn!(addr = %remote.addr, "lost the pub/sub connection; reconnecting");
                        conn = None;
                        subscribed.clear();
                        lingering.clear();
                        reconnect_at = Some(tokio::time::Instant::now());
                        // Releases may have been missed: let every waiter retry now.
                        wake_all(&sh);
                    }
                }
            }
            () = retry => {
                reconnect_at = None;
                let Some(sh) = shared.upgrade() else { break };
                let wanted: Vec<Arc<str>> = sh.entries().iter()
                    .filter(|(_, e)| e.listened())
                    .map(|(tag, _)| tag.clone())
                    .collect();
                drop(sh);
                if wanted.is_empty() {
                    continue;
                }
                let mut ok = true;
                for tag in &wanted {
                    if subscribe(&remote, &mut conn, &mut subscribed, &shared, tag).await.is_err() {
                        ok = false;
                        break;
                    }
                }
                if ok {
                    if let Some(sh) = shared.upgrade() { wake_all(&sh) }
                } else {
                    reconnect_at = Some(tokio::time::Instant::now() + Duration::from_millis(200));
                }
            }
        }
    }
}

fn wake_all(sh: &Shared) {
    for e in sh.entries().values() {
        e.notify.notify_waiters();
    }
}

async fn subscribe(
    remote: &Remote,
    conn: &mut Option<(PubSubSink, PubSubStream)>,
    subscribed: &mut HashSet<Arc<str>>,
    shared: &Weak<Shared>,
    tag: &Arc<str>,
) -> Result<(), String> {
    if subscribed.contains(tag) && conn.is_some() {
        return Ok(());
    }
    if conn.is_none() {
        subscribed.clear();
        let ps = tokio::time::timeout(remote.timeout, remote.client.get_async_pubsub())
            .await
            .map_err(|_| {
                format!(
                    "pub/sub connection not established within {:?}",
                    remote.timeout
                )
            })?
            .map_err(|e| e.to_string())?;
        *conn = Some(ps.split());
        // Anything published before this connection existed was missed.
        if let Some(sh) = shared.upgrade() {
            wake_all(&sh);
        }
    }
    let (sink, _) = conn.as_mut().expect("connected above");
    match tokio::time::timeout(remote.timeout, sink.subscribe(channel_of(tag))).await {
        Ok(Ok(())) => {
            subscribed.insert(tag.clone());
            Ok(())
        }
        Ok(Err(e)) => {
            *conn = None;
            Err(e.to_string())
        }
        Err(_) => {
            *conn = None;
            Err(format!(
                "SUBSCRIBE not answered within {:?}",
                remote.timeout
            ))
        }
    }
}
