//! stela-bench: the benchmarks behind `stela wal bench` and `stela demo`.
//!
//! - [`record`]: the paper's record type and a deterministic (seeded) generator.
//! - [`harness`]: writer threads, timing, per-write latencies.
//! - [`peers`]: okaywal and raft-engine adapters (the peers exist only in this crate).
//! - [`wal_bench`]: the runs themselves (the paper's Tables I and II, group commit vs peers).
//! - [`chart`]: an SVG chart of durable write throughput by number of writers.
//! - [`cli`]: the clap arguments and the entry points the `stela` command calls.

pub mod chart;
pub mod cli;
pub mod harness;
pub mod peers;
pub mod record;
pub mod wal_bench;

pub use record::{Data, Record};
pub use wal_bench::{run, PaperConfig, ResultRow, SyncChoice, System, WalBenchConfig};
