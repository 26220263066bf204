//! stela-bench: the benchmarks of stela, behind the `stela-bench` binary (`stela-bench wal`,
//! `stela-bench commit`, `stela-bench power-fail`, `stela-bench replicated`, `stela-bench failover`). The peers (okaywal, raft-engine) are
//! dependencies here and nowhere else (SQLite and RocksDB behind features); the product (`stela`) does not depend on this crate.
//!
//! - [`cli`]: the command line, its arguments and the entry point [`cli::run`].
//! - [`record`]: the paper's record type and a deterministic (seeded) generator.
//! - [`harness`]: writer threads, timing, per-write latencies.
//! - [`peers`]: okaywal and raft-engine adapters.
//! - [`wal_bench`]: the runs themselves (the paper's Tables I and II, group commit vs peers).
//! - [`chart`]: an SVG chart of durable write throughput by number of writers.
//! - [`commit_bench`]: `stela-bench commit`, commits/s and latency by mode, clients and size,
//!   timed by the product's commit driver ([`stela::drive`], which `stela demo` runs on too).
//! - [`commit_chart`]: its SVG charts.
//! - [`power_bench`]: `stela-bench power-fail`, the emergency flush against its budget.
//! - [`repl_bench`]: `stela-bench replicated`, `buffered` against `replicated` with the standby
//!   across a veth link in a network namespace of its own.
//! - [`backup_bench`]: `stela-bench backup`, time and bytes of `stela backup` under `disk` load.
//! - [`failover`]: `stela-bench failover`, faults injected into a witness and a failover pair in
//!   namespaces of their own, with a client committing throughout (RemusDB's Figures 5 to 7).
//! - [`tpcb`]: `stela-bench tpcb`, TPC-B on stela-store with classical against decoupled
//!   checkpoints and page cleaning at service intervals (the decoupled-persistence paper's
//!   Figure 4).
//! - [`tpcb_chart`]: its SVG chart (tps by service interval).
//! - [`tpcb_schema`]: what its systems share (arguments, rows, the client driver).
//! - [`tpcb_rocksdb`]: RocksDB's TransactionDB as its peer (the `rocksdb` feature).
//! - [`pg_failover`]: `stela-bench pg-failover`, PostgreSQL on a `replicated` mount failing
//!   over between two nodes, with a client counting acknowledged rows ([`pg_wire`]: its
//!   PostgreSQL protocol).
//! - [`restart_bench`]: `stela-bench restart`, the time to a first transaction after a SIGKILL
//!   with a dirty set of N MiB, instant restart against classical ARIES.
//! - [`warm_standby`]: `stela-bench warm-standby`, promotion to a first transaction of
//!   stela-store on a warm follower's directory against a cold one.
//! - [`netns`]: what the two share: namespaces, `ip`/`tc`, child processes, waiting.
//! - [`impair`]: a lossy, slow link by netfilter, for the failover run on kernels without netem.

mod affinity;
pub mod backup_bench;
pub mod chart;
pub mod cli;
pub mod commit_bench;
pub mod commit_chart;
pub mod failover;
pub mod fuse_passthrough;
pub mod harness;
pub mod hostile;
pub mod impair;
pub mod neighbour;
pub mod netns;
pub mod peers;
pub mod pg_bench;
pub mod pg_failover;
pub mod pg_standby;
pub mod pg_wire;
pub mod power_bench;
pub mod record;
pub mod repl_bench;
pub mod restart_bench;
pub mod tpcb;
pub mod tpcb_chart;
pub mod tpcb_crash;
pub mod tpcb_rocksdb;
pub mod tpcb_schema;
pub mod wal_bench;
pub mod warm_standby;

pub use record::{Data, Record};
pub use wal_bench::{run, PaperConfig, ResultRow, SyncChoice, System, WalBenchConfig};
