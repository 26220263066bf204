//! [`Hooked`]: the one forwarding wrapper for test storages.
//!
//! A test that needs a storage which stalls, counts, records or fails some calls wraps a real one
//! (usually [`super::FaultStorage`]) and writes only what differs, as a [`Hooks`] value: every
//! call of [`Storage`] and of the files opened through it goes to the wrapped storage unchanged,
//! after [`Hooks::before`] let it pass and followed by [`Hooks::after`] with its outcome. The
//! provided methods of [`StorageFile`] are forwarded too, so a wrapped file that answers them
//! better than the defaults (the real file system knows its holes, [`super::FaultStorage`] tears
//! a vectored write as one write) keeps doing so.
//!
//! Invariant: a call that `before` refuses never reaches the wrapped storage, and `after` is
//! called exactly once for every call that did.

use super::{OpenMode, Storage, StorageFile};
use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A call about to reach the wrapped storage, as [`Hooks`] see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<'a> {
    CreateDir {
        dir: &'a Path,
    },
    List {
        dir: &'a Path,
    },
    Open {
        path: &'a Path,
        mode: OpenMode,
    },
    Rename {
        from: &'a Path,
        to: &'a Path,
    },
    Remove {
        path: &'a Path,
    },
    SyncDir {
        dir: &'a Path,
    },
    LockDir {
        dir: &'a Path,
    },
    /// Any read of a file (`read_at`, `read_exact_at`, `read_to_vec`), from `offset` on.
    Read {
        path: &'a Path,
        offset: u64,
    },
    /// `write_all_at` or `write_all_vectored_at` of `len` bytes in all.
    Write {
        path: &'a Path,
        offset: u64,
        len: u64,
    },
    SyncData {
        path: &'a Path,
    },
    /// `start_writeback`: the file's written data on its way to the device, nothing more.
    StartWriteback {
        path: &'a Path,
    },
    /// `len` or `is_empty`.
    Len {
        path: &'a Path,
    },
    DataRegions {
        path: &'a Path,
        from: u64,
    },
    Allocate {
        path: &'a Path,
        len: u64,
    },
    SetLen {
        path: &'a Path,
        len: u64,
    },
}

impl Call<'_> {
    /// Whether the call changes what is stored or what survives a power cut: creating a
    /// directory or file, renaming, removing, writing, syncing, resizing.
    pub fn mutates(&self) -> bool {
        match self {
            Call::Open { mode, .. } => *mode == OpenMode::CreateNew,
            Call::CreateDir { .. }
            | Call::Rename { .. }
            | Call::Remove { .. }
            | Call::SyncDir { .. }
            | Call::Write { .. }
            | Call::SyncData { .. }
            | Call::Allocate { .. }
            | Call::SetLen { .. } => true,
            Call::List { .. }
            | Call::LockDir { .. }
            | Call::StartWriteback { .. }
            | Call::Read { .. }
            | Call::Len { .. }
            | Call::DataRegions { .. } => false,
        }
    }

    /// The file or directory the call is about (for a rename, its source).
    pub fn path(&self) -> &Path {
        match self {
            Call::CreateDir { dir }
            | Call::List { dir }
            | Call::SyncDir { dir }
            | Call::LockDir { dir } => dir,
            Call::Rename { from, .. } => from,
            Call::Open { path, .. }
            | Call::Remove { path }
            | Call::Read { path, .. }
            | Call::Write { path, .. }
            | Call::SyncData { path }
            | Call::StartWriteback { path }
            | Call::Len { path }
            | Call::DataRegions { path, .. }
            | Call::Allocate { path, .. }
            | Call::SetLen { path, .. } => path,
        }
    }
}

/// What a test adds to the storage it wraps. Both methods default to doing nothing.
pub trait Hooks: Send + Sync + fmt::Debug + 'static {
    /// Runs before `call` reaches the wrapped storage; may block (to stall the disk) or return
    /// an error, which fails the call without running it.
    fn before(&self, _call: &Call<'_>) -> io::Result<()> {
        Ok(())
    }

    /// Runs after the wrapped storage answered `call`, with its outcome.
    fn after(&self, _call: &Call<'_>, _outcome: Result<(), &io::Error>) {}
}

/// A [`Storage`] that forwards every call to `inner`, through `hooks`. Clones share the hooks.
pub struct Hooked<H> {
    inner: Arc<dyn Storage>,
    hooks: Arc<H>,
}

