//! The ring's entry codec: every entry the encoder writes parses back to what was encoded, and
//! no damage to an entry is ever misread. The daemon acknowledges only what `parse_entry`
//! accepts, so these are the tests behind "a client's wild write can damage only its own
//! unacknowledged records".

use proptest::prelude::*;
use stela_proto::ring::*;
use stela_proto::Durability;

fn durability() -> impl Strategy<Value = Durability> {
    prop_oneof![
        Just(Durability::Unsafe),
        Just(Durability::Buffered),
        Just(Durability::Disk),
        Just(Durability::Replicated),
        Just(Durability::All),
    ]
}

/// A valid header and its payloads: appends with 1..6 records, commits with none.
fn entry() -> impl Strategy<Value = (u64, EntryHeader, Vec<Vec<u8>>)> {
    let append = (
        any::<u32>(),
        durability(),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
    )
        .prop_map(|(handle, durability, payloads)| {
            let header = EntryHeader {
                handle,
                kind: EntryKind::Append,
                durability,
                lsn: 0,
            };
            (header, payloads)
        });
    let commit =
        (any::<u32>(), durability(), any::<u64>()).prop_map(|(handle, durability, lsn)| {
            let header = EntryHeader {
                handle,
                kind: EntryKind::Commit,
                durability,
                lsn,
            };
            (header, vec![])
        });
    (1..u64::MAX, prop_oneof![append, commit]).prop_map(|(seq, (h, p))| (seq, h, p))
}

fn encode(seq: u64, header: &EntryHeader, payloads: &[Vec<u8>]) -> Vec<u8> {
    let refs: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let mut out = vec![0xEE; entry_len(&refs).unwrap() + 16];
    let len = encode_entry(&mut out, seq, header, &refs).unwrap();
    assert!(
        out[len..].iter().all(|&b| b == 0xEE),
        "wrote past the entry"
    );
    out.truncate(len);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn entries_round_trip((seq, header, payloads) in entry()) {
        let bytes = encode(seq, &header, &payloads);
        prop_assert_eq!(bytes.len() % ENTRY_ALIGN, 0);
        let start = check_entry_start(
            bytes[..4].try_into().unwrap(), 0, bytes.len() as u64, MAX_DATA_BYTES,
        );
        prop_assert_eq!(start, Ok(EntryStart::Entry(bytes.len())));
        let entry = parse_entry(&bytes, seq).unwrap();
        prop_assert_eq!(entry.seq, seq);
        prop_assert_eq!(entry.handle, header.handle);
        prop_assert_eq!(entry.kind, header.kind);
        prop_assert_eq!(entry.durability, header.durability);
        prop_assert_eq!(entry.lsn, header.lsn);
        prop_assert_eq!(entry.len(), bytes.len());
        let records: Vec<(&[u8], u32)> = entry.records().collect();
        prop_assert_eq!(records.len(), payloads.len());
        for ((payload, crc), expected) in records.iter().zip(&payloads) {
            prop_assert_eq!(*payload, expected.as_slice());
            prop_assert_eq!(*crc, crc32c::crc32c(expected));
        }
    }

    /// Every single bit of an encoded entry matters: flipping any one of them makes the entry
    /// fail its checks. (The format is canonical: reserved bytes and padding must be zero, and
    /// every other bit is covered by the header CRC or a payload CRC, which catch any one-bit
    /// error.) Nothing damaged is ever handed to the pool.
    #[test]
    fn every_single_bit_flip_is_rejected((seq, header, payloads) in entry()) {
        let bytes = encode(seq, &header, &payloads);
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            // The daemon first bounds-checks the length word it read, then copies exactly that
            // many bytes; a flipped length either fails that check or yields a copy of
            // another length, which `parse_entry` sees through its length field.
            // Up to a page of other published bytes follows the entry (zeros here).
            let first: [u8; 4] = damaged[..4].try_into().unwrap();
            let published = bytes.len() as u64 + 4096;
            let copied = match check_entry_start(first, 0, published, 1 << 20) {
                Ok(EntryStart::Entry(len)) => {
                    let mut copy = damaged.clone();
                    copy.resize(len, 0);
                    copy
                }
                Ok(EntryStart::Pad(_)) | Err(_) => continue,
            };
            let parsed = parse_entry(&copied, seq);
            prop_assert!(parsed.is_err(), "bit {} flipped and still accepted: {:?}", bit, parsed);
        }
    }

    /// Arbitrary bytes never panic the parser, and anything it accepts is canonical: encoding
    /// what it read gives the same bytes back.
    #[test]
    fn arbitrary_bytes_are_rejected_or_canonical(
        bytes in prop::collection::vec(any::<u8>(), 0..200),
        seq in 0u64..4,
    ) {
        if let Ok(entry) = parse_entry(&bytes, seq) {
            let payloads: Vec<Vec<u8>> = entry.records().map(|(p, _)| p.to_vec()).collect();
            let header = EntryHeader {
                handle: entry.handle,
                kind: entry.kind,
                durability: entry.durability,
                lsn: entry.lsn,
            };
            prop_assert_eq!(encode(seq, &header, &payloads), bytes);
        }
    }

    /// A record truncated or extended by a wrong length field never reads outside the entry.
    #[test]
    fn a_wrong_record_length_is_caught(
        (seq, header, payloads) in entry(),
        delta in prop_oneof![1u32..9, (u32::MAX - 8)..=u32::MAX],
        index in any::<prop::sample::Index>(),
    ) {
        prop_assume!(!payloads.is_empty());
        let mut bytes = encode(seq, &header, &payloads);
        let target = index.index(payloads.len());
        let mut at = ENTRY_HEADER_BYTES;
        for payload in &payloads[..target] {
            at += record_bytes(payload.len());
        }
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        bytes[at..at + 4].copy_from_slice(&len.wrapping_add(delta).to_le_bytes());
        prop_assert!(parse_entry(&bytes, seq).is_err());
    }
}

#[test]
fn damage_reports_name_what_failed() {
    let header = EntryHeader {
        handle: 1,
        kind: EntryKind::Append,
        durability: Durability::Buffered,
        lsn: 0,
    };
    let good = encode(7, &header, &[b"abc".to_vec(), b"defgh".to_vec()]);

    let mut payload = good.clone();
    payload[40 + 16 + 8] ^= 1; // first byte of the second payload
    assert!(matches!(
        parse_entry(&payload, 7),
        Err(RingError::BadPayloadCrc {
            seq: 7,
            index: 1,
            ..
        })
    ));

    let mut head = good.clone();
    head[16] ^= 1; // handle
    assert!(matches!(
        parse_entry(&head, 7),
        Err(RingError::BadHeaderCrc { seq: 7, .. })
    ));

    let mut padding = good.clone();
    padding[40 + 8 + 3] = 1; // after "abc"
    assert_eq!(
        parse_entry(&padding, 7),
        Err(RingError::NonZeroPadding { seq: 7, index: 0 })
    );

    assert_eq!(
        parse_entry(&good[..good.len() - 8], 7),
        Err(RingError::LengthMismatch {
            field: good.len() as u32,
            copied: good.len() - 8
        })
    );
    assert_eq!(
        parse_entry(&good[..39], 7),
        Err(RingError::Truncated { len: 39 })
    );
    assert_eq!(
        parse_entry(&good, 6).unwrap_err().fault_code(),
        FaultCode::WrongSeq
    );
}
