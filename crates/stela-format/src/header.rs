//! The segment header: the first [`HEADER_BYTES`] bytes of every segment file.
//!
//! ```text
//! offset  size  field
//!      0     8  magic "STELAWAL"
//!      8     2  format version, u16 LE: 2 (frames with a sync base) or 1 (read, never written)
//!     10     1  codec id (1 json, 2 msgpack, 3 postcard)
//!     11     1  flags (0; reserved)
//!     12     4  header length in bytes, u32 LE (256)
//!     16     8  segment sequence number, u64 LE (0 for the first segment of a log, +1 each)
//!     24     8  first LSN of the segment, u64 LE (also in the file name)
//!     32     8  segment capacity in bytes, u64 LE (the preallocated file size; at most
//!               u32::MAX in version 2, whose frames store offsets in 32 bits)
//!     40     4  record type tag length in bytes, u32 LE
//!     44     4  CRC32C of the whole record type tag
//!     48   200  record type tag, UTF-8, truncated to 200 bytes, zero padded
//!    248     4  reserved (0)
//!    252     4  CRC32C of bytes 0..252, u32 LE
//! ```
//!
//! The type tag names the Rust record type the log holds (by default its `type_name`), so
//! opening a log of `Order`s as a log of `Payment`s is refused with both names, instead of
//! decoding one type's bytes as another. Long tags are compared by length and CRC, and shown
//! truncated.

use crate::codec::Codec;
use crate::frame::Layout;
use crate::lsn::Lsn;

pub const HEADER_BYTES: usize = 256;

// Frames carry a sync base no lower than the header's end (frame.rs spells the number out so
// that it need not import this module).
const _: () = assert!(HEADER_BYTES as u32 == crate::frame::MIN_SYNC_BASE);
pub const MAGIC: &[u8; 8] = b"STELAWAL";
/// The version writers put in new segments. Version 1 segments stay readable.
pub const FORMAT_VERSION: u16 = Layout::CURRENT.version();
/// The largest capacity a version 2 segment can have: its frames' sync bases are u32 offsets.
pub const MAX_CAPACITY_V2: u64 = u32::MAX as u64;
const TAG_CAPACITY: usize = 200;
const TAG_OFFSET: usize = 48;
const CRC_OFFSET: usize = 252;

/// The record type a log holds, as recorded in its segment headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypeTag {
    /// The tag as stored: the whole tag, or its first 200 bytes if it is longer (cut back to a
    /// character boundary, and before any zero byte).
    pub shown: String,
    /// Length of the whole tag in bytes.
    pub len: u32,
    /// CRC32C of the whole tag.
    pub crc: u32,
}

impl TypeTag {
    pub fn new(tag: &str) -> TypeTag {
        // The stored tag is zero padded, so a zero byte would end it on decode: keep only what is
        // before one, or a tag with a NUL would not match itself after a round trip. The length
        // and CRC still cover the whole tag, so such tags stay distinct.
        let stored = tag.find('\0').unwrap_or(tag.len());
        let mut cut = stored.min(TAG_CAPACITY);
        while !tag.is_char_boundary(cut) {
            cut -= 1;
        }
        TypeTag {
            shown: tag[..cut].to_string(),
            len: tag.len() as u32,
            crc: crc32c::crc32c(tag.as_bytes()),
        }
    }

    /// Whether two tags are the same tag, byte for byte.
    pub fn same_as(&self, other: &TypeTag) -> bool {
        self.len == other.len && self.crc == other.crc && self.shown == other.shown
    }

    /// Whether two tags name the same record type: the same tag, or the same type name once
    /// module paths are dropped ([`short_type_name`]), so a log written under the full path
    /// `std::any::type_name` gave (`my_app::Order`, the default of earlier versions) opens
    /// with today's default (`Order`), and from another binary of the same package
    /// (`other_bin::Order`). Only whole stored tags are compared that way (a tag longer than
    /// the header's 200 bytes is compared exactly).
    pub fn names_same_type(&self, other: &TypeTag) -> bool {
        self.same_as(other)
            || (self.is_whole()
                && other.is_whole()
                && short_type_name(&self.shown) == short_type_name(&other.shown))
    }

