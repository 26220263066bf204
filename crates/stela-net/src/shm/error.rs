//! [`ShmError`]: what went wrong on a ring, for the caller to act on. Both ends of the ring
//! and the wake board return it, so it stands below them all.

use std::io;
use stela_proto::ring::{FaultCode, RingError};
use thiserror::Error;

/// What went wrong on a ring, for the caller to act on.
#[derive(Debug, Error)]
pub enum ShmError {
    /// A system call failed (`op` names it).
    #[error("{op}: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The region's header or size is not a ring this code can use.
    #[error("not a usable ring region: {0}")]
    Layout(RingError),
    /// The memfd could be resized by someone (which would crash us on access).
    #[error("the ring memfd is not sealed against resizing (seals {seals:#x})")]
    Unsealed { seals: u32 },
    /// The entry can never fit this ring: send it over the socket instead.
    #[error("an entry of {len} bytes does not fit the ring's {max}-byte area; use the socket")]
    EntryTooLarge { len: u64, max: u64 },
    /// The entry is not valid for its kind (an append without records, a commit with some).
    #[error("invalid ring entry: {0}")]
    BadEntry(RingError),
    /// The daemon is gone (its socket hung up); no answer will come.
    #[error("the daemon is gone")]
    DaemonGone,
    /// The daemon stopped reading this ring at `fault_seq`; entry `seq` will never be answered.
    #[error("the daemon stopped reading this ring ({}) at entry {fault_seq}; entry {seq} will not be answered", describe_fault(*.code))]
    Faulted { code: u32, fault_seq: u64, seq: u64 },
    /// `wait` for an entry never submitted.
    #[error("entry {seq} was not submitted (the next is {next})")]
    NotSubmitted { seq: u64, next: u64 },
    /// `wait` for an entry whose answer was already overwritten by a later one's.
    #[error("the answer to entry {seq} is no longer kept (wait at most `slots` entries behind)")]
    ResultGone { seq: u64 },
    /// The daemon broke the ring protocol (a header word out of range).
    #[error("ring protocol violated: {what} is {value}, expected at most {limit}")]
    Inconsistent {
        what: &'static str,
        value: u64,
        limit: u64,
    },
}

impl ShmError {
    pub(crate) fn io(op: &'static str) -> impl FnOnce(io::Error) -> ShmError {
        move |source| ShmError::Io { op, source }
    }

    /// For [`ShmError::Faulted`]: the daemon's reason, if it is a known one.
    pub fn fault_code(&self) -> Option<FaultCode> {
        match self {
            ShmError::Faulted { code, .. } => FaultCode::from_u32(*code),
            _ => None,
        }
    }
}

fn describe_fault(code: u32) -> String {
    match FaultCode::from_u32(code) {
        Some(code) => format!("{code:?}"),
        None => format!("code {code}"),
    }
}
