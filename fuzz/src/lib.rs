//! Shared pieces of the fuzz targets: the paper's record type, how a target reads its input, and
//! the valid inputs the seed corpus is made of (`tests/seeds.rs` writes them to `seeds/`).

use serde::{Deserialize, Serialize};
use stela_format::frame::Layout;
use stela_format::resync;
use stela_format::{frame, header, Codec, Lsn, SegmentHeader, TypeTag};

/// The record type of the paper's benchmark.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub id: u32,
    pub comment: String,
    pub objects: Vec<Data>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Data {
    pub a: u32,
    pub b: u32,
}

/// The type tag the seed segments are written with (and `recovery_open` opens them with).
pub const TYPE_TAG: &str = "stela_fuzz::Record";

/// Segment size the seeds and `recovery_open` use: small, so a run stays fast.
pub const SEGMENT_BYTES: u64 = 1024;

/// A few records, from empty to a handful of objects.
pub fn sample_records() -> Vec<Record> {
    vec![
        Record {
            id: 0,
            comment: String::new(),
            objects: vec![],
        },
        Record {
            id: 7,
            comment: "transfer".into(),
            objects: vec![Data { a: 1, b: 2 }, Data { a: 3, b: 4 }],
        },
        Record {
            id: u32::MAX,
            comment: "é\"\\\u{1F600}".into(),
            objects: vec![Data {
                a: u32::MAX,
                b: 0x8000_0000,
            }],
        },
    ]
}

/// The header of a segment of [`Record`]s, version 2.
pub fn header(codec: Codec, segment_seq: u64, start: Lsn, capacity: u64) -> SegmentHeader {
    SegmentHeader {
        layout: Layout::V2,
        codec,
        segment_seq,
        start_lsn: start,
        capacity,
        type_tag: TypeTag::new(TYPE_TAG),
    }
}

/// A whole segment file as the log writes it: header, frames of `records` from `start` on (each
/// committed before the next was framed, so each frame's sync base is its own offset), zeros up
/// to `capacity` (if the frames leave room). Version 1 segments, as older builds wrote them,
/// have 16-byte frames without a sync base.
pub fn segment(
    layout: Layout,
    codec: Codec,
    start: Lsn,
    records: &[Record],
    capacity: u64,
) -> Vec<u8> {
    let mut bytes = SegmentHeader {
        layout,
        ..header(codec, 0, start, capacity)
    }
    .encode()
    .to_vec();
    let mut lsn = start;
    for record in records {
        let payload = codec.encode(record).expect("records encode");
        match layout {
            Layout::V1 => resync::encode_v1(&mut bytes, lsn, &payload),
            Layout::V2 => {
                let sync_base = bytes.len() as u32;
                frame::encode(&mut bytes, lsn, &payload, sync_base)
            }
        }
        lsn = lsn.next();
    }
    if bytes.len() < capacity as usize {
        bytes.resize(capacity as usize, 0);
    }
    bytes
}

/// The frame layout a segment's header names (version 1, or else version 2: a header the
/// fuzzer broke is refused before any frame is read anyway).
pub fn header_layout(bytes: &[u8]) -> Layout {
    match bytes.get(8..10) {
        Some([1, 0]) => Layout::V1,
        _ => Layout::V2,
    }
}

/// The first LSN a segment's header names, if the bytes are long enough to hold one and it is
/// not 0. `recovery_open` names the segment file after it, as the log does, so that a header the
/// fuzzer keeps valid also passes the name check.
pub fn header_start_lsn(bytes: &[u8]) -> Option<Lsn> {
    let field: [u8; 8] = bytes.get(24..32)?.try_into().ok()?;
    Some(Lsn::new(u64::from_le_bytes(field))).filter(|&lsn| lsn != Lsn::ZERO)
}

/// The codec a segment's header names, if any.
pub fn header_codec(bytes: &[u8]) -> Option<Codec> {
    bytes.get(10).copied().and_then(Codec::from_id)
}

/// Payload limits a scan is tried with: unlimited (as `stela wal verify`), the format's, and
/// small ones that make lengths implausible.
pub const MAX_PAYLOADS: [u32; 6] = [u32::MAX, frame::MAX_PAYLOAD_BYTES, 1024, 64, 16, 0];

/// How `segment_scan` reads its input: one control byte, then the whole segment file (whose
/// header's version picks the frame layout, see [`header_layout`]).
#[derive(Debug, Clone, Copy)]
pub struct ScanInput<'a> {
    pub is_last: bool,
    pub skip_damage: bool,
    pub max_payload: u32,
    pub segment: &'a [u8],
}

