//! [`LockerBuilder`]: a `Locker`'s settings, checked once, and the ways to build one
//! ([`Locker::builder`], [`Locker::in_memory`]). Durations of any size are accepted: ttls are
//! capped as the attribute caps them, and no setting can make a later call overflow.

use std::fmt;
use std::time::Duration;

use crate::backend::Backend;
use crate::backend::contract::FENCES_PER_COUNT;
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::RedisBackend;
use crate::backend::redis::settings::{
    Auth, RedisSettings, SyncReplicas, Timeouts, TlsFiles, Topology,
};
use crate::error::LockError;
use crate::key::validate_prefix;
use crate::locker::{Locker, Settings};
use crate::options::{MAX_TTL, MIN_TTL, Wait};

const DEFAULT_TTL: Duration = Duration::from_secs(30);
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
const DEFAULT_SAFETY_MARGIN: Duration = Duration::from_millis(100);
const DEFAULT_LOCAL_HANDOFF: u32 = 16;
const DEFAULT_FENCE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Builds a [`Locker`] with non-default settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockrt::LockError> {
/// use std::time::Duration;
/// let locker = lockrt::Locker::builder()
///     .url("redis://127.0.0.1:6379/")
///     .prefix("app:lock:")
///     .default_ttl(Duration::from_secs(10))
///     .default_wait(Duration::from_secs(3))
///     .build()
///     .await?;
/// # let _ = locker; Ok(()) }
/// ```
#[derive(Clone)]
#[must_use]
pub struct LockerBuilder {
    topology: Option<Topology>,
    tls: TlsFiles,
    sync: Option<SyncReplicas>,
    prefix: String,
    default_ttl: Duration,
    default_wait: Wait,
    default_max_hold: Option<Duration>,
    safety_margin: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    fence_retention: Duration,
    service_name: Option<String>,
    /// The masters' credentials under Sentinel (`sentinel_master_auth`).
    master_auth: Option<Auth>,
    local_handoff: u32,
    /// Build on a server whose `maxmemory-policy` may evict a held lock (`allow_eviction`).
    allow_eviction: bool,
    /// Sharded pub/sub on a Cluster that has it (`sharded_pubsub`).
    sharded_pubsub: bool,
    /// Build while the server is unreachable (`lazy_connect`).
    lazy_connect: bool,
    /// What the error says when no server was given (`from_env` names its variables).
    missing_url: Option<&'static str>,
}

impl fmt::Debug for LockerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockerBuilder")
            .field("servers", &self.topology.as_ref().map(Topology::describe))
            .field("prefix", &self.prefix)
            .field("default_ttl", &self.default_ttl)
            .field("default_wait", &self.default_wait)
            .field("default_max_hold", &self.default_max_hold)
            .field("safety_margin", &self.safety_margin)
            .field("local_handoff", &self.local_handoff)
            .field("allow_eviction", &self.allow_eviction)
            .field("sharded_pubsub", &self.sharded_pubsub)
            .field("lazy_connect", &self.lazy_connect)
            .finish_non_exhaustive()
    }
}

impl Default for LockerBuilder {
    fn default() -> Self {
        LockerBuilder {
            topology: None,
            tls: TlsFiles::default(),
            sync: None,
            prefix: "lock:".to_owned(),
            default_ttl: DEFAULT_TTL,
            default_wait: Wait::For(DEFAULT_WAIT),
            default_max_hold: None,
            safety_margin: DEFAULT_SAFETY_MARGIN,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            fence_retention: DEFAULT_FENCE_RETENTION,
            service_name: None,
            master_auth: None,
            local_handoff: DEFAULT_LOCAL_HANDOFF,
            allow_eviction: false,
            sharded_pubsub: true,
            lazy_connect: false,
            missing_url: None,
        }
    }
}

