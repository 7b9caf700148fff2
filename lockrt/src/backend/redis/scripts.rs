//! The Lua scripts, and one script call: its request id, `EVALSHA` or `EVAL`, the `WAIT`
//! after it, and its reply paired with it ([`Scripts`]).
//!
//! A pipelined connection pairs replies with requests by order only, so one reply that never
//! comes (dropped by a middlebox while the TCP connection stays up, or a response timeout)
//! shifts every later reply onto the wrong request. Two rules keep that from ever handing a
//! lock to the wrong caller: every script echoes a request id first in its reply, and a reply
//! with another id, a response timeout or an I/O error discards the connection (the next
//! request opens a new one, bounded by the connect timeout; for Sentinel that resolves the
//! master again; see [`Link`]).
//!
//! Scripts run by `EVALSHA`, and by `EVAL` on the same connection after `NOSCRIPT`: that loads
//! the script on the server that needs it (a cluster slot's master) and nowhere else. With
//! `sync_replicas(n, timeout)`, a `WAIT` follows each acquire and renewal in the same
//! pipeline, and a write fewer than `n` replicas acknowledged does not count. Releases are not
//! acknowledged: a waiter a release hands the lock to confirms it with an acquire (which is).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisWrite, Script, ToRedisArgs, Value};

use super::connector::Conn;
use super::link::Link;
use super::settings::SyncReplicas;
use super::wire::Delivery;
use crate::backend::contract::{Found, Renewed, millis};
use crate::error::BackendError;
use crate::key::{Aux, LockKey, slot_of};

/// Functions the scripts share (`owns`, `take_lock`, the request id), prepended to each.
const PRELUDE: &str = include_str!("../../scripts/lock.lua");

/// A script's text and SHA1, as it publishes with `PUBLISH` and with `SPUBLISH` (sharded
/// delivery, see `wire.rs`).
pub(crate) struct Lua {
    broadcast: Text,
    sharded: Text,
}

struct Text {
    code: String,
    hash: String,
}

impl Text {
    fn new(code: String) -> Text {
        let hash = Script::new(&code).get_hash().to_owned();
        Text { code, hash }
    }
}

impl Lua {
    fn text(&self, delivery: Delivery) -> &Text {
        match delivery {
            Delivery::Broadcast => &self.broadcast,
            Delivery::Sharded => &self.sharded,
        }
    }

    /// The script's source for `delivery`.
    #[cfg(test)]
    pub(crate) fn code(&self, delivery: Delivery) -> &str {
        &self.text(delivery).code
    }
}

fn lua(body: &str) -> Lua {
    let code = [PRELUDE, body].concat();
    // Every publication is written `redis.pcall('PUBLISH', …)`: a test checks it.
    let sharded = code.replace("'PUBLISH'", "'SPUBLISH'");
    Lua {
        broadcast: Text::new(code),
        sharded: Text::new(sharded),
    }
}

pub(crate) static ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/acquire.lua")));
pub(crate) static RENEW: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/renew.lua")));
pub(crate) static RELEASE: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/release.lua")));
pub(crate) static SHARED_ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/shared_acquire.lua")));
pub(crate) static SHARED_RELEASE: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/shared_release.lua")));
pub(crate) static ACQUIRE_ALL: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/acquire_all.lua")));
pub(crate) static INSPECT: LazyLock<Lua> =
    LazyLock::new(|| lua(include_str!("../../scripts/inspect.lua")));
/// Force-unlock: finds the holder's token, then runs release.lua's logic for it.
pub(crate) static FORCE: LazyLock<Lua> = LazyLock::new(|| {
    lua(&[
        include_str!("../../scripts/force.lua"),
        include_str!("../../scripts/release.lua"),
    ]
    .concat())
});