impl<'a> ScanInput<'a> {
    /// Control byte: bit 0 `is_last`, bit 1 `skip_damage`, bits 2.. pick from [`MAX_PAYLOADS`].
    pub fn parse(data: &'a [u8]) -> Option<ScanInput<'a>> {
        let (&control, segment) = data.split_first()?;
        Some(ScanInput {
            is_last: control & 1 != 0,
            skip_damage: control & 2 != 0,
            max_payload: MAX_PAYLOADS[usize::from(control >> 2) % MAX_PAYLOADS.len()],
            segment,
        })
    }

    pub fn control_byte(is_last: bool, skip_damage: bool, max_payload_index: usize) -> u8 {
        u8::from(is_last) | (u8::from(skip_damage) << 1) | ((max_payload_index as u8) << 2)
    }
}

/// Checks that `seeds/<target>/<name>` holds each seed's bytes, or, with `STELA_WRITE_SEEDS`
/// set, writes them there; returns their total size. The seed tests' one loop.
///
/// # Panics
/// On a missing or stale seed file (the test's failure), or a file that cannot be written.
pub fn check_or_write_seeds(seeds: Vec<(&str, String, Vec<u8>)>) -> usize {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let write = std::env::var_os("STELA_WRITE_SEEDS").is_some();
    let mut total = 0;
    for (target, name, bytes) in seeds {
        let path = root.join(target).join(&name);
        total += bytes.len();
        if write {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        } else {
            let stored = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run with STELA_WRITE_SEEDS=1)", path.display())
            });
            assert!(stored == bytes, "{} is stale", path.display());
        }
    }
    total
}

/// As [`check_or_write_seeds`], for the seeds of one target: `(file name, bytes)`.
pub fn check_or_write_target_seeds<N: Into<String>>(
    target: &str,
    seeds: impl IntoIterator<Item = (N, Vec<u8>)>,
) -> usize {
    check_or_write_seeds(
        seeds
            .into_iter()
            .map(|(name, bytes)| (target, name.into(), bytes))
            .collect(),
    )
}

