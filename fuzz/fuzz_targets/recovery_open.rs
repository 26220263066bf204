//! Arbitrary bytes written as a segment file into the in-memory `FaultStorage`, then opened as a
//! log with each recovery mode, iterated, appended to and reopened.
//!
//! The file is named after the first LSN its header names (as the log names segments), and the
//! log is opened with the codec the header names and the seeds' type tag, so that inputs derived
//! from valid seeds get past the header checks and into recovery proper. The storage is capped
//! at 1 MiB, as a small disk: a header claiming a huge capacity then fails preallocation with
//! ENOSPC instead of exhausting memory.
//!
//! Oracles:
//! - never panics: `verify`, `dump`, every `open`, iteration, append and reopen return errors;
//! - after a successful open in `Strict` or `KeepValidPrefix` mode the log is clean: iteration
//!   yields exactly the LSNs `first_lsn..=last_lsn` of the recovery report, with no error, and
//!   `verify` reports no problem;
//! - an acknowledged record survives: append + commit after recovery, close, reopen in the same
//!   mode, and the record is there, as the last one, at the LSN `append` returned.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;
use std::sync::Arc;
use stela_format::segment_name::segment_file_name;
use stela_format::{Codec, Lsn};
use stela_fuzz::{header_codec, header_start_lsn, Record, SEGMENT_BYTES, TYPE_TAG};
use stela_wal::storage::{FaultStorage, OpenMode, Storage};
use stela_wal::{tools, Log, RecoveryMode, Wal, WalOptions};

const DIR: &str = "/log";
const SPACE_LIMIT: u64 = 1 << 20;

fn storage_with(segment: &[u8]) -> FaultStorage {
    let storage = FaultStorage::new();
    let dir = Path::new(DIR);
    storage.create_dir_all(dir).unwrap();
    let start = header_start_lsn(segment).unwrap_or(Lsn::FIRST);
    let file = storage
        .open(&dir.join(segment_file_name(start)), OpenMode::CreateNew)
        .unwrap();
    file.write_all_at(segment, 0).unwrap();
    file.sync_data().unwrap();
    storage.sync_dir(dir).unwrap();
    storage.set_space_limit(Some(SPACE_LIMIT));
    storage
}

fn options(storage: &FaultStorage, codec: Codec, mode: RecoveryMode) -> WalOptions {
    WalOptions::default()
        .codec(codec)
        .storage(Arc::new(storage.clone()))
        .segment_bytes(SEGMENT_BYTES)
        .max_record_bytes(512)
        .write_buffer_bytes(4096)
        .type_tag(TYPE_TAG)
        .create_if_missing(false)
        .recovery(mode)
}

fuzz_target!(|segment: &[u8]| {
    let codec = header_codec(segment).unwrap_or(Codec::MessagePack);
    let dir = Path::new(DIR);

    // The read-only tools first, on the untouched bytes.
    {
        let storage = storage_with(segment);
        if let Ok(report) = tools::verify(dir, &storage) {
            let _ = report.is_clean();
        }
        let mut sink = Vec::new();
        let _ = tools::dump(dir, Arc::new(storage.clone()), Lsn::FIRST, &mut sink);
    }

    for mode in [
        RecoveryMode::Strict,
        RecoveryMode::KeepValidPrefix,
        RecoveryMode::SkipCorrupt,
    ] {
        let storage = storage_with(segment);
        // Typed, as an application opens it: decodes every payload.
        let Ok(wal) = Wal::<Record>::open(dir, options(&storage, codec, mode)) else {
            continue;
        };
        let report = wal.recovery_report().clone();
        let iter = match wal.iter() {
            Ok(iter) => iter,
            Err(_) => continue,
        };
        let mut lsns = Vec::new();
        let mut read_error = false;
        for item in iter {
            match item {
                Ok((lsn, _record)) => lsns.push(lsn),
                Err(_) => read_error = true,
            }
        }
        assert!(lsns.windows(2).all(|w| w[0] < w[1]), "{mode:?}: {lsns:?}");
        if mode != RecoveryMode::SkipCorrupt {
            // Untyped, so a payload that is not a `Record` does not stop the walk.
            let raw: Vec<Lsn> = wal
                .log()
                .read_from(Lsn::FIRST)
                .expect("reader")
                .map(|item| item.expect("a recovered log reads without error").0)
                .collect();
            let expected: Vec<Lsn> = if report.last_lsn == Lsn::ZERO {
                Vec::new()
            } else {
                (report.first_lsn.get()..=report.last_lsn.get())
                    .map(Lsn::new)
                    .collect()
            };
            assert_eq!(raw, expected, "{mode:?}: {report:?}");
            if !read_error {
                assert_eq!(lsns, expected);
            }
            let verified = tools::verify(dir, &storage).expect("verify");
            assert!(verified.is_clean(), "{mode:?}: {:?}", verified.problems);
        }

        // An acknowledged record survives a reopen.
        if wal.last_lsn() >= Lsn::MAX {
            // The LSN space is used up (seed `regress-lsn-exhausted`): an append must be a
            // clear error that changes nothing.
            let record = stela_fuzz::sample_records().swap_remove(1);
            match wal.append(&record) {
                Err(stela_wal::Error::LsnExhausted { .. }) => {}
                other => panic!("{mode:?}: append past Lsn::MAX gave {other:?}"),
            }
            assert_eq!(wal.last_lsn(), Lsn::MAX);
            continue;
        }
        let record = stela_fuzz::sample_records().swap_remove(1);
        let Ok(lsn) = wal.append(&record) else {
            continue;
        };
        if wal.commit(lsn).is_err() {
            continue;
        }
        drop(wal);
        let log = Log::open(dir, options(&storage, codec, mode), TYPE_TAG)
            .unwrap_or_else(|e| panic!("{mode:?}: reopen after a commit fails: {e}"));
        assert_eq!(log.last_lsn(), lsn, "{mode:?}");
        let last = log
            .read_from(lsn)
            .expect("reader")
            .last()
            .expect("the committed record")
            .expect("reads");
        assert_eq!(last.0, lsn);
        assert_eq!(codec.decode::<Record>(&last.1).unwrap(), record);
    }
});
