//! The admission queue: an entry's write (`acquire`), a waiter's re-check (`admit`), and
//! leaving on every path that ends without a grant (an entry that may have been granted unseen
//! is released by its secret).

use std::time::Duration;

use distlock_api::{Admission, HolderInfo, LastChance, LockName, OwnerSecret, Result};
use tokio_postgres::types::Type;

use crate::client::PostgresBackend;
use crate::sql::SHARED_LIMIT;

/// A waiter that stops re-checking (it crashed, or its link is cut) is dropped from the queue
/// this long after its last re-check.
pub(crate) const WAITER_TTL: Duration = Duration::from_secs(3);

/// The outcome of one `acquire` or `admit` call.
pub(crate) enum Attempt {
    /// Granted, with this fencing token (the entry's `seq`).
    Granted(u64),
    /// Not admitted; a try's entry was deleted, a waiter's kept. The first entry ahead expires
    /// in this long.
    Busy(Duration),
    /// A permit refused: the semaphore is in use with `theirs` permits. Nothing was written.
    Mismatch { theirs: u32 },
    /// The waiter's entry is gone (it stopped re-checking for longer than [`WAITER_TTL`]).
    Gone,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl PostgresBackend {
    /// Writes an entry at the back of `name`'s queue and settles it: granted at once, else a
    /// try's entry is deleted in the same call and a waiter's stays.
    pub(crate) async fn attempt(
        &self,
        name: &LockName,
        (secret, holder): (&OwnerSecret, &HolderInfo),
        admission: Admission,
        ttl: Duration,
        waiting: bool,
    ) -> Result<Attempt> {
        let limit = match admission {
            Admission::Shared => SHARED_LIMIT,
            other => i64::from(other.limit()),
        };
        let permit = matches!(admission, Admission::Permit(_));
        let (ttl_ms, waiter_ms) = (ms(ttl), ms(WAITER_TTL));
        let segment = holder.segment();
        let i = &self.inner;
        let outcome: Vec<i64> = self
            .query_value(
                &i.sql.acquire,
                &[
                    (&name.as_str(), Type::TEXT),
                    (&secret.expose_hex(), Type::TEXT),
                    (&limit, Type::INT8),
                    (&permit, Type::BOOL),
                    (&ttl_ms, Type::INT8),
                    (&waiting, Type::BOOL),
                    (&waiter_ms, Type::INT8),
                    (&i.channel.as_str(), Type::TEXT),
                    (&segment.as_str(), Type::TEXT),
                ],
            )
            .await?;
        Ok(outcome_of(&outcome))
    }

    /// A waiter's re-check: granted once admitted; else its entry's liveness is renewed.
    pub(crate) async fn readmit(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
        ttl: Duration,
    ) -> Result<Attempt> {
        let (ttl_ms, waiter_ms) = (ms(ttl), ms(WAITER_TTL));
        let outcome: Vec<i64> = self
            .query_value(
                &self.inner.sql.admit,
                &[
                    (&name.as_str(), Type::TEXT),
                    (&secret.expose_hex(), Type::TEXT),
                    (&ttl_ms, Type::INT8),
                    (&waiter_ms, Type::INT8),
                ],
            )
            .await?;
        Ok(outcome_of(&outcome))
    }

    /// Deletes the entry `secret` wrote under `name` (a grant or a waiter); whether it was a
    /// live grant. The entries it admits are told.
    pub(crate) async fn release_entry(
        &self,
        name: &LockName,
        secret: &OwnerSecret,
    ) -> Result<bool> {
        self.query_value(
            &self.inner.sql.release,
            &[
                (&name.as_str(), Type::TEXT),
                (&secret.expose_hex(), Type::TEXT),
            ],
        )
        .await
    }
}

/// `{1, seq}`, `{0, ms[, seq]}`, `{-2, theirs}`, `{-3}` (see the functions in [`crate::sql`]).
fn outcome_of(answer: &[i64]) -> Attempt {
    let second = answer.get(1).copied().unwrap_or(0);
    match answer.first() {
        Some(1) => Attempt::Granted(u64::try_from(second).unwrap_or(0)),
        Some(-2) => Attempt::Mismatch {
            theirs: u32::try_from(second).unwrap_or(u32::MAX),
        },
        Some(-3) => Attempt::Gone,
        _ => Attempt::Busy(Duration::from_millis(u64::try_from(second).unwrap_or(0))),
    }
}

/// Armed while our entry may exist unseen (a call in flight, a waiter queued): dropped armed
/// (the caller was cancelled) it releases the entry by its secret in the background, on the
/// same pipelined connection after the call it cleans up.
pub(crate) struct EntryGuard<'a> {
    backend: &'a PostgresBackend,
    name: &'a LockName,
    secret: &'a OwnerSecret,
    armed: bool,
}

impl<'a> EntryGuard<'a> {
    pub(crate) fn new(
        backend: &'a PostgresBackend,
        name: &'a LockName,
        secret: &'a OwnerSecret,
    ) -> Self {
        EntryGuard {
            backend,
            name,
            secret,
            armed: true,
        }
    }

    /// The outcome is known and leaves nothing to clean up (a grant, or nothing written).
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }

    /// Leaves the queue now. Armed until the server answered: a caller dropped meanwhile leaves
    /// it to the background.
    pub(crate) async fn leave(mut self) {
        if let Err(error) = self.backend.release_entry(self.name, self.secret).await {
            tracing::debug!(%error, "distlock postgres: leaving the queue failed; retrying in the background");
            return;
        }
        self.armed = false;
    }
}

impl Drop for EntryGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (b, n, s) = (self.backend.clone(), self.name.clone(), self.secret.clone());
        let now = {
            let (b, n, s) = (b.clone(), n.clone(), s.clone());
            async move {
                if let Err(error) = b.release_entry(&n, &s).await {
                    tracing::debug!(%error, "distlock postgres: clean-up failed; the entry's liveness will drop it");
                }
            }
        };
        LastChance::spawn(now, b, move |fresh| async move {
            fresh.release_entry(&n, &s).await.is_ok()
        });
    }
}
