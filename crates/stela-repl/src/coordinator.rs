//! The coordinator (the witness's rules): who is the primary of which epoch.
//!
//! It keeps the newest epoch it started and that epoch's holder, durably, and hears the
//! primary renew. When the holder has been silent for a lease (or nobody holds), it starts an
//! election for the next epoch: it asks every node to promise (`Prepare`), and grants the
//! epoch once `reports_needed` nodes have promised, to the one whose log reaches furthest
//! (`Position`: the term of its last record, then its length; the configured role breaks a
//! tie, and only a tie).
//!
//! Why that node holds every acknowledged record: a primary acknowledges a record once K
//! standbys hold it synced, so it is on K + 1 nodes; `reports_needed` is N − K, so the
//! promising nodes include one of them, and a promising node takes no older record after its
//! promise. Of the promising nodes, the one whose last record has the newest term, longest,
//! holds what each of the others holds that the cluster could have acknowledged (log
//! matching; the argument is Raft's election restriction).
//!
//! Invariants (asserted, and property-tested below):
//! - the epoch never goes down; the holder changes only with a new epoch: one holder per
//!   epoch;
//! - an epoch is granted only to a node that promised it, and to none whose position is below
//!   another promise's.

use crate::log::{Position, Term};
use crate::msg::{FromCoordinator, NodeId, Time, ToCoordinator};
use std::collections::BTreeMap;

/// The cluster as the coordinator sees it.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    pub nodes: Vec<NodeId>,
    /// Promises needed to grant an epoch: N − K.
    pub reports_needed: usize,
    /// How long the holder may be silent before an election.
    pub lease: Time,
    /// How often an unanswered `Prepare` or `Granted` is sent again.
    pub retry: Time,
}

/// What the coordinator keeps durably (a restarted coordinator starts from it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    pub epoch: Term,
    pub holder: Option<NodeId>,
}

/// An input: a timer tick or a node's message.
#[derive(Clone, Debug)]
pub enum Input {
    Tick {
        now: Time,
    },
    From {
        now: Time,
        node: NodeId,
        msg: ToCoordinator,
    },
}

/// An output: a message to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Send {
    pub to: NodeId,
    pub msg: FromCoordinator,
}

#[derive(Clone, Debug)]
struct Election {
    sent: Time,
    promises: BTreeMap<NodeId, (Position, bool)>,
}

/// The coordinator's state machine.
#[derive(Clone, Debug)]
pub struct Coordinator {
    config: CoordinatorConfig,
    durable: Durable,
    last_renewal: Time,
    /// Whether the holder renewed since its grant (until then `Granted` is sent again).
    confirmed: bool,
    last_grant_sent: Time,
    election: Option<Election>,
}

impl Coordinator {
    /// A coordinator (re)started at `now` from what it kept. It waits a whole lease before it
    /// counts the holder silent: it cannot know whether the holder renewed just before.
    pub fn start(config: CoordinatorConfig, durable: Durable, now: Time) -> Coordinator {
        assert!(config.reports_needed >= 1 && config.reports_needed <= config.nodes.len());
        Coordinator {
            config,
            durable,
            last_renewal: now,
            confirmed: true,
            last_grant_sent: now,
            election: None,
        }
    }

    pub fn durable(&self) -> Durable {
        self.durable
    }

    pub fn step(&mut self, input: Input) -> Vec<Send> {
        let before = self.durable;
        let out = match input {
            Input::Tick { now } => self.tick(now),
            Input::From { now, node, msg } => self.message(now, node, msg),
        };
        debug_assert!(
            self.durable.epoch >= before.epoch,
            "the epoch never goes down"
        );
        debug_assert!(
            self.durable.holder == before.holder
                || self.durable.epoch > before.epoch
                || before.holder.is_none(),
            "a holder changes only with a new epoch"
        );
        out
    }

    fn tick(&mut self, now: Time) -> Vec<Send> {
        if let Some(election) = &mut self.election {
            if now.saturating_sub(election.sent) < self.config.retry {
                return Vec::new();
            }
            election.sent = now;
            let epoch = self.durable.epoch;
            let waiting: Vec<NodeId> = self
                .config
                .nodes
                .iter()
                .copied()
                .filter(|n| !election.promises.contains_key(n))
                .collect();
            return waiting
                .into_iter()
                .map(|to| Send {
                    to,
                    msg: FromCoordinator::Prepare { epoch },
                })
                .collect();
        }
        if let Some(holder) = self.durable.holder {
            if now.saturating_sub(self.last_renewal) < self.config.lease {
                return self.grant_again(now, holder);
            }
        }
        self.begin_election(now)
    }

