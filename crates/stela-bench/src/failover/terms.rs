//! One primary per term, as the processes' own logs tell it: every node's "promoted: this node
//! is the primary epoch=E" and the witness's "granting a new epoch ... node="N" epoch=E" (a
//! grant on request) or "granting the epoch to the most up-to-date node ... epoch=E
//! holder=Some("N")" (an election by promises),
//! read after the run (the logs are appended to across restarts, so they hold the whole run).
//! The status samples ([`super::overlap::PrimaryWatch`]) and the client's acknowledgements
//! ([`super::analysis::double_primary_times`]) are the other two sources; a double primary can
//! hide from any one of them (a node promoted and deposed between two samples, a primary no
//! client reached), not from all three.
//!
//! Pure: text in, conflicts out. A conflict is an epoch that two nodes say they were promoted
//! to, that the witness granted to two nodes, or that a node says it was promoted to while the
//! witness granted it to another.

use std::collections::{BTreeMap, BTreeSet};

/// What a node's log line says when the node becomes primary by promotion.
const PROMOTED: &str = "promoted: this node is the primary";
/// What the witness's log line says when it grants an epoch.
const GRANTING: &str = "witness: granting";
/// The same line from the etcd coordinator, in the log of the node whose promise decided an
/// election on etcd (`--coordinator etcd`: the caller passes the nodes' logs as the
/// coordinator's).
const ETCD_GRANTING: &str = "etcd: granting";

/// The value of `key=` in a tracing line (`key=7`, `key="a"`), unquoted.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pattern = format!(" {key}=");
    let start = line.find(&pattern)? + pattern.len();
    let rest = &line[start..];
    let value = rest.split_whitespace().next()?;
    Some(value.trim_matches('"'))
}

/// The epochs a node's log says it was promoted to, in order.
pub fn promotions(log: &str) -> Vec<u64> {
    log.lines()
        .filter(|line| line.contains(PROMOTED))
        .filter_map(|line| field(line, "epoch")?.parse().ok())
        .collect()
}

/// The (epoch, node) grants the witness's log names, in order.
pub fn grants(log: &str) -> Vec<(u64, String)> {
    log.lines()
        .filter(|line| line.contains(GRANTING) || line.contains(ETCD_GRANTING))
        .filter_map(|line| {
            let epoch = field(line, "epoch")?.parse().ok()?;
            let node = field(line, "node").or_else(|| {
                let holder = field(line, "holder")?;
                holder.strip_prefix("Some(\"")?.strip_suffix("\")")
            })?;
            Some((epoch, node.to_owned()))
        })
        .collect()
}

/// An epoch more than one node held, by one source or between two.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Conflict {
    pub epoch: u64,
    /// The nodes the node logs name as promoted to it.
    pub promoted: Vec<String>,
    /// The nodes the witness's log names as granted it.
    pub granted: Vec<String>,
}

/// The epochs with more than one holder: `nodes` are (name, log text), `witness` the witness's
/// log text.
pub fn conflicts(nodes: &[(&str, String)], witness: &str) -> Vec<Conflict> {
    let mut promoted: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for (name, log) in nodes {
        for epoch in promotions(log) {
            promoted
                .entry(epoch)
                .or_default()
                .insert((*name).to_owned());
        }
    }
    let mut granted: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for (epoch, node) in grants(witness) {
        granted.entry(epoch).or_default().insert(node);
    }
    let epochs: BTreeSet<u64> = promoted.keys().chain(granted.keys()).copied().collect();
    epochs
        .into_iter()
        .filter_map(|epoch| {
            let p = promoted.get(&epoch).cloned().unwrap_or_default();
            let g = granted.get(&epoch).cloned().unwrap_or_default();
            let holders: BTreeSet<&String> = p.iter().chain(&g).collect();
            (holders.len() > 1).then(|| Conflict {
                epoch,
                promoted: p.into_iter().collect(),
                granted: g.into_iter().collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_B: &str = "\
2026-12-07T13:27:19.863329Z  WARN stela_server::cluster: promoted: this node is the primary epoch=2 took_ms=334
2026-12-07T13:27:20.1Z  INFO stela_server::net: connection accepted
2026-12-07T13:27:29.863329Z  WARN stela_server::cluster: promoted: this node is the primary epoch=4 took_ms=301";
    const WITNESS: &str = "\
2026-12-07T13:27:18.501173Z  WARN stela_coord::witness: witness: granting a new epoch (failover) node=\"a\" epoch=1 silent_ms=198
2026-12-07T13:27:19.856524Z  WARN stela_coord::witness: witness: granting a new epoch (failover) node=\"b\" epoch=2 silent_ms=358
2026-12-07T13:27:29.856524Z  WARN stela_coord::witness: witness: granting a new epoch (failover) node=\"b\" epoch=4 silent_ms=358
2026-12-07T13:57:16.839946Z  WARN stela_coord::witness: witness: granting the epoch to the most up-to-date node that promised it (failover) epoch=5 holder=Some(\"c\") promises=2";

    #[test]
    fn reads_the_daemons_and_the_witnesss_lines() {
        assert_eq!(promotions(NODE_B), vec![2, 4]);
        assert_eq!(
            grants(WITNESS),
            vec![
                (1, "a".into()),
                (2, "b".into()),
                (4, "b".into()),
                (5, "c".into())
            ]
        );
        assert!(promotions("nothing here").is_empty());
        // On etcd the node whose promise decided the election logs the grant.
        let etcd = "2026-12-08T01:52:48.557794Z  WARN stela_coord::etcd: etcd: granting the epoch to the most up-to-date node that promised it (failover) epoch=2 holder=Some(\"b\") promises=2";
        assert_eq!(grants(etcd), vec![(2, "b".into())]);
    }

    #[test]
    fn an_epoch_with_two_holders_by_any_source_is_a_conflict() {
        // Consistent: b promoted to 2 and 4, granted both; a granted 1 (its first grant at
        // start is no promotion).
        assert!(conflicts(&[("a", String::new()), ("b", NODE_B.into())], WITNESS).is_empty());
        // Two nodes say they were promoted to epoch 2.
        let a =
            "x WARN stela_server::cluster: promoted: this node is the primary epoch=2 took_ms=1";
        let both = conflicts(&[("a", a.into()), ("b", NODE_B.into())], WITNESS);
        assert_eq!(
            both,
            vec![Conflict {
                epoch: 2,
                promoted: vec!["a".into(), "b".into()],
                granted: vec!["b".into()],
            }]
        );
        // A node promoted to an epoch the witness granted to another.
        let c =
            "x WARN stela_server::cluster: promoted: this node is the primary epoch=1 took_ms=1";
        assert_eq!(conflicts(&[("c", c.into())], WITNESS)[0].epoch, 1);
        // The witness granting one epoch to two nodes.
        let twice = format!("{WITNESS}\ny witness: granting a new epoch node=\"c\" epoch=4");
        assert_eq!(conflicts(&[], &twice)[0].granted, vec!["b", "c"]);
    }
}
