//! Arbitrary bytes as a stela-store log-archive run file.
//!
//! Oracles:
//! - never panics: every malformed run is an `Err`;
//! - a run that decodes is consistent with its index: each page the index names decodes, on its
//!   own stretch, to exactly the entries the whole-run decode gave for it;
//! - a page looked up as a reader does after open (the summary, then the one index block that
//!   would hold it) is found where the whole index says, and so is a page the run lacks;
//! - a run that decodes encodes again (same range, same entries) to bytes that decode to the
//!   same index and entries (the payload bytes may differ: MessagePack has several encodings of
//!   one value, and the encoder picks the shortest).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::Lsn;
use stela_store::format::{
    decode_block, decode_entries, decode_entries_within, decode_run, decode_run_summary,
    encode_run, IndexLayout, Pages,
};

fuzz_target!(|bytes: &[u8]| {
    let Ok((index, pages, entries)) = decode_run(bytes) else {
        return;
    };
    let summary = decode_run_summary(bytes).expect("a run that decodes has a summary");
    let through_block = |page: u64| match (&summary.layout, summary.block_for(page)) {
        (IndexLayout::Whole(whole), _) => whole.locate(page),
        (IndexLayout::Blocked(_), None) => None,
        (IndexLayout::Blocked(_), Some(block)) => {
            let span = summary.block_span(block);
            let block: Pages = decode_block(
                &summary,
                block,
                &bytes[span.start as usize..span.end as usize],
            )
            .expect("a block of a run that decodes decodes");
            block.locate(page)
        }
    };
    for page in &pages.pages {
        let (stretch, count) = pages.locate(page.page).expect("an indexed page is found");
        assert_eq!(through_block(page.page), Some((stretch.clone(), count)));
        if let Some(absent) = page.page.checked_add(1) {
            assert_eq!(through_block(absent), pages.locate(absent));
        }
        let alone = decode_entries(
            &bytes[stretch.start as usize..stretch.end as usize],
            stretch.start,
            page.page,
            count,
            index.range,
        )
        .expect("a page's stretch decodes alone as it did within the run");
        let within: Vec<_> = entries
            .iter()
            .filter(|e| e.page == page.page)
            .cloned()
            .collect();
        assert_eq!(alone, within);
        // A window over the page's history: exactly its entries, the rest only checked.
        if let Some(middle) = within.get(within.len() / 2) {
            let wanted = middle.lsn..=Lsn::MAX;
            let tail = decode_entries_within(
                &bytes[stretch.start as usize..stretch.end as usize],
                stretch.start,
                page.page,
                count,
                index.range,
                wanted.clone(),
            )
            .expect("a window of a stretch that decodes whole decodes");
            let expected: Vec<_> = within
                .iter()
                .filter(|e| wanted.contains(&e.lsn))
                .cloned()
                .collect();
            assert_eq!(tail, expected);
        }
    }
    let again = encode_run(index.range, entries.clone()).expect("decoded entries encode");
    let (index_again, _, entries_again) = decode_run(&again).expect("a re-encoded run decodes");
    assert_eq!(index_again.range, index.range);
    assert_eq!(index_again.entries, index.entries);
    assert_eq!(entries_again, entries);
});
