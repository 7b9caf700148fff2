//! [`RedisServer`], one throwaway `redis-server` process, and [`LocalRedis`], the Redis a demo
//! or a local run uses.
//!
//! What it owns: its child process (persistence off, working files in a temporary directory,
//! on a free loopback port), the wait until it answers `PING`, and the faults tests put it
//! through: kill, restart on the same port, SIGSTOP and SIGCONT. It only signals its own
//! child, by pid.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{free_port, redis_server_binary, signal_pid};

/// How long a fresh server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at finding a port nobody else grabs between our probe and the server's bind.
const PORT_ATTEMPTS: usize = 5;

/// The arguments of `$REDIS_SERVER_ARGS` (see [`RedisServer::start`]).
fn env_args(text: Option<&str>) -> Vec<String> {
    let words = text.unwrap_or_default().split_whitespace();
    words
        .map(|w| match w {
            "\"\"" | "''" => String::new(),
            w => w.to_owned(),
        })
        .collect()
}

/// A `redis-server` child process owned by the test.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    binary: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free loopback port and waits until it answers.
    ///
    /// Every server the tests start as a data node (standalone, Cluster nodes, Sentinel's
    /// master and replicas; not the sentinels) also gets the arguments in `$REDIS_SERVER_ARGS`,
    /// split at whitespace, `""` for an empty one: `REDIS_SERVER_ARGS='--rename-command TIME ""'`
    /// runs a suite on a server that refuses `TIME`, as some managed services do to scripts.
    ///
    /// Fails with the install command when `redis-server` is not on `PATH` (or at
    /// `$REDIS_SERVER_BIN`).
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (e.g.
    /// `["--requirepass", "secret"]`).
    pub fn start_with(args: &[&str]) -> io::Result<RedisServer> {
        RedisServer::start_using(redis_server_binary(), args)
    }

    /// Like [`start_with`](Self::start_with), running the given `redis-server` binary.
    ///
    /// ```
    /// use lockrt::testing::RedisServer;
    /// let err = RedisServer::start_using("/nonexistent/redis-server", &[]).unwrap_err();
    /// assert!(err.to_string().contains("apt-get install -y redis-server"));
    /// ```
    pub fn start_using(binary: impl Into<PathBuf>, args: &[&str]) -> io::Result<RedisServer> {
        let binary = binary.into();
        let mut extra: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        extra.extend(env_args(std::env::var("REDIS_SERVER_ARGS").ok().as_deref()));
        let mut last_err = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let dir = tempfile::Builder::new().prefix("lockrt-redis-").tempdir()?;
            let mut server = RedisServer {
                child: None,
                port,
                dir,
                binary: binary.clone(),
                extra: extra.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(e),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("could not start redis-server")))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!(
                            "`{}` not found: install Redis (`sudo apt-get install -y redis-server` on \
                             Debian/Ubuntu, `brew install redis` on macOS) or set REDIS_SERVER_BIN",
                            self.binary.display()
                        ),
                    )
                } else {
                    e
                }
            })?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let start = Instant::now();
        while start.elapsed() < READY_TIMEOUT {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                self.child = None;
                return Err(io::Error::other(format!(
                    "redis-server on port {} exited: {status}",
                    self.port
                )));
            }
            if self.ping() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("redis-server on port {} not ready in time", self.port),
        ))
    }

    /// `true` when the server answers `PING` (or asks for a password) within 200 ms.
    pub fn ping(&self) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 7];
        // A server with `requirepass` answers `-NOAUTH ...`: up and serving all the same.
        s.write_all(b"PING\r\n").is_ok()
            && s.read_exact(&mut buf).is_ok()
            && (&buf == b"+PONG\r\n" || &buf == b"-NOAUTH")
    }

    /// `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A `redis::Client` for inspecting the server from a test.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a loopback URL always parses")
    }

    /// Kills the server at once (SIGKILL): clients see connection resets.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (there is no persistence).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let start = Instant::now();
        // The port may linger briefly after the kill; retry the bind within a bound.
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e)
                    if start.elapsed() < READY_TIMEOUT && e.kind() != io::ErrorKind::NotFound =>
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open but nothing is answered.
    pub fn pause(&self) -> io::Result<()> {
        self.signal("-STOP")
    }

    /// Thaws a paused server (SIGCONT).
    pub fn resume(&self) -> io::Result<()> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("redis-server is not running"))?;
        signal_pid(pid, sig)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL also ends a paused (SIGSTOPped) server.
        self.kill();
    }
}

/// The Redis a demo or a local run should use: the one at `REDIS_URL` when that is set,
/// otherwise a throwaway [`RedisServer`] started here and stopped when this is dropped.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let redis = lockrt::testing::LocalRedis::from_env_or_start()?;
/// let locker = lockrt::Locker::connect(redis.url()).await?;
/// # drop(locker); Ok(()) }
/// ```
#[derive(Debug)]
pub struct LocalRedis {
    url: String,
    server: Option<RedisServer>,
}

impl LocalRedis {
    /// `REDIS_URL`, or a fresh throwaway server.
    pub fn from_env_or_start() -> io::Result<LocalRedis> {
        match std::env::var("REDIS_URL") {
            Ok(url) if !url.trim().is_empty() => Ok(LocalRedis { url, server: None }),
            _ => {
                let server = RedisServer::start()?;
                Ok(LocalRedis {
                    url: server.url(),
                    server: Some(server),
                })
            }
        }
    }

    /// The URL to connect to (it may carry a password: don't print it).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether this is a throwaway server started by [`from_env_or_start`](Self::from_env_or_start).
    pub fn is_throwaway(&self) -> bool {
        self.server.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::env_args;

    #[test]
    fn server_args_from_the_environment_keep_empty_ones() {
        assert_eq!(
            env_args(Some(r#"--rename-command TIME "" --maxmemory 1gb"#)),
            ["--rename-command", "TIME", "", "--maxmemory", "1gb"]
        );
        assert!(env_args(None).is_empty());
        assert!(env_args(Some("  ")).is_empty());
    }
}
