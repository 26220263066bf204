//! The watcher: one thread per client process that notices the daemon's death for every
//! connection with a shared-memory ring.
//!
//! A client waiting in a ring sleeps on a futex in the ring's memory, which the kernel does not
//! touch when the daemon dies. The socket, though, closes with it. This thread polls the
//! sockets of every ring connection for a hang-up and, on one, marks the ring gone (which
//! changes the futex word and wakes the waiter), so the wait ends with an error at once, as it
//! would on the socket.
//!
//! Invariants: one watcher per process: a child of fork (whose copy of the parent's watcher
//! has no thread) starts its own for its own rings, and forgets the copy without dropping it;
//! the thread exists only once a ring exists and costs nothing while the daemon
//! lives (it sleeps in `poll`); a connection is unwatched (and its descriptor closed) before
//! it is dropped, and the thread re-reads its list under the lock before acting on an event, so
//! a descriptor number reused after a close is never taken for the old connection.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use stela_net::shm::GoneHandle;

struct Entry {
    id: u64,
    socket: UnixStream,
    gone: GoneHandle,
}

struct Watcher {
    entries: Mutex<(u64, Vec<Entry>)>,
    /// Written to make the thread re-read its list.
    wake: OwnedFd,
}

/// This process's watcher, with the pid it was started in.
static WATCHER: Mutex<Option<(u32, Arc<Watcher>)>> = Mutex::new(None);

/// A watched connection; dropping it stops the watch.
pub(crate) struct Watched {
    id: u64,
    watcher: Arc<Watcher>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut entries = self
            .watcher
            .entries
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        entries.1.retain(|e| e.id != self.id);
        drop(entries);
        self.watcher.nudge();
    }
}

impl Watcher {
    fn nudge(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn run(&self) {
        loop {
            let snapshot: Vec<(u64, i32)> = {
                let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
                entries
                    .1
                    .iter()
                    .map(|e| (e.id, e.socket.as_raw_fd()))
                    .collect()
            };
            let mut fds = Vec::with_capacity(snapshot.len() + 1);
            fds.push(libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            fds.extend(snapshot.iter().map(|&(_, fd)| libc::pollfd {
                fd,
                events: libc::POLLRDHUP,
                revents: 0,
            }));
            // SAFETY: `fds` is a valid array of initialised pollfd entries of the length given;
            // the descriptors may have been closed since the snapshot, which poll reports as
            // POLLNVAL rather than misbehaving, and we re-check every event under the lock.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
            if ready < 0 {
                continue; // EINTR
            }
            if fds[0].revents != 0 {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&self.wake, &mut buf);
            }
            let hung_up: Vec<u64> = snapshot
                .iter()
                .zip(&fds[1..])
                .filter(|(_, p)| p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0)
                .map(|((id, _), _)| *id)
                .collect();
            if hung_up.is_empty() {
                continue;
            }
            let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
            entries.1.retain(|entry| {
                let dead = hung_up.contains(&entry.id);
                if dead {
                    entry.gone.mark_gone();
                }
                !dead
            });
        }
    }
}

fn watcher() -> std::io::Result<Arc<Watcher>> {
    let mut current = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
    let pid = std::process::id();
    match current.take() {
        Some((owner, watcher)) if owner == pid => {
            *current = Some((owner, Arc::clone(&watcher)));
            return Ok(watcher);
        }
        // The parent's, copied by fork: its thread is not here, and its sockets are the
        // parent's connections. Forgotten, not dropped.
        Some(inherited) => std::mem::forget(inherited),
        None => {}
    }
    let wake = rustix::event::eventfd(
        0,
        rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
    )?;
    let watcher = Arc::new(Watcher {
        entries: Mutex::new((0, Vec::new())),
        wake,
    });
    let thread_watcher = Arc::clone(&watcher);
    std::thread::Builder::new()
        .name("stela-client-watcher".into())
        .spawn(move || {
            block_signals();
            thread_watcher.run()
        })?;
    *current = Some((pid, Arc::clone(&watcher)));
    Ok(watcher)
}

/// The application's signals are for its own threads: a handler of a program this library
/// was preloaded into (PostgreSQL's, say) must not run on this thread.
fn block_signals() {
    // SAFETY: `all` is initialised by sigfillset before use; pthread_sigmask only reads it.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// Watches `socket`: when the daemon's end closes, `gone` is marked.
pub(crate) fn watch(socket: UnixStream, gone: GoneHandle) -> std::io::Result<Watched> {
    let watcher = watcher()?;
    let id = {
        let mut entries = watcher.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.0 += 1;
        let id = entries.0;
        entries.1.push(Entry { id, socket, gone });
        id
    };
    watcher.nudge();
    Ok(Watched { id, watcher })
}
