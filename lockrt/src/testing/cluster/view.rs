//! What one node of a cluster says about it: the lines of `CLUSTER NODES` and the fields of
//! `CLUSTER INFO`, fetched with a bounded one-shot query and parsed. Parsing only: what a
//! view means for the cluster's health is the cluster's business.

use crate::testing::process::query;

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub(super) struct ViewEntry {
    pub(super) id: String,
    pub(super) myself: bool,
    pub(super) master: bool,
    pub(super) master_id: Option<String>,
    pub(super) failing: bool,
    /// The bus link to the node is up (always, for the node itself).
    pub(super) linked: bool,
    pub(super) slots: Vec<(u16, u16)>,
}

impl ViewEntry {
    pub(super) fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// `CLUSTER NODES` of the node on `port`, parsed.
pub(super) fn cluster_view(port: u16) -> Result<Vec<ViewEntry>, String> {
    Ok(parse_cluster_nodes(&query::<String>(
        port,
        redis::cmd("CLUSTER").arg("NODES"),
    )?))
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch>
/// <link> <slot>...`, skipping the `[slot->-id]` entries of slots in migration.
fn parse_cluster_nodes(text: &str) -> Vec<ViewEntry> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            let id = parts.next()?.to_owned();
            let _addr = parts.next()?;
            let flags: Vec<&str> = parts.next()?.split(',').collect();
            let master_id = parts.next().filter(|m| *m != "-").map(str::to_owned);
            let mut rest = parts.skip(3);
            let linked = rest.next()? == "connected";
            let slots = rest
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|a| (a, a)),
                })
                .collect();
            Some(ViewEntry {
                id,
                myself: flags.contains(&"myself"),
                master: flags.contains(&"master"),
                master_id,
                failing: flags.iter().any(|f| *f == "fail" || *f == "fail?"),
                linked,
                slots,
            })
        })
        .collect()
}

/// `key:value` lines of an `INFO`-style reply.
pub(super) fn fields(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.trim().split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_nodes_lines_parse_with_migrations_and_failure_flags() {
        let text = "\
a1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [5461->-b2]
b2 127.0.0.1:30002@40002,host master,fail? - 0 0 2 connected 5461 5462-10922
c3 127.0.0.1:30004@40004 slave a1 0 0 1 connected
";
        let view = parse_cluster_nodes(text);
        assert_eq!(view.len(), 3);
        assert!(view[0].myself && view[0].master && view[0].slots == [(0, 5460)]);
        assert!(view[1].failing && view[1].serves(5461) && view[1].serves(10922));
        assert_eq!(view[2].master_id.as_deref(), Some("a1"));
        assert!(!view[2].master && view[2].slots.is_empty());
    }
}
