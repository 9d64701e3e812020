//! The admission queue: an acquire's key put, its wait for admission (the keys ahead, the
//! name's shared watch), and its removal on every path that ends without a grant.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use distlock_api::{
    Admission, FencingToken, Grant, GrantKey, HolderInfo, LastChance, LockError, LockName,
    OwnerSecret, RepeatPrior, Result,
};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use crate::client::EtcdBackend;
use crate::client::RETRY_PAUSE;
use crate::keys::attempt_key;
use crate::session::Session;
use crate::try_acquire::Tried;
use crate::wait::{Ahead, is_ours, keys_ahead, limited, window};

/// How many times cleanup of our own key is tried before the session TTL is left to do it.
const CLEANUP_TRIES: u32 = 3;

impl EtcdBackend {
    /// Puts our attempt key; returns our create revision and what is ahead of it. The read of
    /// the keys ahead rides in the same txn, unless `prior` says to leave it out (a repeat
    /// acquire, see [`RepeatGrant`]): then a revision gap of 2 grants with no read, and any other
    /// gap reads after the put.
    async fn enqueue(
        &self,
        prefix: &str,
        key: &str,
        lease: i64,
        entry: &str,
        admission: Admission,
        prior: Option<RepeatPrior>,
    ) -> Result<(i64, Ahead)> {
        let alone = prior.as_ref().is_some_and(RepeatPrior::send_alone);
        // Our fresh key, then (unless sent alone) its nearest predecessors.
        let mut ops = vec![TxnOp::put(
            key,
            entry,
            Some(PutOptions::new().with_lease(lease)),
        )];
        if !alone {
            ops.push(TxnOp::get(prefix, Some(keys_ahead(admission, None))));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then(ops)
            // A retry whose first try was applied (reply lost) finds our own key here.
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await?;
        let at = resp.header().map(|h| h.revision()).unwrap_or_default();
        if resp.succeeded() {
            if prior
                .as_ref()
                .is_some_and(|p| self.inner.repeat.proves_alone(p, at))
            {
                return Ok((at, Ahead::new(admission, Vec::new(), true, at)));
            }
            if alone {
                return Ok((at, self.read_ahead(prefix, key, at, admission).await?));
            }
        }
        let Some(TxnOpResponse::Get(got)) = resp.op_responses().into_iter().last() else {
            return Err(self.err_text("the enqueue txn answered without its read"));
        };
        if resp.succeeded() {
            let keys: Vec<_> = got
                .kvs()
                .iter()
                .filter(|kv| kv.create_revision() < at)
                .map(limited)
                .take(window(admission))
                .collect();
            // Nothing is behind a key just put: the count less ours is what is ahead.
            let count = usize::try_from(got.count()).unwrap_or(0);
            let whole = count <= keys.len() + 1;
            let mut ahead = Ahead::new(admission, keys, whole, at);
            ahead.counted = count.saturating_sub(1);
            return Ok((at, ahead));
        }
        match got.kvs().first() {
            Some(kv) if kv.value() == entry.as_bytes() => {
                let my_rev = kv.create_revision();
                Ok((
                    my_rev,
                    self.read_ahead(prefix, key, my_rev, admission).await?,
                ))
            }
            _ => Err(LockError::backend(
                self.inner.endpoints.clone(),
                false,
                format!("attempt key {key} exists and is not ours"),
            )),
        }
    }

    /// Reads what is ahead of our key (created at `my_rev`) now, and whether it still exists.
    pub(crate) async fn read_ahead(
        &self,
        prefix: &str,
        key: &str,
        my_rev: i64,
        admission: Admission,
    ) -> Result<Ahead> {
        let nearest = keys_ahead(admission, Some(my_rev));
        let read = Txn::new().and_then([
            TxnOp::get(prefix, Some(nearest)),
            TxnOp::get(key, Some(GetOptions::new().with_keys_only())),
        ]);
        let resp = self.txn(read).await?;
        let at = resp.header().map(|h| h.revision()).unwrap_or_default();
        let mut gets = resp.op_responses().into_iter().filter_map(|r| match r {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(preds), Some(ours)) = (gets.next(), gets.next()) else {
            return Err(self.err_text("a read txn answered without its reads"));
        };
        let keys: Vec<_> = preds.kvs().iter().map(limited).collect();
        // `more`: the limit cut the keys ahead short (etcd's count is of the whole name).
        let mut ahead = Ahead::new(admission, keys, !preds.more(), at);
        ahead.alive = is_ours(ours.kvs(), my_rev);
        Ok(ahead)
    }

    /// [`EtcdBackend::queue_once`] on the client's session. A wait whose session died under it
    /// (a stall longer than the session TTL) queues again on a new session, at the back of the
    /// queue, for as long as its deadline allows, and rides out a server that cannot make one
    /// yet the same way; a try is one attempt.
    pub(crate) async fn acquire_inner(
        &self,
        name: &LockName,
        admission: Admission,
        deadline: Option<Instant>,
    ) -> Result<Grant> {
        let started = Instant::now();
        let time_left = || deadline.is_some_and(|d| Instant::now() < d);
        let mut riding_out = false;
        loop {
            let session = match self.session().await {
                Ok(s) => s,
                Err(e) if riding_out && e.is_retryable() && time_left() => {
                    tracing::debug!(lock = %name, error = %e, "distlock etcd: no new session yet");
                    self.pause_until(deadline).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self
                .queue_once(name, admission, deadline, &session, started)
                .await
            {
                Err(e)
                    if session.is_lost()
                        && e.is_retryable()
                        && !matches!(e, LockError::Timeout { .. })
                        && time_left() =>
                {
                    tracing::warn!(lock = %name, error = %e, "distlock etcd: the session died while waiting; queueing again on a new one");
                    riding_out = true;
                }
                other => return other,
            }
        }
    }

    /// Sleeps [`RETRY_PAUSE`], or until `deadline` if sooner.
    async fn pause_until(&self, deadline: Option<Instant>) {
        let pause = Instant::now() + RETRY_PAUSE;
        tokio::time::sleep_until(deadline.map_or(pause, |d| d.min(pause))).await;
    }

    /// Enqueues an attempt key whose value is the secret with its limit
    /// ([`Admission::entry_suffix`]) and its holder ([`HolderInfo::segment`]) on `session`, and waits until `admission` admits it;
    /// a try (no `deadline`) puts its key only if admitted at once (see `try_acquire.rs`).
    async fn queue_once(
        &self,
        name: &LockName,
        admission: Admission,
        deadline: Option<Instant>,
        session: &Arc<Session>,
        started: Instant,
    ) -> Result<Grant> {
        let session = session.clone();
        let prefix = self.name_prefix(name);
        let secret = OwnerSecret::random()?;
        let holder = HolderInfo::now();
        let entry = format!(
            "{}{}{}",
            secret.expose_hex(),
            admission.entry_suffix(),
            holder.segment()
        );
        let slot = session.take_slot(&prefix, &entry);
        let key = attempt_key(&self.inner.options.prefix, name, session.lease, slot);
        let mut queued = QueuedKey {
            backend: self.clone(),
            session: session.clone(),
            prefix: prefix.clone(),
            slot,
            key: Some(key.clone()),
            entry: entry.clone(),
            unsure: false,
        };
        // The put is polled right here (a task of its own cost ~30 us of thread hops per
        // acquire on 2 cores); if the caller gives up while it is in flight, `InFlight` moves it
        // into a task that finishes it before the armed key is dropped and deleted (see there).
        let (this, k, lease) = (self.clone(), key.clone(), session.lease);
        let Some(deadline) = deadline else {
            let shown = name.to_string();
            let put = InFlight::new(async move {
                let tried = this
                    .try_enqueue(&shown, &queued.prefix, &k, lease, &queued.entry, admission)
                    .await;
                queued.unsure = tried.is_err();
                (queued, tried)
            });
            let (queued, tried) = put
                .finish()
                .await
                .ok_or_else(|| self.err_text("the try ended without an answer"))?;
            return match tried {
                Ok(Tried::Put(my_rev)) => {
                    Ok(self.granted(queued, (&secret, holder), name, admission, my_rev))
                }
                Ok(Tried::Refused(e)) => {
                    queued.unused();
                    Err(e)
                }
                Err(e) => {
                    queued.remove().await;
                    Err(e)
                }
            };
        };
        // The repeat grant's proof holds for an exclusive entry only (one admitted with nothing
        // ahead); a shared one could have been admitted beside holders still there.
        let prior = if admission == Admission::Exclusive {
            self.inner.repeat.take(&prefix)
        } else {
            None
        };
        let put = InFlight::new(async move {
            let enqueued = this
                .enqueue(&queued.prefix, &k, lease, &queued.entry, admission, prior)
                .await;
            queued.unsure = enqueued.is_err();
            (queued, enqueued)
        });
        let (queued, enqueued) = put
            .finish()
            .await
            .ok_or_else(|| self.err_text("the enqueue ended without an answer"))?;
        let (my_rev, mut ahead) = enqueued?;
        if let Err(e) = admission.check_ahead(name.as_str(), ahead.keys.iter().map(|(_, l)| *l)) {
            queued.remove().await;
            return Err(e);
        }
        if !ahead.admitted() {
            let (began, counted) = (Instant::now(), ahead.counted);
            // Near waits (most) skip the pace's lock.
            ahead.far = ahead.far && self.inner.pace.turn_after_catch_up(&prefix, counted);
            let waited = self
                .wait_turn(&prefix, &key, my_rev, ahead, &session, deadline)
                .await;
            if matches!(waited, Ok(true)) && counted > window(admission) {
                self.inner.pace.turn_came(&prefix, began.elapsed(), counted);
            }
            let outcome = match waited {
                Ok(true) => Ok(()),
                Ok(false) => Err(self.err_text("our queue key or session died while waiting")),
                Err(LockError::Timeout { .. }) => Err(LockError::Timeout {
                    name: name.to_string(),
                    waited: started.elapsed(),
                }),
                Err(e) => Err(e),
            };
            if let Err(e) = outcome {
                // A dead session's keys go with its lease on the server: the delete is left to
                // the background (bounded retries) rather than waited for through a link that
                // may still be down, so a wait that rides out the stall queues again at once.
                if session.is_lost() {
                    drop(queued);
                } else {
                    queued.remove().await;
                }
                return Err(e);
            }
        }
        Ok(self.granted(queued, (&secret, holder), name, admission, my_rev))
    }

    /// The grant of our queued key, admitted at `my_rev` (its fencing token): no longer ours to
    /// delete on drop.
    fn granted(
        &self,
        mut queued: QueuedKey,
        (secret, holder): (&OwnerSecret, HolderInfo),
        name: &LockName,
        admission: Admission,
        my_rev: i64,
    ) -> Grant {
        let key = queued.key.take().unwrap_or_default();
        if admission == Admission::Exclusive {
            self.inner.repeat.granted(&queued.prefix, &key, my_rev);
        }
        Grant {
            key: GrantKey {
                name: name.clone(),
                resource: key.into(),
                secret: secret.clone(),
                holder,
            },
            token: Some(FencingToken(my_rev as u64)),
            ttl: queued.session.ttl,
            sent_at: queued.session.refreshed(),
            session: Some(queued.session.lost_signal()),
            first_ttl: None,
        }
    }
}

/// Our attempt key while we are not (yet) its holder: dropped armed (try-acquire lost, timeout,
/// error, or the acquire future was dropped, also while [`QueuedKey::remove`] was deleting it),
/// it deletes the key in the background, retried and bounded, and gives its slot back once the
/// delete went through; the session TTL is the fallback (and the slot then stays taken, so the
/// key is never reused while it may exist).
struct QueuedKey {
    backend: EtcdBackend,
    session: Arc<Session>,
    prefix: String,
    slot: u64,
    key: Option<String>,
    /// The key's value (the attempt's secret, and an announced value), which the delete
    /// compares (see [`EtcdBackend::delete_ours`]).
    entry: String,
    /// The put got no answer (error or timeout), so it may still land: a delete that finds
    /// nothing looks once more after `op_timeout`.
    unsure: bool,
}

impl QueuedKey {
    /// The key was never put (a try refused before writing): its slot is free again.
    fn unused(mut self) {
        self.key = None;
        self.session.free_slot(&self.prefix, self.slot);
    }

    /// Deletes the key now (the caller waits), so a failed acquire returns with nothing left.
    /// The key stays armed until the delete is done: a caller dropped meanwhile leaves it to
    /// the background.
    async fn remove(mut self) {
        if let Some(key) = self.key.clone() {
            self.delete(&key).await;
            self.key = None;
        }
    }

    async fn delete(&self, key: &str) {
        let mut unsure = self.unsure;
        let mut attempt = 0;
        while attempt < CLEANUP_TRIES {
            match self.backend.delete_ours(key, &self.entry).await {
                Ok(false) if unsure => {
                    unsure = false;
                    tokio::time::sleep(self.backend.inner.options.op_timeout).await;
                }
                Ok(_) => {
                    self.session.free_slot(&self.prefix, self.slot);
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
                    attempt += 1;
                }
            }
        }
        tracing::warn!(
            key,
            "distlock etcd: could not delete a queue key; the session TTL will"
        );
    }
}

/// A write that must reach its answer even if its caller gives up: polled inline by the
/// caller, moved into a task of its own when dropped unfinished. Used for the enqueue put, whose
/// output carries the armed key: a cleanup delete sent while the put is still in flight could
/// land first and let the put leave a key queued for good (seen under load); finished in a
/// task, the put answers first and only then is the key dropped, which deletes it.
struct InFlight<T: Send + 'static>(Option<Pin<Box<dyn Future<Output = T> + Send>>>);

impl<T: Send + 'static> InFlight<T> {
    fn new(write: impl Future<Output = T> + Send + 'static) -> Self {
        InFlight(Some(Box::pin(write)))
    }

    /// The write's answer (`None` only if it was already taken, which `finish` never does).
    async fn finish(mut self) -> Option<T> {
        let answer = self.0.as_mut()?.as_mut().await;
        self.0 = None;
        Some(answer)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        if let (Some(write), Ok(rt)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(write);
        }
    }
}

impl Drop for QueuedKey {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        let rest = QueuedKey {
            backend: self.backend.clone(),
            session: self.session.clone(),
            prefix: std::mem::take(&mut self.prefix),
            slot: self.slot,
            key: None,
            entry: std::mem::take(&mut self.entry),
            unsure: self.unsure,
        };
        let (b, fkey, entry) = (rest.backend.clone(), key.clone(), rest.entry.clone());
        LastChance::spawn(
            async move { rest.delete(&key).await },
            b,
            move |fresh| async move { fresh.delete_ours(&fkey, &entry).await.is_ok() },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::time::timeout;

    use super::*;

    #[tokio::test]
    async fn a_write_given_up_in_flight_still_reaches_its_answer() {
        let answered = Arc::new(AtomicBool::new(false));
        let flag = answered.clone();
        let write = InFlight::new(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up while the write is in flight...
        assert!(
            timeout(Duration::from_millis(10), write.finish())
                .await
                .is_err()
        );
        // ...and the write goes on in a task of its own (its deadline is the earlier timer).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(answered.load(Ordering::SeqCst), "the write was dropped");
    }

    #[tokio::test]
    async fn a_write_waited_for_answers_inline() {
        assert_eq!(InFlight::new(async { 7 }).finish().await, Some(7));
    }
}
