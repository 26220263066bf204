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
//! entry carries a checksum of its header and payload, and the header, index and trailer share
//! one checksum; the index names every page of the run once, ascending, at the offset of its
//! first entry. Any input that breaks one of them is a [`RunError`], never a panic: the decoder
//! is fuzzed (`fuzz/fuzz_targets/store_archive_run.rs`).
//!
//! ```text
//! header, 32 bytes, integers little-endian:
//!   0   8   magic "STELARUN"
//!   8   4   layout version: 1
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
//! trailer, the last 32 bytes:
//!   0   8   index offset
//!   8   8   pages in the index
//!   16  8   entries in the run
//!   24  4   CRC32C of the header, the index and trailer bytes 0..24
//!   28  4   magic "RUNE"
//! ```

use crate::format::{LogBody, LogRecord, RecordError};
use crate::page::PageId;
use stela_format::Lsn;

pub const HEADER_LEN: usize = 32;
pub const TRAILER_LEN: usize = 32;
const ENTRY_HEADER_LEN: usize = 24;
const INDEX_ENTRY_LEN: usize = 20;
const MAGIC: &[u8; 8] = b"STELARUN";
const TRAILER_MAGIC: &[u8; 4] = b"RUNE";
const VERSION: u32 = 1;
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

/// A run's header, index and counts: everything a reader keeps in memory to find a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunIndex {
    pub range: RunRange,
    pub pages: Vec<IndexEntry>,
    /// Where the index starts (the entries end there).
    pub index_offset: u64,
    pub entries: u64,
}

impl RunIndex {
    /// The byte range of `page`'s entries, and how many there are.
    pub fn locate(&self, page: PageId) -> Option<(std::ops::Range<u64>, u32)> {
        let at = self.pages.binary_search_by_key(&page, |e| e.page).ok()?;
        let end = self
            .pages
            .get(at + 1)
            .map_or(self.index_offset, |next| next.offset);
        Some((self.pages[at].offset..end, self.pages[at].entries))
    }
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
            .iter()
            .any(|&(p, _)| p == page)
            .then(|| record.clone()),
    }
}

