//! [`GatedStorage`]: a wrapper around any [`Storage`] whose disk can be told to stop, or to
//! crawl, on demand. It is a [`Hooked`] storage whose hooks are a [`Gate`].
//!
//! It owns a gate, shared by every clone and by every file opened through it. While the gate is
//! shut ([`GatedStorage::stall`]), each `write_all_at` and `sync_data` on those files waits at it
//! until [`GatedStorage::release`] opens it again; [`GatedStorage::writes_blocked`] says how many
//! calls are waiting right now. Separately, [`GatedStorage::set_write_delay`] makes each
//! `write_all_at` sleep for a fixed time before it goes through, like a disk that keeps up but
//! slowly. Everything else, and every call once past the gate, goes to the wrapped storage
//! unchanged.
//!
//! Why it exists: the log daemon's benchmarks and tests need a disk that hangs on command. With
//! the writes held, a test can fill the daemon's buffers to a known level, confirm that the
//! flusher really is stuck (a waiting count above zero), and then time the emergency flush from
//! the moment the disk comes back. The write delay gives backpressure tests a disk that is slower
//! than the producers without ever failing.
//!
//! Only calls that reach the gate after `stall` are held: a write already handed to the wrapped
//! storage finishes. A write with a delay sleeps first and meets the gate afterwards, so a stall
//! set during the sleep still holds it. Dropping the storage does not open the gate; a test that
//! stalls must release, or its blocked threads stay blocked.

use super::hooked::{Call, Hooked, Hooks};
use super::Storage;
use std::fmt;
use std::io;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

/// A [`Storage`] whose file writes and syncs can be stalled or slowed: a [`Hooked`] storage
/// whose hooks are a [`Gate`]. Cloning shares the gate.
pub type GatedStorage = Hooked<Gate>;

/// The gate of a [`GatedStorage`], shared by every clone and every file opened through them.
#[derive(Default)]
pub struct Gate {
    state: Mutex<GateState>,
    /// Signalled when the gate opens.
    opened: Condvar,
}

#[derive(Default, Debug)]
struct GateState {
    stalled: bool,
    /// Calls now waiting for the gate to open.
    waiting: usize,
    write_delay: Option<Duration>,
}

fn lock(mutex: &Mutex<GateState>) -> MutexGuard<'_, GateState> {
    // Every critical section is a few plain assignments, so a panic inside one (in a test
    // thread) cannot leave the state half-changed.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Gate {
    /// Returns at once if the gate is open, else when it opens.
    fn pass(&self) {
        let mut state = lock(&self.state);
        if !state.stalled {
            return;
        }
        state.waiting += 1;
        while state.stalled {
            state = self
                .opened
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        state.waiting -= 1;
    }
}

impl fmt::Debug for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = lock(&self.state);
        f.debug_struct("Gate")
            .field("stalled", &state.stalled)
            .field("waiting", &state.waiting)
            .field("write_delay", &state.write_delay)
            .finish()
    }
}

impl Hooks for Gate {
    fn before(&self, call: &Call<'_>) -> io::Result<()> {
        match call {
            Call::Write { .. } => {
                // Sleep first and meet the gate afterwards, so a stall set during the sleep
                // still holds the write.
                let delay = lock(&self.state).write_delay;
                if let Some(delay) = delay {
                    thread::sleep(delay);
                }
                self.pass();
            }
            Call::SyncData { .. } => self.pass(),
            _ => {}
        }
        Ok(())
    }
}

impl Hooked<Gate> {
    /// Wraps `inner` with the gate open and no write delay.
    pub fn new(inner: Arc<dyn Storage>) -> GatedStorage {
        Hooked::wrap(inner, Gate::default())
    }

    /// Shuts the gate: from now on every `write_all_at` and `sync_data` on files opened through
    /// this storage (or a clone) waits until [`GatedStorage::release`]. Stalling twice is the
    /// same as once.
    pub fn stall(&self) {
        lock(&self.hooks().state).stalled = true;
    }

    /// Opens the gate and lets every waiting call go on.
    pub fn release(&self) {
        lock(&self.hooks().state).stalled = false;
        self.hooks().opened.notify_all();
    }

    /// Makes each later `write_all_at` sleep for `delay` before it writes; `None` removes the
    /// delay. Syncs are not delayed.
    pub fn set_write_delay(&self, delay: Option<Duration>) {
        lock(&self.hooks().state).write_delay = delay;
    }

    /// How many `write_all_at` and `sync_data` calls are waiting at the shut gate right now.
    pub fn writes_blocked(&self) -> usize {
        lock(&self.hooks().state).waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FaultStorage, OpenMode, StdStorage};
    use std::path::PathBuf;
    use std::time::Instant;

