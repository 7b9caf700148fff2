//! Multi-key sections (`acquire_all`) in the kinds checker: a section over several exclusive
//! keys is a writer on each of them. Its one record carries every key with that key's fence
//! and the counter it read; [`project`] turns it into one writer section per key, which the
//! writer checks of [`super`] take as they are (no overlap with any holder of the key, fences
//! in start order, no stale write accepted, no lost update on the key's counter).
//!
//! The oracle keeps, per key, a highest fence and a counter (`Oracle::claim_all`).

use std::collections::BTreeSet;

use super::{Excuses, Kind, Report, Section, count, lost_updates, rw_fences, rw_overlaps};

/// The part name of the read-write key: its oracle keys are the writers' and readers' own.
pub const RW: &str = "rw";

/// One key of a multi-key section: its name, the fence the lock gave, the counter read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPart {
    pub key: String,
    pub fence: u64,
    pub read: Option<i64>,
}

impl KeyPart {
    /// As logged: ` key:fence:read,...` (`-` for no read), or nothing for no parts.
    pub fn field(parts: &[KeyPart]) -> String {
        if parts.is_empty() {
            return String::new();
        }
        let p: Vec<String> = parts
            .iter()
            .map(|p| {
                let read = p.read.map_or("-".to_owned(), |v| v.to_string());
                format!("{}:{}:{read}", p.key, p.fence)
            })
            .collect();
        format!(" {}", p.join(","))
    }

    pub fn parse(field: &str) -> Option<Vec<KeyPart>> {
        field
            .split(',')
            .map(|p| {
                let mut f = p.split(':');
                let (key, fence, read) = (f.next()?, f.next()?, f.next()?);
                Some(KeyPart {
                    key: key.to_owned(),
                    fence: fence.parse().ok()?,
                    read: if read == "-" {
                        None
                    } else {
                        Some(read.parse().ok()?)
                    },
                })
            })
            .collect()
    }
}

/// How a caller names its section when it reports what it was told: its process and fence
/// (a multi-key section's first key's, which its projections keep in `keys`).
pub fn ident(s: &Section) -> (u32, u64) {
    (s.pid, s.keys.first().map_or(s.fence, |p| p.fence))
}

/// The multi-key sections that held `key`, each as a writer section of that key.
pub fn project(sections: &[Section], key: &str) -> Vec<Section> {
    let mut out: Vec<Section> = sections
        .iter()
        .filter(|s| s.kind == Kind::Multi && s.acquired != 0)
        .filter_map(|s| {
            let p = s.keys.iter().find(|p| p.key == key)?;
            Some(Section {
                kind: Kind::Exclusive,
                fence: p.fence,
                read_value: p.read,
                ..s.clone()
            })
        })
        .collect();
    out.sort_by_key(|s| (s.acquired, s.fence));
    out
}

/// A key's oracle at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyState {
    pub key: String,
    pub counter: i64,
    pub accepted: i64,
    pub rejected: i64,
}

/// Every exclusive key (not the read-write one) as writers of it alone, and its oracle.
pub(super) fn check_keys(r: &mut Report, sections: &[Section], ex: &Excuses, st: &[KeyState]) {
    let keys: BTreeSet<&str> = sections
        .iter()
        .flat_map(|s| s.keys.iter().map(|p| p.key.as_str()))
        .filter(|&k| k != RW)
        .collect();
    r.multi_keys = keys.len();
    for key in keys {
        let on = project(sections, key);
        let on: Vec<&Section> = on.iter().collect();
        let mut k = Report::default();
        rw_overlaps(&mut k, &on, ex);
        rw_fences(&mut k, &on, ex);
        lost_updates(&mut k, &on, ex);
        let tag = |v: Vec<String>| v.into_iter().map(move |l| format!("key {key}: {l}"));
        r.overlaps.extend(tag(k.overlaps));
        r.fence_order.extend(tag(k.fence_order));
        r.stale_writes_accepted.extend(tag(k.stale_writes_accepted));
        r.excused_overlaps += k.excused_overlaps;
        r.told_overlaps += k.told_overlaps;
        r.lost_updates += k.lost_updates;
        r.excused_lost_updates += k.excused_lost_updates;
        let o = st
            .iter()
            .find(|s| s.key == key)
            .cloned()
            .unwrap_or_default();
        let rejected = count(&on, |s| s.claim == Some(false)) as i64;
        let pairs = [
            ("counter", o.counter, k.counter_expected),
            ("accepted", o.accepted, k.writes_accepted as i64),
            ("rejected", o.rejected, rejected),
        ];
        for (what, oracle, records) in pairs.into_iter().filter(|(_, o, r)| o != r) {
            r.key_disagreements.push(format!(
                "key {key}: {what} {oracle}, the records say {records}"
            ));
        }
    }
}