/// One script call: its keys, the scratch key it reads the server's clock through (a lock's
/// [`LockKey::now`] in the call's slot, sent as the last key; renewals have none, see
/// lock.lua), and its arguments after the request id.
pub(crate) struct Call<'a, K, A> {
    pub(crate) nkeys: usize,
    pub(crate) keys: K,
    pub(crate) clock: Option<Aux<'a>>,
    pub(crate) args: A,
}

/// A script's reply without its request id, and, when `sync_replicas` asked for
/// acknowledgement and too few replicas gave it, the error saying so (the script ran).
pub(crate) struct Reply {
    pub(crate) values: Vec<Value>,
    pub(crate) unacknowledged: Option<BackendError>,
}

impl Reply {
    /// The values, if the write counts.
    pub(crate) fn acknowledged(self) -> Result<Vec<Value>, BackendError> {
        match self.unacknowledged {
            None => Ok(self.values),
            Some(e) => Err(e),
        }
    }
}

/// `EVALSHA hash …` or `EVAL code …` for `call`, with the request id as the first argument.
fn script_cmd<K: Fn(&mut Cmd), A: Fn(&mut Cmd)>(
    verb: &str,
    script: &str,
    rid: u64,
    call: &Call<'_, K, A>,
) -> Cmd {
    let mut cmd = redis::cmd(verb);
    cmd.arg(script)
        .arg(call.nkeys + usize::from(call.clock.is_some()));
    (call.keys)(&mut cmd);
    if let Some(clock) = call.clock {
        cmd.arg(clock);
    }
    cmd.arg(rid_arg(rid));
    (call.args)(&mut cmd);
    cmd
}

/// A script's first argument: "<request id>:<µs since the Unix epoch on this host's clock>"
/// (the scripts' client clock, see lock.lua).
fn rid_arg(rid: u64) -> String {
    let us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    #[cfg(feature = "testing")]
    let us = us.saturating_add_signed(i128::from(CLOCK_OFFSET_US.load(Ordering::Relaxed)));
    format!("{rid}:{us}")
}

/// What `testing::skew_clock` adds to the clock the scripts are sent.
#[cfg(feature = "testing")]
pub(crate) static CLOCK_OFFSET_US: std::sync::atomic::AtomicI64 =
    std::sync::atomic::AtomicI64::new(0);

/// The cluster slot of a script call's first key (all of its keys share it): where its
/// `WAIT` must go. Arguments: verb, script, key count, then the keys.
fn first_key_slot(cmd: &Cmd) -> u16 {
    match cmd.args_iter().nth(3) {
        Some(redis::Arg::Simple(key)) => slot_of(key),
        _ => 0,
    }
}

/// Request ids: unique per process, which is all that can share a connection.
static NEXT_RID: AtomicU64 = AtomicU64::new(1);

/// Runs scripts on the managed connection, with the configured replica acknowledgements.
pub(crate) struct Scripts {
    link: Arc<Link>,
    sync: Option<SyncReplicas>,
    delivery: Delivery,
}

impl Scripts {
    pub(crate) fn new(link: Arc<Link>, sync: Option<SyncReplicas>, delivery: Delivery) -> Scripts {
        Scripts {
            link,
            sync,
            delivery,
        }
    }

    /// Whether a write counts only once replicas acknowledged it (`sync_replicas`).
    pub(crate) fn acknowledged_only(&self) -> bool {
        self.sync.is_some()
    }

    /// Runs `script` with the keys and arguments `fill` appends (after the request id
    /// `rid`), and returns its reply without the id. `wait`: follow it with `WAIT` and check
    /// the configured replica acknowledgements (see [`Reply`]). A reply with another id (a
    /// shifted pipeline), a timeout or a broken connection discards the connection and is a
    /// transient error: the request may or may not have run.
    pub(crate) async fn invoke<K: Fn(&mut Cmd), A: Fn(&mut Cmd)>(
        &self,
        script: &Lua,
        wait: bool,
        call: Call<'_, K, A>,
    ) -> Result<Reply, BackendError> {
        let on = self.link.conn().await?;
        self.invoke_on(on, script, wait, call).await
    }

