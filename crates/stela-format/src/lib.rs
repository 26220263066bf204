//! The bytes of a stela write-ahead log, and nothing else.
//!
//! This crate is pure: bytes in, values out. It opens no file and makes no system call, so the
//! same code serves the log writer, the recovery scan, the `stela wal` tools, the fuzzers and
//! (later) the wire protocol. `docs/FORMAT.md` at the repository root is the specification; the
//! byte layouts are repeated above the constants that encode them.
//!
//! A tour:
//! - [`lsn`]: the log sequence number, a dense record counter starting at 1.
//! - [`codec`]: how a typed record becomes payload bytes (JSON, MessagePack, postcard).
//! - [`frame`]: how a payload is framed on disk: length, CRC32C, LSN, sync base; and how a
//!   frame is recognised, rejected or found to be cut short, in either layout (version 1 without
//!   the sync base is still read).
//! - [`header`]: the fixed header at the start of every segment file: magic, version (which
//!   says the frame layout), codec, record type, segment sequence and first LSN.
//! - [`segment_name`]: segment file names, which carry the first LSN of the segment.
//! - [`schema`]: a record type's field names (traced from the type), to show compact
//!   MessagePack records with them.
//! - [`synced`]: the synced-end mark (`SYNCED`): how far the newest segment was durable when the
//!   last sync returned, so recovery never calls damage below it a torn write.
//! - [`term`]: terms and a replicated log's term history, its encoding, and the divergence point
//!   of two copies of a log.
//!
//! ```
//! use stela_format::{codec::Codec, frame, lsn::Lsn};
//!
//! let mut disk = Vec::new();
//! let payload = Codec::MessagePack.encode(&("debit", 42u32)).unwrap();
//! // The first record of a segment: nothing in it was synced yet.
//! frame::encode(&mut disk, Lsn::new(1), &payload, frame::MIN_SYNC_BASE);
//! match frame::decode(frame::Layout::V2, &disk) {
//!     frame::Decoded::Record(rec) => {
//!         assert_eq!(rec.lsn, Lsn::new(1));
//!         assert_eq!(rec.sync_base, Some(256));
//!         let value: (String, u32) = Codec::MessagePack.decode(rec.payload).unwrap();
//!         assert_eq!(value, ("debit".to_string(), 42));
//!     }
//!     other => panic!("{other:?}"),
//! }
//! ```

pub mod codec;
pub mod frame;
pub mod header;
pub mod lsn;
pub mod resync;
pub mod schema;
pub mod segment_name;
pub mod synced;
pub mod term;

pub use codec::{Codec, CodecError};
pub use frame::{Decoded, FrameRecord, Layout, Rejection};
pub use header::{default_type_tag, HeaderError, SegmentHeader, TypeTag};
pub use lsn::Lsn;
