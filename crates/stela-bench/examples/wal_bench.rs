//! `stela wal bench` without the `stela` command: the same arguments, e.g.
//! `cargo run --release -p stela-bench --example wal_bench -- --records 20000 --peers --writers 1,16`.
//! With `demo` as the only argument, runs `stela demo` instead.

use clap::Parser;

/// The same allocator as the `stela` command, so the numbers match.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use stela_bench::cli::{run_demo, run_wal_bench, WalBenchArgs};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: WalBenchArgs,
}

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("demo") {
        return run_demo();
    }
    run_wal_bench(Cli::parse().args)
}
