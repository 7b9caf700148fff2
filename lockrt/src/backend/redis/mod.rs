//! Redis, whatever the topology ([`Connector`]): the three lock scripts ([`scripts`]) over one
//! pipelined connection (requests from all tasks share it), which [`Link`] replaces whenever it
//! can no longer be trusted.
//!
//! Owns credential hygiene: every error leaving this module is scrubbed of the password.

mod client;
#[cfg(feature = "cluster")]
mod cluster;
pub(crate) mod connector;
mod diagnose;
mod link;
mod listener;
mod notice;
mod outage;
pub(crate) mod pubsub;
mod revoke;
mod scan;
mod scripts;
#[cfg(feature = "testing")]
pub(crate) use scripts::CLOCK_OFFSET_US;
#[cfg(feature = "sentinel")]
mod sentinel;
pub(crate) mod settings;
mod version;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Value};

use self::connector::{Conn, Connector};
use self::link::Link;
use self::listener::Remote;
use self::pubsub::Subscriber;
use self::scripts::{
    ACQUIRE, ACQUIRE_ALL, Call, FORCE, INSPECT, RELEASE, RENEW, SHARED_ACQUIRE, SHARED_RELEASE,
    Scripts, ints, lock_keys, per_lease,
};
use self::settings::{RedisSettings, Timeouts, TlsFiles, Topology};
use self::wire::Delivery;
use crate::backend::contract::{
    Attempt, Found, LockState, Queueing, Released, Renewal, Renewed, SharedState, Token, kind_code,
    millis, parse_kind,
};
use crate::error::BackendError;
use crate::key::{LockKey, slot_of};
use crate::owner::Holder;

/// Parses the topology into a [`Connector`]; an invalid URL or setting is a permanent error
/// that names no password. `wait`: the longest `WAIT`, added to the response timeout of a
/// cluster connection (which applies that timeout itself).
fn connector(
    topology: Topology,
    tls: &TlsFiles,
    timeouts: Timeouts,
    wait: Duration,
) -> Result<Connector, BackendError> {
    let replies = Timeouts {
        response: timeouts.response.saturating_add(wait),
        ..timeouts
    };
    Connector::new(topology.clone(), tls, replies).map_err(|e| {
        let msg = topology.scrub(&e.to_string());
        BackendError::new(
            topology.describe(),
            format!("invalid Redis URL or setting: {msg}"),
        )
        .with_hint("check the URLs and the builder's settings")
        .permanent()
    })
}

pub(crate) struct RedisBackend {
    connector: Arc<Connector>,
    addr: String,
    timeouts: Timeouts,
    fence_retention: Duration,
    link: Arc<Link>,
    scripts: Scripts,
    subscriber: Subscriber,
    owner: String,
    delivery: Delivery,
}