impl LockerBuilder {
    /// The server: `redis://[user:password@]host:port/db`, `rediss://...` (feature `tls`),
    /// `redis+unix:///path/to/socket`; or a topology: `redis+cluster://host:port,host:port/`
    /// (feature `cluster`, same as [`cluster`](Self::cluster)) and
    /// `redis+sentinel://host:port,host:port/service` (feature `sentinel`, same as
    /// [`sentinel`](Self::sentinel)). Credentials in a topology URL apply to every node, and
    /// so do its query and fragment (`?protocol=resp3`, `#insecure`); a Sentinel URL's service
    /// name is its path alone. No output shows a password, whichever part of the URL holds it.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.topology = Some(parse_url(url.into()));
        self
    }

    /// A Redis Cluster (feature `cluster`), found through these seed URLs (any few nodes;
    /// each may carry credentials and use `rediss://`). Every lock lives on its key's slot;
    /// renewals are batched per slot.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::builder()
    ///     .cluster(["redis://10.0.0.1:7000/", "redis://10.0.0.2:7000/"])
    ///     .build()
    ///     .await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn cluster<S: Into<String>>(mut self, seeds: impl IntoIterator<Item = S>) -> Self {
        self.topology = Some(Topology::Cluster(
            seeds.into_iter().map(Into::into).collect(),
        ));
        self
    }

    /// The master of `service` as these Sentinels name it (feature `sentinel`). The master is
    /// resolved again whenever a connection fails or finds a demoted master, or the Sentinels
    /// announce a switch, so locks follow a failover. A locker that has heard no Sentinel for
    /// a second (its listening connection half-open, say) asks them before its next request,
    /// and fails that request with a retryable error when none answers, rather than take a
    /// lock on a master that may have been replaced. The sentinel URLs' credentials and TLS mode are used for the master too, and
    /// so are [`tls_ca_pem`](Self::tls_ca_pem) and
    /// [`tls_client_cert_pem`](Self::tls_client_cert_pem).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::builder()
    ///     .sentinel(["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"], "locks")
    ///     .build()
    ///     .await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn sentinel<S: Into<String>>(
        mut self,
        sentinels: impl IntoIterator<Item = S>,
        service: impl Into<String>,
    ) -> Self {
        self.topology = Some(Topology::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            service: service.into(),
            master_auth: None,
        });
        self
    }

    /// Credentials for the masters the Sentinels name, when they are not those of the
    /// sentinel URLs (which then authenticate to the sentinels only): for sentinels without a
    /// password in front of masters with one, or an ACL user of their own. An empty
    /// `username` means the default user. Needs a Sentinel topology (`sentinel(..)` or a
    /// `redis+sentinel://` URL); the password appears in no output.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::builder()
    ///     .sentinel(["redis://10.0.0.5:26379/"], "locks")
    ///     .sentinel_master_auth("locks-app", "s3cret")
    ///     .build()
    ///     .await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn sentinel_master_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        let username = username.into();
        self.master_auth = Some(Auth {
            username: (!username.is_empty()).then_some(username),
            password: password.into(),
        });
        self
    }

    /// A standalone server through a client you built (its own TLS or connection settings).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let locker = lockrt::Locker::builder().client(client).build().await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn client(mut self, client: redis::Client) -> Self {
        self.topology = Some(Topology::Client(client));
        self
    }

    /// Trust this CA (PEM, one or more certificates) for `rediss://` servers *instead of*
    /// the platform's trust store (feature `tls`): only a server certificate it signed is
    /// accepted, including on the masters a Sentinel names and on every Cluster node.
    ///
    /// Without it, servers are verified with the platform's trust store: on Linux the
    /// OpenSSL locations (`/etc/ssl/certs`, ...), or the files that `SSL_CERT_FILE` and
    /// `SSL_CERT_DIR` name when either is set; the keychain on macOS; the system store on
    /// Windows. A private CA installed there (a corporate CA, a cloud provider's server CA)
    /// needs no setting. To trust both, leave this unset and install the CA for the system, or
    /// give a bundle of all the CAs here.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let locker = lockrt::Locker::builder()
    ///     .url("rediss://redis.internal:6380/")
    ///     .tls_ca_pem(std::fs::read("private-ca.pem")?)
    ///     .build()
    ///     .await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Present this client certificate and key (PEM) to servers that require one (feature
    /// `tls`, `tls-auth-clients yes`).
    pub fn tls_client_cert_pem(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// Count an acquire (and each renewal) only when at least `replicas` replicas
    /// acknowledged it within `timeout` (`WAIT` right after the script, on the same
    /// connection). An acquire that was not acknowledged is released and fails with a
    /// retryable error; a renewal that was not acknowledged does not move the lease's
    /// deadline. Every topology: on a Cluster the `WAIT` goes to the master of the lock's
    /// slot, right behind its script.
    ///
    /// What it buys: a lock (and its fence) that a failover to an acknowledging replica keeps,
    /// and no lock granted by an isolated old master that no replica follows. What it does
    /// not: replication stays asynchronous (a replica that acknowledged may still not be the
    /// one promoted, and Sentinel may promote a lagging one), and it costs a round trip to the
    /// replicas per acquire and renewal. Use fences where a double writer would corrupt data.
    pub fn sync_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.sync = Some(SyncReplicas {
            replicas,
            timeout: timeout.min(MAX_TTL),
        });
        self
    }

    /// Namespace for lock keys (default `"lock:"`): the lock `stock:1` is the Redis key
    /// `lock:stock:1`. May not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease used when a call sets no `ttl` (default 30 s).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Wait used when a call sets none (default 10 s). A wait too large to add to the
    /// current time means "forever".
    pub fn default_wait(mut self, wait: Duration) -> Self {
        self.default_wait = Wait::For(wait);
        self
    }

    /// Make calls without a `wait` wait without limit.
    pub fn default_wait_forever(mut self) -> Self {
        self.default_wait = Wait::Forever;
        self
    }

    /// Longest time a lock may be held when a call sets no `max_hold` (default: no limit).
    /// After it the watchdog stops renewing and the holder is told it lost the lock.
    pub fn default_max_hold(mut self, max_hold: Duration) -> Self {
        self.default_max_hold = Some(max_hold);
        self
    }

    /// Safety margin taken off every lease's local deadline (default 100 ms): the holder
    /// counts a lease as lost this long before the server could expire it, to cover clock
    /// rate differences and the time it takes to act on a loss (a loaded client, a paused
    /// process). A lock is only handed out when at least this much of its lease is left after
    /// the margin. The margin is at least a twentieth and at most a quarter of the lease.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// Local hand-off (default 16; `0` turns it off). When a section ends while another
    /// caller of this locker waits for the same key, the lock passes to it in the process:
    /// no release, no Redis round trip, the lease stays held and renewed, and the new holder
    /// gets a fence above its predecessor's. At most `pass_limit` such hand-offs follow one
    /// another; then the lock is released in Redis, where the longest waiter of any process
    /// gets it. So a hot key costs almost nothing within a process, and a waiter of another
    /// process waits at most `pass_limit + 1` sections of this one. A local hand-off needs
    /// the lease valid for at least the safety margin, a waiter whose `watchdog` is on, and no
    /// `min_hold` pending; otherwise the lock goes through Redis as usual. At most 31.
    ///
    /// ```
    /// let strictly_fifo_across_processes = lockrt::Locker::builder().local_handoff(0);
    /// # let _ = strictly_fifo_across_processes;
    /// ```
    pub fn local_handoff(mut self, pass_limit: u32) -> Self {
        self.local_handoff = pass_limit;
        self
    }

    /// Longest time to establish a connection (default 1 s).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Longest time to wait for one reply (default 1 s). A request past it counts as failed,
    /// its connection is replaced, and an acquire's outcome is resolved by a retry with the
    /// same owner token (or a release by token when the acquire gives up).
    pub fn response_timeout(mut self, t: Duration) -> Self {
        self.response_timeout = t;
        self
    }

    /// How long a key's fencing counter lives after its latest acquisition (default 24 h, and
    /// at least twice the lease): the state a key leaves behind is bounded by it. The next
    /// counter starts at the fence clock (the Redis server's time in 10 µs units since 2020),
    /// above every fence the old one issued (each acquisition set it to at most one above the
    /// fence clock or the counter before), unless the server's clock stepped back by about
    /// this long or acquisitions came faster than one per 10 µs for that long.
    pub fn fence_retention(mut self, t: Duration) -> Self {
        self.fence_retention = t;
        self
    }

    /// Sharded pub/sub on a Redis Cluster (default `true`). On a Cluster of Redis 7.0 or
    /// newer (or Valkey), release, hand-over and forced-unlock messages go out with
    /// `SPUBLISH` and are heard with `SSUBSCRIBE` on the master of their lock's slot: each
    /// costs work on one shard, where `PUBLISH` is forwarded to every node of the cluster.
    /// `false` keeps `PUBLISH` (for a proxy in front of the cluster that does not pass shard
    /// channels on). Older servers, standalone and Sentinel always use `PUBLISH`.
    ///
    /// Every locker of one Cluster must use the same setting: one that listens with
    /// `SSUBSCRIBE` does not hear `PUBLISH`, nor the other way round. A mismatch never lets
    /// two hold one lock, but its waiters learn of a release from their fallback timer (up to
    /// a second late) and its holders of a forced unlock at their next renewal.
    ///
    /// ```
    /// let broadcast = lockrt::Locker::builder().sharded_pubsub(false);
    /// # let _ = broadcast;
    /// ```
    pub fn sharded_pubsub(mut self, on: bool) -> Self {
        self.sharded_pubsub = on;
        self
    }

    /// The service name recorded beside every lock this locker holds (what `lockctl list`
    /// shows as `service@host`). Default: the executable's file name.
    ///
    /// ```
    /// let builder = lockrt::Locker::builder().service_name("billing");
    /// # let _ = builder;
    /// ```
    pub fn service_name(mut self, name: impl Into<String>) -> Self {
        self.service_name = Some(name.into());
        self
    }

    /// Build on a server whose `maxmemory-policy` may evict keys (default `false`: such a
    /// server is refused).
    ///
    /// A held lock is a key with a TTL, and under memory pressure every policy but
    /// `noeviction` may delete it: the `allkeys-*` policies any key, the `volatile-*` ones
    /// any key with a TTL, which every held lock has. The holder goes on, unaware until its
    /// next renewal, while another owner takes the lock: two holders at once. So
    /// [`build`](Self::build) reads the policy with `INFO memory` (of the server, of the
    /// master the Sentinels name, or of every master of a Cluster) and fails with an error
    /// naming the server and the policy unless it is `noeviction` (a policy name it does not
    /// know counts as evicting). The fix is `maxmemory-policy noeviction` on the servers;
    /// `allow_eviction(true)` accepts the risk instead, and the build then logs one WARN
    /// naming the policy. A server that refuses `INFO` or does not report the policy (some
    /// proxies, an ACL user without `+info`) is not refused for it: the build logs at INFO
    /// that the policy was not checked.
    ///
    /// The policy is read once, at build: a later `CONFIG SET`, a Cluster master added or a
    /// replica promoted after the build is not checked.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// // A cache server with `maxmemory-policy allkeys-lru`; fences guard the data.
    /// let locker = lockrt::Locker::builder()
    ///     .url("redis://cache.internal:6379/")
    ///     .allow_eviction(true)
    ///     .build()
    ///     .await?;
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Build even when the server can't be reached yet (default `false`: the build fails).
    ///
    /// A service started before its Redis (a whole environment starting at once, Redis
    /// restarting) then starts instead of crash-looping: every call fails at once with a
    /// [`LockError::Backend`] whose [`is_unreachable`](crate::BackendError::is_unreachable)
    /// is `true` (503 through the `axum` feature) until the server answers. The checks a
    /// build makes (the version, the eviction policy) run on the first connection, before
    /// any lock request is sent; a server they refuse refuses every call from then on, with
    /// the error the build would have returned. The first connection logs at INFO. A server
    /// that answers with an error (a wrong password, TLS) still fails the build: that is
    /// not an outage. On a Cluster whose servers are older than Redis 7.0, set
    /// [`sharded_pubsub(false)`](Self::sharded_pubsub) too: a lazy locker can't ask first.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::builder()
    ///     .url("redis://127.0.0.1:6379/")
    ///     .lazy_connect(true)
    ///     .build()
    ///     .await?; // Ok even while Redis is down
    /// # let _ = locker; Ok(()) }
    /// ```
    pub fn lazy_connect(mut self, on: bool) -> Self {
        self.lazy_connect = on;
        self
    }

    /// This locker's owner record text (`crate::inspect::owner_text`).
    fn owner(&self, settings: &Settings) -> String {
        crate::owner::owner_text(self.service_name.as_deref(), settings.instance_id)
    }

    fn settings(&self) -> Result<Settings, LockError> {
        validate_prefix(&self.prefix)?;
        if self.default_ttl.is_zero()
            || self.connect_timeout.is_zero()
            || self.response_timeout.is_zero()
        {
            return Err(LockError::Config(
                "default_ttl and timeouts must be greater than zero".into(),
            ));
        }
        if u64::from(self.local_handoff) >= FENCES_PER_COUNT {
            return Err(LockError::Config(format!(
                "local_handoff({}) is too large: at most {} local hand-offs may follow one \
                 another (each holder needs a fence of its own)",
                self.local_handoff,
                FENCES_PER_COUNT - 1
            )));
        }
        Ok(Settings {
            prefix: self.prefix.clone(),
            default_ttl: self.default_ttl.clamp(MIN_TTL, MAX_TTL),
            default_wait: self.default_wait,
            default_max_hold: self.default_max_hold,
            safety_margin: self.safety_margin.min(MAX_TTL),
            shutdown_bound: self
                .timeouts()
                .connect
                .saturating_add(self.timeouts().response),
            instance_id: uuid::Uuid::new_v4(),
            local_handoff: self.local_handoff,
        })
    }

    /// What the "no Redis URL" error says instead of naming the builder's methods.
    pub(crate) fn missing_url_hint(mut self, hint: &'static str) -> Self {
        self.missing_url = Some(hint);
        self
    }

    /// The configured topology, with the masters' own credentials under Sentinel.
    fn topology(&self) -> Result<Topology, LockError> {
        let mut topology = self.topology.clone().ok_or_else(|| {
            LockError::Config(match self.missing_url {
                Some(hint) => format!("no Redis URL: {hint}"),
                None => "no Redis URL: call `.url(\"redis://host:6379/\")` (or `.cluster(..)`, \
                         `.sentinel(..)`) on the builder"
                    .into(),
            })
        })?;
        match (&mut topology, &self.master_auth) {
            (_, None) => {}
            (Topology::Sentinel { master_auth, .. }, Some(auth)) => {
                *master_auth = Some(auth.clone());
            }
            (_, Some(_)) => {
                return Err(LockError::Config(
                    "`sentinel_master_auth` needs a Sentinel topology".into(),
                ));
            }
        }
        Ok(topology)
    }

    fn timeouts(&self) -> Timeouts {
        Timeouts {
            connect: self.connect_timeout.min(MAX_TTL),
            response: self.response_timeout.min(MAX_TTL),
        }
    }

    /// Connects to Redis. Fails within about the connect and response timeouts when the
    /// server is unreachable, with an error naming its address (never its password), and
    /// refuses servers older than Redis 6.2 and, unless
    /// [`allow_eviction`](Self::allow_eviction), servers whose `maxmemory-policy` may evict
    /// a held lock (both with a permanent [`LockError::Backend`]).
    pub async fn build(self) -> Result<Locker, LockError> {
        let settings = self.settings()?;
        let topology = self.topology()?;
        let backend = RedisBackend::connect(RedisSettings {
            topology,
            tls: self.tls.clone(),
            timeouts: self.timeouts(),
            fence_retention: self
                .fence_retention
                .clamp(Duration::from_millis(1), MAX_TTL),
            sync: self.sync,
            owner: self.owner(&settings),
            sharded_pubsub: self.sharded_pubsub,
            allow_eviction: self.allow_eviction,
            lazy: self.lazy_connect,
        })
        .await?;
        Ok(Locker::from_parts(settings, Backend::Redis(backend)))
    }
}

