//! Adapters for the peers stela is measured against. Each one opens a fresh log in a directory,
//! writes every set of records as one durable write (the same encoded bytes as stela: the
//! records go through [`stela_format::Codec`]), then reopens the log and reads every record
//! back. The semantic differences each peer's API forces are listed in its module's docs.

pub mod okaywal;
pub mod raft_engine;
