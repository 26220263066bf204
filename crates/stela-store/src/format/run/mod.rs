//! The bytes of one log-archive run file. Pure: bytes in, entries out, no I/O.
//!
//! A run holds the page-changing records of one LSN range of the log, sorted by page id and,
//! for each page, by LSN, so that a page's history in the range is one contiguous stretch that
//! the run's index points at. A record that changes several pages (a split) is stored once per
//! page, reduced to that page's part, so every entry is a record that redo can apply to its
//! page alone.
//!
//! This module owns the layout and keeps these invariants for every run it encodes or accepts:
//! entries are strictly ascending by (page, LSN) and every LSN lies in the run's range; each
//! entry carries a checksum of its header and payload; the index names every page of the run
//! once, ascending, at the offset of its first entry. Any input that breaks one of them is a
//! [`RunError`], never a panic: the decoder is fuzzed (`fuzz/fuzz_targets/store_archive_run.rs`).
//!
//! The index is cut into blocks, each with its own checksum, and a fence per block (its first
//! page, the offset of that page's entries, the block's entry count) sits before the trailer
//! under the header's and trailer's checksum. Opening a run reads its header, fences and
//! trailer: a few kilobytes where the whole index of a run that touched every page of a 1 GB
//! store is megabytes, read cold after a crash, before instant restart's first transaction. A
//! block is read and checked the first time a page in it is looked up ([`decode_block`]).
//! Layout version 1, whose one index is read whole, is still read; runs are written as 2.
//!
//! ```text
//! header, 32 bytes, integers little-endian:
//!   0   8   magic "STELARUN"
//!   8   4   layout version: 2 (1 is still read)
//!   12  4   reserved, zero
//!   16  8   first LSN the run covers
//!   24  8   last LSN the run covers (>= first)
//! entries, from byte 32, ascending by (page, LSN):
//!   0   8   page id
//!   8   8   LSN
//!   16  4   payload length n (at most MAX_PAYLOAD)
//!   20  4   CRC32C of bytes 0..20 of the entry and of the payload
//!   24  n   payload: the record for this page (the log's MessagePack encoding)
//! index, at the trailer's index offset: per page, ascending by page id, 20 bytes:
//!   0   8   page id
//!   8   8   offset of its first entry
//!   16  4   number of its entries
//!   version 2: in blocks of INDEX_BLOCK_PAGES pages (the last may hold fewer), each followed
//!   by the CRC32C of its index entries (4 bytes)
//! fences (version 2 only), right after the index: per block, 24 bytes:
//!   0   8   its first page id
//!   8   8   the offset of that page's first entry
//!   16  8   the entries of the block's pages
//! trailer, the last 32 bytes:
//!   0   8   index offset
//!   8   8   pages in the index
//!   16  8   entries in the run
//!   24  4   CRC32C of the header, the index (version 1) or the fences (version 2), and
//!           trailer bytes 0..24
//!   28  4   magic "RUNE"
//! ```

use crate::format::page::PageId;
use crate::format::record::{LogBody, LogRecord, RecordError};
use stela_format::Lsn;

pub const HEADER_LEN: usize = 32;
pub const TRAILER_LEN: usize = 32;
const ENTRY_HEADER_LEN: usize = 24;
const INDEX_ENTRY_LEN: usize = 20;
const FENCE_LEN: usize = 24;
const BLOCK_CRC_LEN: usize = 4;
/// Pages per index block of a version-2 run: a block and its checksum fill 4,084 bytes, so
/// looking a page up costs one read of at most two file-system pages.
pub const INDEX_BLOCK_PAGES: usize = 204;
const MAGIC: &[u8; 8] = b"STELARUN";
const TRAILER_MAGIC: &[u8; 4] = b"RUNE";
/// Layout versions: 1 holds one index checked with the header; 2 holds index blocks and fences.
const VERSION_WHOLE_INDEX: u32 = 1;
const VERSION: u32 = 2;
/// Larger than any record the store writes for one page (a page image plus a little), small
/// enough that a damaged length cannot make a reader allocate much.
pub const MAX_PAYLOAD: usize = 64 * 1024;