/// `redis+cluster://a:1,b:2/` and `redis+sentinel://a:1,b:2/service` become topologies;
/// anything else is a standalone URL for redis-rs.
fn parse_url(url: String) -> Topology {
    // `[user-info@]host,host[/service][?query][#fragment]`. The user-info ends at the last
    // `@`, so a password with an unencoded `/` stays whole; the query and fragment go to
    // every node's URL, as in a standalone URL, and never into the service name (which every
    // `Debug` output and error shows). An `@` after a `?` or `#` leaves no safe reading (a
    // password holding `?`, or a query holding `@`): such a URL stays one that redis-rs
    // refuses, shown without anything after its scheme.
    let split = |rest: &str, scheme: &str| -> Option<(Vec<String>, String)> {
        let (head, tail) = rest.split_at(rest.find(['?', '#']).unwrap_or(rest.len()));
        if tail.contains('@') {
            return None;
        }
        let (auth, hosts) = match head.rsplit_once('@') {
            Some((auth, hosts)) => (format!("{auth}@"), hosts),
            None => (String::new(), head),
        };
        let (hosts, path) = hosts.split_once('/').unwrap_or((hosts, ""));
        let urls = hosts
            .split(',')
            .map(|h| format!("{scheme}://{auth}{h}/{tail}"))
            .collect();
        Some((urls, path.to_owned()))
    };
    for (prefix, scheme) in [
        ("redis+cluster://", "redis"),
        ("rediss+cluster://", "rediss"),
    ] {
        if let Some((seeds, _)) = url.strip_prefix(prefix).and_then(|r| split(r, scheme)) {
            return Topology::Cluster(seeds);
        }
    }
    for (prefix, scheme) in [
        ("redis+sentinel://", "redis"),
        ("rediss+sentinel://", "rediss"),
    ] {
        if let Some((sentinels, service)) = url.strip_prefix(prefix).and_then(|r| split(r, scheme))
        {
            return Topology::Sentinel {
                sentinels,
                service,
                master_auth: None,
            };
        }
    }
    Topology::Url(url)
}

