//! Arbitrary bytes into what `stela mount` reads at start: the backing directory's snapshot
//! (`Tree::decode`) and the log's records (MessagePack `FsRecord`s) replayed onto a tree.
//!
//! Oracles:
//! - never panics, whatever the snapshot bytes or the records' fields (offsets near u64::MAX,
//!   inodes that do not exist, removals of the root, link counts at zero);
//! - a snapshot that decodes re-encodes to bytes that decode to the same tree;
//! - a record that does not fit is an `Inconsistent` error, after which nothing more is applied
//!   (as the mount and the materialiser stop).
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_mount::record::FsRecord;
use stela_mount::tree::Tree;

fuzz_target!(|data: &[u8]| {
    if let Ok(tree) = Tree::decode(data) {
        let again = Tree::decode(&tree.encode()).expect("a re-encoded snapshot decodes");
        assert_eq!(again, tree);
    }
    let Ok(records) = rmp_serde::from_slice::<Vec<FsRecord>>(data) else {
        return;
    };
    let mut tree = Tree::new(0, 0);
    for (i, record) in records.iter().enumerate() {
        if tree.apply(i as u64 + 1, record).is_err() {
            break;
        }
    }
    let _ = tree.encode();
});
