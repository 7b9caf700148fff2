//! The examples' runner: a convenience of `cargo run --example`, not part of the code a service
//! copies. A service gets its Redis from its configuration (`LockerBuilder::from_env()`, README
//! "Configuration"); an example run on a fresh machine has none, so this starts a throwaway
//! `redis-server` (feature `testing`) and points the configured builder at it.

// Not every example uses every helper.
#![allow(dead_code)]

use lockrt::LockerBuilder;
use lockrt::testing::RedisServer;

/// The Redis an example runs against: the configured one, or a throwaway server that is
/// stopped when this is dropped.
pub(crate) struct DevRedis {
    url: String,
    server: Option<RedisServer>,
}

impl DevRedis {
    /// `LOCKRT_URL`, else `REDIS_URL` (what `LockerBuilder::from_env` reads), else a fresh
    /// throwaway `redis-server`.
    pub(crate) fn configured_or_start() -> std::io::Result<DevRedis> {
        let configured = ["LOCKRT_URL", "REDIS_URL"]
            .into_iter()
            .find_map(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()));
        match configured {
            Some(url) => Ok(DevRedis { url, server: None }),
            None => {
                let server = RedisServer::start()?;
                Ok(DevRedis {
                    url: server.url(),
                    server: Some(server),
                })
            }
        }
    }

    /// The configured builder, pointed at the throwaway server when one was started.
    pub(crate) fn apply(&self, builder: LockerBuilder) -> LockerBuilder {
        match self.server {
            Some(_) => builder.url(&self.url),
            None => builder,
        }
    }

    /// The URL, for the example's own data (it may carry a password: don't print it).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Whether a throwaway server was started.
    pub(crate) fn is_throwaway(&self) -> bool {
        self.server.is_some()
    }
}
