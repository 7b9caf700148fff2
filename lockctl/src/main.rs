//! `lockctl`: inspect and operate lockrt's locks on a Redis server.
//!
//! ```text
//! lockctl --url redis://host:6379/ [--prefix lock:] list [PATTERN]
//! lockctl --url ... show KEY
//! lockctl --url ... unlock --force KEY
//! lockctl --url ... watch [PATTERN] [--interval 1s] [--count N]
//! lockctl --url ... jobs [PATTERN]
//! ```
//!
//! One line per lock: key, holder (`service@host pid`; for a read lock `N readers`, for a
//! semaphore `N/M permits`), remaining lease, fence, waiters, and how long it has been held
//! (`show` lists each reader or permit holder); `--json` prints the same as JSON for scripts. lockctl reads
//! what the service reads ([`lockrt::LockerBuilder::from_env`]): `LOCKRT_URL`, `REDIS_URL`,
//! `LOCKRT_PREFIX`, the Sentinel master credentials and the timeouts; `--url` (or
//! `LOCKCTL_URL`) and `--prefix` take precedence. It never prints the URL, and the library's
//! errors name the server without any credential. `list` and `watch` scan keys; on a Redis
//! Cluster they scan every master.
//!
//! Keys and owner record fields are text anyone with write access to Redis chooses: they are
//! printed as lockrt's logs print keys, quoted and escaped (Rust's `Debug` form), so a key
//! holding a newline or a terminal control sequence cannot forge a row or repaint the screen.
//!
//! `list` and `watch` show held locks: a released lock kept taken (`min_hold`, the mark of a
//! finished `every` tick) only with `list --released`. `jobs` shows each `every` job with a
//! claim on the server: its run going on and its latest finished run, by whom, and the latest
//! run's outcome and the next tick as its runner recorded them.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use lockrt::{Holder, JobStatus, LockInfo, LockKind, Locker, LockerBuilder, LockerConfig};

