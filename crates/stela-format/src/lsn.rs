//! Log sequence numbers.
//!
//! An LSN numbers records, not bytes: the first record ever appended to a log is LSN 1 and every
//! later record gets the next integer, across segments and for the life of the log. LSN 0 never
//! names a record; it means "nothing yet" (the durable LSN of an empty log, for example). Dense
//! numbering lets a reader check continuity (every frame's LSN must be one more than the last)
//! and lets a caller say `truncate_before(lsn)` without knowing byte offsets.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A record's position in the log. See the module documentation.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Lsn(u64);

impl Lsn {
    /// "No record": below every real LSN.
    pub const ZERO: Lsn = Lsn(0);
    /// The LSN of the first record of a new log.
    pub const FIRST: Lsn = Lsn(1);
    /// The largest LSN a record can have. `u64::MAX` is reserved, so that the LSN after any
    /// record, which readers and the log compute as they go, always exists; the frame and header
    /// decoders reject it.
    pub const MAX: Lsn = Lsn(u64::MAX - 1);

    pub const fn new(value: u64) -> Lsn {
        Lsn(value)
    }

    pub const fn get(self) -> u64 {
        self.0
    }

    /// The LSN after this one.
    ///
    /// # Panics
    /// On `u64::MAX` in debug builds, which no record has (see [`Lsn::MAX`]).
    pub const fn next(self) -> Lsn {
        Lsn(self.0 + 1)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl From<u64> for Lsn {
    fn from(value: u64) -> Lsn {
        Lsn(value)
    }
}
