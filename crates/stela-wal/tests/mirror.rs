//! Mirroring a log chunk by chunk (`stela_wal::mirror`): the copy is byte-identical to the
//! original whatever the chunk sizes, a chunk that does not continue the mirror is refused and
//! changes nothing, and a mirror recovers like any log.

use proptest::prelude::*;
use std::path::Path;
use stela_wal::mirror::{read_chunk, Chunk, Mirror, MirrorError, Position};
use stela_wal::{Codec, Log, LogFiles, Lsn, WalOptions};

const TAG: &str = "test::Record";

fn options(segment_bytes: u64) -> WalOptions {
    WalOptions::default()
        .codec(Codec::MessagePack)
        .segment_bytes(segment_bytes)
}

/// Writes `sizes.len()` records of those sizes (committed in groups of `group`), closes the log.
fn write_log(dir: &Path, sizes: &[usize], group: usize, segment_bytes: u64) -> u64 {
    let log = Log::open(dir, options(segment_bytes), TAG).unwrap();
    let mut last = Lsn::new(0);
    for (i, chunk) in sizes.chunks(group.max(1)).enumerate() {
        let payloads: Vec<Vec<u8>> = chunk
            .iter()
            .enumerate()
            .map(|(j, &n)| vec![(i * 7 + j) as u8 | 1; n])
            .collect();
        last = log
            .append_all(payloads.iter().map(|p| p.as_slice()))
            .unwrap();
        log.commit(last).unwrap();
    }
    log.close().unwrap();
    last.get()
}

/// Ships everything from `primary` to `mirror` in chunks of at most `max` bytes (`max` cycles
/// through `maxes`), syncing after every `sync_every` chunks.
fn ship(primary: &LogFiles, mirror: &mut Mirror, maxes: &[usize], sync_every: usize) -> usize {
    let end = primary.next_lsn;
    let mut chunks = 0;
    // A standby that takes chunks into memory first checks them with a checker of its own: it
    // must agree with the mirror at every step.
    let mut checker = mirror.checker();
    while let Some((segment_start, offset, bytes, next)) = read_chunk(
        &primary.segments,
        mirror.position(),
        end,
        maxes[chunks % maxes.len()],
    )
    .unwrap()
    {
        let chunk = Chunk {
            segment_start,
            offset,
            bytes: &bytes,
        };
        assert_eq!(checker.check(chunk).unwrap(), next.get());
        mirror.apply(chunk).unwrap();
        assert_eq!(checker.position(), mirror.position());
        chunks += 1;
        if chunks % sync_every.max(1) == 0 {
            mirror.sync().unwrap();
        }
        assert!(chunks < 100_000, "shipping does not progress");
    }
    mirror.sync().unwrap();
    chunks
}

use stela_testkit::segment_files;

fn assert_identical(a: &Path, b: &Path) {
    let (a, b) = (segment_files(a), segment_files(b));
    assert_eq!(
        a.iter().map(|f| &f.0).collect::<Vec<_>>(),
        b.iter().map(|f| &f.0).collect::<Vec<_>>(),
        "the same segment files"
    );
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x.len(), y.len(), "{name}: same size");
        if let Some(at) = x.iter().zip(y).position(|(p, q)| p != q) {
            panic!("{name}: first differing byte at offset {at}");
        }
    }
}

