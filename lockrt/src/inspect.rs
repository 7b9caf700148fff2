//! Who holds what: the owner record each held lock keeps beside it, and the inspection API
//! ([`Locker::locks`], [`Locker::lock_info`], [`Locker::force_unlock`]) that `lockctl` uses.
//!
//! ## The owner record
//!
//! A lock `prefix + key` held through lockrt has a string key `{prefix + key}:owner` beside it
//! (same cluster slot, same PTTL: acquire, renewal, `min_hold` and hand-over set both, release
//! deletes both). Its value is
//!
//! ```text
//! <acquired-at ms since the Unix epoch, server time>|<service>|<host>|<pid>|<instance id>
//! ```
//!
//! `service` ([`LockerBuilder::service_name`](crate::LockerBuilder::service_name), default
//! the executable's file name) and `host` (`HOSTNAME`, else `/proc/sys/kernel/hostname`) have
//! `|` and control characters replaced by `_` and are cut to 64 bytes each; the instance id is
//! [`Locker::instance_id`]. The scripts cut whatever a client sends to 256 bytes, so the record
//! stays small. The in-memory backend keeps the same record (acquired-at from the local clock).

use std::time::Duration;

use crate::backend::Backend;
use crate::key::LockKey;
use crate::{LockError, Locker};

/// Longest service or host part of an owner record, in bytes.
const MAX_PART: usize = 64;

/// At most this many locks from one [`Locker::locks`] call.
pub const MAX_LISTED: usize = 10_000;

/// The owner record text a locker sends with each acquire:
/// `<service>|<host>|<pid>|<instance id>`.
pub(crate) fn owner_text(service: Option<&str>, instance: uuid::Uuid) -> String {
    let service = service.map_or_else(default_service, str::to_owned);
    format!(
        "{}|{}|{}|{}",
        clean(&service),
        clean(&hostname()),
        std::process::id(),
        instance
    )
}

/// `owner` (an [`owner_text`]) naming instance `id` instead of its own.
pub(crate) fn with_instance(owner: &str, id: uuid::Uuid) -> String {
    let rest = owner.rsplit_once('|').map_or(owner, |(rest, _)| rest);
    format!("{rest}|{id}")
}

fn default_service() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.trim().is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// `s` without separators or control characters, cut to [`MAX_PART`] bytes.
fn clean(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = if c == '|' || c.is_control() { '_' } else { c };
        if out.len() + c.len_utf8() > MAX_PART {
            break;
        }
        out.push(c);
    }
    out
}

/// Who holds a lock, from its owner record.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's service name.
    pub service: String,
    /// The holder's host name.
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// The holding [`Locker`]'s instance id (a UUID, as text).
    pub instance_id: String,
    /// When the holder acquired the lock, in ms since the Unix epoch (the server's clock).
    pub acquired_at_ms: u64,
}

impl Holder {
    /// Parses an owner record (`<acquired-at>|<service>|<host>|<pid>|<instance id>`).
    fn parse(record: &str) -> Option<Holder> {
        let mut parts = record.splitn(5, '|');
        let acquired_at_ms = parts.next()?.parse().ok()?;
        let service = parts.next()?.to_owned();
        let host = parts.next()?.to_owned();
        let pid = parts.next()?.parse().unwrap_or(0);
        let instance_id = parts.next().unwrap_or_default().to_owned();
        Some(Holder {
            service,
            host,
            pid,
            instance_id,
            acquired_at_ms,
        })
    }
}

impl std::fmt::Display for Holder {
    /// `service@host pid`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{} {}", self.service, self.host, self.pid)
    }
}

/// One held lock, as [`Locker::lock_info`] and [`Locker::locks`] report it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
/// let locker = lockrt::Locker::builder().service_name("billing");
/// let locker = lockrt::Locker::in_memory_with(locker);
/// let guard = locker.acquire("invoice:7", lockrt::LockOptions::new()).await?;
/// let info = locker.lock_info("invoice:7").await?.expect("held");
/// assert_eq!(info.holder.as_ref().unwrap().service, "billing");
/// assert_eq!(info.fence, Some(guard.fence()));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key as the user wrote it (`stock:1`).
    pub key: String,
    /// The lock's Redis key (`lock:stock:1`).
    pub redis_key: String,
    /// Who holds it; `None` when the lock has no owner record (taken by an older lockrt).
    pub holder: Option<Holder>,
    /// Remaining lease; `None` when the key has no expiry (not a lockrt lock).
    pub remaining: Option<Duration>,
    /// The holder's fencing token, when the value has lockrt's format.
    pub fence: Option<u64>,
    /// Waiters of other processes queued for it with a live registration (always 0 in
    /// memory, where waiters queue inside the locker).
    pub waiters: u64,
}

impl Locker {
    /// The lock `key` (the user's key, without the prefix), or `None` when nobody holds it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// assert!(locker.lock_info("job").await?.is_none());
    /// let _g = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// let info = locker.lock_info("job").await?.unwrap();
    /// assert_eq!(info.holder.unwrap().pid, std::process::id());
    /// # Ok(()) }
    /// ```
    pub async fn lock_info(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let key = LockKey::new(self.prefix(), key)?;
        self.info_of(&key).await
    }

