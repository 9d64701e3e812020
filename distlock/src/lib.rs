//! distlock: distributed locks for Rust services that run as many replicas, with one API over
//! Redis, etcd, ZooKeeper and an in-process store, fencing tokens, and a per-call-site choice
//! between *efficiency* and *correctness*.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! // distlock.toml + DISTLOCK_* variables; with neither, an in-process memory backend.
//! let locks = distlock::Locks::load(Some("distlock.toml".as_ref())).await?;
//! let rebuild = locks.efficiency("cache:42").try_now().await?;          // any backend
//! let pay = locks.correctness("payment:7").wait(Duration::from_secs(5)).await?; // etcd / zk
//! let token = pay.fencing_token().expect("correctness leases are fenced");
//! # let _ = (rebuild, token); Ok(()) }
//! ```
//!
//! * [`Locks`]: profiles per grade from a [`Config`] (TOML + environment through figment); a
//!   correctness profile that points at a backend that cannot give correctness is refused at
//!   load time ([`ConfigError::GradeMismatch`]).
//! * [`connect`] / [`BackendSpec`]: a backend from a URL; schemes `memory`, and with the cargo
//!   features of the same name (on by default) `redis`, `etcd`, `zk`.
//! * Everything of [`distlock_api`] is re-exported: the contract, [`Lease`], [`Fence`], the
//!   "efficiency or correctness?" table.
#![deny(missing_docs)]

mod config;
mod error;
mod locks;
mod spec;

pub use config::{BackendConfig, Config, LeaseConfig, OptionValue};
pub use distlock_api::*;
pub use error::ConfigError;
pub use locks::{Acquire, Locks, connect};
pub use spec::{BackendSpec, SCHEMES, Scheme, known_schemes, parse_duration, redact};
