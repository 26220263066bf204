//! stela-repl: the replication rules of a stela cluster as pure state machines, and a
//! deterministic simulator of a cluster built on them.
//!
//! - [`log`]: records labelled with terms, term histories, divergence, resolution;
//! - [`msg`]: what the machines say to each other and to clients;
//! - [`coordinator`]: the witness's rules (epochs, elections, grants);
//! - [`node`]: a node, primary or standby (fencing, K-of-N protection, reprotection,
//!   heartbeats both ways, resolution);
//! - [`sim`]: one process holding N nodes, the coordinator and clients, driven by one seeded
//!   scheduler through lossy networks and disks, checked after every step.
//!
//! No machine does I/O or reads a clock: each `step` takes a message or a tick (with the time)
//! and returns what to send and write. The daemon is meant to become a thin shell around them.
//!
//! ```
//! use stela_repl::sim::{run, SimConfig};
//! let outcome = run(7, &SimConfig::three_nodes());
//! assert!(outcome.failure.is_none(), "{}", outcome.report());
//! ```

pub mod coordinator;
pub mod log;
pub mod msg;
pub mod node;
pub mod sim;
