//! distlock: distributed locks for Rust services that run as many replicas, with one API over
//! several lock stores, fencing tokens, and a per-call-site choice between *efficiency* and
//! *correctness*.
//!
//! Today this facade re-exports the contract ([`distlock_api`]) and its in-memory reference
//! backend ([`memory`]); the Redis, etcd and ZooKeeper backends and the configuration loader plug
//! in here as they land.
//!
//! See [`distlock_api`] for the contract and the "efficiency or correctness?" decision table.
#![deny(missing_docs)]

pub use distlock_api::*;
