//! What the daemon's end of a ring reports without changing anything: why it stopped, its
//! debug form, cheap looks at the shared words. Apart from the hand-off itself ([`super`]).

use super::{Completer, DaemonRing};
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use stela_proto::ring::{FaultCode, RingError, RingLayout};

/// Why the daemon stopped reading a ring.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingFault {
    /// What went into the shared `fault` word.
    pub code: FaultCode,
    /// The first seq that will never be completed (the entry that failed, or the next one).
    pub seq: u64,
    /// The ring position (`head`) it was found at.
    pub at: u64,
    /// The failed check; `None` when the daemon closed the ring itself ([`DaemonRing::fault`]).
    pub error: Option<RingError>,
}

impl fmt::Display for RingFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ring stopped ({:?}) at seq {}, position {}",
            self.code, self.seq, self.at
        )?;
        if let Some(error) = &self.error {
            write!(f, ": {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for RingFault {}

impl fmt::Debug for DaemonRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DaemonRing")
            .field("layout", &self.layout)
            .field("head", &self.head)
            .field("expected_seq", &self.expected_seq)
            .field("completed", &self.completions.completed.load(Relaxed))
            .field("fault", &self.fault)
            .finish()
    }
}

impl DaemonRing {
    pub fn layout(&self) -> RingLayout {
        self.layout
    }

    /// Whether the client has published bytes not yet consumed (false once the ring is
    /// stopped). A cheap load for a spinning event loop.
    pub fn has_published(&self) -> bool {
        self.stopped.load(Relaxed) == 0 && self.region.tail().load(Relaxed) != self.head
    }

    /// Whether the client says it sleeps on `wake` (for tests and status; the ring itself
    /// wakes it when needed).
    pub fn client_waiting(&self) -> bool {
        self.region.client_waiting().load(Relaxed) != 0
    }

    /// The `wake` futex word: how many times the client was woken on it (by the daemon, or by
    /// its own watcher when the daemon died). For tests and status.
    pub fn wake_count(&self) -> u32 {
        self.region.wake().load(Relaxed)
    }

    /// The seq the next entry must carry (entries consumed + 1).
    pub fn expected_seq(&self) -> u64 {
        self.expected_seq
    }
}

impl fmt::Debug for Completer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer")
            .field("completed", &self.completions.completed.load(Relaxed))
            .finish_non_exhaustive()
    }
}