    /// [`invoke`](Self::invoke) on connection `on` (with its generation), so that a hedged
    /// call knows which connection its first try went out on.
    pub(crate) async fn invoke_on<K: Fn(&mut Cmd), A: Fn(&mut Cmd)>(
        &self,
        (mut conn, generation): (Conn, u64),
        script: &Lua,
        wait: bool,
        call: Call<'_, K, A>,
    ) -> Result<Reply, BackendError> {
        let rid = NEXT_RID.fetch_add(1, Ordering::Relaxed);
        let sync = self.sync.filter(|_| wait);
        let script = script.text(self.delivery);
        let cmd = script_cmd("EVALSHA", &script.hash, rid, &call);
        let mut res = self.send(&mut conn, sync, cmd).await;
        if res.as_ref().is_err_and(is_noscript) {
            // Loads it where it is needed, on the same connection and node.
            let cmd = script_cmd("EVAL", &script.code, rid, &call);
            res = self.send(&mut conn, sync, cmd).await;
        }
        let mut reply = match res {
            Ok(r) => r,
            Err(e) => {
                self.link.after_failure(generation, &e);
                return Err(self.link.error(&e));
            }
        };
        let acks = if sync.is_some() { reply.pop() } else { None };
        let Value::Array(mut reply) = reply.pop().unwrap_or(Value::Nil) else {
            self.link.discard(generation);
            return Err(self.mismatch());
        };
        if reply.is_empty() || !is_rid(&reply[0], rid) {
            self.link.discard(generation);
            return Err(self.mismatch());
        }
        reply.remove(0);
        let unacknowledged = match (sync, acks) {
            (Some(sync), Some(acks)) => self.check_acks(sync, &acks).err(),
            _ => None,
        };
        Ok(Reply {
            values: reply,
            unacknowledged,
        })
    }

    /// The script call alone, or followed by `WAIT` in one pipeline (so `WAIT` counts the
    /// script's own writes on the same server).
    async fn send(
        &self,
        conn: &mut Conn,
        sync: Option<SyncReplicas>,
        cmd: Cmd,
    ) -> Result<Vec<Value>, RedisError> {
        // Server errors come back as values here; make them errors, as `query_async` does.
        match sync {
            None => Ok(vec![conn.req_packed_command(&cmd).await?.extract_error()?]),
            Some(s) => {
                let slot = first_key_slot(&cmd);
                let mut pipe = redis::pipe();
                pipe.add_command(cmd)
                    .cmd("WAIT")
                    .arg(s.replicas)
                    .arg(millis(s.timeout));
                let mut replies = conn.pipeline_at(pipe, slot).await?.into_iter();
                let script = replies.next().unwrap_or(Value::Nil).extract_error()?;
                // The script ran: an error answering `WAIT` (an ACL without `+wait`) is an
                // unacknowledged write, which the caller releases, not a failed request.
                Ok(vec![script, replies.next().unwrap_or(Value::Nil)])
            }
        }
    }

    fn check_acks(&self, sync: SyncReplicas, acks: &Value) -> Result<(), BackendError> {
        if let Value::ServerError(e) = acks {
            return Err(self.link.error(&RedisError::from(e.clone())));
        }
        let acked = match acks {
            Value::Int(n) => *n,
            _ => 0,
        };
        if acked >= i64::from(sync.replicas) {
            return Ok(());
        }
        Err(BackendError::new(
            self.link.addr().to_owned(),
            format!(
                "only {acked} of the {} required replicas acknowledged the write within {:?}",
                sync.replicas, sync.timeout
            ),
        )
        .with_hint(
            "the lock does not count and was released; retry later (a failover may be under \
             way, or a replica is down or lagging)",
        ))
    }

    fn mismatch(&self) -> BackendError {
        BackendError::new(
            self.link.addr().to_owned(),
            "a reply belonging to another request arrived (a reply was lost on the \
             connection); reconnecting",
        )
    }
}

