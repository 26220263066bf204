//! The `stela-bench` command. Thin by design: it parses arguments and calls into the library,
//! where tests can reach the same code.

use std::process::ExitCode;

/// mimalloc, the allocator of the `stela` command, so the numbers here match the product's, and
/// every system compared (stela and its peers, which run in this process) gets the same one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    stela_bench::cli::run(std::env::args_os())
}
