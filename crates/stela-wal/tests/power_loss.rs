//! Power loss, simulated with [`FaultStorage`]: the power is cut (every write and directory
//! change not yet synced is lost, or kept in part: a prefix with the last write torn inside a
//! sector, or any subset of the sectors of the unsynced writes, in any order) at random points of
//! random workloads (where some lives end in a mere process crash instead,
//! which keeps the unsynced writes), right after a segment rotation, after a truncation, before
//! every single I/O call of a workload, in the middle of the recovery that follows, and under
//! concurrent committers.
//!
//! The log does not recycle segment files, so stale bytes can only come from reused LSNs
//! (records lost in a crash, their LSNs then given to new records); every record carries an id
//! unique in its test, so a stale one read back is caught as "invented".
//!
//! The property checked after every cut, by reopening the log on what the disk kept:
//! - the log opens (a torn tail is repaired, never reported as corruption);
//! - every record acknowledged durable (`commit` or `append_durable` returned `Ok`, or an open
//!   reported it durable) is there, at its LSN, with its content;
//! - nothing is invented: every record read back is the record last appended at that LSN, and
//!   the LSNs read back are contiguous;
//! - the next LSN never falls back to or below an acknowledged one (that would reuse it);
//! - the repaired log can grow and lose power again with the same guarantees.
//!
//! And exhaustively, for one last write spanning several sectors, written by the embedded group
//! commit and by a raw `SegmentWriter` as the log daemon writes: with every subset of its sectors
//! persisted (the others old or garbage), the log opens in `Strict` mode with no operator, keeps
//! every acknowledged record, invents nothing and reports a torn tail; damage before the last
//! completed sync stays corruption.

use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use stela_format::frame::{self, Decoded, Layout};
use stela_wal::files::LogFiles;
use stela_wal::storage::{Call, CrashPlan, FaultStorage, Hooked, Hooks, Storage, SECTOR_BYTES};
use stela_wal::{tools, Log, Lsn, Wal, WalOptions};

const DIR: &str = "/power-loss/wal";
/// Small segments (a handful of records each), so most workloads rotate several times and
/// every rotation's seal, segment creation and directory fsync is exercised.
const SEGMENT_BYTES: u64 = 2048;

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
struct Rec {
    /// Unique over a whole test case, so a record from an earlier use of an LSN (appended, then
    /// lost in a crash, then the LSN reused) can never pass for the current one.
    id: u64,
    body: Vec<u8>,
}

fn rec(id: u64, len: usize) -> Rec {
    let body = (0..len)
        .map(|i| (id as u8).wrapping_mul(31).wrapping_add(i as u8))
        .collect();
    Rec { id, body }
}

fn options(storage: Arc<dyn Storage>) -> WalOptions {
    WalOptions::default()
        .storage(storage)
        .segment_bytes(SEGMENT_BYTES)
        // A small write buffer makes appends hand records to the "OS" unsynced, so a crash
        // usually has unsynced writes to drop or tear, not just whole synced rounds.
        .write_buffer_bytes(512)
}

fn open(storage: Arc<dyn Storage>) -> stela_wal::Result<Wal<Rec>> {
    Wal::open(DIR, options(storage))
}

/// What the log must and may hold.
#[derive(Debug, Default)]
struct Model {
    /// The record last appended at each LSN that may still be in the log.
    log: BTreeMap<u64, Rec>,
    /// Highest LSN acknowledged durable.
    acked: u64,
    /// Highest `truncate_before` argument: records below it may be gone.
    truncated: u64,
    /// The LSN the next append must get.
    next_lsn: u64,
    next_id: u64,
}

impl Model {
    fn new() -> Model {
        Model {
            next_lsn: 1,
            ..Model::default()
        }
    }

    fn new_rec(&mut self, len: usize) -> Rec {
        self.next_id += 1;
        rec(self.next_id, len)
    }

    /// Notes records about to be appended, at the LSNs they must get; returns the first.
    ///
    /// They are noted before the call because an append (or commit) that fails still may have
    /// written them (for instance, the records before a segment boundary are written and
    /// sealed before the creation of the next segment fails): after a crash such a record may
    /// be there or not, like any unacknowledged one, but only at its LSN and with its content.
    fn appending(&mut self, recs: &[Rec]) -> Lsn {
        let first = self.next_lsn;
        for rec in recs {
            self.log.insert(self.next_lsn, rec.clone());
            self.next_lsn += 1;
        }
        Lsn::new(first)
    }

    fn ack(&mut self, lsn: Lsn) {
        self.acked = self.acked.max(lsn.get());
    }

