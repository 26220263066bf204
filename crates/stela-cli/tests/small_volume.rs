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
