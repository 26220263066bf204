//! The messages the machines exchange. Every one can be lost, delayed, duplicated or
//! reordered: the rules in `coordinator` and `node` hold whatever the network does with them.

use crate::log::{Lsn, Position, Record, Term};

/// A node's number in the cluster.
pub type NodeId = u8;
/// A client's number.
pub type ClientId = u16;
/// Milliseconds of the simulated (or real) clock; the machines never read a clock.
pub type Time = u64;

/// From a node to the coordinator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToCoordinator {
    /// "I am up; which epoch is current?" (a node at start).
    Hello,
    /// The primary of `term` renews its lease.
    Renew { term: Term },
    /// An answer to `Prepare { epoch }`: this node takes no record of an older term any more,
    /// and its log (synced) reaches `position`.
    Promise {
        epoch: Term,
        position: Position,
        prefers_primary: bool,
    },
}

/// From the coordinator to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FromCoordinator {
    /// The newest epoch the coordinator has started, and its holder if granted.
    Current {
        epoch: Term,
        holder: Option<NodeId>,
    },
    Renewed {
        term: Term,
    },
    /// An election for `epoch` began: promise to take nothing older, and say how far your log
    /// reaches.
    Prepare {
        epoch: Term,
    },
    /// You are the primary of `epoch`.
    Granted {
        epoch: Term,
    },
}

/// Between a primary and a standby; `stream` names one opening of a stream by the primary, so
/// that what a dead stream left in flight is recognised and ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Primary to standby: a new stream of `term`.
    Open { term: Term, stream: u64 },
    /// Standby to primary: its log's history, to find where the two diverge.
    Hello {
        term: Term,
        stream: u64,
        history: crate::log::History,
        last: Lsn,
    },
    /// Primary to standby: the records after `after` (none: a heartbeat). The first shipment
    /// of a stream (`cut`) also tells the standby to cut what it holds after `after`: the
    /// records there are not the primary's.
    Ship {
        term: Term,
        stream: u64,
        after: Lsn,
        cut: bool,
        records: Vec<Record>,
    },
    /// Standby to primary: it holds (synced) the primary's log up to `durable`.
    Ack {
        term: Term,
        stream: u64,
        durable: Lsn,
    },
    /// Standby to primary: a shipment did not continue its copy; open a new stream.
    Gap { term: Term, stream: u64 },
    /// Standby to primary: it has seen `seen`, newer than the stream's term.
    Refuse { seen: Term },
}

/// From a client to a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Append `payload` and answer once it is protected; answer `Unprotected` at `deadline`.
    Commit { payload: u64, deadline: Time },
    /// What became of the record a client was told was at (`term`, `lsn`)?
    Resolve { term: Term, lsn: Lsn },
}

/// From a node to a client; `payload` names the commit answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// Not the primary (or fenced): ask another node.
    NotPrimary { payload: u64 },
    /// Written at (`term`, `lsn`), not yet protected.
    Appended { payload: u64, term: Term, lsn: Lsn },
    /// `replicated`: K standbys hold it.
    Ok { payload: u64, term: Term, lsn: Lsn },
    /// The deadline passed with the record on fewer than K standbys: on this node alone it
    /// may be lost.
    Unprotected { payload: u64, term: Term, lsn: Lsn },
    /// This node stopped being the primary before the record was protected.
    InDoubt { payload: u64, term: Term, lsn: Lsn },
    /// The answer to `Resolve`.
    Resolved {
        term: Term,
        lsn: Lsn,
        resolution: crate::log::Resolution,
    },
    /// This node cannot resolve (`term`, `lsn`) (not the primary of the newest term it knows,
    /// or not protected yet): ask again, elsewhere.
    CannotResolve { term: Term, lsn: Lsn },
}