fn mirror_and_compare(sizes: &[usize], group: usize, maxes: &[usize], sync_every: usize) {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    // Small segments so that records cross many segment boundaries; the mirror is created with a
    // different configured size: it must take the primary's capacity from the shipped headers.
    let last = write_log(&p, sizes, group, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    let mut mirror = Mirror::open(&m, options(1 << 20), TAG).unwrap();
    ship(&primary, &mut mirror, maxes, sync_every);
    assert_eq!(mirror.received_lsn(), last);
    assert_eq!(mirror.durable_lsn(), last);
    drop(mirror);
    drop(primary);
    // An empty log ships nothing, not even its header: its first records will bring it.
    if last > 0 {
        assert_identical(&p, &m);
    }
    // And the mirror opens as a log holding every record.
    let reopened = LogFiles::open(&m, options(4096), TAG).unwrap();
    assert_eq!(reopened.next_lsn.get(), last + 1);
    let records = reopened
        .segments
        .reader(Lsn::FIRST, reopened.next_lsn)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert_eq!(records.len() as u64, last);
}

#[test]
fn a_mirror_is_byte_identical_across_segments() {
    let sizes: Vec<usize> = (0..300).map(|i| 1 + (i * 37) % 700).collect();
    mirror_and_compare(&sizes, 5, &[1, 300, 5000, 64 << 10], 3);
}

#[test]
fn an_empty_log_mirrors_to_an_empty_log() {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    write_log(&p, &[], 1, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    let mut mirror = Mirror::open(&m, options(4096), TAG).unwrap();
    assert_eq!(ship(&primary, &mut mirror, &[4096], 1), 0);
    assert_eq!(mirror.received_lsn(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_chunking_gives_identical_files(
        sizes in prop::collection::vec(0usize..1500, 0..120),
        group in 1usize..8,
        maxes in prop::collection::vec(1usize..9000, 1..6),
        sync_every in 1usize..5,
    ) {
        mirror_and_compare(&sizes, group, &maxes, sync_every);
    }
}

/// A primary with a few segments, a mirror half way through it, and the next chunk.
struct HalfWay {
    _root: tempfile::TempDir,
    primary: LogFiles,
    mirror: Mirror,
    next: (Lsn, u64, Vec<u8>, Lsn),
}

fn half_way() -> HalfWay {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    let sizes: Vec<usize> = (0..60).map(|i| 50 + i * 3).collect();
    write_log(&p, &sizes, 3, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    let mut mirror = Mirror::open(&m, options(4096), TAG).unwrap();
    for _ in 0..5 {
        let (s, o, b, _) = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, 700)
            .unwrap()
            .unwrap();
        mirror
            .apply(Chunk {
                segment_start: s,
                offset: o,
                bytes: &b,
            })
            .unwrap();
    }
    let next = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, 700)
        .unwrap()
        .unwrap();
    HalfWay {
        _root: root,
        primary,
        mirror,
        next,
    }
}

fn refused(mirror: &mut Mirror, segment_start: Lsn, offset: u64, bytes: &[u8]) -> String {
    let before = mirror.position();
    match mirror.apply(Chunk {
        segment_start,
        offset,
        bytes,
    }) {
        Err(MirrorError::Refused(why)) => {
            assert_eq!(mirror.position(), before, "a refused chunk moves nothing");
            why
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn chunks_that_do_not_continue_the_mirror_are_refused_and_change_nothing() {
    let mut h = half_way();
    let (s, o, b, _) = h.next.clone();
    let frames_at = if o == 0 { 256 } else { 0 };
    // Wrong offset, wrong segment.
    if o != 0 {
        refused(&mut h.mirror, s, o + 1, &b);
        refused(&mut h.mirror, Lsn::new(s.get() + 1), o, &b);
    }
    // A flipped bit in every position of the first frame.
    for i in frames_at..(frames_at + 30).min(b.len()) {
        let mut bad = b.clone();
        bad[i] ^= 0x10;
        let why = refused(&mut h.mirror, s, o, &bad);
        assert!(!why.is_empty());
    }
    // Cut inside a frame.
    if b.len() > frames_at + 1 {
        refused(&mut h.mirror, s, o, &b[..b.len() - 1]);
    }
    // Blank bytes appended.
    let mut padded = b.clone();
    padded.extend_from_slice(&[0u8; 64]);
    refused(&mut h.mirror, s, o, &padded);
    // The same chunk twice: the second does not continue.
    h.mirror
        .apply(Chunk {
            segment_start: s,
            offset: o,
            bytes: &b,
        })
        .unwrap();
    refused(&mut h.mirror, s, o, &b);
    // The mirror is still usable: the rest ships and the files are identical.
    ship(&h.primary, &mut h.mirror, &[900], 2);
    let (p, m) = (
        h.primary.segments.dir().to_path_buf(),
        h.mirror.segments().dir().to_path_buf(),
    );
    drop(h.mirror);
    drop(h.primary);
    assert_identical(&p, &m);
}

#[test]
fn a_segment_header_of_another_log_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    write_log(&p, &[100; 10], 2, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    // A mirror of another record type, and one of another codec.
    let mut other_type =
        Mirror::open(&root.path().join("t"), options(4096), "other::Type").unwrap();
    let mut other_codec = Mirror::open(
        &root.path().join("c"),
        options(4096).codec(Codec::Json),
        TAG,
    )
    .unwrap();
    for mirror in [&mut other_type, &mut other_codec] {
        let (s, o, b, _) = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, 4096)
            .unwrap()
            .unwrap();
        assert_eq!(
            o, 0,
            "a fresh mirror starts with the first segment's header"
        );
        let why = refused(mirror, s, o, &b);
        assert!(why.contains("records in"), "{why}");
    }
    // A mirror that is ahead (it holds records already) refuses the first segment again.
    let mut ahead = Mirror::open(&m, options(4096), TAG).unwrap();
    ship(&primary, &mut ahead, &[4096], 1);
    let first = read_chunk(
        &primary.segments,
        Position {
            segment_start: Lsn::FIRST,
            offset: 0,
            next_lsn: Lsn::FIRST,
        },
        primary.next_lsn,
        4096,
    );
    let (s, o, b, _) = first.unwrap().unwrap();
    refused(&mut ahead, s, o, &b);
}

#[test]
fn a_mirror_reopened_continues_where_it_stopped() {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    let sizes: Vec<usize> = (0..200).map(|i| 10 + (i * 13) % 400).collect();
    write_log(&p, &sizes, 4, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    let mut mirror = Mirror::open(&m, options(4096), TAG).unwrap();
    for _ in 0..7 {
        let (s, o, b, _) = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, 1000)
            .unwrap()
            .unwrap();
        mirror
            .apply(Chunk {
                segment_start: s,
                offset: o,
                bytes: &b,
            })
            .unwrap();
    }
    mirror.sync().unwrap();
    let stopped_at = mirror.durable_lsn();
    drop(mirror);
    let mut mirror = Mirror::open(&m, options(4096), TAG).unwrap();
    assert_eq!(mirror.received_lsn(), stopped_at);
    ship(&primary, &mut mirror, &[777], 1);
    drop(mirror);
    drop(primary);
    assert_identical(&p, &m);
}

mod power_loss {
    use super::*;
    use std::sync::Arc;
    use stela_wal::storage::{CrashPlan, FaultStorage, Storage};

    const MIRROR: &str = "/mirror/log";

    fn mirror_options(fs: &FaultStorage) -> WalOptions {
        options(4096).storage(Arc::new(fs.clone()) as Arc<dyn Storage>)
    }

    fn records(segments: &stela_wal::SegmentSet, end: Lsn) -> Vec<(Lsn, Vec<u8>)> {
        segments
            .reader(Lsn::FIRST, end)
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// A standby loses power while mirroring, its unsynced writes kept in any order of their
        /// sectors: the mirror reopens without an operator (a torn tail, never corruption), keeps
        /// every record it reported durable, holds only the primary's records, and then catches
        /// up to a byte-for-byte copy of the primary's records.
        #[test]
        fn a_mirror_survives_power_loss(
            chunks_before_cut in 1usize..40,
            maxes in prop::collection::vec(1usize..3000, 1..5),
            sync_every in 1usize..6,
            seed in any::<u64>(),
            scramble in any::<bool>(),
        ) {
            let root = tempfile::tempdir().unwrap();
            let p = root.path().join("primary");
            let sizes: Vec<usize> = (0..150).map(|i| 1 + (i * 53) % 600).collect();
            let last = write_log(&p, &sizes, 3, 4096);
            let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
            let expected = records(&primary.segments, primary.next_lsn);

            let fs = FaultStorage::new();
            let mut mirror = Mirror::open(Path::new(MIRROR), mirror_options(&fs), TAG).unwrap();
            let mut durable = 0;
            for i in 0..chunks_before_cut {
                let Some((s, o, b, _)) = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, maxes[i % maxes.len()]).unwrap() else { break };
                mirror.apply(Chunk { segment_start: s, offset: o, bytes: &b }).unwrap();
                if (i + 1) % sync_every == 0 {
                    durable = mirror.sync().unwrap();
                }
                durable = durable.max(mirror.durable_lsn());
            }
            drop(mirror);
            fs.crash(if scramble { CrashPlan::ScrambleSectors { seed } } else { CrashPlan::TearUnsynced { seed } });

            let mut mirror = Mirror::open(Path::new(MIRROR), mirror_options(&fs), TAG)
                .expect("a mirror opens after a power cut with no operator");
            let kept = mirror.received_lsn();
            prop_assert!(kept >= durable, "kept {kept} < durable {durable}");
            let got = records(mirror.segments(), Lsn::new(kept + 1));
            prop_assert_eq!(&got[..], &expected[..kept as usize]);
            ship(&primary, &mut mirror, &maxes, sync_every);
            prop_assert_eq!(mirror.received_lsn(), last);
            let got = records(mirror.segments(), Lsn::new(last + 1));
            prop_assert_eq!(got, expected);
        }
    }
}

/// A copy that ends before the primary's oldest segment (the primary truncated what lay
/// between) cannot be continued; begun again at that segment's header it becomes the primary's
/// copy byte for byte. A header that would not begin after the copy is refused and changes
/// nothing.
#[test]
fn a_copy_behind_a_truncated_primary_begins_again_at_its_oldest_segment() {
    let root = tempfile::tempdir().unwrap();
    let (p, m) = (root.path().join("primary"), root.path().join("mirror"));
    let sizes: Vec<usize> = (0..300).map(|i| 1 + (i * 37) % 700).collect();
    let last = write_log(&p, &sizes, 3, 4096);
    let primary = LogFiles::open(&p, options(4096), TAG).unwrap();
    // The copy takes the first 20 records, then the primary truncates past them.
    let mut mirror = Mirror::open(&m, options(4096), TAG).unwrap();
    while let Some((segment_start, offset, bytes, _)) =
        read_chunk(&primary.segments, mirror.position(), Lsn::new(21), 4096).unwrap()
    {
        let chunk = Chunk {
            segment_start,
            offset,
            bytes: &bytes,
        };
        mirror.apply(chunk).unwrap();
    }
    mirror.sync().unwrap();
    assert_eq!(mirror.received_lsn(), 20);
    assert!(primary.segments.truncate_before(Lsn::new(150)).unwrap() > 0);
    let oldest = primary.segments.list()[0].clone();
    assert!(oldest.start.get() > 21, "{oldest:?}");
    let error = read_chunk(&primary.segments, mirror.position(), primary.next_lsn, 4096)
        .expect_err("the copy's segment is gone on the primary");
    assert!(error.to_string().contains("truncated"), "{error}");
    let header = primary.segments.read_header(&oldest.path).unwrap();
    drop(mirror);

    // Refused, nothing changed: a header at or below what the copy holds, or of another log.
    let before = segment_files(&m);
    let mut low = header.clone();
    low.start_lsn = Lsn::new(20);
    let refused = stela_wal::mirror::restart_at(&m, options(4096), TAG, &low).unwrap_err();
    assert!(matches!(refused, MirrorError::Refused(_)), "{refused}");
    let refused = stela_wal::mirror::restart_at(&m, options(4096), "other::Type", &header);
    assert!(refused.is_err());
    let mut other = header.clone();
    other.type_tag = stela_format::TypeTag::new("other::Type");
    let refused = stela_wal::mirror::restart_at(&m, options(4096), TAG, &other).unwrap_err();
    assert!(matches!(refused, MirrorError::Refused(_)), "{refused}");
    assert_eq!(segment_files(&m), before);

    let removed = stela_wal::mirror::restart_at(&m, options(4096), TAG, &header).unwrap();
    assert_eq!(removed, before.len());
    let mut mirror = Mirror::open(&m, options(1 << 20), TAG).unwrap();
    assert_eq!(
        mirror.position(),
        Position {
            segment_start: oldest.start,
            offset: stela_format::header::HEADER_BYTES as u64,
            next_lsn: oldest.start,
        }
    );
    ship(&primary, &mut mirror, &[700, 4096], 2);
    assert_eq!(mirror.received_lsn(), last);
    drop(mirror);
    drop(primary);
    assert_identical(&p, &m);
}
