//! The warm standby follower on an embedded log (the daemon pair is `tests/standby.rs`): a
//! store commits transfers between accounts (their sum never changes) and a [`Follower`]
//! replays its log into a directory of its own; the store then "dies" and a store opens the
//! follower's directory on the same log.
//!
//! What each test provokes:
//! - the follower behind the last stretch of log, the store dead with a transaction in flight:
//!   the store opened on the follower's directory has every commit, not the loser's writes,
//!   and redoes that stretch only (a cold open of a follower directory that applied nothing
//!   redoes the whole log), the primary's page writes in it notwithstanding;
//! - a power cut under the follower, after any round: its progress never claims a change the
//!   synced images lack, and it goes on to the same result;
//! - SIGKILL of a follower process at random moments: restarted, it ends with the same page
//!   images as a follower never killed;
//! - a log truncated past the follower's progress: a clear error, nothing applied; a store's
//!   directory, or a log ending before the images: refused;
//! - a plain empty directory opened on a log that has page writes of another page file in it:
//!   the whole log is redone (those records are not trusted).

mod bank;

use bank::{Bank, Rng};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use stela_format::Lsn;
use stela_store::format::page::{self, PAGE_SIZE};
use stela_store::{Agreement, Error, Follower, LogRecord, RestartMode, Store, StoreOptions};
use stela_wal::storage::{CrashPlan, FaultStorage, OpenMode, StdStorage, Storage};
use stela_wal::Wal;

fn options(storage: Arc<dyn Storage>) -> StoreOptions {
    let options = StoreOptions::on_request()
        .archive(false)
        .lock_timeout(None)
        .pool_pages(32)
        .recover_in_background(false);
    let wal = options
        .wal
        .clone()
        .segment_bytes(256 << 10)
        .storage(storage);
    options.wal(wal)
}

fn log_dir(primary: &Path) -> PathBuf {
    primary.join("log")
}

/// The primary's log, opened for a store on another directory.
fn open_log(primary: &Path, options: &StoreOptions) -> Arc<Wal<LogRecord>> {
    Arc::new(Wal::open(log_dir(primary), options.wal.clone()).expect("the log opens"))
}

/// Rounds until the follower has nothing more to apply.
fn catch_up(follower: &mut Follower) -> Lsn {
    loop {
        let report = follower.step().expect("a follower round");
        if report.replayed == 0 {
            return report.applied;
        }
    }
}

/// Checks the follower's invariant in `dir` as the disk holds it: for every change at or below
/// its progress, the stored image of the page has it (its LSN is at least the change's).
fn assert_progress_is_true(storage: &Arc<dyn Storage>, dir: &Path, log: &Path) -> Lsn {
    let progress = storage
        .open(&dir.join("follower"), OpenMode::Read)
        .and_then(|file| file.read_to_vec())
        .map(|bytes| u64::from_le_bytes(bytes[..8].try_into().unwrap()))
        .unwrap_or(0);
    let pages = storage
        .open(&dir.join("pages"), OpenMode::Read)
        .and_then(|file| file.read_to_vec())
        .unwrap();
    // A page past the file's end was never written: it reads as zeros, as the store reads it.
    let stored = |id: page::PageId| {
        let mut image = vec![0u8; PAGE_SIZE];
        let at = (id as usize * PAGE_SIZE).min(pages.len());
        let end = (at + PAGE_SIZE).min(pages.len());
        image[..end - at].copy_from_slice(&pages[at..end]);
        page::decode(id, &image)
    };
    let read = stela_wal::tools::read_available(
        log,
        Arc::clone(storage),
        Lsn::FIRST,
        progress as usize,
        None,
    )
    .unwrap();
    let mut checked = 0;
    for (lsn, payload) in &read.records {
        let record: LogRecord = read.codec.decode(payload).unwrap();
        for (page, _) in record.pages() {
            let image = stored(page).expect("an intact image");
            assert!(
                image.lsn >= *lsn,
                "progress {progress}, but page {page} is at {} and lacks record {lsn}",
                image.lsn
            );
            checked += 1;
        }
    }
    assert!(progress == 0 || checked > 0);
    Lsn::new(progress)
}

