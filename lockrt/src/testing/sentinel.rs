//! Throwaway Redis Sentinel group: one master, one replica and 1 or more sentinels on loopback.
//!
//! What it owns: the two data servers (each a [`RedisServer`]), the sentinel processes
//! (`redis-server <dir>/sentinel.conf --sentinel`, each with its own temporary directory, which
//! sentinels rewrite), the wait until the group is usable (every sentinel names the master and
//! has seen the replica in sync, and knows every other sentinel), and failovers. It never asks
//! a data server who the master is: the sentinels are the source of truth, as for a client.
//! Every process is killed by its pid on drop; every wait is bounded.

use std::fmt::Write as _;
use std::io;
use std::time::{Duration, Instant};

use super::RedisServer;
use super::cluster::{Daemon, query, redis_server, wait_until};
use super::free_port;

/// `down-after-milliseconds`: a silent master is down after 1 s.
const DOWN_AFTER_MS: u64 = 1000;
/// `failover-timeout`.
const FAILOVER_TIMEOUT_MS: u64 = 5000;
/// How long the group may take to be usable (measured: ~0.1 s with one sentinel, about 2 s
/// with three, which find each other through hello messages sent every 2 s).
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long one sentinel may take to answer `PING` after its start.
const SENTINEL_START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisSentinelGroup::failover`] waits for every sentinel to name the new master.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// Attempts at finding a port nobody grabs between our probe and the sentinel's bind.
const PORT_ATTEMPTS: usize = 5;
/// The most sentinels one group may have.
const MAX_SENTINELS: usize = 7;

/// One master, one replica and `n` sentinels monitoring them under one service name.
///
/// The data servers keep their ports for the group's life; which of them is the master is what
/// the sentinels say ([`master_port`](Self::master_port)). Dropping the group kills every
/// process.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use lockrt::testing::RedisSentinelGroup;
///
/// let group = RedisSentinelGroup::start("locks", 1)?;
/// let sentinels = group.sentinel_urls(); // hand these and group.service() to a client
/// let old = group.master_port()?;
/// let took = group.failover()?;          // SENTINEL FAILOVER, until the replica is named
/// assert_ne!(group.master_port()?, old);
/// # let _ = (sentinels, took); Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisSentinelGroup {
    service: String,
    servers: Vec<RedisServer>,
    // Before `dirs`: a sentinel is killed before its directory is removed.
    sentinels: Vec<Daemon>,
    _dirs: Vec<tempfile::TempDir>,
}

impl RedisSentinelGroup {
    /// Starts a master, a replica of it and `sentinels` sentinels (1 to 7; an odd number makes
    /// sense) monitoring it as `service` with quorum `sentinels / 2 + 1`,
    /// `down-after-milliseconds` 1000 and `failover-timeout` 5000, and waits until every
    /// sentinel names the master, has seen the replica in sync and knows the other sentinels.
    ///
    /// `service` is letters, digits, `.`, `_` and `-`. Fails with the install command when
    /// `redis-server` is missing.
    pub fn start(service: &str, sentinels: usize) -> io::Result<RedisSentinelGroup> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
        if service.is_empty() || !service.chars().all(valid) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("service name {service:?}: use letters, digits, '.', '_' and '-'"),
            ));
        }
        if !(1..=MAX_SENTINELS).contains(&sentinels) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a sentinel group has 1 to {MAX_SENTINELS} sentinels, not {sentinels}"),
            ));
        }
        let sync = [
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        let master = RedisServer::start_with(&sync)?;
        let master_port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(sync);
        let replica = RedisServer::start_with(&replica_args)?;
        let mut group = RedisSentinelGroup {
            service: service.to_owned(),
            servers: vec![master, replica],
            sentinels: Vec::with_capacity(sentinels),
            _dirs: Vec::with_capacity(sentinels),
        };
        let quorum = sentinels / 2 + 1;
        for _ in 0..sentinels {
            let dir = tempfile::Builder::new()
                .prefix("lockrt-sentinel-")
                .tempdir()?;
            let sentinel = start_sentinel(&dir, service, group.servers[0].port(), quorum)?;
            group.sentinels.push(sentinel);
            group._dirs.push(dir);
        }
        group.wait_ready()?;
        Ok(group)
    }

    fn wait_ready(&self) -> io::Result<()> {
        let (master, replica) = (self.servers[0].port(), self.servers[1].port());
        let others = (self.sentinels.len() - 1).to_string();
        wait_until("the sentinel group to be ready", READY_TIMEOUT, || {
            let repl: String = query(replica, redis::cmd("INFO").arg("replication"))?;
            if !repl.contains("master_link_status:up") {
                return Err(format!("replica 127.0.0.1:{replica} is not in sync yet"));
            }
            for sentinel in &self.sentinels {
                let port = sentinel.port();
                if self.ask_master(port)? != master {
                    return Err(format!("sentinel {port} does not name the master yet"));
                }
                let replicas: Vec<Vec<String>> = query(
                    port,
                    redis::cmd("SENTINEL").arg("REPLICAS").arg(&self.service),
                )?;
                let synced = replicas.iter().any(|r| {
                    let pairs = pairs(r);
                    pairs.get("port").map(String::as_str) == Some(replica.to_string().as_str())
                        && pairs.get("flags").map(String::as_str) == Some("slave")
                        && pairs.get("master-link-status").map(String::as_str) == Some("ok")
                });
                if !synced {
                    return Err(format!("sentinel {port} has not seen the replica in sync"));
                }
                let state: Vec<String> = query(
                    port,
                    redis::cmd("SENTINEL").arg("MASTER").arg(&self.service),
                )?;
                if pairs(&state).get("num-other-sentinels") != Some(&others) {
                    return Err(format!(
                        "sentinel {port} does not know every other sentinel"
                    ));
                }
            }
            Ok(Some(()))
        })
    }

    /// The service (master) name the sentinels monitor.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// `redis://127.0.0.1:<port>/` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port()))
            .collect()
    }

    /// The ports of the sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(Daemon::port).collect()
    }

    /// The process ids of every running process of the group: data servers, then sentinels.
    pub fn pids(&self) -> Vec<u32> {
        let servers = self.servers.iter().filter_map(RedisServer::pid);
        servers
            .chain(self.sentinels.iter().filter_map(Daemon::pid))
            .collect()
    }

    /// The port of the master, as the first sentinel that answers names it now.
    pub fn master_port(&self) -> io::Result<u16> {
        let mut last = String::from("the group has no sentinel");
        for sentinel in &self.sentinels {
            match self.ask_master(sentinel.port()) {
                Ok(port) => return Ok(port),
                Err(e) => last = e,
            }
        }
        Err(io::Error::other(last))
    }

    /// The ports of the running data servers other than the master.
    pub fn replica_ports(&self) -> io::Result<Vec<u16>> {
        let master = self.master_port()?;
        Ok(self
            .servers
            .iter()
            .filter(|s| s.pid().is_some() && s.port() != master)
            .map(RedisServer::port)
            .collect())
    }

    /// The data servers (master and replica), in start order: the first was the first master.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data server on `port`, to pause, resume, kill or restart it.
    pub fn server_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        self.servers.iter_mut().find(|s| s.port() == port)
    }

    /// The data server the sentinels name as master now.
    pub fn master(&self) -> io::Result<&RedisServer> {
        let port = self.master_port()?;
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .ok_or_else(|| io::Error::other(format!("the sentinels name an unknown master {port}")))
    }

    /// Freezes the master (SIGSTOP); the sentinels declare it down after 1 s and fail over.
    /// Returns its port, for [`resume`](RedisServer::resume) via [`servers`](Self::servers).
    pub fn pause_master(&self) -> io::Result<u16> {
        let master = self.master()?;
        master.pause()?;
        Ok(master.port())
    }

    /// Kills the master (SIGKILL); the sentinels fail over after 1 s. Returns its port.
    pub fn kill_master(&mut self) -> io::Result<u16> {
        let port = self.master_port()?;
        if let Some(server) = self.server_mut(port) {
            server.kill();
        }
        Ok(port)
    }

    /// Runs `SENTINEL FAILOVER <service>` on the first sentinel and waits until every sentinel
    /// names the other data server as master. Returns how long that took.
    ///
    /// The old master is reconfigured as a replica later (when a sentinel next inspects it,
    /// up to ~10 s): until then it still accepts writes, which is the window split-brain tests
    /// are about.
    pub fn failover(&self) -> io::Result<Duration> {
        let start = Instant::now();
        let old = self.master_port()?;
        let first = self.sentinels[0].port();
        let _: String = query(
            first,
            redis::cmd("SENTINEL").arg("FAILOVER").arg(&self.service),
        )
        .map_err(io::Error::other)?;
        self.wait_for_new_master(old, FAILOVER_WAIT)?;
        Ok(start.elapsed())
    }

    /// Waits, at most `timeout`, until every running sentinel names a master other than
    /// `old_port` (after [`pause_master`](Self::pause_master) or
    /// [`kill_master`](Self::kill_master), say). Returns the new master's port.
    pub fn wait_for_new_master(&self, old_port: u16, timeout: Duration) -> io::Result<u16> {
        wait_until("the sentinels to name a new master", timeout, || {
            let mut named = None;
            for sentinel in self.sentinels.iter().filter(|s| s.pid().is_some()) {
                let port = self.ask_master(sentinel.port())?;
                if port == old_port || named.is_some_and(|n| n != port) {
                    return Err(format!("sentinel {} names {port}", sentinel.port()));
                }
                named = Some(port);
            }
            Ok(named)
        })
    }

    /// `SENTINEL get-master-addr-by-name` on one sentinel.
    fn ask_master(&self, sentinel: u16) -> Result<u16, String> {
        let addr: Option<(String, u16)> = query(
            sentinel,
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(&self.service),
        )?;
        addr.map(|(_, port)| port)
            .ok_or_else(|| format!("sentinel {sentinel} does not know {}", self.service))
    }
}