    /// Checks a freshly opened log against the model, then makes the model describe it.
    fn check_recovered(&mut self, wal: &Wal<Rec>) {
        let recovered: Vec<(Lsn, Rec)> = wal
            .iter()
            .expect("iter")
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("reading the recovered log failed: {e}"));
        for pair in recovered.windows(2) {
            assert_eq!(
                pair[1].0,
                pair[0].0.next(),
                "LSNs recovered are not contiguous"
            );
        }
        for (lsn, rec) in &recovered {
            assert_eq!(
                self.log.get(&lsn.get()),
                Some(rec),
                "LSN {lsn} recovered a record that was not the one appended there"
            );
        }
        let last = wal.last_lsn().get();
        if let Some((lsn, _)) = recovered.last() {
            assert_eq!(lsn.get(), last, "last_lsn disagrees with the records read");
        }
        assert!(
            last >= self.acked,
            "the log ends at {last}, before the acknowledged LSN {}: acknowledged records \
             were lost and their LSNs will be reused",
            self.acked
        );
        // Records below the highest truncation point may be gone; every acknowledged one at or
        // above it must be there (the last-LSN check above covers the end; this the start).
        let keep_from = self.truncated.max(1);
        if self.acked >= keep_from {
            let first = recovered.first().map_or(u64::MAX, |(lsn, _)| lsn.get());
            assert!(
                first <= keep_from,
                "acknowledged records {keep_from}..{first} were lost (truncated before {})",
                self.truncated
            );
        }
        if self.truncated <= 1 {
            if let Some((first, _)) = recovered.first() {
                assert_eq!(*first, Lsn::FIRST, "records lost at the start of the log");
            }
        }
        let durable = wal.durable_lsn().get();
        assert!(
            durable <= last,
            "durable_lsn {durable} beyond last_lsn {last}"
        );

        // What survived is now the log; later appends reuse the LSNs after it.
        self.log = recovered.into_iter().map(|(l, r)| (l.get(), r)).collect();
        self.next_lsn = last + 1;
        // Whatever an open reports durable must survive the next power cut, like a commit.
        self.acked = self.acked.max(durable);
    }
}

/// A choice among `n` things: `Pick(x)` takes the one at `x / 2^64` of the way.
#[derive(Debug, Clone, Copy)]
struct Pick(u64);

impl Pick {
    const LAST: Pick = Pick(u64::MAX);
    const MIDDLE: Pick = Pick(u64::MAX / 2);

    fn of(self, n: u64) -> u64 {
        ((u128::from(n) * u128::from(self.0)) >> 64) as u64
    }
}

/// One step of a workload.
#[derive(Debug, Clone)]
enum Op {
    Append(usize),
    AppendBatch(Vec<usize>),
    /// Commit an LSN picked among those appended.
    Commit(Pick),
    AppendDurable(usize),
    /// Hand buffered records to the OS without syncing them.
    Flush,
    /// `truncate_before` an LSN picked in `1..=last + 1`.
    Truncate(Pick),
    /// Read the live log back and compare it with the model.
    Read,
}

/// Applies `op`; returns the error of the first call that failed.
fn apply(wal: &Wal<Rec>, model: &mut Model, op: &Op) -> stela_wal::Result<()> {
    let last = model.next_lsn - 1;
    match op {
        Op::Append(len) => {
            let rec = model.new_rec(*len);
            let expected = model.appending(std::slice::from_ref(&rec));
            assert_eq!(wal.append(&rec)?, expected, "append got an unexpected LSN");
        }
        Op::AppendBatch(lens) => {
            let recs: Vec<Rec> = lens.iter().map(|&len| model.new_rec(len)).collect();
            let first = model.appending(&recs);
            let end = wal.append_batch(&recs)?;
            assert_eq!(
                end.get(),
                first.get() + recs.len() as u64 - 1,
                "append_batch LSNs"
            );
        }
        Op::Commit(pick) => {
            if last > 0 {
                let lsn = Lsn::new(1 + pick.of(last));
                wal.commit(lsn)?;
                model.ack(lsn);
            }
        }
        Op::AppendDurable(len) => {
            let rec = model.new_rec(*len);
            let expected = model.appending(std::slice::from_ref(&rec));
            let lsn = wal.append_durable(&rec)?;
            assert_eq!(lsn, expected, "append_durable got an unexpected LSN");
            model.ack(lsn);
        }
        Op::Flush => wal.log().flush()?,
        Op::Truncate(pick) => {
            let lsn = 1 + pick.of(last + 1);
            wal.truncate_before(Lsn::new(lsn))?;
            model.truncated = model.truncated.max(lsn);
        }
        Op::Read => {
            let records: Vec<(Lsn, Rec)> = wal.iter()?.collect::<Result<_, _>>()?;
            for pair in records.windows(2) {
                assert_eq!(pair[1].0, pair[0].0.next(), "live log not contiguous");
            }
            for (lsn, rec) in &records {
                assert_eq!(model.log.get(&lsn.get()), Some(rec), "live log at {lsn}");
            }
            if let Some((lsn, _)) = records.last() {
                assert_eq!(lsn.get(), last, "live log does not end at the last append");
            }
        }
    }
    Ok(())
}

fn body_len() -> impl Strategy<Value = usize> {
    // Mostly small records, some big enough that a segment holds only a few.
    prop_oneof![4 => 0usize..40, 1 => 100usize..400]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => body_len().prop_map(Op::Append),
        2 => prop::collection::vec(body_len(), 1..6).prop_map(Op::AppendBatch),
        3 => any::<u64>().prop_map(|x| Op::Commit(Pick(x))),
        2 => body_len().prop_map(Op::AppendDurable),
        1 => Just(Op::Flush),
        1 => any::<u64>().prop_map(|x| Op::Truncate(Pick(x))),
        1 => Just(Op::Read),
    ]
}

