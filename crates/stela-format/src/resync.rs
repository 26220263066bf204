//! What recovery and the tools need beyond reading frames in order: finding the next valid frame
//! after damage (which tells a torn write from corruption), and writing version 1 frames for the
//! fixtures that check old logs stay readable. Apart from the framing itself ([`crate::frame`]),
//! which the log's durability-critical core uses to write and read records.

use crate::frame::{
    check_encodable, checksum_v1, decode_with_limit, Decoded, Layout, V1_HEADER_BYTES,
};
use crate::lsn::Lsn;

/// Appends a version 1 frame. The log never writes these; they exist so that tests, fuzzers and
/// fixtures can build the segments older builds wrote and check that they stay readable.
///
/// # Panics
/// As [`encode`].
pub fn encode_v1(out: &mut Vec<u8>, lsn: Lsn, payload: &[u8]) {
    let len = check_encodable(lsn, payload);
    out.reserve(V1_HEADER_BYTES + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&checksum_v1(crc32c::crc32c(payload), len, lsn).to_le_bytes());
    out.extend_from_slice(&lsn.get().to_le_bytes());
    out.extend_from_slice(payload);
}

/// The LSN field of the frame header at `at` (any layout: the LSN is at the same place).
///
/// # Panics
/// If fewer than 16 bytes follow `at`.
pub fn lsn_field(buf: &[u8], at: usize) -> Lsn {
    Lsn::new(u64::from_le_bytes(
        buf[at + 8..at + 16].try_into().expect("8 bytes"),
    ))
}

/// Finds the first offset at or after `from` where a whole, valid frame of `layout` with an LSN
/// of at least `min_lsn` starts. Used after a bad frame, to tell a torn tail (nothing valid
/// follows) from corruption in the middle of the log (valid records follow). Tries every byte
/// offset, because after a bad length field the reader no longer knows where frames start.
pub fn find_next_valid(
    layout: Layout,
    buf: &[u8],
    from: usize,
    min_lsn: Lsn,
    max_payload: u32,
) -> Option<usize> {
    let last_start = buf.len().checked_sub(layout.header_bytes())?;
    (from..=last_start).find(|&offset| {
        // Cheap checks first: most offsets fail on the LSN range or the length.
        if lsn_field(buf, offset).get() < min_lsn.get().max(1) {
            return false;
        }
        matches!(
            decode_with_limit(layout, &buf[offset..], max_payload),
            Decoded::Record(_)
        )
    })
}
