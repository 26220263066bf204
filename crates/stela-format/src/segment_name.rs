//! Segment file names.
//!
//! A segment is named by the LSN of its first record, zero-padded to 20 digits so that a plain
//! lexical sort of the directory is the log order: `00000000000000000001.wal`. A segment being
//! prepared carries `.wal.tmp` until it is complete and renamed into place, so a name ending in
//! `.wal` always has a fully written and synced header behind it.

use crate::lsn::Lsn;

pub const SUFFIX: &str = ".wal";
pub const TEMP_SUFFIX: &str = ".wal.tmp";

/// The file name of the segment whose first record is `start`.
pub fn segment_file_name(start: Lsn) -> String {
    format!("{:020}{SUFFIX}", start.get())
}

/// The temporary name a segment has while it is being prepared.
pub fn temp_file_name(start: Lsn) -> String {
    format!("{:020}{TEMP_SUFFIX}", start.get())
}

/// The first LSN encoded in a segment file name, or `None` if the name is not a segment's.
pub fn parse_segment_file_name(name: &str) -> Option<Lsn> {
    let digits = name.strip_suffix(SUFFIX)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok().map(Lsn::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_in_log_order() {
        let a = segment_file_name(Lsn::new(9));
        let b = segment_file_name(Lsn::new(10));
        assert!(a < b);
        assert_eq!(parse_segment_file_name(&a), Some(Lsn::new(9)));
        assert_eq!(parse_segment_file_name(&temp_file_name(Lsn::new(9))), None);
        assert_eq!(parse_segment_file_name("junk.wal"), None);
    }
}
