//! The `stela-bench` command. Thin by design: it parses arguments and calls into the library,
//! where tests can reach the same code.

use std::process::ExitCode;

/// mimalloc, the allocator of the `stela` command, set up as it is there (freed memory kept
/// for reuse, not purged: see `keep_freed_memory` in the `stela` crate's main.rs), so the
/// numbers here match the product's. The Rust peers (okaywal, raft-engine) allocate from it
/// too; RocksDB and SQLite allocate with their own C and C++ allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (the `stela` command's main.rs says why by number, and
/// tests it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    // SAFETY: sets one of mimalloc's options, a plain store of an integer; valid from any
    // thread at any time.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    stela_bench::cli::run(std::env::args_os())
}
