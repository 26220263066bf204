//! What a node asks of a coordinator and what it hears back: the [`Coordinator`] trait every
//! backend (the built-in witness, etcd) implements, its answers, and [`CoordError`]. The
//! failover rules ([`crate::rules`]) decide these answers; this module only names them, so the
//! rules and every backend stand on it rather than on the crate's root.

/// Why a coordinator call failed (`#[non_exhaustive]`: a `match` outside this crate needs a
/// wildcard arm).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordError {
    #[error("the coordinator is unreachable: {0}")]
    Unreachable(String),
    #[error("{0}")]
    Other(String),
}

/// The answer to a renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    Renewed { epoch: u64 },
    Superseded { epoch: u64, holder: String },
}

/// The answer to a promotion request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    Granted {
        epoch: u64,
    },
    Refused {
        epoch: u64,
        holder: Option<String>,
        reason: String,
    },
}

/// What the coordinator holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub epoch: u64,
    pub holder: Option<String>,
}

/// Where one log of a node ends, as it reports it in an election: the term of its last
/// record, then its last LSN (compared in that order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogPosition {
    pub log: String,
    pub term: u64,
    pub lsn: u64,
}

/// What a node promises with: where each of its logs ends, and whether it prefers to be the
/// primary (which breaks a tie between equally up-to-date nodes, and only a tie).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    pub positions: Vec<LogPosition>,
    pub prefers_primary: bool,
}

/// The answer to a step of an election by promises (clusters of more than two nodes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Election {
    /// An election for `epoch` is open: record `epoch` as seen (durably), stop taking any
    /// older stream, then promise it with this node's position.
    Prepare { epoch: u64 },
    /// `epoch` is granted to this node.
    Granted { epoch: u64 },
    /// The promise is counted; `heard` of the `needed` promises are in, or no node that
    /// promised holds every other's records yet (`reason`).
    Waiting {
        epoch: u64,
        heard: u32,
        needed: u32,
        reason: String,
    },
    /// No election for this node now (the primary is alive, or `epoch` went to `holder`).
    Refused {
        epoch: u64,
        holder: Option<String>,
        reason: String,
    },
}

pub trait Coordinator: Send + Sync {
    fn renew(&self, node: &str, epoch: u64) -> Result<Renewal, CoordError>;
    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError>;
    fn current(&self) -> Result<Holder, CoordError>;
    fn describe(&self) -> String;

    /// A planned switchover ([`crate::rules::hand_over`]): the primary `node`, holding `epoch`,
    /// hands the next epoch to `to`, which takes it with [`Coordinator::promote`] at once.
    ///
    /// # Errors
    /// Unreachable, or this coordinator has no switchover.
    fn hand_over(&self, node: &str, epoch: u64, to: &str) -> Result<Grant, CoordError> {
        let _ = (node, epoch, to);
        Err(CoordError::Other(format!(
            "{} has no planned switchover (the built-in witness has)",
            self.describe()
        )))
    }

    /// A standby that has heard nothing from its primary asks for an election (clusters of
    /// more than two nodes; `needed` is N − K, the promises a grant needs).
    ///
    /// # Errors
    /// Unreachable, or this coordinator has no elections by promises.
    fn ask(&self, node: &str, seen_epoch: u64, needed: u32) -> Result<Election, CoordError> {
        let _ = (node, seen_epoch, needed);
        Err(CoordError::Other(format!(
            "{} has no elections by promises (needed by more than two nodes)",
            self.describe()
        )))
    }

    /// A node promises `epoch` (it recorded it as seen and stopped taking older streams) with
    /// where its logs end.
    ///
    /// # Errors
    /// Unreachable, or this coordinator has no elections by promises.
    fn promise(
        &self,
        node: &str,
        epoch: u64,
        needed: u32,
        report: &Report,
    ) -> Result<Election, CoordError> {
        let _ = (node, epoch, needed, report);
        Err(CoordError::Other(format!(
            "{} has no elections by promises (needed by more than two nodes)",
            self.describe()
        )))
    }
}
