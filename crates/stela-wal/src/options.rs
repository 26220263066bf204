//! How a log is opened: codec, sync policy, segment size, what to do about damage.

use crate::storage::{StdStorage, Storage};
use std::sync::Arc;
use stela_format::Codec;

/// What "durable" means for `commit`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// `commit` returns once the record is fdatasync'ed: it survives a crash of the process, of
    /// the OS and a power cut. Concurrent committers share one fdatasync (group commit).
    Data,
    /// `commit` returns once the record is handed to the OS (written, never synced): it survives
    /// a crash of the process but not of the OS or the power. This is a DBMS's "asynchronous
    /// commit" and the baseline for benchmarks.
    None,
}

/// What to do when the log is damaged in the middle (a torn tail is always repaired).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Refuse to open, naming the segment and offset. Nothing on disk is changed.
    Strict,
    /// Keep the records before the first damage and cut everything after it. The cut bytes and
    /// segments are moved into a `salvage-<unix-ms>/` folder of the log directory first.
    KeepValidPrefix,
    /// Open anyway and skip damaged stretches: readers resume at the next valid record, so the
    /// LSNs they see have gaps. Nothing on disk is changed.
    SkipCorrupt,
}

/// Options for [`crate::Wal::open`] and [`crate::Log::open`].
#[derive(Clone, Debug)]
pub struct WalOptions {
    pub codec: Codec,
    /// MessagePack only: write structs as maps of their field names, so `stela wal dump` shows
    /// them, at the cost of the names' bytes in every record (see FORMAT.md). Off by default.
    pub field_names: bool,
    pub sync: SyncMode,
    /// Size of each segment file, preallocated when the segment is created.
    pub segment_bytes: u64,
    /// Largest record payload accepted, in bytes (at most the segment size minus headers).
    pub max_record_bytes: usize,
    /// Buffered (uncommitted) bytes above which an appender writes them to the OS itself, so a
    /// long run of appends without commit does not grow memory without bound.
    pub write_buffer_bytes: usize,
    /// How far ahead of the data the newest segment is filled with written zeros (0: never).
    /// A preallocated segment is space the file system has reserved but marked unwritten; the
    /// first write into each part of it changes the file's extent map, which the next
    /// fdatasync must then write too, before the data's cache flush. Zeros written ahead in
    /// bulk, synced with an earlier round, leave a commit's fdatasync only the data to write.
    pub zero_ahead_bytes: u64,
    pub recovery: RecoveryMode,
    /// Verify every segment at open (true), or only the last one (false: faster open of long
    /// logs; damage in older segments is then reported by the reader that reaches it).
    pub verify_on_open: bool,
    /// Name of the record type stored in the header; defaults to the type name without module paths (`stela_format::default_type_tag`).
    pub type_tag: Option<String>,
    pub create_if_missing: bool,
    pub storage: Arc<dyn Storage>,
}

impl Default for WalOptions {
    fn default() -> WalOptions {
        WalOptions {
            codec: Codec::MessagePack,
            field_names: false,
            sync: SyncMode::Data,
            segment_bytes: 64 << 20,
            max_record_bytes: 16 << 20,
            write_buffer_bytes: 1 << 20,
            zero_ahead_bytes: 1 << 20,
            recovery: RecoveryMode::Strict,
            verify_on_open: true,
            type_tag: None,
            create_if_missing: true,
            storage: Arc::new(StdStorage),
        }
    }
}

impl WalOptions {
    pub fn codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// MessagePack structs as maps with their field names (see [`WalOptions::field_names`]).
    pub fn field_names(mut self, on: bool) -> Self {
        self.field_names = on;
        self
    }
    pub fn sync(mut self, sync: SyncMode) -> Self {
        self.sync = sync;
        self
    }
    pub fn segment_bytes(mut self, bytes: u64) -> Self {
        self.segment_bytes = bytes;
        self
    }
    pub fn max_record_bytes(mut self, bytes: usize) -> Self {
        self.max_record_bytes = bytes;
        self
    }
    pub fn write_buffer_bytes(mut self, bytes: usize) -> Self {
        self.write_buffer_bytes = bytes;
        self
    }
    pub fn zero_ahead_bytes(mut self, bytes: u64) -> Self {
        self.zero_ahead_bytes = bytes;
        self
    }
    pub fn recovery(mut self, mode: RecoveryMode) -> Self {
        self.recovery = mode;
        self
    }
    pub fn verify_on_open(mut self, verify: bool) -> Self {
        self.verify_on_open = verify;
        self
    }
    pub fn type_tag(mut self, tag: impl Into<String>) -> Self {
        self.type_tag = Some(tag.into());
        self
    }
    pub fn create_if_missing(mut self, create: bool) -> Self {
        self.create_if_missing = create;
        self
    }
    pub fn storage(mut self, storage: Arc<dyn Storage>) -> Self {
        self.storage = storage;
        self
    }

    /// The largest payload that fits, given the segment size.
    pub(crate) fn effective_max_record(&self) -> usize {
        let room = self.segment_bytes.saturating_sub(
            (stela_format::header::HEADER_BYTES + stela_format::frame::HEADER_BYTES) as u64,
        );
        self.max_record_bytes
            .min(usize::try_from(room).unwrap_or(usize::MAX))
            .min(stela_format::frame::MAX_PAYLOAD_BYTES as usize)
    }
}