/// The checked-in seeds: `(target, file name, bytes)`. Every one is a valid input produced by
/// the encoders, or a valid input with one classic defect (a torn tail, a flipped byte).
pub fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out = Vec::new();
    let records = sample_records();

    // frame_decode: frames of each codec's payloads in both layouts (the target decodes every
    // input with both), and the edge cases of the header.
    for codec in Codec::ALL {
        let payload = codec.encode(&records[1]).expect("encodes");
        let mut bytes = Vec::new();
        frame::encode(&mut bytes, Lsn::new(1), &payload, 4096);
        out.push(("frame_decode", format!("{}-lsn1", codec.name()), bytes));
        let mut bytes = Vec::new();
        resync::encode_v1(&mut bytes, Lsn::new(1), &payload);
        out.push(("frame_decode", format!("{}-lsn1-v1", codec.name()), bytes));
    }
    let mut empty = Vec::new();
    frame::encode(&mut empty, Lsn::MAX, b"", frame::MIN_SYNC_BASE);
    out.push(("frame_decode", "empty-payload-max-lsn".into(), empty));
    out.push(("frame_decode", "unwritten".into(), vec![0; 20]));

    // segment_header: one header per codec, one with a tag longer than the 200 stored bytes,
    // one of version 1.
    for codec in Codec::ALL {
        let h = header(codec, 3, Lsn::new(1001), SEGMENT_BYTES);
        out.push(("segment_header", codec.name().into(), h.encode().to_vec()));
    }
    let v1 = SegmentHeader {
        layout: Layout::V1,
        ..header(Codec::Postcard, 0, Lsn::FIRST, SEGMENT_BYTES)
    };
    out.push(("segment_header", "v1".into(), v1.encode().to_vec()));
    let long = SegmentHeader {
        type_tag: TypeTag::new(&"é".repeat(150)),
        ..header(Codec::Json, 0, Lsn::FIRST, 64 << 20)
    };
    out.push(("segment_header", "long-tag".into(), long.encode().to_vec()));

    // segment_scan and recovery_open: whole segments, clean, torn and damaged.
    let clean = |layout, codec: Codec| segment(layout, codec, Lsn::FIRST, &records, SEGMENT_BYTES);
    let frame_ends = |layout: Layout, codec: Codec| {
        let mut end = header::HEADER_BYTES;
        let mut ends = Vec::new();
        for record in &records {
            end += layout.frame_len(codec.encode(record).expect("encodes").len());
            ends.push(end);
        }
        ends
    };
    let mut segments = Vec::new();
    for codec in Codec::ALL {
        segments.push((format!("{}-clean", codec.name()), clean(Layout::V2, codec)));
    }
    let end = *frame_ends(Layout::V2, Codec::Postcard)
        .last()
        .expect("records");
    let mut torn = clean(Layout::V2, Codec::Postcard);
    torn[end - 3..end + 5].fill(0xA5); // the last frame cut short, garbage after it
    segments.push(("postcard-torn-tail".into(), torn));
    let mut damaged = clean(Layout::V2, Codec::MessagePack);
    damaged[header::HEADER_BYTES + 24] ^= 0x40; // inside the first record: valid records follow
    segments.push(("msgpack-damaged-middle".into(), damaged));
    // The first record synced on its own, the other two written together after it (framed
    // with the first one's end as their sync base), and the middle of that last write lost: a
    // torn last write, with a valid record after the damage.
    let ends = frame_ends(Layout::V2, Codec::Json);
    let mut last_write = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let payload = Codec::Json.encode(record).expect("encodes");
        let base = if i == 0 {
            header::HEADER_BYTES
        } else {
            ends[0]
        };
        frame::encode(
            &mut last_write,
            Lsn::new(i as u64 + 1),
            &payload,
            base as u32,
        );
    }
    let mut torn_write = header(Codec::Json, 0, Lsn::FIRST, SEGMENT_BYTES)
        .encode()
        .to_vec();
    torn_write.extend_from_slice(&last_write);
    torn_write.resize(SEGMENT_BYTES as usize, 0);
    torn_write[ends[0] + 4..ends[1] - 2].fill(0);
    segments.push(("json-torn-last-write".into(), torn_write));
    let start_late = segment(
        Layout::V2,
        Codec::Json,
        Lsn::new(41235),
        &records[..2],
        SEGMENT_BYTES,
    );
    segments.push(("json-start-41235".into(), start_late));
    segments.push((
        "msgpack-v1-clean".into(),
        clean(Layout::V1, Codec::MessagePack),
    ));
    let v1_end = *frame_ends(Layout::V1, Codec::Postcard)
        .last()
        .expect("records");
    let mut v1_torn = clean(Layout::V1, Codec::Postcard);
    v1_torn[v1_end - 3..v1_end + 5].fill(0xA5);
    segments.push(("postcard-v1-torn-tail".into(), v1_torn));

    for (name, bytes) in &segments {
        for (is_last, skip) in [(true, false), (false, true)] {
            let mut input = vec![ScanInput::control_byte(is_last, skip, 0)];
            input.extend_from_slice(bytes);
            let name = format!("{name}-last{}-skip{}", u8::from(is_last), u8::from(skip));
            out.push(("segment_scan", name, input));
        }
        out.push(("recovery_open", name.clone(), bytes.clone()));
    }

    // record_decode: the payloads themselves (the target frames them).
    for codec in Codec::ALL {
        for (i, record) in records.iter().enumerate() {
            let payload = codec.encode(record).expect("encodes");
            out.push(("record_decode", format!("{}-{i}", codec.name()), payload));
        }
    }
    out
}

/// The data area size `ring_decode` checks entry starts against.
pub const RING_DATA_BYTES: u64 = 4096;

/// How `ring_decode` reads its input: two control bytes, then the bytes of one entry (or of a
/// ring header, or a result slot: every check runs on every input).
#[derive(Debug, Clone, Copy)]
pub struct RingInput<'a> {
    /// The seq `parse_entry` expects: the entry's own seq field when control bit 0 is set (so a
    /// valid entry gets past the seq check), else `control >> 1`.
    pub expected_seq: u64,
    /// Where in the ring the entry starts (`head`), from the second byte: 32-byte steps
    /// through the area, bit 7 adding one lap.
    pub head: u64,
    pub bytes: &'a [u8],
}