/// One entry: the record at `lsn`, reduced to what it does to `page`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub page: PageId,
    pub lsn: Lsn,
    pub record: LogRecord,
}

/// A run's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRange {
    pub first: Lsn,
    pub last: Lsn,
}

/// Where a page's entries are in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry {
    pub page: PageId,
    pub offset: u64,
    pub entries: u32,
}

/// Consecutive entries of a run's page index (all of it, or one block), and where the
/// stretch of the last page they name ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pages {
    pub pages: Vec<IndexEntry>,
    pub end: u64,
}

impl Pages {
    /// The byte range of `page`'s entries, and how many there are.
    pub fn locate(&self, page: PageId) -> Option<(std::ops::Range<u64>, u32)> {
        let at = self.pages.binary_search_by_key(&page, |e| e.page).ok()?;
        let end = self.pages.get(at + 1).map_or(self.end, |next| next.offset);
        Some((self.pages[at].offset..end, self.pages[at].entries))
    }
}

/// One index block's summary, kept in memory from the open on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The block's first page.
    pub page: PageId,
    /// Where that page's entries start.
    pub offset: u64,
    /// The entries of all the block's pages.
    pub entries: u64,
}

/// How a run's page index is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexLayout {
    /// Version 1: the whole index, read and checked at open.
    Whole(Pages),
    /// Version 2: a fence per block; a block is read when a page in it is looked up.
    Blocked(Vec<Fence>),
}

/// What a reader keeps in memory of a run from its open on: its range, counts, and the index
/// (whole, or its fences).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIndex {
    pub range: RunRange,
    pub layout: IndexLayout,
    /// Where the index starts (the entries end there).
    pub index_offset: u64,
    /// Pages in the index.
    pub pages: u64,
    pub entries: u64,
}

impl RunIndex {
    /// The index block of a version-2 run that would name `page`: `None` if no block can
    /// hold it, or for a version-1 run (its whole index is in the layout).
    pub fn block_for(&self, page: PageId) -> Option<usize> {
        match &self.layout {
            IndexLayout::Whole(_) => None,
            IndexLayout::Blocked(fences) => fences
                .partition_point(|fence| fence.page <= page)
                .checked_sub(1),
        }
    }

    /// The blocks of a version-2 run (0 for version 1).
    pub fn blocks(&self) -> usize {
        match &self.layout {
            IndexLayout::Whole(_) => 0,
            IndexLayout::Blocked(fences) => fences.len(),
        }
    }

    /// The byte range of index block `block` (its entries and checksum).
    pub fn block_span(&self, block: usize) -> std::ops::Range<u64> {
        let full = (INDEX_BLOCK_PAGES * INDEX_ENTRY_LEN + BLOCK_CRC_LEN) as u64;
        let start = self.index_offset + block as u64 * full;
        let pages = block_pages(self.pages, block);
        start..start + (pages * INDEX_ENTRY_LEN + BLOCK_CRC_LEN) as u64
    }

    /// Where the stretch of the last page of block `block` ends: where the next block's first
    /// page starts, or, for the last block, where the entries end.
    fn block_end(&self, block: usize) -> u64 {
        match &self.layout {
            IndexLayout::Blocked(fences) => fences
                .get(block + 1)
                .map_or(self.index_offset, |next| next.offset),
            IndexLayout::Whole(_) => self.index_offset,
        }
    }
}

/// Index blocks of a run of `pages` pages.
fn block_count(pages: u64) -> u64 {
    pages.div_ceil(INDEX_BLOCK_PAGES as u64)
}

/// Pages in block `block` of a run of `pages` pages (0 past the last block).
fn block_pages(pages: u64, block: usize) -> usize {
    let before = (block as u64).saturating_mul(INDEX_BLOCK_PAGES as u64);
    pages.saturating_sub(before).min(INDEX_BLOCK_PAGES as u64) as usize
}

/// Bytes of the index blocks of a run of `pages` pages (no overflow: `pages` is checked
/// against the file's length first).
fn blocks_len(pages: u64) -> u64 {
    pages * INDEX_ENTRY_LEN as u64 + block_count(pages) * BLOCK_CRC_LEN as u64
}

