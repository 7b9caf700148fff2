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

use super::process::{Daemon, free_port, query, redis_server, wait_until};
use super::server::RedisServer;
use super::tls::TlsMaterial;

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
    /// Each data server's port as the sentinels name it: its TLS port in a TLS group.
    announced: Vec<u16>,
    /// The sentinels' TLS ports (empty without TLS); their plain ports serve this module.
    sentinel_tls: Vec<u16>,
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
        RedisSentinelGroup::start_inner(service, sentinels, None, &[])
    }

    /// Like [`start`](Self::start), with `args` added to both data servers' command lines
    /// (e.g. ACL `--user` lines). The sentinels, the replication link and this type's own
    /// checks connect as the default user, which must keep its commands and channels.
    pub fn start_with_server_args(
        service: &str,
        sentinels: usize,
        args: &[&str],
    ) -> io::Result<RedisSentinelGroup> {
        RedisSentinelGroup::start_inner(service, sentinels, None, args)
    }

    /// Like [`start`](Self::start), with TLS everywhere clients go: the data servers and the
    /// sentinels also listen on a TLS port with `material`'s server certificate (clients need
    /// no certificate), replication and the sentinels' own connections use TLS, and the
    /// sentinels name the data servers by their TLS ports. [`sentinel_urls`](Self::sentinel_urls)
    /// are `rediss://` URLs; trusting them needs `material`'s CA.
    pub fn start_tls(
        service: &str,
        sentinels: usize,
        material: &TlsMaterial,
    ) -> io::Result<RedisSentinelGroup> {
        RedisSentinelGroup::start_inner(service, sentinels, Some(material), &[])
    }

    fn start_inner(
        service: &str,
        sentinels: usize,
        tls: Option<&TlsMaterial>,
        args: &[&str],
    ) -> io::Result<RedisSentinelGroup> {
        check_group(service, sentinels)?;
        let (master, master_at) = data_server(args, tls)?;
        let master_port = master_at.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(args);
        let (replica, replica_at) = data_server(&replica_args, tls)?;
        let mut group = RedisSentinelGroup {
            service: service.to_owned(),
            servers: vec![master, replica],
            announced: vec![master_at, replica_at],
            sentinel_tls: Vec::new(),
            sentinels: Vec::with_capacity(sentinels),
            _dirs: Vec::with_capacity(sentinels),
        };
        let quorum = sentinels / 2 + 1;
        for _ in 0..sentinels {
            let dir = tempfile::Builder::new()
                .prefix("lockrt-sentinel-")
                .tempdir()?;
            let monitor = Monitor {
                service,
                master: master_at,
                quorum,
            };
            let (sentinel, tls_port) = start_sentinel(&dir, &monitor, tls)?;
            group.sentinels.push(sentinel);
            group.sentinel_tls.extend(tls_port);
            group._dirs.push(dir);
        }
        group.wait_ready()?;
        Ok(group)
    }

    fn wait_ready(&self) -> io::Result<()> {
        let (master, replica) = (self.announced[0], self.announced[1]);
        let replica_plain = self.servers[1].port();
        let others = (self.sentinels.len() - 1).to_string();
        wait_until("the sentinel group to be ready", READY_TIMEOUT, || {
            let repl: String = query(replica_plain, redis::cmd("INFO").arg("replication"))?;
            if !repl.contains("master_link_status:up") {
                return Err(format!(
                    "replica 127.0.0.1:{replica_plain} is not in sync yet"
                ));
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

    /// `redis://127.0.0.1:<port>/` of every sentinel (`rediss://` and the TLS ports in a
    /// group from [`start_tls`](Self::start_tls)).
    pub fn sentinel_urls(&self) -> Vec<String> {
        if !self.sentinel_tls.is_empty() {
            return self
                .sentinel_tls
                .iter()
                .map(|p| format!("rediss://127.0.0.1:{p}/"))
                .collect();
        }
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

    /// The port of the master, as the first sentinel that answers names it now (a TLS port
    /// in a group from [`start_tls`](Self::start_tls)).
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

    /// The ports of the running data servers other than the master, as the sentinels name
    /// them.
    pub fn replica_ports(&self) -> io::Result<Vec<u16>> {
        let master = self.master_port()?;
        Ok(self
            .servers
            .iter()
            .zip(&self.announced)
            .filter(|(s, port)| s.pid().is_some() && **port != master)
            .map(|(_, port)| *port)
            .collect())
    }

    /// The data servers (master and replica), in start order: the first was the first master.
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data server on `port` (as the sentinels name it), to pause, resume, kill or
    /// restart it.
    pub fn server_mut(&mut self, port: u16) -> Option<&mut RedisServer> {
        let i = self.announced.iter().position(|p| *p == port)?;
        self.servers.get_mut(i)
    }

    /// The data server the sentinels name as master now.
    pub fn master(&self) -> io::Result<&RedisServer> {
        let port = self.master_port()?;
        let i = self.announced.iter().position(|p| *p == port);
        i.and_then(|i| self.servers.get(i))
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

/// Refuses a service name a config file can't hold and a group size out of range.
fn check_group(service: &str, sentinels: usize) -> io::Result<()> {
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
    Ok(())
}

/// The `redis-server` settings that make a process speak TLS on `port` with `material`'s
/// server certificate, replicate over TLS and connect to others with it; clients need none.
fn tls_settings(port: u16, material: &TlsMaterial) -> Vec<(String, String)> {
    let path = |p: std::path::PathBuf| p.display().to_string();
    vec![
        ("tls-port".into(), port.to_string()),
        ("tls-cert-file".into(), path(material.server_cert_path())),
        ("tls-key-file".into(), path(material.server_key_path())),
        ("tls-ca-cert-file".into(), path(material.ca_cert_path())),
        ("tls-auth-clients".into(), "no".into()),
        ("tls-replication".into(), "yes".into()),
    ]
}

/// A data server with `args`, quick to sync a replica; with `tls`, also on a TLS port.
/// Returns it and the port the sentinels will know it by.
fn data_server(args: &[&str], tls: Option<&TlsMaterial>) -> io::Result<(RedisServer, u16)> {
    let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    for a in [
        "--repl-diskless-sync",
        "yes",
        "--repl-diskless-sync-delay",
        "0",
    ] {
        all.push(a.to_owned());
    }
    let tls_port = tls.map(|_| free_port()).transpose()?;
    if let (Some(port), Some(material)) = (tls_port, tls) {
        for (k, v) in tls_settings(port, material) {
            all.push(format!("--{k}"));
            all.push(v);
        }
    }
    let refs: Vec<&str> = all.iter().map(String::as_str).collect();
    let server = RedisServer::start_with(&refs)?;
    let port = tls_port.unwrap_or(server.port());
    Ok((server, port))
}

/// What a sentinel monitors: `service` at `127.0.0.1:master`, with `quorum`.
struct Monitor<'a> {
    service: &'a str,
    master: u16,
    quorum: usize,
}

/// A sentinel (plain port for this module; with `tls`, a TLS port too, returned).
fn start_sentinel(
    dir: &tempfile::TempDir,
    monitor: &Monitor<'_>,
    tls: Option<&TlsMaterial>,
) -> io::Result<(Daemon, Option<u16>)> {
    let conf = dir.path().join("sentinel.conf");
    let log = dir.path().join("sentinel.log");
    let mut last = None;
    for _ in 0..PORT_ATTEMPTS {
        let port = free_port()?;
        let tls_port = tls.map(|_| free_port()).transpose()?;
        std::fs::write(
            &conf,
            sentinel_conf(dir, &log, port, monitor, tls_port.zip(tls)),
        )?;
        let mut cmd = redis_server();
        cmd.arg(&conf).arg("--sentinel");
        let ping = |p: u16| query::<String>(p, &redis::cmd("PING")).is_ok();
        match Daemon::start(cmd, port, log.clone(), SENTINEL_START_TIMEOUT, ping) {
            Ok(daemon) => return Ok((daemon, tls_port)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("could not start a sentinel")))
}

fn sentinel_conf(
    dir: &tempfile::TempDir,
    log: &std::path::Path,
    port: u16,
    m: &Monitor<'_>,
    tls: Option<(u16, &TlsMaterial)>,
) -> String {
    let Monitor {
        service,
        master,
        quorum,
    } = m;
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
    if let Some((tls_port, material)) = tls {
        for (k, v) in tls_settings(tls_port, material) {
            let _ = writeln!(text, "{k} {v}");
        }
    }
    text
}
