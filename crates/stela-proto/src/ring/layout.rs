//! A ring region's size ([`RingLayout`]) and the result slots the daemon answers in
//! ([`Completion`]). Where each word lives is in [`super::offsets`]; both ends agree on these,
//! and the daemon writes only what they say is its own.

use super::codes::{status_of, RingError};
use super::offsets::*;
use crate::message::ErrorCode;

/// The size of a ring: the parameters in line 0 of the header. A plain value; [`RingLayout::new`]
/// and [`RingLayout::parse`] check the bounds, while the ring code itself relies only on
/// `data_bytes` and `slots` being powers of two (a model checker may use a smaller area).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingLayout {
    pub data_bytes: u64,
    pub slots: u32,
}

impl RingLayout {
    /// # Errors
    /// [`RingError::BadDataBytes`] or [`RingError::BadSlots`] when out of bounds or not a power
    /// of two.
    pub fn new(data_bytes: u64, slots: u32) -> Result<RingLayout, RingError> {
        if !data_bytes.is_power_of_two() || !(MIN_DATA_BYTES..=MAX_DATA_BYTES).contains(&data_bytes)
        {
            return Err(RingError::BadDataBytes { data_bytes });
        }
        if !slots.is_power_of_two() || slots > MAX_SLOTS {
            return Err(RingError::BadSlots { slots });
        }
        Ok(RingLayout { data_bytes, slots })
    }

    /// Line 0 of the header for this layout (the rest of the header starts zeroed).
    pub fn encode_line0(&self) -> [u8; LINE_BYTES] {
        let mut line = [0u8; LINE_BYTES];
        line[MAGIC_OFFSET..MAGIC_OFFSET + 8].copy_from_slice(&MAGIC);
        line[VERSION_OFFSET..VERSION_OFFSET + 4].copy_from_slice(&LAYOUT_VERSION.to_le_bytes());
        line[SLOT_COUNT_OFFSET..SLOT_COUNT_OFFSET + 4].copy_from_slice(&self.slots.to_le_bytes());
        line[DATA_BYTES_OFFSET..DATA_BYTES_OFFSET + 8]
            .copy_from_slice(&self.data_bytes.to_le_bytes());
        line
    }

    /// Bytes of the whole region: header page and data area.
    pub fn region_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + self.data_bytes
    }

    /// Where a monotonic byte counter (`head`, `tail`) points in the data area.
    pub fn position(&self, counter: u64) -> usize {
        (counter & (self.data_bytes - 1)) as usize
    }

    /// The region offset of the result slot of entry `seq`.
    pub fn result_offset(&self, seq: u64) -> usize {
        RESULTS_OFFSET + (seq & u64::from(self.slots - 1)) as usize * RESULT_BYTES
    }
}

/// How the daemon answered one entry: written into the entry's result slot before `done_seq`
/// covers it. `status` is [`STATUS_OK`] or an error ([`status_of`]); `detail` is the daemon's
/// (for example the index of a record that was too large).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Completion {
    pub first_lsn: u64,
    pub last_lsn: u64,
    pub status: u32,
    pub detail: u32,
}

impl Completion {
    pub fn ok(first_lsn: u64, last_lsn: u64) -> Completion {
        Completion {
            first_lsn,
            last_lsn,
            status: STATUS_OK,
            detail: 0,
        }
    }

    pub fn failed(code: ErrorCode, detail: u32) -> Completion {
        Completion {
            first_lsn: 0,
            last_lsn: 0,
            status: status_of(code),
            detail,
        }
    }
}

/// The bytes of a result slot.
pub fn encode_result(seq: u64, completion: &Completion) -> [u8; RESULT_BYTES] {
    let mut slot = [0u8; RESULT_BYTES];
    slot[0..8].copy_from_slice(&seq.to_le_bytes());
    slot[8..16].copy_from_slice(&completion.first_lsn.to_le_bytes());
    slot[16..24].copy_from_slice(&completion.last_lsn.to_le_bytes());
    slot[24..28].copy_from_slice(&completion.status.to_le_bytes());
    slot[28..32].copy_from_slice(&completion.detail.to_le_bytes());
    slot
}

/// Bytes a record of `payload_len` takes in an entry: header, payload, zeros to 8.
pub fn record_bytes(payload_len: usize) -> usize {
    RECORD_HEADER_BYTES + payload_len.next_multiple_of(ENTRY_ALIGN)
}
