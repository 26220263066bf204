//! stela-proto: the bytes between a stela client and the `stela serve` daemon.
//!
//! Pure: this crate encodes and decodes, it never touches a socket. The server and the client
//! crates do the I/O with the functions here, and the fuzz target feeds them arbitrary bytes.
//!
//! - [`frame`]: the length + CRC32C envelope around every message, and its limits.
//! - [`message`]: requests, responses, durability levels, error codes, the status report.
//! - [`repl`]: what a primary daemon and its standby say to each other (log shipping).
//! - [`witness`]: what a node of a failover pair and the witness say to each other.
//! - [`ring`]: the shared-memory ring a client on the same machine commits through: the layout
//!   of its region, the entry codec, and the checks the daemon makes on its private copy.
//!
//! The protocol is specified in `docs/PROTOCOL.md`; [`PROTOCOL_VERSION`] names the revision.

pub mod frame;
pub mod message;
pub mod repl;
pub mod ring;
pub mod witness;

pub use frame::{FrameError, FRAME_HEADER_BYTES, MAX_FRAME_BYTES, MAX_HELLO_FRAME_BYTES};
pub use message::*;

/// The protocol revision this crate speaks. A client states it in its `Hello`; a daemon that
/// speaks another revision answers with [`ErrorCode::UnsupportedVersion`] and closes.
pub const PROTOCOL_VERSION: u32 = 3;