/// Why run bytes were refused. Offsets are from the start of the run file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error("{len} bytes cannot hold a run's header and trailer")]
    TooShort { len: u64 },
    #[error("not a run file (bad magic at offset {offset})")]
    BadMagic { offset: u64 },
    #[error("unknown run layout version {0}")]
    Version(u32),
    #[error("checksum mismatch at offset {offset}")]
    Checksum { offset: u64 },
    #[error("malformed at offset {offset}: {what}")]
    Malformed { offset: u64, what: &'static str },
    #[error("the runs cover the log up to {archived}, and the next records start at {next}")]
    Gap { archived: Lsn, next: Lsn },
    #[error("entry at offset {offset}: {source}")]
    Record {
        offset: u64,
        #[source]
        source: RecordError,
    },
}

/// The part of `record` that changes `page`, as a record of its own: a split keeps only that
/// page's image. `None` if the record does not change the page.
pub fn record_for_page(record: &LogRecord, page: PageId) -> Option<LogRecord> {
    match &record.body {
        LogBody::Structure { pages } => {
            let image = pages.iter().find(|image| image.page == page)?;
            Some(LogRecord {
                body: LogBody::Structure {
                    pages: vec![image.clone()],
                },
                ..record.clone()
            })
        }
        _ => record
            .pages()
            .any(|(p, _)| p == page)
            .then(|| record.clone()),
    }
}

/// The entries of `record` at `lsn`: one per page it changes (none for other records).
pub fn entries_of(lsn: Lsn, record: &LogRecord) -> Vec<Entry> {
    record
        .pages()
        .filter_map(|(page, _)| {
            record_for_page(record, page).map(|record| Entry { page, lsn, record })
        })
        .collect()
}