impl<'a> RingInput<'a> {
    pub fn parse(data: &'a [u8]) -> Option<RingInput<'a>> {
        let (&[control, geometry], bytes) = data.split_first_chunk::<2>()?;
        let expected_seq = if control & 1 != 0 {
            bytes.get(8..16).map_or(0, |seq| {
                u64::from_le_bytes(seq.try_into().expect("8 bytes"))
            })
        } else {
            u64::from(control >> 1)
        };
        let head = u64::from(geometry & 0x7F) * 32 + u64::from(geometry >> 7) * RING_DATA_BYTES;
        Some(RingInput {
            expected_seq,
            head,
            bytes,
        })
    }

    /// The two control bytes for an input whose entry carries its own expected seq, at `head` 0.
    pub const ENTRY_PREFIX: [u8; 2] = [1, 0];
}

/// The seeds of `ring_decode` (`tests/ring_seeds.rs` writes them to `seeds/ring_decode/`): one
/// entry of each shape from the encoder, a pad marker, a ring header's line 0 and a result slot.
pub fn ring_seeds() -> Vec<(String, Vec<u8>)> {
    use stela_proto::ring::{self, EntryHeader, EntryKind, RingLayout};
    use stela_proto::Durability;

    let entry = |seq: u64, header: EntryHeader, payloads: &[&[u8]]| {
        let mut bytes = vec![0u8; ring::entry_len(payloads).expect("fits")];
        ring::encode_entry(&mut bytes, seq, &header, payloads).expect("encodes");
        let mut input = RingInput::ENTRY_PREFIX.to_vec();
        input.extend_from_slice(&bytes);
        input
    };
    let append = |durability| EntryHeader {
        handle: 0,
        kind: EntryKind::Append,
        durability,
        lsn: 0,
    };
    let record = [0x42u8; 100];
    let mut out = vec![
        (
            "append-one-record".to_string(),
            entry(1, append(Durability::Buffered), &[b"hello"]),
        ),
        (
            "append-three-records".into(),
            entry(2, append(Durability::Unsafe), &[b"a", b"", b"exactly8"]),
        ),
        (
            "append-100-bytes".into(),
            entry(77, append(Durability::Replicated), &[&record]),
        ),
        (
            "commit-disk".into(),
            entry(
                3,
                EntryHeader {
                    handle: 5,
                    kind: EntryKind::Commit,
                    durability: Durability::Disk,
                    lsn: 4096,
                },
                &[],
            ),
        ),
        (
            "commit-all-max".into(),
            entry(
                u64::MAX,
                EntryHeader {
                    handle: u32::MAX,
                    kind: EntryKind::Commit,
                    durability: Durability::All,
                    lsn: u64::MAX,
                },
                &[],
            ),
        ),
    ];
    let mut pad = vec![0, 0x7F]; // head at 4064: the pad fills the last 32 bytes
    pad.extend_from_slice(&ring::pad_bytes());
    pad.extend_from_slice(&[0; 28]);
    out.push(("pad-at-end".into(), pad));
    let layout = RingLayout::new(1 << 20, 16).expect("valid");
    let mut header = vec![0, 0];
    header.extend_from_slice(&layout.encode_line0());
    out.push(("ring-header".into(), header));
    let mut slot = vec![0, 0];
    slot.extend_from_slice(&ring::encode_result(9, &ring::Completion::ok(100, 102)));
    out.push(("result-slot".into(), slot));
    out
}

/// The seeds of `mirror_apply` (`tests/mirror_seeds.rs` writes them to `seeds/mirror_apply/`): a
/// first segment shipped whole (mode byte 0: header and frames, no zero tail), and frames alone
/// continuing an empty first segment (mode byte 1), in both codecs' sizes of the sample records.
pub fn mirror_seeds() -> Vec<(String, Vec<u8>)> {
    let whole = segment(
        Layout::V2,
        Codec::MessagePack,
        Lsn::FIRST,
        &sample_records(),
        0,
    );
    let frames = whole[header::HEADER_BYTES..].to_vec();
    let mut shipped_header = vec![0u8];
    shipped_header.extend_from_slice(&whole);
    let mut shipped_frames = vec![1u8];
    shipped_frames.extend_from_slice(&frames);
    // The header's capacity must hold the frames: ship it with the target's segment size.
    let header_only = SegmentHeader {
        capacity: SEGMENT_BYTES,
        ..header(Codec::MessagePack, 0, Lsn::FIRST, SEGMENT_BYTES)
    };
    let mut with_capacity = vec![0u8];
    with_capacity.extend_from_slice(&header_only.encode());
    with_capacity.extend_from_slice(&frames);
    vec![
        ("segment-zero-capacity".into(), shipped_header),
        ("frames".into(), shipped_frames),
        ("segment".into(), with_capacity),
    ]
}
