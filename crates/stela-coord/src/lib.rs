//! The failover coordinator's interface (the witness and etcd implement it; see the `coord`
//! branch). Placeholder until it lands: the trait only.

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

/// A coordinator from its URL: `tcp://HOST:PORT` or `HOST:PORT` (a witness), `etcd://HOST:PORT`.
///
/// # Errors
/// Not built yet in this placeholder.
pub fn connect(
    url: &str,
    _cluster: &str,
    _lease: std::time::Duration,
) -> Result<Box<dyn Coordinator>, CoordError> {
    Err(CoordError::Other(format!(
        "{url}: no coordinator is built yet"
    )))
}