/// How a run of operations ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// The power is cut.
    Power(CrashPlan),
    /// Only the process dies: what it handed to the OS stays, synced or not.
    Process,
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        2 => Just(End::Power(CrashPlan::LoseUnsynced)),
        3 => any::<u64>().prop_map(|seed| End::Power(CrashPlan::TearUnsynced { seed })),
        3 => any::<u64>().prop_map(|seed| End::Power(CrashPlan::ScrambleSectors { seed })),
        1 => Just(End::Process),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        // Next to this file (the default looks for a lib.rs, which integration tests lack).
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    /// Several lives of one log: each runs a random workload, then the power (or only the
    /// process) dies, and the next life must find every acknowledged record and nothing else.
    #[test]
    fn random_workloads_survive_power_loss(
        lives in prop::collection::vec((prop::collection::vec(op(), 0..60), end()), 1..5)
    ) {
        let disk = FaultStorage::new();
        let mut model = Model::new();
        let mut wal = open(Arc::new(disk.clone())).expect("create log");
        for (ops, end) in &lives {
            for op in ops {
                apply(&wal, &mut model, op).expect("no fault was injected");
            }
            drop(wal);
            if let End::Power(plan) = end {
                disk.crash(*plan);
            }
            wal = open(Arc::new(disk.clone()))
                .unwrap_or_else(|e| panic!("open after {end:?} failed: {e}"));
            model.check_recovered(&wal);
        }
        // The last life's log must itself survive another power cut once it has grown.
        for len in [10, 300, 20] {
            apply(&wal, &mut model, &Op::AppendDurable(len)).expect("append after recovery");
        }
        apply(&wal, &mut model, &Op::Append(50)).expect("append after recovery");
        drop(wal);
        disk.crash(CrashPlan::TearUnsynced { seed: lives.len() as u64 });
        let wal = open(Arc::new(disk.clone())).expect("open after the final crash");
        model.check_recovered(&wal);
    }
}

/// The power fails right after the append that opened a new segment, before it is committed:
/// the new segment's creation (a durable rename plus directory fsync) may be on disk with no
/// records in it, and the record itself may be torn. Recovery must continue from the sealed
/// segment, and the log must keep working across the boundary.
#[test]
fn power_loss_right_after_rotation() {
    let plans = [CrashPlan::LoseUnsynced]
        .into_iter()
        .chain((0..16).map(|seed| CrashPlan::TearUnsynced { seed }));
    for plan in plans {
        let disk = FaultStorage::new();
        let mut model = Model::new();
        let wal = open(Arc::new(disk.clone())).unwrap();
        apply(&wal, &mut model, &Op::AppendDurable(100)).unwrap();
        // Append, write and commit records one by one until one opens a new segment; that one
        // is written but not committed when the power fails.
        let segments_before = wal.log().segments().len();
        let mut opened_new = false;
        for _ in 0..20 {
            apply(&wal, &mut model, &Op::Append(200)).unwrap();
            // Flushing performs the rotation (seal, create, directory fsync) and writes the
            // record into the new segment, but does not sync it.
            apply(&wal, &mut model, &Op::Flush).unwrap();
            if wal.log().segments().len() > segments_before {
                opened_new = true;
                break;
            }
            apply(&wal, &mut model, &Op::Commit(Pick::LAST)).unwrap();
        }
        assert!(opened_new, "the workload never rotated");
        let acked = model.acked;
        drop(wal);
        disk.crash(plan);

        let wal = open(Arc::new(disk.clone()))
            .unwrap_or_else(|e| panic!("open after power loss at rotation ({plan:?}): {e}"));
        assert!(
            wal.log().segments().len() > segments_before,
            "the new segment was durable"
        );
        model.check_recovered(&wal);
        assert!(wal.last_lsn().get() >= acked);
        // The log grows across the boundary and survives another cut.
        for len in [200, 5, 200, 200, 200] {
            apply(&wal, &mut model, &Op::AppendDurable(len)).unwrap();
        }
        apply(&wal, &mut model, &Op::Append(300)).unwrap();
        apply(&wal, &mut model, &Op::Flush).unwrap();
        drop(wal);
        disk.crash(plan);
        let wal = open(Arc::new(disk.clone())).unwrap();
        model.check_recovered(&wal);
    }
}

