//! Process crash, for real: a child process appends and commits from several threads to a log
//! on the real file system and is killed with SIGKILL at a random moment (sometimes while it is
//! still opening and recovering the log), round after round, on the same log directory.
//!
//! The property checked after every kill, by opening the log in the parent:
//! - the log opens (whatever the kill left half-done is repaired, never reported as damage);
//! - every record the child acknowledged (`commit` returned, in `SyncMode::Data` or
//!   `SyncMode::None`, or `flush` returned) is there, at the LSN the child was given, with the
//!   content it wrote;
//! - nothing is invented: LSNs run contiguously from 1, every record's content is the one its
//!   writer derives from `(round, thread, seq)`, and each writer's records are its seqs 0, 1, 2...
//!   in order;
//! - a process crash takes nothing back: what one open recovered is still there, unchanged, at
//!   the next (the OS kept it, and so must the log).
//!
//! The test binary is its own child: it re-runs itself with `--exact writer_child` and the
//! directory in `STELA_CRASH_CHILD_DIR`; without that variable `writer_child` does nothing.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use stela_testkit::child::{self_command, tagged_numbers, SelfChild};
use stela_wal::{SyncMode, Wal, WalOptions};

const CHILD_DIR: &str = "STELA_CRASH_CHILD_DIR";
const CHILD_ROUND: &str = "STELA_CRASH_CHILD_ROUND";
const CHILD_SYNC: &str = "STELA_CRASH_CHILD_SYNC";
/// Set it to replay the random choices (kill times, sync modes) of an earlier run.
const SEED: &str = "STELA_CRASH_SEED";
const WRITERS: u32 = 4;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Rec {
    round: u32,
    thread: u32,
    seq: u64,
    /// Derived from the three fields above, so the parent can tell a real record from garbage
    /// or from a record put at the wrong place, without knowing what the child wrote.
    payload: Vec<u8>,
}

/// Who wrote a record: a writer's `seq`-th record in a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    round: u32,
    thread: u32,
    seq: u64,
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn payload(key: Key) -> Vec<u8> {
    let mut x = mix(u64::from(key.round) << 40 ^ u64::from(key.thread) << 32 ^ key.seq);
    // Lengths vary so frames do not line up the same way in every round.
    let len = (x % 64) as usize;
    (0..len)
        .map(|_| {
            x = mix(x);
            x as u8
        })
        .collect()
}

fn record(key: Key) -> Rec {
    Rec {
        round: key.round,
        thread: key.thread,
        seq: key.seq,
        payload: payload(key),
    }
}

fn options(sync: SyncMode) -> WalOptions {
    WalOptions::default()
        .sync(sync)
        // Small segments: a round rotates several times, so kills land in rotations too.
        .segment_bytes(64 << 10)
        // Appends spill to the OS unsynced between commits now and then.
        .write_buffer_bytes(4 << 10)
}

/// Writes one line to stdout at once, or ends the process if the parent stopped listening.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(0);
    }
}

/// The child's side: a no-op unless started by [`run_rounds`] (see the module documentation).
#[test]
fn writer_child() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let round: u32 = std::env::var(CHILD_ROUND).unwrap().parse().unwrap();
    let sync = match std::env::var(CHILD_SYNC).as_deref() {
        Ok("none") => SyncMode::None,
        _ => SyncMode::Data,
    };
    say("OPENING");
    let wal: Wal<Rec> = Wal::open(&dir, options(sync)).expect("child: open");
    say(&format!("OPENED {}", wal.last_lsn()));
    std::thread::scope(|scope| {
        for thread in 0..WRITERS {
            let wal = &wal;
            scope.spawn(move || write_until_killed(wal, round, thread));
        }
    });
}

/// Appends and acknowledges records until killed. Each writer uses another of the calls whose
/// `Ok` DURABILITY.md says survives a process crash.
fn write_until_killed(wal: &Wal<Rec>, round: u32, thread: u32) {
    // A child nobody kills (the parent died) stops on its own.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seq = 0;
    let key = |seq| Key { round, thread, seq };
    let ack = |lsn: u64, seq: u64| say(&format!("ACK {lsn} {round} {thread} {seq}"));
    while Instant::now() < deadline {
        match thread {
            // A batch, committed by its last LSN.
            2 => {
                let n = 1 + seq % 4;
                let records: Vec<Rec> = (seq..seq + n).map(|s| record(key(s))).collect();
                let last = wal.append_batch(&records).expect("child: append_batch");
                wal.commit(last).expect("child: commit");
                for i in 0..n {
                    ack(last.get() + 1 - n + i, seq + i);
                }
                seq += n;
            }
            // Handed to the OS, not synced: still survives a process crash.
            3 => {
                let lsn = wal.append(&record(key(seq))).expect("child: append");
                wal.log().flush().expect("child: flush");
                ack(lsn.get(), seq);
                seq += 1;
            }
            _ => {
                let lsn = wal.append(&record(key(seq))).expect("child: append");
                wal.commit(lsn).expect("child: commit");
                ack(lsn.get(), seq);
                seq += 1;
            }
        }
    }
}

/// What the parent knows about the log across rounds.
#[derive(Default)]
struct Knowledge {
    /// Every acknowledgement seen, by LSN.
    acked: BTreeMap<u64, Key>,
    /// What the last open recovered, in LSN order from 1.
    recovered: Vec<Key>,
}

/// How one round's child is killed.
#[derive(Debug, Clone, Copy)]
enum Kill {
    /// This long after it starts opening the log: usually during recovery.
    WhileOpening(Duration),
    /// This long after the log is open: in the middle of appends, commits and rotations.
    WhileWriting(Duration),
}