impl RedisBackend {
    /// Opens the command connection and checks the server, failing fast (within the connect
    /// and response timeouts) with the server's address when it is unreachable.
    pub(crate) async fn connect(settings: RedisSettings) -> Result<RedisBackend, BackendError> {
        let RedisSettings {
            topology,
            tls,
            timeouts,
            fence_retention,
            sync,
            owner,
            sharded_pubsub,
            allow_eviction,
            lazy,
        } = settings;
        let wait = sync.map_or(Duration::ZERO, |s| s.timeout);
        let addr = topology.describe();
        let connector = Arc::new(connector(topology, &tls, timeouts, wait)?);
        let secrets = connector.secrets();
        let link = Link::new(
            connector.clone(),
            addr.clone(),
            secrets.clone(),
            timeouts,
            wait,
        );
        let check = version::ServerCheck {
            connector: connector.clone(),
            addr: addr.clone(),
            timeouts,
            sharded_allowed: sharded_pubsub,
            allow_eviction,
        };
        let (link, delivery) = match link.conn().await {
            Ok((mut conn, generation)) => {
                let delivery = check.run(&link, &mut conn, generation).await?;
                (link, delivery)
            }
            // Started before its server: the build's checks run on the first connection.
            Err(e) if lazy && e.is_unreachable() => {
                tracing::info!(
                    addr = %addr,
                    error = %e.message(),
                    "lock server not reachable yet; calls fail with a Backend error until it answers"
                );
                let expected = check.assumed_delivery();
                let started = version::Started { check, expected };
                (link.lazy(Box::new(started)), expected)
            }
            Err(e) => return Err(e),
        };
        let link = Arc::new(link);
        let subscriber = Subscriber::new(Remote {
            connector: connector.clone(),
            addr: addr.clone(),
            timeout: timeouts.connect.saturating_add(timeouts.response),
            secrets,
            delivery,
        });
        Ok(RedisBackend {
            connector,
            addr,
            timeouts,
            fence_retention,
            link: link.clone(),
            scripts: Scripts::new(link, sync, delivery),
            subscriber,
            owner,
            delivery,
        })
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    pub(crate) fn subscriber(&self) -> Subscriber {
        self.subscriber.clone()
    }

    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        token: &Token,
        ttl: Duration,
        queue: Option<Queueing>,
    ) -> Result<Attempt, BackendError> {
        let (register, grant) =
            queue.map_or((0, 0), |q| (millis(q.register), millis(q.grant_lease)));
        let retention = millis(self.fence_retention);
        let call = Call {
            clock: Some(key.now()),
            nkeys: 7,
            keys: |c: &mut Cmd| lock_keys(c, key),
            args: |c: &mut Cmd| {
                c.arg(token.as_str())
                    .arg(millis(ttl))
                    .arg(retention)
                    .arg(register)
                    .arg(grant)
                    .arg(&self.owner);
                if key.kind.is_shared() {
                    c.arg(kind_code(key.kind));
                }
            },
        };
        let script = if key.kind.is_shared() {
            &*SHARED_ACQUIRE
        } else {
            &*ACQUIRE
        };
        let reply = self.scripts.invoke(script, true, call).await?;
        if let Some(e) = reply.unacknowledged {
            // Not acknowledged: the lock must not count, so it must not stay either. No proof
            // and no mark: the acquisition goes on with this token, and a proof from before it
            // held would hide a later loss.
            let _ = self
                .release_as(key, Some(token), None, Mode::Rollback)
                .await;
            return Err(e);
        }
        Ok(attempt_of(&reply.values))
    }

    /// Takes every lock of `locks` (all of one [`renewal_group`](Self::renewal_group)) in one
    /// call when each is free with nobody queued: their fences, or `None` when any was not
    /// (nothing taken). Under `sync_replicas` an unacknowledged call takes nothing either: its
    /// locks are rolled back and the caller goes one by one.
    pub(crate) async fn acquire_all(
        &self,
        locks: &[(&LockKey, &Token)],
        ttl: Duration,
    ) -> Result<Option<Vec<u64>>, BackendError> {
        let call = Call {
            // Its one path reads no server time (see acquire_all.lua).
            clock: None,
            nkeys: 7 * locks.len(),
            keys: |c: &mut Cmd| {
                for (key, _) in locks {
                    lock_keys(c, key);
                }
            },
            args: |c: &mut Cmd| {
                c.arg(millis(ttl))
                    .arg(millis(self.fence_retention))
                    .arg(&self.owner);
                for (_, token) in locks {
                    c.arg(token.as_str());
                }
            },
        };
        let reply = self.scripts.invoke(&ACQUIRE_ALL, true, call).await?;
        let values = ints(&reply.values);
        let taken = values.first() == Some(&1);
        if let Some(e) = reply.unacknowledged {
            if taken {
                for (key, token) in locks {
                    let _ = self
                        .release_as(key, Some(token), None, Mode::Rollback)
                        .await;
                }
            }
            return Err(e);
        }
        Ok(taken.then(|| {
            values[1..]
                .iter()
                .map(|&f| u64::try_from(f).unwrap_or(0))
                .collect()
        }))
    }

    /// The cluster slot of the lock; 0 off a cluster, where any renewals share a call.
    pub(crate) fn renewal_group(&self, key: &LockKey) -> u16 {
        if self.connector.is_cluster() {
            slot_of(key.lock().as_bytes())
        } else {
            0
        }
    }