/// Flat `[k1, v1, k2, v2, ...]` replies of `SENTINEL MASTER`/`REPLICAS` as a map.
fn pairs(flat: &[String]) -> std::collections::HashMap<String, String> {
    flat.chunks_exact(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect()
}

fn start_sentinel(
    dir: &tempfile::TempDir,
    service: &str,
    master: u16,
    quorum: usize,
) -> io::Result<Daemon> {
    let conf = dir.path().join("sentinel.conf");
    let log = dir.path().join("sentinel.log");
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        let mut text = String::new();
        let _ = writeln!(
            text,
            "port {port}\nbind 127.0.0.1\ndaemonize no\nloglevel notice"
        );
        let _ = writeln!(
            text,
            "dir {}\nlogfile {}",
            dir.path().display(),
            log.display()
        );
        let _ = writeln!(
            text,
            "sentinel monitor {service} 127.0.0.1 {master} {quorum}"
        );
        let _ = writeln!(
            text,
            "sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}"
        );
        let _ = writeln!(
            text,
            "sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}"
        );
        let _ = writeln!(text, "sentinel parallel-syncs {service} 1");
        std::fs::write(&conf, text)?;
        let mut cmd = redis_server();
        cmd.arg(&conf).arg("--sentinel");
        let ping = |p: u16| query::<String>(p, &redis::cmd("PING")).is_ok();
        match Daemon::start(cmd, port, log.clone(), SENTINEL_START_TIMEOUT, ping) {
            Ok(daemon) => return Ok(daemon),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("could not start a sentinel")))
}
