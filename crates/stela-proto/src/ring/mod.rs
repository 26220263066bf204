//! The shared-memory ring between a client and the daemon on one machine: where every word of the
//! region lives, the entry codec, and every check the daemon makes before it believes an entry.
//!
//! Pure, like the rest of this crate: bytes in, values out. `stela-net`'s `shm` module maps the
//! region, does the atomics and the sleeping, and calls these functions; the fuzz target
//! `ring_decode` feeds them arbitrary bytes. `docs/PROTOCOL.md` ("Shared-memory transport")
//! describes the protocol around them.
//!
//! # The region
//!
//! One memfd per connection: a 4096-byte header page, then the data area of `data_bytes` (a power
//! of two, 4 KiB to 64 MiB). Every group of header words sits on its own 64-byte cache line, so
//! the words one side writes in its fast path never share a line with the other side's.
//!
//! ```text
//! offset  size  field            written by   meaning
//! ---- line 0: immutable after creation -------------------------------------------------------
//!    0     8    magic            daemon       "STELARNG"
//!    8     4    version          daemon       LAYOUT_VERSION
//!   12     4    slots            daemon       result slots, a power of two, 1..=64
//!   16     8    data_bytes       daemon       size of the data area
//!   24     4    board_seat       daemon       0, or the ring's seat on the wake board + 1 (BoardSeat)
//! ---- line 1: the client's ------------------------------------------------------------------
//!   64     8    tail             client       bytes published (monotonic; position = tail mod data_bytes)
//!   72     4    client_waiting   client       while the client sleeps (or is about to) on `wake`:
//!                                               1 for room (woken by any change), 2 for an
//!                                               answer (woken by done_seq or fault only), 3 for
//!                                               an answer, sleeping on its board seat
//! ---- line 2: the daemon's ------------------------------------------------------------------
//!  128     8    head             daemon       bytes consumed; [tail, head + data_bytes) is free
//!  136     4    daemon_asleep    daemon       1 while the daemon sleeps: ring the doorbell
//! ---- line 3: completions (the daemon's) ------------------------------------------------------
//!  192     8    done_seq         daemon       every entry with seq <= done_seq is completed
//!  200     4    wake             daemon*      futex word, bumped before each FUTEX_WAKE of a sleeping client
//!  204     4    fault            daemon       0, or a FaultCode: the daemon stopped reading this ring
//!  208     8    fault_seq        daemon       with fault: the first seq that will never be completed
//! ---- result slots ----------------------------------------------------------------------------
//!  256   32*n   slot[seq mod n]  daemon       seq u64, first_lsn u64, last_lsn u64, status u32, detail u32
//! 3072  1024    message          daemon       the latest refusal: seq u64, len u32, 0 u32, UTF-8 text
//! 4096  data_bytes  data area    client       entries
//! ```
//! (*) the client also bumps `wake` once, when it learns that the daemon is gone, to wake itself.
//!
//! All integers are little-endian. The daemon never trusts a header word the client can write:
//! it keeps `head`, `done_seq` and the layout privately and reads only `tail` (checked with
//! [`check_published`]) and `client_waiting` (which at worst costs the client a wake-up).
//!
//! # Entries
//!
//! Entries are 8-byte aligned and never wrap: when an entry does not fit before the end of the
//! area, the client writes [`PAD_MARKER`] where it would have started and puts the entry at
//! position 0 (publishing both at once). An entry is a 40-byte header and `count` records:
//!
//! ```text
//! offset  size  field
//!    0     4    entry_len     total bytes, header included; a multiple of 8 (or PAD_MARKER)
//!    4     4    header_crc    CRC32C of bytes 0..4 and 8..40
//!    8     8    seq           1, 2, 3, ... per ring
//!   16     4    handle        the client's log handle on this connection
//!   20     1    kind          1 append, 2 commit
//!   21     1    durability    1 unsafe, 2 buffered, 3 disk, 4 replicated, 5 all
//!   22     2    reserved      zero
//!   24     4    count         records: at least 1 for append, 0 for commit
//!   28     4    reserved      zero
//!   32     8    lsn           commit: wait until this LSN; append: zero
//!   40          records, each: len u32, CRC32C(payload) u32, payload, zeros to a multiple of 8
//! ```
//!
//! Invariants the parser enforces (so that an entry is accepted only in its one canonical form,
//! and every single-bit flip of an encoded entry is rejected): the header CRC matches, `seq` is
//! the one the daemon expects next, kind and durability are known, reserved bytes and padding
//! are zero, `count` agrees with the kind, the records exactly fill `entry_len`, and every
//! payload matches its CRC.
//!
//! The module, by side:
//! - [`layout`]: offsets, sizes, result slots (both ends).
//! - [`read`]: the daemon's checks of a published entry (durability-critical).
//! - [`client`]: the client's encoder, its check of a region, its reading of results.
//! - [`codes`]: errors, fault codes, kinds, statuses, the refusal message.

