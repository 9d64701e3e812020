//! The admission queue: an attempt (the acquire or admit script), the wait in the name's queue
//! for its turn, and leaving it on every path that ends without a grant (an attempt that may
//! have been granted unseen is released).

use std::time::Duration;

use distlock_api::{Admission, HolderInfo, LastChance, LockError, OwnerSecret, Result};

use crate::client::RedisBackend;
use crate::keys::{LockKeys, slot};
use crate::release::Sent;
use crate::scripts::{self, Call};

/// A waiter that stops re-checking (it crashed) is dropped from the queue after this.
pub(crate) const WAITER_TTL: Duration = Duration::from_secs(3);

/// What [`Attempt::Busy`] carries, from [`scripts::ACQUIRE`], when the name's queue decides
/// who is next (a live waiter other than the caller heads it).
pub(crate) const PROMISED: i64 = -3;

/// Whose attempt: the owner secret that proves it and who holds it (written with the grant).
pub(crate) type Who<'a> = (&'a OwnerSecret, &'a HolderInfo);

/// How an attempt asks for the lock.
#[derive(Clone, Copy)]
pub(crate) enum Ask {
    /// The [`scripts::ACQUIRE`] script: a fencing token from the name's counter, FIFO queue
    /// (`waiting`: join it when the lock is taken).
    Fenced { waiting: bool },
    /// The same script on the name's Redlock arbiter: no counter (token 0); `waiting`, the
    /// caller joins or keeps its place in the queue (liveness `waiter_ttl`), and a waiter granted
    /// stays at its head until its release leaves it; not waiting (a first round), it joins
    /// nothing and is refused while a live waiter heads the queue and the lock is free or that
    /// waiter's (see [`scripts::ACQUIRE`]).
    Arbiter { waiter_ttl: Duration, waiting: bool },
    /// A plain `SET NX PX` with token 0: the ask of a Redlock node that is not the name's
    /// arbiter, which hands out no token and keeps no queue; no script runs, so the node grants
    /// at the cost of the raw minimum.
    Plain,
    /// The [`scripts::ADMIT`] script: the same queue, admitting by `admission`'s policy (a
    /// semaphore's permit, a read-write lock's reader or writer).
    Admitted { admission: Admission, waiting: bool },
}

impl Ask {
    /// Whether a grant of this ask is a field of the name's shared hash (else the lock key).
    pub(crate) fn shared(self) -> bool {
        matches!(
            self,
            Ask::Admitted {
                admission: Admission::Permit(_) | Admission::Shared,
                ..
            }
        )
    }
}

/// The outcome of one attempt.
pub(crate) enum Attempt {
    /// Granted, with this node's counter value.
    Granted(u64),
    /// Held by another owner, who has this much TTL left; or, with [`PROMISED`], promised to the
    /// live waiter at the head of the queue (free, or held by that waiter on a Redlock arbiter).
    Busy { pttl_ms: i64 },
    /// A permit refused: the semaphore is in use with `theirs` permits.
    Mismatch { theirs: u32 },
    /// The lock key holds a value another recipe wrote (see [`scripts::ACQUIRE`]).
    Foreign,
}

