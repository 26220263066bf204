//! Pages: the bytes of one 8 KiB B+tree node on disk, and the node they hold. Pure, no I/O.
//!
//! This module owns the page layout and keeps three invariants for every image it encodes or
//! accepts: the checksum covers every byte after itself; the image names its own page id, so a
//! write that landed at the wrong offset is caught; and the bytes are canonical (keys strictly
//! ascending, unused bytes zero), so decoding then encoding gives back the same bytes. Any image
//! that breaks one of them is a [`PageError`], never a panic: the decoder is fuzzed.
//!
//! A page that was never written reads as zeros. An all-zero image is accepted as an empty leaf
//! at LSN 0 (the state of every page before its first log record), which is why the checksum
//! alone cannot tell a zeroed page from an unwritten one; restart replays the log onto it.

use serde::{Deserialize, Serialize};
use stela_format::Lsn;

/// Identifies a page: its offset in the page file is `id * PAGE_SIZE`. Page 0 is the root.
pub type PageId = u64;

/// The root of the B+tree never moves: a root split moves its entries into two new pages.
pub const ROOT: PageId = 0;

// A page is PAGE_SIZE bytes, integers little-endian:
//
//   offset  size  field
//   0       4     CRC32C of bytes 4..PAGE_SIZE
//   4       8     page LSN: the LSN of the last log record applied to this image
//   12      8     page id: where the image belongs
//   20      1     kind: 1 leaf, 2 internal
//   21      1     layout version: 1
//   22      2     entry count n
//   24      8     reserved, zero
//   32      ..    body, then zeros to the end of the page
//
// leaf body:     n times [key_len u16][value_len u16][key][value], keys strictly ascending
// internal body: [child_0 u64], then n times [key_len u16][key][child_i+1 u64], keys strictly
//                ascending; keys[i] is the smallest key that can be under children[i + 1]
pub const PAGE_SIZE: usize = 8192;
const CRC_OFFSET: usize = 0;
const LSN_OFFSET: usize = 4;
const ID_OFFSET: usize = 12;
const KIND_OFFSET: usize = 20;
const VERSION_OFFSET: usize = 21;
const COUNT_OFFSET: usize = 22;
const RESERVED: std::ops::Range<usize> = 24..32;
/// Where the body starts; also the encoded size of an empty node's header.
pub const HEADER_SIZE: usize = 32;

const KIND_LEAF: u8 = 1;
const KIND_INTERNAL: u8 = 2;
const LAYOUT_VERSION: u8 = 1;

/// Largest key accepted. With [`MAX_VALUE`], chosen so that any two entries fit one page: a leaf
/// that cannot take a new entry always has at least two to split between.
pub const MAX_KEY: usize = 1024;
/// Largest value accepted.
pub const MAX_VALUE: usize = 2048;

/// The content of a page: a B+tree node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Node {
    Leaf(Leaf),
    Internal(Internal),
}

/// A leaf: key-value entries, keys strictly ascending.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leaf {
    #[serde(with = "byte_pairs")]
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
}

/// An internal node: `children.len() == keys.len() + 1`, keys strictly ascending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Internal {
    #[serde(with = "byte_strings")]
    pub keys: Vec<Vec<u8>>,
    pub children: Vec<PageId>,
}

