//! The etcd backend against a real etcd (Debian's `etcd-server`, started here on free loopback
//! ports in a temporary directory): the same fencing scenario the witness passes, so the two
//! grant and fence alike; an etcd that is gone costs a caller its timeout and says
//! `Unreachable` (failover unavailable), and two coordinators racing for one grant never both
//! get it. Without the `etcd` binary the test fails saying what to install.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use stela_coord::etcd::EtcdCoordinator;
use stela_coord::{CoordError, Coordinator, Election, Grant, LogPosition, Renewal, Report};

mod common;
use common::{fences, hands_over, LEASE};

/// A real etcd, answering.
fn etcd() -> stela_testkit::Etcd {
    let etcd = stela_testkit::Etcd::start();
    let probe = EtcdCoordinator::new(&etcd.client_url, "probe", LEASE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.current().is_err() {
        assert!(Instant::now() < deadline, "etcd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    etcd
}

#[test]
fn etcd_grants_and_fences_as_the_witness_does() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "pair", LEASE).unwrap();
    fences(&coordinator, LEASE + LEASE / 2);
    // Through the URL the daemon is given.
    let by_url = stela_coord::connect(&etcd.coordinator_url(), "pair", LEASE, None).unwrap();
    assert_eq!(by_url.current().unwrap().epoch, 2);
    assert!(by_url.describe().contains("etcd"));
}

#[test]
fn etcd_hands_an_epoch_over_as_the_witness_does() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "handover", LEASE).unwrap();
    hands_over(&coordinator);
    // Another coordinator instance (the new primary's own) sees the handover at once.
    let other = EtcdCoordinator::new(&etcd.client_url, "handover", LEASE).unwrap();
    assert_eq!(other.promote("b", 1).unwrap(), Grant::Granted { epoch: 2 });
}

