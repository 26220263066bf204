//! The node's rules, one machine alone: scenarios, then properties over any inputs.

use super::*;
use crate::log::{Position, Resolution};
use proptest::prelude::*;

fn config(id: NodeId, prefers_primary: bool) -> NodeConfig {
    NodeConfig {
        id,
        peers: (0..3).filter(|&p| p != id).collect(),
        k: 1,
        prefers_primary,
        heartbeat: 20,
        deadline: 100,
        start_wait: 50,
        chunk: 8,
        bugs: Bugs::default(),
    }
}

fn rec(term: u64, lsn: Lsn, payload: u64) -> Record {
    Record {
        term: Term(term),
        lsn,
        payload,
    }
}

fn fresh(id: NodeId, prefers: bool) -> Node {
    Node::start(config(id, prefers), Log::default(), 0, Term(0), 0).0
}

/// Drives `node` through an election it wins for `epoch`; returns the stream ids it opened.
fn elect(node: &mut Node, now: Time, epoch: u64) -> BTreeMap<NodeId, u64> {
    node.step(
        now,
        Input::Coordinator(FromCoordinator::Prepare { epoch: Term(epoch) }),
    );
    let out = node.step(
        now,
        Input::Coordinator(FromCoordinator::Granted { epoch: Term(epoch) }),
    );
    opened(&out)
}

fn opened(out: &[Action]) -> BTreeMap<NodeId, u64> {
    out.iter()
        .filter_map(|a| match a {
            Action::Peer {
                to,
                msg: Peer::Open { stream, .. },
            } => Some((*to, *stream)),
            _ => None,
        })
        .collect()
}

