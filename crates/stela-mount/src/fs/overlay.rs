//! The overlay: file data the mount has logged but the materialiser has not (yet known to have)
//! put in the backing files, and how a write is cut down to the bytes it changes.
//!
//! Invariants: each inode's records are kept in LSN order, and a read applies them in that
//! order on top of the backing file's bytes ([`overlay_onto`]); applying a record the backing
//! file already holds changes nothing (each sets bytes or a size outright), so a record pruned
//! late is harmless; `bytes` is the sum of the data of every write record held (what
//! `overlay_cap` bounds).

use std::collections::HashMap;
use std::sync::Arc;

/// Data logged but not yet (known to be) in the backing file.
#[derive(Clone, Debug)]
pub enum Pending {
    Write { offset: u64, data: Arc<Vec<u8>> },
    Truncate { size: u64 },
    Zero { offset: u64, length: u64 },
}

#[derive(Default)]
pub(super) struct Overlay {
    /// Per inode, in LSN order.
    records: HashMap<u64, Vec<(u64, Pending)>>,
    pub(super) bytes: u64,
}

impl Overlay {
    pub(super) fn push(&mut self, ino: u64, lsn: u64, pending: Pending) {
        if let Pending::Write { data, .. } = &pending {
            self.bytes += data.len() as u64;
        }
        self.records.entry(ino).or_default().push((lsn, pending));
    }

    pub(super) fn drop_inode(&mut self, ino: u64) {
        if let Some(list) = self.records.remove(&ino) {
            self.bytes -= weight(&list);
        }
    }

