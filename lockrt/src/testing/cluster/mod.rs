//! Throwaway Redis Cluster: N masters with optional replicas, each a [`RedisServer`] on
//! loopback, joined with `redis-cli --cluster create`.
//!
//! What it owns: the node processes (killed by pid on drop, as every [`RedisServer`] is), the
//! cluster's creation and the waits for it to settle (all slots covered, every node agreeing,
//! replicas in sync), and the operations tests of topology changes need: SIGSTOP/SIGCONT of a
//! node, `CLUSTER FAILOVER`, and the migration of one slot. Every wait is bounded in time and
//! every loop in count; a timeout says what the cluster last looked like.

use std::io;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::process::{free_port, query, query_with, redis_cli, run_bounded, wait_until};
use super::server::RedisServer;
use view::{ViewEntry, cluster_view, fields};

mod slots;
mod view;

pub use slots::{CLUSTER_SLOTS, key_in_slot, slot_of};

/// `cluster-node-timeout`: short, so that an automatic failover takes seconds, not minutes.
const NODE_TIMEOUT_MS: u64 = 2000;
/// How long creation plus settling may take (measured: ~2.2 s for 3 masters, with or without
/// a replica each).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `redis-cli` may run for one command.
const CLI_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `CLUSTER FAILOVER` may take until every node agrees on the new master.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the key moves and the ownership change of one slot migration may take.
const MIGRATION_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts at starting a node whose cluster bus port someone grabbed first.
const BUS_PORT_ATTEMPTS: usize = 3;
/// The most nodes one cluster may have (masters times one plus replicas).
const MAX_NODES: usize = 30;
/// Keys moved per `MIGRATE`.
const MIGRATE_BATCH: usize = 100;

/// A Redis Cluster of throwaway `redis-server` processes on loopback.
///
/// Nodes are numbered from 0 in start order, masters first; the numbers never change, also
/// when a failover swaps roles (ask [`nodes`](Self::nodes) for the roles of now). Dropping the
/// cluster kills every node.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use lockrt::testing::{RedisCluster, slot_of};
///
/// let cluster = RedisCluster::start(3, 1)?; // 3 masters, 1 replica each
/// let seeds = cluster.seed_urls();          // hand these to a cluster client
/// let owner = cluster.master_of_slot(slot_of("lock:{stock:1}"))?;
/// let replica = cluster.nodes()?.into_iter().find(|n| n.master == Some(owner)).unwrap();
/// let took = cluster.failover(replica.index)?; // the replica now serves those slots
/// # let _ = (seeds, took); Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
}

#[derive(Debug)]
struct Node {
    server: RedisServer,
    id: String,
    paused: AtomicBool,
}

/// One node of a [`RedisCluster`] as the cluster sees it now.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterNode {
    /// Its number in the cluster (start order, masters first); what the cluster's methods take.
    pub index: usize,
    /// Its cluster node id.
    pub id: String,
    /// Its loopback port.
    pub port: u16,
    /// Its process id, `None` once [`kill`](RedisCluster::kill)ed.
    pub pid: Option<u32>,
    /// Master or replica, as the cluster's view says.
    pub role: NodeRole,
    /// The node a replica replicates, by index; `None` for a master.
    pub master: Option<usize>,
    /// The hash slots a master serves (empty for a replica).
    pub slots: Vec<RangeInclusive<u16>>,
    /// Whether it is [`pause`](RedisCluster::pause)d (SIGSTOP).
    pub paused: bool,
    /// Whether the cluster flags it as failing (`fail` or `fail?`).
    pub failing: bool,
}

/// The role of a cluster node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeRole {
    /// Serves hash slots.
    Master,
    /// Replicates a master.
    Replica,
}