#[derive(Parser, Debug)]
#[command(
    name = "lockctl",
    version,
    about = "Inspect and operate lockrt's Redis locks"
)]
struct Cli {
    /// Redis URL (redis://, rediss://, redis+cluster://, redis+sentinel://); default
    /// `LOCKCTL_URL`, then the service's `LOCKRT_URL`, then `REDIS_URL`.
    #[arg(long)]
    url: Option<String>,
    /// The lockers' key prefix; default the service's `LOCKRT_PREFIX`, then `lock:`.
    #[arg(long)]
    prefix: Option<String>,
    /// Print JSON (one array for `list`, one object for `show`) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Held locks whose keys match PATTERN (a Redis glob, default all), one per line.
    List {
        /// A glob over the user keys (without the prefix).
        #[arg(default_value = "*")]
        pattern: String,
        /// Also the released locks kept taken: a `min_hold` not over, the marks of finished
        /// job ticks.
        #[arg(long)]
        released: bool,
    },
    /// The scheduled jobs (lockrt::every) with a claim on the server: the run going on and the
    /// latest finished run, by whom; the latest run's outcome and the next tick.
    Jobs {
        /// A glob over the job names.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// One lock, with every field of its owner record.
    Show {
        /// The lock's key (without the prefix).
        key: String,
    },
    /// Removes a lock whoever holds it: the holder is told at once by its revoke message
    /// (at the latest at its next renewal, a third of its ttl, when it cannot hear it) and
    /// the longest waiter gets the lock at once.
    Unlock {
        /// Required: this breaks the holder's mutual exclusion.
        #[arg(long)]
        force: bool,
        /// The lock's key (without the prefix).
        key: String,
    },
    /// Prints locks that appear, change holder or go, every interval.
    Watch {
        /// A glob over the user keys (without the prefix).
        #[arg(default_value = "*")]
        pattern: String,
        /// Time between two looks: "1s", "500ms", "2m".
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Stop after this many looks (default: until Ctrl-C).
        #[arg(long)]
        count: Option<u64>,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match run(cli).await {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("lockctl: {msg}");
            ExitCode::from(2)
        }
    }
}

/// Prints a command-line error without the arguments that may hold a secret: clap quotes
/// the offending argument, and a URL given without `--url` (`lockctl redis://:pw@h list`) is
/// one.
fn usage_error(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    let mut text = e.render().to_string();
    for arg in std::env::args().skip(1) {
        if arg.contains("://") || arg.contains('@') {
            text = text.replace(&arg, "<hidden: may hold a password; give a URL with --url>");
        }
    }
    eprint!("{text}");
    ExitCode::from(2)
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let locker = connect(cli.url, cli.prefix).await?;
    match cli.command {
        Command::List { pattern, released } => list(&locker, &pattern, released, cli.json).await,
        Command::Jobs { pattern } => jobs(&locker, &pattern, cli.json).await,
        Command::Show { key } => show(&locker, &key, cli.json).await,
        Command::Unlock { force, key } => unlock(&locker, &key, force).await,
        Command::Watch {
            pattern,
            interval,
            count,
        } => watch(&locker, &pattern, interval, count).await,
    }
}

/// A locker with the service's settings from the environment (see
/// [`LockerBuilder::from_env`]), the URL from `--url`, `LOCKCTL_URL`, `LOCKRT_URL` or
/// `REDIS_URL` in that order, the prefix from `--prefix` when given.
async fn connect(url: Option<String>, prefix: Option<String>) -> Result<Locker, String> {
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let mut config = LockerConfig::from_lookup(env).map_err(|e| e.to_string())?;
    let (url, source) = match url {
        Some(url) => (url, "--url"),
        None => ["LOCKCTL_URL", "LOCKRT_URL", "REDIS_URL"]
            .into_iter()
            .find_map(|name| env(name).map(|url| (url, name)))
            .ok_or(
                "no Redis URL: pass --url redis://host:6379/, or set LOCKCTL_URL, or the \
                 service's LOCKRT_URL or REDIS_URL",
            )?,
    };
    config.url = Some(url);
    if prefix.is_some() {
        config.prefix = prefix;
    }
    // The URL itself is never printed: the library's error names the server, redacted.
    LockerBuilder::from_config(config)
        .map_err(|e| e.to_string())?
        .service_name("lockctl")
        // An operator inspects and unlocks whatever server the service uses; the service's
        // own build refuses an evicting one (lockctl says so in one WARN).
        .allow_eviction(true)
        .build()
        .await
        .map_err(|e| format!("cannot connect (URL from {source}): {e}"))
}

async fn list(
    locker: &Locker,
    pattern: &str,
    released: bool,
    json: bool,
) -> Result<ExitCode, String> {
    let locks = if released {
        locker.locks_with_released(pattern).await
    } else {
        locker.locks(pattern).await
    };
    let locks = locks.map_err(|e| e.to_string())?;
    if json {
        let all: Vec<serde_json::Value> = locks.iter().map(to_json).collect();
        println!("{}", serde_json::Value::Array(all));
        return Ok(ExitCode::SUCCESS);
    }
    print_header();
    for l in &locks {
        println!("{}", line(l));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per job: its name, the run going on (by whom, since when) and the latest finished
/// run (by whom, when it claimed its tick).
async fn jobs(locker: &Locker, pattern: &str, json: bool) -> Result<ExitCode, String> {
    let jobs = locker.jobs(pattern).await.map_err(|e| e.to_string())?;
    if json {
        let all: Vec<serde_json::Value> = jobs.iter().map(job_json).collect();
        println!("{}", serde_json::Value::Array(all));
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<32} {:<8} {:<40} {:<26} {:>10} {:<9} {:<26}",
        "JOB", "STATE", "LAST RUN BY", "LAST RUN CLAIMED AT", "AGO", "OUTCOME", "NEXT TICK"
    );
    for j in &jobs {
        // The latest run's record: its outcome, and the tick after it.
        let (outcome, next) = j.last.as_ref().map_or_else(
            || ("-".to_owned(), "-".to_owned()),
            |r| (format!("{:?}", r.outcome), when(r.next_ms).0),
        );
        let (state, last) = match (&j.running, &j.finished) {
            (Some(r), _) => ("running", r),
            (None, Some(f)) => ("finished", f),
            (None, None) => continue,
        };
        let (by, at, ago) = last.holder.as_ref().map_or_else(
            || ("-".to_owned(), "-".to_owned(), "-".to_owned()),
            |h| {
                let (at, ago) = when(h.acquired_at_ms);
                (who(h), at, ago.replace(' ', ""))
            },
        );
        println!(
            "{:<32} {:<8} {:<40} {:<26} {:>10} {:<9} {:<26}",
            format!("{:?}", j.name),
            state,
            by,
            at,
            ago,
            outcome,
            next
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A job as JSON: its run going on and its latest finished run, as `list` prints locks.
fn job_json(j: &JobStatus) -> serde_json::Value {
    serde_json::json!({
        "name": j.name,
        "running": j.running.as_ref().map(to_json),
        "finished": j.finished.as_ref().map(to_json),
        "last": j.last.as_ref().map(|r| serde_json::json!({
            "tick_ms": r.tick_ms,
            "outcome": r.outcome,
            "next_ms": r.next_ms,
            "ended_ms": r.ended_ms,
            "by": r.by.as_ref().map(|h| serde_json::json!({
                "service": h.service, "host": h.host, "pid": h.pid, "instance_id": h.instance_id,
            })),
        })),
    })
}

/// `service@host pid`, quoted and escaped.
fn who(h: &Holder) -> String {
    format!("{:?}@{:?} {}", h.service, h.host, h.pid)
}

/// Exit code 1 when the lock is not held.
async fn show(locker: &Locker, key: &str, json: bool) -> Result<ExitCode, String> {
    let Some(l) = locker.lock_info(key).await.map_err(|e| e.to_string())? else {
        if json {
            println!("null");
        } else {
            println!("{key:?}: not held");
        }
        return Ok(ExitCode::from(1));
    };
    if json {
        println!("{}", to_json(&l));
        return Ok(ExitCode::SUCCESS);
    }
    print_header();
    println!("{}", line(&l));
    println!("redis key:   {:?}", l.redis_key);
    if let Some(h) = &l.holder {
        println!("service:     {:?}", h.service);
        println!("host:        {:?}", h.host);
        println!("pid:         {}", h.pid);
        println!("instance id: {:?}", h.instance_id);
        let (at, age) = when(h.acquired_at_ms);
        println!("acquired at: {at} ({age} ago)");
        if h.handoff > 0 {
            println!("hand-off:    {} (passed on in its process)", h.handoff);
        }
    }
    for s in &l.shared {
        let who = s.holder.as_ref().map_or_else(
            || "-".to_owned(),
            |h| format!("{:?}@{:?} {}", h.service, h.host, h.pid),
        );
        let fence = s.fence.map_or_else(|| "-".to_owned(), |f| f.to_string());
        let kind = if l.kind == LockKind::Read {
            "reader"
        } else {
            "permit"
        };
        println!(
            "{kind}:      {who}, {}ms left, fence {fence}",
            s.remaining.as_millis()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Exit code 1 when the lock was not held.
async fn unlock(locker: &Locker, key: &str, force: bool) -> Result<ExitCode, String> {
    if !force {
        return Err(format!(
            "refusing to unlock {key:?} without --force: its holder may still be working"
        ));
    }
    if locker.force_unlock(key).await.map_err(|e| e.to_string())? {
        println!("{key:?}: unlocked");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("{key:?}: not held");
        Ok(ExitCode::from(1))
    }
}

/// Prints `+` for a lock that appeared or changed holder (new fence), `-` for one that went.
async fn watch(
    locker: &Locker,
    pattern: &str,
    interval: Duration,
    count: Option<u64>,
) -> Result<ExitCode, String> {
    let mut seen: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut round = 0;
    print_header();
    loop {
        let locks = locker.locks(pattern).await.map_err(|e| e.to_string())?;
        let now: BTreeMap<String, Option<u64>> =
            locks.iter().map(|l| (l.key.clone(), l.fence)).collect();
        for l in &locks {
            if seen.get(&l.key) != Some(&l.fence) {
                println!("+ {}", line(l));
            }
        }
        for key in seen.keys().filter(|k| !now.contains_key(*k)) {
            println!("- {key:?}");
        }
        seen = now;
        round += 1;
        if count.is_some_and(|n| round >= n) {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
    }
}

fn print_header() {
    println!(
        "{:<32} {:<40} {:>10} {:>20} {:>7} {:>10}",
        "KEY", "HOLDER", "LEASE", "FENCE", "WAITERS", "HELD"
    );
}

/// A holder's acquired-at (ms since the epoch, the server's clock) as an RFC 3339 date, and
/// how long ago that was by this machine's clock (`0s` if the clocks disagree the other way).
fn when(acquired_at_ms: u64) -> (String, String) {
    let at = UNIX_EPOCH + Duration::from_millis(acquired_at_ms);
    let age = SystemTime::now().duration_since(at).unwrap_or_default();
    (
        humantime::format_rfc3339_millis(at).to_string(),
        humantime::format_duration(round(age)).to_string(),
    )
}

/// A duration to what a person reads: ms under 10 s, whole seconds after that.
fn round(d: Duration) -> Duration {
    if d < Duration::from_secs(10) {
        Duration::from_millis(d.as_millis().try_into().unwrap_or(u64::MAX))
    } else {
        Duration::from_secs(d.as_secs())
    }
}

/// One lock as JSON: the table's fields, the owner record's, and times in ms.
fn to_json(l: &LockInfo) -> serde_json::Value {
    let holder = l.holder.as_ref().map(holder_json);
    let shared: Vec<serde_json::Value> = (l.shared.iter())
        .map(|s| {
            serde_json::json!({
                "holder": s.holder.as_ref().map(holder_json),
                "remaining_ms": u64::try_from(s.remaining.as_millis()).unwrap_or(u64::MAX),
                "fence": s.fence,
            })
        })
        .collect();
    let permits = match l.kind {
        LockKind::Permits(n) => Some(n),
        _ => None,
    };
    serde_json::json!({
        "key": l.key,
        "redis_key": l.redis_key,
        "kind": l.kind.as_str(),
        "permits": permits,
        "holder": holder,
        "shared": shared,
        "remaining_ms": l.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "fence": l.fence,
        "waiters": l.waiters,
        "released": l.released,
    })
}

/// An owner record as JSON.
fn holder_json(h: &Holder) -> serde_json::Value {
    let (at, _) = when(h.acquired_at_ms);
    serde_json::json!({
            "service": h.service,
            "host": h.host,
            "pid": h.pid,
            "instance_id": h.instance_id,
            "acquired_at_ms": h.acquired_at_ms,
            "acquired_at": at,
            "handoff": h.handoff,
    })
}

/// `key holder lease fence waiters`, aligned like the header; the key and the holder's
/// service and host quoted and escaped.
fn line(l: &LockInfo) -> String {
    let holder = match (l.kind, &l.holder) {
        (LockKind::Read, _) => format!("{} readers", l.shared.len()),
        (LockKind::Permits(n), _) => format!("{}/{n} permits", l.shared.len()),
        (_, Some(h)) => who(h),
        (_, None) => "-".to_owned(),
    };
    let lease = l
        .remaining
        .map_or_else(|| "-".to_owned(), |d| format!("{}ms", d.as_millis()));
    let fence = l.fence.map_or_else(|| "-".to_owned(), |f| f.to_string());
    let held = l.holder.as_ref().map_or_else(
        || "-".to_owned(),
        |h| when(h.acquired_at_ms).1.replace(' ', ""),
    );
    format!(
        "{:<32} {:<40} {:>10} {:>20} {:>7} {:>10}",
        format!("{:?}", l.key),
        holder,
        lease,
        fence,
        l.waiters,
        held
    )
}

/// A duration as the library's configuration writes them (humantime: `500ms`, `1s`, `1m 30s`),
/// or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    match s.parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => humantime::parse_duration(s).map_err(|e| format!("not a duration: {s:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert!(parse_duration("1x").is_err());
    }
}
