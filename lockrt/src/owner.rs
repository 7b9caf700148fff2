//! The owner record: who holds a lock, kept beside it so operators can tell.
//!
//! A lock `prefix + key` held through lockrt has a string key `{prefix + key}:owner` beside it
//! (same cluster slot, same PTTL: acquire, renewal, `min_hold` and hand-over set both, release
//! deletes both). Its value is
//!
//! ```text
//! <acquired-at ms since the Unix epoch, server time>|<service>|<host>|<pid>|<instance id>
//! ```
//!
//! and, once the lock was passed on in its holder's process (local hand-off), the check of
//! that hand-off rewrites it as `<passed-at ms>|<service>|<host>|<pid>|<instance id>|<place>`,
//! `place` the next holder's place in the run of hand-offs ([`Holder::handoff`]).
//!
//! `service` ([`LockerBuilder::service_name`](crate::LockerBuilder::service_name), default
//! the executable's file name) and `host` (`HOSTNAME`, else `/proc/sys/kernel/hostname`) have
//! `|` and control characters replaced by `_` and are cut to 64 bytes each; the instance id is
//! [`Locker::instance_id`](crate::Locker::instance_id). The scripts cut whatever a client sends to 256 bytes, so the record
//! stays small. The in-memory backend keeps the same record (acquired-at from the local clock).

/// Longest service or host part of an owner record, in bytes.
const MAX_PART: usize = 64;

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

/// The record kept beside a lock: `<acquired-at ms>|<owner text>` (lock.lua writes the same
/// from the server's clock).
pub(crate) fn record(acquired_at_ms: u64, owner: &str) -> String {
    format!("{acquired_at_ms}|{owner}")
}

/// The record of a lock passed on in its holder's process to the holder at `place` in the run
/// of local hand-offs: `<passed-at ms>|<owner text>|<place>` (renew.lua writes the same).
pub(crate) fn record_passed(passed_at_ms: u64, owner: &str, place: u32) -> String {
    format!("{passed_at_ms}|{owner}|{place}")
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
    /// The holding [`Locker`](crate::Locker)'s instance id (a UUID, as text).
    pub instance_id: String,
    /// When the holder acquired the lock, in ms since the Unix epoch (the server's clock), or
    /// when it was passed to it in its process (that host's clock).
    pub acquired_at_ms: u64,
    /// The holder's place in a run of local hand-offs
    /// ([`LockerBuilder::local_handoff`](crate::LockerBuilder::local_handoff)): 0 for the task
    /// that took the lock from Redis, `n` for the `n`-th task of the same `Locker` it was passed
    /// to in a row. Set once the passing holder's check of the hand-off is done (a round trip).
    pub handoff: u32,
}

impl Holder {
    /// Parses an owner record (`<acquired-at>|<service>|<host>|<pid>|<instance id>`, then
    /// `|<hand-off place>` for a lock passed on in its holder's process).
    pub(crate) fn parse(record: &str) -> Option<Holder> {
        let mut parts = record.splitn(6, '|');
        let acquired_at_ms = parts.next()?.parse().ok()?;
        let service = parts.next()?.to_owned();
        let host = parts.next()?.to_owned();
        let pid = parts.next()?.parse().unwrap_or(0);
        let instance_id = parts.next().unwrap_or_default().to_owned();
        let handoff = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        Some(Holder {
            handoff,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_records_round_trip_and_stay_small() {
        let id = uuid::Uuid::new_v4();
        let long = "x|y\n".repeat(100);
        let text = owner_text(Some(&long), id);
        assert!(text.len() <= 256, "{}", text.len());
        let h = Holder::parse(&record(1_700_000_000_000, &text)).unwrap();
        assert_eq!(h.service.len(), MAX_PART);
        assert!(!h.service.contains('|'));
        assert_eq!(h.pid, std::process::id());
        assert_eq!(h.instance_id, id.to_string());
        assert_eq!(h.acquired_at_ms, 1_700_000_000_000);
        assert_eq!(h.handoff, 0);
        let passed = Holder::parse(&record_passed(1_700_000_000_005, &text, 3)).unwrap();
        assert_eq!(
            (passed.handoff, passed.acquired_at_ms),
            (3, 1_700_000_000_005)
        );
        assert_eq!(passed.instance_id, id.to_string());
    }
}