/// Serde of a list of byte strings as a sequence of MessagePack `bin`s (a structure record's
/// keys, a checkpoint's locks): serde's default, a sequence of integers per string, costs an
/// encode call and up to two bytes per byte. Reads either form.
pub(crate) mod byte_strings {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(strings: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(strings.iter().map(|b| Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let strings: Vec<ByteBuf> = Deserialize::deserialize(d)?;
        Ok(strings.into_iter().map(ByteBuf::into_vec).collect())
    }
}

/// As [`byte_strings`], for a leaf's key-value pairs.
mod byte_pairs {
    use serde::{Deserialize, Deserializer, Serializer};
    use serde_bytes::{ByteBuf, Bytes};

    pub fn serialize<S: Serializer>(pairs: &[(Vec<u8>, Vec<u8>)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(pairs.iter().map(|(k, v)| (Bytes::new(k), Bytes::new(v))))
    }

    /// A leaf's entries.
    type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Pairs, D::Error> {
        let pairs: Vec<(ByteBuf, ByteBuf)> = Deserialize::deserialize(d)?;
        Ok(pairs
            .into_iter()
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect())
    }
}

/// A page as the buffer pool holds it: the node and the LSN of the last record applied to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    pub lsn: Lsn,
    pub node: Node,
}

impl Page {
    /// A page no record has touched yet.
    pub fn empty() -> Page {
        Page {
            lsn: Lsn::ZERO,
            node: Node::Leaf(Leaf::default()),
        }
    }
}

/// Why an image was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the image is {0} bytes, a page is {PAGE_SIZE}")]
    WrongSize(usize),
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("the image belongs to page {found} (a misdirected write)")]
    WrongPage { found: PageId },
    #[error("malformed: {0}")]
    Malformed(&'static str),
    #[error("the node needs {0} bytes, more than a page")]
    TooLarge(usize),
}

impl Node {
    /// The bytes this node takes on a page, header included.
    pub fn encoded_len(&self) -> usize {
        match self {
            Node::Leaf(leaf) => {
                HEADER_SIZE
                    + leaf
                        .entries
                        .iter()
                        .map(|(k, v)| leaf_entry_len(k, v))
                        .sum::<usize>()
            }
            Node::Internal(internal) => {
                HEADER_SIZE
                    + 8
                    + internal
                        .keys
                        .iter()
                        .map(|k| internal_entry_len(k))
                        .sum::<usize>()
            }
        }
    }

    /// Whether the node fits one page.
    pub fn fits(&self) -> bool {
        self.encoded_len() <= PAGE_SIZE
    }

    /// Checks what the decoder checks, for nodes that come from elsewhere (a log record).
    pub fn validate(&self) -> Result<(), PageError> {
        if !self.fits() {
            return Err(PageError::TooLarge(self.encoded_len()));
        }
        match self {
            Node::Leaf(leaf) => {
                for (key, value) in &leaf.entries {
                    if key.len() > MAX_KEY || value.len() > MAX_VALUE {
                        return Err(PageError::Malformed("an entry is larger than allowed"));
                    }
                }
                if !strictly_ascending(leaf.entries.iter().map(|(k, _)| k)) {
                    return Err(PageError::Malformed("leaf keys not strictly ascending"));
                }
            }
            Node::Internal(internal) => {
                if internal.children.len() != internal.keys.len() + 1 {
                    return Err(PageError::Malformed("internal node: children != keys + 1"));
                }
                if internal.keys.iter().any(|k| k.len() > MAX_KEY) {
                    return Err(PageError::Malformed("a separator is larger than allowed"));
                }
                if internal.children.contains(&ROOT) {
                    return Err(PageError::Malformed("the root is nobody's child"));
                }
                if !strictly_ascending(internal.keys.iter()) {
                    return Err(PageError::Malformed("separators not strictly ascending"));
                }
            }
        }
        Ok(())
    }
}

fn leaf_entry_len(key: &[u8], value: &[u8]) -> usize {
    4 + key.len() + value.len()
}

fn internal_entry_len(key: &[u8]) -> usize {
    2 + key.len() + 8
}

fn strictly_ascending<'a>(keys: impl Iterator<Item = &'a Vec<u8>>) -> bool {
    let mut previous: Option<&Vec<u8>> = None;
    for key in keys {
        if previous.is_some_and(|p| p >= key) {
            return false;
        }
        previous = Some(key);
    }
    true
}

/// Encodes `page` as the image of page `id`.
///
/// # Errors
/// As [`encode_into`].
pub fn encode(id: PageId, page: &Page) -> Result<Box<[u8; PAGE_SIZE]>, PageError> {
    let mut image = Box::new([0u8; PAGE_SIZE]);
    encode_into(id, page, &mut image)?;
    Ok(image)
}

