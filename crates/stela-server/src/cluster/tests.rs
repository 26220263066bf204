//! Unit tests of [`super`]: the node's role and epoch decisions against a scripted
//! coordinator.

use super::*;
use crate::config::AfterFailover;
use stela_coord::Holder;

/// A coordinator whose answers the test sets: `None` is unreachable.
struct Scripted {
    holder: Mutex<Option<Holder>>,
}

impl Coordinator for Scripted {
    fn renew(&self, _: &str, epoch: u64) -> Result<Renewal, CoordError> {
        Ok(Renewal::Renewed { epoch })
    }
    fn promote(&self, node: &str, seen: u64) -> Result<Grant, CoordError> {
        let mut holder = lock(&self.holder);
        let Some(current) = holder.as_mut() else {
            return Err(CoordError::Unreachable("scripted".into()));
        };
        let epoch = current.epoch.max(seen) + 1;
        *current = Holder {
            epoch,
            holder: Some(node.to_owned()),
        };
        Ok(Grant::Granted { epoch })
    }
    fn current(&self) -> Result<Holder, CoordError> {
        lock(&self.holder)
            .clone()
            .ok_or_else(|| CoordError::Unreachable("scripted".into()))
    }
    fn describe(&self) -> String {
        "scripted".into()
    }
}

fn node(dir: &Path, role: NodeRole) -> Node {
    let config = FailoverConfig {
        coordinator: "scripted".into(),
        cluster: "test".into(),
        initial_role: role,
        heartbeat: Duration::from_millis(50),
        suspect_after: Duration::from_millis(300),
        after_failover: AfterFailover::Unprotected,
    };
    Node::clustered("a", dir, Arc::new(stela_wal::storage::StdStorage), &config).unwrap()
}

fn scripted(holder: Option<Holder>) -> Scripted {
    Scripted {
        holder: Mutex::new(holder),
    }
}

#[test]
fn a_standby_wakes_when_its_suspicion_period_ends_not_a_heartbeat_later() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), NodeRole::Standby);
    a.decide_role(&scripted(None));
    let config = FailoverConfig {
        coordinator: "scripted".into(),
        cluster: "test".into(),
        initial_role: NodeRole::Standby,
        heartbeat: Duration::from_millis(50),
        suspect_after: Duration::from_millis(300),
        after_failover: AfterFailover::Unprotected,
    };
    // Heard 290 ms ago: the period ends in about 10 ms, long before the next heartbeat.
    *lock(&a.heard) = Instant::now() - Duration::from_millis(290);
    assert!(a.pause(&config) <= Duration::from_millis(11));
    // Heard just now: a whole heartbeat.
    a.heard_from_primary();
    assert_eq!(a.pause(&config), config.heartbeat);
    // Past the period (asking the coordinator): every heartbeat.
    *lock(&a.heard) = Instant::now() - Duration::from_millis(400);
    assert_eq!(a.pause(&config), config.heartbeat);
}

#[test]
fn an_unreachable_coordinator_at_start_makes_a_standby_whatever_the_preference() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), NodeRole::Primary);
    a.decide_role(&scripted(None));
    assert_eq!(a.role_name(), "standby");
    assert!(a.refusal().is_some() && a.resolution_refusal().is_some());
}

#[test]
fn a_node_never_resumes_an_epoch_it_followed_and_answers_resolutions_only_while_newest() {
    let dir = tempfile::tempdir().unwrap();
    // A new pair: the preferred primary asks for the first grant and gets epoch 1.
    let a = node(dir.path(), NodeRole::Primary);
    a.decide_role(&scripted(Some(Holder {
        epoch: 0,
        holder: None,
    })));
    assert_eq!((a.role_name(), a.epoch()), ("primary", 1));
    assert_eq!(a.resolution_refusal(), None);
    // The coordinator has granted a newer epoch: this primary's history is not final.
    a.answered("scripted", 2, Some("b".into()));
    assert!(a.resolution_refusal().is_some());
    drop(a);
    // Restarted, it follows b's stream in epoch 2; restarted again, a coordinator that
    // (wrongly) names it the holder of epoch 2 does not make it a second primary of 2.
    let a = node(dir.path(), NodeRole::Primary);
    a.accept_stream(2, "b").unwrap();
    assert!(a.accept_stream(2, "c").is_err(), "a second node in epoch 2");
    assert!(a.accept_stream(1, "b").is_err(), "an older epoch");
    drop(a);
    let a = node(dir.path(), NodeRole::Primary);
    a.decide_role(&scripted(Some(Holder {
        epoch: 2,
        holder: Some("a".into()),
    })));
    assert_eq!((a.role_name(), a.epoch()), ("standby", 2));
    // A grant of a newer epoch makes it primary.
    a.promote(3, Duration::ZERO);
    assert_eq!((a.role_name(), a.epoch()), ("primary", 3));
    assert!(
        a.accept_stream(3, "b").is_err(),
        "its own epoch from another node"
    );
}

#[test]
fn a_primary_that_has_seen_a_newer_epoch_holds_none_to_begin_terms_in() {
    let dir = tempfile::tempdir().unwrap();
    let a = node(dir.path(), NodeRole::Primary);
    a.decide_role(&scripted(Some(Holder {
        epoch: 0,
        holder: None,
    })));
    assert_eq!(a.primary_epoch(), Some(1));
    // Another node's epoch 2 is seen before this node has stepped down.
    a.observe_epoch(2).unwrap();
    assert_eq!(a.role_name(), "primary");
    assert_eq!(a.primary_epoch(), None, "epoch 2 is not this node's");
}
