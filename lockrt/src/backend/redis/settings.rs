//! How to reach Redis, as the builder configured it: where the servers are ([`Topology`]),
//! credentials and TLS material, timeouts, replica acknowledgement. Parsed by nothing here:
//! the topology modules turn these into clients.
//!
//! Owns the one credential-free description of a topology ([`Topology::describe`]), which
//! `Debug` output, build errors and every error of a running backend show, and the scrubbing
//! of the configured URLs' credentials from messages ([`Topology::scrub`]).

use std::time::Duration;

use redis::{Client, ConnectionAddr};

use crate::redact;

/// Where the servers are, as configured on the builder.
#[derive(Clone)]
pub(crate) enum Topology {
    /// A standalone server's URL.
    Url(String),
    /// A client the caller built.
    Client(Client),
    /// Seed URLs of a Redis Cluster.
    Cluster(Vec<String>),
    /// Sentinel URLs and the monitored service's name; the masters' own credentials when
    /// they are not the sentinel URLs'.
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        master_auth: Option<Auth>,
    },
}

impl Topology {
    /// Where the servers are, for `Debug` output and messages: the URLs with every credential
    /// replaced by `***` (a caller-built client by its address), never a password.
    pub(crate) fn describe(&self) -> String {
        let urls = |urls: &[String]| -> String {
            let shown: Vec<String> = urls.iter().map(|u| redact::url(u)).collect();
            shown.join(",")
        };
        match self {
            Topology::Url(u) => redact::url(u),
            Topology::Client(c) => describe_addr(c.get_connection_info().addr()),
            Topology::Cluster(seeds) => format!("cluster {}", urls(seeds)),
            Topology::Sentinel {
                sentinels, service, ..
            } => format!("sentinel service {service:?} via {}", urls(sentinels)),
        }
    }

    /// `msg` without any credential of the configured URLs.
    pub(crate) fn scrub(&self, msg: &str) -> String {
        let urls: Vec<&String> = match self {
            Topology::Url(u) => vec![u],
            Topology::Client(_) => vec![],
            Topology::Cluster(seeds) => seeds.iter().collect(),
            Topology::Sentinel { sentinels, .. } => sentinels.iter().collect(),
        };
        urls.into_iter()
            .fold(msg.to_owned(), |m, u| redact::scrub_all(&m, u))
    }
}

/// `host:port` or the socket path: enough to find the server, nothing secret.
pub(crate) fn describe_addr(addr: &ConnectionAddr) -> String {
    match addr {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        other => other.to_string(),
    }
}

/// A user name (`None`: the default user) and password.
#[derive(Clone)]
// Read only by the Sentinel connector.
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) struct Auth {
    pub(crate) username: Option<String>,
    pub(crate) password: String,
}

/// TLS material in PEM: a private CA to trust instead of the platform's trust store, and a
/// client certificate with its key for servers that require one.
#[derive(Clone, Default)]
pub(crate) struct TlsFiles {
    pub(crate) ca: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    pub(crate) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }
}

/// Timeouts for talking to Redis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// Replica acknowledgement required of every acquire and renewal (`WAIT n timeout`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SyncReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// How to reach Redis, as the builder configured it.
pub(crate) struct RedisSettings {
    pub(crate) topology: Topology,
    pub(crate) tls: TlsFiles,
    pub(crate) timeouts: Timeouts,
    pub(crate) fence_retention: Duration,
    pub(crate) sync: Option<SyncReplicas>,
    /// This locker's identity, written beside every lock it takes (`crate::inspect`).
    pub(crate) owner: String,
    /// Sharded pub/sub where the server has it (see `wire.rs`).
    pub(crate) sharded_pubsub: bool,
    /// Build on a server whose `maxmemory-policy` may evict a held lock.
    pub(crate) allow_eviction: bool,
    /// Build while the server is unreachable; its checks run on the first connection.
    pub(crate) lazy: bool,
}

/// No Sentinel confirmed the master: why, and the last Sentinel's error (a TLS or
/// credentials failure deserves the advice any connection would get). Here, in the leaf every
/// topology module imports, because the connector names it in every build while only the
/// Sentinel watch makes it.
#[derive(Clone)]
#[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
pub(crate) struct Unconfirmed {
    pub(crate) why: String,
    pub(crate) last: Option<redis::RedisError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "sEkr3T";

    fn shapes() -> Vec<Topology> {
        let client = Client::open(format!("redis://app:{SECRET}@127.0.0.1:6379/0")).unwrap();
        vec![
            Topology::Url(format!("redis://app:{SECRET}@127.0.0.1:6379/0")),
            Topology::Url(format!(
                "rediss://:{SECRET}@127.0.0.1:6379/?password={SECRET}"
            )),
            Topology::Url(format!("redis+unix:///run/redis.sock?pass={SECRET}")),
            Topology::Url(format!(":{SECRET}@127.0.0.1:6379")),
            Topology::Client(client),
            Topology::Cluster(vec![
                format!("redis://u:{SECRET}@127.0.0.1:7000/"),
                format!("redis://127.0.0.1:7001/?password={SECRET}"),
            ]),
            Topology::Sentinel {
                sentinels: vec![
                    format!("rediss://:{SECRET}@127.0.0.1:26379/"),
                    "redis://127.0.0.1:26380/".to_owned(),
                ],
                service: "locks".to_owned(),
                master_auth: Some(Auth {
                    username: Some("app".to_owned()),
                    password: SECRET.to_owned(),
                }),
            },
        ]
    }

    #[test]
    fn descriptions_locate_the_servers_without_credentials() {
        let shown: Vec<String> = shapes().iter().map(Topology::describe).collect();
        for s in &shown {
            assert!(!s.contains(SECRET), "{s}");
        }
        assert_eq!(shown[0], "redis://***@127.0.0.1:6379/0");
        assert_eq!(shown[4], "127.0.0.1:6379");
        assert_eq!(
            shown[5],
            "cluster redis://***@127.0.0.1:7000/,redis://127.0.0.1:7001/?password=***"
        );
        assert_eq!(
            shown[6],
            r#"sentinel service "locks" via rediss://***@127.0.0.1:26379/,redis://127.0.0.1:26380/"#
        );
    }

    #[test]
    fn scrubbing_removes_the_configured_urls_credentials() {
        // A caller-built client has no URL here: the connector's secrets cover it.
        let with_urls = shapes()
            .into_iter()
            .filter(|t| !matches!(t, Topology::Client(_)));
        for t in with_urls {
            let scrubbed = t.scrub(&format!("refused: password {SECRET} is wrong"));
            assert!(!scrubbed.contains(SECRET), "{scrubbed}");
        }
    }

    #[test]
    fn addresses_show_no_credentials() {
        assert_eq!(describe_addr(&ConnectionAddr::Tcp("h".into(), 2)), "h:2");
        let unix = ConnectionAddr::Unix("/run/redis.sock".into());
        assert_eq!(describe_addr(&unix), "unix:/run/redis.sock");
    }
}
