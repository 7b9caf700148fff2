//! Throwaway `redis-server` processes and a fault-injecting proxy for tests (feature
//! `testing`).
//!
//! Each [`RedisServer`] is its own process on a free loopback port, with persistence off and
//! its working files in a temporary directory. It is ready when `start` returns (it answered
//! `PING`), and killed, by its own pid, when dropped. Fault tests can [`kill`](RedisServer::kill),
//! [`restart`](RedisServer::restart), [`pause`](RedisServer::pause) and
//! [`resume`](RedisServer::resume) it. This module only ever signals processes it started.
//!
//! A [`FaultProxy`] sits between a client and a server on loopback and, on command, delays,
//! drops or discards traffic, resets connections, stalls them half-open or refuses new ones,
//! per RESP request or reply.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use lockrt::testing::RedisServer;
//!
//! let server = RedisServer::start()?;
//! let locker = lockrt::Locker::connect(&server.url()).await?;
//! let guard = locker.acquire("job", lockrt::LockOptions::new()).await?;
//! # drop(guard); Ok(()) }
//! ```

mod cluster;
mod process;
mod proxy;
mod scoped;
mod sentinel;
mod server;
mod tls;

pub use cluster::{
    CLUSTER_SLOTS, ClusterNode, NodeRole, RedisCluster, SlotMigration, key_in_slot, slot_of,
};
pub use proxy::{Direction, FaultProxy, ProxyCounters};
pub use scoped::with_default;
pub use sentinel::RedisSentinelGroup;
pub use server::{LocalRedis, RedisServer};
pub use tls::{RedisTlsServer, TlsMaterial};

/// Shifts the clock this process sends with every script call by `offset_ms` (negative: behind),
/// as a host whose clock is off would. The scripts only show that clock (a local hand-off's
/// check time); fences and every deadline come from the server's clock, which tests of clock
/// skew check with this. It applies to every `Locker` of the process.
///
/// ```
/// lockrt::testing::skew_clock(1_000); // one second ahead
/// lockrt::testing::skew_clock(0);
/// ```
pub fn skew_clock(offset_ms: i64) {
    let us = offset_ms.saturating_mul(1_000);
    crate::backend::redis::CLOCK_OFFSET_US.store(us, std::sync::atomic::Ordering::Relaxed);
}

/// `schedule` on a wall clock `offset_ms` ahead of the system's (negative: behind), for
/// tests of [`every`](crate::every) and [`spawn_every`](crate::spawn_every) at a time that
/// is not now: a daylight-saving change, a month's end. Only that job reads the shifted clock:
/// its ticks, its waits, the tick it gives the job, its metrics; the lock server's clock and
/// every other job keep theirs. Give every instance of a test the same offset.
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// // Five seconds before Paris moves its clocks forward (2027-03-28T01:00:00Z).
/// let at = UNIX_EPOCH + Duration::from_secs(1_806_195_595);
/// let offset = at.duration_since(SystemTime::now()).unwrap().as_millis() as i64;
/// let each_second = lockrt::Schedule::cron("* * * * * *", "Europe/Paris")?;
/// let shifted = lockrt::testing::shift_job_clock(each_second, offset);
/// # let _ = shifted; Ok::<(), lockrt::LockError>(())
/// ```
pub fn shift_job_clock(mut schedule: crate::Schedule, offset_ms: i64) -> crate::Schedule {
    schedule.offset_ms = offset_ms;
    schedule
}