#[derive(Default, Debug)]
struct Tally {
    rounds: u32,
    killed_before_open: u32,
    acks: usize,
    records: usize,
}

/// Runs one child until it is killed; returns its acknowledgements.
fn run_child(dir: &Path, round: u32, sync: SyncMode, kill: Kill) -> (Vec<(u64, Key)>, bool) {
    let mut command = self_command("writer_child");
    command
        .env(CHILD_DIR, dir)
        .env(CHILD_ROUND, round.to_string())
        .env(
            CHILD_SYNC,
            if sync == SyncMode::None {
                "none"
            } else {
                "data"
            },
        );
    let mut child = SelfChild::spawn(format!("writer child of round {round}"), command);
    // Wait for the moment the kill is timed from (a child that ends first fails the test),
    // then kill.
    let (marker, delay) = match kill {
        Kill::WhileOpening(delay) => ("OPENING", delay),
        Kill::WhileWriting(delay) => ("OPENED ", delay),
    };
    child.wait_for(marker, Duration::from_secs(60));
    std::thread::sleep(delay);
    let seen = child.kill();
    let opened = seen.iter().any(|l| l.contains("OPENED"));
    let acks = tagged_numbers(&seen, "ACK ")
        .into_iter()
        .map(|f| {
            let key = Key {
                round: f[1] as u32,
                thread: f[2] as u32,
                seq: f[3],
            };
            (f[0], key)
        })
        .collect();
    (acks, opened)
}

/// Opens the log after a kill and checks it against everything known (see the module doc).
fn verify(dir: &Path, round: u32, known: &mut Knowledge) -> usize {
    let wal: Wal<Rec> = Wal::open(dir, options(SyncMode::Data))
        .unwrap_or_else(|e| panic!("round {round}: open after SIGKILL failed: {e}"));
    let mut keys = Vec::new();
    let mut next_seq: HashMap<(u32, u32), u64> = HashMap::new();
    for item in wal.iter().unwrap() {
        let (lsn, rec) = item.unwrap_or_else(|e| panic!("round {round}: reading failed: {e}"));
        let key = Key {
            round: rec.round,
            thread: rec.thread,
            seq: rec.seq,
        };
        assert_eq!(
            lsn.get(),
            keys.len() as u64 + 1,
            "round {round}: LSNs are not contiguous from 1"
        );
        assert_eq!(
            rec,
            record(key),
            "round {round}: LSN {lsn} holds a record no writer wrote"
        );
        let expected = next_seq.entry((key.round, key.thread)).or_default();
        assert_eq!(
            key.seq, *expected,
            "round {round}: LSN {lsn}: writer {}/{} skipped or repeated a record",
            key.round, key.thread
        );
        *expected += 1;
        keys.push(key);
    }
    assert_eq!(wal.last_lsn().get(), keys.len() as u64);
    for (&lsn, &key) in &known.acked {
        assert_eq!(
            keys.get(lsn as usize - 1),
            Some(&key),
            "round {round}: acknowledged LSN {lsn} ({key:?}) was lost or changed"
        );
    }
    assert!(
        keys.starts_with(&known.recovered),
        "round {round}: records recovered by the previous open were lost or changed"
    );
    known.recovered = keys;
    known.recovered.len()
}

/// Runs `rounds` kill-and-recover rounds, starting a fresh log directory every `per_dir`
/// rounds (so long runs keep the log, and the time to verify it, bounded).
fn run_rounds(rounds: u32, per_dir: u32) -> Tally {
    let seed = std::env::var(SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    // Shown with the failure output, so a failing run can be replayed.
    eprintln!("{SEED}={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut known = Knowledge::default();
    let mut dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        if round > 0 && round % per_dir == 0 {
            dir = tempfile::tempdir().unwrap();
            known = Knowledge::default();
        }
        // Data mode acknowledges after fdatasync; None mode after the write only, which a
        // process crash must not undo either.
        let sync = if rng.gen_ratio(1, 3) {
            SyncMode::None
        } else {
            SyncMode::Data
        };
        let kill = if rng.gen_ratio(1, 4) {
            Kill::WhileOpening(Duration::from_micros(rng.gen_range(0..2000)))
        } else {
            Kill::WhileWriting(Duration::from_millis(rng.gen_range(5..80)))
        };
        let (acks, opened) = run_child(dir.path(), round, sync, kill);
        tally.rounds += 1;
        tally.killed_before_open += u32::from(!opened);
        tally.acks += acks.len();
        for (lsn, key) in acks {
            // An LSN can be acknowledged only once: the child never reuses one.
            let before = known.acked.insert(lsn, key);
            assert!(before.is_none(), "LSN {lsn} acknowledged twice");
        }
        tally.records = verify(dir.path(), round, &mut known);
    }
    eprintln!("{tally:?}");
    tally
}

/// Dozens of rounds on one log directory; runs in the default `cargo test`.
#[test]
fn sigkill_never_loses_acknowledged_records() {
    let tally = run_rounds(30, 30);
    assert!(tally.acks > 0, "no child ever acknowledged a record");
}

/// The long version: `cargo test -p stela-wal --test crash -- --ignored`.
#[test]
#[ignore = "long: 500 kill-and-recover rounds"]
fn sigkill_never_loses_acknowledged_records_500_rounds() {
    let tally = run_rounds(500, 50);
    assert!(tally.acks > 0, "no child ever acknowledged a record");
}
