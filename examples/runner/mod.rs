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

/// Logs to stderr, at WARN unless `RUST_LOG` says otherwise (stdout is the examples' output).
pub(crate) fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::builder()
        .with_default_directive(tracing_subscriber::filter::LevelFilter::WARN.into())
        .from_env_lossy();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

/// The end of a service example's `main`: its arguments parsed (or the usage, exit 2), then
/// `serve`d until it returns; an error is printed with `Display`, since lockrt's messages say
/// what to do.
pub(crate) async fn serve_main<C, F>(
    name: &str,
    args: Result<C, String>,
    serve: impl FnOnce(C) -> F,
) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let cfg = match args {
        Ok(cfg) => cfg,
        Err(usage) => {
            eprintln!("{usage}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Err(e) = serve(cfg).await {
        eprintln!("{name}: {e}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
