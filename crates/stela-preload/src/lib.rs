//! The preload library of `stela run` (LD_PRELOAD): the program's changes to files under the
//! durable directories go to the stela daemon as records, and the fsyncs of those files are
//! answered with the daemon's acknowledgement at the chosen level instead of the disk's.
//!
//! Modules: [`hooks`] (the C functions this library puts in front of libc's: open, write,
//! fsync, rename, ... each performs the call, then logs what it changed), [`fds`] (which
//! descriptors are durable files), [`paths`] (canonical names), [`conn`] (this process's
//! connection, one per process, reopened after fork). Outside `stela run` (its settings
//! missing from the environment) every hook only passes its call on.
//!
//! `unsafe` here is the C boundary: functions exported under libc's names with libc's
//! signatures, the next definition of each found with `dlsym(RTLD_NEXT)`, and the program's
//! buffers read for the lengths the kernel reported written. Each block says why it holds.

pub mod conn;
pub mod fds;
pub mod hooks;
pub mod paths;

/// Runs when the library is loaded: registers the fork handlers (only under `stela run`).
extern "C" fn load() {
    if conn::settings().is_none() {
        return;
    }
    // SAFETY: the handlers are `extern "C" fn()` with static lifetime; pthread_atfork keeps
    // the pointers and calls them around every fork of this process.
    unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    }
}

extern "C" fn prepare() {
    conn::before_fork();
    fds::before_fork();
}

extern "C" fn parent() {
    fds::after_fork();
    conn::after_fork_in_parent();
}

extern "C" fn child() {
    fds::after_fork();
    conn::after_fork_in_child();
}

#[used]
#[link_section = ".init_array"]
static LOAD: extern "C" fn() = load;