impl RedisBackend {
    /// One acquire script call, made cancellation safe without a task of its own: a guard is
    /// armed while the call is in flight; dropped armed (the caller was cancelled) or left armed
    /// by a failed call (the reply may be lost after the server granted), it releases by our
    /// secret in the background. That release goes down the same pipelined connection after the
    /// acquire, and compare-and-delete never touches a lock that is not ours.
    pub(crate) async fn attempt(
        &self,
        keys: &LockKeys,
        (secret, holder): Who<'_>,
        ttl: Duration,
        ask: Ask,
    ) -> Result<Attempt> {
        let mut guard = AttemptGuard {
            backend: self,
            keys,
            secret,
            shared: ask.shared(),
            armed: true,
        };
        let mut conn = self.conn.clone();
        let ttl_ms = ttl.as_millis().max(1) as u64;
        let hex = secret.expose_hex_bytes();
        let who = holder.segment();
        // The queue scripts share their keys (lock, fence, queue, alive, then `ADMIT`'s shared
        // hash, then asks) and their first arguments (see `scripts`).
        let queue_call = |lua, shared: bool, waiting: bool, waiter_ttl: Duration| {
            let mut call = Call::new(lua, 5 + usize::from(shared));
            call.arg(&keys.lock)
                .arg(keys.fence())
                .arg(keys.queue())
                .arg(keys.alive());
            if shared {
                call.arg(keys.shared());
            }
            call.arg(keys.asks())
                .arg(&hex[..])
                .arg(ttl_ms)
                .arg(u8::from(waiting))
                .arg(waiter_ttl.as_millis() as u64);
            call
        };
        let call = match ask {
            Ask::Fenced { waiting } => {
                let mut call = queue_call(&scripts::ACQUIRE, false, waiting, WAITER_TTL);
                call.arg(0u8).arg(&who).arg(&self.turns.name);
                Some(call)
            }
            Ask::Arbiter {
                waiter_ttl,
                waiting,
            } => {
                let mut call = queue_call(&scripts::ACQUIRE, false, waiting, waiter_ttl);
                call.arg(1u8).arg(&who).arg(&self.turns.name);
                Some(call)
            }
            Ask::Admitted { admission, waiting } => {
                let mut call = queue_call(&scripts::ADMIT, true, waiting, WAITER_TTL);
                call.arg(admission.limit())
                    .arg(match admission {
                        Admission::Exclusive => "x",
                        Admission::Permit(_) => "p",
                        Admission::Shared => "s",
                    })
                    .arg(&who)
                    .arg(&self.turns.name);
                Some(call)
            }
            Ask::Plain => None,
        };
        let outcome: Result<(i64, i64)> = match call {
            Some(call) => self.run(&call, &mut conn).await,
            None => {
                // `<secret>:0<holder>`: the lock value layout (see `scripts`), with no token.
                let mut value = Vec::with_capacity(34 + who.len());
                value.extend_from_slice(&hex);
                value.extend_from_slice(b":0");
                value.extend_from_slice(who.as_bytes());
                self.with_timeout(
                    redis::cmd("SET")
                        .arg(&keys.lock)
                        .arg(&value[..])
                        .arg("NX")
                        .arg("PX")
                        .arg(ttl_ms)
                        .query_async::<Option<String>>(&mut conn),
                )
                .await
                .map(|set| if set.is_some() { (1, 0) } else { (0, -1) })
            }
        };
        let outcome = match outcome {
            Ok((1, token)) => self
                .replicated(keys)
                .await
                .map(|()| Attempt::Granted(token.max(0) as u64)),
            Ok((-2, theirs)) => Ok(Attempt::Mismatch {
                theirs: u32::try_from(theirs).unwrap_or(u32::MAX),
            }),
            Ok((-4, _)) => Ok(Attempt::Foreign),
            Ok((_, pttl_ms)) => Ok(Attempt::Busy { pttl_ms }),
            Err(e) => Err(e),
        };
        // Disarmed only when the outcome is known: a failed WAIT also releases the grant.
        guard.armed = outcome.is_err();
        drop(guard);
        outcome
    }

    /// With [`RedisOptions::min_replicas`], waits for that many replicas to acknowledge the
    /// grant (`WAIT` on the connection that carried it).
    pub(crate) async fn replicated(&self, keys: &LockKeys) -> Result<()> {
        let wanted = self.options.min_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let acked = self
            .with_timeout(self.conn.wait_replicas(
                slot(&keys.lock),
                wanted,
                self.options.replica_timeout,
            ))
            .await?;
        if acked >= wanted {
            return Ok(());
        }
        Err(LockError::backend(
            self.server.clone(),
            true,
            format!(
                "only {acked} of {wanted} replicas acknowledged the lock within {:?}; released",
                self.options.replica_timeout
            ),
        ))
    }