/// Encodes a run of `range` holding `entries` (in any order; sorted here).
///
/// # Errors
/// [`RunError::Malformed`] if an entry lies outside the range, two entries share a page and an
/// LSN, or a payload is larger than [`MAX_PAYLOAD`]: the caller's bug, refused before it
/// reaches the disk.
pub fn encode_run(range: RunRange, mut entries: Vec<Entry>) -> Result<Vec<u8>, RunError> {
    let bad = |what| RunError::Malformed { offset: 0, what };
    if range.first > range.last || range.first == Lsn::ZERO {
        return Err(bad("a run's range is empty or starts at LSN 0"));
    }
    entries.sort_by_key(|e| (e.page, e.lsn));
    let mut out = Vec::with_capacity(HEADER_LEN + entries.len() * 128 + TRAILER_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&range.first.get().to_le_bytes());
    out.extend_from_slice(&range.last.get().to_le_bytes());
    let mut index: Vec<IndexEntry> = Vec::new();
    let mut previous: Option<(PageId, Lsn)> = None;
    for entry in &entries {
        if entry.lsn < range.first || entry.lsn > range.last {
            return Err(bad("an entry outside the run's range"));
        }
        if previous == Some((entry.page, entry.lsn)) {
            return Err(bad("two entries for one page at one LSN"));
        }
        previous = Some((entry.page, entry.lsn));
        match index.last_mut() {
            Some(last) if last.page == entry.page => last.entries += 1,
            _ => index.push(IndexEntry {
                page: entry.page,
                offset: out.len() as u64,
                entries: 1,
            }),
        }
        let payload = entry.record.encode();
        if payload.len() > MAX_PAYLOAD {
            return Err(bad("a record larger than a run entry may be"));
        }
        let mut head = [0u8; 20];
        head[..8].copy_from_slice(&entry.page.to_le_bytes());
        head[8..16].copy_from_slice(&entry.lsn.get().to_le_bytes());
        head[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        let mut crc = crc32c::crc32c(&head);
        crc = crc32c::crc32c_append(crc, &payload);
        out.extend_from_slice(&head);
        out.extend_from_slice(&crc.to_le_bytes());
        out.extend_from_slice(&payload);
    }
    let index_offset = out.len() as u64;
    let mut fences = Vec::with_capacity(index.len().div_ceil(INDEX_BLOCK_PAGES) * FENCE_LEN);
    for block in index.chunks(INDEX_BLOCK_PAGES) {
        let start = out.len();
        for page in block {
            out.extend_from_slice(&page.page.to_le_bytes());
            out.extend_from_slice(&page.offset.to_le_bytes());
            out.extend_from_slice(&page.entries.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
        let entries: u64 = block.iter().map(|p| u64::from(p.entries)).sum();
        fences.extend_from_slice(&block[0].page.to_le_bytes());
        fences.extend_from_slice(&block[0].offset.to_le_bytes());
        fences.extend_from_slice(&entries.to_le_bytes());
    }
    out.extend_from_slice(&fences);
    let mut trailer = [0u8; TRAILER_LEN];
    trailer[..8].copy_from_slice(&index_offset.to_le_bytes());
    trailer[8..16].copy_from_slice(&(index.len() as u64).to_le_bytes());
    trailer[16..24].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    let crc = summary_crc(&out[..HEADER_LEN], &fences, &trailer);
    trailer[24..28].copy_from_slice(&crc.to_le_bytes());
    trailer[28..].copy_from_slice(TRAILER_MAGIC);
    out.extend_from_slice(&trailer);
    Ok(out)
}

fn summary_crc(header: &[u8], index: &[u8], trailer: &[u8]) -> u32 {
    let crc = crc32c::crc32c(header);
    let crc = crc32c::crc32c_append(crc, index);
    crc32c::crc32c_append(crc, &trailer[..24])
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The bytes between the index offset and the trailer of a run of `file_len` bytes whose
/// header and trailer are given, that [`decode_summary`] checks with them: the whole index
/// (version 1) or the fences (version 2). What a reader reads at open.
///
/// # Errors
/// [`RunError`] when the header and trailer cannot belong to a run of this length.
pub fn summary_span(
    file_len: u64,
    header: &[u8],
    trailer: &[u8],
) -> Result<std::ops::Range<u64>, RunError> {
    if file_len < (HEADER_LEN + TRAILER_LEN) as u64
        || header.len() != HEADER_LEN
        || trailer.len() != TRAILER_LEN
    {
        return Err(RunError::TooShort { len: file_len });
    }
    if &header[..8] != MAGIC {
        return Err(RunError::BadMagic { offset: 0 });
    }
    let trailer_at = file_len - TRAILER_LEN as u64;
    if &trailer[28..] != TRAILER_MAGIC {
        return Err(RunError::BadMagic {
            offset: trailer_at + 28,
        });
    }
    let index_offset = u64_at(trailer, 0);
    let pages = u64_at(trailer, 8);
    let not_there = RunError::Malformed {
        offset: trailer_at,
        what: "the index does not end where the trailer starts",
    };
    // Every page takes an index entry: a count the file cannot hold is refused before any
    // arithmetic on it (which then cannot overflow).
    if index_offset < HEADER_LEN as u64
        || index_offset > trailer_at
        || pages > file_len / INDEX_ENTRY_LEN as u64
    {
        return Err(not_there);
    }
    match u32_at(header, 8) {
        VERSION_WHOLE_INDEX => match index_offset.checked_add(pages * INDEX_ENTRY_LEN as u64) {
            Some(end) if end == trailer_at => Ok(index_offset..end),
            _ => Err(not_there),
        },
        VERSION => {
            let fences_at = index_offset + blocks_len(pages);
            match fences_at.checked_add(block_count(pages) * FENCE_LEN as u64) {
                Some(end) if end == trailer_at => Ok(fences_at..end),
                _ => Err(not_there),
            }
        }
        version => Err(RunError::Version(version)),
    }
}

/// Decodes a run's header, trailer and the bytes [`summary_span`] named, checking their
/// shared checksum; for version 1 that the whole index is ascending and inside the entries'
/// area, for version 2 that the fences are.
///
/// # Errors
/// [`RunError`] naming what is wrong; never panics, whatever the bytes.
pub fn decode_summary(header: &[u8], summary: &[u8], trailer: &[u8]) -> Result<RunIndex, RunError> {
    if header.len() != HEADER_LEN || trailer.len() != TRAILER_LEN {
        return Err(RunError::TooShort {
            len: (header.len() + summary.len() + trailer.len()) as u64,
        });
    }
    if &header[..8] != MAGIC {
        return Err(RunError::BadMagic { offset: 0 });
    }
    let index_offset = u64_at(trailer, 0);
    let pages = u64_at(trailer, 8);
    let entries = u64_at(trailer, 16);
    let version = u32_at(header, 8);
    let summary_at = match version {
        VERSION => index_offset.saturating_add(blocks_len(pages.min(u64::MAX / 64))),
        _ => index_offset,
    };
    let trailer_at = summary_at.saturating_add(summary.len() as u64);
    if u32_at(trailer, 24) != summary_crc(header, summary, trailer) {
        return Err(RunError::Checksum {
            offset: trailer_at + 24,
        });
    }
    if version != VERSION && version != VERSION_WHOLE_INDEX {
        return Err(RunError::Version(version));
    }
    let malformed = |offset, what| RunError::Malformed { offset, what };
    if u32_at(header, 12) != 0 {
        return Err(malformed(12, "reserved header bytes are not zero"));
    }
    let range = RunRange {
        first: Lsn::new(u64_at(header, 16)),
        last: Lsn::new(u64_at(header, 24)),
    };
    if range.first == Lsn::ZERO || range.first > range.last {
        return Err(malformed(16, "the run's LSN range is empty"));
    }
    let count_wrong = malformed(trailer_at + 16, "the entry count disagrees with the index");
    let counts = Counts {
        index_offset,
        pages,
        entries,
        summary_at,
        trailer_at,
    };
    let layout = if version == VERSION_WHOLE_INDEX {
        decode_whole_index(summary, &counts)?
    } else {
        decode_fences(summary, &counts)?
    };
    if pages == 0 && (index_offset != HEADER_LEN as u64 || entries != 0) {
        return Err(count_wrong);
    }
    Ok(RunIndex {
        range,
        layout,
        index_offset,
        pages,
        entries,
    })
}

/// Where a run's summary sits and what its trailer counts, for checking the index against.
struct Counts {
    index_offset: u64,
    pages: u64,
    entries: u64,
    summary_at: u64,
    trailer_at: u64,
}

/// Version 1: the whole index, one entry per page, ascending, inside the entries' area.
fn decode_whole_index(summary: &[u8], counts: &Counts) -> Result<IndexLayout, RunError> {
    let malformed = |offset, what| RunError::Malformed { offset, what };
    let index_len = counts.pages.checked_mul(INDEX_ENTRY_LEN as u64);
    if index_len != Some(summary.len() as u64) {
        return Err(malformed(
            counts.trailer_at + 8,
            "the index length is not its page count",
        ));
    }
    let at = counts.index_offset;
    let (pages, counted) = check_index_entries(summary, at, None, at, None)?;
    if counted != counts.entries {
        return Err(malformed(
            counts.trailer_at + 16,
            "the entry count disagrees with the index",
        ));
    }
    Ok(IndexLayout::Whole(Pages { pages, end: at }))
}

/// Version 2: one fence per index block, ascending by page, each block's entries after the
/// previous one's and before the index.
fn decode_fences(summary: &[u8], counts: &Counts) -> Result<IndexLayout, RunError> {
    let malformed = |offset, what| RunError::Malformed { offset, what };
    let pages = counts.pages;
    if block_count(pages).checked_mul(FENCE_LEN as u64) != Some(summary.len() as u64) {
        return Err(malformed(
            counts.trailer_at + 8,
            "the fences are not one per index block",
        ));
    }
    let mut fences: Vec<Fence> = Vec::with_capacity(summary.len() / FENCE_LEN);
    let mut counted = 0u64;
    for (block, raw) in summary.chunks_exact(FENCE_LEN).enumerate() {
        let at = counts.summary_at.saturating_add((block * FENCE_LEN) as u64);
        let fence = Fence {
            page: u64_at(raw, 0),
            offset: u64_at(raw, 8),
            entries: u64_at(raw, 16),
        };
        // Each page of the block has an entry, and each entry takes at least its header.
        let pages_in_block = block_pages(pages, block) as u64;
        let next_offset = fences.last().map_or(HEADER_LEN as u64, |f| {
            f.offset
                .saturating_add(f.entries.saturating_mul(ENTRY_HEADER_LEN as u64))
        });
        let ascending = fences.last().is_none_or(|f| f.page < fence.page);
        let first_at_start = !fences.is_empty() || fence.offset == HEADER_LEN as u64;
        if !ascending
            || !first_at_start
            || fence.offset < next_offset
            || fence.entries < pages_in_block
            || fence
                .offset
                .saturating_add(fence.entries.saturating_mul(ENTRY_HEADER_LEN as u64))
                > counts.index_offset
        {
            return Err(malformed(
                at,
                "the fences are not ascending, overlap, or point past the entries",
            ));
        }
        counted = counted.saturating_add(fence.entries);
        fences.push(fence);
    }
    if counted != counts.entries {
        return Err(malformed(
            counts.trailer_at + 16,
            "the entry count disagrees with the index",
        ));
    }
    Ok(IndexLayout::Blocked(fences))
}

/// Checks consecutive index entries `raw` read from `at`: ascending by page, each page's
/// stretch after the previous one's and ending by `end`; the first at `first` (a fence's page
/// and offset) or, without one, at the first entry of the run; every page below `below`.
/// Returns them and the entries they count.
fn check_index_entries(
    raw: &[u8],
    at: u64,
    first: Option<(PageId, u64)>,
    end: u64,
    below: Option<PageId>,
) -> Result<(Vec<IndexEntry>, u64), RunError> {
    let mut pages: Vec<IndexEntry> = Vec::with_capacity(raw.len() / INDEX_ENTRY_LEN);
    let mut counted = 0u64;
    for (i, raw) in raw.chunks_exact(INDEX_ENTRY_LEN).enumerate() {
        let here = at.saturating_add((i * INDEX_ENTRY_LEN) as u64);
        let entry = IndexEntry {
            page: u64_at(raw, 0),
            offset: u64_at(raw, 8),
            entries: u32_at(raw, 16),
        };
        let malformed = |what| RunError::Malformed { offset: here, what };
        // Each entry takes at least its header, so a page's stretch must be long enough.
        let next_offset = pages.last().map_or(HEADER_LEN as u64, |p| {
            p.offset
                .saturating_add(u64::from(p.entries) * ENTRY_HEADER_LEN as u64)
        });
        let ascending = pages.last().is_none_or(|p| p.page < entry.page);
        let where_expected = match (pages.is_empty(), first) {
            (false, _) => true,
            (true, None) => entry.offset == HEADER_LEN as u64,
            (true, Some(fence)) => (entry.page, entry.offset) == fence,
        };
        if !ascending || !where_expected || entry.offset < next_offset || entry.entries == 0 {
            return Err(malformed("the index is not ascending or overlaps itself"));
        }
        if below.is_some_and(|below| entry.page >= below) {
            return Err(malformed("an index block holds a page of the next block"));
        }
        // At most u32::MAX * 24 added to an offset below the index: no overflow.
        if entry
            .offset
            .saturating_add(u64::from(entry.entries) * ENTRY_HEADER_LEN as u64)
            > end
        {
            return Err(malformed("the index points past the entries"));
        }
        counted += u64::from(entry.entries);
        pages.push(entry);
    }
    Ok((pages, counted))
}

/// Decodes index block `block` of a version-2 run: `bytes` are the bytes at
/// [`RunIndex::block_span`]. Checks its checksum, that it starts where its fence says, is
/// ascending, stays below the next block's first page and inside the entries' area, and
/// counts the entries its fence says.
///
/// # Errors
/// [`RunError`] naming the offset; never panics, whatever the bytes.
pub fn decode_block(index: &RunIndex, block: usize, bytes: &[u8]) -> Result<Pages, RunError> {
    let IndexLayout::Blocked(fences) = &index.layout else {
        return Err(RunError::Malformed {
            offset: index.index_offset,
            what: "a version-1 run has no index blocks",
        });
    };
    let span = index.block_span(block);
    let Some(fence) = fences.get(block) else {
        return Err(RunError::Malformed {
            offset: span.start,
            what: "no such index block",
        });
    };
    if bytes.len() as u64 != span.end - span.start || bytes.len() < BLOCK_CRC_LEN {
        return Err(RunError::TooShort {
            len: bytes.len() as u64,
        });
    }
    let (raw, crc) = bytes.split_at(bytes.len() - BLOCK_CRC_LEN);
    if crc32c::crc32c(raw) != u32_at(crc, 0) {
        return Err(RunError::Checksum {
            offset: span.end - BLOCK_CRC_LEN as u64,
        });
    }
    let end = index.block_end(block);
    let below = fences.get(block + 1).map(|next| next.page);
    let (pages, counted) = check_index_entries(
        raw,
        span.start,
        Some((fence.page, fence.offset)),
        end,
        below,
    )?;
    if counted != fence.entries {
        return Err(RunError::Malformed {
            offset: span.start,
            what: "an index block counts other entries than its fence",
        });
    }
    Ok(Pages { pages, end })
}

/// The whole page index of a run held in memory: version 1's, or every block of version 2's,
/// each checked.
///
/// # Errors
/// [`RunError`]; never panics, whatever the bytes.
pub fn pages_of<'a>(
    index: &'a RunIndex,
    run: &[u8],
) -> Result<std::borrow::Cow<'a, Pages>, RunError> {
    match &index.layout {
        IndexLayout::Whole(pages) => Ok(std::borrow::Cow::Borrowed(pages)),
        IndexLayout::Blocked(_) => {
            let mut all = Vec::with_capacity(index.pages.min(run.len() as u64) as usize);
            for block in 0..index.blocks() {
                let span = index.block_span(block);
                let Some(bytes) = run.get(span.start as usize..span.end as usize) else {
                    return Err(RunError::TooShort {
                        len: run.len() as u64,
                    });
                };
                all.extend(decode_block(index, block, bytes)?.pages);
            }
            Ok(std::borrow::Cow::Owned(Pages {
                pages: all,
                end: index.index_offset,
            }))
        }
    }
}

/// Decodes the entries of one page: `bytes` is the stretch [`RunIndex::locate`] named, read
/// from `offset`; there must be exactly `count` entries, all of `page`, ascending by LSN
/// within `range`, each intact and each a valid record that changes `page`.
///
/// # Errors
/// [`RunError`] naming the offset; never panics, whatever the bytes.
pub fn decode_entries(
    bytes: &[u8],
    offset: u64,
    page: PageId,
    count: u32,
    range: RunRange,
) -> Result<Vec<Entry>, RunError> {
    decode_entries_within(bytes, offset, page, count, range, Lsn::ZERO..=Lsn::MAX)
}

/// As [`decode_entries`], returning only the entries whose LSN is in `wanted`. Every entry is
/// still checked (its header, checksum, order and range) but the record of an entry outside
/// `wanted` is not decoded: readers that want the end of a long history (a page rebuilt from
/// its image's LSN, a cleaner that lags a little) then pay a checksum, not a MessagePack
/// decode, for each older entry. A merged run spans most of the log, so this is most of it.
///
/// # Errors
/// As [`decode_entries`], except that a record outside `wanted` is not checked as a record.
pub fn decode_entries_within(
    bytes: &[u8],
    offset: u64,
    page: PageId,
    count: u32,
    range: RunRange,
    wanted: std::ops::RangeInclusive<Lsn>,
) -> Result<Vec<Entry>, RunError> {
    let mut out = Vec::with_capacity((count as usize).min(bytes.len() / ENTRY_HEADER_LEN));
    let mut seen = 0usize;
    let mut previous: Option<Lsn> = None;
    let mut at = 0usize;
    while at < bytes.len() {
        let here = offset + at as u64;
        let malformed = |what| RunError::Malformed { offset: here, what };
        if bytes.len() - at < ENTRY_HEADER_LEN {
            return Err(malformed("an entry's header runs past its page's stretch"));
        }
        let head = &bytes[at..at + 20];
        let len = u32_at(head, 16) as usize;
        if len > MAX_PAYLOAD || bytes.len() - at - ENTRY_HEADER_LEN < len {
            return Err(malformed("an entry's payload runs past its page's stretch"));
        }
        let payload = &bytes[at + ENTRY_HEADER_LEN..at + ENTRY_HEADER_LEN + len];
        let crc = crc32c::crc32c_append(crc32c::crc32c(head), payload);
        if crc != u32_at(bytes, at + 20) {
            return Err(RunError::Checksum { offset: here });
        }
        let (entry_page, lsn) = (u64_at(head, 0), Lsn::new(u64_at(head, 8)));
        if entry_page != page {
            return Err(malformed("an entry of another page in this page's stretch"));
        }
        if lsn < range.first || lsn > range.last {
            return Err(malformed("an entry outside the run's range"));
        }
        if previous.is_some_and(|previous| previous >= lsn) {
            return Err(malformed("a page's entries are not ascending by LSN"));
        }
        previous = Some(lsn);
        seen += 1;
        at += ENTRY_HEADER_LEN + len;
        if !wanted.contains(&lsn) {
            continue;
        }
        let record = LogRecord::decode(payload).map_err(|source| RunError::Record {
            offset: here,
            source,
        })?;
        if record_for_page(&record, page).as_ref() != Some(&record) {
            return Err(malformed(
                "an entry's record is not this page's part of a change",
            ));
        }
        out.push(Entry { page, lsn, record });
    }
    if seen != count as usize {
        return Err(RunError::Malformed {
            offset,
            what: "a page has another number of entries than its index says",
        });
    }
    Ok(out)
}

/// Decodes a whole run held in memory: its summary, whole page index and every entry (a
/// merge reads runs this way, and the fuzz target).
///
/// # Errors
/// [`RunError`]; never panics, whatever the bytes.
pub fn decode_run(bytes: &[u8]) -> Result<(RunIndex, Pages, Vec<Entry>), RunError> {
    let index = decode_run_summary(bytes)?;
    let pages = pages_of(&index, bytes)?.into_owned();
    let len = bytes.len() as u64;
    let mut entries = Vec::with_capacity(index.entries.min(len / ENTRY_HEADER_LEN as u64) as usize);
    for page in &pages.pages {
        let (stretch, count) = pages.locate(page.page).expect("an indexed page");
        entries.extend(decode_entries(
            &bytes[stretch.start as usize..stretch.end as usize],
            stretch.start,
            page.page,
            count,
            index.range,
        )?);
    }
    Ok((index, pages, entries))
}

/// The summary of a run held in memory (what a reader reads at open).
///
/// # Errors
/// [`RunError`]; never panics, whatever the bytes.
pub fn decode_run_summary(bytes: &[u8]) -> Result<RunIndex, RunError> {
    let len = bytes.len() as u64;
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(RunError::TooShort { len });
    }
    let header = &bytes[..HEADER_LEN];
    let trailer = &bytes[bytes.len() - TRAILER_LEN..];
    let span = summary_span(len, header, trailer)?;
    decode_summary(
        header,
        &bytes[span.start as usize..span.end as usize],
        trailer,
    )
}

/// The same run in layout version 1 (one index, checked with the header), as runs written
/// before version 2 are (tests of the reader's compatibility).
#[cfg(test)]
pub(crate) fn to_version_1(bytes: &[u8]) -> Vec<u8> {
    let (index, pages, _) = decode_run(bytes).unwrap();
    let mut out = bytes[..index.index_offset as usize].to_vec();
    out[8..12].copy_from_slice(&VERSION_WHOLE_INDEX.to_le_bytes());
    for page in &pages.pages {
        out.extend_from_slice(&page.page.to_le_bytes());
        out.extend_from_slice(&page.offset.to_le_bytes());
        out.extend_from_slice(&page.entries.to_le_bytes());
    }
    let mut trailer = [0u8; TRAILER_LEN];
    trailer[..8].copy_from_slice(&index.index_offset.to_le_bytes());
    trailer[8..16].copy_from_slice(&index.pages.to_le_bytes());
    trailer[16..24].copy_from_slice(&index.entries.to_le_bytes());
    let crc = summary_crc(
        &out[..HEADER_LEN],
        &out[index.index_offset as usize..],
        &trailer,
    );
    trailer[24..28].copy_from_slice(&crc.to_le_bytes());
    trailer[28..].copy_from_slice(TRAILER_MAGIC);
    out.extend_from_slice(&trailer);
    out
}

#[cfg(test)]
mod tests;