fn replies(out: &[Action]) -> Vec<Reply> {
    out.iter()
        .filter_map(|a| match a {
            Action::Client { reply, .. } => Some(reply.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_configured_primary_starts_as_a_standby_and_waits_for_a_grant() {
    let mut node = fresh(0, true);
    for now in (0..1000).step_by(10) {
        node.step(now, Input::Tick);
    }
    assert_eq!(node.primary_term(), None);
    let out = node.step(
        1000,
        Input::Client {
            from: 1,
            request: Request::Commit {
                payload: 5,
                deadline: 2000,
            },
        },
    );
    assert_eq!(replies(&out), vec![Reply::NotPrimary { payload: 5 }]);
    // A grant for an epoch it did not promise is not taken either.
    node.step(
        1000,
        Input::Coordinator(FromCoordinator::Granted { epoch: Term(1) }),
    );
    assert_eq!(node.primary_term(), None);
}

#[test]
fn with_the_planted_fallback_it_takes_its_configured_role() {
    let mut cfg = config(0, true);
    cfg.bugs.configured_role_fallback = true;
    let (mut node, _) = Node::start(cfg, Log::default(), 0, Term(0), 0);
    for now in (0..200).step_by(10) {
        node.step(now, Input::Tick);
    }
    assert_eq!(node.primary_term(), Some(Term(1)));
}

#[test]
fn replicated_is_ok_only_once_a_standby_holds_it_and_unprotected_at_the_deadline() {
    let mut node = fresh(0, true);
    let streams = elect(&mut node, 0, 1);
    // Standby 1 answers the stream; standby 2 never does.
    node.step(
        1,
        Input::Peer {
            from: 1,
            msg: Peer::Hello {
                term: Term(1),
                stream: streams[&1],
                history: vec![],
                last: 0,
            },
        },
    );
    let out = node.step(
        2,
        Input::Client {
            from: 9,
            request: Request::Commit {
                payload: 7,
                deadline: 60,
            },
        },
    );
    assert_eq!(
        replies(&out),
        vec![Reply::Appended {
            payload: 7,
            term: Term(1),
            lsn: 2
        }]
    );
    let out = node.step(
        3,
        Input::Peer {
            from: 1,
            msg: Peer::Ack {
                term: Term(1),
                stream: streams[&1],
                durable: 1,
            },
        },
    );
    assert!(replies(&out).is_empty(), "the standby holds LSN 1 only");
    let out = node.step(
        4,
        Input::Peer {
            from: 1,
            msg: Peer::Ack {
                term: Term(1),
                stream: streams[&1],
                durable: 2,
            },
        },
    );
    assert!(
        replies(&out).is_empty(),
        "the primary has not synced it yet"
    );
    let out = node.step(
        4,
        Input::Synced {
            upto: 2,
            generation: 0,
        },
    );
    assert_eq!(
        replies(&out),
        vec![Reply::Ok {
            payload: 7,
            term: Term(1),
            lsn: 2
        }]
    );

    let out = node.step(
        5,
        Input::Client {
            from: 9,
            request: Request::Commit {
                payload: 8,
                deadline: 60,
            },
        },
    );
    assert_eq!(replies(&out).len(), 1);
    let out = node.step(60, Input::Tick);
    assert_eq!(
        replies(&out),
        vec![Reply::Unprotected {
            payload: 8,
            term: Term(1),
            lsn: 3
        }]
    );
}

#[test]
fn a_newer_term_fences_the_primary_and_its_waiters_are_in_doubt() {
    let mut node = fresh(0, true);
    elect(&mut node, 0, 1);
    node.step(
        1,
        Input::Client {
            from: 9,
            request: Request::Commit {
                payload: 7,
                deadline: 600,
            },
        },
    );
    let out = node.step(
        2,
        Input::Peer {
            from: 1,
            msg: Peer::Refuse { seen: Term(2) },
        },
    );
    assert_eq!(
        replies(&out),
        vec![Reply::InDoubt {
            payload: 7,
            term: Term(1),
            lsn: 2
        }]
    );
    assert!(out.contains(&Action::PersistTerm { term: Term(2) }));
    assert_eq!(node.primary_term(), None);
    // And it refuses a stream of its old term.
    let out = node.step(
        3,
        Input::Peer {
            from: 2,
            msg: Peer::Open {
                term: Term(1),
                stream: 1,
            },
        },
    );
    assert_eq!(
        out,
        vec![Action::Peer {
            to: 2,
            msg: Peer::Refuse { seen: Term(2) }
        }]
    );
}

#[test]
fn a_standby_cuts_only_what_diverged_into_salvage() {
    // The standby was primary of term 1 and wrote 1..=4; term 2's primary kept 1..=2.
    let standby_log = Log::from_records(vec![
        rec(1, 1, 0),
        rec(1, 2, 10),
        rec(1, 3, 11),
        rec(1, 4, 12),
    ]);
    let (mut standby, _) = Node::start(config(1, false), standby_log, 4, Term(1), 0);
    let out = standby.step(
        1,
        Input::Peer {
            from: 0,
            msg: Peer::Open {
                term: Term(2),
                stream: 9,
            },
        },
    );
    let Some(Action::Peer {
        msg: Peer::Hello { history, last, .. },
        ..
    }) = out.iter().find(|a| matches!(a, Action::Peer { .. }))
    else {
        panic!("no hello: {out:?}")
    };
    let primary_log = Log::from_records(vec![rec(1, 1, 0), rec(1, 2, 10), rec(2, 3, 0)]);
    let agreed = divergence(
        (&primary_log.history(), primary_log.last_lsn()),
        (history, *last),
    );
    assert_eq!(agreed, 2);
    let out = standby.step(
        2,
        Input::Peer {
            from: 0,
            msg: Peer::Ship {
                term: Term(2),
                stream: 9,
                after: agreed,
                cut: true,
                records: primary_log.slice_after(agreed, 8),
            },
        },
    );
    assert!(out.contains(&Action::Cut {
        keep: 2,
        salvage: vec![rec(1, 3, 11), rec(1, 4, 12)]
    }));
    assert_eq!(standby.log(), &primary_log);
    // A duplicate of the first shipment cuts nothing more.
    let out = standby.step(
        3,
        Input::Peer {
            from: 0,
            msg: Peer::Ship {
                term: Term(2),
                stream: 9,
                after: agreed,
                cut: true,
                records: vec![],
            },
        },
    );
    assert!(!out.iter().any(|a| matches!(a, Action::Cut { .. })));
}

/// Found by the simulator (seed 4683, before this rule): the network delivered a stream's
/// `Open` twice and its first shipment twice, the copies late. The second `Open` reset the
/// stream as if new, and the late first shipment then cut records the standby had already
/// taken and acknowledged on that stream: the primary counted them held while they were gone.
#[test]
fn a_duplicate_open_or_first_shipment_never_cuts_again() {
    let mut standby = fresh(1, false);
    let open = Input::Peer {
        from: 0,
        msg: Peer::Open {
            term: Term(1),
            stream: 4,
        },
    };
    standby.step(1, open.clone());
    let first = Peer::Ship {
        term: Term(1),
        stream: 4,
        after: 0,
        cut: true,
        records: vec![rec(1, 1, 0), rec(1, 2, 7)],
    };
    standby.step(
        2,
        Input::Peer {
            from: 0,
            msg: first.clone(),
        },
    );
    let more = Peer::Ship {
        term: Term(1),
        stream: 4,
        after: 2,
        cut: false,
        records: vec![rec(1, 3, 8)],
    };
    standby.step(3, Input::Peer { from: 0, msg: more });
    assert_eq!(standby.log().last_lsn(), 3);
    assert!(
        standby.step(4, open).is_empty(),
        "a duplicate open is ignored"
    );
    let out = standby.step(
        5,
        Input::Peer {
            from: 0,
            msg: first,
        },
    );
    assert!(
        !out.iter().any(|a| matches!(a, Action::Cut { .. })),
        "{out:?}"
    );
    assert_eq!(standby.log().last_lsn(), 3);
}

#[test]
fn only_a_protected_current_primary_resolves() {
    let mut node = fresh(0, true);
    let out = node.step(
        0,
        Input::Client {
            from: 9,
            request: Request::Resolve {
                term: Term(1),
                lsn: 1,
            },
        },
    );
    assert_eq!(
        replies(&out),
        vec![Reply::CannotResolve {
            term: Term(1),
            lsn: 1
        }]
    );
    let streams = elect(&mut node, 0, 1);
    let ask = |node: &mut Node| {
        replies(&node.step(
            5,
            Input::Client {
                from: 9,
                request: Request::Resolve {
                    term: Term(1),
                    lsn: 1,
                },
            },
        ))
    };
    assert_eq!(
        ask(&mut node),
        vec![Reply::CannotResolve {
            term: Term(1),
            lsn: 1
        }],
        "not protected yet"
    );
    node.step(
        1,
        Input::Peer {
            from: 1,
            msg: Peer::Hello {
                term: Term(1),
                stream: streams[&1],
                history: vec![],
                last: 0,
            },
        },
    );
    node.step(
        2,
        Input::Peer {
            from: 1,
            msg: Peer::Ack {
                term: Term(1),
                stream: streams[&1],
                durable: 1,
            },
        },
    );
    node.step(
        3,
        Input::Synced {
            upto: 1,
            generation: 0,
        },
    );
    assert_eq!(
        ask(&mut node),
        vec![Reply::Resolved {
            term: Term(1),
            lsn: 1,
            resolution: Resolution::Kept
        }]
    );
}

#[test]
fn a_torn_tail_is_cut_and_damage_below_the_synced_mark_is_corruption() {
    let records = vec![
        (rec(1, 1, 0), true),
        (rec(1, 2, 5), true),
        (rec(1, 3, 6), false),
    ];
    let (log, synced) = recover(&DiskImage {
        records: records.clone(),
        synced: 2,
        promised: Term(1),
    })
    .unwrap();
    assert_eq!((log.last_lsn(), synced), (2, 2));
    assert_eq!(
        recover(&DiskImage {
            records,
            synced: 3,
            promised: Term(1)
        })
        .unwrap_err(),
        Corruption { lsn: 3, synced: 3 }
    );
}

/// One input of the property test below; peers' stream ids are taken from the node's opens.
#[derive(Clone, Debug)]
enum Poke {
    Tick(u64),
    Prepare(u64),
    Granted(u64),
    Current(u64),
    Open(u8, u64),
    Hello(u8),
    Ack(u8, u64),
    Refuse(u64),
    Commit,
    SyncAll,
}

fn pokes() -> impl Strategy<Value = Vec<Poke>> {
    proptest::collection::vec(
        prop_oneof![
            (1u64..60).prop_map(Poke::Tick),
            (1u64..5).prop_map(Poke::Prepare),
            (1u64..5).prop_map(Poke::Granted),
            (1u64..5).prop_map(Poke::Current),
            (1u8..3, 1u64..5).prop_map(|(p, t)| Poke::Open(p, t)),
            (1u8..3).prop_map(Poke::Hello),
            (1u8..3, 0u64..8).prop_map(|(p, d)| Poke::Ack(p, d)),
            (1u64..5).prop_map(Poke::Refuse),
            Just(Poke::Commit),
            Just(Poke::Commit),
            Just(Poke::SyncAll),
        ],
        1..80,
    )
}

proptest! {
    /// Whatever arrives, in any order: the node becomes primary only of an epoch it promised
    /// and was granted; it acknowledges `Ok` only in its own current term, for an LSN a standby
    /// acknowledged in the current stream; never in a term older than one it has seen.
    #[test]
    fn grants_fencing_and_protection_hold_under_any_inputs(pokes in pokes()) {
        let mut node = fresh(0, true);
        let mut now = 0;
        let mut streams: BTreeMap<NodeId, u64> = BTreeMap::new();
        let mut acked: BTreeMap<NodeId, Lsn> = BTreeMap::new();
        let mut promised_epochs = Vec::new();
        for poke in pokes {
            let was_primary = node.primary_term();
            let seen_before = node.promised();
            let input = match poke.clone() {
                Poke::Tick(dt) => { now += dt; Input::Tick }
                Poke::Prepare(e) => Input::Coordinator(FromCoordinator::Prepare { epoch: Term(e) }),
                Poke::Granted(e) => Input::Coordinator(FromCoordinator::Granted { epoch: Term(e) }),
                Poke::Current(e) => Input::Coordinator(FromCoordinator::Current { epoch: Term(e), holder: None }),
                Poke::Open(p, t) => Input::Peer { from: p, msg: Peer::Open { term: Term(t), stream: 1 } },
                Poke::Hello(p) => {
                    let (term, stream) = (node.promised(), streams.get(&p).copied().unwrap_or(0));
                    Input::Peer { from: p, msg: Peer::Hello { term, stream, history: vec![], last: 0 } }
                }
                Poke::Ack(p, d) => {
                    let (term, stream) = (node.promised(), streams.get(&p).copied().unwrap_or(0));
                    Input::Peer { from: p, msg: Peer::Ack { term, stream, durable: d } }
                }
                Poke::Refuse(t) => Input::Peer { from: 1, msg: Peer::Refuse { seen: Term(t) } },
                Poke::Commit => Input::Client { from: 9, request: Request::Commit { payload: now + 1, deadline: now + 100 } },
                Poke::SyncAll => Input::Synced { upto: node.log().last_lsn(), generation: node.generation },
            };
            if let Poke::Ack(p, d) = poke {
                if node.primary_term().is_some() && streams.contains_key(&p) {
                    let held = acked.entry(p).or_default();
                    *held = (*held).max(d.min(node.log().last_lsn()));
                }
            }
            let out = node.step(now, input);
            for action in &out {
                match action {
                    Action::Peer { to, msg: Peer::Open { stream, .. } } => {
                        streams.insert(*to, *stream);
                        acked.remove(to);
                    }
                    Action::Coordinator(ToCoordinator::Promise { epoch, position, .. }) => {
                        let ceiling = Position { last_term: *epoch, last_lsn: Lsn::MAX };
                        prop_assert!(*position <= ceiling);
                        promised_epochs.push(*epoch);
                    }
                    Action::Client { reply: Reply::Ok { term, lsn, .. }, .. } => {
                        prop_assert_eq!(Some(*term), node.primary_term());
                        prop_assert!(*term >= seen_before);
                        prop_assert!(acked.values().any(|d| d >= lsn), "Ok at {} with acks {:?}", lsn, acked);
                    }
                    Action::Client { reply: Reply::Appended { term, .. }, .. } => prop_assert!(*term >= seen_before),
                    _ => {}
                }
            }
            if let (None, Some(term)) = (was_primary, node.primary_term()) {
                prop_assert!(matches!(poke, Poke::Granted(e) if Term(e) == term));
                prop_assert!(promised_epochs.contains(&term));
            }
        }
    }
}
