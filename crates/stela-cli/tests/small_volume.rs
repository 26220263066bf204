//! Starts that need no spare space: `stela serve` on a 16 MiB volume the test mounts itself (a
//! tmpfs: the test needs root, as the CI has; without it the test fails and says why).
//!
//! 1. With 3 MiB free the daemon starts, measures the disk with what room there is (a quarter
//!    of the free space, not a 64 MiB scratch segment) and records the rate; a log is created
//!    (its segments shrunk to fit) and takes `disk` commits.
//! 2. With the volume full the daemon still starts (the recorded rate stands in for a
//!    measurement) and serves the log's records.
//! 3. Once space is freed, the log takes `disk` commits again.

mod common;

use common::{stela, text, Daemon};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use stela_client::{Durability, Wal, WalOptions};

/// A tmpfs mounted for the test, unmounted when dropped.
struct Volume {
    _base: tempfile::TempDir,
    mount: PathBuf,
}

impl Volume {
    fn mount(size: &str) -> Volume {
        let base = tempfile::Builder::new()
            .prefix("stela-small")
            .tempdir()
            .unwrap();
        let mount = base.path().join("vol");
        std::fs::create_dir(&mount).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mount)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a {size} tmpfs to fill it, which needs root (the CI runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Volume { _base: base, mount }
    }

    fn free(&self) -> u64 {
        let stat = rustix::fs::statvfs(&self.mount).unwrap();
        stat.f_bavail * stat.f_frsize
    }

    /// Writes `name` until at most `leave` bytes are free (or the volume is full).
    fn fill(&self, name: &str, leave: u64) -> PathBuf {
        let path = self.mount.join(name);
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 64 << 10];
        while self.free() > leave {
            let want = ((self.free() - leave) as usize).min(chunk.len());
            match file.write(&chunk[..want.max(1)]) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling the volume: {e}"),
            }
        }
        file.sync_all().ok();
        path
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

fn status_text(dir: &Path) -> String {
    let out = stela(&["status", "--dir", dir.to_str().unwrap()]);
    text(&out)
}

fn record(i: u32) -> String {
    format!("{i:05} {}", "r".repeat(900))
}

#[test]
fn the_daemon_starts_and_serves_on_a_small_and_on_a_full_volume() {
    let volume = Volume::mount("16m");
    let dir = volume.mount.clone();
    volume.fill("filler", 3 << 20);
    assert!(volume.free() <= 3 << 20);

    // 1. Little space: measured with what there is, recorded.
    let daemon = Daemon::start_measuring(&dir, &[]);
    let shown = status_text(&dir);
    assert!(shown.contains("disk rate measured now"), "{shown}");
    assert!(
        dir.join("measured-write-rate").exists(),
        "the rate was not recorded"
    );
    let options = || WalOptions::default().durability(Durability::Disk);
    let wal: Wal<String> = Wal::open(daemon.socket(), "small", options()).unwrap();
    for i in 0..300 {
        wal.append_durable(&record(i))
            .unwrap_or_else(|e| panic!("record {i} with {} B free: {e}", volume.free()));
    }
    drop(wal);
    daemon.terminate();

    // 2. A full volume: the daemon starts on the recorded rate and serves what is there.
    let extra = volume.fill("filler-2", 0);
    assert!(volume.free() < 256 << 10, "{} B still free", volume.free());
    let daemon = Daemon::start_measuring(&dir, &[]);
    let shown = status_text(&dir);
    assert!(shown.contains("recorded by an earlier start"), "{shown}");
    let wal: Wal<String> = Wal::open(daemon.socket(), "small", options()).unwrap();
    let read: Vec<String> = wal.iter().unwrap().map(|r| r.unwrap().1).collect();
    assert_eq!(read, (0..300).map(record).collect::<Vec<_>>());

    // 3. Space is freed: the log takes disk commits again (within the daemon's retry).
    std::fs::remove_file(&extra).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut i = 300;
    while i < 400 {
        match wal.append_durable(&record(i)) {
            Ok(_) => i += 1,
            Err(e) if e.code() == Some(stela_client::ErrorCode::DiskFull) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "still full 10 s after space was freed: {e}"
                );
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => panic!("record {i} after space was freed: {e}"),
        }
    }
    drop(wal);
    daemon.terminate();
}