/// `truncate_before` removes whole segments and fsyncs the directory; a power cut right after
/// must not bring them back, nor lose anything acknowledged at or after the truncation point
/// (records appended after it but not committed may go).
#[test]
fn truncate_then_power_loss_keeps_everything_after_the_cut() {
    for (point, plan) in [
        (1, CrashPlan::LoseUnsynced),
        (7, CrashPlan::LoseUnsynced),
        (20, CrashPlan::LoseUnsynced),
        (33, CrashPlan::TearUnsynced { seed: 3 }),
        (41, CrashPlan::LoseUnsynced),
        (42, CrashPlan::TearUnsynced { seed: 9 }),
    ] {
        let disk = FaultStorage::new();
        let mut model = Model::new();
        let wal = open(Arc::new(disk.clone())).unwrap();
        for i in 0..40 {
            apply(&wal, &mut model, &Op::Append(100 + i * 7)).unwrap();
            if i % 3 == 2 {
                apply(&wal, &mut model, &Op::Commit(Pick::LAST)).unwrap();
            }
        }
        apply(&wal, &mut model, &Op::AppendDurable(10)).unwrap();
        let segments_before = wal.log().segments().len();
        wal.truncate_before(Lsn::new(point)).unwrap();
        model.truncated = point;
        let segments_after = wal.log().segments().len();
        assert!(
            segments_before > 3,
            "the workload should span several segments"
        );
        // Unacknowledged appends after the truncation: they may be lost.
        apply(&wal, &mut model, &Op::Append(30)).unwrap();
        apply(&wal, &mut model, &Op::Flush).unwrap();
        drop(wal);
        disk.crash(plan);

        let wal = open(Arc::new(disk.clone()))
            .unwrap_or_else(|e| panic!("open after truncate_before({point}) + crash: {e}"));
        assert_eq!(
            wal.log().segments().len(),
            segments_after,
            "the removal of truncated segments was durable"
        );
        assert!(wal.log().first_lsn().get() <= point);
        model.check_recovered(&wal);
        let first = wal.iter().unwrap().next().map(|r| r.unwrap().0);
        assert!(first.is_some_and(|f| f.get() <= point), "first {first:?}");
        apply(&wal, &mut model, &Op::AppendDurable(50)).unwrap();
        drop(wal);
        disk.crash(CrashPlan::LoseUnsynced);
        model.check_recovered(&open(Arc::new(disk.clone())).unwrap());
    }
}

/// A process crash leaves written but unsynced records in the OS cache; the next open reads
/// them and reports them durable (`durable_lsn`, and `commit` of them returns at once). If the
/// power then fails before anything else syncs that segment, they must still be there: an open
/// must make durable what it reports durable.
#[test]
fn what_an_open_reports_durable_survives_a_later_power_loss() {
    let disk = FaultStorage::new();
    let mut model = Model::new();
    let wal = open(Arc::new(disk.clone())).unwrap();
    apply(&wal, &mut model, &Op::AppendDurable(10)).unwrap();
    for _ in 0..3 {
        apply(&wal, &mut model, &Op::Append(20)).unwrap();
    }
    apply(&wal, &mut model, &Op::Flush).unwrap();
    drop(wal); // the process dies; the OS keeps the written records

    let wal = open(Arc::new(disk.clone())).unwrap();
    model.check_recovered(&wal);
    let reported = wal.durable_lsn();
    assert_eq!(reported, Lsn::new(4), "the open found all four records");
    // commit of a recovered record is acknowledged at once: the caller may now rely on it.
    wal.commit(reported).unwrap();
    drop(wal);
    disk.crash(CrashPlan::LoseUnsynced);

    let wal = open(Arc::new(disk.clone())).unwrap();
    model.check_recovered(&wal);
}

/// A storage with a power switch: after a set number of mutating calls (writes, syncs,
/// allocations, creations, renames, removals, directory fsyncs) every further call fails, as if
/// the machine had stopped there. The disk underneath then shows what a crash at that exact
/// point leaves once [`FaultStorage::crash`] is applied.
type PowerSwitch = Hooked<Power>;

fn power_switch(disk: &FaultStorage, budget: u64) -> PowerSwitch {
    Hooked::wrap(
        Arc::new(disk.clone()),
        Power {
            left: AtomicU64::new(budget),
            off: AtomicBool::new(false),
        },
    )
}

/// The hooks of a [`PowerSwitch`].
#[derive(Debug)]
struct Power {
    /// Mutating calls left before the cut.
    left: AtomicU64,
    off: AtomicBool,
}

impl Power {
    fn check(&self) -> io::Result<()> {
        if self.off.load(Ordering::SeqCst) {
            Err(io::Error::other("power is off"))
        } else {
            Ok(())
        }
    }

    /// Called before each mutating call: lets it through or cuts the power.
    fn tick(&self) -> io::Result<()> {
        self.check()?;
        let step = self
            .left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if step.is_err() {
            self.off.store(true, Ordering::SeqCst);
            return Err(io::Error::other("power cut"));
        }
        Ok(())
    }

    fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    fn used(&self, budget: u64) -> u64 {
        budget - self.left.load(Ordering::SeqCst)
    }
}

impl Hooks for Power {
    fn before(&self, call: &Call<'_>) -> io::Result<()> {
        if call.mutates() {
            self.tick()
        } else {
            self.check()
        }
    }
}