    /// One script call for `batch`, whose locks share one [`renewal_group`] (a script may
    /// touch the keys of one cluster slot only), hedged against a lost reply: still
    /// unanswered at `hedge_at` (counted from when a connection was there), the same call goes
    /// out at once on an extra, fresh connection. The first answer wins; an error waits for
    /// the other call. If the extra one wins, the first connection, which still owes a reply
    /// (a reply dropped on a live connection shifts every later one onto the wrong request),
    /// is replaced by it; if the first wins (a slow but lossless link), nothing changes. Both
    /// may run: a renewal is an owner-checked `PEXPIRE`, and each reply is paired by its own
    /// request id on its own connection. A cluster connection is rebuilt in the background
    /// instead (building one waits for every node) and the first call keeps its timeout.
    ///
    /// [`renewal_group`]: RedisBackend::renewal_group
    pub(crate) async fn renew_hedged(
        &self,
        batch: &[Renewal<'_>],
        hedge_at: tokio::time::Instant,
    ) -> Vec<Renewed> {
        let asked = tokio::time::Instant::now();
        let on = match self.link.conn().await {
            Ok(on) => on,
            Err(e) => return per_lease(Err(e), batch.len()),
        };
        // The hedge clock starts once the call can go out: a reconnect is no lost reply.
        let hedge_at = hedge_at + asked.elapsed();
        let generation = on.1;
        let first = self.renew_one_call(batch, Some(on));
        tokio::pin!(first);
        let res = match tokio::time::timeout_at(hedge_at, &mut first).await {
            Ok(res) => res,
            Err(_) if self.connector.is_cluster() => {
                self.link.rebuild_in_background();
                first.await
            }
            Err(_) => {
                tracing::debug!(addr = %self.addr, "renewal unanswered; hedging on an extra connection");
                // The first connection stays in use: on a slow but lossless link its reply
                // still comes first, and replacing it would make every renewal reconnect.
                let second = self.renew_on_extra(batch);
                tokio::pin!(second);
                tokio::select! {
                    res = &mut first => match res {
                        Ok(v) => Ok(v),
                        Err(_) => second.await,
                    },
                    res = &mut second => match res {
                        Ok(v) => {
                            // The first connection still owes a reply (lost, or very late):
                            // later replies on it could pair with the wrong requests.
                            self.link.discard(generation);
                            Ok(v)
                        }
                        Err(_) => first.await,
                    },
                }
            }
        };
        per_lease(res, batch.len())
    }

    /// A renewal on a connection of its own, opened for it (bounded by the connect and
    /// response timeouts) and put in use when the call succeeds.
    async fn renew_on_extra(&self, batch: &[Renewal<'_>]) -> Result<Vec<Found>, BackendError> {
        let epoch = self.connector.epoch();
        let conn = tokio::time::timeout(
            self.timeouts.connect.saturating_add(self.timeouts.response),
            self.connector.connect(&self.link.config()),
        )
        .await
        .map_err(|_| BackendError::new(self.addr.clone(), "no connection for a hedged renewal"))?
        .map_err(|e| self.link.error(&e))?;
        // Generation 0 is never installed: a failure on this connection discards nothing else.
        let out = self.renew_one_call(batch, Some((conn.clone(), 0))).await?;
        self.link.install(conn, epoch);
        Ok(out)
    }

    /// One renewal call, on connection `on` when given.
    async fn renew_one_call(
        &self,
        batch: &[Renewal<'_>],
        on: Option<(Conn, u64)>,
    ) -> Result<Vec<Found>, BackendError> {
        let call = Call {
            clock: None,
            nkeys: 3 * batch.len(),
            keys: |c: &mut Cmd| {
                // A share's "lock" is the key's shared holders, its "owner key" their records.
                for r in batch {
                    match r.key.kind.is_shared() {
                        true => c.arg(r.key.shared()),
                        false => c.arg(r.key.lock()),
                    };
                }
                for r in batch {
                    match r.key.kind.is_shared() {
                        true => c.arg(r.key.shared_info()),
                        false => c.arg(r.key.owner()),
                    };
                }
                // The lock's state: whether a token no longer holding was force-unlocked.
                for r in batch {
                    c.arg(r.key.state());
                }
            },
            args: |c: &mut Cmd| {
                for r in batch {
                    match r.key.kind.is_shared() {
                        true => c.arg(format!("s{}:{}", r.token.as_str(), r.counter)),
                        false => c.arg(format!("{}:{}", r.token.as_str(), r.counter)),
                    };
                }
                for r in batch {
                    c.arg(millis(r.lease));
                }
                if let [
                    Renewal {
                        passed_to: Some(place),
                        ..
                    },
                ] = batch
                {
                    c.arg(place);
                }
            },
        };
        let reply = match on {
            Some(on) => self.scripts.invoke_on(on, &RENEW, true, call).await?,
            None => self.scripts.invoke(&RENEW, true, call).await?,
        };
        let out = ints(&reply.acknowledged()?);
        if out.len() != batch.len() {
            return Err(BackendError::new(
                self.addr.clone(),
                "renewal reply has the wrong length",
            ));
        }
        let found = |v| match v {
            1 => Found::Renewed,
            2 => Found::Forced,
            _ => Found::Gone,
        };
        Ok(out.into_iter().map(found).collect())
    }

    /// A holder's release, recorded in the lock's state so that a retry tells it from a loss
    /// (`counter`: the fencing counter's value the lease was taken with); with `keep`, the lock
    /// stays taken (owner-checked) for that long instead (`min_hold`), recorded the same way.
    pub(crate) async fn release(
        &self,
        key: &LockKey,
        token: &Token,
        counter: u64,
        keep: Option<Duration>,
    ) -> Result<Released, BackendError> {
        let mode = keep.map_or(Mode::Release, Mode::Keep);
        self.release_as(key, Some(token), Some(counter), mode).await
    }

    /// The release of an acquisition that ended without a guard: also marks `token` so that
    /// none of its requests still in the network takes anything when it lands.
    pub(crate) async fn abandon(
        &self,
        key: &LockKey,
        token: &Token,
    ) -> Result<Released, BackendError> {
        self.release_as(key, Some(token), None, Mode::Abandon).await
    }

    /// Whether a write counts only once replicas acknowledged it (`sync_replicas`).
    pub(crate) fn acknowledged_only(&self) -> bool {
        self.scripts.acknowledged_only()
    }

    /// release.lua for `token`, or force.lua (for whichever token holds the lock) with `None`.
    /// `abandon`: see [`abandon`](Self::abandon).
    async fn release_as(
        &self,
        key: &LockKey,
        token: Option<&Token>,
        counter: Option<u64>,
        mode: Mode,
    ) -> Result<Released, BackendError> {
        let retention = millis(self.fence_retention);
        let call = Call {
            clock: Some(key.now()),
            nkeys: 7,
            keys: |c: &mut Cmd| lock_keys(c, key),
            args: |c: &mut Cmd| {
                c.arg(token.map_or("", Token::as_str))
                    .arg(key.channel())
                    .arg(retention);
                match mode {
                    Mode::Abandon => c.arg("a"),
                    Mode::Keep(keep) => c.arg(format!("k{}", millis(keep))),
                    Mode::Rollback => c.arg("b"),
                    Mode::Release => c.arg(""),
                };
                match counter {
                    Some(n) => c.arg(n),
                    None => c.arg(""),
                };
                if token.is_none() {
                    // force.lua's last argument: where the holder's locker hears of it.
                    c.arg(self.delivery.revoke_channel(key));
                }
            },
        };
        let script = match (token, key.kind.is_shared()) {
            (None, _) => &*FORCE,
            (Some(_), false) => &*RELEASE,
            (Some(_), true) => &*SHARED_RELEASE,
        };
        let reply = ints(&self.scripts.invoke(script, false, call).await?.values);
        Ok(match reply.first() {
            Some(0) => Released::NotOwner,
            Some(2) => Released::HandedOver,
            // 3: an earlier try of this release landed (its proof is there).
            _ => Released::Freed,
        })
    }
}

/// What a release-shaped script call is for.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// A holder's release: recorded in the lock's state.
    Release,
    /// `min_hold`: keeps the lock (owner-checked) for this long instead, recorded the same way.
    Keep(Duration),
    /// The compensation of an abandoned acquisition: marks the token refused.
    Abandon,
    /// Undoing an unacknowledged acquire that goes on with the same token: no proof, no mark.
    Rollback,
}

impl RedisBackend {
    /// Releases `key` whoever holds it, as its holder's release would (hand-over included).
    pub(crate) async fn force_release(&self, key: &LockKey) -> Result<Released, BackendError> {
        self.release_as(key, None, None, Mode::Release).await
    }

    /// Lock `key` as inspection reports it, `None` when free.
    pub(crate) async fn lock_state(
        &self,
        key: &LockKey,
    ) -> Result<Option<LockState>, BackendError> {
        let call = Call {
            clock: Some(key.now()),
            nkeys: 7,
            keys: |c: &mut Cmd| lock_keys(c, key),
            args: |_: &mut Cmd| {},
        };
        let reply = self.scripts.invoke(&INSPECT, false, call).await?.values;
        let text = |i: usize| match reply.get(i) {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        let int = |i: usize| match reply.get(i) {
            Some(Value::Int(n)) => *n,
            _ => -1,
        };
        let value = text(0);
        let waiters = u64::try_from(int(3)).unwrap_or(0);
        let shared: Vec<SharedState> = (5..reply.len())
            .step_by(2)
            .map(|i| {
                let record = text(i + 1);
                let (fence, owner) = record.split_once('|').unwrap_or(("", ""));
                SharedState {
                    fence: fence.parse().ok(),
                    remaining: Duration::from_millis(u64::try_from(int(i)).unwrap_or(0)),
                    holder: Holder::parse(owner),
                }
            })
            .collect();
        if !value.is_empty() {
            return Ok(Some(LockState {
                fence: fence_of_value(&value),
                remaining: u64::try_from(int(1)).ok().map(Duration::from_millis),
                holder: Holder::parse(&text(2)),
                waiters,
                kind: crate::options::LockKind::Exclusive,
                shared: Vec::new(),
                // release.lua's `kept_by`: a token no holder has.
                kept: value.starts_with('k'),
            }));
        }
        let Some(kind) = parse_kind(&text(4)).filter(|_| !shared.is_empty()) else {
            return Ok(None);
        };
        Ok(Some(LockState {
            fence: shared.iter().filter_map(|s| s.fence).max(),
            remaining: shared.iter().map(|s| s.remaining).max(),
            holder: None,
            waiters,
            kind,
            shared,
            kept: false,
        }))
    }
}

/// What an acquire script's reply says (see acquire.lua).
fn attempt_of(values: &[Value]) -> Attempt {
    if let Some(found) = conflict(values) {
        return Attempt::Conflict { found };
    }
    let reply = ints(values);
    let n = reply.get(1).copied().unwrap_or(0);
    if reply.first() == Some(&1) {
        Attempt::Acquired {
            fence: u64::try_from(n).unwrap_or(0),
        }
    } else if n == -5 {
        Attempt::Pruning
    } else {
        // -1: a key without expiry (not ours); -3: free but promised to an earlier waiter;
        // -4: this token's acquisition was abandoned.
        Attempt::Held {
            pttl: u64::try_from(n).ok().map(Duration::from_millis),
            counter: reply.get(2).and_then(|&c| u64::try_from(c).ok()),
        }
    }
}

/// The kind a `-6` reply of an acquire script names: the key is in use as that kind.
fn conflict(reply: &[Value]) -> Option<crate::options::LockKind> {
    let code = ints(reply);
    if code.first() != Some(&0) || code.get(1) != Some(&-6) {
        return None;
    }
    match reply.get(3) {
        Some(Value::BulkString(b)) => parse_kind(&String::from_utf8_lossy(b)),
        _ => None,
    }
}

/// The fence in a lock's value `<token>:<fence>` (the token is 32 hex digits, see `Token`),
/// as lock.lua writes it: whatever follows the token and its separator.
fn fence_of_value(value: &str) -> Option<u64> {
    value.get(33..).and_then(|f| f.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fences_are_read_from_lock_values_as_lock_lua_writes_them() {
        let token = Token::new();
        let value = format!("{}:{}", token.as_str(), 42);
        assert_eq!(fence_of_value(&value), Some(42));
        for foreign in ["", "42", "abc:42", "x:y", &format!("{}:", token.as_str())] {
            // Nothing after the token's 33 bytes, or not a number there.
            assert_eq!(fence_of_value(foreign), None, "{foreign:?}");
        }
    }
}
