//! The PostgreSQL backend of distlock: **correctness grade** on a server that keeps grants
//! durably (checked at connect), efficiency otherwise.
//!
//! # How a lock works here
//! * **Layout** ([`sql`]): one table in the client's schema, a row per queue entry, ordered by a
//!   value of one global sequence, which is also the fencing token: strictly increasing across
//!   the holders of a name, and across server restarts (committed grants are durable). The
//!   logic runs in plpgsql functions installed at connect, one round trip each.
//! * **Acquire**: one call locks the name for its transaction (`pg_advisory_xact_lock`, so
//!   entries commit in sequence order), deletes expired entries, writes ours and settles it by
//!   [`distlock_api::admission`]'s rule: granted, or (a try) deleted again, or kept to wait.
//! * **Waiting**: each client LISTENs on its own channel; a call that deletes an entry (a
//!   release, a waiter leaving, an expiry) NOTIFYs the clients of the entries it admits, by
//!   secret, once. A waiter re-checks when told, when the entry ahead expires, and every
//!   second (which keeps its entry alive for 3 s more); on a reconnect, at once.
//! * **Expiry** is on the server's clock (`clock_timestamp()`), counted from after the request
//!   arrived, so the holder's validity (from its send time) ends first.
//! * **Renew** is one `UPDATE` for a whole watchdog batch, only of live grants; **release**
//!   ends our entry by its secret, never another's.
//! * **Guarded transaction** ([`guard`]): data in the same database is written only while the
//!   lease holds, even by a holder paused past its TTL: the guard locks the lease's entry row
//!   (`FOR KEY SHARE`) in the caller's transaction, and an entry is only ever ended by a delete,
//!   which waits for it. A release meanwhile expires the entry at once and deletes it once the
//!   transaction ends.
//! * **Election**: the leader writes its value into its own entry (checked by secret and token);
//!   observers read the head and LISTEN on the name's leader channel.
//! * **Connection**: one pipelined connection per client for requests and notifications,
//!   replaced when it fails or a request goes unanswered (`op_timeout`).
//!
//! # Grades
//! Correctness needs `fsync` and `full_page_writes` on, and no standby streaming unless one is
//! synchronous (`synchronous_standby_names`); every grant and renewal commits with `synchronous_commit=on`.
//! What grants nothing (a release, a waiter's entry) commits without waiting for the disk: the
//! durable commit of any grant after it flushes it too.
//! A server that fails a check is graded efficiency ([`PostgresBackend::downgrade_reason`]
//! says why), and a correctness call site is refused. A standby is refused outright, and a
//! reconnect that finds a correctness server downgraded fails.
#![deny(missing_docs)]

mod backend;
mod client;
mod config;
mod election;
mod grade;
mod guard;
mod inspect;
mod notify;
mod queue;
pub mod sql;
pub mod url;
mod wait;

pub use backend::{CAPABILITIES, EFFICIENCY_CAPABILITIES};
pub use client::PostgresBackend;
pub use config::{MAX_SCHEMA_LEN, PostgresOptions, PostgresTls};
pub use guard::{GuardStatement, guard, guard_statement};
/// The client the guarded transaction takes ([`guard`]): this version, re-exported.
pub use tokio_postgres;