/// Whether a reply's first element echoes request `rid` (see [`rid_arg`]).
fn is_rid(v: &Value, rid: u64) -> bool {
    let Value::BulkString(b) = v else {
        return false;
    };
    let id = b.split(|&c| c == b':').next().unwrap_or_default();
    std::str::from_utf8(id).ok() == Some(rid.to_string().as_str())
}

/// The integers of a script reply (anything else reads as 0, which every caller treats as
/// the cautious answer: not acquired, not renewed, not released).
pub(crate) fn ints(v: &[Value]) -> Vec<i64> {
    v.iter()
        .map(|x| match x {
            Value::Int(i) => *i,
            _ => 0,
        })
        .collect()
}

/// One call's result as one outcome per lease.
pub(crate) fn per_lease(res: Result<Vec<Found>, BackendError>, n: usize) -> Vec<Renewed> {
    match res {
        Ok(v) => v.into_iter().map(Ok).collect(),
        Err(e) => vec![Err(e); n],
    }
}

/// The seven names one lock's acquire- and release-shaped scripts take, in their KEYS order.
pub(crate) fn lock_keys(c: &mut Cmd, key: &LockKey) {
    c.arg(key.lock())
        .arg(key.state())
        .arg(key.queue())
        .arg(key.waiters())
        .arg(key.owner())
        .arg(key.shared())
        .arg(key.shared_info());
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// An auxiliary name goes into a command as one argument, written straight into the
/// command's buffer (no `String` built for it).
impl ToRedisArgs for Aux<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        // Writing into the command's own buffer cannot fail.
        let _ = write!(w, "{self}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_must_match() {
        assert!(is_rid(
            &Value::BulkString(b"42:1764643200000000".to_vec()),
            42
        ));
        assert!(is_rid(&Value::BulkString(rid_arg(42).into_bytes()), 42));
        assert!(!is_rid(
            &Value::BulkString(b"41:1764643200000000".to_vec()),
            42
        ));
        assert!(!is_rid(&Value::BulkString(b"421:1".to_vec()), 42));
        assert!(!is_rid(&Value::Nil, 42));
    }

    #[test]
    fn aux_names_are_written_as_one_argument() {
        let k = LockKey::new("lock:", "stock:1").unwrap();
        let args = redis::cmd("X")
            .arg(k.state())
            .arg(k.queue())
            .get_packed_command();
        let text = String::from_utf8(args).unwrap();
        assert!(text.contains("$20\r\n{lock:stock:1}:state\r\n"), "{text:?}");
        assert!(text.contains("$16\r\n{lock:stock:1}:q\r\n"), "{text:?}");
    }

    #[test]
    fn sharded_scripts_publish_with_spublish_only() {
        let all = [
            &*ACQUIRE,
            &*RENEW,
            &*RELEASE,
            &*SHARED_ACQUIRE,
            &*SHARED_RELEASE,
            &*ACQUIRE_ALL,
            &*INSPECT,
            &*FORCE,
        ];
        let mut publishing = 0;
        for script in all {
            let broadcast = script.code(Delivery::Broadcast);
            let sharded = script.code(Delivery::Sharded);
            // Every publication is written one way, so the rewrite finds each.
            let calls = broadcast.matches("'PUBLISH'").count();
            assert_eq!(calls, broadcast.matches("redis.pcall('PUBLISH', ").count());
            assert!(!broadcast.to_ascii_uppercase().contains("\"PUBLISH\""));
            assert_eq!(calls, sharded.matches("redis.pcall('SPUBLISH', ").count());
            assert!(!sharded.contains("'PUBLISH'"));
            publishing += usize::from(calls > 0);
            assert_ne!(
                (calls > 0).then_some(&script.broadcast.hash),
                Some(&script.sharded.hash)
            );
        }
        assert_eq!(
            publishing,
            all.len(),
            "the prelude publishes, so every script does"
        );
    }
}
