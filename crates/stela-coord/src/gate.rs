//! The witness's door (issue 54: it took plain-TCP requests from anyone who reached its port):
//! what a connection must say before it is served, and which connection waiting to say it makes
//! room for a newcomer. Pure decisions; the witness's accept loop does the I/O.
//!
//! A connection is served only after its first frame, a [`WitnessRequest::Hello`] of at most
//! [`MAX_WITNESS_HELLO_BYTES`] read within the handshake deadline, names this version and
//! carries a token of the witness's `--token-file` (or none, from a loopback peer running as the
//! witness's own user or root, when that is trusted). Until then a connection costs a slot in a
//! bounded table, a few hundred bytes and no thread.
//!
//! Invariants:
//! - A token, when sent, decides: a wrong one is refused even from a trusted local peer.
//! - The table never holds more than [`Limits::pending`] connections, nor more than
//!   [`Limits::per_address`] from one address; a newcomer is never refused for room: the oldest
//!   silent connection (then the oldest) of its address, or of all, makes room.

use std::net::IpAddr;
use std::time::Instant;
use stela_proto::witness::{WitnessRequest, MAX_WITNESS_HELLO_BYTES, WITNESS_VERSION};
use stela_proto::FrameError;

/// Bounds on connections that have not yet said Hello, and on sessions.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Handshakes in progress at once.
    pub pending: usize,
    /// Handshakes in progress from one address.
    pub per_address: usize,
    /// Authenticated sessions (a thread each) at once.
    pub sessions: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            pending: 256,
            per_address: 64,
            sessions: 64,
        }
    }
}

/// What the gate knows of a connection that has not said Hello yet.
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    pub ip: IpAddr,
    pub since: Instant,
    /// Some bytes arrived from it.
    pub heard: bool,
}

/// The connection (index into `waiting`) to drop so that a newcomer from `ip` fits, if one
/// must go: the oldest silent one of the newcomer's address when that address is at its
/// limit, else of all when the table is full; the oldest if none is silent.
pub fn make_room(waiting: &[Waiting], ip: IpAddr, limits: &Limits) -> Option<usize> {
    let same: Vec<usize> = (0..waiting.len())
        .filter(|&i| waiting[i].ip == ip)
        .collect();
    let among: Vec<usize> = if same.len() >= limits.per_address {
        same
    } else if waiting.len() >= limits.pending {
        (0..waiting.len()).collect()
    } else {
        return None;
    };
    let oldest =
        |candidates: &mut dyn Iterator<Item = usize>| candidates.min_by_key(|&i| waiting[i].since);
    oldest(&mut among.iter().copied().filter(|&i| !waiting[i].heard))
        .or_else(|| oldest(&mut among.iter().copied()))
}

/// What the peer proved, for [`admit`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// It sent none.
    None,
    /// It sent one of the witness's tokens.
    Valid,
    /// It sent another.
    Wrong,
}

/// Why a connection is not served (told to the peer and logged).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the first request must be a Hello (witness protocol {WITNESS_VERSION}); this node \
         speaks an older protocol: upgrade it"
    )]
    NoHello,
    #[error(
        "witness protocol {version} is not spoken here (this witness speaks {WITNESS_VERSION})"
    )]
    Version { version: u32 },
    #[error("wrong token")]
    WrongToken,
    #[error(
        "no token, and not a loopback peer running as the witness's user (--coordinator-token-file)"
    )]
    NoProof,
    #[error("{open} sessions open, the witness's limit")]
    Sessions { open: usize },
    #[error("the first frame must be a Hello of at most {MAX_WITNESS_HELLO_BYTES} bytes: {0}")]
    Oversized(FrameError),
    #[error("the first request cannot be read ({0}): is this node older than the witness?")]
    Unreadable(FrameError),
}

/// Whether a connection whose first frame is `first` is served: `Err` says why not.
/// `local_user`: the peer is on loopback and runs as the witness's own user or root, and such
/// peers are trusted without a token.
pub fn admit(first: &WitnessRequest, token: Token, local_user: bool) -> Result<(), Refusal> {
    let WitnessRequest::Hello { version, .. } = first else {
        return Err(Refusal::NoHello);
    };
    if *version != WITNESS_VERSION {
        return Err(Refusal::Version { version: *version });
    }
    match (token, local_user) {
        (Token::Valid, _) => Ok(()),
        (Token::Wrong, _) => Err(Refusal::WrongToken),
        (Token::None, true) => Ok(()),
        (Token::None, false) => Err(Refusal::NoProof),
    }
}

/// The bytes a Hello frame may take on the wire, header included.
pub const MAX_HELLO_FRAME_BYTES: usize = stela_proto::FRAME_HEADER_BYTES + MAX_WITNESS_HELLO_BYTES;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hello(version: u32) -> WitnessRequest {
        WitnessRequest::Hello {
            version,
            token: None,
        }
    }

    #[test]
    fn only_a_hello_of_this_version_with_proof_is_admitted() {
        assert!(admit(&hello(WITNESS_VERSION), Token::Valid, false).is_ok());
        assert!(admit(&hello(WITNESS_VERSION), Token::None, true).is_ok());
        assert!(admit(&hello(WITNESS_VERSION), Token::None, false).is_err());
        assert!(admit(&hello(WITNESS_VERSION), Token::Wrong, true).is_err());
        let refused = admit(&hello(1), Token::Valid, true).unwrap_err();
        assert_eq!(refused, Refusal::Version { version: 1 });
        assert!(refused.to_string().contains("protocol 1"));
        let renew = WitnessRequest::Current {
            cluster: "c".into(),
        };
        let refused = admit(&renew, Token::Valid, true).unwrap_err();
        assert!(refused.to_string().contains("must be a Hello"), "{refused}");
    }

    #[test]
    fn a_newcomer_makes_room_by_dropping_the_oldest_silent_connection() {
        let limits = Limits {
            pending: 3,
            per_address: 2,
            sessions: 1,
        };
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let w = |ip, secs, heard| Waiting {
            ip,
            since: t0 + Duration::from_secs(secs),
            heard,
        };
        // Room left: nobody goes.
        assert_eq!(make_room(&[w(a, 0, false)], b, &limits), None);
        // a is at its limit: its oldest silent one goes, not b's.
        let table = [w(a, 0, true), w(b, 1, false), w(a, 2, false)];
        assert_eq!(make_room(&table, a, &limits), Some(2));
        // Full: the oldest silent of all.
        let table = [w(a, 0, true), w(b, 1, false), w(b, 2, false)];
        assert_eq!(make_room(&table, a, &limits), Some(1));
        // Full and everybody spoke: the oldest.
        let table = [w(a, 3, true), w(b, 1, true), w(b, 2, true)];
        assert_eq!(make_room(&table, a, &limits), Some(1));
    }
}
