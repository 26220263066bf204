//! A loom model of commit protection (`stela_server::replication::protection`): every
//! interleaving of a `replicated` commit's wait, the standby's acknowledgements, a term change
//! (the standby refuses this primary's term, or this primary steps down) and the degrade
//! policy, run against the daemon's own code (under `--cfg stela_loom` its Mutex is loom's through
//! `crate::sync`).
//!
//! Run it (not part of the default `cargo test`, where this file compiles to nothing):
//!
//! ```sh
//! RUSTFLAGS="--cfg stela_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p stela-server --test loom_protection --release -- --nocapture
//! ```
//!
//! What it proves, in every explored interleaving:
//! - every wait is answered exactly once, whichever of the acknowledgement, the fence or the
//!   degrade policy gets to it, and none is left registered once a fence has run (no lost
//!   answer, the RemusDB failure where a commit waits forever for a standby that is gone);
//! - a wait is answered `Ok` only if the standby acknowledged its LSN or a policy answered it
//!   (never by the fence);
//! - after a fence, no new wait above what was acknowledged is held or answered `Ok`: an old
//!   primary cannot collect a `replicated` acknowledgement after a term change.
#![cfg(stela_loom)]

use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use stela_server::replication::protection::{Holds, Protection, Registered};

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    InDoubt,
}

/// A waiter: records its answer; a second answer is a bug.
struct Probe {
    answer: Arc<loom::sync::Mutex<Option<Answer>>>,
}

impl Probe {
    fn new() -> (Probe, Arc<loom::sync::Mutex<Option<Answer>>>) {
        let answer = Arc::new(loom::sync::Mutex::new(None));
        (
            Probe {
                answer: Arc::clone(&answer),
            },
            answer,
        )
    }

    fn answer(self, answer: Answer) {
        let mut slot = self.answer.lock().unwrap();
        assert!(slot.is_none(), "a wait was answered twice");
        *slot = Some(answer);
    }
}

fn model(preemptions: usize, body: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let explored = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&explored);
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        body();
    });
    println!(
        "explored {} interleavings",
        explored.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// Registers a wait the way the daemon does: an immediate answer is given at once.
fn register(protection: &Protection<Probe>, lsn: u64, probe: Probe, degraded: &AtomicBool) {
    match protection.wait(lsn, Holds::Received, probe, || {
        degraded.load(Ordering::SeqCst)
    }) {
        Registered::Waiting => {}
        Registered::Already(probe) => probe.answer(Answer::Ok),
        Registered::Fenced(probe, _) => probe.answer(Answer::InDoubt),
    }
}

/// A commit, the standby's acknowledgement and a term change race; then whatever is left is
/// taken as at shutdown. Every wait is answered once; `Ok` only with the acknowledgement.
#[test]
fn a_wait_races_the_acknowledgement_and_a_term_change() {
    model(3, || {
        let protection: Arc<Protection<Probe>> = Arc::new(Protection::new());
        let degraded = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0)); // 0 none yet, 1 acknowledged LSN 2
        let (probe, answer) = Probe::new();
        let committer = {
            let (protection, degraded) = (Arc::clone(&protection), Arc::clone(&degraded));
            thread::spawn(move || register(&protection, 2, probe, &degraded))
        };
        let standby = {
            let (protection, acked) = (Arc::clone(&protection), Arc::clone(&acked));
            thread::spawn(move || {
                acked.store(1, Ordering::SeqCst);
                for probe in protection.acknowledged(2, 1) {
                    probe.answer(Answer::Ok);
                }
            })
        };
        let fence = {
            let protection = Arc::clone(&protection);
            thread::spawn(move || {
                for probe in protection.fence("the standby is at a newer term".into()) {
                    probe.answer(Answer::InDoubt);
                }
            })
        };
        committer.join().unwrap();
        standby.join().unwrap();
        fence.join().unwrap();
        // Nothing may be left waiting once the fence has run.
        assert_eq!(protection.waiting(), 0, "a wait outlived the fence");
        let answer = answer.lock().unwrap().expect("the wait was never answered");
        if answer == Answer::Ok {
            assert_eq!(
                acked.load(Ordering::SeqCst),
                1,
                "Ok without the standby's acknowledgement"
            );
        }
    });
}

/// After a fence, a new wait above what the standby acknowledged is never `Ok` and never held,
/// even while an acknowledgement of a lower LSN arrives; one at or below it is `Ok` (the standby
/// did hold it before the term changed).
#[test]
fn after_a_term_change_no_new_wait_is_acknowledged() {
    model(3, || {
        let protection: Arc<Protection<Probe>> = Arc::new(Protection::new());
        let degraded = Arc::new(AtomicBool::new(false));
        let fenced = Arc::new(AtomicBool::new(false));
        for probe in protection.acknowledged(1, 1) {
            probe.answer(Answer::Ok);
        }
        let (high, high_answer) = Probe::new();
        let (low, low_answer) = Probe::new();
        let fence = {
            let (protection, fenced) = (Arc::clone(&protection), Arc::clone(&fenced));
            thread::spawn(move || {
                for probe in protection.fence("stepped down".into()) {
                    probe.answer(Answer::InDoubt);
                }
                fenced.store(true, Ordering::SeqCst);
            })
        };
        let late_ack = {
            let protection = Arc::clone(&protection);
            thread::spawn(move || {
                // A late acknowledgement of what the standby held before the change.
                for probe in protection.acknowledged(1, 1) {
                    probe.answer(Answer::Ok);
                }
            })
        };
        fence.join().unwrap();
        assert!(fenced.load(Ordering::SeqCst));
        let committer = {
            let (protection, degraded) = (Arc::clone(&protection), Arc::clone(&degraded));
            thread::spawn(move || {
                register(&protection, 5, high, &degraded);
                register(&protection, 1, low, &degraded);
            })
        };
        committer.join().unwrap();
        late_ack.join().unwrap();
        assert_eq!(*high_answer.lock().unwrap(), Some(Answer::InDoubt));
        assert_eq!(*low_answer.lock().unwrap(), Some(Answer::Ok));
        assert_eq!(protection.waiting(), 0);
    });
}

/// The degrade policy begins while a wait registers: the wait is answered once, by the policy
/// or by the hand-back of waits registered before it (as `degrade_if_due` does: set the flag,
/// then take every waiter), never left behind.
#[test]
fn a_wait_races_the_degrade_policy() {
    model(3, || {
        let protection: Arc<Protection<Probe>> = Arc::new(Protection::new());
        let degraded = Arc::new(AtomicBool::new(false));
        let (probe, answer) = Probe::new();
        let committer = {
            let (protection, degraded) = (Arc::clone(&protection), Arc::clone(&degraded));
            thread::spawn(move || register(&protection, 3, probe, &degraded))
        };
        let degrade = {
            let (protection, degraded) = (Arc::clone(&protection), Arc::clone(&degraded));
            thread::spawn(move || {
                degraded.store(true, Ordering::SeqCst);
                for (_, _, probe) in protection.take_all() {
                    probe.answer(Answer::Ok);
                }
            })
        };
        committer.join().unwrap();
        degrade.join().unwrap();
        assert_eq!(
            protection.waiting(),
            0,
            "a wait was left behind by the policy"
        );
        assert_eq!(*answer.lock().unwrap(), Some(Answer::Ok));
    });
}