#[test]
fn two_standbys_racing_for_one_grant_never_both_get_it() {
    let etcd = etcd();
    let primary = EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap();
    assert_eq!(
        primary.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    let (b, c) = (
        EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap(),
        EtcdCoordinator::new(&etcd.client_url, "race", LEASE).unwrap(),
    );
    // Both start watching, then wait out the lease with the primary silent.
    let _ = (b.current(), c.current());
    std::thread::sleep(LEASE * 2);
    let (granted_b, granted_c) = std::thread::scope(|s| {
        let b = s.spawn(|| b.promote("b", 1).unwrap());
        let c = s.spawn(|| c.promote("c", 1).unwrap());
        (b.join().unwrap(), c.join().unwrap())
    });
    let granted: Vec<_> = [granted_b, granted_c]
        .into_iter()
        .filter(|g| matches!(g, Grant::Granted { .. }))
        .collect();
    assert_eq!(granted.len(), 1, "exactly one grant: {granted:?}");
    assert_eq!(granted[0], Grant::Granted { epoch: 2 });
}

#[test]
fn a_lost_etcd_is_unreachable_not_a_step_down() {
    let etcd = etcd();
    let coordinator = EtcdCoordinator::new(&etcd.client_url, "gone", LEASE).unwrap();
    assert_eq!(
        coordinator.renew("a", 1).unwrap(),
        Renewal::Renewed { epoch: 1 }
    );
    drop(etcd);
    let started = Instant::now();
    let error = coordinator.renew("a", 1).unwrap_err();
    assert!(matches!(error, CoordError::Unreachable(_)), "{error}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The election's calls too: failover unavailable, never an answer.
    let error = coordinator.ask("b", 1, 1).unwrap_err();
    assert!(matches!(error, CoordError::Unreachable(_)), "{error}");
    let error = coordinator
        .promise("b", 2, 1, &at(1, 1, false))
        .unwrap_err();
    assert!(matches!(error, CoordError::Unreachable(_)), "{error}");
}

/// A call made again while etcd is unreachable (a write it took longer than the timeout to
/// sync, on a loaded machine), as a node would at its next heartbeat: every rule answers a
/// repeat whose answer was lost as it answered the first. Up to five times.
fn patient<T>(mut call: impl FnMut() -> Result<T, CoordError>) -> T {
    for _ in 0..5 {
        match call() {
            Err(CoordError::Unreachable(_)) => continue,
            answer => return answer.unwrap(),
        }
    }
    panic!("etcd unreachable five times in a row")
}

/// Where one node's ledger ends, as it promises with it.
fn at(term: u64, lsn: u64, prefers_primary: bool) -> Report {
    Report {
        positions: vec![LogPosition {
            log: "ledger".into(),
            term,
            lsn,
        }],
        prefers_primary,
    }
}

/// Three nodes, each with its own coordinator instance on one etcd (as each `stela serve` has):
/// the primary a goes silent; b asks, c asks the same election; a stale or future epoch's
/// promise is refused; b, behind, promises first and twice (counted once) and is not
/// granted; c, which covers b, is; b then learns it lost. The grant starts c's lease: b,
/// asking at once, finds c alive rather than opening another election.
#[test]
fn an_election_on_etcd_grants_once_to_a_node_that_covers_the_others() {
    // A lease long enough that "a is alive" holds between two calls on a loaded machine.
    const ALIVE: Duration = Duration::from_secs(1);
    let etcd = etcd();
    let instance = || EtcdCoordinator::new(&etcd.client_url, "three", ALIVE).unwrap();
    let (a, b, c) = (instance(), instance(), instance());
    assert_eq!(patient(|| a.renew("a", 1)), Renewal::Renewed { epoch: 1 });
    let _ = (b.current(), c.current());
    // While a renews, no election opens.
    assert!(matches!(
        patient(|| b.ask("b", 1, 2)),
        Election::Refused { .. }
    ));
    std::thread::sleep(ALIVE + ALIVE / 2);
    assert_eq!(patient(|| b.ask("b", 1, 2)), Election::Prepare { epoch: 2 });
    assert_eq!(patient(|| c.ask("c", 1, 2)), Election::Prepare { epoch: 2 });
    assert!(matches!(
        patient(|| a.renew("a", 1)),
        Renewal::Superseded { epoch: 2, .. }
    ));
    // Epochs that are not the open one are refused, and counted nowhere.
    for stale in [1, 3] {
        assert!(matches!(
            patient(|| c.promise("c", stale, 2, &at(1, 100, false))),
            Election::Refused { .. }
        ));
    }
    let behind = at(1 << 32, 90, true);
    for _ in 0..2 {
        assert!(matches!(
            patient(|| b.promise("b", 2, 2, &behind)),
            Election::Waiting {
                heard: 1,
                needed: 2,
                ..
            }
        ));
    }
    assert_eq!(
        patient(|| c.promise("c", 2, 2, &at(1 << 32, 100, false))),
        Election::Granted { epoch: 2 }
    );
    assert!(matches!(
        patient(|| b.promise("b", 2, 2, &behind)),
        Election::Refused { holder: Some(ref h), .. } if h == "c"
    ));
    let holder = patient(|| a.current());
    assert_eq!((holder.epoch, holder.holder.as_deref()), (2, Some("c")));
    assert!(matches!(
        patient(|| b.ask("b", 2, 2)),
        Election::Refused { holder: Some(ref h), .. } if h == "c"
    ));
    assert_eq!(patient(|| c.renew("c", 2)), Renewal::Renewed { epoch: 2 });
}

/// No promising node covers the others (each ahead on a different log): nothing is granted
/// until a node that covers both promises.
#[test]
fn an_election_on_etcd_waits_for_a_node_that_covers_the_others() {
    let etcd = etcd();
    let instance = || EtcdCoordinator::new(&etcd.client_url, "cover", LEASE).unwrap();
    let (b, c, d) = (instance(), instance(), instance());
    // Nothing held: the first ask opens epoch 1.
    assert_eq!(patient(|| b.ask("b", 0, 2)), Election::Prepare { epoch: 1 });
    let two = |x: u64, y: u64| Report {
        positions: vec![
            LogPosition {
                log: "x".into(),
                term: 1,
                lsn: x,
            },
            LogPosition {
                log: "y".into(),
                term: 1,
                lsn: y,
            },
        ],
        prefers_primary: false,
    };
    assert!(matches!(
        patient(|| b.promise("b", 1, 2, &two(10, 3))),
        Election::Waiting { heard: 1, .. }
    ));
    assert!(matches!(
        patient(|| c.promise("c", 1, 2, &two(8, 4))),
        Election::Waiting { heard: 2, .. }
    ));
    assert_eq!(
        patient(|| d.promise("d", 1, 2, &two(10, 4))),
        Election::Granted { epoch: 1 }
    );
    let holder = patient(|| b.current());
    assert_eq!((holder.epoch, holder.holder.as_deref()), (1, Some("d")));
}

/// Two instances race, round after round, to open an election and then to promise it: one
/// epoch is opened per round (never two, never an older one), a promise is never lost (with
/// two needed, the two racing promises decide the election between them), and each epoch is
/// granted once, to one node, which alone hears `Granted`.
#[test]
fn two_instances_racing_open_one_election_and_grant_it_once() {
    const ROUNDS: u64 = 6;
    let etcd = etcd();
    let instance = || EtcdCoordinator::new(&etcd.client_url, "racing", LEASE).unwrap();
    let (b, c) = (instance(), instance());
    let barrier = std::sync::Barrier::new(2);
    let mut last = 0;
    for round in 0..ROUNDS {
        // The same report from both: a tie, which the name breaks.
        let report = at(last << 32, 10 * round, false);
        let needed = if round % 2 == 0 { 1 } else { 2 };
        let race = |node: &str, coordinator: &EtcdCoordinator| {
            barrier.wait();
            let opened = patient(|| coordinator.ask(node, last, needed));
            let Election::Prepare { epoch } = opened else {
                panic!("{node} asked in round {round}: {opened:?}");
            };
            barrier.wait();
            (
                epoch,
                patient(|| coordinator.promise(node, epoch, needed, &report)),
            )
        };
        let (by_b, by_c) = std::thread::scope(|s| {
            let by_b = s.spawn(|| race("b", &b));
            let by_c = s.spawn(|| race("c", &c));
            (by_b.join().unwrap(), by_c.join().unwrap())
        });
        assert_eq!(by_b.0, by_c.0, "two epochs opened in one round");
        let epoch = by_b.0;
        assert_eq!(epoch, last + 1, "round {round}");
        let holder = patient(|| b.current());
        assert_eq!(holder.epoch, epoch);
        let winner = holder
            .holder
            .expect("the racing promises decided the election");
        for (node, (_, answer)) in [("b", &by_b), ("c", &by_c)] {
            if node == winner {
                assert!(
                    matches!(answer, Election::Granted { .. } | Election::Waiting { .. }),
                    "{node}: {answer:?}"
                );
            } else {
                assert!(
                    !matches!(answer, Election::Granted { .. }),
                    "epoch {epoch} granted to {node} and {winner}"
                );
            }
        }
        // The winner is silent from here: the next round's election opens a lease later.
        last = epoch;
        std::thread::sleep(LEASE + LEASE / 3);
        let _ = (b.current(), c.current());
        std::thread::sleep(LEASE + LEASE / 3);
    }
}

/// One step of the model test: node `n` (each its own instance) renews, promotes, asks,
/// promises (epoch, last term, last LSN; generated as 0, 1 or 2 for the model's epoch − 1, the
/// epoch, + 1, see [`Step::at_epoch`]) or hands over.
#[derive(Debug, Clone)]
enum Step {
    Renew(usize, u64),
    Promote(usize, u64),
    Ask(usize, u64),
    Promise(usize, u64, u64, u64),
    HandOver(usize, u64, usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        1 => (0usize..3, 0u64..5).prop_map(|(n, e)| Step::Renew(n, e)),
        1 => (0usize..3, 0u64..5).prop_map(|(n, s)| Step::Promote(n, s)),
        2 => (0usize..3, 0u64..5).prop_map(|(n, s)| Step::Ask(n, s)),
        5 => (0usize..3, 0u64..3, 0u64..2, 0u64..3).prop_map(|(n, d, t, l)| Step::Promise(n, d, t, l)),
        1 => (0usize..3, 0u64..5, 0usize..3).prop_map(|(f, e, t)| Step::HandOver(f, e, t)),
    ]
}

impl Step {
    /// The step with a promise's epoch made concrete around `epoch` (the model's): most
    /// promises then name the open election's epoch, and some a stale or a future one.
    fn at_epoch(&self, epoch: u64) -> Step {
        match *self {
            Step::Promise(n, d, t, l) => Step::Promise(n, (epoch + d).saturating_sub(1), t, l),
            ref other => other.clone(),
        }
    }
}

/// The model: the claim and the ballot, changed by the pure rules only.
#[derive(Default)]
struct Model {
    claim: stela_coord::rules::Claim,
    ballot: stela_coord::rules::Ballot,
}

impl Model {
    /// The rules' answer to `step` (a lease of zero: every holder counts as silent, so that
    /// real time plays no part), the model changed as the rules say.
    fn apply(&mut self, step: &Step) -> String {
        use stela_coord::rules;
        let name = |n: usize| NODES[n];
        let (answer, new) = match step {
            Step::Renew(n, e) => match rules::renew(&self.claim, name(*n), *e) {
                Ok((answer, new)) => (format!("{answer:?}"), new),
                Err(_) => ("error".to_owned(), None),
            },
            Step::Promote(n, s) => {
                let (answer, new) =
                    rules::promote(&self.claim, name(*n), *s, Duration::ZERO, Duration::ZERO);
                (format!("{answer:?}"), new)
            }
            Step::Ask(n, s) => {
                let (answer, new) =
                    rules::ask(&self.claim, name(*n), *s, Duration::ZERO, Duration::ZERO);
                (format!("{answer:?}"), new)
            }
            Step::Promise(n, e, t, l) => {
                let report = at(*t, *l, *n == 2);
                let (answer, new) =
                    rules::promise(&self.claim, &mut self.ballot, name(*n), *e, 2, &report);
                (format!("{answer:?}"), new)
            }
            Step::HandOver(f, e, t) => {
                let (answer, new) = rules::hand_over(&self.claim, name(*f), *e, name(*t));
                (format!("{answer:?}"), new)
            }
        };
        if let Some(new) = new {
            self.claim = new;
        }
        answer
    }
}

const NODES: [&str; 3] = ["a", "b", "c"];

/// `step` through etcd, by node `n`'s own instance. A call that found etcd unreachable (a
/// write etcd took longer than the timeout to sync, on a loaded machine) is made again, as a
/// node would at its next heartbeat: each rule answers a repeat whose answer was lost as it
/// answered the first, so the answer compared is the same.
fn through_etcd(instances: &[EtcdCoordinator], step: &Step) -> String {
    let name = |n: usize| NODES[n];
    let answer = || -> Result<String, CoordError> {
        Ok(match step {
            Step::Renew(n, e) => match instances[*n].renew(name(*n), *e) {
                Err(CoordError::Other(_)) => "error".to_owned(),
                answer => format!("{:?}", answer?),
            },
            Step::Promote(n, s) => format!("{:?}", instances[*n].promote(name(*n), *s)?),
            Step::Ask(n, s) => format!("{:?}", instances[*n].ask(name(*n), *s, 2)?),
            Step::Promise(n, e, t, l) => {
                let report = at(*t, *l, *n == 2);
                format!("{:?}", instances[*n].promise(name(*n), *e, 2, &report)?)
            }
            Step::HandOver(f, e, t) => {
                format!("{:?}", instances[*f].hand_over(name(*f), *e, name(*t))?)
            }
        })
    };
    for _ in 0..5 {
        match answer() {
            Err(CoordError::Unreachable(_)) => continue,
            other => return other.unwrap_or_else(|error| panic!("{step:?}: {error}")),
        }
    }
    panic!("{step:?}: etcd unreachable five times in a row")
}

/// The rules through etcd: any sequence of renewals, promotions, asks, promises and handovers
/// by three nodes, each through its own instance, is answered exactly as the pure rules answer
/// it, and etcd then holds the claim the rules hold: the claim, the open election and its
/// ballot survive between calls and instances as the witness keeps them in memory. (A lease
/// of zero takes real time out of it; the races are the tests above.)
#[test]
fn etcd_answers_as_the_rules_do() {
    use proptest::test_runner::{Config, TestRunner};
    let etcd = etcd();
    let mut runner = TestRunner::new(Config {
        cases: 32,
        ..Config::default()
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let steps = proptest::collection::vec(step(), 1..40);
    runner
        .run(&steps, |steps| {
            // Each case its own cluster, so that no state carries over.
            let cluster = format!("model{}", case.fetch_add(1, Ordering::Relaxed));
            let instances: Vec<_> = (0..3)
                .map(|_| EtcdCoordinator::new(&etcd.client_url, &cluster, Duration::ZERO).unwrap())
                .collect();
            let mut model = Model::default();
            for step in &steps {
                let step = &step.at_epoch(model.claim.epoch);
                let expected = model.apply(step);
                let answered = through_etcd(&instances, step);
                proptest::prop_assert_eq!(&answered, &expected, "{:?}", step);
                let held = patient(|| instances[0].current());
                proptest::prop_assert_eq!(
                    (held.epoch, held.holder),
                    (model.claim.epoch, model.claim.holder.clone())
                );
            }
            Ok(())
        })
        .unwrap();
}

/// An ask a little short of a lease of silence (as this instance saw `renew`) waits out the
/// rest and opens the election, never before `renew` has stood still a whole lease of this
/// process's time; one well short of it is refused (had it waited, it would have opened).
/// (A lease of 1 s: the margins stay wide on a loaded machine, and the whole test well inside
/// the 5 s etcd lease on `renew`, whose expiry would count as a change.)
#[test]
fn an_ask_just_short_of_the_lease_waits_it_out_never_less() {
    const LONG: Duration = Duration::from_secs(1);
    let etcd = etcd();
    let instance = || EtcdCoordinator::new(&etcd.client_url, "short", LONG).unwrap();
    let (a, b) = (instance(), instance());
    assert_eq!(patient(|| a.renew("a", 1)), Renewal::Renewed { epoch: 1 });
    let _ = patient(|| b.current());
    std::thread::sleep(LONG / 4);
    assert!(matches!(
        patient(|| b.ask("b", 1, 2)),
        Election::Refused { .. }
    ));
    // The primary renews once more; b sees it, then asks just short of a lease later.
    assert_eq!(patient(|| a.renew("a", 1)), Renewal::Renewed { epoch: 1 });
    let seen = Instant::now();
    let _ = patient(|| b.current());
    std::thread::sleep(LONG * 4 / 5);
    assert_eq!(patient(|| b.ask("b", 1, 2)), Election::Prepare { epoch: 2 });
    assert!(seen.elapsed() >= LONG, "opened after {:?}", seen.elapsed());
}
