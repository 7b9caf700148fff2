//! The floor as a [`BenchLock`]: the classic single-instance Redis lock written with plain
//! `redis`, `SET key token NX PX 30000` and an `EVALSHA` compare-and-delete on one
//! `ConnectionManager` ([`Floor`]; one attempt, it never waits). For the hand-off, the same
//! lock with a waiter that blocks in `BLPOP` until the releaser signals ([`SignalledFloor`]).
//! For two keys, two of those locks one after another ([`FloorTwo`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use redis::AsyncCommands;
use redis::aio::{ConnectionManager, MultiplexedConnection};

use super::BenchLock;
use crate::Res;
use crate::env::Env;

/// The compare-and-delete release of the floor (the classic single-instance Redis lock).
const FLOOR_RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// The list a [`SignalledFloor`] waiter blocks on.
const SIGNAL: &str = "bench:h:sig";

/// The floor's lock: `SET NX PX` and an `EVALSHA` compare-and-delete on one connection.
#[derive(Clone)]
pub(crate) struct Floor {
    conn: ConnectionManager,
    sha: String,
    next: Arc<AtomicU64>,
}

impl Floor {
    /// A new connection with the release script loaded.
    pub(crate) async fn new(env: &Env) -> Res<Floor> {
        let mut conn = env.manager().await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(FLOOR_RELEASE)
            .query_async(&mut conn)
            .await?;
        Ok(Floor {
            conn,
            sha,
            next: Arc::default(),
        })
    }

    fn token(&self) -> String {
        // Unique per acquisition like lockrt's 128-bit token (uniqueness is all the floor needs).
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{n:032x}")
    }

    /// One attempt; the token when acquired, else the error `busy`.
    async fn try_lock(&self, key: &str, busy: &'static str) -> Res<String> {
        let token = self.token();
        let mut conn = self.conn.clone();
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await?;
        Ok(ok.map(|_| token).ok_or(busy)?)
    }
}

impl BenchLock for Floor {
    type Guard = String;

    async fn lock(&self, key: &str) -> Res<String> {
        self.try_lock(key, "floor: lock busy").await
    }

    async fn unlock(&self, key: &str, token: String) -> Res<()> {
        let mut conn = self.conn.clone();
        let n: i64 = redis::cmd("EVALSHA")
            .arg(&self.sha)
            .arg(1)
            .arg(key)
            .arg(token)
            .query_async(&mut conn)
            .await?;
        if n != 1 {
            return Err("floor: release found another owner".into());
        }
        Ok(())
    }
}

/// The floor with a signalled waiter: the waiter blocks in `BLPOP bench:h:sig 0` on its own
/// connection, then takes the lock with `SET NX PX`. The holder releases with `DEL key`,
/// then `LPUSH bench:h:sig 1`, measured from the start of `LPUSH` (as specified), or, with
/// `one_trip`, with both in one `MULTI` round trip, measured from its start (like lockrt's).
#[derive(Clone)]
pub(crate) struct SignalledFloor {
    floor: Floor,
    waiter_conn: MultiplexedConnection,
    one_trip: bool,
}

impl SignalledFloor {
    /// `floor`'s lock, its waiters blocking on `waiter_conn` (a connection without timeout).
    pub(crate) fn new(floor: &Floor, waiter_conn: &MultiplexedConnection, one_trip: bool) -> Self {
        SignalledFloor {
            floor: floor.clone(),
            waiter_conn: waiter_conn.clone(),
            one_trip,
        }
    }
}

impl BenchLock for SignalledFloor {
    type Guard = String;

    /// The holder's acquisition: clears the signal list, then takes the lock.
    async fn lock(&self, key: &str) -> Res<String> {
        let () = self.floor.conn.clone().del(SIGNAL).await?;
        self.floor.try_lock(key, "floor: hand-off lock busy").await
    }

    async fn unlock(&self, key: &str, token: String) -> Res<()> {
        self.floor.unlock(key, token).await
    }

    async fn take_over(&self, key: &str) -> Res<String> {
        let _: (String, String) = redis::cmd("BLPOP")
            .arg(SIGNAL)
            .arg(0)
            .query_async(&mut self.waiter_conn.clone())
            .await?;
        let busy = "floor: signalled but the lock is busy";
        self.floor.try_lock(key, busy).await
    }

    async fn hand_over(&self, key: &str, _token: String) -> Res<Instant> {
        let mut conn = self.floor.conn.clone();
        if self.one_trip {
            let start = Instant::now();
            let () = redis::pipe()
                .atomic()
                .del(key)
                .ignore()
                .lpush(SIGNAL, 1)
                .ignore()
                .query_async(&mut conn)
                .await?;
            Ok(start)
        } else {
            let () = conn.del(key).await?;
            let start = Instant::now();
            let _: i64 = conn.lpush(SIGNAL, 1).await?;
            Ok(start)
        }
    }
}

/// Two floor locks one after another, the floor of taking two keys: a pair on `key` takes
/// `key` + `1`, then `key` + `2` (four round trips, as `acquire_all` of two keys makes), and
/// releases them in reverse.
#[derive(Clone)]
pub(crate) struct FloorTwo(pub(crate) Floor);

impl BenchLock for FloorTwo {
    type Guard = (String, String);

    async fn lock(&self, key: &str) -> Res<(String, String)> {
        let first = self.0.lock(&format!("{key}1")).await?;
        match self.0.lock(&format!("{key}2")).await {
            Ok(second) => Ok((first, second)),
            Err(e) => {
                self.0.unlock(&format!("{key}1"), first).await?;
                Err(e)
            }
        }
    }

    async fn unlock(&self, key: &str, (first, second): (String, String)) -> Res<()> {
        self.0.unlock(&format!("{key}2"), second).await?;
        self.0.unlock(&format!("{key}1"), first).await
    }
}