impl RedisCluster {
    /// Starts `masters` masters (at least 3, as `redis-cli --cluster create` demands) with
    /// `replicas_per_master` replicas each, and waits until every slot is served, every node
    /// says `cluster_state:ok` and knows all others, and every replica is in sync.
    ///
    /// Nodes run with `cluster-node-timeout` 2000 ms and `repl-diskless-sync-delay 0`. Fails
    /// with the install command when `redis-server` or `redis-cli` is missing.
    pub fn start(masters: usize, replicas_per_master: usize) -> io::Result<RedisCluster> {
        let total = masters.saturating_mul(replicas_per_master.saturating_add(1));
        if masters < 3 || total > MAX_NODES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a test cluster has 3 or more masters and at most {MAX_NODES} nodes in all \
                     (asked for {masters} masters with {replicas_per_master} replicas each)"
                ),
            ));
        }
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(Node {
                server: start_node()?,
                id: String::new(),
                paused: AtomicBool::new(false),
            });
        }
        let mut cluster = RedisCluster { nodes };
        let mut cmd = redis_cli();
        cmd.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.server.port()));
        }
        cmd.args([
            "--cluster-replicas",
            &replicas_per_master.to_string(),
            "--cluster-yes",
        ]);
        let out = run_bounded(&mut cmd, CLI_TIMEOUT)?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let ids = cluster.wait_settled(masters, total - masters)?;
        for (node, id) in cluster.nodes.iter_mut().zip(ids) {
            node.id = id;
        }
        Ok(cluster)
    }

    /// Waits until every node agrees on a healthy cluster; returns the node ids in index order.
    fn wait_settled(&self, masters: usize, replicas: usize) -> io::Result<Vec<String>> {
        wait_until("the cluster to settle", READY_TIMEOUT, || {
            let mut ids = Vec::with_capacity(self.nodes.len());
            for node in &self.nodes {
                let port = node.server.port();
                let info = fields(&query::<String>(port, redis::cmd("CLUSTER").arg("INFO"))?);
                let field = |k: &str| info.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
                let known = self.nodes.len().to_string();
                if field("cluster_state") != Some("ok")
                    || field("cluster_slots_ok") != Some("16384")
                    || field("cluster_known_nodes") != Some(known.as_str())
                {
                    return Err(format!("127.0.0.1:{port} says {info:?}"));
                }
                let view = cluster_view(port)?;
                let count = |role| view.iter().filter(|e| e.master == role).count();
                if count(true) != masters || count(false) != replicas {
                    return Err(format!("127.0.0.1:{port} does not see every role yet"));
                }
                // A message published before a bus link is up is not delivered over it.
                if let Some(e) = view.iter().find(|e| !e.linked) {
                    return Err(format!("127.0.0.1:{port} has no bus link to {} yet", e.id));
                }
                let me = view
                    .iter()
                    .find(|e| e.myself)
                    .ok_or_else(|| format!("127.0.0.1:{port} does not list itself"))?;
                if !me.master {
                    let repl = query::<String>(port, redis::cmd("INFO").arg("replication"))?;
                    if !repl.contains("master_link_status:up") {
                        return Err(format!("replica 127.0.0.1:{port} is not in sync yet"));
                    }
                }
                ids.push(me.id.clone());
            }
            Ok(Some(ids))
        })
    }

    /// `redis://127.0.0.1:<port>/` of every node, masters first: seeds for a cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.server.url()).collect()
    }

    /// The number of nodes, masters and replicas.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Always `false`: a cluster has at least 3 nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// `redis://127.0.0.1:<port>/` of node `index`.
    ///
    /// Panics when `index` is out of range, as every method taking a node index does.
    pub fn url(&self, index: usize) -> String {
        self.nodes[index].server.url()
    }

    /// The loopback port of node `index`.
    pub fn port(&self, index: usize) -> u16 {
        self.nodes[index].server.port()
    }

    /// The process id of node `index`, while it runs.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.nodes[index].server.pid()
    }

    /// The process ids of all running nodes.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(|n| n.server.pid()).collect()
    }

    /// A `redis::Client` for node `index` alone (it answers `MOVED` for other slots).
    pub fn client(&self, index: usize) -> redis::Client {
        self.nodes[index].server.client()
    }

    /// Every node with its role, slots and state, as the first running, unpaused node sees the
    /// cluster now.
    pub fn nodes(&self) -> io::Result<Vec<ClusterNode>> {
        let view = self.view()?;
        let index_of = |id: &str| self.nodes.iter().position(|n| n.id == id);
        self.nodes
            .iter()
            .enumerate()
            .map(|(index, node)| {
                let entry = view.iter().find(|e| e.id == node.id).ok_or_else(|| {
                    io::Error::other(format!("node {index} is missing from the cluster's view"))
                })?;
                Ok(ClusterNode {
                    index,
                    id: node.id.clone(),
                    port: node.server.port(),
                    pid: node.server.pid(),
                    role: if entry.master {
                        NodeRole::Master
                    } else {
                        NodeRole::Replica
                    },
                    master: entry.master_id.as_deref().and_then(index_of),
                    slots: entry.slots.iter().map(|&(a, b)| a..=b).collect(),
                    paused: node.paused.load(Ordering::SeqCst),
                    failing: entry.failing,
                })
            })
            .collect()
    }

    /// The index of the master serving `slot` (see [`slot_of`]), as the cluster sees it now.
    pub fn master_of_slot(&self, slot: u16) -> io::Result<usize> {
        let view = self.view()?;
        let entry = view
            .iter()
            .find(|e| e.master && e.serves(slot))
            .ok_or_else(|| io::Error::other(format!("no master serves slot {slot}")))?;
        self.index_of(&entry.id)
    }

    /// A key (`<prefix><n>`) that node `master` serves now, to place a key on a chosen node.
    pub fn key_on(&self, master: usize, prefix: &str) -> io::Result<String> {
        let view = self.view()?;
        let id = &self.nodes[master].id;
        let entry = view
            .iter()
            .find(|e| &e.id == id && e.master && !e.slots.is_empty())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("node {master} serves no slot"),
                )
            })?;
        // One slot in three (or fewer) per candidate: found within a handful of tries.
        (0..1_000_000u32)
            .map(|n| format!("{prefix}{n}"))
            .find(|key| entry.serves(slot_of(key)))
            .ok_or_else(|| io::Error::other(format!("no key for node {master} found")))
    }

    /// Kills node `index` at once (SIGKILL). Its replica takes over after the node timeout
    /// (2 s) plus an election, if it has one.
    pub fn kill(&mut self, index: usize) {
        self.nodes[index].server.kill();
    }

    /// Freezes node `index` (SIGSTOP): connections stay open, nothing is answered.
    pub fn pause(&self, index: usize) -> io::Result<()> {
        let node = &self.nodes[index];
        node.server.pause()?;
        node.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Thaws node `index` (SIGCONT).
    pub fn resume(&self, index: usize) -> io::Result<()> {
        let node = &self.nodes[index];
        node.server.resume()?;
        node.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Runs `CLUSTER FAILOVER` on replica `replica` (a coordinated failover: its master must be
    /// up and answering) and waits until every running, unpaused node sees it as a master
    /// serving slots and its old master as a replica. Returns how long that took.
    pub fn failover(&self, replica: usize) -> io::Result<Duration> {
        let start = Instant::now();
        let id = self.nodes[replica].id.clone();
        let old = self
            .view()?
            .into_iter()
            .find(|e| e.id == id && !e.master)
            .and_then(|e| e.master_id)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("node {replica} is a master; CLUSTER FAILOVER is run on a replica"),
                )
            })?;
        let port = self.port(replica);
        let _: String =
            query(port, redis::cmd("CLUSTER").arg("FAILOVER")).map_err(io::Error::other)?;
        wait_until("the failover", FAILOVER_TIMEOUT, || {
            for node in self.live() {
                let port = node.server.port();
                let view = cluster_view(port)?;
                if !view
                    .iter()
                    .any(|e| e.id == id && e.master && !e.slots.is_empty())
                {
                    return Err(format!(
                        "127.0.0.1:{port} does not see node {replica} as master"
                    ));
                }
                if view.iter().any(|e| e.id == old && e.master) {
                    return Err(format!(
                        "127.0.0.1:{port} still sees the old master as master"
                    ));
                }
            }
            Ok(Some(()))
        })?;
        Ok(start.elapsed())
    }

    /// Moves `slot` from its master to master `to`, keys and all, and waits until every
    /// running, unpaused node sees `to` serving it. Returns the number of keys moved.
    ///
    /// The same as [`begin_slot_migration`](Self::begin_slot_migration), then
    /// [`move_keys`](SlotMigration::move_keys), then [`finish`](SlotMigration::finish).
    pub fn migrate_slot(&self, slot: u16, to: usize) -> io::Result<usize> {
        let migration = self.begin_slot_migration(slot, to)?;
        let moved = migration.move_keys()?;
        migration.finish()?;
        Ok(moved)
    }

    /// Starts moving `slot` to master `to`: `CLUSTER SETSLOT <slot> IMPORTING` on `to`, then
    /// `MIGRATING` on its current master. From here until [`finish`](SlotMigration::finish),
    /// clients get `ASK` redirections for keys of the slot that have already moved.
    pub fn begin_slot_migration(&self, slot: u16, to: usize) -> io::Result<SlotMigration<'_>> {
        if slot >= CLUSTER_SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is out of range (0..16384)"),
            ));
        }
        let from = self.master_of_slot(slot)?;
        let to_id = &self.nodes[to].id;
        if from == to || !self.view()?.iter().any(|e| &e.id == to_id && e.master) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("node {to} is not a master other than slot {slot}'s (node {from})"),
            ));
        }
        let setslot = |node: usize, state: &str, other: usize| -> io::Result<()> {
            let _: String = query(
                self.port(node),
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg(state)
                    .arg(&self.nodes[other].id),
            )
            .map_err(io::Error::other)?;
            Ok(())
        };
        setslot(to, "IMPORTING", from)?;
        setslot(from, "MIGRATING", to)?;
        Ok(SlotMigration {
            cluster: self,
            slot,
            from,
            to,
        })
    }

    fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .filter(|n| n.server.pid().is_some() && !n.paused.load(Ordering::SeqCst))
    }

    /// The cluster as the first running, unpaused node sees it.
    fn view(&self) -> io::Result<Vec<ViewEntry>> {
        let node = self
            .live()
            .next()
            .ok_or_else(|| io::Error::other("every node of the cluster is killed or paused"))?;
        cluster_view(node.server.port()).map_err(io::Error::other)
    }

    fn index_of(&self, id: &str) -> io::Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| io::Error::other(format!("node id {id} is not one of this cluster's")))
    }
}

