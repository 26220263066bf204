//! K of N, pure: one commit's wait on every standby, decided once K standbys said they hold
//! the record, or once so many answered otherwise (a policy without the standby, a fence, a
//! closed log) that K can no longer be reached.
//!
//! Invariants (asserted, and property-tested below):
//! - **Decided once.** [`Tally::add`] returns `Some` exactly once, at the answer that decides;
//!   every later answer returns `None`.
//! - **`Ok` only with K.** The decision is `Ok` only if K standbys answered `Ok` by then; it is
//!   an error only once fewer than K can still answer `Ok`.
//! - **The gravest error wins**: `InDoubt` (a standby fenced this primary: a newer term exists)
//!   over any other, and `Unprotected` (a policy answered without that standby) only when every
//!   failing standby answered so.

use crate::pool::PoolError;

/// One commit's answers from the standbys so far.
#[derive(Debug)]
pub(super) struct Tally {
    needed: usize,
    /// Standbys that have not answered yet.
    left: usize,
    oks: usize,
    worst: Option<PoolError>,
    decided: bool,
}

impl Tally {
    /// A wait for `needed` of `standbys` standbys.
    pub(super) fn new(needed: usize, standbys: usize) -> Tally {
        assert!(
            (1..=standbys).contains(&needed),
            "K ({needed}) must be between 1 and the number of standbys ({standbys})"
        );
        Tally {
            needed,
            left: standbys,
            oks: 0,
            worst: None,
            decided: false,
        }
    }

    /// One standby's answer; the decision, if this answer makes it.
    pub(super) fn add(&mut self, outcome: Result<(), PoolError>) -> Option<Result<(), PoolError>> {
        debug_assert!(self.left > 0, "more answers than standbys");
        self.left = self.left.saturating_sub(1);
        match outcome {
            Ok(()) => self.oks += 1,
            Err(error) => {
                if self.worst.as_ref().is_none_or(|w| rank(&error) > rank(w)) {
                    self.worst = Some(error);
                }
            }
        }
        if self.decided {
            return None;
        }
        if self.oks >= self.needed {
            self.decided = true;
            return Some(Ok(()));
        }
        if self.oks + self.left < self.needed {
            self.decided = true;
            return Some(Err(self.worst.take().unwrap_or(PoolError::Closed)));
        }
        None
    }

    /// Whether the wait is decided (no other standby need be asked).
    pub(super) fn decided(&self) -> bool {
        self.decided
    }
}

/// How grave an answer without the standby is.
fn rank(error: &PoolError) -> u8 {
    match error {
        PoolError::InDoubt(_) => 2,
        PoolError::Unprotected(_) => 0,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn outcome(kind: u8) -> Result<(), PoolError> {
        match kind % 4 {
            0 | 1 => Ok(()),
            2 => Err(PoolError::Unprotected("alone".into())),
            _ => Err(PoolError::InDoubt("fenced".into())),
        }
    }

    #[test]
    fn one_of_two_is_enough_and_an_unprotected_peer_does_not_decide() {
        let mut tally = Tally::new(1, 2);
        assert!(tally
            .add(Err(PoolError::Unprotected("down".into())))
            .is_none());
        assert!(matches!(tally.add(Ok(())), Some(Ok(()))));
        let mut tally = Tally::new(1, 2);
        assert!(tally.add(Err(PoolError::Unprotected("a".into()))).is_none());
        assert!(matches!(
            tally.add(Err(PoolError::InDoubt("b".into()))),
            Some(Err(PoolError::InDoubt(_)))
        ));
    }

    proptest! {
        /// Over any order of answers from N standbys with any K: decided exactly once, `Ok`
        /// only with K `Ok`s, an error only once K can no longer be reached, `Unprotected`
        /// only if no failing standby answered otherwise.
        #[test]
        fn decided_once_and_ok_only_with_k(
            kinds in proptest::collection::vec(0u8..4, 1..6),
            k in 1usize..6,
        ) {
            let n = kinds.len();
            let k = k.min(n);
            let mut tally = Tally::new(k, n);
            let mut decisions = Vec::new();
            let (mut oks, mut failed) = (0, Vec::new());
            for (answered, kind) in kinds.iter().enumerate() {
                let this = outcome(*kind);
                match &this { Ok(()) => oks += 1, Err(_) => failed.push(*kind % 4) }
                if let Some(decision) = tally.add(this) {
                    let left = n - answered - 1;
                    match &decision {
                        Ok(()) => prop_assert!(oks >= k),
                        Err(e) => {
                            prop_assert!(oks + left < k);
                            let any_in_doubt = failed.contains(&3);
                            prop_assert_eq!(matches!(e, PoolError::InDoubt(_)), any_in_doubt);
                        }
                    }
                    decisions.push(decision.is_ok());
                }
            }
            prop_assert_eq!(decisions.len(), 1, "decided {} times", decisions.len());
            prop_assert!(tally.decided());
        }
    }
}