    /// Polls `condition` for up to five seconds.
    fn eventually(mut condition: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if condition() {
                return true;
            }
            thread::sleep(Duration::from_millis(2));
        }
        condition()
    }

    fn in_memory() -> (FaultStorage, GatedStorage, PathBuf) {
        let fault = FaultStorage::new();
        let gated = GatedStorage::new(Arc::new(fault.clone()));
        let dir = PathBuf::from("/log");
        gated.create_dir_all(&dir).unwrap();
        (fault, gated, dir)
    }

    #[test]
    fn a_stall_holds_a_writer_until_release() {
        let (fault, gated, dir) = in_memory();
        let path = dir.join("a");
        let file = gated.open(&path, OpenMode::CreateNew).unwrap();
        gated.stall();
        let writer = thread::spawn(move || {
            file.write_all_at(b"late", 0).unwrap();
            file.sync_data().unwrap();
        });
        assert!(eventually(|| gated.writes_blocked() == 1));
        // Give a gate that leaks a chance to show it.
        thread::sleep(Duration::from_millis(50));
        assert!(!writer.is_finished());
        assert_eq!(gated.writes_blocked(), 1);
        assert!(
            fault.read_file(&path).unwrap().is_empty(),
            "a held write landed"
        );
        gated.release();
        writer.join().unwrap();
        assert_eq!(gated.writes_blocked(), 0);
        assert_eq!(fault.read_file(&path).unwrap(), b"late");
    }

    #[test]
    fn a_stall_holds_syncs_and_counts_every_waiter() {
        let (_fault, gated, dir) = in_memory();
        let first = gated.open(&dir.join("a"), OpenMode::CreateNew).unwrap();
        let second = gated.open(&dir.join("b"), OpenMode::CreateNew).unwrap();
        first.write_all_at(b"x", 0).unwrap();
        // Stalled through a clone: the gate is shared.
        gated.clone().stall();
        let syncer = thread::spawn(move || first.sync_data().unwrap());
        let writer = thread::spawn(move || second.write_all_at(b"y", 0).unwrap());
        assert!(eventually(|| gated.writes_blocked() == 2));
        assert!(!syncer.is_finished() && !writer.is_finished());
        gated.release();
        syncer.join().unwrap();
        writer.join().unwrap();
        assert_eq!(gated.writes_blocked(), 0);
        // Open again: later calls pass straight through.
        let third = gated.open(&dir.join("c"), OpenMode::CreateNew).unwrap();
        third.write_all_at(b"z", 0).unwrap();
        third.sync_data().unwrap();
    }

    #[test]
    fn a_write_delay_slows_every_write() {
        let (fault, gated, dir) = in_memory();
        let path = dir.join("a");
        let file = gated.open(&path, OpenMode::CreateNew).unwrap();
        let delay = Duration::from_millis(20);
        gated.set_write_delay(Some(delay));
        let started = Instant::now();
        for i in 0..5u8 {
            file.write_all_at(&[i], u64::from(i)).unwrap();
        }
        assert!(started.elapsed() >= delay * 5, "{:?}", started.elapsed());
        assert_eq!(fault.read_file(&path).unwrap(), [0, 1, 2, 3, 4]);
        // Syncs are not delayed, and removing the delay restores full speed. Both are checked
        // against a bound far above an in-memory call, to stay robust on a loaded machine.
        gated.set_write_delay(Some(Duration::from_secs(60)));
        let started = Instant::now();
        file.sync_data().unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
        gated.set_write_delay(None);
        let started = Instant::now();
        file.write_all_at(b"fast", 5).unwrap();
        assert!(started.elapsed() < Duration::from_secs(30));
    }

    #[test]
    fn everything_else_reaches_the_real_file_system() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("log");
        let gated = GatedStorage::new(Arc::new(StdStorage));
        gated.create_dir_all(&dir).unwrap();

        let lock = gated.lock_dir(&dir).unwrap();
        let again = gated.lock_dir(&dir).err().expect("a second lock holder");
        assert_eq!(again.kind(), io::ErrorKind::WouldBlock);
        drop(lock);

        let path = dir.join("seg");
        let file = gated.open(&path, OpenMode::CreateNew).unwrap();
        assert!(file.is_empty().unwrap());
        file.allocate(1 << 20).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.set_len(3 << 20).unwrap(); // a sparse hole after the preallocated part
        file.write_all_at(b"tail", (3 << 20) - 4).unwrap();
        file.sync_data().unwrap();
        assert_eq!(file.len().unwrap(), 3 << 20);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);

        // The hole-aware answers of the real file system come through, not the defaults.
        let direct = StdStorage.open(&path, OpenMode::Read).unwrap();
        assert_eq!(
            file.data_regions(0).unwrap(),
            direct.data_regions(0).unwrap()
        );
        let mut tail = [0u8; 4];
        file.read_exact_at(&mut tail, (3 << 20) - 4).unwrap();
        assert_eq!(&tail, b"tail");
        let mut head = [0u8; 8];
        assert_eq!(file.read_at(&mut head, 0).unwrap(), 8);
        assert_eq!(&head, b"head\0\0\0\0");
        let whole = file.read_to_vec().unwrap();
        assert_eq!(whole, std::fs::read(&path).unwrap());

        let renamed = dir.join("seg.old");
        gated.rename(&path, &renamed).unwrap();
        gated.sync_dir(&dir).unwrap();
        let mut names = gated.list(&dir).unwrap();
        names.sort();
        assert_eq!(names, ["LOCK", "seg.old"]);
        gated.remove(&renamed).unwrap();
        assert_eq!(gated.list(&dir).unwrap(), ["LOCK"]);
        assert_eq!(
            gated.open(&renamed, OpenMode::Read).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}