impl<H> Clone for Hooked<H> {
    fn clone(&self) -> Self {
        Hooked {
            inner: Arc::clone(&self.inner),
            hooks: Arc::clone(&self.hooks),
        }
    }
}

impl<H: fmt::Debug> fmt::Debug for Hooked<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl<H: Hooks> Hooked<H> {
    /// Wraps `inner`, calling `hooks` around every call.
    pub fn wrap(inner: Arc<dyn Storage>, hooks: H) -> Hooked<H> {
        Hooked {
            inner,
            hooks: Arc::new(hooks),
        }
    }

    /// The hooks, shared by every clone and every file opened through them.
    pub fn hooks(&self) -> &H {
        &self.hooks
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &Arc<dyn Storage> {
        &self.inner
    }
}

/// Runs `op` as `call`: `before`, the call itself, `after`.
fn run<H: Hooks, T>(
    hooks: &H,
    call: Call<'_>,
    op: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    hooks.before(&call)?;
    let result = op();
    hooks.after(&call, result.as_ref().map(|_| ()));
    result
}

impl<H: Hooks> Storage for Hooked<H> {
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        run(&*self.hooks, Call::CreateDir { dir }, || {
            self.inner.create_dir_all(dir)
        })
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        run(&*self.hooks, Call::List { dir }, || self.inner.list(dir))
    }

    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let inner = run(&*self.hooks, Call::Open { path, mode }, || {
            self.inner.open(path, mode)
        })?;
        Ok(Box::new(HookedFile {
            inner,
            path: path.to_path_buf(),
            hooks: Arc::clone(&self.hooks),
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        run(&*self.hooks, Call::Rename { from, to }, || {
            self.inner.rename(from, to)
        })
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        run(&*self.hooks, Call::Remove { path }, || {
            self.inner.remove(path)
        })
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        run(&*self.hooks, Call::SyncDir { dir }, || {
            self.inner.sync_dir(dir)
        })
    }

    fn lock_dir(&self, dir: &Path) -> io::Result<Box<dyn Send + Sync>> {
        run(&*self.hooks, Call::LockDir { dir }, || {
            self.inner.lock_dir(dir)
        })
    }
}

/// A file opened through [`Hooked`].
struct HookedFile<H> {
    inner: Box<dyn StorageFile>,
    path: PathBuf,
    hooks: Arc<H>,
}

impl<H> fmt::Debug for HookedFile<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookedFile")
            .field("path", &self.path)
            .field("inner", &self.inner)
            .finish()
    }
}