    fn grant_again(&mut self, now: Time, holder: NodeId) -> Vec<Send> {
        if self.confirmed || now.saturating_sub(self.last_grant_sent) < self.config.retry {
            return Vec::new();
        }
        self.last_grant_sent = now;
        vec![Send {
            to: holder,
            msg: FromCoordinator::Granted {
                epoch: self.durable.epoch,
            },
        }]
    }

    fn begin_election(&mut self, now: Time) -> Vec<Send> {
        self.durable = Durable {
            epoch: Term(self.durable.epoch.0 + 1),
            holder: None,
        };
        self.election = Some(Election {
            sent: now,
            promises: BTreeMap::new(),
        });
        let epoch = self.durable.epoch;
        self.config
            .nodes
            .iter()
            .map(|&to| Send {
                to,
                msg: FromCoordinator::Prepare { epoch },
            })
            .collect()
    }

    fn message(&mut self, now: Time, node: NodeId, msg: ToCoordinator) -> Vec<Send> {
        let current = Send {
            to: node,
            msg: FromCoordinator::Current {
                epoch: self.durable.epoch,
                holder: self.durable.holder,
            },
        };
        match msg {
            ToCoordinator::Hello => vec![current],
            ToCoordinator::Renew { term } => {
                if self.election.is_none()
                    && self.durable.holder == Some(node)
                    && term == self.durable.epoch
                {
                    self.last_renewal = now;
                    self.confirmed = true;
                    return vec![Send {
                        to: node,
                        msg: FromCoordinator::Renewed { term },
                    }];
                }
                vec![current]
            }
            ToCoordinator::Promise {
                epoch,
                position,
                prefers_primary,
            } => self.promise(now, node, epoch, (position, prefers_primary)),
        }
    }

