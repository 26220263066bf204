//! Arbitrary bytes decoded as a term history (`stela_format::term::TermHistory::decode`, the
//! encoding in a log's `TERMS` file and in `docs/FORMAT.md`), and the divergence point of what
//! decodes against itself and against a fixed history.
//!
//! Oracles: never panics; what decodes keeps the invariants (terms strictly increasing from 1,
//! first LSNs never decreasing and at least 1) and re-encodes to exactly the input; the
//! divergence of a history with itself is its end, and `divergence` is symmetric.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::term::{divergence, Term, TermHistory};

fuzz_target!(|data: &[u8]| {
    let Ok(history) = TermHistory::decode(data) else {
        return;
    };
    assert_eq!(
        history.encode(),
        data,
        "what decodes re-encodes to the input"
    );
    let entries = history.entries();
    for pair in entries.windows(2) {
        assert!(pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1);
    }
    assert!(entries.iter().all(|&(t, f)| t > Term(0) && f >= 1));
    let end = entries
        .last()
        .map_or(0, |&(_, f)| f.saturating_add(10).min(u64::MAX - 1));
    assert_eq!(divergence((&history, end), (&history, end)), end);
    let other = TermHistory::from_entries([(Term(1), 1), (Term(3), 20)]).unwrap();
    assert_eq!(
        divergence((&history, end), (&other, 30)),
        divergence((&other, 30), (&history, end))
    );
});
