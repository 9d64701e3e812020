//! The etcd backend of distlock: **correctness grade**.
//!
//! # How a lock works here
//! * **Session**: one lease per client ([`EtcdOptions::session_ttl`], whole seconds), shared by
//!   all its lock keys and kept alive every TTL / 3 (by the renewals of the locks it carries, or by
//!   its own keeper when none renews). When etcd says the lease is gone, or the
//!   session's validity (from the send time of the last confirmed keep-alive, minus drift) runs
//!   out, every lease of the session fires its lost signal, before etcd can have expired it.
//!   After a loss the next acquire makes a new lease; old keys are never reused.
//! * **Acquire**: a txn puts `prefix/<name>/<lease>.<slot>` if its create revision is 0 and
//!   lists the name's newest keys in the same step; the lowest create revision holds. The slot
//!   is reused by the client's next acquire of the name once the key is deleted (never before),
//!   so etcd's key index does not grow by one entry per acquire. A repeat acquire on an
//!   otherwise idle cluster leaves the read out: when its create revision is exactly 2 past our
//!   own released key's, nothing else was written in between, so nobody is ahead (proof at
//!   [`distlock_api::RepeatGrant`]); any other gap reads the keys ahead after the put. A waiter within 64 keys of
//!   the head applies the name's deletes from its client's one shared watch of the name (made
//!   once, proven live, kept while the client waits there) and is granted on the holder's
//!   delete event itself (no read after it: the keys ahead only shrink, a watch reports every
//!   event after its start in order, and our own key's delete would come first); further back
//!   it follows only the 64th key ahead, so a release wakes the clients near the head and one
//!   far waiter (no herd). A watch whose creation a read does not prove in step gets a second one
//!   (no 100 ms "unsynced watcher" stall), and what passed before a watch began is read once
//!   (no missed deletion); a waiter ahead of us that gives up or expires does not grant us the
//!   lock. Before returning, it checks that its own key (watched or read) and its session are
//!   still alive (etcd #11456). Try-acquire, timeout, error, a dead session and a dropped
//!   future all delete our key (retried, bounded; the session TTL is the fallback), the last
//!   only once the put's answer is in, so the delete cannot overtake it.
//! * **Fencing token** = our key's create revision: cluster-wide, strictly increasing, and
//!   granted in that order. [`EtcdBackend::guarded_txn`] writes data kept in etcd only while our
//!   key still exists with that revision.
//! * **Renew** is one session keep-alive plus a check that our key exists (the session's key
//!   list, unless it would pass 2 MB); **release** checks the secret against the slot's holder
//!   locally, then deletes our key (one plain delete, as cheap as the raw minimum), never the
//!   shared lease.
//! * **Election**: the leader writes `<secret>:<value>` into its own key (a txn on its create
//!   revision); observers read the name's oldest key and watch the name's range.
//! * Reads are linearizable (etcd's default); no serializable read is used for a lock decision,
//!   and a grant on a watch event rests on committed history only.
//!
//! # TTL mapping
//! The per-acquire TTL of the trait does not apply: every lock of a client lives as long as the
//! client's session lease, so a lease's validity is the session's. A `Fixed` lease fires its lost
//! signal at its deadline but its key stays until release or the session ends.
//!
//! # etcd 3.4
//! CI runs Debian's etcd 3.4. Everything used here (txn, lease grant / keep-alive / revoke,
//! watch with start revision, range with sort and max create revision) exists there; the
//! client's newer protos add fields (for example watch progress with fragments) that 3.4 ignores.
//!
//! # Not yet here
//! A lease per lock (an option the issue allows; the shared session is the default).
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod election;
mod guard;
mod inspect;
pub mod keys;
mod pace;
mod queue;
mod session;
mod try_acquire;
pub mod url;
mod wait;
mod watches;

pub use backend::CAPABILITIES;
pub use client::EtcdBackend;
pub use config::{EtcdOptions, EtcdTls};
pub use etcd_client::TxnOp;