    /// The inode's records that may change bytes in `offset..end`, in LSN order (truncations
    /// and zeroed ranges always, since they may cut below `offset`).
    pub(super) fn touching(&self, ino: u64, offset: u64, end: u64) -> Vec<Pending> {
        self.records
            .get(&ino)
            .map(|list| {
                list.iter()
                    .filter(|(_, p)| match p {
                        Pending::Write { offset: at, data } => {
                            *at < end && at + data.len() as u64 > offset
                        }
                        _ => true,
                    })
                    .map(|(_, p)| p.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub(super) fn prune(&mut self, applied: u64) {
        let mut freed = 0;
        self.records.retain(|_, list| {
            let before = weight(list);
            list.retain(|(lsn, _)| *lsn > applied);
            freed += before - weight(list);
            !list.is_empty()
        });
        self.bytes -= freed;
    }
}

fn weight(list: &[(u64, Pending)]) -> u64 {
    list.iter()
        .map(|(_, p)| match p {
            Pending::Write { data, .. } => data.len() as u64,
            _ => 0,
        })
        .sum()
}

/// The most existing bytes a write is compared with before it is logged.
pub(super) const DIFF_LIMIT: usize = 64 << 10;

/// `from..to`: the part of `data` to log, given `current`, the file's bytes under the first
/// `current.len()` bytes of `data` (the rest of `data` extends the file). Everything before
/// `from` and from `to` on equals `current`; `from == to` when nothing differs.
pub(super) fn changed_window(data: &[u8], current: &[u8]) -> (usize, usize) {
    let existing = current.len().min(data.len());
    let from = data[..existing]
        .iter()
        .zip(current)
        .position(|(new, old)| new != old)
        .unwrap_or(existing);
    if existing < data.len() {
        return (from, data.len());
    }
    if from == existing {
        return (existing, existing);
    }
    let to = data[..existing]
        .iter()
        .zip(current)
        .rposition(|(new, old)| new != old)
        .map_or(from, |last| last + 1);
    (from, to)
}

/// Applies overlay records to `buf`, which holds the file's bytes from `offset`.
pub fn overlay_onto(buf: &mut [u8], offset: u64, records: &[Pending]) {
    let end = offset + buf.len() as u64;
    let zero = |buf: &mut [u8], from: u64, to: u64| {
        let (from, to) = (from.max(offset), to.min(end));
        if from < to {
            buf[(from - offset) as usize..(to - offset) as usize].fill(0);
        }
    };
    for record in records {
        match record {
            Pending::Write { offset: at, data } => {
                let (from, to) = ((*at).max(offset), (at + data.len() as u64).min(end));
                if from < to {
                    buf[(from - offset) as usize..(to - offset) as usize]
                        .copy_from_slice(&data[(from - at) as usize..(to - at) as usize]);
                }
            }
            Pending::Truncate { size } => zero(buf, *size, u64::MAX),
            Pending::Zero { offset: at, length } => zero(buf, *at, at + length),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overlay_applies_writes_truncates_and_holes_in_order() {
        // The backing file holds "abcdefgh"; then: write "XY" at 2, truncate to 3, write "Z"
        // at 6, punch 0..1.
        let records = [
            Pending::Write {
                offset: 2,
                data: Arc::new(b"XY".to_vec()),
            },
            Pending::Truncate { size: 3 },
            Pending::Write {
                offset: 6,
                data: Arc::new(b"Z".to_vec()),
            },
            Pending::Zero {
                offset: 0,
                length: 1,
            },
        ];
        let mut buf = b"abcdefg".to_vec();
        overlay_onto(&mut buf, 0, &records);
        assert_eq!(&buf, b"\0bX\0\0\0Z");
        // The same from offset 2, and again on bytes that already hold the result.
        let mut window = b"cdefg".to_vec();
        overlay_onto(&mut window, 2, &records);
        assert_eq!(&window, b"X\0\0\0Z");
        let mut again = buf.clone();
        overlay_onto(&mut again, 0, &records);
        assert_eq!(again, buf);
    }
}

#[cfg(test)]
mod changed_window_tests {
    use super::changed_window;
    use proptest::prelude::*;

    #[test]
    fn only_the_bytes_that_differ_are_kept() {
        // A page rewritten with two new bytes in the middle.
        assert_eq!(changed_window(b"abXYef", b"abcdef"), (2, 4));
        // Nothing new: an empty window.
        assert_eq!(changed_window(b"abcdef", b"abcdef"), (6, 6));
        // A write that extends the file keeps everything from its first change to its end.
        assert_eq!(changed_window(b"abcdXY", b"abcd"), (4, 6));
        assert_eq!(changed_window(b"aXcdef", b"abcd"), (1, 6));
        // Nothing of the file under it: all of it.
        assert_eq!(changed_window(b"abc", b""), (0, 3));
    }

    fn apply(file: &[u8], offset: usize, data: &[u8]) -> Vec<u8> {
        let mut out = file.to_vec();
        if out.len() < offset + data.len() {
            out.resize(offset + data.len(), 0);
        }
        out[offset..offset + data.len()].copy_from_slice(data);
        out
    }

    proptest! {
        /// Logging only the window leaves the file exactly as the whole write would, size
        /// included: the property the mount relies on when it trims a write.
        #[test]
        fn the_window_writes_what_the_whole_write_would(
            file in proptest::collection::vec(0u8..3, 0..64),
            offset in 0usize..80,
            data in proptest::collection::vec(0u8..3, 1..48),
        ) {
            let existing = file.len().saturating_sub(offset).min(data.len());
            let current = if existing > 0 { &file[offset..offset + existing] } else { &[][..] };
            let (from, to) = changed_window(&data, current);
            prop_assert!(from <= to && to <= data.len());
            let whole = apply(&file, offset, &data);
            // A write past the end leaves a hole of zeros, as the tree and the files do.
            let trimmed = if from == to {
                let mut out = file.clone();
                if out.len() < offset { out.resize(offset, 0); }
                out
            } else {
                let mut out = file.clone();
                if out.len() < offset { out.resize(offset, 0); }
                apply(&out, offset + from, &data[from..to])
            };
            prop_assert_eq!(trimmed, whole);
        }
    }
}