/// A fixed workload that rotates several times, spills unsynced writes, truncates and commits
/// in every way. Stops at the first error, which must be the power cut.
fn scripted_workload(storage: &PowerSwitch, model: &mut Model) {
    let wal = match open(Arc::new(storage.clone())) {
        Ok(wal) => wal,
        Err(_) if storage.hooks().is_off() => return,
        Err(e) => panic!("open failed without a power cut: {e}"),
    };
    let mut ops = Vec::new();
    for i in 0..60usize {
        ops.push(match i % 6 {
            0 | 3 => Op::Append(30 + i * 11),
            1 => Op::AppendBatch(vec![i, 2 * i, 150]),
            2 => Op::Commit(Pick::LAST),
            4 => Op::AppendDurable(250),
            _ => Op::Flush,
        });
        if i == 30 {
            ops.push(Op::Truncate(Pick::MIDDLE));
        }
    }
    for op in &ops {
        if let Err(e) = apply(&wal, model, op) {
            assert!(
                storage.hooks().is_off(),
                "{op:?} failed without a power cut: {e}"
            );
            return;
        }
    }
}

/// Cuts the power before each single mutating I/O call of a workload in turn (so in the middle
/// of every commit, seal, segment creation, directory fsync and truncation), sometimes cuts it
/// again in the middle of the recovery that follows, and checks the log each time. This is the
/// exhaustive version of the random test: no crash point of this workload is left out.
#[test]
fn power_cut_before_every_io_call() {
    let total = {
        let disk = FaultStorage::new();
        let switch = power_switch(&disk, u64::MAX);
        scripted_workload(&switch, &mut Model::new());
        assert!(!switch.hooks().is_off());
        switch.hooks().used(u64::MAX)
    };
    assert!(total > 50, "the workload does little I/O: {total} calls");
    for cut in 0..=total {
        let plan = match cut % 3 {
            0 => CrashPlan::LoseUnsynced,
            1 => CrashPlan::TearUnsynced { seed: cut },
            _ => CrashPlan::ScrambleSectors { seed: cut },
        };
        let disk = FaultStorage::new();
        let mut model = Model::new();
        scripted_workload(&power_switch(&disk, cut), &mut model);
        disk.crash(plan);

        // Every third time, the power fails again while the log recovers (after 0, 1, 2...
        // mutating calls of recovery: during directory creation, torn-tail zeroing, its sync).
        if cut % 3 == 0 {
            let during = (cut / 3) % 5;
            let switch = power_switch(&disk, during);
            match open(Arc::new(switch.clone())) {
                Ok(wal) => drop(wal),
                Err(e) => assert!(switch.hooks().is_off(), "recovery failed on its own: {e}"),
            }
            disk.crash(CrashPlan::ScrambleSectors { seed: cut + 1 });
        }

        let wal = open(Arc::new(disk.clone()))
            .unwrap_or_else(|e| panic!("open after a power cut at call {cut} ({plan:?}): {e}"));
        model.check_recovered(&wal);
        // The repaired log grows and survives another cut.
        apply(&wal, &mut model, &Op::AppendDurable(300)).unwrap();
        apply(&wal, &mut model, &Op::Append(300)).unwrap();
        apply(&wal, &mut model, &Op::Flush).unwrap();
        drop(wal);
        disk.crash(CrashPlan::TearUnsynced { seed: cut });
        let wal = open(Arc::new(disk.clone()))
            .unwrap_or_else(|e| panic!("second open after a power cut at call {cut}: {e}"));
        model.check_recovered(&wal);
    }
}

/// Several threads append and commit at once (so commits are grouped, and records of different
/// threads interleave in one write) until the power is cut after a random number of I/O calls.
/// Whatever the interleaving, each thread's acknowledged records must survive at the LSNs it was
/// given, and every record recovered must be one a thread tried to append.
#[test]
fn concurrent_committers_then_power_cut() {
    use rand::{Rng, SeedableRng};
    use std::sync::Mutex;

    const THREADS: u64 = 4;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5715);
    for round in 0..40u64 {
        let budget = rng.gen_range(0..400);
        let plan = match rng.gen_range(0..3) {
            0 => CrashPlan::LoseUnsynced,
            1 => CrashPlan::TearUnsynced { seed: rng.gen() },
            _ => CrashPlan::ScrambleSectors { seed: rng.gen() },
        };
        let disk = FaultStorage::new();
        let switch = power_switch(&disk, budget);
        // id -> record, for every append tried; LSN -> record for every append that returned.
        let tried = Mutex::new(BTreeMap::<u64, Rec>::new());
        let placed = Mutex::new(BTreeMap::<u64, Rec>::new());
        let acked = AtomicU64::new(0);
        if let Ok(wal) = open(Arc::new(switch.clone())) {
            std::thread::scope(|scope| {
                for thread in 0..THREADS {
                    let (wal, tried, placed, acked, switch) =
                        (&wal, &tried, &placed, &acked, &switch);
                    scope.spawn(move || {
                        // A thread's records have ids thread << 32 | seq, seq counting from 0.
                        for seq in 0..300u64 {
                            let id = thread << 32 | seq;
                            let record = rec(id, (id % 7 * 40) as usize);
                            tried.lock().unwrap().insert(id, record.clone());
                            let result = wal.append(&record).and_then(|lsn| {
                                placed.lock().unwrap().insert(lsn.get(), record);
                                wal.commit(lsn).map(|()| lsn)
                            });
                            match result {
                                Ok(lsn) => {
                                    acked.fetch_max(lsn.get(), Ordering::SeqCst);
                                }
                                Err(e) => {
                                    assert!(
                                        switch.hooks().is_off(),
                                        "failed without a power cut: {e}"
                                    );
                                    return;
                                }
                            }
                        }
                    });
                }
            });
        }
        disk.crash(plan);

        let wal = open(Arc::new(disk.clone()))
            .unwrap_or_else(|e| panic!("round {round}: open after the power cut failed: {e}"));
        let recovered: Vec<(Lsn, Rec)> = wal.iter().unwrap().collect::<Result<_, _>>().unwrap();
        let (tried, placed) = (tried.into_inner().unwrap(), placed.into_inner().unwrap());
        let mut next_seq = [0u64; THREADS as usize];
        for (i, (lsn, record)) in recovered.iter().enumerate() {
            assert_eq!(
                lsn.get(),
                i as u64 + 1,
                "round {round}: LSNs not contiguous"
            );
            assert_eq!(
                tried.get(&record.id),
                Some(record),
                "round {round}: invented"
            );
            if let Some(expected) = placed.get(&lsn.get()) {
                assert_eq!(
                    expected, record,
                    "round {round}: LSN {lsn} holds another record"
                );
            }
            // A thread appends its next record only after committing the previous one, so its
            // records are in the log in order and without holes.
            let (thread, seq) = (record.id >> 32, record.id & 0xffff_ffff);
            assert_eq!(
                seq, next_seq[thread as usize],
                "round {round}: thread {thread}"
            );
            next_seq[thread as usize] += 1;
        }
        let acked = acked.load(Ordering::SeqCst);
        assert!(
            wal.last_lsn().get() >= acked,
            "round {round}: acknowledged LSN {acked} lost (log ends at {})",
            wal.last_lsn()
        );
    }
}

