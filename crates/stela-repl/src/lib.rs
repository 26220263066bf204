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
//! The rules are described in `docs/REPLICATION.md`. Where the model differs from the daemon
//! today (stela-server, stela-coord), on purpose or for want of time:
//! - elections: the coordinator collects N − K promises with log positions and grants the
//!   furthest node (the witness today grants the standby that asks, after a silent lease);
//! - `replicated` is answered `Ok` once K standbys *and* the primary have synced the record
//!   (the daemon's standby acknowledges from memory and writes behind, and its primary does
//!   not wait for its own disk: that is today's `all`). Either weaker rule loses acknowledged
//!   records in the simulator when two machines lose power at once; the daemon's promise is
//!   the loss of one machine;
//! - every record carries the term that wrote it, and the history is derived from those
//!   labels (the daemon's standby enters a term when its first chunk arrives, so older records
//!   in that chunk are labelled with the new term);
//! - a term is an epoch; a node never reopens a term (a restarted primary rejoins as a standby
//!   and may be elected again in a newer epoch);
//! - one log per node (the daemon has many logs, each with its own stream and reprotection),
//!   records instead of bytes, chunks and segment files; no TLS, tokens, memory budgets;
//! - writing the newest term and cutting into salvage are durable at once; the coordinator's
//!   state is durable (one witness, not etcd);
//! - clients keep one commit outstanding and their links do not drop messages (a node's crash
//!   or pause still cuts them off); at most one disk is damaged per run, and after that only
//!   the damaged node crashes (one lost disk is the whole fault budget of K = 1).
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