/// Issue 54, finding 7: one meaning for `DiskFull`. On a real full volume (a 16 MiB tmpfs,
/// 256 KiB segments), two clients append, one at `disk` and one at `buffered`, each retrying
/// every refusal with a record of its own (so a duplicate is visible); the volume is filled
/// until a new segment cannot be created (by the `disk` client's record: the `buffered` one
/// starts only then), and freed once the daemon says it waits for space.
/// Checked against the log after a restart: every record answered `Ok` is at its LSN, no
/// record answered `DiskFull` is in the log at all (nothing of such an append was placed, so
/// retrying it writes nothing twice), and nothing else is there. On the code before, the `disk`
/// append whose record needed the new segment was answered `DiskFull` and its record written
/// anyway once space returned.
#[test]
fn a_record_answered_disk_full_is_never_in_the_log() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    type Answers = Vec<(String, Result<u64, stela_client::ErrorCode>)>;
    let volume = Volume::mount("16m");
    // The daemon's own output goes next to its directory, off the volume.
    let dir = volume.mount.clone();
    let daemon = Daemon::start(&dir, &["--segment-size", "256K"]);
    let options = |level| WalOptions::default().durability(level);
    // The log and its first segment exist before the volume fills.
    drop(Wal::<String>::open(daemon.socket(), "answers", options(Durability::Disk)).unwrap());
    let filler = volume.fill("filler", 0);
    assert!(volume.free() < 256 << 10, "{} B still free", volume.free());

    let freed = AtomicBool::new(false);
    let client = |level: Durability, tag: &str| -> Answers {
        let wal: Wal<String> = Wal::open(daemon.socket(), "answers", options(level)).unwrap();
        let mut answered = Answers::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut ok_after_freed = 0;
        while ok_after_freed < 20 {
            assert!(Instant::now() < deadline, "{tag}: no progress");
            let was_freed = freed.load(Ordering::SeqCst);
            let record = format!("{tag} {:06} {}", answered.len(), "r".repeat(900));
            match wal.append_durable(&record) {
                Ok(lsn) => {
                    answered.push((record, Ok(lsn.get())));
                    ok_after_freed += usize::from(was_freed);
                }
                Err(e) if e.code() == Some(stela_client::ErrorCode::DiskFull) => {
                    answered.push((record, Err(stela_client::ErrorCode::DiskFull)));
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => panic!("{tag}: append {} answered {e}", answered.len()),
            }
        }
        answered
    };
    let answered: Answers = std::thread::scope(|scope| {
        // The `disk` client alone until a segment cannot be created (its record the one that
        // needed it), then the `buffered` one too, while the volume is full.
        let disk = scope.spawn(|| client(Durability::Disk, "disk"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut ran_out = false;
        while !ran_out && Instant::now() < deadline {
            ran_out = status_text(&dir).contains("WAITING FOR SPACE");
            std::thread::sleep(Duration::from_millis(50));
        }
        let buffered = scope.spawn(|| client(Durability::Buffered, "bufd"));
        // Refusals for a while, then space (freed whatever happened, so that an append
        // waiting for it ends and the test can fail rather than hang).
        std::thread::sleep(Duration::from_millis(1500));
        std::fs::remove_file(&filler).unwrap();
        freed.store(true, Ordering::SeqCst);
        assert!(ran_out, "the volume never ran out");
        let mut all = disk.join().unwrap();
        all.extend(buffered.join().unwrap());
        all
    });
    daemon.terminate();

    let refused = answered.iter().filter(|(_, a)| a.is_err()).count();
    eprintln!(
        "{} appends answered, {refused} of them DiskFull",
        answered.len()
    );
    assert!(refused > 0, "the volume never refused an append");
    let daemon = Daemon::start(&dir, &["--segment-size", "256K"]);
    let wal: Wal<String> =
        Wal::open(daemon.socket(), "answers", options(Durability::Disk)).unwrap();
    let log: std::collections::HashMap<String, u64> = wal
        .iter()
        .unwrap()
        .map(|r| {
            let (lsn, record) = r.unwrap();
            (record, lsn.get())
        })
        .collect();
    for (record, answer) in &answered {
        let found = log.get(record);
        match answer {
            Ok(lsn) => assert_eq!(found, Some(lsn), "{} answered Ok at {lsn}", &record[..11]),
            Err(code) => assert_eq!(
                found,
                None,
                "{} was answered {code:?} and is in the log",
                &record[..11]
            ),
        }
    }
    assert_eq!(
        log.len(),
        answered.len() - refused,
        "records nobody appended"
    );
    drop(wal);
    daemon.terminate();
}

/// Issue 54, finding 6: a creation that fails leaves nothing behind. On a full volume, new
/// logs cannot be created (their first segment cannot be preallocated); each refused open had
/// left an empty directory with a `LOCK` file, so a client could fill `DIR/logs` with them.
#[test]
fn a_failed_creation_leaves_no_directory_behind() {
    let volume = Volume::mount("16m");
    let dir = volume.mount.clone();
    let daemon = Daemon::start(&dir, &["--segment-size", "256K"]);
    volume.fill("filler", 0);
    for i in 0..3 {
        let name = format!("never-{i}");
        let opened = Wal::<String>::open(
            daemon.socket(),
            &name,
            WalOptions::default().durability(Durability::Disk),
        );
        let Err(error) = opened else {
            panic!("a log created on a full volume");
        };
        assert!(error.to_string().contains("space"), "{error}");
        let left = dir.join("logs").join(&name);
        assert!(
            !left.exists(),
            "a failed creation left {}: {:?}",
            left.display(),
            std::fs::read_dir(&left)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }
    daemon.terminate();
}