    fn promise(
        &mut self,
        now: Time,
        node: NodeId,
        epoch: Term,
        report: (Position, bool),
    ) -> Vec<Send> {
        let Some(election) = &mut self.election else {
            return Vec::new();
        };
        if epoch != self.durable.epoch || !self.config.nodes.contains(&node) {
            return Vec::new();
        }
        election.promises.insert(node, report);
        if election.promises.len() < self.config.reports_needed {
            return Vec::new();
        }
        let winner = election
            .promises
            .iter()
            .max_by_key(|&(&id, &(position, prefers))| (position, prefers, std::cmp::Reverse(id)))
            .map(|(&id, _)| id)
            .expect("enough promises");
        debug_assert!(election
            .promises
            .values()
            .all(|(p, _)| *p <= election.promises[&winner].0));
        self.election = None;
        self.durable.holder = Some(winner);
        self.last_renewal = now;
        self.confirmed = false;
        self.last_grant_sent = now;
        vec![Send {
            to: winner,
            msg: FromCoordinator::Granted { epoch },
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn config() -> CoordinatorConfig {
        CoordinatorConfig {
            nodes: vec![0, 1, 2],
            reports_needed: 2,
            lease: 300,
            retry: 50,
        }
    }

    fn position(term: u64, lsn: u64) -> Position {
        Position {
            last_term: Term(term),
            last_lsn: lsn,
        }
    }

    #[test]
    fn the_furthest_log_wins_and_the_preference_only_breaks_ties() {
        let mut coord = Coordinator::start(config(), Durable::default(), 0);
        let prepare = coord.step(Input::Tick { now: 300 });
        assert_eq!(prepare.len(), 3);
        let promise = |node, pos, pref| Input::From {
            now: 310,
            node,
            msg: ToCoordinator::Promise {
                epoch: Term(1),
                position: pos,
                prefers_primary: pref,
            },
        };
        assert!(coord.step(promise(0, position(0, 0), true)).is_empty());
        let granted = coord.step(promise(1, position(0, 0), false));
        assert_eq!(
            granted,
            vec![Send {
                to: 0,
                msg: FromCoordinator::Granted { epoch: Term(1) }
            }]
        );

        // Node 0 goes silent: epoch 2 goes to the node whose log reaches further, preferred or not.
        coord.step(Input::Tick { now: 700 });
        let mut coord2 = coord.clone();
        coord.step(Input::From {
            now: 710,
            node: 0,
            msg: ToCoordinator::Promise {
                epoch: Term(2),
                position: position(1, 5),
                prefers_primary: true,
            },
        });
        let granted = coord.step(Input::From {
            now: 711,
            node: 2,
            msg: ToCoordinator::Promise {
                epoch: Term(2),
                position: position(1, 6),
                prefers_primary: false,
            },
        });
        assert_eq!(granted[0].to, 2);
        // A promise for an epoch not being elected changes nothing.
        assert!(coord2
            .step(Input::From {
                now: 711,
                node: 2,
                msg: ToCoordinator::Promise {
                    epoch: Term(1),
                    position: position(1, 6),
                    prefers_primary: false
                }
            })
            .is_empty());
    }

    #[test]
    fn a_renewing_holder_keeps_its_epoch() {
        let mut coord = Coordinator::start(
            config(),
            Durable {
                epoch: Term(3),
                holder: Some(1),
            },
            0,
        );
        for now in (0..2000).step_by(100) {
            let out = coord.step(Input::From {
                now,
                node: 1,
                msg: ToCoordinator::Renew { term: Term(3) },
            });
            assert_eq!(
                out,
                vec![Send {
                    to: 1,
                    msg: FromCoordinator::Renewed { term: Term(3) }
                }]
            );
            assert!(coord.step(Input::Tick { now }).is_empty());
        }
        // Another node renewing the epoch is told who holds it.
        let out = coord.step(Input::From {
            now: 2000,
            node: 0,
            msg: ToCoordinator::Renew { term: Term(3) },
        });
        assert_eq!(
            out[0].msg,
            FromCoordinator::Current {
                epoch: Term(3),
                holder: Some(1)
            }
        );
    }

    #[derive(Debug, Clone)]
    enum Step {
        Tick(u64),
        Renew(u8, u64),
        Promise(u8, u64, u64, u64, bool),
        Restart,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        proptest::collection::vec(
            prop_oneof![
                (0u64..400).prop_map(Step::Tick),
                (0u8..3, 0u64..5).prop_map(|(n, t)| Step::Renew(n, t)),
                (0u8..3, 0u64..5, 0u64..4, 0u64..6, any::<bool>())
                    .prop_map(|(n, e, t, l, p)| Step::Promise(n, e, t, l, p)),
                Just(Step::Restart),
            ],
            1..60,
        )
    }

    proptest! {
        /// Over any inputs (restarts included): one holder per epoch, the epoch never goes
        /// down, and a grant goes to a promising node no other promise of that epoch reaches
        /// beyond.
        #[test]
        fn one_holder_per_epoch_and_the_furthest_wins(steps in steps()) {
            let mut now = 0;
            let mut coord = Coordinator::start(config(), Durable::default(), now);
            let mut holders: HashMap<Term, NodeId> = HashMap::new();
            let mut promised: HashMap<Term, HashMap<NodeId, Position>> = HashMap::new();
            for step in steps {
                let before = coord.durable();
                let out = match step {
                    Step::Tick(dt) => { now += dt; coord.step(Input::Tick { now }) }
                    Step::Renew(n, t) => coord.step(Input::From { now, node: n, msg: ToCoordinator::Renew { term: Term(t) } }),
                    Step::Promise(n, e, t, l, p) => {
                        let position = position(t, l);
                        if coord.election.is_some() && Term(e) == coord.durable.epoch {
                            promised.entry(Term(e)).or_default().insert(n, position);
                        }
                        coord.step(Input::From { now, node: n, msg: ToCoordinator::Promise { epoch: Term(e), position, prefers_primary: p } })
                    }
                    Step::Restart => { coord = Coordinator::start(config(), coord.durable(), now); Vec::new() }
                };
                prop_assert!(coord.durable().epoch >= before.epoch);
                for send in out {
                    if let FromCoordinator::Granted { epoch } = send.msg {
                        let previous = *holders.entry(epoch).or_insert(send.to);
                        prop_assert_eq!(previous, send.to, "two holders of {:?}", epoch);
                        let promises = &promised[&epoch];
                        prop_assert!(promises.len() >= 2);
                        let mine = promises[&send.to];
                        prop_assert!(promises.values().all(|p| *p <= mine));
                    }
                }
            }
        }
    }
}