    async fn info_of(&self, key: &LockKey) -> Result<Option<LockInfo>, LockError> {
        let base = |holder: Option<Holder>, remaining, fence, waiters| LockInfo {
            key: key.user.to_string(),
            redis_key: key.lock().to_owned(),
            holder,
            remaining,
            fence,
            waiters,
        };
        Ok(match self.backend() {
            Backend::Memory(m) => m.inspect(key.lock()).map(|(fence, left, owner)| {
                base(Holder::parse(&owner), Some(left), Some(fence), 0)
            }),
            Backend::Redis(r) => {
                let raw = r.inspect(key).await?;
                if raw.value.is_empty() {
                    return Ok(None);
                }
                let fence = raw.value.get(33..).and_then(|f| f.parse().ok());
                let remaining = u64::try_from(raw.pttl).ok().map(Duration::from_millis);
                Some(base(
                    Holder::parse(&raw.owner),
                    remaining,
                    fence,
                    u64::try_from(raw.waiters).unwrap_or(0),
                ))
            }
        })
    }

    /// The held locks whose keys (without the prefix) match `pattern`, a Redis glob (`*`,
    /// `?`, `[..]`; `"*"` for all), sorted by key, at most [`MAX_LISTED`]. Runs `SCAN`, which
    /// does not block the server; on a Redis Cluster it scans every master (found with
    /// `CLUSTER SLOTS`, connected with the seeds' credentials).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let _a = locker.acquire("stock:1", lockrt::LockOptions::new()).await?;
    /// let _b = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// let held = locker.locks("stock:*").await?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].key, "stock:1");
    /// # Ok(()) }
    /// ```
    pub async fn locks(&self, pattern: &str) -> Result<Vec<LockInfo>, LockError> {
        let full = format!("{}{pattern}", self.prefix());
        let names = match self.backend() {
            Backend::Memory(m) => m.scan(&full),
            Backend::Redis(r) => r.scan(&full, MAX_LISTED).await?,
        };
        let mut out = Vec::new();
        for name in names.into_iter().take(MAX_LISTED) {
            let Some(user) = name.strip_prefix(self.prefix()) else {
                continue;
            };
            let key = LockKey {
                user: unescape(user).into(),
                tag: format!("{{{name}}}").into(),
            };
            if let Some(info) = self.info_of(&key).await? {
                out.push(info);
            }
        }
        Ok(out)
    }

    /// Removes lock `key` whoever holds it, for operators (a crashed holder's lock, a stuck
    /// job). It runs the holder's own release: the owner record goes, the longest live waiter
    /// (of any process) gets the lock at once and is told. The holder is revoked at once: the
    /// same script publishes its token on the revoke channel `{<prefix>}:revoke`, which every
    /// locker listens to while it holds a lock, so the holder's lease is declared lost within
    /// milliseconds and its section (`on_lost = "cancel"`) cancelled. If that message is lost
    /// (the holder's subscriber was reconnecting), its next renewal, within a third of its ttl,
    /// finds the lock gone. Returns whether a lock was held. Between the hand-over and the
    /// holder hearing of it lie those milliseconds (or that renewal interval): use fencing
    /// tokens where even that overlap matters.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockrt::LockError> {
    /// let locker = lockrt::Locker::in_memory();
    /// let held = locker.acquire("job", lockrt::LockOptions::new()).await?;
    /// assert!(locker.force_unlock("job").await?);
    /// assert!(held.is_lost(), "the holder is told at once");
    /// assert!(locker.lock_info("job").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, key: &str) -> Result<bool, LockError> {
        let key = LockKey::new(self.prefix(), key)?;
        let freed = match self.backend() {
            Backend::Memory(m) => m.force_release(&key),
            Backend::Redis(r) => !matches!(
                r.force_release(&key).await?,
                crate::backend::contract::Released::NotOwner
            ),
        };
        if freed {
            self.wake(&key.tag);
        }
        Ok(freed)
    }
}

/// The user's key from its escaped form (`%7B`, `%7D`, `%25`).
fn unescape(s: &str) -> String {
    s.replace("%7B", "{")
        .replace("%7D", "}")
        .replace("%25", "%")
}

/// Whether `name` matches glob `pattern` (`*`, `?`, `[..]` taken literally: enough for the
/// in-memory backend).
pub(crate) fn glob(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_round_trip_and_stay_small() {
        let id = uuid::Uuid::new_v4();
        let long = "x|y\n".repeat(100);
        let text = owner_text(Some(&long), id);
        assert!(text.len() <= 256, "{}", text.len());
        let h = Holder::parse(&format!("1700000000000|{text}")).unwrap();
        assert_eq!(h.service.len(), MAX_PART);
        assert!(!h.service.contains('|'));
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.instance_id, id.to_string());
        assert_eq!(h.acquired_at_ms, 1_700_000_000_000);
    }

    #[test]
    fn globs() {
        assert!(glob("lock:*", "lock:a:b"));
        assert!(glob("lock:?", "lock:a"));
        assert!(!glob("lock:?", "lock:ab"));
        assert!(glob("*b*", "abc"));
        assert!(!glob("a*c", "abd"));
        assert_eq!(unescape("a%7Bb%7D%25"), "a{b}%");
    }
}
