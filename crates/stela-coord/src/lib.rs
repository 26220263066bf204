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

mod coordinator;
pub mod etcd;
pub mod gate;
pub mod rules;
pub mod witness;

pub use coordinator::{
    CoordError, Coordinator, Election, Grant, Holder, LogPosition, Renewal, Report,
};

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
