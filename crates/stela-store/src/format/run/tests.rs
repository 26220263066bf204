//! Tests of the parent module.

use super::*;
use crate::format::page::{Leaf, Node};
use crate::format::record::{PageImage, SYSTEM_TXN};
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

/// Records that write to many pages: runs whose index has several blocks.
fn many_pages() -> impl Strategy<Value = Vec<LogRecord>> {
    let page = 0u64..(INDEX_BLOCK_PAGES as u64 * 5);
    proptest::collection::vec((page, any::<u8>()).prop_map(|(p, k)| write(p, k)), 0..900)
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
        let (index, pages, decoded) = decode_run(&bytes).unwrap();
        prop_assert_eq!(index.range, range);
        prop_assert_eq!(&decoded, &sorted(entries.clone()));
        for page in 0..7u64 {
            let expected: Vec<&Entry> = decoded.iter().filter(|e| e.page == page).collect();
            match pages.locate(page) {
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
        let (_, pages, decoded) = decode_run(&bytes).unwrap();
        let wanted = Lsn::new(from)..=Lsn::new(from + width);
        for page in &pages.pages {
            let (stretch, count) = pages.locate(page.page).unwrap();
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
        records in prop_oneof![records(), many_pages()],
        version_1 in any::<bool>(),
        bit in any::<prop::sample::Index>(),
    ) {
        let range = RunRange { first: Lsn::new(1), last: Lsn::new(1 + records.len() as u64) };
        let entries = entries(1, &records);
        let mut bytes = encode_run(range, entries).unwrap();
        if version_1 {
            bytes = to_version_1(&bytes);
        }
        let bit = bit.index(bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        // Every byte is covered by a checksum: a flipped bit is always caught.
        prop_assert!(decode_run(&bytes).is_err(), "bit {} not caught", bit);
    }

    #[test]
    fn a_page_is_found_through_its_index_block_as_in_the_whole_index(
        records in many_pages(), bit in any::<prop::sample::Index>(),
    ) {
        let range = RunRange { first: Lsn::new(1), last: Lsn::new(1 + records.len() as u64) };
        let bytes = encode_run(range, entries(1, &records)).unwrap();
        let (index, pages, _) = decode_run(&bytes).unwrap();
        // What a reader holds after open: the summary alone.
        let summary = decode_run_summary(&bytes).unwrap();
        prop_assert_eq!(&summary, &index);
        prop_assert_eq!(index.blocks() as u64, index.pages.div_ceil(INDEX_BLOCK_PAGES as u64));
        for page in 0..(INDEX_BLOCK_PAGES as u64 * 5 + 1) {
            let found = match summary.block_for(page) {
                None => None,
                Some(block) => {
                    let span = summary.block_span(block);
                    let block_bytes = &bytes[span.start as usize..span.end as usize];
                    decode_block(&summary, block, block_bytes).unwrap().locate(page)
                }
            };
            prop_assert_eq!(found, pages.locate(page), "page {}", page);
        }
        // A flipped bit in a block is caught when the block is read, not only by a whole
        // decode.
        if summary.blocks() > 0 {
            let block = bit.index(summary.blocks());
            let span = summary.block_span(block);
            let mut block_bytes = bytes[span.start as usize..span.end as usize].to_vec();
            let bit = bit.index(block_bytes.len() * 8);
            block_bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode_block(&summary, block, &block_bytes).is_err());
        }
    }

    #[test]
    fn a_version_1_run_reads_as_the_version_2_run_it_was_made_from(records in many_pages()) {
        let range = RunRange { first: Lsn::new(1), last: Lsn::new(1 + records.len() as u64) };
        let bytes = encode_run(range, entries(1, &records)).unwrap();
        let (index, pages, decoded) = decode_run(&bytes).unwrap();
        let old = to_version_1(&bytes);
        let (old_index, old_pages, old_decoded) = decode_run(&old).unwrap();
        prop_assert_eq!(old_index.layout, IndexLayout::Whole(pages.clone()));
        prop_assert_eq!((old_index.range, old_index.pages, old_index.entries),
            (index.range, index.pages, index.entries));
        prop_assert_eq!(old_pages, pages);
        prop_assert_eq!(old_decoded, decoded);
    }
}

#[test]
fn a_split_is_stored_once_per_page_as_that_pages_part() {
    let record = split(&[2, 4]);
    let entries = entries_of(Lsn::new(9), &record);
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0].record.pages().collect::<Vec<_>>(),
        vec![(2, Lsn::ZERO)]
    );
    assert_eq!(
        entries[1].record.pages().collect::<Vec<_>>(),
        vec![(4, Lsn::ZERO)]
    );
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