impl Locker {
    /// A builder for non-default settings.
    ///
    /// ```
    /// let builder = lockrt::Locker::builder().prefix("jobs:");
    /// # let _ = builder;
    /// ```
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// Locks that live in this process only, with the same semantics as Redis-backed ones
    /// (waiting, leases, watchdog, loss, fencing, reentrancy). Clones share the locks; two
    /// separate `in_memory()` lockers are two separate lock spaces.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let n = locker.run("counter", lockrt::LockOptions::new(), async { 1 + 1 }).await?;
    /// assert_eq!(n, 2);
    /// # Ok(()) }
    /// ```
    pub fn in_memory() -> Locker {
        Locker::in_memory_with(LockerBuilder::default())
    }

    /// [`in_memory`](Self::in_memory) with the builder's prefix and defaults (the URL is
    /// ignored; invalid settings fall back to the defaults).
    ///
    /// ```
    /// use std::time::Duration;
    /// let locker = lockrt::Locker::in_memory_with(
    ///     lockrt::Locker::builder().default_ttl(Duration::from_secs(5)),
    /// );
    /// # let _ = locker;
    /// ```
    pub fn in_memory_with(builder: LockerBuilder) -> Locker {
        let settings = builder
            .settings()
            .or_else(|_| LockerBuilder::default().settings())
            .expect("the default settings are valid");
        let owner = builder.owner(&settings);
        Locker::from_parts(settings, Backend::Memory(MemoryBackend::with_owner(owner)))
    }
}
