//! Arbitrary bytes as a whole segment file into the scan classifier (`stela_wal::scan`).
//!
//! Input: one control byte (is this the last segment, skip damage, which payload limit; see
//! `ScanInput`), then the segment's bytes. The scan starts at the LSN the header names (what
//! recovery does, since it checks the header against the file name), or 1, and reads frames of
//! the layout the header's version names (version 1, or else version 2).
//!
//! Oracles:
//! - never panics;
//! - the findings are consistent: record count and first/last LSN agree, a torn tail only in the
//!   last segment and only after the data, damage in increasing offsets inside the file, each
//!   resuming (if at all) past its own offset, at most one damage without `skip_damage`;
//! - a torn tail with valid records after it (a torn last write) only in a version 2 segment,
//!   and only if each of those records was framed before a sync reached the torn offset: the
//!   records found by resynchronising after it, as the scan does, all have a sync base at most
//!   that offset, and there are as many as the scan says;
//! - the records it counted can be found again: walking the frames from the header on, following
//!   the scan's own damage reports, finds exactly `records` frames, each whole and inside the
//!   file, not overlapping, in strictly increasing LSN order, ending at `end_offset`;
//! - a clean result is really clean: when nothing is left unexplained (no torn tail, no damage
//!   it stopped at), only zeros follow `end_offset`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::frame::{self, Decoded, Layout};
use stela_format::header::HEADER_BYTES;
use stela_format::resync;
use stela_format::Lsn;
use stela_fuzz::{header_layout, header_start_lsn, ScanInput};
use stela_wal::scan::scan_segment;

fuzz_target!(|data: &[u8]| {
    let Some(input) = ScanInput::parse(data) else {
        return;
    };
    let bytes = input.segment;
    let start = header_start_lsn(bytes).unwrap_or(Lsn::FIRST);
    let layout = header_layout(bytes);
    let scan = scan_segment(
        bytes,
        start,
        layout,
        input.is_last,
        input.max_payload,
        input.skip_damage,
    );
    let len = bytes.len() as u64;
    let data_start = HEADER_BYTES as u64;

    // Summary fields agree with each other.
    assert_eq!(scan.records == 0, scan.first_lsn.is_none());
    assert_eq!(scan.records == 0, scan.last_lsn.is_none());
    if let (Some(first), Some(last)) = (scan.first_lsn, scan.last_lsn) {
        assert!(first >= start && last >= first);
        assert!(last.get() - first.get() >= scan.records - 1);
        if !input.skip_damage {
            assert_eq!(first, start);
            assert_eq!(last.get() - first.get(), scan.records - 1);
        }
    }
    assert!(scan.end_offset >= data_start);
    assert!(scan.end_offset <= len.max(data_start));

    // Damage: ordered, inside the file, resuming forward.
    if !input.skip_damage {
        assert!(scan.damage.len() <= 1, "{:?}", scan.damage);
    }
    let mut previous_end = data_start;
    for damage in &scan.damage {
        assert!(damage.offset >= previous_end, "{:?}", scan.damage);
        assert!(damage.offset < len);
        assert!(damage.expected_lsn >= start);
        if let Some(at) = damage.resumes_at {
            assert!(at > damage.offset && at + layout.header_bytes() as u64 <= len);
            previous_end = at;
        }
    }
    assert!(
        scan.damage[..scan.damage.len().saturating_sub(1)]
            .iter()
            .all(|d| d.resumes_at.is_some()),
        "the scan went on after damage it could not resume from"
    );

    // A torn tail: last segment only, after the data and any damage, up to the last non-zero.
    if let Some(torn) = &scan.torn_tail {
        assert!(input.is_last);
        assert!(torn.bytes > 0);
        assert!(torn.offset >= scan.end_offset && torn.offset >= previous_end);
        let end = torn.offset + torn.bytes;
        assert!(end <= len);
        assert_ne!(bytes[end as usize - 1], 0);
        assert!(bytes[end as usize..].iter().all(|&b| b == 0));
        // The records of a torn last write: found again, each framed below the torn offset.
        let expected = scan.last_lsn.map_or(start, Lsn::next);
        let mut found = 0;
        let mut from = torn.offset as usize + 1;
        let mut min_lsn = expected;
        while let Some(at) =
            resync::find_next_valid(layout, bytes, from, min_lsn, input.max_payload)
        {
            let Decoded::Record(rec) =
                frame::decode_with_limit(layout, &bytes[at..], input.max_payload)
            else {
                unreachable!("find_next_valid returned an invalid frame");
            };
            let base = rec
                .sync_base
                .expect("only version 2 frames follow a torn offset");
            assert!(
                u64::from(base) <= torn.offset,
                "a record synced past the damage was cut"
            );
            found += 1;
            from = at + rec.frame_len();
            min_lsn = rec.lsn.next();
        }
        assert_eq!(found, torn.unsynced_records);
        if layout == Layout::V1 {
            assert_eq!(torn.unsynced_records, 0);
        }
    }

    // Find the records again, following the scan's damage reports.
    let mut pos = HEADER_BYTES;
    let mut expected = start;
    let mut damage = scan.damage.iter().peekable();
    let mut found = 0u64;
    let mut last_lsn = None;
    let mut end = HEADER_BYTES;
    while pos < bytes.len() {
        match frame::decode_with_limit(layout, &bytes[pos..], input.max_payload) {
            Decoded::Record(rec) if rec.lsn == expected => {
                assert!(last_lsn.is_none_or(|l| rec.lsn > l));
                assert!(rec.frame_len() <= input.max_payload as usize + layout.header_bytes());
                found += 1;
                last_lsn = Some(rec.lsn);
                pos += rec.frame_len();
                assert!(pos <= bytes.len());
                end = pos;
                expected = Lsn::new(rec.lsn.get().wrapping_add(1));
            }
            _ => match damage.next_if(|d| d.offset == pos as u64) {
                Some(d) => match d.resumes_at {
                    Some(at) if input.skip_damage => {
                        pos = at as usize;
                        let lsn = &bytes[pos + 8..pos + 16];
                        expected = Lsn::new(u64::from_le_bytes(lsn.try_into().unwrap()));
                        assert!(expected >= d.expected_lsn);
                    }
                    _ => break,
                },
                None => break,
            },
        }
    }
    assert!(
        damage.next().is_none(),
        "damage reported where the walk did not stop"
    );
    assert_eq!(found, scan.records);
    assert_eq!(last_lsn, scan.last_lsn);
    assert_eq!(end as u64, scan.end_offset);

    // Nothing left unexplained: only zeros after the data.
    let stopped_at_damage = scan
        .damage
        .last()
        .is_some_and(|d| d.resumes_at.is_none() || !input.skip_damage);
    if scan.torn_tail.is_none() && !stopped_at_damage {
        let from = (scan.end_offset as usize).min(bytes.len());
        assert!(
            bytes[from..].iter().all(|&b| b == 0),
            "a clean scan left non-zero bytes after offset {from}"
        );
    }
});
