//! The distlock contract: one lock API over Redis, etcd, ZooKeeper and an in-memory store.
//!
//! * [`LockBackend`]: the dyn-compatible trait each store implements (`Arc<dyn LockBackend>`).
//! * [`LockClient`]: what applications call; validates names and options before any I/O,
//!   refuses a grade the backend cannot give, adds re-entrancy ([`Owner`]) and the watchdog.
//! * [`Lease`]: the guard; fencing token, local validity ([`Lease::remaining`]), renew, release,
//!   and the [`LostSignal`] to select on.
//! * [`Fence`]: the resource-side check of fencing tokens.
//! * [`Election`]: leader election on a lock's queue ([`LockClient::election`]): campaign,
//!   [`Leadership`] (term = fencing token, lost signal, proclaim, resign), the callback form
//!   ([`Election::lead`]), and observers ([`Election::leader`], [`Election::observe`]).
//! * [`Semaphore`] and [`RwLock`]: at most N holders, or many readers and one writer, on the
//!   same queue as locks with another admission policy ([`admission`]).
//! * [`memory`]: the reference backend, usable under `tokio::time::pause()`.
//!
//! # Efficiency or correctness?
//!
//! Decide per call site what a double run costs.
//!
//! | the lock protects | a double run | ask for | backends | and also |
//! |---|---|---|---|---|
//! | cron de-duplication, cache rebuild, "only one replica polls" | wastes work | [`Guarantee::Efficiency`] | any: Redis (fastest), Redlock, etcd, ZooKeeper | make the work idempotent |
//! | payments, stock, quotas | loses money | [`Guarantee::Correctness`] | etcd, ZooKeeper (consensus stores) | check the [`FencingToken`] in the resource ([`Fence`], conditional SQL `UPDATE`, guarded txn) |
//! | shared data you can update conditionally | - | often no lock | - | unique constraints, optimistic versions, state-machine `UPDATE ... WHERE status = ...` |
//!
//! Why: every lease-based lock fails when the holder pauses (GC, SIGSTOP, a slow network) for
//! longer than its TTL: it wakes up believing it holds the lock. Redis adds asynchronous
//! replication (a failover can forget a lock) and clock-driven TTLs. Only a token that a
//! linearizable store hands out in grant order, checked by the resource, turns "probably one
//! writer" into "stale writers are refused". So `Correctness` is only granted by backends whose
//! tokens come from a consensus log, and its leases always carry a token.
//!
//! # Example
//! ```
//! use std::{sync::Arc, time::Duration};
//! use distlock_api::{AcquireOptions, Guarantee, LockClient, memory::MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> distlock_api::Result<()> {
//! let locks = LockClient::new(Arc::new(MemoryBackend::default()));
//! let opts = AcquireOptions::with_ttl(Duration::from_secs(10)).guarantee(Guarantee::Correctness);
//! let lease = locks.acquire("payment:7", &opts, Duration::from_secs(1)).await?;
//! let token = lease.fencing_token().expect("correctness leases are fenced");
//! // ... write to the resource with `token`, while selecting on `lease.lost()` ...
//! assert!(lease.release().await?);
//! # let _ = token; Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod admission;
mod backend;
mod client;
mod deadline;
mod election;
mod error;
mod fencing;
mod guarantee;
mod holder;
mod last_chance;
mod leader;
mod lease;
mod margins;
pub mod memory;
pub mod metrics;
mod name;
mod options;
mod owner;
mod repeat;
mod run;
mod secret;
mod semaphore;
mod signal;
pub mod url;
mod watchdog;

pub use admission::{Admission, admitted_count, entry_limit};
pub use backend::{
    Grant, GrantKey, HolderStatus, LockBackend, LockStatus, Renewal, renew_as_batch,
};
pub use client::LockClient;
pub use election::{
    ELECTION_LOCK_PREFIX, Election, Leadership, MAX_VALUE_BYTES, announced_entry, announced_value,
    entry_written_by, leader_value,
};
pub use error::{LockError, LostReason, Result, shown};
pub use fencing::{Fence, FencingToken, StaleToken};
/// The stream traits and type of [`Election::observe`], re-exported so observers need no
/// `futures` dependency of their own.
pub use futures_util::{Stream, StreamExt, stream::BoxStream};
pub use guarantee::{Capabilities, Fencing, Guarantee, Reentrancy, Wakeup};
pub use holder::{HolderInfo, MAX_COMMAND_BYTES, describe_process};
pub use last_chance::{LastChance, Reconnect};
pub use leader::Leader;
pub use lease::Lease;
pub use margins::{LeaseMode, Margins};
pub use name::{HASHED_PREFIX_LEN, LockName, MAX_ENCODED_LEN, MAX_NAME_BYTES};
pub use options::AcquireOptions;
pub use owner::Owner;
pub use repeat::{RepeatGrant, RepeatPrior};
pub use run::{Held, Ran};
pub use secret::OwnerSecret;
pub use semaphore::{RWLOCK_LOCK_PREFIX, RwLock, SEMAPHORE_LOCK_PREFIX, Semaphore};
pub use signal::{LostSignal, LostTrigger, lost_signal};
