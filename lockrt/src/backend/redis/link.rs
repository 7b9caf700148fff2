//! The managed command connection ([`Link`]): one pipelined connection that requests from all
//! tasks share, replaced whenever it can no longer be trusted to pair replies with requests
//! (the rules are in `scripts.rs`). `READONLY` (a demoted master) and a Sentinel-announced
//! master switch discard it too. A cluster connection is many node connections: one that timed
//! out or lost a node stays in use while a new one (with a fresh slot map) is built in the
//! background, because building one waits for every node, a frozen one too. redis-rs's
//! `ConnectionManager` reconnects on I/O errors only, not on timeouts, which is why this module
//! keeps its own connection.
//!
//! Its errors are scrubbed of the password, as every error leaving the Redis backend is.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use redis::{AsyncConnectionConfig, RedisError, RetryMethod};

use super::connector::{Conn, Connector};
use super::diagnose::diagnose;
use super::outage::Outage;
use super::settings::Timeouts;
use crate::error::BackendError;

/// The command connection in use, its generation (so that a request that found it broken
/// discards only the one it used, not a fresh one another request already opened) and the
/// master-switch count it was opened under ([`Connector::epoch`]).
type Current = Option<(Conn, u64, u64)>;

/// The command connection and how to replace it; shared with background rebuilds.
pub(crate) struct Link {
    connector: Arc<Connector>,
    /// Where the servers are, for messages: no credentials.
    addr: String,
    /// The passwords, to scrub from messages.
    secrets: Vec<String>,
    timeouts: Timeouts,
    /// Longest `WAIT` (`sync_replicas`): replies may take that much longer.
    wait: Duration,
    current: Mutex<Current>,
    /// Held while opening a connection: one connect at a time, the others wait for it.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// A background rebuild is under way (or cooling down).
    rebuilding: AtomicBool,
    outage: Outage,
    /// A locker built before its server answered: the checks a build makes, run on the
    /// first connection; until they passed, no request is sent. One that found the server
    /// unfit (too old, evicting) refuses every request from then on.
    startup: Option<Box<dyn Startup>>,
    started: tokio::sync::OnceCell<()>,
    refused: std::sync::OnceLock<BackendError>,
}

/// Checks to run on a link's first connection (see [`Link::lazy`]).
pub(crate) trait Startup: Send + Sync {
    fn check<'a>(
        &'a self,
        link: &'a Link,
        conn: Conn,
        generation: u64,
    ) -> futures_util::future::BoxFuture<'a, Result<(), BackendError>>;
}

impl Link {
    pub(crate) fn new(
        connector: Arc<Connector>,
        addr: String,
        secrets: Vec<String>,
        timeouts: Timeouts,
        wait: Duration,
    ) -> Link {
        Link {
            connector,
            addr,
            secrets,
            timeouts,
            wait,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            rebuilding: AtomicBool::new(false),
            outage: Outage::default(),
            startup: None,
            started: tokio::sync::OnceCell::new(),
            refused: std::sync::OnceLock::new(),
        }
    }