#[test]
fn a_store_opened_on_the_followers_directory_has_every_commit_and_little_to_redo() {
    let root = tempfile::tempdir().unwrap();
    let (primary, warm, cold) = (
        root.path().join("primary"),
        root.path().join("warm"),
        root.path().join("cold"),
    );
    let options = options(Arc::new(StdStorage));
    let store = Store::open(&primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 1500);
    let mut follower = Follower::open(&warm, log_dir(&primary), Agreement::WholeLog).unwrap();
    let mut rng = Rng(7);
    let mut checkpoints = Vec::new();
    for round in 0..8 {
        bank.transfers(&store, &mut rng, 150);
        checkpoints.push(store.checkpoint().unwrap().begin);
        if round % 3 == 0 {
            store.clean().unwrap();
        }
        let applied = catch_up(&mut follower);
        assert!(applied > Lsn::ZERO);
    }
    let applied = catch_up(&mut follower);
    drop(follower);
    // The follower lags behind the last stretch, as it may when the primary dies; the primary's
    // cleaner writes its own page file meanwhile (`PagesWritten` records that are not true of
    // the follower's images).
    bank.transfers(&store, &mut rng, 100);
    store.clean().unwrap();
    bank.transfers(&store, &mut rng, 50);
    bank.leave_a_loser(&store);
    drop(store); // the primary dies with the loser running

    let store = Store::open_with_log(&warm, open_log(&primary, &options), options.clone()).unwrap();
    let report = store.restart_report().clone();
    assert_eq!(report.followed_to, Some(applied));
    assert_eq!(
        report.checkpoint,
        checkpoints.last().copied(),
        "analysis starts at the last checkpoint the follower passed"
    );
    assert_eq!(report.losers.len(), 1, "{report:?}");
    // Redo is exactly the changes the follower had not applied.
    let unapplied = stela_wal::tools::read_available(
        &log_dir(&primary),
        Arc::new(StdStorage),
        applied.next(),
        usize::MAX,
        None,
    )
    .unwrap();
    let unapplied_changes: usize = unapplied
        .records
        .iter()
        .map(|(_, payload)| {
            let record: LogRecord = unapplied.codec.decode(payload).unwrap();
            record.pages().count()
        })
        .sum();
    assert!(
        report.pending_records > 0,
        "the stretch after the follower: {report:?}"
    );
    assert_eq!(
        report.pending_records, unapplied_changes as u64,
        "{report:?}"
    );
    assert!(report.redo_start > Some(applied), "{report:?}");
    store.finish_recovery().unwrap();
    bank.check(&store);
    bank.transfers(&store, &mut rng, 20);
    bank.check(&store);
    store.close().unwrap();

    // A cold standby: a follower's directory with nothing applied, the whole log to redo.
    drop(Follower::open(&cold, log_dir(&primary), Agreement::WholeLog).unwrap());
    let store = Store::open_with_log(&cold, open_log(&primary, &options), options.clone()).unwrap();
    let cold_redo = store.restart_report().pending_records;
    eprintln!(
        "warm: {} records analysed, {} pending; cold: {} analysed, {cold_redo} pending",
        report.records_analyzed,
        report.pending_records,
        store.restart_report().records_analyzed
    );
    assert!(
        cold_redo > 3_000 && report.pending_records * 5 < cold_redo,
        "warm redo {} vs cold {cold_redo}",
        report.pending_records
    );
    store.finish_recovery().unwrap();
    bank.check(&store);
}

#[test]
fn after_a_power_cut_the_followers_progress_is_never_ahead_of_its_synced_images() {
    let fault = Arc::new(FaultStorage::new());
    let storage: Arc<dyn Storage> = fault.clone();
    let (primary, warm) = (Path::new("/primary"), Path::new("/warm"));
    let options = options(Arc::clone(&storage));
    let store = Store::open(primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 800);
    let mut rng = Rng(11);
    let mut follower = Follower::open_on(
        warm,
        log_dir(primary),
        Agreement::WholeLog,
        Arc::clone(&storage),
    )
    .unwrap()
    .round_records(700);
    for round in 0..6 {
        bank.transfers(&store, &mut rng, 120);
        if round % 2 == 1 {
            store.checkpoint().unwrap();
        }
        follower.step().unwrap();
        follower.step().unwrap();
    }
    drop(follower);
    drop(store);
    fault.crash(CrashPlan::LoseUnsynced);
    let progress = assert_progress_is_true(&storage, warm, &log_dir(primary));
    assert!(progress > Lsn::ZERO, "the follower made progress");

    let mut follower = Follower::open_on(
        warm,
        log_dir(primary),
        Agreement::WholeLog,
        Arc::clone(&storage),
    )
    .unwrap();
    assert_eq!(follower.applied(), progress);
    catch_up(&mut follower);
    drop(follower);
    assert_progress_is_true(&storage, warm, &log_dir(primary));
    let store = Store::open_with_log(warm, open_log(primary, &options), options.clone()).unwrap();
    store.finish_recovery().unwrap();
    bank.check(&store);
}

