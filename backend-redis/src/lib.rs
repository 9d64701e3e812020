//! The Redis backend of distlock: **efficiency grade**, the fastest backend.
//!
//! # What it does
//! * **Acquire** is one script call ([`scripts`]): `SET NX PX` of `<random 128-bit secret>:<token>`
//!   and, in the same step, `INCR` of the name's bucket fencing counter (and a check that nobody
//!   queued: three commands on the server when the lock is free). A retry that finds our
//!   own secret reports held (a lost reply is recovered). An acquire whose caller was cancelled
//!   while the call was in flight releases what it got.
//! * **Release** is compare-and-delete plus a `PUBLISH` to the waiter whose turn it is (none
//!   when nobody waits) in one script; **renew** is
//!   compare-and-`PEXPIRE`: renew never re-creates a missing key, release never deletes the next
//!   holder's key.
//! * **Watchdog renewals are batched**: the generic watchdog hands every lease due in a tick to
//!   [`distlock_api::LockBackend::renew_batch`], which renews them all in one script call (one
//!   per hash slot on Cluster), so 10 000 held leases cost one call per tick, not 10 000.
//! * **Waiting, FIFO**: a waiter's first try goes out alone (an uncontended acquire is one
//!   script call). When the lock is taken, the waiter is queued on the server (arrival order),
//!   subscribes to its own turn channel (RESP3 pushes on the client's one connection, no extra
//!   connection) and tries again at once. A release tells only the live head of the queue, on
//!   its channel: one wake-up per hand-over, not a herd. Waiters re-check when the holder's TTL
//!   runs out and at least every second, which keeps their place; a crashed waiter is dropped
//!   after 3 s, one that gives up leaves at once.
//! * **Key layout** ([`keys`]): lock key, bucket counter and channel share one hash tag; at most
//!   1 024 counter keys per prefix ever, so names do not leak keys; the queue keys expire when
//!   nobody waits.
//! * **Deployments** ([`RedisTopology`]): one server (`redis://`, `rediss://` with TLS, ACL user
//!   and password in the URL), a Redis Cluster (every script stays in one slot thanks to the
//!   hash tag), or the master Sentinel names (followed after a failover).
//! * **Replica acknowledgement**: with [`RedisOptions::min_replicas`], each grant is followed by
//!   `WAIT` on the same connection; fewer acknowledgements fail the acquire and release it.
//! * **Election**: the leader appends its value to its own lock value ([`scripts::ANNOUNCE`],
//!   `SET ... KEEPTTL`), so it expires and goes with the lock; observers `GET` the lock on the
//!   master and hear announcements on the name's leader channel.
//!
//! # Why only efficiency grade
//! Redis acknowledges a write before its replicas have it, and expires keys by its own clock. A
//! failover (or a restart without persistence) can forget a held lock, so two clients hold it,
//! and can forget the fencing counter, so tokens go **backwards** (the test
//! `redis_failover.rs` shows both). `WAIT` narrows the window but is not consensus: a replica
//! that acknowledged can still lose the write, and Sentinel or Cluster can still promote one that
//! did not. While the server keeps its data, tokens strictly increase per name. For money, use
//! etcd or ZooKeeper; asking this backend for `Correctness` is refused with
//! `LockError::Unsupported`.
//!
//! # Redlock
//! [`RedlockBackend`] runs the Redlock algorithm over N independent masters with the same
//! scripts; see [`redlock`] for its arithmetic and its hazards.
//!
//! # Re-entrancy
//! Counted client-side by the generic [`distlock_api::Owner`], the same on every backend: an
//! owner that acquires a name it holds gets another guard with the same token and no server
//! call; the acquire script also recognises its own secret (same token) when a reply was lost.
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod conn;
mod election;
mod inspect;
pub mod keys;
mod notify;
mod plain;
mod queue;
pub mod redlock;
mod release;
pub mod scripts;
pub mod url;
mod wait;

pub use backend::CAPABILITIES;
pub use client::RedisBackend;
pub use config::{RedisLayout, RedisOptions, RedisTls, RedisTopology, RedlockOptions};
pub use plain::{PLAIN_CAPABILITIES, PLAIN_WATCHED_CAPABILITIES};
pub use redlock::{REDLOCK_CAPABILITIES, RedlockBackend};