pub mod board;
pub mod client;
pub mod codes;
pub mod layout;
pub mod offsets;
pub mod read;

pub use board::*;
pub use client::*;
pub use codes::*;
pub use layout::*;
pub use offsets::*;
pub use read::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Durability, ErrorCode};

    #[test]
    fn board_seats_round_trip_and_consecutive_rings_share_a_word() {
        for n in [0, 1, 31, 32, 2047] {
            let seat = BoardSeat::of(n);
            assert_eq!(BoardSeat::decode(seat.encode()), Some(seat));
            assert!(seat.word < BOARD_WORDS && seat.mask.is_power_of_two());
        }
        assert_eq!(BoardSeat::of(0).word, BoardSeat::of(31).word);
        assert_ne!(BoardSeat::of(31).word, BoardSeat::of(32).word);
        assert_eq!(
            BoardSeat::of(2048),
            BoardSeat::of(0),
            "seats wrap around, shared"
        );
        assert_eq!(BoardSeat::decode(0), None, "0: no board");
        assert_eq!(BoardSeat::decode(2049), None, "out of range: no board");
    }

    fn append(payloads: &[&[u8]], seq: u64) -> Vec<u8> {
        let mut out = vec![0u8; entry_len(payloads).unwrap()];
        let header = EntryHeader {
            handle: 3,
            kind: EntryKind::Append,
            durability: Durability::Buffered,
            lsn: 0,
        };
        encode_entry(&mut out, seq, &header, payloads).unwrap();
        out
    }

    #[test]
    fn the_documented_offsets_hold() {
        // The diagram in the module documentation, spelled out: one group per cache line.
        assert_eq!(TAIL_OFFSET / LINE_BYTES, 1);
        assert_eq!(CLIENT_WAITING_OFFSET / LINE_BYTES, 1);
        assert_eq!(HEAD_OFFSET / LINE_BYTES, 2);
        assert_eq!(DAEMON_ASLEEP_OFFSET / LINE_BYTES, 2);
        for offset in [DONE_SEQ_OFFSET, WAKE_OFFSET, FAULT_OFFSET, FAULT_SEQ_OFFSET] {
            assert_eq!(offset / LINE_BYTES, 3);
        }
        for offset in [TAIL_OFFSET, HEAD_OFFSET, DONE_SEQ_OFFSET, FAULT_SEQ_OFFSET] {
            assert_eq!(offset % 8, 0, "u64 words are 8-aligned");
        }
        for offset in [
            CLIENT_WAITING_OFFSET,
            DAEMON_ASLEEP_OFFSET,
            WAKE_OFFSET,
            FAULT_OFFSET,
        ] {
            assert_eq!(offset % 4, 0, "u32 words are 4-aligned");
        }
        let layout = RingLayout::new(4096, MAX_SLOTS).unwrap();
        assert_eq!(layout.result_offset(0), RESULTS_OFFSET);
        assert_eq!(
            layout.result_offset(MAX_SLOTS as u64 + 1),
            RESULTS_OFFSET + RESULT_BYTES
        );
        assert!(layout.result_offset(u64::MAX) + RESULT_BYTES <= HEADER_BYTES);
    }

    #[test]
    fn layout_bounds() {
        assert!(RingLayout::new(4096, 1).is_ok());
        assert!(RingLayout::new(MAX_DATA_BYTES, MAX_SLOTS).is_ok());
        for bad in [0, 2048, 4097, 6144, MAX_DATA_BYTES * 2] {
            assert_eq!(
                RingLayout::new(bad, 4),
                Err(RingError::BadDataBytes { data_bytes: bad })
            );
        }
        for bad in [0, 3, MAX_SLOTS * 2] {
            assert_eq!(
                RingLayout::new(4096, bad),
                Err(RingError::BadSlots { slots: bad })
            );
        }
        let layout = RingLayout::new(1 << 20, 16).unwrap();
        assert_eq!(RingLayout::parse(&layout.encode_line0()), Ok(layout));
        let mut line = layout.encode_line0();
        line[0] = b's';
        assert!(matches!(
            RingLayout::parse(&line),
            Err(RingError::BadMagic { .. })
        ));
        let mut line = layout.encode_line0();
        line[VERSION_OFFSET] = 2;
        assert_eq!(
            RingLayout::parse(&line),
            Err(RingError::UnsupportedLayout { found: 2 })
        );
        assert_eq!(
            RingLayout::parse(&line[..23]),
            Err(RingError::Truncated { len: 23 })
        );
    }

    #[test]
    fn an_entry_reads_back() {
        let bytes = append(&[b"hello", b"", &[7u8; 8]], 9);
        assert_eq!(bytes.len(), 40 + 16 + 8 + 16);
        let entry = parse_entry(&bytes, 9).unwrap();
        assert_eq!(
            (entry.seq, entry.handle, entry.kind, entry.count),
            (9, 3, EntryKind::Append, 3)
        );
        let records: Vec<_> = entry.records().collect();
        assert_eq!(records[0], (&b"hello"[..], crc32c::crc32c(b"hello")));
        assert_eq!(records[1].0, b"");
        assert_eq!(records[2].0, &[7u8; 8]);
        assert_eq!(
            parse_entry(&bytes, 10),
            Err(RingError::WrongSeq {
                expected: 10,
                found: 9
            })
        );
    }

    #[test]
    fn encoder_refuses_what_the_parser_would() {
        let mut out = vec![0u8; 256];
        let commit = EntryHeader {
            handle: 0,
            kind: EntryKind::Commit,
            durability: Durability::Disk,
            lsn: 5,
        };
        assert!(matches!(
            encode_entry(&mut out, 1, &commit, &[b"x"]),
            Err(RingError::BadRecordCount { count: 1, .. })
        ));
        assert_eq!(encode_entry(&mut out, 1, &commit, &[]), Ok(40));
        let append = EntryHeader {
            kind: EntryKind::Append,
            ..commit
        };
        assert!(matches!(
            encode_entry(&mut out, 1, &append, &[]),
            Err(RingError::BadRecordCount { count: 0, .. })
        ));
        assert!(matches!(
            encode_entry(&mut out, 1, &append, &[b"x"]),
            Err(RingError::NonZeroField { field: "lsn", .. })
        ));
        let append = EntryHeader { lsn: 0, ..append };
        assert_eq!(
            encode_entry(&mut out[..47], 1, &append, &[b"x"]),
            Err(RingError::BufferTooSmall {
                needed: 56,
                available: 47
            })
        );
    }

    #[test]
    fn entry_starts_are_bounded_by_area_and_tail() {
        let data = 4096;
        assert_eq!(
            check_entry_start(56u32.to_le_bytes(), 0, 56, data),
            Ok(EntryStart::Entry(56))
        );
        // Past the published bytes, past the area's end, off the grid, shorter than a header.
        for (len, head, published) in [(64, 0, 56), (64, 4040, 4096), (60, 0, 4096), (32, 0, 64)] {
            assert!(matches!(
                check_entry_start(u32::to_le_bytes(len), head, published, data),
                Err(RingError::BadEntryLength { .. })
            ));
        }
        assert_eq!(
            check_entry_start(pad_bytes(), 4096 + 4000, 96 + 8, data),
            Ok(EntryStart::Pad(96))
        );
        assert!(matches!(
            check_entry_start(pad_bytes(), 4000, 64, data),
            Err(RingError::BadPad { .. })
        ));
        assert!(matches!(
            check_entry_start(pad_bytes(), 4096, 4096, data),
            Err(RingError::BadPad { .. })
        ));
        assert_eq!(check_published(8, 8, data), Ok(0));
        assert_eq!(check_published(8, 8 + data, data), Ok(data));
        for (head, tail) in [(16, 8), (0, data + 8), (0, 12)] {
            assert!(matches!(
                check_published(head, tail, data),
                Err(RingError::BadTail { .. })
            ));
        }
    }

    #[test]
    fn result_slots_and_statuses_round_trip() {
        let completion = Completion {
            first_lsn: 5,
            last_lsn: u64::MAX,
            status: status_of(ErrorCode::Io),
            detail: 77,
        };
        assert_eq!(
            decode_result(&encode_result(42, &completion)),
            (42, completion)
        );
        assert_eq!(completion.error_code(), Some(ErrorCode::Io));
        assert!(Completion::ok(1, 2).is_ok());
        for status in 1..=24 {
            assert_eq!(status_of(error_of_status(status).unwrap()), status);
        }
        assert_eq!(error_of_status(25), None);
        let (seq, text) = decode_message(&encode_message(9, &"é".repeat(2000)));
        assert_eq!(seq, 9);
        assert!(text.len() <= MESSAGE_TEXT_BYTES && text.chars().all(|c| c == 'é'));
        for code in 1..=7 {
            assert_eq!(FaultCode::from_u32(code).unwrap().as_u32(), code);
        }
        assert_eq!(FaultCode::from_u32(0), None);
    }
}
