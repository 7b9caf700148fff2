//! Process plumbing of the throwaway servers: where the Redis binaries are, commands run to
//! completion within a bound, [`Daemon`] (a server process with a command line of our own),
//! free loopback ports, signals, polling until a condition holds, and one-shot queries.
//!
//! What it owns: the processes it spawns, each killed by its own pid (never by name), and
//! bounds on every wait. It imports nothing else from `testing`: the servers, the cluster, the
//! sentinel group and TLS are built on it.

use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// Connect, read and write timeout of one inspection command.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// The `redis-server` binary: `$REDIS_SERVER_BIN`, or `redis-server` on `PATH`.
pub(super) fn redis_server_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN")
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// A free loopback port, as the system hands one out now (someone may take it before the
/// caller binds it: callers retry).
pub(super) fn free_port() -> io::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(l.local_addr()?.port())
}

/// Sends `sig` (`"-STOP"`, `"-CONT"`) to process `pid` with `kill`: only ever a process this
/// module started.
pub(super) fn signal_pid(pid: u32, sig: &str) -> io::Result<()> {
    let status = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("kill {sig} {pid} failed")))
    }
}

/// Runs one command on the server at `127.0.0.1:port` over a fresh connection, every step
/// bounded by 500 ms; the error names the server.
pub(super) fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> Result<T, String> {
    query_with(port, cmd, QUERY_TIMEOUT)
}

/// [`query`] with a timeout of the caller's choosing (a `MIGRATE` of many keys takes longer).
///
/// A socket read with a timeout is not restarted after a signal (signal(7)), which the test
/// process's other children cause: a command cut off by `EINTR` is sent again on a new
/// connection, at most three times in all. Every command sent here may be sent twice (reads,
/// `CLUSTER SETSLOT`, `MIGRATE` of keys that are gone by then, a `CLUSTER FAILOVER` that only
/// starts one).
pub(super) fn query_with<T: redis::FromRedisValue>(
    port: u16,
    cmd: &redis::Cmd,
    timeout: Duration,
) -> Result<T, String> {
    let fail = |e: redis::RedisError| format!("127.0.0.1:{port}: {e}");
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(fail)?;
    let once = || -> redis::RedisResult<T> {
        let mut con = client.get_connection_with_timeout(timeout)?;
        con.set_read_timeout(Some(timeout))?;
        con.set_write_timeout(Some(timeout))?;
        cmd.query(&mut con)
    };
    let mut res = once();
    for _ in 0..2 {
        match &res {
            Err(e) if interrupted(e) => res = once(),
            _ => break,
        }
    }
    res.map_err(fail)
}

/// Whether `e` is a socket call cut off by a signal (`EINTR`). (redis-rs keeps the I/O error
/// in an `Arc`, which is what its `source()` is.)
fn interrupted(e: &redis::RedisError) -> bool {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    e.kind() == redis::ErrorKind::Io
        && std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<Shared>())
            .and_then(|s| s.downcast_ref::<io::Error>())
            .is_some_and(|io| io.kind() == io::ErrorKind::Interrupted)
}

/// Polls `probe` every 20 ms until it answers `Ok(Some(_))`, for at most `timeout`. `Err`
/// means "not yet, because ..."; the last such reason goes into the timeout error.
pub(super) fn wait_until<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Option<T>, String>,
) -> io::Result<T> {
    let start = Instant::now();
    let mut last = String::from("no answer yet");
    loop {
        match probe() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(reason) => last = reason,
        }
        if start.elapsed() >= timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("gave up waiting for {what} after {timeout:?}: {last}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `redis-cli` (or `$REDIS_CLI_BIN`).
pub(super) fn redis_cli() -> Command {
    Command::new(
        std::env::var_os("REDIS_CLI_BIN").map_or_else(|| PathBuf::from("redis-cli"), PathBuf::from),
    )
}

/// A command running [`redis_server_binary`]: the sentinels and the TLS server run it too.
pub(super) fn redis_server() -> Command {
    Command::new(redis_server_binary())
}

/// The error for a program that is not installed, with the command that installs it.
pub(super) fn not_found(program: &std::ffi::OsStr, e: io::Error) -> io::Error {
    if e.kind() != io::ErrorKind::NotFound {
        return e;
    }
    io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "`{}` not found: install Redis (`sudo apt-get install -y redis-server` on \
             Debian/Ubuntu, `brew install redis` on macOS) or set REDIS_SERVER_BIN and \
             REDIS_CLI_BIN",
            program.to_string_lossy()
        ),
    )
}

