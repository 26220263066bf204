//! The `stela` command. Thin by design: it parses arguments and calls into the library, where
//! tests can reach the same code.

use std::process::ExitCode;

/// mimalloc rather than the system allocator: replay decodes records on worker threads and the
/// caller frees them, and glibc's per-thread arenas make such cross-thread frees slow.
/// `stela-bench` uses the same allocator, set up by the same call, so its numbers match the
/// product's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    stela::alloc::keep_freed_memory();
    stela::run(std::env::args_os())
}
