//! The Redis backend of distlock: **efficiency grade**, the fastest backend.
//!
//! # What it does
//! * **Acquire** is one script call ([`scripts`]): `SET NX PX` of `<random 128-bit secret>:<token>`
//!   and, in the same step, `INCR` of the name's bucket fencing counter. A retry that finds our
//!   own secret reports held (a lost reply is recovered). An acquire whose caller was cancelled
//!   while the call was in flight releases what it got.
//! * **Release** is compare-and-delete plus `PUBLISH` in one script; **renew** is
//!   compare-and-`PEXPIRE`: renew never re-creates a missing key, release never deletes the next
//!   holder's key.
//! * **Waiting**: a waiter subscribes to the name's release channel (one subscription per name per
//!   client, carried as RESP3 pushes on the client's one connection), tries, and sleeps until a
//!   release message or the holder's remaining TTL (plus jitter), whichever comes first.
//! * **Key layout** ([`keys`]): lock key, bucket counter and channel share one hash tag; at most
//!   1 024 counter keys per prefix ever, so names do not leak keys.
//!
//! # Why only efficiency grade
//! Redis acknowledges a write before its replicas have it, and expires keys by its own clock. A
//! failover (or a restart without persistence) can forget a held lock, so two clients hold it,
//! and can forget the fencing counter, so tokens go **backwards**. While the server keeps its
//! data, tokens strictly increase per name. For money, use etcd or ZooKeeper; asking this backend
//! for `Correctness` is refused with `LockError::Unsupported`.
//!
//! # Redlock
//! [`RedlockBackend`] runs the Redlock algorithm over N independent masters with the same
//! scripts; see [`redlock`] for its arithmetic and its hazards.
//!
//! # Not yet here
//! Redis Cluster and Sentinel deployments, `WAIT` for replica acknowledgement, batched watchdog
//! renewals, server-side re-entrancy and `DELEX IFEQ` on Redis 8.4+ are tracked in issue 4;
//! re-entrancy is counted client-side by the generic [`distlock_api::Owner`].
#![deny(missing_docs)]

mod backend;
mod config;
mod conn;
pub mod keys;
mod notify;
pub mod redlock;
pub mod scripts;

pub use backend::{CAPABILITIES, RedisBackend};
pub use config::{RedisOptions, RedisTls, RedisTopology, RedlockOptions};
pub use redlock::{REDLOCK_CAPABILITIES, RedlockBackend};
