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

pub mod rules;
pub mod witness;

/// Why a coordinator call failed.
#[derive(Debug, thiserror::Error)]
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

pub trait Coordinator: Send + Sync {
    fn renew(&self, node: &str, epoch: u64) -> Result<Renewal, CoordError>;
    fn promote(&self, node: &str, seen_epoch: u64) -> Result<Grant, CoordError>;
    fn current(&self) -> Result<Holder, CoordError>;
    fn describe(&self) -> String;
}

/// How long a node waits for the witness before it counts it unreachable: a few heartbeats, so
/// a dead or stopped witness costs the renewal loop little.
pub const WITNESS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(150);

/// A coordinator from its URL: `tcp://HOST:PORT` or `HOST:PORT` (a `stela witness`).
///
/// # Errors
/// The URL names no reachable-looking address, or a backend not built in.
pub fn connect(
    url: &str,
    cluster: &str,
    _lease: std::time::Duration,
) -> Result<Box<dyn Coordinator>, CoordError> {
    let bad = |why: &str| CoordError::Other(format!("coordinator {url:?}: {why}"));
    if url.starts_with("etcd://") {
        return Err(bad(
            "the etcd backend is not built yet; use a stela witness (tcp://HOST:PORT)",
        ));
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
    Ok(Box::new(witness::WitnessClient::new(
        addr,
        cluster,
        WITNESS_TIMEOUT,
    )))
}