impl<H: Hooks> StorageFile for HookedFile<H> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let path = &self.path;
        run(&*self.hooks, Call::Read { path, offset }, || {
            self.inner.read_at(buf, offset)
        })
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (path, len) = (&self.path, buf.len() as u64);
        run(&*self.hooks, Call::Write { path, offset, len }, || {
            self.inner.write_all_at(buf, offset)
        })
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> io::Result<()> {
        let path = &self.path;
        let len = bufs.iter().map(|buf| buf.len() as u64).sum();
        run(&*self.hooks, Call::Write { path, offset, len }, || {
            self.inner.write_all_vectored_at(bufs, offset)
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        let path = &self.path;
        run(&*self.hooks, Call::SyncData { path }, || {
            self.inner.sync_data()
        })
    }

    fn start_writeback(&self) -> io::Result<()> {
        let path = &self.path;
        run(&*self.hooks, Call::StartWriteback { path }, || {
            self.inner.start_writeback()
        })
    }

    fn len(&self) -> io::Result<u64> {
        let path = &self.path;
        run(&*self.hooks, Call::Len { path }, || self.inner.len())
    }

    fn is_empty(&self) -> io::Result<bool> {
        let path = &self.path;
        run(&*self.hooks, Call::Len { path }, || self.inner.is_empty())
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        let path = &self.path;
        run(&*self.hooks, Call::Allocate { path, len }, || {
            self.inner.allocate(len)
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let path = &self.path;
        run(&*self.hooks, Call::SetLen { path, len }, || {
            self.inner.set_len(len)
        })
    }

    fn data_regions(&self, from: u64) -> io::Result<Vec<Range<u64>>> {
        let path = &self.path;
        run(&*self.hooks, Call::DataRegions { path, from }, || {
            self.inner.data_regions(from)
        })
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let path = &self.path;
        run(&*self.hooks, Call::Read { path, offset }, || {
            self.inner.read_exact_at(buf, offset)
        })
    }

    fn read_to_vec(&self) -> io::Result<Vec<u8>> {
        let path = &self.path;
        run(&*self.hooks, Call::Read { path, offset: 0 }, || {
            self.inner.read_to_vec()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{FaultStorage, StdStorage};
    use std::sync::Mutex;

    /// Records every call it sees, and fails the ones on a file named "refused".
    #[derive(Debug, Default)]
    struct Recorder {
        seen: Mutex<Vec<(String, bool)>>,
    }

    impl Hooks for Recorder {
        fn before(&self, call: &Call<'_>) -> io::Result<()> {
            if call.path().ends_with("refused") && call.mutates() {
                return Err(io::Error::other("refused by the hook"));
            }
            Ok(())
        }

        fn after(&self, call: &Call<'_>, outcome: Result<(), &io::Error>) {
            let name = format!("{call:?}");
            let name = name.split([' ', '{']).next().unwrap().to_string();
            self.seen.lock().unwrap().push((name, outcome.is_ok()));
        }
    }

    /// Every call of both traits reaches the wrapped storage and both hooks, in order; a call
    /// the hook refuses never reaches it.
    #[test]
    fn every_call_is_forwarded_between_the_hooks() {
        let fault = FaultStorage::new();
        let hooked = Hooked::wrap(Arc::new(fault.clone()), Recorder::default());
        let dir = Path::new("/d");
        hooked.create_dir_all(dir).unwrap();
        let lock = hooked.lock_dir(dir).unwrap();
        let file = hooked.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
        file.allocate(8).unwrap();
        file.write_all_at(b"ab", 0).unwrap();
        file.write_all_vectored_at(&[b"cd", b"ef"], 2).unwrap();
        file.sync_data().unwrap();
        file.start_writeback().unwrap();
        file.set_len(6).unwrap();
        assert_eq!(file.len().unwrap(), 6);
        assert!(!file.is_empty().unwrap());
        assert_eq!(file.data_regions(0).unwrap(), vec![0..6]);
        let mut two = [0u8; 2];
        assert_eq!(file.read_at(&mut two, 0).unwrap(), 2);
        file.read_exact_at(&mut two, 4).unwrap();
        assert_eq!(&two, b"ef");
        assert_eq!(file.read_to_vec().unwrap(), b"abcdef");
        hooked.rename(&dir.join("f"), &dir.join("g")).unwrap();
        hooked.sync_dir(dir).unwrap();
        assert_eq!(hooked.list(dir).unwrap(), ["g"]);
        hooked.remove(&dir.join("g")).unwrap();
        drop(lock);
        assert!(hooked
            .open(&dir.join("refused"), OpenMode::CreateNew)
            .is_err());
        assert!(fault.read_file(&dir.join("refused")).is_none());

        let seen = hooked.hooks().seen.lock().unwrap().clone();
        let names: Vec<&str> = seen.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "CreateDir",
                "LockDir",
                "Open",
                "Allocate",
                "Write",
                "Write",
                "SyncData",
                "StartWriteback",
                "SetLen",
                "Len",
                "Len",
                "DataRegions",
                "Read",
                "Read",
                "Read",
                "Rename",
                "SyncDir",
                "List",
                "Remove",
            ]
        );
        assert!(seen.iter().all(|(_, ok)| *ok));
    }

    /// The hole-aware answers of the real file system come through the wrapper.
    #[test]
    fn provided_methods_reach_the_wrapped_file() {
        let tmp = tempfile::tempdir().unwrap();
        let hooked = Hooked::wrap(Arc::new(StdStorage), Recorder::default());
        let path = tmp.path().join("sparse");
        let file = hooked.open(&path, OpenMode::CreateNew).unwrap();
        file.write_all_at(b"head", 0).unwrap();
        file.set_len(8 << 20).unwrap();
        file.write_all_at(b"tail", (8 << 20) - 4).unwrap();
        let direct = StdStorage.open(&path, OpenMode::Read).unwrap();
        assert_eq!(
            file.data_regions(0).unwrap(),
            direct.data_regions(0).unwrap()
        );
        assert_eq!(file.read_to_vec().unwrap(), std::fs::read(&path).unwrap());
    }
}