/// Fails every fdatasync once armed: the power goes out while a commit's write is in flight (the
/// write was issued, its sync never returns).
#[derive(Debug, Default)]
struct CutAtSync {
    armed: AtomicBool,
}

impl Hooks for CutAtSync {
    fn before(&self, call: &Call<'_>) -> io::Result<()> {
        if matches!(call, Call::SyncData { .. }) && self.armed.load(Ordering::SeqCst) {
            return Err(io::Error::other("power cut during fdatasync"));
        }
        Ok(())
    }
}

const RAW_TAG: &str = "power_loss::bytes";
const RAW_SEGMENT: &str = "/power-loss/wal/00000000000000000001.wal";

fn raw_options(storage: Arc<dyn Storage>) -> WalOptions {
    WalOptions::default()
        .storage(storage)
        .segment_bytes(64 << 10)
}

fn raw_payload(lsn: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (lsn as u8).wrapping_mul(29).wrapping_add(i as u8 ^ 0x33))
        .collect()
}

/// Payload sizes of the acknowledged records (three commit rounds) and of the last write.
const ACKED_ROUNDS: [&[usize]; 3] = [&[37], &[300, 5], &[150]];
const LAST_WRITE: [usize; 10] = [200, 45, 700, 12, 333, 90, 512, 260, 61, 480];

/// What a log looked like just before the power failed in the middle of its last write.
struct BeforeCut {
    /// Every record appended, in LSN order from 1.
    appended: Vec<Vec<u8>>,
    /// How many of them were acknowledged durable.
    acked: usize,
    /// The newest segment as the process saw it (the last write whole).
    segment: Vec<u8>,
    /// The byte range of the last write.
    last_write: std::ops::Range<u64>,
}

/// The embedded group commit: three acknowledged commit rounds, then a batch whose commit
/// writes it in one write and loses the power in its fdatasync.
fn group_commit_then_cut(disk: &FaultStorage) -> BeforeCut {
    let storage = Hooked::wrap(Arc::new(disk.clone()), CutAtSync::default());
    let log = Log::open(DIR, raw_options(Arc::new(storage.clone())), RAW_TAG).unwrap();
    let mut appended = Vec::new();
    for round in ACKED_ROUNDS {
        let payloads: Vec<Vec<u8>> = round
            .iter()
            .map(|&len| raw_payload(appended.len() as u64 + 1, len))
            .collect();
        appended.extend(payloads.iter().cloned());
        let last = log.append_all(payloads.iter().map(Vec::as_slice)).unwrap();
        log.commit(last).unwrap();
    }
    let acked = appended.len();
    let payloads: Vec<Vec<u8>> = LAST_WRITE
        .iter()
        .enumerate()
        .map(|(i, &len)| raw_payload((acked + i) as u64 + 1, len))
        .collect();
    appended.extend(payloads.iter().cloned());
    let last = log.append_all(payloads.iter().map(Vec::as_slice)).unwrap();
    storage.hooks().armed.store(true, Ordering::SeqCst);
    log.commit(last)
        .expect_err("the power failed during the commit's fdatasync");
    drop(log);
    before_cut(disk, appended, acked)
}