    /// Takes a waiter that gives up (or a Redlock holder its arbiter did not grant) out of the
    /// queue, lets go of the lock or the shared field a release granted it meanwhile, and hands
    /// on what is free ([`scripts::LEAVE`]). `member` is the entry as it was queued
    /// ([`queue_member`]). Best effort: a waiter left behind is dropped when its liveness runs
    /// out.
    pub(crate) async fn leave_queue(&self, keys: &LockKeys, member: &[u8]) {
        let mut conn = self.conn.clone();
        let left: Result<i64> = self
            .run(
                Call::new(&scripts::LEAVE, 6)
                    .arg(keys.queue())
                    .arg(keys.alive())
                    .arg(&keys.lock)
                    .arg(keys.fence())
                    .arg(keys.asks())
                    .arg(keys.shared())
                    .arg(member),
                &mut conn,
            )
            .await;
        if let Err(error) = left {
            tracing::debug!(%error, "distlock redis: leaving the queue failed; liveness will drop us");
        }
    }
}

/// Releases an acquire attempt that may have been granted but will never be seen.
struct AttemptGuard<'a> {
    backend: &'a RedisBackend,
    keys: &'a LockKeys,
    secret: &'a OwnerSecret,
    /// The grant would be a shared field, not the lock key.
    shared: bool,
    armed: bool,
}

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (b, k, s) = (self.backend.clone(), self.keys.clone(), self.secret.clone());
        let shared = self.shared;
        let release = move |b: RedisBackend, k: LockKeys, s: OwnerSecret| async move {
            if shared {
                b.release_shared(&k, &s, Sent::Source).await
            } else {
                b.release_keys(&k, &s, Sent::Source).await
            }
        };
        let now = release(b.clone(), k.clone(), s.clone());
        LastChance::spawn(now, b, move |fresh| async move {
            release(fresh, k, s).await.is_ok()
        });
    }
}

/// The queue member of an entry: the owner secret, then the limit's suffix when it is not 1
/// ([`Admission::entry_suffix`], as [`scripts::ADMIT`] writes it).
pub(crate) fn queue_member(secret: &OwnerSecret, admission: Option<Admission>) -> Vec<u8> {
    let mut member = secret.expose_hex_bytes().to_vec();
    if let Some(admission) = admission {
        member.extend_from_slice(admission.entry_suffix().as_bytes());
    }
    member
}

/// Armed while a waiter may be in the queue: dropped armed (the acquire future was cancelled)
/// it leaves the queue in the background.
pub(crate) struct QueueGuard<'a> {
    backend: &'a RedisBackend,
    keys: &'a LockKeys,
    /// The entry as queued ([`queue_member`]): a permit's or a reader's carries its limit.
    member: Vec<u8>,
    armed: bool,
}

impl<'a> QueueGuard<'a> {
    pub(crate) fn new(backend: &'a RedisBackend, keys: &'a LockKeys, member: Vec<u8>) -> Self {
        QueueGuard {
            backend,
            keys,
            member,
            armed: true,
        }
    }

    /// Stays in the queue (granted, and taken out of it by the script or by the release).
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// [`QueueGuard::keep`] for a guard a try never armed (taken by value, so the borrows it
    /// holds end here).
    pub(crate) fn keep_if_any(guard: Option<Self>) {
        if let Some(g) = guard {
            g.keep();
        }
    }

    /// Leaves the queue now (the caller waits). Armed until the script answered: a caller
    /// dropped meanwhile leaves it to the background, instead of leaving a waiter that holds the
    /// queue up until its liveness runs out.
    pub(crate) async fn leave(mut self) {
        self.backend.leave_queue(self.keys, &self.member).await;
        self.armed = false;
    }
}

impl Drop for QueueGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (b, k) = (self.backend.clone(), self.keys.clone());
        let member = std::mem::take(&mut self.member);
        let now = {
            let (b, k, member) = (b.clone(), k.clone(), member.clone());
            async move { b.leave_queue(&k, &member).await }
        };
        LastChance::spawn(now, b, move |fresh| async move {
            fresh.leave_queue(&k, &member).await;
            true
        });
    }
}