/// Encodes `page` as the image of page `id` into `image`, whatever `image` held before (the
/// page cleaner and eviction reuse one buffer instead of allocating a page per write).
///
/// The checks of [`Node::validate`] are made during the one pass that copies the entries (a
/// pass each before cost the cleaner, which encodes about one page per transaction at short
/// intervals, a third of its encoding time); when one fails, `validate` names the error, so
/// the errors are exactly its own.
///
/// # Errors
/// [`PageError::TooLarge`] when the node does not fit (the tree splits before that happens, so
/// this is a bug caught before it reaches the disk); [`PageError::Malformed`] for a node that
/// breaks the ordering rules.
pub fn encode_into(id: PageId, page: &Page, image: &mut [u8; PAGE_SIZE]) -> Result<(), PageError> {
    let refused = || match page.node.validate() {
        Err(error) => error,
        Ok(()) => PageError::Malformed("refused by the encoder but not by validate"),
    };
    let mut at = HEADER_SIZE;
    // Copies `parts` at `at` if they fit the page; false (nothing copied) if not.
    let mut put = |image: &mut [u8; PAGE_SIZE], parts: &[&[u8]]| -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if at + len > PAGE_SIZE {
            return false;
        }
        for part in parts {
            image[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        true
    };
    let (kind, count) = match &page.node {
        Node::Leaf(leaf) => {
            let mut previous: Option<&Vec<u8>> = None;
            for (key, value) in &leaf.entries {
                let ordered = previous.is_none_or(|p| p < key);
                let sized = key.len() <= MAX_KEY && value.len() <= MAX_VALUE;
                let lengths = [key.len() as u16, value.len() as u16];
                if !ordered
                    || !sized
                    || !put(
                        image,
                        &[
                            &lengths[0].to_le_bytes(),
                            &lengths[1].to_le_bytes(),
                            key,
                            value,
                        ],
                    )
                {
                    return Err(refused());
                }
                previous = Some(key);
            }
            (KIND_LEAF, leaf.entries.len())
        }
        Node::Internal(internal) => {
            if internal.children.len() != internal.keys.len() + 1
                || internal.children.contains(&ROOT)
                || !put(image, &[&internal.children[0].to_le_bytes()])
            {
                return Err(refused());
            }
            let mut previous: Option<&Vec<u8>> = None;
            for (key, child) in internal.keys.iter().zip(&internal.children[1..]) {
                let ordered = previous.is_none_or(|p| p < key);
                if !ordered
                    || key.len() > MAX_KEY
                    || !put(
                        image,
                        &[&(key.len() as u16).to_le_bytes(), key, &child.to_le_bytes()],
                    )
                {
                    return Err(refused());
                }
                previous = Some(key);
            }
            (KIND_INTERNAL, internal.keys.len())
        }
    };
    // The header, and zeros after the last entry (the buffer may hold an earlier image).
    image[at..].fill(0);
    image[..HEADER_SIZE].fill(0);
    image[LSN_OFFSET..LSN_OFFSET + 8].copy_from_slice(&page.lsn.get().to_le_bytes());
    image[ID_OFFSET..ID_OFFSET + 8].copy_from_slice(&id.to_le_bytes());
    image[VERSION_OFFSET] = LAYOUT_VERSION;
    image[KIND_OFFSET] = kind;
    // A node that fits has fewer than PAGE_SIZE / 4 entries, so the count fits 16 bits.
    image[COUNT_OFFSET..COUNT_OFFSET + 2].copy_from_slice(&(count as u16).to_le_bytes());
    let crc = crc32c::crc32c(&image[LSN_OFFSET..]);
    image[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// Decodes the image read at page `id`'s offset.
///
/// # Errors
/// A [`PageError`] naming what is wrong; never panics, whatever the bytes.
pub fn decode(id: PageId, image: &[u8]) -> Result<Page, PageError> {
    if image.len() != PAGE_SIZE {
        return Err(PageError::WrongSize(image.len()));
    }
    if image.iter().all(|&b| b == 0) {
        return Ok(Page::empty());
    }
    let stored = u32::from_le_bytes(image[CRC_OFFSET..CRC_OFFSET + 4].try_into().unwrap());
    let computed = crc32c::crc32c(&image[LSN_OFFSET..]);
    if stored != computed {
        return Err(PageError::Checksum { stored, computed });
    }
    let found = u64_at(image, ID_OFFSET);
    if found != id {
        return Err(PageError::WrongPage { found });
    }
    if image[VERSION_OFFSET] != LAYOUT_VERSION {
        return Err(PageError::Malformed("unknown layout version"));
    }
    if image[RESERVED].iter().any(|&b| b != 0) {
        return Err(PageError::Malformed("reserved header bytes are not zero"));
    }
    let lsn = Lsn::new(u64_at(image, LSN_OFFSET));
    let count = u16::from_le_bytes([image[COUNT_OFFSET], image[COUNT_OFFSET + 1]]) as usize;
    let mut body = Cursor {
        bytes: image,
        at: HEADER_SIZE,
    };
    let node = match image[KIND_OFFSET] {
        KIND_LEAF => {
            let mut entries = Vec::with_capacity(count.min(PAGE_SIZE / 4));
            for _ in 0..count {
                let key_len = body.u16()? as usize;
                let value_len = body.u16()? as usize;
                let key = body.take(key_len)?.to_vec();
                let value = body.take(value_len)?.to_vec();
                entries.push((key, value));
            }
            Node::Leaf(Leaf { entries })
        }
        KIND_INTERNAL => {
            let mut keys = Vec::with_capacity(count.min(PAGE_SIZE / 10));
            let mut children = Vec::with_capacity(count.min(PAGE_SIZE / 10) + 1);
            children.push(body.u64()?);
            for _ in 0..count {
                let key_len = body.u16()? as usize;
                keys.push(body.take(key_len)?.to_vec());
                children.push(body.u64()?);
            }
            Node::Internal(Internal { keys, children })
        }
        _ => return Err(PageError::Malformed("unknown page kind")),
    };
    if image[body.at..].iter().any(|&b| b != 0) {
        return Err(PageError::Malformed(
            "bytes after the last entry are not zero",
        ));
    }
    node.validate()?;
    Ok(Page { lsn, node })
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads fields off a page body, refusing to run past its end.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, len: usize) -> Result<&'a [u8], PageError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())
            .ok_or(PageError::Malformed(
                "an entry runs past the end of the page",
            ))?;
        let bytes = &self.bytes[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u16(&mut self) -> Result<u16, PageError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, PageError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
}

impl Leaf {
    /// The value stored under `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .map(|i| self.entries[i].1.as_slice())
    }

    /// Sets `key` to `value`, or removes it when `value` is `None`.
    pub fn set(&mut self, key: &[u8], value: Option<&[u8]>) {
        let found = self.search(key);
        self.set_at(found, key, value);
    }

    /// [`Leaf::set`] unless the leaf would then exceed a page: then it is left as it was and
    /// the size it would have had is the error. One search for both: this is redo's path,
    /// taken once per replayed change.
    pub fn set_within_page(&mut self, key: &[u8], value: Option<&[u8]>) -> Result<(), usize> {
        let found = self.search(key);
        if let Some(after) = self.overflow_at(found, key, value) {
            return Err(after);
        }
        self.set_at(found, key, value);
        Ok(())
    }

    /// The encoded size of this leaf after `set(key, value)` when that is more than a page,
    /// without doing it.
    pub fn overflow_after_set(&self, key: &[u8], value: Option<&[u8]>) -> Option<usize> {
        self.overflow_at(self.search(key), key, value)
    }

    /// Where `key` is (`Ok`) or would go (`Err`).
    fn search(&self, key: &[u8]) -> Result<usize, usize> {
        self.entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
    }

    /// Counts the leaf only when the entry grows: a leaf always fits its page (the decoder
    /// and `Node::validate` see to it), so a set that grows nothing still fits, and the
    /// common update is checked without a pass over every entry.
    fn overflow_at(
        &self,
        found: Result<usize, usize>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Option<usize> {
        let grows = match (found, value) {
            (Ok(i), Some(new)) => new.len() > self.entries[i].1.len(),
            (Err(_), Some(_)) => true,
            (_, None) => false,
        };
        if !grows {
            return None;
        }
        let after = self.len_after_set_at(found, key, value);
        (after > PAGE_SIZE).then_some(after)
    }

    fn set_at(&mut self, found: Result<usize, usize>, key: &[u8], value: Option<&[u8]>) {
        match (found, value) {
            (Ok(i), Some(value)) => {
                // In place: an update (TPC-B's, redo's) then allocates nothing.
                let stored = &mut self.entries[i].1;
                stored.clear();
                stored.extend_from_slice(value);
            }
            (Ok(i), None) => {
                self.entries.remove(i);
            }
            (Err(i), Some(value)) => self.entries.insert(i, (key.to_vec(), value.to_vec())),
            (Err(_), None) => {}
        }
    }

    /// The encoded size of this leaf after `set(key, value)`, without doing it.
    pub fn len_after_set(&self, key: &[u8], value: Option<&[u8]>) -> usize {
        self.len_after_set_at(self.search(key), key, value)
    }

    /// [`Leaf::len_after_set`] with the key's place already found.
    fn len_after_set_at(
        &self,
        found: Result<usize, usize>,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> usize {
        let now = HEADER_SIZE
            + self
                .entries
                .iter()
                .map(|(k, v)| leaf_entry_len(k, v))
                .sum::<usize>();
        let old = found.map_or(0, |i| leaf_entry_len(key, &self.entries[i].1));
        let new = value.map_or(0, |value| leaf_entry_len(key, value));
        now - old + new
    }
}

impl Internal {
    /// Index of the child whose subtree may hold `key`.
    pub fn child_index(&self, key: &[u8]) -> usize {
        self.keys.partition_point(|k| k.as_slice() <= key)
    }
}

/// Splits an overfull node into a left half, the separator to push up, and a right half, each
/// of which fits a page. The node must have at least two entries (leaf) or three keys
/// (internal), which any node larger than a page has, given [`MAX_KEY`] and [`MAX_VALUE`].
pub fn split(node: Node) -> (Node, Vec<u8>, Node) {
    match node {
        Node::Leaf(leaf) => {
            let total: usize = leaf.entries.iter().map(|(k, v)| leaf_entry_len(k, v)).sum();
            let mut left_bytes = 0;
            let mut at = 0;
            while at < leaf.entries.len() - 1 && left_bytes < total / 2 {
                left_bytes += leaf_entry_len(&leaf.entries[at].0, &leaf.entries[at].1);
                at += 1;
            }
            let at = at.max(1);
            let mut left = leaf.entries;
            let right = left.split_off(at);
            let separator = right[0].0.clone();
            (
                Node::Leaf(Leaf { entries: left }),
                separator,
                Node::Leaf(Leaf { entries: right }),
            )
        }
        Node::Internal(internal) => {
            let total: usize = internal.keys.iter().map(|k| internal_entry_len(k)).sum();
            let mut left_bytes = 0;
            let mut at = 0;
            while at < internal.keys.len() - 2 && left_bytes < total / 2 {
                left_bytes += internal_entry_len(&internal.keys[at]);
                at += 1;
            }
            let middle = at.max(1);
            let mut keys = internal.keys;
            let mut children = internal.children;
            let right_keys = keys.split_off(middle + 1);
            let separator = keys.pop().expect("middle key");
            let right_children = children.split_off(middle + 1);
            (
                Node::Internal(Internal { keys, children }),
                separator,
                Node::Internal(Internal {
                    keys: right_keys,
                    children: right_children,
                }),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf_of(pairs: &[(&str, &str)]) -> Node {
        Node::Leaf(Leaf {
            entries: pairs
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                .collect(),
        })
    }

    #[test]
    fn an_image_round_trips_and_every_flipped_bit_is_caught() {
        let page = Page {
            lsn: Lsn::new(77),
            node: leaf_of(&[("a", "1"), ("b", "22")]),
        };
        let image = encode(9, &page).unwrap();
        assert_eq!(decode(9, &image[..]).unwrap(), page);
        assert_eq!(
            decode(8, &image[..]),
            Err(PageError::WrongPage { found: 9 })
        );
        for bit in [0, 40, 100, 300, PAGE_SIZE * 8 - 1] {
            let mut damaged = image.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(9, &damaged[..]).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn internal_nodes_round_trip_and_split_into_fitting_halves() {
        let internal = Node::Internal(Internal {
            keys: (0..20u8).map(|i| vec![i; 500]).collect(),
            children: (1..=21).collect(),
        });
        assert!(!internal.fits());
        let (left, separator, right) = split(internal);
        assert!(left.fits() && right.fits());
        let page = Page {
            lsn: Lsn::new(3),
            node: left.clone(),
        };
        assert_eq!(decode(4, &encode(4, &page).unwrap()[..]).unwrap(), page);
        match (left, right) {
            (Node::Internal(l), Node::Internal(r)) => {
                assert_eq!(l.keys.len() + r.keys.len() + 1, 20);
                assert!(l.keys.last().unwrap() < &separator && separator < r.keys[0]);
                assert_eq!(l.children.len() + r.children.len(), 21);
            }
            _ => panic!("an internal node splits into internal nodes"),
        }
    }

    #[test]
    fn a_node_of_exactly_a_page_encodes_and_one_byte_more_is_too_large() {
        // Four entries of 4 + 8 + 2000 bytes and one of 4 + 8 + `last` after the header.
        let leaf = |last: usize| Page {
            lsn: Lsn::new(1),
            node: Node::Leaf(Leaf {
                entries: (0..5u64)
                    .map(|i| {
                        let len = if i < 4 { 2000 } else { last };
                        (i.to_be_bytes().to_vec(), vec![1u8; len])
                    })
                    .collect(),
            }),
        };
        let full = leaf(100);
        assert_eq!(full.node.encoded_len(), PAGE_SIZE);
        assert_eq!(decode(2, &encode(2, &full).unwrap()[..]).unwrap(), full);
        assert_eq!(
            encode(2, &leaf(101)).map(|_| ()),
            Err(PageError::TooLarge(PAGE_SIZE + 1))
        );
    }

    #[test]
    fn zeros_are_an_empty_page_and_garbage_is_an_error() {
        assert_eq!(decode(5, &[0u8; PAGE_SIZE]).unwrap(), Page::empty());
        assert!(matches!(
            decode(5, &[1u8; PAGE_SIZE]),
            Err(PageError::Checksum { .. })
        ));
        assert_eq!(decode(5, &[0u8; 10]), Err(PageError::WrongSize(10)));
    }

    /// Leaves and internal nodes of random shapes, many of them invalid: keys out of order or
    /// repeated, entries over the size limits, nodes larger than a page, internal nodes with
    /// the wrong number of children or the root as a child.
    fn any_node() -> impl proptest::strategy::Strategy<Value = Node> {
        use proptest::prelude::*;
        // Short keys and values (repeats likely), any up to `max`, or at `limit` give or take.
        let bytes = |max: usize, limit: usize| {
            prop_oneof![
                4 => proptest::collection::vec(0u8..4, 0..8),
                1 => proptest::collection::vec(any::<u8>(), 0..max),
                1 => proptest::collection::vec(any::<u8>(), limit - 1..limit + 2),
            ]
        };
        // Keys as drawn (seldom in order), sorted (repeats kept), or sorted without repeats.
        let order = |keys: &mut Vec<Vec<u8>>, how: u8| {
            if how > 0 {
                keys.sort();
            }
            if how > 1 {
                keys.dedup();
            }
        };
        prop_oneof![
            (
                proptest::collection::vec((bytes(1100, MAX_KEY), bytes(2100, MAX_VALUE)), 0..12),
                0u8..3
            )
                .prop_map(move |(entries, how)| {
                    let (mut keys, values): (Vec<_>, Vec<_>) = entries.into_iter().unzip();
                    order(&mut keys, how);
                    let entries = keys.into_iter().zip(values).collect();
                    Node::Leaf(Leaf { entries })
                }),
            (
                proptest::collection::vec(bytes(1100, MAX_KEY), 0..8),
                proptest::collection::vec(0u64..4, 0..10),
                0u8..3,
                any::<bool>(),
            )
                .prop_map(move |(mut keys, drawn, how, one_more_than_keys)| {
                    order(&mut keys, how);
                    // Mostly one child more than keys (children drawn from 0..4, 0 the root).
                    let children = match one_more_than_keys {
                        true => (0..=keys.len())
                            .map(|i| drawn.get(i).copied().unwrap_or(1))
                            .collect(),
                        false => drawn,
                    };
                    Node::Internal(Internal { keys, children })
                }),
        ]
    }

    proptest::proptest! {
        /// The one-pass encoder refuses exactly the nodes `validate` refuses, with its error;
        /// what it accepts decodes back, and a buffer holding an earlier image (the page
        /// file's reused one) gives the bytes of a fresh one.
        #[test]
        fn encoding_in_one_pass_checks_what_validate_checks(
            node in any_node(),
            earlier in any_node(),
            lsn in 1u64..1_000_000,
        ) {
            let page = Page { lsn: Lsn::new(lsn), node };
            let mut reused = Box::new([0u8; PAGE_SIZE]);
            let earlier = Page { lsn: Lsn::new(1), node: earlier };
            let _ = encode_into(3, &earlier, &mut reused);
            let encoded = encode_into(3, &page, &mut reused);
            match page.node.validate() {
                Err(error) => proptest::prop_assert_eq!(encoded, Err(error)),
                Ok(()) => {
                    proptest::prop_assert_eq!(encoded, Ok(()));
                    let mut fresh = Box::new([0u8; PAGE_SIZE]);
                    encode_into(3, &page, &mut fresh).unwrap();
                    proptest::prop_assert!(reused[..] == fresh[..]);
                    proptest::prop_assert_eq!(decode(3, &reused[..]).unwrap(), page);
                }
            }
        }
    }

    proptest::proptest! {
        /// The one-search set with its size check does what the full count and a plain set
        /// do, on leaves near a page's size (where the check decides), for updates that grow,
        /// shrink or keep an entry's size, inserts and removals.
        #[test]
        fn set_within_page_agrees_with_counting_every_entry(
            values in proptest::collection::btree_map(0u16..400, 0usize..60, 1..200),
            key in 0u16..400,
            new_len in proptest::option::of(0usize..400),
        ) {
            let mut leaf = Leaf {
                entries: values
                    .iter()
                    .map(|(k, len)| (format!("k{k:05}").into_bytes(), vec![7u8; *len]))
                    .collect(),
            };
            proptest::prop_assume!(Node::Leaf(leaf.clone()).fits());
            let key = format!("k{key:05}").into_bytes();
            let value = new_len.map(|len| vec![9u8; len]);
            let counted = leaf.len_after_set(&key, value.as_deref());
            let mut model = leaf.clone();
            model.set(&key, value.as_deref());
            match leaf.set_within_page(&key, value.as_deref()) {
                Ok(()) => {
                    proptest::prop_assert!(counted <= PAGE_SIZE);
                    proptest::prop_assert_eq!(&leaf, &model);
                    proptest::prop_assert!(Node::Leaf(leaf).fits());
                }
                Err(after) => {
                    proptest::prop_assert_eq!(after, counted);
                    proptest::prop_assert!(after > PAGE_SIZE);
                }
            }
        }
    }
}
