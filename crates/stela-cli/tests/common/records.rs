//! The records the shared-memory crash tests write, how they are checked against the
//! acknowledgements after a crash, and their seeded randomness.
//!
//! A record is `(round, writer, seq, filler)`, the filler derived from the other three, so a
//! reader can tell a real record from garbage, or from one put at the wrong LSN, without being
//! told what was sent. Each writer of a round sends its seqs 0, 1, 2, ... in order.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

/// The record type tag of every log these tests write; the codec is MessagePack.
pub const TYPE_TAG: &str = "stela_cli_tests::shm::Rec";
/// The variable that replays a run's randomness.
pub const SEED: &str = "STELA_SHM_SEED";

/// (round, writer, seq, filler derived from the three).
pub type Rec = (u32, u32, u64, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub round: u32,
    pub writer: u32,
    pub seq: u64,
}

impl Key {
    pub fn new(round: u32, writer: u32, seq: u64) -> Key {
        Key { round, writer, seq }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The record sent as `key`: 0 to 119 filler bytes, the number derived from the key.
pub fn rec(key: Key) -> Rec {
    let len = (mix(seed_of(key)) % 120) as usize;
    rec_sized(key, len)
}

/// The record sent as `key`, with `len` filler bytes.
pub fn rec_sized(key: Key, len: usize) -> Rec {
    let mut x = seed_of(key);
    let filler = (0..len)
        .map(|_| {
            x = mix(x);
            char::from(b'a' + (x % 26) as u8)
        })
        .collect();
    (key.round, key.writer, key.seq, filler)
}

fn seed_of(key: Key) -> u64 {
    mix(u64::from(key.round) << 40 ^ u64::from(key.writer) << 32 ^ key.seq)
}

pub fn key_of(record: &Rec) -> Key {
    Key::new(record.0, record.1, record.2)
}

/// Whether `record` is the one its key says (the filler is the one derived from the key, at
/// whatever length it was sent).
pub fn genuine(record: &Rec) -> bool {
    *record == rec_sized(key_of(record), record.3.len())
}

/// A small deterministic generator (this crate has no `rand`).
pub struct Rng(u64);

impl Rng {
    /// Seeded from [`SEED`] or the clock; prints the seed so a failure can be replayed.
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var(SEED)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{test}: {SEED}={seed}");
        Rng(seed)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(1);
        mix(self.0) % n
    }

    /// A generator of its own (for another thread), seeded from this one.
    pub fn split(&mut self) -> Rng {
        Rng(mix(self.below(u64::MAX)))
    }

    pub fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from))
    }
}

pub fn client_options(durability: stela_client::Durability) -> stela_client::WalOptions {
    stela_client::WalOptions::default()
        .durability(durability)
        .type_tag(TYPE_TAG)
        .transport(stela_client::Transport::SharedMemory)
}

/// A log opened through the daemon's shared-memory ring (an error if the daemon gives none).
pub fn open_ring_client(
    socket: &Path,
    log: &str,
    durability: stela_client::Durability,
) -> stela_client::Wal<Rec> {
    let wal = stela_client::Wal::open(socket, log, client_options(durability))
        .unwrap_or_else(|e| panic!("open {log} through the daemon's ring: {e}"));
    assert_eq!(wal.transport(), "shm", "the client did not get a ring");
    wal
}

/// Every record of `DIR/logs/NAME`, read embedded (no daemon running), checking that the LSNs
/// run from 1 without a gap.
pub fn read_embedded(dir: &Path, log: &str) -> Vec<Rec> {
    let wal: stela_wal::Wal<Rec> = stela_wal::Wal::open(
        dir.join("logs").join(log),
        stela_wal::WalOptions::default()
            .codec(stela_wal::Codec::MessagePack)
            .type_tag(TYPE_TAG)
            .create_if_missing(false),
    )
    .unwrap_or_else(|e| panic!("embedded open of log {log}: {e}"));
    let mut out = Vec::new();
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("reading log {log}: {e}"));
        assert_eq!(
            lsn.get(),
            out.len() as u64 + 1,
            "LSNs not contiguous from 1"
        );
        out.push(record);
    }
    out
}

/// Every record of a log read through a running daemon (its files and its buffers).
pub fn read_through(socket: &Path, log: &str) -> Vec<Rec> {
    let wal: stela_client::Wal<Rec> = stela_client::Wal::open(
        socket,
        log,
        client_options(stela_client::Durability::Buffered)
            .transport(stela_client::Transport::Socket),
    )
    .unwrap_or_else(|e| panic!("open {log} to read it: {e}"));
    let mut out = Vec::new();
    for item in wal.iter().unwrap() {
        let (lsn, record) = item.unwrap_or_else(|e| panic!("reading log {log}: {e}"));
        assert_eq!(
            lsn.get(),
            out.len() as u64 + 1,
            "LSNs not contiguous from 1"
        );
        out.push(record);
    }
    out
}

/// Checks a log against the acknowledgements (LSN -> key): every record is genuine; each
/// writer's records are its seqs 0, 1, 2... in LSN order, at most `max_unacked(writer)` beyond
/// its last acknowledged seq; every acknowledged LSN inside the log holds its record. Returns
/// the acknowledged LSNs past the end of the log.
pub fn check_log(
    log: &[Rec],
    acked: &BTreeMap<u64, Key>,
    max_unacked: impl Fn(Key) -> u64,
) -> Vec<u64> {
    let mut next_seq: HashMap<(u32, u32), u64> = HashMap::new();
    for (i, record) in log.iter().enumerate() {
        let lsn = i as u64 + 1;
        let key = key_of(record);
        assert!(
            genuine(record),
            "LSN {lsn} holds a record nobody sent: {record:?}"
        );
        let expected = next_seq.entry((key.round, key.writer)).or_default();
        assert_eq!(
            key.seq, *expected,
            "LSN {lsn}: writer {}/{} skipped or repeated a record",
            key.round, key.writer
        );
        *expected += 1;
    }
    let mut last_acked: HashMap<(u32, u32), u64> = HashMap::new();
    let mut beyond = Vec::new();
    for (&lsn, &key) in acked {
        let last = last_acked.entry((key.round, key.writer)).or_default();
        *last = (*last).max(key.seq + 1);
        match log.get(lsn as usize - 1) {
            Some(record) => assert_eq!(
                key_of(record),
                key,
                "acknowledged LSN {lsn} holds another record"
            ),
            None => beyond.push(lsn),
        }
    }
    for ((round, writer), records) in next_seq {
        let acked = last_acked.get(&(round, writer)).copied().unwrap_or(0);
        let allowed = max_unacked(Key::new(round, writer, acked));
        assert!(
            records <= acked + allowed,
            "writer {round}/{writer}: {records} records in the log, {acked} acknowledged, at \
             most {allowed} more may have been in flight"
        );
    }
    beyond
}

/// A list of LSNs for a failure message: its first and last few.
pub fn summary(lsns: &[u64]) -> String {
    if lsns.len() <= 10 {
        return format!("{lsns:?}");
    }
    format!("{:?} ... {:?}", &lsns[..5], &lsns[lsns.len() - 5..])
}