    /// This link, for a locker built before its server answered: `startup` runs on the first
    /// connection, before any request is sent on it.
    pub(crate) fn lazy(mut self, startup: Box<dyn Startup>) -> Link {
        self.startup = Some(startup);
        self
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// The settings of every command connection: the connect timeout, and the response
    /// timeout plus the longest `WAIT`.
    pub(crate) fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.response.saturating_add(self.wait)))
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Current> {
        // Only ever a clone or a replacement under the lock: a panic can't leave it torn.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection in use, unless it predates the latest master switch.
    fn current(&self) -> Option<(Conn, u64)> {
        let epoch = self.connector.epoch();
        let mut current = self.locked();
        match current.clone() {
            Some((c, g, e)) if e == epoch => Some((c, g)),
            Some(_) => {
                *current = None;
                None
            }
            None => None,
        }
    }

    /// Puts `conn`, opened under master-switch count `epoch`, in use.
    pub(crate) fn install(&self, conn: Conn, epoch: u64) -> (Conn, u64) {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        *self.locked() = Some((conn.clone(), generation, epoch));
        (conn, generation)
    }

    /// Stops using connection `generation`: the next request opens a new one.
    pub(crate) fn discard(&self, generation: u64) {
        let mut current = self.locked();
        if current.as_ref().is_some_and(|(_, g, _)| *g == generation) {
            *current = None;
        }
    }

    /// Builds a new connection on the current runtime and swaps it in when it is ready,
    /// unless one is being built already; the old one serves meanwhile. At most one
    /// rebuild per response timeout.
    pub(crate) fn rebuild_in_background(self: &Arc<Self>) {
        if self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.rebuilding.store(false, Ordering::Release);
            return;
        };
        let guard = Rebuilding(self.clone());
        rt.spawn(async move {
            let link = &guard.0;
            let limit =
                (link.timeouts.connect.saturating_add(link.timeouts.response)).saturating_mul(2);
            let epoch = link.connector.epoch();
            let cfg = link.config();
            let built = tokio::time::timeout(limit, link.connector.connect(&cfg));
            if let Ok(Ok(conn)) = built.await {
                link.install(conn, epoch);
            }
            tokio::time::sleep(link.timeouts.response).await;
        });
    }

    /// The connection in use, opening one when there is none or the master switched since.
    pub(crate) async fn conn(&self) -> Result<(Conn, u64), BackendError> {
        // Sentinel: a master no Sentinel named within the last second (a deaf watcher may
        // have missed a switch) is confirmed first; when none answers, nothing is sent.
        if !self.connector.master_confirmed() {
            let asked = Instant::now();
            if let Some(e) = self.outage.answer(asked) {
                return Err(e);
            }
            Box::pin(self.connector.confirm_master())
                .await
                .map_err(|u| match u.last.map(|e| self.error(&e)) {
                    // TLS, credentials: the advice any connection would get.
                    Some(e) if !e.is_transient() => e,
                    _ => self.unreachable(
                        BackendError::new(self.addr.clone(), self.scrub(&u.why))
                            .with_hint("check that the Sentinels are running and reachable"),
                    ),
                })?;
            // A Sentinel answered: an outage of the Sentinels ends here (the master's
            // connection may have stayed open all along).
            self.outage.connected(&self.addr);
        }
        let conn = match self.current() {
            Some(c) => c,
            // Boxed: connecting is rare, and its future is large; inline it would grow every
            // request's future (and every future awaiting a lock) by its size.
            None => Box::pin(self.reconnect()).await?,
        };
        if let Some(startup) = &self.startup
            && !self.started.initialized()
        {
            // A trait object: rare, and its type would deepen every request's future.
            let start: futures_util::future::BoxFuture<'_, _> =
                Box::pin(self.start(startup.as_ref(), conn.0.clone(), conn.1));
            start.await?;
        }
        Ok(conn)
    }

    /// The startup checks on `conn`, once they pass; a server found unfit is refused for good.
    async fn start(
        &self,
        startup: &dyn Startup,
        conn: Conn,
        generation: u64,
    ) -> Result<(), BackendError> {
        if let Some(e) = self.refused.get() {
            return Err(e.clone());
        }
        let checked = self
            .started
            .get_or_try_init(|| async move {
                let res = startup.check(self, conn, generation).await;
                if let Err(e) = &res
                    && !e.is_transient()
                {
                    let _ = self.refused.set(e.clone());
                }
                res
            })
            .await;
        checked.map(|_| ())
    }

    async fn reconnect(&self) -> Result<(Conn, u64), BackendError> {
        let asked = Instant::now();
        let _one = self.connecting.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        // A connect that failed while this call waited its turn (or just before) answers it
        // too: one connect at a time, not one per waiting call in turn.
        if let Some(e) = self.outage.answer(asked) {
            return Err(e);
        }
        // Read before resolving the master: a switch during the connect makes it stale.
        let epoch = self.connector.epoch();
        let conn = tokio::time::timeout(
            self.timeouts.connect.saturating_add(self.timeouts.response),
            self.connector.connect(&self.config()),
        )
        .await
        .map_err(|_| {
            self.unreachable(
                BackendError::new(
                    self.addr.clone(),
                    format!("no connection within {:?}", self.timeouts.connect),
                )
                .with_hint("check that Redis is running, reachable and not overloaded"),
            )
        })?
        .map_err(|e| match self.error(&e) {
            e if e.is_transient() => self.unreachable(e),
            // TLS, credentials, a refused `AUTH`: not an outage, and said each time (but
            // not tried again by every call of the next moment).
            e => {
                self.outage.refused(&e);
                e
            }
        })?;
        self.outage.connected(&self.addr);
        Ok(self.install(conn, epoch))
    }

    /// `e`, a connect that failed, marked as such and counted in the outage.
    fn unreachable(&self, e: BackendError) -> BackendError {
        let e = e.unreachable();
        self.outage.failed(&e);
        e
    }

    /// After a request on connection `generation` failed with `e`: a connection that can't
    /// be trusted any more is replaced, a cluster's in the background.
    pub(crate) fn after_failure(self: &Arc<Self>, generation: u64, e: &RedisError) {
        let cluster = self.connector.is_cluster();
        // redis-rs follows redirections (inside a routed pipeline too) a few times; one that
        // still reaches here means its slot map stays stale: a new connection reads it anew.
        let moved = matches!(
            e.retry_method(),
            RetryMethod::MovedRedirect | RetryMethod::AskRedirect
        );
        if !(needs_new_connection(e) || cluster && moved) {
            return;
        }
        if cluster {
            self.rebuild_in_background();
        } else {
            self.discard(generation);
        }
    }

    /// After a check on connection `generation` failed with `e` (at build, or before the
    /// first request): a connection that can't be trusted is dropped, the next call opens one.
    pub(crate) fn check_failed(&self, generation: u64, e: &RedisError) {
        if needs_new_connection(e) {
            self.discard(generation);
        }
    }

    /// A scrubbed error naming cause and fix, transient or not as redis-rs's own
    /// `retry_method` says.
    pub(crate) fn error(&self, e: &RedisError) -> BackendError {
        diagnose(&self.addr, self.connector.is_cluster(), e, |m| {
            self.scrub(m)
        })
    }

    fn scrub(&self, msg: &str) -> String {
        crate::redact::scrub_secrets(msg, &self.secrets)
    }
}

/// Clears `rebuilding` however the rebuild ends (also when its runtime drops it).
struct Rebuilding(Arc<Link>);

impl Drop for Rebuilding {
    fn drop(&mut self) {
        self.0.rebuilding.store(false, Ordering::Release);
    }
}

/// Errors after which the connection can't be trusted to pair replies with requests, or
/// talks to a server that is no longer the master (`READONLY`: redis-rs only refreshes a
/// cluster's slot map for it, a Sentinel connection would stay on the demoted master).
fn needs_new_connection(e: &RedisError) -> bool {
    e.is_timeout()
        || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_unrecoverable_error()
        || matches!(
            e.retry_method(),
            RetryMethod::Reconnect | RetryMethod::RefreshSlotsAndRetry
        )
}