/// The daemon's way: a `SegmentWriter` fed frames the caller built (with the sync base it
/// knows), three write + sync rounds, then one vectored write of several frames whose sync
/// never happens.
fn segment_writer_then_cut(disk: &FaultStorage) -> BeforeCut {
    let mut files =
        LogFiles::open(Path::new(DIR), raw_options(Arc::new(disk.clone())), RAW_TAG).unwrap();
    let mut appended: Vec<Vec<u8>> = Vec::new();
    let mut offset = files.write_offset;
    let mut durable = files.durable_offset;
    let mut write_round = |files: &mut LogFiles, lens: &[usize], sync: bool| {
        let frames: Vec<Vec<u8>> = lens
            .iter()
            .map(|&len| {
                let lsn = appended.len() as u64 + 1;
                let payload = raw_payload(lsn, len);
                let mut framed = Vec::new();
                frame::encode(&mut framed, Lsn::new(lsn), &payload, durable as u32);
                appended.push(payload);
                framed
            })
            .collect();
        let bufs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        files.writer.write_at(offset, &bufs).unwrap();
        offset += bufs.iter().map(|b| b.len() as u64).sum::<u64>();
        if sync {
            files.writer.sync().unwrap();
            durable = offset;
        }
    };
    for round in ACKED_ROUNDS {
        write_round(&mut files, round, true);
    }
    write_round(&mut files, &LAST_WRITE, false);
    drop(files);
    let acked = ACKED_ROUNDS.iter().map(|r| r.len()).sum();
    before_cut(disk, appended, acked)
}

fn before_cut(disk: &FaultStorage, appended: Vec<Vec<u8>>, acked: usize) -> BeforeCut {
    let path = Path::new(RAW_SEGMENT);
    let writes = disk.unsynced_writes(path);
    assert_eq!(writes.len(), 1, "one unsynced write: {writes:?}");
    BeforeCut {
        appended,
        acked,
        segment: disk.read_file(path).unwrap(),
        last_write: writes[0].clone(),
    }
}

/// Byte ranges of the frames in a segment's bytes (version 2, intact).
fn frame_ranges(segment: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut pos = 256;
    while let Decoded::Record(rec) = frame::decode(Layout::V2, &segment[pos..]) {
        out.push(pos..pos + rec.frame_len());
        pos += rec.frame_len();
    }
    out
}

/// Cuts the power during the last write of `scenario` with every subset of the write's sectors
/// persisted (the others keeping their old bytes, or garbage), and checks each outcome.
fn every_subset_of_the_last_write(scenario: fn(&FaultStorage) -> BeforeCut) {
    let shape = scenario(&FaultStorage::new());
    let sector = SECTOR_BYTES as u64;
    let write = shape.last_write.clone();
    let sectors = (write.end.div_ceil(sector) - write.start / sector) as u32;
    assert!(
        (4..=8).contains(&sectors),
        "the last write spans {sectors} sectors"
    );
    assert!(
        !write.start.is_multiple_of(sector),
        "the last write starts inside a sector"
    );
    let frames = frame_ranges(&shape.segment);
    assert_eq!(frames.len(), shape.appended.len());
    let straddling = frames
        .iter()
        .filter(|f| f.start as u64 >= write.start)
        .filter(|f| f.start / SECTOR_BYTES != (f.end - 1) / SECTOR_BYTES)
        .count();
    assert!(
        straddling >= 3,
        "only {straddling} records straddle sectors"
    );

    let all = (1u64 << sectors) - 1;
    for kept in 0..=all {
        for garbage in [0, all & !kept] {
            let plan = CrashPlan::LastWriteSectors { kept, garbage };
            let disk = FaultStorage::new();
            let before = scenario(&disk);
            disk.crash(plan);
            check_after_cut(&disk, &before, &frames, plan);
        }
    }
}

fn check_after_cut(
    disk: &FaultStorage,
    before: &BeforeCut,
    frames: &[std::ops::Range<usize>],
    plan: CrashPlan,
) {
    let image = disk.read_file(Path::new(RAW_SEGMENT)).unwrap();
    let intact = frames
        .iter()
        .take_while(|f| image[(*f).clone()] == before.segment[(*f).clone()])
        .count();
    let data_end = frames[..intact].last().map_or(256, |f| f.end);
    let leftovers = image[data_end..].iter().any(|&b| b != 0);

    let open = || Log::open(DIR, raw_options(Arc::new(disk.clone())), RAW_TAG);
    let log = open().unwrap_or_else(|e| panic!("{plan:?}: strict open failed: {e}"));
    let report = log.recovery_report().clone();
    assert!(report.damage.is_empty(), "{plan:?}: {report:?}");
    let records: Vec<(Lsn, Vec<u8>)> = log
        .read_from(Lsn::FIRST)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        records.len() >= before.acked,
        "{plan:?}: {} of {} acknowledged records",
        records.len(),
        before.acked
    );
    for (i, (lsn, payload)) in records.iter().enumerate() {
        assert_eq!(lsn.get(), i as u64 + 1, "{plan:?}");
        assert_eq!(payload, &before.appended[i], "{plan:?}: LSN {lsn} invented");
    }
    assert_eq!(records.len(), intact, "{plan:?}: not the intact prefix");
    match &report.torn_tail {
        Some((_, torn)) => {
            assert!(leftovers, "{plan:?}: a torn tail over zeros");
            assert_eq!(torn.offset as usize, data_end, "{plan:?}");
        }
        None => assert!(!leftovers, "{plan:?}: bytes after the data were not cut"),
    }
    // The cut sticks, and the log goes on.
    drop(log);
    let log = open().unwrap();
    assert!(log.recovery_report().torn_tail.is_none(), "{plan:?}");
    let next = log.append(b"after").unwrap();
    assert_eq!(next.get(), records.len() as u64 + 1, "{plan:?}");
    log.commit(next).unwrap();
}

