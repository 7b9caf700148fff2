//! Counters read around a workload, not through any lock: this process's CPU time, resident
//! set and live heap (the counting allocator in `main.rs`), system constants from
//! `getconf`, and the server's per-command call counts (`INFO commandstats`).

use std::collections::HashMap;

use redis::aio::ConnectionManager;

use crate::{GLOBAL, Res};

/// `utime + stime` of this process, in clock ticks.
pub(crate) fn cpu_ticks() -> Res<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which is in parentheses and may contain spaces).
    let rest = stat.rsplit_once(')').ok_or("odd /proc/self/stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; `rest` starts at field 3.
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

/// Resident set size in pages.
pub(crate) fn rss_pages() -> Res<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    Ok(statm
        .split_whitespace()
        .nth(1)
        .ok_or("odd /proc/self/statm")?
        .parse()?)
}

/// `getconf name`, or `fallback` when it cannot be read.
pub(crate) fn getconf(name: &str, fallback: u64) -> u64 {
    std::process::Command::new("getconf")
        .arg(name)
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(fallback)
}

/// Live heap bytes of the whole process (counting allocator). `stats_alloc` already adds a
/// `realloc`'s growth to `bytes_allocated` (and a shrink to `bytes_deallocated`);
/// `bytes_reallocated` is the same change again, so adding it would count every buffer that
/// grew and was freed in between as still live.
pub(crate) fn heap_bytes() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// `calls` per command from `INFO commandstats`.
pub(crate) async fn commandstats(conn: &mut ConnectionManager) -> Res<HashMap<String, u64>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut out = HashMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name.to_owned(), calls);
    }
    Ok(out)
}