    fn is_whole(&self) -> bool {
        self.shown.len() == self.len as usize
    }
}

/// The default type tag of a record type `T`: its Rust type name without module paths, so it
/// does not depend on the crate or binary that names it (`Order`, `Vec<Order>`,
/// `HashMap<String, Order>`). Two types of the same name in different modules get the same
/// default tag: set a tag of your own (`WalOptions::type_tag`) to tell them apart.
pub fn default_type_tag<T: ?Sized>() -> String {
    short_type_name(std::any::type_name::<T>())
}

/// `a::b::Order<c::Item>` → `Order<Item>`: every path in a type name cut to its last segment.
pub fn short_type_name(full: &str) -> String {
    let mut short = String::with_capacity(full.len());
    let mut segment = String::new();
    for c in full.chars() {
        if c.is_alphanumeric() || c == '_' || c == ':' {
            segment.push(c);
        } else {
            short.push_str(segment.rsplit("::").next().unwrap_or(""));
            segment.clear();
            short.push(c);
        }
    }
    short.push_str(segment.rsplit("::").next().unwrap_or(""));
    short
}

impl TypeTag {}

impl std::fmt::Display for TypeTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown)?;
        if self.shown.len() < self.len as usize {
            f.write_str("...")?;
        }
        Ok(())
    }
}

/// A decoded segment header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The layout of the segment's frames, stored as the format version (1 or 2).
    pub layout: Layout,
    pub codec: Codec,
    pub segment_seq: u64,
    pub start_lsn: Lsn,
    pub capacity: u64,
    pub type_tag: TypeTag,
}

