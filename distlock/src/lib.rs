//! distlock: distributed locks for Rust services that run as many replicas, with one API over
//! Redis, etcd, ZooKeeper, PostgreSQL and an in-process store, fencing tokens, and a per-call-site choice
//! between *efficiency* and *correctness*.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! // distlock.toml + DISTLOCK_* variables; with neither, an in-process memory backend.
//! let locks = distlock::Locks::load(Some("distlock.toml".as_ref())).await?;
//! let rebuild = locks.efficiency("cache:42").try_now().await?;          // any backend
//! let pay = locks.correctness("payment:7").wait(Duration::from_secs(5)).await?; // etcd / zk / postgres
//! let token = pay.fencing_token().expect("correctness leases are fenced");
//! # let _ = (rebuild, token); Ok(()) }
//! ```
//!
//! * [`Locks`]: profiles per grade from a [`Config`] (TOML + environment through figment); a
//!   correctness profile that points at a backend that cannot give correctness is refused at
//!   load time ([`ConfigError::GradeMismatch`]).
//! * [`connect`] / [`BackendSpec`]: a backend from a URL; scheme `memory` always, and with the
//!   cargo features of the same name `redis`, `etcd`, `zk`, `postgres` (`all` enables them),
//!   whose backend crates are re-exported as [`redis`], [`etcd`], [`zk`], [`postgres`] for their
//!   guarded writes and options.
//!
//! The user guide (install, choosing a backend, every configuration key, the lease, fencing
//! recipes, testing with the memory backend, operations) is `docs/guide.md` in the repository.
//! * Everything of [`distlock_api`] is re-exported: the contract, [`Lease`], [`Fence`], the
//!   "efficiency or correctness?" table.
#![deny(missing_docs)]

mod config;
mod error;
mod locks;
pub mod run_vars;
mod spec;

pub use config::{BackendConfig, Config, LeaseConfig, OptionValue};
pub use distlock_api::*;
pub use error::ConfigError;
pub use locks::{Acquire, Locks, connect};
pub use spec::{BackendSpec, SCHEMES, Scheme, known_schemes, parse_duration, parse_wait, redact};

/// The etcd backend (`etcd` feature): [`etcd::EtcdBackend`] and its guarded transactions.
#[cfg(feature = "etcd")]
pub use distlock_etcd as etcd;
/// The PostgreSQL backend (`postgres` feature): [`postgres::PostgresBackend`] and its options.
#[cfg(feature = "postgres")]
pub use distlock_postgres as postgres;
/// The Redis backends (`redis` feature): one server, Cluster, Sentinel, and Redlock.
#[cfg(feature = "redis")]
pub use distlock_redis as redis;
/// The ZooKeeper backend (`zk` feature): [`zk::ZkBackend`] and its guarded writes.
#[cfg(feature = "zk")]
pub use distlock_zk as zk;

/// The user guide's snippets, compiled (and, those that need no server, run) as doctests: the
/// guide cannot drift from the API.
#[cfg(all(doctest, feature = "all"))]
#[doc = include_str!("../../docs/guide.md")]
pub struct Guide;
