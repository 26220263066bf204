//! Arbitrary bytes into the segment header decoder.
//!
//! The header encoding is canonical except for the fields the decoder deliberately does not look
//! at: the flags byte (11), the reserved bytes (248..252) and the padding after the type tag's
//! first zero byte. So the oracle is: a decoded header re-encodes to the input with exactly those
//! bytes zeroed (and the CRC recomputed accordingly), which is the input itself when it was
//! canonical; and decoding the re-encoding gives the same header again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stela_format::header::{SegmentHeader, HEADER_BYTES};

const TAG: std::ops::Range<usize> = 48..248;

fuzz_target!(|data: &[u8]| {
    let Ok(header) = SegmentHeader::decode(data) else {
        return;
    };
    let _ = header.type_tag.to_string();
    let encoded = header.encode();

    let mut canonical: [u8; HEADER_BYTES] = data[..HEADER_BYTES].try_into().unwrap();
    canonical[11] = 0;
    canonical[248..252].fill(0);
    if let Some(nul) = canonical[TAG].iter().position(|&b| b == 0) {
        canonical[TAG.start + nul..TAG.end].fill(0);
    }
    let crc = crc32c(&canonical[..252]);
    canonical[252..].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(encoded, canonical, "re-encoding is not the canonical input");

    assert_eq!(SegmentHeader::decode(&encoded).as_ref(), Ok(&header));
});

/// CRC32C, bitwise: independent of the implementation under test.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}