/// Why bytes are not a valid segment header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("file is shorter than a segment header ({len} of {HEADER_BYTES} bytes)")]
    TooShort { len: usize },
    #[error("not a stela segment (bad magic)")]
    BadMagic,
    #[error("segment header checksum mismatch")]
    ChecksumMismatch,
    #[error("segment format version {found} is not supported (this build reads versions 1 and {FORMAT_VERSION})")]
    UnsupportedVersion { found: u16 },
    #[error("segment capacity {capacity} is above {MAX_CAPACITY_V2}, the largest a version 2 segment can have")]
    CapacityTooLarge { capacity: u64 },
    #[error("unknown codec id {id} in segment header")]
    UnknownCodec { id: u8 },
    #[error("segment header length {len} is not {HEADER_BYTES}")]
    BadLength { len: u32 },
    #[error("segment header starts at LSN 0")]
    ZeroStartLsn,
    #[error("segment header starts at the reserved LSN {}", u64::MAX)]
    ReservedStartLsn,
    #[error("record type tag in segment header is not UTF-8")]
    BadTypeTag,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(MAGIC);
        out[8..10].copy_from_slice(&self.layout.version().to_le_bytes());
        out[10] = self.codec.id();
        out[11] = 0;
        out[12..16].copy_from_slice(&(HEADER_BYTES as u32).to_le_bytes());
        out[16..24].copy_from_slice(&self.segment_seq.to_le_bytes());
        out[24..32].copy_from_slice(&self.start_lsn.get().to_le_bytes());
        out[32..40].copy_from_slice(&self.capacity.to_le_bytes());
        out[40..44].copy_from_slice(&self.type_tag.len.to_le_bytes());
        out[44..48].copy_from_slice(&self.type_tag.crc.to_le_bytes());
        let shown = self.type_tag.shown.as_bytes();
        out[TAG_OFFSET..TAG_OFFSET + shown.len()].copy_from_slice(shown);
        let crc = crc32c::crc32c(&out[..CRC_OFFSET]);
        out[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, HeaderError> {
        let bytes = bytes
            .get(..HEADER_BYTES)
            .ok_or(HeaderError::TooShort { len: bytes.len() })?;
        if &bytes[0..8] != MAGIC {
            return Err(HeaderError::BadMagic);
        }
        let stored = u32_at(bytes, CRC_OFFSET);
        if crc32c::crc32c(&bytes[..CRC_OFFSET]) != stored {
            return Err(HeaderError::ChecksumMismatch);
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let layout = Layout::from_version(version)
            .ok_or(HeaderError::UnsupportedVersion { found: version })?;
        let codec = Codec::from_id(bytes[10]).ok_or(HeaderError::UnknownCodec { id: bytes[10] })?;
        let len = u32_at(bytes, 12);
        if len as usize != HEADER_BYTES {
            return Err(HeaderError::BadLength { len });
        }
        let start_lsn = Lsn::new(u64_at(bytes, 24));
        if start_lsn == Lsn::ZERO {
            return Err(HeaderError::ZeroStartLsn);
        }
        if start_lsn > Lsn::MAX {
            return Err(HeaderError::ReservedStartLsn);
        }
        let capacity = u64_at(bytes, 32);
        if layout == Layout::V2 && capacity > MAX_CAPACITY_V2 {
            return Err(HeaderError::CapacityTooLarge { capacity });
        }
        let tag_bytes = &bytes[TAG_OFFSET..TAG_OFFSET + TAG_CAPACITY];
        let shown_len = tag_bytes
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(TAG_CAPACITY);
        // Strict, not lossy: `TypeTag::new` only ever stores whole UTF-8 characters, and a lossy
        // conversion could turn the 200 stored bytes into up to 600, which `encode` cannot write
        // back (found by the `segment_header` fuzz target).
        let shown = std::str::from_utf8(&tag_bytes[..shown_len])
            .map_err(|_| HeaderError::BadTypeTag)?
            .to_string();
        Ok(SegmentHeader {
            layout,
            codec,
            segment_seq: u64_at(bytes, 16),
            start_lsn,
            capacity,
            type_tag: TypeTag {
                shown,
                len: u32_at(bytes, 40),
                crc: u32_at(bytes, 44),
            },
        })
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    mod record_types {
        pub mod a {
            pub struct Order;
        }
        pub mod b {
            pub struct Order;
        }
    }

    #[test]
    fn the_default_tag_does_not_depend_on_the_module_or_crate() {
        use record_types::{a, b};
        assert_eq!(default_type_tag::<a::Order>(), "Order");
        assert_eq!(
            default_type_tag::<b::Order>(),
            default_type_tag::<a::Order>()
        );
        assert_eq!(default_type_tag::<Vec<a::Order>>(), "Vec<Order>");
        assert_eq!(
            default_type_tag::<std::collections::HashMap<String, (u32, a::Order)>>(),
            "HashMap<String, (u32, Order)>"
        );
        assert_eq!(default_type_tag::<[u8]>(), "[u8]");
        assert_eq!(short_type_name("&dyn my_crate::Trait"), "&dyn Trait");
    }

    #[test]
    fn tags_name_the_same_type_across_module_paths_only() {
        let old = TypeTag::new("my_app::orders::Order");
        let other_bin = TypeTag::new("other_bin::Order");
        let today = TypeTag::new("Order");
        assert!(old.names_same_type(&today) && today.names_same_type(&old));
        assert!(other_bin.names_same_type(&old));
        assert!(!old.same_as(&today));
        assert!(!today.names_same_type(&TypeTag::new("Invoice")));
        assert!(!today.names_same_type(&TypeTag::new("Vec<Order>")));
        // A tag cut to the header's capacity is compared exactly.
        let long = format!("m::{}", "X".repeat(300));
        let cut = TypeTag::new(&long);
        assert!(cut.names_same_type(&TypeTag::new(&long)));
        assert!(!cut.names_same_type(&TypeTag::new(&long[3..])));
    }

    use super::*;
    use proptest::prelude::*;

    fn sample(tag: &str) -> SegmentHeader {
        SegmentHeader {
            layout: Layout::V2,
            codec: Codec::Postcard,
            segment_seq: 3,
            start_lsn: Lsn::new(1001),
            capacity: 64 << 20,
            type_tag: TypeTag::new(tag),
        }
    }

    #[test]
    fn headers_round_trip_including_long_tags() {
        for tag in ["app::Record", &"x".repeat(500), &"é".repeat(150)] {
            let header = sample(tag);
            let decoded = SegmentHeader::decode(&header.encode()).unwrap();
            assert_eq!(decoded, header);
            assert!(decoded.type_tag.same_as(&TypeTag::new(tag)));
        }
    }

    #[test]
    fn long_tags_that_share_a_prefix_differ() {
        let a = TypeTag::new(&format!("{}A", "p".repeat(300)));
        let b = TypeTag::new(&format!("{}B", "p".repeat(300)));
        assert!(!a.same_as(&b));
    }

    /// Bytes with a valid checksum around a tag that `TypeTag::new` cannot have written.
    fn with_tag_bytes(tag: &[u8]) -> [u8; HEADER_BYTES] {
        let mut bytes = sample("").encode();
        bytes[TAG_OFFSET..TAG_OFFSET + tag.len()].copy_from_slice(tag);
        let crc = crc32c::crc32c(&bytes[..CRC_OFFSET]);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        bytes
    }

    #[test]
    fn a_tag_that_is_not_utf8_is_an_error_not_a_longer_tag() {
        // Lossily decoded, 200 invalid bytes became 600 bytes that `encode` could not write.
        let bytes = with_tag_bytes(&[0xFB; TAG_CAPACITY]);
        assert_eq!(SegmentHeader::decode(&bytes), Err(HeaderError::BadTypeTag));
        let bytes = with_tag_bytes(b"app::R\xC3");
        assert_eq!(SegmentHeader::decode(&bytes), Err(HeaderError::BadTypeTag));
    }

    #[test]
    fn a_segment_cannot_start_at_the_reserved_lsn() {
        let mut header = sample("t");
        header.start_lsn = Lsn::MAX;
        assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header.clone()));
        header.start_lsn = Lsn::new(u64::MAX);
        let err = SegmentHeader::decode(&header.encode());
        assert_eq!(err, Err(HeaderError::ReservedStartLsn));
    }

    #[test]
    fn a_tag_with_a_zero_byte_matches_itself_after_a_round_trip() {
        let tag = TypeTag::new("app::Record\0v2");
        assert_eq!(tag.shown, "app::Record");
        let decoded = SegmentHeader::decode(&sample("app::Record\0v2").encode()).unwrap();
        assert!(decoded.type_tag.same_as(&tag));
        assert!(!tag.same_as(&TypeTag::new("app::Record")));
        assert!(!tag.same_as(&TypeTag::new("app::Record\0v3")));
    }

    #[test]
    fn both_versions_round_trip_and_others_are_refused() {
        for layout in [Layout::V1, Layout::V2] {
            let header = SegmentHeader {
                layout,
                ..sample("t")
            };
            let bytes = header.encode();
            assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), layout.version());
            assert_eq!(SegmentHeader::decode(&bytes), Ok(header));
        }
        let mut bytes = sample("t").encode();
        bytes[8..10].copy_from_slice(&3u16.to_le_bytes());
        let crc = crc32c::crc32c(&bytes[..CRC_OFFSET]);
        bytes[CRC_OFFSET..].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SegmentHeader::decode(&bytes),
            Err(HeaderError::UnsupportedVersion { found: 3 })
        );
    }

    #[test]
    fn a_v2_segment_larger_than_u32_is_refused_but_a_v1_one_reads() {
        let big = MAX_CAPACITY_V2 + 1;
        let v2 = SegmentHeader {
            capacity: big,
            ..sample("t")
        };
        assert_eq!(
            SegmentHeader::decode(&v2.encode()),
            Err(HeaderError::CapacityTooLarge { capacity: big })
        );
        let v1 = SegmentHeader {
            layout: Layout::V1,
            ..v2
        };
        assert_eq!(SegmentHeader::decode(&v1.encode()), Ok(v1));
    }

    proptest! {
        #[test]
        fn any_flipped_bit_is_detected(bit in 0usize..HEADER_BYTES * 8) {
            let mut bytes = sample("app::Record").encode();
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(SegmentHeader::decode(&bytes).is_err());
        }
    }
}
