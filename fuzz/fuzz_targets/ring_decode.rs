//! Arbitrary bytes into the shared-memory ring's read path, as the daemon runs it on its
//! private copy of what a client published, and into the client's check of a ring header.
//!
//! Input: two control bytes (`stela_fuzz::RingInput`: the expected seq, and where in a
//! 4096-byte area the entry starts), then the bytes.
//!
//! Oracles:
//! - never panics, and every error displays and maps to a fault code;
//! - `check_entry_start` lets through only what the daemon may copy: a length that is a
//!   multiple of 8, at least a header, inside the area and inside the published bytes; a pad
//!   only away from position 0 and wholly published, covering exactly the rest of the area;
//! - `parse_entry` accepts only canonical entries: what it accepts re-encodes to exactly the
//!   input; its header CRC and every record's CRC match an independent bitwise CRC32C; its
//!   record count agrees with its kind and with the records it yields;
//! - the daemon's sequence holds: when the start check accepts a length, parsing that many
//!   bytes (the copy) never panics, and accepts only an entry of exactly that length;
//! - `check_published` accepts a tail only 8-aligned and at most one area above the head;
//! - `RingLayout::parse` accepts exactly the headers whose magic, version and sizes are valid,
//!   and what it accepts re-encodes to the same 24 bytes;
//! - a result slot decodes and re-encodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_fuzz::{RingInput, RING_DATA_BYTES};
use stela_proto::ring::{
    self, EntryHeader, EntryKind, EntryStart, RingError, RingLayout, ENTRY_HEADER_BYTES,
    LAYOUT_VERSION, MAGIC, MAX_DATA_BYTES, MAX_SLOTS, MIN_DATA_BYTES, PAD_MARKER, RESULT_BYTES,
};

/// Bitwise CRC32C (Castagnoli, reflected 0x82F63B78), independent of the `crc32c` crate.
fn crc32c_bitwise(chunks: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for chunk in chunks {
        for &byte in *chunk {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}

fn check_error(error: &RingError) {
    let _ = error.to_string();
    let _ = error.fault_code();
}

/// `parse_entry` on `bytes`: accepted only if canonical.
fn parse(bytes: &[u8], expected_seq: u64) {
    let entry = match ring::parse_entry(bytes, expected_seq) {
        Ok(entry) => entry,
        Err(error) => return check_error(&error),
    };
    assert_eq!(entry.len(), bytes.len());
    assert_eq!(entry.seq, expected_seq);
    assert_eq!(u32_at(bytes, 0) as usize, bytes.len());
    assert_eq!(
        u32_at(bytes, 4),
        crc32c_bitwise(&[&bytes[0..4], &bytes[8..ENTRY_HEADER_BYTES]]),
        "accepted with a wrong header CRC"
    );
    let records: Vec<(&[u8], u32)> = entry.records().collect();
    assert_eq!(records.len(), entry.count as usize);
    match entry.kind {
        EntryKind::Append => assert!(!records.is_empty()),
        EntryKind::Commit => assert!(records.is_empty()),
    }
    for (payload, crc) in &records {
        assert_eq!(
            *crc,
            crc32c_bitwise(&[payload]),
            "accepted with a wrong payload CRC"
        );
    }
    let payloads: Vec<&[u8]> = records.iter().map(|(p, _)| *p).collect();
    let header = EntryHeader {
        handle: entry.handle,
        kind: entry.kind,
        durability: entry.durability,
        lsn: entry.lsn,
    };
    let mut again = vec![0u8; bytes.len()];
    let len = ring::encode_entry(&mut again, entry.seq, &header, &payloads).unwrap();
    assert_eq!(len, bytes.len());
    assert_eq!(again, bytes, "accepted a non-canonical entry");
}

fn entry_start(input: &RingInput<'_>) {
    let Some(first) = input.bytes.get(..4) else {
        return;
    };
    let first: [u8; 4] = first.try_into().unwrap();
    let position = input.head % RING_DATA_BYTES;
    // Published: the input rounded up to 8 bytes, at most one area.
    let published = (input.bytes.len() as u64)
        .next_multiple_of(8)
        .min(RING_DATA_BYTES);
    match ring::check_entry_start(first, input.head, published, RING_DATA_BYTES) {
        Ok(EntryStart::Entry(len)) => {
            assert_eq!(len as u32, u32::from_le_bytes(first));
            assert_eq!(len % 8, 0);
            assert!(len >= ENTRY_HEADER_BYTES);
            assert!(len as u64 <= published);
            assert!(position + len as u64 <= RING_DATA_BYTES);
            // The daemon's copy: exactly `len` bytes (zeros past the input: unwritten area).
            let mut copy = input.bytes[..len.min(input.bytes.len())].to_vec();
            copy.resize(len, 0);
            if let Ok(entry) = ring::parse_entry(&copy, input.expected_seq) {
                assert_eq!(entry.len(), len);
            }
        }
        Ok(EntryStart::Pad(skip)) => {
            assert_eq!(u32::from_le_bytes(first), PAD_MARKER);
            assert_ne!(position, 0);
            assert_eq!(skip, RING_DATA_BYTES - position);
            assert!(skip <= published);
        }
        Err(error) => check_error(&error),
    }
    for tail in [
        input.head + published,
        input.head + published + 4,
        input.head + RING_DATA_BYTES + 8,
        input.head.wrapping_sub(8),
    ] {
        match ring::check_published(input.head, tail, RING_DATA_BYTES) {
            Ok(unread) => {
                assert_eq!(tail % 8, 0);
                assert!(tail >= input.head && unread == tail - input.head);
                assert!(unread <= RING_DATA_BYTES);
            }
            Err(error) => check_error(&error),
        }
    }
}

fn ring_header(bytes: &[u8]) {
    let parsed = RingLayout::parse(bytes);
    let valid = bytes.len() >= 24 && {
        let data_bytes = u64::from_le_bytes(bytes[16..24].try_into().unwrap());
        let slots = u32_at(bytes, 12);
        bytes[..8] == MAGIC
            && u32_at(bytes, 8) == LAYOUT_VERSION
            && data_bytes.is_power_of_two()
            && (MIN_DATA_BYTES..=MAX_DATA_BYTES).contains(&data_bytes)
            && slots.is_power_of_two()
            && slots <= MAX_SLOTS
    };
    match parsed {
        Ok(layout) => {
            assert!(valid, "accepted an invalid header: {layout:?}");
            assert_eq!(layout.encode_line0()[..24], bytes[..24]);
            assert_eq!(RingLayout::new(layout.data_bytes, layout.slots), Ok(layout));
            assert!(layout.result_offset(u64::MAX) + RESULT_BYTES <= ring::HEADER_BYTES);
        }
        Err(error) => {
            assert!(!valid, "refused a valid header: {error}");
            check_error(&error);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = RingInput::parse(data) else {
        return;
    };
    parse(input.bytes, input.expected_seq);
    entry_start(&input);
    ring_header(input.bytes);
    if let Some(slot) = input.bytes.first_chunk::<RESULT_BYTES>() {
        let (seq, completion) = ring::decode_result(slot);
        assert_eq!(&ring::encode_result(seq, &completion), slot);
        let _ = completion.error_code();
    }
});
