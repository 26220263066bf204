//! The one error type of the client, [`Error`], and its [`Result`]: every module of the crate
//! returns them, so they stand below all of them (the crate's root only re-exports them).

use stela_format::Lsn;
use stela_proto::ErrorCode;
use thiserror::Error;

/// Everything a client call can fail with. New kinds of failure may be added: a `match` on it
/// needs a `_` arm.
///
/// ```no_run
/// use stela_client::{Durability, Error, Resolution, Wal, WalOptions};
///
/// # fn main() -> Result<(), Error> {
/// let options = WalOptions::default().durability(Durability::Replicated);
/// let wal: Wal<String> = Wal::open("tcp://10.0.0.1:7000,tcp://10.0.0.2:7000", "orders", options)?;
/// let lsn = wal.append(&"order 1".to_owned())?;
/// match wal.commit(lsn) {
///     Ok(()) => {}
///     Err(Error::InDoubt { term, lsn: Some(lsn), .. }) => match wal.resolve(term, lsn)? {
///         Resolution::Kept => {}
///         Resolution::Lost => { /* redo the transaction */ }
///         Resolution::NotYet => { /* ask again later */ }
///     },
///     Err(other) => return Err(other),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum Error {
    #[error("connecting to the daemon at {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    #[error("talking to the daemon: {0}")]
    Io(#[from] std::io::Error),
    #[error("the daemon sent a frame this client cannot read: {0}")]
    Frame(#[from] stela_proto::FrameError),
    #[error("the daemon refused the request ({code:?}): {message}")]
    Server { code: ErrorCode, message: String },
    #[error("the daemon answered {got} to a {asked} request")]
    UnexpectedAnswer { asked: &'static str, got: String },
    #[error("record could not be encoded or decoded: {0}")]
    Codec(#[from] stela_format::codec::CodecError),
    /// A record read back from the log could not be decoded as the record type (the log was
    /// written with another type or codec, or the type changed incompatibly).
    #[error("the record at LSN {lsn} could not be decoded: {source}")]
    Decode {
        lsn: Lsn,
        source: stela_format::codec::CodecError,
    },
    #[error("record of {bytes} bytes is larger than the daemon accepts ({max} bytes)")]
    RecordTooLarge { bytes: usize, max: usize },
    /// A certificate, key or token file of a TLS address could not be used.
    #[error("TLS: {0}")]
    Tls(#[from] stela_net::tls::TlsError),
    /// The connection to the daemon was lost during this call (the daemon died or restarted):
    /// whether the daemon acted on it is unknown (a `disk` commit may or may not be durable;
    /// check the log). The call is not sent again; the next call reconnects.
    #[error("the connection to the daemon at {address} was lost during {during}; its outcome is unknown and it was not retried (the next call reconnects): {cause}")]
    Disconnected {
        address: String,
        during: &'static str,
        cause: String,
    },
    /// The connection was lost and could not be re-established in time.
    #[error("could not reconnect to the daemon at {address} within {waited:?} after the connection was lost ({cause}): {last}")]
    Reconnect {
        address: String,
        waited: std::time::Duration,
        cause: String,
        last: String,
    },
    /// A commit whose primary was lost while it waited (the connection broke, the daemon
    /// stepped down, or a newer primary took over): the record may or may not survive. Resolve
    /// it with [`crate::Wal::resolve`]`(term, lsn)` once a primary answers.
    #[error("commit in doubt (term {term}, {}): {cause}; resolve it by its term and LSN on the primary", lsn_or_unknown(*lsn))]
    InDoubt {
        term: u64,
        /// The record's LSN; `None` only for an `append_*_durable` whose LSN never came back
        /// (the daemon had not answered the append): append, then `commit_at`, to always
        /// have one.
        lsn: Option<Lsn>,
        cause: String,
    },
    /// A `replicated` or `all` commit that no standby holds: the primary answered without one
    /// (promoted, its old primary not back yet; or its standby unreachable past
    /// `--degrade-after`). The record is appended at `lsn` in `term` and held by that primary
    /// alone: it survives what `buffered` survives (`disk` for `all`), not the primary's loss.
    /// Never a plain `Ok`: a caller that can live with that accepts it here explicitly, or
    /// commits `lsn` again later, which succeeds once a standby holds it.
    #[error("commit not protected (term {term}, {}): no standby holds it: {cause}", lsn_or_unknown(*lsn))]
    Unprotected {
        term: u64,
        /// The record's LSN; `None` only for an `append_*_durable`, whose refusal does not
        /// carry it (append, then `commit_at`, to always have one).
        lsn: Option<Lsn>,
        cause: String,
    },
    /// No endpoint of the list opened the log: each is named with why it was passed over.
    #[error("no endpoint is the primary: {}", tried.iter().map(|(a, why)| format!("{a}: {why}")).collect::<Vec<_>>().join("; "))]
    NoPrimary { tried: Vec<(String, String)> },
    /// A daemon address given as text could not be understood. Nothing was connected.
    #[error(
        "bad daemon address {address:?}: {reason} (expected unix:PATH, a path, or tcp://HOST:PORT)"
    )]
    BadAddress { address: String, reason: String },
}

/// "LSN n", or says that the LSN is unknown.
fn lsn_or_unknown(lsn: Option<Lsn>) -> String {
    match lsn {
        Some(lsn) => format!("LSN {lsn}"),
        None => "LSN unknown: the append was not answered".to_owned(),
    }
}

impl From<std::convert::Infallible> for Error {
    fn from(never: std::convert::Infallible) -> Error {
        match never {}
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The daemon's error code, if the daemon refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An in-doubt or unprotected commit names its LSN, or says plainly that it is unknown.
    #[test]
    fn a_commit_in_doubt_names_its_lsn_or_says_it_is_unknown() {
        let known = Error::InDoubt {
            term: 7,
            lsn: Some(Lsn::new(42)),
            cause: "lost".into(),
        };
        assert!(known.to_string().contains("term 7, LSN 42"), "{known}");
        let unknown = Error::Unprotected {
            term: 7,
            lsn: None,
            cause: "alone".into(),
        };
        assert!(unknown.to_string().contains("LSN unknown"), "{unknown}");
    }
}
