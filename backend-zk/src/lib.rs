//! The ZooKeeper backend of distlock: **correctness grade**.
//!
//! # How a lock works here
//! * **Acquire** creates an ephemeral sequential node `<root>/<name>/_c_<attempt>-lock-<seq>`
//!   (layout in [`paths`]) holding the owner secret; the lowest sequence holds. A waiter watches
//!   only the next lower node; when that node headed its last listing and is deleted, it is
//!   next without listing again (sequence numbers only grow: nobody can have joined ahead),
//!   after any other event it re-lists; before success it checks its session epoch is still
//!   alive. After a connection loss during create it finds its
//!   node by the protected `_c_<attempt>` prefix *and* our session id (CURATOR-498) before
//!   creating another. A repeat acquire on an otherwise idle ensemble is granted on its create
//!   alone: when the zxid gap to our own released node in that directory is exactly 2, nothing
//!   else was written in between, so the queue holds our node alone (proof at
//!   [`distlock_api::RepeatGrant`]).
//!   Busy, timeout, error and a dropped future delete our node (inline, or in
//!   the background with bounded retries; the session is the fallback).
//! * **Fencing token** = the node's czxid, read from the create reply itself (create2): totally
//!   ordered across the ensemble, never the per-parent 32-bit sequence suffix.
//!   [`ZkBackend::guarded_set_data`] writes data only while our node exists (a checked multi).
//! * **Parents**: the root is persistent; each lock's directory is a *container* node, which the
//!   server deletes once empty, so lock names leave nothing behind. A create that races the
//!   container's removal re-creates it and retries.
//! * **Session**: renewal is ZooKeeper's own heartbeat. A connection loss (SUSPENDED) ends the
//!   session *epoch* and fires every lease's lost signal at once by default
//!   ([`OnDisconnect::Lose`]; [`OnDisconnect::WaitUpTo`] waits, never past the session timeout);
//!   an expired or closed session does too. New acquires then use a new epoch, or a new session.
//!   A manual `renew` checks the session and that our node is still one of its ephemerals.
//! * **TTL mapping**: every lease's TTL is the session timeout ([`ZkOptions::session_timeout`]);
//!   the per-acquire TTL of the trait does not apply.
//! * **Election**: the leader writes `<secret>:<value>` into its own node; observers read the
//!   lowest node's data after a `sync`, and are hinted by child and data watches re-armed at
//!   each change.
//!
//! # Why our own recipe
//! `zookeeper-client` ships `Client::lock`, which is cancellation safe and recovers its node
//! after a connection loss, but it does not return the node's Stat, so the czxid would need a
//! second read that is not atomic with the create. This crate writes the recipe itself.
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod election;
mod guard;
mod inspect;
pub mod paths;
mod probe;
mod queue;
mod session;
mod try_acquire;
pub mod url;
mod wait;

pub use backend::{CAPABILITIES, KAZOO_CAPABILITIES};
pub use client::ZkBackend;
pub use config::{NodeAcl, OnDisconnect, ZkOptions};
pub use paths::Layout;