/// The child side of the SIGKILL test: follows forever in small rounds.
#[test]
#[ignore = "run by a_follower_killed_at_random_moments_ends_where_one_never_killed_ends"]
fn follower_child() {
    let (Ok(dir), Ok(log)) = (std::env::var("FOLLOW_DIR"), std::env::var("FOLLOW_LOG")) else {
        return;
    };
    let mut follower = Follower::open(&dir, &log, Agreement::WholeLog)
        .unwrap()
        .round_records(300);
    loop {
        if follower.step().unwrap().replayed == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn a_follower_killed_at_random_moments_ends_where_one_never_killed_ends() {
    let root = tempfile::tempdir().unwrap();
    let (primary, killed, reference) = (
        root.path().join("primary"),
        root.path().join("killed"),
        root.path().join("reference"),
    );
    let options = options(Arc::new(StdStorage));
    let store = Store::open(&primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 1500);
    let mut rng = Rng(3);
    for _ in 0..6 {
        bank.transfers(&store, &mut rng, 300);
        store.checkpoint().unwrap();
    }
    store.close().unwrap();

    let storage: Arc<dyn Storage> = Arc::new(StdStorage);
    let mut progress_seen = Vec::new();
    for kill in 0..6u64 {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "follower_child", "--ignored", "--nocapture"])
            .env("FOLLOW_DIR", &killed)
            .env("FOLLOW_LOG", log_dir(&primary))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60 + (kill * 37) % 90));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        progress_seen.push(assert_progress_is_true(
            &storage,
            &killed,
            &log_dir(&primary),
        ));
    }
    assert!(
        progress_seen.iter().any(|&p| p > Lsn::ZERO),
        "some child applied something before its kill: {progress_seen:?}"
    );
    let mut follower = Follower::open(&killed, log_dir(&primary), Agreement::WholeLog).unwrap();
    let end = catch_up(&mut follower);
    drop(follower);
    let mut follower = Follower::open(&reference, log_dir(&primary), Agreement::WholeLog).unwrap();
    assert_eq!(catch_up(&mut follower), end);
    drop(follower);
    let (a, b) = (
        std::fs::read(killed.join("pages")).unwrap(),
        std::fs::read(reference.join("pages")).unwrap(),
    );
    assert!(a == b, "the page images differ after the kills");
    let store = Store::open_with_log(&killed, open_log(&primary, &options), options).unwrap();
    assert_eq!(store.restart_report().pending_records, 0);
    bank.check(&store);
}

#[test]
fn a_log_truncated_past_the_followers_progress_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let (primary, warm) = (root.path().join("primary"), root.path().join("warm"));
    let options = options(Arc::new(StdStorage));
    let store = Store::open(&primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 500);
    let mut rng = Rng(5);
    bank.transfers(&store, &mut rng, 50);
    let mut follower = Follower::open(&warm, log_dir(&primary), Agreement::WholeLog).unwrap();
    let applied = catch_up(&mut follower);
    bank.transfers(&store, &mut rng, 1500);
    store.close().unwrap();
    // The log cut well past the follower's progress (as `truncate_before` after an archive
    // would, on a log the follower fell behind).
    let wal = open_log(&primary, &options);
    let last = wal.last_lsn();
    assert!(wal.truncate_before(Lsn::new(last.get() - 10)).unwrap() > 0);
    drop(wal);
    let pages_before = std::fs::read(warm.join("pages")).unwrap();
    match follower.step() {
        Err(Error::Follow(why)) => {
            assert!(why.contains("truncated past"), "{why}");
            assert!(why.contains(&format!("{}", applied.next())), "{why}");
        }
        other => panic!("expected a clear refusal, got {other:?}"),
    }
    assert_eq!(
        follower.applied(),
        applied,
        "nothing applied across the gap"
    );
    assert_eq!(std::fs::read(warm.join("pages")).unwrap(), pages_before);
    // Reopened, the same.
    drop(follower);
    let mut follower = Follower::open(&warm, log_dir(&primary), Agreement::WholeLog).unwrap();
    assert!(matches!(follower.step(), Err(Error::Follow(_))));
}

#[test]
fn a_stores_directory_and_a_log_behind_the_images_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let (primary, other, warm) = (
        root.path().join("primary"),
        root.path().join("other"),
        root.path().join("warm"),
    );
    let options = options(Arc::new(StdStorage));
    let store = Store::open(&primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 200);
    bank.transfers(&store, &mut Rng(1), 200);
    store.close().unwrap();
    // The primary's own directory is a store's: the follower cannot vouch for its images.
    match Follower::open(&primary, log_dir(&primary), Agreement::WholeLog) {
        Err(Error::Follow(why)) => assert!(why.contains("no follower progress"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    let mut follower = Follower::open(&warm, log_dir(&primary), Agreement::WholeLog).unwrap();
    catch_up(&mut follower);
    drop(follower);
    // A shorter log (another store's): the images hold changes it does not.
    let store = Store::open(&other, options.clone()).unwrap();
    Bank::seed(&store, 10);
    store.close().unwrap();
    match Store::open_with_log(
        &warm,
        open_log(&other, &options),
        options.restart(RestartMode::Instant),
    ) {
        Err(Error::Follow(why)) => assert!(why.contains("the log ends at"), "{why}"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_new_directory_on_an_existing_log_redoes_the_whole_log() {
    let root = tempfile::tempdir().unwrap();
    let (primary, fresh) = (root.path().join("primary"), root.path().join("fresh"));
    let options = options(Arc::new(StdStorage));
    let store = Store::open(&primary, options.clone()).unwrap();
    let mut bank = Bank::seed(&store, 600);
    let mut rng = Rng(23);
    bank.transfers(&store, &mut rng, 200);
    store.clean().unwrap(); // `PagesWritten` records about the primary's page file
    bank.transfers(&store, &mut rng, 100);
    drop(store);
    // No follower, no checkpoint: a plain empty directory on the primary's log.
    let store = Store::open_with_log(&fresh, open_log(&primary, &options), options).unwrap();
    store.finish_recovery().unwrap();
    bank.check(&store);
    assert_eq!(store.restart_report().followed_to, Some(Lsn::ZERO));
}