#[test]
fn every_subset_of_a_group_commits_last_write_recovers_without_an_operator() {
    every_subset_of_the_last_write(group_commit_then_cut);
}

#[test]
fn every_subset_of_a_segment_writers_last_write_recovers_without_an_operator() {
    every_subset_of_the_last_write(segment_writer_then_cut);
}

/// Damage before the last completed sync (bit rot in an acknowledged record), followed by
/// records framed after that sync, is corruption: `Strict` refuses and changes nothing, also
/// when the last write was torn as well. A torn write must never hide damage to durable data.
#[test]
fn damage_before_the_last_sync_stays_corruption() {
    for torn_too in [false, true] {
        let disk = FaultStorage::new();
        let before = segment_writer_then_cut(&disk);
        let frames = frame_ranges(&before.segment);
        // A payload byte of record 2, which the second round's sync covered.
        let hit = frames[1].start + 30;
        disk.corrupt(Path::new(RAW_SEGMENT), hit, &[before.segment[hit] ^ 0x10]);
        let plan = if torn_too {
            CrashPlan::LastWriteSectors {
                kept: 0b1101,
                garbage: 0,
            }
        } else {
            CrashPlan::LoseUnsynced
        };
        disk.crash(plan);
        let image = disk.read_file(Path::new(RAW_SEGMENT)).unwrap();
        let error = Log::open(DIR, raw_options(Arc::new(disk.clone())), RAW_TAG)
            .err()
            .unwrap_or_else(|| panic!("{plan:?}: damage to synced data was accepted"));
        let corruption = error
            .as_corruption()
            .unwrap_or_else(|| panic!("{plan:?}: {error}"));
        assert_eq!(corruption.offset as usize, frames[1].start, "{plan:?}");
        assert_eq!(corruption.expected_lsn, Lsn::new(2), "{plan:?}");
        assert_eq!(
            disk.read_file(Path::new(RAW_SEGMENT)).unwrap(),
            image,
            "{plan:?}: a refused open changed the segment"
        );
    }
}

/// The case that used to need an operator: the last write reached the disk except for its
/// second sector, so valid records follow the damage. `stela wal
/// verify` reports it as a torn tail (not damage, but not clean: it counts the valid records the
/// cut removes), `repair` without `--corrupt-suffix` cuts it
/// (keeping a copy), and a `Strict` open afterwards finds a clean log with every acknowledged
/// record: the tools and open classify it alike.
#[test]
fn a_write_missing_its_middle_is_a_torn_tail_for_verify_and_repair_too() {
    let disk = FaultStorage::new();
    let before = group_commit_then_cut(&disk);
    let write = &before.last_write;
    let sector = SECTOR_BYTES as u64;
    let sectors = write.end.div_ceil(sector) - write.start / sector;
    let all_but_the_second = ((1 << sectors) - 1) & !0b10;
    disk.crash(CrashPlan::LastWriteSectors {
        kept: all_but_the_second,
        garbage: 0,
    });

    let report = tools::verify(Path::new(DIR), &disk).unwrap();
    assert!(!report.is_damaged(), "{:?}", report.problems);
    let (_, torn) = report.torn_tail.clone().expect("a torn tail");
    assert!(torn.unsynced_records > 0, "{torn:?}");
    // Not damage, but not clean either: opening would cut records whose checksums are good.
    assert!(!report.is_clean());
    assert_eq!(report.would_cut_records(), torn.unsynced_records);
    assert!(torn.reason.contains("valid record"), "{}", torn.reason);

    let repaired = tools::repair(Path::new(DIR), Arc::new(disk.clone()), false).unwrap();
    let (_, cut) = repaired.torn_tail.expect("repair cut the torn write");
    assert_eq!(cut, torn);
    let salvage = repaired.salvage_dir.expect("a copy of what was cut");
    // The bytes, and the records with good checksums among them as logs of their own.
    let kept: u64 = repaired
        .salvaged_records
        .iter()
        .map(|(first, last, _)| last.get() - first.get() + 1)
        .sum();
    assert_eq!(kept, torn.unsynced_records);
    assert_eq!(
        disk.file_names(&salvage).len(),
        1 + repaired.salvaged_records.len()
    );

    let log = Log::open(DIR, raw_options(Arc::new(disk.clone())), RAW_TAG).unwrap();
    assert!(log.recovery_report().torn_tail.is_none());
    let records: Vec<(Lsn, Vec<u8>)> = log
        .read_from(Lsn::FIRST)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(records.len() >= before.acked);
    for (lsn, payload) in &records {
        assert_eq!(payload, &before.appended[lsn.get() as usize - 1]);
    }
}
