//! stela-coord: who may be the primary of a failover pair. The coordinator keeps the pair's
//! epoch (its term) and the node that holds it, hears the primary's renewals, and grants the
//! next epoch to the standby only once the primary has stopped renewing for a lease
//! ([`rules`]). The built-in [`witness`] is the default; every backend follows the same rules,
//! so they fence alike.
//!
//! The coordinator decides *failover* only: acknowledgements are fenced by the nodes
//! themselves (a standby refuses streams of an older epoch), so a lost, slow or lying
//! coordinator can make failover unavailable but never gives two primaries a `replicated`
//! acknowledgement. Callers treat [`CoordError::Unreachable`] as "failover unavailable",
//! never as "step down".

pub mod etcd;
pub mod gate;
pub mod rules;
pub mod witness;

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

    /// A planned switchover ([`rules::hand_over`]): the primary `node`, holding `epoch`,
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

/// How long a node waits for the witness before it counts it unreachable: a few heartbeats, so
/// a dead or stopped witness costs the renewal loop little.
pub const WITNESS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(150);

/// A coordinator from its URL: `tcp://HOST:PORT` or `HOST:PORT` (a `stela witness`), or
/// `etcd://HOST:PORT` (an etcd cluster's client endpoint; the pair's keys live under
/// `/stela/<cluster>/`). `token` is this node's credential at a witness (sent in each
/// connection's Hello; etcd takes none here).
///
/// # Errors
/// The URL names no reachable-looking address, or a backend not built in.
pub fn connect(
    url: &str,
    cluster: &str,
    lease: std::time::Duration,
    token: Option<String>,
) -> Result<Box<dyn Coordinator>, CoordError> {
    let bad = |why: &str| CoordError::Other(format!("coordinator {url:?}: {why}"));
    if let Some(host_port) = url.strip_prefix("etcd://") {
        let host_port = host_port.trim_end_matches('/');
        if host_port.is_empty() || !host_port.contains(':') {
            return Err(bad("expected etcd://HOST:PORT"));
        }
        return Ok(Box::new(etcd::EtcdCoordinator::new(
            &format!("http://{host_port}"),
            cluster,
            lease,
        )?));
    }
    let host_port = url.strip_prefix("tcp://").unwrap_or(url);
    if host_port.contains("://") {
        return Err(bad("unknown scheme (expected tcp:// or etcd://)"));
    }
    use std::net::ToSocketAddrs;
    let addr = host_port
        .to_socket_addrs()
        .map_err(|e| bad(&e.to_string()))?
        .next()
        .ok_or_else(|| bad("the host has no address"))?;
    Ok(Box::new(
        witness::WitnessClient::new(addr, cluster, WITNESS_TIMEOUT).with_token(token),
    ))
}