/// Runs `cmd` to completion with its output captured, killing it after `timeout`.
pub(super) fn run_bounded(cmd: &mut Command, timeout: Duration) -> io::Result<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| not_found(cmd.get_program(), e))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{:?} did not finish within {timeout:?}", cmd.get_program()),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// A server process started with a command line of our own (a sentinel, a TLS server),
/// killed by its pid on drop.
#[derive(Debug)]
pub(super) struct Daemon {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `cmd` (which writes its log to `log` and listens on `port`) and waits until
    /// `ready(port)` holds, at most `timeout`. When the process exits first, the error quotes
    /// the end of its log.
    pub(super) fn start(
        mut cmd: Command,
        port: u16,
        log: PathBuf,
        timeout: Duration,
        ready: impl Fn(u16) -> bool,
    ) -> io::Result<Daemon> {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| not_found(cmd.get_program(), e))?;
        let mut daemon = Daemon {
            child: Some(child),
            port,
            log,
        };
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = daemon.exited()? {
                return Err(io::Error::other(format!(
                    "redis-server for port {port} exited ({status}); its log ends: {}",
                    daemon.log_tail()
                )));
            }
            if tcp_open(port) && ready(port) {
                return Ok(daemon);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon.kill();
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "redis-server for port {port} not ready within {timeout:?}; its log ends: {}",
                daemon.log_tail()
            ),
        ))
    }

    fn exited(&mut self) -> io::Result<Option<ExitStatus>> {
        match self.child.as_mut() {
            Some(child) => {
                let status = child.try_wait()?;
                if status.is_some() {
                    self.child = None;
                }
                Ok(status)
            }
            None => Ok(None),
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    pub(super) fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, then reap.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `sig` (`"-STOP"`, `"-CONT"`) with `kill`.
    pub(super) fn signal(&self, sig: &str) -> io::Result<()> {
        let pid = self.pid().ok_or_else(|| {
            io::Error::other(format!("the server on port {} is not running", self.port))
        })?;
        signal_pid(pid, sig)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether something accepts TCP connections on the loopback `port`.
pub(super) fn tcp_open(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_cut_off_by_a_signal_is_sent_again() {
        // EINTR as a socket read returns it (Linux's errno 4), and as a kind.
        for cut in [
            io::Error::from_raw_os_error(4),
            io::Error::from(io::ErrorKind::Interrupted),
        ] {
            let cut = redis::RedisError::from(cut);
            assert!(interrupted(&cut), "{cut}");
        }
        let reset = redis::RedisError::from(io::Error::from(io::ErrorKind::ConnectionReset));
        assert!(!interrupted(&reset), "{reset}");
        let timeout = redis::RedisError::from(io::Error::from(io::ErrorKind::TimedOut));
        assert!(!interrupted(&timeout), "{timeout}");
    }

    #[test]
    fn run_bounded_kills_a_command_that_overruns() {
        let start = Instant::now();
        let mut sleep = Command::new("sleep");
        sleep.arg("5");
        let err = run_bounded(&mut sleep, Duration::from_millis(100)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn a_missing_program_is_reported_with_the_install_command() {
        let mut cli = Command::new("/nonexistent/redis-cli");
        let err = run_bounded(&mut cli, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(
            err.to_string().contains("apt-get install -y redis-server"),
            "{err}"
        );
    }
}
