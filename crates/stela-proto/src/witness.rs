//! What a node of a failover pair and the witness (`stela witness`) say to each other: one
//! request, one answer, in the frame envelope of [`crate::frame`]. The rules behind the answers
//! are in `stela_coord`; the exchange is in `docs/PROTOCOL.md`, "Witness".

use serde::{Deserialize, Serialize};

/// Largest witness frame either side accepts: names and reasons only.
pub const MAX_WITNESS_FRAME_BYTES: usize = 64 << 10;

/// The witness exchange's version, sent in [`WitnessRequest::Hello`]. Version 2 (issue 54)
/// added the Hello itself: a witness of version 2 answers nothing before an authenticated Hello,
/// and a witness of version 1 cannot decode one and closes the connection, which the node
/// reports as unreachable.
pub const WITNESS_VERSION: u32 = 2;

/// Largest first frame (the Hello) a witness reads from a connection not yet authenticated.
pub const MAX_WITNESS_HELLO_BYTES: usize = 512;

/// A node's request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WitnessRequest {
    /// The primary's heartbeat: it holds `epoch`.
    Renew {
        cluster: String,
        node: String,
        epoch: u64,
    },
    /// A standby that has heard nothing from its primary asks to hold the next epoch;
    /// `seen_epoch` is the highest it has seen.
    Promote {
        cluster: String,
        node: String,
        seen_epoch: u64,
    },
    /// Who holds which epoch now.
    Current { cluster: String },
    /// Elections by promises (clusters of more than two nodes; a witness that predates them
    /// cannot decode this and closes the connection, which the node reports): a standby that
    /// has heard nothing from its primary asks for an election. `needed` is N − K.
    Ask {
        cluster: String,
        node: String,
        seen_epoch: u64,
        needed: u32,
    },
    /// The node recorded `epoch` as seen and takes no older stream: its logs' positions
    /// (name, term of the last record, last LSN).
    Promise {
        cluster: String,
        node: String,
        epoch: u64,
        needed: u32,
        prefers_primary: bool,
        positions: Vec<(String, u64, u64)>,
    },
    /// The first frame of every connection (version 2): the node's version and its credential,
    /// a token of the witness's `--token-file` (none: the witness accepts it only from a
    /// loopback peer running as the witness's own user or root). At most
    /// [`MAX_WITNESS_HELLO_BYTES`].
    Hello { version: u32, token: Option<String> },
    /// A planned switchover: the primary `node`, holding `epoch`, hands the next epoch to `to`
    /// (its standby, which holds every record it acknowledged). A witness that predates it
    /// cannot decode this and closes the connection, which the node reports.
    HandOver {
        cluster: String,
        node: String,
        epoch: u64,
        to: String,
    },
}

/// The witness's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WitnessResponse {
    Renewed {
        epoch: u64,
    },
    /// A newer epoch is held by `holder`: the renewing node must step down.
    Superseded {
        epoch: u64,
        holder: String,
    },
    Granted {
        epoch: u64,
    },
    Refused {
        epoch: u64,
        holder: Option<String>,
        reason: String,
    },
    Current {
        epoch: u64,
        holder: Option<String>,
    },
    /// The request could not be served (wrong cluster, the state file cannot be written).
    Error {
        message: String,
    },
    /// An election for `epoch` is open: record it, stop older streams, then `Promise`.
    Prepare {
        epoch: u64,
    },
    /// The promise is counted; the epoch is not granted yet.
    Waiting {
        epoch: u64,
        heard: u32,
        needed: u32,
        reason: String,
    },
    /// The Hello is accepted: requests may follow.
    Welcome {
        version: u32,
    },
}