/// The entries of `record` at `lsn`: one per page it changes (none for other records).
pub fn entries_of(lsn: Lsn, record: &LogRecord) -> Vec<Entry> {
    record
        .pages()
        .into_iter()
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
    for page in &index {
        out.extend_from_slice(&page.page.to_le_bytes());
        out.extend_from_slice(&page.offset.to_le_bytes());
        out.extend_from_slice(&page.entries.to_le_bytes());
    }
    let mut trailer = [0u8; TRAILER_LEN];
    trailer[..8].copy_from_slice(&index_offset.to_le_bytes());
    trailer[8..16].copy_from_slice(&(index.len() as u64).to_le_bytes());
    trailer[16..24].copy_from_slice(&(entries.len() as u64).to_le_bytes());
    let crc = summary_crc(&out[..HEADER_LEN], &out[index_offset as usize..], &trailer);
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

/// Where the index of a run of `file_len` bytes is, read from its trailer: the byte range of
/// the index (what [`decode_index`] needs besides the header and the trailer).
///
/// # Errors
/// [`RunError`] when the trailer cannot belong to a run of this length.
pub fn index_span(file_len: u64, trailer: &[u8]) -> Result<std::ops::Range<u64>, RunError> {
    if file_len < (HEADER_LEN + TRAILER_LEN) as u64 || trailer.len() != TRAILER_LEN {
        return Err(RunError::TooShort { len: file_len });
    }
    let trailer_at = file_len - TRAILER_LEN as u64;
    if &trailer[28..] != TRAILER_MAGIC {
        return Err(RunError::BadMagic {
            offset: trailer_at + 28,
        });
    }
    let index_offset = u64_at(trailer, 0);
    let pages = u64_at(trailer, 8);
    let index_len = pages.checked_mul(INDEX_ENTRY_LEN as u64);
    match index_len.and_then(|len| index_offset.checked_add(len)) {
        Some(end) if end == trailer_at && index_offset >= HEADER_LEN as u64 => {
            Ok(index_offset..end)
        }
        _ => Err(RunError::Malformed {
            offset: trailer_at,
            what: "the index does not end where the trailer starts",
        }),
    }
}

/// Decodes a run's header, index and trailer (the index found with [`index_span`]), checking
/// their shared checksum and that the index is ascending and inside the entries' area.
///
/// # Errors
/// [`RunError`] naming what is wrong; never panics, whatever the bytes.
pub fn decode_index(header: &[u8], index: &[u8], trailer: &[u8]) -> Result<RunIndex, RunError> {
    if header.len() != HEADER_LEN || trailer.len() != TRAILER_LEN {
        return Err(RunError::TooShort {
            len: (header.len() + index.len() + trailer.len()) as u64,
        });
    }
    if &header[..8] != MAGIC {
        return Err(RunError::BadMagic { offset: 0 });
    }
    let index_offset = u64_at(trailer, 0);
    let trailer_at = index_offset.saturating_add(index.len() as u64);
    if u32_at(trailer, 24) != summary_crc(header, index, trailer) {
        return Err(RunError::Checksum {
            offset: trailer_at + 24,
        });
    }
    let version = u32_at(header, 8);
    if version != VERSION {
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
    let index_len = u64_at(trailer, 8).checked_mul(INDEX_ENTRY_LEN as u64);
    if index_len != Some(index.len() as u64) {
        return Err(malformed(
            trailer_at + 8,
            "the index length is not its page count",
        ));
    }
    let entries = u64_at(trailer, 16);
    let mut pages: Vec<IndexEntry> = Vec::with_capacity(index.len() / INDEX_ENTRY_LEN);
    let mut counted = 0u64;
    for (i, raw) in index.chunks_exact(INDEX_ENTRY_LEN).enumerate() {
        let at = index_offset.saturating_add((i * INDEX_ENTRY_LEN) as u64);
        let entry = IndexEntry {
            page: u64_at(raw, 0),
            offset: u64_at(raw, 8),
            entries: u32_at(raw, 16),
        };
        // Each entry takes at least its header, so a page's stretch must be long enough.
        let next_offset = pages.last().map_or(HEADER_LEN as u64, |p| {
            p.offset
                .saturating_add(u64::from(p.entries) * ENTRY_HEADER_LEN as u64)
        });
        let ascending = pages.last().is_none_or(|p| p.page < entry.page);
        let first_at_start = !pages.is_empty() || entry.offset == HEADER_LEN as u64;
        if !ascending || !first_at_start || entry.offset < next_offset || entry.entries == 0 {
            return Err(malformed(
                at,
                "the index is not ascending or overlaps itself",
            ));
        }
        // At most u32::MAX * 24 added to an offset below the index: no overflow.
        if entry
            .offset
            .saturating_add(u64::from(entry.entries) * ENTRY_HEADER_LEN as u64)
            > index_offset
        {
            return Err(malformed(at, "the index points past the entries"));
        }
        counted += u64::from(entry.entries);
        pages.push(entry);
    }
    if counted != entries || (pages.is_empty() && index_offset != HEADER_LEN as u64) {
        return Err(malformed(
            trailer_at + 16,
            "the entry count disagrees with the index",
        ));
    }
    Ok(RunIndex {
        range,
        pages,
        index_offset,
        entries,
    })
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

/// Decodes a whole run held in memory: its index and every entry (a merge reads runs this
/// way, and the fuzz target).
///
/// # Errors
/// [`RunError`]; never panics, whatever the bytes.
pub fn decode_run(bytes: &[u8]) -> Result<(RunIndex, Vec<Entry>), RunError> {
    let len = bytes.len() as u64;
    if bytes.len() < HEADER_LEN + TRAILER_LEN {
        return Err(RunError::TooShort { len });
    }
    let trailer = &bytes[bytes.len() - TRAILER_LEN..];
    let span = index_span(len, trailer)?;
    let index = decode_index(
        &bytes[..HEADER_LEN],
        &bytes[span.start as usize..span.end as usize],
        trailer,
    )?;
    let mut entries = Vec::with_capacity(index.entries.min(len / ENTRY_HEADER_LEN as u64) as usize);
    for page in &index.pages {
        let (stretch, count) = index.locate(page.page).expect("an indexed page");
        entries.extend(decode_entries(
            &bytes[stretch.start as usize..stretch.end as usize],
            stretch.start,
            page.page,
            count,
            index.range,
        )?);
    }
    Ok((index, entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{PageImage, SYSTEM_TXN};
    use crate::page::{Leaf, Node};
    use proptest::prelude::*;

    fn write(page: PageId, key: u8) -> LogRecord {
        LogRecord {
            txn: 1,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::Write {
                page,
                prev_page_lsn: Lsn::ZERO,
                key: vec![key],
                before: None,
                after: Some(vec![key; 3]),
            },
        }
    }

    fn split(pages: &[PageId]) -> LogRecord {
        LogRecord {
            txn: SYSTEM_TXN,
            prev_txn_lsn: Lsn::ZERO,
            body: LogBody::Structure {
                pages: pages
                    .iter()
                    .map(|&page| PageImage {
                        page,
                        prev_page_lsn: Lsn::ZERO,
                        node: Node::Leaf(Leaf {
                            entries: vec![(vec![page as u8], vec![1])],
                        }),
                    })
                    .collect(),
            },
        }
    }

    /// Records at LSNs `first..`, each a write to one page or a split of several.
    fn records() -> impl Strategy<Value = Vec<LogRecord>> {
        let one = prop_oneof![
            (0u64..6, any::<u8>()).prop_map(|(page, key)| write(page, key)),
            proptest::sample::subsequence(vec![1u64, 2, 3, 4, 5], 1..4).prop_map(|p| split(&p)),
        ];
        proptest::collection::vec(one, 0..40)
    }

    fn entries(first: u64, records: &[LogRecord]) -> Vec<Entry> {
        records
            .iter()
            .enumerate()
            .flat_map(|(i, r)| entries_of(Lsn::new(first + i as u64), r))
            .collect()
    }

    fn sorted(mut entries: Vec<Entry>) -> Vec<Entry> {
        entries.sort_by_key(|e| (e.page, e.lsn));
        entries
    }

    proptest! {
        #[test]
        fn a_run_round_trips_and_every_page_is_found_by_its_index(
            first in 1u64..1000, records in records(),
        ) {
            let range = RunRange { first: Lsn::new(first), last: Lsn::new(first + records.len() as u64) };
            let entries = entries(first, &records);
            let bytes = encode_run(range, entries.clone()).unwrap();
            let (index, decoded) = decode_run(&bytes).unwrap();
            prop_assert_eq!(index.range, range);
            prop_assert_eq!(&decoded, &sorted(entries.clone()));
            for page in 0..7u64 {
                let expected: Vec<&Entry> = decoded.iter().filter(|e| e.page == page).collect();
                match index.locate(page) {
                    None => prop_assert!(expected.is_empty()),
                    Some((stretch, count)) => {
                        let found = decode_entries(
                            &bytes[stretch.start as usize..stretch.end as usize],
                            stretch.start, page, count, range,
                        ).unwrap();
                        prop_assert_eq!(found.iter().collect::<Vec<_>>(), expected);
                    }
                }
            }
        }

        #[test]
        fn a_window_decodes_exactly_the_entries_in_it_and_still_checks_the_rest(
            records in records(), from in 0u64..45, width in 0u64..45, bit in any::<prop::sample::Index>(),
        ) {
            let range = RunRange { first: Lsn::new(1), last: Lsn::new(1 + records.len() as u64) };
            let bytes = encode_run(range, entries(1, &records)).unwrap();
            let (index, decoded) = decode_run(&bytes).unwrap();
            let wanted = Lsn::new(from)..=Lsn::new(from + width);
            for page in &index.pages {
                let (stretch, count) = index.locate(page.page).unwrap();
                let stretch_bytes = &bytes[stretch.start as usize..stretch.end as usize];
                let found = decode_entries_within(
                    stretch_bytes, stretch.start, page.page, count, range, wanted.clone(),
                ).unwrap();
                let expected: Vec<Entry> = decoded
                    .iter()
                    .filter(|e| e.page == page.page && wanted.contains(&e.lsn))
                    .cloned()
                    .collect();
                prop_assert_eq!(found, expected);
                // A flipped bit anywhere in the stretch, in or out of the window, is refused.
                let mut flipped = stretch_bytes.to_vec();
                let bit = bit.index(flipped.len() * 8);
                flipped[bit / 8] ^= 1 << (bit % 8);
                prop_assert!(decode_entries_within(
                    &flipped, stretch.start, page.page, count, range, wanted.clone(),
                ).is_err(), "bit {} of page {}'s stretch not caught", bit, page.page);
            }
        }

        #[test]
        fn every_flipped_bit_of_a_run_is_refused(
            records in records(), bit in any::<prop::sample::Index>(),
        ) {
            let range = RunRange { first: Lsn::new(1), last: Lsn::new(1 + records.len() as u64) };
            let entries = entries(1, &records);
            let mut bytes = encode_run(range, entries).unwrap();
            let bit = bit.index(bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            // Every byte is covered by a checksum: a flipped bit is always caught.
            prop_assert!(decode_run(&bytes).is_err(), "bit {} not caught", bit);
        }
    }

    #[test]
    fn a_split_is_stored_once_per_page_as_that_pages_part() {
        let record = split(&[2, 4]);
        let entries = entries_of(Lsn::new(9), &record);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].record.pages(), vec![(2, Lsn::ZERO)]);
        assert_eq!(entries[1].record.pages(), vec![(4, Lsn::ZERO)]);
        assert!(record_for_page(&record, 3).is_none());
        let range = RunRange {
            first: Lsn::new(10),
            last: Lsn::new(10),
        };
        assert!(
            encode_run(range, entries).is_err(),
            "LSN 9 is outside 10..=10"
        );
        assert!(matches!(
            decode_run(&[0u8; 63]),
            Err(RunError::TooShort { len: 63 })
        ));
    }
}
