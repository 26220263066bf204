//! The persistence services, and the shared state they and the transactions run on. From the
//! bottom up:
//! - `checkpoint`: classical and decoupled checkpoints (the decoupled one computed from the log,
//!   taking no latch);
//! - `cleaner`: the classical page cleaner (over the pool) and the decoupled one (replaying the
//!   log, or the archive's runs where it lags behind them, onto the stored images), with its
//!   cache of images (`image_cache`);
//! - `retention`: how far back each reader of the log reads, so that the log is truncated only
//!   below all of them;
//! - `follow`: the warm standby store, a [`Follower`](follow::Follower) replaying a standby
//!   daemon's copy of the log onto a directory of its own;
//! - `background`: the scheduling of the services' threads;
//! - `shared`: the state the store's threads share; `rounds`: one round of each service on it;
//!   `restart_work`: instant restart's remaining work on it; `open`: building it and starting
//!   the threads.
//!
//! The services stand on recovery (a checkpoint writes the master record restart reads), access
//! and the log; the store's API (`store.rs`) stands on them.

pub(crate) mod background;
pub(crate) mod checkpoint;
pub(crate) mod cleaner;
pub(crate) mod follow;
pub(crate) mod image_cache;
pub(crate) mod open;
pub(crate) mod restart_work;
pub(crate) mod retention;
pub(crate) mod rounds;
pub(crate) mod shared;
