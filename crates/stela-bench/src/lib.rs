//! stela-bench: the benchmarks behind `stela wal bench`, `stela bench commit` and `stela demo`.
//!
//! - [`record`]: the paper's record type and a deterministic (seeded) generator.
//! - [`harness`]: writer threads, timing, per-write latencies.
//! - [`peers`]: okaywal and raft-engine adapters (the peers exist only in this crate).
//! - [`wal_bench`]: the runs themselves (the paper's Tables I and II, group commit vs peers).
//! - [`chart`]: an SVG chart of durable write throughput by number of writers.
//! - [`cli`]: the clap arguments and the entry points of `stela wal bench`.
//! - [`latency`]: a fixed-size latency histogram for timed runs.
//! - [`commit_driver`]: timed commit loops of N clients, embedded or through an in-process daemon.
//! - [`commit_bench`]: `stela bench commit`, commits/s and latency by mode, clients and size.
//! - [`commit_chart`]: its SVG charts.
//! - [`power_bench`]: `stela bench power-fail`, the emergency flush against its budget.
//! - [`demo`]: `stela demo`, fdatasync per commit vs the daemon's `buffered` vs no fsync.

pub mod chart;
pub mod cli;
pub mod commit_bench;
pub mod commit_chart;
pub mod commit_driver;
pub mod demo;
pub mod harness;
pub mod latency;
pub mod peers;
pub mod power_bench;
pub mod record;
pub mod wal_bench;

pub use record::{Data, Record};
pub use wal_bench::{run, PaperConfig, ResultRow, SyncChoice, System, WalBenchConfig};