/// One slot on its way from one master to another, for tests that act while it is half moved.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// use lockrt::testing::{RedisCluster, slot_of};
///
/// let cluster = RedisCluster::start(3, 0)?;
/// let slot = slot_of("lock:{stock:1}");
/// let to = (cluster.master_of_slot(slot)? + 1) % 3;
/// let migration = cluster.begin_slot_migration(slot, to)?; // MIGRATING / IMPORTING
/// migration.move_keys()?;                                  // clients now get ASK
/// migration.finish()?;                                     // clients now get MOVED
/// assert_eq!(cluster.master_of_slot(slot)?, to);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct SlotMigration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    from: usize,
    to: usize,
}

impl SlotMigration<'_> {
    /// The slot being moved.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The index of the master it leaves.
    pub fn from(&self) -> usize {
        self.from
    }

    /// The index of the master it goes to.
    pub fn to(&self) -> usize {
        self.to
    }

    /// Moves the slot's keys with `MIGRATE ... REPLACE KEYS`, 100 at a time, until the old
    /// master has none left; returns how many moved. May be called again for keys written
    /// since.
    pub fn move_keys(&self) -> io::Result<usize> {
        let (from, to) = (self.cluster.port(self.from), self.cluster.port(self.to));
        let start = Instant::now();
        let mut moved = 0;
        while start.elapsed() < MIGRATION_TIMEOUT {
            let keys: Vec<Vec<u8>> = query(
                from,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(self.slot)
                    .arg(MIGRATE_BATCH),
            )
            .map_err(io::Error::other)?;
            if keys.is_empty() {
                return Ok(moved);
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate.arg("127.0.0.1").arg(to).arg("").arg(0).arg(5000);
            migrate.arg("REPLACE").arg("KEYS").arg(&keys);
            let _: String =
                query_with(from, &migrate, Duration::from_secs(6)).map_err(io::Error::other)?;
            moved += keys.len();
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "slot {} still had keys after {MIGRATION_TIMEOUT:?}",
                self.slot
            ),
        ))
    }

    /// Hands the slot over: `CLUSTER SETSLOT <slot> NODE <to>` on the new master, the old one
    /// and every other running master, then waits until every running, unpaused node sees the
    /// new owner. Keys still on the old master are left there (unreachable): call
    /// [`move_keys`](Self::move_keys) first.
    pub fn finish(self) -> io::Result<()> {
        let cluster = self.cluster;
        let to_id = cluster.nodes[self.to].id.clone();
        let view = cluster.view()?;
        let mut order = vec![self.to, self.from];
        for node in cluster.live() {
            let index = cluster.index_of(&node.id)?;
            let master = view.iter().any(|e| e.id == node.id && e.master);
            if master && !order.contains(&index) {
                order.push(index);
            }
        }
        for index in order {
            let _: String = query(
                cluster.port(index),
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(&to_id),
            )
            .map_err(io::Error::other)?;
        }
        wait_until(
            "the slot's new owner to be known",
            MIGRATION_TIMEOUT,
            || {
                for node in cluster.live() {
                    let port = node.server.port();
                    let view = cluster_view(port)?;
                    if !view.iter().any(|e| e.id == to_id && e.serves(self.slot)) {
                        return Err(format!(
                            "127.0.0.1:{port} does not see node {} serving slot {} yet",
                            self.to, self.slot
                        ));
                    }
                }
                Ok(Some(()))
            },
        )
    }
}

/// Whether the server binary takes `--cluster-port` (Redis 7.0 and later, every Valkey): its
/// `--version` names a major version of 7 or more.
fn bus_port_option() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let out = std::process::Command::new(super::process::redis_server_binary())
            .arg("--version")
            .output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        let major = text.ok().and_then(|t| {
            let v = t.split("v=").nth(1)?;
            v.split('.').next()?.parse::<u32>().ok()
        });
        major.is_none_or(|m| m >= 7)
    })
}

/// A cluster node: a [`RedisServer`] in cluster mode with a bus port of its own choosing.
fn start_node() -> io::Result<RedisServer> {
    let mut last = None;
    for _ in 0..BUS_PORT_ATTEMPTS {
        let bus = free_port()?.to_string();
        let timeout = NODE_TIMEOUT_MS.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ];
        // Redis 6.2 has no `--cluster-port`: its bus is the port + 10000 (taken: retried).
        if bus_port_option() {
            args.extend(["--cluster-port", &bus]);
        }
        match RedisServer::start_with(&args) {
            Ok(server) => return Ok(server),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("could not start a cluster node")))
}
