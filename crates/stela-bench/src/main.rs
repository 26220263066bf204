//! The `stela-bench` command. Thin by design: it parses arguments and calls into the library,
//! where tests can reach the same code.

use std::process::ExitCode;

/// mimalloc, the allocator of the `stela` command, set up as it is there
/// ([`stela::alloc::keep_freed_memory`]), so the numbers here match the product's. The Rust
/// peers (okaywal, raft-engine) allocate from it too; RocksDB and SQLite allocate with their
/// own C and C++ allocators.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    stela::alloc::keep_freed_memory();
    stela_bench::cli::run(std::env::args_os())
}
