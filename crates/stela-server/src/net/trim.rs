//! Giving memory the connections freed back to the system.
//!
//! How is the allocator's business: the binary that chose it says (`DaemonConfig::
//! release_memory`; `stela serve` runs mimalloc, told to purge what stays free and forced to
//! at each trim); without it, glibc's `malloc_trim`, below. Either way the allocator keeps
//! freed memory for reuse unless told otherwise. glibc's allocator keeps freed memory for reuse: chunks below its (self-raising) mmap
//! threshold come from heaps it returns to the system only from their top, so the answer and
//! frame buffers of clients that are gone (never-reading clients cut, a flood that left) would
//! stay in the daemon's RSS for good, fragments of them pinned by whatever was allocated after.
//! `malloc_trim(0)` returns every free whole page of every arena (glibc >= 2.8). It walks the
//! arenas under their locks, so it is asked for rarely: only after the loop has freed at least
//! [`TRIM_AFTER_FREED`] of connection buffers since the last trim, at most once per
//! [`TRIM_EVERY`], and on a worker thread rather than on the loop.
//!
//! A burst (clients cut or gone together) frees over more than one second: each trim is
//! followed by another a second later while at least [`TRIM_FOLLOW_UP`] more was freed, so the
//! tail of the burst goes back too.
//!
//! Invariant: `freed` counts buffer capacity given back since the last trim asked for; a trim
//! is asked for only when it is at least [`TRIM_AFTER_FREED`], or [`TRIM_FOLLOW_UP`] right
//! after one (then it starts again at zero), and never twice within [`TRIM_EVERY`].

use std::time::{Duration, Instant};

/// Connection buffers freed before a trim is worth its walk over the heaps.
pub(super) const TRIM_AFTER_FREED: usize = 16 << 20;
/// What the trim after a trim needs freed (the tail of the burst that asked for the first).
pub(super) const TRIM_FOLLOW_UP: usize = 1 << 20;
/// At most one trim this often.
pub(super) const TRIM_EVERY: Duration = Duration::from_secs(1);

/// When the loop asks for a trim.
#[derive(Debug)]
pub(super) struct TrimPolicy {
    freed: usize,
    last: Option<Instant>,
    /// The last check asked for a trim: the next needs only [`TRIM_FOLLOW_UP`].
    following: bool,
}

impl TrimPolicy {
    pub fn new() -> TrimPolicy {
        TrimPolicy {
            freed: 0,
            last: None,
            following: false,
        }
    }

    /// `bytes` of buffers were given back to the allocator.
    pub fn freed(&mut self, bytes: usize) {
        self.freed = self.freed.saturating_add(bytes);
    }

    /// Whether to trim now; if so, the count starts again.
    pub fn due(&mut self, now: Instant) -> bool {
        let rested = self
            .last
            .is_none_or(|last| now.duration_since(last) >= TRIM_EVERY);
        if !rested {
            return false;
        }
        let needed = if self.following {
            TRIM_FOLLOW_UP
        } else {
            TRIM_AFTER_FREED
        };
        self.following = self.freed >= needed;
        if self.following {
            self.freed = 0;
            self.last = Some(now);
        }
        self.following
    }
}

/// Returns glibc's free pages to the system (nothing elsewhere): the default of
/// `DaemonConfig::release_memory`, for a process whose global allocator is the system's.
pub(super) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: malloc_trim only walks and trims glibc's own arenas under their locks; it
        // reads no memory of ours and is safe to call from any thread at any time.
        let released = unsafe { libc::malloc_trim(0) };
        tracing::debug!(
            released = released != 0,
            "gave free memory back to the system"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trim_is_due_only_after_enough_was_freed_and_not_twice_in_a_row() {
        let start = Instant::now();
        let mut policy = TrimPolicy::new();
        policy.freed(TRIM_AFTER_FREED - 1);
        assert!(!policy.due(start), "not enough freed");
        policy.freed(1);
        assert!(policy.due(start));
        policy.freed(TRIM_AFTER_FREED);
        assert!(
            !policy.due(start + TRIM_EVERY / 2),
            "too soon after the last"
        );
        assert!(policy.due(start + TRIM_EVERY), "the freed bytes were kept");
        policy.freed(TRIM_FOLLOW_UP);
        assert!(policy.due(start + TRIM_EVERY * 2), "the tail of the burst");
        policy.freed(TRIM_FOLLOW_UP - 1);
        assert!(
            !policy.due(start + TRIM_EVERY * 3),
            "too little for a follow-up"
        );
        policy.freed(1);
        assert!(
            !policy.due(start + TRIM_EVERY * 4),
            "a burst again needs the full amount"
        );
    }
}
